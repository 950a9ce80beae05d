"""The ``cbcl serve`` and ``cbcl negotiate`` commands (spec/negotiation.md §7).

``register(commands)`` adds both to the ``cbcl`` parser; handlers follow ``cbcl._cli``'s
convention ``handler(args, data) -> exit code`` and let errors reach ``main()``, which
prints one line and exits with the error's code. ``python -m cbcl._cli_negotiate`` runs the
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._canonical import canonical_value
from ._errors import CBCLError, TrustError
from ._limits import DEFAULT_LIMITS, Limits
from ._message import Intent, Message
from ._protocol import Protocol, Registry
from ._reader import read
from ._session import (
    Accepted,
    ConnectionClosed,
    Established,
    Finished,
    NotUnderstood,
    Offer,
    ProtocolMessage,
    Query,
    Rejected,
    RemoteProtocolError,
    Session,
    Supported,
    Unsupported,
)
from ._transport import Connection, ConnectionLimits, ConnectionLost, connect, parse_address, serve
from ._trust import TrustStore, load_private_key, read_signed_descriptor_unverified

EXIT_OK = 0
#: Exit code for each reject reason (draft §6: 4 limit, 5 protocol, 6 trust).
REJECT_EXIT = {"limit": 4, "grammar-refused": 5, "malformed": 5, "no-common-encoding": 5}
SERVER_NAME = "agent://cbcl/serve"
CLIENT_NAME = "agent://cbcl/negotiate"


class NegotiationFailed(CBCLError):
    """The peer refused the offer or did not understand us; ``exit_code`` follows the
    reason."""

    kind = "negotiation"

    def __init__(self, message: str, *, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code  # type: ignore[misc]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _short(text: str, width: int = 76) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _body_text(message: Message) -> str:
    return "" if message.body is None else _short(canonical_value(message.body))


# --------------------------------------------------------------------------- agents


def _reply(message: Message, intent: Intent, body: Any, number: int) -> Message:
    return Message(message_id=f"{message.receiver.rsplit('/', 1)[-1]}-{number}",
                   sender=message.receiver, receiver=message.sender, intent=intent,
                   protocol=message.protocol, conversation_id=message.conversation_id,
                   in_reply_to=message.message_id, body=body)


def respond(message: Message, number: int) -> Message | None:
    """The responder's side of the shipped conversations: a contract-net contractor that
    bids on every call and reports the work done when awarded, a request/v1 participant
    that does what it is asked. ``None``: nothing to say."""
    body = message.body
    if str(message.protocol) == "contract-net/v1" and type(body) is tuple:
        fields = {str(k): v for k, v in zip(body[1::2], body[2::2], strict=False)}
        if message.intent is Intent.CFP:
            task = fields.get("task")
            task_id = task[2] if type(task) is tuple and len(task) > 2 else "?"
            return _reply(message, Intent.PROPOSE, read(
                f'(proposal :task-id "{task_id}" :bid (bid :price 12.50 :currency EUR '
                ':eta 60000))'.encode()), number)
        if message.intent is Intent.ACCEPT:
            return _reply(message, Intent.INFORM, read(
                f'(inform-done :task-id "{fields.get("task-id", "?")}" '
                ':result (artifact :frames 2400 :bytes 734003200))'.encode()), number)
    if str(message.protocol) == "request/v1" and message.intent is Intent.REQUEST:
        return _reply(message, Intent.INFORM, read(
            f'(inform-done :action-id "{message.message_id}")'.encode()), number)
    return None


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


def _limits(args: argparse.Namespace) -> ConnectionLimits:
    return ConnectionLimits(max_frame_bytes=args.max_frame_bytes,
                            max_pending_frames=args.max_pending_frames,
                            idle_timeout=args.idle_timeout)


def _say(line: str) -> None:
    print(line, flush=True)


async def _serve_connection(connection: Connection, number: int,
                            say: Callable[[str], None]) -> None:
    session = connection.session
    tag = f"serve[{number}]"
    replies = 0
    try:
        while True:
            event = await connection.next_event()
            if isinstance(event, Query):
                answer = "supported" if session.protocol is not None else "unsupported"
                say(f"{tag}: asked for {event.protocol} {event.digest[:19]}… versions "
                    f"{list(event.versions)}, encodings {' '.join(event.encodings)} -> "
                    f"{answer}")
            elif isinstance(event, Offer):
                say(f"{tag}: offer received ({len(event.document)} bytes of signed "
                    f"descriptor); verifying and compiling took {connection.last_work_ms:.1f} "
                    "ms")
            elif isinstance(event, Accepted):
                say(f"{tag}: verified (signed by {', '.join(event.signers)}), grammar "
                    f"compiled, {event.protocol} version {event.version} loaded -> accepted "
                    f"({event.encoding})")
            elif isinstance(event, Rejected):
                say(f"{tag}: rejected: {event.reason} [{event.detail}]")
            elif isinstance(event, Established):
                say(f"{tag}: established {event.protocol} in {event.encoding}")
            elif isinstance(event, ProtocolMessage):
                step = event.step
                where = f" ({step.before} -> {step.after})" if step else ""
                say(f'{tag}: received "{event.message.message_id}" '
                    f"{event.message.intent.value}{where}")
                replies += 1
                answer_message = respond(event.message, replies)
                if answer_message is not None:
                    await connection.send(ProtocolMessage(answer_message))
                    say(f'{tag}: sent "{answer_message.message_id}" '
                        f"{answer_message.intent.value}")
            elif isinstance(event, NotUnderstood):
                say(f"{tag}: the peer did not understand: {event.reason}")
                return
            elif isinstance(event, ConnectionClosed):
                say(f"{tag}: closed")
                return
    except (RemoteProtocolError, ConnectionLost) as exc:
        say(f"{tag}: {exc.one_line()}")


def _load_dir(registry: Registry, directory: str | None, limits: Limits) -> list[bytes]:
    """Load every ``*.cbcl`` of ``directory`` (signed descriptors) into ``registry``;
    returns their bytes (to preload each session's registry)."""
    documents = []
    if directory:
        for path in sorted(Path(directory).glob("*.cbcl")):
            data = path.read_bytes()
            registry.load(data)
            documents.append(data)
    return documents


def _cmd_serve(args: argparse.Namespace, data: bytes) -> int:
    try:
        parse_address(args.listen)
    except ValueError as exc:
        _usage(args, str(exc))
    limits = Limits(max_message_bytes=args.max_frame_bytes)
    store = TrustStore.from_directory(args.trust, limits=limits)
    warm_up()
    signing = _signing_key(args.key, args.key_id) if args.key else None
    with contextlib.ExitStack() as stack:
        state = args.state or stack.enter_context(tempfile.TemporaryDirectory(
            prefix="cbcl-serve-state-"))
        base = Registry(trust=store, state_dir=state, limits=limits)
        preload = _load_dir(base, args.descriptors, limits)

        def make_session() -> Session:
            # One registry per session: what one peer teaches, only that session speaks.
            # Rollback state is shared through the state directory.
            registry = Registry(trust=store, state_dir=state, limits=limits)
            for document in preload:
                registry.load(document)
            return Session("responder", registry=registry, me=args.name, signing_key=signing,
                           require_signed_finished=True, limits=limits,
                           max_frame_bytes=args.max_frame_bytes,
                           max_pending_frames=args.max_pending_frames)

        return asyncio.run(_serve_main(args, make_session))


async def _serve_main(args: argparse.Namespace, make_session: Callable[[], Session]) -> int:
    counter = 0

    async def handle(connection: Connection) -> None:
        nonlocal counter
        counter += 1
        await _serve_connection(connection, counter, _say)

    server = await serve(args.listen, make_session, handle, limits=_limits(args),
                         max_connections=args.max_sessions)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    sockets = server.sockets or []
    where = args.listen
    if sockets and not args.listen.startswith("unix:"):
        host, port = sockets[0].getsockname()[:2]
        where = f"{host}:{port}"
    _say(f"serve: listening on {where} as {args.name}")
    try:
        await stop.wait()
    finally:
        server.close()
        await server.wait_closed()
        if args.listen.startswith("unix:"):
            with contextlib.suppress(OSError):
                os.unlink(args.listen[5:])
    _say("serve: stopped")
    return EXIT_OK


# --------------------------------------------------------------------------- negotiate


def warm_up() -> None:
    """Compile the envelope and cbcl-negotiation/v1 grammars now, not in the first session
    (so handshake timings measure the handshake)."""
    from ._api import parse
    from ._session import negotiation_registry

    parse(b'(CBCL/1.0 (message-id "warm-up") (sender agent://a) (receiver agent://b) '
          b"(intent NOT-UNDERSTOOD) (protocol cbcl-negotiation/v1))",
          registry=negotiation_registry())


def _signing_key(path: str, key_id: str | None) -> tuple[str, Any]:
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


async def run_initiator(address: str, document: bytes, key: tuple[str, Any], *,
                        encodings: tuple[str, ...], out: Callable[[str], None],
                        limits: ConnectionLimits | None = None, pace: float = 0.0,
                        peer: str = SERVER_NAME, me: str = CLIENT_NAME, tag: str = "1",
                        server_log: Any = None, trust: str | Path | None = None,
                        ) -> dict[str, float]:
    """Connect, negotiate the protocol of the signed ``document``, run its demo
    conversation, close. With ``trust`` (a trust directory), the peer's transcript
    confirmation must be signed by a key in it. Returns timings (ms). Raises
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
    connection = await connect(address, session, limits=limits)
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
                    show.out(f"  (no demo conversation for {event.protocol})")
                    break
                await _send_next(connection, script, show, pace)
            elif isinstance(event, ProtocolMessage):
                message = event.message
                step = event.step
                where = f"  {step.before} -> {step.after}" if step else ""
                show.line("B -> A", f"{message.intent.value:8} {_body_text(message)}{where}",
                          size)
                if step is not None and session.tracker is not None and \
                        session.tracker.conversations()[-1].finished:
                    break
                if not script:
                    break
                await _send_next(connection, script, show, pace)
            elif isinstance(event, NotUnderstood):
                show.line("B -> A", f"NOT-UNDERSTOOD ({event.reason})", size)
                raise NegotiationFailed(f"the peer did not understand: {event.reason}",
                                        exit_code=REJECT_EXIT.get(event.reason, 6
                                        if event.reason in ("transcript-mismatch",
                                                            "bad-signature",
                                                            "untrusted-signer") else 5))
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
    thread = connection.session.tracker.conversations()[-1] \
        if connection.session.tracker is not None else None
    where = f"  -> {thread.state}" if thread is not None else ""
    show.line("A -> B", f"{message.intent.value:8} {_body_text(message)}{where}", size)


def _encodings(choice: str) -> tuple[str, ...]:
    return {"text": ("text",), "binary": ("binary",), "any": ("binary", "text")}[choice]


def _cmd_negotiate(args: argparse.Namespace, data: bytes) -> int:
    if args.demo:
        if args.connect or args.descriptor or args.key or args.trust:
            _usage(args, "--demo runs everything itself: no --connect, --descriptor, --key "
                         "or --trust")
        return run_demo(tamper=args.tamper, out=_say)
    if args.tamper:
        _usage(args, "--tamper goes with --demo")
    if not (args.connect and args.descriptor and args.key):
        _usage(args, "give --connect HOST:PORT, --descriptor SIGNED and --key KEY (or --demo)")
    try:
        parse_address(args.connect)
    except ValueError as exc:
        _usage(args, str(exc))
    with open(args.descriptor, "rb") as handle:
        document = handle.read(DEFAULT_LIMITS.max_string_bytes + 1)
    key = _signing_key(args.key, args.key_id)
    _say(f"negotiate: {CLIENT_NAME} -> {args.connect}")
    asyncio.run(run_initiator(args.connect, document, key, encodings=_encodings(args.encoding),
                              out=_say, pace=args.pace / 1000, limits=_limits(args),
                              trust=args.trust))
    return EXIT_OK


def _usage(args: argparse.Namespace, message: str) -> Any:
    print(f"usage: cbcl {args.command}: {message}", file=sys.stderr)
    raise SystemExit(2)


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
    """``python -m cbcl`` once ``serve`` is wired into it, else this module's entry."""
    from . import _cli

    module = "cbcl" if hasattr(_cli, "register_negotiate") else "cbcl._cli_negotiate"
    return [sys.executable, "-m", module, "serve"]


def _demo_keys(directory: Path) -> tuple[Any, Path, Path, Path]:
    """Fresh keys for both agents: A's (``demo``), which B's trust store holds, and B's
    (``server``), which A's trust store holds. Returns A's key, B's trust directory, B's
    key file and A's trust directory."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from ._trust import private_key_pem, public_key_pem

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
    from importlib import resources

    from ._trust import sign_descriptor

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


async def _demo(command: list[str], env: dict[str, str], document: bytes, key: Any,
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
        runs = [("text", ("text",), "cold: B compiles the grammar")]
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


def register(commands: Any) -> None:
    """Add ``serve`` and ``negotiate`` to ``cbcl``'s sub-command action."""
    from ._cli import _positive

    s = commands.add_parser(
        "serve", help="answer negotiations and run the shipped conversations as responder")
    s.add_argument("--listen", required=True, metavar="HOST:PORT",
                   help="address to listen on: HOST:PORT (port 0: any free port) or "
                        "unix:PATH")
    s.add_argument("--trust", required=True, metavar="DIR",
                   help="trust store that decides which offered descriptors load")
    s.add_argument("--descriptors", metavar="DIR",
                   help="signed descriptors (*.cbcl) every session supports from the start")
    s.add_argument("--state", metavar="DIR",
                   help="rollback state directory (default: a private one for this run)")
    s.add_argument("--name", default=SERVER_NAME, metavar="URI",
                   help=f"this agent's URI (default {SERVER_NAME})")
    s.add_argument("--key", metavar="KEY", help="sign this side's transcript confirmation")
    s.add_argument("--max-sessions", type=_positive, default=64, metavar="N",
                   help="sessions handled at once (default 64)")
    s.set_defaults(handler=_cmd_serve, file=None)

    n = commands.add_parser(
        "negotiate", help="teach a peer a protocol and talk in it (--demo: see it happen)")
    n.add_argument("--demo", action="store_true",
                   help="start a cbcl serve process and run the whole negotiation against it")
    n.add_argument("--tamper", action="store_true",
                   help="with --demo: break the offer's signature (the peer rejects; exit 6)")
    n.add_argument("--connect", metavar="HOST:PORT", help="the peer: HOST:PORT or unix:PATH")
    n.add_argument("--descriptor", metavar="SIGNED", help="the signed descriptor to offer")
    n.add_argument("--trust", metavar="DIR",
                   help="trust store for the peer: its transcript confirmation must be signed "
                        "by a key here (serve --key); without it the peer is not authenticated")
    n.add_argument("--key", metavar="KEY",
                   help="Ed25519 private key that signs the transcript confirmation")
    n.add_argument("--encoding", choices=("any", "text", "binary"), default="any",
                   help="encodings to offer (default any: binary, then text)")
    n.add_argument("--pace", type=int, default=0, metavar="MS",
                   help="wait MS before each conversation message (to watch it)")
    n.set_defaults(handler=_cmd_negotiate, file=None)

    for sub in (s, n):
        sub.add_argument("--key-id", metavar="ID", help="key id of --key (default: file stem)")
        sub.add_argument("--max-frame-bytes", type=_positive, default=1 << 20, metavar="N",
                         help="largest frame accepted (default 1048576)")
        sub.add_argument("--max-pending-frames", type=_positive, default=16, metavar="N",
                         help="frames buffered per connection (default 16)")
        sub.add_argument("--idle-timeout", type=float, default=30.0, metavar="S",
                         help="seconds of silence before a connection is dropped (default 30)")


def build_parser() -> argparse.ArgumentParser:
    """``cbcl``'s parser with ``serve`` and ``negotiate`` (added if not wired in yet)."""
    from . import _cli

    parser = _cli.build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if "negotiate" not in action.choices:
        register(action)
    return parser


def main(argv: list[str] | None = None) -> int:
    """``cbcl``'s ``main`` with these commands present."""
    from . import _cli

    original = _cli.build_parser
    _cli.build_parser = lambda: _with(original)  # type: ignore[assignment]
    try:
        return _cli.main(argv)
    finally:
        _cli.build_parser = original  # type: ignore[assignment]


def _with(original: Callable[[], argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser = original()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if "negotiate" not in action.choices:
        register(action)
    return parser


if __name__ == "__main__":
    sys.exit(main())
