"""The README's and the documentation's examples run as written: the library example, the
grammar check, the language-model and interop examples (docs/), and "Your own protocol in
five minutes" (the README: shell and Python, each against a server in another process);
and the README's two set-up commands exist."""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from shell_env import user_shell_env

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()
#: The README and every page of the documentation site: marked examples live in both.
PAGES = "\n".join([README, *(page.read_text() for page in sorted((ROOT / "docs").rglob("*.md")))])


def _marked(marker: str) -> str:
    """The code block right after ``<!-- marker -->``, in the README or a docs/ page."""
    block = re.search(rf"<!-- {marker} -->\n```\w*\n(.*?)```", PAGES, re.S)
    assert block is not None, marker
    return block.group(1)


def test_library_example_runs(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    code = _marked("library")
    monkeypatch.chdir(ROOT)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    assert out.getvalue() == "limit 1:65: lists nested more than 64 deep\n"


def test_two_setup_commands() -> None:
    for marker in ("main-command", "test-command"):
        block = re.search(rf"<!-- {marker} -->\n```\n(.+)\n```", README)
        assert block is not None, marker
        assert block.group(1).startswith("python3 -m venv .venv && .venv/bin/pip install ")



def test_no_example_reaches_outside_the_clone() -> None:
    """Every file an example names is in the repository (a clone has no ``../shared``)."""
    commands = [line for line in PAGES.splitlines()
                if re.match(r"\s*(\$ )?(cbcl|python|\.venv/bin/)", line)]
    assert commands
    assert [line for line in commands if "../" in line] == []


def test_grammar_check_example_runs_as_shown(capsys) -> None:  # type: ignore[no-untyped-def]
    """The ``$ cbcl grammar check FILE`` example reads a file of the repository and prints
    the lines the README shows (``…`` stands for lines left out)."""
    import shlex

    from cbcl.cli import main

    examples = re.findall(r"```\n\$ (cbcl grammar check [^\n]*)\n(.*?)```", PAGES, re.S)
    assert examples, "neither the README nor docs/ shows a $ cbcl grammar check example"
    for command, shown in examples:
        *_, name = shlex.split(command)
        path = (ROOT / name).resolve()
        assert path.is_relative_to(ROOT) and path.is_file(), f"{command}: no such file"
        main(["grammar", "check", str(path)])
        out = capsys.readouterr().out.splitlines()
        wanted = [line for line in shown.splitlines() if line != "…"]
        assert out[:1] == wanted[:1], command  # the verdict
        rest = iter(out)
        missing = [line for line in wanted if not any(line == got for got in rest)]
        assert missing == [], f"{command}: not printed in this order: {missing}"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_your_own_protocol_in_five_minutes_from_the_shell(tmp_path: Path) -> None:
    script = _marked("five-minutes-cli")
    done = subprocess.run(["bash", "-euc", script + "\nkill %1\nwait\n"], cwd=tmp_path,
                          env=user_shell_env(tmp_path), capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr + done.stdout
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("(CBCL/1.0")]
    shown = re.search(r"```\n(\(CBCL/1\.0 \(message-id \"reply-1\".*?)\n```", README, re.S)
    assert shown is not None
    head, tail = shown.group(1).split("(timestamp …)")
    assert line.startswith(head) and line.endswith(tail), line
    log = (tmp_path / "auction" / "seller.log").read_text()
    assert "auction/v1 version 1 loaded -> accepted" in log, log


@pytest.mark.slow
def test_your_own_protocol_in_five_minutes_from_python(tmp_path: Path) -> None:
    env = user_shell_env(tmp_path)
    made = subprocess.run(
        ["bash", "-euc", "cbcl descriptor new auction/v1 --dir auction && cd auction && "
         "cbcl keygen --out my-key && mkdir -p trust && cp my-key.pub trust/"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert made.returncode == 0, made.stderr
    here = tmp_path / "auction"
    (here / "seller.py").write_text(_marked("five-minutes-seller"))
    (here / "buyer.py").write_text(_marked("five-minutes-buyer"))
    seller = subprocess.Popen([sys.executable, "seller.py"], cwd=here, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert seller.stdout is not None
        assert seller.stdout.readline() == "serving\n"
        done = subprocess.run([sys.executable, "buyer.py"], cwd=here, env=env,
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        wanted = re.search(r"prints `(INFORM offer [^`]*)`", README)
        assert wanted is not None
        assert done.stdout == wanted.group(1) + "\n"
    finally:
        seller.terminate()
        seller.communicate(timeout=10)


def test_language_models_example_runs_as_shown(tmp_path: Path) -> None:
    (tmp_path / "descriptors").symlink_to(ROOT / "descriptors")
    env = user_shell_env(tmp_path)
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", _marked("language-models")],
                          cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr + done.stdout
    assert (tmp_path / "propose.lark").read_text().startswith("// CBCL contract-net/v1")
    assert "## Messages: CBCL/1.0, protocol contract-net/v1" in done.stdout  # the prompt
    last = done.stdout.splitlines()[-1]  # extract: the message alone, not the prose around it
    assert last.startswith('(CBCL/1.0 (message-id "p-1")') and "My bid" not in last
    wrong = _marked("language-models").split("printf '", 1)[1].split("' \\", 1)[0]
    wrong = wrong.replace("\\n", "\n").replace(":currency", ":Currency")
    hinted = subprocess.run(["bash", "-euc", "cbcl extract - --descriptor "
                             "descriptors/contract-net-v1.cbcl --allow-unsigned --hint"],
                            input=wrong, cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=60, check=False)
    assert hinted.returncode == 3, hinted.stderr
    for line in _marked("language-models-hint").strip().splitlines():
        assert line in hinted.stderr.splitlines(), (line, hinted.stderr)


def test_interop_example_runs_as_shown(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "vectors").symlink_to(ROOT / "tests" / "vectors")
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", _marked("interop")],
                          cwd=tmp_path, env=user_shell_env(tmp_path), capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr + done.stdout
    lines = done.stdout.splitlines()
    assert lines[0].startswith("(request :sender (agent-identifier :name rma@")
    assert lines[1].startswith("(CBCL/1.0 ") and '"role": "ROLE_USER"' in lines[2]
    assert "lost: receivers" in done.stderr
