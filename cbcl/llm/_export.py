"""Grammar exports for constrained decoding (spec/llm.md): the messages of one protocol as an
llguidance, GBNF or lark grammar, or as a JSON Schema of their JSON mapping (spec §7).

Theory of operation
-------------------
An export describes exactly the *canonical* messages (spec §1.2) of a protocol: the
envelope of §2 written out field by field, then the body the descriptor's grammar (§4)
accepts for the message's intent, with single spaces between siblings, no comments and
canonical strings. Every text the grammar generates is one that ``cbcl.parse`` accepts, and
is its own canonical form. It is built in four steps, all sans-io and deterministic:

1. *Lowering.* The descriptor grammar (:class:`~cbcl.grammar._subset.GrammarSource`) is walked from
   each intent's start rule into a small token-level EBNF (``_Tok``/``_Seq``/``_Alt``/
   ``_Rep``/``_Ref``). Where the descriptor has a ``(schema …)``, the walk carries the type
   the schema gives each position (the record a body's head names, the type of the value
   after each ``:key``) and compiles in what a grammar can say: a ``one-of`` becomes the
   alternatives of its atoms, a kind narrows a terminal (``NUMBER`` under ``integer`` is an
   ``INTEGER``), integer ranges, string lengths (up to :data:`STRING_LENGTH_CAP`), a URI
   scheme, ``boolean``; keyword-set members the record does not allow are dropped and the
   keys it requires become required members. A rule used under different types is copied
   once per type. What cannot be carried is written down as a note (``not_carried``) and
   left to ``cbcl.parse``, which checks the schema after the grammar.
2. *Keyword sets* (``(":a" X & [":b" Y])``) are exact: one nonterminal per subset of the
   members already given (2^n states), each offering the members not yet given and, once
   every required member is in, the end of the set; so every order the protocol accepts
   can be generated, and no other. Beyond :data:`KEYWORD_SET_CAP` members the export falls
   back to the declared order (sound, but not every order) and says so in the notes.
3. *Canonical spacing.* A space precedes every token except ``)`` and a token right after
   ``(``. This is a two-state automaton (after ``(`` or at the start: state ``l``;
   elsewhere: ``o``), intersected with the EBNF (the Bar-Hillel construction, kept in EBNF
   form): every nonterminal ``N`` becomes ``N_pq``, entered in state ``p`` and left in
   ``q``, only for the pairs some derivation realises; repetitions stay repetitions
   (``x*`` after ``(`` is ``(x_l x_o*)?``). No ``%ignore`` is ever emitted.
4. *Rendering.* Terminals are small regular expressions (``_RLit``/``_RClass``/``_RSeq``/
   ``_RAlt``/``_RRep``) over code-point ranges, rendered per dialect: Rust ``regex`` syntax
   for llguidance, Python ``re`` for lark (each terminal followed by a look-ahead for the
   delimiter, since lark's dynamic lexer takes the first alternative that matches, not the
   longest), character-level rules for GBNF, and the common subset of ECMA-262 (``u``
   mode), Python ``re`` and XGrammar for JSON Schema patterns. GBNF and the patterns write
   each character in a form every engine reads as the same code point (spec/llm.md §2.1;
   :func:`_gbnf_char`, :func:`_pattern_char`, :func:`_unambiguous_hex`: XGrammar reads
   ``\\x`` greedily, llguidance's GBNF reader strips the zeros of ``\\u``/``\\U``).
   Classes are always written as positive ranges
   that skip the surrogates (no negated class can let an encoded surrogate through). The
   lexical rules of §1 are translated exactly, with the limits that are regular: INTEGER
   within int64 (a range expression), DECIMAL up to 40 characters, SYMBOL and KEYWORD
   names up to 128 characters, the string escapes of the canonical form only.

Nothing recurses on a grammar's depth: every step that follows rule references or nests
(the lowering, the spacing construction, the simplifier, the renderer, the JSON Schema
builder) is a generator run on an explicit stack by :meth:`_Work.run`, or an iterative
fold, so a chain of 256 rules costs no Python frames; the fixpoints use work lists. Every
step, rule made and byte written counts against :class:`~cbcl.core._limits.LLMLimits`
(spec/llm.md §12); past a budget the export raises :class:`LimitError`.

The JSON Schema export (:func:`export_json_schema`) reuses step 1: each list of a body
becomes an array schema; a list whose element sequences are finite and few (up to
:data:`JSON_SEQUENCES_CAP`, keyword sets included) is an exact ``anyOf`` of ``prefixItems``,
any other keeps its leading fixed elements exact and lets the rest be any element that may
occur there (a note says which lists are approximated).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, TypeAlias, Union

from ..core._canonical import canonical_value, quote
from ..core._errors import LimitError, ProtocolError
from ..core._limits import DEFAULT_LLM_LIMITS, LLMLimits
from ..core._reader import TOKEN, read
from ..core._values import INT64_MAX, INT64_MIN, URI, Keyword, Symbol, Value
from ..core._vocabulary import MAX_DECIMAL_CHARS
from ..grammar._subset import (
    GrammarSource,
    Group,
    Item,
    KeywordSet,
    Literal,
    Reference,
    Repeat,
    list_end,
    read_grammar,
)
from ..protocol._constraints import constraints_not_carried
from ..protocol._descriptor import ProtocolDescriptor, read_descriptor
from ..protocol._json import to_json
from ..protocol._message import Intent
from ..protocol._patterns import (
    Alt as _PAlt,
    Chars as _PChars,
    Node as _PNode,
    Ranges as _Ranges,
    Seq as _PSeq,
    compile_pattern,
    normalise_ranges as _normalise,
)
from ..protocol._schema import (
    AtomType,
    Keys,
    ListOf,
    OneOf,
    Record,
    Schema,
    SchemaType,
    compile_schema,
)
from ..protocol._trust import read_signed_descriptor_unverified

__all__ = [
    "FORMATS",
    "JSON_SEQUENCES_CAP",
    "KEYWORD_SET_CAP",
    "LIMITS_NOT_CARRIED",
    "STRING_LENGTH_CAP",
    "GrammarExport",
    "export_grammar",
    "export_json_schema",
]

#: The export formats (``cbcl grammar export --format``).
FORMATS = ("llguidance", "gbnf", "lark", "json-schema")
#: Keyword sets of at most this many members are exported exactly (2^n states each).
KEYWORD_SET_CAP = 8
#: String lengths (``:min-length``/``:max-length``) up to this are bounded repetitions.
STRING_LENGTH_CAP = 256
#: The JSON Schema export enumerates at most this many element sequences of one list.
JSON_SEQUENCES_CAP = 64
#: The longest symbol or keyword name (spec §1.1).
MAX_NAME_CHARS = 128
#: Limits of spec §1.1 no export carries (they are not regular or too large to unroll);
#: ``cbcl.parse`` checks them.
LIMITS_NOT_CARRIED = (
    "limit: message size 1,048,576 bytes",
    "limit: nesting depth 64",
    "limit: 4,096 items in one list",
    "limit: 65,536 nodes in one document",
    "limit: one string 65,536 UTF-8 bytes",
)

# --------------------------------------------------------------------------------------
# Regular expressions over code points, rendered per dialect

_MAX_CP = 0x10FFFF


@dataclass(frozen=True, slots=True)
class _RLit:
    text: str


@dataclass(frozen=True, slots=True)
class _RClass:
    ranges: _Ranges


@dataclass(frozen=True, slots=True)
class _RSeq:
    items: tuple[_Re, ...]


@dataclass(frozen=True, slots=True)
class _RAlt:
    items: tuple[_Re, ...]


@dataclass(frozen=True, slots=True)
class _RRep:
    item: _Re
    low: int
    high: int | None


_Re: TypeAlias = Union[_RLit, _RClass, _RSeq, _RAlt, _RRep]  # noqa: UP007


def _chars(text: str) -> _Ranges:
    return _normalise((ord(c), ord(c)) for c in text)


def _minus(ranges: _Ranges, excluded: _Ranges) -> _Ranges:
    out: list[tuple[int, int]] = []
    for lo, hi in ranges:
        start = lo
        for elo, ehi in excluded:
            if ehi < start or elo > hi:
                continue
            if elo > start:
                out.append((start, elo - 1))
            start = max(start, ehi + 1)
        if start <= hi:
            out.append((start, hi))
    return tuple(out)


def _union(*parts: _Ranges) -> _Ranges:
    return _normalise(r for part in parts for r in part)


_SURROGATES: _Ranges = ((0xD800, 0xDFFF),)
_ALL: _Ranges = _minus(((0, _MAX_CP),), _SURROGATES)
_FORBIDDEN: _Ranges = ((0x00, 0x1F), (0x7F, 0x9F), (0x202A, 0x202E), (0x2066, 0x2069))
_INVISIBLE: _Ranges = (*_chars("\u00a0\u061c\u1680\u3000\ufeff"), (0x2000, 0x200F),
                       (0x2028, 0x202F), (0x205F, 0x2064))
#: The characters a canonical STRING writes escaped (spec §1.2).
_ESCAPED: _Ranges = _union(_FORBIDDEN, _chars('"\\'))
_DIGIT = _normalise([(0x30, 0x39)])
_LETTER = _normalise([(0x41, 0x5A), (0x61, 0x7A)])
_NAME_START = _union(_LETTER, _chars("+-*/<>=!?_."))
_NAME_REST = _union(_LETTER, _DIGIT, _chars("+-*/<>=!?_.@%&"))


def _cls(ranges: _Ranges) -> _RClass:
    return _RClass(_normalise(ranges))


def _seq(*items: _Re) -> _Re:
    flat: list[_Re] = []
    for item in items:
        if isinstance(item, _RSeq):
            flat.extend(item.items)
        elif not (isinstance(item, _RLit) and not item.text):
            flat.append(item)
    merged: list[_Re] = []
    for item in flat:
        if merged and isinstance(item, _RLit) and isinstance(merged[-1], _RLit):
            merged[-1] = _RLit(merged[-1].text + item.text)
        else:
            merged.append(item)
    return merged[0] if len(merged) == 1 else _RSeq(tuple(merged))


def _alt(*items: _Re) -> _Re:
    flat: list[_Re] = []
    for item in items:
        for one in (item.items if isinstance(item, _RAlt) else (item,)):
            if one not in flat:
                flat.append(one)
    if not flat:
        raise ValueError("an empty alternation")
    return flat[0] if len(flat) == 1 else _RAlt(tuple(flat))


def _rep(item: _Re, low: int, high: int | None) -> _Re:
    if low == high == 1:
        return item
    return _RRep(item, low, high)


def _rust_char(cp: int) -> str:
    c = chr(cp)
    return c if c.isascii() and c.isalnum() else f"\\x{{{cp:X}}}"


def _pattern_char(cp: int) -> str:
    """A character in a JSON Schema pattern, read alike by ECMA-262 in ``u`` mode (Ajv), by
    Python ``re`` (``jsonschema``) and by XGrammar: ``\\xhh`` below U+0100 (see
    :func:`_unambiguous_hex`), ``\\uhhhh`` in the rest of the BMP, the character itself
    above it (ECMA-262 writes ``\\u{…}``, Python ``\\U…``: neither reads the other's)."""
    c = chr(cp)
    if c.isascii() and c.isalnum():
        return c
    if cp < 0x100:
        return f"\\x{cp:02x}"
    return f"\\u{cp:04x}" if cp < 0x10000 else c


_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


def _unambiguous_hex(text: str, upper: bool = False) -> str:
    """``text`` (a pattern or a GBNF literal or class in which every backslash starts an
    escape: ``\\xHH``, ``\\uHHHH``, ``\\UHHHHHHHH`` or a backslash and one character) with
    every hex digit that follows a ``\\xHH`` escape escaped too: llama.cpp, Python ``re``
    and ECMA-262 read exactly two digits after ``\\x``, XGrammar reads as many as follow
    (``\\x3FA`` is U+03FA to it, ``?A`` to the others)."""
    out: list[str] = []
    i, after_x = 0, False
    while i < len(text):
        c = text[i]
        if c == "\\":
            kind = text[i + 1:i + 2]
            size = {"x": 4, "u": 6, "U": 10}.get(kind, 2)
            out.append(text[i:i + size])
            after_x = kind == "x"
            i += size
            continue
        if after_x and c in _HEX_DIGITS:
            out.append(f"\\x{ord(c):02X}" if upper else f"\\x{ord(c):02x}")
        else:
            out.append(c)
            after_x = False
        i += 1
    return "".join(out)


def _pattern(regex: _Re) -> str:
    """A JSON Schema ``pattern``: the whole string matches ``regex``."""
    return _unambiguous_hex("^" + _render_regex(regex, _pattern_char) + "$")


def _lark_char(cp: int) -> str:
    """A character in a regular expression inside lark's ``/…/``: lark evaluates ``\\x``,
    ``\\u`` and ``\\U`` escapes itself (so those reach ``re`` as the characters) and passes
    every other backslash pair on; an ASCII punctuation character is escaped for ``re``."""
    c = chr(cp)
    if c.isascii() and c.isalnum():
        return c
    if 0x21 <= cp <= 0x7E:
        return "\\\\" if c == "\\" else "\\" + c
    if cp < 0x100:
        return f"\\x{cp:02x}"
    return f"\\u{cp:04x}" if cp < 0x10000 else f"\\U{cp:08x}"


def _render_regex(re_: _Re, char: Callable[[int], str], top: bool = True) -> str:
    """A regular expression in Rust ``regex`` / Python ``re`` syntax (``char`` escapes)."""
    if isinstance(re_, _RLit):
        text = "".join(char(ord(c)) for c in re_.text)
        return text if len(re_.text) == 1 or top else f"(?:{text})"
    if isinstance(re_, _RClass):
        if len(re_.ranges) == 1 and re_.ranges[0][0] == re_.ranges[0][1]:
            return char(re_.ranges[0][0])
        return "[" + "".join(char(lo) if lo == hi else f"{char(lo)}-{char(hi)}"
                             for lo, hi in re_.ranges) + "]"
    if isinstance(re_, _RSeq):
        text = "".join(_render_regex(i, char, top=isinstance(i, (_RClass, _RRep)))
                       for i in re_.items)
        return text if top else f"(?:{text})"
    if isinstance(re_, _RAlt):
        return "(?:" + "|".join(_render_regex(i, char) for i in re_.items) + ")"
    inner = _render_regex(re_.item, char, top=False)
    return inner + _quantifier(re_.low, re_.high)


def _quantifier(low: int, high: int | None) -> str:
    if (low, high) == (0, None):
        return "*"
    if (low, high) == (1, None):
        return "+"
    if (low, high) == (0, 1):
        return "?"
    if high is None:
        return f"{{{low},}}"
    return f"{{{low}}}" if low == high else f"{{{low},{high}}}"


def _render_gbnf_regex(re_: _Re) -> str:
    """A terminal as a GBNF expression (GBNF has no lexer: terminals are character rules)."""
    if isinstance(re_, _RLit):
        return _gbnf_literal(re_.text)
    if isinstance(re_, _RClass):
        return _unambiguous_hex(
            "[" + "".join(_gbnf_char(lo) if lo == hi else f"{_gbnf_char(lo)}-{_gbnf_char(hi)}"
                          for lo, hi in re_.ranges) + "]", upper=True)
    if isinstance(re_, _RSeq):
        return "(" + " ".join(_render_gbnf_regex(i) for i in re_.items) + ")"
    if isinstance(re_, _RAlt):
        return "(" + " | ".join(_render_gbnf_regex(i) for i in re_.items) + ")"
    inner = _render_gbnf_regex(re_.item)
    if not inner.startswith(("(", "[", '"')) or (inner.startswith('"') and len(re_.item.text
                                                   if isinstance(re_.item, _RLit) else "") > 1):
        inner = f"({inner})"
    return inner + _quantifier(re_.low, re_.high)


def _gbnf_char(cp: int) -> str:
    """A code point in a GBNF class or literal, read alike by llama.cpp, XGrammar and
    llguidance's GBNF reader (spec/llm.md §2): ASCII letters and digits as themselves,
    ``\\xHH`` below U+0100 (see :func:`_unambiguous_hex`), ``\\uHHHH`` from U+1000 to
    U+FFFF, and the character itself, UTF-8 encoded, from U+0100 to U+0FFF and above
    U+FFFF: llguidance's reader drops the leading zeros of ``\\u0100`` and ``\\U0010FFFF``,
    which its regular expressions then refuse or misread (``\\u0100b`` as U+100B)."""
    c = chr(cp)
    if c.isascii() and c.isalnum():
        return c
    if cp < 0x100:
        return f"\\x{cp:02X}"
    if 0x1000 <= cp < 0x10000:
        return f"\\u{cp:04X}"
    return c


def _gbnf_literal(text: str) -> str:
    return _unambiguous_hex(
        '"' + "".join(c if " " <= c <= "~" and c not in '"\\' else _gbnf_char(ord(c))
                      for c in text) + '"', upper=True)


# --------------------------------------------------------------------------------------
# The lexical rules of spec §1 as regular expressions


def _digits_range(x: str, y: str) -> _Re:
    """Decimal digit strings of the same length from ``x`` to ``y`` (``x <= y``)."""
    if x == y:
        return _RLit(x)
    if len(x) == 1:
        return _cls(((ord(x), ord(y)),))
    n = len(x) - 1
    if x[1:] == "0" * n and y[1:] == "9" * n:
        return _seq(_cls(((ord(x[0]), ord(y[0])),)), _rep(_cls(_DIGIT), n, n))
    if x[0] == y[0]:
        return _seq(_RLit(x[0]), _digits_range(x[1:], y[1:]))
    parts: list[_Re] = [_seq(_RLit(x[0]), _digits_range(x[1:], "9" * n))]
    if ord(x[0]) + 1 <= ord(y[0]) - 1:
        parts.append(_seq(_cls(((ord(x[0]) + 1, ord(y[0]) - 1),)), _rep(_cls(_DIGIT), n, n)))
    parts.append(_seq(_RLit(y[0]), _digits_range("0" * n, y[1:])))
    return _alt(*parts)


def _natural_range(low: int, high: int) -> _Re | None:
    """Canonical decimal texts of the integers ``low``..``high`` (``0 <= low``)."""
    parts: list[_Re] = []
    for digits in range(len(str(low)), len(str(high)) + 1):
        lo = max(low, 0 if digits == 1 else 10 ** (digits - 1))
        hi = min(high, 10 ** digits - 1)
        if lo <= hi:
            parts.append(_digits_range(str(lo).rjust(digits, "0"), str(hi)))
    return _alt(*parts) if parts else None


def integer_regex(low: int = INT64_MIN, high: int = INT64_MAX) -> _Re | None:
    """INTEGER texts (``0 | -?[1-9][0-9]*``) of the values ``low``..``high``, or ``None``
    for an empty range."""
    low, high = max(low, INT64_MIN), min(high, INT64_MAX)
    if low > high:
        return None
    parts: list[_Re] = []
    if high >= 0:
        natural = _natural_range(max(low, 0), high)
        if natural is not None:
            parts.append(natural)
    if low < 0:
        negative = _natural_range(max(-high, 1), -low)
        if negative is not None:
            parts.append(_seq(_RLit("-"), negative))
    return _alt(*parts) if parts else None


def _decimal_regex(non_negative: bool) -> _Re:
    """DECIMAL texts ``-?(0|[1-9][0-9]*)\\.[0-9]+`` of at most 40 characters."""
    digit = _cls(_DIGIT)
    parts: list[_Re] = []
    for sign in ("",) if non_negative else ("", "-"):
        room = MAX_DECIMAL_CHARS - len(sign) - 1  # characters for the two digit runs
        for whole in range(1, room):
            head = digit if whole == 1 else _seq(_cls(((0x31, 0x39),)),
                                                 _rep(digit, whole - 1, whole - 1))
            parts.append(_seq(_RLit(sign), head, _RLit("."), _rep(digit, 1, room - whole)))
    return _alt(*parts)


def _string_escape() -> _Re:
    """Every escape of a canonical STRING (spec §1.2): one for each of :data:`_ESCAPED`."""
    hexes = _alt(_seq(_RLit("000"), _cls(_chars("012345678bcef"))),
                 _seq(_RLit("001"), _cls(_union(_DIGIT, _chars("abcdef")))),
                 _RLit("007f"),
                 _seq(_RLit("00"), _cls(_chars("89")), _cls(_union(_DIGIT, _chars("abcdef")))),
                 _seq(_RLit("202"), _cls(_chars("abcde"))),
                 _seq(_RLit("206"), _cls(_chars("6789"))))
    escape = _seq(_RLit("\\"), _alt(_cls(_chars('"\\nrt')), _seq(_RLit("u"), hexes)))
    return escape


def _string_regex(low: int, high: int | None) -> _Re:
    """A canonical STRING (spec §1.2) of ``low``..``high`` characters after unescaping."""
    plain = _cls(_minus(_ALL, _ESCAPED))
    return _seq(_RLit('"'), _rep(_alt(plain, _string_escape()), low, high), _RLit('"'))


def _pattern_regex(node: _PNode, wire: bool) -> _Re | None:
    """A schema pattern (spec/conversations.md §2.4) as a regular expression: over the
    string's characters (``wire`` false: a JSON Schema ``pattern``), or over the text of a
    canonical STRING's content (``wire``: each character as §1.2 writes it, ``"``, ``\\``
    and control characters escaped). ``None`` for a pattern that matches nothing. Recursion
    is bounded by the pattern's nesting limit."""
    if isinstance(node, _PChars):
        ranges = _minus(_normalise(node.ranges), _SURROGATES)
        if not wire:
            return _cls(ranges) if ranges else None
        plain = _minus(ranges, _ESCAPED)
        if len(plain) == 1 and plain[0][0] == plain[0][1] and plain == ranges:
            return _RLit(chr(plain[0][0]))  # (a literal: neighbours merge into one)
        parts: list[_Re] = [_cls(plain)] if plain else []
        if not _minus(_ESCAPED, ranges):  # every escaped character: the escapes' regex
            parts.append(_string_escape())
        else:
            for lo, hi in ranges:  # (the escaped characters are few: about 75)
                for elo, ehi in _ESCAPED:
                    parts.extend(_RLit(quote(chr(cp))[1:-1])
                                 for cp in range(max(lo, elo), min(hi, ehi) + 1))
        return _alt(*parts) if parts else None
    if isinstance(node, _PSeq):
        items: list[_Re] = []
        for item in node.items:
            regex = _pattern_regex(item, wire)
            if regex is None:
                return None
            items.append(regex)
        return _seq(*items) if items else _RLit("")
    if isinstance(node, _PAlt):
        options = [r for r in (_pattern_regex(i, wire) for i in node.items) if r is not None]
        return _alt(*options) if options else None
    inner = _pattern_regex(node.item, wire)
    if inner is None:
        return _RLit("") if node.low == 0 else None
    if inner == _RLit(""):
        return inner
    if isinstance(inner, _RRep):  # (a group: the renderers write no quantifier twice)
        inner = _RSeq((inner,))
    return _rep(inner, node.low, node.high)


def _name_regex(first: _Ranges, rest_max: int) -> _Re:
    return _seq(_cls(first), _rep(_cls(_NAME_REST), 0, rest_max))


def _symbol_regex() -> _Re:
    """A SYMBOL: a NAME of at most 128 characters that does not start like a number
    (``[+-]?\\.?[0-9]``), written without look-ahead."""
    rest = _cls(_NAME_REST)
    no_digit = _minus(_NAME_REST, _DIGIT)
    no_digit_dot = _minus(no_digit, _chars("."))
    sign = _cls(_chars("+-"))
    n = MAX_NAME_CHARS
    return _alt(
        _seq(_cls(_minus(_NAME_START, _chars("+-."))), _rep(rest, 0, n - 1)),
        _seq(sign, _rep(_seq(_cls(no_digit_dot), _rep(rest, 0, n - 2)), 0, 1)),
        _seq(sign, _RLit("."), _rep(_seq(_cls(no_digit), _rep(rest, 0, n - 3)), 0, 1)),
        _seq(_RLit("."), _rep(_seq(_cls(no_digit), _rep(rest, 0, n - 2)), 0, 1)),
    )


def _uri_regex(scheme: str | None) -> _Re:
    rest = _cls(_minus(_ALL, _union(((0x00, 0x20), (0x7F, 0x9F)), _chars('()";'),
                                    ((0x2066, 0x2069),), _INVISIBLE)))
    head: _Re = _RLit(scheme) if scheme is not None else _seq(
        _cls(((0x61, 0x7A),)), _rep(_cls(_union(((0x61, 0x7A),), _DIGIT, _chars("+.-"))),
                                    0, None))
    return _seq(head, _RLit("://"), _rep(rest, 1, None))


# --------------------------------------------------------------------------------------
# Token-level EBNF


@dataclass(frozen=True, slots=True)
class _Tok:
    """A token: ``kind`` is ``(`` or ``)``, ``lit`` (``text`` is the exact text of one atom)
    or ``term`` (``text`` names a terminal); after spacing, ``text`` (exact output)."""

    kind: str
    text: str


@dataclass(frozen=True, slots=True)
class _Seq:
    items: tuple[_E, ...]


@dataclass(frozen=True, slots=True)
class _Alt:
    items: tuple[_E, ...]


@dataclass(frozen=True, slots=True)
class _Rep:
    item: _E
    op: str  # "*", "+" or "?"


@dataclass(frozen=True, slots=True)
class _Ref:
    name: str


_E: TypeAlias = Union[_Tok, _Seq, _Alt, _Rep, _Ref]  # noqa: UP007
_EMPTY = _Seq(())
_NEVER = _Alt(())
_LP, _RP = _Tok("(", "("), _Tok(")", ")")


def _never(e: _E) -> bool:
    """``e == _NEVER``, without the dataclass's comparison."""
    return type(e) is _Alt and not e.items


def _empty(e: _E) -> bool:
    """``e == _EMPTY``, without the dataclass's comparison."""
    return type(e) is _Seq and not e.items


def _s(*items: _E) -> _E:
    flat: list[_E] = []
    for item in items:
        if _never(item):
            return _NEVER
        flat.extend(item.items if isinstance(item, _Seq) else (item,))
    return flat[0] if len(flat) == 1 else _Seq(tuple(flat))


def _a(*items: _E) -> _E:
    flat: list[_E] = []
    for item in items:
        for one in (item.items if isinstance(item, _Alt) else (item,)):
            if one not in flat:
                flat.append(one)
    if not flat:
        return _NEVER
    return flat[0] if len(flat) == 1 else _Alt(tuple(flat))


def _r(item: _E, op: str) -> _E:
    if _never(item):
        return _EMPTY if op in "*?" else _NEVER
    if _empty(item):
        return _EMPTY
    return _Rep(item, op)


# --------------------------------------------------------------------------------------
# Step 1: lowering, with the schema's types


_KINDS = ("STRING", "INTEGER", "DECIMAL", "SYMBOL", "KEYWORD", "URI")
_BASE_KINDS: dict[str, frozenset[str]] = {
    "STRING": frozenset({"STRING"}), "INTEGER": frozenset({"INTEGER"}),
    "DECIMAL": frozenset({"DECIMAL"}), "NUMBER": frozenset({"INTEGER", "DECIMAL"}),
    "SYMBOL": frozenset({"SYMBOL"}), "KEYWORD": frozenset({"KEYWORD"}),
    "URI": frozenset({"URI"}), "value": frozenset({*_KINDS, "LIST"}),
}
_SCHEMA_KINDS: dict[str, frozenset[str]] = {
    "string": frozenset({"STRING"}), "integer": frozenset({"INTEGER"}),
    "decimal": frozenset({"DECIMAL"}), "number": frozenset({"INTEGER", "DECIMAL"}),
    "symbol": frozenset({"SYMBOL"}), "keyword": frozenset({"KEYWORD"}),
    "uri": frozenset({"URI"}), "boolean": frozenset({"SYMBOL"}),
    "any": frozenset({*_KINDS, "LIST"}),
}
_VALUE_KINDS = {str: "STRING", int: "INTEGER", Decimal: "DECIMAL", Symbol: "SYMBOL",
                Keyword: "KEYWORD", URI: "URI"}


@dataclass(frozen=True, slots=True)
class _Body:
    """The pseudo-type of a body: the schema picks the record by the body's head."""

    schema: Schema


_Type: TypeAlias = Union[SchemaType, _Body, None]  # noqa: UP007


#: A function made iterative: a generator that yields the calls it makes (generators) and
#: is sent their results; :meth:`_Work.run` runs it on an explicit stack.
_Call: TypeAlias = Generator[Any, Any, Any]


class _Work:
    """The budgets of one export (:class:`~cbcl.core._limits.LLMLimits`): the steps
    taken and the rules made, each counted as it happens, and the runner of the
    iterative functions (no Python frame per level of a grammar's nesting or rule
    chain: a chain of 256 rules costs a list of 256 suspended generators, not the
    interpreter's stack)."""

    def __init__(self, limits: LLMLimits, what: str = "the export") -> None:
        self.limits = limits
        self.what = what
        self.steps = 0
        self.rules = 0

    def step(self, count: int = 1) -> None:
        self.steps += count
        if self.steps > self.limits.max_steps:
            raise self.limits.exceeded("max_steps", self.what)

    def rule(self) -> None:
        self.rules += 1
        if self.rules > self.limits.max_rules:
            raise self.limits.exceeded("max_rules", self.what)

    def run(self, call: _Call) -> Any:
        """The result of ``call``, each call it makes run in turn on an explicit stack;
        an exception unwinds the stack as it would the frames of a recursion (thrown
        into each caller in turn, so its ``finally`` and ``except`` run)."""
        stack = [call]
        value: Any = None
        error: Exception | None = None
        while True:
            try:
                if error is None:
                    try:
                        self.step()
                    except LimitError as exc:
                        error = exc
                if error is None:
                    inner = stack[-1].send(value)
                else:
                    thrown, error = error, None
                    inner = stack[-1].throw(thrown)
            except StopIteration as stop:
                stack.pop()
                if not stack:
                    return stop.value
                value = stop.value
            except Exception as exc:
                stack.pop()
                if not stack:
                    raise
                error, value = exc, None
            else:
                stack.append(inner)
                value = None


class _Lowerer:
    """Step 1. Every method that can reach another item is a generator run by
    :meth:`_Work.run` (``x = yield self.value_items(…)`` is the call)."""

    def __init__(self, source: GrammarSource, schema: Schema | None, set_cap: int,
                 work: _Work) -> None:
        self.source = source
        self.schema = schema
        self.set_cap = set_cap
        self.work = work
        self.by_name = {rule.name: rule for rule in source.rules}
        self.rules: dict[str, _E] = {}
        self.terminals: dict[str, _Re] = {}
        self.terminal_keys: dict[tuple[Any, ...], str] = {}
        self.terminal_info: dict[str, tuple[str, AtomType | None]] = {}
        self.notes: list[str] = []
        self.memo: dict[tuple[str, str, int], str] = {}
        self.counts: dict[str, int] = {}
        self.sets = 0
        self.anchors: list[object] = []

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def new_rule(self, name: str) -> None:
        """Reserve rule ``name`` (the rule refers to itself until its body is in)."""
        self.work.rule()
        self.rules[name] = _NEVER

    # ----------------------------------------------------------------- terminals

    def terminal(self, kind: str, atom: AtomType | None = None, path: str = "") -> _E:
        """The token of one atom of ``kind`` (``STRING`` …), narrowed by ``atom``."""
        key: tuple[Any, ...]
        regex: _Re | None
        if kind == "STRING":
            low, high = 0, None
            if atom is not None and atom.min_length is not None:
                if atom.min_length <= STRING_LENGTH_CAP:
                    low = atom.min_length
                else:
                    self.note(f"schema: {path}: :min-length {atom.min_length} (over the cap "
                              f"of {STRING_LENGTH_CAP} characters)")
            if atom is not None and atom.max_length is not None:
                if atom.max_length <= STRING_LENGTH_CAP:
                    high = atom.max_length
                else:
                    self.note(f"schema: {path}: :max-length {atom.max_length} (over the cap "
                              f"of {STRING_LENGTH_CAP} characters)")
            if high is not None and low > high:
                return _NEVER
            key, regex = ("STRING", low, high), _string_regex(low, high)
            if atom is not None and atom.pattern is not None:
                content = _pattern_regex(compile_pattern(atom.pattern).tree, wire=True)
                if (low, high) != (0, None):
                    self.note(f"schema: {path}: :min-length/:max-length of a string with a "
                              "pattern (the pattern is carried, not the length)")
                key = ("STRING", "pattern", atom.pattern)
                regex = None if content is None else _seq(_RLit('"'), content, _RLit('"'))
        elif kind == "INTEGER":
            low_i, high_i = INT64_MIN, INT64_MAX
            if atom is not None:
                if atom.low is not None:
                    low_i = max(low_i, math.ceil(atom.low))
                if atom.high is not None:
                    high_i = min(high_i, math.floor(atom.high))
            key, regex = ("INTEGER", low_i, high_i), integer_regex(low_i, high_i)
        elif kind == "DECIMAL":
            non_negative = atom is not None and atom.low is not None and atom.low >= 0
            if atom is not None and ((atom.low is not None and atom.low > 0)
                                     or atom.high is not None):
                self.note(f"schema: {path}: decimal range {atom.describe()} (only the "
                          "sign of a minimum of 0 is carried)")
            key, regex = ("DECIMAL", non_negative), _decimal_regex(non_negative)
        elif kind == "SYMBOL":
            if atom is not None and (atom.min_length is not None or atom.max_length is not None):
                self.note(f"schema: {path}: symbol length {atom.describe()}")
            key, regex = ("SYMBOL",), _symbol_regex()
        elif kind == "KEYWORD":
            key, regex = ("KEYWORD",), _seq(_RLit(":"), _name_regex(_NAME_START,
                                                                    MAX_NAME_CHARS - 1))
        else:
            scheme = atom.scheme if atom is not None else None
            key, regex = ("URI", scheme), _uri_regex(scheme)
        if regex is None:
            return _NEVER
        name = self.terminal_keys.get(key)
        if name is None:
            name = f"{kind}_{len(self.terminal_keys)}"
            self.terminal_keys[key] = name
            self.terminals[name] = regex
            self.terminal_info[name] = (kind, atom)
        return _Tok("term", name)

    def value_rule(self) -> _E:
        if "value" not in self.rules:
            self.new_rule("value")  # (reserved: the rule refers to itself)
            atoms = [self.terminal(kind) for kind in _KINDS]
            self.rules["value"] = _a(*atoms, _s(_LP, _r(_Ref("value"), "*"), _RP))
        return _Ref("value")

    def base(self, name: str, typ: _Type, path: str) -> _E:
        """A base name (``SYMBOL`` … ``value``) as one value of type ``typ``."""
        kinds = _BASE_KINDS[name]
        if typ is None or isinstance(typ, _Body) or (isinstance(typ, AtomType)
                                                     and typ.kind == "any"):
            return self.value_rule() if name == "value" else _a(*(self.terminal(k)
                                                                   for k in sorted(kinds)))
        if isinstance(typ, OneOf):
            self.work.step(len(typ.values))
            return _a(*(self.literal_atom(v) for v in typ.values
                        if _VALUE_KINDS.get(type(v)) in kinds))
        if isinstance(typ, AtomType):
            if typ.kind == "boolean":
                return _a(*(_Tok("lit", t) for t in ("true", "false"))) \
                    if "SYMBOL" in kinds else _NEVER
            allowed = kinds & _SCHEMA_KINDS[typ.kind]
            return _a(*(self.terminal(k, typ, path) for k in _KINDS if k in allowed))
        # a list type (record, keys, list-of)
        if "LIST" not in kinds:
            return _NEVER
        self.note(f"schema: {path}: {typ.describe()} where the grammar has `value`")
        return self.value_rule()

    def literal_atom(self, value: Value) -> _E:
        return _Tok("lit", canonical_value(value))

    # ----------------------------------------------------------------- rules

    def rule_ref(self, name: str, typ: _Type, how: str, path: str,
                 keys: Keys | None = None) -> _Call:
        """``name`` as one value of ``typ`` (``how == "value"``) or as items of a list
        level whose keys are ``keys`` (``how == "level"``)."""
        anchor: object = typ if how == "value" else keys
        key = (name, how, id(anchor) if anchor is not None else 0)
        found = self.memo.get(key)
        if found is None:
            self.anchors.append(anchor)  # (ids stay unique while the lowering runs)
            if anchor is None and how == "value":
                found = "r_" + name
            else:
                count = self.counts[name] = self.counts.get(name, 0) + 1
                found = f"r_{name}_{count}"
            self.memo[key] = found
            self.new_rule(found)
            parts: list[_E] = []
            for alt in self.by_name[name].alternatives:
                if how == "value":
                    parts.append((yield self.value_items(alt.items, typ, path)))
                else:
                    parts.append((yield self.level_items(alt.items, keys, path, None)))
            self.rules[found] = _a(*parts)
        return _Ref(found)

    def value_item(self, item: Item, typ: _Type, path: str) -> _Call:
        """One item that is one value of type ``typ``."""
        if isinstance(item, Reference):
            if item.is_base:
                return self.base(item.name, typ, path)
            return (yield self.rule_ref(item.name, typ, "value", path))
        if isinstance(item, Literal):
            kind = "KEYWORD" if item.is_keyword else "SYMBOL"
            if item.text in "()":
                return _plain_literal(item)
            if isinstance(typ, OneOf):
                return _Tok("lit", item.text) if any(
                    _VALUE_KINDS.get(type(v)) == kind and canonical_value(v) == item.text
                    for v in typ.values) else _NEVER
            if isinstance(typ, AtomType) and (
                    kind not in _SCHEMA_KINDS[typ.kind]
                    or (typ.kind == "boolean" and item.text not in ("true", "false"))):
                return _NEVER
            if isinstance(typ, (Record, Keys, ListOf)):
                return _NEVER
            return _plain_literal(item)
        if isinstance(item, Group):
            parts: list[_E] = []
            for alt in item.alternatives:
                parts.append((yield self.value_items(alt.items, typ, path)))
            body = _a(*parts)
            return _r(body, "?") if item.optional else body
        if typ is not None and not (isinstance(typ, AtomType) and typ.kind == "any"):
            self.note(f"schema: {path}: {_describe(typ)} (the grammar has a repetition or a "
                      "keyword set there)")
        return (yield self.plain(item))

    def value_items(self, items: tuple[Item, ...], typ: _Type, path: str) -> _Call:
        """A sequence of items that is one value of type ``typ``."""
        if len(items) == 1:
            return (yield self.value_item(items[0], typ, path))
        is_list = (len(items) >= 2 and isinstance(items[0], Literal) and items[0].text == "("
                   and list_end(items, 0) == len(items))
        if not is_list or typ is None or (isinstance(typ, AtomType) and typ.kind == "any"):
            if typ is not None and not is_list and not (isinstance(typ, AtomType)
                                                        and typ.kind == "any"):
                self.note(f"schema: {path}: {_describe(typ)} (the grammar's value there is "
                          "not one list or one atom)")
            return (yield self.plain_seq(items))
        if isinstance(typ, (AtomType, OneOf)):
            return _NEVER  # a list where the schema wants an atom
        inner = items[1:-1]
        if isinstance(typ, _Body):
            heads = _leading_symbols(inner)
            record, unsure = _record_for(typ.schema, heads)
            if unsure:
                self.note(f"schema: {path}: a record whose heads the grammar does not fix")
            if record is None:
                return (yield self.plain_seq(items))
            typ = record
        if isinstance(typ, ListOf):
            self.note(f"schema: {path}: {typ.describe()} (list-of: element types and "
                      "lengths)")
            return (yield self.plain_seq(items))
        if isinstance(typ, Record):
            heads = _leading_symbols(inner)
            count = len(typ.heads)
            if tuple(heads[:count]) != tuple(str(h) for h in typ.heads):
                if len(heads) >= count or (heads and heads != [str(h) for h in
                                                               typ.heads[:len(heads)]]):
                    return _NEVER  # the schema refuses every value of this shape
                self.note(f"schema: {path}: {typ.describe()} (heads the grammar does not "
                          "fix)")
                return (yield self.plain_seq(items))
            where = f"{path}.{typ.heads[0]}" if path else str(typ.heads[0])
            guaranteed: set[str] = set()
            body = yield self.level_items(inner[count:], typ.keys, where, guaranteed)
            # (the heads are literal symbols: _leading_symbols found them)
            heads_e = [_plain_literal(i) for i in inner[:count] if isinstance(i, Literal)]
            self.check_required(typ.keys, guaranteed, where)
            return _s(_LP, *heads_e, body, _RP)
        if not isinstance(typ, Keys):  # pragma: no cover (the types above are all)
            raise TypeError(f"not a schema type: {type(typ).__name__}")
        guaranteed = set()
        body = yield self.level_items(inner, typ, path, guaranteed)
        self.check_required(typ, guaranteed, path)
        return _s(_LP, body, _RP)

    def check_required(self, keys: Keys, guaranteed: set[str], path: str) -> None:
        for key in keys.required:
            if ":" + str(key) not in guaranteed:
                self.note(f"schema: {path}: required key :{key} (the grammar does not "
                          "require it)")

    def level_items(self, items: tuple[Item, ...], keys: Keys | None, path: str,
                    guaranteed: set[str] | None) -> _Call:
        """Items inside a list whose keyword arguments have the types ``keys``;
        ``guaranteed`` collects the keys every match of this sequence gives."""
        if keys is None:
            return (yield self.plain_seq(items))
        out: list[_E] = []
        i = 0
        while i < len(items):
            item = items[i]
            if isinstance(item, Literal) and item.is_keyword and i + 1 < len(items):
                typ = _field_type(keys, item.text)
                if typ is None:
                    return _NEVER  # a key the schema does not allow
                end = _value_end(items, i + 1)
                where = f"{path}[{item.text}]"
                value = (yield (self.value_items(items[i + 1:end], typ, where) if end > i + 2
                                else self.value_item(items[i + 1], typ, where)))
                out += [_plain_literal(item), value]
                if guaranteed is not None:
                    guaranteed.add(item.text)
                i = end
                continue
            if isinstance(item, Reference) and item.name == "KEYWORD" and keys.other is None \
                    and i + 1 < len(items):
                # a general keyword where the schema lists every allowed key: one
                # alternative per key, each with its value's type
                end = _value_end(items, i + 1)
                choices = []
                for key, typ in keys.fields.items():
                    where = f"{path}[:{key}]"
                    value = (yield (self.value_items(items[i + 1:end], typ, where)
                                    if end > i + 2
                                    else self.value_item(items[i + 1], typ, where)))
                    choices.append(_s(_Tok("lit", ":" + str(key)), value))
                out.append(_a(*choices))
                self.unique_note(keys, path)
                i = end
                continue
            if isinstance(item, KeywordSet):
                out.append((yield self.keyword_set(item, keys, path, guaranteed)))
            elif isinstance(item, Reference) and not item.is_base:
                out.append((yield self.rule_ref(item.name, None, "level", path, keys)))
                self.unique_note(keys, path)
            elif isinstance(item, Group):
                parts: list[_E] = []
                for alt in item.alternatives:
                    parts.append((yield self.level_items(alt.items, keys, path, None)))
                body = _a(*parts)
                out.append(_r(body, "?") if item.optional else body)
            elif isinstance(item, Repeat):
                inner = item.item
                alternatives = (inner.alternatives if isinstance(inner, Group)
                                and not inner.optional else None)
                if alternatives is not None:
                    parts = []
                    for alt in alternatives:
                        parts.append((yield self.level_items(alt.items, keys, path, None)))
                    body = _a(*parts)
                else:
                    body = yield self.level_items((inner,), keys, path, None)
                if isinstance(inner, Group) and inner.optional:
                    body = _r(body, "?")
                out.append(_r(body, item.op))
                if item.op != "?":
                    self.unique_note(keys, path)
            else:
                if isinstance(item, Reference) and item.name in ("KEYWORD", "value"):
                    self.unique_note(keys, path)
                out.append((yield self.plain(item)))
            i += 1
        return _s(*out)

    def unique_note(self, keys: Keys, path: str) -> None:
        if keys.fields or keys.required:
            self.note(f"schema: {path}: keys outside keyword sets (which keys are allowed, "
                      "their types, and that none repeats)")

    def keyword_set(self, item: KeywordSet, keys: Keys | None, path: str,
                    guaranteed: set[str] | None) -> _Call:
        members: list[tuple[str, _E, bool]] = []
        for member in item.members:
            required = not member.optional
            if keys is not None:
                typ = _field_type(keys, member.keyword)
                if typ is None:
                    if required:
                        return _NEVER
                    continue
                required = required or any(":" + str(k) == member.keyword
                                           for k in keys.required)
                value = yield self.value_item(member.item, typ, f"{path}[{member.keyword}]")
            else:
                value = yield self.plain(member.item)
            if value == _NEVER:
                if required:
                    return _NEVER
                continue
            members.append((member.keyword, value, required))
            if required and guaranteed is not None:
                guaranteed.add(member.keyword)
        self.sets += 1
        if len(members) > self.set_cap:
            self.note(f"keyword set at {item.position.line}:{item.position.column}: "
                      f"{len(members)} members, over the cap of {self.set_cap}: only the "
                      "declared order is generated")
            return _s(*(_s(_Tok("lit", k), v) if req else _r(_s(_Tok("lit", k), v), "?")
                        for k, v, req in members))
        prefix = f"set{self.sets}"
        required_mask = sum(1 << n for n, (_, _, req) in enumerate(members) if req)
        full = (1 << len(members)) - 1

        def state(mask: int) -> _Call:
            name = f"{prefix}_{mask:x}"
            if name not in self.rules:
                self.new_rule(name)
                choices: list[_E] = [_EMPTY] if mask & required_mask == required_mask else []
                for n, (keyword, value, _) in enumerate(members):
                    if not mask & (1 << n):
                        rest = (yield state(mask | (1 << n))) if mask | (1 << n) != full \
                            else _EMPTY
                        choices.append(_s(_Tok("lit", keyword), value, rest))
                self.rules[name] = _a(*choices) if choices else _EMPTY
            return _Ref(name)

        return (yield state(0)) if members else _EMPTY

    # ----------------------------------------------------------------- untyped

    def plain(self, item: Item) -> _Call:
        if isinstance(item, Literal):
            return _plain_literal(item)
        if isinstance(item, Reference):
            if item.is_base:
                return self.base(item.name, None, "")
            return (yield self.rule_ref(item.name, None, "value", ""))
        if isinstance(item, Group):
            parts: list[_E] = []
            for alt in item.alternatives:
                parts.append((yield self.plain_seq(alt.items)))
            body = _a(*parts)
            return _r(body, "?") if item.optional else body
        if isinstance(item, Repeat):
            inner = item.item
            if isinstance(inner, Group) and not inner.optional:
                parts = []
                for alt in inner.alternatives:
                    parts.append((yield self.plain_seq(alt.items)))
                body = _a(*parts)
            else:
                body = yield self.plain(inner)
            return _r(body, item.op)
        return (yield self.keyword_set(item, None, "", None))

    def plain_seq(self, items: tuple[Item, ...]) -> _Call:
        out: list[_E] = []
        for item in items:
            out.append((yield self.plain(item)))
        return _s(*out)


def _plain_literal(item: Literal) -> _E:
    return _LP if item.text == "(" else _RP if item.text == ")" else _Tok("lit", item.text)


def _describe(typ: _Type) -> str:
    if isinstance(typ, _Body):
        return "the body's record"
    return typ.describe() if typ is not None else "any value"


def _field_type(keys: Keys, keyword: str) -> SchemaType | None:
    for key, typ in keys.fields.items():
        if ":" + str(key) == keyword:
            return typ
    return keys.other


def _value_end(items: tuple[Item, ...], start: int) -> int:
    """The end of the value that starts at ``items[start]``: one item, or a ``(`` up to
    its matching ``)`` literal in the same sequence."""
    first = items[start]
    end = list_end(items, start) if isinstance(first, Literal) and first.text == "(" else None
    return start + 1 if end is None else end


def _leading_symbols(items: tuple[Item, ...]) -> list[str]:
    heads: list[str] = []
    for item in items:
        if not isinstance(item, Literal) or item.is_keyword or item.text in "()":
            break
        heads.append(item.text)
    return heads


def _record_for(schema: Schema, heads: list[str]) -> tuple[Record | None, bool]:
    """The record a body starting with the literal symbols ``heads`` meets (as
    :meth:`Schema.record_for` picks it), and whether that depends on more than ``heads``
    (then ``None``)."""
    for record in schema.records:
        shared = min(len(record.heads), len(heads))
        if any(str(record.heads[i]) != heads[i] for i in range(shared)):
            continue
        if len(record.heads) > len(heads):
            return None, True
        return record, False
    return None, False


# --------------------------------------------------------------------------------------
# Step 3: canonical spacing (a two-state automaton intersected with the EBNF)

_L, _O = "l", "o"


def _children(e: _E) -> tuple[_E, ...]:
    if isinstance(e, (_Seq, _Alt)):
        return e.items
    if isinstance(e, _Rep):
        return (e.item,)
    return ()


def _fold(e: _E, combine: Callable[[_E, list[Any]], Any], work: _Work) -> Any:
    """``combine(node, results of its children)`` for every node of ``e``, children
    first (each distinct node object once), iteratively; returns ``e``'s."""
    done: dict[int, Any] = {}
    stack: list[tuple[_E, bool]] = [(e, False)]
    visited = 0
    while stack:
        node, expanded = stack.pop()
        if id(node) in done:
            continue
        kids = _children(node)
        if kids and not expanded:
            stack.append((node, True))
            stack.extend((kid, False) for kid in reversed(kids) if id(kid) not in done)
            continue
        visited += 1
        done[id(node)] = combine(node, [done[id(kid)] for kid in kids])
    work.step(visited)
    return done[id(e)]


_INNER = (_Seq, _Alt, _Rep)


def _map(e: _E, rebuild: Callable[[_E, list[_E]], _E], work: _Work) -> _E:
    """``e`` rebuilt bottom-up, left to right: ``rebuild(node, its children rebuilt)``
    for every occurrence of every node (not shared: each occurrence is rebuilt, in the
    order a recursive walk takes), iteratively."""
    if type(e) not in _INNER:
        work.step()
        return rebuild(e, [])
    # frames: [node, its children, the children rebuilt so far]
    stack: list[tuple[_E, tuple[_E, ...], list[_E]]] = [(e, _children(e), [])]
    visited = 0
    while True:
        node, kids, done = stack[-1]
        if len(done) < len(kids):
            kid = kids[len(done)]
            if type(kid) in _INNER:
                stack.append((kid, _children(kid), []))
            else:
                visited += 1
                done.append(rebuild(kid, []))
            continue
        stack.pop()
        visited += 1
        result = rebuild(node, done)
        if not stack:
            work.step(visited)
            return result
        stack[-1][2].append(result)


_States = dict[str, frozenset[str]]


class _Spacer:
    def __init__(self, rules: Mapping[str, _E], work: _Work) -> None:
        self.rules = dict(rules)
        self.work = work
        self.outs: dict[tuple[str, str], frozenset[str]] = {}
        self.out_rules: dict[str, _E] = {}
        self.helpers = 0
        self._spaced: dict[tuple[str, str], dict[str, _E]] = {}
        self._fix()

    def _fix(self) -> None:
        while True:
            self._outs()
            if not self._rewrite_irregular():
                return

    def _outs(self) -> None:
        """The states each rule may leave in, per state it is entered in: the least
        fixpoint, by a work list (a rule is looked at again when a rule it refers to
        changes)."""
        self.outs = {(n, p): frozenset() for n in self.rules for p in (_L, _O)}
        users: dict[str, set[str]] = {}
        for name, body in self.rules.items():
            for ref in _refs(body, self.work):
                users.setdefault(ref, set()).add(name)
        todo = list(reversed(self.rules))
        waiting = set(todo)
        while todo:
            name = todo.pop()
            waiting.discard(name)
            table = self.out_table(self.rules[name])
            changed = False
            for p in (_L, _O):
                if table[p] != self.outs[(name, p)]:
                    self.outs[(name, p)] = table[p]
                    changed = True
            if changed:
                for user in sorted(users.get(name, ())):
                    if user not in waiting:
                        waiting.add(user)
                        todo.append(user)

    def _rewrite_irregular(self) -> bool:
        """Replace repetitions whose item may be empty or end with ``(`` by recursive
        helper rules (``H: ε | x H``), which the general construction handles."""
        changed = False

        def rebuild(e: _E, kids: list[_E]) -> _E:
            nonlocal changed
            if isinstance(e, _Seq):
                return _Seq(tuple(kids))
            if isinstance(e, _Alt):
                return _Alt(tuple(kids))
            if isinstance(e, _Rep):
                item = kids[0]
                if e.op != "?" and not self.regular(item):
                    changed = True
                    self.helpers += 1
                    name = f"rep{self.helpers}"
                    self.work.rule()
                    self.rules[name] = _a(_EMPTY, _s(item, _Ref(name)))
                    return _Ref(name) if e.op == "*" else _s(item, _Ref(name))
                return _Rep(item, e.op)
            return e

        for name in list(self.rules):
            self.rules[name] = _map(self.rules[name], rebuild, self.work)
        return changed

    def regular(self, item: _E) -> bool:
        table = self.out_table(item)
        return table[_L] <= {_O} and table[_O] <= {_O}

    def out_table(self, e: _E) -> _States:
        """The states ``e`` may leave in, for each state it is entered in."""
        return _fold(e, self._out_node, self.work)  # type: ignore[no-any-return]

    def _out_node(self, e: _E, kids: list[_States]) -> _States:
        if isinstance(e, _Tok):
            if e.kind == "text":
                state = frozenset({_L if e.text.endswith((" ", "(")) else _O})
            else:
                state = frozenset({_L}) if e.kind == "(" else frozenset({_O})
            return {_L: state, _O: state}
        if isinstance(e, _Ref):
            return {p: self.outs.get((e.name, p), frozenset()) for p in (_L, _O)}
        if isinstance(e, _Seq):
            out: _States = {}
            for p in (_L, _O):
                states = frozenset({p})
                for table in kids:
                    states = frozenset(q for s in states for q in table[s])
                out[p] = states
            return out
        if isinstance(e, _Alt):
            return {p: frozenset(q for table in kids for q in table[p]) for p in (_L, _O)}
        item = kids[0]
        out = {}
        for p in (_L, _O):
            reached = frozenset({p}) if e.op in "*?" else frozenset()
            frontier = item[p]
            while not frontier <= reached:
                reached |= frontier
                if e.op == "?":
                    break
                frontier = frozenset(q for s in frontier for q in item[s])
            out[p] = reached
        return out

    def start(self, name: str, p: str, q: str) -> _Ref:
        """The spaced rule of ``name`` entered in ``p`` and left in ``q``, made with every
        spaced rule it refers to (``out_rules``)."""
        found = self.work.run(self.ref(name, p, q))
        if not isinstance(found, _Ref):  # pragma: no cover
            raise TypeError("a spaced rule is a reference")
        return found

    def ref(self, name: str, p: str, q: str) -> _Call:
        out = f"{name}_{p}{q}"
        if out not in self.out_rules:
            self.work.rule()
            self.out_rules[out] = _NEVER
            spaced = self._spaced.get((name, p))
            if spaced is None:
                spaced = yield self.trans(self.rules[name], p)
                self._spaced[(name, p)] = spaced
            self.out_rules[out] = spaced.get(q, _NEVER)
        return _Ref(out)

    def trans(self, e: _E, p: str) -> _Call:
        """``e`` entered in state ``p``: its spaced forms, by the state they leave."""
        if isinstance(e, _Tok):
            if e.kind == "text":  # fixed text (the envelope's), spaced by its author
                return {_L if e.text.endswith((" ", "(")) else _O: e}
            if e.kind == ")":
                return {_O: _Tok("text", ")")}
            space = "" if p == _L else " "
            if e.kind == "(":
                return {_L: _Tok("text", space + "(")}
            if e.kind == "lit":
                return {_O: _Tok("text", space + e.text)}
            return {_O: _s(_Tok("text", " "), e) if space else e}
        if isinstance(e, _Ref):
            refs: dict[str, _E] = {}
            for q in sorted(self.outs[(e.name, p)]):
                refs[q] = yield self.ref(e.name, p, q)
            return refs
        if isinstance(e, _Seq):
            current: dict[str, _E] = {p: _EMPTY}
            for item in e.items:
                following: dict[str, list[_E]] = {}
                for s, before in current.items():
                    spaced: dict[str, _E] = yield self.trans(item, s)
                    for q, after in spaced.items():
                        following.setdefault(q, []).append(_s(before, after))
                current = {q: _a(*forms) for q, forms in following.items()}
            return current
        if isinstance(e, _Alt):
            found: dict[str, list[_E]] = {}
            for item in e.items:
                spaced = yield self.trans(item, p)
                for q, form in spaced.items():
                    found.setdefault(q, []).append(form)
            return {q: _a(*forms) for q, forms in found.items()}
        if not isinstance(e, _Rep):  # pragma: no cover (the kinds above are all)
            raise TypeError(f"not an expression: {type(e).__name__}")
        once = yield self.trans(e.item, p)
        if e.op == "?":
            result = dict(once)
            result[p] = _a(result[p], _EMPTY) if p in result else _EMPTY
            return result
        # regular: every form ends in state o (checked by _rewrite_irregular)
        first = once.get(_O, _NEVER)
        if p == _O:
            return {_O: _r(first, e.op)}
        again = yield self.trans(e.item, _O)
        more = _r(again.get(_O, _NEVER), "*")
        seq = _s(first, more)
        if e.op == "+":
            return {_O: seq}
        return {_L: _EMPTY, _O: seq}


# --------------------------------------------------------------------------------------
# Simplification and rendering


def _simplify(rules: dict[str, _E], start: str, work: _Work) -> dict[str, _E]:
    """Inline rules that match only the empty text or one token; drop unreachable ones."""
    def inline(e: _E, kids: list[_E]) -> _E:
        if isinstance(e, _Ref):
            target = rules.get(e.name)
            if target is not None and (_empty(target) or _never(target)
                                       or isinstance(target, _Tok)):
                return target
            return e
        if isinstance(e, _Seq):
            return _s(*kids)
        if isinstance(e, _Alt):
            return _a(*kids)
        if isinstance(e, _Rep):
            return _r(kids[0], e.op)
        return e

    # To a fixpoint, by a work list: a rule is simplified again when it or a rule it
    # refers to has changed (a chain of rules that each collapse into one token
    # collapses in one sweep, not in one pass over every rule per link).
    users: dict[str, set[str]] = {}
    for name, body in rules.items():
        for ref in _refs(body, work):
            users.setdefault(ref, set()).add(name)
    todo = list(reversed(rules))
    waiting = set(todo)
    while todo:
        name = todo.pop()
        waiting.discard(name)
        body = _optionals(_map(rules[name], inline, work), work)
        if body != rules[name]:
            rules[name] = body
            for again in (name, *sorted(users.get(name, ()))):
                if again not in waiting:
                    waiting.add(again)
                    todo.append(again)
    reachable: dict[str, _E] = {}
    todo = [start]
    while todo:
        name = todo.pop()
        if name in reachable:
            continue
        reachable[name] = rules[name]
        todo.extend(_refs(rules[name], work))
    return {name: rules[name] for name in rules if name in reachable}


def _optionals(e: _E, work: _Work) -> _E:
    """``a | ε`` as ``a?``; merges ``text`` tokens in sequences."""
    def rebuild(e: _E, kids: list[_E]) -> _E:
        if isinstance(e, _Seq):
            items: list[_E] = []
            for item in kids:
                if items and isinstance(item, _Tok) and item.kind == "text" \
                        and isinstance(items[-1], _Tok) and items[-1].kind == "text":
                    items[-1] = _Tok("text", items[-1].text + item.text)
                else:
                    items.append(item)
            return _s(*items)
        if isinstance(e, _Alt):
            rest = [k for item, k in zip(e.items, kids, strict=True) if not _empty(item)]
            body = _a(*rest) if rest else _EMPTY
            return _r(body, "?") if len(rest) < len(e.items) and rest else body
        if isinstance(e, _Rep):
            return _r(kids[0], e.op)
        return e

    return _map(e, rebuild, work)


def _nodes(e: _E, work: _Work) -> Iterator[_E]:
    """Every node of ``e`` (each occurrence), iteratively."""
    stack = [e]
    while stack:
        node = stack.pop()
        work.step()
        yield node
        stack.extend(reversed(_children(node)))


def _refs(e: _E, work: _Work) -> Iterator[str]:
    return (node.name for node in _nodes(e, work) if isinstance(node, _Ref))


def _tokens(e: _E, work: _Work) -> Iterator[_Tok]:
    return (node for node in _nodes(e, work) if isinstance(node, _Tok))


@dataclass(frozen=True, slots=True)
class _Dialect:
    name: str
    rule: Callable[[str], str]
    terminal: Callable[[str], str]
    text: Callable[[str], str]
    sep: str


def _lark_text(text: str) -> str:
    if all(c.isascii() and c.isprintable() and c not in '"\\' for c in text):
        return json.dumps(text)
    return "/" + _render_regex(_RLit(text), _lark_char) + "/"


def _llg_text(text: str) -> str:
    if all(c.isascii() and c.isprintable() and c not in '"\\' for c in text):
        return json.dumps(text)
    return "/" + _render_regex(_RLit(text), _rust_char) + "/"


_DIALECTS = {
    "llguidance": _Dialect("llguidance", lambda n: n, lambda n: "T_" + n.upper(), _llg_text,
                           ":"),
    "lark": _Dialect("lark", lambda n: n, lambda n: "T_" + n.upper(), _lark_text, ":"),
    "gbnf": _Dialect("gbnf", lambda n: n.replace("_", "-"),
                     lambda n: "t-" + n.lower().replace("_", "-"), _gbnf_literal, " ::="),
}


def _render_expr(e: _E, d: _Dialect, work: _Work) -> str:
    """``e`` in dialect ``d`` (iteratively: a node's text depends on whether it is at
    the top of its parent's text)."""
    return work.run(_render_node(e, d, True))  # type: ignore[no-any-return]


def _render_node(e: _E, d: _Dialect, top: bool) -> _Call:
    if isinstance(e, _Tok):
        return d.text(e.text) if e.kind == "text" else d.terminal(e.text)
    if isinstance(e, _Ref):
        return d.rule(e.name)
    if isinstance(e, _Seq):
        if not e.items:
            return '""'
        parts = []
        for item in e.items:
            parts.append((yield _render_node(item, d, False)))
        text = " ".join(parts)
        return text if top else f"({text})"
    if isinstance(e, _Alt):
        parts = []
        for item in e.items:
            parts.append((yield _render_node(item, d, True)))
        text = " | ".join(parts)
        return text if top or len(e.items) == 1 else f"({text})"
    if not isinstance(e, _Rep):  # pragma: no cover (the kinds above are all)
        raise TypeError(f"not an expression: {type(e).__name__}")
    inner = yield _render_node(e.item, d, False)
    if isinstance(e.item, _Rep):
        inner = f"({inner})"
    return inner + e.op


# --------------------------------------------------------------------------------------
# The envelope, and the public functions

_ENVELOPE_OPTIONAL = (("conversation-id", "ID"), ("in-reply-to", "ID"),
                      ("reply-by", "INTEGER"), ("timestamp", "INTEGER"))


@dataclass(frozen=True, slots=True)
class GrammarExport:
    """An export: ``text`` in ``format``, the ``intents`` it covers, and ``not_carried``,
    the constraints ``cbcl.parse`` checks that the export does not (limits, parts of the
    schema), one line each."""

    format: str
    text: str
    intents: tuple[Intent, ...]
    not_carried: tuple[str, ...]
    start: str = "start"
    #: The rules made and the steps taken, as ``LLMLimits.max_rules`` and ``max_steps``
    #: count them (for benchmarks and tests).
    work: tuple[int, int] = (0, 0)


def _descriptor_of(descriptor: ProtocolDescriptor | bytes) -> ProtocolDescriptor:
    if isinstance(descriptor, ProtocolDescriptor):
        return descriptor
    if isinstance(descriptor, (bytes, bytearray, memoryview)):
        data = bytes(descriptor)

        head = TOKEN.match(data.decode("utf-8", "replace"))
        if head is not None and data[head.end():].lstrip().startswith(b"signed-descriptor"):

            data = read_signed_descriptor_unverified(data).payload
        return read_descriptor(data)
    raise TypeError(f"a descriptor is a ProtocolDescriptor or bytes, not "
                    f"{type(descriptor).__name__}")


def _limits_of(limits: LLMLimits | None) -> LLMLimits:
    if limits is None:
        return DEFAULT_LLM_LIMITS
    if not isinstance(limits, LLMLimits):
        raise TypeError(f"limits must be LLMLimits, not {type(limits).__name__}")
    return limits


def _intents_of(descriptor: ProtocolDescriptor, intent: Intent | str | None
                ) -> tuple[Intent, ...]:
    if intent is None:
        return descriptor.intents
    try:
        chosen = Intent(intent)
    except ValueError:
        raise ValueError(f"{intent!r} is not an intent") from None
    if chosen not in descriptor.intents:
        raise ProtocolError(f"{descriptor.id} does not govern {chosen.value} (it governs "
                            + " ".join(i.value for i in descriptor.intents) + ")")
    return (chosen,)


def _lower(descriptor: ProtocolDescriptor, intents: tuple[Intent, ...], schema: bool,
           set_cap: int, work: _Work) -> tuple[_Lowerer, dict[str, list[Intent]]]:
    source = read_grammar(descriptor.grammar, starts=descriptor.start_rules)
    compiled = compile_schema(descriptor.schema) if schema and descriptor.schema is not None \
        else None
    lowerer = _Lowerer(source, compiled, set_cap, work)
    by_rule: dict[str, list[Intent]] = {}
    for intent in intents:
        by_rule.setdefault(descriptor.starts[intent], []).append(intent)
    for rule in by_rule:
        body_type: _Type = _Body(compiled) if compiled is not None else None
        ref = work.run(lowerer.rule_ref(rule, body_type, "value", "$.body"))
        lowerer.new_rule("body_" + rule)
        lowerer.rules["body_" + rule] = ref
    return lowerer, by_rule


def _envelope(descriptor: ProtocolDescriptor, lowerer: _Lowerer,
              by_rule: Mapping[str, list[Intent]]) -> _E:
    """The message rule: the envelope of §2 with the body of each intent (canonical
    spacing written out: the envelope is fixed text around its atoms)."""
    ident = lowerer.terminal("STRING", AtomType("string", min_length=1))
    uri = lowerer.terminal("URI")
    integer = lowerer.terminal("INTEGER")
    optional: list[_E] = []
    for name, kind in _ENVELOPE_OPTIONAL:
        optional.append(_r(_s(_Tok("text", f" ({name} "), ident if kind == "ID" else integer,
                              _Tok("text", ")")), "?"))
    choices: list[_E] = []
    for rule, intents in by_rule.items():
        names = _a(*(_Tok("text", i.value) for i in intents))
        choices.append(_s(names, _Tok("text", f") (protocol {descriptor.id})"), *optional,
                          _Tok("text", " (body "), _Ref("body_" + rule), _Tok("text", "))")))
    return _s(_Tok("text", "(CBCL/1.0 (message-id "), ident, _Tok("text", ") (sender "), uri,
              _Tok("text", ") (receiver "), uri, _Tok("text", ") (intent "), _a(*choices))


class _Output:
    """The lines of an export, bounded by ``max_output_bytes`` as they are added."""

    def __init__(self, work: _Work) -> None:
        self.work = work
        self.lines: list[str] = []
        self.size = 0

    def add(self, line: str) -> None:
        self.size += len(line.encode("utf-8", "surrogatepass")) + 1
        if self.size > self.work.limits.max_output_bytes:
            raise self.work.limits.exceeded("max_output_bytes", self.work.what)
        self.lines.append(line)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def export_grammar(descriptor: ProtocolDescriptor | bytes, format: str = "llguidance", *,
                   intent: Intent | str | None = None, schema: bool = True,
                   keyword_set_cap: int = KEYWORD_SET_CAP,
                   limits: LLMLimits | None = None) -> GrammarExport:
    """The grammar of the canonical messages of ``descriptor``'s protocol (spec/llm.md).

    ``format`` is ``llguidance`` (llguidance's Lark dialect), ``gbnf`` (llama.cpp,
    XGrammar), ``lark`` (the Python lark library, ``parser="earley"``) or ``json-schema``
    (the JSON mapping, :func:`export_json_schema`). With ``intent`` the messages of that
    intent only; without, every governed intent, each with its own body rule. With
    ``schema`` (the default) the descriptor's schema is compiled in where a grammar can
    carry it. The text starts with comment lines naming what is not carried (also in
    ``not_carried``). ``descriptor`` is a :class:`ProtocolDescriptor` or the bytes of a
    descriptor, signed or not (a signature is not verified: an export trusts nothing).
    ``limits`` (default :class:`~cbcl.core._limits.LLMLimits`) bound the work: rules
    made, steps, the text's size (and the JSON Schema's nesting).

    Raises ``ValueError`` for an unknown format or intent name, :class:`ProtocolError`
    for an intent the protocol does not govern, :class:`LimitError` naming the
    :class:`LLMLimits` budget an export would exceed, and what reading the descriptor
    raises (:class:`DescriptorError`, :class:`GrammarError`, :class:`MalformedError` …).
    """
    budget = _limits_of(limits)
    if format == "json-schema":
        work = _Work(budget)
        document, notes, intents = _json_schema(descriptor, intent, schema, keyword_set_cap,
                                                work)
        notes = (*notes, *constraints_not_carried(_descriptor_of(descriptor).constraints))
        text = json.dumps(document, indent=1, ensure_ascii=True) + "\n"
        if len(text) > budget.max_output_bytes:  # (ASCII: characters are bytes)
            raise budget.exceeded("max_output_bytes", "the export")
        return GrammarExport(format, text, intents, notes, work=(work.rules, work.steps))
    dialect = _DIALECTS.get(format)
    if dialect is None:
        raise ValueError(f"unknown format {format!r} (formats: {', '.join(FORMATS)})")
    if type(keyword_set_cap) is not int or not 0 <= keyword_set_cap <= 16:
        raise ValueError("keyword_set_cap must be an int from 0 to 16")
    desc = _descriptor_of(descriptor)
    intents = _intents_of(desc, intent)
    work = _Work(budget)
    lowerer, by_rule = _lower(desc, intents, schema, keyword_set_cap, work)
    lowerer.rules["message"] = _envelope(desc, lowerer, by_rule)
    spacer = _Spacer(lowerer.rules, work)
    start = spacer.start("message", _L, _O)
    rules = _simplify(dict(spacer.out_rules), start.name, work)
    notes = (*LIMITS_NOT_CARRIED, *lowerer.notes, *constraints_not_carried(desc.constraints))
    if format == "gbnf":
        notes = (*notes, "gbnf: a string's characters are code points; a decoder must "
                 "produce well-formed UTF-8")
    used_terminals = {t.text for e in rules.values() for t in _tokens(e, work)
                      if t.kind == "term"}
    comment = "#" if format == "gbnf" else "//"
    out = _Output(work)
    out.add(f"{comment} CBCL {desc.id} version {desc.version} ({desc.digest}): canonical "
            "messages, " + ("intent " + intents[0].value if intent is not None
                            else "every intent"))
    out.add(f"{comment} not carried (cbcl.parse checks them):")
    for note in notes:
        out.add(f"{comment}   {note}")
    if format == "llguidance":
        out.add("%llguidance {}")
    head = "root" if format == "gbnf" else "start"
    out.add(f"{head}{dialect.sep} {dialect.rule(start.name)}")
    for name, body in rules.items():
        out.add(f"{dialect.rule(name)}{dialect.sep} {_render_expr(body, dialect, work)}")
    for name in lowerer.terminals:
        if name not in used_terminals:
            continue
        regex = lowerer.terminals[name]
        if format == "gbnf":
            out.add(f"{dialect.terminal(name)} ::= {_render_gbnf_regex(regex)}")
        elif format == "lark":
            out.add(f"{dialect.terminal(name)}: /{_render_regex(regex, _lark_char)}"
                    r"(?=[\ \)]|\Z)/")
        else:
            out.add(f"{dialect.terminal(name)}: /{_render_regex(regex, _rust_char)}/")
    return GrammarExport(format, out.text(), intents, notes,
                         "root" if format == "gbnf" else "start", (work.rules, work.steps))


# --------------------------------------------------------------------------------------
# JSON Schema (spec §7)

_JSON_SAFE = 2**53 - 1


class _Approximate(Exception):
    """A list whose element sequences the JSON Schema cannot state exactly."""


#: An element sequence: ("elem", schema), ("seq", [...]), ("alt", [...]) or ("rep", x, op).
#: Rules are inlined where they are not one value, so one is a DAG: the walkers below
#: visit each node once (by identity) and never recurse.
_ERe: TypeAlias = tuple[Any, ...]


def _ere_children(regex: _ERe) -> list[_ERe]:
    kind = regex[0]
    if kind == "rep":
        return [regex[1]]
    if kind in ("seq", "alt"):
        return list(regex[1])
    return []


class _EReFold:
    """``combine(node, results of its children)`` over element sequences, children
    first, each node object once (remembered by identity, with the node kept alive so
    that an identity is never reused), iteratively, each node a step."""

    def __init__(self, combine: Callable[[_ERe, list[Any]], Any], work: _Work) -> None:
        self.combine = combine
        self.work = work
        self.done: dict[int, tuple[_ERe, Any]] = {}

    def __call__(self, regex: _ERe) -> Any:
        done = self.done
        stack: list[tuple[_ERe, bool]] = [(regex, False)]
        while stack:
            node, expanded = stack.pop()
            if id(node) in done:
                continue
            kids = _ere_children(node)
            if kids and not expanded:
                stack.append((node, True))
                stack.extend((kid, False) for kid in reversed(kids) if id(kid) not in done)
                continue
            self.work.step()
            done[id(node)] = (node, self.combine(node, [done[id(kid)][1] for kid in kids]))
        return done[id(regex)][1]


class _JsonBuilder:
    def __init__(self, lowerer: _Lowerer, work: _Work) -> None:
        self.lowerer = lowerer
        self.work = work
        self.rules = lowerer.rules
        self.defs: dict[str, Any] = {}
        self.notes: list[str] = []
        self.busy: set[str] = set()
        self.not_values: set[str] = set()
        #: the element sequences of rules that are not one value, once computed
        self.inlined: dict[str, _ERe] = {}
        self.single = _EReFold(_single_node, work)
        self.enumerate = _EReFold(_enumerate_node, work)
        self.all_elements = _EReFold(_all_elements_node, work)
        self.min_length = _EReFold(_min_length_node, work)

    # ------------------------------------------------------------ atoms

    def terminal(self, name: str) -> Any:
        if name not in self.defs:
            self.defs[name] = self.terminal_schema(name)
        return {"$ref": f"#/$defs/{name}"}

    def terminal_schema(self, name: str) -> Any:
        kind, atom = self.lowerer.terminal_info[name]
        regex = self.lowerer.terminals[name]
        if kind == "STRING":
            out: dict[str, Any] = {"type": "string"}
            if atom is not None and atom.min_length is not None:
                out["minLength"] = atom.min_length
            if atom is not None and atom.max_length is not None:
                out["maxLength"] = atom.max_length
            if atom is not None and atom.pattern is not None:
                chars = _pattern_regex(compile_pattern(atom.pattern).tree, wire=False)
                out["pattern"] = _pattern(chars) if chars is not None else "[^\\s\\S]"
            return out
        if kind == "INTEGER":
            low, high = INT64_MIN, INT64_MAX
            if atom is not None and atom.low is not None:
                low = max(low, math.ceil(atom.low))
            if atom is not None and atom.high is not None:
                high = min(high, math.floor(atom.high))
            forms: list[Any] = []
            if max(low, -_JSON_SAFE) <= min(high, _JSON_SAFE):
                forms.append({"type": "integer", "minimum": max(low, -_JSON_SAFE),
                              "maximum": min(high, _JSON_SAFE)})
            forms.append(_tagged("int", regex))
            return forms[0] if len(forms) == 1 else {"anyOf": forms}
        if kind == "KEYWORD":
            if not isinstance(regex, _RSeq):  # pragma: no cover (":" then a name)
                raise TypeError("a keyword's expression is a sequence")
            return _tagged("keyword", _seq(*regex.items[1:]))
        return _tagged(kind.lower(), regex)

    def literal(self, text: str) -> Any:

        value = read(text.encode("utf-8"))
        mapped = to_json(value)
        if type(value) is int:
            return {"anyOf": [{"const": mapped}, {"const": {"int": str(value)}}]} \
                if -_JSON_SAFE <= value <= _JSON_SAFE else {"const": mapped}
        return {"const": mapped}

    # ------------------------------------------------------------ element sequences

    def elements(self, e: _E) -> _Call:
        """The elements ``e`` contributes to the list it is in."""
        if isinstance(e, _Tok):
            if e.kind in "()":
                raise _Approximate  # an unbalanced parenthesis across rules
            return ("elem", self.literal(e.text) if e.kind == "lit" else self.terminal(e.text))
        if isinstance(e, _Ref):
            if e.name == "value":
                return ("elem", {"$ref": "#/$defs/value"})
            if e.name in self.defs:
                return ("elem", {"$ref": f"#/$defs/{e.name}"})
            inlined = self.inlined.get(e.name)
            if inlined is not None:
                return inlined
            if e.name in self.busy:
                raise _Approximate  # recursion at one list level
            self.busy.add(e.name)
            try:
                regex = yield self.elements(self.rules[e.name])
            finally:
                self.busy.discard(e.name)
            single = self.single(regex)
            if single is not None and e.name not in self.not_values:
                self.defs[e.name] = single
                return ("elem", {"$ref": f"#/$defs/{e.name}"})
            self.not_values.add(e.name)
            self.inlined[e.name] = regex
            return regex
        if isinstance(e, _Alt):
            alternatives = []
            for item in e.items:
                alternatives.append((yield self.elements(item)))
            return ("alt", alternatives)
        if isinstance(e, _Rep):
            return ("rep", (yield self.elements(e.item)), e.op)
        out: list[_ERe] = []
        items = e.items
        i = 0
        while i < len(items):
            item = items[i]
            if isinstance(item, _Tok) and item.kind == "(":
                depth, j = 0, i
                while j < len(items):
                    t = items[j]
                    if isinstance(t, _Tok) and t.kind in "()":
                        depth += 1 if t.kind == "(" else -1
                        if depth == 0:
                            break
                    j += 1
                self.work.step(j - i)
                if j == len(items):
                    raise _Approximate
                out.append(("elem", (yield self.array(_s(*items[i + 1:j])))))
                i = j + 1
                continue
            out.append((yield self.elements(item)))
            i += 1
        return ("seq", out)

    def array(self, inner: _E) -> _Call:
        """The schema of a list whose elements are ``inner``."""
        regex = yield self.elements(inner)
        sequences = self.enumerate(regex)
        if sequences is not None:
            forms = [{"type": "array", "prefixItems": seq, "minItems": len(seq),
                      "items": False} if seq else {"type": "array", "maxItems": 0}
                     for seq in sequences]
            return forms[0] if len(forms) == 1 else {"anyOf": forms}
        prefix, rest = _split_prefix(regex)
        schemas = self.all_elements(rest)
        out: dict[str, Any] = {"type": "array",
                               "minItems": len(prefix) + self.min_length(rest)}
        if prefix:
            out["prefixItems"] = prefix
        out["items"] = {"anyOf": schemas} if len(schemas) > 1 else schemas[0] if schemas \
            else False
        shown = json.dumps(prefix[0]) if prefix else "a list"
        self.notes.append(f"json-schema: the order of the elements after the first of "
                          f"{shown[:60]} (any element that may occur is allowed)")
        return out

    def value_schema(self, e: _E) -> Any:
        regex = self.work.run(self.elements(e))
        sequences = self.enumerate(regex)
        if sequences is None or any(len(seq) != 1 for seq in sequences):
            raise _Approximate
        schemas = []
        for seq in sequences:
            if seq[0] not in schemas:
                schemas.append(seq[0])
        return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}

    def value_defs(self) -> None:
        atoms = [self.terminal(self.lowerer.terminal(k).text)  # type: ignore[union-attr]
                 for k in _KINDS]
        self.defs["value"] = {"anyOf": [*atoms, {"type": "array",
                                                 "items": {"$ref": "#/$defs/value"}}]}


def _single_node(regex: _ERe, kids: list[Any]) -> Any:
    """The schema of the one element every sequence of ``regex`` has, or ``None``."""
    kind = regex[0]
    if kind == "elem":
        return regex[1]
    if kind == "seq" and len(kids) == 1:
        return kids[0]
    if kind == "alt" and kids:
        if any(x is None for x in kids):
            return None
        unique: list[Any] = []
        for x in kids:
            if x not in unique:
                unique.append(x)
        return unique[0] if len(unique) == 1 else {"anyOf": unique}
    return None


def _tagged(tag: str, regex: _Re) -> Any:
    return {"type": "object", "properties": {tag: {"type": "string", "pattern": _pattern(regex)}},
            "required": [tag], "additionalProperties": False}


def _enumerate_node(regex: _ERe, kids: list[Any]) -> list[list[Any]] | None:
    """Every element sequence of ``regex``, or ``None`` if infinite or more than
    :data:`JSON_SEQUENCES_CAP` (``kids``: the children's)."""
    cap = JSON_SEQUENCES_CAP
    kind = regex[0]
    if kind == "elem":
        return [[regex[1]]]
    if kind == "rep":
        if regex[2] != "?":
            return None
        inner = kids[0]
        return None if inner is None or len(inner) + 1 > cap else [[], *inner]
    if kind == "alt":
        singles = [r for r in regex[1] if r[0] == "elem"]
        out: list[list[Any]] = []
        if len(singles) > 1:
            out.append([{"anyOf": [r[1] for r in singles]}])
        elif singles:
            out.append([singles[0][1]])
        for r, found in zip(regex[1], kids, strict=True):
            if r[0] == "elem":
                continue
            if found is None:
                return None
            out += [seq for seq in found if seq not in out]
            if len(out) > cap:
                return None
        return out
    result: list[list[Any]] = [[]]
    for found in kids:
        if found is None or len(found) * len(result) > cap:
            return None
        result = [a + b for a in result for b in found]
    return result


def _split_prefix(regex: _ERe) -> tuple[list[Any], _ERe]:
    if regex[0] != "seq":
        return [], regex
    prefix: list[Any] = []
    parts = list(regex[1])
    while parts and parts[0][0] == "elem":
        prefix.append(parts.pop(0)[1])
    return prefix, ("seq", parts)


def _all_elements_node(regex: _ERe, kids: list[list[Any]]) -> list[Any]:
    if regex[0] == "elem":
        return [regex[1]]
    out: list[Any] = []
    for schemas in kids:
        for schema in schemas:
            if schema not in out:
                out.append(schema)
    return out


def _min_length_node(regex: _ERe, kids: list[int]) -> int:
    kind = regex[0]
    if kind == "elem":
        return 1
    if kind == "rep":
        return 0 if regex[2] != "+" else kids[0]
    if kind == "alt":
        return min(kids, default=0)
    return sum(kids)


def _json_depth(document: Any, work: _Work) -> int:
    """How deep ``document``'s objects and arrays nest (iteratively)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        node, depth = stack.pop()
        work.step()
        deepest = max(deepest, depth)
        if isinstance(node, dict):
            stack.extend((value, depth + 1) for value in node.values()
                         if isinstance(value, (dict, list)))
        elif isinstance(node, list):
            stack.extend((value, depth + 1) for value in node
                         if isinstance(value, (dict, list)))
    return deepest


def _json_schema(descriptor: ProtocolDescriptor | bytes, intent: Intent | str | None,
                 schema: bool, set_cap: int, work: _Work
                 ) -> tuple[dict[str, Any], tuple[str, ...], tuple[Intent, ...]]:
    limits = work.limits
    desc = _descriptor_of(descriptor)
    intents = _intents_of(desc, intent)
    lowerer, by_rule = _lower(desc, intents, schema, set_cap, work)
    builder = _JsonBuilder(lowerer, work)
    builder.value_defs()
    identifier = {"type": "string", "minLength": 1}
    integer = builder.terminal(lowerer.terminal("INTEGER").text)  # type: ignore[union-attr]
    uri = {"type": "string", "pattern": _pattern(_uri_regex(None))}
    forms: list[Any] = []
    for rule, rule_intents in by_rule.items():
        body_rule = "body_" + rule
        try:
            body = builder.value_schema(lowerer.rules[body_rule])
        except _Approximate:
            builder.notes.append(f"json-schema: the body of {rule}: any value")
            body = {"$ref": "#/$defs/value"}
        names = [i.value for i in rule_intents]
        forms.append({
            "type": "object",
            "properties": {
                "version": {"const": "CBCL/1.0"}, "message-id": identifier,
                "sender": uri, "receiver": uri,
                "intent": {"const": names[0]} if len(names) == 1 else {"enum": names},
                "protocol": {"const": str(desc.id)},
                "conversation-id": identifier, "in-reply-to": identifier,
                "reply-by": integer, "timestamp": integer, "body": body,
            },
            "required": ["version", "message-id", "sender", "receiver", "intent", "protocol",
                         "body"],
            "additionalProperties": False,
        })
    document: dict[str, Any] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"CBCL {desc.id} version {desc.version} messages (JSON mapping, spec §7)",
        "$comment": f"descriptor {desc.digest}; not carried: "
                    + "; ".join((*LIMITS_NOT_CARRIED, *lowerer.notes, *builder.notes,
                                 *_JSON_NOTES)),
    }
    if len(forms) == 1:
        document.update(forms[0])
    else:
        document["anyOf"] = forms
    document["$defs"] = builder.defs
    # Checked before anything walks the document recursively (json.dumps, validators).
    if _json_depth(document, work) > limits.max_json_depth:
        raise limits.exceeded("max_json_depth", "the JSON Schema export")
    notes = tuple(dict.fromkeys((*LIMITS_NOT_CARRIED, *lowerer.notes, *builder.notes,
                                 *_JSON_NOTES)))
    return document, notes, intents


_JSON_NOTES = (
    "json-schema: JSON numbers with a zero fraction (1.0) pass \"type\": \"integer\"; the "
    "mapping refuses them",
    "json-schema: a pattern's $ also matches before a final line feed in Python re "
    "(jsonschema); ECMA-262 (Ajv) and XGrammar read it as the end",
    "json-schema: strings holding lone surrogates",
    "json-schema: duplicate member names in one JSON object (a validator sees the object its "
    "JSON reader made, which kept one of them)",
)


def export_json_schema(descriptor: ProtocolDescriptor | bytes, *,
                       intent: Intent | str | None = None, schema: bool = True,
                       limits: LLMLimits | None = None) -> dict[str, Any]:
    """The JSON Schema (2020-12) of the JSON mapping (spec §7.2) of the protocol's messages
    (of ``intent``, or of every governed intent). See :func:`export_grammar`."""
    document, _, _ = _json_schema(descriptor, intent, schema, KEYWORD_SET_CAP,
                                  _Work(_limits_of(limits)))
    return document
