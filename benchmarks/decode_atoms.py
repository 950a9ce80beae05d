"""Binary decode (a reused ``Decoder``) with the C twins of ``cbcl._native``, with an
older build of them (``--baseline``, to measure a change in the same run), with the Python
twins, and msgspec's typed msgpack decode of the same content (issue 19).

    python benchmarks/decode_atoms.py [--messages N] [--rounds R] [--baseline SO] [--json FILE]

Sets of ``N`` different messages (1,000 by default) of request/v1 and contract-net/v1 as
``cbcl bench`` builds them (:func:`cbcl_bench.varied`: ~370 B and ~4 KB of canonical
text), plus ``N`` messages of :func:`cbcl.llm.generate_messages` (grammar-generated
bodies, many atoms seen once). msgspec decodes each set's natural JSON packed as msgpack
into the tagged ``Struct`` union ``cbcl bench`` models it with
(:func:`cbcl_bench.typed_peers`), then runs its extra check, as ``cbcl bench`` times it;
it is left out for the generated set, whose bodies its model does not cover. Rounds are
interleaved and the best is kept (µs per message); ratios are from the same run.

``--baseline SO``: a ``_native`` shared object with the same ``frame_envelope`` and
``build_body`` signatures (for instance a copy of ``cbcl/_native*.so`` taken before a
change), loaded beside the current one and timed as ``C (baseline)``.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import installed
from cbcl_bench import find_descriptors, load_registry, natural_json, typed_peers, varied

from cbcl import Decoder, Encoder, Message, Registry
from cbcl.llm import generate_messages

PROTOCOLS = ("request-v1", "contract-net-v1")


def load_baseline(path: str) -> Any:
    """The extension at ``path``, loaded as ``cbcl._native`` but not registered."""
    loader = importlib.machinery.ExtensionFileLoader("cbcl._native", path)
    spec = importlib.util.spec_from_file_location("cbcl._native", path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def sets(registry: Registry, descriptors: Path, count: int) -> dict[str, list[Message]]:
    out: dict[str, list[Message]] = {}
    for size in ("small", "medium"):
        for protocol in PROTOCOLS:
            out[f"{protocol}/{size}"] = varied(protocol, size, count)
    generated: list[Message] = []
    for index, protocol in enumerate(PROTOCOLS):
        generated += generate_messages((descriptors / f"{protocol}.cbcl").read_bytes(),
                                       count // len(PROTOCOLS), seed=19 + index)
    out["generated"] = generated
    return out


T = TypeVar("T")
R = TypeVar("R")


def apply_all(function: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``function`` of each item: a contender's pass (bound by ``functools.partial``)."""
    return [function(item) for item in items]


def measure(contenders: dict[str, Callable[[], object]], rounds: int,
            count: int) -> dict[str, float]:
    best = dict.fromkeys(contenders, float("inf"))
    for _ in range(rounds):
        for name, run in contenders.items():
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
    return {name: seconds / count * 1e6 for name, seconds in best.items()}


def run(count: int, rounds: int, baseline: str | None) -> dict[str, Any]:
    try:
        import msgspec
    except ImportError:  # pragma: no cover
        have_msgspec = False
    else:
        have_msgspec = True
    descriptors = find_descriptors()
    registry = load_registry(descriptors)
    encoder = Encoder(registry)
    old = load_baseline(baseline) if baseline else None
    results: dict[str, Any] = {}
    for name, messages in sets(registry, descriptors, count).items():
        frames = [encoder.encode(message) for message in messages]
        decoders: dict[str, Decoder] = {"C": Decoder(registry)}
        if old is not None:
            before = decoders["C (baseline)"] = Decoder(registry)
            before._fast_c = (old.frame_envelope, old.build_body)
            before._frame_state = None  # (the baseline's tiers, not today's whole-frame call)
        python = decoders["Python twins"] = Decoder(registry)  # msgpack's C unpacker
        python._fast_c = None
        python._frame_state = None
        for decoder in decoders.values():
            assert [decoder.decode(frame) for frame in frames] == messages
        contenders: dict[str, Callable[[], object]] = {
            label: partial(apply_all, decoder.decode, frames)
            for label, decoder in decoders.items()}
        protocol = name.split("/")[0]
        if have_msgspec and name != "generated":
            peers = typed_peers(protocol)
            typed = msgspec.msgpack.Decoder(peers.msgspec_type)
            check = peers.msgspec_check
            assert check is not None
            packed = [msgspec.msgpack.encode(msgspec.json.decode(natural_json(m)))
                      for m in messages]

            def msgspec_decode(ps: list[bytes] = packed,
                               d: Callable[[bytes], object] = typed.decode,
                               c: Callable[[Any], None] = check) -> None:
                for p in ps:
                    c(d(p))

            contenders["msgspec msgpack"] = msgspec_decode
        times = measure(contenders, rounds, len(frames))
        row: dict[str, Any] = {
            "messages": len(frames),
            "frame_bytes_mean": round(sum(map(len, frames)) / len(frames)),
            "canonical_bytes_mean": round(sum(len(m.canonical()) for m in messages)
                                          / len(messages)),
            "us_per_message": {label: round(t, 3) for label, t in times.items()},
            "ratios": {}}
        ratios = row["ratios"]
        ratios["C vs Python twins"] = times["Python twins"] / times["C"]
        if "C (baseline)" in times:
            ratios["C vs C (baseline)"] = times["C (baseline)"] / times["C"]
        if "msgspec msgpack" in times:
            ratios["C vs msgspec msgpack"] = times["msgspec msgpack"] / times["C"]
            if "C (baseline)" in times:
                ratios["C (baseline) vs msgspec msgpack"] = \
                    times["msgspec msgpack"] / times["C (baseline)"]
        row["ratios"] = {label: round(r, 2) for label, r in ratios.items()}
        results[name] = row
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--baseline", metavar="SO")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    installed.check()  # the installed cbcl, with its C extension
    results = run(args.messages, args.rounds, args.baseline)
    for name, row in results.items():
        print(f"{name}: {row['messages']} messages, frame {row['frame_bytes_mean']} B, "
              f"canonical {row['canonical_bytes_mean']} B (means)")
        for label, t in row["us_per_message"].items():
            print(f"  {label:18s} {t:9.3f} µs")
        for label, ratio in row["ratios"].items():
            print(f"  {label:34s} {ratio:6.2f}×")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
