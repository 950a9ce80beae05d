"""No size class where CBCL's cost per byte exceeds 1.5× its ~4 KB figure (issue 33).

Mixed content (``cbcl bench``'s table/v1 rows: strings, integers, decimals, symbols,
keywords, URIs, nested lists, open records) at every size from the smallest message of
the kind (no rows, ~300 B) to ~1 MB: per size class a set of different messages holding
about the same bytes in all (so every set meets about as many names), their names from an
agents' vocabulary (80% never seen before, as ``cbcl bench``'s mixed sets) or, with
``--recurring``, from a few hundred recurring ones. Text parse (``cbcl.parse``, both passes)
and binary decode (a reused ``cbcl.Decoder``) are timed over each set, CPU time of this
thread, the best of interleaved rounds; the figure is µs per byte of the operation's own
input (the text, the frame), and its ratio to the ~4 KB class's. The ~1 MB class needs
limits above the defaults (65,536 nodes), so its calls pass ``limits=`` (the same C tiers,
one Python call around them); every other class is read at the default limits.

    .venv/bin/python benchmarks/size_classes.py [--rounds N] [--recurring] [--check]

``--check`` exits 1 when a class of an operation is over TARGET × its ~4 KB figure.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import installed
from cbcl_bench import find_descriptors, load_registry, mixed_messages_of

import cbcl

TARGET = 1.5
REFERENCE = "~4 KB"
#: Size class -> rows per message (a row is ~310 B of canonical text).
CLASSES = {"~300 B": 0, "~1 KB": 2, REFERENCE: 13, "~16 KB": 50, "~64 KB": 210,
           "~256 KB": 840, "~1 MB": 3000}
#: Bytes of text per set (so that every set holds about as many names).
SET_BYTES = 2_000_000
#: The ~1 MB class's limits: its ~100,000 nodes are over the default 65,536.
BIG_LIMITS = cbcl.Limits(max_nodes=1 << 18)


@dataclass
class SizeSet:
    """One size class's messages, as texts and frames, and the calls that read them."""

    name: str
    texts: list[bytes]
    frames: list[bytes]
    parse: Callable[[bytes], object]
    decode: Callable[[bytes], object]

    def mean_bytes(self, operation: str) -> float:
        inputs = self.texts if operation == "text parse" else self.frames
        return sum(map(len, inputs)) / len(inputs)


def build(registry: cbcl.Registry, *, fresh: float) -> list[SizeSet]:
    """The size classes' sets (:data:`CLASSES`), each of about :data:`SET_BYTES`."""
    encoder = cbcl.Encoder(registry, validate=False)
    sets = []
    for name, rows in CLASSES.items():
        count = max(2, SET_BYTES // (310 * rows + 300))
        messages = mixed_messages_of(rows, count, f"sizes/{name}", fresh=fresh)
        big = rows >= 1000
        limits = BIG_LIMITS if big else None
        decoder = cbcl.Decoder(registry, limits=limits)

        def parse(text: bytes, limits: cbcl.Limits | None = limits) -> object:
            if limits is None:
                return cbcl.parse(text, registry=registry)
            return cbcl.parse(text, registry=registry, limits=limits)

        sets.append(SizeSet(name, [cbcl.canonical(m).encode() for m in messages],
                            [encoder.encode(m) for m in messages], parse, decoder.decode))
    return sets


def measure(sets: list[SizeSet], rounds: int) -> dict[tuple[str, str], float]:
    """µs of CPU time per byte of each operation over each set: the best of ``rounds``
    interleaved rounds (each passes once over every set with every operation)."""
    jobs = [(s.name, op, s.texts if op == "text parse" else s.frames,
             s.parse if op == "text parse" else s.decode, s.mean_bytes(op))
            for op in ("text parse", "binary decode") for s in sets]
    for _, _, inputs, function, _ in jobs:  # every input reads (or raises), warm
        for data in inputs:
            function(data)
    best: dict[tuple[str, str], float] = {}
    for _ in range(rounds):
        for name, op, inputs, function, size in jobs:
            start = time.thread_time()
            for data in inputs:
                function(data)
            per_byte = (time.thread_time() - start) / len(inputs) / size * 1e6
            best[name, op] = min(best.get((name, op), per_byte), per_byte)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--recurring", action="store_true",
                        help="names from a few hundred recurring ones, not mostly new")
    parser.add_argument("--check", action="store_true",
                        help=f"exit 1 if a class is over {TARGET}x the {REFERENCE} figure")
    args = parser.parse_args(argv)
    installed.check()  # the installed cbcl, with its C extension
    registry = load_registry(find_descriptors())
    sets = build(registry, fresh=0.0 if args.recurring else 0.8)
    best = measure(sets, args.rounds)
    names = "recurring" if args.recurring else "80% never seen"
    print(f"mixed content, names {names}; µs of CPU time per byte (best of {args.rounds} "
          f"interleaved rounds), and the ratio to the {REFERENCE} class")
    print("| class | messages | text bytes | text parse µs/B | ×4 KB | frame bytes | "
          "binary decode µs/B | ×4 KB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    worst = 0.0
    for s in sets:
        cells = []
        for op in ("text parse", "binary decode"):
            ratio = best[s.name, op] / best[REFERENCE, op]
            worst = max(worst, ratio)
            cells.append(f"{s.mean_bytes(op):,.0f} | {best[s.name, op]:.5f} | {ratio:.2f}")
        print(f"| {s.name} | {len(s.texts)} | " + " | ".join(cells) + " |")
    print(f"\nworst class: {worst:.2f}× its {REFERENCE} figure (target ≤ {TARGET}×)")
    return 1 if args.check and worst > TARGET else 0


if __name__ == "__main__":
    sys.exit(main())
