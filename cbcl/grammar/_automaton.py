"""A lazily built automaton over LR stacks: pass 2 at one dictionary lookup per token.

Theory of operation
-------------------
An LALR driver spends most of each token in the reductions the token triggers: pop, goto,
look the token up again; for a grammar literal it first simulates those reductions to
decide whether the atom is the literal or data (:meth:`Tables.can_shift`). Yet what a
token does depends only on the whole stack and the token's *class*, and the stacks a
protocol's bodies meet repeat, because a body's shape follows its grammar, not its data.
So, as RE2's lazy DFA builds DFA states from NFA state sets only as the input needs them
and keeps them within a budget, :class:`StackAutomaton` builds a deterministic automaton
whose states are LR stacks, one transition at a time:

* A stack is a *node*: a ``dict`` holding its top LR state, its parent node (the stack
  below it) and the nodes pushed on it. Nodes are hash-consed (pushing state ``s`` on node
  ``n`` always gives the same node), so a node *is* its stack, a stack is never copied,
  and two walks that reach the same stack reach the same node.
* The same ``dict`` maps a token class to what feeding it does: the next node,
  :data:`ACCEPT` or :data:`REFUSED`. A class is a data terminal (``STRING``, ``SYMBOL``,
  …), ``RPAR``, ``$END``, or, for an atom that spells a grammar literal, that literal's
  terminal: the literal-or-data decision is made once per stack and class, as part of the
  transition. ``LPAR`` maps to ``(next node, whole)``, where ``whole`` says that the list
  is a whole ``value`` which the walker may take without walking it (:func:`value_states`).
* A missing transition is computed by the one LR driver, :func:`cbcl.grammar._kernel.feed`,
  run on the node itself (:class:`_NodeStack`: popping is following parents, pushing is
  the hash-consed push), and remembered (:meth:`StackAutomaton.step`). The hot loop is
  ``node.get(cls)``, and ``automaton.step(node, cls)`` when that is ``None``.

A keyword set's mask (:mod:`cbcl.grammar._kernel`) is part of the stack: the node of a state a
set's goto entered carries the mask of the members given so far, and is hash-consed by
``(state, mask)``, so a transition stays a pure function of the node and the class.

The automaton holds at most ``max_nodes`` stacks; when full it starts afresh (as RE2
flushes its cache), so memory stays bounded and a hostile stream of unseen shapes costs
each token a plain driver step plus bookkeeping. Results never depend on what is cached:
a transition is a pure function of the stack and the class.
"""

from __future__ import annotations

import sys
from typing import Any

from ._kernel import ACCEPTED, REFUSED as REFUSED_BY_KERNEL, WHOLE, feed, take_value
from ._lalr import Tables, value_states


class _Outcome:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


#: Feeding the class completes the body (only ever for ``$END``).
ACCEPT: Any = _Outcome("ACCEPT")
#: The grammar refuses the class on this stack.
REFUSED: Any = _Outcome("REFUSED")

# Reserved keys of a node (never token classes, which are strings).
_STATE = object()
_PARENT = object()
_CHILDREN = object()
_MARK = object()

#: A node is a dict: reserved keys (its stack) plus its transitions.
Node = dict[Any, Any]

DEFAULT_MAX_NODES = 16384


class StackAutomaton:
    """The lazily built stack automaton of one protocol's tables (see the module doc).

    ``literals`` maps each literal terminal an atom may spell to the data terminal the
    atom is when the grammar cannot shift the literal there (``"KEYWORD"`` for ``:key``,
    ``"SYMBOL"`` otherwise). Thread-safe under the GIL: a race may build a node twice,
    and both copies are correct."""

    __slots__ = ("_size", "_whole", "literals", "max_nodes", "start", "tables")

    def __init__(self, tables: Tables, literals: dict[str, str], *,
                 max_nodes: int = DEFAULT_MAX_NODES) -> None:
        if max_nodes < 2:
            raise ValueError("max_nodes must be at least 2 (a stack and one successor)")
        self.tables = tables
        self.literals = literals
        self.max_nodes = max_nodes
        self._whole = value_states(tables)
        self._size = 0
        self.start: Node = self._root()

    def _root(self) -> Node:
        self._size = 1
        return {_STATE: self.tables.start_state, _PARENT: None, _CHILDREN: {}}

    @property
    def size(self) -> int:
        """How many stacks are held now."""
        return self._size

    def _push(self, node: Node, state: int, mark: int = 0) -> Node:
        children = node[_CHILDREN]
        key: Any = state if not mark else (state, mark)
        child: Node | None = children.get(key)
        if child is None:
            if self._size >= self.max_nodes:
                self.start = self._root()  # flush: walks under way keep their old nodes
            self._size += 1
            child = children[key] = {_STATE: state, _PARENT: node, _CHILDREN: {}}
            if mark:
                child[_MARK] = mark
        return child

    def terminal(self, node: Node, cls: str) -> str:
        """The terminal the plain driver feeds for a token of class ``cls`` on ``node``:
        a literal's own terminal where the tables can shift it, else its data terminal."""
        data = self.literals.get(cls)
        if data is not None and not self.tables.can_shift(self.stack(node), cls):
            return data
        return cls

    def step(self, node: Node, cls: str) -> Any:
        """Feed a token of class ``cls`` to ``node``, remember and return the result: the
        next node (``(node, whole)`` for ``LPAR``), :data:`ACCEPT` or :data:`REFUSED`."""
        result = self._feed(node, self.terminal(node, cls))
        node[cls] = result
        return result

    def _feed(self, node: Node, terminal: str) -> Any:
        walk = _NodeStack(self, node)
        outcome = feed(self.tables, walk, terminal, whole=self._whole, marks=walk)
        lpar = terminal == "LPAR"
        if outcome == REFUSED_BY_KERNEL:
            return (REFUSED, False) if lpar else REFUSED
        if outcome == ACCEPTED:
            return ACCEPT
        if outcome == WHOLE:  # a list that is a whole value: take its goto
            take_value(self.tables, walk)
            return walk.node, True
        return (walk.node, False) if lpar else walk.node

    @staticmethod
    def marks(node: Node) -> dict[int, int]:
        """The keyword sets' masks of the stack ``node`` stands for, by depth."""
        found: list[int] = []
        while node is not None:
            found.append(node.get(_MARK, 0))
            node = node[_PARENT]
        found.reverse()
        return {depth: mark for depth, mark in enumerate(found) if mark}

    @staticmethod
    def stack(node: Node) -> list[int]:
        """The LR stack ``node`` stands for, bottom first."""
        states: list[int] = []
        while node is not None:
            states.append(node[_STATE])
            node = node[_PARENT]
        states.reverse()
        return states


#: Where a :class:`_NodeStack`'s depths start: above any stack's depth.
_BASE_DEPTH = sys.maxsize // 2


class _NodeStack:
    """A node as the stack and the masks :func:`cbcl.grammar._kernel.feed` works on
    (:class:`cbcl.grammar._kernel.LRStack` and :class:`~cbcl.grammar._kernel.Marks`), for
    one transition: ``node`` is the top, which each push and pop moves. Its depth counts
    from :data:`_BASE_DEPTH`, deeper than any stack (the driver uses depths only relative
    to ``len``, so the node's true depth is never walked for), and the
    masks live on the nodes: a member given replaces the top by its node of the new mask,
    and a set's nonterminal, pushed again after its rule is reduced, takes the mask of the
    deepest node popped (the set's own), as the driver's ``marks[depth]`` would keep it."""

    __slots__ = ("_automaton", "_depth", "_popped_mark", "_sets", "node")

    def __init__(self, automaton: StackAutomaton, node: Node) -> None:
        self._automaton = automaton
        self._sets = automaton.tables.keyword_sets
        self.node = node
        self._depth = _BASE_DEPTH
        self._popped_mark = 0

    def __getitem__(self, index: int, /) -> int:
        if index != -1:
            raise IndexError("a node stack reads its top only")
        state: int = self.node[_STATE]
        return state

    def __len__(self) -> int:
        return self._depth

    def append(self, state: int, /) -> None:
        mark = self._popped_mark if state in self._sets else 0
        self._popped_mark = 0
        self.node = self._automaton._push(self.node, state, mark)
        self._depth += 1

    def __delitem__(self, index: slice, /) -> None:
        node = self.node
        mark = 0
        for _ in range(self._depth - index.start):
            mark = node.get(_MARK, 0)  # the deepest popped: a set's own node
            node = node[_PARENT]
        self._depth = index.start
        self.node = node
        self._popped_mark = mark

    def get(self, depth: int, default: int, /) -> int:
        if depth != self._depth - 1:
            raise KeyError("a node stack holds the mask of its top only")
        mark: int = self.node.get(_MARK, default)
        return mark

    def __setitem__(self, depth: int, mask: int, /) -> None:
        if depth == self._depth:  # a set starts at the depth about to be pushed: mask 0
            return
        if depth != self._depth - 1:
            raise KeyError("a node stack holds the mask of its top only")
        node = self.node
        self.node = self._automaton._push(node[_PARENT], node[_STATE], mask)
