"""LALR(1) tables taken from lark, in the form CBCL's own drivers walk.

Theory of operation
-------------------
lark builds the tables (``parser="lalr"``, ``strict=True``, so a conflict is an error and
never silently resolved); CBCL drives them itself. Its lexer is the CBCL reader, which
already knows each token's kind and value, so lark's lexer, tokens and tree are not needed
on the hot path, and a driver can do what lark's cannot: decide whether an atom is a
grammar literal by asking whether the parser could shift it (:meth:`Tables.can_shift`).

An action is an ``int``: ``n >= 0`` shifts (or, for a nonterminal, goes) to state ``n``;
``n < 0`` reduces by rule ``~n``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import lark
from lark.lexer import Lexer

from ..core._vocabulary import VALUE_FIRST


def build_lark(text: str, start: str = "start") -> Any:
    """A ``lark.Lark`` LALR(1) parser for grammar ``text`` whose terminals are all declared
    (CBCL's reader supplies the tokens), built with ``strict=True`` so that any conflict
    raises instead of being resolved silently. Raises lark's ``GrammarError`` on conflicts;
    callers translate it."""

    class _ExternalLexer(Lexer):
        """Tokens come from CBCL's reader; lark only builds the tables."""

        __future_interface__ = 2

        def __init__(self, lexer_conf: Any) -> None:
            pass

        def lex(self, lexer_state: Any, parser_state: Any) -> Any:  # pragma: no cover
            raise NotImplementedError

    return lark.Lark(text, parser="lalr", lexer=_ExternalLexer, start=start, strict=True)


#: What one row (state), one entry (a shift, goto or reduce of a state) and one rule of
#: :class:`Tables` take in memory, in bytes: their dicts dominate (calibrated on CPython 3.11
#: against ``tracemalloc``).
ROW_BYTES = 120
ENTRY_BYTES = 50
RULE_BYTES = 120


def table_bytes(states: int, entries: int, rules: int) -> int:
    """The estimate, in bytes, of the memory :class:`Tables` of ``states`` rows holding
    ``entries`` actions in all, reducing by ``rules`` rules, take: the one formula both the
    analyser's early refusal (while it builds the automaton) and the measure of built
    tables (:func:`cbcl.grammar._compile.compiled_size`) use."""
    return ROW_BYTES * states + ENTRY_BYTES * entries + RULE_BYTES * rules


@dataclass(frozen=True, slots=True)
class Rule:
    """A grammar rule as the driver needs it: the nonterminal it makes, how many symbols
    it pops, and the alias the grammar gave it."""

    origin: str
    size: int
    alias: str | None


@dataclass(frozen=True, slots=True)
class KeywordSet:
    """What a driver keeps for one keyword set (``(":a" X & [":b" Y])``): the tables let
    its members come in any order and any number of times; the driver refuses a member
    given twice when its keyword arrives, and a required one missing when the set ends.

    ``bits`` maps each member's keyword terminal to its bit; ``required`` is the mask of
    the required members; ``keywords[i]`` is the text of the member with bit ``1 << i``.
    """

    rule: str
    bits: Mapping[str, int]
    required: int
    keywords: tuple[str, ...]

    def missing(self, seen: int) -> tuple[str, ...]:
        """The required keywords not in ``seen``, in the author's order."""
        return tuple(k for i, k in enumerate(self.keywords)
                     if self.required >> i & 1 and not seen >> i & 1)


_NO_SETS: Mapping[int, KeywordSet] = MappingProxyType({})
_NO_STARTS: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Tables:
    """LALR(1) action/goto tables: ``actions[state][symbol] -> int`` (see module doc)."""

    actions: tuple[dict[str, int], ...]
    rules: tuple[Rule, ...]
    start_state: int
    end_state: int
    #: The keyword sets, by every state a set's goto enters (the state in which its next
    #: member or what follows it is read): see :class:`KeywordSet`.
    keyword_sets: Mapping[int, KeywordSet] = field(default_factory=lambda: _NO_SETS)
    #: The keyword-set rules (their ``S -> ε`` starts a set's record).
    set_rules: frozenset[str] = frozenset()
    #: Start rule -> the terminal a driver feeds first to choose it (empty: one start).
    start_terminals: Mapping[str, str] = field(default_factory=lambda: _NO_STARTS)
    #: :func:`value_states` of these tables, found once (not part of their value).
    _value_states: dict[str, int] | None = field(default=None, init=False, repr=False,
                                                 compare=False)

    @classmethod
    def from_lark(cls, parser: Any, start: str = "start") -> Tables:
        """Extract the tables of a ``lark.Lark`` built with ``parser="lalr"``."""
        table = parser.parser.parser._parse_table
        rule_index: dict[Any, int] = {}
        rules: list[Rule] = []
        actions: list[dict[str, int]] = [{} for _ in range(len(table.states))]
        for state, row in table.states.items():
            encoded = actions[state]
            for symbol, (action, arg) in row.items():
                symbol = str.__str__(symbol)  # lark names may be Tokens, whose __eq__ is slow
                if action.name == "Shift":
                    encoded[symbol] = arg
                else:
                    index = rule_index.get(arg)
                    if index is None:
                        index = rule_index[arg] = len(rules)
                        rules.append(Rule(str.__str__(arg.origin.name), len(arg.expansion),
                                          None if arg.alias is None else str(arg.alias)))
                    encoded[symbol] = ~index
        return cls(tuple(actions), tuple(rules), table.start_states[start],
                   table.end_states[start])

    def with_grammar(self, keyword_sets: Mapping[str, Iterable[tuple[str, bool, str]]],
                     start_terminals: Mapping[str, str]) -> Tables:
        """These tables with the keyword sets (rule -> (terminal, optional, keyword) per
        member) and start terminals of their grammar. Raises ``ValueError`` for a set
        whose rule or member terminals the tables do not know."""
        by_state: dict[int, KeywordSet] = {}
        for rule, members in keyword_sets.items():
            listed = list(members)
            spec = KeywordSet(rule, MappingProxyType({t: 1 << i for i, (t, _, _) in
                                                      enumerate(listed)}),
                              sum(1 << i for i, (_, optional, _) in enumerate(listed)
                                  if not optional),
                              tuple(k for _, _, k in listed))
            if len(spec.bits) != len(listed):
                raise ValueError(f"keyword set {rule} repeats a member")
            targets = [row[rule] for row in self.actions if rule in row]
            if not targets:
                raise ValueError(f"keyword set {rule} is not in the tables")
            for state in targets:
                if state in by_state or not all(t in self.actions[state] for t in spec.bits):
                    raise ValueError(f"keyword set {rule} does not match the tables")
                by_state[state] = spec
        for terminal in start_terminals.values():
            if terminal not in self.actions[self.start_state]:
                raise ValueError(f"start terminal {terminal} is not in the tables")
        return replace(self, keyword_sets=MappingProxyType(by_state),
                       set_rules=frozenset(keyword_sets),
                       start_terminals=MappingProxyType(dict(start_terminals)))

    def renumbered(self) -> Tables:
        """The same automaton with its states numbered in breadth-first order from the
        start state (each row's symbols in sorted order) and its rules in the order that
        walk first meets them. lark's numbering depends on string hashing, so two builds of
        one grammar differ in numbers only; renumbered, they are equal, and tables can be
        generated once and shipped (the envelope's: cbcl/protocol/_envelope_tables.py).
        Raises ``ValueError`` if a state cannot be reached from the start state."""
        order = [self.start_state]
        number = {self.start_state: 0}
        rule_number: dict[int, int] = {}
        for state in order:  # (grows while it is walked: breadth first)
            for symbol in sorted(self.actions[state]):
                action = self.actions[state][symbol]
                if action >= 0 and action not in number:
                    number[action] = len(order)
                    order.append(action)
                elif action < 0 and ~action not in rule_number:
                    rule_number[~action] = len(rule_number)
        if len(order) != len(self.actions) or self.end_state not in number:
            raise ValueError("the tables have states that the start state does not reach")
        rules = [self.rules[0]] * len(rule_number)
        for old, new in rule_number.items():
            rules[new] = self.rules[old]
        actions = tuple({symbol: number[action] if action >= 0 else ~rule_number[~action]
                         for symbol, action in sorted(self.actions[state].items())}
                        for state in order)
        return Tables(actions, tuple(rules), 0, number[self.end_state],
                      MappingProxyType({number[state]: spec
                                        for state, spec in self.keyword_sets.items()}),
                      self.set_rules, self.start_terminals)

    def can_shift(self, stack: list[int], terminal: str) -> bool:
        """Whether ``terminal`` would be shifted from ``stack`` after the reductions it
        triggers (the stack is not changed). LALR tables may hold a reduce on a lookahead
        that a later state then refuses; this looks past such reductions."""
        action = self.actions[stack[-1]].get(terminal)
        if action is None:
            return False
        return action >= 0 or self.shift_target(stack, terminal) is not None

    def shift_target(self, stack: list[int], terminal: str) -> int | None:
        """The state ``terminal`` would be shifted into from ``stack``, after the
        reductions it triggers, or ``None`` if it would be refused. ``stack`` is unchanged."""
        actions = self.actions
        action = actions[stack[-1]].get(terminal)
        if action is None or action >= 0:
            return action
        rules = self.rules
        # Simulate the reductions on a virtual stack: a shared prefix of ``stack`` (depth
        # ``height``) plus the states pushed during the simulation.
        height = len(stack)
        pushed: list[int] = []
        while action is not None and action < 0:
            rule = rules[~action]
            size = rule.size
            if size <= len(pushed):
                del pushed[len(pushed) - size :]
            else:
                height -= size - len(pushed)
                pushed.clear()
            top = pushed[-1] if pushed else stack[height - 1]
            pushed.append(actions[top][rule.origin])
            if terminal == "$END" and pushed[-1] == self.end_state:
                return self.end_state
            action = actions[pushed[-1]].get(terminal)
        return action

    def can_shift_or_accept(self, stack: list[int], terminal: str) -> bool:
        """:meth:`can_shift`, and for ``$END`` whether the input could end here."""
        return self.shift_target(stack, terminal) is not None


#: The rule CBCL generates for the grammar's ``value`` (cbcl.grammar._subset.LARK_VALUE_RULE), and
#: the helper that repeats it inside a list.
VALUE_RULE = "cbcl_value"
_VALUE_STAR = "_cbcl_value_star"
_VALUE_FIRST = VALUE_FIRST


def value_states(tables: Tables) -> dict[str, int]:
    """The states of the generated ``value`` rule (``cbcl_value: LPAR _cbcl_value_star RPAR
    | SYMBOL | …``) that a value's first token enters, by terminal (empty if the grammar
    has no ``value``). Found once, and kept by the tables.

    An LALR state is identified by its core, so where shifting a token from state S enters
    one of these states, every item of S that can take the token is the start of a whole
    ``value``: a driver may then take the value without walking the tables through it and
    take the ``value`` goto from S. States are found by their contents, never by number
    (lark's numbering is not stable)."""
    cached = tables._value_states
    if cached is not None:
        return cached
    actions = tables.actions
    after_lpar = [state for state, row in enumerate(actions) if _VALUE_STAR in row]
    states: dict[str, int] = {}
    if len(after_lpar) == 1:
        row = actions[actions[after_lpar[0]][_VALUE_STAR]]
        states = {terminal: row[terminal] for terminal in _VALUE_FIRST if terminal in row}
        if len(states) != len(_VALUE_FIRST) or states["LPAR"] != after_lpar[0]:
            states = {}  # pragma: no cover - not the generated value rule
    object.__setattr__(tables, "_value_states", states)  # frozen: set once, derived
    return states
