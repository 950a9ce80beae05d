"""Talking to the agents that exist (spec/interop.md): FIPA ACL's string form and its
mapping to CBCL messages, CBCL in SPADE (XMPP) messages, A2A messages and AgentCard
extensions, and CBCL's tools and agents over MCP.

The FIPA names need nothing beyond the core. The A2A and MCP names are imported when first
used, and need the ``a2a`` and ``mcp`` extras (``pip install 'cbcl[a2a,mcp]'``); SPADE's
transport needs the ``fipa`` extra only when a message is sent."""

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
    from .bridges._mcp import (
        bridge_server as bridge_server,
        run_stdio as run_stdio,
        tools_server as tools_server,
    )

_A2A = ("a2a_json_to_message", "a2a_to_message", "agent_card_extension", "card_protocols",
        "message_to_a2a", "message_to_a2a_json", "read_a2a", "task_state", "write_a2a")
_MCP = ("bridge_server", "run_stdio", "tools_server")

__all__ = [
    "AgentId", "ConversionError", "FipaMessage", "FipaSyntaxError", "JidNames",
    "LossyConversionError", "SenderMismatchError", "check_spade_sender", "equivalent",
    "fipa_to_message", "message_to_fipa", "message_to_spade", "read_fipa", "spade_identity",
    "spade_to_message", "write_fipa",
    *_A2A, *_MCP,  # lazy: see __getattr__
]


def __getattr__(name: str) -> _Any:
    """The A2A and MCP names, from their modules when first asked for (they import the
    optional SDKs)."""
    if name in _A2A:
        from .bridges import _a2a

        return getattr(_a2a, name)
    if name in _MCP:
        from .bridges import _mcp

        return getattr(_mcp, name)
    raise AttributeError(f"module 'cbcl.interop' has no attribute {name!r}")
