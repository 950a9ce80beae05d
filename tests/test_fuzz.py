"""The fuzz invariant: any input gives a result or a CBCLError, nothing else.

These are hypothesis properties that run in every test run; the long-running atheris
campaign lives beside the benchmarks (issue 8). The targets: the reader and the parser;
and the analyses of a descriptor (the comparison, every export, generated messages) fed
random and hostile descriptors.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hostile import hostile_twin
from hypothesis import HealthCheck, example, given, settings, strategies as st
from strategies import messages, values

import cbcl
from cbcl import URI, CBCLError, Encoder, Intent, Message, Registry, Symbol
from cbcl.core._canonical import canonical_value, canonical_value_python
from cbcl.core._limits import LLMLimits
from cbcl.descriptor import CompatLimits, diff_descriptors
from cbcl.json_mapping import to_json
from cbcl.llm import EXPORT_FORMATS, export_grammar, generate_messages

if TYPE_CHECKING:  # (mypy checks tests/fuzz/ too, and finds the module there)
    import fuzz_cbcl
else:
    _spec = importlib.util.spec_from_file_location(
        "fuzz_cbcl", Path(__file__).parent / "fuzz" / "fuzz_cbcl.py")
    assert _spec is not None and _spec.loader is not None
    fuzz_cbcl = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(fuzz_cbcl)

EXAMPLE = (Path(__file__).parent.parent / "descriptors" / "examples"
           / "task-assignment-v1.cbcl").read_bytes()
CONTRACT_NET = (Path(__file__).parent.parent / "descriptors" / "contract-net-v1.cbcl").read_bytes()

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


# --------------------------------------------------------------------------- descriptors
# The analyses of a descriptor (issue 29): the comparison and every export, fed random and
# hostile descriptors — grammars with groups, repetitions, keyword sets, lists opened in
# one rule and closed in another, chains; schemas with ranges at the decimal limits,
# one-of lists, nested types — and mutations of a shipped one. Each gives a result or a
# CBCLError, under small budgets so that each example is quick.

def _first_each(entries: list[Any]) -> list[Any]:
    """The entries whose first element no earlier entry has (a map, not ``unique_by``:
    hypothesis writes the whole element strategy out when a filter retries)."""
    first: dict[Any, Any] = {}
    for entry in entries:
        first.setdefault(entry[0], entry)
    return list(first.values())


_RULES = ("body", "r1", "r2", "r3")
_LITERALS = ('"a"', '"b"', '":k"', '":m"', '"("', '")"', '"true"')
_BASE = ("SYMBOL", "STRING", "INTEGER", "DECIMAL", "NUMBER", "KEYWORD", "URI", "value")
_items = st.recursive(
    st.sampled_from(_LITERALS + _BASE + _RULES[1:]),
    lambda inner: st.one_of(
        st.lists(inner, min_size=1, max_size=3).map(lambda xs: "(" + " ".join(xs) + ")"),
        st.lists(inner, min_size=1, max_size=3).map(lambda xs: "[" + " ".join(xs) + "]"),
        st.tuples(inner, inner).map(lambda xs: f"({xs[0]} | {xs[1]})"),
        st.tuples(inner, st.sampled_from("*+?")).map(lambda x: x[0] + x[1]),
        st.lists(inner, min_size=1, max_size=3).map(lambda xs: '"(" "h" ' + " ".join(xs)
                                                     + ' ")"'),
        st.lists(st.tuples(st.sampled_from((":a", ":b", ":c", ":d")), inner,
                           st.booleans()), min_size=1, max_size=3)
        .map(lambda ms: "(" + " & ".join(f'["{k}" {x}]' if opt else f'"{k}" {x}'
                                         for k, x, opt in _first_each(ms)) + ")"),
    ),
    max_leaves=12,
)
_alternatives = st.lists(st.lists(_items, max_size=4).map(" ".join), min_size=1, max_size=3)
_NUMBERS = ("0", "-1", "9223372036854775807", "-9223372036854775808", "1.5", "-0.5",
            "1000000000000000000000000000.0", "99999999999999999999999999999999999999.9",
            "-9999999999999999999999999999999999999.9",
            "1.00000000000000000000000000000000000001")
_types = st.recursive(
    st.one_of(
        st.sampled_from(("integer", "decimal", "number", "string", "symbol", "keyword",
                         "uri", "boolean", "any")),
        st.tuples(st.sampled_from(("integer", "number", "decimal")),
                  st.sampled_from(_NUMBERS), st.sampled_from(_NUMBERS))
        .map(lambda t: f"({t[0]} :min {t[1]} :max {t[2]})"),
        st.tuples(st.sampled_from(("string", "symbol")), st.integers(0, 70_000),
                  st.integers(0, 70_000))
        .map(lambda t: f"({t[0]} :min-length {min(t[1:])} :max-length {max(t[1:])})"),
        st.lists(st.sampled_from((*_NUMBERS, "a", "b", ":k", '"s"', "agent://x")),
                 min_size=1, max_size=6, unique=True)
        .map(lambda vs: f"(one-of {' '.join(vs)})"),
    ),
    lambda inner: st.one_of(
        inner.map(lambda t: f"(list-of {t})"),
        st.lists(st.tuples(st.sampled_from((":a", ":b", ":k", ":m")), inner, st.booleans()),
                 max_size=3)
        .map(lambda fs: "(keys " + " ".join(f"({k} {t}{' required' if r else ''})"
                                            for k, t, r in _first_each(fs)) + ")"),
    ),
    max_leaves=6,
)
_records = st.lists(
    st.tuples(st.sampled_from(("h", "a", "b")),
              st.lists(st.tuples(st.sampled_from((":a", ":b", ":k", ":m")), _types,
                                 st.booleans()), max_size=3).map(_first_each),
              st.booleans()),
    max_size=3).map(_first_each)


@st.composite
def hostile_descriptors(draw: st.DrawFn) -> tuple[str, int, str, int]:
    """A descriptor as its parts (kept short for hypothesis to show: :func:`_built` writes
    it): random rules (references only to rules it defines), the length of a chain of
    rules ``r1`` starts instead (up to 300), maybe a random schema, and a version."""
    rules = "\n".join(f"{name}: " + " | ".join(draw(_alternatives)) for name in _RULES)
    records = draw(_records)
    schema = "(schema " + " ".join(
        f"(record {head} " + " ".join(f"({k} {t}{' required' if r else ''})"
                                      for k, t, r in fields)
        + (" (else any)" if other else "") + ")" for head, fields, other in records) + ")"
    return rules, draw(st.integers(0, 300)), schema if records else "", draw(st.integers(1, 3))


def _built(parts: tuple[str, int, str, int]) -> bytes:
    """The descriptor text of :func:`hostile_descriptors`' parts."""
    rules, chain, schema, version = parts
    lines = rules.split("\n")
    if chain:
        lines[1] = 'r1: "(" "c" c0 ")"'
        lines += [f'c{i}: "x" c{i + 1} | "y"' for i in range(chain)] + [f'c{chain}: "z"']
    grammar = "\n".join(lines) + "\n"
    return (f"(protocol-descriptor (id f/v1) (version {version}) (intents REQUEST INFORM) "
            f"(grammar {cbcl.canonical(grammar)})" + (f" {schema}" if schema else "")
            + ")").encode()


_SMALL_COMPAT = CompatLimits(max_states=400, max_steps=20_000, max_nfa_states=4_000,
                             search_bodies=10, max_witness_nodes=500)
_SMALL_LLM = LLMLimits(max_rules=2_000, max_steps=50_000, max_output_bytes=1 << 20,
                       max_draft_tokens=500, max_draw_tokens=5_000, max_drafts=20)


def _analyses(old: bytes, new: bytes) -> None:
    """Every analysis of the pair: a result or a CBCLError, nothing else."""
    with contextlib.suppress(CBCLError):  # (full: both directions)
        report = diff_descriptors(old, new, mode="full", limits=_SMALL_COMPAT)
        assert report.verdict in ("compatible", "breaking", "unknown")
        report.render()
    for fmt in EXPORT_FORMATS:
        for schema in (True, False):
            with contextlib.suppress(CBCLError):
                export_grammar(new, fmt, schema=schema, limits=_SMALL_LLM)
    with contextlib.suppress(CBCLError):
        generate_messages(new, 2, limits=_SMALL_LLM)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_descriptors(), hostile_descriptors())
@example(*(2 * (('body: "(" "a" ":x" NUMBER ")"\nr1: "b"\nr2: "b"\nr3: "b"', 0,
                 "(schema (record a (:x (number :min 0 :max "
                 "1000000000000000000000000000.0))))", 1),)))
def test_analyses_of_hostile_descriptors(old: tuple[str, int, str, int],
                                         new: tuple[str, int, str, int]) -> None:
    _analyses(_built(old), _built(new))
    _analyses(_built(old), _built(old))


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_analyses_of_mutated_descriptors(data: st.DataObject) -> None:
    buffer = bytearray(CONTRACT_NET)
    for _ in range(data.draw(st.integers(1, 4))):
        index = data.draw(st.integers(0, len(buffer) - 1))
        buffer[index] = data.draw(st.sampled_from(b'()"\\ :|*+?[]&0189.-axyINTEGR'))
    _analyses(CONTRACT_NET, bytes(buffer))


def test_the_atheris_targets_of_the_analyses_take_their_seeds() -> None:
    # tests/fuzz/fuzz_cbcl.py's ``diff`` and ``export`` targets, on their seed corpus.
    checks = fuzz_cbcl._setup()
    corpus = Path(__file__).parent / "fuzz" / "corpus"
    for target in ("diff", "export"):
        seeds = sorted((corpus / target).iterdir())
        assert seeds, target
        for seed in seeds:
            checks[target](seed.read_bytes())


# --------------------------------------------------------------------------- hostile values
# The writers under the fuzz invariant with values from a program (issue 29; spec §1.2,
# "Values from a program are data, never code"): each value's hostile twin (tests/hostile.py:
# its atoms and lists made subclasses whose methods lie or raise, or members of enums of
# them, storing the same data) is written exactly as the value is - text, frame, JSON,
# conversion, or the same error -, and tests/fuzz/fuzz_encoders.py's check (C twins against
# Python twins, and each input's hostile twins) holds on hypothesis's bytes.

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
