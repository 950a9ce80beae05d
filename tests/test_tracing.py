"""The (trace …) envelope field (spec/cbcl-1.0.md §2.3) and the OpenTelemetry integration
(cbcl.net._tracing): the field's syntax at its size limit (55 accepted, 54 and 56 refused)
on every path (text, binary, JSON, the constructor), its round trips, its place under the
signature, the C walks held to their Python twins, and spans across two processes."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings, strategies as st
from strategies import messages, traces
from test_codec import both, registry  # noqa: F401  (the fixture)
from test_handler_failures import Keys, ServeProcess

import cbcl
from cbcl import (
    CBCLError,
    Decoder,
    EnvelopeError,
    LimitError,
    Limits,
    Message,
    Registry,
    decode,
    encode,
)
from cbcl.binary._codec import HAS_TRACE, HEADER_BYTES
from cbcl.core._limits import DEFAULT_LIMITS
from cbcl.core._reader import read_value_at
from cbcl.net import _tracing
from cbcl.protocol._envelope import message_of, message_of_python, parse_envelope
from cbcl.protocol._json import message_from_json, message_to_json
from cbcl.protocol._message import TRACE_CHARS, is_traceparent
from cbcl.protocol._trust import TrustStore, sign_message

TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
# Each one character off a traceparent: too short, too long, upper case, another version,
# an all-zero trace id, an all-zero parent id, a separator missing, a non-hex digit.
NOT_TRACES = (TRACE[:-1], TRACE + "0", TRACE + "-00", TRACE.upper(), "01" + TRACE[2:],
              "ff" + TRACE[2:], TRACE[:3] + "0" * 32 + TRACE[35:],
              TRACE[:36] + "0" * 16 + TRACE[52:], TRACE.replace("-", "_", 1),
              TRACE[:-1] + "g", "", " " + TRACE[1:])


def message(**fields: Any) -> Message:
    base: dict[str, Any] = dict(message_id="m-1", sender="agent://a", receiver="agent://b",
                                intent="INFORM", protocol="any/v1", body=(cbcl.Symbol("x"),))
    return Message(**(base | fields))


def text_with(trace: str) -> str:
    return ('(CBCL/1.0 (message-id "m-1") (sender agent://a) (receiver agent://b) '
            f'(intent INFORM) (protocol any/v1) (trace "{trace}") (body (x)))')


# --------------------------------------------------------------------------- the syntax


def test_the_limit_is_55_characters() -> None:
    assert len(TRACE) == TRACE_CHARS == 55 and is_traceparent(TRACE)
    assert parse_envelope(text_with(TRACE), DEFAULT_LIMITS).trace == TRACE  # N: accepted
    for bad in (TRACE + "0", TRACE[:-1]):  # N+1 and N-1: refused
        with pytest.raises(EnvelopeError, match="trace must be a W3C traceparent"):
            parse_envelope(text_with(bad), DEFAULT_LIMITS)


@pytest.mark.parametrize("bad", NOT_TRACES)
def test_anything_but_a_version_00_traceparent_is_refused(bad: str) -> None:
    assert not is_traceparent(bad)
    with pytest.raises(ValueError, match="trace must be a W3C traceparent"):
        message(trace=bad)
    with pytest.raises(EnvelopeError) as refused:
        parse_envelope(text_with(bad), DEFAULT_LIMITS)
    assert refused.value.position is not None  # at the string
    json_object = message_to_json(message(trace=TRACE)) | {"trace": bad}
    with pytest.raises(cbcl.MalformedError, match="trace"):
        message_from_json(json_object)
    value, _, _ = read_value_at(text_with(bad), 0, DEFAULT_LIMITS, 0, 0, None)
    assert message_of_python(value) is None and message_of(value) is None


def test_the_field_has_its_place_between_timestamp_and_body() -> None:
    for misplaced in (
        '(CBCL/1.0 (message-id "m") (sender a://b) (receiver a://c) (intent INFORM) '
        f'(protocol any/v1) (trace "{TRACE}") (timestamp 1))',
        '(CBCL/1.0 (message-id "m") (sender a://b) (receiver a://c) (intent INFORM) '
        f'(protocol any/v1) (body 1) (trace "{TRACE}"))',
        '(CBCL/1.0 (message-id "m") (sender a://b) (receiver a://c) (intent INFORM) '
        f'(protocol any/v1) (trace "{TRACE}") (trace "{TRACE}"))',
        '(CBCL/1.0 (message-id "m") (sender a://b) (receiver a://c) (intent INFORM) '
        '(protocol any/v1) (trace-id "x"))',
        '(CBCL/1.0 (message-id "m") (sender a://b) (receiver a://c) (intent INFORM) '
        "(protocol any/v1) (trace abc))",
    ):
        with pytest.raises(EnvelopeError):
            parse_envelope(misplaced, DEFAULT_LIMITS)


def test_a_message_without_the_field_is_written_as_before() -> None:
    # (spec/vectors hold frames and texts of untraced messages: test_spec_vectors checks
    # them byte for byte; this is the same for the shapes every path writes)
    plain = message(timestamp=7)
    assert plain.trace is None
    assert plain.canonical() == (
        '(CBCL/1.0 (message-id "m-1") (sender agent://a) (receiver agent://b) '
        "(intent INFORM) (protocol any/v1) (timestamp 7) (body (x)))")
    assert "trace" not in message_to_json(plain)
    traced = dataclasses.replace(plain, trace=TRACE)
    assert traced.canonical() == plain.canonical()[:-len(" (body (x)))")] + \
        f' (trace "{TRACE}") (body (x)))'


# --------------------------------------------------------------------------- round trips


@settings(max_examples=20)
@given(messages)
def test_text_json_and_the_c_walk_round_trip_the_field(m: Message) -> None:
    text = m.canonical()
    back = parse_envelope(text, DEFAULT_LIMITS)
    assert back == m and back.trace == m.trace
    assert message_from_json(message_to_json(m)) == m
    value, _, _ = read_value_at(text, 0, DEFAULT_LIMITS, 0, 0, None)
    assert message_of(value) == message_of_python(value) == m


@settings(max_examples=25)
@given(trace=st.none() | traces, timestamp=st.none() | st.integers(0, 2**40),
       signed=st.booleans())
def test_binary_round_trips_the_field(registry: Registry, trace: str | None,  # noqa: F811
                                      timestamp: int | None, signed: bool) -> None:
    m = message(trace=trace, timestamp=timestamp)
    if signed:
        m = sign_message(m, Ed25519PrivateKey.generate(), "k")
    frame = encode(m, registry=registry)
    assert both(registry, frame) == m  # C msgpack, pure Python, a warm decoder agree
    assert decode(frame, registry=registry).canonical() == m.canonical()
    assert encode(cbcl.parse(m.canonical(), registry=registry), registry=registry) == frame
    present = frame[HEADER_BYTES + 1]  # (the intent's index, then the presence bits)
    assert bool(present & HAS_TRACE) == (trace is not None)
    if trace is not None:
        assert trace.encode() in frame


def test_a_bad_trace_in_a_frame_is_refused_where_it_is(registry: Registry) -> None:  # noqa: F811
    frame = encode(message(trace=TRACE), registry=registry)
    for bad in (TRACE.upper(), "01" + TRACE[2:]):
        forged = frame.replace(TRACE.encode(), bad.encode())
        with pytest.raises(EnvelopeError, match="trace") as refused:
            decode(forged, registry=registry)
        assert refused.value.offset == frame.index(TRACE.encode()) - 2  # (its str8 header)
        assert both(registry, forged) is EnvelopeError
    # 56 characters: one more than the limit
    longer = frame.replace(b"\xd9\x37" + TRACE.encode(), b"\xd9\x38" + TRACE.encode() + b"0")
    assert longer != frame
    assert both(registry, longer) is EnvelopeError


# --------------------------------------------------------------------------- signatures


def test_the_signature_covers_the_trace() -> None:
    key = Ed25519PrivateKey.generate()
    store = TrustStore({"k": key.public_key()})
    signed = sign_message(message(trace=TRACE), key, "k")
    assert TRACE.encode() in signed.signing_bytes()
    assert store.verify_message(signed) == "k"
    other = "00-" + "1" * 32 + TRACE[35:]
    with pytest.raises(cbcl.TrustError):
        store.verify_message(dataclasses.replace(signed, trace=other))
    with pytest.raises(cbcl.TrustError):
        store.verify_message(dataclasses.replace(signed, trace=None))
    # and a signature made without a trace does not stand for a message with one
    plain = sign_message(message(), key, "k")
    with pytest.raises(cbcl.TrustError):
        store.verify_message(dataclasses.replace(plain, trace=TRACE))


def test_copy_and_pickle_keep_the_field() -> None:

    m = message(trace=TRACE)
    assert copy.copy(m).trace == pickle.loads(pickle.dumps(m)).trace == TRACE
    assert CBCLError is not None


# --------------------------------------------------------------------------- spans, in process


def local_tracer() -> tuple[Any, Any]:
    """A tracer of a provider of this test's own (never the process's global one, which
    would trace every later test's agents) and its in-memory exporter."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test"), exporter


def test_a_message_sent_in_a_span_carries_its_context() -> None:

    tracer, _ = local_tracer()
    plain = message()
    assert _tracing.with_current_trace(plain) is plain  # no current span: no field
    with tracer.start_as_current_span("client") as span:
        assert _tracing.outgoing(plain) is plain  # no provider set here: tracing is off
        sent = _tracing.with_current_trace(plain)
        context = span.get_span_context()
        assert sent.trace == (f"00-{context.trace_id:032x}-{context.span_id:016x}-"
                              f"{int(context.trace_flags):02x}")
        assert dataclasses.replace(sent, trace=None) == plain
        assert _tracing.with_current_trace(sent) is sent  # a trace already: kept
        signed = sign_message(plain, Ed25519PrivateKey.generate(), "k")
        assert _tracing.with_current_trace(signed) is signed  # the signature covers it


def test_spans_name_the_message_and_escape_what_the_peer_wrote() -> None:


    tracer, exporter = local_tracer()
    hostile = "m\n\x1b[31m" + "x" * 500
    received = message(message_id=hostile, conversation_id="c\u202e1", trace=TRACE)

    async def work() -> str:
        return _tracing.traceparent_of() or ""

    inner = asyncio.run(_tracing.handling(tracer, work(), received, "10.0.0.1:5\n"))
    asyncio.run(_tracing.receiving(tracer, work(), message(), "10.0.0.1:5"))
    handled, root = exporter.get_finished_spans()
    assert handled.name == "handle INFORM" and root.name == "receive INFORM"
    assert handled.parent is not None and handled.parent.is_remote
    assert f"{handled.parent.trace_id:032x}" == TRACE[3:35]
    assert f"{handled.parent.span_id:016x}" == TRACE[36:52]
    assert inner[3:35] == TRACE[3:35] and inner[36:52] != TRACE[36:52]  # the handle span
    assert root.parent is None  # an untraced message: a root span
    attributes = dict(handled.attributes or {})
    assert attributes["cbcl.intent"] == "INFORM" and attributes["cbcl.protocol"] == "any/v1"
    for name in ("messaging.message.id", "messaging.message.conversation_id",
                 "network.peer.address"):
        text = str(attributes[name])
        assert text.isprintable() and len(text) <= _tracing.MAX_ATTRIBUTE_CHARS + 8, text
    assert str(attributes["messaging.message.id"]).startswith("m\\u000a")


# --------------------------------------------------------------------------- two processes

# The server's handler module: the SDK set up at import, each finished span written to a
# file as one JSON line (its exporter), then a contract-net handler that proposes.
SERVER_TRACING = '''
import json, os
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from cbcl import Intent, Keyword, Symbol

class Lines(SpanExporter):
    def export(self, spans):
        with open(os.environ["SPANS"], "a") as out:
            for span in spans:
                out.write(json.dumps({
                    "name": span.name, "trace": f"{span.context.trace_id:032x}",
                    "span": f"{span.context.span_id:016x}",
                    "parent": None if span.parent is None else f"{span.parent.span_id:016x}",
                    "attributes": dict(span.attributes)}) + "\\n")
        return SpanExportResult.SUCCESS

provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(Lines()))
trace.set_tracer_provider(provider)

def respond(message, context):
    return context.reply(Intent.PROPOSE, (Symbol("proposal"), Keyword("task-id"), "t",
                                          Keyword("bid"), (Symbol("bid"), Keyword("price"), 1,
                                                           Keyword("currency"), Symbol("EUR"))))
'''

# The client: an agent with the SDK's in-memory exporter, one CFP sent inside a span; its
# finished spans printed as JSON.
CLIENT_TRACING = '''
import asyncio, json, sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from cbcl import Agent, Intent, read

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
address, = sys.argv[1:]
key = load_pem_private_key(open("demo.key", "rb").read(), None)

async def main():
    client = Agent("agent://test/client", key=("demo", key))
    try:
        link = await client.connect(address, peer="agent://test/server",
                                    descriptor=open("cn.signed.cbcl", "rb").read())
        with trace.get_tracer("client").start_as_current_span("ask"):
            reply = await link.conversation("job-1").send(Intent.CFP, read(
                b'(cfp :task (task :id "t" :action render) :deadline 1764503600000)'),
                timeout=30)
        assert reply.intent is Intent.PROPOSE, reply
        return reply.trace
    finally:
        await client.close()

reply_trace = asyncio.run(main())
print(json.dumps({"reply_trace": reply_trace, "spans": [{
    "name": span.name, "trace": f"{span.context.trace_id:032x}",
    "span": f"{span.context.span_id:016x}",
    "parent": None if span.parent is None else f"{span.parent.span_id:016x}"}
    for span in exporter.get_finished_spans()]}))
'''


@pytest.mark.slow
def test_the_context_crosses_the_wire_between_two_processes(tmp_path: Path) -> None:
    """A client process sends a CFP inside its span ``ask`` to a real ``cbcl serve
    --handler`` process: the server's ``receive`` and ``handle`` spans are children of
    ``ask`` in its trace; the reply carries the ``handle`` span, and the client's
    ``receive`` span is its child."""


    keys = Keys(tmp_path)
    (tmp_path / "traced.py").write_text(SERVER_TRACING)
    (tmp_path / "client.py").write_text(CLIENT_TRACING)
    spans_file = tmp_path / "spans.jsonl"

    os.environ["SPANS"] = str(spans_file)  # (ServeProcess passes its environment on)
    try:
        serve = ServeProcess(keys, "--handler", "traced:respond")
    finally:
        del os.environ["SPANS"]
    try:
        done = subprocess.run([sys.executable, "client.py", serve.address], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120, env=serve.env,
                              check=False)
        assert done.returncode == 0, done.stderr
        serve.wait_for("sent ")  # the reply went: its handle span has ended
    finally:
        assert serve.stop() == ""
    client = json.loads(done.stdout)
    server = [json.loads(line) for line in spans_file.read_text().splitlines()]
    (ask,) = [s for s in client["spans"] if s["name"] == "ask"]
    assert ask["parent"] is None
    received = [s for s in server if s["name"] == "receive CFP"]
    handled = [s for s in server if s["name"] == "handle CFP"]
    assert len(received) == len(handled) == 1
    for span in (*received, *handled):
        assert span["trace"] == ask["trace"] and span["parent"] == ask["span"]
    assert handled[0]["attributes"]["messaging.message.conversation_id"] == "job-1"
    assert handled[0]["attributes"]["cbcl.protocol"] == "contract-net/v1"
    assert client["reply_trace"][:52] == f"00-{ask['trace']}-{handled[0]['span']}"
    (answer,) = [s for s in client["spans"] if s["name"] == "receive PROPOSE"]
    assert answer["trace"] == ask["trace"] and answer["parent"] == handled[0]["span"]


def test_the_field_counts_against_max_string_bytes(registry: Registry) -> None:  # noqa: F811
    """A trace is a string like any other: under ``max_string_bytes`` 55 it is read, under
    54 refused as a limit, by text and by every binary decoder alike."""

    frame = encode(message(trace=TRACE), registry=registry)
    for maximum, accepted in ((55, True), (54, False)):
        limits = Limits(max_string_bytes=maximum)
        if accepted:
            assert parse_envelope(text_with(TRACE), limits).trace == TRACE
            assert both(registry, frame, limits).trace == TRACE
        else:
            with pytest.raises(LimitError):
                parse_envelope(text_with(TRACE), limits)
            assert both(registry, frame, limits) is LimitError
            with pytest.raises(LimitError):
                Decoder(registry, limits=limits).decode(frame)


WITHOUT_OTEL = '''
import sys
sys.modules["opentelemetry"] = None  # as if the otel extra were not installed
import cbcl
from cbcl.net import _tracing
assert _tracing.otel is None and _tracing.active_tracer() is None
m = cbcl.Message(message_id="m", sender="a://b", receiver="a://c", intent="INFORM",
                 protocol="any/v1")
assert _tracing.outgoing(m) is m
print("untraced")
'''


def test_without_the_api_nothing_is_imported_or_added() -> None:
    done = subprocess.run([sys.executable, "-c", WITHOUT_OTEL], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0 and done.stdout == "untraced\n", done.stderr
