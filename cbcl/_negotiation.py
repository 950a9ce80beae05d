"""The cbcl-negotiation/v1 handshake as data (spec/negotiation.md §3).

Theory of operation
-------------------
Like h11's ``_state.py``, this module is only a table and a tiny machine that walks it; it
knows nothing of sockets, bytes, keys or which side it runs on. Both parties of a session
keep the same :class:`HandshakeState` and advance it with every handshake message, sent or
received, named by *who sent it* (:data:`INITIATOR` or :data:`RESPONDER`) and its *kind*
(the body's head: ``supports``, ``supported`` …).

Rule 1: a message whose ``(state, sender, kind)`` has no row in :data:`TRANSITIONS` is a
protocol error, and the machine moves to ``ERROR``.
Rule 2: ``ERROR``, ``REJECTED`` and ``CLOSED`` are final; nothing leaves them. Every error
anywhere in a session (a frame it cannot read, a replay, a transcript that does not match)
moves it to ``ERROR`` through :meth:`HandshakeMachine.fail`.
"""

from __future__ import annotations

from enum import Enum

from ._errors import ProtocolError

PROTOCOL_ID = "cbcl-negotiation/v1"
INITIATOR = "initiator"
RESPONDER = "responder"
ROLES = (INITIATOR, RESPONDER)


class HandshakeState(Enum):
    IDLE = "IDLE"                  # nothing sent yet
    ASKED = "ASKED"                # the initiator asked (supports …)
    UNSUPPORTED = "UNSUPPORTED"    # the responder does not speak it; an offer may follow
    OFFERED = "OFFERED"            # the initiator offered the signed descriptor
    AGREED = "AGREED"              # supported, or the offer accepted: protocol and encoding set
    CONFIRMING = "CONFIRMING"      # the initiator sent its transcript hash
    ESTABLISHED = "ESTABLISHED"    # both transcript hashes matched: the protocol runs
    REJECTED = "REJECTED"          # the responder refused the offer (final)
    CLOSED = "CLOSED"              # the stream ended cleanly (final)
    ERROR = "ERROR"                # anything went wrong (final)


S = HandshakeState

#: (state, sender, kind) -> next state. ``message`` is a message of the agreed protocol.
TRANSITIONS: dict[tuple[HandshakeState, str, str], HandshakeState] = {
    (S.IDLE, INITIATOR, "supports"): S.ASKED,
    (S.ASKED, RESPONDER, "supported"): S.AGREED,
    (S.ASKED, RESPONDER, "unsupported"): S.UNSUPPORTED,
    (S.UNSUPPORTED, INITIATOR, "offer"): S.OFFERED,
    (S.OFFERED, RESPONDER, "accepted"): S.AGREED,
    (S.OFFERED, RESPONDER, "rejected"): S.REJECTED,
    (S.AGREED, INITIATOR, "finished"): S.CONFIRMING,
    (S.CONFIRMING, RESPONDER, "finished"): S.ESTABLISHED,
    (S.ESTABLISHED, INITIATOR, "message"): S.ESTABLISHED,
    (S.ESTABLISHED, RESPONDER, "message"): S.ESTABLISHED,
}

#: The end of the stream is clean only here (an initiator that was answered "unsupported"
#: may also walk away without offering).
CLOSABLE = frozenset({S.ESTABLISHED, S.UNSUPPORTED, S.REJECTED, S.CLOSED})
FINAL = frozenset({S.REJECTED, S.CLOSED, S.ERROR})

#: The intent each handshake message is sent with.
INTENTS = {
    "supports": "QUERY", "supported": "INFORM", "unsupported": "INFORM", "offer": "PROPOSE",
    "accepted": "ACCEPT", "rejected": "REJECT", "finished": "CONFIRM",
}

#: Reason codes a responder puts in ``(rejected :reason …)``, and a NOT-UNDERSTOOD carries.
REJECT_REASONS = ("untrusted-signer", "bad-signature", "rollback", "equivocation", "expired",
                  "grammar-refused", "limit", "digest-mismatch", "malformed",
                  "no-common-encoding")
ENCODINGS = ("text", "binary")


class HandshakeMachine:
    """The shared handshake state and the one way to change it."""

    def __init__(self) -> None:
        self.state = S.IDLE

    def can(self, sender: str, kind: str) -> bool:
        return (self.state, sender, kind) in TRANSITIONS

    def expected(self) -> list[str]:
        """What may come next, as ``"kind from sender"`` phrases (for error messages)."""
        return [f"({kind} …) from the {sender}" for (state, sender, kind) in TRANSITIONS
                if state is self.state]

    def advance(self, sender: str, kind: str) -> HandshakeState:
        """Take the row for ``(state, sender, kind)`` (rule 1: none is an error, and the
        machine is then in ``ERROR``)."""
        if sender not in ROLES:
            raise ValueError(f"sender must be one of {ROLES}")
        target = TRANSITIONS.get((self.state, sender, kind))
        if target is None:
            before = self.state
            self.state = S.ERROR
            expected = ", ".join(
                f"({k} …) from the {s}" for (st, s, k) in TRANSITIONS if st is before)
            raise ProtocolError(f"({kind} …) from the {sender} is not allowed in state "
                                f"{before.value} (expected: {expected or 'nothing'})")
        self.state = target
        return target

    def close(self) -> HandshakeState:
        """The stream ended: clean in :data:`CLOSABLE` states, an error elsewhere."""
        if self.state in (S.ESTABLISHED, S.UNSUPPORTED, S.CLOSED):
            self.state = S.CLOSED
        elif self.state is not S.REJECTED:
            self.state = S.ERROR
        return self.state

    def fail(self) -> None:
        self.state = S.ERROR
