"""The connection's socket protocol (cbcl.net._transport._Socket) and its fast path: an
ESTABLISHED link's messages taken in the socket's callback, the pending-frame limit there
at N and N+1, and the bounded buffers of both directions (pause/resume reading, drain
while the peer does not read)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from loop_guard import no_stray_asyncio, run_guarded
from test_handler_failures import Keys, cfp, dispatch, linked, proposal, serving

from cbcl import Intent, Message
from cbcl.net import ConnectionLimits, PeerFailed, on_loop
from cbcl.net._transport import WRITE_BATCH, _Socket, clock_ms
from cbcl.session._session import ProtocolMessage


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    return Keys(tmp_path)


@pytest.fixture(autouse=True)
def _guard(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    yield from no_stray_asyncio(caplog)


def test_an_established_link_is_served_in_the_sockets_callback(keys: Keys) -> None:
    """Once ESTABLISHED, requests are taken and answered in data_received: the link's
    task stays parked in one read for all of them (it is woken for none)."""

    async def body() -> None:
        server = serving(keys, handler=on_loop(proposal))
        async with linked(keys, server) as link:
            await link.conversation().send(Intent.CFP, cfp("t-first"), timeout=30)
            (served,) = server._links
            sock = served.connection.reader
            assert isinstance(sock, _Socket)
            reads = 0
            read = sock.read

            async def counted(n: int) -> bytes | None:
                nonlocal reads
                reads += 1
                return await read(n)

            sock.read = counted  # type: ignore[method-assign]
            for n in range(20):
                reply = await link.conversation().send(Intent.CFP, cfp(f"t-{n}"), timeout=30)
                assert reply is not None and reply.intent is Intent.PROPOSE
            assert reads == 0  # the read parked before the first request is still parked
            assert server.messages_received == 21

    run_guarded(body)


#: What an on-loop handler does that the callback cannot finish itself (a continuation).
ON_LOOP_FAILURES = [("raise", "handler-failed"), ("async-raise", "handler-failed"),
                    ("wrong", "invalid-reply"), ("elsewhere", "invalid-reply")]


@pytest.mark.parametrize(("task", "code"), ON_LOOP_FAILURES,
                         ids=[task for task, _ in ON_LOOP_FAILURES])
def test_an_on_loop_handlers_failure_in_the_callback_is_answered_and_the_link_goes_on(
        keys: Keys, task: str, code: str) -> None:
    """An on-loop handler called in the socket's callback that raises, returns an
    awaitable that raises, a reply the session refuses or one of other parties is
    answered with its failure in its conversation, and the next request is served."""

    async def body() -> None:
        server = serving(keys, handler=on_loop(dispatch))
        async with linked(keys, server) as link:
            await link.conversation().send(Intent.CFP, cfp("ok"), timeout=30)
            with pytest.raises(PeerFailed) as caught:
                await link.conversation().send(Intent.CFP, cfp(task), timeout=30)
            assert caught.value.reason == code
            for n in range(3):
                reply = await link.conversation().send(Intent.CFP, cfp(f"ok:{n}"), timeout=30)
                assert reply is not None and reply.intent is Intent.PROPOSE
            (served,) = server._links
            assert not served.closed.done()

    run_guarded(body)


@pytest.mark.parametrize(("frames", "refused"), [(4, False), (5, True)])
def test_max_pending_frames_n_answered_and_one_more_refused_once_established(
        keys: Keys, frames: int, refused: bool) -> None:
    """``max_pending_frames`` frames arriving in one read on an ESTABLISHED link are all
    answered; one more is refused NOT-UNDERSTOOD ``limit`` (as before the handshake)."""
    limits = ConnectionLimits(max_pending_frames=4)

    async def body() -> None:
        server = serving(keys, handler=on_loop(proposal), connection_limits=limits)
        async with linked(keys, server) as link:
            await link.conversation().send(Intent.CFP, cfp("t-first"), timeout=30)
            protocol = link.protocol
            assert protocol is not None
            conversations = [link.conversation() for _ in range(frames)]
            data = b"".join(link.session.send(ProtocolMessage(Message(
                message_id=link.next_id(), sender=link.me, receiver=link.peer,
                intent=Intent.CFP, protocol=protocol.id, conversation_id=c.id,
                body=cfp(f"t-{n}"))), now=clock_ms()) for n, c in enumerate(conversations))
            link.connection.writer.write(data)  # one write: one read on the server
            if refused:
                assert await asyncio.wait_for(asyncio.shield(link.closed), 30) == "limit"
            else:
                replies = [await c.next(timeout=30) for c in conversations]
                assert [r.intent for r in replies] == [Intent.PROPOSE] * frames
                assert not link.closed.done()

    run_guarded(body)


@pytest.mark.parametrize("frames", [1, WRITE_BATCH, WRITE_BATCH + 1, 2 * WRITE_BATCH + 1])
def test_frames_read_together_are_answered_in_writes_of_at_most_write_batch(
        keys: Keys, frames: int) -> None:
    """Frames read together are answered in order, in writes of at most ``WRITE_BATCH``
    replies: the peer gets the first ones while the rest are made (the two sides overlap
    instead of taking turns on whole batches), and a burst still shares writes."""

    async def body() -> None:
        server = serving(keys, handler=on_loop(proposal))
        async with linked(keys, server) as link:
            await link.conversation().send(Intent.CFP, cfp("t-first"), timeout=30)
            (served,) = server._links
            before = served.connection.writes
            protocol = link.protocol
            assert protocol is not None
            conversations = [link.conversation() for _ in range(frames)]
            data = b"".join(link.session.send(ProtocolMessage(Message(
                message_id=link.next_id(), sender=link.me, receiver=link.peer,
                intent=Intent.CFP, protocol=protocol.id, conversation_id=c.id,
                body=cfp(f"t-{n}"))), now=clock_ms()) for n, c in enumerate(conversations))
            link.connection.writer.write(data)  # one write: one read on the server
            replies = [await c.next(timeout=30) for c in conversations]
            assert [r.body[2] for r in replies] == [f"t-{n}" for n in range(frames)]  # type: ignore[index]
            assert served.connection.writes - before == -(-frames // WRITE_BATCH)

    run_guarded(body)


async def _pair(limit: int) -> tuple[Any, _Socket, asyncio.StreamReader,
                                     asyncio.StreamWriter]:
    """A server whose connection is a bare _Socket (nothing reads it) and a client."""
    loop = asyncio.get_running_loop()
    made: asyncio.Future[_Socket] = loop.create_future()

    def factory() -> _Socket:
        return _Socket(limit, on_connect=made.set_result)

    server = await loop.create_server(factory, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    reader, writer = await asyncio.open_connection(host, port)
    return server, await asyncio.wait_for(made, 30), reader, writer


def test_reading_pauses_over_twice_the_limit_and_resumes_at_the_limit() -> None:
    async def body() -> None:
        server, sock, _reader, writer = await _pair(1024)
        try:
            assert sock.transport is not None
            writer.write(b"x" * 200_000)
            await writer.drain()
            while not sock._reading_paused:
                await asyncio.sleep(0.005)
            assert not sock.transport.is_reading()
            assert sock.buffered > 2 * 1024
            taken = 0
            while sock.buffered > 1024:
                assert not sock.transport.is_reading()
                taken += len(sock.take(1000))
            assert sock.transport.is_reading()  # down to the limit: reading again
            while taken < 200_000:  # everything arrives, in order
                data = await asyncio.wait_for(sock.read(1 << 16), 30)
                assert data and set(data) == {ord("x")}
                taken += len(data)
            assert taken == 200_000
        finally:
            writer.close()
            server.close()
            await server.wait_closed()

    run_guarded(body)


def test_drain_waits_while_the_peer_does_not_read_and_raises_once_it_is_gone() -> None:
    async def body() -> None:
        server, sock, reader, writer = await _pair(1024)
        try:
            assert sock.transport is not None
            sock.transport.set_write_buffer_limits(high=4096)
            sock.writer.write(b"y" * (8 << 20))  # more than the kernel buffers take
            assert sock._writing_paused
            drain = asyncio.ensure_future(sock.writer.drain())
            done, _ = await asyncio.wait({drain}, timeout=0.2)
            assert not done  # the peer reads nothing: the buffer stays full
            got = 0
            while got < (8 << 20):  # the peer reads: the buffer empties, drain returns
                got += len(await reader.read(1 << 20))
            await asyncio.wait_for(drain, 30)
            assert not sock._writing_paused
            writer.close()
            await asyncio.wait_for(asyncio.shield(sock.closed), 30)
            assert await sock.read(10) == b""
            with pytest.raises(ConnectionResetError):
                await sock.writer.drain()
        finally:
            writer.close()
            server.close()
            await server.wait_closed()

    run_guarded(body)

