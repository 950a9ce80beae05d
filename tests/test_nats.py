"""CBCL over NATS (spec/nats.md), against a real nats-server started on loopback by the
fixtures of tests/nats_fixtures.py: the subject encoding, the handshake and conversations
over request/reply, a fan-out call, hostile publishers on an agent's subjects, the caps,
durable delivery through JetStream across a restart, a cluster node killed mid-run, and
the command line.

Tests internals too: the subject-token encoding (``cbcl.net._nats``) and the bootstrap's
NOT-UNDERSTOOD frame."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import nats
import nats.js.errors
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, strategies as st
from key_files import private_key_pem, public_key_pem
from nats_fixtures import (
    NatsNode,
    nats_cluster,
    nats_server,
    wait_for_jetstream,
)
from processes import stop_process

from cbcl import (
    Agent,
    ConnectionLost,
    ConversationClosed,
    Intent,
    LimitError,
    Message,
    NegotiationFailed,
    TrustStore,
    read,
    sign_descriptor,
)
from cbcl.demo import respond
from cbcl.net import ConnectionLimits, Context, HandlerLimits, NatsBus, NatsLimits, PeerFailed
from cbcl.net._nats import NatsConnection, subject_token, token_text
from cbcl.session._bootstrap import not_understood_frame


def read_message(data: bytes) -> Message:
    """A stored message's envelope and body, read without its protocol."""
    from cbcl import parse

    return parse(data, envelope_only=True)

ROOT = Path(__file__).parent.parent
PAYLOAD = (ROOT / "cbcl" / "grammars" / "contract-net-v1.cbcl").read_bytes()
REQUEST = (ROOT / "descriptors" / "request-v1.cbcl").read_bytes()
SERVER = "agent://test/server"
CLIENT = "agent://test/client"
CFP_BODY = read(b'(cfp :task (task :id "t-1" :action render-video) :deadline 1764503600000)')
ACCEPT_BODY = read(b'(accept-proposal :task-id "t-1")')


class Keys:
    def __init__(self, tmp_path: Path) -> None:
        self.key = Ed25519PrivateKey.generate()
        self.trust = tmp_path / "trust"
        self.trust.mkdir(exist_ok=True)
        (self.trust / "demo.pub").write_bytes(public_key_pem(self.key.public_key()))
        self.key_file = tmp_path / "demo.key"
        self.key_file.write_bytes(private_key_pem(self.key))
        self.store = TrustStore.from_directory(self.trust)
        self.signed = sign_descriptor(PAYLOAD, [("demo", self.key)])
        self.signed_request = sign_descriptor(REQUEST, [("demo", self.key)])
        self.pair = ("demo", self.key)


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    return Keys(tmp_path)


@pytest.fixture(scope="module")
def server() -> Iterator[NatsNode]:
    """One nats-server (JetStream on) for the tests of this module that need only one."""
    with nats_server() as node:
        yield node


def run(body: Callable[[], Awaitable[Any]], timeout: float = 60.0) -> Any:
    """Run ``body`` on a fresh loop with a deadline; anything asyncio would only log fails
    the test."""
    stray: list[dict[str, Any]] = []

    async def main() -> Any:
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: stray.append(ctx))
        async with asyncio.timeout(timeout):
            return await body()

    result = asyncio.run(main())
    assert not stray, stray
    return result


@contextlib.asynccontextmanager
async def bus_of(agent: Agent, url: str | list[str], **options: Any
                 ) -> AsyncIterator[NatsBus]:
    bus = await NatsBus.connect(agent, url, **options)
    try:
        yield bus
    finally:
        await bus.close()
        await agent.close()


def serving_agent(keys: Keys, log: list[str], name: str = SERVER, **options: Any) -> Agent:
    options.setdefault("handler", respond)
    return Agent(name, key=keys.pair, trust=keys.store, log=log.append, **options)


async def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("the condition did not come true in time")
        await asyncio.sleep(0.01)


# --------------------------------------------------------------------------- subjects


@given(st.text(min_size=1, max_size=60))
def test_subject_tokens_are_injective_and_invertible(text: str) -> None:
    token = subject_token(text)
    assert token_text(token) == text
    assert all(c.isascii() and (c.isalnum() or c in "-_") for c in token)
    assert "." not in token and "*" not in token and ">" not in token


def test_subject_tokens_of_uris_and_what_is_refused() -> None:
    assert subject_token("agent://example/seller") == "agent_3a_2f_2fexample_2fseller"
    # Distinct names never share a token: '_' itself is escaped.
    assert subject_token("a_2f") != subject_token("a/")
    for bad in ("", "a.b", "a_2", "a_2F", "_41", "a b", "a_ff"):  # not produced by the encoding
        with pytest.raises(ValueError):
            token_text(bad)
    with pytest.raises(ValueError):
        subject_token("")
    assert len(subject_token("x" * 600)) == 600
    with pytest.raises(LimitError):
        subject_token("x" * 601)


def test_nats_limits_are_range_checked() -> None:
    NatsLimits(max_sessions=1, max_retransmits=0)
    for bad in ({"max_sessions": 0}, {"start_rate": float("nan")}, {"retransmit_after": 0},
                {"max_token_bytes": 8}, {"durable_batch": True},
                {"sender_start_rate": 0}, {"sender_start_burst": 0},
                {"pre_handshake_timeout": float("inf")}, {"pre_handshake_share": 0},
                {"pre_handshake_share": 1.5}):
        with pytest.raises(ValueError):
            NatsLimits(**bad)


# --------------------------------------------------------------------------- talking


def test_handshake_and_conversation_over_nats(server: NatsNode, keys: Keys) -> None:
    log: list[str] = []
    seen_subjects: list[str] = []

    async def body() -> None:
        watcher = await nats.connect(server.url)
        await watcher.subscribe("cbcl.>", cb=_collect(seen_subjects))
        try:
            async with bus_of(serving_agent(keys, log), server.url) as served, \
                    bus_of(Agent(CLIENT, key=keys.pair, trust=keys.store), server.url) as bus:
                await served.serve()
                link = await bus.open_link(SERVER, descriptor=keys.signed)
                assert str(link.protocol.id) == "contract-net/v1"  # type: ignore[union-attr]
                assert link.encoding == "binary"
                conversation = link.conversation("job-1")
                proposal = await conversation.send(Intent.CFP, CFP_BODY)
                assert proposal is not None and proposal.intent is Intent.PROPOSE
                done = await conversation.send(Intent.ACCEPT, ACCEPT_BODY)
                assert done is not None and done.intent is Intent.INFORM
                assert conversation.finished
                # A second link to the same agent: the protocol is held now, no offer.
                again = await bus.open_link(SERVER, descriptor=keys.signed)
                reply = await again.conversation().send(Intent.CFP, CFP_BODY)
                assert reply is not None and reply.intent is Intent.PROPOSE
        finally:
            await watcher.close()

    run(body)
    assert any("offer received" in line for line in log), log
    assert sum("-> supported" in line for line in log) == 1, log
    me, peer = subject_token(CLIENT), subject_token(SERVER)
    # The QUERY went as a request on the agent's subject; the conversation's messages went
    # on its own subjects, both ways.
    assert f"cbcl.agent.{peer}" in seen_subjects
    assert any(s.startswith(f"cbcl.s.{peer}.{me}.") and s.endswith(".r.job-1")
               for s in seen_subjects), seen_subjects
    assert any(s.startswith(f"cbcl.s.{me}.{peer}.") and s.endswith(".i.job-1")
               for s in seen_subjects), seen_subjects


def test_a_failing_handler_is_answered_over_nats(server: NatsNode, keys: Keys) -> None:
    """Over NATS as over TCP (spec/negotiation.md §6.3): a handler that raises is answered
    with a NOT-UNDERSTOOD on the conversation's subject, the client's send raises
    PeerFailed at once, and the link goes on."""
    seen_subjects: list[str] = []

    def flaky(message: Message, context: Context) -> Message | None:
        if message.conversation_id == "job-bad":
            raise SystemExit(3)  # contained, like any other
        return respond(message, context)

    async def body() -> None:
        watcher = await nats.connect(server.url)
        await watcher.subscribe("cbcl.>", cb=_collect(seen_subjects))
        try:
            async with bus_of(serving_agent(keys, [], handler=flaky), server.url) as served, \
                    bus_of(Agent(CLIENT, key=keys.pair, trust=keys.store), server.url) as bus:
                await served.serve()
                link = await bus.open_link(SERVER, descriptor=keys.signed)
                with pytest.raises(PeerFailed) as caught:
                    await link.conversation("job-bad").send(Intent.CFP, CFP_BODY, timeout=30)
                assert caught.value.reason == "handler-failed"
                assert caught.value.reply.in_reply_to is not None
                reply = await link.conversation("job-good").send(Intent.CFP, CFP_BODY)
                assert reply is not None and reply.intent is Intent.PROPOSE
        finally:
            await watcher.close()

    run(body)
    me, peer = subject_token(CLIENT), subject_token(SERVER)
    assert any(s.startswith(f"cbcl.s.{me}.{peer}.") and s.endswith(".i.job-bad")
               for s in seen_subjects), seen_subjects


def _collect(into: list[str]) -> Callable[[Any], Awaitable[None]]:
    async def collect(msg: Any) -> None:
        into.append(msg.subject)
    return collect


def test_no_agent_on_the_subject_fails_fast(server: NatsNode, keys: Keys) -> None:
    async def body() -> None:
        async with bus_of(Agent(CLIENT, key=keys.pair), server.url) as bus:
            started = time.monotonic()
            with pytest.raises((ConnectionLost, ConversationClosed)):
                await bus.open_link("agent://test/nobody", descriptor=keys.signed)
            assert time.monotonic() - started < 3.0

    run(body)


def test_an_untrusted_offer_is_rejected_over_nats(server: NatsNode, keys: Keys,
                                                  tmp_path: Path) -> None:
    other = sign_descriptor(PAYLOAD, [("other", Ed25519PrivateKey.generate())])
    log: list[str] = []

    async def body() -> None:
        async with bus_of(serving_agent(keys, log), server.url) as served, \
                bus_of(Agent(CLIENT, key=keys.pair, log=log.append), server.url) as bus:
            await served.serve()
            with pytest.raises(NegotiationFailed) as caught:
                await bus.open_link(SERVER, descriptor=other)
            assert caught.value.reason == "untrusted-signer", log
            assert caught.value.exit_code == 6
            # The agent goes on serving others.
            link = await bus.open_link(SERVER, descriptor=keys.signed)
            assert (await link.conversation().send(Intent.CFP, CFP_BODY)) is not None

    run(body)


def test_fan_out_cfp_to_five_contractors(server: NatsNode, keys: Keys) -> None:
    group = "agent://test/render-farm"
    handled: dict[str, int] = {}

    def contractor(name: str) -> Agent:
        def bid(message: Message, context: Context) -> Message | None:
            handled[name] = handled.get(name, 0) + 1
            return respond(message, context)
        return Agent(name, key=keys.pair, trust=keys.store, handler=bid)

    async def body() -> None:
        async with contextlib.AsyncExitStack() as stack:
            for number in range(5):
                member = await stack.enter_async_context(
                    bus_of(contractor(f"agent://test/contractor-{number}"), server.url))
                await member.serve()
                await member.join(group)
            manager = await stack.enter_async_context(
                bus_of(Agent(CLIENT, key=keys.pair, trust=keys.store), server.url))
            bids = await manager.fan_out(group, descriptor=keys.signed, intent=Intent.CFP,
                                         body=CFP_BODY, window=0.5)
            assert sorted(b.peer for b in bids) == [f"agent://test/contractor-{n}"
                                                    for n in range(5)]
            conversations = set()
            for bid in bids:
                assert bid.error is None and bid.reply is not None, bid
                assert bid.reply.intent is Intent.PROPOSE
                assert str(bid.reply.sender) == bid.peer
                conversations.add((bid.peer, bid.conversation.id))  # type: ignore[union-attr]
            assert len(conversations) == 5  # each reply its own conversation
            # Award one: its conversation finishes; the others are rejected.
            winner, *losers = bids
            done = await winner.conversation.send(Intent.ACCEPT, ACCEPT_BODY)  # type: ignore[union-attr]
            assert done is not None and done.intent is Intent.INFORM
            for loser in losers:
                assert await loser.conversation.send(  # type: ignore[union-attr]
                    Intent.REJECT, read(b'(reject-proposal :task-id "t-1")')) is None
            # max_replies bounds what one call takes.
            two = await manager.fan_out(group, descriptor=keys.signed, intent=Intent.CFP,
                                        body=CFP_BODY, window=2.0, max_replies=2)
            assert len(two) == 2

    run(body)
    # Each member: its CFP, then the ACCEPT or REJECT; two of them a second CFP. Never twice.
    assert sum(handled.values()) == 12 and all(n in (2, 3) for n in handled.values()), handled


# --------------------------------------------------------------------------- hostile peers


def query_frame(keys: Keys, me: str = "agent://test/evil", peer: str = SERVER) -> bytes:
    """A well-formed first frame (a QUERY for contract-net/v1) from ``me``, as a NATS
    payload (no length prefix): what a hostile publisher can make without any key."""
    from cbcl import Registry, Session
    from cbcl.session import Query

    registry = Registry()
    protocol = registry.load(PAYLOAD, allow_unsigned=True)
    session = Session("initiator", registry=registry, me=me, peer=peer)
    data = session.send(Query(str(protocol.id), protocol.digest,
                              (protocol.descriptor.version,), ("binary", "text")),
                        now=int(time.time() * 1000))
    return data[4:]


class Raw:
    """A bare NATS client that publishes what it likes and reads what comes back."""

    def __init__(self, client: Any, name: str = "agent://test/evil") -> None:
        self.client = client
        self.token = subject_token(name)
        self.got: asyncio.Queue[bytes] = asyncio.Queue()
        self.subjects: list[str] = []  # where each answer came

    @classmethod
    async def open(cls, url: str, name: str = "agent://test/evil") -> Raw:
        raw = cls(await nats.connect(url), name)

        async def keep(msg: Any) -> None:
            if msg.data:  # (an empty message is the end of a session's stream)
                raw.subjects.append(msg.subject)
                await raw.got.put(msg.data)
        await raw.client.subscribe(f"cbcl.s.{raw.token}.>", cb=keep)
        await raw.client.flush()
        return raw

    def reply_subject(self, sid: str | None = None, to: str = SERVER) -> str:
        return f"cbcl.s.{self.token}.{subject_token(to)}.{sid or os.urandom(16).hex()}.i"

    async def start(self, payload: bytes, reply: str | None = None, to: str = SERVER) -> str:
        reply = reply or self.reply_subject(to=to)
        await self.client.publish(f"cbcl.agent.{subject_token(to)}", payload, reply=reply)
        return reply

    async def answer(self, timeout: float = 3.0) -> bytes:
        return await asyncio.wait_for(self.got.get(), timeout)

    async def nothing(self, wait: float = 0.3) -> bool:
        await asyncio.sleep(wait)
        return self.got.empty()


def not_understood_code(payload: bytes) -> str:
    from cbcl import parse

    message = parse(payload, envelope_only=True)
    assert message.intent is Intent.NOT_UNDERSTOOD, message
    return str(message.body)


def test_hostile_publishers_on_an_agent_subject(server: NatsNode, keys: Keys) -> None:
    log: list[str] = []

    async def body() -> None:
        async with bus_of(serving_agent(keys, log), server.url) as served:
            await served.serve()
            raw = await Raw.open(server.url)
            try:
                # Garbage, an oversize frame (more than a handshake frame may hold, 132
                # KiB), a CBCL message of the wrong kind before the handshake: refused,
                # and not answered — no sender names the reply subject's agent, so the
                # reply subject is only the publisher's claim.
                unanswered = served.stats["unanswered"]
                await raw.start(b"\x00\xffnot a message")
                await raw.start(b"(" * (140 * 1024))
                await raw.start(not_understood_frame("busy", now=1)[4:])
                await wait_for(lambda: served.stats["unanswered"] >= unanswered + 2)
                assert await raw.nothing()
                # No reply subject, or one that is not a session subject for this agent:
                # dropped, nothing is written anywhere.
                before = served.stats["refused"]
                await raw.client.publish(f"cbcl.agent.{subject_token(SERVER)}", b"x")
                await raw.start(b"x", reply="elsewhere.inbox")
                await raw.start(b"x", reply=raw.reply_subject(to="agent://test/other"))
                await raw.start(b"x", reply=raw.reply_subject(sid="0" * 31))
                await wait_for(lambda: served.stats["refused"] == before + 4)
                assert await raw.nothing()
                # A QUERY whose sender is not the peer its reply subject names: dropped,
                # unanswered (test_no_reply_reaches_a_spoofed_subject).
                spoofed = served.stats["spoofed"]
                await raw.start(query_frame(keys, me="agent://test/client"))
                await wait_for(lambda: served.stats["spoofed"] == spoofed + 1)
                assert await raw.nothing()
                # A well-formed QUERY is answered; the same frame again (a repeat) gets the
                # same answer, and nothing more; once the session is over, a replay of it
                # is dropped.
                query = query_frame(keys)
                reply = await raw.start(query)
                first = await raw.answer()
                assert b"unsupported" in first
                await raw.start(query, reply=reply)
                assert await raw.answer() == first
                await raw.client.publish(reply.replace(".i", ".r").replace(
                    f"cbcl.s.{raw.token}.{subject_token(SERVER)}",
                    f"cbcl.s.{subject_token(SERVER)}.{raw.token}"), b"")  # end of stream
                await wait_for(lambda: not served._sessions)
                replays = served.stats["replays"]
                await raw.start(query, reply=reply)
                await wait_for(lambda: served.stats["replays"] == replays + 1)
                assert await raw.nothing()
                # Through all of it the agent serves a well-behaved peer.
                async with bus_of(Agent(CLIENT, key=keys.pair), server.url) as bus:
                    link = await bus.open_link(SERVER, descriptor=keys.signed)
                    assert (await link.conversation().send(Intent.CFP, CFP_BODY)) is not None
            finally:
                await raw.client.close()

    run(body)
    assert all("\n" not in line and "\x00" not in line for line in log)


def test_hostile_publisher_on_a_session_subject(server: NatsNode, keys: Keys) -> None:
    log: list[str] = []
    cfps = 0

    def counting(message: Message, context: Context) -> Message | None:
        nonlocal cfps
        cfps += message.intent is Intent.CFP
        return respond(message, context)

    async def body() -> None:
        watcher = await nats.connect(server.url)
        frames: list[tuple[str, bytes]] = []

        async def keep(msg: Any) -> None:
            frames.append((msg.subject, msg.data))
        await watcher.subscribe(f"cbcl.s.{subject_token(SERVER)}.>", cb=keep)
        await watcher.flush()
        try:
            async with bus_of(serving_agent(keys, log, handler=counting), server.url) as served, \
                    bus_of(Agent(CLIENT, key=keys.pair), server.url) as bus:
                await served.serve()
                link = await bus.open_link(SERVER, descriptor=keys.signed)
                conversation = link.conversation("job-7")
                assert (await conversation.send(Intent.CFP, CFP_BODY)) is not None
                # Replaying the recorded CFP on its subject: dropped, never handled twice.
                subject, cfp = next((s, d) for s, d in frames if s.endswith(".job-7"))
                await watcher.publish(subject, cfp)
                await watcher.flush()
                await asyncio.sleep(0.2)
                assert cfps == 1 and served.stats["duplicates"] >= 1
                done = await conversation.send(Intent.ACCEPT, ACCEPT_BODY)
                assert done is not None and done.intent is Intent.INFORM
                # Garbage on the session subject ends that session (malformed), as a
                # broken stream does over TCP; the agent goes on.
                base = subject.rsplit(".", 1)[0]
                await watcher.publish(base, b"garbage")
                await wait_for(lambda: link.closed.done())
                assert link.closed.result() == "malformed"
                again = await bus.open_link(SERVER, descriptor=keys.signed)
                assert (await again.conversation().send(Intent.CFP, CFP_BODY)) is not None
                # Frames on subjects of no session are dropped and counted.
                unknown = served.stats["unknown"]
                await watcher.publish(base.replace(base.split(".")[4], "f" * 32), b"x")
                await wait_for(lambda: served.stats["unknown"] == unknown + 1)
        finally:
            await watcher.close()

    run(body)


def test_no_reply_reaches_a_spoofed_subject(server: NatsNode, keys: Keys) -> None:
    """An attacker publishes first frames whose reply subject names a victim — with the
    session id of the victim's live session with the server, and with fresh ones — and
    whose sender is the attacker, or which do not parse, or which come when the server is
    full. A client subscribed as the victim sees nothing at all from the server, the
    victim's live session goes on, and the attacker's own well-formed QUERY is answered on
    its own subject."""
    async def body() -> None:
        # (4 session starts: the victim's and the 3 below, then busy)
        limits = NatsLimits(start_burst=4, start_rate=0.001, pre_handshake_share=1.0)
        victim_seen: list[tuple[str, bytes]] = []
        async with bus_of(serving_agent(keys, []), server.url, limits=limits) as served, \
                bus_of(Agent(CLIENT, key=keys.pair), server.url) as victim:
            await served.serve()
            link = await victim.open_link(SERVER, descriptor=keys.signed)
            (_, live_sid, _), = victim._sessions
            watcher = await nats.connect(server.url)  # subscribed as the victim

            async def keep(msg: Any) -> None:
                victim_seen.append((msg.subject, msg.data))
            await watcher.subscribe(f"cbcl.s.{subject_token(CLIENT)}.>", cb=keep)
            await watcher.flush()
            raw = await Raw.open(server.url)
            try:
                def victims_subject(sid: str | None = None) -> str:
                    return (f"cbcl.s.{subject_token(CLIENT)}.{subject_token(SERVER)}."
                            f"{sid or os.urandom(16).hex()}.i")

                before = dict(served.stats)
                frames = [query_frame(keys), b"\x00garbage", b"(" * (140 * 1024)]
                for frame in frames:  # the attacker's QUERY, garbage, oversize
                    await raw.start(frame, reply=victims_subject(live_sid))
                    await raw.start(frame, reply=victims_subject())
                live = {(subject_token(CLIENT), live_sid, "r")}
                await wait_for(lambda: served.stats["spoofed"] == before["spoofed"] + 1
                               and served.stats["replays"] == before["replays"] + 3
                               and served.stats["unanswered"] >= before["unanswered"] + 2
                               and served._sessions.keys() == live)
                # Over the start rate: a spoofed first frame would be refused busy, and is
                # not answered either; the attacker's own is, on its own subject.
                await raw.start(query_frame(keys), reply=victims_subject())
                await wait_for(lambda: served.stats["busy"] == before["busy"] + 1)
                await raw.start(query_frame(keys))
                assert not_understood_code(await raw.answer()) == "busy"
                await asyncio.sleep(0.2)
                assert victim_seen == []  # nothing was ever published as to the victim
                assert victim.stats["unknown"] == 0
                # The victim's session was not touched.
                answer = await link.conversation().send(Intent.CFP, CFP_BODY)
                assert answer is not None and answer.intent is Intent.PROPOSE
            finally:
                await raw.client.close()
                await watcher.close()

    run(body)


def test_max_sessions_n_served_n_plus_one_busy(server: NatsNode, keys: Keys) -> None:
    async def body() -> None:
        agent = serving_agent(keys, [])
        async with bus_of(agent, server.url, limits=NatsLimits(max_sessions=2)) as served, \
                bus_of(Agent(CLIENT, key=keys.pair), server.url) as bus:
            await served.serve()
            first = await bus.open_link(SERVER, descriptor=keys.signed)
            await bus.open_link(SERVER, descriptor=keys.signed)
            with pytest.raises(NegotiationFailed) as caught:
                await bus.open_link(SERVER, descriptor=keys.signed)
            assert caught.value.reason == "busy" and caught.value.exit_code == 1
            await first.close()
            await wait_for(lambda: served._responders == 1)
            await bus.open_link(SERVER, descriptor=keys.signed)

    run(body)


FLOOD_FIGURES: dict[int, dict[str, Any]] = {}


@pytest.mark.parametrize("senders", [1, 8])
def test_a_flood_of_stalled_queries_leaves_room_for_a_good_peer(
        server: NatsNode, keys: Keys, senders: int) -> None:
    """5,000 QUERYs in about 0.4 s from one sender (then from 8), each answered and then
    left stalled, under the default limits but for 64 session slots (which 8 senders'
    shares, 8 each, fill; 256 by default): every one of a good peer's handshakes, made
    while the flood runs and after it, completes. (Before per-sender accounting, the
    flood drained the agent's start bucket and held every session slot for the 30 s
    handshake timeout: every other peer was refused ``busy``.) Each sender is held to
    its start rate and its share of the slots, and when the slots are full a newcomer
    evicts the oldest session of the sender holding the most, never an established
    one."""
    async def body() -> None:
        names = [f"agent://test/flood-{n}" for n in range(senders)]
        limits = NatsLimits(max_sessions=64)
        async with bus_of(serving_agent(keys, []), server.url, limits=limits) as served, \
                bus_of(Agent(CLIENT, key=keys.pair), server.url) as good:
            await served.serve()
            await (await good.open_link(SERVER, descriptor=keys.signed)).close()  # learned
            flooder = await nats.connect(server.url, pending_size=64 << 20)
            frames = [(name, query_frame(keys, me=name)) for name in names]
            subject = f"cbcl.agent.{subject_token(SERVER)}"
            sent = 0

            async def flood() -> None:
                nonlocal sent
                for chunk in range(10):  # 10 chunks of 500, 40 ms apart
                    for number in range(500):
                        name, frame = frames[(chunk * 500 + number) % senders]
                        await flooder.publish(subject, frame, reply=(
                            f"cbcl.s.{subject_token(name)}.{subject_token(SERVER)}."
                            f"{os.urandom(16).hex()}.i"))
                    sent += 500
                    await asyncio.sleep(0.04)
                await flooder.flush()

            times: list[float] = []
            try:
                flooding = asyncio.ensure_future(flood())
                await wait_for(lambda: sent >= 500)
                for _ in range(6):  # three while the flood runs, three after it
                    started = time.monotonic()
                    link = await good.open_link(SERVER, descriptor=keys.signed)
                    times.append(time.monotonic() - started)
                    assert link.established.done()
                    await link.close()
                    if len(times) == 3:
                        await flooding
            finally:
                flooding.cancel()
                await flooder.close()
            stats = dict(served.stats)
            share = served.limits.pending_share()
            assert sent == 5000 and stats["busy"] > 4000
            # No sender holds more than its share of the slots: one over it evicts its
            # own oldest; with 8 the slots were full, and the good peer's sessions took
            # the place of flooders' oldest.
            assert all(served._pending.count(subject_token(name)) <= share for name in names)
            assert stats["evicted"] > 0
            FLOOD_FIGURES[senders] = {"handshake_s": [round(t, 3) for t in times],
                                      "busy": stats["busy"], "evicted": stats["evicted"]}
            # A handshake waits for no stalled session: far within pre_handshake_timeout
            # (5 s), let alone handshake_timeout (30 s); 1 s on a quiet machine.
            assert max(times) < 5.0, FLOOD_FIGURES

    run(body)


def test_start_rate_n_accepted_n_plus_one_busy(server: NatsNode, keys: Keys) -> None:
    async def body() -> None:
        limits = NatsLimits(start_burst=3, start_rate=0.001)
        async with bus_of(serving_agent(keys, []), server.url, limits=limits) as served:
            await served.serve()
            raw = await Raw.open(server.url)
            try:
                for _ in range(3):
                    await raw.start(query_frame(keys))
                    assert b"unsupported" in await raw.answer()
                await raw.start(query_frame(keys))
                assert not_understood_code(await raw.answer()) == "busy"
            finally:
                await raw.client.close()

    run(body)


@pytest.mark.parametrize("extra, answered", [(0, True), (1, False)])
def test_a_sender_token_of_max_token_bytes_served_one_more_dropped(
        server: NatsNode, keys: Keys, extra: int, answered: bool) -> None:
    """The sender's token in a first frame's reply subject is checked before any table
    keeps it: at ``max_token_bytes`` (40 here) the QUERY is answered, one byte more and
    it is dropped unanswered (counted ``refused``)."""
    name = "agent://test/" + "e" * (19 + extra)
    assert len(subject_token(name)) == 40 + extra

    async def body() -> None:
        limits = NatsLimits(max_token_bytes=40)
        async with bus_of(serving_agent(keys, []), server.url, limits=limits) as served:
            await served.serve()
            raw = await Raw.open(server.url, name)
            try:
                refused = served.stats["refused"]
                await raw.start(query_frame(keys, me=name))
                if answered:
                    assert b"unsupported" in await raw.answer()
                else:
                    await wait_for(lambda: served.stats["refused"] == refused + 1)
                    assert await raw.nothing() and not served._sender_buckets
            finally:
                await raw.client.close()

    run(body)


@pytest.mark.parametrize("starts", [3, 4])
def test_sender_start_burst_n_accepted_n_plus_one_busy(server: NatsNode, keys: Keys,
                                                       starts: int) -> None:
    """One sender's first frames beyond its own bucket are refused ``busy``; another
    sender is served meanwhile (the agent's bucket is not drained by one sender)."""
    async def body() -> None:
        limits = NatsLimits(sender_start_burst=3, sender_start_rate=0.001)
        async with bus_of(serving_agent(keys, []), server.url, limits=limits) as served:
            await served.serve()
            raw = await Raw.open(server.url)
            other = await Raw.open(server.url, "agent://test/other")
            try:
                codes = []
                for _ in range(starts):
                    await raw.start(query_frame(keys))
                    answer = await raw.answer()
                    codes.append(not_understood_code(answer)
                                 if b"NOT-UNDERSTOOD" in answer else "answered")
                assert codes == ["answered"] * 3 + ["busy"] * (starts - 3)
                await other.start(query_frame(keys, me="agent://test/other"))
                assert b"unsupported" in await other.answer()
            finally:
                await raw.client.close()
                await other.client.close()

    run(body)


@pytest.mark.parametrize("stalled", [3, 4])
def test_pre_handshake_share_n_held_n_plus_one_evicts_the_oldest(
        server: NatsNode, keys: Keys, stalled: int) -> None:
    """A sender holds at most its share of the sessions before their handshakes are
    ESTABLISHED (3 of 8 here): one more evicts its own oldest (told ``busy``)."""
    async def body() -> None:
        limits = NatsLimits(max_sessions=8, pre_handshake_share=0.375)
        assert limits.pending_share() == 3
        async with bus_of(serving_agent(keys, []), server.url, limits=limits) as served:
            await served.serve()
            raw = await Raw.open(server.url)
            try:
                replies, got = [], []
                for number in range(stalled):  # each answered before the next
                    replies.append(await raw.start(query_frame(keys)))
                    got.append(await raw.answer())
                    if number == 3:  # and the oldest is told busy
                        got.append(await raw.answer())
                assert await raw.nothing()
                answers: dict[str, str] = {}
                for subject, answer in zip(raw.subjects, got, strict=True):
                    code = not_understood_code(answer) if b"NOT-UNDERSTOOD" in answer else ""
                    answers[subject] = answers.get(subject, "") + code
                # The oldest (whose "unsupported" came first) was told busy.
                assert answers == {reply: "busy" if stalled > 3 and reply == replies[0]
                                   else "" for reply in replies}
                await wait_for(lambda: len(served._sessions) == 3)
                assert served.stats["evicted"] == stalled - 3
            finally:
                await raw.client.close()

    run(body)


def test_full_sessions_evict_the_oldest_of_the_sender_holding_most(
        server: NatsNode, keys: Keys) -> None:
    """When every session is taken, a newcomer takes the place of the oldest session not
    yet established of the sender holding the most; when every one is established, it
    is refused ``busy``."""
    async def body() -> None:
        limits = NatsLimits(max_sessions=3, pre_handshake_share=1.0)
        async with bus_of(serving_agent(keys, []), server.url, limits=limits) as served, \
                bus_of(Agent(CLIENT, key=keys.pair), server.url) as good:
            await served.serve()
            raw = await Raw.open(server.url)
            other = await Raw.open(server.url, "agent://test/other")
            try:
                replies = []
                for _ in range(2):
                    replies.append(await raw.start(query_frame(keys)))
                    assert b"unsupported" in await raw.answer()
                await other.start(query_frame(keys, me="agent://test/other"))
                assert b"unsupported" in await other.answer()
                # Full: the good peer's session evicts raw's oldest (raw holds the most).
                link = await good.open_link(SERVER, descriptor=keys.signed)
                assert not_understood_code(await raw.answer()) == "busy"
                assert raw.subjects[-1] == replies[0] and await other.nothing(0.1)
                # Full again, with one established: the next newcomers evict the two
                # others' sessions, then are refused: all three sessions established.
                links = [link, await good.open_link(SERVER, descriptor=keys.signed),
                         await good.open_link(SERVER, descriptor=keys.signed)]
                assert served.stats["evicted"] == 3
                with pytest.raises(NegotiationFailed) as caught:
                    await good.open_link(SERVER, descriptor=keys.signed)
                assert caught.value.reason == "busy"
                for each in links:
                    assert (await each.conversation().send(Intent.CFP, CFP_BODY)) is not None
            finally:
                await raw.client.close()
                await other.client.close()

    run(body)


@pytest.mark.parametrize("frames, code", [(3, "malformed"), (4, "limit")])
def test_pending_frames_n_queued_n_plus_one_refused(server: NatsNode, keys: Keys,
                                                    frames: int, code: str) -> None:
    """While the session's handler runs and holds the link's only backlog place (so the
    link reads nothing more, and no frame is taken in the subscription's callback), frames
    wait in its queue: N of them are taken in turn (the first, garbage, ends the session:
    malformed); N+1 is refused at once."""
    async def slow(message: Message, context: Context) -> Message | None:
        await asyncio.sleep(0.5)
        return respond(message, context)

    async def body() -> None:
        agent = serving_agent(keys, [], handler=slow,
                              connection_limits=ConnectionLimits(max_pending_frames=3),
                              handler_limits=HandlerLimits(handler_backlog=1))
        watcher = await nats.connect(server.url)
        try:
            async with bus_of(agent, server.url) as served, \
                    bus_of(Agent(CLIENT, key=keys.pair), server.url) as bus:
                await served.serve()
                link = await bus.open_link(SERVER, descriptor=keys.signed)
                (_, connection), = served._sessions.items()
                waiting = asyncio.ensure_future(link.conversation().send(Intent.CFP, CFP_BODY))
                await wait_for(lambda: connection.bytes_received > 0 and not connection._inbox)
                await asyncio.sleep(0.1)  # the handler is running
                for number in range(frames):
                    await watcher.publish(connection.inbox, b"junk %d" % number)
                await watcher.flush()
                await wait_for(lambda: link.closed.done())
                assert link.closed.result() == code
                with contextlib.suppress(ConversationClosed):
                    await waiting
        finally:
            await watcher.close()

    run(body)


@pytest.mark.parametrize("remembered, replayed", [(3, False), (2, True)])
def test_remembered_sessions_n_kept_n_plus_one_forgotten(
        server: NatsNode, keys: Keys, remembered: int, replayed: bool) -> None:
    async def body() -> None:
        limits = NatsLimits(remembered_sessions=remembered)
        async with bus_of(serving_agent(keys, []), server.url, limits=limits) as served:
            await served.serve()
            raw = await Raw.open(server.url)
            try:
                starts = []
                for _ in range(3):
                    query = query_frame(keys)
                    reply = await raw.start(query)
                    assert b"unsupported" in await raw.answer()
                    starts.append((query, reply))
                    end = reply.replace(f"cbcl.s.{raw.token}.{subject_token(SERVER)}",
                                        f"cbcl.s.{subject_token(SERVER)}.{raw.token}")
                    await raw.client.publish(end[:-1] + "r", b"")
                    await wait_for(lambda: not served._sessions)
                query, reply = starts[0]
                await raw.start(query, reply=reply)  # the oldest session's first frame
                if replayed:  # forgotten: it starts a session again
                    assert b"unsupported" in await raw.answer()
                else:
                    assert await raw.nothing()
            finally:
                await raw.client.close()

    run(body)


@pytest.mark.parametrize("connection_limits, limits", [
    (ConnectionLimits(handshake_timeout=0.5), NatsLimits()),
    (ConnectionLimits(), NatsLimits(pre_handshake_timeout=0.5)),
])
def test_a_silent_peer_is_timed_out_in_the_handshake(
        server: NatsNode, keys: Keys, connection_limits: ConnectionLimits,
        limits: NatsLimits) -> None:
    """A peer that stalls after its QUERY holds its session until the shorter of the
    handshake deadline and the pre-handshake deadline (seconds, not the 30 s)."""
    async def body() -> None:
        agent = serving_agent(keys, [], connection_limits=connection_limits)
        async with bus_of(agent, server.url, limits=limits) as served:
            await served.serve()
            raw = await Raw.open(server.url)
            try:
                started = time.monotonic()
                await raw.start(query_frame(keys))
                assert b"unsupported" in await raw.answer()
                assert not_understood_code(await raw.answer()) == "timeout"
                assert 0.4 < time.monotonic() - started < 2.0
                await wait_for(lambda: not served._sessions)
            finally:
                await raw.client.close()

    run(body)


# --------------------------------------------------------------------------- durable


REQUEST_BODY = read(b'(request :action (action :name snapshot-volume :args (:volume "vol-9"))'
                    b" :by 1764540000000)")
DURABLE = "agent://test/durable"


def durable_request(bus: NatsBus, number: int) -> Message:
    return Message(message_id=bus.durable_id(), sender=CLIENT, receiver=DURABLE,
                   intent=Intent.REQUEST, protocol="request/v1",
                   conversation_id=f"night-{number}", body=REQUEST_BODY)


def test_durable_delivery_across_a_restart(server: NatsNode, keys: Keys,
                                           tmp_path: Path) -> None:
    """Messages to an agent that is down wait in JetStream and arrive when it is back:
    nothing lost, nothing twice; repeats are dropped by the server (Nats-Msg-Id) within
    its window and by the receiver's replay window after it; refused messages are
    terminated, never delivered again."""
    state = tmp_path / "state"
    handled: list[str] = []

    def handler(message: Message, context: Context) -> None:
        handled.append(message.message_id)

    def receiver() -> Agent:
        return Agent(DURABLE, trust=keys.store, state=state,
                     descriptors=[keys.signed_request], handler=handler)

    limits = NatsLimits(duplicate_window=1.0, ack_wait=2.0)

    async def body() -> None:
        sent: list[Message] = []
        async with bus_of(receiver(), server.url, limits=limits) as first:
            await first.enable_durable()
            async with bus_of(Agent(CLIENT, key=keys.pair), server.url,
                              limits=limits) as sender:
                for number in range(3):
                    sent.append(durable_request(sender, number))
                    assert await sender.send_durable(sent[-1], descriptor=keys.signed_request) \
                        is False
                await wait_for(lambda: len(handled) == 3)
        # The receiver is down: what is sent now waits in its stream.
        async with bus_of(Agent(CLIENT, key=keys.pair), server.url, limits=limits) as sender:
            for number in range(3, 8):
                sent.append(durable_request(sender, number))
                assert await sender.send_durable(sent[-1], descriptor=keys.signed_request) \
                    is False
            # A repeat within the server's duplicate window: dropped by the server.
            assert await sender.send_durable(sent[3], descriptor=keys.signed_request) is True
            # Hostile publishers on the durable subject: garbage, a message for someone
            # else, and one whose Nats-Msg-Id is not its message id. Each is terminated.
            js = sender.client.jetstream()
            subject = sender.durable_subject(DURABLE)
            await js.publish(subject, b"garbage", headers={"Nats-Msg-Id": "g-1"})
            other = durable_request(sender, 99)
            stamped = Message(message_id=other.message_id, sender=CLIENT,
                              receiver="agent://test/someone-else", intent=Intent.REQUEST,
                              protocol="request/v1", timestamp=int(time.time() * 1000),
                              body=REQUEST_BODY)
            await js.publish(subject, stamped.canonical().encode(),
                             headers={"Nats-Msg-Id": stamped.message_id})
            wrong_id = Message(message_id="d-wrong", sender=CLIENT, receiver=DURABLE,
                               intent=Intent.REQUEST, protocol="request/v1",
                               timestamp=int(time.time() * 1000), body=REQUEST_BODY)
            await js.publish(subject, wrong_id.canonical().encode(),
                             headers={"Nats-Msg-Id": "d-other"})
        assert handled == [m.message_id for m in sent[:3]]
        await asyncio.sleep(1.1)  # past the server's duplicate window
        async with bus_of(receiver(), server.url, limits=limits) as back, \
                bus_of(Agent(CLIENT, key=keys.pair), server.url, limits=limits) as sender:
            await back.enable_durable()
            await wait_for(lambda: len(handled) == 8 and back.stats["durable_refused"] == 3)
            # Beyond the server's window the server stores a repeat; the receiver's replay
            # window (kept in its state directory across the restart) drops it.
            for old in (sent[0], sent[5]):
                assert await sender.send_durable(old, descriptor=keys.signed_request) is False
            await wait_for(lambda: back.stats["durable_duplicates"] == 2)
            await asyncio.sleep(2.5)  # past ack_wait: nothing is delivered again
            info = await sender.client.jetstream().consumer_info(
                back.stream_name(DURABLE), "cbcl")
            assert info.num_ack_pending == 0 and info.num_pending == 0
            assert info.num_redelivered == 0
        assert handled == [m.message_id for m in sent]  # each once, in order

    run(body)


def test_durable_send_before_the_receiver_first_starts(server: NatsNode, keys: Keys,
                                                      tmp_path: Path) -> None:
    """A sender that comes first makes the receiver's stream as the receiver would (the
    same configuration), so its messages wait there; the receiver, started later, takes
    them. A message the protocol refuses never leaves."""
    handled: list[str] = []
    later = "agent://test/later"
    log: list[str] = []

    def handler(message: Message, context: Context) -> Message | None:
        handled.append(message.message_id)
        return respond(message, context)  # a durable reply, to a sender with no stream

    async def body() -> None:
        async with bus_of(Agent(CLIENT, key=keys.pair), server.url) as sender:
            sent = [Message(message_id=sender.durable_id(), sender=CLIENT, receiver=later,
                            intent=Intent.REQUEST, protocol="request/v1", body=REQUEST_BODY)
                    for _ in range(2)]
            for message in sent:
                assert await sender.send_durable(message, descriptor=keys.signed_request) \
                    is False
            info = await sender.client.jetstream().stream_info(sender.stream_name(later))
            made = sender.stream_config(later)
            assert info.config.subjects == made.subjects
            assert (info.config.max_age, info.config.max_msgs, info.config.duplicate_window) \
                == (made.max_age, made.max_msgs, made.duplicate_window)
            # A message the protocol refuses never leaves.
            from cbcl import CBCLError
            bad = Message(message_id=sender.durable_id(), sender=CLIENT, receiver=later,
                          intent=Intent.REQUEST, protocol="request/v1", body=read(b"(request)"))
            with pytest.raises(CBCLError) as caught:
                await sender.send_durable(bad, descriptor=keys.signed_request)
            assert not isinstance(caught.value, ConnectionLost)
            with pytest.raises(ValueError):
                await sender.send_durable(Message(
                    message_id=" spaced", sender=CLIENT, receiver=later,
                    intent=Intent.REQUEST, protocol="request/v1", body=REQUEST_BODY),
                    descriptor=keys.signed_request)
            with pytest.raises(ValueError):
                await sender.send_durable(sent[0], descriptor=keys.signed_request,
                                          replicas=6)
        agent = Agent(later, trust=keys.store, state=tmp_path / "state",
                      descriptors=[keys.signed_request], handler=handler, log=log.append)
        async with bus_of(agent, server.url) as receiver:
            await receiver.enable_durable()
            await wait_for(lambda: len(handled) == 2)
            await wait_for(lambda: sum("durable reply was not sent" in line
                                       for line in log) == 2)
            # A receiver's replies make no stream for a name a message claims.
            with pytest.raises(nats.js.errors.NotFoundError):
                await receiver.client.jetstream().stream_info(receiver.stream_name(CLIENT))
        assert handled == [m.message_id for m in sent]

    run(body)


@pytest.mark.parametrize("max_deliver", [3])
def test_a_durable_message_not_handled_yet_is_kept_then_dead_lettered(
        server: NatsNode, keys: Keys, tmp_path: Path, max_deliver: int) -> None:
    """A durable message of a protocol the receiver does not hold is not terminated: it
    is delivered again after ``durable_retry_delay`` times its deliveries so far, and
    handled once the receiver has learned the protocol (here from a trusted peer's
    offer); one whose protocol never comes is moved, on its ``max_deliver``-th delivery
    (not before), to the dead-letter subject with why and how often — never lost."""
    handled: list[str] = []

    def handler(message: Message, context: Context) -> Message | None:
        if str(message.protocol) == "request/v1":
            handled.append(message.message_id)
            return None
        return respond(message, context)

    async def body() -> None:
        limits = NatsLimits(durable_retry_delay=0.3, max_deliver=max_deliver)
        receiver_agent = Agent(DURABLE + "-new", key=keys.pair, trust=keys.store,
                               state=tmp_path / "state", handler=handler)
        async with bus_of(receiver_agent, server.url, limits=limits) as receiver, \
                bus_of(Agent(CLIENT, key=keys.pair), server.url) as sender:
            await receiver.serve()
            await receiver.enable_durable()
            name = DURABLE + "-new"
            waiting = Message(message_id=sender.durable_id(), sender=CLIENT, receiver=name,
                              intent=Intent.REQUEST, protocol="request/v1", body=REQUEST_BODY)
            await sender.send_durable(waiting, descriptor=keys.signed_request)
            doomed = Message(message_id=sender.durable_id(), sender=CLIENT, receiver=name,
                             intent=Intent.CFP, protocol="contract-net/v1",
                             conversation_id="job-1", body=CFP_BODY)
            await sender.send_durable(doomed, descriptor=keys.signed)
            await wait_for(lambda: receiver.stats["durable_retried"] >= 2)
            assert handled == [] and receiver.stats["durable_refused"] == 0
            # The receiver learns request/v1 (a trusted peer's offer): the next delivery
            # of the waiting message is handled.
            await sender.open_link(name, descriptor=keys.signed_request)
            await wait_for(lambda: handled == [waiting.message_id], timeout=10)
            await wait_for(lambda: receiver.stats["durable_dead"] == 1, timeout=10)
            js = sender.client.jetstream()
            dead = await js.get_last_msg(receiver.stream_name(name),
                                         receiver.dead_letter_subject(name))
            assert dead.data is not None
            kept = read_message(dead.data)  # the message itself, as stored
            assert (kept.message_id, kept.intent, kept.body) == (doomed.message_id,
                                                                 Intent.CFP, doomed.body)
            headers = dead.headers or {}
            assert headers["CBCL-Msg-Id"] == doomed.message_id
            assert headers["CBCL-Deliveries"] == str(max_deliver)  # not one before
            assert "unknown protocol" in headers["CBCL-Dead-Reason"]
            # Both settled: nothing pending, nothing delivered again.
            await asyncio.sleep(0.5)
            info = await js.consumer_info(receiver.stream_name(name), "cbcl")
            assert info.num_ack_pending == 0 and info.num_pending == 0
            assert receiver.stats["durable_dead"] == 1 and handled == [waiting.message_id]

    run(body)


def test_durable_setup_and_publish_are_retried_then_given_up(keys: Keys) -> None:
    """With no JetStream to answer (a server without it: what a client sees while no
    stream leader can be elected), setting up durable delivery and a durable publish are
    retried with backoff, each failure logged, and given up after ``durable_retry_for``
    with :class:`ConnectionLost` — a CBCL error, not nats-py's."""
    log: list[str] = []

    async def body() -> None:
        limits = NatsLimits(durable_retry_for=1.0, request_timeout=0.3)
        async with bus_of(Agent(DURABLE, trust=keys.store, log=log.append),
                          node.url, limits=limits) as bus:
            with pytest.raises(ConnectionLost, match="cannot set up durable delivery"):
                await bus.enable_durable()
            retried = [line for line in log if "trying again" in line]
            assert len(retried) >= 2  # 0.25 s, then 0.5 s, within the 1 s
            with pytest.raises(ConnectionLost, match="cannot store a durable message"):
                await bus.send_durable(durable_request(bus, 1),
                                       descriptor=keys.signed_request)

    with nats_server(jetstream=False) as node:
        run(body)


# --------------------------------------------------------------------------- a cluster


def cfp_for(task: str) -> Any:
    return read(b'(cfp :task (task :id "' + task.encode() + b'" :action render-video) '
                b":deadline 1764503600000)")


def accept_for(task: str) -> Any:
    return read(b'(accept-proposal :task-id "' + task.encode() + b'")')


def test_a_cluster_node_killed_mid_run(keys: Keys) -> None:
    """Three nodes; the contractors and one manager are connected to the node that is
    frozen (SIGSTOP), then killed (SIGKILL), in the middle of the run, while each link
    has 8 conversations in flight at once. The clients move to the other nodes, every
    conversation's lost frame is repeated (not only the link's last), and every
    conversation completes, each message handled once."""
    seen: dict[tuple[str, str, str], int] = {}
    in_flight, rounds = 8, 2
    links_made = 2 * 3

    def contractor(name: str) -> Agent:
        def handle(message: Message, context: Context) -> Message | None:
            key = (name, str(message.conversation_id), message.intent.value)
            seen[key] = seen.get(key, 0) + 1
            if len(seen) == links_made * in_flight * 2 and kill is not None:
                kill()  # the node dies while this contractor holds a message unanswered
            return respond(message, context)
        return Agent(name, key=keys.pair, trust=keys.store, handler=handle)

    done: list[str] = []
    kill: Callable[[], None] | None = None

    with nats_cluster(3) as cluster:
        urls = cluster.urls
        node = cluster.nodes[1]

        def freeze_then_kill() -> None:
            """The node stops (SIGSTOP) before the held message is answered, so what its
            clients write from now on (that answer first) waits in its sockets unread, then
            dies (SIGKILL) with it: a frame is lost for certain. (A plain SIGKILL here
            raced the answer: sent fast enough, it reached the node before the kill took
            effect, or it was still in nats-py's buffer at the disconnect and was sent
            after the reconnect, and nothing was lost to repeat.)"""
            assert node.process is not None
            node.process.send_signal(signal.SIGSTOP)
            killer = threading.Timer(0.2, node.kill)
            killer.daemon = True
            killer.start()

        kill = freeze_then_kill

        async def body() -> None:
            async with contextlib.AsyncExitStack() as stack:
                names = [f"agent://test/contractor-{n}" for n in range(3)]
                buses = []
                for name in names:
                    member = await stack.enter_async_context(
                        bus_of(contractor(name), [urls[1], urls[2], urls[0]]))
                    await member.serve()
                    buses.append(member)
                managers = []
                for number, order in enumerate(([urls[0], urls[2]], [urls[1], urls[0]])):
                    managers.append(await stack.enter_async_context(bus_of(
                        Agent(f"agent://test/manager-{number}", key=keys.pair,
                              trust=keys.store), order)))
                moved = [*buses, managers[1]]
                links = [(m, name, await m.open_link(name, descriptor=keys.signed))
                         for m in managers for name in names]
                assert len(links) == links_made

                async def converse(manager: NatsBus, name: str, link: Any, task: str) -> None:
                    conversation = link.conversation(f"job-{task}")
                    proposal = await conversation.send(Intent.CFP, cfp_for(task))
                    assert proposal is not None and proposal.intent is Intent.PROPOSE
                    result = await conversation.send(Intent.ACCEPT, accept_for(task))
                    assert result is not None and result.intent is Intent.INFORM
                    done.append(task)

                async def run_link(manager: NatsBus, name: str, link: Any) -> None:
                    for wave in range(rounds):  # `in_flight` conversations at once
                        await asyncio.gather(*(
                            converse(manager, name, link,
                                     f"t-{manager.me[-1]}-{name[-1]}-{wave}-{number}")
                            for number in range(in_flight)))

                await asyncio.gather(*(run_link(m, n, link) for m, n, link in links))
                # The clients of the dead node moved to a live one.
                dead = cluster.nodes[1].url.rsplit(":", 1)[1]
                for bus in [*buses, *managers]:
                    url = bus.client.connected_url
                    assert url is not None and str(url.port) != dead
                    assert bus.client.stats["reconnects"] >= (bus in moved)
                retransmits.append(sum(m.stats["retransmits"] for m in managers))

            assert cluster.nodes[1].process is not None
            assert cluster.nodes[1].process.poll() is not None  # it really died

        retransmits: list[int] = []
        run(body, timeout=120)

    conversations = links_made * in_flight * rounds  # 96
    assert len(done) == len(set(done)) == conversations  # none lost
    assert len(seen) == 2 * conversations and set(seen.values()) == {1}  # none twice
    assert retransmits[0] >= 1  # frames were lost and repeated


def test_a_replicated_durable_stream_survives_its_leaders_death(keys: Keys,
                                                                 tmp_path: Path) -> None:
    """``replicas=3`` in a three-node cluster: the stream's leader is killed (SIGKILL).
    Messages sent meanwhile are stored once a new leader is elected (the publish is
    retried), a receiver that (re)starts meanwhile sets up its delivery once it can
    (retried, not given up; naming no replicas, it keeps the stream's three), and every
    message is handled once."""
    handled: list[str] = []

    def handler(message: Message, context: Context) -> None:
        handled.append(message.message_id)

    def receiver() -> Agent:
        return Agent(DURABLE, trust=keys.store, state=tmp_path / "state",
                     descriptors=[keys.signed_request], handler=handler)

    with nats_cluster(3) as cluster:
        wait_for_jetstream(cluster.urls)
        by_name = {node.name: node for node in cluster.nodes}

        async def body() -> None:
            urls = cluster.urls
            limits = NatsLimits(request_timeout=2.0)
            async with bus_of(Agent(CLIENT, key=keys.pair), urls, limits=limits) as sender:
                sent = []
                async with bus_of(receiver(), urls, limits=limits) as first:
                    await first.enable_durable(replicas=3)
                    info = await first.client.jetstream().stream_info(
                        first.stream_name(DURABLE))
                    assert info.config.num_replicas == 3
                    assert info.cluster is not None and info.cluster.leader in by_name
                    leader = by_name[info.cluster.leader]
                    for number in range(3):
                        sent.append(durable_request(sender, number))
                        await sender.send_durable(sent[-1], descriptor=keys.signed_request)
                    await wait_for(lambda: len(handled) == 3, timeout=10)
                leader.kill()
                for number in range(3, 8):  # while a leader is elected
                    sent.append(durable_request(sender, number))
                    await sender.send_durable(sent[-1], descriptor=keys.signed_request)
                async with bus_of(receiver(), urls, limits=limits) as again:
                    await again.enable_durable()  # (no replicas named: the stream's kept)
                    await wait_for(lambda: len(handled) == 8, timeout=30)
                    info = await again.client.jetstream().stream_info(
                        again.stream_name(DURABLE))
                    assert info.config.num_replicas == 3
                    assert leader.process is not None and leader.process.poll() is not None
            assert handled == [m.message_id for m in sent]  # each once, in order

        run(body, timeout=120)


async def until(condition: Callable[[], bool], deadline: float = 20.0) -> None:
    """Wait until ``condition()`` holds (polled on the loop), or fail at ``deadline`` s."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while not condition():
        if loop.time() > end:
            raise AssertionError("the condition did not hold in time")
        await asyncio.sleep(0.01)


def test_a_lost_frame_is_repeated_and_a_lost_answer_resent(server: NatsNode,
                                                            keys: Keys) -> None:
    """NATS delivers at most once. With the responder's (then the initiator's) session
    subscription gone for a moment, as in a failover, the frame published meanwhile is
    lost: the opener repeats it, the responder answers a repeat from its cache, and every
    message is handled once."""
    handled: list[str] = []

    def counting(message: Message, context: Context) -> Message | None:
        handled.append(message.intent.value)
        return respond(message, context)

    async def gap(bus: NatsBus) -> Any:
        sub = bus._subs[0]  # the session subjects' subscription
        await sub.unsubscribe()
        await bus.client.flush()
        bus._subs.remove(sub)
        return bus._subscribe(f"{bus._session_prefix}>", bus._on_session_message)

    async def body() -> None:
        async with bus_of(serving_agent(keys, [], handler=counting), server.url) as served, \
                bus_of(Agent(CLIENT, key=keys.pair), server.url) as bus:
            await served.serve()
            link = await bus.open_link(SERVER, descriptor=keys.signed)
            conversation = link.conversation()
            # The CFP is lost: the responder is not listening.
            back = await gap(served)
            waiting = asyncio.ensure_future(conversation.send(Intent.CFP, CFP_BODY))
            # (the gap lasts until the opener has repeated the frame, whatever the load)
            await until(lambda: bus.stats["retransmits"] >= 1)
            await back
            proposal = await waiting
            assert proposal is not None and proposal.intent is Intent.PROPOSE
            assert bus.stats["retransmits"] >= 1
            # The INFORM is lost: the initiator is not listening; its repeated ACCEPT is
            # answered from the responder's cache, not handled again.
            back = await gap(bus)
            waiting = asyncio.ensure_future(conversation.send(Intent.ACCEPT, ACCEPT_BODY))
            await until(lambda: served.stats["duplicates"] >= 1)
            await back
            done = await waiting
            assert done is not None and done.intent is Intent.INFORM
            assert served.stats["duplicates"] >= 1

    run(body)
    assert handled == ["CFP", "ACCEPT"]


@pytest.mark.parametrize("threads", [3, 4])
def test_frames_kept_to_repeat_n_threads_kept_n_plus_one_drops_the_oldest(
        server: NatsNode, keys: Keys, threads: int) -> None:
    """The opener keeps the latest frame of each thread of a link (the handshake, each
    conversation) to repeat, for at most ``reply_cache`` threads: one more drops the
    oldest (the peer could not answer its repeat from its cache anyway)."""
    async def body() -> None:
        limits = NatsLimits(reply_cache=3)
        async with bus_of(serving_agent(keys, []), server.url) as served, \
                bus_of(Agent(CLIENT, key=keys.pair), server.url, limits=limits) as bus:
            await served.serve()
            link = await bus.open_link(SERVER, descriptor=keys.signed)
            connection = link.connection
            assert isinstance(connection, NatsConnection) and not connection._resend
            for number in range(threads):
                connection._arm(f"c{number}", "cbcl.nowhere", b"frame %d" % number)
            kept = list(connection._resend)
            assert kept == [f"c{number}" for number in range(threads)][-3:]

    run(body)


# --------------------------------------------------------------------------- the command line


def cbcl_command(*args: str, timeout: float = 60.0, cwd: Path | None = None
                 ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cbcl", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd)


@contextlib.contextmanager
def serving(*args: str) -> Iterator[subprocess.Popen[str]]:
    """``cbcl serve ARGS`` until its first line; terminated (then killed) on the way out."""
    process = subprocess.Popen([sys.executable, "-m", "cbcl", "serve", *args],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        assert "listening on NATS" in first, first + (process.stderr.read()
                                                      if process.stderr else "")
        yield process
    finally:
        stop_process(process)


def test_cli_serve_negotiate_and_send_over_nats(server: NatsNode, keys: Keys,
                                                tmp_path: Path) -> None:
    signed = tmp_path / "contract-net.signed.cbcl"
    signed.write_bytes(keys.signed)
    signed_request = tmp_path / "request.signed.cbcl"
    signed_request.write_bytes(keys.signed_request)
    (tmp_path / "descriptors").mkdir()
    (tmp_path / "descriptors" / "request.cbcl").write_bytes(keys.signed_request)
    name = "agent://test/cli-server"
    request = tmp_path / "request.cbcl"
    request.write_text(f'(CBCL/1.0 (message-id "rq-1") (sender agent://test/cli-client) '
                       f'(receiver {name}) (intent REQUEST) (protocol request/v1) '
                       f'(conversation-id "night-1") (body (request :action (action :name '
                       f'snapshot-volume :args (:volume "vol-9")) :by 1764540000000)))')
    # Before the receiver ever started: its stream is made by the sender.
    first = cbcl_command("send", "--nats", server.url, "--durable", "--replicas", "1",
                         "--descriptor", str(signed_request), "--key", str(keys.key_file),
                         str(request))
    assert first.returncode == 0, first.stderr
    assert "stored for" in first.stdout and "duplicate" not in first.stdout
    with serving("--nats", server.url, "--name", name, "--trust", str(keys.trust),
                 "--durable", "--replicas", "1", "--state", str(tmp_path / "state"),
                 "--descriptors", str(tmp_path / "descriptors")) as process:
        negotiated = cbcl_command("negotiate", "--nats", server.url, "--to", name,
                                  "--descriptor", str(signed), "--key", str(keys.key_file))
        assert negotiated.returncode == 0, negotiated.stderr
        assert "handshake done: contract-net/v1" in negotiated.stdout
        assert "INFORM" in negotiated.stdout
        sent = cbcl_command("send", "--nats", server.url, "--to", name, "--descriptor",
                            str(signed_request), "--key", str(keys.key_file), str(request))
        assert sent.returncode == 0, sent.stderr
        assert "(intent INFORM)" in sent.stdout and '(in-reply-to "rq-1")' in sent.stdout
        durable = [cbcl_command("send", "--nats", server.url, "--durable", "--descriptor",
                                str(signed_request), "--key", str(keys.key_file),
                                str(request)) for _ in range(2)]
        assert [d.returncode for d in durable] == [0, 0], durable[0].stderr
        assert all("dropped as a duplicate" in d.stdout for d in durable)
        # No such agent: exit 1, one line.
        nobody = cbcl_command("negotiate", "--nats", server.url, "--to", "agent://test/none",
                              "--descriptor", str(signed), "--key", str(keys.key_file))
        assert nobody.returncode == 1 and "no agent" in nobody.stderr, nobody.stderr
        # An untrusted offer: exit 6, as over TCP.
        other = tmp_path / "other.signed.cbcl"
        other.write_bytes(sign_descriptor((ROOT / "descriptors" / "task-assignment-v1.cbcl")
                                          .read_bytes(),
                                          [("other", Ed25519PrivateKey.generate())]))
        refused = cbcl_command("negotiate", "--nats", server.url, "--to", name,
                               "--descriptor", str(other), "--key", str(keys.key_file))
        assert refused.returncode == 6, refused.stdout + refused.stderr
    assert process.returncode is not None


@pytest.mark.parametrize("args, message", [
    (["serve", "--trust", "T"], "give --listen or --nats"),
    (["serve", "--trust", "T", "--listen", "127.0.0.1:0", "--nats", "nats://h:1"],
     "give --listen or --nats"),
    (["serve", "--trust", "T", "--listen", "127.0.0.1:0", "--durable"], "--durable goes"),
    (["serve", "--trust", "T", "--nats", "http://h:1"], "--nats: expected"),
    (["serve", "--trust", "T", "--nats", "nats://h"], "--nats: expected"),
    (["negotiate", "--nats", "nats://h:1", "--connect", "h:1", "--descriptor", "D",
      "--key", "K"], "give --connect or --nats"),
    (["negotiate", "--nats", "nats://h:1", "--to", "not a uri", "--descriptor", "D",
      "--key", "K"], "--to: not an agent URI"),
    (["negotiate", "--connect", "h:1", "--to", "agent://x", "--descriptor", "D",
      "--key", "K"], "--to goes with --nats"),
    (["send", "--descriptor", "D", "--key", "K", "M"], "give --connect ADDRESS or --nats"),
    (["send", "--connect", "h:1", "--durable", "--descriptor", "D", "--key", "K", "M"],
     "--to and --durable go with --nats"),
    (["send", "--nats", "nats://h:1", "--replicas", "3", "--descriptor", "D", "--key", "K",
      "M"], "--replicas goes with --durable"),
    (["serve", "--trust", "T", "--nats", "nats://h:1", "--replicas", "3"],
     "--replicas goes with --durable"),
    (["serve", "--trust", "T", "--nats", "nats://h:1", "--durable", "--replicas", "6"],
     "--replicas"),
    (["serve", "--trust", "T", "--nats", "nats://h:1", "--durable", "--replicas", "0"],
     "--replicas"),
])
def test_cli_nats_usage_errors(args: list[str], message: str) -> None:
    result = cbcl_command(*args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and result.stderr.count("\n") == 1, result.stderr
