"""One long-lived session running many conversations: does its memory stay flat?

Two sans-io sessions (initiator and responder, in memory, binary encoding) negotiate
contract-net/v1 once, then run ``--conversations`` short conversations one after another
(CFP, then REFUSE, each with its own conversation id and task id). Reports the process's
resident memory (VmRSS) and the traced Python heap after the handshake, after a warm-up
and at the end. Target (issue 12): within 20 MB of the start after 100,000 conversations.

    python benchmarks/session_memory.py [--conversations 100000] [--json out.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
import tracemalloc
from pathlib import Path

import installed
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import cbcl
from cbcl.protocol._trust import TrustStore, sign_descriptor
from cbcl.session._session import NEED_DATA, Offer, ProtocolMessage, Query, Session

ROOT = Path(__file__).resolve().parent.parent
NOW = 1_764_500_000_000
TARGET_MB = 20.0


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def drain(source: Session, sink: Session) -> list[object]:
    data = source.data_to_send()
    if data:
        sink.receive_data(data)
    events: list[object] = []
    while (event := sink.next_event(now=NOW)) is not NEED_DATA:
        events.append(event)
    return events


def pair() -> tuple[Session, Session]:
    key = Ed25519PrivateKey.generate()
    payload = (ROOT / "descriptors" / "contract-net-v1.cbcl").read_bytes()
    mine = cbcl.Registry(disk_cache=False, isolate=False)
    protocol = mine.load(payload, allow_unsigned=True)
    a = Session("initiator", registry=mine, me="agent://a", peer="agent://b",
                signing_key=("k", key), encodings=("binary",))
    b = Session("responder", me="agent://b", require_signed_finished=True,
                registry=cbcl.Registry(trust=TrustStore({"k": key.public_key()}),
                                       disk_cache=False, isolate=False))
    b.receive_data(a.send(Query(str(protocol.id), protocol.digest,
                                (protocol.descriptor.version,)), now=NOW))
    drain(b, b)
    drain(b, a)
    b.receive_data(a.send(Offer(sign_descriptor(payload, [("k", key)])), now=NOW))
    drain(b, b)
    drain(b, a)
    drain(a, b)
    drain(b, a)
    return a, b


def conversation(a: Session, b: Session, number: int) -> None:
    task = f"t-{number}-{hashlib.sha256(str(number).encode()).hexdigest()[:8]}"
    cid = f"job-{number}"
    cfp = cbcl.Message(message_id=f"cn-{number}", sender="agent://a", receiver="agent://b",
                       intent="CFP", protocol="contract-net/v1", conversation_id=cid,
                       body=cbcl.read(f'(cfp :task (task :id "{task}" :action render) '
                                      f":deadline {number})".encode()))
    b.receive_data(a.send(ProtocolMessage(cfp), now=NOW))
    (_,) = drain(b, b)
    refuse = cbcl.Message(message_id=f"r-{number}", sender="agent://b", receiver="agent://a",
                          intent="REFUSE", protocol="contract-net/v1", conversation_id=cid,
                          in_reply_to=f"cn-{number}",
                          body=(cbcl.Symbol("refuse"), cbcl.Keyword("task-id"), task,
                                cbcl.Keyword("reason"), cbcl.Symbol("busy")))
    a.receive_data(b.send(ProtocolMessage(refuse), now=NOW))
    (answer,) = drain(a, a)
    if not (isinstance(answer, ProtocolMessage) and answer.finished):
        raise SystemExit(f"conversation {number} did not finish")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=100_000)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    installed.check()  # the installed cbcl, with its C extension
    a, b = pair()
    for number in range(1000):  # warm-up: caches and the automaton fill
        conversation(a, b, number)
    tracemalloc.start()
    start_rss, (start_heap, _) = rss_mb(), tracemalloc.get_traced_memory()
    started = time.perf_counter()
    samples = []
    step = max(1, args.conversations // 10)
    for number in range(1000, 1000 + args.conversations):
        conversation(a, b, number)
        if (number - 1000) % step == step - 1:
            samples.append(round(rss_mb() - start_rss, 2))
    seconds = time.perf_counter() - started
    heap, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    grown = rss_mb() - start_rss
    result = {
        "conversations": args.conversations,
        "seconds": round(seconds, 2),
        "rss_start_mb": round(start_rss, 1),
        "rss_growth_mb": round(grown, 2),
        "rss_growth_samples_mb": samples,
        "heap_growth_mb": round((heap - start_heap) / 2**20, 2),
        "open_conversations": len(b.tracker.conversations()) if b.tracker else 0,
        "target_mb": TARGET_MB,
        "pass": grown <= TARGET_MB,
    }
    print(f"{args.conversations} conversations in {seconds:.1f} s on one session: RSS "
          f"{start_rss:.1f} MB -> +{grown:.2f} MB (samples {samples}), traced heap "
          f"+{result['heap_growth_mb']} MB; target <= +{TARGET_MB:g} MB: "
          f"{'PASS' if result['pass'] else 'FAIL'}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
