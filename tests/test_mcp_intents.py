"""MCP for any protocol (issue 31.5, spec/interop.md §5.3): ``cbcl mcp --descriptor D``
serves one tool per intent of D, with the JSON Schema export as its ``inputSchema`` and an
``outputSchema`` its ``structuredContent`` meets; with ``--handler`` the result is the
agent's reply. Driven by the real MCP SDK client against ``python -m cbcl mcp`` over stdio
(the client itself checks every structured result against the tool's output schema)."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from mcp import Client, StdioServerParameters
from mcp_types import CallToolResult, TextContent

from cbcl import Agent, Intent, Registry, parse
from cbcl.bridges._mcp import intent_tool_name, intent_tools, protocol_server
from cbcl.cli._main import main
from cbcl.json_mapping import message_to_json
from cbcl.llm import export_json_schema

ROOT = Path(__file__).parent.parent
CONTRACT_NET = ROOT / "descriptors" / "contract-net-v1.cbcl"
REQUEST_V1 = ROOT / "descriptors" / "request-v1.cbcl"
CFP = (b'(CBCL/1.0 (message-id "m-1") (sender agent://manager) (receiver agent://contractor) '
       b'(intent CFP) (protocol contract-net/v1) (conversation-id "c-1") (body (cfp :task '
       b'(task :id "t-1" :action paint) :deadline 1700000000)))')
HANDLER = """
from decimal import Decimal
from cbcl import Keyword, Symbol, Message

def respond(message, context):
    task_id = str(message.body[2][2]) if message.intent.value == "CFP" else None
    action = str(message.body[2][4]) if task_id else ""
    if action == "paint":
        return context.reply("PROPOSE", (Symbol("proposal"), Keyword("task-id"), "t-1",
                                         Keyword("bid"), (Symbol("bid"), Keyword("price"),
                                         Decimal("12.50"), Keyword("currency"), Symbol("EUR"))))
    if action == "boom":
        raise RuntimeError("secret internals")
    if action == "wrong":
        return context.reply("NOT-UNDERSTOOD", "what?")
    if action == "bad":
        return context.reply("PROPOSE", (Symbol("proposal"),))
    if message.intent.value == "ACCEPT":
        return context.reply("INFORM", (Symbol("inform-done"), Keyword("task-id"), "t-1"))
    return None
"""

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def cfp(action: str = "paint", deadline: int = 1700000000) -> dict[str, Any]:
    text = CFP.replace(b"paint", action.encode()).replace(b"1700000000", str(deadline).encode())
    return message_to_json(parse(text, envelope_only=True))


def text_of(result: CallToolResult) -> str:
    assert len(result.content) == 1 and isinstance(result.content[0], TextContent)
    return result.content[0].text


def registry() -> Registry:
    found = Registry(disk_cache=False, isolate=False)
    found.load(CONTRACT_NET.read_bytes(), allow_unsigned=True)
    return found


@pytest.fixture(scope="module")
async def checker(anyio_backend: str) -> AsyncIterator[Client]:
    """``cbcl mcp --descriptor contract-net-v1`` (no handler): the intent tools check."""
    server = StdioServerParameters(
        command=sys.executable, cwd=str(ROOT),
        args=["-m", "cbcl", "mcp", "--descriptor", str(CONTRACT_NET), "--allow-unsigned"])
    async with Client(server, read_timeout_seconds=60) as client:
        yield client


async def test_one_tool_per_intent_with_the_export_as_its_schemas(checker: Client) -> None:
    listed = {tool.name: tool for tool in (await checker.list_tools()).tools}
    descriptor = registry().get("contract-net/v1")
    assert descriptor is not None
    for intent in descriptor.descriptor.intents:
        tool = listed[f"contract-net_v1.{intent.value}"]
        schema = export_json_schema(descriptor.descriptor, intent=intent)
        assert tool.input_schema == schema
        assert tool.output_schema == schema  # no handler: the result is the message
        assert intent.value in (tool.description or "")
    assert {"parse", "canonical", "check", "export", "prompt"} <= set(listed)
    capabilities = checker.server_capabilities
    assert capabilities.tools is not None
    assert capabilities.resources is None and capabilities.prompts is None


async def test_a_message_is_checked_and_returned_as_structured_content(checker: Client
                                                                       ) -> None:
    # (the SDK's client validates structured content against the output schema itself,
    # and raises if it does not conform)
    result = await checker.call_tool("contract-net_v1.CFP", cfp())
    assert not result.is_error
    assert result.structured_content == cfp()
    assert text_of(result).encode() == CFP


@pytest.mark.parametrize(("tool", "arguments", "starts"), [
    ("contract-net_v1.CFP", cfp(deadline=-1), "schema"),  # :deadline (integer :min 0)
    ("contract-net_v1.PROPOSE", cfp(), "malformed: the tool contract-net_v1.PROPOSE takes"),
    ("contract-net_v1.CFP", {**cfp(), "body": 1.5}, "malformed: the JSON number 1.5"),
    ("contract-net_v1.CFP", {**cfp(), "sender": "nobody"}, "malformed"),
    ("contract-net_v1.CFP", {**cfp(), "extra": 1}, "malformed"),
    ("contract-net_v1.CFP", {"body": [{"symbol": "cfp"}]}, "malformed: the message has no"),
    ("contract-net_v1.CFP", {**cfp(), "body": [{"symbol": "cfp"}]}, "body"),
    ("no-such-tool", {}, "usage: unknown tool"),
])
async def test_refusals_are_is_error_results(checker: Client, tool: str,
                                             arguments: dict[str, Any], starts: str) -> None:
    result = await checker.call_tool(tool, arguments)
    assert result.is_error and text_of(result).startswith(starts), text_of(result)
    assert result.structured_content is not None
    assert result.structured_content["error"]["kind"] == starts.split(":")[0]


async def test_a_handler_answers_and_its_reply_is_the_result(tmp_path: Path) -> None:
    (tmp_path / "handler.py").write_text(textwrap.dedent(HANDLER))
    server = StdioServerParameters(
        command=sys.executable, cwd=str(tmp_path),
        args=["-m", "cbcl", "mcp", "--descriptor", str(CONTRACT_NET), "--descriptor",
              str(REQUEST_V1), "--allow-unsigned", "--handler", "handler:respond"])
    async with Client(server, read_timeout_seconds=60) as client:
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
        # Only the intent tools of both protocols: CBCL's own are not served with a handler.
        assert set(listed) == {
            intent_tool_name(protocol, intent)
            for protocol, intents in (("contract-net/v1", ("CFP", "PROPOSE", "REFUSE",
                                                           "ACCEPT", "REJECT", "INFORM",
                                                           "FAILURE")),
                                      ("request/v1", ("REQUEST", "AGREE", "REFUSE",
                                                      "FAILURE", "INFORM")))
            for intent in map(Intent, intents)}
        whole = export_json_schema(registry().get("contract-net/v1").descriptor)  # type: ignore[union-attr]
        assert listed["contract-net_v1.CFP"].output_schema == {**whole, "type": "object"}

        result = await client.call_tool("contract-net_v1.CFP", cfp())
        assert not result.is_error, text_of(result)
        reply = result.structured_content
        assert reply is not None and reply["intent"] == "PROPOSE"
        assert reply["in-reply-to"] == "m-1" and reply["conversation-id"] == "c-1"
        assert reply["sender"] == "agent://contractor" and reply["receiver"] == "agent://manager"
        assert reply["body"][4] == [{"symbol": "bid"}, {"keyword": "price"},
                                    {"decimal": "12.50"}, {"keyword": "currency"},
                                    {"symbol": "EUR"}]
        assert parse(text_of(result), registry=registry()).intent is Intent.PROPOSE

        accept = {**cfp(), "intent": "ACCEPT", "message-id": "m-2",
                  "body": [{"symbol": "accept-proposal"}, {"keyword": "task-id"}, "t-1"]}
        result = await client.call_tool("contract-net_v1.ACCEPT", accept)
        assert not result.is_error and result.structured_content is not None
        assert result.structured_content["intent"] == "INFORM"

        result = await client.call_tool("contract-net_v1.CFP", cfp("boom"))
        assert result.is_error and text_of(result) == "the agent failed: RuntimeError"
        result = await client.call_tool("contract-net_v1.CFP", cfp("wrong"))
        assert result.is_error and text_of(result).startswith(
            "the agent answered NOT-UNDERSTOOD of contract-net/v1, which contract-net/v1 "
            "does not govern")
        result = await client.call_tool("contract-net_v1.CFP", cfp("bad"))
        assert result.is_error and text_of(result).startswith("body")
        result = await client.call_tool("contract-net_v1.CFP", cfp("silent"))
        assert result.is_error and text_of(result) == "the agent did not answer"


def test_tool_names_and_their_refusals() -> None:
    assert intent_tool_name("contract-net/v1", Intent.CFP) == "contract-net_v1.CFP"
    assert intent_tool_name("a+b/v1", Intent.NOT_UNDERSTOOD) == "a_b_v1.NOT-UNDERSTOOD"
    tools = intent_tools(registry())
    assert [tool.name for tool in tools][:2] == ["contract-net_v1.CFP",
                                                 "contract-net_v1.PROPOSE"]
    assert all(tool.handler is None and tool.output_schema == tool.input_schema
               for tool in tools)
    assert json.dumps(tools[0].input_schema)  # plain JSON, as MCP sends it


async def test_an_agent_serves_the_intents_it_handles(anyio_backend: str) -> None:
    """In memory, with an :class:`~cbcl.Agent`: only the intents it has a handler for are
    tools, answered by that handler."""
    spec: dict[str, Any] = {}
    exec(textwrap.dedent(HANDLER), spec)
    agent = Agent("agent://contractor")
    agent.on("contract-net/v1", "CFP")(spec["respond"])
    try:
        server = protocol_server(registry(), handler=agent)
        async with Client(server) as client:
            listed = [tool.name for tool in (await client.list_tools()).tools]
            assert listed == ["contract-net_v1.CFP"]
            result = await client.call_tool("contract-net_v1.CFP", cfp())
            assert not result.is_error and result.structured_content is not None
            assert result.structured_content["intent"] == "PROPOSE"
            assert client.server_capabilities.resources is None
    finally:
        await agent.close()


@pytest.mark.parametrize(("args", "says"), [
    (["--handler", "handler:respond"], "--handler needs --descriptor"),
    (["--descriptor", str(CONTRACT_NET), "--allow-unsigned", "--handler", "handler:respond",
      "--tool", "x"], "--tool needs --descriptor of request/v1"),
    (["--tool", "x"], "--tool needs --handler"),
    (["--max-line-bytes", "0"], "expected an integer from 1"),
])
def test_cbcl_mcp_usage_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str], args: list[str],
                               says: str) -> None:
    (tmp_path / "handler.py").write_text(textwrap.dedent(HANDLER))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # (load_handler adds the directory)
    try:
        with pytest.raises(SystemExit) as stopped:
            main(["mcp", *args])
    finally:
        sys.modules.pop("handler", None)
    assert stopped.value.code == 2 and says in capsys.readouterr().err
