"""cbcl._native.SessionState against the Python reference (issue 30 item 1).

An established binary session keeps its per-message state natively where the extension is
built (cbcl/_native_src/session.c); the reference path (``Session._use_native = False``) is
the contract. A hypothesis state machine drives two pairs of sessions, one native and one
reference, with the same random conversations — sends the machine allows and refuses,
replies to unknown and own messages, reused ids, CANCEL, reply-by deadlines passing,
finished conversations, NOT-UNDERSTOOD — and with frames made by hand past the sender's
checks (replays, wrong parties, stale timestamps, illegal intents), and compares every
outcome (bytes, events, steps, error types, texts and codes) and every state (the replay
window, the conversations, the finished ids) at small bounds, where they are reached."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import cbcl
from cbcl import Registry
from cbcl.binary import Encoder, frame
from cbcl.core._values import Keyword, Symbol
from cbcl.protocol._conversation import ConversationTracker
from cbcl.protocol._message import Intent, Message
from cbcl.session import NEED_DATA, HandshakeState, ProtocolMessage, Query, Session

_native = pytest.importorskip("cbcl._native")

ROOT = Path(__file__).parent.parent
NOW = 1_764_500_000_000
CLIENT, SERVER, OTHER = "agent://t/client", "agent://t/server", "agent://t/other"
REGISTRY = Registry(disk_cache=False, isolate=False)
PROTOCOL = REGISTRY.load((ROOT / "descriptors" / "request-v1.cbcl").read_bytes(),
                         allow_unsigned=True)
ENCODER = Encoder(REGISTRY, validate=False)
WINDOW, MAX_OPEN, SKEW = 4, 3, 1000

BODIES: dict[Intent, Any] = {
    Intent.REQUEST: (Symbol("request"), Keyword("action"),
                     (Symbol("action"), Keyword("name"), Symbol("snapshot"))),
    Intent.AGREE: (Symbol("agree"), Keyword("action-id"), "a"),
    Intent.REFUSE: (Symbol("refuse"), Keyword("action-id"), "a", Keyword("reason"), "no"),
    Intent.FAILURE: (Symbol("failure"), Keyword("action-id"), "a", Keyword("reason"), "no"),
    Intent.INFORM: (Symbol("inform-done"), Keyword("action-id"), "a"),
    Intent.CANCEL: "stop",
    Intent.NOT_UNDERSTOOD: "what?",
}


def established(native: bool, *, nonces: tuple[str, str] = ("a" * 32, "b" * 32),
                **options: Any) -> tuple[Session, Session]:
    """A client and a server session, binary, ESTABLISHED at NOW."""
    options = {"replay_window": WINDOW, "max_conversations": MAX_OPEN,
               "max_skew_ms": SKEW, **options}
    client = Session("initiator", registry=REGISTRY, me=CLIENT, peer=SERVER,
                     encodings=("binary",), nonce=nonces[0], **options)
    server = Session("responder", registry=REGISTRY, me=SERVER, encodings=("binary",),
                     nonce=nonces[1], **options)
    if not native:
        client._use_native = server._use_native = False
    pending = {server: client.send(Query(str(PROTOCOL.id), PROTOCOL.digest, (),
                                         ("binary",)), now=NOW), client: b""}
    while any(pending.values()):
        for to, other in ((server, client), (client, server)):
            if pending[to]:
                to.receive_data(pending[to])
                while to.next_event(now=NOW) is not NEED_DATA:
                    pass
            pending[to] = b""
            pending[other] += to.data_to_send()
    assert client.state is server.state is HandshakeState.ESTABLISHED
    assert (client._native is not None) is native and (server._native is not None) is native
    return client, server


def outcome_of(call: Any) -> tuple[Any, ...]:
    try:
        return ("ok", call())
    except cbcl.CBCLError as exc:
        return ("error", type(exc).__name__, str(exc), getattr(exc, "code", None))


def receive(session: Session, data: bytes, now: int) -> tuple[Any, ...]:
    session.receive_data(data)
    got = outcome_of(lambda: session.next_event(now=now))
    return (*got, session.data_to_send(), session.state)


def kind(outcome: tuple[Any, ...] | None) -> str:
    """An outcome's kind, for the statistics: ok, or the error's class and code."""
    if outcome is None:
        return "-"
    if outcome[0] == "ok":
        return "ok " + type(outcome[1]).__name__
    return f"{outcome[1]} {outcome[3]}"


def state_of(session: Session) -> object:
    """What the session keeps between messages (read through the reference's forms)."""
    tracker = session.tracker  # (a native session's is brought up to date here)
    assert isinstance(tracker, ConversationTracker)
    threads = [(t.conversation_id, t.state, dict(t.agents), t.deadline, t.history,
                dict(t._seen)) for t in tracker.conversations()]
    return (session.state, list(session._seen), threads, dict(tracker._initiators),
            dict(tracker._protocols), list(tracker._finished), session.last_sent_step)


def message(sender: str, receiver: str, intent: Intent, *, mid: str, cid: str | None,
            in_reply_to: str | None = None, reply_by: int | None = None,
            timestamp: int | None = None) -> Message:
    return Message(message_id=mid, sender=sender, receiver=receiver, intent=intent,
                   protocol=PROTOCOL.id, conversation_id=cid, in_reply_to=in_reply_to,
                   reply_by=reply_by, timestamp=timestamp, body=BODIES[intent])


INTENTS = st.sampled_from(sorted(BODIES, key=lambda i: i.value))
CIDS = st.sampled_from(["c0", "c1", "c2", "c3", "c4", None])


class NativeAgainstReference(RuleBasedStateMachine):
    """Two pairs (native, reference) fed the same conversations: the same outcomes and the
    same state after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.now = NOW
        self.ids: list[str] = []
        self.counter = 0
        self.fresh()

    def fresh(self) -> None:
        self.native = established(True)
        self.reference = established(False)

    def pairs(self) -> list[tuple[Session, Session]]:
        return [self.native, self.reference]

    def new_id(self, reuse: int) -> str:
        """A fresh id, or (``reuse`` below 20) one used before."""
        if reuse < 20 and self.ids:
            return self.ids[reuse % len(self.ids)]
        self.counter += 1
        mid = f"m-{self.counter}"
        self.ids.append(mid)
        return mid

    @rule(from_server=st.booleans(), intent=INTENTS, cid=CIDS,
          reuse=st.integers(0, 100), reply=st.none() | st.integers(0, 50),
          reply_by=st.none() | st.integers(-500, 2000))
    def send(self, from_server: bool, intent: Intent, cid: str | None, reuse: int,
             reply: int | None, reply_by: int | None) -> None:
        """One side sends; the other receives what was sent."""
        sender, receiver = (SERVER, CLIENT) if from_server else (CLIENT, SERVER)
        mid = self.new_id(reuse)
        in_reply_to = None if reply is None or not self.ids else self.ids[reply % len(self.ids)]
        m = message(sender, receiver, intent, mid=mid, cid=cid, in_reply_to=in_reply_to,
                    reply_by=None if reply_by is None else self.now + reply_by)
        outcomes = []
        for client, server in self.pairs():
            out, to = (server, client) if from_server else (client, server)
            sent = outcome_of(lambda out=out: out.send(ProtocolMessage(m), now=self.now))
            delivered = receive(to, sent[1], self.now) if sent[0] == "ok" else None
            outcomes.append((sent, out.state, delivered))
        assert outcomes[0] == outcomes[1]
        event(f"send: {kind(sent)}, receive: {kind(delivered)}")
        self.again_if_failed()

    @rule(cid=st.sampled_from(["c0", "c1", "c2", "c3", "c4"]), pick=st.integers(0, 10),
          late=st.booleans())
    def follow(self, cid: str, pick: int, late: bool) -> None:
        """The next message of conversation ``cid`` as the machine allows it (a REQUEST to
        start it), replying to its last message, sometimes with a reply-by: long valid
        conversations, so the bounds are reached."""
        tracker = self.reference[0].tracker
        assert tracker is not None
        thread = tracker.get(cid, SERVER)
        if thread is None:
            self.send(False, Intent.REQUEST, cid, 100, None, 50 if late else None)
            return
        allowed = thread.machine.allowed(thread.state)
        if not allowed:
            return
        intent, role = allowed[pick % len(allowed)]
        last = thread.history[-1].message_id
        self.send(role != thread.machine.initiator, intent, cid, 100,
                  self.ids.index(last), None)

    @rule(to_server=st.booleans(), intent=INTENTS, cid=CIDS,
          reuse=st.integers(0, 100), reply=st.none() | st.integers(0, 50),
          tamper=st.sampled_from(["none", "sender", "receiver", "stale", "no-timestamp",
                                  "skew-edge", "replay"]))
    def inject(self, to_server: bool, intent: Intent, cid: str | None, reuse: int,
               reply: int | None, tamper: str) -> None:
        """A frame made by hand, past the sender's checks, received by one side."""
        sender, receiver = (CLIENT, SERVER) if to_server else (SERVER, CLIENT)
        if tamper == "sender":
            sender = OTHER
        elif tamper == "receiver":
            receiver = OTHER
        timestamp = {"stale": self.now - SKEW - 1, "no-timestamp": None,
                     "skew-edge": self.now + SKEW}.get(tamper, self.now)
        in_reply_to = None if reply is None or not self.ids else self.ids[reply % len(self.ids)]
        mid = self.new_id(reuse)
        if tamper == "replay":  # an id the receiver has in its window
            seen = list(self.reference[1 if to_server else 0]._seen)
            mid = seen[reuse % len(seen)]
        m = message(sender, receiver, intent, mid=mid, cid=cid,
                    in_reply_to=in_reply_to, timestamp=timestamp)
        data = frame(ENCODER.encode(m))
        outcomes = [receive(server if to_server else client, data, self.now)
                    for client, server in self.pairs()]
        assert outcomes[0] == outcomes[1]
        event(f"inject {tamper}: {kind(outcomes[0])}")
        self.again_if_failed()

    @rule(ms=st.integers(0, 1500))
    def wait(self, ms: int) -> None:
        self.now += ms

    def again_if_failed(self) -> None:
        """A refused frame ends a session: both pairs start again (compared first)."""
        self.same_state()
        if any(s.state is HandshakeState.ERROR for pair in self.pairs() for s in pair):
            self.fresh()

    @invariant()
    def same_state(self) -> None:
        for native, reference in zip(self.native, self.reference, strict=True):
            assert native.state is reference.state
            if native.state is HandshakeState.ESTABLISHED:
                assert state_of(native) == state_of(reference)


NativeAgainstReference.TestCase.settings = settings(
    max_examples=min(settings().max_examples, 30), stateful_step_count=30,
    deadline=None)
test_native_against_reference = NativeAgainstReference.TestCase


# --------------------------------------------------------------------------- directly


def test_an_ordinary_exchange_takes_one_native_call_each_way() -> None:
    """Both directions of a plain request and reply are taken natively (no fallback)."""
    client, server = established(True)
    calls: list[str] = []

    def counted(pull: Any) -> Any:
        def pull_counted() -> None:
            calls.append("pull")
            pull()
        return pull_counted

    for session in (client, server):
        session._pull_native = counted(session._pull_native)  # type: ignore[method-assign]
    request = message(CLIENT, SERVER, Intent.REQUEST, mid="q-1", cid="c-1")
    server.receive_data(client.send(ProtocolMessage(request), now=NOW))
    event = server.next_event(now=NOW)
    assert isinstance(event, ProtocolMessage) and event.step is not None
    assert str(event.step.after) == "requested"
    reply = message(SERVER, CLIENT, Intent.INFORM, mid="r-1", cid="c-1", in_reply_to="q-1")
    client.receive_data(server.send(ProtocolMessage(reply), now=NOW))
    event = client.next_event(now=NOW)
    assert isinstance(event, ProtocolMessage) and event.step is not None
    assert event.step.finished and calls == []
    assert server.last_sent_step == event.step
    # The finished conversation is forgotten, its id kept: the native state says so.
    assert server._native.threads() == [] and server._native.finished() == ["c-1"]
    assert server._native.window()[-1] == "q-1" and client._native.window()[-1] == "r-1"


@pytest.mark.parametrize("native", [True, False])
def test_the_replay_window_holds_its_bound(native: bool) -> None:
    """An id WINDOW messages back is a replay; WINDOW + 1 back it is forgotten."""
    _, server = established(native, max_conversations=64)
    mids = [f"q-{n}" for n in range(WINDOW + 1)]
    for n, mid in enumerate(mids):
        server.receive_data(frame(ENCODER.encode(message(
            CLIENT, SERVER, Intent.REQUEST, mid=mid, cid=f"c-{n}", timestamp=NOW))))
        assert isinstance(server.next_event(now=NOW), ProtocolMessage)
    # mids[0] is WINDOW + 1 back: forgotten, accepted; then mids[2], WINDOW back, is not.
    server.receive_data(frame(ENCODER.encode(message(
        CLIENT, SERVER, Intent.REQUEST, mid=mids[0], cid="c-again", timestamp=NOW))))
    assert isinstance(server.next_event(now=NOW), ProtocolMessage)
    server.receive_data(frame(ENCODER.encode(message(
        CLIENT, SERVER, Intent.REQUEST, mid=mids[2], cid="c-more", timestamp=NOW))))
    with pytest.raises(cbcl.RemoteProtocolError, match="is a replay") as caught:
        server.next_event(now=NOW)
    assert caught.value.code == "replay"


@pytest.mark.parametrize("native", [True, False])
def test_open_conversations_hold_their_bound(native: bool) -> None:
    """MAX_OPEN conversations open at once are accepted; one more is refused, and the
    session goes on."""
    client, _ = established(native)
    for n in range(MAX_OPEN):
        client.send(ProtocolMessage(message(CLIENT, SERVER, Intent.REQUEST, mid=f"q-{n}",
                                            cid=f"c-{n}")), now=NOW)
    with pytest.raises(cbcl.LimitError, match="3 conversations are open already"):
        client.send(ProtocolMessage(message(CLIENT, SERVER, Intent.REQUEST, mid="q-x",
                                            cid="c-x")), now=NOW)
    assert client.state is HandshakeState.ESTABLISHED
    assert client.tracker is not None and len(client.tracker.conversations()) == MAX_OPEN


def test_a_refusal_leaves_the_native_state_as_it_was() -> None:
    """SessionState.receive declines with an int and changes nothing."""
    _, server = established(True)
    state = server._native
    first = frame(ENCODER.encode(message(CLIENT, SERVER, Intent.REQUEST, mid="q-1",
                                         cid="c-1", timestamp=NOW)))[4:]
    got = state.receive(first, NOW)
    assert type(got) is tuple
    before = (state.window(), state.threads(), state.finished())
    for data in (first,  # a replay
                 frame(ENCODER.encode(message(OTHER, SERVER, Intent.REQUEST, mid="q-2",
                                              cid="c-2", timestamp=NOW)))[4:],
                 frame(ENCODER.encode(message(CLIENT, SERVER, Intent.REQUEST, mid="q-3",
                                              cid="c-3", timestamp=NOW - SKEW - 1)))[4:],
                 frame(ENCODER.encode(message(CLIENT, SERVER, Intent.INFORM, mid="q-4",
                                              cid="c-1", timestamp=NOW)))[4:],
                 b"\xcbL\x01\x00 not a frame"):
        assert type(state.receive(data, NOW)) is int
        assert (state.window(), state.threads(), state.finished()) == before


@pytest.mark.parametrize("native", [True, False])
def test_needs_data_says_need_data_only_when_next_event_would(native: bool) -> None:
    """``Session.needs_data`` (a transport's check before it reads) is true only where
    ``next_event`` answers NEED_DATA: nothing buffered; a whole frame, part of one (its
    prefix is judged by next_event) or the end of the stream make it false."""
    client, server = established(native)
    assert server.needs_data and server.next_event(now=NOW) is NEED_DATA
    data = client.send(ProtocolMessage(message(CLIENT, SERVER, Intent.REQUEST, mid="q-1",
                                               cid="c-1")), now=NOW)
    server.receive_data(data[:3])  # part of a prefix
    assert not server.needs_data and server.next_event(now=NOW) is NEED_DATA
    server.receive_data(data[3:])
    assert not server.needs_data
    assert isinstance(server.next_event(now=NOW), ProtocolMessage)
    assert server.needs_data and server.next_event(now=NOW) is NEED_DATA
    server.receive_data((1 << 31).to_bytes(4, "big"))  # a prefix over the limit
    assert not server.needs_data
    with pytest.raises(cbcl.CBCLError):
        server.next_event(now=NOW)
    assert not server.needs_data  # (ERROR: next_event says so)
    client.receive_data(b"")  # the end of the stream (c-1 open: the peer "closed")
    assert not client.needs_data
    assert outcome_of(lambda: client.next_event(now=NOW))[:2] == ("error",
                                                                 "RemoteProtocolError")


def test_a_received_message_holds_the_sessions_own_parties() -> None:
    """The native receive makes a decoded message's parties and protocol the session's own
    objects (equal ones: later comparisons are by identity), and nothing else changes."""
    client, server = established(True)
    request = message(CLIENT, SERVER, Intent.REQUEST, mid="q-1", cid="c-1")
    server.receive_data(client.send(ProtocolMessage(request), now=NOW))
    event = server.next_event(now=NOW)
    assert isinstance(event, ProtocolMessage)
    got = event.message
    assert got.sender is server.peer and got.receiver is server.me
    assert server.protocol is not None and got.protocol is server.protocol.id
    assert got == dataclasses.replace(request, timestamp=got.timestamp)
