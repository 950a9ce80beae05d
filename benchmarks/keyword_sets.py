"""What a keyword set costs: parsing bodies whose keyword arguments come in any order
against the same bodies under a grammar that fixes their order.

    python benchmarks/keyword_sets.py [--messages N] [--rounds R]

Two protocols with the same records: ``fixed/v1`` lists each record's keywords in one
order (``":id" STRING ":price" NUMBER [":note" STRING] …``), ``sets/v1`` joins them with
``&``. Both parse N different messages (different values, a nested record, optional
members present or not); the fixed protocol reads them in its order, the set protocol
reads the same members shuffled. Text (``cbcl.parse``) and binary (``Decoder.decode``)
are timed, best of R rounds, and reported as the ratio set / fixed (the target of
issue 15 is at most 1.1).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

import installed

import cbcl

RECORDS = {
    "order": [(":id", "STRING", False), (":item", "STRING", False),
              (":price", "NUMBER", False), (":qty", "INTEGER", False),
              (":buyer", "URI", False), (":note", "STRING", True),
              (":ship", "ship", True)],
    "ship": [(":street", "STRING", False), (":city", "SYMBOL", False),
             (":zip", "STRING", True)],
}


def grammar(sets: bool) -> str:
    lines = ["body: order"]
    for name, members in RECORDS.items():
        parts = []
        for keyword, item, optional in members:
            part = f'"{keyword}" {item}'
            parts.append(f"[{part}]" if optional else part)
        inner = " & ".join(parts) if sets else " ".join(parts)
        lines.append(f'{name}: "(" "{name}" ({inner}) ")"')
    return "\n".join(lines) + "\n"


def descriptor(ident: str, sets: bool) -> bytes:
    return (f"(protocol-descriptor (id {ident}) (version 1) (intents PROPOSE) "
            f"(grammar {cbcl.canonical(grammar(sets))}))").encode()


def _value(item: str, rng: random.Random) -> str:
    if item == "STRING":
        size = rng.randint(1, 24)
        return cbcl.canonical("".join(rng.choice("abcdefgh xyz") for _ in range(size)))
    if item == "NUMBER":
        if rng.random() < 0.5:
            return str(rng.randint(0, 10**6))
        return f"{rng.randint(0, 9999)}.{rng.randint(0, 99):02d}"
    if item == "INTEGER":
        return str(rng.randint(1, 500))
    if item == "URI":
        return f"agent://buyer-{rng.randint(0, 999)}"
    if item == "SYMBOL":
        return rng.choice(["paris", "lyon", "oslo", "rome"])
    return _record(item, rng, shuffle=False)[0]


def _record(name: str, rng: random.Random, shuffle: bool) -> tuple[str, str]:
    """One record's text in the fixed order and, if ``shuffle``, in a shuffled order."""
    members = [(k, _value(i, rng)) for k, i, optional in RECORDS[name]
               if not optional or rng.random() < 0.5]
    fixed = f"({name} " + " ".join(f"{k} {v}" for k, v in members) + ")"
    rng.shuffle(members)
    shuffled = f"({name} " + " ".join(f"{k} {v}" for k, v in members) + ")"
    return fixed, shuffled


def messages(count: int, seed: int = 7) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    out = []
    for n in range(count):
        fixed, shuffled = _record("order", rng, shuffle=True)
        head = (f'(CBCL/1.0 (message-id "m-{n}") (sender agent://a) (receiver agent://b) '
                f"(intent PROPOSE) (protocol ")
        out.append((head + f"fixed/v1) (body {fixed}))", head + f"sets/v1) (body {shuffled}))"))
    return out


def _best(fn: Any, items: list[Any], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for item in items:
            fn(item)
        best = min(best, time.perf_counter() - start)
    return best / len(items)


def run(count: int, rounds: int) -> dict[str, float]:
    registry = cbcl.Registry(disk_cache=False, isolate=False)
    registry.load(descriptor("fixed/v1", sets=False), allow_unsigned=True)
    registry.load(descriptor("sets/v1", sets=True), allow_unsigned=True)
    pairs = messages(count)
    fixed_text = [f for f, _ in pairs]
    set_text = [s for _, s in pairs]
    for text in fixed_text + set_text:  # every message is accepted
        cbcl.parse(text, registry=registry)
    encoder, decoder = cbcl.Encoder(registry=registry), cbcl.Decoder(registry=registry)
    fixed_frames = [encoder.encode(cbcl.parse(t, registry=registry)) for t in fixed_text]
    set_frames = [encoder.encode(cbcl.parse(t, registry=registry)) for t in set_text]

    def parse(text: str) -> object:
        return cbcl.parse(text, registry=registry)

    result = {
        "text_fixed_us": _best(parse, fixed_text, rounds) * 1e6,
        "text_sets_us": _best(parse, set_text, rounds) * 1e6,
        "binary_fixed_us": _best(decoder.decode, fixed_frames, rounds) * 1e6,
        "binary_sets_us": _best(decoder.decode, set_frames, rounds) * 1e6,
    }
    result["text_ratio"] = result["text_sets_us"] / result["text_fixed_us"]
    result["binary_ratio"] = result["binary_sets_us"] / result["binary_fixed_us"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    installed.check()  # the installed cbcl, with its C extension
    print(json.dumps({k: round(v, 3) for k, v in run(args.messages, args.rounds).items()},
                     indent=2))


if __name__ == "__main__":
    main()
