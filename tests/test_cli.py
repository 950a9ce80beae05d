"""The command line (draft §6): outputs, exit codes, one-line errors, never a traceback."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from cbcl.cli import main

ROOT = Path(__file__).parent.parent
EXAMPLE = ROOT / "descriptors" / "examples" / "task-assignment-v1.cbcl"
CANONICAL = ("(CBCL/1.0 (message-id \"req-12345\") (sender agent://sys/task-manager) "
             "(receiver agent://sys/worker-1) (intent PROPOSE) (protocol task-assignment/v1) "
             "(body (task :id \"task-678\" :cmd (compute :algorithm bfs :data-ref "
             "\"hdfs://cluster/data/graph-17\") :resources (:cpu 2 :mem 4096) :deadline "
             "(+ (now) 3600))))")


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_canon_prints_exactly_the_canonical_bytes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "canon", str(EXAMPLE))
    assert (code, out, err) == (0, CANONICAL, "")


def test_parse_envelope_only(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "parse", "--envelope-only", str(EXAMPLE))
    assert (code, out) == (0, CANONICAL + "\n")


def test_parse_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "parse", "--envelope-only", "--json", str(EXAMPLE))
    assert code == 0
    data = json.loads(out)
    assert data["message-id"] == "req-12345"
    assert data["intent"] == "PROPOSE"
    assert data["sender"] == "agent://sys/task-manager"
    assert data["body"][0] == {"symbol": "task"}
    assert data["body"][6][1] == 2 or data["body"][6] == [{"keyword": "cpu"}, 2,
                                                        {"keyword": "mem"}, 4096]


def test_full_parse_of_unknown_protocol_exits_5(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "parse", str(EXAMPLE))
    assert (code, out) == (5, "")
    assert err.startswith("unknown-protocol 7:13: unknown protocol task-assignment/v1")


@pytest.mark.parametrize(
    ("command", "data", "code", "prefix"),
    [
        ("canon", b"(a 007)", 3, "malformed 1:4: "),
        ("canon", b"(a \xff)", 3, "malformed 1:4: invalid UTF-8"),
        ("canon", b"(" * 100_000, 4, "limit 1:65: "),
        ("parse", b"(a 007)", 3, "envelope 1:2: expected CBCL/1.0"),
        ("parse", b"(CBCL/1.0 (sender agent://a))", 3, "envelope 1:12: "),
        ("parse", b'(CBCL/1.0 (message-id "\xff"))', 3, "malformed 1:24: invalid UTF-8"),
        ("parse", b'(CBCL/1.0 (message-id "x") (sender agent://a) (receiver agent://b) '
                  b"(intent CFP) (protocol p) (body " + b"(" * 100 + b"))", 4, "limit 1:"),
    ],
)
def test_errors_are_one_line_with_exit_codes(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str], command: str,
                                             data: bytes, code: int, prefix: str) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    args = [command, "--envelope-only", "-"] if command == "parse" else [command, "-"]
    got, out, err = run(capsys, *args)
    assert got == code
    assert out == ""
    assert err.startswith(prefix)
    assert err.count("\n") == 1


def test_oversized_input_is_refused_without_reading_it_all(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    big = tmp_path / "big.cbcl"
    big.write_bytes(b'"' + b"x" * (3 << 20) + b'"')
    code, _, err = run(capsys, "canon", str(big))
    assert code == 4
    assert err == "limit: document exceeds the limit of 1048576 bytes\n"
    code, out, _ = run(capsys, "canon", "--max-message-bytes", str(4 << 20), str(big))
    assert code == 4  # now the string limit refuses it
    assert out == ""


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for args in ([], ["frobnicate"], ["parse", "--no-such-flag"],
                 ["canon", "--max-message-bytes", "0"]):
        with pytest.raises(SystemExit) as info:
            main(args)
        assert info.value.code == 2
        assert capsys.readouterr().err.startswith("usage:")


def test_missing_file_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "canon", str(tmp_path / "absent.cbcl"))
    assert code == 1
    assert err.startswith("io: ") and err.count("\n") == 1


@pytest.mark.slow
def test_python_dash_m_and_console_script_agree() -> None:
    result = subprocess.run([sys.executable, "-m", "cbcl", "canon", str(EXAMPLE)],
                            capture_output=True, check=False)
    assert result.returncode == 0
    assert result.stdout.decode() == CANONICAL
    result = subprocess.run([sys.executable, "-m", "cbcl", "canon", "-"], input=b"(a 007)",
                            capture_output=True, check=False)
    assert result.returncode == 3
    assert b"Traceback" not in result.stderr


def test_json_output_escapes_bidi_controls(monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    data = (b'(CBCL/1.0 (message-id "m") (sender agent://a) (receiver agent://b) '
            b'(intent INFORM) (protocol p) (body "abc\\u202edef\\u0007"))')
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    code, out, _ = run(capsys, "parse", "--envelope-only", "--json", "-")
    assert code == 0
    assert "\u202e" not in out and "\x07" not in out
    assert json.loads(out)["body"] == "abc\u202edef\u0007"


def test_usage_errors_quoting_a_file_name_are_one_escaped_line(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    key = tmp_path / "evil\u202e\nname.key"  # a key id made from a hostile file name
    key.write_bytes(b"")
    with pytest.raises(SystemExit) as stopped:
        main(["descriptor", "sign", str(EXAMPLE), "--key", str(key), "-o", str(tmp_path / "o")])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\u202e" not in err
    assert "is not a key id" in err and "\\u202e" in err.lower()
