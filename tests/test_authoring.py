"""Descriptor authoring: cbcl.build_descriptor, cbcl.descriptor.render_descriptor, and the
``cbcl descriptor build`` and ``cbcl descriptor new`` commands (spec §6.7)."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given, strategies as st
from shell_env import user_shell_env
from strategies import strings, symbols

import cbcl
from cbcl.cli import main

ROOT = Path(__file__).parent.parent
DESCRIPTORS = ROOT / "descriptors"
KEY = DESCRIPTORS / "keys" / "cbcl-example.key"


def digest_of(payload: bytes) -> str:
    """A descriptor's digest (spec §3.2): ``sha256:`` + the lowercase hex SHA-256."""
    return "sha256:" + hashlib.sha256(payload).hexdigest()


GRAMMAR = """\
// A small auction: bids and their answers.
body: bid | accept | decline
bid: "(" "bid" ":item" STRING ":price" DECIMAL [":note" STRING] ")"
accept: "(" "accept" ":item" STRING ")"
decline: "(" "decline" ":item" STRING ":reason" STRING ")"
"""
SCHEMA = """\
; the bid's price is positive
(schema
  (record bid (:item (string :min-length 1) required) (:price (decimal :min 0.01) required)
              (:note (string :max-length 16))))
"""
CONVERSATION = ("(conversation (roles bidder seller) (initial start) (final won lost) "
                "(transitions (start PROPOSE bidder bid) (bid ACCEPT seller won) "
                "(bid REJECT seller lost)))")


def load_make_descriptors() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_descriptors",
                                                  DESCRIPTORS / "make_descriptors.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MAKE = load_make_descriptors()
SHIPPED: dict[str, tuple[str, int, str]] = MAKE.SHIPPED


def message(body: str, intent: str = "PROPOSE", protocol: str = "auction/v1") -> bytes:
    return (f'(CBCL/1.0 (message-id "m-1") (sender agent://a) (receiver agent://b) '
            f"(intent {intent}) (protocol {protocol}) (body {body}))").encode()


def registry(tmp_path: Path, payload: bytes) -> cbcl.Registry:
    reg = cbcl.Registry(cache_dir=tmp_path / "cache")
    reg.load(payload, allow_unsigned=True)
    return reg


def comment_of(payload: bytes) -> str | None:
    """The leading comment lines of a descriptor file, as build_descriptor takes them."""
    lines = []
    for line in payload.decode().split("\n"):
        if not line.startswith(";"):
            break
        lines.append(line.removeprefix(";").removeprefix(" "))
    return "\n".join(lines) if lines else None


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """The exit code, stdout and stderr of ``cbcl ARGS`` (usage errors exit 2)."""
    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


# --------------------------------------------------------------------------- Python API


def test_build_load_parse(tmp_path: Path) -> None:
    payload = cbcl.build_descriptor("auction/v1", 3, ["PROPOSE", "ACCEPT", "REJECT"], GRAMMAR,
                                    schema=SCHEMA, conversation=CONVERSATION,
                                    functions=(cbcl.Symbol("functions"), cbcl.Symbol("now")),
                                    expires=4_000_000_000_000)
    descriptor = cbcl.descriptor.read_descriptor(payload)
    assert (descriptor.id, descriptor.version, descriptor.expires) == (
        cbcl.Symbol("auction/v1"), 3, 4_000_000_000_000)
    assert descriptor.intents == (cbcl.Intent.PROPOSE, cbcl.Intent.ACCEPT, cbcl.Intent.REJECT)
    assert descriptor.grammar == GRAMMAR
    assert descriptor.schema == cbcl.read(SCHEMA.encode())  # comments gone, value kept
    assert descriptor.conversation == cbcl.read(CONVERSATION.encode())
    assert descriptor.functions == (cbcl.Symbol("functions"), cbcl.Symbol("now"))
    assert payload.startswith(b"(protocol-descriptor\n  (id auction/v1)\n  (version 3)\n"
                              b"  (expires 4000000000000)\n  (intents PROPOSE ACCEPT REJECT)\n")

    reg = registry(tmp_path, payload)
    parsed = cbcl.parse(message('(bid :item "lamp" :price 12.50)'), registry=reg)
    assert parsed.body == (cbcl.Symbol("bid"), cbcl.Keyword("item"), "lamp",
                           cbcl.Keyword("price"), cbcl.read(b"12.50"))
    with pytest.raises(cbcl.BodyError):  # the grammar is in force
        cbcl.parse(message('(bid :item "lamp")'), registry=reg)
    with pytest.raises(cbcl.SchemaError):  # and the schema
        cbcl.parse(message('(bid :item "lamp" :price 0.00)'), registry=reg)


def test_build_without_sections_or_comment_has_the_minimal_layout() -> None:
    payload = cbcl.build_descriptor("p", 0, "INFORM", 'body: "(" "x" ")"\n')
    assert payload == (b"(protocol-descriptor\n  (id p)\n  (version 0)\n  (intents INFORM)\n"
                       b'  (grammar "body: \\"(\\" \\"x\\" \\")\\"\\n"))\n')
    commented = cbcl.build_descriptor("p", 0, "INFORM", 'body: "(" "x" ")"\n',
                                      comment="first\n\nthird")
    assert commented == b"; first\n;\n; third\n" + payload


def test_build_accepts_sections_as_text_bytes_or_values() -> None:
    as_text = cbcl.build_descriptor("a/v1", 1, "PROPOSE", GRAMMAR, schema=SCHEMA)
    as_bytes = cbcl.build_descriptor("a/v1", 1, "PROPOSE", GRAMMAR, schema=SCHEMA.encode())
    as_value = cbcl.build_descriptor("a/v1", 1, "PROPOSE", GRAMMAR,
                                     schema=list(cbcl.read(SCHEMA.encode())))  # type: ignore[arg-type]
    assert as_text == as_bytes == as_value


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"id": 7}, TypeError, "protocol id is a str"),
        ({"id": "not an id"}, cbcl.DescriptorError, "is not a protocol id"),
        ({"version": "1"}, TypeError, "version is an int"),
        ({"version": True}, TypeError, "version is an int"),
        ({"version": -1}, cbcl.DescriptorError, "version must be from 0"),
        ({"expires": 2**63}, cbcl.DescriptorError, "expires must be from 0"),
        ({"intents": ["PROPOSE", "BID"]}, cbcl.DescriptorError, "unknown intent 'BID'"),
        ({"intents": "PROPOSE PROPOSE"}, cbcl.DescriptorError, "PROPOSE is listed twice"),
        ({"intents": []}, cbcl.DescriptorError, "at least one intent"),
        ({"intents": [1]}, TypeError, "an intent is a str"),
        ({"grammar": GRAMMAR.encode()}, TypeError, "a grammar is a str"),
        ({"grammar": "body: x\n"}, cbcl.GrammarError, "x"),
        ({"grammar": 'body: a | b\na: "(" "x" ")"\nb: "(" "x" ")"\n'}, cbcl.GrammarError,
         "grammar check"),
        ({"schema": "(schema (record bid (:price money)))"}, cbcl.DescriptorError,
         "unknown type money"),
        ({"schema": "(schema (record bid"}, cbcl.MalformedError, "unclosed"),
        ({"schema": "(functions now)"}, cbcl.DescriptorError, "expected a (schema …) section"),
        ({"schema": {"record": "bid"}}, TypeError, "a schema section is"),
        ({"conversation": CONVERSATION.replace("REJECT", "CFP")}, cbcl.DescriptorError,
         "CFP"),
        ({"functions": "(functions launch)"}, cbcl.DescriptorError, "launch"),
        ({"comment": "line\rinjected"}, ValueError, "U+000D"),
        ({"comment": "bidi \u202e"}, ValueError, "U+202E"),
        ({"comment": 3}, TypeError, "comment is a str"),
        ({"schema": "(schema " + "(record x) " * 5000 + ")", "limits": cbcl.Limits(
            max_message_bytes=4096)}, cbcl.LimitError, ""),
    ],
)
def test_build_refuses_bad_arguments(kwargs: dict[str, object], error: type[Exception],
                                     text: str) -> None:
    arguments: dict[str, object] = {"id": "auction/v1", "version": 1,
                                    "intents": ["PROPOSE", "ACCEPT", "REJECT"],
                                    "grammar": GRAMMAR, **kwargs}
    with pytest.raises(error, match=None) as caught:
        cbcl.build_descriptor(**arguments)  # type: ignore[arg-type]
    assert text in str(caught.value)


# --------------------------------------------------------------------------- round trip


@pytest.mark.parametrize("path", sorted([*DESCRIPTORS.glob("*-v1.cbcl"),
                                         *(ROOT / "cbcl" / "grammars").glob("*.cbcl")]),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_shipped_descriptors_render_back_byte_for_byte(path: Path) -> None:
    payload = path.read_bytes()
    descriptor = cbcl.descriptor.read_descriptor(payload)
    text = cbcl.descriptor.render_descriptor(descriptor, comment=comment_of(payload))
    assert text == payload
    assert cbcl.descriptor.read_descriptor(text) == descriptor
    # Without the comment: the same fields, another digest (the bytes differ).
    bare = cbcl.descriptor.read_descriptor(cbcl.descriptor.render_descriptor(descriptor))
    assert bare.digest != descriptor.digest
    assert dataclasses.replace(bare, digest=descriptor.digest) == descriptor


SHIPPED_DESCRIPTORS = [cbcl.descriptor.read_descriptor((DESCRIPTORS / f"{name}.cbcl").read_bytes())
                       for name in SHIPPED]
comments = st.none() | st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc"),
                           blacklist_characters="\u202a\u202b\u202c\u202d\u202e\u2066\u2067"
                                                "\u2068\u2069\u2028\u2029\ufeff")
    | st.sampled_from("\t\n"), max_size=60)


@st.composite
def descriptors(draw: st.DrawFn) -> cbcl.descriptor.ProtocolDescriptor:
    """A descriptor with drawn fields; its sections (and so the intents they need) come
    from a shipped one, its grammar is any text."""
    base = draw(st.sampled_from(SHIPPED_DESCRIPTORS))
    others = [intent for intent in cbcl.Intent if intent not in base.intents]
    intents = draw(st.permutations(base.intents)) + draw(st.lists(
        st.sampled_from(others), unique=True, max_size=3))
    functions = draw(st.sampled_from([base.functions, None]))
    return dataclasses.replace(
        base, id=draw(symbols), version=draw(st.integers(0, 2**63 - 1)),
        expires=draw(st.none() | st.integers(0, 2**63 - 1)), intents=tuple(intents),
        grammar=draw(strings), digest="sha256:unknown",
        schema=draw(st.sampled_from([base.schema, None])),
        functions=functions,
        # (the rules call functions: without the list, none of them may stand)
        constraints=draw(st.sampled_from([base.constraints, None])) if functions else None,
        intent_rules=tuple((intent, rule) for intent in intents
                           for listed, rule in base.intent_rules if listed == intent))


@given(descriptors(), comments)
def test_render_then_read_gives_the_descriptor_back(descriptor: cbcl.descriptor.ProtocolDescriptor,
                                                    comment: str | None) -> None:
    text = cbcl.descriptor.render_descriptor(descriptor, comment=comment)
    again = cbcl.descriptor.read_descriptor(text)
    assert again.digest == digest_of(text)
    assert dataclasses.replace(again, digest=descriptor.digest) == descriptor
    assert cbcl.descriptor.render_descriptor(again, comment=comment) == text


@given(st.sampled_from(sorted(SHIPPED)), symbols, st.integers(0, 2**63 - 1),
       st.none() | st.integers(0, 2**63 - 1), comments)
def test_built_descriptors_render_back_byte_for_byte(name: str, ident: cbcl.Symbol,
                                                     version: int, expires: int | None,
                                                     comment: str | None) -> None:
    _, _, intents = SHIPPED[name]
    # (a declared protocol's grammar is its built descriptor's: derived, not a file)
    grammar = cbcl.descriptor.read_descriptor(
        (DESCRIPTORS / f"{name}.cbcl").read_bytes()).grammar
    sections = {section: (DESCRIPTORS / "sections" / f"{name}.{section}.cbcl").read_bytes()
                for section in ("schema", "conversation", "functions")
                if (DESCRIPTORS / "sections" / f"{name}.{section}.cbcl").exists()}
    payload = cbcl.build_descriptor(
        ident, version, intents, grammar, expires=expires, comment=comment, **sections)  # type: ignore[arg-type]
    descriptor = cbcl.descriptor.read_descriptor(payload)
    assert (descriptor.id, descriptor.version, descriptor.expires) == (ident, version, expires)
    assert cbcl.descriptor.render_descriptor(descriptor, comment=comment) == payload


def test_render_refuses_what_is_not_a_descriptor() -> None:
    with pytest.raises(TypeError):
        cbcl.descriptor.render_descriptor(b"(protocol-descriptor)")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"U\+000D"):
        cbcl.descriptor.render_descriptor(SHIPPED_DESCRIPTORS[0], comment="a\r\nb")


# --------------------------------------------------------------------------- make_descriptors


def test_make_descriptors_is_a_wrapper_over_the_api() -> None:
    source = (DESCRIPTORS / "make_descriptors.py").read_text()
    assert "build_descriptor" in source and "(protocol-descriptor" not in source
    assert set(MAKE.DECLARED) | set(MAKE.HAND_WRITTEN) == set(SHIPPED)
    assert not set(MAKE.DECLARED) & set(MAKE.HAND_WRITTEN)
    for name in SHIPPED:
        assert MAKE.render(name) == (DESCRIPTORS / f"{name}.cbcl").read_bytes()


# --------------------------------------------------------------------------- cbcl descriptor build


def build_args(name: str) -> list[str]:
    """The ``cbcl descriptor build`` arguments that make the shipped NAME.cbcl: from its
    declaration, or its grammar file and sections."""
    ident, version, intents = SHIPPED[name]
    comment = comment_of((DESCRIPTORS / f"{name}.cbcl").read_bytes())
    assert comment is not None
    if name in MAKE.DECLARED:
        args = ["descriptor", "build", str(DESCRIPTORS / "declarations" / f"{name}.cbcl")]
        for line in comment.split("\n"):
            args += ["--comment", line]
        return args
    args = ["descriptor", "build", "--id", ident, "--version", str(version),
            "--grammar", str(DESCRIPTORS / "grammars" / f"{name}.lark"),
            "--intents", *intents.split()]
    for section in ("schema", "conversation", "functions", "constraints"):
        path = DESCRIPTORS / "sections" / f"{name}.{section}.cbcl"
        if path.exists():
            args += [f"--{section}", str(path)]
    for line in comment.split("\n"):
        args += ["--comment", line]
    return args


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_cli_rebuilds_each_shipped_descriptor(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path, name: str) -> None:
    out = tmp_path / f"{name}.cbcl"
    code, stdout, err = run(capsys, *build_args(name), "-o", str(out))
    assert (code, err) == (0, "")
    wanted = (DESCRIPTORS / f"{name}.cbcl").read_bytes()
    assert out.read_bytes() == wanted
    assert stdout == (f"wrote {out}: {SHIPPED[name][0]} version {SHIPPED[name][1]} "
                      f"{digest_of(wanted)} "
                      f"(unsigned)\n")
    # With --key, OUT is the signed descriptor: the shipped one without its header comment.
    signed = tmp_path / f"{name}.signed.cbcl"
    code, stdout, err = run(capsys, *build_args(name), "--key", str(KEY), "-o", str(signed))
    assert (code, err) == (0, "")
    assert stdout.endswith("(signed by cbcl-example)\n")
    shipped_signed = (DESCRIPTORS / f"{name}.signed.cbcl").read_bytes()
    assert shipped_signed.endswith(signed.read_bytes())
    assert signed.read_bytes().startswith(b"(signed-descriptor")


def test_cli_build_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    code = main([*build_args("request-v1"), "-o", "-"])
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    assert out.encode() == (DESCRIPTORS / "request-v1.cbcl").read_bytes()


def test_cli_build_with_expires(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "g.lark").write_text(GRAMMAR)
    out = tmp_path / "out.cbcl"
    code, _, err = run(capsys, "descriptor", "build", "--id", "auction/v1", "--version", "2",
                       "--grammar", str(tmp_path / "g.lark"), "--intents", "PROPOSE",
                       "--expires", "1700000000000", "-o", str(out))
    assert (code, err) == (0, "")
    assert cbcl.descriptor.read_descriptor(out.read_bytes()).expires == 1_700_000_000_000
    code, out_text, _ = run(capsys, "descriptor", "inspect", str(out))
    assert code == 0 and "expires: 1700000000000" in out_text


BAD_GRAMMARS = {
    "undefined.lark": 'body: x\nx: "(" y ")"\n',
    "ambiguous.lark": 'body: a | b\na: "(" "x" ")"\nb: "(" "x" ")"\n',
}


@pytest.mark.parametrize(
    ("files", "options", "code", "prefix"),
    [
        ({"g.lark": BAD_GRAMMARS["undefined.lark"]}, [], 5, "grammar 2:8: {d}/g.lark: "),
        ({"g.lark": BAD_GRAMMARS["ambiguous.lark"]}, [], 5,
         "grammar: {d}/g.lark: grammar is not loadable: ambiguous"),
        ({"g.lark": b"body: \xff"}, [], 5, "grammar 1:7: {d}/g.lark: the grammar text is not "
                                           "valid UTF-8"),
        ({"g.lark": "// " + "x" * 40_000}, [], 5, "grammar 1:32769: {d}/g.lark: the grammar "
                                                 "text is more than 32768 bytes"),
        ({}, ["--intents", "PROPOSE", "BID"], 5, "descriptor: --intents: unknown intent 'BID'"),
        ({}, ["--id", "no id"], 5, "descriptor: --id: 'no id' is not a protocol id"),
        ({"s.cbcl": "(schema (record bid (:price money)))"}, ["--schema", "{d}/s.cbcl"], 5,
         "descriptor: {d}/s.cbcl: "),
        ({"s.cbcl": "(schema (record bid"}, ["--schema", "{d}/s.cbcl"], 3,
         "malformed 1:20: {d}/s.cbcl: "),
        ({"s.cbcl": "(schema (record x))" + " " * 5000},
         ["--schema", "{d}/s.cbcl", "--max-message-bytes", "1000"], 4, "limit: {d}/s.cbcl: "),
        ({"c.cbcl": CONVERSATION}, ["--conversation", "{d}/c.cbcl", "--intents", "PROPOSE"],
         5, "descriptor: {d}/c.cbcl: (conversation …) at $.conversation"),
        ({"f.cbcl": "(functions launch)"}, ["--functions", "{d}/f.cbcl"], 5,
         "descriptor: {d}/f.cbcl: (functions …) names launch"),
        ({"f.cbcl": "(schema)"}, ["--functions", "{d}/f.cbcl"], 5,
         "descriptor: {d}/f.cbcl: expected a (functions …) section"),
        ({}, ["--schema", "{d}/missing.cbcl"], 1, "io: {d}/missing.cbcl: "),
        ({"k.key": "not a key"}, ["--key", "{d}/k.key"], 6, "trust: "),
        ({}, ["--version", "-1"], 2, "usage: cbcl descriptor build: argument --version: "),
        ({}, ["--expires", "1e3"], 2, "usage: cbcl descriptor build: argument --expires: "),
        ({}, ["--comment", "a\rb"], 2, "usage: cbcl descriptor build: argument --comment: "),
        ({}, ["--intents"], 2, "usage: cbcl descriptor build: argument --intents: "),
    ],
)
def test_cli_build_refusals(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                            files: dict[str, str | bytes], options: list[str], code: int,
                            prefix: str) -> None:
    (tmp_path / "ok.lark").write_text(GRAMMAR)
    for file, content in files.items():
        path = tmp_path / file
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    grammar = tmp_path / ("g.lark" if "g.lark" in files else "ok.lark")
    out = tmp_path / "out.cbcl"
    args = ["descriptor", "build", "--id", "auction/v1", "--version", "1",
            "--grammar", str(grammar), "--intents", "PROPOSE", "ACCEPT", "REJECT",
            "-o", str(out), *(option.replace("{d}", str(tmp_path)) for option in options)]
    got, stdout, err = run(capsys, *args)
    assert got == code
    assert stdout == ""
    assert err.startswith(prefix.replace("{d}", str(tmp_path))), err
    assert err.count("\n") == 1
    assert not out.exists()  # a refused build writes nothing


# --------------------------------------------------------------------------- cbcl descriptor new


def readme_commands(readme: str) -> list[str]:
    """The indented command lines of a README written by ``descriptor new`` (with their
    continuation lines joined)."""
    lines = readme.replace("\\\n", "").split("\n")
    return [line.strip() for line in lines
            if line.startswith("  ") and line.split()[0] in ("cbcl", "mkdir", "until")]


def run_line(capsys: pytest.CaptureFixture[str], line: str) -> str:
    """Run one README line in this process: ``cbcl …`` through main, others in a shell."""
    argv = shlex.split(line)
    if argv[0] != "cbcl":
        subprocess.run(line, shell=True, check=True)
        return ""
    code, out, err = run(capsys, *argv[1:])
    assert (code, err) == (0, ""), line
    return out


def test_new_then_build_sign_parse(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    code, out, err = run(capsys, "descriptor", "new", "auction/v1", "--dir", "auction")
    assert (code, err) == (0, "")
    directory = tmp_path / "auction"
    names = sorted(path.name for path in directory.iterdir())
    assert names == ["auction-v1.README.txt", "auction-v1.declaration.cbcl",
                     "auction-v1.example.cbcl", "handler.py"]
    readme, serving = (directory / "auction-v1.README.txt").read_text().split(
        "Then serve it", 1)
    commands = readme_commands(readme)
    # After the build: serve with the starting handler, send the sample (test_agent and
    # test_readme run that part).
    assert [c.split()[:2] for c in readme_commands(serving)] == [
        ["cbcl", "serve"], ["until", "grep"], ["cbcl", "send"]]
    assert "--handler handler:respond" in serving
    assert [c.split()[:3] for c in commands] == [
        ["cbcl", "descriptor", "build"],
        ["cbcl", "keygen", "--out"], ["mkdir", "-p", "trust"], ["cbcl", "descriptor", "sign"],
        ["cbcl", "parse", "auction-v1.example.cbcl"]]
    assert readme_commands(out) == commands  # what it prints is what the README says
    assert "next: cd auction" in out

    monkeypatch.chdir(directory)
    outputs = [run_line(capsys, line) for line in commands]
    assert outputs[0].startswith("wrote auction-v1.cbcl: auction/v1 version 1 sha256:")
    example = cbcl.read((directory / "auction-v1.example.cbcl").read_bytes())
    assert outputs[-1] == cbcl.canonical(example) + "\n"
    descriptor = cbcl.descriptor.read_descriptor((directory / "auction-v1.cbcl").read_bytes())
    assert descriptor.schema is not None and descriptor.id == cbcl.Symbol("auction/v1")
    # The starting schema is in force: a body against it is refused (exit 7), and the
    # grammar too (exit 3), which takes keyword arguments in any order and each intent's
    # own body only.
    offer = '(offer :currency EUR :item "lamp" :price 12)'
    for body, intent, wanted in (('(ask :item "lamp" :quantity 0)', "REQUEST", 7),
                                 ('(ask :item "lamp")', "REQUEST", 3),
                                 ('(ask :quantity 2 :item "lamp")', "REQUEST", 0),
                                 (offer, "REQUEST", 3), (offer, "INFORM", 0)):
        (directory / "m.cbcl").write_bytes(message(body, intent))
        code, _, err = run(capsys, "parse", "m.cbcl", "--descriptor", "auction-v1.signed.cbcl",
                           "--trust", "trust")
        assert code == wanted, err


def test_new_refuses_to_overwrite(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert run(capsys, "descriptor", "new", "a/v1", "--dir", str(tmp_path))[0] == 0
    (tmp_path / "a-v1.declaration.cbcl").write_text("mine\n")
    (tmp_path / "handler.py").unlink()
    code, out, err = run(capsys, "descriptor", "new", "a/v1", "--dir", str(tmp_path))
    assert (code, out) == (1, "")
    assert err.startswith(f"io: {tmp_path}/a-v1.declaration.cbcl: exists")
    assert (tmp_path / "a-v1.declaration.cbcl").read_text() == "mine\n"
    assert not (tmp_path / "handler.py").exists()  # nothing was written


def test_new_refuses_a_bad_id(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run(capsys, "descriptor", "new", "two words", "--dir", str(tmp_path))
    assert (code, out) == (5, "")
    assert err == "descriptor: ID: 'two words' is not a protocol id (a symbol such as " \
                  "auction/v1)\n"
    assert list(tmp_path.iterdir()) == []


def test_new_names_files_after_the_id(capsys: pytest.CaptureFixture[str],
                                      tmp_path: Path) -> None:
    code, _, _ = run(capsys, "descriptor", "new", "acme.bids/v2*", "--dir", str(tmp_path))
    assert code == 0
    assert (tmp_path / "acme.bids-v2.declaration.cbcl").exists()
    declared = cbcl.descriptor.read_declaration(
        (tmp_path / "acme.bids-v2.declaration.cbcl").read_bytes())
    assert declared.id == cbcl.Symbol("acme.bids/v2*")


@pytest.mark.slow
def test_new_readme_runs_verbatim_in_a_shell(tmp_path: Path) -> None:
    """The README's commands, as a user would paste them, with ``cbcl`` this Python's."""
    env = user_shell_env(tmp_path, XDG_CACHE_HOME=str(tmp_path / "cache"))
    subprocess.run([sys.executable, "-m", "cbcl", "descriptor", "new", "auction/v1"],
                   cwd=tmp_path, env=env, check=True, capture_output=True)
    readme = (tmp_path / "auction-v1.README.txt").read_text()
    # Every command, the server started in the background and the sample sent to it.
    script = "set -e\n" + "\n".join(readme_commands(readme)) + "\nkill %1\nwait || true\n"
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    parsed, replied = done.stdout.rstrip("\n").splitlines()[-2:]
    assert parsed.endswith("(body (ask :item \"lamp\" :quantity 2)))")
    assert replied.endswith("(body (offer :item \"lamp\" :price 25.00 :currency EUR)))")
