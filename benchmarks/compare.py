"""Compare CBCL's reader and envelope parser with sexpdata, in one process, on the same
messages. Figures are ratios against the peer measured in the same run (these machines are
noisy); absolute times are printed for context only.

    python benchmarks/compare.py [--repeat N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import sexpdata

import cbcl

ROOT = Path(__file__).resolve().parent.parent


def corpus() -> dict[str, bytes]:
    """The shipped example, and a medium message (~3 KB) built from it (its body is a batch
    that the task-assignment grammar does not govern, so only pass 1 is measured on it)."""
    small = (ROOT / "descriptors" / "examples" / "task-assignment-v1.cbcl").read_bytes()
    message = cbcl.parse(small, envelope_only=True)
    tasks = tuple(
        (cbcl.Symbol("task"), cbcl.Keyword("id"), f"task-{i}", cbcl.Keyword("cmd"),
         (cbcl.Symbol("compute"), cbcl.Keyword("algorithm"), cbcl.Symbol("bfs"),
          cbcl.Keyword("data-ref"), f"hdfs://cluster/data/graph-{i}"),
         cbcl.Keyword("resources"), (cbcl.Keyword("cpu"), i % 8, cbcl.Keyword("mem"), 4096))
        for i in range(24))
    medium = cbcl.Message(message_id="m-2", sender=message.sender, receiver=message.receiver,
                          intent=message.intent, protocol=message.protocol,
                          body=(cbcl.Symbol("batch"), *tasks))
    return {"small": small, "medium": cbcl.canonical(medium).encode()}


def best_per_call(function: Callable[[], object], budget: float) -> float:
    """Median of five rounds' per-call time; each round runs for about budget/5 s."""
    calls = 1
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            function()
        if time.perf_counter() - start > budget / 50:
            break
        calls *= 2
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls * 10):
            function()
        rounds.append((time.perf_counter() - start) / (calls * 10))
    return statistics.median(rounds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--budget", type=float, default=2.0, help="seconds per measurement")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    results: dict[str, dict[str, float]] = {}
    registry = cbcl.Registry(disk_cache=False)
    registry.load((ROOT / "descriptors" / "task-assignment-v1.cbcl").read_bytes(),
                  allow_unsigned=True)
    print("| message | bytes | sexpdata.loads µs | cbcl.read µs | ratio | "
          "cbcl.parse (envelope) µs | ratio | cbcl.parse (both passes) µs | ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, data in corpus().items():
        text = data.decode()
        peer = best_per_call(lambda t=text: sexpdata.loads(t), args.budget)
        read = best_per_call(lambda d=data: cbcl.read(d), args.budget)
        envelope = best_per_call(lambda d=data: cbcl.parse(d, envelope_only=True), args.budget)
        full = best_per_call(lambda d=data: cbcl.parse(d, registry=registry), args.budget) \
            if name == "small" else float("nan")
        results[name] = {"bytes": len(data), "sexpdata_us": peer * 1e6, "read_us": read * 1e6,
                         "read_vs_sexpdata": peer / read, "envelope_us": envelope * 1e6,
                         "envelope_vs_sexpdata": peer / envelope, "full_us": full * 1e6,
                         "full_vs_sexpdata": peer / full}
        both = f"{full * 1e6:.1f} | {peer / full:.2f}×" if full == full else "– | –"
        print(f"| {name} | {len(data)} | {peer * 1e6:.1f} | {read * 1e6:.1f} | "
              f"{peer / read:.2f}× | {envelope * 1e6:.1f} | {peer / envelope:.2f}× | {both} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
