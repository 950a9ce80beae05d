"""The cbcl-negotiation/v1 handshake as data (spec/negotiation.md §3).

Theory of operation
-------------------
Like h11's ``_state.py``, this module is only a table and a tiny machine that walks it; it
knows nothing of sockets, bytes, keys or which side it runs on. Both parties of a session
keep the same :class:`HandshakeState` and advance it with every handshake message, sent or
received, named by *who sent it* (:data:`INITIATOR` or :data:`RESPONDER`) and its *kind*
(the body's head: ``supports``, ``supported`` …).

Three tables, one per kind of input, and the machine only looks rows up:

* :data:`TRANSITIONS` — a message: ``(state, sender, kind) -> state``. A message with no
  row is a protocol error, and the machine moves to :data:`ON_FAILURE`.
* :data:`END_OF_STREAM` — the end of the stream: ``state -> state``, a row for every
  state (CLOSED where the end is clean, ERROR elsewhere).
* :data:`ON_FAILURE` — any error anywhere in a session (a frame it cannot read, a replay,
  a transcript that does not match, a NOT-UNDERSTOOD) from any state: ERROR.

The states of :data:`FINAL` (ERROR, REJECTED, CLOSED) have no message row: no message
leaves them. The end of the stream takes REJECTED to CLOSED (the initiator was refused and
the stream then ended: a clean end), and an error takes any state to ERROR.
"""

from __future__ import annotations

from enum import Enum

from ..core._errors import ProtocolError

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

#: The states no message leaves (:data:`TRANSITIONS` has no row from them).
FINAL = frozenset({S.REJECTED, S.CLOSED, S.ERROR})

#: The end of the stream, by state (§3). ESTABLISHED is clean only with no conversation
#: open: the session, which knows conversations, fails first when one is. An initiator
#: answered "unsupported" may walk away without offering.
END_OF_STREAM: dict[HandshakeState, HandshakeState] = {
    S.IDLE: S.ERROR,
    S.ASKED: S.ERROR,
    S.UNSUPPORTED: S.CLOSED,
    S.OFFERED: S.ERROR,
    S.AGREED: S.ERROR,
    S.CONFIRMING: S.ERROR,
    S.ESTABLISHED: S.CLOSED,
    S.REJECTED: S.CLOSED,
    S.CLOSED: S.CLOSED,
    S.ERROR: S.ERROR,
}

#: Where any error, or a NOT-UNDERSTOOD, takes the machine from any state (§3).
ON_FAILURE = S.ERROR

#: The intent each handshake message is sent with.
INTENTS = {
    "supports": "QUERY", "supported": "INFORM", "unsupported": "INFORM", "offer": "PROPOSE",
    "accepted": "ACCEPT", "rejected": "REJECT", "finished": "CONFIRM",
}

ENCODINGS = ("text", "binary")


class HandshakeMachine:
    """The shared handshake state and the one way to change it."""

    def __init__(self) -> None:
        self.state = S.IDLE

    def can(self, sender: str, kind: str) -> bool:
        return (self.state, sender, kind) in TRANSITIONS

    def expected(self) -> list[str]:
        """What may come next, as ``"kind from sender"`` phrases (for error messages)."""
        return self._phrases(self.state)

    def advance(self, sender: str, kind: str) -> HandshakeState:
        """Take the row of :data:`TRANSITIONS` for ``(state, sender, kind)``; none is a
        :class:`ProtocolError`, and the machine is then in :data:`ON_FAILURE`."""
        if sender not in ROLES:
            raise ValueError(f"sender must be one of {ROLES}")
        target = TRANSITIONS.get((self.state, sender, kind))
        if target is None:
            before = self.state
            self.state = ON_FAILURE
            expected = ", ".join(self._phrases(before))
            raise ProtocolError(f"({kind} …) from the {sender} is not allowed in state "
                                f"{before.value} (expected: {expected or 'nothing'})")
        self.state = target
        return target

    def close(self) -> HandshakeState:
        """The stream ended: take the row of :data:`END_OF_STREAM`."""
        self.state = END_OF_STREAM[self.state]
        return self.state

    def fail(self) -> None:
        """Something went wrong: move to :data:`ON_FAILURE`."""
        self.state = ON_FAILURE

    @staticmethod
    def _phrases(state: HandshakeState) -> list[str]:
        return [f"({kind} …) from the {sender}" for (st, sender, kind) in TRANSITIONS
                if st is state]
