"""Typed record classes (spec/declarations.md §8): the class mapping, decoding into classes
(text and binary), records as message bodies, and, for random declarations, classes that
decode every accepted body and encode it back byte for byte."""

from __future__ import annotations

import pickle
import sys
import types
from datetime import UTC, datetime
from decimal import Decimal
from typing import Annotated, Any, Literal

import pytest
from hypothesis import given, settings, strategies as st
from strategies import values
from test_declaration import _draw_value, declarations

import cbcl
from cbcl.descriptor import Declared, Key, declaration_of, record_of
from cbcl.protocol._codegen import generate_records
from cbcl.protocol._declaration import read_declaration


class Line(cbcl.Record):
    code: str
    qty: Annotated[int, cbcl.Range(1, 9)] = 1


class SampleRequest(cbcl.Record, intent="REQUEST"):
    sample_id: Annotated[str, cbcl.Length(1, 32)]
    assay: Literal["cbc", "hba1c"]
    priority: Annotated[int, cbcl.Range(1, 5)] = 3
    lines: tuple[Line, ...] = ()
    note: str | None = None
    urgent: bool = False
    price: Annotated[Decimal, cbcl.Range(0, None)] | None = None
    lab: Annotated[cbcl.Symbol, Key("lab-code")] | None = None
    extra: Annotated[cbcl.Value, Declared("(keys (else any))")] | None = None


class SampleResult(cbcl.Record, intent="INFORM"):
    sample_id: str
    value: int | Decimal


class SampleFailed(cbcl.Record, intent="INFORM", head="sample-failed"):
    sample_id: str


DESCRIPTOR = cbcl.descriptor_from(SampleRequest, SampleResult, SampleFailed, id="lab/v1",
                                  version=1)
REGISTRY = cbcl.Registry()
REGISTRY.load(DESCRIPTOR, allow_unsigned=True)


def message(body: Any, intent: str = "REQUEST") -> cbcl.Message:
    return cbcl.Message(message_id="m1", sender="agent://a", receiver="agent://b",
                        intent=intent, protocol="lab/v1", body=body)


def test_the_class_is_the_declared_record() -> None:
    assert SampleRequest.__cbcl_type__ == (
        "(record sample-request (:sample-id (string :min-length 1 :max-length 32) required) "
        "(:assay (one-of cbc hba1c) required) (:priority (integer :min 1 :max 5)) "
        "(:lines (list-of (record line (:code string required) (:qty (integer :min 1 :max 9)))))"
        " (:note string) (:urgent boolean) (:price (decimal :min 0)) (:lab-code symbol) "
        "(:extra (keys (else any))))")
    declared = cbcl.canonical(declaration_of(SampleRequest, SampleResult, SampleFailed,
                                             id="lab/v1", version=1))
    assert cbcl.descriptor_from_declaration(declared) == DESCRIPTOR
    assert read_declaration(declared).build() == DESCRIPTOR


def test_instances_are_immutable_slotted_values() -> None:
    r = SampleRequest(sample_id="S-1", assay="hba1c", lines=(Line(code="x"),),
                      lab="north")  # type: ignore[arg-type]  # (str taken: coerced)
    assert not hasattr(r, "__dict__")
    with pytest.raises(AttributeError):
        r.priority = 4  # type: ignore[misc]
    assert r == SampleRequest(sample_id="S-1", assay="hba1c", lines=(Line(code="x"),),
                              lab=cbcl.Symbol("north"))
    assert r != SampleRequest(sample_id="S-2", assay="hba1c")
    assert type(r.lab) is cbcl.Symbol and r.priority == 3 and r.note is None
    assert repr(Line(code="a")) == "Line(code='a', qty=1)"
    assert hash(Line(code="a")) == hash(Line(code="a"))
    assert pickle.loads(pickle.dumps(r)) == r
    match r:
        case SampleRequest(sample_id="S-1", assay="hba1c"):
            pass
        case _:
            pytest.fail("no match")


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"sample_id": 1, "assay": "cbc"}, TypeError),
    ({"sample_id": "", "assay": "cbc"}, ValueError),
    ({"sample_id": "x", "assay": "pcr"}, ValueError),
    ({"sample_id": "x", "assay": "cbc", "priority": 6}, ValueError),
    ({"sample_id": "x", "assay": "cbc", "priority": True}, TypeError),
    ({"sample_id": "x", "assay": "cbc", "price": 1.5}, TypeError),
    ({"sample_id": "x", "assay": "cbc", "price": Decimal("-1")}, ValueError),
    ({"sample_id": "x", "assay": "cbc", "lab": "not a symbol"}, ValueError),
    ({"sample_id": "x", "assay": "cbc", "lines": (Line(code="a"), "b")}, TypeError),
    ({"sample_id": "x", "assay": "cbc", "extra": (1, 2, 3)}, ValueError),
    ({"sample_id": "x"}, TypeError),
])
def test_the_constructor_checks_types_and_the_schema(kwargs: dict[str, Any],
                                                     error: type[Exception]) -> None:
    with pytest.raises(error):
        SampleRequest(**kwargs)


def test_bad_annotations_are_refused_at_class_creation() -> None:
    with pytest.raises(TypeError, match="no schema type"):
        types.new_class("Bad", (cbcl.Record,), {}, lambda ns: ns.update(
            __annotations__={"x": float}))
    with pytest.raises(TypeError, match="union"):
        types.new_class("Bad", (cbcl.Record,), {}, lambda ns: ns.update(
            __annotations__={"x": Line | SampleResult}))
    with pytest.raises(TypeError, match="default"):
        types.new_class("Bad", (cbcl.Record,), {}, lambda ns: ns.update(
            __annotations__={"x": str | None}))


@pytest.mark.parametrize(("bounds", "refused"), [
    ((-2**63, 2**63 - 1), False), ((-2**63 - 1, 0), True), ((0, 2**63), True),
    ((Decimal("Infinity"), None), True)])
def test_a_range_the_wire_cannot_carry_is_refused_at_class_creation(
        bounds: tuple[Any, Any], refused: bool) -> None:
    # a bound outside 64 bits (the wire's integers) or not finite: TypeError naming the
    # member, as every other annotation error (a ValueError from the writer before)
    def make() -> type:
        return types.new_class("Ranged", (cbcl.Record,), {}, lambda ns: ns.update(
            __annotations__={"n": Annotated[int, cbcl.Range(*bounds)]}))
    if refused:
        with pytest.raises(TypeError, match=r"Ranged\.n: "):
            make()
    else:
        assert issubclass(make(), cbcl.Record)


def test_decoding_into_classes_text_and_binary() -> None:
    r = SampleRequest(sample_id="S-1", assay="cbc", lines=(Line(code="x", qty=2),),
                      price=Decimal("1.50"), extra=(cbcl.Keyword("k"), 1))
    sent = message(r)
    text = sent.canonical().encode()
    assert cbcl.parse(text, registry=REGISTRY, type=SampleRequest) == r
    assert cbcl.parse(text.decode(), registry=REGISTRY, type=SampleRequest) == r
    frame = cbcl.Encoder(REGISTRY).encode(sent)
    got = cbcl.Decoder(REGISTRY).decode(frame, type=SampleRequest)
    assert got == r and got.to_body() == r.to_body()
    result = message(SampleFailed(sample_id="S-1"), "INFORM").canonical()
    either = cbcl.parse(result, registry=REGISTRY, type=SampleResult | SampleFailed)
    assert either == SampleFailed(sample_id="S-1")


def test_a_body_that_is_not_the_class_is_a_schema_error() -> None:
    text = message(SampleFailed(sample_id="S-1"), "INFORM").canonical()
    with pytest.raises(cbcl.SchemaError, match="expected"):
        cbcl.parse(text, registry=REGISTRY, type=SampleRequest)

    class Strict(cbcl.Record, intent="INFORM", head="sample-failed"):
        sample_id: Annotated[str, cbcl.Length(5, 9)]
    with pytest.raises(cbcl.SchemaError, match="shorter"):
        cbcl.parse(text, registry=REGISTRY, type=Strict)
    with pytest.raises(cbcl.SchemaError, match="REQUEST"):
        record_of(message(SampleFailed(sample_id="S-1"), "REQUEST"), SampleFailed)
    with pytest.raises(TypeError):
        cbcl.parse(text, registry=REGISTRY, type=int)


# ------------------------------------------------ random declarations: classes round-trip

def _module_of(descriptor: bytes) -> dict[str, Any]:
    module = types.ModuleType("cbcl_generated_records")
    sys.modules[module.__name__] = module
    exec(compile(generate_records(descriptor), "generated.py", "exec"), vars(module))
    return vars(module)


@settings(max_examples=40, deadline=None)
@given(text=declarations(), data=st.data())
def test_random_declarations_decode_into_classes_and_back_byte_for_byte(
        text: str, data: st.DataObject) -> None:
    """For a random declaration: the classes cbcl codegen writes build the same descriptor
    bytes; every body the descriptor accepts decodes into them (text and binary) and
    encodes back byte for byte; an instance made again from its fields validates."""
    declared = read_declaration(text)
    descriptor = declared.build()
    module = _module_of(descriptor)
    assert module["descriptor"]() == descriptor
    registry = cbcl.Registry()
    registry.load(descriptor, allow_unsigned=True)
    schema = registry.get(cbcl.Symbol("rnd/v1")).schema  # type: ignore[union-attr]
    assert schema is not None
    records = module["RECORDS"]
    union = records[0] if len(records) == 1 else tuple(records)
    encoder, decoder = cbcl.Encoder(registry), cbcl.Decoder(registry)
    for intent, _ in declared.starts:
        for record in schema.records:
            body = data.draw(st.composite(lambda draw, r=record: _draw_value(draw, r))())
            sent = cbcl.Message(message_id="m", sender="agent://a", receiver="agent://b",
                                intent=intent, protocol="rnd/v1", body=body)
            try:
                cbcl.validate(sent, registry=registry)
            except cbcl.CBCLError:
                continue
            got = cbcl.parse(sent.canonical(), registry=registry, type=union)
            again = cbcl.Message(message_id="m", sender="agent://a", receiver="agent://b",
                                 intent=intent, protocol="rnd/v1", body=got)
            assert again.canonical() == sent.canonical()
            frame = encoder.encode(sent)
            assert encoder.encode(again) == frame
            assert decoder.decode(frame, type=union) == got
            fields = {name: getattr(got, name) for name in type(got).__match_args__}
            remade = type(got)(**fields)
            assert remade == got
            cbcl.validate(cbcl.Message(message_id="m", sender="agent://a",
                                       receiver="agent://b", intent=intent,
                                       protocol="rnd/v1", body=remade), registry=registry)


class Stamped(cbcl.Record, intent="NOTIFY"):
    at: datetime
    until: Annotated[datetime, cbcl.Range(0, None)] | None = None


def test_datetime_is_integer_ms_utc() -> None:
    assert Stamped.__cbcl_type__ == \
        "(record stamped (:at integer required) (:until (integer :min 0)))"
    at = datetime(2026, 12, 7, 10, 0, 0, 123000, tzinfo=UTC)
    made = Stamped(at=at)
    assert made.to_body() == (cbcl.Symbol("stamped"), cbcl.Keyword("at"), 1_796_637_600_123)
    assert Stamped.from_body(made.to_body()) == made
    with pytest.raises(ValueError, match="time zone"):
        Stamped(at=datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="millisecond"):
        Stamped(at=at.replace(microsecond=123456))
    with pytest.raises(ValueError, match="below the minimum"):
        Stamped(at=at, until=datetime(1969, 1, 1, tzinfo=UTC))
    with pytest.raises(cbcl.SchemaError, match="datetime range"):
        Stamped.from_body((cbcl.Symbol("stamped"), cbcl.Keyword("at"), 2**63 - 1))


def test_a_record_holds_only_records_defined_before_it() -> None:
    with pytest.raises(TypeError, match="cannot be resolved"):
        types.new_class("Node", (cbcl.Record,), {}, lambda ns: ns.update(
            __annotations__={"children": "tuple[Node, ...]"}))


def test_decoding_keys_in_another_order_or_not_shared() -> None:
    """The dict path: keys in another order than declared, or keyword objects that are
    not the reader's shared ones, decode to the same record."""
    body = (cbcl.Symbol("sample-request"), cbcl.Keyword("assay"), cbcl.Symbol("cbc"),
            cbcl.Keyword("sample-id"), "S-9")
    made = SampleRequest.from_body(body)
    assert made == SampleRequest(sample_id="S-9", assay="cbc")
    assert made.to_body() is body


@settings(max_examples=300, deadline=None)
@given(body=values)
def test_any_body_gives_a_record_or_a_schema_error(body: cbcl.Value) -> None:
    """The untrusted path (no protocol that holds the class's record): whatever the body,
    an instance or a SchemaError, never another exception."""
    for shaped in (body, (cbcl.Symbol("sample-request"), *body) if isinstance(body, tuple)
                   else body):
        try:
            made = record_of(message(shaped), SampleRequest)
        except cbcl.SchemaError:
            continue
        assert isinstance(made, SampleRequest) and made.to_body() == shaped


def test_the_trust_memo_is_bounded() -> None:
    """A class remembers, for at most _TRUST_MAX protocols, whether their schema holds its
    record: at N entries the next one empties the memo first."""
    from cbcl.protocol._records import _TRUST_MAX, _trusted

    class Once(cbcl.Record, intent="INFORM"):
        n: int

    known: dict[int, Any] = Once.__cbcl_trusted__  # type: ignore[attr-defined]
    kept = []
    for i in range(_TRUST_MAX + 1):
        registry = cbcl.Registry()
        registry.load(cbcl.descriptor_from(Once, id=f"once{i}/v1", version=1),
                      allow_unsigned=True)
        protocol = registry.get(cbcl.Symbol(f"once{i}/v1"))
        kept.append(protocol)
        assert _trusted(Once, protocol) is True
        assert len(known) == (i % _TRUST_MAX) + 1


class Loose(cbcl.Record, intent="INFORM", head="loose"):
    v: cbcl.Value
    w: cbcl.Value | None = None
    e: tuple[Line, ...] = ()


def test_value_members_are_any() -> None:
    """``cbcl.Value`` (a string alias at run time) is ``any``, ``| None`` too."""
    assert Loose.__cbcl_type__.startswith("(record loose (:v any required) (:w any)")
    made = Loose(v=(cbcl.Symbol("x"), 1), w=(1, "a"))
    assert made.w == (1, "a")
    assert cbcl.canonical(made.to_body()) == '(loose :v (x 1) :w (1 "a") :e ())'
