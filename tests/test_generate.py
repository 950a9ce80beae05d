"""The seeded body and message generator (cbcl/llm/_generate.py): deterministic, and everything
it makes is accepted by ``cbcl.parse`` (both passes and the schema)."""

from __future__ import annotations

from pathlib import Path

import pytest

import cbcl
from cbcl.conversation import check_schema, compile_schema
from cbcl.descriptor import read_descriptor
from cbcl.llm import generate_bodies, generate_messages
from cbcl.llm._generate import _MAX_TOKENS

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted(p for p in (ROOT / "descriptors").glob("*.cbcl")
                 if not p.name.endswith(".signed.cbcl"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_message_parses(path: Path) -> None:
    data = path.read_bytes()
    registry = cbcl.Registry(disk_cache=False, isolate=False)
    registry.load(data, allow_unsigned=True)
    descriptor = read_descriptor(data)
    messages = generate_messages(data, 150, seed=3)
    assert {m.intent for m in messages} == set(descriptor.intents)
    for message in messages:
        text = message.canonical()
        try:
            assert cbcl.parse(text, registry=registry).canonical() == text
        except cbcl.ConstraintError:  # (the generator follows the grammar and the schema,
            assert descriptor.constraints is not None  # not a descriptor's constraints)
            with pytest.raises(cbcl.ConstraintError):
                cbcl.validate(message, registry=registry)
            continue
        cbcl.validate(message, registry=registry)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_bodies_per_intent_satisfy_the_schema(path: Path) -> None:
    data = path.read_bytes()
    descriptor = read_descriptor(data)
    for intent in descriptor.intents:
        bodies = generate_bodies(descriptor, intent, 40, seed=9)
        assert len(bodies) == 40
        if descriptor.schema is not None:
            schema = compile_schema(descriptor.schema)
            for body in bodies:
                check_schema(schema, body)


def test_deterministic_and_varied() -> None:
    data = (ROOT / "descriptors" / "contract-net-v1.cbcl").read_bytes()
    first = generate_bodies(data, "CFP", 30, seed=1)
    assert first == generate_bodies(data, "CFP", 30, seed=1)
    assert first != generate_bodies(data, "CFP", 30, seed=2)
    assert len({cbcl.canonical(b) for b in first}) > 20
    orders = set()
    for b in first:
        assert isinstance(b, tuple)  # a CFP body is a list
        orders.add(tuple(str(x) for x in b if isinstance(x, cbcl.Keyword)))
    assert len(orders) > 3  # keyword sets come in several orders
    unchecked = generate_bodies(data, "CFP", 5, seed=1, schema=False, max_depth=1)
    assert len(unchecked) == 5


def test_errors() -> None:
    data = (ROOT / "descriptors" / "request-v1.cbcl").read_bytes()
    with pytest.raises(cbcl.ProtocolError):
        generate_bodies(data, "CFP", 1)
    with pytest.raises(ValueError):
        generate_bodies(data, "BOGUS", 1)
    with pytest.raises(ValueError):
        generate_bodies(data, "AGREE", -1)
    with pytest.raises(ValueError):
        generate_bodies(data, "AGREE", 1, max_depth=0)
    assert generate_bodies(data, "AGREE", 0) == []


def _descriptor(grammar: str) -> bytes:
    return (f"(protocol-descriptor (id t/v1) (version 1) (intents INFORM) "
            f"(grammar {cbcl.canonical(grammar)}))").encode()


def _atoms(value: cbcl.Value) -> int:
    return sum(map(_atoms, value)) if isinstance(value, tuple) else 1


def test_recursion_without_lists_ends() -> None:
    # Eight references a level, with no list between them: the walk used to run into
    # RecursionError here; past 4 * max_depth open rules or _MAX_TOKENS tokens it is shallow.
    data = _descriptor('body: "(" "a" x ")"\nx: x x x x x x x x | SYMBOL\n')
    bodies = generate_bodies(data, "INFORM", 20, seed=1, schema=False)
    assert len(bodies) == 20
    assert max(_atoms(b) for b in bodies) < 2 * _MAX_TOKENS
    critical = _descriptor('body: "(" "a" x ")"\nx: "a" x x | "b"\n')
    assert len(generate_bodies(critical, "INFORM", 200, seed=2, schema=False)) == 200


def test_a_start_rule_that_gives_no_single_value() -> None:
    data = _descriptor("body: SYMBOL SYMBOL\n")
    with pytest.raises(ValueError, match="no single value in 200 draws"):
        generate_bodies(data, "INFORM", 1, schema=False)
    mixed = _descriptor("body: SYMBOL | SYMBOL SYMBOL\n")  # such draws are drawn again
    assert all(type(b) is cbcl.Symbol
               for b in generate_bodies(mixed, "INFORM", 20, schema=False))


def test_a_parenthesis_that_closes_no_list_is_not_a_body() -> None:
    # A ')' before any '(' made the walk pop an empty stack (IndexError, found by fuzzing).
    data = _descriptor('body: "a" | ")" "b"\n')
    assert set(generate_bodies(data, "INFORM", 30, seed=4, schema=False)) == {cbcl.Symbol("a")}


def test_integers_for_a_range_beyond_int64_stay_within_it() -> None:
    # (number :max 1e27): the walk drew 10^27 as an INTEGER, which no message can hold
    # (ValueError from Message, found by fuzzing).
    data = (b'(protocol-descriptor (id t/v1) (version 1) (intents INFORM) (grammar '
            + cbcl.canonical('body: "(" "a" ":x" NUMBER ")"\n').encode()
            + b') (schema (record a (:x (number :min 9223372036854775000 '
            b':max 1000000000000000000000000000.0) required))))')
    registry = cbcl.Registry(disk_cache=False, isolate=False)
    registry.load(data, allow_unsigned=True)
    for message in generate_messages(data, 40, seed=5):
        assert cbcl.parse(message.canonical(), registry=registry) == message
