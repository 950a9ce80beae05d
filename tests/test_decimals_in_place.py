"""Decimals the C readers make in place (``decimal_of``, cbcl/_native_src/cstack.h): for
every CBCL decimal text, the text reader and the binary decoder of ``cbcl._native`` give a
``Decimal`` indistinguishable from ``Decimal(text)``: its tuple, text, hash, comparisons
and arithmetic. Coefficients of up to 19 significant digits are written into the object;
longer ones are ``Decimal(text)``'s. The layout check covers 3.11 to 3.13, where Decimal
became a GC type (its objects tracked): it refuses a type laid out otherwise, and on 3.13
the Decimals of a body are untracked so the tuples that hold them are too.

Tests internals: the readers of ``cbcl._native``."""

from __future__ import annotations

import gc
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


def test_the_layout_check_refuses_other_layouts_and_knows_the_collector() -> None:
    import _pydecimal

    class Slotted(Decimal):
        __slots__ = ("extra",)

    holds, untrackable = scanner.decimal_layout_holds(Decimal)
    assert holds == scanner.decimals_in_place()
    if holds:  # (3.11, 3.12: not a GC type; 3.13: a GC type whose objects visit the type)
        assert untrackable
        assert gc.is_tracked(Decimal("1.5")) == (sys.version_info >= (3, 13))
    # another layout (a subclass with a slot, the pure-Python Decimal, not a type): refused,
    # and the readers then make Decimal(text) (the tests below hold either way)
    assert scanner.decimal_layout_holds(Slotted) == (False, False)
    assert scanner.decimal_layout_holds(_pydecimal.Decimal) == (False, False)
    assert scanner.decimal_layout_holds(int) == (False, False)
    assert scanner.decimal_layout_holds("decimal") == (False, False)


#: Py_TPFLAGS_HAVE_GC: Decimal's objects have a collector header (from 3.13).
HAVE_GC = 1 << 14


@pytest.mark.skipif(sys.implementation.name != "cpython", reason="CPython's _decimal")
@pytest.mark.parametrize("text", ["-934.32", "0.1234567890123456789", "100.001"])
def test_the_layout_check_covers_this_cpythons_decimal(text: str) -> None:
    """3.11 and 3.12: Decimal is no GC type; 3.13: a GC type, its objects tracked as they
    are made. The check holds on each (CI builds the extension for all three), and a
    Decimal made in place is what _decimal makes for the collector too: tracked where
    theirs are (outside a body nothing untracks it), and walked by a collection."""
    gc_type = bool(Decimal.__flags__ & HAVE_GC)
    assert gc_type == (sys.version_info >= (3, 13))
    theirs = Decimal(text)
    assert gc.is_tracked(theirs) == gc_type
    holds, untrackable = scanner.decimal_layout_holds(Decimal)
    if os.environ.get("CBCL_REQUIRE_SPEEDUPS"):
        assert holds and untrackable and scanner.decimals_in_place()
    ours = cbcl.read(text.encode())  # (made in place where the check holds)
    assert type(ours) is Decimal and gc.is_tracked(ours) == gc.is_tracked(theirs)
    gc.collect()
    indistinguishable(ours, text)


@pytest.mark.slow
@pytest.mark.parametrize("text", ["2.5", "-934.32", "0.1234567890123456789",
                                  "12345678901234567890.5"])
def test_bodies_of_decimals_stay_out_of_the_collector(text: str) -> None:
    """From 3.13 Decimal is GC-tracked: the readers untrack the Decimals of a body (they
    refer to their type only), so a tuple of atoms and decimals is untracked as on 3.12 (a
    short decimal comes from the reader's token cache, a long one is made in C)."""
    if not scanner.decimal_layout_holds(Decimal)[1]:
        pytest.skip("Decimal's objects may not be untracked here")
    data = HEAD + f"(x {text} (y {text}))))".encode()
    frame = ENCODER.encode(cbcl.parse(data, registry=REGISTRY))
    DECODER.decode(frame)  # (a first message may take the careful path)
    for message in (cbcl.parse(data, registry=REGISTRY), DECODER.decode(frame)):
        body = message.body
        assert isinstance(body, tuple)
        assert not gc.is_tracked(body), body
        assert not gc.is_tracked(body[1]) and not gc.is_tracked(body[2])
        gc.collect()  # (the collector meets the untracked ones through nothing)
        indistinguishable(body[1], text)


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
    assert isinstance(message.body, tuple)
    assert message.body[1:3] == (Decimal(text), Decimal(text))
    for found in message.body[1:3]:
        indistinguishable(found, text)
    decoded = DECODER.decode(ENCODER.encode(message))
    assert isinstance(decoded.body, tuple)
    for found in decoded.body[1:3]:
        indistinguishable(found, text)
