"""Repair hints: every refusal rendered as a short instruction a model (or a person) can act on.

Theory of operation
-------------------
A refusal already carries where it happened (position and a context snippet) and what was
accepted there (``expected``, in the grammar's terms). What a hint adds is the *shape* the
author should have written: the template of the list the refusal is in, rendered from the
grammar's syntax tree (:mod:`cbcl.grammar._subset`) in the author's own terms — ``(bid :price NUMBER
:currency SYMBOL [:eta INTEGER])`` — and, for a keyword set, which members are missing or
given twice.

The raise sites (pass 2's :func:`cbcl.protocol._pass2.explain_body`, the binary decoder's refusal,
pass 1's envelope refusal) attach a small record (:class:`BodyHint`, :class:`EnvelopeHint`)
to the error's ``hint_material``: a copy of the LR stack and the keyword sets' masks, the
refused token and the heads of the lists around it. Nothing is rendered then: the grammar
is read (and indexed by list head, once per grammar) only when :meth:`CBCLError.hint` is
called, so the hot paths and even the refusal paths pay nothing for it.

Everything in a hint that came from the input (the snippet, the token found) is hostile: each
line of the hint is passed through :func:`cbcl.cli._common.escape_invisible`, so no control,
bidirectional or invisible character reaches the reader raw.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core._display import escape_invisible
from ..core._errors import (
    BodyError,
    CBCLError,
    EnvelopeError,
    LimitError,
    MalformedError,
    UnknownProtocolError,
    install_hint_renderer,
)
from ..core._values import Keyword, Symbol
from ..grammar._kernel import _found
from ..grammar._subset import (
    Alternative,
    GrammarSource,
    Group,
    Item,
    KeywordSet,
    Literal,
    Reference,
    Repeat,
    Rule,
    list_end,
    read_grammar,
    walk_positions,
)

if TYPE_CHECKING:
    from ._descriptor import ProtocolDescriptor
    from ._protocol import Protocol

__all__ = [
    "ENVELOPE_TEMPLATE",
    "UNREAD",
    "BodyHint",
    "EnvelopeHint",
    "TextHint",
    "body_hint",
    "grammar_index",
    "heads_of_lists",
    "render_hint",
]

#: The envelope of spec §2 as a template (one field a line; ``[ ]`` optional).
ENVELOPE_TEMPLATE = """\
(CBCL/1.0
  (message-id STRING)
  (sender URI)
  (receiver URI)
  (intent INTENT)
  (protocol SYMBOL)
  [(conversation-id STRING)]
  [(in-reply-to STRING)]
  [(reply-by INTEGER)]
  [(timestamp INTEGER)]
  [(body VALUE)]
  [(signature STRING STRING)])"""

#: Every CBCL/1.0 intent, for hints about the ``intent`` field.
_INTENTS = ("PROPOSE ACCEPT REJECT INFORM QUERY REQUEST CFP SUBSCRIBE NOTIFY AGREE REFUSE "
            "FAILURE CANCEL CONFIRM NOT-UNDERSTOOD")

#: How many templates (and referenced rules) one hint shows at most.
_MAX_TEMPLATES = 4
_MAX_WHERE = 6


# --------------------------------------------------------------------------- hint material


#: The head of a list not read yet (the refused token would be its first element).
UNREAD: Any = object()


@dataclass(frozen=True, slots=True)
class BodyHint:
    """What a body refusal's hint needs, captured (copied) when the grammar refused."""

    protocol: Protocol
    intent: str | None
    stack: tuple[int, ...]
    marks: tuple[tuple[int, int], ...]
    terminal: str
    value: object
    #: The first element of each list around the refused token, outermost first: a symbol,
    #: or ``None`` (another kind of value, or the refused token itself is that element).
    heads: tuple[object, ...]
    #: Whether the refused token is the first element of its list.
    at_head: bool


@dataclass(frozen=True, slots=True)
class EnvelopeHint:
    """What an envelope refusal's hint needs: how the refused token is named."""

    found: str


@dataclass(frozen=True, slots=True)
class TextHint:
    """A refusal outside any grammar (extraction): the fix, in words, and whether to show
    the envelope's template."""

    fix: str
    envelope: bool = True


def body_hint(protocol: Protocol, stack: Sequence[int], terminal: str, value: object,
              marks: Mapping[int, int] | None, intent: str | None,
              heads: Sequence[object], at_head: bool) -> BodyHint:
    """The :class:`BodyHint` of a refusal (the stack and masks are copied)."""
    shown_heads = tuple(None if head is UNREAD or type(head) is not Symbol else head
                        for head in heads)
    return BodyHint(protocol, intent, tuple(stack),
                    tuple(marks.items()) if marks else (), terminal, value, shown_heads,
                    at_head)


def heads_of_lists(lists: Sequence[Sequence[object]], terminal: str) -> tuple[list[object], bool]:
    """The heads of the open lists ``lists`` (outermost first; the innermost holds the
    refused token already when it is an atom, as the binary decoder keeps them) and
    whether the token is its list's head."""
    heads: list[object] = [items[0] if items else None for items in lists]
    at_head = False
    if terminal not in ("LPAR", "RPAR", "$END") and lists and len(lists[-1]) == 1:
        heads[-1] = None
        at_head = True
    return heads, at_head


# --------------------------------------------------------------------------- templates


@dataclass(frozen=True, slots=True)
class GrammarIndex:
    """A grammar read for hints and prompts: its rules by name, and each list it writes
    with a literal head (``"(" "bid" …``) by that head: the items from the ``(`` on."""

    source: GrammarSource
    rules: Mapping[str, Rule]
    lists: Mapping[str, tuple[tuple[Item, ...], ...]]


def _index_lists(items: tuple[Item, ...], found: dict[str, list[tuple[Item, ...]]]) -> None:
    """Record every ``"(" "head" …`` in ``items`` (and in the sequences inside them), up to
    the ``")"`` that closes it in its sequence (or the sequence's end)."""
    for sequence, index in walk_positions(items):
        item = sequence[index]
        if isinstance(item, Literal) and item.text == "(" and index + 1 < len(sequence):
            head = sequence[index + 1]
            if isinstance(head, Literal) and head.text not in ("(", ")") \
                    and not head.is_keyword:
                end = list_end(sequence, index)
                found.setdefault(head.text, []).append(
                    sequence[index:len(sequence) if end is None else end])


@functools.lru_cache(maxsize=32)
def _index(grammar: str, starts: tuple[str, ...]) -> GrammarIndex:
    source = read_grammar(grammar, starts=starts)
    found: dict[str, list[tuple[Item, ...]]] = {}
    for rule in source.rules:
        for alt in rule.alternatives:
            _index_lists(alt.items, found)
    return GrammarIndex(source, {rule.name: rule for rule in source.rules},
                        {head: tuple(lists) for head, lists in found.items()})


def grammar_index(descriptor: ProtocolDescriptor) -> GrammarIndex:
    """The :class:`GrammarIndex` of a descriptor's grammar (cached per grammar)."""
    return _index(descriptor.grammar, descriptor.start_rules)


_BASE_SHOWN = {"value": "VALUE"}


class _Renderer:
    """Renders items in the author's terms, collecting the rules they reference."""

    def __init__(self) -> None:
        self.references: list[str] = []
        self.keyword_set = False
        #: Keywords written as literals outside any keyword set (their place is fixed) and
        #: the members of keyword sets (any order), for :meth:`order_note`.
        self.fixed_keywords: list[str] = []
        self.set_keywords: list[str] = []

    def order_note(self) -> str:
        """What the template cannot show about order: nothing where every keyword argument
        is a keyword set's (any order, as the prompt and hints say) or there is at most one;
        else which keywords have a fixed place."""
        fixed = self.fixed_keywords
        if not fixed or len(fixed) + len(self.set_keywords) < 2:
            return ""
        if not self.set_keywords:
            return "  (keyword arguments in this order)"
        return f"  ({', '.join(fixed)} in the place shown, the others in any order)"

    def items(self, items: Sequence[Item]) -> str:
        out = ""
        for item in items:
            piece = self.item(item)
            if not piece:
                continue
            if out and not out.endswith("(") and piece != ")":
                out += " "
            out += piece
        return out

    def alternatives(self, alternatives: Sequence[Alternative]) -> str:
        return " | ".join(self.items(alt.items) or "nothing" for alt in alternatives)

    def item(self, item: Item) -> str:
        if isinstance(item, Literal):
            if item.text.startswith(":") and item.text not in self.fixed_keywords:
                self.fixed_keywords.append(item.text)
            return item.text
        if isinstance(item, Reference):
            if item.is_base:
                return _BASE_SHOWN.get(item.name, item.name)
            if item.name not in self.references:
                self.references.append(item.name)
            return f"<{item.name}>"
        if isinstance(item, KeywordSet):
            self.keyword_set = True
            self.set_keywords.extend(m.keyword for m in item.members
                                     if m.keyword not in self.set_keywords)
            return " ".join(f"[{member.keyword} {self.item(member.item)}]" if member.optional
                            else f"{member.keyword} {self.item(member.item)}"
                            for member in item.members)
        if isinstance(item, Repeat):
            if item.op == "?":
                return f"[{self.item(item.item)}]"
            inner = item.item
            if isinstance(inner, Group) and not inner.optional and (
                    len(inner.alternatives) > 1 or len(inner.alternatives[0].items) > 1):
                return "{" + self.alternatives(inner.alternatives) + "}" + item.op
            return self.item(inner) + item.op
        if item.optional:
            return f"[{self.alternatives(item.alternatives)}]"
        if len(item.alternatives) == 1:
            return self.items(item.alternatives[0].items)
        return "{" + self.alternatives(item.alternatives) + "}"


def render_items(items: Sequence[Item]) -> tuple[str, list[str], bool]:
    """``items`` as a template, the rules it references, and whether it has a keyword set."""
    renderer = _Renderer()
    text = renderer.items(items) + renderer.order_note()
    return text, renderer.references, renderer.keyword_set


def render_rule(index: GrammarIndex, name: str) -> tuple[str, list[str], bool]:
    """Rule ``name``'s alternatives as a template (``a | b``), as :func:`render_items`."""
    renderer = _Renderer()
    text = renderer.alternatives(index.rules[name].alternatives) + renderer.order_note()
    return text, renderer.references, renderer.keyword_set


def list_templates(index: GrammarIndex, head: str) -> list[tuple[str, list[str], bool]]:
    """Each form of the list with head ``head`` the grammar writes."""
    return [render_items(items) for items in index.lists.get(head, ())][:_MAX_TEMPLATES]


def start_templates(index: GrammarIndex, rule: str) -> list[tuple[str, list[str], bool]]:
    """The forms a body from start rule ``rule`` takes: its alternatives, each a single
    rule reference replaced by that rule's own alternatives (once)."""
    out: list[tuple[str, list[str], bool]] = []
    for alt in index.rules[rule].alternatives:
        if len(alt.items) == 1 and isinstance(alt.items[0], Reference) \
                and not alt.items[0].is_base:
            for inner in index.rules[alt.items[0].name].alternatives:
                out.append(render_items(inner.items))
        else:
            out.append(render_items(alt.items))
    return out


def where_lines(index: GrammarIndex, references: Sequence[str], limit: int = _MAX_WHERE,
                ) -> list[str]:
    """``<rule> is: …`` for each referenced rule (and the rules those reference, breadth
    first, up to ``limit``)."""
    lines: list[str] = []
    queue = list(references)
    seen: set[str] = set()
    while queue and len(lines) < limit:
        name = queue.pop(0)
        if name in seen or name not in index.rules:
            continue
        seen.add(name)
        text, more, _ = render_rule(index, name)
        lines.append(f"<{name}> is: {text}")
        queue.extend(more)
    return lines


# --------------------------------------------------------------------------- rendering


def _escaped(text: str) -> str:

    return "\n".join(escape_invisible(line) for line in text.split("\n"))


def _header(error: CBCLError, what: str) -> list[str]:
    lines = []
    where = f" at line {error.line}, column {error.column}" if error.line else (
        f" at byte {error.offset}" if error.position is not None else "")
    lines.append(f"The {what} was refused{where}: {error.message}")
    if error.context:
        lines.append("Here:")
        lines.extend("    " + line for line in error.context.split("\n"))
    return lines


def render_hint(error: CBCLError) -> str:
    """The hint of ``error`` (see :meth:`CBCLError.hint`)."""
    material = getattr(error, "hint_material", None)
    if isinstance(error, BodyError):
        lines = _body_lines(error, material if isinstance(material, BodyHint) else None)
    elif isinstance(material, TextHint):
        lines = [*_header(error, "input"), material.fix]
        if material.envelope:
            lines += ["A CBCL message has this form ([ ] marks optional fields, in this "
                      "order):", ENVELOPE_TEMPLATE]
    elif isinstance(error, EnvelopeError):
        lines = _envelope_lines(error, material if isinstance(material, EnvelopeHint)
                                else None)
    elif isinstance(error, MalformedError):
        lines = _malformed_lines(error)
    elif isinstance(error, LimitError):
        lines = [*_header(error, "message"), f"It exceeds the limit {error.limit} "
                 f"({error.maximum}): make the message smaller."]
    elif isinstance(error, UnknownProtocolError):
        lines = [*_header(error, "message"), f"The receiver has no descriptor for "
                 f"{error.protocol}: use a protocol it knows, or offer it the descriptor "
                 "first."]
    else:
        lines = [error.one_line()]
    return _escaped("\n".join(lines))


def _malformed_lines(error: MalformedError) -> list[str]:
    lines = _header(error, "text")
    if "unclosed list" in error.message:
        count = error.message.split(" ", 1)[0]
        lines.append(f"The message is incomplete: it ends with {count} list(s) still open. "
                     "Write the whole message, every ( closed by its ).")
    elif "after the end of the document" in error.message:
        lines.append("Send exactly one message: nothing but whitespace and comments may "
                     "follow its closing ).")
    else:
        lines.append("Fix the text at that point. CBCL text: lists in ( ), strings in "
                     'double quotes (escapes \\" \\\\ \\n \\r \\t \\uXXXX only), keywords as '
                     ":name, symbols as name, URIs as scheme://rest.")
    return lines


def _envelope_lines(error: EnvelopeError, material: EnvelopeHint | None) -> list[str]:
    lines = _header(error, "envelope")
    if material is not None:
        lines.append(f"Found: {material.found}.")
    if error.expected:
        lines.append(f"Accepted there: {' or '.join(error.expected)}.")
    fields = [item[1:-2].strip() for item in error.expected if item.endswith(" …)")]
    written = material.found.split(" ", 1)[-1] if material is not None else ""
    close = difflib.get_close_matches(written.lower(), fields, n=1, cutoff=0.5)
    if "unknown intent" in error.message:
        lines.append(f"Write one of the intents: {_INTENTS}.")
    elif "version" in error.message or "CBCL/1.0" in error.expected:
        lines.append("Start the message with (CBCL/1.0, exactly.")
    elif close and material is not None and material.found.startswith("symbol "):
        lines.append(f"Write ({close[0]} …), not ({written} …): field names are spelt "
                     "exactly as in the form below.")
    elif "must not be empty" in error.message:
        lines.append("Give the identifier a non-empty string.")
    else:
        lines.append("Write the envelope's fields in parentheses, in this order, each once.")
    lines += ["A CBCL message has this form ([ ] marks optional fields):", ENVELOPE_TEMPLATE]
    return lines


def _literal_texts(expected: Sequence[str]) -> list[str]:
    return [item[1:-1] for item in expected
            if len(item) > 2 and item.startswith('"') and item.endswith('"')]


def _body_lines(error: BodyError, material: BodyHint | None) -> list[str]:
    lines = _header(error, "body")
    if material is None:
        return lines

    protocol = material.protocol
    try:
        index = grammar_index(protocol.descriptor)
    except CBCLError:  # pragma: no cover - a loaded protocol's grammar reads
        return lines
    if material.stack:
        lines.append(f"Found: {_found(protocol.shown, material.terminal, material.value)}.")
    if error.expected:
        lines.append(f"Accepted there: {' or '.join(error.expected)}.")
    literals = _literal_texts(error.expected)
    lines.extend(_fix_lines(material, literals, index))
    # The template: of the list whose head was expected, of the enclosing list, or of the
    # intent's body.
    templates: list[tuple[str, list[str], bool]] = []
    title = ""
    if material.at_head:
        for text in literals:
            if text in index.lists:
                templates.extend(list_templates(index, text))
        title = "The list is written" if len(templates) == 1 else "The list is one of"
    if not templates:
        for enclosing in reversed(material.heads):
            if enclosing is not None and str(enclosing) in index.lists:
                templates = list_templates(index, str(enclosing))
                title = f"The ({enclosing} …) list is written"
                break
    if not templates:
        rule = _start_rule(protocol, material.intent)
        if rule is not None:
            templates = start_templates(index, rule)[:_MAX_TEMPLATES]
            what = f"The body of {material.intent} messages" \
                if material.intent and protocol.per_intent else "A body"
            title = f"{what} is written" if len(templates) == 1 else f"{what} is one of"
    if templates:
        lines.append(f"{title}:")
        references: list[str] = []
        keyword_set = False
        for text, refs, has_set in templates:
            lines.append(f"    {text}")
            references.extend(r for r in refs if r not in references)
            keyword_set = keyword_set or has_set
        if keyword_set:
            lines.append("Keyword arguments come in any order, each at most once, unless the "
                         "form says which have a fixed place; those in "
                         "[ ] are optional.")
        shown = {text for text, _, _ in templates}
        lines.extend("  " + line for line in where_lines(index, references)
                     if line.split(" is: ", 1)[1] not in shown)
    return lines


def _start_rule(protocol: Protocol, intent: str | None) -> str | None:
    starts = {i.value: rule for i, rule in protocol.descriptor.starts.items()}
    if intent is not None and intent in starts:
        return starts[intent]
    return "body" if "body" in starts.values() else next(iter(starts.values()), None)


def _fix_lines(material: BodyHint, literals: list[str], index: GrammarIndex) -> list[str]:
    """The sentence that names the fix, for the refusals it can be named for."""
    protocol = material.protocol
    tables = protocol.tables
    stack = list(material.stack)
    marks = dict(material.marks)
    spec = tables.keyword_sets.get(stack[-1]) if stack else None
    terminal, value = material.terminal, material.value
    enclosing = next((h for h in reversed(material.heads) if h is not None), None)
    where = f" to the ({enclosing} …) list" if enclosing is not None else ""
    if spec is not None:
        seen = marks.get(len(stack) - 1, 0)
        bit = spec.bits.get(terminal)
        if bit is not None and seen & bit:
            keyword = protocol.shown[terminal].strip('"')
            return [f"Remove the second {keyword}: each keyword is given at most once."]
        missing = spec.missing(seen)
        if missing and bit is None and type(value) is not Keyword:
            listed = " and ".join(missing)
            return [f"Add the missing {listed} (each with its value){where}."]
    if type(value) is Keyword or type(value) is Symbol:
        written = (":" if type(value) is Keyword else "") + str(value)
        candidates = [text for text in literals if text.startswith(":") == written.startswith(":")]
        same_case = [text for text in candidates if text.lower() == written.lower()]
        if same_case:
            return [f"Write {same_case[0]}, not {written}: names are case-sensitive."]
        close = difflib.get_close_matches(written, candidates, n=1, cutoff=0.6) or [
            text for text in candidates
            if len(written) > 2 and (text.startswith(written) or written.startswith(text))][:1]
        if close:
            return [f"Write {close[0]}, not {written}: {written} is not a name this grammar "
                    "accepts here."]
        if material.at_head and type(value) is Symbol and protocol.per_intent:
            owner = _intent_of_head(protocol, index, str(value))
            if owner is not None and owner != material.intent:
                return [f"({written} …) is the body of {owner} messages, not of "
                        f"{material.intent} messages: use the {material.intent} form below, "
                        f"or send a {owner} message."]
        if candidates:
            if enclosing is not None and any(
                    f" {written} " in f"{text} " for text, _, _ in
                    list_templates(index, str(enclosing))):
                return [f"Write {' or '.join(candidates)} here: the ({enclosing} …) list "
                        "takes its keywords in the order of its template below."]
            return [f"Write {' or '.join(candidates)} here: {written} is not accepted "
                    "there."]
    if terminal == "RPAR" and literals:
        return [f"The list ends too early: it still needs {' or '.join(literals)}."]
    return []


def _intent_of_head(protocol: Protocol, index: GrammarIndex, head: str) -> str | None:
    """The governed intent whose start rule writes a body with list head ``head``."""
    for intent, rule in protocol.descriptor.starts.items():
        for text, _, _ in start_templates(index, rule):
            if text.startswith(f"({head} ") or text == f"({head})":
                return intent.value
    return None


install_hint_renderer(render_hint)
