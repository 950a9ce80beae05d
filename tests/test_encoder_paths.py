"""The binary encoder's C paths held to the Python twin byte for byte where their shapes
change: a protocol with constraints on the unvalidated C path (and off the validated
one), the output buffer around its inline size and over many doublings, integers at the
edges of the ones read from their digits, and decimals written in place."""

from __future__ import annotations

import sys
from decimal import Decimal
from types import FrameType
from typing import Any

import pytest
from test_encoders import _native_or_skip
from test_protocol import DESCRIPTORS, SHIPPED

from cbcl import Encoder, Message, Registry, parse
from cbcl.binary import _codec
from cbcl.core._values import URI, Keyword, Symbol


@pytest.fixture(scope="module")
def native() -> Any:
    return _native_or_skip()


@pytest.fixture(scope="module")
def registry() -> Registry:
    registry = Registry(disk_cache=False, isolate=False)
    for name in SHIPPED:
        registry.load((DESCRIPTORS / f"{name}.cbcl").read_bytes(), allow_unsigned=True)
    return registry


def _python_encodes(encoder: Encoder, message: Message) -> tuple[bytes, int]:
    """The frame of ``encoder.encode(message)`` and how many times the Python method
    (the C entry's fallback) ran for it."""
    calls = 0
    code = _codec.encode_python.__code__

    def profile(frame: FrameType, event: str, arg: object) -> None:
        nonlocal calls
        if event == "call" and frame.f_code is code:
            calls += 1

    sys.setprofile(profile)
    try:
        frame = encoder.encode(message)
    finally:
        sys.setprofile(None)
    return frame, calls


def test_a_protocol_with_constraints_is_encoded_in_c_when_nothing_is_validated(
        native: Any, registry: Registry) -> None:
    """canon-a/v1 has constraints: the unvalidated C path serves it (it checks no rule),
    the validating one leaves it to the Python method (which applies them)."""
    assert registry.get("canon-a/v1").constraints is not None  # type: ignore[union-attr]
    text = (DESCRIPTORS / "examples" / "canon-a-v1-inform.cbcl").read_text()
    message = parse(text, registry=registry)
    reference = _codec.encode_python(Encoder(registry, validate=False, pure_python=True),
                                     message)
    unvalidated = Encoder(registry, validate=False)
    unvalidated.encode(message)  # (the first call caches the protocol's table)
    assert _python_encodes(unvalidated, message) == (reference, 0)
    validating = Encoder(registry)
    validating.encode(message)
    frame, calls = _python_encodes(validating, message)
    assert (frame, calls) == (reference, 1)


def _message(body: Any) -> Message:
    return Message(message_id="m-1", sender=URI("agent://a"), receiver=URI("agent://b"),
                   intent="INFORM", protocol=Symbol("request/v1"), body=body)


def _same_as_python(registry: Registry, body: Any) -> bytes:
    message = _message(body)
    python = Encoder(registry, validate=False, pure_python=True)
    encoder = Encoder(registry, validate=False)
    encoder.encode(_message(1))  # (the first call caches the protocol's table)
    frame, calls = _python_encodes(encoder, message)
    assert calls == 0
    assert frame == python.encode(message)
    return frame


def test_frames_around_the_inline_buffer_and_over_many_doublings(
        native: Any, registry: Registry) -> None:
    """A frame of 2,048 bytes (the inline buffer's size) is written in it; one byte more,
    and much longer ones, in the bytes object it grows into: each as the Python twin."""
    base = len(_same_as_python(registry, ("a" * 300,)))
    sizes = set()
    for target in (2047, 2048, 2049, 4096, 4097):
        length = 300 + target - base  # (a str of 256 bytes or more keeps a 3-byte header)
        sizes.add(len(_same_as_python(registry, ("a" * length,))))
    assert sizes == {2047, 2048, 2049, 4096, 4097}
    for count in (1, 100, 3000):
        _same_as_python(registry, tuple(f"row {i} ünïcode" for i in range(count)))
    _same_as_python(registry, ("x" * 70000, ("y" * 300,) * 400))


@pytest.mark.parametrize("value", [
    0, 1, -1, 127, 128, -32, -33, 2**30 - 1, 2**30, -(2**30), 2**31, 2**60 - 1, 2**60,
    -(2**60) + 1, -(2**60), 2**62, 2**63 - 1, -(2**63)])
def test_integers_at_the_edges_of_their_digits(native: Any, registry: Registry,
                                               value: int) -> None:
    _same_as_python(registry, (value, (Symbol("n"), value)))


@pytest.mark.parametrize("text", [
    "0", "-0", "0E+3", "-0E+5", "0E-7", "0.00", "1", "-1", "1E+3", "1.00E+3", "12345.67",
    "0.000123", "-0.5", "5E-30", "123456789012345678901234567890.123", "1E+20", "7E-12",
    "99999999999999999999", "-12345678901234567890.5"])
def test_decimals_written_in_place(native: Any, registry: Registry, text: str) -> None:
    _same_as_python(registry, (Decimal(text), Keyword("d"), (Decimal(text),)))
