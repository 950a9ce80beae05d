"""The SPADE adapter (cbcl.bridges._spade) through a real XMPP server: SPADE's embedded one
(``spade run``) in a subprocess, a CBCL agent and a SPADE agent that uses
spade-fipaproto's Request protocol (AchieveREResponder), completing a request/v1
conversation (REQUEST → AGREE → INFORM), every message checked by both passes and by the
protocol's conversation.

Uses one internal: the adapter's ``jid_to_uri``, so the CBCL agent names itself as the
adapter names its peer."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from processes import stop_process

from cbcl import Message, Registry, Symbol, read, validate
from cbcl.conversation import ConversationTracker
from cbcl.interop import ConversionError, LossyConversionError

# the fipa extra (in the test extra: CI); Any: SPADE ships no types, and a module object
# does not type its attributes (the classes derived from SPADE's are marked where they are)
spade_agent: Any = pytest.importorskip("spade.agent")
spade_behaviour: Any = pytest.importorskip("spade.behaviour")
spade_message: Any = pytest.importorskip("spade.message")
fipaproto: Any = pytest.importorskip("spade_fipaproto")

from cbcl.bridges._spade import jid_to_uri  # noqa: E402
from cbcl.interop import message_to_spade, spade_to_message  # noqa: E402

ROOT = Path(__file__).parent.parent
HOST = "127.0.0.1"
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@pytest.fixture
def xmpp_port(tmp_path: Path) -> Iterator[int]:
    """SPADE's embedded XMPP server on free loopback ports, stopped in finally."""
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
