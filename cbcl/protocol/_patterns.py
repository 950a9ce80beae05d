"""String patterns in a safe regular subset, matched in linear time (spec/conversations.md
§2.4): the schema's ``(string :pattern "S-[0-9]+")``.

A pattern comes from an untrusted descriptor, so it is never handed to ``re`` (a
backtracking matcher: ``(a*)*b`` on a long run of ``a`` takes exponential time there).
Theory of operation:

1. *Parsing* (:func:`_Parser`) reads the subset — literals, ``.``, classes ``[a-z_]`` and
   ``[^…]``, the escapes ``\\d \\w \\s`` (ASCII meanings) and their capitals, escaped
   punctuation, ``\\n \\r \\t \\f \\v``, groups ``( )``, alternation ``|`` and the
   quantifiers ``? * + {n} {m,} {m,n}`` — into a small tree whose leaves are sets of code
   points (sorted, disjoint ranges). Everything else (backreferences, lookaround, ``(?``
   groups, anchors, lazy or possessive quantifiers, other escapes) is refused with the
   reason. A pattern always matches the *whole* string. Recursion is bounded by the group
   nesting limit.
2. *Thompson NFA.* The tree becomes an NFA with ε-moves; ``{m,n}`` is expanded into
   copies, and building stops as soon as the NFA has more than ``max_nfa_states`` states
   (so a ``((a{64}){64}){64}`` costs at most that much work before it is refused).
3. *Alphabet classes.* The boundaries of every range in the NFA split the code points
   into intervals that no edge tells apart; a character is replaced by the index of its
   interval (a table for ASCII, a binary search otherwise).
4. *DFA by subset construction*, eagerly, at load: at most ``max_dfa_states`` states and
   ``max_steps`` units of work (one per NFA state visited in a closure or a move). A
   pattern over either limit is refused at load, never at match time.
5. *Matching* walks the DFA's flat table: one lookup per character, no backtracking, no
   state set — O(len(text)) whatever the pattern, and it stops at the first character that
   leads to the dead state. An ASCII string is first mapped to its class ids in one
   ``bytes.translate``; in a state that loops on some classes, the run of such ids is
   skipped by the ``match`` of a byte class ``[…]*`` built here from the ids (the only use
   of ``re``, on a pattern of our making whose one greedy class-repeat with nothing after
   it cannot backtrack), which takes ``[0-9]+`` on long runs from ~570 to a few
   instructions a character.

Because both sides of a change are DFAs, language inclusion is decidable:
:func:`pattern_witness` explores the product of two DFAs (within a step budget) and gives a
shortest string one accepts and the other does not.
"""

from __future__ import annotations

import re
import threading
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeAlias, Union

from ..core._canonical import canonical_value
from ..core._errors import DescriptorError

#: The longest pattern, in characters.
MAX_PATTERN_CHARS = 256
#: The deepest nesting of groups ``( … )``.
MAX_PATTERN_DEPTH = 16
#: The largest bound in ``{m}``, ``{m,}``, ``{m,n}``.
MAX_PATTERN_REPEAT = 64
#: The most NFA states a pattern may compile to (repetitions expanded).
MAX_NFA_STATES = 1024
#: The most DFA states a pattern may compile to.
MAX_DFA_STATES = 256
#: The most cells (DFA states times alphabet classes) a pattern's table may have.
MAX_TABLE_CELLS = 16_384
#: The most work (NFA states visited in closures and moves) building the DFA may take.
MAX_PATTERN_STEPS = 100_000
#: The most work :func:`pattern_witness` may take (product transitions).
MAX_WITNESS_STEPS = 200_000

MAX_CODE_POINT = 0x10FFFF

Ranges: TypeAlias = tuple[tuple[int, int], ...]


class PatternError(DescriptorError):
    """A pattern outside the subset or over a limit (kind ``descriptor``)."""


class PatternBudgetError(DescriptorError):
    """:func:`pattern_witness` ran out of its step budget."""


# ----------------------------------------------------------------------------- the tree

@dataclass(frozen=True, slots=True)
class Chars:
    """One character from a set of code points."""

    ranges: Ranges


@dataclass(frozen=True, slots=True)
class Seq:
    items: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Alt:
    items: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Repeat:
    item: Node
    low: int
    high: int | None  # None: no maximum


Node: TypeAlias = Union[Chars, Seq, Alt, Repeat]  # noqa: UP007


def normalise_ranges(ranges: Iterable[tuple[int, int]]) -> Ranges:
    """``ranges`` of code points sorted, with overlapping and adjacent ones merged."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return tuple(out)


def complement(ranges: Ranges) -> Ranges:
    """The code points (0 to U+10FFFF) not in ``ranges`` (normalised)."""
    out: list[tuple[int, int]] = []
    start = 0
    for lo, hi in ranges:
        if lo > start:
            out.append((start, lo - 1))
        start = hi + 1
    if start <= MAX_CODE_POINT:
        out.append((start, MAX_CODE_POINT))
    return tuple(out)


ANY: Ranges = ((0, MAX_CODE_POINT),)
DIGIT: Ranges = ((0x30, 0x39),)
WORD: Ranges = normalise_ranges([(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)])
SPACE: Ranges = ((0x09, 0x0D), (0x20, 0x20))
_CLASS_ESCAPES: dict[str, Ranges] = {
    "d": DIGIT, "w": WORD, "s": SPACE,
    "D": complement(DIGIT), "W": complement(WORD), "S": complement(SPACE),
}
_CONTROL_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "f": "\f", "v": "\v"}


# ------------------------------------------------------------------------------ parsing

class _Parser:
    """A recursive-descent reader of the subset; recursion is bounded by the nesting limit."""

    def __init__(self, text: str, max_depth: int, max_repeat: int) -> None:
        self.text = text
        self.at = 0
        self.max_depth = max_depth
        self.max_repeat = max_repeat

    def fail(self, message: str, at: int | None = None) -> PatternError:
        where = self.at if at is None else at
        return PatternError(f"pattern {canonical_value(self.text)}: {message} "
                            f"(at character {where})")

    def peek(self) -> str | None:
        return self.text[self.at] if self.at < len(self.text) else None

    def parse(self) -> Node:
        node = self.alternation(0)
        if self.at < len(self.text):  # (only a ')' stops an alternation early)
            raise self.fail("unbalanced )")
        return node

    def alternation(self, depth: int) -> Node:
        items = [self.sequence(depth)]
        while self.peek() == "|":
            self.at += 1
            items.append(self.sequence(depth))
        return items[0] if len(items) == 1 else Alt(tuple(items))

    def sequence(self, depth: int) -> Node:
        items: list[Node] = []
        while (c := self.peek()) is not None and c not in "|)":
            items.append(self.quantified(self.atom(depth)))
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def atom(self, depth: int) -> Node:
        c = self.text[self.at]
        start = self.at
        self.at += 1
        if c == "(":
            if depth + 1 > self.max_depth:
                raise self.fail(f"groups nested more than {self.max_depth} deep", start)
            if self.peek() == "?":
                raise self.fail("(? groups (lookaround, flags, named or non-capturing "
                                "groups) are not in the pattern subset", start)
            inner = self.alternation(depth + 1)
            if self.peek() != ")":
                raise self.fail("a group ( is not closed", start)
            self.at += 1
            return inner
        if c == "[":
            return Chars(self.char_class(start))
        if c == ".":
            return Chars(ANY)
        if c == "\\":
            return Chars(self.escape(in_class=False))
        if c in "*+?{":
            raise self.fail(f"{c} has nothing to repeat", start)
        if c in "^$":
            raise self.fail(f"the anchor {c} is not in the pattern subset (a pattern always "
                            "matches the whole string)", start)
        if c in "]}":
            raise self.fail(f"an unescaped {c} (write \\{c})", start)
        return Chars(((ord(c), ord(c)),))

    def escape(self, in_class: bool) -> Ranges:
        start = self.at - 1
        c = self.peek()
        if c is None:
            raise self.fail("a pattern cannot end with \\", start)
        self.at += 1
        if c in _CLASS_ESCAPES:
            return _CLASS_ESCAPES[c]
        if c in _CONTROL_ESCAPES:
            cp = ord(_CONTROL_ESCAPES[c])
            return ((cp, cp),)
        if c.isascii() and not c.isalnum() and c.isprintable():
            return ((ord(c), ord(c)),)
        raise self.fail(f"the escape \\{c} is not in the pattern subset (allowed: \\d \\w \\s "
                        "\\D \\W \\S \\n \\r \\t \\f \\v and \\ before punctuation)", start)

    def class_char(self, start: int) -> Ranges:
        c = self.peek()
        if c is None:
            raise self.fail("a class [ is not closed", start)
        self.at += 1
        if c == "\\":
            return self.escape(in_class=True)
        if c == "[":
            raise self.fail("an unescaped [ inside a class (write \\[)", self.at - 1)
        return ((ord(c), ord(c)),)

    def char_class(self, start: int) -> Ranges:
        negated = self.peek() == "^"
        if negated:
            self.at += 1
        if self.peek() == "]":
            raise self.fail("a class cannot start with ] (write \\] inside it)", self.at)
        ranges: list[tuple[int, int]] = []
        while True:
            c = self.peek()
            if c is None:
                raise self.fail("a class [ is not closed", start)
            if c == "]":
                self.at += 1
                break
            item_at = self.at
            low = self.class_char(start)
            if (self.peek() == "-" and self.at + 1 < len(self.text)
                    and self.text[self.at + 1] != "]"):
                self.at += 1
                high = self.class_char(start)
                if len(low) != 1 or low[0][0] != low[0][1] or len(high) != 1 \
                        or high[0][0] != high[0][1]:
                    raise self.fail("a range's ends are single characters", item_at)
                if low[0][0] > high[0][0]:
                    raise self.fail("a range's start is after its end", item_at)
                ranges.append((low[0][0], high[0][0]))
            else:
                ranges.extend(low)
        merged = normalise_ranges(ranges)
        return complement(merged) if negated else merged

    def number(self) -> int | None:
        start = self.at
        while (c := self.peek()) is not None and c in "0123456789":
            self.at += 1
        if self.at == start:
            return None
        digits = self.text[start:self.at]
        if len(digits) > 6:  # (any such count is over the limit anyway)
            raise self.fail(f"a repetition count over {self.max_repeat}", start)
        return int(digits)

    def quantified(self, node: Node) -> Node:
        c = self.peek()
        start = self.at
        if c is None or c not in "*+?{":
            return node
        self.at += 1
        if c == "*":
            node = Repeat(node, 0, None)
        elif c == "+":
            node = Repeat(node, 1, None)
        elif c == "?":
            node = Repeat(node, 0, 1)
        else:
            low = self.number()
            if low is None:
                raise self.fail("{ starts a repetition {m}, {m,} or {m,n} (write \\{ for "
                                "the character)", start)
            high: int | None = low
            if self.peek() == ",":
                self.at += 1
                high = self.number()
            if self.peek() != "}":
                raise self.fail("a repetition {m}, {m,} or {m,n} is not closed", start)
            self.at += 1
            for bound in (low, high):
                if bound is not None and bound > self.max_repeat:
                    raise self.fail(f"a repetition count over {self.max_repeat}", start)
            if high is not None and low > high:
                raise self.fail("a repetition {m,n} with m greater than n", start)
            node = Repeat(node, low, high)
        if (after := self.peek()) is not None and after in "*+?{":
            raise self.fail("a quantifier cannot follow a quantifier (no lazy or possessive "
                            "forms)", self.at)
        return node


# ---------------------------------------------------------------------------- automata

class _NFA:
    """A Thompson NFA: per state its ε-successors and at most one character edge."""

    def __init__(self, max_states: int, pattern: str) -> None:
        self.eps: list[list[int]] = []
        self.edge: list[tuple[Ranges, int] | None] = []
        self.max_states = max_states
        self.pattern = pattern

    def state(self) -> int:
        if len(self.eps) >= self.max_states:
            raise PatternError(f"pattern {canonical_value(self.pattern)}: more than "
                               f"{self.max_states} automaton states (repetitions expanded)")
        self.eps.append([])
        self.edge.append(None)
        return len(self.eps) - 1

    def build(self, node: Node) -> tuple[int, int]:
        """A fragment (entry, exit) for ``node``."""
        if isinstance(node, Chars):
            entry, exit_ = self.state(), self.state()
            self.edge[entry] = (node.ranges, exit_)
            return entry, exit_
        if isinstance(node, Seq):
            entry = exit_ = self.state()
            for item in node.items:
                a, b = self.build(item)
                self.eps[exit_].append(a)
                exit_ = b
            return entry, exit_
        if isinstance(node, Alt):
            entry, exit_ = self.state(), self.state()
            for item in node.items:
                a, b = self.build(item)
                self.eps[entry].append(a)
                self.eps[b].append(exit_)
            return entry, exit_
        entry = exit_ = self.state()
        for _ in range(node.low):
            a, b = self.build(node.item)
            self.eps[exit_].append(a)
            exit_ = b
        if node.high is None:
            a, b = self.build(node.item)
            end = self.state()
            self.eps[exit_] += [a, end]
            self.eps[b] += [a, end]
            return entry, end
        end = self.state()
        for _ in range(node.high - node.low):
            a, b = self.build(node.item)
            self.eps[exit_] += [a, end]
            exit_ = b
        self.eps[exit_].append(end)
        return entry, end


@dataclass(frozen=True, slots=True, eq=False)
class Pattern:
    """A compiled pattern: its text, tree and DFA. :meth:`fullmatch` is O(len(text))."""

    text: str
    tree: Node
    #: Alphabet boundaries: a code point's class is ``bisect_right(bounds, cp)``.
    bounds: tuple[int, ...]
    classes: int
    #: ``table[state * classes + cls]`` is the next state times ``classes``, or -1 (dead).
    table: tuple[int, ...]
    #: The accepting states, as offsets (state times ``classes``).
    accepting: frozenset[int]
    states: int
    nfa_states: int
    #: The work building the DFA took (NFA states visited).
    compile_steps: int
    _ascii: tuple[int, ...] = field(repr=False)
    _ascii_bytes: bytes | None = field(repr=False)
    #: Per state offset (a sparse table, as ``table``): for a state with a self-loop, the
    #: ``match`` of the byte class ``[…]*`` of its looping class ids, else ``None``.
    _skips: tuple[Callable[[bytes, int], re.Match[bytes] | None] | None, ...] | None = \
        field(repr=False)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Pattern) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return compile_pattern, (self.text,)

    @property
    def cells(self) -> int:
        """The size of the DFA's table: states times alphabet classes."""
        return len(self.table)

    def fullmatch(self, text: str) -> bool:
        """True if the whole of ``text`` is in the pattern's language; raises nothing."""
        return self.run(text)[0]

    def run(self, text: str) -> tuple[bool, int]:
        """Whether ``text`` matches, and the characters read: ``len(text)``, or fewer when
        a character leads to the dead state (the walk stops there)."""
        table = self.table
        state = 0
        if text.isascii() and self._ascii_bytes is not None:
            ids = text.encode("ascii").translate(self._ascii_bytes)
            skips = self._skips
            if skips is None:
                for i, c in enumerate(ids):
                    state = table[state + c]
                    if state < 0:
                        return False, i + 1
                return state in self.accepting, len(ids)
            i, n = 0, len(ids)
            while i < n:
                state = table[state + ids[i]]
                i += 1
                if state < 0:
                    return False, i
                skip = skips[state]
                if skip is not None:  # (a [set]* match: linear, never backtracks)
                    i = skip(ids, i).end()  # type: ignore[union-attr]
            return state in self.accepting, n
        ascii_ids, bounds = self._ascii, self.bounds
        for i, ch in enumerate(text):
            cp = ord(ch)
            state = table[state + (ascii_ids[cp] if cp < 128 else bisect_right(bounds, cp))]
            if state < 0:
                return False, i + 1
        return state in self.accepting, len(text)

    def class_of(self, cp: int) -> int:
        return bisect_right(self.bounds, cp)


def compile_pattern(text: str, *, max_chars: int = MAX_PATTERN_CHARS,
                    max_depth: int = MAX_PATTERN_DEPTH, max_repeat: int = MAX_PATTERN_REPEAT,
                    max_nfa_states: int = MAX_NFA_STATES,
                    max_dfa_states: int = MAX_DFA_STATES,
                    max_steps: int = MAX_PATTERN_STEPS,
                    max_cells: int = MAX_TABLE_CELLS) -> Pattern:
    """Compile ``text`` (the pattern subset, whole-string match) to a DFA. With the default
    limits the result is memoised. Raises :class:`PatternError` (a
    :class:`DescriptorError`) naming the problem: outside the subset, or over a limit."""
    defaults = (max_chars, max_depth, max_repeat, max_nfa_states, max_dfa_states,
                max_steps, max_cells) == _DEFAULTS
    if defaults and type(text) is str:
        cached = _CACHE.get(text)
        if cached is not None:
            return cached
    if type(text) is not str:
        raise PatternError("a pattern is a string")
    if len(text) > max_chars:
        raise PatternError(f"a pattern of {len(text)} characters is longer than the maximum "
                           f"of {max_chars}")
    tree = _Parser(text, max_depth, max_repeat).parse()
    nfa = _NFA(max_nfa_states, text)
    entry, final = nfa.build(tree)
    compiled = _determinise(text, tree, nfa, entry, final, max_dfa_states, max_steps,
                            max_cells)
    if defaults:
        global _cached_cells
        with _CACHE_LOCK:
            while _CACHE and (len(_CACHE) >= _CACHE_MAX
                              or _cached_cells + len(compiled.table) > _CACHE_CELLS):
                _cached_cells -= len(_CACHE.pop(next(iter(_CACHE))).table)
            _CACHE[text] = compiled
            _cached_cells += len(compiled.table)
    return compiled


_DEFAULTS = (MAX_PATTERN_CHARS, MAX_PATTERN_DEPTH, MAX_PATTERN_REPEAT, MAX_NFA_STATES,
             MAX_DFA_STATES, MAX_PATTERN_STEPS, MAX_TABLE_CELLS)
# Compiled patterns by text (a process-wide memo, spec/cbcl-1.0.md: the text determines the
# pattern, a Pattern is immutable): at most _CACHE_MAX, each of at most MAX_PATTERN_CHARS
# characters and MAX_TABLE_CELLS cells, and at most _CACHE_CELLS cells in all (each cell
# is two pointers: a few MiB), the oldest dropped first.
_CACHE_MAX = 256
_CACHE_CELLS = 1 << 18
_cached_cells = 0
_CACHE: dict[str, Pattern] = {}
_CACHE_LOCK = threading.Lock()


def _determinise(text: str, tree: Node, nfa: _NFA, entry: int, final: int,
                 max_states: int, max_steps: int, max_cells: int) -> Pattern:
    bound_set: set[int] = set()
    for edge in nfa.edge:
        if edge is not None:
            for lo, hi in edge[0]:
                bound_set.add(lo)
                if hi < MAX_CODE_POINT:
                    bound_set.add(hi + 1)
    bound_set.discard(0)
    bounds = tuple(sorted(bound_set))
    classes = len(bounds) + 1
    covers: list[tuple[int, ...]] = []
    for edge in nfa.edge:
        ids: list[int] = []
        if edge is not None:
            for lo, hi in edge[0]:
                ids.extend(range(bisect_right(bounds, lo), bisect_right(bounds, hi) + 1))
        covers.append(tuple(ids))
    steps = 0

    def over() -> PatternError:
        return PatternError(f"pattern {canonical_value(text)}: building its automaton takes "
                            f"more than {max_steps} steps")

    def closure(seeds: set[int]) -> frozenset[int]:
        nonlocal steps
        seen = set(seeds)
        work = list(seeds)
        while work:
            s = work.pop()
            steps += 1
            for t in nfa.eps[s]:
                if t not in seen:
                    seen.add(t)
                    work.append(t)
        if steps > max_steps:
            raise over()
        return frozenset(s for s in seen if nfa.edge[s] is not None or s == final)

    if classes > max_cells:
        raise PatternError(f"pattern {canonical_value(text)}: an automaton table of more "
                           f"than {max_cells} cells (states times character classes)")
    start = closure({entry})
    index: dict[frozenset[int], int] = {start: 0}
    order = [start]
    rows: list[list[int]] = []
    for current in order:  # (grows while iterated: a work list)
        moves: dict[int, set[int]] = {}
        for s in current:
            edge = nfa.edge[s]
            if edge is None:
                continue
            target = edge[1]
            steps += len(covers[s])
            for cls in covers[s]:
                moves.setdefault(cls, set()).add(target)
        if steps > max_steps:
            raise over()
        row = [-1] * classes
        for cls, targets in moves.items():
            nxt = closure(targets)
            number = index.get(nxt)
            if number is None:
                if len(order) >= max_states:
                    raise PatternError(f"pattern {canonical_value(text)}: more than {max_states} "
                                       "deterministic automaton states")
                if (len(order) + 1) * classes > max_cells:
                    raise PatternError(f"pattern {canonical_value(text)}: an automaton table of "
                                       f"more than {max_cells} cells (states times character "
                                       "classes)")
                number = index[nxt] = len(order)
                order.append(nxt)
            row[cls] = number * classes
        rows.append(row)
    table = tuple(cell for row in rows for cell in row)
    accepting = frozenset(i * classes for i, states in enumerate(order) if final in states)
    ascii_ids = tuple(bisect_right(bounds, cp) for cp in range(128))
    ascii_bytes = bytes(ascii_ids) + bytes(128) if classes <= 256 else None
    skips: list[Callable[[bytes, int], re.Match[bytes] | None] | None] = [None] * len(table)
    for number, row in enumerate(rows):
        loops = bytes(c for c in range(min(classes, 256)) if row[c] == number * classes)
        if loops:
            skips[number * classes] = re.compile(
                b"[" + b"".join(b"\\x%02x" % c for c in loops) + b"]*").match
    return Pattern(text, tree, bounds, classes, table, accepting, len(order), len(nfa.eps),
                   steps, ascii_ids, ascii_bytes,
                   tuple(skips) if any(skips) and ascii_bytes is not None else None)


# ------------------------------------------------------------------------- comparisons

def representative(lo: int, hi: int) -> int:
    """A code point of ``[lo, hi]`` for a witness: a printable ASCII letter or digit if
    there is one, else ``lo``."""
    for preferred in (0x61, 0x41, 0x30, 0x2D, 0x20):
        if lo <= preferred <= hi:
            return preferred
    for cp in range(max(lo, 0x21), min(hi, 0x7E) + 1):
        return cp
    return lo


def pattern_witness(a: Pattern, b: Pattern | None, *,
                    max_steps: int = MAX_WITNESS_STEPS) -> str | None:
    """A shortest string ``a`` matches and ``b`` does not (``b`` ``None``: any string ``a``
    matches), or ``None`` if every string ``a`` matches ``b`` matches too. Raises
    :class:`PatternBudgetError` past ``max_steps`` product transitions."""
    b_bounds = b.bounds if b is not None else ()
    cuts = sorted(set(a.bounds) | set(b_bounds))
    edges = [0, *cuts, MAX_CODE_POINT + 1]
    letters = [(representative(edges[i], edges[i + 1] - 1),) for i in range(len(edges) - 1)]
    symbols = [(cp[0], a.class_of(cp[0]), b.class_of(cp[0]) if b is not None else 0)
               for cp in letters]
    start = (0, 0 if b is not None else -1)
    parent: dict[tuple[int, int], tuple[tuple[int, int], int] | None] = {start: None}
    queue = deque([start])
    steps = 0
    while queue:
        sa, sb = queue.popleft()
        b_accepts = b is not None and sb >= 0 and sb in b.accepting
        if sa in a.accepting and not b_accepts:
            out: list[str] = []
            node: tuple[int, int] | None = (sa, sb)
            while node is not None:
                link = parent[node]
                if link is None:
                    break
                node, cp = link
                out.append(chr(cp))
            return "".join(reversed(out))
        for cp, ca, cb in symbols:
            steps += 1
            if steps > max_steps:
                raise PatternBudgetError(f"comparing patterns {canonical_value(a.text)} and "
                                         f"{canonical_value(b.text) if b else 'any'} takes more "
                                         f"than {max_steps} steps")
            na = a.table[sa + ca]
            if na < 0:
                continue
            nb = -1 if b is None or sb < 0 else b.table[sb + cb]
            key = (na, nb)
            if key not in parent:
                parent[key] = ((sa, sb), cp)
                queue.append(key)
    return None


# ----------------------------------------------------------------------------- writing

def describe_pattern(pattern: str) -> str:
    """The pattern in words: ``matching the pattern "S-[0-9]+" (the whole string)``."""
    return f"matching the pattern {canonical_value(pattern)} (the whole string)"
