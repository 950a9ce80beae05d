"""Talking to the agents that exist (spec/interop.md): FIPA ACL's string form and its
mapping to CBCL messages, CBCL in SPADE (XMPP) messages, A2A messages and AgentCard
extensions, and CBCL's tools and agents over MCP.

The FIPA names need nothing beyond the core. The A2A and MCP names are imported when first
used, and need the ``a2a`` and ``mcp`` extras (``pip install 'cbcl[a2a,mcp]'``); SPADE's
transport needs the ``fipa`` extra only when a message is sent. Over A2A, :class:`A2AClient`
sends CBCL messages to an A2A agent and :func:`serve_a2a` (or :func:`a2a_app`, the ASGI app)
serves a CBCL agent behind the a2a-sdk server (spec/interop.md §4.6, §4.7)."""

from typing import TYPE_CHECKING as _TYPE_CHECKING, Any as _Any

from .bridges._fipa import (
    AgentId,
    FipaMessage,
    FipaSyntaxError,
    equivalent,
    fipa_to_message,
    message_to_fipa,
    read_fipa,
    write_fipa,
)
from .bridges._spade import (
    JidNames,
    SenderMismatchError,
    check_spade_sender,
    message_to_spade,
    spade_identity,
    spade_to_message,
)
from .core._errors import ConversionError, LossyConversionError

if _TYPE_CHECKING:  # the lazy names, typed (at run time __getattr__ imports them)
    from .bridges._a2a import (
        a2a_json_to_message as a2a_json_to_message,
        a2a_to_message as a2a_to_message,
        agent_card_extension as agent_card_extension,
        card_protocols as card_protocols,
        message_to_a2a as message_to_a2a,
        message_to_a2a_json as message_to_a2a_json,
        read_a2a as read_a2a,
        task_state as task_state,
        write_a2a as write_a2a,
    )
    from .bridges._a2a_client import A2AClient as A2AClient, A2AReply as A2AReply
    from .bridges._a2a_server import (
        A2AServer as A2AServer,
        A2AServerLimits as A2AServerLimits,
        a2a_app as a2a_app,
        serve_a2a as serve_a2a,
    )
    from .bridges._mcp import (
        bridge_server as bridge_server,
        intent_tools as intent_tools,
        protocol_server as protocol_server,
        run_stdio as run_stdio,
        tools_server as tools_server,
    )

_A2A = ("a2a_json_to_message", "a2a_to_message", "agent_card_extension", "card_protocols",
        "message_to_a2a", "message_to_a2a_json", "read_a2a", "task_state", "write_a2a")
_A2A_CLIENT = ("A2AClient", "A2AReply")
_A2A_SERVER = ("A2AServer", "A2AServerLimits", "a2a_app", "serve_a2a")
_MCP = ("bridge_server", "intent_tools", "protocol_server", "run_stdio", "tools_server")

__all__ = [
    "AgentId", "ConversionError", "FipaMessage", "FipaSyntaxError", "JidNames",
    "LossyConversionError", "SenderMismatchError", "check_spade_sender", "equivalent",
    "fipa_to_message", "message_to_fipa", "message_to_spade", "read_fipa", "spade_identity",
    "spade_to_message", "write_fipa",
    *_A2A, *_A2A_CLIENT, *_A2A_SERVER, *_MCP,  # lazy: see __getattr__
]


def __getattr__(name: str) -> _Any:
    """The A2A and MCP names, from their modules when first asked for (they import the
    optional SDKs)."""
    if name in _A2A:
        from .bridges import _a2a

        return getattr(_a2a, name)
    if name in _A2A_CLIENT:
        from .bridges import _a2a_client

        return getattr(_a2a_client, name)
    if name in _A2A_SERVER:
        from .bridges import _a2a_server

        return getattr(_a2a_server, name)
    if name in _MCP:
        from .bridges import _mcp

        return getattr(_mcp, name)
    raise AttributeError(f"module 'cbcl.interop' has no attribute {name!r}")
