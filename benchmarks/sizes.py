"""Sizes of the binary form against the text, canonical, compact JSON and msgpack forms, on
the corpus of ``cbcl bench`` (small, medium and large messages of each shipped protocol).

    python benchmarks/sizes.py [--json FILE]

Columns: ``text`` the message as stored (comments, indentation), ``canonical`` its
canonical form, ``binary`` the frame (with the 32-byte digest), ``json`` compact JSON of the
lossless JSON mapping (``cbcl.json_mapping.message_to_json``, ``separators=(",", ":")``, UTF-8),
``msgpack`` ``msgpack.packb`` of the message's value tree with symbols, keywords, URIs and
decimals as strings. Target: binary ≤ 0.6 × compact JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import installed
from cbcl_bench import (
    RECORDS,
    compact_json,
    find_descriptors,
    generated,
    load_registry,
    plain,
    sizes as corpus_sizes,
)

import cbcl
from cbcl.binary._codec import Encoder


def registry() -> cbcl.Registry:
    """The shipped protocols, loaded (unsigned, in memory)."""
    return load_registry(find_descriptors())


def corpus(reg: cbcl.Registry) -> dict[str, tuple[bytes, cbcl.Message]]:
    """Name -> (the message's stored text, the message): every shipped example, and the
    generated request/v1 messages of ``cbcl bench`` (medium ~4 KB, large ~100 KB)."""
    out: dict[str, tuple[bytes, cbcl.Message]] = {}
    for path in sorted((find_descriptors() / "examples").glob("*.cbcl")):
        text = path.read_bytes()
        out[path.stem] = (text, cbcl.parse(text, registry=reg))
    for name, count in RECORDS.items():
        message = generated("request-v1", count)
        out[name] = (cbcl.canonical(message).encode(), message)
    return out


def sizes(message: cbcl.Message, text: bytes, encoder: Encoder) -> dict[str, Any]:
    """The sizes of one message in each form (bytes)."""
    import msgpack

    return {"text": len(text), "canon": len(message.canonical().encode()),
            "binary": len(encoder.encode(message)), "json": len(compact_json(message)),
            "msgpack": len(msgpack.packb(plain(message.to_value())))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    installed.check()  # the installed cbcl, with its C extension
    from cbcl_bench import build_corpus

    directory = find_descriptors()
    reg = load_registry(directory)
    rows = corpus_sizes(build_corpus(directory, reg), reg)
    print("| message | text | canonical | binary | json | msgpack | binary/json | "
          "binary/msgpack |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        print(f"| {name} | {r['text']} | {r['canonical']} | {r['binary']} | {r['json']} | "
              f"{r['msgpack']} | {r['binary_vs_json']:.3f} | {r['binary_vs_msgpack']:.3f} |")
    worst = max(r["binary_vs_json"] for r in rows.values())
    print(f"worst binary/json {worst:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
