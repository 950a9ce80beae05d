"""JSON both ways (spec/cbcl-1.0.md §7.2): ``message_from_json`` as the exact inverse of
``message_to_json``, its refusals of hostile JSON, and ``cbcl convert --from/--to json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings, strategies as st
from strategies import ids, messages

import cbcl
from cbcl import CBCLError, LimitError, Limits, MalformedError, Message
from cbcl.cli._main import main
from cbcl.json_mapping import (
    JSON_SIZE_FACTOR,
    message_from_json,
    message_to_json,
    message_to_json_text,
)
from cbcl.protocol._message import Signature

SIGNED = st.builds(lambda m, key, value: Message(
    message_id=m.message_id, sender=m.sender, receiver=m.receiver, intent=m.intent,
    protocol=m.protocol, conversation_id=m.conversation_id, in_reply_to=m.in_reply_to,
    reply_by=m.reply_by, timestamp=m.timestamp, body=m.body,
    signature=Signature(key, value)), messages, ids, ids)
ANY_MESSAGE = messages | SIGNED

EXAMPLE = (b'(CBCL/1.0 (message-id "m1") (sender agent://a) (receiver agent://b) '
           b'(intent REQUEST) (protocol request/v1) (timestamp 9007199254740993) '
           b'(body (task :id "t-1\\u202e" :n 3.50 :big 9007199254740992 :to agent://b)))')


def example_message() -> Message:
    return cbcl.parse(EXAMPLE, envelope_only=True)


def mapped(**changes: Any) -> dict[str, Any]:
    """The example's JSON object with ``changes`` (a value of ``None`` removes a member)."""
    members = message_to_json(example_message())
    for name, value in changes.items():
        name = name.replace("_", "-")
        if value is None:
            members.pop(name, None)
        else:
            members[name] = value
    return members


# --------------------------------------------------------------------------- round trips


@settings(max_examples=300)
@given(ANY_MESSAGE)
def test_message_to_json_and_back_is_the_same_message(message: Message) -> None:
    back = message_from_json(message_to_json(message))
    assert back == message and back.canonical() == message.canonical()
    text = message_to_json_text(message)
    again = message_from_json(text)
    assert again == message and again.canonical() == message.canonical()
    # JSON → message → JSON is byte-equal for the JSON the writer produced.
    assert message_to_json_text(again) == text
    assert message_from_json(text.encode("utf-8")) == message


def test_the_example_maps_as_the_spec_shows() -> None:
    text = message_to_json_text(example_message())
    assert json.loads(text)["body"] == [
        {"symbol": "task"}, {"keyword": "id"}, "t-1\u202e", {"keyword": "n"},
        {"decimal": "3.50"}, {"keyword": "big"}, {"int": "9007199254740992"},
        {"keyword": "to"}, {"uri": "agent://b"}]
    assert '"timestamp": {"int": "9007199254740993"}' in text
    assert "\\u202e" in text  # invisible characters escaped: the line shows what it holds
    assert message_from_json(text).canonical().encode() == EXAMPLE


def test_members_in_any_order_and_the_int_form_of_small_integers() -> None:
    members = mapped(timestamp={"int": "5"})
    reordered = dict(reversed(list(members.items())))
    back = message_from_json(json.dumps(reordered))
    assert back.timestamp == 5 and back.body == example_message().body


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(("text", "kind", "says"), [
    ('{"version": "CBCL/1.0", "version": "CBCL/1.0"}', MalformedError, "appears twice"),
    ('{"version": NaN}', MalformedError, "NaN"),
    ('{"version": -Infinity}', MalformedError, "-Infinity"),
    ('{"reply-by": ' + "9" * 21 + "}", MalformedError, "21-digit"),
    ('{"version": "\\ud800"}', MalformedError, "lone surrogate"),
    ('"CBCL/1.0"', MalformedError, "a message is a JSON object"),
    ("[1, 2", MalformedError, "JSON: Expecting"),
    ("\ufeff{}", MalformedError, "BOM"),
    ("[]", MalformedError, "a message is a JSON object"),
    ("{}", MalformedError, "has no version, message-id, sender, receiver, intent, protocol"),
])
def test_hostile_json_text_is_refused(text: str, kind: type[CBCLError], says: str) -> None:
    with pytest.raises(kind, match=None) as caught:
        message_from_json(text)
    assert says in str(caught.value)


@pytest.mark.parametrize(("changes", "path", "says"), [
    ({"body": [1, 1.5]}, "$.body[1]", "JSON number 1.5"),
    ({"body": 1.0}, "$.body", "JSON number 1.0"),
    ({"body": {"decimal": 1.5}}, "$.body", "not a CBCL value"),
    ({"body": {"decimal": "1e5"}}, "$.body", "invalid decimal"),
    ({"body": [None]}, "$.body[0]", "not a CBCL value"),
    ({"body": [True]}, "$.body[0]", "not a CBCL value"),
    ({"body": 2**53}, "$.body", "2**53-1"),
    ({"body": ["ok", "\ud83d"]}, "$.body[1]", "lone surrogate"),
    ({"timestamp": 1.5}, "$.timestamp", "JSON number"),
    ({"timestamp": "5"}, "$.timestamp", "must be an integer"),
    ({"reply_by": {"symbol": "x"}}, "$.reply-by", "must be an integer"),
    ({"sender": "not a uri"}, "$.sender", "URI"),
    ({"sender": {"uri": "agent://a"}}, "$.sender", "must be a JSON string"),
    ({"protocol": "no such symbol"}, "$.protocol", ""),
    ({"message_id": ""}, "$.message-id", "not empty"),
    ({"conversation_id": "a\udc00"}, "$.conversation-id", "lone surrogate"),
    ({"version": "CBCL/2.0"}, "$.version", "CBCL/1.0"),
    ({"intent": "request"}, "$.intent", "is not an intent"),
    ({"signature": {"key-id": "k"}}, "$.signature", "key-id"),
    ({"signature": {"key-id": "k", "value": "v", "x": "y"}}, "$.signature", "key-id"),
    ({"signature": ["k", "v"]}, "$.signature", "key-id"),
    ({"comment": "hello"}, "$", "is not a member of a message"),
])
def test_a_member_out_of_the_mapping_is_refused_at_its_path(
        changes: dict[str, Any], path: str, says: str) -> None:
    members = mapped(**changes)
    for document in (members, json.dumps(members)):
        with pytest.raises(MalformedError) as caught:
            message_from_json(document)
        assert str(caught.value).endswith(f" at {path}") and says in str(caught.value)


def test_a_raw_lone_surrogate_and_invalid_utf8_are_refused() -> None:
    text = json.dumps(mapped(), ensure_ascii=False)
    with pytest.raises(MalformedError, match="lone surrogate"):
        message_from_json(text.replace("t-1", "t-\udfff"))
    with pytest.raises(MalformedError, match="UTF-8") as caught:
        message_from_json(text.encode().replace(b"t-1", b"t-\xff"))
    assert caught.value.position is not None


def test_a_syntax_error_has_its_position() -> None:
    with pytest.raises(MalformedError) as caught:
        message_from_json('{\n  "version": "CBCL/1.0",\n  "é": ]}')
    position = caught.value.position
    assert position is not None and (position.line, position.column) == (3, 8)
    assert position.offset == len('{\n  "version": "CBCL/1.0",\n  "é": '.encode())


def test_the_size_bound_n_accepted_n_plus_one_refused() -> None:
    limits = Limits(max_message_bytes=1024)
    text = message_to_json_text(example_message())
    maximum = JSON_SIZE_FACTOR * limits.max_message_bytes
    padded = text + " " * (maximum - len(text))
    assert message_from_json(padded, limits=limits) == example_message()
    with pytest.raises(LimitError) as caught:
        message_from_json(padded + " ", limits=limits)
    assert caught.value.limit == "max_message_bytes"
    with pytest.raises(LimitError):
        message_from_json((padded + " ").encode(), limits=limits)


def test_the_json_nesting_bound_n_accepted_n_plus_one_refused() -> None:
    limits = Limits(max_depth=40)
    # An object (1) holding arrays: N levels of JSON pass the bound (and then fail as
    # what they are, not a message), N + 1 are refused before json.loads sees them.
    def nested(depth: int) -> str:
        return '{"x": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"
    with pytest.raises(MalformedError, match="not a member"):
        message_from_json(nested(40), limits=limits)
    with pytest.raises(LimitError) as caught:
        message_from_json(nested(41), limits=limits)
    assert caught.value.limit == "max_depth"
    # Brackets inside strings are not nesting.
    assert message_from_json(json.dumps(mapped(body="[[[[" * 20)), limits=limits).body \
        == "[[[[" * 20


def test_a_message_is_held_to_pass_one_limits_as_its_text_is() -> None:
    # The body at JSON depth d is a CBCL list at depth d + 1 (the envelope and the body
    # field): accepted at the limit, refused one deeper, as the text is.
    limits = Limits(max_depth=10)
    for lists, accepted in ((8, True), (9, False)):
        body: Any = []
        for _ in range(lists - 1):
            body = [body]
        members = mapped(body=body)
        as_text = message_from_json(members).canonical()
        try:
            message_from_json(members, limits=limits)
            assert accepted
        except LimitError as exc:
            assert not accepted and exc.limit == "max_depth" and exc.position is None
        with pytest.raises(LimitError) if not accepted else _nothing():
            cbcl.parse(as_text, limits=limits, envelope_only=True)
    with pytest.raises(LimitError, match="string"):
        message_from_json(mapped(body="x" * 200), limits=Limits(max_string_bytes=100))


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_deep_json_beyond_the_interpreter_stack_is_a_limit_error() -> None:
    deep = "[" * 200_000 + "]" * 200_000
    with pytest.raises(LimitError):
        message_from_json(deep, limits=Limits(max_depth=1_000_000))
    looped: list[Any] = []
    looped.append(looped)
    with pytest.raises(LimitError):
        message_from_json(mapped(body=looped))


def test_the_argument_types() -> None:
    with pytest.raises(MalformedError, match="a message is a JSON object"):
        message_from_json(5)  # type: ignore[arg-type]

    class Sly(dict[str, Any]):
        def __iter__(self) -> Any:
            raise RuntimeError("a method of the caller's object ran")

        def keys(self) -> Any:
            raise RuntimeError("a method of the caller's object ran")

    assert message_from_json(Sly(mapped())) == example_message()
    with pytest.raises(TypeError):
        message_from_json("{}", limits=5)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- fuzz

_KEYS = st.sampled_from(["version", "message-id", "sender", "receiver", "intent", "protocol",
                         "conversation-id", "in-reply-to", "reply-by", "timestamp", "body",
                         "signature", "key-id", "value", "int", "decimal", "symbol",
                         "keyword", "uri", "x", ""])
_SCALARS = (st.none() | st.booleans() | st.integers() | st.floats()
            | st.text(max_size=12) | st.sampled_from(
                ["CBCL/1.0", "REQUEST", "agent://a", "request/v1", "m1", "1.50", "-7", "x"]))
json_values = st.recursive(
    _SCALARS, lambda children: st.lists(children, max_size=5)
    | st.dictionaries(_KEYS, children, max_size=8), max_leaves=30)


def _either(document: Any) -> None:
    try:
        message = message_from_json(document)
    except CBCLError:
        return
    assert isinstance(message, Message)


@settings(max_examples=300)
@given(json_values)
@example(mapped())
@example({**mapped(), "body": {"int": "-0"}})
def test_fuzz_any_json_value_gives_a_message_or_a_cbcl_error(value: Any) -> None:
    _either(value)
    try:
        text = json.dumps(value)
    except ValueError:
        return
    _either(text)


@settings(max_examples=300)
@given(st.data())
def test_fuzz_mutated_json_text(data: st.DataObject) -> None:
    text = message_to_json_text(data.draw(messages))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(text)))
        cut = data.draw(st.integers(0, 8))
        junk = data.draw(st.sampled_from(
            ['"', "{", "}", "[", "]", ",", ":", "\\", "\\ud800", "1.5", "NaN", "null",
             '"x": 1', '"body": ', "\udc80", "\x00", "é", "1e999", ""]))
        text = text[:at] + junk + text[at + cut:]
    _either(text)
    _either(text.encode("utf-8", "surrogatepass"))


@settings(max_examples=300)
@given(ANY_MESSAGE, st.data())
def test_fuzz_a_message_with_members_changed(message: Message, data: st.DataObject) -> None:
    """Structure-aware: a real message's object with members replaced by random JSON
    values, removed or added; whatever comes out is a message whose JSON is the input's
    (when accepted) or a CBCLError."""
    members = message_to_json(message)
    for _ in range(data.draw(st.integers(1, 3))):
        name = data.draw(_KEYS)
        action = data.draw(st.sampled_from(["replace", "remove"]))
        if action == "remove":
            members.pop(name, None)
        else:
            members[name] = data.draw(json_values)
    try:
        back = message_from_json(members)
    except CBCLError:
        return
    # Accepted: the reader took nothing it did not give back (ints may come tagged).
    again = message_from_json(message_to_json(back))
    assert again == back and again.canonical() == back.canonical()


@given(st.binary(max_size=200))
def test_fuzz_any_bytes(data: bytes) -> None:
    _either(data)


# --------------------------------------------------------------------------- cbcl convert


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_convert_cbcl_to_json_and_back_without_loss(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "m.cbcl").write_bytes(EXAMPLE)
    code, out, err = run(capsys, "convert", "--from", "cbcl", "--to", "json",
                         str(tmp_path / "m.cbcl"))
    assert code == 0 and err == "" and out == message_to_json_text(example_message()) + "\n"
    (tmp_path / "m.json").write_text(out)
    code, back, err = run(capsys, "convert", "--from", "json", "--to", "cbcl",
                          str(tmp_path / "m.json"))
    assert code == 0 and err == "" and back.encode() == EXAMPLE + b"\n"
    code, same, _ = run(capsys, "convert", "--from", "json", "--to", "json",
                        str(tmp_path / "m.json"))
    assert code == 0 and same == out
    code, fipa, _ = run(capsys, "convert", "--from", "json", "--to", "fipa",
                        str(tmp_path / "m.json"))
    assert code == 0 and fipa.startswith("(request ")


def test_convert_from_json_refusals(capsys: pytest.CaptureFixture[str],
                                    tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text('{"version": "CBCL/1.0", "version": "CBCL/1.0"}')
    code, out, err = run(capsys, "convert", "--from", "json", "--to", "cbcl", str(path))
    assert (code, out) == (3, "") and err.startswith("malformed: JSON: member name")
    path.write_text(json.dumps(mapped(body=1.5)))
    code, _, err = run(capsys, "convert", "--from", "json", "--to", "cbcl", str(path))
    assert code == 3 and err.rstrip().endswith("at $.body")
    # JSON may be JSON_SIZE_FACTOR times the message limit: N accepted, N + 1 refused.
    text = message_to_json_text(example_message())
    path.write_text(text + " " * (JSON_SIZE_FACTOR * 1024 - len(text)))
    code, out, err = run(capsys, "convert", "--from", "json", "--to", "cbcl",
                         "--max-message-bytes", "1024", str(path))
    assert code == 0 and out.encode() == EXAMPLE + b"\n"
    path.write_text(text + " " * (JSON_SIZE_FACTOR * 1024 - len(text) + 1))
    code, out, err = run(capsys, "convert", "--from", "json", "--to", "cbcl",
                         "--max-message-bytes", "1024", str(path))
    assert (code, out) == (4, "") and err.startswith("limit")


def test_the_json_of_a_message_at_the_limit_is_within_the_size_bound() -> None:
    """The densest JSON per byte of text — one-letter symbols, ``a `` becoming
    ``{"symbol": "a"}, `` — of a message at a small limit still reads back."""
    limits = Limits(max_message_bytes=4096, max_list_items=4096, max_nodes=4096)
    head = example_message()
    body: tuple[Any, ...] = ()
    while True:
        bigger = (*body, cbcl.Symbol("a"))
        candidate = Message(message_id=head.message_id, sender=head.sender,
                            receiver=head.receiver, intent=head.intent,
                            protocol=head.protocol, body=bigger)
        if len(candidate.canonical().encode()) > limits.max_message_bytes:
            break
        body, message = bigger, candidate
    text = message_to_json_text(message)
    assert len(text) > 8 * len(message.canonical())  # the dense case it means to be
    assert len(text) <= JSON_SIZE_FACTOR * limits.max_message_bytes
    assert message_from_json(text, limits=limits) == message
