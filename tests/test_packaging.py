"""The wheel carries everything: build it, install it into a fresh virtual environment and
parse a message there, so a packaging mistake (a grammar left out of the wheel, say) fails."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent

SCRIPT = r"""
import sys, cbcl
from importlib import resources
assert cbcl.__file__.startswith(sys.prefix), cbcl.__file__
assert resources.files("cbcl.grammars").joinpath("envelope.lark").is_file()
assert resources.files("cbcl").joinpath("py.typed").is_file()
message = cbcl.parse(sys.stdin.buffer.read(), envelope_only=True)
print(message.intent.value, message.protocol)
"""


@pytest.mark.slow
def test_wheel_installs_and_parses(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w",
                    str(dist), str(ROOT)], check=True, capture_output=True)
    (wheel,) = dist.glob("cbcl-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    # The C sources' shared header travels with them (an sdist built from the wheel's
    # sources compiles), and where CI has a compiler every optional extension is built.
    assert "cbcl/_native_src/cstack.h" in names
    assert "cbcl/_native_src/module.c" in names
    if os.environ.get("CBCL_REQUIRE_SPEEDUPS"):
        assert any(n.startswith("cbcl/_native.") and n.endswith((".so", ".pyd"))
                   for n in names), names

    env_dir = tmp_path / "env"
    venv.create(env_dir, with_pip=True)
    python = env_dir / ("Scripts" if os.name == "nt" else "bin") / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", str(wheel)],
                   check=True, capture_output=True)
    # The run-time dependencies come from this environment, after the fresh one's own
    # site-packages, so the wheel's cbcl is the one imported (the script checks).
    fresh_site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip()
    Path(fresh_site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    example = (ROOT / "descriptors" / "examples" / "task-assignment-v1.cbcl").read_bytes()
    result = subprocess.run([str(python), "-c", SCRIPT], input=example, capture_output=True,
                            cwd=tmp_path, check=False)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.decode().split() == ["PROPOSE", "task-assignment/v1"]

    cli = env_dir / "bin" / "cbcl"
    result = subprocess.run([str(cli), "canon", "-"], input=b"( a  b )", capture_output=True,
                            cwd=tmp_path, check=False)
    assert (result.returncode, result.stdout) == (0, b"(a b)")


@pytest.mark.parametrize(
    "source", sorted(p.name for p in (ROOT / "cbcl" / "_native_src").glob("*.c")))
def test_the_c_sources_compile_with_warnings_as_errors(source: str) -> None:
    """Each source of the optional extension (cbcl/_native_src/) compiles with -Wall
    -Wextra -Werror (the package's own
    build stays lenient, so that a compiler's new warning never costs a user the
    extension; tests/fuzz/asan_build.sh builds with -Werror too). Where CI requires the
    extensions it has a compiler, and this runs; elsewhere it needs one on the PATH."""
    import shutil

    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        if os.environ.get("CBCL_REQUIRE_SPEEDUPS"):
            raise AssertionError("no C compiler, yet the C extensions are required")
        pytest.skip("no C compiler here")
    include = sysconfig.get_paths()["include"]
    result = subprocess.run(
        [compiler, "-fsyntax-only", "-Wall", "-Wextra", "-Werror", f"-I{include}",
         str(ROOT / "cbcl" / "_native_src" / source)], capture_output=True, text=True,
        check=False)
    assert result.returncode == 0, result.stderr
