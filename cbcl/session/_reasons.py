"""Wire reason codes (spec/negotiation.md §4) as data, and the session's two errors.

Theory of operation
-------------------
A session that cannot use a message answers with a NOT-UNDERSTOOD carrying a code; a
responder that refuses an offer answers ``(rejected :reason CODE)``. What decides the code
is the *kind* of the failure, never the wording of its message:

* :data:`REASONS` has exactly one row per code of §4. A row names the error classes that
  produce its code (an error takes the row of the first class of its MRO that a row
  names, so the most specific class wins) and, for :class:`TrustError`, the ``cause``
  values that refine it; ``rejects`` says whether ``(rejected :reason …)`` may carry it.
* A code the session decides itself (a replay, a stale timestamp, a transcript that does
  not match, the end of the stream …) has a row with no error class: the session raises
  :class:`RemoteProtocolError` with ``code=`` that code, and the constructor refuses any
  code not in the table.
* Refusing an offer, an error whose code a ``(rejected …)`` cannot carry is
  :data:`REJECT_FALLBACK`.

A second, separate table, :data:`FAILURES` (spec/negotiation.md §6.3), names why an agent
answers a message of an established session with a NOT-UNDERSTOOD *in that message's
conversation* instead of a reply: its handler failed, overran, or gave a reply the protocol
refuses. Such a NOT-UNDERSTOOD ends nothing (conversations.md rule 1); its body is one
string, ``CODE`` or ``CODE: DETAIL`` (:func:`failure_body`, :func:`read_failure`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..core._errors import (
    CBCLError,
    ConversationError,
    DescriptorError,
    GrammarError,
    LimitError,
    MalformedError,
    ProtocolError,
    SchemaError,
    TrustError,
    UnknownProtocolError,
)


@dataclass(frozen=True, slots=True)
class Reason:
    """One wire code: what produces it (error classes, trust causes; neither for a code
    only the session or its edge decides), whether a rejection may carry it, and when."""

    code: str
    when: str
    errors: tuple[type[CBCLError], ...] = ()
    causes: tuple[str, ...] = ()
    rejects: bool = False


#: The reason table: one row per code of spec/negotiation.md §4.
REASONS: tuple[Reason, ...] = (
    Reason("malformed", "not well-formed, not an envelope, a body the grammar refuses, not "
           "a descriptor; a message between the wrong parties or in the wrong encoding",
           errors=(MalformedError, DescriptorError), rejects=True),
    Reason("limit", "a limit was exceeded", errors=(LimitError,), rejects=True),
    Reason("replay", "a message id seen within the replay window"),
    Reason("stale", "no timestamp, or one further than the skew window from now"),
    Reason("protocol", "any other protocol error (a message with no place in the "
           "negotiation, an unexpected handshake message)", errors=(ProtocolError, CBCLError)),
    Reason("unknown-protocol", "a protocol other than the one agreed",
           errors=(UnknownProtocolError,)),
    Reason("schema", "a body the protocol's schema refuses", errors=(SchemaError,)),
    Reason("conversation", "a message its conversation does not allow now",
           errors=(ConversationError,)),
    Reason("transcript-mismatch", "the peer's Finished is not our transcript's"),
    Reason("untrusted-signer", "no valid signature from a trusted key, an unknown or "
           "disallowed key, threshold not met, unsigned, key binding, a key the trust "
           "policy does not bind to the name it signs as, unusable state",
           errors=(TrustError,), causes=("untrusted", "unsigned", "key-binding",
                                         "name-binding", "state"),
           rejects=True),
    Reason("bad-signature", "a trusted key's signature that does not verify, or malformed "
           "signature text", causes=("bad-signature", "malformed-signature"), rejects=True),
    Reason("digest-mismatch", "an offer or answer that is not what was asked about",
           rejects=True),
    Reason("no-common-encoding", "none of the initiator's encodings is spoken here",
           rejects=True),
    Reason("rollback", "a version older than the one accepted, or a newer one not proved "
           "compatible with it as the trust policy requires", causes=("rollback",
                                                                      "incompatible"),
           rejects=True),
    Reason("equivocation", "the accepted version under another digest",
           causes=("equivocation",), rejects=True),
    Reason("expired", "the descriptor's expires has passed", causes=("expired",),
           rejects=True),
    Reason("grammar-refused", "a grammar outside the subset or the limits, not LALR(1), or "
           "a compile out of time or memory", errors=(GrammarError,), rejects=True),
    Reason("closed", "the stream ended in the middle"),
    Reason("timeout", "a deadline of the server's edge passed (§6.1)"),
    Reason("busy", "a cap of the server's edge was reached (§6.1)"),
)

#: Every code a NOT-UNDERSTOOD may carry.
NOT_UNDERSTOOD_CODES = frozenset(row.code for row in REASONS)
#: Every code a ``(rejected :reason …)`` may carry (the negotiation grammar's ``reason``).
REJECT_CODES = frozenset(row.code for row in REASONS if row.rejects)
#: The rejection code of an error whose own code a rejection cannot carry.
REJECT_FALLBACK = "malformed"

_BY_CLASS: dict[type, str] = {
    kind: row.code for row in REASONS for kind in row.errors}
_BY_CAUSE: dict[str, str] = {cause: row.code for row in REASONS for cause in row.causes}
#: The causes a :class:`TrustError` may name (``TrustError.cause``).
TRUST_CAUSES = frozenset(_BY_CAUSE)

class RemoteProtocolError(ProtocolError):
    """The peer broke the protocol. ``code`` is the reason sent in the NOT-UNDERSTOOD reply
    (a code of :data:`REASONS`); ``exit_code`` follows the underlying error (3 malformed,
    4 limit, 6 trust, 7 conversation, 5 otherwise)."""

    kind = "session"

    def __init__(self, message: str, *, code: str, exit_code: int = 5) -> None:
        if code not in NOT_UNDERSTOOD_CODES:
            raise ValueError(f"not a reason code of spec/negotiation.md §4: {code!r}")
        super().__init__(message)
        self.code = code
        self.exit_code = exit_code  # type: ignore[misc]


class LocalProtocolError(ProtocolError):
    """The caller asked the session to do something the protocol does not allow."""

    kind = "session"


def class_code(kind: type[CBCLError]) -> str:
    """The code of the first class of ``kind``'s MRO that a row of :data:`REASONS` names."""
    for base in kind.__mro__:
        code = _BY_CLASS.get(base)
        if code is not None:
            return code
    raise TypeError(f"{kind.__name__} is not a CBCLError")


def trust_cause(error: TrustError) -> str:
    """``error.cause``; ``"untrusted"`` for a TrustError raised without one."""
    return error.cause if error.cause is not None else "untrusted"


def error_code(error: CBCLError) -> str:
    """The NOT-UNDERSTOOD code for ``error``: a :class:`RemoteProtocolError`'s own code, a
    :class:`TrustError`'s cause's, else its class's (an unknown cause: its class's)."""
    if isinstance(error, RemoteProtocolError):
        return error.code
    if isinstance(error, TrustError):
        code = _BY_CAUSE.get(trust_cause(error))
        if code is not None:
            return code
    return class_code(type(error))


def reject_reason(error: BaseException) -> str:
    """The ``(rejected :reason …)`` code for an offer refused with ``error``: its code
    where a rejection may carry it, else :data:`REJECT_FALLBACK`."""
    if not isinstance(error, CBCLError):
        return REJECT_FALLBACK
    code = error_code(error)
    return code if code in REJECT_CODES else REJECT_FALLBACK


# --------------------------------------------------------------------------- failures


@dataclass(frozen=True, slots=True)
class Failure:
    """Why an agent answered a message with a NOT-UNDERSTOOD in its conversation instead
    of a reply (spec/negotiation.md §6.3): ``code``, ``when`` it is sent, and the exit
    status of ``cbcl send`` when it is the answer."""

    code: str
    when: str
    exit_code: int = 8


#: The failure table: one row per code of spec/negotiation.md §6.3.
FAILURES: tuple[Failure, ...] = (
    Failure("handler-failed", "the handler raised (any exception, SystemExit and "
            "KeyboardInterrupt included) or returned something that is not a message"),
    Failure("handler-timeout", "the handler did not answer within its deadline "
            "(handler_timeout), or no handler thread was free by then"),
    Failure("invalid-reply", "the handler's reply is one the protocol refuses (its body, "
            "schema, conversation machine, limits or parties): it is not sent"),
    Failure("shutdown", "the agent stopped before the handler answered (its grace period "
                        "passed)", exit_code=1),
)
#: Every code of :data:`FAILURES`.
FAILURE_CODES = frozenset(row.code for row in FAILURES)
#: The code of a conversation's NOT-UNDERSTOOD whose body names none (a peer's own).
UNNAMED_FAILURE = "not-understood"
#: The exit status for a failure code not in :data:`FAILURES` (a peer's own).
FAILURE_EXIT = 8
#: The longest detail :func:`failure_body` writes, in characters (escaped).
MAX_FAILURE_DETAIL = 200

_FAILURE_BODY = re.compile(r"([a-z][a-z0-9-]{0,63})(?:: (.*))?", re.DOTALL)
_EXITS = {row.code: row.exit_code for row in FAILURES}


def failure_body(code: str, detail: str = "") -> str:
    """The body of a failure NOT-UNDERSTOOD: ``code`` or ``code: detail``; ``detail`` is
    written as it is given (the caller escapes and shortens it, see
    :data:`MAX_FAILURE_DETAIL`). Raises ``ValueError`` for a code not in
    :data:`FAILURES`."""
    if code not in FAILURE_CODES:
        raise ValueError(f"not a failure code of spec/negotiation.md §6.3: {code!r}")
    return f"{code}: {detail}" if detail else code


def read_failure(body: object) -> tuple[str, str]:
    """A conversation's NOT-UNDERSTOOD body as ``(code, detail)``: a string that starts
    with a code word (lower-case letters, digits and ``-``, at most 64, then the end or
    ``": "``) gives that code and the rest; anything else is :data:`UNNAMED_FAILURE` with
    the whole string (``""`` for no string) as the detail. Never raises."""
    if type(body) is not str:
        return UNNAMED_FAILURE, ""
    found = _FAILURE_BODY.fullmatch(body)
    if found is None:
        return UNNAMED_FAILURE, body
    return found.group(1), found.group(2) or ""


def failure_exit(code: str) -> int:
    """The exit status of ``cbcl send`` answered with failure ``code`` (spec
    §6.4): the table's, else :data:`FAILURE_EXIT`."""
    return _EXITS.get(code, FAILURE_EXIT)


__all__ = [
    "FAILURES",
    "FAILURE_CODES",
    "FAILURE_EXIT",
    "MAX_FAILURE_DETAIL",
    "NOT_UNDERSTOOD_CODES",
    "REASONS",
    "REJECT_CODES",
    "REJECT_FALLBACK",
    "TRUST_CAUSES",
    "UNNAMED_FAILURE",
    "Failure",
    "LocalProtocolError",
    "Reason",
    "RemoteProtocolError",
    "class_code",
    "error_code",
    "failure_body",
    "failure_exit",
    "read_failure",
    "reject_reason",
    "trust_cause",
]
