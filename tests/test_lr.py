"""Tests for the LR analysis engine (``cbcl.grammar._lr``): verdicts, reports, overlaps,
budgets, and
a differential test against lark's LALR(1) table builder.

Tests internals: the LR(1) analysis (``cbcl.grammar._lr``) is private."""

from __future__ import annotations

import re
import time
from pathlib import Path

import lark
import pytest
from hypothesis import assume, given, settings, strategies as st

from cbcl import GrammarError
from cbcl.grammar._cfg import Grammar, Production
from cbcl.grammar._lr import (
    AMBIGUOUS,
    LALR1,
    LR1_NOT_LALR1,
    NOT_LR1,
    Conflict,
    Report,
    Tree,
    analyse,
)

VECTORS = Path(__file__).resolve().parents[1] / "spec" / "vectors" / "grammars"

# ---------------------------------------------------------------------------------------------
# A compact builder: the descriptor subset's notation, expanded the way _cfg.py prescribes.

_TOKEN = re.compile(r'\s*(?:(//[^\n]*)|("(?:[^"\\]|\\.)*")|(->)|([A-Za-z_][A-Za-z0-9_]*)|'
                    r'([()\[\]|*+?:]))')
_BASE = ("SYMBOL", "STRING", "INTEGER", "DECIMAL", "KEYWORD", "URI")


class _Builder:
    def __init__(self) -> None:
        self.prods: list[Production] = []
        self.terminals: set[str] = set()
        self.display: dict[str, str] = {}
        self.overlaps: dict[str, frozenset[str]] = {}
        self.synthetic: set[str] = set()
        self.literals: dict[str, str] = {}
        self.counter = 0
        self.toks: list[str] = []
        self.pos = 0
        self.value_added = False

    def literal(self, text: str) -> str:
        atom = text[1:-1]
        if atom in ("(", ")"):
            name = "LPAR" if atom == "(" else "RPAR"
            self.terminals.add(name)
            self.display[name] = text
            return name
        if atom not in self.literals:
            name = f"LIT_{len(self.literals)}"
            self.literals[atom] = name
            self.terminals.add(name)
            self.display[name] = text
            self.overlaps[name] = frozenset({"KEYWORD" if atom.startswith(":") else "SYMBOL"})
        return self.literals[atom]

    def name(self, word: str) -> str:
        if word == "value" and not self.value_added:
            self.value_added = True
            self.terminals.update((*_BASE, "LPAR", "RPAR"))
            self.display.update(LPAR='"("', RPAR='")"')
            for t in _BASE:
                self.prods.append(Production("value", (t,)))
            self.prods.append(Production("value", ("LPAR", "__value_star", "RPAR")))
            self.prods.append(Production("__value_star", ()))
            self.prods.append(Production("__value_star", ("__value_star", "value")))
            self.synthetic.add("__value_star")
            self.display["__value_star"] = "value*"
        if word.isupper():
            self.terminals.add(word)
        return word

    def fresh(self, kind: str, shown: str) -> str:
        self.counter += 1
        name = f"__{kind}_{self.counter}"
        self.synthetic.add(name)
        self.display[name] = shown
        return name

    def peek(self) -> str | None:
        return self.toks[self.pos] if self.pos < len(self.toks) else None

    def alternatives(self, stop: set[str]) -> tuple[list[tuple[list[str], str | None]], str]:
        alts: list[tuple[list[str], str | None]] = []
        texts: list[str] = []
        while True:
            seq, text = self.sequence(stop | {"|"})
            alias = None
            if self.peek() == "->":
                self.pos += 1
                alias = self.toks[self.pos]
                self.pos += 1
            alts.append((seq, alias))
            texts.append(text)
            if self.peek() == "|":
                self.pos += 1
                continue
            return alts, " | ".join(texts)

    def sequence(self, stop: set[str]) -> tuple[list[str], str]:
        syms: list[str] = []
        texts: list[str] = []
        while self.peek() is not None and self.peek() not in stop and self.peek() != "->":
            sym, text = self.item()
            syms.append(sym)
            texts.append(text)
        return syms, " ".join(texts)

    def item(self) -> tuple[str, str]:
        tok = self.toks[self.pos]
        self.pos += 1
        if tok in ("(", "["):
            close = ")" if tok == "(" else "]"
            alts, text = self.alternatives({close})
            self.pos += 1
            if tok == "[":
                sym = self.fresh("opt", f"[{text}]")
                for seq, alias in alts:
                    self.prods.append(Production(sym, tuple(seq), alias))
                self.prods.append(Production(sym, ()))
                return sym, f"[{text}]"
            text = f"({text})"
            if len(alts) == 1 and len(alts[0][0]) == 1 and alts[0][1] is None:
                sym = alts[0][0][0]
            else:
                sym = self.fresh("grp", text)
                for seq, alias in alts:
                    self.prods.append(Production(sym, tuple(seq), alias))
        elif tok.startswith('"'):
            sym, text = self.literal(tok), tok
        else:
            sym, text = self.name(tok), tok
        op = self.peek()
        if op in ("*", "+", "?"):
            self.pos += 1
            shown = f"{text}{op}"
            new = self.fresh({"*": "star", "+": "plus", "?": "opt"}[op], shown)
            if op == "*":
                self.prods += [Production(new, ()), Production(new, (new, sym))]
            elif op == "+":
                self.prods += [Production(new, (sym,)), Production(new, (new, sym))]
            else:
                self.prods += [Production(new, ()), Production(new, (sym,))]
            return new, shown
        return sym, text

    def rules(self, text: str) -> None:
        toks = [m.group(2) or m.group(3) or m.group(4) or m.group(5) or ""
                for m in _TOKEN.finditer(text) if not m.group(1)]
        # Mark rule heads: "name :" -> a rule boundary.
        i = 0
        while i < len(toks):
            head = toks[i]
            assert toks[i + 1] == ":", toks[i:i + 3]
            j = i + 2
            while j < len(toks) and not (j + 1 < len(toks) and toks[j + 1] == ":"):
                j += 1
            self.toks = toks[i + 2:j]
            self.pos = 0
            alts, _ = self.alternatives(set())
            for seq, alias in alts:
                self.prods.append(Production(head, tuple(seq), alias))
            i = j


def build(text: str, start: str = "body") -> Grammar:
    """A Grammar from descriptor-subset notation (tests only)."""
    b = _Builder()
    b.rules(text)
    return Grammar(start, tuple(b.prods), frozenset(b.terminals), frozenset(b.synthetic),
                   dict(b.display), dict(b.overlaps))


def vector(name: str) -> tuple[str, Grammar]:
    text = (VECTORS / name).read_text()
    first = text.splitlines()[0]
    assert first.startswith("// verdict: ")
    return first.removeprefix("// verdict: ").strip(), build(text)


# ---------------------------------------------------------------------------------------------
# Vectors


@pytest.mark.parametrize("name", sorted(p.name for p in VECTORS.glob("*.lark")))
def test_vector_verdicts(name: str) -> None:
    expected, grammar = vector(name)
    report = analyse(grammar)
    assert report.verdict == expected
    assert report.render().splitlines()[0] == expected


def test_dangling_else_report() -> None:
    _, grammar = vector("dangling-else.lark")
    report = analyse(grammar)
    (conflict,) = report.conflicts
    assert conflict.kind == "shift/reduce"
    assert conflict.automaton == "LR(1)"
    assert conflict.prefix == ('"if"', "SYMBOL", '"then"', '"if"', "SYMBOL", '"then"', "stmt")
    assert conflict.lookahead == '"else"'
    items = {a.kind: a.items for a in conflict.actions}
    assert items["reduce"] == ('stmt: "if" SYMBOL "then" stmt •',)
    assert items["shift"] == ('stmt: "if" SYMBOL "then" stmt • "else" stmt',)
    assert conflict.example == ('"if"', "SYMBOL", '"then"', '"if"', "SYMBOL", '"then"',
                                '"skip"', '"else"', '"skip"')
    one, two = conflict.derivations
    assert one != two
    assert one.leaves() == two.leaves() == conflict.example
    assert one.label == two.label == "body"
    text = report.render()
    assert text.splitlines()[0] == AMBIGUOUS
    assert one.render().startswith("body → [ stmt → [")
    for needle in ("Example:",
                   'Derivation 1: stmt → [ "if" SYMBOL "then" stmt → [ "if" SYMBOL "then" stmt '
                   '"else" stmt → [ "skip" ] ] ]',
                   'Derivation 2: stmt → [ "if" SYMBOL "then" stmt → [ "if" SYMBOL "then" stmt ] '
                   '"else" stmt → [ "skip" ] ]',
                   '"if" SYMBOL "then" "if" SYMBOL "then" stmt •',
                   'stmt: "if" SYMBOL "then" stmt • "else" stmt'):
        assert needle in text


def test_ambiguous_expression_witnesses() -> None:
    _, grammar = vector("ambiguous-expression.lark")
    report = analyse(grammar)
    assert report.verdict == AMBIGUOUS
    # e "+" e • and e "*" e •, each on "+" and "*": four distinct conflicts, all ambiguous.
    assert len(report.conflicts) == 4
    assert all(c.derivations for c in report.conflicts)
    examples = {c.example for c in report.conflicts}
    assert ("INTEGER", '"+"', "INTEGER", '"*"', "INTEGER") in examples
    for c in report.conflicts:
        assert c.prefix[-1] == "e" and c.prefix[0] == "e"
        one, two = c.derivations
        assert one != two and one.leaves() == two.leaves() == c.example


def test_classic_lr1_not_lalr1_hint() -> None:
    _, grammar = vector("classic-lr1-not-lalr1.lark")
    report = analyse(grammar)
    assert report.verdict == LR1_NOT_LALR1
    assert {c.lookahead for c in report.conflicts} == {'"c"', '"d"'}
    for c in report.conflicts:
        assert c.kind == "reduce/reduce" and c.automaton == "LALR(1)"
        assert {a.items for a in c.actions} == {('e: "x" •',), ('f: "x" •',)}
        assert '"a" "x"' in c.hint and '"b" "x"' in c.hint
        assert "copy" in c.hint
    assert "merg" in report.render()


def test_not_lr1_needs_two_tokens() -> None:
    grammar = build('body: a "c" "d" | b "c" "e"\na: "x"\nb: "x"')
    report = analyse(grammar)
    assert report.verdict == NOT_LR1
    (c,) = report.conflicts
    assert c.kind == "reduce/reduce"
    assert c.prefix == ('"x"',) and c.lookahead == '"c"'
    assert not c.derivations
    assert {a.example for a in c.actions} == {('"x"', '"c"', '"d"'), ('"x"', '"c"', '"e"')}
    text = report.render()
    assert text.splitlines()[0] == NOT_LR1
    assert 'Prefix:' in text and '"x" •' in text and 'Lookahead:        "c"' in text


def test_every_conflict_is_reported() -> None:
    # Two unrelated problems: a dangling else and an ambiguous list.
    grammar = build('''
        body: stmt | "list" items
        stmt: "if" SYMBOL "then" stmt | "if" SYMBOL "then" stmt "else" stmt | "skip"
        items: items items | INTEGER
    ''')
    report = analyse(grammar)
    assert report.verdict == AMBIGUOUS
    lookaheads = sorted(c.lookahead for c in report.conflicts)
    assert lookaheads == ['"else"', "INTEGER"]
    assert all(c.derivations for c in report.conflicts)


def test_identical_conflicts_are_deduplicated() -> None:
    # e "+" e • on "+" occurs in two LR(1) states with different kernels (one also holds
    # body: e "+" e • "!"); the author sees the same items and lookahead: reported once.
    report = analyse(build('body: e | e "+" e "!"\ne: e "+" e | INTEGER'))
    assert report.verdict == AMBIGUOUS
    keys = [(c.lookahead, tuple(a.items for a in c.actions)) for c in report.conflicts]
    assert len(keys) == len(set(keys))
    plus = [c for c in report.conflicts if c.lookahead == '"+"']
    assert len(plus) == 1 and plus[0].count >= 2
    assert "(in 2 states)" in report.render() or "states)" in report.render()


def test_overlap_alternative_literal_or_symbol() -> None:
    report = analyse(build('body: "(" ("x" | SYMBOL) ")"'))
    assert report.verdict == AMBIGUOUS
    (c,) = report.conflicts
    assert c.kind == "overlap" and c.lookahead == '"x"' and c.terminal == "SYMBOL"
    assert c.prefix == ('"("',)
    text = report.render()
    assert 'after "(" the atom x could be the literal "x" or a SYMBOL' in text
    assert "__" not in text


def test_overlap_sequence_is_fine() -> None:
    assert analyse(build('body: "(" "x" SYMBOL ")"')).verdict == LALR1
    assert analyse(build('body: "(" "task" value* ")"')).verdict == LALR1


def test_overlap_through_reductions_and_value() -> None:
    # After "(" "task" attr*, the atom :cmd could start an attr or be the KEYWORD of one;
    # reached in many LR(1) states through different reductions, reported once.
    report = analyse(build('body: "(" "task" attr* ")"\nattr: ":cmd" value | KEYWORD STRING'))
    assert report.verdict == AMBIGUOUS
    (c,) = report.conflicts
    assert c.kind == "overlap" and c.lookahead == '":cmd"' and c.terminal == "KEYWORD"
    assert c.count > 1
    assert c.prefix == ('"("', '"task"')
    assert {a.items for a in c.actions} == {('attr: • ":cmd" value',),
                                             ("attr: • KEYWORD STRING",)}
    # value accepts a SYMBOL, so a literal where value is also possible is ambiguous.
    report = analyse(build('body: "(" ("go" | value) ")"'))
    assert report.verdict == AMBIGUOUS
    assert report.conflicts[0].kind == "overlap"


def test_overlap_no_false_alarm_from_lalr_merging() -> None:
    # In LALR(1) the states for "value: SYMBOL •" are shared between the context followed
    # by ":k" and the one inside a list (followed by KEYWORD): merged lookaheads would
    # claim an overlap that canonical LR(1) shows cannot happen.
    grammar = build('body: "(" "a" SYMBOL ":k" value ")" | "(" "b" value KEYWORD ")"')
    report = analyse(grammar)
    assert report.verdict == LALR1
    assert not report.conflicts


def test_synthetic_names_never_shown() -> None:
    _, grammar = vector("task-assignment.lark")
    assert grammar.synthetic
    bad = build('body: "(" "t" attr* ")"\nattr: KEYWORD INTEGER | attr attr')
    report = analyse(bad)
    assert report.verdict == AMBIGUOUS
    text = report.render()
    assert "__" not in text
    assert "attr*" in text
    for c in report.conflicts:
        for tree in c.derivations:
            assert "__" not in tree.render()


def test_synthetic_shown_by_display_when_splicing_hides_the_difference() -> None:
    report = analyse(build('body: ["x"] ["x"]'))
    assert report.verdict == AMBIGUOUS
    one, two = report.conflicts[0].derivations
    assert one != two
    assert '["x"]' in one.render() and "__" not in one.render()


def test_cyclic_and_empty_ambiguity_terminates() -> None:
    report = analyse(build('body: a\na: b | "x"\nb: a'))
    assert report.verdict == AMBIGUOUS
    one, two = report.conflicts[0].derivations
    assert one.leaves() == two.leaves() == ('"x"',)
    report = analyse(build('body: s\ns: s s | "x" |'))
    assert report.verdict == AMBIGUOUS
    assert any(c.example == () for c in report.conflicts)
    assert "(empty input)" in report.render()


def test_malformed_grammars_rejected() -> None:
    with pytest.raises(GrammarError) as info:
        analyse(build('body: a\na: "x" a'))
    assert info.value.verdict == "rejected"
    with pytest.raises(GrammarError):
        analyse(Grammar("body", (Production("body", ("nope",)),), frozenset()))
    with pytest.raises(GrammarError):
        analyse(Grammar("start", (Production("body", ()),), frozenset()))
    with pytest.raises(ValueError):
        analyse(build('body: "x"'), max_states=0)


def test_state_budget_raises_quickly() -> None:
    grammar = build(_chain(100))
    started = time.process_time()
    with pytest.raises(GrammarError) as info:
        analyse(grammar, max_states=50)
    assert info.value.verdict == "rejected"
    assert "max_states" in str(info.value)
    assert time.process_time() - started < 5
    # The canonical automaton has its own count: LALR fits, LR(1) does not.
    _, dangling = vector("dangling-else.lark")
    with pytest.raises(GrammarError):
        analyse(dangling, max_states=12)


def test_search_budget_gives_not_lr1() -> None:
    _, grammar = vector("dangling-else.lark")
    report = analyse(grammar, max_search_steps=5)
    assert report.verdict == NOT_LR1
    assert report.search_exhausted
    assert "budget" in report.render()


def test_report_types() -> None:
    report = analyse(build('body: "x"'))
    assert isinstance(report, Report) and report.render() == LALR1
    assert report.conflicts == ()
    tree = Tree("a", (Tree('"x"', leaf=True), Tree("b")))
    assert tree.render() == 'a → [ "x" b → [ ε ] ]'
    with pytest.raises(AttributeError):
        report.verdict = "x"  # type: ignore[misc]
    assert isinstance(analyse(vector("dangling-else.lark")[1]).conflicts[0], Conflict)


# ---------------------------------------------------------------------------------------------
# Speed


def _chain(levels: int) -> str:
    lines = ["body: e0"]
    for i in range(levels - 1):
        lines.append(f'e{i}: e{i} "op{i}" e{i + 1} | e{i + 1}')
    lines.append(f'e{levels - 1}: INTEGER | "(" e0 ")"')
    return "\n".join(lines)


def _wide(rules: int) -> str:
    lines = ["body: " + " | ".join(f"cmd{k}" for k in range(rules - 1))]
    for k in range(rules - 1):
        lines.append(f'cmd{k}: "(" "name{k}" KEYWORD (":a{k}" value | ":b{k}" (INTEGER | STRING)+'
                     f' | ":c{k}" [SYMBOL ("x{k}" | "y{k}")*])* ")"')
    return "\n".join(lines)


def test_hundred_level_precedence_chain() -> None:
    grammar = build(_chain(100))
    started = time.process_time()
    report = analyse(grammar)
    assert report.verdict == LALR1
    assert time.process_time() - started < 30


@pytest.mark.slow
def test_256_rule_grammar() -> None:
    grammar = build(_wide(256))
    assert len(grammar.nonterminals - grammar.synthetic - {"value"}) == 256
    started = time.process_time()
    report = analyse(grammar)
    assert report.verdict == LALR1
    assert time.process_time() - started < 30


def test_ambiguous_chain_found_quickly() -> None:
    text = _chain(60).replace('e59: INTEGER', 'e59: INTEGER | e30 "op59" e30')
    report = analyse(build(text))
    assert report.verdict == AMBIGUOUS


# ---------------------------------------------------------------------------------------------
# Differential: LALR(1) iff lark builds LALR tables in strict mode


@st.composite
def small_grammars(draw: st.DrawFn) -> tuple[list[list[tuple[str, ...]]], int]:
    n_nt = draw(st.integers(1, 4))
    n_t = draw(st.integers(1, 3))
    rules: list[list[tuple[str, ...]]] = []
    for i in range(n_nt):
        syms = [f"t{k}" for k in range(n_t)] + [f"n{j}" for j in range(n_nt)]
        # A first alternative built from terminals and later rules keeps every rule productive.
        safe = [f"t{k}" for k in range(n_t)] + [f"n{j}" for j in range(i + 1, n_nt)]
        alts = {tuple(draw(st.lists(st.sampled_from(safe), min_size=1, max_size=3)))}
        for _ in range(draw(st.integers(0, 3))):
            alts.add(tuple(draw(st.lists(st.sampled_from(syms), max_size=3))))
        rules.append(sorted(alts))
    return rules, n_t


def _lark_text(rules: list[list[tuple[str, ...]]], n_t: int) -> str:
    lines = []
    for i, alts in enumerate(rules):
        rendered = [" ".join(s.upper() if s.startswith("t") else s for s in alt)
                    for alt in alts]
        lines.append(f"n{i}: " + " | ".join(rendered))
    lines += [f'T{k}: "t{k}"' for k in range(n_t)]
    return "\n".join(lines) + "\n"


def _cyclic(rules: list[list[tuple[str, ...]]]) -> bool:
    """Whether some rule derives itself (A =>+ A); lark silently drops such cycles."""
    nullable: set[str] = set()
    changed = True
    while changed:
        changed = False
        for i, alts in enumerate(rules):
            if f"n{i}" not in nullable and any(all(s in nullable for s in a) for a in alts):
                nullable.add(f"n{i}")
                changed = True
    edges: dict[str, set[str]] = {f"n{i}": set() for i in range(len(rules))}
    for i, alts in enumerate(rules):
        for alt in alts:
            for k, s in enumerate(alt):
                rest = alt[:k] + alt[k + 1:]
                if s.startswith("n") and all(r in nullable for r in rest):
                    edges[f"n{i}"].add(s)
    for a in edges:
        seen, todo = set(), list(edges[a])
        while todo:
            b = todo.pop()
            if b == a:
                return True
            if b not in seen:
                seen.add(b)
                todo.extend(edges[b])
    return False


def _our_grammar(rules: list[list[tuple[str, ...]]], n_t: int) -> Grammar:
    prods = [Production(f"n{i}", tuple(s.upper() if s.startswith("t") else s for s in alt))
             for i, alts in enumerate(rules) for alt in alts]
    return Grammar("n0", tuple(prods), frozenset(f"T{k}" for k in range(n_t)))


@settings(max_examples=300, deadline=None)
@given(small_grammars())
def test_lalr_verdict_matches_lark(case: tuple[list[list[tuple[str, ...]]], int]) -> None:
    rules, n_t = case
    assume(not _cyclic(rules))
    try:
        lark.Lark(_lark_text(rules, n_t), parser="lalr", lexer="basic", strict=True,
                  start="n0")
        lark_ok = True
    except lark.exceptions.GrammarError:
        lark_ok = False
    report = analyse(_our_grammar(rules, n_t))
    assert (report.verdict == LALR1) == lark_ok, report.render()
    if report.verdict == AMBIGUOUS:
        for c in report.conflicts:
            if c.derivations:
                one, two = c.derivations
                assert one != two and one.leaves() == two.leaves() == c.example
