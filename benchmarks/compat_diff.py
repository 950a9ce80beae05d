"""``cbcl descriptor diff`` on two 64-rule descriptors (target: at most 1 s).

    python benchmarks/compat_diff.py [--rules N]        # one timing, printed
    pytest benchmarks/compat_diff.py --benchmark-only  # pytest-benchmark

Shape: ``body`` chooses among N records; record ``i`` is ``(op<i> :id STRING :n INTEGER
[:note STRING] [:next rec<i+1>] …)`` with a keyword set of three members and a list of
integers, and a schema record for each with a range, a length and a one-of. NEW adds an
optional member to every record, widens every range and adds a one-of value: backward
compatible, so the whole product is explored (no early witness). ``breaking`` narrows
one range in the last record instead, so a witness must be found and re-checked (which
compiles both grammars' LALR tables).
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

import installed

from cbcl.core._canonical import quote
from cbcl.protocol._compat import CompatReport, diff_descriptors

if TYPE_CHECKING:
    from pytest_benchmark.fixture import BenchmarkFixture

RULES = 64


def grammar(rules: int, extra: bool) -> str:
    lines = ["body: " + " | ".join(f"rec{i}" for i in range(rules))]
    for i in range(rules):
        nxt = f' [":next" rec{i + 1}]' if i + 1 < rules else ""
        more = f' [":extra{i}" INTEGER]' if extra else ""
        lines.append(
            f'rec{i}: "(" "op{i}" ":id" STRING ":n" INTEGER [":note" STRING]{nxt} '
            f'(":a" INTEGER & ":b" SYMBOL & [":c" STRING]) ":xs" "(" INTEGER* ")"{more} ")"')
    return "\n".join(lines) + "\n"


def schema(rules: int, wide: bool, narrow_last: bool = False) -> str:
    records = []
    for i in range(rules):
        high = 2000 if wide else 1000
        if narrow_last and i == rules - 1:
            high = 999
        colours = "red green blue" + (" cyan" if wide else "")
        records.append(f"(record op{i} (:id (string :min-length 1 :max-length 64) required)"
                       f" (:n (integer :min 0 :max {high}) required)"
                       f" (:b (one-of {colours} other))"
                       f" (else any))")
    return "(schema " + " ".join(records) + ")"


def descriptor(rules: int, version: int, new: bool, narrow_last: bool = False) -> bytes:
    return (f"(protocol-descriptor (id bench-compat/v1) (version {version}) "
            f"(intents REQUEST INFORM) (grammar {quote(grammar(rules, new))}) "
            f"{schema(rules, new, narrow_last)})").encode()


OLD = descriptor(RULES, 1, False)
NEW = descriptor(RULES, 2, True)
NARROWED = descriptor(RULES, 2, False, narrow_last=True)


def test_diff_64_rules_compatible(benchmark: BenchmarkFixture) -> None:
    report: CompatReport = benchmark(diff_descriptors, OLD, NEW)
    assert report.verdict == "compatible"


def test_diff_64_rules_breaking(benchmark: BenchmarkFixture) -> None:
    report: CompatReport = benchmark(diff_descriptors, OLD, NARROWED)
    assert report.verdict == "breaking"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rules", type=int, default=RULES)
    args = parser.parse_args()
    installed.check()  # the installed cbcl, with its C extension
    old = descriptor(args.rules, 1, False)
    for name, new in (("compatible", descriptor(args.rules, 2, True)),
                      ("breaking", descriptor(args.rules, 2, False, narrow_last=True))):
        started = time.perf_counter()
        report = diff_descriptors(old, new)
        elapsed = time.perf_counter() - started
        print(f"{name}: {report.verdict} in {elapsed * 1000:.0f} ms "
              f"({report.explored[0]} product states, {report.explored[1]} signatures)")
        if report.witnesses:
            print(f"  witness: {report.witnesses[0].text[:160]}")


if __name__ == "__main__":
    main()
