"""No cliffs in the text reader (issue 19): a rare atom costs what its bytes cost.

For each size class (~370 B and ~4 KB), 1,000 different messages that request/v1 (small)
or the four shipped protocols (medium) fully accept; each set again with one rare atom
put in one place of each message's body: an escaped quote, a 19-digit integer, a 30-digit
decimal, a non-ASCII string, \\u and \\n escapes, a URI with odd (non-ASCII) characters, a
comment inside the list. ``cbcl.read`` and ``cbcl.parse`` (both passes) are timed over
each set in interleaved rounds (best round kept), and each variant is reported as a ratio
to the plain set. The target: every variant ≤ 1.2× plain.

``--before REF`` times the reader of a git revision too (``cbcl/core/_reader.py`` at REF, run
beside today's, sharing its intern tables), in the same rounds: before/after in one run.

    .venv/bin/python benchmarks/cliffs.py [--rounds N] [--before HEAD] [--check]

``--check`` exits 1 when a variant of today's reader is over the target.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import subprocess
import sys
import time
import types
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import installed
from cbcl_bench import find_descriptors, generated, load_registry

import cbcl
from cbcl.core import _reader
from cbcl.core._values import URI, Keyword, Symbol
from cbcl.protocol import _envelope

TARGET = 1.2
MESSAGES = 1000
ROOT = Path(__file__).resolve().parent.parent

S, K = Symbol, Keyword


def small_message(rng: random.Random, i: int) -> cbcl.Message:
    """A ~370 B request/v1 result, different for every ``i``."""
    result = (S("snapshot"), K("id"), f"snap-{rng.randrange(10**5):05d}", K("size-gb"),
              Decimal(f"{rng.randrange(1, 99999) / 10:.1f}"), K("host"),
              rng.choice(["db-1", "cache-east", "files", "mail-relay"]), K("store"),
              URI(f"s3://backups/{rng.randrange(10**4)}"), K("files"),
              rng.randrange(10**6), K("at"), 1764500000000 + rng.randrange(10**8), K("tags"),
              tuple(S(t) for t in rng.sample(["full", "incr", "weekly", "hot"], 2)))
    body = (S("inform-result"), K("action-id"), f"rq-{i}", K("result"), result)
    return cbcl.Message(
        message_id=f"m-{i}-{rng.randrange(10**6)}", sender=URI("agent://ops/backup"),
        receiver=URI(f"agent://ops/{rng.choice(['scheduler', 'planner', 'audit'])}"),
        intent="INFORM", protocol=S("request/v1"),
        conversation_id=f"nightly-2026-11-{rng.randrange(1, 31):02d}",
        in_reply_to=f"rq-{i}", body=body)


def medium_message(rng: random.Random, i: int) -> cbcl.Message:
    """A ~4 KB message of one of the four shipped protocols, different for every ``i``."""
    protocol = ("request-v1", "contract-net-v1", "canon-a-v1", "task-assignment-v1")[i % 4]
    return generated(protocol, 21, seed=i)


# --------------------------------------------------------------------------- rare atoms


def _atoms(value: Any, path: tuple[int, ...] = ()) -> list[tuple[tuple[int, ...], Any]]:
    out = []
    if isinstance(value, tuple):
        for index, item in enumerate(value):
            out.extend(_atoms(item, (*path, index)))
    else:
        out.append((path, value))
    return out


def _replace(value: Any, path: tuple[int, ...], new: Any) -> Any:
    if not path:
        return new
    items = list(value)
    items[path[0]] = _replace(items[path[0]], path[1:], new)
    return tuple(items)


def _with_atom(message: cbcl.Message, rng: random.Random, kind: type,
               make: Callable[[Any, random.Random], Any], registry: cbcl.Registry) -> str:
    """The text of ``message`` with one atom of type ``kind`` of its body (picked at
    random where the protocol's grammar and schema still accept the message) replaced by
    ``make(atom, rng)``."""
    body = message.body
    places = [(p, a) for p, a in _atoms(body) if type(a) is kind]
    rng.shuffle(places)
    fields = {name: getattr(message, name) for name in (
        "message_id", "sender", "receiver", "intent", "protocol", "conversation_id",
        "in_reply_to", "reply_by", "timestamp")}
    for path, atom in places:
        text = cbcl.canonical(cbcl.Message(**fields, body=_replace(body, path,
                                                                   make(atom, rng))))
        try:
            cbcl.parse(text, registry=registry)
        except cbcl.CBCLError:
            continue
        return text
    raise ValueError(f"no {kind.__name__} of the body can take the rare atom")


def _split(s: str, rng: random.Random, insert: str) -> str:
    at = rng.randrange(len(s) + 1)
    return s[:at] + insert + s[at:]


VARIANTS: dict[str, tuple[type, Callable[[Any, random.Random], Any]] | None] = {
    "plain": None,
    "escaped quote": (str, lambda s, rng: _split(s, rng, '"')),
    "19-digit integer": (int, lambda n, rng: rng.randrange(10**18, 2**63)),
    "30-digit decimal": (Decimal, lambda d, rng: Decimal(
        f"{rng.randrange(10**14, 10**15)}.{rng.randrange(10**15):015d}")),
    "non-ASCII string": (str, lambda s, rng: _split(s, rng, "Größe–ü✓")),
    "\\u and \\n escapes": (str, lambda s, rng: _split(s, rng, "\x01\n")),
    "odd URI": (URI, lambda u, rng: URI(str.__str__(u) + "/dépôt~ü!$&'*+,=@")),
    "comment": None,  # a comment line inside the body's list
}


def variant_texts(messages: list[cbcl.Message], name: str, seed: int,
                  registry: cbcl.Registry) -> list[bytes]:
    rng = random.Random(seed)
    spec = VARIANTS[name]
    out = []
    for message in messages:
        if name == "comment":
            text = cbcl.canonical(message)
            at = text.index("(body ") + 6
            text = text[:at] + f"; note {rng.randrange(10**6)}\n" + text[at:]
        elif spec is None:
            text = cbcl.canonical(message)
        else:
            text = _with_atom(message, rng, *spec, registry)
        out.append(text.encode())
    return out


# --------------------------------------------------------------------------- the readers


def reader_at(ref: str) -> types.ModuleType:
    """``cbcl/core/_reader.py`` at git revision ``ref``, as a module of the package sharing
    today's intern tables (so pass 2 finds its atoms by identity, as it does today's)."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:cbcl/core/_reader.py"],
                            check=True, capture_output=True, text=True).stdout
    spec = importlib.util.spec_from_loader("cbcl._reader_before", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    module.__package__ = _reader.__package__  # cbcl.core: its relative imports
    exec(compile(source, f"{ref}:cbcl/core/_reader.py", "exec"), module.__dict__)
    for name in ("_SYMBOLS", "_KEYWORDS", "_PINNED_SYMBOLS", "_PINNED_KEYWORDS"):
        setattr(module, name, getattr(_reader, name))
    return module


def contenders(registry: cbcl.Registry, before: types.ModuleType | None,
               ) -> dict[str, Callable[[bytes], object]]:
    def parse(text: bytes) -> object:
        return cbcl.parse(text, registry=registry)

    out: dict[str, Callable[[bytes], object]] = {"read": cbcl.read, "parse": parse}
    if before is not None:
        old_read_value_at = before.read_value_at
        # pass 1's globals, where its read_value_at (imported from _reader) is looked up
        envelope_globals = vars(_envelope)

        def parse_before(text: bytes) -> object:
            envelope_globals["read_value_at"] = old_read_value_at
            try:
                return cbcl.parse(text, registry=registry)
            finally:
                envelope_globals["read_value_at"] = _reader.read_value_at

        out["read before"] = before.read
        out["parse before"] = parse_before
    return out


def measure(sets: dict[str, list[bytes]], functions: dict[str, Callable[[bytes], object]],
            rounds: int) -> dict[tuple[str, str], float]:
    """µs per message of each function over each set: the best of interleaved rounds."""
    best: dict[tuple[str, str], float] = {}
    for texts in sets.values():  # every text reads, and warms the caches
        for function in functions.values():
            for text in texts:
                function(text)
    for _ in range(rounds):
        for variant, texts in sets.items():
            for name, function in functions.items():
                start = time.perf_counter()
                for text in texts:
                    function(text)
                elapsed = (time.perf_counter() - start) / len(texts) * 1e6
                key = (name, variant)
                best[key] = min(best.get(key, elapsed), elapsed)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--messages", type=int, default=MESSAGES)
    parser.add_argument("--before", metavar="REF", help="also time the reader at REF")
    parser.add_argument("--check", action="store_true",
                        help=f"exit 1 if a variant is over {TARGET}× plain")
    args = parser.parse_args(argv)
    installed.check()  # the installed cbcl, with its C extension
    registry = load_registry(find_descriptors())
    before = reader_at(args.before) if args.before else None
    functions = contenders(registry, before)
    worst = 0.0
    for size, make in (("small", small_message), ("medium", medium_message)):
        rng = random.Random(19)
        messages = [make(rng, i) for i in range(args.messages)]
        sets = {name: variant_texts(messages, name, seed, registry)
                for seed, name in enumerate(VARIANTS)}
        mean = sum(map(len, sets["plain"])) / len(sets["plain"])
        best = measure(sets, functions, args.rounds)
        print(f"\n{size}: {len(messages)} different messages, {mean:.0f} B on average")
        names = list(functions)
        print("| variant | " + " | ".join(f"{n} µs | ×plain" for n in names) + " |")
        print("|---|" + "---:|---:|" * len(names))
        for variant in sets:
            cells = []
            for name in names:
                ratio = best[name, variant] / best[name, "plain"]
                if "before" not in name:
                    worst = max(worst, ratio)
                cells.append(f"{best[name, variant]:.1f} | {ratio:.2f}")
            print(f"| {variant} | " + " | ".join(cells) + " |")
        if before is not None:
            for name in ("read", "parse"):
                print(f"plain {name}: today / before = "
                      f"{best[name, 'plain'] / best[name + ' before', 'plain']:.3f}")
    print(f"\nworst variant of today's reader: {worst:.2f}× plain (target ≤ {TARGET}×)")
    return 1 if args.check and worst > TARGET else 0


if __name__ == "__main__":
    sys.exit(main())
