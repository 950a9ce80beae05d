"""One-shot binary decode whatever the number of loaded protocols (issue 19).

``cbcl.decode(frame, registry=R)`` uses a default decoder owned by ``R`` (its symbol
tables and memos), so a call costs what a reused :class:`cbcl.Decoder` costs, with 3
protocols loaded or with 50. Frames: 1,000 different messages per size class (~370 B and
~4 KB, see ``benchmarks/cliffs.py``) of three shipped protocols; the 50-protocol registry
holds the same three and 47 renamed copies of request/v1 (47 more digests and tables).
Timed in interleaved rounds, best round kept. Targets: one-shot with 50 loaded ≤ 1.2× with
3, and one-shot ≤ 1.2× a reused decoder.

    .venv/bin/python benchmarks/oneshot.py [--rounds N] [--check]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

import installed

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cliffs
from cbcl_bench import find_descriptors, generated

import cbcl

TARGET = 1.2
BASE = ("request-v1", "contract-net-v1", "canon-a-v1")


def registry(count: int) -> cbcl.Registry:
    """The three base protocols and ``count - 3`` renamed copies of request/v1."""
    directory = find_descriptors()
    out = cbcl.Registry(disk_cache=False, isolate=False)
    for name in BASE:
        out.load((directory / f"{name}.cbcl").read_bytes(), allow_unsigned=True)
    source = (directory / "request-v1.cbcl").read_bytes()
    for i in range(count - len(BASE)):
        out.load(source.replace(b"(id request/v1)", f"(id request-{i}/v1)".encode()),
                 allow_unsigned=True)
    assert len(out.protocols()) == count
    return out


def frames(size: str, encoder: cbcl.Encoder, messages: int) -> list[bytes]:
    rng = random.Random(19)
    if size == "small":
        return [encoder.encode(cliffs.small_message(rng, i)) for i in range(messages)]
    return [encoder.encode(generated(BASE[i % 3], 21, seed=i)) for i in range(messages)]


def decoders(three: cbcl.Registry, fifty: cbcl.Registry,
             ) -> dict[str, Callable[[bytes], object]]:
    """The one-shot decode and a reused decoder, with each registry."""
    reused3, reused50 = cbcl.Decoder(three), cbcl.Decoder(fifty)
    return {
        "one-shot, 3 loaded": lambda f: cbcl.decode(f, registry=three),
        "one-shot, 50 loaded": lambda f: cbcl.decode(f, registry=fifty),
        # (each called through a lambda, as the one-shot calls are: the same glue)
        "reused, 3 loaded": lambda f: reused3.decode(f),
        "reused, 50 loaded": lambda f: reused50.decode(f),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    installed.check()  # the installed cbcl, with its C extension
    three, fifty = registry(3), registry(50)
    worst = 0.0
    for size in ("small", "medium"):
        data = frames(size, cbcl.Encoder(three, validate=False), args.messages)
        functions = decoders(three, fifty)
        for function in functions.values():
            for frame in data:
                function(frame)
        best = dict.fromkeys(functions, float("inf"))
        for _ in range(args.rounds):
            for name, function in functions.items():
                start = time.perf_counter()
                for frame in data:
                    function(frame)
                best[name] = min(best[name], (time.perf_counter() - start) / len(data) * 1e6)
        mean = sum(map(len, data)) / len(data)
        print(f"\n{size}: {len(data)} different frames, {mean:.0f} B on average")
        for name, us in best.items():
            print(f"  {name:22} {us:7.2f} µs")
        by_count = best["one-shot, 50 loaded"] / best["one-shot, 3 loaded"]
        by_reuse = best["one-shot, 50 loaded"] / best["reused, 50 loaded"]
        print(f"  one-shot 50 / 3 loaded: {by_count:.3f}×; one-shot / reused (50): "
              f"{by_reuse:.3f}× (target ≤ {TARGET}×)")
        worst = max(worst, by_count, by_reuse)
    return 1 if args.check and worst > TARGET else 0


if __name__ == "__main__":
    sys.exit(main())
