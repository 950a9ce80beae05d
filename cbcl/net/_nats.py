"""CBCL over NATS (spec/nats.md): another edge for the sans-io Session, like the socket
transport, for agents on many machines that share a NATS server or cluster.

Theory of operation
-------------------
A :class:`NatsBus` is one :class:`~cbcl.Agent`'s connection to NATS. Agents are addressed
by their URI, mapped to subject tokens by :func:`subject_token` (injective: every byte
outside ``[A-Za-z0-9-]`` becomes ``_`` and two hex digits). Nothing here parses or judges
a message: each NATS message on a session subject is one frame, fed to the same
:class:`~cbcl.session._session.Session` as over TCP, which does both passes, the schema, the
replay window, the transcript hash and the conversation machine.

- The handshake is request/reply: the initiator publishes its QUERY on the responder's
  agent subject, ``P.agent.<B>``, with its own session subject as the reply subject;
  every later frame goes on the two session subjects ``P.s.<to>.<from>.<sid>.<role>``
  (``role`` ``r`` to the responder, ``i`` to the initiator; ``sid`` 32 hex digits chosen
  by the initiator). Messages of the agreed protocol go on per-conversation subjects, the
  session subject plus the conversation id's token (``_`` for none), and one that arrives
  on another conversation's subject is refused. An empty message is the end of the
  stream.
- NATS delivers at most once; a node that fails loses what was in flight. The opener of a
  link repeats its latest frame of each thread (the handshake, each conversation, each
  message without one) when that thread got no answer within ``retransmit_after``; the
  other side drops a frame it has seen (by a keyed hash, ``dedupe_window``) and answers a
  repeat with what it answered the first time (``reply_cache``). So a lost frame costs a
  repeat and no message reaches a session twice.
- A publisher on an agent's subject is an unauthenticated peer: every first frame starts
  a session under the limits of TCP (frame size, pending frames, handshake and idle
  deadlines) and of :class:`NatsLimits` (sessions at once, starts per second, session ids
  remembered so a replayed first frame is dropped). A reply subject is the publisher's
  claim: nothing (answer, refusal, end of stream) is published on it until the first
  message's sender is the agent it names (:meth:`NatsConnection._answers_peer`).
- :meth:`NatsBus.fan_out` publishes one call on a group subject many agents listen on
  (:meth:`NatsBus.join`); every member answers with its name, and each gets its own
  session and conversation.
- Durable delivery (:meth:`NatsBus.enable_durable`, :meth:`NatsBus.send_durable`) keeps
  an agent's messages in a JetStream stream while it is down. The CBCL message id is the
  ``Nats-Msg-Id``, so the server drops a repeat within its duplicate window and the
  receiver's replay window drops it again; a message is acknowledged only after both
  passes accepted it and its handler ran, and a refused one is terminated. One of a
  protocol the receiver does not hold yet is kept (NAK with a growing delay) and, after
  ``max_deliver`` deliveries, moved to the dead-letter subject in the same stream. The
  stream is made alike by whichever side comes first (:meth:`NatsBus.stream_config`);
  setting up and publishing are retried with backoff for ``durable_retry_for``.
- Unauthenticated senders share the agent fairly, as over TCP: a served session not
  ESTABLISHED is pending (``pre_handshake_timeout``), one sender holds at most
  ``pre_handshake_share`` of the sessions, a newcomer evicts the oldest pending session
  of the sender holding the most, and each sender has its own start bucket. The sender
  is the agent a first frame's reply subject names — which its first message's sender
  must be before anything is published there.

Once a session is ESTABLISHED and its task is parked waiting for a frame, the frame is
handled in the subscription's callback itself (:meth:`NatsConnection._take_frame_now`, the twin
of the socket transport's fast path): fed to the session, each message handed to the
link's ``take_now`` (on-loop handlers run there, their replies go through
:meth:`NatsConnection.send_now`), and the replies of that frame published together after
it. No inbox, task switch or deadline timer per message; anything else (a handshake
message, a refusal, a message on the wrong subject, a handler that awaits) is left to the
task, which is woken.

The session subscription's messages skip nats-py's per-message machinery too
(:class:`_DirectClient`): its parser (:class:`_Parser`) cuts runs of ``MSG`` operations
by index and hands each frame from the read loop to :meth:`NatsBus._on_session_frame` as
subject, payload and raw headers — no ``Msg`` object, no header parsing (but for a status
message, which has no payload), no subscription queue and task, no coroutine: the frame is
routed by its subject's bytes, deduplicated, fed whole to the session's native state
(:func:`receive_frame`) and the replies made by it (:func:`send_frame`) without the
session's stream buffer. Publishing is a plain call too (:meth:`_DirectClient.publish_now`):
the command joins nats-py's pending buffer and one callback per loop turn writes it; where
the client cannot take a publish at once (not connected, the buffer full) the caller
awaits nats-py's ``publish`` instead, and every later publish of the same batch after it.
Other subscriptions (the agent subject, groups, JetStream) are nats-py's as usual.

nats-py's exceptions stop here: they become :class:`~cbcl.net._transport.ConnectionLost`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

try:
    import nats
    import nats.errors
    import nats.js.errors
    from nats.aio.client import Client
    from nats.aio.msg import Msg
    from nats.js import api as js_api
    from nats.protocol.parser import AWAITING_CONTROL_LINE, MAX_CONTROL_LINE_SIZE, Parser
except ImportError as exc:  # pragma: no cover - the optional extra is missing
    raise ImportError("CBCL over NATS needs nats-py: pip install 'cbcl[nats]'") from exc

from ..binary._codec import MAGIC
from ..binary._framing import PREFIX_BYTES
from ..core._display import peer_text
from ..core._errors import (
    CBCLError,
    ConnectionLost,
    LimitError,
    MalformedError,
    UnknownProtocolError,
)
from ..core._files import write_atomically
from ..core._values import URI, Value
from ..protocol._api import check_outgoing, parse
from ..protocol._message import Intent, Message
from ..protocol._protocol import Protocol
from ..protocol._registry import Registry
from ..protocol._trust import Identity, read_signed_descriptor_unverified
from ..session._negotiation import HandshakeState
from ..session._session import (
    NEED_DATA,
    NEED_WORK,
    ConnectionClosed,
    Event,
    NotUnderstood,
    ProtocolMessage,
    Query,
    RemoteProtocolError,
    Session,
    not_understood_frame,
)
from . import _tracing
from ._agent import Agent, Context, ConversationClosed, Link
from ._handlers import run_handler
from ._transport import (
    _HANDSHAKE_OVER,
    Connection,
    ConnectionLimits,
    _check_count,
    _check_fraction,
    _check_seconds,
    _Pending,
    _Served,
    clock_ms,
)

if TYPE_CHECKING:
    from nats.js import JetStreamContext

DEFAULT_PREFIX = "cbcl"
#: Subject-token bytes kept as they are; every other byte is ``_`` and two hex digits.
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-")
_BYTE_TOKEN = tuple(chr(b) if b in _SAFE else f"_{b:02x}" for b in range(256))
_TOKEN_RE = re.compile(r"(?:[A-Za-z0-9-]|_[0-9a-f]{2})+")
_SAFE_RE = re.compile(r"[A-Za-z0-9-]+")  # (ASCII only: \w is not used)
_SID_RE = re.compile(r"[0-9a-f]{32}")
_PREFIX_RE = re.compile(r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*")
NO_CONVERSATION = "_"
#: Conversation ids whose subject tokens a bus keeps at most (then it starts afresh).
_TOKENS_KEPT = 1024
#: The ``Nats-Msg-Id`` header JetStream deduplicates by.
MSG_ID = "Nats-Msg-Id"


# --------------------------------------------------------------------------- the client


#: A direct subscription's taker: ``(subject, payload, raw headers)`` from the read loop;
#: returns what is left to await (a publish the client could not take at once), if anything.
_Direct = Callable[[bytes, bytes, "bytes | None"], "Awaitable[None] | None"]
#: What nats-py refuses in a subject (a space, a tab, CR or LF: another protocol command).
_BAD_SUBJECT = re.compile(r"[\s]")


class _Parser(Parser):
    """nats-py's protocol parser, with a short cut for the messages of a
    :class:`_DirectClient`'s direct subscriptions: a run of ``MSG`` operations at the
    front of the buffer is cut by index (no regular expression, argument dict, coroutine
    or buffer shift per message; the buffer shifted once) and each message handed to its
    taker. Anything else — another operation, a message with headers or for another
    subscription, one not complete yet, a line nats-py's parser reads differently — is
    left to nats-py's parser, from where the cut stopped."""

    def __init__(self, client: _DirectClient) -> None:
        super().__init__(client)
        self._client = client

    async def parse(self, data: bytes = b"") -> None:
        buf = self.buf
        buf.extend(data)
        client = self._client
        direct = client.direct
        at = 0
        try:
            while self.state == AWAITING_CONTROL_LINE and buf.startswith(b"MSG ", at):
                line_end = buf.find(b"\r\n", at, at + MAX_CONTROL_LINE_SIZE)
                if line_end < 0:
                    break
                parts = bytes(buf[at + 4:line_end]).split(b" ")
                if len(parts) == 3:
                    subject, sid, size = parts
                elif len(parts) == 4:
                    subject, sid, _, size = parts
                else:
                    break
                if not (sid.isdigit() and size.isdigit()):
                    break
                take = direct.get(int(sid))
                start = line_end + 2
                end = start + int(size)
                if take is None or len(buf) < end + 2:
                    break
                payload = bytes(buf[start:end])
                at = end + 2
                stats = client.stats
                stats["in_msgs"] += 1
                stats["in_bytes"] += end - start
                try:
                    left = take(subject, payload, None)
                    if left is not None:
                        await left
                except Exception as exc:  # as nats-py treats a subscription callback's
                    await client._error_cb(exc)
        finally:
            if at:
                del buf[:at]
        if self.buf:
            await super().parse()


class _DirectClient(Client):
    """nats-py's client (2.x; its internals ``_process_msg``, ``_pending``,
    ``_flush_queue``, ``_transport``), with two short cuts for CBCL's session traffic:

    - the messages of chosen subscriptions go straight from its read loop to a function
      of ``(subject, payload, raw headers)`` (its :attr:`direct`, by subscription id)
      instead of being made ``Msg`` objects and queued for the subscription's task;
    - :meth:`publish_now` publishes without a coroutine: the command joins the client's
      pending buffer, and one callback per loop turn writes the buffer (all publishes of
      that turn, nats-py's own commands among them, in order) — no flusher wake-up, queue
      or future per publish. Once the socket does not keep up (the transport holds
      unsent bytes) the write is left to nats-py's flusher, which waits for the drain.

    Every other message and publish takes nats-py's way."""

    def __init__(self) -> None:
        super().__init__()
        #: The subscriptions whose messages are taken directly: id → taker.
        self.direct: dict[int, _Direct] = {}
        self._ps = _Parser(self)
        self._write_soon = False

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes,
                           headers: bytes) -> None:  # (None without headers)
        take = self.direct.get(sid)
        if take is None:
            await super()._process_msg(sid, subject, reply, data, headers)
            return
        stats = self.stats
        stats["in_msgs"] += 1
        stats["in_bytes"] += len(data)
        try:
            left = take(subject, data, headers)
            if left is not None:
                await left
        except Exception as exc:  # as nats-py treats a subscription callback's: reported
            await self._error_cb(exc)

    def publish_now(self, subject: str, payload: bytes, reply: str = "") -> bool:
        """Publish ``payload`` on ``subject`` if that can be done without waiting: connected,
        the subjects well formed, the payload within the server's limit and the pending
        buffer within ``pending_size``. Returns ``False`` (nothing done) otherwise: then
        :meth:`publish` (which waits, or raises nats-py's error) is the way. The buffer
        holds at most ``pending_size`` bytes of commands: a publish beyond waits there."""
        size = len(payload)
        if self._status != Client.CONNECTED or size > self._max_payload \
                or not subject or _BAD_SUBJECT.search(subject) is not None \
                or (reply and _BAD_SUBJECT.search(reply) is not None):
            return False
        command = b"".join((f"PUB {subject} {reply} {size}\r\n".encode(), payload, b"\r\n"))
        if self._pending_data_size + len(command) > self._max_pending_size:
            return False
        self._pending.append(command)
        self._pending_data_size += len(command)
        stats = self.stats
        stats["out_msgs"] += 1
        stats["out_bytes"] += size
        if not self._write_soon:
            self._write_soon = True
            asyncio.get_running_loop().call_soon(self._write_pending)
        return True

    def _write_pending(self) -> None:
        """Write the pending buffer (once per loop turn with publishes), or leave it to
        the flusher when the socket does not keep up or the client is not connected (a
        reconnect writes the buffer itself)."""
        self._write_soon = False
        if not self._pending_data_size or self._status != Client.CONNECTED:
            return
        writer = getattr(self._transport, "_io_writer", None)  # (nats-py's TcpTransport)
        flusher = self._flusher_task
        transport = getattr(writer, "transport", None)
        if transport is None or flusher is None or flusher.done() \
                or transport.is_closing() or transport.get_write_buffer_size():
            queue = self._flush_queue
            if queue is not None and queue.empty():
                with contextlib.suppress(asyncio.QueueFull):
                    queue.put_nowait(asyncio.get_running_loop().create_future())
            return
        pending = self._pending
        self._pending = []
        self._pending_data_size = 0
        transport.writelines(pending)


# --------------------------------------------------------------------------- subjects


def subject_token(text: str, *, limit: int = 600) -> str:
    """The NATS subject token of ``text`` (an agent URI, a conversation id): its UTF-8 bytes,
    ``[A-Za-z0-9-]`` as they are and every other byte as ``_`` and two lowercase hex
    digits. Injective (:func:`token_text` inverts it). Raises ``ValueError`` for an empty
    text and :class:`LimitError` for a token longer than ``limit`` characters."""
    if not text:
        raise ValueError("an empty name has no subject token")
    # (most conversation ids are all safe characters: one match instead of a byte walk)
    token = text if _SAFE_RE.fullmatch(text) is not None \
        else "".join([_BYTE_TOKEN[b] for b in text.encode("utf-8")])
    if len(token) > limit:
        raise LimitError(f"the subject token of {peer_text(text, 40)} is {len(token)} "
                         f"characters; at most {limit}", limit="max_token_bytes",
                         maximum=limit)
    return token


def token_text(token: str) -> str:
    """The text whose :func:`subject_token` is ``token``. Raises ``ValueError`` for anything
    :func:`subject_token` does not produce (bad escapes, escaped safe bytes, bad UTF-8)."""
    if _TOKEN_RE.fullmatch(token) is None:
        raise ValueError("not a CBCL subject token")
    data = bytearray()
    at = 0
    while at < len(token):
        if token[at] == "_":
            data.append(int(token[at + 1:at + 3], 16))
            at += 3
        else:
            data.append(ord(token[at]))
            at += 1
    text = data.decode("utf-8")  # raises UnicodeDecodeError, a ValueError
    if "".join([_BYTE_TOKEN[b] for b in data]) != token:
        raise ValueError("not the canonical token of its text")
    return text


# --------------------------------------------------------------------------- limits


@dataclass(frozen=True, slots=True)
class NatsLimits:
    """What one :class:`NatsBus` allows (spec/nats.md §5); per session the agent's
    :class:`~cbcl.net.ConnectionLimits` apply as over TCP.

    ``max_sessions``: sessions this agent answers at once (one more first frame evicts the
    oldest session not yet ESTABLISHED of the sender holding the most, or is refused
    ``busy`` when every session is established); ``start_rate``/``start_burst``: first
    frames accepted per second on the agent's subject (a token bucket; beyond it
    ``busy``); ``sender_start_rate``/``sender_start_burst``: the same per sender (the agent
    its reply subject names), checked first, so that no sender drains the agent's bucket;
    ``pre_handshake_timeout``: seconds of the peer's time a session may take to be
    ESTABLISHED (``handshake_timeout`` still bounds the whole handshake);
    ``pre_handshake_share``: the fraction of ``max_sessions`` one sender may hold not yet
    ESTABLISHED (one more evicts its own oldest); ``remembered_sessions``: ended session ids kept,
    so a replayed first frame is dropped; ``dedupe_window``: frame keys (hashes) remembered per
    session (a repeat is dropped); ``reply_cache``: received frames per session whose
    answers are kept to answer a repeat, and the threads (handshake, conversations) whose
    latest frame an opener keeps to repeat; ``retransmit_after``/``max_retransmits``: when
    and how often the opener of a link repeats a thread's latest frame; ``max_token_bytes``:
    the longest subject token (URI, conversation id); ``pending_msgs``: messages nats-py
    buffers per subscription (beyond: dropped, a slow consumer); ``max_call_replies``:
    answers taken for one :meth:`NatsBus.fan_out`; ``request_timeout``: every NATS request
    (JetStream API and publish acknowledgements) and the connect.

    Durable delivery: ``durable_batch`` messages fetched at once; ``ack_wait`` before an
    unacknowledged message is delivered again; a message the receiver cannot handle yet
    (a protocol it does not hold) is delivered again after ``durable_retry_delay`` times
    the number of its deliveries, and on its ``max_deliver``-th delivery (or any later:
    a message delivered more often was never settled) is moved to the dead-letter
    subject; ``durable_retry_for``: seconds setting up durable delivery, and a durable
    publish, are retried (a stream's leader being elected again, a node down) before
    :class:`ConnectionLost`;
    ``duplicate_window`` (seconds) of the server's ``Nats-Msg-Id`` deduplication;
    ``durable_max_age``, ``durable_max_msgs``, ``durable_max_bytes`` bound the stream
    (oldest dropped); ``durable_replay_window`` message ids the receiver remembers.
    Raises ``ValueError`` for a value out of range."""

    max_sessions: int = 256
    start_rate: float = 500.0
    start_burst: int = 256
    sender_start_rate: float = 10.0
    sender_start_burst: int = 8
    pre_handshake_timeout: float = 5.0
    pre_handshake_share: float = 0.125
    remembered_sessions: int = 16_384
    dedupe_window: int = 256
    reply_cache: int = 32
    retransmit_after: float = 0.5
    max_retransmits: int = 10
    max_token_bytes: int = 600
    pending_msgs: int = 65_536
    max_call_replies: int = 64
    request_timeout: float = 5.0
    durable_batch: int = 64
    ack_wait: float = 30.0
    max_deliver: int = 5
    durable_retry_delay: float = 60.0
    durable_retry_for: float = 60.0
    duplicate_window: float = 120.0
    durable_max_age: float = 86_400.0
    durable_max_msgs: int = 1_000_000
    durable_max_bytes: int = 1 << 28
    durable_replay_window: int = 4096

    def __post_init__(self) -> None:
        for name in ("max_sessions", "start_burst", "sender_start_burst",
                     "remembered_sessions", "dedupe_window",
                     "reply_cache", "pending_msgs", "max_call_replies", "durable_batch",
                     "max_deliver", "durable_max_msgs", "durable_replay_window"):
            _check_count(name, getattr(self, name))
        _check_count("max_retransmits", self.max_retransmits, lower=0, upper=1 << 10)
        _check_count("max_token_bytes", self.max_token_bytes, lower=16, upper=1024)
        _check_count("durable_max_bytes", self.durable_max_bytes, upper=1 << 40)
        for name in ("retransmit_after", "request_timeout", "ack_wait", "duplicate_window",
                     "durable_max_age", "pre_handshake_timeout", "durable_retry_delay",
                     "durable_retry_for"):
            _check_seconds(name, getattr(self, name), upper=86_400.0 * 365)
        _check_seconds("start_rate", self.start_rate, upper=1e6)
        _check_seconds("sender_start_rate", self.sender_start_rate, upper=1e6)
        _check_fraction("pre_handshake_share", self.pre_handshake_share)

    def pending_share(self) -> int:
        """How many of the ``max_sessions`` one sender may hold before its handshake is
        ESTABLISHED: ``pre_handshake_share`` of them, rounded down, at least 1."""
        return max(1, int(self.max_sessions * self.pre_handshake_share))


class _Bucket:
    """A token bucket: ``rate`` per second, at most ``burst`` saved."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.at = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


def _nats_lost(what: str, exc: BaseException) -> ConnectionLost:
    """nats-py's exception ``exc`` while doing ``what``, as CBCL's error (exit 1)."""
    detail = str(exc) or type(exc).__name__
    return ConnectionLost(f"NATS: {what}: {peer_text(detail, 160)}")


def _unframe(data: bytes) -> list[bytes]:
    """Our own session output (whole frames, one after another) as frame payloads."""
    out = []
    at = 0
    while at + PREFIX_BYTES <= len(data):
        size = int.from_bytes(data[at:at + PREFIX_BYTES], "big")
        out.append(data[at + PREFIX_BYTES:at + PREFIX_BYTES + size])
        at += PREFIX_BYTES + size
    return out


# --------------------------------------------------------------------------- a frame


#: The key of "no frame" where a frame's key is expected (never a hash: Python's hash
#: of an object is never -1).
_NO_FRAME = -1


def _frame_key(payload: bytes) -> int:
    """What a received frame is remembered by (a repeat is dropped, its answers kept): a
    64-bit keyed hash of its bytes (Python's SipHash, keyed per process), which a peer
    cannot aim at without the key and which collides by chance about once in 2**64 pairs
    — as good as a SHA-256 here, for ~1 µs less a frame."""
    return hash(payload if type(payload) is bytes else bytes(payload))


def receive_frame(session: Session, frame: bytes, now: int) -> ProtocolMessage | None:
    """The event of one whole frame ``frame`` (its length prefix cut, as a NATS message
    carries it) on an ESTABLISHED binary session with nothing else waiting, taken by the
    session's native state in one call (``cbcl._native.SessionState.receive``) as
    :meth:`Session.next_event`'s own fast path takes a frame from its stream buffer; or
    ``None``, having changed nothing: then the frame is fed as a stream
    (:meth:`Session.receive_data`, :meth:`Session.next_event`), which judges it as ever
    (a refusal, a NOT-UNDERSTOOD, the reference path where the native state declines).
    Raises nothing."""
    native = session._native
    size = len(frame)
    if native is None or session._complete or session._inbox or session._events \
            or session._work is not None or session._pending is not None or session._eof \
            or session._machine.state is not HandshakeState.ESTABLISHED \
            or not 0 < size <= session._max_frame_bytes or frame[:2] != MAGIC \
            or type(now) is not int:
        return None
    try:
        got = native.receive(frame, now)
    except Exception:  # (declined the other way: the stream path raises it as it should)
        return None
    if type(got) is not tuple:
        return None  # declined: nothing changed
    message, step = got
    session._now = now
    session._last_id = message.message_id
    session.last_frame_bytes = size + PREFIX_BYTES
    session._inbox_at += size + PREFIX_BYTES
    return ProtocolMessage(message, step)


def send_frame(session: Session, message: Message, now: int) -> bytes | None:
    """The frame of ``message`` (length prefix included) on an ESTABLISHED binary session,
    made by the session's native state in one call (``cbcl._native.SessionState.send``:
    the conversation stepped, the message checked and encoded) as :meth:`Session.send`
    makes it, its step in ``session.last_sent_step``; or ``None``, having changed nothing:
    then :meth:`Session.send` judges the message (a refusal raises there). Raises
    nothing."""
    native = session._native
    protocol = session.protocol
    if native is None or protocol is None or type(now) is not int \
            or session._machine.state is not HandshakeState.ESTABLISHED \
            or (message.protocol is not protocol.id and message.protocol != protocol.id) \
            or (message.sender is not session.me and message.sender != session.me) \
            or (message.receiver is not session.peer and message.receiver != session.peer) \
            or (session.validate_outgoing and message.intent is not Intent.NOT_UNDERSTOOD
                ) is not session._native_validates:
        return None
    if message.timestamp is None and message.signature is None:
        m = message  # (every field checked when it was made: as Session.send stamps it)
        message = Message._trusted(m.message_id, m.sender, m.receiver, m.intent,
                                   m.protocol, m.conversation_id, m.in_reply_to,
                                   m.reply_by, now, m.body, None, m.trace)
    try:
        got = native.send(message, now)
    except Exception:  # (declined the other way: Session.send raises what it should)
        return None
    if type(got) is not tuple:
        return None  # declined: nothing changed
    session._now = now
    session.last_sent_step = got[1]
    data: bytes = got[0]
    return data


# --------------------------------------------------------------------------- a session


#: A thread of a link whose frames the opener repeats: the handshake (``None``), a
#: conversation (its subject token), a message without one (``("_", message id)``).
_Thread = str | tuple[str, str] | None


@dataclass(slots=True)
class _Resend:
    """The opener's latest frame of one thread: where it went, when to repeat it next,
    how often it was repeated."""

    subject: str
    data: bytes
    reply: str
    at: float
    count: int = 0


class NatsConnection(Connection):
    """A :class:`Session` whose frames travel as NATS messages: the
    :class:`~cbcl.net._transport.Connection` of the NATS edge, so a :class:`~cbcl.net.Link` runs on
    it unchanged. One NATS message is one frame (its payload, the length prefix being
    NATS's own); ``b""`` is the end of the stream. Made by :class:`NatsBus`."""

    def __init__(self, bus: NatsBus, session: Session, *, key: tuple[str, str, str],
                 out_subject: str, inbox: str, peer: str, opener: bool,
                 first_subject: str | None = None) -> None:
        # No stream: Connection's state without its reader and writer; its reading is
        # replaced (_receive, _accepted).
        self._start(session, limits=bus.agent.connection_limits, clock=clock_ms,
                    pool=bus.agent.pool, peer=peer, slot=None,
                    pre_handshake_timeout=None if opener
                    else bus.limits.pre_handshake_timeout)
        #: The bus's bookkeeping of a served session (its sender, whether it holds one of
        #: the ``max_sessions``); ``None`` for an opener's.
        self.served: _Served | None = None
        self.bus = bus
        self.key = key
        self.out_subject = out_subject
        self.inbox = inbox
        self.opener = opener
        self._first_subject = first_subject
        self._inbox: deque[tuple[str | None, bytes]] = deque()
        self._arrived = asyncio.Event()
        self._overflow = False
        self._seen: OrderedDict[int, None] = OrderedDict()
        # What this side published in answer to a frame (subject, payload, reply), by the
        # frame's digest: a repeat of the frame is answered with it again.
        self._answers: OrderedDict[int, list[tuple[str, bytes, str]]] = OrderedDict()
        self._current: int | None = None  # key (_frame_key) of the frame being handled
        # The frame each received protocol message came in, by message id: a handler's
        # reply, sent while later frames are taken, is the answer to that frame.
        self._frame_of: OrderedDict[str, int] = OrderedDict()
        self._suffix: str | None = None  # its conversation token (None: a handshake subject)
        self._last_activity = self._loop.time()
        # The opener's frames awaiting an answer, one per thread of the link: the
        # handshake (None), each conversation (its subject token), and each message without
        # a conversation (("_", its id)). An answer on that thread clears its entry.
        self._resend: dict[_Thread, _Resend] = {}
        self._peer_checked = False
        # Whether this side may publish on the session's subjects: an opener chose its
        # peer; a responder only once the session's peer (the first message's sender) is
        # the one the subjects name — never onto another agent's subjects.
        self._peer_ok: bool | None = True if opener else None
        # The task waits in _take for the next frame (the fast path may run: _take_frame_now),
        # at the latest until _wake_at (loop time).
        self._parked = False
        self._wake_at = 0.0
        # The frames sent while the fast path runs, published after it (send_now):
        # ("frame", event, data, step) or ("own", data) for what the session made itself.
        self._now_batch: list[tuple[Any, ...]] | None = None
        self._closed = False
        self._no_responders = False
        #: Frames dropped as repeats, and frames this side repeated.
        self.duplicates = 0
        self.retransmits = 0

    # ----------------------------------------------------------------- input

    @property
    def sends_now(self) -> bool:
        """Only in the fast path (:meth:`_take_frame_now`), whose replies are published together
        after the frame; elsewhere a NATS frame is published by :meth:`send`."""
        return self._now_batch is not None

    def send_now(self, event: Event) -> int:
        """:meth:`send` without waiting, in the fast path: the frame is published with the
        others of the frame being handled, after it. Returns the bytes sent. Raises what
        :meth:`Session.send` raises (nothing is sent), :class:`ConnectionLost` (code
        ``busy``) once evicted, ``RuntimeError`` outside the fast path
        (:attr:`sends_now`)."""
        batch = self._now_batch
        if batch is None:
            raise RuntimeError("NatsConnection.send_now outside its fast path")
        if self.evicted is not None:
            raise self._busy()
        session, now = self.session, self.clock()
        data = send_frame(session, event.message, now) \
            if type(event) is ProtocolMessage else None
        if data is None:
            data = session.send(event, now=now)
        if data:
            step = session.last_sent_step if isinstance(event, ProtocolMessage) else None
            batch.append(("frame", event, data, step))
        return len(data)

    def _fast_ready(self) -> bool:
        """Whether a frame that arrives now may be handled in the callback: ESTABLISHED,
        the link taking events there, the task parked in :meth:`_take` with nothing left
        for it to do first, and the peer verified."""
        return (self._parked and self.take_now is not None and not self._inbox
                and self._taken is None and self._now_batch is None and not self._overflow
                and self.evicted is None and not self._pending and not self._no_responders
                and self._peer_checked and self._peer_ok is True and not self._closed
                and self.session.state is HandshakeState.ESTABLISHED)

    def _take_frame_now(self, suffix: str | None, payload: bytes, digest: int
                        ) -> Awaitable[None] | None:
        """The frame ``payload`` (on the conversation subject ``suffix``) with the task
        parked: do what it would — feed the session, check each message's subject, hand it
        to :attr:`take_now` — then publish what that produced, in order. The first thing
        not finished here (an event that is not a protocol message, a message on another
        conversation's subject, an error, work, an on-loop handler's remaining await) is
        left to the task, which is woken (:attr:`_taken`). Returns what is left to await
        (publishes the client could not take at once), if anything."""
        session, take = self.session, self.take_now
        if take is None:  # pragma: no cover - checked by _fast_ready
            return None
        self._last_activity = self._loop.time()
        if suffix != NO_CONVERSATION:
            self._resend.pop(suffix, None)
        self._suffix = suffix
        self._current = digest
        self.bytes_received += len(payload)
        now = self.clock()
        # A NATS message is one whole frame: the session's stream buffer is skipped
        # where the frame is taken whole (receive_frame); else it is fed as a stream.
        event: Any = receive_frame(session, payload, now)
        direct = event is not None
        if not direct:
            session.receive_data(len(payload).to_bytes(PREFIX_BYTES, "big") + payload)
        batch: list[tuple[Any, ...]] = []
        self._now_batch = batch
        wake = False
        try:
            while True:
                if event is None:
                    try:
                        event = session.next_event(now=now)
                    except Exception as exc:  # RemoteProtocolError, or a bug: the task's
                        self._taken = ("error", exc)
                        break
                    if event is NEED_DATA:
                        break
                    if event is NEED_WORK:
                        wake = True
                        break
                    own = session.data_to_send()
                    if own:
                        batch.append(("own", own))
                if type(event) is not ProtocolMessage or \
                        suffix != self.bus._cid_token(event.message.conversation_id):
                    self._taken = ("then", _Later(self, cast(Event, event)))  # (checks)
                    break
                self._note_message(event)
                try:
                    taken = take(event)
                except Exception as exc:  # a bug: raised in the task, as it would have been
                    self._taken = ("error", exc)
                    break
                if taken is not True:
                    self._taken = ("event", event) if taken is False else ("then", taken)
                    break
                if direct:
                    break  # (the session held nothing else: the frame was all there was)
                event = None
        finally:
            self._now_batch = None
        for at, item in enumerate(batch):
            left = self._post_item(item, digest)
            if left is not None:
                return self._finish_batch(left, batch[at + 1:], digest, wake)
        if self._taken is not None or wake:
            self._arrived.set()
        return None

    def _post_item(self, item: tuple[Any, ...], digest: int
                   ) -> Coroutine[Any, Any, None] | None:
        """Publish one frame of a fast path's batch; returns the publish to await when
        the client could not take it at once (the rest then wait for it)."""
        if item[0] == "own":
            frames = _unframe(item[1])
            for at, frame in enumerate(frames):
                left = self._emit_post(self.out_subject, frame, answering=digest)
                if left is not None:
                    return self._then_emit(left, frames[at + 1:], digest)
            return None
        return self._publish_frame_post(item[1], item[2], item[3])

    async def _then_emit(self, left: Awaitable[None], frames: list[bytes],
                         digest: int) -> None:
        await left
        for frame in frames:
            await self._emit(self.out_subject, frame, answering=digest)

    async def _finish_batch(self, left: Awaitable[None], rest: list[tuple[Any, ...]],
                            digest: int, wake: bool) -> None:
        """The fast path's publishes from the first the client could not take at once, in
        order, each awaited; then the task is woken if it has something to do."""
        try:
            with contextlib.suppress(ConnectionLost):  # (a bus gone: the task finds it)
                await left
                for item in rest:
                    more = self._post_item(item, digest)
                    if more is not None:
                        await more
        finally:
            if self._taken is not None or wake:
                self._arrived.set()

    async def deliver(self, suffix: str | None, payload: bytes, *,
                      no_responders: bool = False) -> None:
        """Take one NATS message of this session (called by the bus, in order)."""
        left = self.deliver_now(suffix, payload, no_responders)
        if left is not None:
            await left

    def deliver_now(self, suffix: str | None, payload: bytes, no_responders: bool = False
                    ) -> Awaitable[None] | None:
        """:meth:`deliver` without a coroutine: returns what is left to await (publishes
        the client could not take at once), if anything."""
        if self._closed:
            return None
        if no_responders:
            self._no_responders = True
            self._arrived.set()
            return None
        digest = _frame_key(payload)
        seen = self._seen
        if digest in seen:
            self.duplicates += 1
            self.bus.stats["duplicates"] += 1
            answers = self._answers.get(digest)
            return self.bus._post_all(answers) if answers else None
        seen[digest] = None
        if len(seen) > self.bus.limits.dedupe_window:
            seen.popitem(last=False)
        if self._fast_ready():
            if not self.opener:  # (only the opener repeats: only its peer's are answered)
                self._remember_answers(digest)
            return self._take_frame_now(suffix, payload, digest)
        if len(self._inbox) >= self.limits.max_pending_frames:
            self._overflow = True
        else:
            self._inbox.append((suffix, payload))
            if not self.opener:
                self._remember_answers(digest)
        self._arrived.set()
        return None

    def _remember_answers(self, digest: int) -> None:
        """Keep what this side answers to the frame ``digest`` (for a repeat of it)."""
        answers = self._answers
        answers[digest] = []
        if len(answers) > self.bus.limits.reply_cache:
            answers.popitem(last=False)

    def seen(self, payload: bytes) -> bool:
        return _frame_key(payload) in self._seen

    async def _accepted(self, event: Event) -> None:
        await self._check_subjects(event)  # (Connection.next_event's hook)
        if isinstance(event, ProtocolMessage):
            self._note_message(event)
        else:
            self._resend.pop(None, None)  # the handshake was answered

    def _note_message(self, event: ProtocolMessage) -> None:
        """A protocol message accepted: it answers its thread (one without a conversation,
        by its in-reply-to), and a reply to it answers the frame it came in."""
        message = event.message
        if message.conversation_id is None and message.in_reply_to is not None:
            self._resend.pop((NO_CONVERSATION, message.in_reply_to), None)
        if self._current is not None and not self.opener:  # (see deliver_now)
            self._frame_of[message.message_id] = self._current
            while len(self._frame_of) > self.bus.limits.reply_cache:
                self._frame_of.popitem(last=False)

    async def _receive(self) -> None:
        """The next frame from this session's inbox (a NATS message carries one frame
        without its prefix; an empty one ends the stream); nothing when the fast path
        left something to :meth:`next_event` (:attr:`_taken`)."""
        taken = await self._take()
        if taken is None:
            return
        suffix, payload = taken
        self._suffix = suffix
        self._current = _frame_key(payload) if payload else None
        self.bytes_received += len(payload)
        if payload:
            self.session.receive_data(len(payload).to_bytes(PREFIX_BYTES, "big") + payload)
        else:
            self.session.receive_data(b"")  # the peer ended the stream

    async def _check_subjects(self, event: Event) -> None:
        """A conversation's message must come on that conversation's subject, handshake
        messages on the session subject, and the responder's peer must be the one its
        subjects name."""
        session = self.session
        if not self._peer_checked and session.peer is not None:
            self._peer_checked = True
            if not self._answers_peer():
                self.bus.stats["spoofed"] += 1
                raise RemoteProtocolError(  # (nothing is sent: see _answers_peer)
                    f"the session subject names {peer_text(self.key[0], 40)}, not the "
                    f"sender {peer_text(session.peer, 40)}", code="malformed")
        if isinstance(event, NotUnderstood):
            return
        if isinstance(event, ProtocolMessage):
            expected = self.bus._cid_token(event.message.conversation_id)
            if self._suffix != expected:
                await self._refuse("malformed", "a message of conversation "
                                   f"{peer_text(event.message.conversation_id, 40)} came on "
                                   f"the subject of {peer_text(self._suffix, 40)}")
        elif self._suffix is not None and self._current is not None:
            await self._refuse("malformed", "a handshake message came on a conversation's "
                               "subject")

    def _answers_peer(self) -> bool:
        """Whether what this side sends may be published: always for the opener; for a
        responder, only once its session's peer (bound by the first message's sender) is
        the agent whose token the session subjects carry. Until then — a first frame that
        does not parse, or whose sender is not the one its reply subject names — nothing
        is published: the reply subject is the publisher's claim, and answering it would
        write onto whatever agent's subjects it names."""
        if self._peer_ok is None and self.session.peer is not None:
            try:
                named = subject_token(str(self.session.peer),
                                      limit=self.bus.limits.max_token_bytes)
            except (ValueError, CBCLError):
                named = ""
            self._peer_ok = named == self.key[0]
        return bool(self._peer_ok)

    async def _refuse(self, code: str, why: str) -> None:
        with contextlib.suppress(ConnectionLost):
            await self._write(self.session.refuse(code))
        raise RemoteProtocolError(why, code=code)

    async def _take(self) -> tuple[str | None, bytes] | None:
        """The next frame of the peer, waiting under the deadlines and repeating our last
        frame when nothing comes back; ``None`` when the fast path left something to
        :meth:`next_event`."""
        limits = self.limits
        while True:
            if self._taken is not None:
                return None
            if self.evicted is not None:
                raise self._busy()
            if self._overflow:
                await self._refuse("limit", f"more than {limits.max_pending_frames} frames "
                                   "are waiting (max_pending_frames)")
            if self._no_responders:
                raise ConnectionLost(f"no agent {peer_text(self.peer, 60)} listens on the bus")
            if self._inbox:
                self._last_activity = self._loop.time()
                suffix, payload = self._inbox.popleft()
                # An answer on a thread: nothing of it to repeat (a message without a
                # conversation is answered by its in-reply-to: see _accepted).
                if suffix != NO_CONVERSATION:
                    self._resend.pop(suffix, None)
                return suffix, payload
            now = self._loop.time()
            deadline = self._last_activity + limits.idle_timeout
            why = f"no message for {limits.idle_timeout:g} s"
            if self.session.state not in _HANDSHAKE_OVER and self._handshake_deadline < deadline:
                deadline = self._handshake_deadline
                why = f"the handshake did not finish within {limits.handshake_timeout:g} s"
            pre = self._pre_handshake_deadline
            if self._pending and pre is not None and pre < deadline:
                deadline = pre
                why = (f"the handshake did not finish within {self._pre_handshake_timeout:g}"
                       " s of the peer's time (pre_handshake_timeout)")
            if now >= deadline:
                await self._time_out(why)
            wake = deadline
            repeated = False
            for thread, entry in list(self._resend.items()):
                if entry.count >= self.bus.limits.max_retransmits:
                    del self._resend[thread]  # given up: the deadlines decide
                elif now >= entry.at:
                    entry.count += 1
                    entry.at = now + self.bus.limits.retransmit_after * (1 + entry.count)
                    self.retransmits += 1
                    self.bus.stats["retransmits"] += 1
                    repeated = True
                    await self.bus._publish(entry.subject, entry.data, entry.reply)
                else:
                    wake = min(wake, entry.at)
            if repeated:
                continue
            self._arrived.clear()
            self._parked = True
            self._wake_at = wake
            try:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(wake):
                        await self._arrived.wait()
            finally:
                self._parked = False

    def evict(self, why: str) -> None:
        """End this served session for the bus's limits, from outside its task: tell the
        peer NOT-UNDERSTOOD ``busy`` (best effort, only a verified peer), and wake the task
        where it waits, which then raises :class:`ConnectionLost` (code ``busy``) with
        ``why``. A second call does nothing."""
        if self.evicted is not None:
            return
        self.evicted = why
        if self._answers_peer():
            with contextlib.suppress(CBCLError):
                refusal = self.session.refuse("busy")
                self.bus._spawn(self._emit_quietly(refusal))
        self._arrived.set()
        waiting = self._waiting
        if waiting is not None:
            with contextlib.suppress(RuntimeError):  # its deadline is passing anyway
                waiting.reschedule(self._loop.time())

    async def _emit_quietly(self, data: bytes) -> None:
        with contextlib.suppress(ConnectionLost):
            for payload in _unframe(data):
                await self._emit(self.out_subject, payload)

    # ----------------------------------------------------------------- output

    def _arm(self, thread: _Thread, subject: str, data: bytes, reply: str = "") -> None:
        """Keep ``data`` (the opener's latest frame of ``thread``) to repeat until that
        thread is answered; a later frame of the thread replaces it."""
        if self.opener:
            self._resend.pop(thread, None)  # (re-inserted last: the oldest stay first)
            limits = self.bus.limits
            at = self._loop.time() + limits.retransmit_after
            self._resend[thread] = _Resend(subject, data, reply, at)
            while len(self._resend) > limits.reply_cache:  # (what the peer can answer)
                self._resend.pop(next(iter(self._resend)))
            if not self._parked or at < self._wake_at:
                # The pump's wait recomputes its wake-up time; one that wakes sooner
                # anyway recomputes it then (no wake-up per message sent).
                self._arrived.set()

    async def _emit(self, subject: str, data: bytes, reply: str = "", *,
                    answering: int | None = None) -> None:
        """Publish ``data``, remembered as an answer to the frame ``answering`` (default:
        the frame being handled) so that a repeat of that frame is answered again.
        Nothing is published while the peer is not verified (:meth:`_answers_peer`)."""
        left = self._emit_post(subject, data, reply, answering=answering)
        if left is not None:
            await left

    def _emit_post(self, subject: str, data: bytes, reply: str = "", *,
                   answering: int | None = None) -> Coroutine[Any, Any, None] | None:
        """:meth:`_emit` at once where the client can; else returns the publish to await."""
        if not self._answers_peer():
            self.bus.stats["unanswered"] += 1
            return None
        left = self.bus._post(subject, data, reply)
        self.bytes_sent += len(data)
        frame = self._current if answering is None else answering
        if frame is not None:
            answers = self._answers.get(frame)
            if answers is not None and len(answers) < 8:
                answers.append((subject, data, ""))
        return left

    async def _write(self, data: bytes) -> None:
        """Publish what the session produced by itself (handshake answers, the initiator's
        Finished, a NOT-UNDERSTOOD) on the session subject."""
        for payload in _unframe(data):
            await self._emit(self.out_subject, payload)
            if self.session.state not in _HANDSHAKE_OVER:
                self._arm(None, self.out_subject, payload)  # the Finished awaits one

    async def send(self, event: Event) -> int:
        """Send ``event``: the first frame (the QUERY) on the peer's agent subject, the rest
        on the session subject, a protocol message on its conversation's subject."""
        session, now = self.session, self.clock()
        data = send_frame(session, event.message, now) \
            if type(event) is ProtocolMessage else None
        if data is None:
            data = session.send(event, now=now)
        if not data:
            return 0
        step = session.last_sent_step if isinstance(event, ProtocolMessage) else None
        left = self._publish_frame_post(event, data, step)
        if left is not None:
            await left
        return len(data)

    def _publish_frame_post(self, event: Event, data: bytes, step: Any
                            ) -> Coroutine[Any, Any, None] | None:
        """Publish the frame ``data`` the session made of ``event`` (whose conversation
        step is ``step``) where it goes, and keep it to repeat if it awaits an answer.
        Returns the publish to await when the client could not take it at once."""
        payload = data[PREFIX_BYTES:]
        answering = None
        thread: _Thread = None
        if type(event) is ProtocolMessage:
            message = event.message
            token = self.bus._cid_token(message.conversation_id)
            thread = token if token != NO_CONVERSATION \
                else (NO_CONVERSATION, message.message_id)
            subject = f"{self.out_subject}.{token}"
            reply = ""
            # A reply answers the frame its message came in (handlers run beside the pump,
            # so the frame being handled now may be a later one); anything else, none
            # (_NO_FRAME).
            replied = message.in_reply_to
            answering = _NO_FRAME if replied is None \
                else self._frame_of.get(replied, _NO_FRAME)
        elif isinstance(event, Query) and self._first_subject is not None:
            subject, reply = self._first_subject, self.inbox
            self._first_subject = None
        else:
            subject, reply = self.out_subject, ""
        left = self._emit_post(subject, payload, reply, answering=answering)
        if step is not None and step.finished:
            self._resend.pop(thread, None)
        else:
            self._arm(thread, subject, payload, reply)
        return left

    async def close(self) -> None:
        """End the stream: tell the session, publish the end (an empty message), forget
        the session's subjects."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(CBCLError):
            self.session.send(ConnectionClosed(), now=self.clock())
        if self._first_subject is None and self._answers_peer():
            # (something was sent: the peer may hold a session)
            with contextlib.suppress(ConnectionLost):
                await self.bus._publish(self.out_subject, b"")
        self.bus._forget(self)
        self._arrived.set()


class _Later:
    """What the fast path leaves to the task for an event it took from the session but
    does not handle (:meth:`NatsConnection._take_frame_now`): the checks :meth:`next_event` makes
    of every event (:meth:`NatsConnection._accepted`, which may refuse it), what the
    session has to send, then the event for :meth:`next_event` to return."""

    __slots__ = ("connection", "event")

    def __init__(self, connection: NatsConnection, event: Event) -> None:
        self.connection = connection
        self.event = event

    async def __call__(self) -> None:
        connection = self.connection
        await connection._accepted(self.event)
        await connection.flush()
        connection._taken = ("event", self.event)


# --------------------------------------------------------------------------- fan-out


@dataclass
class Bid:
    """One answer to :meth:`NatsBus.fan_out`: the member, its link and conversation, and
    its reply (or why there is none: ``error``)."""

    peer: str
    link: Link | None
    conversation: Any | None
    reply: Message | None
    error: CBCLError | None = None


# --------------------------------------------------------------------------- the bus


class NatsBus:
    """One agent on NATS: make it with :meth:`connect`. :meth:`serve` answers sessions on
    the agent's subject, :meth:`open_link` negotiates with another agent and returns an
    established :class:`~cbcl.net.Link`, :meth:`join`/:meth:`fan_out` run group calls,
    :meth:`enable_durable`/:meth:`send_durable` JetStream delivery. :attr:`stats` counts
    what was refused, dropped and repeated."""

    def __init__(self, agent: Agent, client: Client, *, prefix: str = DEFAULT_PREFIX,
                 limits: NatsLimits | None = None) -> None:
        if _PREFIX_RE.fullmatch(prefix) is None:
            raise ValueError(f"a subject prefix is dot-separated [A-Za-z0-9_-] tokens, not "
                             f"{prefix!r}")
        self.agent = agent
        self.client = client
        self.prefix = prefix
        self.limits = limits or NatsLimits()
        self.me = subject_token(str(agent.name), limit=self.limits.max_token_bytes)
        self._session_prefix = f"{prefix}.s.{self.me}."
        self._sessions: dict[tuple[str, str, str], NatsConnection] = {}
        self._by_inbox: dict[bytes, NatsConnection] = {}  # the same, by inbox subject
        self._cid_tokens: dict[str, str] = {}  # conversation id -> token (_cid_token)
        self._links: dict[tuple[str, str, str], Link] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._ended: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._bucket = _Bucket(self.limits.start_rate, self.limits.start_burst)
        self._sender_buckets: OrderedDict[str, _Bucket] = OrderedDict()
        self._responders = 0  # served sessions holding one of max_sessions
        self._pending = _Pending()  # served sessions not ESTABLISHED yet, by sender
        self._quiet: dict[str, tuple[float, int]] = {}  # rate-limited log lines
        self._busy_made: tuple[int, bytes] = (-(1 << 62), b"")
        self._subs: list[Any] = []
        self._durable_task: asyncio.Task[None] | None = None
        self._durable_stop = False
        self._durable_registry: Registry | None = None
        self._durable_seen: deque[str] = deque()
        self._durable_seen_set: set[str] = set()
        self._send_registries: OrderedDict[str, Registry] = OrderedDict()
        self._closing = False
        self._publish_now: Callable[[str, bytes, str], bool] | None = \
            client.publish_now if isinstance(client, _DirectClient) else None
        self.stats: dict[str, int] = {
            "refused": 0, "busy": 0, "replays": 0, "unknown": 0, "duplicates": 0,
            "spoofed": 0, "unanswered": 0, "evicted": 0,
            "retransmits": 0, "durable_accepted": 0, "durable_refused": 0,
            "durable_duplicates": 0, "durable_retried": 0, "durable_dead": 0, "errors": 0}

    # ----------------------------------------------------------------- connecting

    @classmethod
    async def connect(cls, agent: Agent, servers: str | Iterable[str], *,
                      prefix: str = DEFAULT_PREFIX, limits: NatsLimits | None = None,
                      reconnect_wait: float = 0.25, max_reconnects: int = 240,
                      ping_interval: float = 10.0, pending_bytes: int = 8 << 20,
                      randomize: bool = False) -> NatsBus:
        """Connect ``agent`` to the NATS servers ``servers`` (``nats://HOST:PORT``, a
        comma-separated list, or several): on a failure the client moves to another server
        of the cluster (those it names, and those the cluster announces), waiting
        ``reconnect_wait`` s between rounds, at most ``max_reconnects`` times, publishing
        into a ``pending_bytes`` buffer meanwhile. Subscribes to the agent's session
        subjects. Raises :class:`ConnectionLost` when no server answers within
        ``limits.request_timeout``."""
        limits = limits or NatsLimits()
        urls = [s.strip() for s in ([servers] if isinstance(servers, str) else servers)
                for s in s.split(",") if s.strip()]
        if not urls:
            raise ValueError("no NATS server given")
        client = _DirectClient()
        bus_ref: list[NatsBus] = []

        async def on_error(exc: Exception) -> None:
            if bus_ref:
                bus_ref[0].stats["errors"] += 1
                bus_ref[0].agent._say(f"nats: {type(exc).__name__}: {peer_text(exc, 160)}")

        async def on_disconnect() -> None:
            if bus_ref and not bus_ref[0]._closing:
                bus_ref[0].agent._say("nats: disconnected; reconnecting")

        async def on_reconnect() -> None:
            if bus_ref:
                url = client.connected_url
                bus_ref[0].agent._say(f"nats: reconnected to "
                                      f"{peer_text(url.netloc if url else '?', 64)}")

        try:
            async with asyncio.timeout(limits.request_timeout):
                await client.connect(
                    servers=urls, error_cb=on_error, disconnected_cb=on_disconnect,
                    reconnected_cb=on_reconnect, name=str(agent.name)[:128],
                    connect_timeout=max(1, int(limits.request_timeout)),
                    reconnect_time_wait=reconnect_wait,  # type: ignore[arg-type]
                    max_reconnect_attempts=max_reconnects,
                    ping_interval=ping_interval,  # type: ignore[arg-type]
                    pending_size=pending_bytes, dont_randomize=not randomize,
                    allow_reconnect=True)
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            with contextlib.suppress(Exception):
                await client.close()
            raise _nats_lost(f"cannot connect to {', '.join(urls)}", exc) from None
        bus = cls(agent, client, prefix=prefix, limits=limits)
        bus_ref.append(bus)
        try:
            sub = await bus._subscribe(f"{bus._session_prefix}>", bus._on_session_message)
            client.direct[sub._id] = bus._on_session_frame
        except BaseException:
            await bus.close()
            raise
        return bus

    async def _subscribe(self, subject: str, callback: Callable[[Msg], Awaitable[None]]
                         ) -> Any:
        try:
            sub = await self.client.subscribe(subject, cb=callback,
                                              pending_msgs_limit=self.limits.pending_msgs,
                                              pending_bytes_limit=self.limits.pending_msgs
                                              * 2048)
            # The server has the interest once it answered a PING sent after it: only then
            # is a publisher's message on the subject sure to reach us.
            await self.client.flush(timeout=max(1, int(self.limits.request_timeout)))
        except (nats.errors.Error, TimeoutError) as exc:
            raise _nats_lost(f"cannot subscribe to {subject}", exc) from None
        self._subs.append(sub)
        return sub

    def _post(self, subject: str, data: bytes, reply: str = ""
              ) -> Coroutine[Any, Any, None] | None:
        """Publish at once where the client can (:meth:`_DirectClient.publish_now`) and
        return ``None``; else return the publish to await (:meth:`_publish`)."""
        publish_now = self._publish_now
        if publish_now is not None and publish_now(subject, data, reply):
            return None
        return self._publish(subject, data, reply)

    def _post_all(self, items: Iterable[tuple[str, bytes, str]]) -> Awaitable[None] | None:
        """:meth:`_post` of each of ``items`` in order; returns what is left to await (from
        the first publish the client could not take at once: the rest after it)."""
        items = list(items)
        for at, (subject, data, reply) in enumerate(items):
            left = self._post(subject, data, reply)
            if left is not None:
                return self._publish_rest(left, items[at + 1:])
        return None

    async def _publish_rest(self, left: Awaitable[None],
                            items: list[tuple[str, bytes, str]]) -> None:
        with contextlib.suppress(ConnectionLost):
            await left
            for subject, data, reply in items:
                await self._publish(subject, data, reply)

    async def _publish(self, subject: str, data: bytes, reply: str = "") -> None:
        try:
            await self.client.publish(subject, data, reply=reply)
        except nats.errors.Error as exc:
            raise _nats_lost(f"cannot publish on {subject[:80]}", exc) from None

    def agent_subject(self, uri: URI | str) -> str:
        """Where ``uri``'s sessions start (``P.agent.TOKEN``)."""
        return f"{self.prefix}.agent.{self._token(str(uri))}"

    def group_subject(self, uri: URI | str) -> str:
        """Where ``uri``'s group calls go (``P.group.TOKEN``)."""
        return f"{self.prefix}.group.{self._token(str(uri))}"

    def durable_subject(self, uri: URI | str) -> str:
        """Where durable messages to ``uri`` go (``P.d.TOKEN``)."""
        return f"{self.prefix}.d.{self._token(str(uri))}"

    def dead_letter_subject(self, uri: URI | str) -> str:
        """Where durable messages to ``uri`` that could not be handled are kept
        (``P.dead.TOKEN``, in ``uri``'s stream)."""
        return f"{self.prefix}.dead.{self._token(str(uri))}"

    def stream_config(self, uri: URI | str, *, replicas: int = 1) -> js_api.StreamConfig:
        """The JetStream stream that keeps ``uri``'s durable messages and dead letters:
        made the same by the receiver and by a sender that comes first."""
        limits = self.limits
        return js_api.StreamConfig(
            name=self.stream_name(uri),
            subjects=[self.durable_subject(uri), self.dead_letter_subject(uri)],
            max_age=limits.durable_max_age, max_msgs=limits.durable_max_msgs,
            max_bytes=limits.durable_max_bytes,
            max_msg_size=self.agent.connection_limits.max_frame_bytes,
            duplicate_window=limits.duplicate_window, num_replicas=replicas,
            discard=js_api.DiscardPolicy.OLD, storage=js_api.StorageType.FILE)

    def stream_name(self, uri: URI | str) -> str:
        """The JetStream stream that keeps ``uri``'s durable messages."""
        digest = hashlib.sha256(f"{self.prefix} {uri}".encode()).hexdigest()[:40]
        return f"CBCL_{digest}"

    def _token(self, text: str) -> str:
        return subject_token(text, limit=self.limits.max_token_bytes)

    def _cid_token(self, cid: str | None) -> str:
        """The subject token of a conversation id (``_`` for none), remembered for the
        last ``_TOKENS_KEPT`` ids (each is asked for at least twice: sent and received).
        Raises as :func:`subject_token`."""
        if cid is None:
            return NO_CONVERSATION
        tokens = self._cid_tokens
        token = tokens.get(cid)
        if token is None:
            token = self._token(cid)
            if len(tokens) >= _TOKENS_KEPT:
                tokens.clear()  # (bounded; most ids are used for one conversation)
            tokens[cid] = token
        return token

    # ----------------------------------------------------------------- receiving

    async def _on_session_message(self, msg: Msg) -> None:
        """A message on one of our session subjects, the way nats-py hands it to a
        subscription (unused while :class:`_DirectClient` takes them)."""
        headers = msg.headers or {}
        left = self._on_session(msg.subject, msg.data,
                                not msg.data and headers.get("Status") == "503")
        if left is not None:
            await left

    def _on_session_frame(self, subject: bytes, data: bytes, headers: bytes | None
                          ) -> Awaitable[None] | None:
        """A message on one of our session subjects, from the client's read loop
        (:class:`_DirectClient`): its headers read only for a status (no payload).
        Returns what is left to await, if anything."""
        if headers and not data:
            return self._on_status(subject, headers)
        # (by the session's inbox subject as bytes: no decoding or split of the subject)
        by_inbox = self._by_inbox
        connection = by_inbox.get(subject)
        if connection is not None:
            return connection.deliver_now(None, data)
        head, _, tail = subject.rpartition(b".")
        connection = by_inbox.get(head)
        if connection is not None:
            return connection.deliver_now(tail.decode("utf-8", "replace"), data)
        return self._on_session(subject.decode("utf-8", "replace"), data, False)

    async def _on_status(self, subject: bytes, headers: bytes) -> None:
        parsed = await self.client._process_headers(headers)
        left = self._on_session(subject.decode("utf-8", "replace"), b"",
                                (parsed or {}).get("Status") == "503")
        if left is not None:
            await left

    def _on_session(self, subject: str, data: bytes, no_responders: bool
                    ) -> Awaitable[None] | None:
        """Hand a message on one of our session subjects to its session, or drop it.
        Returns what is left to await, if anything."""
        rest = subject[len(self._session_prefix):].split(".")
        if len(rest) not in (3, 4):
            self.stats["unknown"] += 1
            return None
        connection = self._sessions.get((rest[0], rest[1], rest[2]))
        if connection is None:
            self.stats["unknown"] += 1
            return None
        return connection.deliver_now(rest[3] if len(rest) == 4 else None, data,
                                      no_responders)

    async def serve(self) -> None:
        """Answer sessions on this agent's subject (``P.agent.TOKEN``): negotiate, learn what
        trusted peers offer, run the agent's handlers, as :meth:`Agent.serve` does. Raises
        ``ValueError`` without a trust store."""
        if self.agent.trust is None:
            raise ValueError("a serving agent needs a trust store")
        await self._subscribe(self.agent_subject(self.agent.name), self._on_start)

    async def _on_start(self, msg: Msg) -> None:
        """A first frame on the agent's subject: a new session, under the caps."""
        reply = msg.reply or ""
        head = f"{self.prefix}.s."
        parts = reply[len(head):].split(".") if reply.startswith(head) else []
        if len(parts) != 4 or parts[1] != self.me or parts[3] != "i" \
                or _SID_RE.fullmatch(parts[2]) is None:
            self.stats["refused"] += 1
            self.agent._say(f"nats: dropped a first frame whose reply subject "
                            f"{peer_text(reply, 80)} is not a session subject for this agent")
            return
        peer_token, sid = parts[0], parts[2]
        if len(peer_token) > self.limits.max_token_bytes \
                or _TOKEN_RE.fullmatch(peer_token) is None:
            # (before any table holds it: senders' buckets and ended sessions are keyed
            # by it; decoded in full only for a session)
            self.stats["refused"] += 1
            self._say_quietly("token", f"nats: dropped a first frame from a name that is "
                              f"not a subject token {peer_text(peer_token, 60)}")
            return
        key = (peer_token, sid, "r")
        live = self._sessions.get(key)
        if live is not None and live.seen(msg.data):
            await live.deliver(None, msg.data)  # a repeat: answered from its cache
            return
        if live is not None or (peer_token, sid) in self._ended:
            self.stats["replays"] += 1
            self._say_quietly("replay", f"nats: dropped a first frame for session "
                              f"{sid[:12]}… of {peer_text(peer_token, 60)}, which was used "
                              "before (a replay)")
            return
        limits = self.limits
        victim: _Served | None = None
        why = ""
        if not self._sender_bucket(peer_token).take():
            why = (f"more than {limits.sender_start_rate:g} session starts per second from "
                   "this sender (sender_start_rate)")
        elif not self._bucket.take():
            why = (f"more than {limits.start_rate:g} session starts per second "
                   "(start_rate)")
        elif self._pending.count(peer_token) >= limits.pending_share():
            victim = self._pending.oldest(peer_token)
            evicting = (f"its sender holds {limits.pending_share()} sessions not established"
                        " (pre_handshake_share)")
        elif self._responders >= limits.max_sessions:
            victim = self._pending.victim(peer_token)
            evicting = f"{limits.max_sessions} sessions are open (max_sessions)"
            if victim is None:
                why = evicting + ", all established"
        if why:
            await self._refuse_busy(peer_token, sid, reply, msg.data, why)
            return
        try:  # (decoded only now: a flood's refusals need not)
            peer = token_text(peer_token)
        except ValueError:
            self.stats["refused"] += 1
            self.agent._say(f"nats: dropped a first frame from an undecodable name "
                            f"{peer_text(peer_token, 60)}")
            return
        if victim is not None:
            self._evict(victim, evicting)
        agent = self.agent
        session = agent._responder()
        connection = NatsConnection(
            self, session, key=key, out_subject=reply,
            inbox=f"{self._session_prefix}{peer_token}.{sid}.r", peer=peer, opener=False)
        served = _Served(peer_token, self._loop_time())
        served.connection = connection
        served.holding = True
        connection.served = served
        connection.on_established = lambda: self._pending.discard(served)
        self._pending.add(served)
        agent._watch_offers(connection, peer)
        link = Link(agent, connection, next(agent._numbers), "serve")
        self._register(connection, link)
        self._responders += 1
        agent._links.add(link)
        self._spawn(self._run_responder(connection, link))
        await connection.deliver(None, msg.data)

    @staticmethod
    def _loop_time() -> float:
        return asyncio.get_running_loop().time()

    def _sender_bucket(self, peer_token: str) -> _Bucket:
        """The start bucket of one sender (at most ``remembered_sessions`` senders are
        remembered, the least recently seen forgotten: a full bucket again)."""
        bucket = self._sender_buckets.pop(peer_token, None)
        if bucket is None:
            bucket = _Bucket(self.limits.sender_start_rate, self.limits.sender_start_burst)
        self._sender_buckets[peer_token] = bucket
        while len(self._sender_buckets) > self.limits.remembered_sessions:
            self._sender_buckets.popitem(last=False)
        return bucket

    def _evict(self, victim: _Served, why: str) -> None:
        """Make room for a newcomer: end the served session ``victim`` (not ESTABLISHED),
        whose place passes to the newcomer at once."""
        self._pending.discard(victim)
        if victim.holding:
            victim.holding = False
            self._responders -= 1
        self.stats["evicted"] += 1
        connection = victim.connection
        if connection is not None:
            connection.evict(f"evicted after {self._loop_time() - victim.started:.1f} s "
                             f"without a finished handshake to make room: {why}")

    async def _refuse_busy(self, peer_token: str, sid: str, reply: str, data: bytes,
                           why: str) -> None:
        """Refuse a first frame ``busy``: on its reply subject, only if the frame's sender
        is the agent that subject names (so the sender is the token's text);
        remembered, so a repeat is dropped."""
        self.stats["busy"] += 1
        self._remember_ended(peer_token, sid)
        sender = self._sent_by(peer_token, data)
        if sender is None:
            self.stats["unanswered"] += 1  # not told: its sender is not the subject's
            return
        self._say_quietly("busy", f"nats: refused a session from {peer_text(sender, 60)}: "
                          f"{why}")
        with contextlib.suppress(ConnectionLost):
            await self._publish(reply, self._busy_frame())

    def _busy_frame(self) -> bytes:
        """The NOT-UNDERSTOOD ``busy`` payload, made again when a second old (its
        timestamp must be fresh; a flood's refusals share it)."""
        now = clock_ms()
        if now - self._busy_made[0] >= 1000:
            self._busy_made = (now, not_understood_frame("busy", now=now)[PREFIX_BYTES:])
        return self._busy_made[1]

    def _say_quietly(self, kind: str, text: str) -> None:
        """Log ``text``, but lines of one ``kind`` at most once a second: a flood of
        refusals writes one line a second, with the number of lines left out."""
        now = time.monotonic()
        last, left_out = self._quiet.get(kind, (0.0, 0))
        if now - last < 1.0:
            self._quiet[kind] = (last, left_out + 1)
            return
        self._quiet[kind] = (now, 0)
        more = f" ({left_out} more like it in the last second)" if left_out else ""
        self.agent._say(text + more)

    def _sent_by(self, peer_token: str, data: bytes) -> str | None:
        """The sender of the first frame ``data`` if it is a CBCL message whose sender's
        token is ``peer_token`` (the one its reply subject names), else ``None``: only
        then may a refusal be published there (an envelope-only parse, microseconds)."""
        if len(data) > self.agent.connection_limits.max_frame_bytes:
            return None
        try:
            sender = str(parse(data, limits=self.agent.limits, envelope_only=True).sender)
            return sender if self._token(sender) == peer_token else None
        except (CBCLError, ValueError):
            return None

    async def _run_responder(self, connection: NatsConnection, link: Link) -> None:
        try:
            with contextlib.suppress(ConnectionLost):
                await link.run()
        finally:
            if link.established.done() and not link.established.cancelled():
                link.established.exception()  # nobody awaits a served link's agreement
            served = connection.served
            if served is not None:
                self._pending.discard(served)
                if served.holding:
                    served.holding = False
                    self._responders -= 1
            await connection.close()
            connection.session.registry.abandon()

    def _spawn(self, coroutine: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _register(self, connection: NatsConnection, link: Link | None) -> None:
        self._sessions[connection.key] = connection
        self._by_inbox[connection.inbox.encode()] = connection
        if link is not None:
            self._links[connection.key] = link

    def _forget(self, connection: NatsConnection) -> None:
        if self._sessions.get(connection.key) is connection:
            del self._sessions[connection.key]
            self._links.pop(connection.key, None)
        inbox = connection.inbox.encode()
        if self._by_inbox.get(inbox) is connection:
            del self._by_inbox[inbox]
        self._remember_ended(connection.key[0], connection.key[1])

    def _remember_ended(self, peer_token: str, sid: str) -> None:
        self._ended[(peer_token, sid)] = None
        while len(self._ended) > self.limits.remembered_sessions:
            self._ended.popitem(last=False)

    # ----------------------------------------------------------------- opening

    def open_connection(self, session: Session, peer: URI | str) -> NatsConnection:
        """A :class:`NatsConnection` for the initiator ``session`` to the agent ``peer`` (a
        fresh session id); its first :meth:`~NatsConnection.send` (the QUERY) goes on the
        peer's agent subject. For a driver of its own (``cbcl negotiate``);
        :meth:`open_link` is the agent's way."""
        peer_token = self._token(str(peer))
        sid = secrets.token_hex(16)
        connection = NatsConnection(
            self, session, key=(peer_token, sid, "i"),
            out_subject=f"{self.prefix}.s.{peer_token}.{self.me}.{sid}.r",
            inbox=f"{self._session_prefix}{peer_token}.{sid}.i", peer=str(peer),
            opener=True, first_subject=self.agent_subject(peer))
        self._register(connection, None)
        return connection

    async def open_link(self, peer: URI | str, *, descriptor: bytes,
                        encodings: Iterable[str] | None = None) -> Link:
        """Negotiate the protocol of the signed ``descriptor`` with the agent ``peer`` over
        NATS (asked first, offered when the peer does not hold it) and return the
        established :class:`~cbcl.net.Link`, as :meth:`Agent.connect` does. Raises
        :class:`~cbcl.NegotiationFailed`, :class:`ConnectionLost` (no such agent on the
        bus, a deadline), :class:`~cbcl.ConversationClosed`."""
        agent = self.agent
        registry = agent._registry()
        payload = read_signed_descriptor_unverified(descriptor).payload
        protocol = registry.load(payload, allow_unsigned=True)  # our own descriptor
        session = agent._session("initiator", registry, peer=peer, encodings=encodings)
        connection = self.open_connection(session, peer)
        link = Link(agent, connection, next(agent._numbers), "link")
        self._links[connection.key] = link
        link._offer = descriptor
        agent._links.add(link)
        try:
            await connection.send(Query(str(protocol.id), protocol.digest,
                                        (protocol.descriptor.version,), session.encodings))
        except BaseException:
            await link.close()
            raise
        link.task = asyncio.get_running_loop().create_task(link.run())
        try:
            async with asyncio.timeout(agent.connection_limits.handshake_timeout):
                await asyncio.shield(link.established)
        except TimeoutError:
            await link.close()
            raise ConnectionLost(f"the handshake with {peer_text(peer, 60)} did not finish "
                                 f"within {agent.connection_limits.handshake_timeout:g} s",
                                 code="timeout") from None
        except BaseException:
            await link.close()
            if connection._no_responders:
                raise ConnectionLost(f"no agent {peer_text(peer, 60)} listens on the bus"
                                     ) from None
            raise
        return link

    # ----------------------------------------------------------------- groups

    async def join(self, group: URI | str) -> None:
        """Listen for calls to ``group`` (:meth:`fan_out`) and answer each with this agent's
        name; the caller then opens a session with each member."""
        group_subject = self.group_subject(group)
        await self._subscribe(group_subject, self._on_call)

    async def _on_call(self, msg: Msg) -> None:
        reply = msg.reply or ""
        head = f"{self.prefix}.call."
        parts = reply[len(head):].split(".") if reply.startswith(head) else []
        if len(parts) != 2 or _SID_RE.fullmatch(parts[1]) is None \
                or len(msg.data) > self.limits.max_token_bytes:
            self.stats["refused"] += 1
            return
        try:
            caller = URI(msg.data.decode("utf-8"))
            valid = self._token(str(caller)) == parts[0]
        except (ValueError, CBCLError):
            valid = False
        if not valid:  # answer only the caller the reply subject names
            self.stats["refused"] += 1
            self.agent._say(f"nats: dropped a group call whose caller is not the one its "
                            f"reply subject {peer_text(reply, 80)} names")
            return
        if not self._bucket.take():
            self.stats["busy"] += 1
            return
        with contextlib.suppress(ConnectionLost):
            await self._publish(reply, str(self.agent.name).encode())

    async def fan_out(self, group: URI | str, *, descriptor: bytes, intent: Intent | str,
                      body: Value | None, window: float = 0.5,
                      max_replies: int | None = None,
                      reply_timeout: float | None = None) -> list[Bid]:
        """Call ``group``: one message on its subject; every member listening answers with
        its name within ``window`` seconds (at most ``max_replies``, default
        ``limits.max_call_replies``). Then, with each, a session (negotiating the protocol
        of ``descriptor``) and a new conversation that starts with ``(intent, body)``: each
        reply is its own conversation. Returns one :class:`Bid` per member, in the order
        they answered."""
        _check_seconds("window", window)
        cap = self.limits.max_call_replies if max_replies is None else max_replies
        _check_count("max_replies", cap)
        call = secrets.token_hex(16)
        reply = f"{self.prefix}.call.{self.me}.{call}"
        names: list[str] = []
        full = asyncio.Event()

        async def collect(msg: Msg) -> None:
            if len(names) >= cap or len(msg.data) > self.limits.max_token_bytes:
                return
            try:
                name = str(URI(msg.data.decode("utf-8")))
            except ValueError:
                self.stats["refused"] += 1
                return
            if name not in names:
                names.append(name)
            if len(names) >= cap:
                full.set()

        sub = await self._subscribe(reply, collect)
        try:
            await self._publish(self.group_subject(group), str(self.agent.name).encode(),
                                reply)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(window):
                    await full.wait()
        finally:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
            if sub in self._subs:
                self._subs.remove(sub)

        async def bid(name: str) -> Bid:
            link = None
            try:
                link = await self.open_link(name, descriptor=descriptor)
                conversation = link.conversation()
                answer = await conversation.send(intent, body, timeout=reply_timeout)
                return Bid(name, link, conversation, answer)
            except CBCLError as exc:
                return Bid(name, link, None, None, exc)

        return list(await asyncio.gather(*(bid(name) for name in names)))

    # ----------------------------------------------------------------- durable

    def _jetstream(self) -> JetStreamContext:
        return self.client.jetstream(timeout=self.limits.request_timeout)

    async def enable_durable(self, *, replicas: int | None = None) -> None:
        """Keep this agent's durable messages in a JetStream stream (made if missing,
        ``replicas`` copies in a cluster: 3 survive the death of the stream's leader;
        ``None``: 1 for a new stream, as many as it has for an existing one) and
        take them with a durable pull consumer: messages sent while the agent was down
        arrive now. Each is judged like a session's message (both passes, the schema,
        receiver, timestamp within ``durable_max_age`` and 30 s of the future, the replay
        window) against the protocols the agent holds, then handed to its handler and
        acknowledged; a refused one is terminated; one of a protocol the agent does not
        hold (yet) is delivered again later, and moved to :meth:`dead_letter_subject`
        after ``max_deliver`` deliveries. Setting up is retried for ``durable_retry_for``
        seconds (backoff 0.25 s doubling to 5 s; each failure logged). Raises
        ``ValueError`` for ``replicas`` outside 1..5, :class:`ConnectionLost`."""
        if replicas is not None:
            _check_count("replicas", replicas, upper=5)
        limits = self.limits
        subject = self.durable_subject(self.agent.name)
        name = self.stream_name(self.agent.name)
        config = self.stream_config(self.agent.name, replicas=replicas or 1)
        consumer = js_api.ConsumerConfig(
            durable_name="cbcl", ack_policy=js_api.AckPolicy.EXPLICIT,
            ack_wait=limits.ack_wait, max_deliver=-1, filter_subject=subject,
            max_ack_pending=limits.durable_batch * 4,
            deliver_policy=js_api.DeliverPolicy.ALL)
        js = self._jetstream()

        async def set_up() -> Any:
            await self._ensure_stream(js, config, keep_replicas=replicas is None)
            return await js.pull_subscribe(subject, durable="cbcl", stream=name,
                                           config=consumer)

        subscription = await self._retrying("set up durable delivery", set_up)
        registry = self.agent._registry()
        for protocol in (*self.agent.preloaded, *self.agent.learned.protocols()):
            registry.adopt(protocol)
        self._durable_registry = registry
        self._load_durable_seen()
        self._durable_stop = False
        self._durable_task = asyncio.ensure_future(self._durable_loop(subscription))

    async def _ensure_stream(self, js: JetStreamContext, config: js_api.StreamConfig,
                             *, update: bool = True, keep_replicas: bool = False) -> None:
        """Make the stream of ``config``; if it exists, take ``config``'s limits (when
        ``update``; its own number of replicas kept when ``keep_replicas``) or leave it
        as it is. Raises nats-py's errors."""
        try:
            await js.add_stream(config)
        except nats.js.errors.BadRequestError:  # it exists, made otherwise
            if not update:
                return
            if keep_replicas:
                info = await js.stream_info(str(config.name))
                config = config.evolve(num_replicas=info.config.num_replicas)
            await js.update_stream(config)

    async def _retrying(self, what: str, attempt: Callable[[], Awaitable[Any]]) -> Any:
        """``attempt()`` again after each of nats-py's errors but a bad request (a
        timeout, no responders or unavailable while a stream's leader is elected, a
        server going away), backing off from 0.25
        s to 5 s, for ``durable_retry_for`` seconds; each failure logged. Raises
        :class:`ConnectionLost` with the last error."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.durable_retry_for
        pause = 0.25
        while True:
            try:
                return await attempt()
            except nats.js.errors.BadRequestError as exc:  # not a passing failure
                raise _nats_lost(f"cannot {what}", exc) from None
            except (nats.errors.Error, TimeoutError) as exc:
                if self._closing or loop.time() + pause > deadline:
                    raise _nats_lost(f"cannot {what}", exc) from None
                self.stats["errors"] += 1
                self.agent._say(f"nats: cannot {what} yet ({peer_text(exc, 120) or 'timeout'})"
                                f"; trying again in {pause:g} s")
                await asyncio.sleep(pause)
                pause = min(pause * 2, 5.0)

    def _seen_path(self) -> Path | None:
        state = self.agent.state
        return None if state is None else state / "nats-durable-seen"

    def _load_durable_seen(self) -> None:
        path = self._seen_path()
        if path is None or not path.is_file():
            return
        with contextlib.suppress(OSError, UnicodeDecodeError):
            limit = self.limits.durable_replay_window
            lines = path.read_bytes()[: limit * 300].decode("utf-8").splitlines()
            for line in lines[-limit:]:
                self._note_durable(line)

    def _save_durable_seen(self) -> None:
        path = self._seen_path()
        if path is None or self._durable_registry is None:
            return
        with contextlib.suppress(OSError):
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_atomically(path, "".join(f"{i}\n" for i in self._durable_seen).encode(),
                             prefix=".seen-")

    def _note_durable(self, message_id: str) -> None:
        self._durable_seen.append(message_id)
        self._durable_seen_set.add(message_id)
        while len(self._durable_seen) > self.limits.durable_replay_window:
            self._durable_seen_set.discard(self._durable_seen.popleft())

    async def _durable_loop(self, subscription: Any) -> None:
        pause = 0.25  # after a failed fetch (a node down, a leader being elected)
        while not self._durable_stop:
            try:
                batch = await subscription.fetch(self.limits.durable_batch, timeout=0.5)
            except nats.errors.TimeoutError:
                continue
            except nats.errors.Error as exc:
                if self._durable_stop:
                    return
                self.stats["errors"] += 1
                self._say_quietly("fetch", f"nats: durable fetch failed: "
                                  f"{peer_text(exc, 120)}; trying again")
                await asyncio.sleep(pause)
                pause = min(pause * 2, 5.0)
                continue
            pause = 0.25
            for msg in batch:
                await self._take_durable(msg)

    def _judge_durable(self, msg: Msg) -> Message:
        """The durable message in ``msg``, checked; raises :class:`CBCLError`."""
        data = msg.data
        limit = self.agent.connection_limits.max_frame_bytes
        if len(data) > limit:
            raise LimitError(f"a durable message of {len(data)} bytes; at most {limit}",
                             limit="max_frame_bytes", maximum=limit)
        if self._durable_registry is None:  # pragma: no cover - set before the loop runs
            raise MalformedError("durable delivery is not enabled")
        message = parse(data, limits=self.agent.limits, registry=self._durable_registry)
        if message.receiver != self.agent.name:
            raise RemoteProtocolError(f"a durable message to {peer_text(message.receiver, 60)}"
                                      " on this agent's subject", code="malformed")
        header = (msg.headers or {}).get(MSG_ID)
        if header != message.message_id:
            raise RemoteProtocolError(f"the {MSG_ID} {peer_text(header, 40)} is not the "
                                      "message's id", code="malformed")
        now = clock_ms()
        if message.timestamp is None or message.timestamp > now + 30_000 \
                or message.timestamp < now - int(self.limits.durable_max_age * 1000):
            raise RemoteProtocolError(f"durable message {peer_text(message.message_id, 40)} "
                                      "has no timestamp or one out of range", code="stale")
        return message

    def _durable_identity(self, message: Message) -> Identity | None:
        """Who sent a durable message: no session vouches for its sender, only its own
        signature, which parse verified (the key bound to the sender, spec/trust.md
        §4.1); ``None`` for an unsigned one. Raises :class:`TrustError`."""
        trust = None if self._durable_registry is None else self._durable_registry.trust
        if trust is None or message.signature is None:
            return None
        return trust.identity(message.signature.key_id, message.sender)

    async def _take_durable(self, msg: Msg) -> None:
        try:
            try:
                message = self._judge_durable(msg)
            except UnknownProtocolError:
                if not self._learn_durable_protocols():
                    raise
                message = self._judge_durable(msg)  # learned since: judged again
            identity = self._durable_identity(message)
        except UnknownProtocolError as exc:
            await self._not_yet(msg, exc)
            return
        except CBCLError as exc:
            self.stats["durable_refused"] += 1
            self.agent._say(f"nats: durable message refused and terminated: "
                            f"{peer_text(exc.one_line(), 200)}")
            await self._settle(msg, accepted=False)
            return
        if message.message_id in self._durable_seen_set:
            self.stats["durable_duplicates"] += 1
            self.agent._say(f'nats: durable message "{peer_text(message.message_id, 64)}" '
                            "is a replay: terminated")
            await self._settle(msg, accepted=False)
            return
        self._note_durable(message.message_id)
        self.stats["durable_accepted"] += 1
        handler = self.agent.handler_for(str(message.protocol), message.intent)
        tracer = None if _tracing.otel is None else _tracing.active_tracer()
        if tracer is not None:  # the spans a link makes (receive, handle), the same parent
            await _tracing.receiving(tracer, self._traced_durable(
                tracer, handler, message, identity, msg.subject), message, msg.subject)
        elif handler is not None:
            await self._run_durable_handler(handler, message, identity)
        await self._settle(msg, accepted=True)

    async def _traced_durable(self, tracer: Any, handler: Any, message: Message,
                              identity: Identity | None, subject: str) -> None:
        """:meth:`_run_durable_handler` inside a ``handle`` span (current while it runs,
        so a durable reply carries it), where there is a handler."""
        if handler is not None:
            await _tracing.handling(tracer, self._run_durable_handler(handler, message,
                                                                      identity),
                                    message, subject)

    async def _run_durable_handler(self, handler: Any, message: Message,
                                   identity: Identity | None = None) -> None:
        """Run ``handler`` for a durable message as a link runs one (its threads, its
        deadline, every exception contained and logged with its traceback); a reply it
        returns is sent durable. A durable sender awaits no reply, so a failure is only
        logged, never answered."""
        numbers = iter(range(1, 1 << 62))
        context = Context(message, next_id=lambda: f"d-{secrets.token_hex(12)}-"
                                                    f"{next(numbers)}",
                          identity=identity)
        agent = self.agent
        outcome = await run_handler(handler, message, context, threads=agent.threads,
                                    timeout=agent.handler_timeout)
        timings = {"handler_ms": round(outcome.seconds * 1000, 3)}
        answer = outcome.value
        if outcome.kind == "raised":
            error: BaseException = answer
            agent._say(f"nats: the durable handler failed: {type(error).__name__}: "
                       f"{peer_text(error, 160)}", level=logging.ERROR,
                       event="handler-failed", message=message, reason="handler-failed",
                       exc_info=error if isinstance(error, Exception) else None,
                       timings=timings)
            return
        if outcome.kind != "answer":
            agent._say(f"nats: the durable handler did not answer within "
                       f"{agent.handler_timeout:g} s", level=logging.ERROR,
                       event="handler-timeout", message=message, reason="handler-timeout",
                       timings=timings)
            return
        if isinstance(answer, Message):
            try:  # (never a stream for a name a durable message merely claims)
                await self.send_durable(answer, make_stream=False)
            except CBCLError as exc:
                agent._say(f"nats: the durable reply was not sent: "
                           f"{peer_text(exc.one_line(), 160)}", level=logging.ERROR,
                           event="invalid-reply", message=answer)

    def _learn_durable_protocols(self) -> bool:
        """Adopt into the durable registry the protocols the agent learned since (over
        its sessions); whether there was any."""
        registry = self._durable_registry
        if registry is None:  # pragma: no cover - set before the loop runs
            return False
        fresh = [protocol for protocol in self.agent.learned.protocols()
                 if registry.get(protocol.id) is None]
        for protocol in fresh:
            registry.adopt(protocol)
        return bool(fresh)

    async def _not_yet(self, msg: Msg, error: CBCLError) -> None:
        """A durable message this agent cannot handle yet (a protocol it does not hold):
        kept — delivered again after ``durable_retry_delay`` times its deliveries so
        far — and on its ``max_deliver``-th delivery moved to the dead-letter subject,
        never dropped. Raises nothing (failures are logged; the server delivers it again
        after ``ack_wait``)."""
        limits = self.limits
        try:
            deliveries = int(msg.metadata.num_delivered or 1)
        except (AttributeError, ValueError, TypeError):  # not a JetStream message
            deliveries = 1
        reason = peer_text(error.one_line(), 200)
        try:
            if deliveries < limits.max_deliver:
                self.stats["durable_retried"] += 1
                delay = limits.durable_retry_delay * deliveries
                self.agent._say(f"nats: durable message not handled yet ({reason}); "
                                f"delivery {deliveries} of {limits.max_deliver}, again in "
                                f"{delay:g} s")
                await msg.nak(delay=delay)
                return
            await self._dead_letter(msg, reason, deliveries)
        except (nats.errors.Error, TimeoutError) as exc:
            self.stats["errors"] += 1
            self.agent._say(f"nats: could not keep a durable message for later: "
                            f"{peer_text(exc, 120)}")

    async def _dead_letter(self, msg: Msg, reason: str, deliveries: int) -> None:
        """Store ``msg`` on the dead-letter subject (its headers kept, with why and how
        often it was delivered), then terminate the original — only once the copy is
        acknowledged. Raises nats-py's errors."""
        headers = dict(msg.headers or {})
        original = headers.pop(MSG_ID, "")
        headers.update({"CBCL-Dead-Reason": reason, "CBCL-Deliveries": str(deliveries),
                        "CBCL-Msg-Id": original, "CBCL-Subject": msg.subject})
        if original:  # the copy deduplicated too, apart from the original's id
            headers[MSG_ID] = f"dead:{original}"
        await self._jetstream().publish(self.dead_letter_subject(self.agent.name),
                                        msg.data, timeout=self.limits.request_timeout,
                                        headers=headers)
        await msg.term()
        self.stats["durable_dead"] += 1
        self.agent._say(f"nats: durable message {peer_text(original, 64)} moved to "
                        f"{self.dead_letter_subject(self.agent.name)} after {deliveries} "
                        f"deliveries: {reason}", level=logging.WARNING)

    async def _settle(self, msg: Msg, *, accepted: bool) -> None:
        try:
            await (msg.ack() if accepted else msg.term())
        except nats.errors.Error as exc:
            self.stats["errors"] += 1
            self.agent._say(f"nats: could not acknowledge a durable message: "
                            f"{peer_text(exc, 120)}")

    def durable_id(self) -> str:
        """A fresh message id for a durable message (128 random bits: ``Nats-Msg-Id``
        deduplicates by it, so it must not repeat)."""
        return f"d-{secrets.token_hex(16)}"

    def _protocol_for(self, message: Message, descriptor: bytes | None) -> Protocol:
        if descriptor is not None:
            payload = read_signed_descriptor_unverified(descriptor).payload
            digest = hashlib.sha256(payload).hexdigest()
            registry = self._send_registries.get(digest)
            if registry is None:
                registry = self.agent._registry()
                registry.load(payload, allow_unsigned=True)  # our own descriptor
                self._send_registries[digest] = registry
                while len(self._send_registries) > 16:
                    self._send_registries.popitem(last=False)
            found = registry.get(message.protocol)
        else:
            found = None
            for protocol in (*self.agent.preloaded, *self.agent.learned.protocols()):
                if protocol.id == message.protocol:
                    found = protocol
        if found is None:
            raise ValueError(f"{message.protocol} is not the protocol of the descriptor given "
                             "(or one this agent holds)")
        return found

    async def send_durable(self, message: Message, *, descriptor: bytes | None = None,
                           replicas: int = 1, make_stream: bool = True) -> bool:
        """Store ``message`` in its receiver's durable stream (``Nats-Msg-Id`` = its id),
        checked first as the receiver will check it, in canonical text; the protocol is
        ``descriptor``'s (signed), or one the agent holds. If the receiver has no stream
        yet (it never started), the stream is made as the receiver would make it
        (:meth:`stream_config`, ``replicas`` copies) — unless not ``make_stream``, when
        that is :class:`ConnectionLost`; an existing one is left as it is.
        A publish that fails for a passing reason (no acknowledgement, a node down, a
        leader being elected) is repeated with the same id for ``durable_retry_for``
        seconds. Returns whether the server had the id already (a duplicate, dropped).
        Raises the message's :class:`CBCLError` (nothing is sent), ``ValueError`` for an
        id that cannot be a header value or ``replicas`` outside 1..5,
        :class:`ConnectionLost` (no server, no acknowledgement in time)."""
        _check_count("replicas", replicas, upper=5)
        ident = message.message_id
        if not ident.isprintable() or ident != ident.strip() or len(ident) > 256:
            raise ValueError("a durable message id is at most 256 printable characters, "
                             "without surrounding spaces")
        protocol = self._protocol_for(message, descriptor)
        if _tracing.otel is not None:  # the current span's context, in (trace …)
            message = _tracing.outgoing(message)
        if message.timestamp is None:
            message = replace(message, timestamp=clock_ms())
        check_outgoing(protocol, message, self.agent.limits)
        data = message.canonical().encode("utf-8")
        subject = self.durable_subject(message.receiver)
        js = self._jetstream()
        timeout = self.limits.request_timeout

        async def publish() -> Any:
            try:
                return await js.publish(subject, data, timeout=timeout,
                                        headers={MSG_ID: ident})
            except nats.js.errors.NoStreamResponseError:
                # No stream takes the subject: the receiver never started. Made here as
                # the receiver makes it (left as it is if it exists meanwhile).
                if not make_stream:
                    raise ConnectionLost(f"{peer_text(message.receiver, 60)} has no "
                                         "durable inbox on this bus") from None
                await self._ensure_stream(
                    js, self.stream_config(message.receiver, replicas=replicas),
                    update=False)
                return await js.publish(subject, data, timeout=timeout,
                                        headers={MSG_ID: ident})

        ack = await self._retrying("store a durable message", publish)
        return bool(ack.duplicate)

    # ----------------------------------------------------------------- closing

    async def close(self) -> None:
        """Stop durable delivery (after the batch in hand), close every link of this bus,
        flush and close the NATS connection."""
        self._closing = True
        if self._durable_task is not None:
            self._durable_stop = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._durable_task, 5.0)
            self._durable_task = None
            self._save_durable_seen()
        for link in list(self._links.values()):
            with contextlib.suppress(CBCLError):
                await link.close()
        for connection in list(self._sessions.values()):
            await connection.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, CBCLError):
                await task
        with contextlib.suppress(nats.errors.Error, OSError, TimeoutError):
            if self.client.is_connected:
                await self.client.flush(timeout=2)
        with contextlib.suppress(nats.errors.Error, OSError):
            await self.client.close()


async def connect_bus(agent: Agent, servers: str | Iterable[str], **options: Any) -> NatsBus:
    """:meth:`NatsBus.connect`."""
    return await NatsBus.connect(agent, servers, **options)


__all__ = ["DEFAULT_PREFIX", "Bid", "ConnectionLimits", "ConversationClosed", "NatsBus",
           "NatsConnection", "NatsLimits", "connect_bus", "subject_token", "token_text"]

