"""A shell like a user's after ``. .venv/bin/activate``, for tests that run README lines."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def user_shell_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a shell in which ``cbcl`` and ``python`` are this interpreter's:
    ``cbcl`` a program of its own (so ``kill %1`` stops a server started with ``&``),
    both on ``PATH``, the checkout on ``PYTHONPATH``; ``extra`` added."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "cbcl").write_text(
        f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m cbcl \"$@\"\n")
    (bin_dir / "cbcl").chmod(0o755)
    (bin_dir / "python").symlink_to(sys.executable)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": str(ROOT), **extra}
