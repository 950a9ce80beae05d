"""``cbcl serve`` under attack, in one process on loopback (spec/negotiation.md §6.1).

One test per attack: each asserts the refusal, that a well-behaved peer is served
afterwards (or meanwhile), and that the state directory is unchanged where the attack was
refused (python-tuf's discipline). The server is the real one (`start_serving`, as
``cbcl serve`` runs it); attackers are raw sockets, bound to their own loopback addresses
(all of 127/8 reaches lo on Linux) so per-address caps tell them from good peers.

Tests internals: the server of ``cbcl serve`` (``cbcl.cli._negotiate``) is private."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from key_files import public_key_pem

import cbcl
from cbcl import ConnectionLost, NegotiationFailed, Session, TrustStore, sign_descriptor
from cbcl.binary import frame
from cbcl.cli._negotiate import ServeConfig, listening_address, run_initiator, start_serving
from cbcl.net import ConnectionLimits, ServerLimits, connect, serve
from cbcl.session import Established, Query, Unsupported

ROOT = Path(__file__).parent.parent
KEY = Ed25519PrivateKey.generate()
PAYLOAD = (ROOT / "descriptors" / "contract-net-v1.cbcl").read_bytes()
#: The shipped contract-net/v1's version (2: built from its declaration).
SHIPPED_VERSION = cbcl.descriptor.read_descriptor(PAYLOAD).version
SIGNED = sign_descriptor(PAYLOAD, [("demo", KEY)])
NOT_UNDERSTOOD = b"(intent NOT-UNDERSTOOD)"
WAIT = 10.0  # a bound on how long anything here may take, never a measurement


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@dataclass
class Running:
    address: str
    state: Path
    log: list[str] = field(default_factory=list)

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def state_files(self) -> dict[str, bytes]:
        if not self.state.exists():
            return {}
        # Rollback records, key bindings and the learned descriptors (learned/).
        return {str(p.relative_to(self.state)): p.read_bytes()
                for p in sorted(self.state.rglob("*")) if p.is_file() and p.name != ".lock"}

    writers: list[asyncio.StreamWriter] = field(default_factory=list)
    server: Any = None

    def lines(self, text: str) -> list[str]:
        return [line for line in self.log if text in line]

    async def raw(self, ip: str = "127.0.0.2") -> tuple[asyncio.StreamReader,
                                                       asyncio.StreamWriter]:
        """A raw connection from ``ip``, closed when the server stops."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port,
                                                       local_addr=(ip, 0))
        self.writers.append(writer)
        return reader, writer


@contextlib.asynccontextmanager
async def running(tmp_path: Path, *, connection: ConnectionLimits | None = None,
                  server: ServerLimits | None = None) -> AsyncIterator[Running]:
    trust = tmp_path / "trust"
    trust.mkdir(exist_ok=True)
    (trust / "demo.pub").write_bytes(public_key_pem(KEY.public_key()))
    state = tmp_path / "state"
    config = ServeConfig(listen="127.0.0.1:0", trust=TrustStore.from_directory(trust),
                         state=state, connection=connection or ConnectionLimits(),
                         server=server or ServerLimits())
    info = Running("", state)
    started = await start_serving(config, info.log.append)
    info.address = listening_address(started, config.listen)
    info.server = started
    try:
        yield info
    finally:
        for writer in info.writers:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()
        started.close()
        await started.wait_closed()


async def good_peer(address: str, document: bytes = SIGNED, tag: str = "1",
                    wait: float = WAIT) -> dict[str, float]:
    """A whole negotiation and the contract-net conversation; raises if anything fails."""
    out: list[str] = []
    return await asyncio.wait_for(run_initiator(
        address, document, ("demo", KEY), encodings=("binary", "text"), out=out.append,
        tag=tag), wait)


async def until_closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the server writes before it closes the connection."""
    return await asyncio.wait_for(reader.read(), WAIT)


async def still_open(reader: asyncio.StreamReader, seconds: float = 0.2) -> bool:
    try:
        data = await asyncio.wait_for(reader.read(1), seconds)
    except TimeoutError:
        return True
    return bool(data)


def initiator(tag: str = "x") -> Session:
    registry = cbcl.Registry(disk_cache=False, isolate=False)
    registry.load(PAYLOAD, allow_unsigned=True)
    return Session("initiator", registry=registry, me=f"agent://attacker/{tag}",
                   peer="agent://cbcl/serve", signing_key=("demo", KEY))


def query_frame(session: Session) -> bytes:
    protocol = session.registry.get("contract-net/v1")
    assert protocol is not None
    return session.send(Query("contract-net/v1", protocol.digest, (protocol.descriptor.version,)),
                        now=cbcl.net._transport.clock_ms())


def slow_grammar(rules: int, salt: str) -> str:
    """An LALR(1) grammar within the limits whose analysis takes seconds: every item can
    nest in and follow every other, so the automaton has many states of many entries."""
    lines = ["body: item*", "item: " + " | ".join(f"r{i}" for i in range(rules))]
    lines += [f'r{i}: "(" "{salt}{i}" (STRING | INTEGER | item)* ")"' for i in range(rules)]
    return "\n".join(lines) + "\n"


def slow_descriptor(salt: str, rules: int = 80) -> bytes:
    from cbcl.core._canonical import quote

    payload = (f"(protocol-descriptor (id slow-{salt}/v1) (version 1) (intents REQUEST) "
               f"(grammar {quote(slow_grammar(rules, salt))}))").encode()
    return sign_descriptor(payload, [("demo", KEY)])


def initiator_registry(document: bytes) -> cbcl.Registry:
    """A registry holding our own descriptor (compiled here, in this process)."""
    payload = cbcl.protocol._trust.read_signed_descriptor_unverified(document).payload
    registry = cbcl.Registry(disk_cache=False, isolate=False)
    registry.load(payload, allow_unsigned=True)
    return registry


async def offer_only(address: str, document: bytes, tag: str,
                     registry: cbcl.Registry | None = None) -> str:
    """Ask, offer ``document``, and return ``"accepted"`` once the handshake is established
    (the offer recorded), or ``"rejected REASON"``."""
    from cbcl.session import Offer, Rejected

    registry = registry or initiator_registry(document)
    (protocol,) = registry.protocols()
    session = Session("initiator", registry=registry, me=f"agent://slow/{tag}",
                      peer="agent://cbcl/serve", signing_key=("demo", KEY))
    connection = await connect(address, session)
    try:
        await connection.send(Query(str(protocol.id), protocol.digest,
                                    (protocol.descriptor.version,)))
        while True:
            event = await asyncio.wait_for(connection.next_event(), 60)
            if isinstance(event, Unsupported):
                await connection.send(Offer(document))
            elif isinstance(event, Established):
                return "accepted"
            elif isinstance(event, Rejected):
                return f"rejected {event.reason}"
    finally:
        await connection.close()


def run(scenario: Callable[[], Any]) -> Any:
    return asyncio.run(scenario())


# --------------------------------------------------------------------------- deadlines


def test_slow_loris_is_dropped_at_the_frame_deadline_while_others_are_served(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(tmp_path, connection=ConnectionLimits(frame_timeout=0.5)) as srv:
            attackers = [await srv.raw(f"127.0.0.{2 + i}") for i in range(8)]

            async def trickle(reader: asyncio.StreamReader,
                              writer: asyncio.StreamWriter) -> bytes:
                """A byte every 50 ms into a frame of 1,000, for up to 3 s, reading as it
                goes; stops writing once the server answers (writing to a socket the server
                closed would reset it and lose the answer)."""
                writer.write((1000).to_bytes(4, "big"))
                received = b""
                for _ in range(60):
                    try:
                        chunk = await asyncio.wait_for(reader.read(4096), 0.05)
                    except TimeoutError:
                        writer.write(b"(")
                        continue
                    received += chunk
                    if not chunk:
                        break
                return received

            trickles = [asyncio.create_task(trickle(r, w)) for r, w in attackers]
            await good_peer(srv.address)  # served while all eight trickle
            for task in trickles:
                assert NOT_UNDERSTOOD in await asyncio.wait_for(task, WAIT)
            assert len(srv.lines("a frame did not arrive whole within 0.5 s")) == 8
            await good_peer(srv.address, tag="2")  # and afterwards
    run(scenario)


def test_the_handshake_deadline_is_not_reset_by_arriving_data(tmp_path: Path) -> None:
    async def scenario() -> None:
        limits = ConnectionLimits(handshake_timeout=0.6, frame_timeout=30, idle_timeout=30)
        async with running(tmp_path, connection=limits) as srv:
            reader, writer = await srv.raw()
            writer.write(query_frame(initiator()))  # a valid question, then a trickle
            writer.write((1000).to_bytes(4, "big"))
            for _ in range(4):
                await asyncio.sleep(0.1)
                writer.write(b"(")
            data = await until_closed(reader)
            assert b'"timeout"' in data and b"(unsupported" in data
            assert srv.lines("the handshake did not finish within 0.6 s")
            assert srv.state_files() == {}
            await good_peer(srv.address)
    run(scenario)


def test_an_idle_connection_is_dropped_and_idle_ones_hold_no_session_slot(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(tmp_path, connection=ConnectionLimits(idle_timeout=0.5),
                           server=ServerLimits(max_sessions=1)) as srv:
            idle = [await srv.raw(f"127.0.0.{2 + i}") for i in range(5)]
            await good_peer(srv.address)  # one slot, five idle sockets: still served
            for reader, _ in idle:
                assert b'"timeout"' in await until_closed(reader)
            assert len(srv.lines("no data for 0.5 s")) == 5
    run(scenario)


# --------------------------------------------------------------------------- caps


def test_max_connections_accepts_n_and_refuses_the_next(tmp_path: Path) -> None:
    """N authenticated connections are served and the next one is refused ``busy``: none of
    them can be evicted (pending ones can: tests/test_eviction.py)."""
    async def scenario() -> None:
        async with running(tmp_path, server=ServerLimits(max_connections=3)) as srv:
            held = [await establish(srv.address, f"held-{i}") for i in range(3)]
            reader, _ = await srv.raw("127.0.0.9")
            assert b'"busy"' in await until_closed(reader)
            assert all([await still_open(c.reader) for c in held])
            assert len(srv.lines("(max_connections)")) == 1
            assert not srv.lines("evicted")
            await held[0].close()
            await asyncio.sleep(0.05)
            await good_peer(srv.address)
            for connection in held[1:]:
                await connection.close()
    run(scenario)


def test_max_connections_per_peer_refuses_that_peer_only(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(tmp_path, server=ServerLimits(max_connections_per_peer=2)) as srv:
            held = [await srv.raw("127.0.0.2") for _ in range(2)]
            await asyncio.sleep(0.05)
            reader, _ = await srv.raw("127.0.0.2")
            assert b'"busy"' in await until_closed(reader)
            assert all([await still_open(r) for r, _ in held])
            assert srv.lines("from 127.0.0.2: 2 connections are open from this peer")
            await good_peer(srv.address)  # from 127.0.0.1
    run(scenario)


async def establish(address: str, tag: str) -> Any:
    session = initiator(tag)
    protocol = session.registry.get("contract-net/v1")
    assert protocol is not None
    connection = await connect(address, session)
    await connection.send(Query("contract-net/v1", protocol.digest, (protocol.descriptor.version,)))
    from cbcl.session import Offer

    while True:
        event = await asyncio.wait_for(connection.next_event(), WAIT)
        if isinstance(event, Unsupported):
            await connection.send(Offer(SIGNED))
        if isinstance(event, Established):
            return connection


def test_a_connection_waits_for_a_session_slot_at_most_slot_timeout(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(tmp_path, server=ServerLimits(max_sessions=1,
                                                         slot_timeout=0.3)) as srv:
            holder = await establish(srv.address, "holder")  # takes the only slot
            with pytest.raises(NegotiationFailed) as caught:
                await good_peer(srv.address)
            assert caught.value.exit_code == 1 and "busy" in caught.value.message
            assert srv.lines("no session slot within 0.3 s")
            await holder.close()
            await asyncio.sleep(0.05)
            await good_peer(srv.address, tag="2")
    run(scenario)


def descriptor_of(ident: str, version: int = 1) -> bytes:
    """contract-net/v1's descriptor under another protocol id and version, signed (the
    shipped bytes for contract-net/v1 at SHIPPED_VERSION)."""
    payload = PAYLOAD.replace(b"(id contract-net/v1)\n  (version 2)",
                              f"(id {ident})\n  (version {version})".encode())
    return sign_descriptor(payload, [("demo", KEY)])


def test_protocols_learned_per_peer_accepts_n_and_rejects_the_next(tmp_path: Path) -> None:
    """The cap counts protocol ids: N ids are learned, one more is rejected ``limit``; a
    newer version of an id the peer taught, or a descriptor the server holds, counts no
    more."""
    taught = [descriptor_of(f"taught-{name}/v1") for name in "ab"]

    async def scenario() -> None:
        async with running(tmp_path, server=ServerLimits(max_learned_per_peer=2)) as srv:
            for name, document in zip("ab", taught, strict=True):
                assert await offer_only(srv.address, document, name) == "accepted"
            recorded = srv.state_files()
            assert await offer_only(srv.address, descriptor_of("taught-c/v1"), "c") == \
                "rejected limit"
            assert srv.state_files() == recorded  # taught-c was not recorded
            assert srv.lines("(max_learned_per_peer)")
            await offer_only(srv.address, taught[1], "again")  # a known digest: still fine
            newer = descriptor_of("taught-a/v1", version=2)
            assert await offer_only(srv.address, newer, "a2") == "accepted"
            assert '"version": 2' in srv.state_files()["taught-a%2Fv1.json"].decode()
    run(scenario)


# --------------------------------------------------------------------------- the pool


def test_a_slow_compile_delays_no_one_and_the_queue_is_bounded(tmp_path: Path) -> None:
    """One compile worker and no queue: a slow offer holds the worker; a second cold offer
    is refused at once (``limit``); a peer whose grammar is cached negotiates and runs its
    conversation before the slow compile ends.

    Counted, not timed: the slow compile is held inside its compile slot until the test
    releases it (a load that delayed the other peers could otherwise let it finish first,
    and the second offer would then be admitted)."""
    # (the compile is made slow by holding it, so a small grammar will do)
    documents = {salt: slow_descriptor(salt, rules=8) for salt in "ab"}
    # The initiators compile their own descriptors first; this process's cache of compiled
    # grammars (which the in-process server shares) is then emptied, so the server's
    # compiles are cold.
    registries = {salt: initiator_registry(document) for salt, document in documents.items()}
    cbcl.protocol._registry.DEFAULT_GRAMMAR_CACHE.clear()
    release = threading.Event()
    held = threading.Event()

    async def scenario() -> None:
        caps = ServerLimits(compile_workers=1, compile_queue=0)
        async with running(tmp_path, server=caps) as srv:
            # contract-net/v1 compiled (cold, in the guarded worker: a loaded machine may
            # take longer than WAIT, and nothing here is about its time): now warm
            await good_peer(srv.address, wait=120)
            gate = srv.server.pool.compile_gate
            real_slot = gate.slot

            @contextlib.contextmanager
            def holding_slot(wait: float) -> Iterator[None]:
                with real_slot(wait):  # (the gate's count and bound, unchanged)
                    held.set()
                    release.wait(60)  # (a worker thread: the loop runs on)
                    yield

            gate.slot = holding_slot
            try:
                slow = asyncio.create_task(offer_only(srv.address, documents["a"], "a",
                                                      registries["a"]))
                while not held.is_set():  # a holds the only slot
                    await asyncio.sleep(0.01)
                assert gate.admitted == 1
                assert await offer_only(srv.address, documents["b"], "b",
                                        registries["b"]) == "rejected limit"
                await good_peer(srv.address, tag="2")
                assert not slow.done()  # the warm peer did not wait for it
            finally:
                release.set()
            assert await asyncio.wait_for(slow, 60) == "accepted"
            assert gate.admitted == 0
    run(scenario)


# --------------------------------------------------------------------------- peer data


def test_cancel_before_any_handshake_is_not_understood(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(tmp_path) as srv:
            for body in (None, "go away"):
                message = cbcl.Message(
                    message_id="c-1", sender="agent://attacker", receiver="agent://cbcl/serve",
                    intent="CANCEL", protocol="cbcl-negotiation/v1",
                    conversation_id="negotiation-x", timestamp=cbcl.net._transport.clock_ms(),
                    body=body)
                reader, writer = await srv.raw()
                writer.write(frame(message.canonical().encode()))
                data = await until_closed(reader)
                assert NOT_UNDERSTOOD in data and b'"protocol"' in data
            assert len(srv.lines("has no place in the negotiation")) == 2
            assert srv.state_files() == {}
            await good_peer(srv.address)
    run(scenario)


def test_a_first_frame_over_the_handshake_limit_is_refused_at_its_prefix(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(tmp_path) as srv:
            limit = 2 * cbcl.Limits().max_string_bytes + 4096
            for size, code in ((limit, b'"malformed"'), (limit + 1, b'"limit"')):
                reader, writer = await srv.raw()
                writer.write(size.to_bytes(4, "big"))
                if size == limit:
                    writer.write(b" " * size)  # buffered whole, then refused as text
                assert code in await until_closed(reader)
            await good_peer(srv.address)
    run(scenario)


# --------------------------------------------------------------------------- unix sockets


def test_unix_socket_path_live_stale_or_not_a_socket(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"

    async def handle(connection: Any) -> None:
        return None

    def make() -> Session:
        return Session("responder", registry=cbcl.Registry(disk_cache=False))

    async def scenario() -> None:
        first = await serve(f"unix:{path}", make, handle)
        with pytest.raises(ConnectionLost, match="a server is answering there"):
            await serve(f"unix:{path}", make, handle)
        assert path.exists()  # the live server's socket is untouched
        first.close()
        await first.wait_closed()
        assert not path.exists()  # removed by the server that created it
        stale = socket.socket(socket.AF_UNIX)  # a socket file nobody answers on
        stale.bind(str(path))
        stale.close()
        second = await serve(f"unix:{path}", make, handle)
        os.unlink(path)
        path.write_text("not mine")  # replaced under the server: close leaves it alone
        second.close()
        await second.wait_closed()
        assert path.read_text() == "not mine"
        with pytest.raises(ConnectionLost, match="not a socket"):
            await serve(f"unix:{path}", make, handle)
        assert path.read_text() == "not mine"
    run(scenario)
