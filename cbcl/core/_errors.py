"""The exception hierarchy. Every failure CBCL reports is a :class:`CBCLError`.

Each class carries ``kind`` (the word the CLI prints first) and ``exit_code`` (draft §6).
Input errors carry a :class:`Position`; the message text never includes it, so the CLI can
print ``kind line:column: message`` and ``str(error)`` stays readable in logs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

#: What :meth:`CBCLError.hint` calls: set by the layer that knows grammars and templates
#: (:func:`cbcl.protocol._hints.render_hint`, installed when it is imported, which
#: ``import cbcl`` does), so that this bottom module imports nothing above it.
_hint_renderer: Callable[[CBCLError], str] | None = None


def install_hint_renderer(renderer: Callable[[CBCLError], str]) -> None:
    """Make ``renderer`` the function every :meth:`CBCLError.hint` calls."""
    global _hint_renderer
    _hint_renderer = renderer


@dataclass(frozen=True, slots=True)
class Position:
    """Where in an input a problem lies: 1-based line and column (in characters) and the
    0-based byte offset into the UTF-8 input. Binary input has ``line == column == 0``."""

    line: int
    column: int
    offset: int

    def __str__(self) -> str:
        if self.line == 0:
            return f"byte {self.offset}"
        return f"{self.line}:{self.column}"


class CBCLError(Exception):
    """Root of every error CBCL raises."""

    kind: ClassVar[str] = "error"
    exit_code: ClassVar[int] = 1

    def __init__(self, message: str, *, position: Position | None = None,
                 context: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.position = position
        #: A few lines of the input around ``position`` with a caret, or ``None``.
        self.context = context

    @property
    def line(self) -> int | None:
        return self.position.line if self.position else None

    @property
    def column(self) -> int | None:
        return self.position.column if self.position else None

    @property
    def offset(self) -> int | None:
        return self.position.offset if self.position else None

    def hint(self) -> str:
        """A short instruction, for the author of the input (a person or a model), on how to
        fix it: where (line:column and the context), what was found, what is accepted there
        (for a body, in its grammar's terms, with a template of the enclosing list; for an
        envelope, the envelope's template). Computed when asked, never when raised; every
        piece of the input in it is escaped (:mod:`cbcl.protocol._hints`)."""
        if _hint_renderer is None:  # only before cbcl.protocol is imported
            return self.one_line()
        return _hint_renderer(self)

    def one_line(self) -> str:
        """``kind line:column: message`` (or ``kind: message`` without a position). A
        message that already begins with ``kind: `` (as descriptor problems do, so that
        ``str(error)`` names the document) does not repeat it."""
        where = f" {self.position}" if self.position else ""
        message = self.message
        if message.startswith(f"{self.kind}: "):
            message = message[len(self.kind) + 2:]
        return f"{self.kind}{where}: {message}"


class MalformedError(CBCLError, ValueError):
    """The input is not well-formed CBCL text (or binary): exit code 3.

    ``expected`` lists, in user terms, what would have been accepted at ``position``.
    """

    kind = "malformed"
    exit_code = 3

    def __init__(self, message: str, *, position: Position | None = None,
                 context: str | None = None, expected: tuple[str, ...] = ()) -> None:
        super().__init__(message, position=position, context=context)
        self.expected = expected

    #: What :meth:`hint` needs beyond the error's fields, attached where a grammar refused
    #: the input (pass 1, pass 2, the binary decoder): a :class:`cbcl.protocol._hints.BodyHint` or
    #: :class:`cbcl.protocol._hints.EnvelopeHint`; ``None`` elsewhere.
    hint_material: object = None


class EnvelopeError(MalformedError):
    """Well-formed values that do not form a CBCL/1.0 envelope (draft §2)."""

    kind = "envelope"


class BodyError(MalformedError):
    """A body that the protocol's grammar does not accept (pass 2)."""

    kind = "body"


class LimitError(CBCLError, ValueError):
    """A limit was exceeded: exit code 4. ``limit`` names the limit (a :class:`Limits`
    field), ``maximum`` its value."""

    kind = "limit"
    exit_code = 4

    def __init__(self, message: str, *, limit: str, maximum: int,
                 position: Position | None = None, context: str | None = None) -> None:
        super().__init__(message, position=position, context=context)
        self.limit = limit
        self.maximum = maximum


class ProtocolError(CBCLError, ValueError):
    """A protocol problem: exit code 5."""

    kind = "protocol"
    exit_code = 5


class UnknownProtocolError(ProtocolError, LookupError):
    """The message names a protocol the registry does not hold."""

    kind = "unknown-protocol"

    def __init__(self, message: str, *, protocol: str, position: Position | None = None,
                 context: str | None = None) -> None:
        super().__init__(message, position=position, context=context)
        self.protocol = protocol


class DescriptorError(ProtocolError):
    """A protocol descriptor is invalid."""

    kind = "descriptor"


class GrammarError(ProtocolError):
    """A descriptor grammar is refused: outside the subset, over a limit, or not LALR(1).

    ``verdict`` is one of the checker's verdicts (draft §4), e.g. ``"rejected"``.
    """

    kind = "grammar"

    def __init__(self, message: str, *, verdict: str = "rejected",
                 position: Position | None = None, context: str | None = None) -> None:
        super().__init__(message, position=position, context=context)
        self.verdict = verdict


class TrustError(CBCLError):
    """A signature or trust failure: exit code 6.

    ``message`` is deliberately uninformative (the same for every cause, e.g. ``"descriptor
    verification failed"``): it, or only the error's class, is what a peer may be told.
    ``reason`` holds the precise cause. ``str(error)`` and :meth:`one_line` are for the
    local operator and logs, and show both: ``message (reason)``. ``cause`` names the
    failure as data (``"rollback"``, ``"bad-signature"`` …; the table of
    :mod:`cbcl.session._reasons` turns it into a wire code), ``None`` where the raise site did not
    name one."""

    kind = "trust"
    exit_code = 6

    def __init__(self, message: str = "verification failed", *, reason: str = "",
                 cause: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.cause = cause

    def __str__(self) -> str:
        return f"{self.message} ({self.reason})" if self.reason else self.message

    def one_line(self) -> str:
        """``trust: message (reason)`` (or ``trust: message`` without a reason)."""
        line = super().one_line()
        return f"{line} ({self.reason})" if self.reason else line


class ViolationError(CBCLError, ValueError):
    """A conversation, schema or evaluation violation: exit code 7. ``path`` points into
    the message (``$.body.task[:id]``) where that applies."""

    kind = "violation"
    exit_code = 7

    def __init__(self, message: str, *, path: str | None = None,
                 position: Position | None = None) -> None:
        super().__init__(message, position=position)
        self.path = path


class ConversationError(ViolationError):
    kind = "conversation"


class SchemaError(ViolationError):
    kind = "schema"


class EvaluationError(ViolationError):
    kind = "evaluation"


class ConversionError(ProtocolError):
    """A message that cannot be converted to or from another agent format (FIPA ACL, A2A)
    at all (a FIPA message without a sender, a date that does not exist …): exit 5."""

    kind = "convert"


class LossyConversionError(ConversionError):
    """A conversion that would lose something, refused because ``lossy`` was not given:
    exit 5. ``losses`` lists what would be lost, one sentence each."""

    kind = "lossy"

    def __init__(self, losses: list[str] | tuple[str, ...], *, what: str = "conversion"
                 ) -> None:
        self.losses = tuple(losses)
        super().__init__(f"the {what} would lose: " + "; ".join(self.losses)
                         + " (give lossy=True, or --lossy, to convert anyway)")


class ConnectionLost(CBCLError):
    """The stream failed, a deadline passed, or the server refused the connection: exit
    code 1. ``code`` is the NOT-UNDERSTOOD code sent for a refusal of ours (``timeout``,
    ``busy``), else ``None``."""

    kind = "connection"
    exit_code = 1

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class NegotiationFailed(CBCLError):
    """The peer rejected our offer or did not understand the negotiation; ``exit_code``
    follows the reason (spec/negotiation.md §7)."""

    kind = "negotiation"

    def __init__(self, message: str, *, reason: str = "", exit_code: int = 6) -> None:
        super().__init__(message)
        self.reason = reason
        # (per instance: CBCLError declares exit_code a ClassVar, one per class)
        self.exit_code = exit_code  # type: ignore[misc]


class ConversationClosed(CBCLError):
    """The conversation ended before the reply came: the link closed (``reason``:
    ``closed``, ``timeout``, ``busy``, a NOT-UNDERSTOOD code, ``error``) or no reply came
    within the deadline (``reason`` ``no-reply``)."""

    kind = "conversation-closed"

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason
