"""Decimals the C readers make in place (``decimal_of``, cbcl/_native_src/cstack.h): for every CBCL
decimal text, the text reader (``cbcl._native``) and the binary decoder
(``cbcl._native``) give a ``Decimal`` indistinguishable from ``Decimal(text)``: its
tuple, text, hash, comparisons and arithmetic. Coefficients of up to 19 significant
digits are written into the object; longer ones are ``Decimal(text)``'s."""

from __future__ import annotations

import os
import sys
from decimal import Decimal, localcontext

import pytest
from hypothesis import example, given, settings, strategies as st

import cbcl
from cbcl import Registry

scanner = pytest.importorskip("cbcl._native")
speedups = pytest.importorskip("cbcl._native")

ANY = (b'(protocol-descriptor (id any/v1) (version 1) (intents INFORM NOT-UNDERSTOOD) '
       b'(grammar "body: value"))')
REGISTRY = Registry(disk_cache=False, isolate=False)
REGISTRY.load(ANY, allow_unsigned=True)
ENCODER, DECODER = cbcl.Encoder(REGISTRY), cbcl.Decoder(REGISTRY)
HEAD = (b'(CBCL/1.0 (message-id "m") (sender agent://a) (receiver agent://b) (intent INFORM) '
        b"(protocol any/v1) (body ")


def test_the_layout_check_holds_where_ci_builds_the_extensions() -> None:
    if os.environ.get("CBCL_REQUIRE_SPEEDUPS") and sys.implementation.name == "cpython":
        assert scanner.decimals_in_place() and speedups.decimals_in_place()
    assert scanner.decimals_in_place() == speedups.decimals_in_place()


def indistinguishable(found: object, text: str) -> None:
    expected = Decimal(text)
    assert type(found) is Decimal
    assert found.as_tuple() == expected.as_tuple()
    assert str(found) == str(expected) and repr(found) == repr(expected)
    assert hash(found) == hash(expected)
    assert found == expected and not found < expected and not found > expected
    with localcontext() as context:
        context.prec = 60  # (exact: both sums round alike, or not at all)
        assert found + Decimal("0.5") == expected + Decimal("0.5")
        assert found * 3 == expected * 3
        assert (-found).as_tuple() == (-expected).as_tuple()
        assert found.quantize(Decimal("1.0000")) == expected.quantize(Decimal("1.0000"))


decimal_texts = st.builds(
    lambda sign, whole, fraction: f"{sign}{whole}.{fraction}",
    st.sampled_from(["", "-"]),
    st.one_of(st.just("0"), st.integers(1, 10**25).map(str)),
    st.text("0123456789", min_size=1, max_size=25),
).filter(lambda text: len(text) <= 40)


@settings(max_examples=500, deadline=None)
@given(text=decimal_texts)
@example(text="0.0")
@example(text="-0.0")
@example(text="0." + "0" * 38)
@example(text="-0." + "0" * 37)
@example(text="9999999999999999999.0")  # 20 significant digits: Decimal(text) makes it
@example(text="999999999999999999.9")  # 19: the largest word made in place
@example(text="0.0000000000000000009999999999999999999")
@example(text="1000000000000000000.0")
@example(text="18446744073709551615.5")
def test_read_and_decoded_decimals_are_decimal_text(text: str) -> None:
    indistinguishable(cbcl.read(text.encode()), text)
    document = HEAD + f"(values {text} {text} 1.5)))".encode()
    message = cbcl.parse(document, registry=REGISTRY)
    assert message.body[1:3] == (Decimal(text), Decimal(text))
    for found in message.body[1:3]:
        indistinguishable(found, text)
    decoded = DECODER.decode(ENCODER.encode(message))
    for found in decoded.body[1:3]:
        indistinguishable(found, text)
