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

A section is compiled once (:func:`compile_schema`, which raises
:class:`DescriptorError` for a malformed schema) into immutable type objects; checking a
body (:func:`check_schema`) walks the body with an explicit stack and raises
:class:`SchemaError` with a path such as ``$.body.task[:resources][:cpu]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Union

from ._canonical import canonical_value
from ._errors import DescriptorError, SchemaError
from ._values import URI, Keyword, Symbol, Value

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
    "string": ("min-length", "max-length"), "symbol": ("min-length", "max-length"),
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
    symbols, ``scheme`` for URIs."""

    kind: str
    low: int | Decimal | None = None
    high: int | Decimal | None = None
    min_length: int | None = None
    max_length: int | None = None
    scheme: str | None = None

    def describe(self) -> str:
        text = _SHOWN[self.kind]
        if self.low is not None or self.high is not None:
            text += f" in [{_show(self.low) if self.low is not None else '…'}, " \
                    f"{_show(self.high) if self.high is not None else '…'}]"
        if self.min_length is not None or self.max_length is not None:
            text += f" of {self.min_length or 0} to {self.max_length or '…'} characters"
        if self.scheme is not None:
            text += f" with scheme {self.scheme}"
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

    def describe(self) -> str:
        return "a list"


@dataclass(frozen=True, slots=True)
class Keys:
    """A keyword-argument list ``(:k v …)``: the allowed keys and their types, which are
    required, and (``other``) the type of any key not listed, or ``None`` to refuse it."""

    fields: dict[Keyword, SchemaType] = field(hash=False)
    required: tuple[Keyword, ...]
    other: SchemaType | None = None

    def describe(self) -> str:
        return "a keyword-argument list"


@dataclass(frozen=True, slots=True)
class Record:
    """A list that starts with the symbols ``heads`` and continues as :class:`Keys`."""

    heads: tuple[Symbol, ...]
    keys: Keys

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

    def __post_init__(self) -> None:
        by_head: dict[Symbol, list[Record]] = {}
        for record in self.records:
            by_head.setdefault(record.heads[0], []).append(record)
        object.__setattr__(self, "by_head", {k: tuple(v) for k, v in by_head.items()})

    def record_for(self, body: Value) -> Record | None:
        """The first record whose head symbols start ``body``, or ``None``."""
        if type(body) is not tuple or not body or type(body[0]) is not Symbol:
            return None
        for record in self.by_head.get(body[0], ()):
            heads = record.heads
            if len(body) >= len(heads) and all(
                    type(body[i]) is Symbol and body[i] == heads[i]
                    for i in range(1, len(heads))):
                return record
        return None


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
        low, high = opts.get("min"), opts.get("max")
        numeric = (int,) if name == "integer" else (int, Decimal)
        for key, bound in (("min", low), ("max", high)):
            if bound is not None and type(bound) not in numeric:
                raise _Bad(f":{key} of {name} must be " + ("an integer" if name == "integer"
                                                            else "a number"), where)
        if low is not None and high is not None and low > high:  # type: ignore[operator]
            raise _Bad(":min is greater than :max", where)
        lo_len = _length(opts["min-length"], where) if "min-length" in opts else None
        hi_len = _length(opts["max-length"], where) if "max-length" in opts else None
        if lo_len is not None and hi_len is not None and lo_len > hi_len:
            raise _Bad(":min-length is greater than :max-length", where)
        scheme = opts.get("scheme")
        if scheme is not None and type(scheme) is not Symbol:
            raise _Bad(":scheme is a symbol such as agent", where)
        return AtomType(name, low, high, lo_len, hi_len,  # type: ignore[arg-type]
                        None if scheme is None else str(scheme))
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
        item = _compile_type(value[1], f"{where}[1]", depth + 1)
        opts = _options(value[2:], ("min-length", "max-length"), where, 2)
        lo_len = _length(opts["min-length"], where) if "min-length" in opts else None
        hi_len = _length(opts["max-length"], where) if "max-length" in opts else None
        if lo_len is not None and hi_len is not None and lo_len > hi_len:
            raise _Bad(":min-length is greater than :max-length", where)
        return ListOf(item, lo_len, hi_len)
    if name == "keys":
        return _compile_keys(value[1:], where, 1, depth)
    if name == "record":
        heads: list[Symbol] = []
        i = 1
        while i < len(value) and type(value[i]) is Symbol:
            heads.append(value[i])  # type: ignore[arg-type]
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
        key: Keyword = item[0]  # type: ignore[assignment]
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
        if len(_CACHE) >= 128:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = cached
    return cached


_CACHE: dict[str, Schema] = {}


def _compile(section: Value) -> Schema:
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
    text = canonical_value(value)
    return text if len(text) <= 40 else text[:37] + "..."


# A path is built only when a check fails: while checking, it is the root text or a
# (parent, segment) pair, where a segment is a Keyword ([:key]), an int ([i]) or a Symbol
# (.head).
Path = Union[str, tuple]  # noqa: UP007


def path_text(path: Path) -> str:
    """The text of a lazy path: ``$.body.task[:resources][:cpu]``."""
    segments: list[str] = []
    while type(path) is tuple:
        path, segment = path
        if type(segment) is Keyword:
            segments.append(f"[{segment.text}]")
        elif type(segment) is Symbol:
            segments.append(f".{segment}")
        else:
            segments.append(f"[{segment}]")
    return path + "".join(reversed(segments))  # type: ignore[operator]


def _fail(message: str, *, path: Path) -> SchemaError:
    text = path_text(path)
    return SchemaError(f"{text}: {message}", path=text)


def _check_atom(t: AtomType, value: Value, path: Path) -> None:
    kinds = _ATOM_KINDS[t.kind]
    if kinds and type(value) not in kinds:
        raise _fail(f"expected {t.describe()}, found {_kind(value)} {_found(value)}",
                          path=path)
    if t.kind == "boolean" and value not in _BOOLEANS:
        raise _fail(f"expected a boolean (true or false), found {_found(value)}",
                          path=path)
    if t.low is not None and value < t.low:  # type: ignore[operator]
        raise _fail(f"{_found(value)} is below the minimum {_show(t.low)}", path=path)
    if t.high is not None and value > t.high:  # type: ignore[operator]
        raise _fail(f"{_found(value)} is above the maximum {_show(t.high)}", path=path)
    if t.min_length is not None or t.max_length is not None:
        n = len(value)  # type: ignore[arg-type]
        if t.min_length is not None and n < t.min_length:
            raise _fail(f"{_kind(value)} of {n} characters is shorter than the minimum "
                              f"of {t.min_length}", path=path)
        if t.max_length is not None and n > t.max_length:
            raise _fail(f"{_kind(value)} of {n} characters is longer than the maximum "
                              f"of {t.max_length}", path=path)
    if t.scheme is not None and URI(value).scheme != t.scheme:  # type: ignore[arg-type]
        raise _fail(f"expected a URI with scheme {t.scheme}, found {_found(value)}",
                          path=path)


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
    work: list[tuple[SchemaType, Value, Path]] = [(record, body, path)]
    while work:
        t, value, at = work.pop()
        if isinstance(t, AtomType):
            _check_atom(t, value, at)
        elif isinstance(t, OneOf):
            if not any(type(value) is type(v) and value == v for v in t.values):
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
