"""What a descriptor's stateless constraints cost per message (issue 34's leftover).

``python benchmarks/rule_cost.py`` times, in interleaved rounds in one process, ``cbcl.parse``
of a canon-a/v1 QUERY that its rules accept, one a rule refuses (no ``:city``), a
contract-net CFP (no rules), and ``Constraints.check`` alone on the accepted and refused
QUERY, the fast path against the same rules run by the evaluator (``--reference``'s
figures: the rules without their compiled closures). It reports CPU µs per call (best
round) and the ratios measured in the same run.

``python benchmarks/rule_cost.py --once CASE N`` runs one case N times and exits: the
driver for instruction counts, e.g. ::

    valgrind --tool=callgrind python benchmarks/rule_cost.py --once parse-ok 1100
    valgrind --tool=callgrind python benchmarks/rule_cost.py --once parse-ok 100

whose difference / 1000 is the instructions per call (docs/performance.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import installed

ROOT = Path(__file__).resolve().parent.parent


def cases() -> dict[str, Callable[[], object]]:
    import cbcl
    from cbcl.protocol._constraints import Constraints

    registry = cbcl.Registry(disk_cache=False, isolate=False)
    for name in ("canon-a-v1", "contract-net-v1"):
        registry.load((ROOT / "descriptors" / f"{name}.cbcl").read_bytes(),
                      allow_unsigned=True)
    accepted = (ROOT / "descriptors" / "examples" / "canon-a-v1.cbcl").read_bytes()
    refused = accepted.replace(b':city "Paris" ', b"")
    cfp = (ROOT / "descriptors" / "examples" / "contract-net-v1.cbcl").read_bytes()
    protocol = registry.get("canon-a/v1")
    assert protocol is not None and protocol.constraints is not None
    constraints = protocol.constraints
    reference = Constraints(tuple(dataclasses.replace(rule, compiled=None)
                                  for rule in constraints.rules), constraints.functions)
    ok = cbcl.parse(accepted, registry=registry)
    bad = cbcl.parse(refused, registry=registry, envelope_only=True)

    def refusing(call: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            try:
                return call()
            except cbcl.ConstraintError as exc:
                return exc
        return run

    return {
        "parse-ok": lambda: cbcl.parse(accepted, registry=registry),
        "parse-refused": refusing(lambda: cbcl.parse(refused, registry=registry)),
        "parse-cfp": lambda: cbcl.parse(cfp, registry=registry),
        "check-ok": lambda: constraints.check(ok),
        "check-refused": refusing(lambda: constraints.check(bad)),
        "reference-ok": lambda: reference.check(ok),
        "reference-refused": refusing(lambda: reference.check(bad)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--once", nargs=2, metavar=("CASE", "N"))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    installed.check()
    table = cases()
    if args.once:
        call, count = table[args.once[0]], int(args.once[1])
        for _ in range(50 + count):  # (50 to warm the caches)
            call()
        return
    best = dict.fromkeys(table, float("inf"))
    for _ in range(args.rounds):
        for name, call in table.items():
            start = time.process_time()
            for _ in range(args.calls):
                call()
            best[name] = min(best[name], (time.process_time() - start) / args.calls)
    for name, seconds in best.items():
        print(f"{name:18} {seconds * 1e6:8.2f} µs")
    print(f"parse-ok / parse-cfp            {best['parse-ok'] / best['parse-cfp']:.2f}")
    print(f"reference-ok / check-ok         {best['reference-ok'] / best['check-ok']:.1f}")
    print(f"reference-refused / check-refused "
          f"{best['reference-refused'] / best['check-refused']:.2f}")


if __name__ == "__main__":
    main()
