"""A refused binary frame is decided at C speed (issue 36, item 2).

Where ``cbcl._native`` is built and its whole-frame decoder declines a frame, the decoder
builds the body's value in C without the grammar, finds the refused token in the value
(:func:`cbcl.protocol._pass2.find_refusal`) and words the error from it
(``_codec._frame_by_value``), instead of walking every token in Python
(``_codec._decode_tokens``, the careful tier). These tests hold the two to each other —
the same error, message, offset, expected items and hint — for mutated bodies of every
shipped grammar, for frames not written in msgpack's shortest forms, and for intents the
protocol does not govern; and they count that a refused frame never reaches the careful
tier. Speed is measured by ``benchmarks/refusal_cost.py``.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings, strategies as st
from strategies import mutate_tokens
from test_protocol import DESCRIPTORS, SHIPPED, generator

import cbcl
from cbcl import BodyError, CBCLError, Decoder, Encoder, Registry
from cbcl.binary import _codec

pytestmark = pytest.mark.skipif(not _codec.SPEEDUPS,
                                reason="cbcl._native is not built")

NESTED = (b'(protocol-descriptor (id nested/v1) (version 1) (intents INFORM NOT-UNDERSTOOD) '
          b'(grammar "body: item\\nitem: INTEGER | STRING | \\"(\\" \\"n\\" item* \\")\\""))')

PAIRS = (b'(protocol-descriptor (id pairs/v1) (version 1) (intents INFORM) '
         b'(grammar "body: \\"(\\" \\"p\\" INTEGER INTEGER \\")\\""))')


@pytest.fixture(scope="module")
def registry() -> Registry:
    reg = Registry(disk_cache=False, isolate=False)
    for name in SHIPPED:
        reg.load((DESCRIPTORS / f"{name}.cbcl").read_bytes(), allow_unsigned=True)
    reg.load(NESTED, allow_unsigned=True)
    reg.load(PAIRS, allow_unsigned=True)
    return reg


def envelope(protocol: str, intent: str, body: str | None) -> str:
    field = "" if body is None else f" (body {body})"
    return (f'(CBCL/1.0 (message-id "m") (sender agent://a) (receiver agent://b) '
            f"(intent {intent}) (protocol {protocol}){field})")


def frame_of(registry: Registry, text: str) -> bytes:
    """The frame of ``text``'s message as an encoder writes it, refused or not."""
    return Encoder(registry, validate=False).encode(cbcl.parse(text, envelope_only=True))


def outcome(call: Any) -> Any:
    """The message, or the error's class, message, offset, expected items and hint."""
    try:
        return call()
    except CBCLError as exc:
        return (type(exc), exc.message, exc.offset, getattr(exc, "expected", None),
                exc.hint())


def careful(registry: Registry, data: bytes) -> Any:
    """The careful tier's outcome (a pure-Python decoder never takes the C tiers)."""
    return outcome(lambda: Decoder(registry, pure_python=True).decode(data))


def warm(registry: Registry) -> Decoder:
    decoder = Decoder(registry)
    for protocol in registry.protocols():
        decoder._table(bytes.fromhex(protocol.digest[7:]), 4)  # its frame plan
    return decoder


class CarefulCalls:
    """Counts the frames that reach the careful tier."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = _codec._decode_tokens

        def spy(*args: Any) -> Any:
            self.count += 1
            return real(*args)

        monkeypatch.setattr(_codec, "_decode_tokens", spy)


@pytest.mark.parametrize("name", SHIPPED)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_refusals_by_value_are_the_careful_ones(name: str, data: st.DataObject,
                                               registry: Registry) -> None:
    strategy, protocol = generator(name)
    tokens = mutate_tokens(data.draw(strategy).split(" "), data)
    intent = data.draw(st.sampled_from(["INFORM", "REQUEST", "CFP", "PROPOSE",
                                        "NOT-UNDERSTOOD"]))
    try:
        frame = frame_of(registry, envelope(protocol, intent, " ".join(tokens)))
    except CBCLError:
        return  # not an envelope: nothing to encode
    decoder = warm(registry)
    assert outcome(lambda: decoder.decode(frame)) == careful(registry, frame)


def nested_body(count: int, bad: int | None, depth: int = 3) -> str:
    """``(n …)`` lists ``depth`` deep, the innermost with ``count`` integers, one of them
    (``bad``) a decimal the grammar refuses."""
    items = [str(i) if i != bad else "1.5" for i in range(count)]
    body = "(n " + " ".join(items) + ")"
    for level in range(depth - 1):
        body = f'(n {level} "s{level}" {body} {level})'
    return body


@pytest.mark.parametrize("bad", [0, 1, 500, 2999])
def test_a_refused_frame_never_reaches_the_careful_tier(
        bad: int, registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    frame = frame_of(registry, envelope("nested/v1", "INFORM", nested_body(3000, bad)))
    expected = careful(registry, frame)
    assert expected[0] is BodyError
    calls = CarefulCalls(monkeypatch)
    assert outcome(lambda: warm(registry).decode(frame)) == expected
    assert calls.count == 0


@pytest.mark.parametrize("body", [
    "1.5",  # the body itself
    "(1)",  # the first element of the body
    "(x 1)",  # a symbol where the literal is expected
    "(n 1 (n 2 3) (x))",  # a list where an item is expected
    '(n (n (n "a" 1.5)))',  # deep
    "(n 1 (n 2 3) 1.5)",  # after a list
])
def test_every_kind_of_refused_token(body: str, registry: Registry,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    frame = frame_of(registry, envelope("nested/v1", "INFORM", body))
    expected = careful(registry, frame)
    assert expected[0] is BodyError
    calls = CarefulCalls(monkeypatch)
    assert outcome(lambda: warm(registry).decode(frame)) == expected
    assert calls.count == 0


def test_a_list_the_grammar_cannot_close(registry: Registry,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``)`` refused (CLOSE) and a body refused at its end (END)."""
    for body in ("(p 1)", "(p 1 2 3)", "(p)"):
        frame = frame_of(registry, envelope("pairs/v1", "INFORM", body))
        expected = careful(registry, frame)
        assert expected[0] is BodyError, body
        calls = CarefulCalls(monkeypatch)
        assert outcome(lambda f=frame: warm(registry).decode(f)) == expected
        assert calls.count == 0


def longer_forms(frame: bytes) -> bytes:
    """``frame`` with every msgpack integer token of its body's first part written as a
    uint32 (not the shortest form: a decoder accepts it, spec/binary.md §3.4)."""
    head = _codec.HEADER_BYTES
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(frame[head:])
    out = bytearray(frame[:head])
    for token in unpacker:
        if type(token) is int and 0 <= token < 128:
            out += b"\xce" + token.to_bytes(4, "big")
        else:
            out += msgpack.packb(token)
    return bytes(out)


def test_a_frame_not_in_shortest_form_is_refused_at_the_same_offset(
        registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    frame = longer_forms(frame_of(registry, envelope("nested/v1", "INFORM",
                                                     nested_body(200, 150))))
    expected = careful(registry, frame)
    assert expected[0] is BodyError
    calls = CarefulCalls(monkeypatch)
    assert outcome(lambda: warm(registry).decode(frame)) == expected
    assert calls.count == 0


@pytest.mark.parametrize(("intent", "error"), [
    ("NOT-UNDERSTOOD", BodyError),  # ungoverned, with a list body
    ("CFP", cbcl.ProtocolError),  # not governed at all
])
def test_ungoverned_bodies_are_refused_by_value(intent: str, error: type,
                                                registry: Registry,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    frame = frame_of(registry, envelope("pairs/v1", intent, nested_body(2000, None)))
    expected = careful(registry, frame)
    assert expected[0] is error
    calls = CarefulCalls(monkeypatch)
    assert outcome(lambda: warm(registry).decode(frame)) == expected
    assert calls.count == 0


def test_limits_still_go_to_the_careful_tier(registry: Registry,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A frame over a limit is not decided by value: the careful tier says which limit,
    and where (the body builder only declines)."""
    frame = frame_of(registry, envelope("nested/v1", "INFORM", nested_body(300, 10)))
    limits = cbcl.Limits(max_list_items=100)
    expected = outcome(lambda: Decoder(registry, limits=limits, pure_python=True).decode(frame))
    assert expected[0] is cbcl.LimitError
    calls = CarefulCalls(monkeypatch)
    decoder = Decoder(registry, limits=limits)
    assert outcome(lambda: decoder.decode(frame)) == expected
    assert calls.count == 1
