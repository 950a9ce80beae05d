"""The encoders with and without their C twins (``cbcl._native``), and msgspec's JSON and
msgpack encoders on the same content, over many different messages.

    python benchmarks/encoders.py [--messages N] [--rounds R] [--json FILE]

Two size classes (~370 B and ~4 KB of canonical text), ``N`` different messages each
(1,000 by default) of the four shipped protocols, built as ``cbcl bench`` builds its
generated ones (inventory records: strings, names, keywords, URIs, integers, decimals,
nested lists) with a different seed per message, and parsed from their text, so their
atoms are the reader's. Each contender encodes every message of a class once per round;
rounds are interleaved and the best is kept (µs per message). Ratios are from the same
run: the C twins against the Python ones, and against msgspec (``pip install msgspec``;
left out when it is not installed) encoding the same value tree, prepared once outside
the timing as plain lists, ``str`` atoms and ``Decimal``\\ s (msgspec writes decimals as
strings; it refuses ``str`` subclasses such as :class:`cbcl.Symbol`).

Contenders: ``text`` is ``Message.canonical()`` (C: ``cbcl._native.canonical_message``,
from the message's slots; Python: ``canonical_value_python(message.to_value())``), ``text
value`` is ``canonical_value`` of the message's value tree built beforehand (what msgspec
is given too), ``binary`` is ``Encoder(validate=False).encode`` (as ``cbcl bench`` times
it; C: one ``cbcl._native.encode_message`` call), each with the C twin and with the
Python one.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable, Sequence
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import installed
from cbcl_bench import PROTOCOLS, _record, find_descriptors, load_registry

from cbcl import URI, Message, Registry, Value, parse
from cbcl.binary._codec import Encoder
from cbcl.core._canonical import canonical_value, canonical_value_python, native
from cbcl.core._values import Keyword as K, Symbol as S

#: Records per message, by size class, for ~370 B and ~4 KB of canonical text.
SIZES = {"small": 0, "medium": 20}


def _body(protocol: str, records: tuple[Any, ...], rng: random.Random) -> tuple[str, Any]:
    result = (S("inventory"), K("records"), records) if records else \
        (S("stock"), K("sku"), f"sku-{rng.randrange(10**6):06d}", K("qty"),
         rng.randrange(5000), K("price"), Decimal(f"{rng.randrange(1, 99999) / 100:.2f}"))
    if protocol == "request-v1":
        return "INFORM", (S("inform-result"), K("action-id"), f"rq-{rng.randrange(999)}",
                          K("result"), result)
    if protocol == "contract-net-v1":
        return "INFORM", (S("inform-done"), K("task-id"), f"t-{rng.randrange(9999)}",
                          K("result"), result)
    if protocol == "canon-a-v1":
        return "INFORM", (S("inform"), S("results"), K("order_id"), f"A-{rng.randrange(9999)}",
                          K("limit"), len(records), K("value"), result)
    return "PROPOSE", (S("task"), K("id"), f"task-{rng.randrange(999)}", K("cmd"),
                       (S("compute"), K("algorithm"), S("merge"), K("inputs"), result),
                       K("resources"), (K("cpu"), rng.randrange(1, 9), K("mem"), 4096))


def corpus(registry: Registry, size: str, count: int) -> list[Message]:
    """``count`` different messages of ``size``, each parsed from its canonical text."""
    messages = []
    for index in range(count):
        rng = random.Random(f"{size}-{index}")
        protocol = PROTOCOLS[index % len(PROTOCOLS)]
        records = tuple(_record(rng, i) for i in range(SIZES[size]))
        intent, body = _body(protocol, records, rng)
        message = Message(message_id=f"m-{index}", sender=URI(f"agent://ops/a{index % 7}"),
                          receiver=URI("agent://ops/planner"), intent=intent,
                          protocol=S(protocol[:-3] + "/v1"),
                          conversation_id=f"stock-check-2026-11-30-{index}",
                          in_reply_to=f"rq-{index}", timestamp=1764502900000 + index,
                          body=body)
        messages.append(parse(message.canonical().encode(), registry=registry))
    return messages


def plain(value: Any) -> Any:
    """The value tree as msgspec takes it: lists, ``str`` atoms, ints and Decimals."""
    if isinstance(value, tuple):
        return [plain(item) for item in value]
    if type(value) is K:
        return ":" + str.__str__(value)
    if isinstance(value, str):
        return str.__str__(value)
    return value


T = TypeVar("T")
R = TypeVar("R")


def apply_all(function: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``function`` of each item: a contender's pass (bound by ``functools.partial``)."""
    return [function(item) for item in items]


def texts_c(messages: Sequence[Message]) -> list[str]:
    return [m.canonical() for m in messages]


def texts_python(messages: Sequence[Message]) -> list[str]:
    return [canonical_value_python(m.to_value()) for m in messages]


def value_texts_c(values: Sequence[Value]) -> list[str]:
    return [canonical_value(v) for v in values]


def value_texts_python(values: Sequence[Value]) -> list[str]:
    return [canonical_value_python(v) for v in values]


def msgspec_encoders() -> dict[str, Callable[[object], bytes]]:
    """msgspec's JSON and msgpack encoders by contender name (none when it is not
    installed)."""
    try:
        import msgspec
    except ImportError:  # pragma: no cover
        return {}
    return {"msgspec json": msgspec.json.encode, "msgspec msgpack": msgspec.msgpack.encode}


def measure(contenders: dict[str, Callable[[], object]], rounds: int,
            count: int) -> dict[str, float]:
    best = dict.fromkeys(contenders, float("inf"))
    for _ in range(rounds):
        for name, run in contenders.items():
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
    return {name: seconds / count * 1e6 for name, seconds in best.items()}


def run(count: int, rounds: int) -> dict[str, Any]:
    peers = msgspec_encoders()
    registry = load_registry(find_descriptors())
    c_encoder = Encoder(registry, validate=False)
    py_encoder = Encoder(registry, validate=False, pure_python=True)
    results: dict[str, Any] = {"c_twins_built": native is not None, "classes": {}}
    for size in SIZES:
        messages = corpus(registry, size, count)
        values = [m.to_value() for m in messages]
        plains = [plain(v) for v in values]
        frames = [c_encoder.encode(m) for m in messages]
        assert frames == [py_encoder.encode(m) for m in messages]
        assert [canonical_value(v) for v in values] == \
            [canonical_value_python(v) for v in values]
        contenders: dict[str, Callable[[], object]] = {
            "text C": partial(texts_c, messages),
            "text Python": partial(texts_python, messages),
            "text value C": partial(value_texts_c, values),
            "text value Python": partial(value_texts_python, values),
            "binary C": partial(apply_all, c_encoder.encode, messages),
            "binary Python": partial(apply_all, py_encoder.encode, messages),
        }
        for name, encode in peers.items():
            contenders[name] = partial(apply_all, encode, plains)
        times = measure(contenders, rounds, count)
        text_bytes = sum(len(v) for v in (canonical_value(v).encode() for v in values))
        row: dict[str, Any] = {
            "messages": count, "canonical_bytes_mean": round(text_bytes / count),
            "frame_bytes_mean": round(sum(map(len, frames)) / count),
            "us_per_message": {name: round(t, 3) for name, t in times.items()},
            "ratios": {
                "text C vs Python": times["text Python"] / times["text C"],
                "text value C vs Python": times["text value Python"] / times["text value C"],
                "binary C vs Python": times["binary Python"] / times["binary C"],
            }}
        if peers:
            row["ratios"].update({
                "text C vs msgspec json": times["msgspec json"] / times["text C"],
                "text value C vs msgspec json": times["msgspec json"] / times["text value C"],
                "binary C vs msgspec msgpack": times["msgspec msgpack"] / times["binary C"],
                "text Python vs msgspec json": times["msgspec json"] / times["text Python"],
                "binary Python vs msgspec msgpack":
                    times["msgspec msgpack"] / times["binary Python"],
            })
        row["ratios"] = {name: round(r, 2) for name, r in row["ratios"].items()}
        results["classes"][size] = row
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    installed.check()  # the installed cbcl, with its C extension
    results = run(args.messages, args.rounds)
    for size, row in results["classes"].items():
        print(f"{size}: {row['messages']} messages, canonical {row['canonical_bytes_mean']} B, "
              f"frame {row['frame_bytes_mean']} B (means)")
        for name, t in row["us_per_message"].items():
            print(f"  {name:20s} {t:9.3f} µs")
        for name, ratio in row["ratios"].items():
            print(f"  {name:34s} {ratio:6.2f}×")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
