"""Pass 2: recognising a message's body with its protocol's grammar (and schema).

Theory of operation
-------------------
Pass 2 walks the body value (already read, under the message's limits, by pass 1) and
feeds its structure to the protocol's tables: ``(`` and ``)`` for lists, and each atom's
terminal. A symbol or keyword that spells a grammar literal is that literal only where
the parser can shift it after the reductions it triggers (:meth:`Tables.can_shift`);
elsewhere it is data. The checker has already refused every grammar with a point that
could take both readings, so the decision is never a guess.

The walk keeps no positions. When it refuses, :func:`explain_body` finds the first token
refused in the body's *value*, not its text (:func:`find_refusal`): where the extension is
built, by one walk of ``cbcl._native.refusal_of``, the recogniser's walk, which reports
where it stopped (the path, the node, the class and the keyword sets' masks, which
:func:`walker_marks` pairs with the node's stack); where those cannot be paired, by
walks of ``cbcl._native.recognise`` over runs of a list's elements, each ended by a probe
whose class no node holds, so the walk calls back where it got to (:func:`_search_native`).
The binary decoder's C walk reports its refusal the same way (``cbcl._native.decode_frame``).
Without the extension the walk is :func:`find_refusal_python`, one Python step a token up
to the refusal. The automaton's
node there is the LR stack the kernel's :func:`body_refusal` words the error from, in
the grammar's own terms, and the token's position in the text is found by stepping over
the elements before it on the way down (:func:`refusal_index`): in C, by one lexical pass
of ``cbcl._native.text_index`` over the text up to the token (any layout: spaces,
comments, text beyond ASCII; nothing is built); in Python (:func:`refusal_index_python`,
its twin), at once where the text is written as the canonical form writes it, else by
reading those elements again. The body is never scanned token by token, and nothing
past the refusal is looked at.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, NoReturn

from ..core._canonical import canonical_value
from ..core._errors import BodyError, Position, ProtocolError
from ..core._limits import Limits
from ..core._reader import (
    _CACHE,
    TOKEN,
    _atom,
    _read_value_c,
    context_of,
    fail,
    position_of,
    read_value_at,
    token_start,
)
from ..core._values import ATOM_TERMINALS, Keyword, Symbol, Value
from ..grammar._automaton import ACCEPT, REFUSED, StackAutomaton, apply_set_ops
from ..grammar._kernel import REFUSED as REFUSED_BY_GRAMMAR, body_refusal, feed
from ._hints import UNREAD, body_hint
from ._message import Intent, Message
from ._protocol import Protocol
from ._schema import check_schema

try:
    from .._native import (
        recognise as _speedups_recognise,
        refusal_of as _speedups_refusal_of,
        text_index as _speedups_text_index,
    )
except ImportError:  # not built: the Python walk runs
    _recognise_c: Any = None
    _refusal_of_c: Any = None
    _text_index_c: Any = None
else:
    _recognise_c = _speedups_recognise
    _refusal_of_c = _speedups_refusal_of
    _text_index_c = _speedups_text_index


def _start_terminal(protocol: Protocol, intent: Intent | None) -> str | None:
    """The start terminal of ``intent``'s rule (``body``'s for ``None``: a caller that
    does not know the intent), or ``None`` if the grammar has no such rule."""
    terminal = protocol.entries.get(intent) if intent is not None else None
    return terminal if terminal is not None else protocol.tables.start_terminals.get("body")


def start_node(protocol: Protocol, intent: Intent | None) -> Any:
    """The automaton node a body of ``intent`` starts from: the start node, or, where the
    descriptor gives intents start rules of their own, the node after the start terminal
    of ``intent``'s rule (``body`` for ``None``: a caller that does not know the intent)."""
    automaton = protocol.automaton
    node = automaton.start
    if protocol.entries:
        terminal = _start_terminal(protocol, intent)
        if terminal is None:
            return REFUSED
        found = node.get(terminal)
        node = found if found is not None else automaton.step(node, terminal)
    return node


def recogniser_start(protocol: Protocol, intent: Intent | None) -> Any:
    """:func:`start_node` in the protocol's :attr:`~Protocol.recogniser` (the automaton
    whose walks keep the keyword sets' masks themselves): where its walks start. Raises
    ``ValueError`` if the start terminal passes a keyword set's state (no start rule
    does: its terminal is shifted first)."""
    automaton = protocol.recogniser
    node = automaton.start
    if protocol.entries:
        terminal = _start_terminal(protocol, intent)
        if terminal is None:
            return REFUSED
        found = node.get(terminal)
        node = found if found is not None else automaton.step(node, terminal)
        if type(node) is tuple:  # pragma: no cover - a start terminal is shifted first
            raise ValueError("a start terminal passed a keyword set's state")
    return node


def start_stack(protocol: Protocol, intent: Intent | None) -> list[int]:
    """:func:`start_node` as a kernel stack (``[]`` where there is no rule to start at)."""
    tables = protocol.tables
    stack = [tables.start_state]
    if protocol.entries:
        terminal = _start_terminal(protocol, intent)
        if terminal is None or feed(tables, stack, terminal) == REFUSED_BY_GRAMMAR:
            return []
    return stack


def recognise_body(protocol: Protocol, body: Value, intent: Intent | None = None) -> bool:
    """Whether the protocol's grammar accepts ``body`` (a value already read under limits)
    as the body of an ``intent`` message. Iterative: no recursion on the body's depth.
    Each token is one transition of the protocol's :class:`StackAutomaton`; where the
    grammar takes any ``value``, a whole list is taken at once
    (:func:`cbcl.grammar._lalr.value_states`): it has been read, and any value is one. The walk is
    ``cbcl._native.recognise`` where that is built, else :func:`walk_body`."""
    node = recogniser_start(protocol, intent)
    if node is REFUSED:
        return False
    if _recognise_c is not None:
        accepted: bool = _recognise_c(body, node, protocol.atoms, ATOM_TERMINALS,
                                      protocol.recogniser.step, REFUSED, ACCEPT)
        return accepted
    return walk_body(protocol, body, node)


def walk_body(protocol: Protocol, body: Value, node: Any,
              automaton: StackAutomaton | None = None) -> bool:
    """The walk of :func:`recognise_body` from ``node`` of ``automaton`` (the protocol's
    :attr:`~Protocol.recogniser` by default), in Python (the reference of its C twin,
    ``cbcl._native.recognise``). The keyword sets' masks are kept here, in ``frames``,
    where the automaton's transitions say (:func:`apply_set_ops`; an automaton whose
    nodes carry them says nothing). Raises ``ValueError`` where ``node`` is inside a
    keyword set of such an automaton (its masks are not known here)."""
    step = (protocol.recogniser if automaton is None else automaton).step
    classes = protocol.atoms
    frames: list[int] = []  # the masks of the keyword sets under way, innermost last
    pending: list[Any] = []
    items: Any = iter((body,))
    while True:
        for item in items:
            kind = type(item)
            if kind is tuple:
                found = node.get("LPAR")
                if found is None:
                    found = step(node, "LPAR")
                if len(found) == 2:
                    node, whole = found
                else:
                    node, whole, ops = found
                    if node is not REFUSED and not apply_set_ops(frames, ops):
                        return False
                if node is REFUSED:
                    return False
                if not whole:
                    pending.append(items)
                    items = iter(item)
                    break
                continue
            cls = classes.get(item) if kind is Symbol or kind is Keyword else None
            if cls is None:
                cls = ATOM_TERMINALS.get(kind)
                if cls is None:  # not a CBCL value
                    return False
            found = node.get(cls)
            if found is None:
                found = step(node, cls)
            if type(found) is tuple:
                found, ops = found
                if not apply_set_ops(frames, ops):
                    return False
            elif found is REFUSED:
                return False
            node = found
        else:  # the list (or the body) is complete
            if not pending:
                break
            items = pending.pop()
            found = node.get("RPAR")
            if found is None:
                found = step(node, "RPAR")
            if type(found) is tuple:
                found, ops = found
                if not apply_set_ops(frames, ops):
                    return False
            elif found is REFUSED:
                return False
            node = found
    found = node.get("$END")
    if found is None:
        found = step(node, "$END")
    if type(found) is tuple:
        found, ops = found
        if not apply_set_ops(frames, ops):
            return False
    return found is ACCEPT


# --------------------------------------------------------------------------- the refusal

#: What a :class:`Refusal` points at: the value at its path (its ``(``, or the atom), the
#: ``)`` of the list at its path, or the end of the body.
ITEM, CLOSE, END = "item", "close", "end"


@dataclass(frozen=True, slots=True)
class Refusal:
    """Where the walk of a body found its first refused token: what it is (``kind``:
    :data:`ITEM`, :data:`CLOSE` or :data:`END`), its place in the body's value (``path``:
    the index of each list's element on the way down from the body, ``()`` for the body
    itself), the automaton node the token was fed to and its class (``LPAR``, ``RPAR``,
    ``$END``, or the atom's class as ``recognise`` gives it). ``marks``: the keyword
    sets' masks by stack depth where ``node`` is one of the :attr:`Protocol.recogniser`'s
    (whose nodes carry none: :func:`walker_marks`); ``None`` for a node of
    :attr:`Protocol.automaton`, which carries its own."""

    kind: str
    path: tuple[int, ...]
    node: Any
    cls: str
    marks: dict[int, int] | None = None


@dataclass
class RefusalWork:
    """What finding and explaining one refusal cost, counted (for the tests and the
    benchmark; pass one to :func:`explain_body`): ``steps``, tokens fed one at a time in
    Python; ``walks``, walks of a run of elements by ``cbcl._native.recognise``;
    ``walked``, the elements they went through (at most: a walk that was refused stopped
    in the part after its last probe); ``callbacks``, probes reached in them;
    ``reads``, values read again from the text to find the token's position; ``copied``,
    characters of canonical text written to compare with the text; ``scans``, lexical
    passes of ``cbcl._native.text_index`` (each up to the token) that found it instead."""

    steps: int = 0
    walks: int = 0
    walked: int = 0
    callbacks: int = 0
    reads: int = 0
    copied: int = 0
    scans: int = 0


def walker_marks(protocol: Protocol, node: Any, frames: tuple[int, ...]) -> dict[int, int] | None:
    """The keyword sets' masks by stack depth (as :func:`cbcl.grammar._kernel.feed` keeps
    them) of a walk of the protocol's :attr:`~Protocol.recogniser` at ``node``, whose
    walker kept ``frames``, the masks of the sets under way, innermost last (the C walks'
    report of a refusal). A set under way is a set's state on the stack with one of its
    members' keywords shifted on it, or on top; a set's state with anything else on it
    was ended (its frame is gone). ``None`` if the two do not pair up (the caller then
    finds the refusal by a walk of its own)."""
    tables = protocol.tables
    sets = tables.keyword_sets
    if not sets:
        return {} if not frames else None
    stack = protocol.recogniser.stack(node)
    actions = tables.actions
    top = len(stack) - 1
    under_way = [depth for depth, state in enumerate(stack) if state in sets and (
        depth == top or any(actions[state].get(member) == stack[depth + 1]
                            for member in sets[state].bits))]
    if len(under_way) != len(frames):
        return None
    return {depth: mask for depth, mask in zip(under_way, frames, strict=True) if mask}


def _class_of(protocol: Protocol, item: Any) -> str | None:
    """The class ``recognise`` feeds for an atom (``None``: not a CBCL value)."""
    kind = type(item)
    cls = protocol.atoms.get(item) if kind is Symbol or kind is Keyword else None
    return ATOM_TERMINALS.get(kind) if cls is None else cls


def _feed_atom(protocol: Protocol, node: Any, item: Any) -> tuple[str, Any]:
    """The class of atom ``item`` and the node after feeding it from ``node`` (``REFUSED``
    if the grammar refuses it there). Raises ``TypeError`` if ``item`` is not a CBCL value."""
    cls = _class_of(protocol, item)
    if cls is None:
        raise TypeError(f"not a CBCL value: {type(item).__name__}")
    found = node.get(cls)
    return cls, protocol.automaton.step(node, cls) if found is None else found


def find_refusal(protocol: Protocol, body: Value, intent: Intent | None = None,
                 work: RefusalWork | None = None) -> Refusal | None:
    """The first token of ``body`` (a value already read) that the grammar refuses for an
    ``intent`` message, or ``None`` if it accepts the body. By probes of
    ``cbcl._native.recognise`` where that is built (:func:`_search_native`: the work in C
    is about one walk of the body up to the refusal, the work in Python a few steps per
    level of lists on the way down), else by :func:`find_refusal_python`. Raises
    ``ValueError`` where the grammar has no rule for ``intent`` bodies."""
    node = start_node(protocol, intent)
    if node is REFUSED:
        raise ValueError(f"the {protocol.id} grammar has no rule for these bodies")
    work = RefusalWork() if work is None else work
    if _recognise_c is None:
        return find_refusal_python(protocol, body, node, work)
    return _walk_native(protocol, body, intent, node, work)


#: The kinds of ``cbcl._native.refusal_of``'s report, by its number for them.
_REPORTED = ("", ITEM, CLOSE, END)


def _walk_native(protocol: Protocol, body: Value, intent: Intent | None, node: Any,
                 work: RefusalWork) -> Refusal | None:
    """:func:`find_refusal`'s native tier: one walk of ``cbcl._native.refusal_of`` (the
    recogniser's walk, which reports where it stopped: the path, the node, the class and
    the keyword sets' masks), so the body is walked once, to the refusal; where the masks
    cannot be paired with the node's sets (:func:`walker_marks`), or the module has no
    such walk, by probes of ``recognise`` from ``node`` (:func:`_search_native`)."""
    start = recogniser_start(protocol, intent)
    if _refusal_of_c is not None and start is not REFUSED:
        work.walks += 1
        report = _refusal_of_c(body, start, protocol.atoms, ATOM_TERMINALS,
                               protocol.recogniser.step, REFUSED, ACCEPT)
        if report is None:
            return None
        refusal = reported_refusal(protocol, report)
        if refusal is not None:
            return refusal
    return _search_native(protocol, body, node, work)  # pragma: no cover - (see above)


def reported_refusal(protocol: Protocol, report: tuple[Any, ...]) -> Refusal | None:
    """The :class:`Refusal` a native walk reported (``cbcl._native.refusal_of``'s, or the
    parse entry's: ``(kind, path, node, cls, frames)``), or ``None`` where its masks cannot
    be paired with the node's keyword sets (:func:`walker_marks`: the caller finds the
    refusal by a walk of its own)."""
    kind, path, at, cls, frames = report
    marks = walker_marks(protocol, at, frames)
    return None if marks is None else Refusal(_REPORTED[kind], path, at, cls, marks)


def find_refusal_python(protocol: Protocol, body: Value, node: Any,
                        work: RefusalWork | None = None) -> Refusal | None:
    """:func:`walk_body` from ``node``, keeping the path: the reference of the search by
    probes, and the search itself where ``cbcl._native`` is not built. Iterative; one
    step a token up to the refusal, whole values taken at once."""
    work = RefusalWork() if work is None else work
    found = _walk_python(protocol, (body,), 0, 1, node, None, work)
    if type(found) is Refusal:
        return found
    work.steps += 1
    end = found.get("$END")
    if end is None:
        end = protocol.automaton.step(found, "$END")
    return None if end is ACCEPT else Refusal(END, (), found, "$END")


def _walk_python(protocol: Protocol, items: tuple[Any, ...], lo: int, hi: int, node: Any,
                 path: tuple[int, ...] | None, work: RefusalWork) -> Any:
    """Elements ``lo`` to ``hi - 1`` of ``items`` (the list at ``path``; ``None``: the
    body's own level, ``(body,)``) fed from ``node`` one Python step a token: the
    :class:`Refusal` of the first token refused in them, or the node after them."""
    step = protocol.automaton.step
    frames: list[list[Any]] = [[items, lo - 1, path, hi]]  # [list, index, path, end]
    while True:
        top = frames[-1]
        top[1] += 1
        if top[1] == top[3]:  # the range, or a list in it, is complete
            if len(frames) == 1:
                return node
            frames.pop()
            work.steps += 1
            found = node.get("RPAR")
            if found is None:
                found = step(node, "RPAR")
            if found is REFUSED:
                return Refusal(CLOSE, top[2], node, "RPAR")
            node = found
            continue
        item = top[0][top[1]]
        here = () if top[2] is None else (*top[2], top[1])
        work.steps += 1
        if type(item) is tuple:
            found = node.get("LPAR")
            if found is None:
                found = step(node, "LPAR")
            target, whole = found
            if target is REFUSED:
                return Refusal(ITEM, here, node, "LPAR")
            node = target
            if not whole:
                frames.append([item, -1, here, len(item)])
        else:
            cls, found = _feed_atom(protocol, node, item)
            if found is REFUSED:
                return Refusal(ITEM, here, node, cls)
            node = found


class _Probe:
    """An element of a run the native walk is handed, after each part of the run: its
    class is one no node holds, so the walk calls the step function there, which notes
    where the walk got to (see :func:`_search_native`)."""

    __slots__ = ()


_PROBE = _Probe()
_PROBE_CLASS = "\x00probe"  # (never a terminal: the tables' names are identifiers)
_PROBE_TERMINALS: dict[type, str] = {**ATOM_TERMINALS, _Probe: _PROBE_CLASS}
#: The parts of a run one native walk tells apart (a probe after each).
_PROBES = 16
#: Runs of at most this many elements are stepped through in Python, lists entered.
_SMALL_RUN = 8
#: Native walks that may meet the refusal before a Python walk finishes the search.
_REFUSED_WALKS = 12


class _Reached(Exception):
    """A walk got to its last probe: the whole run was accepted."""


class _Level:
    """One list under search (the body's own level is ``(body,)``, closed by ``$END``):
    its elements, the path to it, the node before element ``lo``, and ``hi`` once the
    refusal is known to be in elements ``lo`` to ``hi - 1`` (``None`` before: it may be
    at the list's end, or the list may be accepted)."""

    __slots__ = ("hi", "items", "lo", "node", "path", "root")

    def __init__(self, items: tuple[Any, ...], path: tuple[int, ...], node: Any,
                 root: bool = False) -> None:
        self.items = items
        self.path = path
        self.node = node
        self.lo = 0
        self.hi: int | None = None
        self.root = root


def _search_native(protocol: Protocol, body: Value, start: Any,
                   work: RefusalWork) -> Refusal | None:
    """:func:`find_refusal_python`'s answer, found with walks of ``cbcl._native.recognise``.

    A run of a list's elements is walked from the node before its first one by handing
    ``recognise`` the run, with a probe (:class:`_Probe`) after each of up to
    :data:`_PROBES` parts, from a node made for the purpose whose ``(`` leads to that
    node. At each probe the step function is called (its class is in no node) and notes
    the node the walk got to: a walk that reaches the last probe has accepted the run;
    one that stops short was refused in the part after the last probe it reached, which
    is walked next, from that probe's node. So a list is walked once up to the refusal,
    and its parts again, each a sixteenth of the last, until a few elements are left;
    those are stepped through in Python (an atom fed, a list entered and searched the
    same way). A list every element of which is accepted is closed (``)``; the body,
    ``$END``). Each walk that meets the refusal walks to it again; after
    :data:`_REFUSED_WALKS` of them (a refusal deep in lists nested many levels, each with
    many elements), the rest is walked in Python (:func:`_walk_python`), one step a
    token, so the work stays within a few walks of the body to the refusal."""
    automaton = protocol.automaton
    step = automaton.step
    atoms = protocol.atoms
    refused_walks = 0

    def walk(level: _Level, end: int) -> bool:
        """Walk elements ``lo`` to ``end - 1`` of ``level``: ``True`` if accepted (``lo``
        and ``node`` move past them), else ``False``: ``lo``, ``node`` and ``hi`` narrow
        to the part that holds the refusal."""
        lo, items = level.lo, level.items
        part = -(-(end - lo) // _PROBES)
        parts = -(-(end - lo) // part)
        run: list[Any] = []
        for at in range(lo, end, part):
            run.extend(items[at:min(at + part, end)])
            run.append(_PROBE)
        reached: list[Any] = []

        def probe_step(node: Any, cls: str) -> Any:
            if cls == _PROBE_CLASS:
                work.callbacks += 1
                reached.append(node)
                if len(reached) == parts:
                    raise _Reached
                return node  # (the walk goes on: a probe is a transition to itself)
            return step(node, cls)

        work.walks += 1
        try:
            _recognise_c(tuple(run), {"LPAR": (level.node, False)}, atoms,
                         _PROBE_TERMINALS, probe_step, REFUSED, ACCEPT)
        except _Reached:
            work.walked += end - lo
            level.node, level.lo = reached[-1], end
            return True
        work.walked += min(end - lo, (len(reached) + 1) * part)  # (it stopped in that part)
        if reached:
            level.node = reached[-1]
            level.lo = lo + len(reached) * part
        level.hi = min(end, level.lo + part)
        return False

    levels = [_Level((body,), (), start, root=True)]
    while True:
        level = levels[-1]
        items, lo, node, hi = level.items, level.lo, level.node, level.hi
        end = len(items) if hi is None else hi
        if lo == end:  # every element accepted: the list's end
            if hi is not None:  # pragma: no cover - the refusal was in there
                raise AssertionError("a run holding the refusal was accepted")
            cls = "$END" if level.root else "RPAR"
            work.steps += 1
            found = node.get(cls)
            if found is None:
                found = step(node, cls)
            if level.root:
                return None if found is ACCEPT else Refusal(END, (), node, cls)
            if found is REFUSED:
                return Refusal(CLOSE, level.path, node, cls)
            levels.pop()
            parent = levels[-1]
            parent.node, parent.lo = found, parent.lo + 1
            continue
        if end - lo > _SMALL_RUN:
            if refused_walks < _REFUSED_WALKS:
                if not walk(level, end):
                    refused_walks += 1
                elif hi is not None:  # pragma: no cover - the refusal was in there
                    raise AssertionError("a run holding the refusal was accepted")
                continue
            found = _walk_python(protocol, items, lo, end, node, level.path, work)
            if type(found) is Refusal:
                return found
            if hi is not None:  # pragma: no cover - the refusal was in there
                raise AssertionError("a run holding the refusal was accepted")
            level.node, level.lo = found, end
            continue
        # A few elements: an atom is fed, a list entered (the refusal may be inside).
        item = items[lo]
        here = () if level.root else (*level.path, lo)
        work.steps += 1
        if type(item) is tuple:
            found = node.get("LPAR")
            if found is None:
                found = step(node, "LPAR")
            target, whole = found
            if target is REFUSED:
                return Refusal(ITEM, here, node, "LPAR")
            if not whole:
                levels.append(_Level(item, here, target))
                continue
            found = target
        else:
            atom, found = _feed_atom(protocol, node, item)
            if found is REFUSED:
                return Refusal(ITEM, here, node, atom)
        level.node, level.lo = found, lo + 1


# --------------------------------------------------------------------------- positions

_DELIMITERS = frozenset(" \t\r\n();")


def _skip(text: str, pos: int, items: tuple[Any, ...], limits: Limits,
          work: RefusalWork) -> int:
    """The index just after the last of ``items``, consecutive elements of a list whose
    first starts at or after character ``pos`` of ``text`` (whitespace and comments may
    come first; the text has been read whole, so it is well formed). Text written as
    :func:`canonical_value` writes it (one space between elements) is stepped over at
    once, by comparing the canonical text of ``items`` with it; otherwise a run of atoms
    is stepped over by a pattern matching many at once (:data:`_ATOM_RUNS`), and each
    list is read again (:func:`_end_of`)."""
    if not items:
        return pos
    at = pos + 1 if pos < len(text) and text[pos] == " " else pos
    written = canonical_value(items)  # "(" + the items, one space apart + ")"
    work.copied += len(written)
    end = at + len(written) - 2
    # (the last atom must end where the canonical one does: "1.50" is not "1.5")
    if text.startswith(written[1:-1], at) and (end == len(text) or text[end] in _DELIMITERS):
        return end
    index, count = 0, len(items)
    while index < count:
        if type(items[index]) is tuple:
            work.reads += 1
            pos = _end_of(text, pos, limits)
            index += 1
            continue
        atoms = index
        while index < count and type(items[index]) is not tuple:
            index += 1
        atoms = index - atoms
        work.reads += atoms
        for size, pattern in _ATOM_RUNS:
            while atoms >= size:
                match = pattern.match(text, pos)
                if match is None:  # pragma: no cover - the text was read whole
                    raise AssertionError("atoms the reader read were not found again")
                pos = match.end()
                atoms -= size
    return pos


#: Patterns matching runs of 64, 8 and 1 atoms (with the whitespace and comments before
#: each) in text the reader has read: an atom is a string or a run of characters up to a
#: delimiter, a comment runs to the line's end.
_ATOM_RUNS = tuple(
    (size, re.compile(r'(?:(?:[ \t\r\n]++|;[^\r\n]*+)*+(?:"(?:[^"\\]++|\\.)*+"'
                      r'|[^ \t\r\n();"]++)){' + str(size) + "}", re.DOTALL))
    for size in (64, 8, 1))


def _end_of(text: str, pos: int, limits: Limits) -> int:
    """The index just after the value at or after character ``pos`` of ``text`` (read
    whole before), read again: by ``cbcl._native.read_value`` where that is built, from
    ``pos`` for ASCII text, else from a slice starting there (it reads text beyond ASCII
    from its start only), widened until the value ends inside it; else by the Python
    reader."""
    if _read_value_c is not None:
        whole = text.isascii()
        window = len(text) if whole else 256
        while True:
            piece = text if whole else text[pos:pos + window]
            found = _read_value_c(piece, pos if whole else 0, _CACHE, _atom,
                                  limits.max_depth, limits.max_list_items, limits.max_nodes,
                                  limits.max_string_bytes, limits.max_name_chars, None)
            if whole or pos + window >= len(text):
                break
            if found is not None and found[1] < len(piece):  # ended inside the slice
                return pos + int(found[1])
            window *= 8
        if found is not None:
            return int(found[1]) + (0 if whole else pos)
    return read_value_at(text, pos, limits, 0, 0)[1]


def _before(text: str, value: Any, path: tuple[int, ...], limits: Limits,
            work: RefusalWork) -> int:
    """Where the token of the value at ``path`` in ``value`` may start: the index just
    after the element before it, or after its list's ``(`` (``value``'s token is the
    first of ``text``, after whitespace and comments)."""
    pos = 0
    for index in path:
        match = TOKEN.match(text, pos)
        assert match is not None
        opened = token_start(match)  # the '(' of the list ``value``
        pos = _skip(text, opened + 1, value[:index], limits, work)
        value = value[index]
    return pos


def token_at(text: str, pos: int) -> int:
    """Where the token at or after character ``pos`` starts (as the reader says: a
    string at its quote, a keyword at its colon)."""
    match = TOKEN.match(text, pos)
    assert match is not None
    return token_start(match)


def path_index(text: str, value: Any, path: tuple[int, ...], limits: Limits,
               work: RefusalWork | None = None) -> int:
    """The character index in ``text`` (a document read whole, whose value is ``value``)
    of the token that starts the value at ``path`` in it, found by stepping over the
    elements before it on the way down (in C, by ``cbcl._native.text_index``, where that
    is built)."""
    if _text_index_c is not None:
        if work is not None:
            work.scans += 1
        index: int = _text_index_c(text, path, 1)
        return index
    return token_at(text, _before(text, value, path, limits,
                                  RefusalWork() if work is None else work))


def body_path(message: Message) -> tuple[int, int]:
    """The path of the body in the message's value (:meth:`Message.to_value`): its field
    comes last but for the signature."""
    return (len(message.to_value()) - 1 - (message.signature is not None), 1)


#: ``cbcl._native.text_index``'s number for each kind of :class:`Refusal`.
_KIND_NUMBERS = {ITEM: 1, CLOSE: 2, END: 3}


def refusal_index(text: str, message: Message, refusal: Refusal, limits: Limits,
                  work: RefusalWork | None = None) -> int:
    """The character index in ``text`` (the document whose message is ``message``) of the
    token ``refusal`` points at: where the old token-by-token scan raised its error. By
    ``cbcl._native.text_index`` where that is built (one lexical pass in C over the text
    up to the token, any layout: nothing is read again; counted in ``work.scans``), else
    by :func:`refusal_index_python`, its twin."""
    if _text_index_c is not None:
        if work is not None:
            work.scans += 1
        index: int = _text_index_c(text, (*body_path(message), *refusal.path),
                                   _KIND_NUMBERS[refusal.kind])
        return index
    return refusal_index_python(text, message, refusal, limits, work)


def refusal_index_python(text: str, message: Message, refusal: Refusal, limits: Limits,
                         work: RefusalWork | None = None) -> int:
    """:func:`refusal_index` in Python (the reference of ``cbcl._native.text_index``): the
    elements before the token stepped over on the way down, at once where the text is
    written as the canonical form writes it, else by reading them again."""
    work = RefusalWork() if work is None else work
    document = message.to_value()
    path = (*body_path(message), *refusal.path)
    if refusal.kind == ITEM:
        return token_at(text, _before(text, document, path, limits, work))
    value: Any = document
    for index in path:
        value = value[index]
    opened = token_at(text, _before(text, document, path, limits, work))
    if refusal.kind == CLOSE:  # the ')' after the list's elements
        return token_at(text, _skip(text, opened + 1, value, limits, work))
    return _skip(text, opened, (value,), limits, work)  # END: just after the body


def _heads(body: Value, refusal: Refusal) -> tuple[list[object], bool]:
    """The heads of the lists open at the refused token as the hint takes them (a list's
    first element once read: the atom, or ``None`` for a list; :data:`UNREAD` before),
    outermost first, and whether the token is the first element of its list."""
    heads: list[object] = []
    value: Any = body
    path = refusal.path
    for depth, index in enumerate(path):
        if index:
            heads.append(None if type(value[0]) is tuple else value[0])
        else:  # the element under way is the first: the refused atom, or a list
            heads.append(UNREAD if refusal.kind == ITEM and depth == len(path) - 1
                         else None)
        value = value[index]
    if refusal.kind == CLOSE:  # the list being closed is open too
        heads.append((None if type(value[0]) is tuple else value[0]) if value else UNREAD)
    at_head = refusal.kind == ITEM and refusal.cls != "LPAR" and bool(path) and \
        path[-1] == 0
    return heads, at_head


#: Up to this many characters of text, the refused token is found by the Python walk: a
#: few hundred tokens at most, which it steps through faster than the probes would start.
_SMALL_TEXT = 2048


def explain_body(protocol: Protocol, text: str, message: Message, limits: Limits, *,
                 refusal: Refusal | None = None,
                 work: RefusalWork | None = None) -> NoReturn:
    """Raise the :class:`BodyError` at the first token of ``message``'s body the grammar
    refuses: ``text`` is the document ``message`` was read from (or its canonical text),
    and pass 2 has refused the body.

    ``refusal``: where the refused token is, if the caller knows it already; else
    :func:`find_refusal` finds it in the body's value, at about the cost of one native
    walk of the body up to it. The error is worded from the automaton's stack there, by
    :func:`cbcl.grammar._kernel.body_refusal`; its position is found in ``text`` by
    stepping over the elements before it on the way down (:func:`refusal_index`),
    never by scanning the body token by token. ``work`` counts what was done."""
    work = RefusalWork() if work is None else work
    intent = message.intent
    shown_intent = None if intent is None else intent.value
    body: Value = message.body  # type: ignore[assignment]  # (pass 2 refused a body)
    if refusal is None:
        node = start_node(protocol, intent)
        if node is REFUSED:  # pragma: no cover - the descriptor gives every governed intent a rule
            fail(text, path_index(text, message.to_value(), body_path(message), limits, work),
                 f"the {protocol.id} grammar has no rule for {shown_intent} bodies",
                 error=BodyError)
        # (in a short text, a walk in Python gets there before the native one would start)
        refusal = find_refusal_python(protocol, body, node, work) \
            if _recognise_c is None or len(text) <= _SMALL_TEXT \
            else _walk_native(protocol, body, intent, node, work)
    if refusal is None:  # pragma: no cover - pass 2 refused this body
        raise AssertionError("explain_body found no error")
    start = refusal_index(text, message, refusal, limits, work)
    raise refusal_error(protocol, body, refusal, intent, position_of(text, start),
                        context_of(text, start), work)


def refusal_error(protocol: Protocol, body: Value, refusal: Refusal, intent: Intent | None,
                  position: Position | None = None, context: str | None = None,
                  work: RefusalWork | None = None) -> BodyError:
    """The :class:`BodyError` (message, expected items, hint) of ``refusal`` in ``body``,
    an ``intent`` body, at ``position``: worded by :func:`body_refusal` from the
    automaton's stack at the refused token, as for a text body, so any form of a body
    (text here; a binary frame's value, whose caller knows the token's place) can be
    refused alike."""
    automaton = protocol.automaton
    node = refusal.node
    stack = automaton.stack(node)
    marks = automaton.marks(node) if refusal.marks is None else dict(refusal.marks)
    value: Any = None
    terminal = refusal.cls
    if refusal.kind == ITEM and terminal != "LPAR":
        value = body
        for index in refusal.path:
            value = value[index]
        terminal = automaton.terminal(node, terminal)
    if work is not None:
        work.steps += 1
    if feed(protocol.tables, stack, terminal, marks=marks) != REFUSED_BY_GRAMMAR:
        raise AssertionError("the grammar took the token the walk refused")  # pragma: no cover
    shown_intent = None if intent is None else intent.value
    message, expected = body_refusal(protocol, stack, terminal, value, marks, shown_intent)
    error = BodyError(message, position=position, context=context, expected=expected)
    heads, at_head = _heads(body, refusal)
    error.hint_material = body_hint(protocol, stack, terminal, value, marks, shown_intent,
                                    heads, at_head)
    return error


# Intents valid in every conversation (NOT-UNDERSTOOD) or that end one (CANCEL): a
# protocol need not govern them, and then their body is absent or a reason string.
_ALWAYS_ADMITTED = (Intent.NOT_UNDERSTOOD, Intent.CANCEL)


def check_intent_and_body(protocol: Protocol, message: Message) -> bool | None:
    """Pass 2 for one message: ``True`` if accepted, ``False`` if the grammar refuses the
    body (the caller explains where), ``None`` for a NOT-UNDERSTOOD or CANCEL the protocol
    does not govern (accepted: its body is absent or a reason string). A governed body the
    grammar accepts must also satisfy the descriptor's schema.

    Raises :class:`ProtocolError` for an intent the protocol does not govern,
    :class:`BodyError` for a governed intent without a body, and :class:`SchemaError` for
    a body that breaks the schema.
    """
    if _admitted_ungoverned(protocol, message):
        return None
    if not recognise_body(protocol, message.body, message.intent):  # type: ignore[arg-type]
        return False
    if protocol.schema is not None:
        check_schema(protocol.schema, message.body)  # type: ignore[arg-type]
    return True


def find_body_refusal(protocol: Protocol, message: Message,
                      work: RefusalWork | None = None) -> Refusal | None:
    """:func:`check_intent_and_body` for a message pass 2 most likely refuses (its native
    tier declined it): where that returns ``False``, the :class:`Refusal` for
    :func:`explain_body`, found by :func:`find_refusal` in place of the walk that only
    says no; ``None`` where it returns ``True`` or ``None``. Raises as it does, and
    :class:`BodyError` for an intent the grammar has no rule for."""
    if _admitted_ungoverned(protocol, message):
        return None
    try:
        refusal = find_refusal(protocol, message.body, message.intent,  # type: ignore[arg-type]
                               work)
    except ValueError:  # pragma: no cover - the descriptor gives every governed intent a rule
        raise BodyError(f"the {protocol.id} grammar has no rule for "
                        f"{message.intent.value} bodies") from None
    if refusal is None and protocol.schema is not None:
        check_schema(protocol.schema, message.body)  # type: ignore[arg-type]
    return refusal


def _admitted_ungoverned(protocol: Protocol, message: Message) -> bool:
    """Whether ``message`` is a NOT-UNDERSTOOD or CANCEL its protocol does not govern,
    with no body or a reason string (accepted without its grammar). Raises as
    :func:`check_intent_and_body` for an intent not governed, or a governed one without
    a body."""
    descriptor = protocol.descriptor
    if message.intent not in protocol.governed:
        if message.intent in _ALWAYS_ADMITTED:
            if message.body is None or type(message.body) is str:
                return True
            raise BodyError(f"a {message.intent.value} body that {descriptor.id} does not "
                            "govern must be absent or a reason string")
        governed = " ".join(intent.value for intent in descriptor.intents)
        raise ProtocolError(f"{descriptor.id} does not govern {message.intent.value} "
                            f"messages (it governs {governed})")
    if message.body is None:
        error = BodyError(f"{descriptor.id} requires a body for {message.intent.value}")
        error.hint_material = body_hint(protocol, (), "$END", None, None,
                                        message.intent.value, (), False)
        raise error
    return False
