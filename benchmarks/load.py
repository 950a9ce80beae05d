"""Descriptor load times: cold (read, check, compile in the guarded worker), warm (compiled
grammar from the disk cache, nothing in memory) and hot (in-memory LRU), for each shipped
descriptor and for synthetic grammars of about 16, 64 and 256 rules.

    python benchmarks/load.py [--repeat N]

Figures are medians; the warm/cold ratio is what matters (target: warm ≤ 1/10 of cold).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from cbcl import Registry, _protocol
from cbcl._canonical import quote

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ["task-assignment-v1", "contract-net-v1", "request-v1", "canon-a-v1"]


def synthetic(rules: int) -> bytes:
    """A descriptor whose grammar has ``rules`` rules: a body choosing among record kinds,
    each with its own keyword attributes (an LALR(1) grammar of realistic shape)."""
    kinds = rules - 1
    lines = ["body: " + " | ".join(f"r{i}" for i in range(kinds))]
    for i in range(kinds):
        lines.append(f'r{i}: "(" "kind{i}" ":id" STRING [":n{i}" INTEGER] '
                     f'(":tag" SYMBOL)* [":data" value] ")"')
    grammar = "\n".join(lines) + "\n"
    return (f"(protocol-descriptor (id synthetic-{rules}/v1) (version 1) (intents INFORM) "
            f"(grammar {quote(grammar)}))").encode()


def median_time(action: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(payload: bytes, repeat: int) -> tuple[float, float, float]:
    def forget() -> None:
        _protocol._COMPILED.clear()
        _protocol._REFUSED.clear()

    def cold() -> None:
        forget()
        with tempfile.TemporaryDirectory() as directory:
            Registry(cache_dir=directory).load(payload, allow_unsigned=True)

    with tempfile.TemporaryDirectory() as directory:
        Registry(cache_dir=directory).load(payload, allow_unsigned=True)

        def warm() -> None:
            forget()
            Registry(cache_dir=directory).load(payload, allow_unsigned=True)

        def hot() -> None:
            Registry(cache_dir=directory).load(payload, allow_unsigned=True)

        return (median_time(cold, repeat), median_time(warm, repeat * 3),
                median_time(hot, repeat * 10))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    cases = {name: (ROOT / "descriptors" / f"{name}.cbcl").read_bytes() for name in SHIPPED}
    cases.update({f"synthetic-{n}-rules": synthetic(n) for n in (16, 64, 256)})
    print("| descriptor | cold ms | warm ms | hot ms | warm/cold |")
    print("|---|---|---|---|---|")
    for name, payload in cases.items():
        cold, warm, hot = measure(payload, args.repeat)
        print(f"| {name} | {cold * 1e3:.0f} | {warm * 1e3:.2f} | {hot * 1e3:.3f} | "
              f"1/{cold / warm:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
