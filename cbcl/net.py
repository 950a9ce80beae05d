"""Agents over sockets: the asyncio :class:`Agent`, and the transport it runs on
(connections, servers, their limits and the pool for slow work)."""

from ._agent import (
    Agent,
    AgentConversation,
    Context,
    ConversationClosed,
    LearnedLibrary,
    Link,
    NegotiationFailed,
    load_handler,
)
from ._transport import (
    Connection,
    ConnectionLimits,
    ConnectionLost,
    Server,
    ServerLimits,
    WorkPool,
    connect,
    serve,
)

__all__ = [
    "Agent", "AgentConversation", "Connection", "ConnectionLimits", "ConnectionLost",
    "Context", "ConversationClosed", "LearnedLibrary", "Link", "NegotiationFailed",
    "Server", "ServerLimits", "WorkPool", "connect", "load_handler", "serve",
]
