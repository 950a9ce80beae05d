"""The SPADE adapter (cbcl.bridges._spade) through a real XMPP server: SPADE's embedded one
(``spade run``) in a subprocess, one per module, and real SPADE agents.

* A CBCL agent and a SPADE agent that uses spade-fipaproto's Request protocol
  (AchieveREResponder) complete a request/v1 conversation (REQUEST → AGREE → INFORM), every
  message checked by both passes and by the protocol's conversation.
* Who sent it (spec/interop.md §2.1, issue 31 item 3): a spoofing agent claiming another's
  name from its own JID is refused, logged, and the claimed agent receives nothing; a
  JID → agent-name mapping; with a trust store, a ``from`` forged on the wire (the embedded
  server forwards it) is refused by the key binding.
* Replies made with SPADE's ``make_reply`` (§2.2), both directions.

SPADE hands a message to an agent of the same process itself, without the server
(:func:`_apart` turns that off: the agents here stand for agents in different processes).

Uses one internal: the adapter's ``jid_to_uri``, so the CBCL agent names itself as the
adapter names its peer."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from processes import stop_process

from cbcl import CBCLError, Message, Registry, Symbol, TrustError, read, validate
from cbcl.conversation import ConversationTracker
from cbcl.interop import ConversionError, LossyConversionError, SenderMismatchError
from cbcl.trust import Identity, TrustPolicy, TrustStore, sign_message

# the fipa extra (in the test extra: CI); Any: SPADE ships no types, and a module object
# does not type its attributes (the classes derived from SPADE's are marked where they are)
spade_agent: Any = pytest.importorskip("spade.agent")
spade_behaviour: Any = pytest.importorskip("spade.behaviour")
spade_message: Any = pytest.importorskip("spade.message")
spade_container: Any = pytest.importorskip("spade.container")
spade_template: Any = pytest.importorskip("spade.template")
fipaproto: Any = pytest.importorskip("spade_fipaproto")

from cbcl.bridges._spade import jid_to_uri  # noqa: E402
from cbcl.interop import (  # noqa: E402
    JidNames,
    message_to_spade,
    spade_identity,
    spade_to_message,
)

ROOT = Path(__file__).parent.parent
HOST = "127.0.0.1"
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def xmpp_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """SPADE's embedded XMPP server on free loopback ports, stopped in finally; one for the
    module (each test names its agents apart)."""
    tmp_path = tmp_path_factory.mktemp("spade")
    client, server = _free_port(), _free_port()
    spade = Path(sys.executable).parent / "spade"
    log = (tmp_path / "spade.log").open("wb")
    process = subprocess.Popen(
        [str(spade), "run", "--host", HOST, "--client_port", str(client), "--server_port",
         str(server), "--memory"], cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection((HOST, client), timeout=0.2).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    pytest.fail("spade run did not start: "
                                + (tmp_path / "spade.log").read_text(errors="replace")[-2000:])
                time.sleep(0.05)
        yield client
    finally:
        stop_process(process)
        log.close()


def _apart(*agents: Any) -> None:
    """Each message between ``agents`` goes through the XMPP server: SPADE's ``Container``
    (one per process) would otherwise hand it to the receiving agent itself, with whatever
    ``sender`` the sending code wrote."""
    container = spade_container.Container()
    for agent in agents:
        container.unregister(str(agent.jid))


def _registry() -> Registry:
    registry = Registry()
    registry.load((ROOT / "descriptors" / "request-v1.cbcl").read_bytes(), allow_unsigned=True)
    return registry


def _now() -> int:
    return int(time.time() * 1000)


class Participant(spade_agent.Agent):  # type: ignore[misc]  # SPADE's classes are Any
    """A SPADE agent that answers fipa-request with spade-fipaproto's responder; it reads
    and writes its messages with the adapter (CBCL bodies, FIPA metadata)."""

    def __init__(self, *args: Any, registry: Registry, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.registry = registry
        self.tasks: set[asyncio.Task[None]] = set()

    async def setup(self) -> None:
        responder = fipaproto.AchieveREResponder()
        agent = self

        def handle(request: Any) -> Any:
            message, _ = spade_to_message(request)
            validate(message, registry=agent.registry)
            action_id = f"a-{message.message_id}"
            agree = Message(message_id="agree-1", sender=message.receiver,
                            receiver=message.sender, intent="AGREE", protocol=message.protocol,
                            conversation_id=message.conversation_id,
                            in_reply_to=message.message_id,
                            body=read(f'(agree :action-id "{action_id}")'))
            done = Message(message_id="done-1", sender=message.receiver,
                           receiver=message.sender, intent="INFORM", protocol=message.protocol,
                           conversation_id=message.conversation_id,
                           in_reply_to=message.message_id,
                           body=read(f'(inform-result :action-id "{action_id}" :result 42)'))
            # The protocol's second answer. (Not through the responder's done(): in
            # spade-fipaproto 0.5.1 it reads `reply.metadata`, which SPADE 4.1 does not
            # have, and raises AttributeError.)
            task = asyncio.get_running_loop().create_task(
                responder.send(message_to_spade(done)))
            agent.tasks.add(task)
            return message_to_spade(agree)

        responder.handle_request = handle
        template = spade_behaviour.Template(metadata={"performative": "request"})
        self.add_behaviour(responder, template)


class Initiator(spade_agent.Agent):  # type: ignore[misc]  # SPADE's classes are Any
    """The CBCL agent: it sends a CBCL REQUEST and follows the request/v1 conversation."""

    def __init__(self, *args: Any, registry: Registry, peer: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.registry = registry
        self.peer = peer
        self.tracker = ConversationTracker.from_descriptors(
            [registry.get(Symbol("request/v1"))])
        self.received: list[Message] = []
        self.round_trips: list[float] = []
        self.finished = False  # (a flag: SPADE may run behaviours on a loop of its own)
        self.error: BaseException | None = None

    async def setup(self) -> None:
        agent = self

        class Run(spade_behaviour.OneShotBehaviour):  # type: ignore[misc]  # SPADE: Any
            async def run(self) -> None:
                try:
                    await self._converse()
                except BaseException as exc:  # reported by the test
                    agent.error = exc
                finally:
                    agent.finished = True

            async def _converse(self) -> None:
                request = Message(
                    message_id="req-1", sender=jid_to_uri(agent.jid),
                    receiver=jid_to_uri(agent.peer), intent="REQUEST",
                    protocol="request/v1", conversation_id="conv-1",
                    reply_by=_now() + 60_000,
                    body=read("(request :action (action :name ping :args (:n 1)))"))
                validate(request, registry=agent.registry)
                agent.tracker.receive(request, now=_now())
                start = time.perf_counter()
                await self.send(message_to_spade(request))
                thread = agent.tracker.get("conv-1", request.receiver)
                assert thread is not None, "the request did not open the conversation"
                while not thread.finished:
                    reply = await self.receive(timeout=10)
                    assert reply is not None, "no reply within 10 s"
                    agent.round_trips.append((time.perf_counter() - start) * 1000)
                    message, losses = spade_to_message(reply)
                    assert losses == []
                    validate(message, registry=agent.registry)  # both passes
                    agent.tracker.receive(message, now=_now())
                    agent.received.append(message)

        self.add_behaviour(Run())


async def _conversation(port: int) -> tuple[Initiator, Participant]:
    registry = _registry()
    participant = Participant(f"participant@{HOST}", "secret", port=port, registry=registry)
    initiator = Initiator(f"initiator@{HOST}", "secret", port=port, registry=registry,
                          peer=f"participant@{HOST}")
    _apart(participant, initiator)
    await participant.start(auto_register=True)
    await initiator.start(auto_register=True)
    try:
        deadline = time.monotonic() + 20
        while not initiator.finished and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
    finally:
        await initiator.stop()
        await participant.stop()
    return initiator, participant


def test_cbcl_agent_and_spade_agent_complete_a_fipa_request(xmpp_port: int) -> None:
    # (No warning filter: SPADE 4.1.4, slixmpp and pyjabber raise none on this path, and
    # pytest turns any that appears into an error.)
    initiator, _ = asyncio.run(_conversation(xmpp_port))
    assert initiator.finished, "the conversation did not finish within 20 s"
    if initiator.error is not None:
        raise initiator.error
    assert [m.intent for m in initiator.received] == ["AGREE", "INFORM"]
    conversation = initiator.tracker.get("conv-1", f"xmpp://participant@{HOST}")
    assert conversation is not None and conversation.finished
    assert str(conversation.state) == "done"
    assert initiator.received[1].body == read('(inform-result :action-id "a-req-1" :result 42)')
    first = initiator.round_trips[0]
    print(f"SPADE round trip (REQUEST → AGREE): {first:.1f} ms")
    assert first < 5_000


def test_adapter_metadata_and_checks() -> None:
    message = Message(message_id="m-1", sender="xmpp://a@h", receiver="xmpp://b@h",
                      intent="REQUEST", protocol="request/v1", conversation_id="c-1",
                      body=read("(request :action (action :name ping))"))
    spade = message_to_spade(message)
    assert str(spade.to) == "b@h" and spade.thread == "c-1"
    assert spade.body == message.canonical()
    assert spade.get_metadata("performative") == "request"
    assert spade.get_metadata("protocol") == "fipa-request"
    assert spade.get_metadata("reply-with") == "m-1"
    assert spade.get_metadata("language") == "CBCL/1.0"
    assert spade_to_message(spade) == (message, [])
    spade.set_metadata("performative", "inform")
    with pytest.raises(ConversionError, match="contradicts"):
        spade_to_message(spade)
    with pytest.raises(ConversionError, match="xmpp://"):
        message_to_spade(Message(message_id="m", sender="agent://a", receiver="agent://b",
                                 intent="INFORM", protocol="p"))


def test_the_trace_is_the_x_cbcl_trace_metadata() -> None:
    """A SPADE message carries the (trace …) field in its X-CBCL-trace metadata (the FIPA
    parameter, spec/interop.md §2): beside a CBCL body, whose own field is authoritative,
    it is for SPADE code; a plain SPADE message's is its trace, read strictly."""
    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    message = Message(message_id="m-1", sender="xmpp://a@h", receiver="xmpp://b@h",
                      intent="REQUEST", protocol="request/v1", conversation_id="c-1",
                      trace=trace, body=read("(request :action (action :name ping))"))
    spade = message_to_spade(message)
    assert spade.get_metadata("X-CBCL-trace") == trace
    assert spade_to_message(spade) == (message, [])
    plain = spade_message.Message(to="b@h", sender="a@h", body="hello",
                                  metadata={"performative": "inform", "language": "text",
                                            "X-CBCL-trace": trace})
    assert spade_to_message(plain)[0].trace == trace
    plain.set_metadata("X-CBCL-trace", trace.upper())
    with pytest.raises(ConversionError, match="traceparent"):
        spade_to_message(plain, lossy=True)


def test_plain_spade_message_maps_through_fipa() -> None:
    plain = spade_message.Message(to="b@h", sender="a@h/res", body="hello", thread="t-1",
                                  metadata={"performative": "inform", "language": "text"})
    message, losses = spade_to_message(plain)
    assert losses == []
    assert (str(message.sender), str(message.receiver)) == ("xmpp://a@h", "xmpp://b@h")
    assert message.conversation_id == "t-1" and message.intent == "INFORM"
    assert message.body == read('(fipa-content :language "text" :content "hello")')
    odd = spade_message.Message(to="b@h", sender="a@h", body="x",
                                metadata={"performative": "call-for-proposal",
                                          "creation-timestamp": "2026-01-01T00:00:00"})
    with pytest.raises(LossyConversionError, match="creation-timestamp"):
        spade_to_message(odd)
    assert spade_to_message(odd, lossy=True)[0].intent == "CFP"


# --------------------------------------------------------------------------- who sent it

LOGGER = "cbcl.bridges._spade"
Handle = Callable[[Any, Any], Awaitable[None]]


class Node(spade_agent.Agent):  # type: ignore[misc]  # SPADE's classes are Any
    """A SPADE agent with one behaviour (its ``template``, if given): it keeps each message
    it receives and hands it to ``handle`` (a coroutine function of the behaviour and the
    message); what the adapter refuses is kept in ``refused``, anything else that fails
    in ``failures``, and ``handled`` counts the messages done with."""

    def __init__(self, *args: Any, handle: Handle | None = None, template: Any = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handle = handle
        self.template = template
        self.inbox: list[Any] = []
        self.refused: list[CBCLError] = []
        self.failures: list[BaseException] = []
        self.handled = 0
        self.behaviour: Any = None

    async def setup(self) -> None:
        agent = self

        class Receive(spade_behaviour.CyclicBehaviour):  # type: ignore[misc]  # SPADE: Any
            async def run(self) -> None:
                msg = await self.receive(timeout=1)
                if msg is None:
                    return
                agent.inbox.append(msg)
                try:
                    if agent.handle is not None:
                        await agent.handle(self, msg)
                except CBCLError as exc:
                    agent.refused.append(exc)
                except Exception as exc:  # reported by the test
                    agent.failures.append(exc)
                agent.handled += 1

        self.behaviour = Receive()
        self.add_behaviour(self.behaviour, self.template)


@contextlib.asynccontextmanager
async def _running(*agents: Node) -> AsyncIterator[None]:
    """``agents`` started (apart: through the server) and stopped in finally."""
    _apart(*agents)
    try:
        for agent in agents:
            await agent.start(auto_register=True)
        yield
    finally:
        for agent in agents:
            await agent.stop()
    for agent in agents:
        if agent.failures:
            raise agent.failures[0]


async def _until(done: Callable[[], bool], what: str, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {seconds} s")
        await asyncio.sleep(0.01)


def _jid(name: str) -> str:
    return f"{name}@{HOST}"


def _uri(name: str) -> str:
    return f"xmpp://{name}@{HOST}"


def _request(sender: str, receiver: str, conversation: str, message_id: str) -> Message:
    return Message(message_id=message_id, sender=sender, receiver=receiver, intent="REQUEST",
                   protocol="request/v1", conversation_id=conversation,
                   body=read("(request :action (action :name ping :args (:n 1)))"))


def _answer(request: Message) -> Message:
    return Message(message_id=f"done-{request.message_id}", sender=request.receiver,
                   receiver=request.sender, intent="INFORM", protocol=request.protocol,
                   conversation_id=request.conversation_id, in_reply_to=request.message_id,
                   body=read('(inform-result :action-id "a-1" :result 42)'))


def _answering(registry: Registry, *, jid_names: JidNames | None = None,
               trust: TrustStore | None = None, require_signature: bool = False,
               reply_to: bool = False, identities: list[Identity | None] | None = None
               ) -> Handle:
    """A CBCL participant: it reads each message with the adapter (the sender checked) and
    answers it with an INFORM — to the JID of the body's sender, as a handler that takes
    the body at its word does, or with ``reply_to`` to the JID the request came from."""

    async def handle(behaviour: Any, msg: Any) -> None:
        message, _ = spade_to_message(msg, jid_names=jid_names, trust=trust,
                                      require_signature=require_signature)
        validate(message, registry=registry)
        if identities is not None and trust is not None:
            identities.append(spade_identity(message, trust=trust))
        answer = _answer(message)
        await behaviour.send(message_to_spade(answer, reply_to=msg) if reply_to
                             else message_to_spade(answer))

    return handle


async def _marked(sender: Node, witness: Node) -> None:
    """Send ``witness`` a marker from ``sender`` and wait for it: whatever ``sender`` sent
    ``witness`` before (on the same stream, in order) has arrived by then."""
    await sender.behaviour.send(spade_message.Message(
        to=str(witness.jid), body="marker", metadata={"performative": "inform"}))
    await _until(lambda: any(m.body == "marker" for m in witness.inbox), "the marker")


def test_a_spoofed_sender_is_refused_logged_and_not_answered(
        xmpp_port: int, caplog: pytest.LogCaptureFixture) -> None:
    """mallory, from her own JID, sends a REQUEST whose body says alice sent it (issue
    31): bob's adapter refuses it; alice, whose own request bob answers, gets no answer
    to mallory's."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    registry = _registry()

    async def scenario() -> tuple[Node, Node]:
        alice = Node(_jid("alice"), "secret", port=xmpp_port)
        bob = Node(_jid("bob"), "secret", port=xmpp_port, handle=_answering(registry))
        mallory = Node(_jid("mallory"), "secret", port=xmpp_port)
        async with _running(alice, bob, mallory):
            own = _request(_uri("alice"), _uri("bob"), "conv-a", "req-a")
            await alice.behaviour.send(message_to_spade(own))
            await _until(lambda: len(alice.inbox) == 1, "bob's answer to alice")
            forged = _request(_uri("alice"), _uri("bob"), "conv-m", "req-m")
            await mallory.behaviour.send(message_to_spade(forged, sender=_jid("mallory")))
            await _until(lambda: bob.handled == 2, "bob reading mallory's message")
            await _marked(bob, alice)
        return alice, bob

    alice, bob = asyncio.run(scenario())
    answer, read_back = alice.inbox[0], spade_to_message(alice.inbox[0])[0]
    assert read_back == _answer(_request(_uri("alice"), _uri("bob"), "conv-a", "req-a"))
    assert [m.body for m in alice.inbox[1:]] == ["marker"]  # no answer to mallory's
    assert str(answer.sender) == _jid("bob")
    [refusal] = bob.refused
    assert isinstance(refusal, SenderMismatchError)
    assert (refusal.code, refusal.jid, refusal.claimed, refusal.allowed) == (
        "malformed", _jid("mallory"), _uri("alice"), (_uri("mallory"),))
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 1
    assert "refused message req-m" in lines[0] and _jid("mallory") in lines[0]


def test_a_jid_mapped_to_agent_names(xmpp_port: int) -> None:
    """Agents named agent://example/…: the policy maps their JIDs; answers go to the JID
    the request came from (``reply_to``); an unmapped JID cannot use a mapped name."""
    registry = _registry()
    names = {_jid("alice-map"): "agent://example/alice", _jid("bob-map"): "agent://example/bob"}
    own = _request("agent://example/alice", "agent://example/bob", "conv-1", "req-1")

    async def scenario() -> tuple[Node, Node]:
        alice = Node(_jid("alice-map"), "secret", port=xmpp_port)
        bob = Node(_jid("bob-map"), "secret", port=xmpp_port,
                   handle=_answering(registry, jid_names=names, reply_to=True))
        mallory = Node(_jid("mallory-map"), "secret", port=xmpp_port)
        async with _running(alice, bob, mallory):
            await alice.behaviour.send(message_to_spade(own, sender=_jid("alice-map"),
                                                        to=_jid("bob-map")))
            await _until(lambda: len(alice.inbox) == 1, "bob's answer")
            forged = _request("agent://example/alice", "agent://example/bob", "conv-2",
                              "req-2")
            await mallory.behaviour.send(message_to_spade(forged, sender=_jid("mallory-map"),
                                                          to=_jid("bob-map")))
            await _until(lambda: bob.handled == 2, "bob reading mallory's message")
            await _marked(bob, alice)
        return alice, bob

    alice, bob = asyncio.run(scenario())
    answer, _ = spade_to_message(alice.inbox[0], jid_names=names)
    assert answer == _answer(own)
    assert [m.body for m in alice.inbox[1:]] == ["marker"]
    [refusal] = bob.refused
    assert isinstance(refusal, SenderMismatchError)
    assert refusal.allowed == (_uri("mallory-map"),)


def _key(name: str) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(hashlib.sha256(f"spade-{name}".encode()).digest())


def test_a_forged_from_is_caught_by_the_key_binding(
        xmpp_port: int, caplog: pytest.LogCaptureFixture) -> None:
    """SPADE's embedded server forwards the ``from`` a client writes: mallory sends as
    alice's JID, so the JID check passes — and the trust store refuses her message, signed
    with her key (bound to her own name), or unsigned; alice's own signed request is
    answered, mallory's are not."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    registry = _registry()
    store = TrustStore(
        {name: _key(name).public_key() for name in ("alice", "mallory")},
        TrustPolicy.parse(f"(trust-policy (key alice (names {_uri('alice-sig')})) "
                          f"(key mallory (names {_uri('mallory-sig')})))".encode()))
    identities: list[Identity | None] = []
    own = sign_message(_request(_uri("alice-sig"), _uri("bob-sig"), "c-1", "req-1"),
                       _key("alice"), "alice")
    signed_by_mallory = sign_message(
        _request(_uri("alice-sig"), _uri("bob-sig"), "c-2", "req-m1"), _key("mallory"),
        "mallory")
    unsigned = _request(_uri("alice-sig"), _uri("bob-sig"), "c-3", "req-m2")

    async def scenario() -> tuple[Node, Node]:
        alice = Node(_jid("alice-sig"), "secret", port=xmpp_port)
        bob = Node(_jid("bob-sig"), "secret", port=xmpp_port,
                   handle=_answering(registry, trust=store, require_signature=True,
                                     identities=identities))
        mallory = Node(_jid("mallory-sig"), "secret", port=xmpp_port)
        async with _running(alice, bob, mallory):
            await alice.behaviour.send(message_to_spade(own))
            await _until(lambda: len(alice.inbox) == 1, "bob's answer")
            for forged in (signed_by_mallory, unsigned):
                # the stanza's from: the body's sender's JID, alice's
                await mallory.behaviour.send(message_to_spade(forged))
            await _until(lambda: bob.handled == 3, "bob reading mallory's messages")
            await _marked(bob, alice)
        return alice, bob

    alice, bob = asyncio.run(scenario())
    assert [str(m.sender) for m in bob.inbox] == [_jid("alice-sig")] * 3  # forged, forwarded
    fingerprint = "sha256:" + hashlib.sha256(_key("alice").public_key().public_bytes_raw()
                                             ).hexdigest()
    assert identities == [Identity("alice", fingerprint, own.sender, (_uri("alice-sig"),))]
    assert spade_to_message(alice.inbox[0])[0] == _answer(own)
    assert [m.body for m in alice.inbox[1:]] == ["marker"]
    assert [(type(e), getattr(e, "cause", None)) for e in bob.refused] == [
        (TrustError, "name-binding"), (TrustError, "unsigned")]
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 2 and "req-m1" in lines[0] and "req-m2" in lines[1]


# --------------------------------------------------------------------------- make_reply


def test_a_spade_agent_answers_with_make_reply(xmpp_port: int) -> None:
    """A plain SPADE agent answers a CBCL REQUEST the SPADE way — ``make_reply()``, which
    copies the request's metadata — once with plain text, once with a CBCL body: the CBCL
    agent reads both (the text with lossy conversion)."""
    request = _request(_uri("asker"), _uri("echo"), "conv-r", "req-r")

    async def echo(behaviour: Any, msg: Any) -> None:
        text = msg.make_reply()
        text.set_metadata("performative", "inform")
        text.body = "pong, with words"
        await behaviour.send(text)
        cbcl = msg.make_reply()  # the performative left as copied: request
        cbcl.body = _answer(spade_to_message(msg)[0]).canonical()
        await behaviour.send(cbcl)

    async def scenario() -> Node:
        asker = Node(_jid("asker"), "secret", port=xmpp_port)
        responder = Node(_jid("echo"), "secret", port=xmpp_port, handle=echo)
        async with _running(asker, responder):
            await asker.behaviour.send(message_to_spade(request))
            await _until(lambda: len(asker.inbox) == 2, "the two answers")
        return asker

    asker = asyncio.run(scenario())
    text, cbcl = asker.inbox
    assert text.get_metadata("language") == "CBCL/1.0"  # what make_reply copied
    with pytest.raises(LossyConversionError, match=r"language CBCL/1\.0"):
        spade_to_message(text)
    message, losses = spade_to_message(text, lossy=True)
    assert (message.intent, message.in_reply_to, message.conversation_id) == (
        "INFORM", "req-r", "conv-r")
    assert str(message.sender) == _uri("echo")
    assert message.body == read('(fipa-content :content "pong, with words")')
    assert any("reply-with req-r" in loss for loss in losses)
    assert cbcl.get_metadata("performative") == "request"
    answer, losses = spade_to_message(cbcl)
    assert (answer, losses) == (_answer(request), [])
    validate(answer, registry=_registry())


def test_a_cbcl_agent_answers_a_spade_request_as_make_reply_would(xmpp_port: int) -> None:
    """A plain SPADE agent asks in its own way (text, a thread, a metadata key of its own)
    and waits with a template on them; the CBCL agent's answer, made with
    ``message_to_spade(…, reply_to=request)``, matches it and reads back exactly."""
    answers: list[Message] = []

    async def answer(behaviour: Any, msg: Any) -> None:
        request, _ = spade_to_message(msg, lossy=True)
        reply = Message(message_id="ans-1", sender=request.receiver, receiver=request.sender,
                        intent="INFORM", protocol=request.protocol,
                        conversation_id=request.conversation_id,
                        in_reply_to=request.message_id, body=read("(pong)"))
        answers.append(reply)
        await behaviour.send(message_to_spade(reply, reply_to=msg))

    template = spade_template.Template(thread="t-9", metadata={"topic": "weather",
                                                                "performative": "inform"})

    async def scenario() -> Node:
        plain = Node(_jid("plain"), "secret", port=xmpp_port, template=template)
        helper = Node(_jid("helper"), "secret", port=xmpp_port, handle=answer)
        async with _running(plain, helper):
            await plain.behaviour.send(spade_message.Message(
                to=_jid("helper"), body="ping", thread="t-9",
                metadata={"performative": "request", "topic": "weather"}))
            await _until(lambda: len(plain.inbox) == 1, "the answer, through the template")
        return plain

    plain = asyncio.run(scenario())
    [reply] = plain.inbox
    assert reply.get_metadata("topic") == "weather"
    assert spade_to_message(reply) == (answers[0], [])
