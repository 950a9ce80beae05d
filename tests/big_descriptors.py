"""Descriptors that make the analyses of a descriptor work hard: a generator of large
schema-heavy descriptors (thousands of numeric bounds and one-of values), deep grammars
and deep schemas. Deterministic; used by tests/test_analysis_budgets.py and
benchmarks/analysis_budgets.py."""

from __future__ import annotations

import random

from cbcl.core._canonical import quote

#: The kinds of value a generated record's field takes, in turn.
_FIELD_KINDS = ("integer", "decimal", "number", "one-of-int", "one-of-symbol")


def descriptor_text(grammar: str, schema: str = "", *, ident: str = "big/v1",
                    version: int = 1, intents: str = "REQUEST") -> bytes:
    """A descriptor (spec §3) with ``grammar`` and, if given, the ``(schema …)`` text."""
    section = f" {schema}" if schema else ""
    return (f"(protocol-descriptor (id {ident}) (version {version}) (intents {intents}) "
            f"(grammar {quote(grammar)}){section})").encode()


def _bounds(rng: random.Random, kind: str, widen: int) -> tuple[str, str]:
    low = rng.randrange(-10**12, 10**12)
    high = low + rng.randrange(1, 10**9)
    if kind == "integer":
        return str(low - widen), str(high + widen)
    return f"{low - widen}.{rng.randrange(10, 99)}", f"{high + widen}.{rng.randrange(10, 99)}"


def bounds_descriptor(records: int = 128, fields: int = 14, values: int = 8, *,
                      version: int = 1, widen: int = 0, extra_value: bool = False,
                      narrow_last: bool = False, seed: int = 29) -> bytes:
    """A descriptor whose schema holds about ``records × fields × 2`` numeric bounds and as
    many one-of values: ``body`` chooses among ``records`` lists ``(hI :f0 X :f1 Y …)``
    whose keys come in a fixed order (the last one optional), each field an integer,
    decimal or number range or a one-of of ``values`` integers or symbols.

    ``widen`` widens every range by that much, ``extra_value`` adds a value to every
    one-of (both keep every body accepted: a backward-compatible NEW), ``narrow_last``
    narrows the last record's first range by one (breaking). 120 × 12 × 9 is a
    descriptor of about 150 KB with about 2,300 numeric bounds and 3,900 one-of values."""
    rng = random.Random(seed)
    terminals = {"integer": "INTEGER", "decimal": "DECIMAL", "number": "NUMBER",
                 "one-of-int": "INTEGER", "one-of-symbol": "SYMBOL"}
    rules = ["body: " + " | ".join(f"r{i}" for i in range(records))]
    schema = []
    for i in range(records):
        items: list[str] = []
        types: list[str] = []
        for j in range(fields):
            kind = _FIELD_KINDS[(i + j) % len(_FIELD_KINDS)]
            item = f'":f{j}" {terminals[kind]}'
            items.append(f"[{item}]" if j == fields - 1 else item)
            if kind.startswith("one-of"):
                if kind == "one-of-int":
                    chosen = sorted(rng.sample(range(-10**6, 10**6), values))
                    shown = [str(v) for v in chosen]
                    if extra_value:
                        shown.append(str(10**6 + i))
                else:
                    shown = [f"s{i}x{j}v{k}" for k in range(values)]
                    if extra_value:
                        shown.append(f"s{i}x{j}new")
                types.append(f"(:f{j} (one-of {' '.join(shown)}))")
            else:
                low, high = _bounds(rng, kind, widen)
                if narrow_last and i == records - 1 and j == 0:
                    high = str(int(high.split(".")[0]) - 1)
                types.append(f"(:f{j} ({kind} :min {low} :max {high}) required)")
        rules.append(f'r{i}: "(" "h{i}" {" ".join(items)} ")"')
        schema.append(f"(record h{i} {' '.join(types)})")
    return descriptor_text("\n".join(rules) + "\n", "(schema " + " ".join(schema) + ")",
                           version=version)


def bounds_pair(breaking: bool = False) -> tuple[bytes, bytes]:
    """The ~150 KB pair of issue 29: OLD, and NEW with every range widened and a value
    added to every one-of (backward compatible), or with the last record's first range
    narrowed (``breaking``)."""
    old = bounds_descriptor()
    if breaking:
        return old, bounds_descriptor(version=2, narrow_last=True)
    return old, bounds_descriptor(version=2, widen=1, extra_value=True)


def bounds_times_one_of(bounds: int = 2_000, values: int = 2_000, *, version: int = 1,
                        ident: str = "big/v1") -> bytes:
    """Issue 36's quadratic case: one field whose schema has ``bounds`` ranges (a record
    per range) and a one-of of ``values`` integers and decimals, all in the same span,
    so that every region between two bounds holds named values."""
    grammar = 'body: "(" SYMBOL ":x" NUMBER ":y" NUMBER ")"\n'
    records = []
    for i in range(bounds // 2):
        records.append(f"(record h{i} (:x (number :min {2 * i} :max {2 * i + 1}.5)) "
                       f"(:y (integer :min {-2 * i - 1} :max {2 * i + 1})))")
    ints = " ".join(str(k) for k in range(values // 2))
    decimals = " ".join(f"{k}.5" for k in range(values // 2))
    records.append(f"(record all (:x (one-of {ints} {decimals})) (:y (one-of {ints})))")
    return descriptor_text(grammar, "(schema " + " ".join(records) + ")", version=version,
                           ident=ident)


def chain_grammar(rules: int = 250, *, repeat: bool = False) -> str:
    """A grammar of ``rules`` rules, each referring to the next: ``body`` derives
    ``(a x0 x1 … end)`` through a chain ``rules`` deep (with ``repeat``, each ``xI`` any
    number of times: lists a JSON Schema can only approximate)."""
    star = "*" if repeat else ""
    lines = ['body: "(" "a" r0 ")"']
    lines += [f'r{i}: "x{i}"{star} r{i + 1}' for i in range(rules - 2)]
    lines.append(f'r{rules - 2}: "end"')
    return "\n".join(lines) + "\n"


def group_grammar(depth: int) -> str:
    """A rule whose groups nest ``depth`` deep, referring to itself in last position (a
    right-linear rule the analysis takes apart level by level)."""
    inner = "tail"
    for level in range(depth):
        inner = f'["g{level}" {inner}]' if level % 2 else f'("g{level}" {inner} | "h{level}")'
    return f'body: "(" "a" tail ")"\ntail: "t" {inner}\n'


def subsets_descriptor(records: int, fields: int, *, version: int = 1,
                       ident: str = "big/v1") -> bytes:
    """Records of ``fields`` optional integer fields under a grammar that takes keys in
    any order (``(KEYWORD value)*``): the schema's automaton has a state per subset of the
    keys given, 2^fields for each record, so no comparison of two of them ends within the
    default budgets."""
    grammar = 'body: "(" SYMBOL (KEYWORD value)* ")"\n'
    schema = " ".join(
        f"(record h{i} " + " ".join(f"(:f{j} (integer :min {j} :max {7 * j + i}))"
                                    for j in range(fields)) + ")" for i in range(records))
    return descriptor_text(grammar, f"(schema {schema})", version=version, ident=ident)


def keyword_sets_descriptor(sets: int, members: int = 8) -> bytes:
    """``sets`` rules, each a list with a keyword set of ``members`` members: an export
    makes 2^members states for each."""
    rules = ["body: " + " | ".join(f"s{i}" for i in range(sets))]
    for i in range(sets):
        inner = " & ".join(f'":k{j}" INTEGER' for j in range(members))
        rules.append(f's{i}: "(" "h{i}" ({inner}) ")"')
    return descriptor_text("\n".join(rules) + "\n")


def nested_schema(depth: int, kind: str = "keys") -> str:
    """A ``(schema …)`` whose record's types nest ``depth`` deep as the schema compiler
    counts (the record 1, its field's type 2, …, an ``integer`` at ``depth``): ``keys``
    types (``kind="keys"``; two lists each, so 32 is also the descriptor's depth limit
    of 64) or ``list-of`` types (``kind="list"``)."""
    inner = "integer"
    for _ in range(depth - 2):
        inner = f"(keys (:k {inner} required))" if kind == "keys" else f"(list-of {inner})"
    return f"(schema (record n (:k {inner} required)))"


def nested_grammar(depth: int, kind: str = "keys") -> str:
    """The bodies :func:`nested_schema` describes: ``(n :k (:k (:k … 7)))`` (``keys``) or
    ``(n :k ((… (7) …)))`` (``list``), lists ``depth - 1`` deep."""
    lines = ['body: "(" "n" ":k" v2 ")"']
    for level in range(2, depth):
        inner = f"v{level + 1}" if level + 1 < depth else "INTEGER"
        lines.append(f'v{level}: "(" ":k" {inner} ")"' if kind == "keys"
                     else f'v{level}: "(" {inner}* ")"')
    if depth == 2:
        lines.append("v2: INTEGER")
    return "\n".join(lines) + "\n"
