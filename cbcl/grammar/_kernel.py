"""The recognition kernel: the one LR driver over CBCL's LALR tables, and the one body refusal.

Theory of operation
-------------------
Every careful recogniser in CBCL (pass 1's :func:`cbcl.protocol._envelope.scan_envelope`, pass 2's
:func:`cbcl.protocol._pass2.explain_body`, the binary decoder's
:func:`cbcl.binary._codec._walk_body`,
and the tests' oracle) is a loop that turns its input into terminals and hands each one to
:func:`feed`, which does what an LALR(1) driver does with one lookahead: reduce while the
tables say reduce (popping the stack and taking the goto), then shift, accept or refuse.
The caller owns the stack (a ``list[int]`` of LR states, bottom first) and, if it builds
values, is told of each reduction (``reduce``) and pushes its own value on a shift.

Two decisions sit beside the driver, since every recogniser makes them the same way:

* :func:`terminal_of` — an atom that spells a grammar literal is that literal only where
  the tables could shift it after the reductions it triggers (:meth:`Tables.can_shift`);
  elsewhere it is data of its kind.
* *whole values* — where shifting a token enters one of the generated ``value`` rule's
  states (:func:`cbcl.grammar._lalr.value_states`), the token starts a whole ``value``; given
  ``whole``, :func:`feed` takes the ``value`` goto at once for an atom, and for ``(``
  answers :data:`WHOLE`, so the caller reads the list without the tables and then calls
  :func:`take_value`.

*Keyword sets* — the tables accept a set's members in any order and any number of times
(``S -> ε | S ":k" X | …``); the driver keeps, for each set under way, the mask of the
members given so far (``marks``: stack depth of the set's nonterminal -> mask). Whenever
the top of the stack is a state a set's goto entered (:attr:`Tables.keyword_sets`), the
terminal about to be fed either is a member's keyword — refused if already given — or
ends the set — refused if a required member is missing. ``S -> ε`` starts a fresh mask.

*Start rules* — a grammar with several start rules (per-intent bodies) is entered by
feeding the start rule's terminal (:attr:`Tables.start_terminals`) before the body.

When :func:`feed` refuses, :func:`body_refusal` words the error for a body, in the
grammar's own terms; text (pass 2) and binary (the decoder) both raise what it returns,
so the two forms of one body are refused alike. The stack automaton
(:mod:`cbcl.grammar._automaton`) computes each transition it lacks with :func:`feed` too,
on its own stacks (:class:`LRStack`, :class:`Marks`); the C twins (the decoder's and pass
2's walks) do not call the kernel, and their contract is to agree with it, which the
differential tests and the fuzz targets enforce.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol as _Protocol

from ..core._canonical import canonical_value
from ._lalr import VALUE_RULE, Rule, Tables


class LRStack(_Protocol):
    """What :func:`feed` does to a stack of LR states: a ``list[int]``, bottom first, or
    any stack that reads its top (``[-1]``), its depth, pushes and pops the same way."""

    def __getitem__(self, index: int, /) -> int: ...

    def __len__(self) -> int: ...

    def append(self, state: int, /) -> None: ...

    def __delitem__(self, index: slice, /) -> None: ...


class Marks(_Protocol):
    """The keyword sets' masks by stack depth (a ``dict[int, int]``): :func:`feed` reads
    and writes the top's, and starts a set at the depth about to be pushed."""

    def get(self, depth: int, default: int, /) -> int: ...

    def __setitem__(self, depth: int, mask: int, /) -> None: ...


#: What :func:`feed` did with a terminal.
SHIFTED, WHOLE, ACCEPTED, REFUSED = range(4)
END = "$END"


def feed(tables: Tables, stack: LRStack, terminal: str, *,
         whole: Mapping[str, int] | None = None,
         reduce: Callable[[Rule], None] | None = None,
         marks: Marks | None = None) -> int:
    """Feed ``terminal`` to the LR ``stack`` (changed in place): :data:`SHIFTED`,
    :data:`ACCEPTED` (``$END`` completed the input), :data:`REFUSED` (the stack is left
    where the refusal was found, for :func:`expected`), or :data:`WHOLE` (``LPAR`` starts a
    whole value, given ``whole``: nothing is pushed). ``reduce`` is called with each rule
    reduced, before its symbols are popped. ``marks`` holds the keyword sets' masks (see
    the module doc); the caller keeps one ``dict`` per body, required when the tables
    have keyword sets."""
    actions = tables.actions
    rules = tables.rules
    sets = tables.keyword_sets
    while True:
        if sets:
            spec = sets.get(stack[-1])
            if spec is not None:
                if marks is None:
                    raise ValueError("the tables have keyword sets: feed() needs marks")
                depth = len(stack) - 1
                seen = marks.get(depth, 0)
                bit = spec.bits.get(terminal)
                if bit is not None:
                    if seen & bit:
                        return REFUSED  # given twice
                    marks[depth] = seen | bit
                elif spec.required & ~seen:
                    return REFUSED  # the set ends without a required member
        row = actions[stack[-1]]
        action = row.get(terminal)
        if action is None:
            return REFUSED
        if action >= 0:
            if terminal == END:  # pragma: no cover - lark's tables accept by a goto
                return REFUSED
            if whole is not None and action == whole.get(terminal):
                if terminal == "LPAR":
                    return WHOLE
                stack.append(row[VALUE_RULE])
                return SHIFTED
            stack.append(action)
            return SHIFTED
        rule = rules[~action]
        if reduce is not None:
            reduce(rule)
        if rule.size:
            del stack[len(stack) - rule.size :]
        elif marks is not None and rule.origin in tables.set_rules:
            marks[len(stack)] = 0  # a set starts: its nonterminal is pushed at this depth
        stack.append(actions[stack[-1]][rule.origin])
        if terminal == END and stack[-1] == tables.end_state:
            return ACCEPTED


def take_value(tables: Tables, stack: LRStack) -> None:
    """After :data:`WHOLE`: the list has been read as one ``value``; take its goto."""
    stack.append(tables.actions[stack[-1]][VALUE_RULE])


def terminal_of(tables: Tables, stack: list[int], literal: str | None, data: str) -> str:
    """The terminal of an atom of kind ``data`` that spells ``literal`` (or none): the
    literal where ``stack`` can shift it, else ``data``."""
    if literal is not None and tables.can_shift(stack, literal):
        return literal
    return data


def expected(tables: Tables, stack: list[int]) -> list[str]:
    """The terminals (``$END`` included) that ``stack`` could shift or accept next."""
    return [t for t in tables.actions[stack[-1]]
            if (t.isupper() or t == END) and tables.can_shift_or_accept(stack, t)]


# --------------------------------------------------------------------------- refusal wording

#: How a body refusal names a general terminal.
GENERAL_SHOWN = {
    "STRING": "a string", "INTEGER": "an integer", "DECIMAL": "a decimal", "NUMBER": "a number",
    "KEYWORD": "a keyword", "URI": "a URI", "SYMBOL": "a symbol", "LPAR": "'('",
    "RPAR": "')'", "VALUE": "a value", END: "the end of the body",
}
#: Where all of these fit, the refusal says "a value".
ANY_VALUE = frozenset({"STRING", "INTEGER", "DECIMAL", "KEYWORD", "URI", "SYMBOL", "LPAR"})
_GENERAL_ORDER = {name: index for index, name in enumerate(GENERAL_SHOWN)}


class Grammar(_Protocol):
    """What the refusal needs of a loaded protocol (:class:`cbcl.protocol._protocol.Protocol`)."""

    @property
    def tables(self) -> Tables: ...

    @property
    def shown(self) -> dict[str, str]: ...

    @property
    def id(self) -> str: ...

    @property
    def per_intent(self) -> bool: ...


def expected_order(terminal: str) -> tuple[int, int]:
    """Literals in the author's order (LIT_0, LIT_1 …), then the general terminals."""
    if terminal.startswith("LIT_"):
        return (0, int(terminal[4:]))
    return (1, _GENERAL_ORDER.get(terminal, len(_GENERAL_ORDER)))


def _found(shown: Mapping[str, str], terminal: str, value: object) -> str:
    """How a refusal names the token it refused."""
    if terminal in ("LPAR", "RPAR", END):
        return GENERAL_SHOWN[terminal]
    if terminal in shown and terminal.startswith("LIT_"):
        return shown[terminal]

    text = canonical_value(value)  # type: ignore[arg-type]
    text = text if len(text) <= 40 else text[:37] + "..."
    return f"{GENERAL_SHOWN[terminal].split(' ', 1)[1]} {text}"


def _keywords(keywords: tuple[str, ...]) -> str:
    return " and ".join(f"`{k}`" for k in keywords)


def body_refusal(protocol: Grammar, stack: list[int], terminal: str, value: object,
                 marks: Mapping[int, int] | None = None,
                 intent: str | None = None) -> tuple[str, tuple[str, ...]]:
    """The message and the expected items of the :class:`BodyError` for ``terminal``
    (with ``value``, for an atom) refused at ``stack`` (and ``marks``, its keyword sets'
    masks) by ``protocol``'s grammar, for a body of ``intent``: the one wording of every
    body refusal, text or binary."""
    tables = protocol.tables
    shown = protocol.shown
    grammar = f"the {protocol.id} grammar"
    if intent is not None and protocol.per_intent:
        grammar += f" for {intent} bodies"
    found = _found(shown, terminal, value)
    acceptable = expected(tables, stack)
    spec = tables.keyword_sets.get(stack[-1])
    if spec is not None:
        seen = 0 if marks is None else marks.get(len(stack) - 1, 0)
        bit = spec.bits.get(terminal)
        unseen = [t for t, b in spec.bits.items() if not seen & b]
        missing = spec.missing(seen)
        if bit is not None and seen & bit:
            return (f"{grammar}: `{shown[terminal].strip(chr(34))}` given twice",
                    tuple(shown[t] for t in unseen))
        if missing and bit is None and tables.can_shift_or_accept(stack, terminal):
            return (f"{grammar}: missing {_keywords(missing)} before {found}",
                    tuple(f'"{k}"' for k in missing))
    if tables.keyword_sets:  # what the tables take, less what the sets' masks refuse
        held = {} if marks is None else marks
        acceptable = [t for t in acceptable
                      if feed(tables, list(stack), t, marks=dict(held)) != REFUSED]
    if set(acceptable) >= ANY_VALUE:  # every atom and '(' fit: say "a value"
        acceptable = [t for t in acceptable if t not in ANY_VALUE] + ["VALUE"]
    elif "INTEGER" in acceptable and "DECIMAL" in acceptable:
        acceptable = [t for t in acceptable if t not in ("INTEGER", "DECIMAL")] + ["NUMBER"]
    items = tuple(shown.get(t, t) for t in sorted(acceptable, key=expected_order))
    return f"{grammar} expected {' or '.join(items)}, found {found}", items
