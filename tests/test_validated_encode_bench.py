"""A smoke run of benchmarks/validated_encode.py at a tiny scale: it runs and reports every
set with each contender and ratio (a benchmark: nothing here asserts a figure)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow  # (a subprocess that builds pydantic models: ~5-8 s)


def test_validated_encode_tiny(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "validated_encode.py"), "--messages", "12",
         "--rounds", "1", "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
        timeout=120, check=False, env=dict(os.environ, CBCL_BENCH_ALLOW_PURE="1"))
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert set(results["sets"]) == {f"{protocol}/{size}"
                                    for protocol in ("request-v1", "contract-net-v1")
                                    for size in ("small", "medium")}
    for row in results["sets"].values():
        assert row["messages"] == 12 and row["frame_bytes_mean"] > 0
        assert {"cbcl", "cbcl before", "pydantic"} <= set(row["us_per_message"])
        assert row["ratios"]["cbcl vs pydantic"] > 0
