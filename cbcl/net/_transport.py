"""Sessions over TCP and Unix sockets (spec/negotiation.md §6).

Theory of operation
-------------------
The transport is the only place with sockets and a clock. A :class:`Connection` pairs a
stream with a sans-io :class:`~cbcl.session._session.Session` and runs it on the event loop: it
reads only when the session needs data, writes whatever the session produced, and hands
the only slow work there is — verifying and compiling an offered descriptor, recording
it — to a :class:`WorkPool` of dedicated threads (the compile itself runs in the guarded
worker process). Parsing, decoding and session steps take microseconds and never leave
the loop, so a slow compile delays no other peer's frames.

The socket is an :class:`asyncio.Protocol` (:class:`_Socket`), not a stream: bytes wait
in a buffer bounded as a stream reader's (reading pauses over ``2 * read_bytes``), and the
connection's task reads from it while it negotiates. Once the session is ESTABLISHED and
the task is parked in a read, the socket's ``data_received`` does the task's work itself
(:meth:`Connection._run_now`): it feeds the session ``read_bytes`` at a time, hands each
event to the link's ``take_now`` (on-loop handlers run there) and writes the replies of
that read together, :data:`WRITE_BATCH` at most per write; the first thing it cannot
finish there it leaves to the task, which it wakes. No stream reader, read coroutine or
future per message.

Answers to frames that arrived together share a write (one ``send`` and one wake-up of
the peer for several), but at most :data:`WRITE_BATCH` of them (here and in
:meth:`Connection._write`, for answers the task makes while more frames wait): with
requests pipelined, a write of a whole read's answers made the two processes take turns
on whole batches, each idle while the other worked (8 in flight: 8 requests handled here,
then 8 replies there, never both at once). Writes of at most 4 let the peer start on the
first answers while the rest are made, and still spare most writes and wake-ups (one a
frame costs more CPU than it saves in waiting on a loaded machine).

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

Unauthenticated connections are cheap and fair. Until its handshake is ESTABLISHED (the
peer's signed Finished verified) a served connection is *pending*: it must get there
within ``pre_handshake_timeout`` of the peer's own time (the server's work for it and its
wait for a slot do not count), and one peer address holds at most ``pre_handshake_share``
of the connections, and of the session slots, while pending. When the connections or the
slots are full, a newcomer is not refused (or left waiting) while a pending connection
could make room: the oldest pending connection of the address that holds the most
pending ones is evicted (told ``busy``, closed) and its place — its session slot too —
goes to the newcomer. A newcomer whose own address holds as many as any (or has reached
its share) evicts its own oldest, never another address's, so no address keeps its own
connections by pushing others out. :class:`_Pending` finds the victim in O(1): per
address its pending connections oldest first, and the addresses bucketed by how many they
hold. Only when every connection (or every slot) is authenticated is a newcomer refused
(or left to wait ``slot_timeout``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NoReturn, cast

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

logger = logging.getLogger("cbcl.net")

#: The most answers held back for one write while more frames wait (see the module doc).
WRITE_BATCH = 4


def _check_seconds(name: str, value: object, *, upper: float = 86_400.0) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) \
            or not 0 < value <= upper:  # NaN fails both comparisons
        raise ValueError(f"{name} must be a number of seconds in (0, {upper:g}]")


def _check_count(name: str, value: object, *, upper: int = 1 << 20, lower: int = 1) -> None:
    if type(value) is not int or not lower <= value <= upper:
        raise ValueError(f"{name} must be an int from {lower} to {upper}")


def _check_fraction(name: str, value: object, *, lower: float = 0.001) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) \
            or not lower <= value <= 1:  # NaN fails both comparisons
        raise ValueError(f"{name} must be a number from {lower:g} to 1")


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
    teach this server in its lifetime (distinct protocol ids: a newer version of an id it
    taught counts no more; see :class:`LearnedProtocols`);
    ``compile_workers``: offers verified and compiled at once; ``compile_queue``: offers
    waiting for a worker (one more is rejected with ``limit``).

    Before its handshake is ESTABLISHED a connection is *pending* (see the module doc):
    ``pre_handshake_timeout``: seconds of the peer's time a pending connection may take
    (the server's own work for it and its wait for a slot are not counted; the whole
    handshake is still bounded by ``handshake_timeout``); ``pre_handshake_share``: the
    fraction of ``max_connections``, and of ``max_sessions``, one peer address may hold
    pending (at least one of each) — one more evicts that address's oldest pending one.
    When the connections or the slots are full, the oldest pending connection of the
    address holding the most is evicted (``busy``) to make room for a newcomer.

    Refusals (a :class:`~cbcl.session.RefusalBudget` the server's sessions share):
    ``max_refusals`` frames of one peer address refused within ``refusal_window`` seconds
    (each refusal ends its connection); after that, that address's connections are
    answered NOT-UNDERSTOOD ``limit`` (``max_refusals``) at their first frame, unread,
    until the oldest refusal is a window old (ESTABLISHED sessions are not cut).
    Raises ``ValueError`` for a value out of range."""

    max_connections: int = 1024
    max_connections_per_peer: int = 256
    max_sessions: int = 256
    slot_timeout: float = 5.0
    max_conversations: int = 1024
    max_learned_per_peer: int = 16
    compile_workers: int = 2
    compile_queue: int = 16
    pre_handshake_timeout: float = 5.0
    pre_handshake_share: float = 0.125
    max_refusals: int = 16
    refusal_window: float = 10.0

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_connections_per_peer", "max_sessions",
                     "max_conversations", "max_learned_per_peer"):
            _check_count(name, getattr(self, name))
        # (at most 1,024: the budget remembers that many times for each of 4,096 addresses)
        _check_count("max_refusals", self.max_refusals, upper=1024)
        _check_count("compile_workers", self.compile_workers, upper=256)
        _check_count("compile_queue", self.compile_queue, upper=1 << 16, lower=0)
        _check_seconds("slot_timeout", self.slot_timeout)
        _check_seconds("pre_handshake_timeout", self.pre_handshake_timeout)
        _check_seconds("refusal_window", self.refusal_window)
        _check_fraction("pre_handshake_share", self.pre_handshake_share)

    def pending_share(self, total: int) -> int:
        """How many of ``total`` places (connections or session slots) one peer address
        may hold pending: ``pre_handshake_share`` of them, rounded down, at least 1."""
        return max(1, int(total * self.pre_handshake_share))


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


# --------------------------------------------------------------------------- the socket


class _Socket(asyncio.Protocol):
    """A connection's socket as an :class:`asyncio.Protocol` (no stream reader, no read
    coroutine per chunk): what arrives waits in a buffer of at most ``2 * limit`` bytes
    (then reading pauses until it is down to ``limit``, as a stream reader's does), and
    :meth:`read` takes up to ``n`` bytes of it. Once its :attr:`connection` is ESTABLISHED
    and parked in a read, :meth:`data_received` hands the bytes straight to it
    (:meth:`Connection._run_now`): its events are taken in the callback itself. Writing:
    :attr:`writer` (:class:`_Writer`), whose :meth:`_Writer.drain` waits while the
    transport's buffer is over its high-water mark (``pause_writing``)."""

    def __init__(self, limit: int,
                 on_connect: Callable[[_Socket], None] | None = None) -> None:
        self.limit = limit
        self.transport: asyncio.Transport | None = None
        self.writer = _Writer(self)
        self.connection: Connection | None = None
        self._on_connect = on_connect
        self._buffer = bytearray()
        self._eof = False
        self._lost = False
        self._error: BaseException | None = None
        self._reading_paused = False
        self._writing_paused = False
        self._waiter: asyncio.Future[None] | None = None  # a read waiting for bytes
        self._nudged = False  # wake the read with nothing (see Connection._run_now)
        self._drainers: list[asyncio.Future[None]] = []
        self.task: asyncio.Task[Any] | None = None  # a served connection's task
        # (kept: asyncio.get_running_loop() costs a getpid() system call on CPython 3.11)
        self._loop = asyncio.get_running_loop()
        self.closed: asyncio.Future[None] = self._loop.create_future()

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        if self._on_connect is not None:
            self._on_connect(self)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        connection = self.connection
        if connection is not None and connection._fast_ready():
            connection._run_now()
        else:
            self._wake()
        if not self._reading_paused and len(self._buffer) > 2 * self.limit \
                and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        return False  # the transport closes itself (as a stream's does)

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = self._lost = True
        self._error = exc
        self._wake()
        for drainer in self._drainers:
            if not drainer.done():
                drainer.set_result(None)
        self._drainers.clear()
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        for drainer in self._drainers:
            if not drainer.done():
                drainer.set_result(None)
        self._drainers.clear()

    # -- reading

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def nudge(self) -> None:
        """Wake the read in progress with nothing read (it returns ``None``)."""
        self._nudged = True
        self._wake()

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def take(self, n: int) -> bytes:
        """Up to ``n`` bytes of what arrived (``b""`` when nothing is buffered)."""
        buffer = self._buffer
        if len(buffer) <= n:
            data = bytes(buffer)
            buffer.clear()
        else:
            data = bytes(memoryview(buffer)[:n])
            del buffer[:n]
        if self._reading_paused and len(buffer) <= self.limit and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()
        return data

    async def read(self, n: int) -> bytes | None:
        """Up to ``n`` bytes; ``b""`` at the end of the stream (or a reset: what it
        left unread is dropped, as a stream reader does), ``None`` when :meth:`nudge`
        woke it first."""
        while True:
            if self._nudged:
                self._nudged = False
                return None
            if self._error is not None:
                return b""
            if self._buffer:
                return self.take(n)
            if self._eof:
                return b""
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    @property
    def waiting(self) -> bool:
        """Whether a read is parked waiting for bytes."""
        waiter = self._waiter
        return waiter is not None and not waiter.done() and not self._nudged


class _Writer:
    """The write half of a :class:`_Socket`, with what :class:`Connection` (and a test)
    uses of an :class:`asyncio.StreamWriter`."""

    def __init__(self, socket_: _Socket) -> None:
        self._socket = socket_

    @property
    def transport(self) -> asyncio.Transport:
        transport = self._socket.transport
        if transport is None:  # pragma: no cover - made with the transport
            raise ConnectionLost("not connected")
        return transport

    def write(self, data: bytes) -> None:
        self.transport.write(data)

    async def drain(self) -> None:
        """Wait while the transport's buffer is over its high-water mark. Raises
        ``ConnectionResetError`` once the connection is lost."""
        sock = self._socket
        if sock._lost:
            raise ConnectionResetError("Connection lost")
        if self.transport.is_closing():
            await asyncio.sleep(0)  # (as a stream writer: let connection_lost run)
            if sock._lost:
                raise ConnectionResetError("Connection lost")
        while sock._writing_paused and not sock._lost:
            drainer = asyncio.get_running_loop().create_future()
            sock._drainers.append(drainer)
            await drainer
        if sock._lost:
            raise ConnectionResetError("Connection lost")

    def close(self) -> None:
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.transport.get_extra_info(name, default)

    async def wait_closed(self) -> None:
        await asyncio.shield(self._socket.closed)


# --------------------------------------------------------------------------- a connection


#: States in which the handshake deadline no longer applies.
_HANDSHAKE_OVER = FINAL | {HandshakeState.ESTABLISHED}


class Connection:
    """A :class:`Session` on a socket (a :class:`_Socket`, or an asyncio stream's reader
    and writer), run on the event loop.

    ``pool`` runs the session's slow work (default :func:`default_pool`); ``vet_offer``,
    if set, is called on the loop with each offer that passed every check, and may raise a
    :class:`CBCLError` to refuse it (``cbcl serve``'s per-peer cap); ``guard_record``, if
    set, runs the recording of the accepted offer in the worker thread, as
    ``guard_record(prepared, record)``: it calls ``record()`` (or raises a
    :class:`CBCLError` to refuse) under whatever lock makes its own decision and the
    record one (:meth:`LearnedProtocols.record`). ``slot`` is taken when the first whole
    frame arrives (see :func:`serve`). ``pre_handshake_timeout``: seconds of the peer's
    time until ESTABLISHED (the time the server's work and ``slot`` take is not counted;
    ``None``: no such deadline); ``on_established`` is called once when the handshake is
    ESTABLISHED. :meth:`evict` ends the connection from outside its task."""

    def __init__(self, reader: asyncio.StreamReader | _Socket,
                 writer: asyncio.StreamWriter | _Writer, session: Session, *,
                 limits: ConnectionLimits | None = None,
                 clock: Callable[[], int] = clock_ms, pool: WorkPool | None = None,
                 peer: str = "", slot: Callable[[], Awaitable[None]] | None = None,
                 pre_handshake_timeout: float | None = None) -> None:
        self.reader = reader
        self.writer = writer
        if isinstance(reader, _Socket):
            reader.connection = self  # (its fast path: see _run_now)
        self._start(session, limits=limits or ConnectionLimits(), clock=clock, pool=pool,
                    peer=peer, slot=slot, pre_handshake_timeout=pre_handshake_timeout)
        session.peer_address = peer or None  # (what its refusal budget charges)

    def _start(self, session: Session, *, limits: ConnectionLimits,
               clock: Callable[[], int], pool: WorkPool | None, peer: str,
               slot: Callable[[], Awaitable[None]] | None,
               pre_handshake_timeout: float | None = None) -> None:
        """The state of a connection over any carrier (a stream here, NATS in
        :mod:`cbcl.net._nats`): the session, its limits and deadlines, the counters."""
        self.session = session
        session.defer_work = True
        self.limits = limits
        self.clock = clock
        self.pool = pool
        self.peer = peer
        self.vet_offer: Callable[[PreparedDescriptor], None] | None = None
        self.guard_record: Callable[[PreparedDescriptor, Callable[[], Any]], Any] | None \
            = None
        self.on_established: Callable[[], None] | None = None
        self._slot = slot
        self._offered: PreparedDescriptor | None = None  # the offer vetted, to record
        self._pending = True  # not ESTABLISHED yet
        #: Why the server evicted this connection (see :meth:`evict`), or ``None``.
        self.evicted: str | None = None
        self._waiting: asyncio.Timeout | None = None  # the wait evict() cuts short
        #: Milliseconds the last slow work took (verifying, compiling, recording).
        self.last_work_ms = 0.0
        #: Where the last offer's compiled grammar came from (``compiled``, ``memory
        #: cache``, ``disk cache``; empty when it was refused).
        self.last_work_source = ""
        self.bytes_sent = 0
        #: Writes to the stream (answers to frames that arrived together share one, at
        #: most WRITE_BATCH to a write).
        self.writes = 0
        self._held: list[bytes] = []  # answers held back for one write (see _write)
        self._flush_soon = False
        #: Bytes the session produced by itself on the last event (its automatic replies).
        self.last_flush_bytes = 0
        self.bytes_received = 0
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._handshake_deadline = loop.time() + self.limits.handshake_timeout
        self._frame_deadline: float | None = None
        # The read in progress (its task), its deadline and the one timer that keeps it.
        self._reading: asyncio.Task[Any] | None = None
        self._read_deadline = 0.0
        self._read_timer: asyncio.TimerHandle | None = None
        self._read_cut = False  # the read was cancelled for its deadline (or an eviction)
        self._read_why = ""  # what the read's deadline is, to say when it passes
        #: Takes an event in the socket's callback once ESTABLISHED (set by the events'
        #: owner, a Link; see _run_now): returns True when it took it whole, False when it
        #: did not take it (next_event returns it), or a coroutine function that finishes
        #: it (next_event awaits it before taking anything more).
        self.take_now: Callable[[Event], bool | Callable[[], Awaitable[None]]] | None = None
        # What the fast path left to next_event: ("event", e), ("error", exc), ("then", f).
        self._taken: tuple[str, Any] | None = None
        self._batch: list[bytes] | None = None  # the replies of the read handled now
        self._pre_handshake_timeout = pre_handshake_timeout
        self._pre_handshake_deadline = None if pre_handshake_timeout is None \
            else loop.time() + pre_handshake_timeout

    def _not_the_peers_time(self, started: float) -> None:
        """The server spent the time since ``started`` (loop time) on its own work or
        waits for this connection: the peer's pre-handshake deadline moves by as much."""
        if self._pre_handshake_deadline is not None:
            self._pre_handshake_deadline += self._loop.time() - started

    def _busy(self) -> ConnectionLost:
        return ConnectionLost(self.evicted or "evicted", code="busy")

    def evict(self, why: str) -> None:
        """End this connection for the server's own limits, from outside its task: tell the
        peer NOT-UNDERSTOOD ``busy`` (best effort), close the stream, and wake the task
        where it waits, which then raises :class:`ConnectionLost` (code ``busy``) with
        ``why``. A second call does nothing."""
        if self.evicted is not None:
            return
        self.evicted = why
        with contextlib.suppress(ConnectionError, OSError, CBCLError):
            self.writer.write(self.session.refuse("busy"))
        self.writer.close()
        waiting = self._waiting
        if waiting is not None:
            with contextlib.suppress(RuntimeError):  # its deadline is passing anyway
                waiting.reschedule(self._loop.time())
        self._cut_read()

    async def _write(self, data: bytes) -> None:
        if not data:
            return
        if self.evicted is not None:
            raise self._busy()
        session = self.session
        if session.frames_waiting and len(self._held) + 1 < WRITE_BATCH \
                and session.state is HandshakeState.ESTABLISHED:
            # More frames are waiting to be answered now: their answers go out in one
            # write, when the last is answered, WRITE_BATCH are held (the peer starts on
            # those while the rest are made), or at the end of this turn of the loop.
            # (Never a refusal: the session is then in ERROR, and it is written at once.)
            self._held.append(data)
            self.bytes_sent += len(data)
            if not self._flush_soon:
                self._flush_soon = True
                self._loop.call_soon(self._write_held)
            return
        size = len(data)
        if self._held:
            self._held.append(data)
            data = b"".join(self._held)
            self._held.clear()
        writer = self.writer
        try:
            writer.write(data)
            transport = writer.transport
            # Most writes leave nothing buffered (the socket took it all): then there is
            # nothing to wait for, and drain() would only check that. A closing stream, or
            # bytes left in the buffer, take the full drain (which raises for a lost peer
            # and waits while the buffer is over its high-water mark).
            if transport.is_closing() or transport.get_write_buffer_size():
                await writer.drain()
        except (ConnectionError, OSError) as exc:
            if self.evicted is not None:  # we closed it, while it waited to write
                raise self._busy() from None
            raise ConnectionLost(f"the peer is gone ({exc.strerror or exc}) in state "
                                 f"{self.session.state.value}{self.session._where()}"
                                 ) from None
        self.bytes_sent += size
        self.writes += 1

    def _write_held(self) -> None:
        """Write the answers held back (see :meth:`_write`); a peer gone by now is found
        by the next read."""
        self._flush_soon = False
        if not self._held or self.evicted is not None:
            return
        data = b"".join(self._held)
        self._held.clear()
        with contextlib.suppress(ConnectionError, OSError, RuntimeError):
            if not self.writer.transport.is_closing():
                self.writer.write(data)
                self.writes += 1

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
            if self.evicted is not None:
                raise self._busy()
            if self._taken is not None:
                kind, taken = self._taken
                self._taken = None
                if kind == "event":
                    return taken  # type: ignore[no-any-return]
                if kind == "then":
                    await taken()
                    continue
                if isinstance(taken, RemoteProtocolError):
                    with contextlib.suppress(ConnectionLost):
                        await self.flush()
                raise taken
            if self._slot is not None and session.frames_waiting:
                take, self._slot = self._slot, None
                started = self._loop.time()
                await take()
                self._not_the_peers_time(started)
            if session.needs_data:  # (known without asking next_event: the common case)
                event: object = NEED_DATA
            else:
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
                if self._pending and session.state is HandshakeState.ESTABLISHED:
                    self._pending = False
                    if self.on_established is not None:
                        self.on_established()
                if self._checks_accepted:
                    await self._accepted(event)  # type: ignore[arg-type]
                data = session.data_to_send()
                self.last_flush_bytes = len(data)
                if data:
                    await self._write(data)
                return event  # type: ignore[return-value]
            # (flush(), without a coroutine when the session has nothing to say: mostly)
            data = session.data_to_send()
            self.last_flush_bytes = len(data)
            if data:
                await self._write(data)
            await self._receive()

    async def _accepted(self, event: Event) -> None:
        """Called with each event before :meth:`next_event` returns it (a transport's own
        checks of it: nothing here; a subclass that has some overrides it)."""

    @property
    def _checks_accepted(self) -> bool:
        return type(self)._accepted is not Connection._accepted

    async def _receive(self) -> None:
        """Read what the peer sent next into the session, keeping the frame deadline."""
        data = await self._read()
        if data is not None:
            self._feed(data)

    def _feed(self, data: bytes) -> None:
        session = self.session
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
        started, on_loop = time.perf_counter(), self._loop.time()
        pool = self.pool or default_pool()
        offered, guard = self._offered, self.guard_record
        if work.kind == "record" and guard is not None and offered is not None:
            record = work.run
            work = Work("record", lambda: guard(offered, record))
        try:
            async with asyncio.timeout_at(self._handshake_deadline) as waiting:
                self._waiting = waiting
                outcome = await pool.run(work)
        except TimeoutError:
            if self.evicted is not None:
                raise self._busy() from None
            await self._time_out(f"the handshake did not finish within "
                                 f"{self.limits.handshake_timeout:g} s ({work.kind} work "
                                 "still running)")
        finally:
            self._waiting = None
        if self.evicted is not None:
            raise self._busy()
        self._not_the_peers_time(on_loop)
        self.last_work_ms = (time.perf_counter() - started) * 1000
        self.last_work_source = outcome.source if isinstance(outcome, PreparedDescriptor) \
            else ""
        if work.kind == "offer" and self.vet_offer is not None \
                and isinstance(outcome, PreparedDescriptor):
            try:
                self.vet_offer(outcome)
            except CBCLError as exc:
                outcome = exc
        if work.kind == "offer":
            self._offered = outcome if isinstance(outcome, PreparedDescriptor) else None
        self.session.complete_work(outcome)

    def _arm_read(self) -> None:
        """Set the read's deadline (and what to say when it passes), keeping the one timer
        per connection (see :meth:`_read_due`)."""
        # (what to say is kept as a kind, put in words only when the deadline passes)
        if self._frame_deadline is not None:
            deadline, why = self._frame_deadline, "frame"
        else:
            deadline, why = self._loop.time() + self.limits.idle_timeout, "idle"
        if self._pending:
            if self._handshaking() and self._handshake_deadline < deadline:
                deadline, why = self._handshake_deadline, "handshake"
            pre = self._pre_handshake_deadline
            if pre is not None and pre < deadline:
                deadline, why = pre, "pre-handshake"
        # (not pending: ESTABLISHED was reached, so the handshake is over — the states
        # after it are final — and its deadline no longer applies)
        # One timer per connection, not one per read (see _cut_read): a read only moves
        # the deadline, and the timer is set again when it fires early or must fire sooner.
        self._read_deadline = deadline
        self._read_why = why
        timer = self._read_timer
        if timer is None or timer.when() > deadline:
            if timer is not None:
                timer.cancel()
            self._read_timer = self._loop.call_at(deadline, self._read_due)

    async def _read(self) -> bytes | None:
        """What the peer sent next (``b""``: the end of the stream), ``None`` when the
        socket's fast path woke the read with something for :meth:`next_event`."""
        self._arm_read()
        data: bytes | None = b""
        task = asyncio.current_task(self._loop)  # (with the loop: no getpid() call)
        if task is None:  # pragma: no cover - a coroutine always runs in a task here
            raise RuntimeError("Connection._read outside a task")
        cancelling = task.cancelling()
        self._reading = task
        try:
            data = await self.reader.read(self.limits.read_bytes)
        except asyncio.CancelledError:
            if not self._read_cut or task.uncancel() > cancelling:
                raise  # the caller's own cancellation
            self._read_cut = False
            if self.evicted is None:
                await self._time_out(self._deadline_text(self._read_why))
        except (ConnectionError, OSError):
            pass  # a reset is an end of stream the session judges
        finally:
            self._reading = None
        if self.evicted is not None:
            raise self._busy()
        return data

    def _deadline_text(self, kind: str) -> str:
        limits = self.limits
        if kind == "frame":
            return f"a frame did not arrive whole within {limits.frame_timeout:g} s"
        if kind == "idle":
            return f"no data for {limits.idle_timeout:g} s"
        if kind == "handshake":
            return f"the handshake did not finish within {limits.handshake_timeout:g} s"
        return (f"the handshake did not finish within {self._pre_handshake_timeout:g} s of "
                "the peer's time (pre_handshake_timeout)")

    def _read_due(self) -> None:
        """The read timer fired: cut the read short if its deadline has passed, or set the
        timer again for the deadline it has now (a later read moved it)."""
        self._read_timer = None
        if self._reading is None:
            return  # not reading: the next read sets the timer again
        if self._loop.time() < self._read_deadline:
            self._read_timer = self._loop.call_at(self._read_deadline, self._read_due)
            return
        self._cut_read()

    def _cut_read(self) -> None:
        """Cancel the read in progress as its deadline (:meth:`_read` tells the two
        cancellations apart, as ``asyncio.timeout`` does)."""
        task = self._reading
        if task is not None and not self._read_cut:
            self._read_cut = True
            task.cancel()

    async def _time_out(self, why: str) -> NoReturn:
        with contextlib.suppress(ConnectionLost):
            await self._write(self.session.refuse("timeout"))
        raise ConnectionLost(f"{why} in state {self.session.state.value}", code="timeout")

    async def send(self, event: Event) -> int:
        """Send ``event``; returns the bytes written."""
        data = self.session.send(event, now=self.clock())
        await self._write(data)
        return len(data)

    # ----------------------------------------------------------------- the fast path

    def _fast_ready(self) -> bool:
        """Whether bytes that arrive now may be handled in the socket's callback: the
        session ESTABLISHED, its owner taking events there, and this connection's task
        parked in a read with nothing left for it to do first."""
        reader = self.reader
        return (self.take_now is not None and self._reading is not None
                and not self._read_cut and self._taken is None and self._batch is None
                and self.evicted is None and not self._pending and self._slot is None
                and not self._held
                and self.session.state is HandshakeState.ESTABLISHED
                and isinstance(reader, _Socket) and reader.waiting
                and not reader._writing_paused)

    def _run_now(self) -> None:
        """The socket's callback with bytes, the task parked in :meth:`_read`: do here
        what the task would — feed the session at most ``read_bytes`` at a time, take its
        events (:attr:`take_now`: on-loop handlers run there, their replies go through
        :meth:`send_now`) — and write the replies of this read in writes of at most
        :data:`WRITE_BATCH` frames' replies (the peer starts on those meanwhile). The first
        event :attr:`take_now` does not finish, an error, work or the end of the stream,
        or a full write buffer, is left for the task: the read is woken with nothing
        (``None``) and :meth:`next_event` goes on from :attr:`_taken`. Frames, limits,
        refusals and deadlines are the task's, unchanged."""
        reader: _Socket = self.reader  # type: ignore[assignment]  # (see _fast_ready)
        session, take = self.session, self.take_now
        if take is None:  # pragma: no cover - checked by _fast_ready
            return
        read_bytes = self.limits.read_bytes
        now = self.clock()  # (one clock for the frames of one read)
        batch: list[bytes] = []
        self._batch = batch
        answered = 0  # frames taken since the last write
        wake = False
        try:
            while True:
                if reader._writing_paused:
                    self._taken = ("then", self._drain)
                    break
                # (the session says what it needs without a call of next_event when it
                # holds nothing: so when the callback begins, and after its last frame)
                if session.needs_data:
                    event: object = NEED_DATA
                else:
                    try:
                        event = session.next_event(now=now)
                    except Exception as exc:  # RemoteProtocolError, or a bug: the task's
                        self._taken = ("error", exc)
                        break
                if event is NEED_DATA:
                    if not reader.buffered:
                        break
                    self._feed(reader.take(read_bytes))
                    continue
                if event is NEED_WORK:
                    wake = True
                    break
                data = session.data_to_send()
                if data:
                    batch.append(data)
                    self.bytes_sent += len(data)
                try:
                    taken = take(event)  # type: ignore[arg-type]
                except Exception as exc:  # a bug: raised in the task, as it would have been
                    self._taken = ("error", exc)
                    break
                answered += 1
                if answered >= WRITE_BATCH:  # (the peer starts on these meanwhile)
                    if batch:
                        self._write_now(b"".join(batch) if len(batch) > 1 else batch[0])
                        batch.clear()
                    answered = 0
                if taken is True:
                    continue
                self._taken = ("event", event) if taken is False else ("then", taken)
                break
        finally:
            self._batch = None
            if batch:
                self._write_now(b"".join(batch) if len(batch) > 1 else batch[0])
        if self._taken is not None or wake or self.evicted is not None:
            reader.nudge()
        else:
            self._arm_read()  # the deadline of the next frame (or of the one begun)

    def _write_now(self, data: bytes) -> None:
        """Write without waiting (a peer gone by now is found by the next read)."""
        transport = self.reader.transport  # type: ignore[union-attr]  # (a _Socket's)
        try:
            if transport is not None and not transport.is_closing():
                transport.write(data)
                self.writes += 1
        except (ConnectionError, OSError, RuntimeError):
            pass

    async def _drain(self) -> None:
        """Wait until the transport's buffer is below its high-water mark. Raises
        :class:`ConnectionLost` for a peer gone meanwhile."""
        try:
            await self.writer.drain()
        except (ConnectionError, OSError) as exc:
            if self.evicted is not None:
                raise self._busy() from None
            raise ConnectionLost(f"the peer is gone ({exc.strerror or exc}) in state "
                                 f"{self.session.state.value}{self.session._where()}"
                                 ) from None

    @property
    def sends_now(self) -> bool:
        """Whether :meth:`send_now` can write here (a socket's connection)."""
        return isinstance(self.reader, _Socket)

    def send_now(self, event: Event) -> int:
        """:meth:`send` without waiting, for :attr:`take_now`: in the socket's callback
        the bytes join that read's next write; elsewhere they are written at once (a full
        buffer is waited for by the next :meth:`send`). Returns the bytes sent. Raises
        what :meth:`Session.send` raises (nothing is sent) and :class:`ConnectionLost`
        (code ``busy``) once evicted."""
        if self.evicted is not None:
            raise self._busy()
        data = self.session.send(event, now=self.clock())
        self.bytes_sent += len(data)
        batch = self._batch
        if batch is not None:
            batch.append(data)
        elif isinstance(self.reader, _Socket):
            self._write_now(data)
        else:  # pragma: no cover - take_now runs only on a _Socket's connection
            self.writer.write(data)
            self.writes += 1
        return len(data)

    async def close(self) -> None:
        """Close cleanly: tell the session, close the stream, wait for it (at most 1 s)."""
        with contextlib.suppress(CBCLError):
            self.session.send(ConnectionClosed(), now=self.clock())
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None
        self._write_held()
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
    loop = asyncio.get_running_loop()
    read_bytes = limits.read_bytes
    try:
        if kind == "unix":
            opening = loop.create_unix_connection(lambda: _Socket(read_bytes), where)
        else:
            opening = loop.create_connection(lambda: _Socket(read_bytes), *where)
        _, sock = await asyncio.wait_for(opening, timeout)
    except (OSError, TimeoutError) as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        raise ConnectionLost(f"cannot connect to {address}: {reason}") from None
    return Connection(sock, sock.writer, session, limits=limits, clock=clock, pool=pool,
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


class _Served:
    """One connection of a :func:`serve` server, as its bookkeeping sees it."""

    __slots__ = ("connection", "counted", "holding", "peer", "started")

    def __init__(self, peer: str, started: float) -> None:
        self.peer = peer
        self.connection: Connection | None = None
        self.counted = False  # in the connection counts
        self.holding = False  # holds a session slot
        self.started = started  # loop time


class _Pending:
    """Pending (not yet ESTABLISHED) connections: per peer address oldest first, and the
    addresses bucketed by how many they hold, so that :meth:`victim` is O(1) (counts move
    by one at a time, so the largest is kept exactly). Ordered dicts, not dicts: a dict
    emptied from the front finds its first key by skipping every deleted slot."""

    def __init__(self) -> None:
        self._by_peer: dict[str, OrderedDict[_Served, None]] = {}  # oldest first
        self._peers_holding: dict[int, OrderedDict[str, None]] = {}  # count -> peers
        self._most = 0

    def __contains__(self, served: _Served) -> bool:
        return served in self._by_peer.get(served.peer, ())

    def count(self, peer: str) -> int:
        return len(self._by_peer.get(peer, ()))

    def _move(self, peer: str, before: int, after: int) -> None:
        if before:
            bucket = self._peers_holding[before]
            del bucket[peer]
            if not bucket:
                del self._peers_holding[before]
                if self._most == before and after < before:
                    self._most = after
        if after:
            self._peers_holding.setdefault(after, OrderedDict())[peer] = None
            self._most = max(self._most, after)

    def add(self, served: _Served) -> None:
        held = self._by_peer.setdefault(served.peer, OrderedDict())
        held[served] = None
        self._move(served.peer, len(held) - 1, len(held))

    def discard(self, served: _Served) -> None:
        held = self._by_peer.get(served.peer)
        if held is None or served not in held:
            return
        del held[served]
        self._move(served.peer, len(held) + 1, len(held))
        if not held:
            del self._by_peer[served.peer]

    def oldest(self, peer: str) -> _Served | None:
        held = self._by_peer.get(peer)
        return next(iter(held)) if held else None

    def victim(self, peer: str) -> _Served | None:
        """Whom a newcomer from ``peer`` evicts when every place is taken: the oldest
        pending connection of the address holding the most — its own when its own, with
        the newcomer, holds at least as many as any — or ``None`` when none is pending."""
        own = self.count(peer)
        if own and own + 1 >= self._most:
            return self.oldest(peer)
        if not self._most:
            return None
        return self.oldest(next(iter(self._peers_holding[self._most])))


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
    pending = _Pending()  # connections not ESTABLISHED yet
    pending_slots = _Pending()  # those of them that hold a session slot
    connection_share = caps.pending_share(caps.max_connections)
    slot_share = caps.pending_share(caps.max_sessions)
    loop = asyncio.get_running_loop()

    def refused(peer: str, reason: str) -> None:
        if on_refusal is not None:
            on_refusal(peer, reason)

    def release(served: _Served) -> None:
        """Give back whatever ``served`` holds (a second call does nothing)."""
        if served.counted:
            served.counted = False
            counts.remove(served.peer)
        pending.discard(served)
        pending_slots.discard(served)
        if served.holding:
            served.holding = False
            slots.release()

    def evict(victim: _Served, why: str) -> None:
        """Close a pending connection to make room (its task reports the refusal)."""
        if victim.connection is not None:
            victim.connection.evict(f"evicted after {loop.time() - victim.started:.1f} s "
                                    f"without a finished handshake to make room: {why}")
        release(victim)

    async def on_connect(reader: _Socket, writer: _Writer) -> None:
        peer = _peer_of(writer)
        reason = victim = None
        if counts.by_peer.get(peer, 0) >= caps.max_connections_per_peer:
            reason = (f"{caps.max_connections_per_peer} connections are open from this peer "
                      "(max_connections_per_peer)")
        elif pending.count(peer) >= connection_share:
            victim, why = pending.oldest(peer), (
                f"its address holds {connection_share} pending connections "
                "(pre_handshake_share)")
        elif counts.total >= caps.max_connections:
            victim = pending.victim(peer)
            why = reason = f"{caps.max_connections} connections are open (max_connections)"
            if victim is not None:
                reason = None
        if reason is not None:
            refused(peer, reason)
            with contextlib.suppress(ConnectionError, OSError):
                writer.write(not_understood_frame("busy", now=clock()))
            writer.close()
            return
        if victim is not None:
            evict(victim, why)
        served = _Served(peer, loop.time())
        counts.add(peer)
        served.counted = True
        pending.add(served)

        async def take_slot() -> None:
            connection = served.connection
            if connection is None:  # pragma: no cover - set before the session runs
                return
            victim = None
            if pending_slots.count(peer) >= slot_share:
                victim, why = pending_slots.oldest(peer), (
                    f"its address holds {slot_share} pending sessions (pre_handshake_share)")
            elif slots.locked():
                victim = pending_slots.victim(peer)
                why = f"{caps.max_sessions} sessions are at work (max_sessions)"
            if victim is not None:
                victim.holding = False  # its slot passes to this connection
                evict(victim, why)
            else:
                try:
                    async with asyncio.timeout(caps.slot_timeout) as waiting:
                        connection._waiting = waiting
                        await slots.acquire()
                except TimeoutError:
                    if connection.evicted is not None:
                        raise connection._busy() from None
                    why = (f"no session slot within {caps.slot_timeout:g} s "
                           f"({caps.max_sessions} sessions at work)")
                    with contextlib.suppress(ConnectionLost):
                        await connection._write(connection.session.refuse("busy"))
                    raise ConnectionLost(why, code="busy") from None
                finally:
                    connection._waiting = None
                if connection.evicted is not None:
                    slots.release()
                    raise connection._busy()
            served.holding = True
            if served in pending:
                pending_slots.add(served)

        def established() -> None:
            pending.discard(served)
            pending_slots.discard(served)

        try:
            connection = Connection(reader, writer, make_session(), limits=limits,
                                    clock=clock, pool=work, peer=peer, slot=take_slot,
                                    pre_handshake_timeout=caps.pre_handshake_timeout)
            served.connection = connection
            connection.on_established = established
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
            release(served)

    def connected(sock: _Socket) -> None:
        # (the task is held by its socket, as asyncio.start_server's are by theirs)
        sock.task = loop.create_task(on_connect(sock, sock.writer))
        sock.task.add_done_callback(_task_done)

    def made() -> _Socket:
        return _Socket(limits.read_bytes, on_connect=connected)

    if kind == "unix":
        _claim_unix_path(where)
        server = await loop.create_unix_server(made, where)
        info = os.lstat(where)
        return Server(server, (where, info.st_dev, info.st_ino), work, own_pool)
    try:
        server = await loop.create_server(made, *where)
    except OSError as exc:
        raise ConnectionLost(f"cannot listen on {address}: {exc.strerror or exc}") from None
    return Server(server, None, work, own_pool)


def _task_done(task: asyncio.Task[Any]) -> None:
    """A served connection's task ended: an exception there is a bug, logged (its
    connection was closed by the task's own ``finally``)."""
    if not task.cancelled() and (error := task.exception()) is not None:
        logger.error("a served connection's task failed: %s: %s", type(error).__name__,
                     error, exc_info=error)


def _peer_of(writer: asyncio.StreamWriter | _Writer) -> str:
    """The peer's address for the per-peer caps: its IP; every unix client is ``unix``."""
    name = writer.get_extra_info("peername")
    if isinstance(name, tuple) and name:
        return str(name[0])
    return "unix"


class LearnedProtocols:
    """``cbcl serve``'s cap on protocols one peer address teaches: at most ``maximum``
    distinct protocol ids per peer, for the server's lifetime (the most recent 16,384 peers
    are remembered). A newer version of an id the peer taught is no new burden (the server
    keeps one version per id) and counts no more, so two offers of one id racing for the
    peer's last place cannot leave the older recorded and the newer refused.

    :meth:`vet` answers early, on the event loop, when the offer is accepted (it takes no
    lock: the answer may be stale); :meth:`record` decides: under one lock it counts again,
    records (the caller's ``record``: :meth:`Registry.record`, which takes the rollback
    decision against the state on disk under the state lock) and only then counts the id,
    so the count, the rollback decision and the record are one decision. Both raise
    :class:`LimitError` for one id more than ``maximum``."""

    def __init__(self, maximum: int, *, peers: int = 16_384) -> None:
        self.maximum = maximum
        self.peers = peers
        self._learned: OrderedDict[str, set[str]] = OrderedDict()  # peer -> protocol ids
        self._lock = threading.Lock()

    def _check(self, peer: str, prepared: PreparedDescriptor) -> None:
        learned = self._learned.get(peer, ())
        if str(prepared.descriptor.id) not in learned and len(learned) >= self.maximum:
            raise LimitError(f"this peer has taught {len(learned)} protocols already "
                             "(max_learned_per_peer)", limit="max_learned_per_peer",
                             maximum=self.maximum)

    def vet(self, peer: str, prepared: PreparedDescriptor) -> None:
        """Refuse at once an offer of one protocol id more than this peer may teach."""
        self._check(peer, prepared)

    def record(self, peer: str, prepared: PreparedDescriptor, record: Callable[[], Any],
               *, counts: bool = True) -> Any:
        """Check the cap, call ``record()`` and count the id (unless ``counts`` is false:
        a protocol the server already holds), all under one lock; returns what
        ``record()`` returned. Raises :class:`LimitError` (nothing recorded) and whatever
        ``record()`` raises (nothing counted)."""
        with self._lock:
            if counts:
                self._check(peer, prepared)
            outcome = record()
            if counts:
                self._learned.setdefault(peer, set()).add(str(prepared.descriptor.id))
                self._learned.move_to_end(peer)
                while len(self._learned) > self.peers:
                    self._learned.popitem(last=False)
            return outcome
