"""Sessions over asyncio streams: TCP and Unix sockets (spec/negotiation.md §6).

The transport is the only place with sockets and a clock. A :class:`Connection` pairs a
stream with a sans-io :class:`~cbcl._session.Session`: it reads only when the session needs
data, writes whatever the session produced, and enforces the per-connection limits of
:class:`ConnectionLimits` (frame size and pending frames through the session, an idle
timeout on every read). Session work that can take a while — verifying and compiling an
offered descriptor — runs in a worker thread, so one peer's compile never stalls the
others.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ._errors import CBCLError
from ._session import NEED_DATA, ConnectionClosed, Event, RemoteProtocolError, Session


class ConnectionLost(CBCLError):
    """The stream failed or stayed silent past the idle timeout: exit code 1."""

    kind = "connection"
    exit_code = 1


def _check_seconds(name: str, value: object, *, upper: float = 86_400.0) -> None:
    if type(value) not in (int, float) or not 0 < value <= upper:  # NaN fails both
        raise ValueError(f"{name} must be a number of seconds in (0, {upper:g}]")


def _check_count(name: str, value: object, *, upper: int = 1 << 20) -> None:
    if type(value) is not int or not 1 <= value <= upper:
        raise ValueError(f"{name} must be an int from 1 to {upper}")


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """Per connection (spec/negotiation.md §6.1).

    ``max_frame_bytes``: one frame; ``max_pending_frames``: complete frames buffered and
    not yet handled; ``idle_timeout``: seconds waiting for the next frame to start;
    ``frame_timeout``: seconds from a frame's first byte to its last (trickling bytes do
    not extend it); ``handshake_timeout``: seconds from the connection's start to the end
    of the handshake (ESTABLISHED or REJECTED), whatever arrives; ``read_bytes`` per read.
    Raises ``ValueError`` for a value out of range (non-finite included)."""

    max_frame_bytes: int = 1 << 20
    max_pending_frames: int = 16
    idle_timeout: float = 30.0
    frame_timeout: float = 10.0
    handshake_timeout: float = 30.0
    read_bytes: int = 1 << 16

    def __post_init__(self) -> None:
        _check_count("max_frame_bytes", self.max_frame_bytes, upper=(1 << 32) - 1)
        _check_count("max_pending_frames", self.max_pending_frames, upper=1 << 16)
        _check_count("read_bytes", self.read_bytes, upper=1 << 24)
        for name in ("idle_timeout", "frame_timeout", "handshake_timeout"):
            _check_seconds(name, getattr(self, name))


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """For a whole server (spec/negotiation.md §6.1).

    ``max_connections``: open connections at once, in total; ``max_connections_per_peer``:
    from one peer address (IP; every unix-socket client is one peer); ``max_sessions``:
    sessions at work at once — a connection takes a slot when its first whole frame
    arrives, so idle and trickling sockets hold none; ``slot_timeout``: seconds a
    connection waits for a slot; ``max_conversations``: open conversations per session
    (finished ones are dropped); ``max_learned_per_peer``: protocols one peer address may
    teach this server (accepted offers of distinct digests) in its lifetime;
    ``compile_workers``: offers verified and compiled at once; ``compile_queue``: offers
    waiting for a worker (one more is rejected with ``limit``).
    Raises ``ValueError`` for a value out of range."""

    max_connections: int = 1024
    max_connections_per_peer: int = 256
    max_sessions: int = 256
    slot_timeout: float = 5.0
    max_conversations: int = 1024
    max_learned_per_peer: int = 16
    compile_workers: int = 2
    compile_queue: int = 16

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_connections_per_peer", "max_sessions",
                     "max_conversations", "max_learned_per_peer"):
            _check_count(name, getattr(self, name))
        _check_count("compile_workers", self.compile_workers, upper=256)
        _check_count("compile_queue", self.compile_queue, upper=1 << 16)
        _check_seconds("slot_timeout", self.slot_timeout)


def clock_ms() -> int:
    """The edge's clock, Unix ms (the session never reads one)."""
    return time.time_ns() // 1_000_000


def parse_address(text: str) -> tuple[str, Any]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) or ``unix:PATH`` -> ``("tcp", (host, port))``
    or ``("unix", path)``. Raises ``ValueError``."""
    if text.startswith("unix:"):
        path = text[5:]
        if not path:
            raise ValueError("unix: needs a path (unix:/tmp/cbcl.sock)")
        return "unix", path
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"expected HOST:PORT or unix:PATH, not {text!r}")
    return "tcp", (host.strip("[]"), int(port))


class Connection:
    """A :class:`Session` on an asyncio stream."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 session: Session, *, limits: ConnectionLimits | None = None,
                 clock: Callable[[], int] = clock_ms) -> None:
        self.reader = reader
        self.writer = writer
        self.session = session
        self.limits = limits or ConnectionLimits()
        self.clock = clock
        #: Milliseconds the session spent on the last event (verifying, compiling …).
        self.last_work_ms = 0.0
        self.bytes_sent = 0
        #: Bytes the session produced by itself on the last event (its automatic replies).
        self.last_flush_bytes = 0
        self.bytes_received = 0

    async def _write(self, data: bytes) -> None:
        if not data:
            return
        try:
            self.writer.write(data)
            await self.writer.drain()
        except (ConnectionError, OSError) as exc:
            raise ConnectionLost(f"the peer is gone ({exc.strerror or exc}) in state "
                                 f"{self.session.state.value}{self.session._where()}"
                                 ) from None
        self.bytes_sent += len(data)

    async def flush(self) -> None:
        """Write what the session produced by itself."""
        data = self.session.data_to_send()
        self.last_flush_bytes = len(data)
        await self._write(data)

    async def next_event(self) -> Event:
        """The next event, reading as needed. Raises :class:`RemoteProtocolError` (after
        sending the session's NOT-UNDERSTOOD, best effort) and :class:`ConnectionLost`."""
        while True:
            started = time.perf_counter()
            try:
                event = await asyncio.to_thread(self.session.next_event, now=self.clock())
            except RemoteProtocolError:
                with contextlib.suppress(ConnectionLost):
                    await self.flush()
                raise
            self.last_work_ms = (time.perf_counter() - started) * 1000
            if event is not NEED_DATA:
                await self.flush()
                return event  # type: ignore[return-value]
            try:
                data = await asyncio.wait_for(self.reader.read(self.limits.read_bytes),
                                              self.limits.idle_timeout)
            except TimeoutError:
                raise ConnectionLost(f"no data for {self.limits.idle_timeout:g} s in state "
                                     f"{self.session.state.value}") from None
            except (ConnectionError, OSError):
                data = b""  # a reset is an end of stream the session judges
            self.bytes_received += len(data)
            self.session.receive_data(data)

    async def send(self, event: Event) -> int:
        """Send ``event``; returns the bytes written."""
        data = self.session.send(event, now=self.clock())
        await self._write(data)
        return len(data)

    async def close(self) -> None:
        """Close cleanly: tell the session, close the stream, wait for it."""
        with contextlib.suppress(CBCLError):
            self.session.send(ConnectionClosed(), now=self.clock())
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()


async def connect(address: str, session: Session, *,
                  limits: ConnectionLimits | None = None, timeout: float = 10.0,
                  clock: Callable[[], int] = clock_ms) -> Connection:
    """Open a connection to ``address`` (``HOST:PORT`` or ``unix:PATH``) for ``session``.
    Raises :class:`ConnectionLost` when it cannot be opened."""
    kind, where = parse_address(address)
    limits = limits or ConnectionLimits()
    try:
        if kind == "unix":
            opening = asyncio.open_unix_connection(where, limit=limits.read_bytes)
        else:
            opening = asyncio.open_connection(*where, limit=limits.read_bytes)
        reader, writer = await asyncio.wait_for(opening, timeout)
    except (OSError, TimeoutError) as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        raise ConnectionLost(f"cannot connect to {address}: {reason}") from None
    return Connection(reader, writer, session, limits=limits, clock=clock)


async def serve(address: str, make_session: Callable[[], Session],
                handle: Callable[[Connection], Awaitable[None]], *,
                limits: ConnectionLimits | None = None, max_connections: int = 64,
                clock: Callable[[], int] = clock_ms) -> asyncio.AbstractServer:
    """Listen on ``address``; each connection gets ``make_session()`` and is passed to
    ``handle``, then closed, whatever ``handle`` did. At most ``max_connections`` are
    handled at once (others wait). Returns the started server."""
    kind, where = parse_address(address)
    limits = limits or ConnectionLimits()
    gate = asyncio.Semaphore(max_connections)

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async with gate:
            connection = Connection(reader, writer, make_session(), limits=limits,
                                    clock=clock)
            try:
                await handle(connection)
            finally:
                await connection.close()

    if kind == "unix":
        with contextlib.suppress(FileNotFoundError):
            if os.path.exists(where) and not os.path.isfile(where):
                os.unlink(where)  # a stale socket from an earlier run
        return await asyncio.start_unix_server(on_connect, where, limit=limits.read_bytes)
    return await asyncio.start_server(on_connect, *where, limit=limits.read_bytes)
