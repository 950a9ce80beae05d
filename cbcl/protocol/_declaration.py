"""Protocol declarations: one source from which a descriptor's grammar and schema are both
derived (spec/declarations.md).

A declaration says, per intent, which records its body may be — each a head symbol and its
members, in the schema's own type language (spec/conversations.md §2)::

    (protocol-declaration
      (id auction/v1)
      (version 1)
      (intent REQUEST
        (record ask
          (:item (string :min-length 1 :max-length 128) required)
          (:quantity (integer :min 1 :max 1000) required)
          (:note (string :max-length 1024))))
      (intent INFORM (rule offer) (record offer …))
      (conversation …)                        ; optional, as in a descriptor
      (functions …))                          ; optional

Theory of operation. :func:`read_declaration` reads the text under the reader's limits and
compiles every record with the schema's own compiler (so a type means here exactly what it
means in a schema), then derives the body grammar from the compiled types by a walk over
an explicit work list (no recursion: types are at most ``MAX_TYPE_DEPTH`` deep, but the
walk costs no frames anyway). Every composite type (a record, a ``keys`` list, a
``list-of``) becomes one rule, so no rule nests groups more than two deep whatever the
type's depth; rule names come from intents, heads and keys, made unique in the order they
are met, so the same declaration always gives the same grammar text, byte for byte. The
grammar is permissive where the schema is precise (a ``string`` is ``STRING`` whatever its
length; a ``one-of`` of symbols is a choice of literals, of other atoms their terminal)
and the schema is the declaration's records as written, so grammar and schema cannot
disagree. A declaration may instead carry a hand-written ``(grammar "…")``: then its
records are checked against that grammar (:func:`check_records_against_grammar`) and a
field the grammar cannot produce after the record's head, or a type no value of which the
grammar can produce there, is a :class:`DescriptorError` naming both places.

Everything in a declaration may come from a peer: the reader's limits bound the text, the
schema compiler bounds type depth, and the derived grammar is held to the grammar limits
(rules, members per keyword set, text size) before anything is compiled, each checked
before the work it protects; then the grammar is LR(1)-checked as any descriptor's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal

from ..core._canonical import canonical_value
from ..core._errors import DescriptorError
from ..core._limits import DEFAULT_LIMITS, Limits
from ..core._reader import read
from ..core._values import INT64_MAX, URI, Keyword, Symbol, Value
from ..grammar._subset import (
    GrammarLimits,
    rule_name_problem,
)
from ._agreement import check_records
from ._authoring import build_descriptor, intent_entries, protocol_id
from ._message import Intent
from ._schema import (
    ELSE,
    MAX_TYPE_DEPTH,
    REQUIRED,
    AtomType,
    Keys,
    ListOf,
    OneOf,
    Record,
    SchemaType,
    _Bad,
    _compile_type,
    _length,
    _options,
)

__all__ = [
    "DECLARATION_HEAD",
    "Declaration",
    "descriptor_from_declaration",
    "read_declaration",
]

#: The head symbol of a declaration.
DECLARATION_HEAD = "protocol-declaration"
#: The longest rule name the derivation makes (before a ``_N`` suffix).
MAX_DERIVED_NAME = 40

_TERMINAL_OF_KIND = {"string": "STRING", "integer": "INTEGER", "decimal": "DECIMAL",
                     "number": "NUMBER", "symbol": "SYMBOL", "keyword": "KEYWORD",
                     "uri": "URI", "any": "value"}
_LITERAL_NAME = re.compile(r"[A-Za-z+\-*/<>=!?_.][A-Za-z0-9+\-*/<>=!?_.@%&]*\Z")
_NOT_IN_RULE = re.compile(r"[^a-z0-9_]+")
_RESERVED_RULES = frozenset({"body", "value"})


@dataclass(frozen=True, slots=True)
class Declaration:
    """A declaration as read: the descriptor's fields, with ``grammar`` derived (or as
    written, when ``derived`` is false) and ``schema`` the ``(schema …)`` section made of
    the declared records. ``starts`` gives each intent its start rule, ``records`` the
    records each intent's body may be (what typed classes or generated code would follow)."""

    id: Symbol
    version: int
    expires: int | None
    starts: tuple[tuple[Intent, str], ...]
    grammar: str
    derived: bool
    schema: Value | None
    conversation: Value | None
    functions: Value | None
    #: Per intent, in order, the records its body may be, as declared (their values).
    records: tuple[tuple[Intent, tuple[Value, ...]], ...] = ()
    #: The ``(constraints …)`` section (conversations.md §5), as written, or ``None``.
    constraints: Value | None = None

    def build(self, *, comment: str | None = None, limits: Limits | None = None,
              grammar_limits: GrammarLimits | None = None) -> bytes:
        """The descriptor's bytes (:func:`cbcl.build_descriptor` of these fields): raises as
        it does."""
        return build_descriptor(
            self.id, self.version, [f"{i.value}={r}" for i, r in self.starts], self.grammar,
            schema=self.schema, conversation=self.conversation, functions=self.functions,
            constraints=self.constraints, expires=self.expires, comment=comment, limits=limits,
            grammar_limits=grammar_limits)


def _bad(message: str, where: str, what: str = "declaration") -> DescriptorError:
    return DescriptorError(f"{what}: {where}: {message}")


def _shown(value: Value) -> str:
    text = canonical_value(value)
    return text if len(text) <= 40 else text[:37] + "..."


# ------------------------------------------------------------ the declaration's own types
#
# A declaration's types are the schema's, plus two forms a schema has no type for, which
# the grammar says and the schema section receives in a weaker form (its *projection*):
#
# * ``(ordered MEMBER …)``, first after a record's heads (or first in a ``keys`` type):
#   members in a fixed place, in the order written, before the keyword set of the other
#   fields. A member is a field ``(:key TYPE [required])`` or, with no key, a positional
#   value ``TYPE`` (always required). Without positional members the projection is the
#   record with the group's fields in its place (a schema does not check order); with one
#   it is ``any``.
# * ``(either TYPE …)``: a value of one of the types (a union). Its projection is ``any``.
#
# What only the grammar checks must be said by it exactly: inside an ``either``, and in a
# record with positional members, every type is one the grammar says exactly (atoms
# without options, ``one-of``s of symbol literals, lists without bounds, records and keys
# without ``(else …)``, ``either``s of these). A type outside that is refused, naming the
# place, rather than accepted unchecked.

ORDERED = Symbol("ordered")
EITHER = Symbol("either")
_ANY = Symbol("any")


@dataclass(frozen=True, slots=True)
class Member:
    """A member of a :class:`Shaped` record: its key (``None`` for a positional one), its
    type and whether it is required."""

    key: Keyword | None
    type: DeclaredType
    required: bool


@dataclass(frozen=True, slots=True)
class Shaped:
    """A record (``heads``; none for a ``keys`` type) with members in a fixed order
    (``ordered``) before the keyword set ``fields``, or whose fields use declaration-only
    types. ``other`` is ``(else …)``'s type."""

    heads: tuple[Symbol, ...]
    ordered: tuple[Member, ...]
    fields: tuple[Member, ...]
    other: DeclaredType | None

    @property
    def positional(self) -> bool:
        return any(m.key is None for m in self.ordered)


@dataclass(frozen=True, slots=True)
class Either:
    """A value of one of ``alternatives`` (a union; the schema sees ``any``)."""

    alternatives: tuple[DeclaredType, ...]


@dataclass(frozen=True, slots=True)
class ListOfDeclared:
    """A ``list-of`` whose element uses a declaration-only type."""

    item: DeclaredType
    min_length: int | None = None
    max_length: int | None = None


DeclaredType = SchemaType | Shaped | Either | ListOfDeclared


def _uses_forms(value: Value) -> bool:
    """True if the type ``value`` holds an ``(ordered …)`` or ``(either …)`` anywhere."""
    work = [value]
    while work:
        item = work.pop()
        if type(item) is tuple:
            if item and item[0] in (ORDERED, EITHER) and type(item[0]) is Symbol:
                return True
            work.extend(v for v in item if type(v) is tuple)
    return False


def _exact_problem(t: SchemaType, max_literal: int) -> str | None:
    """What of the schema type ``t`` the grammar cannot say exactly, or ``None``."""
    work: list[SchemaType] = [t]
    while work:
        item = work.pop()
        if isinstance(item, AtomType):
            if item != AtomType(item.kind):
                return f"{item.describe()} (its options)"
        elif isinstance(item, OneOf):
            if not all(type(v) is Symbol and _literal(str(v), max_literal)
                       for v in item.values):
                return f"{item.describe()} (only symbols written as literals)"
        elif isinstance(item, ListOf):
            if item.min_length is not None or item.max_length is not None:
                return "a list's length bounds"
            work.append(item.item)
        else:
            keys = item.keys if isinstance(item, Record) else item
            if keys.other is not None:
                return "(else …) keys (a key may be repeated)"
            work.extend(keys.fields.values())
    return None


def _not_exact(what: str, where: str) -> _Bad:
    return _Bad(f"{what} cannot be checked here: inside (either …) or a record with "
                "positional members the grammar alone checks a value, and it cannot say "
                "that", where)


def compile_declared_type(value: Value, where: str, depth: int, *, exact: bool = False,
                          max_literal: int = 64) -> tuple[DeclaredType, Value]:
    """A declaration's type (the schema's, with ``(ordered …)`` and ``(either …)``) and
    its projection, the schema type that stands for it. Raises ``_Bad`` (with a path)."""
    if depth > MAX_TYPE_DEPTH:
        raise _Bad(f"types nested more than {MAX_TYPE_DEPTH} deep", where)
    if not _uses_forms(value):
        t = _compile_type(value, where, depth)
        if exact and (problem := _exact_problem(t, max_literal)) is not None:
            raise _not_exact(problem, where)
        return t, value
    if type(value) is not tuple or not value or type(value[0]) is not Symbol:
        raise _Bad(f"expected a type (a name or a (name …) list), found {_shown(value)}",
                   where)
    name = str(value[0])
    if value[0] == EITHER:
        if len(value) < 2:
            raise _Bad("either lists at least one type", where)
        alternatives = tuple(
            compile_declared_type(v, f"{where}[{i}]", depth + 1, exact=True,
                                  max_literal=max_literal)[0]
            for i, v in enumerate(value[1:], 1))
        return Either(alternatives), _ANY
    if name == "list-of":
        if len(value) < 2:
            raise _Bad("list-of needs an element type", where)
        item, projected = compile_declared_type(value[1], f"{where}[1]", depth + 1,
                                                exact=exact, max_literal=max_literal)
        opts = _options(value[2:], ("min-length", "max-length"), where, 2)
        lo = _length(opts["min-length"], where) if "min-length" in opts else None
        hi = _length(opts["max-length"], where) if "max-length" in opts else None
        if lo is not None and hi is not None and lo > hi:
            raise _Bad(":min-length is greater than :max-length", where)
        if exact and (lo is not None or hi is not None):
            raise _not_exact("a list's length bounds", where)
        return ListOfDeclared(item, lo, hi), (value[0], projected, *value[2:])
    if name in ("record", "keys"):
        return _compile_shaped(value, where, depth, exact, max_literal)
    if value[0] == ORDERED:
        raise _Bad("(ordered …) is a record's first member group, not a type", where)
    raise _Bad(f"unknown type {name}", where)  # (an atom type holds no type)


def _compile_shaped(value: tuple[Value, ...], where: str, depth: int, exact: bool,
                    max_literal: int) -> tuple[DeclaredType, Value]:
    heads: list[Symbol] = []
    i = 1
    if value[0] == Symbol("record"):
        while i < len(value) and type(head := value[i]) is Symbol:
            heads.append(head)
            i += 1
        if not heads:
            raise _Bad("a record starts with its head symbol(s): (record task …)", where)
    group: tuple[Value, ...] = ()
    group_at = i
    first = value[i] if i < len(value) else None
    if type(first) is tuple and first and first[0] == ORDERED:
        group = first[1:]
        i += 1
    positional = any(not (type(m) is tuple and m and type(m[0]) is Keyword) for m in group)
    exact = exact or positional
    seen: set[Keyword] = set()

    def field(item: Value, at: str) -> tuple[Member, Value]:
        if type(item) is not tuple or len(item) not in (2, 3) or type(item[0]) is not Keyword:
            raise _Bad("expected a field (:key TYPE) or (:key TYPE required), or (else TYPE)",
                       at)
        key: Keyword = item[0]
        if key in seen:
            raise _Bad(f"key {key.text} is listed twice", at)
        seen.add(key)
        if len(item) == 3 and item[2] != REQUIRED:
            raise _Bad(f"expected required after the type, found {_shown(item[2])}",
                       f"{at}[2]")
        t, projected = compile_declared_type(item[1], f"{at}[1]", depth + 1, exact=exact,
                                             max_literal=max_literal)
        return Member(key, t, len(item) == 3), (key, projected, *item[2:])

    ordered: list[Member] = []
    projection: list[Value] = []
    for n, item in enumerate(group, 1):
        at = f"{where}[{group_at}][{n}]"
        if type(item) is tuple and item and type(item[0]) is Keyword:
            member, projected = field(item, at)
            ordered.append(member)
            projection.append(projected)
        elif type(item) is tuple and item and item[0] == ELSE:
            raise _Bad("(else …) follows the fields, after (ordered …)", at)
        else:
            t, _ = compile_declared_type(item, at, depth + 1, exact=True,
                                         max_literal=max_literal)
            ordered.append(Member(None, t, True))
    fields: list[Member] = []
    other: DeclaredType | None = None
    for n, item in enumerate(value[i:], i):
        at = f"{where}[{n}]"
        if type(item) is tuple and item and item[0] == ORDERED:
            raise _Bad("(ordered …) comes first, right after the heads", at)
        if type(item) is tuple and len(item) == 2 and item[0] == ELSE:
            if other is not None:
                raise _Bad("(else …) is repeated", at)
            if exact:
                raise _not_exact("(else …) keys (a key may be repeated)", at)
            other, projected_other = compile_declared_type(item[1], f"{at}[1]", depth + 1,
                                                           max_literal=max_literal)
            projection.append((ELSE, projected_other))
            continue
        member, projected = field(item, at)
        fields.append(member)
        projection.append(projected)
    shaped = Shaped(tuple(heads), tuple(ordered), tuple(fields), other)
    if positional:
        return shaped, _ANY
    return shaped, (value[0], *heads, *projection)


# ------------------------------------------------------------------------------ reading

def read_declaration(source: str | bytes | Value, *, limits: Limits | None = None,
                     grammar_limits: GrammarLimits | None = None) -> Declaration:
    """Read a ``(protocol-declaration …)`` (text, UTF-8 bytes, or its value) and derive
    its grammar and schema (spec/declarations.md).

    Raises ``TypeError`` for a source of another type; :class:`MalformedError` or
    :class:`LimitError` for text the reader refuses (under ``limits``); and
    :class:`DescriptorError` for a declaration that is not valid — its path names the place
    (``$.intent[2][3][2][1]``: the second intent's third element, a record, then its second
    element, a field, then the field's type), and for a hand-written grammar, the grammar rule too.
    The derived grammar is held to ``grammar_limits`` (rules, members per keyword set,
    text size); it is not compiled here (:meth:`Declaration.build` does that)."""
    limits = DEFAULT_LIMITS if limits is None else limits
    glimits = GrammarLimits() if grammar_limits is None else grammar_limits
    if isinstance(source, (bytes, bytearray, memoryview)):
        value = read(bytes(source), limits=limits)
    elif type(source) is str:
        value = read(source.encode("utf-8"), limits=limits)
    elif isinstance(source, tuple):
        value = read(canonical_value(source).encode("utf-8"), limits=limits)
    else:
        raise TypeError(f"a declaration is text, bytes or a value, not "
                        f"{type(source).__name__}")
    if type(value) is not tuple or not value or value[0] != Symbol(DECLARATION_HEAD):
        raise _bad(f"expected ({DECLARATION_HEAD} …), found {_shown(value)}", "$")
    fields: dict[str, Value] = {}
    intents: list[tuple[int, tuple[Value, ...]]] = []
    for index, item in enumerate(value[1:], 1):
        where = f"$[{index}]"
        if type(item) is not tuple or not item or type(item[0]) is not Symbol:
            raise _bad(f"expected a (name …) field, found {_shown(item)}", where)
        name = str(item[0])
        if name == "intent":
            intents.append((index, item))
            continue
        if name not in ("id", "version", "expires", "grammar", "conversation", "functions",
                        "constraints"):
            raise _bad(f"unknown field {name} (known: id version expires intent grammar "
                       "conversation functions constraints)", where)
        if name in fields:
            raise _bad(f"field {name} is repeated", where)
        if name in ("id", "version", "expires", "grammar"):
            if len(item) != 2:
                raise _bad(f"({name} …) holds one value", where)
            fields[name] = item[1]
        else:
            fields[name] = item
    for name in ("id", "version"):
        if name not in fields:
            raise _bad(f"the ({name} …) field is missing", "$")
    ident_value = fields["id"]
    if type(ident_value) is not Symbol:
        raise _bad("the id is a symbol such as auction/v1", "$.id")
    ident = protocol_id(str(ident_value))
    version = _count(fields["version"], "$.version")
    expires = _count(fields["expires"], "$.expires") if "expires" in fields else None
    grammar = fields.get("grammar")
    if grammar is not None and type(grammar) is not str:
        raise _bad("the grammar is a string (the text of spec §4)", "$.grammar")
    if not intents:
        raise _bad("a declaration lists at least one (intent …)", "$")
    parsed = [_read_intent(item, f"$.intent[{n}]", grammar is not None,
                           glimits.max_literal_chars)
              for n, (_, item) in enumerate(intents, 1)]
    entries = intent_entries([f"{intent}={rule}" for intent, rule, _ in parsed])
    schema = _schema_section(parsed)
    conversation, functions = fields.get("conversation"), fields.get("functions")
    constraints = fields.get("constraints")
    if grammar is None:
        first: dict[str, str] = {}
        for n, (intent, rule, _) in enumerate(parsed, 1):
            if first.setdefault(rule, intent) != intent:
                raise _bad(f"the start rule {rule} is {first[rule]}'s too (without a "
                           "grammar, each intent has its own)", f"$.intent[{n}]")
        text = derive_grammar(parsed, glimits)
        return Declaration(ident, version, expires, entries, text, True, schema,
                           conversation, functions, _records_of(parsed), constraints)
    check_records(str(grammar), tuple(rule for _, rule in entries),
                  [(record, where) for _, _, declared in parsed
                   for _, record, where, _, _ in declared], glimits, "declaration")
    return Declaration(ident, version, expires, entries, str(grammar), False, schema,
                       conversation, functions, _records_of(parsed), constraints)


def _records_of(parsed: list[_Intent]) -> tuple[tuple[Intent, tuple[Value, ...]], ...]:
    return tuple((Intent(name), tuple(value for value, _, _, _, _ in declared))
                 for name, _, declared in parsed)


def _count(value: Value, where: str) -> int:
    if type(value) is not int or not 0 <= value <= INT64_MAX:
        raise _bad(f"expected an integer from 0 to {INT64_MAX}, found {_shown(value)}", where)
    return value


# An intent as read: its name, start rule and records (each with its value as written,
# its projection's compiled schema record, where it was declared and its declared type).
_Declared = tuple[Value, Record, str, "DeclaredType", Value]
_Intent = tuple[str, str, tuple[_Declared, ...]]


def _read_intent(item: tuple[Value, ...], where: str, hand_written: bool,
                 max_literal: int) -> _Intent:
    if len(item) < 2 or type(item[1]) is not Symbol:
        raise _bad("an intent is (intent NAME [(rule NAME)] (record …) …)", where)
    name = str(item[1])
    try:
        Intent(name)
    except ValueError:
        raise _bad(f"unknown intent {name} (known: "
                   + " ".join(i.value for i in Intent) + ")", where) from None
    rule: str | None = None
    records: list[_Declared] = []
    for index, part in enumerate(item[2:], 2):
        at = f"{where}[{index}]"
        if type(part) is tuple and len(part) == 2 and part[0] == Symbol("rule"):
            if rule is not None:
                raise _bad("(rule …) is repeated", at)
            if type(part[1]) is not Symbol or rule_name_problem(str(part[1])) is not None:
                raise _bad("a start rule is a rule name ([a-z][a-z0-9_]*)", at)
            rule = str(part[1])
            continue
        if type(part) is not tuple or not part or part[0] != Symbol("record"):
            raise _bad(f"expected (record HEAD … FIELD …) or (rule NAME), found "
                       f"{_shown(part)}", at)
        try:
            declared, projected = compile_declared_type(part, at, 1, max_literal=max_literal)
            if projected == _ANY:
                raise _Bad("a body record cannot have positional members (a schema could "
                           "not say it): give them keys", at)
            record = _compile_type(projected, at, 1)
        except _Bad as exc:
            raise _bad(str(exc), exc.path) from None
        if not isinstance(record, Record):  # pragma: no cover - (record …) compiles to one
            raise _bad("expected a record", at)
        records.append((part, record, at, declared, projected))
    if not records and not hand_written:
        raise _bad(f"intent {name} declares no record (without a grammar, each intent "
                   "lists the records its body may be)", where)
    default = _NOT_IN_RULE.sub("_", name.lower())
    return name, rule or default, tuple(records)


def _schema_section(parsed: list[_Intent]) -> Value | None:
    """The ``(schema …)`` section: every declared record once, in the order declared. The
    same heads declared twice must be the same record (a body is matched by its heads)."""
    seen: dict[tuple[Symbol, ...], tuple[str, str]] = {}
    records: list[Value] = []
    for _, _, declared in parsed:
        for value, record, where, _, projected in declared:
            text = canonical_value(value)
            first = seen.get(record.heads)
            if first is None:
                seen[record.heads] = (text, where)
                records.append(projected)
            elif first[0] != text:
                raise _bad(f"the record ({' '.join(record.heads)} …) is declared "
                           f"differently at {first[1]} (a body is matched by its heads: "
                           "declare it once)", where)
    return (Symbol("schema"), *records) if records else None


# --------------------------------------------------------------------- deriving a grammar

class _Names:
    """Rule names, unique and deterministic: a wanted name, cut and cleaned, else the same
    with ``_2``, ``_3`` …"""

    def __init__(self, taken: Iterable[str]) -> None:
        self.taken = set(taken) | _RESERVED_RULES

    def make(self, wanted: str) -> str:
        base = _NOT_IN_RULE.sub("_", wanted.lower()).strip("_")[:MAX_DERIVED_NAME]
        base = base.rstrip("_")
        if not base or not base[0].isalpha():
            base = "r_" + base if base else "r"
        name, n = base, 1
        while name in self.taken or rule_name_problem(name) is not None:
            n += 1
            name = f"{base}_{n}"
        self.taken.add(name)
        return name


def _literal(name: str, max_chars: int) -> bool:
    """True if the symbol or keyword text ``name`` can be a grammar literal of at most
    ``max_chars`` characters."""
    return (name.isascii() and len(name) <= max_chars
            and _LITERAL_NAME.match(name.removeprefix(":")) is not None
            and not (name[0] in "+-." and len(name) > 1 and name[1].isdigit()))


def _atom_terminal(value: Value) -> str:
    if type(value) is Symbol:
        return "SYMBOL"
    if type(value) is Keyword:
        return "KEYWORD"
    if type(value) is URI:
        return "URI"
    if type(value) is str:
        return "STRING"
    if type(value) is int:
        return "INTEGER"
    if type(value) is Decimal:
        return "DECIMAL"
    return "value"  # pragma: no cover - one-of holds atoms only


def _choice(options: list[str]) -> str:
    options = list(dict.fromkeys(options))
    return options[0] if len(options) == 1 else "(" + " | ".join(options) + ")"


class _Deriver:
    """The grammar's rules, made from compiled types with an explicit work list."""

    def __init__(self, starts: Iterable[str], limits: GrammarLimits) -> None:
        self.names = _Names(starts)
        self.limits = limits
        self.rules: list[tuple[str, str]] = []
        self.by_type: dict[str, str] = {}  # canonical key of a composite type -> its rule
        self.work: list[tuple[str, DeclaredType, str]] = []

    def rule_for(self, t: DeclaredType, wanted: str, where: str,
                 name: str | None = None) -> str:
        """The rule that derives composite type ``t`` (made once per distinct type)."""
        key = repr(t) if name is None else f"{name}\0{t!r}"
        found = self.by_type.get(key)
        if found is not None:
            return found
        if name is None:  # (a start rule is in the list already)
            self.count(where)
            rule = self.names.make(wanted)
            self.rules.append((rule, ""))
        else:
            rule = name
        self.by_type[key] = rule
        self.work.append((rule, t, where))
        return rule

    def count(self, where: str) -> None:
        """Refuse one more rule past ``max_rules``."""
        if len(self.rules) >= self.limits.max_rules:
            raise _bad(f"the derived grammar needs more than {self.limits.max_rules} rules "
                       "(GrammarLimits.max_rules)", where)

    def options(self, t: DeclaredType, wanted: str, where: str) -> list[str]:
        """The alternatives of an item of type ``t`` (one, but for a ``one-of``)."""
        if isinstance(t, AtomType):
            if t.kind == "boolean":
                return ['"true"', '"false"']
            return [_TERMINAL_OF_KIND[t.kind]]
        if isinstance(t, OneOf):
            symbols = [v for v in t.values if type(v) is Symbol]
            literal = all(_literal(str(v), self.limits.max_literal_chars) for v in symbols)
            options = [f'"{v}"' if literal and type(v) is Symbol else _atom_terminal(v)
                       for v in t.values]
            if "INTEGER" in options and "DECIMAL" in options:
                options = ["NUMBER" if o in ("INTEGER", "DECIMAL") else o for o in options]
            return list(dict.fromkeys(options))
        heads = t.heads if isinstance(t, (Record, Shaped)) else ()
        return [self.rule_for(t, "_".join(heads) if heads else wanted, where)]

    def expression(self, t: DeclaredType, wanted: str, where: str) -> str:
        if isinstance(t, AtomType) and t.kind == "boolean":
            return '("true" | "false")'
        return _choice(self.options(t, wanted, where))

    def key_literal(self, text: str, where: str) -> None:
        if not _literal(":" + text, self.limits.max_literal_chars):
            raise _bad(f"the key :{text} cannot be a grammar literal (ASCII, at most "
                       f"{self.limits.max_literal_chars} characters with its colon, "
                       "GrammarLimits.max_literal_chars)", where)

    def keyword_set(self, fields: list[tuple[Keyword, DeclaredType, bool]],
                    other: DeclaredType | None, wanted: str, where: str) -> str:
        """A record's or keys type's keyword set (fields each once, in any order), or with
        ``other`` the keyword-argument list of any keys."""
        if other is not None:
            element = self.expression(other, wanted + "_other", where) \
                if not fields else "value"
            return f"(KEYWORD {element})*"
        if len(fields) > self.limits.max_set_members:
            raise _bad(f"a record or keys type has more than {self.limits.max_set_members} "
                       "fields (GrammarLimits.max_set_members)", where)
        parts = []
        for key, child, required in fields:
            text = str.__str__(key)
            self.key_literal(text, where)
            item = self.expression(child, f"{wanted}_{text}", where)
            member = f'":{text}" {item}'
            parts.append(member if required else f"[{member}]")
        if not parts:
            return ""
        return parts[0] if len(parts) == 1 else "(" + " & ".join(parts) + ")"

    def members(self, keys: Keys, wanted: str, where: str) -> str:
        return self.keyword_set([(key, child, key in keys.required)
                                 for key, child in keys.fields.items()],
                                keys.other, wanted, where)

    def shaped(self, t: Shaped, wanted: str, where: str) -> str:
        """The members of a record with an ``(ordered …)`` group: the group's, in order
        (a positional one its item, a field ``":key" ITEM``, ``[…]`` if optional), then the
        keyword set of the others."""
        if len(t.ordered) + len(t.fields) > self.limits.max_set_members:
            raise _bad(f"a record or keys type has more than {self.limits.max_set_members} "
                       "fields (GrammarLimits.max_set_members)", where)
        parts = []
        for n, member in enumerate(t.ordered, 1):
            if member.key is None:
                parts.append(self.expression(member.type, f"{wanted}_{n}", where))
                continue
            text = str.__str__(member.key)
            self.key_literal(text, where)
            item = f'":{text}" {self.expression(member.type, f"{wanted}_{text}", where)}'
            parts.append(item if member.required else f"[{item}]")
        rest = self.keyword_set([(m.key, m.type, m.required) for m in t.fields
                                 if m.key is not None], t.other, wanted, where)
        return " ".join(parts + ([rest] if rest else []))

    def heads_of(self, heads: tuple[Symbol, ...], where: str) -> str:
        for head in heads:
            if not _literal(str(head), self.limits.max_literal_chars):
                raise _bad(f"the head {head} cannot be a grammar literal (ASCII, at most "
                           f"{self.limits.max_literal_chars} characters, "
                           "GrammarLimits.max_literal_chars)", where)
        return " ".join(f'"{h}"' for h in heads)

    def body_of(self, t: DeclaredType, wanted: str, where: str) -> str:
        if isinstance(t, Record):
            heads = self.heads_of(t.heads, where)
            inner = self.members(t.keys, wanted, where)
            return f'"(" {heads}{" " + inner if inner else ""} ")"'
        if isinstance(t, Shaped):
            inner = " ".join(part for part in (self.heads_of(t.heads, where),
                                               self.shaped(t, wanted, where)) if part)
            return f'"(" {inner} ")"' if inner else '"(" ")"'
        if isinstance(t, Keys):
            inner = self.members(t, wanted, where)
            return f'"(" {inner} ")"' if inner else '"(" ")"'
        if isinstance(t, (ListOf, ListOfDeclared)):
            item = self.expression(t.item, wanted + "_item", where)
            return f'"(" {item}* ")"'
        if isinstance(t, Either):
            options: list[str] = []
            for n, alternative in enumerate(t.alternatives, 1):
                options += self.options(alternative, f"{wanted}_{n}", where)
            return " | ".join(dict.fromkeys(options))
        raise _bad("not a composite type", where)  # pragma: no cover

    def run(self) -> None:
        done = dict(self.rules)
        at = 0
        while at < len(self.work):  # (each rule's body may add rules to the work list)
            rule, t, where = self.work[at]
            at += 1
            done[rule] = self.body_of(t, rule, where)
        self.rules = [(name, done[name]) for name, _ in self.rules]


def derive_grammar(parsed: list[_Intent], limits: GrammarLimits) -> str:
    """The body grammar text of a declaration without a grammar (spec/declarations.md §3)."""
    starts = [rule for _, rule, _ in parsed]
    deriver = _Deriver(starts, limits)
    users: dict[str, int] = {}
    for _, _, declared in parsed:
        for value, *_ in declared:
            text = canonical_value(value)
            users[text] = users.get(text, 0) + 1
    for start in starts:  # the start rules first, in the intents' order
        deriver.count("$")
        deriver.rules.append((start, ""))
    choices: dict[str, str] = {}
    for _intent, start, declared in parsed:
        if len(declared) == 1 and users[canonical_value(declared[0][0])] == 1:
            deriver.rule_for(declared[0][3], start, declared[0][2], name=start)
        else:
            choices[start] = " | ".join(dict.fromkeys(
                deriver.rule_for(record, "_".join(compiled.heads), where)
                for _, compiled, where, record, _ in declared))
    deriver.run()
    deriver.rules = [(name, choices.get(name, body)) for name, body in deriver.rules]
    lines = ["// Derived from a protocol declaration (spec/declarations.md): do not edit."]
    lines += [f"{name}: {body}" for name, body in deriver.rules]
    text = "\n".join(lines) + "\n"
    if len(text.encode("utf-8")) > limits.max_text_bytes:
        raise _bad(f"the derived grammar is over {limits.max_text_bytes} bytes "
                   "(GrammarLimits.max_text_bytes)", "$")
    return text


# ------------------------------------------------------------------------- the public call

def descriptor_from_declaration(declaration: str | bytes | Value, *,
                                comment: str | None = None, limits: Limits | None = None,
                                grammar_limits: GrammarLimits | None = None) -> bytes:
    """The bytes of the descriptor a ``(protocol-declaration …)`` declares: its grammar
    derived from the records (or the declaration's own grammar, checked against them),
    its schema the records, in the layout of :func:`cbcl.build_descriptor`. The same
    declaration always gives the same bytes.

    Raises as :func:`read_declaration`, and as :func:`cbcl.build_descriptor` (notably
    :class:`GrammarError` for a grammar the LR(1) checker refuses)."""
    return read_declaration(declaration, limits=limits,
                            grammar_limits=grammar_limits).build(
        comment=comment, limits=limits, grammar_limits=grammar_limits)
