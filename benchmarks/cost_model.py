"""The cost model of spec/cbcl-1.0.md §1.1.1, checked on varied messages (issue 19).

    time(µs) = fixed + per_byte × bytes + per_token × tokens + per_new_name × new_names

per operation: text parse (``cbcl.parse``, both passes), text read (``cbcl.read``) and
binary decode (a reused ``cbcl.Decoder``; ``bytes`` is then the frame's size, ``tokens``
always the text form's tokens: atoms and parentheses; ``new_names`` the message's
distinct symbols, keywords and URIs when its set holds more distinct names than the
reader's intern table keeps, ``_reader._INTERN_MAX``, so that they are new each time the
set is read, else 0: issue 35's never-seen names). ``--fit`` measures the
coefficients on a calibration set of request/v1 messages whose results mix long strings
(many bytes per token) and short atoms (few), from ~300 B to ~16 KB, and of the shipped
protocols' varied messages (``cbcl_bench.varied``) and of the mixed sets (``cbcl_bench.
mixed_messages``: ~4 KB and ~64 KB rows of every atom kind, most names appearing once), by
least squares of the relative error over sets timed in interleaved rounds. The check
predicts, with the coefficients below (those of the spec), the mean time per message over
each set of ``benchmarks/cliffs.py`` (1,000 different messages of ~370 B and ~4 KB, plain
and with each rare atom), over a set of long-string messages and over mixed sets the fit
did not see, and fails when one is off by more than TOLERANCE. The coefficients were
measured on the reference machine (Python 3.11, x86_64, 2 shared vCPUs, C extension
built); elsewhere ``--relative`` first scales them by the machine's factor (the median of
measured / predicted over the sets) and checks the shape.

    .venv/bin/python benchmarks/cost_model.py [--fit] [--relative] [--rounds N]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import installed

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cliffs
from cbcl_bench import (
    PROTOCOLS,
    find_descriptors,
    load_registry,
    mixed_messages,
    records as records_of,
    varied,
)

import cbcl
from cbcl.core import _reader
from cbcl.core._values import URI, Keyword, Symbol

TOLERANCE = 0.25
#: µs: (fixed, per byte, per token, per new name) on the reference machine
#: (spec/cbcl-1.0.md §1.1.1).
MODEL = {
    "text parse": (1.94, 0.0011, 0.0253, 0.0),
    "text read": (2.59, 0.0012, 0.0254, 0.0),
    "binary decode": (1.32, 0.0002, 0.0227, 0.0),
}
_NAME_KINDS = (_reader.KEYWORD, _reader.SYMBOL, _reader.URI_TOKEN)


def tokens_of(text: str) -> tuple[int, frozenset[tuple[int, str]]]:
    """The text's tokens, and its distinct names (kind, text)."""
    count = 0
    names = set()
    for m in _reader.TOKEN.finditer(text):
        kind = m.lastindex
        if kind == _reader.EOF:
            break
        count += 1
        if kind in _NAME_KINDS:
            names.add((kind, m.group(kind)))
    return count, frozenset(names)


def calibration_message(rng: random.Random, i: int, records: int, padding: int,
                        ) -> cbcl.Message:
    """A request/v1 result of ``records`` inventory records (the atoms of real data: ~13
    tokens per 100 B) and ``padding`` bytes of long strings (few tokens for their bytes):
    the two vary apart, so bytes and tokens can be told apart."""
    items: list[Any] = list(records_of(records, rng.randrange(10**6))[2])
    chunks = rng.randrange(1, 5)
    for j in range(chunks if padding else 0):
        items.append("lorem ipsum dolor sit amet "[j % 5:] * (padding // chunks // 27 + 1))
    body = (Symbol("inform-result"), Keyword("action-id"), f"rq-{i}", Keyword("result"),
            (Symbol("batch"), *items))
    return cbcl.Message(message_id=f"m-{i}", sender=URI("agent://ops/a"),
                        receiver=URI("agent://ops/b"), intent="INFORM",
                        protocol=Symbol("request/v1"), body=body)


def long_strings_message(rng: random.Random, i: int) -> cbcl.Message:
    """~2–6 KB, mostly in a few long strings (few tokens for its bytes), and one record."""
    parts = tuple("lorem ipsum dolor sit amet, " * rng.randrange(5, 40) + str(j)
                  for j in range(rng.randrange(2, 8)))
    body = (Symbol("inform-result"), Keyword("action-id"), f"rq-{i}", Keyword("result"),
            (Symbol("report"), records_of(1, i)[2][0], *parts))
    return cbcl.Message(message_id=f"m-{i}", sender=URI("agent://ops/a"),
                        receiver=URI("agent://ops/b"), intent="INFORM",
                        protocol=Symbol("request/v1"), body=body)


class Sample:
    def __init__(self, message: cbcl.Message, text: bytes, frame: bytes) -> None:
        self.message, self.text, self.frame = message, text, frame
        self.tokens, self.names = tokens_of(text.decode())
        self.new_names = 0  # set by samples_of, for the whole set


def predict(coefficients: tuple[float, float, float, float], size: int,
            sample: Sample) -> float:
    a, b, c, d = coefficients
    return a + b * size + c * sample.tokens + d * sample.new_names


def operations(registry: cbcl.Registry) -> dict[str, tuple[Callable[[Sample], object],
                                                             Callable[[Sample], int]]]:
    decoder = cbcl.Decoder(registry)
    return {
        "text parse": (lambda s: cbcl.parse(s.text, registry=registry), lambda s: len(s.text)),
        "text read": (lambda s: cbcl.read(s.text), lambda s: len(s.text)),
        "binary decode": (lambda s: decoder.decode(s.frame), lambda s: len(s.frame)),
    }


def time_sets(jobs: list[tuple[list[Sample], Callable[[Sample], object]]], rounds: int,
              ) -> list[float]:
    """Mean µs per message of each ``(set, function)`` job: the best of ``rounds`` passes
    over its set, the rounds interleaved (a round passes once over every job), so that a
    burst of load on a shared machine spoils one round of every job, not every round of
    one."""
    for samples, function in jobs:
        for sample in samples:
            function(sample)
    best = [float("inf")] * len(jobs)
    for _ in range(rounds):
        for index, (samples, function) in enumerate(jobs):
            start = time.perf_counter()
            for sample in samples:
                function(sample)
            best[index] = min(best[index], (time.perf_counter() - start) / len(samples))
    return [value * 1e6 for value in best]


def fit(rows: list[tuple[float, float, float, float]]) -> tuple[float, float, float, float]:
    """Least squares of t = a + b·bytes + c·tokens + d·new_names over ``(bytes, tokens,
    new_names, t)`` rows, each row's error relative to its t (weights 1/t²): the check
    judges relative errors, and in absolute terms the largest messages would decide the
    fixed term. With no row of new names, d is 0."""
    terms = 4 if any(row[2] for row in rows) else 3
    # The weighted normal equations (no numpy needed): each row (1, bytes, tokens[,
    # new_names]) -> t, scaled by 1/t, solved by Gaussian elimination with pivoting.
    scaled = [tuple(u / row[-1] for u in (1.0, *row[:terms - 1])) for row in rows]
    m = [[sum(u[i] * u[j] for u in scaled) for j in range(terms)]
         + [sum(u[i] for u in scaled)] for i in range(terms)]
    for col in range(terms):
        pivot = max(range(col, terms), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(terms):
            if r != col:
                factor = m[r][col] / m[col][col]
                m[r] = [x - factor * y for x, y in zip(m[r], m[col], strict=True)]
    out = [m[k][terms] / m[k][k] for k in range(terms)] + [0.0] * (4 - terms)
    return out[0], out[1], out[2], out[3]


def samples_of(messages: list[cbcl.Message], encoder: cbcl.Encoder,
               texts: list[bytes] | None = None) -> list[Sample]:
    """The set's samples; their names count as new when the set holds more distinct
    names than the intern table keeps (each pass over it then meets them anew)."""
    texts = texts or [cbcl.canonical(m).encode() for m in messages]
    samples = [Sample(m, t, encoder.encode(m)) for m, t in zip(messages, texts, strict=True)]
    if len(frozenset().union(*(s.names for s in samples))) > _reader._INTERN_MAX:
        for sample in samples:
            sample.new_names = len(sample.names)
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fit", action="store_true", help="measure the coefficients")
    parser.add_argument("--relative", action="store_true",
                        help="scale the model by this machine's factor before checking")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--verbose", action="store_true", help="print the fit's rows")
    parser.add_argument("--messages", type=int, default=1000)
    args = parser.parse_args(argv)
    installed.check()  # the installed cbcl, with its C extension
    registry = load_registry(find_descriptors())
    encoder = cbcl.Encoder(registry, validate=False)
    ops = operations(registry)
    model = dict(MODEL)
    if args.fit:
        # Groups of 100 different messages of one composition, each timed as a set (as
        # the check times its sets): the fit is over the groups' means.
        rng = random.Random(11)
        groups = []
        for records in (1, 3, 8, 21, 40):
            for padding in (0, 300, 1500, 6000):
                groups.append(samples_of([calibration_message(rng, i, records, padding)
                                          for i in range(100)], encoder))
        # and the mixes of atoms of the four shipped protocols' messages (cbcl bench's
        # generator, not the check's), ~370 B to ~4 KB
        for protocol in PROTOCOLS:
            for size_class in ("small", "medium"):
                groups.append(samples_of(varied(protocol, size_class, 100, seed=29),
                                         encoder))
        # and the mixed sets' rows (every atom kind, most names appearing once: issue 33),
        # ~4 KB and ~64 KB
        for size_class, count in (("mixed-4k", 100), ("mixed-64k", 20)):
            groups.append(samples_of(mixed_messages(size_class, count, "fit"), encoder))
        jobs = [(g, function) for function, _ in ops.values() for g in groups]
        times = iter(time_sets(jobs, args.rounds))
        for name, (_function, size) in ops.items():
            rows = [(statistics.fmean(map(size, g)), statistics.fmean(s.tokens for s in g),
                     statistics.fmean(s.new_names for s in g), next(times)) for g in groups]
            model[name] = coefficients = fit(rows)
            if args.verbose:
                for row in rows:
                    print(f"  {name}: {row[0]:.0f} B, {row[1]:.0f} tokens, {row[2]:.0f} new "
                          f"names, {row[3]:.2f} µs")
            a, b, c, d = coefficients
            errors = [abs(a + b * x + c * k + d * n - t) / t for x, k, n, t in rows]
            print(f"fit {name}: fixed {a:.2f} µs, {b:.4f} µs/byte, {c:.4f} µs/token, "
                  f"{d:.4f} µs/new name (median error {statistics.median(errors):.1%}, "
                  f"worst {max(errors):.1%})")
    sets: dict[str, list[Sample]] = {}
    for size_class, make in (("small", cliffs.small_message),
                             ("medium", cliffs.medium_message)):
        rng = random.Random(19)
        messages = [make(rng, i) for i in range(args.messages)]
        for seed, variant in enumerate(cliffs.VARIANTS):
            if variant in ("plain", "escaped quote", "19-digit integer", "comment"):
                texts = cliffs.variant_texts(messages, variant, seed, registry)
                # the frame of the plain message: a comment has no binary form, and the
                # rare atom changes its frame by a few bytes only
                sets[f"{size_class}/{variant}"] = samples_of(messages, encoder, texts)
    rng = random.Random(23)
    sets["long strings"] = samples_of([long_strings_message(rng, i) for i in range(300)],
                                      encoder)
    for size_class, count in (("mixed-4k", 300), ("mixed-64k", 30)):
        sets[size_class] = samples_of(mixed_messages(size_class, count, "check"), encoder)
    results = []
    checks = [(set_name, name) for set_name in sets for name in ops]
    measurements = time_sets([(sets[set_name], ops[name][0]) for set_name, name in checks],
                             args.rounds)
    for (set_name, name), measured in zip(checks, measurements, strict=True):
        samples, size = sets[set_name], ops[name][1]
        predicted = statistics.fmean(predict(model[name], size(s), s) for s in samples)
        results.append((set_name, name, measured, predicted))
    factor = statistics.median(m / p for _, _, m, p in results) if args.relative else 1.0
    worst = 0.0
    print(f"\nmachine factor {factor:.3f}; tolerance ±{TOLERANCE:.0%}")
    print("| set | operation | bytes | tokens | measured µs | predicted µs | error |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for set_name, name, measured, predicted in results:
        samples = sets[set_name]
        size = ops[name][1]
        error = measured / (predicted * factor) - 1
        worst = max(worst, abs(error))
        print(f"| {set_name} | {name} | {statistics.fmean(map(size, samples)):.0f} | "
              f"{statistics.fmean(s.tokens for s in samples):.0f} | {measured:.1f} | "
              f"{predicted * factor:.1f} | {error:+.1%} |")
    print(f"\nworst error {worst:.1%} (tolerance ±{TOLERANCE:.0%})")
    return 1 if worst > TOLERANCE else 0


if __name__ == "__main__":
    sys.exit(main())
