"""Pass 2: recognising a message's body with its protocol's grammar (and schema).

Theory of operation
-------------------
Pass 2 walks the body value (already read, under the message's limits, by pass 1) and
feeds its structure to the protocol's tables: ``(`` and ``)`` for lists, and each atom's
terminal. A symbol or keyword that spells a grammar literal is that literal only where
the parser can shift it after the reductions it triggers (:meth:`Tables.can_shift`);
elsewhere it is data. The checker has already refused every grammar with a point that
could take both readings, so the decision is never a guess.

The walk keeps no positions. When it refuses, :func:`explain_body` re-scans the body's
text token by token, feeding the same tables through the kernel (:mod:`._kernel`), and
raises a :class:`BodyError` at the first token refused, listing what the grammar expected
there in the grammar's own terms.
"""

from __future__ import annotations

from typing import Any, NoReturn

from ..core._errors import BodyError, ProtocolError
from ..core._limits import Limits
from ..core._reader import (
    BAD,
    EOF,
    LPAR,
    RPAR,
    TOKEN,
    context_of,
    diagnose,
    fail,
    position_of,
    read_value_at,
    token_start,
)
from ..core._values import ATOM_TERMINALS, Keyword, Symbol, Value
from ..grammar._automaton import ACCEPT, REFUSED
from ..grammar._kernel import REFUSED as REFUSED_BY_GRAMMAR, body_refusal, feed, terminal_of
from ._hints import UNREAD, body_hint
from ._message import Intent, Message
from ._protocol import Protocol
from ._schema import check_schema

try:
    from .._native import recognise as _speedups_recognise
except ImportError:  # not built: the Python walk runs
    _recognise_c: Any = None
else:
    _recognise_c = _speedups_recognise


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
    node = start_node(protocol, intent)
    if node is REFUSED:
        return False
    if _recognise_c is not None:
        accepted: bool = _recognise_c(body, node, protocol.atoms, ATOM_TERMINALS,
                                      protocol.automaton.step, REFUSED, ACCEPT)
        return accepted
    return walk_body(protocol, body, node)


def walk_body(protocol: Protocol, body: Value, node: Any) -> bool:
    """The walk of :func:`recognise_body` from ``node``, in Python (the reference of its C
    twin, ``cbcl._native.recognise``)."""
    step = protocol.automaton.step
    classes = protocol.atoms
    pending: list[Any] = []
    items: Any = iter((body,))
    while True:
        for item in items:
            kind = type(item)
            if kind is tuple:
                found = node.get("LPAR")
                if found is None:
                    found = step(node, "LPAR")
                node, whole = found
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
            if found is REFUSED:
                return False
            node = found
        else:  # the list (or the body) is complete
            if not pending:
                break
            items = pending.pop()
            found = node.get("RPAR")
            if found is None:
                found = step(node, "RPAR")
            if found is REFUSED:
                return False
            node = found
    found = node.get("$END")
    if found is None:
        found = step(node, "$END")
    return found is ACCEPT


def explain_body(protocol: Protocol, text: str, body_at: int, limits: Limits,
                 intent: Intent | None = None) -> NoReturn:
    """Re-scan the body of an ``intent`` message that starts at character ``body_at`` of
    ``text`` and raise a :class:`BodyError` at the first token the grammar refuses."""
    tables = protocol.tables
    stack = start_stack(protocol, intent)
    marks: dict[int, int] = {}
    shown_intent = None if intent is None else intent.value
    if not stack:  # pragma: no cover - the descriptor gives every governed intent a rule
        fail(text, body_at, f"the {protocol.id} grammar has no rule for "
             f"{shown_intent} bodies", error=BodyError)
    pos = body_at
    depth = 0
    started = False
    heads: list[object] = []  # the first element of each open list, for the hint
    while True:
        value: object = None
        if started and depth == 0:
            terminal, start = "$END", pos
        else:
            m = TOKEN.match(text, pos)
            assert m is not None
            kind = m.lastindex
            assert kind is not None
            start = token_start(m)
            if kind == LPAR:
                terminal, depth, pos = "LPAR", depth + 1, m.end()
            elif kind == RPAR:
                terminal, depth, pos = "RPAR", depth - 1, m.end()
            elif kind == EOF:  # pragma: no cover - pass 1 saw a complete body
                terminal = "$END"
            elif kind == BAD:  # pragma: no cover - pass 1 read this text
                diagnose(text, start)
            else:
                value, pos, _ = read_value_at(text, pos, limits, 0, 0)
                terminal = ATOM_TERMINALS[type(value)]
                if terminal in ("SYMBOL", "KEYWORD"):
                    terminal = terminal_of(tables, stack, protocol.atoms.get(value),
                                           terminal)
        started = True
        if feed(tables, stack, terminal, marks=marks) == REFUSED_BY_GRAMMAR:
            message, expected = body_refusal(protocol, stack, terminal, value, marks,
                                             shown_intent)
            error = BodyError(message, position=position_of(text, start),
                              context=context_of(text, start), expected=expected)
            at_head = bool(heads) and heads[-1] is UNREAD and \
                terminal not in ("LPAR", "RPAR", "$END")
            error.hint_material = body_hint(protocol, stack, terminal, value, marks,
                                            shown_intent, heads, at_head)
            raise error
        if heads and heads[-1] is UNREAD:
            heads[-1] = value
        if terminal == "LPAR":
            heads.append(UNREAD)
        elif terminal == "RPAR":
            heads.pop()
        if terminal == "$END":  # pragma: no cover - pass 2 refused this body
            raise AssertionError("explain_body found no error")




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
    descriptor = protocol.descriptor
    if message.intent not in protocol.governed:
        if message.intent in _ALWAYS_ADMITTED:
            if message.body is None or type(message.body) is str:
                return None
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
    if not recognise_body(protocol, message.body, message.intent):
        return False
    if protocol.schema is not None:
        check_schema(protocol.schema, message.body)
    return True

