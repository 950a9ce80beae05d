"""The cost model of spec/cbcl-1.0.md §1.1.1, checked on varied messages (issue 19).

    time(µs) = fixed + per_byte × bytes + per_token × tokens

per operation: text parse (``cbcl.parse``, both passes), text read (``cbcl.read``) and
binary decode (a reused ``cbcl.Decoder``; ``bytes`` is then the frame's size, ``tokens``
always the text form's tokens: atoms and parentheses). ``--fit`` measures the
coefficients on a calibration set of request/v1 messages whose results mix long strings
(many bytes per token) and short atoms (few), from ~300 B to ~16 KB, and of the shipped
protocols' varied messages (``cbcl_bench.varied``), by least squares of the relative
error over sets timed in interleaved rounds. The check predicts,
with the coefficients below (those of the spec), the mean time per message over each set
of ``benchmarks/cliffs.py`` (1,000 different messages of ~370 B and ~4 KB, plain and with
each rare atom) and over a set of long-string messages, and fails when one is off by more
than TOLERANCE. The coefficients were measured on the reference machine (Python 3.11,
x86_64, 2 shared vCPUs, C extension built); elsewhere ``--relative`` first scales them by
the machine's factor (the median of measured / predicted over the sets) and checks the
shape.

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
from cbcl_bench import PROTOCOLS, find_descriptors, load_registry, records as records_of, varied

import cbcl
from cbcl.core import _reader
from cbcl.core._values import URI, Keyword, Symbol

TOLERANCE = 0.25
#: µs: (fixed, per byte, per token) on the reference machine (spec/cbcl-1.0.md §1.1.1).
MODEL = {
    "text parse": (1.94, 0.0011, 0.0253),
    "text read": (2.59, 0.0012, 0.0254),
    "binary decode": (1.32, 0.0002, 0.0227),
}


def tokens_of(text: str) -> int:
    count = 0
    for m in _reader.TOKEN.finditer(text):
        if m.lastindex == _reader.EOF:
            return count
        count += 1
    return count  # pragma: no cover


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
        self.tokens = tokens_of(text.decode())


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


def fit(rows: list[tuple[float, float, float]]) -> tuple[float, float, float]:
    """Least squares of t = a + b·bytes + c·tokens over ``(bytes, tokens, t)`` rows, each
    row's error relative to its t (weights 1/t²): the check judges relative errors, and
    in absolute terms the largest messages would decide the fixed term."""
    # The weighted normal equations, 3x3, solved by Cramer's rule (no numpy needed): each
    # row (1, bytes, tokens) -> t scaled by 1/t.
    scaled = [((1 / t, x / t, y / t), 1.0) for x, y, t in rows]
    m = [[sum(u[i] * u[j] for u, _ in scaled) for j in range(3)] for i in range(3)]
    v = [sum(u[i] * w for u, w in scaled) for i in range(3)]

    def det(a: list[list[float]]) -> float:
        return (a[0][0] * (a[1][1] * a[2][2] - a[1][2] * a[2][1])
                - a[0][1] * (a[1][0] * a[2][2] - a[1][2] * a[2][0])
                + a[0][2] * (a[1][0] * a[2][1] - a[1][1] * a[2][0]))

    d = det(m)
    out = []
    for col in range(3):
        a = [row[:] for row in m]
        for r in range(3):
            a[r][col] = v[r]
        out.append(det(a) / d)
    return out[0], out[1], out[2]


def samples_of(messages: list[cbcl.Message], encoder: cbcl.Encoder,
               texts: list[bytes] | None = None) -> list[Sample]:
    texts = texts or [cbcl.canonical(m).encode() for m in messages]
    return [Sample(m, t, encoder.encode(m)) for m, t in zip(messages, texts, strict=True)]


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
        jobs = [(g, function) for function, _ in ops.values() for g in groups]
        times = iter(time_sets(jobs, args.rounds))
        for name, (_function, size) in ops.items():
            rows = [(statistics.fmean(map(size, g)), statistics.fmean(s.tokens for s in g),
                     next(times)) for g in groups]
            model[name] = coefficients = fit(rows)
            if args.verbose:
                for row in rows:
                    print(f"  {name}: {row[0]:.0f} B, {row[1]:.0f} tokens, {row[2]:.2f} µs")
            errors = [abs(coefficients[0] + coefficients[1] * b + coefficients[2] * k - t) / t
                      for b, k, t in rows]
            print(f"fit {name}: fixed {coefficients[0]:.2f} µs, {coefficients[1]:.4f} µs/byte, "
                  f"{coefficients[2]:.4f} µs/token (median error "
                  f"{statistics.median(errors):.1%}, worst {max(errors):.1%})")
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
    results = []
    checks = [(set_name, name) for set_name in sets for name in ops]
    measurements = time_sets([(sets[set_name], ops[name][0]) for set_name, name in checks],
                             args.rounds)
    for (set_name, name), measured in zip(checks, measurements, strict=True):
        samples, size = sets[set_name], ops[name][1]
        a, b, c = model[name]
        predicted = statistics.fmean(a + b * size(s) + c * s.tokens for s in samples)
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
