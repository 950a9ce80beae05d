"""``cbcl mcp``: an MCP server over standard input and output (:mod:`cbcl.bridges._mcp`;
needs the ``mcp`` extra): CBCL's tools (parse, canonical, check, export, prompt) and one
tool per intent of each ``--descriptor``; with ``--handler``, an agent of those protocols
answering the intent tools; with ``--handler`` and ``--tool``, a request/v1 agent's
actions as tools."""

from __future__ import annotations

import argparse
import functools
from typing import TYPE_CHECKING

from ..core._limits import DEFAULT_LIMITS
from ..net._agent import load_handler
from ._common import (
    EXIT_OK,
    MAX_DOCUMENT_BYTES,
    add_protocol_options,
    document_bytes,
    int_in,
    registry_from_args,
    seconds,
    usage_error,
)

if TYPE_CHECKING:
    from ._common import Commands


def _cmd_mcp(args: argparse.Namespace, data: bytes) -> int:
    try:
        import anyio

        from ..bridges import _mcp
    except ImportError as exc:
        usage_error("cbcl mcp", f"{exc} (the mcp extra: pip install 'cbcl[mcp]')")
    registry = registry_from_args(args)
    if args.respond is None:
        if args.tool:
            usage_error("cbcl mcp", "--tool needs --handler")
        server: object = _mcp.protocol_server(registry, limits=args.limits)
    else:
        try:
            respond = load_handler(args.respond)
        except (ValueError, ImportError, AttributeError, TypeError) as exc:
            usage_error("cbcl mcp", f"--handler: {exc}")
        if registry is None or not registry.protocols():
            usage_error("cbcl mcp", "--handler needs --descriptor (the protocols it answers)")
        try:
            if args.tool:
                if registry.get(_mcp.REQUEST_PROTOCOL) is None:
                    usage_error("cbcl mcp", f"--tool needs --descriptor of "
                                            f"{_mcp.REQUEST_PROTOCOL}")
                tools = []
                for spec in args.tool:
                    name, _, description = spec.partition("=")
                    tools.append(_mcp.BridgeTool(name, description))
                server = _mcp.bridge_server(respond, tools, registry=registry,
                                            limits=args.limits, client=args.client,
                                            agent=args.agent, timeout=args.handler_timeout,
                                            threads=args.handler_threads,
                                            expose_errors=args.expose_errors)
            else:
                server = _mcp.protocol_server(registry, handler=respond, limits=args.limits,
                                              timeout=args.handler_timeout,
                                              threads=args.handler_threads,
                                              expose_errors=args.expose_errors)
        except ValueError as exc:
            usage_error("cbcl mcp", str(exc))
    anyio.run(functools.partial(_mcp.run_stdio, server,  # type: ignore[arg-type]
                                limits=args.limits, max_line_bytes=args.max_line_bytes))
    return EXIT_OK


def register(commands: Commands) -> None:
    """Add ``mcp`` to ``commands`` (the ``cbcl`` subcommands)."""
    m = commands.add_parser(
        "mcp", help="serve CBCL's tools (parse, canonical, check, export, prompt) and one "
                    "tool per intent of each --descriptor over MCP stdio; with --handler, "
                    "an agent answering the intent tools (with --tool: a request/v1 "
                    "agent's actions as tools)")
    add_protocol_options(m)
    m.add_argument("--handler", dest="respond", metavar="MODULE:CALLABLE", default=None,
                   help="answer each intent tool's message with this handler, "
                        "respond(message, context), whose last reply is the result (needs "
                        "--descriptor); with --tool, a request/v1 handler whose actions "
                        "are the tools")
    m.add_argument("--tool", action="append", default=[], metavar="NAME[=DESCRIPTION]",
                   help="with --handler: an action the agent answers, one MCP tool "
                        "(repeatable)")
    m.add_argument("--client", default="mcp://client", metavar="URI",
                   help="with --handler: the sender of the REQUEST messages "
                        "(default mcp://client)")
    m.add_argument("--agent", default=None, metavar="URI",
                   help="with --handler: their receiver (default agent://mcp-bridge)")
    m.add_argument("--handler-timeout", type=seconds(0.001, 86_400), default=30.0, metavar="S",
                   help="with --handler: seconds the handler has per call; then the call is "
                        "answered isError (default 30)")
    m.add_argument("--handler-threads", type=int_in(1, 4096), default=8, metavar="N",
                   help="with --handler: threads running a plain (not async) handler, one "
                        "per call at once; one whose call overran keeps its thread until "
                        "the handler returns: 1 to 4096 (default 8)")
    m.add_argument("--expose-errors", action="store_true",
                   help="with --handler: a failed call's result carries the exception's "
                        "text (default: only its type)")
    m.add_argument("--max-message-bytes", type=document_bytes, metavar="N",
                   default=DEFAULT_LIMITS.max_message_bytes,
                   help=f"message (and tool argument) size limit, 1 to {MAX_DOCUMENT_BYTES} "
                        f"(default {DEFAULT_LIMITS.max_message_bytes})")
    m.add_argument("--max-line-bytes", type=int_in(1, 1 << 40), metavar="N", default=None,
                   help="the longest JSON-RPC line read from standard input, in bytes (a "
                        "longer one is discarded as it arrives and answered -32600); "
                        "default 10 x --max-message-bytes + 64 KiB")
    m.set_defaults(handler=_cmd_mcp, file=None)
