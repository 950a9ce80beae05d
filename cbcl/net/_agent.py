"""An asyncio agent: an identity, a trust store, the protocols it has learned, and handlers.

Theory of operation. An :class:`Agent` owns what outlives one connection: its name and
signing key, its trust store and state directory, a bounded :class:`LearnedLibrary` of the
protocols peers taught it (kept for the life of the process and, with a state directory,
across restarts: each accepted signed descriptor is saved and verified again at the next
start), and the handlers registered per protocol and intent. Every connection — served
(:meth:`Agent.serve`) or opened (:meth:`Agent.connect`) — is one :class:`Link`: a
sans-io :class:`Session` on a :class:`Connection`, whose events one task (the link's
*pump*) takes in order. A message of the agreed protocol either answers a conversation this
side is waiting on (it goes to that :class:`AgentConversation`'s queue) or is handed to the
handler for its protocol and intent, whose reply is sent in the same conversation. Nothing
here parses or judges bytes: the session did both passes, the schema, the replay window and
the conversation machine before an event exists.

Handlers run beside the pump, never in it (:mod:`cbcl.net._handlers`): the messages of one
conversation go to a *lane* of their own, handled one at a time in order; lanes run at once
up to ``handler_concurrency`` per link, and at ``handler_backlog`` messages taken and not
yet handled the pump stops reading. A plain handler runs in the agent's bounded threads, a
coroutine on the loop; each is cut off at ``handler_timeout``. A handler that raises (any
exception: it is contained), overruns, returns something that is not a message or a reply
the protocol refuses is logged and answered in the message's conversation with a
NOT-UNDERSTOOD naming why (spec/negotiation.md §6.3), so the peer's ``send`` raises
:class:`PeerFailed` at once. When the link ends, its handlers are cancelled (coroutines) or
their results dropped (threads); :meth:`Agent.close` first lets them finish for a grace
period, then answers the rest ``shutdown``.

Ends are events, never stray exceptions: when the stream ends, a deadline passes or the
peer is refused, every open conversation is ended with the reason (awaiting a reply then
raises :class:`ConversationClosed`) and :attr:`Link.closed` is set.

Logging: every event is a record of the ``cbcl.net`` logger (INFO; handler failures ERROR
with their traceback), its text one escaped line and its fields in the record's ``cbcl``
attribute (``event``, ``link``, ``peer``, ``conversation``, ``protocol``, ``intent``,
``reason``, ``timings``); ``Agent(log=)`` is also given each line of INFO and above. A
message handled is one INFO line (``sent`` with its answer, ``handled`` without one,
``unhandled`` with no handler, or the failure's); each message received is a DEBUG line
(``received``), built only when DEBUG is enabled.

A handler marked :func:`~cbcl.net.on_loop` (``cbcl serve``'s own responder) is called in
the pump itself when its conversation has no lane busy: no task, no lane, no thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import itertools
import logging
import os
import secrets
import shutil
import sys
import tempfile
import weakref
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ..core._display import escape_invisible, peer_text
from ..core._errors import CBCLError, ConnectionLost, ConversationClosed, NegotiationFailed
from ..core._files import UnsafeFile, read_regular_file, write_atomically
from ..core._limits import DEFAULT_LIMITS, Limits
from ..core._values import URI, Value
from ..protocol._descriptor import ProtocolDescriptor
from ..protocol._message import Intent, Message
from ..protocol._protocol import Protocol
from ..protocol._registry import PreparedDescriptor, Registry, compiled_size
from ..protocol._schema import coerce_body
from ..protocol._trust import Identity, TrustStore, read_signed_descriptor_unverified
from ..session._reasons import MAX_FAILURE_DETAIL, failure_body, failure_exit, read_failure
from ..session._session import (
    Accepted,
    ConnectionClosed,
    Established,
    Event,
    NotUnderstood,
    Offer,
    ProtocolMessage,
    Query,
    RefusalBudget,
    Rejected,
    RemoteProtocolError,
    Session,
    Unsupported,
)
from . import _tracing
from ._handlers import (
    CANCEL_WAIT,
    HandlerLimits,
    HandlerThreads,
    OnLoop,
    Outcome,
    run_handler,
    settle_awaitable,
)
from ._transport import (
    Connection,
    ConnectionLimits,
    LearnedProtocols,
    Server,
    ServerLimits,
    WorkPool,
    connect,
    serve,
)

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from ..protocol._conversation import Step

#: What a handler may return: a reply (sent in the same conversation) or nothing.
Reply = Message | None
Handler = Callable[[Message, "Context"], Reply | Awaitable[Reply]]

#: Exit status for each reject reason (draft §6: 4 limit, 5 protocol, 6 trust).
REJECT_EXIT = {"limit": 4, "grammar-refused": 5, "malformed": 5, "no-common-encoding": 5}

LEARNED_DIR = "learned"

#: The logger of the net layer: every event of an agent, its links and its servers.
logger = logging.getLogger("cbcl.net")
#: A record's caller where records carry none (``logging._srcfile`` None): what logging
#: itself puts there then.
_NO_CALLER = ("(unknown file)", 0, "(unknown function)")


class PeerFailed(ConversationClosed):
    """The peer could not answer our message: it answered with a NOT-UNDERSTOOD in the
    conversation (spec/negotiation.md §6.3) — its handler failed (``handler-failed``),
    overran (``handler-timeout``), gave a reply the protocol refuses (``invalid-reply``),
    or the peer stopped (``shutdown``); any other code is the peer's own. ``reason`` is
    the code, ``detail`` the peer's text after it (escaped, shortened), ``reply`` the
    NOT-UNDERSTOOD itself, ``exit_code`` that of ``cbcl send`` (8; 1 for ``shutdown``).
    The conversation is not ended: the peer may be asked again."""

    kind = "peer-failed"

    def __init__(self, reply: Message) -> None:
        code, detail = read_failure(reply.body)
        # Escaped (the peer's text, shown on one line), not quoted: a detail the peer
        # escaped already reads the same.
        self.detail = escape_invisible(detail, limit=MAX_FAILURE_DETAIL) if detail else ""
        answered = peer_text(reply.in_reply_to, 64)
        super().__init__(f'the peer could not answer "{answered}": {code}'
                         + (f" ({self.detail})" if self.detail else ""), reason=code)
        self.reply = reply
        self.exit_code = failure_exit(code)  # type: ignore[misc]


# --------------------------------------------------------------------------- learned


class LearnedLibrary:
    """The protocols an agent learned from peers: at most ``max_protocols`` ids and
    ``max_bytes`` of compiled tables (the least recently used go first; a returning peer
    then offers again). With ``directory``, each learned signed descriptor is saved there
    (``sha256-HEX.cbcl``, written atomically) and :meth:`restore` loads them again, each
    verified afresh by the registry it is loaded into."""

    def __init__(self, *, max_protocols: int = 64, max_bytes: int = 64 << 20,
                 directory: str | Path | None = None) -> None:
        if type(max_protocols) is not int or max_protocols < 0:
            raise ValueError("max_protocols must be an int >= 0")
        if type(max_bytes) is not int or max_bytes < 0:
            raise ValueError("max_bytes must be an int >= 0")
        self.max_protocols = max_protocols
        self.max_bytes = max_bytes
        self.directory = Path(directory) if directory is not None else None
        self._entries: OrderedDict[str, tuple[Protocol, int]] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size(self) -> int:
        """Bytes of compiled tables held."""
        return self._bytes

    def protocols(self) -> list[Protocol]:
        return [protocol for protocol, _ in self._entries.values()]

    def knows(self, protocol: Protocol | ProtocolDescriptor) -> bool:
        """Whether this library holds ``protocol`` (its id, with this digest)."""
        entry = self._entries.get(str(protocol.id))
        return entry is not None and entry[0].digest == protocol.digest

    def add(self, protocol: Protocol, document: bytes | None = None) -> bool:
        """Keep ``protocol`` (replacing an older version of its id, never a newer one); save
        ``document``, its signed descriptor, when there is a directory. Returns whether it
        is kept (one larger than ``max_bytes``, or older than the one kept, is not)."""
        ident = str(protocol.id)
        size = compiled_size(protocol)
        if size > self.max_bytes or self.max_protocols == 0:
            return False
        kept = self._entries.get(ident)
        if kept is not None and kept[0].descriptor.version > protocol.descriptor.version:
            return False  # sessions may end out of order: the newer version stays
        old = self._entries.pop(ident, None)
        if old is not None:
            self._bytes -= old[1]
            if old[0].digest != protocol.digest:
                self._unsave(old[0])
        self._entries[ident] = (protocol, size)
        self._bytes += size
        while len(self._entries) > self.max_protocols or self._bytes > self.max_bytes:
            _, (dropped, dropped_size) = self._entries.popitem(last=False)
            self._bytes -= dropped_size
            self._unsave(dropped)
        if document is not None and ident in self._entries:
            self._save(protocol, document)
        return ident in self._entries

    def touch(self, protocol: Protocol) -> None:
        if self.knows(protocol):
            self._entries.move_to_end(str(protocol.id))

    def _path(self, protocol: Protocol) -> Path | None:
        if self.directory is None:
            return None
        return self.directory / (protocol.digest.replace(":", "-") + ".cbcl")

    def _save(self, protocol: Protocol, document: bytes) -> None:
        path = self._path(protocol)
        if path is None or path.exists():
            return
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomically(path, document, prefix=".learned-")

    def _unsave(self, protocol: Protocol) -> None:
        path = self._path(protocol)
        if path is not None:
            with contextlib.suppress(OSError):
                path.unlink()

    def restore(self, registry: Registry, *, limits: Limits = DEFAULT_LIMITS,
                say: Callable[[str], None] | None = None) -> list[Protocol]:
        """Load every saved descriptor into ``registry`` (verified: signatures, policy,
        rollback and equivocation against its state) and keep it. A file that no longer
        verifies is skipped, and named through ``say``. Returns the protocols kept."""
        if self.directory is None or not self.directory.is_dir():
            return []
        kept = []
        for path in sorted(self.directory.glob("sha256-*.cbcl"))[: 4 * self.max_protocols]:
            try:
                document = read_regular_file(path, max_bytes=limits.max_message_bytes,
                                             what="descriptor")
                protocol = registry.load(document)
            except (CBCLError, UnsafeFile, OSError) as exc:
                if say is not None:
                    detail = exc.one_line() if isinstance(exc, CBCLError) else str(exc)
                    say(f"learned descriptor {path.name} skipped: {detail}")
                continue
            if self.add(protocol):
                kept.append(protocol)
        return kept


# --------------------------------------------------------------------------- handlers


class Context:
    """What a handler knows besides the message: the :class:`Link` it came on (``None``
    for a handler called outside an agent, in a test say) and who sent it
    (:attr:`identity`). :meth:`reply` builds an answer in the same conversation, with an id
    from ``next_id`` (default: the link's)."""

    def __init__(self, message: Message, *, link: Link | None = None,
                 next_id: Callable[[], str] | None = None,
                 identity: Identity | None = None) -> None:
        if next_id is None:
            if link is None:
                raise ValueError("a Context needs a link or next_id")
            next_id = link.next_id
        self.message = message
        self.link = link
        self._next_id = next_id
        self._identity = identity

    @property
    def identity(self) -> Identity | None:
        """Who sent the message, as the trust store proved it: the verified key id and the
        names the trust policy lets it speak as (:class:`cbcl.trust.Identity`, whose
        ``name`` is the message's sender). On a link, the identity the peer's signed
        Finished proved, for the whole session; ``None`` when nothing was proved (a peer
        whose Finished this side did not verify: an initiator without a trust store)."""
        if self._identity is not None:
            return self._identity
        return None if self.link is None else self.link.identity

    @property
    def peer(self) -> str:
        """The peer's address (``HOST:PORT``, or the address we connected to)."""
        return "" if self.link is None else self.link.connection.peer

    @property
    def protocol(self) -> Protocol | None:
        """The protocol agreed on the link."""
        return None if self.link is None else self.link.session.protocol

    def reply(self, intent: Intent | str, body: Value | None = None, *,
              reply_by: int | None = None) -> Message:
        """A reply to :attr:`message`: from its receiver to its sender, in its protocol and
        conversation, ``in-reply-to`` its id; our id, the peer's ids only as values. A
        ``str`` the protocol's schema types as a symbol, keyword or URI is made one
        (:func:`cbcl.conversation.coerce_body`). Raises ``TypeError``/``ValueError`` for a
        field of the wrong type (as :class:`Message` does)."""
        message = self.message
        protocol = self.protocol
        if protocol is not None and protocol.schema is not None and body is not None:
            body = coerce_body(protocol.schema, body)  # "EUR" -> EUR where it is a symbol
        return Message(message_id=self._next_id(), sender=message.receiver,
                       receiver=message.sender, intent=Intent(intent),
                       protocol=message.protocol, conversation_id=message.conversation_id,
                       in_reply_to=message.message_id, reply_by=reply_by, body=body)


    def _our_reply(self, intent: Intent, body: Value) -> Message:
        """:meth:`reply` for the library's own responder, whose ``body`` it built from
        values of exact CBCL types (never the peer's text): made without the constructor's
        checks and the schema's coercion, which such a body does not need. Every field but
        the body is the received message's (checked when it arrived) or our own id; the
        session checks the whole reply against the protocol before it leaves."""
        message = self.message
        return Message._trusted(self._next_id(), message.receiver, message.sender, intent,
                                message.protocol, message.conversation_id,
                                message.message_id, None, None, body, None)


def load_handler(spec: str) -> Handler:
    """``MODULE:CALLABLE`` (``pkg.mod:name``, attributes dotted) → the callable, imported
    with the current directory on the import path (as uvicorn does). Raises ``ValueError``
    for a malformed spec and ``ImportError``/``AttributeError`` for a missing one,
    ``TypeError`` when the object is not callable."""

    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"a handler is MODULE:CALLABLE, not {spec!r}")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    target: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"{spec} is not callable")
    return cast("Handler", target)  # (a callable, as checked)


# --------------------------------------------------------------------------- links


def _time_up(waiter: asyncio.Future[None]) -> None:
    """A reply's deadline passed: wake its waiter (:meth:`AgentConversation.next` then
    finds nothing queued and the time left gone)."""
    if not waiter.done():
        waiter.set_result(None)


class AgentConversation:
    """One conversation on a :class:`Link`, started by this side. :meth:`send` sends a
    message in it and, by default, awaits the peer's next message in it."""

    def __init__(self, link: Link, conversation_id: str, *, max_queued: int = 64) -> None:
        self.link = link
        self.id = conversation_id
        self._queue: deque[Message] = deque()
        self._max_queued = max_queued
        self._waiter: asyncio.Future[None] | None = None
        self.ended: str | None = None  # why it ended, once it has
        self.finished = False  # reached a final state of the protocol's machine

    def _deliver(self, message: Message, finished: bool) -> None:
        if len(self._queue) >= self._max_queued:
            self._queue.popleft()  # bounded: the oldest unread message goes
        self._queue.append(message)
        self.finished = self.finished or finished
        self._wake()

    def _end(self, reason: str) -> None:
        if self.ended is None:
            self.ended = reason
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def send(self, intent: Intent | str, body: Value | None = None, *,
                   expect_reply: bool = True, timeout: float | None = None,
                   reply_by: int | None = None) -> Message | None:
        """Send ``(intent, body)`` in this conversation; return the peer's next message in
        it (``None`` with ``expect_reply=False``, or when this message finished the
        conversation). A ``str`` the protocol's schema types as a symbol, keyword or URI
        is made one (:func:`cbcl.conversation.coerce_body`): ``currency="EUR"`` is the
        symbol ``EUR`` where the schema says so. ``timeout`` (seconds, default the
        agent's ``reply_timeout``).
        Raises :class:`PeerFailed` (the peer answered that it could not answer: its reason
        code, at once), :class:`ConversationClosed` (the link ended, or no reply in time),
        :class:`~cbcl.ProtocolError`/``ViolationError`` for a message the protocol refuses
        (nothing is sent), ``TypeError``/``ValueError`` for a body that is no CBCL value."""
        link = self.link
        protocol = link.session.protocol
        if protocol is None:
            raise ConversationClosed("no protocol is established", reason="closed")
        if protocol.schema is not None and body is not None:
            body = coerce_body(protocol.schema, body)  # "EUR" -> EUR where it is a symbol
        message = Message(message_id=link.next_id(), sender=link.me, receiver=link.peer,
                          intent=Intent(intent), protocol=protocol.id,
                          conversation_id=self.id, reply_by=reply_by, body=body)
        step = await link.send(message)
        if step is not None and step.finished:
            self.finished = True
            link._forget(self)
            return None
        if not expect_reply:
            return None
        return await self.next(timeout=timeout)

    async def next(self, *, timeout: float | None = None) -> Message:
        """The peer's next message in this conversation. Raises :class:`PeerFailed` when
        it is a NOT-UNDERSTOOD (the peer could not answer: spec/negotiation.md §6.3) and
        :class:`ConversationClosed` when the link ended or nothing came in time."""
        wait = self.link.agent.reply_timeout if timeout is None else timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while not self._queue:
            if self.ended is not None:
                raise ConversationClosed(f"conversation {self.id!r} ended: {self.ended}",
                                         reason=self.ended)
            left = deadline - loop.time()
            if left <= 0:
                raise ConversationClosed(f"no reply in conversation {self.id!r} within "
                                         f"{wait:g} s", reason="no-reply")
            # (one future and one timer a wait: asyncio.wait_for costs two futures, a
            # timer and their callbacks, ~6 µs more a reply)
            waiter = self._waiter = loop.create_future()
            timer = loop.call_at(deadline, _time_up, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
        message = self._queue.popleft()
        if message.intent is Intent.NOT_UNDERSTOOD:
            raise PeerFailed(message)
        return message


class Link:
    """One connection of an :class:`Agent`, served or opened: its session, its
    conversations and the task that takes its events (:meth:`run`)."""

    def __init__(self, agent: Agent, connection: Connection, number: int, tag: str) -> None:
        self.agent = agent
        self.connection = connection
        self.session = connection.session
        self.number = number
        self.tag = f"{tag}[{number}]"
        self._ids = itertools.count(1)
        self._id_prefix = "reply" if tag == "serve" else f"m-{secrets.token_hex(4)}"
        # Each bounded by the agent's ``server_limits.max_conversations`` (see _keep).
        self._conversations: OrderedDict[str, AgentConversation] = OrderedDict()
        #: Waiters for the reply to a message sent without a conversation-id, by its id.
        self._replies: OrderedDict[str, AgentConversation] = OrderedDict()
        self._offer: bytes | None = None
        self.established: asyncio.Future[Established] = \
            asyncio.get_running_loop().create_future()
        self.closed: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        #: The task taking this link's events (a served link's: its connection's task).
        self.task: asyncio.Task[Any] | None = None
        # Handlers (see the module doc): one lane of messages per conversation, each lane
        # a task; the pump reads no further while ``_backlog`` messages are not handled.
        limits = agent.handler_limits
        self._lanes: dict[tuple[str, str], deque[tuple[ProtocolMessage, Handler]]] = {}
        self._lane_tasks: set[asyncio.Task[None]] = set()
        self._backlog = 0
        self._room = asyncio.Event()
        self._room.set()
        self._slots = asyncio.Semaphore(limits.handler_concurrency)
        #: Done when this link's handlers are to stop (shutdown): each is answered
        #: ``shutdown``.
        self._stopping: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        #: Handlers running on this link now.
        self.running = 0
        connection.take_now = self._take_now  # (see Connection._run_now)

    @property
    def protocol(self) -> Protocol | None:
        """The protocol agreed on this link (``None`` before)."""
        return self.session.protocol

    @property
    def encoding(self) -> str | None:
        """The encoding agreed on this link (``None`` before)."""
        return self.session.encoding

    @property
    def identity(self) -> Identity | None:
        """Who the peer proved to be in the handshake (:attr:`Session.identity`): ``None``
        before, or when its Finished was not verified."""
        return self.session.identity

    @property
    def me(self) -> URI:
        me = self.session.me
        if me is None:  # pragma: no cover - a responder learns it from the first message
            raise RuntimeError("this link has no name yet")
        return me

    @property
    def peer(self) -> URI:
        peer = self.session.peer
        if peer is None:  # pragma: no cover - set once the handshake is done
            raise RuntimeError("this link has no peer yet")
        return peer

    def next_id(self) -> str:
        return f"{self._id_prefix}-{next(self._ids)}"

    def logs(self, level: int = logging.INFO) -> bool:
        """Whether an event at ``level`` goes anywhere (so its line is worth building)."""
        return (self.agent.log is not None and level >= logging.INFO) \
            or logger.isEnabledFor(level)

    def log(self, text: str, *, level: int = logging.INFO, event: str = "link",
            exc_info: BaseException | None = None, message: Message | None = None,
            **fields: Any) -> None:
        """Log one event of this link: ``text`` (escaped: one line, whatever slipped) with
        the link's tag, as a record of the ``cbcl.net`` logger at ``level`` whose ``cbcl``
        attribute holds ``event``, the link, the peer, the fields of ``message`` and
        ``fields`` (values from the peer escaped); and, at INFO and above, through the
        agent's ``log`` callable. ``exc_info``: a traceback for the record."""
        line = escape_invisible(f"{self.tag}: {text}")
        say = self.agent.log
        if say is not None and level >= logging.INFO:
            say(line)
        if logger.isEnabledFor(level):
            data = EventFields(event, fields, message, self.tag, self.connection.peer,
                               self.session.peer)
            # The record logger.log(level, line, exc_info=…, extra=…, stacklevel=2) makes,
            # without its walk of the stack for the caller (a fifth of a record's cost,
            # once per message): the caller is the frame above this one — unless records
            # carry no caller at all (logging._srcfile None, as in cbcl serve: computing
            # the caller's line number alone costs a tenth of a record). The line is the
            # record's message, without arguments: nothing to format.
            if logging._srcfile is None:
                path, line_number, function = _NO_CALLER
            else:
                caller = sys._getframe(1)
                code = caller.f_code
                path, line_number, function = code.co_filename, caller.f_lineno, code.co_name
            record = logger.makeRecord(
                logger.name, level, path, line_number, line, (),
                None if exc_info is None else (type(exc_info), exc_info,
                                               exc_info.__traceback__),
                function, {"cbcl": data})
            logger.handle(record)

    def conversation(self, conversation_id: str | None = None) -> AgentConversation:
        """A new conversation (a fresh id unless ``conversation_id``). Raises
        ``ValueError`` for an id already in use on this link. At most the agent's
        ``server_limits.max_conversations`` are open on a link: one more ends the oldest
        (a wait in it raises :class:`ConversationClosed` ``no-reply``)."""
        cid = conversation_id or f"c-{secrets.token_hex(6)}"
        if cid in self._conversations:
            raise ValueError(f"conversation {cid!r} is already open on this link")
        conversation = AgentConversation(self, cid)
        self._keep(self._conversations, cid, conversation)
        return conversation

    def expect_reply(self, message_id: str) -> AgentConversation:
        """A waiter for the peer's message ``in-reply-to`` ``message_id`` (for a message
        sent without a conversation-id); :meth:`AgentConversation.next` returns it. At most
        ``server_limits.max_conversations`` wait at once (see :meth:`conversation`)."""
        waiter = AgentConversation(self, f"reply to {message_id}")
        self._keep(self._replies, message_id, waiter)
        return waiter

    def _keep(self, table: OrderedDict[str, AgentConversation], key: str,
              waiter: AgentConversation) -> None:
        """Put ``waiter`` in ``table``, which holds at most the agent's
        ``server_limits.max_conversations``: beyond that the oldest is ended with
        ``no-reply`` (a protocol without a conversation machine never says that one is
        over, so nothing else would ever drop it)."""
        table[key] = waiter
        while len(table) > self.agent.server_limits.max_conversations:
            _, dropped = table.popitem(last=False)
            dropped._end("no-reply")

    def _forget(self, conversation: AgentConversation) -> None:
        """Drop a finished conversation (its final message went either way)."""
        if self._conversations.get(conversation.id) is conversation:
            del self._conversations[conversation.id]

    def conversation_for(self, conversation_id: str) -> AgentConversation:
        """The open conversation ``conversation_id`` of this link, made if new."""
        found = self._conversations.get(conversation_id)
        return found if found is not None else self.conversation(conversation_id)

    async def send(self, message: Message) -> Step | None:
        """Send one message of the agreed protocol (validated first, see
        :meth:`Session.send`); returns its conversation step, if any. Raises
        :class:`ConversationClosed` once the link is closed."""
        if self.closed.done():
            raise ConversationClosed(f"the link is closed ({self.closed.result()})",
                                     reason=self.closed.result())
        if _tracing.otel is not None:  # the current span's context, in (trace …)
            message = _tracing.outgoing(message)
        await self.connection.send(ProtocolMessage(message))
        return self.session.last_sent_step

    async def close(self) -> None:
        """Close the link: open conversations end with ``closed``, and handlers still
        running on it are stopped as for any end of the link (:meth:`Agent.close` first
        lets them finish, or answers them ``shutdown``)."""
        await self.connection.close()
        self._finish("closed")

    def _stop_handlers(self) -> None:
        if not self._stopping.done():
            self._stopping.set_result(None)

    async def _end_handlers(self) -> None:
        """The link has ended: cancel its lanes (a coroutine handler is cancelled, a
        thread's result dropped) and wait for them, at most a few seconds."""
        lanes = set(self._lane_tasks)
        if not lanes:
            return
        if self.running and self.logs():
            self.log(f"{self.running} handler(s) stopped: the link ended", event="stopped")
        for lane in lanes:
            lane.cancel()
        await asyncio.wait(lanes, timeout=CANCEL_WAIT + 1.0)

    def _finish(self, reason: str) -> None:
        if not self.closed.done():
            self.closed.set_result(reason)
        self._room.set()  # a pump waiting for room reads on, and finds the stream's end
        if not self.established.done():
            self.established.set_exception(ConversationClosed(
                f"the link closed before a protocol was agreed ({reason})", reason=reason))
            self.established.exception()  # retrieved: awaiting it is optional
        for conversation in [*self._conversations.values(), *self._replies.values()]:
            conversation._end(reason)
        self.agent._links.discard(self)

    async def run(self) -> str:
        """Take the link's events until it ends; returns why it ended (``closed``, a
        NOT-UNDERSTOOD code, ``timeout``, ``busy``, ``error``). Never raises for what the
        peer did."""
        reason = "closed"
        try:
            reason = await self._pump()
        except ConnectionLost as exc:
            reason = exc.code or "error"
            self.log(peer_text(exc.one_line(), 240, tail=100), level=logging.WARNING,
                     event="ended", reason=reason)
            if exc.code == "busy":
                raise  # the server counts it as a refusal
        except RemoteProtocolError as exc:
            reason = exc.code
            self.log(self._ended_text(exc), level=logging.WARNING, event="ended",
                     reason=reason)
        except CBCLError as exc:  # our side's session failed (a message it refused to send)
            reason = "error"
            self.log(peer_text(exc.one_line(), 240, tail=100), level=logging.WARNING,
                     event="ended", reason=reason)
        finally:
            self._finish(reason)
            await self._end_handlers()
            if self.session.role == "initiator":  # a server closes its own connections
                await self.connection.close()
        return reason

    def _ended_text(self, exc: RemoteProtocolError) -> str:
        if exc.code == "closed":
            open_ones = [] if self.session.tracker is None else [
                c for c in self.session.tracker.conversations() if not c.finished]
            if open_ones:
                names = ", ".join(f'"{peer_text(c.conversation_id, 40)}" (in state '
                                  f"{peer_text(c.state, 32)})" for c in open_ones[:4])
                more = f" and {len(open_ones) - 4} more" if len(open_ones) > 4 else ""
                return f"closed by the peer with conversation {names}{more} unfinished"
        return peer_text(exc.one_line(), 240, tail=100)  # the reason is at the end

    async def _pump(self) -> str:
        connection, session = self.connection, self.session
        while True:
            await self._wait_room()
            event = await connection.next_event()
            if isinstance(event, Query):
                answer = "supported" if session.protocol is not None else "unsupported"
                self.log(f"asked for {peer_text(event.protocol, 64)} "
                         f"{peer_text(event.digest, 19)} versions "
                         f"({_peer_list(event.versions)}), encodings "
                         f"{_peer_list(event.encodings)} -> {answer}", event="asked",
                         protocol=peer_text(event.protocol, 64), reason=answer)
            elif isinstance(event, Offer):
                self._offer = event.document
                self.log(f"offer received ({len(event.document)} bytes of signed "
                         "descriptor); verifying and compiling it off the event loop",
                         event="offer")
            elif isinstance(event, Accepted) and session.role == "initiator":
                self.log(f"the peer accepted our offer: {peer_text(event.protocol, 64)} "
                         f"version {peer_text(event.version, 20)} "
                         f"({peer_text(event.encoding, 16)})", event="accepted",
                         protocol=peer_text(event.protocol, 64))
            elif isinstance(event, Accepted):
                self.log(f"verified (signed by "
                         f"{', '.join(peer_text(s, 40) for s in event.signers)}), "
                         f"{_grammar_source(connection.last_work_source)}, "
                         f"{connection.last_work_ms:.1f} ms; "
                         f"{peer_text(event.protocol, 64)} version "
                         f"{peer_text(event.version, 20)} loaded -> accepted "
                         f"({peer_text(event.encoding, 16)})", event="accepted",
                         protocol=peer_text(event.protocol, 64),
                         timings={"work_ms": round(connection.last_work_ms, 3)})
            elif isinstance(event, Rejected):
                self.log(f"rejected: {peer_text(event.reason, 32)} "
                         f"[{peer_text(event.detail, 200)}] "
                         f"({connection.last_work_ms:.1f} ms)", level=logging.WARNING,
                         event="rejected", reason=peer_text(event.reason, 32),
                         timings={"work_ms": round(connection.last_work_ms, 3)})
                if session.role == "initiator":
                    return self._rejected(event)
            elif isinstance(event, Established):
                self._on_established(event)
            elif isinstance(event, ProtocolMessage):
                if _tracing.otel is None or (tracer := _tracing.active_tracer()) is None:
                    await self._on_message(event)
                else:
                    await _tracing.receiving(tracer, self._on_message(event), event.message,
                                             self.connection.peer)
            elif isinstance(event, NotUnderstood):
                self.log(f"the peer did not understand: {peer_text(event.reason, 64)}",
                         level=logging.WARNING, event="not-understood",
                         reason=peer_text(event.reason, 64))
                if not self.established.done():
                    self.established.set_exception(NegotiationFailed(
                        f"the peer did not understand: {event.reason}", reason=event.reason,
                        exit_code=not_understood_exit(event.reason)))
                    self.established.exception()  # retrieved: a served link awaits nothing
                return event.reason
            elif isinstance(event, ConnectionClosed):
                self.log("closed", event="closed")
                return "closed"
            elif isinstance(event, Unsupported) and self._offer is not None:
                await connection.send(Offer(self._offer))  # Supported, Finished: no answer

    def _rejected(self, event: Rejected) -> str:
        if not self.established.done():
            self.established.set_exception(NegotiationFailed(
                f"the peer rejected the offer: {event.reason}", reason=event.reason,
                exit_code=REJECT_EXIT.get(event.reason, 6)))
            self.established.exception()  # retrieved: awaiting it is optional
        return event.reason

    def _on_established(self, event: Established) -> None:
        session = self.session
        identity = session.identity
        who = "" if identity is None else (
            f" with {peer_text(identity.name, 64)} (key {peer_text(identity.key_id, 40)}"
            f"{'' if identity.bound else ', name not bound by the trust policy'})")
        self.log(f"established {peer_text(event.protocol, 64)} in "
                 f"{peer_text(event.encoding, 16)}{who}", event="established",
                 protocol=peer_text(event.protocol, 64))
        protocol = session.protocol
        library = self.agent.learned
        if protocol is not None and session.role == "responder":
            if library.knows(protocol):
                library.touch(protocol)
            elif self._offer is not None:
                library.add(protocol, self._offer)
        if not self.established.done():
            self.established.set_result(event)

    async def _on_message(self, event: ProtocolMessage) -> None:
        then = self._take(event)
        if then is not None:
            await then()

    def _take_now(self, event: Event) -> bool | Callable[[], Awaitable[None]]:
        """:attr:`Connection.take_now`: a message of the agreed protocol, taken in the
        socket's callback as :meth:`_pump` would take it; every other event is left to
        the pump (``False``). Returns what is left to finish in the pump, if anything
        (an on-loop handler's failure, or a wait for room in the backlog)."""
        if type(event) is not ProtocolMessage or (
                _tracing.otel is not None and _tracing.active_tracer() is not None):
            return False  # (traced: the pump opens the message's span)
        then = self._take(event, untraced=True)
        if self._backlog < self.agent.handler_limits.handler_backlog or self.closed.done():
            return True if then is None else then
        if then is None:
            return self._wait_room

        async def both() -> None:
            await then()
            await self._wait_room()
        return both

    async def _wait_room(self) -> None:
        """Read no further until a handler is done (or the link was closed meanwhile)."""
        backlog = self.agent.handler_limits.handler_backlog
        while self._backlog >= backlog and not self.closed.done():
            self._room.clear()
            await self._room.wait()

    def _take(self, event: ProtocolMessage, *, untraced: bool = False
              ) -> Callable[[], Awaitable[None]] | None:
        """Take a message of the agreed protocol: to the conversation waiting for it, to
        an on-loop handler (called here) or to its lane. Returns what is left to await
        (an on-loop handler's outcome other than a plain reply), or ``None``.
        ``untraced``: the caller found tracing off (it is not asked again)."""
        message, step = event.message, event.step
        self.agent.messages_received += 1
        if self.logs(logging.DEBUG):  # one line per request at INFO: the answer's
            where = (f" ({peer_text(step.before, 32)} -> {peer_text(step.after, 32)})"
                     if step else "")
            failure = event.failure
            why = "" if failure is None else f" {peer_text(failure[0], 64)}"
            self.log(f'received "{peer_text(message.message_id, 64)}" '
                     f"{message.intent.value}{why}{where}", level=logging.DEBUG,
                     event="received", message=message)
        cid = message.conversation_id
        waiting = self._conversations.get(cid) if cid is not None else None
        if waiting is not None:
            waiting._deliver(message, event.finished)
            if event.finished:
                self._forget(waiting)
            return None
        if message.in_reply_to is not None:
            answered = self._replies.pop(message.in_reply_to, None)
            if answered is not None:
                answered._deliver(message, True)
                return None
        if message.intent is Intent.NOT_UNDERSTOOD:
            return None  # a failure nothing here waits for: never a handler's (no ping-pong)
        handler = self.agent.handler_for(str(message.protocol), message.intent)
        if handler is None:
            if self.logs():
                self.log(f'received "{peer_text(message.message_id, 64)}" '
                         f"{message.intent.value}: no handler", event="unhandled",
                         message=message)
            return None
        if type(handler) is OnLoop and (("c", cid) if cid is not None
                                        else ("m", message.message_id)) not in self._lanes:
            # Never blocks (on_loop): handled here, in order, with no task, lane or thread
            # hop; while it runs (or its reply waits for the stream) nothing more is read.
            if not self.connection.sends_now or (not untraced and _tracing.otel is not None
                                                 and _tracing.active_tracer() is not None):
                # (NATS publishes by an await; a traced call needs _handle's span)
                return self._contained(lambda: self._handle(event, handler))
            try:
                then = self._handle_now(event, handler)
            except Exception as exc:  # ours, not the handler's: logged, the link goes on
                self._internal(exc)
                return None
            return None if then is None else self._contained(then)
        self._dispatch(event, handler)
        return None

    def _contained(self, then: Callable[[], Awaitable[None]]
                   ) -> Callable[[], Awaitable[None]]:
        async def contained() -> None:
            try:
                await then()
            except Exception as exc:  # ours, not the handler's: logged, the link goes on
                self._internal(exc)
        return contained

    def _handle_now(self, event: ProtocolMessage, handler: OnLoop
                    ) -> Callable[[], Awaitable[None]] | None:
        """:meth:`_handle` for an on-loop handler, without awaiting: the handler is
        called here and a reply (or none) is sent with :meth:`Connection.send_now`;
        anything else (it raised, returned an awaitable or something that is not a
        message, a reply the session refuses) is left to the returned coroutine
        function, which finishes it as :meth:`_handle` does."""
        if self._stopping.done():
            return lambda: self._handle(event, handler)
        agent, message = self.agent, event.message
        loop = self.connection._loop  # (asyncio.get_running_loop() costs a getpid() call)
        started = loop.time()
        self.running += 1
        try:
            value = handler.handler(message, Context(message, link=self))
        except BaseException as exc:  # user code: whatever it raises is its outcome
            outcome = Outcome("raised", exc, loop.time() - started)
            return lambda: self._answer(event, outcome)
        finally:
            self.running -= 1
        if value is not None and not isinstance(value, Message) \
                and inspect.isawaitable(value):
            awaitable = value

            async def settle() -> None:
                self.running += 1
                try:
                    outcome = await settle_awaitable(awaitable, loop, started,
                                                     started + agent.handler_timeout,
                                                     self._stopping)
                finally:
                    self.running -= 1
                await self._answer(event, outcome)
            return settle
        seconds = loop.time() - started
        protocol, session = self.session.protocol, self.session
        # (the parties are most often the very objects the session holds: `is` first)
        if type(value) is not Message or protocol is None \
                or value.protocol != protocol.id \
                or not (value.sender is session.me or value.sender == session.me) \
                or not (value.receiver is session.peer or value.receiver == session.peer):
            outcome = Outcome("answer", value, seconds)
            return lambda: self._answer(event, outcome)  # (refused there, as it says)
        timings = {"handler_ms": round(seconds * 1000, 3)}
        if self.closed.done():
            return None  # (as send() would: nobody to answer)
        try:
            self.connection.send_now(ProtocolMessage(value))
        except ConnectionLost:
            return None
        except CBCLError as exc:
            refused = exc
            return lambda: self._reply_refused(event, refused, timings)
        self._log_sent(message, value, timings)
        return None

    # ----------------------------------------------------------------- handlers

    def _dispatch(self, event: ProtocolMessage, handler: Handler) -> None:
        """Hand ``event`` to its conversation's lane (a message without a conversation-id
        has one of its own), starting the lane's task if it has none."""
        message = event.message
        cid = message.conversation_id
        key = ("c", cid) if cid is not None else ("m", message.message_id)
        self._backlog += 1
        lane = self._lanes.get(key)
        if lane is not None:
            lane.append((event, handler))
            return
        lane = deque([(event, handler)])
        self._lanes[key] = lane
        task = asyncio.get_running_loop().create_task(self._run_lane(key, lane))
        self._lane_tasks.add(task)
        task.add_done_callback(self._lane_tasks.discard)

    async def _run_lane(self, key: tuple[str, str],
                        lane: deque[tuple[ProtocolMessage, Handler]]) -> None:
        """Handle one conversation's messages in order, each when a slot is free."""
        try:
            while lane:
                event, handler = lane[0]
                try:
                    async with self._slots:
                        await self._handle(event, handler)
                except Exception as exc:  # ours, not the handler's: logged, the lane goes on
                    self._internal(exc)
                lane.popleft()
                self._backlog -= 1
                self._room.set()
        finally:
            if self._lanes.get(key) is lane:
                del self._lanes[key]

    def _internal(self, exc: Exception) -> None:
        self.log(f"internal: {type(exc).__name__}: {peer_text(str(exc), 160)} "
                 "(please report this)", level=logging.ERROR, event="internal", exc_info=exc)

    def _handle(self, event: ProtocolMessage, handler: Handler) -> Awaitable[None]:
        """:meth:`_handle_one`, inside a ``handle`` span where tracing is on
        (:mod:`._tracing`); else that coroutine itself, no frame added."""
        work = self._handle_one(event, handler)
        if _tracing.otel is None or (tracer := _tracing.active_tracer()) is None:
            return work
        return _tracing.handling(tracer, work, event.message, self.connection.peer)

    async def _handle_one(self, event: ProtocolMessage, handler: Handler) -> None:
        """Run ``handler`` for ``event`` and send what it came to: its reply, or a
        failure NOT-UNDERSTOOD (:meth:`_fail`)."""
        agent, message = self.agent, event.message
        self.running += 1
        try:
            outcome = await run_handler(handler, message, Context(message, link=self),
                                        threads=agent.threads, timeout=agent.handler_timeout,
                                        stop=self._stopping)
        finally:
            self.running -= 1
        await self._answer(event, outcome)

    async def _answer(self, event: ProtocolMessage, outcome: Outcome) -> None:
        """Send what a handler came to (:meth:`_handle`'s second half)."""
        agent, message = self.agent, event.message
        kind, value = outcome.kind, outcome.value
        timings = {"handler_ms": round(outcome.seconds * 1000, 3)}
        if kind == "answer":
            if value is None:
                if self.logs():
                    self.log(f'handled "{peer_text(message.message_id, 64)}" '
                             f"{message.intent.value}: no reply", event="handled",
                             message=message, timings=timings)
                return
            if isinstance(value, Message):
                await self._reply(event, value, timings)
                return
            text = f"the handler returned {type(value).__name__}, not a Message"
            self.log(f"{text}: nothing sent", level=logging.ERROR, event="handler-failed",
                     message=message, reason="handler-failed", timings=timings)
            await self._fail(event, "handler-failed", private=text)
        elif kind == "raised":
            self._log_raised(value, message, timings)
            await self._fail(event, "handler-failed",
                             private=f"{type(value).__name__}: {value}")
        elif kind == "timeout":
            busy = "" if value != "thread" else (
                f" (no handler thread was free: {agent.threads.busy} of "
                f"{agent.threads.max_threads} busy, overrunning handlers included)")
            self.log(f"the handler did not answer within {agent.handler_timeout:g} s{busy}",
                     level=logging.ERROR, event="handler-timeout", message=message,
                     reason="handler-timeout", timings=timings)
            await self._fail(event, "handler-timeout",
                             public=f"no answer within {agent.handler_timeout:g} s")
        else:
            self.log("the handler was stopped: the agent is stopping", level=logging.WARNING,
                     event="shutdown", message=message, reason="shutdown", timings=timings)
            await self._fail(event, "shutdown", public="the agent is stopping")

    def _log_raised(self, error: BaseException, message: Message,
                    timings: dict[str, float]) -> None:
        """A handler raised ``error``: one ERROR line; an exception's traceback with it,
        any other BaseException's (SystemExit, KeyboardInterrupt …, contained: the server
        stops only on its own signals) at DEBUG."""
        said = f": {peer_text(str(error), 160)}" if str(error) else ""
        if isinstance(error, Exception):
            self.log(f"the handler failed: {type(error).__name__}{said}", level=logging.ERROR,
                     event="handler-failed", exc_info=error, message=message,
                     reason="handler-failed", timings=timings)
            return
        self.log(f"the handler raised {type(error).__name__}{said}: contained, the agent "
                 "goes on", level=logging.ERROR, event="handler-failed", message=message,
                 reason="handler-failed", timings=timings)
        if logger.isEnabledFor(logging.DEBUG):
            self.log(f"the handler's {type(error).__name__}", level=logging.DEBUG,
                     event="handler-failed", exc_info=error, message=message)

    async def _reply(self, event: ProtocolMessage, answer: Message,
                     timings: dict[str, float]) -> None:
        """Send the handler's ``answer``; one the protocol refuses is not sent, and the
        peer is answered ``invalid-reply`` instead."""
        message = event.message
        protocol, session = self.session.protocol, self.session
        if protocol is None or answer.protocol != protocol.id \
                or (answer.sender, answer.receiver) != (session.me, session.peer):
            # (the session would end over a message of another protocol or parties)
            refusal = f"the reply is not a message of this link ({protocol and protocol.id}" \
                      f" from {session.me} to {session.peer})"
            self.log(f"our reply was not sent: {peer_text(refusal, 200)}",
                     level=logging.ERROR, event="invalid-reply", message=message,
                     reason="invalid-reply", timings=timings)
            await self._fail(event, "invalid-reply", public="protocol", private=refusal)
            return
        try:
            await self.send(answer)
        except (ConversationClosed, ConnectionLost):
            return
        except CBCLError as exc:
            await self._reply_refused(event, exc, timings)
            return
        self._log_sent(message, answer, timings)

    async def _reply_refused(self, event: ProtocolMessage, exc: CBCLError,
                             timings: dict[str, float]) -> None:
        """Our reply to ``event`` was refused by the session (``exc``): logged, and the
        peer is answered ``invalid-reply``."""
        self.log(f"our reply was not sent: {peer_text(exc.one_line(), 200)}",
                 level=logging.ERROR, event="invalid-reply", message=event.message,
                 reason="invalid-reply", timings=timings)
        await self._fail(event, "invalid-reply", public=exc.kind, private=exc.one_line())

    def _log_sent(self, message: Message, answer: Message,
                  timings: dict[str, float]) -> None:
        if self.logs():
            # (_value_: what .value returns, without the enum's descriptor call)
            self.log(f'sent "{peer_text(answer.message_id, 64)}" {answer.intent._value_} in '
                     f'reply to "{peer_text(message.message_id, 64)}" '
                     f"{message.intent._value_} ({timings['handler_ms']:g} ms)", event="sent",
                     message=answer, timings=timings)

    async def _fail(self, event: ProtocolMessage, code: str, *, public: str = "",
                    private: str = "") -> None:
        """Answer ``event``'s message with a NOT-UNDERSTOOD ``code`` in its conversation
        (spec/negotiation.md §6.3), built as a value: ``in-reply-to`` it, the body
        ``code: detail``, where the detail is ``private`` (an exception's text) only when
        the agent was made with ``expose_errors``, else ``public``, escaped and
        shortened. Nothing is sent when nobody can wait for it: the message ended its
        conversation, or the link is closed."""
        message = event.message
        protocol = self.session.protocol
        if event.finished or self.closed.done() or protocol is None:
            return
        if protocol.descriptor.governs(Intent.NOT_UNDERSTOOD):
            self.log(f"no {code} answer: {peer_text(protocol.id, 64)} governs NOT-UNDERSTOOD "
                     "bodies itself", level=logging.WARNING, event="failure-not-sent",
                     message=message, reason=code)
            return
        detail = private if private and self.agent.expose_errors else public
        shown = escape_invisible(detail, limit=MAX_FAILURE_DETAIL) if detail else ""
        failure = Message(message_id=self.next_id(), sender=message.receiver,
                          receiver=message.sender, intent=Intent.NOT_UNDERSTOOD,
                          protocol=message.protocol, conversation_id=message.conversation_id,
                          in_reply_to=message.message_id, body=failure_body(code, shown))
        try:
            await self.send(failure)
        except (ConversationClosed, ConnectionLost):
            return
        except CBCLError as exc:
            self.log(f"the {code} answer was not sent: {peer_text(exc.one_line(), 200)}",
                     level=logging.WARNING, event="failure-not-sent", message=message,
                     reason=code)
            return
        if self.logs():
            self.log(f'answered "{peer_text(message.message_id, 64)}" with NOT-UNDERSTOOD '
                     f"{code}", event="failure-sent", message=message, reason=code)


class EventFields(Mapping[str, Any]):
    """A log record's ``cbcl`` attribute: the event's fields — ``event``, then (for a
    link's) ``link``, ``peer`` (its address), ``agent`` (the peer's name), then a
    message's (:func:`message_fields`), then the event's own (``reason``, ``timings`` …).
    Values from a peer are escaped. Built when first read (a JSON formatter, a filter of
    yours), so a record nobody reads as fields costs nothing more than its line."""

    __slots__ = ("_built", "_event", "_fields", "_link", "_message", "_name", "_peer")

    def __init__(self, event: str, fields: dict[str, Any], message: Message | None = None,
                 link: str | None = None, peer: str | None = None,
                 name: object | None = None) -> None:
        self._event, self._fields, self._message = event, fields, message
        self._link, self._peer, self._name = link, peer, name
        self._built: dict[str, Any] | None = None

    def _data(self) -> dict[str, Any]:
        built = self._built
        if built is None:
            built = {"event": self._event}
            if self._link is not None:
                built["link"] = self._link
                built["peer"] = peer_text(self._peer, 64)
                if self._name is not None:
                    built["agent"] = peer_text(self._name, 96)
            if self._message is not None:
                built.update(message_fields(self._message))
            built.update(self._fields)
            self._built = built
        return built

    def __getitem__(self, key: str) -> Any:
        return self._data()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data())

    def __len__(self) -> int:
        return len(self._data())

    def __repr__(self) -> str:
        return f"EventFields({self._data()!r})"


def message_fields(message: Message) -> dict[str, str]:
    """A message's fields for a log record: its conversation, protocol, intent, id and the
    id it answers (``in_reply_to``), each escaped (they came from a peer, or will go to
    one)."""
    fields = {"protocol": peer_text(message.protocol, 64), "intent": message.intent.value,
              "message_id": peer_text(message.message_id, 64)}
    if message.conversation_id is not None:
        fields["conversation"] = peer_text(message.conversation_id, 64)
    if message.in_reply_to is not None:
        fields["in_reply_to"] = peer_text(message.in_reply_to, 64)
    return fields


#: NOT-UNDERSTOOD codes that are trust failures (exit 6), and those that say the server
#: refused or dropped the connection for its own limits (exit 1: try again later).
TRUST_CODES = frozenset({"transcript-mismatch", "bad-signature", "untrusted-signer",
                         "rollback", "equivocation", "expired", "digest-mismatch"})
BUSY_CODES = frozenset({"busy", "timeout"})


def not_understood_exit(code: str) -> int:
    """The exit status when the peer answers NOT-UNDERSTOOD ``code`` (spec/negotiation.md
    §7): 6 for trust failures, 1 for busy or timeout, 4 for a limit, else 5."""
    if code in TRUST_CODES:
        return 6
    if code in BUSY_CODES:
        return 1
    return REJECT_EXIT.get(code, 5)


def _grammar_source(source: str) -> str:
    if source in ("memory cache", "disk cache"):
        return f"grammar from the {source}"
    return "grammar compiled"


def _peer_list(values: Any, limit: int = 8) -> str:
    """Up to ``limit`` values from a peer, each escaped and shortened, space-separated."""
    items = list(values) if isinstance(values, (tuple, list)) else [values]
    shown = " ".join(peer_text(item, 24) for item in items[:limit])
    return shown + (f" … ({len(items)} in all)" if len(items) > limit else "")


# --------------------------------------------------------------------------- the agent


class Agent:
    """An agent: ``name`` (its URI), ``key`` (``(key id, Ed25519 private key)``: signs its
    transcript confirmations), ``trust`` (a :class:`TrustStore` or a trust directory: who
    may teach it protocols, whose confirmations it accepts and as which agent names — a
    handler sees the peer's as ``context.identity``), ``state`` (a directory:
    rollback state, key bindings and the learned descriptors persist there), ``descriptors``
    (signed descriptor documents, or protocols already loaded, it speaks from the start).

    Handlers: :meth:`on` registers one per protocol id and intent (``intent=None``: every
    intent of that protocol); ``handler`` is the fallback for everything else. A handler is
    ``handler(message, context) -> Message | None`` (or a coroutine function); a returned
    message is sent as the reply. A plain function runs in one of the agent's
    ``handler_limits.handler_threads`` threads (it must not touch the event loop;
    ``context.reply`` is safe), a coroutine function on the loop. One conversation's
    messages are handled one at a time, in order; different conversations' at once, up to
    ``handler_limits.handler_concurrency`` per link (:class:`HandlerLimits`). Each is cut
    off after ``handler_timeout`` seconds (a coroutine is cancelled; a thread cannot be
    killed: its result is dropped, and it holds its thread until it returns). A handler that
    raises (anything: it is contained), overruns, or returns something that is not a message
    or a reply the protocol refuses is logged and answered with a NOT-UNDERSTOOD naming why
    (``handler-failed``, ``handler-timeout``, ``invalid-reply``: spec/negotiation.md §6.3),
    with the exception's text only when ``expose_errors``. ``reply_timeout``: how long
    :meth:`AgentConversation.send` waits for a reply by default.

    Limits: ``limits`` for every message, ``connection_limits`` per connection,
    ``server_limits`` for :meth:`serve`, ``handler_limits`` for handlers;
    ``max_learned`` protocol ids and ``max_learned_bytes`` of compiled tables kept from what
    peers taught. Every event is logged to the ``cbcl.net`` logger (see the module doc);
    ``log``, if given, is also called with each event's one escaped line (INFO and above).
    Raises ``TypeError`` / ``ValueError`` for bad arguments and :class:`CBCLError` for a
    descriptor that does not load.
    """

    def __init__(self, name: URI | str, *, key: tuple[str, Ed25519PrivateKey] | None = None,
                 trust: TrustStore | str | Path | None = None,
                 state: str | Path | None = None,
                 descriptors: Iterable[bytes | Protocol] = (),
                 limits: Limits | None = None,
                 connection_limits: ConnectionLimits | None = None,
                 server_limits: ServerLimits | None = None, handler: Handler | None = None,
                 handler_timeout: float = 30.0, reply_timeout: float = 10.0,
                 encodings: Iterable[str] = ("binary", "text"), max_learned: int = 64,
                 max_learned_bytes: int = 64 << 20,
                 log: Callable[[str], None] | None = None,
                 handler_limits: HandlerLimits | None = None,
                 expose_errors: bool = False) -> None:
        self.name = URI(str(name))
        self.key = key
        self.limits = limits or DEFAULT_LIMITS
        if isinstance(trust, (str, Path)):
            trust = TrustStore.from_directory(trust, limits=self.limits)
        self.trust = trust
        self._own_state: Path | None = None
        self.state = Path(state) if state is not None else None
        self.connection_limits = connection_limits or ConnectionLimits()
        self.server_limits = server_limits or ServerLimits()
        for label, value in (("handler_timeout", handler_timeout),
                             ("reply_timeout", reply_timeout)):
            if type(value) not in (int, float) or not 0 < value <= 86_400:
                raise ValueError(f"{label} must be a number of seconds in (0, 86400]")
        self.handler_timeout = float(handler_timeout)
        self.reply_timeout = float(reply_timeout)
        self.handler_limits = handler_limits or HandlerLimits()
        if not isinstance(self.handler_limits, HandlerLimits):
            raise TypeError("handler_limits must be a cbcl.net.HandlerLimits")
        #: Whether failure answers carry the exception's text (never by default).
        self.expose_errors = bool(expose_errors)
        #: The threads plain handlers run in.
        self.threads = HandlerThreads(self.handler_limits.handler_threads)
        self.encodings = tuple(encodings)
        self.log = log
        self.fallback = handler
        self._handlers: dict[tuple[str, str | None], Handler] = {}
        self.learned = LearnedLibrary(
            max_protocols=max_learned, max_bytes=max_learned_bytes,
            directory=None if self.state is None else self.state / LEARNED_DIR)
        self._links: set[Link] = set()
        #: Messages of agreed protocols its links have taken (each one is a DEBUG line).
        self.messages_received = 0
        self._servers: list[Server] = []
        self._tasks: set[asyncio.Task[Any]] = set()  # the served connections' tasks
        self._numbers = itertools.count(1)
        self.pool = WorkPool(self.server_limits.compile_workers,
                             self.server_limits.compile_queue)
        self._learned_per_peer = LearnedProtocols(self.server_limits.max_learned_per_peer)
        #: What each peer address's refused frames have cost the sessions it serves
        #: (``server_limits.max_refusals`` within ``refusal_window``; see ServerLimits).
        self.refusals = RefusalBudget(
            self.server_limits.max_refusals,
            max(1, round(self.server_limits.refusal_window * 1000)))
        base = self._registry()
        self.preloaded = [item if isinstance(item, Protocol) else base.load(item)
                          for item in descriptors]
        restored = self.learned.restore(base, limits=self.limits, say=self._say)
        if restored:
            self._say(f"agent: {len(restored)} learned protocol(s) restored from "
                      f"{self.learned.directory}: "
                      + ", ".join(f"{p.id} version {p.descriptor.version}" for p in restored))

    def _say(self, text: str, *, level: int = logging.INFO, event: str = "agent",
             exc_info: BaseException | None = None, message: Message | None = None,
             **fields: Any) -> None:
        """Log one event of the agent (not of one link): ``text``, escaped to one line,
        to the ``cbcl.net`` logger and the ``log`` callable (as :meth:`Link.log`)."""
        line = escape_invisible(text)
        if self.log is not None and level >= logging.INFO:
            self.log(line)
        if logger.isEnabledFor(level):
            logger.log(level, "%s", line, exc_info=exc_info,
                       extra={"cbcl": EventFields(event, fields, message)}, stacklevel=2)

    def _registry(self) -> Registry:
        state = self.state
        if state is None:
            if self._own_state is None:  # one for the agent's sessions to share; removed
                self._own_state = Path(tempfile.mkdtemp(prefix="cbcl-agent-state-"))
                weakref.finalize(self, shutil.rmtree, self._own_state, ignore_errors=True)
            state = self._own_state
        return Registry(trust=self.trust, state_dir=state, limits=self.limits,
                        compile_gate=self.pool.compile_gate)

    # ----------------------------------------------------------------- handlers

    def on(self, protocol: str, intent: Intent | str | None = None
           ) -> Callable[[Handler], Handler]:
        """Decorator: ``handler`` answers messages of ``protocol`` (an id such as
        ``auction/v1``) with ``intent`` (every intent when ``None``)."""
        key = (str(protocol), None if intent is None else Intent(intent).value)

        def register(handler: Handler) -> Handler:
            if not callable(handler):
                raise TypeError("a handler must be callable")
            self._handlers[key] = handler
            return handler
        return register

    def handler_for(self, protocol: str, intent: Intent) -> Handler | None:
        handlers = self._handlers
        if not handlers:  # (only the fallback: no lookup to make)
            return self.fallback
        return (handlers.get((protocol, intent._value_))
                or handlers.get((protocol, None)) or self.fallback)

    # ----------------------------------------------------------------- sessions

    def _session(self, role: str, registry: Registry, peer: URI | str | None = None,
                 encodings: Iterable[str] | None = None,
                 refusal_budget: RefusalBudget | None = None) -> Session:
        return Session(role, registry=registry, me=self.name, peer=peer,
                       encodings=self.encodings if encodings is None else encodings,
                       signing_key=self.key,
                       require_signed_finished=role == "responder" or self.trust is not None,
                       limits=self.limits,
                       max_frame_bytes=self.connection_limits.max_frame_bytes,
                       max_pending_frames=self.connection_limits.max_pending_frames,
                       max_conversations=self.server_limits.max_conversations,
                       refusal_budget=refusal_budget)

    def _responder(self) -> Session:
        """A session for a served connection: it shares the agent's
        :attr:`refusals` budget (the transport gives it the peer's address)."""
        registry = self._registry()
        for protocol in itertools.chain(self.preloaded, self.learned.protocols()):
            registry.adopt(protocol)
        return self._session("responder", registry, refusal_budget=self.refusals)

    async def serve(self, address: str) -> Server:
        """Listen on ``address`` (``HOST:PORT``, port 0 picks one, or ``unix:PATH``) and
        answer every connection: negotiate, learn what trusted peers offer, run handlers.
        Raises ``ValueError`` without a trust store (a responder verifies confirmations) and
        :class:`ConnectionLost` when the address cannot be used."""
        if self.trust is None:
            raise ValueError("a serving agent needs a trust store")

        async def handle(connection: Connection) -> None:
            peer = connection.peer
            self._watch_offers(connection, peer)
            link = Link(self, connection, next(self._numbers), "serve")
            self._links.add(link)
            task = asyncio.current_task()
            if task is not None:  # the server's task for this connection: close() awaits it
                link.task = task
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            try:
                await link.run()
            finally:
                connection.session.registry.abandon()  # its compiles stop: nobody waits

        def refused(peer: str, reason: str) -> None:
            self._say(f"serve: refused a connection from {peer_text(peer, 64)}: {reason}",
                      level=logging.WARNING, event="refused", peer=peer_text(peer, 64),
                      reason=reason)

        server = await serve(address, self._responder, handle,
                             limits=self.connection_limits, server_limits=self.server_limits,
                             pool=self.pool, on_refusal=refused)
        self._servers.append(server)
        return server

    def _vet(self, peer: str, prepared: PreparedDescriptor) -> None:
        # A protocol the agent already learned is no new burden: only new ones count.
        if not self.learned.knows(prepared.descriptor):
            self._learned_per_peer.vet(peer, prepared)

    def _watch_offers(self, connection: Connection, peer: str) -> None:
        """Hold a served connection's offers to the per-peer cap: an early answer at the
        offer, and the decision with the record, under one lock (``guard_record`` runs in
        the record's worker thread; ``knows`` there is one dict lookup)."""
        connection.vet_offer = lambda prepared: self._vet(peer, prepared)
        connection.guard_record = lambda prepared, record: self._learned_per_peer.record(
            peer, prepared, record, counts=not self.learned.knows(prepared.descriptor))

    async def connect(self, address: str, *, peer: URI | str, descriptor: bytes,
                      encodings: Iterable[str] | None = None,
                      timeout: float = 10.0) -> Link:
        """Connect to ``address``, agree on the protocol of the signed ``descriptor`` (asked
        for first; offered when the peer does not hold it) and return the established
        :class:`Link`; its events are taken by a task of its own until it closes. Raises
        :class:`NegotiationFailed` (rejected, or not understood), :class:`ConnectionLost`,
        :class:`ConversationClosed` and the errors of loading ``descriptor``."""
        registry = self._registry()
        payload = read_signed_descriptor_unverified(descriptor).payload
        protocol = registry.load(payload, allow_unsigned=True)  # our own descriptor
        session = self._session("initiator", registry, peer=peer, encodings=encodings)
        connection = await connect(address, session, limits=self.connection_limits,
                                   timeout=timeout, pool=self.pool)
        link = Link(self, connection, next(self._numbers), "link")
        link._offer = descriptor
        self._links.add(link)
        try:
            await connection.send(Query(str(protocol.id), protocol.digest,
                                        (protocol.descriptor.version,), session.encodings))
        except BaseException:
            await connection.close()
            raise
        link.task = asyncio.get_running_loop().create_task(link.run())
        try:
            async with asyncio.timeout(self.connection_limits.handshake_timeout):
                await asyncio.shield(link.established)
        except BaseException:
            await link.close()
            raise
        return link

    async def drain(self, grace: float | None = None) -> None:
        """Let the handlers running on every link finish, for at most ``grace`` seconds
        (default ``handler_limits.shutdown_grace``; their replies are sent), then stop the
        rest: each is answered ``shutdown`` (a coroutine is cancelled, a thread's result
        dropped). The links stay open, but from then on every message they bring is
        answered ``shutdown``: this is the first half of :meth:`close`, for a caller that
        must do something between (``cbcl serve --nats`` closes its bus)."""
        grace = self.handler_limits.shutdown_grace if grace is None else grace
        links = list(self._links)
        busy = {lane for link in links for lane in link._lane_tasks}
        if busy and grace > 0:
            self._say(f"agent: waiting up to {grace:g} s for {len(busy)} conversation(s) "
                      "still being handled", event="draining")
            await asyncio.wait(busy, timeout=grace)
        for link in links:
            link._stop_handlers()
        # Each stopped handler is answered; a message taken meanwhile is answered at once.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CANCEL_WAIT + 1.0
        while (left := {lane for link in links for lane in link._lane_tasks}) \
                and loop.time() < deadline:
            await asyncio.wait(left, timeout=deadline - loop.time())

    async def close(self, *, grace: float | None = None) -> None:
        """Stop serving, let running handlers finish within ``grace`` seconds (default
        ``handler_limits.shutdown_grace``, see :meth:`drain`), close every open link and
        the work pool."""
        for server in self._servers:
            server.close()
        await self.drain(grace)
        links = list(self._links)
        for link in links:
            await link.close()
        # Each link's task ends once its stream has (so nothing is left pending when the
        # loop closes); bounded, as every wait is.
        tasks = {link.task for link in links if link.task is not None} | self._tasks
        tasks.discard(asyncio.current_task())
        if tasks:
            await asyncio.wait(tasks, timeout=CANCEL_WAIT + 2.0)
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()
        self.pool.close()
        self.threads.close()
        if self._own_state is not None:
            shutil.rmtree(self._own_state, ignore_errors=True)


__all__ = [
    "Agent",
    "AgentConversation",
    "Context",
    "ConversationClosed",
    "EventFields",
    "HandlerLimits",
    "LearnedLibrary",
    "Link",
    "NegotiationFailed",
    "Outcome",
    "PeerFailed",
    "load_handler",
    "message_fields",
    "not_understood_exit",
]
