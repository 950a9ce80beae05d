"""Prompts: a system-prompt section that teaches a model to speak one protocol.

:func:`render_prompt` writes, for a loaded protocol, the envelope's template, the rules of
CBCL text a model gets wrong most (quotes, numbers, keywords, case), each governed intent's
body shape rendered from the grammar's syntax tree (the renderer of :mod:`cbcl.protocol._hints`:
``(bid :price NUMBER :currency SYMBOL [:eta INTEGER])``, keyword sets as "in any order"),
and valid example messages. What the schema says beyond the grammar is shown too, so a
model that follows the prompt is not refused for a value: a symbol field whose schema
lists its values shows them in the body's form (``:currency {EUR | USD}``), and a "Field
values" list gives each field's ranges, lengths and ``one-of`` values
(:func:`field_lines`). When the protocol has a conversation machine the envelope's
``conversation-id`` is marked required and the machine's moves are listed. Every example is
generated from the grammar (:func:`example_bodies`, deterministic for a seed: the
generator of :mod:`cbcl.llm._generate` with readable values and keyword sets in the
author's order), its values then fitted to the schema (:func:`fit_to_schema`: a value in
the field's range, of its length, one of its ``one-of`` values), it carries a
conversation-id where the machine requires one, and it is kept only when
:func:`cbcl.parse` accepts the whole message with the protocol loaded — both passes and
the schema — so a prompt never teaches a message the receiver would refuse.

The work is bounded by :class:`~cbcl.core._limits.LLMLimits`: the drafts the examples take
in all (``max_example_drafts``), the tokens drawn for them (``max_draw_tokens``, and
``max_draft_tokens`` for one), and the size of the text (``max_output_bytes``); past one,
:class:`LimitError`.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from decimal import Decimal

from ..core._canonical import canonical_value
from ..core._errors import CBCLError, DescriptorError
from ..core._limits import DEFAULT_LLM_LIMITS, LLMLimits
from ..core._values import URI, Keyword, Symbol, Value, is_name
from ..protocol._api import parse
from ..protocol._hints import (
    ENVELOPE_TEMPLATE,
    grammar_index,
    start_templates,
    where_lines,
)
from ..protocol._message import Intent
from ..protocol._patterns import compile_pattern, describe_pattern, pattern_witness
from ..protocol._protocol import Protocol
from ..protocol._registry import Registry
from ..protocol._schema import (
    AtomType,
    Keys,
    ListOf,
    OneOf,
    Record,
    Schema,
    SchemaType,
    _atom_problem,
)
from ._generate import Tally, draw_bodies

__all__ = ["example_bodies", "example_message", "field_lines", "fit_to_schema",
           "render_prompt"]

#: Attempts per example before giving up on an intent (a schema may refuse most drafts).
_ATTEMPTS = 400
#: The lists an example body nests, at most (beyond it, every choice is the shortest).
_EXAMPLE_DEPTH = 3


def _schema_atoms(schema: Value | None, limit: int = 256) -> tuple[list[Symbol], list[Keyword]]:
    """The symbols a schema's ``(one-of …)`` lists allow and the keywords it names: the
    values a generated body is likelier to satisfy it with."""
    symbols: list[Symbol] = []
    keywords: list[Keyword] = []
    stack: list[Value] = [] if schema is None else [schema]
    while stack and len(symbols) + len(keywords) < limit:
        item = stack.pop()
        if type(item) is tuple:
            if item and type(item[0]) is Symbol and str(item[0]) == "one-of":
                symbols.extend(x for x in item[1:] if type(x) is Symbol and x not in symbols)
            stack.extend(reversed(item))
        elif type(item) is Keyword and item not in keywords:
            keywords.append(item)
    return symbols, keywords


def _pools(protocol: Protocol) -> dict[str, list[Value]]:
    symbols, keywords = _schema_atoms(protocol.descriptor.schema)
    return {
        "STRING": ["example", "t-1", "a short note", "n-0123456789abcdef",
                   "sha256:" + "0" * 64],
        "INTEGER": [1, 60000, 1764500000000, 3],
        "DECIMAL": [Decimal("12.50"), Decimal("0.5")],
        "NUMBER": [10, Decimal("12.50")],
        "SYMBOL": [Symbol("example"), *symbols],
        "KEYWORD": list(keywords) or [Keyword("size"), Keyword("name"), Keyword("mode")],
        "URI": [URI("agent://example/peer"), URI("https://example.org/item")],
        "value": ["value", 42, (Symbol("x"), 1)],
    }


def example_bodies(protocol: Protocol, intent: Intent, *, seed: int = 0,
                   max_depth: int = _EXAMPLE_DEPTH, tally: Tally | None = None
                   ) -> Iterator[str | None]:
    """Body texts (canonical) that the grammar's start rule for ``intent`` derives, drawn
    deterministically from ``seed`` by the package's body generator
    (:func:`cbcl.llm._generate.draw_bodies`) with values from small readable pools (the
    schema's ``one-of`` symbols and keywords among them) and keyword sets in the author's
    order: endless, ``None`` for a draft that is not one value. Each draft's values are
    then fitted to the schema (:func:`fit_to_schema`); callers keep the bodies
    :func:`cbcl.parse` accepts. ``tally`` counts the tokens drawn (see
    :func:`~cbcl.llm._generate.draw_bodies`)."""
    source = grammar_index(protocol.descriptor).source
    for body in draw_bodies(source, protocol.descriptor.starts[intent], random.Random(seed),
                            max_depth=max_depth, pools=_pools(protocol), ordered=True,
                            tally=tally):
        if body is not None and protocol.schema is not None:
            body = fit_to_schema(protocol.schema, body)
        yield None if body is None else canonical_value(body)


def example_message(protocol: Protocol, intent: Intent, body: str, number: int = 1) -> str:
    """The text of an example message of ``protocol`` with ``body``: with a
    ``conversation-id`` when the protocol has a conversation machine (which requires one,
    spec/conversations.md §1.2)."""
    conversation = ' (conversation-id "c-1")' if protocol.descriptor.conversation else ""
    return (f'(CBCL/1.0 (message-id "m-{number}") (sender agent://example/a) '
            f"(receiver agent://example/b) (intent {intent.value}) (protocol {protocol.id})"
            f"{conversation} (body {body}))")


# ------------------------------------------------------------------ what the schema says

#: The deepest a body is fitted to a schema (deeper lists are left as drawn; an example
#: body is at most a few lists deep).
_FIT_DEPTH = 32
_PLAUSIBLE_STRINGS = ("example", "t-1", "a short note", "n-0123456789abcdef")


def fit_to_schema(schema: Schema, body: Value) -> Value:
    """``body`` with each value its schema types refuses replaced by a plausible one: a
    number in the field's range (the drawn one when it fits), a string of its length, one
    of its ``one-of`` values (of the drawn value's type when one is), ``true`` for a
    boolean, a URI of its scheme; a list cut to its maximum length. What the schema leaves
    open is kept; nothing here is a check (the caller parses the result). Raises
    nothing."""
    record = schema.record_for(body)
    return body if record is None else _fit(record, body, 0)


def _fit(t: SchemaType, value: Value, depth: int) -> Value:
    if depth > _FIT_DEPTH:
        return value
    if isinstance(t, AtomType):
        return value if _atom_problem(t, value) is None else _plausible(t, value)
    if isinstance(t, OneOf):
        if any(type(value) is type(v) and value == v for v in t.values):
            return value
        same = [v for v in t.values if type(v) is type(value)]
        return (same or list(t.values))[0]
    if type(value) is not tuple:
        return value
    if isinstance(t, ListOf):
        items = value if t.max_length is None else value[:t.max_length]
        return tuple(_fit(t.item, item, depth + 1) for item in items)
    keys, start = (t.keys, len(t.heads)) if isinstance(t, Record) else (t, 0)
    if not isinstance(keys, Keys):
        return value
    out = list(value)
    for i in range(start + 1, len(out), 2):
        key = out[i - 1]
        child = keys.fields.get(key, keys.other) if type(key) is Keyword else None
        if child is not None:
            out[i] = _fit(child, out[i], depth + 1)
    return tuple(out)


def _plausible(t: AtomType, drawn: Value) -> Value:
    """A value of type ``t``, near ``drawn`` where it can be."""
    if t.kind == "boolean":
        return Symbol("true")
    if t.kind == "uri":
        return URI(f"{t.scheme or 'agent'}://example/peer")
    if t.kind in ("integer", "decimal", "number"):
        candidates: list[Value] = [drawn, 1, 3, 10, 60000, Decimal("12.50"), Decimal("0.5")]
        if t.low is not None:
            candidates.append(t.low)
        if t.high is not None:
            candidates.append(t.high)
        candidates += [Decimal(c) for c in candidates if type(c) is int]  # (for a decimal)
        for candidate in candidates:
            if _atom_problem(t, candidate) is None:
                return candidate
        return drawn
    if t.kind in ("string", "symbol"):
        make = Symbol if t.kind == "symbol" else str
        for text in (*_PLAUSIBLE_STRINGS, "x" * (t.min_length or 0), *_matching(t)):
            candidate = make(text.replace(" ", "-")) if t.kind == "symbol" else text
            if _atom_problem(t, candidate) is None:
                return candidate
    return drawn


def _matching(t: AtomType) -> tuple[str, ...]:
    """A shortest string ``t``'s pattern matches, if it has one (and one is found within
    the comparison budget)."""
    if t.pattern is None:
        return ()
    try:
        witness = pattern_witness(compile_pattern(t.pattern), None)
    except DescriptorError:  # (over the budget, or a hand-built type's bad pattern)
        return ()
    return () if witness is None else (witness,)


def _number_text(t: AtomType) -> str:
    low = None if t.low is None else canonical_value(t.low)
    high = None if t.high is None else canonical_value(t.high)
    if low is not None and high is not None:
        return f" from {low} to {high}" if low != high else f" equal to {low}"
    if low is not None:
        return f" of at least {low}"
    if high is not None:
        return f" of at most {high}"
    return ""


def _length_text(t: AtomType | ListOf, unit: str) -> str:
    low, high = t.min_length, t.max_length
    if low is not None and high is not None:
        return f" of {low} {unit}" if low == high else f" of {low} to {high} {unit}"
    if low is not None:
        return f" of at least {low} {unit}"
    if high is not None:
        return f" of at most {high} {unit}"
    return ""


_ATOM_NAMES = {"string": "a STRING", "integer": "an INTEGER", "decimal": "a DECIMAL",
               "number": "a NUMBER", "symbol": "a SYMBOL", "keyword": "a KEYWORD",
               "uri": "a URI", "boolean": "true or false", "any": "any VALUE"}


def _describe(t: SchemaType) -> tuple[str, bool]:
    """What a value of type ``t`` may be, in the prompt's words, and whether that says
    more than the grammar's form does."""
    if isinstance(t, AtomType):
        text = _ATOM_NAMES.get(t.kind, t.kind)
        extra = _number_text(t) + _length_text(t, "characters")
        if t.scheme is not None:
            extra += f" with scheme {t.scheme}"
        if t.pattern is not None:
            extra += " " + describe_pattern(t.pattern)
        return text + extra, bool(extra) or t.kind == "boolean"
    if isinstance(t, OneOf):
        return "one of " + ", ".join(canonical_value(v) for v in t.values), True
    if isinstance(t, ListOf):
        item, said = _describe(t.item)
        length = _length_text(t, "elements")
        return f"a list{length}, each {item}", said or bool(length)
    if isinstance(t, Record):
        return "(" + " ".join(t.heads) + " …)", False
    return "a list of keyword arguments", False


def field_lines(schema: Schema, limit: int = 256) -> list[str]:
    """One line per record (and nested record or keyword list) of ``schema`` that says
    more than the grammar's forms: ``(ask …): :quantity an INTEGER from 1 to 1000; …``
    (at most ``limit`` lines). Raises nothing."""
    lines: list[str] = []
    seen: set[str] = set()
    work: list[tuple[str, Keys]] = [("(" + " ".join(r.heads) + " …)", r.keys)
                                    for r in schema.records]
    while work and len(lines) < limit:
        where, keys = work.pop(0)
        parts = []
        for key, t in keys.fields.items():
            text, says_more = _describe(t)
            if says_more:
                parts.append(f"{key.text} {text}")
            inner = t.item if isinstance(t, ListOf) else t
            if isinstance(inner, Record):
                work.append(("(" + " ".join(inner.heads) + " …)", inner.keys))
            elif isinstance(inner, Keys):
                work.append((f"{key.text} of {where}", inner))
        line = f"{where}: " + "; ".join(parts)
        if parts and line not in seen:
            seen.add(line)
            lines.append(line)
    return lines


def _records_by_head(schema: Schema, limit: int = 1024) -> dict[str, Record]:
    """The records of ``schema``, nested ones too, by their first head (the first one
    met, breadth first; at most ``limit`` types looked at)."""
    found: dict[str, Record] = {}
    work: list[SchemaType] = list(schema.records)
    for t in work:
        if len(work) > limit:
            break
        if isinstance(t, Record):
            found.setdefault(str(t.heads[0]), t)
            work.extend(t.keys.fields.values())
        elif isinstance(t, Keys):
            work.extend(t.fields.values())
        elif isinstance(t, ListOf):
            work.append(t.item)
    return found


def _with_one_of(schema: Schema | None, form: str) -> str:
    """``form`` (a body form, ``(bid :price NUMBER :currency SYMBOL)``) with each
    ``:key SYMBOL`` whose field the schema limits to symbols written as the choice of
    them (``:currency {EUR | USD}``), where the key appears once in the form."""
    if schema is None or not form.startswith("("):
        return form
    head = form[1:].split(" ", 1)[0].rstrip(")")
    record = _records_by_head(schema).get(head) if is_name(head) else None
    if record is None:
        return form
    for key, t in record.keys.fields.items():
        if not isinstance(t, OneOf) or not all(type(v) is Symbol for v in t.values):
            continue
        written = f"{key.text} SYMBOL"
        if form.count(written) == 1 and form.count(key.text + " ") == 1:
            choice = " | ".join(str(v) for v in t.values)
            form = form.replace(written, f"{key.text} {{{choice}}}")
    return form


class _Drafts:
    """The drafts a prompt's examples have taken, bounded by ``max_example_drafts``."""

    def __init__(self, limits: LLMLimits) -> None:
        self.limits = limits
        self.count = 0
        self.tally = Tally(limits, "the prompt's examples")

    def take(self) -> None:
        self.count += 1
        if self.count > self.limits.max_example_drafts:
            raise self.limits.exceeded("max_example_drafts", "the prompt's examples")


def examples(registry: Registry, protocol: Protocol, intents: Sequence[Intent],
             count: int = 1, seed: int = 0, drafts_taken: _Drafts | None = None) -> list[str]:
    """Example messages, each accepted by :func:`cbcl.parse` with ``registry`` (which holds
    ``protocol``), for ``intents`` (which share a start rule): ``count`` per form of the
    body (per list head), for up to four forms, distinct, cycling through the intents.
    ``drafts_taken`` counts the drafts (default: under the default :class:`LLMLimits`);
    raises :class:`LimitError` past its budgets."""
    taken = _Drafts(DEFAULT_LLM_LIMITS) if drafts_taken is None else drafts_taken
    index = grammar_index(protocol.descriptor)
    forms = start_templates(index, protocol.descriptor.starts[intents[0]])
    wanted = count * min(len(forms), 4)
    found: list[str] = []
    heads: dict[str, int] = {}
    drafts = example_bodies(protocol, intents[0], seed=seed, tally=taken.tally)
    for attempt in range(_ATTEMPTS * max(1, len(forms))):
        if len(found) == wanted:
            break
        intent = intents[len(found) % len(intents)]
        taken.take()
        body = next(drafts)
        if body is None:
            continue
        head = body.split(" ", 1)[0].rstrip(")")
        if heads.get(head, 0) >= count and attempt < _ATTEMPTS * len(forms) // 2:
            continue  # another form first, while attempts last
        text = example_message(protocol, intent, body, len(found) + 1)
        try:
            message = parse(text, registry=registry)
        except CBCLError:
            continue
        canonical = message.canonical()
        if canonical not in found:
            found.append(canonical)
            heads[head] = heads.get(head, 0) + 1
    return found


_VALUES = """\
- STRING: text in double quotes, "like this"; the only escapes are \\" \\\\ \\n \\r \\t \
and \\uXXXX.
- INTEGER: 42 or -7 (no leading zeros, no + sign). DECIMAL: 12.50 (digits on both sides of \
the point, no exponent). NUMBER: an INTEGER or a DECIMAL.
- SYMBOL: a bare name, not quoted (render-video, EUR). KEYWORD: a name after a colon \
(:task-id). URI: scheme://rest (agent://example/peer).
- VALUE: any one value, a list ( … ) included.
- Names — field names, intents, keywords, symbols — are case-sensitive: write them exactly \
as shown."""


def _where_with_one_of(schema: Schema | None, line: str) -> str:
    name, sep, form = line.partition(" is: ")
    return f"{name}{sep}{_with_one_of(schema, form)}" if sep else line


def _envelope(conversation: bool) -> str:
    """The envelope's template; ``conversation-id`` required when ``conversation``."""
    if not conversation:
        return ENVELOPE_TEMPLATE
    return ENVELOPE_TEMPLATE.replace("  [(conversation-id STRING)]", "  (conversation-id STRING)")


def _conversation_lines(section: Value | None) -> list[str]:
    """The conversation machine's rules for a model: the required ``conversation-id`` and
    the moves, ``- REQUEST from the initiator: start -> requested``."""
    if section is None:
        return []
    lines = ["", "### The conversation", "",
             "Every message of this protocol belongs to a conversation: it MUST carry a "
             "`(conversation-id …)`, the same for every message of one conversation, and "
             "a reply names the message it answers in `(in-reply-to …)`. The messages "
             "allowed, by state (the first message starts in the initial state):", ""]
    roles: tuple[Value, ...] = ()
    initial: Value | None = None
    for part in section[1:] if type(section) is tuple else ():
        if type(part) is not tuple or not part:
            continue
        if part[0] == Symbol("roles"):
            roles = part[1:]
        elif part[0] == Symbol("initial") and len(part) == 2:
            initial = part[1]
        elif part[0] == Symbol("transitions"):
            for row in part[1:]:
                if type(row) is tuple and len(row) == 4:
                    state, intent, role, after = (canonical_value(v) for v in row)
                    start = " (initial)" if initial is not None and row[0] == initial else ""
                    lines.append(f"- in {state}{start}: {intent} from the {role} -> {after}")
    if len(roles) == 2:
        lines += ["", f"The {canonical_value(roles[0])} sends the first message; the other "
                      f"party is the {canonical_value(roles[1])}. NOT-UNDERSTOOD is allowed "
                      "at any time; CANCEL from the first party ends the conversation."]
    return lines


def render_prompt(protocol: Protocol, *, registry: Registry, intent: Intent | None = None,
                  count: int = 1, seed: int = 0, limits: LLMLimits | None = None) -> str:
    """A system-prompt section (Markdown) that teaches a model to write messages of
    ``protocol`` (held by ``registry``): the envelope, the value syntax, each governed
    intent's body (only ``intent``'s, if given) and up to ``count`` valid example
    messages per intent. ``limits`` (default :class:`LLMLimits`) bound the work. Raises
    ``ValueError`` for an intent the protocol does not govern and :class:`LimitError`
    naming the budget a prompt would exceed."""
    budget = DEFAULT_LLM_LIMITS if limits is None else limits
    if not isinstance(budget, LLMLimits):
        raise TypeError(f"limits must be LLMLimits, not {type(budget).__name__}")
    descriptor = protocol.descriptor
    intents = list(descriptor.intents)
    if intent is not None:
        if intent not in intents:
            governed = " ".join(i.value for i in intents)
            raise ValueError(f"{descriptor.id} does not govern {intent.value} messages "
                             f"(it governs {governed})")
        intents = [intent]
    index = grammar_index(descriptor)
    lines = [
        f"## Messages: CBCL/1.0, protocol {descriptor.id}",
        "",
        "Every message you send is one CBCL/1.0 message: a single S-expression (never "
        "JSON), written exactly in the form below. If you write anything else around it, "
        "put the message alone in a ```cbcl code block.",
        "",
        "### The envelope",
        "",
        "The fields come in this order, each in its own parentheses; [ ] marks an "
        f"optional field. The protocol is `{descriptor.id}`; the intent is one of "
        f"{', '.join(i.value for i in intents)}.",
        "",
        "```",
        _envelope(descriptor.conversation is not None),
        "```",
        *_conversation_lines(descriptor.conversation),
        "",
        "### Values",
        "",
        _VALUES,
        "",
        "### Bodies",
        "",
        "The `(body …)` field holds one value, whose form depends on the intent. In the "
        "forms below, `<name>` stands for the form given for it, `{a | b}` for one of a or "
        "b, `x*` for zero or more x, `x+` for one or more, `[x]` for an optional x. "
        "Keyword arguments (`:name value`) may come in any order, each at most once, "
        "unless a form says which have a fixed place; those in [ ] may be left out.",
        "",
    ]
    groups: dict[str, list[Intent]] = {}
    for governed in intents:
        groups.setdefault(descriptor.starts[governed], []).append(governed)
    references: list[str] = []
    for rule, members in groups.items():
        forms = start_templates(index, rule)
        names = ", ".join(i.value for i in members)
        if len(forms) == 1:
            lines.append(f"- {names}: {_with_one_of(protocol.schema, forms[0][0])}")
        else:
            lines.append(f"- {names}: one of")
            lines.extend(f"  - {_with_one_of(protocol.schema, text)}"
                         for text, _, _ in forms)
        for _, refs, _ in forms:
            references.extend(r for r in refs if r not in references)
    if intent is None:
        for always in (Intent.NOT_UNDERSTOOD, Intent.CANCEL):
            if always not in descriptor.intents:
                lines.append(f'- {always.value}: no body, or a reason STRING ("why").')
    shown = where_lines(index, references, limit=len(index.rules))
    if shown:
        lines += ["", "where", *(f"- {_where_with_one_of(protocol.schema, line)}"
                                 for line in shown)]
    if protocol.schema is not None:
        values = field_lines(protocol.schema)
        if values:
            lines += ["", "### Field values", "",
                      "Only these values are accepted (a message with another is refused):",
                      "", *(f"- {line}" for line in values)]
    rules = [] if protocol.constraints is None else [
        rule for rule in protocol.constraints.rules if set(rule.intents) & set(intents)]
    if rules:
        lines += ["", "### Rules", "",
                  "A message that breaks one of these is refused with the rule's message:",
                  "", *(f"- {rule.describe()}" for rule in rules)]
    taken = _Drafts(budget)
    texts = [text for members in groups.values()
             for text in examples(registry, protocol, members, count, seed, taken)]
    if texts:
        lines += ["", "### Examples", "", "```cbcl", *texts, "```"]
    text = "\n".join(lines) + "\n"
    if len(text.encode("utf-8", "surrogatepass")) > budget.max_output_bytes:
        raise budget.exceeded("max_output_bytes", "the prompt")
    return text
