"""Instructions per atom, by kind, with callgrind (issues 33 item 1 and 35): CBCL's text
parse, binary decode and text reader beside msgspec's typed JSON and msgpack decode of the
same content. Deterministic (instruction counts, not times), so it holds on a loaded
machine.

    python benchmarks/atom_instructions.py [--extra 1000] [--json FILE]

It runs itself under ``valgrind --tool=callgrind`` once, collecting only inside each
counted call (``--toggle-collect`` on the ``functools.reduce`` each is made through) and
dumping after each (``--dump-after``), so every measured call has its own count. Each
case reads a base message (a ~4 KB table/v1 message of ``cbcl bench``'s mixed set) and the
same message with ``--extra`` more items of one kind; the difference per item is the
figure. The items are
added where the protocol takes them: symbols to a row's ``:tags`` (``(list-of symbol)``),
decimals to its ``:dims``, and strings, integers, URIs, symbols, keywords and empty lists
to a list under its ``:attrs`` (``(keys (else any))``), so each figure is the atom's whole
cost in a body: reader or decoder, the grammar's walk and the schema. ``new`` names are
never seen before the call; ``recurring`` ones were read by an earlier, uncounted call.
msgspec reads the same items as a typed array (``list[str]``, ``list[int]``,
``list[Decimal]`` from strings, ``list[list[int]]``) in JSON and in msgpack, its figure
per item from the same difference.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from decimal import Decimal
from functools import partial, reduce
from pathlib import Path
from typing import Any

import installed
from cbcl_bench import Vocabulary, find_descriptors, load_registry, mixed_messages

import cbcl
from cbcl import Decoder, Encoder, canonical, parse
from cbcl.core._canonical import canonical_value
from cbcl.core._limits import Limits
from cbcl.core._values import URI, Keyword, Symbol

#: The contenders (each counted call is made through functools.reduce, whose C function
#: callgrind's collection is toggled on and dumps after: nothing else in the run calls it).
ENTRIES = ("text", "binary", "read", "msgspec-json", "msgspec-msgpack")
COUNTED = "functools_reduce"

#: Per kind: where the items go ("tags", "dims" or "attrs") and how item i is written.
KINDS: dict[str, tuple[str, Callable[[Vocabulary, int], Any]]] = {
    "symbol (new)": ("tags", lambda v, i: Symbol(v.new().replace("-", "x"))),
    "symbol (recurring)": ("tags", lambda v, i: Symbol(v.new().replace("-", "x"))),
    "keyword (new)": ("attrs", lambda v, i: Keyword(v.new().replace("-", "x"))),
    "URI (new)": ("attrs", lambda v, i: URI(f"agent://{v.new()}.example.net/x")),
    "URI (recurring)": ("attrs", lambda v, i: URI(f"agent://{v.new()}.example.net/x")),
    "string": ("attrs", lambda v, i: f"{v.new()} {v.new()}"),
    "integer": ("attrs", lambda v, i: v.rng.randrange(10**6)),
    "decimal": ("dims", lambda v, i: Decimal(f"{v.rng.randrange(10**4)}.{i % 997:03d}")),
    "empty list": ("attrs", lambda v, i: ()),
}


def _with(body: tuple[Any, ...], key: str, items: tuple[Any, ...]) -> tuple[Any, ...]:
    """``body`` (a table) with its first row's member ``key`` extended by ``items`` (for
    ``attrs``: one more pair, ``:x`` and the list of them)."""
    rows = list(body[body.index(Keyword("rows")) + 1])
    row = list(rows[0])
    at = row.index(Keyword(key)) + 1
    if key == "attrs":
        row[at] = (*row[at], Keyword("extra-items"), items)
    else:
        row[at] = (*row[at], *items)
    rows[0] = tuple(row)
    out = list(body)
    out[out.index(Keyword("rows")) + 1] = tuple(rows)
    return tuple(out)


def _msgspec_items(items: tuple[Any, ...]) -> tuple[Any, list[Any]]:
    """msgspec's type for ``items`` and the items as its JSON would hold them."""
    first = items[0] if items else None
    if isinstance(first, Decimal):
        return list[Decimal], [str(x) for x in items]
    if isinstance(first, int):
        return list[int], list(items)
    if isinstance(first, tuple):
        return list[list[int]], [[] for _ in items]
    return list[str], [str(x) for x in items]


def inner(extra: int, out: Path) -> None:
    """The measured calls (run under callgrind by :func:`outer`): each call's contender
    and case are written to ``out``, in call order, one JSON line per call."""
    import msgspec

    registry = load_registry(find_descriptors())
    encoder, decoder = Encoder(registry, validate=False), Decoder(registry)
    base = mixed_messages("mixed-4k", 1, "atom-instructions", fresh=0.0)[0]
    limits = Limits(max_list_items=1 << 16, max_nodes=1 << 18)
    log: list[dict[str, str]] = []
    base_body = base.body
    assert isinstance(base_body, tuple)

    def counted(contender: str, case: str, function: Callable[[Any], object],
                argument: Any) -> None:
        log.append({"contender": contender, "case": case})
        reduce(lambda _, item: function(item), [argument], None)  # (one call, counted)

    def measure(case: str, key: str, make: Callable[[Vocabulary, int], Any]) -> None:
        new = "new" in case
        for size in (0, extra):
            for contender in ENTRIES:
                # names new to each contender: a vocabulary of its own where they must be
                vocabulary = Vocabulary(random.Random(f"{case}/{size}/{contender}"),
                                        recurring=1, fresh=1.0)
                items = tuple(make(vocabulary, i) for i in range(size))
                message = dataclasses.replace(base, body=_with(base_body, key, items))
                kind, plain = _msgspec_items(items)
                function: Callable[[Any], object]
                if contender == "text":
                    function, argument = partial(parse, registry=registry), \
                        canonical(message).encode()
                elif contender == "binary":
                    function, argument = decoder.decode, encoder.encode(message)
                elif contender == "read":
                    function = partial(cbcl.read, limits=limits)
                    argument = ("(" + " ".join(map(canonical_value, items)) + ")").encode()
                elif contender == "msgspec-json":
                    function = msgspec.json.Decoder(kind).decode
                    argument = msgspec.json.encode(plain)
                else:
                    function = msgspec.msgpack.Decoder(kind).decode
                    argument = msgspec.msgpack.encode(plain)
                if not new:
                    function(argument)  # (uncounted: its names read once before)
                counted(contender, f"{case}/{size}", function, argument)

    # (uncounted: what a first call builds once, such as a decoder's plan of a protocol)
    parse(canonical(base).encode(), registry=registry)
    decoder.decode(encoder.encode(base))
    cbcl.read(b"(a 1)", limits=limits)
    for case, (key, make) in KINDS.items():
        measure(case, key, make)
    out.write_text("".join(json.dumps(entry) + "\n" for entry in log))


def outer(extra: int) -> dict[str, dict[str, float]]:
    """Run :func:`inner` under callgrind; instructions per added item, by case and
    contender."""
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "calls.jsonl"
        command = ["valgrind", "--tool=callgrind", "--collect-atstart=no",
                   f"--toggle-collect={COUNTED}", f"--dump-after={COUNTED}",
                   f"--callgrind-out-file={folder}/cg.out", sys.executable, __file__,
                   "--inner", str(extra), str(log)]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONHASHSEED": "0"})
        calls = [json.loads(line) for line in log.read_text().splitlines()]
        counts = _dump_counts(Path(folder))
    # (each toggled call dumps once; dumps come in call order)
    if len(counts) != len(calls):
        raise SystemExit(f"{len(counts)} callgrind dumps for {len(calls)} calls")
    by: dict[str, dict[str, int]] = {}
    for call, count in zip(calls, counts, strict=True):
        by.setdefault(call["case"], {})[call["contender"]] = count
    out: dict[str, dict[str, float]] = {}
    for case in KINDS:
        out[case] = {c: (by[f"{case}/{extra}"][c] - by[f"{case}/0"][c]) / extra
                     for c in ENTRIES}
    return out


def _dump_counts(folder: Path) -> list[int]:
    """The instructions of each dump after a toggled call, in dump order."""
    found: list[tuple[int, int]] = []
    for path in folder.glob("cg.out.*"):
        text = path.read_text()
        trigger = re.search(r"^desc: Trigger: (.*)$", text, re.M)
        if trigger is None or COUNTED not in trigger.group(1):
            continue
        part = int(path.name.rsplit(".", 1)[1])
        total = re.search(r"^summary: (\d+)", text, re.M) or re.search(r"^totals: (\d+)",
                                                                         text, re.M)
        found.append((part, int(total.group(1)) if total else 0))
    return [count for _, count in sorted(found)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--extra", type=int, default=1000)
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--inner", nargs=2, metavar=("EXTRA", "LOG"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inner:
        inner(int(args.inner[0]), Path(args.inner[1]))
        return 0
    installed.check()
    result = outer(args.extra)
    print("| instructions per item | text parse | binary decode | cbcl.read | "
          "msgspec JSON | msgspec msgpack |")
    print("|---|---:|---:|---:|---:|---:|")
    for case, row in result.items():
        print(f"| {case} | " + " | ".join(f"{row[c]:,.0f}" for c in ENTRIES) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
