"""The C twins of the encoders (``cbcl._native``) against their Python twins, byte for
byte: the canonical text of any value (``canonical_value`` vs ``canonical_value_python``)
and binary frames (``Encoder`` vs ``Encoder(pure_python=True)``), errors included: a value
the C twin declines is written, or refused, by the Python twin, so both paths must give
the same text, the same frame or the same exception with the same message.

Tests internals: the twins (``cbcl.core._canonical``, ``cbcl._native``) are private."""

from __future__ import annotations

import decimal
import os
import sys
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st
from strategies import atoms, ids, traces, uris, values
from test_protocol import DESCRIPTORS, SHIPPED, generator

import cbcl
from cbcl import URI, Encoder, Intent, Keyword, Message, Registry, Symbol
from cbcl.binary._codec import INTENTS
from cbcl.core._canonical import canonical_value, canonical_value_python
from cbcl.core._values import MAX_VALUE_DEPTH
from cbcl.trust import Signature

_I64 = 2**63


def _native_or_skip() -> Any:
    """cbcl._native, or a skip where it is not built (CI requires it:
    CBCL_REQUIRE_SPEEDUPS)."""
    try:
        import cbcl._native as module
    except ImportError:
        if os.environ.get("CBCL_REQUIRE_SPEEDUPS"):
            raise
        pytest.skip("cbcl._native is not built here")
    return module


@pytest.fixture(scope="module")
def native() -> Any:
    return _native_or_skip()


@pytest.fixture(scope="module")
def registry() -> Registry:
    reg = Registry(disk_cache=False, isolate=False)
    for name in SHIPPED:
        reg.load((DESCRIPTORS / f"{name}.cbcl").read_bytes(), allow_unsigned=True)
    return reg


def outcome(fn: Any, *args: Any) -> Any:
    """A call's result, or the type and text of the exception it raised."""
    try:
        return fn(*args)
    except Exception as exc:
        return (type(exc), str(exc))


# --------------------------------------------------------------------------- wild values


class Text(str):
    """A str subclass: not a CBCL type, though canonical_value writes it as a string."""


class Name(Symbol):
    """A Symbol subclass (every writer writes it as the symbol its text is, checked again)."""


class Pair(tuple):  # type: ignore[type-arg]
    """A tuple subclass (canonical_value writes it as a list)."""


surrogates = st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
                     min_size=1, max_size=2)
any_text = st.text(max_size=40)  # lone surrogates, controls, bidi characters, astral
escapes = st.text(alphabet='"\\\n\r\t\x00\x1f\x7f\x80\x85\x9f\xa0\xff\u202a\u202e\u2066'
                  "\u2069\u0100\u2028\uffff\U0001f600aé", max_size=12)
big_ints = st.sampled_from([_I64 - 1, _I64, -_I64, -_I64 - 1, 2**64 - 1, 2**64, 10**30,
                            -(10**30), 0, -1, 127, 128, -32, -33, 255, 256, 65535, 65536,
                            2**32 - 1, 2**32, -128, -129, -32768, -32769, -(2**31),
                            -(2**31) - 1])
odd_decimals = st.sampled_from(
    ["1E+3", "-0", "0", "0E+3", "-0E+3", "0.00", "-0.00", "0E-7", "1.00E+3", "1.23E-7",
     "1E-38", "1E-39", "1E-40", "1E+36", "1E+37", "1E+38", "12345678901234567890123456789012345678",
     "123456789012345678901234567890123456789", "0.000000000000000000000000000000000001",
     "NaN", "-NaN", "sNaN", "Infinity", "-Infinity", "1E+999999999", "1E-999999999",
     "-1.5", "100", "5", "1E+1", "9.99999999999999999999999999999999999E+2"]).map(Decimal)
finite_decimals = st.decimals(allow_nan=False, allow_infinity=False, places=None)
odd_atoms = st.one_of(
    any_text, surrogates.map(lambda s: "a" + s + "b"), escapes, big_ints, odd_decimals,
    finite_decimals, st.sampled_from([True, False, None, 1.5, b"bytes", bytearray(b"x"),
                                      {"a": 1}, object, Intent.PROPOSE]),
    any_text.map(Text), st.just(Name("n")), st.just(Text("t")),
    surrogates.map(lambda s: str.__new__(Symbol, "s" + s)),
    surrogates.map(lambda s: str.__new__(URI, "u:" + s)),
    st.sampled_from([str.__new__(Symbol, "é"), str.__new__(Keyword, "ü"), URI("agent://a/é"),
                     Symbol("a"), Keyword("a"), URI("a://b")]))
wild_atoms = st.one_of(atoms, odd_atoms)
wild = st.recursive(
    wild_atoms,
    lambda children: st.one_of(st.lists(children, max_size=6).map(tuple),
                               st.lists(children, max_size=6),
                               st.lists(children, max_size=3).map(Pair)),
    max_leaves=40)


def _deep(depth: int, inner: Any = "x", kind: type = tuple) -> Any:
    value: Any = inner
    for _ in range(depth):
        value = kind((value,))
    return value


# --------------------------------------------------------------------------- canonical text


def _same_text(native: Any, value: Any) -> Any:
    expected = outcome(canonical_value_python, value)
    assert outcome(canonical_value, value) == expected
    text = native.canonical(value)
    if text is not None:  # what the C twin writes is the Python twin's text, kind and all
        assert text == expected and text.isascii() == expected.isascii()
        assert sys.getsizeof(text) == sys.getsizeof(expected)
    return expected


@settings(max_examples=300, deadline=None)
@given(value=values)
def test_canonical_text_of_any_value(native: Any, value: Any) -> None:
    text = native.canonical(value)
    assert text is not None and text == canonical_value_python(value)  # never declined


@settings(max_examples=400, deadline=None)
@given(value=wild)
def test_canonical_text_of_wild_values_and_their_errors(native: Any, value: Any) -> None:
    _same_text(native, value)


@pytest.mark.parametrize("value", [
    "", "plain", "é", "\x85", "\u202a", "a\x85é", "😀", "\x85😀", "\u202a\u0100", "\ud800",
    "a\udfff", "😀\ud800", '"\\\n\r\t', "\x00\x7f\x9f\xa0", Decimal("1E+3"), Decimal("-0"),
    Decimal("1E-40"), Decimal("NaN"), _I64, -_I64, _I64 - 1, -_I64 - 1, True, None, 1.5,
    b"x", Text("t"), Name("n"), Pair((1, 2)), [], (), [Symbol("a"), [Keyword("b")]],
    ("ascii", "é", "ĀĀ", "😀", str.__new__(Symbol, "é😀")), (Keyword("k"), "\x85", "\u2069"),
], ids=repr)
def test_canonical_text_edges(native: Any, value: Any) -> None:
    _same_text(native, value)


@pytest.mark.slow
@pytest.mark.parametrize("depth", [1, 100, 9_999, 10_000, 10_001, 30_000])
def test_canonical_text_of_deep_values(native: Any, depth: int) -> None:
    # The C twin is iterative up to its stack bound (10,000 = MAX_VALUE_DEPTH) and
    # declines deeper values, which the Python twin, iterative too, refuses: the same text
    # at every depth up to the bound, the same LimitError beyond.
    assert MAX_VALUE_DEPTH == 10_000
    for kind in (tuple, list):
        value = _deep(depth, "x", kind)
        assert (native.canonical(value) is None) == (depth > MAX_VALUE_DEPTH)
        if depth <= MAX_VALUE_DEPTH:
            assert canonical_value(value) == "(" * depth + '"x"' + ")" * depth
        else:
            refused = outcome(canonical_value, value)
            assert refused[0] is cbcl.LimitError and "10000 deep" in refused[1]
        assert outcome(canonical_value, value) == outcome(canonical_value_python, value)
    bad = _deep(depth, 2**64)
    assert outcome(canonical_value, bad) == outcome(canonical_value_python, bad)


def test_decimal_text_under_any_context(native: Any) -> None:
    # str(Decimal) follows the context's ``capitals``; the canonical text does not.
    values = [Decimal("1E+3"), Decimal("1.23E-7"), Decimal("0E-7"), Decimal("-1E+5")]
    expected = canonical_value_python(tuple(values))
    with decimal.localcontext() as context:
        context.capitals = 0
        context.prec = 3
        assert str(values[0]) == "1e+3"
        assert native.canonical(tuple(values)) == expected == canonical_value(tuple(values))


def test_a_list_that_contains_itself_is_left_to_the_python_twin(native: Any) -> None:
    loop: list[Any] = []
    loop.append(loop)
    assert native.canonical(loop) is None  # declined at the stack bound, not a crash
    # which refuses it at its depth limit, as it refuses a value too deep
    refused = outcome(canonical_value, loop)
    assert refused[0] is cbcl.LimitError and "contains itself" in refused[1]


# --------------------------------------------------------------------------- binary frames


def _message(body: Any, **fields: Any) -> Message:
    """A message of request/v1 with ``body`` as it is (no check: the encoders see it raw)."""
    base: dict[str, Any] = {
        "message_id": "m-1", "sender": URI("agent://a"), "receiver": URI("agent://b"),
        "intent": Intent.REQUEST, "protocol": Symbol("request/v1"), "conversation_id": None,
        "in_reply_to": None, "reply_by": None, "timestamp": None, "body": body,
        "signature": None}
    base.update(fields)
    return Message._trusted(**base)


def _same_frame(registry: Registry, message: Message) -> Any:
    c_twin = Encoder(registry, validate=False)
    python_twin = Encoder(registry, validate=False, pure_python=True)
    expected = outcome(python_twin.encode, message)
    assert outcome(c_twin.encode, message) == expected
    return expected


@settings(max_examples=300, deadline=None)
@given(body=values)
def test_frames_of_any_value(native: Any, registry: Registry, body: Any) -> None:
    frame = _same_frame(registry, _message(body))
    assert isinstance(frame, bytes)
    # and the C twin wrote it (it declines nothing a valid value holds)
    encoder = Encoder(registry, validate=False)
    _, header, prepared = encoder._table(_message(body))
    assert prepared is not None
    tokens = [INTENTS.index(Intent.REQUEST), 32, "m-1", URI("agent://a"), URI("agent://b")]
    assert native.pack_frame(header, tokens, body, prepared) == frame


@settings(max_examples=400, deadline=None)
@given(body=wild | st.none(), message_id=ids | surrogates | st.just(""),
       sender=uris | surrogates.map(lambda s: str.__new__(URI, "a:" + s)),
       conversation=st.none() | ids | surrogates,
       stamp=st.none() | big_ints | st.sampled_from([True, 1.5]),
       signed=st.booleans())
def test_frames_of_wild_messages_and_their_errors(registry: Registry, body: Any,
                                                   message_id: str, sender: URI,
                                                   conversation: Any, stamp: Any,
                                                   signed: bool) -> None:
    _native_or_skip()
    message = _message(body, message_id=message_id, sender=sender,
                       conversation_id=conversation, timestamp=stamp, reply_by=stamp,
                       signature=Signature("k", "v" * 40) if signed else None)
    _same_frame(registry, message)


@pytest.mark.parametrize("name", SHIPPED)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_frames_and_text_of_generated_messages(native: Any, registry: Registry, name: str,
                                               data: st.DataObject) -> None:
    strategy, protocol = generator(name)
    loaded = registry.get(protocol)
    assert loaded is not None
    intent = loaded.descriptor.intents[0].value
    text = (f'(CBCL/1.0 (message-id "m") (sender agent://a) (receiver agent://b) '
            f"(intent {intent}) (protocol {protocol}) (conversation-id \"c\") "
            f"(timestamp 1764502900000) (body {data.draw(strategy)}))").encode()
    message = cbcl.parse(text, registry=registry, envelope_only=True)
    message = cbcl.parse(message.canonical().encode(), registry=registry, envelope_only=True)
    for validate in (False, True):  # (a schema may refuse a generated body: alike)
        c_twin = Encoder(registry, validate=validate)
        python_twin = Encoder(registry, validate=validate, pure_python=True)
        assert outcome(c_twin.encode, message) == outcome(python_twin.encode, message)
    value = message.to_value()
    assert native.canonical(value) == canonical_value_python(value)


@pytest.mark.parametrize("size", [0, 31, 32, 255, 256, 65535, 65536, 70000])
def test_string_headers(registry: Registry, size: int) -> None:
    _native_or_skip()
    for text in ("a" * size, "é" * (size // 2), "😀" * (size // 4)):
        _same_frame(registry, _message((Symbol("x"), text, URI("agent://u" + "u" * size))))


def test_integers_at_every_msgpack_boundary(registry: Registry) -> None:
    _native_or_skip()
    edges = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, _I64 - 1, -1, -32,
             -33, -128, -129, -32768, -32769, -(2**31), -(2**31) - 1, -_I64]
    assert isinstance(_same_frame(registry, _message(tuple(edges), timestamp=_I64 - 1)), bytes)
    for stamp in (_I64, 2**64 - 1, 2**64, -_I64 - 1):  # envelope ints beyond int64 (unchecked)
        _same_frame(registry, _message("x", timestamp=stamp))
    for big in (_I64, -_I64 - 1, 2**64):
        assert isinstance(_same_frame(registry, _message((1, big))), tuple)  # ValueError


def test_names_take_codes_in_order_and_repeat_by_code(registry: Registry) -> None:
    _native_or_skip()
    names: list[Symbol | Keyword | URI] = [Symbol(f"s{i}") for i in range(300)]
    names += [Keyword(f"k{i}") for i in range(300)]
    names += [URI(f"agent://n/{i}") for i in range(300)]
    body = (*names, *reversed(names), Symbol("k1"), Keyword("s1"), Symbol("request"),
            Keyword("action"), str.__new__(Symbol, "request"), Keyword("action"))
    assert isinstance(_same_frame(registry, _message(body)), bytes)


@pytest.mark.parametrize("depth", [10_000, 10_001, 20_000])
def test_deep_bodies(registry: Registry, depth: int) -> None:
    # bodies MAX_VALUE_DEPTH deep are written (in C); deeper ones the C twin declines and
    # the Python twin refuses at its depth limit, before it meets what is inside
    _native_or_skip()
    frame = _same_frame(registry, _message(_deep(depth, Symbol("x"))))
    wrong = _same_frame(registry, _message(_deep(depth, 1.5, list)))
    if depth <= MAX_VALUE_DEPTH:
        assert isinstance(frame, bytes)
        assert wrong[0] is TypeError
    else:
        assert frame[0] is wrong[0] is cbcl.LimitError
    loop: list[Any] = [Symbol("x")]
    loop.append(loop)
    assert _same_frame(registry, _message(loop))[0] is cbcl.LimitError


def test_prepare_declines_what_is_not_a_symbol_table(native: Any) -> None:
    assert native.prepare({Symbol("a"): 7, Keyword("a"): 8}) is not None
    not_tables: tuple[object, ...] = (
        {"a": 7}, {Symbol("a"): "7"}, {Symbol("a"): 2**70}, [], {Name("n"): 7})
    for codes in not_tables:
        assert native.prepare(codes) is None
    assert native.pack_frame(b"", [], "x", {Symbol("a"): 7}) is None  # not a prepared table
    assert native.pack_frame(b"", (), "x", native.prepare({})) is None
    with pytest.raises(TypeError):
        native.pack_frame(b"", [])


def test_the_encoder_uses_the_c_twin_where_built(native: Any, registry: Registry) -> None:
    message = _message((Symbol("request"), Keyword("action"), Symbol("go")))
    assert Encoder(registry)._table(message)[2] is not None
    assert Encoder(registry, pure_python=True)._table(message)[2] is None
    assert cbcl.core._canonical.native is native


# --------------------------------------------------------------------------- whole messages
# canonical_message (Message.canonical()) and pack_message / encode_message
# (Encoder.encode) write a whole message from its slots: the same text and frame as the
# Python paths (canonical_value_python(message.to_value()), Encoder(pure_python=True)), or
# they decline and the Python path writes it or raises, exactly as it always did.


class Signed(Signature):
    """A Signature subclass (the C twins decline it; the Python paths read it as one)."""


class Mail(Message):
    """A Message subclass (declined; the Python paths take it as a Message)."""

    __slots__ = ()


class DuckSignature:
    """Not a Signature, though the Python paths read its two attributes."""

    def __init__(self, key_id: Any, value: Any) -> None:
        self.key_id = key_id
        self.value = value


odd_fields = st.sampled_from([None, 1, True, 1.5, b"x", Symbol("s"), Keyword("k"),
                              URI("a://b"), (Symbol("a"), 1), ["l"], Text("t"), ""])
field_text = ids | any_text | surrogates | any_text.map(Text) | odd_fields
field_uri = uris | surrogates.map(lambda s: str.__new__(URI, "a:" + s)) | \
    st.sampled_from(["agent://plain-str", Text("agent://t"), None, 7,
                     str.__new__(URI, "agent://é"), str.__new__(URI, "😀://x")])
field_int = st.none() | big_ints | st.integers() | st.sampled_from([True, 1.5, "1", Decimal(1)])
intents = st.sampled_from(list(Intent)) | st.sampled_from(
    [str.__new__(Intent, "PROPOSE"), "INFORM", Symbol("QUERY"), "NO-SUCH", None, 3])
protocols = st.sampled_from([Symbol("request/v1"), Symbol("contract-net/v1"),
                             Symbol("task-assignment/v1"), Symbol("canon-a/v1")]) | \
    st.sampled_from([Symbol("no-such/v1"), "request/v1", Text("request/v1"), None,
                     str.__new__(Symbol, "request/v1")])
signatures = st.none() | st.builds(Signature, ids | field_text, ids | field_text) | \
    st.builds(Signed, ids, ids) | st.builds(DuckSignature, ids, ids) | \
    st.sampled_from(["sig", ("k", "v")])


@st.composite
def wild_messages(draw: st.DrawFn, sound: bool = False) -> Message:
    """A message with every field optional or odd: ``sound`` ones are of the field types
    (every intent, optional fields present or absent, signed or not), the others may hold
    anything, as only Message._trusted (no checks) lets them."""
    if sound:
        fields: dict[str, Any] = {
            "message_id": draw(ids), "sender": draw(uris), "receiver": draw(uris),
            "intent": draw(st.sampled_from(list(Intent))),
            "protocol": draw(protocols.filter(lambda p: type(p) is Symbol
                                              and p != Symbol("no-such/v1"))),
            "conversation_id": draw(st.none() | ids), "in_reply_to": draw(st.none() | ids),
            "reply_by": draw(st.none() | st.integers(-_I64, _I64 - 1)),
            "timestamp": draw(st.none() | st.integers(-_I64, _I64 - 1)),
            "body": draw(st.none() | values), "trace": draw(st.none() | traces),
            "signature": draw(st.none() | st.builds(Signature, ids, ids))}
    else:
        fields = {
            "message_id": draw(field_text), "sender": draw(field_uri),
            "receiver": draw(field_uri), "intent": draw(intents),
            "protocol": draw(protocols), "conversation_id": draw(st.none() | field_text),
            "in_reply_to": draw(st.none() | field_text), "reply_by": draw(field_int),
            "timestamp": draw(field_int), "body": draw(st.none() | wild),
            "signature": draw(signatures)}
    kind = draw(st.sampled_from([Message, Message, Message, Mail])) if not sound else Message
    return kind._trusted(**fields)


def _python_text(message: Message) -> str:
    return canonical_value_python(message.to_value(), around=2)  # (the envelope lists)


def _same_message_text(native: Any, message: Message) -> Any:
    expected = outcome(_python_text, message)
    assert outcome(message.canonical) == expected
    text = native.canonical_message(message)
    if text is not None:  # what the C twin writes is the Python text, kind and all
        assert text == expected and text.isascii() == expected.isascii()
        assert sys.getsizeof(text) == sys.getsizeof(expected)
    return expected


def _same_message_frame(registry: Registry, message: Message) -> Any:
    native = _native_or_skip()
    expected = outcome(Encoder(registry, validate=False, pure_python=True).encode, message)
    c_twin = Encoder(registry, validate=False)
    assert outcome(c_twin.encode, message) == expected  # (the first: not cached yet)
    assert outcome(c_twin.encode, message) == expected  # (cached: encode_message's path)
    frame = native.encode_message(message, registry, c_twin._tables)
    assert frame is None or frame == expected
    if type(message.protocol) is Symbol and registry.get(message.protocol) is not None:
        _, header, prepared = c_twin._table(message)
        frame = native.pack_message(header, message, prepared)
        assert frame is None or frame == expected
    for validate in (True,):  # validation first, in Python, then the C twin
        assert outcome(Encoder(registry, validate=validate).encode, message) == \
            outcome(Encoder(registry, validate=validate, pure_python=True).encode, message)
    return expected


@settings(max_examples=400, deadline=None)
@given(message=wild_messages(sound=True))
def test_message_text_and_frames_of_sound_messages(native: Any, registry: Registry,
                                                   message: Message) -> None:
    text = native.canonical_message(message)
    assert text is not None and text == _python_text(message)  # never declined
    assert message.canonical() == text
    frame = _same_message_frame(registry, message)
    assert isinstance(frame, bytes)
    c_twin = Encoder(registry, validate=False)
    _, header, prepared = c_twin._table(message)
    assert native.pack_message(header, message, prepared) == frame  # never declined
    protocol = registry.get(message.protocol)
    constrained = protocol is not None and protocol.constraints is not None
    # (declined for a protocol with constraints: the registry's fast paths do not serve it)
    assert native.encode_message(message, registry, c_twin._tables) == \
        (None if constrained else frame)


@settings(max_examples=600, deadline=None)
@given(message=wild_messages())
def test_message_text_and_frames_of_wild_messages_and_their_errors(
        native: Any, registry: Registry, message: Message) -> None:
    _same_message_text(native, message)
    _same_message_frame(registry, message)


@pytest.mark.parametrize(("intent", "optional"), [
    *((Intent.REQUEST, optional) for optional in range(128)),  # every set of optional fields
    *((intent, optional) for intent in Intent for optional in (0, 127))])  # every intent
def test_every_intent_and_set_of_optional_fields(native: Any, registry: Registry,
                                                 intent: Intent, optional: int) -> None:
    present = [bool(optional & bit) for bit in (1, 2, 4, 8, 16, 32, 64)]
    message = Message(
        message_id="m-1", sender="agent://a", receiver="agent://b", intent=intent,
        protocol="request/v1", conversation_id="c-1" if present[0] else None,
        in_reply_to="r-1" if present[1] else None, reply_by=-5 if present[2] else None,
        timestamp=1764502900000 if present[3] else None,
        trace="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" if present[6] else None,
        signature=Signature("key-1", "A" * 86) if present[4] else None,
        body=(Symbol("request"), Keyword("action"), (Symbol("go"), "é", 1, Decimal("2.50")))
        if present[5] else None)
    assert native.canonical_message(message) == _python_text(message) == message.canonical()
    assert isinstance(_same_message_frame(registry, message), bytes)


def test_what_the_message_twins_decline(native: Any, registry: Registry) -> None:
    base: dict[str, Any] = {
        "message_id": "m-1", "sender": URI("agent://a"), "receiver": URI("agent://b"),
        "intent": Intent.REQUEST, "protocol": Symbol("request/v1"), "conversation_id": None,
        "in_reply_to": None, "reply_by": None, "timestamp": None, "body": "x",
        "signature": None}
    ordinary = Message._trusted(**base)
    assert native.canonical_message(ordinary) is not None
    encoder = Encoder(registry, validate=False)
    frame = encoder.encode(ordinary)
    assert native.encode_message(ordinary, registry, encoder._tables) == frame
    declined = [
        Mail._trusted(**base),
        Message._trusted(**{**base, "intent": str.__new__(Intent, "REQUEST")}),  # not a member
        Message._trusted(**{**base, "signature": Signed("k", "v")}),
        Message._trusted(**{**base, "signature": DuckSignature("k", "v")}),
        Message._trusted(**{**base, "message_id": "\ud800"}),
        Message._trusted(**{**base, "timestamp": 2**64}),
        Message._trusted(**{**base, "body": 1.5}),
    ]
    for message in declined:
        assert native.canonical_message(message) is None
        assert native.encode_message(message, registry, encoder._tables) is None
        _same_message_text(native, message)
        _same_message_frame(registry, message)
    unset = object.__new__(Message)  # no slot set: the Python paths raise AttributeError
    assert native.canonical_message(unset) is None
    assert outcome(unset.canonical)[0] is AttributeError
    assert native.encode_message(unset, registry, encoder._tables) is None
    for thing in (None, "m", base, ordinary.to_value()):
        assert native.canonical_message(thing) is None
        assert native.encode_message(thing, registry, encoder._tables) is None
    # the cached table only: not cached yet, another registry type, odd tables
    assert native.encode_message(ordinary, registry, {}) is None
    assert native.encode_message(ordinary, registry, encoder._tables) == frame

    class Registry2(Registry):
        pass

    assert native.encode_message(ordinary, object.__new__(Registry2), encoder._tables) is None
    odd = {protocol: (table, header, None) for protocol, (table, header, _) in
           encoder._tables.items()}
    assert native.encode_message(ordinary, registry, odd) is None  # (pure_python=True's)
    assert native.encode_message(ordinary, registry, list(encoder._tables)) is None
    assert native.pack_message(b"", ordinary, None) is None
    assert native.pack_message(bytearray(), ordinary, native.prepare({})) is None
    calls: list[Callable[[], object]] = [lambda: native.pack_message(b""),
                                         lambda: native.encode_message(ordinary)]
    for call in calls:
        with pytest.raises(TypeError):
            call()


def test_message_slots_and_decimal_layout_are_found(native: Any) -> None:
    import cbcl.core._canonical
    import cbcl.protocol._message

    assert cbcl.protocol._message._canonical_message is native.canonical_message
    assert native.setup_message(Message, Signature, (Symbol("a"),), ()) is False  # names
    assert native.setup_message(DuckSignature, Signature, (Symbol("a"),) * 12, ()) is False
    assert cbcl.core._canonical.decimal_layout is (sys.implementation.name == "cpython")
    # (setup_message again, as _message.py calls it: what the other tests rely on)
    from cbcl.protocol._message import _FIELD, _INTENT_SYMBOL, _VERSION_SYMBOL
    assert native.setup_message(Message, Signature, (_VERSION_SYMBOL, *_FIELD.values()),
                                tuple(_INTENT_SYMBOL.items())) is True


@settings(max_examples=500, deadline=None)
@given(value=st.decimals(allow_nan=True, allow_infinity=True) | odd_decimals |
       st.builds(lambda digits, exp, sign: Decimal((sign, digits, exp)),
                 st.lists(st.integers(0, 9), min_size=1, max_size=70).map(tuple),
                 st.integers(-80, 80), st.integers(0, 1)))
def test_decimals_from_their_layout(native: Any, value: Decimal) -> None:
    # (read from _decimal's mpd_t where setup() found it laid out as expected)
    _same_text(native, value)
    _same_text(native, (value, Symbol("x"), value))


@pytest.mark.parametrize("count", [0, 1, 7, 8, 9, 15, 16, 17, 40])
def test_names_written_in_full_at_every_count(count: int) -> None:
    """A body that writes ``count`` names the table does not hold, each twice (the second
    time by the code the first took), around the switch from a scan of the first few to a
    hash table (eight in the C writer, sixteen in the C decoder): the C writer's frame is
    the Python twin's, and decodes back."""
    _native_or_skip()
    registry = cbcl.Registry(disk_cache=False, isolate=False)
    registry.load(b'(protocol-descriptor (id any/v1) (version 1) (intents INFORM) '
                  b'(grammar "body: value"))', allow_unsigned=True)
    names = [cbcl.Symbol(f"s{i}") if i % 3 == 0 else cbcl.Keyword(f"k{i}") if i % 3 == 1
             else cbcl.URI(f"agent://u{i}") for i in range(count)]
    body = (cbcl.Symbol("head"), *names, *reversed(names), (*names[: count // 2],))
    message = cbcl.Message._trusted("m", cbcl.URI("agent://a"), cbcl.URI("agent://b"),
                                    cbcl.Intent.INFORM, cbcl.Symbol("any/v1"), None, None,
                                    None, None, body, None)
    c_twin = cbcl.Encoder(registry, validate=False)
    python_twin = cbcl.Encoder(registry, validate=False, pure_python=True)
    frames = {c_twin.encode(message) for _ in range(2)}  # (the second: its table cached)
    assert frames == {python_twin.encode(message)}
    frame = frames.pop()
    decoder = cbcl.Decoder(registry)
    # (the first frame makes the decoder's frame plan; the second is decoded in one C call,
    # which learns the names as this frame wrote them)
    assert decoder.decode(frame) == decoder.decode(frame) == message
