"""The fuzz invariant: any input gives a result or a CBCLError, nothing else.

These are hypothesis properties that run in every test run; the long-running atheris
campaign lives beside the benchmarks (issue 8).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from hypothesis import example, given, strategies as st
from strategies import messages, values

import cbcl
from cbcl import CBCLError

EXAMPLE = (Path(__file__).parent.parent / "descriptors" / "examples"
           / "task-assignment-v1.cbcl").read_bytes()

# Bytes that matter to the reader, so random inputs reach deep into it.
_ALPHABET = st.sampled_from(
    [b"(", b")", b'"', b"\\", b"u", b"0", b"-", b".", b"1", b":", b"a", b";", b"\n", b" ",
     b"://", b"CBCL/1.0", b"body", b"\xff", b"\xc3", b"\xa9", b"\x00", b"\xe2\x80\xae"]
)
tokenish = st.lists(_ALPHABET, max_size=60).map(b"".join)


def _check(data: bytes) -> None:
    for attempt in (lambda: cbcl.read(data), lambda: cbcl.read_all(data),
                    lambda: cbcl.parse(data, envelope_only=True), lambda: cbcl.parse(data)):
        with contextlib.suppress(CBCLError):
            attempt()


@given(st.binary(max_size=300))
@example(b"(" * 100_000)
@example(b'"\\u')
@example(b"(CBCL/1.0")
def test_arbitrary_bytes(data: bytes) -> None:
    _check(data)


@given(tokenish)
def test_token_soup(data: bytes) -> None:
    _check(data)


@given(st.data())
def test_mutated_messages(data: st.DataObject) -> None:
    buffer = bytearray(EXAMPLE)
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "delete", "insert", "truncate"]))
        index = data.draw(st.integers(0, max(0, len(buffer) - 1)))
        if op == "flip" and buffer:
            buffer[index] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "delete" and buffer:
            del buffer[index]
        elif op == "insert":
            buffer[index:index] = data.draw(_ALPHABET)
        else:
            del buffer[index:]
    _check(bytes(buffer))


def test_every_truncation_of_the_example() -> None:
    for end in range(len(EXAMPLE)):
        _check(EXAMPLE[:end])


@given(messages, st.integers(0, 10_000), st.binary(min_size=1, max_size=3))
def test_spliced_generated_messages(message: cbcl.Message, at: int, junk: bytes) -> None:
    text = cbcl.canonical(message).encode()
    at %= len(text) + 1
    _check(text[:at] + junk + text[at:])


@given(values, st.integers(1, 70), st.integers(1, 300), st.integers(1, 400))
def test_limits_never_change_the_kind_of_failure(value: cbcl.Value, depth: int, items: int,
                                                 nodes: int) -> None:
    limits = cbcl.Limits(max_depth=depth, max_list_items=items, max_nodes=nodes)
    text = cbcl.canonical(value)
    with contextlib.suppress(cbcl.LimitError):
        assert cbcl.read(text, limits=limits) == value
