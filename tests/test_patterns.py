"""String patterns (spec/conversations.md §2.4): the safe subset, its limits (N accepted,
N + 1 refused), linear matching on pathological patterns (DFA transitions counted), the
matcher against Python ``re`` on the subset, pattern inclusion, and the schema's
``(string :pattern …)`` in both checking passes.

Tests internals: ``cbcl.protocol._patterns`` and the schema's compiled types."""

from __future__ import annotations

import dataclasses
import re

import llguidance
import pytest
from hypothesis import given, settings, strategies as st
from test_codegen import module_of, records_by_heads
from test_export import _llguidance, _tokenizer, constrained  # type: ignore[attr-defined]

import cbcl
from cbcl import DescriptorError, SchemaError
from cbcl.conversation import check_schema, compile_schema
from cbcl.core._canonical import quote
from cbcl.descriptor import read_declaration
from cbcl.llm import _export, export_grammar, export_json_schema, render_prompt
from cbcl.llm._prompt import fit_to_schema
from cbcl.protocol import _compat, _patterns, _schema
from cbcl.protocol._codegen import generate_records
from cbcl.protocol._compat import diff_descriptors
from cbcl.protocol._patterns import (
    PatternBudgetError,
    PatternError,
    compile_pattern,
    pattern_witness,
)


def matches(pattern: str, text: str) -> bool:
    return compile_pattern(pattern).fullmatch(text)


# --------------------------------------------------------------------------- the subset

@pytest.mark.parametrize(("pattern", "text", "expected"), [
    ("S-[0-9]+", "S-12", True),
    ("S-[0-9]+", "S-", False),
    ("S-[0-9]+", "xS-12", False),  # whole-string match: no search
    ("S-[0-9]+", "S-12x", False),
    (r"S-\d+", "S-007", True),
    (r"\w+", "a_Z9", True),
    (r"\w", "é", False),  # ASCII meanings
    (r"\d", "٣", False),
    (r"\s", "\u00a0", False),
    (r"\s", "\v", True),
    (r"\D\W\S", "a-b", True),
    (".", "\n", True),  # . is any character
    (".", "", False),
    ("[^a-c]", "d", True),
    ("[^a-c]", "b", False),
    ("[a-]", "-", True),
    (r"[\]\\]", "]", True),
    (r"\.", "a", False),
    ("a|", "", True),
    ("()", "", True),
    ("(ab|a)(c|bcd)d*", "abcd", True),
    ("a{2,3}", "a", False),
    ("a{2,3}", "aaa", True),
    ("a{2,3}", "aaaa", False),
    ("a{2,}", "aaaaaaa", True),
    ("a{0}", "", True),
    ("é+ü?", "éé", True),
    ("[é-ü]", "ö", True),
    (r"\n\t", "\n\t", True),
])
def test_subset_matches(pattern: str, text: str, expected: bool) -> None:
    assert matches(pattern, text) is expected


@pytest.mark.parametrize(("pattern", "problem"), [
    ("(?=a)", "(? groups"), ("(?:a)", "(? groups"), ("(?i)a", "(? groups"),
    ("a*?", "quantifier cannot follow"), ("a**", "quantifier cannot follow"),
    ("a++", "quantifier cannot follow"), ("^a", "anchor ^"), ("a$", "anchor $"),
    (r"(a)\1", r"escape \1"), (r"\b", r"escape \b"), (r"\x41", r"escape \x"),
    (r"\p{L}", r"escape \p"), ("\\", "cannot end with"), ("[z-a]", "start is after"),
    (r"[\d-z]", "single characters"), ("(a", "not closed"), ("a)", "unbalanced )"),
    ("[a", "not closed"), ("[]a]", "cannot start with ]"), ("[^]a]", "cannot start with ]"),
    ("[[a]", "unescaped ["), ("a]", "unescaped ]"), ("a}", "unescaped }"),
    ("*a", "nothing to repeat"), ("a{", "starts a repetition"), ("a{,3}", "starts a rep"),
    ("a{2", "not closed"), ("a{3,2}", "m greater than n"), ("a{1234567}", "over 64"),
])
def test_outside_the_subset_is_refused(pattern: str, problem: str) -> None:
    with pytest.raises(PatternError, match=re.escape(problem)) as caught:
        compile_pattern(pattern)
    assert isinstance(caught.value, DescriptorError)
    assert cbcl.core._canonical.canonical_value(pattern) in str(caught.value)


# ------------------------------------------------------------------------------ limits

def test_length_limit() -> None:
    at_limit = r"\d" * (_patterns.MAX_PATTERN_CHARS // 2)
    assert matches(at_limit, "7" * 128)
    with pytest.raises(PatternError, match="longer than the maximum of 256"):
        compile_pattern(at_limit + "a")


def test_depth_limit() -> None:
    depth = _patterns.MAX_PATTERN_DEPTH
    assert matches("(" * depth + "a" + ")" * depth, "a")
    with pytest.raises(PatternError, match="nested more than 16 deep"):
        compile_pattern("(" * (depth + 1) + "a" + ")" * (depth + 1))


def test_repeat_limit() -> None:
    assert matches("a{64}", "a" * 64)
    assert matches("a{1,64}", "a" * 64)
    for refused in ("a{65}", "a{1,65}", "a{65,}"):
        with pytest.raises(PatternError, match="repetition count over 64"):
            compile_pattern(refused)


@pytest.mark.parametrize("pattern", ["(ab|cd){3,9}e", "[a-z]{5}-[0-9]{2,4}", "(a|b)*a(a|b){4}"])
@pytest.mark.parametrize(("limit", "measure"), [
    ("max_nfa_states", "nfa_states"), ("max_dfa_states", "states"),
    ("max_steps", "compile_steps"), ("max_cells", "cells"),
])
def test_automaton_limits_at_n_and_n_plus_one(pattern: str, limit: str, measure: str) -> None:
    n = getattr(compile_pattern(pattern), measure)
    assert compile_pattern(pattern, **{limit: n}).fullmatch("x") is False
    with pytest.raises(PatternError, match=str(n - 1)):
        compile_pattern(pattern, **{limit: n - 1})


def test_default_automaton_limits_refuse_blowups() -> None:
    with pytest.raises(PatternError, match="more than 1024 automaton states"):
        compile_pattern("((a{64}){64}){64}")  # refused while building, not after
    with pytest.raises(PatternError, match="more than 256 deterministic automaton states"):
        compile_pattern("(a|b)*a(a|b){12}")  # a DFA of 2^13 states
    many_classes = "[" + "".join(chr(0x100 + 3 * i) for i in range(127)) + "]{64}"
    with pytest.raises(PatternError, match="more than 16384 cells"):
        compile_pattern(many_classes)  # 65 states of 255 classes


# ---------------------------------------------------------------- linear, not backtracking

@pytest.mark.parametrize("pattern", ["(a|a)*b", "(a*)*b", "(a|aa)*c", "(a+)+b"])
def test_pathological_patterns_take_one_step_a_character(pattern: str) -> None:
    compiled = compile_pattern(pattern)
    assert compiled.states <= 4 and compiled.compile_steps < 100
    text = "a" * 10_000  # re.fullmatch would backtrack exponentially on these
    # one table step a character (the plain walk), and the run-skipping walk reads the same
    plain = dataclasses.replace(compiled, _skips=None)
    for walk in (compiled, plain):
        assert walk.run(text) == (False, 10_000)
        assert walk.run(text + "b") == (pattern.endswith("b"), 10_001)
        assert walk.run("x" + text) == (False, 1)  # stops at the dead state
        assert walk.run("é" + text) == (False, 1)  # (the non-ASCII walk too)
    assert compiled.run("a" * 9_999 + "é") == (False, 10_000)


# ------------------------------------------------------------- against re on the subset

_ALPHABET = "ab-.é"


def _pattern_strategy() -> st.SearchStrategy[str]:
    atoms = st.sampled_from(["a", "b", "-", "é", ".", r"\.", "[ab]", "[^a]", "[a-c]", r"\w",
                             r"\d", r"\s", r"[\w-]", "[-a]", "()"])

    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.lists(inner, min_size=2, max_size=3).map("".join),
            st.lists(inner, min_size=2, max_size=3).map("|".join),
            inner.map(lambda p: f"({p})"),
            st.tuples(inner, st.sampled_from(["*", "+", "?", "{2}", "{0,2}", "{1,}"]))
            .map(lambda t: f"({t[0]}){t[1]}"),
        )

    patterns = atoms
    for _ in range(2):  # (two levels of nesting, drawn at any depth up to them)
        patterns = st.one_of(atoms, extend(patterns))
    return patterns


@settings(deadline=None)
@given(_pattern_strategy(), st.lists(st.text(_ALPHABET, max_size=6), min_size=1, max_size=4))
def test_matcher_agrees_with_re(pattern: str, texts: list[str]) -> None:
    try:
        compiled = compile_pattern(pattern)
    except PatternError:  # only a limit may refuse a drawn pattern
        return
    reference = re.compile(pattern, re.ASCII | re.DOTALL)
    for text in texts:
        assert compiled.fullmatch(text) is (reference.fullmatch(text) is not None), text


# ----------------------------------------------------------------------------- inclusion

def test_witness_of_a_wider_pattern() -> None:
    wide, narrow = compile_pattern("S-[0-9]+"), compile_pattern("S-[0-9]{1,3}")
    witness = pattern_witness(wide, narrow)
    assert witness == "S-0000"  # the shortest string in one and not the other
    assert wide.fullmatch(witness) and not narrow.fullmatch(witness)
    assert pattern_witness(narrow, wide) is None
    assert pattern_witness(compile_pattern(r"\d"), compile_pattern("[0-9]")) is None
    assert pattern_witness(compile_pattern("a|b"), None) == "a"


def test_witness_budget() -> None:
    a, b = compile_pattern("[a-z]{8}"), compile_pattern("[a-y]{8}")
    assert pattern_witness(a, b) == "aaaaaaaz"
    with pytest.raises(PatternBudgetError):
        pattern_witness(a, b, max_steps=10)


# ------------------------------------------------------------------------------ schemas

def sample_schema(options: str) -> _schema.Schema:
    return compile_schema(cbcl.read(f"(schema (record sample (:id (string {options}))))"))


@pytest.mark.parametrize("native", [True, False])
def test_schema_pattern_checked_in_both_passes(native: bool, monkeypatch: pytest.MonkeyPatch
                                               ) -> None:
    if not native:
        monkeypatch.setattr(_schema, "_schema_valid_c", None)
    elif _schema._schema_valid_c is None:
        pytest.skip("the extension is not built")
    schema = sample_schema(':pattern "S-[0-9]+"')
    check_schema(schema, cbcl.read('(sample :id "S-12")'))
    with pytest.raises(SchemaError, match=r'\$\.body\.sample\[:id\]: "S-1x" does not match '
                                          r'the pattern "S-\[0-9\]\+"'):
        check_schema(schema, cbcl.read('(sample :id "S-1x")'))
    with pytest.raises(SchemaError, match="expected a string matching the pattern"):
        check_schema(schema, cbcl.read("(sample :id S-1)"))
    sized = sample_schema(':pattern "a+" :max-length 3')
    check_schema(sized, cbcl.read('(sample :id "aaa")'))
    for refused in ('"aaaa"', '"ab"'):
        with pytest.raises(SchemaError):
            check_schema(sized, cbcl.read(f"(sample :id {refused})"))


def test_schema_refuses_bad_patterns_at_load() -> None:
    with pytest.raises(DescriptorError, match=r"\$\.schema\[1\]\[2\]\[1\].*anchor \^"):
        sample_schema(':pattern "^S"')
    with pytest.raises(DescriptorError, match=":pattern is a string"):
        sample_schema(":pattern S")
    with pytest.raises(DescriptorError, match="unknown option :pattern"):
        compile_schema(cbcl.read('(schema (record s (:id (symbol :pattern "a"))))'))


# ------------------------------------------------------------------------------ exports

_EXPORT_ALPHABET = 'ab-.é"\\\n\u2028'


@settings(deadline=None)
@given(_pattern_strategy(), st.lists(st.text(_EXPORT_ALPHABET, max_size=5), min_size=1,
                                     max_size=4))
def test_exported_regexes_are_the_pattern(pattern: str, texts: list[str]) -> None:
    """The JSON Schema pattern (read by Python ``re``, as ``jsonschema`` does) matches the
    string, the grammars' STRING token (lark's ``re`` dialect) its canonical quoting,
    exactly when the matcher accepts."""
    try:
        compiled = compile_pattern(pattern)
    except PatternError:
        return
    chars = _export._pattern_regex(compiled.tree, wire=False)
    wire = _export._pattern_regex(compiled.tree, wire=True)
    json_re = None if chars is None else re.compile(_export._pattern(chars)[1:-1])
    wire_re = None if wire is None else re.compile(
        _export._render_regex(wire, _export._lark_char))
    for text in texts:
        expected = compiled.fullmatch(text)
        assert (json_re is not None and json_re.fullmatch(text) is not None) is expected
        assert (wire_re is not None and wire_re.fullmatch(quote(text)[1:-1]) is not None) \
            is expected


_PATTERNED = r'''(protocol-declaration (id lab/v1) (version 1)
  (intent REQUEST (record sample (:id (string :pattern "S-[0-9]{1,4}") required)
                                 (:tag (string :pattern "[a-z]+(-[a-z]+)*|\"[^\"]*\"")))))'''


def test_exports_carry_the_pattern() -> None:
    data = read_declaration(_PATTERNED).build()
    json_schema = export_json_schema(data)
    patterns = [v["pattern"] for v in json_schema["$defs"].values() if "pattern" in v
                and "S" in v["pattern"]]
    assert patterns == ["^S\\x2d[0-9]{1,4}$"]
    gbnf = export_grammar(data, "gbnf").text
    assert '::= ("\\x22S-" [0-9]{1,4} "\\x22")' in gbnf
    llguidance.grammar_from("gbnf", gbnf)  # (read by llguidance's GBNF reader)
    assert not any("pattern" in note for note in export_grammar(data, "lark").not_carried)


def test_llguidance_samples_of_a_patterned_protocol_pass_the_schema() -> None:
    data = read_declaration(_PATTERNED).build()
    registry = cbcl.Registry(disk_cache=False, isolate=False)
    registry.load(data, allow_unsigned=True)
    tok, lltok = _tokenizer()
    sampler = constrained.Sampler(tok, lltok, seed=11)
    matcher = sampler.matcher(_llguidance(export_grammar(data, "llguidance").text))
    tags: set[str] = set()
    for _ in range(40):
        text = sampler.sample(matcher)
        assert text is not None
        body = cbcl.parse(text, registry=registry).body  # the schema's pattern too
        assert isinstance(body, tuple)
        tags.update(str(v) for v in body[2:] if '"' in str(v))
    assert tags  # the quoted alternative was drawn, its quotes escaped on the wire


def test_prompt_states_the_pattern_and_its_examples_match() -> None:
    registry = cbcl.Registry(disk_cache=False, isolate=False)
    protocol = registry.load(read_declaration(_PATTERNED).build(), allow_unsigned=True)
    text = render_prompt(protocol, registry=registry)
    assert 'a STRING matching the pattern "S-[0-9]{1,4}" (the whole string)' in text
    schema = compile_schema(cbcl.read('(schema (record s (:id (string :pattern "S-[0-9]{2}" '
                                      ":min-length 4))))"))
    assert fit_to_schema(schema, cbcl.read('(s :id "example")')) == cbcl.read('(s :id "S-00")')


@pytest.mark.parametrize(("old", "new", "verdict", "witness"), [
    ("{1,4}", "{1,3}", "breaking", '(sample :id "S-0000")'),  # narrowed
    ("{1,4}", "{1,5}", "compatible", None),  # widened
    ("S-[0-9]{1,4}", "S-\\\\d{1,4}", "compatible", None),  # the same language
    ('(string :pattern "S-[0-9]{1,4}")', "(string :max-length 6)", "compatible", None),
    ("(string :max-length 6)", '(string :pattern "S-[0-9]{1,4}")', "breaking",
     '(sample :id "")'),  # a pattern added
])
def test_diff_compares_patterns_as_languages(old: str, new: str, verdict: str,
                                             witness: str | None) -> None:
    base = _PATTERNED.replace('(string :pattern "S-[0-9]{1,4}")', "(string :max-length 6)") \
        if old.startswith("(string :max") else _PATTERNED
    assert old in base
    report = diff_descriptors(read_declaration(base).build(),
                              read_declaration(base.replace(old, new)).build())
    assert report.verdict == verdict, report.reasons
    assert [w.text for w in report.witnesses][:1] == ([witness] if witness else [])


def test_diff_of_patterns_past_the_budget_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_compat, "MAX_WITNESS_STEPS", 5)
    report = diff_descriptors(read_declaration(_PATTERNED).build(),
                              read_declaration(_PATTERNED.replace("{1,4}", "{1,3}")).build())
    assert report.verdict == "unknown"
    assert any("more than 5 steps" in reason for reason in report.reasons)


def test_codegen_keeps_the_pattern() -> None:
    built = read_declaration(_PATTERNED).build()
    module = module_of(generate_records(built), "gen_patterned")
    rebuilt = module["descriptor"]()
    assert records_by_heads(rebuilt) == records_by_heads(built)
    record = next(iter(records_by_heads(rebuilt).values()))
    assert isinstance(record, _schema.Record)
    assert record.keys.fields[cbcl.Keyword("id")] == _schema.AtomType(
        "string", pattern="S-[0-9]{1,4}")


def test_a_declaration_with_a_refused_pattern_names_the_field() -> None:
    with pytest.raises(DescriptorError, match=r"\$\.intent\[1\]\[2\]\[2\]\[1\]: pattern "
                                              r'"\(\?=x\)": \(\? groups'):
        read_declaration('(protocol-declaration (id lab/v1) (version 1) (intent REQUEST '
                         '(record sample (:id (string :pattern "(?=x)") required))))')


@pytest.mark.parametrize(("limit", "measure"), [
    ("MAX_SCHEMA_PATTERN_STEPS", "compile_steps"), ("MAX_SCHEMA_PATTERN_CELLS", "cells"),
])
def test_a_schema_bounds_what_its_patterns_cost_together(
        limit: str, measure: str, monkeypatch: pytest.MonkeyPatch) -> None:
    patterns = ["S-[0-9]{1,4}", "[a-z]{2,9}", "(ab|cd)+"]
    total = sum(getattr(compile_pattern(p), measure) for p in patterns)

    def section(n: int) -> cbcl.Value:  # (another text each time: no compiled schema kept)
        fields = " ".join(f'(:f{i} (string :pattern "{p}"))' for i, p in enumerate(patterns))
        return cbcl.read(f"(schema (record r{n} {fields}))")

    monkeypatch.setattr(_schema, limit, total)
    compile_schema(section(1))
    monkeypatch.setattr(_schema, limit, total - 1)
    with pytest.raises(DescriptorError, match=r"\$\.schema\[1\]\[4\]\[1\]: the schema's "
                                              "patterns"):
        compile_schema(section(2))


@settings(deadline=None)
@given(st.text(st.sampled_from(list("ab.|()[]^-\\*+?{}0123,$dwsé")), max_size=40))
def test_any_text_compiles_or_is_refused_typed(text: str) -> None:
    try:
        compiled = compile_pattern(text)
    except PatternError:
        return
    assert compiled.run("ab" * 8)[1] <= 16
