"""The ``cbcl send`` command (spec/negotiation.md §7): connect, negotiate the protocol of a
signed descriptor if the peer does not hold it yet, send each message file in order, print
each reply.

Each MESSAGE_FILE holds one whole message (text, envelope and body). All of them go from
one sender to one receiver in the descriptor's protocol: the sender is this agent's name,
the receiver the peer's. Every message is checked by the session before it is sent (both
passes, the schema, the conversation machine), so a message the protocol refuses is
refused here, with its code, and never reaches the peer. After each message the command
waits (``--reply-timeout``) for the peer's next message in the same conversation (for a
message without a conversation-id: the peer's message ``in-reply-to`` it), unless the
message finished the conversation or ``--no-reply`` is given. A peer that answers with a
NOT-UNDERSTOOD in the conversation (its handler failed, overran or gave a reply the
protocol refuses: spec/negotiation.md §6.3) ends the command at once: one line naming the
reason code, exit 8 (1 for ``shutdown``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from ..core._display import escape_invisible
from ..core._errors import ConnectionLost
from ..core._files import UnsafeFile, read_regular_file
from ..core._limits import DEFAULT_LIMITS
from ..net._agent import Agent, ConversationClosed, Link, PeerFailed, not_understood_exit
from ..net._transport import ConnectionLimits, parse_address
from ..protocol._api import parse
from ..protocol._message import Message
from ._a2a import send_a2a
from ._common import (
    MAX_SECONDS,
    Commands,
    int_in,
    print_message,
    seconds,
    usage_error,
)
from ._negotiate import (
    CONNECTION_OPTIONS,
    add_limit_options,
    connection_limits,
    encodings_of,
    nats_servers,
    signing_key,
)

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

DEFAULT_REPLY_TIMEOUT = 10.0


def _usage(message: str) -> NoReturn:
    usage_error("send", message)


def _read_messages(paths: list[str]) -> list[Message]:
    messages = []
    for path in paths:
        try:
            data = read_regular_file(Path(path), max_bytes=DEFAULT_LIMITS.max_message_bytes,
                                     what="message")
        except UnsafeFile as exc:
            _usage(f"{path}: {exc}")
        messages.append(parse(data, envelope_only=True))
    first = messages[0]
    for path, message in zip(paths, messages, strict=True):
        if (message.sender, message.receiver) != (first.sender, first.receiver):
            _usage(f"{path}: goes from {message.sender} to {message.receiver}, but "
                   f"{paths[0]} from {first.sender} to {first.receiver}: one sender, one "
                   "receiver")
    return messages


async def send_messages(address: str, document: bytes, key: tuple[str, Ed25519PrivateKey],
                        messages: list[Message], *, trust: str | None,
                        encodings: tuple[str, ...], expect_replies: bool,
                        reply_timeout: float, as_json: bool,
                        limits: ConnectionLimits | None = None, nats: str | None = None,
                        durable: bool = False, replicas: int = 1) -> int:
    """Send ``messages`` to the agent at ``address`` (or, with ``nats``, to the agent
    named by their receiver on that NATS server or cluster; with ``durable`` too, into its
    JetStream stream, without a handshake) and print the replies; returns the exit
    status. Raises :class:`CBCLError` (negotiation refused, a message refused locally,
    the connection lost)."""
    first = messages[0]
    agent = Agent(first.sender, key=key, trust=trust, encodings=encodings,
                  connection_limits=limits, reply_timeout=reply_timeout)
    bus = None
    try:
        if nats is not None:
            from ..net._nats import NatsBus

            bus = await NatsBus.connect(agent, nats)
            if durable:
                return await _send_durable(bus, messages, document, replicas)
            link = await bus.open_link(first.receiver, descriptor=document)
        else:
            link = await agent.connect(address, peer=first.receiver, descriptor=document)
        for message in messages:
            status = await _send_one(link, message, expect_replies, as_json)
            if status:
                return status
        return 0
    finally:
        if bus is not None:
            await bus.close()
        await agent.close()


async def _send_durable(bus: Any, messages: list[Message], document: bytes,
                        replicas: int) -> int:
    for message in messages:
        try:
            duplicate = await bus.send_durable(message, descriptor=document,
                                               replicas=replicas)
        except ValueError as exc:
            _usage(str(exc))
        again = " (the server had it already: dropped as a duplicate)" if duplicate else ""
        print(escape_invisible(f'send: "{message.message_id}" stored for '
                               f"{message.receiver}{again}"))
        sys.stdout.flush()
    return 0


async def _send_one(link: Link, message: Message, expect_replies: bool, as_json: bool) -> int:
    cid = message.conversation_id
    conversation = None
    if expect_replies:
        conversation = link.conversation_for(cid) if cid is not None \
            else link.expect_reply(message.message_id)
    step = await link.send(message)
    if (step is not None and step.finished) or conversation is None:
        return 0
    try:
        reply = await conversation.next()
    except PeerFailed as exc:  # the peer could not answer: its reason, at once
        print(escape_invisible(f"send: {exc.message}"), file=sys.stderr)
        return exc.exit_code
    except ConversationClosed as exc:
        print(escape_invisible(f"send: {exc.message}"), file=sys.stderr)
        return 1 if exc.reason in ("no-reply", "closed", "error") \
            else not_understood_exit(exc.reason)
    print_message(reply, as_json)
    sys.stdout.flush()
    return 0


def _cmd_send(args: argparse.Namespace, data: bytes) -> int:

    if args.replicas is not None and not args.durable:
        _usage("--replicas goes with --durable")
    if args.a2a:  # (spec/interop.md §4.7: cbcl/cli/_a2a.py)
        return send_a2a(args, _read_messages(args.messages))
    if bool(args.connect) == bool(args.nats):
        _usage("give --connect ADDRESS or --nats URL (one of them)")
    servers = None
    if args.nats:
        servers = nats_servers(args)
    else:
        if args.to is not None or args.durable:
            _usage("--to and --durable go with --nats")
        try:
            parse_address(args.connect)
        except ValueError as exc:
            _usage(str(exc))
    messages = _read_messages(args.messages)
    if args.to is not None and str(messages[0].receiver) != args.to:
        _usage(f"the messages go to {messages[0].receiver}, not --to {args.to}")
    with open(args.descriptor, "rb") as handle:
        document = handle.read(DEFAULT_LIMITS.max_string_bytes + 1)
    key = signing_key(args.key, args.key_id)
    encoding = "binary" if args.binary else args.encoding
    try:
        return asyncio.run(send_messages(
            args.connect, document, key, messages, trust=args.trust,
            encodings=encodings_of(encoding), expect_replies=not args.no_reply,
            reply_timeout=args.reply_timeout, as_json=args.json,
            limits=connection_limits(args), nats=servers, durable=args.durable,
            replicas=args.replicas or 1))
    except ConnectionLost as exc:
        print(escape_invisible(f"send: {exc.one_line()}"), file=sys.stderr)
        return 1


def register(commands: Commands) -> None:
    """Add ``send`` to ``cbcl``'s sub-command action."""
    p = commands.add_parser(
        "send", help="send messages of a protocol to an agent; print its replies")
    p.add_argument("messages", nargs="+", metavar="MESSAGE_FILE",
                   help="one whole CBCL message (text) per file, sent in order")
    p.add_argument("--connect", metavar="HOST:PORT",
                   help="the peer: HOST:PORT or unix:PATH (or --nats)")
    p.add_argument("--nats", metavar="URL",
                   help="reach the peer over NATS instead: nats://HOST:PORT[,…]; the peer "
                        "is the messages' receiver")
    p.add_argument("--a2a", metavar="URL",
                   help="reach the peer over A2A instead: the base URL of its AgentCard "
                        "(needs the a2a extra; each unsigned message is signed with --key)")
    p.add_argument("--to", metavar="URI",
                   help="with --nats: the peer agent's name (must be the messages' receiver)")
    p.add_argument("--durable", action="store_true",
                   help="with --nats: store each message in the receiver's JetStream stream "
                        "(made as the receiver makes it if the receiver never started; no "
                        "handshake: the receiver must hold the protocol; no replies are "
                        "awaited; a message id already stored is dropped)")
    p.add_argument("--replicas", type=int_in(1, 5), metavar="N",
                   help="with --durable: copies of the receiver's stream if this makes it, "
                        "1 to 5 (default 1; an existing stream is left as it is)")
    p.add_argument("--descriptor", required=True, metavar="SIGNED",
                   help="the signed descriptor of the messages' protocol (offered if the "
                        "peer does not hold it)")
    p.add_argument("--key", required=True, metavar="KEY",
                   help="Ed25519 private key that signs the transcript confirmation")
    p.add_argument("--key-id", metavar="ID", help="key id of --key (default: file stem)")
    p.add_argument("--trust", metavar="DIR",
                   help="trust store for the peer: its transcript confirmation must be signed "
                        "by a key here; without it the peer is not authenticated")
    p.add_argument("--encoding", choices=("any", "text", "binary"), default="any",
                   help="encodings to offer (default any: binary, then text)")
    p.add_argument("--binary", action="store_true", help="the same as --encoding binary")
    p.add_argument("--json", action="store_true", help="print replies as JSON (spec §7.2)")
    p.add_argument("--no-reply", action="store_true",
                   help="do not wait for replies")
    p.add_argument("--reply-timeout", type=seconds(0.001, MAX_SECONDS),
                   default=DEFAULT_REPLY_TIMEOUT, metavar="S",
                   help=f"wait at most S for each reply: 0.001 to {MAX_SECONDS:g} "
                        f"(default {DEFAULT_REPLY_TIMEOUT:g}; none: exit 1)")
    add_limit_options(p, CONNECTION_OPTIONS, ConnectionLimits())
    p.set_defaults(handler=_cmd_send, file=None)
