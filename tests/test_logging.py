"""Logging as Python programs expect: the standard ``logging`` module, loggers ``cbcl.net``
(the agent, its links and servers), ``cbcl.cli`` and ``cbcl.bridges``; the package adds only
a ``NullHandler`` to ``cbcl``; handler failures at ERROR with their traceback; ``Agent(log=)``
still given each line; ``cbcl serve --log-format text|json`` (spec/negotiation.md §7).

Read through pytest's ``caplog``, through the formatters themselves, and from a real
``cbcl serve`` subprocess's standard output.

Uses internals: the formatters and ``LogTarget`` of ``cbcl.cli._common``."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import subprocess
import sys
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from key_files import private_key_pem, public_key_pem
from loop_guard import asyncio_records, no_stray_asyncio, run_guarded

from cbcl import (
    Agent,
    Intent,
    Keyword,
    Message,
    Symbol,
    TrustStore,
    canonical,
    read,
    sign_descriptor,
)
from cbcl.cli._common import (
    LOG_FLUSH_DELAY,
    LOG_FLUSH_LINES,
    JsonLogFormatter,
    LogTarget,
    TextLogFormatter,
)
from cbcl.net import Context

ROOT = Path(__file__).parent.parent
CONTRACT_NET = (ROOT / "cbcl" / "grammars" / "contract-net-v1.cbcl").read_bytes()
SERVER = "agent://test/server"
CLIENT = "agent://test/client"
#: A conversation id that, printed raw, would end a line and reorder the next.
HOSTILE = "job\u202e\n{\"event\": \"forged\"}\u2028"
CFP = read(b'(cfp :task (task :id "t-1" :action render) :deadline 1764503600000)')


@pytest.fixture
def store(tmp_path: Path) -> tuple[Any, TrustStore, bytes]:
    key = Ed25519PrivateKey.generate()
    trust = tmp_path / "trust"
    trust.mkdir()
    (trust / "demo.pub").write_bytes(public_key_pem(key.public_key()))
    (tmp_path / "demo.key").write_bytes(private_key_pem(key))
    signed = sign_descriptor(CONTRACT_NET, [("demo", key)])
    (tmp_path / "cn.signed.cbcl").write_bytes(signed)
    return key, TrustStore.from_directory(trust), signed


def _record(message: str = "serve[1]: the handler failed: ValueError: x", *,
            error: BaseException | None = None, **fields: Any) -> logging.LogRecord:
    record = logging.LogRecord("cbcl.net", logging.ERROR, __file__, 1, "%s", (message,),
                               None if error is None else (type(error), error,
                                                           error.__traceback__))
    record.cbcl = {"event": "handler-failed", **fields}
    return record


def _raised(text: str) -> BaseException:
    try:
        raise ValueError(text)
    except ValueError as exc:
        return exc



@pytest.fixture(autouse=True)
def _guard(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Nothing asyncio would only log may happen in any test here (tests/loop_guard.py)."""
    yield from no_stray_asyncio(caplog)

# --------------------------------------------------------------------------- the library


def test_the_package_adds_only_a_null_handler() -> None:
    code = ("import logging, cbcl, cbcl.net, cbcl.cli\n"
            "print([type(h).__name__ for h in logging.getLogger('cbcl').handlers],"
            " logging.getLogger().handlers, logging.getLogger('cbcl').level)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "['NullHandler'] [] 0"


PROGRAM = '''
import asyncio, logging, sys
from pathlib import Path
import cbcl
from cbcl import Agent, TrustStore, read

if sys.argv[1] == "configured":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")

key = cbcl.load_private_key(Path("demo.key").read_bytes())
store = TrustStore.from_directory("trust")
signed = Path("cn.signed.cbcl").read_bytes()

def failing(message, context):
    raise RuntimeError("the database is down")

async def main():
    server = Agent("agent://test/server", key=("demo", key), trust=store, handler=failing)
    client = Agent("agent://test/client", key=("demo", key))
    listening = await server.serve("127.0.0.1:0")
    host, port = listening.sockets[0].getsockname()[:2]
    link = await client.connect(f"{host}:{port}", peer="agent://test/server",
                                descriptor=signed)
    try:
        await link.conversation().send("CFP", read(
            b'(cfp :task (task :id "t-1" :action render) :deadline 1)'), timeout=30)
    except cbcl.net.PeerFailed as exc:
        print("client:", exc.reason)
    await client.close()
    await server.close()

asyncio.run(main())
'''


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["unconfigured", "configured"])
def test_a_program_sees_handler_failures_once_it_configures_logging(
        tmp_path: Path, store: Any, mode: str) -> None:
    """The library configures nothing: a program that does not configure logging prints
    nothing of the agent's (the failure still reaches the client); one that calls
    ``logging.basicConfig`` sees the failure at ERROR with its traceback."""
    (tmp_path / "program.py").write_text(PROGRAM)
    done = subprocess.run([sys.executable, "program.py", mode], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout == "client: handler-failed\n"
    if mode == "unconfigured":
        assert done.stderr == ""
        return
    lines = done.stderr.splitlines()
    at = lines.index("ERROR cbcl.net serve[1]: the handler failed: RuntimeError: the "
                     "database is down")
    assert lines[at + 1] == "Traceback (most recent call last):"
    assert "RuntimeError: the database is down" in lines[at + 2:]
    assert any(line.startswith("INFO cbcl.net serve[1]: answered") for line in lines)
    assert not any(": received " in line for line in lines)  # (DEBUG)


def test_records_carry_the_fields_and_log_gets_the_same_lines(
        store: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Each event is a ``cbcl.net`` record whose ``cbcl`` attribute holds its fields (peer
    values escaped); ``Agent(log=)`` is given the same line as the record's message."""
    key, trust, signed = store
    lines: list[str] = []
    caplog.set_level(logging.INFO, logger="cbcl")

    def bid(message: Message, context: Context) -> Message:
        return context.reply(Intent.PROPOSE, (
            Symbol("proposal"), Keyword("task-id"), "t-1", Keyword("bid"),
            (Symbol("bid"), Keyword("price"), 1, Keyword("currency"), Symbol("EUR"))))

    async def body() -> None:
        server = Agent(SERVER, key=("demo", key), trust=trust, handler=bid, log=lines.append)
        client = Agent(CLIENT, key=("demo", key), trust=trust)
        try:
            listening = await server.serve("127.0.0.1:0")
            host, port = listening.sockets[0].getsockname()[:2]
            link = await client.connect(f"{host}:{port}", peer=SERVER, descriptor=signed)
            reply = await link.conversation(HOSTILE).send(Intent.CFP, CFP, timeout=30)
            assert reply is not None
        finally:
            await client.close()
            await server.close()

    run_guarded(body)
    served = [r for r in caplog.records if r.getMessage().startswith("serve[")]
    assert [r.getMessage() for r in served] == [line for line in lines
                                                 if line.startswith("serve[")]
    assert not any(r.cbcl["event"] == "received" for r in served)  # type: ignore[attr-defined]
    (sent,) = [r for r in served if r.cbcl["event"] == "sent"]  # type: ignore[attr-defined]
    fields = sent.cbcl  # type: ignore[attr-defined]
    assert fields["conversation"] == "job\\u202e\\u000a{\\\"event\\\": \\\"forged\\\"}\\u2028"
    assert (fields["protocol"], fields["intent"], fields["link"]) == (
        "contract-net/v1", "PROPOSE", "serve[1]")
    assert fields["peer"] == "127.0.0.1" and fields["agent"] == CLIENT
    assert fields["in_reply_to"].startswith("m-")  # the CFP's id
    assert fields["timings"]["handler_ms"] >= 0
    # (where the line was logged: the caller of Link.log, as stacklevel=2 would say)
    assert (sent.filename, sent.funcName) == ("_agent.py", "_log_sent")
    for record in caplog.records:
        assert "\n" not in record.getMessage()
        assert not any(unicodedata.category(c) in ("Cc", "Cf", "Zl") for c in
                       record.getMessage())
    assert not asyncio_records(caplog)


# --------------------------------------------------------------------------- the formats


def test_the_text_format_indents_an_escaped_traceback() -> None:
    error = _raised("bad\nserve[9]: forged\u202e")
    line = TextLogFormatter().format(_record(error=error))
    first, *trace = line.split("\n")
    assert first == "serve[1]: the handler failed: ValueError: x"
    assert trace[0] == "    Traceback (most recent call last):"
    assert trace[-2:] == ["    ValueError: bad", "    serve[9]: forged\\u202e"]
    assert all(part.startswith("    ") for part in trace)
    # And a message that slipped through unescaped still comes out as one line.
    assert TextLogFormatter().format(_record("a\nb\u2028c")) == "a\\u000ab\\u2028c"


def test_the_json_format_is_one_object_per_line() -> None:
    error = _raised("bad\n\u2028day")
    line = JsonLogFormatter().format(_record(
        error=error, conversation="job\\u202e", reason="handler-failed",
        timings={"handler_ms": 1.5}))
    assert "\n" not in line and line.isascii()  # the encoder escapes the rest
    record = json.loads(line)
    assert list(record)[:5] == ["time", "level", "logger", "event", "message"]
    assert record["level"] == "ERROR" and record["logger"] == "cbcl.net"
    assert record["event"] == "handler-failed" and record["reason"] == "handler-failed"
    assert record["conversation"] == "job\\u202e"  # as the text line shows it
    assert record["timings"] == {"handler_ms": 1.5}
    assert record["time"].endswith("Z") and len(record["time"]) == 24
    assert record["traceback"].startswith("Traceback (most recent call last):")
    assert record["traceback"].endswith("ValueError: bad\n\u2028day")
    plain = json.loads(JsonLogFormatter().format(logging.LogRecord(
        "cbcl.cli", logging.INFO, __file__, 1, "serve: stopped", None, None)))
    assert (plain["event"], plain["message"]) == ("log", "serve: stopped")


def test_a_log_target_is_removed_when_closed() -> None:
    stream = io.StringIO()
    logger = logging.getLogger("cbcl")
    before = (list(logger.handlers), logger.level)
    target = LogTarget(stream, "json")
    logging.getLogger("cbcl.net").info("%s", "hello", extra={"cbcl": {"event": "x"}})
    target.close()
    logging.getLogger("cbcl.net").info("%s", "not written")
    assert (list(logger.handlers), logger.level) == before
    (written,) = stream.getvalue().splitlines()
    assert json.loads(written)["message"] == "hello"
    with pytest.raises(ValueError):
        LogTarget(stream, "xml")


# --------------------------------------------------------------------------- cbcl serve


@pytest.mark.slow
@pytest.mark.parametrize("log_format", ["text", "json"])
def test_serve_logs_in_either_format(tmp_path: Path, store: Any, log_format: str) -> None:
    """A real ``cbcl serve`` and ``cbcl send``, a hostile conversation id: every line of
    serve's standard output is one event — the text line, or a JSON object with the
    event's fields — nothing raw from the peer, nothing on its standard error."""
    cfp = tmp_path / "cfp.cbcl"
    cfp.write_text(
        f'(CBCL/1.0 (message-id "m-1") (sender {CLIENT}) (receiver {SERVER}) (intent CFP) '
        f"(protocol contract-net/v1) (conversation-id {canonical(HOSTILE)}) (body (cfp :task "
        '(task :id "t-1" :action render) :deadline 1764503600000)))', encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen(
        [sys.executable, "-m", "cbcl", "serve", "--listen", "127.0.0.1:0", "--trust",
         str(tmp_path / "trust"), "--name", SERVER, "--log-format", log_format],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert server.stdout is not None
        first = server.stdout.readline()
        text = json.loads(first)["message"] if log_format == "json" else first
        address = text.split("listening on ", 1)[1].split()[0]
        done = subprocess.run(
            [sys.executable, "-m", "cbcl", "send", "--connect", address, "--descriptor",
             "cn.signed.cbcl", "--key", "demo.key", str(cfp)], cwd=tmp_path,
            capture_output=True, text=True, timeout=60, env=env, check=False)
        assert done.returncode == 0, done.stderr
        server.terminate()
        out, err = server.communicate(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    assert err == ""
    lines = [first.rstrip("\n"), *out.splitlines()]
    for line in lines:
        assert not any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in line)
    if log_format == "text":
        assert all(line.startswith(("serve[", "serve:")) for line in lines), lines
        assert lines[-1] == "serve: stopped"
        return
    records = [json.loads(line) for line in lines]
    events = [record["event"] for record in records]
    assert events[0] == "listening" and events[-1] == "stopped"
    for event in ("asked", "offer", "accepted", "established", "sent"):
        assert event in events, events
    assert "received" not in events  # (DEBUG: one line per message handled at INFO)
    (sent,) = [r for r in records if r["event"] == "sent"]
    assert sent["conversation"] == \
        "job\\u202e\\u000a{\\\"event\\\": \\\"forged\\\"}\\u2028"
    assert (sent["protocol"], sent["intent"], sent["in_reply_to"]) == (
        "contract-net/v1", "PROPOSE", "m-1")
    assert "handler_ms" in sent["timings"]
    accepted = next(r for r in records if r["event"] == "accepted")
    assert "work_ms" in accepted["timings"]
    assert not any(r["event"] == "forged" for r in records)


def test_log_level_leaves_serves_own_lines_at_info() -> None:
    """``--log-level warning`` drops the per-message INFO lines but never serve's own
    (``serve: listening on …``: where it listens must be said); ``debug`` lets the
    received lines through; closing puts every level back."""
    net, cli = logging.getLogger("cbcl.net"), logging.getLogger("cbcl.cli")
    before = (logging.getLogger("cbcl").level, cli.level)
    for level, expected in ((logging.WARNING, ["serve: listening", "net warning"]),
                            (logging.DEBUG, ["serve: listening", "net info", "net debug",
                                             "net warning"])):
        out = io.StringIO()
        target = LogTarget(out, "text", level)
        try:
            cli.info("serve: listening")
            net.info("net info")
            net.debug("net debug")
            net.warning("net warning")
        finally:
            target.close()
        assert out.getvalue().splitlines() == expected
    assert (logging.getLogger("cbcl").level, cli.level) == before


def test_serves_per_message_lines_are_written_together_in_order() -> None:
    """``cbcl.net`` lines below WARNING wait (on the running loop) for the lines after
    them, at most LOG_FLUSH_DELAY: a warning, a ``cbcl.cli`` line or the timer writes what
    is held, in order, in one write; outside a loop every line is written at once."""
    writes: list[str] = []

    class Stream(io.StringIO):
        def write(self, text: str) -> int:
            writes.append(text)
            return super().write(text)

    net, cli = logging.getLogger("cbcl.net"), logging.getLogger("cbcl.cli")
    out = Stream()
    target = LogTarget(out, "text", logging.INFO)

    async def scenario() -> None:
        net.info("one")
        net.info("two")
        assert writes == []  # held
        net.warning("three")
        assert writes == ["one\ntwo\nthree\n"]
        net.info("four")
        cli.info("serve: stopping")  # serve's own line: at once, after what is held
        assert writes[-1] == "four\nserve: stopping\n"
        net.info("five")
        # (a later timer: it fires after the handler's, whatever the load)
        await asyncio.sleep(LOG_FLUSH_DELAY * 4)
        assert writes[-1] == "five\n"
        for n in range(LOG_FLUSH_LINES):
            net.info(f"line {n}")
        assert writes[-1].count("\n") == LOG_FLUSH_LINES  # at the bound: written

    try:
        asyncio.run(scenario())
        net.info("six")  # no loop running: at once
        assert writes[-1] == "six\n"
    finally:
        target.close()
    assert out.getvalue().splitlines()[:5] == ["one", "two", "three", "four",
                                               "serve: stopping"]
