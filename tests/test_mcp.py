"""CBCL over MCP with the real mcp SDK (cbcl/bridges/_mcp.py, spec/interop.md §5): ``cbcl mcp``
as a real stdio subprocess driven by the SDK's client, the tools' hostile input, and the
bridge that serves a request/v1 agent as MCP tools, in memory and over stdio.

Tests internals too: ``BridgeTool`` (the tool type ``bridge_server`` takes) and
``plain_to_value``, from ``cbcl.bridges._mcp``."""

from __future__ import annotations

import sys
import textwrap
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from mcp import Client, StdioServerParameters
from mcp_types import CallToolResult, TextContent

from cbcl import Agent, Keyword, Message, Registry, Symbol, parse
from cbcl.bridges._mcp import BridgeTool, plain_to_value
from cbcl.interop import bridge_server, tools_server
from cbcl.net import Context

ROOT = Path(__file__).parent.parent
REQUEST_V1 = ROOT / "descriptors" / "request-v1.cbcl"
GRAMMARS = ROOT / "spec" / "vectors" / "grammars"
MESSAGE = (
    '(CBCL/1.0 (message-id "m-1") (sender agent://a) (receiver agent://b) (intent REQUEST) '
    '(protocol request/v1) (conversation-id "c-1") (body (request :action (action :name '
    'backup :args (:size 1800000 :ratio 0.5)))))')

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def registry() -> Registry:
    reg = Registry(disk_cache=False, isolate=False)
    reg.load(REQUEST_V1.read_bytes(), allow_unsigned=True)
    return reg


def text_of(result: CallToolResult) -> str:
    assert len(result.content) == 1
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


@pytest.fixture(scope="module")
async def stdio_client(anyio_backend: str) -> AsyncIterator[Client]:
    """``python -m cbcl mcp`` in a subprocess, with the SDK's stdio client; the context
    manager stops the process when the module's tests end, failed or not."""
    server = StdioServerParameters(
        command=sys.executable, cwd=str(ROOT),
        args=["-m", "cbcl", "mcp", "--descriptor", str(REQUEST_V1), "--allow-unsigned"])
    async with Client(server, read_timeout_seconds=60) as client:
        yield client


# --------------------------------------------------------------------------- cbcl mcp


async def test_stdio_lists_the_tools(stdio_client: Client) -> None:
    listed = await stdio_client.list_tools()
    names = [tool.name for tool in listed.tools]
    # CBCL's tools, then one per intent of the descriptor loaded (tests/test_mcp_intents.py)
    assert names == ["parse", "canonical", "check", "export", "prompt", "request_v1.REQUEST",
                     "request_v1.AGREE", "request_v1.REFUSE", "request_v1.FAILURE",
                     "request_v1.INFORM"]
    for tool in listed.tools:
        assert tool.description and tool.input_schema["type"] == "object"
    # Only what is served is advertised: tools, not resources or prompts.
    capabilities = stdio_client.server_capabilities
    assert capabilities.tools is not None
    assert capabilities.resources is None and capabilities.prompts is None


async def test_stdio_parse_and_canonical(stdio_client: Client) -> None:
    result = await stdio_client.call_tool("parse", {"message": MESSAGE})
    assert not result.is_error
    assert text_of(result) == parse(MESSAGE, envelope_only=True).canonical()
    result = await stdio_client.call_tool("parse", {"message": MESSAGE, "json": True})
    assert '"size"}, 1800000,' in text_of(result)
    result = await stdio_client.call_tool("canonical", {"document": "(a  ; note\n b)"})
    assert text_of(result) == "(a b)"


async def test_stdio_errors_are_tool_errors_with_the_error_line(stdio_client: Client) -> None:
    result = await stdio_client.call_tool("parse", {"message": MESSAGE[:-3]})
    assert result.is_error
    assert text_of(result) == "malformed 1:210: 3 unclosed list(s) at the end of the input"
    assert result.structured_content == {"error": {"kind": "malformed", "exit": 3, "line": 1,
                                                   "column": 210, "offset": 209}}
    # A body its grammar refuses (pass 2), and a schema violation.
    bad_body = MESSAGE.replace(":name backup", ":nom backup")
    result = await stdio_client.call_tool("parse", {"message": bad_body})
    assert result.is_error and text_of(result).startswith("body 1:")
    unknown = MESSAGE.replace("request/v1", "other/v1")
    result = await stdio_client.call_tool("parse", {"message": unknown})
    assert result.is_error and text_of(result).startswith("unknown-protocol 1:")
    result = await stdio_client.call_tool("parse", {"message": unknown, "envelope_only": True})
    assert not result.is_error
    # Invisible characters never reach the client raw.
    result = await stdio_client.call_tool("canonical", {"document": "(a \u202e"})
    assert result.is_error and "\u202e" not in text_of(result)


async def test_stdio_check_export_prompt(stdio_client: Client) -> None:
    good = (GRAMMARS / "layered-expression.lark").read_text()
    result = await stdio_client.call_tool("check", {"grammar": good})
    assert not result.is_error and text_of(result).startswith("LALR(1)")
    not_lalr = (GRAMMARS / "classic-lr1-not-lalr1.lark").read_text()
    result = await stdio_client.call_tool("check", {"grammar": not_lalr})
    assert result.is_error and result.structured_content == {"verdict": "LR(1) but not LALR(1)"}
    result = await stdio_client.call_tool("check", {"grammar": "body: ("})
    assert result.is_error and text_of(result).startswith("rejected\ngrammar 1:7:")
    result = await stdio_client.call_tool("check", {"grammar": REQUEST_V1.read_text()})
    assert not result.is_error and text_of(result).startswith("LALR(1)")

    result = await stdio_client.call_tool("export", {"protocol": "request/v1",
                                                     "format": "gbnf"})
    assert not result.is_error and "root ::=" in text_of(result)
    result = await stdio_client.call_tool("export", {"descriptor": REQUEST_V1.read_text(),
                                                     "format": "json-schema",
                                                     "intent": "INFORM"})
    assert not result.is_error and '"$schema"' in text_of(result)
    assert result.structured_content is not None
    assert result.structured_content["intents"] == ["INFORM"]
    result = await stdio_client.call_tool("export", {"protocol": "request/v1",
                                                     "format": "yacc"})
    assert result.is_error and text_of(result).startswith("usage: unknown format")

    result = await stdio_client.call_tool("prompt", {"protocol": "request/v1",
                                                     "intent": "REQUEST"})
    assert not result.is_error and "protocol request/v1" in text_of(result)
    result = await stdio_client.call_tool("prompt", {"descriptor": REQUEST_V1.read_text()})
    assert not result.is_error and "## Messages" in text_of(result)
    result = await stdio_client.call_tool("prompt", {"protocol": "request/v1",
                                                     "intent": "SHOUT"})
    assert result.is_error and "not an intent" in text_of(result)


@pytest.mark.parametrize(("tool", "arguments", "starts"), [
    ("parse", {"message": "x" * 2_000_000}, "limit: message: "),
    ("parse", {"message": 7}, "Error executing tool parse"),
    ("canonical", {"document": "(" * 100}, "limit 1:65:"),
    ("export", {}, "usage: give exactly one"),
    ("export", {"protocol": "nope"}, "unknown-protocol: unknown protocol nope"),
    ("export", {"descriptor": "(protocol-descriptor (id x))"}, "descriptor"),
    ("prompt", {"descriptor": "(signed-descriptor"}, "malformed"),
    ("prompt", {"protocol": "request/v1", "examples": 10_000}, "Error executing tool prompt"),
    ("check", {"grammar": "\x00"}, "rejected"),
    ("nonexistent", {}, "usage: unknown tool nonexistent"),
])
async def test_stdio_hostile_arguments(stdio_client: Client, tool: str,
                                       arguments: dict[str, Any], starts: str) -> None:
    result = await stdio_client.call_tool(tool, arguments)
    assert result.is_error
    assert starts in text_of(result)
    # The server is still there.
    assert not (await stdio_client.call_tool("canonical", {"document": "(ok)"})).is_error


async def test_in_memory_tools(registry: Registry) -> None:
    async with Client(tools_server(registry)) as client:
        result = await client.call_tool("parse", {"message": MESSAGE})
        assert text_of(result) == parse(MESSAGE, registry=registry).canonical()
        # (A lone surrogate cannot cross stdio: the SDK's client cannot encode it. In
        # memory it reaches the tool, which refuses it.)
        result = await client.call_tool("parse", {"message": "(a \udcff)"})
        assert result.is_error and text_of(result).startswith("malformed")


# --------------------------------------------------------------------------- the bridge


def _action(message: Message) -> tuple[str, dict[str, Any]]:
    body = message.body
    assert isinstance(body, tuple)
    action = body[2]
    assert isinstance(action, tuple)
    name = str(action[2])
    args = action[4] if len(action) > 4 else ()
    assert isinstance(args, tuple)
    return name, {str(args[i]): args[i + 1] for i in range(0, len(args), 2)}


def respond(message: Message, context: Context) -> Any:
    """A request/v1 participant: ``add`` answers with the sum, ``backup`` agrees and then
    reports it done, ``fail``/``refuse`` say so, ``boom`` raises, ``bad`` answers with a
    body its grammar refuses, ``silent`` says nothing."""
    name, args = _action(message)
    if name == "add":
        return context.reply("INFORM", (Symbol("inform-result"), Keyword("action-id"), "a-1",
                                        Keyword("result"), args["a"] + args["b"]))
    if name == "backup":
        return [context.reply("AGREE", (Symbol("agree"), Keyword("action-id"), "a-2")),
                context.reply("INFORM", (Symbol("inform-done"), Keyword("action-id"), "a-2"))]
    if name == "fail":
        return context.reply("FAILURE", (Symbol("failure"), Keyword("action-id"), "a-3",
                                         Keyword("reason"), "disk full"))
    if name == "refuse":
        return context.reply("REFUSE", (Symbol("refuse"), Keyword("action-id"), "a-4",
                                        Keyword("reason"), "not today"))
    if name == "boom":
        raise RuntimeError("secret internals")
    if name == "bad":
        return context.reply("INFORM", (Symbol("inform-done"),))
    return None


TOOLS: list[BridgeTool | str] = [
    BridgeTool("add", "add two integers", {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"], "additionalProperties": False}),
    "backup", "fail", "refuse", "boom", "bad", "silent",
]


async def test_bridge_in_memory(registry: Registry) -> None:
    async with Client(bridge_server(respond, TOOLS, registry=registry)) as client:
        listed = await client.list_tools()
        assert [tool.name for tool in listed.tools] == [
            "add", "backup", "fail", "refuse", "boom", "bad", "silent"]
        assert listed.tools[0].input_schema["required"] == ["a", "b"]

        result = await client.call_tool("add", {"a": 2, "b": 40})
        assert not result.is_error and text_of(result) == "42"
        assert result.structured_content is not None
        assert result.structured_content["result"] == 42
        assert result.structured_content["state"] == "done"
        reply = parse(result.structured_content["message"], registry=registry)
        assert reply.intent == "INFORM" and reply.in_reply_to is not None

        result = await client.call_tool("backup", {"paths": ["/a", "/b"], "full": True})
        assert not result.is_error and text_of(result) == "done"

        for tool, expected in (("fail", "failure: disk full"), ("refuse", "refused: not today"),
                               ("boom", "the agent failed: RuntimeError"),
                               ("silent", "the agent did not answer")):
            result = await client.call_tool(tool, {})
            assert result.is_error, tool
            assert text_of(result) == expected
        result = await client.call_tool("bad", {})
        assert result.is_error and text_of(result).startswith("body 1:")

        # Arguments: checked by the tool's JSON Schema, then mapped to CBCL values.
        result = await client.call_tool("add", {"a": "2", "b": 40})
        assert result.is_error and text_of(result).startswith("malformed: arguments $.a")
        result = await client.call_tool("backup", {"x": None})
        assert result.is_error and "null has no CBCL value" in text_of(result)
        result = await client.call_tool("backup", {"bad key": 1})
        assert result.is_error and "is not a keyword name" in text_of(result)
        result = await client.call_tool("backup", {"n": float("inf")})
        assert result.is_error
        result = await client.call_tool("nope", {})
        assert result.is_error and text_of(result).startswith("usage: unknown tool")


async def test_bridge_serves_an_agent(registry: Registry) -> None:
    agent = Agent("agent://ops/backup")
    agent.on("request/v1", "REQUEST")(respond)
    try:
        async with Client(bridge_server(agent, ["add"], registry=registry)) as client:
            result = await client.call_tool("add", {"a": 1, "b": 2})
            assert text_of(result) == "3"
            assert result.structured_content is not None
            message = parse(result.structured_content["message"], registry=registry)
            assert str(message.sender) == "agent://ops/backup"
    finally:
        await agent.close()


async def test_bridge_async_handler_and_timeout(registry: Registry) -> None:
    async def slow(message: Message, context: Context) -> Message:
        await anyio.sleep(5)
        raise AssertionError("not reached")

    async def quick(message: Message, context: Context) -> Message:
        return context.reply("INFORM", (Symbol("inform-result"), Keyword("action-id"), "q",
                                        Keyword("result"), "fine"))

    async with Client(bridge_server(slow, ["wait"], registry=registry, timeout=0.2)) as c:
        result = await c.call_tool("wait", {})
        assert result.is_error and text_of(result) == "the agent did not answer within 0.2 s"
    async with Client(bridge_server(quick, ["go"], registry=registry)) as c:
        assert text_of(await c.call_tool("go", {})) == "fine"


def test_bridge_refuses_bad_setup(registry: Registry) -> None:
    with pytest.raises(ValueError, match="request/v1"):
        bridge_server(respond, ["a"], registry=Registry(disk_cache=False))
    with pytest.raises(ValueError):
        bridge_server(respond, ["not a symbol"], registry=registry)
    with pytest.raises(ValueError, match="twice"):
        bridge_server(respond, ["a", "a"], registry=registry)


def test_plain_to_value() -> None:
    from decimal import Decimal

    value = plain_to_value({"n": 1, "x": 0.5, "s": "t", "ok": True, "l": [1, [2]],
                            "o": {"k": "v"}})
    assert value == (Keyword("n"), 1, Keyword("x"), Decimal("0.5"), Keyword("s"), "t",
                     Keyword("ok"), Symbol("true"), Keyword("l"), (1, (2,)), Keyword("o"),
                     (Keyword("k"), "v"))
    deep: Any = 1
    for _ in range(100):
        deep = [deep]
    from cbcl import LimitError, MalformedError

    with pytest.raises(LimitError):
        plain_to_value(deep)
    with pytest.raises(MalformedError):
        plain_to_value(2**63)


HANDLER = """
from cbcl import Keyword, Symbol

def respond(message, context):
    args = message.body[2][4]
    total = sum(args[i + 1] for i in range(0, len(args), 2))
    if total < 0:
        return context.reply("FAILURE", (Symbol("failure"), Keyword("action-id"), "s",
                                         Keyword("reason"), "negative"))
    return context.reply("INFORM", (Symbol("inform-result"), Keyword("action-id"), "s",
                                    Keyword("result"), total))
"""


async def test_bridge_over_stdio(tmp_path: Path) -> None:
    (tmp_path / "handler.py").write_text(textwrap.dedent(HANDLER))
    server = StdioServerParameters(
        command=sys.executable, cwd=str(tmp_path),
        args=["-m", "cbcl", "mcp", "--descriptor", str(REQUEST_V1), "--allow-unsigned",
              "--handler", "handler:respond", "--tool", "sum=add the numbers"])
    async with Client(server, read_timeout_seconds=60) as client:
        listed = await client.list_tools()
        assert [(t.name, t.description) for t in listed.tools] == [("sum", "add the numbers")]
        result = await client.call_tool("sum", {"a": 1, "b": 2, "c": 39})
        assert not result.is_error and text_of(result) == "42"
        result = await client.call_tool("sum", {"a": -5})
        assert result.is_error and text_of(result) == "failure: negative"


KINDS = ("malformed", "envelope", "body", "limit", "unknown-protocol", "protocol",
         "descriptor", "grammar", "schema", "trust", "usage")


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tool=st.sampled_from(["parse", "canonical", "export", "prompt"]),
       text=st.text(max_size=200) | st.sampled_from([MESSAGE[:n] for n in (0, 50, 150, 214)]))
def test_fuzz_tools_answer_every_text(registry: Registry, tool: str, text: str) -> None:
    server = tools_server(registry)
    key = {"parse": "message", "canonical": "document"}.get(tool, "descriptor")

    async def call() -> Any:
        return await server.call_tool(tool, {key: text})

    # A loop of its own, in a thread: the module's stdio client keeps anyio's test loop
    # in this one.
    with ThreadPoolExecutor(1) as pool:
        result = pool.submit(anyio.run, call).result()
    assert isinstance(result, CallToolResult)
    if result.is_error:
        line = text_of(result)
        assert line.split(" ", 1)[0].rstrip(":") in KINDS, line
        assert line.isprintable() and "\n" not in line


SLOW_HANDLER = """
import time
from cbcl import Keyword, Symbol

def respond(message, context):
    name = str(message.body[2][2])
    if name == "slow":
        time.sleep(10)
    if name == "exit":
        raise SystemExit(3)
    return context.reply("INFORM", (Symbol("inform-result"), Keyword("action-id"), "s",
                                    Keyword("result"), name))
"""


async def test_bridge_stdio_a_stuck_sync_handler_holds_up_nothing(tmp_path: Path) -> None:
    """``cbcl mcp --handler`` with a plain handler that sleeps 10 s: the call is answered
    isError at ``--handler-timeout`` (1 s), a call made meanwhile is answered first (the
    handler runs in a thread, not on the loop), and a handler's SystemExit is an isError
    result, not the end of the server."""
    (tmp_path / "handler.py").write_text(textwrap.dedent(SLOW_HANDLER))
    server = StdioServerParameters(
        command=sys.executable, cwd=str(tmp_path),
        args=["-m", "cbcl", "mcp", "--descriptor", str(REQUEST_V1), "--allow-unsigned",
              "--handler", "handler:respond", "--tool", "slow", "--tool", "fast", "--tool",
              "exit", "--handler-timeout", "1"])
    async with Client(server, read_timeout_seconds=60) as client:
        order: list[str] = []
        results: dict[str, tuple[CallToolResult, float]] = {}

        async def call(name: str) -> None:
            started = time.monotonic()
            result = await client.call_tool(name, {})
            results[name] = (result, time.monotonic() - started)
            order.append(name)

        async with anyio.create_task_group() as group:
            group.start_soon(call, "slow")
            await anyio.sleep(0.2)  # the slow call is in its handler
            group.start_soon(call, "fast")
        assert order == ["fast", "slow"]
        fast, _ = results["fast"]
        assert not fast.is_error and text_of(fast) == "fast"
        slow, took = results["slow"]
        assert slow.is_error and text_of(slow) == "the agent did not answer within 1 s"
        assert took < 8  # answered at the timeout, not when the handler's 10 s sleep ends
        result = await client.call_tool("exit", {})
        assert result.is_error and text_of(result) == "the agent failed: SystemExit"
        again = await client.call_tool("fast", {})
        assert text_of(again) == "fast"
