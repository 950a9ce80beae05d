"""Pass 1's walk of a document value: the C twin (``cbcl._native.envelope``) against the
Python walk (``cbcl.protocol._envelope.message_of_python``, the reference) on valid envelopes and
on envelopes broken in every way the grammar refuses: fields out of order, repeated,
missing or unknown, values of the wrong type, a wrong version, odd signatures. Both give
the same message (every attribute of the same type) or both refuse.

Tests internals: the structural walk and the C envelope reader it is held to are private."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings, strategies as st
from strategies import messages, traces, values
from test_reader import same_value

import cbcl
from cbcl import URI, Message, Symbol
from cbcl.protocol import _envelope

pytestmark = pytest.mark.skipif(_envelope.message_of is _envelope.message_of_python,
                                reason="cbcl._native is not built here")

ATTRIBUTES = _envelope._C_ATTRIBUTES


def agree(value: Any) -> Message | None:
    expected = _envelope.message_of_python(value)
    found = _envelope.message_of(value)
    if expected is None:
        assert found is None, value
        return None
    assert found is not None, value
    for name in ATTRIBUTES:
        assert same_value(getattr(found, name), getattr(expected, name)), name
        assert type(getattr(found, name)) is type(getattr(expected, name)), name
    assert found == expected
    return found


@settings(max_examples=300, deadline=None)
@given(message=messages)
def test_valid_envelopes(message: Message) -> None:
    value = cbcl.read(cbcl.canonical(message))
    assert agree(value) == message


def _mutations(value: tuple[Any, ...], data: st.DataObject) -> tuple[Any, ...]:
    items = list(value)
    op = data.draw(st.sampled_from(["swap", "drop", "dup", "retype", "rename", "head",
                                    "extra", "signature", "shape", "trace"]))
    index = data.draw(st.integers(0, len(items) - 1))
    if op == "swap" and len(items) > 2:
        other = data.draw(st.integers(1, len(items) - 1))
        items[index], items[other] = items[other], items[index]
    elif op == "drop":
        del items[index]
    elif op == "dup":
        items.insert(index, items[index])
    elif op == "retype" and index and type(items[index]) is tuple and len(items[index]) > 1:
        items[index] = (items[index][0], data.draw(values))
    elif op == "rename" and index and type(items[index]) is tuple:
        items[index] = (data.draw(st.sampled_from([
            Symbol("sender"), Symbol("body"), Symbol("bogus"), cbcl.Keyword("sender"),
            "sender", Symbol("signature")])), *items[index][1:])
    elif op == "head":
        items[0] = data.draw(st.sampled_from([Symbol("CBCL/1.1"), "CBCL/1.0",
                                              URI("a://b"), Symbol("CBCL/1.0")]))
    elif op == "extra" and index and type(items[index]) is tuple:
        items[index] = (*items[index], data.draw(values))
    elif op == "signature":
        items.append((Symbol("signature"), *data.draw(st.lists(values, max_size=3))))
    elif op == "shape":
        items[index] = data.draw(values)
    elif op == "trace" and index:  # a (trace …) field here, its string valid or one off
        trace = data.draw(traces)
        cut = data.draw(st.integers(0, len(trace)))
        near = data.draw(st.sampled_from([
            trace, trace[:cut] + trace[cut + 1:], trace[:cut] + "0" + trace[cut:],
            trace[:cut] + "G" + trace[cut + 1:], trace.upper(), "01" + trace[2:]]))
        items.insert(index, (Symbol("trace"), near))
    return tuple(items)


@settings(max_examples=600, deadline=None)
@given(message=messages, data=st.data())
def test_broken_envelopes(message: Message, data: st.DataObject) -> None:
    value = cbcl.read(cbcl.canonical(message))
    assert isinstance(value, tuple)  # a message is a list
    for _ in range(data.draw(st.integers(1, 3))):
        value = _mutations(value, data)
    agree(value)


@settings(max_examples=200, deadline=None)
@given(value=values)
def test_any_value(value: Any) -> None:
    agree(value)


def test_every_intent_and_a_signature() -> None:
    for intent in cbcl.Intent:
        text = (f'(CBCL/1.0 (message-id "m") (sender a://b) (receiver a://c) '
                f'(intent {intent.value}) (protocol p/v1) (reply-by 5) (body (x))'
                f' (signature "ed25519" "c2ln"))')
        found = agree(cbcl.read(text))
        assert found is not None and found.intent is intent
        assert type(found.signature) is cbcl.trust.Signature
    assert agree(cbcl.read('(CBCL/1.0 (message-id "m") (sender a://b) (receiver a://c) '
                           '(intent SHOUT) (protocol p/v1))')) is None
    assert agree(cbcl.read('(CBCL/1.0 (message-id "") (sender a://b) (receiver a://c) '
                           '(intent INFORM) (protocol p/v1))')) is None


def test_trusted_messages_made_in_c_are_the_pythons() -> None:
    """Message._trusted by cbcl._native.make_object gives the message object.__new__ and
    object.__setattr__ give; make_object refuses what it cannot make that way."""
    from cbcl.protocol import _message

    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    args = ("m", URI("a://b"), URI("a://c"), cbcl.Intent.INFORM, Symbol("p/v1"), "c", None,
            5, None, (Symbol("x"),), cbcl.trust.Signature("k", "s"), trace)
    made = Message._trusted(*args)
    saved = _message._make_object
    _message._make_object = None
    try:
        reference = Message._trusted(*args)
    finally:
        _message._make_object = saved
    assert made == reference and hash(made) == hash(reference)
    # (_trusted takes trace last; the attributes hold it before the body)
    assert [getattr(made, name) for name in _message._ATTRIBUTES] == \
        [*args[:9], trace, *args[9:11]]
    from cbcl._native import make_object

    with pytest.raises(TypeError):
        make_object(int, ("real",), (1,))
    with pytest.raises(ValueError):
        make_object(Message, ("message_id",), ())
