"""Messages in Python: bodies built from Python values, and read back by field name.

Building
--------
:func:`body` makes ``(head :key value …)``, :func:`keys` makes ``(:key value …)``, and
:func:`as_value` converts one Python value. Every value is converted, or refused, when it
is given, never later in :func:`cbcl.canonical` or :func:`cbcl.encode`:

================================  ==========================================================
Python                            CBCL
================================  ==========================================================
``str``                           STRING (a lone surrogate is refused: ``ValueError``)
``int``                           INTEGER (signed 64-bit, else ``ValueError``; ``bool`` is
                                  refused: ``TypeError``)
``decimal.Decimal``               DECIMAL (finite and at most 40 characters written out,
                                  else ``ValueError``)
``Symbol``, ``Keyword``, ``URI``  as they are
``list``, ``tuple``               list (a ``tuple``), item by item
================================  ==========================================================

Anything not of an exact type is read as data, never through its own methods (spec §1.2):
a subclass of ``str``, ``int``, ``Decimal``, ``tuple`` or ``list`` is converted to the base
type through the base type (``str.__str__``, ``int.__index__``, ``Decimal()``,
``tuple.__iter__``/``list.__iter__``), a subclass of ``Symbol``, ``Keyword`` or ``URI`` to
the exact atom once its text is checked again, and a member of an enum of such values
(``StrEnum``, ``IntEnum`` …) to its value. Anything else (``float``, ``None``, ``dict``,
``bytes``, ``set``, a member of another enum …) raises ``TypeError`` naming where it is:
``body field `:amount`: float is not a CBCL value; use decimal.Decimal``. Lists nested
more than ``MAX_VALUE_DEPTH`` (10,000) deep, and a list that contains itself, raise
:class:`LimitError` (a ``ValueError``).

Keyword arguments name keywords: ``_`` becomes ``-`` (``task_id=`` is ``:task-id``), and a
trailing ``_`` after a Python reserved word is dropped (``from_=`` is ``:from``). A name
that is not a Python identifier, or keeps its ``_`` (``:order_id``), is given in a mapping,
taken literally: ``body("inform", Symbol("results"), {"order_id": "A-1"}, limit=3)``.

Reading
-------
:class:`Fields` reads a list of the form ``(head … :key value …)`` - leading symbols, then
distinct keywords each followed by its value - by name: ``view.head``, ``view["amount"]``,
``view.get("note")``, ``for name in view``. It is refused with :class:`FieldsError`
otherwise. With a schema (a protocol's ``(schema …)``), the list is first checked against
it (:class:`SchemaError`) and its fields are read by the schema's types; see
:class:`Fields`.
"""

from __future__ import annotations

import keyword as _python_keyword
import numbers
import re
from collections.abc import Iterator, Mapping
from decimal import Decimal
from enum import Enum
from fractions import Fraction
from typing import Any, TypeAlias, TypeGuard, TypeVar

from ..core._canonical import _decimal, canonical_prefix, too_deep
from ..core._errors import LimitError, ViolationError
from ..core._reader import intern_keyword, intern_symbol
from ..core._values import (
    EXACT_ATOM_TYPES,
    INT64_MAX,
    INT64_MIN,
    ITEM_ITERATORS,
    MAX_VALUE_DEPTH,
    URI,
    Keyword,
    Symbol,
    Value,
    data_of,
)
from ._schema import AtomType, Keys, ListOf, Record, Schema, SchemaType, check_schema

_T = TypeVar("_T")

#: What a field of a :class:`Fields` reads as: a CBCL value, or a nested :class:`Fields`
#: (a list of fields in a field, or in a list the schema types).
FieldValue: TypeAlias = "str | int | Decimal | Symbol | Keyword | URI | Fields | tuple[FieldValue, ...]"  # noqa: E501

_SURROGATE = re.compile("[\ud800-\udfff]")
_TRUE = Symbol("true")


class FieldsError(ViolationError):
    """A value that is not a list of the form ``(head … :key value …)``, or (from
    :meth:`Fields.require`) a field that is missing or not of the type asked for. ``path``
    names the place (``$.body.bid[:price]``)."""

    kind = "fields"


# --------------------------------------------------------------------------- converting


def _is_value(value: object) -> TypeGuard[Value]:
    """True if ``value`` is a CBCL value already: exact types, lists as tuples, every atom
    in range, at most ``MAX_VALUE_DEPTH`` lists in all (so none deeper: a value with more
    is checked by :func:`_convert`, which counts its depth). Builds nothing (the common
    case of :func:`check_value`)."""
    if type(value) is not tuple:
        return _is_atom(value)
    lists: list[Any] = [value]
    more = MAX_VALUE_DEPTH - 1  # the nested lists that may follow
    item: Any
    while lists:
        for item in lists.pop():
            kind = type(item)
            if kind is str:
                if not item.isascii() and _SURROGATE.search(item) is not None:
                    return False
            elif kind is tuple:
                lists.append(item)
                more -= 1
                if more < 0:
                    return False
            elif kind is int:
                if not INT64_MIN <= item <= INT64_MAX:
                    return False
            elif kind is Symbol or kind is Keyword or kind is URI:
                continue
            elif kind is not Decimal or not _decimal_fits(item):
                return False
    return True


def _is_atom(value: Any) -> bool:
    kind = type(value)
    if kind is str:
        return value.isascii() or _SURROGATE.search(value) is None
    if kind is int:
        fits: bool = INT64_MIN <= value <= INT64_MAX
        return fits
    if kind is Decimal:
        return _decimal_fits(value)
    return kind is Symbol or kind is Keyword or kind is URI


def _decimal_fits(value: Decimal) -> bool:
    try:
        _decimal(value)
    except ValueError:
        return False
    return True


def _segment(items: list[Value], index: int) -> str:
    """The path segment of the list's item ``index`` as a schema error writes it, from the
    items converted before it: ``.head`` for a list that starts with a symbol, then
    ``[:key]`` after a keyword, else ``[index]``."""
    head = f".{items[0]}" if index and type(items[0]) is Symbol else ""
    before = items[index - 1] if index else None
    return head + (f"[{before.text}]" if type(before) is Keyword else f"[{index}]")


def _path(root: str, frames: list[tuple[int, list[Value]]]) -> str:
    """The path of the item being converted: each open list's item is its ``len(out)``."""
    return root + "".join(_segment(out, len(out)) for _, out in frames)


def _refusal(value: object) -> str:
    """Why ``value`` is not a CBCL value, with what to use instead."""
    if value is None:
        return "None is not a CBCL value; leave the field out"
    kind = type(value)  # (by its type: an object's __class__ may say anything)
    name = kind.__name__
    if kind is bool:
        hint = 'use an int, or Symbol("true") / Symbol("false")'
    elif issubclass(kind, (float, Fraction, complex)) or (
            issubclass(kind, numbers.Number) and not issubclass(kind, numbers.Integral)):
        hint = "use decimal.Decimal"
    elif issubclass(kind, numbers.Integral):
        hint = "use int"
    elif issubclass(kind, Mapping):
        hint = "use cbcl.keys(...) for a (:key value …) list"
    elif issubclass(kind, (bytes, bytearray, memoryview)):
        hint = "use a str (base64 text, for example)"
    elif issubclass(kind, (set, frozenset)):
        hint = "use a list or tuple, in a chosen order"
    else:
        hint = "use str, int, decimal.Decimal, Symbol, Keyword, URI or a list of them"
    return f"{name} is not a CBCL value; {hint}"


def _data(item: object, label: str, root: str, frames: list[tuple[int, list[Value]]],
          ) -> object:
    """``item`` read as data (:func:`data_of`: an exact atom, or an iterator over a list's
    items), or ``TypeError``/``ValueError`` naming its path. A typed record
    (``cbcl.Record``) is read as its body's value, built and checked when it was made."""
    record_body = getattr(type(item), "__cbcl_body__", None)
    if record_body is not None:
        item = record_body.__get__(item, type(item))
    try:
        plain = data_of(item)
    except TypeError as exc:
        kind = type(item)
        reason = str(exc) if issubclass(kind, Enum) else _refusal(item)
        raise TypeError(f"{label} `{_path(root, frames)}`: {reason}") from None
    except ValueError as exc:
        raise ValueError(f"{label} `{_path(root, frames)}`: {exc}") from None
    if type(plain) in ITEM_ITERATORS:
        return plain
    return _atom(plain, label, root, frames)


def _atom(item: Any, label: str, root: str, frames: list[tuple[int, list[Value]]],
          ) -> Value:
    """An atom of an exact type, checked to be in range: ``ValueError`` naming its path."""
    kind = type(item)
    try:
        if kind is str:
            if not item.isascii():
                bad = _SURROGATE.search(item)
                if bad is not None:
                    raise ValueError(f"a string holds a lone surrogate U+{ord(bad.group()):04X}, "
                                     "not UTF-8 text")
        elif kind is int:
            if not INT64_MIN <= item <= INT64_MAX:
                raise ValueError(f"integer {item} is outside the signed 64-bit range")
        elif kind is Decimal:
            try:
                _decimal(item)
            except ValueError as exc:  # (the canonical writer's reason, as a ValueError)
                raise ValueError(str(exc)) from None
    except ValueError as exc:
        raise ValueError(f"{label} `{_path(root, frames)}`: {exc}") from None
    return item  # type: ignore[no-any-return]  # (an exact atom: data_of's)


def _convert(value: object, label: str, root: str) -> Value:
    """``value`` converted (see the module's table), iteratively; raises ``TypeError`` or
    ``ValueError`` naming ``root`` plus the path of the refused item, and
    :class:`LimitError` for lists more than ``MAX_VALUE_DEPTH`` deep or one that contains
    itself."""
    frames: list[tuple[int, list[Value]]] = []
    plain = _data(value, label, root, frames)
    if type(plain) not in ITEM_ITERATORS:
        return plain  # type: ignore[return-value]  # (an atom: _data's)
    frames.append((id(value), []))
    iterators: list[Any] = [plain]
    open_lists = {id(value)}
    while True:
        for item in iterators[-1]:
            kind = type(item)
            if kind in EXACT_ATOM_TYPES:
                frames[-1][1].append(_atom(item, label, root, frames))
                continue
            plain = iter(item) if kind is tuple or kind is list else \
                _data(item, label, root, frames)
            if type(plain) not in ITEM_ITERATORS:
                frames[-1][1].append(plain)  # type: ignore[arg-type]  # (an atom: _data's)
                continue
            if id(item) in open_lists:
                raise LimitError(f"{label} `{_path(root, frames)}`: a list that contains "
                                 "itself is not a CBCL value", limit="max_depth",
                                 maximum=MAX_VALUE_DEPTH)
            if len(frames) >= MAX_VALUE_DEPTH:
                error = too_deep()
                raise LimitError(f"{label} `{_path(root, frames)}`: {error}",
                                 limit="max_depth", maximum=MAX_VALUE_DEPTH)
            frames.append((id(item), []))
            iterators.append(plain)
            open_lists.add(id(item))
            break
        else:
            source, out = frames.pop()
            iterators.pop()
            open_lists.discard(source)
            converted = tuple(out)
            if not frames:
                return converted
            frames[-1][1].append(converted)


def check_value(value: object, label: str = "value", root: str = "$") -> Value:
    """``value`` as a CBCL value: itself when it is one already (nothing is copied), else
    converted (lists to tuples, subclasses read as their base type's data, enum members
    as their values: the module's table). Raises ``TypeError`` for what is not a CBCL
    value, ``ValueError`` for an atom out of range and :class:`LimitError` (a
    ``ValueError``) for lists more than ``MAX_VALUE_DEPTH`` deep or one that contains
    itself, each naming the place: ``{label} `{root}[2]`: …``."""
    if _is_value(value):
        return value
    return _convert(value, label, root)


def as_value(value: object) -> Value:
    """``value`` converted to a CBCL value: ``str``, ``int`` (int64), ``Decimal`` (finite,
    at most 40 characters written out), ``Symbol``, ``Keyword`` and ``URI`` as they are,
    ``list`` and ``tuple`` as a ``tuple`` of converted items; a subclass of one of these as
    the data its base type stores (never through its own methods), a member of an enum of
    such values (``StrEnum``, ``IntEnum`` …) as its value. A value that is one already is
    returned as it is.

    Raises ``TypeError`` for anything that is not a CBCL value (``float``, ``None``,
    ``bool``, ``dict``, ``bytes``, ``set``, a member of another enum …), ``ValueError`` for
    an integer outside int64, a non-finite or over-long decimal, a lone surrogate, or a
    subclassed symbol, keyword or URI whose text is not one, and :class:`LimitError` (a
    ``ValueError``) for lists more than ``MAX_VALUE_DEPTH`` (10,000) deep or a list that
    contains itself; the message names the place (``value `$[1][0]`: float is not …``).
    """
    return check_value(value, "value", "$")


# --------------------------------------------------------------------------- building

# Keyword-argument name -> its shared keyword. A process-wide memo (spec/cbcl-1.0.md,
# "Process-wide memos"): the key is the argument's own name, the value the immutable
# keyword it denotes (as interned), the same whether found or made; a name that is not a
# keyword raises each time. At most _PYTHON_KEYS_MAX names of at most _PYTHON_KEY_CHARS
# characters, emptied when full.
_PYTHON_KEYS: dict[str, Keyword] = {}
_PYTHON_KEYS_MAX = 4096
_PYTHON_KEY_CHARS = 128


def _python_key(name: str) -> Keyword:
    """The keyword a keyword argument names (``task_id`` -> ``:task-id``, ``from_`` ->
    ``:from``). Raises ``ValueError`` if that is not a keyword name."""
    found = _PYTHON_KEYS.get(name)
    if found is not None:
        return found
    text = name[:-1] if name.endswith("_") and _python_keyword.iskeyword(name[:-1]) else name
    try:
        key = Keyword(text.replace("_", "-"))
    except ValueError as exc:
        raise ValueError(f"body field name {name!r}: {exc}") from None
    found = intern_keyword(str.__str__(key))
    if len(name) <= _PYTHON_KEY_CHARS:
        if len(_PYTHON_KEYS) >= _PYTHON_KEYS_MAX:
            _PYTHON_KEYS.clear()
        _PYTHON_KEYS[name] = found
    return found


def _literal_key(name: object) -> Keyword:
    """A mapping's key as a keyword, taken literally (``"order_id"`` -> ``:order_id``; a
    leading colon is allowed). Raises ``TypeError``/``ValueError``."""
    kind = type(name)
    if kind is Keyword:
        return intern_keyword(str.__str__(name))
    if not issubclass(kind, str) or issubclass(kind, (Symbol, URI)):
        raise TypeError(f"a body field name is a str or Keyword, not {kind.__name__}")
    try:  # (a Keyword subclass: its text checked again; a str or str enum member: its text)
        key = data_of(name) if issubclass(kind, Keyword) else \
            Keyword(name)  # type: ignore[arg-type]  # (a str: issubclass)
        return intern_keyword(str.__str__(key))
    except ValueError as exc:
        raise ValueError(f"body field name {name!r}: {exc}") from None


def _add_fields(out: list[Value], items: tuple[object, ...], fields: dict[str, object],
                positional: bool) -> None:
    seen: set[Keyword] = set()

    def add(key: Keyword, value: object) -> None:
        if key in seen:
            raise ValueError(f"body field `{key.text}` is given twice")
        seen.add(key)
        out.append(key)
        out.append(check_value(value, "body field", key.text))

    for item in items:
        if issubclass(type(item), Mapping):  # (its type: not what its __class__ says)
            mapping: Mapping[object, object] = item  # type: ignore[assignment]  # (issubclass)
            for name, value in mapping.items():
                add(_literal_key(name), value)
        elif positional:
            out.append(check_value(item, "body item", str(len(out))))
        else:
            raise TypeError(f"cbcl.keys() takes mappings and keyword arguments, not "
                            f"{type(item).__name__}")
    for name, value in fields.items():
        add(_python_key(name), value)


def body(head: str, /, *items: object, **fields: object) -> tuple[Value, ...]:
    """The list ``(head item… :key value …)``: ``body("bid", item="lamp",
    amount=Decimal("12.50"))`` is ``(bid :item "lamp" :amount 12.50)``.

    ``head`` is a symbol name (``str`` or :class:`Symbol`). Each positional item is a
    value placed after the head (``Symbol("weather")``), or a mapping whose keys are
    keyword names taken literally (``{"order_id": "A-1"}``); keyword arguments follow, in
    order, named as the module describes (``task_id=`` is ``:task-id``). Values convert as
    :func:`as_value` does.

    Raises ``TypeError`` for a value that is not a CBCL value or a head that is not a
    string, ``ValueError`` for an atom out of range, a name that is not a symbol or
    keyword, or a field given twice; each message names the field.
    """
    if type(head) is not Symbol:
        kind = type(head)
        if not issubclass(kind, str) or issubclass(kind, (Keyword, URI)):
            raise TypeError(f"a body's head is a symbol name (str or Symbol), not "
                            f"{kind.__name__}")
        # (a subclass, a str enum member: its text, read as data and checked again)
        head = data_of(head) if issubclass(kind, Symbol) else \
            Symbol(head)  # type: ignore[assignment]  # (a Symbol: data_of's)
    out: list[Value] = [intern_symbol(str.__str__(head))]
    _add_fields(out, items, fields, True)
    return tuple(out)


def keys(*mappings: Mapping[str | Keyword, object], **fields: object) -> tuple[Value, ...]:
    """The keyword-argument list ``(:key value …)`` without a head: ``keys(cpu=2,
    mem=4096)`` is ``(:cpu 2 :mem 4096)``. Names and values as for :func:`body`.

    Raises as :func:`body` (``TypeError`` also for a positional argument that is not a
    mapping).
    """
    out: list[Value] = []
    _add_fields(out, mappings, fields, False)
    return tuple(out)


# --------------------------------------------------------------------------- reading


def _kind(value: object) -> str:
    if type(value) is Fields:
        return "a list of fields"
    return {tuple: "a list", str: "a string", int: "an integer", Decimal: "a decimal",
            Symbol: "a symbol", Keyword: "a keyword", URI: "a URI"}.get(
                type(value), type(value).__name__)


def _shown(value: FieldValue) -> str:
    """A short text of ``value``; views (in a list the schema typed) as their lists."""
    text = canonical_prefix(_raw(value), 41)  # (enough to tell; any depth)
    return text if len(text) <= 40 else text[:37] + "..."


def _raw(value: FieldValue) -> Value:
    if type(value) is Fields:
        return value.raw
    if type(value) is tuple:
        return tuple(_raw(item) for item in value)
    return value  # type: ignore[return-value]  # an atom: a Value already


def _name(name: object) -> str:
    """A field name as looked up: ``"price"``, ``":price"`` or ``Keyword("price")``."""
    if type(name) is Keyword:
        return str.__str__(name)
    if type(name) is str:
        return name[1:] if name.startswith(":") else name
    raise TypeError(f"a field name is a str or Keyword, not {type(name).__name__}")


def _leading_symbols(items: tuple[Value, ...]) -> int:
    count = 0
    for item in items:
        if type(item) is not Symbol:
            break
        count += 1
    return count


def _has_fields(items: tuple[Value, ...]) -> bool:
    """True if ``items`` is ``(symbol… :key value …)`` with at least one field (so that a
    plain list such as ``(pending shipped)`` is not read as fields)."""
    start = _leading_symbols(items)
    rest = len(items) - start
    if rest < 2 or rest % 2:
        return False
    names = items[start::2]
    return all(type(key) is Keyword for key in names) and len(set(names)) == len(names)


class Fields(Mapping[str, "FieldValue"]):
    """A read-only view of a list ``(head … :key value …)``: its leading symbols (the
    heads), then its fields by name.

    ``Fields(value)`` reads ``value`` as it is: a field whose value is itself such a list
    with at least one field reads as a nested :class:`Fields`; any other value is returned
    as it is (a plain list stays a ``tuple``). With ``schema`` (a protocol's compiled
    :class:`Schema`, ``protocol.schema``), a list whose head a record names is first
    checked against it, and then read by its types: a ``record`` or ``keys`` field is a
    nested :class:`Fields` (even with no fields), a ``list-of`` field a ``tuple`` of its
    elements read by the element type, ``any`` as without a schema, atoms as they are
    (``integer`` an ``int``, ``decimal`` a ``Decimal``, ``symbol`` and ``one-of`` a
    :class:`Symbol` …); :meth:`to_dict` gives ``boolean`` fields as ``bool``. The values are
    the message's own CBCL values: nothing is re-parsed.

    Look fields up by name, with or without the colon (``view["task-id"]``,
    ``view[":task-id"]``, ``view[Keyword("task-id")]``); iteration gives the names in
    order. There is no attribute access: a name such as ``:keys`` or ``:get`` would be
    shadowed, and ``_`` could not say whether ``:order_id`` or ``:order-id`` is meant.
    :meth:`require` reads a field as one exact type (for code that mypy checks).

    Raises ``TypeError`` if ``value`` is not a CBCL value (a Python ``list`` included:
    convert it with :func:`as_value`), :class:`FieldsError` if it is not of that form
    (an atom, an odd number of items after the heads, a non-keyword key, a key given
    twice), and :class:`SchemaError` if it breaks ``schema``.
    """

    __slots__ = ("_cache", "_heads", "_index", "_path", "_type", "_value")

    _value: tuple[Value, ...]
    _type: Record | Keys | None
    _heads: tuple[str, ...]
    _index: dict[str, int]
    _cache: dict[str, FieldValue]
    _path: str

    def __init__(self, value: Value, *, schema: Schema | None = None,
                 path: str = "$") -> None:
        if schema is not None and not isinstance(schema, Schema):
            raise TypeError("schema must be a cbcl.conversation.Schema, not "
                            f"{type(schema).__name__}")
        kind: Record | None = None
        if schema is not None:
            kind = schema.record_for(value)
            if kind is not None:
                check_schema(schema, value, path=path)
        self._setup(value, kind, path)

    @classmethod
    def _typed(cls, value: Value, kind: Record | Keys | None, path: str) -> Fields:
        view = object.__new__(cls)
        view._setup(value, kind, path)
        return view

    def _setup(self, value: Value, kind: Record | Keys | None, path: str) -> None:
        if type(value) is not tuple:
            if not _is_atom(value):
                if isinstance(value, list):
                    raise TypeError("Fields reads a CBCL value, and a list is a tuple: "
                                    "convert a Python list with cbcl.as_value()")
                raise TypeError(_refusal(value))
            raise FieldsError(f"{path}: expected a (head :key value …) list, found "
                              f"{_kind(value)} {_shown(value)}", path=path)
        start = len(kind.heads) if isinstance(kind, Record) else 0 if kind is not None \
            else _leading_symbols(value)
        inner = path + (f".{value[0]}" if start else "")
        if (len(value) - start) % 2:
            at = f"{inner}[{len(value) - 1}]"
            raise FieldsError(f"{at}: a (head :key value …) list has a value after each "
                              f"key; {_shown(value[-1])} has none", path=at)
        index: dict[str, int] = {}
        for i in range(start, len(value), 2):
            key = value[i]
            if type(key) is not Keyword:
                at = f"{inner}[{i}]"
                if not _is_value(key):
                    raise TypeError(f"{at}: {_refusal(key)}")
                raise FieldsError(f"{at}: expected a keyword, found {_kind(key)} "
                                  f"{_shown(key)}", path=at)
            name = str.__str__(key)
            if name in index:
                at = f"{inner}[{key.text}]"
                raise FieldsError(f"{at}: key {key.text} is given twice", path=at)
            index[name] = i + 1
        self._value = value
        self._type = kind
        self._heads = tuple(str.__str__(h) for h in value[:start])
        self._index = index
        self._cache = {}
        self._path = path

    # ----------------------------------------------------------------- the mapping

    def __getitem__(self, name: str | Keyword) -> FieldValue:
        """The field ``name`` (``KeyError`` if the list has none)."""
        key = _name(name)
        found = self._cache.get(key)  # (a field's value is never None)
        if found is not None:
            return found
        index = self._index.get(key)
        if index is None:
            raise KeyError(key)
        found = self._read(self._value[index], self._field_type(index), self._child(key))
        self._cache[key] = found
        return found

    def __contains__(self, name: object) -> bool:
        try:
            return _name(name) in self._index
        except TypeError:
            return False

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)

    def __eq__(self, other: object) -> bool:
        return type(other) is Fields and other._value == self._value

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash(self._value)

    def __repr__(self) -> str:
        text = canonical_prefix(self._value, 61)
        return f"Fields({text if len(text) <= 60 else text[:57] + '...'})"

    # ----------------------------------------------------------------- the list

    @property
    def head(self) -> str | None:
        """The first head symbol's name (``"bid"``), or ``None`` for ``(:key value …)``."""
        return self._heads[0] if self._heads else None

    @property
    def heads(self) -> tuple[str, ...]:
        """The names of all the leading symbols: ``("query", "weather")``."""
        return self._heads

    @property
    def raw(self) -> tuple[Value, ...]:
        """The list itself, as the CBCL value it is (a ``tuple``)."""
        return self._value

    @property
    def path(self) -> str:
        """Where the list is (``$.body``, ``$.body.cfp[:task]``): errors name it."""
        return self._path

    def require(self, name: str | Keyword, kind: type[_T]) -> _T:
        """The field ``name``, which must be of exactly the type ``kind`` (``str``,
        ``int``, ``Decimal``, ``Symbol``, ``Keyword``, ``URI``, ``tuple`` or
        :class:`Fields`): ``view.require("price", Decimal)``.

        Raises :class:`FieldsError` if the field is missing or of another type (a symbol
        is not a ``str`` here).
        """
        key = _name(name)
        try:
            found = self[key]
        except KeyError:
            raise FieldsError(f"{self._path}: required field :{key} is missing",
                              path=self._path) from None
        if type(found) is not kind:
            at = self._child(key)
            shown = "" if type(found) is Fields else " " + _shown(found)
            raise FieldsError(f"{at}: expected {kind.__name__}, found {_kind(found)}{shown}",
                              path=at)
        return found

    def to_dict(self, *, as_str: bool = False) -> dict[str, Any]:
        """The fields as plain Python: a ``dict`` by name (heads left out: read
        :attr:`head`), nested :class:`Fields` as ``dict``, lists as ``list``; strings,
        integers and decimals as they are, and a schema's ``boolean`` as ``bool``.
        ``as_str=True`` gives symbols and URIs as ``str`` and keywords as ``":name"``.
        Iterative: any depth. Raises nothing."""
        result: dict[str, Any] = {}
        stack: list[tuple[Iterator[tuple[str | None, Any, SchemaType | None]], Any]] = [
            (self._items_typed(), result)]
        while stack:
            items, out = stack[-1]
            for key, value, kind in items:
                child: Any
                if type(value) is Fields:
                    child = {}
                    stack.append((value._items_typed(), child))
                elif type(value) is tuple:
                    child = []
                    item_kind = kind.item if isinstance(kind, ListOf) else None
                    stack.append((((None, v, item_kind) for v in value), child))
                else:
                    child = _plain_atom(value, kind, as_str)
                if key is None:
                    out.append(child)
                else:
                    out[key] = child
                if type(value) is Fields or type(value) is tuple:
                    break
            else:
                stack.pop()
        return result

    # ----------------------------------------------------------------- internals

    def _items_typed(self) -> Iterator[tuple[str | None, Any, SchemaType | None]]:
        for key, index in self._index.items():
            yield key, self[key], self._field_type(index)

    def _child(self, key: str) -> str:
        return self._path + (f".{self._heads[0]}" if self._heads else "") + f"[:{key}]"

    def _field_type(self, index: int) -> SchemaType | None:
        kind = self._type
        if kind is None:
            return None
        keys = kind.keys if isinstance(kind, Record) else kind
        key: Any = self._value[index - 1]
        return keys.fields.get(key, keys.other)

    @classmethod
    def _read(cls, value: Value, kind: SchemaType | None, path: str) -> FieldValue:
        """A field's value as the view gives it (see the class)."""
        if isinstance(kind, (Record, Keys)):
            return cls._typed(value, kind, path)
        if isinstance(kind, ListOf) and type(value) is tuple:
            return tuple(cls._read(item, kind.item, f"{path}[{i}]")
                         for i, item in enumerate(value))
        if (kind is None or (isinstance(kind, AtomType) and kind.kind == "any")) and \
                type(value) is tuple and _has_fields(value):
            return cls._typed(value, None, path)
        return value


def _plain_atom(value: Any, kind: SchemaType | None, as_str: bool) -> Any:
    if isinstance(kind, AtomType) and kind.kind == "boolean":
        return value == _TRUE
    if as_str:
        if type(value) is Keyword:
            return value.text
        if type(value) is Symbol or type(value) is URI:
            return str.__str__(value)
    return value
