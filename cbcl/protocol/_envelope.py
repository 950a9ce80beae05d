"""Pass 1: recognise the CBCL/1.0 envelope (draft §2) and capture the body unjudged.

Theory of operation
-------------------
The envelope grammar (``cbcl/grammars/envelope.lark``) is compiled once by lark into LALR(1)
tables with ``strict=True``; :func:`parse_envelope` drives those tables itself, fed by the
CBCL reader's token expression, so the text is scanned once and no lark token or tree is
built. Three decisions happen in the lexer, each by asking the tables:

* a symbol such as ``sender`` or ``PROPOSE`` becomes the grammar literal of that name only
  where the parser can shift that literal (:meth:`Tables.can_shift`); elsewhere it is a
  ``SYMBOL`` (so ``(protocol sender)`` names a protocol called ``sender``);
* where the parser expects ``VALUE`` (after ``body``), the reader captures one whole value,
  under the same limits, as a single token;
* any other atom is read by the reader and given its kind's terminal.

When the tables hold no action for a token the input is refused with an
:class:`EnvelopeError` at that token, listing what was expected in CBCL terms.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any, NoReturn

from ..core._errors import CBCLError, EnvelopeError
from ..core._limits import Limits
from ..core._reader import (
    BAD,
    EOF,
    LPAR,
    RPAR,
    TOKEN,
    context_of,
    diagnose,
    fail,
    intern_symbol,
    limit,
    only_space_after,
    position_of,
    read_value_at,
    token_start,
)
from ..core._values import ATOM_TERMINALS, URI, Keyword, Symbol
from ..grammar._kernel import ACCEPTED, REFUSED, feed, terminal_of
from ..grammar._lalr import Rule, Tables, build_lark
from . import _envelope_tables
from ._hints import EnvelopeHint
from ._message import TRACE_REFUSAL, VERSION, Intent, Message, Signature, is_traceparent

# Literal terminals of the envelope grammar, by the symbol that spells them.
FIELD_TERMINALS = {
    "message-id": "MESSAGE_ID", "sender": "SENDER", "receiver": "RECEIVER",
    "intent": "INTENT", "protocol": "PROTOCOL", "conversation-id": "CONVERSATION_ID",
    "in-reply-to": "IN_REPLY_TO", "reply-by": "REPLY_BY", "timestamp": "TIMESTAMP",
    "trace": "TRACE", "body": "BODY", "signature": "SIGNATURE",
}
INTENT_TERMINALS = {intent.value: intent.name for intent in Intent}
# Keyed by Symbol: a Symbol equals only Symbols, so plain str keys would never match.
LITERALS = {Symbol(text): terminal for text, terminal in
            {"CBCL/1.0": "VERSION", **FIELD_TERMINALS, **INTENT_TERMINALS}.items()}


# How an expected terminal is named in an error message.
_SHOWN = {
    "LPAR": "'('", "RPAR": "')'", "STRING": "a string", "URI": "a URI",
    "SYMBOL": "a symbol", "INTEGER": "an integer", "VALUE": "a value",
    "$END": "the end of the input", "VERSION": "CBCL/1.0",
    **{terminal: name for name, terminal in FIELD_TERMINALS.items()},
    **{terminal: name for name, terminal in INTENT_TERMINALS.items()},
}


@functools.cache
def envelope_tables() -> Tables:
    """The envelope grammar's LALR(1) tables, as shipped (generated from the grammar by
    tools/generate_envelope_tables.py): read on first use, in well under a millisecond,
    so the first refusal in a process costs what any other does."""
    return Tables(tuple(dict(row) for row in _envelope_tables.ACTIONS),
                  tuple(Rule(origin, size, alias)
                        for origin, size, alias in _envelope_tables.RULES),
                  _envelope_tables.START_STATE, _envelope_tables.END_STATE)


def build_envelope_tables() -> Tables:
    """The envelope grammar's tables built by lark from ``cbcl/grammars/envelope.lark``
    (~0.3 s; lark's state numbers vary between processes): what the shipped tables are
    generated from and checked against."""
    text = resources.files("cbcl.grammars").joinpath("envelope.lark").read_text("utf-8")
    return Tables.from_lark(build_lark(text))


_FIELD_NAMES = {terminal: name for name, terminal in FIELD_TERMINALS.items()}


def _describe(terminal: str, value: object) -> str:
    if terminal in ("LPAR", "RPAR", "$END"):
        return _SHOWN[terminal]
    if terminal == "STRING":
        return "a string"
    if terminal == "VALUE":
        return "a value"
    kind = ATOM_TERMINALS.get(type(value), "value").lower()
    text = (":" + str(value)) if type(value) is Keyword else str(value)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{kind} {text}"


def _expected(tables: Tables, stack: list[int]) -> tuple[str, ...]:
    row = tables.actions[stack[-1]]
    after_lpar = tables.shift_target(stack, "LPAR")
    fields = [t for t in tables.actions[after_lpar] if t in _FIELD_NAMES] \
        if after_lpar is not None else []
    shown = [f"({_FIELD_NAMES[t]} …)" if t in _FIELD_NAMES else _SHOWN.get(t, t)
             for t in (fields or row) if t.isupper() or t == "$END"]
    if fields and "RPAR" in row:
        shown.append("')'")
    intents = [s for s in shown if s in INTENT_TERMINALS]
    if len(intents) > 3:
        shown = [s for s in shown if s not in INTENT_TERMINALS] + ["an intent"]
    return tuple(sorted(set(shown), key=lambda item: _ORDER.get(item, len(_ORDER))))


# Expected items are listed in the envelope's own order.
_ORDER: dict[str | None, int] = {
    shown: index for index, shown in enumerate(
        ["CBCL/1.0", *(f"({name} …)" for name in FIELD_TERMINALS), *_SHOWN.values(),
         "an intent"])
}


def _refuse(text: str, index: int, tables: Tables, stack: list[int], terminal: str,
            value: object) -> NoReturn:
    expected = _expected(tables, stack)
    found = _describe(terminal, value)
    message = f"expected {' or '.join(expected)}, found {found}"
    if "CBCL/1.0" in expected and type(value) is Symbol and value.startswith("CBCL/"):
        message = f"unsupported version {value}: this engine speaks CBCL/1.0"
    elif "an intent" in expected and type(value) is Symbol:
        message = (f"unknown intent {value}; the intents are "
                   f"{', '.join(INTENT_TERMINALS)}")
    elif terminal == "SYMBOL" and str(value) in FIELD_TERMINALS:
        if "LPAR" in tables.actions[stack[-1]]:
            message = f"field {value} must be written in parentheses: ({value} …)"
        else:
            message += (f" (field {value} is out of order or repeated, or a required field "
                        "before it is missing)")
    error = EnvelopeError(message, position=position_of(text, index),
                          context=context_of(text, index), expected=expected)
    error.hint_material = EnvelopeHint(found)
    raise error


_ID_FIELDS = {"MESSAGE_ID": "message-id", "CONVERSATION_ID": "conversation-id",
              "IN_REPLY_TO": "in-reply-to"}


@dataclass(frozen=True, slots=True)
class Envelope:
    """The result of pass 1: the message, and where in the text its protocol symbol and
    its body start (character indexes; ``body_at`` is -1 without a body)."""

    message: Message
    protocol_at: int
    body_at: int


def parse_envelope(text: str, limits: Limits, utf8: bytes | None = None) -> Message:
    """Recognise the envelope of the decoded document ``text`` and build its
    :class:`Message` (body captured, not judged). ``utf8``: the bytes ``text`` was decoded
    from, if the caller has them (:func:`cbcl.core._reader.read_value_at`).

    The fast path reads the whole document as one value and feeds its structure to the
    tables; only when that fails does :func:`scan_envelope` re-scan token by token, with
    positions, to raise the precise error.

    Raises :class:`EnvelopeError` (a :class:`MalformedError`) for a document that is not a
    CBCL/1.0 envelope, :class:`MalformedError` for malformed text and :class:`LimitError`.
    """
    try:
        value, end, _ = read_value_at(text, 0, limits, 0, 0, utf8)
    except CBCLError:
        value = None  # the scan below raises the same error (or an envelope error first)
    else:
        if only_space_after(text, end):
            message = message_of(value)
            if message is not None:
                return message
    return scan_envelope(text, limits).message


def message_of_python(value: Any) -> Message | None:
    """The :class:`Message` whose value is ``value`` (a whole document), or ``None`` if the
    envelope grammar refuses it: :func:`_walk`, then ``Message._trusted`` (every field
    checked by the walk and the reader). The reference of ``cbcl._native.envelope``."""
    fields = _walk(value)
    return None if fields is None else Message._trusted(**fields)


def _reducer(values: list[Any]) -> Callable[[Rule], None]:
    """The kernel's ``reduce`` callback: replace a rule's children on ``values`` with what
    :data:`_REDUCERS` makes of them."""

    def reduce(rule: Rule) -> None:
        size = rule.size
        children = values[len(values) - size :]
        del values[len(values) - size :]
        values.append(_REDUCERS[rule.origin](children))

    return reduce


# The fields of the envelope in grammar order: (position, Message attribute, what it holds).
_ID, _URI, _INTENT, _SYMBOL, _INT, _VALUE, _SIGNATURE, _TRACE = range(8)
_FIELDS: dict[str, tuple[int, str, int]] = {
    name: (index, name.replace("-", "_"), kind) for index, (name, kind) in enumerate((
        ("message-id", _ID), ("sender", _URI), ("receiver", _URI), ("intent", _INTENT),
        ("protocol", _SYMBOL), ("conversation-id", _ID), ("in-reply-to", _ID),
        ("reply-by", _INT), ("timestamp", _INT), ("trace", _TRACE), ("body", _VALUE),
        ("signature", _SIGNATURE)))
}
_REQUIRED = 5  # message-id … protocol
_INTENTS = {intent.value: intent for intent in Intent}


def _walk(value: Any) -> dict[str, Any] | None:
    """The fields of the message whose value is ``value``, or ``None`` if the envelope
    grammar refuses it (the caller then re-scans, with the tables, to say where and why).

    This is the grammar written out as a check of the value's structure: it accepts
    exactly what the tables accept (a field name is a literal only in its own place, so
    a field is known by its first symbol; an intent is a literal only after ``intent``;
    the protocol is any symbol) and builds the same fields as :data:`_REDUCERS`."""
    if type(value) is not tuple or len(value) < 1 + _REQUIRED:
        return None
    head = value[0]
    if type(head) is not Symbol or str.__ne__(head, VERSION):
        return None
    fields: dict[str, Any] = {}
    expected = 0
    for index in range(1, len(value)):
        field = value[index]
        if type(field) is not tuple or len(field) < 2 or type(field[0]) is not Symbol:
            return None
        spec = _FIELDS.get(str.__str__(field[0]))
        if spec is None:
            return None
        order, key, kind = spec
        if order < expected or (order != expected and expected < _REQUIRED):
            return None
        expected = order + 1
        item = field[1]
        if kind == _SIGNATURE:
            if len(field) != 3 or type(item) is not str or type(field[2]) is not str:
                return None
            fields[key] = Signature(item, field[2])
            continue
        if len(field) != 2:
            return None
        if kind == _ID:
            if type(item) is not str or not item:
                return None
        elif kind == _URI:
            if type(item) is not URI:
                return None
        elif kind == _INTENT:
            if type(item) is not Symbol:
                return None
            item = _INTENTS.get(str.__str__(item))
            if item is None:
                return None
        elif kind == _SYMBOL:
            if type(item) is not Symbol:
                return None
        elif kind == _INT:
            if type(item) is not int:
                return None
        elif kind == _TRACE and not is_traceparent(item):
            return None
        fields[key] = item
    if expected < _REQUIRED:
        return None
    return fields



def scan_envelope(text: str, limits: Limits) -> Envelope:
    """Recognise the envelope token by token, keeping positions: the slow path, used to
    raise precise errors and to locate the protocol and the body in the text.

    Raises as :func:`parse_envelope`.
    """
    tables = envelope_tables()
    actions = tables.actions
    max_depth = limits.max_depth
    max_items = limits.max_list_items
    stack = [tables.start_state]
    values: list[Any] = []
    reduce = _reducer(values)
    items = [0]  # elements seen in each open list (the outermost counts the document)
    pos = 0
    depth = 0
    nodes = 0
    previous = ""
    protocol_at = body_at = -1
    while True:
        m = TOKEN.match(text, pos)
        assert m is not None
        kind = m.lastindex
        assert kind is not None
        start = token_start(m)
        value: object = None
        if "VALUE" in actions[stack[-1]] and kind != RPAR and kind != EOF and kind != BAD:
            terminal = "VALUE"
            body_at = start
            value, pos, nodes = read_value_at(text, pos, limits, depth, nodes)
        elif kind == LPAR:
            terminal = "LPAR"
            depth += 1
            nodes += 1
            if depth > max_depth:
                limit(text, start, limits, "max_depth")
            pos = m.end()
        elif kind == RPAR:
            terminal = "RPAR"
            depth -= 1
            pos = m.end()
        elif kind == EOF:
            if depth:
                fail(text, start, f"{depth} unclosed list(s) at the end of the input",
                     expected=("')'",))
            terminal = "$END"
        elif kind == BAD:
            diagnose(text, start)
        else:
            value, pos, nodes = read_value_at(text, pos, limits, depth, nodes)
            terminal = ATOM_TERMINALS[type(value)]
            if terminal == "SYMBOL":
                terminal = terminal_of(tables, stack, LITERALS.get(value),  # type: ignore[call-overload]
                                       terminal)
                if terminal == "SYMBOL":
                    protocol_at = start  # the only SYMBOL the envelope admits
            elif terminal == "STRING" and value == "" and previous in _ID_FIELDS:
                fail(text, start, f"{_ID_FIELDS[previous]} must not be empty",
                     error=EnvelopeError)
            elif terminal == "STRING" and previous == "TRACE" and not is_traceparent(value):
                fail(text, start, TRACE_REFUSAL, error=EnvelopeError)
        previous = terminal
        if terminal == "RPAR":
            items.pop()
        elif terminal != "$END":
            items[-1] += 1
            if items[-1] > max_items and len(items) > 1:
                limit(text, start, limits, "max_list_items")
            if terminal == "LPAR":
                items.append(0)
        done = feed(tables, stack, terminal, reduce=reduce)
        if done == REFUSED:
            _refuse(text, start, tables, stack, terminal, value)
        if done == ACCEPTED:
            return Envelope(Message(**values[-1]), protocol_at, body_at)
        values.append(value)


def _field(name: str) -> Any:
    return lambda children: (name, children[2])


def _start(children: list[Any]) -> dict[str, Any]:
    return dict(child for child in children if type(child) is tuple)


_REDUCERS: dict[str, Any] = {
    "start": _start,
    "message_id": _field("message_id"),
    "sender": _field("sender"),
    "receiver": _field("receiver"),
    "intent": _field("intent"),
    "protocol": _field("protocol"),
    "conversation_id": _field("conversation_id"),
    "in_reply_to": _field("in_reply_to"),
    "reply_by": _field("reply_by"),
    "timestamp": _field("timestamp"),
    "trace": _field("trace"),
    "body": _field("body"),
    "signature": lambda children: ("signature", Signature(children[2], children[3])),
    "intent_name": lambda children: Intent(str.__str__(children[0])),
}


# The tables of the C twin of message_of_python (cbcl._native.envelope): keyed by the
# pinned interned symbols, which the reader returns, so each lookup is one identity check.
_C_FIELDS = {intern_symbol(name, pin=True): (order, kind)
             for name, (order, _, kind) in _FIELDS.items()}
_C_INTENTS = {intern_symbol(name, pin=True): intent for name, intent in _INTENTS.items()}
_C_ATTRIBUTES = tuple(key for _, key, _ in sorted(_FIELDS.values()))
_C_VERSION = intern_symbol(VERSION, pin=True)

#: cbcl._native.envelope's arguments after the value.
ENVELOPE_TABLES = (_C_VERSION, _C_FIELDS, _C_INTENTS, Signature, Message, _C_ATTRIBUTES,
                   URI, Symbol)

try:
    from .._native import envelope as _speedups_envelope
except ImportError:  # not built: the Python walk runs
    message_of: Callable[[Any], Message | None] = message_of_python
else:
    def message_of(value: Any) -> Message | None:
        """:func:`message_of_python` by its C twin, ``cbcl._native.envelope``."""
        message: Message | None = _speedups_envelope(value, *ENVELOPE_TABLES)
        return message
