"""The C decoder's shortcuts in the schema check (cbcl/_native_src/speedups.c: a kind or
one-of value found by identity in a small set before it is hashed, an integer compared
with its range's bounds in C) against the Python decoder, the reference: the same message
or the same error (class and text) on values at each bound and one past it, one-of values
in and out, and values of the wrong kind; and a frame the C call declines does not drop a
reference it does not own (``Decoder.decode`` once released ``None`` twice there).

Tests internals: ``pure_python=True`` is the reference decoder."""

from __future__ import annotations

import sys
from typing import Annotated, Any, Literal

import pytest

import cbcl
from cbcl import CBCLError, Decoder, Encoder, Registry
from cbcl.binary import _codec

pytestmark = pytest.mark.skipif(not _codec.SPEEDUPS, reason="cbcl._native is not built here")
if _codec.SPEEDUPS:
    from cbcl._native import decode_frame


class Item(cbcl.Record):
    code: Annotated[str, cbcl.Length(1, 8)]
    qty: Annotated[int, cbcl.Range(1, 99)] = 1


class Order(cbcl.Record, intent="REQUEST"):
    kind: Literal["cbc", "hba1c", "lipids"]
    level: Annotated[int, cbcl.Range(-5, 5)]
    wide: Annotated[int, cbcl.Range(-(2**63), 2**62)]
    items: tuple[Item, ...] = ()


def _registry() -> Registry:
    registry = Registry(disk_cache=False, isolate=False)
    registry.load(cbcl.descriptor_from(Order, id="fast/v1", version=1), allow_unsigned=True)
    return registry


def _frame(encoder: Encoder, index: int, body: tuple[Any, ...]) -> bytes:
    return encoder.encode(cbcl.Message(message_id=f"m{index}", sender="agent://a",
                                       receiver="agent://b", intent="REQUEST",
                                       protocol="fast/v1", body=body))


def _outcome(decoder: Decoder, frame: bytes) -> Any:
    try:
        return decoder.decode(frame)
    except CBCLError as exc:
        return type(exc), str(exc)


def _bodies() -> list[tuple[Any, ...]]:
    valid = Order(kind="cbc", level=0, wide=0, items=(Item(code="a", qty=3),))
    whole: Any = cbcl.Message(message_id="m", sender="agent://a", receiver="agent://b",
                              intent="REQUEST", protocol="fast/v1", body=valid).body
    base: list[Any] = list(whole)
    item: Any = base[8][0]
    changes: list[tuple[int, Any]] = [
        (2, cbcl.Symbol("cbc")), (2, cbcl.Symbol("lipids")), (2, cbcl.Symbol("tsh")),
        (2, "cbc"), (2, cbcl.Keyword("cbc")), (2, 1),
        (4, -5), (4, 5), (4, -6), (4, 6), (4, "1"), (4, cbcl.Symbol("x")),
        (6, -(2**63)), (6, 2**62), (6, 2**62 + 1), (6, 2**63 - 1),
        (8, ((*item[:4], 99),)), (8, ((*item[:4], 100),)), (8, ((*item[:4], 0),)),
        (8, ((*item[:4], "3"),)), (8, ((item[0], item[1], "", item[3], 3),)),
    ]
    bodies = [tuple(base)]
    for place, value in changes:
        body = list(base)
        body[place] = value
        bodies.append(tuple(body))
    return bodies


def test_the_shortcuts_decide_as_the_reference_does() -> None:
    registry = _registry()
    encoder = Encoder(registry, validate=False)
    frames = [_frame(encoder, index, body) for index, body in enumerate(_bodies())]
    fast, reference = Decoder(registry), Decoder(registry, pure_python=True)
    fast.decode(frames[0])  # (its frame plan made: the C call reads the rest whole)
    outcomes = [_outcome(fast, frame) for frame in frames]
    assert outcomes == [_outcome(reference, frame) for frame in frames]
    refused = [o for o in outcomes if isinstance(o, tuple)]
    assert 10 <= len(refused) < len(outcomes)  # (both kinds of outcome are exercised)
    state = fast._frame_state
    assert state is not None
    assert decode_frame(frames[0], state) == outcomes[0]  # (read whole in C)


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="None is immortal from 3.12")
def test_a_declined_frame_keeps_the_reference_count_of_none() -> None:
    registry = _registry()
    encoder = Encoder(registry, validate=False)
    frame = _frame(encoder, 0, _bodies()[0])
    decoder = Decoder(registry)
    decoder.decode(frame)
    damaged = frame[:-1]  # (the C call declines it; the Python path raises)
    before = sys.getrefcount(None)
    for _ in range(2000):
        with pytest.raises(CBCLError):
            decoder.decode(damaged)
    assert sys.getrefcount(None) > before - 1000
