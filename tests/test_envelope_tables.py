"""The envelope's LALR(1) tables ship generated (cbcl/protocol/_envelope_tables.py), so pass
1's first refusal in a process builds nothing (issue 30 item 6): they must be the tables lark
builds from cbcl/grammars/envelope.lark, and the renumbering that makes them reproducible
must not depend on the numbers lark happened to choose. (Internals: the generated module
and Tables.renumbered.)"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, strategies as st

import cbcl
from cbcl.grammar._lalr import Tables
from cbcl.protocol import _envelope
from cbcl.protocol._envelope import build_envelope_tables, envelope_tables

REFUSED = ('(CBCL/1.0 (message-id "m") (sender agent://a) (receiver agent://b) '
           "(intent INFORM) (protocol request/v1) (bodyx 1))")


def test_the_shipped_tables_are_the_grammars() -> None:
    assert envelope_tables() == build_envelope_tables().renumbered(), (
        "cbcl/grammars/envelope.lark and cbcl/protocol/_envelope_tables.py differ: run "
        "python tools/generate_envelope_tables.py")


def shuffled(tables: Tables, seed: int) -> Tables:
    """The same automaton under other state and rule numbers (as another lark build)."""
    rng = random.Random(seed)
    states = list(range(len(tables.actions)))
    rng.shuffle(states)  # old state -> new state
    rules = list(range(len(tables.rules)))
    rng.shuffle(rules)  # old rule -> new rule
    actions: list[dict[str, int]] = [{} for _ in states]
    for old, row in enumerate(tables.actions):
        items = list(row.items())
        rng.shuffle(items)
        actions[states[old]] = {symbol: states[action] if action >= 0 else ~rules[~action]
                                for symbol, action in items}
    new_rules = [tables.rules[0]] * len(rules)
    for old, new in enumerate(rules):
        new_rules[new] = tables.rules[old]
    return Tables(tuple(actions), tuple(new_rules), states[tables.start_state],
                  states[tables.end_state])


@given(st.integers(0, 2**32))
def test_renumbering_forgets_the_numbers_lark_chose(seed: int) -> None:
    tables = envelope_tables()
    other = shuffled(tables, seed)
    assert other != tables
    assert other.renumbered() == tables.renumbered() == tables


def test_renumbering_refuses_unreachable_states() -> None:
    tables = envelope_tables()
    orphan = Tables((*tables.actions, {"LPAR": 0}), tables.rules, tables.start_state,
                    tables.end_state)
    with pytest.raises(ValueError, match="does not reach"):
        orphan.renumbered()


def test_the_first_refusal_builds_no_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_lark(*args: object, **kwargs: object) -> object:
        raise AssertionError("the envelope's tables were built at run time")

    monkeypatch.setattr(_envelope, "build_lark", no_lark)
    monkeypatch.setattr(Tables, "from_lark", no_lark)
    envelope_tables.cache_clear()
    try:
        with pytest.raises(cbcl.EnvelopeError, match="found symbol bodyx") as refused:
            cbcl.parse(REFUSED)
        assert refused.value.expected and "(body …)" in refused.value.expected
    finally:
        envelope_tables.cache_clear()
