"""Pass 2's lazily built stack automaton against the plain LALR driver it memoises.

Tests internals: the automaton, the kernel and pass 2 are private."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings, strategies as st
from strategies import mutate_tokens, values
from test_protocol import SHIPPED, _shared_registry as registry, generator

import cbcl
from cbcl import Symbol, Value
from cbcl.core._values import ATOM_TERMINALS
from cbcl.descriptor import Protocol
from cbcl.grammar import _kernel as kernel
from cbcl.grammar._automaton import ACCEPT, REFUSED, StackAutomaton
from cbcl.grammar._lalr import value_states
from cbcl.protocol._pass2 import (
    _recognise_c,
    recognise_body,
    recogniser_start,
    start_node,
    start_stack,
    walk_body,
)


def plain_recognise(protocol: Protocol, body: Any, intent: cbcl.Intent | None = None) -> bool:
    """The oracle: the kernel's LALR driver walking the tables directly, deciding each
    literal with ``Tables.can_shift`` (pass 2 as it was before the automaton), keeping
    the keyword sets' marks, from ``intent``'s start rule."""
    tables = protocol.tables
    whole = value_states(tables)
    stack = start_stack(protocol, intent)
    if not stack:
        return False
    marks: dict[int, int] = {}
    done = object()
    pending: list[Any] = [iter((body,))]
    while pending:
        item: Any = next(pending[-1], done)
        child = None
        if item is done:
            pending.pop()
            terminal = "RPAR" if pending else "$END"
        elif type(item) is tuple:
            terminal, child = "LPAR", item
        else:
            terminal = kernel.terminal_of(tables, stack, protocol.atoms.get(item),
                                          ATOM_TERMINALS[type(item)])
        result = kernel.feed(tables, stack, terminal, whole=whole, marks=marks)
        if result == kernel.REFUSED:
            return False
        if result == kernel.ACCEPTED:
            return True
        if result == kernel.WHOLE:
            kernel.take_value(tables, stack)  # the list is one value: not walked
        elif child is not None:
            pending.append(iter(child))
    raise AssertionError("unreachable")


@pytest.mark.parametrize("name", SHIPPED)
@pytest.mark.parametrize("max_nodes", [2, 5, 16384])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_the_automaton_decides_as_the_plain_driver(name: str, max_nodes: int,
                                                   data: st.DataObject,
                                                   tmp_path_factory: Any) -> None:
    strategy, protocol_id = generator(name)
    protocol = registry(tmp_path_factory).get(protocol_id)
    assert protocol is not None
    # Fresh automata, small enough to flush within one body at max_nodes 2 and 5: the
    # recogniser (the walk keeps the sets' masks) and the one whose nodes carry them.
    literals = literals_of(protocol)
    object.__setattr__(protocol, "automaton",
                       StackAutomaton(protocol.tables, literals, max_nodes=max_nodes))
    object.__setattr__(protocol, "recogniser", StackAutomaton(
        protocol.tables, literals, max_nodes=max_nodes, walker_masks=True))
    try:
        text = " ".join(mutate_tokens(data.draw(strategy).split(" "), data, rounds=3, ops=(
            "drop", "swap", "dup", "keyword-as-symbol"))) \
            if data.draw(st.booleans()) else data.draw(strategy)
        try:
            body = cbcl.read(text)
        except cbcl.CBCLError:
            body = data.draw(values)
        intent = protocol.descriptor.intents[0]  # the intent whose bodies are generated
        expected = plain_recognise(protocol, body, intent)
        assert recognise_body(protocol, body, intent) is expected
        assert recognise_body(protocol, body, intent) is expected  # again, remembered
        assert protocol.recogniser.size <= max_nodes
        # Both twins of the walk (recognise_body runs the C one where it is built).
        assert walk_body(protocol, body, recogniser_start(protocol, intent)) is expected
        assert protocol.recogniser.size <= max_nodes
        # The masks on the nodes decide alike.
        assert walk_body(protocol, body, start_node(protocol, intent),
                         protocol.automaton) is expected
        assert protocol.automaton.size <= max_nodes
    finally:
        object.__setattr__(protocol, "automaton", StackAutomaton(protocol.tables, literals))
        object.__setattr__(protocol, "recogniser", StackAutomaton(
            protocol.tables, literals, walker_masks=True))


def literals_of(protocol: Protocol) -> dict[str, str]:
    return protocol.automaton.literals


def test_a_known_shape_builds_no_new_stacks(tmp_path_factory: Any) -> None:
    protocol = registry(tmp_path_factory).get("contract-net/v1")
    assert protocol is not None
    automaton = StackAutomaton(protocol.tables, literals_of(protocol), walker_masks=True)
    original = protocol.recogniser
    object.__setattr__(protocol, "recogniser", automaton)
    try:
        assert recognise_body(protocol, cbcl.read(
            '(cfp :task (task :id "t-1" :action render) :deadline 5)'), cbcl.Intent.CFP)
        grown = automaton.size
        assert grown > 1
        # Other data, the same shape: every step is remembered.
        assert recognise_body(protocol, cbcl.read(
            '(cfp :task (task :id "other" :action paint) :deadline 99)'), cbcl.Intent.CFP)
        assert automaton.size == grown
        # A new shape (an optional field) adds stacks.
        assert recognise_body(protocol, cbcl.read(
            '(cfp :task (task :id "other" :action paint) :deadline 99 :round 2)'),
            cbcl.Intent.CFP)
        assert automaton.size > grown
    finally:
        object.__setattr__(protocol, "recogniser", original)


def test_transitions_are_remembered_per_stack_and_class(tmp_path_factory: Any) -> None:
    protocol = registry(tmp_path_factory).get("contract-net/v1")
    assert protocol is not None
    classes = protocol.atoms
    automaton = protocol.automaton
    start = start_node(protocol, cbcl.Intent.CFP)  # after the CFP start rule's terminal
    cfp = classes[cbcl.read("cfp")]  # the literal spelled by the symbol cfp
    node, whole = automaton.step(start, "LPAR")
    assert not whole and start["LPAR"] == (node, False)
    after = automaton.step(node, cfp)
    assert node[cfp] is after and after is not REFUSED
    assert automaton.stack(after)[:-1] == automaton.stack(node)
    # A literal where the grammar cannot shift it is data; STRING is refused after '('.
    assert automaton.step(node, "STRING") is REFUSED
    assert automaton.step(start, "RPAR") is REFUSED
    assert automaton.step(start, "$END") is REFUSED
    assert automaton.terminal(start, cfp) == "SYMBOL"
    assert automaton.terminal(node, cfp) == cfp


def test_end_is_accepted_only_after_a_whole_body(tmp_path_factory: Any) -> None:
    protocol = registry(tmp_path_factory).get("request/v1")
    assert protocol is not None
    automaton = protocol.automaton
    node = start_node(protocol, cbcl.Intent.AGREE)
    agree, action_id = protocol.atoms[cbcl.read("agree")], protocol.atoms[cbcl.read(":action-id")]
    for cls in ("LPAR", agree, action_id, "STRING", "RPAR"):  # (agree :action-id "a")
        assert automaton.step(automaton.start, "$END") is REFUSED
        found = automaton.step(node, cls)
        node = found[0] if cls == "LPAR" else found
        assert node is not REFUSED
    assert automaton.step(node, "$END") is ACCEPT
    assert recognise_body(protocol, cbcl.read('(agree :action-id "a")'), cbcl.Intent.AGREE)


def test_memory_stays_bounded_under_unseen_shapes(tmp_path_factory: Any) -> None:
    protocol = registry(tmp_path_factory).get("canon-a/v1")
    assert protocol is not None
    automaton = StackAutomaton(protocol.tables, literals_of(protocol), max_nodes=64,
                               walker_masks=True)
    original = protocol.recogniser
    object.__setattr__(protocol, "recogniser", automaton)
    try:
        for depth in range(1, 60):
            body: Value = (Symbol("x"),)
            for _ in range(depth):
                body = (body, Symbol("y"))
            assert recognise_body(protocol, body) is plain_recognise(protocol, body)
            assert automaton.size <= 64
    finally:
        object.__setattr__(protocol, "recogniser", original)


def test_max_nodes_must_hold_a_stack_and_its_successor(tmp_path_factory: Any) -> None:
    protocol = registry(tmp_path_factory).get("canon-a/v1")
    assert protocol is not None
    with pytest.raises(ValueError, match="max_nodes"):
        StackAutomaton(protocol.tables, {}, max_nodes=1)


def test_both_walks_refuse_what_is_no_cbcl_value(tmp_path_factory: Any) -> None:
    """A body of a type no terminal names (a list, None, a float) is refused, not raised
    on, by the Python walk and by its C twin alike."""
    _, protocol_id = generator(SHIPPED[0])
    protocol = registry(tmp_path_factory).get(protocol_id)
    assert protocol is not None
    node = recogniser_start(protocol, protocol.descriptor.intents[0])
    for body in ([Symbol("x")], None, 1.5, (Symbol("x"), [1]), (Symbol("x"), (None,))):
        assert walk_body(protocol, body, node) is False  # type: ignore[arg-type]  # on purpose
        if _recognise_c is not None:
            assert _recognise_c(body, node, protocol.atoms, ATOM_TERMINALS,
                                protocol.recogniser.step, REFUSED, ACCEPT) is False
