"""Descriptor load times: cold (read, check, compile in the guarded worker), warm (compiled
grammar from the disk cache, nothing in memory) and hot (in-memory LRU), for each shipped
descriptor and for synthetic grammars of about 16, 64 and 256 rules (the same measurement
as ``cbcl bench``'s, alone).

    python benchmarks/load.py [--repeat N]

Figures are medians; the warm/cold ratio is what matters (target: warm ≤ 1/10 of cold).
"""

from __future__ import annotations

import argparse
import sys

import installed
from cbcl_bench import find_descriptors, load_times, synthetic_descriptor

SHIPPED = ["task-assignment-v1", "contract-net-v1", "request-v1", "canon-a-v1"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    installed.check()  # the installed cbcl, with its C extension
    directory = find_descriptors()
    cases = {name: (directory / f"{name}.cbcl").read_bytes() for name in SHIPPED}
    cases.update({f"synthetic-{n}-rules": synthetic_descriptor(n) for n in (16, 64, 256)})
    print("| descriptor | cold ms | warm ms | hot ms | warm/cold |")
    print("|---|---|---|---|---|")
    for name, payload in cases.items():
        row = load_times(payload, args.repeat)
        print(f"| {name} | {row['cold_ms']:.0f} | {row['warm_ms']:.2f} | {row['hot_ms']:.3f} | "
              f"1/{1 / row['warm_vs_cold']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
