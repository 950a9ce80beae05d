"""The grammar checker's analysis engine: LR(0), LALR(1) and canonical LR(1) automata, conflict
reports in the grammar author's terms, keyword-in-context overlaps, and ambiguity witnesses.

Theory of operation
-------------------
:func:`analyse` takes a BNF :class:`~cbcl.grammar._cfg.Grammar` (EBNF already expanded by the
reader)
and returns a :class:`Report` whose first rendered line is one verdict of draft §4.

1. *Compile.* Symbols become ints: terminals ``0..T-1`` (``0`` is ``$END``), nonterminals
   ``T..``; ``T`` itself is the augmented start ``S'`` with production 0 ``S' -> start``. An
   LR item is one int (``base[production] + dot``). A lookahead set is an int used as a
   bitset over terminals. Bits above ``T`` are *markers*: bit ``T`` (``_PROP``) in the
   left-corner tables means "inherits the lookahead of the item that predicted me", and bits
   ``T+1+i`` stand for "the lookahead of kernel item ``i``" during LALR propagation. FIRST
   sets, nullability and the shortest terminal yield of every symbol (Knuth's algorithm,
   which also finds unproductive rules) are computed once.
2. *Closure.* For every nonterminal ``B`` we memoise its left-corner closure: each ``C``
   reachable as ``B => C ...`` with the terminals it gets spontaneously plus the ``_PROP``
   marker. The LR(1) closure of a kernel is then one table lookup per kernel item — no
   per-state fixpoint (:meth:`_Compiled.expand`).
3. *LR(0) and LALR(1).* The LR(0) automaton is built breadth-first (so parent pointers give
   shortest prefixes). Each state is expanded once with marker lookaheads; the markers that
   reach a successor's kernel item are the propagation edges of the Dragon-book method, the
   plain bits are spontaneous lookaheads. A worklist solves the propagation; reduce
   lookaheads are read back through the same markers. A caller's ``table_limit`` is told
   the size of the LALR(1) table as the automaton grows (lower bounds after each state, the
   exact counts once the lookaheads are known) and may stop the analysis there, before the
   table or any conflict search costs more.
4. *Canonical LR(1)* is built only when LALR(1) has a conflict or a state that acts on both a
   literal and a general terminal that overlaps it (LR(1) actions refine LALR's, so without
   either there is nothing for LR(1) to find). States are (items, lookaheads) kernels with
   lookaheads projected onto the *relevant* terminals (those of LALR conflicts and overlap
   candidates): projection commutes with the unions that compute lookaheads, so actions on
   relevant terminals are exactly canonical LR(1)'s while irrelevant contexts stay merged.
   The ``max_states`` budget applies to each automaton and raises :class:`GrammarError`.
5. *Verdict.* Conflicts are computed with bit operations per state, deduplicated by what the
   author sees (items and lookahead) and counted. Overlaps are decided on LR(1) only: there a
   reduce on lookahead ``a`` implies ``a`` is eventually shifted, so "acts on the literal and
   on SYMBOL" is an exact statement about the run-time parser, while merged LALR lookaheads
   would give false alarms. LALR conflicts that no LR(1) state of the same core has are
   "from merging" and get a hint naming the merged contexts.
6. *Ambiguity search*, per LR(1) conflict, bounded by ``max_search_steps``: a symbol prefix
   reaching the state (the BFS path, then paths through other predecessors) is expanded to
   shortest terminal yields; each competing action is simulated on the lookahead until it is
   shifted; the stack is then completed by a shortest path over (stack depth, nonterminal)
   — each item on the stack says what must still follow. Every candidate sentence is
   recognised by an Earley parser and its derivations counted up to two per chart node by a
   capped fixpoint per span (sound with epsilon rules and unit cycles: the least fixpoint of
   saturating counts is ``min(2, true count)``). Two distinct trees are rebuilt from
   witnesses recorded when a node first reached 1 and 2, which is well founded, so cyclic
   grammars terminate. No step recurses on grammar depth: closures, searches and tree
   building use explicit stacks or worklists.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from ..core._errors import GrammarError
from ._cfg import Grammar

__all__ = ["Action", "Conflict", "Report", "Tree", "analyse"]

LALR1 = "LALR(1)"
LR1_NOT_LALR1 = "LR(1) but not LALR(1)"
AMBIGUOUS = "ambiguous"
NOT_LR1 = "not LR(1)"

_END_NAME = "$END"
_END_SHOWN = "end of input"
_ACCEPT_SHOWN = "(accept)"
_LITERAL_PREFIXES = ("LIT_",)
_LITERAL_NAMES = frozenset({"LPAR", "RPAR"})
#: Longest candidate sentence the ambiguity search will build (shortest yields can grow
#: exponentially with nesting; such candidates are skipped).
_MAX_SENTENCE = 200
#: Per conflict: how many prefixes, stacks per action and completions per stack to try.
_MAX_PREFIXES = 8
_MAX_STACKS = 4
_MAX_COMPLETIONS = 3
#: Search steps a conflict may use even when there are many conflicts.
_MIN_SHARE = 25_000
#: How many items of one action a rendered report lists before "and N more".
_MAX_SHOWN_ITEMS = 4


# ---------------------------------------------------------------------------------------------
# Public data


@dataclass(frozen=True, slots=True)
class Tree:
    """A derivation tree in the author's terms: ``label`` is a rule name (``stmt``, or
    ``stmt(alias)``) or, for a leaf, a terminal as displayed (``"if"``, ``SYMBOL``)."""

    label: str
    children: tuple[Tree, ...] = ()
    leaf: bool = False

    def render(self, folded: Callable[[Tree], bool] | None = None) -> str:
        """Bracket form, Bison style: ``e → [ e → [ INTEGER ] "+" e → [ INTEGER ] ]``; a
        subtree below the root for which ``folded`` is true is shown by its label only."""
        out: list[str] = []
        stack: list[Tree | str] = [self]
        while stack:
            node = stack.pop()
            if isinstance(node, str):
                out.append(node)
            elif node.leaf or (folded is not None and node is not self and folded(node)):
                out.append(node.label)
            else:
                out.append(f"{node.label} → [")
                stack.append("]")
                if not node.children:
                    stack.append("ε")
                stack.extend(reversed(node.children))
        return " ".join(out)

    def leaves(self) -> tuple[str, ...]:
        """The yield: the leaf labels, left to right."""
        out: list[str] = []
        stack: list[Tree] = [self]
        while stack:
            node = stack.pop()
            if node.leaf:
                out.append(node.label)
            else:
                stack.extend(reversed(node.children))
        return tuple(out)


@dataclass(frozen=True, slots=True)
class Action:
    """One competing action at a conflict.

    ``kind`` is ``"shift"`` or ``"reduce"``; ``terminal`` is the token it is taken on (as
    displayed); ``items`` are the LR items behind it in the author's terms (one for a reduce,
    every item that shifts ``terminal`` for a shift); ``example`` is an input (displayed
    terminals) on which a parser takes this action here, or ``()`` if none was built.
    """

    kind: str
    terminal: str
    items: tuple[str, ...]
    example: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Conflict:
    """One conflict, deduplicated over automaton states (``count`` of them).

    ``kind``: ``"shift/reduce"``, ``"reduce/reduce"`` or ``"overlap"``. ``automaton``:
    ``"LR(1)"`` or ``"LALR(1)"`` (the latter only for conflicts that come from merging LR(1)
    states). ``prefix``: the shortest sequence of grammar symbols reaching the state.
    ``lookahead``: the next token (for an overlap, the literal). ``terminal``: for an
    overlap, the general terminal that also matches the literal's atom. ``example`` and
    ``derivations``: an input with two derivations, if one was found. ``hint``: advice.
    """

    kind: str
    automaton: str
    prefix: tuple[str, ...]
    lookahead: str
    actions: tuple[Action, ...]
    terminal: str = ""
    count: int = 1
    example: tuple[str, ...] = ()
    derivations: tuple[Tree, ...] = ()
    hint: str = ""

    @property
    def ambiguous(self) -> bool:
        """True for an overlap or a conflict with a two-derivation witness."""
        return self.kind == "overlap" or bool(self.derivations)


@dataclass(frozen=True, slots=True)
class Report:
    """The checker's result. ``verdict`` is one of ``LALR(1)``, ``LR(1) but not LALR(1)``,
    ``ambiguous``, ``not LR(1)``; ``conflicts`` lists every distinct conflict found;
    ``lalr_states`` / ``lr1_states`` are automaton sizes (``lr1_states`` is 0 when the
    canonical automaton was not needed); ``search_exhausted`` says the ambiguity search ran
    out of budget."""

    verdict: str
    conflicts: tuple[Conflict, ...] = ()
    lalr_states: int = 0
    lr1_states: int = 0
    search_exhausted: bool = False

    def render(self) -> str:
        """A readable report; its first line is exactly the verdict."""
        lines = [self.verdict]
        if not self.conflicts:
            return "\n".join(lines)
        lines.append(_summary(self))
        total = len(self.conflicts)
        for number, conflict in enumerate(self.conflicts, 1):
            lines.append("")
            lines.extend(_render_conflict(conflict, number, total))
        return "\n".join(lines)


def _summary(report: Report) -> str:
    n = len(report.conflicts)
    plural = "conflict" if n == 1 else "conflicts"
    if report.verdict == AMBIGUOUS:
        witnesses = sum(1 for c in report.conflicts if c.derivations)
        overlaps = sum(1 for c in report.conflicts if c.kind == "overlap")
        parts = []
        if witnesses:
            parts.append(f"{witnesses} with an input that has two derivations")
        if overlaps:
            parts.append(f"{overlaps} where a literal could also be read as data")
        return f"{n} {plural}: " + "; ".join(parts) + "."
    if report.verdict == LR1_NOT_LALR1:
        return (f"{n} {plural}, all caused by LALR(1) merging LR(1) states that have the same "
                "items; canonical LR(1) has none.")
    extra = " (the ambiguity search ran out of budget)" if report.search_exhausted else ""
    return (f"{n} {plural}; no input with two derivations was found{extra}. Where shown, the "
            "examples differ only after the lookahead: deciding needs more than one token.")


def _words(words: tuple[str, ...]) -> str:
    return " ".join(words) if words else "(empty input)"


def _signatures(tree: Tree) -> dict[int, tuple[tuple[int, ...], int, str]]:
    """For every inner node (by id): its path of child indices, the offset of its yield, and
    its bracket rendering."""
    sigs: dict[int, tuple[tuple[int, ...], int, str]] = {}
    offset = 0
    stack: list[tuple[Tree, bool, int, tuple[int, ...]]] = [(tree, False, 0, ())]
    while stack:
        node, done, start, path = stack.pop()
        if node.leaf:
            offset += 1
            continue
        if done:
            parts = [c.label if c.leaf else sigs[id(c)][2] for c in node.children]
            sigs[id(node)] = (path, start, f"{node.label} → [ {' '.join(parts) or 'ε'} ]")
            continue
        stack.append((node, True, offset, path))
        stack.extend((c, False, 0, (*path, k)) for k, c in reversed(list(enumerate(node.children))))
    return sigs


def _compact_derivations(one: Tree, two: Tree) -> tuple[str, str]:
    """Bison-style: start at the lowest node both derivations share, and show a subtree that
    is identical in both (same place in the tree, same yield, same shape) by its name only."""
    a, b = one, two
    while not a.leaf and a.label == b.label and len(a.children) == len(b.children):
        diff = [k for k, (x, y) in enumerate(zip(a.children, b.children, strict=True))
                if x != y]
        if len(diff) != 1 or a.children[diff[0]].leaf or b.children[diff[0]].leaf:
            break
        a, b = a.children[diff[0]], b.children[diff[0]]
    sa, sb = _signatures(a), _signatures(b)
    shared = set(sa.values()) & set(sb.values())
    return (a.render(lambda node: sa[id(node)] in shared),
            b.render(lambda node: sb[id(node)] in shared))


def _render_conflict(c: Conflict, number: int, total: int) -> list[str]:
    count = f" (in {c.count} states)" if c.count > 1 else ""
    rows: list[tuple[str, str]] = [("Prefix", " ".join((*c.prefix, "•")))]
    if c.kind == "overlap":
        atom = c.lookahead[1:-1] if c.lookahead.startswith('"') else c.lookahead
        where = f"after {' '.join(c.prefix)}" if c.prefix else "at the start"
        out = [f"Conflict {number} of {total}: overlap{count}: {where} the atom {atom} could be "
               f"the literal {c.lookahead} or a {c.terminal}"]
    else:
        out = [f"Conflict {number} of {total}: {c.kind} on {c.lookahead}{count}"
               f" [{c.automaton} automaton]"]
        rows.append(("Lookahead", c.lookahead))
    for action in c.actions:
        label = action.kind[:1].upper() + action.kind[1:]
        if c.kind == "overlap":
            label = f"{label} {action.terminal}"
        shown = action.items[:_MAX_SHOWN_ITEMS]
        for i, item in enumerate(shown):
            rows.append((label if i == 0 else "", item))
        if len(action.items) > len(shown):
            rows.append(("", f"… and {len(action.items) - len(shown)} more"))
    if c.derivations:
        rows.append(("Example", _words(c.example)))
        for i, text in enumerate(_compact_derivations(*c.derivations), 1):
            rows.append((f"Derivation {i}", text))
    elif c.kind != "overlap":
        for action in c.actions:
            if action.example:
                rows.append((f"Example ({action.kind})", _words(action.example)))
    if c.hint:
        rows.append(("Hint", c.hint))
    width = max(len(k) for k, _ in rows) + 1
    out.extend(f"  {(k + ':') if k else '':<{width}} {v}" for k, v in rows)
    return out


# ---------------------------------------------------------------------------------------------
# Compiled grammar


def _bits(x: int) -> Iterator[int]:
    """The indices of the set bits of ``x``, ascending."""
    while x:
        low = x & -x
        yield low.bit_length() - 1
        x ^= low


class _OutOfBudget(Exception):
    """Internal: the ambiguity search used up its steps."""


class _Budget:
    def __init__(self, steps: int) -> None:
        self.left = steps

    def spend(self, n: int = 1) -> None:
        self.left -= n
        if self.left < 0:
            raise _OutOfBudget


class _Compiled:
    """A grammar as ints, with FIRST, nullable, shortest yields and left-corner tables.

    Raises GrammarError (verdict ``rejected``) for an undefined symbol, a start symbol with no
    rule, or a reachable rule that derives no finite input.
    """

    def __init__(self, grammar: Grammar) -> None:
        self.grammar = grammar
        prods: list[tuple[str, tuple[str, ...], str | None]] = []
        seen: set[tuple[str, tuple[str, ...], str | None]] = set()
        for production in grammar.productions:
            key = (production.lhs, tuple(production.rhs), production.alias)
            if key not in seen:
                seen.add(key)
                prods.append(key)
        nt_names: list[str] = []
        for lhs, _, _ in prods:
            if lhs not in nt_names:
                nt_names.append(lhs)
        nt_set = set(nt_names)
        if grammar.start not in nt_set:
            raise GrammarError(f"the start rule {grammar.show(grammar.start)} is not defined",
                               verdict="rejected")
        both = nt_set & set(grammar.terminals)
        if both:
            name = min(both)
            raise GrammarError(f"{grammar.show(name)} is both a rule and a terminal",
                               verdict="rejected")
        self.t_names = [_END_NAME, *sorted(grammar.terminals)]
        T = len(self.t_names)
        self.T = T
        self.nt_names = ["S'", *nt_names]
        self.names = self.t_names + self.nt_names
        ids = {name: i for i, name in enumerate(self.names)}
        ids.pop("S'", None)
        self.ids = ids
        self.start_nt = ids[grammar.start]
        self.mask = (1 << T) - 1
        self.prop = 1 << T
        self.end = 0
        # Productions; production 0 is S' -> start.
        self.lhs: list[int] = [T]
        self.rhs: list[tuple[int, ...]] = [(self.start_nt,)]
        self.alias: list[str | None] = [None]
        for lhs, rhs_names, alias in prods:
            syms = []
            for name in rhs_names:
                if name not in ids or name == _END_NAME:
                    raise GrammarError(f"{grammar.show(name)} (used by rule "
                                       f"{grammar.show(lhs)}) is not defined",
                                       verdict="rejected")
                syms.append(ids[name])
            self.lhs.append(ids[lhs])
            self.rhs.append(tuple(syms))
            self.alias.append(alias)
        n_sym = len(self.names)
        self.prods_of: list[list[int]] = [[] for _ in range(n_sym)]
        for p, a in enumerate(self.lhs):
            self.prods_of[a].append(p)
        # Items.
        self.base: list[int] = []
        self.item_prod: list[int] = []
        self.item_dot: list[int] = []
        self.item_next: list[int] = []
        for p, rhs in enumerate(self.rhs):
            self.base.append(len(self.item_prod))
            for d in range(len(rhs) + 1):
                self.item_prod.append(p)
                self.item_dot.append(d)
                self.item_next.append(rhs[d] if d < len(rhs) else -1)
        self._reachable()
        self._first_nullable()
        self._shortest_yields()
        self.lc_cache: dict[int, tuple[tuple[int, int], ...]] = {}
        # Per nonterminal: (first symbol, item after it) of its non-empty productions, and its
        # empty productions.
        self.starts: list[list[tuple[int, int]]] = [[] for _ in range(n_sym)]
        self.eps: list[list[int]] = [[] for _ in range(n_sym)]
        for p, rhs in enumerate(self.rhs):
            if rhs:
                self.starts[self.lhs[p]].append((rhs[0], self.base[p] + 1))
            else:
                self.eps[self.lhs[p]].append(p)
        # Literal -> overlapping general terminals, as bits.
        self.overlap_pairs: list[tuple[int, int]] = []
        for lit, others in sorted(grammar.overlaps.items()):
            if lit in ids and ids[lit] < T:
                obits = 0
                for o in others:
                    if o in ids and ids[o] < T:
                        obits |= 1 << ids[o]
                if obits:
                    self.overlap_pairs.append((ids[lit], obits))

    def is_nt(self, sym: int) -> bool:
        return sym >= self.T

    def _reachable(self) -> None:
        seen = {self.T}
        stack = [self.T]
        while stack:
            a = stack.pop()
            for p in self.prods_of[a]:
                for s in self.rhs[p]:
                    if s >= self.T and s not in seen:
                        seen.add(s)
                        stack.append(s)
        self.reachable = seen

    def _first_nullable(self) -> None:
        n_sym = len(self.names)
        first = [0] * n_sym
        nullable = [False] * n_sym
        for t in range(self.T):
            first[t] = 1 << t
        changed = True
        while changed:
            changed = False
            for p, rhs in enumerate(self.rhs):
                a = self.lhs[p]
                f = first[a]
                all_null = True
                for s in rhs:
                    f |= first[s]
                    if not nullable[s]:
                        all_null = False
                        break
                if f != first[a]:
                    first[a] = f
                    changed = True
                if all_null and not nullable[a]:
                    nullable[a] = True
                    changed = True
        self.first = first
        self.nullable = nullable
        # FIRST and nullability of what follows the symbol after the dot.
        n_items = len(self.item_prod)
        self.after_first = [0] * n_items
        self.after_null = [True] * n_items
        for p, rhs in enumerate(self.rhs):
            f, null = 0, True
            b = self.base[p]
            self.after_first[b + len(rhs)] = 0
            for d in range(len(rhs) - 1, -1, -1):
                self.after_first[b + d] = f
                self.after_null[b + d] = null
                s = rhs[d]
                f = self.first[s] | (f if self.nullable[s] else 0)
                null = null and self.nullable[s]

    def _shortest_yields(self) -> None:
        """Knuth's algorithm: the shortest terminal yield of every nonterminal."""
        n_sym = len(self.names)
        inf = float("inf")
        length: list[float] = [1.0] * self.T + [inf] * (n_sym - self.T)
        best: list[int] = [-1] * n_sym
        remaining = [sum(1 for s in rhs if s >= self.T) for rhs in self.rhs]
        uses: list[list[int]] = [[] for _ in range(n_sym)]
        for p, rhs in enumerate(self.rhs):
            for s in rhs:
                if s >= self.T:
                    uses[s].append(p)
        heap: list[tuple[float, int]] = [(float(len(rhs)), p) for p, rhs in enumerate(self.rhs)
                                         if remaining[p] == 0]
        heapq.heapify(heap)
        done = [False] * n_sym
        while heap:
            size, p = heapq.heappop(heap)
            a = self.lhs[p]
            if done[a]:
                continue
            done[a] = True
            length[a] = size
            best[a] = p
            for q in uses[a]:
                remaining[q] -= 1
                if remaining[q] == 0:
                    heapq.heappush(heap, (float(sum(length[s] for s in self.rhs[q])), q))
        dead = sorted(a for a in self.reachable if not done[a])
        if dead:
            shown = ", ".join(self.show(a) for a in dead[:5])
            raise GrammarError(f"rule {shown} derives no finite input (every alternative "
                               "needs itself again)", verdict="rejected")
        self.yield_len = length
        self.best = best

    def seq_len(self, syms: Sequence[int]) -> float:
        return sum(self.yield_len[s] for s in syms)

    def expand_yield(self, syms: Sequence[int], limit: int) -> tuple[int, ...] | None:
        """The shortest terminal string for ``syms``, or None if longer than ``limit``."""
        if self.seq_len(syms) > limit:
            return None
        out: list[int] = []
        stack = list(reversed(syms))
        while stack:
            s = stack.pop()
            if s < self.T:
                out.append(s)
            else:
                stack.extend(reversed(self.rhs[self.best[s]]))
        return tuple(out)

    # -- closure ---------------------------------------------------------------------------

    def left_corners(self, b: int) -> tuple[tuple[int, int], ...]:
        """Memoised: every ``C`` with ``b =>* C ...`` by left corners, with its lookahead bits
        (terminals, plus ``_PROP`` if it inherits the lookahead of the item predicting ``b``)."""
        cached = self.lc_cache.get(b)
        if cached is not None:
            return cached
        cur: dict[int, int] = {b: self.prop}
        work = [b]
        while work:
            c = work.pop()
            bc = cur[c]
            for p in self.prods_of[c]:
                rhs = self.rhs[p]
                if rhs and rhs[0] >= self.T:
                    it = self.base[p]
                    v = self.after_first[it] | (bc if self.after_null[it] else 0)
                    y = rhs[0]
                    old = cur.get(y)
                    if old is None or (old | v) != old:
                        cur[y] = (old or 0) | v
                        work.append(y)
        result = tuple(sorted(cur.items()))
        self.lc_cache[b] = result
        return result

    def expand(self, items: Sequence[int], las: Sequence[int]
               ) -> tuple[dict[int, int], dict[int, dict[int, int]], list[tuple[int, int]]]:
        """Close a kernel: returns (closure nonterminal -> lookahead, symbol -> successor
        kernel {item: lookahead}, [(production, lookahead) to reduce])."""
        closure: dict[int, int] = {}
        mask, prop = self.mask, self.prop
        for it, la in zip(items, las, strict=True):
            b = self.item_next[it]
            if b >= self.T:
                lin = self.after_first[it] | (la if self.after_null[it] else 0)
                for c, bits in self.left_corners(b):
                    v = (bits & mask) | (lin if bits & prop else 0)
                    closure[c] = closure.get(c, 0) | v
        goto: dict[int, dict[int, int]] = {}
        reds: list[tuple[int, int]] = []
        for it, la in zip(items, las, strict=True):
            x = self.item_next[it]
            if x < 0:
                reds.append((self.item_prod[it], la))
            else:
                succ = goto.setdefault(x, {})
                succ[it + 1] = succ.get(it + 1, 0) | la
        for c, la in closure.items():
            for x, it1 in self.starts[c]:
                succ = goto.setdefault(x, {})
                succ[it1] = succ.get(it1, 0) | la
            for p in self.eps[c]:
                reds.append((p, la))
        return closure, goto, reds

    # -- display ---------------------------------------------------------------------------

    def show(self, sym: int) -> str:
        if sym == self.end:
            return _END_SHOWN
        if sym == self.T:
            return _ACCEPT_SHOWN
        return self.grammar.show(self.names[sym])

    def show_item(self, it: int) -> str:
        p, d = self.item_prod[it], self.item_dot[it]
        rhs = [self.show(s) for s in self.rhs[p]]
        body = " ".join((*rhs[:d], "•", *rhs[d:]))
        return f"{self.show(self.lhs[p])}: {body}"

    def is_synthetic(self, sym: int) -> bool:
        return sym > self.T and self.names[sym] in self.grammar.synthetic


# ---------------------------------------------------------------------------------------------
# Automata


class _Automaton:
    """States in breadth-first order: kernels, lookaheads, transitions, reductions."""

    def __init__(self) -> None:
        self.kernels: list[tuple[int, ...]] = []
        self.klas: list[tuple[int, ...]] = []
        self.goto: list[dict[int, int]] = []
        self.reds: list[list[tuple[int, int]]] = []
        self.parent: list[tuple[int, int]] = []  # (previous state, symbol); (-1, -1) at 0
        self.preds: list[list[tuple[int, int]]] = []

    def __len__(self) -> int:
        return len(self.kernels)

    def path(self, s: int) -> tuple[list[int], list[int]]:
        """(symbols, states) of the BFS path to ``s``; states include 0 and ``s``."""
        syms: list[int] = []
        states = [s]
        while s:
            s, x = self.parent[s]
            syms.append(x)
            states.append(s)
        return syms[::-1], states[::-1]

    def shift_bits(self, s: int, T: int) -> int:
        bits = 0
        for x in self.goto[s]:
            if x < T:
                bits |= 1 << x
        return bits


def _too_many(kind: str, max_states: int) -> GrammarError:
    return GrammarError(f"the grammar needs more than {max_states} {kind} states "
                        "(max_states); simplify it", verdict="rejected")


#: ``table_limit(states, entries, rules, exact)``: see :func:`analyse`.
TableLimit = Callable[[int, int, int, bool], None]


def _build_lalr(g: _Compiled, max_states: int, table_limit: TableLimit | None = None
                ) -> _Automaton:
    """LR(0) states, then LALR(1) lookaheads by propagation. Raises GrammarError if the
    automaton needs more than ``max_states`` states; ``table_limit`` (see :func:`analyse`)
    is told the table's size as it grows, and may raise to stop."""
    auto = _Automaton()
    index: dict[tuple[int, ...], int] = {}
    T = g.T
    marker0 = T + 1
    # spont[s][i]: terminals; edges[(s, i)] -> [(t, j)] propagation.
    spont: list[list[int]] = []
    edges: dict[tuple[int, int], list[tuple[int, int]]] = {}
    sym_reds: list[list[tuple[int, int]]] = []

    def add(kernel: tuple[int, ...], parent: tuple[int, int]) -> int:
        s = index.get(kernel)
        if s is None:
            s = len(auto.kernels)
            if s >= max_states:
                raise _too_many("LR(0)", max_states)
            index[kernel] = s
            auto.kernels.append(kernel)
            auto.goto.append({})
            auto.parent.append(parent)
            auto.preds.append([])
            spont.append([0] * len(kernel))
        return s

    add((g.base[0],), (-1, -1))
    s = 0
    known_entries = 0  # shifts and gotos of the states expanded so far: each is a table entry
    while s < len(auto.kernels):
        kernel = auto.kernels[s]
        markers = [1 << (marker0 + i) for i in range(len(kernel))]
        _, goto, reds = g.expand(kernel, markers)
        for x in sorted(goto):
            succ = goto[x]
            kitems = tuple(sorted(succ))
            t = add(kitems, (s, x))
            auto.goto[s][x] = t
            auto.preds[t].append((s, x))
            for j, it in enumerate(kitems):
                bits = succ[it]
                spont[t][j] |= bits & g.mask
                for i in _bits(bits >> marker0):
                    edges.setdefault((s, i), []).append((t, j))
        sym_reds.append(reds)
        s += 1
        if table_limit is not None:  # every state found is a row; lookaheads come later
            known_entries += len(goto)
            table_limit(len(auto.kernels), known_entries, 0, False)
    # Propagate.
    la = [list(row) for row in spont]
    la[0][0] |= 1 << g.end
    work = deque((s, i) for s in range(len(la)) for i in range(len(la[s])) if la[s][i])
    while work:
        s, i = work.popleft()
        v = la[s][i]
        for t, j in edges.get((s, i), ()):
            if (la[t][j] | v) != la[t][j]:
                la[t][j] |= v
                work.append((t, j))
    auto.klas = [tuple(row) for row in la]
    for s, reds in enumerate(sym_reds):
        resolved = []
        for p, bits in reds:
            v = bits & g.mask
            for i in _bits(bits >> marker0):
                v |= la[s][i]
            resolved.append((p, v))
        auto.reds.append(resolved)
    if table_limit is not None:
        table_limit(len(auto.kernels), *_table_counts(auto, T), True)
    return auto


def _table_counts(auto: _Automaton, T: int) -> tuple[int, int]:
    """The entries (a shift, goto or reduce per state and symbol) and the rules reduced by
    of the LALR(1) table of ``auto``: what lark's action/goto table holds (a conflict's
    terminal counted once). Accepting is not an entry there: the end state reads ``$END``
    as the end, so production 0 (``S' -> start``) is neither an entry nor a rule."""
    entries = 0
    reduced: set[int] = set()
    for s, goto in enumerate(auto.goto):
        lookaheads = 0
        for p, v in auto.reds[s]:
            if p:
                lookaheads |= v
                reduced.add(p)
        entries += len(goto) + (lookaheads & ~auto.shift_bits(s, T)).bit_count()
    return entries, len(reduced)


def _build_lr1(g: _Compiled, max_states: int, relevant: int = -1) -> _Automaton:
    """Canonical LR(1) with lookaheads projected onto the terminal bitset ``relevant``.

    Projection commutes with the union and FIRST operations that compute lookaheads, so the
    result is the quotient of canonical LR(1) by "same core, same relevant lookaheads": its
    actions on relevant terminals are exactly canonical LR(1)'s, with (far) fewer states.
    Raises GrammarError beyond ``max_states`` states.
    """
    auto = _Automaton()
    index: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}

    def add(items: tuple[int, ...], las: tuple[int, ...], parent: tuple[int, int]) -> int:
        key = (items, las)
        s = index.get(key)
        if s is None:
            s = len(auto.kernels)
            if s >= max_states:
                raise _too_many("LR(1)", max_states)
            index[key] = s
            auto.kernels.append(items)
            auto.klas.append(las)
            auto.goto.append({})
            auto.parent.append(parent)
            auto.preds.append([])
        return s

    add((g.base[0],), (1 << g.end,), (-1, -1))
    s = 0
    while s < len(auto.kernels):
        _, goto, reds = g.expand(auto.kernels[s], auto.klas[s])
        for x in sorted(goto):
            succ = goto[x]
            kitems = tuple(sorted(succ))
            t = add(kitems, tuple(succ[it] & relevant for it in kitems), (s, x))
            auto.goto[s][x] = t
            auto.preds[t].append((s, x))
        auto.reds.append([(p, la & relevant) for p, la in reds])
        s += 1
    return auto


# ---------------------------------------------------------------------------------------------
# Conflicts


@dataclass
class _RawConflict:
    """A conflict in one state, before deduplication."""

    kind: str
    state: int
    lookahead: int  # terminal id (for an overlap: the literal)
    terminal: int  # overlap: the general terminal; else -1
    actions: list[tuple[str, int, tuple[int, ...]]]  # (kind, terminal, items)


def _actions_on(g: _Compiled, auto: _Automaton, s: int, t: int,
                closure: dict[int, int]) -> list[tuple[str, int, tuple[int, ...]]]:
    """Every action of state ``s`` on terminal ``t``: one shift (with its items), reduces."""
    out: list[tuple[str, int, tuple[int, ...]]] = []
    for p, la in auto.reds[s]:
        if la >> t & 1:
            out.append(("reduce", t, (g.base[p] + len(g.rhs[p]),)))
    if t in auto.goto[s]:
        items = [it for it in auto.kernels[s] if g.item_next[it] == t]
        for c in closure:
            items.extend(it1 - 1 for x, it1 in g.starts[c] if x == t)
        out.append(("shift", t, tuple(items)))
    return out


def _find_conflicts(g: _Compiled, auto: _Automaton, overlaps: bool) -> list[_RawConflict]:
    """Every (state, terminal) with more than one action; with ``overlaps``, also every state
    acting on both a literal and a general terminal that matches its atom."""
    found: list[_RawConflict] = []
    closures: dict[int, dict[int, int]] = {}

    def closure(s: int) -> dict[int, int]:
        if s not in closures:
            closures[s] = g.expand(auto.kernels[s], auto.klas[s])[0]
        return closures[s]

    for s in range(len(auto)):
        seen = auto.shift_bits(s, g.T)
        clash = 0
        for _, la in auto.reds[s]:
            clash |= seen & la
            seen |= la
        for t in _bits(clash):
            acts = _actions_on(g, auto, s, t, closure(s))
            kind = "shift/reduce" if acts[-1][0] == "shift" else "reduce/reduce"
            found.append(_RawConflict(kind, s, t, -1, acts))
        if overlaps:
            for lit, obits in g.overlap_pairs:
                if seen >> lit & 1 and seen & obits:
                    for o in _bits(seen & obits):
                        acts = (_actions_on(g, auto, s, lit, closure(s))
                                + _actions_on(g, auto, s, o, closure(s)))
                        found.append(_RawConflict("overlap", s, lit, o, acts))
    return found


def _overlap_candidates(g: _Compiled, auto: _Automaton) -> int:
    """The terminals (bitset) of every literal/terminal pair some LALR(1) state acts on."""
    found = 0
    for s in range(len(auto)):
        seen = auto.shift_bits(s, g.T)
        for _, la in auto.reds[s]:
            seen |= la
        for lit, obits in g.overlap_pairs:
            if seen >> lit & 1 and seen & obits:
                found |= 1 << lit | (seen & obits)
    return found


def _dedupe_key(g: _Compiled, raw: _RawConflict) -> tuple[object, ...]:
    return (raw.kind, raw.lookahead, raw.terminal,
            tuple((k, t, tuple(sorted(g.show_item(i) for i in items)))
                  for k, t, items in raw.actions))


def _group(g: _Compiled, raws: list[_RawConflict]) -> list[list[_RawConflict]]:
    """Group conflicts that look the same to the author; the first (shortest prefix, since
    states are numbered breadth-first) represents each group."""
    groups: dict[tuple[object, ...], list[_RawConflict]] = {}
    for raw in raws:
        groups.setdefault(_dedupe_key(g, raw), []).append(raw)
    return list(groups.values())


def _make_actions(g: _Compiled, raw: _RawConflict,
                  examples: dict[int, tuple[int, ...]] | None = None) -> tuple[Action, ...]:
    out = []
    for n, (kind, t, items) in enumerate(raw.actions):
        shown = tuple(dict.fromkeys(g.show_item(i) for i in items))
        example: tuple[str, ...] = ()
        if examples and n in examples:
            example = tuple(g.show(x) for x in examples[n])
        out.append(Action(kind, g.show(t), shown, example))
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# Derivation counting (Earley recognition, then capped counts per span)

_Node = tuple[int, int, int, int]  # (0, item, i, j) partial rhs; (1, A, i, j) symbol; (2, k, 0, 0)


class _Forest:
    """Counts derivations of a sentence up to 2 and rebuilds two distinct trees."""

    def __init__(self, g: _Compiled, words: tuple[int, ...], budget: _Budget) -> None:
        self.g = g
        self.words = words
        self.budget = budget
        self.value: dict[_Node, int] = {}
        self.w1: dict[_Node, tuple[_Node, ...]] = {}
        self.w2: dict[_Node, tuple[str, tuple[_Node, ...], int]] = {}

    def count(self) -> int:
        g, words, budget = self.g, self.words, self.budget
        n = len(words)
        chart: list[set[tuple[int, int]]] = [set() for _ in range(n + 1)]
        waiting: list[dict[int, list[tuple[int, int]]]] = [{} for _ in range(n + 1)]
        completed: list[dict[int, set[int]]] = [{} for _ in range(n + 1)]
        chart[0].add((g.base[0], 0))
        for j in range(n + 1):
            agenda = list(chart[j])
            predicted: set[int] = set()
            while agenda:
                it, o = agenda.pop()
                budget.spend()
                x = g.item_next[it]
                if x < 0:
                    a = g.lhs[g.item_prod[it]]
                    done = completed[j].setdefault(a, set())
                    if o in done:
                        continue
                    done.add(o)
                    for it2, o2 in waiting[o].get(a, ()):
                        if (it2 + 1, o2) not in chart[j]:
                            chart[j].add((it2 + 1, o2))
                            agenda.append((it2 + 1, o2))
                elif x < g.T:
                    if j < n and words[j] == x:
                        chart[j + 1].add((it + 1, o))
                else:
                    waiting[j].setdefault(x, []).append((it, o))
                    new: list[tuple[int, int]] = []
                    if x not in predicted:
                        predicted.add(x)
                        new.extend((g.base[p], j) for p in g.prods_of[x])
                    if g.nullable[x]:
                        new.append((it + 1, o))
                    if j in completed[j].get(x, ()):  # pragma: no cover - nullable covers it
                        new.append((it + 1, o))
                    for item in new:
                        if item not in chart[j]:
                            chart[j].add(item)
                            agenda.append(item)
        accept = g.base[0] + 1
        if (accept, 0) not in chart[n]:
            return 0
        self._count_spans(chart, completed)
        return self.value.get((1, g.T, 0, n), 0)

    def _count_spans(self, chart: list[set[tuple[int, int]]],
                     completed: list[dict[int, set[int]]]) -> None:
        g, words, value, budget = self.g, self.words, self.value, self.budget
        n = len(words)
        for j in range(n + 1):
            by_origin: dict[int, list[int]] = {}
            for it, o in chart[j]:
                by_origin.setdefault(o, []).append(it)
            comp_origin: dict[int, list[int]] = {}
            for a, origins in completed[j].items():
                for o in origins:
                    comp_origin.setdefault(o, []).append(a)
            for i in range(j, -1, -1):
                items = sorted(by_origin.get(i, ()), key=lambda it: (g.item_dot[it], it))
                nodes: list[tuple[_Node, list[tuple[_Node, ...]]]] = []
                for it in items:
                    node: _Node = (0, it, i, j)
                    d = g.item_dot[it]
                    if d == 0:
                        if i == j:
                            value[node] = 1
                            self.w1[node] = ()
                        continue
                    prev = it - 1
                    x = g.item_next[prev]
                    options: list[tuple[_Node, ...]] = []
                    if x < g.T:
                        k = j - 1
                        if k >= i and words[k] == x and (prev, i) in chart[k]:
                            options.append(((0, prev, i, k), (2, k, 0, 0)))
                    else:
                        for k in completed[j].get(x, ()):
                            if k >= i and (prev, i) in chart[k]:
                                options.append(((0, prev, i, k), (1, x, k, j)))
                    budget.spend(len(options) + 1)
                    nodes.append((node, sorted(options)))
                for a in sorted(comp_origin.get(i, ())):
                    options = [((0, g.base[p] + len(g.rhs[p]), i, j),)
                               for p in g.prods_of[a]
                               if (g.base[p] + len(g.rhs[p]), i) in chart[j]]
                    nodes.append(((1, a, i, j), options))
                self._fixpoint(nodes)

    def _val(self, node: _Node) -> int:
        if node[0] == 2:
            return 1
        return self.value.get(node, 0)

    def _fixpoint(self, nodes: list[tuple[_Node, list[tuple[_Node, ...]]]]) -> None:
        """Capped counts for one span: a worklist that re-evaluates a node when a child in
        the same span (epsilon or unit step) grows, so unit chains settle in one pass."""
        value = self.value
        index = {node: k for k, (node, _) in enumerate(nodes)}
        dependents: dict[_Node, list[int]] = {}
        for k, (_, options) in enumerate(nodes):
            for opt in options:
                for child in opt:
                    if child in index:
                        dependents.setdefault(child, []).append(k)
        queue = deque(range(len(nodes)))
        queued = set(queue)
        while queue:
            k = queue.popleft()
            queued.discard(k)
            node, options = nodes[k]
            old = value.get(node, 0)
            if old >= 2:
                continue
            self.budget.spend(len(options) + 1)
            total = 0
            products = []
            for opt in options:
                prod = 1
                for child in opt:
                    prod *= self._val(child)
                    if not prod:
                        break
                products.append(min(prod, 2))
                total += prod
            total = min(total, 2)
            if total <= old:
                continue
            value[node] = total
            for d in dependents.get(node, ()):
                if d not in queued:
                    queued.add(d)
                    queue.append(d)
            if old == 0:
                first = next(n for n, v in enumerate(products) if v)
                self.w1[node] = options[first]
            if total == 2:
                o1 = self.w1[node]
                other = next((opt for opt, v in zip(options, products, strict=True)
                              if v and opt != o1), None)
                if other is not None:
                    self.w2[node] = ("two", other, -1)
                else:
                    opt = next(o for o, v in zip(options, products, strict=True) if v >= 2)
                    ci = next(c for c, ch in enumerate(opt) if self._val(ch) >= 2)
                    self.w2[node] = ("deep", opt, ci)

    def trees(self) -> tuple[object, object]:
        """Two distinct internal trees for the whole sentence (count() must be 2)."""
        root: _Node = (1, self.g.T, 0, len(self.words))
        built: dict[tuple[_Node, int], tuple[object, ...]] = {}
        stack: list[tuple[_Node, int]] = [(root, 1), (root, 2)]
        while stack:
            node, which = stack[-1]
            if (node, which) in built:
                stack.pop()
                continue
            if node[0] == 2:
                built[(node, which)] = ("T", self.words[node[1]])
                stack.pop()
                continue
            if which == 1:
                opt = self.w1[node]
                deps = [(ch, 1) for ch in opt]
            else:
                _how, opt, ci = self.w2[node]
                deps = [(ch, 2 if c == ci else 1) for c, ch in enumerate(opt)]
            missing = [d for d in deps if d not in built]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            parts = [built[d] for d in deps]
            if node[0] == 0:
                built[(node, which)] = (*parts[0], parts[1]) if parts else ()
            else:
                p = self.g.item_prod[opt[0][1]]
                built[(node, which)] = ("N", p, parts[0])
        return built[(root, 1)], built[(root, 2)]


def _to_tree(g: _Compiled, internal: object, splice: bool) -> Tree:
    """Convert an internal tree (("N", p, children) / ("T", t)) to a :class:`Tree`, splicing
    synthetic nonterminals into their parents (or showing their display text)."""
    root_holder: list[Tree] = []
    stack: list[tuple[object, bool]] = [(internal, False)]
    out_stack: list[list[Tree]] = [root_holder]
    while stack:
        node, done = stack.pop()
        if done:
            children = out_stack.pop()
            assert isinstance(node, tuple)
            p = node[1]
            a = g.lhs[p]
            if a == g.T:
                out_stack[-1].extend(children)
                continue
            if splice and g.is_synthetic(a):
                out_stack[-1].extend(children)
                continue
            label = g.show(a)
            if g.alias[p]:
                label = f"{label}({g.alias[p]})"
            out_stack[-1].append(Tree(label, tuple(children)))
            continue
        assert isinstance(node, tuple)
        if node[0] == "T":
            out_stack[-1].append(Tree(g.show(node[1]), leaf=True))
            continue
        stack.append((node, True))
        out_stack.append([])
        for child in reversed(node[2]):
            stack.append((child, False))
    return root_holder[0]


# ---------------------------------------------------------------------------------------------
# Ambiguity search


class _Search:
    """Builds candidate sentences for LR(1) conflicts and tests them for two derivations."""

    def __init__(self, g: _Compiled, lr1: _Automaton, budget: _Budget) -> None:
        self.g = g
        self.lr1 = lr1
        self.budget = budget
        self.tested: dict[tuple[int, ...], tuple[Tree, Tree] | None] = {}
        self.closures: dict[int, dict[int, int]] = {}

    def closure(self, s: int) -> dict[int, int]:
        if s not in self.closures:
            self.closures[s] = self.g.expand(self.lr1.kernels[s], self.lr1.klas[s])[0]
        return self.closures[s]

    def actions(self, s: int, t: int) -> list[int]:
        """LR(1) actions of ``s`` on ``t``: -1 for shift, else the production to reduce."""
        out = [-1] if t in self.lr1.goto[s] else []
        out.extend(p for p, la in self.lr1.reds[s] if la >> t & 1)
        return out

    def after(self, stack: tuple[int, ...], action: int, t: int) -> list[tuple[int, ...] | None]:
        """Stacks after taking ``action`` on ``t`` and every reduction until ``t`` is shifted
        (None: accepted at end of input)."""
        g, lr1 = self.g, self.lr1
        results: list[tuple[int, ...] | None] = []
        work = [(stack, action)]
        steps = 0
        while work and len(results) < _MAX_STACKS and steps < 64:
            steps += 1
            self.budget.spend()
            st, act = work.pop()
            if act == -1:
                results.append((*st, lr1.goto[st[-1]][t]))
                continue
            if act == 0:
                results.append(None)
                continue
            rest = st[:len(st) - len(g.rhs[act])]
            target = lr1.goto[rest[-1]].get(g.lhs[act])
            if target is None:
                continue
            new = (*rest, target)
            for act2 in reversed(self.actions(target, t)):
                work.append((new, act2))
        return results

    def completions(self, stack: tuple[int, ...]) -> list[list[int]]:
        """Shortest symbol sequences that complete ``stack`` to an accepted input, one per
        kernel item of the top state (cheapest first)."""
        g, lr1 = self.g, self.lr1
        k = len(stack) - 1
        # dist over (position, nonterminal): cheapest completion after reducing that
        # nonterminal at that stack position.
        edges: dict[tuple[int, int], list[tuple[float, tuple[int, int], int]]] = {}
        for q, s in enumerate(stack):
            items = list(lr1.kernels[s])
            for c in self.closure(s):
                items.extend(g.base[p] for p in g.prods_of[c])
            for it in items:
                z = g.item_next[it]
                if z >= g.T:
                    d = g.item_dot[it]
                    src = (q - d, g.lhs[g.item_prod[it]])
                    rest = g.rhs[g.item_prod[it]][d + 1:]
                    edges.setdefault(src, []).append((g.seq_len(rest), (q, z), it))
            self.budget.spend(len(items))
        dist: dict[tuple[int, int], float] = {(0, g.T): 0.0}
        pred: dict[tuple[int, int], tuple[tuple[int, int], int]] = {}
        heap: list[tuple[float, tuple[int, int]]] = [(0.0, (0, g.T))]
        while heap:
            dv, v = heapq.heappop(heap)
            if dv > dist[v]:
                continue
            for w, u, it in edges.get(v, ()):
                nd = dv + w
                if nd < dist.get(u, float("inf")):
                    dist[u] = nd
                    pred[u] = (v, it)
                    heapq.heappush(heap, (nd, u))
        top = stack[-1]
        choices = []
        for it in lr1.kernels[top]:
            d = g.item_dot[it]
            a = g.lhs[g.item_prod[it]]
            key = (k - d, a)
            if key in dist:
                rest = g.rhs[g.item_prod[it]][d:]
                choices.append((g.seq_len(rest) + dist[key], it, key))
        choices.sort()
        out = []
        for _, it, key in choices[:_MAX_COMPLETIONS]:
            seq = list(g.rhs[g.item_prod[it]][g.item_dot[it]:])
            v = key
            while v in pred:
                v, via = pred[v]
                seq.extend(g.rhs[g.item_prod[via]][g.item_dot[via] + 1:])
            out.append(seq)
        return out

    def test(self, words: tuple[int, ...]) -> tuple[Tree, Tree] | None:
        if words in self.tested:
            return self.tested[words]
        forest = _Forest(self.g, words, self.budget)
        result = None
        if forest.count() >= 2:
            t1, t2 = forest.trees()
            a, b = _to_tree(self.g, t1, True), _to_tree(self.g, t2, True)
            if a == b:
                a, b = _to_tree(self.g, t1, False), _to_tree(self.g, t2, False)
            result = (a, b)
        self.tested[words] = result
        return result

    def prefixes(self, states: Sequence[int]) -> list[tuple[list[int], tuple[int, ...]]]:
        """Symbol prefixes (with their state stacks) reaching any of ``states``: the BFS
        paths, then one through each other predecessor."""
        out: list[tuple[list[int], tuple[int, ...]]] = []
        seen: set[tuple[int, ...]] = set()
        for s in states:
            syms, path = self.lr1.path(s)
            cands = [(syms, path)]
            for p, x in self.lr1.preds[s]:
                psyms, ppath = self.lr1.path(p)
                cands.append(([*psyms, x], [*ppath, s]))
            for syms2, path2 in cands:
                key = tuple(syms2)
                if key not in seen:
                    seen.add(key)
                    out.append((syms2, tuple(path2)))
                if len(out) >= _MAX_PREFIXES:
                    return out
        return out

    def run(self, raws: list[_RawConflict]
            ) -> tuple[tuple[int, ...], tuple[Tree, Tree] | None, dict[int, tuple[int, ...]]]:
        """Search one conflict group: (witness words, trees or None, example per action)."""
        g = self.g
        rep = raws[0]
        t = rep.lookahead
        examples: dict[int, tuple[int, ...]] = {}
        for syms, stack in self.prefixes([r.state for r in raws]):
            prefix_words = g.expand_yield(syms, _MAX_SENTENCE)
            if prefix_words is None:
                continue
            for n, (kind, _, items) in enumerate(rep.actions):
                act = -1 if kind == "shift" else g.item_prod[items[0]]
                for after in self.after(stack, act, t):
                    if after is None:
                        cands = [prefix_words]
                    else:
                        cands = []
                        for seq in self.completions(after):
                            rest = g.expand_yield(seq, _MAX_SENTENCE)
                            if rest is not None:
                                cands.append((*prefix_words, t, *rest))
                    for words in cands:
                        if len(words) > _MAX_SENTENCE:
                            continue
                        examples.setdefault(n, words)
                        found = self.test(words)
                        if found is not None:
                            return words, found, examples
        return (), None, examples


# ---------------------------------------------------------------------------------------------
# The entry point


def analyse(grammar: Grammar, *, max_states: int = 20_000,
            max_search_steps: int = 200_000,
            table_limit: TableLimit | None = None) -> Report:
    """Classify ``grammar`` (draft §4 verdicts) and explain every conflict.

    ``max_states`` bounds each automaton (LR(0), canonical LR(1)); ``max_search_steps``
    bounds the ambiguity search (Earley and simulation steps, shared by all conflicts); when
    it runs out, conflicts without a witness give ``not LR(1)``.

    ``table_limit(states, entries, rules, exact)``, when given, is called as the LALR(1)
    automaton grows, each time a state has been expanded, with lower bounds of the size of
    its action/goto table (``exact`` false: the states found, the shifts and gotos of those
    expanded, no rules yet), and once more, ``exact`` true, with the table's own counts as
    soon as its lookaheads are known, before any conflict is looked for: the states, the
    entries (one per state and symbol with a shift, goto or reduce) and the rules reduced
    by. It raises (whatever it likes) to stop the analysis there.

    Raises GrammarError (verdict ``rejected``) if an automaton needs more than
    ``max_states`` states, or the grammar is malformed (undefined symbol or start rule, a
    reachable rule deriving no finite input). Raises ValueError for non-positive budgets.
    """
    if max_states < 1 or max_search_steps < 0:
        raise ValueError("max_states must be >= 1 and max_search_steps >= 0")
    g = _Compiled(grammar)
    lalr = _build_lalr(g, max_states, table_limit)
    lalr_raw = _find_conflicts(g, lalr, overlaps=False)
    relevant = _overlap_candidates(g, lalr)
    for raw in lalr_raw:
        relevant |= 1 << raw.lookahead
    if not relevant:
        return Report(LALR1, (), len(lalr), 0)
    lr1 = _build_lr1(g, max_states, relevant)
    lr1_raw = _find_conflicts(g, lr1, overlaps=True)
    budget = _Budget(max_search_steps)
    search = _Search(g, lr1, budget)
    exhausted = False
    lr1_conflicts: list[Conflict] = []
    overlap_conflicts: list[Conflict] = []
    _resolve_overlaps(g, lr1, lr1_raw)
    groups = _group(g, lr1_raw)
    groups_left = sum(1 for grp in groups if grp[0].kind != "overlap")
    for grp in groups:
        rep = grp[0]
        prefix = tuple(g.show(x) for x in lr1.path(rep.state)[0])
        if rep.kind == "overlap":
            overlap_conflicts.append(Conflict(
                "overlap", "LR(1)", prefix, g.show(rep.lookahead), _make_actions(g, rep),
                terminal=g.show(rep.terminal), count=len(grp),
                hint=f"make the two readings distinct: use a different literal, or do not "
                     f"accept {g.show(rep.terminal)} (or value) where {g.show(rep.lookahead)}"
                     " is expected"))
            continue
        words: tuple[int, ...] = ()
        trees: tuple[Tree, Tree] | None = None
        examples: dict[int, tuple[int, ...]] = {}
        # An even share, but never so little that one candidate cannot be tested.
        share = max(budget.left // groups_left, min(budget.left, _MIN_SHARE))
        groups_left -= 1
        sub = _Budget(share)
        search.budget = sub
        try:
            words, trees, examples = search.run(grp)
        except _OutOfBudget:
            exhausted = True
        budget.left -= share - max(sub.left, 0)
        hint = ""
        if trees is not None:
            hint = ("the grammar allows both derivations; restructure the rules so that only "
                    "one is possible (for example split the rule into layers)")
        lr1_conflicts.append(Conflict(
            rep.kind, "LR(1)", prefix, g.show(rep.lookahead), _make_actions(g, rep, examples),
            count=len(grp), example=tuple(g.show(w) for w in words),
            derivations=tuple(trees) if trees else (), hint=hint))
    merge_conflicts = _merge_conflicts(g, lalr, lr1, lalr_raw, lr1_raw)
    conflicts = (*lr1_conflicts, *merge_conflicts, *overlap_conflicts)
    if overlap_conflicts or any(c.derivations for c in lr1_conflicts):
        verdict = AMBIGUOUS
    elif lr1_conflicts:
        verdict = NOT_LR1
    elif merge_conflicts:
        verdict = LR1_NOT_LALR1
    else:  # pragma: no cover - LR(1) was built only because LALR(1) had a candidate
        verdict = LALR1
    return Report(verdict, conflicts, len(lalr), len(lr1), exhausted)


def _resolve_overlaps(g: _Compiled, lr1: _Automaton, raws: list[_RawConflict]) -> None:
    """Replace each overlap's actions by the items that finally shift the literal and the
    general terminal (after the reductions each token triggers), so that overlaps reached
    through different reductions but meeting at the same items are reported once."""
    sim = _Search(g, lr1, _Budget(1 << 62))
    for raw in raws:
        if raw.kind != "overlap":
            continue
        _, path = lr1.path(raw.state)
        stack = tuple(path)
        actions: list[tuple[str, int, tuple[int, ...]]] = []
        for t in (raw.lookahead, raw.terminal):
            items: dict[int, None] = {}
            for act in sim.actions(raw.state, t):
                for after in sim.after(stack, act, t):
                    if after is None:  # pragma: no cover - $END is never an overlap
                        continue
                    s = after[-2]
                    for it in lr1.kernels[s]:
                        if g.item_next[it] == t:
                            items[it] = None
                    for c in sim.closure(s):
                        for x, it1 in g.starts[c]:
                            if x == t:
                                items[it1 - 1] = None
            actions.append(("shift", t, tuple(sorted(items))))
        raw.actions = actions


def _merge_conflicts(g: _Compiled, lalr: _Automaton, lr1: _Automaton,
                     lalr_raw: list[_RawConflict], lr1_raw: list[_RawConflict]
                     ) -> list[Conflict]:
    """LALR(1) conflicts that no LR(1) state of the same core has, with a merge hint."""
    core_of: dict[tuple[int, ...], int] = {k: s for s, k in enumerate(lalr.kernels)}
    lr1_by_core: dict[int, list[int]] = {}
    for s, kernel in enumerate(lr1.kernels):
        lr1_by_core.setdefault(core_of[kernel], []).append(s)
    lr1_clash = {(core_of[lr1.kernels[r.state]], r.lookahead)
                 for r in lr1_raw if r.kind != "overlap"}
    raws = [r for r in lalr_raw if (r.state, r.lookahead) not in lr1_clash]
    out = []
    for grp in _group(g, raws):
        rep = grp[0]
        t = rep.lookahead
        contexts: list[str] = []
        rules: list[str] = []
        for kind, _, items in rep.actions:
            if kind == "reduce":
                rules.append(g.show(g.lhs[g.item_prod[items[0]]]))
            for s in lr1_by_core.get(rep.state, ()):
                if kind == "shift":
                    hit = t in lr1.goto[s]
                else:
                    p = g.item_prod[items[0]]
                    hit = any(q == p and la >> t & 1 for q, la in lr1.reds[s])
                if hit:
                    shown = " ".join(g.show(x) for x in lr1.path(s)[0]) or "(start)"
                    if shown not in contexts:
                        contexts.append(shown)
                    break
        names = " or ".join(dict.fromkeys(rules))
        ctx = " and after ".join(sorted(contexts, key=lambda c: (len(c), c)))
        hint = (f"LALR(1) merges the LR(1) states after {ctx}: they have the same items but "
                f"different lookaheads, and only the merged state has the conflict on "
                f"{g.show(t)}. Give one of these contexts its own copy of {names} (a rule "
                "with a new name and the same alternatives), so the states stay apart.")
        prefix = tuple(g.show(x) for x in lalr.path(rep.state)[0])
        out.append(Conflict(rep.kind, "LALR(1)", prefix, g.show(t), _make_actions(g, rep),
                            count=len(grp), hint=hint))
    return out
