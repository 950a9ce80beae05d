"""The README's library example runs as written, and its two set-up commands exist."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()


def test_library_example_runs(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    (code,) = re.findall(r"```python\n(.*?)```", README, re.S)
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
