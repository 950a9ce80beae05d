"""Context-free grammars as plain data: the interface between the grammar-subset reader
(``_subset``) and the LR analyser (``_lr``).

A :class:`Grammar` is BNF: every EBNF construct of the descriptor subset (``?``, ``*``,
``+``, ``[ ]``, groups) has already been expanded into helper nonterminals by the reader.
Helper nonterminals are *synthetic*: reports never show their internal names; they show the
``display`` text instead (``attr*``), and derivation trees splice their children into the
parent, so a grammar author sees only the names they wrote.

Terminal naming convention (fixed, other modules rely on it):

* base terminals: ``SYMBOL STRING INTEGER DECIMAL KEYWORD URI``;
* the list delimiters: ``LPAR`` for the literal ``"("`` and ``RPAR`` for ``")"``;
* every other literal is a terminal named ``LIT_<n>`` (n = 0, 1, ...); its ``display`` is the
  literal as the author wrote it, with quotes (``'"task"'`` or ``'":cmd"'``).

``overlaps`` says which general terminals also match a literal's atom: a symbol literal
``"task"`` is also a ``SYMBOL``; a keyword literal ``":cmd"`` is also a ``KEYWORD``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

BASE_TERMINALS: frozenset[str] = frozenset(
    {"SYMBOL", "STRING", "INTEGER", "DECIMAL", "KEYWORD", "URI", "LPAR", "RPAR"}
)


@dataclass(frozen=True, slots=True)
class Production:
    """One BNF production ``lhs -> rhs``.

    ``rhs`` is a tuple of terminal and nonterminal names (empty for an epsilon production).
    ``alias`` is the ``-> name`` the author gave this alternative, if any.
    """

    lhs: str
    rhs: tuple[str, ...]
    alias: str | None = None


@dataclass(frozen=True, slots=True)
class Grammar:
    """A BNF grammar ready for LR analysis.

    ``start`` is the start nonterminal (``body`` in descriptor grammars, before
    namespacing). ``terminals`` holds every terminal name used. ``synthetic`` holds helper
    nonterminals created by EBNF expansion. ``display`` maps any symbol name (terminal or
    nonterminal) to the text a grammar author recognises; names absent from it display as
    themselves. ``overlaps`` maps a literal terminal to the general terminals that also
    match its atom (see the module docstring).
    """

    start: str
    productions: tuple[Production, ...]
    terminals: frozenset[str]
    synthetic: frozenset[str] = frozenset()
    display: Mapping[str, str] = field(default_factory=dict)
    overlaps: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @property
    def nonterminals(self) -> frozenset[str]:
        return frozenset(p.lhs for p in self.productions)

    def show(self, name: str) -> str:
        """The user-facing text for a symbol name."""
        return self.display.get(name, name)
