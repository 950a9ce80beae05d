"""A validated binary encode (``Encoder(registry).encode``, validate=True: the limits, pass
2, the schema and the frame) against pydantic's ``model_validate`` + ``model_dump_json`` on
the same content, over many different messages (issue 30's target: ≥ 1.5×).

    python benchmarks/validated_encode.py [--messages N] [--rounds R] [--json FILE]

Sets: request/v1 and contract-net/v1, two size classes each (``small``, ~370 B of
canonical text, and ``medium``, ~4 KB), ``N`` different messages a set (1,000 by default),
built as ``cbcl bench`` builds them (:func:`cbcl_bench.build_case`: each read back from
its canonical text). pydantic is given each message as a JSON API holds it
(:func:`cbcl_bench.natural_json`, decimals as floats) as Python objects (the model's own
``model_dump`` of it, so tuples are tuples, as its strict mode wants) and the strict model
``cbcl bench`` builds from the same schema (:func:`cbcl_bench.typed_peers`);
it validates it and writes its JSON. Contenders:

- ``cbcl``: ``Encoder(registry).encode`` - where the extension is built, one C call that
  checks (cbcl/_native_src/outgoing.c) and encodes;
- ``cbcl before``: what that was before the check was native (and what a session did):
  ``check_outgoing_python`` (the Python walk of the limits, then pass 2 and the schema)
  then ``Encoder(validate=False).encode``;
- ``pydantic``: ``Model.model_validate(document).model_dump_json()``.

Rounds are interleaved and each contender's best is kept (µs per message); ratios are from
the same run, so a loaded machine slows all alike.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import installed
from cbcl_bench import build_case, find_descriptors, load_registry, natural_json, typed_peers

from cbcl import Message
from cbcl.binary._codec import Encoder
from cbcl.protocol import _api
from cbcl.protocol._protocol import Protocol

#: The Python reference of the outgoing check (before the C tier, check_outgoing was it).
check_outgoing_python = getattr(_api, "check_outgoing_python", _api.check_outgoing)
PROTOCOLS = ("request-v1", "contract-net-v1")
SIZES = ("small", "medium")


def encode_all(encode: Callable[[Message], bytes], messages: Sequence[Message]) -> None:
    for message in messages:
        encode(message)


def encode_before(encoder: Encoder, protocol: Protocol, messages: Sequence[Message]) -> None:
    limits = encoder.limits
    encode = encoder.encode
    for message in messages:
        check_outgoing_python(protocol, message, limits)
        encode(message)


def pydantic_all(model: Any, documents: Sequence[dict[str, Any]]) -> None:
    validate = model.model_validate
    for document in documents:
        validate(document).model_dump_json()


def measure(contenders: dict[str, Callable[[], object]], rounds: int,
            count: int) -> dict[str, float]:
    best = dict.fromkeys(contenders, float("inf"))
    for _ in range(rounds):
        for name, run in contenders.items():
            start = time.process_time()
            run()
            best[name] = min(best[name], time.process_time() - start)
    return {name: seconds / count * 1e6 for name, seconds in best.items()}


def run(count: int, rounds: int) -> dict[str, Any]:
    descriptors = find_descriptors()
    registry = load_registry(descriptors)
    validating = Encoder(registry)
    plain = Encoder(registry, validate=False)
    native_check = getattr(_api, "_check_outgoing_c", None) is not None
    results: dict[str, Any] = {"native_check": native_check, "sets": {}}
    for protocol_name in PROTOCOLS:
        peers = typed_peers(protocol_name)
        for size in SIZES:
            case = build_case(descriptors, registry, protocol_name, size, count)
            messages = list(case.messages)
            protocol = registry.get(messages[0].protocol)
            assert protocol is not None
            frames = [validating.encode(m) for m in messages]
            assert frames == [plain.encode(m) for m in messages]
            documents: list[dict[str, Any]] = []
            if peers.pydantic is not None:  # (tuples where the model has tuples: strict)
                documents = [peers.pydantic.model_validate_json(natural_json(m)).model_dump(
                    exclude_none=True) for m in messages]
            contenders: dict[str, Callable[[], object]] = {
                "cbcl": partial(encode_all, validating.encode, messages),
                "cbcl before": partial(encode_before, plain, protocol, messages)}
            if peers.pydantic is not None:
                pydantic_all(peers.pydantic, documents)  # (each accepted, or raises)
                contenders["pydantic"] = partial(pydantic_all, peers.pydantic, documents)
            times = measure(contenders, rounds, count)
            row: dict[str, Any] = {
                "messages": count,
                "canonical_bytes_mean": round(sum(len(t) for t in case.texts) / count),
                "frame_bytes_mean": round(sum(map(len, frames)) / count),
                "us_per_message": {name: round(t, 3) for name, t in times.items()},
                "ratios": {"cbcl vs cbcl before": round(times["cbcl before"] / times["cbcl"], 2)}}
            if "pydantic" in times:
                row["ratios"]["cbcl vs pydantic"] = round(times["pydantic"] / times["cbcl"], 2)
                row["ratios"]["cbcl before vs pydantic"] = \
                    round(times["pydantic"] / times["cbcl before"], 2)
            results["sets"][f"{protocol_name}/{size}"] = row
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    installed.check()  # the installed cbcl, with its C extension
    results = run(args.messages, args.rounds)
    for name, row in results["sets"].items():
        times = ", ".join(f"{k} {v:.2f} µs" for k, v in row["us_per_message"].items())
        ratios = ", ".join(f"{k} {v:.2f}x" for k, v in row["ratios"].items())
        print(f"{name:>24} ({row['canonical_bytes_mean']} B text, {row['frame_bytes_mean']} B "
              f"frame): {times}; {ratios}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(results, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
