"""Protocol descriptors (draft §3): the document that teaches an agent a protocol.

A descriptor is read with the same guarded reader as messages, then its structure is
checked field by field, in the draft's order. Its identity is its digest: ``sha256:`` and
the hex SHA-256 of the exact bytes, so two descriptors with the same text but different
bytes (a comment, a space) are different descriptors.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import TypeVar

from ..core._canonical import canonical_value
from ..core._errors import DescriptorError
from ..core._limits import DEFAULT_LIMITS, Limits
from ..core._reader import read
from ..core._values import INT64_MAX, Symbol, Value
from ..grammar._subset import rule_name_problem
from ._constraints import read_constraints
from ._conversation import compile_machine
from ._evaluator import read_functions
from ._message import Intent
from ._schema import compile_schema

# The fields of a descriptor, in order, and whether each is required.
_FIELDS: tuple[tuple[str, bool], ...] = (
    ("id", True), ("version", True), ("expires", False), ("intents", True),
    ("grammar", True), ("schema", False), ("conversation", False), ("functions", False),
    ("constraints", False),
)
_T = TypeVar("_T")
_FIELD_ORDER = {name: index for index, (name, _) in enumerate(_FIELDS)}
#: The start rule of an intent listed without one.
BODY_RULE = "body"
_RULE_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")


def digest_of(payload: bytes) -> str:
    """The digest that names a descriptor: ``sha256:`` + lowercase hex."""
    return "sha256:" + hashlib.sha256(payload).hexdigest()


@dataclass(frozen=True, slots=True)
class ProtocolDescriptor:
    """A protocol descriptor as read (nothing about it is trusted yet).

    ``schema``, ``conversation``, ``functions`` and ``constraints`` hold their sections
    as read (the ``(schema …)`` list itself), or ``None``. ``intent_rules`` holds the intents listed
    with a start rule (``(ACCEPT award)``), in order; every other intent's body starts at
    ``body``.
    """

    id: Symbol
    version: int
    expires: int | None
    intents: tuple[Intent, ...]
    grammar: str
    schema: Value | None
    conversation: Value | None
    functions: Value | None
    digest: str
    intent_rules: tuple[tuple[Intent, str], ...] = ()
    constraints: Value | None = None

    def governs(self, intent: Intent) -> bool:
        """Whether messages with ``intent`` have their body judged by this grammar."""
        return intent in self.intents

    @property
    def starts(self) -> dict[Intent, str]:
        """Every governed intent -> the rule its body is recognised from."""
        explicit = dict(self.intent_rules)
        return {intent: explicit.get(intent, BODY_RULE) for intent in self.intents}

    @property
    def start_rules(self) -> tuple[str, ...]:
        """The distinct start rules, in the order the intents first name them."""
        return tuple(dict.fromkeys(self.starts.values()))


def _bad(message: str) -> DescriptorError:
    return DescriptorError(f"descriptor: {message}")


def read_descriptor(payload: bytes, *, limits: Limits | None = None) -> ProtocolDescriptor:
    """Read a ``(protocol-descriptor …)`` document from its exact bytes.

    Raises :class:`MalformedError`/:class:`LimitError` for text the reader refuses, and
    :class:`DescriptorError` for a document that is not a valid descriptor (wrong head,
    fields missing, repeated, out of order or of the wrong type).
    """
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise TypeError(f"a descriptor is bytes, not {type(payload).__name__}")
    payload = bytes(payload)
    value = read(payload, limits=DEFAULT_LIMITS if limits is None else limits)
    if type(value) is not tuple or not value or value[0] != Symbol("protocol-descriptor"):
        raise _bad("expected a (protocol-descriptor …) document")
    sections: dict[str, tuple[Value, ...]] = {}
    last = -1
    for field in value[1:]:
        if type(field) is not tuple or not field or type(field[0]) is not Symbol:
            raise _bad(f"expected a (name …) field, found {_show(field)}")
        name = str(field[0])
        order = _FIELD_ORDER.get(name)
        if order is None:
            raise _bad(f"unknown field ({name} …)")
        if name in sections:
            raise _bad(f"field ({name} …) is repeated")
        if order < last:
            raise _bad(f"field ({name} …) is out of order: the order is "
                       + " ".join(n for n, _ in _FIELDS))
        last = order
        sections[name] = field[1:]
    for name, required in _FIELDS:
        if required and name not in sections:
            raise _bad(f"missing field ({name} …)")

    ident = _single(sections, "id", Symbol, "a symbol")
    version = _single(sections, "version", int, "an integer")
    if not 0 <= version <= INT64_MAX:
        raise _bad("(version …) must not be negative")
    expires = _single(sections, "expires", int, "an integer") if "expires" in sections \
        else None
    intents: list[Intent] = []
    rules: list[tuple[Intent, str]] = []
    for entry in sections["intents"]:
        item: Value = entry
        rule = None
        if isinstance(entry, tuple) and len(entry) == 2 and type(entry[1]) is Symbol:
            item, rule = entry[0], str(entry[1])
            if _RULE_NAME.match(rule) is None or rule_name_problem(rule) is not None:
                raise _bad(f"(intents …) names the start rule {_show(Symbol(rule))}, which "
                           "is not a rule name ([a-z][a-z0-9_]*, not a base name)")
        try:
            intent = Intent(str(item)) if type(item) is Symbol else None
        except ValueError:
            intent = None
        if intent is None:
            raise _bad(f"(intents …) holds {_show(item)}, which is not an intent or "
                       "(INTENT rule)")
        if intent in intents:
            raise _bad(f"(intents …) lists {intent.value} twice")
        intents.append(intent)
        if rule is not None and rule != BODY_RULE:
            rules.append((intent, rule))
    if not intents:
        raise _bad("(intents …) must list at least one intent")
    grammar = _single(sections, "grammar", str, "a string")
    _check_sections(sections, tuple(intents))
    return ProtocolDescriptor(
        id=ident, version=version, expires=expires, intents=tuple(intents), grammar=grammar,
        schema=_section(sections, "schema"), conversation=_section(sections, "conversation"),
        functions=_section(sections, "functions"), digest=digest_of(payload),
        intent_rules=tuple(rules), constraints=_section(sections, "constraints"),
    )


def _check_sections(sections: dict[str, tuple[Value, ...]], intents: tuple[Intent, ...]) -> None:
    """Validate the schema, conversation, functions and constraints sections
    (spec/conversations.md); each raises :class:`DescriptorError` for a malformed
    section, and a rule that calls a function the functions section does not list."""

    if "schema" in sections:
        compile_schema(_section_of(sections, "schema"))
    if "conversation" in sections:
        compile_machine(_section_of(sections, "conversation"), intents=intents)
    if "functions" in sections:
        read_functions(_section_of(sections, "functions"))
    if "constraints" in sections:
        read_constraints(_section_of(sections, "constraints"), intents=intents,
                         functions=_section(sections, "functions"),
                         conversation="conversation" in sections)


def _single(sections: dict[str, tuple[Value, ...]], name: str, kind: type[_T],
            what: str) -> _T:
    items = sections[name]
    if len(items) != 1 or type(items[0]) is not kind:
        raise _bad(f"({name} …) must hold exactly one value, {what}")
    return items[0]


def _section_of(sections: dict[str, tuple[Value, ...]], name: str) -> tuple[Value, ...]:
    """The section ``name``, which ``sections`` holds, as read: ``(name …)``."""
    return (Symbol(name), *sections[name])


def _section(sections: dict[str, tuple[Value, ...]], name: str) -> Value | None:
    if name not in sections:
        return None
    return _section_of(sections, name)


def _show(value: Value) -> str:

    try:
        text = canonical_value(value)
    except (TypeError, ValueError):  # pragma: no cover - read values always print
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."

