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


# --------------------------------------------------------------------------- hostile values
# The writers under the fuzz invariant with values from a program (issue 29; spec §1.2,
# "Values from a program are data, never code"): each value's hostile twin (tests/hostile.py:
# its atoms and lists made subclasses whose methods lie or raise, or members of enums of
# them, storing the same data) is written exactly as the value is - text, frame, JSON,
# conversion, or the same error -, and tests/fuzz/fuzz_encoders.py's check (C twins against
# Python twins, and each input's hostile twins) holds on hypothesis's bytes. (Imports here:
# this block is appended to a file others append to.)

import importlib.util  # noqa: E402
import os  # noqa: E402
from decimal import Decimal  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from hostile import hostile_twin  # noqa: E402

from cbcl import URI, Encoder, Intent, Message, Registry, Symbol  # noqa: E402
from cbcl.core._canonical import canonical_value, canonical_value_python  # noqa: E402
from cbcl.json_mapping import to_json  # noqa: E402

_FUZZ = Path(__file__).parent / "fuzz"
_REGISTRY = Registry(disk_cache=False, isolate=False)
for _name in ("request-v1", "contract-net-v1"):
    _REGISTRY.load((Path(__file__).parent.parent / "descriptors" / f"{_name}.cbcl")
                   .read_bytes(), allow_unsigned=True)
_ENCODERS = (Encoder(_REGISTRY, validate=False),
             Encoder(_REGISTRY, validate=False, pure_python=True))
_odd_atoms = st.sampled_from([2**63, -(2**63) - 1, Decimal("NaN"), Decimal("1E+99"), "\ud800",
                              1.5, None, True, b"x", Intent.PROPOSE])
_wild_values = st.recursive(
    st.one_of(values, _odd_atoms),
    lambda children: st.lists(children, max_size=5).map(tuple) | st.lists(children, max_size=5),
    max_leaves=30)


def _result(write: Any, value: Any) -> Any:
    """``write(value)``, or the type and text of the exception it raised: never one that
    is not a typed refusal (TypeError, ValueError, CBCLError), whatever the value's code."""
    try:
        return write(value)
    except (TypeError, ValueError, CBCLError) as exc:
        return (type(exc), str(exc))


def _body_message(body: Any) -> Message:
    return Message._trusted("m", URI("agent://a"), URI("agent://b"), Intent.REQUEST,
                            Symbol("request/v1"), None, None, None, None, body, None)


_HOSTILE_WRITERS = {
    "canonical_value": canonical_value,
    "canonical_value_python": canonical_value_python,
    "to_json": to_json,
    "as_value": lambda value: canonical_value(cbcl.as_value(value)),
    "Message": lambda value: Message(
        message_id="m", sender="agent://a", receiver="agent://b", intent="REQUEST",
        protocol="request/v1", body=value).canonical(),
    "frame (C)": lambda value: _ENCODERS[0].encode(_body_message(value)),
    "frame (Python)": lambda value: _ENCODERS[1].encode(_body_message(value)),
}


@given(_wild_values, st.binary(min_size=1, max_size=24))
def test_a_hostile_twin_is_written_as_its_value(value: Any, seed: bytes) -> None:
    twin = hostile_twin(value, seed)
    for name, write in _HOSTILE_WRITERS.items():
        assert _result(write, twin) == _result(write, value), name


def _encoders_harness() -> Any:
    spec = importlib.util.spec_from_file_location("fuzz_encoders", _FUZZ / "fuzz_encoders.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _native_built() -> bool:
    try:
        import cbcl._native  # noqa: F401
    except ImportError:
        if os.environ.get("CBCL_REQUIRE_SPEEDUPS"):
            raise
        return False
    return True


_needs_native = pytest.mark.skipif(not _native_built(), reason="cbcl._native is not built")


@_needs_native
@given(st.binary(max_size=200))
def test_the_encoders_harness_holds_on_any_bytes(data: bytes) -> None:
    _ENCODERS_CHECK(data)


@_needs_native
def test_the_encoders_harness_runs_on_its_corpus_and_random_inputs() -> None:
    """tests/fuzz/fuzz_encoders.py's own check (hostile twins included) on its seeds and
    400 random and mutated inputs."""
    harness = _encoders_harness()
    assert harness.main([str(_FUZZ / "fuzz_encoders.py"), "--random", "400"]) == 0


_ENCODERS_CHECK: Any = _encoders_harness()._setup() if _native_built() else None
