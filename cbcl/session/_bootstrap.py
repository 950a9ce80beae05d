"""cbcl-negotiation/v1 itself: its shipped descriptor, the registry that holds it (loaded
once per process, shipped and so trusted), and the one negotiation message an edge writes
without a session, a NOT-UNDERSTOOD."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

from ..binary._framing import frame
from ..core._values import URI, Symbol
from ..protocol._message import Intent, Message
from ..protocol._registry import Registry
from ._negotiation import PROTOCOL_ID

NEGOTIATION = Symbol(PROTOCOL_ID)
ANONYMOUS = URI("agent://anonymous")


@lru_cache(maxsize=1)
def negotiation_descriptor() -> bytes:
    """The shipped cbcl-negotiation/v1 descriptor (package data of ``cbcl.grammars``)."""
    return resources.files("cbcl.grammars").joinpath("cbcl-negotiation-v1.cbcl").read_bytes()


@lru_cache(maxsize=1)
def negotiation_registry() -> Registry:
    """A registry holding only cbcl-negotiation/v1 (shipped, so trusted: compiled in this
    process)."""
    registry = Registry(isolate=False)
    registry.load(negotiation_descriptor(), allow_unsigned=True)
    return registry


def not_understood_frame(code: str, *, now: int, message_id: str = "refusal-1",
                         me: URI | None = None, peer: URI | None = None,
                         conversation_id: str | None = None,
                         in_reply_to: str | None = None) -> bytes:
    """A framed cbcl-negotiation/v1 NOT-UNDERSTOOD carrying ``code``, built as a value
    (parties default to ``agent://anonymous``): what an edge writes to a connection it
    refuses before any session ran on it. Returns ``b""`` if a field cannot be written."""
    try:
        message = Message(
            message_id=message_id, sender=me or ANONYMOUS, receiver=peer or ANONYMOUS,
            intent=Intent.NOT_UNDERSTOOD, protocol=NEGOTIATION,
            conversation_id=conversation_id, in_reply_to=in_reply_to, timestamp=now,
            body=code)
        return frame(message.canonical().encode())
    except (TypeError, ValueError):  # pragma: no cover - every field is ours
        return b""


__all__ = ["NEGOTIATION", "negotiation_descriptor", "negotiation_registry",
           "not_understood_frame"]
