"""OpenTelemetry over NATS (cbcl.net._tracing through cbcl.net._nats): the same spans as
over TCP (``receive INTENT``, ``handle INTENT``) and the context carried in the
``(trace …)`` envelope field, across two processes and a real nats-server — over a link,
and for durable (JetStream) messages and their durable replies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from nats_fixtures import NatsNode, nats_server
from test_handler_failures import Keys
from test_tracing import SERVER_TRACING

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("opentelemetry.sdk")

# The serving process: the handler module of the TCP test (the SDK set up at import, spans
# to a file), on the loop, behind an agent on the bus until its standard input closes.
SERVER = '''
import asyncio, sys
from traced import respond
from cbcl import Agent
from cbcl.net import on_loop
from cbcl.net._nats import NatsBus

async def main():
    url, mode = sys.argv[1:]
    agent = Agent("agent://test/server", trust="trust", handler=on_loop(respond),
                  descriptors=[open("cn.signed.cbcl", "rb").read()])
    bus = await NatsBus.connect(agent, url)
    await bus.serve()
    if mode == "durable":
        await bus.enable_durable()
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.read)
    await bus.close()
    await agent.close()

asyncio.run(main())
'''

# The client: the SDK's in-memory exporter, one CFP sent inside a span over NATS; its
# finished spans printed as JSON.
CLIENT = '''
import asyncio, json, sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from cbcl import Agent, Intent, Message, read
from cbcl.net._nats import NatsBus

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
key = load_pem_private_key(open("demo.key", "rb").read(), None)
url, mode = sys.argv[1:]
descriptor = open("cn.signed.cbcl", "rb").read()

async def durable():
    """A CFP stored in the server's durable stream inside the span "ask"; the server's
    durable reply, taken from this agent's own stream."""
    replies = asyncio.get_running_loop().create_future()

    def got(message, context):
        if not replies.done():
            replies.set_result(message)

    client = Agent("agent://test/client", key=("demo", key), trust="trust",
                   descriptors=[descriptor], handler=got)
    bus = await NatsBus.connect(client, url)
    try:
        await bus.enable_durable()
        with trace.get_tracer("client").start_as_current_span("ask"):
            await bus.send_durable(Message(
                message_id=bus.durable_id(), sender="agent://test/client",
                receiver="agent://test/server", intent=Intent.CFP,
                protocol="contract-net/v1", conversation_id="job-1", body=read(
                b'(cfp :task (task :id "t" :action render) :deadline 1764503600000)')),
                descriptor=descriptor)
        reply = await asyncio.wait_for(replies, 60)
        assert reply.intent is Intent.PROPOSE, reply
        return reply.trace
    finally:
        await bus.close()
        await client.close()

async def main():
    if mode == "durable":
        return await durable()
    client = Agent("agent://test/client", key=("demo", key))
    bus = await NatsBus.connect(client, url)
    try:
        link = await bus.open_link("agent://test/server",
                                   descriptor=open("cn.signed.cbcl", "rb").read())
        with trace.get_tracer("client").start_as_current_span("ask"):
            reply = await link.conversation("job-1").send(Intent.CFP, read(
                b'(cfp :task (task :id "t" :action render) :deadline 1764503600000)'),
                timeout=30)
        assert reply.intent is Intent.PROPOSE, reply
        return reply.trace
    finally:
        await bus.close()
        await client.close()

reply_trace = asyncio.run(main())
print(json.dumps({"reply_trace": reply_trace, "spans": [{
    "name": span.name, "trace": f"{span.context.trace_id:032x}",
    "span": f"{span.context.span_id:016x}",
    "parent": None if span.parent is None else f"{span.parent.span_id:016x}"}
    for span in exporter.get_finished_spans()]}))
'''


@pytest.fixture
def server() -> Iterator[NatsNode]:
    with nats_server() as node:  # (with JetStream: the durable case)
        yield node


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["link", "durable"])
def test_the_context_crosses_nats_between_two_processes(server: NatsNode, tmp_path: Path,
                                                        mode: str) -> None:
    """A client process sends a CFP inside its span ``ask`` over NATS (on a link, or
    durable) to an agent in another process: that agent's ``receive`` and ``handle`` spans
    are children of ``ask`` in its trace; the reply carries the ``handle`` span, and the
    client's ``receive`` span is its child."""
    Keys(tmp_path)
    (tmp_path / "traced.py").write_text(SERVER_TRACING)
    (tmp_path / "server.py").write_text(SERVER)
    (tmp_path / "client.py").write_text(CLIENT)
    spans_file = tmp_path / "spans.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPANS": str(spans_file)}
    serving = subprocess.Popen([sys.executable, "server.py", server.url, mode], cwd=tmp_path,
                               env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert serving.stdout is not None and serving.stdin is not None
        assert serving.stdout.readline().strip() == "ready"
        done = subprocess.run([sys.executable, "client.py", server.url, mode], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120, env=env,
                              check=False)
        assert done.returncode == 0, done.stderr
        _, errors = serving.communicate("", timeout=60)
    finally:
        if serving.poll() is None:
            serving.kill()
            serving.wait()
    assert serving.returncode == 0, errors
    assert "Traceback" not in errors, errors
    client = json.loads(done.stdout)
    spans = [json.loads(line) for line in spans_file.read_text().splitlines()]
    (ask,) = [s for s in client["spans"] if s["name"] == "ask"]
    assert ask["parent"] is None
    received = [s for s in spans if s["name"] == "receive CFP"]
    handled = [s for s in spans if s["name"] == "handle CFP"]
    assert len(received) == len(handled) == 1
    for span in (*received, *handled):
        assert span["trace"] == ask["trace"] and span["parent"] == ask["span"]
    assert handled[0]["attributes"]["messaging.message.conversation_id"] == "job-1"
    assert handled[0]["attributes"]["cbcl.protocol"] == "contract-net/v1"
    assert client["reply_trace"][:52] == f"00-{ask['trace']}-{handled[0]['span']}"
    (answer,) = [s for s in client["spans"] if s["name"] == "receive PROPOSE"]
    assert answer["trace"] == ask["trace"] and answer["parent"] == handled[0]["span"]
