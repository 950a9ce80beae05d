"""Schemas: semantic hints for keyword-argument lists (spec/conversations.md §2).

A ``(schema …)`` section lists *records*, each naming the head symbol(s) of a body and the
keys that may follow: their types, ranges, lengths, and which are required. The grammar
has already said what a body may look like; the schema says what its values mean:

    (schema
      (record task
        (:id (string :min-length 1 :max-length 64) required)
        (:resources (keys (:cpu (integer :min 1 :max 64) required)
                          (:mem (integer :min 1 :max 1048576))))
        (:deadline any)))

Theory of operation. A section is compiled once (:func:`compile_schema`, which raises
:class:`DescriptorError` for a malformed schema) into immutable type objects. When a
composite type is built it also works out how to check its children (as data and small
closures, never generated code: a schema comes from an untrusted descriptor):

* a *spec* per child: the Python types it may have and at most one further check (a length
  range, numeric bounds, a predicate such as ``one-of``, or "a list, checked later"); most
  atoms need only the type test;
* for ``keys`` and ``record``, a :class:`_Pairs`: per field its bit (repeated and missing
  required keys are integer operations), its spec and the field listed after it, so that a
  body listing its keys in the schema's order finds each by identity. The reader shares
  symbols and keywords, and the tables are keyed by those same shared objects.

Checking a body (:func:`check_schema`) takes one pass, or two when the body is refused:

1. Where the extension is built, its C twin (``cbcl._native.schema_valid``) decides from
   the specs and :class:`_Pairs` above, in one loop with explicit work lists (never
   recursion: a body may be thousands deep), building no paths. Most bodies end here,
   accepted. It may decline (a type of more than 63 fields, a Python value outside the
   value model) but never accepts what the explaining pass refuses.
2. Otherwise, and whenever the C twin refuses, the explaining pass (:func:`_explain`, the
   reference) walks the body in reading order, the way the rules are written, and raises
   :class:`SchemaError` at the first violation, with a path such as
   ``$.body.task[:resources][:cpu]`` (built as text only then). This pass is the
   definition, and the whole check where the extension is not built.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from operator import is_
from typing import Any, TypeAlias, Union, cast

from ..core._canonical import canonical_prefix, canonical_value
from ..core._errors import DescriptorError, SchemaError
from ..core._reader import intern_keyword, intern_symbol
from ..core._values import URI, Keyword, Symbol, Value
from ._patterns import Pattern, PatternError, compile_pattern, describe_pattern

MAX_TYPE_DEPTH = 32

_ATOM_KINDS: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "decimal": (Decimal,), "number": (int, Decimal),
    "symbol": (Symbol,), "keyword": (Keyword,), "uri": (URI,), "boolean": (Symbol,),
    "any": (),
}
_SHOWN = {"string": "a string", "integer": "an integer", "decimal": "a decimal",
          "number": "a number", "symbol": "a symbol", "keyword": "a keyword", "uri": "a URI",
          "boolean": "a boolean (true or false)", "any": "any value"}
_OPTIONS: dict[str, tuple[str, ...]] = {
    "string": ("min-length", "max-length", "pattern"), "symbol": ("min-length", "max-length"),
    "integer": ("min", "max"), "decimal": ("min", "max"), "number": ("min", "max"),
    "uri": ("scheme",), "keyword": (), "boolean": (), "any": (),
}
_BOOLEANS = (Symbol("true"), Symbol("false"))
REQUIRED = Symbol("required")
ELSE = Symbol("else")


@dataclass(frozen=True, slots=True)
class AtomType:
    """An atom of one kind (``any`` matches every value), with optional bounds:
    ``low``/``high`` for numbers, ``min_length``/``max_length`` (characters) for strings and
    symbols, ``scheme`` for URIs, ``pattern`` (the text of a pattern of the safe subset,
    :mod:`cbcl.protocol._patterns`, matched against the whole string) for strings."""

    kind: str
    low: int | Decimal | None = None
    high: int | Decimal | None = None
    min_length: int | None = None
    max_length: int | None = None
    scheme: str | None = None
    pattern: str | None = None

    def describe(self) -> str:
        text = _SHOWN[self.kind]
        if self.low is not None or self.high is not None:
            text += f" in [{_show(self.low) if self.low is not None else '…'}, " \
                    f"{_show(self.high) if self.high is not None else '…'}]"
        if self.min_length is not None or self.max_length is not None:
            text += f" of {self.min_length or 0} to {self.max_length or '…'} characters"
        if self.scheme is not None:
            text += f" with scheme {self.scheme}"
        if self.pattern is not None:
            text += " " + describe_pattern(self.pattern)
        return text


@dataclass(frozen=True, slots=True)
class OneOf:
    """Exactly one of the listed atoms (compared as values: ``1`` is not ``1.0``)."""

    values: tuple[Value, ...]

    def describe(self) -> str:
        return "one of " + " ".join(canonical_value(v) for v in self.values)


@dataclass(frozen=True, slots=True)
class ListOf:
    """A list whose every element has type ``item``, with optional length bounds."""

    item: SchemaType
    min_length: int | None = None
    max_length: int | None = None
    #: The element's spec (derived, for the C twin).
    _item: _Spec = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_item", _spec_of(self.item))

    def __reduce__(self) -> tuple[type, tuple[Any, ...]]:  # (derived fields are rebuilt)
        return ListOf, (self.item, self.min_length, self.max_length)

    def describe(self) -> str:
        return "a list"


@dataclass(frozen=True, slots=True)
class Keys:
    """A keyword-argument list ``(:k v …)``: the allowed keys and their types, which are
    required, and (``other``) the type of any key not listed, or ``None`` to refuse it."""

    fields: dict[Keyword, SchemaType] = field(hash=False)
    required: tuple[Keyword, ...]
    other: SchemaType | None = None
    #: How the C twin checks it (derived).
    _pairs: _Pairs = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_pairs", _Pairs(self))

    def __reduce__(self) -> tuple[type, tuple[Any, ...]]:  # (derived fields are rebuilt)
        return Keys, (self.fields, self.required, self.other)

    def describe(self) -> str:
        return "a keyword-argument list"


@dataclass(frozen=True, slots=True)
class Record:
    """A list that starts with the symbols ``heads`` and continues as :class:`Keys`."""

    heads: tuple[Symbol, ...]
    keys: Keys
    #: How the C twin checks it: as its keys, after its heads (derived).
    _pairs: _Pairs = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_pairs", _Pairs(self.keys, self.heads))

    def __reduce__(self) -> tuple[type, tuple[Any, ...]]:  # (derived fields are rebuilt)
        return Record, (self.heads, self.keys)

    def describe(self) -> str:
        return "(" + " ".join(self.heads) + " …)"


SchemaType = Union[AtomType, OneOf, ListOf, Keys, Record]  # noqa: UP007


@dataclass(frozen=True, slots=True)
class Schema:
    """A compiled ``(schema …)`` section: its records, matched in order by their heads."""

    records: tuple[Record, ...]
    #: The records by their first head symbol, in order (derived; for a quick lookup).
    by_head: dict[Symbol, tuple[Record, ...]] = field(init=False, repr=False, compare=False,
                                                      hash=False)
    #: The head symbols whose first record has that one head: it is the answer (derived).
    _sole: dict[Symbol, Record] = field(init=False, repr=False, compare=False, hash=False)
    #: The records by first head, with their heads as shared symbols; only records whose
    #: heads are all symbols (no other can match a body) (derived).
    _candidates: dict[Symbol, tuple[tuple[Record, tuple[Symbol, ...]], ...]] = field(
        init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        by_head: dict[Symbol, list[Record]] = {}
        for record in self.records:
            head = record.heads[0]
            if type(head) is Symbol:  # the shared symbol: a body's head is found by identity
                head = intern_symbol(str.__str__(head), pin=True)
            by_head.setdefault(head, []).append(record)
        object.__setattr__(self, "by_head", {k: tuple(v) for k, v in by_head.items()})
        candidates = {head: tuple((r, r._pairs.heads) for r in records
                                  if all(type(h) is Symbol for h in r.heads))
                      for head, records in by_head.items()}
        object.__setattr__(self, "_candidates", candidates)
        object.__setattr__(self, "_sole", {head: v[0][0] for head, v in candidates.items()
                                           if v and len(v[0][1]) == 1})

    def __reduce__(self) -> tuple[type, tuple[Any, ...]]:  # (derived fields are rebuilt)
        return Schema, (self.records,)

    def record_index(self) -> tuple[dict[Symbol, Any], dict[Symbol, tuple[Any, ...]]]:
        """What :meth:`record_for` looks records up by, each record as its ``_Pairs`` (the
        form the schema's C twin reads): the head symbols whose first record has that
        one head, and every head's ``(pairs, heads)`` to try in order. For C twins
        (``cbcl._native``, through :attr:`cbcl.protocol._protocol.Protocol.acceptance`)."""
        return ({head: record._pairs for head, record in self._sole.items()},
                {head: tuple((record._pairs, heads) for record, heads in tried)
                 for head, tried in self._candidates.items()})

    def record_for(self, body: Value) -> Record | None:
        """The first record whose head symbols start ``body``, or ``None``."""
        if type(body) is not tuple or not body or type(body[0]) is not Symbol:
            return None
        head = body[0]
        record = self._sole.get(head)
        if record is not None:
            return record
        for record, heads in self._candidates.get(head, ()):
            if len(body) >= len(heads) and (all(map(is_, body, heads))  # (shared symbols)
                                            or _starts_with(body, heads)):
                return record
        return None


def _starts_with(items: tuple[Value, ...], heads: tuple[Symbol, ...]) -> bool:
    """True if ``items`` (no shorter) starts with the symbols ``heads``."""
    return all(type(items[i]) is Symbol and items[i] == head for i, head in enumerate(heads))


def _has_heads(items: tuple[Value, ...], heads: tuple[Symbol, ...]) -> bool:
    """:func:`_starts_with`, quicker for the symbols the reader shares (as ``heads`` are)."""
    return ((items[0] is heads[0] and len(heads) == 1) or all(map(is_, items, heads))
            or _starts_with(items, heads))


def _show(value: Value) -> str:
    return canonical_value(value)


# --------------------------------------------------------------------------- compiling

class _Bad(Exception):
    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path


def _options(items: tuple[Value, ...], allowed: tuple[str, ...], where: str,
             offset: int) -> dict[str, Value]:
    if len(items) % 2:
        raise _Bad("options are :name value pairs; one is missing its value",
                   f"{where}[{offset + len(items) - 1}]")
    found: dict[str, Value] = {}
    for i in range(0, len(items), 2):
        key = items[i]
        at = f"{where}[{offset + i}]"
        if type(key) is not Keyword or str(key) not in allowed:
            raise _Bad(f"unknown option {_show(key)} (allowed: "
                       + (" ".join(":" + a for a in allowed) or "none") + ")", at)
        if str(key) in found:
            raise _Bad(f"option {key.text} is repeated", at)
        found[str(key)] = items[i + 1]
    return found


def _length(value: Value, at: str) -> int:
    if type(value) is not int or value < 0:
        raise _Bad("a length bound is an integer ≥ 0", at)
    return value


def _compile_type(value: Value, where: str, depth: int) -> SchemaType:
    if depth > MAX_TYPE_DEPTH:
        raise _Bad(f"types nested more than {MAX_TYPE_DEPTH} deep", where)
    if type(value) is Symbol:
        if str(value) not in _ATOM_KINDS:
            raise _Bad(f"unknown type {value}", where)
        return AtomType(str(value))
    if type(value) is not tuple or not value or type(value[0]) is not Symbol:
        raise _Bad(f"expected a type (a name or a (name …) list), found {_show(value)}", where)
    name = str(value[0])
    if name in _ATOM_KINDS:
        opts = _options(value[1:], _OPTIONS[name], where, 1)
        numeric = (int,) if name == "integer" else (int, Decimal)
        for key in ("min", "max"):
            bound = opts.get(key)
            if bound is not None and type(bound) not in numeric:
                raise _Bad(f":{key} of {name} must be " + ("an integer" if name == "integer"
                                                            else "a number"), where)
        # (each checked just above)
        low = cast("int | Decimal | None", opts.get("min"))
        high = cast("int | Decimal | None", opts.get("max"))
        if low is not None and high is not None and low > high:
            raise _Bad(":min is greater than :max", where)
        lo_len = _length(opts["min-length"], where) if "min-length" in opts else None
        hi_len = _length(opts["max-length"], where) if "max-length" in opts else None
        if lo_len is not None and hi_len is not None and lo_len > hi_len:
            raise _Bad(":min-length is greater than :max-length", where)
        scheme = opts.get("scheme")
        if scheme is not None and type(scheme) is not Symbol:
            raise _Bad(":scheme is a symbol such as agent", where)
        pattern = opts.get("pattern")
        if pattern is not None:
            if type(pattern) is not str:
                raise _Bad(":pattern is a string such as \"S-[0-9]+\"", where)
            try:
                compiled = compile_pattern(pattern)
            except PatternError as exc:
                raise _Bad(str(exc), where) from None
            _spend_on_patterns(compiled, where)
        return AtomType(name, low, high, lo_len, hi_len,
                        None if scheme is None else str(scheme), pattern)
    if name == "one-of":
        items = value[1:]
        if not items:
            raise _Bad("one-of lists at least one value", where)
        seen: set[str] = set()
        for i, item in enumerate(items, 1):
            if type(item) is tuple:
                raise _Bad("one-of lists atoms", f"{where}[{i}]")
            text = _show(item)
            if text in seen:
                raise _Bad(f"one-of lists {text} twice", f"{where}[{i}]")
            seen.add(text)
        return OneOf(tuple(items))
    if name == "list-of":
        if len(value) < 2:
            raise _Bad("list-of needs an element type", where)
        element = _compile_type(value[1], f"{where}[1]", depth + 1)
        opts = _options(value[2:], ("min-length", "max-length"), where, 2)
        lo_len = _length(opts["min-length"], where) if "min-length" in opts else None
        hi_len = _length(opts["max-length"], where) if "max-length" in opts else None
        if lo_len is not None and hi_len is not None and lo_len > hi_len:
            raise _Bad(":min-length is greater than :max-length", where)
        return ListOf(element, lo_len, hi_len)
    if name == "keys":
        return _compile_keys(value[1:], where, 1, depth)
    if name == "record":
        heads: list[Symbol] = []
        i = 1
        while i < len(value) and type(head := value[i]) is Symbol:
            heads.append(head)
            i += 1
        if not heads:
            raise _Bad("a record starts with its head symbol(s): (record task …)", where)
        return Record(tuple(heads), _compile_keys(value[i:], where, i, depth))
    raise _Bad(f"unknown type {name}", where)


def _compile_keys(items: tuple[Value, ...], where: str, offset: int, depth: int) -> Keys:
    fields: dict[Keyword, SchemaType] = {}
    required: list[Keyword] = []
    other: SchemaType | None = None
    for i, item in enumerate(items, offset):
        at = f"{where}[{i}]"
        if type(item) is tuple and len(item) == 2 and item[0] == ELSE:
            if other is not None:
                raise _Bad("(else …) is repeated", at)
            other = _compile_type(item[1], f"{at}[1]", depth + 1)
            continue
        if type(item) is not tuple or len(item) not in (2, 3) or type(item[0]) is not Keyword:
            raise _Bad("expected a field (:key TYPE) or (:key TYPE required), or (else TYPE)",
                       at)
        key: Keyword = item[0]
        if key in fields:
            raise _Bad(f"key {key.text} is listed twice", at)
        if len(item) == 3:
            if item[2] != REQUIRED:
                raise _Bad(f"expected required after the type, found {_show(item[2])}",
                           f"{at}[2]")
            required.append(key)
        fields[key] = _compile_type(item[1], f"{at}[1]", depth + 1)
    return Keys(fields, tuple(required), other)


def compile_schema(section: Value) -> Schema:
    """Compile a ``(schema (record …) …)`` section. Raises :class:`DescriptorError` naming
    the path of the problem inside the section (``$.schema[1][3]``)."""
    key = canonical_value(section)  # by text: (one-of 1) and (one-of 1.0) differ
    cached = _CACHE.get(key)
    if cached is None:
        cached = _compile(section)
        if len(key) <= _CACHE_CHARS:
            with _CACHE_LOCK:  # (the eviction iterates: one thread at a time)
                while len(_CACHE) >= _CACHE_MAX:
                    del _CACHE[next(iter(_CACHE))]  # the oldest first
                _CACHE[key] = cached
    return cached


# Compiled schemas by the canonical text of their section: the descriptor's checks, its
# protocol and every check_schema() given a section as read compile the same section.
# A process-wide memo (spec/cbcl-1.0.md, "Process-wide memos"): the key is the whole
# section's canonical text, which determines the section exactly, and a Schema is
# immutable once built (its derived tables are never changed), so a schema found is one
# compiling again would give, equal and interchangeable (only a valid section is kept:
# a malformed one raises each time). Its shared atoms are pinned in the reader's intern
# tables when first built, and pins are kept for good. At most _CACHE_MAX schemas, the
# oldest dropped first, each of a section of at most _CACHE_CHARS characters (larger
# ones are compiled each time), so it holds at most a few MiB.
_CACHE_MAX = 128
_CACHE_CHARS = 1 << 15
_CACHE: dict[str, Schema] = {}
_CACHE_LOCK = threading.Lock()


#: What all the patterns of one schema section may cost together (spec/conversations.md
#: §2.4): their construction steps and their table cells, summed over the fields (a
#: pattern repeated counts each time).
MAX_SCHEMA_PATTERN_STEPS = 1_000_000
MAX_SCHEMA_PATTERN_CELLS = 262_144
_SPENT = threading.local()  # .on_patterns: [steps, cells] while a section is compiled


def _spend_on_patterns(compiled: Pattern, where: str) -> None:
    spent: list[int] | None = getattr(_SPENT, "on_patterns", None)
    if spent is None:  # (a type compiled alone, outside a section)
        return
    spent[0] += compiled.compile_steps
    spent[1] += compiled.cells
    if spent[0] > MAX_SCHEMA_PATTERN_STEPS:
        raise _Bad(f"the schema's patterns take more than {MAX_SCHEMA_PATTERN_STEPS} steps "
                   "to compile", where)
    if spent[1] > MAX_SCHEMA_PATTERN_CELLS:
        raise _Bad(f"the schema's patterns need more than {MAX_SCHEMA_PATTERN_CELLS} "
                   "automaton table cells", where)


def _compile(section: Value) -> Schema:
    _SPENT.on_patterns = [0, 0]
    try:
        return _compile_section(section)
    finally:
        _SPENT.on_patterns = None


def _compile_section(section: Value) -> Schema:
    try:
        if type(section) is not tuple or not section or section[0] != Symbol("schema"):
            raise _Bad("expected a (schema …) section", "$")
        records: list[Record] = []
        heads: set[tuple[Symbol, ...]] = set()
        for i, item in enumerate(section[1:], 1):
            at = f"$.schema[{i}]"
            if type(item) is not tuple or not item or item[0] != Symbol("record"):
                raise _Bad("a schema lists (record HEAD … FIELD …) entries", at)
            record = _compile_type(item, at, 1)
            assert isinstance(record, Record)
            if record.heads in heads:
                raise _Bad("a record with the heads " + " ".join(record.heads)
                           + " is listed twice", at)
            heads.add(record.heads)
            records.append(record)
    except _Bad as exc:
        raise DescriptorError(f"descriptor: (schema …) at {exc.path}: {exc}") from None
    return Schema(tuple(records))


# --------------------------------------------------------------------------- checking

def _kind(value: Value) -> str:
    if type(value) is tuple:
        return "a list"
    return {str: "a string", int: "an integer", Decimal: "a decimal", Symbol: "a symbol",
            Keyword: "a keyword", URI: "a URI"}.get(type(value), type(value).__name__)


def _found(value: Value) -> str:
    text = canonical_prefix(value, 41)  # (enough to tell; any depth)
    return text if len(text) <= 40 else text[:37] + "..."


def _atom_problem(t: AtomType, value: Value) -> str | None:
    """What is wrong with ``value`` as an atom of type ``t``, or ``None``."""
    kinds = _ATOM_KINDS[t.kind]
    if kinds and type(value) not in kinds:
        return f"expected {t.describe()}, found {_kind(value)} {_found(value)}"
    if t.kind == "boolean" and value not in _BOOLEANS:
        return f"expected a boolean (true or false), found {_found(value)}"
    # Below, ``value`` is of one of ``kinds`` (a number, a string …), which mypy cannot
    # narrow by: the ignores stand for that.
    if t.low is not None and value < t.low:  # type: ignore[operator]
        return f"{_found(value)} is below the minimum {_show(t.low)}"
    if t.high is not None and value > t.high:  # type: ignore[operator]
        return f"{_found(value)} is above the maximum {_show(t.high)}"
    if t.min_length is not None or t.max_length is not None:
        n = len(value)  # type: ignore[arg-type]
        if t.min_length is not None and n < t.min_length:
            return (f"{_kind(value)} of {n} characters is shorter than the minimum "
                    f"of {t.min_length}")
        if t.max_length is not None and n > t.max_length:
            return (f"{_kind(value)} of {n} characters is longer than the maximum "
                    f"of {t.max_length}")
    if t.scheme is not None and URI(value).scheme != t.scheme:  # type: ignore[arg-type]
        return f"expected a URI with scheme {t.scheme}, found {_found(value)}"
    if t.pattern is not None and not _pattern_of(t.pattern).fullmatch(
            value):  # type: ignore[arg-type]
        return f"{_found(value)} does not match the pattern {_show(t.pattern)}"
    return None


def _pattern_of(text: str) -> Pattern:
    """The compiled pattern (checked when its schema was compiled; a hand-built type with
    a pattern outside the subset raises :class:`PatternError` here)."""
    return compile_pattern(text)


def _one_of(t: OneOf, value: Value) -> bool:
    """True if ``value`` is one of ``t.values`` (of the same type, and equal)."""
    return any(type(value) is type(v) and value == v for v in t.values)


# ------------------------------------------------------- checking: the C twin's tables
#
# What the C twin of the check (cbcl._native.schema_valid) reads. A spec says how a parent
# checks a child of some type inline: (kinds, how, a, b), where
# kinds are the Python types it may have (None for any) and how says what else to check:
#   _PLAIN     nothing                        _SIZED     its length is in the range a
#   _AT_LEAST  not below a (value < a)        _AT_MOST   not above b (value > b)
#   _BETWEEN   both                           _TESTED    the predicate a holds
#   _MEMBER    (its type, it) is in the set a (a one-of of hashable atoms)
#   _KEYED     it is checked later, from a work list, by the _Pairs b
#   _LISTED    it is checked later as the list-of b, whose bounds and elements' spec
#              are a: (min_length, max_length, kinds, how, a, b)
#   _OPEN      the predicate a holds (a keyword-argument list or record of any keys,
#              the _Pairs b: the C twin checks it from the work list, as _KEYED)

_Spec = tuple[Union[frozenset[type], None], int, Any, Any]  # noqa: UP007
# A field: its bit, its spec, and the field listed after it (its key and _Field, or
# _NOT_A_VALUE and None after the last).
_Field = tuple[int, Union[frozenset[type], None], int, Any, Any, Any, Any]  # noqa: UP007

_PLAIN, _SIZED, _KEYED, _LISTED, _BETWEEN, _AT_LEAST, _AT_MOST, _TESTED, _MEMBER, _OPEN = \
    range(10)
_ANY: _Spec = (None, _PLAIN, None, None)
#: A boolean's _MEMBER set: the reader's shared true and false.
_BOOLEAN_MEMBERS = frozenset((Symbol, intern_symbol(name, pin=True)) for name in ("true", "false"))
_TUPLE = frozenset((tuple,))
_NO_MAX = sys.maxsize  # longer than any str: no maximum length
_NEVER = sys.maxsize  # more heads than any list has


class _Pairs:
    """How the C twin checks a keyword-argument list, or a record after its heads.

    ``start`` is the number of heads, ``heads`` those heads as the symbols the reader
    shares (a body's are found by identity) and ``head`` the only one (see
    :func:`_sole_head`). ``table`` gives each field's bit, spec and the field listed after
    it (:data:`_Field`) under the shared keyword, and ``first`` the field listed first: a
    body that lists its keys in the same order finds each by identity, without hashing.
    ``other`` is the spec of any other key (or ``None``), ``required`` the bits of the
    required keys. If the keys need only be distinct keywords (``(keys (else any))``),
    ``open`` is a predicate that checks the whole list (else ``None``). A hand-built type
    with a key, required key or head that is not a keyword or symbol gets ``start``
    :data:`_NEVER`: the C twin refuses every list, and the explaining pass says what
    happens.
    """

    __slots__ = ("first", "head", "heads", "open", "other", "packed", "required", "start",
                 "table")

    def __init__(self, keys: Keys, heads: tuple[Symbol, ...] | None = None) -> None:
        """For a :class:`Keys`, or with ``heads`` a record's."""
        self._prepare(keys, heads)
        #: The slots the C twin reads, in one tuple (one lookup a list).
        self.packed = (self.open, self.start, self.head, self.heads, self.first, self.table,
                       self.other, self.required)

    def _prepare(self, keys: Keys, heads: tuple[Symbol, ...] | None) -> None:
        self.heads: tuple[Symbol, ...] = tuple(_shared(h) for h in heads or ())
        self.head = _sole_head(self.heads)
        self.start = _NEVER  # until the type proves usual
        self.table: dict[Keyword, _Field] = {}
        self.first: tuple[Any, _Field | None] = (_NOT_A_VALUE, None)
        self.other: _Spec | None = None
        self.required = 0
        self.open: Callable[[tuple[Value, ...]], bool] | None = None
        if not isinstance(keys, Keys) or (heads is not None and (
                not heads or not all(type(h) is Symbol for h in heads))):
            return
        if not all(type(key) is Keyword for key in keys.fields):
            return
        table: dict[Keyword, _Field] = {}
        after: tuple[Any, _Field | None] = (_NOT_A_VALUE, None)
        for bit, (key, child) in reversed(list(enumerate(keys.fields.items()))):
            key = _shared(key)
            table[key] = (1 << bit, *_spec_of(child), *after)
            after = (key, table[key])
        required = 0
        for key in keys.required:
            entry = table.get(key) if type(key) is Keyword else None
            if entry is None:
                return
            required |= entry[0]
        self.table, self.first, self.required = table, after, required
        self.other = None if keys.other is None else _spec_of(keys.other)
        self.start = len(self.heads)
        if not keys.fields and self.other == _ANY:
            self.open = _any_keys(self.heads)


def _any_keys(heads: tuple[Symbol, ...]) -> Callable[[tuple[Value, ...]], bool]:
    """A predicate: a list that starts with ``heads`` (symbols as the reader shares them)
    and continues with distinct keywords, each followed by any value."""
    start, head = len(heads), _sole_head(heads)

    def check(items: tuple[Value, ...]) -> bool:
        n = len(items)
        if (start and (n < start or (items[0] is not head
                                     and not _has_heads(items, heads)))) or (n - start) % 2:
            return False
        keys = items[start::2]
        for key in keys:
            if type(key) is not Keyword:
                return False
        return len(set(keys)) == len(keys)  # (the types first: a list is never hashed)

    return check


_NOT_A_VALUE = object()


def _sole_head(heads: tuple[Symbol, ...]) -> object:
    """The head of a record with one (a body that starts with it has the heads), else an
    object no body starts with."""
    return heads[0] if len(heads) == 1 and type(heads[0]) is Symbol else _NOT_A_VALUE


def _shared(atom: Any) -> Any:
    """The symbol or keyword the reader shares for ``atom`` (so that a dictionary keyed by it
    finds a body's atom by identity, without calling ``_Atom.__eq__``); other values as
    they are."""
    if type(atom) is Keyword:
        return intern_keyword(str.__str__(atom), pin=True)
    if type(atom) is Symbol:
        return intern_symbol(str.__str__(atom), pin=True)
    return atom


def _refuse(value: Value) -> bool:
    """A predicate that holds for no value."""
    return False


def _spec_of(t: SchemaType) -> _Spec:
    """The spec of a child of type ``t`` (see above); raises nothing."""
    if isinstance(t, AtomType):
        return _atom_spec(t)
    if isinstance(t, OneOf):
        values = t.values
        if all(type(v) is not tuple for v in values):
            try:
                members = frozenset((type(v), v) for v in values)
            except TypeError:
                pass
            else:  # (the types first: a body's list is never hashed)
                return frozenset(type(v) for v in values), _MEMBER, members, None
        return None, _TESTED, lambda value: _one_of(t, value), None
    if isinstance(t, ListOf):  # (a: its bounds and its elements' spec, read without a lookup)
        return _TUPLE, _LISTED, (t.min_length, t.max_length, *t._item), t
    if isinstance(t, (Keys, Record)):
        pairs = t._pairs
        if pairs.open is not None:
            return _TUPLE, _OPEN, pairs.open, pairs
        return _TUPLE, _KEYED, None, pairs
    return None, _TESTED, _refuse, None  # not a type: the explaining pass says what to do


def _atom_spec(t: AtomType) -> _Spec:
    """The spec of an atom of type ``t``: the general predicate (the explaining pass's own
    test) where ``t`` has a check the spec has no quicker form for."""
    kind, low, high = t.kind, t.low, t.high
    ranged = low is not None or high is not None
    sized = t.min_length is not None or t.max_length is not None
    kinds = _ATOM_KINDS.get(kind)
    if kind == "boolean" and not ranged and not sized and t.scheme is None and \
            t.pattern is None:  # (a set of the shared symbols: no call, in C or Python)
        return frozenset({Symbol}), _MEMBER, _BOOLEAN_MEMBERS, None
    if kinds is None or kind == "boolean" or t.scheme is not None:
        pass  # rare: the general predicate below
    elif t.pattern is not None:  # (the C twin calls the predicate: a pattern is Python's)
        if kind == "string" and not ranged and not sized:
            try:
                matches = compile_pattern(t.pattern).fullmatch
            except PatternError:
                pass  # a hand-built type: the explaining pass raises
            else:
                return None, _TESTED, lambda value: type(value) is str and matches(value), None
    elif kind == "any":
        if not ranged and not sized:
            return _ANY
    elif kind in ("string", "symbol"):
        if not ranged and not sized:
            return frozenset(kinds), _PLAIN, None, None
        if not ranged and type(t.min_length) in _LENGTH and type(t.max_length) in _LENGTH:
            low = 0 if t.min_length is None else t.min_length
            stop = _NO_MAX if t.max_length is None else t.max_length + 1
            # (b: the same bounds as two ints, which the C twin compares without a call)
            return frozenset(kinds), _SIZED, range(low, stop), (low, stop)
    elif kind in ("integer", "decimal", "number"):
        if not sized and type(low) in _BOUND and type(high) in _BOUND:
            how = (_PLAIN if not ranged else _AT_MOST if low is None
                   else _AT_LEAST if high is None else _BETWEEN)
            return frozenset(kinds), how, low, high
    elif not ranged and not sized:  # keyword; uri without a scheme
        return frozenset(kinds), _PLAIN, None, None
    return None, _TESTED, lambda value: _atom_problem(t, value) is None, None


_LENGTH = (int, type(None))
_BOUND = (int, Decimal, type(None))


# ----------------------------------------------------------- checking: explaining pass

# A path is built only when a check fails: while checking, it is the root text or a
# (parent, segment) pair, where a segment is a Keyword ([:key]), an int ([i]) or a Symbol
# (.head).
Path: TypeAlias = "str | tuple[Path, Keyword | int | Symbol]"


def path_text(path: Path) -> str:
    """The text of a lazy path: ``$.body.task[:resources][:cpu]``."""
    segments: list[str] = []
    while isinstance(path, tuple):
        path, segment = path
        if type(segment) is Keyword:
            segments.append(f"[{segment.text}]")
        elif type(segment) is Symbol:
            segments.append(f".{segment}")
        else:
            segments.append(f"[{segment}]")
    return path + "".join(reversed(segments))


def _fail(message: str, *, path: Path) -> SchemaError:
    text = path_text(path)
    return SchemaError(f"{text}: {message}", path=text)


def _check_keys(t: Keys, items: tuple[Value, ...], offset: int, path: Path,
                work: list[tuple[SchemaType, Value, Path]]) -> None:
    if (len(items)) % 2:
        raise _fail(f"a keyword-argument list has pairs; {_found(items[-1])} has no "
                    "value", path=(path, offset + len(items) - 1))
    seen: set[Keyword] = set()
    children: list[tuple[SchemaType, Value, Path]] = []
    fields = t.fields
    other = t.other
    for i in range(0, len(items), 2):
        key = items[i]
        if type(key) is not Keyword:
            raise _fail(f"expected a keyword, found {_kind(key)} {_found(key)}",
                        path=(path, offset + i))
        if key in seen:
            raise _fail(f"key {key.text} is given twice", path=(path, key))
        seen.add(key)
        child = fields.get(key, other)
        if child is None:
            allowed = " ".join(k.text for k in fields) or "none"
            raise _fail(f"key {key.text} is not allowed here (allowed: {allowed})",
                        path=(path, key))
        children.append((child, items[i + 1], (path, key)))
    for key in t.required:
        if key not in seen:
            raise _fail(f"required key {key.text} is missing", path=path)
    work.extend(reversed(children))


def _explain(record: Record, body: Value, path: str) -> None:
    """The explaining pass: raises :class:`SchemaError` at the first violation of
    ``record`` in ``body``, in reading order (each list's own problems before its
    children's); returns if there is none."""
    work: list[tuple[SchemaType, Value, Path]] = [(record, body, path)]
    while work:
        t, value, at = work.pop()
        if isinstance(t, AtomType):
            problem = _atom_problem(t, value)
            if problem is not None:
                raise _fail(problem, path=at)
        elif isinstance(t, OneOf):
            if not _one_of(t, value):
                raise _fail(f"expected {t.describe()}, found {_found(value)}", path=at)
        elif type(value) is not tuple:
            raise _fail(f"expected {t.describe()}, found {_kind(value)} "
                        f"{_found(value)}", path=at)
        elif isinstance(t, ListOf):
            n = len(value)
            if t.min_length is not None and n < t.min_length:
                raise _fail(f"a list of {n} elements is shorter than the minimum of "
                            f"{t.min_length}", path=at)
            if t.max_length is not None and n > t.max_length:
                raise _fail(f"a list of {n} elements is longer than the maximum of "
                            f"{t.max_length}", path=at)
            work.extend((t.item, value[i], (at, i)) for i in reversed(range(n)))
        elif isinstance(t, Keys):
            _check_keys(t, value, 0, at, work)
        else:
            n = len(t.heads)
            if len(value) < n or any(type(value[i]) is not Symbol or value[i] != t.heads[i]
                                     for i in range(n)):
                raise _fail(f"expected {t.describe()}, found {_found(value)}", path=at)
            _check_keys(t.keys, value[n:], n, (at, t.heads[0]), work)


def check_schema(schema: Schema | Value, body: Value, *, path: str = "$.body") -> None:
    """Check ``body`` against a schema (a compiled :class:`Schema` or a ``(schema …)``
    section as read). A body whose head no record names is not constrained.

    Raises :class:`SchemaError` at the first violation, in reading order, with ``path``
    naming it: ``$.body.task[:resources][:cpu]`` (a record adds ``.HEAD``, a key
    ``[:key]``, a list element ``[i]``). Raises :class:`DescriptorError` for a malformed
    section.
    """
    compiled = schema if isinstance(schema, Schema) else compile_schema(schema)
    record = compiled.record_for(body)
    if record is None:
        return
    if _schema_valid_c is not None:
        try:
            # (a tuple: record_for found its heads; no cast, a call, on the decoders' path)
            if _schema_valid_c(record._pairs, body, _has_heads) is True:
                return
        except Exception:  # an odd value or hand-built type: the explaining pass raises
            pass  # it in its place in reading order
    _explain(record, body, path)


# --------------------------------------------------------------------------- coercion

_COERCE_DEPTH = MAX_TYPE_DEPTH + 2  # (a compiled type is at most MAX_TYPE_DEPTH deep)


def coerce_body(schema: Schema | Value, body: Value) -> Value:
    """``body`` with each ``str`` that the schema types as a symbol, keyword or URI made
    one (spec/conversations.md §2.3): a field typed ``symbol``, ``keyword``, ``uri`` or
    ``boolean``, or a ``one-of`` that lists the symbol (keyword, URI) the string spells and
    not the string itself. ``"EUR"`` for ``(:currency (one-of EUR USD))`` becomes the
    symbol ``EUR``, ``":size"`` or ``"size"`` for a ``keyword`` the keyword ``:size``.
    Nothing else changes: a ``str`` that is not a valid symbol, keyword or URI stays a
    ``str`` (the check then says why), a float is never made a decimal, a body whose head
    no record names is returned as it is. Raises :class:`DescriptorError` for a malformed
    schema section, nothing for any body."""
    compiled = schema if isinstance(schema, Schema) else compile_schema(schema)
    record = compiled.record_for(body)
    return body if record is None else _coerce(record, body, 0)


def _coerce(t: SchemaType, value: Value, depth: int) -> Value:
    if depth > _COERCE_DEPTH:
        return value
    if type(value) is str:
        return _coerce_text(t, value)
    if type(value) is not tuple:
        return value
    if isinstance(t, ListOf):
        items = tuple(_coerce(t.item, item, depth + 1) for item in value)
        return value if all(map(is_, items, value)) else items
    if isinstance(t, Record):
        keys, start = t.keys, len(t.heads)
    elif isinstance(t, Keys):
        keys, start = t, 0
    else:
        return value
    out = list(value)
    for i in range(start + 1, len(out), 2):
        key = out[i - 1]
        child = keys.fields.get(key, keys.other) if type(key) is Keyword else None
        if child is not None:
            out[i] = _coerce(child, out[i], depth + 1)
    return value if all(map(is_, out, value)) else tuple(out)


def _coerce_text(t: SchemaType, text: str) -> Value:
    """``text`` as the atom ``t`` says it is, when it can be one; else ``text``."""
    kinds: tuple[type, ...]
    if isinstance(t, AtomType):
        kinds = {"symbol": (Symbol,), "boolean": (Symbol,), "keyword": (Keyword,),
                 "uri": (URI,)}.get(t.kind, ())
    elif isinstance(t, OneOf) and text not in [v for v in t.values if type(v) is str]:
        kinds = tuple(dict.fromkeys(type(v) for v in t.values
                                    if type(v) in (Symbol, Keyword, URI)))
    else:
        kinds = ()
    for kind in kinds:
        try:
            atom: Symbol | Keyword | URI = kind(text)
        except ValueError:
            continue
        if isinstance(t, OneOf) and not _one_of(t, atom):
            continue
        return atom
    return text


try:
    from .._native import schema_valid as _native_schema_valid
except ImportError:  # not built: the explaining pass alone
    _schema_valid_c: Any = None
else:
    _schema_valid_c = _native_schema_valid
