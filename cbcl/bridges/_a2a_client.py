"""A CBCL client of an A2A agent through the a2a-sdk's own client (spec/interop.md §4.7).

Theory of operation. :class:`A2AClient` fetches the agent's AgentCard from its well-known
path (once), makes the SDK's JSON-RPC client from it, and sends each CBCL message as one
A2A message (:func:`~cbcl.bridges._a2a.write_a2a`, role ``user``), naming the task that
awaits it when an earlier answer in the same conversation left one ``INPUT_REQUIRED``. The
answer — a task, or a message — holds the agent's replies: the task's history after our
message, then its status message. Each reply is read strictly
(:func:`~cbcl.bridges._a2a.read_a2a`: both passes, the schema, the signature with a trust
store), must go from the agent to us in our protocol and conversation, and must be what
the conversation allows (a :class:`~cbcl.conversation.ConversationTracker`, which also
refuses our own message before it leaves when the conversation does not allow it). A
refusal (``cbcl a2a serve``'s ``FAILED`` task with a ``text/plain`` notice) is raised as
:class:`~cbcl.ConversationClosed` whose ``reason`` is the reason code.

The agent is hostile: every call has a deadline (``timeout``, the whole exchange), the
response body a byte bound (``max_response_bytes``, counted as it arrives; a compressed
response is refused, so the bound is on what is read), and whatever the SDK, httpx or
protobuf raise becomes a :class:`~cbcl.CBCLError`: :class:`~cbcl.ConnectionLost` for the
transport and the agent's JSON-RPC errors, :class:`~cbcl.LimitError` for size,
:class:`~cbcl.ProtocolError` for an answer or a card that is not A2A.

Needs the ``a2a`` extra (``pip install 'cbcl[a2a]'``).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

try:
    import httpx
    from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
    from a2a.types import (
        AgentCard,
        Message as A2AMessage,
        Role,
        SendMessageRequest,
        StreamResponse,
        TaskState,
    )
    from a2a.utils.errors import A2AError
    from google.protobuf import json_format
    from google.protobuf.message import DecodeError
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError("cbcl's A2A client needs the a2a extra: pip install 'cbcl[a2a]'"
                      ) from exc

from ..core._display import escape_invisible
from ..core._errors import (
    CBCLError,
    ConnectionLost,
    ConversationClosed,
    LimitError,
    ProtocolError,
)
from ..core._limits import DEFAULT_LIMITS, Limits
from ..protocol._api import parse
from ..protocol._conversation import ConversationTracker
from ..protocol._message import Message
from ..protocol._registry import Registry
from ._a2a import CardProtocol, card_protocols, read_a2a, write_a2a

__all__ = ["A2AClient", "A2AReply"]

#: What the SDK, httpx, json and protobuf may raise for an answer that is not A2A.
_NOT_A2A = (ValueError, TypeError, AttributeError, KeyError, IndexError, RecursionError,
            OverflowError, json_format.Error, DecodeError)
#: The task states after which no message continues the task.
_ENDED = frozenset({TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_FAILED,
                    TaskState.TASK_STATE_CANCELED, TaskState.TASK_STATE_REJECTED})


@dataclass(frozen=True, slots=True)
class A2AReply:
    """What an A2A agent answered one CBCL message with: ``messages``, its CBCL replies
    in order (each checked), ``task_id`` (``None`` when it answered with a message, not a
    task), ``context_id``, and ``state``, the task's state name
    (``"TASK_STATE_COMPLETED"`` …; ``None`` without a task)."""

    messages: tuple[Message, ...]
    task_id: str | None
    context_id: str
    state: str | None


class _BoundedStream(httpx.AsyncByteStream):
    """A response body that raises once more than ``limit`` bytes have come."""

    def __init__(self, inner: httpx.AsyncByteStream, owner: _BoundedTransport,
                 request: httpx.Request) -> None:
        self._inner = inner
        self._owner = owner
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self._inner:
            seen += len(chunk)
            if seen > self._owner.limit:
                raise self._owner.too_large(self._request)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class _BoundedTransport(httpx.AsyncBaseTransport):
    """httpx's transport, with every response body bounded to ``limit`` bytes and compressed
    bodies refused (their size once decoded is not the size read)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.exceeded = False
        self._inner = httpx.AsyncHTTPTransport()

    def too_large(self, request: httpx.Request) -> httpx.ReadError:
        self.exceeded = True
        return httpx.ReadError(f"the response is larger than {self.limit} bytes",
                               request=request)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        declared = response.headers.get("content-length", "")
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if declared.isdigit() and int(declared) > self.limit:
            await response.aclose()
            raise self.too_large(request)
        if encoding not in ("", "identity"):
            await response.aclose()
            raise httpx.DecodingError(f"a compressed response ({encoding[:20]}) is refused",
                                      request=request)
        stream = response.stream
        if not isinstance(stream, httpx.AsyncByteStream):  # pragma: no cover - httpx's own
            raise TypeError("httpx's async transport returned a sync stream")
        return httpx.Response(response.status_code, headers=response.headers,
                              stream=_BoundedStream(stream, self, request),
                              extensions=response.extensions, request=request)

    async def aclose(self) -> None:
        await self._inner.aclose()


def _now() -> int:
    return time.time_ns() // 1_000_000


class A2AClient:
    """A CBCL client of the A2A agent at ``url`` (its base URL: the AgentCard is read from
    ``url`` + ``/.well-known/agent-card.json``).

    ``registry`` holds the protocols spoken: each reply is parsed by both passes and the
    schema with it (and, with a trust store, its signature verified), and checked against
    its conversation. ``timeout``: seconds each call may take in all (the card, or one
    exchange); ``max_response_bytes``: the largest response body read (default
    4 × ``limits.max_message_bytes`` + 128 KiB); ``max_conversations``: conversations
    followed at once (ended ones are forgotten; one more raises :class:`LimitError`);
    ``clock``: Unix ms, for the conversations' deadlines. Use it as an async context
    manager, or call :meth:`close`. Raises ``ValueError`` for a bad argument.
    """

    def __init__(self, url: str, *, registry: Registry, limits: Limits | None = None,
                 timeout: float = 30.0, max_response_bytes: int | None = None,
                 max_conversations: int = 256, clock: Callable[[], int] | None = None
                 ) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"an A2A agent's URL is http:// or https://, not {url!r}")
        if not isinstance(registry, Registry):
            raise TypeError("registry must be a cbcl.Registry (the protocols spoken)")
        if type(timeout) not in (int, float) or not 0 < timeout <= 86_400:
            raise ValueError("timeout must be a number of seconds in (0, 86400]")
        self.url = url
        self.registry = registry
        self.limits = DEFAULT_LIMITS if limits is None else limits
        self.timeout = float(timeout)
        self.max_response_bytes = (4 * self.limits.max_message_bytes + (128 << 10)
                                   if max_response_bytes is None else max_response_bytes)
        if type(self.max_response_bytes) is not int or self.max_response_bytes < 1:
            raise ValueError("max_response_bytes must be a positive int")
        self.clock = clock or _now
        self._tracker = ConversationTracker.from_descriptors(
            registry.protocols(), max_open=max_conversations, forget_finished=True)
        self._tracked = {str.__str__(p.id) for p in registry.protocols()
                         if p.descriptor.conversation is not None}
        self._waiting: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._max_waiting = max_conversations
        self._transport = _BoundedTransport(self.max_response_bytes)
        self._http = httpx.AsyncClient(transport=self._transport,
                                       timeout=httpx.Timeout(self.timeout),
                                       headers={"Accept-Encoding": "identity"},
                                       follow_redirects=False)
        self._card: AgentCard | None = None
        self._client: Client | None = None

    async def __aenter__(self) -> A2AClient:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        trace: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the HTTP connections."""
        client, self._client = self._client, None
        if client is not None:
            await client.close()
        await self._http.aclose()

    # ----------------------------------------------------------------- the card

    async def card(self) -> AgentCard:
        """The agent's AgentCard (fetched once). Raises :class:`ConnectionLost`,
        :class:`LimitError`, and :class:`~cbcl.MalformedError` for a CBCL extension that is
        not well-formed (:func:`card_protocols`)."""
        if self._card is None:
            resolver = A2ACardResolver(self._http, self.url)
            card = await self._call("fetching the AgentCard", resolver.get_agent_card())
            card_protocols(card)  # a malformed CBCL extension is refused now
            self._card = card
        return self._card

    async def protocols(self) -> tuple[CardProtocol, ...]:
        """The CBCL protocols the agent's card lists (a claim: trust comes from signed
        descriptors, spec/trust.md)."""
        return card_protocols(await self.card())

    async def _sdk_client(self) -> Client:
        if self._client is None:
            card = await self.card()
            config = ClientConfig(streaming=False, httpx_client=self._http)
            try:
                self._client = ClientFactory(config).create(card)
            except ValueError as exc:  # no JSON-RPC interface on the card
                raise ProtocolError(f"a2a: the agent's card offers no interface this client "
                                    f"speaks: {escape_invisible(str(exc), limit=120)}"
                                    ) from None
        return self._client

    # ----------------------------------------------------------------- one exchange

    async def send(self, message: Message) -> A2AReply:
        """Send ``message`` and return the agent's answer, its replies checked.

        ``message`` is checked first as the agent will check it (both passes, the schema,
        its conversation), so a message the protocol refuses never leaves. Raises what
        :func:`cbcl.parse` raises for it or for a reply, :class:`ConversationError` for a
        message or reply its conversation does not allow, :class:`ProtocolError` for a
        reply between other agents or an answer that is not A2A,
        :class:`ConversationClosed` when the agent refused the message (``reason``: the
        reason code, spec/negotiation.md §4; ``error`` when the agent failed), and
        :class:`ConnectionLost` and :class:`LimitError` as :meth:`card` does.
        """
        if not isinstance(message, Message):
            raise TypeError(f"expected a cbcl.Message, not {type(message).__name__}")
        checked = parse(message.canonical(), limits=self.limits, registry=self.registry)
        tracked = str.__str__(checked.protocol) in self._tracked
        if tracked:
            self._tracker.check(checked, now=self.clock())
        a2a, _ = write_a2a(checked, lossy=True, role=Role.ROLE_USER)
        key = (checked.conversation_id or "", str.__str__(checked.receiver))
        waiting = self._waiting.get(key) if checked.conversation_id else None
        if waiting is not None:
            a2a.task_id = waiting
        client = await self._sdk_client()
        answer = await self._call("sending the message", self._send(client, a2a))
        answers, task_id, context_id, state = _answers(answer, a2a.message_id)
        replies = []
        for reply_a2a in answers:
            _raise_refusal(reply_a2a)
            try:
                reply, _ = read_a2a(reply_a2a, registry=self.registry, limits=self.limits)
            except CBCLError:
                raise
            except _NOT_A2A as exc:  # (read_a2a translates; this is the last guard)
                raise ProtocolError(f"a2a: a reply cannot be read: {exc}") from None
            if (reply.sender, reply.receiver) != (checked.receiver, checked.sender) or \
                    reply.protocol != checked.protocol or \
                    reply.conversation_id != checked.conversation_id:
                raise ProtocolError(f'a2a: the reply "{escape_invisible(reply.message_id)}" '
                                    f"is not from {checked.receiver} to {checked.sender} in "
                                    f"{checked.protocol} and our conversation")
            replies.append(reply)
        if tracked:
            self._tracker.receive(checked, now=self.clock())
            for reply in replies:
                self._tracker.receive(reply, now=self.clock())
        self._follow(key, task_id, state)
        return A2AReply(tuple(replies), task_id, context_id,
                        None if state is None else TaskState.Name(state))

    @staticmethod
    async def _send(client: Client, a2a: A2AMessage) -> StreamResponse:
        found: StreamResponse | None = None
        async for event in client.send_message(SendMessageRequest(message=a2a)):
            found = event  # (not streaming: one event, the task or the message)
        if found is None:
            raise ProtocolError("a2a: the agent sent no answer")
        return found

    def _follow(self, key: tuple[str, str], task_id: str | None, state: Any) -> None:
        """Remember the task that awaits our next message in this conversation."""
        if not key[0] or task_id is None or state is None or state in _ENDED:
            self._waiting.pop(key, None)
            return
        self._waiting[key] = task_id
        self._waiting.move_to_end(key)
        while len(self._waiting) > self._max_waiting:
            self._waiting.popitem(last=False)

    async def _call(self, what: str, call: Any) -> Any:
        """Await ``call`` (an SDK coroutine) within the deadline, every foreign error
        translated."""
        try:
            async with asyncio.timeout(self.timeout):
                return await call
        except TimeoutError:
            raise ConnectionLost(f"a2a: no answer within {self.timeout:g} s while {what}",
                                 code="timeout") from None
        except CBCLError:
            raise
        except (A2AError, httpx.HTTPError) as exc:
            if self._transport.exceeded:
                self._transport.exceeded = False
                raise LimitError(f"a2a: the agent's response while {what} is larger than "
                                 f"{self.max_response_bytes} bytes",
                                 limit="max_response_bytes",
                                 maximum=self.max_response_bytes) from None
            raise ConnectionLost(f"a2a: {what}: {escape_invisible(str(exc), limit=200)}"
                                 ) from None
        except _NOT_A2A as exc:
            raise ProtocolError(f"a2a: {what}: the answer is not A2A: "
                                f"{escape_invisible(str(exc), limit=200)}") from None


def _answers(answer: StreamResponse, ours: str
             ) -> tuple[list[A2AMessage], str | None, str, Any]:
    """The agent's messages in ``answer`` (after ours, ``ours`` its messageId), the task
    id, the context id and the task state (``None`` for a message answer)."""
    kind = answer.WhichOneof("payload")
    if kind == "message":
        return [answer.message], None, answer.message.context_id, None
    if kind != "task":
        raise ProtocolError(f"a2a: the agent answered {kind or 'nothing'}, not a task or a "
                            "message")
    task = answer.task
    history = list(task.history)
    mine = [index for index, item in enumerate(history) if item.message_id == ours]
    after = history[mine[-1] + 1:] if mine else []
    if task.status.HasField("message"):
        after.append(task.status.message)
    return after, task.id, task.context_id, task.status.state


def _raise_refusal(a2a: A2AMessage) -> None:
    """Raise :class:`ConversationClosed` for the notice of a refused message or a failed
    agent (``cbcl a2a serve``'s: one text part marked ``cbcl: refused``)."""
    if len(a2a.parts) != 1 or a2a.parts[0].WhichOneof("content") != "text":
        return
    part = a2a.parts[0]
    try:
        metadata = json_format.MessageToDict(part.metadata) if part.HasField("metadata") \
            else {}
    except _NOT_A2A:  # pragma: no cover - a Struct always converts
        return
    if metadata.get("cbcl") != "refused":
        return
    code = metadata.get("code")
    reason = code if isinstance(code, str) and len(code) <= 40 else "error"
    text = escape_invisible(part.text, limit=300)
    if reason == "agent-failed":
        raise ConversationClosed(f"a2a: the agent failed: {text}", reason="error")
    raise ConversationClosed(f"a2a: the agent refused the message: {text}", reason=reason)
