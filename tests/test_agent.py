"""The asyncio Agent: handlers per protocol and intent, conversations that await replies,
protocols learned once and kept (for the process and, with a state directory, across
restarts), and ends that are events, never stray exceptions. Real agents on loopback.

Uses one internal: ``compiled_size``, the size a learned library counts a protocol as."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from key_files import private_key_pem, public_key_pem

import cbcl
from cbcl import (
    Agent,
    ConversationClosed,
    Intent,
    Keyword,
    Message,
    NegotiationFailed,
    Registry,
    Symbol,
    TrustStore,
    read,
    sign_descriptor,
)
from cbcl.net import Context, LearnedLibrary, Link, PeerFailed, load_handler
from cbcl.protocol._registry import compiled_size

ROOT = Path(__file__).parent.parent
PAYLOAD = (ROOT / "cbcl" / "grammars" / "contract-net-v1.cbcl").read_bytes()
REQUEST = (ROOT / "descriptors" / "request-v1.cbcl").read_bytes()
SERVER = "agent://test/server"
CLIENT = "agent://test/client"
CFP_BODY = read(b'(cfp :task (task :id "t-1" :action render-video) :deadline 1764503600000)')
BID = (Symbol("bid"), Keyword("price"), cbcl.read(b"7.25"), Keyword("currency"),
       Symbol("EUR"), Keyword("eta"), 10)


class Keys:
    def __init__(self, tmp_path: Path) -> None:
        self.key = Ed25519PrivateKey.generate()
        self.trust = tmp_path / "trust"
        self.trust.mkdir()
        (self.trust / "demo.pub").write_bytes(public_key_pem(self.key.public_key()))
        (tmp_path / "demo.key").write_bytes(private_key_pem(self.key))
        self.store = TrustStore.from_directory(self.trust)
        self.signed = sign_descriptor(PAYLOAD, [("demo", self.key)])
        self.signed_request = sign_descriptor(REQUEST, [("demo", self.key)])
        self.pair = ("demo", self.key)


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    return Keys(tmp_path)


def bidder(message: Message, context: Context) -> Message | None:
    task = dict(zip(message.body[2][1::2], message.body[2][2::2], strict=True))  # type: ignore[index]
    return context.reply(Intent.PROPOSE, (Symbol("proposal"), Keyword("task-id"),
                                          task[Keyword("id")], Keyword("bid"), BID))


def run(body: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``body`` on a fresh loop; any exception asyncio would only log fails the test."""
    stray: list[dict[str, Any]] = []

    async def main() -> Any:
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: stray.append(ctx))
        return await body()

    result = asyncio.run(main())
    assert not stray, stray
    return result


def server_agent(keys: Keys, log: list[str], **options: Any) -> Agent:
    options.setdefault("handler", None)
    return Agent(SERVER, key=keys.pair, trust=keys.store, log=log.append, **options)


@contextlib.asynccontextmanager
async def linked(keys: Keys, server: Agent) -> AsyncIterator[Link]:
    """``server`` serving on loopback and a client agent's established link to it, with
    contract-net/v1; both agents closed after, whatever happened."""
    client = Agent(CLIENT, key=keys.pair, trust=keys.store)
    try:
        yield await client.connect(await address_of(server), peer=SERVER,
                                   descriptor=keys.signed)
    finally:
        await client.close()
        await server.close()


async def address_of(agent: Agent) -> str:
    server = await agent.serve("127.0.0.1:0")
    host, port = server.sockets[0].getsockname()[:2]
    return f"{host}:{port}"


async def wait_for_line(log: list[str], text: str, timeout: float = 5.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log:
            if text in line:
                return line
        await asyncio.sleep(0.01)
    raise AssertionError(f"no log line with {text!r}: {log}")


# --------------------------------------------------------------------------- talking


def test_a_handler_answers_and_the_conversation_returns_the_reply(keys: Keys) -> None:
    log: list[str] = []

    async def body() -> None:
        server = server_agent(keys, log)
        server.on("contract-net/v1", "CFP")(bidder)
        async with linked(keys, server) as link:
            assert str(link.protocol.id) == "contract-net/v1"  # type: ignore[union-attr]
            conversation = link.conversation()
            reply = await conversation.send(Intent.CFP, CFP_BODY)
            assert reply is not None and reply.intent is Intent.PROPOSE
            assert reply.conversation_id == conversation.id
            assert reply.body == (Symbol("proposal"), Keyword("task-id"), "t-1",
                                  Keyword("bid"), BID)
            # No handler for ACCEPT: nothing comes back, the wait says so.
            with pytest.raises(ConversationClosed) as caught:
                await conversation.send(Intent.ACCEPT, read(b'(accept-proposal :task-id "t-1")'),
                                        timeout=0.3)
            assert caught.value.reason == "no-reply"

    run(body)
    assert any("sent \"reply-1\" PROPOSE" in line for line in log), log


def test_handlers_are_chosen_by_protocol_and_intent(keys: Keys) -> None:
    agent = Agent(SERVER, trust=keys.store)
    def fallback(m: Message, c: Context) -> None:
        return None
    def every(m: Message, c: Context) -> None:
        return None
    def cfp(m: Message, c: Context) -> None:
        return None
    agent.fallback = fallback
    agent.on("contract-net/v1")(every)
    agent.on("contract-net/v1", "CFP")(cfp)
    assert agent.handler_for("contract-net/v1", Intent.CFP) is cfp
    assert agent.handler_for("contract-net/v1", Intent.ACCEPT) is every
    assert agent.handler_for("request/v1", Intent.REQUEST) is fallback
    with pytest.raises(ValueError):
        agent.on("contract-net/v1", "NOT-AN-INTENT")
    with pytest.raises(TypeError):
        agent.on("x/v1")(42)  # type: ignore[arg-type]
    asyncio.run(agent.close())


def test_an_async_handler_and_a_failing_one(keys: Keys) -> None:
    log: list[str] = []
    calls = 0

    async def flaky(message: Message, context: Context) -> Message | None:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0)
        if calls == 1:
            raise ValueError("bad\nday")  # the log line stays one line
        return bidder(message, context)

    async def body() -> None:
        server = server_agent(keys, log)
        server.on("contract-net/v1", "CFP")(flaky)
        async with linked(keys, server) as link:
            with pytest.raises(ConversationClosed):
                await link.conversation().send(Intent.CFP, CFP_BODY, timeout=0.3)
            reply = await link.conversation().send(Intent.CFP, CFP_BODY)  # the link lives on
            assert reply is not None and reply.intent is Intent.PROPOSE

    run(body)
    failed = [line for line in log if "the handler failed" in line]
    assert failed == ["serve[1]: the handler failed: ValueError: bad\\u000aday"], log


def test_a_slow_handler_is_cut_off_at_its_deadline(keys: Keys) -> None:
    log: list[str] = []

    async def slow(message: Message, context: Context) -> Message | None:
        await asyncio.sleep(5)
        return bidder(message, context)  # pragma: no cover - never reached

    async def body() -> None:
        server = server_agent(keys, log, handler=slow, handler_timeout=0.2)
        async with linked(keys, server) as link:
            started = time.monotonic()
            # The server answers at the deadline: the client's wait ends then, not at its
            # own (5 s).
            with pytest.raises(PeerFailed) as caught:
                await link.conversation().send(Intent.CFP, CFP_BODY, timeout=5.0)
            assert caught.value.reason == "handler-timeout"
            assert caught.value.detail == "no answer within 0.2 s"
            assert time.monotonic() - started < 2.0
            await wait_for_line(log, "did not answer within 0.2 s")

    run(body)


def test_a_handler_that_returns_no_message_is_logged(keys: Keys) -> None:
    log: list[str] = []

    async def body() -> None:
        server = server_agent(keys, log, handler=lambda m, c: "PROPOSE")
        async with linked(keys, server) as link:
            conversation = link.conversation()
            await conversation.send(Intent.CFP, CFP_BODY, expect_reply=False)
            await wait_for_line(log, "the handler returned str, not a Message")

    run(body)


# --------------------------------------------------------------------------- learning


def test_a_returning_peer_is_answered_supported_without_a_new_offer(keys: Keys) -> None:
    log: list[str] = []

    async def body() -> None:
        server = server_agent(keys, log, handler=bidder)
        client = Agent(CLIENT, key=keys.pair, trust=keys.store)
        try:
            address = await address_of(server)
            for _ in range(3):
                link = await client.connect(address, peer=SERVER, descriptor=keys.signed)
                assert (await link.conversation().send(Intent.CFP, CFP_BODY)) is not None
                await link.close()
            assert len(server.learned) == 1
        finally:
            await client.close()
            await server.close()

    run(body)
    asked = [line for line in log if "asked for contract-net/v1" in line]
    assert [line.rsplit("-> ", 1)[1] for line in asked] == \
        ["unsupported", "supported", "supported"], log
    assert sum("offer received" in line for line in log) == 1, log


def test_learned_protocols_survive_a_restart_and_are_verified_again(
        keys: Keys, tmp_path: Path) -> None:
    state = tmp_path / "state"
    first: list[str] = []
    second: list[str] = []

    async def learn() -> None:
        server = server_agent(keys, first, state=state, handler=bidder)
        async with linked(keys, server) as link:
            await link.close()

    async def come_back() -> None:
        server = server_agent(keys, second, state=state, handler=bidder)
        client = Agent(CLIENT, key=keys.pair, trust=keys.store)
        try:
            assert [str(p.id) for p in server.learned.protocols()] == ["contract-net/v1"]
            link = await client.connect(await address_of(server), peer=SERVER,
                                        descriptor=keys.signed)
            assert (await link.conversation().send(Intent.CFP, CFP_BODY)) is not None
        finally:
            await client.close()
            await server.close()

    run(learn)
    saved = list((state / "learned").glob("sha256-*.cbcl"))
    assert [p.read_bytes() for p in saved] == [keys.signed]
    run(come_back)
    assert any("1 learned protocol(s) restored" in line for line in second), second
    assert any("-> supported" in line for line in second), second
    assert not any("offer received" in line for line in second), second

    # A saved file that no longer verifies (its signature broken) is skipped, and said so.
    saved[0].write_bytes(keys.signed.replace(b"signature", b"signaturX", 1))
    third: list[str] = []
    agent = server_agent(keys, third, state=state)
    assert len(agent.learned) == 0
    assert any("skipped" in line for line in third), third
    asyncio.run(agent.close())


def test_the_learned_library_is_bounded_by_count_and_bytes(keys: Keys, tmp_path: Path) -> None:
    registry = Registry(trust=keys.store, state_dir=tmp_path / "s")
    net = registry.load(keys.signed)
    request = registry.load(keys.signed_request)
    # Count: N kept, the N+1st pushes out the least recently used.
    library = LearnedLibrary(max_protocols=1)
    assert library.add(net) and library.add(request)
    assert [str(p.id) for p in library.protocols()] == ["request/v1"]
    # Bytes: a protocol of exactly max_bytes is kept, one byte less and it is not.
    size = compiled_size(net)
    assert LearnedLibrary(max_bytes=size).add(net)
    assert not LearnedLibrary(max_bytes=size - 1).add(net)
    both = LearnedLibrary(max_bytes=size + compiled_size(request))
    assert both.add(net) and both.add(request) and len(both) == 2
    assert both.size == size + compiled_size(request)
    tight = LearnedLibrary(max_bytes=size + compiled_size(request) - 1)
    tight.add(net)
    tight.add(request)
    assert [str(p.id) for p in tight.protocols()] == ["request/v1"]
    with pytest.raises(ValueError):
        LearnedLibrary(max_protocols=-1)


# --------------------------------------------------------------------------- ends


def test_closing_in_the_middle_of_a_conversation_is_an_event_on_both_sides(
        keys: Keys) -> None:
    log: list[str] = []

    async def body() -> None:
        server = server_agent(keys, log, handler=bidder)
        async with linked(keys, server) as link:
            conversation = link.conversation("job-7")
            assert await conversation.send(Intent.CFP, CFP_BODY) is not None
            await link.close()  # the conversation is in state "proposed"
            assert await link.closed == "closed"
            with pytest.raises(ConversationClosed) as caught:
                await conversation.next()
            assert caught.value.reason == "closed"
            await wait_for_line(log, 'conversation "job-7" (in state proposed) unfinished')

    run(body)  # and nothing reached asyncio's "unhandled exception" handler


def test_the_server_going_away_ends_the_waiting_conversation(keys: Keys) -> None:
    async def never(message: Message, context: Context) -> None:
        await context.link.close()  # type: ignore[union-attr]

    async def body() -> None:
        server = server_agent(keys, [], handler=never)
        async with linked(keys, server) as link:
            with pytest.raises(ConversationClosed) as caught:
                await link.conversation().send(Intent.CFP, CFP_BODY, timeout=5)
            assert caught.value.reason not in ("no-reply",)
            with pytest.raises(ConversationClosed):
                await link.conversation().send(Intent.CFP, CFP_BODY)

    run(body)


def test_an_untrusted_offer_fails_the_connect_with_the_reason(keys: Keys) -> None:
    stranger = Ed25519PrivateKey.generate()

    async def body() -> None:
        server = server_agent(keys, [])
        client = Agent(CLIENT, key=keys.pair)
        try:
            with pytest.raises(NegotiationFailed) as caught:
                await client.connect(await address_of(server), peer=SERVER,
                                     descriptor=sign_descriptor(PAYLOAD, [("x", stranger)]))
            assert caught.value.reason == "untrusted-signer"
            assert caught.value.exit_code == 6
        finally:
            await client.close()
            await server.close()

    run(body)


def test_a_serving_agent_needs_a_trust_store() -> None:
    async def body() -> None:
        agent = Agent(SERVER)
        with pytest.raises(ValueError, match="trust store"):
            await agent.serve("127.0.0.1:0")
        await agent.close()

    asyncio.run(body())


@pytest.mark.parametrize(("value", "error"), [
    ("handler_timeout", ValueError), ("reply_timeout", ValueError)])
def test_agent_timeouts_are_checked(value: str, error: type[Exception]) -> None:
    for bad in (0, -1, float("nan"), 86_401, "1"):
        with pytest.raises(error):
            Agent(SERVER, **{value: bad})  # type: ignore[arg-type]  # wrong on purpose
    largest: dict[str, Any] = {value: 86_400}  # (the timeout is named at run time)
    asyncio.run(Agent(SERVER, **largest).close())


# --------------------------------------------------------------------------- handlers by name


def test_load_handler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_handlers.py").write_text("def answer(m, c):\n    return None\nX = 3\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert load_handler("my_handlers:answer").__name__ == "answer"
    assert load_handler("cbcl.demo:respond") is cbcl.demo.respond
    with pytest.raises(ValueError):
        load_handler("my_handlers")
    with pytest.raises(ImportError):
        load_handler("no_such_module_here:answer")
    with pytest.raises(AttributeError):
        load_handler("my_handlers:nothing")
    with pytest.raises(TypeError):
        load_handler("my_handlers:X")


# --------------------------------------------------------------------------- the CLI


HANDLER = '''
from cbcl import Intent, Keyword, Symbol


def respond(message, context):
    task = dict(zip(message.body[2][1::2], message.body[2][2::2]))
    if message.intent is Intent.CFP and task[Keyword("id")] != "t-quiet":
        return context.reply(Intent.REFUSE, (Symbol("refuse"), Keyword("task-id"), "t-1",
                                             Keyword("reason"), Symbol("busy")))
    return None
'''


def _cbcl(*args: str, cwd: Path, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cbcl", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=60, check=False, **kwargs)


@pytest.mark.slow
def test_serve_with_a_handler_and_send(keys: Keys, tmp_path: Path) -> None:
    (tmp_path / "handlers.py").write_text(HANDLER)
    (tmp_path / "cn.signed.cbcl").write_bytes(keys.signed)
    cfp = tmp_path / "cfp.cbcl"
    cfp.write_text(
        f'(CBCL/1.0 (message-id "m-1") (sender {CLIENT}) (receiver {SERVER}) (intent CFP) '
        '(protocol contract-net/v1) (conversation-id "job-1") (body (cfp :task (task :id '
        '"t-1" :action render-video) :deadline 1764503600000)))')
    refused = tmp_path / "bad.cbcl"  # the grammar has no (cfp :task 42 …)
    refused.write_text(cfp.read_text().replace('(task :id "t-1" :action render-video)', "42"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen(
        [sys.executable, "-m", "cbcl", "serve", "--listen", "127.0.0.1:0", "--trust",
         str(keys.trust), "--name", SERVER, "--handler", "handlers:respond"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert server.stdout is not None
        first = server.stdout.readline()
        assert "listening on" in first, first + (server.stderr.read() if server.stderr else "")
        address = first.split("listening on ", 1)[1].split()[0]
        common = ("send", "--connect", address, "--descriptor", "cn.signed.cbcl", "--key",
                  "demo.key")
        done = _cbcl(*common, str(cfp), cwd=tmp_path, env=env)
        assert done.returncode == 0, done.stderr
        reply = cbcl.parse(done.stdout.strip().encode(), envelope_only=True)
        assert reply.intent is Intent.REFUSE and reply.in_reply_to == "m-1"
        as_json = _cbcl(*common, "--json", "--encoding", "text", str(cfp), cwd=tmp_path,
                        env=env)
        assert as_json.returncode == 0, as_json.stderr
        assert '"intent": "REFUSE"' in as_json.stdout
        # No reply within the deadline: exit 1, one line.
        (tmp_path / "quiet.cbcl").write_text(cfp.read_text().replace('"t-1"', '"t-quiet"'))
        timed = _cbcl(*common, "--reply-timeout", "0.3", "quiet.cbcl", cwd=tmp_path, env=env)
        assert timed.returncode == 1, timed
        assert "no reply" in timed.stderr and timed.stdout == ""
        # --no-reply: sent, nothing awaited, exit 0.
        sent = _cbcl(*common, "--no-reply", "quiet.cbcl", cwd=tmp_path, env=env)
        assert sent.returncode == 0 and sent.stdout == "", sent
        # A message the protocol refuses never leaves: its code, one line on stderr.
        bad = _cbcl(*common, str(refused), cwd=tmp_path, env=env)
        assert bad.returncode in (3, 5), bad
        assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    finally:
        server.terminate()
        server.wait(timeout=10)
        if server.stdout:
            server.stdout.close()
        if server.stderr:
            server.stderr.close()


@pytest.mark.parametrize("args", [
    ["--connect", "nowhere", "--descriptor", "d", "--key", "k", "m"],
    ["--descriptor", "d", "--key", "k", "m"],
    ["--connect", "127.0.0.1:1", "--descriptor", "d", "--key", "k"],
    ["--connect", "127.0.0.1:1", "--descriptor", "d", "--key", "k", "--reply-timeout", "0",
     "m"],
])
def test_send_usage_errors_exit_2(args: list[str], tmp_path: Path) -> None:
    done = _cbcl("send", *args, cwd=tmp_path)
    assert done.returncode == 2, done
    assert "usage: cbcl send" in done.stderr and done.stderr.count("\n") <= 2, done.stderr


def test_serve_refuses_a_handler_it_cannot_load(keys: Keys, tmp_path: Path) -> None:
    done = _cbcl("serve", "--listen", "127.0.0.1:0", "--trust", str(keys.trust), "--handler",
                 "no_such_module_here:respond", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith("usage: cbcl serve: --handler no_such_module_here:respond")


def test_messages_the_protocol_refuses_never_leave_either_side(keys: Keys) -> None:
    log: list[str] = []

    def wrong(message: Message, context: Context) -> Message:
        # A refusal whose :reason the grammar does not have.
        return context.reply(Intent.REFUSE, (Symbol("refuse"), Keyword("task-id"), "t-1",
                                             Keyword("reason"), Symbol("bored")))

    async def body() -> None:
        server = server_agent(keys, log, handler=wrong)
        async with linked(keys, server) as link:
            conversation = link.conversation()
            with pytest.raises(cbcl.BodyError):  # ours: :deadline must be an integer
                await conversation.send(Intent.CFP, read(
                    b'(cfp :task (task :id "t-1" :action x) :deadline "soon")'))
            with pytest.raises(cbcl.SchemaError):  # ours: an empty task id
                await conversation.send(Intent.CFP, read(
                    b'(cfp :task (task :id "" :action x) :deadline 1)'))
            # The link and the conversation go on; the server's wrong reply stays there,
            # and the server says so: invalid-reply, naming the kind of the refusal only.
            with pytest.raises(PeerFailed) as caught:
                await conversation.send(Intent.CFP, CFP_BODY, timeout=5.0)
            assert (caught.value.reason, caught.value.detail) == ("invalid-reply", "body")
            await wait_for_line(log, "our reply was not sent: body")

    run(body)
    assert not any("the peer did not understand" in line for line in log), log


def test_open_conversations_on_a_link_are_bounded(keys: Keys) -> None:
    from cbcl.net import ServerLimits

    async def body() -> None:
        server = server_agent(keys, [], handler=bidder)
        client = Agent(CLIENT, key=keys.pair, trust=keys.store,
                       server_limits=ServerLimits(max_conversations=2))
        try:
            link = await client.connect(await address_of(server), peer=SERVER,
                                        descriptor=keys.signed)
            first, second = link.conversation(), link.conversation()
            assert first.ended is None and second.ended is None  # N open: kept
            third = link.conversation()  # N+1: the oldest is ended
            assert first.ended == "no-reply" and second.ended is None and third.ended is None
            with pytest.raises(ConversationClosed) as caught:
                await first.next(timeout=5)
            assert caught.value.reason == "no-reply"
            # The same bound holds for replies awaited without a conversation-id.
            waiters = [link.expect_reply(f"m-{n}") for n in range(3)]
            assert [w.ended for w in waiters] == ["no-reply", None, None]
            # A conversation that ends is dropped, so it takes no place.
            reply = await second.send(Intent.CFP, CFP_BODY)
            assert reply is not None
            rejected = await second.send(Intent.REJECT, read(
                b'(reject-proposal :task-id "t-1")'))
            assert rejected is None and second.finished
            fourth = link.conversation()
            assert third.ended is None and fourth.ended is None
        finally:
            await client.close()
            await server.close()

    run(body)


def test_a_str_is_sent_as_the_symbol_the_schema_says(keys: Keys) -> None:
    """Coercion where the schema is explicit (spec/conversations.md §2.3): ``action=`` and
    ``currency=`` given as ``str`` go as the symbols the schema types them as, in a sent
    message and in a reply; without it the schema would refuse both."""
    log: list[str] = []

    def plain_bidder(message: Message, context: Context) -> Message | None:
        return context.reply("PROPOSE", cbcl.body(
            "proposal", task_id="t-1",
            bid=cbcl.body("bid", price=cbcl.read(b"7.25"), currency="EUR", eta=10)))

    async def body() -> None:
        server = server_agent(keys, log)
        server.on("contract-net/v1", "CFP")(plain_bidder)
        async with linked(keys, server) as link:
            reply = await link.conversation().send("CFP", cbcl.body(
                "cfp", task=cbcl.body("task", id="t-1", action="render-video"),
                deadline=1764503600000))
            assert reply is not None and reply.body == (
                Symbol("proposal"), Keyword("task-id"), "t-1", Keyword("bid"), BID)

    run(body)
    assert any('PROPOSE in reply to' in line and "CFP" in line for line in log), log
