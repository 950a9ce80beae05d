"""Descriptors, the guarded compiler, the caches, the registry and pass 2 (draft §3, §4).

Tests internals too: the guarded compiler, the disk cache and pass 2."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from grammar_bodies import bodies
from hypothesis import given, settings, strategies as st
from strategies import names, values

import cbcl
from cbcl import BodyError, DescriptorError, GrammarError, ProtocolError, Registry, TrustError
from cbcl.grammar._compile import compile_grammar, compile_guarded, from_data, to_data
from cbcl.grammar._subset import read_grammar
from cbcl.protocol._pass2 import recognise_body

ROOT = Path(__file__).parent.parent
DESCRIPTORS = ROOT / "descriptors"
EXAMPLES = sorted((DESCRIPTORS / "examples").glob("*.cbcl"))
SHIPPED = ["task-assignment-v1", "contract-net-v1", "request-v1", "canon-a-v1"]
VECTORS = Path(__file__).resolve().parents[1] / "spec" / "vectors" / "grammars"


def starts_of(name: str) -> tuple[str, ...]:
    """The start rules of the shipped descriptor ``name``."""
    return cbcl.descriptor.read_descriptor((DESCRIPTORS / f"{name}.cbcl").read_bytes()).start_rules


def descriptor_for(example: Path) -> Path:
    (name,) = [n for n in SHIPPED if example.stem == n or example.stem.startswith(n + "-")]
    return DESCRIPTORS / f"{name}.cbcl"


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    reg = Registry(cache_dir=tmp_path / "cache")
    for name in SHIPPED:
        reg.load((DESCRIPTORS / f"{name}.cbcl").read_bytes(), allow_unsigned=True)
    return reg


def message(protocol: str, intent: str, body: str) -> bytes:
    return (f'(CBCL/1.0 (message-id "m") (sender agent://a) (receiver agent://b) '
            f"(intent {intent}) (protocol {protocol}) (body {body}))").encode()


# --------------------------------------------------------------------------- descriptors


@pytest.mark.slow
def test_shipped_descriptors_match_their_grammar_files() -> None:
    done = subprocess.run([sys.executable, str(DESCRIPTORS / "make_descriptors.py"), "--check"],
                          capture_output=True, check=False)
    assert done.returncode == 0, done.stderr.decode()


def test_read_descriptor_fields() -> None:
    payload = (DESCRIPTORS / "contract-net-v1.cbcl").read_bytes()
    descriptor = cbcl.descriptor.read_descriptor(payload)
    assert descriptor.id == cbcl.Symbol("contract-net/v1")
    assert descriptor.version == 2  # (version 1 was hand-written: descriptors/history)
    assert cbcl.Intent.CFP in descriptor.intents
    assert descriptor.grammar == cbcl.descriptor.read_declaration(
        (DESCRIPTORS / "declarations" / "contract-net-v1.cbcl").read_bytes()).grammar
    assert descriptor.digest.startswith("sha256:") and len(descriptor.digest) == 71
    # The digest names the exact bytes: a comment changes it.
    assert cbcl.descriptor.read_descriptor(b"; x\n" + payload).digest != descriptor.digest


#: contract-net/v1's body grammar (derived from its declaration).
CONTRACT_NET_GRAMMAR = cbcl.descriptor.read_descriptor(
    (DESCRIPTORS / "contract-net-v1.cbcl").read_bytes()).grammar


GOOD = '(protocol-descriptor (id p/v1) (version 2) (intents INFORM) (grammar "body: SYMBOL"))'


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("(descriptor)", "expected a (protocol-descriptor"),
        ('(protocol-descriptor (version 1) (id p) (intents INFORM) (grammar "x"))',
         "out of order"),
        ('(protocol-descriptor (id p) (id q) (version 1) (intents INFORM) (grammar "x"))',
         "repeated"),
        ('(protocol-descriptor (id p) (version 1) (grammar "x"))', "missing field (intents"),
        ('(protocol-descriptor (id p) (version 1) (intents INFORM) (grammar "x") (colour 1))',
         "unknown field"),
        ('(protocol-descriptor (id "p") (version 1) (intents INFORM) (grammar "x"))',
         "(id …) must hold exactly one value, a symbol"),
        ('(protocol-descriptor (id p) (version -1) (intents INFORM) (grammar "x"))',
         "must not be negative"),
        ('(protocol-descriptor (id p) (version 1) (intents INFORM MAYBE) (grammar "x"))',
         "not an intent"),
        ('(protocol-descriptor (id p) (version 1) (intents INFORM INFORM) (grammar "x"))',
         "twice"),
        ("(protocol-descriptor (id p) (version 1) (intents INFORM) (grammar x))",
         "a string"),
    ],
)
def test_descriptor_refusals(text: str, fragment: str) -> None:
    with pytest.raises(DescriptorError, match=None) as info:
        cbcl.descriptor.read_descriptor(text.encode())
    assert fragment in info.value.message
    assert info.value.exit_code == 5


# --------------------------------------------------------------------------- pass 2


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.stem for e in EXAMPLES])
def test_every_shipped_example_parses_fully(example: Path, registry: Registry) -> None:
    parsed = cbcl.parse(example.read_bytes(), registry=registry)
    assert parsed.protocol == registry.get(parsed.protocol).id  # type: ignore[union-attr]


def test_keywords_in_context(registry: Registry) -> None:
    # "task" and ":cmd" are literals of task-assignment/v1 only where the grammar expects
    # them; inside (compute …) and :deadline's value they are data.
    body = ('(task :id "t" :cmd (compute :cmd task :task compute :algorithm :cmd) '
            ':deadline (task :cmd ":cmd"))')
    parsed = cbcl.parse(message("task-assignment/v1", "PROPOSE", body), registry=registry)
    assert parsed.body[3] == cbcl.Keyword("cmd")  # type: ignore[index]
    assert parsed.body[4][1:3] == (cbcl.Keyword("cmd"), cbcl.Symbol("task"))  # type: ignore[index]


@pytest.mark.parametrize(
    ("body", "column_of", "fragment"),
    [
        ('(task :id "t" :colour red)', ":colour",
         'expected ":cmd" or ":resources" or ":deadline" or \')\', found keyword :colour'),
        ('(task :id "t" :resources (:cpu 1.5))', "1.5", "expected an integer, found decimal 1.5"),
        ('(job :id "t")', "job", 'expected "task", found symbol job'),
        ('(task :id "t" :cmd (compute :algorithm))', "))", "expected a value, found ')'"),
        ('(task :id "t")  ', None, None),
    ],
)
def test_body_refusals_point_at_the_token(registry: Registry, body: str,
                                          column_of: str | None, fragment: str | None) -> None:
    data = message("task-assignment/v1", "PROPOSE", body)
    if fragment is None:
        assert cbcl.parse(data, registry=registry)
        return
    with pytest.raises(BodyError) as info:
        cbcl.parse(data, registry=registry)
    error = info.value
    assert fragment in error.message
    assert error.exit_code == 3
    prefix = data.decode()[: data.decode().index("(body ") + 6]
    assert error.column == len(prefix) + body.index(column_of) + 1  # type: ignore[arg-type]


def test_incomplete_body(registry: Registry) -> None:
    with pytest.raises(BodyError) as info:
        cbcl.parse(message("canon-a/v1", "QUERY", "(query)"), registry=registry)
    assert info.value.message.endswith('expected "weather", found \')\'')
    with pytest.raises(BodyError) as info:
        cbcl.parse(message("contract-net/v1", "REFUSE", "busy"), registry=registry)
    assert "expected '(', found symbol busy" in info.value.message


def test_intents_the_protocol_does_not_govern(registry: Registry) -> None:
    with pytest.raises(ProtocolError, match="does not govern CFP"):
        cbcl.parse(message("task-assignment/v1", "CFP", '(task :id "t")'), registry=registry)
    # NOT-UNDERSTOOD is always possible: no body, or a reason string.
    data = message("task-assignment/v1", "NOT-UNDERSTOOD", '"cannot parse your task"')
    assert cbcl.parse(data, registry=registry).body == "cannot parse your task"
    with pytest.raises(BodyError):
        cbcl.parse(message("task-assignment/v1", "NOT-UNDERSTOOD", "(x)"), registry=registry)


def test_governed_intent_requires_a_body(registry: Registry) -> None:
    data = (b'(CBCL/1.0 (message-id "m") (sender agent://a) (receiver agent://b) '
            b"(intent PROPOSE) (protocol task-assignment/v1))")
    with pytest.raises(BodyError, match="requires a body"):
        cbcl.parse(data, registry=registry)


def test_unknown_protocol_with_a_registry(registry: Registry) -> None:
    with pytest.raises(cbcl.UnknownProtocolError):
        cbcl.parse(message("nope/v1", "INFORM", "1"), registry=registry)


def test_deep_bodies_are_walked_without_recursion(tmp_path: Path) -> None:
    payload = (b'(protocol-descriptor (id deep/v1) (version 1) (intents INFORM) '
               b'(grammar "body: value"))')
    reg = Registry(cache_dir=tmp_path)
    reg.load(payload, allow_unsigned=True)
    deep = "(" * 5000 + ")" * 5000
    limits = cbcl.Limits(max_depth=6000)
    assert cbcl.parse(message("deep/v1", "INFORM", deep), registry=reg, limits=limits)


# --------------------------------------------------------------------------- generated messages

LITERAL_WORDS = ["task", "compute", "cfp", "proposal", "request", "query", "weather",
                 "celsius", "action", "bid", "busy", "deny", "error", "results"]
TOKENS = {
    "SYMBOL": st.one_of(st.sampled_from(LITERAL_WORDS), names),
    "STRING": st.text(max_size=8).map(cbcl.canonical),
    "INTEGER": st.integers(-(2**63), 2**63 - 1).map(str),
    "DECIMAL": st.decimals(places=3, allow_nan=False, allow_infinity=False,
                           min_value=-10**6, max_value=10**6).map(cbcl.canonical),
    "KEYWORD": st.one_of(st.sampled_from([":cmd", ":id", ":task", ":reason", ":city"]),
                         names.map(lambda n: ":" + n)),
    "URI": st.sampled_from(["agent://x", "s3://b/k", "urn-x://é"]),
}
TOKENS["NUMBER"] = st.one_of(TOKENS["INTEGER"], TOKENS["DECIMAL"])
TOKENS["value"] = values.map(cbcl.canonical)


def generator(name: str, intent: str | None = None) -> tuple[st.SearchStrategy[str], str]:
    """Bodies of the shipped descriptor ``name`` for ``intent`` (its first intent by
    default), generated from its grammar with keyword sets shuffled, and its id."""
    descriptor = cbcl.descriptor.read_descriptor((DESCRIPTORS / f"{name}.cbcl").read_bytes())
    source = read_grammar(descriptor.grammar, starts=descriptor.start_rules)
    chosen = descriptor.intents[0] if intent is None else cbcl.Intent(intent)
    start = descriptor.starts[chosen]
    return bodies(source, start, TOKENS), str(descriptor.id)


@pytest.mark.parametrize("name", SHIPPED)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_generated_bodies_parse(name: str, data: st.DataObject,
                                tmp_path_factory: pytest.TempPathFactory) -> None:
    strategy, protocol = generator(name)
    body = data.draw(strategy)
    reg = _shared_registry(tmp_path_factory)
    loaded = reg.get(protocol)
    assert loaded is not None
    intent = loaded.descriptor.intents[0].value
    value = cbcl.read(body)
    assert recognise_body(loaded, value, loaded.descriptor.intents[0])  # every generated body
    try:  # and a full parse accepts it unless the descriptor's schema has a say
        assert cbcl.parse(message(protocol, intent, body), registry=reg).body == value
    except cbcl.SchemaError:
        assert loaded.schema is not None


@pytest.mark.parametrize("name", SHIPPED)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_mutated_bodies_give_a_result_or_a_cbcl_error(name: str, data: st.DataObject,
                                                     tmp_path_factory: pytest.TempPathFactory,
                                                     ) -> None:
    strategy, protocol = generator(name)
    tokens = data.draw(strategy).split(" ")
    if len(tokens) > 1:
        index = data.draw(st.integers(0, len(tokens) - 2))
        op = data.draw(st.sampled_from(["drop", "swap", "dup"]))
        if op == "drop":
            del tokens[index]
        elif op == "swap":
            tokens[index], tokens[index + 1] = tokens[index + 1], tokens[index]
        else:
            tokens.insert(index, tokens[index])
    reg = _shared_registry(tmp_path_factory)
    intent = reg.get(protocol).descriptor.intents[0].value  # type: ignore[union-attr]
    with contextlib.suppress(cbcl.CBCLError):
        cbcl.parse(message(protocol, intent, " ".join(tokens)), registry=reg)


_REGISTRY: list[Registry] = []


def _shared_registry(factory: pytest.TempPathFactory) -> Registry:
    if not _REGISTRY:
        reg = Registry(cache_dir=factory.mktemp("cache"))
        for name in SHIPPED:
            reg.load((DESCRIPTORS / f"{name}.cbcl").read_bytes(), allow_unsigned=True)
        _REGISTRY.append(reg)
    return _REGISTRY[0]


# --------------------------------------------------------------------------- the registry


def test_unsigned_descriptors_need_the_opt_in(tmp_path: Path) -> None:
    with pytest.raises(TrustError) as info:
        Registry(cache_dir=tmp_path).load(GOOD.encode())
    assert info.value.exit_code == 6
    assert info.value.message == "descriptor verification failed"
    assert info.value.reason.startswith("unsigned descriptor")


@pytest.mark.slow
def test_versions_only_move_forward(tmp_path: Path) -> None:
    # Rollback and equivocation are trust refusals (spec/trust.md); tests/test_trust.py
    # covers them with signed descriptors and a state directory.
    reg = Registry(cache_dir=tmp_path)
    reg.load(GOOD.encode(), allow_unsigned=True)
    assert reg.load(GOOD.encode(), allow_unsigned=True) is reg.get("p/v1")  # same: no-op
    with pytest.raises(TrustError) as info:
        reg.load(GOOD.replace("(version 2)", "(version 1)").encode(), allow_unsigned=True)
    assert info.value.reason.startswith("rollback:")
    with pytest.raises(TrustError) as info:
        reg.load(GOOD.replace("SYMBOL", "STRING").encode(), allow_unsigned=True)
    assert info.value.reason.startswith("equivocation:")
    newer = reg.load(GOOD.replace("(version 2)", "(version 3)").encode(), allow_unsigned=True)
    assert reg.get("p/v1") is newer
    assert len(reg) == 1 and "p/v1" in reg and "q" not in reg and "not a symbol!" not in reg


@pytest.mark.slow
def test_refused_grammars_raise_their_verdict(tmp_path: Path) -> None:
    reg = Registry(cache_dir=tmp_path)
    ambiguous = GOOD.replace('"body: SYMBOL"', '"body: e\\ne: e \\"+\\" e | INTEGER"')
    with pytest.raises(GrammarError) as info:
        reg.load(ambiguous.encode(), allow_unsigned=True)
    assert info.value.verdict == "ambiguous"
    assert info.value.exit_code == 5


@pytest.mark.slow
def test_negative_cache_refuses_without_recompiling(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    reg = Registry(cache_dir=tmp_path)
    bad = GOOD.replace('"body: SYMBOL"', '"body: /regex/"').encode()
    with pytest.raises(GrammarError):
        reg.load(bad, allow_unsigned=True)
    monkeypatch.setattr(Registry, "_compile", lambda *_: pytest.fail("recompiled"))
    with pytest.raises(GrammarError) as info:
        reg.load(bad, allow_unsigned=True)
    assert info.value.verdict == "rejected"


@pytest.mark.slow
def test_disk_cache_serves_a_fresh_process_state(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from cbcl.protocol import _registry

    payload = GOOD.replace('"body: SYMBOL"', '"body: \\"(\\" STRING INTEGER \\")\\""').encode()
    Registry(cache_dir=tmp_path).load(payload, allow_unsigned=True)
    _registry.DEFAULT_GRAMMAR_CACHE.clear()  # as if in a new process: only the disk remains
    monkeypatch.setattr(Registry, "_compile", lambda *_: pytest.fail("recompiled"))
    reg = Registry(cache_dir=tmp_path)
    reg.load(payload, allow_unsigned=True)
    assert cbcl.parse(message("p/v1", "INFORM", '("s" 1)'), registry=reg).body == ("s", 1)
    with pytest.raises(BodyError):
        cbcl.parse(message("p/v1", "INFORM", '(1 "s")'), registry=reg)
    entries = [p for p in tmp_path.iterdir() if p.suffix == ".json"]
    assert len(entries) == 1
    assert (tmp_path.stat().st_mode & 0o777) == 0o700
    assert (tmp_path / "secret").stat().st_mode & 0o777 == 0o600


@pytest.mark.slow
def test_tampered_cache_entries_are_recompiled(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from cbcl.protocol import _registry

    Registry(cache_dir=tmp_path).load(GOOD.encode(), allow_unsigned=True)
    (entry,) = [p for p in tmp_path.iterdir() if p.suffix == ".json"]
    blob = entry.read_bytes()
    entry.write_bytes(blob.replace(b'"start":', b'"start": ', 1))  # body no longer matches
    _registry.DEFAULT_GRAMMAR_CACHE.clear()
    calls = []
    original = Registry._compile

    def counting(self: Registry, grammar: str, starts: tuple[str, ...]) -> Any:
        calls.append(grammar)
        return original(self, grammar, starts)

    monkeypatch.setattr(Registry, "_compile", counting)
    Registry(cache_dir=tmp_path).load(GOOD.encode(), allow_unsigned=True)
    assert len(calls) == 1


def test_cache_directory_open_to_others_is_not_used(tmp_path: Path) -> None:
    from cbcl.core._cache import DiskCache

    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    assert not DiskCache(shared).usable
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "private", target_is_directory=True)
    (tmp_path / "private").mkdir(mode=0o700)
    assert not DiskCache(link).usable
    assert DiskCache(tmp_path / "private").usable


def test_compiled_data_is_validated() -> None:
    grammar = CONTRACT_NET_GRAMMAR
    data = to_data(compile_grammar(grammar, starts=starts_of("contract-net-v1")))
    assert from_data(json.loads(json.dumps(data))).verdict == "LALR(1)"
    forges: tuple[Callable[[dict[str, Any]], object], ...] = (
        lambda d: d["tables"]["actions"][0].update({"LPAR": 10**6}),
        lambda d: d["tables"]["actions"][0].update({"LPAR": -10**6}),
        lambda d: d["tables"].update(start=-1),
        lambda d: d["tables"]["rules"].append(["x", -1, None]),
        lambda d: d.update(format=999),
        lambda d: d.update(verdict="ambiguous"),
        lambda d: d["literals"].update({"LIT_0": 5}),
    )
    for forge in forges:
        forged = json.loads(json.dumps(data))
        forge(forged)
        with pytest.raises(ValueError):
            from_data(forged)


# --------------------------------------------------------------------------- the guard


def test_compile_guard_times_out() -> None:
    grammar = CONTRACT_NET_GRAMMAR
    started = time.perf_counter()
    with pytest.raises(GrammarError, match="longer than") as info:
        compile_guarded(grammar, timeout=0.01, starts=starts_of("contract-net-v1"))
    assert info.value.verdict == "rejected"
    assert time.perf_counter() - started < 5


@pytest.mark.slow
def test_compile_guard_limits_memory() -> None:
    grammar = CONTRACT_NET_GRAMMAR
    # The worker dies of the memory limit ("the grammar compiler …"); on a loaded machine
    # the same starved worker may first pass its deadline ("compiling the grammar took …").
    with pytest.raises(GrammarError, match=r"compiler|compiling the grammar") as info:
        compile_guarded(grammar, memory=24 << 20,  # too little to even load lark
                        starts=starts_of("contract-net-v1"))
    assert info.value.verdict == "rejected"


@pytest.mark.slow
def test_guarded_and_in_process_compiles_agree() -> None:
    # (canon-a/v1 version 2's hand-written grammar, one start rule body: kept in history)
    grammar = cbcl.descriptor.read_descriptor(
        (DESCRIPTORS / "history" / "canon-a-v1.version-2.cbcl").read_bytes()).grammar
    guarded = compile_guarded(grammar)
    local = compile_grammar(grammar)
    assert (guarded.verdict, guarded.report, guarded.literals) == \
        (local.verdict, local.report, local.literals)


HOSTILE = {
    "regex": "body: /a+/",
    "import": "%import common.WORD\nbody: WORD",
    "override": "%override body: SYMBOL\nbody: SYMBOL",
    "template": "body: t{SYMBOL}\nt{x}: x",
    "tilde": 'body: "a" ~ 3',
    "priority": "body.2: SYMBOL",
    "deep grouping": "body: " + "(" * 500 + "SYMBOL" + ")" * 500,
    "rule chain": "body: r0\n" + "".join(f"r{i}: r{i + 1}\n" for i in range(3000)),
    "unlexable literal": 'body: "a b"',
    "64 KiB": "body: SYMBOL\n" + "// " + "x" * 65536,
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_grammars_are_rejected_quickly(name: str) -> None:
    started = time.process_time()
    with pytest.raises(GrammarError) as info:
        compile_grammar(HOSTILE[name])
    assert info.value.verdict == "rejected"
    assert time.process_time() - started < 1


# --------------------------------------------------------------------------- CLI


def cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    return subprocess.run([sys.executable, "-m", "cbcl", *args], input=stdin,
                          capture_output=True, check=False, env=env)  # type: ignore[return-value]


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES, ids=[e.stem for e in EXAMPLES])
def test_cli_parses_every_example(example: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "cbcl", "parse", str(example), "--descriptor",
         str(descriptor_for(example)), "--allow-unsigned", "--json"],
        capture_output=True, check=False, env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["protocol"] in {"task-assignment/v1", "contract-net/v1",
                                                   "request/v1", "canon-a/v1"}


@pytest.mark.slow
def test_cli_refuses_unsigned_without_the_flag(tmp_path: Path) -> None:
    example = EXAMPLES[0]
    done = subprocess.run(
        [sys.executable, "-m", "cbcl", "parse", str(example), "--descriptor",
         str(descriptor_for(example))],
        capture_output=True, check=False, env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)})
    assert done.returncode == 6
    assert done.stderr.startswith(b"trust: descriptor verification failed (unsigned descriptor")


def vector_verdict(path: Path) -> str:
    return path.read_text().splitlines()[0].removeprefix("// verdict: ")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ambiguous-expression", "classic-lr1-not-lalr1",
                                  "dangling-else", "layered-expression", "task-assignment"])
def test_grammar_check_vectors(name: str) -> None:
    path = VECTORS / f"{name}.lark"
    done = subprocess.run([sys.executable, "-m", "cbcl", "grammar", "check", str(path)],
                          capture_output=True, text=True, check=False)
    verdict = vector_verdict(path)
    assert done.stdout.splitlines()[0] == verdict
    assert done.returncode == (0 if verdict == "LALR(1)" else 5)
    assert "__" not in done.stdout
    if verdict == "ambiguous":
        assert "Derivation 1:" in done.stdout and "Derivation 2:" in done.stdout


@pytest.mark.slow
def test_grammar_check_reads_descriptors_and_reports_rejections(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "cbcl", "grammar", "check",
                           str(DESCRIPTORS / "request-v1.cbcl")], capture_output=True,
                          text=True, check=False)
    assert (done.returncode, done.stdout.splitlines()[0]) == (0, "LALR(1)")
    bad = tmp_path / "bad.lark"
    bad.write_text("body: SYMBOL\n%import common.WORD\n")
    done = subprocess.run([sys.executable, "-m", "cbcl", "grammar", "check", str(bad)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 5
    assert done.stdout.splitlines()[0] == "rejected"
    assert done.stdout.splitlines()[1].startswith("grammar 2:1: ")
