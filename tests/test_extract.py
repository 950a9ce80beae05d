"""Extraction (issue 16): the CBCL message(s) in a model's output, found and never repaired;
and the failure corpus of ``benchmarks/llm_failures.py`` in small."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given, settings, strategies as st

import cbcl
from cbcl import CBCLError, LimitError, MalformedError, Registry, extract
from cbcl.llm import EXTRACT_INPUT_FACTOR

ROOT = Path(__file__).parent.parent
MESSAGE = ('(CBCL/1.0 (message-id "m-1") (sender agent://a) (receiver agent://b) '
           '(intent PROPOSE) (protocol contract-net/v1) (body (proposal :task-id "t-1" '
           ':bid (bid :price 12.50 :currency EUR))))')
OTHER = MESSAGE.replace('"m-1"', '"m-2"').replace("12.50", "9")


@pytest.fixture(scope="module")
def registry() -> Registry:
    reg = Registry(disk_cache=False, isolate=False)
    reg.load((ROOT / "descriptors" / "contract-net-v1.cbcl").read_bytes(), allow_unsigned=True)
    return reg


def one(text: str, registry: Registry) -> cbcl.Message:
    found = extract(text, registry=registry)
    assert len(found) == 1
    item = found[0]
    assert item.text == MESSAGE and text[item.start:item.end] == MESSAGE  # never rewritten
    return item.message


@pytest.mark.parametrize("text", [
    MESSAGE,
    f"```cbcl\n{MESSAGE}\n```",
    f"```\n{MESSAGE}\n```",
    f"~~~lisp\n{MESSAGE}\n~~~\n",
    f"Sure! Here it is:\n\n```cbcl\n{MESSAGE}\n```\n\nAnything else?",
    f"Here it is: {MESSAGE}. Done.",
    f"I send\n{MESSAGE}\n",
    f"```cbcl\n; a comment\n{MESSAGE}  ; the proposal\n```",
    f"   ```cbcl\n{MESSAGE}\n   ```",
    f"```cbcl\n{MESSAGE}",  # a fence never closed runs to the end
])
def test_finds_the_message_as_written(registry: Registry, text: str) -> None:
    message = one(text, registry)
    assert message == cbcl.parse(MESSAGE, registry=registry)


def test_dropped_spans_name_the_prose_and_the_fences(registry: Registry) -> None:
    text = f"Here:\n```cbcl\n{MESSAGE}\n```\nBye."
    (item,) = extract(text, registry=registry)
    assert [(span.kind, span.text) for span in item.dropped] == [
        ("prose", "Here:"), ("fence", "```cbcl"), ("fence", "```"), ("prose", "Bye.")]
    for span in item.dropped:
        assert text[span.start:span.end] == span.text


def test_several_messages_each_with_the_text_before_it(registry: Registry) -> None:
    text = f"First:\n```cbcl\n{MESSAGE}\n```\nthen\n{OTHER}\nend"
    first, second = extract(text, registry=registry)
    assert (first.text, second.text) == (MESSAGE, OTHER)
    assert [s.text for s in first.dropped] == ["First:", "```cbcl"]
    assert [s.text for s in second.dropped] == ["```", "then", "end"]


def test_parentheses_in_strings_and_comments_do_not_end_a_message(registry: Registry) -> None:
    message = MESSAGE.replace('"t-1"', '"t) (x ```"').replace(":bid", "; ) ) )\n:bid")
    (item,) = extract(f"```\n{message}\n```", registry=registry)
    assert item.text == message


def test_envelope_only_needs_no_registry() -> None:
    (item,) = extract(f"text {MESSAGE} text", envelope_only=True)
    assert str(item.message.protocol) == "contract-net/v1"


@pytest.mark.parametrize(("text", "kind", "where", "words"), [
    ("no message here", MalformedError, None, "Reply with a CBCL message"),
    ('```json\n{"version": "CBCL/1.0", "message-id": "m"}\n```', MalformedError, "{",
     "S-expression"),
    (f"```\n{MESSAGE[:120]}\n```", MalformedError, "(body (\n", "incomplete"),
    (f"x\n{MESSAGE[:-1]}", MalformedError, None, "incomplete"),
    (f"```\n{MESSAGE[:70]}", MalformedError, None, "incomplete"),
    (f"```\n{MESSAGE.replace(':currency', ':Currency')}\n```", cbcl.BodyError,
     ":Currency", "Write :currency, not :Currency"),
    (f"Hi\n  {MESSAGE.replace('(intent PROPOSE)', '(intent PROPOSAL)')}", cbcl.EnvelopeError,
     "PROPOSAL", "PROPOSE ACCEPT"),
    (f"{MESSAGE.replace('CBCL/1.0', 'cbcl/1.0')}", cbcl.EnvelopeError, "cbcl/", "(CBCL/1.0"),
    (f'{MESSAGE} (signature "k" "s"))', MalformedError, "(signature", "parentheses"),
    (f"```\n{MESSAGE}\nand some words\n```", MalformedError, "and some",
     "alone in its code block"),
    (f"```\n{MESSAGE.replace('12.50', '1e5')}\n```", MalformedError, "1e5", "CBCL text"),
])
def test_anything_but_a_whole_valid_message_is_an_error_with_a_hint(
        registry: Registry, text: str, kind: type[CBCLError], where: str | None,
        words: str) -> None:
    with pytest.raises(kind) as caught:
        extract(text, registry=registry)
    error = caught.value
    if where is not None:  # positions are in the whole output, not in the candidate
        index = text.index(where) + (len(where) - 2 if where.endswith("\n") else 0)
        line = text.count("\n", 0, index) + 1
        column = index - (text.rfind("\n", 0, index) + 1) + 1
        assert (error.line, error.column) == (line, column), error.one_line()
        assert error.context is not None and "^" in error.context
    assert words in error.hint(), error.hint()


def test_a_position_is_moved_into_the_whole_input_with_its_byte_offset(
        registry: Registry) -> None:
    prefix = "Résumé ✓\n```cbcl\n  "
    text = prefix + MESSAGE.replace(":bid", ":bod")
    with pytest.raises(cbcl.BodyError) as caught:
        extract(text, registry=registry)
    index = text.index(":bod")
    assert caught.value.offset == len(text[:index].encode())
    assert (caught.value.line, caught.value.column) == (3, index - text.rindex("\n", 0, index))


def test_limits(registry: Registry) -> None:
    limits = cbcl.Limits(max_message_bytes=1000)
    with pytest.raises(LimitError):
        extract("x" * (EXTRACT_INPUT_FACTOR * 1000 + 1), limits=limits)
    extract("x" * (EXTRACT_INPUT_FACTOR * 1000 - len(MESSAGE)) + MESSAGE, limits=limits,
            registry=registry)
    with pytest.raises(LimitError) as caught:
        extract(" ".join([MESSAGE] * 3), registry=registry, max_messages=2)
    assert caught.value.limit == "max_messages"
    with pytest.raises(LimitError):  # one message over the message limit
        extract(MESSAGE.replace('"t-1"', '"' + "t" * 2000 + '"'), registry=registry,
                limits=limits)
    with pytest.raises(ValueError):
        extract(MESSAGE, max_input_bytes=0)
    with pytest.raises(TypeError):
        extract(42)  # type: ignore[arg-type]


def test_bytes_in_and_bad_utf8(registry: Registry) -> None:
    assert extract(f"é {MESSAGE}".encode(), registry=registry)[0].text == MESSAGE
    with pytest.raises(MalformedError) as caught:
        extract(b"abc \xff " + MESSAGE.encode(), registry=registry)
    assert caught.value.offset == 4


@pytest.mark.parametrize("text", [
    "(CBCL/" * 40_000, "(" * 200_000, "```\n" * 50_000, "(CBCL/1.0 " + '"' * 100_000,
    "( " * 100_000 + "CBCL/", "(\n" * 100_000, ("a" * 1000 + "\n") * 200,
    "```cbcl\n" + "(CBCL/1.0 (" * 20_000, ";" * 200_000 + "(CBCL/1.0",
    '{"version":' * 20_000,
])
def test_hostile_input_is_refused_quickly(registry: Registry, text: str) -> None:
    began = time.process_time()
    with pytest.raises(CBCLError):
        extract(text, registry=registry)
    assert time.process_time() - began < 3


PIECES = st.sampled_from(["```", "```cbcl\n", "\n", " ", "(", ")", '"', "\\", ";", "CBCL/1.0",
                          "(CBCL/1.0 ", MESSAGE, MESSAGE[:50], "{", ":bid", "\u202e", "\x00",
                          "prose "])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(PIECES, st.text(max_size=8)), max_size=12))
def test_any_text_gives_messages_or_a_cbcl_error(registry: Registry, pieces: list[str]) -> None:
    text = "".join(pieces)
    try:
        found = extract(text, registry=registry)
    except CBCLError as exc:
        exc.hint()  # always renders
        return
    for item in found:
        assert text[item.start:item.end] == item.text
        assert cbcl.parse(item.text, registry=registry) == item.message


# --------------------------------------------------------------------------- the corpus


def _bench() -> ModuleType:
    path = ROOT / "benchmarks" / "llm_failures.py"
    spec = importlib.util.spec_from_file_location("llm_failures", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["llm_failures"] = module
    spec.loader.exec_module(module)
    return module


def test_failure_corpus_small() -> None:
    result = _bench().measure(limit=12, generated=1)
    total = result["all"]
    assert total["wrong"] == 0 and total["crash"] == 0
    for kind in ("fenced", "prose", "fenced-in-prose", "several"):
        assert result[kind]["recovered"] == sum(
            result[kind][o] for o in ("recovered", "accepted-equivalent", "refused-with-fix",
                                      "refused-no-fix", "wrong", "crash")), kind
    for kind in ("keyword-renamed", "keyword-recased", "field-renamed", "json", "truncated"):
        row = result[kind]
        assert row["refused-with-fix"] >= 0.9 * sum(row.values()), (kind, row)
    assert result["keywords-reordered"]["accepted-equivalent"] > 0
