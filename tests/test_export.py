"""Grammar exports for constrained decoding (spec/llm.md), proved with the real libraries:
llguidance samples every shipped protocol and intent under a mask, with a synthetic
tokenizer of multi-character tokens, and ``cbcl.parse`` accepts every sample; the lark
export agrees with llguidance in both directions; the GBNF export, read by llguidance's own
GBNF reader, gives parseable messages too; the JSON Schema export accepts the mapping of
generated messages and refuses broken ones.

Tests internals too: the export's regex writers (``cbcl.llm._export``) and the vocabulary."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import subprocess
import sys
import zlib
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import lark
import llguidance
import pytest

import cbcl
from cbcl.core._values import INT64_MAX, INT64_MIN
from cbcl.core._vocabulary import SYMBOL_RE
from cbcl.descriptor import read_descriptor, render_descriptor
from cbcl.json_mapping import message_to_json
from cbcl.llm import KEYWORD_SET_CAP, export_grammar, export_json_schema, generate_messages
from cbcl.llm._export import (
    _lark_char,
    _pattern_char,
    _render_regex,
    _string_regex,
    _symbol_regex,
    _unambiguous_hex,
    integer_regex,
)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import constrained  # noqa: E402  (benchmarks/constrained.py: the tokenizer and sampler)

SAMPLES = 200
SHIPPED = constrained.shipped()
CASES = [(path.name, intent.value) for path in SHIPPED
         for intent in read_descriptor(path.read_bytes()).intents]


@cache
def _tokenizer() -> tuple[constrained.SyntheticTokenizer, Any]:
    tok = constrained.SyntheticTokenizer()
    return tok, constrained.lltokenizer(tok)


@cache
def _registries(name: str) -> tuple[cbcl.Registry, cbcl.Registry]:
    """A registry with the descriptor, and one with the descriptor without its schema;
    neither has its constraints, which no export carries (each lists them as not carried)."""
    read = dataclasses.replace(read_descriptor((ROOT / "descriptors" / name).read_bytes()),
                               constraints=None)
    full = cbcl.Registry(disk_cache=False, isolate=False)
    full.load(render_descriptor(read), allow_unsigned=True)
    bare = cbcl.Registry(disk_cache=False, isolate=False)
    stripped = dataclasses.replace(read, schema=None)
    bare.load(render_descriptor(stripped), allow_unsigned=True)
    return full, bare


def _llguidance(text: str) -> str:
    _, lltok = _tokenizer()
    grammar = llguidance.LLMatcher.grammar_from_lark(text)
    error, warnings = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, lltok)
    assert not error and warnings == [], warnings
    return grammar


@pytest.mark.parametrize(("name", "intent"), CASES)
def test_constrained_samples_parse(name: str, intent: str) -> None:
    data = (ROOT / "descriptors" / name).read_bytes()
    export = export_grammar(data, "llguidance", intent=intent)
    tok, lltok = _tokenizer()
    sampler = constrained.Sampler(tok, lltok, seed=zlib.crc32(f"{name} {intent}".encode()))
    matcher = sampler.matcher(_llguidance(export.text))
    full, bare = _registries(name)
    schema_carried = not any(n.startswith("schema:") for n in export.not_carried)
    drawn = accepted = 0
    while drawn < SAMPLES:
        text = sampler.sample(matcher)
        assert text is not None, "a sample did not end"
        drawn += 1
        message = cbcl.parse(text, registry=bare)  # both passes
        assert message.intent == intent
        assert message.canonical().encode("utf-8") == text  # generated canonical
        try:
            cbcl.parse(text, registry=full)
            accepted += 1
        except cbcl.SchemaError:
            assert not schema_carried, text
    assert drawn == SAMPLES
    if schema_carried:
        assert accepted == SAMPLES


def test_every_format_and_intent_exports() -> None:
    _, lltok = _tokenizer()
    for path in SHIPPED:
        data = path.read_bytes()
        for fmt in ("llguidance", "lark", "gbnf", "json-schema"):
            export = export_grammar(data, fmt)
            assert export.text and export.not_carried
            assert export.intents == read_descriptor(data).intents
        grammar = llguidance.grammar_from("gbnf", export_grammar(data, "gbnf").text)
        assert llguidance.LLMatcher.validate_grammar_with_warnings(grammar, lltok) == (False,
                                                                                     [])


def _lark_parser(data: bytes, **kwargs: Any) -> lark.Lark:
    return lark.Lark(export_grammar(data, "lark", **kwargs).text, parser="earley",
                     lexer="dynamic", start="start")


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_differential_lark_and_llguidance(path: Path) -> None:
    """Samples from llguidance are accepted by the lark export (parsed with lark), and
    every message the generator makes is accepted by both (and refused when broken)."""
    data = path.read_bytes()
    parser = _lark_parser(data)
    grammar = _llguidance(export_grammar(data, "llguidance").text)
    tok, lltok = _tokenizer()
    sampler = constrained.Sampler(tok, lltok, seed=7)
    matcher = sampler.matcher(grammar)
    for _ in range(40):
        text = sampler.sample(matcher)
        assert text is not None
        parser.parse(text.decode("utf-8"))
    for message in generate_messages(data, 60, seed=11):
        written = message.canonical()
        parser.parse(written)
        fresh = sampler.matcher(grammar)  # (a matcher that refused a token stays refused)
        assert fresh.consume_tokens(tok(written.encode("utf-8"))), fresh.get_error()
        assert fresh.is_accepting()
        for broken in (written.replace(") (", ")  (", 1), written + " ",
                       written.replace(")", " )", 1),
                       written.replace("(protocol ", "(protocol x", 1)):
            fresh = llguidance.LLMatcher(lltok, grammar, log_level=0)
            assert not fresh.consume_tokens(tok(broken.encode("utf-8"))) \
                or not fresh.is_accepting()
            with pytest.raises(lark.exceptions.LarkError):
                parser.parse(broken)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_gbnf_samples_parse(path: Path) -> None:
    data = path.read_bytes()
    _, bare = _registries(path.name)
    tok, lltok = _tokenizer()
    grammar = llguidance.grammar_from("gbnf", export_grammar(data, "gbnf").text)
    sampler = constrained.Sampler(tok, lltok, seed=3)
    matcher = sampler.matcher(grammar)
    for _ in range(15):
        text = sampler.sample(matcher)
        assert text is not None
        assert cbcl.parse(text, registry=bare).canonical().encode("utf-8") == text


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_json_schema_accepts_generated_and_refuses_broken(path: Path) -> None:
    data = path.read_bytes()
    document = json.loads(export_grammar(data, "json-schema").text)
    assert document == export_json_schema(data)
    jsonschema.Draft202012Validator.check_schema(document)
    validator = jsonschema.Draft202012Validator(document)
    for message in generate_messages(data, 120, seed=5):
        mapped = message_to_json(message)
        errors = list(validator.iter_errors(mapped))
        assert not errors, (message.canonical(), errors[0].message)
        broken: list[Any] = [
            {**mapped, "protocol": "other/v1"},
            {**mapped, "intent": "NOT-AN-INTENT"},
            {k: v for k, v in mapped.items() if k != "body"},
            {**mapped, "body": 1.5},
            {**mapped, "body": [{"symbol": "no-such-head"}]},
            {**mapped, "extra": 1},
            {**mapped, "message-id": ""},
        ]
        for wrong in broken:
            assert not validator.is_valid(wrong), wrong
    per_intent = [export_json_schema(data, intent=i) for i in read_descriptor(data).intents]
    assert all("anyOf" not in d or d.get("type") is None for d in per_intent)


# ------------------------------------------------------------------------------ lexical rules


def _py(regex: Any) -> re.Pattern[str]:
    return re.compile(_unambiguous_hex(_render_regex(regex, _pattern_char)) + r"\Z")


def test_integer_regex_is_int64_exactly() -> None:
    full = _py(integer_regex())
    for n in (0, 1, -1, 9, 10, 99, 100, INT64_MAX, INT64_MIN, INT64_MAX - 1, INT64_MIN + 1,
              10**18, -(10**18), 9223372036854775799, 9223372036854775800):
        assert full.match(str(n)), n
    for text in (str(INT64_MAX + 1), str(INT64_MIN - 1), "9999999999999999999", "-0", "007",
                 "+5", "1.0", "", "-", "92233720368547758070"):
        assert not full.match(text), text
    for low, high in ((0, 1000), (1, 100), (-5, 5), (-1000, -3), (7, 7), (0, 0), (19, 201)):
        pattern = _py(integer_regex(low, high))
        for n in range(low - 30, high + 31):
            assert bool(pattern.match(str(n))) == (low <= n <= high), (low, high, n)
    assert integer_regex(5, 4) is None


def test_symbol_regex_agrees_with_the_reader() -> None:
    pattern = _py(_symbol_regex())
    alphabet = "a1+-._:*@%&?/9Z<"
    for size in range(1, 5):
        for chars in itertools.product(alphabet, repeat=size):
            text = "".join(chars)
            assert bool(pattern.match(text)) == bool(SYMBOL_RE.match(text)), text
    assert pattern.match("a" * 128) and not pattern.match("a" * 129)
    assert pattern.match("-" + "a" * 127) and not pattern.match("-" + "a" * 128)


def test_string_regex_is_the_canonical_quoting() -> None:
    pattern = _py(_string_regex(0, None))
    from cbcl.core._canonical import quote

    for text in ("", "a", '"', "\\", "\n\r\t", "\x00\x1f\x7f\x85\u202e\u2069", "é日本😀",
                 "\u2028\u00a0\ufeff"):
        assert pattern.match(quote(text)), text
    for text in ('"\\u0041"', '"\\u000a"', '"\\u202E"', '"\x01"', '"\u202e"', '"\\x41"', '"a',
                 '"\\/"', '"\t"'):
        assert not pattern.match(text), text
    bounded = _py(_string_regex(2, 3))
    assert bounded.match('"ab"') and bounded.match('"\\n\\"é"') and not bounded.match('"a"')
    assert not bounded.match('"abcd"')


def test_lark_escaping_reaches_re_intact() -> None:
    for cp in (0x5C, 0x5D, 0x2F, 0x22, 0x27, 0x5E, 0x2D, 0x20, 0x0A, 0xA0, 0x202E,
               0x10FFFF):
        grammar = f"start: /{_lark_char(cp)}/\n"
        assert lark.Lark(grammar, parser="earley", lexer="dynamic").parse(chr(cp))


# ------------------------------------------------------------------------------ keyword sets

_SET_GRAMMAR = 'body: "(" "r" (":a" INTEGER & ":b" SYMBOL & [":c" STRING] & [":d" URI]) ")"\n'


def _descriptor(grammar: str) -> bytes:
    return cbcl.build_descriptor("sets/v1", 1, ["INFORM"], grammar)


def test_keyword_sets_every_order_and_nothing_else() -> None:
    data = _descriptor(_SET_GRAMMAR)
    parser = _lark_parser(data)
    members = {":a": ":a 1", ":b": ":b x", ":c": ':c "s"', ":d": ":d a://b"}
    head = ('(CBCL/1.0 (message-id "m") (sender a://s) (receiver a://r) (intent INFORM) '
            "(protocol sets/v1) (body (r ")
    registry = cbcl.Registry(disk_cache=False, isolate=False)
    registry.load(data, allow_unsigned=True)
    for size in range(5):
        for chosen in itertools.permutations(members, size):
            text = head + " ".join(members[k] for k in chosen) + ")))"
            valid = ":a" in chosen and ":b" in chosen
            try:
                parser.parse(text)
                exported = True
            except lark.exceptions.LarkError:
                exported = False
            assert exported == valid, text
            try:
                cbcl.parse(text, registry=registry)
                accepted = True
            except cbcl.BodyError:
                accepted = False
            assert accepted == valid, text
    for twice in (":a 1 :a 2 :b x", ":b x :a 1 :b y"):
        with pytest.raises(lark.exceptions.LarkError):
            parser.parse(head + twice + ")))")


def test_keyword_sets_over_the_cap_keep_the_declared_order() -> None:
    members = " & ".join(f'[":k{n}" INTEGER]' for n in range(KEYWORD_SET_CAP + 1))
    data = _descriptor(f'body: "(" "r" ({members}) ")"\n')
    export = export_grammar(data, "lark")
    assert any("over the cap" in note for note in export.not_carried)
    parser = lark.Lark(export.text, parser="earley", lexer="dynamic")
    head = ('(CBCL/1.0 (message-id "m") (sender a://s) (receiver a://r) (intent INFORM) '
            "(protocol sets/v1) (body (r ")
    parser.parse(head + ":k0 1 :k3 2)))")
    with pytest.raises(lark.exceptions.LarkError):
        parser.parse(head + ":k3 2 :k0 1)))")
    small = export_grammar(data, "lark", keyword_set_cap=KEYWORD_SET_CAP + 1)
    lark.Lark(small.text, parser="earley", lexer="dynamic").parse(head + ":k3 2 :k0 1)))")


# ------------------------------------------------------------------------------ schema


def test_schema_constraints_compiled_in() -> None:
    # contract-net/v1 version 1 (hand-written, in history): its grammar writes SYMBOL for
    # the currency, and the schema's one-of is compiled into the export (version 2's
    # grammar, derived from its declaration, writes the literals itself).
    data = (ROOT / "descriptors" / "history" / "contract-net-v1.version-1.cbcl").read_bytes()
    text = export_grammar(data, "llguidance", intent="PROPOSE").text
    assert '" EUR" | " USD" | " GBP" | " CHF" | " JPY"' in text  # one-of
    bare = export_grammar(data, "llguidance", intent="PROPOSE", schema=False).text
    assert "EUR" not in bare
    # task-assignment/v1 version 1's grammar wrote the task's first key as any KEYWORD: the
    # schema's required :id is not carried; version 2's derived grammar writes ":id".
    history = ROOT / "descriptors" / "history"
    task = export_grammar((history / "task-assignment-v1.version-1.cbcl").read_bytes(), "lark")
    assert any("required key :id" in note for note in task.not_carried)
    task = export_grammar((ROOT / "descriptors" / "task-assignment-v1.cbcl").read_bytes(),
                          "lark")
    assert not any("required key" in note for note in task.not_carried)


def test_errors() -> None:
    data = (ROOT / "descriptors" / "request-v1.cbcl").read_bytes()
    with pytest.raises(ValueError, match="unknown format"):
        export_grammar(data, "yacc")
    with pytest.raises(ValueError, match="not an intent"):
        export_grammar(data, "lark", intent="BOGUS")
    with pytest.raises(cbcl.ProtocolError, match="does not govern CFP"):
        export_grammar(data, "lark", intent="CFP")
    with pytest.raises(cbcl.DescriptorError):
        export_grammar(b"(not-a-descriptor)", "lark")
    signed = (ROOT / "descriptors" / "request-v1.signed.cbcl").read_bytes()
    assert export_grammar(signed, "lark").text == export_grammar(data, "lark").text


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cbcl", "grammar", "export", *args],
                          capture_output=True, text=True, cwd=ROOT, check=False)


def test_cli() -> None:
    path = str(ROOT / "descriptors" / "contract-net-v1.cbcl")
    done = _cli(path, "--format", "lark", "--intent", "ACCEPT", "--notes")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("// CBCL contract-net/v1")
    assert "not carried: limit: nesting depth 64" in done.stderr
    lark.Lark(done.stdout, parser="earley", lexer="dynamic")
    done = _cli(path, "--format", "json-schema")
    assert done.returncode == 0 and json.loads(done.stdout)["anyOf"]
    done = _cli(path, "--intent", "AGREE")
    assert done.returncode == 5 and done.stderr.startswith("protocol: ")
    done = _cli(path, "--format", "yacc")
    assert done.returncode == 2 and done.stderr.startswith("usage: cbcl grammar export")
    done = _cli(str(ROOT / "no-such-file"))
    assert done.returncode == 1 and done.stderr.startswith("io: ")


_ODD = [
    'body: open "a" close\nopen: "("\nclose: ")"\n',  # parentheses split across rules
    'body: "(" "x" item* ")"\nitem: open "y" ")" | "z"\nopen: "("\n',  # ... inside a repetition
    'body: "(" (":a" value & [":b" ("(" NUMBER* ")")]) ")"\n',
    "body: value\n",
    'body: "(" "e" e ")"\ne: "(" "+" e e ")" | INTEGER | DECIMAL\n',  # recursion
]


@pytest.mark.parametrize("grammar", _ODD)
def test_odd_grammars(grammar: str) -> None:
    data = _descriptor(grammar)
    registry = cbcl.Registry(disk_cache=False, isolate=False)
    registry.load(data, allow_unsigned=True)
    parser = _lark_parser(data)
    for message in generate_messages(data, 40, seed=1):
        parser.parse(message.canonical())
    tok, lltok = _tokenizer()
    sampler = constrained.Sampler(tok, lltok, seed=1)
    matcher = sampler.matcher(_llguidance(export_grammar(data, "llguidance").text))
    for _ in range(40):
        text = sampler.sample(matcher)
        assert text is not None
        assert cbcl.parse(text, registry=registry).canonical().encode("utf-8") == text
        parser.parse(text.decode("utf-8"))
