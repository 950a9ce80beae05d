"""Compiling a descriptor grammar into body tables, under a guard.

Theory of operation
-------------------
A grammar from a peer is untrusted, so compiling it is a pipeline of checks, each bounded
before the next runs: CBCL's own linear-time reader of the subset (:mod:`._subset`, with
its text, rule, nesting and literal limits), the LR analyser (:mod:`._lr`, with state and
search budgets), and only then lark, on grammar text CBCL generated itself, with
``strict=True``. The result is plain data (:class:`CompiledGrammar`): LALR tables, the
literal terminals, the checker's verdict and report.

The size of the tables is bounded where they are built. :func:`compiled_size` is the one
measure of a compiled grammar's memory (:func:`cbcl.grammar._lalr.table_bytes` for its
tables, plus its report and literals). The analyser builds the LALR(1) automaton that lark
would build from the same BNF, state for state, and is told the size as it grows (lower
bounds after each state, the exact table counts once the lookaheads are known): past
``max_table_bytes`` it stops with :class:`TablesTooLarge` before a conflict is searched
for and before lark builds anything. The tables lark then builds are measured again.

:func:`compile_guarded` runs that pipeline in a fresh worker process (``python -m
cbcl.grammar._compile_worker``) with a CPU-time and wall-clock limit and an address-space
limit, so no grammar can hang, crash or exhaust the process that loads it. Data crosses
the process boundary as JSON, never pickle, and is validated by :func:`from_data` before
use — the same function that validates entries read back from the disk cache. The request
is written whole (the worker's stdin is written as it drains, in one loop with the reads,
so a request larger than the pipe's buffer cannot deadlock), the reply is read up to a
bound (a worker that writes more is killed), and every wait has the deadline. The worker
knows ``max_table_bytes`` too: an oversized grammar comes back as a short verdict
(``{"oversized": …}``), and so does a reply that would be larger than the limit, so this
process never reads or decodes oversized tables.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lark

from ..core._errors import GrammarError, LimitError, Position
from ._lalr import Rule, Tables, build_lark, table_bytes
from ._lr import LALR1, analyse
from ._subset import GrammarLimits, read_grammar, to_cfg, to_lark

#: Bumped whenever the compiled form changes meaning; part of every cache key.
FORMAT_VERSION = 2
DEFAULT_TIMEOUT = 20.0
DEFAULT_MEMORY = 1 << 30  # bytes of address space for the worker
#: The default bound on one compiled grammar, by :func:`compiled_size` (and on the bytes of
#: the worker's reply that carries it).
DEFAULT_MAX_TABLE_BYTES = 16 << 20
#: What :func:`compiled_size` counts for a compiled grammar besides its tables: a fixed
#: part, and each literal terminal (its name and text).
BASE_BYTES = 1024
LITERAL_BYTES = 100
#: Bytes a worker's reply may have beyond ``max_table_bytes`` (an error or a verdict, when
#: the limit is tiny); a worker that writes more is killed.
REPLY_SLACK_BYTES = 64 << 10
#: The last bytes of the worker's stderr kept (for the reason of a crash).
STDERR_TAIL_BYTES = 64 << 10
#: Bytes written to the worker's stdin per write, as it drains.
_WRITE_CHUNK = 64 << 10


@dataclass(frozen=True, slots=True)
class CompiledGrammar:
    """A checked grammar. ``tables`` is ``None`` unless ``verdict`` is ``LALR(1)``.
    ``literals`` maps literal terminal names (``LIT_0``, ``LPAR``, ``RPAR``) to their text."""

    verdict: str
    report: str
    tables: Tables | None
    literals: dict[str, str]


def _grammar_bytes(report: str, literals: int) -> int:
    return BASE_BYTES + len(report) + LITERAL_BYTES * literals


def compiled_size(compiled: CompiledGrammar) -> int:
    """An estimate, in bytes, of what ``compiled`` occupies in memory once loaded: its
    tables by :func:`~cbcl.grammar._lalr.table_bytes`, its report and literals. The bound
    ``max_table_bytes`` of :func:`compile_grammar` and :func:`compile_guarded` (and
    ``Registry(max_compiled_bytes=…)``) is on this measure."""
    size = _grammar_bytes(compiled.report, len(compiled.literals))
    tables = compiled.tables
    if tables is not None:
        size += table_bytes(len(tables.actions), sum(map(len, tables.actions)),
                            len(tables.rules))
    return size


class TablesTooLarge(GrammarError):
    """A grammar refused (verdict ``rejected``) because its compiled form would take more
    than ``limit`` bytes: ``size`` bytes by :func:`compiled_size` (``measure`` is
    ``"tables"``; a lower bound while ``exact`` is false, found when the analyser's LALR
    automaton had ``states`` states), or a worker's reply of ``size`` bytes (``measure``
    ``"reply"``). A refusal by this process's limit, not a verdict on the grammar: a
    larger limit may accept it."""

    def __init__(self, size: int, limit: int, *, exact: bool = True, states: int = 0,
                 measure: str = "tables") -> None:
        if measure == "reply":
            text = f"the compiled grammar's reply would take {size} bytes"
        elif exact:
            text = f"the compiled grammar would take about {size} bytes"
        else:
            text = (f"the compiled grammar would take at least {size} bytes (counted when "
                    f"its LR automaton had {states} states)")
        super().__init__(f"{text}; the limit is {limit}", verdict="rejected")
        self.size = size
        self.limit = limit
        self.exact = exact
        self.states = states
        self.measure = measure


def _check_limit(name: str, value: int) -> None:
    if type(value) is not int or value < 1:
        raise ValueError(f"{name} must be a positive int")


def compile_grammar(text: str, limits: GrammarLimits | None = None, *,
                    starts: tuple[str, ...] = ("body",),
                    max_table_bytes: int = DEFAULT_MAX_TABLE_BYTES) -> CompiledGrammar:
    """Check and compile ``text`` in this process, with the start rules ``starts``.

    Raises :class:`GrammarError` (verdict ``rejected``) for text outside the subset, over a
    limit or over an analysis budget; :class:`TablesTooLarge` (a ``GrammarError``) as soon
    as the analyser finds that the compiled grammar would take more than
    ``max_table_bytes`` by :func:`compiled_size` (before lark builds anything); a
    ``ValueError`` for a ``max_table_bytes`` that is not a positive int. A grammar that is
    read but not LALR(1) is returned with its verdict and report and no tables.
    """
    _check_limit("max_table_bytes", max_table_bytes)
    source = read_grammar(text, limits=limits, starts=starts)
    generated = to_lark(source)
    # What the compiled grammar takes besides its tables, if it is LALR(1) (its report is
    # then the verdict alone).
    fixed = _grammar_bytes(LALR1, len(generated.literals))

    def table_limit(states: int, entries: int, rules: int, exact: bool) -> None:
        size = fixed + table_bytes(states, entries, rules)
        if size > max_table_bytes:
            raise TablesTooLarge(size, max_table_bytes, exact=exact, states=states)

    report = analyse(to_cfg(source), table_limit=table_limit)
    if report.verdict != LALR1:
        return CompiledGrammar(report.verdict, report.render(), None, {})
    tables = Tables.from_lark(_build_lark(generated.text, generated.start), generated.start)
    tables = tables.with_grammar(generated.keyword_sets, generated.start_terminals)
    compiled = CompiledGrammar(report.verdict, report.render(), tables,
                               dict(generated.literals))
    size = compiled_size(compiled)  # the analyser's count, unless lark's table differs
    if size > max_table_bytes:
        raise TablesTooLarge(size, max_table_bytes, states=len(tables.actions))
    return compiled


def _build_lark(text: str, start: str) -> Any:

    try:
        return build_lark(text, start)
    except lark.exceptions.LarkError as exc:  # the checker said LALR(1): a bug if reached
        raise GrammarError(f"lark refused the generated grammar: {exc}",
                           verdict="rejected") from exc


# --------------------------------------------------------------------------- plain data


def to_data(compiled: CompiledGrammar) -> dict[str, Any]:
    """The JSON form of a compiled grammar."""
    tables = compiled.tables
    return {
        "format": FORMAT_VERSION,
        "verdict": compiled.verdict,
        "report": compiled.report,
        "literals": compiled.literals,
        "tables": None if tables is None else {
            "actions": list(tables.actions),
            "rules": [[r.origin, r.size, r.alias] for r in tables.rules],
            "start": tables.start_state,
            "end": tables.end_state,
            "keyword_sets": {spec.rule: [[terminal, not spec.required & bit, keyword]
                                         for (terminal, bit), keyword
                                         in zip(spec.bits.items(), spec.keywords, strict=True)]
                             for spec in tables.keyword_sets.values()},
            "starts": dict(tables.start_terminals),
        },
    }


class _Invalid(Exception):
    pass


def _expect(condition: bool) -> None:
    if not condition:
        raise _Invalid


def from_data(data: Any) -> CompiledGrammar:
    """Rebuild a compiled grammar from its JSON form, checking every field and every table
    reference, so corrupt or forged data cannot make the driver misbehave.

    Raises ``ValueError`` for anything that does not check out.
    """
    try:
        _expect(type(data) is dict and data.get("format") == FORMAT_VERSION)
        verdict, report, literals = data["verdict"], data["report"], data["literals"]
        _expect(type(verdict) is str and type(report) is str and type(literals) is dict)
        _expect(all(type(k) is str and type(v) is str for k, v in literals.items()))
        raw = data["tables"]
        if raw is None:
            _expect(verdict != LALR1)
            return CompiledGrammar(verdict, report, None, literals)
        _expect(verdict == LALR1 and type(raw) is dict)
        actions, rules = raw["actions"], raw["rules"]
        _expect(type(actions) is list and type(rules) is list and len(actions) > 0)
        state_count = len(actions)
        checked_rules: list[Rule] = []
        for rule in rules:
            _expect(type(rule) is list and len(rule) == 3)
            origin, size, alias = rule
            _expect(type(origin) is str and type(size) is int and 0 <= size <= 10_000)
            _expect(alias is None or type(alias) is str)
            checked_rules.append(Rule(origin, size, alias))
        symbols: set[str] = set()
        rule_count = len(rules)
        for row in actions:
            _expect(type(row) is dict)
            symbols.update(row)
            for action in row.values():
                _expect(type(action) is int)
                _expect(action < state_count if action >= 0 else ~action < rule_count)
        _expect(all(type(symbol) is str for symbol in symbols))
        start, end = raw["start"], raw["end"]
        _expect(type(start) is int and type(end) is int)
        _expect(0 <= start < state_count and 0 <= end < state_count)
        # Every reduction must have somewhere to go.
        _expect(all(rule.origin in symbols for rule in checked_rules))
        sets, starts = raw["keyword_sets"], raw["starts"]
        _expect(type(sets) is dict and type(starts) is dict)
        members: dict[str, list[tuple[str, bool, str]]] = {}
        for rule, listed in sets.items():
            _expect(type(listed) is list and 0 < len(listed) <= 4096)
            for member in listed:
                _expect(type(member) is list and len(member) == 3)
                terminal, optional, keyword = member
                _expect(type(terminal) is str and type(optional) is bool
                        and type(keyword) is str)
            members[rule] = [(t, o, k) for t, o, k in listed]
        _expect(all(type(k) is str and type(v) is str for k, v in starts.items()))
        tables = Tables(tuple(actions), tuple(checked_rules), start, end).with_grammar(
            members, starts)
    except (_Invalid, KeyError, TypeError, ValueError):
        raise ValueError("not a valid compiled grammar") from None
    return CompiledGrammar(verdict, report, tables, literals)


# --------------------------------------------------------------------------- the guard


def _limits_data(limits: GrammarLimits) -> dict[str, int]:
    return {name: getattr(limits, name) for name in GrammarLimits.__dataclass_fields__}


# The worker runs in isolated mode (-I: no PYTHON* variables, no user site, no working
# directory on sys.path), so nothing in the environment or the current directory can put
# other code in its place; it loads this very copy of cbcl from its known location (the
# package's own directory, bound as ``cbcl`` before anything imports it, so neither another
# installed copy nor a directory put first on sys.path is ever searched for it).
_PACKAGE_DIR = Path(__file__).resolve().parent.parent
# The entry it runs is a function of a module of this package, named by its arguments:
# the compile (cbcl.grammar._compile_worker.main) or another analysis run under the same
# guard (run_guarded: the compatibility check of cbcl.protocol._compat).
_WORKER_BOOT = ("import importlib, importlib.util, sys; "
                "spec = importlib.util.spec_from_file_location('cbcl', sys.argv[1], "
                "submodule_search_locations=[sys.argv[2]]); "
                "module = importlib.util.module_from_spec(spec); sys.modules['cbcl'] = module; "
                "spec.loader.exec_module(module); "
                "sys.exit(getattr(importlib.import_module(sys.argv[3]), sys.argv[4])())")
#: The compile worker's entry: module and function.
COMPILE_ENTRY = ("cbcl.grammar._compile_worker", "main")


def _worker_args(entry: tuple[str, str]) -> tuple[str, ...]:
    """The command line of a worker running ``entry`` (a module of this package and a
    function of it that takes no argument and returns the exit status)."""
    module, function = entry
    if not module.startswith("cbcl.") or not function.isidentifier():
        raise ValueError(f"not an entry of this package: {module}:{function}")
    return (sys.executable, "-I", "-c", _WORKER_BOOT, str(_PACKAGE_DIR / "__init__.py"),
            str(_PACKAGE_DIR), module, function)


_WORKER_ARGS = _worker_args(COMPILE_ENTRY)


def compile_guarded(text: str, limits: GrammarLimits | None = None, *,
                    starts: tuple[str, ...] = ("body",),
                    timeout: float = DEFAULT_TIMEOUT, memory: int = DEFAULT_MEMORY,
                    cancelled: Callable[[], bool] | None = None,
                    max_table_bytes: int = DEFAULT_MAX_TABLE_BYTES) -> CompiledGrammar:
    """:func:`compile_grammar` in a worker process limited to ``timeout`` seconds of CPU
    time (and three times that of wall clock, for a worker starved or stopped), ``memory``
    bytes of address space, and a lower scheduling priority than this process, so a
    compile never takes the CPU from the peers this process serves. ``cancelled``, polled
    every 50 ms, stops the worker early (its caller has gone). ``max_table_bytes`` bounds
    the compiled grammar (by :func:`compiled_size`, checked in the worker as the analyser
    builds the automaton) and the worker's reply (its JSON bytes); this process reads at
    most ``max_table_bytes`` + :data:`REPLY_SLACK_BYTES` of reply, and kills a worker that
    writes more.

    Raises :class:`GrammarError` (verdict ``rejected``) as :func:`compile_grammar` does, and
    when the worker runs out of time or memory, dies or replies beyond its bound;
    :class:`TablesTooLarge` (a ``GrammarError``) for a compiled grammar or reply over
    ``max_table_bytes``; :class:`LimitError` when it is cancelled or no worker can be
    started (not verdicts on the grammar, so never remembered as such); ``ValueError`` for
    a ``max_table_bytes`` that is not a positive int.
    """
    _check_limit("max_table_bytes", max_table_bytes)
    request = _request(text, limits, starts=starts, timeout=timeout, memory=memory,
                       max_table_bytes=max_table_bytes)
    status, out, err = _exchange(request, deadline=time.monotonic() + 3 * timeout,
                                 timeout=timeout, cancelled=cancelled,
                                 max_reply=max_table_bytes + REPLY_SLACK_BYTES)
    if status != 0:
        if status in (-signal.SIGXCPU, -signal.SIGKILL) and b"Error" not in err:
            raise GrammarError(f"compiling the grammar took more than {timeout:g} s of CPU",
                               verdict="rejected")
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        reason = "ran out of memory" if "MemoryError" in tail[0] else f"failed: {tail[0]}"
        raise GrammarError(f"the grammar compiler {reason}", verdict="rejected")
    compiled = _read_reply(out)
    size = compiled_size(compiled)  # the worker checked it; a reply is never taken on trust
    if size > max_table_bytes:
        raise TablesTooLarge(size, max_table_bytes, states=len(compiled.tables.actions)
                             if compiled.tables is not None else 0)
    return compiled


def run_guarded(request: dict[str, Any], entry: tuple[str, str], *, timeout: float,
                memory: int, cancelled: Callable[[], bool] | None,
                max_reply: int) -> bytes:
    """Run ``entry`` (see :func:`_worker_args`) in a worker guarded as the compile's is:
    ``request`` (JSON data) on its stdin, with ``memory`` bytes of address space and
    ``timeout`` seconds of CPU (its ``"memory"`` and ``"cpu_seconds"``, which the entry
    applies with :func:`cbcl.grammar._compile_worker.confine`), three times that of wall
    clock, a lower priority, ``cancelled`` polled every 50 ms; returns its stdout (at most
    ``max_reply`` bytes). Raises :class:`GrammarError` (verdict ``rejected``) when the
    worker runs out of time or memory, dies or replies beyond its bound, and
    :class:`LimitError` when it is cancelled or cannot be started."""
    data = json.dumps({**request, "memory": memory,
                       "cpu_seconds": max(1, math.ceil(timeout))}).encode()
    status, out, err = _exchange(data, deadline=time.monotonic() + 3 * timeout,
                                 timeout=timeout, cancelled=cancelled, max_reply=max_reply,
                                 args=_worker_args(entry))
    if status != 0:
        if status in (-signal.SIGXCPU, -signal.SIGKILL) and b"Error" not in err:
            raise GrammarError(f"the analysis took more than {timeout:g} s of CPU",
                               verdict="rejected")
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        reason = "ran out of memory" if "MemoryError" in tail[0] else f"failed: {tail[0]}"
        raise GrammarError(f"the analysis worker {reason}", verdict="rejected")
    return out


def _request(text: str, limits: GrammarLimits | None, *, starts: tuple[str, ...],
             timeout: float, memory: int, max_table_bytes: int) -> bytes:
    """The bytes :func:`compile_guarded` writes to its worker (JSON, ASCII: a character
    outside ASCII takes 6 or 12 bytes, so the request may be three times the text)."""
    limits = GrammarLimits() if limits is None else limits
    return json.dumps({"grammar": text, "limits": _limits_data(limits),
                       "starts": list(starts), "memory": memory,
                       "cpu_seconds": max(1, math.ceil(timeout)),
                       "max_table_bytes": max_table_bytes}).encode()


def _read_reply(out: bytes) -> CompiledGrammar:
    """The compiled grammar of a worker's reply, or the refusal it carries, raised.
    Raises GrammarError (``TablesTooLarge`` for an oversized one), and for a reply that is
    not one a worker writes."""
    try:
        reply = json.loads(out)
        _expect(type(reply) is dict and len(reply) == 1)
        if "ok" in reply:
            return from_data(reply["ok"])
        if "oversized" in reply:
            found = reply["oversized"]
            _expect(type(found) is dict)
            size, limit, exact = found["size"], found["limit"], found["exact"]
            states, measure = found["states"], found["measure"]
            _expect(type(size) is int and type(limit) is int and type(states) is int)
            _expect(type(exact) is bool and measure in ("tables", "reply"))
            error: GrammarError = TablesTooLarge(size, limit, exact=exact, states=states,
                                                 measure=measure)
        else:
            found = reply["error"]
            _expect(type(found) is dict)
            message, verdict = found["message"], found["verdict"]
            context, where = found.get("context"), found.get("position")
            _expect(type(message) is str and type(verdict) is str)
            _expect(context is None or type(context) is str)
            _expect(where is None or (type(where) is list and len(where) == 3
                                      and all(type(n) is int for n in where)))
            error = GrammarError(message, verdict=verdict, context=context,
                                 position=None if where is None else Position(*where))
    except (_Invalid, KeyError, TypeError, ValueError):
        raise GrammarError("the grammar compiler failed: its reply is malformed",
                           verdict="rejected") from None
    raise error


def _exchange(request: bytes, *, deadline: float, timeout: float,
              cancelled: Callable[[], bool] | None, max_reply: int,
              args: tuple[str, ...] = _WORKER_ARGS) -> tuple[int, bytes, bytes]:
    """Run a worker: write ``request`` whole to its stdin as it drains, read its stdout (at
    most ``max_reply`` bytes) and the tail of its stderr, in one loop that checks the
    ``deadline`` (monotonic) and ``cancelled`` every 50 ms, then wait for its exit under
    the same deadline. Returns (exit status, stdout, stderr tail); the worker is dead on
    return or raise. Raises as :func:`compile_guarded`."""
    try:
        worker = subprocess.Popen(args, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  cwd=_PACKAGE_DIR)
    except OSError as exc:
        raise LimitError(f"no grammar compiler could be started: {exc.strerror or exc}",
                         limit="compile_worker", maximum=0) from None
    streams = (worker.stdin, worker.stdout, worker.stderr)
    try:
        stdin, stdout, stderr = streams
        if stdin is None or stdout is None or stderr is None:  # pragma: no cover - PIPE
            raise RuntimeError("the worker's pipes are missing")
        out, err = bytearray(), bytearray()
        pending = memoryview(request)
        with selectors.DefaultSelector() as selector:
            os.set_blocking(stdin.fileno(), False)
            selector.register(stdin, selectors.EVENT_WRITE)
            selector.register(stdout, selectors.EVENT_READ)
            selector.register(stderr, selectors.EVENT_READ)
            while selector.get_map():
                _still_wanted(deadline, timeout, cancelled)
                for key, _ in selector.select(_tick(deadline)):
                    if key.fileobj is stdin:
                        try:
                            pending = pending[os.write(key.fd, pending[:_WRITE_CHUNK]):]
                        except BlockingIOError:
                            continue
                        except BrokenPipeError:  # the worker has gone; its status says why
                            pending = pending[:0]
                        if not pending:
                            selector.unregister(stdin)
                            stdin.close()  # end of the request
                        continue
                    chunk = os.read(key.fd, 1 << 16)
                    if not chunk:
                        selector.unregister(key.fileobj)
                    elif key.fileobj is stdout:
                        out += chunk
                        if len(out) > max_reply:
                            raise GrammarError(f"the grammar compiler's reply is over "
                                               f"{max_reply} bytes", verdict="rejected")
                    else:
                        err += chunk
                        del err[:-STDERR_TAIL_BYTES]
        while True:  # its outputs are closed: it is exiting
            _still_wanted(deadline, timeout, cancelled)
            with contextlib.suppress(subprocess.TimeoutExpired):
                return worker.wait(_tick(deadline)), bytes(out), bytes(err)
    finally:
        if worker.returncode is None:
            worker.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.wait(5)  # killed: at once, unless the kernel holds it
        for stream in streams:
            if stream is not None:
                stream.close()


def _tick(deadline: float) -> float:
    return min(0.05, max(0.0, deadline - time.monotonic()))


def _still_wanted(deadline: float, timeout: float,
                  cancelled: Callable[[], bool] | None) -> None:
    if time.monotonic() > deadline:
        raise GrammarError(f"compiling the grammar took longer than {3 * timeout:g} s",
                           verdict="rejected")
    if cancelled is not None and cancelled():
        raise LimitError("the compile was abandoned: nobody waits for it",
                         limit="abandoned", maximum=0)
