"""``cbcl a2a serve`` (a CBCL agent behind the a2a-sdk server) and the A2A path of ``cbcl
send --a2a URL`` (spec/interop.md §4.6, §4.7; spec/cbcl-1.0.md §6.1). Both need the ``a2a``
extra, imported when a command runs; without it the command is a usage error naming it."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from ..core._display import escape_invisible
from ..core._errors import ConnectionLost, ConversationClosed
from ..core._limits import DEFAULT_LIMITS
from ..demo import respond
from ..net._agent import load_handler, not_understood_exit
from ..protocol._message import Message
from ..protocol._registry import Registry
from ..protocol._trust import read_signed_descriptor_unverified, sign_message
from ._common import (
    EXIT_OK,
    MAX_DOCUMENT_BYTES,
    MAX_SECONDS,
    add_protocol_options,
    document_bytes,
    int_in,
    print_message,
    registry_from_args,
    seconds,
    usage_error,
)
from ._negotiate import signing_key

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from ._common import Commands

#: ``(option, kind, low, high, default, help)`` of the options that set
#: ``A2AServerLimits``: each option's dest is the field's name, and its default (shown in
#: the help; ``None`` derived) the field's default, which tests/test_a2a_server.py holds
#: to the dataclass's.
SERVER_OPTIONS: tuple[tuple[str, str, float, float, float | None, str], ...] = (
    ("--max-request-bytes", "int", 1, MAX_DOCUMENT_BYTES, None,
     "largest HTTP request body (default 4 x --max-message-bytes + 128 KiB)"),
    ("--request-timeout", "seconds", 0.001, MAX_SECONDS, 60.0,
     "seconds from a request's start to the end of its answer"),
    ("--handler-timeout", "seconds", 0.001, MAX_SECONDS, 30.0,
     "seconds a coroutine handler has"),
    ("--max-connections", "int", 1, 1 << 16, 64,
     "connections open at once (one more is closed when accepted)"),
    ("--header-timeout", "seconds", 0.001, MAX_SECONDS, 10.0,
     "seconds a connection has to send a request's headers"),
    ("--keep-alive-timeout", "int", 1, 3600, 5, "whole seconds an idle connection is kept"),
    ("--max-tasks", "int", 1, 1 << 24, 1024, "tasks kept (the oldest dropped)"),
    ("--max-task-bytes", "int", 1024, 1 << 40, 64 << 20,
     "bytes of tasks kept (the oldest dropped)"),
    ("--max-conversations", "int", 1, 1 << 24, 1024,
     "open conversations kept (the least recently used dropped)"),
    ("--max-conversation-messages", "int", 1, 1 << 24, 1024,
     "messages one conversation may hold (a client's message past it is refused)"),
    ("--replay-window", "int", 1, 1 << 24, 4096, "message ids remembered to refuse a replay"),
    ("--idle-task-timeout", "seconds", 0.001, MAX_SECONDS, 600.0,
     "seconds a task awaiting the client keeps its worker"),
)


def _dest(option: str) -> str:
    return option[2:].replace("-", "_")


def _a2a_modules(command: str) -> tuple[Any, Any]:
    """The A2A server and client modules; a usage error when the extra is missing."""
    try:
        from ..bridges import _a2a_client, _a2a_server
    except ImportError as exc:
        usage_error(command, f"{exc} (the a2a extra: pip install 'cbcl[a2a]')")
    return _a2a_server, _a2a_client


def _say(line: str) -> None:
    print(escape_invisible(line), flush=True)


# --------------------------------------------------------------------------- serve


def _cmd_serve(args: argparse.Namespace, data: bytes) -> int:
    server_module, _ = _a2a_modules("a2a serve")
    if not args.descriptor:
        usage_error("a2a serve", "give the protocols to serve: --descriptor FILE (repeatable)")
    if args.require_signatures and not args.trust:
        usage_error("a2a serve", "--require-signatures needs --trust DIR")
    handler: Any = respond
    if args.message_handler:
        try:
            handler = load_handler(args.message_handler)
        except (ValueError, ImportError, AttributeError, TypeError) as exc:
            usage_error("a2a serve", f"--handler {args.message_handler}: "
                                     f"{type(exc).__name__}: {exc}")
    try:
        limits = server_module.A2AServerLimits(
            **{_dest(option[0]): getattr(args, _dest(option[0])) for option in SERVER_OPTIONS
               if getattr(args, _dest(option[0])) is not None})
    except ValueError as exc:
        usage_error("a2a serve", str(exc))
    registry = registry_from_args(args)
    try:
        return asyncio.run(_serve(server_module, args, handler, registry, limits))
    except ValueError as exc:  # a bad or non-loopback --listen, a bad --name
        usage_error("a2a serve", str(exc))
    except OSError as exc:
        print(escape_invisible(f"a2a serve: cannot listen on {args.listen}: "
                               f"{exc.strerror or exc}"), file=sys.stderr)
        return 1


def _print_events() -> None:
    """Print the server's events (the ``cbcl.a2a`` logger's lines, each escaped where it
    quotes a peer) on standard output, as ``cbcl serve`` prints its transcript."""
    events = logging.getLogger("cbcl.a2a")
    if not any(getattr(h, "cbcl_a2a", False) for h in events.handlers):
        printer = logging.StreamHandler(sys.stdout)
        printer.setFormatter(logging.Formatter("%(message)s"))
        printer.cbcl_a2a = True  # type: ignore[attr-defined]
        events.addHandler(printer)
    events.setLevel(logging.INFO)


async def _serve(server_module: Any, args: argparse.Namespace, handler: Any,
                 registry: Registry | None, limits: Any) -> int:
    _print_events()
    server = await server_module.serve_a2a(
        handler, listen=args.listen, allow_remote=args.allow_remote, url=args.url,
        registry=registry, name=args.name, limits=args.limits, server_limits=limits,
        require_signatures=args.require_signatures, card_name=args.card_name)
    protocols = ", ".join(f"{p.id} version {p.descriptor.version}"
                          for p in server.app.state.executor.registry.protocols())
    _say(f"a2a: serving {protocols} at {server.url} (JSON-RPC, A2A 1.0 and 0.3); AgentCard "
         f"at {server.card_url}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    stopped = asyncio.ensure_future(stop.wait())
    ended = asyncio.ensure_future(server.wait())
    try:
        await asyncio.wait([stopped, ended], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        await server.close()
        ended.cancel()
    _say("a2a: stopped")
    return EXIT_OK


# --------------------------------------------------------------------------- send --a2a


def _usage(message: str) -> NoReturn:
    usage_error("send", message)


def send_a2a(args: argparse.Namespace, messages: list[Message]) -> int:
    """``cbcl send --a2a URL``: send ``messages`` (already read) in order to the A2A agent
    at URL and print each reply; returns the exit status. Raises :class:`CBCLError` for a
    message refused locally or a reply that fails its checks."""
    _, client_module = _a2a_modules("send")
    if args.connect or args.nats or args.to or args.durable:
        _usage("--a2a goes alone: not with --connect, --nats, --to or --durable")
    if args.binary or args.encoding != "any":
        _usage("--a2a carries CBCL text: not with --binary or --encoding")
    key = signing_key(args.key, args.key_id)
    with open(args.descriptor, "rb") as handle:
        document = handle.read(DEFAULT_LIMITS.max_string_bytes + 1)
    registry = Registry(trust=args.trust, limits=DEFAULT_LIMITS)
    # Our own descriptor, as `cbcl send` offers it: its payload, whatever signs it.
    registry.load(read_signed_descriptor_unverified(document).payload, allow_unsigned=True)
    try:
        return asyncio.run(_send(client_module, args, registry, messages, key))
    except ConnectionLost as exc:
        print(escape_invisible(f"send: {exc.one_line()}"), file=sys.stderr)
        return 1


async def _send(client_module: Any, args: argparse.Namespace, registry: Registry,
                messages: list[Message], key: tuple[str, Ed25519PrivateKey]) -> int:
    async with client_module.A2AClient(args.a2a, registry=registry,
                                       timeout=args.reply_timeout) as client:
        for message in messages:
            if message.signature is None:  # no handshake signs anything: the message is
                message = sign_message(message, key[1], key[0])  # signed itself
            try:
                answer = await client.send(message)
            except ConversationClosed as exc:
                print(escape_invisible(f"send: {exc.message}"), file=sys.stderr)
                return 1 if exc.reason in ("no-reply", "closed", "error") \
                    else not_understood_exit(exc.reason)
            if not args.no_reply:
                for reply in answer.messages:
                    print_message(reply, args.json)
                sys.stdout.flush()
    return EXIT_OK


# --------------------------------------------------------------------------- registration


def register(commands: Commands) -> None:
    """Add ``a2a`` (``a2a serve``) to ``cbcl``'s sub-commands."""
    group = commands.add_parser("a2a", help="CBCL over A2A (the Agent2Agent protocol)")
    a2a_commands = group.add_subparsers(dest="a2a_command", required=True,
                                        parser_class=type(group))
    s = a2a_commands.add_parser(
        "serve", help="serve a CBCL agent behind the a2a-sdk server: JSON-RPC and the "
                      "AgentCard (loopback only unless --allow-remote)")
    add_protocol_options(s)
    s.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT",
                   help="address to listen on (default 127.0.0.1:0: loopback, any free port)")
    s.add_argument("--allow-remote", action="store_true",
                   help="allow a --listen host that is not loopback (A2A authenticates "
                        "nobody: sign messages, use --require-signatures, put TLS in front)")
    s.add_argument("--url", metavar="URL",
                   help="the URL the AgentCard names (default http://HOST:PORT/)")
    s.add_argument("--name", metavar="URI",
                   help="this agent's CBCL URI: messages to another receiver are refused "
                        "(default: answer as the receiver of each message)")
    s.add_argument("--card-name", default="cbcl", metavar="NAME",
                   help="the AgentCard's name (default cbcl)")
    s.add_argument("--handler", dest="message_handler", metavar="MODULE:CALLABLE",
                   help="answer with handler(message, context) -> Message, messages or None "
                        "(as cbcl serve; the current directory is on the path); default "
                        "cbcl.demo:respond, the shipped conversations")
    s.add_argument("--require-signatures", action="store_true",
                   help="refuse unsigned messages (needs --trust)")
    s.add_argument("--max-message-bytes", type=document_bytes, metavar="N",
                   default=DEFAULT_LIMITS.max_message_bytes,
                   help=f"message size limit, 1 to {MAX_DOCUMENT_BYTES} "
                        f"(default {DEFAULT_LIMITS.max_message_bytes})")
    for option, kind, low, high, default, text in SERVER_OPTIONS:
        parse: Callable[[str], float]
        if kind == "int":
            parse, metavar, low_high = int_in(int(low), int(high)), "N", f"{low} to {high}"
        else:
            parse, metavar, low_high = seconds(low, high), "S", f"{low:g} to {high:g}"
        shown = "" if default is None else \
            f" (default {int(default) if kind == 'int' else f'{default:g}'})"
        s.add_argument(option, type=parse, default=None, metavar=metavar,
                       help=f"{text}: {low_high}{shown}")
    s.set_defaults(handler=_cmd_serve, file=None)

