"""Repair hints (issue 16): every refusal as a short instruction — where, what was found,
what is accepted there, the template of the enclosing list — alike for text and binary.

Uses one internal: the hint index's cache, emptied."""

from __future__ import annotations

import io
import sys
import unicodedata

import pytest
from test_keyword_sets import AUCTION, descriptor, message

import cbcl
from cbcl import BodyError, CBCLError, EnvelopeError, Registry
from cbcl.cli import main
from cbcl.protocol._hints import _index

BID = "(bid :item STRING :amount NUMBER :bidder URI [:note STRING])"


@pytest.fixture(scope="module")
def registry() -> Registry:
    reg = Registry(disk_cache=False, isolate=False)
    reg.load(descriptor(AUCTION), allow_unsigned=True)
    return reg


def refused(registry: Registry, intent: str, body: str) -> tuple[BodyError, BodyError]:
    """The text refusal and the binary one of the same body."""
    text = message(intent, body)
    with pytest.raises(BodyError) as by_text:
        cbcl.parse(text, registry=registry)
    frame = cbcl.Encoder(registry, validate=False).encode(
        cbcl.parse(text, registry=registry, envelope_only=True))
    with pytest.raises(BodyError) as by_binary:
        cbcl.decode(frame, registry=registry)
    return by_text.value, by_binary.value


@pytest.mark.parametrize(("intent", "body", "fix", "template"), [
    ("PROPOSE", '(bid :item "lamp" :amount 5 :bidder agent://x :amount 6)',
     "Remove the second :amount", BID),
    ("PROPOSE", '(bid :item "lamp" :bidder agent://x)',
     "Add the missing :amount (each with its value) to the (bid …) list.", BID),
    ("PROPOSE", '(bid :Item "lamp" :amount 5 :bidder agent://x)',
     "Write :item, not :Item: names are case-sensitive.", BID),
    ("PROPOSE", '(bid :item "lamp" :amount 5 :biddr agent://x)', "Write :bidder, not :biddr",
     BID),
    ("PROPOSE", '(bids :item "lamp" :amount 5 :bidder agent://x)', "Write bid, not bids", BID),
    ("ACCEPT", '(bid :item "lamp" :amount 5 :bidder agent://x)',
     "(bid …) is the body of PROPOSE messages",
     "(award :item STRING :price NUMBER [:terms <terms>])"),
    ("ACCEPT", '(award :item "lamp" :price 5 :terms (terms :days x))', "",
     "(terms :days INTEGER [:via SYMBOL] <terms>*)"),
    ("ACCEPT", "5", "", "(award :item STRING :price NUMBER [:terms <terms>])"),
    ("PROPOSE", '(bid :item "lamp" :amount "5" :bidder agent://x)', "", BID),
])
def test_body_hints_name_the_fix_and_the_template(registry: Registry, intent: str, body: str,
                                                  fix: str, template: str) -> None:
    by_text, by_binary = refused(registry, intent, body)
    for error in (by_text, by_binary):
        hint = error.hint()
        assert hint.startswith("The body was refused at ")
        assert f"Accepted there: {' or '.join(error.expected)}." in hint
        assert fix in hint, hint
        assert f"    {template}" in hint, hint
    assert f"line {by_text.line}, column {by_text.column}" in by_text.hint()
    assert by_text.context is not None and by_text.context.split("\n")[0] in by_text.hint()
    assert f"at byte {by_binary.offset}" in by_binary.hint()
    assert by_text.hint().split("Found:", 1)[1] == by_binary.hint().split("Found:", 1)[1]


def test_keyword_sets_say_any_order_and_where(registry: Registry) -> None:
    error, _ = refused(registry, "ACCEPT", '(award :item "lamp" :price 5 :terms 7)')
    hint = error.hint()
    assert "Keyword arguments come in any order, each at most once" in hint
    assert "<terms> is: (terms :days INTEGER [:via SYMBOL] <terms>*)" in hint


def test_a_missing_body_gets_the_intents_template(registry: Registry) -> None:
    text = message("PROPOSE", "x").replace(" (body x)", "")
    with pytest.raises(BodyError) as caught:
        cbcl.parse(text, registry=registry)
    assert f"    {BID}" in caught.value.hint()
    frame = cbcl.Encoder(registry, validate=False).encode(
        cbcl.parse(text, registry=registry, envelope_only=True))
    with pytest.raises(BodyError) as caught:
        cbcl.decode(frame, registry=registry)
    assert f"    {BID}" in caught.value.hint()


def test_templates_are_computed_only_when_asked(registry: Registry) -> None:
    _index.cache_clear()
    error, _ = refused(registry, "PROPOSE", '(bid :item "lamp")')
    assert _index.cache_info().currsize == 0  # raising read no grammar
    error.hint()
    assert _index.cache_info().currsize == 1


@pytest.mark.parametrize(("text", "words"), [
    ('(CBCL/1.0 (message_id "m") (sender agent://a) (receiver agent://b) (intent INFORM) '
     "(protocol p))", "Write (message-id …), not (message_id …)"),
    ('(CBCL/1.0 (message-id "m") (sender agent://a) (receiver agent://b) (intent inform) '
     "(protocol p))", "Write one of the intents: PROPOSE"),
    ('(CBCL/1.1 (message-id "m"))', "Start the message with (CBCL/1.0"),
    ('(CBCL/1.0 (message-id "") (sender agent://a))', "non-empty string"),
])
def test_envelope_hints_show_the_envelope(text: str, words: str) -> None:
    with pytest.raises(EnvelopeError) as caught:
        cbcl.parse(text, envelope_only=True)
    hint = caught.value.hint()
    assert words in hint, hint
    assert "  [(conversation-id STRING)]" in hint


@pytest.mark.parametrize(("text", "kind", "words"), [
    ('(CBCL/1.0 (message-id "m"', cbcl.MalformedError, "incomplete"),
    ("(CBCL/1.0 007)", cbcl.MalformedError, "CBCL text"),
    ("x" * 2000, cbcl.LimitError, "exceeds the limit max_message_bytes"),
])
def test_other_refusals_have_hints(text: str, kind: type[CBCLError], words: str) -> None:
    with pytest.raises(kind) as caught:
        cbcl.parse(text, envelope_only=True, limits=cbcl.Limits(max_message_bytes=1000))
    assert words in caught.value.hint()


def test_unknown_protocol_hint() -> None:
    with pytest.raises(cbcl.UnknownProtocolError) as caught:
        cbcl.parse(message("PROPOSE", "x", ident="nope/v1"))
    assert "no descriptor for nope/v1" in caught.value.hint()


def _invisible(hint: str) -> list[str]:
    return [c for c in hint if c != "\n" and (unicodedata.category(c) in
                                             ("Cc", "Cf", "Zl", "Zp", "Co", "Cn"))]


def test_hints_escape_what_came_from_the_input(registry: Registry) -> None:
    body = '(bid :item "a\u200bb\\u202e" :amount "x\\u202e\u200b" :bidder agent://x)'
    for error in refused(registry, "PROPOSE", body):
        hint = error.hint()
        assert _invisible(hint) == [], hint
    with pytest.raises(EnvelopeError) as caught:
        cbcl.parse('(CBCL/1.0 (message-id "m") (sender "a\u200b\\u202e") (receiver agent://b) '
                   "(intent INFORM) (protocol p))", envelope_only=True)
    assert _invisible(caught.value.hint()) == []


def test_cli_parse_hint(registry: Registry, monkeypatch: pytest.MonkeyPatch,
                        capsys: pytest.CaptureFixture[str], tmp_path: object) -> None:
    from pathlib import Path

    directory = Path(str(tmp_path))
    (directory / "auction.cbcl").write_bytes(descriptor(AUCTION))
    data = message("PROPOSE", '(bid :item "lamp" :amount 5)').encode()
    args = ["parse", "-", "--descriptor", str(directory / "auction.cbcl"), "--allow-unsigned"]
    for extra in ([], ["--hint"]):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
        code = main([*args, *extra])
        out, err = capsys.readouterr()
        assert (code, out) == (3, "")
        lines = err.splitlines()
        assert lines[0].startswith("body 1:")
        if extra:
            assert "Add the missing :bidder" in err and f"    {BID}" in err
        else:
            assert len(lines) == 1
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"(CBCL/1.0 007)")))
    assert main(["parse", "-", "--envelope-only", "--hint"]) == 3
    assert "CBCL text" in capsys.readouterr().err
