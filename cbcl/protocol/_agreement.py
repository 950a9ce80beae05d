"""Whether a schema agrees with the body grammar it goes with (spec/declarations.md §5).

A schema says what the values of a body mean; the grammar says what a body may look like.
When both are written by hand they can disagree, and a descriptor that says ``:price
STRING`` in its grammar and ``(:price decimal)`` in its schema accepts no price at all.
:func:`check_schema_against_grammar` finds such disagreements when a descriptor is built
(never when one is loaded: a peer's descriptor is judged by what it accepts).

Theory of operation. The grammar's tree (:class:`~cbcl.grammar._subset.GrammarSource`) is
walked, never compiled: for each record, every place the grammar writes ``"(" HEAD …`` is
found, and the keyword literals that can follow there (in sequence, in a keyword set, or
in a rule named there, which is followed once) are collected with the items after them.
Each item's possible first value kinds are found the same way (a literal symbol, a
terminal, ``value``, a list). A record's field must be among those keys, unless the
grammar writes a general ``KEYWORD`` there, and its type must admit some value of those
kinds. Every walk keeps an explicit work list, and the whole check takes at most
:data:`MAX_CHECK_STEPS` steps (a step: a sequence of the tree walked, an item followed for
its kinds, a place a record's heads are looked for), so a hostile grammar costs bounded
work; the places a list opens are indexed by their first head once, in one walk.
"""

from __future__ import annotations

from decimal import Decimal

from ..core._errors import DescriptorError
from ..core._values import URI, Keyword, Symbol, Value
from ..grammar._subset import (
    GrammarLimits,
    GrammarSource,
    Group,
    Item,
    KeywordSet,
    Literal,
    Reference,
    Repeat,
    read_grammar,
)
from ._schema import AtomType, ListOf, OneOf, Record, SchemaType, compile_schema

__all__ = ["MAX_CHECK_STEPS", "check_records", "check_schema_against_grammar"]


def _bad(message: str, where: str, what: str) -> DescriptorError:
    return DescriptorError(f"{what}: {where}: {message}")


def _atom_terminal(value: Value) -> str:
    return {Symbol: "SYMBOL", Keyword: "KEYWORD", URI: "URI", str: "STRING", int: "INTEGER",
            Decimal: "DECIMAL"}.get(type(value), "value")


# What a grammar item can start with, as the kinds of atom the schema knows: "list" for a
# list, "symbol:NAME" for a literal symbol, else the schema kind of a terminal.
_KINDS_OF_TERMINAL = {"STRING": {"string"}, "INTEGER": {"integer"}, "DECIMAL": {"decimal"},
                      "NUMBER": {"integer", "decimal"}, "SYMBOL": {"symbol"},
                      "KEYWORD": {"keyword"}, "URI": {"uri"}, "value": {"any"}}
MAX_CHECK_STEPS = 1 << 20


class _GrammarFacts:
    """What a grammar can produce, found by bounded walks of its tree: the value kinds an
    item can start with, and for a list head the keys (and their items) that can follow."""

    def __init__(self, source: GrammarSource) -> None:
        self.rules = {rule.name: rule for rule in source.rules}
        self.steps = 0
        self._openings: dict[str, list[tuple[str, tuple[Item, ...], int]]] | None = None

    def _step(self) -> None:
        self.steps += 1
        if self.steps > MAX_CHECK_STEPS:
            raise DescriptorError("checking the schema against the grammar took more "
                                  f"than {MAX_CHECK_STEPS} steps")

    def kinds(self, item: Item) -> set[str]:
        """The kinds of value ``item`` can be (``any`` for ``value``)."""
        found: set[str] = set()
        work: list[Item] = [item]
        seen: set[str] = set()
        while work:
            self._step()
            it = work.pop()
            if isinstance(it, Literal):
                if it.text == "(":
                    found.add("list")
                elif it.text.startswith(":"):
                    found.add("keyword")
                elif it.text != ")":
                    found.add("symbol:" + it.text)
            elif isinstance(it, Reference):
                if it.name in _KINDS_OF_TERMINAL:
                    found |= _KINDS_OF_TERMINAL[it.name]
                elif it.name not in seen and it.name in self.rules:
                    seen.add(it.name)
                    work.extend(alt.items[0] for alt in self.rules[it.name].alternatives
                                if alt.items)
            elif isinstance(it, Group):
                work.extend(alt.items[0] for alt in it.alternatives if alt.items)
            elif isinstance(it, Repeat):
                work.append(it.item)
            elif isinstance(it, KeywordSet):
                found.add("keyword")
        return found

    def _index(self) -> dict[str, list[tuple[str, tuple[Item, ...], int]]]:
        """Every ``"(" "HEAD"`` the grammar writes, by HEAD: the rule, the sequence and the
        index of the ``"("`` in it (one walk of the whole tree, made once)."""
        if self._openings is not None:
            return self._openings
        openings: dict[str, list[tuple[str, tuple[Item, ...], int]]] = {}
        for rule in self.rules.values():
            sequences: list[tuple[Item, ...]] = [alt.items for alt in rule.alternatives]
            while sequences:
                self._step()
                items = sequences.pop()
                for at, it in enumerate(items):
                    if isinstance(it, Group):
                        sequences.extend(a.items for a in it.alternatives)
                    elif isinstance(it, Repeat) and isinstance(it.item, Group):
                        sequences.extend(a.items for a in it.item.alternatives)
                    elif isinstance(it, KeywordSet):
                        sequences.extend((m.item,) for m in it.members)
                    elif isinstance(it, Literal) and it.text == "(" and at + 1 < len(items):
                        head = items[at + 1]
                        if isinstance(head, Literal):
                            openings.setdefault(head.text, []).append((rule.name, items, at))
        self._openings = openings
        return openings

    def lists(self, heads: tuple[Symbol, ...]) -> list[tuple[str, dict[str, list[Item]], bool]]:
        """Every place a list ``( HEADS …`` is written: its rule, the items that can follow
        each keyword literal in it (directly, in a keyword set, or in a rule it names),
        and whether a general ``KEYWORD`` can be a key there."""
        wanted = [str(h) for h in heads]
        places: list[tuple[str, dict[str, list[Item]], bool]] = []
        for rule, items, at in self._index().get(wanted[0], ()):
            self._step()
            following = items[at + 1:at + 1 + len(wanted)]
            if [x.text if isinstance(x, Literal) else None for x in following] == wanted:
                keys, general = self.keys_after(items[at + 1 + len(wanted):])
                places.append((rule, keys, general))
        return places

    def keys_after(self, items: tuple[Item, ...]) -> tuple[dict[str, list[Item]], bool]:
        keys: dict[str, list[Item]] = {}
        general = False
        work: list[tuple[Item, ...]] = [items]
        seen: set[str] = set()
        while work:
            self._step()
            sequence = work.pop()
            for at, it in enumerate(sequence):
                if isinstance(it, Literal) and it.text == ")":
                    break
                if isinstance(it, Literal) and it.text.startswith(":"):
                    if at + 1 < len(sequence):
                        keys.setdefault(it.text, []).append(sequence[at + 1])
                elif isinstance(it, Reference):
                    if it.name in ("KEYWORD", "value"):
                        general = True
                    elif it.name in self.rules and it.name not in seen:
                        seen.add(it.name)
                        work.extend(a.items for a in self.rules[it.name].alternatives)
                elif isinstance(it, KeywordSet):
                    for member in it.members:
                        keys.setdefault(member.keyword, []).append(member.item)
                elif isinstance(it, Group):
                    work.extend(a.items for a in it.alternatives)
                elif isinstance(it, Repeat):
                    work.append((it.item,))
        return keys, general


def _accepts(t: SchemaType, kinds: set[str]) -> bool:
    """True if some value of a kind in ``kinds`` (as :meth:`_GrammarFacts.kinds` gives
    them) can have type ``t``."""
    if "any" in kinds:
        return True
    if isinstance(t, AtomType):
        if t.kind == "any":
            return True
        if t.kind == "boolean":
            return "symbol" in kinds or bool({"symbol:true", "symbol:false"} & kinds)
        wanted = {"number": {"integer", "decimal"}}.get(t.kind, {t.kind})
        if t.kind == "symbol" and any(k.startswith("symbol:") for k in kinds):
            return True
        return bool(wanted & kinds)
    if isinstance(t, OneOf):
        for value in t.values:
            kind = _atom_terminal(value)
            if type(value) is Symbol and (f"symbol:{value}" in kinds or "symbol" in kinds):
                return True
            if type(value) is not Symbol and _KINDS_OF_TERMINAL[kind] & kinds:
                return True
        return False
    return "list" in kinds


def _describe_kinds(kinds: set[str]) -> str:
    shown = sorted(k.replace("symbol:", "the symbol ") for k in kinds)
    return " or ".join(shown) if shown else "nothing"


def check_schema_against_grammar(grammar: str, schema: Value, *,
                                 starts: tuple[str, ...] = ("body",),
                                 grammar_limits: GrammarLimits | None = None) -> None:
    """Check a ``(schema …)`` section against the body grammar it is to go with: every
    record's heads must start a list the grammar writes, every field must be a key the
    grammar can write after them (or the grammar writes any ``KEYWORD`` there), and every
    field's type must admit some value the grammar can write after that key (a field
    typed ``string`` where the grammar writes ``SYMBOL`` is refused).

    Raises :class:`GrammarError` for a grammar outside the subset, and
    :class:`DescriptorError` for a malformed schema or a disagreement, naming the schema's
    place (``$.schema[2]``) and the grammar's rule."""
    compiled = compile_schema(schema)
    records = [(record, f"$.schema[{i}]") for i, record in enumerate(compiled.records, 1)]
    check_records(grammar, starts, records, grammar_limits, "schema")


def check_records(grammar: str, starts: tuple[str, ...], records: list[tuple[Record, str]],
                  limits: GrammarLimits | None, what: str) -> int:
    """:func:`check_schema_against_grammar` for ``records``, each with the path that names
    it in ``what`` (``schema``, ``declaration``): the steps it took. Raises as
    :func:`check_schema_against_grammar` does."""
    source = read_grammar(grammar, limits=limits, starts=tuple(dict.fromkeys(starts)))
    facts = _GrammarFacts(source)
    work = list(records)
    checked: set[str] = set()
    while work:
        record, where = work.pop(0)
        key = repr(record)
        if key in checked:
            continue
        checked.add(key)
        heads = " ".join(record.heads)
        places = facts.lists(record.heads)
        if not places:
            raise _bad(f"the grammar writes no list ({heads} …) for this record", where, what)
        for field, t in record.keys.fields.items():
            keyword = ":" + str.__str__(field)
            produced = [(rule, items) for rule, keys, _ in places
                        for items in [keys.get(keyword, [])]]
            if not any(items for _, items in produced):
                if any(general for _, _, general in places):
                    continue
                rules = ", ".join(dict.fromkeys(rule for rule, _, _ in places))
                raise _bad(f"field {keyword} of ({heads} …): the grammar cannot write it "
                           f"(grammar rule {rules})", where, what)
            kinds: set[str] = set()
            for _, items in produced:
                for item in items:
                    kinds |= facts.kinds(item)
            if not _accepts(t, kinds):
                rules = ", ".join(dict.fromkeys(r for r, items in produced if items))
                raise _bad(f"field {keyword} of ({heads} …) is {t.describe()}, but the "
                           f"grammar writes {_describe_kinds(kinds)} there (grammar rule "
                           f"{rules})", where, what)
            nested = [t] if isinstance(t, Record) else \
                [t.item] if isinstance(t, ListOf) and isinstance(t.item, Record) else []
            work.extend((n, where) for n in nested if isinstance(n, Record))
    return facts.steps
