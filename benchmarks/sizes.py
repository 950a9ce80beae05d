"""Sizes and decode throughput of the binary form, against the text and JSON forms and
msgpack of the plain value tree, on the shipped examples and two generated messages
(medium ~4 KB, large ~100 KB). Throughput figures are ratios against text parsing measured
in the same run (these machines are noisy); absolute times are printed for context only.

    python benchmarks/sizes.py [--repeat N] [--json FILE]

Columns: ``text`` the message as stored (comments, indentation), ``canon`` its canonical
form, ``binary`` the frame (with the 32-byte digest), ``json`` compact JSON of the lossless
JSON mapping (``cbcl.message_to_json``, ``separators=(",", ":")``, UTF-8), ``msgpack``
``msgpack.packb`` of the message's value tree with symbols, keywords and URIs as strings
and decimals as strings. ``decode/parse`` is how many times faster a fully recognised
decode is than ``cbcl.parse(canonical text, registry=…)``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgpack

import cbcl
from cbcl._codec import Decoder, Encoder

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ["task-assignment-v1", "contract-net-v1", "request-v1", "canon-a-v1"]
S, K = cbcl.Symbol, cbcl.Keyword


def registry() -> cbcl.Registry:
    reg = cbcl.Registry(disk_cache=False, isolate=False)
    for name in SHIPPED:
        reg.load((ROOT / "descriptors" / f"{name}.cbcl").read_bytes(), allow_unsigned=True)
    return reg


def _record(rng: random.Random, i: int) -> tuple[Any, ...]:
    """One inventory record: the kind of data a result carries."""
    return (
        S("item"), K("id"), f"sku-{rng.randrange(10**6):06d}", K("name"),
        rng.choice(["bolt M6", "washer 8mm", "hinge, steel", "cable tie", "Ölfilter", "gasket"])
        + f" #{i}",
        K("qty"), rng.randrange(0, 5000), K("price"),
        Decimal(f"{rng.randrange(1, 99999) / 100:.2f}"), K("currency"),
        S(rng.choice(["EUR", "USD", "GBP"])), K("status"),
        S(rng.choice(["in-stock", "backorder", "discontinued"])),
        K("warehouse"), cbcl.URI(f"agent://depot/{rng.choice(['north', 'south', 'east'])}"),
        K("tags"), tuple(S(t) for t in rng.sample(["metal", "small", "bulk", "fragile",
                                                    "hazmat", "promo"], rng.randrange(0, 4))),
        K("updated"), 1764500000000 + rng.randrange(10**8),
    )


def generated(count: int, seed: int) -> cbcl.Message:
    """A request/v1 ``inform-result`` whose result is ``count`` records."""
    rng = random.Random(seed)
    result = (S("inventory"), K("records"), tuple(_record(rng, i) for i in range(count)))
    return cbcl.Message(
        message_id=f"rq-{seed}", sender="agent://ops/inventory", receiver="agent://ops/planner",
        intent="INFORM", protocol="request/v1", conversation_id="stock-check-2026-11-30",
        in_reply_to="rq-1", timestamp=1764502900000,
        body=(S("inform-result"), K("action-id"), "rq-1", K("result"), result))


def corpus(reg: cbcl.Registry) -> dict[str, tuple[bytes, cbcl.Message]]:
    """Name -> (the message's stored text, the message)."""
    out: dict[str, tuple[bytes, cbcl.Message]] = {}
    for path in sorted((ROOT / "descriptors" / "examples").glob("*.cbcl")):
        text = path.read_bytes()
        out[path.stem] = (text, cbcl.parse(text, registry=reg))
    for name, count in (("medium", 22), ("large", 575)):
        message = generated(count, seed=count)
        out[name] = (cbcl.canonical(message).encode(), message)
    return out


def plain(value: Any) -> Any:
    """The plain value tree: lists as lists, symbols/keywords/URIs/decimals as ``str``."""
    root: list[Any] = []
    stack = [(iter((value,)), root)]
    while stack:
        items, out = stack[-1]
        for item in items:
            if isinstance(item, tuple):
                child: list[Any] = []
                out.append(child)
                stack.append((iter(item), child))
                break
            out.append(item if type(item) is int else
                       cbcl.canonical(item) if type(item) is Decimal else str.__str__(item))
        else:
            stack.pop()
    return root[0]


def sizes(message: cbcl.Message, text: bytes, encoder: Encoder) -> dict[str, int]:
    return {
        "text": len(text),
        "canon": len(message.canonical().encode()),
        "binary": len(encoder.encode(message)),
        "json": len(json.dumps(cbcl.message_to_json(message), separators=(",", ":"),
                               ensure_ascii=False).encode()),
        "msgpack": len(msgpack.packb(plain(message.to_value()))),
    }


def best_time(fn: Callable[[], object], repeat: int) -> float:
    """Seconds per call: the best of ``repeat`` runs of a loop sized to take ~50 ms."""
    number = 1
    while True:
        start = time.perf_counter()
        for _ in range(number):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed > 0.05:
            break
        number *= 2
    best = elapsed / number
    for _ in range(repeat - 1):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - start) / number)
    return best


def measure(repeat: int = 5) -> list[dict[str, Any]]:
    reg = registry()
    encoder = Encoder(reg)
    decoders = {"c": Decoder(reg), "py": Decoder(reg, pure_python=True)}
    rows = []
    for name, (text, message) in corpus(reg).items():
        row: dict[str, Any] = {"message": name, **sizes(message, text, encoder)}
        row["binary/json"] = row["binary"] / row["json"]
        row["binary/msgpack"] = row["binary"] / row["msgpack"]
        frame = encoder.encode(message)
        canonical = message.canonical().encode()
        assert decoders["c"].decode(frame) == message == cbcl.parse(canonical, registry=reg)
        parse = best_time(lambda c=canonical: cbcl.parse(c, registry=reg), repeat)
        decode = best_time(lambda f=frame: decoders["c"].decode(f), repeat)
        decode_py = best_time(lambda f=frame: decoders["py"].decode(f), repeat)
        encode = best_time(lambda m=message: encoder.encode(m), repeat)
        row.update({"parse_us": parse * 1e6, "decode_us": decode * 1e6,
                    "encode_us": encode * 1e6, "decode/parse": parse / decode,
                    "decode_py/parse": parse / decode_py})
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    rows = measure(args.repeat)
    head = (f"{'message':34} {'text':>7} {'canon':>7} {'binary':>7} {'json':>7} {'msgpack':>7}"
            f" {'bin/json':>8} {'bin/mp':>7} {'parse µs':>9} {'decode µs':>9}"
            f" {'decode/parse':>12} {'(pure py)':>9}")
    print(head)
    for r in rows:
        print(f"{r['message']:34} {r['text']:7} {r['canon']:7} {r['binary']:7} {r['json']:7}"
              f" {r['msgpack']:7} {r['binary/json']:8.3f} {r['binary/msgpack']:7.3f}"
              f" {r['parse_us']:9.1f} {r['decode_us']:9.1f} {r['decode/parse']:11.2f}x"
              f" {r['decode_py/parse']:8.2f}x")
    worst = max(r["binary/json"] for r in rows), max(r["binary/msgpack"] for r in rows)
    slowest = min(r["decode/parse"] for r in rows)
    print(f"worst binary/json {worst[0]:.3f}, worst binary/msgpack {worst[1]:.3f}, "
          f"slowest decode/parse {slowest:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
