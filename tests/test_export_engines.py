"""The GBNF and JSON Schema exports read by the engines they name (spec/llm.md §2, §4, §7).

- Escapes: a class or literal at every awkward code point (an ``\\xHH`` before a hex digit,
  U+00A0, U+0100, U+061C, U+1000, the surrogate edges, U+10000, U+10FFFF) means the same
  set of code points to Python (the reference), to llguidance's GBNF reader
  (``gbnf_to_lark``), to XGrammar's GBNF parser, and, for the JSON Schema patterns, to
  Python ``re`` (``jsonschema``), Ajv (ECMA-262, ``u`` mode) and XGrammar's JSON Schema path.
- XGrammar compiles every shipped protocol's GBNF and JSON Schema exports, without a
  warning, and draws 100 mask-constrained random samples per protocol and intent over the
  synthetic tokenizer of ``benchmarks/constrained.py``; every sample ends, and
  ``cbcl.parse`` accepts it (both passes; a JSON sample through the §7 mapping), except
  where the export itself lists the constraint as not carried.
- Ajv compiles every JSON Schema export in 2020-12 mode (strict) and agrees with Python
  ``jsonschema`` on the mapping of generated messages (valid) and on broken ones (refused).

XGrammar needs PyTorch: it is the ``xgrammar`` extra, not the ``test`` one; Ajv is the npm
package of ``tests/js`` (``npm ci`` there). A test whose engine is missing is skipped,
unless ``CBCL_REQUIRE_ENGINES=1`` (CI's engine section), when it fails.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import zlib
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import llguidance
import pytest
from hypothesis import given, strategies as st
from llguidance.gbnf_to_lark import gbnf_to_lark

import cbcl
from cbcl.descriptor import read_descriptor, render_descriptor
from cbcl.json_mapping import from_json, message_to_json
from cbcl.llm import export_grammar, export_json_schema, generate_messages
from cbcl.llm._export import (
    _ALL,
    _SURROGATES,
    _cls,
    _minus,
    _pattern,
    _RAlt,
    _RClass,
    _Re,
    _render_gbnf_regex,
    _RLit,
    _RRep,
    _RSeq,
    _string_regex,
    _symbol_regex,
    _uri_regex,
    integer_regex,
)
from cbcl.protocol._patterns import Ranges as _Ranges

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import constrained  # noqa: E402  (benchmarks/constrained.py: the synthetic tokenizer)

JS = ROOT / "tests" / "js"
REQUIRE_ENGINES = os.environ.get("CBCL_REQUIRE_ENGINES") == "1"
SAMPLES = 100
SHIPPED = constrained.shipped()
CASES = [(path.name, intent.value) for path in SHIPPED
         for intent in read_descriptor(path.read_bytes()).intents]


def _missing(engine: str, why: str) -> None:
    if REQUIRE_ENGINES:
        pytest.fail(f"{engine} is missing and CBCL_REQUIRE_ENGINES=1: {why}")
    pytest.skip(f"{engine} is missing: {why}")


@pytest.fixture(scope="module")
def xgr() -> Any:
    """The xgrammar module (the ``xgrammar`` extra)."""
    try:
        return importlib.import_module("xgrammar")
    except ImportError as exc:
        _missing("xgrammar", f"{exc} (pip install -e '.[xgrammar]')")


@pytest.fixture(scope="module")
def node() -> str:
    """The node binary, with Ajv installed in tests/js."""
    binary = shutil.which("node")
    if binary is None:
        _missing("node", "no node on PATH")
    if not (JS / "node_modules" / "ajv" / "package.json").is_file():
        _missing("ajv", "run `npm ci` in tests/js")
    return binary  # type: ignore[return-value]


@cache
def _registries(name: str) -> tuple[cbcl.Registry, cbcl.Registry]:
    """A registry with the descriptor, and one with the descriptor without its schema and
    its constraints (which are written over the schema's fields, and which no export
    carries: each is listed in the export's header)."""
    data = (ROOT / "descriptors" / name).read_bytes()
    full = cbcl.Registry(disk_cache=False, isolate=False)
    full.load(data, allow_unsigned=True)
    bare = cbcl.Registry(disk_cache=False, isolate=False)
    stripped = dataclasses.replace(read_descriptor(data), schema=None, constraints=None)
    bare.load(render_descriptor(stripped), allow_unsigned=True)
    return full, bare


@cache
def _tokenizer() -> tuple[constrained.SyntheticTokenizer, Any]:
    tok = constrained.SyntheticTokenizer()
    return tok, constrained.lltokenizer(tok)


# ----------------------------------------------------------------- escapes, code point by point

#: Classes whose bounds sit where an escape could be misread: an ``\xHH`` before a hex
#: digit (XGrammar reads ``\x`` greedily), the class's own syntax, the first code points
#: past ASCII, past U+00FF and U+0FFF (where llguidance's GBNF reader strips the zeros of
#: ``\u0HHH``), the surrogate edges, and the astral planes.
_AWKWARD: tuple[_Ranges, ...] = (
    ((0x3F, 0x3F), (0x41, 0x5A)),
    ((0x2E, 0x2E), (0x30, 0x39), (0x61, 0x66)),
    ((0x22, 0x22), (0x2D, 0x2D), (0x5B, 0x5E)),
    ((0x7E, 0x7E), (0xA0, 0xA0), (0xFF, 0x100)),
    ((0x61B, 0x61B), (0x61D, 0xFFF)),
    ((0x1000, 0x1000), (0xD7FF, 0xD7FF), (0xE000, 0xFFFF)),
    ((0x10000, 0x10000), (0x10FFFF, 0x10FFFF)),
    _minus(_ALL, ((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C))),
)
#: Literals whose escapes could be misread (a quote before a capital, a backslash before a
#: letter, code points of every escape form).
_LITERALS = ('"EUR"', "\\a", "x\\\"Fe", "\u00a0b", "\u00ffA", "\u0100b", "x\u061cy",
             "\u1000\ufeff", "\U0001f600F", "\U0010ffff0")


def _classes(regex: _Re) -> Iterator[_Ranges]:
    stack: list[_Re] = [regex]
    while stack:
        node = stack.pop()
        if isinstance(node, _RClass):
            yield node.ranges
        elif isinstance(node, (_RSeq, _RAlt)):
            stack.extend(node.items)
        elif isinstance(node, _RRep):
            stack.append(node.item)


def _lexical_classes() -> list[_Ranges]:
    """Every class of the lexical rules the exports write, once."""
    found: list[_Ranges] = []
    for regex in (_string_regex(0, None), _uri_regex(None), _symbol_regex(), integer_regex()):
        assert regex is not None
        for ranges in _classes(regex):
            if ranges not in found:
                found.append(ranges)
    return found


CLASSES = [*_AWKWARD, *_lexical_classes()]


def _probes(ranges: _Ranges) -> list[int]:
    """Code points on both sides of every bound of ``ranges`` (no surrogate, no NUL)."""
    points = {0x41, 0x30, 0x61, 0x20}
    for lo, hi in ranges:
        points.update((lo - 1, lo, (lo + hi) // 2, hi, hi + 1))
    return sorted(p for p in points
                  if 0 < p <= 0x10FFFF and not 0xD800 <= p <= 0xDFFF)


def _inside(ranges: _Ranges, cp: int) -> bool:
    return any(lo <= cp <= hi for lo, hi in ranges)


def _gbnf(ranges: _Ranges) -> str:
    return f"root ::= {_render_gbnf_regex(_cls(ranges))}\n"


def _llguidance_gbnf(text: str) -> Any:
    """A pristine llguidance matcher for a GBNF grammar read by ``gbnf_to_lark``."""
    _, lltok = _tokenizer()
    matcher = llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_lark(
        gbnf_to_lark(text)), log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    return matcher


def _llguidance_accepts(pristine: Any, text: str) -> bool:
    tok, _ = _tokenizer()
    matcher = pristine.deep_copy()  # (a matcher that refused a token stays refused)
    return bool(matcher.consume_tokens(tok(text.encode("utf-8"))) and matcher.is_accepting())


@pytest.mark.parametrize("ranges", CLASSES, ids=lambda r: f"{r[0][0]:X}-{r[-1][1]:X}")
def test_gbnf_classes_read_alike_by_llguidance(ranges: _Ranges) -> None:
    matcher = _llguidance_gbnf(_gbnf(ranges))
    for cp in _probes(ranges):
        assert _llguidance_accepts(matcher, chr(cp)) == _inside(ranges, cp), hex(cp)


def test_gbnf_literals_read_alike_by_llguidance() -> None:
    for text in _LITERALS:
        matcher = _llguidance_gbnf(f"root ::= {_render_gbnf_regex(_RLit(text))}\n")
        assert _llguidance_accepts(matcher, text), ascii(text)
        assert not _llguidance_accepts(matcher, text[:-1]), ascii(text)


def test_gbnf_escapes_are_fixed_width_and_hex_safe() -> None:
    """The escapes llama.cpp's grammar parser reads (``\\xHH`` two digits, ``\\uHHHH`` four):
    no ``\\U``, no ``\\u0HHH``, and no hex digit right after an ``\\xHH``."""
    texts = [_render_gbnf_regex(_cls(r)) for r in CLASSES]
    texts += [_render_gbnf_regex(_RLit(t)) for t in _LITERALS]
    for path in SHIPPED:
        texts.append(export_grammar(path.read_bytes(), "gbnf").text)
    for text in texts:
        assert "\\U" not in text and not re.search(r"\\u0", text)
        assert not re.search(r"\\x[0-9A-F]{2}[0-9A-Fa-f]", text), text[:200]
        assert not re.search(r"[\x80-\xff]", text)  # U+0080..U+00FF always escaped
        for escape in re.findall(r"\\(.)", text):
            assert escape in "xu", text[:200]


_HEX = "0123456789abcdefABCDEF"


def _decode_escapes(body: str, greedy_x: bool, in_class: bool) -> list[int | None]:
    """The code points of a GBNF literal's or class's inside (``None`` for a range's ``-``),
    read as llama.cpp reads escapes (``\\x`` two digits) or as XGrammar does (``\\x`` as
    many as follow)."""
    out: list[int | None] = []
    i = 0
    while i < len(body):
        if body[i] == "\\" and body[i + 1] in "xuU":
            end = i + 2 + {"x": 2, "u": 4, "U": 8}[body[i + 1]]
            if greedy_x and body[i + 1] == "x":
                while end < len(body) and body[end] in _HEX:
                    end += 1
            out.append(int(body[i + 2:end], 16))
            i = end
        elif body[i] == "\\":
            out.append(ord(body[i + 1]))
            i += 2
        else:
            out.append(None if in_class and body[i] == "-" else ord(body[i]))
            i += 1
    return out


#: Code points, mostly where escapes are written (ASCII, U+0080..U+10FF).
_CODE_POINTS = st.one_of(st.sampled_from([ord(c) for c in '"\\\n\x7f\xa0\xff0Aa9Ff-]^']),
                         st.integers(0x20, 0x7E), st.integers(1, 0x10FF),
                         st.integers(1, 0x10FFFF).filter(lambda cp: not 0xD800 <= cp <= 0xDFFF))


@given(st.lists(_CODE_POINTS, min_size=1, max_size=12))
def test_gbnf_literal_escapes_read_alike(points: list[int]) -> None:
    """Any literal: llama.cpp's and XGrammar's readings give its code points, and
    llguidance's GBNF reader accepts exactly it."""
    text = "".join(map(chr, points))
    written = _render_gbnf_regex(_RLit(text))
    assert written[0] == written[-1] == '"'
    body = written[1:-1]
    assert _decode_escapes(body, greedy_x=False, in_class=False) == points
    assert _decode_escapes(body, greedy_x=True, in_class=False) == points
    matcher = _llguidance_gbnf(f"root ::= {written}\n")
    assert _llguidance_accepts(matcher, text)


@given(st.lists(st.tuples(_CODE_POINTS, st.integers(0, 40)), min_size=1, max_size=8))
def test_gbnf_class_escapes_read_alike(bounds: list[tuple[int, int]]) -> None:
    ranges = _cls(_minus(tuple((lo, min(lo + width, 0x10FFFF)) for lo, width in bounds),
                         _SURROGATES)).ranges
    if not ranges:
        return
    written = _render_gbnf_regex(_cls(ranges))
    expected: list[int | None] = []
    for lo, hi in ranges:
        expected += [lo] if lo == hi else [lo, None, hi]
    assert written[0] == "[" and written[-1] == "]"
    for greedy in (False, True):
        assert _decode_escapes(written[1:-1], greedy_x=greedy, in_class=True) == expected, \
            written


def _json_probes(ranges: _Ranges) -> list[str]:
    return [chr(cp) for cp in _probes(ranges)]


def _string_pattern(ranges: _Ranges) -> dict[str, Any]:
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "string",
            "pattern": _pattern(_RRep(_cls(ranges), 1, None))}


def test_json_patterns_read_alike_by_python() -> None:
    for ranges in CLASSES:
        schema = _string_pattern(ranges)
        validator = jsonschema.Draft202012Validator(schema)
        for probe in _json_probes(ranges):
            assert validator.is_valid(probe) == _inside(ranges, ord(probe)), hex(ord(probe))


def _xgr_compiler(xgr: Any) -> Any:
    tok, _ = _tokenizer()
    info = xgr.TokenizerInfo(tok.tokens, xgr.VocabType.RAW, vocab_size=len(tok.tokens),
                             stop_token_ids=[tok.eos_token_id])
    return xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)


def _xgr_accepts(xgr: Any, compiled: Any, text: str) -> bool:
    matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
    return bool(matcher.accept_string(text) and matcher.is_terminated())


def test_gbnf_and_json_patterns_read_alike_by_xgrammar(xgr: Any,
                                                       capfd: pytest.CaptureFixture[str]
                                                       ) -> None:
    compiler = _xgr_compiler(xgr)
    for ranges in CLASSES:
        grammar = compiler.compile_grammar(_gbnf(ranges))
        schema = compiler.compile_json_schema(json.dumps(_string_pattern(ranges)),
                                              any_whitespace=False)
        for cp in _probes(ranges):
            inside = _inside(ranges, cp)
            assert _xgr_accepts(xgr, grammar, chr(cp)) == inside, ("gbnf", hex(cp))
            if cp >= 0x20 and chr(cp) not in '"\\':  # (as itself in a JSON string)
                assert _xgr_accepts(xgr, schema, json.dumps(chr(cp), ensure_ascii=False)
                                    ) == inside, ("json", hex(cp))
    for text in _LITERALS:
        grammar = compiler.compile_grammar(f"root ::= {_render_gbnf_regex(_RLit(text))}\n")
        assert _xgr_accepts(xgr, grammar, text), ascii(text)
        assert not _xgr_accepts(xgr, grammar, text[:-1]), ascii(text)
    assert "warning" not in capfd.readouterr().err.lower()


def _ajv(node: str, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ajv's verdicts (tests/js/check_schemas.mjs) on ``cases``."""
    done = subprocess.run([node, str(JS / "check_schemas.mjs")], cwd=JS, capture_output=True,
                          input=json.dumps({"cases": cases}), text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    results: list[dict[str, Any]] = json.loads(done.stdout)["cases"]
    assert [r["name"] for r in results] == [c["name"] for c in cases]
    return results


def test_json_patterns_read_alike_by_ajv(node: str) -> None:
    cases = [{"name": str(i), "schema": _string_pattern(ranges),
              "instances": _json_probes(ranges)} for i, ranges in enumerate(CLASSES)]
    for ranges, result in zip(CLASSES, _ajv(node, cases), strict=True):
        assert result["error"] is None, result["error"]
        expected = [_inside(ranges, ord(p)) for p in _json_probes(ranges)]
        assert result["valid"] == expected, [hex(ord(p)) for p, a, b in zip(
            _json_probes(ranges), result["valid"], expected, strict=True) if a != b]


def _broken(mapped: dict[str, Any]) -> list[Any]:
    """Objects the schema must refuse: a wrong field, one missing, one too many."""
    return [
        {**mapped, "protocol": "other/v1"},
        {**mapped, "intent": "NOT-AN-INTENT"},
        {k: v for k, v in mapped.items() if k != "body"},
        {**mapped, "body": 1.5},
        {**mapped, "body": [{"symbol": "no-such-head"}]},
        {**mapped, "extra": 1},
        {**mapped, "message-id": ""},
        {**mapped, "sender": "no scheme"},
        {**mapped, "sender": "agent://a\u061cb"},
        {**mapped, "receiver": {"uri": mapped["receiver"]}},
    ]


def test_ajv_and_jsonschema_agree_on_every_export(node: str) -> None:
    """Every JSON Schema export (each protocol, all intents and each intent) compiles in
    Ajv's 2020-12 strict mode; the mapping of generated messages is valid and broken
    objects are refused, by Ajv and by Python ``jsonschema`` alike."""
    cases: list[dict[str, Any]] = []
    expected: list[list[bool]] = []
    for path in SHIPPED:
        data = path.read_bytes()
        for intent in (None, *(i.value for i in read_descriptor(data).intents)):
            schema = export_json_schema(data, intent=intent)
            assert "duplicate member names" in schema["$comment"]
            messages = generate_messages(data, 12, seed=zlib.crc32(path.name.encode()),
                                         intent=intent)
            valid = [message_to_json(m) for m in messages]
            instances = valid + [b for m in valid[:3] for b in _broken(m)]
            verdicts = [True] * len(valid) + [False] * (len(instances) - len(valid))
            jsonschema.Draft202012Validator.check_schema(schema)
            python = jsonschema.Draft202012Validator(schema)
            assert [python.is_valid(i) for i in instances] == verdicts, (path.name, intent)
            cases.append({"name": f"{path.name} {intent}", "schema": schema,
                          "instances": instances})
            expected.append(verdicts)
    for case, result, verdicts in zip(cases, _ajv(node, cases), expected, strict=True):
        assert result["error"] is None, (case["name"], result["error"])
        assert result["valid"] == verdicts, case["name"]


# ----------------------------------------------------------------- XGrammar: constrained samples

# _BITS[b]: the bit positions set in byte b.
_BITS = [tuple(k for k in range(8) if b >> k & 1) for b in range(256)]


class _XgrSampler:
    """Seeded mask-constrained sampling with XGrammar's ``GrammarMatcher`` over the synthetic
    tokenizer: each next token drawn from those the mask allows, weighted towards closing
    tokens as the text grows (as ``benchmarks/constrained.py`` does for llguidance), until
    the stop token."""

    def __init__(self, xgr: Any, seed: int, budget: int, avoid: bytes = b"") -> None:
        self.xgr = xgr
        self.tok, _ = _tokenizer()
        self.size = len(self.tok.tokens)
        self.rng = random.Random(seed)
        self.budget = budget
        self.closing = [any(c in t for c in (b'"', b")", b"]", b"}")) for t in self.tok.tokens]
        self.base = [(0.4 if any(c in t for c in (b"(", b"[", b"{")) else 1.0)
                     * (2.0 if len(t) > 1 else 1.0)
                     * (0.0 if any(b in t for b in avoid) else 1.0) for t in self.tok.tokens]
        self.mask = xgr.allocate_token_bitmask(1, self.size)

    def sample(self, compiled: Any) -> bytes | None:
        """One text, or ``None`` if it did not end within the token budget."""
        matcher = self.xgr.GrammarMatcher(compiled)
        out: list[int] = []
        eos = self.tok.eos_token_id
        while True:
            matcher.fill_next_token_bitmask(self.mask)
            raw = self.mask[0].numpy().tobytes()
            allowed = [8 * n + k for n, byte in enumerate(raw) for k in _BITS[byte]
                       if 8 * n + k < self.size and self.base[8 * n + k]]
            assert allowed, "the mask allows nothing (that is not avoided)"
            boost = 1.0 + len(out) / 15.0
            weights = [self.base[i] * (boost if self.closing[i] else 1.0) for i in allowed]
            token = self.rng.choices(allowed, weights)[0]
            assert matcher.accept_token(token)
            if token == eos:
                assert matcher.is_terminated()
                return b"".join(self.tok.tokens[i] for i in out)
            out.append(token)
            if len(out) > self.budget:
                return None


@pytest.fixture(scope="module")
def xgr_compiler(xgr: Any) -> Any:
    return _xgr_compiler(xgr)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_xgrammar_compiles_whole_exports(xgr: Any, xgr_compiler: Any, path: Path,
                                         capfd: pytest.CaptureFixture[str]) -> None:
    """The exports of every intent at once (one body rule per start rule) compile too: the
    GBNF accepts a generated message of each intent and refuses it with a trailing space;
    JSON samples that ``jsonschema`` finds valid (see the JSON sampling test) map back to
    messages whose envelope pass 1 accepts, of every intent the protocol governs."""
    data = path.read_bytes()
    grammar = xgr_compiler.compile_grammar(export_grammar(data, "gbnf").text)
    for message in generate_messages(data, 20, seed=9):
        assert _xgr_accepts(xgr, grammar, message.canonical())
        assert not _xgr_accepts(xgr, grammar, message.canonical() + " ")
    text = export_grammar(data, "json-schema").text
    schema = xgr_compiler.compile_json_schema(text, any_whitespace=False)
    validator = jsonschema.Draft202012Validator(json.loads(text))
    sampler = _XgrSampler(xgr, zlib.crc32(path.name.encode()), budget=1500, avoid=b"\\")
    intents: set[cbcl.Intent] = set()
    for _ in range(SAMPLES):
        sample = sampler.sample(schema)
        assert sample is not None, "a sample did not end"
        obj = json.loads(sample, strict=False)
        if validator.is_valid(obj) and not _has_lone_surrogate(obj):
            intents.add(cbcl.parse(_message_text(obj), envelope_only=True).intent)
    assert intents == set(read_descriptor(data).intents)
    assert "warning" not in capfd.readouterr().err.lower()


@pytest.mark.parametrize(("name", "intent"), CASES)
def test_xgrammar_gbnf_samples_parse(xgr: Any, xgr_compiler: Any, name: str, intent: str,
                                     capfd: pytest.CaptureFixture[str]) -> None:
    """100 XGrammar samples of the GBNF export: each ends, both passes accept it and it is
    canonical; with the schema too where the export carries all of it."""
    data = (ROOT / "descriptors" / name).read_bytes()
    export = export_grammar(data, "gbnf", intent=intent)
    compiled = xgr_compiler.compile_grammar(export.text)
    sampler = _XgrSampler(xgr, zlib.crc32(f"gbnf {name} {intent}".encode()), budget=600)
    full, bare = _registries(name)
    schema_carried = not any(n.startswith("schema:") for n in export.not_carried)
    accepted = constrained = 0
    for _ in range(SAMPLES):
        text = sampler.sample(compiled)
        assert text is not None, "a sample did not end"
        message = cbcl.parse(text, registry=bare)  # both passes
        assert message.intent == intent
        assert message.canonical().encode("utf-8") == text
        try:
            cbcl.parse(text, registry=full)
            accepted += 1
        except cbcl.ConstraintError as refusal:  # (a SchemaError: caught first)
            assert _not_carried(export, refusal), text
            constrained += 1
        except cbcl.SchemaError:
            assert not schema_carried, text
    if schema_carried:
        assert accepted + constrained == SAMPLES
    assert "warning" not in capfd.readouterr().err.lower()


def _message_text(obj: dict[str, Any]) -> bytes:
    """The CBCL message whose §7.2 mapping is ``obj`` (the envelope written out)."""
    assert obj["version"] == "CBCL/1.0"
    parts = [f"(message-id {cbcl.canonical(obj['message-id'])})", f"(sender {obj['sender']})",
             f"(receiver {obj['receiver']})", f"(intent {obj['intent']})",
             f"(protocol {obj['protocol']})"]
    for name in ("conversation-id", "in-reply-to", "reply-by", "timestamp"):
        if name in obj:
            parts.append(f"({name} {cbcl.canonical(from_json(obj[name]))})")
    parts.append(f"(body {cbcl.canonical(from_json(obj['body']))})")
    return ("(CBCL/1.0 " + " ".join(parts) + ")").encode("utf-8")


def _not_carried(export: Any, refusal: cbcl.ConstraintError) -> bool:
    """Whether the constraint that refused a sample is one its export lists as not carried."""
    return any(line.startswith(f"constraint {refusal.rule}:") for line in export.not_carried)


def _has_lone_surrogate(obj: Any) -> bool:
    text = json.dumps(obj, ensure_ascii=False)
    return any(0xD800 <= ord(c) <= 0xDFFF for c in text)


@pytest.mark.parametrize(("name", "intent"), CASES)
def test_xgrammar_json_schema_samples_parse(xgr: Any, xgr_compiler: Any, name: str,
                                            intent: str, capfd: pytest.CaptureFixture[str]
                                            ) -> None:
    """100 XGrammar samples of the JSON Schema export (no backslash drawn: see below): each
    ends, is valid for
    ``jsonschema`` too, maps back to a message (§7) that pass 1 accepts, whose mapping is
    the sample itself; pass 2 accepts every one unless the export lists a list as
    approximated, the schema unless it lists a schema constraint."""
    data = (ROOT / "descriptors" / name).read_bytes()
    export = export_grammar(data, "json-schema", intent=intent)
    compiled = xgr_compiler.compile_json_schema(export.text, any_whitespace=False)
    validator = jsonschema.Draft202012Validator(json.loads(export.text))
    # XGrammar (0.2.9) matches a pattern against the JSON text between the quotes and
    # writes what it matches unescaped: a backslash in a URI comes out raw, which is not
    # JSON (a reader then sees an escape). The JSON samples are drawn without backslashes.
    sampler = _XgrSampler(xgr, zlib.crc32(f"json {name} {intent}".encode()), budget=1500,
                          avoid=b"\\")
    full, bare = _registries(name)
    approximated = any(n.startswith("json-schema: the order") for n in export.not_carried)
    schema_carried = not any(n.startswith("schema:") for n in export.not_carried)
    body_refused = schema_refused = constrained = misread = 0
    for _ in range(SAMPLES):
        sample = sampler.sample(compiled)
        assert sample is not None, "a sample did not end"
        # (strict=False: XGrammar's JSON strings may hold control characters unescaped, which
        # RFC 8259 does not allow; the value is still the one the schema describes)
        obj = json.loads(sample, strict=False)
        if not validator.is_valid(obj):
            # XGrammar's regex automaton misreads some patterns: it lets ``-1x`` through
            # ``^(?:a|[+-](?:[a-z][a-z0-9]{0,3})?)$`` (the SYMBOL pattern's shape), which
            # Python, Ajv and ECMA-262 refuse; such a sample is XGrammar's, not the schema's
            misread += 1
            continue
        if _has_lone_surrogate(obj):
            continue  # listed as not carried
        text = _message_text(obj)
        assert cbcl.parse(text, envelope_only=True).intent == intent
        try:
            message = cbcl.parse(text, registry=bare)
        except cbcl.BodyError:
            assert approximated, text
            body_refused += 1
            continue
        assert message.canonical().encode("utf-8") == text
        assert _message_text(message_to_json(message)) == text  # (the mapping, both ways)
        try:
            cbcl.parse(text, registry=full)
        except cbcl.ConstraintError as refusal:  # (a SchemaError: caught first)
            assert _not_carried(export, refusal), text
            constrained += 1
        except cbcl.SchemaError:
            assert not schema_carried, text
            schema_refused += 1
    assert "warning" not in capfd.readouterr().err.lower()
    print(f"{name} {intent}: {SAMPLES} samples, misread by XGrammar {misread}, pass 2 "
          f"refused {body_refused}, schema refused {schema_refused}, constraints refused "
          f"{constrained}")
    assert misread <= SAMPLES // 10
