"""Bounds enforced where the work is (issue 29, spec §3.5 and §4.4): the size of a compiled
grammar is checked by the analyser while it builds the LALR automaton (in the compile
worker, or in this process), so an oversized grammar comes back as a verdict of a few
bytes and lark never builds its tables; the worker's request is written whole whatever
its size, and its reply is read up to a bound.

Tests internals: the guard's exchange with its worker and the analyser's size callback are
private. The grammars that make large tables are built here (:func:`literal_grammar`,
:func:`wide_grammar`)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import resource
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

import cbcl
from cbcl.core._canonical import quote
from cbcl.descriptor import GrammarCache
from cbcl.grammar import _compile
from cbcl.grammar._compile import (
    DEFAULT_MAX_TABLE_BYTES,
    TablesTooLarge,
    compile_grammar,
    compile_guarded,
    compiled_size,
    to_data,
)
from cbcl.grammar._lalr import table_bytes
from cbcl.grammar._lr import LALR1, analyse
from cbcl.grammar._subset import GrammarLimits, read_grammar, to_cfg

ROOT = Path(__file__).parent.parent
SHIPPED = sorted((ROOT / "descriptors").glob("*-v1.cbcl"))
HUGE = 1 << 40  # a limit nothing here reaches


# --------------------------------------------------------------------------- grammars


def literal_grammar(literals: int, seed: int = 0) -> str:
    """``body: item*`` with ``item`` one of ``literals`` distinct literals: each literal's
    state reduces on every literal (and the end), so the table has about ``literals²``
    entries (~50 × literals² bytes: 1,220 literals make the red team's ~75 MB) from a text
    of ~9 bytes a literal. The analyser knows the size once its lookaheads are found."""
    alternatives = " | ".join(f'"s{seed}w{i}"' for i in range(literals))
    return f"body: item*\nitem: {alternatives}\n"


def wide_grammar(literals: int, width: int, seed: int = 0) -> str:
    """``body: "k" x x … x`` (``width`` times) with ``x`` one of ``literals`` literals:
    ``width`` states that each shift every literal, so the LR(0) automaton alone passes a
    limit (the analyser stops while building it, with states still to find)."""
    alternatives = " | ".join(f'"s{seed}a{i}"' for i in range(literals))
    return f'body: "k" {" ".join(["x"] * width)}\nx: {alternatives}\n'


def descriptor(grammar: str, ident: str) -> bytes:
    return (f"(protocol-descriptor (id {ident}) (version 1) (intents INFORM) "
            f"(grammar {quote(grammar)}))").encode()


def full_lalr_states(text: str) -> int:
    return analyse(to_cfg(read_grammar(text))).lalr_states


@contextlib.contextmanager
def counting_lark_builds() -> Iterator[list[str]]:
    """The grammar texts lark is asked to build tables for, while inside."""
    built: list[str] = []
    real = _compile._build_lark

    def spy(text: str, start: str) -> Any:
        built.append(text)
        return real(text, start)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_compile, "_build_lark", spy)
        yield built


@contextlib.contextmanager
def worker_replies() -> Iterator[list[bytes]]:
    """The replies read from compile workers, while inside."""
    replies: list[bytes] = []
    real = _compile._exchange

    def spy(request: bytes, **options: Any) -> tuple[int, bytes, bytes]:
        status, out, err = real(request, **options)
        replies.append(out)
        return status, out, err

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_compile, "_exchange", spy)
        yield replies


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# --------------------------------------------------------------------------- one measure


def _shipped_grammars() -> list[tuple[str, tuple[str, ...]]]:
    found = []
    for path in SHIPPED:
        read = cbcl.descriptor.read_descriptor(path.read_bytes())
        found.append((read.grammar, read.start_rules))
    return found


CORPUS = [*_shipped_grammars(),
          (literal_grammar(30), ("body",)), (wide_grammar(12, 20), ("body",)),
          ('body: (":a" STRING & [":b" INTEGER] & [":c" value])\n', ("body",)),
          ("one: SYMBOL+\ntwo: INTEGER one? | STRING two\n", ("one", "two"))]


@pytest.mark.parametrize(("grammar", "starts"), CORPUS)
def test_the_limit_accepts_the_exact_size_and_refuses_one_byte_less(
        grammar: str, starts: tuple[str, ...]) -> None:
    compiled = compile_grammar(grammar, starts=starts, max_table_bytes=HUGE)
    assert compiled.verdict == LALR1
    size = compiled_size(compiled)
    assert compile_grammar(grammar, starts=starts, max_table_bytes=size).verdict == LALR1
    with counting_lark_builds() as built, pytest.raises(TablesTooLarge) as refused:
        compile_grammar(grammar, starts=starts, max_table_bytes=size - 1)
    # The analyser's count is the built tables' measure, to the byte, and it refused
    # before lark was asked for anything.
    assert (refused.value.size, refused.value.limit, refused.value.exact) == \
        (size, size - 1, True)
    assert built == []
    assert str(refused.value) == (f"the compiled grammar would take about {size} bytes; "
                                  f"the limit is {size - 1}")


@st.composite
def grammars(draw: st.DrawFn) -> str:
    """Small grammars of the subset: literals, base terminals, references to later rules,
    groups, options and repeats (not all LALR(1))."""
    names = ["body"] + [f"r{k}" for k in range(draw(st.integers(0, 3)))]
    atoms = ['"a"', '"b"', '":k"', '"("', '")"', "SYMBOL", "STRING", "INTEGER"]
    lines = []
    for index, name in enumerate(names):
        later = names[index + 1:]
        item = st.sampled_from(atoms + later)
        shaped = st.one_of(item, st.tuples(item, st.sampled_from("?*+")).map("".join),
                           st.lists(item, min_size=1, max_size=3).map(
                               lambda items: "(" + " ".join(items) + ")*"))
        alternatives = [" ".join(draw(st.lists(shaped, min_size=1, max_size=4)))
                        for _ in range(draw(st.integers(1, 3)))]
        alternatives.append('"end"' if not later else " ".join(later))  # productive, reached
        lines.append(f"{name}: " + " | ".join(alternatives))
    return "\n".join(lines) + "\n"


@settings(max_examples=60, deadline=None)
@given(grammars())
def test_the_analysers_estimate_is_the_built_tables_size(grammar: str) -> None:
    try:
        compiled = compile_grammar(grammar, max_table_bytes=HUGE)
    except cbcl.GrammarError:
        return  # refused for another reason (lark's "rules defined twice", say)
    if compiled.verdict != LALR1:
        return
    size = compiled_size(compiled)
    with pytest.raises(TablesTooLarge) as refused:
        compile_grammar(grammar, max_table_bytes=size - 1)
    assert refused.value.exact and refused.value.size == size


def test_compiled_size_counts_the_tables_by_the_one_formula() -> None:
    compiled = compile_grammar(literal_grammar(5))
    tables = compiled.tables
    assert tables is not None
    expected = 1024 + len(LALR1) + 100 * len(compiled.literals) + table_bytes(
        len(tables.actions), sum(len(row) for row in tables.actions), len(tables.rules))
    assert compiled_size(compiled) == expected
    assert table_bytes(2, 3, 4) == 2 * 120 + 3 * 50 + 4 * 120


# --------------------------------------------------------------------------- refused early


def test_the_analyser_stops_while_the_automaton_grows() -> None:
    text = wide_grammar(100, 300)
    limit = 200_000
    with counting_lark_builds() as built, pytest.raises(TablesTooLarge) as refused:
        compile_grammar(text, max_table_bytes=limit)
    error = refused.value
    assert not error.exact and error.limit == limit and built == []
    # It stopped with most of the automaton still to build, just past the limit: a state
    # here costs 120 bytes and its ~101 shifts 50 each.
    assert error.states < full_lalr_states(text) // 2
    assert limit < error.size <= limit + 120 + 50 * 102 + 120 * 100
    assert "would take at least" in str(error) and f"{error.states} states" in str(error)


def test_the_worker_refuses_an_oversized_grammar_with_a_verdict_of_a_few_bytes() -> None:
    grammar = literal_grammar(1220)  # the red team's ~75 MB tables, from 11 KB of text
    tracemalloc.start()
    try:
        with worker_replies() as replies, pytest.raises(TablesTooLarge) as refused:
            compile_guarded(grammar)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    error = refused.value
    assert error.exact and error.measure == "tables" and error.verdict == "rejected"
    assert error.size > 70_000_000 and error.limit == DEFAULT_MAX_TABLE_BYTES
    assert error.states == full_lalr_states(grammar)
    assert str(error) == (f"the compiled grammar would take about {error.size} bytes; the "
                          f"limit is {DEFAULT_MAX_TABLE_BYTES}")
    (reply,) = replies
    assert len(reply) < 256 and json.loads(reply)["oversized"]["size"] == error.size
    assert peak < 1 << 20  # the parent never held the tables (before: hundreds of MB)


def test_the_in_process_compile_refuses_the_same_way() -> None:
    grammar = literal_grammar(1220)
    with counting_lark_builds() as built, pytest.raises(TablesTooLarge) as refused:
        compile_grammar(grammar)
    assert built == []
    assert refused.value.exact and refused.value.size > 70_000_000
    registry = cbcl.Registry(disk_cache=False, isolate=False, grammar_cache=GrammarCache())
    with pytest.raises(TablesTooLarge, match=f"about {refused.value.size} bytes; the limit "
                       f"is {DEFAULT_MAX_TABLE_BYTES}"):
        registry.compiled(grammar)


def test_a_reply_over_the_limit_is_refused_by_the_worker() -> None:
    # Rule names of 500 characters in every goto: the JSON reply (~17 KB; its length varies
    # by a few bytes with lark's numbering of states) is larger than the compiled grammar's
    # measure (~11 KB), and is bounded by the same limit.
    name = "n" * 500
    grammar = f'body: {" ".join([name] * 30)}\n{name}: "x" | "y"\n'
    compiled = compile_grammar(grammar)
    size = compiled_size(compiled)
    reply = len(json.dumps({"ok": to_data(compiled)}, separators=(",", ":")))
    assert size * 3 // 2 < reply
    assert compile_guarded(grammar, max_table_bytes=reply + 1000).verdict == LALR1
    limit = (size + reply) // 2  # the tables fit, the reply does not
    with worker_replies() as replies, pytest.raises(TablesTooLarge) as refused:
        compile_guarded(grammar, max_table_bytes=limit)
    error = refused.value
    assert error.measure == "reply" and abs(error.size - reply) < 1000
    assert str(error) == (f"the compiled grammar's reply would take {error.size} bytes; "
                          f"the limit is {limit}")
    assert len(replies[0]) < 256


def test_the_parent_reads_a_reply_up_to_its_bound_and_kills_a_worker_past_it() -> None:
    request = _compile._request("body: SYMBOL\n", None, starts=("body",), timeout=20,
                                memory=_compile.DEFAULT_MEMORY,
                                max_table_bytes=DEFAULT_MAX_TABLE_BYTES)

    def exchange(max_reply: int) -> bytes:
        status, out, _ = _compile._exchange(request, deadline=time.monotonic() + 60,
                                            timeout=20, cancelled=None, max_reply=max_reply)
        assert status == 0
        return out

    size = len(exchange(HUGE))  # a few states: the same length in every worker
    assert len(exchange(size)) == size
    with pytest.raises(cbcl.GrammarError, match=f"reply is over {size - 1} bytes"):
        exchange(size - 1)
    # compile_guarded reads up to the limit and a margin (``REPLY_SLACK_BYTES``) for a verdict
    # or an error, so even a tiny limit gets its verdict, not a killed worker.
    with pytest.raises(TablesTooLarge, match=r"the limit is 1$"):
        compile_guarded("body: SYMBOL\n", max_table_bytes=1)


# --------------------------------------------------------------------------- a registry


def _registry(tmp_path: Path, **options: Any) -> cbcl.Registry:
    return cbcl.Registry(disk_cache=False, state_dir=tmp_path / "state",
                         grammar_cache=GrammarCache(), **options)


@pytest.mark.slow
def test_ten_oversized_offers_cost_the_server_little_and_change_nothing(
        tmp_path: Path) -> None:
    registry = _registry(tmp_path)
    cache = registry.grammar_cache
    good = (ROOT / "descriptors" / "contract-net-v1.cbcl").read_bytes()
    before_cpu = children_cpu()
    tracemalloc.start()
    try:
        with worker_replies() as replies:
            for seed in range(10):
                with pytest.raises(TablesTooLarge, match=f"the limit is "
                                   f"{DEFAULT_MAX_TABLE_BYTES}$"):
                    registry.prepare(descriptor(literal_grammar(1220, seed), f"big-{seed}/v1"),
                                     allow_unsigned=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Ten verdicts of a few bytes each, a parent that held none of the tables, and workers
    # that stopped at the analyser (about 0.3 s of CPU each; the target is 2 s).
    assert len(replies) == 10 and all(len(reply) < 256 for reply in replies)
    assert peak < 4 << 20
    assert children_cpu() - before_cpu < 10 * 2.0
    # Nothing recorded or installed; the sizes remembered, not as verdicts.
    assert len(registry) == 0 and registry.state is not None
    assert all(registry.state.get(f"big-{seed}/v1") is None for seed in range(10))
    assert len(cache.compiled) == 0 and len(cache.refused) == 0
    assert len(cache.oversized) == 10
    # A good grammar still compiles, in a worker, and loads.
    assert registry.load(good, allow_unsigned=True).descriptor.version == 2
    assert len(registry) == 1 and len(cache.compiled) == 1


def test_a_size_refusal_is_this_registrys_limit_not_a_verdict(tmp_path: Path) -> None:
    grammar = literal_grammar(60)
    size = compiled_size(compile_grammar(grammar))
    cache = GrammarCache()
    small = cbcl.Registry(disk_cache=False, grammar_cache=cache, max_compiled_bytes=size - 1)
    with worker_replies() as replies:
        with pytest.raises(TablesTooLarge, match=f"about {size} bytes; the limit is "
                           f"{size - 1}$"):
            small.compiled(grammar)
        with pytest.raises(TablesTooLarge, match=f"about {size} bytes"):
            small.compiled(grammar)  # remembered: refused again without a worker
        assert len(replies) == 1
        # A registry whose limit admits it compiles it (the refusal was no verdict) …
        exact = cbcl.Registry(disk_cache=False, grammar_cache=cache, max_compiled_bytes=size)
        assert exact.compiled(grammar).verdict == LALR1
        assert len(replies) == 2
    # … and the smaller registry still refuses the grammar it now finds in the cache.
    with pytest.raises(TablesTooLarge, match=f"the limit is {size - 1}$"):
        small.compiled(grammar)


# --------------------------------------------------------------------------- the pipe


def pipe_buffer_bytes() -> int:
    """The capacity of a pipe on this system (Linux tells; 64 KiB elsewhere)."""
    read, write = os.pipe()
    try:
        return fcntl.fcntl(write, fcntl.F_GETPIPE_SZ) if hasattr(fcntl, "F_GETPIPE_SZ") \
            else 65_536
    finally:
        os.close(read)
        os.close(write)


def grammar_with_request_of(target: int) -> tuple[str, GrammarLimits]:
    """A grammar whose request to the worker is exactly ``target`` bytes: emoji in a
    comment (12 bytes of JSON each), then ASCII to make up the rest; with the limits that
    admit its text."""
    head = "body: SYMBOL\n// "
    limits = GrammarLimits(max_text_bytes=max(32_768, target))

    def request(text: str) -> int:
        return len(_compile._request(text, limits, starts=("body",), timeout=20,
                                     memory=_compile.DEFAULT_MEMORY,
                                     max_table_bytes=DEFAULT_MAX_TABLE_BYTES))

    emoji = max(0, (target - request(head)) // 12 - 1)
    text = head + "\N{GRINNING FACE}" * emoji
    text += "x" * (target - request(text))
    assert request(text) == target
    return text, limits


@pytest.mark.parametrize("beyond", [-1, 0, 1, 4096])
def test_a_request_at_and_over_the_pipe_buffer_is_written_whole(beyond: int) -> None:
    text, limits = grammar_with_request_of(pipe_buffer_bytes() + beyond)
    assert compile_guarded(text, limits, timeout=10).verdict == LALR1


def test_the_32_kib_emoji_grammar_of_the_report_compiles() -> None:
    head = "body: SYMBOL\n// "
    text = head + "\N{GRINNING FACE}" * ((32_768 - len(head)) // 4)
    assert len(text.encode()) <= 32_768
    request = _compile._request(text, None, starts=("body",), timeout=20,
                                memory=_compile.DEFAULT_MEMORY,
                                max_table_bytes=DEFAULT_MAX_TABLE_BYTES)
    assert len(request) > pipe_buffer_bytes()
    # Before: the rest of the request was never written, and the worker waited for it
    # until the wall-clock deadline (30 s here) refused the grammar.
    assert compile_guarded(text, timeout=10).verdict == LALR1


def test_a_large_request_still_keeps_its_deadline_and_cancellation() -> None:
    text, limits = grammar_with_request_of(pipe_buffer_bytes() + 4096)
    calls: list[int] = []

    def cancelled() -> bool:
        calls.append(1)
        return True

    with pytest.raises(cbcl.LimitError, match="abandoned"):
        compile_guarded(text, limits, cancelled=cancelled)
    assert calls
    with pytest.raises(cbcl.GrammarError, match="longer than"):
        compile_guarded(text, limits, timeout=0.01)
