"""Compatibility between descriptor versions (spec/compatibility.md): known answers, the
limits, the CLI, and a property: where ``diff`` says compatible, no OLD body is refused by
NEW.

Tests internals too: the checker's verdicts, its body checker and body generator
(``cbcl.protocol._compat``)."""

from __future__ import annotations

import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

import cbcl
from cbcl import DescriptorError, GrammarError, Intent, Keyword, Symbol, Value
from cbcl.core._canonical import quote
from cbcl.descriptor import CompatLimits, ProtocolDescriptor, diff_descriptors, read_descriptor
from cbcl.grammar._subset import read_grammar
from cbcl.protocol._compat import BREAKING, COMPATIBLE, UNKNOWN, _Checker, generate_bodies


def descriptor(grammar: str, intents: str = "REQUEST", schema: str = "",
               version: int = 1) -> bytes:
    section = f" {schema}" if schema else ""
    return (f"(protocol-descriptor (id p/v1) (version {version}) (intents {intents}) "
            f"(grammar {quote(grammar)}){section})").encode()


def verdict(old: bytes, new: bytes, **kw: object) -> str:
    return diff_descriptors(old, new, **kw).verdict  # type: ignore[arg-type]


def assert_witness(report_text: str, old: bytes, new: bytes) -> None:
    """Every witness the report gives is accepted by one side and refused by the other."""
    report = diff_descriptors(old, new)
    assert report.verdict == BREAKING
    assert report.witnesses
    sides = {"old": _Checker(read_descriptor(old)), "new": _Checker(read_descriptor(new))}
    for witness in report.witnesses:
        other = "new" if witness.accepted_by == "old" else "old"
        assert sides[witness.accepted_by].accepts(witness.intent, witness.body)
        assert not sides[other].accepts(witness.intent, witness.body)
        assert witness.text in report.render()
    assert report_text in report.render()


ASK = 'body: "(" "ask" ":item" STRING [":note" STRING] ")"\n'


# --------------------------------------------------------------------------- known answers


def test_optional_member_added_is_backward_compatible() -> None:
    old = descriptor(ASK)
    new = descriptor('body: "(" "ask" ":item" STRING [":note" STRING] [":qty" INTEGER] ")"\n',
                     version=2)
    report = diff_descriptors(old, new)
    assert report.verdict == COMPATIBLE
    assert report.exit_code == 0
    assert report.render().startswith("compatible\n")
    assert "rule changed: body" in report.render()
    # ... and not forward compatible: NEW sends :qty, OLD refuses it
    forward = diff_descriptors(old, new, mode="forward")
    assert forward.verdict == BREAKING
    assert forward.witnesses[0].accepted_by == "new"
    assert ":qty" in forward.witnesses[0].text


def test_required_member_added_is_breaking_with_witness() -> None:
    old = descriptor(ASK)
    new = descriptor('body: "(" "ask" ":item" STRING [":note" STRING] ":qty" INTEGER ")"\n')
    assert_witness('witness REQUEST: accepted by OLD, refused by NEW: (ask :item "")', old,
                   new)
    assert diff_descriptors(old, new).exit_code == 5


def test_identical_descriptors_are_fully_compatible() -> None:
    old = descriptor(ASK)
    report = diff_descriptors(old, old, mode="full")
    assert report.verdict == COMPATIBLE
    assert report.render() == ("compatible\nmode: full (both accept the same bodies)\n"
                               "changes: none\n")


def test_one_of_narrowed_is_breaking_widened_is_compatible() -> None:
    grammar = 'body: "(" "offer" ":currency" SYMBOL ")"\n'
    wide = descriptor(grammar, schema="(schema (record offer (:currency (one-of EUR USD GBP) "
                                      "required)))")
    narrow = descriptor(grammar, schema="(schema (record offer (:currency (one-of EUR USD) "
                                        "required)))")
    assert_witness("(offer :currency GBP)", wide, narrow)
    assert verdict(narrow, wide) == COMPATIBLE
    assert "one of EUR USD GBP -> one of EUR USD" in diff_descriptors(wide, narrow).render()


def test_keyword_set_members() -> None:
    old = descriptor('body: "(" "bid" (":item" STRING & ":amount" NUMBER) ")"\n')
    optional = descriptor(
        'body: "(" "bid" (":item" STRING & ":amount" NUMBER & [":note" STRING]) ")"\n')
    required = descriptor(
        'body: "(" "bid" (":item" STRING & ":amount" NUMBER & ":note" STRING) ")"\n')
    assert verdict(old, optional) == COMPATIBLE
    report = diff_descriptors(old, optional)
    assert "keyword set 1 of body: member :note added (optional)" in report.render()
    assert_witness("keyword set 1 of body: member :note added (required)", old, required)
    # Any order is accepted by both: the same set written in another order is the same
    reordered = descriptor('body: "(" "bid" (":amount" NUMBER & ":item" STRING) ")"\n')
    assert verdict(old, reordered, mode="full") == COMPATIBLE
    # A fixed order does not cover the set
    fixed = descriptor('body: "(" "bid" ":item" STRING ":amount" NUMBER ")"\n')
    assert verdict(fixed, old) == COMPATIBLE
    assert_witness(":item \"\")", old, fixed)


def test_number_narrowed_to_integer() -> None:
    old = descriptor('body: "(" "bid" NUMBER ")"\n')
    new = descriptor('body: "(" "bid" INTEGER ")"\n')
    assert_witness("(bid 0.0)", old, new)
    assert verdict(new, old) == COMPATIBLE


def test_rule_made_recursive() -> None:
    flat = descriptor('body: expr\nexpr: "(" "lit" INTEGER ")"\n')
    recursive = descriptor('body: expr\nexpr: "(" "lit" INTEGER ")" | "(" "add" expr expr ")"\n')
    assert verdict(flat, recursive) == COMPATIBLE
    assert_witness("(add (lit 0) (lit 0))", recursive, flat)
    # deeper recursion: nesting bounded differently
    two = descriptor('body: expr\nexpr: "(" "lit" INTEGER ")" | "(" "neg" lit ")"\n'
                     'lit: "(" "lit" INTEGER ")"\n')
    rec = descriptor('body: expr\nexpr: "(" "lit" INTEGER ")" | "(" "neg" expr ")"\n')
    assert verdict(two, rec) == COMPATIBLE
    assert_witness("(neg (neg (lit 0)))", rec, two)


def test_horizontal_linear_recursion_is_decided() -> None:
    star = descriptor('body: "(" "list" INTEGER* ")"\n')
    right = descriptor('body: "(" "list" items ")"\nitems: | INTEGER items\n')
    left = descriptor('body: "(" "list" items ")"\nitems: | items INTEGER\n')
    assert verdict(star, right, mode="full") == COMPATIBLE
    assert verdict(star, left, mode="full") == COMPATIBLE
    even = descriptor('body: "(" "list" pairs ")"\npairs: | INTEGER INTEGER pairs\n')
    assert verdict(even, star) == COMPATIBLE
    assert_witness("(list 0)", star, even)


def test_self_embedding_is_unknown_with_search() -> None:
    # balanced: a^n b^n in one list is not a regular horizontal language
    old = descriptor('body: "(" "s" anbn ")"\nanbn: | "a" anbn "b"\n')
    new = descriptor('body: "(" "s" anbn ")"\nanbn: | "a" anbn "b" | "c"\n')
    report = diff_descriptors(old, new)
    assert report.verdict == UNKNOWN
    assert report.exit_code == 5
    text = report.render()
    assert text.startswith("unknown\n")
    assert "refer to themselves in sequence position" in text
    assert "search:" in text and "no witness found" in text
    # ... but a witness found by the search is a proof of breaking
    smaller = descriptor('body: "(" "s" anbn ")"\nanbn: | "a" "b"\n')
    found = diff_descriptors(old, smaller)
    assert found.verdict == BREAKING
    assert found.witnesses


def test_unbalanced_alternative_is_unknown() -> None:
    old = descriptor('body: open INTEGER ")"\nopen: "(" "n"\n')
    report = diff_descriptors(old, old)
    assert report.verdict == UNKNOWN
    assert "parentheses not balanced" in report.render()


def test_grammar_not_lalr_is_never_compatible() -> None:
    ambiguous = descriptor('body: "(" ("x" | SYMBOL) ")"\n')
    report = diff_descriptors(ambiguous, ambiguous)
    assert report.verdict == UNKNOWN
    assert "not LALR(1)" in report.render()


def test_intent_removed_and_added() -> None:
    old = descriptor(ASK, intents="REQUEST INFORM")
    new = descriptor(ASK, intents="REQUEST CONFIRM")
    report = diff_descriptors(old, new)
    assert report.verdict == BREAKING
    assert [w.intent for w in report.witnesses] == [Intent.INFORM]
    assert "intent removed: INFORM" in report.render()
    assert "intent added: CONFIRM" in report.render()
    assert verdict(descriptor(ASK), old) == COMPATIBLE


def test_per_intent_start_rules() -> None:
    grammar = ('body: ask\nask: "(" "ask" STRING ")"\n'
               'offer: "(" "offer" INTEGER ")"\n')
    old = descriptor(grammar, intents="REQUEST (INFORM offer)")
    same = descriptor(grammar + 'other: "(" "offer" DECIMAL ")"\n',
                      intents="REQUEST (INFORM offer) (CONFIRM other)")
    assert verdict(old, same) == COMPATIBLE
    swapped = descriptor(grammar, intents="(REQUEST offer) (INFORM ask) CONFIRM")
    report = diff_descriptors(old, swapped)
    assert report.verdict == BREAKING
    assert {w.intent for w in report.witnesses} == {Intent.REQUEST, Intent.INFORM}
    assert "intent INFORM: start rule offer -> ask" in report.render()


def test_schema_ranges_and_lengths() -> None:
    grammar = 'body: "(" "ask" ":qty" INTEGER ":item" STRING ")"\n'

    def with_schema(qty: str, item: str) -> bytes:
        return descriptor(grammar, schema=f"(schema (record ask (:qty {qty} required) "
                                          f"(:item {item} required)))")

    base = with_schema("(integer :min 1 :max 1000)", "(string :min-length 1)")
    assert verdict(base, with_schema("(integer :min 0)", "string")) == COMPATIBLE
    assert_witness("(ask :qty 1000 :item \"", base,
                   with_schema("(integer :min 1 :max 999)", "(string :min-length 1)"))
    assert_witness(':item "a")', base,
                   with_schema("(integer :min 1 :max 1000)", "(string :min-length 2)"))
    # the 64-bit range is the integers' domain: a bound at its edge changes nothing
    assert verdict(descriptor(grammar), with_schema(
        "(integer :max 9223372036854775807)", "string"), mode="full") == COMPATIBLE
    # decimals and numbers
    dec = 'body: "(" "p" ":x" NUMBER ")"\n'
    low = descriptor(dec, schema="(schema (record p (:x (number :min 0.5) required)))")
    high = descriptor(dec, schema="(schema (record p (:x (number :min 1) required)))")
    assert verdict(high, low) == COMPATIBLE
    assert_witness("(p :x 0.", low, high)


def test_schema_required_keys_and_else() -> None:
    grammar = 'body: "(" "cmd" (KEYWORD value)* ")"\n'
    loose = descriptor(grammar)
    open_keys = descriptor(grammar, schema="(schema (record cmd (else any)))")
    needs_id = descriptor(grammar, schema="(schema (record cmd (:id string required) "
                                          "(else any)))")
    assert verdict(open_keys, loose) == COMPATIBLE
    # a repeated unnamed key: the grammar takes it, (else any) does not
    assert_witness("(cmd :m0 a :m0 a)", loose, open_keys)
    assert verdict(needs_id, open_keys) == COMPATIBLE
    assert_witness("(cmd)", open_keys, needs_id)


def test_schema_added_removed_and_records() -> None:
    grammar = 'body: "(" "a" ":n" INTEGER ")" | "(" "b" ":n" INTEGER ")"\n'
    plain = descriptor(grammar)
    schema = descriptor(grammar, schema="(schema (record b (:n (integer :min 0) required)))")
    assert verdict(schema, plain) == COMPATIBLE
    report = diff_descriptors(plain, schema)
    assert report.verdict == BREAKING
    assert "schema added" in report.render()
    assert "(b :n -1)" in report.render()


def test_value_and_lists_of() -> None:
    anything = descriptor('body: "(" "put" value ")"\n')
    numbers = descriptor('body: "(" "put" "(" INTEGER* ")" ")"\n')
    assert verdict(numbers, anything) == COMPATIBLE
    assert_witness("witness REQUEST: accepted by OLD, refused by NEW: (put ", anything,
                   numbers)
    grammar = 'body: "(" "put" ":xs" "(" INTEGER* ")" ")"\n'
    short = descriptor(grammar, schema="(schema (record put (:xs (list-of integer "
                                       ":max-length 2) required)))")
    longer = descriptor(grammar, schema="(schema (record put (:xs (list-of integer "
                                        ":max-length 3) required)))")
    assert verdict(short, longer) == COMPATIBLE
    assert_witness("(put :xs (0 0 0))", longer, short)


def test_literal_symbol_is_also_data() -> None:
    # SYMBOL accepts the symbol "ask" where the grammar cannot shift the literal
    old = descriptor('body: "(" "tag" "ask" ")"\n')
    new = descriptor('body: "(" "tag" SYMBOL ")"\n')
    assert verdict(old, new) == COMPATIBLE
    assert_witness("(tag", new, old)


# --------------------------------------------------------------------------- limits


def members(n: int) -> bytes:
    inner = " & ".join(f'":k{i}" INTEGER' for i in range(n))
    return descriptor(f'body: "(" "m" ({inner}) ")"\n')


def test_max_members_accepted_and_refused() -> None:
    limits = CompatLimits(max_members=4)
    assert diff_descriptors(members(4), members(4), limits=limits).verdict == COMPATIBLE
    report = diff_descriptors(members(5), members(5), limits=limits)
    assert report.verdict == UNKNOWN
    assert "more than max_members, 4" in report.render()


def test_max_states_accepted_and_refused() -> None:
    d = descriptor(ASK)
    needed = diff_descriptors(d, d).explored[0]
    assert diff_descriptors(d, d, limits=CompatLimits(max_states=needed)).verdict == COMPATIBLE
    report = diff_descriptors(d, d, limits=CompatLimits(max_states=needed - 1))
    assert report.verdict == UNKNOWN
    assert "(max_states)" in report.render()


def test_max_nfa_states_and_steps() -> None:
    d = descriptor(ASK)
    assert "(max_nfa_states)" in diff_descriptors(
        d, d, limits=CompatLimits(max_nfa_states=5)).render()
    assert "(max_steps)" in diff_descriptors(d, d, limits=CompatLimits(max_steps=3)).render()


def test_max_witness_nodes() -> None:
    old = descriptor('body: "(" "a" "(" "b" "(" "c" ")" ")" ")"\n')
    new = descriptor('body: "(" "z" ")"\n')
    # (a (b (c))): 6 nodes
    assert diff_descriptors(old, new, limits=CompatLimits(max_witness_nodes=6)).verdict \
        == BREAKING
    report = diff_descriptors(old, new, limits=CompatLimits(max_witness_nodes=5))
    assert report.verdict == UNKNOWN
    assert "more than max_witness_nodes, 5" in report.render()


def test_max_atom_chars() -> None:
    grammar = 'body: "(" "s" STRING ")"\n'
    schema = "(schema (record s (:x (string :min-length 10))))"
    d = descriptor(grammar, schema=schema)
    # lengths 0-9, 10, and 11 or more: a class needs a string of 11 characters
    assert diff_descriptors(d, d, limits=CompatLimits(max_atom_chars=11)).verdict == COMPATIBLE
    report = diff_descriptors(d, d, limits=CompatLimits(max_atom_chars=10))
    assert report.verdict == UNKNOWN
    assert "max_atom_chars" in report.render()


def test_search_limits_are_honoured() -> None:
    old = descriptor('body: "(" "s" anbn ")"\nanbn: | "a" anbn "b"\n')
    report = diff_descriptors(old, old, limits=CompatLimits(search_bodies=3))
    assert report.search is not None and report.search.startswith("3 bodies")


def test_limits_validated() -> None:
    with pytest.raises(ValueError, match="max_states"):
        CompatLimits(max_states=0)
    with pytest.raises(ValueError, match="mode"):
        diff_descriptors(descriptor(ASK), descriptor(ASK), mode="sideways")
    with pytest.raises(TypeError):
        diff_descriptors("x", descriptor(ASK))  # type: ignore[arg-type]


def test_unreadable_inputs_raise_typed_errors() -> None:
    with pytest.raises(DescriptorError):
        diff_descriptors(b"(protocol-descriptor)", descriptor(ASK))
    with pytest.raises(GrammarError):
        diff_descriptors(descriptor("body: /x/\n"), descriptor(ASK))


@pytest.mark.slow
def test_hostile_descriptors_answer_quickly() -> None:
    # 2^k inlined copies: r0 -> r1 r1 -> ...; stopped by max_nfa_states
    rules = ["body: \"(\" \"x\" r0 \")\""] + [f"r{i}: r{i + 1} r{i + 1}" for i in range(40)]
    rules.append("r40: INTEGER")
    hostile = descriptor("\n".join(rules) + "\n")
    started = time.process_time()
    report = diff_descriptors(hostile, hostile)
    assert report.verdict == UNKNOWN
    assert time.process_time() - started < 10
    # a keyword set at the member limit, against a fixed order
    big = members(12)
    started = time.process_time()
    report = diff_descriptors(big, big)
    assert report.verdict in (COMPATIBLE, UNKNOWN)
    assert time.process_time() - started < 20


# --------------------------------------------------------------------------- the CLI


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cbcl", *args], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.slow
def test_cli_diff(tmp_path: Path) -> None:
    old, new = tmp_path / "old.cbcl", tmp_path / "new.cbcl"
    old.write_bytes(descriptor(ASK))
    new.write_bytes(descriptor('body: "(" "ask" ":item" STRING ")"\n', version=2))
    done = run_cli("descriptor", "diff", str(old), str(new))
    assert done.returncode == 5, done.stderr
    assert done.stdout.splitlines()[0] == "breaking"
    assert 'witness REQUEST: accepted by OLD, refused by NEW: (ask :item "" :note "")' \
        in done.stdout
    done = run_cli("descriptor", "diff", str(new), str(old))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "compatible"
    done = run_cli("descriptor", "diff", "--mode", "full", str(new), str(old))
    assert done.returncode == 5
    done = run_cli("descriptor", "diff", "--mode", "sideways", str(new), str(old))
    assert done.returncode == 2


def test_cli_diff_signed_and_errors(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from cbcl import sign_descriptor

    key = Ed25519PrivateKey.generate()
    signed = tmp_path / "signed.cbcl"
    signed.write_bytes(sign_descriptor(descriptor(ASK), [("k", key)]))
    plain = tmp_path / "plain.cbcl"
    plain.write_bytes(descriptor(ASK))
    done = run_cli("descriptor", "diff", str(signed), str(plain))
    assert done.returncode == 0, done.stderr
    bad = tmp_path / "bad.cbcl"
    bad.write_bytes(b"(protocol-descriptor (id x))")
    done = run_cli("descriptor", "diff", str(bad), str(plain))
    assert done.returncode == 5
    assert done.stderr.startswith("descriptor")


# --------------------------------------------------------------------------- the property

# Small grammars over one record: a head, then items drawn from a pool; NEW is OLD with
# some items replaced by a variant (wider or narrower), dropped, or added.
_VARIANTS = {
    '":a" INTEGER': ['[":a" INTEGER]', '":a" NUMBER', '":a" DECIMAL'],
    '[":b" STRING]': ['":b" STRING', '[":b" value]', '[":b" SYMBOL]'],
    '":c" NUMBER': ['":c" INTEGER', '[":c" NUMBER]', '":c" value'],
    'INTEGER*': ['INTEGER+', 'NUMBER*', '[INTEGER]'],
    '"(" INTEGER* ")"': ['"(" NUMBER* ")"', '"(" INTEGER INTEGER* ")"', 'value'],
    '":e" ("x" | "y")': ['":e" "x"', '":e" SYMBOL', '":e" ("x" | "y" | "z")'],
    '":h" list': ['":h" value', '[":h" list]'],
    '(":i" STRING & [":j" INTEGER])': ['(":i" STRING & ":j" INTEGER)',
                                       '(":j" INTEGER & [":i" STRING])',
                                       '(":i" STRING & [":j" NUMBER] & [":k" STRING])'],
}
_SCHEMAS = ["", "(schema (record r (:a (integer :min 0))))",
            "(schema (record r (:a (integer :max 5)) (else any)))",
            "(schema (record r (:c (number :min 1.5)) (:i (string :min-length 1))))"]


def _text(items: list[str], recursive: bool) -> str:
    lines = ['body: "(" "r" ' + " ".join(items) + ' ")"']
    if any("list" in item for item in items):
        lines.append('list: "(" INTEGER* ")"' + (' | "(" "l" list ")"' if recursive else ""))
    return "\n".join(lines) + "\n"


@st.composite
def pairs(draw: st.DrawFn) -> tuple[bytes, bytes]:
    keys = list(_VARIANTS)
    items = draw(st.lists(st.sampled_from(keys), min_size=1, max_size=3, unique=True))
    changed = []
    for item in items:
        how = draw(st.integers(0, 5))
        if how == 0 and len(items) > 1:
            continue
        changed.append(draw(st.sampled_from(_VARIANTS[item])) if how <= 2 else item)
    if draw(st.booleans()):
        changed.append(draw(st.sampled_from(['[":z" INTEGER]', '":z" INTEGER'])))
    recursive = draw(st.booleans()), draw(st.booleans())
    schemas = draw(st.sampled_from(_SCHEMAS)), draw(st.sampled_from(_SCHEMAS))
    return (descriptor(_text(items, recursive[0]), schema=schemas[0]),
            descriptor(_text(changed, recursive[1]), schema=schemas[1]))


def _usable(payload: bytes) -> bool:
    checker = _Checker(read_descriptor(payload))
    try:
        checker.accepts(Intent.REQUEST, Symbol("x"))
    except Exception:  # not LALR(1) or unused rules: skip
        return False
    return True


@settings(max_examples=60, deadline=None)
@given(pairs(), st.integers(0, 1000))
def test_compatible_means_no_old_body_refused(pair: tuple[bytes, bytes], seed: int) -> None:
    old, new = pair
    if not (_usable(old) and _usable(new)):
        return
    report = diff_descriptors(old, new)
    if report.verdict != COMPATIBLE:
        assert report.verdict == BREAKING  # these grammars are all regular
        return
    old_d, new_d = read_descriptor(old), read_descriptor(new)
    old_check, new_check = _Checker(old_d), _Checker(new_d)
    source = read_grammar(old_d.grammar)
    atoms: dict[str, list[Value]] = {
        "INTEGER": [0, 1, -1, 5, 6], "DECIMAL": [Decimal("1.5"), Decimal("0.1")],
        "STRING": ["", "s"], "SYMBOL": [Symbol("x"), Symbol("q")],
        "KEYWORD": [Keyword("a"), Keyword("zz")], "value": [0, Symbol("x"), ()]}
    for body in generate_bodies(source, "body", 60, 4, seed=seed, atoms=atoms):
        if old_check.accepts(Intent.REQUEST, body):
            assert new_check.accepts(Intent.REQUEST, body), body


def _declared_order(lines: str = "(one-of kg piece)", length: str = ":max-length 4",
                    head: str = "line", qty: str = "(integer :min 1)") -> ProtocolDescriptor:
    return read_descriptor(cbcl.descriptor_from_declaration(
        "(protocol-declaration (id order/v1) (version 1) (intent REQUEST (record order "
        f"(:lines (list-of (record {head} (:unit {lines} required) (:qty {qty})) {length}) "
        "required))))"))


@pytest.mark.parametrize(("new", "line"), [
    ({"lines": "(one-of kg)"},
     "schema: record order[:lines][*]: field :unit: one of kg piece -> one of kg"),
    ({"qty": "(integer :min 1 :max 9)"},
     "schema: record order[:lines][*]: field :qty: an integer in [1, …] -> an integer in "
     "[1, 9]"),
    ({"length": ":max-length 3"},
     "schema: record order: field :lines: a list of 0 to 4 elements -> a list of 0 to 3 "
     "elements"),
    ({"head": "item"},
     "schema: record order[:lines][*]: elements: (record line …) -> (record item …)"),
])
def test_a_nested_change_is_named_where_it_is(new: dict[str, str], line: str) -> None:
    """A change inside a list-of record's one-of (issue 32) is one line at its place, and
    never the same text on both sides of the arrow."""
    report = diff_descriptors(_declared_order(), _declared_order(**new))
    assert report.verdict == "breaking"
    schema_lines = [c for c in report.changes if c.startswith("schema")]
    assert schema_lines == [line]
    for change in report.changes:
        if " -> " in change:
            before, after = change.split(": ", 2)[-1].split(" -> ", 1)
            assert before != after, change
