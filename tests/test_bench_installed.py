"""The benchmark scripts measure a cbcl with its C extension (issue 35): ``installed.check``
names the cbcl a script imported and refuses one without the extension, unless the
reference is asked for; and the servers they start keep the current directory (a
checkout's source tree) off their path."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"

# A script as the benchmarks start: benchmarks/ on the path, then check(). With
# ``hide_native`` the extension cannot be imported, as in a source tree never built.
SCRIPT = """
import sys
sys.path.insert(0, {benchmarks!r})
if {hide_native}:
    sys.modules["cbcl._native"] = None  # import of it raises ImportError
import installed
found = installed.check()
print("native" if found["native"] else "pure")
"""


def _run(hide_native: bool, **env: str) -> subprocess.CompletedProcess[str]:
    code = SCRIPT.format(benchmarks=str(BENCHMARKS), hide_native=hide_native)
    environment = {k: v for k, v in os.environ.items() if k != "CBCL_BENCH_ALLOW_PURE"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False, env={**environment, **env})


def test_a_cbcl_without_the_extension_is_refused() -> None:
    done = _run(hide_native=True)
    assert done.returncode == 1  # SystemExit with a message exits 1
    assert "WITHOUT its C extension" in done.stderr
    assert "no built C extension" in done.stderr
    assert done.stdout == ""


def test_the_reference_is_measured_only_when_asked_for() -> None:
    done = _run(hide_native=True, CBCL_BENCH_ALLOW_PURE="1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "pure"


def test_the_servers_a_benchmark_starts_do_not_import_the_current_directory(
        tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("installed", BENCHMARKS / "installed.py")
    assert spec is not None and spec.loader is not None
    installed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(installed)
    # a decoy cbcl in the current directory: `python -m cbcl` without -P would import it
    (tmp_path / "cbcl").mkdir()
    (tmp_path / "cbcl" / "__init__.py").write_text("raise SystemExit('decoy imported')\n")
    (tmp_path / "cbcl" / "__main__.py").write_text("raise SystemExit('decoy imported')\n")
    done = subprocess.run([*installed.PYTHON, "-m", "cbcl", "--help"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "decoy" not in done.stderr
    plain = subprocess.run([sys.executable, "-m", "cbcl", "--help"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120, check=False)
    assert "decoy imported" in plain.stderr  # (what -P prevents)
