"""Prompts: a system-prompt section that teaches a model to speak one protocol.

:func:`render_prompt` writes, for a loaded protocol, the envelope's template, the rules of
CBCL text a model gets wrong most (quotes, numbers, keywords, case), each governed intent's
body shape rendered from the grammar's syntax tree (the renderer of :mod:`cbcl.protocol._hints`:
``(bid :price NUMBER :currency SYMBOL [:eta INTEGER])``, keyword sets as "in any order"),
and valid example messages. Every example is generated from the grammar
(:func:`example_bodies`, deterministic for a seed: the generator of
:mod:`cbcl.llm._generate` with readable values and keyword sets in the author's order) and
kept only when :func:`cbcl.parse` accepts the whole message with the protocol loaded — both
passes and the schema — so a prompt never teaches a message the receiver would refuse.

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
from ..core._errors import CBCLError
from ..core._limits import DEFAULT_LLM_LIMITS, LLMLimits
from ..core._values import URI, Keyword, Symbol, Value
from ..protocol._api import parse
from ..protocol._hints import (
    ENVELOPE_TEMPLATE,
    grammar_index,
    start_templates,
    where_lines,
)
from ..protocol._message import Intent
from ..protocol._protocol import Protocol
from ..protocol._registry import Registry
from ._generate import Tally, draw_bodies

__all__ = ["example_bodies", "example_message", "render_prompt"]

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
    order: endless, ``None`` for a draft that is not one value. The schema does not guide
    the draw (callers keep the bodies :func:`cbcl.parse` accepts). ``tally`` counts the
    tokens drawn (see :func:`~cbcl.llm._generate.draw_bodies`)."""
    source = grammar_index(protocol.descriptor).source
    for body in draw_bodies(source, protocol.descriptor.starts[intent], random.Random(seed),
                            max_depth=max_depth, pools=_pools(protocol), ordered=True,
                            tally=tally):
        yield None if body is None else canonical_value(body)


def example_message(protocol: Protocol, intent: Intent, body: str, number: int = 1) -> str:
    """The text of an example message of ``protocol`` with ``body``."""
    return (f'(CBCL/1.0 (message-id "m-{number}") (sender agent://example/a) '
            f"(receiver agent://example/b) (intent {intent.value}) (protocol {protocol.id}) "
            f"(body {body}))")


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
        ENVELOPE_TEMPLATE,
        "```",
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
        "Keyword arguments (`:name value`) may come in any order, each at most once; "
        "those in [ ] may be left out.",
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
            lines.append(f"- {names}: {forms[0][0]}")
        else:
            lines.append(f"- {names}: one of")
            lines.extend(f"  - {text}" for text, _, _ in forms)
        for _, refs, _ in forms:
            references.extend(r for r in refs if r not in references)
    if intent is None:
        for always in (Intent.NOT_UNDERSTOOD, Intent.CANCEL):
            if always not in descriptor.intents:
                lines.append(f'- {always.value}: no body, or a reason STRING ("why").')
    shown = where_lines(index, references, limit=len(index.rules))
    if shown:
        lines += ["", "where", *(f"- {line}" for line in shown)]
    taken = _Drafts(budget)
    texts = [text for members in groups.values()
             for text in examples(registry, protocol, members, count, seed, taken)]
    if texts:
        lines += ["", "### Examples", "", "```cbcl", *texts, "```"]
    text = "\n".join(lines) + "\n"
    if len(text.encode("utf-8", "surrogatepass")) > budget.max_output_bytes:
        raise budget.exceeded("max_output_bytes", "the prompt")
    return text
