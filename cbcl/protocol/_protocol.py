"""A loaded protocol: a descriptor plus the LALR tables compiled from its grammar.

The model only: pass 2 (recognising a body with these tables) is :mod:`._pass2`, and the
registry that verifies, compiles, caches and holds protocols is :mod:`._registry`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core._reader import (
    intern_keyword,
    intern_symbol,
)
from ..core._values import Keyword, Symbol, Value
from ..grammar._automaton import StackAutomaton
from ..grammar._compile import (
    CompiledGrammar,
)
from ..grammar._kernel import GENERAL_SHOWN
from ..grammar._lalr import Tables
from ._constraints import Constraints, read_constraints
from ._descriptor import ProtocolDescriptor
from ._message import Intent
from ._schema import Schema, compile_schema


@dataclass(frozen=True, slots=True, eq=False)
class Protocol:
    """A loaded protocol: its descriptor and the compiled body grammar."""

    descriptor: ProtocolDescriptor
    tables: Tables
    #: Atoms that spell a grammar literal (a Symbol or Keyword) -> the literal's terminal.
    #: The atoms are the reader's shared (pinned) ones, so a lookup of an atom the reader
    #: made finds its key by identity.
    atoms: dict[Value, str]
    #: Terminal name -> how errors show it (``'":cmd"'``, ``"a string"``).
    shown: dict[str, str]
    report: str
    #: The descriptor's schema, compiled once at load (``None`` without one).
    schema: Schema | None = None
    #: Pass 2's automaton over the tables' stacks, built as bodies need it, whose nodes
    #: carry the keyword sets' masks: the refusal search's (a walk's node is its state).
    automaton: StackAutomaton = field(init=False)
    #: The same over nodes without masks (``walker_masks``: the walk keeps them, so a
    #: set's members in any order share their nodes): the acceptance walks' (pass 2's
    #: ``recognise_body`` and ``accept_document``, the binary decoder's fast path).
    recogniser: StackAutomaton = field(init=False)
    #: The descriptor's rules, compiled (``None`` without a ``(constraints …)`` section):
    #: parse, validate and the codec apply the stateless ones, a conversation the rest.
    constraints: Constraints | None = field(init=False)
    #: The intents whose bodies the grammar judges, as a set.
    governed: frozenset[Intent] = field(init=False)
    #: Intent -> the start terminal fed before its body (empty: one start rule for all).
    entries: dict[Intent, str] = field(init=False)
    #: Pass 2's plan for the C twins (``cbcl._native``: its layout is documented there):
    #: the governed intents, the start terminals, the automaton and its ``step``, the
    #: literal atoms and the schema's records by head (:meth:`Schema.record_index`).
    acceptance: tuple[Any, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        descriptor = self.descriptor
        object.__setattr__(self, "constraints", None if descriptor.constraints is None
                           else read_constraints(descriptor.constraints,
                                                 intents=descriptor.intents,
                                                 functions=descriptor.functions,
                                                 conversation=descriptor.conversation
                                                 is not None))
        object.__setattr__(self, "governed", frozenset(self.descriptor.intents))
        terminals = self.tables.start_terminals
        starts = self.descriptor.starts
        if terminals and not all(rule in terminals for rule in starts.values()):
            raise ValueError("the tables were not compiled for this descriptor's start rules")
        object.__setattr__(self, "entries", {intent: terminals[rule]
                                             for intent, rule in starts.items()}
                           if terminals else {})
        literals = {terminal: "KEYWORD" if type(atom) is Keyword else "SYMBOL"
                    for atom, terminal in self.atoms.items()}
        object.__setattr__(self, "automaton", StackAutomaton(self.tables, literals))
        recogniser = StackAutomaton(self.tables, literals, walker_masks=True)
        object.__setattr__(self, "recogniser", recogniser)
        sole, candidates = (None, None) if self.schema is None else self.schema.record_index()
        object.__setattr__(self, "acceptance", (
            tuple(self.governed), tuple(self.entries.items()), terminals.get("body"),
            recogniser, recogniser.step, self.atoms, sole, candidates))

    @property
    def id(self) -> Symbol:
        return self.descriptor.id

    @property
    def digest(self) -> str:
        return self.descriptor.digest

    @property
    def per_intent(self) -> bool:
        """Whether some intent's body starts at a rule of its own (not ``body``)."""
        return bool(self.descriptor.intent_rules)

    @classmethod
    def from_compiled(cls, descriptor: ProtocolDescriptor,
                      compiled: CompiledGrammar) -> Protocol:
        assert compiled.tables is not None
        atoms: dict[Value, str] = {}
        shown = dict(GENERAL_SHOWN)
        for terminal, text in compiled.literals.items():
            if terminal in ("LPAR", "RPAR"):
                continue
            atom = Keyword(text[1:]) if text.startswith(":") else Symbol(text)  # validated
            name = str.__str__(atom)
            atoms[intern_keyword(name, pin=True) if type(atom) is Keyword
                  else intern_symbol(name, pin=True)] = terminal
            shown[terminal] = f'"{text}"'
        schema = None if descriptor.schema is None else compile_schema(descriptor.schema)
        return cls(descriptor, compiled.tables, atoms, shown, compiled.report, schema)
