"""The C entry points (cbcl/_native_src/entry.h) that stand in for ``cbcl.parse``,
``Message.canonical``, ``Encoder.encode``, ``Decoder.decode`` and ``cbcl.decode`` where the
accelerators are built: each gives what the Python function it stands in for gives - the
same result, or the same exception with the same text - for every call, the ordinary ones
it serves in C and every other it hands on; and each shows that function's signature and
documentation.

Tests internals: the Python twins (``_api``, ``_message``, ``_codec``) are private."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cbcl_bench import PROTOCOLS, find_descriptors, load_registry, varied
from hypothesis import given, settings, strategies as st

import cbcl
from cbcl import Decoder, Encoder, load_private_key
from cbcl.binary import _codec
from cbcl.protocol import _api, _message

ROOT = Path(__file__).resolve().parent.parent
REGISTRY = load_registry(find_descriptors())
MESSAGES = [message for protocol in PROTOCOLS for size in ("small", "medium")
            for message in varied(protocol, size, 12, seed=5)]
TEXTS = [message.canonical().encode() for message in MESSAGES]
FRAMES = [cbcl.encode(message, registry=REGISTRY) for message in MESSAGES]

#: (name, the bound callable, the Python function it stands in for, whether a method)
ENTRIES: list[tuple[str, Any, Callable[..., Any], bool]] = [
    ("parse", cbcl.parse, _api.parse_python, False),
    ("canonical", cbcl.Message.canonical, _message.canonical_python, True),
    ("encode", Encoder.encode, _codec.encode_python, True),
    ("decode", Decoder.decode, _codec.decode_python, True),
    ("decode", cbcl.decode, _codec.decode_one_shot_python, False),
]


def test_every_entry_is_installed_where_the_accelerators_are_built() -> None:
    installed = [name for name, bound, python, _ in ENTRIES if bound is not python]
    if os.environ.get("CBCL_REQUIRE_SPEEDUPS"):  # (CI builds them)
        assert len(installed) == len(ENTRIES)
    for name, bound, python, method in ENTRIES:
        if name in installed:
            assert type(bound).__name__ == ("MethodEntry" if method else
                                            "builtin_function_or_method")
        if name in installed and method:  # bound by its class body, which it knows
            assert bound.__wrapped__ is python
            assert bound.__qualname__ == python.__qualname__
            assert bound.__objclass__.__dict__[name] is bound


def test_a_method_entry_is_called_as_its_method() -> None:
    """A method entry binds as a method (a bound method of the instance, or called with
    the instance first) and takes only instances of its class as self."""
    if Encoder.encode is _codec.encode_python:
        pytest.skip("cbcl._native is not built")
    encoder = Encoder(REGISTRY, validate=False)
    bound: Any = encoder.encode  # (a bound method: __self__)
    assert bound.__self__ is encoder and bound(MESSAGES[0]) == FRAMES[0]
    assert Encoder.encode(encoder, MESSAGES[0]) == FRAMES[0]
    with pytest.raises(TypeError, match="doesn't apply to a 'Decoder' object"):
        Encoder.encode(Decoder(REGISTRY), MESSAGES[0])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Encoder.encode()  # type: ignore[call-arg]


@pytest.mark.parametrize(("name", "bound", "python", "method"), ENTRIES)
def test_an_entry_shows_its_python_function(name: str, bound: Any,
                                            python: Callable[..., Any], method: bool) -> None:
    assert bound.__name__ == python.__name__ == name
    assert inspect.getdoc(bound) == inspect.getdoc(python)
    ours = inspect.signature(bound).parameters
    theirs = inspect.signature(python).parameters
    assert [(p.name, p.kind if p.name != "self" else None, p.default)
            for p in ours.values()] == \
        [(p.name, p.kind if p.name != "self" else None, p.default) for p in theirs.values()]
    if not method:
        assert bound.__module__ == python.__module__


def with_body(message: cbcl.Message, body: Any) -> cbcl.Message:
    """``message`` with ``body``, unchecked (as a bug or a hand-made object would have it)."""
    m = message
    return cbcl.Message._trusted(m.message_id, m.sender, m.receiver, m.intent, m.protocol,
                                 m.conversation_id, m.in_reply_to, m.reply_by, m.timestamp,
                                 body, m.signature)


def outcome(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """What a call gives: its result, or its exception's type and text."""
    try:
        return function(*args, **kwargs)
    except Exception as error:  # (the same type of exception, whichever it is)
        return type(error), str(error)


def same(entry: Callable[..., Any], python: Callable[..., Any], *args: Any,
         **kwargs: Any) -> Any:
    found = outcome(entry, *args, **kwargs)
    assert found == outcome(python, *args, **kwargs)
    return found


# --------------------------------------------------------------------------- parse

def test_parse_serves_the_corpus() -> None:
    for text, message in zip(TEXTS, MESSAGES, strict=True):
        assert same(cbcl.parse, _api.parse_python, text, registry=REGISTRY) == message


def test_parse_hands_on_every_other_call() -> None:
    text = TEXTS[0]
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        ((text,), {}),  # no registry: pass 1 only would need envelope_only
        ((text,), {"registry": None}),
        ((text,), {"registry": REGISTRY, "envelope_only": True}),
        ((text,), {"registry": REGISTRY, "limits": cbcl.Limits(max_nodes=5)}),
        ((text,), {"registry": REGISTRY, "require_signatures": True}),
        ((text.decode(),), {"registry": REGISTRY}),
        ((bytearray(text),), {"registry": REGISTRY}),
        ((memoryview(text),), {"registry": REGISTRY}),
        ((), {"data": text, "registry": REGISTRY}),
        ((text, REGISTRY), {}),
        ((), {}),
        ((text,), {"registry": "not a registry"}),
        ((text,), {"registri": REGISTRY}),
        ((12,), {"registry": REGISTRY}),
    ]
    for args, kwargs in calls:
        same(cbcl.parse, _api.parse_python, *args, **kwargs)


@pytest.mark.parametrize("document", [
    b"", b"   ", b"(", b")", b"\xff\xfe", b"(CBCL/1.0)", b"() ()",
    b"(CBCL/1.0 (message-id \"m\")) trailing",
])
def test_parse_refuses_as_the_python_function(document: bytes) -> None:
    same(cbcl.parse, _api.parse_python, document, registry=REGISTRY)


def test_parse_what_may_follow_a_document() -> None:
    text = TEXTS[1]
    for tail in (b"\n", b"  \r\n\t", b" ; a comment\n", b" ; a comment", b" x", b" ()",
                 b"\x00"):
        same(cbcl.parse, _api.parse_python, text + tail, registry=REGISTRY)
    assert cbcl.parse(text + b"\n", registry=REGISTRY) == MESSAGES[1]


def test_parse_at_the_default_document_size() -> None:
    limit = cbcl.Limits().max_message_bytes
    text = TEXTS[0]
    for size in (limit, limit + 1):  # padded with spaces: accepted, then refused
        padded = text + b" " * (size - len(text))
        assert len(padded) == size
        same(cbcl.parse, _api.parse_python, padded, registry=REGISTRY)
    assert cbcl.parse(text + b" " * (limit - len(text)), registry=REGISTRY) == MESSAGES[0]
    with pytest.raises(cbcl.LimitError):
        cbcl.parse(text + b" " * (limit + 1 - len(text)), registry=REGISTRY)


@settings(max_examples=300, deadline=None)
@given(index=st.integers(0, len(TEXTS) - 1), data=st.data())
def test_parse_damaged_documents_as_the_python_function(index: int, data: Any) -> None:
    text = bytearray(TEXTS[index])
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(text) - 1))
        text[at] = data.draw(st.sampled_from(b'()" :\\x9-.\n\xc3\xa9\xff'))
    same(cbcl.parse, _api.parse_python, bytes(text), registry=REGISTRY)


# --------------------------------------------------------------------------- signatures

@pytest.fixture(scope="module")
def trusted(tmp_path_factory: pytest.TempPathFactory) -> tuple[cbcl.Registry, cbcl.Message,
                                                                  cbcl.Message]:
    """A registry with a trust store, a message it governs and that message signed."""
    keys = ROOT / "descriptors" / "keys"
    registry = cbcl.Registry(trust=keys, cache_dir=tmp_path_factory.mktemp("trust"))
    registry.load((ROOT / "descriptors" / "contract-net-v1.signed.cbcl").read_bytes())
    example = (ROOT / "descriptors" / "examples" / "contract-net-v1.cbcl").read_bytes()
    message = _api.parse_python(example, registry=registry)
    key = load_private_key((keys / "cbcl-example.key").read_bytes())
    return registry, message, cbcl.trust.sign_message(message, key, "cbcl-example")


def test_signed_messages_are_verified_by_every_entry(
        trusted: tuple[cbcl.Registry, cbcl.Message, cbcl.Message]) -> None:
    registry, message, signed = trusted
    forged = dataclasses.replace(signed, message_id="cn-999")
    for one in (message, signed, forged):
        text = _message.canonical_python(one).encode()
        same(cbcl.parse, _api.parse_python, text, registry=registry)
        frame = _codec.encode_python(Encoder(registry, validate=False), one)
        for require in (False, True):
            decoder = Decoder(registry, require_signatures=require)
            with contextlib.suppress(cbcl.TrustError):  # (a frame plan made)
                decoder.decode(cbcl.encode(message, registry=registry))
            same(decoder.decode, lambda data, d=decoder: _codec.decode_python(d, data), frame)
        for _ in range(2):  # (the first call makes the registry's one-shot state)
            same(lambda data: cbcl.decode(data, registry=registry),
                 lambda data: _codec.decode_one_shot_python(data, registry=registry), frame)
    assert cbcl.parse(signed.canonical().encode(), registry=registry) == signed
    with pytest.raises(cbcl.TrustError):
        cbcl.parse(forged.canonical().encode(), registry=registry)
    decoder = Decoder(registry, require_signatures=True)
    with pytest.raises(cbcl.TrustError):
        decoder.decode(cbcl.encode(message, registry=registry))
    assert decoder.decode(cbcl.encode(signed, registry=registry)) == signed


# --------------------------------------------------------------------------- canonical

def test_canonical_of_the_corpus_and_of_what_c_declines() -> None:
    for message in MESSAGES:
        assert same(cbcl.Message.canonical, _message.canonical_python, message) == \
            message.canonical()

    class Sub(cbcl.Message):
        __slots__ = ()

    sub = Sub(**{f.name: getattr(MESSAGES[0], f.name) for f in dataclasses.fields(Sub)})
    assert sub.canonical() == MESSAGES[0].canonical()
    odd = with_body(MESSAGES[1], (cbcl.Symbol("x"), 1.5))  # a float
    same(cbcl.Message.canonical, _message.canonical_python, odd)
    if cbcl.Message.canonical is not _message.canonical_python:
        # (a method descriptor checks its self: a TypeError where the function, unbound,
        # raised an AttributeError)
        with pytest.raises(TypeError, match="doesn't apply to a 'str' object"):
            cbcl.Message.canonical("not a message")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        cbcl.Message.canonical(MESSAGES[0], 1)  # type: ignore[call-arg]


# --------------------------------------------------------------------------- encode

@pytest.mark.parametrize("validate", [False, True])
def test_encode_as_the_python_method(validate: bool) -> None:
    encoder, python = Encoder(REGISTRY, validate=validate), Encoder(REGISTRY, validate=validate)
    for message, frame in zip(MESSAGES, FRAMES, strict=True):
        assert encoder.encode(message) == _codec.encode_python(python, message) == frame
    odd = with_body(MESSAGES[1], (cbcl.Symbol("x"), 1.5))
    unknown = dataclasses.replace(MESSAGES[0], protocol=cbcl.Symbol("nobody/v1"))
    for args, kwargs in [((odd,), {}), ((unknown,), {}), (("text",), {}), ((), {}),
                         ((), {"message": MESSAGES[0]}), ((MESSAGES[0], 1), {})]:
        same(encoder.encode, lambda *a, **k: _codec.encode_python(python, *a, **k),
             *args, **kwargs)


def test_encode_reads_the_encoder_as_it_is_now() -> None:
    encoder = Encoder(REGISTRY, validate=False)
    refused = dataclasses.replace(MESSAGES[0], body=(cbcl.Symbol("no-such-head"),))
    encoder.encode(refused)  # not validated: a frame every decoder refuses
    encoder.validate = True  # (the entry reads the slot on every call)
    with pytest.raises(cbcl.CBCLError):
        encoder.encode(refused)


def test_encode_follows_a_registry_set_later() -> None:
    """The entry finds protocols in the encoder's registry as it is now, not in the one
    it was made with (whose protocols dict it keeps beside it)."""
    empty = cbcl.Registry(disk_cache=False, isolate=False)
    encoder = Encoder(REGISTRY, validate=False)
    frame = encoder.encode(MESSAGES[0])
    encoder.registry = empty
    with pytest.raises(cbcl.UnknownProtocolError):
        encoder.encode(MESSAGES[0])
    encoder.registry = REGISTRY
    assert encoder.encode(MESSAGES[0]) == frame
    other = Encoder(empty, validate=False)
    with pytest.raises(cbcl.UnknownProtocolError):
        other.encode(MESSAGES[0])
    other.registry = REGISTRY
    assert other.encode(MESSAGES[0]) == frame


# --------------------------------------------------------------------------- decode

def test_decode_as_the_python_method() -> None:
    decoder, python = Decoder(REGISTRY), Decoder(REGISTRY)
    for frame, message in zip(FRAMES, MESSAGES, strict=True):
        assert decoder.decode(frame) == _codec.decode_python(python, frame) == message
    for args, kwargs in [((bytearray(FRAMES[0]),), {}), ((memoryview(FRAMES[0]),), {}),
                         (("text",), {}), ((), {}), ((), {"data": FRAMES[0]}),
                         ((FRAMES[0], 1), {}), ((b"",), {}), ((FRAMES[0][:-1],), {})]:
        same(decoder.decode, lambda *a, **k: _codec.decode_python(python, *a, **k),
             *args, **kwargs)


@settings(max_examples=300, deadline=None)
@given(index=st.integers(0, len(FRAMES) - 1), data=st.data())
def test_decode_damaged_frames_as_the_python_method(index: int, data: Any) -> None:
    frame = bytearray(FRAMES[index])
    for _ in range(data.draw(st.integers(1, 3))):
        frame[data.draw(st.integers(0, len(frame) - 1))] = data.draw(st.integers(0, 255))
    same(DAMAGED.decode, lambda f: _codec.decode_python(DAMAGED_PYTHON, f), bytes(frame))


DAMAGED, DAMAGED_PYTHON = Decoder(REGISTRY), Decoder(REGISTRY)


# --------------------------------------------------------------------------- one-shot decode

def one_shot(*args: Any, **kwargs: Any) -> Any:
    return same(cbcl.decode, _codec.decode_one_shot_python, *args, **kwargs)


def test_one_shot_decode_as_the_python_function() -> None:
    registry = load_registry(find_descriptors())
    for _ in range(2):  # a registry's first call makes its state; the next are served in C
        for frame, message in zip(FRAMES, MESSAGES, strict=True):
            assert one_shot(frame, registry=registry) == message

    class Mine(cbcl.Registry):
        pass

    mine = Mine(disk_cache=False, isolate=False)
    frame = FRAMES[0]
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        ((bytearray(frame),), {"registry": registry}),
        ((memoryview(frame),), {"registry": registry}),
        ((frame,), {"registry": registry, "limits": None}),
        ((frame,), {"registry": registry, "limits": cbcl.Limits(max_nodes=5)}),
        ((frame,), {"registry": mine}), ((frame,), {"registry": None}),
        ((frame,), {"registry": object()}), ((frame,), {"registri": registry}),
        ((frame, registry), {}), ((), {"data": frame, "registry": registry}),
        ((), {}), (("text",), {"registry": registry}),
        ((b"",), {"registry": registry}),
        ((frame[:-1],), {"registry": registry})]
    for args, kwargs in calls:
        one_shot(*args, **kwargs)


def test_one_shot_decode_is_served_in_c(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once a registry's state is made, the ordinary call never runs decode's Python
    function (which calls the module's _decode_frame_c: spied here)."""
    if cbcl.decode is _codec.decode_one_shot_python:
        pytest.skip("cbcl._native is not built")
    registry = load_registry(find_descriptors())
    calls: list[bytes] = []
    real = getattr(_codec, "_decode_frame_c")  # noqa: B009 (private to the module)

    def spy(data: bytes, state: Any) -> Any:
        calls.append(data)
        return real(data, state)

    monkeypatch.setattr(_codec, "_decode_frame_c", spy)
    for frame, message in zip(FRAMES, MESSAGES, strict=True):
        assert cbcl.decode(frame, registry=registry) == message
    # the Python function: the first frame (it made the state), and the first of each
    # envelope shape the C call declines until the careful decoding has checked it
    assert FRAMES[0] in calls
    calls.clear()
    for frame, message in zip(FRAMES, MESSAGES, strict=True):
        assert cbcl.decode(frame, registry=registry) == message
    assert calls == []
    registry._one_shot = None  # (state dropped: the Python function makes it again)
    assert cbcl.decode(FRAMES[1], registry=registry) == MESSAGES[1]
    assert calls[0] == FRAMES[1]


@settings(max_examples=300, deadline=None)
@given(index=st.integers(0, len(FRAMES) - 1), data=st.data())
def test_one_shot_decode_of_damaged_frames_as_the_python_function(index: int,
                                                                  data: Any) -> None:
    frame = bytearray(FRAMES[index])
    for _ in range(data.draw(st.integers(1, 3))):
        frame[data.draw(st.integers(0, len(frame) - 1))] = data.draw(st.integers(0, 255))
    one_shot(bytes(frame), registry=REGISTRY)
