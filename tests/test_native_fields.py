"""The storage of Message and Signature in cbcl._native (issue 28): the C types
MessageFields and SignatureFields, whose structs hold the fields as named members that the
writers read and the decoders fill directly, and setup_message's check of their layout.
An internal: the tests import cbcl._native and private names."""

from __future__ import annotations

import gc
import os
import weakref
from dataclasses import dataclass, replace
from typing import Any

import pytest
from test_protocol import DESCRIPTORS, SHIPPED

from cbcl import Decoder, Encoder, Message, Registry, parse
from cbcl.protocol import _message
from cbcl.protocol._message import _ATTRIBUTES, _FIELD, _INTENT_SYMBOL, _VERSION_SYMBOL
from cbcl.trust import Signature


@pytest.fixture(scope="module")
def native() -> Any:
    try:
        import cbcl._native as module
    except ImportError:
        if os.environ.get("CBCL_REQUIRE_SPEEDUPS"):
            raise
        pytest.skip("cbcl._native is not built here")
    return module


def _register(native: Any, message: type, signature: type = Signature) -> bool:
    result: bool = native.setup_message(message, signature,
                                        (_VERSION_SYMBOL, *_FIELD.values()),
                                        tuple(_INTENT_SYMBOL.items()))
    return result


def _a_message(**fields: Any) -> Message:
    base: dict[str, Any] = {"message_id": "m-1", "sender": "agent://a",
                            "receiver": "agent://b", "intent": "INFORM",
                            "protocol": "any/v1", "body": 1}
    return Message(**{**base, **fields})


def test_message_and_signature_are_over_the_c_storage(native: Any) -> None:
    assert Message.__mro__[1] is native.MessageFields
    assert Signature.__mro__[1] is native.SignatureFields
    assert _message._canonical_message is native.canonical_message


@pytest.mark.parametrize("extra", ["dict", "slot", "weakref", "elsewhere"])
def test_setup_refuses_a_class_that_adds_to_the_layout(native: Any, extra: str) -> None:
    """A class with more than the struct (a __dict__, a slot, __weakref__), or not over
    MessageFields at all, is refused (False: every message declined), so that the walks
    never read a struct that is not the whole of an instance."""
    if extra == "elsewhere":
        @dataclass(frozen=True, slots=True)
        class Other:
            message_id: str

        other: type = Other
    else:
        slots = {"dict": ("__dict__",), "slot": ("more",), "weakref": ("__weakref__",)}
        other = type("Grown", (native.MessageFields,), {"__slots__": slots[extra]})
    try:
        assert _register(native, other) is False
        assert _register(native, Message, other) is False
    finally:
        assert _register(native, Message) is True  # (as _message.py registers them)
    m = _a_message()
    assert native.canonical_message(m) == _message.canonical_python(m)


def test_an_unset_field_is_declined_and_the_python_path_raises(native: Any) -> None:
    empty = object.__new__(Message)
    assert native.canonical_message(empty) is None
    with pytest.raises(AttributeError):
        empty.canonical()
    with pytest.raises(AttributeError):
        _message.canonical_python(empty)
    signature = object.__new__(Signature)
    assert native.canonical_message(_a_message(signature=Signature("k", "v"))) is not None
    unsigned = _a_message()
    object.__setattr__(unsigned, "signature", signature)  # (its fields unset)
    assert native.canonical_message(unsigned) is None


def test_the_struct_is_visited_by_the_collector(native: Any) -> None:
    """A message in a reference cycle is collected: the type's traverse visits every
    field (else the cycle would leak)."""

    class Box:
        message: Any

    box = Box()
    m = _a_message(conversation_id="c-1")
    object.__setattr__(m, "body", box)
    box.message = m
    assert gc.is_tracked(m)
    assert {id(v) for v in gc.get_referents(m)} >= {id(box), id(m.message_id),
                                                    id(m.conversation_id), id(Message)}
    alive = weakref.ref(box)
    del box, m
    gc.collect()
    assert alive() is None


def test_make_object_fills_fields_in_any_order(native: Any) -> None:
    """make_object fills the struct directly for the fields in grammar order, and
    attribute by attribute for any other order: the same message."""
    m = _a_message(conversation_id="c-1", signature=Signature("k", "v"))
    values = tuple(getattr(m, name) for name in _ATTRIBUTES)
    direct = native.make_object(Message, _ATTRIBUTES, values)
    reordered = native.make_object(Message, _ATTRIBUTES[::-1], values[::-1])
    assert direct == reordered == m and type(direct) is type(reordered) is Message


def test_decoders_make_exact_messages_and_signatures(native: Any) -> None:
    """The C decoders (binary frame, text envelope) fill the registered classes' structs:
    exact Message and Signature instances, equal to what the Python paths make."""
    registry = Registry(disk_cache=False, isolate=False)
    for name in SHIPPED:
        registry.load((DESCRIPTORS / f"{name}.cbcl").read_bytes(), allow_unsigned=True)
    example = (DESCRIPTORS / "examples" / "request-v1-inform-result.cbcl").read_text()
    signed = replace(parse(example, registry=registry), signature=Signature("key-1", "c2ln"))
    parsed = parse(signed.canonical(), registry=registry)
    decoded = Decoder(registry=registry).decode(
        Encoder(registry=registry, validate=False).encode(signed))
    for m in (parsed, decoded):
        assert type(m) is Message and type(m.signature) is Signature
        assert m == signed


def test_the_encoder_entry_reads_the_encoder_fields_struct(native: Any) -> None:
    """Encoder is over EncoderFields, whose struct Encoder.encode's C entry reads (also
    for a subclass); a field unset hands the call to the Python method, which raises as
    it does without the extension."""
    from cbcl.binary import _codec

    assert native.EncoderFields in Encoder.__mro__
    registry = Registry(disk_cache=False, isolate=False)
    for name in SHIPPED:
        registry.load((DESCRIPTORS / f"{name}.cbcl").read_bytes(), allow_unsigned=True)
    example = (DESCRIPTORS / "examples" / "request-v1-inform-result.cbcl").read_text()
    m = parse(example, registry=registry)

    class Mine(Encoder):
        __slots__ = ("extra",)

    encoder, python = Encoder(registry, validate=False), Encoder(registry, validate=False)
    frame = _codec.encode_python(python, m)
    assert encoder.encode(m) == Mine(registry, validate=False).encode(m) == frame
    del encoder._tables
    with pytest.raises(AttributeError):
        encoder.encode(m)
    del python._tables
    with pytest.raises(AttributeError):
        _codec.encode_python(python, m)
    encoder = Encoder(registry, validate=False)
    alive = weakref.ref(encoder)  # (the Encoder's own __weakref__ slot, over the struct)
    # (not the pair: the protocols are read from the registry instead)
    encoder._registry_protocols = None  # type: ignore[assignment]
    assert encoder.encode(m) == frame
    del encoder
    gc.collect()
    assert alive() is None
