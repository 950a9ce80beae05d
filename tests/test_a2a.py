"""CBCL ⇄ A2A with the real a2a-sdk types (cbcl/bridges/_a2a.py, spec/interop.md §4): the
text part is authoritative, the JSON part informative; losses are listed and refused unless
lossy; hostile A2A input gives a CBCLError and nothing else.

Tests internals too: the adapter's constants (media types, extension URI, depth cap) and
``cbcl_text``, which a server reads a message's conversation with."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from a2a.compat.v0_3 import conversions
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentExtension,
    Message as A2AMessage,
    Part,
    Role,
    TaskState,
)
from google.protobuf import json_format, struct_pb2
from hypothesis import given, strategies as st

from cbcl import (
    CBCLError,
    LimitError,
    Limits,
    MalformedError,
    Message,
    ProtocolError,
    Registry,
    SchemaError,
    parse,
)
from cbcl.bridges._a2a import (
    DATA_MEDIA_TYPE,
    EXTENSION_URI,
    MAX_DATA_DEPTH,
    MEDIA_TYPE,
    TASK_STATES,
    TRACEPARENT,
    cbcl_text,
)
from cbcl.cli import main
from cbcl.conversation import ConversationTracker
from cbcl.interop import (
    LossyConversionError,
    a2a_json_to_message,
    a2a_to_message,
    agent_card_extension,
    card_protocols,
    message_to_a2a,
    message_to_a2a_json,
    read_a2a,
    task_state,
    write_a2a,
)

ROOT = Path(__file__).parent.parent
DESCRIPTORS = [ROOT / "descriptors" / name
               for name in ("request-v1.cbcl", "contract-net-v1.cbcl")]

REQUEST_TEXT = (
    '(CBCL/1.0 (message-id "m-1") (sender agent://ops/planner) (receiver agent://ops/backup) '
    '(intent REQUEST) (protocol request/v1) (conversation-id "c-1") (reply-by 1764499060000) '
    '(body (request :action (action :name backup :args (:size 1800000 :ratio 0.5 '
    ':big 9007199254740993 :to agent://x :tag "t")))))')


@pytest.fixture(scope="module")
def registry() -> Registry:
    reg = Registry(disk_cache=False, isolate=False)
    for path in DESCRIPTORS:
        reg.load(path.read_bytes(), allow_unsigned=True)
    return reg


@pytest.fixture(scope="module")
def request_message(registry: Registry) -> Message:
    return parse(REQUEST_TEXT, registry=registry)


def inform(body: str, intent: str = "INFORM", mid: str = "m-2") -> str:
    return (f'(CBCL/1.0 (message-id "{mid}") (sender agent://ops/backup) '
            f'(receiver agent://ops/planner) (intent {intent}) (protocol request/v1) '
            f'(conversation-id "c-1") (in-reply-to "m-1") (body {body}))')


# --------------------------------------------------------------------------- the mapping


def test_object_round_trip_text_authoritative(request_message: Message,
                                              registry: Registry) -> None:
    a2a = message_to_a2a(request_message)
    assert isinstance(a2a, A2AMessage)
    assert a2a.message_id == "m-1" and a2a.context_id == "c-1"
    assert a2a.role == Role.ROLE_USER
    assert list(a2a.extensions) == [EXTENSION_URI]
    text_part, data_part = a2a.parts
    assert text_part.media_type == MEDIA_TYPE
    assert text_part.text == request_message.canonical()
    assert data_part.media_type == DATA_MEDIA_TYPE
    assert json_format.MessageToDict(data_part.metadata)["cbcl"] == "informative"
    assert a2a_to_message(a2a, registry=registry) == request_message
    assert a2a_to_message(a2a) == request_message  # pass 1 alone


def test_json_part_does_not_round_trip_but_is_no_mismatch(request_message: Message) -> None:
    text, losses = message_to_a2a_json(request_message)
    assert losses == []
    assert "\n" not in text
    document = json.loads(text)
    data = document["parts"][1]["data"]
    assert list(data) == ["version", "message-id", "sender", "receiver", "intent",
                          "protocol", "conversation-id", "reply-by", "body"]
    args = data["body"][2][4]
    assert args[1] == 1800000.0 and isinstance(args[1], float)  # protobuf Value: a double
    assert args[5] == {"int": "9007199254740993"}  # beyond 2**53: the exact tagged form
    assert data["reply-by"] == 1764499060000.0
    message, losses = a2a_json_to_message(text)
    assert message == request_message and losses == []
    # Same message, same text.
    assert message_to_a2a_json(request_message)[0] == text
    # The SDK's own parser reads it.
    assert json_format.Parse(text, A2AMessage()).parts[0].text == request_message.canonical()


def test_roles_follow_the_intent(registry: Registry) -> None:
    reply = parse(inform('(inform-result :action-id "a-1" :result 3)'), registry=registry)
    assert message_to_a2a(reply).role == Role.ROLE_AGENT
    assert message_to_a2a(reply, role=Role.ROLE_USER).role == Role.ROLE_USER
    assert a2a_to_message(message_to_a2a(reply, role=Role.ROLE_USER)) == reply


def test_pass_two_and_schema_run_on_the_text_part(registry: Registry) -> None:
    a2a = message_to_a2a(parse(inform('(inform-done :action-id "x")'), registry=registry))
    a2a.parts[0].text = inform('(inform-done :action-id "")')  # schema: min-length 1
    a2a.parts.pop()  # (the data part would now differ)
    with pytest.raises(SchemaError):
        a2a_to_message(a2a, registry=registry)
    a2a.parts[0].text = inform("(inform-done)")
    with pytest.raises(CBCLError) as info:
        a2a_to_message(a2a, registry=registry)
    assert info.value.kind == "body"


def test_signature_is_carried(registry: Registry) -> None:
    signed = REQUEST_TEXT[:-1] + ' (signature "k1" "c2lnbmF0dXJl"))'
    message = parse(signed, envelope_only=True)
    back, losses = a2a_json_to_message(message_to_a2a_json(message)[0])
    assert back.signature == message.signature and losses == []


TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
OTHER_TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_the_trace_is_the_metadata_traceparent(request_message: Message) -> None:
    """The (trace …) field is also the message metadata's traceparent (spec/interop.md
    §4.1), read back without loss, in the SDK's JSON too; a message without one has no
    metadata."""
    assert not message_to_a2a(request_message).HasField("metadata")
    traced = dataclasses.replace(request_message, trace=TRACE)
    a2a = message_to_a2a(traced)
    assert json_format.MessageToDict(a2a.metadata) == {TRACEPARENT: TRACE}
    assert read_a2a(a2a) == (traced, [])
    text = message_to_a2a_json(traced)[0]
    assert json.loads(text)["metadata"] == {"traceparent": TRACE}
    assert a2a_json_to_message(text) == (traced, [])


def test_an_a2a_peers_traceparent_is_taken_into_an_untraced_message(
        request_message: Message) -> None:
    """An A2A peer that propagates a trace context writes it in the message metadata: a
    message without a trace (and without a signature) takes it; a different one, one that
    is not a traceparent, or one for a signed message is a loss, the text kept."""
    a2a = message_to_a2a(request_message)
    a2a.metadata.update({TRACEPARENT: TRACE})
    assert read_a2a(a2a) == (dataclasses.replace(request_message, trace=TRACE), [])
    as_json = json.dumps(json_format.MessageToDict(a2a))
    assert a2a_json_to_message(as_json)[0].trace == TRACE
    traced = message_to_a2a(dataclasses.replace(request_message, trace=OTHER_TRACE))
    traced.metadata.update({TRACEPARENT: TRACE})
    with pytest.raises(LossyConversionError, match="differs from the text's trace"):
        read_a2a(traced)
    assert read_a2a(traced, lossy=True)[0].trace == OTHER_TRACE
    for bad in (TRACE.upper(), TRACE + "0", 5):
        a2a.metadata.update({TRACEPARENT: bad})
        message, losses = read_a2a(a2a, lossy=True)
        assert message.trace is None and "not a W3C traceparent" in losses[0]
    signed = parse(REQUEST_TEXT[:-1] + ' (signature "k1" "c2lnbmF0dXJl"))',
                   envelope_only=True)
    carrier = message_to_a2a(signed)
    carrier.metadata.update({TRACEPARENT: TRACE, "other": "x"})
    message, losses = read_a2a(carrier, lossy=True)
    assert message == signed and message.trace is None
    assert "signed" in losses[0] and "message metadata (1 key(s))" in losses[1]


# --------------------------------------------------------------------------- losses


def test_losses_are_listed_and_refused_unless_lossy(request_message: Message) -> None:
    a2a = message_to_a2a(request_message)
    a2a.reference_task_ids.append("task-1")
    a2a.extensions.append("https://example.org/other")
    a2a.metadata.update({"trace": "x"})
    a2a.parts.append(Part(text="hello", media_type="text/plain"))
    a2a.parts.append(Part(url="https://example.org/f", media_type="image/png"))
    with pytest.raises(LossyConversionError, match="would lose"):
        a2a_to_message(a2a)
    message, losses = read_a2a(a2a, lossy=True)
    assert message == request_message
    joined = "\n".join(losses)
    for expected in ("referenceTaskIds", "extension URI", "metadata",
                     "parts[2]: a text part (text/plain)", "parts[3]: a url part"):
        assert expected in joined
    text = json.dumps(json_format.MessageToDict(a2a))
    with pytest.raises(ProtocolError):
        a2a_json_to_message(text)
    assert a2a_json_to_message(text, lossy=True)[1] == losses


def test_a_context_and_data_part_that_differ_are_reported(request_message: Message) -> None:
    a2a = message_to_a2a(request_message)
    a2a.context_id = "other-context"
    a2a.parts[1].data.list_value.values.add().string_value = "x"  # no longer the mapping
    message, losses = read_a2a(a2a, lossy=True)
    assert message.conversation_id == "c-1"  # the text part wins
    assert len(losses) == 2
    assert "contextId" in losses[0] and "differs from the text part" in losses[1]
    a2a.parts.pop()
    with pytest.raises(LossyConversionError, match="contextId"):
        read_a2a(a2a)


def test_ids_a2a_assigns_are_accepted(request_message: Message) -> None:
    """A server stamps a taskId on every message it receives, an SDK client makes a uuid
    messageId of its own, and a server makes a contextId for a message that has no
    conversation: none of them is a loss (spec/interop.md §4.2)."""
    a2a = message_to_a2a(request_message)
    a2a.task_id = "0b3c2d5e-1f2a-4b6c-8d9e-0f1a2b3c4d5e"
    a2a.message_id = "9f1c7a52-3e4b-4c8d-a6f0-1b2c3d4e5f60"
    assert read_a2a(a2a) == (request_message, [])
    a2a.message_id = "client-7"  # any id of the carrier, not only a uuid
    assert read_a2a(a2a) == (request_message, [])
    loose = parse(REQUEST_TEXT.replace(' (conversation-id "c-1")', ""), envelope_only=True)
    carried = message_to_a2a(loose)
    assert carried.context_id == ""
    carried.context_id = "server-made-context"
    assert read_a2a(carried) == (loose, [])


def test_no_cbcl_part_or_two_are_malformed(request_message: Message) -> None:
    a2a = A2AMessage(message_id="x", parts=[Part(text="hi", media_type="text/plain")])
    with pytest.raises(MalformedError, match="no application/cbcl text part"):
        read_a2a(a2a, lossy=True)
    a2a = message_to_a2a(request_message)
    a2a.parts.append(Part(text=request_message.canonical(), media_type=MEDIA_TYPE))
    with pytest.raises(MalformedError, match="2 application/cbcl text parts"):
        read_a2a(a2a, lossy=True)
    a2a = message_to_a2a(request_message)
    a2a.parts[0].text = "(not cbcl"
    with pytest.raises(MalformedError):
        read_a2a(a2a, lossy=True)


def _nested(depth: int) -> Message:
    body: object = "x"
    for _ in range(depth):
        body = [body]
    return Message(message_id="d", sender="agent://a", receiver="agent://b",
                   intent="INFORM", protocol="p", body=body)  # type: ignore[arg-type]


def test_a_body_too_deep_for_protobuf_leaves_the_data_part_out() -> None:
    # The message's JSON object is one level, the body's lists the rest.
    fits, deep = _nested(MAX_DATA_DEPTH - 1), _nested(MAX_DATA_DEPTH)
    text, losses = message_to_a2a_json(fits)
    assert losses == [] and a2a_json_to_message(text) == (fits, [])
    with pytest.raises(ProtocolError, match="data part: left out"):
        message_to_a2a(deep)
    a2a, losses = write_a2a(deep, lossy=True)
    assert len(a2a.parts) == 1 and "recursion limit" in losses[0]
    text, _ = message_to_a2a_json(deep, lossy=True)
    assert a2a_json_to_message(text) == (deep, [])
    # The boundary is real: one level more than MAX_DATA_DEPTH cannot be read back.
    value = json_format.ParseDict(_nest_json(MAX_DATA_DEPTH + 1), struct_pb2.Value())
    too_deep = json_format.MessageToJson(A2AMessage(message_id="d", parts=[Part(data=value)]))
    with pytest.raises(json_format.ParseError):
        json_format.Parse(too_deep, A2AMessage())


def _nest_json(depth: int) -> object:
    value: object = "x"
    for _ in range(depth):
        value = [value]
    return value


# --------------------------------------------------------------------------- A2A 0.3


def _v03_json(message: Message) -> dict[str, object]:
    """The A2A 0.3 JSON of ``message``, as the SDK's own conversion writes it for a 0.3
    peer (``a2a.compat.v0_3``)."""
    compat = conversions.to_compat_message(message_to_a2a(message))
    document: dict[str, object] = json.loads(compat.model_dump_json(by_alias=True,
                                                                    exclude_none=True))
    return document


def test_the_a2a_0_3_form_is_read(request_message: Message, registry: Registry) -> None:
    document: dict[str, Any] = _v03_json(request_message)
    assert document["kind"] == "message" and document["role"] == "user"
    text_part, data_part = document["parts"]
    assert text_part["kind"] == "text" and "mediaType" not in text_part  # 0.3 has none
    assert data_part["kind"] == "data"
    text = json.dumps(document)
    assert a2a_json_to_message(text, registry=registry) == (request_message, [])
    assert a2a_json_to_message(text.encode()) == (request_message, [])
    # A 0.3 peer's own form: a file with bytes and mimeType, a uuid messageId, no data part.
    canonical_text = request_message.canonical().encode()
    sent = {"kind": "message", "messageId": "6c1f6f5e-9a43-4f7e-8b53-1d9e2b0c7a11",
            "role": "user", "contextId": "c-1", "taskId": "t-17",
            "parts": [{"kind": "file", "file": {
                "bytes": base64.b64encode(canonical_text).decode(),
                "mimeType": "application/cbcl"}}]}
    assert a2a_json_to_message(json.dumps(sent), registry=registry) == (request_message, [])
    # A text part that nothing marks as CBCL is no CBCL text part.
    sent["parts"] = [{"kind": "text", "text": request_message.canonical()}]
    with pytest.raises(MalformedError, match="no application/cbcl text part"):
        a2a_json_to_message(json.dumps(sent), lossy=True)


def test_cbcl_convert_reads_the_0_3_form(request_message: Message, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "m.json").write_text(json.dumps(_v03_json(request_message)))
    assert main(["convert", "--from", "a2a", "--to", "cbcl", str(tmp_path / "m.json")]) == 0
    assert capsys.readouterr().out == request_message.canonical() + "\n"


@pytest.mark.parametrize("change", [
    lambda d: d["parts"][0].__setitem__("mimeType", "application/cbcl"),  # not in 0.3
    lambda d: d.__setitem__("message_id", d.pop("messageId")),  # snake_case: not the wire
    lambda d: d.__setitem__("role", "ROLE_USER"),
    lambda d: d.__setitem__("kind", "task"),
    lambda d: d["parts"][0].__setitem__("kind", "file"),
    lambda d: d.__setitem__("unknown", 1),
])
def test_a2a_0_3_is_read_strictly(request_message: Message,
                                  change: Callable[[dict[str, Any]], object]) -> None:
    document: dict[str, Any] = _v03_json(request_message)
    change(document)
    with pytest.raises(MalformedError, match=r"A2A 0\.3 Message"):
        a2a_json_to_message(json.dumps(document), lossy=True)


def test_raw_cbcl_bytes_must_be_utf8(request_message: Message) -> None:
    a2a = message_to_a2a(request_message)
    a2a.parts[0].ClearField("text")
    a2a.parts[0].raw = b"\xff(CBCL/1.0"
    with pytest.raises(MalformedError, match="not UTF-8"):
        read_a2a(a2a, lossy=True)
    assert cbcl_text(a2a) is None
    a2a.parts[0].raw = request_message.canonical().encode()
    assert cbcl_text(a2a) == request_message.canonical()
    assert read_a2a(a2a) == (request_message, [])


V03_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=12)
    | st.sampled_from(["message", "text", "data", "file", "user", "agent",
                       "application/cbcl", "QUJD", "=="]),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.sampled_from(["kind", "messageId", "role", "parts", "text", "data",
                                       "file", "bytes", "uri", "mimeType", "name",
                                       "metadata", "contextId", "taskId", "extensions",
                                       "referenceTaskIds"]),
                      children, max_size=6),
    max_leaves=24)


@given(V03_VALUES)
def test_fuzz_any_0_3_shaped_json_gives_a_result_or_a_cbcl_error(value: object) -> None:
    document = {"kind": "message", "value": value} if not isinstance(value, dict) else value
    with contextlib.suppress(CBCLError):
        a2a_json_to_message(json.dumps(document), lossy=True)


# --------------------------------------------------------------------------- hostile input


def test_size_is_bounded_before_parsing(request_message: Message) -> None:
    small = Limits(max_message_bytes=1024)
    huge = " " * (4 * 1024 + 65 * 1024)
    with pytest.raises(LimitError):
        a2a_json_to_message(huge, limits=small)
    with pytest.raises(LimitError):
        a2a_json_to_message(huge.encode(), limits=small)
    a2a = message_to_a2a(request_message)
    a2a.parts.append(Part(text="x" * (70 * 1024), media_type="text/plain"))
    with pytest.raises(LimitError):
        read_a2a(a2a, lossy=True, limits=small)


@pytest.mark.parametrize("text", [
    "", "null", "[]", "1e400", '{"messageId": 1}', '{"unknownField": "x"}',
    '{"parts": [{"text": "a", "data": {}}]}', '{"role": "ROLE_NOBODY"}',
    '{"parts": [{"text": "\\ud800", "mediaType": "application/cbcl"}]}',
    "[" * 100_000, '{"parts": ' + "[" * 5000 + "]" * 5000 + "}",
])
def test_bad_json_is_malformed(text: str) -> None:
    with pytest.raises(MalformedError):
        a2a_json_to_message(text, lossy=True)


def test_bad_utf8_is_malformed() -> None:
    with pytest.raises(MalformedError, match="not UTF-8"):
        a2a_json_to_message(b'{"messageId": "\xff"}')


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.sampled_from(["messageId", "contextId", "taskId", "parts", "text",
                                       "data", "mediaType", "role", "metadata",
                                       "extensions", "url", "raw", "filename", "x"]),
                      children, max_size=5),
    max_leaves=20)


@given(JSON_VALUES)
def test_fuzz_any_json_gives_a_result_or_a_cbcl_error(value: object) -> None:
    with contextlib.suppress(CBCLError):
        a2a_json_to_message(json.dumps(value), lossy=True)


@given(st.binary(max_size=300))
def test_fuzz_any_bytes_gives_a_result_or_a_cbcl_error(data: bytes) -> None:
    with contextlib.suppress(CBCLError):
        a2a_json_to_message(data, lossy=True)


@given(st.data())
def test_fuzz_mutated_messages(data: st.DataObject) -> None:
    text = message_to_a2a_json(parse(REQUEST_TEXT, envelope_only=True))[0]
    at = data.draw(st.integers(0, len(text) - 1))
    cut = data.draw(st.integers(0, 8))
    insert = data.draw(st.text(max_size=8))
    with contextlib.suppress(CBCLError):
        a2a_json_to_message(text[:at] + insert + text[at + cut:], lossy=True)


# --------------------------------------------------------------------------- AgentCard


def test_agent_card_extension_lists_protocols_and_digests(registry: Registry) -> None:
    protocols = [registry.get("request/v1"), registry.get("contract-net/v1")]
    extension = agent_card_extension([p for p in protocols if p is not None], required=True)
    assert extension.uri == EXTENSION_URI and extension.required
    card = AgentCard(name="backup", capabilities=AgentCapabilities(extensions=[extension]))
    card = json_format.Parse(json_format.MessageToJson(card), AgentCard())  # over the wire
    listed = card_protocols(card)
    assert [(p.id, p.version) for p in listed] == [("request/v1", 2), ("contract-net/v1", 2)]
    for entry, protocol in zip(listed, protocols, strict=True):
        assert protocol is not None
        assert entry.digest == protocol.digest
        assert entry.intents == protocol.descriptor.intents
    assert card_protocols(AgentCard(name="plain")) == ()


@pytest.mark.parametrize("params", [
    {"protocols": "x"},
    {"protocols": [{"id": "a b", "version": "1", "digest": "sha256:" + "0" * 64}]},
    {"protocols": [{"id": "p", "version": 1.0, "digest": "sha256:" + "0" * 64}]},
    {"protocols": [{"id": "p", "version": "01", "digest": "sha256:" + "0" * 64}]},
    {"protocols": [{"id": "p", "version": "1", "digest": "sha256:" + "G" * 64}]},
    {"protocols": [{"id": "p", "version": "1", "digest": "sha256:" + "0" * 64,
                    "intents": ["SHOUT"]}]},
    {"protocols": [{}] * 300},
])
def test_hostile_card_params_are_malformed(params: dict[str, object]) -> None:
    extension = AgentExtension(uri=EXTENSION_URI,
                               params=json_format.ParseDict(params, struct_pb2.Struct()))
    with pytest.raises(MalformedError):
        card_protocols(extension)


# --------------------------------------------------------------------------- task states


def test_task_states_follow_the_request_conversation(registry: Registry) -> None:
    tracker = ConversationTracker.from_descriptors(
        [registry.get("request/v1"), registry.get("contract-net/v1")])
    now = 1764499000000
    states = []
    for text in (REQUEST_TEXT, inform('(agree :action-id "a-1")', "AGREE"),
                 inform('(inform-result :action-id "a-1" :result 3)', mid="m-3")):
        step = tracker.receive(parse(text, registry=registry), now=now)
        states.append(task_state("request/v1", step.after))
    assert states == [TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING,
                      TaskState.TASK_STATE_COMPLETED]
    assert task_state("request/v1", "start") is None
    assert task_state("task-assignment/v1", "anything") is None


@pytest.mark.parametrize("protocol", ["request/v1", "contract-net/v1"])
def test_every_state_but_start_has_a_task_state(registry: Registry, protocol: str) -> None:
    loaded = registry.get(protocol)
    assert loaded is not None and loaded.descriptor.conversation is not None
    section = loaded.descriptor.conversation
    assert isinstance(section, tuple)
    transitions = next(part for part in section
                       if isinstance(part, tuple) and str(part[0]) == "transitions")
    states = {str(row[3]) for row in transitions[1:] if isinstance(row, tuple)}
    assert states | {"cancelled"} == set(TASK_STATES[protocol])
