"""The cost model of spec/cbcl-1.0.md §1.1 ("Cost model"): fitted and checked (issues 19, 33).

    time(µs) = fixed + Σ coefficient[term] × count[term]

per operation: text parse (``cbcl.parse``, both passes), text read (``cbcl.read``) and
binary decode (a reused ``cbcl.Decoder``). The counts are read off the message's canonical
text in one pass of the reader's token pattern (:func:`count_terms`): its bytes (the
frame's, for binary decode), its lists, strings, integers, decimals, symbols, keywords and
URIs; its *new names*, the distinct symbols, keywords and URIs of the message that the
process does not hold when it reads it (:func:`mark_new_names`); and its *walked tokens*,
those of its body that its protocol's grammar steps through one at a time (a place it
types), not those of a list it takes whole as a ``value`` (:func:`walked_tokens`). A
token's cost is in its kind (a name is hashed, looked up and interned; a decimal made)
and in whether the grammar and schema walk it, not in a count of tokens: one per-token
term could not fit both the shipped protocols' sets (their bulk in ``value`` places) and
the mixed sets of issue 33 (typed rows, new names).

The coefficients live in the spec's table (between :data:`BEGIN` and :data:`END`), which
this script reads for its check and writes with ``--fit --write``. Every run times two
groups of sets together, each set's mean CPU time per message the best of ``--rounds``
interleaved rounds (the garbage collector off):

* the fit's sets, which vary the terms apart: request/v1 results with 1 to 40 inventory
  records and 0 to 6,000 B of long strings, long-string reports, atoms of every kind in
  random order with drawn shares (names recurring or never seen), the shipped protocols'
  varied messages, ``benchmarks/cliffs.py``'s rare atoms, and the mixed table/v1 rows
  (``cbcl bench``'s mixed sets) from no row (~300 B) to ~64 KB, names recurring or mostly
  never seen. ``--fit`` fits the terms on them by non-negative least squares of the
  relative error and prints the table in the spec's form; ``--write`` puts it in the spec.
  After a codec change: ``.venv/bin/python benchmarks/cost_model.py --fit --write``.
* the check's sets, which the fit does not see: ``cliffs.py``'s ~370 B and ~4 KB sets
  (plain, an escaped quote, a 19-digit integer, a comment), long strings, and the mixed
  ~4 KB (in order and any order, names mostly new or recurring) and ~64 KB sets. The run
  fails when one's mean is off the model's prediction (the spec's table, or the fit just
  made) by more than TOLERANCE; ``--relative`` first scales the model by this machine's
  factor (the median of measured / predicted over the check's sets).

``--instructions N`` instead fits the terms to callgrind's instruction counts (N messages
of each fit set, run under ``valgrind --tool=callgrind``): deterministic, so it shows the
terms' shape on a loaded machine, but blind to what cache misses cost in time.

    .venv/bin/python benchmarks/cost_model.py [--fit [--write]] [--relative] [--rounds N]
                                              [--verbose] [--instructions N]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import gc
import math
import os
import pickle
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import installed

sys.path.insert(0, str(Path(__file__).resolve().parent))

import atom_instructions
import cliffs
from cbcl_bench import (
    PROTOCOLS,
    Vocabulary,
    find_descriptors,
    load_registry,
    mixed_messages,
    mixed_messages_of,
    records as records_of,
    varied,
)

import cbcl
from cbcl.core import _reader
from cbcl.core._values import URI, Keyword, Symbol
from cbcl.protocol._pass2 import RefusalWork, find_refusal_python, start_node

TOLERANCE = 0.25
SPEC = Path(__file__).resolve().parent.parent / "spec" / "cbcl-1.0.md"
BEGIN = "<!-- cost model: written by benchmarks/cost_model.py --fit --write -->"
END = "<!-- end of the cost model -->"

#: The terms, in the spec table's order, with the label of each row.
TERMS: dict[str, str] = {
    "fixed": "fixed, per message",
    "byte": "per byte (the frame's, for binary decode)",
    "list": "per list (both its parentheses)",
    "string": "per string",
    "integer": "per integer",
    "decimal": "per decimal",
    "symbol": "per symbol",
    "keyword": "per keyword",
    "uri": "per URI",
    "walked": "per token the body's grammar walks",
    "switch": "per change of shape (protocol, intent or body's head) from the message before",
    "new symbol": "per new symbol (besides per symbol)",
    "new keyword": "per new keyword (besides per keyword)",
    "new uri": "per new URI (besides per URI)",
}
#: The operations, in the spec table's order (its columns), and the terms each is fitted
#: with (``cbcl.read`` walks no grammar).
OPERATIONS = ("text parse", "text read", "binary decode")
OPERATION_TERMS = {"text parse": tuple(TERMS),
                   "text read": tuple(t for t in TERMS if t != "walked"),
                   "binary decode": tuple(TERMS)}
Model = dict[str, dict[str, float]]  # operation -> term -> µs

_KIND_TERMS = {_reader.LPAR: "list", _reader.STRING: "string", _reader.INTEGER: "integer",
               _reader.DECIMAL: "decimal", _reader.SYMBOL: "symbol",
               _reader.KEYWORD: "keyword", _reader.URI_TOKEN: "uri"}
_NAME_KINDS = ("symbol", "keyword", "uri")
#: The C tiers' memos of names (the text reader's token memo, the binary decoder's atom
#: memo): 4,096 direct-mapped slots each, shared by symbols, keywords and URIs. A name the
#: memo lost costs almost what a never-seen one does (hashed, looked up in the intern
#: tables, put back in the memo), though the intern tables (8,192 symbols and 8,192
#: keywords) may still hold it.
MEMO_SLOTS = 4096


# --------------------------------------------------------------------------- the terms


@dataclasses.dataclass
class Terms:
    """The counts of one message's text form (``byte`` is its text's size)."""

    counts: Counter[str]
    #: its distinct names, (kind, name): the keyword's without its colon
    names: frozenset[tuple[str, str]]


def count_terms(text: str) -> Terms:
    """The terms of a text of one value (a message's canonical text, or any text
    ``cbcl.read`` takes): one count per atom of each kind, one per list, its bytes in
    UTF-8. A new name counts 0 here: :func:`mark_new_names` decides it for a set.
    Raises ``ValueError`` on a text the token pattern cannot read."""
    counts: Counter[str] = Counter({"fixed": 1, "byte": len(text.encode())})
    names = set()
    for m in _reader.TOKEN.finditer(text):
        kind = m.lastindex
        if kind == _reader.EOF:
            break
        if kind == _reader.BAD or kind is None:
            raise ValueError(f"not a token at {m.start()}: {text[m.start():m.start() + 20]!r}")
        if kind == _reader.RPAR:
            continue
        term = _KIND_TERMS[kind]
        counts[term] += 1
        if term in _NAME_KINDS:
            names.add((term, m.group(kind)))
    return Terms(counts, frozenset(names))


def mark_new_names(terms: Sequence[Terms], slots: int = MEMO_SLOTS) -> None:
    """Count the new names of each of ``terms``, a set read over and over in this order
    (as :func:`time_sets` reads it: a timed pass right after an untimed one): the expected
    misses of a direct-mapped memo of ``slots`` slots. A message's distinct name misses
    with probability ``1 − e^(−I/slots)``, ``I`` the names put in the memo since its last
    use (each a miss: the expected misses of the uses in between), and always at its first
    use; the counts are the second pass's. So a name every message has (a grammar's
    keyword) is almost always held, one of a set of ~4,000 others misses two times in
    three, and one of a set of never-seen names always."""
    inserted = 0.0  # expected misses so far
    at: dict[tuple[str, str], float] = {}  # name -> `inserted` just after its last use
    for second in (False, True):
        for t in terms:
            new = dict.fromkeys(_NAME_KINDS, 0.0)
            for name in sorted(t.names):
                last = at.get(name)
                miss = 1.0 if last is None else -math.expm1(-(inserted - last) / slots)
                inserted += miss
                at[name] = inserted
                new[name[0]] += miss
            if second:
                for kind in _NAME_KINDS:
                    t.counts[f"new {kind}"] = new[kind]  # type: ignore[assignment]


def shape_of(message: cbcl.Message) -> tuple[str, str, str]:
    """What a message's path through the passes depends on: its protocol, intent and the
    head of its body (its first atom, ``""`` for none)."""
    body = message.body
    head = body[0] if isinstance(body, tuple) and body else ""
    return (str(message.protocol), message.intent.value, str(head))


def mark_switches(shapes: Sequence[tuple[str, str, str]], terms: Sequence[Terms]) -> None:
    """Count, in each of ``terms`` (a set read in this order, after other sets), 1 where
    its message's shape (:func:`shape_of`) differs from the message before it: a stream
    that changes protocol, intent or body from one message to the next costs more per
    message than one of a single shape (each takes other branches and tables of the C
    tiers than the last). The first message of a set follows the set's last (as
    :func:`time_sets` reads it)."""
    previous = shapes[-1] if shapes else None
    for shape, t in zip(shapes, terms, strict=True):
        t.counts["switch"] = int(shape != previous)
        previous = shape


def walked_tokens(registry: cbcl.Registry, message: cbcl.Message) -> int:
    """The tokens of ``message``'s body its protocol's grammar walks one at a time (in
    the places it types; a list where it takes a ``value`` is taken whole, as one), and
    its end: the steps of pass 2's reference walk (``find_refusal_python``). Raises
    ``ValueError`` for a message its protocol's grammar refuses or a protocol
    ``registry`` lacks."""
    protocol = registry.get(message.protocol)
    if protocol is None:
        raise ValueError(f"no protocol {message.protocol}")
    work = RefusalWork()
    if message.body is None:
        return 0
    if find_refusal_python(protocol, message.body, start_node(protocol, message.intent),
                           work) is not None:
        raise ValueError("the grammar refuses the message's body")
    return work.steps


def predict(coefficients: dict[str, float], counts: Counter[str]) -> float:
    return sum(coefficients.get(term, 0.0) * counts[term] for term in TERMS)


# --------------------------------------------------------------------------- the fit


def solve(matrix: list[list[float]], vector: list[float]) -> list[float]:
    """``x`` with ``matrix · x = vector`` (square), by Gaussian elimination with partial
    pivoting. Raises ``ZeroDivisionError`` when the matrix is singular."""
    n = len(vector)
    rows = [[*row, value] for row, value in zip(matrix, vector, strict=True)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(rows[r][col]))
        rows[col], rows[pivot] = rows[pivot], rows[col]
        if rows[col][col] == 0:
            raise ZeroDivisionError("singular: a term is never counted, or is another's copy")
        for r in range(n):
            if r != col:
                factor = rows[r][col] / rows[col][col]
                rows[r] = [x - factor * y for x, y in zip(rows[r], rows[col], strict=True)]
    return [rows[k][n] / rows[k][k] for k in range(n)]


def fit(rows: Sequence[tuple[Counter[str], float]], terms: Sequence[str] = tuple(TERMS),
        ) -> dict[str, float]:
    """The non-negative coefficients of ``terms`` that minimise the sum of squared relative
    errors over ``rows`` (mean counts of a set, its measured µs): the check judges
    relative errors, and in absolute terms the largest messages would decide everything.
    Lawson and Hanson's active-set method (a cost cannot be negative: where the plain
    least squares would make one so, its term is held at 0 and the others carry it); a
    term no row counts gets 0. Raises ``ZeroDivisionError`` when two terms are counted
    alike in every row (their shares cannot be told apart)."""
    names = [t for t in terms if any(counts[t] for counts, _ in rows)]
    a = [[counts[t] / measured for t in names] for counts, measured in rows]
    n = len(names)

    def gradient(x: list[float]) -> list[float]:  # Aᵀ(1 − Ax)
        residual = [1 - sum(r[j] * x[j] for j in range(n)) for r in a]
        return [sum(r[j] * e for r, e in zip(a, residual, strict=True)) for j in range(n)]

    def unconstrained(free: list[int]) -> list[float]:  # least squares over `free` only
        normal = [[sum(r[i] * r[j] for r in a) for j in free] for i in free]
        right = [sum(r[i] for r in a) for i in free]
        z = [0.0] * n
        for index, value in zip(free, solve(normal, right), strict=True):
            z[index] = value
        return z

    x = [0.0] * n
    free: list[int] = []
    for _ in range(10 * n + 10):
        w = gradient(x)
        candidates = [j for j in range(n) if j not in free and w[j] > 1e-12]
        if not candidates:
            break
        free.append(max(candidates, key=lambda j: w[j]))
        while True:
            z = unconstrained(free)
            if all(z[j] > 0 for j in free):
                x = z
                break
            # step from x towards z as far as every free term stays >= 0, and let go of
            # the terms that reach 0
            alpha = min(x[j] / (x[j] - z[j]) for j in free if z[j] <= 0)
            x = [x[j] + alpha * (z[j] - x[j]) for j in range(n)]
            free = [j for j in free if x[j] > 1e-15]
    found = dict(zip(names, x, strict=True))
    return {t: found.get(t, 0.0) for t in terms}


# --------------------------------------------------------------------------- the spec table


NOT_APPLICABLE = "–"


def _figure(value: float) -> str:
    """A coefficient in positional notation with three significant digits (µs)."""
    if value == 0:
        return "0"
    return f"{value:.{max(0, 2 - math.floor(math.log10(abs(value))))}f}"


def format_table(model: Model) -> str:
    """The spec's table: a row per term, a column per operation, µs each."""
    lines = ["| µs | " + " | ".join(OPERATIONS) + " |",
             "|---|" + "---:|" * len(OPERATIONS)]
    for term, label in TERMS.items():
        lines.append(f"| {label} | "
                     + " | ".join(_figure(model[op].get(term, 0.0))
                                  if term in OPERATION_TERMS[op] else NOT_APPLICABLE
                                  for op in OPERATIONS)
                     + " |")
    return "\n".join(lines)


def parse_table(text: str) -> Model:
    """The model in the table between :data:`BEGIN` and :data:`END` of ``text`` (the
    spec). Raises ``ValueError`` when they or a term's row are missing."""
    try:
        block = text[text.index(BEGIN) + len(BEGIN):text.index(END)]
    except ValueError:
        raise ValueError("the spec has no cost-model table between its markers") from None
    by_label = {label: term for term, label in TERMS.items()}
    model: Model = {op: {} for op in OPERATIONS}
    for line in block.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] in by_label:
            for op, cell in zip(OPERATIONS, cells[1:], strict=True):
                model[op][by_label[cells[0]]] = 0.0 if cell == NOT_APPLICABLE else float(cell)
    missing = [t for t in TERMS if t not in model[OPERATIONS[0]]]
    if missing:
        raise ValueError(f"the spec's cost-model table lacks {missing}")
    return model


def write_table(text: str, model: Model) -> str:
    """``text`` (the spec) with its table between the markers replaced by ``model``'s."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + "\n" + format_table(model) + "\n" + text[end:]


# --------------------------------------------------------------------------- the messages


def calibration_message(rng: random.Random, i: int, records: int, padding: int,
                        ) -> cbcl.Message:
    """A request/v1 result of ``records`` inventory records and ``padding`` bytes of
    long strings (few tokens for their bytes): the two vary apart."""
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


#: The atoms of :func:`kind_message`, by kind: ``make(rng, name)`` (``name`` gives a name).
KIND_ITEMS: dict[str, Callable[[random.Random, Callable[[], str]], Any]] = {
    "string": lambda rng, name: f"{name()} of {rng.randrange(10**6)} units",
    "integer": lambda rng, name: rng.randrange(-10**9, 10**12),
    "decimal": lambda rng, name: Decimal(f"{rng.randrange(10**7)}.{rng.randrange(10**3):03d}"),
    "symbol": lambda rng, name: Symbol(name()),
    "keyword": lambda rng, name: Keyword(name()),
    "uri": lambda rng, name: URI(f"agent://{name()}.example.net/inbox"),
    "list": lambda rng, name: (),
}


def kind_message(rng: random.Random, i: int, weights: dict[str, float], items: int,
                 name: Callable[[], str]) -> cbcl.Message:
    """A request/v1 result of ``items`` atoms (and empty lists) in random order, each of a
    kind drawn with ``weights`` (:data:`KIND_ITEMS`), names from ``name``: sets of
    different weights tell one kind's cost from another's. (Sets of one kind alone would
    not: a reader meeting the same kind over and over runs faster per atom than one
    meeting kinds in turn, as real messages make it.)"""
    kinds = rng.choices(list(weights), list(weights.values()), k=items)
    body = (Symbol("inform-result"), Keyword("action-id"), f"rq-{i}", Keyword("result"),
            (Symbol("batch"), *(KIND_ITEMS[kind](rng, name) for kind in kinds)))
    return cbcl.Message(message_id=f"m-{i}", sender=URI("agent://ops/a"),
                        receiver=URI("agent://ops/b"), intent="INFORM",
                        protocol=Symbol("request/v1"), body=body)


class Sample:
    """One message in every form an operation reads, and the terms of its text."""

    def __init__(self, message: cbcl.Message, text: bytes, frame: bytes, walked: int,
                 ) -> None:
        self.message, self.text, self.frame = message, text, frame
        self.terms = count_terms(text.decode())
        self.terms.counts["walked"] = walked

    def counts(self, operation: str) -> Counter[str]:
        """The counts for ``operation``: the frame's bytes for binary decode."""
        if operation != "binary decode":
            return self.terms.counts
        counts = Counter(self.terms.counts)
        counts["byte"] = len(self.frame)
        return counts


def samples_of(messages: list[cbcl.Message], encoder: cbcl.Encoder, registry: cbcl.Registry,
               texts: list[bytes] | None = None) -> list[Sample]:
    """The set's samples, their new names counted for the set (:func:`mark_new_names`).
    Given ``texts`` (the messages' texts with a rare atom, cliffs.py's), each sample is
    the message read from its text (so its frame carries the rare atom too)."""
    if texts is not None:
        messages = [cbcl.parse(text, registry=registry) for text in texts]
    else:
        texts = [cbcl.canonical(m).encode() for m in messages]
    samples = [Sample(m, t, encoder.encode(m), walked_tokens(registry, m))
               for m, t in zip(messages, texts, strict=True)]
    mark_new_names([s.terms for s in samples])
    mark_switches([shape_of(s.message) for s in samples], [s.terms for s in samples])
    return samples


def mean_counts(samples: Sequence[Sample], operation: str) -> Counter[str]:
    total: Counter[str] = Counter()
    for sample in samples:
        total.update(sample.counts(operation))
    return Counter({term: total[term] / len(samples) for term in TERMS})


def operations(registry: cbcl.Registry) -> dict[str, Callable[[Sample], object]]:
    decoder = cbcl.Decoder(registry)
    return {
        "text parse": lambda s: cbcl.parse(s.text, registry=registry),
        "text read": lambda s: cbcl.read(s.text),
        "binary decode": lambda s: decoder.decode(s.frame),
    }


def time_sets(jobs: list[tuple[list[Sample], Callable[[Sample], object]]], rounds: int,
              ) -> list[float]:
    """Mean µs of CPU time per message of each ``(set, function)`` job: the best of
    ``rounds`` passes over its set, the rounds interleaved (a round passes over every
    job), so that a burst of load on a shared machine spoils one round of every job, not
    every round of one. Each timed pass follows an untimed pass over the same set, so
    that it meets the caches, memos and intern tables its own set leaves (the steady
    state of a stream of such messages), not what the set before it left: without it, a
    short set paid ~1–2 µs a message more than a long one of the same messages. CPU time
    of this thread (``time.thread_time``), so that time spent waiting for a core another
    process holds is not counted; the cyclic garbage collector off (as ``timeit`` does),
    so that no set pays for the objects the others hold."""
    for samples, function in jobs:
        for sample in samples:
            function(sample)
    best = [float("inf")] * len(jobs)
    clock = time.thread_time
    gc.collect()
    gc.disable()  # as timeit: a collection's cost is the live heap's, not the message's
    try:
        for _ in range(rounds):
            for index, (samples, function) in enumerate(jobs):
                for sample in samples:  # (untimed: the set's own state, not the last set's)
                    function(sample)
                start = clock()
                for sample in samples:
                    function(sample)
                best[index] = min(best[index], (clock() - start) / len(samples))
    finally:
        gc.enable()
    return [value * 1e6 for value in best]


def fit_sets(encoder: cbcl.Encoder, registry: cbcl.Registry) -> dict[str, list[Sample]]:
    """The fit's sets: compositions that vary the terms apart (none is a check set)."""
    rng = random.Random(11)
    sets: dict[str, list[Sample]] = {}
    for records in (1, 3, 8, 21, 40):
        for padding in (0, 1500, 6000):
            sets[f"request/v1 {records} records + {padding} B"] = samples_of(
                [calibration_message(rng, i, records, padding) for i in range(60)], encoder,
                registry)
    sets["long strings"] = samples_of([long_strings_message(rng, i) for i in range(100)],
                                      encoder, registry)
    # atoms of every kind in random order, the kinds' shares drawn for each set (so
    # that the sets vary them apart), in a value the grammar takes whole; names recurring
    # (a pool of 50) or never seen (sets of more names than the process keeps)
    for index in range(12):
        weights = {kind: rng.random() ** 2 for kind in KIND_ITEMS}
        items = (40, 300)[index % 2]
        pool = Vocabulary(rng, recurring=50, fresh=0.0)
        sets[f"mixture {index}, {items} atoms"] = samples_of(
            [kind_message(rng, i, weights, items, pool.name) for i in range(60)], encoder,
            registry)
        fresh = Vocabulary(rng, recurring=0, fresh=1.0)
        sets[f"mixture {index}, {items} atoms, new names"] = samples_of(
            [kind_message(rng, i, weights, items, fresh.name)
             for i in range(max(60, 3 * MEMO_SLOTS // items))], encoder, registry)
    for protocol in PROTOCOLS:
        for size_class in ("small", "medium"):
            sets[f"{protocol} {size_class}"] = samples_of(
                varied(protocol, size_class, 100, seed=29), encoder, registry)
    for size_class, make in (("small", cliffs.small_message),
                             ("medium", cliffs.medium_message)):
        made = random.Random(31)
        messages = [make(made, 1000 + i) for i in range(100)]
        for seed, variant in enumerate(cliffs.VARIANTS):
            if variant in ("19-digit integer", "30-digit decimal", "non-ASCII string"):
                sets[f"cliffs {size_class}/{variant}"] = samples_of(
                    messages, encoder, registry,
                    cliffs.variant_texts(messages, variant, seed, registry))
    # the mixed rows (every atom kind, names of an agents' vocabulary), their names
    # recurring (fresh 0: a few hundred, always held) or mostly never seen (fresh 0.8, in
    # sets holding more names than the process keeps)
    for rows, count in ((0, 200), (1, 200), (4, 100), (13, 100), (50, 30), (210, 10)):
        sets[f"mixed {rows} rows, recurring"] = samples_of(
            mixed_messages_of(rows, count, "fit", fresh=0.0), encoder, registry)
    for rows, count in ((4, 1000), (13, 400), (50, 100), (210, 24)):
        sets[f"mixed {rows} rows, new names"] = samples_of(
            mixed_messages_of(rows, count, "fit"), encoder, registry)
    sets["mixed 13 rows any order, new names"] = samples_of(
        mixed_messages_of(13, 400, "fit", any_order=True), encoder, registry)
    return sets


def check_sets(encoder: cbcl.Encoder, registry: cbcl.Registry, messages: int,
               ) -> dict[str, list[Sample]]:
    """The check's sets: cliffs.py's (seed 19), long strings and the mixed size classes."""
    sets: dict[str, list[Sample]] = {}
    for size_class, make in (("small", cliffs.small_message),
                             ("medium", cliffs.medium_message)):
        rng = random.Random(19)
        built = [make(rng, i) for i in range(messages)]
        for seed, variant in enumerate(cliffs.VARIANTS):
            if variant in ("plain", "escaped quote", "19-digit integer", "comment"):
                texts = cliffs.variant_texts(built, variant, seed, registry)
                sets[f"{size_class}/{variant}"] = samples_of(built, encoder, registry, texts)
    rng = random.Random(23)
    sets["long strings"] = samples_of([long_strings_message(rng, i) for i in range(300)],
                                      encoder, registry)
    for size_class, count in (("mixed-4k", 300), ("mixed-64k", 30),
                              ("mixed-4k-any-order", 300)):
        sets[size_class] = samples_of(mixed_messages(size_class, count, "check"), encoder,
                                      registry)
    sets["mixed-4k, recurring names"] = samples_of(
        mixed_messages("mixed-4k", 300, "check", fresh=0.0), encoder, registry)
    return sets


def callgrind_child(path: Path) -> None:
    """Under callgrind (:func:`fit_instructions`): each operation over each set of the
    pickle at ``path``, an untimed pass then one through ``functools.reduce``, the only
    call callgrind counts (and dumps after)."""
    registry = load_registry(find_descriptors())
    decoder = cbcl.Decoder(registry)
    sets: dict[str, tuple[list[bytes], list[bytes]]] = pickle.loads(path.read_bytes())
    calls: dict[str, Callable[[bytes], object]] = {
        "text parse": lambda text: cbcl.parse(text, registry=registry),
        "text read": cbcl.read, "binary decode": decoder.decode}
    for op in OPERATIONS:
        for texts, frames in sets.values():
            inputs = frames if op == "binary decode" else texts
            for data in inputs:
                calls[op](data)
            functools.reduce(lambda _, data: calls[op](data), inputs, None)


def fit_instructions(groups: dict[str, list[Sample]], messages: int) -> int:
    """Fit the terms to instructions per message (callgrind; deterministic, so the fit
    shows the terms' shape without the noise of a shared machine, but not what a cache
    miss or an allocation costs in time). Prints the table; returns 0."""
    truncated = {}
    for name, group in groups.items():
        samples = [copy.copy(s) for s in group[:messages]]
        for sample in samples:
            sample.terms = copy.deepcopy(sample.terms)
        mark_new_names([s.terms for s in samples])
        mark_switches([shape_of(s.message) for s in samples], [s.terms for s in samples])
        truncated[name] = samples
    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder) / "sets.pickle"
        data.write_bytes(pickle.dumps({name: ([s.text for s in g], [s.frame for s in g])
                                       for name, g in truncated.items()}))
        subprocess.run(["valgrind", "--tool=callgrind", "--collect-atstart=no",
                        "--toggle-collect=functools_reduce", "--dump-after=functools_reduce",
                        f"--callgrind-out-file={folder}/cg.out", sys.executable, __file__,
                        "--callgrind-child", str(data)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       env={**os.environ, "PYTHONHASHSEED": "0"})
        counts = atom_instructions._dump_counts(Path(folder))
    jobs = [(op, name) for op in OPERATIONS for name in truncated]
    if len(counts) != len(jobs):
        raise SystemExit(f"{len(counts)} callgrind dumps for {len(jobs)} passes")
    model: Model = {}
    for op in OPERATIONS:
        rows = [(mean_counts(truncated[name], op), count / len(truncated[name]))
                for (o, name), count in zip(jobs, counts, strict=True) if o == op]
        model[op] = coefficients = fit(rows, OPERATION_TERMS[op])
        errors = [predict(coefficients, c) / n - 1 for c, n in rows]
        print(f"fit {op} (instructions): median |error| "
              f"{statistics.median(map(abs, errors)):.1%}, worst {max(errors, key=abs):+.1%} "
              f"over {len(rows)} sets")
    print("\n" + format_table(model).replace("| µs |", "| instructions |") + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fit", action="store_true", help="measure the coefficients")
    parser.add_argument("--write", action="store_true",
                        help="with --fit: write the fitted table into the spec")
    parser.add_argument("--relative", action="store_true",
                        help="scale the model by this machine's factor before checking")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--verbose", action="store_true", help="print the fit's sets too")
    parser.add_argument("--messages", type=int, default=300,
                        help="messages in each of cliffs.py's check sets")
    parser.add_argument("--instructions", type=int, metavar="N", default=0,
                        help="instead, fit the terms to callgrind's instruction counts "
                        "(the fit's sets, N messages of each): the terms' shape, noise-free")
    parser.add_argument("--callgrind-child", metavar="FILE", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.callgrind_child:
        callgrind_child(Path(args.callgrind_child))
        return 0
    installed.check()  # the installed cbcl, with its C extension
    registry = load_registry(find_descriptors())
    encoder = cbcl.Encoder(registry, validate=False)
    ops = operations(registry)
    if args.instructions:
        return fit_instructions(fit_sets(encoder, registry), args.instructions)
    # The fit's sets and the check's are timed together, in the same rounds, with or
    # without --fit: what a set costs depends a little on what the process read just
    # before (caches, the allocator), so the check's sets meet the fit's conditions.
    groups = fit_sets(encoder, registry)
    checked = check_sets(encoder, registry, args.messages)
    sets = {**{f"fit: {name}": g for name, g in groups.items()}, **checked}
    jobs = [(set_name, op) for op in OPERATIONS for set_name in sets
            # (a comment has no binary form: that set's frames are the plain set's)
            if not (op == "binary decode" and set_name.endswith("/comment"))]
    measured = dict(zip(jobs, time_sets([(sets[name], ops[op]) for name, op in jobs],
                                        args.rounds), strict=True))
    if args.fit:
        model: Model = {}
        for op in OPERATIONS:
            rows = [(mean_counts(g, op), measured[f"fit: {name}", op])
                    for name, g in groups.items()]
            model[op] = coefficients = fit(rows, OPERATION_TERMS[op])
            errors = [predict(coefficients, counts) / time - 1 for counts, time in rows]
            print(f"fit {op}: median |error| {statistics.median(map(abs, errors)):.1%}, "
                  f"worst {max(errors, key=abs):+.1%} over {len(rows)} sets")
        print("\n" + format_table(model) + "\n")
        if args.write:
            SPEC.write_text(write_table(SPEC.read_text(), model))
            print(f"written to {SPEC}")
    else:
        model = parse_table(SPEC.read_text())
    results = [(name, op, measured[name, op],
                predict(model[op], mean_counts(sets[name], op))) for name, op in jobs]
    results.sort(key=lambda r: (list(sets).index(r[0]), OPERATIONS.index(r[1])))
    judged = [r for r in results if not r[0].startswith("fit: ")]
    factor = statistics.median(m / p for _, _, m, p in judged) if args.relative else 1.0
    worst = 0.0
    print(f"\nmachine factor {factor:.3f}; tolerance ±{TOLERANCE:.0%} (the sets the fit did "
          "not see" + ("; the fit's own sets below them, not judged)" if args.verbose else ")"))
    print("| set | operation | bytes | new names | walked | measured µs | predicted µs | "
          "error |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for set_name, op, time_, predicted in judged + (
            [r for r in results if r[0].startswith("fit: ")] if args.verbose else []):
        counts = mean_counts(sets[set_name], op)
        error = time_ / (predicted * factor) - 1
        if not set_name.startswith("fit: "):
            worst = max(worst, abs(error))
        new_names = sum(counts[f"new {kind}"] for kind in _NAME_KINDS)
        print(f"| {set_name} | {op} | {counts['byte']:.0f} | {new_names:.0f} | "
              f"{counts['walked']:.0f} | {time_:.1f} | {predicted * factor:.1f} | "
              f"{error:+.1%} |")
    print(f"\nworst error {worst:.1%} (tolerance ±{TOLERANCE:.0%})")
    return 1 if worst > TOLERANCE else 0


if __name__ == "__main__":
    sys.exit(main())
