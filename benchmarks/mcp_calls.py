"""Per-call latency of CBCL's MCP tools and of the request/v1 bridge, against plain MCP tools
that do the same work without CBCL, in the same run, in memory and over stdio.

    python benchmarks/mcp_calls.py [--calls 500] [--warmup 50] [--json PATH]

Four tools, each called ``--calls`` times one after another (one call in flight) with the
``mcp`` SDK's ``Client`` after ``--warmup`` untimed calls:

- ``cbcl parse``: the ``parse`` tool of ``cbcl mcp`` (:func:`cbcl.bridges._mcp.tools_server`) on one
  request/v1 REQUEST message, both passes and the schema;
- ``plain echo``: a plain MCP tool (``MCPServer``, async, a ``str`` argument) returning its
  argument: what MCP itself costs for the same text in and out;
- ``bridge add``: the bridge (:func:`cbcl.bridges._mcp.bridge_server`) serving a request/v1 handler
  with tool ``add``: the arguments mapped to a REQUEST, both passes, the schema and the
  conversation machine; the handler's INFORM checked the same way and mapped back;
- ``plain add``: a plain MCP tool ``add(a, b) -> int`` doing the handler's arithmetic.

In memory: ``Client(server)`` (the SDK's in-process dispatcher: no streams, no JSON-RPC
framing). Over stdio: ``python -m cbcl mcp --descriptor descriptors/request-v1.cbcl …``
for the CBCL tools and the bridge (``--handler mcp_calls:respond --tool add``), and
``python benchmarks/mcp_calls.py _plain`` for the plain tools, each a subprocess talking
JSON-RPC over pipes. Figures: median and 90th percentile per call, in ms. Exit status 0
unless the harness itself fails.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import installed
from mcp import Client, StdioServerParameters
from mcp.server.mcpserver import MCPServer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
REQUEST_V1 = ROOT / "descriptors" / "request-v1.cbcl"
MESSAGE = (
    '(CBCL/1.0 (message-id "m-1") (sender agent://ops/planner) (receiver agent://ops/backup) '
    '(intent REQUEST) (protocol request/v1) (conversation-id "c-1") (body (request :action '
    '(action :name backup :args (:paths ("/srv/a" "/srv/b") :size 1800000 :ratio 0.5)))))')


def respond(message: Any, context: Any) -> Any:
    """The bridge's request/v1 handler: ``add`` answers with the sum of ``:a`` and ``:b``."""
    from cbcl import Keyword, Symbol

    args = message.body[2][4]
    values = {str(args[i]): args[i + 1] for i in range(0, len(args), 2)}
    return context.reply("INFORM", (Symbol("inform-result"), Keyword("action-id"), "a-1",
                                    Keyword("result"), values["a"] + values["b"]))


def plain_server() -> MCPServer:
    server: MCPServer = MCPServer("plain", log_level="WARNING")

    @server.tool(name="echo", description="return the text")
    async def echo(message: str) -> str:
        return message

    @server.tool(name="add", description="add two integers")
    async def add(a: int, b: int) -> int:
        return a + b

    return server


def _registry() -> Any:
    from cbcl import Registry

    registry = Registry(disk_cache=False, isolate=False)
    registry.load(REQUEST_V1.read_bytes(), allow_unsigned=True)
    return registry


def _stdio(*args: str, cwd: Path = ROOT) -> StdioServerParameters:
    # (-P: the checkout, the cwd, is not on the child's path, so it imports the installed cbcl)
    return StdioServerParameters(command=installed.PYTHON[0], args=[*installed.PYTHON[1:], *args],
                                 cwd=str(cwd))


async def _time(client: Client, tool: str, arguments: dict[str, Any], calls: int,
                warmup: int, check: Callable[[Any], bool]) -> list[float]:
    for _ in range(warmup):
        result = await client.call_tool(tool, arguments)
        if result.is_error or not check(result):
            raise SystemExit(f"{tool}: unexpected result {result!r:.300}")
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        await client.call_tool(tool, arguments)
        times.append(time.perf_counter() - start)
    return times


def _text(result: Any) -> str:
    return str(result.content[0].text)


async def run(calls: int, warmup: int) -> list[dict[str, Any]]:
    from cbcl.bridges._mcp import bridge_server, tools_server

    registry = _registry()
    cases: list[tuple[str, str, Callable[[], Any], str, dict[str, Any],
                      Callable[[Any], bool]]] = [
        ("cbcl parse", "in memory", lambda: tools_server(registry), "parse",
         {"message": MESSAGE}, lambda r: _text(r).startswith("(CBCL/1.0")),
        ("plain echo", "in memory", plain_server, "echo", {"message": MESSAGE},
         lambda r: _text(r) == MESSAGE),
        ("bridge add", "in memory", lambda: bridge_server(respond, ["add"], registry=registry),
         "add", {"a": 2, "b": 40}, lambda r: _text(r) == "42"),
        ("plain add", "in memory", plain_server, "add", {"a": 2, "b": 40},
         lambda r: _text(r) == "42"),
        ("cbcl parse", "stdio", lambda: _stdio("-m", "cbcl", "mcp", "--descriptor",
                                               str(REQUEST_V1), "--allow-unsigned"),
         "parse", {"message": MESSAGE}, lambda r: _text(r).startswith("(CBCL/1.0")),
        ("plain echo", "stdio", lambda: _stdio(str(HERE / "mcp_calls.py"), "_plain"),
         "echo", {"message": MESSAGE}, lambda r: _text(r) == MESSAGE),
        ("bridge add", "stdio", lambda: _stdio(
            "-m", "cbcl", "mcp", "--descriptor", str(REQUEST_V1), "--allow-unsigned",
            "--handler", "mcp_calls:respond", "--tool", "add", cwd=HERE),
         "add", {"a": 2, "b": 40}, lambda r: _text(r) == "42"),
        ("plain add", "stdio", lambda: _stdio(str(HERE / "mcp_calls.py"), "_plain"),
         "add", {"a": 2, "b": 40}, lambda r: _text(r) == "42"),
    ]
    rows = []
    for system, transport, make, tool, arguments, check in cases:
        async with Client(make(), read_timeout_seconds=60) as client:
            times = await _time(client, tool, arguments, calls, warmup, check)
        times.sort()
        rows.append({"system": system, "transport": transport, "calls": calls,
                     "median_ms": statistics.median(times) * 1e3,
                     "p90_ms": times[int(0.9 * (len(times) - 1))] * 1e3})
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["_plain"]:
        plain_server().run("stdio")
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--json", metavar="PATH", default=None)
    args = parser.parse_args(argv)
    installed.check()  # the installed cbcl, with its C extension
    runner: Callable[[], Awaitable[list[dict[str, Any]]]] = lambda: run(args.calls,  # noqa: E731
                                                                        args.warmup)
    rows = anyio.run(runner)
    print(f"{'tool':<12} {'transport':<10} {'median ms':>10} {'p90 ms':>8}")
    for row in rows:
        print(f"{row['system']:<12} {row['transport']:<10} {row['median_ms']:>10.3f} "
              f"{row['p90_ms']:>8.3f}")
    by = {(row["system"], row["transport"]): row["median_ms"] for row in rows}
    for transport in ("in memory", "stdio"):
        print(f"{transport}: cbcl parse / plain echo = "
              f"{by[('cbcl parse', transport)] / by[('plain echo', transport)]:.2f}x, "
              f"bridge add / plain add = "
              f"{by[('bridge add', transport)] / by[('plain add', transport)]:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
