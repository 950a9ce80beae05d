"""Who sent a SPADE message, and replies made with SPADE's ``make_reply`` (issue 31 item 3;
cbcl/bridges/_spade.py, spec/interop.md §2.1 and §2.2), on SPADE's own ``Message`` objects
without a server: the body's sender against the stanza's JID (default and mapped names,
resources, patterns, no JID), the key binding with a trust store, and both reply
directions. tests/test_spade.py runs the same checks between real agents on SPADE's
XMPP server."""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, strategies as st

from cbcl import URI, CBCLError, Message, Symbol, TrustError, read
from cbcl.session._reasons import error_code
from cbcl.trust import Identity, TrustPolicy, TrustStore, sign_message

# the fipa extra (in the test extra: CI); Any: SPADE ships no types
spade_message: Any = pytest.importorskip("spade.message")
spade_template: Any = pytest.importorskip("spade.template")

from cbcl.interop import (  # noqa: E402
    ConversionError,
    LossyConversionError,
    SenderMismatchError,
    check_spade_sender,
    message_to_spade,
    spade_identity,
    spade_to_message,
)

ALICE, BOB, MALLORY = "xmpp://alice@example.org", "xmpp://bob@example.org", \
    "xmpp://mallory@example.org"
LOGGER = "cbcl.bridges._spade"


def _key(name: str) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(hashlib.sha256(f"spade-{name}".encode()).digest())


def _store() -> TrustStore:
    policy = TrustPolicy.parse(f"(trust-policy (key alice (names {ALICE})) "
                               f"(key mallory (names {MALLORY})))".encode())
    return TrustStore({name: _key(name).public_key() for name in ("alice", "mallory")}, policy)


def _request(sender: str = ALICE, receiver: str = BOB, message_id: str = "req-1",
             **fields: Any) -> Message:
    return Message(message_id=message_id, sender=sender, receiver=receiver, intent="REQUEST",
                   protocol="request/v1", conversation_id="conv-1",
                   body=read("(request :action (action :name ping))"), **fields)


def _answer(request: Message, message_id: str = "done-1") -> Message:
    return Message(message_id=message_id, sender=request.receiver, receiver=request.sender,
                   intent="INFORM", protocol=request.protocol,
                   conversation_id=request.conversation_id, in_reply_to=request.message_id,
                   body=read('(inform-result :action-id "a-1" :result 42)'))


def _from(message: Message, jid: str) -> Any:
    """``message`` as a SPADE message whose stanza came from ``jid``."""
    return message_to_spade(message, sender=jid)


# --------------------------------------------------------------------------- the JID


def test_the_sender_must_be_the_bare_jid_of_the_stanza(caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    request = _request()
    # alice's own, from any of her resources: the resource names no one
    for jid in ("alice@example.org", "alice@example.org/laptop", "Alice@Example.org/x"):
        assert spade_to_message(_from(request, jid)) == (request, [])
    caplog.set_level(logging.WARNING, logger=LOGGER)
    forged = _request(message_id="req-\x1b[31m")  # an id a terminal would obey
    with pytest.raises(SenderMismatchError) as caught:
        spade_to_message(_from(forged, "mallory@example.org/phone"))
    error = caught.value
    assert (error.jid, error.claimed, error.allowed) == ("mallory@example.org", ALICE,
                                                        (MALLORY,))
    assert error.code == error_code(error) == "malformed" and error.exit_code == 5
    [record] = [r for r in caplog.records if r.name == LOGGER]
    assert record.levelno == logging.WARNING
    line = record.getMessage()
    assert "refused message" in line and "mallory@example.org" in line and ALICE in line
    assert "\x1b" not in line and "req-\\u001b[31m" in line  # the peer's text escaped


def test_a_body_sender_with_a_resource_or_another_case_is_not_the_jid() -> None:
    # The names compare as text with xmpp://<bare JID> as slixmpp normalises it.
    for claimed in ("xmpp://alice@example.org/laptop", "xmpp://Alice@example.org"):
        with pytest.raises(SenderMismatchError):
            spade_to_message(_from(_request(sender=claimed), "alice@example.org"))


def test_no_stanza_sender_is_refused() -> None:
    unsent = spade_message.Message(to="bob@example.org", body=_request().canonical())
    with pytest.raises(SenderMismatchError, match="no XMPP sender") as caught:
        spade_to_message(unsent)
    assert caught.value.jid == "" and caught.value.allowed == ()


def test_a_mapping_gives_a_jid_agent_names() -> None:
    names = {"alice@example.org": "agent://example/alice",
             "ops@example.org": ["agent://example/ops/*", "agent://example/pager"]}
    mine = _request(sender="agent://example/alice", receiver="agent://example/bob")
    assert spade_to_message(message_to_spade(mine, sender="alice@example.org/x",
                                             to="bob@example.org"),
                            jid_names=names)[0] == mine
    # a mapped JID speaks only as its names, not as xmpp://JID any more …
    with pytest.raises(SenderMismatchError) as caught:
        spade_to_message(_from(_request(), "alice@example.org"), jid_names=names)
    assert caught.value.allowed == ("agent://example/alice",)
    # … patterns as in trust policies: one segment more than the prefix
    for sender, accepted in (("agent://example/ops/night", True),
                             ("agent://example/pager", True),
                             ("agent://example/ops", False),
                             ("agent://example/ops/a/b", False)):
        wire = message_to_spade(_request(sender=sender, receiver=BOB),
                                sender="ops@example.org", to="bob@example.org")
        if accepted:
            assert str(spade_to_message(wire, jid_names=names)[0].sender) == sender
        else:
            with pytest.raises(SenderMismatchError):
                spade_to_message(wire, jid_names=names)
    # an unmapped JID keeps its own name, and no other
    with pytest.raises(SenderMismatchError) as caught:
        spade_to_message(message_to_spade(mine, sender="mallory@example.org",
                                          to="bob@example.org"), jid_names=names)
    assert caught.value.allowed == (MALLORY,)


def test_a_callable_policy_and_an_empty_one() -> None:
    def names(jid: str) -> list[str] | None:
        return ["agent://example/ops/*"] if jid == "ops@example.org" else \
            [] if jid == "banned@example.org" else None

    ops = _request(sender="agent://example/ops/a", receiver=BOB)
    assert spade_to_message(_from(ops, "ops@example.org"), jid_names=names)[0] == ops
    assert spade_to_message(_from(_request(), "alice@example.org"), jid_names=names)[0] \
        == _request()
    banned = _request(sender="xmpp://banned@example.org")
    with pytest.raises(SenderMismatchError, match=r"\(none\)"):
        spade_to_message(_from(banned, "banned@example.org"), jid_names=names)
    with pytest.raises(ValueError, match="jid_names gives"):
        spade_to_message(_from(_request(), "alice@example.org"),
                         jid_names={"alice@example.org": "not a uri"})


def test_foreign_content_takes_the_mapped_names() -> None:
    plain = spade_message.Message(to="bob@example.org", sender="alice@example.org/r",
                                  body="hello", metadata={"performative": "inform"})
    names = {"alice@example.org": ["agent://example/team/*", "agent://example/alice"],
             "bob@example.org": "agent://example/bob"}
    message, losses = spade_to_message(plain, jid_names=names)
    assert (str(message.sender), str(message.receiver), losses) == (
        "agent://example/alice", "agent://example/bob", [])
    with pytest.raises(SenderMismatchError):  # a JID with only a pattern has no name of its own
        spade_to_message(plain, jid_names={"alice@example.org": "agent://example/team/*"})


def test_check_spade_sender_alone() -> None:
    check_spade_sender(_request(), "alice@example.org/any")
    with pytest.raises(SenderMismatchError):
        check_spade_sender(_request(), "bob@example.org")
    with pytest.raises(ConversionError, match="not a JID"):
        check_spade_sender(_request(), "a b@example.org")


# --------------------------------------------------------------------------- the key


def test_with_a_trust_store_the_jid_and_the_key_must_both_hold(
        caplog: pytest.LogCaptureFixture) -> None:
    store = _store()
    signed = sign_message(_request(), _key("alice"), "alice")
    assert spade_to_message(_from(signed, "alice@example.org"), trust=store,
                            require_signature=True)[0] == signed
    assert spade_identity(signed, trust=store, jid="alice@example.org/x") == Identity(
        "alice", "sha256:" + hashlib.sha256(_key("alice").public_key().public_bytes_raw())
        .hexdigest(), URI(ALICE), (ALICE,))
    caplog.set_level(logging.WARNING, logger=LOGGER)
    # the JID is alice's (a server that lets a client write its own `from`), the key
    # mallory's: bound to mallory's name, not alice's
    forged = sign_message(_request(message_id="req-m"), _key("mallory"), "mallory")
    with pytest.raises(TrustError) as caught:
        spade_to_message(_from(forged, "alice@example.org"), trust=store)
    assert caught.value.cause == "name-binding" and error_code(caught.value) == \
        "untrusted-signer"
    assert any("req-m" in r.getMessage() and "name" in r.getMessage()
               for r in caplog.records if r.name == LOGGER)
    # unsigned proves nothing: refused when a signature is required
    with pytest.raises(TrustError) as caught:
        spade_to_message(_from(_request(), "alice@example.org"), trust=store,
                         require_signature=True)
    assert caught.value.cause == "unsigned"
    assert spade_to_message(_from(_request(), "alice@example.org"), trust=store)[0] \
        == _request()
    # the right key from the wrong JID: the JID is checked first
    with pytest.raises(SenderMismatchError):
        spade_to_message(_from(signed, "mallory@example.org"), trust=store)
    with pytest.raises(SenderMismatchError):
        spade_identity(signed, trust=store, jid="mallory@example.org")
    with pytest.raises(ValueError, match="trust store"):
        spade_to_message(_from(signed, "alice@example.org"), require_signature=True)


# --------------------------------------------------------------------------- make_reply


def _wire_request() -> tuple[Message, Any]:
    request = _request(reply_by=1_800_000_000_000, timestamp=1_700_000_000_000)
    return request, message_to_spade(sign_message(request, _key("alice"), "alice"))


def test_make_reply_with_a_cbcl_body_is_read_as_the_body_says() -> None:
    request, wire = _wire_request()
    answer = _answer(request)
    reply = wire.make_reply()  # SPADE's idiom: metadata (performative request …) copied
    assert reply.get_metadata("performative") == "request"
    reply.body = answer.canonical()
    assert spade_to_message(reply) == (answer, [])
    # The copy is recognised by its reply-with: the message the body answers. Metadata
    # that describe no such message still must say what the body says.
    reply.set_metadata("reply-with", "someone-else")
    with pytest.raises(ConversionError, match="contradicts"):
        spade_to_message(reply)


def test_make_reply_with_plain_text_is_read_with_its_losses() -> None:
    request, wire = _wire_request()
    reply = wire.make_reply()
    reply.set_metadata("performative", "inform")
    reply.body = "pong, and more words"  # text that is no CBCL value
    with pytest.raises(LossyConversionError) as caught:
        spade_to_message(reply)
    assert "language CBCL/1.0" in caught.value.losses[0]
    message, losses = spade_to_message(reply, lossy=True)
    assert (message.intent, str(message.sender), str(message.receiver)) == (
        "INFORM", BOB, ALICE)
    assert (message.protocol, message.conversation_id, message.in_reply_to) == (
        Symbol("request/v1"), "conv-1", "req-1")
    assert message.message_id != request.message_id  # not the request's id, copied
    assert (message.reply_by, message.timestamp, message.signature) == (None, None, None)
    assert message.body == read('(fipa-content :content "pong, and more words")')
    said = " | ".join(losses)
    for copied in ("language CBCL/1.0", "reply-with req-1", "reply-by", "X-CBCL-timestamp",
                   "X-CBCL-signature-key-id", "X-CBCL-signature "):
        assert copied in said
    # text that happens to read as a CBCL value is text all the same
    reply.body = "pong"
    assert spade_to_message(reply, lossy=True)[0].body == read('(fipa-content :content "pong")')


def test_make_reply_of_a_protocol_fipa_does_not_name_keeps_the_protocol() -> None:
    request = Message(message_id="q-1", sender=ALICE, receiver=BOB, intent="QUERY",
                      protocol="lookup/v1", conversation_id="c-9", body=read("(q)"))
    reply = message_to_spade(request).make_reply()
    reply.set_metadata("performative", "inform")
    reply.body = "42"
    message, _ = spade_to_message(reply, lossy=True)
    assert (message.protocol, message.in_reply_to) == (Symbol("lookup/v1"), "q-1")


def test_a_cbcl_reply_to_a_spade_request_goes_as_make_reply_sends_it() -> None:
    asked = spade_message.Message(to="bob@example.org", sender="carol@example.org/desk",
                                  body="ping", thread="t-9",
                                  metadata={"performative": "request", "topic": "weather",
                                            "reply-by": "2026-01-01T12:00:00"})
    request, losses = spade_to_message(asked, lossy=True)
    assert str(request.sender) == "xmpp://carol@example.org" and losses
    answer = Message(message_id="ans-1", sender=request.receiver, receiver=request.sender,
                     intent="INFORM", protocol=request.protocol, in_reply_to=request.message_id,
                     body=read("(pong)"))  # no conversation id of its own
    reply = message_to_spade(answer, reply_to=asked)
    assert str(reply.to) == "carol@example.org/desk"  # the JID it came from, resource too
    assert str(reply.sender) == "bob@example.org" and reply.thread == "t-9"
    assert reply.get_metadata("topic") == "weather"  # kept: a SPADE template matches on it
    assert reply.get_metadata("performative") == "inform"
    assert reply.get_metadata("reply-by") is None  # the request's, not the answer's
    assert spade_to_message(reply) == (answer, [])
    # a SPADE template waiting for the answer matches it
    template = spade_template.Template(thread="t-9", metadata={"topic": "weather",
                                                               "performative": "inform"})
    assert template.match(reply)
    with pytest.raises(ConversionError, match="no sender JID"):
        message_to_spade(answer, reply_to=spade_message.Message(to="bob@example.org",
                                                                body="x"))


# --------------------------------------------------------------------------- hostile input

_KEYS = st.sampled_from(["performative", "protocol", "conversation-id", "reply-with",
                         "in-reply-to", "reply-by", "language", "ontology", "encoding",
                         "X-CBCL-timestamp", "X-CBCL-signature", "X-CBCL-protocol",
                         "X-CBCL-intent", "creation-timestamp", "topic"])
_VALUES = st.one_of(st.sampled_from(["request", "inform", "query", "CBCL/1.0", "request/v1",
                                     "fipa-request", "req-1", "20260101T000000000Z",
                                     "2026-01-01T12:00:00", "NOTIFY", ""]),
                    st.text(max_size=20))
_BODIES = st.one_of(st.text(max_size=60),
                    st.builds(lambda tail: _request().canonical()[:len(tail) * 4] + tail,
                              st.text(max_size=20)),
                    st.just(_answer(_request()).canonical()))


@given(body=_BODIES, metadata=st.dictionaries(_KEYS, _VALUES, max_size=8),
       sender=st.sampled_from(["alice@example.org", "bob@example.org/r", ""]),
       lossy=st.booleans(), mapped=st.booleans())
def test_any_spade_message_reads_or_is_refused_with_a_cbcl_error(
        body: str, metadata: dict[str, str], sender: str, lossy: bool, mapped: bool) -> None:
    wire = spade_message.Message(to="bob@example.org", sender=sender or None, body=body,
                                 thread="t-1", metadata=metadata)
    names = {"alice@example.org": ["agent://example/a/*", "agent://example/alice"]}
    try:
        message, losses = spade_to_message(wire, lossy=lossy,
                                           jid_names=names if mapped else None)
    except CBCLError:
        return
    assert lossy or losses == []
    check_spade_sender(message, sender, jid_names=names if mapped else None)
