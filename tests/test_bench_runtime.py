"""Smoke runs of the runtime benchmarks (benchmarks/soak.py, benchmarks/stream.py,
benchmarks/slow_grammar.py) at a tiny scale: each script runs against a real ``cbcl serve``
subprocess and writes JSON of the expected shape. Benchmarks are not timed tests: nothing
here asserts a figure, only that the scripts work and the well-behaved peers saw no error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"

pytestmark = pytest.mark.slow


def run(script: str, *args: str, timeout: float = 90.0) -> subprocess.CompletedProcess[str]:
    # (a smoke run, not a measurement: where the extension is not built, as in CI's run
    # without it, the scripts measure the Python reference on purpose)
    environment = dict(os.environ, CBCL_BENCH_ALLOW_PURE="1")
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, check=False,
                          env=environment)
    assert done.returncode == 0, f"{script} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def test_slow_grammar_is_loadable() -> None:
    done = run("slow_grammar.py", "--rules", "8", "--alternatives", "2", "--json")
    row = json.loads(done.stdout)
    assert row["verdict"] == "LALR(1)"
    assert row["lalr_states"] > 0 and row["grammar_bytes"] > 0 and row["compile_s"] >= 0


def _stats(row: dict[str, Any]) -> None:
    assert set(row) == {"n", "p50", "p99", "max"}
    assert row["n"] > 0
    assert 0 < row["p50"] <= row["p99"] <= row["max"]


def test_soak_tiny(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    done = run("soak.py", "--peers", "3", "--conversations", "1", "--think", "0,0.02",
               "--ramp", "0.2", "--slowloris", "2", "--idle", "5", "--slow-offers", "1",
               "--slow-rules", "10", "--slow-alternatives", "2", "--duration", "1",
               "--modes", "distinct,shared", "--json", str(out))
    results = json.loads(out.read_text())
    assert {"machine", "code", "serve_options", "config", "slow_grammar", "modes",
            "targets", "seconds"} <= set(results)
    assert set(results["modes"]) == {"distinct", "shared"}
    for mode, result in results["modes"].items():
        assert {"good", "slowloris", "idle", "slow_offers", "server_memory", "server_log",
                "processes", "warm_up", "serve_command"} <= set(result), mode
        good = result["good"]
        # Only what load cannot change: on a loaded machine a good peer's session can time
        # out (that is the soak's own finding, in benchmarks/soak.py's targets), so whether
        # every one completed is the script's figure, not this smoke test's assertion.
        assert good["sessions"] >= 3 and good["peers"] == 3
        assert 0 <= good["errors"] <= good["sessions"]
        assert 0 <= good["sessions_ok"] <= good["sessions"]
        _stats(good["handshake_ms"])
        _stats(good["conversation_ms"])
        assert result["slowloris"]["connections"] >= 2
        assert result["idle"]["connections"] >= 5
        for kind in ("slowloris", "idle"):
            assert isinstance(result[kind]["connect_failures"], int)
        assert len(result["slow_offers"]) <= 1  # none yet when a loaded machine is slow
        assert all(offer["outcome"] for offer in result["slow_offers"])
        assert result["server_memory"]["peak_rss_mb"] > 0
        assert result["server_log"]["tracebacks"] == 0, result["server_log"]["stderr_tail"]
        assert result["server_alive_at_end"] is True
    assert set(results["targets"]) == {"every_peer_completes", "p99_handshake_ms",
                                       "server_peak_rss_mb"}
    for row in results["targets"].values():
        assert {"achieved", "target", "holds"} <= set(row)
        assert isinstance(row["holds"], bool)
    assert "**Targets**" in done.stdout
    assert done.stdout.count("PASS") + done.stdout.count("FAIL") >= 3


def test_stream_tiny(tmp_path: Path) -> None:
    out = tmp_path / "stream.json"
    done = run("stream.py", "--requests", "150", "--repeats", "1", "--warmup", "20",
               "--pool", "32", "--json", str(out))
    results = json.loads(out.read_text())
    assert {"machine", "code", "config", "systems", "ratios", "targets", "handshake_ms",
            "server_log"} <= set(results)
    assert set(results["systems"]) == {"cbcl-binary", "cbcl-text", "baseline"}
    for system in results["systems"].values():
        for window in ("1", "8"):
            assert system[window]["rps_median"] > 0
            assert len(system[window]["rps_samples"]) == 1
    for window in ("1", "8"):
        assert set(results["ratios"][window]) == {"cbcl-binary", "cbcl-text"}
        assert all(ratio > 0 for ratio in results["ratios"][window].values())
    assert set(results["targets"]) == {"binary_vs_baseline_1_in_flight",
                                       "binary_vs_baseline_8_in_flight"}
    for row in results["targets"].values():
        assert isinstance(row["holds"], bool)
    assert results["server_log"]["tracebacks"] == 0, results["server_log"]["stderr_tail"]
    assert done.stdout.count("PASS") + done.stdout.count("FAIL") == 2
