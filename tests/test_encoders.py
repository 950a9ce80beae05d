"""The C twins of the encoders (``cbcl._encoders``) against their Python twins, byte for
byte: the canonical text of any value (``canonical_value`` vs ``canonical_value_python``)
and binary frames (``Encoder`` vs ``Encoder(pure_python=True)``), errors included: a value
the C twin declines is written, or refused, by the Python twin, so both paths must give
the same text, the same frame or the same exception with the same message."""

from __future__ import annotations

import decimal
import os
import sys
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st
from strategies import atoms, ids, uris, values
from test_protocol import DESCRIPTORS, SHIPPED, generator

import cbcl
from cbcl import URI, Intent, Keyword, Message, Registry, Signature, Symbol
from cbcl._canonical import canonical_value, canonical_value_python
from cbcl._codec import INTENTS, Encoder

_I64 = 2**63


def _native_or_skip() -> Any:
    """cbcl._encoders, or a skip where it is not built (CI requires it:
    CBCL_REQUIRE_SPEEDUPS)."""
    try:
        import cbcl._encoders as module
    except ImportError:
        if os.environ.get("CBCL_REQUIRE_SPEEDUPS"):
            raise
        pytest.skip("cbcl._encoders is not built here")
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
    """A Symbol subclass (canonical_value writes it as a symbol; the encoder refuses)."""


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


@pytest.mark.parametrize("depth", [1, 100, 9_999, 10_000, 10_001, 30_000])
def test_canonical_text_of_deep_values(native: Any, depth: int) -> None:
    # The C twin is iterative up to its stack bound (10,000) and declines deeper values,
    # which the Python twin, iterative too, writes: the same text at every depth.
    for kind in (tuple, list):
        value = _deep(depth, "x", kind)
        assert canonical_value(value) == "(" * depth + '"x"' + ")" * depth
        assert (native.canonical(value) is None) == (depth > 10_000)
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
    intent = registry.get(protocol).descriptor.intents[0].value  # type: ignore[union-attr]
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
    names = [Symbol(f"s{i}") for i in range(300)] + [Keyword(f"k{i}") for i in range(300)]
    names += [URI(f"agent://n/{i}") for i in range(300)]
    body = (*names, *reversed(names), Symbol("k1"), Keyword("s1"), Symbol("request"),
            Keyword("action"), str.__new__(Symbol, "request"), Keyword("action"))
    assert isinstance(_same_frame(registry, _message(body)), bytes)


@pytest.mark.parametrize("depth", [10_000, 10_001, 20_000])
def test_deep_bodies(registry: Registry, depth: int) -> None:
    _native_or_skip()
    assert isinstance(_same_frame(registry, _message(_deep(depth, Symbol("x")))), bytes)
    assert isinstance(_same_frame(registry, _message(_deep(depth, 1.5, list))), tuple)


def test_prepare_declines_what_is_not_a_symbol_table(native: Any) -> None:
    assert native.prepare({Symbol("a"): 7, Keyword("a"): 8}) is not None
    for codes in ({"a": 7}, {Symbol("a"): "7"}, {Symbol("a"): 2**70}, [], {Name("n"): 7}):
        assert native.prepare(codes) is None
    assert native.pack_frame(b"", [], "x", {Symbol("a"): 7}) is None  # not a prepared table
    assert native.pack_frame(b"", (), "x", native.prepare({})) is None
    with pytest.raises(TypeError):
        native.pack_frame(b"", [])


def test_the_encoder_uses_the_c_twin_where_built(native: Any, registry: Registry) -> None:
    message = _message((Symbol("request"), Keyword("action"), Symbol("go")))
    assert Encoder(registry)._table(message)[2] is not None
    assert Encoder(registry, pure_python=True)._table(message)[2] is None
    assert cbcl._canonical.native is native
