"""Keyword sets, per-intent start rules and NUMBER (spec/cbcl-1.0.md §4), end to end:
the subset reader, the checker, the kernel, the stack automaton and pass 2.

Tests internals too: the subset reader, the checker and the automaton are private."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from grammar_bodies import bodies
from hypothesis import given, settings, strategies as st
from strategies import mutate_tokens
from test_automaton import plain_recognise
from test_protocol import TOKENS

import cbcl
from cbcl import BodyError, GrammarError, Registry
from cbcl.descriptor import GrammarLimits, Protocol
from cbcl.grammar._automaton import StackAutomaton
from cbcl.grammar._compile import compile_grammar
from cbcl.grammar._lr import LALR1
from cbcl.grammar._subset import KeywordSet, read_grammar
from cbcl.protocol._pass2 import recognise_body, start_node, walk_body

AUCTION = """\
body: "(" "withdraw" STRING ")"
bid: "(" "bid" (":item" STRING & ":amount" NUMBER & ":bidder" URI & [":note" STRING]) ")"
award: "(" "award" (":item" STRING & ":price" NUMBER & [":terms" terms]) ")"
terms: "(" "terms" (":days" INTEGER & [":via" SYMBOL]) terms* ")"
"""
INTENTS = "(PROPOSE bid) (ACCEPT award) REJECT"


def descriptor(grammar: str, intents: str = INTENTS, ident: str = "auction/v1") -> bytes:
    return (f"(protocol-descriptor (id {ident}) (version 1) (intents {intents}) "
            f"(grammar {cbcl.canonical(grammar)}))").encode()


@pytest.fixture(scope="module")
def registry() -> Registry:
    reg = Registry(disk_cache=False, isolate=False)
    reg.load(descriptor(AUCTION), allow_unsigned=True)
    return reg


def message(intent: str, body: str, ident: str = "auction/v1") -> str:
    return (f'(CBCL/1.0 (message-id "m-1") (sender agent://a) (receiver agent://b) '
            f"(intent {intent}) (protocol {ident}) (body {body}))")


def refusal(registry: Registry, intent: str, body: str) -> BodyError:
    text = message(intent, body)
    with pytest.raises(BodyError) as caught:
        cbcl.parse(text, registry=registry)
    error = caught.value
    assert error.position is not None
    return error


def column_of(intent: str, body: str, token: str, occurrence: int = 1) -> int:
    """The column of the ``occurrence``-th ``token`` in ``body``, in its message."""
    text = message(intent, body)
    at = -1
    for _ in range(occurrence):
        at = body.index(token, at + 1)
    return text.index(f"(body {body})") + len("(body ") + at + 1


# --------------------------------------------------------------------------- the subset


@pytest.mark.parametrize(("grammar", "problem"), [
    ('body: ":a" STRING & ":b" STRING', "must be written in parentheses"),
    ('body: "(" (":a" STRING & ":b" STRING | ":c" STRING) ")"', "cannot be mixed"),
    ('body: "(" (":a" STRING | ":c" STRING & ":b" STRING) ")"', "cannot be mixed"),
    ('body: "(" (":a" STRING & "b" STRING) ")"', "a keyword literal followed by one item"),
    ('body: "(" (":a" STRING & ":b") ")"', "a keyword literal followed by one item"),
    ('body: "(" (":a" STRING & ":b" STRING*) ")"', "a keyword literal followed by one item"),
    ('body: "(" (":a" STRING & ":b" STRING STRING) ")"', "followed by one item"),
    ('body: "(" (":a" STRING & ) ")"', "followed by one item"),
    ('body: "(" (":a" STRING & ":a" INTEGER) ")"', '":a" starts two members'),
    ('body: "(" (":a" STRING & ":b" STRING)* ")"', "cannot follow a keyword set"),
    ('body: "(" (":a" STRING & ":b" STRING)? ")"', "cannot follow a keyword set"),
    ('body: "(" [":a" STRING & ":b" STRING] ")"', "cannot be optional as a whole"),
])
def test_malformed_keyword_sets_are_refused_where_they_go_wrong(grammar: str,
                                                                problem: str) -> None:
    with pytest.raises(GrammarError, match=problem) as caught:
        read_grammar(grammar)
    assert caught.value.verdict == "rejected" and caught.value.position is not None


def test_a_keyword_set_is_read_as_written() -> None:
    source = read_grammar(AUCTION, starts=("bid", "award", "body"))
    items = source.rule("bid").alternatives[0].items
    (kwset,) = [i for i in items if isinstance(i, KeywordSet)]
    assert [(m.keyword, m.optional) for m in kwset.members] == [
        (":item", False), (":amount", False), (":bidder", False), (":note", True)]
    alternative = read_grammar('body: "(" (":a" STRING & (":b" STRING)?) ")"')
    (_, inner, _) = alternative.rule("body").alternatives[0].items
    assert isinstance(inner, KeywordSet) and inner.members[1].optional


def test_max_set_members_accepts_n_and_refuses_n_plus_one() -> None:
    def grammar(n: int) -> str:
        return 'body: "(" (' + " & ".join(f'":k{i}" STRING' for i in range(n)) + ') ")"'

    limits = GrammarLimits(max_set_members=5)
    read_grammar(grammar(5), limits=limits)
    with pytest.raises(GrammarError, match="more than 5 members"):
        read_grammar(grammar(6), limits=limits)
    read_grammar(grammar(32))  # the default
    with pytest.raises(GrammarError, match="max_set_members"):
        read_grammar(grammar(33))


def test_start_rules_must_exist_and_reach_every_rule() -> None:
    with pytest.raises(GrammarError, match="no award rule"):
        read_grammar('bid: "(" "bid" ")"\n', starts=("bid", "award"))
    with pytest.raises(GrammarError, match="cannot be reached from any start rule"):
        read_grammar('bid: "(" "bid" ")"\nbody: "x"\nother: "y"\n', starts=("bid", "body"))
    with pytest.raises(GrammarError, match="no body rule"):
        read_grammar('bid: "(" "bid" ")"\n')
    for bad in ((), ("bid", "bid"), ("Bid",), ("_x",)):
        with pytest.raises(ValueError):
            read_grammar('bid: "(" "bid" ")"\n', starts=bad)


# --------------------------------------------------------------------------- the checker


def test_a_deterministic_keyword_set_is_lalr1() -> None:
    assert compile_grammar(AUCTION, starts=("bid", "award", "body")).verdict == LALR1


@pytest.mark.parametrize(("grammar", "atom"), [
    ('body: "(" "x" (":a" STRING & ":b" STRING) KEYWORD* ")"', ":a"),
    ('body: "(" "x" (":a" STRING & ":b" STRING) value ")"', ":a"),
    ('body: "(" "x" (KEYWORD STRING)* (":a" STRING & ":b" STRING) ")"', ":a"),
])
def test_a_set_beside_a_keyword_or_value_is_an_overlap_with_its_point(grammar: str,
                                                                      atom: str) -> None:
    compiled = compile_grammar(grammar)
    assert compiled.verdict != LALR1
    assert f"the atom {atom} could be the literal" in compiled.report
    assert "Prefix:" in compiled.report


def test_two_sets_sharing_a_keyword_side_by_side_conflict() -> None:
    compiled = compile_grammar(
        'body: "(" "x" (":a" STRING & ":b" STRING) (":a" INTEGER & ":c" STRING) ")"')
    assert compiled.verdict != LALR1
    assert '":a"' in compiled.report


# --------------------------------------------------------------------------- pass 2


MEMBERS = [':item "lamp"', ":amount 12.50", ":bidder agent://x", ':note "blue"']


@pytest.mark.parametrize("order", list(itertools.permutations(range(4))))
def test_every_order_of_a_four_member_set_is_accepted(registry: Registry,
                                                      order: tuple[int, ...]) -> None:
    body = "(bid " + " ".join(MEMBERS[i] for i in order) + ")"
    parsed = cbcl.parse(message("PROPOSE", body), registry=registry)
    assert parsed.body is not None
    assert cbcl.canonical(parsed.body) == body  # the sender's order is kept


@pytest.mark.parametrize("left_out", [0, 1, 2])
def test_each_missing_required_member_is_refused_at_the_close(registry: Registry,
                                                              left_out: int) -> None:
    kept = [m for i, m in enumerate(MEMBERS) if i != left_out]
    body = "(bid " + " ".join(kept) + ")"
    error = refusal(registry, "PROPOSE", body)
    keyword = MEMBERS[left_out].split(" ")[0]
    assert f"missing `{keyword}`" in error.message
    assert "PROPOSE" in error.message
    assert error.column == column_of("PROPOSE", body, ")", body.count(")"))
    assert error.expected == (f'"{keyword}"',)


def test_several_missing_members_are_named_together(registry: Registry) -> None:
    error = refusal(registry, "PROPOSE", '(bid :note "x")')
    assert "missing `:item` and `:amount` and `:bidder`" in error.message


@pytest.mark.parametrize("twice", range(4))
def test_each_repeated_member_is_refused_at_its_second_occurrence(registry: Registry,
                                                                  twice: int) -> None:
    body = "(bid " + " ".join(MEMBERS) + " " + MEMBERS[twice] + ")"
    keyword = MEMBERS[twice].split(" ")[0]
    error = refusal(registry, "PROPOSE", body)
    assert f"`{keyword}` given twice" in error.message
    assert error.column == column_of("PROPOSE", body, keyword, occurrence=2)


def test_what_is_expected_inside_a_set_leaves_out_what_was_given(registry: Registry) -> None:
    error = refusal(registry, "PROPOSE", '(bid :bidder agent://x :item "lamp" 12)')
    assert error.expected == ('":amount"', '":note"')  # not ')': :amount is still missing
    error = refusal(registry, "PROPOSE", '(bid :bidder agent://x :item "lamp" :amount 1 2)')
    assert error.expected == ('":note"', "')'")


def test_nested_sets_keep_their_own_members(registry: Registry) -> None:
    inner = "(terms :days 3 :via post)"
    ok = f'(award :terms (terms :via air :days 1 {inner}) :price 3 :item "x")'
    assert cbcl.parse(message("ACCEPT", ok), registry=registry).body is not None
    error = refusal(registry, "ACCEPT", '(award :terms (terms :days 1 (terms :via a)) '
                    ':price 3 :item "x")')
    assert "missing `:days`" in error.message
    error = refusal(registry, "ACCEPT", '(award :item "x" :terms (terms :days 1) :price 3 '
                    ':item "y")')
    assert "`:item` given twice" in error.message


def test_a_body_of_the_wrong_shape_for_its_intent_is_refused_naming_it(
        registry: Registry) -> None:
    error = refusal(registry, "ACCEPT", '(bid :item "x" :amount 1 :bidder agent://b)')
    assert "for ACCEPT bodies expected" in error.message and '"award"' in error.message
    error = refusal(registry, "PROPOSE", '(withdraw "x")')
    assert "for PROPOSE bodies" in error.message
    assert cbcl.parse(message("REJECT", '(withdraw "late")'), registry=registry)
    error = refusal(registry, "REJECT", '(award :item "x" :price 1)')
    assert "for REJECT bodies" in error.message


def test_number_takes_integers_and_decimals_only(registry: Registry) -> None:
    for amount in ("12", "-3", "12.50", "0.0"):
        body = f'(bid :item "x" :amount {amount} :bidder agent://b)'
        assert cbcl.parse(message("PROPOSE", body), registry=registry)
    error = refusal(registry, "ACCEPT", '(award :item "x" :price "12")')
    assert "expected a number, found string" in error.message


def test_a_descriptor_naming_an_undefined_start_rule_is_refused() -> None:
    reg = Registry(disk_cache=False, isolate=False)
    with pytest.raises(GrammarError, match="no missing rule"):
        reg.load(descriptor('body: "x"\n', "(PROPOSE missing) REJECT", "broken/v1"),
                 allow_unsigned=True)
    for bad in ("Bad", "value", "_x"):  # value: a base name (found by fuzzing the grammar)
        with pytest.raises(cbcl.DescriptorError, match="not a rule name"):
            cbcl.descriptor.read_descriptor(
                descriptor('body: "x"\n', f"(PROPOSE {bad})", "broken/v1"))


def test_one_start_rule_for_every_intent_needs_no_start_terminal() -> None:
    reg = Registry(disk_cache=False, isolate=False)
    protocol = reg.load(descriptor('bid: "(" "bid" (":a" NUMBER & ":b" NUMBER) ")"\n',
                                   "(PROPOSE bid) (ACCEPT bid)", "single/v1"),
                        allow_unsigned=True)
    assert protocol.entries == {} and not protocol.tables.start_terminals
    assert cbcl.parse(message("ACCEPT", "(bid :b 1 :a 2)", "single/v1"), registry=reg)


# --------------------------------------------------------------------------- the automaton


def _protocol(registry: Registry) -> Protocol:
    found = registry.get("auction/v1")
    assert found is not None
    return found


@pytest.mark.parametrize("max_nodes", [2, 7, 16384])
@pytest.mark.parametrize("intent", ["PROPOSE", "ACCEPT", "REJECT"])
@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_the_automaton_keeps_sets_as_the_kernel_does(registry: Registry, max_nodes: int,
                                                     intent: str, data: st.DataObject) -> None:
    protocol = _protocol(registry)
    source = read_grammar(AUCTION, starts=protocol.descriptor.start_rules)
    chosen = cbcl.Intent(intent)
    tokens = data.draw(bodies(source, protocol.descriptor.starts[chosen], TOKENS)).split(" ")
    if data.draw(st.booleans()):
        tokens = mutate_tokens(tokens, data, rounds=2, ops=("drop", "swap", "dup"))
    try:
        body = cbcl.read(" ".join(tokens))
    except cbcl.CBCLError:
        return
    original, recogniser = protocol.automaton, protocol.recogniser
    object.__setattr__(protocol, "automaton", StackAutomaton(
        protocol.tables, original.literals, max_nodes=max_nodes))
    object.__setattr__(protocol, "recogniser", StackAutomaton(
        protocol.tables, original.literals, max_nodes=max_nodes, walker_masks=True))
    try:
        expected = plain_recognise(protocol, body, chosen)
        assert recognise_body(protocol, body, chosen) is expected
        assert recognise_body(protocol, body, chosen) is expected
        # The masks on the nodes (the refusal search's automaton) decide alike.
        assert walk_body(protocol, body, start_node(protocol, chosen),
                         protocol.automaton) is expected
    finally:
        object.__setattr__(protocol, "automaton", original)
        object.__setattr__(protocol, "recogniser", recogniser)


@pytest.mark.parametrize("intent", ["PROPOSE", "ACCEPT"])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_generated_bodies_with_shuffled_sets_are_accepted(registry: Registry, intent: str,
                                                          data: st.DataObject) -> None:
    protocol = _protocol(registry)
    source = read_grammar(AUCTION, starts=protocol.descriptor.start_rules)
    body = data.draw(bodies(source, protocol.descriptor.starts[cbcl.Intent(intent)], TOKENS))
    parsed = cbcl.parse(message(intent, body), registry=registry)
    assert parsed.body == cbcl.read(body)


# --------------------------------------------------------------------------- text and binary


def _outcome(fn: Any) -> Any:
    try:
        return fn()
    except cbcl.CBCLError as exc:
        return (type(exc), exc.message, exc.expected if isinstance(exc, BodyError) else None)


@pytest.mark.parametrize("intent", ["PROPOSE", "ACCEPT", "REJECT"])
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_text_and_binary_agree_on_sets_and_start_rules(registry: Registry, intent: str,
                                                       data: st.DataObject) -> None:
    protocol = _protocol(registry)
    source = read_grammar(AUCTION, starts=protocol.descriptor.start_rules)
    start = protocol.descriptor.starts[cbcl.Intent(data.draw(st.sampled_from(
        ["PROPOSE", "ACCEPT", "REJECT"])))]  # a body of any intent's shape
    tokens = data.draw(bodies(source, start, TOKENS)).split(" ")
    if data.draw(st.booleans()):
        tokens = mutate_tokens(tokens, data, rounds=2, ops=("drop", "swap", "dup"))
    text = message(intent, " ".join(tokens))
    try:
        envelope = cbcl.parse(text, envelope_only=True)
    except cbcl.CBCLError:
        return
    frame = cbcl.Encoder(registry, validate=False).encode(envelope)
    in_text = _outcome(lambda: cbcl.parse(text, registry=registry))
    for decoder in (cbcl.Decoder(registry), cbcl.Decoder(registry, pure_python=True)):
        assert _outcome(lambda d=decoder: d.decode(frame)) == in_text
    if not isinstance(in_text, tuple):  # accepted: the sender's order survives both ways
        assert cbcl.Decoder(registry).decode(cbcl.encode(in_text, registry=registry)) == in_text
