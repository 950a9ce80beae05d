"""Two established sessions in one process, no sockets: request/v1 REQUEST -> INFORM.

Each request is a conversation of its own: the client sends a REQUEST, the server receives
it, sends an INFORM ``(inform-done …)`` in reply, the client receives that. ``--phase``
picks what runs ``--requests`` times after the handshake, for instruction counts under
callgrind (run two phases and subtract: ``setup`` from ``receive``, ``receive`` from
``send``, ``setup`` from ``loop``):

- ``setup``: the handshake, and the client's REQUEST frames made;
- ``receive``: that, then the server receives each frame;
- ``send``: that, then the server sends each reply;
- ``loop``: the handshake, then each request's four steps in turn.

``--reference`` runs the phase with the sessions' Python reference instead. Without
``--phase`` it times ``loop`` (µs per request, best of ``--repeats``), with the
sessions' native state and with their Python reference, interleaved, in one run.

    valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python benchmarks/session_loop.py --phase receive --requests 500
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import cbcl  # noqa: E402
from cbcl.core._values import Keyword, Symbol  # noqa: E402
from cbcl.protocol._message import Intent, Message  # noqa: E402
from cbcl.session import NEED_DATA, ProtocolMessage, Query, Session  # noqa: E402

NOW = 1_764_500_000_000
CLIENT, SERVER = "agent://bench/client", "agent://cbcl/serve"
DOCUMENT = (ROOT / "descriptors" / "request-v1.cbcl").read_bytes()


def sessions(native: bool) -> tuple[Session, Session, Any]:
    """An established client/server pair (binary) and the protocol."""
    registries = []
    for _ in range(2):
        registry = cbcl.Registry(disk_cache=False, isolate=False)
        protocol = registry.load(DOCUMENT, allow_unsigned=True)
        registries.append(registry)
    client = Session("initiator", registry=registries[0], me=CLIENT, peer=SERVER,
                     encodings=("binary",))
    server = Session("responder", registry=registries[1], me=SERVER, encodings=("binary",))
    if not native:
        client._use_native = server._use_native = False
    pending = {server: client.send(Query(str(protocol.id), protocol.digest, (), ("binary",)),
                                   now=NOW), client: b""}
    while any(pending.values()):
        for to, frm in ((server, client), (client, server)):
            if pending[to]:
                to.receive_data(pending[to])
                while to.next_event(now=NOW) is not NEED_DATA:
                    pass
            pending[to] = b""
            pending[frm] += to.data_to_send()
    return client, server, registries[0].get("request/v1")


def request(number: int, protocol: Any) -> Message:
    body = (Symbol("request"), Keyword("action"),
            (Symbol("action"), Keyword("name"), Symbol("snapshot-volume"),
             Keyword("args"), (Keyword("volume"), f"vol-{number % 997}",
                               Keyword("retain-days"), 30)),
            Keyword("by"), 1764500000000 + number)
    return Message(message_id=f"q-{number}", sender=CLIENT, receiver=SERVER,
                   intent=Intent.REQUEST, protocol=protocol.id,
                   conversation_id=f"c-{number}", body=body)


def reply(message: Message, number: int) -> Message:
    return Message(message_id=f"r-{number}", sender=SERVER, receiver=CLIENT,
                   intent=Intent.INFORM, protocol=message.protocol,
                   conversation_id=message.conversation_id, in_reply_to=message.message_id,
                   body=(Symbol("inform-done"), Keyword("action-id"), message.message_id))


def receive(session: Session, data: bytes) -> Message:
    session.receive_data(data)
    event = session.next_event(now=NOW)
    if not isinstance(event, ProtocolMessage):
        raise RuntimeError(f"unexpected {event!r}")
    return event.message


def phase(name: str, count: int, native: bool) -> None:
    client, server, protocol = sessions(native)
    if name == "loop":
        loop(client, server, protocol, count)
        return
    frames = [client.send(ProtocolMessage(request(n, protocol)), now=NOW)
              for n in range(count)]
    if name == "setup":
        return
    received = [receive(server, data) for data in frames]
    if name == "receive":
        return
    for n, message in enumerate(received):
        server.send(ProtocolMessage(reply(message, n)), now=NOW)


def loop(client: Session, server: Session, protocol: Any, count: int) -> None:
    for n in range(count):
        got = receive(server, client.send(ProtocolMessage(request(n, protocol)), now=NOW))
        receive(client, server.send(ProtocolMessage(reply(got, n)), now=NOW))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase", choices=("setup", "receive", "send", "loop"))
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--reference", action="store_true",
                        help="with --phase: the sessions' Python reference, not native state")
    args = parser.parse_args()
    if args.phase:
        phase(args.phase, args.requests, not args.reference)
        return
    best = {True: float("inf"), False: float("inf")}
    for _ in range(args.repeats):
        for native in (True, False):
            client, server, protocol = sessions(native)
            start = time.process_time()
            loop(client, server, protocol, args.requests)
            best[native] = min(best[native], time.process_time() - start)
    for native in (True, False):
        print(f"{'native state' if native else 'reference':>13}: "
              f"{best[native] / args.requests * 1e6:6.1f} µs CPU per request "
              f"(best of {args.repeats}, {args.requests} requests)")
    print(f"ratio reference/native: {best[False] / best[True]:.2f} "
          f"(pid {os.getpid()}, load {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
