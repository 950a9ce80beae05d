"""A declaration's own forms (spec/declarations.md §1.1): members in a fixed order before
the keyword set (``(ordered …)``, with keys or positional), and unions (``(either …)``) —
the grammar derived from them, their projection into the schema, what is refused, the
limits, record classes that say them, and random declarations whose every accepted message
decodes into the ``cbcl codegen`` classes and encodes back byte for byte."""

from __future__ import annotations

import sys
import types
from typing import Annotated, Any

import pytest
from grammar_bodies import bodies
from hypothesis import given, settings, strategies as st
from strategies import mutate_tokens
from test_protocol import TOKENS

import cbcl
from cbcl.descriptor import Declared, GrammarLimits, read_declaration, read_descriptor
from cbcl.grammar._subset import read_grammar
from cbcl.protocol._codegen import generate_records


def declaration(*intents: str) -> str:
    return f"(protocol-declaration (id f/v1) (version 1) {' '.join(intents)})"


def registry_of(descriptor: bytes) -> cbcl.Registry:
    registry = cbcl.Registry(disk_cache=False, isolate=False)
    registry.load(descriptor, allow_unsigned=True)
    return registry


def message(intent: str, body: str, ident: str = "f/v1") -> str:
    return (f'(CBCL/1.0 (message-id "m-1") (sender agent://a) (receiver agent://b) '
            f"(intent {intent}) (protocol {ident}) (body {body}))")


def accepted(registry: cbcl.Registry, text: str) -> bool:
    try:
        cbcl.parse(text, registry=registry)
    except cbcl.CBCLError:
        return False
    return True


UNION = declaration(
    "(intent REFUSE (rule refusal) (record refuse (:id string required)"
    " (:reason (either (one-of busy idle) (record other (ordered string))"
    " (record code (ordered integer symbol) (:note string))) required)))",
    "(intent FAILURE (record error (ordered (:message (string :min-length 1) required)"
    " (:code (integer :min 0 :max 999))) (:detail any)))")


def test_the_grammar_says_the_order_and_the_union_and_the_schema_their_projection() -> None:
    declared = read_declaration(UNION)
    assert declared.grammar.splitlines()[1:] == [
        'refusal: "(" "refuse" (":id" STRING & ":reason" refusal_reason) ")"',
        'failure: "(" "error" ":message" STRING [":code" INTEGER] [":detail" value] ")"',
        'refusal_reason: "busy" | "idle" | other | code',
        'other: "(" "other" STRING ")"',
        'code: "(" "code" INTEGER SYMBOL [":note" STRING] ")"',
    ]
    assert declared.schema == cbcl.read(
        "(schema (record refuse (:id string required) (:reason any required))"
        " (record error (:message (string :min-length 1) required)"
        " (:code (integer :min 0 :max 999)) (:detail any)))")
    registry = registry_of(declared.build())
    for intent, body, ok in [
            ("REFUSE", '(refuse :id "a" :reason busy)', True),
            ("REFUSE", '(refuse :reason (other "x") :id "a")', True),
            ("REFUSE", '(refuse :id "a" :reason (code 3 z :note "n"))', True),
            ("REFUSE", '(refuse :id "a" :reason (code z 3))', False),
            ("REFUSE", '(refuse :id "a" :reason other)', False),
            ("REFUSE", '(refuse :id "a" :reason (other "x" "y"))', False),
            ("FAILURE", '(error :message "m" :code 3 :detail (x))', True),
            ("FAILURE", '(error :message "m" :detail 1)', True),
            ("FAILURE", '(error :code 3 :message "m")', False),  # the order
            ("FAILURE", '(error :message "" :code 3)', False),  # the schema's length
            ("FAILURE", '(error :message "m" :code 1000)', False)]:
        assert accepted(registry, message(intent, body)) == ok, body


@pytest.mark.parametrize(("text", "message_"), [
    ("(record r (:a (either (string :max-length 3) integer)))",
     r"\$\.intent\[1\]\[2\]\[2\]\[1\]\[1\]: .*cannot be checked"),
    ("(record r (:a (either (one-of 1 2) string)))", "one of 1 2 .*checked"),
    ("(record r (:a (either (record s (keys (else any))))))", "else"),
    ("(record r (:a (record s (ordered (integer :min 0)))))", "checked"),
    ("(record r (:a (either (list-of string :max-length 2))))", "length bounds"),
    ("(record r (ordered string))", "positional members"),
    ("(record r (:a string) (ordered (:b string)))", "comes first"),
    ("(record r (:a (ordered (:b string))))", "not a type"),
    ("(record r (ordered (:a string)) (:a integer))", "listed twice"),
    ("(record r (ordered (:a string) (else any)))", "follows the fields"),
    ("(record r (:a (either)))", "at least one"),
])
def test_what_the_grammar_cannot_say_exactly_is_refused(text: str, message_: str) -> None:
    with pytest.raises(cbcl.DescriptorError, match=message_):
        read_declaration(declaration(f"(intent INFORM {text})"))


def test_alternatives_the_checker_cannot_tell_apart_are_a_grammar_error() -> None:
    with pytest.raises(cbcl.GrammarError):
        cbcl.descriptor_from_declaration(declaration(
            "(intent INFORM (record r (:a (either symbol (one-of x y)) required)))"))


def test_members_limit_counts_the_ordered_group() -> None:
    limits = GrammarLimits(max_set_members=4)

    def record(ordered: int, rest: int) -> str:
        group = " ".join(f"(:o{i} string)" for i in range(ordered))
        fields = " ".join(f"(:f{i} string)" for i in range(rest))
        return declaration(f"(intent INFORM (record r (ordered {group}) {fields}))")

    assert read_declaration(record(2, 2), grammar_limits=limits).derived
    with pytest.raises(cbcl.DescriptorError, match="more than 4 fields"):
        read_declaration(record(2, 3), grammar_limits=limits)
    with pytest.raises(cbcl.DescriptorError, match="more than 4 fields"):
        read_declaration(record(5, 0), grammar_limits=limits)


def test_constraints_are_kept_and_checked() -> None:
    rule = ('(constraints (rule named (intents INFORM) (check (has :a))'
            ' (message "an a")))')
    text = declaration("(intent INFORM (record r (:a string) (:b string)))",
                       rule, "(functions =)")
    built = read_descriptor(cbcl.descriptor_from_declaration(text))
    assert built.constraints == cbcl.read(rule)
    registry = registry_of(cbcl.descriptor_from_declaration(text))
    assert accepted(registry, message("INFORM", '(r :a "x")'))
    with pytest.raises(cbcl.ConstraintError, match="an a"):
        cbcl.parse(message("INFORM", '(r :b "x")'), registry=registry)
    bad = declaration("(intent INFORM (record r (:a string)))",
                      rule.replace("INFORM", "QUERY"), "(functions =)")
    with pytest.raises(cbcl.DescriptorError):
        cbcl.descriptor_from_declaration(bad)


# ------------------------------------------------------------------ record classes

class Other(cbcl.Record):
    text: Annotated[cbcl.Value, Declared("(either (record other (ordered string)))")]


class Failure(cbcl.Record, intent="FAILURE", head="error", ordered=2):
    message: Annotated[str, cbcl.Length(1, None)]
    code: Annotated[int, cbcl.Range(0, 999)] | None = None
    detail: Annotated[cbcl.Value, Declared("any")] | None = None


class Refuse(cbcl.Record, intent="REFUSE"):
    id: str
    reason: Annotated[cbcl.Value, Declared(
        "(either (one-of busy idle) (record other (ordered string))"
        " (record code (ordered integer symbol) (:note string)))")]


def test_classes_say_the_order_and_the_union() -> None:
    """``ordered=N`` and a ``Declared`` union make the declaration's own forms: the
    classes build the declaration's descriptor, byte for byte, and decode its messages."""
    built = cbcl.descriptor_from(Refuse, Failure, id="f/v1", version=1,
                                 rules={"REFUSE": "refusal", "FAILURE": "failure"})
    assert built == cbcl.descriptor_from_declaration(UNION)
    registry = registry_of(built)
    got = cbcl.parse(message("FAILURE", '(error :message "m" :code 3)'), registry=registry,
                     type=Failure)
    assert got == Failure(message="m", code=3)
    refusal = Refuse(id="a", reason=(cbcl.Symbol("other"), "x"))
    assert cbcl.canonical(refusal.to_body()) == '(refuse :id "a" :reason (other "x"))'
    with pytest.raises(TypeError, match="ordered="):
        type("Bad", (cbcl.Record,), {"__annotations__": {"a": "str"}}, ordered=2)


def test_codegen_passes_the_grammar_the_schema_cannot_say() -> None:
    built = cbcl.descriptor_from_declaration(UNION)
    source = generate_records(built)
    assert "grammar='// Derived" in source
    module = types.ModuleType("gen_forms")
    sys.modules[module.__name__] = module
    exec(compile(source, "gen_forms.py", "exec"), vars(module))
    assert vars(module)["descriptor"]() == built


# --------------------------------------------------------- random declarations

_EXACT = st.sampled_from(["string", "integer", "symbol", "boolean", "(one-of x y)"])
_UNIONS = st.lists(st.sampled_from([
    "(one-of p q)", "string", "integer", "(record pa (ordered string))",
    "(record pb (ordered integer symbol) (:k string))", "(keys (:m string required))",
    "(list-of integer)", "(record pc (ordered (:z boolean required)) (:y (one-of x y)))"]),
    min_size=1, max_size=4, unique=True).map(lambda ts: f"(either {' '.join(ts)})")
_FIELD_TYPES = st.one_of(
    st.sampled_from(["string", "(string :max-length 4)", "(integer :min 0 :max 9)", "any",
                     "(one-of a b)", "(list-of symbol :max-length 2)", "(keys (else any))"]),
    _UNIONS,
    _EXACT.map(lambda t: f"(record pos (ordered {t} {t}))"),
    _UNIONS.map(lambda t: f"(list-of {t})"))
_KEYS = [":a", ":b", ":c", ":d", ":e"]


@st.composite
def form_declarations(draw: st.DrawFn) -> str:
    intents = draw(st.lists(st.sampled_from(["INFORM", "QUERY", "PROPOSE"]), min_size=1,
                            max_size=2, unique=True))
    parts = []
    for n, intent in enumerate(intents):
        fields = draw(st.lists(st.tuples(st.sampled_from(_KEYS), _FIELD_TYPES, st.booleans()),
                               min_size=1, max_size=4, unique_by=lambda f: f[0]))
        shown = [f"({k} {t}{' required' if r else ''})" for k, t, r in fields]
        cut = draw(st.integers(0, len(shown)))
        group = f"(ordered {' '.join(shown[:cut])}) " if cut else ""
        parts.append(f"(intent {intent} (record h{n} {group}{' '.join(shown[cut:])}))")
    return declaration(*parts)


@pytest.mark.slow  # (each example compiles a grammar: ~10 s for 40)
@settings(max_examples=40, deadline=None)
@given(text=form_declarations(), data=st.data())
def test_random_forms_decode_into_classes_and_back_byte_for_byte(
        text: str, data: st.DataObject) -> None:
    """For a random declaration with ordered groups and unions: it builds (its grammar is
    LR(1)); its codegen classes build it again byte for byte; and every message the
    descriptor accepts, drawn from its grammar and often edited, decodes into the classes
    (text and binary) and encodes back byte for byte, and an instance made again from the
    decoded one's members validates."""
    built = cbcl.descriptor_from_declaration(text)
    module = types.ModuleType("gen_random_forms")
    sys.modules[module.__name__] = module
    exec(compile(generate_records(built), "gen.py", "exec"), vars(module))
    namespace: dict[str, Any] = vars(module)
    assert namespace["descriptor"]() == built
    registry = registry_of(built)
    descriptor = read_descriptor(built)
    records = namespace["RECORDS"]
    union = records[0] if len(records) == 1 else tuple(records)
    encoder, decoder = cbcl.Encoder(registry), cbcl.Decoder(registry)
    source = read_grammar(descriptor.grammar, starts=descriptor.start_rules)
    for intent in descriptor.intents:
        tokens = data.draw(bodies(source, descriptor.starts[intent], TOKENS)).split(" ")
        if data.draw(st.booleans()):
            tokens = mutate_tokens(tokens, data, rounds=1)
        text_sent = message(intent.value, " ".join(tokens))
        try:
            sent = cbcl.parse(text_sent, registry=registry)
        except cbcl.CBCLError:
            continue
        got = cbcl.parse(text_sent, registry=registry, type=union)
        again = cbcl.Message(message_id="m-1", sender="agent://a", receiver="agent://b",
                             intent=intent, protocol="f/v1", body=got)
        assert again.canonical() == sent.canonical()
        frame = encoder.encode(sent)
        assert encoder.encode(again) == frame
        assert decoder.decode(frame, type=union) == got
        remade = type(got)(**{name: getattr(got, name) for name in type(got).__match_args__})
        assert remade == got
        cbcl.validate(cbcl.Message(message_id="m-1", sender="agent://a", receiver="agent://b",
                                   intent=intent, protocol="f/v1", body=remade),
                      registry=registry)
