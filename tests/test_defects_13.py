"""The small defects of issue 13, each pinned: vectors inside the repository, usage errors
that name their subcommand and exit 2, one ``descriptor:`` prefix, trust reasons in
``str()``, a hint for a binary frame given to a text command, and decimals of any exponent
printed (or refused with a CBCL error) without touching a decimal context."""

from __future__ import annotations

import argparse
import re
import time
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import example, given, strategies as st

import cbcl
from cbcl import DescriptorError, MalformedError, TrustError
from cbcl.cli import build_parser, main
from cbcl.json_mapping import from_json, to_json

ROOT = Path(__file__).resolve().parents[1]
VECTORS = ROOT / "spec" / "vectors"
DESCRIPTORS = ROOT / "descriptors"
KEYS = DESCRIPTORS / "keys"
SIGNED = DESCRIPTORS / "contract-net-v1.signed.cbcl"
PROPOSE = DESCRIPTORS / "examples" / "contract-net-v1-propose.cbcl"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of ``cbcl ARGS`` (usage errors exit via SystemExit)."""
    try:
        code = main(list(args))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


# --------------------------------------------------------------------------- 1. vectors


GRAMMARS = ("ambiguous-expression", "classic-lr1-not-lalr1", "dangling-else",
            "layered-expression", "task-assignment")


def test_the_public_vectors_live_in_the_repository() -> None:
    found = sorted(path.stem for path in (VECTORS / "grammars").glob("*.lark"))
    assert found == sorted(GRAMMARS)
    for name in GRAMMARS:
        first = (VECTORS / "grammars" / f"{name}.lark").read_text().splitlines()[0]
        assert first.startswith("// verdict: "), name
    messages = VECTORS / "messages"
    assert (messages / "task-proposal.cbcl").is_file()
    assert not (messages / "task-proposal.canonical").read_bytes().endswith(b"\n")
    assert "copied unchanged" in (VECTORS / "README.md").read_text()  # and from where


def test_no_test_reads_vectors_from_outside_the_repository() -> None:
    """A test that reads ``../shared`` skips (or fails) on a clean clone."""
    outside = re.compile(r"/work/shared|parents\[2\]|\"shared\" / \"vectors\"|shared/vectors")
    offenders = [f"{path.name}:{number}"
                 for path in sorted((ROOT / "tests").glob("*.py"))
                 if path.name != Path(__file__).name
                 for number, line in enumerate(path.read_text().splitlines(), 1)
                 if outside.search(line)]
    assert offenders == []


# ---------------------------------------------------------------- 2. and 6. usage errors


def test_conversation_check_without_a_descriptor_is_a_usage_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "conversation", "check", str(PROPOSE))
    assert (code, out) == (2, "")
    assert err.startswith("usage: cbcl conversation check: ") and "--descriptor" in err
    assert err.count("\n") == 1


def test_an_unknown_option_is_reported_by_its_subcommand(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "encode", str(PROPOSE), "--json", "--descriptor", str(SIGNED))
    assert (code, out, err) == (2, "", "usage: cbcl encode: unrecognized arguments: --json\n")
    code, _, err = run(capsys, "descriptor", "verify", "x", "--trust", "t", "--bogus")
    assert (code, err) == (2, "usage: cbcl descriptor verify: unrecognized arguments: --bogus\n")
    code, _, err = run(capsys, "parse", "a", "b")
    assert (code, err) == (2, "usage: cbcl parse: unrecognized arguments: b\n")
    code, _, err = run(capsys, "--bogus", "parse")  # before any subcommand: cbcl's own
    assert (code, err) == (2, "usage: cbcl: unrecognized arguments: --bogus\n")


def _leaf_commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
                   ) -> list[tuple[str, ...]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [path]
    return [leaf for name, child in subs[0].choices.items()
            for leaf in _leaf_commands(child, (*path, name))]


LEAVES = _leaf_commands(build_parser())


def test_every_command_is_checked() -> None:
    assert {("encode",), ("decode",), ("conversation", "check"), ("descriptor", "verify"),
            ("grammar", "check"), ("serve",), ("negotiate",)} <= set(LEAVES)


@pytest.mark.parametrize("command", LEAVES, ids=" ".join)
def test_every_usage_error_names_its_command(capsys: pytest.CaptureFixture[str],
                                             command: tuple[str, ...]) -> None:
    code, out, err = run(capsys, *command, "--no-such-option")
    assert (code, out) == (2, "")
    assert err.startswith(f"usage: cbcl {' '.join(command)}: "), err
    assert err.count("\n") == 1


# ------------------------------------------------------------ 3. one "descriptor:" prefix


def test_a_descriptor_problem_is_prefixed_once(capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path) -> None:
    bad = tmp_path / "bad.cbcl"
    bad.write_text("(descriptor (id x/v1))")
    for command in (("parse", str(PROPOSE)), ("conversation", "check", str(PROPOSE))):
        code, _, err = run(capsys, *command, "--descriptor", str(bad), "--allow-unsigned")
        assert (code, err) == (5, "descriptor: expected a (protocol-descriptor …) document\n")


def test_one_line_never_repeats_the_kind() -> None:
    error = DescriptorError("descriptor: (functions …) names x twice")
    assert str(error) == "descriptor: (functions …) names x twice"  # names the document
    assert error.one_line() == "descriptor: (functions …) names x twice"
    assert DescriptorError("no body").one_line() == "descriptor: no body"


# ------------------------------------------------------------------- 4. trust reasons


def test_a_trust_error_shows_its_reason_once() -> None:
    error = TrustError("descriptor verification failed", reason="bad signature")
    assert str(error) == "descriptor verification failed (bad signature)"
    assert error.one_line() == "trust: descriptor verification failed (bad signature)"
    assert error.message == "descriptor verification failed"  # what a peer may be told
    assert error.reason == "bad signature"
    assert str(TrustError("trust store refused")) == "trust store refused"
    assert TrustError().one_line() == "trust: verification failed"


def test_the_library_error_carries_the_reason(tmp_path: Path) -> None:
    registry = cbcl.Registry(trust=KEYS, cache_dir=tmp_path)
    with pytest.raises(TrustError) as info:
        registry.load((DESCRIPTORS / "contract-net-v1.cbcl").read_bytes())
    assert str(info.value).startswith("descriptor verification failed (unsigned descriptor")


def test_the_cli_prints_a_trust_reason_once(capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path) -> None:
    text = SIGNED.read_text()
    at = text.index('(sig "cbcl-example" "') + len('(sig "cbcl-example" "')
    tampered = tmp_path / "tampered.cbcl"
    tampered.write_text(text[:at] + ("B" if text[at] == "A" else "A") + text[at + 1:])
    code, _, err = run(capsys, "descriptor", "verify", str(tampered), "--trust", str(KEYS))
    assert code == 6
    assert err.startswith("trust: descriptor verification failed (")
    assert err.count("bad signature") == 1 and err.count("\n") == 1


# ------------------------------------------------------------ 5. a binary frame as text


@pytest.fixture
def frame(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    out = tmp_path / "frame.bin"
    assert run(capsys, "encode", str(PROPOSE), "--descriptor", str(SIGNED), "--trust",
               str(KEYS), "-o", str(out))[0] == 0
    assert out.read_bytes()[:2] == b"\xcb\x4c"
    return out


@pytest.mark.parametrize("command", [
    ("parse",), ("canon",), ("parse", "--descriptor", str(SIGNED), "--trust", str(KEYS)),
    ("sign-message", "--key", str(KEYS / "cbcl-example.key")), ("descriptor", "inspect"),
    ("conversation", "check", "--descriptor", str(SIGNED), "--trust", str(KEYS)),
], ids=" ".join)
def test_a_text_command_given_a_binary_frame_says_so(
        capsys: pytest.CaptureFixture[str], frame: Path, command: tuple[str, ...]) -> None:
    code, out, err = run(capsys, *command, str(frame))
    assert (code, out) == (3, "")
    assert err.startswith("malformed 1:1: ") and "invalid UTF-8" in err
    assert "looks like a binary CBCL frame" in err
    assert f"cbcl decode {frame} --descriptor" in err
    assert err.count("\n") == 1


def test_only_a_frame_gets_the_hint(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    latin = tmp_path / "latin1.cbcl"
    latin.write_bytes(b'"caf\xe9"')
    code, _, err = run(capsys, "canon", str(latin))
    assert code == 3 and "binary" not in err


def test_decode_given_text_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "decode", str(PROPOSE), "--descriptor", str(SIGNED),
                       "--trust", str(KEYS))
    assert code == 3
    assert "bad magic" in err and f"looks like CBCL text: read it with `cbcl parse {PROPOSE}" \
        in err


def test_grammar_check_of_bytes_that_are_not_utf8_is_a_verdict(
        capsys: pytest.CaptureFixture[str], frame: Path, tmp_path: Path) -> None:
    latin = tmp_path / "latin1.lark"
    latin.write_bytes(b'body: "caf\xe9"')
    for path in (frame, latin):  # was: internal error, exit 70
        code, out, err = run(capsys, "grammar", "check", str(path))
        assert (code, err) == (5, "")
        assert out.startswith("rejected\ngrammar ") and "not valid UTF-8" in out


# -------------------------------------------------------------- 7. decimals, any exponent


def _positional(value: Decimal) -> str:
    """The canonical text by another route: ``format`` in positional notation, and one
    fractional digit for an integral value (only for modest exponents: it writes every
    digit)."""
    text = format(value, "f")
    return text if "." in text else text + ".0"


def test_1e27_prints() -> None:
    # 29 significant digits once quantized: more than the default context's 28.
    assert cbcl.canonical(Decimal("1e27")) == "1" + "0" * 27 + ".0"
    assert len(cbcl.canonical(Decimal("1e37"))) == 40  # the longest power of ten
    assert cbcl.canonical(Decimal("0E+30")) == "0.0"
    assert cbcl.canonical(Decimal("-0E+3")) == "-0.0"
    assert cbcl.canonical((Decimal("1e27"),)) == "(" + "1" + "0" * 27 + ".0)"


@pytest.mark.parametrize("exponent", range(-45, 46))
@pytest.mark.parametrize("coefficient", [0, 1, -1, 7, 123456789, -(10**20 + 3)])
def test_decimals_across_exponents(coefficient: int, exponent: int) -> None:
    value = Decimal((int(coefficient < 0), tuple(map(int, str(abs(coefficient)))), exponent))
    wanted = _positional(value)
    if len(wanted) <= 40:
        text = cbcl.canonical(value)
        assert text == wanted
        again = cbcl.read(text)
        assert again == value and cbcl.canonical(again) == text
        assert to_json(value) == {"decimal": text}
        assert from_json({"decimal": text}) == value
    else:
        with pytest.raises(MalformedError, match="longer than 40 characters"):
            cbcl.canonical(value)
        with pytest.raises(MalformedError):
            to_json(value)


def test_a_huge_exponent_is_refused_at_once() -> None:
    started = time.process_time()
    for text in ("1e-999999999", "1e999999999", "0E-999999999", "9" * 50 + "e-99999999"):
        with pytest.raises(MalformedError, match="longer than 40 characters"):
            cbcl.canonical(Decimal(text))
        with pytest.raises(MalformedError):  # the JSON mapping, as input
            from_json({"decimal": text})
    assert cbcl.canonical(Decimal("0E+999999999")) == "0.0"
    assert time.process_time() - started < 1.0  # never written out digit by digit


def test_a_refused_decimal_is_a_cbcl_error_and_a_value_error() -> None:
    with pytest.raises(cbcl.CBCLError) as info:
        cbcl.canonical(Decimal("1e40"))
    assert isinstance(info.value, ValueError) and info.value.exit_code == 3
    for bad in (Decimal("NaN"), Decimal("-Infinity"), Decimal("sNaN")):
        with pytest.raises(cbcl.CBCLError, match="CBCL has no"):
            cbcl.canonical(bad)


EXPONENTS = st.one_of(st.integers(-60, 60), st.integers(-10**9, 10**9))


@given(sign=st.integers(0, 1), digits=st.integers(0, 10**45), exponent=EXPONENTS)
@example(sign=0, digits=1, exponent=27)
@example(sign=1, digits=10**38 - 1, exponent=-1)
@example(sign=0, digits=0, exponent=-38)
def test_canonical_decimal_reads_back_or_is_refused(sign: int, digits: int,
                                                    exponent: int) -> None:
    value = Decimal((sign, tuple(int(d) for d in str(digits)), exponent))
    try:
        text = cbcl.canonical(value)
    except cbcl.CBCLError as exc:
        assert isinstance(exc, MalformedError)
        if -60 <= exponent <= 60:
            assert len(_positional(value)) > 40
        return
    assert len(text) <= 40
    again = cbcl.read(text)
    assert type(again) is Decimal and again == value
    assert again.as_tuple() == value.as_tuple() or exponent >= 0  # 5 is read back as 5.0
    assert cbcl.canonical(again) == text
    assert to_json(value) == {"decimal": text} and from_json({"decimal": text}) == value
