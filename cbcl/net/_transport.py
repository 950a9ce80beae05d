"""Sessions over asyncio streams: TCP and Unix sockets (spec/negotiation.md §6).

Theory of operation
-------------------
The transport is the only place with sockets and a clock. A :class:`Connection` pairs a
stream with a sans-io :class:`~cbcl.session._session.Session` and runs it on the event loop: it
reads only when the session needs data, writes whatever the session produced, and hands
the only slow work there is — verifying and compiling an offered descriptor, recording
it — to a :class:`WorkPool` of dedicated threads (the compile itself runs in the guarded
worker process). Parsing, decoding and session steps take microseconds and never leave
the loop, so a slow compile delays no other peer's frames.

Every wait has a deadline (:class:`ConnectionLimits`): the next frame must start within
``idle_timeout``, a frame that has started must end within ``frame_timeout`` whatever
trickles in, and the whole handshake must end within ``handshake_timeout``. A deadline
missed ends the connection with a NOT-UNDERSTOOD ``timeout``.

:func:`serve` bounds a server (:class:`ServerLimits`): connections in total and per peer
address (over the cap: NOT-UNDERSTOOD ``busy``, closed at once), and sessions at work. A
connection takes a session slot only when its first whole frame has arrived, so sockets
that stay idle or trickle bytes hold a connection, never a slot; a connection that cannot
get a slot within ``slot_timeout`` is refused ``busy``. Each refusal is reported once to
the server's ``on_refusal`` with its reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NoReturn

from ..core._errors import CBCLError, ConnectionLost, LimitError
from ..protocol._registry import CompileGate, PreparedDescriptor
from ..session._negotiation import FINAL, HandshakeState
from ..session._session import (
    NEED_DATA,
    NEED_WORK,
    ConnectionClosed,
    Event,
    RemoteProtocolError,
    Session,
    Work,
    not_understood_frame,
)


def _check_seconds(name: str, value: object, *, upper: float = 86_400.0) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) \
            or not 0 < value <= upper:  # NaN fails both comparisons
        raise ValueError(f"{name} must be a number of seconds in (0, {upper:g}]")


def _check_count(name: str, value: object, *, upper: int = 1 << 20, lower: int = 1) -> None:
    if type(value) is not int or not lower <= value <= upper:
        raise ValueError(f"{name} must be an int from {lower} to {upper}")


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
        _check_count("compile_queue", self.compile_queue, upper=1 << 16, lower=0)
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


# --------------------------------------------------------------------------- the work pool


class WorkPool:
    """Dedicated threads for a session's slow work (:class:`~cbcl.session._session.Work`).

    :attr:`compile_gate` (hand it to every session's :class:`Registry`) lets ``workers``
    grammars compile at once and ``queue`` more wait; one more offer that needs a compile
    is refused at once with :class:`LimitError`, which the session answers with
    ``(rejected :reason limit)``. The pool has ``workers + queue + 4`` threads, so offers
    whose grammar is cached — which need only verifying — always find one free and never
    wait behind slow compiles. Recording accepted descriptors has threads of its own.
    """

    def __init__(self, workers: int = 2, queue: int = 16) -> None:
        self.compile_gate = CompileGate(workers, queue)
        self._offers = ThreadPoolExecutor(workers + queue + 4,
                                          thread_name_prefix="cbcl-offer")
        self._records = ThreadPoolExecutor(2, thread_name_prefix="cbcl-record")

    async def run(self, work: Work) -> Any:
        """Run ``work`` in a worker thread; returns what it returned or the
        :class:`CBCLError` it raised (never raises one itself)."""
        executor = self._offers if work.kind == "offer" else self._records
        return await asyncio.wrap_future(executor.submit(_outcome, work))

    def close(self) -> None:
        """Stop taking work; running work ends in its thread."""
        self._offers.shutdown(wait=False, cancel_futures=True)
        self._records.shutdown(wait=False, cancel_futures=True)


def _outcome(work: Work) -> Any:
    try:
        return work.run()
    except CBCLError as exc:
        return exc


_DEFAULT_POOL: WorkPool | None = None
_DEFAULT_POOL_LOCK = threading.Lock()


def default_pool() -> WorkPool:
    """The process's shared pool for connections made without one (2 workers, queue 16)."""
    global _DEFAULT_POOL
    with _DEFAULT_POOL_LOCK:
        if _DEFAULT_POOL is None:
            _DEFAULT_POOL = WorkPool()
        return _DEFAULT_POOL


# --------------------------------------------------------------------------- a connection


#: States in which the handshake deadline no longer applies.
_HANDSHAKE_OVER = FINAL | {HandshakeState.ESTABLISHED}


class Connection:
    """A :class:`Session` on an asyncio stream, run on the event loop.

    ``pool`` runs the session's slow work (default :func:`default_pool`); ``vet_offer``,
    if set, is called on the loop with each offer that passed every check, and may raise a
    :class:`CBCLError` to refuse it (``cbcl serve``'s per-peer cap). ``slot`` is taken
    when the first whole frame arrives (see :func:`serve`)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 session: Session, *, limits: ConnectionLimits | None = None,
                 clock: Callable[[], int] = clock_ms, pool: WorkPool | None = None,
                 peer: str = "", slot: Callable[[], Awaitable[None]] | None = None) -> None:
        self.reader = reader
        self.writer = writer
        self._start(session, limits=limits or ConnectionLimits(), clock=clock, pool=pool,
                    peer=peer, slot=slot)

    def _start(self, session: Session, *, limits: ConnectionLimits,
               clock: Callable[[], int], pool: WorkPool | None, peer: str,
               slot: Callable[[], Awaitable[None]] | None) -> None:
        """The state of a connection over any carrier (a stream here, NATS in
        :mod:`cbcl.net._nats`): the session, its limits and deadlines, the counters."""
        self.session = session
        session.defer_work = True
        self.limits = limits
        self.clock = clock
        self.pool = pool
        self.peer = peer
        self.vet_offer: Callable[[PreparedDescriptor], None] | None = None
        self._slot = slot
        #: Milliseconds the last slow work took (verifying, compiling, recording).
        self.last_work_ms = 0.0
        #: Where the last offer's compiled grammar came from (``compiled``, ``memory
        #: cache``, ``disk cache``; empty when it was refused).
        self.last_work_source = ""
        self.bytes_sent = 0
        #: Bytes the session produced by itself on the last event (its automatic replies).
        self.last_flush_bytes = 0
        self.bytes_received = 0
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._handshake_deadline = loop.time() + self.limits.handshake_timeout
        self._frame_deadline: float | None = None

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

    def _handshaking(self) -> bool:
        return self.session.state not in _HANDSHAKE_OVER

    async def next_event(self) -> Event:
        """The next event, reading as needed. Raises :class:`RemoteProtocolError` (after
        sending the session's NOT-UNDERSTOOD, best effort) and :class:`ConnectionLost`
        (a deadline passed: after sending NOT-UNDERSTOOD ``timeout``)."""
        session = self.session
        while True:
            if self._slot is not None and session.frames_waiting:
                take, self._slot = self._slot, None
                await take()
            try:
                event = session.next_event(now=self.clock())
            except RemoteProtocolError:
                with contextlib.suppress(ConnectionLost):
                    await self.flush()
                raise
            if event is NEED_WORK:
                await self._do_work()
                continue
            if event is not NEED_DATA:
                # (neither NEED_WORK nor NEED_DATA: sentinels mypy cannot narrow by `is`)
                await self._accepted(event)  # type: ignore[arg-type]
                await self.flush()
                return event  # type: ignore[return-value]
            await self.flush()
            await self._receive()

    async def _accepted(self, event: Event) -> None:
        """Called with each event before :meth:`next_event` returns it (a transport's own
        checks of it: nothing here)."""

    async def _receive(self) -> None:
        """Read what the peer sent next into the session, keeping the frame deadline."""
        session = self.session
        data = await self._read()
        self.bytes_received += len(data)
        session.receive_data(data)
        if not data:
            return
        if session.buffered:
            if self._frame_deadline is None:
                self._frame_deadline = self._loop.time() + self.limits.frame_timeout
        else:
            self._frame_deadline = None

    async def _do_work(self) -> None:
        work = self.session.pending_work
        if work is None:  # pragma: no cover - NEED_WORK means there is some
            return
        started = time.perf_counter()
        pool = self.pool or default_pool()
        try:
            async with asyncio.timeout_at(self._handshake_deadline):
                outcome = await pool.run(work)
        except TimeoutError:
            await self._time_out(f"the handshake did not finish within "
                                 f"{self.limits.handshake_timeout:g} s ({work.kind} work "
                                 "still running)")
        self.last_work_ms = (time.perf_counter() - started) * 1000
        self.last_work_source = outcome.source if isinstance(outcome, PreparedDescriptor) \
            else ""
        if work.kind == "offer" and self.vet_offer is not None \
                and isinstance(outcome, PreparedDescriptor):
            try:
                self.vet_offer(outcome)
            except CBCLError as exc:
                outcome = exc
        self.session.complete_work(outcome)

    async def _read(self) -> bytes:
        limits = self.limits
        now = self._loop.time()
        if self._frame_deadline is not None:
            deadline, why = self._frame_deadline, (
                f"a frame did not arrive whole within {limits.frame_timeout:g} s")
        else:
            deadline, why = now + limits.idle_timeout, f"no data for {limits.idle_timeout:g} s"
        if self._handshaking() and self._handshake_deadline < deadline:
            deadline, why = self._handshake_deadline, (
                f"the handshake did not finish within {limits.handshake_timeout:g} s")
        try:
            async with asyncio.timeout_at(deadline):
                return await self.reader.read(limits.read_bytes)
        except TimeoutError:
            await self._time_out(why)
        except (ConnectionError, OSError):
            return b""  # a reset is an end of stream the session judges
        return b""  # pragma: no cover - _time_out raises

    async def _time_out(self, why: str) -> NoReturn:
        with contextlib.suppress(ConnectionLost):
            await self._write(self.session.refuse("timeout"))
        raise ConnectionLost(f"{why} in state {self.session.state.value}", code="timeout")

    async def send(self, event: Event) -> int:
        """Send ``event``; returns the bytes written."""
        data = self.session.send(event, now=self.clock())
        await self._write(data)
        return len(data)

    async def close(self) -> None:
        """Close cleanly: tell the session, close the stream, wait for it (at most 1 s)."""
        with contextlib.suppress(CBCLError):
            self.session.send(ConnectionClosed(), now=self.clock())
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError, TimeoutError):
            await asyncio.wait_for(self.writer.wait_closed(), 1.0)


async def connect(address: str, session: Session, *,
                  limits: ConnectionLimits | None = None, timeout: float = 10.0,
                  clock: Callable[[], int] = clock_ms,
                  pool: WorkPool | None = None) -> Connection:
    """Open a connection to ``address`` (``HOST:PORT`` or ``unix:PATH``) for ``session``.
    Raises :class:`ConnectionLost` when it cannot be opened within ``timeout`` seconds."""
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
    return Connection(reader, writer, session, limits=limits, clock=clock, pool=pool,
                      peer=address)


# --------------------------------------------------------------------------- a server


class _PeerCounts:
    """Open connections per peer address."""

    def __init__(self) -> None:
        self.total = 0
        self.by_peer: dict[str, int] = {}

    def add(self, peer: str) -> None:
        self.total += 1
        self.by_peer[peer] = self.by_peer.get(peer, 0) + 1

    def remove(self, peer: str) -> None:
        self.total -= 1
        left = self.by_peer[peer] - 1
        if left:
            self.by_peer[peer] = left
        else:
            del self.by_peer[peer]


class Server:
    """A listening :func:`serve` server. ``close()`` stops listening and, for a unix
    socket, removes the socket file it created (only if it is still that file)."""

    def __init__(self, server: asyncio.Server, unix: tuple[str, int, int] | None,
                 pool: WorkPool, own_pool: bool) -> None:
        self._server = server
        self._unix = unix
        self.pool = pool
        self._own_pool = own_pool
        #: Called once when the server is closed (after its own pool, if it owns one).
        self.on_close: list[Callable[[], None]] = []

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return tuple(self._server.sockets or ())

    def close(self) -> None:
        self._server.close()
        if self._unix is not None:
            path, device, inode = self._unix
            with contextlib.suppress(OSError):
                info = os.lstat(path)
                if (info.st_dev, info.st_ino) == (device, inode):
                    os.unlink(path)
            self._unix = None
        if self._own_pool:
            self.pool.close()
        callbacks, self.on_close = self.on_close, []
        for callback in callbacks:
            callback()

    async def wait_closed(self) -> None:
        await self._server.wait_closed()


def _claim_unix_path(path: str) -> None:
    """Make room for a unix socket at ``path``: nothing there, or a stale socket nobody
    answers on (removed). Raises :class:`ConnectionLost` for a live server or a file that
    is not a socket."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise ConnectionLost(f"cannot listen on unix:{path}: it exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # stale: left by a server that is gone
        return
    except OSError as exc:
        if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise ConnectionLost(f"cannot listen on unix:{path}: {exc.strerror or exc}"
                                 ) from None
        return
    finally:
        probe.close()
    raise ConnectionLost(f"cannot listen on unix:{path}: a server is answering there")


async def serve(address: str, make_session: Callable[[], Session],
                handle: Callable[[Connection], Awaitable[None]], *,
                limits: ConnectionLimits | None = None,
                server_limits: ServerLimits | None = None,
                clock: Callable[[], int] = clock_ms, pool: WorkPool | None = None,
                on_refusal: Callable[[str, str], None] | None = None) -> Server:
    """Listen on ``address``; each connection gets ``make_session()`` and is passed to
    ``handle``, then closed, whatever ``handle`` did. ``server_limits`` bound the server
    (see the module doc); ``pool`` runs the sessions' slow work (default: one of
    ``server_limits.compile_workers`` workers and ``compile_queue`` places, closed with
    the server; its :attr:`WorkPool.compile_gate` is what ``make_session``'s registries
    should use). ``on_refusal(peer, reason)`` is called once per refused connection.
    Returns the started :class:`Server`. Raises :class:`ConnectionLost` when the address
    cannot be used (a unix path a live server answers on included)."""
    kind, where = parse_address(address)
    limits = limits or ConnectionLimits()
    caps = server_limits or ServerLimits()
    own_pool = pool is None
    work = pool or WorkPool(caps.compile_workers, caps.compile_queue)
    slots = asyncio.Semaphore(caps.max_sessions)
    counts = _PeerCounts()

    def refused(peer: str, reason: str) -> None:
        if on_refusal is not None:
            on_refusal(peer, reason)

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = _peer_of(writer)
        reason = None
        if counts.total >= caps.max_connections:
            reason = f"{caps.max_connections} connections are open (max_connections)"
        elif counts.by_peer.get(peer, 0) >= caps.max_connections_per_peer:
            reason = (f"{caps.max_connections_per_peer} connections are open from this peer "
                      "(max_connections_per_peer)")
        if reason is not None:
            refused(peer, reason)
            with contextlib.suppress(ConnectionError, OSError):
                writer.write(not_understood_frame("busy", now=clock()))
            writer.close()
            return
        counts.add(peer)
        holding = False

        async def take_slot() -> None:
            nonlocal holding
            try:
                async with asyncio.timeout(caps.slot_timeout):
                    await slots.acquire()
            except TimeoutError:
                why = (f"no session slot within {caps.slot_timeout:g} s "
                       f"({caps.max_sessions} sessions at work)")
                with contextlib.suppress(ConnectionLost):
                    await connection._write(connection.session.refuse("busy"))
                raise ConnectionLost(why, code="busy") from None
            holding = True

        try:
            connection = Connection(reader, writer, make_session(), limits=limits,
                                    clock=clock, pool=work, peer=peer, slot=take_slot)
            try:
                await handle(connection)
            except ConnectionLost as exc:
                if exc.code == "busy":
                    refused(peer, exc.message)
                else:
                    raise
            finally:
                await connection.close()
        except asyncio.CancelledError:
            # The server is closing: this connection's task is the top of its own task
            # (asyncio.start_server's), whose result nobody awaits. Re-raised, CPython 3.11's
            # stream callback logs the cancellation as an error with a traceback (3.12 checks
            # task.cancelled() first); the connection is closed above either way.
            return
        finally:
            counts.remove(peer)
            if holding:
                slots.release()

    if kind == "unix":
        _claim_unix_path(where)
        server = await asyncio.start_unix_server(on_connect, where, limit=limits.read_bytes)
        info = os.lstat(where)
        return Server(server, (where, info.st_dev, info.st_ino), work, own_pool)
    try:
        server = await asyncio.start_server(on_connect, *where, limit=limits.read_bytes)
    except OSError as exc:
        raise ConnectionLost(f"cannot listen on {address}: {exc.strerror or exc}") from None
    return Server(server, None, work, own_pool)


def _peer_of(writer: asyncio.StreamWriter) -> str:
    """The peer's address for the per-peer caps: its IP; every unix client is ``unix``."""
    name = writer.get_extra_info("peername")
    if isinstance(name, tuple) and name:
        return str(name[0])
    return "unix"


class LearnedProtocols:
    """``cbcl serve``'s cap on protocols one peer address teaches: at most ``maximum``
    distinct digests per peer, for the server's lifetime (the most recent 16,384 peers are
    remembered). :meth:`vet` raises :class:`LimitError` for one more."""

    def __init__(self, maximum: int, *, peers: int = 16_384) -> None:
        self.maximum = maximum
        self.peers = peers
        self._learned: OrderedDict[str, set[str]] = OrderedDict()

    def vet(self, peer: str, prepared: PreparedDescriptor) -> None:
        learned = self._learned.setdefault(peer, set())
        self._learned.move_to_end(peer)
        digest = prepared.descriptor.digest
        if digest not in learned:
            if len(learned) >= self.maximum:
                raise LimitError(f"this peer has taught {len(learned)} protocols already "
                                 "(max_learned_per_peer)", limit="max_learned_per_peer",
                                 maximum=self.maximum)
            learned.add(digest)
        while len(self._learned) > self.peers:
            self._learned.popitem(last=False)
