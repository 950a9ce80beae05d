"""A sans-io negotiation session (spec/negotiation.md): h11's shape, for CBCL.

Theory of operation
-------------------
A :class:`Session` never touches a socket or a clock. The caller feeds it the bytes it
read (:meth:`Session.receive_data`, ``b""`` for the end of the stream), takes events out
(:meth:`Session.next_event`, or :data:`NEED_DATA`), turns its own events into bytes
(:meth:`Session.send`), and writes whatever the session produced by itself
(:meth:`Session.data_to_send`: the responder's answers, the transcript confirmations, a
NOT-UNDERSTOOD). Time is the ``now`` argument (Unix ms).

Every message on the stream is one length-prefixed frame (:mod:`._framing`). Handshake
messages are cbcl-negotiation/v1 text; once the handshake is ESTABLISHED the agreed
protocol runs in the agreed encoding (canonical text, or binary frames of :mod:`._codec`),
and every message is checked by the protocol's conversation machine, both ways.

Both sides hash the exact framed bytes of every handshake message in order; each side's
``(finished :transcript …)`` is a labelled hash of that transcript, and a side whose
``signing_key`` is set signs its Finished. A middleman who changes any handshake byte —
strips versions or encodings, swaps a digest, replays an old offer — makes the transcripts
differ, and the handshake fails instead of settling on what the middleman chose.

Any failure moves the session to ``ERROR``: a peer's fault raises
:class:`RemoteProtocolError` (with a reason ``code``; a NOT-UNDERSTOOD carrying the code is
then waiting in :meth:`Session.data_to_send`), a caller's fault :class:`LocalProtocolError`.

This module is the session only: the events are in :mod:`._events`, the errors and the
reason-code table in :mod:`._reasons`, the negotiation descriptor and its registry in
:mod:`._bootstrap`, the handshake table in :mod:`._negotiation`. Their names are
re-exported here.
"""

from __future__ import annotations

import hashlib
import secrets
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from ..binary._codec import MAGIC, Decoder, Encoder
from ..binary._framing import PREFIX_BYTES, frame, prefix_error
from ..core._canonical import native as _native_module
from ..core._errors import CBCLError, LimitError, MalformedError, Position, TrustError
from ..core._limits import DEFAULT_LIMITS, Limits
from ..core._values import INT64_MAX, INT64_MIN, URI, Keyword, Symbol, Value
from ..protocol._api import check_outgoing, parse
from ..protocol._conversation import ConversationTracker, Step, machine_table
from ..protocol._message import Intent, Message
from ..protocol._protocol import Protocol
from ..protocol._registry import PreparedDescriptor, Registry
from ..protocol._trust import Identity, read_signed_descriptor_unverified, sign_message
from ._bootstrap import (
    NEGOTIATION,
    negotiation_descriptor,
    negotiation_registry,
    not_understood_frame,
)
from ._events import (
    NEED_DATA,
    NEED_WORK,
    Accepted,
    ConnectionClosed,
    Established,
    Event,
    Finished,
    NotUnderstood,
    Offer,
    ProtocolMessage,
    Query,
    Rejected,
    Supported,
    Unsupported,
    Work,
    _NeedData,
    _NeedWork,
)
from ._negotiation import (
    ENCODINGS,
    INITIATOR,
    INTENTS,
    PROTOCOL_ID,
    RESPONDER,
    HandshakeMachine,
    HandshakeState,
)
from ._reasons import (
    NOT_UNDERSTOOD_CODES,
    LocalProtocolError,
    RemoteProtocolError,
    error_code,
    reject_reason,
)

# --------------------------------------------------------------------------- errors


class _Refused(Exception):
    """Carries a refusal of an outgoing message out of :meth:`Session._send` (which changed
    nothing) past the handler that fails the session."""

    def __init__(self, error: CBCLError) -> None:
        super().__init__(error.message)
        self.error = error


def finished_value(transcript_digest: bytes, sender: str) -> str:
    """What ``sender``'s ``(finished :transcript …)`` must hold: SHA-256 over a label naming
    the sender (so one side's value is never the other's) and the transcript's SHA-256."""
    label = f"{PROTOCOL_ID} finished {sender}\n".encode()
    return "sha256:" + hashlib.sha256(label + transcript_digest).hexdigest()


def _fields(body: tuple[Value, ...]) -> dict[str, Any]:
    return {str(k): v for k, v in zip(body[1::2], body[2::2], strict=True)}


def _check_now(now: object) -> int:
    """``now`` checked before anything changes: an int of Unix ms within int64 (every
    timestamp the session writes is ``now``). Raises ``TypeError``/``ValueError``."""
    if type(now) is not int:
        raise TypeError("now must be Unix time in milliseconds, an int")
    if not INT64_MIN <= now <= INT64_MAX:
        raise ValueError("now is outside the signed 64-bit range")
    return now


# --------------------------------------------------------------------------- refusals


class RefusalBudget:
    """How many refusals each peer address may cost the sessions that share this budget
    (a server's): at most ``max_refusals`` within any ``window_ms`` milliseconds. A
    frame the session refuses is charged to its :attr:`Session.peer_address`; once an
    address has ``max_refusals`` refusals within the last ``window_ms``, a session of it
    that is not ESTABLISHED refuses its next frame at once, before reading it
    (NOT-UNDERSTOOD ``limit``: ``max_refusals``), until the oldest of them is
    ``window_ms`` old. Those refusals are not charged, so a peer that keeps knocking is
    turned away for nothing and let in again once it has been refused no more than
    ``max_refusals`` times in a window. At most ``max_peers`` addresses are remembered
    (the one refused least recently forgotten first), each with at most ``max_refusals``
    times. Sans-io: times are the ``now`` the sessions are given. Raises ``ValueError``
    for a parameter that is not a positive int."""

    def __init__(self, max_refusals: int = 16, window_ms: int = 10_000, *,
                 max_peers: int = 4096) -> None:
        for name, value in (("max_refusals", max_refusals), ("window_ms", window_ms),
                            ("max_peers", max_peers)):
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a positive int")
        self.max_refusals = max_refusals
        self.window_ms = window_ms
        self.max_peers = max_peers
        self._times: OrderedDict[str, deque[int]] = OrderedDict()

    def _recent(self, peer: str, now: int) -> deque[int] | None:
        times = self._times.get(peer)
        if times is not None:
            while times and times[0] <= now - self.window_ms:
                times.popleft()
        return times

    def refusals(self, peer: str, *, now: int) -> int:
        """The refusals charged to ``peer`` within the window ending at ``now``."""
        times = self._recent(peer, now)
        return 0 if times is None else len(times)

    def charge(self, peer: str, *, now: int) -> None:
        """Count one refusal of ``peer`` at ``now``."""
        times = self._recent(peer, now)
        if times is None:
            times = self._times[peer] = deque(maxlen=self.max_refusals)
            while len(self._times) > self.max_peers:
                self._times.popitem(last=False)
        else:
            self._times.move_to_end(peer)
        times.append(now)

    def refusal(self, peer: str, *, now: int) -> LimitError | None:
        """The :class:`LimitError` a session of ``peer`` answers its next frame with at
        ``now``, or ``None`` while ``peer`` is within the budget."""
        if self.refusals(peer, now=now) < self.max_refusals:
            return None
        return LimitError(f"{self.max_refusals} messages from this address were refused "
                          f"within {self.window_ms / 1000:g} s (max_refusals)",
                          limit="max_refusals", maximum=self.max_refusals)


# --------------------------------------------------------------------------- the session


class Session:
    """One negotiation, then one agreed protocol, between two agents over one stream.

    ``role``: ``"initiator"`` (asks and offers) or ``"responder"`` (answers, verifies and
    loads offers into ``registry``, whose trust store decides). ``me``: this agent's URI
    (a responder without one takes the receiver of the first message); ``peer``: the other
    agent's (the initiator must give it; the responder learns it). ``encodings``: those this
    side speaks, in preference order. ``signing_key``: ``(key id, Ed25519 private key)`` to
    sign this side's Finished; ``require_signed_finished``: refuse a peer's Finished that is
    not signed by a key of ``registry.trust``. A signed Finished is verified whenever the
    registry has a trust store, its key must be one the policy lets speak as the peer's
    name (refused ``untrusted-signer`` otherwise), and :attr:`identity` then says who the
    peer is; every message must come from that name (refused ``malformed``).

    Limits: ``limits`` for every message (text and binary), ``max_frame_bytes`` for one
    frame (default ``limits.max_message_bytes``), ``max_pending_frames`` complete frames
    buffered and not yet taken. Replay: a message id seen among the last ``replay_window``
    ids is refused, and so is a message without a timestamp or one more than
    ``max_skew_ms`` from ``now``. ``nonce``: this side's fresh value (default: 16 random
    bytes, hex). ``max_conversations``: open conversations at once (finished ones are
    dropped; one more is refused with ``limit``). A frame is at most ``max_frame_bytes``
    once the handshake is done, and at most ``2 * limits.max_string_bytes + 4096`` bytes
    (the largest offer) before, so an unauthenticated peer cannot make the session buffer
    more.

    Outgoing messages are checked as the peer will check them (:func:`cbcl.validate`: the
    limits, the intent, the grammar, the schema) before anything changes, and a refused
    one raises that error and is not sent; ``validate_outgoing=False`` skips the check
    for a trusted hot path (the conversation machine still applies).

    Refusals: ``refusal_budget``, a :class:`RefusalBudget` shared by a server's sessions,
    counts each frame a session refuses against its :attr:`peer_address` (set by the
    transport: an IP; ``None``, the default, leaves the session out of the budget), and
    a session of an address over it refuses its next frame before reading it while it
    is not ESTABLISHED (NOT-UNDERSTOOD ``limit``). A refusal ends a session, so one
    connection costs at most one; the budget bounds what one address costs across them.

    Slow work — verifying and compiling an offered descriptor, recording it once the
    handshake is confirmed — is done inside :meth:`next_event` by default. With
    ``defer_work=True`` :meth:`next_event` returns :data:`NEED_WORK` instead: run
    :attr:`pending_work` (in a worker, say) and hand the outcome to :meth:`complete_work`.
    """

    def __init__(self, role: str, *, registry: Registry, me: URI | str | None = None,
                 peer: URI | str | None = None, encodings: Iterable[str] = ("binary", "text"),
                 signing_key: tuple[str, Any] | None = None,
                 require_signed_finished: bool = False, limits: Limits | None = None,
                 max_frame_bytes: int | None = None, max_pending_frames: int = 16,
                 replay_window: int = 1024, max_skew_ms: int = 30_000,
                 nonce: str | None = None, max_conversations: int = 1024,
                 defer_work: bool = False, validate_outgoing: bool = True,
                 refusal_budget: RefusalBudget | None = None) -> None:
        if role not in (INITIATOR, RESPONDER):
            raise ValueError(f"role must be {INITIATOR!r} or {RESPONDER!r}, not {role!r}")
        if not isinstance(registry, Registry):
            raise TypeError("registry must be a cbcl.Registry")
        self.limits = DEFAULT_LIMITS if limits is None else limits
        if not isinstance(self.limits, Limits):
            raise TypeError("limits must be a cbcl.Limits")
        self.encodings = tuple(encodings)
        if not self.encodings or any(e not in ENCODINGS for e in self.encodings) \
                or len(set(self.encodings)) != len(self.encodings):
            raise ValueError(f"encodings must be distinct, from {ENCODINGS}")
        for name, value in (("max_pending_frames", max_pending_frames),
                            ("replay_window", replay_window), ("max_skew_ms", max_skew_ms),
                            ("max_conversations", max_conversations)):
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a positive int")
        if require_signed_finished and registry.trust is None:
            raise ValueError("require_signed_finished needs a registry with a trust store")
        if role == INITIATOR and peer is None:
            raise ValueError("an initiator must name its peer")
        self.role = role
        self.peer_role = RESPONDER if role == INITIATOR else INITIATOR
        self.registry = registry
        self.me = URI(str(me)) if me is not None else None
        self.peer = URI(str(peer)) if peer is not None else None
        self.signing_key = signing_key
        self.require_signed_finished = require_signed_finished
        self.max_pending_frames = max_pending_frames
        self.replay_window = replay_window
        self.max_skew_ms = max_skew_ms
        self.max_conversations = max_conversations
        self.defer_work = bool(defer_work)
        self.validate_outgoing = bool(validate_outgoing)
        if refusal_budget is not None and not isinstance(refusal_budget, RefusalBudget):
            raise TypeError("refusal_budget must be a RefusalBudget")
        self.refusal_budget = refusal_budget
        #: The peer's address, which :attr:`refusal_budget` charges (set by the transport).
        self.peer_address: str | None = None
        self.nonce = secrets.token_hex(16) if nonce is None else nonce
        self._machine = HandshakeMachine()
        self._max_frame_bytes = max_frame_bytes or self.limits.max_message_bytes
        self._handshake_frame_bytes = min(self._max_frame_bytes,
                                          2 * self.limits.max_string_bytes + 4096)
        # Received bytes not handled yet. Frames are taken from the front one at a time,
        # each judged by the limit of the state the frames before it left, so how the
        # stream is cut never changes the outcome (sans-io, like h11's receive buffer).
        self._inbox = bytearray()
        self._inbox_at = 0  # stream offset of the inbox's first byte
        self._complete = 0  # complete frames at the front of the inbox
        self._tail = 0  # bytes after them: the start of a frame not complete yet
        self._events: deque[Event] = deque()
        self._outbox = bytearray()
        self._pending: CBCLError | None = None
        self._eof = False
        self._transcript = hashlib.sha256()
        self._seen: deque[str] = deque()
        self._seen_set: set[str] = set()
        self._sent = 0
        self._cid = f"negotiation-{self.nonce}" if role == INITIATOR else None
        self._query: Query | None = None
        self._offer_digest: str | None = None
        self._last_id: str | None = None
        self.protocol: Protocol | None = None
        self.encoding: str | None = None
        self._tracker: ConversationTracker | None = None
        #: cbcl._native.SessionState once a binary session is ESTABLISHED (where the
        #: extension is built): the state of the per-message checks, the replay window and
        #: the conversations live there, and _seen, _seen_set and _tracker are stale
        #: until _pull_native copies them out (see _start_native).
        self._native: Any = None
        #: Whether the encoder self._native sends with validates (validate_outgoing when
        #: it was made): a send whose validation differs takes the reference path.
        self._native_validates = False
        self._now = 0
        self._encoder: Encoder | None = None
        self._decoder: Decoder | None = None
        #: Bytes (length prefix included) of the frame behind the last received event.
        self.last_frame_bytes = 0
        #: What the last message sent did to its conversation (``None``: no conversation).
        self.last_sent_step: Step | None = None
        self._work: Work | None = None
        self._prepared: PreparedDescriptor | None = None  # the offer accepted, not recorded
        self._held_finished: bytes | None = None  # the peer's Finished, until recorded
        #: Who the peer proved to be: set when its Finished, signed by a key of the
        #: registry's trust store that may speak as the peer's name, verified (spec/trust.md
        #: §4.1); ``None`` before, and for a Finished that was not signed (nor required).
        #: Every message of the session comes from that name (:attr:`peer`).
        self.identity: Identity | None = None

    # ----------------------------------------------------------------- properties

    @property
    def state(self) -> HandshakeState:
        return self._machine.state

    @property
    def tracker(self) -> ConversationTracker | None:
        """The agreed protocol's conversations (``None`` before the agreement, or for a
        protocol without a conversation section). Where the session keeps them natively
        this is brought up to date when read: read it again after more messages."""
        if self._native is not None:
            self._pull_native()
        return self._tracker

    @property
    def buffered(self) -> int:
        """Bytes received of a frame that is not complete yet (0 between frames)."""
        return self._tail

    @property
    def frames_waiting(self) -> int:
        """Complete frames received and not handled yet."""
        return self._complete

    @property
    def needs_data(self) -> bool:
        """Whether :meth:`next_event` would answer :data:`NEED_DATA` now, known without
        asking it: nothing buffered (not even part of a frame, whose prefix next_event
        judges), no queued event, work, error or end of the stream (a transport's check
        before it reads, on the path of every message). ``False`` means: ask next_event."""
        return not (self._inbox or self._events or self._work is not None
                    or self._pending is not None or self._eof) \
            and self._machine.state is not HandshakeState.ERROR

    def refuse(self, code: str) -> bytes:
        """End the session from this side for a reason of the edge's (``"timeout"``,
        ``"busy"``, ``"limit"``): the session moves to ERROR; returns the NOT-UNDERSTOOD
        frame carrying ``code`` to write before closing (``b""`` if the session already
        failed, when one was sent or is waiting in :meth:`data_to_send`)."""
        if code not in NOT_UNDERSTOOD_CODES:
            raise ValueError(f"not a NOT-UNDERSTOOD code: {code!r}")
        if self.state is HandshakeState.ERROR:
            return b""
        self._machine.fail()
        return self._not_understood(code)

    @property
    def pending_work(self) -> Work | None:
        """The work the session waits for (see :data:`NEED_WORK`), or ``None``."""
        return self._work

    @property
    def transcript_digest(self) -> bytes:
        """SHA-256 of the handshake messages so far (framed bytes, in order)."""
        return self._transcript.digest()

    # ----------------------------------------------------------------- input

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Feed bytes read from the stream; ``b""`` means the stream ended. Never raises for
        the peer's bytes: problems surface from :meth:`next_event`."""
        if self._eof and data:
            raise LocalProtocolError("data received after the end of the stream")
        if not data:
            self._eof = True
            return
        if self._pending is not None or self.state is HandshakeState.ERROR:
            return
        self._inbox += data
        self._count_frames()
        if self._complete > self.max_pending_frames:
            self._pending = LimitError(f"more than {self.max_pending_frames} frames are "
                                       "waiting", limit="max_pending_frames",
                                       maximum=self.max_pending_frames)
        elif not self._complete:
            self._pending = self._head_error()  # a prefix over the limit: refused at once
        elif self._tail > self._max_frame_bytes + PREFIX_BYTES:
            # Behind unhandled frames a prefix waits to be judged; whatever the state then,
            # a frame this long is refused, so its bytes beyond the largest frame need not
            # be kept meanwhile (its prefix is, to be judged).
            del self._inbox[len(self._inbox) - self._tail + self._max_frame_bytes
                            + PREFIX_BYTES:]
            self._tail = self._max_frame_bytes + PREFIX_BYTES

    def _frame_limit(self) -> int:
        return self._max_frame_bytes if self.state is HandshakeState.ESTABLISHED \
            else self._handshake_frame_bytes

    def _count_frames(self) -> None:
        """Count the complete frames at the front of the inbox (every prefix counts here;
        each is judged when it reaches the front)."""
        inbox, at, complete = self._inbox, 0, 0
        end = len(inbox)
        while end - at >= PREFIX_BYTES:
            size = int.from_bytes(inbox[at:at + PREFIX_BYTES], "big")
            if size == 0 or end - at - PREFIX_BYTES < size:
                break
            at += PREFIX_BYTES + size
            complete += 1
        self._complete, self._tail = complete, end - at

    def _head_error(self) -> CBCLError | None:
        if len(self._inbox) < PREFIX_BYTES:
            return None
        size = int.from_bytes(self._inbox[:PREFIX_BYTES], "big")
        return prefix_error(size, self._frame_limit(), self._inbox_at)

    def _take_frame(self) -> bytes | None:
        """The frame at the front of the inbox, checked against the current limit, or
        ``None`` if it is not complete. Raises the prefix's :class:`CBCLError`."""
        error = self._head_error()
        if error is not None:
            raise error
        if not self._complete:
            return None
        size = int.from_bytes(self._inbox[:PREFIX_BYTES], "big")
        data = bytes(self._inbox[PREFIX_BYTES:PREFIX_BYTES + size])
        del self._inbox[:PREFIX_BYTES + size]
        self._inbox_at += PREFIX_BYTES + size
        self._complete -= 1
        return data

    def next_event(self, *, now: int) -> Event | _NeedData | _NeedWork:
        """The next event, :data:`NEED_DATA`, or (with ``defer_work``) :data:`NEED_WORK`.
        Raises :class:`RemoteProtocolError` when the peer broke the protocol (the session is
        then in ERROR and a NOT-UNDERSTOOD may wait in :meth:`data_to_send`)."""
        self._now = _check_now(now)
        if self._complete and self._native is not None and not self._events \
                and self._work is None and self._pending is None \
                and self._machine.state is HandshakeState.ESTABLISHED:
            # The common case, an established native session with a whole frame waiting:
            # what the path below does for it, without the checks that cannot apply (the
            # refusal budget is for sessions not yet established).
            inbox = self._inbox
            size = int.from_bytes(inbox[:PREFIX_BYTES], "big")
            if 0 < size <= self._max_frame_bytes:
                end = PREFIX_BYTES + size
                frame_bytes = bytes(inbox[PREFIX_BYTES:end])
                del inbox[:end]
                self._inbox_at += end
                self._complete -= 1
                self.last_frame_bytes = end
                try:
                    return self._handle(frame_bytes, now)
                except CBCLError as exc:
                    budget, address = self.refusal_budget, self.peer_address
                    if budget is not None and address is not None:
                        budget.charge(address, now=now)
                    self._fail(exc)
        if self.state is HandshakeState.ERROR:
            raise LocalProtocolError("the session is in state ERROR")
        if self._events:
            return self._events.popleft()
        if self._work is not None:
            if self.defer_work:
                return NEED_WORK
            work = self._work
            try:
                outcome = work.run()
            except CBCLError as exc:
                outcome = exc
            self.complete_work(outcome)
            if self._events:
                return self._events.popleft()
        if self._pending is not None:
            error, self._pending = self._pending, None
            self._fail(error)
        try:
            data = self._take_frame()
        except CBCLError as exc:
            self._fail(exc)
        if data is not None:
            self.last_frame_bytes = len(data) + PREFIX_BYTES
            budget, address = self.refusal_budget, self.peer_address
            if budget is not None and address is not None and \
                    self.state is not HandshakeState.ESTABLISHED:
                over = budget.refusal(address, now=now)
                if over is not None:  # not read, not charged
                    self._fail(over)
            try:
                event = self._handle(data, now)
            except CBCLError as exc:  # (RemoteProtocolError among them)
                if budget is not None and address is not None:
                    budget.charge(address, now=now)
                self._fail(exc)
            return event  # (before any event _handle queued after it, e.g. Established)
        if self._eof:
            if self._inbox:
                self._fail(MalformedError(f"the stream ends inside a frame "
                                          f"({len(self._inbox)} bytes buffered)",
                                          position=Position(0, 0, self._inbox_at)),
                           reply=False)
            before = self.state
            tracker = self.tracker
            open_threads = [] if tracker is None else [
                c for c in tracker.conversations() if not c.finished]
            if open_threads:  # the stream ended in the middle of a conversation
                self._machine.fail()
            if open_threads or self._machine.close() is HandshakeState.ERROR:
                raise RemoteProtocolError(f"the peer closed the connection in state "
                                          f"{before.value}{self._where()}", code="closed",
                                          exit_code=1)
            return ConnectionClosed()
        return NEED_DATA

    def data_to_send(self) -> bytes:
        """The bytes the session produced by itself since the last call (answers,
        confirmations, a NOT-UNDERSTOOD); write them to the stream."""
        out = bytes(self._outbox)
        self._outbox.clear()
        return out

    def _where(self) -> str:
        tracker = self.tracker
        if tracker is None:
            return ""
        threads = tracker.conversations()
        if not threads:
            return f" of {self.protocol.id if self.protocol else '?'}, no conversation open"
        thread = threads[-1]
        return (f' of {thread.protocol} conversation "{thread.conversation_id}" '
                f"(in state {thread.state})")

    def _fail(self, error: CBCLError, *, reply: bool = True) -> Any:
        self._machine.fail()
        code = error_code(error)
        if reply:
            self._outbox += self._not_understood(code)
        if isinstance(error, RemoteProtocolError):
            raise error
        text = error.one_line()  # a TrustError's carries its reason
        raise RemoteProtocolError(text, code=code, exit_code=error.exit_code) from error

    def _not_understood(self, code: str) -> bytes:
        return not_understood_frame(code, now=self._now, message_id=self._next_id(),
                                    me=self.me, peer=self.peer, conversation_id=self._cid,
                                    in_reply_to=self._last_id)

    # ----------------------------------------------------------------- receiving

    def _next_id(self) -> str:
        self._sent += 1
        return f"{self.role[0]}-{self.nonce[:12]}-{self._sent}"

    def _check_fresh(self, message: Message, now: int) -> None:
        if message.timestamp is None:
            raise RemoteProtocolError(f'message "{message.message_id}" has no timestamp',
                                      code="stale")
        if abs(message.timestamp - now) > self.max_skew_ms:
            raise RemoteProtocolError(
                f'message "{message.message_id}" is stale: its timestamp '
                f"{message.timestamp} is more than {self.max_skew_ms} ms from now ({now})",
                code="stale")
        if message.message_id in self._seen_set:
            raise RemoteProtocolError(f'message "{message.message_id}" is a replay: its id '
                                      "was seen before", code="replay")
        self._seen.append(message.message_id)
        self._seen_set.add(message.message_id)
        while len(self._seen) > self.replay_window:
            self._seen_set.discard(self._seen.popleft())

    def _check_parties(self, message: Message) -> None:
        if self.peer is None:  # a responder's first message binds the parties
            self.peer = message.sender
        if self.me is None:
            self.me = message.receiver
        sender, receiver, peer, me = message.sender, message.receiver, self.peer, self.me
        # (identity first: the parties of a session are mostly the very same objects)
        if (sender is not peer and sender != peer) or (receiver is not me and receiver != me):
            raise RemoteProtocolError(
                f'message "{message.message_id}" is from {message.sender} to '
                f"{message.receiver}; this session is between {self.peer} and {self.me}",
                code="malformed")

    def _handle(self, data: bytes, now: int) -> Event:
        native = self._native
        if native is None:
            return self._handle_reference(data, now)
        if data[:2] == MAGIC:
            got = native.receive(data, now)
            if type(got) is tuple:  # (ESTABLISHED: the machine stays there)
                message, step = got
                self._last_id = message.message_id
                return ProtocolMessage(message, step)
        self._pull_native()
        event = self._handle_reference(data, now)
        if self._native is not None and self.state is HandshakeState.ESTABLISHED:
            self._push_native()
        return event

    def _handle_reference(self, data: bytes, now: int) -> Event:
        if data[:2] == MAGIC:
            if self.state is not HandshakeState.ESTABLISHED or self.encoding != "binary":
                raise RemoteProtocolError("a binary frame before binary was agreed",
                                          code="malformed")
            if self._decoder is None:  # pragma: no cover - set when binary was agreed
                raise LocalProtocolError("binary was agreed without a decoder")
            message = self._decoder.decode(data)
            return self._receive_message(message, now)
        envelope = parse(data, limits=self.limits, envelope_only=True)
        if envelope.protocol == NEGOTIATION:
            message = parse(data, limits=self.limits, registry=negotiation_registry())
            return self._receive_handshake(message, data, now)
        if self.state is not HandshakeState.ESTABLISHED or self.protocol is None:
            raise RemoteProtocolError(f"a {envelope.protocol} message before the handshake "
                                      "established it", code="unknown-protocol")
        if envelope.protocol != self.protocol.id:
            raise RemoteProtocolError(f"a {envelope.protocol} message in a session of "
                                      f"{self.protocol.id}", code="unknown-protocol")
        if self.encoding != "text":
            raise RemoteProtocolError("a text message where binary was agreed",
                                      code="malformed")
        message = parse(data, limits=self.limits, registry=self.registry)
        return self._receive_message(message, now)

    def _answers_a_message(self, message: Message) -> bool:
        """Whether ``message`` (a NOT-UNDERSTOOD) answers one message of the agreed
        protocol — it names it (``in-reply-to``) and speaks that protocol, once ESTABLISHED
        — and so belongs to that message's conversation and ends nothing (spec/negotiation.md
        §6.3)."""
        return message.in_reply_to is not None and self.protocol is not None \
            and self.state is HandshakeState.ESTABLISHED \
            and message.protocol == self.protocol.id

    def _admit(self, message: Message, now: int) -> NotUnderstood | None:
        """The checks every received message passes (parties, freshness); a peer's
        NOT-UNDERSTOOD ends the session and is returned as the event. It is taken without
        those checks: a server refusing a connection before reading a frame cannot know
        who we are (it writes ``agent://anonymous``), and a forged one can only end the
        session, which whoever can write to the stream can do anyway. A NOT-UNDERSTOOD
        that answers a message of the agreed protocol is a message like any other."""
        if message.intent is Intent.NOT_UNDERSTOOD and not self._answers_a_message(message):
            self._machine.fail()
            return NotUnderstood(message.body if type(message.body) is str else "")
        self._check_parties(message)
        self._check_fresh(message, now)
        self._last_id = message.message_id
        return None

    def _receive_message(self, message: Message, now: int) -> Event:
        refusal = self._admit(message, now)
        if refusal is not None:
            return refusal
        self._machine.advance(self.peer_role, "message")
        tracker = self._tracker
        step = tracker.receive(message, now=now) if tracker is not None else None
        return ProtocolMessage(message, step)

    def _receive_handshake(self, message: Message, data: bytes, now: int) -> Event:
        refusal = self._admit(message, now)
        if refusal is not None:
            return refusal
        body = message.body
        if type(body) is not tuple or not body or type(body[0]) is not Symbol \
                or str(body[0]) not in INTENTS:
            # Pass 2 admits CANCEL (and NOT-UNDERSTOOD, handled above) with no body or a
            # reason string in any protocol; the negotiation has no place for one.
            raise RemoteProtocolError(f"a {message.intent.value} message has no place in "
                                      "the negotiation", code="protocol")
        kind = str(body[0])
        if INTENTS[kind] != message.intent.value:
            raise RemoteProtocolError(f"({kind} …) is sent as {INTENTS[kind]}, not "
                                      f"{message.intent.value}", code="malformed")
        if self._cid is None and kind == "supports":
            self._cid = message.conversation_id
        if message.conversation_id != self._cid:
            raise RemoteProtocolError(f"conversation-id {message.conversation_id!r} is not "
                                      "this negotiation's", code="malformed")
        if not self._machine.can(self.peer_role, kind):
            self._machine.advance(self.peer_role, kind)  # raises ProtocolError
        values = _fields(body)
        if kind == "finished":
            return self._receive_finished(message, values["transcript"], data)
        self._transcript.update(frame(data))
        self._machine.advance(self.peer_role, kind)
        handler: Callable[[dict[str, Any], int], Event] = getattr(self, f"_on_{kind}")
        return handler(values, now)

    # responder side

    def _on_supports(self, values: dict[str, Any], now: int) -> Event:
        query = Query(str(values["protocol"]), values["digest"], tuple(values["versions"]),
                      tuple(str(e) for e in values["encodings"]))
        self._query = query
        common = [e for e in query.encodings if e in self.encodings]
        if not common:
            raise RemoteProtocolError("no common encoding: the peer speaks "
                                      f"{' '.join(query.encodings)}, this side "
                                      f"{' '.join(self.encodings)}", code="no-common-encoding")
        protocol = self.registry.get(query.protocol)
        if protocol is not None and protocol.digest == query.digest \
                and (not query.versions or protocol.descriptor.version in query.versions):
            self._agree(protocol, common[0])
            self._outbox += self._emit("supported", now, (
                "protocol", protocol.id), ("digest", protocol.digest),
                ("version", protocol.descriptor.version), ("encoding", Symbol(common[0])),
                ("nonce", self.nonce))
        else:
            known = () if protocol is None else (protocol.descriptor.version,)
            self._outbox += self._emit("unsupported", now, ("protocol", Symbol(query.protocol)),
                                       ("known", known), ("nonce", self.nonce))
        return query

    def _on_offer(self, values: dict[str, Any], now: int) -> Event:
        query = self._query
        if query is None:  # pragma: no cover - the table allows an offer only after a query
            raise RemoteProtocolError("an offer before any question", code="protocol")
        document = values["descriptor"].encode("utf-8")
        offer = Offer(document, values["digest"])
        if values["digest"] != query.digest:
            self._reject("digest-mismatch", f"the offer's digest {values['digest']} is not "
                         f"the one asked about, {query.digest}", now)
            return offer
        registry = self.registry
        self._work = Work("offer", lambda: registry.prepare(document, now=now))
        return offer

    def complete_work(self, outcome: Any) -> None:
        """Hand over the outcome of :attr:`pending_work`: what its ``run()`` returned, or
        the :class:`CBCLError` it raised. Then take events with :meth:`next_event`. Raises
        :class:`LocalProtocolError` when no work is pending or the outcome is of the wrong
        kind."""
        work = self._work
        if work is None:
            raise LocalProtocolError("no work is pending")
        if not isinstance(outcome, (CBCLError, PreparedDescriptor)) \
                and not (work.kind == "record" and outcome is None):
            raise LocalProtocolError(f"the outcome of {work.kind} work is a "
                                     f"PreparedDescriptor, None or a CBCLError, not "
                                     f"{type(outcome).__name__}")
        self._work = None
        if self.state is HandshakeState.ERROR:
            return
        try:
            if work.kind == "offer":
                if outcome is None:
                    raise LocalProtocolError("the outcome of offer work cannot be None")
                self._offer_verdict(outcome)
            else:
                self._recorded(outcome if isinstance(outcome, CBCLError) else None)
        except CBCLError as exc:
            self._pending = exc  # raised by the next next_event, like a peer's fault

    def _reject(self, code: str, detail: str, now: int) -> None:
        self._outbox += self._emit("rejected", now, ("reason", Symbol(code)))
        self._events.append(Rejected(code, detail))

    def _offer_verdict(self, outcome: PreparedDescriptor | CBCLError) -> None:
        query = self._query
        if query is None:  # pragma: no cover - work exists only after a query
            raise LocalProtocolError("an offer verdict without a question")
        now = self._now
        if isinstance(outcome, CBCLError):
            detail = outcome.one_line()
            self._reject(reject_reason(outcome), detail, now)
            return
        descriptor = outcome.descriptor
        if (str(descriptor.id), descriptor.digest) != (query.protocol, query.digest) \
                or (query.versions and descriptor.version not in query.versions):
            self._reject("digest-mismatch", f"the offered descriptor is {descriptor.id} "
                         f"version {descriptor.version} {descriptor.digest}, not what was "
                         "asked", now)
            return
        try:
            protocol = self.registry.install(outcome)
        except CBCLError as exc:
            self._reject(reject_reason(exc), exc.one_line(), now)
            return
        self._prepared = outcome
        encoding = next(e for e in query.encodings if e in self.encodings)
        self._agree(protocol, encoding)
        self._outbox += self._emit("accepted", now, ("protocol", protocol.id),
                                   ("digest", protocol.digest),
                                   ("version", protocol.descriptor.version),
                                   ("encoding", Symbol(encoding)))
        self._events.append(Accepted(str(protocol.id), protocol.digest,
                                     protocol.descriptor.version, encoding, outcome.signers))

    # initiator side

    def _check_answer(self, protocol: str, digest: str, version: int, encoding: str) -> Protocol:
        query = self._query
        if query is None:  # pragma: no cover - the table allows an answer only after a query
            raise RemoteProtocolError("an answer before any question", code="protocol")
        if (protocol, digest) != (query.protocol, query.digest) \
                or (query.versions and version not in query.versions) \
                or encoding not in query.encodings:
            raise RemoteProtocolError(
                f"the answer names {protocol} version {version} {digest} in {encoding}; "
                f"the question was {query.protocol} {query.digest} versions "
                f"{list(query.versions)} in {' '.join(query.encodings)}",
                code="digest-mismatch")
        loaded = self.registry.get(protocol)
        if loaded is None or loaded.digest != digest:
            raise LocalProtocolError(f"{protocol} {digest} is no longer in this session's "
                                     "registry")
        return loaded

    def _on_supported(self, values: dict[str, Any], now: int) -> Event:
        return self._on_agreement(Supported, values, now)

    def _on_unsupported(self, values: dict[str, Any], now: int) -> Event:
        return Unsupported(str(values["protocol"]), tuple(values["known"]))

    def _on_accepted(self, values: dict[str, Any], now: int) -> Event:
        return self._on_agreement(Accepted, values, now)

    def _on_agreement(self, kind: type[Supported] | type[Accepted], values: dict[str, Any],
                      now: int) -> Event:
        """B agreed (it already spoke the protocol, or accepted the offer): check the
        answer against the question, then send the initiator's Finished."""
        event = kind(str(values["protocol"]), values["digest"], values["version"],
                     str(values["encoding"]))
        protocol = self._check_answer(event.protocol, event.digest, event.version,
                                      event.encoding)
        self._agree(protocol, event.encoding)
        self._outbox += self._emit("finished", now, ("transcript", finished_value(
            self.transcript_digest, INITIATOR)))
        return event

    def _on_rejected(self, values: dict[str, Any], now: int) -> Event:
        return Rejected(str(values["reason"]))

    # both

    def _receive_finished(self, message: Message, value: str, data: bytes) -> Event:
        expected = finished_value(self.transcript_digest, self.peer_role)
        if value != expected:
            raise RemoteProtocolError("the transcript hashes differ: a handshake message was "
                                      "changed in transit", code="transcript-mismatch",
                                      exit_code=6)
        trust = self.registry.trust
        identity = None
        if message.signature is not None and trust is not None:
            # The signature, and the key bound to the name the peer claimed (its sender,
            # the same in every message of the session): spec/trust.md §4.1.
            identity = trust.verify_identity(message)
        elif self.require_signed_finished:
            raise TrustError("message verification failed",
                             reason="the peer's (finished …) is not signed", cause="unsigned")
        self._transcript.update(frame(data))
        self._machine.advance(self.peer_role, "finished")
        self.identity = identity
        prepared = self._prepared
        if self.role == RESPONDER and prepared is not None:
            # The offer is recorded only now, with both sides' transcripts confirmed.
            registry = self.registry
            self._work = Work("record", lambda: registry.record(prepared))
        else:
            self._finish_handshake()
        return Finished(value)

    def _recorded(self, outcome: CBCLError | None) -> None:
        self._prepared = None
        if isinstance(outcome, CBCLError):
            detail = outcome.one_line()
            raise RemoteProtocolError(f"the offer could not be recorded: {detail}",
                                      code=reject_reason(outcome), exit_code=6)
        self._finish_handshake()

    def _finish_handshake(self) -> None:
        if self.role == RESPONDER:
            self._outbox += self._emit("finished", self._now, (
                "transcript", finished_value(self.transcript_digest, RESPONDER)))
        self._events.append(self._established())
        self._start_native()

    # ----------------------------------------------------------------- native state

    #: Whether an established binary session keeps its per-message state natively where
    #: the extension is built (the differential tests turn it off on one of two twins).
    _use_native = True

    def _start_native(self) -> None:
        """Hand the per-message state to cbcl._native.SessionState, where it can hold it:
        a binary session of two distinct parties whose protocol's rules keep no state
        across messages. From then on :meth:`_handle` and :meth:`_send_message` make one
        native call per message; whatever it declines (any refusal, a NOT-UNDERSTOOD, a
        frame the decoder refuses) goes through the Python reference with the state
        copied out (:meth:`_pull_native`), and back in when the reference accepts it."""
        kind = getattr(_native_module, "SessionState", None)
        tracker, protocol = self._tracker, self.protocol
        if kind is None or not self._use_native or self.encoding != "binary" \
                or protocol is None or self.me is None or self.peer is None \
                or self.me == self.peer or self._encoder is None or self._decoder is None \
                or self.state is not HandshakeState.ESTABLISHED \
                or (tracker is not None and tracker._constraints):
            return
        intents = tuple(Intent)
        machine = None if tracker is None else tracker._machines.get(protocol.id)
        if tracker is not None and machine is None:  # pragma: no cover - made for it
            return
        # (the encoder its send calls: one that validates where this session does, with
        # its limits; the reference path validates with check_outgoing instead)
        self._native_validates = self.validate_outgoing
        encoder = Encoder(self.registry, validate=True, limits=self.limits) \
            if self.validate_outgoing else self._encoder
        self._native = kind(
            decode=self._decoder.decode, encode=encoder.encode, message_type=Message,
            me=self.me, peer=self.peer, protocol=protocol.id, max_skew_ms=self.max_skew_ms,
            replay_window=self.replay_window,
            table=None if machine is None else machine_table(machine, intents),
            intents=intents, states=() if machine is None else machine.states,
            roles=() if machine is None else machine.roles,
            final=() if machine is None else tuple(machine.is_final(s)
                                                   for s in machine.states),
            initial=0, step_type=Step, max_open=self.max_conversations)
        self._push_native()

    def _pull_native(self) -> None:
        """Copy the native state out into the reference's replay window and tracker."""
        native = self._native
        self._seen = deque(native.window())
        self._seen_set = set(self._seen)
        tracker = self._tracker
        if tracker is not None and self.me is not None and self.peer is not None \
                and self.protocol is not None:
            tracker._load_pair(self.me, self.peer, self.protocol.id, native.threads(),
                               native.finished())

    def _push_native(self) -> None:
        """Copy the reference's replay window and tracker into the native state."""
        tracker = self._tracker
        threads, finished = [], []
        if tracker is not None and self.me is not None and self.peer is not None:
            threads = tracker._pair_threads(self.me, self.peer)
            finished = list(tracker._finished)
        self._native.load(list(self._seen), threads, finished)

    def _established(self) -> Established:
        if self.protocol is None or self.encoding is None:  # pragma: no cover - AGREED set it
            raise LocalProtocolError("established without an agreed protocol")
        return Established(str(self.protocol.id), self.protocol.digest,
                           self.protocol.descriptor.version, self.encoding)

    def _agree(self, protocol: Protocol, encoding: str) -> None:
        self.protocol = protocol
        self.encoding = encoding
        if protocol.descriptor.conversation is not None:
            self._tracker = ConversationTracker.from_descriptors(
                [protocol], max_open=self.max_conversations, forget_finished=True)
        self._encoder = Encoder(self.registry, validate=False)  # _send_message validated
        self._decoder = Decoder(self.registry, limits=self.limits)

    # ----------------------------------------------------------------- sending

    def _emit(self, kind: str, now: int, *pairs: tuple[str, Value]) -> bytes:
        """A handshake message from this side: build, sign a Finished, frame, hash,
        advance."""
        if not self._machine.can(self.role, kind):
            self._machine.advance(self.role, kind)  # raises ProtocolError, state ERROR
        body: list[Value] = [Symbol(kind)]
        for name, value in pairs:
            body += [Keyword(name), value]
        if self.me is None or self.peer is None:  # pragma: no cover - bound by the first message
            raise LocalProtocolError("the parties of the session are not known yet")
        message = Message(message_id=self._next_id(), sender=self.me, receiver=self.peer,
                          intent=INTENTS[kind], protocol=NEGOTIATION,
                          conversation_id=self._cid, in_reply_to=self._last_id,
                          timestamp=now, body=tuple(body))
        if kind == "finished" and self.signing_key is not None:
            message = sign_message(message, self.signing_key[1], self.signing_key[0])
        data = frame(message.canonical().encode("utf-8"))
        self._transcript.update(data)
        self._machine.advance(self.role, kind)
        return data

    def send(self, event: Event, *, now: int) -> bytes:
        """The bytes for ``event``: :class:`Query` and :class:`Offer` (initiator),
        :class:`ProtocolMessage` (either side, once ESTABLISHED), :class:`ConnectionClosed`
        (returns ``b""``; then close the stream). Raises :class:`LocalProtocolError` for an
        event that is not allowed now (the session is then in ERROR). A message the protocol
        refuses (see ``validate_outgoing``) or its conversation does not allow raises that
        error (:class:`BodyError`, :class:`SchemaError`, :class:`ConversationError`,
        :class:`LimitError`, …); nothing is sent and the session is unchanged."""
        self._now = _check_now(now)
        if self.state is HandshakeState.ERROR:
            raise LocalProtocolError("the session is in state ERROR")
        try:
            return self._send(event, now)
        except _Refused as refused:
            raise refused.error from None
        except LocalProtocolError:
            self._machine.fail()
            raise
        except CBCLError as exc:
            self._machine.fail()
            raise LocalProtocolError(exc.one_line()) from exc

    def _send(self, event: Event, now: int) -> bytes:
        if isinstance(event, Query):
            if self.role != INITIATOR:
                raise LocalProtocolError("only the initiator asks")
            protocol = self.registry.get(event.protocol)
            if protocol is None or protocol.digest != event.digest:
                raise LocalProtocolError(f"load {event.protocol} {event.digest} into this "
                                         "session's registry before asking for it")
            encodings = [e for e in event.encodings if e in self.encodings]
            if not encodings:
                raise LocalProtocolError("no encoding this side speaks was asked for")
            self._query = replace(event, encodings=tuple(encodings))
            return self._emit("supports", now, ("protocol", protocol.id),
                              ("digest", event.digest), ("versions", tuple(event.versions)),
                              ("encodings", tuple(Symbol(e) for e in encodings)),
                              ("nonce", self.nonce))
        if isinstance(event, Offer):
            if self.role != INITIATOR:
                raise LocalProtocolError("only the initiator offers")
            document = bytes(event.document)
            try:
                text = document.decode("utf-8")
            except UnicodeDecodeError:
                raise LocalProtocolError("the offered document is not UTF-8") from None
            if len(document) > self.limits.max_string_bytes:
                raise LimitError(f"the signed descriptor is {len(document)} bytes; one string "
                                 f"holds at most {self.limits.max_string_bytes}",
                                 limit="max_string_bytes", maximum=self.limits.max_string_bytes)
            payload = read_signed_descriptor_unverified(document, limits=self.limits).payload
            digest = "sha256:" + hashlib.sha256(payload).hexdigest()
            if self._query is not None and digest != self._query.digest:
                raise LocalProtocolError(f"the offered descriptor is {digest}, but the "
                                         f"question was about {self._query.digest}")
            self._offer_digest = digest
            return self._emit("offer", now, ("digest", digest), ("descriptor", text))
        if isinstance(event, ProtocolMessage):
            return self._send_message(event.message, now)
        if isinstance(event, ConnectionClosed):
            self._machine.close()
            return b""
        raise LocalProtocolError(f"{type(event).__name__} is sent by the session itself, "
                                 "not by send()")

    def _send_message(self, message: Message, now: int) -> bytes:
        if self.state is not HandshakeState.ESTABLISHED or self.protocol is None:
            raise LocalProtocolError(f"no protocol is established (state {self.state.value})")
        if message.protocol is not self.protocol.id and message.protocol != self.protocol.id:
            raise LocalProtocolError(f"this session speaks {self.protocol.id}, not "
                                     f"{message.protocol}")
        if (message.sender, message.receiver) != (self.me, self.peer):
            raise LocalProtocolError(f"messages of this session go from {self.me} to "
                                     f"{self.peer}")
        if message.timestamp is None and message.signature is None:
            # Every field was checked when the message was made, and now by _check_now:
            # no need to check them all again (dataclasses.replace would).
            m = message
            message = Message._trusted(m.message_id, m.sender, m.receiver, m.intent,
                                       m.protocol, m.conversation_id, m.in_reply_to,
                                       m.reply_by, now, m.body, None, m.trace)
        validating = self.validate_outgoing and message.intent is not Intent.NOT_UNDERSTOOD
        native = self._native
        # One native call: the conversation stepped, the message checked (where the
        # session validates, by an Encoder(validate=True) whose C entry checks and encodes
        # in one call: cbcl/_native_src/outgoing.c) and framed. An error or a refusal code
        # changes nothing there: the reference below then judges the message and raises
        # its own error, in its own order (the check, then the conversation).
        if native is not None and validating is self._native_validates:
            try:
                got = native.send(message, now)
            except CBCLError:
                got = None
            if type(got) is tuple:  # (ESTABLISHED: the machine stays there)
                data: bytes = got[0]
                self.last_sent_step = got[1]
                return data
        try:  # (changes nothing when it refuses: the session goes on)
            if validating:
                check_outgoing(self.protocol, message, self.limits)
        except CBCLError as exc:
            raise _Refused(exc) from None
        if native is None:
            return self._step_and_encode(message, now)
        self._pull_native()  # declined: the reference judges it, as it would have
        data = self._step_and_encode(message, now)
        self._push_native()
        return data

    def _step_and_encode(self, message: Message, now: int) -> bytes:
        """The reference's step of the conversation, then the frame (the message checked)."""
        try:  # (changes nothing when it refuses: the session goes on)
            step = None
            # A NOT-UNDERSTOOD that answers a message is in its conversation, as the
            # receiver will judge it; any other ends the session and is in none.
            tracker = self._tracker
            if tracker is not None and (message.intent is not Intent.NOT_UNDERSTOOD
                                        or message.in_reply_to is not None):
                step = tracker.receive(message, now=now)
        except CBCLError as exc:
            raise _Refused(exc) from None
        self.last_sent_step = step
        self._machine.advance(self.role, "message")
        if self.encoding == "binary":
            if self._encoder is None:  # pragma: no cover - set when binary was agreed
                raise LocalProtocolError("binary was agreed without an encoder")
            return frame(self._encoder.encode(message))
        return frame(message.canonical().encode("utf-8"))


__all__ = [
    "NEED_DATA", "NEED_WORK", "NEGOTIATION", "NOT_UNDERSTOOD_CODES", "Accepted",
    "ConnectionClosed", "Established", "Event", "Finished", "LocalProtocolError",
    "NotUnderstood", "Offer", "ProtocolMessage", "Query", "RefusalBudget", "Rejected",
    "RemoteProtocolError", "Session", "Supported", "Unsupported", "Work", "finished_value",
    "negotiation_descriptor",
    "negotiation_registry", "not_understood_frame", "reject_reason",
]
