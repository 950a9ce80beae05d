"""No cliff with the number of distinct messages (issue 33/35): ``cbcl.parse`` of text (no
``type=``) costs the same per message whether a program cycles through 250 different
messages or 4,000, though every memo in front of the reader (the token cache
``cbcl.core._reader._CACHE``, the intern tables, the C scanner's token memo) is bounded.

    python benchmarks/distinct_messages.py [--sizes 250,500,1000,2000,4000] [--rounds 5]
    python benchmarks/distinct_messages.py --instructions [--check]

Two request-style sets: ``lab`` (the lab-sample requests of ``benchmarks/records.py``,
~290 B) and ``result`` (``benchmarks/cliffs.py``'s ~370 B request/v1 results, a new URI and
several new strings in each). Timed: CPU time per parse, each set cycled (every message
read once before), best of ``--rounds``, sizes interleaved; noisy where others load the
machine. ``--instructions``: callgrind counts of one pass over each set after a first
(uncounted) pass, per parse; ``--check`` exits 1 when a size costs more than
:data:`TARGET` times the smallest size's count (the regression check: deterministic, so a
loaded machine cannot make it fail or pass).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import reduce
from pathlib import Path

import installed
from cbcl_bench import find_descriptors, load_registry

import cbcl

TARGET = 1.15  # the largest size's instructions per parse over the smallest size's
SIZES = (250, 500, 1000, 2000, 4000)


def lab_texts(count: int) -> tuple[cbcl.Registry, list[bytes]]:
    """``count`` different lab-sample requests (records.py's) and a registry for them."""
    import records

    registry = cbcl.Registry(disk_cache=False)
    registry.load(cbcl.descriptor_from(records.SampleRequest, id="lab/v1", version=1),
                  allow_unsigned=True)
    messages = [cbcl.Message(message_id=f"m{i}", sender="agent://lims",
                             receiver="agent://lab", intent="REQUEST", protocol="lab/v1",
                             body=r) for i, r in enumerate(records.samples(count))]
    return registry, [m.canonical().encode() for m in messages]


def result_texts(count: int) -> tuple[cbcl.Registry, list[bytes]]:
    """``count`` different request/v1 results (cliffs.py's) and the shipped registry."""
    import cliffs

    rng = random.Random("distinct-messages")
    return load_registry(find_descriptors()), [
        cbcl.canonical(cliffs.small_message(rng, i)).encode() for i in range(count)]


SETS: dict[str, Callable[[int], tuple[cbcl.Registry, list[bytes]]]] = {
    "lab": lab_texts, "result": result_texts}


def timed(sizes: tuple[int, ...], rounds: int) -> dict[str, dict[int, float]]:
    """µs of CPU time per parse, per set and size (best of ``rounds``)."""
    out: dict[str, dict[int, float]] = {}
    for name, make in SETS.items():
        registry, texts = make(max(sizes))
        best = {size: float("inf") for size in sizes}
        for _ in range(rounds):
            for size in sizes:
                items = texts[:size]
                for text in items:  # (read once before: the set is cycled)
                    cbcl.parse(text, registry=registry)
                passes = max(1, 8000 // size)
                start = time.process_time()
                for _ in range(passes):
                    for text in items:
                        cbcl.parse(text, registry=registry)
                spent = (time.process_time() - start) / (passes * size) * 1e6
                best[size] = min(best[size], spent)
        out[name] = best
    return out


def counted_passes(sizes: tuple[int, ...], log: Path) -> None:
    """What :func:`instructions` counts (run under callgrind): per set and size, a first
    pass (not counted) and a second through ``functools.reduce`` (counted)."""
    entries = []
    for name, make in SETS.items():
        registry, texts = make(max(sizes))
        for size in sizes:
            items = texts[:size]
            for text in items:
                cbcl.parse(text, registry=registry)
            entries.append({"set": name, "size": size})
            reduce(lambda _, text: cbcl.parse(text, registry=registry), items, None)
    log.write_text("".join(json.dumps(entry) + "\n" for entry in entries))


def instructions(sizes: tuple[int, ...]) -> dict[str, dict[int, float]]:
    """Instructions per parse of a cycled set, per set and size (callgrind)."""
    from atom_instructions import COUNTED, _dump_counts

    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "passes.jsonl"
        command = ["valgrind", "--tool=callgrind", "--collect-atstart=no",
                   f"--toggle-collect={COUNTED}", f"--dump-after={COUNTED}",
                   f"--callgrind-out-file={folder}/cg.out", sys.executable, __file__,
                   "--counted-passes", ",".join(map(str, sizes)), str(log)]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        passes = [json.loads(line) for line in log.read_text().splitlines()]
        counts = _dump_counts(Path(folder))
    if len(counts) != len(passes):
        raise SystemExit(f"{len(counts)} callgrind dumps for {len(passes)} passes")
    out: dict[str, dict[int, float]] = {}
    for entry, count in zip(passes, counts, strict=True):
        out.setdefault(entry["set"], {})[entry["size"]] = count / entry["size"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--instructions", action="store_true")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--counted-passes", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.counted_passes:
        counted_passes(tuple(int(s) for s in args.counted_passes[0].split(",")),
                       Path(args.counted_passes[1]))
        return 0
    installed.check()
    sizes = tuple(int(s) for s in args.sizes.split(","))
    figures = instructions(sizes) if args.instructions else timed(sizes, args.rounds)
    unit = "instructions per parse" if args.instructions else "µs CPU per parse"
    print(f"| set | {' | '.join(map(str, sizes))} | worst / smallest |")
    print(f"|---|{'---:|' * len(sizes)}---:|")
    worst = 0.0
    for name, row in figures.items():
        ratio = max(row.values()) / row[sizes[0]]
        worst = max(worst, ratio)
        cells = " | ".join(f"{row[s]:,.0f}" if args.instructions else f"{row[s]:.2f}"
                           for s in sizes)
        print(f"| {name} | {cells} | {ratio:.2f} |")
    print(f"({unit}; distinct messages cycled; target: worst / smallest ≤ {TARGET})")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 1 if args.check and args.instructions and worst > TARGET else 0


if __name__ == "__main__":
    sys.exit(main())
