"""The ``cbcl serve`` and ``cbcl negotiate`` commands (spec/negotiation.md §7).

``register(commands)`` adds both to the ``cbcl`` parser; handlers follow ``cbcl.cli._main``'s
convention ``handler(args, data) -> exit code`` and let errors reach ``main()``, which
prints one line and exits with the error's code. ``python -m cbcl.cli._negotiate`` runs the
``cbcl`` command line with these two commands, wired in or not.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..core._canonical import canonical_value
from ..core._display import escape_invisible
from ..core._errors import ConnectionLost, TrustError
from ..core._files import UnsafeFile, read_regular_file
from ..core._limits import DEFAULT_LIMITS, Limits
from ..core._reader import read
from ..core._values import URI
from ..demo import respond
from ..net._agent import (
    REJECT_EXIT,
    Agent,
    Handler,
    NegotiationFailed,
    load_handler,
    not_understood_exit,
)
from ..net._handlers import HandlerLimits, on_loop
from ..net._transport import (
    Connection,
    ConnectionLimits,
    Server,
    ServerLimits,
    connect,
    parse_address,
)
from ..protocol._api import parse
from ..protocol._message import Intent, Message
from ..protocol._protocol import Protocol
from ..protocol._registry import Registry
from ..protocol._trust import (
    TrustStore,
    load_private_key,
    private_key_pem,
    public_key_pem,
    read_signed_descriptor_unverified,
    sign_descriptor,
)
from ..session._session import (
    Accepted,
    ConnectionClosed,
    Established,
    Finished,
    NotUnderstood,
    Offer,
    ProtocolMessage,
    Query,
    Rejected,
    Session,
    Supported,
    Unsupported,
    negotiation_registry,
)
from ._common import (
    LOG_FORMATS,
    LOG_LEVELS,
    MAX_SECONDS,
    Commands,
    cli_log,
    int_in,
    lean_log_records,
    log_to,
    seconds,
    usage_error,
)

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

EXIT_OK = 0
SERVER_NAME = "agent://cbcl/serve"
CLIENT_NAME = "agent://cbcl/negotiate"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _short(text: str, width: int = 76) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _body_text(message: Message) -> str:
    return "" if message.body is None else _short(canonical_value(message.body))


# --------------------------------------------------------------------------- agents


def demo_conversation(protocol: Protocol, me: str, peer: str, tag: str) -> list[Message]:
    """The initiator's messages of the demo conversation, in order (contract-net/v1: a
    call for proposals, then the award of the proposal that comes back)."""
    if str(protocol.id) != "contract-net/v1":
        return []
    cid = f"job-{tag}"
    cfp = Message(message_id=f"cn-{tag}-1", sender=me, receiver=peer, intent=Intent.CFP,
                  protocol=protocol.id, conversation_id=cid, body=read(
                      b'(cfp :task (task :id "t-4711" :action render-video :params '
                      b'(:resolution "1080p" :frames 2400)) :deadline 1764503600000)'))
    accept = Message(message_id=f"cn-{tag}-2", sender=me, receiver=peer, intent=Intent.ACCEPT,
                     protocol=protocol.id, conversation_id=cid,
                     body=read(b'(accept-proposal :task-id "t-4711")'))
    return [cfp, accept]


# --------------------------------------------------------------------------- serve


def _say(line: str) -> None:
    # Lines may quote a peer (the initiator's transcript): never a raw control character.
    print(escape_invisible(line), flush=True)


def _load_dir(registry: Registry, directory: str | None, limits: Limits) -> list[Protocol]:
    """Load every ``*.cbcl`` of ``directory`` (signed descriptors) into ``registry``, each
    read as a regular file of at most the message limit; returns the protocols (which each
    session's registry adopts)."""
    protocols = []
    if directory:
        for path in sorted(Path(directory).glob("*.cbcl")):
            try:
                data = read_regular_file(path, max_bytes=limits.max_message_bytes,
                                         what="descriptor")
            except (UnsafeFile, OSError) as exc:
                raise TrustError("descriptor verification failed",
                                 reason=f"{path}: {getattr(exc, 'strerror', None) or exc}"
                                 ) from None
            protocols.append(registry.load(data))
    return protocols


def nats_servers(args: argparse.Namespace) -> str:
    """``--nats URL[,URL…]`` checked: every URL ``nats://``, ``tls://`` (or ``ws://``,
    ``wss://``) with a host and port. A usage error otherwise."""
    urls = [u.strip() for u in args.nats.split(",")]
    for url in urls:
        scheme, sep, rest = url.partition("://")
        host, colon, port = rest.rpartition(":")
        if not sep or scheme not in ("nats", "tls", "ws", "wss") or not host \
                or not colon or not port.isdigit() or not 0 < int(port) < 65536:
            _usage(args, f"--nats: expected nats://HOST:PORT[,nats://HOST:PORT…], not "
                         f"{url!r}")
    return ",".join(urls)


def _one_edge(args: argparse.Namespace, option: str) -> None:
    given = [name for name, value in ((option, getattr(args, option[2:])),
                                      ("--nats", args.nats)) if value]
    if len(given) != 1:
        _usage(args, f"give {option} or --nats (one of them)")


def _cmd_serve(args: argparse.Namespace, data: bytes) -> int:
    _one_edge(args, "--listen")
    if args.replicas is not None and not args.durable:
        _usage(args, "--replicas goes with --durable")
    if args.nats:
        nats_servers(args)
    else:
        if args.durable:
            _usage(args, "--durable goes with --nats")
        try:
            parse_address(args.listen)
        except ValueError as exc:
            _usage(args, str(exc))
    limits = Limits(max_message_bytes=args.max_frame_bytes)
    store = TrustStore.from_directory(args.trust, limits=limits)
    warm_up()
    signing = signing_key(args.key, args.key_id) if args.key else None
    handler = None
    if args.message_handler:
        try:
            handler = load_handler(args.message_handler)
        except (ValueError, ImportError, AttributeError, TypeError) as exc:
            _usage(args, f"--handler {args.message_handler}: {type(exc).__name__}: {exc}")
    with contextlib.ExitStack() as stack:
        state = args.state or stack.enter_context(tempfile.TemporaryDirectory(
            prefix="cbcl-serve-state-"))
        preload = _load_dir(Registry(trust=store, state_dir=state, limits=limits),
                            args.descriptors, limits)
        config = ServeConfig(
            listen=args.listen or "", trust=store, state=state, name=args.name,
            signing=signing, limits=limits, connection=connection_limits(args),
            server=server_limits(args), preload=tuple(preload), handler=handler,
            nats=nats_servers(args) if args.nats else None, durable=args.durable,
            replicas=args.replicas,
            handler_timeout=args.handler_timeout, handlers=handler_limits(args),
            expose_errors=args.expose_errors)
        logged = log_to(sys.stdout, args.log_format, LOG_LEVELS[args.log_level])
        lean_log_records()  # this process is serve's own: records without what it never shows
        try:
            return asyncio.run(_serve_main(args, config))
        finally:
            logged.close()


@dataclass(frozen=True)
class ServeConfig:
    """Everything ``cbcl serve`` runs with (its options, read and checked)."""

    listen: str
    trust: TrustStore
    state: str | Path
    name: str = SERVER_NAME
    signing: tuple[str, Ed25519PrivateKey] | None = None
    limits: Limits = DEFAULT_LIMITS
    connection: ConnectionLimits = field(default_factory=ConnectionLimits)
    server: ServerLimits = field(default_factory=ServerLimits)
    preload: tuple[Protocol, ...] = ()
    handler: Handler | None = None
    #: ``--nats``: serve on this NATS server or cluster instead of ``listen``.
    nats: str | None = None
    durable: bool = False
    #: ``--replicas``: copies of the durable stream in a cluster (``None``: 1 for a new
    #: stream, an existing one's own).
    replicas: int | None = None
    #: ``--handler-timeout``, the handler limits, ``--expose-errors``.
    handler_timeout: float = 30.0
    handlers: HandlerLimits = field(default_factory=HandlerLimits)
    expose_errors: bool = False


def serving_agent(config: ServeConfig, say: Callable[[str], None] | None = None) -> Agent:
    """``cbcl serve``'s :class:`~cbcl.Agent`: named ``config.name``, answering with
    ``config.handler`` (default the shipped responder, :func:`cbcl.demo.respond`) under
    the configured limits; its events go to the ``cbcl.net`` logger and, with ``say``,
    one line each through it too."""
    return Agent(config.name, key=config.signing, trust=config.trust, state=config.state,
                 descriptors=config.preload, limits=config.limits,
                 connection_limits=config.connection, server_limits=config.server,
                 handler=config.handler or on_loop(respond), log=say,
                 handler_timeout=config.handler_timeout, handler_limits=config.handlers,
                 expose_errors=config.expose_errors)


async def start_serving(config: ServeConfig, say: Callable[[str], None] | None) -> Server:
    """Start ``cbcl serve``'s server on the running loop: :func:`serving_agent`, one log
    line per event through ``say`` (and the ``cbcl.net`` logger). What a trusted peer
    teaches is kept for the process (and, with a state directory, across restarts), so a
    returning peer's question is answered "supported". Raises :class:`ConnectionLost` when
    the address cannot be used."""
    agent = serving_agent(config, say)
    try:
        server = await agent.serve(config.listen)
    except BaseException:
        await agent.close()
        raise
    server.on_close.append(agent.pool.close)
    return server


def listening_address(server: Server, listen: str) -> str:
    """Where ``server`` listens, as ``HOST:PORT`` (the port picked for port 0) or
    ``unix:PATH``."""
    sockets = server.sockets
    if sockets and not listen.startswith("unix:"):
        host, port = sockets[0].getsockname()[:2]
        return f"{host}:{port}"
    return listen


def _note(text: str, event: str, **fields: Any) -> None:
    """One line of ``cbcl serve``'s own (listening, stopping), as a ``cbcl.cli`` record."""
    cli_log.info("%s", text, extra={"cbcl": {"event": event, **fields}})


async def _serve_main(args: argparse.Namespace, config: ServeConfig) -> int:
    if config.nats is not None:
        return await _serve_nats(config)
    stop = _stop_event()
    agent = serving_agent(config)
    try:
        server = await agent.serve(config.listen)
    except BaseException:
        await agent.close(grace=0.001)
        raise
    address = listening_address(server, config.listen)
    _note(f"serve: listening on {address} as {config.name}", "listening", address=address,
          name=config.name)
    try:
        await stop.wait()
    finally:
        # Stop listening (removing the unix socket it created, and only that one), let the
        # handlers in flight finish within the grace period, close every link.
        _note(f"serve: stopping (handlers in flight have "
              f"{config.handlers.shutdown_grace:g} s to finish)", "stopping")
        await agent.close()
        await server.wait_closed()
    _note("serve: stopped", "stopped")
    return EXIT_OK


def _stop_event() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    return stop


async def _serve_nats(config: ServeConfig) -> int:
    """``cbcl serve --nats``: the same agent, on the agent's NATS subject (and, with
    ``--durable``, its JetStream stream)."""
    from ..net._nats import NatsBus

    agent = serving_agent(config)
    stop = _stop_event()
    try:
        bus = await NatsBus.connect(agent, config.nats or "")
    except BaseException:
        await agent.close(grace=0.001)
        raise
    try:
        await bus.serve()
        if config.durable:  # (retried while the stream is unavailable, then exit 1)
            await bus.enable_durable(replicas=config.replicas)
        durable = f", durable on {bus.durable_subject(agent.name)}" if config.durable else ""
        _note(f"serve: listening on NATS {config.nats} as {config.name} (subject "
              f"{bus.agent_subject(agent.name)}{durable})", "listening", name=config.name)
        await stop.wait()
    finally:
        _note(f"serve: stopping (handlers in flight have "
              f"{config.handlers.shutdown_grace:g} s to finish)", "stopping")
        await agent.drain()
        await bus.close()
        await agent.close(grace=0.001)
    _note("serve: stopped", "stopped")
    return EXIT_OK


# --------------------------------------------------------------------------- negotiate


def warm_up() -> None:
    """Compile the envelope and cbcl-negotiation/v1 grammars now, not in the first session
    (so handshake timings measure the handshake)."""

    parse(b'(CBCL/1.0 (message-id "warm-up") (sender agent://a) (receiver agent://b) '
          b"(intent NOT-UNDERSTOOD) (protocol cbcl-negotiation/v1))",
          registry=negotiation_registry())


def signing_key(path: str, key_id: str | None) -> tuple[str, Ed25519PrivateKey]:
    with open(path, "rb") as handle:
        data = handle.read(1 << 16)
    try:
        key = load_private_key(data)
    except TrustError as exc:
        raise TrustError(exc.message, reason=f"{path}: {exc.reason}") from None
    return (key_id or Path(path).stem, key)


class Transcript:
    """Prints who said what, with sizes and times, for people."""

    def __init__(self, out: Callable[[str], None], started: float) -> None:
        self.out = out
        self.started = started

    def line(self, who: str, what: str, size: int | None = None) -> None:
        at = (time.perf_counter() - self.started) * 1000
        sized = f"  [{size} B]" if size else ""
        self.out(f"  {at:7.1f} ms  {who:6} {what}{sized}")


async def run_initiator(address: str, document: bytes, key: tuple[str, Ed25519PrivateKey], *,
                        encodings: tuple[str, ...], out: Callable[[str], None],
                        limits: ConnectionLimits | None = None, pace: float = 0.0,
                        peer: str = SERVER_NAME, me: str = CLIENT_NAME, tag: str = "1",
                        server_log: _ServerLog | None = None, trust: str | Path | None = None,
                        opener: Callable[[Session], Awaitable[Connection]] | None = None,
                        ) -> dict[str, float]:
    """Connect, negotiate the protocol of the signed ``document``, run its demo
    conversation, close. With ``trust`` (a trust directory), the peer's transcript
    confirmation must be signed by a key in it. ``opener`` makes the connection for the
    session (default: a TCP or unix-socket connection to ``address``; ``cbcl negotiate
    --nats`` passes a NATS one). Returns timings (ms). Raises
    :class:`NegotiationFailed` when the peer rejects the offer, and
    :class:`RemoteProtocolError`/:class:`ConnectionLost`."""
    payload = read_signed_descriptor_unverified(document).payload
    registry = Registry(disk_cache=True, trust=trust)
    protocol = registry.load(payload, allow_unsigned=True)  # our own descriptor
    warm_up()
    session = Session("initiator", registry=registry, me=me, peer=peer, encodings=encodings,
                      signing_key=key, require_signed_finished=trust is not None,
                      max_frame_bytes=(limits or ConnectionLimits()).max_frame_bytes)
    started = time.perf_counter()
    show = Transcript(out, started)
    connection = await (opener(session) if opener is not None
                        else connect(address, session, limits=limits))
    timings: dict[str, float] = {}
    try:
        size = await connection.send(Query(str(protocol.id), protocol.digest,
                                           (protocol.descriptor.version,), encodings))
        show.line("A -> B", f"QUERY    (supports {protocol.id} {protocol.digest[:19]}… "
                  f"versions ({protocol.descriptor.version}) encodings "
                  f"({' '.join(encodings)}))", size)
        script = demo_conversation(protocol, me, peer, tag)
        while True:
            event = await connection.next_event()
            size = session.last_frame_bytes
            if isinstance(event, Unsupported):
                known = " ".join(map(str, event.known)) or "none"
                show.line("B -> A", f"INFORM   (unsupported: B knows versions: {known})", size)
                offer_size = await connection.send(Offer(document))
                show.line("A -> B", f"PROPOSE  (offer: signed descriptor, "
                          f"{len(document)} bytes)", offer_size)
            elif isinstance(event, (Supported, Accepted)):
                if server_log is not None:
                    for text in await server_log.until("accepted" if isinstance(
                            event, Accepted) else "->"):
                        show.out(f"{'':20}B's log: {text}")
                name = "ACCEPT  " if isinstance(event, Accepted) else "INFORM  "
                word = "accepted" if isinstance(event, Accepted) else "supported"
                show.line("B -> A", f"{name} ({word} {event.protocol} version "
                          f"{event.version}, encoding {event.encoding})", size)
                show.line("A -> B", "CONFIRM  (finished: transcript hash, signed)",
                          connection.last_flush_bytes or None)
            elif isinstance(event, Rejected):
                if server_log is not None:
                    for text in await server_log.until("rejected"):
                        show.out(f"{'':20}B's log: {text}")
                show.line("B -> A", f"REJECT   (rejected: {event.reason})", size)
                raise NegotiationFailed(f"the peer rejected the offer of {protocol.id}: "
                                        f"{event.reason}",
                                        exit_code=REJECT_EXIT.get(event.reason, 6))
            elif isinstance(event, Finished):
                signed = ", signed by a key A trusts" if trust is not None else ""
                show.line("B -> A", f"CONFIRM  (finished: transcripts match{signed})", size)
            elif isinstance(event, Established):
                timings["handshake"] = (time.perf_counter() - started) * 1000
                show.out(f"  handshake done: {event.protocol} in {event.encoding}, "
                         f"{timings['handshake']:.1f} ms")
                if not script:
                    show.out(f"  (no demo conversation for {event.protocol}: send its messages "
                             "with cbcl send)")
                    break
                await _send_next(connection, script, show, pace)
            elif isinstance(event, ProtocolMessage):
                message = event.message
                step = event.step
                where = f"  {step.before} -> {step.after}" if step else ""
                show.line("B -> A", f"{message.intent.value:8} {_body_text(message)}{where}",
                          size)
                if event.finished:
                    break
                if not script:
                    break
                await _send_next(connection, script, show, pace)
            elif isinstance(event, NotUnderstood):
                show.line("B -> A", f"NOT-UNDERSTOOD ({event.reason})", size)
                raise NegotiationFailed(f"the peer did not understand: {event.reason}",
                                        exit_code=not_understood_exit(event.reason))
            elif isinstance(event, ConnectionClosed):
                break
        timings["total"] = (time.perf_counter() - started) * 1000
        show.out(f"  session over: {connection.bytes_sent} bytes sent, "
                 f"{connection.bytes_received} received, {timings['total']:.1f} ms")
        return timings
    finally:
        await connection.close()


async def _send_next(connection: Connection, script: list[Message], show: Transcript,
                     pace: float) -> None:
    if pace:
        await asyncio.sleep(pace)
    message = script.pop(0)
    size = await connection.send(ProtocolMessage(message))
    tracker = connection.session.tracker
    thread = None if tracker is None or message.conversation_id is None \
        else tracker.get(message.conversation_id, message.receiver)
    where = f"  -> {thread.state}" if thread is not None else ""
    show.line("A -> B", f"{message.intent.value:8} {_body_text(message)}{where}", size)


def encodings_of(choice: str) -> tuple[str, ...]:
    return {"text": ("text",), "binary": ("binary",), "any": ("binary", "text")}[choice]


def _cmd_negotiate(args: argparse.Namespace, data: bytes) -> int:
    if args.demo:
        if args.connect or args.descriptor or args.key or args.trust:
            _usage(args, "--demo runs everything itself: no --connect, --descriptor, --key "
                         "or --trust")
        return run_demo(tamper=args.tamper, out=_say)
    if args.tamper:
        _usage(args, "--tamper goes with --demo")
    if not ((args.connect or args.nats) and args.descriptor and args.key):
        _usage(args, "give --connect HOST:PORT (or --nats URL), --descriptor SIGNED and --key "
                     "KEY (or --demo)")
    _one_edge(args, "--connect")
    if args.nats:
        servers = nats_servers(args)
        try:
            peer = str(URI(args.to or SERVER_NAME))
        except ValueError:
            _usage(args, f"--to: not an agent URI: {args.to!r}")
    else:
        if args.to is not None:
            _usage(args, "--to goes with --nats (over TCP the peer is --connect)")
        try:
            parse_address(args.connect)
        except ValueError as exc:
            _usage(args, str(exc))
    with open(args.descriptor, "rb") as handle:
        document = handle.read(DEFAULT_LIMITS.max_string_bytes + 1)
    key = signing_key(args.key, args.key_id)
    options: dict[str, Any] = {"encodings": encodings_of(args.encoding), "out": _say,
                               "pace": args.pace / 1000, "limits": connection_limits(args),
                               "trust": args.trust}
    if args.nats:
        _say(f"negotiate: {CLIENT_NAME} -> {peer} over NATS {servers}")
        asyncio.run(_negotiate_nats(servers, peer, document, key, options))
        return EXIT_OK
    _say(f"negotiate: {CLIENT_NAME} -> {args.connect}")
    asyncio.run(run_initiator(args.connect, document, key, **options))
    return EXIT_OK


async def _negotiate_nats(servers: str, peer: str, document: bytes,
                          key: tuple[str, Ed25519PrivateKey], options: dict[str, Any]) -> None:
    from ..net._nats import NatsBus

    agent = Agent(CLIENT_NAME, key=key, connection_limits=options["limits"])
    try:
        bus = await NatsBus.connect(agent, servers)
    except BaseException:
        await agent.close()
        raise

    async def opener(session: Session) -> Connection:
        return bus.open_connection(session, peer)

    try:
        await run_initiator("", document, key, peer=peer, opener=opener, **options)
    finally:
        await bus.close()
        await agent.close()


def _usage(args: argparse.Namespace, message: str) -> NoReturn:
    usage_error(args.command, message)


# --------------------------------------------------------------------------- the demo


class _ServerLog:
    """The serve process's stdout, line by line, for the transcript."""

    def __init__(self, stream: asyncio.StreamReader) -> None:
        self.stream = stream

    async def line(self, timeout: float = 10.0) -> str:
        raw = await asyncio.wait_for(self.stream.readline(), timeout)
        if not raw:
            raise ConnectionLost("the serve process ended")
        return raw.decode("utf-8", "replace").rstrip("\n")

    async def until(self, word: str, timeout: float = 5.0) -> list[str]:
        lines: list[str] = []
        with contextlib.suppress(TimeoutError, ConnectionLost):
            while True:
                text = await self.line(timeout)
                lines.append(text.split(": ", 1)[-1])
                if word in text:
                    break
        return lines


def _serve_command() -> list[str]:
    """The command that starts ``cbcl serve`` with this interpreter."""
    return [sys.executable, "-m", "cbcl", "serve"]


def _demo_keys(directory: Path) -> tuple[Ed25519PrivateKey, Path, Path, Path]:
    """Fresh keys for both agents: A's (``demo``), which B's trust store holds, and B's
    (``server``), which A's trust store holds. Returns A's key, B's trust directory, B's
    key file and A's trust directory."""


    (directory / "keys").mkdir(mode=0o700)
    keys = {}
    for name, trusted_by in (("demo", "trust"), ("server", "client-trust")):
        key = keys[name] = Ed25519PrivateKey.generate()
        (directory / trusted_by).mkdir(mode=0o700)
        handle = os.open(directory / "keys" / f"{name}.key",
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(handle, "wb") as file:
            file.write(private_key_pem(key))
        (directory / trusted_by / f"{name}.pub").write_bytes(public_key_pem(key.public_key()))
    return (keys["demo"], directory / "trust", directory / "keys" / "server.key",
            directory / "client-trust")


def tamper_signature(document: bytes) -> bytes:
    """``document`` with its first signature's first character changed to another valid
    one: well-formed, and wrong."""
    marker = b'(sig "demo" "'
    at = document.index(marker) + len(marker)
    flipped = b"B" if document[at:at + 1] == b"A" else b"A"
    return document[:at] + flipped + document[at + 1:]


def run_demo(*, tamper: bool, out: Callable[[str], None]) -> int:
    """``cbcl negotiate --demo``: a serve process, two sessions (text, cold; binary, warm),
    or with ``tamper`` one session whose offer is refused (exit 6)."""


    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="cbcl-demo-") as temp:
        root = Path(temp)
        key, trust, server_key, client_trust = _demo_keys(root)
        payload = resources.files("cbcl.grammars").joinpath("contract-net-v1.cbcl").read_bytes()
        document = sign_descriptor(payload, [("demo", key)])
        if tamper:
            document = tamper_signature(document)
        digest = "sha256:" + hashlib.sha256(payload).hexdigest()
        out("cbcl negotiate --demo: two agents in two processes; B does not know "
            "contract-net/v1 yet.")
        out(f"  A (this process) signs contract-net/v1 ({len(payload)} bytes, {digest[:19]}…) "
            "with a fresh demo key")
        out("  B (cbcl serve, a second process) trusts only that key; its grammar cache is "
            "empty")
        out("  A trusts only B's fresh key: B's transcript confirmation must be signed by it")
        if tamper:
            out("  --tamper: one character of A's signature is changed before the offer")
        env = dict(os.environ, XDG_CACHE_HOME=str(root / "cache"), PYTHONUNBUFFERED="1")
        command = [*_serve_command(), "--listen", "127.0.0.1:0", "--trust", str(trust),
                   "--state", str(root / "state"), "--key", str(server_key)]
        return asyncio.run(_demo(command, env, document, (("demo", key)), tamper, out,
                                 started, client_trust))


async def _demo(command: list[str], env: dict[str, str], document: bytes,
                key: tuple[str, Ed25519PrivateKey],
                tamper: bool, out: Callable[[str], None], started: float,
                trust: Path | None = None) -> int:
    process = await asyncio.create_subprocess_exec(
        *command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE)
    try:
        assert process.stdout is not None
        log = _ServerLog(process.stdout)
        try:
            first = await log.line(timeout=15.0)
        except (TimeoutError, ConnectionLost):
            error = b""
            if process.stderr is not None:
                with contextlib.suppress(TimeoutError):
                    error = await asyncio.wait_for(process.stderr.read(), 2.0)
            raise ConnectionLost("cbcl serve did not start: "
                                 + (error.decode(errors="replace").strip() or "no output")
                                 ) from None
        address = first.rsplit(" on ", 1)[-1].split(" as ")[0]
        out(f"  B: {first}  (pid {process.pid})")
        runs: list[tuple[str, tuple[str, ...], str]] = [
            ("text", ("text",), "cold: B compiles the grammar")]
        if not tamper:
            runs.append(("binary", ("binary", "text"),
                         "warm: a new session, the compiled grammar is cached"))
        timings = []
        for number, (name, encodings, note) in enumerate(runs, 1):
            out("")
            out(f"Session {number}: handshake, then contract-net/v1 in {name} ({note})")
            try:
                timings.append(await run_initiator(
                    address, document, key, encodings=encodings, out=out, tag=str(number),
                    server_log=log, trust=trust))
                await log.until("closed", timeout=2.0)  # B's log of the conversation
            except NegotiationFailed as exc:
                out("")
                out(f"A: the offer was refused ({exc.message.rsplit(': ', 1)[-1]}); nothing "
                    "was loaded, B's state is unchanged")
                out(f"demo total {_ms(time.perf_counter() - started)}; exit {exc.exit_code}")
                return exc.exit_code
        out("")
        out(f"handshake latency on loopback: cold {timings[0]['handshake']:.1f} ms "
            f"(verify + compile), warm {timings[1]['handshake']:.1f} ms (verify, cached "
            "grammar)")
        out(f"demo total {_ms(time.perf_counter() - started)} (including starting B); "
            "exit 0")
        return EXIT_OK
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 5.0)
            except TimeoutError:
                process.kill()
                await process.wait()
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(stream.read(), 1.0)


# --------------------------------------------------------------------------- registration


#: ``(option, low, high, help)`` of the options that set :class:`ConnectionLimits` (serve
#: and negotiate) and ``ServerLimits`` (serve); each option's dest is the field's name and
#: its default the field's default. An int range for counts, seconds for timeouts (a float
#: low). The ranges are those the dataclasses accept, except ``--max-frame-bytes``: at most
#: 16 MiB, since the frame limit is also the message limit (``Limits.max_message_bytes``).
CONNECTION_OPTIONS: tuple[tuple[str, float, float, str], ...] = (
    ("--max-frame-bytes", 1, 16 << 20, "largest frame (and message) accepted, in bytes"),
    ("--max-pending-frames", 1, 1 << 16, "complete frames buffered per connection"),
    ("--idle-timeout", 0.001, MAX_SECONDS, "seconds waiting for the next frame to start"),
    ("--frame-timeout", 0.001, MAX_SECONDS, "seconds from a frame's first byte to its last"),
    ("--handshake-timeout", 0.001, MAX_SECONDS,
     "seconds from connecting to the end of the handshake"),
)
SERVER_OPTIONS: tuple[tuple[str, float, float, str], ...] = (
    ("--max-connections", 1, 1 << 20, "open connections at once"),
    ("--max-connections-per-peer", 1, 1 << 20,
     "open connections from one peer address (IP; all unix-socket clients are one)"),
    ("--max-sessions", 1, 1 << 20,
     "sessions at work at once (a connection takes one at its first whole frame)"),
    ("--slot-timeout", 0.001, MAX_SECONDS, "seconds a connection waits for a session"),
    ("--max-conversations", 1, 1 << 20, "open conversations per session"),
    ("--max-learned-per-peer", 1, 1 << 20,
     "protocols one peer address may teach this server in its lifetime"),
    ("--compile-workers", 1, 256, "offers verified and compiled at once"),
    ("--compile-queue", 0, 1 << 16, "cold offers waiting for a compile worker"),
    ("--pre-handshake-timeout", 0.001, MAX_SECONDS,
     "seconds of its own time a connection has to finish its handshake"),
    ("--pre-handshake-share", 0.001, 1.0,
     "fraction of the connections, and of the sessions, one address may hold before "
     "their handshakes are done"),
    ("--max-refusals", 1, 1024,
     "frames of one address refused within --refusal-window; then its connections are "
     "turned away unread (limit) until the oldest refusal is a window old"),
    ("--refusal-window", 0.001, MAX_SECONDS, "seconds over which --max-refusals counts"),
)
#: The options that set :class:`HandlerLimits` (serve): how handlers run.
HANDLER_OPTIONS: tuple[tuple[str, float, float, str], ...] = (
    ("--handler-concurrency", 1, 1 << 16,
     "handlers running at once on one connection (different conversations; one "
     "conversation's messages are handled in order)"),
    ("--handler-backlog", 1, 1 << 16,
     "messages of one connection taken and not yet handled; at this many it reads no "
     "further until one is done"),
    ("--handler-threads", 1, 4096,
     "threads running plain (not async) handlers; one whose handler overran keeps its "
     "thread until the handler returns"),
    ("--shutdown-grace", 0.001, MAX_SECONDS,
     "seconds the handlers in flight have to finish when serve stops (the rest are "
     "answered shutdown)"),
)
#: The default of ``serve --handler-timeout`` (``Agent(handler_timeout=)``).
DEFAULT_HANDLER_TIMEOUT = 30.0
#: The options of :data:`SERVER_OPTIONS` that are fractions, not seconds.
FRACTION_OPTIONS = frozenset({"--pre-handshake-share"})
#: The largest ``negotiate --pace``: one minute.
MAX_PACE_MS = 60_000


def _dest(option: str) -> str:
    return option[2:].replace("-", "_")


def fraction(low: float, high: float) -> Callable[[str], float]:
    """argparse type: a finite number from ``low`` to ``high`` inclusive (``nan``, ``inf``
    and anything outside are usage errors)."""
    within = seconds(low, high)  # the same parse; only the message differs

    def parse(text: str) -> float:
        try:
            return within(text)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                f"expected a fraction from {low:g} to {high:g}, not "
                f'"{escape_invisible(text, quote=True, limit=40)}"') from None

    parse.__name__ = f"fraction({low:g}, {high:g})"
    return parse


def add_limit_options(parser: argparse.ArgumentParser,
                       options: tuple[tuple[str, float, float, str], ...],
                       defaults: Any) -> None:
    """Add ``options`` to ``parser``, each a checked type with its range and default."""
    for option, low, high, text in options:
        default = getattr(defaults, _dest(option))
        if option in FRACTION_OPTIONS:
            kind: Callable[[str], Any] = fraction(low, high)
            metavar, shown = "F", f"{low:g} to {high:g} (default {default:g})"
        elif isinstance(low, float):
            kind = seconds(low, high)
            metavar, shown = "S", f"{low:g} to {high:g} (default {default:g})"
        else:
            kind, metavar = int_in(int(low), int(high)), "N"
            shown = f"{low} to {int(high)} (default {default})"
        parser.add_argument(option, type=kind, default=default, metavar=metavar,
                            help=f"{text}: {shown}")


def connection_limits(args: argparse.Namespace) -> ConnectionLimits:
    """The :class:`ConnectionLimits` that ``serve``'s or ``negotiate``'s options set."""
    return ConnectionLimits(**{_dest(o[0]): getattr(args, _dest(o[0]))
                               for o in CONNECTION_OPTIONS})


def server_limits(args: argparse.Namespace) -> ServerLimits:
    """The :class:`ServerLimits` that ``serve``'s options set."""
    return ServerLimits(**{_dest(o[0]): getattr(args, _dest(o[0])) for o in SERVER_OPTIONS})


def handler_limits(args: argparse.Namespace) -> HandlerLimits:
    """The :class:`HandlerLimits` that ``serve``'s options set."""
    return HandlerLimits(**{_dest(o[0]): getattr(args, _dest(o[0])) for o in HANDLER_OPTIONS})


def register(commands: Commands) -> None:
    """Add ``serve`` and ``negotiate`` to ``cbcl``'s sub-command action."""
    s = commands.add_parser(
        "serve", help="answer negotiations and run the shipped conversations as responder")
    s.add_argument("--listen", metavar="HOST:PORT",
                   help="address to listen on: HOST:PORT (port 0: any free port) or "
                        "unix:PATH (or --nats)")
    s.add_argument("--nats", metavar="URL",
                   help="serve on a NATS server or cluster instead: nats://HOST:PORT, "
                        "several comma-separated (spec/nats.md); the agent's subject is "
                        "made from --name")
    s.add_argument("--durable", action="store_true",
                   help="with --nats: also take durable messages from this agent's "
                        "JetStream stream (made if missing; setting it up is retried for "
                        "60 s)")
    s.add_argument("--replicas", type=int_in(1, 5), metavar="N",
                   help="with --durable: copies of the stream in a cluster, 1 to 5 "
                        "(default: 1 for a new stream, an existing one keeps its own; 3 "
                        "survive the death of the stream's leader)")
    s.add_argument("--trust", required=True, metavar="DIR",
                   help="trust store that decides which offered descriptors load")
    s.add_argument("--descriptors", metavar="DIR",
                   help="signed descriptors (*.cbcl) every session supports from the start")
    s.add_argument("--state", metavar="DIR",
                   help="rollback state directory (default: a private one for this run)")
    s.add_argument("--name", default=SERVER_NAME, metavar="URI",
                   help=f"this agent's URI (default {SERVER_NAME})")
    s.add_argument("--key", metavar="KEY", help="sign this side's transcript confirmation")
    s.add_argument("--handler", dest="message_handler", metavar="MODULE:CALLABLE",
                   help="answer protocol messages with handler(message, context) -> Message "
                        "or None, imported from MODULE (the current directory is on the "
                        "path); default cbcl.demo:respond, the shipped conversations")
    s.add_argument("--handler-timeout", type=seconds(0.001, MAX_SECONDS),
                   default=DEFAULT_HANDLER_TIMEOUT, metavar="S",
                   help="seconds a handler has to answer; then the peer is answered "
                        f"handler-timeout: 0.001 to {MAX_SECONDS:g} (default "
                        f"{DEFAULT_HANDLER_TIMEOUT:g})")
    s.add_argument("--expose-errors", action="store_true",
                   help="tell the peer the text of a handler's exception in the failure "
                        "answer (default: only the reason code)")
    s.add_argument("--log-format", choices=LOG_FORMATS, default="text",
                   help="one escaped line per event (text, the default), or one JSON "
                        "object per line (json)")
    s.add_argument("--log-level", choices=tuple(LOG_LEVELS), default="info",
                   help="the least severe events logged (default info: one line per "
                        "message handled; debug adds one per message received)")
    add_limit_options(s, HANDLER_OPTIONS, HandlerLimits())
    add_limit_options(s, SERVER_OPTIONS, ServerLimits())
    s.set_defaults(handler=_cmd_serve, file=None)

    n = commands.add_parser(
        "negotiate", help="teach a peer a protocol and talk in it (--demo: see it happen)")
    n.add_argument("--demo", action="store_true",
                   help="start a cbcl serve process and run the whole negotiation against it")
    n.add_argument("--tamper", action="store_true",
                   help="with --demo: break the offer's signature (the peer rejects; exit 6)")
    n.add_argument("--connect", metavar="HOST:PORT", help="the peer: HOST:PORT or unix:PATH")
    n.add_argument("--nats", metavar="URL",
                   help="reach the peer over NATS instead: nats://HOST:PORT[,…]")
    n.add_argument("--to", metavar="URI",
                   help=f"with --nats: the peer agent's name (default {SERVER_NAME})")
    n.add_argument("--descriptor", metavar="SIGNED", help="the signed descriptor to offer")
    n.add_argument("--trust", metavar="DIR",
                   help="trust store for the peer: its transcript confirmation must be signed "
                        "by a key here (serve --key); without it the peer is not authenticated")
    n.add_argument("--key", metavar="KEY",
                   help="Ed25519 private key that signs the transcript confirmation")
    n.add_argument("--encoding", choices=("any", "text", "binary"), default="any",
                   help="encodings to offer (default any: binary, then text)")
    n.add_argument("--pace", type=int_in(0, MAX_PACE_MS), default=0, metavar="MS",
                   help=f"wait MS before each conversation message (to watch it): 0 to "
                        f"{MAX_PACE_MS} (default 0)")
    n.set_defaults(handler=_cmd_negotiate, file=None)

    for sub in (s, n):
        sub.add_argument("--key-id", metavar="ID", help="key id of --key (default: file stem)")
        add_limit_options(sub, CONNECTION_OPTIONS, ConnectionLimits())

