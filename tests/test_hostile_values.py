"""Values are data, never code (spec §1.2, "Values from a program are data, never code";
§7; binary.md §7): every writer - canonical text (C and Python), binary frame (C and
Python), JSON mapping -, ``cbcl.as_value``/``cbcl.body``, ``Message`` construction and the
``Symbol``/``Keyword``/``URI`` constructors take a subclass of a value type as the value its
base type stores, an enum member as its value, and refuse lists too deep or that contain
themselves with a ``LimitError``; whatever the value's methods do (:mod:`hostile`: they lie
or raise), the output is the output of the plain-typed value, or a typed refusal, never
injected syntax, never the hostile code's exception.

Tests internals too: the Python twins (``canonical_value_python``, ``Encoder(pure_python=
True)``), ``Message._trusted`` (a message whose body the encoders see raw) and
``cbcl._native`` (whether the C twins decline what is not of an exact type)."""

from __future__ import annotations

import enum
import os
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from hostile import (
    BASES,
    INJECTION,
    METHODS,
    MODES,
    Boom,
    hostile_class,
    hostile_enum_member,
    make,
    valid_atom,
)
from hypothesis import given, settings, strategies as st
from strategies import ids, names as name_texts, uris
from test_protocol import DESCRIPTORS, SHIPPED

import cbcl
from cbcl import URI, Encoder, Intent, Keyword, LimitError, Message, Registry, Symbol
from cbcl.core._canonical import canonical_value, canonical_value_python
from cbcl.core._values import MAX_VALUE_DEPTH
from cbcl.json_mapping import from_json, message_to_json, to_json
from cbcl.trust import Signature

REFUSED = object()  # (in a plain value: an atom a writer must refuse)


def outcome(fn: Callable[..., Any], *args: Any) -> Any:
    """A call's result, or the type and text of the exception it raised."""
    try:
        return fn(*args)
    except Exception as exc:
        return (type(exc), str(exc))


def refusal(result: Any) -> bool:
    """Whether ``result`` is a typed refusal: a ``TypeError`` or a ``ValueError`` (every
    CBCLError a writer raises is one), never the hostile code's own exception."""
    return type(result) is tuple and len(result) == 2 and isinstance(result[0], type) and \
        issubclass(result[0], (TypeError, ValueError)) and not issubclass(result[0], Boom)


def same(a: Any, b: Any) -> bool:
    """Equal, and of exactly the same types all the way down."""
    if type(a) is not type(b):
        return False
    if type(a) in (tuple, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def holds(value: Any, marker: object) -> bool:
    if value is marker:
        return True
    return type(value) is tuple and any(holds(item, marker) for item in value)


def _native_or_none() -> Any:
    try:
        import cbcl._native as module
    except ImportError:
        if os.environ.get("CBCL_REQUIRE_SPEEDUPS"):
            raise
        return None
    return module


NATIVE = _native_or_none()
REGISTRY = Registry(disk_cache=False, isolate=False)
for _name in SHIPPED:
    REGISTRY.load((DESCRIPTORS / f"{_name}.cbcl").read_bytes(), allow_unsigned=True)
C_ENCODER = Encoder(REGISTRY, validate=False)
PYTHON_ENCODER = Encoder(REGISTRY, validate=False, pure_python=True)


def trusted(body: Any) -> Message:
    """A request/v1 message holding ``body`` as it is (the encoders see it raw)."""
    return Message._trusted("m-1", URI("agent://a"), URI("agent://b"), Intent.REQUEST,
                            Symbol("request/v1"), None, None, None, None, body, None)


def built(body: Any) -> Message:
    return Message(message_id="m-1", sender="agent://a", receiver="agent://b",
                   intent="REQUEST", protocol="request/v1", body=body)


#: Every way a value from a program is written or taken, each a function of the value.
WRITERS: dict[str, Callable[[Any], Any]] = {
    "canonical_value": canonical_value,
    "canonical_value_python": canonical_value_python,
    "cbcl.canonical": cbcl.canonical,
    "to_json": to_json,
    "as_value": cbcl.as_value,
    "body": lambda value: cbcl.body("x", v=value),
    "keys": lambda value: cbcl.keys({"v": value}),
    "frame (C)": lambda value: C_ENCODER.encode(trusted(value)),
    "frame (Python)": lambda value: PYTHON_ENCODER.encode(trusted(value)),
    "message text (raw body)": lambda value: trusted(value).canonical(),
    "Message": lambda value: built(value).canonical(),
    "message_to_json": lambda value: message_to_json(built(value)),
    "Message frame": lambda value: C_ENCODER.encode(built(value)),
}


def assert_writes_the_plain_value(hostile_value: Any, plain: Any) -> None:
    """Every writer gives for ``hostile_value`` what it gives for ``plain`` (or, where
    ``plain`` holds :data:`REFUSED`, a typed refusal); the C twins agree with the Python
    ones; the text reads back as the one plain value."""
    refused = holds(plain, REFUSED)
    results = {}
    for name, write in WRITERS.items():
        got = outcome(write, hostile_value)
        results[name] = got
        if refused:
            assert refusal(got), (name, got)
            continue
        expected = outcome(write, plain)
        assert same(got, expected) or got == expected, (name, got, expected)
        if not refusal(expected):
            assert not refusal(got), (name, got)
    assert results["canonical_value"] == results["canonical_value_python"]
    assert results["frame (C)"] == results["frame (Python)"]
    text = results["canonical_value"]
    if type(text) is str:  # no syntax added: it reads back as the one value it was
        again = cbcl.read(text)
        assert same(again, plain)
        assert cbcl.canonical(again) == text
        assert same(from_json(to_json(hostile_value)), again)
    if NATIVE is not None:
        c_text = NATIVE.canonical(hostile_value)
        assert c_text is None or c_text == text


# --------------------------------------------------------------------------- strategies

def _how(base: type) -> st.SearchStrategy[tuple[str, frozenset[str]]]:
    """A mode and the methods a hostile subclass of ``base`` overrides (some, or all)."""
    return st.tuples(st.sampled_from(MODES),
                     st.sets(st.sampled_from(METHODS[base]), min_size=1, max_size=8)
                     .map(frozenset) | st.just(frozenset(METHODS[base])))


texts = st.text(max_size=12) | st.sampled_from([INJECTION, "", '"', "\\", "é\u202e",
                                                "\ud800", "PROPOSE"])
DATA: dict[type, st.SearchStrategy[Any]] = {
    str: texts,
    int: st.integers(-(2**63), 2**63 - 1) | st.sampled_from([2**63, -(2**63) - 1, 2**70]),
    Decimal: st.decimals(allow_nan=False, allow_infinity=False, places=3) |
    st.sampled_from([Decimal("NaN"), Decimal("1E+50"), Decimal("-0.00")]),
    Symbol: name_texts | st.sampled_from([INJECTION, "1x", "a b"]),
    Keyword: name_texts | name_texts.map(lambda n: ":" + n) | st.just(INJECTION),
    URI: uris.map(str.__str__) | st.sampled_from([INJECTION, "agent://a b"]),
}


def _plain_atom(base: type, data: Any) -> Any:
    if base in (Symbol, Keyword, URI):
        return base(data) if valid_atom(base, data) else REFUSED
    return data


@st.composite
def atom_specs(draw: st.DrawFn) -> tuple[Any, ...]:
    base = draw(st.sampled_from([str, int, Decimal, Symbol, Keyword, URI]))
    data = draw(DATA[base])
    how = draw(st.none() | _how(base))
    as_enum = how is not None and draw(st.booleans())
    return ("atom", base, data, how, as_enum)


def list_specs(children: st.SearchStrategy[Any]) -> st.SearchStrategy[tuple[Any, ...]]:
    return st.tuples(st.just("list"), st.sampled_from([tuple, list]),
                     st.lists(children, max_size=4), st.none() | _how(tuple),
                     st.booleans())


specs = st.recursive(atom_specs(), list_specs, max_leaves=10)


def build(spec: tuple[Any, ...]) -> tuple[Any, Any]:
    """The hostile value a spec describes, and the plain value it stands for."""
    if spec[0] == "atom":
        _, base, data, how, as_enum = spec
        plain = _plain_atom(base, data)
        if how is None:  # an exact value (an atom's text that is not one: a string)
            exact = data if plain is REFUSED else plain
            return exact, exact
        if as_enum:
            member = hostile_enum_member(base, data, *how)
            if member is not None:
                return member, plain
        return make(base, data, *how), plain
    _, kind, children, how, as_enum = spec
    pairs = [build(child) for child in children]
    items = [hostile_value for hostile_value, _ in pairs]
    plain = tuple(p for _, p in pairs)
    if how is None:
        return kind(items), plain
    base = tuple if kind is tuple else list
    if as_enum:
        member = hostile_enum_member(base, items, *how)
        if member is not None:
            return member, plain
    return make(base, items, *how), plain


# --------------------------------------------------------------------------- properties


@settings(max_examples=300, deadline=None)
@given(spec=specs)
def test_every_writer_writes_the_value_a_hostile_one_stands_for(spec: tuple[Any, ...]) -> None:
    hostile_value, plain = build(spec)
    assert_writes_the_plain_value(hostile_value, plain)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("base", BASES)
def test_every_method_of_every_value_type_overridden(base: type, mode: str) -> None:
    # each base with all its methods overridden at once, alone, in a list, as an enum
    # member, and a list of it: the plain value's output
    everything = frozenset(METHODS[base])
    data: Any = {str: "ok", int: 7, Decimal: Decimal("1.50"), Symbol: "ok", Keyword: "ok",
                 URI: "agent://ok", tuple: ["ok", 7], list: ["ok", 7]}[base]
    plain = tuple(data) if base in (tuple, list) else _plain_atom(base, data)
    value = make(base, data, mode, everything)
    assert_writes_the_plain_value(value, plain)
    assert_writes_the_plain_value((Symbol("a"), value, [value]), (Symbol("a"), plain, (plain,)))
    member = hostile_enum_member(base, data, mode, everything)
    assert member is not None
    assert_writes_the_plain_value(member, plain)
    assert_writes_the_plain_value([member, (member,)], (plain, (plain,)))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("base", [Symbol, Keyword, URI])
def test_a_subclassed_atom_whose_text_is_not_one_is_refused(base: type, mode: str) -> None:
    for data in (INJECTION, "", ":x" if base is Keyword else "1x", "é"):
        value = make(base, data, mode, frozenset(METHODS[base]))
        assert_writes_the_plain_value(value, REFUSED)
        if data != ":x":  # (the constructor takes text, where a keyword's colon may lead)
            with pytest.raises(ValueError):
                base(value)


@settings(max_examples=200, deadline=None)
@given(base=st.sampled_from([str, Symbol, Keyword, URI]), data=st.data())
def test_the_constructors_read_a_str_subclass_as_its_text(base: type,
                                                          data: st.DataObject) -> None:
    text = data.draw(DATA[base] | DATA[str])
    how = data.draw(_how(str))
    for kind in (Symbol, Keyword, URI):
        got = outcome(kind, make(base, text, *how))
        expected = outcome(kind, text)  # (the constructor of the text itself)
        assert same(got, expected) or got == expected, (kind, got, expected)
        assert type(got) is kind or refusal(got)


# --------------------------------------------------------------------------- the envelope


def _hostile_text(draw: Callable[..., Any], text: Any, base: type = str) -> Any:
    how = draw(st.none() | _how(base))
    if how is None:
        return text
    if draw(st.booleans()):
        member = hostile_enum_member(base, text, *how)
        if member is not None:
            return member
    return make(base, text, *how)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_message_fields_are_read_as_data(data: st.DataObject) -> None:
    draw = data.draw
    plain: dict[str, Any] = {
        "message_id": draw(ids), "sender": draw(uris), "receiver": draw(uris),
        "intent": draw(st.sampled_from([i.value for i in Intent])),
        "protocol": draw(st.sampled_from(["request/v1", "contract-net/v1"])),
        "conversation_id": draw(st.none() | ids), "in_reply_to": draw(st.none() | ids),
        "reply_by": draw(st.none() | st.integers(-(2**63), 2**63 - 1)),
        "timestamp": draw(st.none() | st.integers(0, 2**63 - 1))}
    given_fields = dict(plain)
    body_spec = draw(st.none() | specs)
    if body_spec is not None:
        given_fields["body"], plain["body"] = build(body_spec)
        if holds(plain["body"], REFUSED) or refusal(outcome(cbcl.as_value, plain["body"])):
            return  # (a body no writer takes: test_every_writer_… covers it)
    for name in ("message_id", "conversation_id", "in_reply_to"):
        if plain[name] is not None:
            given_fields[name] = _hostile_text(draw, plain[name])
    for name in ("sender", "receiver"):
        given_fields[name] = _hostile_text(draw, plain[name],
                                           draw(st.sampled_from([str, URI])))
    given_fields["intent"] = _hostile_text(draw, plain["intent"])
    given_fields["protocol"] = _hostile_text(draw, plain["protocol"],
                                             draw(st.sampled_from([str, Symbol])))
    for name in ("reply_by", "timestamp"):
        if plain[name] is not None:
            given_fields[name] = _hostile_text(draw, plain[name], int)
    if draw(st.booleans()):
        key_id, value = draw(ids), draw(ids)
        plain["signature"] = Signature(key_id, value)
        given_fields["signature"] = Signature(_hostile_text(draw, key_id),
                                              _hostile_text(draw, value))
    expected = Message(**plain)
    message = Message(**given_fields)
    for field in ("message_id", "sender", "receiver", "intent", "protocol",
                  "conversation_id", "in_reply_to", "reply_by", "timestamp"):
        assert same(getattr(message, field), getattr(expected, field)), field
    assert message.intent is expected.intent
    if expected.signature is not None:
        assert message.signature is not None
        assert same(message.signature.key_id, expected.signature.key_id)
        assert same(message.signature.value, expected.signature.value)
    assert message == expected
    text = message.canonical()
    assert text == expected.canonical() == canonical_value_python(expected.to_value())
    assert cbcl.parse(text.encode(), envelope_only=True) == expected
    assert message_to_json(message) == message_to_json(expected)
    assert outcome(C_ENCODER.encode, message) == outcome(PYTHON_ENCODER.encode, expected)


@pytest.mark.parametrize("mode", MODES)
def test_a_hostile_field_of_the_wrong_kind_is_refused(mode: str) -> None:
    fields: dict[str, Any] = {"message_id": "m", "sender": "agent://a",
                              "receiver": "agent://b", "intent": "INFORM",
                              "protocol": "request/v1"}
    wrong: dict[str, Any] = {
        "message_id": make(int, 5, mode, frozenset(METHODS[int])),
        "sender": make(str, INJECTION, mode, frozenset(METHODS[str])),
        "intent": make(str, "NOPE", mode, frozenset(METHODS[str])),
        "protocol": make(Symbol, INJECTION, mode, frozenset(METHODS[Symbol])),
        "reply_by": make(str, "5", mode, frozenset(METHODS[str])),
        "timestamp": make(int, 2**64, mode, frozenset(METHODS[int])),
        "conversation_id": make(str, "", mode, frozenset(METHODS[str])),
    }
    for name, value in wrong.items():
        assert refusal(outcome(lambda n=name, v=value: Message(**{**fields, n: v}))), name
    signed = Signature(make(str, "k", mode, frozenset(METHODS[str])), 5)  # type: ignore[arg-type]
    assert refusal(outcome(lambda: Message(**fields, signature=signed)))


# --------------------------------------------------------------------------- enums


class Cur(str, enum.Enum):  # noqa: UP042  (the mixin of issue 29's example)
    EUR = "EUR"


class Colour(enum.Enum):  # (a plain enum: no value type mixed in)
    RED = "red"


class Coded(str, enum.Enum):  # noqa: UP042  (a member whose str data is not its value)
    EUR = ("EUR", "Euro")

    def __new__(cls, code: str, label: str) -> Coded:
        member = str.__new__(cls, label)
        member._value_ = code
        return member


class Nested(str, enum.Enum):  # noqa: UP042  (a member whose value is a member)
    A = "a"

    def __new__(cls, text: str) -> Nested:
        member = str.__new__(cls, text)
        member._value_ = Cur.EUR
        return member


def test_a_str_enum_member_is_its_value_in_every_writer() -> None:
    # the break of issue 29: canonical wrote "Cur.EUR" (its __format__), cbcl.body "EUR"
    assert_writes_the_plain_value(Cur.EUR, "EUR")
    assert cbcl.canonical((Symbol("pay"), Keyword("currency"), Cur.EUR)) == \
        '(pay :currency "EUR")'
    assert cbcl.body("pay", currency=Cur.EUR) == (Symbol("pay"), Keyword("currency"), "EUR")
    assert_writes_the_plain_value(Intent.PROPOSE, "PROPOSE")
    # a member stands for its value, not for the str data it may store besides
    assert str.__str__(Coded.EUR) == "Euro"
    assert_writes_the_plain_value(Coded.EUR, "EUR")


def test_a_member_of_a_plain_enum_or_of_an_enum_of_members_is_refused() -> None:
    for value, error in ((Colour.RED, TypeError), (Nested.A, ValueError)):
        for name, write in WRITERS.items():
            got = outcome(write, value)
            assert refusal(got) and issubclass(got[0], error), (name, got)
            assert refusal(outcome(write, (Symbol("a"), value))), name
    with pytest.raises(TypeError, match=r"use its \.value or \.name"):
        cbcl.canonical(Colour.RED)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- depth


def _chain(depth: int, mode: str | None, kind: type = tuple) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = kind([value]) if mode is None else make(kind, [value], mode,
                                                        frozenset(METHODS[kind]))
    return value


DEPTH_WRITERS = [name for name in WRITERS if name not in ("body", "keys")]


@pytest.mark.slow
@pytest.mark.parametrize("mode", [None, *MODES])
def test_values_as_deep_as_the_limit_are_written_and_deeper_are_refused(
        mode: str | None) -> None:
    deepest = _chain(MAX_VALUE_DEPTH, mode)
    text = canonical_value(deepest)
    assert text == "(" * MAX_VALUE_DEPTH + '"x"' + ")" * MAX_VALUE_DEPTH
    assert outcome(canonical_value_python, deepest) == text
    for name in DEPTH_WRITERS:
        assert not refusal(outcome(WRITERS[name], deepest)), name
    too_deep = make(tuple, [deepest], mode, frozenset(METHODS[tuple])) if mode else (deepest,)
    for name in DEPTH_WRITERS:
        got = outcome(WRITERS[name], too_deep)
        assert refusal(got) and got[0] is LimitError, (name, got)
        assert "10000 deep" in got[1]


@pytest.mark.skipif(NATIVE is None, reason="cbcl._native is not built here")
def test_the_c_and_python_writers_agree_at_the_depth_limit() -> None:
    # a body MAX_VALUE_DEPTH deep: the C twins write it, as the Python ones do (a message's
    # text: the body inside the envelope's two lists); one deeper: they decline, and the
    # Python twins refuse it
    for depth in (MAX_VALUE_DEPTH, MAX_VALUE_DEPTH + 1):
        message = trusted(_chain(depth, None))
        python_text = outcome(canonical_value_python, message.to_value(), 2)
        c_text = NATIVE.canonical_message(message)
        python_frame = outcome(PYTHON_ENCODER.encode, message)
        C_ENCODER._table(message)  # (the protocol's table cached, as encode_message reads it)
        c_frame = NATIVE.encode_message(message, REGISTRY, C_ENCODER._tables)
        if depth == MAX_VALUE_DEPTH:
            assert c_text == python_text == message.canonical()
            assert c_frame == python_frame == C_ENCODER.encode(message)
        else:
            assert c_text is None and c_frame is None
            assert python_text[0] is python_frame[0] is LimitError
            assert outcome(message.canonical)[0] is LimitError


@pytest.mark.slow
@pytest.mark.parametrize("mode", [None, *MODES])
def test_a_list_that_contains_itself_is_refused_by_every_writer(mode: str | None) -> None:
    loop: list[Any] = [Symbol("a")] if mode is None else make(
        list, [Symbol("a")], mode, frozenset(METHODS[list]))
    list.append(loop, loop)
    for name, write in WRITERS.items():
        got = outcome(write, loop)  # never RecursionError, MemoryError or a hang
        assert refusal(got) and got[0] is LimitError, (name, got)
        with pytest.raises(LimitError) as refused:
            write(loop)
        assert isinstance(refused.value, cbcl.CBCLError)
        assert (refused.value.limit, refused.value.maximum) == ("max_depth", MAX_VALUE_DEPTH)
    if NATIVE is not None:
        assert NATIVE.canonical(loop) is None  # (declined at its stack bound)


# --------------------------------------------------------------------------- the C twins


@pytest.mark.skipif(NATIVE is None, reason="cbcl._native is not built here")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("base", BASES)
def test_the_c_twins_decline_what_is_not_of_an_exact_type(base: type, mode: str) -> None:
    # the C writers read exact types only and leave the rest to the Python twins (which
    # read it as data): no change is needed in cbcl/_native_src for this rule
    data: Any = {str: "ok", int: 7, Decimal: Decimal("1.5"), Symbol: "ok", Keyword: "ok",
                 URI: "a://b", tuple: ["ok"], list: ["ok"]}[base]
    value = make(base, data, mode, frozenset(METHODS[base]))
    member = hostile_enum_member(base, data, mode, frozenset(METHODS[base]))
    _, header, prepared = C_ENCODER._table(trusted(None))
    tokens = [1, 32, "m-1", URI("agent://a"), URI("agent://b")]
    for odd in (value, member, (value,), [Symbol("a"), [member]]):
        assert NATIVE.canonical(odd) is None
        assert NATIVE.canonical_message(trusted(odd)) is None
        assert NATIVE.pack_frame(header, tokens, odd, prepared) is None
        assert NATIVE.pack_message(header, trusted(odd), prepared) is None
        assert NATIVE.encode_message(trusted(odd), REGISTRY, C_ENCODER._tables) is None


def test_a_hostile_class_cannot_pass_for_another_type() -> None:
    # __class__ says Symbol, the type is a str subclass: a STRING, not a symbol
    liar = make(str, "abc", "lie", frozenset({"__class__"}))
    assert isinstance(liar, Symbol)
    assert cbcl.canonical(liar) == '"abc"'
    assert cbcl.as_value(liar) == "abc" and type(cbcl.as_value(liar)) is str
    cls = hostile_class(int, "lie", frozenset({"__class__"}))
    assert isinstance(int.__new__(cls, 1), bool)
    assert cbcl.canonical(int.__new__(cls, 1)) == "1"


@pytest.mark.parametrize("mode", MODES)
def test_the_base_type_reads_are_the_ones_a_subclass_cannot_forge(mode: str) -> None:
    # why spec §1.2 names these reads: each is looked up on the base type and returns the
    # stored data as an object of the exact type, whatever the subclass defines; the
    # ordinary spellings call the subclass's methods (they lie, or raise Boom)
    text = make(str, "ok", mode, frozenset(METHODS[str]))
    number = make(int, 7, mode, frozenset(METHODS[int]))
    decimal = make(Decimal, Decimal("1.50"), mode, frozenset(METHODS[Decimal]))
    items = make(tuple, ["a", 1], mode, frozenset(METHODS[tuple]))
    listed = make(list, ["a", 1], mode, frozenset(METHODS[list]))
    reads: list[tuple[Any, Any]] = [
        (str.__str__(text), "ok"), (int.__index__(number), 7),
        (Decimal(decimal), Decimal("1.50")), (list(tuple.__iter__(items)), ["a", 1]),
        (list(list.__iter__(listed)), ["a", 1])]
    for got, expected in reads:
        assert same(got, expected)
    assert str(Decimal(decimal)) == "1.50"
    # the ordinary spellings do not give the data: a lie, or the subclass's exception
    ordinary = [outcome(lambda: str(text)), outcome(lambda: format(text, "")),
                outcome(lambda: int(number)), outcome(lambda: str(decimal)),
                outcome(lambda: tuple(items)), outcome(lambda: len(items)),
                outcome(lambda: list(listed))]
    data = ["ok", "ok", 7, "1.50", ("a", 1), 2, ["a", 1]]
    for got, stored in zip(ordinary, data, strict=True):
        if mode == "raise":
            assert type(got) is tuple and got[0] is Boom
        else:
            assert not same(got, stored)
