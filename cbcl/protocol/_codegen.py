"""Python record classes for a descriptor's schema (``cbcl codegen``, spec/declarations.md
§9).

Theory of operation. The descriptor's schema is compiled (the schema's own compiler); each
record, and each ``(keys …)`` type with fields nested in one, becomes a class, written
after the classes it uses; each field an annotation that :mod:`cbcl.protocol._records`
maps back to exactly the compiled type (``Annotated[int, cbcl.Range(1, 5)]`` for
``(integer :min 1 :max 5)``); what no annotation says (a ``one-of`` of strings or
keywords, a ``keys`` type with ``(else …)``) is written ``Annotated[cbcl.Value,
Declared("…")]``. The intents a record is a body of come from the grammar: the start
rule's own record, or the records its choice names (a derived grammar), else the records
whose heads a rule reachable from the start rule writes (a hand-written one).

Everything in the output that came from the peer is written as a Python string literal
(``repr``) or as an identifier made of ``[A-Za-z0-9_]`` only, so a hostile descriptor
cannot put code in the module; its size is linear in the schema's.
"""

from __future__ import annotations

import keyword as _pykeyword
import re
from decimal import Decimal

from ..core._canonical import canonical_value
from ..core._errors import CBCLError, DescriptorError
from ..core._values import Symbol
from ._declaration import DECLARATION_HEAD, read_declaration
from ._descriptor import ProtocolDescriptor, read_descriptor
from ._schema import AtomType, Keys, ListOf, OneOf, Record, SchemaType, compile_schema

__all__ = ["generate_records"]

_DERIVED = "// Derived from a protocol declaration"
_RULE_LINE = re.compile(r"^([a-z][a-z0-9_]*)\s*:(.*)$")
_IDENT = re.compile(r"[a-z][a-z0-9_]*")
_NOT_WORD = re.compile(r"[^A-Za-z0-9]+")


def _class_name(words: str, taken: set[str]) -> str:
    base = "".join(part[:1].upper() + part[1:] for part in _NOT_WORD.split(words) if part)
    if not base or not base[0].isalpha():
        base = "R" + base
    name, n = base, 1
    while name in taken or _pykeyword.iskeyword(name):
        n += 1
        name = f"{base}{n}"
    taken.add(name)
    return name


def _field_name(key: str, taken: set[str]) -> tuple[str, bool]:
    """A field name for ``key`` and whether it needs ``Key(…)`` to say its keyword."""
    name = key.replace("-", "_")
    plain = name.isidentifier() and name.isascii() and not _pykeyword.iskeyword(name) \
        and not name.startswith("_") and name not in taken
    if not plain:
        name = "f_" + re.sub(r"[^A-Za-z0-9_]", "_", name).strip("_")
        base, n = name, 1
        while name in taken or _pykeyword.iskeyword(name):
            n += 1
            name = f"{base}_{n}"
    taken.add(name)
    return name, name.replace("_", "-") != key


def _number(value: int | Decimal | None) -> str:
    if value is None:
        return "None"
    return repr(value) if type(value) is int else f"Decimal({str(value)!r})"


class _Writer:
    def __init__(self) -> None:
        self.classes: list[str] = []
        self.names: set[str] = {"Record", "Decimal", "Annotated", "Literal", "Declared",
                                "Key", "Scheme", "cbcl"}
        self.made: dict[str, str] = {}  # canonical repr of a type -> its class

    def declared(self, t: SchemaType) -> str:
        return f"Annotated[cbcl.Value, Declared({_type_text(t)!r})]"

    def annotation(self, t: SchemaType, where: str) -> str:
        if isinstance(t, AtomType) and t.pattern is not None:
            return self.declared(t)  # (no record annotation says a pattern yet)
        if isinstance(t, AtomType):
            plain = {"string": "str", "integer": "int", "decimal": "Decimal",
                     "number": "int | Decimal", "symbol": "cbcl.Symbol",
                     "keyword": "cbcl.Keyword", "uri": "cbcl.URI", "boolean": "bool",
                     "any": "Annotated[cbcl.Value, Declared('any')]"}[t.kind]
            extra = []
            if t.low is not None or t.high is not None:
                extra.append(f"cbcl.Range({_number(t.low)}, {_number(t.high)})")
            if t.min_length is not None or t.max_length is not None:
                extra.append(f"cbcl.Length({t.min_length!r}, {t.max_length!r})")
            if t.scheme is not None:
                extra.append(f"Scheme({t.scheme!r})")
            return f"Annotated[{plain}, {', '.join(extra)}]" if extra else plain
        if isinstance(t, OneOf):
            if all(type(v) is Symbol for v in t.values):
                return "Literal[" + ", ".join(repr(str.__str__(v)) for v in t.values) + "]"
            if all(type(v) is int for v in t.values):
                return "Literal[" + ", ".join(repr(v) for v in t.values) + "]"
            return self.declared(t)
        if isinstance(t, ListOf):
            inner = f"tuple[{self.annotation(t.item, where)}, ...]"
            if t.min_length is not None or t.max_length is not None:
                return f"Annotated[{inner}, cbcl.Length({t.min_length!r}, {t.max_length!r})]"
            return inner
        if isinstance(t, Keys) and (t.other is not None or not t.fields):
            return self.declared(t)
        if isinstance(t, Record) and t.keys.other is not None:
            return self.declared(t)
        return self.record_class(t, where, ())

    def record_class(self, t: Record | Keys, where: str, intents: tuple[str, ...]) -> str:
        key = repr(t) + repr(intents)
        found = self.made.get(key)
        if found is not None:
            return found
        if isinstance(t, Record):
            if t.keys.other is not None:
                raise DescriptorError(f"codegen: the record ({' '.join(t.heads)} …) has "
                                      "(else …) keys: no class can say it as a body")
            heads, keys = " ".join(t.heads), t.keys
            name = _class_name(heads, self.names)
        else:
            heads, keys = "", t
            name = _class_name(where + "-keys", self.names)
        self.made[key] = name
        taken: set[str] = set()
        lines: list[str] = []
        for k, child in keys.fields.items():
            text = str.__str__(k)
            field, needs_key = _field_name(text, taken)
            annotation = self.annotation(child, f"{name}-{text}")
            if needs_key:
                annotation = f"Annotated[{annotation}, Key({text!r})]"
            if k in keys.required:
                lines.append(f"    {field}: {annotation}")
            else:
                lines.append(f"    {field}: {annotation} | None = None")
        kwargs = [f"head={heads!r}" if heads else "head=()"]
        if intents:
            kwargs.insert(0, f"intent={' '.join(intents)!r}")
        self.classes.append(f"class {name}(Record, {', '.join(kwargs)}):\n"
                            + ("\n".join(lines) if lines else "    pass") + "\n")
        return name


def _type_text(t: SchemaType) -> str:
    """The schema text of a compiled type."""
    if isinstance(t, AtomType):
        opts = [(k, v) for k, v in (("min", t.low), ("max", t.high),
                                    ("min-length", t.min_length), ("max-length", t.max_length),
                                    ("scheme", None if t.scheme is None else Symbol(t.scheme)),
                                    ("pattern", t.pattern))
                if v is not None]
        if not opts:
            return t.kind
        return f"({t.kind}" + "".join(f" :{k} {canonical_value(v)}" for k, v in opts) + ")"
    if isinstance(t, OneOf):
        return "(one-of " + " ".join(canonical_value(v) for v in t.values) + ")"
    if isinstance(t, ListOf):
        shown = "".join(f" :{k} {v}" for k, v in (("min-length", t.min_length),
                                                 ("max-length", t.max_length)) if v is not None)
        return f"(list-of {_type_text(t.item)}{shown})"
    keys = t.keys if isinstance(t, Record) else t
    parts = [f"(:{str.__str__(k)} {_type_text(c)}{' required' if k in keys.required else ''})"
             for k, c in keys.fields.items()]
    if keys.other is not None:
        parts.append(f"(else {_type_text(keys.other)})")
    head = "record " + " ".join(t.heads) if isinstance(t, Record) else "keys"
    return f"({head}" + "".join(" " + p for p in parts) + ")"


def _rules(grammar: str) -> dict[str, str]:
    rules: dict[str, str] = {}
    name = None
    for line in grammar.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("//"):
            continue
        found = _RULE_LINE.match(stripped)
        if found is not None and not stripped.startswith("|"):
            name = found.group(1)
            rules[name] = found.group(2)
        elif name is not None:
            rules[name] += " " + stripped
    return rules


def _writes_heads(text: str, heads: tuple[Symbol, ...]) -> bool:
    wanted = '"(" ' + " ".join(f'"{h}"' for h in heads)
    return wanted in " ".join(text.split())


def _intents_of(descriptor: ProtocolDescriptor, records: tuple[Record, ...]
                ) -> dict[int, list[str]]:
    """Per record (by index), the intents whose bodies it may be, in the intents' order."""
    rules = _rules(descriptor.grammar)
    found: dict[int, list[str]] = {i: [] for i in range(len(records))}
    for intent, start in descriptor.starts.items():
        reach, work = {start}, [start]
        while work:  # (the rules the start rule reaches; each once)
            for ident in _IDENT.findall(rules.get(work.pop(), "")):
                if ident in rules and ident not in reach:
                    reach.add(ident)
                    work.append(ident)
        if descriptor.grammar.startswith(_DERIVED):  # the start rule's own, or its choice
            body = rules.get(start, "")
            named = [body] if body.lstrip().startswith('"("') else \
                [rules.get(r.strip(), "") for r in body.split("|")]
        else:
            named = [rules[r] for r in reach]
        for i, record in enumerate(records):
            if any(_writes_heads(text, record.heads) for text in named):
                found[i].append(intent.value)
    return found


def _classes_derive(descriptor: ProtocolDescriptor, records: tuple[Record, ...],
                    intents: dict[int, list[str]]) -> bool:
    """Whether the classes' own declaration (their schema records, per intent) derives the
    descriptor's grammar: not where its declaration said more than its schema (an
    ``(ordered …)`` group, an ``(either …)``, spec/declarations.md §1.1), whose grammar
    the module then passes as written."""
    parts = [f"(id {descriptor.id})", f"(version {descriptor.version})"]
    for intent, start in descriptor.starts.items():
        listed = [_type_text(r) for i, r in enumerate(records) if intent.value in intents[i]]
        parts.append(f"(intent {intent.value} (rule {start}) {' '.join(listed)})")
    try:
        declared = read_declaration(f"({DECLARATION_HEAD} {' '.join(parts)})")
    except CBCLError:
        return False
    return declared.grammar == descriptor.grammar


def generate_records(descriptor: bytes) -> str:
    """The Python source of record classes for a descriptor's schema (its exact bytes),
    ``mypy --strict`` clean; with ``RECORDS`` (the body classes, in the schema's order) and
    ``descriptor()``, which builds the descriptor back from them.

    Raises :class:`DescriptorError` for a descriptor without a schema, a body record with
    ``(else …)`` keys, or one that is not valid (as :func:`cbcl.descriptor.read_descriptor`,
    which also raises :class:`MalformedError`/:class:`LimitError`)."""
    parsed = read_descriptor(descriptor)
    if parsed.schema is None:
        raise DescriptorError(f"codegen: the descriptor {parsed.id} has no schema: there are "
                              "no records to write classes for")
    schema = compile_schema(parsed.schema)
    intents = _intents_of(parsed, schema.records)
    writer = _Writer()
    bodies = []
    for i, record in enumerate(schema.records):
        bodies.append(writer.record_class(record, "", tuple(intents[i])))
    starts = {i.value: r for i, r in parsed.starts.items()}
    out = [f'"""Record classes for {parsed.id} version {parsed.version} '
           '(written by cbcl codegen: do not edit)."""', "",
           "from __future__ import annotations", "",
           "from decimal import Decimal",
           "from typing import Annotated, Literal", "",
           "import cbcl",
           "from cbcl.descriptor import Declared, Key, Record, Scheme", "",
           "__all__ = [" + ", ".join(repr(b) for b in bodies) + "]", "",
           f"PROTOCOL_ID = {str(parsed.id)!r}",
           f"VERSION = {parsed.version!r}", ""]
    out += ["", *("\n\n".join(writer.classes).splitlines()), "", ""]
    unused = [b for b, i in zip(bodies, range(len(bodies)), strict=True) if not intents[i]]
    out.append("#: The classes of the bodies, in the schema's order.")
    out.append("RECORDS: tuple[type[Record], ...] = ("
               + "".join(f"{b}, " for b in bodies if b not in unused) + ")")
    conversation = None if parsed.conversation is None else canonical_value(parsed.conversation)
    functions = None if parsed.functions is None else canonical_value(parsed.functions)
    constraints = None if parsed.constraints is None else canonical_value(parsed.constraints)
    derived = parsed.grammar.startswith(_DERIVED) and _classes_derive(
        parsed, schema.records, intents)
    out += ["", "",
            "def descriptor() -> bytes:",
            '    """The descriptor these classes declare (cbcl.descriptor_from)."""',
            "    return cbcl.descriptor_from(*RECORDS, id=PROTOCOL_ID, version=VERSION,",
            f"                                conversation={conversation!r},",
            f"                                functions={functions!r},",
            *([f"                                constraints={constraints!r},"]
              if constraints is not None else []),
            f"                                expires={parsed.expires!r},",
            f"                                rules={starts!r},",
            f"                                grammar={None if derived else parsed.grammar!r})",
            ""]
    return "\n".join(out)
