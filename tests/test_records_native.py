"""The C converter of typed records (cbcl/_native_src/records.c) against its Python
reference (the ``_from_body`` cbcl/protocol/_records.py writes, and ``record_of_python``):
the same instances, field for field, on random valid bodies of random declarations and of
a protocol with nested list-of records, optionals, literals, booleans, datetimes and a
union; the same typed errors on refused ones."""

from __future__ import annotations

import gc
import sys
import types
import weakref
from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any, Literal

import pytest
from hypothesis import given, settings, strategies as st
from strategies import values
from test_declaration import _draw_value, declarations
from test_records import _module_of

import cbcl
from cbcl.descriptor import Declared
from cbcl.protocol._declaration import read_declaration
from cbcl.protocol._records import record_of, record_of_python

native = pytest.importorskip("cbcl._native")


class Item(cbcl.Record):
    code: Annotated[str, cbcl.Length(1, 8)]
    qty: Annotated[int, cbcl.Range(1, 9)] = 1
    flag: bool = False


class Batch(cbcl.Record, intent="REQUEST"):
    batch_id: str
    kind: Literal["a", "b", 7]
    items: tuple[Item, ...] = ()
    more: list[Item] = []  # noqa: RUF012 - (a default the class copies into the body)
    tags: list[cbcl.Symbol] = []  # noqa: RUF012
    main: Item | None = None
    price: Decimal | None = None
    at: datetime | None = None
    urgent: bool = False


class Cancel(cbcl.Record, intent="REQUEST"):
    batch_id: str
    reason: Annotated[cbcl.Value, Declared("(keys (else any))")] | None = None


REGISTRY = cbcl.Registry()
REGISTRY.load(cbcl.descriptor_from(Batch, Cancel, id="batch/v1", version=1),
              allow_unsigned=True)
PROTOCOL = REGISTRY.get("batch/v1")


def _message(body: Any, intent: str = "REQUEST", protocol: str = "batch/v1") -> cbcl.Message:
    return cbcl.Message(message_id="m", sender="agent://a", receiver="agent://b",
                        intent=intent, protocol=protocol, body=body)


def _same(made: Any, expected: Any, *, one_body: bool = True) -> None:
    """Equal, of the same class, each field of the same type, and the same body object
    (with ``one_body=False``, from two decodes: equal bodies)."""
    assert type(made) is type(expected) and made == expected
    for name in type(expected).__match_args__:
        a, b = getattr(made, name), getattr(expected, name)
        assert type(a) is type(b) and a == b, name
        if isinstance(b, (tuple, list)):
            assert [type(x) for x in a] == [type(x) for x in b], name
    assert made.to_body() is expected.to_body() if one_body else \
        made.to_body() == expected.to_body()


def _outcome(function: Any, *args: Any) -> Any:
    try:
        return function(*args)
    except Exception as exc:  # (compared: the same type and text)
        return (type(exc), str(exc))


def test_the_classes_decode_through_their_converter() -> None:
    assert type(Batch._from_body) is native.RecordConverter
    assert Batch._from_body is Batch.__cbcl_converter__
    assert Batch._from_body_python is not Batch._from_body


items = st.builds(lambda c, q, f: Item(code=c, qty=q, flag=f),
                  st.text("xyz", min_size=1, max_size=8), st.integers(1, 9), st.booleans())
batches = st.builds(
    Batch, batch_id=st.text(max_size=6), kind=st.sampled_from(["a", "b", 7]),
    items=st.lists(items, max_size=3).map(tuple), more=st.lists(items, max_size=2),
    tags=st.lists(st.sampled_from(["t", "u"]).map(cbcl.Symbol), max_size=2),
    main=st.none() | items, price=st.none() | st.decimals(places=2, allow_nan=False,
                                                          allow_infinity=False),
    at=st.none() | st.integers(0, 2**40).map(
        lambda ms: Batch._from_body_python((cbcl.Symbol("batch"), cbcl.Keyword("batch-id"),
                                            "x", cbcl.Keyword("kind"), 7,
                                            cbcl.Keyword("at"), ms)).at),
    urgent=st.booleans())


@settings(max_examples=60, deadline=None)
@given(record=batches, shuffle=st.randoms(use_true_random=False))
def test_c_and_python_make_the_same_record(record: Batch, shuffle: Any) -> None:
    """Decoded from text (the reader's shared keywords: the declared-order path) and from
    the body with its pairs in another order (the dict path): the same instance."""
    text = _message(record).canonical()
    decoded = cbcl.parse(text, registry=REGISTRY)
    body = decoded.body
    assert isinstance(body, tuple)
    _same(Batch._from_body(body), Batch._from_body_python(body))
    _same(record_of(decoded, Batch, PROTOCOL), record_of_python(decoded, Batch, PROTOCOL))
    _same(record_of(decoded, Batch | Cancel, PROTOCOL),
          record_of_python(decoded, Batch | Cancel, PROTOCOL))
    pairs = [body[i:i + 2] for i in range(1, len(body), 2)]
    shuffle.shuffle(pairs)
    moved = (body[0], *(x for pair in pairs for x in pair))
    _same(Batch._from_body(moved), Batch._from_body_python(moved))
    assert Batch._from_body(moved) == record


def test_the_ordinary_case_is_served_in_c_once_the_protocol_is_trusted() -> None:
    made = Batch(batch_id="b1", kind="a", items=(Item(code="x"),))
    decoded = cbcl.parse(_message(made).canonical(), registry=REGISTRY)
    converter = Batch.__cbcl_converter__
    converter.trust(None)
    assert converter.of(decoded, PROTOCOL) is None  # (not trusted yet: the reference)
    assert record_of(decoded, Batch, PROTOCOL) == made
    assert converter.of(decoded, PROTOCOL) == made  # (trusted now)
    assert converter.of(decoded, None) is None
    assert converter.of(_message(made, intent="INFORM"), PROTOCOL) is None
    assert converter.of(object(), PROTOCOL) is None
    assert cbcl.parse(_message(made).canonical(), registry=REGISTRY, type=Batch) == made


@settings(max_examples=60, deadline=None)
@given(body=values, intent=st.sampled_from(["REQUEST", "INFORM"]), trusted=st.booleans())
def test_refused_bodies_give_the_same_errors(body: cbcl.Value, intent: str,
                                              trusted: bool) -> None:
    """Whatever the body (the message not checked by a parser: the untrusted path, and the
    trusted one), C and Python give the same record or the same typed error."""
    protocol = PROTOCOL if trusted else None
    for shaped in (body, (cbcl.Symbol("batch"), *body) if isinstance(body, tuple) else body):
        message = _message(shaped, intent)
        assert _outcome(record_of, message, Batch, None) == \
            _outcome(record_of_python, message, Batch, None)
        if protocol is not None:
            assert _outcome(record_of, message, Batch | Cancel, protocol) == \
                _outcome(record_of_python, message, Batch | Cancel, protocol)


def test_a_value_python_refuses_is_the_same_schema_error() -> None:
    body = (cbcl.Symbol("batch"), cbcl.Keyword("batch-id"), "x", cbcl.Keyword("kind"), 7,
            cbcl.Keyword("at"), 2**62)
    message = _message(body)
    Batch.__cbcl_converter__.trust(PROTOCOL)
    expected = _outcome(record_of_python, message, Batch, PROTOCOL)
    assert expected[0] is cbcl.SchemaError
    assert _outcome(record_of, message, Batch, PROTOCOL) == expected


@settings(max_examples=10, deadline=None)
@given(text=declarations(), data=st.data())
def test_random_declarations_same_records(text: str, data: st.DataObject) -> None:
    """Classes cbcl codegen writes for a random declaration: every body its descriptor
    accepts converts to the same instance in C and in Python; the others are refused with
    the same error."""
    descriptor = read_declaration(text).build()
    module = _module_of(descriptor)
    registry = cbcl.Registry()
    registry.load(descriptor, allow_unsigned=True)
    protocol = registry.get("rnd/v1")
    assert protocol is not None and protocol.schema is not None
    classes = module["RECORDS"]
    union = classes[0] if len(classes) == 1 else tuple(classes)
    for record in protocol.schema.records:
        body = data.draw(st.composite(lambda draw, r=record: _draw_value(draw, r))())
        for cls in classes:
            intent = (cls.__cbcl_intents__ or (cbcl.Intent.INFORM,))[0].value
            message = _message(body, intent, "rnd/v1")
            expected = _outcome(record_of_python, message, union, protocol)
            assert _outcome(record_of, message, union, protocol) == expected
            assert _outcome(record_of, message, cls, protocol) == \
                _outcome(record_of_python, message, cls, protocol)
            if not isinstance(expected, tuple):
                _same(record_of(message, union, protocol), expected)


def test_a_bad_plan_is_refused() -> None:
    with pytest.raises(TypeError):
        native.RecordConverter(Item, None, 1, (), (), ())
    with pytest.raises(TypeError):
        native.RecordConverter(Item, Item.__dict__["code"], 1, ((1, 2),), (), ())
    converter = Item.__cbcl_converter__
    with pytest.raises(TypeError):
        converter([1, 2])


def test_a_class_and_its_converter_are_collected() -> None:
    """The class holds its converter and the converter its class: a cycle gc breaks."""
    made = types.new_class("Temporary", (cbcl.Record,), {},
                           lambda ns: ns.update(__annotations__={"x": "int"}))
    ref = weakref.ref(made)
    assert getattr(made, "__cbcl_converter__", None) is not None
    del made
    gc.collect()
    assert ref() is None


# ------------------------------------------------ Decoder.decode(frame, type=C) in C

ENCODER, DECODER = cbcl.Encoder(REGISTRY), cbcl.Decoder(REGISTRY)


def _python_calls(function: Any, *args: Any, **kwargs: Any) -> tuple[Any, list[str]]:
    """``function(*args, **kwargs)`` and the names of the Python functions it called."""
    called: list[str] = []

    def hook(frame: Any, event: str, _arg: Any) -> None:
        if event == "call":
            called.append(frame.f_code.co_name)

    sys.setprofile(hook)
    try:
        made = function(*args, **kwargs)
    finally:
        sys.setprofile(None)
    return made, called


def test_a_frame_decodes_into_its_record_in_c() -> None:
    """Once the protocol is trusted, decode(frame, type=C) runs no Python decode method and
    no record_of: the message frame_message made goes to the class's converter in C."""
    made = Batch(batch_id="b1", kind=7, items=(Item(code="x", flag=True),), urgent=True)
    frame = ENCODER.encode(_message(made))
    Batch.__cbcl_converter__.trust(None)
    first, called = _python_calls(DECODER.decode, frame, type=Batch)
    assert first == made and "record_of" in called  # (the reference decides, then trusts)
    again, called = _python_calls(DECODER.decode, frame, type=Batch)
    _same(again, record_of_python(DECODER.decode(frame), Batch, PROTOCOL), one_body=False)
    assert "decode" not in called and "record_of" not in called


@settings(max_examples=40, deadline=None)
@given(record=batches, trusted=st.booleans(),
       wanted=st.sampled_from(["Batch", "union", "Cancel", "None"]))
def test_frames_decode_into_the_records_python_makes(record: Batch, trusted: bool,
                                                     wanted: str) -> None:
    """decode(frame, type=…) in C gives the record (or the typed error) the Python
    reference gives for the message decode(frame) gives, whatever the class asked for."""
    type_: Any = {"Batch": Batch, "union": Batch | Cancel, "Cancel": Cancel,
                  "None": None}[wanted]
    Batch.__cbcl_converter__.trust(PROTOCOL if trusted else None)
    frame = ENCODER.encode(_message(record))
    message = DECODER.decode(frame)
    expected = message if type_ is None else \
        _outcome(record_of_python, message, type_, PROTOCOL)
    got = _outcome(lambda f: DECODER.decode(f, type=type_), frame)
    assert got == expected
    if type(expected) is Batch:
        _same(got, expected, one_body=False)


def test_a_class_whose_converter_changed_is_looked_up_again() -> None:
    """The C call keeps the converter it found last for a class while the class (and its
    metaclass) is unchanged: one set on the class since is the one asked, never the kept
    one; the same again once it is back."""
    made = Batch(batch_id="b3", kind="a")
    frame = ENCODER.encode(_message(made))
    Batch.__cbcl_converter__.trust(PROTOCOL)
    original = Batch.__dict__["__cbcl_converter__"]
    for _ in range(2):
        got, called = _python_calls(DECODER.decode, frame, type=Batch)
        assert got == made and "decode" not in called
    type.__setattr__(Batch, "__cbcl_converter__", Cancel.__cbcl_converter__)
    try:
        # (a converter of another class: C declines, the Python method decides)
        _, called = _python_calls(_outcome, lambda f: DECODER.decode(f, type=Batch), frame)
        assert "decode" in called
    finally:
        type.__setattr__(Batch, "__cbcl_converter__", original)
    DECODER.decode(frame, type=Batch)
    got, called = _python_calls(DECODER.decode, frame, type=Batch)
    assert got == made and "decode" not in called


def test_a_conversion_c_declines_is_the_references_error() -> None:
    """A datetime outside datetime's range: the converter's ValueError is declined in C and
    the Python method raises the reference's SchemaError."""
    body = (cbcl.Symbol("batch"), cbcl.Keyword("batch-id"), "x", cbcl.Keyword("kind"), 7,
            cbcl.Keyword("at"), 2**62)
    frame = ENCODER.encode(_message(body))
    Batch.__cbcl_converter__.trust(PROTOCOL)
    expected = _outcome(record_of_python, DECODER.decode(frame), Batch, PROTOCOL)
    assert expected[0] is cbcl.SchemaError
    assert _outcome(lambda f: DECODER.decode(f, type=Batch), frame) == expected


def test_text_parses_into_its_record_in_c() -> None:
    """parse(data, registry=R, type=C) of exact bytes: the C entry's message goes to the
    converter in C, no Python parse or record_of; the same record the reference makes."""
    made = Batch(batch_id="b2", kind="b", more=[Item(code="y", qty=3)])
    text = _message(made).canonical().encode()
    Batch.__cbcl_converter__.trust(PROTOCOL)
    got, called = _python_calls(cbcl.parse, text, registry=REGISTRY, type=Batch)
    assert "parse" not in called and "record_of" not in called
    _same(got, record_of_python(cbcl.parse(text, registry=REGISTRY), Batch, PROTOCOL),
          one_body=False)
    # (not the class's body: declined in C, the reference's SchemaError)
    assert _outcome(lambda t: cbcl.parse(t, registry=REGISTRY, type=Cancel), text) == \
        _outcome(record_of_python, cbcl.parse(text, registry=REGISTRY), Cancel, PROTOCOL)
