"""Request/response stream: ``cbcl serve`` against an asyncio JSON-lines + pydantic server,
in the same run, over loopback TCP, with 1 and with 8 requests in flight on one connection.

    python benchmarks/stream.py [--requests 5000] [--repeats 3] [--json PATH]

Processes: ``cbcl serve`` (``python -m cbcl serve --listen 127.0.0.1:0 …``, default limits
but a one-hour idle timeout, fresh keys, empty grammar cache); the baseline server
(``python benchmarks/stream.py _baseline``: asyncio streams, one JSON line per message); and
the client, this process.

CBCL: the client negotiates request/v1 (binary; and text, for information) with the
library's initiator (``cbcl.session._session.Session`` on a
``cbcl.net._transport.Connection``), then
sends REQUESTs, each its own conversation-id and message-id, bodies drawn in turn from a
pool of ``--pool`` distinct request bodies that request/v1's grammar and schema accept
(made once request/v1 is loaded, as an application makes its messages);
the server answers each with INFORM ``(inform-done :action-id …)`` (``respond`` in
cbcl/demo.py, run on the event loop), after both passes, the schema, the replay and skew windows and
the conversation machine. Baseline: the same requests as natural JSON; the client builds
each with the pydantic model of request/v1 (``cbcl_bench.pydantic_model``: envelope, body
and schema constraints, strict) and serialises it; the server validates each line with
that model, checks intent, body kind, parties, timestamp skew (30 s) and replay of the
message id and conversation id (last 1,024), builds the INFORM reply as a model,
serialises it; the client validates the reply with the model and matches it to its
request.

"In flight" is a window: the client keeps that many requests outstanding (pipelined),
sending the next as each reply arrives; one task per connection, so the session is never
used from two tasks. Each figure is requests per second over ``--requests`` requests; the
systems are interleaved (order rotated per round), each measured ``--repeats`` times, the
median reported, after ``--warmup`` untimed requests per system and window.

Targets (binary CBCL / baseline requests per second): ≥ 1.0× with 1 in flight, ≥ 0.8× with
8 in flight. Exit status 0 unless the harness itself fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import installed

sys.path.insert(0, str(Path(__file__).resolve().parent))

import serve_harness as harness

ROOT = Path(__file__).resolve().parent.parent
SERVER = "agent://cbcl/serve"
CLIENT = "agent://bench/client"
TARGETS = {1: 1.0, 8: 0.8}
ACTIONS = ("snapshot-volume", "restart-service", "rotate-keys", "scale-deployment",
           "purge-cache", "run-migration", "renew-certificate", "export-report",
           "reindex-table", "drain-node", "compact-log", "verify-backup")


# --------------------------------------------------------------------------- the pool


def request_pool(count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` distinct request bodies as plain data: ``name``, ``args`` (keyword,
    value, … with values str, int, bool-as-symbol or a list of symbols) and ``by``."""
    rng = random.Random(seed)
    pool = []
    for index in range(count):
        args: list[tuple[str, Any, str]] = []  # (keyword, value, kind)
        if rng.random() < 0.9:
            args.append(("volume", f"vol-{rng.randrange(10_000)}", "str"))
        if rng.random() < 0.7:
            args.append(("retain-days", rng.randrange(1, 366), "int"))
        if rng.random() < 0.6:
            args.append(("verify", rng.choice(["true", "false"]), "sym"))
        if rng.random() < 0.5:
            args.append(("region", f"{rng.choice(['eu', 'us', 'ap'])}-"
                                   f"{rng.choice(['west', 'east', 'south'])}-"
                                   f"{rng.randrange(1, 4)}", "str"))
        if rng.random() < 0.4:
            args.append(("replicas", rng.randrange(1, 64), "int"))
        if rng.random() < 0.4:
            words = rng.choices(["nightly", "weekly", "db", "media", "logs", "hot", "cold",
                                 "archive", "primary", "replica"], k=rng.randrange(1, 9))
            args.append(("label", " ".join(words), "str"))
        if rng.random() < 0.3:
            args.append(("tags", rng.sample(["ops", "prod", "staging", "gold", "pci",
                                             "gdpr", "batch"], rng.randrange(1, 5)), "syms"))
        by = 1764500000000 + rng.randrange(10**9) if rng.random() < 0.7 else None
        pool.append({"name": rng.choice(ACTIONS) + (f"-{index % 7}" if index % 3 else ""),
                     "args": args, "by": by})
    return pool


def cbcl_body(item: dict[str, Any]) -> tuple[Any, ...]:
    from cbcl.core._values import Keyword, Symbol

    args: list[Any] = []
    for key, value, kind in item["args"]:
        args.append(Keyword(key))
        args.append(Symbol(value) if kind == "sym" else
                    tuple(Symbol(v) for v in value) if kind == "syms" else value)
    action: tuple[Any, ...] = (Symbol("action"), Keyword("name"), Symbol(item["name"]))
    if args:
        action += (Keyword("args"), tuple(args))
    body: tuple[Any, ...] = (Symbol("request"), Keyword("action"), action)
    if item["by"] is not None:
        body += (Keyword("by"), item["by"])
    return body


def json_body(item: dict[str, Any]) -> dict[str, Any]:
    """The same request as the natural JSON of ``cbcl_bench.natural_json``."""
    args: list[Any] = []
    for key, value, _kind in item["args"]:
        args += [f":{key}", value]
    action: dict[str, Any] = {"kind": "action", "name": item["name"]}
    if args:
        action["args"] = args
    body: dict[str, Any] = {"kind": "request", "action": action}
    if item["by"] is not None:
        body["by"] = item["by"]
    return body


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# --------------------------------------------------------------------------- CBCL client


class CBCLClient:
    def __init__(self, connection: Any, pool: list[tuple[Any, ...]], protocol: Any,
                 tag: str) -> None:
        self.connection = connection
        self.pool = pool
        self.protocol = protocol
        self.tag = tag
        self.counter = 0

    async def run(self, count: int, window: int) -> None:
        from cbcl.protocol._message import Intent, Message
        from cbcl.session._session import ProtocolMessage

        connection, pool, protocol = self.connection, self.pool, self.protocol
        me, peer = connection.session.me, connection.session.peer
        outstanding: set[str] = set()
        sent = done = 0
        while done < count:
            while sent < count and len(outstanding) < window:
                self.counter += 1
                number = self.counter
                mid = f"{self.tag}-{number}"
                await connection.send(ProtocolMessage(Message(
                    message_id=mid, sender=me, receiver=peer, intent=Intent.REQUEST,
                    protocol=protocol, conversation_id=f"c{mid}",
                    body=pool[number % len(pool)])))
                outstanding.add(mid)
                sent += 1
            event = await connection.next_event()
            message = getattr(event, "message", None)
            if message is None or message.intent is not Intent.INFORM \
                    or message.in_reply_to not in outstanding:
                raise RuntimeError(f"unexpected reply: {event!r}"[:300])
            outstanding.discard(message.in_reply_to)
            done += 1


async def cbcl_connect(address: str, document: bytes, payload: bytes, key: Any,
                       trust_dir: Path, encoding: str) -> tuple[Any, Any, float]:
    """Negotiate request/v1 in ``encoding``; returns the connection, the protocol id and
    the handshake time (ms)."""
    from cbcl.net._transport import connect
    from cbcl.protocol._registry import Registry
    from cbcl.session._session import (
        ConnectionClosed,
        Established,
        NotUnderstood,
        Offer,
        Query,
        Rejected,
        Session,
        Unsupported,
    )

    registry = Registry(disk_cache=True, trust=trust_dir)
    protocol = registry.load(payload, allow_unsigned=True)
    session = Session("initiator", registry=registry, me=CLIENT, peer=SERVER,
                      encodings=(encoding,), signing_key=("bench", key),
                      require_signed_finished=True)
    started = time.perf_counter()
    connection = await connect(address, session)
    await connection.send(Query(str(protocol.id), protocol.digest,
                                (protocol.descriptor.version,), (encoding,)))
    while True:
        event = await connection.next_event()
        if isinstance(event, Unsupported):
            await connection.send(Offer(document))
        elif isinstance(event, Established):
            if event.encoding != encoding:
                raise RuntimeError(f"asked for {encoding}, got {event.encoding}")
            return connection, protocol.id, (time.perf_counter() - started) * 1000
        elif isinstance(event, (Rejected, NotUnderstood, ConnectionClosed)):
            raise RuntimeError(f"the negotiation failed: {event!r}")


# --------------------------------------------------------------------------- baseline


def model() -> Any:
    from cbcl_bench import pydantic_model

    return pydantic_model()


async def baseline_server(port_out: Callable[[str], None]) -> None:
    Model = model()
    served = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal served
        seen: deque[str] = deque()
        seen_set: set[str] = set()
        peer: str | None = None
        try:
            while line := await reader.readline():
                try:
                    message = Model.model_validate_json(line)
                    now = now_ms()
                    if message.intent != "REQUEST" or message.body.kind != "request":
                        raise ValueError("only REQUEST (request …) starts a conversation here")
                    if message.receiver != SERVER or (peer is not None
                                                      and message.sender != peer):
                        raise ValueError("wrong parties")
                    peer = message.sender
                    if message.timestamp is None or abs(message.timestamp - now) > 30_000:
                        raise ValueError("stale")
                    for ident in (message.message_id, "c:" + (message.conversation_id or "")):
                        if ident in seen_set:
                            raise ValueError("replay")
                        seen.append(ident)
                        seen_set.add(ident)
                    while len(seen) > 2048:
                        seen_set.discard(seen.popleft())
                    served += 1
                    reply = Model.model_validate({
                        "message_id": f"serve-{served}", "sender": message.receiver,
                        "receiver": message.sender, "intent": "INFORM",
                        "protocol": "request/v1", "conversation_id": message.conversation_id,
                        "in_reply_to": message.message_id, "timestamp": now,
                        "body": {"kind": "inform-done", "action_id": message.message_id}})
                except ValueError as exc:  # pydantic's ValidationError is a ValueError
                    writer.write(json.dumps({"error": str(exc)[:200]}).encode() + b"\n")
                    await writer.drain()
                    return
                writer.write(reply.model_dump_json(exclude_none=True).encode() + b"\n")
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    port_out(f"baseline: listening on {host}:{port}")
    # Stop when the harness closes our stdin.
    await asyncio.to_thread(sys.stdin.read)
    server.close()


class BaselineClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 pool: list[dict[str, Any]]) -> None:
        self.reader = reader
        self.writer = writer
        self.pool = pool
        self.model = model()
        self.counter = 0

    async def run(self, count: int, window: int) -> None:
        Model, pool, reader, writer = self.model, self.pool, self.reader, self.writer
        outstanding: set[str] = set()
        sent = done = 0
        while done < count:
            while sent < count and len(outstanding) < window:
                self.counter += 1
                number = self.counter
                mid = f"b-{number}"
                request = Model.model_validate({
                    "message_id": mid, "sender": CLIENT, "receiver": SERVER,
                    "intent": "REQUEST", "protocol": "request/v1",
                    "conversation_id": f"c{mid}", "timestamp": now_ms(),
                    "body": pool[number % len(pool)]})
                writer.write(request.model_dump_json(exclude_none=True).encode() + b"\n")
                await writer.drain()
                outstanding.add(mid)
                sent += 1
            line = await reader.readline()
            reply = Model.model_validate_json(line)
            if reply.intent != "INFORM" or reply.in_reply_to not in outstanding \
                    or reply.body.kind != "inform-done":
                raise RuntimeError(f"unexpected reply: {line[:200]!r}")
            outstanding.discard(reply.in_reply_to)
            done += 1


# --------------------------------------------------------------------------- the harness


async def measure_all(args: argparse.Namespace, cbcl_address: str, baseline_address: str,
                      files: dict[str, Any], server_pids: dict[str, int],
                      say: Callable[[str], None]) -> dict[str, Any]:
    plain_pool = request_pool(args.pool, args.seed)
    json_pool = [json_body(item) for item in plain_pool]
    # The CBCL bodies are made once request/v1 is loaded (check_pool loads it first), as an
    # application makes its messages: its names are then the interned symbols and keywords
    # the encoder's tables hold (found by identity). Made before, each keyword was a new
    # object equal to the interned one, compared by the atoms' Python __eq__ (~11 calls a
    # request in the outgoing check).
    check_pool([cbcl_body(item) for item in plain_pool], json_pool, files)
    cbcl_pool = [cbcl_body(item) for item in plain_pool]
    clients: dict[str, Any] = {}
    handshakes = {}
    for encoding in ("binary", "text"):
        connection, protocol, ms = await cbcl_connect(
            cbcl_address, files["document"], files["payload"], files["key"],
            files["client_trust"], encoding)
        clients[f"cbcl-{encoding}"] = CBCLClient(connection, cbcl_pool, protocol, encoding[0])
        handshakes[f"cbcl-{encoding}"] = ms
    host, _, port = baseline_address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port), limit=1 << 20)
    clients["baseline"] = BaselineClient(reader, writer, json_pool)
    say("handshakes: " + ", ".join(f"{k} {v:.1f} ms" for k, v in handshakes.items()))
    pid_of = {"cbcl-binary": server_pids["cbcl"], "cbcl-text": server_pids["cbcl"],
              "baseline": server_pids["baseline"]}
    for client in clients.values():  # warm up every path
        for window in (1, 8):
            await client.run(args.warmup, window)
    samples: dict[str, dict[int, list[dict[str, float]]]] = {
        name: {1: [], 8: []} for name in clients}
    order = list(clients)
    for round_number in range(args.repeats):
        for window in (1, 8):
            for name in order[round_number % 3:] + order[:round_number % 3]:
                cpu = harness.cpu_seconds(pid_of[name])
                client_cpu = time.process_time()
                started = time.perf_counter()
                await clients[name].run(args.requests, window)
                seconds = time.perf_counter() - started
                client_cpu = time.process_time() - client_cpu
                server_cpu = harness.cpu_seconds(pid_of[name]) - cpu
                samples[name][window].append({
                    "rps": args.requests / seconds,
                    "server_cpu_us_per_request": server_cpu * 1e6 / args.requests,
                    "client_cpu_us_per_request": client_cpu * 1e6 / args.requests})
        say(f"round {round_number + 1}/{args.repeats}: " + ", ".join(
            f"{name}×{w} {samples[name][w][-1]['rps']:.0f}/s" for name in clients
            for w in (1, 8)))
    for name, client in clients.items():
        if name == "baseline":
            client.writer.close()
        else:
            with contextlib.suppress(Exception):
                await client.connection.close()
    results: dict[str, dict[str, dict[str, object]]] = {}
    for name in clients:
        results[name] = {}
        for window in (1, 8):
            rows = samples[name][window]
            results[name][str(window)] = {
                "rps_median": statistics.median(r["rps"] for r in rows),
                "rps_samples": [r["rps"] for r in rows],
                "server_cpu_us_per_request": statistics.median(
                    r["server_cpu_us_per_request"] for r in rows),
                "client_cpu_us_per_request": statistics.median(
                    r["client_cpu_us_per_request"] for r in rows)}
    return {"handshake_ms": handshakes, "systems": results}


def check_pool(cbcl_pool: list[tuple[Any, ...]], json_pool: list[dict[str, Any]],
               files: dict[str, Any]) -> None:
    """Every pool body passes request/v1's grammar and schema, and the pydantic model; the
    pool holds no duplicates."""
    from cbcl.protocol._api import canonical, parse
    from cbcl.protocol._message import Intent, Message
    from cbcl.protocol._registry import Registry

    registry = Registry(disk_cache=True)
    protocol = registry.load(files["payload"], allow_unsigned=True)
    Model = model()
    for number, (body, plain) in enumerate(zip(cbcl_pool, json_pool, strict=True)):
        text = canonical(Message(message_id=f"p-{number}", sender=CLIENT, receiver=SERVER,
                                 intent=Intent.REQUEST, protocol=protocol.id, body=body))
        parse(text.encode(), registry=registry)
        Model.model_validate({"message_id": "p", "sender": CLIENT, "receiver": SERVER,
                              "intent": "REQUEST", "protocol": "request/v1", "body": plain})
    if len({canonical(b) for b in cbcl_pool}) != len(cbcl_pool):
        raise RuntimeError("the request pool has duplicates")


def start_baseline(env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen([sys.executable, __file__, "_baseline"], env=env, text=True,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    if " on " not in line:
        process.kill()
        raise RuntimeError(f"the baseline server did not start ({line!r})")
    return process, line.rsplit(" on ", 1)[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=5000,
                        help="requests per measurement (default 5000)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--pool", type=int, default=1024,
                        help="distinct request bodies (default 1024)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                        help="an extra cbcl serve argument")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    installed.check()  # the installed cbcl, with its C extension
    began = time.time()

    def say(line: str) -> None:
        print(line, flush=True)

    machine = harness.machine()
    state = harness.code_state(ROOT)
    say(f"stream: {machine['date']}, Python {machine['python']}, {machine['platform']}, "
        f"{machine['cpus']} CPUs (shared by cbcl serve, the baseline server and the client)")
    say(f"code: {state['commit']}; uncommitted library files: "
        f"{state['uncommitted_library_files']}")
    # Each system's connections stay open, idle, while the others are measured: a long run
    # on a loaded machine outlasts the 30 s idle timeout, and the server rightly ends the
    # idle session (NOT-UNDERSTOOD timeout). The timeout costs nothing per message, so the
    # harness raises it; --serve-arg "--idle-timeout N" sets another.
    extra = ["--idle-timeout", "3600",
             *(part for arg in args.serve_arg for part in shlex.split(arg))]
    with tempfile.TemporaryDirectory(prefix="cbcl-stream-") as temp:
        root = Path(temp)
        keys = harness.make_keys(root)
        from cbcl.protocol._trust import sign_descriptor

        payload = (ROOT / "descriptors" / "request-v1.cbcl").read_bytes()
        files = {"payload": payload,
                 "document": sign_descriptor(payload, [("bench", keys.client_key)]),
                 "key": keys.client_key, "client_trust": keys.client_trust}
        env = dict(os.environ, XDG_CACHE_HOME=str(root / "client-cache"), PYTHONUNBUFFERED="1")
        os.environ["XDG_CACHE_HOME"] = env["XDG_CACHE_HOME"]
        server = harness.ServeProcess(root, keys, extra)
        baseline: subprocess.Popen[str] | None = None
        try:
            address = server.start()
            baseline, baseline_address = start_baseline(env)
            say(f"processes: client {os.getpid()}, cbcl serve {server.pid} "
                f"({server.first_line}; its per-message log goes to a file), baseline "
                f"{baseline.pid} on {baseline_address}")
            say(f"serve command: {' '.join(server.command)}")
            say(f"{args.requests} requests per measurement, {args.repeats} repeats (median), "
                f"{args.warmup} warm-up requests per system and window, pool of {args.pool} "
                "distinct request bodies")
            busy0, total0 = harness.machine_cpu()
            ours0 = (harness.cpu_seconds(server.pid) + harness.cpu_seconds(baseline.pid)
                     + time.process_time())
            load_start = harness.load_average()
            measured = asyncio.run(measure_all(args, address, baseline_address, files,
                                               {"cbcl": server.pid, "baseline": baseline.pid},
                                               say))
            busy1, total1 = harness.machine_cpu()
            ours1 = (harness.cpu_seconds(server.pid) + harness.cpu_seconds(baseline.pid)
                     + time.process_time())
            measured["cpu"] = {"available_core_s": total1 - total0,
                               "machine_busy_s": busy1 - busy0, "ours_s": ours1 - ours0,
                               "other_processes_s": max(0.0, busy1 - busy0 - ours1 + ours0),
                               "load_average_at_start": load_start,
                               "load_average_at_end": harness.load_average()}
        finally:
            if baseline is not None:
                with contextlib.suppress(Exception):
                    assert baseline.stdin is not None
                    baseline.stdin.close()
                try:
                    baseline.wait(5)
                except subprocess.TimeoutExpired:
                    baseline.kill()
                    baseline.wait()
            server.stop()
        log = server.log()
    systems = measured["systems"]
    ratios = {}
    for window in ("1", "8"):
        base = systems["baseline"][window]["rps_median"]
        ratios[window] = {name: systems[name][window]["rps_median"] / base
                          for name in ("cbcl-binary", "cbcl-text")}
    targets = {f"binary_vs_baseline_{w}_in_flight": {
        "achieved": ratios[str(w)]["cbcl-binary"], "target": target,
        "holds": ratios[str(w)]["cbcl-binary"] >= target} for w, target in TARGETS.items()}
    say("")
    say("| system | req/s, 1 in flight | req/s, 8 in flight | ×baseline (1) | ×baseline (8) "
        "| server CPU µs/req (1) | (8) | client CPU µs/req (1) | (8) |")
    say("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in ("cbcl-binary", "cbcl-text", "baseline"):
        one, eight = systems[name]["1"], systems[name]["8"]
        r1 = ratios["1"].get(name, 1.0)
        r8 = ratios["8"].get(name, 1.0)
        say(f"| {name} | {one['rps_median']:.0f} | {eight['rps_median']:.0f} | {r1:.2f} | "
            f"{r8:.2f} | {one['server_cpu_us_per_request']:.0f} | "
            f"{eight['server_cpu_us_per_request']:.0f} | "
            f"{one['client_cpu_us_per_request']:.0f} | {eight['client_cpu_us_per_request']:.0f} |")
    say("")
    say("**Targets** (CBCL binary vs the JSON-lines + pydantic baseline, requests/s)")
    say("| target | achieved | wanted | verdict |")
    say("|---|---:|---:|---|")
    for name, row in targets.items():
        say(f"| {name} | {row['achieved']:.2f}× | ≥ {row['target']:.1f}× | "
            f"{harness.verdict(row['holds'])} |")
    cpu = measured["cpu"]
    say(f"CPU while measuring: {cpu['machine_busy_s']:.1f} of {cpu['available_core_s']:.1f} "
        f"core-s busy; ours {cpu['ours_s']:.1f}, other processes on this machine "
        f"{cpu['other_processes_s']:.1f} (load average {cpu['load_average_at_start']} at "
        f"start, {cpu['load_average_at_end']} at end)")
    say(f"server log: {log['stdout_lines']} lines, {log['tracebacks']} tracebacks, "
        f"{log['stderr_bytes']} bytes of stderr, exit {log['returncode']}"
        + (" (did not stop within 5 s of SIGTERM: killed)" if log["killed_after_5s"] else ""))
    if log["stderr_tail"]:
        say(f"server stderr (tail): {log['stderr_tail'][-600:]}")
    results = {"machine": machine, "code": state, "config": {
        k: v for k, v in vars(args).items() if k != "json"}, "serve_command": server.command,
        **measured, "ratios": ratios, "targets": targets, "server_log": log,
        "seconds": time.time() - began}
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    say(f"stream: done in {results['seconds']:.0f} s")
    return 0


def _run_baseline() -> int:
    asyncio.run(baseline_server(lambda line: print(line, flush=True)))
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["_baseline"]:
        sys.exit(_run_baseline())
    sys.exit(main())
