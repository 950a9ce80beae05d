"""The repair loop with a scripted model: CBCL (``cbcl.llm.complete``) against JSON + JSON
Schema as the format (spec/llm.md §14).

    python benchmarks/repair_loop.py [--json] [--tries N] [--generated N]

The *scripted model* stands in for a language model: given a target message, it writes it
with the mistakes models make, and, when a retry's prompt carries feedback that *names*
a mistake, it fixes that one (and only what the feedback names). The mistakes:

``fenced`` / ``prose``
    the message in a Markdown fence, or with a sentence before and after (never "fixed":
    the loop must find the message);
``recased``
    a keyword of the grammar written in another case (``:Task-Id``);
``missing``
    a required member left out (its keyword and value);
``out-of-range``
    a number its schema bounds written as -1 (every bound number in the shipped
    schemas has ``:min 0`` or more);
``fields-reordered``
    the envelope's ``(sender …)`` and ``(receiver …)`` swapped (a JSON object's members
    have no order: not a mistake in JSON);
``keywords-reordered``
    two members of a keyword set swapped (valid in both formats: never refused).

A mistake is fixed when the feedback names it, by one rule for both formats: for a
keyword (re-cased or missing), the feedback quotes the keyword's name (``:task-id`` in
CBCL, ``'task-id'`` or ``"task-id"`` in JSON); for a value out of range, it says
"minimum"; for the envelope's order, it says "order". The never-converging model
(``--stubborn``, and in the tests) fixes nothing.

The CBCL loop is :func:`cbcl.llm.complete` (prompt from :func:`cbcl.llm.render_prompt`,
the answer checked as it is read, the error's ``hint()`` as feedback). The JSON loop is the
same loop written for JSON: the prompt is the protocol's JSON Schema
(:func:`cbcl.llm.export_json_schema`, for the intent) with the same instructions, the
answer is the first JSON object in the text (``json.JSONDecoder.raw_decode`` from the
first ``{``), validated with ``jsonschema`` (Draft 2020-12); the feedback is
``jsonschema``'s best match, with its JSON path. A message counts as *accepted* only when
it is the target (up to the order of a keyword set's members): a wrong message a format
accepts is counted apart, as ``wrong``. Reported per format: the success rate, the answers
per accepted message, and the bytes (prompts and answers, UTF-8) per accepted message.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import jsonschema

import cbcl
from cbcl.core._canonical import canonical_value
from cbcl.core._values import Keyword, Symbol
from cbcl.json_mapping import from_json, to_json
from cbcl.llm import CompletionError, complete, export_json_schema
from cbcl.llm._prompt import examples
from cbcl.protocol._protocol import Protocol

ROOT = Path(__file__).resolve().parent.parent
DESCRIPTORS = ROOT / "descriptors"
KINDS = ("fenced", "prose", "recased", "missing", "out-of-range", "fields-reordered",
         "keywords-reordered")
#: The loops compared: CBCL with whole answers, CBCL with answers streamed in chunks of
#: :data:`STREAM` characters (a model stopped at the first refused token), JSON.
FORMS = ("cbcl", "cbcl-stream", "json")
STREAM = 4
#: Where a retry's prompt puts the refused answer; the feedback follows its closing fence.
REFUSED_HEADING = "## Your previous answer was refused"


def load_registry() -> cbcl.Registry:
    registry = cbcl.Registry(disk_cache=False, isolate=False)
    for path in sorted(DESCRIPTORS.glob("*.cbcl")):
        if not path.name.endswith(".signed.cbcl"):
            registry.load(path.read_bytes(), allow_unsigned=True)
    return registry


# --------------------------------------------------------------------------- mistakes


Tree = list[Any]


def _tree(value: Any) -> Any:
    return [_tree(item) for item in value] if type(value) is tuple else value


def _value(tree: Any) -> Any:
    return tuple(_value(item) for item in tree) if type(tree) is list else tree


@dataclass(frozen=True)
class Mistake:
    """One mistake: ``apply`` makes it in a copy of the message's tree; ``names`` says
    whether feedback names it (the same rule for both formats); ``benign`` mistakes are
    valid (the target is then the message with them made)."""

    kind: str
    apply: Callable[[Tree], None]
    names: Callable[[str], bool]
    benign: bool = False


def _body_lists(tree: Tree) -> list[Tree]:
    """The lists of the body (the body field's value and every list inside it)."""
    body = next(f for f in tree[1:] if type(f) is list and f[0] == Symbol("body"))
    found: list[Tree] = []
    stack = [body[1]]
    while stack:
        item = stack.pop()
        if type(item) is list:
            found.append(item)
            stack.extend(item)
    return found


def _pairs(protocol: Protocol, tree: Tree) -> list[tuple[Tree, int]]:
    """Where a keyword of the grammar is followed by its value in a body list."""
    return [(items, i) for items in _body_lists(tree) for i in range(len(items) - 1)
            if type(items[i]) is Keyword and items[i] in protocol.atoms]


def _names(keyword: str) -> Callable[[str], bool]:
    return lambda feedback: any(f"{q}{keyword}{e}" in feedback for q, e in
                                ((":", ""), ("'", "'"), ('"', '"')))


def _parses(tree: Tree, registry: cbcl.Registry) -> bool:
    try:
        cbcl.parse(canonical_value(_value(tree)), registry=registry)
    except cbcl.CBCLError:
        return False
    return True


def mistakes(message: cbcl.Message, registry: cbcl.Registry, rng: random.Random,
             ) -> dict[str, Mistake]:
    """The mistakes that can be made in ``message`` (each refused by cbcl.parse unless
    benign), by kind."""
    protocol = registry.get(message.protocol)
    assert protocol is not None
    tree = _tree(message.to_value())
    found: dict[str, Mistake] = {
        "fenced": Mistake("fenced", lambda t: None, lambda f: False, benign=True),
        "prose": Mistake("prose", lambda t: None, lambda f: False, benign=True),
    }

    def fields_reordered(t: Tree) -> None:
        t[2], t[3] = t[3], t[2]

    found["fields-reordered"] = Mistake("fields-reordered", fields_reordered,
                                        lambda f: "order" in f)
    pairs = _pairs(protocol, tree)
    rng.shuffle(pairs)
    for items, at in pairs:
        keyword = str(items[at])
        path = _path(tree, items)

        def recased(t: Tree, path: list[int] = path, at: int = at) -> None:
            target = _at(t, path)
            target[at] = Keyword(str(target[at]).title())

        def missing(t: Tree, path: list[int] = path, at: int = at) -> None:
            del _at(t, path)[at:at + 2]

        def out_of_range(t: Tree, path: list[int] = path, at: int = at) -> None:
            _at(t, path)[at + 1] = -1

        for kind, apply, names in (("recased", recased, _names(keyword)),
                                   ("missing", missing, _names(keyword)),
                                   ("out-of-range", out_of_range,
                                    lambda f: "minimum" in f)):
            if kind in found or (kind == "recased" and keyword.title() == keyword):
                continue
            if kind == "out-of-range" and type(items[at + 1]) not in (int, Decimal):
                continue
            copy = _tree(_value(tree))
            apply(copy)
            if not _parses(copy, registry):
                found[kind] = Mistake(kind, apply, names)
    for items in _body_lists(tree):  # two members of a keyword set swapped, still valid
        spots = [i for items2, i in pairs if items2 is items]
        if len(spots) >= 2 and "keywords-reordered" not in found:
            path, (a, b) = _path(tree, items), sorted(spots[:2])

            def swapped(t: Tree, path: list[int] = path, a: int = a, b: int = b) -> None:
                target = _at(t, path)
                target[a:a + 2], target[b:b + 2] = target[b:b + 2], target[a:a + 2]

            if b > a + 1:
                copy = _tree(_value(tree))
                swapped(copy)
                if _parses(copy, registry):
                    found["keywords-reordered"] = Mistake("keywords-reordered", swapped,
                                                          lambda f: False, benign=True)
    return found


def _path(tree: Tree, target: Tree) -> list[int]:
    """The indexes leading from ``tree`` to the list ``target`` (found by identity)."""
    stack: list[tuple[Any, list[int]]] = [(tree, [])]
    while stack:
        item, path = stack.pop()
        if item is target:
            return path
        if type(item) is list:
            stack.extend((child, [*path, i]) for i, child in enumerate(item))
    raise ValueError("not in the tree")


def _at(tree: Tree, path: list[int]) -> Tree:
    for index in path:
        tree = tree[index]
    return tree


# --------------------------------------------------------------------------- the model


@dataclass
class ScriptedModel:
    """Writes ``message`` (as CBCL text, or as its JSON mapping when ``form`` is
    ``"json"``) with ``made`` mistakes, and fixes a mistake when a retry's feedback names
    it (never, when ``stubborn``). Counts its calls and the bytes it read and wrote."""

    message: cbcl.Message
    made: list[Mistake]
    form: str = "cbcl"
    stubborn: bool = False
    calls: int = 0
    read_bytes: int = 0
    written_bytes: int = 0
    fixed: list[str] = field(default_factory=list)

    def intended(self) -> Tree:
        """The tree the model means to send: the message with its benign mistakes."""
        tree: Tree = _tree(self.message.to_value())
        for mistake in self.made:
            if mistake.benign:
                mistake.apply(tree)
        return tree

    def __call__(self, prompt: str) -> str:
        self.calls += 1
        self.read_bytes += len(prompt.encode())
        if REFUSED_HEADING in prompt and not self.stubborn:
            retry = prompt.split(REFUSED_HEADING, 1)[1]
            feedback = retry.rsplit("```", 1)[-1]
            for mistake in list(self.made):
                if not mistake.benign and mistake.names(feedback):
                    self.made.remove(mistake)
                    self.fixed.append(mistake.kind)
        tree = _tree(self.message.to_value())
        for mistake in self.made:
            mistake.apply(tree)
        text = canonical_value(_value(tree)) if self.form == "cbcl" else \
            json.dumps(json_of(tree), ensure_ascii=False)
        kinds = {m.kind for m in self.made}
        if "fenced" in kinds:
            text = f"```{'cbcl' if self.form == 'cbcl' else 'json'}\n{text}\n```"
        if "prose" in kinds:
            text = f"Sure, here is the message you asked for:\n\n{text}\n\nLet me know."
        self.written_bytes += len(text.encode())
        return text


def json_of(tree: Tree) -> dict[str, Any]:
    """The JSON mapping of a message's tree (spec/cbcl-1.0.md §7.2), valid or not: fields
    by their names, in their order."""
    out: dict[str, Any] = {"version": str(tree[0])}
    for item in tree[1:]:
        if type(item) is list and item and type(item[0]) is Symbol:
            name = str(item[0])
            out[name] = to_json(_value(item[1])) if name == "body" else \
                str(item[1]) if type(item[1]) is not int else item[1]
    return out


# --------------------------------------------------------------------------- the loops


@dataclass
class Outcome:
    accepted: bool
    wrong: bool
    answers: int
    prompt_bytes: int
    output_bytes: int


def chunks(text: str, size: int) -> Iterator[str]:
    """``text`` as a model streams it: ``size`` characters at a time."""
    for start in range(0, len(text), size):
        yield text[start:start + size]


def cbcl_loop(model: ScriptedModel, registry: cbcl.Registry, tries: int,
              stream: int = 0) -> Outcome:
    """The CBCL loop; ``stream``: the model's answer comes in chunks of that many
    characters (read only up to the first refused token or the message's end)."""
    generate: Callable[[str], Any] = model if not stream else \
        (lambda prompt: chunks(model(prompt), stream))
    try:
        done = complete(generate, registry, intent=model.message.intent,
                        protocol=model.message.protocol, task=TASK, max_tries=tries)
    except CompletionError as error:
        attempts = error.attempts
        return Outcome(False, False, len(attempts), sum(a.prompt_bytes for a in attempts),
                       sum(a.output_bytes for a in attempts))
    attempts = done.attempts
    wrong = done.message.canonical() != canonical_value(_value(model.intended()))
    return Outcome(not wrong, wrong, len(attempts), sum(a.prompt_bytes for a in attempts),
                   sum(a.output_bytes for a in attempts))


TASK = "Send the message the conversation needs next, with the values agreed so far."


def json_loop(model: ScriptedModel, schema: dict[str, Any], tries: int) -> Outcome:
    """The loop of :func:`cbcl.llm.complete`, for JSON + JSON Schema."""
    base = ("## Messages: JSON\n\nEvery message you send is one JSON object valid under "
            "this JSON Schema. If you write anything else around it, put the object alone "
            "in a ```json code block.\n\n```json\n" + json.dumps(schema) + "\n```\n"
            f"\n## Your task\n\n{TASK}\n\nReply with one JSON message of intent "
            f"{model.message.intent.value} in protocol {model.message.protocol}.\n")
    validator = jsonschema.Draft202012Validator(schema)
    prompt = base
    prompt_bytes = output_bytes = 0
    for answer in range(1, tries + 1):
        prompt_bytes += len(prompt.encode())
        text = model(prompt)
        output_bytes += len(text.encode())
        feedback = None
        start = text.find("{")
        try:
            if start < 0:
                raise ValueError("no JSON object in the answer")
            found, _ = json.JSONDecoder().raw_decode(text, start)
        except ValueError as unreadable:
            feedback = f"not a JSON object: {unreadable}"
        else:
            invalid = jsonschema.exceptions.best_match(validator.iter_errors(found))
            if invalid is not None:
                feedback = f"at {invalid.json_path}: {invalid.message}"
        if feedback is None:
            wrong = found != json_of(model.intended())
            if not wrong:  # (and the mapping reads it back as the message)
                body = from_json(found["body"])
                wrong = canonical_value(body) != canonical_value(
                    _value(model.intended())[-1][1])
            return Outcome(not wrong, wrong, answer, prompt_bytes, output_bytes)
        quoted = text if len(text) <= 4000 else text[:4000] + "\n[… cut]"
        prompt = (f"{base}\n{REFUSED_HEADING}\n\n````\n{quoted}\n````\n\n{feedback}\n\n"
                  "Write the whole message again, corrected, and nothing else.\n")
    return Outcome(False, False, tries, prompt_bytes, output_bytes)


# --------------------------------------------------------------------------- the tasks


def targets(registry: cbcl.Registry, generated: int) -> list[cbcl.Message]:
    """The shipped examples of the loaded protocols and ``generated`` generated messages
    per body form of each protocol, each accepted by ``cbcl.parse``."""
    out: dict[str, cbcl.Message] = {}
    for path in sorted((DESCRIPTORS / "examples").glob("*.cbcl")):
        try:
            message = cbcl.parse(path.read_bytes(), registry=registry)
        except cbcl.CBCLError:
            continue
        if message.signature is None:
            out.setdefault(message.canonical(), message)
    for protocol in registry.protocols():
        groups: dict[str, list[cbcl.Intent]] = {}
        for intent, rule in protocol.descriptor.starts.items():
            groups.setdefault(rule, []).append(intent)
        for intents in groups.values():
            for text in examples(registry, protocol, intents, generated, seed=11):
                message = cbcl.parse(text, registry=registry)
                out.setdefault(message.canonical(), message)
    return list(out.values())


@dataclass
class Task:
    message: cbcl.Message
    kinds: tuple[str, ...]
    made: dict[str, Mistake]


def tasks(registry: cbcl.Registry, generated: int = 1, seed: int = 1) -> list[Task]:
    """Each target with each mistake it admits alone, then with three at once."""
    rng = random.Random(seed)
    out: list[Task] = []
    for message in targets(registry, generated):
        made = mistakes(message, registry, rng)
        for kind in KINDS:
            if kind in made:
                out.append(Task(message, (kind,), made))
        several = [k for k in ("prose", "recased", "missing", "out-of-range") if k in made]
        if len(several) >= 3:
            out.append(Task(message, tuple(several[:3]), made))
    return out


def model_for(task: Task, form: str, stubborn: bool = False) -> ScriptedModel:
    return ScriptedModel(task.message, [task.made[k] for k in task.kinds], form, stubborn)


def run(registry: cbcl.Registry, tries: int, generated: int,
        stubborn: bool = False) -> dict[str, Any]:
    schemas: dict[tuple[str, str], dict[str, Any]] = {}
    report: dict[str, Any] = {}
    for form in FORMS:
        rows: dict[str, Counter[str]] = {}
        for task in tasks(registry, generated):
            model = model_for(task, "json" if form == "json" else "cbcl", stubborn)
            if form != "json":
                outcome = cbcl_loop(model, registry, tries, STREAM if form == "cbcl-stream"
                                    else 0)
            else:
                key = (str(task.message.protocol), task.message.intent.value)
                if key not in schemas:
                    protocol = registry.get(task.message.protocol)
                    assert protocol is not None
                    schemas[key] = export_json_schema(protocol.descriptor,
                                                      intent=task.message.intent)
                outcome = json_loop(model, schemas[key], tries)
            kind = "+".join(task.kinds)
            for name in (kind if len(task.kinds) == 1 else "several", "all"):
                row = rows.setdefault(name, Counter())
                row["tasks"] += 1
                row["accepted"] += outcome.accepted
                row["wrong"] += outcome.wrong
                row["answers"] += outcome.answers
                row["prompt_bytes"] += outcome.prompt_bytes
                row["output_bytes"] += outcome.output_bytes
        report[form] = {name: dict(row) for name, row in rows.items()}
    return report


def table(report: dict[str, Any]) -> str:
    lines = ["| mistake | format | tasks | accepted | wrong | answers/accepted | "
             "output bytes/accepted | all bytes/accepted |", "|---|---|---|---|---|---|---|---|"]
    names = [name for name in report["cbcl"] if name != "all"] + ["all"]
    for name in names:
        for form in FORMS:
            row = report[form].get(name)
            if not row:
                continue
            accepted = row["accepted"]

            def per(n: int, accepted: int = accepted) -> str:
                return f"{n / accepted:,.0f}" if accepted else "—"

            lines.append(
                f"| {name} | {form} | {row['tasks']} | {accepted} "
                f"({100 * accepted / row['tasks']:.0f} %) | {row['wrong']} | "
                f"{(row['answers'] / accepted if accepted else 0):.2f} | "
                f"{per(row['output_bytes'])} | "
                f"{per(row['output_bytes'] + row['prompt_bytes'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tries", type=int, default=3)
    parser.add_argument("--generated", type=int, default=1)
    parser.add_argument("--stubborn", action="store_true",
                        help="a model that never fixes anything")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    report = run(load_registry(), args.tries, args.generated, args.stubborn)
    print(json.dumps(report, indent=1) if args.json else table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
