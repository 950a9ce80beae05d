"""The sans-io negotiation session (spec/negotiation.md): two sessions wired in memory, fed
whole and one byte at a time; replays, stale messages; a tampering middleman never gets a
silent downgrade (a hypothesis state machine over the handshake's steps).

Tests internals too: the handshake machine's tables (``cbcl.session._negotiation``) and the
Finished and rejection values."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import cbcl
from cbcl import LocalProtocolError, RemoteProtocolError, Session, TrustStore, sign_descriptor
from cbcl.binary import frame
from cbcl.session import (
    NEED_DATA,
    Accepted,
    ConnectionClosed,
    Established,
    Event,
    HandshakeState,
    NotUnderstood,
    Offer,
    ProtocolMessage,
    Query,
    Rejected,
    Unsupported,
)
from cbcl.session._negotiation import (
    END_OF_STREAM,
    FINAL,
    ON_FAILURE,
    TRANSITIONS,
    HandshakeMachine,
)
from cbcl.session._session import finished_value, reject_reason

ROOT = Path(__file__).parent.parent
NOW = 1_764_500_000_000
KEY = Ed25519PrivateKey.generate()
OTHER_KEY = Ed25519PrivateKey.generate()
STORE = TrustStore({"demo": KEY.public_key()})
# contract-net/v1's hand-written version 1 (descriptors/history) and the shipped version 2,
# built from its declaration (spec/declarations.md §4).
V1 = (ROOT / "descriptors" / "history" / "contract-net-v1.version-1.cbcl").read_bytes()
V2 = (ROOT / "descriptors" / "contract-net-v1.cbcl").read_bytes()
SIGNED_V1 = sign_descriptor(V1, [("demo", KEY)])
SIGNED_V2 = sign_descriptor(V2, [("demo", KEY)])
DIGEST_V1 = "sha256:" + hashlib.sha256(V1).hexdigest()
DIGEST_V2 = "sha256:" + hashlib.sha256(V2).hexdigest()
A_URI, B_URI = "agent://test/a", "agent://test/b"


def initiator(payload: bytes = V2, **options: Any) -> Session:
    registry = cbcl.Registry(disk_cache=False, isolate=False)
    registry.load(payload, allow_unsigned=True)
    options.setdefault("signing_key", ("demo", KEY))
    return Session("initiator", registry=registry, me=A_URI, peer=B_URI, **options)


def responder(**options: Any) -> Session:
    registry = cbcl.Registry(trust=STORE, disk_cache=False, isolate=False)
    options.setdefault("require_signed_finished", True)
    return Session("responder", registry=registry, me=B_URI, **options)


def query(digest: str = DIGEST_V2, version: int = 2,
          encodings: tuple[str, ...] = ("binary", "text")) -> Query:
    return Query("contract-net/v1", digest, (version,), encodings)


@dataclass
class SessionPair:
    """Two sessions wired in memory. ``chunk`` bytes are fed at a time (0: whole)."""

    a: Session
    b: Session
    chunk: int = 0
    now: int = NOW
    events: dict[str, list[Event]] = field(default_factory=lambda: {"a": [], "b": []})

    def feed(self, to: Session, data: bytes) -> list[Event]:
        pieces = [data] if not self.chunk else [data[i:i + self.chunk]
                                                for i in range(0, len(data), self.chunk)]
        got: list[Event] = []
        for piece in pieces:
            to.receive_data(piece)
            while (event := to.next_event(now=self.now)) is not NEED_DATA:
                assert isinstance(event, Event), event  # (not NEED_WORK: no work is deferred)
                got.append(event)
        self.events["a" if to is self.a else "b"] += got
        return got

    def exchange(self) -> None:
        """Deliver what each side produced by itself until both are quiet."""
        while True:
            to_b, to_a = self.a.data_to_send(), self.b.data_to_send()
            if not to_b and not to_a:
                return
            if to_b:
                self.feed(self.b, to_b)
            if to_a:
                self.feed(self.a, to_a)

    def handshake(self, q: Query | None = None, document: bytes = SIGNED_V2) -> None:
        self.feed(self.b, self.a.send(q or query(), now=self.now))
        self.exchange()
        if self.a.state is HandshakeState.UNSUPPORTED:
            self.feed(self.b, self.a.send(Offer(document), now=self.now))
            self.exchange()


def step_after(event: Event) -> str:
    """The state a :class:`ProtocolMessage` moved its conversation to."""
    assert isinstance(event, ProtocolMessage) and event.step is not None, event
    return str(event.step.after)


def cfp(number: int = 1) -> cbcl.Message:
    return cbcl.Message(message_id=f"cn-{number}", sender=A_URI, receiver=B_URI,
                        intent="CFP", protocol="contract-net/v1", conversation_id="job-1",
                        body=cbcl.read(b'(cfp :task (task :id "t1" :action render) '
                                       b":deadline 5)"))


def propose(in_reply_to: str = "cn-1") -> cbcl.Message:
    return cbcl.Message(message_id="b-1", sender=B_URI, receiver=A_URI, intent="PROPOSE",
                        protocol="contract-net/v1", conversation_id="job-1",
                        in_reply_to=in_reply_to,
                        body=cbcl.read(b'(proposal :task-id "t1" :bid (bid :price 1.0 '
                                       b":currency EUR))"))


# --------------------------------------------------------------------------- the machine


def test_the_table_is_data_and_an_unknown_row_is_an_error() -> None:
    assert (HandshakeState.IDLE, "initiator", "supports") in TRANSITIONS
    machine = HandshakeMachine()
    with pytest.raises(cbcl.ProtocolError, match="not allowed in state IDLE"):
        machine.advance("responder", "supported")
    assert machine.state is HandshakeState.ERROR
    with pytest.raises(cbcl.ProtocolError):
        machine.advance("initiator", "supports")  # nothing leaves ERROR


def _spec_section_3() -> list[list[str]]:
    text = (ROOT / "spec" / "negotiation.md").read_text(encoding="utf-8")
    section = text[text.index("## 3. States"):text.index("The descriptor's `(conversation")]
    return [[cell.strip() for cell in line.strip("|").split("|")]
            for line in section.splitlines() if line.startswith("| ")][1:]  # no header


def test_the_tables_are_section_3_of_the_spec() -> None:
    messages: dict[tuple[HandshakeState, str, str], HandshakeState] = {}
    ends: dict[HandshakeState, HandshakeState] = {}
    failure: HandshakeState | None = None
    for state, event, sender, target in _spec_section_3():
        after = HandshakeState[target.removesuffix(" (final)")]
        if event == "end of stream":
            names = [n.split(" (")[0] for n in state.split(", ")]
            for name in names if names != ["any other"] else []:
                ends[HandshakeState[name]] = after
            if names == ["any other"]:
                other = after
        elif state == "any":
            failure = after
        elif event == "a message of the agreed protocol":
            for role in ("initiator", "responder"):
                messages[(HandshakeState[state], role, "message")] = after
        else:
            messages[(HandshakeState[state], sender, event)] = after
    assert messages == TRANSITIONS
    assert failure is ON_FAILURE
    assert set(END_OF_STREAM) == set(HandshakeState)
    for ending, after in END_OF_STREAM.items():
        # A state the spec does not name ends in ERROR, a final one stays what it is.
        expected = ends.get(ending, ending if ending in FINAL and ending is not
                            HandshakeState.REJECTED else other)
        assert after is expected, ending


def test_no_message_leaves_a_final_state_and_the_machine_only_reads_tables() -> None:
    assert not [row for row in TRANSITIONS if row[0] in FINAL]
    assert all(END_OF_STREAM[state] in FINAL for state in FINAL)
    for state in HandshakeState:
        machine = HandshakeMachine()
        machine.state = state
        assert machine.close() is END_OF_STREAM[state]
        machine.state = state
        machine.fail()
        assert machine.state is ON_FAILURE


def test_rejected_then_the_end_of_the_stream_is_closed() -> None:
    """spec/negotiation.md §3: the initiator was refused and the stream then ends: a clean
    end, CLOSED, on both sides."""
    pair = SessionPair(initiator(), responder())
    pair.handshake(document=sign_descriptor(V2, [("stranger", OTHER_KEY)]))
    assert pair.events["a"][-1] == Rejected("untrusted-signer")
    assert pair.a.state is pair.b.state is HandshakeState.REJECTED
    for side in (pair.a, pair.b):
        side.receive_data(b"")
        assert isinstance(side.next_event(now=NOW), ConnectionClosed)
        assert side.state is HandshakeState.CLOSED
    assert pair.a.data_to_send() == pair.b.data_to_send() == b""
    # Closing from our side after a rejection is clean too.
    pair = SessionPair(initiator(), responder())
    pair.handshake(document=sign_descriptor(V2, [("stranger", OTHER_KEY)]))
    assert pair.a.send(ConnectionClosed(), now=NOW) == b""
    assert pair.a.state is HandshakeState.CLOSED


# --------------------------------------------------------------------------- handshakes


@pytest.mark.parametrize("chunk", [0, 1])
@pytest.mark.parametrize("encodings", [("text",), ("binary", "text")])
def test_offer_then_conversation(chunk: int, encodings: tuple[str, ...]) -> None:
    pair = SessionPair(initiator(), responder(), chunk=chunk)
    pair.handshake(query(encodings=encodings))
    kinds_a = [type(e).__name__ for e in pair.events["a"]]
    kinds_b = [type(e).__name__ for e in pair.events["b"]]
    assert kinds_a == ["Unsupported", "Accepted", "Finished", "Established"]
    assert kinds_b == ["Query", "Offer", "Accepted", "Finished", "Established"]
    assert pair.a.state is pair.b.state is HandshakeState.ESTABLISHED
    assert pair.a.encoding == pair.b.encoding == encodings[0]
    assert pair.a.transcript_digest == pair.b.transcript_digest
    accepted = pair.events["b"][2]
    assert isinstance(accepted, Accepted) and accepted.signers == ("demo",)
    # The conversation runs, tracked on both sides.
    (got,) = pair.feed(pair.b, pair.a.send(ProtocolMessage(cfp()), now=NOW))
    assert step_after(got) == "called"
    (got,) = pair.feed(pair.a, pair.b.send(ProtocolMessage(propose()), now=NOW))
    assert step_after(got) == "proposed"
    # The stream ends in the middle of the conversation: an error, named.
    pair.b.receive_data(b"")
    with pytest.raises(RemoteProtocolError, match=r"conversation \"job-1\" \(in state "
                       r"proposed\)") as caught:
        pair.b.next_event(now=NOW)
    assert caught.value.code == "closed"


def test_a_clean_end_of_stream() -> None:
    pair = SessionPair(initiator(), responder())
    pair.handshake()
    pair.b.receive_data(b"")
    assert isinstance(pair.b.next_event(now=NOW), ConnectionClosed)
    assert pair.b.state is HandshakeState.CLOSED


def test_supported_needs_no_offer() -> None:
    b = responder()
    b.registry.load(SIGNED_V2, now=NOW)
    pair = SessionPair(initiator(), b)
    pair.handshake()
    assert [type(e).__name__ for e in pair.events["a"]] == [
        "Supported", "Finished", "Established"]
    assert pair.a.state is pair.b.state is HandshakeState.ESTABLISHED


def test_unsupported_names_the_known_versions_and_rollback_is_rejected() -> None:
    b = responder()
    b.registry.load(SIGNED_V2, now=NOW)
    pair = SessionPair(initiator(V1), b)
    pair.feed(pair.b, pair.a.send(query(DIGEST_V1, 1), now=NOW))
    pair.exchange()
    (answer,) = pair.events["a"]
    assert answer == Unsupported("contract-net/v1", (2,))
    pair.feed(pair.b, pair.a.send(Offer(SIGNED_V1), now=NOW))
    pair.exchange()
    assert pair.events["a"][-1] == Rejected("rollback")
    assert pair.a.state is pair.b.state is HandshakeState.REJECTED
    protocol = pair.b.registry.get("contract-net/v1")
    assert protocol is not None and protocol.descriptor.version == 2  # unchanged


@pytest.mark.parametrize(("document", "reason"), [
    (SIGNED_V2.replace(b'(sig "demo" "', b'(sig "demo" "A', 1)[:-0 or None], None),
    (sign_descriptor(V2, [("demo", OTHER_KEY)]), "bad-signature"),
    (sign_descriptor(V2, [("stranger", OTHER_KEY)]), "untrusted-signer"),
])
def test_refused_offers_carry_a_reason_code(document: bytes, reason: str | None) -> None:
    if reason is None:  # one changed signature character
        text = SIGNED_V2.decode()
        sig = re.search(r'\(sig "demo" "(.)', text)
        assert sig is not None
        swap = "B" if sig.group(1) == "A" else "A"
        document = (text[:sig.start(1)] + swap + text[sig.end(1):]).encode()
        reason = "bad-signature"
    pair = SessionPair(initiator(), responder())
    pair.handshake(document=document)
    assert pair.events["a"][-1] == Rejected(reason)
    detail = pair.events["b"][-1]
    assert isinstance(detail, Rejected) and detail.detail  # local detail, never sent
    assert pair.b.registry.get("contract-net/v1") is None


def test_reject_reasons_map_every_refusal() -> None:
    def trust(cause: str, reason: str = "any wording at all") -> cbcl.TrustError:
        return cbcl.TrustError("descriptor verification failed", reason=reason, cause=cause)

    # The cause decides the code, never the wording of the reason.
    assert reject_reason(trust("rollback")) == "rollback"
    assert reject_reason(trust("equivocation")) == "equivocation"
    assert reject_reason(trust("expired")) == "expired"
    assert reject_reason(trust("bad-signature", "rollback: looks like one")) == "bad-signature"
    assert reject_reason(trust("untrusted", "expired: looks like one")) == "untrusted-signer"
    assert reject_reason(cbcl.GrammarError("x")) == "grammar-refused"
    assert reject_reason(cbcl.LimitError("x", limit="max_depth", maximum=1)) == "limit"
    assert reject_reason(cbcl.DescriptorError("x")) == "malformed"


def test_a_grammar_over_the_responders_limits_is_refused() -> None:
    from cbcl.descriptor import GrammarLimits

    registry = cbcl.Registry(trust=STORE, disk_cache=False, isolate=False,
                             grammar_limits=GrammarLimits(max_rules=4))
    pair = SessionPair(initiator(), Session("responder", registry=registry, me=B_URI))
    pair.handshake()
    assert pair.events["a"][-1] == Rejected("grammar-refused")
    assert registry.get("contract-net/v1") is None


# --------------------------------------------------------------------------- errors


def test_garbage_gets_not_understood_and_error() -> None:
    b = responder()
    b.receive_data(frame(b"(CBCL/1.0 (message-id"))
    with pytest.raises(RemoteProtocolError) as caught:
        b.next_event(now=NOW)
    assert caught.value.code == "malformed" and caught.value.exit_code == 3
    assert b.state is HandshakeState.ERROR
    reply = b.data_to_send()
    assert b"NOT-UNDERSTOOD" in reply and b'(body "malformed")' in reply
    with pytest.raises(LocalProtocolError):
        b.next_event(now=NOW)
    # The other side hears it as NotUnderstood.
    a = initiator()
    a.send(query(), now=NOW)
    reply = reply.replace(b"agent://anonymous", A_URI.encode(), 1)
    a.receive_data(frame(reply[4:].replace(b"agent://anonymous", B_URI.encode())))
    got = a.next_event(now=NOW)
    assert isinstance(got, (NotUnderstood, type(NEED_DATA))) or a.state is HandshakeState.ERROR


def test_a_frame_over_the_limit_is_refused_before_it_is_read() -> None:
    b = responder(max_frame_bytes=100)
    b.receive_data((1000).to_bytes(4, "big"))
    with pytest.raises(RemoteProtocolError) as caught:
        b.next_event(now=NOW)
    assert caught.value.code == "limit" and caught.value.exit_code == 4


def test_too_many_pending_frames() -> None:
    a, b = initiator(), responder(max_pending_frames=2)
    data = a.send(query(), now=NOW)
    b.receive_data(data * 3)
    with pytest.raises(RemoteProtocolError, match="frames are waiting"):
        b.next_event(now=NOW)


def test_a_replayed_message_is_refused() -> None:
    a, b = initiator(), responder()
    data = a.send(query(), now=NOW)
    b.receive_data(data)
    assert isinstance(b.next_event(now=NOW), Query)
    b.receive_data(data)
    with pytest.raises(RemoteProtocolError) as caught:
        b.next_event(now=NOW)
    assert caught.value.code == "replay"


@pytest.mark.parametrize("skew", [30_001, -30_001])
def test_a_stale_message_is_refused(skew: int) -> None:
    a, b = initiator(), responder(max_skew_ms=30_000)
    b.receive_data(a.send(query(), now=NOW + skew))
    with pytest.raises(RemoteProtocolError) as caught:
        b.next_event(now=NOW)
    assert caught.value.code == "stale"


def test_inside_the_skew_window_is_fresh() -> None:
    a, b = initiator(), responder(max_skew_ms=30_000)
    b.receive_data(a.send(query(), now=NOW - 30_000))
    assert isinstance(b.next_event(now=NOW), Query)


def test_a_replayed_conversation_message_is_refused() -> None:
    pair = SessionPair(initiator(), responder())
    pair.handshake()
    data = pair.a.send(ProtocolMessage(cfp()), now=NOW)
    pair.feed(pair.b, data)
    with pytest.raises(RemoteProtocolError) as caught:
        pair.feed(pair.b, data)
    assert caught.value.code == "replay"


def test_a_message_out_of_its_conversation_is_refused_locally() -> None:
    pair = SessionPair(initiator(), responder())
    pair.handshake()
    with pytest.raises(cbcl.ConversationError, match="conversation"):
        pair.b.send(ProtocolMessage(propose()), now=NOW)  # no CFP yet
    # Nothing was sent and nothing changed: the session goes on.
    assert pair.b.state is HandshakeState.ESTABLISHED
    assert pair.b.data_to_send() == b""
    (got,) = pair.feed(pair.b, pair.a.send(ProtocolMessage(cfp()), now=NOW))
    assert step_after(got) == "called"
    (got,) = pair.feed(pair.a, pair.b.send(ProtocolMessage(propose()), now=NOW))
    assert step_after(got) == "proposed"


@pytest.mark.parametrize(("body", "error"), [
    (b'(cfp :task (task :id "t1" :action render) :deadline "soon")', cbcl.BodyError),
    (b'(cfp :task (task :id "" :action render) :deadline 1)', cbcl.SchemaError),
    (b'(cfp :task (task :id "t1" :action render) :deadline 1 :round 101)', cbcl.SchemaError),
])
def test_an_outgoing_message_the_protocol_refuses_is_not_sent(
        body: bytes, error: type[Exception]) -> None:
    pair = SessionPair(initiator(), responder())
    pair.handshake()
    message = cfp()
    wrong = cbcl.Message(message_id="cn-9", sender=message.sender, receiver=message.receiver,
                         intent=message.intent,
                         protocol=message.protocol, conversation_id="job-9",
                         body=cbcl.read(body))
    with pytest.raises(error):
        pair.a.send(ProtocolMessage(wrong), now=NOW)
    assert pair.a.state is HandshakeState.ESTABLISHED
    assert pair.a.data_to_send() == b""
    assert pair.a.tracker is not None and pair.a.tracker.get("job-9", B_URI) is None
    # The same message unchecked (a trusted hot path) is sent, and the peer refuses it.
    trusting = SessionPair(initiator(validate_outgoing=False), responder())
    trusting.handshake()
    data = trusting.a.send(ProtocolMessage(wrong), now=NOW)
    assert data
    trusting.b.receive_data(data)
    with pytest.raises(RemoteProtocolError):
        trusting.b.next_event(now=NOW)


def test_sending_out_of_turn_is_a_local_error() -> None:
    a = initiator()
    with pytest.raises(LocalProtocolError):
        a.send(Offer(SIGNED_V2), now=NOW)
    assert a.state is HandshakeState.ERROR
    with pytest.raises(LocalProtocolError):
        responder().send(query(), now=NOW)


def test_closing_mid_handshake_is_an_error() -> None:
    a = initiator()
    a.send(query(), now=NOW)
    a.receive_data(b"")
    with pytest.raises(RemoteProtocolError, match="closed the connection in state ASKED"):
        a.next_event(now=NOW)


def test_an_unsigned_finished_is_refused_when_signatures_are_required() -> None:
    pair = SessionPair(initiator(signing_key=None), responder())
    with pytest.raises(RemoteProtocolError) as caught:
        pair.handshake()
    assert caught.value.code == "untrusted-signer"
    assert pair.b.state is HandshakeState.ERROR


def test_a_finished_with_malformed_signature_text_is_bad_signature() -> None:
    """spec/negotiation.md §4: malformed signature text is ``bad-signature``, in a
    NOT-UNDERSTOOD to a Finished as in a rejected offer (one table decides both)."""
    pair = SessionPair(initiator(), responder())
    pair.feed(pair.b, pair.a.send(query(), now=NOW))
    pair.feed(pair.a, pair.b.data_to_send())
    pair.feed(pair.b, pair.a.send(Offer(SIGNED_V2), now=NOW))
    pair.feed(pair.a, pair.b.data_to_send())
    finished = pair.a.data_to_send()
    changed = frame(re.sub(rb'\(signature "demo" "[^"]*"\)', b'(signature "demo" "abc")',
                           finished[4:]))
    assert changed != finished
    with pytest.raises(RemoteProtocolError) as caught:
        pair.feed(pair.b, changed)
    assert caught.value.code == "bad-signature"
    assert b'"bad-signature"' in pair.b.data_to_send()


def test_a_middleman_who_recomputes_the_finished_is_caught_by_its_signature() -> None:
    """An unkeyed hash can be recomputed: the signature over A's Finished is what stops an
    active middleman who changed the question (here: stripped binary)."""
    a, b = initiator(), responder()
    original = a.send(query(), now=NOW)
    changed = frame(original[4:].replace(b"(binary text)", b"(text)"))
    b.receive_data(changed)
    b.next_event(now=NOW)
    a.receive_data(b.data_to_send())
    a.next_event(now=NOW)
    offer = a.send(Offer(SIGNED_V2), now=NOW)
    b.receive_data(offer)
    while b.next_event(now=NOW) is not NEED_DATA:
        pass
    a.receive_data(b.data_to_send())
    while a.next_event(now=NOW) is not NEED_DATA:
        pass
    finished = a.data_to_send()
    # The middleman puts in the value B expects; A's signature no longer matches.
    expected = finished_value(b.transcript_digest, "initiator")
    forged = re.sub(rb'sha256:[0-9a-f]{64}', expected.encode(), finished[4:])
    b.receive_data(frame(forged))
    with pytest.raises(RemoteProtocolError) as caught:
        while b.next_event(now=NOW) is not NEED_DATA:
            pass
    assert caught.value.code == "bad-signature"
    assert b.state is HandshakeState.ERROR


# --------------------------------------------------------------------------- middleman


TAMPERS = ("strip-versions", "strip-encodings", "swap-digest", "replay-old-offer",
           "flip-byte", "swap-encoding")


def tamper(data: bytes, how: str, where: int) -> bytes:
    payload = data[4:]
    if how == "strip-versions":
        payload = re.sub(rb":versions \([0-9 ]*\)", b":versions ()", payload)
    elif how == "strip-encodings":
        payload = payload.replace(b"(binary text)", b"(text)")
    elif how == "swap-digest":
        payload = payload.replace(DIGEST_V2.encode(), DIGEST_V1.encode())
    elif how == "swap-encoding":
        payload = payload.replace(b":encoding binary", b":encoding text")
    elif how == "replay-old-offer" and b"(offer " in payload:
        old = cbcl.canonical(SIGNED_V1.decode()).encode()
        payload = re.sub(rb':descriptor "(?:[^"\\]|\\.)*"',
                         lambda _: b":descriptor " + old, payload)
        payload = payload.replace(DIGEST_V2.encode(), DIGEST_V1.encode())
    elif how == "flip-byte":
        index = where % len(payload)
        payload = payload[:index] + bytes([payload[index] ^ 0x20]) + payload[index + 1:]
    return frame(payload)


def only_the_message_id(original: bytes, changed: bytes) -> bool:
    """Whether ``changed`` is B's Finished, ``original``, with another message id and
    nothing else. That Finished is in no transcript, and the id of an unsigned one is read
    only by the replay window (spec/negotiation.md §5), so a middleman may change it
    without changing what is agreed; every other change, the id of any other handshake
    message included (each is in the transcript), must keep the two sides from both
    reaching ESTABLISHED."""
    try:
        before = cbcl.parse(original[4:], envelope_only=True)
        after = cbcl.parse(changed[4:], envelope_only=True)
    except cbcl.CBCLError:
        return False
    finished = type(before.body) is tuple and before.body[:1] == (cbcl.Symbol("finished"),)
    return finished and before.sender == cbcl.URI(B_URI) and \
        before.message_id != after.message_id and \
        replace(before, message_id=after.message_id) == after


class Handshake(RuleBasedStateMachine):
    """A and B negotiate through a middleman who may change any handshake frame."""

    def __init__(self) -> None:
        super().__init__()
        # Fixed nonces: hypothesis replays a run from its drawn data alone, and a random
        # nonce made the same flipped byte land on a different character in each replay.
        self.a = initiator(nonce="0123456789abcdef" * 2)
        self.b = responder(nonce="fedcba9876543210" * 2)
        self.to_b: list[bytes] = []
        self.to_a: list[bytes] = []
        self.tampered = False
        self.tampered_to_a_last = False
        self.failed = False
        self.asked: Query | None = None

    @precondition(lambda self: self.a.state is HandshakeState.IDLE)
    @rule(encodings=st.sampled_from([("binary", "text"), ("text",), ("binary",)]))
    def ask(self, encodings: tuple[str, ...]) -> None:
        self.asked = query(encodings=encodings)
        self.to_b.append(self.a.send(self.asked, now=NOW))

    @precondition(lambda self: self.a.state is HandshakeState.UNSUPPORTED and not self.to_b)
    @rule()
    def offer(self) -> None:
        self.to_b.append(self.a.send(Offer(SIGNED_V2), now=NOW))

    def _deliver(self, to: Session, queue: list[bytes], back: list[bytes], how: str | None,
                 where: int, bytewise: bool) -> None:
        data = queue.pop(0)
        if how is not None:
            changed = tamper(data, how, where)
            if changed != data:
                self.tampered = self.tampered or not only_the_message_id(data, changed)
                data = changed
        if self.failed or to.state in (HandshakeState.ERROR, HandshakeState.REJECTED):
            return
        try:
            for piece in ([data[i:i + 1] for i in range(len(data))] if bytewise else [data]):
                to.receive_data(piece)
                while to.next_event(now=NOW) is not NEED_DATA:
                    pass
        except (RemoteProtocolError, LocalProtocolError):
            self.failed = True
        back.extend(p for p in [to.data_to_send()] if p)

    @precondition(lambda self: bool(self.to_b))
    @rule(how=st.none() | st.sampled_from(TAMPERS), where=st.integers(0, 10_000),
          bytewise=st.booleans())
    def deliver_to_b(self, how: str | None, where: int, bytewise: bool) -> None:
        self._deliver(self.b, self.to_b, self.to_a, how, where, bytewise)

    @precondition(lambda self: bool(self.to_a))
    @rule(how=st.none() | st.sampled_from(TAMPERS), where=st.integers(0, 10_000),
          bytewise=st.booleans())
    def deliver_to_a(self, how: str | None, where: int, bytewise: bool) -> None:
        before = self.tampered
        self._deliver(self.a, self.to_a, self.to_b, how, where, bytewise)
        self.tampered_to_a_last = self.tampered and not before

    @rule()
    def wait(self) -> None:
        """The middleman holds everything back (always possible)."""

    @invariant()
    def never_a_silent_downgrade(self) -> None:
        both = self.a.state is self.b.state is HandshakeState.ESTABLISHED
        if self.tampered:
            assert not both, "a tampered handshake was established on both sides"
        for side in (self.a, self.b):
            if side.state is HandshakeState.ESTABLISHED:
                assert side.protocol is not None and side.protocol.digest == DIGEST_V2
                assert self.asked is not None and side.encoding == self.asked.encodings[0]
        if not self.tampered:
            assert not self.failed
            assert HandshakeState.ERROR not in (self.a.state, self.b.state)

    @invariant()
    def a_rejected_offer_loads_nothing(self) -> None:
        if self.b.state in (HandshakeState.REJECTED, HandshakeState.ERROR) \
                and self.b.protocol is None:
            loaded = self.b.registry.get("contract-net/v1")
            assert loaded is None or loaded.digest == DIGEST_V2


Handshake.TestCase.settings = settings(stateful_step_count=15)  # the profile's examples
TestHandshake = Handshake.TestCase


def test_established_event_fields() -> None:
    pair = SessionPair(initiator(), responder())
    pair.handshake(query(encodings=("text",)))
    assert pair.events["a"][-1] == Established("contract-net/v1", DIGEST_V2, 2, "text")


# --------------------------------------------------------------------------- failure answers


def _failure(message_id: str, in_reply_to: str | None, body: str = "handler-failed",
             conversation: str | None = "job-1") -> cbcl.Message:
    return cbcl.Message(message_id=message_id, sender=B_URI, receiver=A_URI,
                        intent="NOT-UNDERSTOOD", protocol="contract-net/v1",
                        conversation_id=conversation, in_reply_to=in_reply_to, body=body,
                        timestamp=NOW)


def test_a_not_understood_that_answers_a_message_is_in_its_conversation() -> None:
    """spec/negotiation.md §6.3: once ESTABLISHED, a NOT-UNDERSTOOD of the agreed protocol
    that names the message it answers is a message of that conversation (checked by the
    machine both ways, state unchanged) and ends nothing; one without in-reply-to still
    ends the session."""
    pair = SessionPair(initiator(), responder())
    pair.handshake()
    pair.feed(pair.b, pair.a.send(ProtocolMessage(cfp()), now=NOW))
    (got,) = pair.feed(pair.a, pair.b.send(ProtocolMessage(
        _failure("nu-1", "cn-1", "handler-timeout: no answer within 1 s")), now=NOW))
    assert isinstance(got, ProtocolMessage)
    assert got.failure == ("handler-timeout", "no answer within 1 s")
    assert got.step is not None and str(got.step.before) == str(got.step.after) == "called"
    assert pair.a.state is pair.b.state is HandshakeState.ESTABLISHED
    # The conversation goes on: the proposal still comes, in reply to the call.
    (got,) = pair.feed(pair.a, pair.b.send(ProtocolMessage(propose()), now=NOW))
    assert isinstance(got, ProtocolMessage) and got.failure is None
    assert step_after(got) == "proposed"
    # One that answers no message of the thread is refused before it leaves.
    with pytest.raises(cbcl.ConversationError):
        pair.b.send(ProtocolMessage(_failure("nu-2", "nowhere")), now=NOW)
    assert pair.b.state is HandshakeState.ESTABLISHED
    # Without in-reply-to it is the session's end, as it always was.
    pair.a.receive_data(pair.b.send(ProtocolMessage(_failure("nu-3", None)), now=NOW))
    ended = pair.a.next_event(now=NOW)
    assert isinstance(ended, NotUnderstood) and ended.reason == "handler-failed"
    assert pair.a.state.value == HandshakeState.ERROR.value  # (mypy narrowed it above)


def test_a_failure_for_a_message_not_of_the_thread_ends_the_session() -> None:
    pair = SessionPair(initiator(), responder())
    pair.handshake(query(encodings=("text",)))
    pair.feed(pair.b, pair.a.send(ProtocolMessage(cfp()), now=NOW))
    # Written past the responder's own checks: the initiator's machine refuses it.
    pair.a.receive_data(frame(_failure("nu-9", "cn-77").canonical().encode()))
    with pytest.raises(RemoteProtocolError) as caught:
        pair.a.next_event(now=NOW)
    assert caught.value.code == "conversation"
