"""The events of a negotiation session (spec/negotiation.md §2), h11-style: plain frozen
values that :meth:`cbcl.Session.next_event` returns and :meth:`cbcl.Session.send` takes,
plus the two sentinels :data:`NEED_DATA` and :data:`NEED_WORK` and the :class:`Work` a
session made with ``defer_work=True`` hands out. Nothing here knows bytes or state."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..protocol._conversation import Step
from ..protocol._message import Intent, Message
from ._reasons import read_failure


class _NeedData:
    def __repr__(self) -> str:
        return "NEED_DATA"


#: Returned by :meth:`Session.next_event` when a whole frame has not arrived yet.
NEED_DATA = _NeedData()


class _NeedWork:
    def __repr__(self) -> str:
        return "NEED_WORK"


#: Returned by :meth:`Session.next_event` of a session made with ``defer_work=True`` when
#: it waits for :attr:`Session.pending_work` to be done (see :meth:`Session.complete_work`).
NEED_WORK = _NeedWork()


@dataclass(frozen=True, slots=True, eq=False)
class Work:
    """Slow work a session needs done before it can go on: ``kind`` ``"offer"`` (verify
    and compile an offered descriptor: :meth:`Registry.prepare`) or ``"record"`` (record
    the accepted descriptor in the state directory, once the peer's Finished verified:
    :meth:`Registry.record`). ``run()`` blocks; it may run in another thread (it reads the
    registry and its caches, and changes neither). It returns the result to hand to
    :meth:`Session.complete_work` or raises a :class:`CBCLError`, which is handed over
    instead."""

    kind: str
    run: Callable[[], Any]


@dataclass(frozen=True, slots=True)
class Query:
    """``(supports …)``: does the responder speak ``protocol`` with this ``digest``?
    ``versions``: the versions the initiator can speak; ``encodings``: in preference order."""

    protocol: str
    digest: str
    versions: tuple[int, ...]
    encodings: tuple[str, ...] = ("binary", "text")


@dataclass(frozen=True, slots=True)
class Supported:
    protocol: str
    digest: str
    version: int
    encoding: str


@dataclass(frozen=True, slots=True)
class Unsupported:
    """The responder does not hold that digest; ``known``: the versions of the id it holds."""

    protocol: str
    known: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Offer:
    """The signed-descriptor document, offered by the initiator. ``digest`` (of its
    payload) is filled in by :meth:`Session.send`."""

    document: bytes
    digest: str = ""


@dataclass(frozen=True, slots=True)
class Accepted:
    """The responder verified, compiled and loaded the offer. ``signers`` (local only, the
    responder's view) are the key ids that signed it."""

    protocol: str
    digest: str
    version: int
    encoding: str
    signers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Rejected:
    """The responder refused the offer. ``reason`` is the wire code; ``detail`` is local
    only (the responder's log line), never sent."""

    reason: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Finished:
    """A transcript confirmation: ``sha256:`` of the labelled transcript hash."""

    transcript: str


@dataclass(frozen=True, slots=True)
class Established:
    """Both transcripts matched: ``protocol`` runs in ``encoding`` from now on."""

    protocol: str
    digest: str
    version: int
    encoding: str


@dataclass(frozen=True, slots=True)
class ProtocolMessage:
    """A message of the agreed protocol; ``step`` is what its conversation did (``None``
    when sending, or for a protocol without a conversation). A NOT-UNDERSTOOD that answers
    a message (``in-reply-to``) is one too, and ends nothing: :attr:`failure` says why the
    peer could not answer."""

    message: Message
    step: Step | None = None

    @property
    def finished(self) -> bool:
        """Whether this message ended its conversation (a final state)."""
        return self.step is not None and self.step.finished

    @property
    def failure(self) -> tuple[str, str] | None:
        """For a NOT-UNDERSTOOD in a conversation (the peer could not answer the message
        it replies to, spec/negotiation.md §6.3): its ``(code, detail)``, read from its
        body (:func:`~cbcl.session._reasons.read_failure`); ``None`` for any other
        message."""
        if self.message.intent is not Intent.NOT_UNDERSTOOD:
            return None
        return read_failure(self.message.body)


@dataclass(frozen=True, slots=True)
class NotUnderstood:
    """The peer could not use our message; ``reason`` is its code. The session is over."""

    reason: str


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The stream ended (received), or we end it (sent)."""


Event = (Query | Supported | Unsupported | Offer | Accepted | Rejected | Finished | Established
         | ProtocolMessage | NotUnderstood | ConnectionClosed)

__all__ = [
    "NEED_DATA", "NEED_WORK", "Accepted", "ConnectionClosed", "Established", "Event",
    "Finished", "NotUnderstood", "Offer", "ProtocolMessage", "Query", "Rejected",
    "Supported", "Unsupported", "Work",
]
