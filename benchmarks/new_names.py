"""Never-seen names against recurring ones (issue 35): the same messages, once with names
no cache holds and once with names read before, text and binary, ~4 KB and ~64 KB; and the
worst case, one message of 60,000 new symbols, against msgspec reading the same content.

    python benchmarks/new_names.py [--rounds 5] [--json FILE]
    python benchmarks/new_names.py --instructions [--json FILE]

Each message is a table/v1 message of ``cbcl bench``'s mixed sets (rows of strings,
integers, decimals, symbols, keyword members, URIs). A *fresh* set is drawn with names no
earlier set had; the *recurring* figure reads one set again after a first read, so its names
are interned and memoised. Both are timed per pass over a set, best of ``--rounds`` (a
fresh set per round), and reported per byte; times are CPU times of the process
(``time.process_time``), so that other work on the machine adds little. Targets (issue
35): fresh ≤ 1.5× recurring per byte, text and binary, at both sizes; the 60,000-symbol
message within 2× msgspec's time for the same content (a JSON array of strings, typed
``list[str]``), read alternately over 3 × ``--rounds`` rounds (best and median).

``--instructions``: the same figures as instruction counts (callgrind, one run: each pass
counted on its own, as :mod:`atom_instructions` counts), which a loaded machine does not
disturb: instructions per byte of a pass over a fresh set and of a second pass over it
(smaller sets: :data:`INSTRUCTION_SIZES`), and of the 60,000-symbol message against
msgspec.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import reduce
from pathlib import Path
from typing import Any

import installed
from cbcl_bench import (
    MIXED_PROTOCOL,
    Vocabulary,
    find_descriptors,
    load_registry,
    mixed_messages,
)

from cbcl import Decoder, Encoder, Registry, canonical, parse

TARGET_FRESH_VS_RECURRING = 1.5
TARGET_WORST_VS_MSGSPEC = 2.0
SIZES = {"mixed-4k": 200, "mixed-64k": 12}  # messages per set
INSTRUCTION_SIZES = {"mixed-4k": 40, "mixed-64k": 3}  # (under callgrind)


def _pass(function: Callable[[bytes], object], items: list[bytes]) -> float:
    """CPU seconds of one pass of ``function`` over ``items``, the collector off (as cbcl
    bench's first pass): the process's own time (``time.process_time``), which the other
    processes of a loaded machine do not add to, as they do to the wall clock's."""
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        start = time.process_time()
        for item in items:
            function(item)
        return time.process_time() - start
    finally:
        if enabled:
            gc.enable()


def fresh_vs_recurring(registry: Registry, rounds: int) -> dict[str, dict[str, float]]:
    """Per size and form: seconds per byte, fresh and recurring, and their ratio."""
    encoder, decoder = Encoder(registry, validate=False), Decoder(registry)

    def parse_text(text: bytes) -> object:
        return parse(text, registry=registry)

    out: dict[str, dict[str, float]] = {}
    for size, count in SIZES.items():
        best: dict[str, float] = {}
        sets: dict[str, tuple[list[bytes], list[bytes], int]] = {}
        for kind, share in (("fresh", 1.0), ("recurring", 0.0)):
            for r in range(rounds):
                messages = mixed_messages(size, count, f"new-names/{kind}/{r}", fresh=share)
                texts = [canonical(m).encode() for m in messages]
                sets[f"{kind}/{r}"] = (texts, [encoder.encode(m) for m in messages],
                                       sum(map(len, texts)))
        for form, function in (("text", parse_text), ("binary", decoder.decode)):
            for kind in ("fresh", "recurring"):
                for r in range(rounds):
                    texts, frames, total = sets[f"{kind}/{r}"]
                    items = texts if form == "text" else frames
                    if kind == "recurring":
                        _pass(function, items)  # (its few hundred names: read before)
                    # (binary per byte of the same messages' text, so the forms compare)
                    per_byte = _pass(function, items) / total
                    key = f"{form}_{kind}"
                    best[key] = min(best.get(key, per_byte), per_byte)
        row: dict[str, float] = {}
        for form in ("text", "binary"):
            row[f"{form}_fresh_ns_per_byte"] = best[f"{form}_fresh"] * 1e9
            row[f"{form}_recurring_ns_per_byte"] = best[f"{form}_recurring"] * 1e9
            row[f"{form}_fresh_vs_recurring"] = best[f"{form}_fresh"] / best[f"{form}_recurring"]
        out[size] = row
    return out


def worst_case(rounds: int) -> dict[str, float]:
    """One message of 60,000 new symbols (a list of them, read as a value), against
    msgspec decoding the same names as a typed JSON array of strings."""
    import msgspec

    from cbcl.core._limits import Limits

    limits = Limits(max_message_bytes=4 << 20, max_list_items=1 << 17, max_nodes=1 << 18)
    cbcl_times: list[float] = []
    msgspec_times: list[float] = []
    size = 0
    for r in range(rounds):
        vocabulary = Vocabulary(random.Random(f"worst/{r}"), recurring=1, fresh=1.0)
        names = [vocabulary.new().replace("-", "x") for _ in range(60_000)]
        text = ("(" + " ".join(names) + ")").encode()
        document = json.dumps(names).encode()
        decode = msgspec.json.Decoder(list[str]).decode
        size = len(text)
        import cbcl

        cbcl_times.append(_pass(lambda t: cbcl.read(t, limits=limits), [text]))
        msgspec_times.append(_pass(decode, [document]))  # (alternating: the same load)
    best_cbcl, best_msgspec = min(cbcl_times), min(msgspec_times)
    median_cbcl, median_msgspec = statistics.median(cbcl_times), statistics.median(msgspec_times)
    return {"bytes": size, "cbcl_read_ms": best_cbcl * 1e3, "msgspec_ms": best_msgspec * 1e3,
            "cbcl_vs_msgspec_time": best_cbcl / best_msgspec,
            "cbcl_vs_msgspec_median": median_cbcl / median_msgspec}


def _worst_inputs(seed: str) -> tuple[bytes, bytes]:
    """The 60,000-symbol message as CBCL text and as a JSON array of strings."""
    vocabulary = Vocabulary(random.Random(seed), recurring=1, fresh=1.0)
    names = [vocabulary.new().replace("-", "x") for _ in range(60_000)]
    return ("(" + " ".join(names) + ")").encode(), json.dumps(names).encode()


def counted_passes(log: Path) -> None:
    """The passes :func:`instructions` counts (run under callgrind): each made through
    ``functools.reduce``, in the order written to ``log`` (one JSON line per pass)."""
    import msgspec

    import cbcl
    from cbcl.core._limits import Limits

    registry = load_registry(find_descriptors())
    encoder, decoder = Encoder(registry, validate=False), Decoder(registry)
    entries: list[dict[str, Any]] = []

    def counted(name: str, function: Callable[[bytes], object], items: list[bytes],
                size: int) -> None:
        entries.append({"pass": name, "bytes": size})
        reduce(lambda _, item: function(item), items, None)

    def parse_text(text: bytes) -> object:
        return parse(text, registry=registry)

    for size, count in INSTRUCTION_SIZES.items():
        warm = mixed_messages(size, 1, f"new-names/instructions/{size}/warm", fresh=0.0)
        parse_text(canonical(warm[0]).encode())  # (what a first call builds once)
        decoder.decode(encoder.encode(warm[0]))
        for form, function in (("text", parse_text), ("binary", decoder.decode)):
            # (a set per form: the names of each are new to it)
            messages = mixed_messages(size, count, f"new-names/instructions/{size}/{form}",
                                      fresh=1.0)
            texts = [canonical(m).encode() for m in messages]
            items = texts if form == "text" else [encoder.encode(m) for m in messages]
            total = sum(map(len, texts))  # (per byte of text, both forms)
            counted(f"{size}/{form}/fresh", function, items, total)
            counted(f"{size}/{form}/recurring", function, items, total)
    limits = Limits(max_message_bytes=4 << 20, max_list_items=1 << 17, max_nodes=1 << 18)
    text, document = _worst_inputs("worst/instructions")
    counted("worst/cbcl", lambda t: cbcl.read(t, limits=limits), [text], len(text))
    counted("worst/msgspec", msgspec.json.Decoder(list[str]).decode, [document], len(text))
    log.write_text("".join(json.dumps(entry) + "\n" for entry in entries))


def instructions() -> dict[str, Any]:
    """Run :func:`counted_passes` under callgrind: instructions per byte of each pass, and
    the ratios the targets are about."""
    from atom_instructions import COUNTED, _dump_counts

    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "passes.jsonl"
        command = ["valgrind", "--tool=callgrind", "--collect-atstart=no",
                   f"--toggle-collect={COUNTED}", f"--dump-after={COUNTED}",
                   f"--callgrind-out-file={folder}/cg.out", sys.executable, __file__,
                   "--counted-passes", str(log)]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        passes = [json.loads(line) for line in log.read_text().splitlines()]
        counts = _dump_counts(Path(folder))
    if len(counts) != len(passes):
        raise SystemExit(f"{len(counts)} callgrind dumps for {len(passes)} passes")
    per_byte = {p["pass"]: count / p["bytes"] for p, count in zip(passes, counts, strict=True)}
    out: dict[str, Any] = {"instructions_per_byte": per_byte, "fresh_vs_recurring": {}}
    for size in INSTRUCTION_SIZES:
        for form in ("text", "binary"):
            out["fresh_vs_recurring"][f"{size}/{form}"] = (
                per_byte[f"{size}/{form}/fresh"] / per_byte[f"{size}/{form}/recurring"])
    out["worst_cbcl_vs_msgspec"] = per_byte["worst/cbcl"] / per_byte["worst/msgspec"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--instructions", action="store_true",
                        help="instruction counts under callgrind instead of times")
    parser.add_argument("--counted-passes", metavar="LOG", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.counted_passes:
        counted_passes(Path(args.counted_passes))
        return 0
    installed.check()  # the installed cbcl, with its C extension
    if args.instructions:
        counts = instructions()
        print("| pass | instructions/B (fresh) | instructions/B (recurring) | fresh/recurring |")
        print("|---|---:|---:|---:|")
        for key, ratio in counts["fresh_vs_recurring"].items():
            fresh = counts["instructions_per_byte"][f"{key}/fresh"]
            again = counts["instructions_per_byte"][f"{key}/recurring"]
            print(f"| {key} | {fresh:.1f} | {again:.1f} | {ratio:.2f} |")
        worst = counts["instructions_per_byte"]
        print(f"\n60,000 new symbols: cbcl.read {worst['worst/cbcl']:.1f} instructions/B, "
              f"msgspec list[str] {worst['worst/msgspec']:.1f}: "
              f"{counts['worst_cbcl_vs_msgspec']:.2f}× (target ≤ {TARGET_WORST_VS_MSGSPEC}×)")
        if args.json:
            Path(args.json).write_text(json.dumps(counts, indent=2) + "\n")
        return 0
    registry = load_registry(find_descriptors())
    assert registry.get(MIXED_PROTOCOL[:-3] + "/v1") is not None
    results: dict[str, Any] = {"fresh_vs_recurring": fresh_vs_recurring(registry, args.rounds),
                               "worst_case": worst_case(3 * args.rounds)}
    print("| set | form | fresh ns/B | recurring ns/B | fresh/recurring | target |")
    print("|---|---|---:|---:|---:|---|")
    for size, row in results["fresh_vs_recurring"].items():
        for form in ("text", "binary"):
            ratio = row[f"{form}_fresh_vs_recurring"]
            holds = "yes" if ratio <= TARGET_FRESH_VS_RECURRING else "NO"
            print(f"| {size} | {form} | {row[f'{form}_fresh_ns_per_byte']:.1f} | "
                  f"{row[f'{form}_recurring_ns_per_byte']:.1f} | {ratio:.2f} | "
                  f"≤ {TARGET_FRESH_VS_RECURRING} {holds} |")
    worst = results["worst_case"]
    print(f"\n60,000 new symbols ({worst['bytes']} B): cbcl.read {worst['cbcl_read_ms']:.1f} ms, "
          f"msgspec list[str] {worst['msgspec_ms']:.1f} ms: "
          f"{worst['cbcl_vs_msgspec_time']:.2f}× msgspec's CPU time (medians: "
          f"{worst['cbcl_vs_msgspec_median']:.2f}×; target ≤ {TARGET_WORST_VS_MSGSPEC}×)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
