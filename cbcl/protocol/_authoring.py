"""Authoring descriptors: build one from readable parts, and write one back as text.

A descriptor carries its grammar as one escaped STRING; authors keep it as a ``.lark``
file and the other sections as CBCL files. :func:`build_descriptor` puts them together in
one fixed layout (the one the shipped descriptors use), checks every part as a loading
registry would, and reads the result back, so a build never produces a descriptor the
library would refuse. :func:`render_descriptor` writes a :class:`ProtocolDescriptor` in the
same layout, so ``read_descriptor(render_descriptor(d))`` is ``d`` again::

    ; optional comment lines
    (protocol-descriptor
      (id ID)
      (version N)
      (expires MS)                       ; only when given
      (intents INTENT …)
      (grammar "…")
      (schema …)                         ; each section present, canonical, on one line
      (conversation …)
      (functions …))
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TypeAlias

from ..core._canonical import canonical_value, quote
from ..core._errors import DescriptorError, GrammarError
from ..core._limits import DEFAULT_LIMITS, Limits
from ..core._reader import read
from ..core._values import INT64_MAX, Symbol, Value, is_name
from ..grammar._subset import GrammarLimits, rule_name_problem
from ._agreement import check_schema_against_grammar
from ._conversation import compile_machine
from ._descriptor import BODY_RULE, ProtocolDescriptor, read_descriptor
from ._evaluator import read_functions
from ._message import Intent
from ._registry import Registry
from ._schema import compile_schema

#: The optional sections, in the descriptor's field order.
SECTIONS = ("schema", "conversation", "functions", "constraints")

#: A section as given to :func:`build_descriptor`: the text of a section file (``str`` or
#: UTF-8 ``bytes``, comments allowed), or its value (a tuple or list headed by the name).
Section: TypeAlias = "str | bytes | Value"

# What a comment line may not hold: CR (it would end the comment), the other forbidden
# characters of spec §1 but HT, and U+2028, U+2029, U+FEFF.
_NOT_IN_COMMENT = re.compile(
    "[\x00-\x08\x0a-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029\ufeff]")


def _bad(message: str) -> DescriptorError:
    return DescriptorError(f"descriptor: {message}")


def protocol_id(value: object) -> Symbol:
    """``value`` as a protocol id. Raises ``TypeError`` for a non-string and
    :class:`DescriptorError` for a string that is not a symbol."""
    if not isinstance(value, str):
        raise TypeError(f"a protocol id is a str, not {type(value).__name__}")
    if not is_name(value):
        raise _bad(f"{value!r} is not a protocol id (a symbol such as auction/v1)")
    return value if type(value) is Symbol else Symbol(value)


_RULE_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")

def intents_of(intents: str | Iterable[str]) -> tuple[Intent, ...]:
    """The intents named by ``intents`` (see :func:`intent_entries`), without their start
    rules. Raises as :func:`intent_entries`."""
    return tuple(intent for intent, _ in intent_entries(intents))


def intent_entries(intents: str | Iterable[str]) -> tuple[tuple[Intent, str], ...]:
    """The intents named by ``intents``, each with its start rule: an iterable of names
    (or :class:`Intent`), or one string of names separated by spaces; a name may carry its
    start rule as ``NAME=rule`` (``ACCEPT=award``), else the rule is ``body``. Raises
    ``TypeError`` for a name that is not a string, and :class:`DescriptorError` for an
    unknown intent, one listed twice, a start rule that is not a rule name, or none."""
    names = intents.split() if isinstance(intents, str) else list(intents)
    result: list[tuple[Intent, str]] = []
    for entry in names:
        if not isinstance(entry, str):
            raise TypeError(f"an intent is a str, not {type(entry).__name__}")
        name, _, rule = str(entry.value if isinstance(entry, Intent) else entry).partition("=")
        rule = rule or BODY_RULE
        try:
            intent = Intent(name)
        except ValueError:
            raise _bad(f"unknown intent {name!r} (known: "
                       + " ".join(i.value for i in Intent) + ")") from None
        if any(intent == seen for seen, _ in result):
            raise _bad(f"intent {intent.value} is listed twice")
        if _RULE_NAME.match(rule) is None or rule_name_problem(rule) is not None:
            raise _bad(f"{rule!r} is not a rule name ([a-z][a-z0-9_]*) for {intent.value}")
        result.append((intent, rule))
    if not result:
        raise _bad("a descriptor lists at least one intent")
    return tuple(result)


def check_grammar(text: str, limits: GrammarLimits | None = None, *,
                  starts: tuple[str, ...] = (BODY_RULE,)) -> None:
    """Check ``text`` with the start rules ``starts`` as a loading registry does: in the
    subset, within ``limits``, LALR(1), its tables within the default size. The compiled
    tables are kept in this process's cache, so loading the descriptor afterwards does not
    compile it again.

    Raises ``TypeError`` for a non-string, :class:`GrammarError` for a refused grammar (for
    one that is not LALR(1), ``context`` holds the checker's report) and
    :class:`LimitError` as the registry does."""

    if not isinstance(text, str):
        raise TypeError(f"a grammar is a str, not {type(text).__name__}")
    registry = Registry(disk_cache=False, isolate=False, grammar_limits=limits)
    try:
        registry.compiled(text, starts=starts)
    except GrammarError as exc:
        first, _, report = exc.message.partition("\n")
        if not report:
            raise
        raise GrammarError(f"{first} (`cbcl grammar check` shows the report)",
                           verdict=exc.verdict, position=exc.position,
                           context=report.rstrip("\n")) from None


def section_value(name: str, source: Section, *, intents: Iterable[Intent] = (),
                  limits: Limits | None = None) -> Value:
    """The value of the ``name`` section (``schema``, ``conversation`` or ``functions``)
    given as ``source`` (see :data:`Section`), checked as :func:`read_descriptor` checks it;
    a conversation against ``intents``.

    Raises ``ValueError`` for an unknown section name, ``TypeError`` for a source of another
    type or holding a non-CBCL value, :class:`MalformedError`/:class:`LimitError` for text
    the reader refuses, and :class:`DescriptorError` for a section that is not a valid
    ``(name …)`` section."""

    if name not in SECTIONS:
        raise ValueError(f"unknown section {name!r} (known: {', '.join(SECTIONS)})")
    limits = DEFAULT_LIMITS if limits is None else limits
    if isinstance(source, (bytes, bytearray, memoryview)):
        value = read(bytes(source), limits=limits)
    elif type(source) is str:  # text (a section is never a STRING value)
        value = read(source.encode("utf-8"), limits=limits)
    elif isinstance(source, (tuple, list)):
        value = read(canonical_value(source).encode("utf-8"), limits=limits)  # lists -> tuples
    else:
        raise TypeError(f"a {name} section is text, bytes or a (list) value, "
                        f"not {type(source).__name__}")
    if type(value) is not tuple or not value or value[0] != Symbol(name):
        shown = canonical_value(value)
        raise _bad(f"expected a ({name} …) section, found "
                   + (shown if len(shown) <= 40 else shown[:37] + "..."))
    if name == "schema":
        compile_schema(value)
    elif name == "conversation":
        compile_machine(value, intents=tuple(intents))
    elif name == "functions":
        read_functions(value)
    # (constraints: checked with the descriptor they are in, against its intents and its
    # functions, when build_descriptor reads it back)
    return value


def comment_lines(comment: str | None) -> str:
    """``comment`` as ``; `` lines (an empty line as ``;``). Raises ``TypeError`` for a
    non-string and ``ValueError`` for a character a comment may not hold."""
    if comment is None:
        return ""
    if not isinstance(comment, str):
        raise TypeError(f"a comment is a str, not {type(comment).__name__}")
    lines = comment.removesuffix("\n").split("\n")
    for line in lines:
        bad = _NOT_IN_COMMENT.search(line)
        if bad is not None:
            raise ValueError(f"a comment may not hold U+{ord(bad.group()):04X}")
        try:
            line.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("a comment may not hold a lone surrogate") from None
    return "".join(f"; {line}\n" if line else ";\n" for line in lines)


def _layout(ident: str, version: int, expires: int | None,
            intents: Iterable[tuple[Intent, str]], grammar: str, sections: Iterable[Value],
            comment: str | None) -> bytes:
    """The descriptor's text in the authoring layout (the module docstring)."""
    listed = " ".join(intent.value if rule == BODY_RULE else f"({intent.value} {rule})"
                      for intent, rule in intents)
    return (
        f"{comment_lines(comment)}"
        f"(protocol-descriptor\n"
        f"  (id {ident})\n"
        f"  (version {version})\n"
        + (f"  (expires {expires})\n" if expires is not None else "")
        + f"  (intents {listed})\n"
        f"  (grammar {quote(grammar)})"
        + "".join(f"\n  {canonical_value(section)}" for section in sections)
        + ")\n"
    ).encode("utf-8")


def _integer(name: str, value: object) -> int:
    if type(value) is not int:
        raise TypeError(f"{name} is an int, not {type(value).__name__}")
    if not 0 <= value <= INT64_MAX:
        raise _bad(f"{name} must be from 0 to {INT64_MAX}, not {value}")
    return value


def build_descriptor(id: str, version: int, intents: str | Iterable[str], grammar: str, *,
                     schema: Section | None = None, conversation: Section | None = None,
                     functions: Section | None = None, constraints: Section | None = None,
                     expires: int | None = None, comment: str | None = None,
                     limits: Limits | None = None,
                     grammar_limits: GrammarLimits | None = None) -> bytes:
    """The bytes of a ``(protocol-descriptor …)`` with these fields, in the layout of
    :func:`render_descriptor` (``comment``: lines written first as ``;`` comments).

    ``id`` is a symbol such as ``auction/v1``; ``version`` and ``expires`` (Unix ms) are
    integers from 0 to 2^63 − 1; ``intents`` lists the governed intents (names, or one
    string of names); ``grammar`` is the body grammar's text (spec §4); each section is its
    file's text or its value (:data:`Section`). The grammar is checked and compiled as a
    loading registry does it (``grammar_limits``), each section as the reader of
    descriptors does, and the result is read back under ``limits``.

    Raises ``TypeError`` for an argument of the wrong type, ``ValueError`` for a comment
    that cannot be one; :class:`DescriptorError` for a bad id, version, expiry or intent
    list, or a section that is not valid; :class:`GrammarError` for a grammar that would
    be refused; :class:`MalformedError`/:class:`LimitError` for section text the reader
    refuses or a descriptor over ``limits``. The schema must agree with the grammar
    (:func:`cbcl.descriptor.check_schema_against_grammar`): a record field the grammar
    cannot write, or a type it contradicts, is a :class:`DescriptorError` naming both."""
    ident = protocol_id(id)
    version = _integer("version", version)
    expires = None if expires is None else _integer("expires", expires)
    entries = intent_entries(intents)
    governed = tuple(intent for intent, _ in entries)
    check_grammar(grammar, grammar_limits, starts=tuple(dict.fromkeys(r for _, r in entries)))
    sections = [section_value(name, source, intents=governed, limits=limits)
                for name, source in zip(SECTIONS, (schema, conversation, functions,
                                                   constraints),
                                        strict=True) if source is not None]
    if schema is not None:
        check_schema_against_grammar(grammar, sections[0], grammar_limits=grammar_limits,
                                     starts=tuple(dict.fromkeys(r for _, r in entries)))
    payload = _layout(ident, version, expires, entries, grammar, sections, comment)
    built = read_descriptor(payload, limits=limits)
    wanted = (ident, version, expires, entries, grammar,
              [canonical_value(section) for section in sections])
    got = (built.id, built.version, built.expires, tuple(built.starts.items()), built.grammar,
           [canonical_value(section) for section in
            (built.schema, built.conversation, built.functions, built.constraints)
            if section is not None])
    if got != wanted:  # pragma: no cover - the layout cannot mean anything else
        raise _bad("the built text does not read back as built")
    return payload


def render_descriptor(descriptor: ProtocolDescriptor, *, comment: str | None = None) -> bytes:
    """``descriptor`` written as text in the layout of :func:`build_descriptor`, after the
    lines of ``comment``. ``read_descriptor`` of the result has the same fields, and the
    same digest exactly when ``descriptor`` was read from text in this layout (so a file
    :func:`build_descriptor` wrote comes back byte for byte, given its comment).

    Raises ``TypeError`` for something that is not a :class:`ProtocolDescriptor` or a
    comment that is not a string, and ``ValueError`` for a comment that cannot be one or a
    field with a value out of CBCL's range."""
    if not isinstance(descriptor, ProtocolDescriptor):
        raise TypeError(f"render_descriptor takes a ProtocolDescriptor, not "
                        f"{type(descriptor).__name__}")
    sections = [section for section in (descriptor.schema, descriptor.conversation,
                                         descriptor.functions, descriptor.constraints)
                if section is not None]
    return _layout(descriptor.id, descriptor.version, descriptor.expires,
                   tuple(descriptor.starts.items()), descriptor.grammar, sections, comment)
