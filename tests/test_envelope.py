"""The envelope, pass 1 (draft §2): order, optional fields, intents, refusals."""

from __future__ import annotations

import pytest

import cbcl
from cbcl import URI, EnvelopeError, Intent, Symbol, UnknownProtocolError

HEAD = '(CBCL/1.0 (message-id "m-1") (sender agent://a) (receiver agent://b)'


QUOTED_SENDER = HEAD.replace("agent://a", '"agent://a"') + " (intent INFORM) (protocol p))"


def message(fields: str = "", intent: str = "INFORM", protocol: str = "p") -> str:
    return f"{HEAD} (intent {intent}) (protocol {protocol}){fields})"


def envelope(text: str) -> cbcl.Message:
    return cbcl.parse(text, envelope_only=True)


def refused(text: str) -> EnvelopeError:
    with pytest.raises(EnvelopeError) as info:
        envelope(text)
    assert info.value.exit_code == 3
    return info.value


def test_minimal_message_fields() -> None:
    m = envelope(message())
    assert m.message_id == "m-1"
    assert m.sender == URI("agent://a")
    assert m.receiver == URI("agent://b")
    assert m.intent is Intent.INFORM
    assert m.protocol == Symbol("p")
    assert (m.conversation_id, m.in_reply_to, m.reply_by, m.timestamp, m.body, m.signature) \
        == (None,) * 6


def test_every_optional_field() -> None:
    m = envelope(message(' (conversation-id "c") (in-reply-to "m-0") (reply-by 1700000000000)'
                         ' (timestamp 1699999999000) (body (x 1)) (signature "k1" "c2ln")'))
    assert m.conversation_id == "c"
    assert m.in_reply_to == "m-0"
    assert m.reply_by == 1_700_000_000_000
    assert m.timestamp == 1_699_999_999_000
    assert m.body == (Symbol("x"), 1)
    assert m.signature == cbcl.trust.Signature("k1", "c2ln")


@pytest.mark.parametrize("intent", [i.value for i in Intent])
def test_every_intent(intent: str) -> None:
    assert envelope(message(intent=intent)).intent.value == intent


def test_there_are_fifteen_intents() -> None:
    assert len(Intent) == 15
    assert Intent("NOT-UNDERSTOOD") is Intent.NOT_UNDERSTOOD


def test_body_is_captured_unjudged() -> None:
    body = '(anything :goes "here" 1.5 (nested (deeply)) agent://x)'
    m = envelope(message(f" (body {body})"))
    assert cbcl.canonical(m.body) == body  # type: ignore[arg-type]
    assert envelope(message(" (body 42)")).body == 42


def test_field_names_are_literals_only_where_expected() -> None:
    m = envelope(message(" (body (sender receiver body PROPOSE))", protocol="sender"))
    assert m.protocol == Symbol("sender")
    assert m.body == tuple(Symbol(s) for s in ("sender", "receiver", "body", "PROPOSE"))


@pytest.mark.parametrize(
    ("text", "column", "fragment"),
    [
        ('(CBCL/1.0 (sender agent://a) (message-id "m"))', 12,
         "expected (message-id …), found symbol sender"),
        (f"{HEAD} (protocol p) (intent INFORM))", None, "expected (intent …), found symbol protoc"),
        (f"{HEAD} (intent INFORM))", None, "expected (protocol …), found ')'"),
        (message()[:-1] + " x)", None, "expected (conversation-id …) or (in-reply-to …)"),
        (message(' (body 1) (conversation-id "c")'), None, "out of order"),
        (message(" (body 1) (body 2)"), None, "out of order"),
        (message(" (colour red)"), None, "found symbol colour"),
        (message(" (timestamp 1.5)"), None, "expected an integer"),
        (message(" (reply-by \"soon\")"), None, "expected an integer"),
        (message(" (conversation-id c)"), None, "expected a string"),
        (message(" (signature \"k\")"), None, "expected a string"),
        (message(" (signature \"k\" \"s\" \"t\")"), None, "expected ')', found a string"),
        (message(" (body)"), None, "expected a value"),
        (message(" (body 1 2)"), None, "expected ')'"),
        (message(intent="PROPOSAL"), None, "unknown intent PROPOSAL"),
        (message(intent="propose"), None, "unknown intent propose"),
        (message(protocol='"p"'), None, "expected a symbol"),
        (message() + " (x)", None, "expected the end of the input"),
        ('(CBCL/2.0 (message-id "m"))', 2, "unsupported version CBCL/2.0"),
        ('(cbcl/1.0 (message-id "m"))', 2, "expected CBCL/1.0"),
        ("CBCL/1.0", 1, "expected '('"),
        ('(CBCL/1.0 (message-id "") (sender agent://a))', 23, "must not be empty"),
        (QUOTED_SENDER, None, "expected a URI"),
        ("()", 2, "expected CBCL/1.0"),
    ],
)
def test_envelope_refusals(text: str, column: int | None, fragment: str) -> None:
    error = refused(text)
    assert fragment in error.message
    assert error.line == 1
    if column is not None:
        assert error.column == column
    assert error.context is not None


def test_refusal_position_points_at_the_offending_token() -> None:
    text = message(' (body 1) (conversation-id "c")')
    error = refused(text)
    assert text[error.column - 1 :].startswith("conversation-id")  # type: ignore[operator]


def test_malformed_text_inside_the_envelope_is_malformed_not_envelope() -> None:
    with pytest.raises(cbcl.MalformedError) as info:
        envelope(message(" (body (a 007))"))
    assert type(info.value) is cbcl.MalformedError
    assert "leading zeros" in info.value.message


def test_full_parse_of_an_unknown_protocol() -> None:
    text = message(protocol="task-assignment/v1")
    with pytest.raises(UnknownProtocolError) as info:
        cbcl.parse(text)
    error = info.value
    assert error.protocol == "task-assignment/v1"
    assert error.exit_code == 5
    assert error.column is not None
    assert text[error.column - 1 :].startswith("task-assignment/v1")
    assert isinstance(error, LookupError)


def test_message_constructor_validates_and_converts() -> None:
    m = cbcl.Message(message_id="x", sender="agent://a",
                     receiver="agent://b", intent="PROPOSE", protocol="p/v1")
    assert m.intent is Intent.PROPOSE
    assert type(m.sender) is URI and type(m.protocol) is Symbol
    bads: list[dict[str, object]] = [
        dict(message_id=""), dict(sender="nope"), dict(intent="MAYBE"), dict(reply_by=2**63),
        dict(timestamp="1"), dict(protocol="a b")]
    for bad in bads:
        fields: dict[str, object] = dict(message_id="x", sender="agent://a",
                                         receiver="agent://b", intent="PROPOSE", protocol="p")
        fields |= bad
        with pytest.raises((TypeError, ValueError)):
            cbcl.Message(**fields)  # type: ignore[arg-type]  # (a timestamp "1": on purpose)


def test_signing_bytes_exclude_the_signature() -> None:
    signed = envelope(message(' (body 1) (signature "k" "c2ln")'))
    unsigned = envelope(message(" (body 1)"))
    assert signed.signing_bytes() == unsigned.signing_bytes() == unsigned.canonical().encode()


def test_unclosed_message_counts_every_open_list() -> None:
    with pytest.raises(cbcl.MalformedError) as info:
        envelope(message()[:-1] + " (body (a (b c)")
    assert type(info.value) is cbcl.MalformedError
    assert "3 unclosed list(s)" in info.value.message


def test_field_name_without_parentheses() -> None:
    error = refused('(CBCL/1.0 message-id "m")')
    assert "must be written in parentheses" in error.message
    assert error.column == 11
