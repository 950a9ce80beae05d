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

*Keyword sets* (:mod:`cbcl.grammar._kernel`) are kept in one of two ways, chosen when the
automaton is made:

* ``walker_masks=False`` (the refusal search's automaton): a set's mask is part of the
  stack: the node of a state a set's goto entered carries the mask of the members given
  so far, and is hash-consed by ``(state, mask)``, so a transition stays a pure function
  of the node and the class, and a walk's one node is its whole state. The price: every
  node above a set's node (its members' values) is there once per mask, so a set of
  ``n`` members given in any order needs ``2^n`` copies of them.
* ``walker_masks=True`` (pass 2's recogniser, :attr:`Protocol.recogniser`): nodes carry
  no masks, so a set's members' values are parsed on the same nodes whatever was given
  before them, and the nodes a set needs grow with its members, not ``2^members``. The
  walker keeps the masks of the sets under way in a stack of its own (``frames``, one
  ``int`` a set, innermost last), and a transition that passes a set's state says what the
  kernel would have done with the masks there, as a tuple of *set operations*
  (:func:`set_op`): :data:`SET_OPEN` (``S -> ε``: a set starts, push ``0``),
  :data:`SET_MEMBER` with the member's bit (refused if given, else added) and
  :data:`SET_CLOSE` with the required mask (refused if one is missing; the set is done,
  pop it). The LR moves never depend on the masks (they only refuse), so the transition
  is still a pure function of the node and the class: ``(next, ops)`` in place of
  ``next`` (``(next, whole, ops)`` for ``LPAR``) where ``ops`` is not empty.
  :func:`apply_set_ops` is the walker's side, which the C twins mirror.

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

#: The kinds of a set operation (the low two bits of :func:`set_op`'s ``int``).
SET_OPEN, SET_MEMBER, SET_CLOSE = 0, 1, 2


def set_op(kind: int, mask: int = 0) -> int:
    """One set operation as the walkers read it: ``mask << 2 | kind`` (``mask``: the
    member's bit for :data:`SET_MEMBER`, the required members for :data:`SET_CLOSE`)."""
    return mask << 2 | kind


def apply_set_ops(frames: list[int], ops: tuple[int, ...]) -> bool:
    """Apply a transition's set operations to a walker's ``frames`` (the masks of the sets
    under way, innermost last): ``False`` where the kernel would refuse (a member given
    twice, a set ended without a required member). Raises ``ValueError`` for an operation
    on no set under way (a walk started inside a set: only the start node may be given)."""
    for op in ops:
        kind = op & 3
        if kind == SET_OPEN:
            frames.append(0)
            continue
        if not frames:
            raise ValueError("a keyword set's operation with no set under way")
        if kind == SET_MEMBER:
            if frames[-1] & op >> 2:
                return False
            frames[-1] |= op >> 2
        elif op >> 2 & ~frames.pop():
            return False
    return True


class StackAutomaton:
    """The lazily built stack automaton of one protocol's tables (see the module doc).

    ``literals`` maps each literal terminal an atom may spell to the data terminal the
    atom is when the grammar cannot shift the literal there (``"KEYWORD"`` for ``:key``,
    ``"SYMBOL"`` otherwise). ``walker_masks`` chooses where keyword sets' masks are kept
    (see the module doc): on the nodes, or by the walker, told by the transitions' set
    operations. Thread-safe under the GIL: a race may build a node twice, and both copies
    are correct. Raises ``ValueError`` for ``max_nodes`` under 2."""

    __slots__ = ("_size", "_whole", "literals", "max_nodes", "start", "tables",
                 "walker_masks")

    def __init__(self, tables: Tables, literals: dict[str, str], *,
                 max_nodes: int = DEFAULT_MAX_NODES, walker_masks: bool = False) -> None:
        if max_nodes < 2:
            raise ValueError("max_nodes must be at least 2 (a stack and one successor)")
        self.tables = tables
        self.literals = literals
        self.max_nodes = max_nodes
        self.walker_masks = walker_masks
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
        next node (``(node, whole)`` for ``LPAR``), :data:`ACCEPT` or :data:`REFUSED`;
        with ``walker_masks``, where the token passes a keyword set's state, ``(next,
        ops)`` (``(node, whole, ops)`` for ``LPAR``), ``ops`` the set operations
        (:func:`apply_set_ops`)."""
        result = self._feed(node, self.terminal(node, cls))
        node[cls] = result
        return result

    def _feed(self, node: Node, terminal: str) -> Any:
        walk = _OpsStack(self, node, terminal) if self.walker_masks else _NodeStack(self, node)
        outcome = feed(self.tables, walk, terminal, whole=self._whole, marks=walk)
        lpar = terminal == "LPAR"
        if outcome == REFUSED_BY_KERNEL:
            return (REFUSED, False) if lpar else REFUSED
        ops = tuple(walk.ops)
        if outcome == ACCEPTED:
            return (ACCEPT, ops) if ops else ACCEPT
        if outcome == WHOLE:  # a list that is a whole value: take its goto
            take_value(self.tables, walk)
            return (walk.node, True, ops) if ops else (walk.node, True)
        if lpar:
            return (walk.node, False, ops) if ops else (walk.node, False)
        return (walk.node, ops) if ops else walk.node

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

    __slots__ = ("_automaton", "_depth", "_popped_mark", "_sets", "node", "ops")

    def __init__(self, automaton: StackAutomaton, node: Node) -> None:
        self._automaton = automaton
        self._sets = automaton.tables.keyword_sets
        self.node = node
        self._depth = _BASE_DEPTH
        self._popped_mark = 0
        self.ops: list[int] = []  # the set operations of the transition (_OpsStack's)

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


class _OpsStack(_NodeStack):
    """A :class:`_NodeStack` of nodes that carry no masks (``walker_masks``): it answers
    the kernel's mask reads so that no check refuses, and writes down, in ``ops``, the
    check or start each stood for, for the walker to make on its own masks: a read at a
    set's state is a member's check where ``terminal`` is one of its keywords (the kernel
    then writes the member's bit), else the set's end (the read answers the required
    members, so the kernel's ``required & ~seen`` is 0); a write at the depth about to be
    pushed is a set's start."""

    __slots__ = ("_terminal",)

    def __init__(self, automaton: StackAutomaton, node: Node, terminal: str) -> None:
        super().__init__(automaton, node)
        self._terminal = terminal

    def append(self, state: int, /) -> None:
        self.node = self._automaton._push(self.node, state)
        self._depth += 1

    def __delitem__(self, index: slice, /) -> None:
        node = self.node
        for _ in range(self._depth - index.start):
            node = node[_PARENT]
        self._depth = index.start
        self.node = node

    def get(self, depth: int, default: int, /) -> int:
        if depth != self._depth - 1:
            raise KeyError("a node stack holds the mask of its top only")
        spec = self._sets[self.node[_STATE]]
        if self._terminal in spec.bits:
            return 0
        self.ops.append(set_op(SET_CLOSE, spec.required))
        return spec.required

    def __setitem__(self, depth: int, mask: int, /) -> None:
        if depth == self._depth:
            self.ops.append(set_op(SET_OPEN))
        elif depth == self._depth - 1:
            self.ops.append(set_op(SET_MEMBER, mask))
        else:
            raise KeyError("a node stack holds the mask of its top only")
