"""The canonical form (draft §1.2): the unique text of a value.

Printing is iterative: values up to ``MAX_VALUE_DEPTH`` lists deep print without recursion,
and a deeper one (or a list that contains itself) is refused with a ``LimitError``. Values
are validated as they are printed: text that is printed is text that reads back as the
same value. What is not of an exact CBCL type is read as data (``data_of``: a subclass
through its base type, an enum member as its value), never through its own methods.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

from ._errors import LimitError, MalformedError
from ._limits import limit_message
from ._values import (
    INT64_MAX,
    INT64_MIN,
    ITEM_ITERATORS,
    MAX_DECIMAL_CHARS,
    MAX_VALUE_DEPTH,
    URI,
    Keyword,
    Symbol,
    ValueInput,
    data_of,
)
from ._vocabulary import (
    CODE_DECIMAL,
    CODE_INTEGER,
    CODE_KEYWORD,
    CODE_LPAR,
    CODE_RPAR,
    CODE_SYMBOL,
    CODE_URI,
    FIRST_ENTRY,
)

# The optional C twins of the encoders (cbcl/_native_src/encoders.c): canonical_value below, the
# message's canonical() and the binary frame writer of cbcl.binary._codec.Encoder try them first;
# None where it is not built. (decimal_layout: whether it reads _decimal's own layout.)
decimal_layout = False
try:
    from .. import _native
except ImportError:  # pragma: no cover - built wherever a C compiler exists
    _native = None  # type: ignore[assignment]
else:
    if not all(hasattr(_native, name) for name in (
            "canonical", "canonical_message", "pack_frame", "pack_message", "encode_message",
            "prepare", "setup_message", "setup_frame")):
        raise ImportError("cbcl._native is a stale build (rebuild the extension)")
    decimal_layout = _native.setup(Symbol, Keyword, URI, Decimal, MAX_DECIMAL_CHARS,
                                   (CODE_LPAR, CODE_RPAR, CODE_INTEGER, CODE_DECIMAL,
                                    CODE_SYMBOL, CODE_KEYWORD, CODE_URI, FIRST_ENTRY))
native = _native

# Characters a canonical string escapes; lone surrogates are matched so they can be refused.
_NEEDS_ESCAPE = re.compile('["\\\\\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]')
_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match[str]) -> str:
    ch = m.group()
    short = _SHORT_ESCAPES.get(ch)
    if short is not None:
        return short
    if "\ud800" <= ch <= "\udfff":
        raise ValueError(f"a string holds a lone surrogate U+{ord(ch):04X}, not UTF-8 text")
    return f"\\u{ord(ch):04x}"


def quote(text: str) -> str:
    """The canonical text of a STRING value (a ``str`` subclass: its characters, read
    through ``str``). Raises ``ValueError`` for a lone surrogate."""
    if type(text) is not str:
        text = str.__str__(text)
    if _NEEDS_ESCAPE.search(text) is None:
        return f'"{text}"'
    return '"' + _NEEDS_ESCAPE.sub(_escape, text) + '"'


def _integer(value: int) -> str:
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(f"integer {value} is outside the signed 64-bit range")
    return str(value)


def _decimal(value: Decimal) -> str:
    """The plain positional text of a finite decimal, with at least one fractional digit.

    No arithmetic, so no :mod:`decimal` context is involved (its precision would refuse
    ``Decimal("1e27")``): the length of the text is computed from the digits and exponent
    first, so a value like ``Decimal("1e-999999999")`` is refused without being written out.
    Raises :class:`MalformedError` (a ``ValueError``) for a non-finite decimal or one whose
    text would exceed ``MAX_DECIMAL_CHARS``."""
    if not value.is_finite():
        raise MalformedError(f"CBCL has no {value} decimal")
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)  # finite
    if exponent >= 0:  # an integral value: 5 prints as 5.0, still a DECIMAL
        size = sign + (1 if digits == (0,) else len(digits) + exponent) + 2
    else:  # the whole part (at least "0"), the point, -exponent fractional digits
        size = sign + max(len(digits) + exponent, 1) + 1 - exponent
    if size > MAX_DECIMAL_CHARS:
        shown = str(value)
        if len(shown) > 60:
            shown = f"{shown[:30]}…{shown[-20:]}"
        raise MalformedError(f"decimal {shown} is longer than {MAX_DECIMAL_CHARS} characters "
                             f"in positional notation ({size})")
    text = format(value, "f")  # exact: no precision given, so no rounding
    return text + ".0" if exponent >= 0 else text


# Each writer takes only its key's type (a table mypy cannot type; the ignores say so).
_ATOM_TEXT: dict[type, Callable[[object], str]] = {
    str: quote,  # type: ignore[dict-item]
    Symbol: str.__str__,
    URI: str.__str__,
    Keyword: lambda k: ":" + str.__str__(k),
    int: _integer,  # type: ignore[dict-item]
    Decimal: _decimal,  # type: ignore[dict-item]
}


def too_deep(maximum: int = MAX_VALUE_DEPTH) -> LimitError:
    """The error of a value nested more than ``maximum`` lists deep, as every writer and
    converter raises it (a list that contains itself is one: it is endlessly deep)."""
    return LimitError(f"{limit_message('max_depth', maximum)} (or a list that contains "
                      "itself)", limit="max_depth", maximum=maximum)


def canonical_value(value: ValueInput) -> str:
    """The canonical text of ``value``.

    Raises ``TypeError`` for something that is not a CBCL value (``bool``, ``None``,
    ``float``, ``dict`` …), ``ValueError`` for a value out of CBCL's range (an integer
    outside int64, a non-finite or over-long decimal, a string with a lone surrogate), and
    :class:`LimitError` (a ``ValueError``) for lists nested more than ``MAX_VALUE_DEPTH``
    deep or a list that contains itself. Lists may be tuples or Python lists; anything not
    of an exact CBCL type is read as data (see :func:`cbcl.core._values.data_of`).
    """
    if native is not None:
        text = native.canonical(value)  # None: declined, the Python twin writes or raises
        if text is not None:
            return text
    return canonical_value_python(value)


def canonical_value_python(value: ValueInput, around: int = 0) -> str:
    """:func:`canonical_value` in Python: the reference (and the fallback) of its C twin
    ``cbcl._native.canonical``, which gives the same text or declines (anything not of an
    exact type, or deeper than its stack bound, ``MAX_VALUE_DEPTH``). ``around``: the
    outer lists that do not count towards ``MAX_VALUE_DEPTH`` (a message's text: 2, the
    envelope and a field's list, so its body may be as deep as any value)."""
    kind = type(value)
    if kind is tuple or kind is list:
        items: Iterator[ValueInput] = iter(value)  # type: ignore[arg-type]
    else:
        plain = data_of(value)
        if type(plain) not in ITEM_ITERATORS:
            return _ATOM_TEXT[type(plain)](plain)
        items = plain  # type: ignore[assignment]  # (an iterator: ITEM_ITERATORS)
    # Post-order without recursion: each open list gathers its items' texts, and is
    # joined when it ends (str.join takes Symbols and URIs as they are: they are strs).
    # The stack holds the enclosing lists' frames: the open list is len(stack) + 1 deep.
    search = _NEEDS_ESCAPE.search
    parts: list[str] = []
    stack: list[tuple[Iterator[ValueInput], list[str]]] = []
    deepest = MAX_VALUE_DEPTH + around - 1  # the most frames an open list may have around it
    # The branches dispatch on ``kind``, by which mypy does not narrow ``item``; the ignores
    # below stand for that narrowing (a cast would cost a call per atom on this hot path).
    while True:
        for item in items:
            kind = type(item)
            if kind is Symbol or kind is URI:
                parts.append(item)  # type: ignore[arg-type]
            elif kind is str:
                parts.append(f'"{item}"' if search(item) is None  # type: ignore[arg-type]
                             else quote(item))  # type: ignore[arg-type]
            elif kind is Keyword:
                parts.append(":" + item)  # type: ignore[operator]
            elif kind is int:
                if not INT64_MIN <= item <= INT64_MAX:  # type: ignore[operator]
                    _integer(item)  # type: ignore[arg-type]  # raises
                parts.append(str(item))
            elif kind is tuple or kind is list:
                if len(stack) >= deepest:
                    raise too_deep()
                stack.append((items, parts))
                items = iter(item)  # type: ignore[arg-type]
                parts = []
                break
            elif kind is Decimal:
                parts.append(_decimal(item))  # type: ignore[arg-type]
            else:  # not of an exact type: read as data
                inner = data_of(item)
                if type(inner) not in ITEM_ITERATORS:
                    parts.append(_ATOM_TEXT[type(inner)](inner))
                    continue
                if len(stack) >= deepest:
                    raise too_deep()
                stack.append((items, parts))
                items = inner  # type: ignore[assignment]  # (an iterator)
                parts = []
                break
        else:  # the list ends
            text = "(" + " ".join(parts) + ")"
            if not stack:
                return text
            items, parts = stack.pop()
            parts.append(text)


def canonical_prefix(value: ValueInput, width: int) -> str:
    """The first ``width`` characters of ``canonical_value(value)`` (all of it if shorter),
    written without the rest: for showing a value in a message. It stops after ``width``
    characters, so a value of any depth, or a list that contains itself, is shown without
    a ``LimitError``. Raises as :func:`canonical_value` for an atom within the prefix."""
    out: list[str] = []
    size = 0
    # Pre-order: each open list's iterator and whether an item of it has been written.
    stack: list[list[Any]] = [[iter((value,)), False]]
    while stack and size <= width:
        frame = stack[-1]
        item = next(frame[0], _END)
        if item is _END:
            stack.pop()
            if stack:
                out.append(")")
                size += 1
            continue
        if frame[1]:
            out.append(" ")
            size += 1
        frame[1] = True
        kind = type(item)
        plain = iter(item) if kind is tuple or kind is list else data_of(item)  # type: ignore[call-overload]  # (a list: kind)
        if type(plain) in ITEM_ITERATORS:
            out.append("(")
            size += 1
            stack.append([plain, False])
        else:
            text = _ATOM_TEXT[type(plain)](plain)
            out.append(text)
            size += len(text)
    return "".join(out)[:width]


_END = object()
