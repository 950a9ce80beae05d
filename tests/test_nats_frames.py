"""The NATS edge's short cuts, without a server: each is held to the way it replaces.

- ``receive_frame``/``send_frame`` (cbcl/net/_nats.py) take an established session's
  frame straight to ``SessionState.receive``/``send``: against a twin session fed the same
  frames through ``receive_data``/``next_event`` and ``Session.send``, the same outcomes
  (events, steps, errors, bytes) and the same state, refusals and declines included.
- ``_Parser`` cuts runs of ``MSG`` operations for direct subscriptions: against nats-py's
  own parser, any stream of operations cut at any points hands out the same messages in
  the same order.
- ``_DirectClient.publish_now`` keeps its pending buffer within ``pending_size`` (N bytes
  accepted, N+1 refused: nats-py's ``publish`` then waits) and refuses what nats-py's
  ``publish`` would (bad subjects, a payload over the server's limit, not connected).
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st
from nats.aio.client import Client
from nats.protocol.parser import Parser
from test_native_session import (
    BODIES,
    CLIENT,
    NOW,
    SERVER,
    established,
    message,
    outcome_of,
    state_of,
)

from cbcl.binary._framing import PREFIX_BYTES
from cbcl.net._nats import _DirectClient, receive_frame, send_frame
from cbcl.protocol._message import Intent
from cbcl.session import NEED_DATA, ProtocolMessage, Session

pytest.importorskip("cbcl._native")

# --------------------------------------------------------------------------- the session


def stream_receive(session: Session, payload: bytes, now: int) -> tuple[Any, ...]:
    """The frame fed as a stream, as the edge does when receive_frame declines."""
    session.receive_data(len(payload).to_bytes(PREFIX_BYTES, "big") + payload)
    got = outcome_of(lambda: session.next_event(now=now))
    rest = outcome_of(lambda: session.next_event(now=now)) if got[0] == "ok" else None
    return (*got, rest, session.data_to_send(), session.state)


def edge_receive(session: Session, payload: bytes, now: int) -> tuple[Any, ...]:
    event = receive_frame(session, payload, now)
    if event is None:
        return stream_receive(session, payload, now)
    return ("ok", event, ("ok", NEED_DATA), session.data_to_send(), session.state)


def edge_send(session: Session, sent: Any, now: int) -> tuple[Any, ...]:
    data = send_frame(session, sent, now)
    if data is None:
        return outcome_of(lambda: session.send(ProtocolMessage(sent), now=now))
    return ("ok", data)


STEPS = st.lists(st.tuples(st.sampled_from(sorted(BODIES, key=lambda i: i.value)),
                           st.sampled_from(["c0", "c1", "c2", None]),
                           st.sampled_from(["send", "receive", "replay", "stale"])),
                 min_size=1, max_size=14)


@settings(max_examples=60, deadline=None)
@given(STEPS)
def test_frames_taken_whole_as_the_stream_takes_them(steps: list[tuple[Intent, Any, str]]
                                                     ) -> None:
    """Random conversations, replays and stale frames between a client and a server: the
    edge's client/server (receive_frame, send_frame) and a twin pair (the stream path)
    give the same outcome for every step and keep the same state."""
    edge, twin = established(True), established(True)
    assert edge[0]._native is not None
    sent: list[bytes] = []
    for number, (intent, cid, what) in enumerate(steps):
        now = NOW + number
        if what == "send":  # the client sends: send_frame against Session.send
            m = message(CLIENT, SERVER, intent, mid=f"m{number}", cid=cid)
            got = edge_send(edge[0], m, now)
            want = outcome_of(lambda m=m, now=now: twin[0].send(ProtocolMessage(m), now=now))
            assert got == want
            assert edge[0].last_sent_step == twin[0].last_sent_step
            if got[0] == "ok":
                sent.append(got[1][PREFIX_BYTES:])
            continue
        if what == "receive":  # a message the server sends the client, taken by it
            m = message(SERVER, CLIENT, intent, mid=f"s{number}", cid=cid, timestamp=now)
            made = outcome_of(lambda m=m, now=now: twin[1].send(ProtocolMessage(m), now=now))
            assert outcome_of(
                lambda m=m, now=now: edge[1].send(ProtocolMessage(m), now=now)) == made
            if made[0] != "ok":
                continue  # (its own side refused it)
            payload = made[1][PREFIX_BYTES:]
            assert edge_receive(edge[0], payload, now) == stream_receive(twin[0], payload, now)
        elif sent:  # the server receives the client's frames, again (a replay) or late
            payload = sent[-1]
            at = now + (10**9 if what == "stale" else 0)
            assert edge_receive(edge[1], payload, at) == stream_receive(twin[1], payload, at)
            if what == "replay":
                assert edge_receive(edge[1], payload, at) == \
                    stream_receive(twin[1], payload, at)
        for a, b in zip(edge, twin, strict=True):
            assert a.state is b.state
            if a.state.value == "established":
                assert state_of(a) == state_of(b)


def test_receive_frame_declines_where_the_stream_is_not_empty() -> None:
    """A session with bytes of another frame buffered, or not ESTABLISHED, or a frame that
    is not binary, is left to the stream path (None, nothing changed)."""
    client, server = established(True)
    m = message(CLIENT, SERVER, Intent.REQUEST, mid="m1", cid="c1")
    payload = client.send(ProtocolMessage(m), now=NOW)[PREFIX_BYTES:]
    server.receive_data(b"\x00\x00")  # half a prefix waits
    before = state_of(server)
    assert receive_frame(server, payload, NOW) is None
    assert state_of(server) == before
    fresh = established(True)[1]
    assert receive_frame(fresh, b"(not binary)", NOW) is None
    assert receive_frame(fresh, b"", NOW) is None
    assert isinstance(receive_frame(fresh, payload, NOW), ProtocolMessage)


# --------------------------------------------------------------------------- the parser


class _Recorder:
    """What a parser hands out, in order."""

    def __init__(self) -> None:
        self.got: list[tuple[Any, ...]] = []

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes,
                           headers: bytes | None) -> None:
        self.got.append(("msg", sid, bytes(subject), bytes(data), headers))

    async def _process_ping(self) -> None:
        self.got.append(("ping",))

    async def _process_pong(self) -> None:
        self.got.append(("pong",))


class _Direct(_DirectClient):
    def __init__(self, recorder: _Recorder, sids: set[int]) -> None:
        super().__init__()
        self.recorder = recorder
        for sid in sids:
            self.direct[sid] = self.taker(sid)

    def taker(self, sid: int) -> Any:
        def take(subject: bytes, data: bytes, headers: bytes | None) -> None:
            self.recorder.got.append(("msg", sid, bytes(subject), bytes(data), headers))
        return take

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes,
                           headers: bytes) -> None:
        if sid in self.direct:
            await super()._process_msg(sid, subject, reply, data, headers)
        else:
            await self.recorder._process_msg(sid, subject, reply, data, headers)

    async def _process_ping(self) -> None:
        await self.recorder._process_ping()

    async def _process_pong(self) -> None:
        await self.recorder._process_pong()


SUBJECTS = st.sampled_from([b"a", b"cbcl.s.x.y.0123.i", b"cbcl.s.x.y.0123.i.c-1_2f"])
OPS = st.one_of(
    st.tuples(st.just("MSG"), SUBJECTS, st.sampled_from([1, 2, 3]),
              st.sampled_from([b"", b"_INBOX.x"]), st.binary(max_size=40)),
    st.tuples(st.just("HMSG"), SUBJECTS, st.sampled_from([1, 2]), st.just(b""),
              st.binary(max_size=20)),
    st.sampled_from([("PING",), ("PONG",), ("+OK",)]),
)


def wire(op: tuple[Any, ...]) -> bytes:
    name: str = op[0]
    if op[0] == "MSG":
        _, subject, sid, reply, data = op
        middle = b" " + reply if reply else b""
        return b"MSG %s %d%s %d\r\n%s\r\n" % (subject, sid, middle, len(data), data)
    if op[0] == "HMSG":
        _, subject, sid, _, data = op
        headers = b"NATS/1.0\r\nX: y\r\n\r\n"
        return b"HMSG %s %d %d %d\r\n%s%s\r\n" % (subject, sid, len(headers),
                                                len(headers) + len(data), headers, data)
    return name.encode() + b"\r\n"


@settings(max_examples=150, deadline=None)
@given(st.lists(OPS, max_size=12), st.lists(st.integers(0, 400), max_size=6),
       st.sets(st.sampled_from([1, 2, 3])))
def test_parser_hands_out_what_nats_py_does(ops: list[tuple[Any, ...]], cuts: list[int],
                                            direct: set[int]) -> None:
    """Any stream of operations, cut at any points, direct subscriptions or not: the
    same messages (subject, sid, payload, headers) and pings in the same order."""
    stream = b"".join(wire(op) for op in ops)
    points = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    chunks = [stream[a:b] for a, b in itertools.pairwise(points)]

    async def run() -> tuple[list[Any], list[Any]]:
        reference = _Recorder()
        theirs = Parser(reference)
        ours_got = _Recorder()
        ours = _Direct(ours_got, direct)._ps
        for chunk in chunks:
            await theirs.parse(chunk)
            await ours.parse(chunk)
        return reference.got, ours_got.got

    theirs, ours = asyncio.run(run())
    assert ours == theirs


# --------------------------------------------------------------------------- publishing


def connected_client(pending_size: int) -> _DirectClient:
    client = _DirectClient()
    client._status = Client.CONNECTED
    client._max_pending_size = pending_size
    client._max_payload = 1 << 20
    return client


def test_publish_now_keeps_the_pending_buffer_within_pending_size() -> None:
    """A command of exactly the room left is taken (N), one byte more is not (N+1): the
    caller then publishes through nats-py, which waits for the flusher."""
    command = len(b"PUB s  5\r\nhello\r\n")

    async def run() -> None:
        client = connected_client(command)
        assert client.publish_now("s", b"hello")
        assert client._pending_data_size == command
        client = connected_client(command - 1)
        assert not client.publish_now("s", b"hello")
        assert client._pending == [] and client._pending_data_size == 0

    asyncio.run(run())


def test_publish_now_refuses_what_nats_py_would() -> None:
    async def run() -> None:
        client = connected_client(1 << 20)
        assert not client.publish_now("a b", b"x")  # a space: another command
        assert not client.publish_now("a\r\nPUB b 0", b"x")
        assert not client.publish_now("a", b"x", reply="r\n")
        assert not client.publish_now("", b"x")
        client._max_payload = 3
        assert not client.publish_now("a", b"four")
        assert client.publish_now("a", b"thr", reply="r")
        assert client._pending == [b"PUB a r 3\r\nthr\r\n"]
        client._status = Client.RECONNECTING
        assert not client.publish_now("a", b"x")

    asyncio.run(run())


def test_parser_at_every_cut() -> None:
    """A stream of each kind of operation, cut once at each of its bytes (and fed byte by
    byte): what nats-py's parser hands out for it whole."""
    ops: list[tuple[Any, ...]] = [
        ("MSG", b"cbcl.s.x.y.0123.i", 1, b"", b"ab\r\ncd"), ("PING",),
        ("MSG", b"a", 2, b"_INBOX.x", b""), ("HMSG", b"a", 1, b"", b"xyz"),
        ("MSG", b"a", 1, b"r", b"\r\n"), ("+OK",), ("MSG", b"b", 3, b"", b"q" * 30)]
    stream = b"".join(wire(op) for op in ops)

    async def parse(chunks: list[bytes]) -> list[Any]:
        got = _Recorder()
        ours = _Direct(got, {1, 3})._ps
        for chunk in chunks:
            await ours.parse(chunk)
        return got.got

    async def run() -> None:
        reference = _Recorder()
        await Parser(reference).parse(stream)
        assert len(reference.got) == 6
        for at in range(len(stream) + 1):
            assert await parse([stream[:at], stream[at:]]) == reference.got, at
        assert await parse([stream[at:at + 1] for at in range(len(stream))]) == \
            reference.got

    asyncio.run(run())
