"""A good peer's latency while two addresses flood ``cbcl serve`` with refused ~66 KB bodies
(issue 36, item 2: good-peer p99 under the two-client refusal flood ≤ 2× its quiet value).

    python benchmarks/refusal_flood.py [--rounds N] [--phase S] [--budget default|off|both]
                                       [--json FILE]

A ``cbcl serve`` subprocess; a good peer (this process, 127.0.0.1) asks a valid QUERY
(no key needed), one at a time on a fresh connection, and times each answer; two flooders
(child processes, from 127.0.0.2 and 127.0.0.3) each send, as fast as they are answered,
a ~66 KB QUERY whose ``:versions`` list ends with a string the negotiation grammar refuses
(the issue's attack). Quiet and flood phases of ``--phase`` seconds alternate for
``--rounds`` rounds (interleaved: the machine is shared, its load drifts); the figure is
the good peer's p99 (and p50) over the flood phases against the quiet ones, from the same
run. ``--budget default`` runs the server with its refusal budget (``--max-refusals 16
--refusal-window 10``: each flooder's frames are read until 16 are refused, then its
connections are turned away unread); ``off`` with a budget that never trips (every
refused frame is read and explained: the refusal's own cost); ``both`` runs both.
Wall-clock latencies: noisy on a shared machine, hence the interleaving and the ratio.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import installed
import serve_harness as harness

import cbcl
from cbcl import Session
from cbcl.binary import frame
from cbcl.net._transport import clock_ms
from cbcl.session import Query

ROOT = Path(__file__).resolve().parent.parent
PAYLOAD = (ROOT / "descriptors" / "contract-net-v1.cbcl").read_bytes()
FLOODERS = ("127.0.0.2", "127.0.0.3")
TARGET = 2.0
WAIT = 10.0
BUDGETS = {"default": [], "off": ["--max-refusals", "1024", "--refusal-window", "0.001"]}


def query(tag: str, versions: int | None = None) -> bytes:
    """A framed QUERY for contract-net/v1 from ``agent://bench/<tag>``; with ``versions``,
    its ``:versions`` list holds that many sixteen-digit integers and then a string (refused
    by the negotiation grammar; 3,600 make a ~66 KB frame)."""
    registry = cbcl.Registry(disk_cache=False, isolate=False)
    protocol = registry.load(PAYLOAD, allow_unsigned=True)
    session = Session("initiator", registry=registry, me=f"agent://bench/{tag}",
                      peer="agent://cbcl/serve")
    version = protocol.descriptor.version
    data = session.send(Query("contract-net/v1", protocol.digest, (version,)), now=clock_ms())
    if versions is None:
        return data
    listed = " ".join(str(10 ** 15 + at) for at in range(versions))
    text = data[4:].decode().replace(f":versions ({version})", f':versions ({listed} "x")')
    return frame(text.encode())


def _connect(host: str, port: int, ip: str) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=WAIT, source_address=(ip, 0))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def flood(address: str, ip: str, stop: Any, counts: Any, index: int) -> None:
    """A flooder (child process): refused QUERYs from ``ip`` until ``stop`` is set."""
    host, port = address.rsplit(":", 1)
    data = query(f"flood-{ip}", versions=3600)
    while not stop.is_set():
        try:
            with _connect(host, int(port), ip) as sock:
                sock.sendall(data)
                while sock.recv(65536):
                    pass
        except OSError:
            time.sleep(0.01)
            continue
        counts[index] += 1


def ask(host: str, port: int, data: bytes) -> float:
    """One good QUERY on a fresh connection: seconds to its whole answer."""
    began = time.perf_counter()
    with _connect(host, port, "127.0.0.1") as sock:
        sock.sendall(data)
        head = b""
        while len(head) < 4:
            got = sock.recv(4 - len(head))
            if not got:
                raise RuntimeError("the server closed before answering a good QUERY")
            head += got
        size = int.from_bytes(head, "big")
        body = b""
        while len(body) < size:
            got = sock.recv(size - len(body))
            if not got:
                raise RuntimeError("the answer was cut short")
            body += got
    if b"NOT-UNDERSTOOD" in body:
        raise RuntimeError(f"a good QUERY was refused: {body[:300]!r}")
    return time.perf_counter() - began


def phase(host: str, port: int, seconds: float) -> list[float]:
    """Good QUERYs back to back for ``seconds``: their latencies in ms. (One QUERY made
    for the phase: its timestamp stays within the server's freshness window.)"""
    data = query("good")
    out: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        out.append(ask(host, port, data) * 1000)
    return out


def run(budget: str, rounds: int, seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="cbcl-flood-") as tmp:
        root = Path(tmp)
        keys = harness.make_keys(root)
        server = harness.ServeProcess(root, keys, BUDGETS[budget])
        address = server.start()
        host, port = address.rsplit(":", 1)
        try:
            phase(host, int(port), 1.0)  # warm: the server's grammar, caches
            quiet: list[float] = []
            flooded: list[float] = []
            sent = multiprocessing.Array("l", len(FLOODERS))
            cpu_before = harness.cpu_seconds(server.pid)
            for _ in range(rounds):
                quiet += phase(host, int(port), seconds)
                stop = multiprocessing.Event()
                children = [multiprocessing.Process(target=flood,
                                                    args=(address, ip, stop, sent, k))
                            for k, ip in enumerate(FLOODERS)]
                for child in children:
                    child.start()
                time.sleep(0.3)  # (the flood under way)
                flooded += phase(host, int(port), seconds)
                stop.set()
                for child in children:
                    child.join(WAIT)
                    if child.is_alive():
                        child.terminate()
            cpu = harness.cpu_seconds(server.pid) - cpu_before
            log = server.log()
        finally:
            server.stop()
    row: dict[str, Any] = {"budget": budget, "flood_frames": sent[:],
                           "server_cpu_s": round(cpu, 2), "events": log["events"]}
    for name, values in (("quiet", quiet), ("flood", flooded)):
        row[name] = {"n": len(values),
                     "p50_ms": round(harness.percentile(values, 0.5) or 0, 2),
                     "p99_ms": round(harness.percentile(values, 0.99) or 0, 2),
                     "max_ms": round(max(values, default=0), 2)}
    row["p99_ratio"] = round(row["flood"]["p99_ms"] / max(row["quiet"]["p99_ms"], 1e-9), 2)
    row["p50_ratio"] = round(row["flood"]["p50_ms"] / max(row["quiet"]["p50_ms"], 1e-9), 2)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--phase", type=float, default=3.0, help="seconds per phase")
    parser.add_argument("--budget", choices=("default", "off", "both"), default="both")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    installed.check()
    harness.raise_nofile()
    rows = []
    for budget in (("default", "off") if args.budget == "both" else (args.budget,)):
        row = run(budget, args.rounds, args.phase)
        rows.append(row)
        q, f = row["quiet"], row["flood"]
        print(f"budget {budget:<7} good QUERY quiet p50/p99 {q['p50_ms']}/{q['p99_ms']} ms "
              f"(n={q['n']}) | flood p50/p99 {f['p50_ms']}/{f['p99_ms']} ms (n={f['n']}) | "
              f"p99 ×{row['p99_ratio']} (target ≤ {TARGET}) p50 ×{row['p50_ratio']} | "
              f"flood frames {row['flood_frames']} | server CPU {row['server_cpu_s']} s",
              flush=True)
    if args.json:
        args.json.write_text(json.dumps({"machine": harness.machine(), "rows": rows},
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
