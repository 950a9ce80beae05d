"""Protocol declarations (spec/declarations.md): one source from which the grammar and the
schema are derived, the shipped request/v1 rebuilt from one, the schema checked against a
hand-written grammar, the limits at N and N+1, and hostile declarations."""

from __future__ import annotations

from pathlib import Path

import pytest
from grammar_bodies import bodies
from hypothesis import event, given, settings, strategies as st
from strategies import mutate_tokens
from test_protocol import TOKENS

import cbcl
from cbcl.cli import main
from cbcl.descriptor import (
    GrammarLimits,
    check_schema_against_grammar,
    diff_descriptors,
    read_declaration,
    read_descriptor,
)
from cbcl.grammar._subset import read_grammar
from cbcl.protocol._schema import MAX_TYPE_DEPTH

ROOT = Path(__file__).parent.parent
DESCRIPTORS = ROOT / "descriptors"
REQUEST_DECLARATION = (DESCRIPTORS / "declarations" / "request-v1.cbcl").read_bytes()
#: request/v1 version 1, hand-written (its grammar file and sections), kept to show that the
#: version built from the declaration accepts exactly what it did (spec/declarations.md §4).
REQUEST_SHIPPED = (DESCRIPTORS / "history" / "request-v1.version-1.cbcl").read_bytes()

AUCTION = """\
(protocol-declaration
  (id auction/v1)
  (version 3)
  (intent REQUEST
    (record ask
      (:item (string :min-length 1 :max-length 16) required)
      (:quantity (integer :min 1 :max 5) required)
      (:express boolean)
      (:lines (list-of (record line (:sku symbol required)
                                    (:unit (one-of kg piece) required))
                       :max-length 3))))
  (intent INFORM
    (record offer
      (:price (number :min 0) required)
      (:currency (one-of EUR USD) required)
      (:terms (keys (:days (integer :min 0) required) (:note string)))))
  (intent REFUSE (rule no)
    (record decline (:reason (one-of 1 2 3.5) required))))
"""


def message(intent: str, body: str, ident: str = "auction/v1") -> str:
    return (f'(CBCL/1.0 (message-id "m-1") (sender agent://a) (receiver agent://b) '
            f"(intent {intent}) (protocol {ident}) (body {body}))")


def registry_of(descriptor: bytes) -> cbcl.Registry:
    registry = cbcl.Registry(disk_cache=False, isolate=False)
    registry.load(descriptor, allow_unsigned=True)
    return registry


def accepted(registry: cbcl.Registry, text: str) -> bool:
    try:
        cbcl.parse(text, registry=registry)
    except cbcl.CBCLError:
        return False
    return True


# ------------------------------------------------------------------------------ deriving

def test_a_declaration_derives_grammar_and_schema() -> None:
    declared = read_declaration(AUCTION)
    assert declared.derived and declared.id == cbcl.Symbol("auction/v1")
    assert [(i.value, r) for i, r in declared.starts] == [
        ("REQUEST", "request"), ("INFORM", "inform"), ("REFUSE", "no")]
    assert declared.grammar == (
        "// Derived from a protocol declaration (spec/declarations.md): do not edit.\n"
        'request: "(" "ask" (":item" STRING & ":quantity" INTEGER & [":express" ("true" | '
        '"false")] & [":lines" request_lines]) ")"\n'
        'inform: "(" "offer" (":price" NUMBER & ":currency" ("EUR" | "USD") & '
        '[":terms" inform_terms]) ")"\n'
        'no: "(" "decline" ":reason" NUMBER ")"\n'
        'request_lines: "(" line* ")"\n'
        'inform_terms: "(" (":days" INTEGER & [":note" STRING]) ")"\n'
        'line: "(" "line" (":sku" SYMBOL & ":unit" ("kg" | "piece")) ")"\n')
    assert declared.schema is not None
    assert cbcl.canonical(declared.schema).startswith("(schema (record ask (:item (string")
    assert [(i.value, [cbcl.canonical(r).split()[1] for r in rs])
            for i, rs in declared.records] == [
        ("REQUEST", ["ask"]), ("INFORM", ["offer"]), ("REFUSE", ["decline"])]


def test_the_same_declaration_gives_the_same_bytes() -> None:
    first = cbcl.descriptor_from_declaration(AUCTION)
    assert cbcl.descriptor_from_declaration(AUCTION.encode()) == first
    assert cbcl.descriptor_from_declaration(cbcl.read(AUCTION)) == first  # its value
    spaced = AUCTION.replace("\n  ", "\n      ; a comment\n  ")
    assert cbcl.descriptor_from_declaration(spaced) == first  # layout and comments do not count


def test_derived_descriptor_checks_what_the_declaration_says() -> None:
    registry = registry_of(cbcl.descriptor_from_declaration(AUCTION))
    ok = [("REQUEST", '(ask :quantity 2 :item "x" :lines ((line :unit kg :sku s1)))'),
          ("REQUEST", '(ask :item "x" :quantity 5 :express true)'),
          ("INFORM", "(offer :currency EUR :price 1.50 :terms (:days 3))"),
          ("REFUSE", "(decline :reason 3.5)")]
    refused = [("REQUEST", '(ask :item "x" :quantity 6)'),           # range (schema)
               ("REQUEST", '(ask :item "" :quantity 1)'),            # length (schema)
               ("REQUEST", '(ask :item "x")'),                       # required (grammar)
               ("REQUEST", '(ask :item "x" :quantity 1 :express yes)'),
               ("REQUEST", '(ask :item "x" :quantity 1 :lines ((line :sku a :unit kg) '
                           '(line :sku b :unit kg) (line :sku c :unit kg) '
                           '(line :sku d :unit kg)))'),              # list length (schema)
               ("INFORM", "(offer :currency GBP :price 1)"),         # one-of (grammar)
               ("INFORM", "(offer :currency EUR :price -1)"),
               ("REFUSE", "(decline :reason 2.5)"),                  # one-of (schema)
               ("INFORM", '(ask :item "x" :quantity 1)')]            # another intent's body
    for intent, body in ok:
        assert accepted(registry, message(intent, body)), body
    for intent, body in refused:
        assert not accepted(registry, message(intent, body)), body


def test_shared_records_and_several_per_intent() -> None:
    text = """(protocol-declaration (id s/v1) (version 1)
      (intent INFORM (record done (:id string required)) (record result (:v any)))
      (intent CONFIRM (record done (:id string required))))"""
    declared = read_declaration(text)
    assert declared.grammar.splitlines()[1:] == [
        "inform: done | result", "confirm: done",
        'done: "(" "done" ":id" STRING ")"', 'result: "(" "result" [":v" value] ")"']
    registry = registry_of(declared.build())
    assert accepted(registry, message("CONFIRM", '(done :id "a")', "s/v1"))
    assert accepted(registry, message("INFORM", "(result)", "s/v1"))
    different = text.replace("(intent CONFIRM (record done (:id string required)))",
                             "(intent CONFIRM (record done (:id symbol required)))")
    with pytest.raises(cbcl.DescriptorError, match=r"\$\.intent\[2\]\[2\]: the record "
                       r"\(done …\) is declared differently at \$\.intent\[1\]\[2\]"):
        read_declaration(different)


def test_rule_names_are_made_unique() -> None:
    text = """(protocol-declaration (id s/v1) (version 1)
      (intent INFORM (record inform (:a (keys (:b integer))) (:x (record inform_a))
                                    (:y (record Inform.A)) (:z (record value))))
      (intent QUERY (record query)))"""
    rules = [line.split(":")[0] for line in read_declaration(text).grammar.splitlines()[1:]]
    assert rules == ["inform", "query", "inform_a", "inform_a_2", "inform_a_3", "value_2"]


@pytest.mark.parametrize(("text", "message_"), [
    ("(protocol-descriptor)", r"\$: expected \(protocol-declaration …\)"),
    ("(protocol-declaration (version 1) (intent INFORM (record a)))",
     r"the \(id …\) field is missing"),
    ("(protocol-declaration (id a/v1) (version -1) (intent INFORM (record a)))",
     r"\$\.version: expected an integer from 0"),
    ("(protocol-declaration (id a/v1) (version 1))", "at least one"),
    ("(protocol-declaration (id a/v1) (version 1) (intent SHOUT (record a)))",
     "unknown intent SHOUT"),
    ("(protocol-declaration (id a/v1) (version 1) (intent INFORM))", "declares no record"),
    ("(protocol-declaration (id a/v1) (version 1) (intent INFORM (record a (:x strin))))",
     r"\$\.intent\[1\]\[2\]\[2\]\[1\]: unknown type strin"),
    ("(protocol-declaration (id a/v1) (version 1) (intent INFORM (record a)) (colour red))",
     "unknown field colour"),
    ("(protocol-declaration (id a/v1) (version 1) (version 2) (intent INFORM (record a)))",
     "field version is repeated"),
    (f"(protocol-declaration (id a/v1) (version 1) (intent INFORM (record {'h' * 65})))",
     "the head h+ cannot be a grammar literal"),
    ("(protocol-declaration (id a/v1) (version 1) (intent INFORM (record h "
     f"(:{'k' * 64} integer))))", "the key :k+ cannot be a grammar literal"),
    ("(protocol-declaration (id a/v1) (version 1) (intent INFORM (rule Big) (record a)))",
     "a start rule is a rule name"),
    ("(protocol-declaration (id a/v1) (version 1) (intent INFORM (record a)) "
     "(intent INFORM (record b)))", "intent INFORM is listed twice"),
    ("(protocol-declaration (id a/v1) (version 1) (intent INFORM (rule x) (record a)) "
     "(intent QUERY (rule x) (record b)))",
     r"\$\.intent\[2\]: the start rule x is INFORM's too"),
])
def test_bad_declarations_are_refused(text: str, message_: str) -> None:
    with pytest.raises(cbcl.DescriptorError, match=message_):
        read_declaration(text)


def test_a_declared_conversation_is_checked_and_kept() -> None:
    built = read_descriptor(cbcl.descriptor_from_declaration(REQUEST_DECLARATION))
    shipped = read_descriptor(REQUEST_SHIPPED)
    assert built.conversation == shipped.conversation
    assert built.functions == shipped.functions
    bad = REQUEST_DECLARATION.replace(b"(initial start)", b"(initial nowhere)")
    with pytest.raises(cbcl.DescriptorError):
        cbcl.descriptor_from_declaration(bad)


# ---------------------------------------------------- request/v1, shipped and declared

def test_request_v1_declared_is_the_shipped_language() -> None:
    """The compatibility check (spec/compatibility.md) proves the two descriptors accept
    the same bodies, both ways."""
    report = diff_descriptors(read_descriptor(REQUEST_SHIPPED),
                              read_descriptor(cbcl.descriptor_from_declaration(
                                  REQUEST_DECLARATION)), mode="full")
    assert report.verdict == "compatible", report.render()
    assert read_descriptor(cbcl.descriptor_from_declaration(REQUEST_DECLARATION)).schema \
        == read_descriptor(REQUEST_SHIPPED).schema


_SHIPPED = registry_of(REQUEST_SHIPPED)
_DECLARED_BYTES = cbcl.descriptor_from_declaration(REQUEST_DECLARATION)
_DECLARED = registry_of(_DECLARED_BYTES)
_SOURCES = {
    "shipped": read_descriptor(REQUEST_SHIPPED),
    "declared": read_descriptor(_DECLARED_BYTES),
}


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_request_v1_shipped_and_declared_accept_the_same_messages(data: st.DataObject) -> None:
    """A body drawn from either grammar (for any intent, perhaps edited) is accepted by the
    shipped descriptor exactly when by the declared one, grammar and schema together."""
    which = data.draw(st.sampled_from(sorted(_SOURCES)))
    descriptor = _SOURCES[which]
    intent = data.draw(st.sampled_from(descriptor.intents))
    source = read_grammar(descriptor.grammar, starts=descriptor.start_rules)
    tokens = data.draw(bodies(source, descriptor.starts[intent], TOKENS)).split(" ")
    if data.draw(st.booleans()):
        tokens = mutate_tokens(tokens, data, rounds=2)
    sent = intent if data.draw(st.booleans()) else data.draw(st.sampled_from(
        descriptor.intents))  # or, often, another intent's body
    text = message(sent.value, " ".join(tokens), "request/v1")
    assert accepted(_SHIPPED, text) == accepted(_DECLARED, text), text


# ------------------------------------------------------ a hand-written grammar, checked

GRAMMAR = 'ask: "(" "ask" (":item" SYMBOL & [":n" INTEGER] & [":at" when]) ")"\n' \
          'when: "(" "at" ":ms" INTEGER ")" | "now"\n'


def declared_with(records: str) -> str:
    return (f"(protocol-declaration (id g/v1) (version 1) (grammar {cbcl.canonical(GRAMMAR)})"
            f" (intent REQUEST (rule ask) {records}))")


def test_a_hand_written_grammar_is_kept_and_the_records_checked() -> None:
    declared = read_declaration(declared_with(
        "(record ask (:item (one-of lamp chair) required) (:n (number :min 1)) "
        "(:at (record at (:ms integer required))))"))
    assert not declared.derived and declared.grammar == GRAMMAR
    registry = registry_of(declared.build())
    assert accepted(registry, message("REQUEST", "(ask :item lamp :at (at :ms 5))", "g/v1"))
    assert not accepted(registry, message("REQUEST", "(ask :item desk)", "g/v1"))


@pytest.mark.parametrize(("records", "wanted"), [
    ("(record ask (:item string required))",
     r"\$\.intent\[1\]\[3\]: field :item of \(ask …\) is a string, but the grammar writes "
     r"symbol there \(grammar rule ask\)"),
    ("(record ask (:price decimal))",
     r"field :price of \(ask …\): the grammar cannot write it \(grammar rule ask\)"),
    ("(record ask (:n decimal))", "is a decimal, but the grammar writes integer"),
    ("(record ask (:at (record at (:ms string))))",
     r"field :ms of \(at …\) is a string, but the grammar writes integer there "
     r"\(grammar rule when\)"),
    ("(record tell (:x any))", r"the grammar writes no list \(tell …\)"),
    ("(record ask (:item (one-of 1 2)))", "is one of 1 2, but the grammar writes symbol"),
])
def test_a_record_the_grammar_contradicts_is_refused_naming_both(records: str,
                                                                 wanted: str) -> None:
    with pytest.raises(cbcl.DescriptorError, match=wanted):
        read_declaration(declared_with(records))


def test_build_descriptor_checks_its_schema_against_its_grammar() -> None:
    with pytest.raises(cbcl.DescriptorError, match=r"schema: \$\.schema\[1\]: field :item"):
        cbcl.build_descriptor("g/v1", 1, "REQUEST=ask", GRAMMAR,
                              schema="(schema (record ask (:item string)))")
    for path in sorted(DESCRIPTORS.glob("*-v1.cbcl")):  # every shipped one agrees
        shipped = read_descriptor(path.read_bytes())
        if shipped.schema is not None:
            check_schema_against_grammar(shipped.grammar, shipped.schema,
                                         starts=shipped.start_rules)


# ------------------------------------------------------------------------------ limits

def _fields(n: int) -> str:
    return " ".join(f"(:k{i} integer)" for i in range(n))


def test_fields_per_record_limit() -> None:
    limit = GrammarLimits().max_set_members
    read_declaration(f"(protocol-declaration (id a/v1) (version 1) "
                     f"(intent INFORM (record a {_fields(limit)})))")
    with pytest.raises(cbcl.DescriptorError, match="more than 32 fields"):
        read_declaration(f"(protocol-declaration (id a/v1) (version 1) "
                         f"(intent INFORM (record a {_fields(limit + 1)})))")


def _nested(depth: int) -> str:
    """A record whose types nest ``depth`` levels in all (the record is the first, the
    innermost atom the last)."""
    inner = "integer"
    for _ in range(depth - 2):
        inner = f"(list-of {inner})"
    return f"(protocol-declaration (id a/v1) (version 1) (intent INFORM (record a (:x {inner}))))"


def test_type_depth_limit() -> None:
    read_declaration(_nested(MAX_TYPE_DEPTH))
    with pytest.raises(cbcl.DescriptorError, match=f"nested more than {MAX_TYPE_DEPTH} deep"):
        read_declaration(_nested(MAX_TYPE_DEPTH + 1))


def test_rule_count_limit() -> None:
    text = "(protocol-declaration (id a/v1) (version 1) (intent INFORM (record a {})))".format(
        " ".join(f"(:k{i} (keys (:v{i} integer)))" for i in range(4)))
    assert len(read_declaration(text).grammar.splitlines()) - 1 == 5  # inform and four keys
    read_declaration(text, grammar_limits=GrammarLimits(max_rules=5))
    with pytest.raises(cbcl.DescriptorError, match=r"more than 4 rules \(GrammarLimits"):
        read_declaration(text, grammar_limits=GrammarLimits(max_rules=4))


def test_derived_text_size_limit() -> None:
    size = len(read_declaration(AUCTION).grammar.encode())
    read_declaration(AUCTION, grammar_limits=GrammarLimits(max_text_bytes=size))
    with pytest.raises(cbcl.DescriptorError, match=f"over {size - 1} bytes"):
        read_declaration(AUCTION, grammar_limits=GrammarLimits(max_text_bytes=size - 1))


def test_declaration_size_is_the_readers_limit() -> None:
    size = len(AUCTION.encode())
    read_declaration(AUCTION, limits=cbcl.Limits(max_message_bytes=size))
    with pytest.raises(cbcl.LimitError):
        read_declaration(AUCTION, limits=cbcl.Limits(max_message_bytes=size - 1))


# ------------------------------------------------------------------ hostile declarations

_ATOMS = st.sampled_from(["integer", "string", "symbol", "any", "boolean", "(one-of a b)",
                          "(one-of 1 2.5 x)", "(integer :min 1)", "(list-of integer)",
                          "(keys (else any))", "strin", "(record)", '"x"', "7", ":k"])


def _types(depth: int) -> st.SearchStrategy[str]:
    if depth == 0:
        return _ATOMS
    inner = _types(depth - 1)
    field = st.tuples(st.sampled_from([":a", ":b", ":c", "x", ":é"]), inner,
                      st.sampled_from(["", " required", " optional"])).map(
        lambda t: f"({t[0]} {t[1]}{t[2]})")
    return st.one_of(
        _ATOMS, inner.map(lambda t: f"(list-of {t})"),
        st.lists(field, max_size=4).map(lambda fs: f"(keys {' '.join(fs)})"),
        st.tuples(st.sampled_from(["r", "s", "a b", "1"]), st.lists(field, max_size=4)).map(
            lambda t: f"(record {t[0]} {' '.join(t[1])})"))


@settings(max_examples=200, deadline=None)
@given(intents=st.lists(st.tuples(st.sampled_from(["INFORM", "QUERY", "PROPOSE", "NOPE"]),
                                  st.lists(_types(3), min_size=0, max_size=3)),
                        min_size=0, max_size=3),
       extra=st.sampled_from(["", "(version 2)", '(grammar "body: value")', "(expires 1)",
                              "(conversation)", "(functions + -)"]))
def test_any_declaration_gives_a_descriptor_or_a_typed_error(
        intents: list[tuple[str, list[str]]], extra: str) -> None:
    text = "(protocol-declaration (id a/v1) (version 1) {} {})".format(
        " ".join(f"(intent {name} {' '.join(types)})" for name, types in intents), extra)
    try:
        payload = cbcl.descriptor_from_declaration(text)
    except cbcl.CBCLError:
        return
    assert payload == cbcl.descriptor_from_declaration(text)  # deterministic
    registry_of(payload)  # and it loads


# ------------------------------------------------------------------------------ the CLI

def test_cli_builds_a_declaration(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    source = tmp_path / "auction.cbcl"
    source.write_text(AUCTION)
    out = tmp_path / "d.cbcl"
    assert main(["descriptor", "build", str(source), "-o", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {out}: auction/v1 version 3 sha256:")
    assert out.read_bytes() == cbcl.descriptor_from_declaration(AUCTION)
    with pytest.raises(SystemExit) as exited:
        main(["descriptor", "build", str(source), "--id", "x/v1", "-o", str(out)])
    assert exited.value.code == 2
    assert "a declaration holds these" in capsys.readouterr().err
    source.write_text(AUCTION.replace("(one-of kg piece)", "(one-of kg kg)"))
    assert main(["descriptor", "build", str(source), "-o", str(out)]) != 0
    assert f"{source}: " in capsys.readouterr().err


# ------------------------------------------- random declarations: grammar ⊇ schema, LR(1)

_VALID_ATOMS = st.sampled_from([
    "string", "(string :min-length 1 :max-length 8)", "integer", "(integer :min 0 :max 9)",
    "decimal", "(number :min 0)", "symbol", "(symbol :max-length 3)", "keyword", "uri",
    "(uri :scheme agent)", "boolean", "any", "(one-of a b c)", "(one-of 1 2 3)",
    '(one-of "x" y 2)', "(one-of :k :j)", "(one-of 1 2.5)", "(one-of true)"])
_KEYS = [":a", ":b", ":c", ":d"]


def _valid_types(depth: int) -> st.SearchStrategy[str]:
    if depth == 0:
        return _VALID_ATOMS
    inner = _valid_types(depth - 1)
    fields = st.lists(st.tuples(st.sampled_from(_KEYS), inner, st.booleans()),
                      max_size=4, unique_by=lambda f: f[0]).map(
        lambda fs: " ".join(f"({k} {t}{' required' if r else ''})" for k, t, r in fs))
    return st.one_of(
        _VALID_ATOMS,
        st.tuples(inner, st.sampled_from(["", " :max-length 3", " :min-length 1"])).map(
            lambda t: f"(list-of {t[0]}{t[1]})"),
        fields.map(lambda f: f"(keys {f})"),
        inner.map(lambda t: f"(keys (else {t}))"),
        st.tuples(st.sampled_from(["r", "s", "r s", "true"]), fields).map(
            lambda t: f"(record {t[0]} {t[1]})"))


@st.composite
def declarations(draw: st.DrawFn) -> str:
    intents = draw(st.lists(st.sampled_from(["INFORM", "QUERY", "PROPOSE", "NOT-UNDERSTOOD"]),
                            min_size=1, max_size=3, unique=True))
    parts, n = [], 0
    for intent in intents:
        records = []
        for _ in range(draw(st.integers(1, 2))):
            fields = draw(st.lists(st.tuples(st.sampled_from(_KEYS), _valid_types(2),
                                             st.booleans()),
                                   max_size=4, unique_by=lambda f: f[0]))
            shown = " ".join(f"({k} {t}{' required' if r else ''})" for k, t, r in fields)
            records.append(f"(record h{n} {shown})")
            n += 1
        parts.append(f"(intent {intent} {' '.join(records)})")
    return f"(protocol-declaration (id rnd/v1) (version 1) {' '.join(parts)})"


def _draw_value(draw: st.DrawFn, t: object, depth: int = 0) -> cbcl.Value:
    """A value shaped by compiled type ``t``, often but not always one the schema
    accepts (small ranges of each kind, optional keys sometimes, any order)."""
    from cbcl.protocol._schema import AtomType, Keys, ListOf, OneOf, Record

    if isinstance(t, OneOf):
        return draw(st.sampled_from(t.values))
    if isinstance(t, AtomType):
        kinds: dict[str, st.SearchStrategy[cbcl.Value]] = {
            "string": st.text("ab ", max_size=9), "integer": st.integers(-2, 11),
            "decimal": st.sampled_from([cbcl.read("0.5"), cbcl.read("-1.0")]),
            "number": st.sampled_from([3, cbcl.read("2.5"), -1]),
            "symbol": st.sampled_from([cbcl.Symbol("a"), cbcl.Symbol("abcd")]),
            "keyword": st.just(cbcl.Keyword("k")),
            "uri": st.sampled_from([cbcl.URI("agent://x"), cbcl.URI("https://y")]),
            "boolean": st.sampled_from([cbcl.Symbol("true"), cbcl.Symbol("false")]),
            "any": st.sampled_from([1, "s", cbcl.Symbol("q"), (cbcl.Symbol("z"), 1)])}
        return draw(kinds[t.kind])
    if isinstance(t, ListOf):
        return tuple(_draw_value(draw, t.item, depth + 1)
                     for _ in range(draw(st.integers(0, 4 if depth < 4 else 0))))
    keys = t.keys if isinstance(t, Record) else t
    assert isinstance(keys, Keys)
    chosen = [k for k in keys.fields if k in keys.required or draw(st.booleans())]
    if keys.other is not None and draw(st.booleans()):
        chosen.append(cbcl.Keyword("zz"))
    out: list[cbcl.Value] = list(t.heads) if isinstance(t, Record) else []
    for key in draw(st.permutations(chosen)):
        child = keys.fields.get(key, keys.other)
        out += [key, _draw_value(draw, child, depth + 1)]
    return tuple(out)


def _heads_by_intent(text: str) -> dict[cbcl.Intent, set[cbcl.Symbol]]:
    """The first head of each record each intent of the declaration ``text`` lists."""
    found: dict[cbcl.Intent, set[cbcl.Symbol]] = {}
    declaration = cbcl.read(text)
    assert isinstance(declaration, tuple)
    for item in declaration[1:]:
        if isinstance(item, tuple) and item[0] == cbcl.Symbol("intent"):
            found[cbcl.Intent(str(item[1]))] = {
                part[1] for part in item[2:] if isinstance(part, tuple)
                and part[0] == cbcl.Symbol("record") and isinstance(part[1], cbcl.Symbol)}
    return found


@settings(max_examples=150, deadline=None)
@given(text=declarations(), data=st.data())
def test_random_declarations_build_and_their_grammar_takes_what_their_schema_does(
        text: str, data: st.DataObject) -> None:
    """Every well-formed declaration derives an LR(1) grammar (the build compiles it), and
    a body that the schema accepts is accepted by the descriptor, grammar and schema
    together, for exactly the intents that declare its record: the derived grammar never
    refuses what the schema says, and never takes another intent's body."""
    from cbcl.protocol._schema import check_schema, compile_schema

    declared = read_declaration(text)
    registry = registry_of(declared.build())
    assert declared.schema is not None
    schema = compile_schema(declared.schema)
    heads = _heads_by_intent(text)
    for record in schema.records:
        body = data.draw(st.composite(lambda draw, r=record: _draw_value(draw, r))())
        try:
            check_schema(schema, body)
        except cbcl.SchemaError:
            event("a body the schema refuses")
            continue
        event("a body the schema accepts")
        for intent, _rule in declared.starts:
            sent = message(intent.value, cbcl.canonical(body), "rnd/v1")
            assert accepted(registry, sent) == (record.heads[0] in heads[intent]), sent


@pytest.mark.slow
def test_a_declaration_at_the_grammar_limits_builds_in_bounded_work() -> None:
    """Fifteen intents, each a record of ten nested keyword lists of distinct one-ofs: 166
    derived rules, compiled and checked; one more field each and the derived grammar passes
    GrammarLimits.max_productions, refused before anything is compiled. CPU time of this
    process, with a wide margin (about 0.7 s on a quiet machine)."""
    import time

    def declaration(fields: int) -> str:
        parts = []
        for j, intent in enumerate(list(cbcl.Intent)[:15]):
            keys = " ".join(
                f"(:k{i} (keys " + " ".join(f"(:k{m} (one-of a{j} b{i}))" for m in range(3))
                + "))" for i in range(fields))
            parts.append(f"(intent {intent.value} (record h{j} {keys}))")
        return f"(protocol-declaration (id big/v1) (version 1) {' '.join(parts)})"

    started = time.process_time()
    declared = read_declaration(declaration(10))
    assert len(declared.grammar.splitlines()) - 1 == 15 + 15 * 10
    declared.build()
    with pytest.raises(cbcl.GrammarError, match="max_productions"):
        read_declaration(declaration(16)).build()
    assert time.process_time() - started < 30


def test_literal_length_limit() -> None:
    """A head, or a key with its colon, is a literal of at most max_literal_chars (64)."""
    limit = GrammarLimits().max_literal_chars
    ok = f"(protocol-declaration (id a/v1) (version 1) (intent INFORM (record {'h' * limit} " \
         f"(:{'k' * (limit - 1)} integer))))"
    read_declaration(ok)
    with pytest.raises(cbcl.DescriptorError, match="max_literal_chars"):
        read_declaration(ok.replace("h" * limit, "h" * (limit + 1)))
    with pytest.raises(cbcl.DescriptorError, match="max_literal_chars"):
        read_declaration(ok.replace("k" * (limit - 1), "k" * limit))
    long_symbol = "s" * (limit + 1)  # a one-of symbol too long for a literal: SYMBOL
    assert 'SYMBOL' in read_declaration(
        f"(protocol-declaration (id a/v1) (version 1) (intent INFORM (record h "
        f"(:x (one-of a {long_symbol})))))").grammar


def test_check_steps_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The schema-against-grammar check takes at most MAX_CHECK_STEPS steps: a check that
    takes N passes with the limit at N and is refused at N − 1."""
    from cbcl.protocol import _agreement
    from cbcl.protocol._schema import compile_schema

    shipped = read_descriptor((DESCRIPTORS / "contract-net-v1.cbcl").read_bytes())
    assert shipped.schema is not None
    records = [(r, f"$.schema[{i}]")
               for i, r in enumerate(compile_schema(shipped.schema).records, 1)]
    steps = _agreement.check_records(shipped.grammar, shipped.start_rules, records, None,
                                     "schema")
    assert 0 < steps < _agreement.MAX_CHECK_STEPS
    monkeypatch.setattr(_agreement, "MAX_CHECK_STEPS", steps)
    check_schema_against_grammar(shipped.grammar, shipped.schema, starts=shipped.start_rules)
    monkeypatch.setattr(_agreement, "MAX_CHECK_STEPS", steps - 1)
    with pytest.raises(cbcl.DescriptorError, match=f"more than {steps - 1} steps"):
        check_schema_against_grammar(shipped.grammar, shipped.schema,
                                     starts=shipped.start_rules)


def test_the_check_is_linear_enough_for_the_largest_grammars() -> None:
    """256 rules, each a record of one list with a key, and a schema of 255 records: the
    check stays far inside its step budget (the places are indexed once)."""
    from cbcl.protocol import _agreement
    from cbcl.protocol._schema import compile_schema

    rules = ["body: " + " | ".join(f"r{i}" for i in range(255))]
    rules += [f'r{i}: "(" "h{i}" ":k" INTEGER ")"' for i in range(255)]
    schema = "(schema " + " ".join(f"(record h{i} (:k (integer :min 0)))"
                                   for i in range(255)) + ")"
    records = [(r, "$") for r in compile_schema(cbcl.read(schema)).records]
    steps = _agreement.check_records("\n".join(rules) + "\n", ("body",), records, None,
                                     "schema")
    assert steps < 5_000
