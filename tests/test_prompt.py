"""Prompts (issue 16): the system-prompt section for a protocol — the envelope, each body
shape from the grammar, and examples every one of which ``cbcl.parse`` accepts."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_keyword_sets import AUCTION, descriptor

import cbcl
from cbcl import Intent, Registry
from cbcl.cli import main
from cbcl.llm import render_prompt

ROOT = Path(__file__).parent.parent
SHIPPED = sorted(p for p in (ROOT / "descriptors").glob("*.cbcl")
                 if not p.name.endswith(".signed.cbcl"))


@pytest.fixture(scope="module")
def registry() -> Registry:
    reg = Registry(disk_cache=False, isolate=False)
    for path in SHIPPED:
        reg.load(path.read_bytes(), allow_unsigned=True)
    reg.load(descriptor(AUCTION), allow_unsigned=True)
    return reg


def examples_of(prompt: str) -> list[str]:
    block = prompt.split("```cbcl\n", 1)[1].split("\n```", 1)[0]
    return block.splitlines()


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_example_is_accepted(registry: Registry, path: Path) -> None:
    protocol = registry.get(cbcl.descriptor.read_descriptor(path.read_bytes()).id)
    assert protocol is not None
    prompt = render_prompt(protocol, registry=registry, count=2)
    texts = examples_of(prompt)
    assert texts
    intents = set()
    for text in texts:
        message = cbcl.parse(text, registry=registry)
        assert message.protocol == protocol.id
        intents.add(message.intent)
    assert intents == set(protocol.descriptor.intents)  # an example for every intent
    assert render_prompt(protocol, registry=registry, count=2) == prompt  # deterministic


def test_body_shapes_are_rendered_from_the_grammar(registry: Registry) -> None:
    protocol = registry.get(cbcl.Symbol("contract-net/v1"))
    assert protocol is not None
    prompt = render_prompt(protocol, registry=registry)
    assert "- PROPOSE: (proposal :task-id STRING :bid <bid> [:valid-until INTEGER])" in prompt
    assert ("- <bid> is: (bid :price NUMBER :currency {EUR | USD | GBP | CHF | JPY} "
            "[:eta INTEGER])") in prompt  # the schema's one-of, in the grammar's form
    # (rule names derived from the declaration, spec/declarations.md §3)
    assert "- REFUSE: (refuse :task-id STRING :reason <refusal_reason>)" in prompt
    assert "- <refusal_reason> is: busy | unqualified | deadline-too-short | <other>" in prompt
    assert "- <other> is: (other STRING)" in prompt
    assert "- <task_params> is: ({KEYWORD VALUE}*)" in prompt
    assert "may come in any order, each at most once" in prompt
    assert "(CBCL/1.0\n  (message-id STRING)" in prompt
    assert "\n  (conversation-id STRING)\n" in prompt  # required: it has a machine
    assert "- in proposed: ACCEPT from the manager -> awarded" in prompt
    assert '- CANCEL: no body, or a reason STRING ("why").' in prompt


def test_a_form_says_which_keywords_have_a_fixed_place(registry: Registry) -> None:
    """Keyword sets take their members in any order, an ordered declaration's members do
    not (spec/declarations.md): the prompt must not tell a model otherwise."""
    def prompt_of(name: str) -> str:
        protocol = registry.get(cbcl.Symbol(name))
        assert protocol is not None
        return render_prompt(protocol, registry=registry)

    canon = prompt_of("canon-a/v1")
    assert ("- FAILURE: (error :message STRING [:code INTEGER])  "
            "(keyword arguments in this order)") in canon
    assert "- QUERY: (query weather [:city STRING] [:date STRING] [:unit " in canon
    assert "[:unit {celsius | fahrenheit | kelvin}])\n" in canon  # a keyword set: no note
    assert "unless a form says which have a fixed place" in canon
    task = prompt_of("task-assignment/v1")
    assert "(:id in the place shown, the others in any order)" in task
    assert "(keyword arguments in this order)" not in prompt_of("contract-net/v1")  # sets


def test_one_intent(registry: Registry) -> None:
    protocol = registry.get(cbcl.Symbol("auction/v1"))
    assert protocol is not None
    prompt = render_prompt(protocol, registry=registry, intent=Intent.PROPOSE, count=3)
    assert "- PROPOSE: (bid :item STRING :amount NUMBER :bidder URI [:note STRING])" in prompt
    assert "ACCEPT:" not in prompt
    texts = examples_of(prompt)
    assert 1 <= len(texts) <= 3
    assert all(cbcl.parse(t, registry=registry).intent == Intent.PROPOSE for t in texts)
    with pytest.raises(ValueError, match="does not govern QUERY"):
        render_prompt(protocol, registry=registry, intent=Intent.QUERY)


def test_shared_start_rule_lists_its_forms() -> None:
    # canon-a/v1 version 2 (hand-written, kept in descriptors/history): its five intents
    # share the start rule body (version 3, declared, gives each its own).
    registry = Registry(disk_cache=False, isolate=False)
    protocol = registry.load((ROOT / "descriptors" / "history" / "canon-a-v1.version-2.cbcl")
                             .read_bytes(), allow_unsigned=True)
    prompt = render_prompt(protocol, registry=registry)
    assert "- QUERY, REQUEST, INFORM, REFUSE, FAILURE: one of\n  - (query weather" in prompt
    heads = {str(cbcl.parse(t, registry=registry).body[0])  # type: ignore[index]
             for t in examples_of(prompt)}
    assert len(heads) >= 3  # examples of several forms, not one


def test_cli_prompt(capsys: pytest.CaptureFixture[str]) -> None:
    signed = ROOT / "descriptors" / "contract-net-v1.signed.cbcl"
    assert main(["prompt", str(signed), "--intent", "CFP", "--examples", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("## Messages: CBCL/1.0, protocol contract-net/v1\n")
    assert "- CFP: (cfp :task <task> :deadline INTEGER [:round INTEGER])" in out
    assert out.endswith("```\n")
    with pytest.raises(SystemExit) as caught:
        main(["prompt", str(signed), "--intent", "BOGUS"])
    assert caught.value.code == 2
    with pytest.raises(SystemExit) as caught:
        main(["prompt", str(signed), "--intent", "QUERY"])
    assert caught.value.code == 2
    assert "does not govern QUERY" in capsys.readouterr().err


def test_cli_extract(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    text = ('Sure:\n```cbcl\n(CBCL/1.0 (message-id "m-1") (sender agent://a) (receiver '
            "agent://b) (intent ACCEPT) (protocol contract-net/v1) (body (accept-proposal "
            ':task-id "t-1")))\n```\n')
    source = tmp_path / "out.txt"
    source.write_text(text)
    options = ["--descriptor", str(ROOT / "descriptors" / "contract-net-v1.cbcl"),
               "--allow-unsigned"]
    assert main(["extract", str(source), *options]) == 0
    assert capsys.readouterr().out.startswith('(CBCL/1.0 (message-id "m-1")')
    assert main(["extract", str(source), "--json", *options]) == 0
    record = json.loads(capsys.readouterr().out)
    assert text[record["start"]:record["end"]] == record["text"]
    assert [d["kind"] for d in record["dropped"]] == ["prose", "fence", "fence"]
    source.write_text(text.replace(":task-id", ":taskId"))
    assert main(["extract", str(source), "--hint", *options]) == 3
    err = capsys.readouterr().err
    assert err.startswith("body 3:")
    assert "Write :task-id, not :taskId" in err
    assert main(["extract", str(source), *options]) == 3
    assert capsys.readouterr().err.count("\n") == 1


def test_a_body_that_is_not_one_value_gives_no_examples() -> None:
    registry = Registry(disk_cache=False, isolate=False)
    protocol = registry.load(descriptor("body: SYMBOL SYMBOL\n", intents="INFORM",
                                        ident="pair/v1"), allow_unsigned=True)
    prompt = render_prompt(protocol, registry=registry)
    assert "- INFORM: SYMBOL SYMBOL" in prompt
    assert "### Examples" not in prompt


DECLARED = """(protocol-declaration (id lab/v1) (version 1)
  (intent REQUEST
    (record sample
      (:sample-id (string :min-length 3 :max-length 12) required)
      (:assay (one-of cbc hba1c lipids tsh) required)
      (:priority (integer :min 1 :max 5) required)
      (:fasting boolean)
      (:tubes (list-of (record tube (:colour (one-of red blue)) (:ml (decimal :min 0.5)))
                       :min-length 1 :max-length 2)))))"""


def test_the_prompt_follows_the_declaration() -> None:
    """What the schema says beyond the grammar is in the prompt (one-of values in the
    form, ranges and lengths as field values), there is no conversation-id without a
    machine, and the examples carry values in range."""
    registry = Registry(disk_cache=False, isolate=False)
    registry.load(cbcl.descriptor_from_declaration(DECLARED), allow_unsigned=True)
    protocol = registry.get(cbcl.Symbol("lab/v1"))
    assert protocol is not None
    prompt = render_prompt(protocol, registry=registry, count=3)
    assert ("- REQUEST: (sample :sample-id STRING :assay {cbc | hba1c | lipids | tsh} "
            ":priority INTEGER [:fasting {true | false}] [:tubes <request_tubes>])") in prompt
    assert ("- (sample …): :sample-id a STRING of 3 to 12 characters; :assay one of cbc, "
            "hba1c, lipids, tsh; :priority an INTEGER from 1 to 5; :fasting true or false; "
            ":tubes a list of 1 to 2 elements, each (tube …)") in prompt
    assert "- (tube …): :colour one of red, blue; :ml a DECIMAL of at least 0.5" in prompt
    assert "[(conversation-id STRING)]" in prompt and "### The conversation" not in prompt
    texts = examples_of(prompt)
    assert len(texts) == 3
    for text in texts:
        body = cbcl.parse(text, registry=registry).body
        assert body is not None
        fields = cbcl.Fields(body)
        priority = fields["priority"]
        assert type(priority) is int and 1 <= priority <= 5
        assert str(fields["assay"]) in ("cbc", "hba1c", "lipids", "tsh")


def test_fit_to_schema_repairs_what_it_can() -> None:
    from cbcl.llm._prompt import fit_to_schema
    from cbcl.protocol._schema import compile_schema

    schema = compile_schema(cbcl.read(
        '(schema (record r (:n (integer :min 5 :max 7)) (:s (string :min-length 2)) '
        '(:o (one-of a b)) (:b boolean) (:u (uri :scheme agent)) (:l (list-of integer '
        ':max-length 1)) (:k (keys (:x (decimal :max 0))))))'))
    body = cbcl.read('(r :n 99 :s "" :o zz :b maybe :u https://x :l (1 2 3) :k (:x 4.5) '
                     ':other 1)')
    fitted = fit_to_schema(schema, body)
    assert cbcl.canonical(fitted) == (
        '(r :n 5 :s "example" :o a :b true :u agent://example/peer :l (1) :k (:x 0.0) '
        ':other 1)')
    assert fit_to_schema(schema, cbcl.read("(q :n 1)")) == cbcl.read("(q :n 1)")
