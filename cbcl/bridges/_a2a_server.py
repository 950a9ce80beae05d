"""``cbcl a2a serve``: a CBCL agent behind the a2a-sdk server (spec/interop.md §4.6).

Theory of operation. The a2a-sdk's Starlette routes serve the AgentCard at its well-known
path and JSON-RPC at ``/`` (A2A 1.0, and 0.3 through the SDK's own adapter); its
``DefaultRequestHandler`` turns each ``SendMessage`` into a *task* and calls our
:class:`AgentExecutor` with the message, the task id it stamped and the context id. The
executor reads the CBCL message out of the A2A one (:func:`~cbcl.bridges._a2a.read_a2a`:
both passes, the schema, the signature with a trust store), refuses what is out of place
(a receiver other than ``name``, a replayed message id, a conversation that does not allow
it), runs the handler (``cbcl serve``'s convention: ``handler(message, context)``, sync or
async, returning a reply, several, or none), checks every reply as a receiver would, and
reports the exchange as task status updates: one per reply, carrying it, in the A2A state
:data:`~cbcl.bridges._a2a.TASK_STATES` gives for the conversation's state. An exchange ends
in a terminal state or ``INPUT_REQUIRED`` (the conversation awaits the client), never
stuck in ``WORKING``: the handler has said all it will say when it returns.

``contextId`` is the CBCL conversation-id: a request-context builder gives a message that
names no context its conversation-id as one, so the SDK does not invent one. ``taskId`` is
the SDK's: one task per exchange that a client continues (naming the task) until it ends.
The conversation's state lives here, keyed by conversation-id and the two agents, so a
client may also continue a conversation in a new task.

Everything a client sends is hostile, and everything this side keeps is bounded
(:class:`A2AServerLimits`): the request body (Starlette's ``max_body_size``), each HTTP
request's time (a deadline middleware), the handler's time, open connections and the time
a connection has to send its headers (a subclass of uvicorn's h11 protocol, which has
neither bound), the tasks kept (count and bytes, oldest dropped), open
conversations (least recently used dropped), the replay window, and how long a task parked
in ``INPUT_REQUIRED`` keeps its worker. ``ListTasks`` is not offered (it would show every
client's messages to any client); ``CancelTask`` is refused (a CBCL conversation ends by
its protocol's CANCEL message). A refused message ends its task ``FAILED`` with one
``text/plain`` part holding the error line and metadata naming the reason code
(spec/negotiation.md §4), never a stack trace; a trust failure says only
``trust: message verification failed`` (the reason is logged here).

Needs the ``a2a`` extra (``pip install 'cbcl[a2a]'``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import ipaddress
import itertools
import logging
import secrets
import socket
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

try:
    import uvicorn
    from a2a.server.agent_execution import (
        AgentExecutor,
        RequestContext,
        RequestContextBuilder,
        SimpleRequestContextBuilder,
    )
    from a2a.server.context import ServerCallContext
    from a2a.server.events import EventQueue
    from a2a.server.request_handlers import DefaultRequestHandler
    from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
    from a2a.server.tasks import TaskStore, TaskUpdater
    from a2a.types import (
        AgentCapabilities,
        AgentCard,
        AgentInterface,
        AgentSkill,
        ListTasksRequest,
        ListTasksResponse,
        Message as A2AMessage,
        Part,
        Role,
        SendMessageRequest,
        Task,
        TaskState,
        TaskStatus,
    )
    from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH, PROTOCOL_VERSION_1_0
    from a2a.utils.errors import UnsupportedOperationError
    from google.protobuf import json_format, struct_pb2
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.responses import PlainTextResponse
    from uvicorn.protocols.http.h11_impl import H11Protocol
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError("cbcl's A2A server needs the a2a extra: pip install 'cbcl[a2a]'"
                      ) from exc

from ..core._display import escape_invisible, peer_text
from ..core._errors import CBCLError, ConversationError, LimitError, TrustError
from ..core._limits import DEFAULT_LIMITS, Limits
from ..core._values import URI
from ..core._version import __version__
from ..net._agent import Agent, Context, Handler
from ..net._transport import _check_count, _check_seconds
from ..protocol._api import parse
from ..protocol._conversation import Conversation, Machine, compile_machine
from ..protocol._message import Message
from ..protocol._protocol import Protocol
from ..protocol._registry import Registry
from ..session._reasons import RemoteProtocolError, error_code
from ._a2a import (
    DATA_MEDIA_TYPE,
    EXTENSION_URI,
    MEDIA_TYPE,
    agent_card_extension,
    cbcl_text,
    read_a2a,
    task_state,
    write_a2a,
)

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

    from ..protocol._trust import Identity

__all__ = [
    "REFUSAL_MEDIA_TYPE",
    "A2AServer",
    "A2AServerLimits",
    "a2a_app",
    "agent_card",
    "serve_a2a",
]

logger = logging.getLogger("cbcl.a2a")

#: The media type of the part that carries a refusal (the error line).
REFUSAL_MEDIA_TYPE = "text/plain"
#: A2A task states an exchange may end in (terminal, or awaiting the client).
TERMINAL_STATES = frozenset({TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_FAILED,
                             TaskState.TASK_STATE_CANCELED, TaskState.TASK_STATE_REJECTED})
_PARKED = TaskState.TASK_STATE_INPUT_REQUIRED


# --------------------------------------------------------------------------- limits


@dataclass(frozen=True, slots=True)
class A2AServerLimits:
    """Every bound of ``cbcl a2a serve`` (spec/interop.md §4.6.4).

    ``max_request_bytes``: an HTTP request body (``None``: 4 × ``max_message_bytes`` +
    128 KiB, room for the A2A message :func:`read_a2a` accepts and the JSON-RPC around it);
    ``request_timeout``: seconds from a request's start to the end of its answer;
    ``handler_timeout``: seconds a coroutine handler has; ``max_connections``: connections
    open at once (one more is closed as soon as it is accepted); ``header_timeout``: seconds
    a connection has to send a request's headers, from connecting or from its previous
    answer; ``keep_alive_timeout``: whole seconds an idle keep-alive connection is kept
    (uvicorn's; ``header_timeout`` closes it too); ``max_tasks`` and ``max_task_bytes``:
    tasks kept, in count and in serialized bytes (the oldest are dropped; one task's history
    is trimmed from the front to fit); ``max_conversations``: open conversations kept (the
    least recently used is dropped); ``max_conversation_messages``: messages one
    conversation may hold (a client's message past it is refused); ``replay_window``:
    message ids remembered per server to refuse a replay; ``idle_task_timeout``: seconds a
    task parked in ``INPUT_REQUIRED`` keeps its worker (it stays in the store, and a
    follow-up restarts it). Raises ``ValueError`` for a value out of range."""

    max_request_bytes: int | None = None
    request_timeout: float = 60.0
    handler_timeout: float = 30.0
    max_connections: int = 64
    header_timeout: float = 10.0
    keep_alive_timeout: int = 5
    max_tasks: int = 1024
    max_task_bytes: int = 64 << 20
    max_conversations: int = 1024
    max_conversation_messages: int = 1024
    replay_window: int = 4096
    idle_task_timeout: float = 600.0

    def __post_init__(self) -> None:
        for name in ("request_timeout", "handler_timeout", "header_timeout",
                     "idle_task_timeout"):
            _check_seconds(name, getattr(self, name))
        for name, low in (("max_connections", 1), ("keep_alive_timeout", 1),
                          ("max_tasks", 1), ("max_task_bytes", 1024),
                          ("max_conversations", 1), ("max_conversation_messages", 1),
                          ("replay_window", 1)):
            _check_count(name, getattr(self, name), lower=low, upper=1 << 40)
        if self.max_request_bytes is not None and (
                type(self.max_request_bytes) is not int or self.max_request_bytes < 1):
            raise ValueError("max_request_bytes must be a positive int or None")

    def request_bytes(self, limits: Limits) -> int:
        """:attr:`max_request_bytes`, or its default for ``limits``."""
        if self.max_request_bytes is not None:
            return self.max_request_bytes
        return 4 * limits.max_message_bytes + (128 << 10)


# --------------------------------------------------------------------------- tasks


class _BoundedTaskStore(TaskStore):
    """The tasks of this server, in memory, bounded in count and bytes: saving past a bound
    drops the least recently saved task; a task larger than the byte bound alone loses
    the oldest messages of its history. Copies in and out (as the SDK's stores do). One
    owner: the server authenticates nobody, and a task id (a uuid4) is the capability to
    read it; listing is not offered."""

    def __init__(self, max_tasks: int, max_bytes: int) -> None:
        self.max_tasks = max_tasks
        self.max_bytes = max_bytes
        self._tasks: OrderedDict[str, tuple[Task, int]] = OrderedDict()
        self.total = 0

    def __len__(self) -> int:
        return len(self._tasks)

    async def save(self, task: Task, context: ServerCallContext) -> None:
        kept = Task()
        kept.CopyFrom(task)
        size = kept.ByteSize()
        trimmed = 0
        while size > self.max_bytes and len(kept.history):
            del kept.history[0]
            trimmed += 1
            size = kept.ByteSize()
        if trimmed:
            logger.info("a2a: task %s: %d message(s) dropped from its history (it took "
                        "more than %d bytes)", peer_text(task.id, 64), trimmed, self.max_bytes)
        old = self._tasks.pop(kept.id, None)
        if old is not None:
            self.total -= old[1]
        self._tasks[kept.id] = (kept, size)
        self.total += size
        while len(self._tasks) > 1 and (len(self._tasks) > self.max_tasks
                                        or self.total > self.max_bytes):
            dropped, (_, dropped_size) = self._tasks.popitem(last=False)
            self.total -= dropped_size
            logger.info("a2a: task %s dropped from the store (bounds: %d tasks, %d bytes)",
                        peer_text(dropped, 64), self.max_tasks, self.max_bytes)

    async def get(self, task_id: str, context: ServerCallContext) -> Task | None:
        found = self._tasks.get(task_id)
        if found is None:
            return None
        copied = Task()
        copied.CopyFrom(found[0])
        return copied

    async def list(self, params: ListTasksRequest, context: ServerCallContext
                   ) -> ListTasksResponse:
        raise UnsupportedOperationError(message="ListTasks is not offered by this agent")

    async def delete(self, task_id: str, context: ServerCallContext) -> None:
        found = self._tasks.pop(task_id, None)
        if found is not None:
            self.total -= found[1]


class _RequestHandler(DefaultRequestHandler):
    """The SDK's handler, without ``ListTasks`` (every task of every client)."""

    async def on_list_tasks(self, params: ListTasksRequest, context: ServerCallContext
                            ) -> ListTasksResponse:
        raise UnsupportedOperationError(message="ListTasks is not offered by this agent")


class _ContextBuilder(RequestContextBuilder):
    """The SDK's request context, with the message's conversation-id as its context id
    when the client named none (the SDK would make a uuid, which the CBCL message's
    conversation-id then contradicts). Only pass 1 is run, to find it; a message that does
    not pass keeps the SDK's behaviour and is refused by the executor."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._inner = SimpleRequestContextBuilder(should_populate_referred_tasks=False,
                                                  task_store=None)

    async def build(self, context: ServerCallContext,
                    params: SendMessageRequest | None = None, task_id: str | None = None,
                    context_id: str | None = None, task: Task | None = None
                    ) -> RequestContext:
        if params is not None and not context_id and not params.message.context_id:
            text = cbcl_text(params.message)
            if text is not None:
                with contextlib.suppress(CBCLError):
                    found = parse(text, envelope_only=True, limits=self.limits)
                    context_id = found.conversation_id or None
        return await self._inner.build(context, params=params, task_id=task_id,
                                       context_id=context_id, task=task)


# --------------------------------------------------------------------------- conversations


@dataclass
class _Thread:
    conversation: Conversation
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class _Conversations:
    """The open conversations (at most ``max_open``, the least recently used dropped), the
    ids of those that ended (as many, so a late message is refused), and the replay window
    of message ids."""

    def __init__(self, machines: dict[str, Machine], *, max_open: int,
                 replay_window: int) -> None:
        self.machines = machines
        self.max_open = max_open
        self.replay_window = replay_window
        self._open: OrderedDict[tuple[str, str, str], _Thread] = OrderedDict()
        self._ended: OrderedDict[tuple[str, str, str], None] = OrderedDict()
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._open)

    @staticmethod
    def key(message: Message) -> tuple[str, str, str]:
        """(conversation id, client, agent) of a message the client sent."""
        return (message.conversation_id or "", str.__str__(message.sender),
                str.__str__(message.receiver))

    def check_replay(self, message: Message) -> None:
        if (str.__str__(message.sender), message.message_id) in self._seen:
            raise RemoteProtocolError(f'message "{message.message_id}" is a replay: its id '
                                      "was seen before", code="replay")

    def remember(self, message: Message) -> None:
        self._seen[(str.__str__(message.sender), message.message_id)] = None
        while len(self._seen) > self.replay_window:
            self._seen.popitem(last=False)

    def thread(self, message: Message) -> _Thread | None:
        """The thread of ``message``'s conversation (made for a new one), or ``None`` when
        its protocol declares no conversation. Raises :class:`ConversationError` for a
        message without a conversation-id, or of a conversation that has ended."""
        machine = self.machines.get(str.__str__(message.protocol))
        if machine is None:
            return None
        where = f'message "{message.message_id}" refused'
        if message.conversation_id is None:
            raise ConversationError(f"{where}: it has no conversation-id", path="$")
        key = self.key(message)
        found = self._open.get(key)
        if found is not None:
            self._open.move_to_end(key)
            return found
        if key in self._ended:
            raise ConversationError(f'{where}: conversation "{message.conversation_id}" has '
                                    "ended", path="$")
        made = _Thread(Conversation(machine, protocol=message.protocol,
                                    conversation_id=message.conversation_id))
        self._open[key] = made
        while len(self._open) > self.max_open:
            dropped, _ = self._open.popitem(last=False)
            logger.info("a2a: conversation %s dropped (%d open at most)",
                        peer_text(dropped[0], 64), self.max_open)
        return made

    def end(self, key: tuple[str, str, str], thread: _Thread) -> None:
        """Forget a conversation that ended (or failed), remembering its id."""
        if self._open.get(key) is thread:
            del self._open[key]
        if thread.conversation.history:
            self._ended[key] = None
            while len(self._ended) > self.max_open:
                self._ended.popitem(last=False)

    def discard(self, key: tuple[str, str, str], thread: _Thread) -> None:
        """Forget a thread made for a message that did not start it."""
        if self._open.get(key) is thread and not thread.conversation.history:
            del self._open[key]


# --------------------------------------------------------------------------- the executor


class _AgentFailed(Exception):
    """The handler failed, timed out, or returned a reply its own checks refuse: the text
    is what the client is told; ``detail`` what is logged."""

    def __init__(self, text: str, detail: str = "") -> None:
        super().__init__(text)
        self.text = text
        self.detail = detail or text


def _now() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class _Exchange:
    """What one incoming message led to: the replies, each with its task state, and the
    state the task ends in."""

    replies: list[tuple[Message, TaskState]]
    final: TaskState


class _Executor(AgentExecutor):
    """Runs one CBCL exchange per A2A message (see the module's docstring)."""

    def __init__(self, handler: Handler | Agent, *, registry: Registry, limits: Limits,
                 server_limits: A2AServerLimits, name: URI | None,
                 require_signatures: bool, clock: Callable[[], int]) -> None:
        self.handler = handler
        self.registry = registry
        self.limits = limits
        self.server_limits = server_limits
        self.name = name
        self.require_signatures = require_signatures
        self.clock = clock
        machines = {}
        for protocol in registry.protocols():
            section = protocol.descriptor.conversation
            if section is not None:
                machines[str.__str__(protocol.id)] = compile_machine(
                    section, intents=protocol.descriptor.intents)
        self.conversations = _Conversations(machines,
                                            max_open=server_limits.max_conversations,
                                            replay_window=server_limits.replay_window)
        self._ids = itertools.count(1)
        self._prefix = secrets.token_hex(4)

    def next_id(self) -> str:
        return f"a2a-{self._prefix}-{next(self._ids)}"

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        incoming = context.message
        task_id, context_id = context.task_id or "", context.context_id or ""
        if incoming is None or not task_id:  # pragma: no cover - the SDK always sets both
            return
        updater = TaskUpdater(event_queue, task_id, context_id)
        if context.current_task is None:
            await event_queue.enqueue_event(Task(
                id=task_id, context_id=context_id, history=[incoming],
                status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED)))
        where = f"a2a: task {peer_text(task_id, 40)}"
        try:
            exchange = await self._exchange(incoming, where)
        except CBCLError as exc:
            logger.info("%s: refused: %s", where, escape_invisible(exc.one_line(), limit=300))
            await updater.failed(_refusal(exc, task_id, context_id))
            return
        except _AgentFailed as failed:
            logger.warning("%s: %s", where, escape_invisible(failed.detail, limit=300))
            await updater.failed(_notice(failed.text, "agent-failed", task_id, context_id))
            return
        except Exception as exc:  # a bug of ours: logged, and the client told no more
            logger.exception("%s: internal error: %s", where, type(exc).__name__)
            await updater.failed(_notice(f"internal: {type(exc).__name__}", "internal",
                                         task_id, context_id, "internal"))
            return
        for reply, state in exchange.replies:
            a2a, losses = write_a2a(reply, lossy=True, role=Role.ROLE_AGENT)
            for loss in losses:
                logger.info("%s: reply %s: %s", where, peer_text(reply.message_id, 64), loss)
            a2a.task_id, a2a.context_id = task_id, context_id
            await updater.update_status(state, a2a)
            logger.info('%s: sent "%s" %s (%s)', where, peer_text(reply.message_id, 64),
                        reply.intent.value, TaskState.Name(state))
        if not exchange.replies or exchange.final != exchange.replies[-1][1]:
            await updater.update_status(exchange.final)

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise UnsupportedOperationError(
            message="an A2A task of a CBCL agent is not cancelled: send the CANCEL message "
                    "of the conversation's protocol")

    # ----------------------------------------------------------------- one exchange

    async def _exchange(self, incoming: A2AMessage, where: str) -> _Exchange:
        message, _ = read_a2a(incoming, registry=self.registry, limits=self.limits,
                              require_signatures=self.require_signatures)
        logger.info('%s: received "%s" %s from %s', where, peer_text(message.message_id, 64),
                    message.intent.value, peer_text(message.sender, 64))
        if self.name is not None and message.receiver != self.name:
            raise RemoteProtocolError(
                f'message "{message.message_id}" is for {message.receiver}; this agent is '
                f"{self.name}", code="malformed")
        self.conversations.check_replay(message)
        identity = self._identity(message)
        handler = self._handler_for(message)
        thread = self.conversations.thread(message)
        if thread is None:
            self.conversations.remember(message)
            replies = await self._run(handler, message, identity)
            answers = [self._check(reply, message) for reply in replies]
            states = [TaskState.TASK_STATE_WORKING] * len(answers)
            if states:
                states[-1] = TaskState.TASK_STATE_COMPLETED
            return _Exchange(list(zip(answers, states, strict=True)),
                             TaskState.TASK_STATE_COMPLETED)
        key = self.conversations.key(message)
        async with thread.lock:
            conversation = thread.conversation
            held = self.server_limits.max_conversation_messages
            if len(conversation.history) >= held:
                raise LimitError(f'message "{message.message_id}" refused: conversation '
                                 f'"{message.conversation_id}" holds {held} messages already',
                                 limit="max_conversation_messages", maximum=held)
            try:
                conversation.receive(message, now=self.clock())
            except CBCLError:
                self.conversations.discard(key, thread)
                raise
            self.conversations.remember(message)
            after = self._state(conversation)
            checked: list[tuple[Message, TaskState]] = []
            try:
                for reply in await self._run(handler, message, identity):
                    reply = self._check(reply, message)
                    try:
                        conversation.receive(reply, now=self.clock())
                    except CBCLError as exc:
                        raise _AgentFailed("the agent's reply was refused by its own checks "
                                           f"({exc.kind})", exc.one_line()) from None
                    checked.append((reply, self._state(conversation)))
            except _AgentFailed:
                # The agent failed the conversation (whatever it had accepted of the
                # replies, none is sent): it ends.
                self.conversations.end(key, thread)
                raise
            if conversation.finished:
                self.conversations.end(key, thread)
        final = checked[-1][1] if checked else after
        if final not in TERMINAL_STATES:
            final = _PARKED  # the handler has said all it will say: the client's turn
        return _Exchange(checked, final)

    @staticmethod
    def _state(conversation: Conversation) -> TaskState:
        """The A2A state of a conversation: its protocol's table; without one, COMPLETED
        once it has finished, WORKING before."""
        mapped = task_state(conversation.protocol, conversation.state)
        if mapped is not None:
            return mapped
        return TaskState.TASK_STATE_COMPLETED if conversation.finished \
            else TaskState.TASK_STATE_WORKING

    def _identity(self, message: Message) -> Identity | None:
        trust = self.registry.trust
        if trust is None or message.signature is None:
            return None
        return trust.identity(message.signature.key_id, message.sender)

    def _handler_for(self, message: Message) -> Handler:
        if isinstance(self.handler, Agent):
            found = self.handler.handler_for(str.__str__(message.protocol), message.intent)
            if found is None:
                raise _AgentFailed("the agent has no handler for "
                                   f"{message.protocol} {message.intent.value}")
            return found
        return self.handler

    async def _run(self, handler: Handler, message: Message, identity: Identity | None
                   ) -> list[Any]:
        context = Context(message, next_id=self.next_id, identity=identity)
        timeout = self.server_limits.handler_timeout
        try:
            answer: Any = handler(message, context)
            if inspect.isawaitable(answer):  # (a plain function cannot be interrupted)
                async with asyncio.timeout(timeout):
                    answer = await answer
        except TimeoutError:
            raise _AgentFailed(f"the agent did not answer within {timeout:g} s") from None
        except Exception as exc:  # the handler is user code: its failure is the agent's
            raise _AgentFailed(f"the agent failed: {type(exc).__name__}",
                               f"the handler failed: {type(exc).__name__}: "
                               f"{peer_text(str(exc), 160)}") from None
        if answer is None:
            return []
        if isinstance(answer, Message):
            return [answer]
        if isinstance(answer, Sequence) and not isinstance(answer, (str, bytes)):
            return list(answer)
        raise _AgentFailed("the agent failed: it returned no message",
                           f"the handler returned {type(answer).__name__}, not a Message")

    def _check(self, reply: object, message: Message) -> Message:
        """A reply checked as its receiver would: a Message from this agent to the
        client, in the same conversation and protocol, whose canonical text passes both
        passes and the schema (and, signed, the trust store)."""
        if not isinstance(reply, Message):
            raise _AgentFailed("the agent failed: it returned no message",
                               f"the handler returned {type(reply).__name__}, not a Message")
        if (reply.sender, reply.receiver) != (message.receiver, message.sender) or \
                reply.protocol != message.protocol or \
                reply.conversation_id != message.conversation_id:
            raise _AgentFailed("the agent's reply was refused by its own checks (parties)",
                               f'reply "{peer_text(reply.message_id, 64)}" is not from '
                               f"{message.receiver} to {message.sender} in "
                               f"{message.protocol} and the same conversation")
        try:
            return parse(reply.canonical(), limits=self.limits, registry=self.registry)
        except (CBCLError, TypeError, ValueError) as exc:
            detail = exc.one_line() if isinstance(exc, CBCLError) else str(exc)
            kind = exc.kind if isinstance(exc, CBCLError) else "invalid"
            raise _AgentFailed(f"the agent's reply was refused by its own checks ({kind})",
                               f"our reply failed its checks: {detail}") from None


def _notice(text: str, code: str, task_id: str, context_id: str, kind: str = "agent"
            ) -> A2AMessage:
    """The agent message of a task that ended without a CBCL reply: one text/plain part
    (the line), marked ``{"cbcl": "refused", "code", "kind"}``."""
    metadata = json_format.ParseDict({"cbcl": "refused", "code": code, "kind": kind},
                                     struct_pb2.Struct())
    return A2AMessage(message_id=str(uuid.uuid4()), role=Role.ROLE_AGENT, task_id=task_id,
                      context_id=context_id, extensions=[EXTENSION_URI],
                      parts=[Part(text=escape_invisible(text, limit=1000),
                                  media_type=REFUSAL_MEDIA_TYPE, metadata=metadata)])


def _refusal(error: CBCLError, task_id: str, context_id: str) -> A2AMessage:
    """The notice for a refused message: its error line (cbcl-1.0.md §6.3) and reason code
    (spec/negotiation.md §4); for a trust failure only the uninformative message."""
    line = f"{error.kind}: {error.message}" if isinstance(error, TrustError) \
        else error.one_line()
    return _notice(line, error_code(error), task_id, context_id, error.kind)


# --------------------------------------------------------------------------- the app


class _Deadline:
    """ASGI middleware: each HTTP request has ``seconds`` from its start to the end of its
    answer; past that it is cut, answered 408 (and its connection closed) if nothing was
    sent yet. (The SDK's JSON-RPC handler answers a cut ``SendMessage`` itself, with the
    task as it stands.)"""

    def __init__(self, app: ASGIApp, seconds: float) -> None:
        self.app = app
        self.seconds = seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def sending(event: Any) -> None:
            nonlocal started
            if event["type"] == "http.response.start":
                started = True
            await send(event)

        try:
            async with asyncio.timeout(self.seconds):
                await self.app(scope, receive, sending)
        except TimeoutError:
            logger.info("a2a: a request took longer than %g s and was cut", self.seconds)
            if not started:  # (and the connection closes: its request was not all read)
                await PlainTextResponse("request timeout", status_code=408,
                                        headers={"connection": "close"})(scope, receive, send)


def agent_card(url: str, protocols: Iterable[Protocol], *, name: str = "cbcl",
               agent: URI | str | None = None, description: str | None = None
               ) -> AgentCard:
    """The AgentCard of a CBCL agent at ``url`` (its JSON-RPC endpoint): A2A 1.0 over
    JSON-RPC, no streaming, no push notifications, CBCL's media types as input and output
    modes, one skill per protocol, and the CBCL extension (:func:`agent_card_extension`)
    listing ``protocols`` (and ``agent``, its CBCL URI)."""
    listed = list(protocols)
    skills = [AgentSkill(id=str.__str__(p.id), name=str.__str__(p.id),
                         description=f"CBCL protocol {p.id} version {p.descriptor.version} "
                                     f"({p.digest})",
                         tags=["cbcl"], input_modes=[MEDIA_TYPE], output_modes=[MEDIA_TYPE])
              for p in listed]
    return AgentCard(
        name=name, version=__version__,
        description=description or "A CBCL/1.0 agent: each message is one application/cbcl "
                                   "text part, recognised by the grammars of its protocols.",
        supported_interfaces=[AgentInterface(url=url, protocol_binding="JSONRPC",
                                             protocol_version=PROTOCOL_VERSION_1_0)],
        capabilities=AgentCapabilities(streaming=False, push_notifications=False,
                                       extensions=[agent_card_extension(listed,
                                                                        agent=agent)]),
        default_input_modes=[MEDIA_TYPE, DATA_MEDIA_TYPE],
        default_output_modes=[MEDIA_TYPE, DATA_MEDIA_TYPE, REFUSAL_MEDIA_TYPE],
        skills=skills)


def a2a_app(handler: Handler | Agent, *, url: str, registry: Registry | None = None,
            name: URI | str | None = None, limits: Limits | None = None,
            server_limits: A2AServerLimits | None = None, require_signatures: bool = False,
            card_name: str = "cbcl", clock: Callable[[], int] | None = None) -> Starlette:
    """The ASGI app of a CBCL agent served over A2A at ``url`` (the URL its AgentCard
    names): the AgentCard at ``/.well-known/agent-card.json`` and JSON-RPC at ``/`` (A2A
    1.0, and 0.3's methods), answered by ``handler``.

    ``handler`` is ``handler(message, context)`` (sync or async; a reply, a sequence of
    replies, or ``None``), as for ``cbcl serve``, or an :class:`~cbcl.Agent`, whose
    handlers answer (and whose name, trust store and protocols are used when ``name`` and
    ``registry`` are not given). ``registry`` holds the protocols served (the card lists
    them; a message of another is refused); ``name``: the CBCL URI messages must be
    addressed to (``None``: any receiver); ``require_signatures``: refuse unsigned messages
    (the registry needs a trust store); ``clock``: Unix ms for the conversation deadlines.
    Raises ``ValueError`` for a registry without protocols or ``require_signatures``
    without a trust store, ``TypeError`` for a handler that is not callable.
    """
    if isinstance(handler, Agent):
        name = handler.name if name is None else name
        if registry is None:
            registry = Registry(trust=handler.trust, limits=handler.limits)
            for protocol in handler.preloaded:
                registry.adopt(protocol)
        limits = handler.limits if limits is None else limits
    elif not callable(handler):
        raise TypeError("handler must be callable or a cbcl.Agent")
    if registry is None or not registry.protocols():
        raise ValueError("an A2A agent needs a registry holding the protocols it serves")
    if require_signatures and registry.trust is None:
        raise ValueError("require_signatures needs a registry with a trust store")
    limits = DEFAULT_LIMITS if limits is None else limits
    server_limits = A2AServerLimits() if server_limits is None else server_limits
    agent = None if name is None else URI(str(name))
    executor = _Executor(handler, registry=registry, limits=limits,
                         server_limits=server_limits, name=agent,
                         require_signatures=require_signatures, clock=clock or _now)
    card = agent_card(url, registry.protocols(), name=card_name, agent=agent)
    request_handler = _RequestHandler(
        agent_executor=executor,
        task_store=_BoundedTaskStore(server_limits.max_tasks, server_limits.max_task_bytes),
        agent_card=card, request_context_builder=_ContextBuilder(limits),
        interrupted_task_timeout=server_limits.idle_task_timeout)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await request_handler.aclose()

    routes = [*create_agent_card_routes(card, card_url=AGENT_CARD_WELL_KNOWN_PATH),
              *create_jsonrpc_routes(request_handler, rpc_url="/", enable_v0_3_compat=True)]
    app = Starlette(routes=routes, lifespan=lifespan,
                    max_body_size=server_limits.request_bytes(limits),
                    middleware=[Middleware(_Deadline, seconds=server_limits.request_timeout)])
    app.state.executor = executor
    app.state.card = card
    return app


# --------------------------------------------------------------------------- serving


def _host_port(listen: str) -> tuple[str, int]:
    host, colon, port = listen.rpartition(":")
    host = host.strip("[]")
    if not colon or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"expected HOST:PORT (port 0: any free port), not {listen!r}")
    return host, int(port)


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``localhost`` or a loopback address)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _guarded_h11(max_connections: int, header_timeout: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with the two guards uvicorn lacks: at most
    ``max_connections`` connections open (one more is closed as soon as it is accepted;
    uvicorn's ``limit_concurrency`` only answers 503 once a request has come), and
    ``header_timeout`` seconds to send a request's headers, from connecting or from the
    previous answer (uvicorn waits for the first request, or a half-sent one, forever)."""

    class Guarded(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                logger.info("a2a: a connection was closed at once: %d are open already",
                            max_connections)
                transport.close()
                return
            self._await_headers()

        def _await_headers(self) -> None:
            self._stop_waiting()
            self._header_timer = self.loop.call_later(header_timeout, self._headers_late)

        def _stop_waiting(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _idle(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _headers_late(self) -> None:
            self._header_timer = None
            if self._idle() and not self.transport.is_closing():
                logger.info("a2a: a connection sent no request headers within %g s and "
                            "was closed", header_timeout)
                self.transport.close()

        def handle_events(self) -> None:
            super().handle_events()
            if not self._idle():
                self._stop_waiting()  # a request came: the app's deadline takes over

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self._idle() and not self.transport.is_closing():
                self._await_headers()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_waiting()
            super().connection_lost(exc)

    return Guarded


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, leaving signals to its caller: a library takes no signal handlers
    (uvicorn's own would also re-raise SIGTERM at the end, so a process could not stop
    cleanly on it)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class A2AServer:
    """A running ``cbcl a2a serve``: uvicorn serving an :func:`a2a_app` on a socket bound
    before the app was made (so the AgentCard names the port a ``:0`` picked). ``url`` is
    the JSON-RPC endpoint; :meth:`close` stops it (graceful for at most 5 s)."""

    def __init__(self, server: uvicorn.Server, task: asyncio.Task[None], url: str,
                 app: Starlette) -> None:
        self._server = server
        self._task = task
        self.url = url
        self.app = app

    @property
    def card_url(self) -> str:
        return self.url.rstrip("/") + AGENT_CARD_WELL_KNOWN_PATH

    @property
    def open_connections(self) -> int:
        """How many HTTP connections are open now."""
        return len(self._server.server_state.connections)

    async def wait(self) -> None:
        """Until the server stops (:meth:`close`, or a failure of uvicorn's)."""
        await asyncio.shield(self._task)

    async def close(self) -> None:
        self._server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def serve_a2a(handler: Handler | Agent, *, listen: str = "127.0.0.1:0",
                    allow_remote: bool = False, url: str | None = None,
                    server_limits: A2AServerLimits | None = None,
                    **options: Any) -> A2AServer:
    """Serve ``handler`` over A2A on ``listen`` (``HOST:PORT``; port 0 picks one) and
    return the running :class:`A2AServer`. Only a loopback host is accepted unless
    ``allow_remote`` (A2A carries no authentication of its own: sign the messages, and put
    TLS in front). ``url``: the URL the AgentCard names (default ``http://HOST:PORT/``).
    ``options`` go to :func:`a2a_app`. Raises ``ValueError`` for a bad or non-loopback
    address, ``OSError`` when it cannot be bound."""
    host, port = _host_port(listen)
    if not allow_remote and not is_loopback(host):
        raise ValueError(f"{host} is not a loopback address: serving beyond this machine "
                         "needs allow_remote (--allow-remote)")
    server_limits = A2AServerLimits() if server_limits is None else server_limits
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
        bound = sock.getsockname()[1]
        shown = f"[{host}]" if family == socket.AF_INET6 else host
        url = url or f"http://{shown}:{bound}/"
        app = a2a_app(handler, url=url, server_limits=server_limits, **options)
        protocol = _guarded_h11(server_limits.max_connections, server_limits.header_timeout)
        config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="on",
                                ws="none", http=protocol,
                                limit_concurrency=server_limits.max_connections + 1,
                                timeout_keep_alive=server_limits.keep_alive_timeout,
                                timeout_graceful_shutdown=5, server_header=False)
        server = _Uvicorn(config)
        task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
        async with asyncio.timeout(_START_TIMEOUT):
            while not server.started and not task.done():
                await asyncio.sleep(0.01)
    except BaseException:
        sock.close()
        raise
    if task.done():
        sock.close()
        task.result()  # its error, if it had one
        raise OSError(f"the A2A server on {listen} stopped at once")
    return A2AServer(server, task, url, app)


#: Seconds uvicorn has to start serving (its lifespan start-up included).
_START_TIMEOUT = 10.0
