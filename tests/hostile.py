"""Hostile values: subclasses of every CBCL value type whose methods lie or raise, and the
plain-typed value each stands for (spec §1.2, "Values from a program are data, never
code"). Shared by ``test_hostile_values.py``, ``test_fuzz.py`` and the atheris harness
``fuzz/fuzz_encoders.py``.

A hostile class is made by :func:`hostile_class` from a base type, a *mode* and the names
of the methods it overrides: in ``"lie"`` mode each returns something plausible and wrong
(``__format__`` and ``__str__`` the text :data:`INJECTION`, ``__iter__`` other items,
``__eq__`` ``True``, ``__hash__`` the hash of ``"PROPOSE"``, ``__index__`` 666,
``as_tuple`` other digits, ``__class__`` another CBCL type …), in ``"raise"`` mode each
raises :class:`Boom`, which is neither a ``TypeError``, a ``ValueError`` nor a
``CBCLError``: a writer that lets one through calls code it must not. An instance is made
through the base type (``str.__new__``, ``tuple.__new__`` …), so it stores exactly the
data it is given, which is what a writer must write.
"""

from __future__ import annotations

import enum
from decimal import Decimal, DecimalTuple
from typing import Any

from cbcl import URI, Keyword, Symbol
from cbcl.core._values import is_name
from cbcl.core._vocabulary import NAME_RE, URI_RE

#: What a lying method gives for text: a quote, a list end and an intent, as a hostile
#: program would slip them into a message.
INJECTION = 'x") (intent CANCEL'

MODES = ("lie", "raise")


class Boom(Exception):
    """What a hostile method raises."""


_COMMON = (
    "__str__", "__repr__", "__format__", "__eq__", "__ne__", "__hash__", "__lt__", "__le__",
    "__gt__", "__ge__", "__bool__", "__len__", "__iter__", "__getitem__", "__contains__",
    "__add__", "__radd__", "__mul__", "__rmul__", "__mod__", "__rmod__", "__reduce__",
    "__reduce_ex__", "__copy__", "__deepcopy__", "__sizeof__", "__index__", "__int__",
    "__float__", "__neg__", "__pos__", "__abs__", "__trunc__", "__round__", "__class__",
    "__getattribute__", "__getattr__", "__dir__", "__getnewargs__")
_STR = ("encode", "replace", "startswith", "endswith", "isascii", "join", "translate",
        "format", "upper", "lower", "strip", "split", "find", "index", "count", "casefold",
        "isidentifier", "removeprefix", "partition", "__getnewargs__")
_INT = ("bit_length", "to_bytes", "__and__", "__or__", "__xor__", "__lshift__", "__rshift__",
        "__floordiv__", "__sub__", "__rsub__", "conjugate", "as_integer_ratio", "numerator")
_DECIMAL = ("as_tuple", "is_finite", "is_nan", "is_infinite", "is_zero", "is_signed",
            "to_eng_string", "normalize", "quantize", "adjusted", "as_integer_ratio",
            "compare", "__sub__", "__truediv__", "copy_abs", "scaleb")
_SEQUENCE = ("__reversed__", "index", "count", "copy", "append", "extend", "__iadd__",
             "__imul__", "sort", "pop", "insert", "clear")

#: The methods a writer might call on an instance of each base type.
METHODS: dict[type, tuple[str, ...]] = {
    str: _COMMON + _STR, Symbol: _COMMON + _STR + ("text", "scheme"),
    Keyword: _COMMON + _STR + ("text",), URI: _COMMON + _STR + ("scheme",),
    int: _COMMON + _INT, Decimal: _COMMON + _DECIMAL, tuple: _COMMON + _SEQUENCE,
    list: _COMMON + _SEQUENCE,
}
BASES = tuple(METHODS)

_TRUE = {"__eq__", "__contains__", "__lt__", "__le__", "__gt__", "__ge__", "startswith",
         "endswith", "isascii", "is_finite", "isidentifier", "__instancecheck__"}
_FALSE = {"__ne__", "__bool__", "is_nan", "is_infinite", "is_zero", "is_signed"}
_INTS = {"__index__", "__int__", "bit_length", "adjusted", "__sizeof__", "__len__",
         "__trunc__", "__round__", "numerator", "count", "find", "index"}


def _lying(name: str, base: type) -> Any:
    """A method (or property) ``name`` that gives something plausible and wrong."""
    if name == "__class__":
        fake = str if issubclass(base, (Symbol, Keyword, URI)) else \
            Symbol if issubclass(base, str) else bool if base is int else str
        return property(lambda self: fake)
    if name in ("text", "scheme", "numerator"):
        return property(lambda self: INJECTION if name != "numerator" else 666)
    if name == "__getattribute__":
        return lambda self, attribute: INJECTION
    if name == "__getattr__":
        return lambda self, attribute: INJECTION
    if name in _TRUE:
        return lambda self, *args, **kwargs: True
    if name in _FALSE:
        return lambda self, *args, **kwargs: False
    if name == "__hash__":
        return lambda self: hash("PROPOSE")
    if name in _INTS:
        return lambda self, *args, **kwargs: 666
    if name in ("__iter__", "__reversed__"):
        return lambda self: iter((INJECTION, Symbol("injected")))
    if name == "__float__":
        return lambda self: 6.66
    if name == "encode":
        return lambda self, *args, **kwargs: INJECTION.encode()
    if name == "to_bytes":
        return lambda self, *args, **kwargs: b"\x02\x9a"
    if name == "as_tuple":
        return lambda self: DecimalTuple(0, (6, 6, 6), -1)
    if name in ("__reduce__", "__reduce_ex__"):
        return lambda self, *args: (str, (INJECTION,))
    if name == "__dir__":
        return lambda self: ["injected"]
    if name == "__getnewargs__":
        return lambda self: (INJECTION,)
    if name in ("split", "partition"):
        return lambda self, *args, **kwargs: [INJECTION]
    return lambda self, *args, **kwargs: INJECTION


def _raising(name: str) -> Any:
    def method(self: object, *args: object, **kwargs: object) -> Any:
        raise Boom(name)

    if name in ("__class__", "text", "scheme", "numerator"):
        return property(method)
    return method


_CLASSES: dict[tuple[type, str, frozenset[str]], type] = {}


def hostile_class(base: type, mode: str, names: frozenset[str]) -> type:
    """The subclass of ``base`` whose methods ``names`` lie or raise (``mode``); one per
    combination."""
    key = (base, mode, names)
    made: type | None = _CLASSES.get(key)
    if made is None:
        namespace: dict[str, Any] = {
            name: _lying(name, base) if mode == "lie" else _raising(name) for name in names}
        if "__eq__" in names and "__hash__" not in names:
            namespace["__hash__"] = base.__hash__  # (defining __eq__ alone unsets it)
        made = _CLASSES[key] = type(f"Hostile{base.__name__}", (base,), namespace)
    return made


def make(base: type, data: Any, mode: str, names: frozenset[str]) -> Any:
    """An instance of ``hostile_class(base, mode, names)`` storing ``data`` (an exact
    value of the base's kind: text for the strs, an int, a Decimal, a list of items),
    made through the base type so that no override runs."""
    cls = hostile_class(base, mode, names)
    if issubclass(base, str):
        return str.__new__(cls, data)
    if base is int:
        return int.__new__(cls, data)
    if base is Decimal:
        return Decimal.__new__(cls, data)
    if base is tuple:
        return tuple.__new__(cls, data)
    made: list[Any] = list.__new__(cls)
    list.__init__(made, data)
    return made


# --------------------------------------------------------------------------- enums

#: The methods that break the making of an enum whose members mix them in (Enum's own
#: machinery reads and sets members' attributes), found when this module is imported.
ENUM_BREAKERS: dict[tuple[type, str], frozenset[str]] = {}


def base_data(base: type, value: Any) -> Any:
    """The data an instance of (a subclass of) ``base`` stores, read through the base type
    (as a test reads it: the reads spec §1.2 names), or ``None`` if it is not one."""
    if not issubclass(type(value), base):
        return None
    if issubclass(base, str):
        return str.__str__(value)
    if base is int:
        return int.__index__(value)
    if base is Decimal:
        return Decimal(value)
    return list(tuple.__iter__(value) if base is tuple else list.__iter__(value))


def hostile_enum_member(base: type, data: Any, mode: str, names: frozenset[str]) -> Any:
    """A member of an enum that mixes in the hostile subclass of ``base`` (without the
    methods that keep enum from making one), whose value stores ``data`` (an exact value of
    the base's kind; a list for a list base); ``None`` if enum cannot make one.

    (Enum makes each member's value by calling the mixin type, so the value is itself an
    instance of the hostile subclass: a writer reads it by the same rule.)"""
    usable = names - ENUM_BREAKERS.get((base, mode), frozenset())
    mixin = hostile_class(base, mode, usable)
    given = (data,) if base in (tuple, list) else data  # (enum passes a tuple as arguments)
    try:
        make_enum: Any = enum.Enum
        members = make_enum("HostileEnum", [("A", given)], type=mixin)
        member = type.__getattribute__(members, "_member_map_")["A"]
        value = object.__getattribute__(member, "_value_")
        stored = base_data(base, value)
        if stored is None or (list(data) if base in (tuple, list) else data) != stored or \
                base_data(base, member) != stored:
            return None
    except Exception:
        return None
    return member


def _find_enum_breakers() -> None:
    samples: dict[type, Any] = {str: "EUR", int: 3, Decimal: Decimal("1.5"), tuple: (1, 2),
                                Symbol: "EUR", Keyword: "EUR", URI: "a://b", list: (1,)}
    for base in BASES:
        for mode in MODES:
            broken = set()
            for name in METHODS[base]:
                ENUM_BREAKERS[(base, mode)] = frozenset()
                if hostile_enum_member(base, samples[base], mode, frozenset({name})) is None:
                    broken.add(name)
            ENUM_BREAKERS[(base, mode)] = frozenset(broken)


_find_enum_breakers()


# --------------------------------------------------------------------------- twins

def valid_atom(kind: type, text: str) -> bool:
    """Whether a subclass of atom type ``kind`` storing ``text`` stands for an atom (its
    text is one of its kind: a keyword's without a colon)."""
    if kind is Symbol:
        return is_name(text)
    if kind is Keyword:
        return NAME_RE.match(text) is not None
    return URI_RE.match(text) is not None


def hostile_twin(value: Any, seed: bytes, enums: int = 4) -> Any:
    """``value`` with its atoms and lists replaced, as the bytes of ``seed`` pick (in
    turn, over and over), by instances of hostile subclasses (or, up to ``enums`` times,
    members of hostile enums) storing the same data; a writer must give the twin exactly
    what it gives ``value``. What is not of an exact type, and a symbol, keyword or URI of
    an exact type whose text is not one of its kind (made by ``str.__new__``: a writer
    writes such a forgery as it is, a subclass of it is refused), is kept. Iterative: any
    depth."""
    if not seed:
        return value
    at = 0
    made_enums = 0

    def pick(kind: type, data: Any) -> Any:
        nonlocal at, made_enums
        choice, bits = seed[at % len(seed)], seed[(at + 1) % len(seed)]
        at += 2
        if choice % 4 == 0:
            return None  # kept as it is
        methods = METHODS[kind]
        names = frozenset(methods) if choice % 8 == 1 else frozenset(
            name for index, name in enumerate(methods) if bits >> (index % 8) & 1) or \
            frozenset(methods[:1])
        mode = MODES[choice >> 7]
        if choice % 8 == 7 and made_enums < enums:
            made_enums += 1
            member = hostile_enum_member(kind, data, mode, names)
            if member is not None:
                return member
        return make(kind, data, mode, names)

    def atom(item: Any) -> Any:
        kind = type(item)
        if kind in (str, int, Decimal) or (kind in (Symbol, Keyword, URI) and
                                           valid_atom(kind, str.__str__(item))):
            data = str.__str__(item) if kind in (Symbol, Keyword, URI) else item
            twin = pick(kind, data)
            return item if twin is None else twin
        return item

    if type(value) not in (tuple, list):
        return atom(value)
    # post-order: each open list gathers its items' twins, then becomes its own twin
    stack: list[tuple[Any, Any, list[Any]]] = [(type(value), iter(value), [])]
    while True:
        kind, items, out = stack[-1]
        for item in items:
            if type(item) in (tuple, list):
                stack.append((type(item), iter(item), []))
                break
            out.append(atom(item))
        else:
            stack.pop()
            twin = pick(kind, out)
            done = (kind(out) if kind is tuple else out) if twin is None else twin
            if not stack:
                return done
            stack[-1][2].append(done)
