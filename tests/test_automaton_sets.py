"""Keyword sets in pass 2's recogniser (``StackAutomaton(walker_masks=True)``): the walks keep
the sets' masks, the nodes do not, so a set's members share their nodes in any order.

Held against the kernel's plain driver, the automaton whose nodes carry the masks (the
refusal search's), the C walk, the binary decoder's walks (C and Python) and a model of
what a set means: lark's LALR parser of the grammar's BNF, where a set is
``S -> ε | S ":k" X | …`` (any members, any number of times), and on top of it each member
at most once and every required one given, which the kernel's driver keeps.

Tests internals: the automaton and pass 2's walks are private."""

from __future__ import annotations

import random
from typing import Any

import lark
import pytest
from hypothesis import assume, event, given, settings, strategies as st
from test_automaton import plain_recognise
from test_subset import TokenListLexer

import cbcl
from cbcl import GrammarError, Registry
from cbcl.core._values import ATOM_TERMINALS
from cbcl.descriptor import Protocol
from cbcl.grammar._automaton import (
    ACCEPT,
    REFUSED,
    SET_CLOSE,
    SET_MEMBER,
    SET_OPEN,
    StackAutomaton,
    apply_set_ops,
    set_op,
)
from cbcl.grammar._subset import read_grammar, to_lark
from cbcl.protocol._pass2 import (
    _recognise_c,
    recognise_body,
    recogniser_start,
    start_node,
    walk_body,
)

#: A member's value: its grammar, the rules it needs, and a body text of it.
VALUES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "INTEGER": ("INTEGER", "", ("7", "-3")),
    "STRING": ("STRING", "", ('"s"', '""')),
    "SYMBOL": ("SYMBOL", "", ("x", "yz")),
    "NUMBER": ("NUMBER", "", ("1.5", "2")),
    "value": ("value", "", ("(a (b) 1)", "5", ":kw")),
    "item": ("item", 'item: "(" "it" INTEGER* ")"\n', ("(it)", "(it 1 2 3)")),
    "inner": ("inner", 'inner: "(" "in" (":x" INTEGER & [":y" STRING]) ")"\n',
              ('(in :x 1)', '(in :y "a" :x 2)')),
}

_REGISTRIES: dict[str, Registry | None] = {}
_LARKS: dict[str, lark.Lark] = {}


def _lark_accepts(grammar: str, protocol: Protocol, body: Any) -> bool:
    """Whether lark's LALR parser of ``grammar``'s BNF takes ``body``'s tokens (an atom
    that spells a literal is that literal: the bodies here write one as data only where
    no literal could be shifted, so both readings are refused there)."""
    parser = _LARKS.get(grammar)
    if parser is None:
        generated = to_lark(read_grammar(grammar))
        parser = _LARKS[grammar] = lark.Lark(generated.text, lexer=TokenListLexer,
                                             start=generated.start, parser="lalr")
    tokens: list[tuple[str, str]] = []
    pending = [body]
    while pending:
        item = pending.pop()
        if type(item) is tuple:
            pending.append(_CLOSE)
            pending.extend(reversed(item))
            tokens.append(("LPAR", "("))
        elif item is _CLOSE:
            tokens.append(("RPAR", ")"))
        else:
            terminal = protocol.atoms.get(item) or ATOM_TERMINALS[type(item)]
            tokens.append((terminal, cbcl.canonical(item)))
    try:
        parser.parse(tokens)
    except lark.exceptions.LarkError:
        return False
    return True


_CLOSE = object()


def _grammar(members: list[tuple[str, bool]]) -> str:
    parts = [f'[":k{i}" {VALUES[kind][0]}]' if optional else f'":k{i}" {VALUES[kind][0]}'
             for i, (kind, optional) in enumerate(members)]
    rules = "".join(sorted({VALUES[kind][1] for kind, _ in members}))
    return 'body: "(" "r" (' + " & ".join(parts) + ') ")"\n' + rules


def _registry(grammar: str) -> Registry | None:
    """A registry holding sets/v1 of ``grammar`` (loaded once; ``None`` if the checker
    refuses the grammar)."""
    if grammar not in _REGISTRIES:
        registry: Registry | None = Registry(disk_cache=False, isolate=False)
        payload = (f"(protocol-descriptor (id sets/v1) (version 1) (intents REQUEST) "
                   f"(grammar {cbcl.canonical(grammar)}))").encode()
        try:
            registry.load(payload, allow_unsigned=True)  # type: ignore[union-attr]
        except GrammarError:
            registry = None
        _REGISTRIES[grammar] = registry
    return _REGISTRIES[grammar]


members_strategy = st.lists(st.tuples(st.sampled_from(sorted(VALUES)), st.booleans()),
                            min_size=2, max_size=7)


@settings(max_examples=150, deadline=None)
@given(members=members_strategy, data=st.data())
def test_every_walk_keeps_random_sets_as_the_kernel_does(members: list[tuple[str, bool]],
                                                         data: st.DataObject) -> None:
    registry = _registry(_grammar(members))
    assume(registry is not None)
    assert registry is not None
    protocol = registry.get("sets/v1")
    assert protocol is not None
    # Each member 0, 1 or 2 times (2: a duplicate), in any order.
    given_members = [i for i in range(len(members))
                     for _ in range(data.draw(st.sampled_from([0, 1, 1, 1, 2])))]
    order = data.draw(st.permutations(given_members))
    # Now and then a member's value of another member's kind (lark may refuse it; not for
    # a `value` member, which takes any, its literals as data: lark's tokens would not).
    kinds = [data.draw(st.sampled_from(sorted(VALUES)))
             if members[i][0] != "value" and data.draw(st.integers(0, 7)) == 0
             else members[i][0] for i in order]
    text = "(r " + " ".join(f":k{i} {data.draw(st.sampled_from(VALUES[kind][2]))}"
                            for i, kind in zip(order, kinds, strict=True)) + ")"
    body = cbcl.read(text)
    required = {i for i, (_, optional) in enumerate(members) if not optional}
    grammar = _grammar(members)
    by_lark = _lark_accepts(grammar, protocol, body)
    once, complete = len(set(order)) == len(order), required <= set(order)
    event(f"lark {'takes' if by_lark else 'refuses'}, members once: {once}, "
          f"required given: {complete}")
    model = by_lark and once and complete
    intent = cbcl.Intent.REQUEST
    assert plain_recognise(protocol, body, intent) is model
    max_nodes = data.draw(st.sampled_from([2, 3, 16384]))
    original, recogniser = protocol.automaton, protocol.recogniser
    object.__setattr__(protocol, "recogniser", StackAutomaton(
        protocol.tables, original.literals, max_nodes=max_nodes, walker_masks=True))
    object.__setattr__(protocol, "automaton", StackAutomaton(
        protocol.tables, original.literals, max_nodes=max_nodes))
    try:
        for _ in range(2):  # built, then remembered
            assert recognise_body(protocol, body, intent) is model  # C where built
            assert walk_body(protocol, body, recogniser_start(protocol, intent)) is model
            assert walk_body(protocol, body, start_node(protocol, intent),
                             protocol.automaton) is model
            if _recognise_c is not None:
                assert _recognise_c(body, recogniser_start(protocol, intent), protocol.atoms,
                                    ATOM_TERMINALS, protocol.recogniser.step, REFUSED,
                                    ACCEPT) is model
        assert protocol.recogniser.size <= max_nodes
    finally:
        object.__setattr__(protocol, "automaton", original)
        object.__setattr__(protocol, "recogniser", recogniser)
    # The binary decoder's walks (C and Python) decide alike.
    message = (f'(CBCL/1.0 (message-id "m") (sender agent://a) (receiver agent://b) '
               f"(intent REQUEST) (protocol sets/v1) (body {text}))")
    frame = cbcl.Encoder(registry, validate=False).encode(
        cbcl.parse(message, envelope_only=True))
    for decoder in (cbcl.Decoder(registry), cbcl.Decoder(registry, pure_python=True)):
        try:
            decoder.decode(frame)
        except cbcl.BodyError:
            assert not model
        else:
            assert model



# --------------------------------------------------------------------------- the bound

ROW_KINDS = ["STRING", "INTEGER", "NUMBER", "SYMBOL", "item", "STRING", "inner", "value",
             "INTEGER", "STRING"]


def _row_protocol() -> tuple[Registry, Protocol]:
    """A table of rows, each a keyword set of ten members (the last three optional)."""
    parts = [f'[":k{i}" {VALUES[kind][0]}]' if i >= 7 else f'":k{i}" {VALUES[kind][0]}'
             for i, kind in enumerate(ROW_KINDS)]
    rules = "".join(sorted({VALUES[kind][1] for kind in ROW_KINDS}))
    grammar = ('body: "(" "t" row* ")"\nrow: "(" "row" (' + " & ".join(parts) + ') ")"\n'
               + rules)
    registry = _registry(grammar)
    assert registry is not None
    protocol = registry.get("sets/v1")
    assert protocol is not None
    return registry, protocol


def _table(orders: list[list[int]], rng: random.Random) -> Any:
    rows = " ".join("(row " + " ".join(f":k{i} {rng.choice(VALUES[ROW_KINDS[i]][2])}"
                                       for i in order) + ")" for order in orders)
    return cbcl.read(f"(t {rows})")


def _one_order() -> Any:
    """Rows with the members in one order, each sample value of each member once."""
    most = max(len(samples) for _, _, samples in VALUES.values())
    return cbcl.read("(t " + " ".join(
        "(row " + " ".join(f":k{i} {VALUES[kind][2][j % len(VALUES[kind][2])]}"
                           for i, kind in enumerate(ROW_KINDS)) + ")"
        for j in range(most)) + ")")


def test_any_member_order_shares_the_nodes_of_one_order() -> None:
    """Rows of a ten-member set in thousands of random orders (2^10 masks) need the nodes
    of one order: the recogniser's nodes carry no masks, so its size is that of the
    stacks, and it never flushes. The automaton whose nodes carry the masks grows per
    mask (what pass 2 walked on before)."""
    _, protocol = _row_protocol()
    rng = random.Random(33)
    recogniser = StackAutomaton(protocol.tables, protocol.automaton.literals,
                                walker_masks=True)
    masked = StackAutomaton(protocol.tables, protocol.automaton.literals)
    fixed = _one_order()
    start = recogniser.start
    intent = cbcl.Intent.REQUEST
    assert walk_body(protocol, fixed, recogniser.start, recogniser)
    one_order = recogniser.size
    orders = []
    for _ in range(3000):
        order = list(range(10))
        rng.shuffle(order)
        orders.append(order[:rng.randint(7, 10)] if set(order[:7]) >= set(range(7))
                      else order)
    for at in range(0, len(orders), 50):
        body = _table(orders[at:at + 50], rng)
        assert walk_body(protocol, body, recogniser.start, recogniser)
    assert plain_recognise(protocol, body, intent)
    assert recogniser.start is start  # never flushed
    # The same stacks as one order: a member's nodes whatever came before it.
    assert recogniser.size == one_order < 200
    # Refusals too (a member twice, a required one missing) build no new stacks.
    assert not walk_body(protocol, _table([[0, 1, 2, 3, 4, 5, 6, 0]], rng), recogniser.start,
                         recogniser)
    assert not walk_body(protocol, _table([[0, 1, 2, 3, 4, 5]], rng), recogniser.start,
                         recogniser)
    assert recogniser.size == one_order
    # The nodes that carry the masks: a copy of the members' stacks per mask.
    for at in range(0, 200, 50):
        assert walk_body(protocol, _table(orders[at:at + 50], rng), masked.start, masked)
    assert masked.size > 10 * one_order


def test_the_c_walk_keeps_the_bound_too() -> None:
    """recognise_body (the C walk where it is built) over the same orders: no new stacks
    past one order's."""
    _, protocol = _row_protocol()
    rng = random.Random(7)
    intent = cbcl.Intent.REQUEST
    recogniser = StackAutomaton(protocol.tables, protocol.automaton.literals,
                                walker_masks=True)
    original = protocol.recogniser
    object.__setattr__(protocol, "recogniser", recogniser)
    try:
        assert recognise_body(protocol, _one_order(), intent)
        one_order = recogniser.size
        start = recogniser.start
        for _ in range(40):
            orders = [rng.sample(range(10), 10) for _ in range(25)]
            assert recognise_body(protocol, _table(orders, rng), intent)
        assert recogniser.start is start  # never flushed
        assert recogniser.size == one_order
    finally:
        object.__setattr__(protocol, "recogniser", original)


# --------------------------------------------------------------------------- the operations


def test_set_operations_refuse_as_the_kernel_does() -> None:
    frames: list[int] = []
    member = [set_op(SET_MEMBER, 1 << i) for i in range(3)]
    assert apply_set_ops(frames, (set_op(SET_OPEN), member[1], member[0])) and frames == [3]
    assert not apply_set_ops(list(frames), (member[1],))  # given twice
    assert apply_set_ops(list(frames), (set_op(SET_CLOSE, 3),))  # required given
    assert not apply_set_ops(list(frames), (set_op(SET_CLOSE, 4),))  # one missing
    # A set inside another keeps its own mask; closing it returns to the outer one.
    assert apply_set_ops(frames, (set_op(SET_OPEN), member[1], set_op(SET_CLOSE, 2),
                                  member[2])) and frames == [7]
    with pytest.raises(ValueError, match="no set under way"):
        apply_set_ops([], (member[0],))


def test_transitions_at_a_set_say_what_the_walker_checks() -> None:
    _, protocol = _row_protocol()
    automaton = StackAutomaton(protocol.tables, protocol.automaton.literals,
                               walker_masks=True)
    key = protocol.atoms[cbcl.read(":k3")]
    node = automaton.start
    for cls in ("LPAR", protocol.atoms[cbcl.read("t")], "LPAR",
                protocol.atoms[cbcl.read("row")]):
        found = automaton.step(node, cls)
        node = found[0] if cls == "LPAR" else found
        assert isinstance(node, dict)
    # The first member: the set starts (S -> ε), then member 3 is given.
    after, ops = automaton.step(node, key)
    assert ops == (set_op(SET_OPEN), set_op(SET_MEMBER, 1 << 3))
    assert automaton.stack(after)[:-1] != automaton.stack(node)
    # ')' right away: the set starts and ends without its seven required members.
    end, ops = automaton.step(node, "RPAR")
    assert ops == (set_op(SET_OPEN), set_op(SET_CLOSE, (1 << 7) - 1))
    assert not StackAutomaton.marks(end)  # no node carries a mask
