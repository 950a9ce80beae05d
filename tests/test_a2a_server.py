"""CBCL over A2A for real (spec/interop.md §4.6, §4.7): ``cbcl a2a serve`` behind the
a2a-sdk's own server on a loopback socket, talked to by the SDK's own client (JSON-RPC, the
AgentCard at its well-known path, A2A 0.3 through the SDK's compat transport), and CBCL's
client (:class:`cbcl.interop.A2AClient`, ``cbcl send --a2a``) against it and against a
plain SDK-built server. Every limit at N and N+1.

Tests internals too: the bounded task store and conversation table of the server
(``_BoundedTaskStore``, ``_Conversations``), which no client can fill deterministically."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message as A2AMessage,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    Task,
    TaskState,
    TaskStatus,
)
from a2a.utils.errors import A2AError
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from google.protobuf import json_format
from hypothesis import given, settings, strategies as st
from key_files import private_key_pem, public_key_pem
from starlette.applications import Starlette

from cbcl import (
    URI,
    Agent,
    BodyError,
    ConnectionLost,
    ConversationClosed,
    ConversationError,
    Intent,
    Keyword,
    LimitError,
    Message,
    ProtocolError,
    Registry,
    Symbol,
    TrustStore,
    parse,
)
from cbcl.bridges._a2a_server import (
    REFUSAL_MEDIA_TYPE,
    _BoundedTaskStore,
    _Conversations,
    is_loopback,
)
from cbcl.cli._a2a import SERVER_OPTIONS
from cbcl.demo import respond
from cbcl.interop import (
    A2AClient,
    A2AServer,
    A2AServerLimits,
    LossyConversionError,
    a2a_json_to_message,
    card_protocols,
    message_to_a2a,
    read_a2a,
    serve_a2a,
)
from cbcl.net import Context
from cbcl.protocol._conversation import compile_machine
from cbcl.trust import Identity, sign_message

ROOT = Path(__file__).parent.parent
DESCRIPTORS = [ROOT / "descriptors" / name for name in
               ("request-v1.cbcl", "contract-net-v1.cbcl", "task-assignment-v1.cbcl")]
AGENT = "agent://ops/backup"


def request_text(mid: str = "m-1", cid: str = "c-1", *, body: str = "(action :name backup)",
                 receiver: str = AGENT) -> str:
    return (f'(CBCL/1.0 (message-id "{mid}") (sender agent://ops/planner) (receiver '
            f'{receiver}) (intent REQUEST) (protocol request/v1) (conversation-id "{cid}") '
            f"(body (request :action {body})))")


CFP = ('(CBCL/1.0 (message-id "cn-1") (sender agent://market/manager) (receiver '
       f'{AGENT}) (intent CFP) (protocol contract-net/v1) (conversation-id "job-1") '
       '(body (cfp :task (task :id "t-1" :action render-video) :deadline 1764503600000)))')
ACCEPT = ('(CBCL/1.0 (message-id "cn-2") (sender agent://market/manager) (receiver '
          f'{AGENT}) (intent ACCEPT) (protocol contract-net/v1) (conversation-id "job-1") '
          '(body (accept-proposal :task-id "t-1")))')


#: The headers of a JSON-RPC request of A2A 1.0 (without A2A-Version the SDK takes 0.3).
JSON_V1 = {"content-type": "application/json", "A2A-Version": "1.0"}


@pytest.fixture(scope="module")
def registry() -> Registry:
    reg = Registry(disk_cache=False, isolate=False)
    for path in DESCRIPTORS:
        reg.load(path.read_bytes(), allow_unsigned=True)
    return reg


def run(body: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``body`` on a fresh loop; any exception asyncio would only log fails the test."""
    stray: list[dict[str, Any]] = []

    async def main() -> Any:
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: stray.append(ctx))
        return await body()

    result = asyncio.run(main())
    assert not stray, stray
    return result


@contextlib.asynccontextmanager
async def serving(handler: Any, registry: Registry | None, **options: Any
                  ) -> AsyncIterator[A2AServer]:
    """``cbcl a2a serve``'s server on a loopback socket, stopped after."""
    server = await serve_a2a(handler, registry=registry, **options)
    try:
        yield server
    finally:
        await server.close()


@contextlib.asynccontextmanager
async def sdk_client(url: str, *, protocol_version: str | None = None
                     ) -> AsyncIterator[Any]:
    """The SDK's own client of the agent at ``url``, made from its AgentCard (as served,
    or with its interface's protocol version replaced: ``"0.3"`` makes the SDK pick its
    0.3 compat transport)."""
    async with httpx.AsyncClient() as http:
        card = await A2ACardResolver(http, url).get_agent_card()
        if protocol_version is not None:
            card.supported_interfaces[0].protocol_version = protocol_version
        client = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(card)
        try:
            yield client
        finally:
            await client.close()


async def send(client: Any, a2a: A2AMessage) -> StreamResponse:
    answers = [event async for event in client.send_message(SendMessageRequest(message=a2a))]
    assert len(answers) == 1
    answer: StreamResponse = answers[0]
    return answer


def notice(task: Task) -> dict[str, Any]:
    """The refusal notice of a FAILED task: its text and metadata."""
    assert task.status.state == TaskState.TASK_STATE_FAILED
    (part,) = task.status.message.parts
    assert part.media_type == REFUSAL_MEDIA_TYPE
    found: dict[str, Any] = json_format.MessageToDict(part.metadata)
    found["text"] = part.text
    return found


# --------------------------------------------------------------------------- the SDK client


def test_the_sdk_client_talks_to_cbcl_a2a_serve_on_loopback(registry: Registry) -> None:
    request = parse(request_text(), registry=registry)

    async def body() -> None:
        async with serving(respond, registry, name=AGENT) as server, \
                sdk_client(server.url) as client:
            assert server.url.startswith("http://127.0.0.1:")
            a2a = message_to_a2a(request)
            a2a.context_id = ""  # the server gives the task the conversation-id as context
            answer = await send(client, a2a)
            task = answer.task
            assert task.status.state == TaskState.TASK_STATE_COMPLETED
            assert task.context_id == "c-1"
            stamped = task.history[0]
            assert stamped.task_id == task.id  # the server stamped it, and read it anyway
            reply, losses = read_a2a(task.status.message, registry=registry)
            assert losses == []
            assert reply.intent is Intent.INFORM and reply.in_reply_to == "m-1"
            assert (reply.sender, reply.receiver) == (request.receiver, request.sender)
            assert task.status.message.role == Role.ROLE_AGENT
            assert task.status.message.task_id == task.id

    run(body)


def test_a_uuid_message_id_and_the_stamped_task_id_are_accepted(registry: Registry) -> None:
    """An SDK client's message: its own uuid messageId, no contextId; the server stamps a
    taskId and a context before the CBCL agent reads it."""
    request = parse(request_text(), registry=registry)

    async def body() -> None:
        async with serving(respond, registry) as server, sdk_client(server.url) as client:
            a2a = message_to_a2a(request)
            a2a.message_id = str(uuid.uuid4())
            a2a.ClearField("context_id")
            task = (await send(client, a2a)).task
            assert task.status.state == TaskState.TASK_STATE_COMPLETED, task.status
            assert task.history[0].message_id == a2a.message_id
            assert uuid.UUID(task.history[0].task_id)

    run(body)


def test_the_agent_card_is_at_the_well_known_path(registry: Registry) -> None:
    async def body() -> None:
        async with serving(respond, registry, name=AGENT) as server, \
                httpx.AsyncClient() as http:
            response = await http.get(server.card_url)
            assert response.status_code == 200
            assert server.card_url.endswith("/.well-known/agent-card.json")
            document = response.json()
            assert document["supportedInterfaces"][0]["url"] == server.url
            card = await A2ACardResolver(http, server.url).get_agent_card()
            listed = card_protocols(card)
            loaded = registry.protocols()
            assert {(p.id, p.digest) for p in listed} == {(str(p.id), p.digest)
                                                         for p in loaded}
            (extension,) = card.capabilities.extensions
            assert json_format.MessageToDict(extension.params)["agent"] == AGENT
            assert not card.capabilities.streaming
            assert {skill.id for skill in card.skills} == {str(p.id) for p in loaded}

    run(body)


def test_a_refused_message_is_a_failed_task_with_the_cbcl_reason(registry: Registry) -> None:
    request = parse(request_text(), registry=registry)

    async def body() -> None:
        async with serving(respond, registry) as server, sdk_client(server.url) as client:
            a2a = message_to_a2a(request)
            a2a.parts[0].text = request_text(body="(action)")  # :name is required
            a2a.parts.pop()  # (the data part would differ)
            task = (await send(client, a2a)).task
            refused = notice(task)
            assert refused["cbcl"] == "refused" and refused["code"] == "malformed"
            assert refused["kind"] == "body"
            assert re.match(r"body 1:\d+: .*:name", refused["text"])
            # A loss is refused too, and says what it is.
            a2a = message_to_a2a(request)
            a2a.reference_task_ids.append("elsewhere")
            refused = notice((await send(client, a2a)).task)
            assert refused["kind"] == "lossy" and "referenceTaskIds" in refused["text"]

    run(body)


def test_the_conversation_continues_in_its_task(registry: Registry) -> None:
    """contract-net/v1 with the SDK's client: the PROPOSE leaves the task INPUT_REQUIRED, the
    ACCEPT names the task, the INFORM completes it; a message the conversation does not
    allow is refused, and leaves the conversation as it was."""

    async def body() -> None:
        async with serving(respond, registry) as server, sdk_client(server.url) as client:
            task = (await send(client, message_to_a2a(parse(CFP, registry=registry)))).task
            assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
            proposal = read_a2a(task.status.message, registry=registry)[0]
            assert proposal.intent is Intent.PROPOSE
            wrong = parse(ACCEPT.replace('"cn-2"', '"cn-9"').replace("ACCEPT", "INFORM")
                          .replace("(accept-proposal", "(inform-done"), registry=registry)
            early = message_to_a2a(wrong)
            early.task_id = task.id  # the manager cannot INFORM: refused, the task FAILED
            refused = notice((await send(client, early)).task)
            assert refused["code"] == "conversation" and "INFORM" in refused["text"]
            accept = message_to_a2a(parse(ACCEPT, registry=registry))
            again = (await send(client, accept)).task  # a new task, the same conversation
            assert again.id != task.id
            assert again.status.state == TaskState.TASK_STATE_COMPLETED
            done = read_a2a(again.status.message, registry=registry)[0]
            assert done.intent is Intent.INFORM and done.in_reply_to == "cn-2"

    run(body)


def test_a2a_0_3_clients_are_served(registry: Registry) -> None:
    """The SDK's 0.3 transport (``message/send``, 0.3 JSON on the wire) and a hand-written
    0.3 JSON-RPC request: the CBCL text part crosses without a media type, the reply comes
    back in the 0.3 form and reads as one."""
    request = parse(request_text(), registry=registry)

    async def body() -> None:
        async with serving(respond, registry) as server:
            async with sdk_client(server.url, protocol_version="0.3") as client:
                task = (await send(client, message_to_a2a(request))).task
                assert task.status.state == TaskState.TASK_STATE_COMPLETED
                reply = read_a2a(task.status.message, registry=registry)[0]
                assert reply.intent is Intent.INFORM
            sent = {"kind": "message", "messageId": str(uuid.uuid4()), "role": "user",
                    "parts": [{"kind": "text", "text": request_text("m-3", "c-3"),
                               "metadata": {"cbcl": "authoritative"}}]}
            async with httpx.AsyncClient() as http:
                response = await http.post(server.url, json={
                    "jsonrpc": "2.0", "id": 7, "method": "message/send",
                    "params": {"message": sent}})
            result = response.json()["result"]
            assert result["kind"] == "task" and result["status"]["state"] == "completed"
            answer = result["status"]["message"]
            assert answer["kind"] == "message" and answer["role"] == "agent"
            message, losses = a2a_json_to_message(json.dumps(answer), registry=registry)
            assert message.intent is Intent.INFORM and losses == []
            assert message.conversation_id == result["contextId"] == "c-3"

    run(body)


def test_list_tasks_and_cancel_task_are_not_offered(registry: Registry) -> None:
    async def body() -> None:
        async with serving(respond, registry) as server, sdk_client(server.url) as client:
            task = (await send(client, message_to_a2a(parse(CFP, registry=registry)))).task
            with pytest.raises(A2AError, match="not offered"):
                await client.list_tasks(ListTasksRequest())
            with pytest.raises(A2AError):
                await client.cancel_task(CancelTaskRequest(id=task.id))

    run(body)


# --------------------------------------------------------------------------- hostile input


@pytest.fixture(scope="module")
def threaded_server(registry: Registry) -> Iterator[str]:
    """``cbcl a2a serve``'s server on a loopback socket, in a thread of its own (so that a
    synchronous property test can send it many requests); yields its URL."""
    loop = asyncio.new_event_loop()
    started: list[A2AServer] = []
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    started.append(asyncio.run_coroutine_threadsafe(
        serve_a2a(respond, registry=registry), loop).result(timeout=30))
    try:
        yield started[0].url
    finally:
        asyncio.run_coroutine_threadsafe(started[0].close(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()


TEXTS = [request_text(), CFP, ACCEPT, request_text(body="(action)"), "(CBCL/1.0", "",
         "\u202e(x)"]
PARTS = st.one_of(
    st.builds(lambda text, cut, media, mark: {
        "text": text[:cut], "mediaType": media,
        **({"metadata": {"cbcl": mark}} if mark else {})},
        st.sampled_from(TEXTS), st.integers(0, 400),
        st.sampled_from(["application/cbcl", "", "text/plain", "APPLICATION/CBCL; x=1"]),
        st.sampled_from(["", "authoritative", "informative"])),
    st.builds(lambda data, media: {"data": data, "mediaType": media},
              st.recursive(st.none() | st.integers() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                           max_leaves=8),
              st.sampled_from(["application/cbcl+json", ""])),
    st.builds(lambda raw, media: {"raw": base64.b64encode(raw).decode(), "mediaType": media},
              st.binary(max_size=40) | st.sampled_from([t.encode() for t in TEXTS]),
              st.sampled_from(["application/cbcl", "image/png"])),
    st.builds(lambda url: {"url": url}, st.text(max_size=20)),
)
MESSAGES = st.fixed_dictionaries(
    {"messageId": st.text(min_size=1, max_size=40) | st.uuids().map(str),
     "parts": st.lists(PARTS, max_size=4)},
    optional={"contextId": st.sampled_from(["c-1", "job-1", "", "other"]),
              "role": st.sampled_from(["ROLE_USER", "ROLE_AGENT", "ROLE_UNSPECIFIED"]),
              "extensions": st.lists(st.sampled_from(["urn:cbcl:a2a:1.0", "urn:x"]),
                                     max_size=2),
              "metadata": st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
              "referenceTaskIds": st.lists(st.text(max_size=6), max_size=2)})


@settings(max_examples=60)
@given(MESSAGES)
def test_fuzz_any_message_gets_a_task_or_an_sdk_error(threaded_server: str,
                                                       message: dict[str, Any]) -> None:
    """Whatever a client sends, the answer is a JSON-RPC result (a task that ended or
    awaits the client) or one of the SDK's own errors — never an internal error."""
    call = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
            "params": {"message": message}}
    with httpx.Client(timeout=30) as http:
        response = http.post(threaded_server, json=call, headers=JSON_V1)
    assert response.status_code == 200
    answer = response.json()
    if "error" in answer:
        assert answer["error"]["code"] != -32603, answer  # JSON-RPC internal error
        return
    task = json_format.ParseDict(answer["result"]["task"], Task())
    assert task.status.state in (TaskState.TASK_STATE_COMPLETED,
                                 TaskState.TASK_STATE_FAILED,
                                 TaskState.TASK_STATE_INPUT_REQUIRED), task.status
    if task.status.state == TaskState.TASK_STATE_FAILED:
        refused = notice(task)
        assert refused["code"] not in ("internal", "agent-failed"), refused


# --------------------------------------------------------------------------- limits


def test_the_request_body_limit_at_n_and_n_plus_1(registry: Registry) -> None:
    limit = 4096
    payload = {"jsonrpc": "2.0", "id": 1, "method": "GetTask",
               "params": {"id": "no-such-task"}}

    async def body() -> None:
        async with serving(respond, registry,
                           server_limits=A2AServerLimits(max_request_bytes=limit)) as server, \
                httpx.AsyncClient() as http:
            text = json.dumps(payload)
            padded = text + " " * (limit - len(text))
            response = await http.post(server.url, content=padded.encode(),
                                       headers=JSON_V1)
            assert response.status_code == 200  # read, and answered: no such task
            assert response.json()["error"]["message"] == "Task not found"
            response = await http.post(server.url, content=padded.encode() + b" ",
                                       headers=JSON_V1)
            assert (response.status_code, response.text) == (413, "Content Too Large")

    run(body)


async def until(condition: Callable[[], bool]) -> None:
    """Wait (at most 10 s) until ``condition`` holds: the server, on the same loop, has
    taken what the test sent."""
    async with asyncio.timeout(10):
        while not condition():
            await asyncio.sleep(0.005)


def test_open_connections_at_n_and_n_plus_1(registry: Registry) -> None:
    limits = A2AServerLimits(max_connections=2)

    async def body() -> None:
        async with serving(respond, registry, server_limits=limits) as server, \
                httpx.AsyncClient() as http:
            host, port = server.url[7:-1].rsplit(":", 1)
            _, idle = await asyncio.open_connection(host, int(port))
            await until(lambda: server.open_connections == 1)
            response = await http.get(server.card_url)  # the second: served
            assert response.status_code == 200
            await http.aclose()
            await until(lambda: server.open_connections == 1)
            _, second = await asyncio.open_connection(host, int(port))
            await until(lambda: server.open_connections == 2)
            reader, third = await asyncio.open_connection(host, int(port))  # N + 1
            assert await reader.read() == b""  # closed as soon as it was accepted
            for writer in (idle, second, third):
                writer.close()

    run(body)


def test_a_connection_must_send_its_headers_in_time(registry: Registry) -> None:
    limits = A2AServerLimits(header_timeout=0.2)

    async def body() -> None:
        async with serving(respond, registry, server_limits=limits) as server:
            host, port = server.url[7:-1].rsplit(":", 1)
            silent_reader, silent = await asyncio.open_connection(host, int(port))
            half_reader, half = await asyncio.open_connection(host, int(port))
            half.write(b"POST / HTTP/1.1\r\nHost: x\r\n")  # and never the end
            async with asyncio.timeout(10):
                assert await silent_reader.read() == b""
                assert await half_reader.read() == b""
            silent.close()
            half.close()
            async with httpx.AsyncClient() as http:  # a client that sends its request
                assert (await http.get(server.card_url)).status_code == 200

    run(body)


def test_each_request_has_a_deadline(registry: Registry) -> None:
    """A request whose body does not come in time is answered 408; one whose handler is
    slow is answered at the deadline with the task as it stands (the SDK's answer to a
    cut request), and the exchange ends later, within the handler's own deadline."""
    async def slow(message: Message, context: Context) -> Message | None:
        await asyncio.sleep(30)
        return None

    limits = A2AServerLimits(request_timeout=0.2, handler_timeout=0.5)
    request = message_to_a2a(parse(request_text(), registry=registry))
    call = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
            "params": {"message": json_format.MessageToDict(request)}}

    async def body() -> None:
        async with serving(slow, registry, server_limits=limits) as server, \
                sdk_client(server.url) as client:
            host, port = server.url[7:-1].rsplit(":", 1)
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{\"jsonrpc\"")  # and no more
            async with asyncio.timeout(10):
                answer = await reader.read()
            writer.close()
            assert answer.startswith(b"HTTP/1.1 408 ") and answer.endswith(b"request timeout")
            async with httpx.AsyncClient() as http:
                response = await http.post(server.url, json=call, headers=JSON_V1)
            task = json_format.ParseDict(response.json()["result"]["task"], Task())
            assert task.status.state == TaskState.TASK_STATE_SUBMITTED
            ended: list[Task] = []

            async def failed() -> bool:
                ended[:] = [await client.get_task(GetTaskRequest(id=task.id))]
                return ended[0].status.state == TaskState.TASK_STATE_FAILED

            async with asyncio.timeout(10):
                while not await failed():
                    await asyncio.sleep(0.02)
            assert notice(ended[0])["text"] == "the agent did not answer within 0.5 s"

    run(body)


def test_the_handler_has_a_deadline(registry: Registry) -> None:
    async def slow(message: Message, context: Context) -> Message:
        await asyncio.sleep(30)
        raise AssertionError("not reached")

    async def body() -> None:
        async with serving(slow, registry,
                           server_limits=A2AServerLimits(handler_timeout=0.2)) as server, \
                sdk_client(server.url) as client:
            task = (await send(client, message_to_a2a(parse(request_text(),
                                                               registry=registry)))).task
            refused = notice(task)
            assert refused["code"] == "agent-failed"
            assert refused["text"] == "the agent did not answer within 0.2 s"

    run(body)


def test_a_failing_handler_or_a_bad_reply_fails_the_task(registry: Registry) -> None:
    def raising(message: Message, context: Context) -> Message:
        raise RuntimeError("secret detail")

    def bad(message: Message, context: Context) -> Message:
        return context.reply(Intent.INFORM, (Symbol("inform-done"),))  # no :action-id

    def elsewhere(message: Message, context: Context) -> Message:
        reply = context.reply(Intent.INFORM, (Symbol("inform-done"), Keyword("action-id"),
                                              "x"))
        return Message(message_id=reply.message_id, sender=reply.sender,
                       receiver="agent://someone/else", intent=reply.intent,
                       protocol=reply.protocol, conversation_id=reply.conversation_id,
                       in_reply_to=reply.in_reply_to, body=reply.body)

    expected = {raising: "the agent failed: RuntimeError",
                bad: "the agent's reply was refused by its own checks (body)",
                elsewhere: "the agent's reply was refused by its own checks (parties)"}

    async def body() -> None:
        for handler, text in expected.items():
            async with serving(handler, registry) as server, \
                    sdk_client(server.url) as client:
                task = (await send(client, message_to_a2a(parse(request_text(),
                                                                   registry=registry)))).task
                refused = notice(task)
                assert refused["text"] == text and "secret" not in refused["text"]
                # The agent failed the conversation: it has ended.
                again = message_to_a2a(parse(request_text(mid="m-2"), registry=registry))
                assert notice((await send(client, again)).task)["code"] == "conversation"

    run(body)


def test_messages_per_conversation_at_n_and_n_plus_1(registry: Registry) -> None:
    """CFP and PROPOSE make two messages: with room for three the ACCEPT is taken, with
    room for two it is refused (``limit``) and the conversation stays as it was."""
    async def body() -> None:
        for room, state in ((3, TaskState.TASK_STATE_COMPLETED),
                            (2, TaskState.TASK_STATE_FAILED)):
            limits = A2AServerLimits(max_conversation_messages=room)
            async with serving(respond, registry, server_limits=limits) as server, \
                    sdk_client(server.url) as client:
                await send(client, message_to_a2a(parse(CFP, registry=registry)))
                task = (await send(client, message_to_a2a(parse(ACCEPT,
                                                                 registry=registry)))).task
                assert task.status.state == state
                if state == TaskState.TASK_STATE_FAILED:
                    refused = notice(task)
                    assert refused["code"] == "limit" and "holds 2 messages" in refused["text"]

    run(body)


def test_an_agent_is_served_with_its_handlers(registry: Registry) -> None:
    """A cbcl.Agent stands for the handler: its handler for the protocol and intent
    answers, and it is the agent the messages must be addressed to."""
    async def body() -> None:
        protocol = registry.get("request/v1")
        assert protocol is not None
        agent = Agent(AGENT, descriptors=[protocol])

        @agent.on("request/v1", "REQUEST")
        def done(message: Message, context: Context) -> Message:
            return context.reply(Intent.INFORM, (Symbol("inform-result"), Keyword("action-id"),
                                                 message.message_id, Keyword("result"), 42))

        try:
            async with serving(agent, None) as server, sdk_client(server.url) as client:
                task = (await send(client, message_to_a2a(parse(request_text(),
                                                                   registry=registry)))).task
                reply = read_a2a(task.status.message, registry=registry)[0]
                assert reply.body == (Symbol("inform-result"), Keyword("action-id"), "m-1",
                                      Keyword("result"), 42)
                elsewhere = parse(request_text(mid="m-2", cid="c-2", receiver="agent://x"),
                                  registry=registry)
                refused = notice((await send(client, message_to_a2a(elsewhere))).task)
                assert refused["code"] == "malformed"
        finally:
            await agent.close()

    run(body)


def test_a_replayed_message_id_is_refused(registry: Registry) -> None:
    async def body() -> None:
        async with serving(respond, registry) as server, sdk_client(server.url) as client:
            first = message_to_a2a(parse(request_text(), registry=registry))
            assert (await send(client, first)).task.status.state == \
                TaskState.TASK_STATE_COMPLETED
            replay = message_to_a2a(parse(request_text(cid="c-other"), registry=registry))
            assert notice((await send(client, replay)).task)["code"] == "replay"

    run(body)


def test_the_task_store_is_bounded_at_n_and_n_plus_1() -> None:
    context = ServerCallContext()

    def task(number: int, history: int = 0) -> Task:
        return Task(id=f"t-{number}", context_id="c",
                    status=TaskStatus(state=TaskState.TASK_STATE_COMPLETED),
                    history=[A2AMessage(message_id=f"m-{i}", parts=[Part(text="x" * 100)])
                             for i in range(history)])

    async def body() -> None:
        store = _BoundedTaskStore(max_tasks=3, max_bytes=1 << 20)
        for number in range(3):
            await store.save(task(number), context)
        assert len(store) == 3 and await store.get("t-0", context) is not None
        await store.save(task(3), context)  # N + 1: the oldest goes
        assert len(store) == 3 and await store.get("t-0", context) is None
        # In bytes: a store of B bytes keeps what fits, and trims a task larger than B.
        one = task(0, history=4).ByteSize()
        store = _BoundedTaskStore(max_tasks=100, max_bytes=2 * one)
        await store.save(task(0, history=4), context)
        await store.save(task(1, history=4), context)
        assert len(store) == 2 and store.total == 2 * one
        await store.save(task(2, history=4), context)
        assert len(store) == 2 and await store.get("t-0", context) is None
        await store.save(task(9, history=40), context)
        kept = await store.get("t-9", context)
        assert kept is not None and 0 < len(kept.history) < 40
        assert store.total <= 2 * one
        with pytest.raises(A2AError, match="not offered"):
            await store.list(ListTasksRequest(), context)

    run(body)


def test_open_conversations_are_bounded_at_n_and_n_plus_1(registry: Registry) -> None:
    protocol = registry.get("request/v1")
    assert protocol is not None and protocol.descriptor.conversation is not None
    machine = compile_machine(protocol.descriptor.conversation,
                              intents=protocol.descriptor.intents)
    table = _Conversations({"request/v1": machine}, max_open=2, replay_window=2)
    messages = [parse(request_text(mid=f"m-{n}", cid=f"c-{n}"), registry=registry)
                for n in range(3)]
    threads = []
    for message in messages[:2]:
        thread = table.thread(message)
        assert thread is not None
        thread.conversation.receive(message, now=0)
        threads.append(thread)
    assert len(table) == 2 and table.thread(messages[0]) is threads[0]
    table.thread(messages[2])  # N + 1: the least recently used (c-1) goes
    assert len(table) == 2 and table.thread(messages[1]) is not threads[1]
    # The replay window holds N ids: after N + 1, the first is forgotten.
    for message in messages:
        table.remember(message)
    for message in messages[1:]:
        with pytest.raises(ProtocolError, match="replay"):
            table.check_replay(message)
    table.check_replay(messages[0])


def test_the_limits_and_their_options_agree() -> None:
    defaults = A2AServerLimits()
    options = {option[0][2:].replace("-", "_"): option[4] for option in SERVER_OPTIONS}
    assert options == {field.name: getattr(defaults, field.name) for field in fields(defaults)}
    for bad in ({"handler_timeout": 0}, {"max_tasks": 0}, {"request_timeout": float("nan")},
                {"max_request_bytes": 0}, {"max_task_bytes": 1023}):
        with pytest.raises(ValueError):
            A2AServerLimits(**bad)


def test_only_loopback_unless_allowed(registry: Registry) -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.org")

    async def body() -> None:
        with pytest.raises(ValueError, match="not a loopback address"):
            await serve_a2a(respond, registry=registry, listen="0.0.0.0:0")
        with pytest.raises(ValueError, match="HOST:PORT"):
            await serve_a2a(respond, registry=registry, listen="127.0.0.1")

    run(body)


# --------------------------------------------------------------------------- signatures


def test_required_signatures_and_the_identity_a_handler_sees(tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    (tmp_path / "planner.pub").write_bytes(public_key_pem(key.public_key()))
    store = TrustStore.from_directory(tmp_path)
    registry = Registry(trust=store, disk_cache=False, isolate=False)
    registry.load(DESCRIPTORS[0].read_bytes(), allow_unsigned=True)
    seen: list[object] = []

    def answer(message: Message, context: Context) -> Message | None:
        seen.append(context.identity)
        return respond(message, context)

    async def body() -> None:
        async with serving(answer, registry, require_signatures=True) as server, \
                sdk_client(server.url) as client:
            unsigned = message_to_a2a(parse(request_text(), envelope_only=True))
            refused = notice((await send(client, unsigned)).task)
            assert refused["text"] == "trust: message verification failed"  # no reason
            assert refused["code"] == "untrusted-signer"
            signed = sign_message(parse(request_text(mid="m-2", cid="c-2"),
                                        envelope_only=True), key, "planner")
            task = (await send(client, message_to_a2a(signed))).task
            assert task.status.state == TaskState.TASK_STATE_COMPLETED
        (identity,) = seen
        assert isinstance(identity, Identity) and identity.key_id == "planner"
        assert identity.name == URI("agent://ops/planner")

    run(body)


# --------------------------------------------------------------------------- CBCL's client


def test_cbcls_client_against_cbcl_a2a_serve(registry: Registry) -> None:
    async def body() -> None:
        async with serving(respond, registry, name=AGENT) as server, \
                A2AClient(server.url, registry=registry) as client:
            assert {p.id for p in await client.protocols()} == {
                "request/v1", "contract-net/v1", "task-assignment/v1"}
            proposed = await client.send(parse(CFP, registry=registry))
            assert proposed.state == "TASK_STATE_INPUT_REQUIRED"
            assert [m.intent for m in proposed.messages] == [Intent.PROPOSE]
            done = await client.send(parse(ACCEPT, registry=registry))
            assert done.task_id == proposed.task_id  # it named the task awaiting it
            assert done.state == "TASK_STATE_COMPLETED" and done.context_id == "job-1"
            assert [m.intent for m in done.messages] == [Intent.INFORM]
            # Refused locally, before it leaves: the body, then the conversation.
            with pytest.raises(BodyError):
                await client.send(parse(request_text(body="(action)"), envelope_only=True))
            with pytest.raises(ConversationError, match="has finished"):
                await client.send(parse(ACCEPT.replace('"cn-2"', '"cn-3"'),
                                        registry=registry))
            # Refused by the agent: ConversationClosed with the reason code.
            elsewhere = parse(request_text(receiver="agent://not/here"), registry=registry)
            with pytest.raises(ConversationClosed) as info:
                await client.send(elsewhere)
            assert info.value.reason == "malformed" and "agent://not/here" in str(info.value)

    run(body)


def test_cbcls_client_bounds_the_response_at_n_and_n_plus_1(registry: Registry) -> None:
    async def body() -> None:
        async with serving(respond, registry) as server:
            async with httpx.AsyncClient() as http:
                size = len((await http.get(server.card_url)).content)
            async with A2AClient(server.url, registry=registry,
                                 max_response_bytes=size) as client:
                await client.card()
            async with A2AClient(server.url, registry=registry,
                                 max_response_bytes=size - 1) as client:
                with pytest.raises(LimitError, match=f"larger than {size - 1} bytes"):
                    await client.card()

    run(body)


def test_cbcls_client_has_a_deadline(registry: Registry) -> None:
    async def slow(message: Message, context: Context) -> Message | None:
        await asyncio.sleep(5)
        return None

    async def body() -> None:
        # (the server gives up at 0.6 s, so that it stops at once after the test)
        async with serving(slow, registry,
                           server_limits=A2AServerLimits(handler_timeout=0.6)) as server, \
                A2AClient(server.url, registry=registry, timeout=0.3) as client:
            with pytest.raises(ConnectionLost, match=r"no answer within 0\.3 s"):
                await client.send(parse(request_text(), registry=registry))

    run(body)


class _Scripted(AgentExecutor):
    """A plain SDK agent (no CBCL code): it answers each message with the A2A message
    ``script`` makes of it, in message mode."""

    def __init__(self, script: Callable[[A2AMessage], A2AMessage]) -> None:
        self.script = script

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.message is not None
        await event_queue.enqueue_event(self.script(context.message))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise NotImplementedError


@contextlib.asynccontextmanager
async def sdk_server(script: Callable[[A2AMessage], A2AMessage]) -> AsyncIterator[str]:
    """An agent built with the SDK alone (its request handler, routes and in-memory
    store), served by uvicorn on a loopback socket; yields its URL."""
    config = uvicorn.Config(Starlette(), log_config=None, access_log=False, ws="none")
    server = uvicorn.Server(config)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/"
    card = AgentCard(name="plain", description="a plain SDK agent", version="1",
                     supported_interfaces=[AgentInterface(url=url, protocol_binding="JSONRPC",
                                                          protocol_version="1.0")],
                     capabilities=AgentCapabilities(), default_input_modes=["text/plain"],
                     default_output_modes=["text/plain"],
                     skills=[AgentSkill(id="echo", name="echo", description="answers",
                                        tags=["test"])])
    handler = DefaultRequestHandler(agent_executor=_Scripted(script),
                                    task_store=InMemoryTaskStore(), agent_card=card)
    config.app = Starlette(routes=[*create_agent_card_routes(card),
                                   *create_jsonrpc_routes(handler, rpc_url="/")])
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(10):
            while not server.started:
                await asyncio.sleep(0.01)
        yield url
    finally:
        server.should_exit = True
        await task
        await handler.aclose()
        sock.close()


def test_cbcls_client_against_an_sdk_built_server(registry: Registry) -> None:
    """The reply comes as a Message (no task); it is read strictly and must go from the
    agent to us, in our conversation."""
    request = parse(request_text(), registry=registry)

    def reply_text(**changes: str) -> str:
        fields_ = {"sender": AGENT, "receiver": "agent://ops/planner",
                   "body": '(inform-done :action-id "m-1")', "cid": "c-1"}
        fields_.update(changes)
        return (f'(CBCL/1.0 (message-id "r-1") (sender {fields_["sender"]}) (receiver '
                f'{fields_["receiver"]}) (intent INFORM) (protocol request/v1) '
                f'(conversation-id "{fields_["cid"]}") (in-reply-to "m-1") '
                f'(body {fields_["body"]}))')

    def answering(text: str, extra: bool = False) -> Callable[[A2AMessage], A2AMessage]:
        def script(incoming: A2AMessage) -> A2AMessage:
            answer = message_to_a2a(parse(text, envelope_only=True), role=Role.ROLE_AGENT)
            answer.context_id = incoming.context_id
            if extra:
                answer.metadata.update({"trace": "x"})
            return answer
        return script

    cases: list[tuple[Callable[[A2AMessage], A2AMessage], type[Exception] | None]] = [
        (answering(reply_text()), None),
        (answering(reply_text(sender="agent://mallory")), ProtocolError),
        (answering(reply_text(cid="c-9")), ProtocolError),
        (answering(reply_text(body="(inform-done)")), BodyError),
        (answering(reply_text(), extra=True), LossyConversionError),
    ]

    async def body() -> None:
        for script, error in cases:
            async with sdk_server(script) as url, A2AClient(url, registry=registry) as client:
                if error is None:
                    answer = await client.send(request)
                    assert answer.task_id is None and answer.state is None
                    (reply,) = answer.messages
                    assert reply.intent is Intent.INFORM and reply.in_reply_to == "m-1"
                else:
                    with pytest.raises(error):
                        await client.send(request)

    run(body)


# --------------------------------------------------------------------------- the CLI


def _cli(*args: str, **options: Any) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "cbcl", *args], text=True, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **options)


@pytest.mark.slow
def test_cbcl_a2a_serve_and_cbcl_send_a2a(tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    (tmp_path / "planner.key").write_bytes(private_key_pem(key))
    trust = tmp_path / "trust"
    trust.mkdir()
    (trust / "planner.pub").write_bytes(public_key_pem(key.public_key()))
    # The shipped descriptors' signer (descriptors/keys/README.md: for examples only).
    (trust / "cbcl-example.pub").write_bytes(
        (ROOT / "descriptors" / "keys" / "cbcl-example.pub").read_bytes())
    (tmp_path / "request.cbcl").write_text(request_text())
    (tmp_path / "elsewhere.cbcl").write_text(request_text(mid="m-2", cid="c-2",
                                                          receiver="agent://not/here"))
    descriptor = str(ROOT / "descriptors" / "request-v1.signed.cbcl")
    server = _cli("a2a", "serve", "--descriptor", descriptor, "--trust", str(trust),
                  "--require-signatures", "--name", AGENT)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        found = re.search(r"at (http://127\.0\.0\.1:\d+/) ", line)
        assert found, line
        url = found.group(1)
        sent = subprocess.run(
            [sys.executable, "-m", "cbcl", "send", "--a2a", url, str(tmp_path / "request.cbcl"),
             "--descriptor", descriptor, "--key", str(tmp_path / "planner.key")],
            capture_output=True, text=True, timeout=60, env={**os.environ,
                                                             "PYTHONPATH": str(ROOT)})
        assert sent.returncode == 0, sent.stderr
        reply = parse(sent.stdout.strip(), envelope_only=True)
        assert reply.intent is Intent.INFORM and reply.in_reply_to == "m-1"
        refused = subprocess.run(
            [sys.executable, "-m", "cbcl", "send", "--a2a", url,
             str(tmp_path / "elsewhere.cbcl"), "--descriptor", descriptor,
             "--key", str(tmp_path / "planner.key")],
            capture_output=True, text=True, timeout=60, env={**os.environ,
                                                             "PYTHONPATH": str(ROOT)})
        assert refused.returncode == 5, refused.stderr  # malformed: NOT-UNDERSTOOD's exit
        assert refused.stderr.startswith("send: a2a: the agent refused the message: ")
        assert refused.stdout == ""
    finally:
        server.send_signal(signal.SIGTERM)
        out, err = server.communicate(timeout=30)
    assert server.returncode == 0, err
    assert 'sent "' in out and "INFORM (TASK_STATE_COMPLETED)" in out  # the events
    assert "refused: session: " in out and out.rstrip().endswith("a2a: stopped")


def test_cli_usage_errors(tmp_path: Path) -> None:
    from cbcl.cli import main

    with pytest.raises(SystemExit) as info:
        main(["a2a", "serve"])
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:
        main(["a2a", "serve", "--descriptor", str(DESCRIPTORS[0]), "--allow-unsigned",
              "--listen", "0.0.0.0:0"])
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:
        main(["a2a", "serve", "--max-tasks", "0"])
    assert info.value.code == 2
    (tmp_path / "m.cbcl").write_text(request_text())
    with pytest.raises(SystemExit) as info:
        main(["send", "--a2a", "http://127.0.0.1:9/", "--connect", "127.0.0.1:9",
              str(tmp_path / "m.cbcl"), "--descriptor", str(DESCRIPTORS[0]),
              "--key", str(tmp_path / "none.key")])
    assert info.value.code == 2
