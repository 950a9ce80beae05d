"""Compiling a descriptor grammar into body tables, under a guard.

Theory of operation
-------------------
A grammar from a peer is untrusted, so compiling it is a pipeline of checks, each bounded
before the next runs: CBCL's own linear-time reader of the subset (:mod:`._subset`, with
its text, rule, nesting and literal limits), the LR analyser (:mod:`._lr`, with state and
search budgets), and only then lark, on grammar text CBCL generated itself, with
``strict=True``. The result is plain data (:class:`CompiledGrammar`): LALR tables, the
literal terminals, the checker's verdict and report.

:func:`compile_guarded` runs that pipeline in a fresh worker process (``python -m
cbcl.grammar._compile_worker``) with a wall-clock timeout and an address-space limit, so no grammar
can hang, crash or exhaust the process that loads it. Data crosses the process boundary as
JSON, never pickle, and is validated by :func:`from_data` before use — the same function
that validates entries read back from the disk cache.
"""

from __future__ import annotations

import json
import math
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
from ._lalr import Rule, Tables, build_lark
from ._lr import LALR1, analyse
from ._subset import GrammarLimits, read_grammar, to_cfg, to_lark

#: Bumped whenever the compiled form changes meaning; part of every cache key.
FORMAT_VERSION = 2
DEFAULT_TIMEOUT = 20.0
DEFAULT_MEMORY = 1 << 30  # bytes of address space for the worker


@dataclass(frozen=True, slots=True)
class CompiledGrammar:
    """A checked grammar. ``tables`` is ``None`` unless ``verdict`` is ``LALR(1)``.
    ``literals`` maps literal terminal names (``LIT_0``, ``LPAR``, ``RPAR``) to their text."""

    verdict: str
    report: str
    tables: Tables | None
    literals: dict[str, str]


def compile_grammar(text: str, limits: GrammarLimits | None = None, *,
                    starts: tuple[str, ...] = ("body",)) -> CompiledGrammar:
    """Check and compile ``text`` in this process, with the start rules ``starts``.

    Raises :class:`GrammarError` (verdict ``rejected``) for text outside the subset, over a
    limit or over an analysis budget. A grammar that is read but not LALR(1) is returned
    with its verdict and report and no tables.
    """
    source = read_grammar(text, limits=limits, starts=starts)
    report = analyse(to_cfg(source))
    if report.verdict != LALR1:
        return CompiledGrammar(report.verdict, report.render(), None, {})
    generated = to_lark(source)
    tables = Tables.from_lark(_build_lark(generated.text, generated.start), generated.start)
    tables = tables.with_grammar(generated.keyword_sets, generated.start_terminals)
    return CompiledGrammar(report.verdict, report.render(), tables, dict(generated.literals))


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
_WORKER_BOOT = ("import importlib.util, sys; "
                "spec = importlib.util.spec_from_file_location('cbcl', sys.argv[1], "
                "submodule_search_locations=[sys.argv[2]]); "
                "module = importlib.util.module_from_spec(spec); sys.modules['cbcl'] = module; "
                "spec.loader.exec_module(module); "
                "from cbcl.grammar._compile_worker import main; sys.exit(main())")
_WORKER_ARGS = (sys.executable, "-I", "-c", _WORKER_BOOT, str(_PACKAGE_DIR / "__init__.py"),
                str(_PACKAGE_DIR))


def compile_guarded(text: str, limits: GrammarLimits | None = None, *,
                    starts: tuple[str, ...] = ("body",),
                    timeout: float = DEFAULT_TIMEOUT, memory: int = DEFAULT_MEMORY,
                    cancelled: Callable[[], bool] | None = None) -> CompiledGrammar:
    """:func:`compile_grammar` in a worker process limited to ``timeout`` seconds of CPU
    time (and three times that of wall clock, for a worker starved or stopped), ``memory``
    bytes of address space, and a lower scheduling priority than this process, so a
    compile never takes the CPU from the peers this process serves. ``cancelled``, polled
    every 50 ms, stops the worker early (its caller has gone).

    Raises :class:`GrammarError` (verdict ``rejected``) as :func:`compile_grammar` does, and
    when the worker runs out of time or memory or dies; :class:`LimitError` when it is
    cancelled (not a verdict on the grammar, so never remembered as one).
    """
    limits = GrammarLimits() if limits is None else limits
    request = json.dumps({"grammar": text, "limits": _limits_data(limits),
                          "starts": list(starts), "memory": memory,
                          "cpu_seconds": max(1, math.ceil(timeout))}).encode()
    worker = subprocess.Popen(_WORKER_ARGS, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, cwd=_PACKAGE_DIR)
    deadline = time.monotonic() + 3 * timeout
    pending: bytes | None = request
    try:
        while True:
            try:
                out, err = worker.communicate(pending, timeout=0.05)
                break
            except subprocess.TimeoutExpired:
                pending = None  # written already; later calls only wait
            if time.monotonic() > deadline:
                raise GrammarError(f"compiling the grammar took longer than {3 * timeout:g} s",
                                   verdict="rejected")
            if cancelled is not None and cancelled():
                raise LimitError("the compile was abandoned: nobody waits for it",
                                 limit="abandoned", maximum=0)
    finally:
        if worker.returncode is None:
            worker.kill()
            worker.communicate()
    if worker.returncode != 0:
        if worker.returncode in (-signal.SIGXCPU, -signal.SIGKILL) and b"Error" not in err:
            raise GrammarError(f"compiling the grammar took more than {timeout:g} s of CPU",
                               verdict="rejected")
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        reason = "ran out of memory" if "MemoryError" in tail[0] else f"failed: {tail[0]}"
        raise GrammarError(f"the grammar compiler {reason}", verdict="rejected")
    reply = json.loads(out)
    if "error" in reply:
        error = reply["error"]
        position = Position(*error["position"]) if error.get("position") else None
        raise GrammarError(error["message"], verdict=error["verdict"], position=position,
                           context=error.get("context"))
    return from_data(reply["ok"])
