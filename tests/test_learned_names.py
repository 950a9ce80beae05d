"""The C binary encoder's table of the names a frame writes in full ("learned": each takes
the next code, and is written by its code when it comes again), against the Python twin,
byte for byte: at every size where the table changes shape (the inline scan up to 8
names, then an index that doubles), and across frames of one encoder, which lend each
other the table's arrays (a symbol table's *spare*, kept up to 16,384 names' room).

Tests internals: ``Encoder(pure_python=True)`` is the twin, ``Encoder._table`` the
symbol table a frame is written against."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from test_encoders import _message, _native_or_skip, outcome
from test_protocol import DESCRIPTORS, SHIPPED

from cbcl import URI, Encoder, Keyword, Registry, Symbol

#: The spare's bound, in names (encoders.c SPARE_MAX_NAMES).
SPARE_MAX_NAMES = 1 << 14


@pytest.fixture(scope="module")
def registry() -> Registry:
    reg = Registry(disk_cache=False, isolate=False)
    for name in SHIPPED:
        reg.load((DESCRIPTORS / f"{name}.cbcl").read_bytes(), allow_unsigned=True)
    return reg


def _names(count: int, tag: str) -> list[Any]:
    """``count`` distinct names of the three kinds, never seen by a symbol table."""
    kinds = (lambda i: Symbol(f"{tag}-s{i}"), lambda i: Keyword(f"{tag}-k{i}"),
             lambda i: URI(f"agent://{tag}/{i}"))
    return [kinds[i % 3](i) for i in range(count)]


def _body(count: int, tag: str) -> tuple[Any, ...]:
    """A body of ``count`` new names, each then written again (by its code), some of them
    as an equal but other object (interned names are shared; these are not)."""
    names = _names(count, tag)
    again = [type(n)(str(n)) if i % 5 == 0 else n for i, n in enumerate(reversed(names))]
    return (Symbol("req"), tuple(names), tuple(again), "end")


def _check(c_twin: Encoder, python_twin: Encoder, registry: Registry, body: Any) -> None:
    message = _message(body)
    frame = outcome(c_twin.encode, message)
    assert frame == outcome(python_twin.encode, message)
    assert isinstance(frame, bytes)


@pytest.mark.parametrize("count", [0, 1, 7, 8, 9, 16, 17, 31, 32, 33, 64, 65, 500, 3000])
def test_every_table_shape_writes_the_twins_frame(registry: Registry, count: int) -> None:
    _native_or_skip()
    c_twin = Encoder(registry, validate=False)
    python_twin = Encoder(registry, validate=False, pure_python=True)
    _check(c_twin, python_twin, registry, _body(count, f"shape{count}"))


def test_frames_of_one_encoder_lend_each_other_the_table(registry: Registry) -> None:
    # big, small, big again, bigger (the spare grows), inline-only, big: each frame is
    # the twin's, so nothing of an earlier frame's names leaks into a later one's codes
    _native_or_skip()
    c_twin = Encoder(registry, validate=False)
    python_twin = Encoder(registry, validate=False, pure_python=True)
    for round_, count in enumerate([2000, 12, 2000, 5000, 3, 40, 5000, 0, 900]):
        _check(c_twin, python_twin, registry, _body(count, f"lend{round_}"))
    # the same names twice in a row: the second frame learns them afresh
    body = _body(700, "twice")
    _check(c_twin, python_twin, registry, body)
    _check(c_twin, python_twin, registry, body)


@pytest.mark.parametrize("count", [SPARE_MAX_NAMES, SPARE_MAX_NAMES + 1])
def test_past_the_spares_bound_the_frame_is_the_same(registry: Registry, count: int) -> None:
    # at the bound the arrays are kept for the next frame, past it they are freed
    # (both written as the twin writes them, and the frame after too)
    _native_or_skip()
    c_twin = Encoder(registry, validate=False)
    python_twin = Encoder(registry, validate=False, pure_python=True)
    names = _names(count, f"bound{count}")
    _check(c_twin, python_twin, registry, (Symbol("req"), tuple(names)))
    _check(c_twin, python_twin, registry, _body(100, f"after{count}"))


def test_the_spare_keeps_no_name(registry: Registry) -> None:
    # the spare keeps arrays, not names: every name a frame learned is released after it
    # (a reference kept, or one dropped too many, changes the count)
    _native_or_skip()
    c_twin = Encoder(registry, validate=False)
    body = _body(3000, "alive")
    names = list(body[1])
    before = [sys.getrefcount(n) for n in names]
    for _ in range(3):
        c_twin.encode(_message(body))
    assert [sys.getrefcount(n) for n in names] == before
