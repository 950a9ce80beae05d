"""CBCL over MCP (the Model Context Protocol, ``mcp`` 2.x): CBCL's tools as an MCP server,
one tool per intent of any protocol, and a bridge that serves a request/v1 agent's actions
as MCP tools (spec/interop.md §5).

:func:`protocol_server` is what ``cbcl mcp`` runs: CBCL's tools (below) and, for each
protocol of its registry, one tool per governed intent (:func:`intent_tools`) whose input
is a message in the JSON mapping and whose result — the checked message, or with a handler
the handler's reply — is structured content its ``outputSchema`` describes. It advertises
only the tools capability.

:func:`tools_server` holds CBCL's own tools: ``parse``, ``canonical``,
``check``, ``export`` and ``prompt``, each the library call of the CLI command of that name.
Every argument is hostile input, read under the server's limits; a :class:`~cbcl.CBCLError`
is a tool result with ``isError`` whose text is the error's one line (spec §6.3), so is a
bad argument (``usage: …``), and anything else is ``internal: …``: never a crash.

:func:`bridge_server` serves a request/v1 agent — a handler ``respond(message, context)``
(sync or async) or an :class:`~cbcl.Agent`'s handler for REQUEST — as MCP tools, one per
action. Each ``tools/call`` becomes a REQUEST message
``(request :action (action :name TOOL :args (:key value …)))`` from the client's URI to the
agent's, checked by both passes and the schema and by request/v1's conversation machine;
the handler's replies are checked the same way, and the last one decides the result:
INFORM is the tool result, FAILURE and REFUSE are ``isError``. The handler runs as an
agent's does (:mod:`cbcl.net._handlers`): a plain function in a bounded pool of threads,
so a slow one holds up no other call, a coroutine on the loop; each is cut off at the
timeout (answered ``isError`` then, whatever the handler still does), and whatever it
raises — ``SystemExit`` and ``KeyboardInterrupt`` included — is an ``isError`` result and a
log record with its traceback (logger ``cbcl.bridges``), never the end of the server.

:func:`run_stdio` serves either over standard input and output with this module's own
transport (spec/interop.md §5.5): a line cap read in bounded chunks, and JSON-RPC error
replies for lines that cannot be read.

Needs the ``mcp`` extra (``pip install 'cbcl[mcp]'``).
"""

from __future__ import annotations

import fcntl
import itertools
import json
import logging
import math
import os
import re
import secrets
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, cast

try:
    import anyio
    from mcp.server.lowlevel import Server
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.shared.message import SessionMessage
    from mcp_types import (
        CallToolRequestParams,
        CallToolResult,
        ListToolsResult,
        PaginatedRequestParams,
        TextContent,
        Tool,
        jsonrpc_message_adapter,
    )
    from pydantic import Field
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError("cbcl's MCP server needs the mcp extra: pip install 'cbcl[mcp]'"
                      ) from exc

from ..core._display import escape_invisible
from ..core._errors import CBCLError, GrammarError, LimitError, MalformedError, UnknownProtocolError
from ..core._limits import DEFAULT_LIMITS, Limits
from ..core._reader import TOKEN, read
from ..core._values import URI, Keyword, Symbol, Value
from ..core._version import __version__
from ..grammar._compile import compile_guarded
from ..grammar._lr import LALR1
from ..grammar._subset import read_grammar
from ..llm._export import export_grammar, export_json_schema
from ..llm._prompt import render_prompt
from ..net._agent import Agent, Context
from ..net._handlers import HandlerThreads, run_handler
from ..protocol._api import canonical, parse
from ..protocol._conversation import Conversation, Machine, compile_machine
from ..protocol._descriptor import ProtocolDescriptor, read_descriptor
from ..protocol._fields import _SURROGATE
from ..protocol._json import (
    _SURROGATE_ESCAPE,
    JSON_SIZE_FACTOR,
    _json_depth,
    message_from_json,
    message_to_json,
    to_json,
)
from ..protocol._message import Intent, Message
from ..protocol._protocol import Protocol
from ..protocol._registry import Registry
from ..protocol._trust import read_signed_descriptor_unverified

if TYPE_CHECKING:
    from mcp.server.context import ServerRequestContext

    from ..net._agent import Agent, Handler

__all__ = [
    "BridgeTool",
    "IntentTool",
    "bridge_server",
    "error_result",
    "intent_tools",
    "plain_to_value",
    "protocol_server",
    "run_stdio",
    "tools_server",
]

#: The protocol the bridge speaks.
REQUEST_PROTOCOL = "request/v1"
#: The logger of the bridges.
logger = logging.getLogger("cbcl.bridges")


# --------------------------------------------------------------------------- results


def text_result(text: str, structured: dict[str, Any] | None = None) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)],
                          structured_content=structured)


def error_result(error: BaseException) -> CallToolResult:
    """The ``isError`` tool result for ``error``: a :class:`CBCLError`'s one line (spec
    §6.3: ``kind line:column: message``) with its kind, exit code and position as
    structured content; ``usage: …`` for a ``ValueError``/``TypeError`` of the arguments;
    ``internal: TYPE: message`` for anything else. Every line is escaped (spec §6.5)."""
    if isinstance(error, CBCLError):
        line = error.one_line()
        details: dict[str, Any] = {"kind": error.kind, "exit": error.exit_code}
        if error.position is not None:
            details.update(line=error.position.line, column=error.position.column,
                           offset=error.position.offset)
    elif isinstance(error, (ValueError, TypeError)):
        line, details = f"usage: {error}", {"kind": "usage", "exit": 2}
    else:
        line = f"internal: {type(error).__name__}: {error} (please report this)"
        details = {"kind": "internal", "exit": 70}
    text = escape_invisible(line.replace("\n", " "))
    return CallToolResult(content=[TextContent(type="text", text=text)],
                          structured_content={"error": details}, is_error=True)


def _guarded(work: Callable[[], CallToolResult]) -> CallToolResult:
    try:
        return work()
    except Exception as exc:  # every failure is a tool result, never a crash
        return error_result(exc)


def _bounded(name: str, text: str, limits: Limits) -> bytes:
    """``text`` as UTF-8, refused (:class:`LimitError`) beyond ``max_message_bytes``."""
    maximum = limits.max_message_bytes
    if len(text) > maximum:
        raise LimitError(f"{name}: {len(text)} characters, more than the {maximum} bytes "
                         f"allowed", limit="max_message_bytes", maximum=maximum)
    data = text.encode("utf-8", "surrogatepass")
    if len(data) > maximum:
        raise LimitError(f"{name}: {len(data)} bytes, more than the {maximum} allowed",
                         limit="max_message_bytes", maximum=maximum)
    return data


# --------------------------------------------------------------------------- cbcl mcp

_INTENT_NAMES = tuple(intent.value for intent in Intent)
_dumps = json.dumps


def tools_server(registry: Registry | None = None, *, limits: Limits | None = None,
                 name: str = "cbcl") -> MCPServer:
    """An MCP server with CBCL's tools — ``parse``, ``canonical``, ``check``, ``export``,
    ``prompt`` — over ``registry`` (the protocols ``parse`` knows and ``export``/``prompt``
    name by id; ``None``: none) under ``limits`` (default :data:`DEFAULT_LIMITS`). Run it
    with :func:`run_stdio` (``cbcl mcp``) or connect an in-memory ``mcp.Client`` to it."""
    limits = DEFAULT_LIMITS if limits is None else limits
    if not isinstance(limits, Limits):
        raise TypeError("limits must be a cbcl.Limits")
    server: MCPServer = MCPServer(
        name, version=_version(), log_level="WARNING",
        instructions="CBCL/1.0 messages: parse and check them, write their canonical form, "
                     "check grammars, export a protocol's grammar for constrained decoding, "
                     "write a prompt that teaches a protocol. Errors are one line: kind "
                     "line:column: message.")

    def loaded(protocol: str) -> Protocol:
        found = None if registry is None else registry.get(protocol)
        if found is None:
            raise UnknownProtocolError(
                f"unknown protocol {escape_invisible(protocol, quote=True, limit=80)}: the "
                f"server loaded no descriptor for it", protocol=protocol)
        return found

    def one_of(descriptor: str | None, protocol: str | None) -> None:
        if (descriptor is None) == (protocol is None):
            raise ValueError("give exactly one of descriptor (its text) and protocol (the "
                             "id of a protocol the server loaded)")

    @server.tool(name="parse", description=(
        "Parse one CBCL/1.0 message: pass 1 (the envelope) and, unless envelope_only, pass 2 "
        "(the body, by its protocol's grammar, and the schema) with the protocols the server "
        "loaded. Returns its canonical form, or with json=true its JSON mapping (spec §7). "
        "isError with the error line (kind line:column: message) when it is refused."))
    async def parse_tool(message: Annotated[str, Field(description="the message text")],
                         envelope_only: bool = False, json: bool = False) -> CallToolResult:
        def work() -> CallToolResult:
            parsed = parse(_bounded("message", message, limits), limits=limits,
                           registry=registry, envelope_only=envelope_only)
            if json:
                return text_result(escape_invisible(_dumps(message_to_json(parsed),
                                                           ensure_ascii=False)))
            return text_result(parsed.canonical())
        return _guarded(work)  # (in the event loop: bounded input, sub-millisecond work)

    @server.tool(name="canonical", description=(
        "The canonical form (spec §1.2) of one CBCL document (any value, not only a "
        "message)."))
    async def canonical_tool(document: Annotated[str, Field(description="one CBCL document")]
                             ) -> CallToolResult:
        def work() -> CallToolResult:
            return text_result(canonical(read(_bounded("document", document, limits),
                                              limits=limits)))
        return _guarded(work)

    @server.tool(name="check", description=(
        "Check a body grammar, or a descriptor's grammar (spec §4.5), in a guarded worker "
        "process: the verdict, then the report. isError unless the verdict is LALR(1)."))
    def check_tool(grammar: Annotated[str, Field(description="grammar text, or a descriptor")],
                   start: Annotated[list[str] | None, Field(
                       description="the start rules of grammar text (default: body)",
                       max_length=64)] = None) -> CallToolResult:
        return _guarded(lambda: _check(_bounded("grammar", grammar, limits), start, limits))

    @server.tool(name="export", description=(
        "A protocol's messages as a grammar for constrained decoding (llguidance, gbnf, "
        "lark) or a JSON Schema of their JSON mapping (spec/llm.md). Give the descriptor's "
        "text (signed or not; nothing is verified) or the id of a protocol the server "
        "loaded."))
    def export_tool(descriptor: str | None = None, protocol: str | None = None,
                    format: Annotated[str, Field(description="llguidance, gbnf, lark or "
                                                             "json-schema")] = "llguidance",
                    intent: Annotated[str | None, Field(description="only this intent's "
                                                                    "messages")] = None,
                    schema: bool = True) -> CallToolResult:
        def work() -> CallToolResult:

            one_of(descriptor, protocol)
            source: ProtocolDescriptor | bytes = \
                loaded(cast(str, protocol)).descriptor if descriptor is None \
                else _unsigned(_bounded("descriptor", descriptor, limits), limits)
            done = export_grammar(source, format, intent=intent, schema=schema)
            return text_result(done.text, {"format": done.format,
                                           "intents": [i.value for i in done.intents],
                                           "not_carried": list(done.not_carried)})
        return _guarded(work)

    @server.tool(name="prompt", description=(
        "A system-prompt section (Markdown) that teaches a model to write one protocol's "
        "messages, with accepted examples (NOT a verification of the descriptor). Give the "
        "descriptor's text (signed or not) or the id of a protocol the server loaded."))
    def prompt_tool(descriptor: str | None = None, protocol: str | None = None,
                    intent: str | None = None,
                    examples: Annotated[int, Field(ge=0, le=20)] = 1,
                    seed: Annotated[int, Field(ge=0, le=1 << 32)] = 0) -> CallToolResult:
        def work() -> CallToolResult:

            one_of(descriptor, protocol)
            chosen = None
            if intent is not None:
                if intent not in _INTENT_NAMES:
                    raise ValueError(f"intent: {escape_invisible(intent, limit=40)!r} is not "
                                     f"an intent")
                chosen = Intent(intent)
            if descriptor is None:
                use, found = cast(Registry, registry), loaded(cast(str, protocol))
            else:
                # A grammar from the caller: compiled in a guarded worker, trusted for this
                # prompt only (a throw-away registry, no disk cache).
                use = Registry(limits=limits, disk_cache=False)
                found = use.load(_unsigned(_bounded("descriptor", descriptor, limits),
                                           limits), allow_unsigned=True)
            return text_result(render_prompt(found, registry=use, intent=chosen,
                                             count=examples, seed=seed))
        return _guarded(work)

    return server


def _version() -> str:
    return __version__


def _unsigned(data: bytes, limits: Limits) -> bytes:
    """The payload of a signed descriptor (unverified), or ``data`` itself."""

    document = read(data, limits=limits)
    if type(document) is tuple and document and str(document[0]) == "signed-descriptor":
        return read_signed_descriptor_unverified(data, limits=limits).payload
    return data


def _check(data: bytes, start: list[str] | None, limits: Limits) -> CallToolResult:
    """``cbcl grammar check`` as a tool: the verdict and the report."""

    head = TOKEN.match(data.decode("utf-8", "replace"))
    is_descriptor = head is not None and head.lastindex == 1 and data[head.end():].lstrip(
        ).startswith((b"protocol-descriptor", b"signed-descriptor"))
    starts: tuple[str, ...] = ("body",) if not start else tuple(dict.fromkeys(start))
    try:
        grammar = data
        if is_descriptor:
            descriptor = read_descriptor(_unsigned(data, limits), limits=limits)
            grammar, starts = descriptor.grammar.encode("utf-8"), descriptor.start_rules
        try:
            text = grammar.decode("utf-8")
        except UnicodeDecodeError:
            read_grammar(grammar)  # refuses it, with the position of the first bad byte
            raise
        compiled = compile_guarded(text, starts=starts)
    except GrammarError as exc:
        result = error_result(exc)
        lines = ["rejected", result.content[0].text]  # type: ignore[union-attr]
        if exc.context:
            lines.append(escape_invisible(exc.context.replace("\n", "\x00")).replace(
                "\\u0000", "\n"))
        result.content = [TextContent(type="text", text="\n".join(lines))]
        result.structured_content = {"verdict": "rejected", **result.structured_content}
        return result
    report = compiled.report.rstrip("\n")
    return CallToolResult(content=[TextContent(type="text", text=report)],
                          structured_content={"verdict": compiled.verdict},
                          is_error=compiled.verdict != LALR1)


# --------------------------------------------------------------------------- stdio
#
# Theory of operation. The SDK's stdio transport reads a whole line, however long, into
# memory, replaces invalid UTF-8 with U+FFFD and answers nothing to a line it cannot read.
# This one reads standard input in chunks of READ_CHUNK bytes (os.read in a worker thread)
# and splits lines on LF itself: a line that grows past max_line_bytes is discarded as it
# arrives (its bytes are never held beyond the cap) and answered with a JSON-RPC error once
# its LF comes. A line within the cap is read strictly — UTF-8 (a lone surrogate's bytes
# are invalid), nesting measured before json.loads, duplicate member names, NaN/Infinity
# and escaped lone surrogates refused — and only then validated by the SDK's own JSON-RPC
# types. Every refusal is answered as JSON-RPC 2.0 §5.1 says: -32700 (parse error) or
# -32600 (invalid request), with the request's id where it could be read, else null. The
# server (its handlers) then sees only messages the SDK would have read.

#: Bytes read from standard input at a time.
READ_CHUNK = 64 << 10
#: JSON-RPC 2.0 error codes (§5.1).
PARSE_ERROR, INVALID_REQUEST = -32700, -32600
#: Objects and arrays a JSON-RPC line may nest beyond ``limits.max_depth`` (the envelope of
#: a ``tools/call`` around its arguments).
JSONRPC_DEPTH_MARGIN = 8


def default_max_line_bytes(limits: Limits = DEFAULT_LIMITS) -> int:
    """The default cap on one JSON-RPC line: ``JSON_SIZE_FACTOR`` (10) ×
    ``max_message_bytes`` + 64 KiB, room for a message within the limit in the JSON mapping
    (an intent tool's arguments), or a text argument written with JSON escapes
    (``\\u00XX`` is 6 bytes for 1), and for the request around it."""
    return JSON_SIZE_FACTOR * limits.max_message_bytes + (64 << 10)


class _LineError(Exception):
    def __init__(self, code: int, data: str, request_id: str | int | None = None) -> None:
        super().__init__(data)
        self.code, self.data, self.request_id = code, data, request_id


def _request_id(document: Any) -> str | int | None:
    """The ``id`` of a JSON-RPC object when it is one MCP allows (a string or an integer:
    not null, a boolean or a fraction), else ``None``."""
    if type(document) is not dict:
        return None
    found = document.get("id")
    return found if type(found) is str or type(found) is int else None


def read_jsonrpc_line(line: bytes, max_depth: int) -> Any:
    """The JSON-RPC message (an SDK ``JSONRPCMessage``) on one line of MCP's stdio transport
    (without its LF). Raises :class:`_LineError` with the JSON-RPC error to answer:
    :data:`PARSE_ERROR` for invalid UTF-8, JSON that is not RFC 8259 JSON (``NaN``, a
    member name twice, a lone surrogate escape) or nested beyond ``max_depth``;
    :data:`INVALID_REQUEST` for JSON that is not a JSON-RPC message of MCP (a batch
    included: MCP has none)."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _LineError(PARSE_ERROR, f"invalid UTF-8 at byte {exc.start}") from None
    if _json_depth(text) > max_depth:
        raise _LineError(PARSE_ERROR, f"JSON nested more than {max_depth} deep")
    try:
        document = json.loads(text, object_pairs_hook=_unique_members,
                              parse_constant=_no_constant)
        if _SURROGATE_ESCAPE.search(text) is not None and _holds_lone_surrogate(document):
            raise ValueError("a string holds a lone surrogate escape")
    except RecursionError:
        raise _LineError(PARSE_ERROR, "JSON nested too deep") from None
    except ValueError as exc:  # JSONDecodeError included
        raise _LineError(PARSE_ERROR, escape_invisible(str(exc), limit=200)) from None
    if type(document) is list:
        raise _LineError(INVALID_REQUEST, "JSON-RPC batches are not part of MCP")
    if type(document) is not dict:
        raise _LineError(INVALID_REQUEST, "a JSON-RPC message is a JSON object")
    if "id" in document and _request_id(document) is None and "method" in document:
        # (the SDK would read the request as a notification, and answer nothing; a
        # response's id may be null, JSON-RPC 2.0 §5)
        raise _LineError(INVALID_REQUEST, "an id is a string or an integer")
    try:
        return jsonrpc_message_adapter.validate_json(line, by_name=False)
    except Exception as exc:  # pydantic's ValidationError: not a JSON-RPC message of MCP
        said = escape_invisible(str(exc).split("\n", 1)[0], limit=200)
        raise _LineError(INVALID_REQUEST, f"not a JSON-RPC message: {said}",
                         _request_id(document)) from None


def _unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    members: dict[str, Any] = {}
    for name, value in pairs:
        if name in members:
            raise ValueError(f"member name {escape_invisible(name, quote=True, limit=40)!r} "
                             f"appears twice in one object")
        members[name] = value
    return members


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def _holds_lone_surrogate(document: Any) -> bool:
    stack = [document]
    while stack:
        item = stack.pop()
        if type(item) is str:
            if _SURROGATE.search(item) is not None:
                return True
        elif type(item) is list:
            stack.extend(item)
        elif type(item) is dict:
            stack.extend(item)
            stack.extend(item.values())
    return False


def _error_line(code: int, data: str, request_id: str | int | None) -> bytes:
    message = "Parse error" if code == PARSE_ERROR else "Invalid Request"
    return json.dumps({"jsonrpc": "2.0", "id": request_id,
                       "error": {"code": code, "message": message, "data": data}},
                      separators=(",", ":")).encode("utf-8") + b"\n"


class _Lines:
    """Splits the chunks of a byte stream into LF-terminated lines of at most ``cap``
    bytes (sans-io): :meth:`feed` returns the lines completed, each ``bytes`` or, for a
    line that outgrew the cap (its bytes dropped as they came), ``None``."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.pending = bytearray()
        self.discarding = False

    def feed(self, chunk: bytes) -> list[bytes | None]:
        lines: list[bytes | None] = []
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                break
            if self.discarding or len(self.pending) + end - start > self.cap:
                lines.append(None)
            else:
                self.pending += chunk[start:end]
                lines.append(bytes(self.pending))
            self.pending.clear()
            self.discarding = False
            start = end + 1
        if not self.discarding:
            if len(self.pending) + len(chunk) - start > self.cap:
                self.discarding = True
                self.pending = bytearray()  # (the memory goes back now, not at the LF)
            else:
                self.pending += chunk[start:]
        return lines

    def end(self) -> list[bytes | None]:
        """The last line, when the stream ends without its LF."""
        if self.discarding:
            return [None]
        return [bytes(self.pending)] if self.pending.strip() else []


def _claim_stdio() -> tuple[int, int, Callable[[], None]]:
    """Private duplicates of fds 0 and 1 (the wire), with fd 0 pointed at the null device
    and fd 1 at stderr while serving (as the SDK's transport does: a handler's stray read
    or print never touches the wire), and the function that restores them."""
    wire_in = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
    wire_out = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
    finally:
        os.close(null)
    os.dup2(2, 1)

    def restore() -> None:
        os.dup2(wire_in, 0)
        os.dup2(wire_out, 1)
        os.close(wire_in)
        os.close(wire_out)
    return wire_in, wire_out, restore


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


async def serve_lines(server: Server[Any], initialization: Any, read_fd: int, write_fd: int,
                      *, max_line_bytes: int, max_depth: int) -> None:
    """Serve the low-level ``server`` over newline-delimited JSON-RPC on two file
    descriptors until ``read_fd`` ends (see the theory of operation above)."""
    to_server, from_reader = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    to_writer, from_server = anyio.create_memory_object_stream[SessionMessage](0)
    write_lock = anyio.Lock()

    async def write(data: bytes) -> None:
        async with write_lock:
            await anyio.to_thread.run_sync(_write_all, write_fd, data)

    async def reader() -> None:
        lines = _Lines(max_line_bytes)
        async with to_server:
            while True:
                chunk = await anyio.to_thread.run_sync(os.read, read_fd, READ_CHUNK,
                                                       abandon_on_cancel=True)
                done = lines.feed(chunk) if chunk else lines.end()
                for line in done:
                    if line is not None and not line.strip():
                        continue  # (a blank line carries nothing to answer)
                    try:
                        if line is None:
                            raise _LineError(INVALID_REQUEST, f"a line longer than "
                                             f"{max_line_bytes} bytes (the line cap)")
                        message = read_jsonrpc_line(line, max_depth)
                    except _LineError as refused:
                        logger.warning("mcp: refused a JSON-RPC line (%d): %s", refused.code,
                                       refused.data)
                        await write(_error_line(refused.code, refused.data,
                                                refused.request_id))
                        continue
                    await to_server.send(SessionMessage(message))
                if not chunk:
                    return

    written = anyio.Event()

    async def writer() -> None:
        try:
            async with from_server:
                async for item in from_server:
                    text = item.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await write(text.encode("utf-8") + b"\n")
        finally:
            written.set()

    async with anyio.create_task_group() as group:
        group.start_soon(reader)
        group.start_soon(writer)
        async with to_writer:
            await server.run(from_reader, to_writer, initialization)
        await written.wait()  # every answer out before the reader (maybe in a read) stops
        group.cancel_scope.cancel()


async def run_stdio(server: MCPServer | Server[Any], *, limits: Limits | None = None,
                    max_line_bytes: int | None = None) -> None:
    """Serve ``server`` over this process's standard input and output until the input
    ends (``cbcl mcp``), reading lines of at most ``max_line_bytes`` (default
    :func:`default_max_line_bytes` of ``limits``) nested at most ``limits.max_depth`` +
    :data:`JSONRPC_DEPTH_MARGIN` deep. Raises ``ValueError`` for a cap below 1."""
    limits = DEFAULT_LIMITS if limits is None else limits
    cap = default_max_line_bytes(limits) if max_line_bytes is None else max_line_bytes
    if type(cap) is not int or cap < 1:
        raise ValueError("max_line_bytes must be a positive int")
    low = _lowlevel(server)
    wire_in, wire_out, restore = _claim_stdio()
    try:
        await serve_lines(low, low.create_initialization_options(), wire_in, wire_out,
                          max_line_bytes=cap, max_depth=limits.max_depth + JSONRPC_DEPTH_MARGIN)
    finally:
        restore()


def _lowlevel(server: MCPServer | Server[Any]) -> Server[Any]:
    """The low-level server that answers for ``server`` (an MCPServer's own: mcp 2.x names
    no public accessor for it)."""
    if isinstance(server, MCPServer):
        return server._lowlevel_server
    return server


# --------------------------------------------------------------------------- the bridge


def plain_to_value(value: Any, limits: Limits = DEFAULT_LIMITS, path: str = "$") -> Value:
    """A tool argument (plain JSON, as ``json.loads`` gives it) as a CBCL value: a string
    is a STRING, an integer an INTEGER (int64), a float a DECIMAL (its shortest repr, finite),
    ``true``/``false`` the symbols, an array a list, an object a keyword list
    ``(:key value …)`` (each key a keyword name). ``null`` and everything else is refused
    (:class:`MalformedError` naming the JSON path); nesting beyond ``limits.max_depth``
    is a :class:`LimitError`."""
    return _plain(value, limits, path, 0)


def _plain(value: Any, limits: Limits, path: str, depth: int) -> Value:
    if depth > limits.max_depth:
        raise LimitError(f"{path}: the arguments nest deeper than {limits.max_depth}",
                         limit="max_depth", maximum=limits.max_depth)
    kind = type(value)
    if kind is str:
        return cast(str, value)
    if kind is bool:
        return Symbol("true" if value else "false")
    if kind is int:
        if not -(2**63) <= value < 2**63:
            raise MalformedError(f"{path}: integer outside int64")
        return cast(int, value)
    if kind is float:
        if not math.isfinite(value):
            raise MalformedError(f"{path}: {value!r} is not a finite number")
        number = Decimal(repr(value))
        try:
            canonical(number)
        except ValueError as exc:
            raise MalformedError(f"{path}: {value!r}: {exc}") from None
        return number
    if kind is list:
        items = cast(list[Any], value)
        if len(items) > limits.max_list_items:
            raise LimitError(f"{path}: more than {limits.max_list_items} items",
                             limit="max_list_items", maximum=limits.max_list_items)
        return tuple(_plain(item, limits, f"{path}[{i}]", depth + 1)
                     for i, item in enumerate(items))
    if kind is dict:
        members = cast(dict[str, Any], value)
        if 2 * len(members) > limits.max_list_items:
            raise LimitError(f"{path}: more than {limits.max_list_items // 2} members",
                             limit="max_list_items", maximum=limits.max_list_items)
        out: list[Value] = []
        for key, item in members.items():
            try:
                keyword = Keyword(key)
            except (ValueError, TypeError):
                shown = escape_invisible(str(key), quote=True, limit=40)
                raise MalformedError(f"{path}: {shown} is not a keyword name") from None
            out += [keyword, _plain(item, limits, f"{path}.{key}", depth + 1)]
        return tuple(out)
    raise MalformedError(f"{path}: {'null' if value is None else kind.__name__} has no CBCL "
                         f"value")


@dataclass(frozen=True, slots=True)
class BridgeTool:
    """One MCP tool of the bridge: the request/v1 action ``name`` (a symbol, also the tool's
    name), its ``description``, and the JSON Schema of its arguments (checked before the
    REQUEST is built; default: any object)."""

    name: str
    description: str = ""
    input_schema: Mapping[str, Any] = field(
        default_factory=lambda: {"type": "object", "additionalProperties": True})


@dataclass
class _Bridge:
    handler: Handler
    registry: Registry
    tools: dict[str, BridgeTool]
    agent: URI
    client: URI
    timeout: float
    limits: Limits
    threads: HandlerThreads
    expose_errors: bool = False
    ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    prefix: str = field(default_factory=lambda: secrets.token_hex(4))
    validators: dict[str, Any] = field(default_factory=dict)
    machine: Machine = field(init=False)

    def __post_init__(self) -> None:
        protocol = self.registry.get(REQUEST_PROTOCOL)
        assert protocol is not None and protocol.descriptor.conversation is not None
        self.machine = compile_machine(protocol.descriptor.conversation,
                                       intents=protocol.descriptor.intents)

    def next_id(self, kind: str) -> str:
        return f"mcp-{self.prefix}-{kind}-{next(self.ids)}"

    def request(self, tool: BridgeTool, arguments: dict[str, Any]) -> Message:
        args = plain_to_value(arguments, self.limits, "$.arguments")
        body = (Symbol("request"), Keyword("action"),
                (Symbol("action"), Keyword("name"), Symbol(tool.name), Keyword("args"), args))
        draft = Message(message_id=self.next_id("rq"), sender=self.client,
                        receiver=self.agent, intent=Intent.REQUEST,
                        protocol=REQUEST_PROTOCOL, conversation_id=self.next_id("c"),
                        timestamp=_now(), body=body)
        # Both passes and the schema, on the text a receiver would read.
        return parse(draft.canonical(), limits=self.limits, registry=self.registry)

    async def call(self, name: str, arguments: dict[str, Any] | None) -> CallToolResult:
        tool = self.tools.get(name)
        if tool is None:
            return error_result(ValueError(f"unknown tool {escape_invisible(name, limit=60)}"))
        try:
            self.check_arguments(tool, arguments or {})
            request = self.request(tool, arguments or {})
        except Exception as exc:
            return error_result(exc)
        conversation = Conversation(self.machine, protocol=REQUEST_PROTOCOL,
                                    conversation_id=cast(str, request.conversation_id))
        conversation.receive(request, now=_now())

        context = Context(request, next_id=lambda: self.next_id("re"))
        replies = await _answers(self.handler, request, context, name, threads=self.threads,
                                 timeout=self.timeout, expose_errors=self.expose_errors)
        if isinstance(replies, CallToolResult):
            return replies
        last: Message | None = None
        try:
            for reply in replies:
                if not isinstance(reply, Message):
                    raise TypeError(f"the agent returned {type(reply).__name__}, not a "
                                    f"Message")
                checked = parse(reply.canonical(), limits=self.limits, registry=self.registry)
                conversation.receive(checked, now=_now())
                last = checked
        except Exception as exc:
            return error_result(exc)
        assert last is not None
        return _reply_result(last, conversation.state)

    def check_arguments(self, tool: BridgeTool, arguments: dict[str, Any]) -> None:
        validator = self.validators.get(tool.name)
        if validator is None:
            import jsonschema

            validator = jsonschema.Draft202012Validator(dict(tool.input_schema))
            self.validators[tool.name] = validator
        error = next(iter(validator.iter_errors(arguments)), None)
        if error is not None:
            where = "$" + "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}"
                                  for p in error.absolute_path)
            raise MalformedError(f"arguments {where}: {error.message}")


def _now() -> int:
    return time.time_ns() // 1_000_000


async def _answers(handler: Handler, request: Message, context: Context, tool: str, *,
                   threads: HandlerThreads, timeout: float,
                   expose_errors: bool) -> Sequence[Any] | CallToolResult:
    """What ``handler`` answered to ``request`` — a non-empty sequence, each to be checked
    as a Message — or the ``isError`` result of a handler that stopped, overran its
    ``timeout``, raised anything (logged with its traceback) or said nothing."""
    outcome = await run_handler(handler, request, context, threads=threads, timeout=timeout)
    if outcome.kind == "stopped":
        return _agent_error("the agent is stopping")
    if outcome.kind == "timeout":
        busy = "" if outcome.value != "thread" else (
            f" (no handler thread was free: {threads.busy} busy)")
        logger.error("bridge: the handler of %s did not answer within %g s%s",
                     escape_invisible(tool, limit=60), timeout, busy,
                     extra={"cbcl": {"event": "handler-timeout", "tool": tool}})
        return _agent_error(f"the agent did not answer within {timeout:g} s")
    if outcome.kind == "raised":
        error: BaseException = outcome.value
        said = escape_invisible(f"{type(error).__name__}: {error}", limit=200)
        logger.error("bridge: the handler of %s failed: %s", escape_invisible(tool, limit=60),
                     said, exc_info=error if isinstance(error, Exception) else None,
                     extra={"cbcl": {"event": "handler-failed", "tool": tool}})
        shown = said if expose_errors else type(error).__name__
        return _agent_error(f"the agent failed: {shown}")
    answer: Any = outcome.value
    replies = [answer] if isinstance(answer, Message) or answer is None else answer
    if not isinstance(replies, Sequence) or not replies or list(replies) == [None]:
        return _agent_error("the agent did not answer")
    return replies


def _agent_error(text: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=escape_invisible(text))],
                          structured_content={"error": {"kind": "agent"}}, is_error=True)


def _field(body: Value | None, name: str) -> Value | None:
    if not isinstance(body, tuple):
        return None
    for index in range(1, len(body) - 1):
        if type(body[index]) is Keyword and str.__str__(body[index]) == name:
            return body[index + 1]
    return None


def _reply_result(reply: Message, state: Symbol) -> CallToolResult:
    """The tool result for the agent's last reply, in conversation ``state``."""
    body = reply.body
    head = str.__str__(body[0]) if isinstance(body, tuple) and body else ""
    structured: dict[str, Any] = {"intent": reply.intent.value, "state": str(state),
                                  "message": reply.canonical()}
    if reply.intent is Intent.INFORM:
        result = _field(body, "result")
        if head == "inform-result" and result is not None:
            structured["result"] = to_json(result)
            text = result if type(result) is str else canonical(result)
        else:
            text = "done"
        action = _field(body, "action-id")
        if type(action) is str:
            structured["action_id"] = action
        return CallToolResult(content=[TextContent(type="text", text=text)],
                              structured_content=structured)
    reason = _field(body, "reason")
    shown = reason if type(reason) is str else ""
    if reply.intent is Intent.FAILURE:
        text = f"failure: {shown}"
    elif reply.intent is Intent.REFUSE:
        text = f"refused: {shown}"
    elif reply.intent is Intent.AGREE:
        text = "the agent agreed but sent no result"
    else:
        text = f"the agent answered {reply.intent.value}"
    return CallToolResult(content=[TextContent(type="text", text=escape_invisible(text))],
                          structured_content=structured, is_error=True)


def bridge_server(handler: Handler | Agent, tools: Iterable[BridgeTool | str], *,
                  registry: Registry, client: URI | str = "mcp://client",
                  agent: URI | str | None = None, timeout: float = 30.0,
                  limits: Limits | None = None, name: str = "cbcl-bridge",
                  threads: int = 8, expose_errors: bool = False) -> Server[Any]:
    """An MCP server whose tools are request/v1 actions answered by ``handler``.

    ``handler`` is ``respond(message, context)`` (sync or async; returning a reply, a
    sequence of replies such as AGREE then INFORM, or ``None``) or an :class:`~cbcl.Agent`,
    whose handler for request/v1 REQUEST answers (and whose name is the agent's URI; its
    handler threads and ``expose_errors`` are used). ``tools``: the actions, as
    :class:`BridgeTool` or names. ``registry`` must hold request/v1. Each call's REQUEST
    goes from ``client`` to ``agent`` (default ``agent://mcp-bridge``) in a new
    conversation; the handler has ``timeout`` seconds (then the call is answered
    ``isError``). A plain handler runs in one of ``threads`` threads (one whose handler
    overran keeps it until the handler returns); ``expose_errors``: a failed call's result
    carries the exception's text, not only its type. Runs on anyio's asyncio backend.
    Raises ``ValueError`` for a registry without request/v1, a tool name that is not a
    symbol, a repeated one, or ``threads`` out of 1 to 4096.
    """

    pool = None
    if isinstance(handler, Agent):
        pool, expose_errors = handler.threads, handler.expose_errors
        agent = handler.name if agent is None else agent
        found = handler.handler_for(REQUEST_PROTOCOL, Intent.REQUEST)
        if found is None:
            raise ValueError(f"the agent has no handler for {REQUEST_PROTOCOL} REQUEST")
        handler = found
    if not callable(handler):
        raise TypeError("handler must be callable or a cbcl.Agent")
    protocol = registry.get(REQUEST_PROTOCOL)
    if protocol is None or protocol.descriptor.conversation is None:
        raise ValueError(f"the registry must hold {REQUEST_PROTOCOL} (with its conversation)")
    specs: dict[str, BridgeTool] = {}
    for item in tools:
        spec = BridgeTool(item) if isinstance(item, str) else item
        Symbol(spec.name)  # raises ValueError for a name that is not a symbol
        if spec.name in specs:
            raise ValueError(f"tool {spec.name} is given twice")
        specs[spec.name] = spec
    if not 0 < timeout <= 86_400:
        raise ValueError("timeout must be in (0, 86400] seconds")
    bridge = _Bridge(handler=handler, registry=registry, tools=specs, agent=URI(
        str(agent or "agent://mcp-bridge")), client=URI(str(client)), timeout=float(timeout),
        limits=DEFAULT_LIMITS if limits is None else limits,
        threads=pool or HandlerThreads(threads, name="cbcl-bridge"),
        expose_errors=bool(expose_errors))
    listed = [Tool(name=spec.name, description=spec.description or
                   f"request/v1 action {spec.name}, answered by a CBCL agent",
                   input_schema=dict(spec.input_schema)) for spec in specs.values()]

    async def list_tools(ctx: ServerRequestContext[Any],
                         params: PaginatedRequestParams | None) -> ListToolsResult:
        return ListToolsResult(tools=listed)

    async def call_tool(ctx: ServerRequestContext[Any],
                        params: CallToolRequestParams) -> CallToolResult:
        try:
            return await bridge.call(params.name, params.arguments)
        except Exception as exc:  # never a crash
            return error_result(exc)

    return Server(name, version=_version(), on_list_tools=list_tools, on_call_tool=call_tool,
                  get_tool_input_schema=lambda tool: dict(specs[tool].input_schema)
                  if tool in specs else None)


# --------------------------------------------------------------------------- any protocol
#
# `cbcl mcp --descriptor D …` serves one tool per governed intent of every protocol loaded.
# A call's arguments are a whole message in the JSON mapping (spec §7.2), as the protocol's
# JSON Schema export for that intent describes it (the tool's inputSchema); the message is
# read by message_from_json, must be of the tool's protocol and intent, and is checked by
# both passes and the schema. Without a handler the result is that checked message; with
# one (any protocol's participant: a function, or an Agent's handler for that protocol and
# intent) it is the handler's last reply, checked the same way. Either way the result's
# structuredContent is a message's JSON mapping and the tool's outputSchema its schema.

_NOT_IN_TOOL_NAMES = re.compile(r"[^A-Za-z0-9_.-]")
#: The longest MCP tool name (the MCP specification's tool name rules).
MAX_TOOL_NAME = 128


def intent_tool_name(protocol: str, intent: Intent) -> str:
    """The MCP tool name of ``intent`` of ``protocol``: the protocol id with each character
    MCP's tool names do not allow written ``_``, a dot, the intent (``request_v1.REQUEST``)."""
    return f"{_NOT_IN_TOOL_NAMES.sub('_', protocol)}.{intent.value}"


@dataclass(frozen=True, slots=True)
class IntentTool:
    """One MCP tool of :func:`protocol_server`: messages of ``intent`` of ``protocol``."""

    name: str
    protocol: str
    intent: Intent
    description: str
    input_schema: Mapping[str, Any]
    output_schema: Mapping[str, Any]
    handler: Handler | None = None


def _object_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with ``"type": "object"`` at its root, as MCP asks of a tool's schemas (a
    protocol's schema of several intents is an ``anyOf`` of objects: the same set)."""
    return schema if schema.get("type") == "object" else {**schema, "type": "object"}


def intent_tools(registry: Registry, *, handler: Handler | Agent | None = None
                 ) -> list[IntentTool]:
    """The tools of every governed intent of every protocol in ``registry``: the input
    schema is the JSON Schema export of the intent's messages
    (:func:`cbcl.llm.export_json_schema`); the output schema that same schema without a
    handler (the result is the checked message), the whole protocol's with one (the result
    is a reply). With an :class:`~cbcl.Agent`, only the intents it has a handler for.
    Raises ``ValueError`` when two protocols' ids make the same tool name, or one longer
    than :data:`MAX_TOOL_NAME`; :class:`~cbcl.LimitError` as the export does."""
    tools: list[IntentTool] = []
    seen: dict[str, str] = {}
    for protocol in registry.protocols():
        descriptor = protocol.descriptor
        protocol_id = str.__str__(descriptor.id)
        whole: dict[str, Any] | None = None
        for intent in descriptor.intents:
            chosen: Handler | None = None
            if isinstance(handler, Agent):
                chosen = handler.handler_for(protocol_id, intent)
                if chosen is None:
                    continue
            elif handler is not None:
                chosen = handler
            name = intent_tool_name(protocol_id, intent)
            if len(name) > MAX_TOOL_NAME:
                raise ValueError(f"tool name {name[:40]}… is longer than {MAX_TOOL_NAME} "
                                 f"characters")
            if name in seen:
                raise ValueError(f"protocols {seen[name]} and {protocol_id} both make the "
                                 f"tool name {name}")
            seen[name] = protocol_id
            schema = _object_schema(export_json_schema(descriptor, intent=intent))
            if handler is None:
                output, what = schema, "Returns the message, checked"
            else:
                if whole is None:
                    whole = _object_schema(export_json_schema(descriptor))
                output, what = whole, "Returns the agent's reply, a message of the protocol"
            tools.append(IntentTool(
                name=name, protocol=protocol_id, intent=intent, input_schema=schema,
                output_schema=output, handler=chosen, description=(
                    f"Send a CBCL {protocol_id} {intent.value} message, written in the "
                    f"CBCL JSON mapping as the input schema says (every envelope member "
                    f"and the body). It is checked by both passes and the protocol's "
                    f"schema. {what} (its JSON mapping as structured content, its "
                    f"canonical text as text); isError with the error line when it is "
                    f"refused.")))
    return tools


def _message_result(message: Message) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=message.canonical())],
                          structured_content=message_to_json(message))


@dataclass
class _IntentServer:
    registry: Registry
    tools: dict[str, IntentTool]
    limits: Limits
    timeout: float
    threads: HandlerThreads
    expose_errors: bool
    ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    prefix: str = field(default_factory=lambda: secrets.token_hex(4))

    def check(self, message: Message) -> Message:
        """``message`` checked by both passes and the schema (and the trust store, if the
        registry has one), or a :class:`CBCLError`."""
        return parse(message.canonical(), limits=self.limits, registry=self.registry)

    async def call(self, tool: IntentTool, arguments: dict[str, Any]) -> CallToolResult:
        try:
            message = message_from_json(arguments, limits=self.limits)
            if str.__str__(message.protocol) != tool.protocol or message.intent is not tool.intent:
                raise MalformedError(
                    f"the tool {tool.name} takes {tool.protocol} {tool.intent.value} "
                    f"messages, not {escape_invisible(str(message.protocol), limit=60)} "
                    f"{message.intent.value}")
            request = self.check(message)
        except Exception as exc:
            return error_result(exc)
        if tool.handler is None:
            return _message_result(request)
        context = Context(request, next_id=lambda: f"mcp-{self.prefix}-re-{next(self.ids)}")
        replies = await _answers(tool.handler, request, context, tool.name,
                                 threads=self.threads, timeout=self.timeout,
                                 expose_errors=self.expose_errors)
        if isinstance(replies, CallToolResult):
            return replies
        last: Message | None = None
        try:
            for reply in replies:
                if not isinstance(reply, Message):
                    raise TypeError(f"the agent returned {type(reply).__name__}, not a "
                                    f"Message")
                last = self.check(reply)
        except Exception as exc:
            return error_result(exc)
        assert last is not None  # (replies is not empty)
        protocol = self.registry.get(last.protocol)
        if str.__str__(last.protocol) != tool.protocol or protocol is None \
                or last.intent not in protocol.descriptor.intents:
            # Not a message the output schema describes: the result says so.
            return _agent_error(f"the agent answered {last.intent.value} of "
                                f"{escape_invisible(str(last.protocol), limit=60)}, which "
                                f"{tool.protocol} does not govern: {last.canonical()}")
        return _message_result(last)


def protocol_server(registry: Registry | None, *, handler: Handler | Agent | None = None,
                    limits: Limits | None = None, cbcl_tools: bool = True,
                    timeout: float = 30.0, threads: int = 8, expose_errors: bool = False,
                    name: str = "cbcl") -> Server[Any]:
    """The MCP server of ``cbcl mcp``: one tool per governed intent of each protocol in
    ``registry`` (:func:`intent_tools`; ``None``: none), and, without a ``handler`` and
    with ``cbcl_tools``, CBCL's own tools (:func:`tools_server`'s). With ``handler`` (a
    function ``respond(message, context)``, sync or async, or an :class:`~cbcl.Agent`,
    whose handlers, threads and ``expose_errors`` are used) each call's message is
    answered by it as :func:`bridge_server`'s calls are (``timeout``, ``threads``,
    ``expose_errors``). Only the tools capability is advertised: nothing else is served.
    Raises ``ValueError`` as :func:`intent_tools` does, or for ``timeout`` outside
    (0, 86400] s or ``threads`` outside 1 to 4096."""
    limits = DEFAULT_LIMITS if limits is None else limits
    if not isinstance(limits, Limits):
        raise TypeError("limits must be a cbcl.Limits")
    if not 0 < timeout <= 86_400:
        raise ValueError("timeout must be in (0, 86400] seconds")
    pool = None
    if isinstance(handler, Agent):
        pool, expose_errors = handler.threads, handler.expose_errors
    elif handler is not None and not callable(handler):
        raise TypeError("handler must be callable or a cbcl.Agent")
    tools = [] if registry is None else intent_tools(registry, handler=handler)
    by_name = {tool.name: tool for tool in tools}
    intents = _IntentServer(
        registry=registry if registry is not None else Registry(limits=limits,
                                                                disk_cache=False),
        tools=by_name, limits=limits, timeout=float(timeout), expose_errors=bool(expose_errors),
        threads=pool or HandlerThreads(threads, name="cbcl-mcp"))
    own = tools_server(registry, limits=limits, name=name) \
        if handler is None and cbcl_tools else None
    own_names: set[str] = set()
    listed = [Tool(name=tool.name, description=tool.description,
                   input_schema=dict(tool.input_schema), output_schema=dict(tool.output_schema))
              for tool in tools]

    async def list_tools(ctx: ServerRequestContext[Any],
                         params: PaginatedRequestParams | None) -> ListToolsResult:
        mine = [] if own is None else await own.list_tools()
        return ListToolsResult(tools=[*mine, *listed])

    async def call_tool(ctx: ServerRequestContext[Any],
                        params: CallToolRequestParams) -> CallToolResult:
        try:
            tool = by_name.get(params.name)
            if tool is not None:
                return await intents.call(tool, params.arguments or {})
            if not own_names and own is not None:
                own_names.update(tool.name for tool in await own.list_tools())
            if own is not None and params.name in own_names:
                done = await own.call_tool(params.name, params.arguments or {})
                if isinstance(done, CallToolResult):
                    return done
            return error_result(ValueError(f"unknown tool "
                                           f"{escape_invisible(params.name, limit=60)}"))
        except Exception as exc:  # never a crash (the SDK's own argument checks included)
            if own is not None and isinstance(exc, ToolError):
                return CallToolResult(content=[TextContent(
                    type="text", text=escape_invisible(str(exc).replace("\n", " ")))],
                    is_error=True)
            return error_result(exc)

    def input_schema(tool: str) -> dict[str, Any] | None:
        found = by_name.get(tool)
        return None if found is None else dict(found.input_schema)

    return Server(name, version=_version(), on_list_tools=list_tools, on_call_tool=call_tool,
                  get_tool_input_schema=input_schema)
