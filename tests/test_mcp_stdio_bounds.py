"""``cbcl mcp``'s stdio input is hostile (issue 36.5, spec/interop.md §5.5): a line cap read
in bounded chunks, and JSON-RPC 2.0 error replies for what cannot be read. Driven as a
client that is not the SDK's would drive it: raw bytes on the pipe."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, strategies as st

pytest.importorskip("mcp")

from cbcl.bridges._mcp import (
    _error_line,
    _LineError,
    _Lines,
    default_max_line_bytes,
    read_jsonrpc_line,
)
from cbcl.core._limits import Limits

ROOT = Path(__file__).parent.parent
CAP = 4096
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {},
    "clientInfo": {"name": "raw", "version": "1"}}}


class Server:
    """``python -m cbcl mcp`` with raw pipes: send bytes, take reply lines (with a
    deadline: a missing reply fails the test, never hangs it)."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "cbcl", "mcp", *args], cwd=ROOT, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.replies: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.replies.put(line)

    def send(self, data: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(data)
        self.process.stdin.flush()

    def reply(self) -> dict[str, Any]:
        line = self.replies.get(timeout=60)
        answer: dict[str, Any] = json.loads(line)
        return answer

    def peak_rss_kib(self) -> int:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return next(int(line.split()[1]) for line in status.splitlines()
                    if line.startswith("VmHWM:"))

    def close(self) -> int:
        """End the input; the exit code once the server has read it all."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        return self.process.wait(timeout=60)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=60)
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def started() -> Iterator[list[Server]]:
    servers: list[Server] = []
    yield servers
    for server in servers:
        server.stop()


@pytest.fixture
def server(started: list[Server]) -> Server:
    started.append(Server("--max-line-bytes", str(CAP)))
    return started[-1]


def padded(message: dict[str, Any], size: int) -> bytes:
    """``message`` as one JSON line of exactly ``size`` bytes before its LF (spaces are
    JSON whitespace)."""
    text = json.dumps(message).encode()
    assert len(text) <= size
    return text[:-1] + b" " * (size - len(text)) + b"}"


def test_the_line_cap_n_accepted_n_plus_one_refused(server: Server) -> None:
    server.send(padded(INITIALIZE, CAP + 1) + b"\n")
    refused = server.reply()
    assert refused["id"] is None and refused["error"]["code"] == -32600
    assert f"longer than {CAP} bytes" in refused["error"]["data"]
    server.send(padded(INITIALIZE, CAP) + b"\n")
    accepted = server.reply()
    assert accepted["id"] == 1 and accepted["result"]["serverInfo"]["name"] == "cbcl"
    # The server reads on after a refusal, and the cap holds across reads.
    server.send(b" " * (3 * CAP) + b"\n" + json.dumps(
        {"jsonrpc": "2.0", "id": 2, "method": "ping"}).encode() + b"\n")
    assert server.reply()["error"]["code"] == -32600
    assert server.reply() == {"jsonrpc": "2.0", "id": 2, "result": {}}
    assert server.close() == 0


UNREADABLE = [
    (b"{", -32700, None),
    (b'{"jsonrpc": "2.0", "id": 3, "method": "ping"', -32700, None),
    (b"\xff\xfe", -32700, None),
    (b'{"jsonrpc": "2.0", "id": 3, "method": "ping", "params": {"x": "\xed\xa0\x80"}}',
     -32700, None),  # a lone surrogate's bytes: invalid UTF-8
    (b'{"jsonrpc": "2.0", "id": 3, "method": "ping", "params": {"x": "\\ud800"}}',
     -32700, None),  # an escaped lone surrogate
    (b'{"jsonrpc": "2.0", "id": 3, "method": "ping", "id": 4}', -32700, None),
    (b'{"jsonrpc": "2.0", "id": NaN, "method": "ping"}', -32700, None),
    (b"[" * 2000 + b"]" * 2000, -32700, None),  # deeper than max_depth + 8
    (b"[]", -32600, None),
    (b'[{"jsonrpc": "2.0", "id": 3, "method": "ping"}]', -32600, None),
    (b"5", -32600, None),
    (b'"ping"', -32600, None),
    (b'{"jsonrpc": "2.0", "id": 3, "method": 5}', -32600, 3),
    (b'{"jsonrpc": "1.0", "id": "a", "method": "ping"}', -32600, "a"),
    (b'{"jsonrpc": "2.0", "id": true, "method": "ping"}', -32600, None),
    (b'{"jsonrpc": "2.0", "id": 1.5, "method": "ping"}', -32600, None),
    (b'{"jsonrpc": "2.0", "id": null, "method": "ping"}', -32600, None),
    (b'{"id": 9}', -32600, 9),
]


def test_what_cannot_be_read_is_answered_as_json_rpc_says(server: Server) -> None:
    for line, code, request_id in UNREADABLE:
        server.send(line + b"\n")
        answer = server.reply()
        assert answer["jsonrpc"] == "2.0" and answer["id"] == request_id, line[:60]
        assert answer["error"]["code"] == code, line[:60]
        assert answer["error"]["message"] == ("Parse error" if code == -32700
                                              else "Invalid Request")
    server.send(b"\n  \r\n" + json.dumps(INITIALIZE).encode() + b"\r\n")
    assert server.reply()["id"] == 1  # blank lines are skipped; the server serves on
    assert server.close() == 0


def test_a_200_mb_line_does_not_raise_the_peak_rss_by_its_size(
        started: list[Server]) -> None:
    started.append(Server())  # the default cap: 10 MiB + 64 KiB
    server = started[-1]
    server.send(json.dumps(INITIALIZE).encode() + b"\n")
    assert server.reply()["id"] == 1
    before = server.peak_rss_kib()
    block = b" " * (1 << 20)
    for _ in range(200):
        server.send(block)
    server.send(b"\n" + json.dumps({"jsonrpc": "2.0", "id": 2, "method": "ping"}
                                    ).encode() + b"\n")
    assert server.reply()["error"]["code"] == -32600
    assert server.reply()["id"] == 2
    grown_mib = (server.peak_rss_kib() - before) / 1024
    # The line is discarded past the cap as it arrives: the peak grows by about the cap
    # (10 MiB) at most, never by the line's 200 MiB (a wide margin against noise).
    assert grown_mib < 48, grown_mib
    assert server.close() == 0


def test_the_line_splitter_holds_no_more_than_its_cap() -> None:
    lines = _Lines(5)
    assert lines.feed(b"abc") == [] and lines.feed(b"de\nfg") == [b"abcde"]
    assert lines.feed(b"hijk") == [] and lines.pending == b""  # past the cap: dropped
    assert lines.feed(b"lmn\n12345\n123456\n\n") == [None, b"12345", None, b""]
    assert lines.feed(b"xy") == [] and lines.end() == [b"xy"]
    assert default_max_line_bytes(Limits(max_message_bytes=1000)) == 10_000 + 65536


_PIECES = st.sampled_from(
    [b"{", b"}", b"[", b"]", b'"', b":", b",", b"\\", b"\\ud800", b"\\u0041", b'"id"',
     b'"jsonrpc"', b'"2.0"', b'"method"', b'"ping"', b'"params"', b"1", b"1.5", b"-0",
     b"true", b"null", b"NaN", b"\xff", b"\xed\xa0\x80", b"\xc3\xa9", b" ", b"\r", b"\x00"])


@given(st.binary(max_size=120) | st.lists(_PIECES, max_size=40).map(b"".join))
@example(b'{"jsonrpc": "2.0", "id": 1, "method": "ping"}')
def test_fuzz_any_line_is_a_message_or_a_json_rpc_error(line: bytes) -> None:
    try:
        message = read_jsonrpc_line(line, 72)
    except _LineError as refused:
        assert refused.code in (-32700, -32600)
        assert refused.request_id is None or type(refused.request_id) in (str, int)
        json.loads(_error_line(refused.code, refused.data, refused.request_id))
    else:
        assert message.jsonrpc == "2.0"
