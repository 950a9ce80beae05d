"""Never-seen names against recurring ones (issue 35): the same messages, once with names
no cache holds and once with names read before, text and binary, ~4 KB and ~64 KB; and the
worst case, one message of 60,000 new symbols, against msgspec reading the same content.

    python benchmarks/new_names.py [--rounds 5] [--json FILE]

Each message is a table/v1 message of ``cbcl bench``'s mixed sets (rows of strings,
integers, decimals, symbols, keyword members, URIs). A *fresh* set is drawn with names no
earlier set had; the *recurring* figure reads one set again after a first read, so its names
are interned and memoised. Both are timed per pass over a set, best of ``--rounds`` (a
fresh set per round), and reported per byte. Targets (issue 35): fresh ≤ 1.5× recurring per
byte, text and binary, at both sizes; the 60,000-symbol message within 2× msgspec's time
for the same content (a JSON array of strings, typed ``list[str]``).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import installed
from cbcl_bench import (
    MIXED_PROTOCOL,
    Vocabulary,
    _first_pass,
    find_descriptors,
    load_registry,
    mixed_messages,
)

from cbcl import Decoder, Encoder, Registry, canonical, parse

TARGET_FRESH_VS_RECURRING = 1.5
TARGET_WORST_VS_MSGSPEC = 2.0
SIZES = {"mixed-4k": 200, "mixed-64k": 12}  # messages per set


def _pass(function: Callable[[bytes], object], items: list[bytes]) -> float:
    """Seconds of one pass of ``function`` over ``items`` (cbcl bench's first pass)."""
    return _first_pass(function, items) * len(items)


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
    best_cbcl = best_msgspec = float("inf")
    size = 0
    for r in range(rounds):
        vocabulary = Vocabulary(random.Random(f"worst/{r}"), recurring=1, fresh=1.0)
        names = [vocabulary.new().replace("-", "x") for _ in range(60_000)]
        text = ("(" + " ".join(names) + ")").encode()
        document = json.dumps(names).encode()
        decode = msgspec.json.Decoder(list[str]).decode
        size = len(text)
        import cbcl

        best_cbcl = min(best_cbcl, _pass(lambda t: cbcl.read(t, limits=limits), [text]))
        best_msgspec = min(best_msgspec, _pass(decode, [document]))
    return {"bytes": size, "cbcl_read_ms": best_cbcl * 1e3, "msgspec_ms": best_msgspec * 1e3,
            "cbcl_vs_msgspec_time": best_cbcl / best_msgspec}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    installed.check()  # the installed cbcl, with its C extension
    registry = load_registry(find_descriptors())
    assert registry.get(MIXED_PROTOCOL[:-3] + "/v1") is not None
    results: dict[str, Any] = {"fresh_vs_recurring": fresh_vs_recurring(registry, args.rounds),
                               "worst_case": worst_case(max(1, args.rounds // 2))}
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
          f"{worst['cbcl_vs_msgspec_time']:.2f}× msgspec's time "
          f"(target ≤ {TARGET_WORST_VS_MSGSPEC}×)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
