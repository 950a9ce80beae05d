"""Compatibility between two versions of a descriptor (spec/compatibility.md).

Theory of operation
-------------------
A body is a value tree, and what a descriptor accepts for an intent is the set of trees its
start rule derives (as token strings: ``(`` and ``)`` around each list, atoms as
themselves) that also satisfy its schema. When every alternative keeps its parentheses
balanced and rules refer to one another in sequence position without self-embedding, that
set is a *regular tree language*, and inclusion between two of them is decidable. This
module decides it, sans I/O, in five steps:

1. **Hedge terms.** Each rule becomes a regular expression over atoms, rule references and
   *tree terms* ``"(" … ")"`` (matched within one alternative; an unmatched parenthesis
   makes the answer ``unknown``). Each syntactic tree term is a *tree type* whose content
   is a horizontal language.
2. **Atom classes.** The atoms are partitioned into finitely many classes on which every
   predicate of both descriptors is constant: each literal or one-of value (symbols,
   keywords, strings, numbers, URIs) is a class of its own; the other atoms of a kind are
   cut at every bound either schema names (integer and decimal ranges, string and symbol
   lengths, URI schemes), and strings also by which of the schemas' patterns they match
   (:func:`_pattern_texts`). Integers are cut to the signed 64-bit range. Keywords that no
   descriptor names form one class of *fresh* keywords (each occurrence in a witness gets
   a new name) and, when a schema has ``(else …)`` keys, a class of *marked* keywords (all
   occurrences in one list are the same keyword: this is how a repeated unnamed key,
   which a schema refuses and a grammar does not notice, is represented exactly). Each
   class has a representative value, and a predicate's truth on a class is its truth on
   the representative. The classes are sorted kind by kind (numbers by value, strings and
   symbols by length, URIs by scheme), so that each predicate holds on a few *intervals*
   of them, found by bisection and checked at their ends, inside and out, by the real
   schema code: O(n log n) in the bounds and named values, never their product. Bounds
   are computed with exactly, in a decimal context wide enough for every number the
   reader admits (a number beyond them is refused before any arithmetic).
3. **Automata.** Every tree type's content becomes an NFA (Thompson's construction; a
   rule is inlined where it is referenced; a strongly connected set of rules is inlined
   once as a right- or left-linear NFA fragment; anything else there is self-embedding
   and ``unknown``). Keyword sets become subset-of-members automata. Schema types
   (records, keyword lists with required keys and ``else``, ``list-of`` with lengths) are
   deterministic automata with lazily built states, and a record's *prefix* (its head
   symbols) is a tree type too, for the schema's first-record-by-heads rule.
4. **Bottom-up determinisation** (the subset construction for tree automata, as in
   Hosoya–Vouillon–Pierce's subtyping for regular expression types). A tree's *signature*
   is the exact set of tree types (of both descriptors, grammar and schema) it belongs to.
   All content automata run together over a list's children; the product state after the
   last child gives the list's signature. The reachable product states and signatures are
   computed to a fixpoint, with the atom classes and the signatures found so far as the
   alphabet — from each product state, one class (the cheapest) for each block of classes
   that its automata cannot tell apart, which a sweep over the intervals of the sets they
   test finds; product states in which no tree type of the side that must be covered is
   alive are pruned (no subtree of a body that side accepts passes through them). A body
   is one value: for each intent and each atom class or signature, each side's start rule
   (on that single letter) and schema root decide acceptance. Backward compatibility is:
   every letter OLD accepts, NEW accepts.
5. **Witnesses.** A failing letter is turned into a concrete body (the product state that
   produced each signature records the letters that lead to it, so the witness is built
   bottom-up from recorded paths). Before it is reported, it is printed, read back with
   the real reader and judged by both real recognisers (pass 2 tables and schema check);
   if they disagree with the analysis the verdict is ``unknown`` (and that is a bug).

Nothing here recurses on a grammar's or a schema's depth: the walks keep explicit stacks,
and the functions that build something per level are generators run by :func:`_run`.
Where the grammars are not of that shape, or a limit (:class:`CompatLimits`) is reached,
the verdict is ``unknown``, never ``compatible``; a bounded random search over bodies the
covered side's grammar generates then looks for a witness with the real recognisers, and a
witness found that way makes the verdict ``breaking``.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import math
import random
import sys
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from decimal import (
    ROUND_CEILING,
    ROUND_FLOOR,
    Context,
    Decimal,
    DecimalException,
    DivisionByZero,
    Inexact,
    InvalidOperation,
    Overflow,
    localcontext,
)
from typing import Any

from ..core._canonical import canonical_value
from ..core._errors import CBCLError, DescriptorError, GrammarError
from ..core._limits import DEFAULT_LIMITS, Limits
from ..core._reader import read
from ..core._values import INT64_MAX, INT64_MIN, URI, Keyword, Symbol, Value
from ..core._vocabulary import MAX_DECIMAL_CHARS
from ..grammar._compile import CompiledGrammar, compile_grammar, run_guarded
from ..grammar._compile_worker import confine
from ..grammar._lr import LALR1, analyse
from ..grammar._subset import (
    NUMBER,
    Alternative,
    GrammarLimits,
    GrammarSource,
    Group,
    Item,
    KeywordMember,
    KeywordSet,
    Literal,
    Reference,
    Repeat,
    Rule,
    derivation_heights,
    read_grammar,
    render_alternatives,
    render_item,
    sequence_height,
    to_cfg,
    walk,
)
from ._constraints import read_constraints
from ._descriptor import ProtocolDescriptor, read_descriptor
from ._message import Intent, Message
from ._pass2 import check_intent_and_body
from ._patterns import MAX_CODE_POINT, MAX_WITNESS_STEPS, compile_pattern, representative
from ._protocol import Protocol
from ._schema import (
    AtomType,
    Keys,
    ListOf,
    OneOf,
    Record,
    Schema,
    SchemaType,
    _atom_problem,
    _one_of,
    compile_schema,
)

__all__ = [
    "BACKWARD",
    "BREAKING",
    "COMPATIBLE",
    "FORWARD",
    "FULL",
    "MODES",
    "UNKNOWN",
    "CompatLimits",
    "CompatReport",
    "CompatVerdict",
    "Compile",
    "Witness",
    "diff_descriptors",
    "generate_bodies",
]

COMPATIBLE, BREAKING, UNKNOWN = "compatible", "breaking", "unknown"
BACKWARD, FORWARD, FULL = "backward", "forward", "full"
MODES = (BACKWARD, FORWARD, FULL)
#: Exit status of ``cbcl descriptor diff`` for each verdict.
EXIT_CODES = {COMPATIBLE: 0, BREAKING: 5, UNKNOWN: 5}
#: How :func:`diff_descriptors` gets a descriptor's compiled grammar (``compile=``).
Compile = Callable[[ProtocolDescriptor], CompiledGrammar]


@dataclass(frozen=True, slots=True)
class CompatLimits:
    """Limits on one comparison; reaching one makes the verdict ``unknown`` (never an
    exception), with the limit named in the report. Each is counted as the work is done,
    before the work it protects (spec/compatibility.md §5).

    * ``max_states`` (20,000): product states (and, separately, signatures) explored by
      the determinisation of step 4;
    * ``max_steps`` (1,000,000): the work of step 4, in automaton moves: each product
      transition counts one, plus one per grammar NFA state and per schema automaton it
      advances, plus one per segment swept to find the letters of a state (bounds the
      time);
    * ``max_nfa_states`` (200,000): NFA states built for both grammars (inlining rules can
      multiply them);
    * ``max_members`` (12): members of one keyword set handled exactly (its automaton has
      a state per subset of members);
    * ``max_atom_classes`` (50,000): atom classes of step 2 (the named values, and a
      region between each two bounds or lengths the schemas name), counted as soon as
      they are made, before any automaton uses them;
    * ``max_witness_nodes`` (10,000): atoms plus lists of a witness body;
    * ``max_atom_chars`` (65,536): the length of a string or symbol a class needs as its
      representative (a schema's ``:min-length`` above it is not analysed);
    * ``search_bodies`` (500) and ``search_depth`` (6): the bounded witness search made
      when the verdict is ``unknown``: bodies generated (and at most 100 grammar items
      expanded per body asked for, in all), and rule nesting before the generator takes
      the shortest way out.

    Raises ``ValueError`` for a limit that is not a positive ``int``.
    """

    max_states: int = 20_000
    max_steps: int = 1_000_000
    max_nfa_states: int = 200_000
    max_members: int = 12
    max_witness_nodes: int = 10_000
    max_atom_chars: int = 65_536
    search_bodies: int = 500
    search_depth: int = 6
    max_atom_classes: int = 50_000

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"CompatLimits.{name} must be a positive int, got {value!r}")


@dataclass(frozen=True, slots=True)
class Witness:
    """A body for ``intent`` that the side ``accepted_by`` (``"old"`` or ``"new"``)
    accepts and the other refuses (or does not govern), re-checked by both recognisers.
    ``text`` is its canonical text."""

    intent: Intent
    body: Value
    text: str
    accepted_by: str


@dataclass(frozen=True, slots=True)
class CompatReport:
    """The answer of :func:`diff_descriptors`: the verdict, what changed (one line each),
    the witnesses (for ``breaking``), why the answer is ``unknown`` (``reasons``) and what
    the bounded search did (``search``, for ``unknown``)."""

    verdict: str
    mode: str
    changes: tuple[str, ...] = ()
    witnesses: tuple[Witness, ...] = ()
    reasons: tuple[str, ...] = ()
    search: str | None = None
    #: Product states and signatures explored (for benchmarks and curiosity).
    explored: tuple[int, int] = (0, 0)
    #: The steps the analysis took, as ``CompatLimits.max_steps`` counts them.
    steps: int = 0

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    def render(self) -> str:
        """The text ``cbcl descriptor diff`` prints: the verdict first."""
        lines = [self.verdict, f"mode: {self.mode} ({_MODE_TEXT[self.mode]})"]
        if self.changes:
            lines.append("changes:")
            lines.extend(f"  {change}" for change in self.changes)
        else:
            lines.append("changes: none")
        for witness in self.witnesses:
            other = "NEW" if witness.accepted_by == "old" else "OLD"
            lines.append(f"witness {witness.intent.value}: accepted by "
                         f"{witness.accepted_by.upper()}, refused by {other}: {witness.text}")
        lines.extend(f"unknown: {reason}" for reason in self.reasons)
        if self.search is not None:
            lines.append(f"search: {self.search}")
        return "\n".join(lines) + "\n"


_MODE_TEXT = {BACKWARD: "NEW accepts every body OLD accepts",
              FORWARD: "OLD accepts every body NEW accepts",
              FULL: "both accept the same bodies"}


class _Unknown(Exception):
    """The analysis cannot decide: the reason, in the report's words."""


# --------------------------------------------------------------------------- hedge terms
#
# A term is a tuple: ("eps",) ("atom", pred) ("any",) ("tree", node) ("ref", rule)
# ("seq", terms) ("alt", terms) ("rep", term, op) ("kset", ((kw pred, term, optional), ...)).
# An atom predicate is ("lit", Symbol|Keyword) or ("kind", NAME). A tree node is a
# _TreeNode (its identity is the tree type).

Term = tuple[Any, ...]
_EPS: Term = ("eps",)


class _TreeNode:
    __slots__ = ("content",)

    def __init__(self, content: Term) -> None:
        self.content = content


def _atom_of(item: Literal | Reference) -> Term:
    if isinstance(item, Literal):
        text = item.text
        return ("atom", ("lit", Keyword(text[1:]) if text.startswith(":") else Symbol(text)))
    if item.name == "value":
        return ("any",)
    return ("atom", ("kind", item.name))


#: A function made iterative: a generator that yields the calls it makes (generators)
#: and is sent their results; :func:`_run` runs it on an explicit stack.
_Call = Generator[Any, Any, Any]


def _run(call: _Call) -> Any:
    """The result of ``call``, its nested calls run on an explicit stack (no Python
    frame per level: a grammar's nesting cannot exhaust the interpreter's stack)."""
    stack = [call]
    value: Any = None
    while True:
        try:
            inner = stack[-1].send(value)
        except StopIteration as stop:
            stack.pop()
            if not stack:
                return stop.value
            value = stop.value
        else:
            stack.append(inner)
            value = None


class _Terms:
    """The hedge terms of one grammar (step 1)."""

    def __init__(self, source: GrammarSource, max_members: int) -> None:
        self.max_members = max_members
        self.rules: dict[str, Term] = {}
        for rule in source.rules:
            self.rules[rule.name] = _run(self.alternatives(rule.alternatives, rule.name))

    def alternatives(self, alternatives: tuple[Alternative, ...], where: str) -> _Call:
        out = []
        for alt in alternatives:
            out.append((yield self.sequence(alt.items, where)))
        return ("alt", tuple(out))

    def sequence(self, items: tuple[Item, ...], where: str) -> _Call:
        stack: list[list[Term]] = [[]]
        for item in items:
            if isinstance(item, Literal) and item.text == "(":
                stack.append([])
            elif isinstance(item, Literal) and item.text == ")":
                if len(stack) == 1:
                    raise _Unknown(f"rule {where}: a ')' at {item.position} closes a list "
                                   f"opened outside its alternative (parentheses not "
                                   f"balanced within one alternative)")
                content = stack.pop()
                stack[-1].append(("tree", _TreeNode(("seq", tuple(content)))))
            else:
                stack[-1].append((yield self.item(item, where)))
        if len(stack) != 1:
            raise _Unknown(f"rule {where}: a '(' is not closed within its alternative "
                           f"(parentheses not balanced within one alternative)")
        return ("seq", tuple(stack[0]))

    def item(self, item: Item, where: str) -> _Call:
        if isinstance(item, Literal):
            if item.text in "()":
                raise _Unknown(f"rule {where}: a parenthesis at {item.position} inside a "
                               f"group or repetition (parentheses not balanced within one "
                               f"alternative)")
            return _atom_of(item)
        if isinstance(item, Reference):
            if item.is_base:
                return _atom_of(item)
            return ("ref", item.name)
        if isinstance(item, Group):
            inner = yield self.alternatives(item.alternatives, where)
            return ("alt", (_EPS, inner)) if item.optional else inner
        if isinstance(item, Repeat):
            return ("rep", (yield self.item(item.item, where)), item.op)
        if isinstance(item, KeywordSet):
            if len(item.members) > self.max_members:
                raise _Unknown(f"rule {where}: a keyword set of {len(item.members)} members "
                               f"(more than max_members, {self.max_members})")
            members = []
            for m in item.members:
                members.append((("lit", Keyword(m.keyword[1:])), (yield self.item(m.item, where)),
                                m.optional))
            return ("kset", tuple(members))
        raise _Unknown(f"rule {where}: an item of an unknown kind")  # pragma: no cover


def _walk_terms(term: Term, into_trees: bool = False) -> Iterator[Term]:
    stack = [term]
    while stack:
        t = stack.pop()
        yield t
        kind = t[0]
        if kind in ("seq", "alt"):
            stack.extend(t[1])
        elif kind == "rep":
            stack.append(t[1])
        elif kind == "kset":
            stack.extend(member[1] for member in t[1])
        elif kind == "tree" and into_trees:
            stack.append(t[1].content)


def _horizontal_refs(term: Term) -> set[str]:
    return {t[1] for t in _walk_terms(term) if t[0] == "ref"}


def _mentions(term: Term, scc: frozenset[str]) -> bool:
    return not _horizontal_refs(term).isdisjoint(scc)


def _linear(term: Term, scc: frozenset[str], last: bool) -> bool:
    """Whether references to ``scc`` occur in ``term`` only in its last (``last``) or
    first position (an explicit stack: no Python frame per level)."""
    stack = [term]
    while stack:
        t = stack.pop()
        kind = t[0]
        if kind == "seq":
            items = t[1]
            if not items:
                continue
            edge = items[-1] if last else items[0]
            rest = items[:-1] if last else items[1:]
            if any(_mentions(r, scc) for r in rest):
                return False
            stack.append(edge)
        elif kind == "alt":
            stack.extend(t[1])
        elif kind == "rep":
            if _mentions(t[1], scc):
                if t[2] != "?":
                    return False
                stack.append(t[1])
        elif kind == "kset" and _mentions(t, scc):
            return False
    return True


def _sccs(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on.discard(member)
                    component.append(member)
                    if member == node:
                        break
                out.append(component)
    return out


# --------------------------------------------------------------------------- atom classes


@dataclass(frozen=True, slots=True)
class _Class:
    """An atom class: its kind, a representative, whether it is one value, and ``fresh``
    (1: a new unnamed keyword at each occurrence; 2: the list's marked keyword)."""

    kind: type
    rep: Value
    point: bool
    fresh: int = 0


def _schema_types(schema: Schema | None) -> Iterator[SchemaType]:
    if schema is None:
        return
    stack: list[SchemaType] = list(schema.records)
    seen: set[int] = set()
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        yield t
        if isinstance(t, Record):
            stack.append(t.keys)
        elif isinstance(t, Keys):
            stack.extend(t.fields.values())
            if t.other is not None:
                stack.append(t.other)
        elif isinstance(t, ListOf):
            stack.append(t.item)


#: Decimal arithmetic on schema bounds and the representatives between them: exact for
#: every number the reader admits (int64 integers, decimals of at most MAX_DECIMAL_CHARS
#: characters) and for representatives of up to MAX_DECIMAL_CHARS places; anything else
#: (a hand-built schema's number) signals, and becomes a DescriptorError.
_DECIMALS = Context(prec=4 * MAX_DECIMAL_CHARS, rounding=ROUND_FLOOR, Emax=999_999,
                    Emin=-999_999, traps=[InvalidOperation, DivisionByZero, Overflow,
                                          Inexact])


def _arithmetic_refused(value: object, why: str) -> DescriptorError:
    if type(value) is int and value.bit_length() > 256:
        shown = f"(an integer of {value.bit_length()} bits)"
    else:
        shown = _clip(str(value), 60)
    return DescriptorError(f"descriptor: the schema bound {shown} cannot be analysed ({why})")


#: The magnitude (a power of ten) of the largest and smallest numbers analysed: far beyond
#: any the reader admits (int64, and 40-character decimals), so only a hand-built
#: schema's numbers are refused.
_MAGNITUDE = 2 * MAX_DECIMAL_CHARS


def _bound(value: Any) -> Any:
    """``value``, a schema's numeric bound, if the analysis can compute with it exactly;
    raises :class:`DescriptorError` otherwise (a non-finite decimal, or one beyond
    10^±:data:`_MAGNITUDE`), before any arithmetic."""
    if type(value) is Decimal:
        if not value.is_finite():
            raise _arithmetic_refused(value, "not a finite number")
        if value and not -2 * _MAGNITUDE <= value.adjusted() <= _MAGNITUDE:
            raise _arithmetic_refused(value, "beyond the numbers a descriptor can hold")
    elif type(value) is int and value.bit_length() > 4 * _MAGNITUDE:
        raise _arithmetic_refused(value, "beyond the numbers a descriptor can hold")
    return value


def _decimal(k: Any) -> Decimal:
    """``k`` (an int or a Decimal) as a decimal written with a point (``3.0``); raises
    :class:`DescriptorError` for a number beyond exact arithmetic."""
    _bound(k)
    try:
        with localcontext(_DECIMALS):
            value = Decimal(k)
            if value.as_tuple().exponent >= 0:  # type: ignore[operator]
                value = value.quantize(_TENTHS)
            return value
    except DecimalException as exc:
        raise _arithmetic_refused(k, type(exc).__name__) from None


_TENTHS = Decimal("0.1")


def _first_free(values: list[Any], start: Any, step: Any, stop: Any) -> Any:
    """The first of ``start``, ``start + step``, … (before ``stop``, if given: towards it)
    that is not in the sorted list ``values``, or ``None``. Costs one bisection and the run
    of consecutive members of ``values`` it skips."""
    k = bisect_left(values, start)
    candidate = start
    if step > 0:
        while k < len(values) and values[k] == candidate:
            candidate += step
            k += 1
            if stop is not None and candidate > stop:
                return None
        return candidate if stop is None or candidate <= stop else None
    k = bisect_right(values, start) - 1
    while k >= 0 and values[k] == candidate:
        candidate += step
        k -= 1
        if stop is not None and candidate < stop:
            return None
    return candidate if stop is None or candidate >= stop else None


def _written(value: Decimal) -> bool:
    """Whether the reader can read ``value`` back (at most MAX_DECIMAL_CHARS characters)."""
    return len(format(value, "f")) <= MAX_DECIMAL_CHARS


def _shortest_beyond(edge: Any, other: Any, ordered: list[Any], direction: int
                     ) -> Decimal | None:
    """The shortest decimal beyond ``edge`` (above it for ``direction`` 1, below for -1),
    strictly before ``other`` if given, not in the sorted list ``ordered``: multiples of
    0.1 first, then of 0.01, and so on. Run in the context :data:`_DECIMALS`."""
    one = Decimal(1)
    rounding = ROUND_FLOOR if direction > 0 else ROUND_CEILING
    for places in range(1, 2 * MAX_DECIMAL_CHARS):
        unit = one.scaleb(-places)
        step = unit if direction > 0 else -unit
        nearest = (Decimal(edge) / unit).to_integral_value(rounding=rounding) * unit + step
        found = _first_free(ordered, nearest.quantize(unit), step, other)
        if found is not None and (other is None or found != other):
            return found  # type: ignore[no-any-return]
    return None


def _near_zero(lo: int, hi: int, points: list[int]) -> int | None:
    """The integer of [lo, hi] nearest 0 (the larger of two as near) that is not in the
    sorted list ``points``, or ``None``."""
    if lo > hi:
        return None
    start = min(max(0, lo), hi)
    up: int | None = _first_free(points, start, 1, hi)
    down: int | None = _first_free(points, start - 1, -1, lo) if start - 1 >= lo else None
    if up is None:
        return down
    if down is None or up - start <= start - down:
        return up
    return down


def _regions(bounds: Iterable[Any]) -> list[tuple[Any, Any]]:
    """The elementary regions cut by ``bounds``: open intervals ``(a, b)`` (``None`` for
    infinite) and points ``(b, b)``."""
    out: list[tuple[Any, Any]] = []
    previous = None
    for b in sorted(set(bounds)):
        out.append((previous, b))
        out.append((b, b))
        previous = b
    out.append((previous, None))
    return out


class _Set:
    """A set of atom classes: their indexes as sorted, disjoint, non-empty half-open
    intervals (every predicate is a few intervals of the ordered classes, see
    :class:`_Atoms`)."""

    __slots__ = ("_hash", "starts", "stops")

    def __init__(self, intervals: Iterable[tuple[int, int]]) -> None:
        merged: list[list[int]] = []
        for a, b in sorted(intervals):
            if a >= b:
                continue
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        self.starts = tuple(a for a, _ in merged)
        self.stops = tuple(b for _, b in merged)
        self._hash = hash((self.starts, self.stops))

    def __contains__(self, index: object) -> bool:
        if type(index) is not int:
            return False
        k = bisect_right(self.starts, index) - 1
        return k >= 0 and index < self.stops[k]

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Set) and self.starts == other.starts \
            and self.stops == other.stops

    def __bool__(self) -> bool:
        return bool(self.starts)

    def __iter__(self) -> Iterator[int]:
        for a, b in zip(self.starts, self.stops, strict=True):
            yield from range(a, b)

    def intervals(self) -> Iterator[tuple[int, int]]:
        return zip(self.starts, self.stops, strict=True)

    def size(self) -> int:
        return sum(b - a for a, b in self.intervals())


_NO_CLASSES = _Set(())
#: The kinds in the order of the class list.
_KIND_ORDER: tuple[type, ...] = (Symbol, Keyword, str, int, Decimal, URI)


def _rep_length(rep: Value) -> int:
    """The length of a representative's text (its text may be too long to write)."""
    try:
        return len(canonical_value(rep))
    except CBCLError:
        return len(str(rep))


def _class_order(c: _Class) -> Any:
    """How classes of one kind are sorted: numbers by value, URIs by scheme, other atoms
    by length; then by text (fresh keywords last)."""
    rep = c.rep
    if c.kind in (int, Decimal):
        return rep
    text = str.__str__(rep)
    if c.kind is URI:
        return (0, text[:text.index(":")], text)
    return (c.fresh, len(text), text)


def _holds(t: AtomType, c: _Class) -> bool:
    """The schema's own test of ``t`` on the representative of ``c``."""
    try:
        return _atom_problem(t, c.rep) is None
    except CBCLError:
        return False


def _pattern_texts(lo: int, hi: int, texts: list[str], avoid: set[Any],
                   limits: CompatLimits) -> list[str]:
    """One string of ``lo`` to ``hi`` characters, not in ``avoid``, for each set of the
    patterns ``texts`` that some string of those lengths matches exactly (matching the
    others of the set not): the string classes of a length region when schemas have
    patterns (spec/conversations.md §2.4), on which every length bound and pattern is
    constant. Found layer by layer (layer L: the product states of the patterns' DFAs
    reached by strings of L characters, each with the shortest first path to it); the
    layers from ``lo`` on are a function of the one before, so once one repeats nothing
    new can come. Raises :class:`_Unknown` past :data:`MAX_WITNESS_STEPS` product steps or
    ``limits.max_atom_chars`` characters, or if a set's only strings found are named
    values."""
    compiled = [compile_pattern(text) for text in texts]
    cuts = sorted({b for p in compiled for b in p.bounds})
    edges = [0, *cuts, MAX_CODE_POINT + 1]
    letters = []
    for i in range(len(edges) - 1):
        cp = representative(edges[i], edges[i + 1] - 1)
        letters.append((cp, tuple(p.class_of(cp) for p in compiled)))
    State = tuple[int, ...]
    layer: dict[State, tuple[State | None, int]] = {tuple(0 for _ in compiled): (None, 0)}
    layers: list[dict[State, tuple[State | None, int]]] = []
    seen: set[frozenset[State]] = set()
    found: dict[tuple[bool, ...], str] = {}
    avoided: set[tuple[bool, ...]] = set()
    steps = 0
    length = 0
    while True:
        layers.append(layer)
        if length >= lo:
            key = frozenset(layer)
            if key in seen:
                break
            seen.add(key)
            for state in layer:
                signature = tuple(s >= 0 and s in p.accepting
                                  for s, p in zip(state, compiled, strict=True))
                if signature in found:
                    continue
                text = _path_text(layers, state)
                if text in avoid:
                    avoided.add(signature)
                else:
                    found[signature] = text
        if length >= hi:
            break
        if length >= limits.max_atom_chars:
            raise _Unknown(f"the string patterns need representatives of more than "
                           f"max_atom_chars ({limits.max_atom_chars}) characters")
        following: dict[State, tuple[State | None, int]] = {}
        for state in layer:
            for cp, ids in letters:
                steps += 1
                if steps > MAX_WITNESS_STEPS:
                    raise _Unknown("partitioning strings by the schemas' patterns takes more "
                                   f"than {MAX_WITNESS_STEPS} steps")
                after = tuple(-1 if s < 0 else p.table[s + c]
                              for s, p, c in zip(state, compiled, ids, strict=True))
                if after not in following:
                    following[after] = (state, cp)
        layer = following
        length += 1
    if avoided - found.keys():
        raise _Unknown("a set of the schemas' string patterns matches only named values "
                       "among the strings tried")
    return list(found.values())


def _path_text(layers: list[dict[tuple[int, ...], tuple[tuple[int, ...] | None, int]]],
               state: tuple[int, ...]) -> str:
    """The string that first reached ``state`` in the last of ``layers``."""
    out: list[str] = []
    current: tuple[int, ...] | None = state
    for layer in reversed(layers[1:]):
        if current is None:  # pragma: no cover (every state past the first has a parent)
            break
        current, cp = layer[current]
        out.append(chr(cp))
    return "".join(reversed(out))


class _Atoms:
    """The partition of step 2 for two descriptors.

    The classes are listed kind by kind (:data:`_KIND_ORDER`), each kind sorted by
    :func:`_class_order`, so that what any predicate of either descriptor holds of is a
    few intervals of the list: a numeric range is found by bisecting values, a length
    bound by bisecting lengths, a scheme by bisecting schemes, a literal or one-of value
    by a dictionary. Each interval found is checked at its ends (and just outside them)
    with the real schema code, so the sets are the real predicates' truth. Building
    them costs O(n log n) in the bounds and named values, never their product."""

    def __init__(self, predicates: set[Term], schemas: list[Schema | None],
                 limits: CompatLimits) -> None:
        points: dict[type, set[Any]] = {t: set() for t in _KIND_ORDER}
        int_bounds: set[Any] = set()
        dec_bounds: set[Any] = set()
        str_lengths: set[int] = set()
        sym_lengths: set[int] = set()
        schemes: set[str] = set()
        patterns: set[str] = set()
        marked = False
        for pred in predicates:
            if pred[0] == "lit":
                points[type(pred[1])].add(pred[1])
        for schema in schemas:
            for t in _schema_types(schema):
                if isinstance(t, AtomType):
                    if t.kind in ("integer", "number"):
                        int_bounds.update(_bound(b) for b in (t.low, t.high) if b is not None)
                    if t.kind in ("decimal", "number"):
                        dec_bounds.update(_bound(b) for b in (t.low, t.high) if b is not None)
                    lengths = {b for b in (t.min_length, t.max_length) if b is not None}
                    if t.kind == "string":
                        str_lengths.update(lengths)
                    elif t.kind == "symbol":
                        sym_lengths.update(lengths)
                    if t.kind == "boolean":
                        points[Symbol].update((Symbol("true"), Symbol("false")))
                    if t.scheme is not None:
                        schemes.add(t.scheme)
                    if t.pattern is not None:
                        patterns.add(t.pattern)
                elif isinstance(t, OneOf):
                    for v in t.values:
                        if type(v) in points:
                            points[type(v)].add(v)
                elif isinstance(t, Keys):
                    points[Keyword].update(k for k in t.fields if type(k) is Keyword)
                    marked = marked or t.other is not None
                elif isinstance(t, Record):
                    points[Symbol].update(h for h in t.heads if type(h) is Symbol)
        points[int] = {v for v in points[int] if INT64_MIN <= v <= INT64_MAX}
        self.points = points
        #: Whether a schema has a string pattern: the string classes are then cut by the
        #: patterns too, and a patterned type is evaluated on each (see _pattern_texts).
        self.patterned = bool(patterns)
        classes: list[_Class] = [_Class(type(v), v, True) for values in points.values()
                                 for v in values]
        int_points = sorted(points[int])
        # integers, cut by the bounds, inside the 64-bit range
        for a, b in _regions(int_bounds):
            if a is not None and a == b:
                if a == math.floor(a) and INT64_MIN <= a <= INT64_MAX:
                    lo = hi = int(a)
                else:
                    continue
            else:
                lo = INT64_MIN if a is None else max(INT64_MIN, math.floor(a) + 1)
                hi = INT64_MAX if b is None else min(INT64_MAX, math.ceil(b) - 1)
            value = _near_zero(lo, hi, int_points)
            if value is not None:
                classes.append(_Class(int, value, False))
        dec_points = sorted(points[Decimal])
        for a, b in _regions(dec_bounds):
            found = self._decimal_in(a, b, points[Decimal], dec_points)
            if found is not None:
                if _written(found):  # (else no decimal the reader reads lies there)
                    classes.append(_Class(Decimal, found, False))
            elif a is None or a != b:  # an open interval of decimals is never empty
                raise _Unknown(f"no representative decimal between {a} and {b}")
        for kind, lengths, low_length in ((str, str_lengths, 0), (Symbol, sym_lengths, 1)):
            for a, b in _regions(lengths):
                if a is not None and a == b:
                    lo = hi = int(a)
                else:
                    lo = 0 if a is None else int(a) + 1
                    hi = (1 << 62) if b is None else int(b) - 1
                lo = max(lo, low_length)
                if lo > hi:
                    continue
                if lo > limits.max_atom_chars:
                    raise _Unknown(f"a schema needs a {kind.__name__.lower()} of at least "
                                   f"{lo} characters (more than max_atom_chars, "
                                   f"{limits.max_atom_chars})")
                if kind is str and patterns:
                    texts = _pattern_texts(lo, hi, sorted(patterns), points[str], limits)
                    classes += [_Class(str, text, False) for text in texts]
                    if not texts and not lo == hi == 0:
                        raise _Unknown(f"no representative string of {lo} to {hi} "
                                       "characters outside the named values")
                    continue
                value = self._text_of(kind, lo, min(hi, lo + 1), points[kind])
                if value is not None:
                    classes.append(_Class(kind, value, False))
                elif not (lo == hi == 0 and kind is str):  # (only "" itself, a point)
                    raise _Unknown(f"no representative {kind.__name__.lower()} of "
                                   f"{lo} to {hi} characters outside the named values")
        classes.append(_Class(Keyword, self.fresh_keyword("k", 0), False, 1))
        if marked:
            classes.append(_Class(Keyword, self.fresh_keyword("m", 0), False, 2))
        for scheme in sorted(schemes):
            uri = self._uri(scheme)
            if uri is not None:
                classes.append(_Class(URI, uri, False))
        other = next(f"x{i}" if i else "x" for i in range(len(schemes) + 1)
                     if (f"x{i}" if i else "x") not in schemes)
        uri = self._uri(other)
        if uri is None:  # pragma: no cover (x, x1, … are schemes)
            raise _Unknown("no representative URI")
        classes.append(_Class(URI, uri, False))
        # (Making them took O(n log n) in the named values and bounds: a descriptor's
        # size bounds that; what follows is bounded by their number.)
        if len(classes) > limits.max_atom_classes:
            raise _Unknown(f"the schemas and grammars need {len(classes)} atom classes "
                           f"(more than max_atom_classes, {limits.max_atom_classes})")
        rank = {kind: k for k, kind in enumerate(_KIND_ORDER)}
        classes.sort(key=lambda c: rank[c.kind])
        self.ranges: dict[type, tuple[int, int]] = {}
        start = 0
        for of_kind in _KIND_ORDER:
            stop = start
            while stop < len(classes) and classes[stop].kind is of_kind:
                stop += 1
            classes[start:stop] = sorted(classes[start:stop], key=_class_order)
            self.ranges[of_kind] = (start, stop)
            start = stop
        self.classes = classes
        self.all = _Set([(0, len(classes))])
        self.keyword_classes = _Set([self.ranges[Keyword]])
        #: (type, value) of each point class -> its index
        self.index = {(c.kind, c.rep): i for i, c in enumerate(classes) if c.point}
        # what the ranges are bisected by, per kind
        self.keys: dict[type, list[Any]] = {}
        for of_kind, (a, b) in self.ranges.items():
            texts = [str.__str__(c.rep) if isinstance(c.rep, str) else "" for c in classes[a:b]]
            if of_kind in (int, Decimal):
                self.keys[of_kind] = [c.rep for c in classes[a:b]]
            elif of_kind is URI:
                self.keys[of_kind] = [text[:text.index(":")] for text in texts]
            elif of_kind in (str, Symbol):
                self.keys[of_kind] = [len(text) for text in texts]
        #: the cost of each class as a witness's atom: one node, then its characters
        self.cost = [_UNIT + min(_rep_length(c.rep), 1000) for c in classes]
        self._cheapest = _RangeMin(self.cost)
        self._sets: dict[Any, _Set] = {}
        self._point_sets: dict[Any, _Set] = {}

    @staticmethod
    def _decimal_in(a: Any, b: Any, avoid: set[Any], ordered: list[Any]) -> Decimal | None:
        """A decimal of the region ``(a, b)`` (or the point ``a == b``) that is not in
        ``avoid`` (``ordered``, sorted): the nearest the region's edge, the shortest."""
        _bound(a)
        _bound(b)
        try:
            with localcontext(_DECIMALS):
                return _Atoms._decimal_between(a, b, avoid, ordered)
        except DecimalException as exc:
            raise _arithmetic_refused(b if a is None else a, type(exc).__name__) from None

    @staticmethod
    def _decimal_between(a: Any, b: Any, avoid: set[Any], ordered: list[Any]
                         ) -> Decimal | None:
        if a is not None and a == b:
            value = _decimal(a)
            return None if value in avoid else value
        one = Decimal(1)
        found: Decimal | None
        if a is None and b is None:
            found = _first_free(ordered, _decimal(0), one, None)
        elif b is None:  # the next integer up, or else the shortest decimal above a
            found = _first_free(ordered, _decimal(math.floor(a) + 1), one, None)
            if found is not None and not _written(found):
                found = _shortest_beyond(a, None, ordered, 1)
        elif a is None:  # the next integer down, or else the shortest decimal below b
            found = _first_free(ordered, _decimal(math.ceil(b) - 1), -one, None)
            if found is not None and not _written(found):
                found = _shortest_beyond(b, None, ordered, -1)
        else:
            found = _shortest_beyond(a, b, ordered, 1)
        if found is None or (a is not None and found <= a) or (b is not None and found >= b):
            return None  # pragma: no cover (a free value always lies past the run)
        return found

    @staticmethod
    def _text_of(kind: type, lo: int, hi: int, avoid: set[Any]) -> Any:
        letters = "abcdefghijklmnopqrstuvwxyz"
        for length in range(lo, hi + 1):
            if length == 0:
                if kind("") not in avoid if kind is str else False:
                    return ""
                continue
            for i in range(len(avoid) + 2):
                text = "x" * (length - 1) + letters[i % 26] if length > 0 else ""
                if i >= 26:
                    text = letters[(i // 26) % 26] + text[1:] if length > 1 else text
                value = kind(text)
                if value not in avoid:
                    return value
        return None

    def _uri(self, scheme: str) -> URI | None:
        for i in range(len(self.points[URI]) + 2):
            try:
                uri = URI(f"{scheme}://w{i}")
            except ValueError:
                return None
            if uri not in self.points[URI]:
                return uri
        return None  # pragma: no cover

    def fresh_keyword(self, stem: str, n: int) -> Keyword:
        """The ``n``-th keyword named ``stem<k>`` that no descriptor names."""
        k = 0
        found = -1
        while True:
            kw = Keyword(f"{stem}{k}")
            k += 1
            if kw not in self.points[Keyword]:
                found += 1
                if found == n:
                    return kw

    def point(self, value: Value) -> _Set:
        """The class of the named value ``value`` (none if it has none)."""
        key = (type(value), value)
        found = self._point_sets.get(key)
        if found is None:
            index = self.index.get(key)
            found = _NO_CLASSES if index is None else _Set([(index, index + 1)])
            self._point_sets[key] = found
        return found

    def kind(self, kind: type) -> _Set:
        return _Set([self.ranges[kind]])

    def grammar_classes(self, pred: Term) -> _Set:
        kind, what = pred
        if kind == "lit":
            return self.point(what)
        if what == NUMBER:
            return _Set([self.ranges[int], self.ranges[Decimal]])
        return self.kind(_KIND_TYPES[what])

    def schema_classes(self, t: AtomType | OneOf) -> _Set:
        found = self._sets.get(id(t))
        if found is None:
            found = self._sets[id(t)] = (self._one_of(t) if isinstance(t, OneOf)
                                         else self._atom_type(t))
        return found

    def _one_of(self, t: OneOf) -> _Set:
        out = []
        for v in t.values:
            found = self.index.get((type(v), v))
            if found is not None:
                if not _one_of(t, self.classes[found].rep):  # pragma: no cover
                    raise _Unknown("a one-of value's class does not satisfy it (an analysis "
                                   "bug; please report it)")
                out.append((found, found + 1))
        return _Set(out)

    def _atom_type(self, t: AtomType) -> _Set:
        """The classes an atom type holds of: per kind it admits, the interval its bounds
        cut (checked at both ends, inside and out, by the schema's own test)."""
        out: list[tuple[int, int]] = []
        for kind in _ATOM_KIND_TYPES[t.kind]:
            start, stop = self.ranges[kind]
            if t.kind == "boolean":
                out += [(i, i + 1) for i in range(start, stop)
                        if self.classes[i].point and self.classes[i].rep in _BOOLEANS]
                continue
            keys = self.keys.get(kind)
            a, b = start, stop
            low: Any = None
            high: Any = None
            if kind in (int, Decimal):
                low, high = t.low, t.high
            elif kind in (str, Symbol):
                low, high = t.min_length, t.max_length
            elif kind is URI:
                low = high = t.scheme
            if kind is str and t.pattern is not None:  # (not an interval by length)
                out += [(i, i + 1) for i in range(start, stop) if _holds(t, self.classes[i])]
                continue
            if keys is not None:
                if low is not None:
                    a = start + bisect_left(keys, low)
                if high is not None:
                    b = start + bisect_right(keys, high)
            if a < b:
                out.append((a, b))
            self._confirm(t, a, b, start, stop)
        return _Set(out)

    def _confirm(self, t: AtomType, a: int, b: int, start: int, stop: int) -> None:
        def holds(i: int) -> bool:
            try:
                return _atom_problem(t, self.classes[i].rep) is None
            except CBCLError:  # (a problem whose message cannot show the value)
                return False

        inside = [i for i in (a, b - 1) if a < b]
        outside = [i for i in (a - 1, b) if start <= i < stop and not a <= i < b]
        if not all(holds(i) for i in inside) or any(holds(i) for i in outside):
            raise _Unknown(f"the classes of {t.describe()} do not agree with the schema "
                           f"(an analysis bug; please report it)")

    def blocks(self, sets: Iterable[_Set], wanted: Iterable[_Set] | None,
               split_keywords: bool) -> tuple[list[int], int]:
        """The classes that no set of ``sets`` tells apart form blocks; one class stands
        for each (its cheapest): those, among the classes in some ``wanted`` set (every
        class if ``None``), with each keyword class a block of its own if
        ``split_keywords``. Also returns the work done (segments swept)."""
        ids: dict[_Set, int] = {}
        for s in sets:
            ids.setdefault(s, len(ids))
        wanted_ids = None if wanted is None else {ids.setdefault(s, len(ids)) for s in wanted}
        events: dict[int, list[int]] = {0: [], len(self.classes): []}
        for s, k in ids.items():
            for a, b in s.intervals():
                events.setdefault(a, []).append(k + 1)
                events.setdefault(b, []).append(-k - 1)
        kw_start, kw_stop = self.ranges[Keyword]
        if split_keywords:
            for i in range(kw_start, kw_stop + 1):
                events.setdefault(i, [])
        positions = sorted(events)
        active: set[int] = set()
        best: dict[Any, int] = {}
        cost = self.cost
        for j in range(len(positions) - 1):
            for change in events[positions[j]]:
                if change > 0:
                    active.add(change - 1)
                else:
                    active.discard(-change - 1)
            a, b = positions[j], positions[j + 1]
            if wanted_ids is not None and wanted_ids.isdisjoint(active):
                continue
            key: Any = frozenset(active)
            if split_keywords and kw_start <= a < kw_stop:
                key = (key, a)
            index = self._cheapest(a, b)
            found = best.get(key)
            if found is None or cost[index] < cost[found]:
                best[key] = index
        return sorted(best.values()), len(positions)


_UNIT = 1 << 32  # a witness's cost: (nodes << 32) + characters
_BOOLEANS = (Symbol("true"), Symbol("false"))
_ATOM_KIND_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "decimal": (Decimal,), "number": (int, Decimal),
    "symbol": (Symbol,), "keyword": (Keyword,), "uri": (URI,), "boolean": (Symbol,),
    "any": _KIND_ORDER}


class _RangeMin:
    """The index of the least value in ``values[a:b]``, in constant time (a sparse table,
    n log n ints)."""

    def __init__(self, values: list[int]) -> None:
        self.values = values
        level = array("l", range(len(values)))
        self.levels = [level]
        width = 1
        while 2 * width <= len(values):
            previous = level
            level = array("l", (previous[i] if values[previous[i]] <= values[
                previous[i + width]] else previous[i + width]
                for i in range(len(values) - 2 * width + 1)))
            self.levels.append(level)
            width *= 2

    def __call__(self, a: int, b: int) -> int:
        k = (b - a).bit_length() - 1
        level = self.levels[k]
        i, j = level[a], level[b - (1 << k)]
        return i if self.values[i] <= self.values[j] else j


_KIND_TYPES: dict[str, type] = {"SYMBOL": Symbol, "KEYWORD": Keyword, "STRING": str,
                                "INTEGER": int, "DECIMAL": Decimal, "URI": URI}


# --------------------------------------------------------------------------- grammar NFAs

_ANY_LABEL = -1  # a move on any value (atom or tree)


class _Builder:
    """Thompson NFAs for the tree types and start rules of both grammars (step 3)."""

    def __init__(self, atoms: _Atoms, limits: CompatLimits) -> None:
        self.atoms = atoms
        self.limit = limits.max_nfa_states
        self.eps: list[list[int]] = []
        #: per state: (classes or None for a tree move, tree type or _ANY_LABEL, target)
        self.moves: list[list[tuple[_Set | None, int, int]]] = []
        self.tree_ids: dict[int, int] = {}  # id(_TreeNode) -> tree type
        self.tree_nodes: list[_TreeNode] = []
        self.tree_bounds: list[tuple[int, int]] = []
        self.uses_value = False
        self._classes: dict[Term, _Set] = {}

    def new(self) -> int:
        if len(self.eps) >= self.limit:
            raise _Unknown(f"the grammars need more than {self.limit} NFA states "
                           f"(max_nfa_states)")
        self.eps.append([])
        self.moves.append([])
        return len(self.eps) - 1

    def tree_type(self, node: _TreeNode, terms: _Terms, pending: list[int]) -> int:
        key = id(node)
        found = self.tree_ids.get(key)
        if found is None:
            found = len(self.tree_nodes)
            self.tree_ids[key] = found
            self.tree_nodes.append(node)
            self.tree_bounds.append((-1, -1))
            pending.append(found)
        return found

    def build_side(self, terms: _Terms, analysis: _Horizontal, starts: Iterable[str],
                   ) -> tuple[dict[str, tuple[int, int]], list[int]]:
        """Build the start rules' hedge NFAs and every tree type they reach; returns the
        start fragments and the tree types made."""
        pending: list[int] = []
        made: list[int] = []
        roots: dict[str, tuple[int, int]] = {}
        for start in starts:
            s, e = self.new(), self.new()
            self.fragment(("ref", start), s, e, terms, analysis, pending)
            roots[start] = (s, e)
        while pending:
            tid = pending.pop()
            made.append(tid)
            s, e = self.new(), self.new()
            self.tree_bounds[tid] = (s, e)
            self.fragment(self.tree_nodes[tid].content, s, e, terms, analysis, pending)
        return roots, made

    def fragment(self, term: Term, start: int, end: int, terms: _Terms,
                 analysis: _Horizontal, pending: list[int]) -> None:
        # An explicit work list: (term, start, end, instances of the rule components that
        # are being inlined).
        work: list[tuple[Term, int, int, dict[int, Any]]] = [(term, start, end, {})]
        while work:
            t, s, e, ctx = work.pop()
            kind = t[0]
            if kind == "eps":
                self.eps[s].append(e)
            elif kind == "atom":
                classes = self._classes.get(t[1])
                if classes is None:
                    classes = self._classes[t[1]] = self.atoms.grammar_classes(t[1])
                self.moves[s].append((classes, 0, e))
            elif kind == "any":
                self.uses_value = True
                self.moves[s].append((self.atoms.all, _ANY_LABEL, e))
            elif kind == "tree":
                self.moves[s].append((None, self.tree_type(t[1], terms, pending), e))
            elif kind == "seq":
                items = t[1]
                if not items:
                    self.eps[s].append(e)
                    continue
                states = [s] + [self.new() for _ in items[1:]] + [e]
                for k, item in enumerate(items):
                    work.append((item, states[k], states[k + 1], ctx))
            elif kind == "alt":
                for branch in t[1]:
                    work.append((branch, s, e, ctx))
            elif kind == "rep":
                inner, op = t[1], t[2]
                if op == "?":
                    self.eps[s].append(e)
                    work.append((inner, s, e, ctx))
                elif op == "*":
                    q = self.new()
                    self.eps[s].append(q)
                    self.eps[q].append(e)
                    work.append((inner, q, q, ctx))
                else:
                    q, r = self.new(), self.new()
                    self.eps[s].append(q)
                    self.eps[r].append(q)
                    self.eps[r].append(e)
                    work.append((inner, q, r, ctx))
            elif kind == "kset":
                self.keyword_set(t[1], s, e, ctx, work)
            else:  # ref
                self.reference(t[1], s, e, ctx, terms, analysis, work)

    def keyword_set(self, members: tuple[Any, ...], s: int, e: int, ctx: dict[int, Any],
                    work: list[Any]) -> None:
        n = len(members)
        required = sum(1 << i for i, m in enumerate(members) if not m[2])
        hubs = [self.new() for _ in range(1 << n)]
        self.eps[s].append(hubs[0])
        for subset in range(1 << n):
            if subset & required == required:
                self.eps[hubs[subset]].append(e)
            for i, (pred, item, _) in enumerate(members):
                if subset >> i & 1:
                    continue
                a = self.new()
                classes = self.atoms.grammar_classes(pred)
                self.moves[hubs[subset]].append((classes, 0, a))
                work.append((item, a, hubs[subset | 1 << i], ctx))

    def reference(self, name: str, s: int, e: int, ctx: dict[int, Any], terms: _Terms,
                  analysis: _Horizontal, work: list[Any]) -> None:
        component = analysis.component[name]
        shape = analysis.shape[component]
        if shape == "plain":
            work.append((terms.rules[name], s, e, ctx))
            return
        instance = ctx.get(component)
        if shape == "right":
            if instance is None:  # entered from outside: all members end at e
                instance = {"exit": e, "entries": {}}
                ctx = {**ctx, component: instance}
            entries = instance["entries"]
            entry = entries.get(name)
            if entry is None:
                entry = entries[name] = self.new()
                work.append((terms.rules[name], entry, instance["exit"], ctx))
            self.eps[s].append(entry)
        else:  # left-linear: all members start at the entry
            if instance is None:
                instance = {"entry": s, "exits": {}}
                ctx = {**ctx, component: instance}
            exits = instance["exits"]
            out = exits.get(name)
            if out is None:
                out = exits[name] = self.new()
                work.append((terms.rules[name], instance["entry"], out, ctx))
            self.eps[out].append(e)


class _Horizontal:
    """How rules refer to one another in sequence position: their components and the
    shape of each (``plain``: not recursive; ``right``/``left``: linear)."""

    def __init__(self, terms: _Terms) -> None:
        graph = {name: _horizontal_refs(term) for name, term in terms.rules.items()}
        self.component: dict[str, int] = {}
        self.shape: list[str] = []
        for k, members in enumerate(_sccs(graph)):
            for name in members:
                self.component[name] = k
            group = frozenset(members)
            recursive = len(members) > 1 or members[0] in graph[members[0]]
            if not recursive:
                self.shape.append("plain")
            elif all(_linear(terms.rules[m], group, True) for m in members):
                self.shape.append("right")
            elif all(_linear(terms.rules[m], group, False) for m in members):
                self.shape.append("left")
            else:
                names = ", ".join(sorted(members)[:4])
                raise _Unknown(f"rule{'s' if len(members) > 1 else ''} {names} refer to "
                               f"themselves in sequence position in a way that may nest "
                               f"(not right- or left-linear outside parentheses), so the "
                               f"body language may not be a regular tree language")


# --------------------------------------------------------------------------- schema automata

_KEY = -1  # a keyword list's state that expects a key


@dataclass(slots=True)
class _Spec:
    classes: _Set
    tree: int | None  # a schema tree type
    any: bool


class _SchemaSide:
    """The schema of one side as deterministic automata (step 3)."""

    def __init__(self, schema: Schema | None, atoms: _Atoms, first_tid: int) -> None:
        self.atoms = atoms
        self.first = first_tid
        self.types: list[tuple[Any, ...]] = []  # ("list", ListOf) ("keys", Keys, heads)
        self.ids: dict[int, int] = {}
        self.specs: dict[int, _Spec] = {}
        self.roots: list[tuple[int, int]] = []  # (prefix tid, record tid), in order
        self.schema = schema
        if schema is None:
            return
        for record in schema.records:
            prefix = self._add(("prefix", record.heads))
            self.roots.append((prefix, _run(self.tid(record))))

    def _add(self, entry: tuple[Any, ...]) -> int:
        self.types.append(entry)
        return self.first + len(self.types) - 1

    # tid() and spec() recurse as the schema's types nest: generators run by _run.

    def tid(self, t: SchemaType) -> _Call:
        found = self.ids.get(id(t))
        if found is None:
            if isinstance(t, ListOf):
                found = self._add(("list", t, (yield self.spec(t.item))))
            elif isinstance(t, Record):
                found = self._add(("keys", t.keys, t.heads))
            elif isinstance(t, Keys):
                found = self._add(("keys", t, ()))
            else:  # pragma: no cover (atoms have no tree type)
                raise TypeError(f"not a list type: {type(t).__name__}")
            self.ids[id(t)] = found
            entry = self.types[found - self.first]
            if entry[0] == "keys":
                keys: Keys = entry[1]
                fields = list(keys.fields)
                specs = []
                for k in fields:
                    specs.append((yield self.spec(keys.fields[k])))
                other = None if keys.other is None else (yield self.spec(keys.other))
                bits = {k: 1 << i for i, k in enumerate(fields)}
                required = 0
                for k in keys.required:
                    required |= bits.get(k, 0)
                self.types[found - self.first] = (
                    "keys", keys, tuple(entry[2]),
                    {k: (bits[k], i) for i, k in enumerate(fields)}, specs, other, required)
        return found

    def spec(self, t: SchemaType) -> _Call:
        key = id(t)
        found = self.specs.get(key)
        if found is not None:
            return found
        if isinstance(t, AtomType) and t.kind == "any":
            found = _Spec(self.atoms.all, None, True)
        elif isinstance(t, (AtomType, OneOf)):
            found = _Spec(self.atoms.schema_classes(t), None, False)
        else:
            found = _Spec(_NO_CLASSES, None, False)
            self.specs[key] = found
            found.tree = yield self.tid(t)
        self.specs[key] = found
        return found

    def initial(self) -> Iterator[tuple[int, Any]]:
        for k, entry in enumerate(self.types):
            yield self.first + k, (0 if entry[0] != "keys" else (0, _KEY, 0, 0, frozenset()))

    @staticmethod
    def matches(spec: _Spec, letter: int | frozenset[int], is_atom: bool) -> bool:
        if is_atom:
            return letter in spec.classes
        return spec.any or spec.tree in letter  # type: ignore[operator]

    def step(self, tid: int, state: Any, letter: Any, is_atom: bool) -> Any:
        entry = self.types[tid - self.first]
        kind = entry[0]
        classes = self.atoms.classes
        if kind == "prefix":
            heads = entry[1]
            if state == len(heads):
                return state
            if is_atom:
                c = classes[letter]
                if c.point and type(c.rep) is Symbol and c.rep == heads[state]:
                    return state + 1
            return None
        if kind == "list":
            t: ListOf = entry[1]
            if not self.matches(entry[2], letter, is_atom):
                return None
            count = state + 1
            if t.max_length is not None:
                return count if count <= t.max_length else None
            return min(count, t.min_length or 0)
        # keys (after heads)
        _, _, heads, table, specs, other, _ = entry
        position, phase, bits, marked, others = state
        if position < len(heads):
            if is_atom:
                c = classes[letter]
                if c.point and type(c.rep) is Symbol and c.rep == heads[position]:
                    return (position + 1, phase, bits, marked, others)
            return None
        if phase == _KEY:
            if not is_atom:
                return None
            c = classes[letter]
            if c.kind is not Keyword:
                return None
            if c.point and c.rep in table:
                bit, index = table[c.rep]
                if bits & bit:
                    return None
                return (position, index, bits | bit, marked, others)
            if other is None:
                return None
            if c.point:
                if c.rep in others:
                    return None
                others = others | {c.rep}
            elif c.fresh == 2:
                if marked:
                    return None
                marked = 1
            return (position, len(specs), bits, marked, others)
        spec = other if phase == len(specs) else specs[phase]
        if not self.matches(spec, letter, is_atom):
            return None
        return (position, _KEY, bits, marked, others)

    def awaited_head(self, tid: int, state: Any) -> int | None:
        """The class of the head symbol the automaton ``tid`` awaits in ``state`` (every
        other letter ends it: -1 if that symbol has no class), or ``None``."""
        entry = self.types[tid - self.first]
        if entry[0] == "prefix":
            heads, at = entry[1], state
        elif entry[0] == "keys":
            heads, at = entry[2], state[0]
        else:
            return None
        if at >= len(heads):
            return None
        return self.atoms.index.get((Symbol, heads[at]), -1)

    def relevant(self, tid: int, state: Any) -> tuple[tuple[_Set, ...], bool]:
        """What :meth:`step` from ``state`` tells atom classes apart by: the sets whose
        members it treats alike (each class outside all of them alike too), and whether
        it tells every keyword class apart (a key of ``(else …)``: each named key is
        remembered)."""
        entry = self.types[tid - self.first]
        kind = entry[0]
        atoms = self.atoms
        if kind == "prefix":
            heads = entry[1]
            return ((atoms.point(heads[state]),) if state < len(heads) else ()), False
        if kind == "list":
            return (() if entry[2].any else (entry[2].classes,)), False
        _, _, heads, table, specs, other, _ = entry
        position, phase, _, _, _ = state
        if position < len(heads):
            return (atoms.point(heads[position]),), False
        if phase == _KEY:
            if other is not None:
                return (), True
            return tuple(atoms.point(key) for key in table), False
        spec = other if phase == len(specs) else specs[phase]
        return (() if spec.any else (spec.classes,)), False

    def accepting(self, tid: int, state: Any) -> bool:
        entry = self.types[tid - self.first]
        kind = entry[0]
        if kind == "prefix":
            return bool(state == len(entry[1]))
        if kind == "list":
            t: ListOf = entry[1]
            return (t.min_length is None or state >= t.min_length)
        position, phase, bits, _, _ = state
        required = entry[6]
        return bool(position == len(entry[2]) and phase == _KEY and bits & required == required)

    def root_accepts(self, letter: Any, is_atom: bool) -> bool:
        if is_atom or self.schema is None:
            return True
        for prefix, record in self.roots:
            if prefix in letter:
                return bool(record in letter)
        return True


# --------------------------------------------------------------------------- determinisation


@dataclass(slots=True)
class _Side:
    descriptor: ProtocolDescriptor
    source: GrammarSource
    schema: Schema | None
    terms: _Terms | None = None
    roots: dict[str, tuple[int, int]] = field(default_factory=dict)
    trees: list[int] = field(default_factory=list)
    schema_side: _SchemaSide | None = None


class _Product:
    """Step 4: the reachable product states and signatures."""

    def __init__(self, builder: _Builder, schemas: list[_SchemaSide], driving: set[int],
                 prune: bool, limits: CompatLimits) -> None:
        self.b = builder
        self.schemas = schemas
        self.limits = limits
        self.atoms = builder.atoms
        self.closures: dict[int, frozenset[int]] = {}
        self.end_of: dict[int, int] = {e: tid for tid, (_, e) in enumerate(builder.tree_bounds)}
        self.driving = driving
        self.prune = prune
        self.owner: dict[int, _SchemaSide] = {}
        for side in schemas:
            for k in range(len(side.types)):
                self.owner[side.first + k] = side
        self.owner_step = {tid: side.step for tid, side in self.owner.items()}
        self.states: dict[Any, int] = {}
        self.state_list: list[Any] = []
        self.parent: list[tuple[int, Any] | None] = []
        self.sigs: dict[frozenset[int], int] = {}
        self.sig_list: list[frozenset[int]] = []
        self.sig_origin: list[int] = []
        self.sig_of: list[int] = []  # product state -> its signature
        self.edges: list[tuple[int, Any, bool, int]] = []
        #: tree type -> product states whose covered side moves on it / signatures holding it
        self.waiting: dict[int, list[int]] = {}
        self.holding: dict[int, list[int]] = {}
        self.size: list[int] = []
        self.steps = 0
        self._letters: dict[Any, list[int]] = {}
        self._splits: dict[frozenset[tuple[int, Any]],
                           tuple[dict[int, list[tuple[int, Any]]], list[tuple[int, Any]]]] = {}

    def count(self, work: int) -> None:
        """Add ``work`` to the steps done; over ``max_steps``, the answer is unknown."""
        self.steps += work
        if self.steps > self.limits.max_steps:
            raise _Unknown(f"the comparison needs more than {self.limits.max_steps} steps "
                           f"(max_steps)")

    def atom_letters(self, hstate: Any) -> list[int]:
        """The atom classes worth trying from ``hstate``: one per block of classes that
        its automata cannot tell apart (so each leads to one target), among those some
        state of the covered side moves on when pruning."""
        gstates, sstates = hstate
        moves = self.b.moves
        sets: set[_Set] = set()
        wanted: set[_Set] | None = set() if self.prune else None
        driving = self.driving
        for state in gstates:
            for on, tree, _ in moves[state]:
                if on is not None and tree != _ANY_LABEL:
                    sets.add(on)
                    if wanted is not None and state in driving:
                        wanted.add(on)
        split = False
        owner = self.owner
        for tid, local in sstates:
            found, splits = owner[tid].relevant(tid, local)
            sets.update(found)
            split = split or splits
        self.count(len(gstates) + len(sstates))
        if wanted is not None and not wanted:
            return []
        key = (frozenset(sets), None if wanted is None else frozenset(wanted), split)
        letters = self._letters.get(key)
        if letters is None:
            letters, work = self.atoms.blocks(sets, wanted, split)
            self.count(work)
            self._letters[key] = letters
        return letters

    def closure(self, states: Iterable[int]) -> frozenset[int]:
        out: set[int] = set()
        for s in states:
            found = self.closures.get(s)
            if found is None:
                seen = {s}
                stack = [s]
                while stack:
                    for t in self.b.eps[stack.pop()]:
                        if t not in seen:
                            seen.add(t)
                            stack.append(t)
                found = self.closures[s] = frozenset(seen)
            out |= found
        return frozenset(out)

    def move(self, gstates: frozenset[int], letter: Any, is_atom: bool) -> frozenset[int]:
        out: list[int] = []
        moves = self.b.moves
        for s in gstates:
            for classes, tree, target in moves[s]:
                if classes is not None:
                    if tree == _ANY_LABEL or (is_atom and letter in classes):
                        out.append(target)
                elif not is_atom and tree in letter:
                    out.append(target)
        return self.closure(out) if out else frozenset()

    def schema_split(self, sstates: frozenset[tuple[int, Any]]
                     ) -> tuple[dict[int, list[tuple[int, Any]]], list[tuple[int, Any]]]:
        """``sstates`` in two: the automata that await a record's head symbol, by the
        class of that symbol (every other letter ends them), and the others."""
        found = self._splits.get(sstates)
        if found is None:
            waiting: dict[int, list[tuple[int, Any]]] = {}
            rest: list[tuple[int, Any]] = []
            for tid, local in sstates:
                head = self.owner[tid].awaited_head(tid, local)
                if head is None:
                    rest.append((tid, local))
                else:
                    waiting.setdefault(head, []).append((tid, local))
            self.count(len(sstates))
            found = self._splits[sstates] = (waiting, rest)
        return found

    def step(self, hstate: Any, letter: Any, is_atom: bool) -> Any:
        gstates, sstates = hstate
        g = self.move(gstates, letter, is_atom)
        if self.prune and g.isdisjoint(self.driving):
            return None
        waiting, rest = self.schema_split(sstates)
        alive = rest + waiting.get(letter, []) if is_atom else rest
        self.count(len(alive))
        s = []
        steps = self.owner_step
        for tid, local in alive:
            nxt = steps[tid](tid, local, letter, is_atom)
            if nxt is not None:
                s.append((tid, nxt))
        return (g, frozenset(s))

    def signature(self, hstate: Any) -> frozenset[int]:
        gstates, sstates = hstate
        sig = {self.end_of[s] for s in gstates if s in self.end_of}
        sig.update(tid for tid, local in sstates if self.owner[tid].accepting(tid, local))
        return frozenset(sig)

    def run(self) -> None:
        starts = [s for s, _ in self.b.tree_bounds]
        sstates = frozenset((tid, local) for side in self.schemas for tid, local in
                            side.initial())
        initial = (self.closure(starts), sstates)
        queue: list[tuple[int, Any, bool]] = []
        self._add(initial, None, queue)
        while queue:
            h, letter, is_atom = queue.pop()
            hstate = self.state_list[h]
            self.count(1 + len(hstate[0]))
            target = self.step(hstate, letter if is_atom else self.sig_list[letter], is_atom)
            if target is None:
                continue
            t = self.states.get(target)
            if t is None:
                t = self._add(target, (h, (letter, is_atom)), queue)
            self.edges.append((h, letter, is_atom, t))
        self._settle()

    def _settle(self) -> None:
        """Smallest witnesses: Knuth's generalisation of Dijkstra's algorithm over the
        recorded transitions (a product state costs the nodes of the children that reach
        it; a signature costs one more than its cheapest product state)."""
        infinite = float("inf")
        # A cost is (nodes << 32) + characters: fewest nodes first, then the shortest text.
        unit = _UNIT
        atom_cost = self.atoms.cost
        cost: list[float] = [infinite] * len(self.state_list)
        size: list[float] = [infinite] * len(self.sig_list)
        done_h = [False] * len(self.state_list)
        done_s = [False] * len(self.sig_list)
        out: dict[int, list[tuple[Any, bool, int]]] = {}
        uses: dict[int, list[tuple[int, int]]] = {}
        for h, letter, is_atom, t in self.edges:
            out.setdefault(h, []).append((letter, is_atom, t))
            if not is_atom:
                uses.setdefault(letter, []).append((h, t))
        heap: list[tuple[float, int, int]] = [(0, 0, 0)]
        cost[0] = 0
        parent = self.parent

        def relax(t: int, c: float, via: tuple[int, Any]) -> None:
            if c < cost[t]:
                cost[t] = c
                parent[t] = via
                heapq.heappush(heap, (c, 0, t))

        while heap:
            c, kind, x = heapq.heappop(heap)
            if kind == 0:
                if done_h[x]:
                    continue
                done_h[x] = True
                k = self.sig_of[x]
                if c + unit + 2 < size[k]:
                    size[k] = c + unit + 2
                    self.sig_origin[k] = x
                    heapq.heappush(heap, (c + unit + 2, 1, k))
                for letter, is_atom, t in out.get(x, ()):
                    if is_atom:
                        relax(t, c + atom_cost[letter], (x, (letter, True)))
                    elif done_s[letter]:
                        relax(t, c + size[letter], (x, (letter, False)))
            else:
                if done_s[x]:
                    continue
                done_s[x] = True
                for h, t in uses.get(x, ()):
                    if done_h[h]:
                        relax(t, cost[h] + size[x], (h, (x, False)))
        self.size = [int(v) for v in size]

    def _add(self, hstate: Any, parent: tuple[int, Any] | None,
             queue: list[tuple[int, Any, bool]]) -> int:
        limits = self.limits
        if len(self.state_list) >= limits.max_states:
            raise _Unknown(f"the comparison needs more than {limits.max_states} product "
                           f"states (max_states)")
        h = len(self.state_list)
        self.states[hstate] = h
        self.state_list.append(hstate)
        self.parent.append(parent)
        atom_letters = self.atom_letters(hstate)
        if self.prune:
            # Only letters that some state of the covered side moves on can lead anywhere
            # (every other target is pruned): its atom classes (atom_letters keeps only
            # those), and the signatures holding one of its tree types (now, and as they
            # are found).
            trees: set[int] = set()
            moves = self.b.moves
            for state in hstate[0] & self.driving:
                for on, tree, _ in moves[state]:
                    if on is None:
                        trees.add(tree)
            queue.extend((h, c, True) for c in atom_letters)
            for tree in trees:
                self.waiting.setdefault(tree, []).append(h)
            wanted = {k for tree in trees for k in self.holding.get(tree, ())}
            queue.extend((h, k, False) for k in sorted(wanted))
        else:
            queue.extend((h, c, True) for c in atom_letters)
            queue.extend((h, k, False) for k in range(len(self.sig_list)))
        sig = self.signature(hstate)
        if sig not in self.sigs:
            if len(self.sig_list) >= limits.max_states:
                raise _Unknown(f"the comparison needs more than {limits.max_states} "
                               f"signatures (max_states)")
            k = len(self.sig_list)
            self.sigs[sig] = k
            self.sig_list.append(sig)
            self.sig_origin.append(h)
            if self.prune:
                for tree in sig:
                    self.holding.setdefault(tree, []).append(k)
                waiting = {g for tree in sig for g in self.waiting.get(tree, ())}
                queue.extend((g, k, False) for g in sorted(waiting))
            else:
                queue.extend((g, k, False) for g in range(len(self.state_list)))
        self.sig_of.append(self.sigs[sig])
        return h

    # ---- witnesses

    def path(self, h: int) -> list[tuple[Any, bool]]:
        letters: list[tuple[Any, bool]] = []
        while True:
            parent = self.parent[h]
            if parent is None:
                break
            h, letter = parent
            letters.append(letter)
        letters.reverse()
        return letters

    def witness(self, letter: Any, is_atom: bool) -> Value:
        if is_atom:
            return self._atom(letter, [0])
        built: dict[int, Value] = {}
        stack = [letter]
        while stack:
            k = stack[-1]
            if k in built:
                stack.pop()
                continue
            letters = self.path(self.sig_origin[k])
            missing = [x for x, is_atom in letters if not is_atom and x not in built]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            fresh = [0]
            built[k] = tuple(self._atom(x, fresh) if is_atom else built[x]
                             for x, is_atom in letters)
        return built[letter]

    def _atom(self, k: int, fresh: list[int]) -> Value:
        c = self.atoms.classes[k]
        if c.fresh == 1:
            fresh[0] += 1
            return self.atoms.fresh_keyword("k", fresh[0])
        return c.rep


# --------------------------------------------------------------------------- the comparison


def _as_descriptor(value: ProtocolDescriptor | bytes) -> ProtocolDescriptor:
    if isinstance(value, ProtocolDescriptor):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return read_descriptor(bytes(value))
    raise TypeError(f"expected a ProtocolDescriptor or its bytes, got {type(value).__name__}")


def _side(descriptor: ProtocolDescriptor, grammar_limits: GrammarLimits | None) -> _Side:
    source = read_grammar(descriptor.grammar, limits=grammar_limits,
                          starts=descriptor.start_rules)
    schema = None if descriptor.schema is None else compile_schema(descriptor.schema)
    return _Side(descriptor, source, schema)


class _Checker:
    """The real recognisers of one side, compiled on first use (for re-checks) by
    ``compile`` (default: :func:`~cbcl.grammar._compile.compile_grammar`, in this process)."""

    def __init__(self, descriptor: ProtocolDescriptor, compile: Compile | None = None,
                 grammar_limits: GrammarLimits | None = None) -> None:
        self.descriptor = descriptor
        self.protocol: Any = None
        self.compile = compile
        self.grammar_limits = grammar_limits
        self._compiled: CompiledGrammar | None = None

    def compiled(self) -> CompiledGrammar:
        if self._compiled is None:
            if self.compile is not None:
                compiled = self.compile(self.descriptor)
                if not isinstance(compiled, CompiledGrammar):
                    raise TypeError("compile must return a CompiledGrammar")
            else:

                compiled = compile_grammar(self.descriptor.grammar, self.grammar_limits,
                                           starts=self.descriptor.start_rules)
            self._compiled = compiled
        return self._compiled

    def lr_verdict(self, source: GrammarSource) -> str:
        """The grammar's LR verdict: the compiled grammar's with ``compile``, else the
        analysis alone (cheaper than compiling, in this process)."""
        if self.compile is not None:
            return self.compiled().verdict
        try:
            return analyse(to_cfg(source)).verdict
        except GrammarError as exc:  # over an analysis budget
            return f"not analysed ({exc.message})"

    def accepts(self, intent: Intent, body: Value) -> bool:

        if self.protocol is None:
            compiled = self.compiled()
            if compiled.tables is None:
                raise _Unknown(f"the grammar of {self.descriptor.id} version "
                               f"{self.descriptor.version} is {compiled.verdict}, not "
                               f"LALR(1): its bodies cannot be re-checked")
            self.protocol = Protocol.from_compiled(self.descriptor, compiled)
        if intent not in self.descriptor.intents:
            return False
        message = Message(message_id="diff", sender=URI("agent://diff/a"),
                          receiver=URI("agent://diff/b"), intent=intent,
                          protocol=self.descriptor.id, body=body)
        try:
            return check_intent_and_body(self.protocol, message) is True
        except CBCLError:
            return False


def _readable(body: Value) -> Value | None:
    """``body`` as the real reader reads its canonical text (None if it cannot)."""
    try:
        return read(canonical_value(body).encode("utf-8"), limits=DEFAULT_LIMITS)
    except (CBCLError, TypeError, ValueError):
        return None


def diff_descriptors(old: ProtocolDescriptor | bytes, new: ProtocolDescriptor | bytes, *,
                     mode: str = BACKWARD, limits: CompatLimits | None = None,
                     compile: Compile | None = None,
                     grammar_limits: GrammarLimits | None = None) -> CompatReport:
    """Compare two descriptors (read, or their exact bytes) for ``mode``: ``backward``
    (NEW accepts every body OLD accepts, intent by intent), ``forward`` (the reverse) or
    ``full`` (both).

    ``compile``: how a descriptor's grammar is compiled for the recognisers that re-check
    witnesses (called at most once per side, with the descriptor; it returns a
    :class:`~cbcl.grammar._compile.CompiledGrammar` or raises). By default both grammars are
    compiled in this process, when a re-check needs them — right for the caller's own
    files (``cbcl descriptor diff``). A registry passes its guarded, cached compile
    (:meth:`Registry.compiled`): then both grammars are compiled through it *before*
    anything else reads them, their LR verdicts are the compiled ones, and no grammar is
    analysed in this process unless ``compile`` has accepted it. ``grammar_limits`` bound
    the grammars as they are read (default :class:`GrammarLimits`).

    Returns a :class:`CompatReport`: ``compatible`` only with a proof, ``breaking`` with a
    re-checked witness per failing intent, or ``unknown`` with the reasons and the bounded
    search made. Raises :class:`DescriptorError` or :class:`GrammarError` for a descriptor
    or grammar that cannot be read, whatever ``compile`` raises, ``ValueError`` for an
    unknown mode and ``TypeError`` for arguments of the wrong type.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    limits = CompatLimits() if limits is None else limits
    if not isinstance(limits, CompatLimits):
        raise TypeError(f"limits must be CompatLimits, got {type(limits).__name__}")
    if compile is not None and not callable(compile):
        raise TypeError("compile must be a function of a ProtocolDescriptor")
    if grammar_limits is not None and not isinstance(grammar_limits, GrammarLimits):
        raise TypeError(f"grammar_limits must be GrammarLimits, got "
                        f"{type(grammar_limits).__name__}")
    old_d, new_d = _as_descriptor(old), _as_descriptor(new)
    report = _diff_bodies(old_d, new_d, mode, limits, compile, grammar_limits)
    return _with_constraints(report, old_d, new_d, mode)


def _diff_bodies(old_d: ProtocolDescriptor, new_d: ProtocolDescriptor, mode: str,
                 limits: CompatLimits, compile: Compile | None,
                 grammar_limits: GrammarLimits | None) -> CompatReport:
    """:func:`diff_descriptors` of the grammars and schemas (the constraints aside)."""
    checkers = [_Checker(old_d, compile, grammar_limits),
                _Checker(new_d, compile, grammar_limits)]
    if compile is not None:
        for checker in checkers:  # the guarded compile sees each grammar first
            checker.compiled()
    sides = [_side(old_d, grammar_limits), _side(new_d, grammar_limits)]
    changes = tuple(_changes(sides[0], sides[1]))
    directions = [(0, 1)] if mode == BACKWARD else [(1, 0)] if mode == FORWARD \
        else [(0, 1), (1, 0)]
    meter = [0]
    try:
        witnesses, explored = _decide(sides, directions, checkers, limits, meter)
    except _Unknown as exc:
        reason = str(exc)
        try:
            found, search = _search(sides, directions, checkers, limits)
        except _Unknown as inner:
            found, search = [], f"not made: {inner}"
        if found:
            return CompatReport(BREAKING, mode, changes, tuple(found), (), None,
                                steps=meter[0])
        return CompatReport(UNKNOWN, mode, changes, (), (reason,), search, steps=meter[0])
    if not witnesses:
        for side, checker in zip(sides, checkers, strict=True):
            # The model of §4.3 (no literal/terminal overlap) must hold.
            lr_verdict = checker.lr_verdict(side.source)
            if lr_verdict != LALR1:
                d = side.descriptor
                return CompatReport(UNKNOWN, mode, changes, (), (
                    f"the grammar of {d.id} version {d.version} is {lr_verdict}, not "
                    f"LALR(1): it cannot be loaded, and its bodies are not what the "
                    f"analysis assumed",), "not made", explored, meter[0])
    verdict = BREAKING if witnesses else COMPATIBLE
    return CompatReport(verdict, mode, changes, tuple(witnesses), (), None, explored,
                        meter[0])


_RANK = {COMPATIBLE: 0, UNKNOWN: 1, BREAKING: 2}


def _with_constraints(report: CompatReport, old: ProtocolDescriptor, new: ProtocolDescriptor,
                      mode: str) -> CompatReport:
    """``report`` with the constraints compared (spec/conversations.md §5.5): a rule of the
    covering side that the covered side's rules for the same intent do not imply makes the
    verdict ``breaking`` (a stateless rule: it is there to refuse bodies) or ``unknown``
    (one that reads earlier messages: that depends on the conversation). Implied means
    the same check as a rule of the other side (canonically), ``true``, an ``and`` of
    implied checks or an ``or`` with one."""
    rules = [_rules_of(old), _rules_of(new)]
    changes: list[str] = []
    olds = {r[0]: r for r in rules[0]}
    news = {r[0]: r for r in rules[1]}
    for name, rule in olds.items():
        if name not in news:
            changes.append(f"constraint removed: {name} ({' '.join(rule[1])}): "
                           f"{_clip(rule[2])}")
    for name, rule in news.items():
        if name not in olds:
            changes.append(f"constraint added: {name} ({' '.join(rule[1])}): "
                           f"{_clip(rule[2])}")
        elif olds[name][1:3] != rule[1:3]:
            changes.append(f"constraint changed: {name}: {_clip(olds[name][2])}  =>  "
                           f"{_clip(rule[2])}")
    directions = [(0, 1)] if mode == BACKWARD else [(1, 0)] if mode == FORWARD \
        else [(0, 1), (1, 0)]
    verdict, reasons = COMPATIBLE, []
    for covered, covering in directions:
        governed = (old, new)[covered].intents
        by_intent: dict[str, set[str]] = {}
        for _, intents, check, _, _ in rules[covered]:
            for intent in intents:
                by_intent.setdefault(intent, set()).add(check)
        side = ("OLD", "NEW")[covering]
        for name, intents, _, value, stateful in rules[covering]:
            for intent in intents:
                if Intent(intent) not in governed or \
                        _implied(value, by_intent.get(intent, set())):
                    continue
                if stateful:
                    verdict = verdict if verdict == BREAKING else UNKNOWN
                    reasons.append(f"{side}'s constraint {name} reads earlier messages "
                                   f"({intent}): whether the other side's rules imply it "
                                   "depends on the conversation")
                else:
                    verdict = BREAKING
                    changes.append(f"breaking: {side}'s constraint {name} refuses {intent} "
                                   "bodies the other side's rules do not refuse")
                break
    if not changes and verdict == COMPATIBLE:
        return report
    final = verdict if _RANK[verdict] > _RANK[report.verdict] else report.verdict
    kept = report.reasons if report.verdict == final else ()
    return dataclasses.replace(report, verdict=final, changes=(*report.changes, *changes),
                               reasons=(*kept, *reasons) if final == UNKNOWN else kept)


def _rules_of(descriptor: ProtocolDescriptor,
              ) -> list[tuple[str, tuple[str, ...], str, Value, bool]]:
    """Each rule as (name, intents, canonical check, check, whether it reads earlier
    messages)."""
    if descriptor.constraints is None:
        return []
    compiled = read_constraints(descriptor.constraints, intents=descriptor.intents,
                                functions=descriptor.functions,
                                conversation=descriptor.conversation is not None)
    return [(r.name, tuple(i.value for i in r.intents), canonical_value(r.check), r.check,
             bool(r.earlier)) for r in compiled.rules]


def _implied(check: Value, by: set[str]) -> bool:
    """Whether ``check`` holds wherever all the checks ``by`` (canonical) hold, as far as
    their text shows (depth: at most the 32 calls a check may nest)."""
    if check == Symbol("true") or canonical_value(check) in by:
        return True
    if type(check) is tuple and check and check[0] in (Symbol("and"), Symbol("or")):
        parts = [_implied(part, by) for part in check[1:]]
        return all(parts) if check[0] == Symbol("and") else any(parts)
    return False


def _decide(sides: list[_Side], directions: list[tuple[int, int]], checkers: list[_Checker],
            limits: CompatLimits, meter: list[int]) -> tuple[list[Witness], tuple[int, int]]:
    """Steps 1 to 5; ``meter[0]`` is left holding the steps taken (also when a limit
    ends the analysis)."""
    products: list[_Product] = []
    try:
        return _decide_with(sides, directions, checkers, limits, products)
    finally:
        if products:
            meter[0] = products[0].steps


def _decide_with(sides: list[_Side], directions: list[tuple[int, int]],
                 checkers: list[_Checker], limits: CompatLimits, products: list[_Product]
                 ) -> tuple[list[Witness], tuple[int, int]]:
    for side in sides:
        side.terms = _Terms(side.source, limits.max_members)
    predicates: set[Term] = set()
    for side in sides:
        assert side.terms is not None
        for term in side.terms.rules.values():
            for t in _walk_terms(term, into_trees=True):
                if t[0] == "atom":
                    predicates.add(t[1])
                elif t[0] == "kset":
                    predicates.update(member[0] for member in t[1])
    atoms = _Atoms(predicates, [side.schema for side in sides], limits)
    builder = _Builder(atoms, limits)
    driving_sides = {a for a, _ in directions}
    driving: set[int] = set()
    prune = True
    for k, side in enumerate(sides):
        assert side.terms is not None
        analysis = _Horizontal(side.terms)
        before = len(builder.eps)
        builder.uses_value = False
        side.roots, side.trees = builder.build_side(side.terms, analysis,
                                                    side.descriptor.start_rules)
        if k in driving_sides:
            driving.update(range(before, len(builder.eps)))
            # Under a `value` of the covered side any tree may stand: explore them all.
            prune = prune and not builder.uses_value
    first = len(builder.tree_bounds)
    schema_sides: list[_SchemaSide] = []
    for side in sides:
        schema_side = _SchemaSide(side.schema, atoms, first)
        first += len(schema_side.types)
        side.schema_side = schema_side
        schema_sides.append(schema_side)
    product = _Product(builder, schema_sides, driving, prune, limits)
    products.append(product)
    product.run()
    sizes = product.size
    verdicts: dict[tuple[int, str, Any, bool], bool] = {}

    def accepts(k: int, intent: Intent, letter: Any, is_atom: bool) -> bool:
        side = sides[k]
        rule = side.descriptor.starts.get(intent)
        if rule is None:
            return False
        key = (k, rule, letter, is_atom)
        found = verdicts.get(key)
        if found is None:
            s, e = side.roots[rule]
            value = letter if is_atom else product.sig_list[letter]
            start = product.closure((s,))
            product.count(1 + len(start))
            assert side.schema_side is not None
            found = verdicts[key] = e in product.move(start, value, is_atom) and \
                side.schema_side.root_accepts(value, is_atom)
        return found

    def body_atoms(intent: Intent, a: int, b: int) -> list[int]:
        """The atom classes worth trying as a whole body: one per block of those the two
        start rules cannot tell apart, among those the covered side's moves take."""
        sets: set[_Set] = set()
        wanted: set[_Set] | None = set()
        for k in (a, b):
            rule = sides[k].descriptor.starts.get(intent)
            if rule is None:
                continue
            for state in product.closure((sides[k].roots[rule][0],)):
                for on, tree, _ in builder.moves[state]:
                    if on is None:
                        continue
                    if tree == _ANY_LABEL:
                        if k == a:
                            wanted = None
                        continue
                    sets.add(on)
                    if k == a and wanted is not None:
                        wanted.add(on)
        if wanted is not None and not wanted:
            return []
        letters, work = atoms.blocks(sets, wanted, False)
        product.count(work)
        return letters

    witnesses: list[Witness] = []
    for a, b in directions:
        for intent in sides[a].descriptor.intents:
            best: tuple[int, Any, bool] | None = None
            letters: list[tuple[Any, bool]] = [(c, True) for c in body_atoms(intent, a, b)]
            letters += [(k, False) for k in range(len(product.sig_list))]
            for letter, is_atom in letters:
                if accepts(a, intent, letter, is_atom) and not accepts(
                        b, intent, letter, is_atom):
                    size = atoms.cost[letter] if is_atom else sizes[letter]
                    if best is None or size < best[0]:
                        best = (size, letter, is_atom)
            if best is None:
                continue
            size, letter, is_atom = best
            size >>= 32
            if size > limits.max_witness_nodes:
                raise _Unknown(f"the smallest witness for {intent.value} has {size} nodes "
                               f"(more than max_witness_nodes, {limits.max_witness_nodes})")
            body = product.witness(letter, is_atom)
            witness = _confirm(intent, body, a, b, checkers)
            if witness is None:
                raise _Unknown(f"the witness found for {intent.value}, "
                               f"{_clip(canonical_value(body))}, was not confirmed by the "
                               f"recognisers (an analysis bug; please report it)")
            witnesses.append(witness)
    return witnesses, (len(product.state_list), len(product.sig_list))


def _confirm(intent: Intent, body: Value, a: int, b: int,
             checkers: list[_Checker]) -> Witness | None:
    read_back = _readable(body)
    if read_back is None:
        return None
    if checkers[a].accepts(intent, read_back) and not checkers[b].accepts(intent, read_back):
        return Witness(intent, read_back, canonical_value(read_back), "old" if a == 0 else "new")
    return None


def _clip(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


# --------------------------------------------------------------------------- bounded search


def generate_bodies(source: GrammarSource, start: str, count: int, depth: int,
                    seed: int = 0, atoms: dict[str, list[Value]] | None = None,
                    max_tokens: int = 2_000, max_total: int | None = None,
                    ) -> Iterator[Value]:
    """Up to ``count`` bodies derived from rule ``start`` of ``source`` by a random walk
    (``seed``), taking the shortest way out of rules nested more than ``depth`` deep.
    ``atoms`` gives the values tried for each base terminal. A derivation is abandoned
    after ``max_tokens`` items, and bodies that are not one value are skipped; at most
    ``2 * count`` derivations, and ``max_total`` items in all (default ``100 * count``),
    are tried."""
    rng = random.Random(seed)
    rules = {rule.name: rule for rule in source.rules}
    height = derivation_heights(source)
    pool = dict(_DEFAULT_ATOMS)
    if atoms:
        for key, values in atoms.items():
            if values:
                pool[key] = pool.get(key, []) + list(values)

    heights: dict[int, int] = {}

    def alt_height(alt: Alternative) -> int:
        found = heights.get(id(alt))
        if found is None:
            found = heights[id(alt)] = sequence_height(alt.items, height)
        return found

    def emit(items: tuple[Item, ...], level: int, out: list[Any], budget: list[int]) -> None:
        # An explicit stack of (items, next index, rule nesting): the derivation runs in
        # the order a recursive walk takes (each item's expansion before the next item),
        # drawing from ``rng`` in that order, with no Python frame per nesting level.
        frames: list[list[Any]] = [[items, 0, level]]
        while frames:
            frame = frames[-1]
            sequence, index, level = frame
            if index == len(sequence):
                frames.pop()
                continue
            frame[1] = index + 1
            item = sequence[index]
            if isinstance(item, KeywordMember):  # one member of a keyword set, in turn
                if item.optional and rng.random() < 0.5:
                    continue
                out.append(Keyword(item.keyword[1:]))
                frames.append([(item.item,), 0, level])
                continue
            budget[0] -= 1
            if budget[0] < 0:
                raise _TooBig
            if isinstance(item, Literal):
                text = item.text
                out.append(_Paren(text) if text in "()" else
                           Keyword(text[1:]) if text.startswith(":") else Symbol(text))
            elif isinstance(item, Reference):
                if item.name == "value":
                    out.append(rng.choice(pool["value"]))
                elif item.name == NUMBER:
                    out.append(rng.choice(pool["INTEGER"] + pool["DECIMAL"]))
                elif item.is_base:
                    out.append(rng.choice(pool[item.name]))
                else:
                    rule = rules[item.name]
                    alts = rule.alternatives
                    if level >= depth:
                        least = min(alt_height(a) for a in alts)
                        alts = tuple(a for a in alts if alt_height(a) == least)
                    frames.append([rng.choice(alts).items, 0, level + 1])
            elif isinstance(item, Group):
                if item.optional and rng.random() < 0.5:
                    continue
                alts = item.alternatives
                if level >= depth:
                    least = min(alt_height(a) for a in alts)
                    alts = tuple(a for a in alts if alt_height(a) == least)
                frames.append([rng.choice(alts).items, 0, level])
            elif isinstance(item, Repeat):
                low = 1 if item.op == "+" else 0
                high = 1 if item.op == "?" else (low if level >= depth else 3)
                times = rng.randint(low, max(low, high))
                frames.append([(item.item,) * times, 0, level])
            else:
                members = list(item.members)
                rng.shuffle(members)
                frames.append([tuple(members), 0, level])

    made = 0
    tries = 0
    left = 100 * count if max_total is None else max_total
    while made < count and tries < count * 2 and left > 0:
        tries += 1
        tokens: list[Any] = []
        allowed = min(max_tokens, left)
        budget = [allowed]
        try:
            emit((Reference(start, rules[start].position),), 0, tokens, budget)
        except _TooBig:
            left -= allowed
            continue
        finally:
            left -= allowed - max(budget[0], 0) if budget[0] >= 0 else 0
        value = _assemble(tokens)
        if value is not None:
            made += 1
            yield value


class _TooBig(Exception):
    pass


_DEFAULT_ATOMS: dict[str, list[Value]] = {
    "SYMBOL": [Symbol("s"), Symbol("true")], "KEYWORD": [Keyword("k"), Keyword("m")],
    "STRING": ["", "x"], "INTEGER": [0, 1, -1], "DECIMAL": [Decimal("0.5")],
    "URI": [URI("agent://x")], "value": [Symbol("v"), 0, "x", ()],
}


def _assemble(tokens: list[Any]) -> Value | None:
    stack: list[list[Value]] = [[]]
    for token in tokens:
        if _is_paren(token) and token == "(":
            stack.append([])
        elif _is_paren(token):
            if len(stack) == 1:
                return None
            done = tuple(stack.pop())
            stack[-1].append(done)
        else:
            stack[-1].append(token)
    if len(stack) != 1 or len(stack[0]) != 1:
        return None
    return stack[0][0]


class _Paren(str):
    pass


def _is_paren(token: Any) -> bool:
    return type(token) is _Paren


def _search(sides: list[_Side], directions: list[tuple[int, int]], checkers: list[_Checker],
            limits: CompatLimits) -> tuple[list[Witness], str]:
    """The bounded witness search made when the analysis cannot decide."""
    pool = _search_atoms(sides, limits)
    tried = 0
    found: list[Witness] = []
    for a, b in directions:
        covered = sides[a]
        for intent in covered.descriptor.intents:
            rule = covered.descriptor.starts[intent]
            for body in generate_bodies(covered.source, rule, limits.search_bodies,
                                        limits.search_depth, seed=tried, atoms=pool,
                                        max_tokens=limits.max_witness_nodes):
                tried += 1
                witness = _confirm(intent, body, a, b, checkers)
                if witness is not None:
                    found.append(witness)
                    break
    side = " and ".join("OLD" if a == 0 else "NEW" for a, _ in directions)
    return found, (f"{tried} bodies generated from {side} (rule nesting up to "
                   f"{limits.search_depth}) and re-checked: "
                   + ("a witness found" if found else "no witness found; this proves nothing"))


def _search_atoms(sides: list[_Side], limits: CompatLimits) -> dict[str, list[Value]]:
    """Atoms worth trying: the representatives of the atom classes, where they can be
    computed."""
    try:
        atoms = _Atoms(set(), [side.schema for side in sides], limits)
    except _Unknown:
        return {}
    pool: dict[str, list[Value]] = {name: [] for name in _KIND_TYPES}
    names = {t: name for name, t in _KIND_TYPES.items()}
    for c in atoms.classes:
        pool[names[c.kind]].append(c.rep)
    pool["value"] = [c.rep for c in atoms.classes]
    return pool


# --------------------------------------------------------------------------- what changed


def _changes(old: _Side, new: _Side) -> Iterator[str]:
    od, nd = old.descriptor, new.descriptor
    if od.id != nd.id:
        yield f"id: {od.id} -> {nd.id}"
    if od.version != nd.version:
        yield f"version: {od.version} -> {nd.version}"
    for intent in od.intents:
        if intent not in nd.intents:
            yield f"intent removed: {intent.value}"
    for intent in nd.intents:
        if intent not in od.intents:
            yield f"intent added: {intent.value}"
        elif od.starts[intent] != nd.starts[intent]:
            yield f"intent {intent.value}: start rule {od.starts[intent]} -> " \
                  f"{nd.starts[intent]}"
    old_rules = {r.name: r for r in old.source.rules}
    new_rules = {r.name: r for r in new.source.rules}
    for name, rule in old_rules.items():
        if name not in new_rules:
            yield f"rule removed: {name}: {_clip(render_alternatives(rule.alternatives))}"
    for name, rule in new_rules.items():
        if name not in old_rules:
            yield f"rule added: {name}: {_clip(render_alternatives(rule.alternatives))}"
            continue
        before = render_alternatives(old_rules[name].alternatives)
        after = render_alternatives(rule.alternatives)
        if before != after:
            yield f"rule changed: {name}: {_clip(before)}  =>  {_clip(after)}"
            old_sets = _keyword_sets(old_rules[name])
            new_sets = _keyword_sets(rule)
            for k, (a, b) in enumerate(zip(old_sets, new_sets, strict=False)):
                yield from _member_changes(name, k, a, b)
    yield from _schema_changes(old.schema, new.schema)


def _keyword_sets(rule: Rule) -> list[KeywordSet]:
    return [item for alt in rule.alternatives for item in walk(alt.items)
            if isinstance(item, KeywordSet)]


def _member_changes(rule: str, k: int, old: KeywordSet, new: KeywordSet) -> Iterator[str]:
    where = f"keyword set {k + 1} of {rule}"
    before = {m.keyword: m for m in old.members}
    after = {m.keyword: m for m in new.members}
    for key, m in before.items():
        if key not in after:
            yield f"{where}: member {key} removed"
        elif m.optional != after[key].optional:
            yield f"{where}: member {key} made {'optional' if after[key].optional else 'required'}"
        elif render_item(m.item) != render_item(after[key].item):
            yield f"{where}: member {key}: {render_item(m.item)} -> " \
                  f"{render_item(after[key].item)}"
    for key, m in after.items():
        if key not in before:
            yield f"{where}: member {key} added ({'optional' if m.optional else 'required'})"


def _type_text(t: SchemaType | None) -> str:
    lists: list[ListOf] = []
    while isinstance(t, ListOf):  # (a loop: list-of nests as deep as the schema allows)
        lists.append(t)
        t = t.item
    if t is None:
        text = "none"
    elif isinstance(t, (AtomType, OneOf)):
        text = t.describe()
    elif isinstance(t, Record):
        text = f"(record {' '.join(t.heads)} …)"
    else:
        text = "(keys …)"
    for outer in reversed(lists):
        text = f"a list of ({text}) of {outer.min_length or 0} to " \
               f"{outer.max_length if outer.max_length is not None else '…'} elements"
    return text


def _keys_changes(where: str, old: Keys, new: Keys) -> Iterator[str]:
    """The changes between two ``keys`` types, nested ones at their field, in order (an
    explicit stack of the levels being compared: no Python frame per level)."""
    stack = [_keys_level(where, old, new)]
    while stack:
        for line in stack[-1]:
            if isinstance(line, tuple):  # a nested pair of keys: compare it first
                stack.append(_keys_level(*line))
                break
            yield line
        else:
            stack.pop()


def _length_text(t: ListOf) -> str:
    return f"{t.min_length or 0} to " \
           f"{t.max_length if t.max_length is not None else '…'} elements"


def _field_change(where: str, key: Keyword, t: SchemaType, u: SchemaType
                  ) -> Iterator[str | tuple[str, Keys, Keys]]:
    """How field ``key`` of ``where`` changed from type ``t`` to ``u`` (not equal), as
    precisely as the types allow: through lists to their elements (``[:xs][*]``), and into
    nested records and keyword lists, whose keys are yielded as a nested pair to compare."""
    at, label = f"{where}[{key.text}]", f"{where}: field {key.text}"
    while isinstance(t, ListOf) and isinstance(u, ListOf):
        if (t.min_length, t.max_length) != (u.min_length, u.max_length):
            yield f"{label}: a list of {_length_text(t)} -> a list of {_length_text(u)}"
        t, u = t.item, u.item
        label, at = f"{at}[*]: elements", f"{at}[*]"
        if t == u:
            return
    if isinstance(t, (Keys, Record)) and isinstance(u, (Keys, Record)):
        if isinstance(t, Record) and isinstance(u, Record) and t.heads != u.heads:
            yield f"{label}: (record {' '.join(t.heads)} …) -> (record {' '.join(u.heads)} …)"
        elif isinstance(t, Record) != isinstance(u, Record):
            yield f"{label}: {_type_text(t)} -> {_type_text(u)}"
        yield (at, t if isinstance(t, Keys) else t.keys, u if isinstance(u, Keys) else u.keys)
    else:
        yield f"{label}: {_type_text(t)} -> {_type_text(u)}"


def _keys_level(where: str, old: Keys, new: Keys) -> Iterator[str | tuple[str, Keys, Keys]]:
    """The changes of one level of :func:`_keys_changes`; a nested pair of ``keys`` is
    yielded as ``(where, old, new)`` for the caller to compare."""
    for key, t in old.fields.items():
        if key not in new.fields:
            yield f"{where}: field {key.text} removed"
            continue
        u = new.fields[key]
        if t != u:
            yield from _field_change(where, key, t, u)
        if (key in old.required) != (key in new.required):
            yield f"{where}: field {key.text} made " \
                  f"{'required' if key in new.required else 'optional'}"
    for key, u in new.fields.items():
        if key not in old.fields:
            yield f"{where}: field {key.text} added " \
                  f"({'required' if key in new.required else 'optional'}): {_type_text(u)}"
    if (old.other is None) != (new.other is None) or (
            old.other is not None and old.other != new.other):
        yield f"{where}: other keys: {_type_text(old.other)} -> {_type_text(new.other)}"


def _schema_changes(old: Schema | None, new: Schema | None) -> Iterator[str]:
    if old is None and new is None:
        return
    if old is None:
        yield "schema added"
    if new is None:
        yield "schema removed"
        return
    before = {r.heads: r for r in old.records} if old is not None else {}
    after = {r.heads: r for r in new.records}
    for heads in before:
        if heads not in after:
            yield f"schema: record {' '.join(heads)} removed"
    for heads, record in after.items():
        name = " ".join(heads)
        if heads not in before:
            yield f"schema: record {name} added"
        else:
            yield from _keys_changes(f"schema: record {name}", before[heads].keys, record.keys)
    if old is not None and [r.heads for r in old.records if r.heads in after] != [
            r.heads for r in new.records if r.heads in before]:
        yield "schema: records reordered"


# --------------------------------------------------------------------------- in a worker
#
# A registry's policy check (spec/trust.md §6.1) compares an offer, from a peer, with the
# accepted descriptor: work bounded by CompatLimits, but seconds of CPU at those bounds.
# So a registry that isolates its compiles runs the comparison as it runs a compile, in the
# guarded worker (cbcl.grammar._compile.run_guarded: CPU, wall-clock and memory limits, a
# lower priority, cancelled when nobody waits), under its compile gate: compare_guarded
# sends both descriptors' documents and the limits as JSON, the worker (worker_main) reads
# them back, compares them (compiling the grammars in the worker, guarded as a whole) and
# replies with the verdict alone (CompatVerdict), which the parent checks before use. A
# worker that fails, overruns or is killed gives an ``unknown`` verdict saying why, so the
# update is refused (TrustError ``incompatible``), never the connection dropped.


#: How a :class:`CompatVerdict`'s reason starts when a grammar could not be compiled (a
#: verdict of this process's limits, not of the pair: never remembered).
UNCOMPILED = "a grammar cannot be compiled here: "


@dataclass(frozen=True, slots=True)
class CompatVerdict:
    """What a registry needs of a :class:`CompatReport`: the verdict, its first witness
    (intent, the side that accepts it: ``"old"`` or ``"new"``, its canonical text) or
    ``None``, and the first reason (``""`` if none)."""

    verdict: str
    witness: tuple[str, str, str] | None
    reason: str


def compare(old: ProtocolDescriptor | bytes, new: ProtocolDescriptor | bytes, *, mode: str,
            limits: CompatLimits, grammar_limits: GrammarLimits,
            compile: Compile | None) -> CompatVerdict:
    """:func:`diff_descriptors`' verdict as a :class:`CompatVerdict`; a grammar that
    cannot be compiled (``GrammarError``) gives ``unknown``, saying so. Raises as
    :func:`diff_descriptors` otherwise."""
    try:
        report = diff_descriptors(old, new, mode=mode, limits=limits, compile=compile,
                                  grammar_limits=grammar_limits)
    except GrammarError as exc:
        return CompatVerdict(UNKNOWN, None, UNCOMPILED + exc.one_line())
    witness = None
    if report.witnesses:
        first = report.witnesses[0]
        witness = (first.intent.value, first.accepted_by, first.text)
    return CompatVerdict(report.verdict, witness, report.reasons[0] if report.reasons else "")


def descriptor_document(descriptor: ProtocolDescriptor) -> bytes:
    """A document that :func:`read_descriptor` reads back as ``descriptor`` (but for its
    digest, which names the original bytes): each field in the canonical form."""
    rules = dict(descriptor.intent_rules)
    intents: list[Value] = [Symbol(intent.value) if intent not in rules else
                            (Symbol(intent.value), Symbol(rules[intent]))
                            for intent in descriptor.intents]
    fields: list[Value] = [
        Symbol("protocol-descriptor"), (Symbol("id"), descriptor.id),
        (Symbol("version"), descriptor.version)]
    if descriptor.expires is not None:
        fields.append((Symbol("expires"), descriptor.expires))
    fields.append((Symbol("intents"), *intents))
    fields.append((Symbol("grammar"), descriptor.grammar))
    for section in (descriptor.schema, descriptor.conversation, descriptor.functions,
                    descriptor.constraints):
        if section is not None:
            fields.append(section)
    return canonical_value(tuple(fields)).encode()


def _fields_of(limits: Any) -> dict[str, int]:
    return {f.name: getattr(limits, f.name) for f in dataclasses.fields(limits) if f.init}


#: The worker's entry (module, function) for :func:`compare_guarded`.
COMPARE_ENTRY = ("cbcl.protocol._compat", "worker_main")
#: The longest reply a comparing worker may write (a verdict, a witness's text, a reason).
MAX_VERDICT_BYTES = 1 << 20


def compare_guarded(old: ProtocolDescriptor, new: ProtocolDescriptor, *, mode: str,
                    limits: CompatLimits, grammar_limits: GrammarLimits,
                    read_limits: Limits, timeout: float, memory: int,
                    cancelled: Callable[[], bool] | None,
                    max_table_bytes: int) -> CompatVerdict:
    """:func:`compare` in a guarded worker process (see the section's comment): at most
    ``timeout`` seconds of its CPU (three times that of wall clock) and ``memory`` bytes,
    stopped when ``cancelled()``; each grammar compiled there within ``max_table_bytes``.
    A worker that fails, overruns or replies with anything but a verdict gives
    ``unknown`` with the reason. Raises :class:`LimitError` when it is cancelled or no
    worker can be started."""
    request = {"old": descriptor_document(old).decode(), "new": descriptor_document(new).decode(),
               "mode": mode, "limits": _fields_of(limits),
               "grammar_limits": _fields_of(grammar_limits),
               "read_limits": _fields_of(read_limits), "max_table_bytes": max_table_bytes}
    try:
        out = run_guarded(request, COMPARE_ENTRY, timeout=timeout, memory=memory,
                          cancelled=cancelled, max_reply=MAX_VERDICT_BYTES)
    except GrammarError as exc:
        return CompatVerdict(UNKNOWN, None, exc.message)
    try:
        reply = json.loads(out)
        if type(reply) is not dict:
            raise ValueError
        if "error" in reply:
            error = reply["error"]
            if type(error) is not str:
                raise ValueError
            return CompatVerdict(UNKNOWN, None, "the analysis refused: " + error)
        verdict, witness, reason = reply["verdict"], reply["witness"], reply["reason"]
        if verdict not in (COMPATIBLE, BREAKING, UNKNOWN) or type(reason) is not str or not (
                witness is None or (type(witness) is list and len(witness) == 3 and all(
                    type(part) is str for part in witness)
                    and witness[1] in ("old", "new"))):
            raise ValueError
    except (KeyError, TypeError, ValueError):
        return CompatVerdict(UNKNOWN, None, "the analysis worker's reply is malformed")
    return CompatVerdict(verdict, None if witness is None else tuple(witness), reason)


def worker_main() -> int:
    """The comparing worker (:data:`COMPARE_ENTRY`): one JSON request on stdin, one JSON
    reply on stdout — ``{"verdict", "witness", "reason"}``, or ``{"error": TEXT}`` for a
    descriptor or a limit the analysis refuses."""
    request = json.loads(sys.stdin.buffer.read())
    confine(request)
    grammar_limits = GrammarLimits(**request["grammar_limits"])
    read_limits = Limits(**request["read_limits"])
    max_table_bytes = int(request["max_table_bytes"])
    try:
        old = read_descriptor(request["old"].encode(), limits=read_limits)
        new = read_descriptor(request["new"].encode(), limits=read_limits)
        found = compare(old, new, mode=request["mode"],
                        limits=CompatLimits(**request["limits"]),
                        grammar_limits=grammar_limits,
                        compile=lambda d: compile_grammar(d.grammar, grammar_limits,
                                                          starts=d.start_rules,
                                                          max_table_bytes=max_table_bytes))
    except CBCLError as exc:
        reply: dict[str, Any] = {"error": exc.one_line()}
    else:
        reply = {"verdict": found.verdict, "witness": found.witness, "reason": found.reason}
    sys.stdout.buffer.write(json.dumps(reply, separators=(",", ":")).encode())
    sys.stdout.buffer.flush()
    return 0
