"""``cbcl serve`` and ``cbcl negotiate`` across two OS processes on loopback, and the demo.

The commands run as ``python -m cbcl.cli._negotiate`` (the ``cbcl`` command line with
these two commands, whether or not they are wired into ``cbcl.cli._main`` yet).

Tests internals too: the commands' helpers (``cbcl.cli._negotiate``) and address parsing."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from processes import stop_process

import cbcl
from cbcl.cli import build_parser, main
from cbcl.cli._negotiate import tamper_signature
from cbcl.net._transport import parse_address

ROOT = Path(__file__).parent.parent
CLI = [sys.executable, "-m", "cbcl"]


def test_addresses() -> None:
    assert parse_address("127.0.0.1:7000") == ("tcp", ("127.0.0.1", 7000))
    assert parse_address("[::1]:7000") == ("tcp", ("::1", 7000))
    assert parse_address("unix:/tmp/x.sock") == ("unix", "/tmp/x.sock")
    for bad in ("nowhere", "host:", ":80", "host:99999", "unix:"):
        with pytest.raises(ValueError):
            parse_address(bad)


def test_both_commands_are_registered() -> None:
    parser = build_parser()
    args = parser.parse_args(["negotiate", "--demo"])
    assert args.demo and args.command == "negotiate"
    args = parser.parse_args(["serve", "--listen", "127.0.0.1:0", "--trust", "t"])
    assert args.listen == "127.0.0.1:0"


@pytest.mark.parametrize("argv", [
    ["negotiate"],
    ["negotiate", "--tamper"],
    ["negotiate", "--demo", "--connect", "127.0.0.1:1"],
    ["negotiate", "--connect", "nowhere", "--descriptor", "d", "--key", "k"],
])
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2
    assert capsys.readouterr().err.startswith("usage: cbcl negotiate: ")


def test_tamper_keeps_the_signature_well_formed() -> None:
    document = b'(signed-descriptor (payload "x") (signatures (sig "demo" "AAAA")))'
    assert tamper_signature(document) == document.replace(b'"AAAA"', b'"BAAA"')


def test_nothing_listening_is_one_line(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    keys = _keys(tmp_path)
    code = main(["negotiate", "--connect", "127.0.0.1:1", "--descriptor",
                 str(keys["signed"]), "--key", str(keys["key"])])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("connection: cannot connect to 127.0.0.1:1")
    assert err.count("\n") == 1


def _keys(tmp_path: Path) -> dict[str, Path]:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from key_files import private_key_pem, public_key_pem

    from cbcl import sign_descriptor

    key = Ed25519PrivateKey.generate()
    trust = tmp_path / "trust"
    trust.mkdir()
    (trust / "demo.pub").write_bytes(public_key_pem(key.public_key()))
    (tmp_path / "demo.key").write_bytes(private_key_pem(key))
    payload = (ROOT / "descriptors" / "contract-net-v1.cbcl").read_bytes()
    (tmp_path / "signed.cbcl").write_bytes(sign_descriptor(payload, [("demo", key)]))
    return {"trust": trust, "key": tmp_path / "demo.key", "signed": tmp_path / "signed.cbcl"}


class Server:
    """``cbcl serve`` in a subprocess; always terminated and waited for."""

    def __init__(self, tmp_path: Path, listen: str = "127.0.0.1:0") -> None:
        keys = _keys(tmp_path)
        self.keys = keys
        env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen(
            [*CLI, "serve", "--listen", listen, "--trust", str(keys["trust"]),
             "--state", str(tmp_path / "state")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        assert self.process.stdout is not None and self.process.stderr is not None
        first = self.process.stdout.readline()
        assert first.startswith("serve: listening on "), first + self.process.stderr.read()
        self.address = listen if listen.startswith("unix:") else \
            first.split(" on ", 1)[1].split(" as ")[0]

    def negotiate(self, *extra: str) -> list[str]:
        return [*CLI, "negotiate", "--connect", self.address, "--descriptor",
                str(self.keys["signed"]), "--key", str(self.keys["key"]), *extra]

    def stop(self) -> None:
        stop_process(self.process, timeout=10)


@pytest.mark.slow
@pytest.mark.parametrize("encoding", ["text", "binary"])
def test_two_processes_on_loopback(tmp_path: Path, encoding: str) -> None:
    server = Server(tmp_path)
    try:
        done = subprocess.run(server.negotiate("--encoding", encoding), capture_output=True,
                              text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        out = done.stdout
        assert "INFORM   (unsupported" in out and "ACCEPT   (accepted" in out
        assert f"handshake done: contract-net/v1 in {encoding}" in out
        assert "awarded -> done" in out
    finally:
        server.stop()
    assert server.process.returncode is not None


@pytest.mark.slow
def test_unix_socket(tmp_path: Path) -> None:
    server = Server(tmp_path, listen=f"unix:{tmp_path / 'cbcl.sock'}")
    try:
        done = subprocess.run(server.negotiate(), capture_output=True, text=True, timeout=60,
                              check=False)
        assert done.returncode == 0, done.stderr
        assert "handshake done: contract-net/v1 in binary" in done.stdout
    finally:
        server.stop()
    assert not (tmp_path / "cbcl.sock").exists()


@pytest.mark.slow
def test_server_killed_mid_conversation(tmp_path: Path) -> None:
    server = Server(tmp_path)
    client = subprocess.Popen(server.negotiate("--pace", "1500"), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert client.stdout is not None
        deadline = time.monotonic() + 30
        for line in client.stdout:
            if "PROPOSE  (proposal" in line or time.monotonic() > deadline:
                break
        server.process.kill()  # the responder dies while the manager thinks it over
        server.process.wait(timeout=10)
        _out, err = client.communicate(timeout=30)
    finally:
        if client.poll() is None:  # pragma: no cover
            client.kill()
            client.wait()
        server.stop()
    assert client.returncode not in (0, None)
    assert "Traceback" not in err
    assert err.count("\n") == 1, err
    assert err.startswith(("session: the peer closed the connection",
                           "connection: the peer is gone")), err
    assert "contract-net/v1" in err


@pytest.mark.slow
def test_demo_exits_0_and_leaves_nothing_behind() -> None:
    started = time.monotonic()
    done = subprocess.run([*CLI, "negotiate", "--demo"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for expected in ("unsupported", "offer", "verified", "compiled", "accepted",
                     "in text", "in binary", "handshake latency on loopback: cold"):
        assert expected in out, expected
    assert time.monotonic() - started < 30
    pid = int(out.split("(pid ", 1)[1].split(")", 1)[0])
    assert not _alive(pid)


@pytest.mark.slow
def test_demo_tamper_exits_6() -> None:
    done = subprocess.run([*CLI, "negotiate", "--demo", "--tamper"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 6, done.stdout + done.stderr
    assert "REJECT   (rejected: bad-signature)" in done.stdout
    assert "handshake done" not in done.stdout
    pid = int(done.stdout.split("(pid ", 1)[1].split(")", 1)[0])
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is gone once it is not our child's child.
    with open(f"/proc/{pid}/status") as status:
        return "zombie" not in status.read()


def test_in_process_demo_runs_its_own_loop() -> None:
    # The command line must not be run inside a running loop; this one is not.
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()


@pytest.mark.slow
def test_negotiate_with_trust_refuses_an_unsigned_server_confirmation(tmp_path: Path) -> None:
    """With --trust, A requires B's Finished signed by a trusted key: a server started
    without --key cannot complete the handshake (the peer is not who A trusts)."""
    from cbcl import sign_descriptor
    from cbcl.cli._negotiate import _demo_keys, run_initiator

    key, trust, _server_key, client_trust = _demo_keys(tmp_path)
    payload = (Path(__file__).parent.parent / "cbcl" / "grammars" / "contract-net-v1.cbcl"
               ).read_bytes()
    document = sign_descriptor(payload, [("demo", key)])
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), PYTHONUNBUFFERED="1")
    server = subprocess.Popen([sys.executable, "-m", "cbcl", "serve", "--listen",
                               "127.0.0.1:0", "--trust", str(trust)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert server.stdout is not None
        first = server.stdout.readline().decode()
        address = first.rsplit(" on ", 1)[-1].split(" as ")[0]
        with pytest.raises(cbcl.CBCLError) as info:
            asyncio.run(run_initiator(address, document, ("demo", key), encodings=("text",),
                                      out=lambda _line: None, trust=client_trust))
        assert info.value.exit_code == 6
    finally:
        server.terminate()
        server.communicate(timeout=10)
