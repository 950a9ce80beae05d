"""A corpus of model-style failures, and what ``cbcl.extract`` and the repair hints make of it.

    python benchmarks/llm_failures.py [--json] [--limit N]

The valid messages are the examples of the shipped protocols (``descriptors/examples/``)
and messages generated from each grammar (:mod:`cbcl.llm._prompt`), every one accepted by
``cbcl.parse``. Each failure kind below turns one (its canonical text) into what a model
might have written instead; ``cbcl.extract`` reads it with every shipped descriptor loaded,
and the outcome is one of:

``recovered``
    extract returned the message(s), each one's text exactly the valid message's text and
    each one equal to it.
``accepted-equivalent``
    extract returned a message that differs from the valid one only in the order of the
    members of a keyword set (valid since keyword sets: counted apart, never as wrong).
``refused-with-fix``
    extract raised a ``CBCLError`` whose ``hint()`` *names the fix*, defined per kind:
    renamed or re-cased keyword — a line of the hint that starts with ``Write``/``Add``
    names the keyword the grammar wanted; renamed envelope field — the hint lists
    ``(field …)`` for the field the envelope wanted; reordered members of a fixed-order
    list — the hint shows the template of that list (``(head …``); JSON — the hint says
    to write an S-expression and shows the envelope's template; truncated — the hint
    says the message is incomplete and to close its lists.
``refused-no-fix``
    a ``CBCLError`` whose hint does not meet that definition.
``wrong``
    extract returned a message that is not the valid one and not equivalent to it (silent
    acceptance of a wrong message): must be 0.
``crash``
    any exception other than a ``CBCLError``: must be 0.

Only keywords in grammar positions are renamed or re-cased (a keyword that is data, as in
a ``(KEYWORD value)*`` list, can be renamed validly: the message then means something
else, which no grammar can know).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import installed

import cbcl
from cbcl.core._limits import DEFAULT_LIMITS
from cbcl.core._reader import LPAR, RPAR, TOKEN, read_value_at, token_start
from cbcl.core._values import ATOM_TERMINALS
from cbcl.grammar._kernel import feed, terminal_of
from cbcl.llm._extract import extract
from cbcl.llm._prompt import examples
from cbcl.protocol._envelope import scan_envelope
from cbcl.protocol._pass2 import start_stack
from cbcl.protocol._protocol import Protocol

ROOT = Path(__file__).resolve().parent.parent
DESCRIPTORS = ROOT / "descriptors"

OUTCOMES = ("recovered", "accepted-equivalent", "refused-with-fix", "refused-no-fix", "wrong",
            "crash")


def load_registry() -> cbcl.Registry:
    registry = cbcl.Registry(disk_cache=False, isolate=False)
    for path in sorted(DESCRIPTORS.glob("*.cbcl")):
        if not path.name.endswith(".signed.cbcl"):
            registry.load(path.read_bytes(), allow_unsigned=True)
    return registry


def valid_messages(registry: cbcl.Registry, generated: int = 1) -> list[cbcl.Message]:
    """The shipped examples of the loaded protocols, then ``generated`` generated messages
    per body form of each protocol; each accepted by ``cbcl.parse``."""
    out: dict[str, cbcl.Message] = {}
    for path in sorted((DESCRIPTORS / "examples").glob("*.cbcl")):
        try:
            message = cbcl.parse(path.read_bytes(), registry=registry)
        except cbcl.CBCLError:
            continue  # an example of a protocol not shipped as a descriptor
        out.setdefault(message.canonical(), message)
    if generated:
        for path in sorted(DESCRIPTORS.glob("*.cbcl")):
            if path.name.endswith(".signed.cbcl"):
                continue
            descriptor = cbcl.descriptor.read_descriptor(path.read_bytes())
            protocol = registry.get(descriptor.id)
            assert protocol is not None
            groups: dict[str, list[cbcl.Intent]] = {}
            for intent, rule in descriptor.starts.items():
                groups.setdefault(rule, []).append(intent)
            for intents in groups.values():
                for text in examples(registry, protocol, intents, generated, seed=7):
                    message = cbcl.parse(text, registry=registry)
                    out.setdefault(message.canonical(), message)
    return list(out.values())


# --------------------------------------------------------------------------- the body's tokens


@dataclass
class Node:
    """A token (``terminal`` set) or a list (``children``) of the body, with its span in
    the message's text."""

    start: int
    end: int
    terminal: str = ""
    value: object = None
    children: list[Node] = field(default_factory=list)

    @property
    def is_list(self) -> bool:
        return not self.terminal


def body_tree(protocol: Protocol, text: str, intent: cbcl.Intent) -> Node:
    """The body of the valid message ``text`` as a tree of tokens, each atom with the
    terminal the kernel gave it (a ``LIT_…`` for a grammar literal)."""
    tables = protocol.tables
    pos = scan_envelope(text, DEFAULT_LIMITS).body_at
    stack = start_stack(protocol, intent)
    marks: dict[int, int] = {}
    root = Node(pos, pos)
    open_lists = [root]
    started = False
    while not started or len(open_lists) > 1:
        m = TOKEN.match(text, pos)
        assert m is not None
        kind = m.lastindex
        start = token_start(m)
        value: object = None
        if kind == LPAR:
            terminal, pos = "LPAR", m.end()
            node = Node(start, pos)
            open_lists[-1].children.append(node)
            open_lists.append(node)
        elif kind == RPAR:
            terminal, pos = "RPAR", m.end()
            open_lists.pop().end = pos
        else:
            value, pos, _ = read_value_at(text, pos, DEFAULT_LIMITS, 0, 0)
            terminal = ATOM_TERMINALS[type(value)]
            if terminal in ("SYMBOL", "KEYWORD"):
                terminal = terminal_of(tables, stack, protocol.atoms.get(value), terminal)
            open_lists[-1].children.append(Node(start, pos, terminal, value))
        started = True
        feed(tables, stack, terminal, marks=marks)
    return root.children[0]


def walk(node: Node) -> Iterator[Node]:
    yield node
    for child in node.children:
        yield from walk(child)


def literal_keywords(tree: Node) -> list[Node]:
    return [n for n in walk(tree) if n.terminal.startswith("LIT_")
            and type(n.value) is cbcl.Keyword]


def pair_lists(tree: Node) -> list[Node]:
    """Lists written ``(head :k v :k v …)`` with grammar keywords, at least two pairs."""
    found = []
    for node in walk(tree):
        rest = node.children[1:]
        if node.is_list and node.children and node.children[0].terminal.startswith("LIT_") \
                and len(rest) >= 4 and len(rest) % 2 == 0 \
                and all(rest[i].terminal.startswith("LIT_") and type(rest[i].value) is
                        cbcl.Keyword for i in range(0, len(rest), 2)):
            found.append(node)
    return found


def normalised(value: Any) -> Any:
    """A value with the ``:k v`` pairs of every ``(head :k v …)`` list sorted: what a
    reordering of keyword arguments leaves unchanged."""
    if type(value) is not tuple:
        return value
    items = tuple(normalised(v) for v in value)
    rest = items[1:]
    if items and len(rest) % 2 == 0 and rest and \
            all(type(rest[i]) is cbcl.Keyword for i in range(0, len(rest), 2)):
        pairs = sorted(((str(rest[i]), cbcl.canonical(rest[i + 1]), rest[i], rest[i + 1])
                        for i in range(0, len(rest), 2)), key=lambda p: (p[0], p[1]))
        return (items[0], *(x for p in pairs for x in p[2:]))
    return items


def equivalent(a: cbcl.Message, b: cbcl.Message) -> bool:
    if a.canonical() == b.canonical():
        return True
    envelope_a = [v for v in a.to_value() if not (type(v) is tuple and str(v[0]) == "body")]
    envelope_b = [v for v in b.to_value() if not (type(v) is tuple and str(v[0]) == "body")]
    return (cbcl.canonical(tuple(envelope_a)) == cbcl.canonical(tuple(envelope_b))
            and cbcl.canonical(normalised(a.body)) == cbcl.canonical(normalised(b.body)))


# --------------------------------------------------------------------------- the failures


@dataclass
class Case:
    kind: str
    text: str  # what the model wrote
    originals: list[str]  # the valid messages' texts it holds
    fixed: Callable[[str], bool]  # whether a hint names the fix
    note: str = ""


def _fix_line(word: str) -> Callable[[str], bool]:
    def check(hint: str) -> bool:
        return any(line.startswith(("Write", "Add"))
                   and (word in line.split() or f"{word}," in line)
                   for line in hint.splitlines())
    return check


def _contains(*pieces: str) -> Callable[[str], bool]:
    return lambda hint: all(piece in hint for piece in pieces)


def _never(hint: str) -> bool:
    return False


FENCES = ("```cbcl\n{}\n```", "```\n{}\n```", "~~~lisp\n{}\n~~~", "```scheme\n{}\n```")
PROSE = ("Sure! Here is the message:\n\n{}\n",
         "{}\n\nLet me know if you need anything else.",
         "I will reply with the following message.\n{}\nThis should work.")


def _renamed(keyword: str, index: int, taken: set[str]) -> str:
    name = keyword[1:]
    parts = name.split("-")
    options = [
        "_".join(parts),
        parts[0] + "".join(p.capitalize() for p in parts[1:]),
        name + "s",
        name[:3] if len(name) > 4 else name + "-value",
        "the-" + name,
    ]
    options = [o for o in options[index % len(options):] + options[:index % len(options)]
               if o != name and f":{o}" not in taken]
    return ":" + options[0]


def _recased(keyword: str, index: int) -> str:
    name = keyword[1:]
    title = "-".join(p.capitalize() for p in name.split("-"))
    options = [title, name.upper()]
    choice = options[index % 2]
    return ":" + (choice if choice != name else name.upper() + "X")


_FIELDS = {"message-id": ["message_id", "messageId", "id"], "sender": ["from", "Sender"],
           "receiver": ["to", "recipient"], "intent": ["performative", "Intent"],
           "protocol": ["proto", "protocol-id"], "conversation-id": ["conversation_id"],
           "in-reply-to": ["reply-to", "in_reply_to"], "body": ["content", "Body"]}


def cases(registry: cbcl.Registry, messages: list[cbcl.Message]) -> Iterator[Case]:
    for number, message in enumerate(messages):
        text = message.canonical()
        protocol = registry.get(message.protocol)
        assert protocol is not None
        tree = body_tree(protocol, text, message.intent)
        taken = {shown.strip('"') for shown in protocol.shown.values()}
        yield Case("fenced", FENCES[number % len(FENCES)].format(text), [text], _never)
        yield Case("prose", PROSE[number % len(PROSE)].format(text), [text], _never)
        yield Case("fenced-in-prose", "Here it is:\n\n" + FENCES[number % 2].format(text)
                   + "\n\nDone.", [text], _never)
        other = messages[(number + 1) % len(messages)].canonical()
        if other != text:
            yield Case("several", f"First:\n```cbcl\n{text}\n```\nand then:\n{other}\n",
                       [text, other], _never)
        for index, node in enumerate(literal_keywords(tree)):
            keyword = text[node.start:node.end]
            renamed = _renamed(keyword, index + number, taken)
            yield Case("keyword-renamed", text[:node.start] + renamed + text[node.end:],
                       [text], _fix_line(keyword), f"{keyword} -> {renamed}")
            recased = _recased(keyword, index + number)
            yield Case("keyword-recased", text[:node.start] + recased + text[node.end:],
                       [text], _fix_line(keyword), f"{keyword} -> {recased}")
        for node in pair_lists(tree):
            head = node.children[0]
            rest = node.children[1:]
            pairs = [text[rest[i].start:rest[i + 1].end] for i in range(0, len(rest), 2)]
            reordered = "(" + text[head.start:head.end] + " " + " ".join(reversed(pairs)) + ")"
            yield Case("keywords-reordered", text[:node.start] + reordered + text[node.end:],
                       [text], _contains(f"    ({text[head.start:head.end]} "),
                       text[head.start:head.end])
        for index, (name, replacements) in enumerate(_FIELDS.items()):
            at = text.find(f"({name} ")
            if at >= 0:
                renamed = replacements[(number + index) % len(replacements)]
                yield Case("field-renamed", text[:at + 1] + renamed + text[at + 1 + len(name):],
                           [text], _contains(f"({name} …)"), f"{name} -> {renamed}")
        as_json = json.dumps(cbcl.json_mapping.message_to_json(message), indent=2,
                             ensure_ascii=False)
        yield Case("json", "Here is the message:\n```json\n" + as_json + "\n```", [text],
                   _contains("S-expression", "(CBCL/1.0"))
        for where, cut in (("half", len(text) // 2), ("most", len(text) * 9 // 10),
                           ("last-paren", len(text) - 1)):
            wrapped = FENCES[0].format(text[:cut]) if where != "most" else text[:cut]
            yield Case("truncated", wrapped, [text], _contains("incomplete", "close"), where)


def judge(case: Case, registry: cbcl.Registry) -> tuple[str, str]:
    """The outcome of ``case`` and, for a refusal, its hint."""
    try:
        found = extract(case.text, registry=registry)
    except cbcl.CBCLError as exc:
        hint = exc.hint()
        return ("refused-with-fix" if case.fixed(hint) else "refused-no-fix"), hint
    except Exception as exc:  # a crash is an outcome to report
        return "crash", f"{type(exc).__name__}: {exc}"
    originals = [cbcl.parse(text, registry=registry) for text in case.originals]
    if len(found) == len(originals) and all(
            item.text == text and item.message.canonical() == original.canonical()
            for item, text, original in zip(found, case.originals, originals, strict=True)):
        return "recovered", ""
    if len(found) == len(originals) and all(
            equivalent(item.message, original)
            for item, original in zip(found, originals, strict=True)):
        return "accepted-equivalent", ""
    return "wrong", " | ".join(item.text for item in found)


def measure(*, limit: int | None = None, generated: int = 1,
            report: Callable[[str], None] | None = None) -> dict[str, dict[str, int]]:
    """Outcomes per failure kind (and ``"all"``), over the first ``limit`` valid
    messages (all by default)."""
    registry = load_registry()
    messages = valid_messages(registry, generated)[:limit]
    table: dict[str, Counter[str]] = {}
    for case in cases(registry, messages):
        outcome, detail = judge(case, registry)
        table.setdefault(case.kind, Counter())[outcome] += 1
        if report is not None and outcome in ("refused-no-fix", "wrong", "crash"):
            report(f"{case.kind} {outcome} {case.note}: {detail.splitlines()[:1]}")
    result = {kind: {o: counts[o] for o in OUTCOMES} for kind, counts in table.items()}
    result["all"] = {o: sum(row[o] for row in result.values()) for o in OUTCOMES}
    result["all"]["messages"] = len(messages)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the table as JSON")
    parser.add_argument("--limit", type=int, default=None, help="valid messages to use")
    parser.add_argument("--verbose", action="store_true", help="print each bad outcome")
    args = parser.parse_args(argv)
    installed.check()  # the installed cbcl, with its C extension
    result = measure(limit=args.limit,
                     report=(lambda line: print(line, file=sys.stderr)) if args.verbose
                     else None)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{'kind':<20}" + "".join(f"{o:>21}" for o in ("cases", *OUTCOMES)))
    for kind, row in result.items():
        total = sum(row[o] for o in OUTCOMES)
        print(f"{kind:<20}{total:>21}" + "".join(
            f"{row[o]:>12} ({100 * row[o] / total:5.1f}%)" if total else f"{0:>21}"
            for o in OUTCOMES))
    print(f"{result['all']['messages']} valid messages")
    return 1 if result["all"]["wrong"] or result["all"]["crash"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
