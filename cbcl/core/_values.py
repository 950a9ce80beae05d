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
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import TypeAlias

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
        return (type(self), (str(self),))


def is_name(text: str) -> bool:
    """True if ``text`` is a NAME of draft §1 that does not read as a number (any length)."""
    return _NAME_RE.match(text) is not None and _NUMBERLIKE_RE.match(text) is None


# The process-wide intern tables of symbols and keywords, by name (without the colon),
# owned and bounded by the reader (cbcl.core._reader.intern_symbol and intern_keyword, which fill
# them: every grammar and schema literal, pinned, and the names read). Defined here so the
# constructors below can return the very object a name is interned as: a message built in
# Python then holds the objects the encoders' symbol tables are keyed by (found by
# identity, not by hash and comparison). Every name in them is valid (checked before it is
# interned), so a name found needs no check.
SYMBOL_TABLE: dict[str, Symbol] = {}
KEYWORD_TABLE: dict[str, Keyword] = {}


class Symbol(_Atom):
    """A SYMBOL such as ``PROPOSE`` or ``task-assignment/v1``.

    Raises ``ValueError`` if the text is not a NAME or reads as a number.
    """

    __slots__ = ()

    def __new__(cls, name: str) -> Symbol:
        if cls is Symbol and type(name) is str:  # (exact: its hash and equality are str's)
            interned = SYMBOL_TABLE.get(name)
            if interned is not None:
                return interned
        if not isinstance(name, str) or not is_name(name):
            raise ValueError(f"not a CBCL symbol: {name!r}")
        return str.__new__(cls, name)


class Keyword(_Atom):
    """A KEYWORD; holds the name without the colon: ``Keyword("id")`` is ``:id``.

    Raises ``ValueError`` if the name is not a NAME (a leading colon is accepted and dropped).
    """

    __slots__ = ()

    def __new__(cls, name: str) -> Keyword:
        if cls is Keyword and type(name) is str:
            interned = KEYWORD_TABLE.get(name[1:] if name[:1] == ":" else name)
            if interned is not None:
                return interned
        if isinstance(name, str) and name.startswith(":"):
            name = name[1:]
        if not isinstance(name, str) or _NAME_RE.match(name) is None:
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
        if not isinstance(text, str) or _URI_RE.match(text) is None:
            raise ValueError(f"not a CBCL URI: {text!r}")
        return str.__new__(cls, text)

    @property
    def scheme(self) -> str:
        return self[: self.index(":")]


Value: TypeAlias = "str | int | Decimal | Symbol | Keyword | URI | tuple[Value, ...]"
#: What converts to a :data:`Value` (as :func:`cbcl.as_value` does): a value, or a list or
#: tuple of such (a ``list`` becomes a ``tuple``; a ``bool`` is refused at run time).
ValueInput: TypeAlias = "Value | Sequence[ValueInput]"


#: The terminal of the descriptor grammars (and the envelope) that each atom type reads as.
ATOM_TERMINALS: dict[type, str] = {
    str: "STRING", int: "INTEGER", Decimal: "DECIMAL", Keyword: "KEYWORD", URI: "URI",
    Symbol: "SYMBOL",
}
