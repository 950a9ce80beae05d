"""Streaming validation: a model's output checked as it is written (spec/llm.md §13).

Theory of operation
-------------------
A :class:`Checker` is fed the text of one message (or, with ``body=True``, of one body)
in chunks, as a model writes it, and answers each chunk with :class:`Ok` or
:class:`Refused`: a caller may stop the model at the first token no receiver would
accept. It runs the recognisers :func:`cbcl.parse` runs, one token at a time:

* **Lexing** uses the reader's token expression (:data:`cbcl.core._reader.TOKEN`) and its
  atom reader (:func:`~cbcl.core._reader.read_value_python`, which checks every limit at
  the token), so a token is what the reader makes of it. A token is *decided* once the
  text after it shows where it ends: ``(`` and ``)`` at once; an atom at the delimiter
  after it (``[ \\t\\r\\n();"]``); a string at the character after its closing quote; a
  character that starts no token at once. What is not decided yet waits, and the lexer
  keeps where it got to (inside a comment, inside a string up to its last whole escape,
  inside an atom up to its last character), so each character is looked at a bounded
  number of times however the text is cut: a token split across chunks, a string split
  mid-escape and (given bytes) a character split mid-UTF-8 sequence (an incremental
  strict decoder) all wait for the rest. :attr:`Checker.work` counts the characters the
  lexer's expressions went through, for the tests' linearity check.
* **The envelope** is fed, token by token, to the envelope's tables by the one LR driver
  (:func:`cbcl.grammar._kernel.feed`), as pass 1's :func:`~cbcl.protocol._envelope.scan_envelope`
  feeds them, with the same limits and refusals (:func:`~cbcl.protocol._envelope._refuse`).
* **The body**: the envelope names its intent and then its protocol before ``(body …)``
  (spec/cbcl-1.0.md §2), so when the body starts its grammar is known. The protocol is looked
  up at its symbol (unknown: refused there, as :func:`cbcl.parse` refuses it), and the
  body's tokens are fed to the protocol's tables by the same driver, from the intent's
  start state (:func:`cbcl.protocol._pass2.start_stack`), keyword sets' masks kept as
  pass 2 keeps them, a list where the grammar takes any ``value`` read without the tables
  (:func:`~cbcl.grammar._lalr.value_states`), as pass 2 takes it whole. A refusal is worded by
  :func:`~cbcl.grammar._kernel.body_refusal` with the hint material pass 2 attaches.
* **At the end**, :meth:`Checker.finish` decides what waits for the end of the input and
  then parses the whole text with :func:`cbcl.parse` (the schema, a trust store's
  signature check) to return the :class:`Message`.

The verdict and the whole-message parser's (spec/llm.md §13): a message :func:`cbcl.parse`
accepts is never refused, at any prefix or cut; a refused message is refused at the
position of :func:`cbcl.parse`'s error, with the same error, except that the checker may
refuse earlier where pass 2 (the body's grammar, the protocol lookup, the intent's
governance) refuses a token before pass 1's first error — :func:`cbcl.parse` judges the
body only once the whole envelope has been read. The schema is checked at the end only.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from typing import Any, NoReturn

from ..core._errors import (
    BodyError,
    CBCLError,
    EnvelopeError,
    MalformedError,
    Position,
    ProtocolError,
    UnknownProtocolError,
)
from ..core._limits import DEFAULT_LIMITS, Budget, Limits
from ..core._reader import (
    BAD,
    EOF,
    LPAR,
    RPAR,
    STRING,
    TOKEN,
    context_of,
    decode,
    diagnose,
    fail,
    limit,
    nowhere,
    position_of,
    read,
    read_value_python,
    token_start,
)
from ..core._values import ATOM_TERMINALS, Keyword, Symbol, Value
from ..grammar._kernel import (
    ACCEPTED,
    END,
    REFUSED,
    WHOLE,
    body_refusal,
    feed,
    take_value,
    terminal_of,
)
from ..grammar._lalr import value_states
from ..protocol._api import parse
from ..protocol._envelope import LITERALS, _refuse as _envelope_refusal, envelope_tables
from ..protocol._hints import UNREAD, EnvelopeHint, body_hint
from ..protocol._message import Intent, Message
from ..protocol._pass2 import start_stack
from ..protocol._protocol import Protocol
from ..protocol._registry import Registry
from ..protocol._schema import check_schema

__all__ = ["Checker", "CheckerMisuse", "Ok", "Refused"]


class CheckerMisuse(CBCLError, RuntimeError):
    """A :class:`Checker` used out of turn: fed after :meth:`Checker.finish`, or fed
    ``bytes`` and ``str`` by turns."""

    kind = "usage"
    exit_code = 2


@dataclass(frozen=True, slots=True)
class Ok:
    """Nothing refused so far. ``complete``: the message (or body) has been read to its
    last ``)`` (only whitespace and comments may follow). After :meth:`Checker.finish`,
    ``message`` is the parsed :class:`Message` (``body``: the body's value, body mode)."""

    consumed: int
    complete: bool
    message: Message | None = None
    body: Value | None = None
    #: Where the message (or body) ends, once ``complete``: the index after its last
    #: character (-1 before).
    end: int = -1

    def __bool__(self) -> bool:
        return True


@dataclass(frozen=True, slots=True)
class Refused:
    """The text is refused: no continuation of it is a message a receiver accepts.
    ``index`` is the character index of the refused token (where :func:`cbcl.parse` puts
    its error), ``position`` its line, column and byte offset, ``expected`` what would have
    been accepted there, ``error`` the :class:`CBCLError` a receiver raises (its
    :meth:`~cbcl.CBCLError.hint` says how to fix it), and ``consumed`` the characters
    fed when the refusal was found (``consumed - index`` were written in vain)."""

    index: int
    position: Position
    expected: tuple[str, ...]
    error: CBCLError
    consumed: int

    def __bool__(self) -> bool:
        return False

    def hint(self) -> str:
        """The error's repair hint (:meth:`cbcl.CBCLError.hint`)."""
        return self.error.hint()


# The modes of a checker.
_ENVELOPE, _BODY, _DONE = range(3)
#: Where the token after an atom may start: the reader's delimiters, and ``"``, at which
#: the reader's diagnosis ends an atom's run too (cbcl.core._reader._RUN_END).
_RUN_END = re.compile(r"[ \t\r\n();\"]")
#: What ends a comment (cbcl.core._reader._COMMENT_PATTERN's complement).
_COMMENT_END = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069"
                          "\u2028\u2029\ufeff]")
#: A string's characters and whole escapes (cbcl.core._reader.TOKEN's STRING alternative).
_STRING_UNITS = re.compile(r'(?:[^"\\\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]++'
                           r'|\\["\\nrt]|\\u(?![dD][89a-fA-F])[0-9a-fA-F]{4})*+')
#: An escape cut short by the end of the text so far.
_PARTIAL_ESCAPE = re.compile(r"\\(?:u[0-9a-fA-F]{0,3})?\Z")
#: Characters that may start an atom whose diagnosis reads on past them: a character not
#: among them that starts no token is refused at once (cbcl.core._reader.diagnose looks
#: at it alone).
_ATOM_START = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz+-*/<>=!?_."
                        "0123456789:")
_FIELD_ID = {"MESSAGE_ID": "message-id", "CONVERSATION_ID": "conversation-id",
             "IN_REPLY_TO": "in-reply-to"}
_INTENT_TERMINALS = {intent.name: intent for intent in Intent}
#: Intents any conversation admits without their protocol governing them (pass 2).
_ALWAYS_ADMITTED = (Intent.NOT_UNDERSTOOD, Intent.CANCEL)


class _Refusal(Exception):
    """Carries a refusal out of the token loop: the error and the index of the token."""

    def __init__(self, error: CBCLError, index: int) -> None:
        super().__init__(error.message)
        self.error = error
        self.index = index


class Checker:
    """Checks the text of one CBCL message as it is written (see the module doc).

    ``registry`` holds the protocols a body may use. ``intent`` and ``protocol``, when
    given, are required of the message (a message of another intent or protocol is
    refused at that field); with ``body=True`` the text is one body of ``protocol``'s
    ``intent`` messages (both required) rather than a whole message. ``trailing=True``:
    the text may go on after the message (a model's prose): once the message's last
    ``)`` is read, the rest is not looked at, and :meth:`finish` parses the message
    alone (:attr:`Ok.end` says where it ends). ``limits`` as :func:`cbcl.parse` takes
    them.

    Raises ``TypeError`` for arguments of the wrong type, :class:`UnknownProtocolError`
    for a ``protocol`` the registry does not hold and :class:`ProtocolError` for an
    ``intent`` it does not govern (body mode)."""

    def __init__(self, registry: Registry, *, intent: Intent | str | None = None,
                 protocol: Protocol | Symbol | str | None = None, body: bool = False,
                 trailing: bool = False, limits: Limits | None = None) -> None:
        if not isinstance(registry, Registry):
            raise TypeError("registry must be a cbcl.Registry")
        limits = DEFAULT_LIMITS if limits is None else limits
        if not isinstance(limits, Limits):
            raise TypeError("limits must be a cbcl.Limits")
        self.registry = registry
        self.limits = limits
        self.intent: Intent | None = None if intent is None else Intent(intent)
        self.protocol: Protocol | None = None
        if protocol is not None:
            found = protocol if isinstance(protocol, Protocol) else registry.get(protocol)
            if found is None:
                raise UnknownProtocolError(f"unknown protocol {protocol}: no descriptor for "
                                           "it is loaded", protocol=str(protocol))
            self.protocol = found
        #: Characters the lexer's expressions went through (each at most a few times).
        self.work = 0
        #: Tokens decided and fed to a recogniser.
        self.tokens = 0
        #: Driver steps: terminals fed to the envelope's and the body's tables.
        self.steps = 0
        self._parts: list[str] = []
        self._joined: str | None = None
        self._size = 0
        self._window = ""
        self._offset = 0
        self._held: list[str] = []
        self._tail = ""
        self._bytes = 0
        self._raw: bytearray | None = None
        self._decoder: Any = None
        self._kind: type | None = None
        self._pos = 0
        self._comment = False
        self._pending = -1  # where an atom or string waiting for its end starts
        self._scan = 0  # how far the pending token has been looked at
        self._string = False
        self._result: Ok | Refused = Ok(0, False)
        self._finished = False
        self._depth = 0
        self._nodes = 0
        self._items = [0]  # the envelope's open lists' elements (the document counts too)
        self._previous = ""
        self._stack = [envelope_tables().start_state]
        self._complete = False
        self._message_intent: Intent | None = None
        self._body_seen = False
        # The body under way.
        self._body_protocol: Protocol | None = None
        self._body_stack: list[int] = []
        self._marks: dict[int, int] = {}
        self._whole: dict[str, int] = {}
        self._heads: list[object] = []  # each open body list's first element (or UNREAD)
        self._body_items: list[int] = []
        self._opaque = 0  # depth within a list read whole (a ``value``)
        self._free = False  # a body no grammar judges (an ungoverned reason string)
        self._body_intent = Intent.INFORM
        self._body_start = 0
        self._mode = _ENVELOPE
        self._body_only = body
        self._trailing = trailing
        self._end = -1
        if body:
            if self.protocol is None or self.intent is None:
                raise TypeError("a body checker needs protocol= and intent=")
            try:
                self._require_governed(self.protocol, self.intent, 0)
            except _Refusal as refusal:
                raise refusal.error from None
            self._start_body(self.protocol, self.intent, 0)

    # ------------------------------------------------------------------ the interface

    @property
    def text(self) -> str:
        """The text fed so far (decoded)."""
        return self._full()

    @property
    def result(self) -> Ok | Refused:
        """The last verdict."""
        return self._result

    def feed(self, chunk: bytes | bytearray | memoryview | str) -> Ok | Refused:
        """Check ``chunk``, the next piece of the text (UTF-8 ``bytes``, or ``str``; one
        kind throughout): :class:`Ok` while every token so far is accepted, else the
        :class:`Refused` of the first refused token (the same one for every later
        chunk). Raises :class:`CheckerMisuse` after :meth:`finish` or when ``bytes`` and
        ``str`` are mixed, ``TypeError`` for another type."""
        if self._finished:
            raise CheckerMisuse("the checker has finished: start a new one for new text")
        if isinstance(self._result, Refused):
            return self._result
        if isinstance(chunk, str):
            kind: type = str
        elif isinstance(chunk, (bytes, bytearray, memoryview)):
            kind = bytes
        else:
            raise TypeError(f"expected bytes or str, not {type(chunk).__name__}")
        if self._kind is None:
            self._kind = kind
        elif self._kind is not kind:
            raise CheckerMisuse("feed one kind of text: bytes or str, not both")
        try:
            self._take(chunk)
            self._run(final=False)
        except _Refusal as refusal:
            return self._refused(refusal)
        self._result = Ok(self._size, self._complete, end=self._end)
        return self._result

    def finish(self) -> Ok | Refused:
        """The end of the text: decide what waited for it, then parse the whole text as
        :func:`cbcl.parse` does (body mode: read it and check the schema). Returns
        :class:`Ok` with ``message`` (or ``body``), or the :class:`Refused`. Raises
        :class:`CheckerMisuse` if called twice."""
        if self._finished:
            raise CheckerMisuse("the checker has finished already")
        self._finished = True
        if isinstance(self._result, Refused):
            return self._result
        try:
            if self._decoder is not None:
                self._append(self._decode(b"", final=True))
            self._run(final=True)
        except _Refusal as refusal:
            return self._refused(refusal)
        try:
            text = self._full()
            if self._trailing and self._end >= 0:
                text = text[:self._end]
            if self._body_only:
                assert self._body_protocol is not None
                value = read(text, limits=self.limits)
                if self._body_protocol.schema is not None:
                    check_schema(self._body_protocol.schema, value)
                self._result = Ok(self._size, True, body=value, end=self._end)
            else:
                message = parse(text, registry=self.registry, limits=self.limits)
                self._result = Ok(self._size, True, message=message, end=self._end)
        except CBCLError as error:
            index = self._size
            if error.position is not None and error.position.line:
                index = _index_of(self._full(), error.position)
            return self._refused(_Refusal(error, index))
        return self._result

    # ------------------------------------------------------------------ input

    def _take(self, chunk: bytes | bytearray | memoryview | str) -> None:
        """Add ``chunk`` to the text, checking the document's size and its UTF-8."""
        if isinstance(chunk, str):
            try:
                size = len(chunk.encode("utf-8"))
            except UnicodeEncodeError as exc:
                index = self._size + exc.start
                try:
                    fail(self._full() + chunk, index, "a lone surrogate is not valid UTF-8")
                except CBCLError as error:
                    raise _Refusal(error, index) from None
            self._count(size)
            self._append(chunk)
            return
        data = bytes(chunk)
        self._count(len(data))
        if self._decoder is None:
            self._decoder = codecs.getincrementaldecoder("utf-8")("strict")
            self._raw = bytearray()
        assert self._raw is not None
        self._raw += data
        self._append(self._decode(data, final=False))

    def _decode(self, data: bytes, final: bool) -> str:
        try:
            text: str = self._decoder.decode(data, final)
        except UnicodeDecodeError as exc:
            assert self._raw is not None
            raw = bytes(self._raw)
            try:
                decode(raw, Limits(max_message_bytes=max(1, len(raw))))
            except CBCLError as error:
                bad = len(raw) - len(data) + exc.start  # (the decoder holds no byte then)
                good = raw[:max(0, bad)].decode("utf-8", "replace")
                raise _Refusal(error, len(good)) from None
            raise  # pragma: no cover - the whole bytes decode where a piece did not
        return text

    def _count(self, size: int) -> None:
        self._bytes += size
        if self._bytes > self.limits.max_message_bytes:
            try:
                Budget(self.limits, nowhere).exceeded("max_message_bytes", 0)
            except CBCLError as error:
                raise _Refusal(error, self._size) from None

    def _append(self, text: str) -> None:
        if not text:
            return
        self._parts.append(text)
        self._size += len(text)
        self._joined = None
        if self._pending >= 0:  # held apart until the pending token's end is found
            self._held.append(text)
            self._tail += text
        else:
            self._window += text

    def _full(self) -> str:
        """The whole text so far (joined when an error needs it, and at the end)."""
        if self._joined is None:
            self._joined = "".join(self._parts)
            self._parts = [self._joined]
        return self._joined

    def _refused(self, refusal: _Refusal) -> Refused:
        error = refusal.error
        position = error.position
        if position is None or not position.line:
            position = position_of(self._full(), refusal.index)
        expected = error.expected if isinstance(error, MalformedError) else ()
        self._result = Refused(refusal.index, position, expected, error, self._size)
        return self._result

    # ------------------------------------------------------------------ the lexer
    #
    # Positions are indexes into the whole text; the lexer's expressions run on
    # ``_window``, the text from ``_offset`` on: what is not decided yet. While a token
    # waits for its end, new text is held apart (``_held``) and only ``_tail``, the text
    # from ``_scan`` (how far the token has been looked at) on, is searched.

    def _run(self, final: bool) -> None:
        """Decide every token the text so far decides (all of them when ``final``)."""
        while True:
            if self._complete and self._end < 0:
                self._end = self._pos
            if self._complete and self._trailing:
                return
            if self._comment:
                text = self._window
                found = _COMMENT_END.search(text, self._pos - self._offset)
                end = self._size if found is None else self._offset + found.start()
                self.work += end - self._pos
                self._pos = end
                if found is None and not final:
                    self._trim()
                    return
                self._comment = False
            decided = False
            if self._pending >= 0:
                if not self._ends(final):
                    self._trim()
                    return
                decided = True
            text = self._window
            base = self._offset
            m = TOKEN.match(text, self._pos - base)
            assert m is not None
            kind: int = m.lastindex  # type: ignore[assignment]
            if kind == EOF:
                self.work += self._size - self._pos
                if final:
                    self._token(kind, m)
                    return
                skipped = text[self._pos - base:]
                line = max(skipped.rfind("\n"), skipped.rfind("\r"))
                self._comment = ";" in skipped[line + 1:]
                self._pos = self._size
                self._trim()
                return
            local = token_start(m) if kind != BAD else m.start(BAD)
            alone = kind == BAD and text[local] != '"' and text[local] not in _ATOM_START
            if kind not in (LPAR, RPAR) and not final and not decided and not alone and \
                    (kind == BAD or m.end() == len(text)):
                # An atom or a string at the end of the text, or a character that may
                # start one, may yet become another token: wait for its end. (Any other
                # character that starts no token is decided by itself: the reader's
                # diagnosis reads it alone.)
                self.work += self._size - self._pos
                self._pending = self._pos = base + local
                self._string = text[local] == '"'
                self._scan = self._pending + (1 if self._string else 0)
                self._tail = text[self._scan - base:]
                continue
            self.work += base + m.end() - self._pos
            self._pending = -1
            self._pos = base + m.end()
            self._token(kind, m)

    def _trim(self) -> None:
        """Drop the decided text from the window."""
        cut = self._pending if self._pending >= 0 else self._pos
        if cut > self._offset:
            self._window = self._window[cut - self._offset:]
            self._offset = cut

    def _ends(self, final: bool) -> bool:
        """Whether the pending token's end is in the text (or ``final``); if so, the
        held text joins the window."""
        tail = self._tail
        if self._string:
            found = _STRING_UNITS.match(tail)
            assert found is not None
            end = found.end()
            rest = tail[end:]
            if not final and (not rest or (rest == '"') or
                              (rest[0] == "\\" and _PARTIAL_ESCAPE.match(rest))):
                self.work += end
                self._scan += end
                self._tail = rest
                return False
        else:
            run = _RUN_END.search(tail)
            if run is None and not final:
                self.work += len(tail)
                self._scan += len(tail)
                self._tail = ""
                return False
        self._window += "".join(self._held)
        self._held = []
        self._tail = ""
        self._pending = -1
        return True

    # ------------------------------------------------------------------ errors, at indexes
    # into the whole text (the reader's refusals are raised again on it: pure functions of
    # the text and the index, they raise the error :func:`cbcl.parse` raises).

    def _fail(self, index: int, message: str, *, expected: tuple[str, ...] = (),
              error: type[MalformedError] = MalformedError) -> NoReturn:
        fail(self._full(), index, message, expected=expected, error=error)

    def _limit(self, index: int, name: str) -> NoReturn:
        limit(self._full(), index, self.limits, name)

    def _diagnose(self, index: int) -> NoReturn:
        diagnose(self._full(), index)

    def _atom(self, m: re.Match[str]) -> Value:
        """The atom of the decided token ``m`` (in the window), read by the reader with
        its limits (the document's depth and nodes so far; nodes counted)."""
        local = token_start(m)
        try:
            value, _, nodes = read_value_python(self._window, local, self.limits,
                                                self._depth, self._nodes)
        except CBCLError:
            read_value_python(self._full(), self._offset + local, self.limits, self._depth,
                              self._nodes)
            raise  # pragma: no cover - the whole text raises where the window did
        self._nodes = nodes
        return value

    def _at(self, index: int) -> tuple[Position, str]:
        full = self._full()
        return position_of(full, index), context_of(full, index)

    # ------------------------------------------------------------------ tokens

    def _token(self, kind: int, m: re.Match[str]) -> None:
        self.tokens += 1
        try:
            if self._mode == _BODY or self._body_only:
                self._body_token(kind, m)
            else:
                self._envelope_token(kind, m)
        except _Refusal:
            raise
        except CBCLError as error:  # the reader's refusals: a malformed token, a limit
            index = self._offset + token_start(m)
            if error.position is not None and error.position.line:
                index = _index_of(self._full(), error.position)
            raise _Refusal(error, index) from None

    def _envelope_token(self, kind: int, m: re.Match[str]) -> None:
        """One token of the envelope, as pass 1's scan_envelope takes it."""
        tables = envelope_tables()
        stack = self._stack
        start = self._offset + token_start(m)
        if self._mode == _ENVELOPE and "VALUE" in tables.actions[stack[-1]] and \
                kind not in (RPAR, EOF, BAD):
            self._begin_body(start)
            self._body_token(kind, m)
            return
        value: object = None
        if kind == LPAR:
            terminal = "LPAR"
            self._depth += 1
            self._nodes += 1
            if self._depth > self.limits.max_depth:
                self._limit(start, "max_depth")
        elif kind == RPAR:
            terminal = "RPAR"
            self._depth -= 1
        elif kind == EOF:
            if self._depth:
                self._fail(start, f"{self._depth} unclosed list(s) at the end of the input",
                           expected=("')'",))
            terminal = END
        elif kind == BAD:
            self._diagnose(self._offset + m.start(BAD))
        else:
            value = self._atom(m)
            terminal = ATOM_TERMINALS[type(value)]
            if terminal == "SYMBOL":
                terminal = terminal_of(tables, stack, LITERALS.get(value), terminal)  # type: ignore[call-overload]
            elif terminal == "STRING" and value == "" and self._previous in _FIELD_ID:
                self._fail(start, f"{_FIELD_ID[self._previous]} must not be empty",
                           error=EnvelopeError)
        self._previous = terminal
        self._count_item(terminal, start)
        self.steps += 1
        done = feed(tables, stack, terminal)
        if done == REFUSED:
            try:
                _envelope_refusal(self._full(), start, tables, stack, terminal, value)
            except CBCLError as error:
                raise _Refusal(error, start) from None
        if terminal == "RPAR" and self._depth == 0:
            self._complete = True
        self._envelope_accepted(terminal, value, start)

    def _count_item(self, terminal: str, start: int) -> None:
        """scan_envelope's count of the elements of the envelope's lists."""
        items = self._items
        if terminal == "RPAR":
            items.pop()
        elif terminal != END:
            items[-1] += 1
            if items[-1] > self.limits.max_list_items and len(items) > 1:
                self._limit(start, "max_list_items")
            if terminal == "LPAR":
                items.append(0)

    def _envelope_accepted(self, terminal: str, value: object, start: int) -> None:
        """What pass 2 learns from an envelope token the envelope's tables took."""
        intent = _INTENT_TERMINALS.get(terminal)
        if intent is not None:
            self._message_intent = intent
            if self.intent is not None and intent is not self.intent:
                self._envelope_error(f"expected intent {self.intent.value}, found "
                                     f"{intent.value}", start, (self.intent.value,),
                                     f"symbol {intent.value}")
        elif terminal == "SYMBOL":  # the protocol (the only SYMBOL the envelope admits)
            protocol = self.registry.get(value)  # type: ignore[arg-type]
            if protocol is None:
                position, context = self._at(start)
                raise _Refusal(UnknownProtocolError(
                    f"unknown protocol {value}: no descriptor for it is loaded",
                    protocol=str(value), position=position, context=context), start)
            if self.protocol is not None and protocol is not self.protocol:
                self._envelope_error(f"expected protocol {self.protocol.id}, found {value}",
                                     start, (str(self.protocol.id),), f"symbol {value}")
            assert self._message_intent is not None
            self._require_governed(protocol, self._message_intent, start)
            self._body_protocol = protocol
        elif terminal in ("SIGNATURE", END) or (terminal == "RPAR" and self._complete):
            protocol = self._body_protocol
            intent = self._message_intent
            if not self._body_seen and protocol is not None and intent is not None and \
                    intent in protocol.governed:
                error = BodyError(f"{protocol.descriptor.id} requires a body for "
                                  f"{intent.value}")
                error.hint_material = body_hint(protocol, (), END, None, None, intent.value,
                                                (), False)
                raise _Refusal(error, start)

    def _envelope_error(self, message: str, start: int, expected: tuple[str, ...],
                        found: str) -> NoReturn:
        position, context = self._at(start)
        error = EnvelopeError(message, position=position, context=context, expected=expected)
        error.hint_material = EnvelopeHint(found)
        raise _Refusal(error, start)

    def _require_governed(self, protocol: Protocol, intent: Intent, start: int) -> None:
        """Refuse an intent ``protocol`` neither governs nor admits (pass 2's check)."""
        if intent not in protocol.governed and intent not in _ALWAYS_ADMITTED:
            descriptor = protocol.descriptor
            governed = " ".join(i.value for i in descriptor.intents)
            error = ProtocolError(f"{descriptor.id} does not govern {intent.value} messages "
                                  f"(it governs {governed})")
            raise _Refusal(error, start)

    # ------------------------------------------------------------------ the body

    def _begin_body(self, start: int) -> None:
        """The envelope's ``(body`` is followed by the body's first token at ``start``."""
        protocol = self._body_protocol
        intent = self._message_intent
        assert protocol is not None and intent is not None
        self._body_seen = True
        self._start_body(protocol, intent, start)

    def _start_body(self, protocol: Protocol, intent: Intent, start: int) -> None:
        self._mode = _BODY
        self._body_protocol = protocol
        self._body_intent = intent
        self._free = intent not in protocol.governed  # an admitted NOT-UNDERSTOOD or CANCEL
        self._body_start = start
        if self._free:
            return
        stack = start_stack(protocol, intent)
        if not stack:  # pragma: no cover - the descriptor gives every governed intent a rule
            raise _Refusal(BodyError(f"the {protocol.id} grammar has no rule for "
                                     f"{intent.value} bodies"), start)
        self._body_stack = stack
        self._marks = {}
        self._whole = value_states(protocol.tables)
        self._heads = []
        self._body_items = []
        self._opaque = 0

    def _body_token(self, kind: int, m: re.Match[str]) -> None:
        """One token of the body: the reader's limits and refusals, then the grammar."""
        limits = self.limits
        start = self._offset + token_start(m)
        lists = self._body_items
        if kind == EOF:
            if self._mode == _DONE:
                return  # (body mode: the end after the one value)
            if not lists:
                self._fail(start, "expected a value, found the end of the input",
                           expected=("a value",))
            self._fail(start, f"{self._depth} unclosed list(s) at the end of the input",
                       expected=("')'",))
        if kind == BAD:
            self._diagnose(self._offset + m.start(BAD))
        if self._mode == _DONE:  # (body mode: the one value has been read)
            self._fail(start, "unexpected data after the end of the document",
                       expected=("the end of the input",))
        if self._free and (lists or kind != STRING):
            protocol = self._body_protocol
            assert protocol is not None
            raise _Refusal(BodyError(
                f"a {self._body_intent.value} body that {protocol.descriptor.id} does not "
                "govern must be absent or a reason string"), start)
        value: Value | None = None
        if kind == RPAR:
            if not lists:
                self._fail(start, "unexpected ')'", expected=("a value",))
            self._depth -= 1
            self._grammar("RPAR", None, start)
            lists.pop()
            self._heads.pop()
        elif kind == LPAR:
            self._nodes += 1
            if self._nodes > limits.max_nodes:
                self._limit(start, "max_nodes")
            self._depth += 1
            if self._depth > limits.max_depth:
                self._limit(start, "max_depth")
            if lists:
                if lists[-1] >= limits.max_list_items:
                    self._limit(start, "max_list_items")
                lists[-1] += 1
                if self._heads[-1] is UNREAD:
                    self._heads[-1] = None
            self._grammar("LPAR", None, start)
            lists.append(0)
            self._heads.append(UNREAD)
        else:
            value = self._atom(m)
            if lists and lists[-1] >= limits.max_list_items:
                self._limit(start, "max_list_items")
            self._grammar(ATOM_TERMINALS[type(value)], value, start)
            if lists:
                lists[-1] += 1
                if self._heads[-1] is UNREAD:
                    self._heads[-1] = value
        if not lists:
            self._end_body(self._offset + m.end())

    def _grammar(self, terminal: str, value: object, start: int) -> None:
        """Feed one body token to the protocol's tables (``value``: the atom's)."""
        if self._free:
            return
        protocol = self._body_protocol
        assert protocol is not None
        tables = protocol.tables
        stack = self._body_stack
        if self._opaque:  # inside a list read whole
            self._opaque += 1 if terminal == "LPAR" else -1 if terminal == "RPAR" else 0
            if not self._opaque:
                take_value(tables, stack)
            return
        if type(value) is Symbol or type(value) is Keyword:
            terminal = terminal_of(tables, stack, protocol.atoms.get(value), terminal)
        self.steps += 1
        done = feed(tables, stack, terminal, whole=self._whole, marks=self._marks)
        if done == WHOLE:
            self._opaque = 1
        elif done == REFUSED:
            self._body_refused(terminal, value, start)

    def _body_refused(self, terminal: str, value: object, start: int) -> NoReturn:
        protocol = self._body_protocol
        intent = self._body_intent
        assert protocol is not None
        stack = self._body_stack
        message, expected = body_refusal(protocol, stack, terminal, value, self._marks,
                                         intent.value)
        heads = list(self._heads)
        at_head = terminal not in ("LPAR", "RPAR", END) and bool(heads) and \
            heads[-1] is UNREAD
        position, context = self._at(start)
        error = BodyError(message, position=position, context=context, expected=expected)
        error.hint_material = body_hint(protocol, stack, terminal, value, self._marks,
                                        intent.value, heads, at_head)
        raise _Refusal(error, start)

    def _end_body(self, end: int) -> None:
        """The body's value is complete (it ends at character ``end``): its grammar's
        ``$END``, then (a message) the envelope's ``VALUE``."""
        self._mode = _DONE
        if not self._free:
            protocol = self._body_protocol
            assert protocol is not None
            self.steps += 1
            if feed(protocol.tables, self._body_stack, END, marks=self._marks) != ACCEPTED:
                self._body_refused(END, None, end)
        if self._body_only:
            self._complete = True
            return
        self._previous = "VALUE"
        self._count_item("VALUE", self._body_start)
        self.steps += 1
        if feed(envelope_tables(), self._stack, "VALUE") == REFUSED:  # pragma: no cover
            raise AssertionError("the envelope refused the body it expected")


def _index_of(text: str, position: Position) -> int:
    """The character index of ``position`` (line and column) in ``text``."""
    line_start = 0
    for _ in range(position.line - 1):
        line_start = text.index("\n", line_start) + 1
    return line_start + position.column - 1
