"""Agents over sockets and NATS: the asyncio :class:`Agent`, and the transports it runs on
(connections, servers, their limits and the pool for slow work; ``NatsBus`` and
``NatsLimits``, spec/nats.md, imported when first used: they need the ``nats`` extra)."""

from typing import TYPE_CHECKING as _TYPE_CHECKING, Any as _Any

from ..core._errors import ConnectionLost
from ._agent import (
    Agent,
    AgentConversation,
    Context,
    ConversationClosed,
    HandlerLimits,
    LearnedLibrary,
    Link,
    NegotiationFailed,
    PeerFailed,
    load_handler,
)
from ._handlers import on_loop
from ._transport import (
    Connection,
    ConnectionLimits,
    Server,
    ServerLimits,
    WorkPool,
    connect,
    serve,
)

if _TYPE_CHECKING:  # typed (at run time __getattr__ imports them)
    from ._nats import NatsBus as NatsBus, NatsLimits as NatsLimits

__all__ = [
    "Agent",
    "AgentConversation",
    "Connection",
    "ConnectionLimits",
    "ConnectionLost",
    "Context",
    "ConversationClosed",
    "HandlerLimits",
    "LearnedLibrary",
    "Link",
    "NatsBus",
    "NatsLimits",
    "NegotiationFailed",
    "PeerFailed",
    "Server",
    "ServerLimits",
    "WorkPool",
    "connect",
    "load_handler",
    "on_loop",
    "serve",
]

_NATS_NAMES = ("NatsBus", "NatsLimits")


def __getattr__(name: str) -> _Any:
    """``NatsBus`` and ``NatsLimits``, from :mod:`cbcl.net._nats` when first asked for (it
    imports nats-py, which takes longer to import than CBCL)."""
    if name in _NATS_NAMES:
        from . import _nats

        return getattr(_nats, name)
    raise AttributeError(f"module 'cbcl.net' has no attribute {name!r}")
