"""Soak: one ``cbcl serve`` under a mix of well-behaved and hostile peers at the same time.

    python benchmarks/soak.py [--peers 200] [--slowloris 64] [--idle 500] [--slow-offers 6]
                              [--duration 40] [--modes distinct,shared] [--json PATH]
                              [--serve-arg=--OPTION=VALUE …]

Processes (the server is never in a client's process):

* the harness (this process): keys, the signed descriptors, the slow grammar's in-process
  compile, one warm-up negotiation (so the server's grammar cache is warm), RSS sampling of
  the server from /proc, and the report;
* ``cbcl serve`` (``python -m cbcl serve --listen 127.0.0.1:0 …``, default limits unless
  ``--serve-arg`` says otherwise), with ``XDG_CACHE_HOME`` in a fresh temp directory;
* the well-behaved peers (one process, asyncio): ``--peers`` peers, whose start times are
  spread evenly over ``--ramp`` seconds; each runs sessions back to back until
  ``--duration`` has passed (at least one): connect, negotiate contract-net/v1 with the
  library's initiator (``cbcl.session._session.Session`` on ``cbcl.net._transport.Connection``; the
  server does not know the protocol, so every session offers the signed descriptor and
  the server verifies it and takes the compiled grammar from its cache), then
  ``--conversations`` conversations (CFP → PROPOSE → ACCEPT → INFORM) with ``--think``
  seconds between them, each with its own task id, action and parameters;
* the attackers (one process, asyncio): ``--slowloris`` connections that send the length
  prefix and first byte of a valid QUERY frame and then one byte every
  ``--loris-interval`` seconds; ``--idle`` connections that send nothing; both reconnect
  when the server drops them (``--no-reconnect``: not), and every connection's lifetime is
  recorded; and ``--slow-offers`` offers, started with the well-behaved peers, each of a
  distinct validly signed descriptor whose grammar is inside the grammar limits but takes
  seconds to compile (benchmarks/slow_grammar.py).

Source addresses: in mode ``distinct`` every connection class has its own loopback
addresses (peers 127.1.x.y, slow-loris 127.2.x.y, idle 127.3.x.y, slow offers 127.5.0.y;
Linux routes all of 127/8 to lo), so per-address caps see attackers and good peers apart;
in mode ``shared`` everything comes from 127.0.0.1 (for information: per-address caps
then cannot tell them apart). Targets are judged on mode ``distinct``.

Targets: every well-behaved peer completes (no errors); p99 handshake (warm grammar) ≤ 50
ms; server peak RSS (VmHWM) ≤ 200 MB. Exit status 0 unless the harness itself fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import random
import secrets
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from decimal import Decimal
from importlib import resources
from pathlib import Path
from typing import Any

import installed

sys.path.insert(0, str(Path(__file__).resolve().parent))

import serve_harness as harness
import slow_grammar

ROOT = Path(__file__).resolve().parent.parent
SERVER = "agent://cbcl/serve"
TARGET_P99_HANDSHAKE_MS = 50.0
TARGET_RSS_MB = 200.0
ACTIONS = ("render-video", "transcode", "index-corpus", "backup-volume", "train-model",
           "resize-images", "compile-report", "scan-logs", "translate-doc", "mine-graph")
CODECS = ("h264", "h265", "vp9", "av1", "prores")


# --------------------------------------------------------------------------- addresses


def address_of(kind: str, index: int, mode: str) -> str:
    if mode == "shared":
        return "127.0.0.1"
    second = {"peer": 1, "loris": 2, "idle": 3, "offer": 5}[kind]
    return f"127.{second}.{index // 250}.{index % 250 + 1}"


async def open_from(address: str, local_ip: str, timeout: float = 10.0) -> tuple[Any, Any]:
    host, _, port = address.rpartition(":")
    return await asyncio.wait_for(asyncio.open_connection(
        host, int(port), local_addr=(local_ip, 0), limit=1 << 16), timeout)


def _error_text(exc: BaseException) -> str:
    one_line = getattr(exc, "one_line", None)
    text = one_line() if callable(one_line) else (str(exc) or type(exc).__name__)
    return f"{type(exc).__name__}: {text}"[:300]


# --------------------------------------------------------------------------- good peers


def cfp_body(rng: random.Random, task_id: str, now_ms: int) -> tuple[Any, ...]:
    """A varied, valid contract-net/v1 call for proposals."""
    from cbcl.core._values import Keyword as K, Symbol as S

    params: list[Any] = []
    if rng.random() < 0.8:
        params += [K("resolution"), rng.choice(["480p", "720p", "1080p", "1440p", "4k"])]
    if rng.random() < 0.8:
        params += [K("frames"), rng.randrange(1, 100_000)]
    if rng.random() < 0.5:
        params += [K("codec"), S(rng.choice(CODECS))]
    if rng.random() < 0.5:
        params += [K("budget"), Decimal(f"{rng.randrange(100, 10**6) / 100:.2f}")]
    if rng.random() < 0.4:
        params += [K("region"), f"eu-{rng.choice(['west', 'north', 'central'])}-"
                                f"{rng.randrange(1, 4)}"]
    if rng.random() < 0.3:
        params += [K("tags"), tuple(S(t) for t in rng.sample(
            ["urgent", "batch", "gpu", "cpu", "cheap", "night"], rng.randrange(1, 4)))]
    task: tuple[Any, ...] = (S("task"), K("id"), task_id, K("action"), S(rng.choice(ACTIONS)))
    if params or rng.random() < 0.5:
        task += (K("params"), tuple(params))
    body: tuple[Any, ...] = (S("cfp"), K("task"), task, K("deadline"),
                             now_ms + rng.randrange(60_000, 86_400_000))
    if rng.random() < 0.3:
        body += (K("round"), rng.randrange(1, 5))
    return body


def _field(body: Any, name: str) -> Any:
    if type(body) is not tuple:
        return None
    for key, value in zip(body[1::2], body[2::2], strict=False):
        if str(key) == name:
            return value
    return None


class Peer:
    """What a well-behaved peer needs: the signed contract-net/v1 descriptor, its payload,
    its key and the trust store that must have signed the server's Finished."""

    def __init__(self, document: bytes, payload: bytes, key: Any, trust_dir: str) -> None:
        from cbcl.protocol._trust import TrustStore

        self.document = document
        self.payload = payload
        self.key = key
        self.trust = TrustStore.from_directory(trust_dir)

    def session(self, me: str) -> Any:
        from cbcl.protocol._registry import Registry
        from cbcl.session._session import Session

        registry = Registry(disk_cache=True, trust=self.trust)
        registry.load(self.payload, allow_unsigned=True)  # our own descriptor
        return Session("initiator", registry=registry, me=me, peer=SERVER,
                       encodings=("binary", "text"), signing_key=("bench", self.key),
                       require_signed_finished=True)


async def good_session(peer: Peer, address: str, local_ip: str, name: str,
                       conversations: int, think: tuple[float, float],
                       rng: random.Random) -> dict[str, Any]:
    """One session: connect, negotiate, ``conversations`` conversations, close. Returns
    ``handshake_ms`` (connect to ESTABLISHED), ``conversation_ms`` (first CFP sent to the
    INFORM), ``error`` (``None`` when all went well)."""
    from cbcl.net._transport import Connection, clock_ms
    from cbcl.protocol._message import Intent, Message
    from cbcl.session._session import (
        ConnectionClosed,
        Established,
        NotUnderstood,
        Offer,
        ProtocolMessage,
        Query,
        Rejected,
        Unsupported,
    )

    record: dict[str, Any] = {"start": time.time(), "ip": local_ip, "handshake_ms": None,
                              "conversation_ms": [], "error": None, "encoding": None}
    session = peer.session(name)
    protocol = session.registry.get("contract-net/v1")
    connection = None
    state = "connect"
    try:
        started = time.perf_counter()
        reader, writer = await open_from(address, local_ip)
        connection = Connection(reader, writer, session)
        state = "handshake"
        await connection.send(Query(str(protocol.id), protocol.digest,
                                    (protocol.descriptor.version,), ("binary", "text")))
        while True:
            event = await connection.next_event()
            if isinstance(event, Unsupported):
                await connection.send(Offer(peer.document))
            elif isinstance(event, Established):
                record["handshake_ms"] = (time.perf_counter() - started) * 1000
                record["encoding"] = event.encoding
                break
            elif isinstance(event, Rejected):
                raise RuntimeError(f"offer rejected: {event.reason}")
            elif isinstance(event, NotUnderstood):
                raise RuntimeError(f"not understood: {event.reason}")
            elif isinstance(event, ConnectionClosed):
                raise RuntimeError(f"closed by the server in state {session.state.value}")
        for number in range(conversations):
            if think[1] > 0:
                await asyncio.sleep(rng.uniform(*think))
            state = f"conversation {number + 1}"
            task_id = f"t-{name.rsplit('/', 1)[-1]}-{number}-{rng.randrange(1 << 40):x}"
            cid = f"job-{task_id}"
            cfp = Message(message_id=f"{task_id}-1", sender=session.me, receiver=session.peer,
                          intent=Intent.CFP, protocol=protocol.id, conversation_id=cid,
                          body=cfp_body(rng, task_id, clock_ms()))
            begun = time.perf_counter()
            await connection.send(ProtocolMessage(cfp))
            event = await connection.next_event()
            if not (isinstance(event, ProtocolMessage) and event.message.intent is Intent.PROPOSE
                    and _field(event.message.body, "task-id") == task_id):
                raise RuntimeError(f"expected a PROPOSE for {task_id}, got {event!r}"[:200])
            accept = Message(message_id=f"{task_id}-2", sender=session.me,
                             receiver=session.peer, intent=Intent.ACCEPT,
                             protocol=protocol.id, conversation_id=cid,
                             in_reply_to=event.message.message_id,
                             body=_accept_body(task_id))
            await connection.send(ProtocolMessage(accept))
            event = await connection.next_event()
            if not (isinstance(event, ProtocolMessage) and event.message.intent is Intent.INFORM
                    and _field(event.message.body, "task-id") == task_id):
                raise RuntimeError(f"expected an INFORM for {task_id}, got {event!r}"[:200])
            record["conversation_ms"].append((time.perf_counter() - begun) * 1000)
    except Exception as exc:  # every failure of a good peer is an error to report
        record["error"] = f"[{state}] {_error_text(exc)}"
    finally:
        if connection is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.close(), 5.0)
    record["end"] = time.time()
    return record


def _accept_body(task_id: str) -> tuple[Any, ...]:
    from cbcl.core._values import Keyword, Symbol

    return (Symbol("accept-proposal"), Keyword("task-id"), task_id)


async def run_good(config: dict[str, Any]) -> dict[str, Any]:
    peer = Peer(Path(config["document"]).read_bytes(), Path(config["payload"]).read_bytes(),
                _load_key(config["key_file"]), config["client_trust"])
    peer.session("agent://bench/preload")  # compile/load the descriptor once, untimed
    from cbcl.session._session import negotiation_registry

    negotiation_registry()
    count, ramp, duration = config["peers"], config["ramp"], config["duration"]
    think = tuple(config["think"])
    timeout = config["session_timeout"]
    t0 = time.time()

    async def one_peer(index: int) -> list[dict[str, Any]]:
        rng = random.Random(config["seed"] * 1_000_003 + index)
        await asyncio.sleep(index * ramp / max(count, 1))
        ip = address_of("peer", index, config["mode"])
        sessions: list[dict[str, Any]] = []
        while not sessions or time.time() - t0 < duration:
            name = f"agent://bench/peer-{index}-{len(sessions)}"
            try:
                record = await asyncio.wait_for(good_session(
                    peer, config["address"], ip, name, config["conversations"], think, rng),
                    timeout)
            except TimeoutError:
                record = {"start": time.time() - timeout, "end": time.time(), "ip": ip,
                          "handshake_ms": None, "conversation_ms": [],
                          "error": f"session timed out after {timeout:g} s"}
            record["peer"] = index
            sessions.append(record)
            if think[1] > 0:
                await asyncio.sleep(rng.uniform(*think))
        return sessions

    lags: list[tuple[float, float]] = []
    probing = asyncio.ensure_future(loop_lag(lags))
    results = await asyncio.gather(*(one_peer(i) for i in range(count)))
    probing.cancel()
    return {"t0": t0, "sessions": [s for peer_sessions in results for s in peer_sessions],
            "loop_lag": lags, "cpu_s": time.process_time(), "wall_s": time.time() - t0,
            "pid": os.getpid()}


async def loop_lag(out: list[tuple[float, float]], period: float = 0.02) -> None:
    """How late this process's event loop wakes up (ms), every ``period`` s: a starved
    client inflates the latencies it measures, and this says by how much at most."""
    while True:
        before = time.perf_counter()
        await asyncio.sleep(period)
        out.append((time.time(), (time.perf_counter() - before - period) * 1000))


def _load_key(path: str) -> Any:
    from cbcl.protocol._trust import load_private_key

    return load_private_key(Path(path).read_bytes())


# --------------------------------------------------------------------------- attackers


class Attack:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.address = config["address"]
        self.stop = asyncio.Event()
        self.go = asyncio.Event()
        self.connections: list[dict[str, Any]] = []
        self.offers: list[dict[str, Any]] = []
        self.first_tries = 0
        self.first_done = asyncio.Event()
        self.slots = config["slowloris"] + config["idle"]
        if self.slots == 0:
            self.first_done.set()
        self.peer = Peer(Path(config["document"]).read_bytes(),
                         Path(config["payload"]).read_bytes(),
                         _load_key(config["key_file"]), config["client_trust"])

    def _tried(self) -> None:
        self.first_tries += 1
        if self.first_tries >= self.slots:
            self.first_done.set()

    async def slot(self, kind: str, index: int) -> None:
        """One slow-loris or idle slot: connect, misbehave until the server drops the
        connection (or the run ends), record its lifetime, reconnect."""
        from cbcl.net._transport import clock_ms
        from cbcl.session._session import Query

        ip = address_of("loris" if kind == "slowloris" else "idle", index, self.config["mode"])
        first = True
        await asyncio.sleep(index * 0.004)  # spread the connection storm a little
        while not self.stop.is_set():
            record: dict[str, Any] = {"kind": kind, "ip": ip, "start": time.time()}
            try:
                reader, writer = await open_from(self.address, ip)
            except Exception as exc:
                record.update(outcome="connect failed", detail=_error_text(exc), survived_s=0.0)
                self.connections.append(record)
                if first:
                    first = False
                    self._tried()
                await self._pause(1.0)
                continue
            connected = time.monotonic()
            if first:
                first = False
                self._tried()
            data = b""
            if kind == "slowloris":
                session = self.peer.session(f"agent://bench/loris-{index}")
                protocol = session.registry.get("contract-net/v1")
                data = session.send(Query(str(protocol.id), protocol.digest,
                                          (protocol.descriptor.version,),
                                          ("binary", "text")), now=clock_ms())
            record.update(await self._hold(reader, writer, data))
            record["survived_s"] = time.monotonic() - connected
            self.connections.append(record)
            if not self.config["reconnect"]:
                return
            # Refused at once (a cap): back off a second rather than flood the server.
            await self._pause(0.2 if record["survived_s"] >= 1.0 else 1.0)

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)

    async def _hold(self, reader: Any, writer: Any, data: bytes) -> dict[str, Any]:
        """Trickle ``data`` (the frame prefix and one more byte at once, then a byte per
        interval) or, with no data, send nothing; until the server closes or we stop."""

        async def until_closed() -> tuple[str, int]:
            received = 0
            try:
                while True:
                    chunk = await reader.read(1 << 16)
                    if not chunk:
                        return "closed by server", received
                    received += len(chunk)
            except (ConnectionError, OSError) as exc:
                return f"reset by server ({type(exc).__name__})", received

        closed = asyncio.ensure_future(until_closed())
        stopping = asyncio.ensure_future(self.stop.wait())
        sent = 0
        outcome = ""
        try:
            if data:
                writer.write(data[:5])
                sent = 5
            while True:
                done, _ = await asyncio.wait(
                    {closed, stopping}, return_when=asyncio.FIRST_COMPLETED,
                    timeout=self.config["loris_interval"] if data else None)
                if closed in done:
                    outcome, received = closed.result()
                    return {"outcome": outcome, "bytes_sent": sent, "bytes_received": received}
                if stopping in done:
                    outcome = "open at end"
                    return {"outcome": outcome, "bytes_sent": sent}
                if sent < len(data):
                    try:
                        writer.write(data[sent:sent + 1])
                        await writer.drain()
                        sent += 1
                    except (ConnectionError, OSError) as exc:
                        return {"outcome": f"write failed ({type(exc).__name__})",
                                "bytes_sent": sent}
        finally:
            stopping.cancel()
            closed.cancel()
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 2.0)

    async def slow_offer(self, index: int) -> None:
        """Offer the ``index``-th slow descriptor with a hand-made initiator (the library's
        initiator would compile the grammar on our side first): QUERY, PROPOSE, and when
        accepted the signed CONFIRM; records the time from the offer to B's answer."""
        await self.go.wait()
        spec = self.config["offers"][index]
        ip = address_of("offer", index, self.config["mode"])
        record: dict[str, Any] = {"kind": "slow-offer", "ip": ip, "protocol": spec["protocol"],
                                  "start": time.time()}
        try:
            record.update(await asyncio.wait_for(hand_made_offer(
                self.address, ip, Path(spec["document"]).read_bytes(), spec["protocol"],
                spec["digest"], self.peer.key), self.config["offer_timeout"]))
        except Exception as exc:
            record.update(outcome="error", detail=_error_text(exc))
        record["end"] = time.time()
        self.offers.append(record)

    async def commands(self) -> None:
        while True:
            line = await asyncio.to_thread(sys.stdin.readline)
            if line.strip() == "go" or not line:
                self.go.set()
            if line.strip() == "stop" or not line:
                self.stop.set()
                return

    async def run(self) -> dict[str, Any]:
        from cbcl.session._session import negotiation_registry

        negotiation_registry()
        self.peer.session("agent://bench/preload")
        tasks = [asyncio.ensure_future(self.slot("slowloris", i))
                 for i in range(self.config["slowloris"])]
        tasks += [asyncio.ensure_future(self.slot("idle", i)) for i in range(self.config["idle"])]
        offers = [asyncio.ensure_future(self.slow_offer(i))
                  for i in range(len(self.config["offers"]))]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.first_done.wait(), 60.0)
        print("ready", flush=True)
        listener = asyncio.ensure_future(self.commands())
        await self.stop.wait()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30.0)
        for task in offers:
            task.cancel()
        await asyncio.gather(*offers, return_exceptions=True)
        listener.cancel()
        return {"connections": self.connections, "offers": self.offers,
                "cpu_s": time.process_time(), "pid": os.getpid()}


async def hand_made_offer(address: str, ip: str, document: bytes, protocol: str, digest: str,
                          key: Any) -> dict[str, Any]:
    from cbcl.binary._framing import FrameReader, frame
    from cbcl.core._values import Keyword, Symbol
    from cbcl.net._transport import clock_ms
    from cbcl.protocol._api import parse
    from cbcl.protocol._message import Intent, Message
    from cbcl.protocol._trust import sign_message
    from cbcl.session._session import finished_value, negotiation_registry

    negotiation = Symbol("cbcl-negotiation/v1")
    nonce = secrets.token_hex(16)
    me = f"agent://bench/slow-offer-{nonce[:6]}"
    transcript = hashlib.sha256()
    frames = FrameReader(1 << 20)
    sent = 0
    last: str | None = None
    reader, writer = await open_from(address, ip)

    async def say(intent: Intent, body: tuple[Any, ...], *, sign: bool = False) -> None:
        nonlocal sent
        sent += 1
        message = Message(message_id=f"o-{nonce[:12]}-{sent}", sender=me, receiver=SERVER,
                          intent=intent, protocol=negotiation,
                          conversation_id=f"negotiation-{nonce}", in_reply_to=last,
                          timestamp=clock_ms(), body=body)
        if sign:
            message = sign_message(message, key, "bench")
        data = frame(message.canonical().encode())
        if not sign:
            transcript.update(data)
        writer.write(data)
        await writer.drain()

    async def hear() -> Any:
        nonlocal last
        while True:
            for payload in frames:
                message = parse(payload, registry=negotiation_registry())
                transcript.update(frame(payload))
                last = message.message_id
                return message
            chunk = await reader.read(1 << 16)
            if not chunk:
                raise ConnectionError("the server closed the connection")
            frames.feed(chunk)

    def kw(*pairs: Any) -> tuple[Any, ...]:
        out: list[Any] = []
        for name, value in pairs:
            out += [Keyword(name), value]
        return tuple(out)

    try:
        await say(Intent.QUERY, (Symbol("supports"), *kw(
            ("protocol", Symbol(protocol)), ("digest", digest), ("versions", (1,)),
            ("encodings", (Symbol("binary"), Symbol("text"))), ("nonce", nonce))))
        answer = await hear()
        if type(answer.body) is not tuple:
            return {"outcome": f"{answer.intent.value.lower()}: {answer.body}"}
        if str(answer.body[0]) != "unsupported":
            return {"outcome": f"unexpected answer {answer.body[0]}"}
        offered = time.perf_counter()
        await say(Intent.PROPOSE, (Symbol("offer"), *kw(("digest", digest),
                                                        ("descriptor", document.decode()))))
        answer = await hear()
        answer_s = time.perf_counter() - offered
        if type(answer.body) is not tuple:
            return {"outcome": f"{answer.intent.value.lower()}: {answer.body}",
                    "answer_s": answer_s}
        if str(answer.body[0]) != "accepted":
            return {"outcome": f"rejected: {_field(answer.body, 'reason')}",
                    "answer_s": answer_s}
        value = finished_value(transcript.digest(), "initiator")
        body = (Symbol("finished"), *kw(("transcript", value)))
        await say(Intent.CONFIRM, body, sign=True)
        confirm = await hear()
        ok = type(confirm.body) is tuple and str(confirm.body[0]) == "finished"
        return {"outcome": "accepted, established" if ok else f"accepted, then {confirm.body}",
                "answer_s": answer_s}
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), 2.0)


# --------------------------------------------------------------------------- the harness


def _signed_files(root: Path, keys: harness.Keys, args: argparse.Namespace,
                  count: int) -> dict[str, Any]:
    from cbcl.protocol._trust import sign_descriptor

    payload = resources.files("cbcl.grammars").joinpath("contract-net-v1.cbcl").read_bytes()
    document = sign_descriptor(payload, [("bench", keys.client_key)])
    (root / "contract-net-v1.cbcl").write_bytes(payload)
    (root / "contract-net-v1.signed.cbcl").write_bytes(document)
    offers = []
    for index in range(count):
        seed = 1000 + index
        slow = slow_grammar.slow_descriptor(seed, args.slow_rules, args.slow_alternatives)
        path = root / f"slow-{seed}.signed.cbcl"
        path.write_bytes(sign_descriptor(slow, [("bench", keys.client_key)]))
        offers.append({"protocol": slow_grammar.protocol_id(seed), "document": str(path),
                       "digest": "sha256:" + hashlib.sha256(slow).hexdigest(),
                       "document_bytes": path.stat().st_size})
    return {"payload": str(root / "contract-net-v1.cbcl"),
            "document": str(root / "contract-net-v1.signed.cbcl"), "offers": offers}


def _child(role: str, config: dict[str, Any], root: Path, env: dict[str, str],
           **popen: Any) -> tuple[subprocess.Popen[str], Path]:
    config_path = root / f"{role}.config.json"
    out_path = root / f"{role}.result.json"
    config_path.write_text(json.dumps(config))
    process = subprocess.Popen([sys.executable, __file__, f"_{role}", str(config_path),
                                str(out_path)], env=env, text=True, **popen)
    return process, out_path


def _stats(values: list[float]) -> dict[str, Any]:
    return {"n": len(values), "p50": harness.percentile(values, 0.50),
            "p99": harness.percentile(values, 0.99), "max": max(values, default=None)}


def _max_concurrency(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    best = current = 0
    for _, step in events:
        current += step
        best = max(best, current)
    return best


def _lifetimes(records: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    mine = [r for r in records if r["kind"] == kind]
    dropped = [r["survived_s"] for r in mine if r["outcome"].startswith(("closed", "reset",
                                                                          "write failed"))]
    outcomes: dict[str, int] = {}
    for record in mine:
        outcomes[record["outcome"]] = outcomes.get(record["outcome"], 0) + 1
    return {"connections": len(mine), "outcomes": outcomes,
            "dropped_by_server": len(dropped),
            "survived_s": {"min": min(dropped, default=None),
                           "median": harness.percentile(dropped, 0.5),
                           "max": max(dropped, default=None)},
            "open_at_end": sum(1 for r in mine if r["outcome"] == "open at end"),
            "open_at_end_held_s": harness.percentile(
                [r["survived_s"] for r in mine if r["outcome"] == "open at end"], 0.5),
            "connect_failures": outcomes.get("connect failed", 0),
            "connect_failure_examples": sorted({r.get("detail", "") for r in mine
                                                if r["outcome"] == "connect failed"})[:3]}


def run_mode(mode: str, args: argparse.Namespace, extra: list[str],
             say: Any) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"cbcl-soak-{mode}-") as temp:
        root = Path(temp)
        keys = harness.make_keys(root)
        files = _signed_files(root, keys, args, args.slow_offers)
        env = dict(os.environ, XDG_CACHE_HOME=str(root / "client-cache"), PYTHONUNBUFFERED="1")
        os.environ["XDG_CACHE_HOME"] = env["XDG_CACHE_HOME"]  # this process's warm-up too
        server = harness.ServeProcess(root, keys, extra)
        address = server.start()
        say(f"[{mode}] {server.first_line} (pid {server.pid})")
        config = {"address": address, "mode": mode, "key_file": str(keys.client_key_file),
                  "client_trust": str(keys.client_trust), "payload": files["payload"],
                  "document": files["document"], "seed": args.seed}
        sampler = harness.RSSSampler(server.pid)
        sampling = threading.Event()

        def sample_loop() -> None:
            while not sampling.wait(0.25):
                sampler.sample()

        sampler_thread = threading.Thread(target=sample_loop, daemon=True)
        sampler_thread.start()
        result: dict[str, Any] = {"mode": mode, "server_pid": server.pid,
                                  "serve_command": " ".join(shlex.quote(c) for c in
                                                            server.command)}
        attack = good = None
        try:
            peer = Peer(Path(files["document"]).read_bytes(),
                        Path(files["payload"]).read_bytes(), keys.client_key,
                        str(keys.client_trust))
            warm = [asyncio.run(good_session(peer, address, "127.0.0.1",
                                             f"agent://bench/warm-{i}", 1, (0.0, 0.0),
                                             random.Random(i))) for i in range(2)]
            result["warm_up"] = [{"handshake_ms": w["handshake_ms"], "error": w["error"]}
                                 for w in warm]
            say(f"[{mode}] warm-up: first handshake {_ms(warm[0]['handshake_ms'])} (server "
                f"compiles contract-net/v1), second {_ms(warm[1]['handshake_ms'])}"
                + "".join(f"; warm-up error: {w['error']}" for w in warm if w["error"]))
            attack, attack_out = _child("attack", dict(
                config, slowloris=args.slowloris, idle=args.idle,
                loris_interval=args.loris_interval, reconnect=args.reconnect,
                offers=files["offers"], offer_timeout=args.duration + 120.0),
                root, env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            assert attack.stdin is not None and attack.stdout is not None
            began = time.monotonic()
            line = attack.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(f"the attack process did not start ({line!r})")
            say(f"[{mode}] attackers connected in {time.monotonic() - began:.1f} s "
                f"(pid {attack.pid}); starting {args.peers} peers and {args.slow_offers} "
                "slow offers")
            result["rss_before_mb"] = harness.proc_status(server.pid).get("VmRSS", 0) / 2**20
            busy0, total0 = harness.machine_cpu()
            ours0 = {"server": harness.tree_cpu_seconds(server.pid),
                     "attackers": harness.cpu_seconds(attack.pid),
                     "harness": time.process_time()}
            result["load_average_at_start"] = harness.load_average()
            attack.stdin.write("go\n")
            attack.stdin.flush()
            t0 = time.monotonic()
            good, good_out = _child("good", dict(
                config, peers=args.peers, ramp=args.ramp, duration=args.duration,
                conversations=args.conversations, think=args.think,
                session_timeout=args.session_timeout), root, env)
            good.wait(timeout=args.duration + args.ramp + 10 * args.session_timeout)
            if good.returncode != 0:
                raise RuntimeError(f"the peers' process failed (exit {good.returncode})")
            left = args.duration - (time.monotonic() - t0)
            if left > 0:
                time.sleep(left)
            result["soak_s"] = time.monotonic() - t0
            result["server_alive_at_end"] = server.alive()
            busy1, total1 = harness.machine_cpu()
            ours1 = {"server": harness.tree_cpu_seconds(server.pid),
                     "server_own": harness.cpu_seconds(server.pid),
                     "attackers": harness.cpu_seconds(attack.pid),
                     "harness": time.process_time()}
            result["load_average_at_end"] = harness.load_average()
            sampler.sample()
            attack.stdin.write("stop\n")
            attack.stdin.flush()
            attack.wait(timeout=90)
            if attack.returncode != 0:
                raise RuntimeError(f"the attack process failed (exit {attack.returncode})")
            good_result = json.loads(good_out.read_text())
            attack_result = json.loads(attack_out.read_text())
            sampler.sample()
            result["server_memory"] = sampler.summary()
            result["server_cpu_s"] = harness.cpu_seconds(server.pid)
            mine = {name: ours1[name] - ours0[name] for name in ("server", "attackers",
                                                                  "harness")}
            mine["peers"] = json.loads(good_out.read_text())["cpu_s"]
            busy = busy1 - busy0
            result["cpu_during_soak"] = {
                "available_core_s": total1 - total0, "machine_busy_s": busy,
                "server_and_compile_workers_s": mine["server"],
                "peers_s": mine["peers"], "attackers_s": mine["attackers"],
                "harness_s": mine["harness"],
                "other_processes_s": max(0.0, busy - sum(mine.values()))}
        finally:
            sampling.set()
            for child in (good, attack):
                if child is not None and child.poll() is None:
                    child.kill()
                    child.wait()
            server.stop()
            result["server_exit"] = server.process.returncode if server.process else None
            result["server_log"] = server.log()
        result.update(summarise(good_result, attack_result, files, args))
        result["processes"] = {"harness": os.getpid(), "server": server.pid,
                               "peers": good_result["pid"], "attackers": attack_result["pid"],
                               "peers_cpu_s": good_result["cpu_s"],
                               "attackers_cpu_s": attack_result["cpu_s"]}
        return result


def summarise(good: dict[str, Any], attack: dict[str, Any], files: dict[str, Any],
              args: argparse.Namespace) -> dict[str, Any]:
    sessions = good["sessions"]
    errors = [s for s in sessions if s["error"]]
    kinds: dict[str, int] = {}
    for record in errors:
        text = record["error"]
        key = text.split(" in state ")[0][:120]
        kinds[key] = kinds.get(key, 0) + 1
    peers_ok = len({s["peer"] for s in sessions} - {s["peer"] for s in errors})
    handshakes = [s["handshake_ms"] for s in sessions if s["handshake_ms"] is not None]
    conversations = [ms for s in sessions for ms in s["conversation_ms"]]
    t0 = good["t0"]
    offers = attack["offers"]
    window = (min((o["start"] for o in offers), default=0.0),
              max((o["end"] for o in offers), default=0.0))

    def during(when: float) -> bool:
        return window[0] <= when <= window[1]

    timeline = []
    end = max((s["end"] for s in sessions), default=t0)
    for start in range(0, int(end - t0) + 1, 5):
        chunk = [s["handshake_ms"] for s in sessions if s["handshake_ms"] is not None
                 and start <= s["start"] - t0 < start + 5]
        lag = [ms for when, ms in good["loop_lag"] if start <= when - t0 < start + 5]
        if chunk:
            timeline.append({"from_s": start, "handshakes": len(chunk),
                             "p50": harness.percentile(chunk, 0.5),
                             "p99": harness.percentile(chunk, 0.99),
                             "peers_loop_lag_max_ms": max(lag, default=None)})
    lags = [ms for _, ms in good["loop_lag"]]
    return {
        "good": {
            "peers": args.peers, "peers_all_ok": peers_ok, "sessions": len(sessions),
            "sessions_ok": len(sessions) - len(errors), "errors": len(errors),
            "error_kinds": dict(sorted(kinds.items(), key=lambda item: -item[1])[:10]),
            "error_examples": [f"peer {e['peer']} ({e['ip']}) at "
                               f"{e['start'] - t0:.1f} s: {e['error']}" for e in errors[:5]],
            "handshake_ms": _stats(handshakes), "conversation_ms": _stats(conversations),
            "handshake_ms_while_slow_compiles_run": _stats(
                [s["handshake_ms"] for s in sessions
                 if s["handshake_ms"] is not None and during(s["start"])]),
            "handshake_ms_otherwise": _stats(
                [s["handshake_ms"] for s in sessions
                 if s["handshake_ms"] is not None and not during(s["start"])]),
            "slow_compile_window_s": [window[0] - t0, window[1] - t0] if offers else None,
            "handshake_timeline_5s": timeline,
            "peers_loop_lag_ms": {"p50": harness.percentile(lags, 0.5),
                                  "p99": harness.percentile(lags, 0.99),
                                  "max": max(lags, default=None)},
            "conversations": len(conversations),
            "encodings": sorted({s["encoding"] for s in sessions if s.get("encoding")}),
            "max_concurrent_sessions": _max_concurrency([(s["start"], s["end"])
                                                         for s in sessions]),
            "wall_s": good["wall_s"]},
        "slowloris": _lifetimes(attack["connections"], "slowloris"),
        "idle": _lifetimes(attack["connections"], "idle"),
        "slow_offers": [{"protocol": o["protocol"], "ip": o["ip"], "outcome": o["outcome"],
                         "detail": o.get("detail"), "answer_s": o.get("answer_s"),
                         "document_bytes": next(f["document_bytes"] for f in files["offers"]
                                                if f["protocol"] == o["protocol"])}
                        for o in sorted(attack["offers"], key=lambda o: o["protocol"])],
    }


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f} ms"


def _num(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def targets(result: dict[str, Any]) -> dict[str, Any]:
    good = result["good"]
    p99 = good["handshake_ms"]["p99"]
    rss = result["server_memory"]["peak_rss_mb"]
    return {
        "every_peer_completes": {"achieved": f"{good['errors']} errors, "
                                             f"{good['peers_all_ok']}/{good['peers']} peers ok",
                                 "target": "0 errors", "holds": good["errors"] == 0
                                 and good["sessions"] > 0},
        "p99_handshake_ms": {"achieved": p99, "target": TARGET_P99_HANDSHAKE_MS,
                             "holds": None if p99 is None else p99 <= TARGET_P99_HANDSHAKE_MS},
        "server_peak_rss_mb": {"achieved": rss, "target": TARGET_RSS_MB,
                               "holds": rss <= TARGET_RSS_MB},
    }


def report(results: dict[str, Any], say: Any) -> None:
    say("")
    say("| mode | good sessions ok | errors | max concurrent | handshake p50 / p99 / max ms "
        "| conversation p50 / p99 / max ms | server peak RSS MB | server CPU s |")
    say("|---|---:|---:|---:|---:|---:|---:|---:|")
    for mode, result in results["modes"].items():
        good = result["good"]
        h, c = good["handshake_ms"], good["conversation_ms"]
        say(f"| {mode} | {good['sessions_ok']}/{good['sessions']} | {good['errors']} | "
            f"{good['max_concurrent_sessions']} | {_num(h['p50'])} / {_num(h['p99'])} / "
            f"{_num(h['max'])} | {_num(c['p50'])} / {_num(c['p99'])} / {_num(c['max'])} | "
            f"{result['server_memory']['peak_rss_mb']:.1f} | {result['server_cpu_s']:.1f} |")
    for mode, result in results["modes"].items():
        say("")
        say(f"[{mode}] processes: harness {result['processes']['harness']}, server "
            f"{result['processes']['server']} ({result['server_cpu_s']:.1f} CPU s), peers "
            f"{result['processes']['peers']} ({result['processes']['peers_cpu_s']:.1f} CPU s), "
            f"attackers {result['processes']['attackers']} "
            f"({result['processes']['attackers_cpu_s']:.1f} CPU s); soak "
            f"{result['soak_s']:.1f} s")
        cpu = result["cpu_during_soak"]
        say(f"[{mode}] CPU during the soak: {cpu['machine_busy_s']:.1f} of "
            f"{cpu['available_core_s']:.1f} core-s busy; server + compile workers "
            f"{cpu['server_and_compile_workers_s']:.1f}, peers {cpu['peers_s']:.1f}, "
            f"attackers {cpu['attackers_s']:.1f}, harness {cpu['harness_s']:.1f}, other "
            f"processes on this machine {cpu['other_processes_s']:.1f} (load average "
            f"{result['load_average_at_start']} at start, {result['load_average_at_end']} "
            "at end)")
        memory = result["server_memory"]
        say(f"[{mode}] server RSS: VmHWM {memory['peak_rss_mb']:.1f} MB, sampled max VmRSS "
            f"{memory['sampled_max_rss_mb']:.1f} MB (with compile workers "
            f"{memory['sampled_max_rss_with_workers_mb']:.1f} MB), before the soak "
            f"{result['rss_before_mb']:.1f} MB; alive at end: {result['server_alive_at_end']}")
        for kind in ("slowloris", "idle"):
            row = result[kind]
            survived = row["survived_s"]
            say(f"[{mode}] {kind}: {row['connections']} connections, "
                f"{row['dropped_by_server']} dropped by the server (survived min/median/max "
                f"{_num(survived['min'])}/{_num(survived['median'])}/{_num(survived['max'])} s),"
                f" {row['open_at_end']} open at the end, {row['connect_failures']} connects "
                f"failed {row['connect_failure_examples'] or ''}")
        for offer in result["slow_offers"]:
            say(f"[{mode}] slow offer {offer['protocol']} ({offer['document_bytes']} B): "
                f"{offer['outcome']} after {_num(offer['answer_s'], 2)} s"
                + (f" [{offer['detail']}]" if offer.get("detail") else ""))
        good = result["good"]
        if good["slow_compile_window_s"]:
            a, b = good["handshake_ms_while_slow_compiles_run"], good["handshake_ms_otherwise"]
            w = good["slow_compile_window_s"]
            say(f"[{mode}] handshake p50/p99 while slow offers were pending ({w[0]:.1f}–"
                f"{w[1]:.1f} s): {_num(a['p50'])}/{_num(a['p99'])} ms (n={a['n']}); otherwise "
                f"{_num(b['p50'])}/{_num(b['p99'])} ms (n={b['n']})")
        lag = good["peers_loop_lag_ms"]
        say(f"[{mode}] peers' event-loop lag (client-side delay in the figures) p50/p99/max "
            f"{_num(lag['p50'])}/{_num(lag['p99'])}/{_num(lag['max'])} ms")
        say(f"[{mode}] handshake p99 per 5 s (from peers' start): " + ", ".join(
            f"{row['from_s']}s {_num(row['p99'], 0)}" for row in good["handshake_timeline_5s"]))
        for kind, count in good["error_kinds"].items():
            say(f"[{mode}] good-peer error ×{count}: {kind}")
        for example in good["error_examples"]:
            say(f"[{mode}]   e.g. {example}")
        log = result["server_log"]
        say(f"[{mode}] server log: {log['stdout_lines']} stdout lines, {log['tracebacks']} "
            f"tracebacks, {log['stderr_bytes']} bytes of stderr, exit {result['server_exit']} "
            f"{_num(log['stop_after_sigterm_s'], 2)} s after SIGTERM"
            + (" (did not stop within 5 s: killed)" if log["killed_after_5s"] else ""))
        if log["stderr_tail"]:
            say(f"[{mode}] server stderr (tail): {log['stderr_tail'][-600:]}")
    if "distinct" in results["modes"]:
        say("")
        say("**Targets** (mode distinct)")
        say("| target | achieved | wanted | verdict |")
        say("|---|---|---|---|")
        for name, row in results["targets"].items():
            achieved = row["achieved"]
            shown = f"{achieved:.1f}" if isinstance(achieved, float) else str(achieved)
            wanted = f"≤ {row['target']:g}" if isinstance(row["target"], float) \
                else row["target"]
            say(f"| {name} | {shown} | {wanted} | {harness.verdict(row['holds'])} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=int, default=200)
    parser.add_argument("--conversations", type=int, default=3,
                        help="conversations per session (default 3)")
    parser.add_argument("--think", type=lambda t: [float(x) for x in t.split(",")],
                        default=[0.5, 2.0], metavar="LO,HI",
                        help="seconds between a peer's conversations and sessions (0.5,2)")
    parser.add_argument("--ramp", type=float, default=5.0,
                        help="peer start times spread over this many seconds (default 5)")
    parser.add_argument("--slowloris", type=int, default=64)
    parser.add_argument("--loris-interval", type=float, default=2.0)
    parser.add_argument("--idle", type=int, default=500)
    parser.add_argument("--slow-offers", type=int, default=6)
    parser.add_argument("--slow-rules", type=int, default=slow_grammar.DEFAULT_RULES)
    parser.add_argument("--slow-alternatives", type=int,
                        default=slow_grammar.DEFAULT_ALTERNATIVES)
    parser.add_argument("--duration", type=float, default=40.0,
                        help="seconds of the soak: the attack lasts this long, and peers "
                             "start new sessions until then (default 40)")
    parser.add_argument("--session-timeout", type=float, default=60.0)
    parser.add_argument("--no-reconnect", dest="reconnect", action="store_false")
    parser.add_argument("--modes", default="distinct,shared",
                        help="distinct (own loopback addresses per class), shared "
                             "(everything from 127.0.0.1), or both (default)")
    parser.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                        help="an extra cbcl serve argument, e.g. --serve-arg=--max-sessions=512")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    installed.check()  # the installed cbcl, with its C extension
    modes = [m for m in args.modes.split(",") if m]
    if any(m not in ("distinct", "shared") for m in modes) or not modes:
        parser.error("--modes takes distinct and/or shared")
    started = time.time()

    def say(line: str) -> None:
        print(line, flush=True)

    nofile = harness.raise_nofile()
    machine = harness.machine()
    state = harness.code_state(ROOT)
    say(f"soak: {machine['date']}, Python {machine['python']}, {machine['platform']}, "
        f"{machine['cpus']} CPUs (shared by the server, the peers' process, the attackers' "
        f"process and the harness); open files {nofile}")
    say(f"code: {state['commit']}; uncommitted library files: "
        f"{state['uncommitted_library_files']}")
    options = harness.available_options(harness.serve_help())
    extra = [part for arg in args.serve_arg for part in shlex.split(arg)]
    say("serve limit options (default as --help states; '-' not in this cbcl serve): "
        + ", ".join(f"{k} {v if v is not None else '-'}" for k, v in options.items()))
    say(f"serve extra arguments: {' '.join(extra) or 'none (all defaults)'}")
    say(f"scale: {args.peers} peers (starts spread over {args.ramp:g} s, sessions until "
        f"{args.duration:g} s, {args.conversations} conversations each, think "
        f"{args.think[0]:g}–{args.think[1]:g} s), {args.slowloris} slow-loris (a byte every "
        f"{args.loris_interval:g} s), {args.idle} idle, {args.slow_offers} slow offers; "
        f"reconnect {args.reconnect}")
    slow = slow_grammar.measure(0, args.slow_rules, args.slow_alternatives) \
        if args.slow_offers else None
    if slow is not None:
        say(f"slow grammar: {slow['rules']} rules, {slow['bnf_productions']} BNF productions, "
            f"{slow['grammar_bytes']} B of grammar ({slow['descriptor_bytes']} B descriptor), "
            f"{slow['verdict']}, {slow['lalr_states']} states; compile_grammar in-process "
            f"{slow['compile_s']:.2f} s")
    results: dict[str, Any] = {
        "machine": machine, "code": state, "serve_options": options, "serve_extra": extra,
        "config": {k: v for k, v in vars(args).items() if k != "json"},
        "slow_grammar": slow, "modes": {}}
    for mode in modes:
        results["modes"][mode] = run_mode(mode, args, extra, say)
    if "distinct" in results["modes"]:
        results["targets"] = targets(results["modes"]["distinct"])
    results["seconds"] = time.time() - started
    report(results, say)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    say(f"soak: done in {results['seconds']:.0f} s")
    return 0


def child_main(role: str, config_path: str, out_path: str) -> int:
    config = json.loads(Path(config_path).read_text())
    main_task = run_good(config) if role == "_good" else Attack(config).run()
    result = asyncio.run(main_task)
    Path(out_path).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] in ("_good", "_attack"):
        sys.exit(child_main(*sys.argv[1:]))
    sys.exit(main())
