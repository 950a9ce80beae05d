"""Typed records: Python classes for a protocol's bodies (spec/declarations.md §8).

::

    class SampleRequest(cbcl.Record, intent="REQUEST"):
        sample_id: Annotated[str, cbcl.Length(1, 32)]
        assay: Literal["cbc", "hba1c"]
        priority: Annotated[int, cbcl.Range(1, 5)] = 3
        note: str | None = None

is the record ``(record sample-request (:sample-id (string :min-length 1 :max-length 32)
required) (:assay (one-of cbc hba1c) required) (:priority (integer :min 1 :max 5))
(:note string))`` of a declaration, and its instances are immutable, slotted values.

Theory of operation. A class statement is read once, when the class is made
(:class:`_RecordMeta`): its annotations are resolved and each becomes a *field plan* — the
member's keyword, the schema type it declares (as the declaration's text, compiled with the
schema's own compiler), how a Python value is checked and turned into the wire value (for
the constructor), and how a wire value becomes the Python value (for decoding). From the
plans the class gets its ``__slots__``, a keyword-only ``__init__``, ``__eq__``,
``__hash__``, ``__repr__`` and ``__match_args__``, and one decoding function,
``_from_body``, written as Python source over *identifiers only* (the field names, which
are Python identifiers; keywords, converters and defaults are passed as constants in its
namespace), so decoding is one call without per-field introspection.

Every instance carries its body's wire value (the slot ``__cbcl_body__``): the constructor
builds it and checks it against the record's compiled schema (so every instance
validates), and decoding keeps the body it was given (so a decoded record encodes back
byte for byte, key order included). ``cbcl.Message(body=record)`` reads that value.

Decoding (:func:`record_of`) converts a message a parser has accepted: when the message's
protocol holds, for the body's heads, a record equal to the class's own (compared once per
protocol and class, then remembered), the body needs no further check; otherwise it is
checked against the class's schema first. A body that is not the class's (other heads,
another intent, a value the class's schema refuses) is a :class:`SchemaError`.
"""

from __future__ import annotations

import re
import sys
import threading
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, ClassVar, TypeVar, Union

from ..core._canonical import canonical_value
from ..core._errors import DescriptorError, SchemaError
from ..core._reader import intern_keyword, intern_symbol, read
from ..core._values import URI, Keyword, Symbol, Value, _Atom
from ..grammar._subset import GrammarLimits
from ._declaration import DECLARATION_HEAD, compile_declared_type, read_declaration
from ._fields import check_value
from ._message import Intent, Message
from ._protocol import Protocol
from ._schema import Record as RecordType, Schema, _Bad, _compile_type, check_schema

try:
    from .._native import RecordConverter as _RecordConverter_c
except ImportError:  # not built: the classes' Python _from_body only
    _RecordConverter: Any = None
else:
    _RecordConverter = _RecordConverter_c

__all__ = [
    "Declared",
    "Key",
    "Length",
    "Range",
    "Record",
    "Scheme",
    "declaration_of",
    "descriptor_from",
    "record_of",
]

R = TypeVar("R", bound="Record")


# ------------------------------------------------------------------------ annotations

@dataclass(frozen=True, slots=True)
class Range:
    """``Annotated[int, cbcl.Range(1, 5)]``: the schema's ``:min``/``:max`` (inclusive;
    ``None`` for no bound) of an ``int``, ``Decimal`` or ``int | Decimal`` member."""

    min: int | Decimal | None = None
    max: int | Decimal | None = None


@dataclass(frozen=True, slots=True)
class Length:
    """``Annotated[str, cbcl.Length(1, 64)]``: the schema's ``:min-length``/``:max-length``
    of a string, symbol or list member (``None`` for no bound)."""

    min: int | None = None
    max: int | None = None


@dataclass(frozen=True, slots=True)
class Scheme:
    """``Annotated[cbcl.URI, cbcl.Scheme("agent")]``: the schema's ``(uri :scheme …)``."""

    scheme: str


@dataclass(frozen=True, slots=True)
class Key:
    """``Annotated[str, cbcl.Key("sample-id")]``: the member's keyword (without its
    colon), where the default (the field name with ``_`` written ``-``) is not wanted."""

    name: str


@dataclass(frozen=True, slots=True)
class Declared:
    """``Annotated[cbcl.Value, cbcl.Declared("(one-of \\"x\\" y 2)")]``: a member of the
    schema type written out (any type of spec/conversations.md §2, or a declaration's
    ``(either …)``, spec/declarations.md §1.1, whose schema projection is ``any``), held as
    its CBCL value — for what no Python annotation says (``cbcl codegen`` writes it then)."""

    type: str


# --------------------------------------------------------------------------- field plans

# (cbcl.Value's own forward references, for a class whose module has not imported them)
_VALUE_NAMES: dict[str, Any] = {"Symbol": Symbol, "Keyword": Keyword, "URI": URI,
                                "Decimal": Decimal}
class _AnyValue:
    """What ``cbcl.Value`` (a string alias at run time) stands for in an annotation."""


_VALUE_ATOMS = {str, int, Decimal, Symbol, Keyword, URI}
_MISSING: Any = type("_Missing", (), {"__repr__": lambda self: "MISSING"})()
_TRUE, _FALSE = intern_symbol("true", pin=True), intern_symbol("false", pin=True)
_KEBAB = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


@dataclass(slots=True)
class _Plan:
    """One member: its attribute, keyword, schema type text, and converters."""

    name: str
    key: Keyword
    type_text: str
    required: bool
    default: Any
    #: A Python value (checked, coerced) -> (stored value, wire value); raises TypeError /
    #: ValueError.
    to_wire: Callable[[Any], tuple[Any, Value]]
    #: A checked wire value -> the stored value, or None where they are the same.
    from_wire: Callable[[Any], Any] | None
    #: The member's annotation without ``| None`` (for the C converter's plan).
    annotation: Any = None


def _bad_type(name: str, expected: str, value: object) -> TypeError:
    return TypeError(f"{name}: expected {expected}, not {type(value).__name__}")


def _atom_kind(name: str, tp: Any) -> tuple[str, Callable[[Any], tuple[Any, Value]]] | None:
    """The schema atom and checker for a plain annotation, or None."""
    if tp is str:
        def to_str(v: Any) -> tuple[Any, Value]:
            if type(v) is str:
                return v, v
            if isinstance(v, str) and not isinstance(v, _Atom):
                s = str.__str__(v)
                return s, s
            raise _bad_type(name, "str", v)
        return "string", to_str
    if tp is int:
        def to_int(v: Any) -> tuple[Any, Value]:
            if type(v) is int:
                return v, v
            raise _bad_type(name, "int", v)
        return "integer", to_int
    if tp is Decimal:
        def to_dec(v: Any) -> tuple[Any, Value]:
            if type(v) is Decimal:
                return v, v
            if type(v) is int:
                d = Decimal(v)
                return d, d
            raise _bad_type(name, "Decimal (or int)", v)
        return "decimal", to_dec
    if tp is bool:
        def to_bool(v: Any) -> tuple[Any, Value]:
            if v is True:
                return True, _TRUE
            if v is False:
                return False, _FALSE
            raise _bad_type(name, "bool", v)
        return "boolean", to_bool
    if tp is datetime:
        def to_time(v: Any) -> tuple[Any, Value]:
            if type(v) is not datetime:
                raise _bad_type(name, "datetime", v)
            if v.tzinfo is None:
                raise ValueError(f"{name}: a datetime with a time zone (UTC on the wire)")
            delta = v - _EPOCH
            if delta.microseconds % 1000:
                raise ValueError(f"{name}: a datetime to the millisecond (integer ms on "
                                 "the wire)")
            ms = (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000
            return v.astimezone(UTC), ms
        return "integer", to_time
    for atom, kind in ((Symbol, "symbol"), (Keyword, "keyword"), (URI, "uri")):
        if tp is atom:
            def to_atom(v: Any, atom: Any = atom) -> tuple[Any, Value]:
                if type(v) is atom:
                    return v, v
                if type(v) is str:
                    try:
                        made = atom(v)
                    except ValueError as exc:
                        raise ValueError(f"{name}: {exc}") from None
                    return made, made
                raise _bad_type(name, f"{atom.__name__} (or str)", v)
            return kind, to_atom
    return None


def _any_value(name: str) -> Callable[[Any], tuple[Any, Value]]:
    def to_value(v: Any) -> tuple[Any, Value]:
        if isinstance(v, Record):
            body = v.to_body()
            return body, body
        value = check_value(v, name, "$")
        return value, value
    return to_value


def _options(pairs: Iterable[tuple[str, object]]) -> str:
    return "".join(f" :{k} {canonical_value(v)}" for k, v in pairs if v is not None)  # type: ignore[arg-type]


def _plan_type(name: str, tp: Any, owner: str
               ) -> tuple[str, Callable[[Any], tuple[Any, Value]], Callable[[Any], Any] | None]:
    """(schema type text, to_wire, from_wire) of annotation ``tp``. Raises TypeError for an
    annotation with no schema type."""
    extras: list[Any] = []
    while typing.get_origin(tp) is typing.Annotated:
        args = typing.get_args(tp)
        tp, extras = args[0], [*args[1:], *extras]
    declared = next((e for e in extras if isinstance(e, Declared)), None)
    if declared is not None:
        try:
            value = read(declared.type)
            compile_declared_type(value, "$", 2)
        except _Bad as exc:
            raise TypeError(f"{owner}.{name}: cbcl.Declared: {exc}") from None
        except Exception as exc:
            raise TypeError(f"{owner}.{name}: cbcl.Declared: {exc}") from None
        return canonical_value(value), _any_value(name), None
    bounds = next((e for e in extras if isinstance(e, Range)), None)
    length = next((e for e in extras if isinstance(e, Length)), None)
    scheme = next((e for e in extras if isinstance(e, Scheme)), None)

    def closed(kind: str, opts: str) -> str:
        return f"({kind}{opts})" if opts else kind

    try:  # (a bound the wire cannot carry: an int outside 64 bits, a non-finite Decimal)
        len_opts = _options((("min-length", length.min), ("max-length", length.max))) \
            if length else ""
        range_opts = _options((("min", bounds.min), ("max", bounds.max))) if bounds else ""
    except ValueError as exc:
        raise TypeError(f"{owner}.{name}: {exc}") from None
    origin = typing.get_origin(tp)
    if tp is Any or tp is _AnyValue or (origin in (Union, types.UnionType) and
                                        set(typing.get_args(tp)) >= _VALUE_ATOMS):
        return "any", _any_value(name), None
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if set(args) == {int, Decimal}:
            def to_num(v: Any) -> tuple[Any, Value]:
                if type(v) is int or type(v) is Decimal:
                    return v, v
                raise _bad_type(name, "int or Decimal", v)
            return closed("number", range_opts), to_num, None
        raise TypeError(f"{owner}.{name}: a union is a body's choice of records "
                        "(type=A | B), not a member's type (use cbcl.Value)")
    if origin is typing.Literal:
        values = typing.get_args(tp)
        wire: list[Value] = []
        for v in values:
            if type(v) is str:
                try:
                    wire.append(Symbol(v))
                except ValueError:
                    raise TypeError(f"{owner}.{name}: Literal[{v!r}] is not a symbol") from None
            elif type(v) is int:
                wire.append(v)
            else:
                raise TypeError(f"{owner}.{name}: Literal of str (symbols) or int only")
        allowed = dict(zip(values, wire, strict=True))

        def to_literal(v: Any) -> tuple[Any, Value]:
            if isinstance(v, _Atom) or type(v) not in (str, int):
                raise _bad_type(name, "one of " + ", ".join(map(repr, values)), v)
            found = allowed.get(v, _MISSING)
            if found is _MISSING:
                raise ValueError(f"{name}: expected one of {', '.join(map(repr, values))}, "
                                 f"not {v!r}")
            return v, found
        text = "(one-of " + " ".join(canonical_value(w) for w in wire) + ")"
        symbolic = any(type(v) is str for v in values)
        return text, to_literal, (str.__str__ if symbolic and all(type(v) is str for v in values)
                                  else (_plain_of if symbolic else None))
    if origin in (list, tuple):
        args = typing.get_args(tp)
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            raise TypeError(f"{owner}.{name}: a list member is list[T] or tuple[T, ...]")
        item_text, item_to, item_from = _plan_type(name, args[0], owner)
        made = list if origin is list else tuple

        def to_list(v: Any) -> tuple[Any, Value]:
            if type(v) is not list and type(v) is not tuple:
                raise _bad_type(name, "a list or tuple", v)
            pairs = [item_to(x) for x in v]
            return made(p[0] for p in pairs), tuple(p[1] for p in pairs)
        if item_from is None:
            from_list: Callable[[Any], Any] | None = None if made is tuple else list
        else:
            def from_list(v: Any, f: Callable[[Any], Any] = item_from) -> Any:
                return made(map(f, v))
        return f"(list-of {item_text}{len_opts})", to_list, from_list
    if isinstance(tp, type) and issubclass(tp, Record) and tp is not Record:
        record_cls = tp

        def to_record(v: Any) -> tuple[Any, Value]:
            if type(v) is not record_cls:
                raise _bad_type(name, record_cls.__name__, v)
            return v, v.to_body()
        return (record_cls.__cbcl_type__, to_record,
                getattr(record_cls, "_from_body_python"))  # noqa: B009
    found = _atom_kind(name, tp)
    if found is None:
        raise TypeError(f"{owner}.{name}: no schema type for the annotation {tp!r} (str, int, "
                        "Decimal, bool, cbcl.Symbol/Keyword/URI/Value, Literal, list[T], "
                        "a cbcl.Record, or Annotated[…, cbcl.Declared(…)])")
    kind, to_wire = found
    opts = {"string": len_opts, "symbol": len_opts, "integer": range_opts,
            "decimal": range_opts, "uri": _options((("scheme", Symbol(scheme.scheme)
                                                      if scheme else None),))}.get(kind, "")
    return closed(kind, opts), to_wire, (_bool_of if kind == "boolean" else
                                         _time_of if tp is datetime else None)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _time_of(ms: int) -> datetime:
    """A checked integer (ms since the epoch, UTC) as a datetime; out of datetime's range
    it is a ValueError (the caller's SchemaError)."""
    try:
        return _EPOCH + timedelta(milliseconds=ms)
    except OverflowError:
        raise ValueError(f"{ms} ms is outside the datetime range") from None


def _plain_of(v: Any) -> Any:
    return str.__str__(v) if type(v) is Symbol else v


def _bool_of(v: Any) -> bool:
    return v is _TRUE or (type(v) is Symbol and str.__eq__(v, "true"))


# ---------------------------------------------------------------------------- the class

@typing.dataclass_transform(kw_only_default=True, frozen_default=True)
class _RecordMeta(type):
    """Makes a :class:`Record` subclass: slots from its annotations, the methods from its
    field plans (see the module's comment)."""

    def __new__(mcs, name: str, bases: tuple[type, ...], namespace: dict[str, Any],
                intent: str | Iterable[str] | None = None, head: str | Iterable[str] | None = None,
                ordered: int = 0, **kwargs: Any) -> _RecordMeta:
        if namespace.get("__module__") == __name__ and name == "Record":
            return super().__new__(mcs, name, bases, namespace, **kwargs)
        if any(b is not Record and issubclass(b, Record) for b in bases if isinstance(b, type)):
            raise TypeError(f"{name}: a record class derives from cbcl.Record directly")
        annotations = dict(namespace.get("__annotations__", {}))
        fields = [f for f, a in annotations.items()
                  if not (isinstance(a, str) and a.startswith(("ClassVar", "typing.ClassVar")))
                  and typing.get_origin(a) is not ClassVar]  # type: ignore[comparison-overlap]
        defaults = {f: namespace.pop(f) for f in fields if f in namespace}
        namespace["__slots__"] = tuple(fields)
        namespace["__match_args__"] = tuple(fields)
        cls = super().__new__(mcs, name, bases, namespace, **kwargs)
        _prepare(cls, name, fields, defaults, intent, head, ordered)
        return cls


def _names(value: str | Iterable[str] | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    return tuple(value.split()) if isinstance(value, str) else tuple(value)


def _prepare(cls: Any, name: str, fields: list[str], defaults: dict[str, Any],
             intent: str | Iterable[str] | None, head: str | Iterable[str] | None,
             ordered: int = 0) -> None:
    module = sys.modules.get(cls.__module__)
    names = {**globals(), **_VALUE_NAMES, **(vars(module) if module is not None else {})}
    for known, value in list(names.items()):  # (cbcl.Value, a str at run time, as a type)
        if value is Value:
            names[known] = _AnyValue
        elif isinstance(value, types.ModuleType) and getattr(value, "Value", None) is Value:
            names[known] = types.SimpleNamespace(**{**vars(value), "Value": _AnyValue})
    try:
        hints = typing.get_type_hints(cls, globalns=names, include_extras=True)
    except Exception as exc:  # (a name not defined yet: the class itself, a later class)
        raise TypeError(f"{name}: an annotation cannot be resolved ({exc}); a record "
                        "holds records defined before it") from None
    intents = _names(intent) or ()
    try:
        cls.__cbcl_intents__ = tuple(Intent(i) for i in intents)
    except ValueError:
        raise TypeError(f"{name}: unknown intent in {intents}") from None
    heads = _names(head)
    if heads is None:
        heads = (_KEBAB.sub("-", name).lower(),)
    try:
        cls.__cbcl_heads__ = tuple(intern_symbol(str.__str__(Symbol(h)), pin=True)
                                   for h in heads)
    except ValueError as exc:
        raise TypeError(f"{name}: a head is a symbol: {exc}") from None
    if not cls.__cbcl_heads__ and cls.__cbcl_intents__:
        raise TypeError(f"{name}: a body (intent=…) has a head symbol")
    plans: list[_Plan] = []
    keys: set[str] = set()
    for field_name in fields:
        if field_name.startswith("_") or not field_name.isidentifier():
            raise TypeError(f"{name}.{field_name}: a member's name does not start with _")
        tp = hints[field_name]
        bare = tp
        if typing.get_origin(bare) in (Union, types.UnionType):  # (X | None)
            bare = next((a for a in typing.get_args(bare) if a is not type(None)), bare)
        extras = typing.get_args(bare)[1:] if typing.get_origin(bare) is typing.Annotated \
            else ()
        key_name = next((e.name for e in extras if isinstance(e, Key)),
                        field_name.replace("_", "-"))
        try:
            key = intern_keyword(str.__str__(Keyword(key_name)), pin=True)
        except ValueError as exc:
            raise TypeError(f"{name}.{field_name}: {exc}") from None
        if key in keys:
            raise TypeError(f"{name}.{field_name}: the key :{key} is another field's too")
        keys.add(key)
        default = defaults.get(field_name, _MISSING)
        optional = False
        inner = tp
        if typing.get_origin(inner) in (Union, types.UnionType) and \
                type(None) in typing.get_args(inner):
            rest = tuple(a for a in typing.get_args(inner) if a is not type(None))
            inner = rest[0] if len(rest) == 1 else Union[rest]  # noqa: UP007
            optional = True
        text, to_wire, from_wire = _plan_type(field_name, inner, name)
        if optional:
            to_wire = _optional(to_wire)
            if default is _MISSING:
                raise TypeError(f"{name}.{field_name}: an Optional member has a default "
                                "(= None)")
        plans.append(_Plan(field_name, key, text, default is _MISSING, default, to_wire,
                           from_wire, inner))
    if type(ordered) is not int or not 0 <= ordered <= len(plans):
        raise TypeError(f"{name}: ordered= is how many of the members, in order, come "
                        f"first in a fixed order (0 to {len(plans)})")
    written = [f"({canonical_value(p.key)} {p.type_text}{' required' if p.required else ''})"
               for p in plans]
    if ordered:  # (spec/declarations.md §1.1: the first members in a fixed place)
        written[:ordered] = ["(ordered " + " ".join(written[:ordered]) + ")"]
    members = " ".join(written)
    if cls.__cbcl_heads__:
        text = "(record " + " ".join(cls.__cbcl_heads__) + (" " + members if members else "") + ")"
    else:
        text = "(keys" + (" " + members if members else "") + ")"
    try:  # (the schema's record is the declared one's projection, §1.1)
        _, projected = compile_declared_type(read(text), "$", 1)
        compiled = _compile_type(projected, "$", 1)
    except _Bad as exc:
        raise TypeError(f"{name}: {exc}") from None
    cls.__cbcl_type__ = text
    cls.__cbcl_compiled__ = compiled
    cls.__cbcl_plans__ = tuple(plans)
    cls.__cbcl_schema__ = Schema((compiled,)) if isinstance(compiled, RecordType) else None
    cls.__cbcl_keys_schema__ = None if cls.__cbcl_schema__ is not None else \
        Schema((RecordType((_KEYS_HEAD,), compiled),))  # type: ignore[arg-type]
    cls.__cbcl_trusted__ = {}
    for p in plans:
        if not p.required and p.default is not None:
            try:
                p.to_wire(p.default)
            except (TypeError, ValueError) as exc:
                raise TypeError(f"{name}.{p.name}: its default: {exc}") from None
    _make_methods(cls, plans)


def _optional(to_wire: Callable[[Any], tuple[Any, Value]]) -> Callable[[Any], tuple[Any, Value]]:
    def to_optional(v: Any) -> tuple[Any, Value]:
        return (None, None) if v is None else to_wire(v)  # type: ignore[return-value]  # (None: absent)
    return to_optional


def _make_methods(cls: Any, plans: list[_Plan]) -> None:
    """``__init__`` and ``_from_body``, written over identifiers only (the field names,
    none of which starts with ``_``; every local and constant here does)."""
    names = [p.name for p in plans]
    ns: dict[str, Any] = {"_new": object.__new__, "_cls": cls,
                          "_MISSING": _MISSING, "_check": _check_made, "_dict": dict,
                          "_zip": zip, "_heads": cls.__cbcl_heads__, "_list": list,
                          "_tuple": tuple, "_type": type, "_hash": hash,
                          "_NotImplemented": NotImplemented}
    for i, p in enumerate(plans):
        ns[f"_k{i}"], ns[f"_w{i}"], ns[f"_f{i}"], ns[f"_d{i}"] = \
            p.key, p.to_wire, p.from_wire, p.default
        ns[f"_s{i}"] = _slot_setter(cls, p.name)
    ns["_sb"] = _slot_setter(cls, "__cbcl_body__")
    ns["_len"] = len
    params = ", ".join(f"{p.name}" if p.required else f"{p.name}=_d{i}"
                       for i, p in enumerate(plans))
    lines = [f"def __init__(_self{', *, ' + params if params else ''}):",
             "    _wire = _list(_heads)"]
    for i, p in enumerate(plans):
        lines.append(f"    {p.name}, _v = _w{i}({p.name})")
        if p.required:
            lines.append(f"    _wire += (_k{i}, _v)")
        else:
            lines.append(f"    if _v is not None: _wire += (_k{i}, _v)")
    lines.append("    _body = _tuple(_wire)")
    lines.append("    _check(_cls, _body)")
    for i, p in enumerate(plans):
        lines.append(f"    _s{i}(_self, {p.name})")
    lines.append("    _sb(_self, _body)")
    # _from_body: the keys in the declared order (as the reader shares them, compared by
    # identity) are taken in one pass; any other order goes to _by_dict, which finds each
    # key in a dict of the body's pairs.
    start = len(cls.__cbcl_heads__)
    lines += ["def _from_body(_body):",
              "    _self = _new(_cls)",
              f"    _n = _len(_body); _i = {start}"]
    for i, p in enumerate(plans):
        value = "_body[_i + 1]" if p.from_wire is None else f"_f{i}(_body[_i + 1])"
        lines.append(f"    if _i < _n and _body[_i] is _k{i}:")
        lines.append(f"        _s{i}(_self, {value}); _i += 2")
        lines.append("    else:" if not p.required else "    else: return _by_dict(_body)")
        if not p.required:
            lines.append(f"        _s{i}(_self, _d{i})")
    lines += ["    if _i != _n: return _by_dict(_body)",
              "    _sb(_self, _body)",
              "    return _self"]
    lines += ["def _by_dict(_body):",
              "    _self = _new(_cls)",
              f"    _d = _dict(_zip(_body[{start}::2], _body[{start + 1}::2]))"]
    for i, p in enumerate(plans):
        get = f"_d[_k{i}]" if p.required else f"_d.get(_k{i}, _MISSING)"
        if p.required:
            value = get if p.from_wire is None else f"_f{i}({get})"
            lines.append(f"    _s{i}(_self, {value})")
        else:
            lines.append(f"    _v = {get}")
            converted = "_v" if p.from_wire is None else f"_f{i}(_v)"
            lines.append(f"    _s{i}(_self, _d{i} if _v is _MISSING else {converted})")
    lines += ["    _sb(_self, _body)", "    return _self"]

    fields = "".join(f"_self.{n}, " for n in names)
    other = "".join(f"_other.{n}, " for n in names)
    lines += ["def __eq__(_self, _other):",
              "    if _type(_other) is not _type(_self): return _NotImplemented",
              f"    return ({fields}) == ({other})",
              "def __hash__(_self):",
              f"    return _hash(({fields}))",
              "def __repr__(_self):",
              "    return f'{_type(_self).__name__}(" +
              ", ".join(f"{n}={{_self.{n}!r}}" for n in names) + ")'"]
    exec("\n".join(lines), ns)  # identifiers and constants only (see above)
    for method in ("__init__", "__eq__", "__hash__", "__repr__"):
        ns[method].__qualname__ = f"{cls.__qualname__}.{method}"
        setattr(cls, method, ns[method])
    cls._from_body_python = staticmethod(ns["_from_body"])
    converter = _native_converter(cls, plans)
    cls.__cbcl_converter__ = converter
    cls._from_body = cls._from_body_python if converter is None else converter


# The C converter (cbcl/_native_src/records.c): its member kinds, and the plan it is made of.
_RAW, _LOOKUP, _RECORD, _RECORDS_TUPLE, _RECORDS_LIST, _LIST, _BOOL, _CALL = range(8)


def _bare(tp: Any) -> Any:
    while typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    return tp


def _converter_of(tp: Any) -> Any:
    return getattr(tp, "__cbcl_converter__", None) if isinstance(tp, type) and \
        issubclass(tp, Record) and tp is not Record else None


def _member_kind(p: _Plan) -> tuple[int, Any]:
    """The C converter's (kind, argument) for member ``p`` (see records.c)."""
    if p.from_wire is None:
        return _RAW, None
    tp = _bare(p.annotation)
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        # (the reader's shared symbols: a decoded value is found by identity, no __eq__)
        return _LOOKUP, {(intern_symbol(str.__str__(Symbol(v)), pin=True) if type(v) is str
                          else v): v for v in typing.get_args(tp)}
    if tp is bool:
        return _BOOL, (_TRUE, _FALSE)
    nested = _converter_of(tp)
    if nested is not None:
        return _RECORD, nested
    if origin in (list, tuple):
        nested = _converter_of(_bare(typing.get_args(tp)[0]))
        if nested is not None:
            return (_RECORDS_LIST if origin is list else _RECORDS_TUPLE), nested
        if p.from_wire is list:
            return _LIST, None
    return _CALL, None


def _native_converter(cls: Any, plans: list[_Plan]) -> Any:
    """The class's C converter (records.c), or None where cbcl._native is not built."""
    if _RecordConverter is None:
        return None
    members = []
    for p in plans:
        kind, argument = _member_kind(p)
        members.append((p.key, _slot_member(cls, p.name), p.required, p.default, kind,
                        argument, p.from_wire))
    return _RecordConverter(cls, _slot_member(cls, "__cbcl_body__"), len(cls.__cbcl_heads__),
                            tuple(members), cls.__cbcl_heads__, cls.__cbcl_intents__)


def _slot_member(cls: Any, name: str) -> Any:
    """The member descriptor of slot ``name`` of ``cls`` (or of its base)."""
    for klass in cls.__mro__:
        member = klass.__dict__.get(name)
        if member is not None:
            return member
    raise TypeError(f"{cls.__name__} has no slot {name}")  # pragma: no cover


def _slot_setter(cls: Any, name: str) -> Callable[[Any, Any], None]:
    """The ``__set__`` of slot ``name`` of ``cls`` (or of its base): a call, no lookup."""
    for klass in cls.__mro__:
        member = klass.__dict__.get(name)
        if member is not None:
            setter: Callable[[Any, Any], None] = member.__set__
            return setter
    raise TypeError(f"{cls.__name__} has no slot {name}")  # pragma: no cover


def _check_made(cls: Any, body: Value) -> None:
    """Raise :class:`SchemaError` (a ``ValueError`` to the constructor's caller) if ``body``
    breaks the class's schema."""
    schema = cls.__cbcl_schema__
    if schema is not None:
        try:
            check_schema(schema, body, path=f"{cls.__name__}")
        except SchemaError as exc:
            raise ValueError(str(exc)) from None
        return
    try:  # a (keys …) type: checked as a record of one made-up head
        check_schema(cls.__cbcl_keys_schema__, (_KEYS_HEAD, *body),  # type: ignore[misc]
                     path=cls.__name__)
    except SchemaError as exc:
        raise ValueError(str(exc)) from None


_KEYS_HEAD = intern_symbol("keys", pin=True)


class Record(metaclass=_RecordMeta):
    """The base of typed record classes: ``class SampleRequest(cbcl.Record,
    intent="REQUEST"): sample_id: str …`` (spec/declarations.md §8).

    Class keywords: ``intent`` (one intent, or several separated by spaces; omitted for a
    record used only inside another), ``head`` (the head symbol(s); default the class name
    in kebab case, ``SampleRequest`` → ``sample-request``; ``head=()`` for a ``(keys …)``
    type). Each annotated field is a member, ``sample_id`` the key ``:sample-id`` (or
    ``Annotated[…, cbcl.Key("…")]``); one with a default is optional, ``X | None = None``
    absent when ``None``. Class creation raises ``TypeError`` for an annotation with no
    schema type.

    Instances are immutable and slotted, made with keyword arguments only. The
    constructor raises ``TypeError`` for a value of the wrong type and ``ValueError`` for
    one the record's schema refuses (a range, a length, a one-of); ``str`` is taken for a
    ``cbcl.Symbol``/``Keyword``/``URI`` member and ``int`` for a ``Decimal`` one. A
    ``datetime`` member (with a time zone, to the millisecond) is an ``integer`` of
    milliseconds since the epoch, UTC, on the wire."""

    __slots__ = ("__cbcl_body__",)

    __cbcl_heads__: ClassVar[tuple[Symbol, ...]]
    __cbcl_intents__: ClassVar[tuple[Intent, ...]]
    __cbcl_type__: ClassVar[str]
    __cbcl_schema__: ClassVar[Schema | None]
    __match_args__: ClassVar[tuple[str, ...]] = ()
    #: The body -> an instance: the C converter where cbcl._native is built (records.c),
    #: else :attr:`_from_body_python`, the Python the metaclass writes (its reference).
    _from_body: ClassVar[Callable[[Value], Any]]
    _from_body_python: ClassVar[Callable[[Value], Any]]
    __cbcl_converter__: ClassVar[Any]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        kwargs.pop("intent", None)
        kwargs.pop("head", None)
        super().__init_subclass__(**kwargs)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild, (type(self), self.to_body())

    @classmethod
    def from_body(cls: type[R], body: Value) -> R:
        """An instance from a body's value, checked against the class's schema. Raises
        :class:`SchemaError` for a body it refuses (``TypeError`` for a class without
        heads)."""
        schema = cls.__cbcl_schema__
        if schema is None:
            raise TypeError(f"{cls.__name__} is a (keys …) type, not a body")
        if schema.record_for(body) is None:
            raise SchemaError(f"$.body: expected ({' '.join(cls.__cbcl_heads__)} …), found "
                              f"{canonical_value(body)[:40]}", path="$.body")
        check_schema(schema, body)
        try:
            made: R = getattr(cls, "_from_body")(body)  # noqa: B009 - (set by the metaclass)
        except ValueError as exc:  # (as record_of)
            raise SchemaError(f"$.body: {exc}", path="$.body") from None
        return made

    def to_body(self) -> Value:
        """The body's CBCL value (as it will be written)."""
        body: Value = getattr(self, "__cbcl_body__")  # noqa: B009 - (a slot, unannotated)
        return body


def _rebuild(cls: type[Record], body: Value) -> Record:
    return cls.from_body(body)


# ------------------------------------------------------------------------------ decoding

_TRUST_LOCK = threading.Lock()
_TRUST_MAX = 64


def _classes(type_: Any) -> tuple[type[Record], ...]:
    """The record classes a ``type=`` argument names (a class, ``A | B``, or a tuple).
    Raises ``TypeError``."""
    if typing.get_origin(type_) in (Union, types.UnionType):
        found = typing.get_args(type_)
    elif isinstance(type_, tuple):
        found = type_
    else:
        found = (type_,)
    for c in found:
        if not (isinstance(c, type) and issubclass(c, Record) and c is not Record
                and c.__cbcl_schema__ is not None):
            raise TypeError(f"type= takes cbcl.Record classes with a head, not {c!r}")
    return found


def record_of(message: Message, type_: Any, protocol: Protocol | None = None) -> Any:
    """The body of ``message`` as an instance of ``type_``: :func:`record_of_python`'s
    result and errors, its ordinary case (one class, its head and intent, a protocol
    whose schema holds the class's record) converted by the class's C converter
    (cbcl/_native_src/records.c) in one call where cbcl._native is built."""
    converter = getattr(type_, "__cbcl_converter__", None) if type(type_) is _RecordMeta \
        else None
    if converter is None or protocol is None:
        return _record_of(message, type_, protocol, "_from_body")
    made = converter.of(message, protocol)
    if made is not None:
        return made
    made = _record_of(message, type_, protocol, "_from_body")
    if _trusted(type_, protocol):  # (remembered: the next body of this protocol is C's)
        converter.trust(protocol)
    return made


def record_of_python(message: Message, type_: Any, protocol: Protocol | None = None) -> Any:
    """:func:`record_of` in Python only (the reference of its C converter)."""
    return _record_of(message, type_, protocol, "_from_body_python")


def _record_of(message: Message, type_: Any, protocol: Protocol | None, convert: str) -> Any:
    """The body of ``message`` (one a parser has accepted) as an instance of the record
    class ``type_`` (or of one of ``A | B``, chosen by the body's heads).

    Raises :class:`SchemaError` (path ``$.body``) for a message without a body, a body
    whose heads are no class's, an intent the class does not declare, or a body the class's
    schema refuses (where ``protocol``'s schema does not hold the same record); and
    ``TypeError`` for a ``type_`` that is not a record class or a union of them."""
    classes: tuple[Any, ...] = (type_,) if type(type_) is _RecordMeta and \
        getattr(type_, "__cbcl_schema__", None) is not None else _classes(type_)
    body = message.body
    if type(body) is not tuple or not body:
        raise SchemaError("$.body: the message has no body to decode into a record",
                          path="$.body")
    for cls in classes:
        heads = cls.__cbcl_heads__
        if (body[0] is heads[0] or body[0] == heads[0]) and \
                (len(heads) == 1 or cls.__cbcl_schema__.record_for(body) is not None):
            break
    else:
        names = " | ".join(f"({' '.join(c.__cbcl_heads__)} …)" for c in classes)
        raise SchemaError(f"$.body: expected {names}, found {canonical_value(body)[:40]}",
                          path="$.body")
    intents = cls.__cbcl_intents__
    if intents and message.intent not in intents:
        raise SchemaError(f"$.body: {cls.__name__} is a body of "
                          f"{' '.join(i.value for i in intents)}, not {message.intent.value}",
                          path="$.body")
    if not _trusted(cls, protocol):
        check_schema(cls.__cbcl_schema__, body)
    try:
        return getattr(cls, convert)(body)
    except ValueError as exc:  # (a value the schema takes and Python cannot: a datetime)
        raise SchemaError(f"$.body: {exc}", path="$.body") from None


def _trusted(cls: Any, protocol: Protocol | None) -> bool:
    """Whether ``protocol``'s schema has checked the class's record already (its record
    for the class's heads is equal): remembered per class, for a few protocols."""
    if protocol is None or protocol.schema is None:
        return False
    known = cls.__cbcl_trusted__
    verdict = known.get(id(protocol))
    if verdict is not None and verdict[0] is protocol:
        return bool(verdict[1])
    theirs = protocol.schema.record_for(cls.__cbcl_heads__)
    same = theirs is not None and theirs == cls.__cbcl_compiled__
    with _TRUST_LOCK:
        if len(known) >= _TRUST_MAX:
            known.clear()
        known[id(protocol)] = (protocol, same)
    return same


# ------------------------------------------------------------------- building descriptors

def declaration_of(*classes: type[Record], id: str, version: int,
                   conversation: Value | str | None = None,
                   functions: Value | str | None = None, expires: int | None = None,
                   grammar: str | None = None, rules: dict[str, str] | None = None,
                   constraints: Value | str | None = None) -> Value:
    """The ``(protocol-declaration …)`` value the record classes make (spec/declarations.md
    §8): one ``(intent …)`` per intent, in the order the classes first name them, each
    listing its classes' records in the order given. ``conversation``, ``functions`` and
    ``constraints`` are values or their text; ``rules`` gives start rules by intent.
    Raises ``TypeError`` for a class that is not a record class with an intent,
    ``ValueError`` for a section's text that is not one value."""
    by_intent: dict[Intent, list[type[Record]]] = {}
    for cls in classes:
        if not (isinstance(cls, type) and issubclass(cls, Record) and cls is not Record):
            raise TypeError(f"expected cbcl.Record classes, not {cls!r}")
        if not cls.__cbcl_intents__:
            raise TypeError(f"{cls.__name__} names no intent (intent=…): it is not a body")
        for intent in cls.__cbcl_intents__:
            listed = by_intent.setdefault(intent, [])
            if cls not in listed:
                listed.append(cls)
    parts = [f"(id {id})", f"(version {version})"]
    if expires is not None:
        parts.append(f"(expires {expires})")
    if rules:  # (the intents in the order of ``rules``, then any other)
        ordered = {Intent(i): by_intent.get(Intent(i), []) for i in rules}
        by_intent = {**ordered, **by_intent}
    for intent, listed in by_intent.items():
        rule = (rules or {}).get(intent.value)
        parts.append(f"(intent {intent.value}" + (f" (rule {rule})" if rule else "")
                     + "".join(" " + c.__cbcl_type__ for c in listed) + ")")
    if grammar is not None:
        parts.append(f"(grammar {canonical_value(grammar)})")
    for section in (conversation, functions, constraints):
        if section is not None:
            parts.append(section if isinstance(section, str) else canonical_value(section))
    try:
        return read(f"({DECLARATION_HEAD} " + " ".join(parts) + ")")
    except Exception as exc:  # (a bad id, version or section text)
        raise ValueError(f"cannot make a declaration of these classes: {exc}") from None


def descriptor_from(*classes: type[Record], id: str, version: int,
                    conversation: Value | str | None = None,
                    functions: Value | str | None = None, expires: int | None = None,
                    grammar: str | None = None, rules: dict[str, str] | None = None,
                    constraints: Value | str | None = None, comment: str | None = None,
                    grammar_limits: GrammarLimits | None = None) -> bytes:
    """The bytes of the descriptor the record classes declare: their declaration
    (:func:`declaration_of`) built as :func:`cbcl.descriptor_from_declaration` builds one
    (the grammar derived, or ``grammar`` checked against the records).

    Raises as :func:`declaration_of`, and as :func:`cbcl.descriptor_from_declaration`
    (:class:`DescriptorError` for a declaration it refuses, :class:`GrammarError` …)."""
    declared = declaration_of(*classes, id=id, version=version, conversation=conversation,
                              functions=functions, expires=expires, grammar=grammar,
                              rules=rules, constraints=constraints)
    try:
        return read_declaration(declared, grammar_limits=grammar_limits).build(
            comment=comment, grammar_limits=grammar_limits)
    except DescriptorError:
        raise
