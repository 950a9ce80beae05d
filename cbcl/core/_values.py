"""The CBCL value model (draft §1).

A CBCL value is one of:

============  =====================================================
CBCL          Python
============  =====================================================
STRING        ``str``
INTEGER       ``int`` (signed 64-bit range; never ``bool``)
DECIMAL       :class:`decimal.Decimal` (finite, exact)
SYMBOL        :class:`Symbol`
KEYWORD       :class:`Keyword` (the name, without the colon)
URI           :class:`URI`
list          ``tuple`` of values
============  =====================================================

``Symbol``, ``Keyword`` and ``URI`` are ``str`` subclasses, so they are immutable, hashable
and cheap, but they compare equal only to values of their own type: ``Symbol("a") != "a"``
and ``Symbol("a") != Keyword("a")``. Their constructors validate; the reader builds them
through a private fast path because it has already validated the text.

Values from a program (spec §1.2) are read as data, never through their code:
:func:`data_of` gives what a value that is not of an exact CBCL type stands for - a
subclass of ``str``, ``int``, ``Decimal``, ``tuple`` or ``list`` read through its base
type, a ``Symbol``/``Keyword``/``URI`` subclass read as text and checked again, a member of
an enum of such values as its value -, and every writer, ``cbcl.body`` and ``Message``
take a value so. The base-type reads used are the ones a subclass cannot override, because
they are looked up on the base type, not on the value: ``str.__str__(x)`` (an exact copy
of the stored characters), ``int.__index__(x)`` (an exact copy of the stored integer),
``Decimal(x)`` (a copy of the stored digits: ``_decimal`` reads another decimal's
coefficient in C), ``tuple.__iter__(x)`` and ``list.__iter__(x)`` (the stored items).
``str(x)``, ``int(x)``, ``format(x)``, ``iter(x)`` and ``x == y`` all call methods a
subclass may define, so none of them is used on such a value.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping, Sequence
from decimal import Decimal
from enum import Enum
from typing import Any, Protocol, TypeAlias

# The lexical rules are the vocabulary's, defined once there (re-exported: other modules
# import these names from here).
from ._vocabulary import (
    INVISIBLE as INVISIBLE,
    MAX_DECIMAL_CHARS as MAX_DECIMAL_CHARS,
    NAME_RE as _NAME_RE,
    NUMBERLIKE_RE as _NUMBERLIKE_RE,
    URI_PATTERN as URI_PATTERN,
    URI_RE as _URI_RE,
    URI_REST_EXCLUDES as URI_REST_EXCLUDES,
)

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

#: The deepest nesting of lists a value may have to be written (canonical text, binary
#: frame, JSON mapping), converted (``cbcl.as_value``, ``cbcl.body``) or held in a
#: ``Message`` body: a list that contains itself, or anything deeper, is refused with a
#: ``LimitError`` (spec §1.2). It is also the stack bound of the C writers, which decline
#: deeper values to the Python ones (``MAX_DEPTH``, cbcl/_native_src/encoders.c).
MAX_VALUE_DEPTH = 10_000


class _Atom(str):
    """A ``str`` that is equal only to atoms of exactly its own type."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = str.__hash__

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str.__repr__(self)})"

    def __reduce__(self) -> tuple[type, tuple[str]]:
        return (type(self), (str.__str__(self),))


def is_name(text: str) -> bool:
    """True if ``text`` is a NAME of draft §1 that does not read as a number (any length)."""
    return _NAME_RE.match(text) is not None and _NUMBERLIKE_RE.match(text) is None


# The process-wide intern tables of symbols and keywords, by name (without the colon),
# owned and bounded by the reader (cbcl.core._reader.intern_symbol and intern_keyword, which fill
# them: every grammar and schema literal, pinned, and the names read). Defined here so the
# constructors below can return the very object a name is interned as: a message built in
# Python then holds the objects the encoders' symbol tables are keyed by (found by
# identity, not by hash and comparison). Every name in them is valid (checked before it is
# interned), so a name found needs no check. Dicts here, in the Python reference; where the
# extension is built, cbcl._native.NameTables (cbcl/_native_src/intern.c, issue 35: no key
# str, no dict miss and insert per new name), made at the end of this module, which the C
# readers and decoder intern in directly. Either way at most INTERN_MAX names each: a new
# name that finds a table full empties it down to its pinned names (PINNED_SYMBOLS,
# PINNED_KEYWORDS: the grammars' and schemas' literals, at most INTERN_MAX // 2).
INTERN_MAX = 8192
PINNED_SYMBOLS: dict[str, Symbol] = {}
PINNED_KEYWORDS: dict[str, Keyword] = {}
SYMBOL_TABLE: MutableMapping[str, Symbol] = {}
KEYWORD_TABLE: MutableMapping[str, Keyword] = {}


class Symbol(_Atom):
    """A SYMBOL such as ``PROPOSE`` or ``task-assignment/v1``.

    Raises ``ValueError`` if the text is not a NAME or reads as a number.
    """

    __slots__ = ()

    def __new__(cls, name: str) -> Symbol:
        if type(name) is str:
            if cls is Symbol:  # (exact: its hash and equality are str's)
                interned = SYMBOL_TABLE.get(name)
                if interned is not None:
                    return interned
        else:
            name = _text_of(name, "symbol")
        if not is_name(name):
            raise ValueError(f"not a CBCL symbol: {name!r}")
        return str.__new__(cls, name)


class Keyword(_Atom):
    """A KEYWORD; holds the name without the colon: ``Keyword("id")`` is ``:id``.

    Raises ``ValueError`` if the name is not a NAME (a leading colon is accepted and dropped).
    """

    __slots__ = ()

    def __new__(cls, name: str) -> Keyword:
        if type(name) is str:
            if cls is Keyword:
                interned = KEYWORD_TABLE.get(name[1:] if name[:1] == ":" else name)
                if interned is not None:
                    return interned
        else:
            name = _text_of(name, "keyword name")
        if name.startswith(":"):
            name = name[1:]
        if _NAME_RE.match(name) is None:
            raise ValueError(f"not a CBCL keyword name: {name!r}")
        return str.__new__(cls, name)

    @property
    def text(self) -> str:
        """The keyword as written, with its colon."""
        return ":" + str.__str__(self)


class URI(_Atom):
    """A URI such as ``agent://sys/worker-1``. Raises ``ValueError`` if malformed."""

    __slots__ = ()

    def __new__(cls, text: str) -> URI:
        if type(text) is not str:
            text = _text_of(text, "URI")
        if _URI_RE.match(text) is None:
            raise ValueError(f"not a CBCL URI: {text!r}")
        return str.__new__(cls, text)

    @property
    def scheme(self) -> str:
        return self[: self.index(":")]


Value: TypeAlias = "str | int | Decimal | Symbol | Keyword | URI | tuple[Value, ...]"
#: What converts to a :data:`Value` (as :func:`cbcl.as_value` does): a value, or a list or
#: tuple of such (a ``list`` becomes a ``tuple``; a ``bool`` is refused at run time).
ValueInput: TypeAlias = "Value | Sequence[ValueInput] | BodyRecord"


class BodyRecord(Protocol):
    """A typed record (``cbcl.Record``): converted to a value as the body it holds."""

    def to_body(self) -> Value: ...


#: The terminal of the descriptor grammars (and the envelope) that each atom type reads as.
ATOM_TERMINALS: dict[type, str] = {
    str: "STRING", int: "INTEGER", Decimal: "DECIMAL", Keyword: "KEYWORD", URI: "URI",
    Symbol: "SYMBOL",
}


# --------------------------------------------------------------------------- values as data

#: The exact types of CBCL atoms.
EXACT_ATOM_TYPES = frozenset({str, int, Decimal, Symbol, Keyword, URI})
#: The iterators :func:`data_of` gives for a list: over a ``tuple``'s or a ``list``'s
#: stored items.
ITEM_ITERATORS: tuple[type[Iterator[object]], ...] = (type(iter(())), type(iter([])))
# What an enum's members must be instances of to stand for their values.
_VALUE_BASES = (str, int, Decimal, tuple, list)


def _member_value(member: Enum) -> object:
    """The value an enum member stands for: its ``_value_``, read without calling the
    member's methods. Raises ``TypeError`` for a member of an enum that does not mix in a
    CBCL value type and ``ValueError`` for one whose value is itself an enum member."""
    kind = type(member)
    if not issubclass(kind, _VALUE_BASES):
        raise TypeError(f"{kind.__name__} members are not CBCL values (a member of an enum of "
                        "str, int, Decimal or list values stands for its value); use its "
                        ".value or .name")
    try:
        value = object.__getattribute__(member, "_value_")
    except AttributeError:
        raise TypeError(f"a {kind.__name__} member without a value is not a CBCL value") \
            from None
    if issubclass(type(value), Enum):
        raise ValueError(f"a {kind.__name__} member whose value is an enum member is not a "
                         "CBCL value")
    return value


def data_of(value: Any) -> object:
    """What ``value`` stands for as a CBCL value, read as data (spec §1.2): an atom of an
    exact type, or an iterator over a list's stored items (one of
    :data:`ITEM_ITERATORS`). An atom of an exact type is returned as it is (a writer
    checks its range), a ``tuple`` or ``list`` as ``iter()`` of it; a subclass of ``str``,
    ``int``, ``Decimal``, ``tuple`` or ``list`` is read through its base type, a subclass
    of ``Symbol``, ``Keyword`` or ``URI`` as its text, checked again and made the exact
    atom; a member of an enum of such values (``StrEnum``, ``IntEnum`` …) stands for its
    value, read by the same rules. No method the value's class defines is called.

    Raises ``TypeError`` for what is not a CBCL value (``bool``, ``None``, ``float``, a
    member of another enum …) and ``ValueError`` for a subclassed atom whose text is not
    one of its kind, or an enum member whose value is an enum member.
    """
    kind = type(value)
    if kind in EXACT_ATOM_TYPES:
        return value
    if issubclass(kind, Enum):
        value = _member_value(value)
        kind = type(value)
        if kind in EXACT_ATOM_TYPES:
            return value
    if issubclass(kind, (tuple, list)):
        return tuple.__iter__(value) if issubclass(kind, tuple) \
            else list.__iter__(value)
    if kind is bool or value is None:
        raise TypeError(f"{value!r} is not a CBCL value")
    if issubclass(kind, str):
        text = str.__str__(value)
        if issubclass(kind, Keyword):
            if _NAME_RE.match(text) is None:
                raise ValueError(f"not a CBCL keyword name: {text!r}")
            return Keyword(text)
        if issubclass(kind, Symbol):
            if not is_name(text):
                raise ValueError(f"not a CBCL symbol: {text!r}")
            return Symbol(text)
        if issubclass(kind, URI):
            return URI(text)
        return text
    if issubclass(kind, int):
        return int.__index__(value)
    if issubclass(kind, Decimal):
        return Decimal(value)
    raise TypeError(f"{kind.__name__} is not a CBCL value type")


def _text_of(value: Any, what: str) -> str:
    """The characters of a ``str`` subclass (``str.__str__``), or of the value of a member
    of a ``str`` enum, for the atoms' constructors; ``ValueError`` for anything else."""
    kind = type(value)
    try:
        if issubclass(kind, Enum):
            value = _member_value(value)
            kind = type(value)
    except TypeError as exc:
        raise ValueError(f"not a CBCL {what}: {exc}") from None
    if not issubclass(kind, str):
        raise ValueError(f"not a CBCL {what}: {kind.__name__} is not a str")
    return str.__str__(value)


# The native intern tables, where the extension is built (here, at the end: cbcl._native's
# set-up imports this module for the atom types above, and the tables make those atoms).
try:
    from .._native import NameTable as _NameTable
except ImportError:  # not built: the dicts above are the tables
    pass
else:
    SYMBOL_TABLE = _NameTable(0, INTERN_MAX, PINNED_SYMBOLS)
    KEYWORD_TABLE = _NameTable(1, INTERN_MAX, PINNED_KEYWORDS)
