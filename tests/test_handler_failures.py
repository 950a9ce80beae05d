"""Handlers that fail, as a peer and an operator see it (spec/negotiation.md §6.3).

A handler that raises (anything, SystemExit included), overruns, returns something that is
not a message or a reply the protocol refuses is answered with a NOT-UNDERSTOOD naming why,
in the message's conversation, at once: the client's ``send`` raises :class:`PeerFailed`
with the code, ``cbcl send`` exits 8. Handlers run beside the link: one conversation in
order, ``handler_concurrency`` conversations at once, plain functions in a bounded pool of
threads whose stuck members are counted, each call cut off at its deadline; a link that
ends stops its handlers, and shutdown gives them a grace period.

In process (an :class:`Agent` serving on loopback, and a client agent) and across two
processes (a real ``cbcl serve --handler`` and ``cbcl send`` / a client agent). Every
asyncio run is guarded (tests/loop_guard.py): nothing asyncio would only log may happen.

Uses internals: ``cbcl.net._handlers`` (HandlerThreads, run_handler); what the server took
is its agent's ``messages_received``."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from key_files import private_key_pem, public_key_pem
from loop_guard import asyncio_records, no_stray_asyncio, run_guarded
from processes import stop_process

from cbcl import Agent, Intent, Keyword, Message, Symbol, TrustStore, read, sign_descriptor
from cbcl.net import Context, HandlerLimits, Link, PeerFailed, on_loop
from cbcl.net._handlers import HandlerThreads, run_handler
from cbcl.session._reasons import (
    FAILURE_CODES,
    FAILURES,
    UNNAMED_FAILURE,
    failure_body,
    failure_exit,
    read_failure,
)

ROOT = Path(__file__).parent.parent
CONTRACT_NET = (ROOT / "cbcl" / "grammars" / "contract-net-v1.cbcl").read_bytes()
TASKS = (ROOT / "descriptors" / "task-assignment-v1.cbcl").read_bytes()
SERVER = "agent://test/server"
CLIENT = "agent://test/client"
BID = (Symbol("bid"), Keyword("price"), read(b"7.25"), Keyword("currency"), Symbol("EUR"))


class Keys:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.key = Ed25519PrivateKey.generate()
        self.trust = directory / "trust"
        self.trust.mkdir()
        (self.trust / "demo.pub").write_bytes(public_key_pem(self.key.public_key()))
        (directory / "demo.key").write_bytes(private_key_pem(self.key))
        self.store = TrustStore.from_directory(self.trust)
        self.signed = sign_descriptor(CONTRACT_NET, [("demo", self.key)])
        self.signed_tasks = sign_descriptor(TASKS, [("demo", self.key)])
        (directory / "cn.signed.cbcl").write_bytes(self.signed)
        self.pair = ("demo", self.key)


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    return Keys(tmp_path)


def cfp(task: str) -> Any:
    return read(f'(cfp :task (task :id "{task}" :action render) :deadline 1764503600000)'
                .encode())


def task_of(message: Message) -> str:
    body: Any = message.body
    task = dict(zip(body[2][1::2], body[2][2::2], strict=True))
    return str(task[Keyword("id")])


class Custom(BaseException):
    """A BaseException of the handler's own."""


async def _raise_async(error: BaseException) -> None:
    await asyncio.sleep(0)
    raise error


def raising(error: BaseException) -> Callable[[Message, Context], Any]:
    def handler(message: Message, context: Context) -> None:
        raise error
    return handler


def proposal(message: Message, context: Context) -> Message:
    return context.reply(Intent.PROPOSE, (Symbol("proposal"), Keyword("task-id"),
                                          task_of(message), Keyword("bid"), BID))


#: task id -> what the in-process handler does.
BEHAVIOURS: dict[str, Callable[[Message, Context], Any]] = {
    "raise": raising(ValueError("bad\nday")),
    "exit": raising(SystemExit(3)),
    "interrupt": raising(KeyboardInterrupt()),
    "custom": raising(Custom("mine")),
    "async-exit": lambda m, c: _raise_async(SystemExit(4)),
    "async-raise": lambda m, c: _raise_async(LookupError("gone")),
    "not-a-message": lambda m, c: "PROPOSE",
    "wrong": lambda m, c: c.reply(Intent.REFUSE, (Symbol("refuse"), Keyword("task-id"), "t",
                                                  Keyword("reason"), Symbol("bored"))),
    "elsewhere": lambda m, c: Message(message_id="x-1", sender=SERVER, receiver="agent://x",
                                      intent=Intent.PROPOSE, protocol="contract-net/v1",
                                      conversation_id=m.conversation_id,
                                      in_reply_to=m.message_id, body=(Symbol("proposal"),)),
    "sleep": lambda m, c: time.sleep(1.5),
    "ok": proposal,
}


def dispatch(message: Message, context: Context) -> Any:
    return BEHAVIOURS[task_of(message).split(":")[0]](message, context)


@contextlib.asynccontextmanager
async def linked(keys: Keys, server: Agent, descriptor: bytes | None = None,
                 **client_options: Any) -> AsyncIterator[Link]:
    """``server`` on loopback and a client's established link to it; both closed after."""
    client = Agent(CLIENT, key=keys.pair, trust=keys.store, **client_options)
    try:
        listening = await server.serve("127.0.0.1:0")
        host, port = listening.sockets[0].getsockname()[:2]
        yield await client.connect(f"{host}:{port}", peer=SERVER,
                                   descriptor=descriptor or keys.signed)
    finally:
        await client.close()
        await server.close(grace=0.5)


def serving(keys: Keys, lines: list[str] | None = None, **options: Any) -> Agent:
    options.setdefault("handler", dispatch)
    return Agent(SERVER, key=keys.pair, trust=keys.store,
                 log=None if lines is None else lines.append, **options)


async def until(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            try:  # (which condition: the line that gave it)
                source = inspect.getsource(check).strip()
            except (OSError, TypeError):
                source = repr(check)
            raise AssertionError(f"the condition never held: {source}")
        await asyncio.sleep(0.005)



@pytest.fixture(autouse=True)
def _guard(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Nothing asyncio would only log may happen in any test here (tests/loop_guard.py)."""
    yield from no_stray_asyncio(caplog)

# --------------------------------------------------------------------------- in process


EXPECTED = [
    ("raise", "handler-failed", ""), ("exit", "handler-failed", ""),
    ("interrupt", "handler-failed", ""), ("custom", "handler-failed", ""),
    ("async-exit", "handler-failed", ""), ("async-raise", "handler-failed", ""),
    ("not-a-message", "handler-failed", ""), ("wrong", "invalid-reply", "body"),
    ("elsewhere", "invalid-reply", "protocol"),
    ("sleep", "handler-timeout", "no answer within 0.3 s"),
]


@pytest.mark.parametrize(("task", "code", "detail"), EXPECTED, ids=[e[0] for e in EXPECTED])
def test_each_failure_is_answered_in_its_conversation_at_once(
        keys: Keys, caplog: pytest.LogCaptureFixture, task: str, code: str,
        detail: str) -> None:
    caplog.set_level(logging.DEBUG, logger="cbcl")

    async def body() -> None:
        async with linked(keys, serving(keys, handler_timeout=0.3)) as link:
            conversation = link.conversation()
            started = time.monotonic()
            with pytest.raises(PeerFailed) as caught:
                await conversation.send(Intent.CFP, cfp(task), timeout=60)
            waited = time.monotonic() - started
            failure = caught.value
            assert (failure.reason, failure.detail, failure.exit_code) == (code, detail, 8)
            reply = failure.reply
            assert reply.intent is Intent.NOT_UNDERSTOOD
            assert reply.conversation_id == conversation.id
            assert reply.in_reply_to is not None and reply.in_reply_to.startswith("m-")
            # At once: the client's own wait was 60 s; the handler's deadline is 0.3 s.
            assert waited < 30
            # The conversation is where it was (a NOT-UNDERSTOOD changes no state), and the
            # link goes on: the next conversation is answered.
            assert link.session.tracker is not None
            thread = link.session.tracker.get(conversation.id, SERVER)
            assert thread is not None and str(thread.state) == "called"
            again = await link.conversation().send(Intent.CFP, cfp("ok"), timeout=60)
            assert again is not None and again.intent is Intent.PROPOSE

    run_guarded(body)
    errors = [r for r in caplog.records if r.name == "cbcl.net" and r.levelno == logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    record = errors[0]
    fields = record.cbcl  # type: ignore[attr-defined]
    assert fields["event"] == code and fields["reason"] == code
    assert fields["intent"] == "CFP" and fields["conversation"].startswith("c-")
    assert record.getMessage().count("\n") == 0
    if task in ("raise", "async-raise"):  # an exception: its traceback with the record
        assert record.exc_info is not None and record.exc_info[0] in (ValueError, LookupError)
    else:
        assert record.exc_info is None  # a BaseException's traceback is at DEBUG only
    if task in ("exit", "interrupt", "custom", "async-exit"):
        assert "contained, the agent goes on" in record.getMessage()
        (debug,) = [r for r in caplog.records if r.name == "cbcl.net"
                    and r.levelno == logging.DEBUG and r.exc_info is not None]
        assert debug.exc_info is not None
        assert debug.exc_info[0] in (SystemExit, KeyboardInterrupt, Custom)
    sent = [getattr(r, "cbcl", {}) for r in caplog.records]
    assert [f["reason"] for f in sent if f.get("event") == "failure-sent"] == [code]
    assert not asyncio_records(caplog)


def test_the_exception_text_reaches_the_peer_only_when_exposed(keys: Keys) -> None:
    async def body(expose: bool) -> tuple[str, str]:
        async with linked(keys, serving(keys, expose_errors=expose)) as link:
            with pytest.raises(PeerFailed) as first:
                await link.conversation().send(Intent.CFP, cfp("raise"), timeout=60)
            with pytest.raises(PeerFailed) as second:
                await link.conversation().send(Intent.CFP, cfp("wrong"), timeout=60)
        return first.value.detail, second.value.detail

    assert run_guarded(lambda: body(False)) == ("", "body")
    raised, refused = run_guarded(lambda: body(True))
    assert raised == "ValueError: bad\\u000aday"  # escaped: one line, even in the reply
    assert refused.startswith("body 1:") and "bored" in refused


def test_a_failure_for_a_message_that_ended_its_conversation_is_not_sent(
        keys: Keys) -> None:
    lines: list[str] = []

    def contractor(message: Message, context: Context) -> Message | None:
        if message.intent is Intent.CFP:
            return proposal(message, context)
        raise ValueError("nobody waits for this one")

    async def body() -> None:
        async with linked(keys, serving(keys, lines, handler=contractor)) as link:
            conversation = link.conversation()
            assert await conversation.send(Intent.CFP, cfp("t-1"), timeout=60) is not None
            # REJECT ends the conversation (rejected): the handler's failure has no one
            # to go to, and is only logged.
            assert await conversation.send(Intent.REJECT, read(
                b'(reject-proposal :task-id "t-1")'), timeout=60) is None
            await until(lambda: any("the handler failed" in line for line in lines))
            assert not link.closed.done()

    run_guarded(body)
    assert not any("with NOT-UNDERSTOOD" in line for line in lines), lines


def test_a_handler_whose_client_has_gone_is_cancelled(keys: Keys) -> None:
    lines: list[str] = []
    events: list[str] = []

    async def held(message: Message, context: Context) -> None:
        events.append("began")
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            events.append("cancelled")
            raise

    async def body() -> None:
        server = serving(keys, lines, handler=held, handler_timeout=3600)
        async with linked(keys, server) as link:
            await link.conversation().send(Intent.CFP, cfp("t-1"), expect_reply=False)
            await until(lambda: events == ["began"])
            await link.close()  # the client goes away mid-call
            await until(lambda: events == ["began", "cancelled"])

    run_guarded(body)
    assert any("1 handler(s) stopped: the link ended" in line for line in lines), lines


def test_a_thread_whose_client_has_gone_has_its_result_dropped(keys: Keys) -> None:
    lines: list[str] = []
    began, release = threading.Event(), threading.Event()
    returned: list[str] = []

    def stuck(message: Message, context: Context) -> Message:
        began.set()
        release.wait(30)
        returned.append("returned")
        return proposal(message, context)

    async def body() -> None:
        server = serving(keys, lines, handler=stuck, handler_timeout=3600)
        async with linked(keys, server) as link:
            await link.conversation().send(Intent.CFP, cfp("t-1"), expect_reply=False)
            # (the handler has begun: a call whose thread has not begun it when the link
            # ends is dropped unrun, which a loaded machine made this test see)
            await until(lambda: began.is_set() and server.threads.busy == 1)
            await link.close()
            await until(lambda: any("stopped: the link ended" in line for line in lines))
            release.set()
            await until(lambda: returned == ["returned"] and server.threads.busy == 0)

    run_guarded(body)
    assert not any(line.endswith("PROPOSE") for line in lines), lines  # dropped, not sent


def test_a_slow_sync_handler_holds_up_no_other_conversation(keys: Keys) -> None:
    """Handlers run beside the link: while a plain handler sleeps in its thread, another
    conversation on the same link is answered (its reply comes first)."""
    release = threading.Event()

    def handler(message: Message, context: Context) -> Message:
        if task_of(message) == "slow":
            release.wait(30)
        return proposal(message, context)

    async def body() -> list[str]:
        order: list[str] = []
        async with linked(keys, serving(keys, handler=handler)) as link:
            async def ask(task: str) -> None:
                reply = await link.conversation().send(Intent.CFP, cfp(task), timeout=60)
                assert reply is not None
                order.append(task)
            slow = asyncio.ensure_future(ask("slow"))
            await ask("quick")  # answered while the slow one still sleeps
            release.set()
            await slow
        return order

    assert run_guarded(body) == ["quick", "slow"]


# --------------------------------------------------------------------------- the table


def test_the_failure_table_is_the_spec() -> None:
    """spec/negotiation.md §6.3's table of failure codes and exit codes is FAILURES."""
    spec = (ROOT / "spec" / "negotiation.md").read_text(encoding="utf-8")
    section = spec[spec.index("### 6.3 Handlers"):spec.index("## 7. Command line")]
    rows = re.findall(r"^\| `([a-z-]+)` \|.*\| (\d+)[^|]*\|$", section, flags=re.MULTILINE)
    assert dict((code, int(exit_code)) for code, exit_code in rows) == \
        {row.code: row.exit_code for row in FAILURES}
    assert UNNAMED_FAILURE not in FAILURE_CODES and f"`{UNNAMED_FAILURE}`" in section


@given(code=st.sampled_from(sorted(FAILURE_CODES)), detail=st.text(max_size=300))
def test_a_failure_body_reads_back(code: str, detail: str) -> None:
    assert read_failure(failure_body(code, detail)) == (code, detail)


@given(body=st.one_of(st.text(max_size=100), st.none(), st.integers(), st.binary()))
def test_any_body_reads_as_some_failure(body: object) -> None:
    code, detail = read_failure(body)
    assert re.fullmatch(r"[a-z][a-z0-9-]{0,63}", code)
    assert isinstance(detail, str)
    assert failure_exit(code) in (1, 8)
    with pytest.raises(ValueError):
        failure_body("made-up")


# --------------------------------------------------------------------------- bounds


def test_handler_threads_n_run_and_one_more_times_out_without_running() -> None:
    """N stuck plain handlers take the N threads and keep them; call N+1 finds none free,
    waits until its deadline and is a timeout that never ran; no thread more is started.
    When a stuck one returns, its thread serves the next call."""
    threads = HandlerThreads(3)
    gate = threading.Event()
    ran: list[int] = []

    def stuck(number: int) -> int:
        ran.append(number)
        gate.wait(30)
        return number

    async def body() -> None:
        calls = [asyncio.ensure_future(run_handler(stuck, n, threads=threads, timeout=0.2))
                 for n in range(3)]
        outcomes = await asyncio.gather(*calls)  # all three overrun their deadline
        assert [o.kind for o in outcomes] == ["timeout"] * 3
        assert sorted(ran) == [0, 1, 2] and threads.busy == 3  # still running: counted
        late = await run_handler(stuck, 3, threads=threads, timeout=0.2)
        assert (late.kind, late.value) == ("timeout", "thread")
        assert sorted(ran) == [0, 1, 2] and threads.live == 3
        gate.set()
        await until(lambda: threads.busy == 0)
        done = await run_handler(stuck, 4, threads=threads, timeout=5)
        assert (done.kind, done.value) == ("answer", 4) and threads.live == 3
        # Closed, the pool takes no more calls and its threads end.
        threads.close()
        after = await run_handler(stuck, 5, threads=threads, timeout=5)
        assert after.kind == "stopped" and 5 not in ran
        await until(lambda: threads.live == 0)

    run_guarded(body)


def test_idle_threads_end_after_their_keep_alive() -> None:
    threads = HandlerThreads(2, keep_alive=0.05)

    async def body() -> None:
        both = [run_handler(time.sleep, 0.1, threads=threads, timeout=5) for _ in range(2)]
        assert [o.kind for o in await asyncio.gather(*both)] == ["answer", "answer"]
        assert threads.live == 2
        await until(lambda: threads.live == 0)  # idle: ended
        again = await run_handler(lambda: "again", threads=threads, timeout=5)
        assert again.value == "again"  # a new thread, as needed

    run_guarded(body)
    threads.close()


def test_a_waiting_call_takes_the_first_thread_given_back() -> None:
    threads = HandlerThreads(1)
    gate = threading.Event()

    async def body() -> None:
        first = asyncio.ensure_future(run_handler(gate.wait, 30, threads=threads, timeout=30))
        await until(lambda: threads.busy == 1)
        second = asyncio.ensure_future(run_handler(lambda: "second", threads=threads,
                                                   timeout=30))
        await asyncio.sleep(0.05)
        assert not second.done()
        gate.set()
        assert (await first).value is True
        assert (await second).value == "second"

    run_guarded(body)
    threads.close()


def test_plain_handlers_run_in_threads_unless_marked_on_loop() -> None:
    threads = HandlerThreads(2)

    def where() -> int:
        return threading.get_ident()

    def exits() -> None:
        raise SystemExit(5)

    async def body() -> None:
        here = threading.get_ident()
        assert (await run_handler(where, threads=threads, timeout=5)).value != here
        assert (await run_handler(on_loop(where), threads=threads, timeout=5)).value == here
        contained = await run_handler(on_loop(exits), threads=threads, timeout=5)
        assert contained.kind == "raised" and type(contained.value) is SystemExit
        assert on_loop(on_loop(where)).handler is where
        with pytest.raises(TypeError):
            on_loop(3)  # type: ignore[arg-type]

    run_guarded(body)
    threads.close()


@pytest.mark.parametrize("error", [SystemExit(2), KeyboardInterrupt(), Custom("x"),
                                   GeneratorExit(), asyncio.CancelledError()])
def test_every_base_exception_is_an_outcome(error: BaseException) -> None:
    threads = HandlerThreads(1)

    def plain() -> None:
        raise error

    async def coroutine() -> None:
        raise error

    async def body() -> None:
        for handler in (plain, coroutine):
            outcome = await run_handler(handler, threads=threads, timeout=5)
            assert outcome.kind == "raised"
            assert type(outcome.value) is type(error)

    run_guarded(body)
    threads.close()


@pytest.mark.parametrize("extra", [0, 1])
def test_handler_concurrency_n_at_once_and_one_more_waits(keys: Keys, extra: int) -> None:
    """``handler_concurrency`` N: N conversations' handlers run at once; conversation
    N + 1's waits for a slot (and runs when one is given back)."""
    bound = 3
    lines: list[str] = []
    gates: dict[str, asyncio.Event] = {}

    async def held(message: Message, context: Context) -> Message:
        gates[task_of(message)] = gate = asyncio.Event()
        await gate.wait()
        return proposal(message, context)

    async def body() -> None:
        server = serving(keys, lines, handler=held,
                         handler_limits=HandlerLimits(handler_concurrency=bound))
        async with linked(keys, server) as link:
            calls = [asyncio.ensure_future(link.conversation().send(
                Intent.CFP, cfp(f"t-{n}"), timeout=60)) for n in range(bound + extra)]
            await until(lambda: server.messages_received == bound + extra)
            await until(lambda: len(gates) == bound)
            await asyncio.sleep(0.2)
            assert len(gates) == bound  # never more than N
            for gate in list(gates.values()):
                gate.set()
            await until(lambda: len(gates) == bound + extra)
            for gate in gates.values():
                gate.set()
            assert all(reply is not None for reply in await asyncio.gather(*calls))

    run_guarded(body)


@pytest.mark.parametrize("extra", [0, 1])
def test_handler_backlog_n_taken_and_one_more_waits_in_the_stream(
        keys: Keys, extra: int) -> None:
    """``handler_backlog`` N: with every handler held, the link takes N messages and
    reads no further; message N + 1 is taken once one is done."""
    backlog = 4
    lines: list[str] = []
    gates: list[asyncio.Event] = []

    async def held(message: Message, context: Context) -> None:
        gate = asyncio.Event()
        gates.append(gate)
        await gate.wait()

    async def body() -> None:
        def received() -> int:
            return server.messages_received

        server = serving(keys, lines, handler=held, handler_limits=HandlerLimits(
            handler_backlog=backlog, handler_concurrency=1))
        async with linked(keys, server) as link:
            for n in range(backlog + extra):
                await link.conversation().send(Intent.CFP, cfp(f"t-{n}"), expect_reply=False)
            await until(lambda: received() == backlog)
            await asyncio.sleep(0.2)
            assert received() == backlog and len(gates) == 1  # concurrency 1: one runs
            gates[0].set()
            await until(lambda: received() == backlog + extra and len(gates) == 2)
            for _ in range(backlog + extra):
                for gate in gates:
                    gate.set()
                await asyncio.sleep(0.01)

    run_guarded(body)


def test_an_agent_closes_a_link_whose_backlog_is_full(keys: Keys) -> None:
    """The pump of a link whose backlog is full waits for room; closing the agent answers
    the held handlers ``shutdown``, then the messages that waited in the stream, and
    nothing is left pending."""
    lines: list[str] = []

    async def held(message: Message, context: Context) -> None:
        await asyncio.sleep(3600)

    async def body() -> None:
        server = serving(keys, lines, handler=held, handler_timeout=3600,
                         handler_limits=HandlerLimits(handler_backlog=2,
                                                      handler_concurrency=1))
        client = Agent(CLIENT, key=keys.pair, trust=keys.store)
        try:
            listening = await server.serve("127.0.0.1:0")
            host, port = listening.sockets[0].getsockname()[:2]
            link = await client.connect(f"{host}:{port}", peer=SERVER,
                                        descriptor=keys.signed)
            for n in range(4):
                await link.conversation().send(Intent.CFP, cfp(f"t-{n}"), expect_reply=False)
            await until(lambda: server.messages_received == 2)
            async with asyncio.timeout(30):
                await server.close(grace=0.1)
            # The two held ones, then any the freed backlog let in before the link closed.
            answered = sum("NOT-UNDERSTOOD shutdown" in line for line in lines)
            assert 2 <= answered <= server.messages_received, lines
        finally:
            await client.close()

    run_guarded(body)


def test_handler_limits_are_checked() -> None:
    bad: dict[str, Any]
    for bad in ({"handler_concurrency": 0}, {"handler_backlog": 0},
                {"handler_threads": 4097}, {"shutdown_grace": 0.0},
                {"shutdown_grace": float("nan")}, {"handler_threads": True}):
        with pytest.raises(ValueError):
            HandlerLimits(**bad)
    with pytest.raises(TypeError):
        Agent(SERVER, handler_limits=3)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- shutdown


def test_close_lets_handlers_finish_within_the_grace_then_answers_shutdown(
        keys: Keys, caplog: pytest.LogCaptureFixture) -> None:
    async def finishing(message: Message, context: Context) -> Message:
        await asyncio.sleep(0.3 if task_of(message) == "quick" else 3600)
        return proposal(message, context)

    async def body() -> None:
        server = serving(keys, handler=finishing, handler_timeout=3600)
        client = Agent(CLIENT, key=keys.pair, trust=keys.store)
        try:
            listening = await server.serve("127.0.0.1:0")
            host, port = listening.sockets[0].getsockname()[:2]
            link = await client.connect(f"{host}:{port}", peer=SERVER,
                                        descriptor=keys.signed)
            quick = asyncio.ensure_future(link.conversation().send(
                Intent.CFP, cfp("quick"), timeout=60))
            stuck = asyncio.ensure_future(link.conversation().send(
                Intent.CFP, cfp("stuck"), timeout=60))
            await until(lambda: sum(len(one._lane_tasks) for one in server._links) == 2)
            await server.close(grace=1.0)
            reply = await quick  # finished within the grace: its reply was sent
            assert reply is not None and reply.intent is Intent.PROPOSE
            with pytest.raises(PeerFailed) as caught:
                await stuck
            assert (caught.value.reason, caught.value.exit_code) == ("shutdown", 1)
        finally:
            await client.close()

    run_guarded(body)
    assert not asyncio_records(caplog)


# --------------------------------------------------------------------------- the state machine


class HandlerLanes(RuleBasedStateMachine):
    """Messages sent in random conversations, handlers finishing in random order: at every
    step at most N handlers run, a conversation has at most one, its messages start in the
    order they were sent, and as many run as may (N, or every conversation with work).
    task-assignment/v1 has no conversation machine, so one conversation may hold many
    messages at once. The server is a real agent on loopback; the model is two dicts."""

    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.TemporaryDirectory(prefix="cbcl-lanes-")
        self.keys = Keys(Path(self.directory.name))
        self.loop = asyncio.new_event_loop()
        self.stray: list[dict[str, Any]] = []
        self.loop.set_exception_handler(lambda _, context: self.stray.append(context))
        self.lines: list[str] = []
        self.started: dict[str, list[int]] = {}  # what the server's handler began, in order
        self.gates: dict[str, asyncio.Event] = {}  # the handlers running, by conversation
        self.most = 0
        self.sent: dict[str, list[int]] = {}  # the model: every message sent, in order
        self.waiting: dict[str, deque[int]] = {}  # sent, not started
        self.running: dict[str, int] = {}  # started, not finished
        self.number = 0
        self.bound = 1
        self.server: Agent | None = None
        self.client: Agent | None = None
        self.link: Link | None = None

    def run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(coroutine)

    @initialize(bound=st.integers(1, 3))
    def start(self, bound: int) -> None:
        self.bound = bound

        async def handler(message: Message, context: Context) -> None:
            cid = str(message.conversation_id)
            self.started.setdefault(cid, []).append(int(str(message.body[2])))  # type: ignore[index]
            self.gates[cid] = gate = asyncio.Event()
            self.most = max(self.most, len(self.gates))
            await gate.wait()

        async def begin() -> None:
            keys = self.keys
            self.server = Agent(SERVER, key=keys.pair, trust=keys.store, handler=handler,
                                log=self.lines.append, handler_timeout=3600,
                                handler_limits=HandlerLimits(handler_concurrency=bound))
            listening = await self.server.serve("127.0.0.1:0")
            host, port = listening.sockets[0].getsockname()[:2]
            self.client = Agent(CLIENT, key=keys.pair, trust=keys.store)
            self.link = await self.client.connect(f"{host}:{port}", peer=SERVER,
                                                  descriptor=keys.signed_tasks)
        self.run(begin())

    def settle(self) -> None:
        """Wait until the server took every message sent and as many handlers run as
        may; then what it started must be what the model says may start."""
        busy = {cid for cid, numbers in self.waiting.items() if numbers} | set(self.running)
        expected, sent = min(self.bound, len(busy)), self.number
        server = self.server
        assert server is not None
        self.run(until(lambda: server.messages_received == sent
                       and len(self.gates) == expected))
        for cid in self.gates:
            if cid not in self.running:  # started since: its oldest waiting message
                self.running[cid] = self.waiting[cid].popleft()
        for cid, numbers in self.started.items():
            assert numbers == self.sent[cid][:len(numbers)], (cid, numbers)  # in order
            assert numbers[-1] == self.running.get(cid, numbers[-1])

    @rule(conversation=st.integers(0, 3))
    def send(self, conversation: int) -> None:
        assert self.link is not None
        self.number += 1
        cid = f"conv-{conversation}"
        self.sent.setdefault(cid, []).append(self.number)
        self.waiting.setdefault(cid, deque()).append(self.number)
        self.run(self.link.send(Message(
            message_id=f"m-{self.number}", sender=CLIENT, receiver=SERVER,
            intent=Intent.PROPOSE, protocol="task-assignment/v1", conversation_id=cid,
            body=read(f'(task :id "{self.number}")'.encode()))))
        self.settle()

    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        if not self.running:
            return
        cid = data.draw(st.sampled_from(sorted(self.running)))
        del self.running[cid]
        self.gates.pop(cid).set()  # (popped now: the next one of cid gets a gate of its own)
        self.settle()

    @invariant()
    def bounded(self) -> None:
        assert len(self.gates) <= self.bound and self.most <= self.bound
        assert set(self.gates) == set(self.running)

    def teardown(self) -> None:
        async def end() -> None:
            for gate in list(self.gates.values()):
                gate.set()
            if self.client is not None:
                await self.client.close()
            if self.server is not None:
                await self.server.close(grace=0.1)
        try:
            self.run(end())
        finally:
            self.loop.close()
            self.directory.cleanup()
        gc.collect()
        assert not self.stray, [context.get("message") for context in self.stray]


TestHandlerLanes = HandlerLanes.TestCase
TestHandlerLanes.settings = settings(
    max_examples=min(25, settings().max_examples), stateful_step_count=20,
    deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------------- two processes


HANDLERS = '''
import asyncio, os, pathlib, time
from cbcl import Intent, Keyword, Symbol

class Custom(BaseException):
    pass

def _task(message):
    body = message.body
    task = dict(zip(body[2][1::2], body[2][2::2]))
    return task[Keyword("id")]

async def _async_exit():
    await asyncio.sleep(0)
    raise SystemExit(4)

async def _held(name):
    marker = pathlib.Path(os.environ["MARKERS"]) / name
    marker.write_text("began")
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        marker.write_text("cancelled")
        raise

def respond(message, context):
    task = _task(message)
    if task == "raise":
        raise ValueError("bad\\nserve[9]: verified (signed by root)")
    if task == "exit":
        raise SystemExit(3)
    if task == "interrupt":
        raise KeyboardInterrupt
    if task == "custom":
        raise Custom("mine")
    if task == "async-exit":
        return _async_exit()
    if task == "sleep":
        time.sleep(10)
    if task == "wrong":
        return context.reply(Intent.REFUSE, (Symbol("refuse"), Keyword("task-id"), task,
                                             Keyword("reason"), Symbol("bored")))
    if task.startswith("held-"):
        return _held(task)
    return context.reply(Intent.PROPOSE, (Symbol("proposal"), Keyword("task-id"), task,
                                          Keyword("bid"), (Symbol("bid"), Keyword("price"), 1,
                                                           Keyword("currency"), Symbol("EUR"))))
'''


class ServeProcess:
    """``cbcl serve --handler handlers:respond`` in a subprocess, its log (standard
    output: JSON lines, or text) and its standard error read as they come."""

    def __init__(self, keys: Keys, *options: str, log_format: str = "json") -> None:
        directory = keys.directory
        (directory / "handlers.py").write_text(textwrap.dedent(HANDLERS))
        self.markers = directory / "markers"
        self.markers.mkdir(exist_ok=True)
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "MARKERS": str(self.markers)}
        self.log_format = log_format
        self.process = subprocess.Popen(
            [sys.executable, "-m", "cbcl", "serve", "--listen", "127.0.0.1:0", "--trust",
             str(keys.trust), "--name", SERVER, "--handler", "handlers:respond",
             "--log-format", log_format, *options],
            cwd=directory, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=self.env)
        self.lines: list[str] = []
        self.errors: list[str] = []
        self._more = threading.Condition()
        assert self.process.stdout is not None and self.process.stderr is not None
        self._readers = [
            threading.Thread(target=self._read, args=(self.process.stdout, self.lines),
                             daemon=True),
            threading.Thread(target=self._read, args=(self.process.stderr, self.errors),
                             daemon=True)]
        for reader in self._readers:
            reader.start()
        first = self.wait_for("listening on")
        self.address = self.text(first).split("listening on ", 1)[1].split()[0]

    def _read(self, stream: Any, into: list[str]) -> None:
        for line in stream:
            with self._more:
                into.append(line.rstrip("\n"))
                self._more.notify_all()
        with self._more:
            self._more.notify_all()

    def text(self, line: str) -> str:
        return str(json.loads(line)["message"]) if self.log_format == "json" else line

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in list(self.lines)]

    def wait_for(self, text: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        with self._more:
            while True:
                for line in self.lines:
                    if text in self.text(line):
                        return line
                left = deadline - time.monotonic()
                if left <= 0 or not self._readers[0].is_alive():
                    raise AssertionError(f"no log line with {text!r}: {self.lines} "
                                         f"{self.errors}")
                self._more.wait(min(left, 0.1))

    def stop(self) -> str:
        """SIGTERM (if it still runs), wait for it, and return its standard error."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                stop_process(self.process)
        for reader in self._readers:
            reader.join(10)
        stop_process(self.process)
        return "\n".join(self.errors)


def _send(keys: Keys, serve: ServeProcess, task: str, *extra: str
          ) -> tuple[subprocess.CompletedProcess[str], float]:
    message = keys.directory / f"{task}.cbcl"
    message.write_text(
        f'(CBCL/1.0 (message-id "m-{task}") (sender {CLIENT}) (receiver {SERVER}) (intent CFP) '
        f'(protocol contract-net/v1) (conversation-id "job-{task}") (body (cfp :task (task :id '
        f'"{task}" :action render) :deadline 1764503600000)))')
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "cbcl", "send", "--connect", serve.address, "--descriptor",
         "cn.signed.cbcl", "--key", "demo.key", "--reply-timeout", "120", *extra,
         str(message)], cwd=keys.directory, capture_output=True, text=True, timeout=180,
        env=serve.env, check=False)
    return done, time.monotonic() - started


@pytest.mark.slow
def test_cbcl_send_sees_each_failure_of_a_real_serve(keys: Keys) -> None:
    """A real ``cbcl serve --handler`` and ``cbcl send``: each failure is one stderr line
    naming its code, exit 8, long before the 120 s reply timeout; the server goes on after
    SystemExit, KeyboardInterrupt and another BaseException; its log holds the failure
    with the traceback as JSON, peer text escaped; nothing on its stderr."""
    serve = ServeProcess(keys, "--handler-timeout", "1")
    try:
        for task, code in (("raise", "handler-failed"), ("exit", "handler-failed"),
                           ("interrupt", "handler-failed"), ("custom", "handler-failed"),
                           ("async-exit", "handler-failed"), ("wrong", "invalid-reply"),
                           ("sleep", "handler-timeout")):
            done, took = _send(keys, serve, task)
            assert done.returncode == 8, (task, done)
            assert done.stdout == ""
            (line,) = done.stderr.splitlines()
            assert line.startswith(f'send: the peer could not answer "m-{task}": {code}'), line
            assert took < 60, (task, took)  # the reply timeout is 120 s
        ok, _ = _send(keys, serve, "fine")  # still serving, after every one of them
        assert ok.returncode == 0 and "PROPOSE" in ok.stdout, ok
        assert serve.process.poll() is None
    finally:
        errors = serve.stop()
    assert errors == ""
    records = serve.records()
    assert all(set(record) >= {"time", "level", "logger", "event", "message"}
               for record in records)
    failed = [r for r in records if r["event"] == "handler-failed"]
    assert [r["level"] for r in failed] == ["ERROR"] * 5
    raised = failed[0]
    assert raised["message"] == ("serve[1]: the handler failed: ValueError: "
                                 "bad\\u000aserve[9]: verified (signed by root)")
    assert raised["conversation"] == "job-raise" and raised["intent"] == "CFP"
    assert raised["protocol"] == "contract-net/v1" and raised["reason"] == "handler-failed"
    assert "handler_ms" in raised["timings"] and raised["peer"] == "127.0.0.1"
    assert "Traceback" in raised["traceback"] and "ValueError" in raised["traceback"]
    contained = [r for r in failed[1:]]
    assert all("contained, the agent goes on" in r["message"] and "traceback" not in r
               for r in contained)
    assert [r["reason"] for r in records if r["event"] == "failure-sent"] == [
        "handler-failed"] * 5 + ["invalid-reply", "handler-timeout"]


@pytest.mark.slow
def test_a_real_serve_answers_within_a_second_of_the_failure(keys: Keys) -> None:
    """The client (an agent in this process) raises within 1 s of the server's failure,
    measured from the server's own record of the failure to the client's exception (one
    clock: the same machine), with the client's wait at 120 s."""
    serve = ServeProcess(keys, "--handler-timeout", "1")

    async def body() -> dict[str, float]:
        client = Agent(CLIENT, key=keys.pair)  # (serve signs nothing here: no --key)
        raised: dict[str, float] = {}
        try:
            link = await client.connect(serve.address, peer=SERVER, descriptor=keys.signed)
            for task in ("raise", "exit", "wrong", "sleep"):
                with pytest.raises(PeerFailed):
                    await link.conversation(f"job-{task}").send(Intent.CFP, cfp(task),
                                                                timeout=120)
                raised[task] = time.time()
        finally:
            await client.close()
        return raised

    try:
        raised = run_guarded(body)
    finally:
        assert serve.stop() == ""
    for task, at in raised.items():
        (failure,) = [r for r in serve.records() if r["event"] in (
            "handler-failed", "invalid-reply", "handler-timeout")
            and r.get("conversation") == f"job-{task}"]
        stamp = datetime.fromisoformat(failure["time"].replace("Z", "+00:00")).timestamp()
        assert -0.01 <= at - stamp <= 1.0, (task, at - stamp)


@pytest.mark.slow
def test_text_log_keeps_one_line_per_event_and_indents_the_traceback(keys: Keys) -> None:
    serve = ServeProcess(keys, log_format="text")
    try:
        done, _ = _send(keys, serve, "raise")
        assert done.returncode == 8
        serve.wait_for("with NOT-UNDERSTOOD handler-failed")
    finally:
        errors = serve.stop()
    assert errors == ""
    lines = serve.lines
    at = next(i for i, line in enumerate(lines) if "the handler failed" in line)
    assert lines[at] == ("serve[1]: the handler failed: ValueError: bad\\u000aserve[9]: "
                         "verified (signed by root)")
    trace = []
    for line in lines[at + 1:]:
        if not line.startswith("    "):
            break
        trace.append(line)
    assert trace[0] == "    Traceback (most recent call last):"
    assert trace[-2:] == ["    ValueError: bad", "    serve[9]: verified (signed by root)"]
    # Every event starts at the left margin; nothing a peer wrote starts one.
    events = [line for line in lines if not line.startswith("    ")]
    assert all(line.startswith(("serve[", "serve:", "agent:")) for line in events), events
    assert not any(line.startswith("serve[9]") for line in lines)


@pytest.mark.slow
def test_stopping_serve_with_a_handler_in_flight(keys: Keys) -> None:
    """SIGTERM while a coroutine handler runs: the grace passes, the handler is cancelled
    (its own marker says so), the client is answered ``shutdown`` (exit 1), serve says
    ``stopped`` and exits 0, and nothing reaches its stderr (no CancelledError
    traceback)."""
    serve = ServeProcess(keys, "--shutdown-grace", "0.5", "--handler-timeout", "3600")
    message = keys.directory / "held.cbcl"
    message.write_text(
        f'(CBCL/1.0 (message-id "m-1") (sender {CLIENT}) (receiver {SERVER}) (intent CFP) '
        '(protocol contract-net/v1) (conversation-id "job-1") (body (cfp :task (task :id '
        '"held-1" :action render) :deadline 1764503600000)))')
    sender = subprocess.Popen(
        [sys.executable, "-m", "cbcl", "send", "--connect", serve.address, "--descriptor",
         "cn.signed.cbcl", "--key", "demo.key", "--reply-timeout", "120", str(message)],
        cwd=keys.directory, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=serve.env)
    try:
        marker = serve.markers / "held-1"
        deadline = time.monotonic() + 30
        while not marker.exists() or marker.read_text() != "began":
            assert time.monotonic() < deadline, serve.lines
            time.sleep(0.02)
        serve.process.send_signal(signal.SIGTERM)
        assert serve.process.wait(30) == 0
        _, err = sender.communicate(timeout=60)
    finally:
        stop_process(sender)
        errors = serve.stop()
    assert errors == ""  # no CancelledError, no traceback of any kind
    assert marker.read_text() == "cancelled"
    assert sender.returncode == 1, err
    assert err.strip() == ('send: the peer could not answer "m-1": shutdown (the agent is '
                           "stopping)")
    events = [r["event"] for r in serve.records()]
    order = [events.index(e) for e in ("stopping", "draining", "shutdown", "failure-sent")]
    assert order == sorted(order) and events[-1] == "stopped", events


@pytest.mark.slow
def test_a_client_that_goes_away_cancels_its_handler_in_a_real_serve(keys: Keys) -> None:
    serve = ServeProcess(keys, "--handler-timeout", "3600")
    message = keys.directory / "held.cbcl"
    message.write_text(
        f'(CBCL/1.0 (message-id "m-1") (sender {CLIENT}) (receiver {SERVER}) (intent CFP) '
        '(protocol contract-net/v1) (conversation-id "job-1") (body (cfp :task (task :id '
        '"held-2" :action render) :deadline 1764503600000)))')
    sender = subprocess.Popen(
        [sys.executable, "-m", "cbcl", "send", "--connect", serve.address, "--descriptor",
         "cn.signed.cbcl", "--key", "demo.key", "--reply-timeout", "120", str(message)],
        cwd=keys.directory, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=serve.env)
    try:
        marker = serve.markers / "held-2"
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert time.monotonic() < deadline, serve.lines
            time.sleep(0.02)
        sender.kill()  # the client is gone, mid-call
        sender.wait(30)
        while marker.read_text() != "cancelled":
            assert time.monotonic() < deadline + 30, serve.lines
            time.sleep(0.02)
        serve.wait_for("1 handler(s) stopped: the link ended")
        assert serve.process.poll() is None
    finally:
        stop_process(sender)
        errors = serve.stop()
    assert errors == ""


def test_an_on_loop_handler_runs_in_the_links_own_task(keys: Keys) -> None:
    """An ``on_loop`` handler is called in the link's own task or in its socket's
    callback (no lane task, no thread), in order; what it raises is still contained and
    answered ``handler-failed``, and one that returns an awaitable is still awaited within
    the deadline."""
    seen: list[tuple[str, bool, bool]] = []

    def bidder(message: Message, context: Context) -> Any:
        link = context.link
        assert link is not None
        task = task_of(message)
        seen.append((task, asyncio.current_task() in (link.task, None),
                     not link._lane_tasks))
        if task == "fail":
            raise RuntimeError("inline")
        if task == "later":
            async def later() -> Message:
                await asyncio.sleep(0)
                return proposal(message, context)
            return later()
        return proposal(message, context)

    async def body() -> None:
        server = serving(keys, handler=on_loop(bidder))
        async with linked(keys, server) as link:
            for name in ("a", "b"):
                reply = await link.conversation().send(Intent.CFP, cfp(name), timeout=30)
                assert reply is not None and reply.intent is Intent.PROPOSE
            with pytest.raises(PeerFailed) as failed:
                await link.conversation().send(Intent.CFP, cfp("fail"), timeout=30)
            assert failed.value.reason == "handler-failed"
            reply = await link.conversation().send(Intent.CFP, cfp("later"), timeout=30)
            assert reply is not None and reply.intent is Intent.PROPOSE
            assert server.messages_received == 4

    run_guarded(body)
    assert seen == [("a", True, True), ("b", True, True), ("fail", True, True),
                    ("later", True, True)]


def test_reads_share_one_timer_per_connection(keys: Keys) -> None:
    """Each read only moves its connection's deadline: the timer set by the first read
    of an established link is the one still set after many more (none is made per read),
    and the idle deadline still follows the last read."""
    async def body() -> None:
        server = serving(keys, handler=on_loop(proposal))
        async with linked(keys, server) as link:
            connection = link.connection
            await link.conversation().send(Intent.CFP, cfp("t-0"), timeout=30)
            timer = connection._read_timer
            assert timer is not None
            for n in range(1, 20):
                await link.conversation().send(Intent.CFP, cfp(f"t-{n}"), timeout=30)
            assert connection._read_timer is timer
            loop = asyncio.get_running_loop()
            idle = connection.limits.idle_timeout
            assert loop.time() < connection._read_deadline <= loop.time() + idle

    run_guarded(body)


def test_answers_to_frames_that_arrive_together_share_one_write(keys: Keys) -> None:
    """Frames read together are answered together: the server holds each answer while
    more frames wait and writes them all at once (one write for four replies)."""
    from cbcl.net._transport import clock_ms
    from cbcl.session._session import ProtocolMessage

    async def body() -> None:
        server = serving(keys, handler=on_loop(proposal))
        async with linked(keys, server) as link:
            await link.conversation().send(Intent.CFP, cfp("t-first"), timeout=30)
            (served,) = server._links
            before = served.connection.writes
            protocol = link.protocol
            assert protocol is not None
            conversations = [link.conversation() for _ in range(4)]
            frames = b"".join(link.session.send(ProtocolMessage(Message(
                message_id=link.next_id(), sender=link.me, receiver=link.peer,
                intent=Intent.CFP, protocol=protocol.id, conversation_id=c.id,
                body=cfp(f"t-{n}"))), now=clock_ms()) for n, c in enumerate(conversations))
            link.connection.writer.write(frames)  # one write: read at once by the server
            replies = [await c.next(timeout=30) for c in conversations]
            assert [r.body[2] for r in replies] == ["t-0", "t-1", "t-2", "t-3"]  # type: ignore[index]
            assert served.connection.writes == before + 1

    run_guarded(body)
