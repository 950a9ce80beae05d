"""Messages in Python (issue 13): building bodies from Python values, reading them by
field name, validating a message as its receiver would, and encoding that validates.

Tests internals in a few places: the size bound of validate (``_within``) and the
constructor's check the parser skips."""

from __future__ import annotations

import dataclasses
import enum
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given, settings, strategies as st
from strategies import atoms, decimals, integers, messages, strings, symbols, uris
from test_protocol import DESCRIPTORS, EXAMPLES, SHIPPED

import cbcl
from cbcl import (
    URI,
    BodyError,
    CBCLError,
    Decoder,
    Encoder,
    Fields,
    FieldsError,
    Keyword,
    LimitError,
    Limits,
    Message,
    ProtocolError,
    Registry,
    SchemaError,
    Symbol,
    UnknownProtocolError,
)

ANY = (b'(protocol-descriptor (id any/v1) (version 1) (intents INFORM NOT-UNDERSTOOD) '
       b'(grammar "body: value"))')
S, K = Symbol, Keyword


def _registry() -> Registry:
    reg = Registry(disk_cache=False, isolate=False)
    for name in SHIPPED:
        reg.load((DESCRIPTORS / f"{name}.cbcl").read_bytes(), allow_unsigned=True)
    reg.load(ANY, allow_unsigned=True)
    return reg


REGISTRY = _registry()


@pytest.fixture(scope="module")
def registry() -> Registry:
    return REGISTRY


def message(body: Any, *, protocol: str = "any/v1", intent: str = "INFORM") -> Message:
    return Message(message_id="m-1", sender="agent://a", receiver="agent://b",
                   intent=intent, protocol=protocol, body=body)


# --------------------------------------------------------------------------- building


class Colour(enum.StrEnum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


class MyDecimal(Decimal):
    pass


@pytest.mark.parametrize(("given", "expected", "text"), [
    ("lamp", "lamp", '"lamp"'),
    ("", "", '""'),
    ("é\n\u202e", "é\n\u202e", '"é\\n\\u202e"'),
    (0, 0, "0"),
    (-(2**63), -(2**63), str(-(2**63))),
    (2**63 - 1, 2**63 - 1, str(2**63 - 1)),
    (Decimal("12.50"), Decimal("12.50"), "12.50"),
    (Decimal("5"), Decimal("5"), "5.0"),
    (Decimal("-0"), Decimal("-0"), "-0.0"),
    (Decimal("1e27"), Decimal("1e27"), "1000000000000000000000000000.0"),
    (S("render-video"), S("render-video"), "render-video"),
    (K("id"), K("id"), ":id"),
    (URI("agent://x"), URI("agent://x"), "agent://x"),
    ([1, ["a", [S("b")]]], (1, ("a", (S("b"),))), '(1 ("a" (b)))'),
    ((), (), "()"),
    ([], (), "()"),
    (Colour.RED, "red", '"red"'),  # a str subclass is its text
    (Level.HIGH, 3, "3"),
    (MyDecimal("1.5"), Decimal("1.5"), "1.5"),
])
def test_every_conversion(given: Any, expected: Any, text: str) -> None:
    value = cbcl.as_value(given)
    assert value == expected and type(value) is type(expected)
    if isinstance(expected, tuple):
        assert isinstance(value, tuple)
        assert all(type(a) is type(b) for a, b in zip(value, expected, strict=True))
    assert cbcl.canonical(value) == text
    built = cbcl.body("x", v=given)
    assert built == (S("x"), K("v"), expected) and type(built[2]) is type(expected)
    assert cbcl.canonical(built) == f"(x :v {text})"


def test_exact_values_are_not_copied() -> None:
    value = (S("a"), K("b"), ("c", 1, Decimal("2.0")))
    assert cbcl.as_value(value) is value
    assert message(value).body is value


def test_body_builds_the_example() -> None:
    built = cbcl.body("bid", item="lamp", amount=Decimal("12.50"), bidder=URI("agent://x"))
    assert cbcl.canonical(built) == '(bid :item "lamp" :amount 12.50 :bidder agent://x)'
    assert built == cbcl.read('(bid :item "lamp" :amount 12.50 :bidder agent://x)')
    # the shared atoms, as the reader makes them (the schema finds them by identity)
    read = cbcl.read('(bid :item "lamp")')
    assert isinstance(read, tuple)
    assert built[0] is read[0] and built[1] is read[1]


def test_keyword_names() -> None:
    built = cbcl.body("proposal", task_id="t", valid_until=1, from_=2, class_=3, x_=4)
    assert built[1::2] == (K("task-id"), K("valid-until"), K("from"), K("class"), K("x-"))
    # literal names: a mapping, its keys as written (an underscore stays)
    literal = cbcl.body("inform", S("results"), {"order_id": "A-1", ":limit": 3,
                                                 K("value"): ["p"]}, note="n")
    assert cbcl.canonical(literal) == \
        '(inform results :order_id "A-1" :limit 3 :value ("p") :note "n")'
    assert cbcl.keys(cpu=2, mem=4096) == (K("cpu"), 2, K("mem"), 4096)
    assert cbcl.keys({"a_b": 1}, c_d=2) == (K("a_b"), 1, K("c-d"), 2)
    assert cbcl.keys() == ()
    assert cbcl.body(S("deny")) == (S("deny"),)


@pytest.mark.parametrize(("call", "error", "words"), [
    (lambda: cbcl.body("x", a=1, **{"a": 2}), TypeError, "multiple values"),  # Python's own
    (lambda: cbcl.body("x", {"a-b": 1}, a_b=2), ValueError, "body field `:a-b` is given twice"),
    (lambda: cbcl.body("x", **{"café": 1}), ValueError, "body field name 'café'"),
    (lambda: cbcl.body("x", {"a b": 1}), ValueError, "body field name 'a b'"),
    (lambda: cbcl.body("x", {1: 1}), TypeError, "a body field name is a str or Keyword"),
    (lambda: cbcl.body("x", {S("a"): 1}), TypeError, "not Symbol"),
    (lambda: cbcl.body("not a symbol"), ValueError, "not a CBCL symbol"),
    (lambda: cbcl.body("1x"), ValueError, "not a CBCL symbol"),
    (lambda: cbcl.body(K("x")), TypeError, "a body's head is a symbol name"),
    (lambda: cbcl.body(3), TypeError, "a body's head is a symbol name"),  # type: ignore[arg-type]
    (lambda: cbcl.keys("x"), TypeError, "cbcl.keys() takes mappings"),  # type: ignore[arg-type]
])
def test_builder_refusals(call: Any, error: type, words: str) -> None:
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value)


class Opaque:
    pass


REFUSED: list[tuple[object, str]] = [
    (1.5, "float is not a CBCL value; use decimal.Decimal"),
    (float("nan"), "float is not a CBCL value; use decimal.Decimal"),
    (None, "None is not a CBCL value; leave the field out"),
    (True, 'bool is not a CBCL value; use an int, or Symbol("true")'),
    ({"a": 1}, "dict is not a CBCL value; use cbcl.keys(...)"),
    (b"x", "bytes is not a CBCL value; use a str"),
    (bytearray(b"x"), "bytearray is not a CBCL value; use a str"),
    ({1}, "set is not a CBCL value; use a list or tuple"),
    (frozenset(), "frozenset is not a CBCL value; use a list or tuple"),
    (1j, "complex is not a CBCL value; use decimal.Decimal"),
    (Fraction(1, 3), "Fraction is not a CBCL value; use decimal.Decimal"),
    (Opaque(), "Opaque is not a CBCL value; use str, int"),
    (iter([1]), "list_iterator is not a CBCL value"),
]


@pytest.mark.parametrize(("bad", "words"), REFUSED, ids=lambda v: type(v).__name__)
def test_each_refused_type_at_construction(bad: Any, words: str) -> None:
    with pytest.raises(TypeError) as info:
        cbcl.body("bid", item="lamp", amount=bad)
    assert str(info.value).startswith(f"body field `:amount`: {words}")
    with pytest.raises(TypeError, match=r"body field `:tags\[1\]\[0\]`: "):
        cbcl.body("bid", tags=["a", [bad]])
    if not isinstance(bad, dict):  # (a positional mapping gives fields)
        with pytest.raises(TypeError, match=r"body item `1`: "):
            cbcl.body("bid", bad)
    with pytest.raises(TypeError, match=r"value `\$\[2\]`: "):
        cbcl.as_value([1, 2, bad])
    with pytest.raises(TypeError, match=r"Message body `\$\.body\.bid\[:amount\]`: "):
        message([S("bid"), K("amount"), bad])
    if bad is not None:  # (a body of None is no body)
        with pytest.raises(TypeError, match=r"Message body `\$\.body`: "):
            message(bad)
    with pytest.raises(TypeError, match=r"field `:x`: "):
        cbcl.keys(x=bad)


@pytest.mark.parametrize(("bad", "words"), [
    (2**63, "integer 9223372036854775808 is outside the signed 64-bit range"),
    (-(2**63) - 1, "is outside the signed 64-bit range"),
    (Decimal("NaN"), "CBCL has no NaN decimal"),
    (Decimal("-Infinity"), "CBCL has no -Infinity decimal"),
    (Decimal("sNaN"), "CBCL has no sNaN decimal"),
    (Decimal("1e-50"), "longer than 40 characters"),
    (Decimal("1e40"), "longer than 40 characters"),
    (Decimal("1" * 40 + ".5"), "longer than 40 characters"),
    ("a\ud800", "a string holds a lone surrogate U+D800"),
])
def test_each_out_of_range_atom_at_construction(bad: Any, words: str) -> None:
    with pytest.raises(ValueError) as info:
        cbcl.body("bid", amount=bad)
    assert str(info.value).startswith("body field `:amount`: ") and words in str(info.value)
    with pytest.raises(ValueError, match=r"Message body `\$\.body\.bid\[:amount\]`: "):
        message((S("bid"), K("amount"), bad))


def test_the_longest_decimals_are_accepted() -> None:
    for text in ["1" * 38 + ".5", "-" + "1" * 37 + ".5", "0." + "1" * 38, "1e37"]:
        value = cbcl.as_value(Decimal(text))
        assert len(cbcl.canonical(value)) <= 40


def test_a_list_that_contains_itself() -> None:
    cyclic: list[Any] = [1]
    cyclic.append([cyclic])
    with pytest.raises(ValueError, match=r"value `\$\[1\]\[0\]`: a list that contains itself"):
        cbcl.as_value(cyclic)
    shared = [1]
    assert cbcl.as_value([shared, shared]) == ((1,), (1,))  # the same list twice is fine


def test_message_refuses_at_construction_and_converts_lists() -> None:
    m = message([S("a"), [K("b"), 1]])
    assert isinstance(m.body, tuple)
    assert m.body == (S("a"), (K("b"), 1)) and type(m.body[1]) is tuple
    assert hash(m) == hash(message((S("a"), (K("b"), 1))))
    with pytest.raises(TypeError, match=r"`\$\.body\.a\[1\]\[:b\]`: float"):
        message([S("a"), [K("b"), 1.0]])
    with pytest.raises(ValueError, match="message_id holds a lone surrogate"):
        Message(message_id="\udc00", sender="agent://a", receiver="agent://b",
                intent="INFORM", protocol="any/v1")
    with pytest.raises(TypeError):  # dataclasses.replace checks too
        dataclasses.replace(m, body={"a": 1})  # type: ignore[arg-type]  # on purpose


def test_parsing_keeps_the_trusted_unchecked_path(registry: Registry,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The parser and decoder build messages without the constructor's body check."""
    import cbcl.protocol._message

    small = cbcl.encode(message((S("a"),)), registry=registry)

    def refuse(*args: Any) -> Any:
        raise AssertionError("the body was checked again")

    monkeypatch.setattr(cbcl.protocol._message, "check_value", refuse)
    for example in EXAMPLES:
        parsed = cbcl.parse(example.read_bytes(), registry=registry)
        frame = cbcl.encode(parsed, registry=registry)
        for decoder in (Decoder(registry), Decoder(registry, pure_python=True)):
            assert decoder.decode(frame) == parsed
        parsed.signing_bytes()
    # the careful decoding path too (a frame the fast path declines: a first envelope
    # shape under new limits)
    assert Decoder(registry, limits=Limits(max_nodes=60000)).decode(small).body == (S("a"),)
    with pytest.raises(AssertionError):
        message([1])


# --------------------------------------------------------------------------- reading


def test_fields_by_name(registry: Registry) -> None:
    m = cbcl.parse((DESCRIPTORS / "examples" / "contract-net-v1-propose.cbcl").read_bytes(),
                   registry=registry)
    view = m.fields()
    assert view.head == "proposal" and view.heads == ("proposal",)
    assert list(view) == ["task-id", "bid", "valid-until"] and len(view) == 3
    assert view["task-id"] == view[":task-id"] == view[K("task-id")] == "t-4711"
    assert view.get("note") is None and view.get("note", 5) == 5
    assert "bid" in view and ":bid" in view and K("bid") in view and "note" not in view
    assert 3 not in view  # type: ignore[comparison-overlap]  # (an int, on purpose)
    with pytest.raises(KeyError):
        view["note"]
    bid = view["bid"]
    assert type(bid) is Fields and bid.head == "bid" and bid.path == "$.body.proposal[:bid]"
    assert bid["price"] == Decimal("12.50") and bid["currency"] == S("EUR")
    assert bid.raw == (S("bid"), K("price"), Decimal("12.50"), K("currency"), S("EUR"),
                         K("eta"), 1800000)
    assert dict(view)["valid-until"] == 1764501000000
    assert m.body is not None
    assert view == Fields(m.body) and view != Fields((S("x"),)) and view != dict(view)
    assert hash(view) == hash(Fields(m.body))
    assert repr(bid) == "Fields((bid :price 12.50 :currency EUR :eta 1800000))"


def test_reading_without_a_schema() -> None:
    view = Fields(cbcl.read('(query weather :city "Paris" :unit celsius :result (snapshot '
                            ':id "s") :list (a b) :pairs ((x :y 1)) :empty () :keys (:k 1))'))
    assert view.head == "query" and view.heads == ("query", "weather")
    result = view["result"]
    assert type(result) is Fields and result["id"] == "s"
    assert view["list"] == (S("a"), S("b"))  # a plain list stays a tuple
    assert view["pairs"] == ((S("x"), K("y"), 1),)  # ... with what it holds
    assert view["empty"] == ()
    keys = view["keys"]
    assert type(keys) is Fields and keys.head is None and keys["k"] == 1
    assert Fields(()).head is None and len(Fields(())) == 0
    assert Fields((S("deny"),)).head == "deny" and len(Fields((S("deny"),))) == 0


@pytest.mark.parametrize(("value", "path", "words"), [
    ("x", "$", 'expected a (head :key value …) list, found a string "x"'),
    (5, "$", "found an integer 5"),
    ((S("a"), K("b")), "$.a[1]", ":b has none"),
    ((S("a"), K("b"), 1, "c", 2), "$.a[3]", 'expected a keyword, found a string "c"'),
    ((S("a"), K("b"), 1, K("b"), 2), "$.a[:b]", "key :b is given twice"),
    ((1, K("b")), "$[0]", "expected a keyword, found an integer 1"),
])
def test_a_list_not_of_the_form_is_refused(value: Any, path: str, words: str) -> None:
    with pytest.raises(FieldsError) as info:
        Fields(value)
    assert info.value.path == path and words in str(info.value)
    assert isinstance(info.value, CBCLError) and info.value.exit_code == 7


def test_fields_refuses_what_is_no_cbcl_value(registry: Registry) -> None:
    with pytest.raises(TypeError, match=r"cbcl\.as_value"):
        Fields([S("a")])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="float is not a CBCL value"):
        Fields(1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"schema must be a cbcl\.conversation\.Schema"):
        Fields((S("a"),), schema="x")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Fields((S("a"),))[1]  # type: ignore[index]
    bodiless = Message(message_id="m", sender="agent://a", receiver="agent://b",
                       intent="NOT-UNDERSTOOD", protocol="any/v1")
    with pytest.raises(FieldsError, match="the message has no body"):
        bodiless.fields()
    with pytest.raises(FieldsError, match=r"\$\.body: expected a \(head"):
        dataclasses.replace(bodiless, body="why").fields(registry)
    with pytest.raises(UnknownProtocolError):
        dataclasses.replace(bodiless, protocol=S("nope/v1")).fields(registry)


def test_require_gives_one_exact_type() -> None:
    view = Fields(cbcl.body("bid", price=Decimal("1.5"), item="lamp", currency=S("EUR"),
                            tags=["a"], seller=cbcl.body("agent", id=7)))
    price: Decimal = view.require("price", Decimal)
    assert price == Decimal("1.5")
    assert view.require("item", str) == "lamp"
    assert view.require("currency", Symbol) == S("EUR")
    assert view.require("tags", tuple) == ("a",)
    assert view.require("seller", Fields).require("id", int) == 7
    with pytest.raises(FieldsError) as info:
        view.require("currency", str)  # a symbol is not a str here
    assert info.value.path == "$.bid[:currency]"
    assert str(info.value) == "$.bid[:currency]: expected str, found a symbol EUR"
    with pytest.raises(FieldsError, match=r"\$: required field :note is missing"):
        view.require("note", str)
    with pytest.raises(FieldsError, match="expected int, found a list of fields"):
        view.require("seller", int)


SCHEMA = cbcl.conversation.compile_schema(cbcl.read("""
(schema
  (record lot
    (:items (list-of (record item (:name string required) (:rest any))) required)
    (:open boolean)
    (:size (keys (:w integer) (:h integer)))
    (:note (record note))
    (:anything any)
    (else symbol)))
"""))


def test_reading_with_a_schema() -> None:
    value = cbcl.read('(lot :items ((item :name "a") (item :name "b" :rest (r :x 1))) '
                      ':open true :size (:w 2) :note (note) :anything (k :v 1) :extra x)')
    view = Fields(value, schema=SCHEMA)
    items = view["items"]
    assert type(items) is tuple and [type(i) for i in items] == [Fields, Fields]
    first, second = items
    assert type(first) is Fields and type(second) is Fields  # (as the line above says)
    assert first["name"] == "a" and second.path == "$.lot[:items][1]"
    assert type(second["rest"]) is Fields
    note = view["note"]
    assert type(note) is Fields and len(note) == 0
    assert type(view["anything"]) is Fields  # any: read as without a schema
    assert view["open"] == S("true") and view["extra"] == S("x")
    assert view.to_dict() == {
        "items": [{"name": "a"}, {"name": "b", "rest": {"x": 1}}], "open": True,
        "size": {"w": 2}, "note": {}, "anything": {"v": 1}, "extra": S("x")}
    assert type(view.to_dict(as_str=True)["extra"]) is str
    # a body no record names is read as without a schema
    assert Fields((S("other"), K("a"), 1), schema=SCHEMA)["a"] == 1
    with pytest.raises(SchemaError, match=r"\$\.lot\[:items\]\[0\]\.item: required key :name"):
        Fields(cbcl.read("(lot :items ((item)))"), schema=SCHEMA)


def test_to_dict_plain_python() -> None:
    view = Fields(cbcl.read('(t :s "x" :n 1 :d 1.5 :sym a :kw :k :u agent://u '
                            ':l (1 (2 (3))) :r (r :x y))'))
    assert view.to_dict() == {"s": "x", "n": 1, "d": Decimal("1.5"), "sym": S("a"),
                              "kw": K("k"), "u": URI("agent://u"), "l": [1, [2, [3]]],
                              "r": {"x": S("y")}}
    plain = view.to_dict(as_str=True)
    assert plain["sym"] == "a" and plain["kw"] == ":k" and plain["u"] == "agent://u"
    assert all(type(plain[k]) is str for k in ("sym", "kw", "u"))
    deep = Fields((S("t"), K("l"), cbcl.as_value(_nest(3000))))
    assert deep.to_dict()["l"] is not None  # iterative: no RecursionError


def _nest(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def test_fields_with_the_registry_schema(registry: Registry) -> None:
    m = cbcl.parse((DESCRIPTORS / "examples" / "task-assignment-v1.cbcl").read_bytes(),
                   registry=registry)
    view = m.fields(registry)
    resources = view["resources"]
    assert type(resources) is Fields and resources["cpu"] == 2
    assert view.to_dict(as_str=True)["cmd"] == {"algorithm": "bfs",
                                                "data-ref": "hdfs://cluster/data/graph-17"}
    broken = dataclasses.replace(m, body=cbcl.body("task", id=""))
    assert broken.fields()["id"] == ""  # without the registry: not checked
    with pytest.raises(SchemaError):
        broken.fields(registry)


# --------------------------------------------------------------------------- validating


def outcome(fn: Any) -> Any:
    """``"accepted"``, or the CBCLError raised as (class, message, position)."""
    try:
        fn()
    except CBCLError as exc:
        return type(exc), exc.message, exc.position
    return "accepted"


def test_validate_accepts_the_examples(registry: Registry) -> None:
    for example in EXAMPLES:
        m = cbcl.parse(example.read_bytes(), registry=registry)
        assert cbcl.validate(m, registry=registry) is None  # type: ignore[func-returns-value]


@pytest.mark.parametrize(("m", "error"), [
    (message(cbcl.body("proposal", task_id="", bid=cbcl.body("bid", price=Decimal("1.0"),
                                                              currency=S("EUR"))),
             protocol="contract-net/v1", intent="PROPOSE"), SchemaError),
    (message(cbcl.body("proposal", task_id="t", bid=3), protocol="contract-net/v1",
             intent="PROPOSE"), BodyError),
    (message(None, protocol="contract-net/v1", intent="PROPOSE"), BodyError),
    (message(cbcl.body("x"), protocol="request/v1", intent="NOT-UNDERSTOOD"), BodyError),
    (message(cbcl.body("agree", action_id="x"), protocol="request/v1", intent="CFP"),
     ProtocolError),
    (message(cbcl.body("x"), protocol="nope/v1"), UnknownProtocolError),
    (message(list(range(5000))), LimitError),
    (message(_nest(70)), LimitError),
    (message("x" * 70000), LimitError),
    (message(S("a" * 200)), LimitError),
])
def test_validate_raises_what_parse_raises(registry: Registry, m: Message,
                                           error: type) -> None:
    expected = outcome(lambda: cbcl.parse(m.canonical(), registry=registry))
    assert expected[0] is error
    assert outcome(lambda: cbcl.validate(m, registry=registry)) == expected
    assert outcome(lambda: cbcl.encode(m, registry=registry))[0] is error


def test_validate_arguments(registry: Registry) -> None:
    m = message((S("a"),))
    with pytest.raises(TypeError):
        cbcl.validate("m", registry=registry)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        cbcl.validate(m, registry=None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        cbcl.validate(m, registry=registry, limits=5)  # type: ignore[arg-type]
    deep = message(_nest(69))  # 70 lists: 72 deep with the envelope
    cbcl.validate(deep, registry=registry, limits=Limits(max_depth=72))
    with pytest.raises(LimitError):
        cbcl.validate(deep, registry=registry, limits=Limits(max_depth=71))


# Value-level mutations of the examples' bodies: drop, repeat, replace or wrap one item,
# or swap two, anywhere in the tree.

OPS = ("drop", "dup", "swap", "wrap", "replace", "same-kind", "deeper", "keyword-as-symbol")


def _mutate(value: Any, data: st.DataObject, ops: tuple[str, ...] = OPS) -> Any:
    if type(value) is not tuple or not value or data.draw(st.integers(0, 4)) == 0:
        if "replace" not in ops:
            kind = SAME_KIND.get(type(value))
            return value if kind is None else data.draw(kind, label="same kind")
        return data.draw(st.one_of(atoms, st.just(()), st.tuples(atoms)), label="atom")
    items = list(value)
    index = data.draw(st.integers(0, len(items) - 1))
    op = data.draw(st.sampled_from(ops))
    if op == "drop":
        del items[index]
    elif op == "dup":
        items.insert(index, items[index])
    elif op == "swap" and index + 1 < len(items):
        items[index], items[index + 1] = items[index + 1], items[index]
    elif op == "wrap":
        items[index] = (items[index],)
    elif op == "replace":
        items[index] = data.draw(atoms, label="replacement")
    elif op == "same-kind" and type(items[index]) in SAME_KIND:  # the schema's to judge
        items[index] = data.draw(SAME_KIND[type(items[index])], label="same kind")
    elif op == "keyword-as-symbol" and type(items[index]) is Keyword:
        items[index] = S(str.__str__(items[index]))
    else:
        items[index] = _mutate(items[index], data, ops)
    return tuple(items)


SAME_KIND: dict[type, st.SearchStrategy[Any]] = {
    str: st.one_of(st.just(""), st.text(max_size=3), strings, st.text(min_size=100)),
    int: st.one_of(st.integers(-3, 3), integers), Decimal: decimals,
    Symbol: st.one_of(symbols, st.sampled_from([S("EUR"), S("XYZ"), S("true"), S("bfs")])),
    URI: uris}
EXAMPLE_MESSAGES = [Path(p) for p in EXAMPLES]
# One limit at a time, around what the examples need (so that both sides of it are met).
LIMIT_RANGES = {"max_depth": 8, "max_list_items": 16, "max_nodes": 60, "max_string_bytes": 50,
                "max_name_chars": 24, "max_message_bytes": 500}
LIMITS = st.sampled_from(sorted(LIMIT_RANGES)).flatmap(
    lambda name: st.integers(1, LIMIT_RANGES[name]).map(lambda n: Limits(**{name: n})))


@settings(max_examples=500, deadline=None)
@given(data=st.data(), example=st.sampled_from(EXAMPLE_MESSAGES),
       mode=st.sampled_from(["grammar", "schema", "schema", "limits", "limits", "intent"]))
def test_validate_agrees_with_parse_and_decode(registry: Registry, data: st.DataObject,
                                               example: Path, mode: str) -> None:
    """validate accepts ⇔ parse(canonical(m)) accepts, with the same error, and a message
    that validates is one the decoder accepts as the encoder writes it."""
    original = cbcl.parse(example.read_bytes(), registry=registry)
    limits = data.draw(LIMITS) if mode == "limits" else None
    intent = data.draw(st.sampled_from(list(cbcl.Intent))) if mode == "intent" \
        else original.intent
    body: Any = original.body
    rounds = 0 if mode == "limits" else data.draw(st.integers(0, 3))
    for _ in range(rounds):  # (for the schema, atoms of the same kind)
        body = _mutate(body, data, ("same-kind", "deeper") if mode == "schema" else OPS)
    m = dataclasses.replace(original, body=body, intent=intent)
    verdict = outcome(lambda: cbcl.validate(m, registry=registry, limits=limits))
    assert verdict == outcome(lambda: cbcl.parse(m.canonical(), registry=registry,
                                                 limits=limits))
    event(f"{mode}: " + (verdict if verdict == "accepted" else verdict[0].__name__))
    try:
        frame = cbcl.encode(m, registry=registry, limits=limits)
    except CBCLError as exc:
        assert verdict != "accepted" or (
            type(exc) is LimitError and exc.limit == "max_message_bytes"), exc
        if verdict != "accepted" and not isinstance(exc, LimitError):
            assert (type(exc), exc.message) == verdict[:2]
        return
    assert verdict == "accepted"
    for decoder in (Decoder(registry, limits=limits), Decoder(registry, limits=limits,
                                                              pure_python=True)):
        assert decoder.decode(frame) == m


@settings(max_examples=200, deadline=None)
@given(m=st.builds(dataclasses.replace, messages, protocol=st.just(S("any/v1")),
                   intent=st.just(cbcl.Intent.INFORM)),
       escapes=st.text(alphabet="\x00\x01\"\\\n\u202e\U0001f600é", max_size=30))
def test_the_quick_size_bound_never_accepts_a_message_too_large(m: Message,
                                                                 escapes: str) -> None:
    """The walk that spares most messages being written out bounds their size from
    above: a message one byte over the limit is never found within it."""
    from cbcl.protocol._api import _WITHIN, _within

    m = dataclasses.replace(m, body=(escapes, m.body, URI("a://x" + "é" * len(escapes)))
                            if m.body is not None else escapes)
    size = len(m.canonical().encode())
    roomy = dict(max_depth=1000, max_list_items=10**6, max_nodes=10**6,
                 max_string_bytes=10**6)
    assert _within(m, Limits(max_message_bytes=size - 1, **roomy)) != _WITHIN
    assert outcome(lambda: cbcl.validate(m, registry=REGISTRY, limits=Limits(
        max_message_bytes=size - 1, **roomy)))[0] is LimitError
    cbcl.validate(m, registry=REGISTRY, limits=Limits(max_message_bytes=size, **roomy))


WIDE_VALUES = st.recursive(atoms, lambda children: st.lists(children, max_size=18).map(tuple),
                           max_leaves=60)


@settings(max_examples=300, deadline=None)
@given(body=WIDE_VALUES, field=st.sampled_from(["max_depth", "max_list_items", "max_nodes",
                                                "max_string_bytes", "max_name_chars"]),
       data=st.data())
def test_the_quick_walk_counts_as_the_reader(body: Any, field: str,
                                              data: st.DataObject) -> None:
    """Limits the walk judges itself (not so small that the envelope alone could exceed
    them): validate agrees with parse exactly, either side of each limit."""
    low = {"max_depth": 3, "max_list_items": 12, "max_nodes": 25, "max_string_bytes": 1,
           "max_name_chars": 15}[field]
    limits = Limits(**{field: data.draw(st.integers(low, low + 60))})
    m = message(body)
    verdict = outcome(lambda: cbcl.validate(m, registry=REGISTRY, limits=limits))
    assert verdict == outcome(lambda: cbcl.parse(m.canonical(), registry=REGISTRY,
                                                 limits=limits))
    event(verdict if verdict == "accepted" else verdict[0].__name__)


def _threshold(m: Message, field: str) -> int:
    """The smallest value of limit ``field`` under which the text of ``m`` parses."""
    low, high = 1, 10**6
    while low < high:
        mid = (low + high) // 2
        try:
            cbcl.parse(m.canonical(), registry=REGISTRY, limits=Limits(**{field: mid}))
        except LimitError:
            low = mid + 1
        else:
            high = mid
    return low


@pytest.mark.parametrize(("field", "body"), [
    ("max_depth", _nest(9)),
    ("max_list_items", tuple(range(20))),
    ("max_list_items", (S("a"), tuple(range(30)), ())),
    ("max_nodes", tuple((i, (S("x"), ())) for i in range(10))),
    ("max_string_bytes", ("é" * 30, "x" * 10)),
    ("max_name_chars", (S("s" * 20), K("k" * 22), S("t"))),
    ("max_message_bytes", tuple(Decimal("1" * 38 + ".5") for _ in range(40))),
    ("max_message_bytes", tuple(-(2**63) for _ in range(40))),
    ("max_message_bytes", tuple(() for _ in range(100))),
    ("max_message_bytes", tuple(K("k") for _ in range(100))),
    ("max_message_bytes", '"\\\x01\u202e' * 20),
    ("max_message_bytes", "\x01" * 2000),  # 6 bytes a character, escaped
    ("max_message_bytes", URI("a://" + "\U0001f600" * 2000)),  # 4 bytes a character
])
def test_each_limit_at_its_boundary(field: str, body: Any) -> None:
    """At the smallest limit the text needs the quick walk itself finds the message within,
    and one below it validate refuses it as parse does."""
    from cbcl.protocol._api import _WITHIN, _within

    m = message(body)
    at = _threshold(m, field)
    assert at > 1
    if field != "max_message_bytes":  # (its bound is loose: there the text is measured)
        assert _within(m, Limits(**{field: at})) == _WITHIN
    cbcl.validate(m, registry=REGISTRY, limits=Limits(**{field: at}))
    below = Limits(**{field: at - 1})
    verdict = outcome(lambda: cbcl.validate(m, registry=REGISTRY, limits=below))
    assert verdict[0] is LimitError
    assert verdict == outcome(lambda: cbcl.parse(m.canonical(), registry=REGISTRY,
                                                 limits=below))
    assert _within(m, below) != _WITHIN


def test_envelope_strings_count_in_the_size_bound() -> None:
    from cbcl.protocol._api import _WITHIN, _within

    m = dataclasses.replace(message("x"), message_id="\x01" * 1000,
                            conversation_id="\u202e" * 500, in_reply_to="\\" * 300,
                            signature=cbcl.trust.Signature("\n" * 200, "v"))
    at = _threshold(m, "max_message_bytes")
    assert at == len(m.canonical().encode())
    assert _within(m, Limits(max_message_bytes=at - 1)) != _WITHIN
    with pytest.raises(LimitError):
        cbcl.validate(m, registry=REGISTRY, limits=Limits(max_message_bytes=at - 1))
    cbcl.validate(m, registry=REGISTRY, limits=Limits(max_message_bytes=at))


def test_message_size_limit_at_the_boundary(registry: Registry) -> None:
    for example in EXAMPLES:
        m = cbcl.parse(example.read_bytes(), registry=registry)
        size = len(m.canonical().encode())
        for limit in (size - 1, size, size + 1):
            limits = Limits(max_message_bytes=limit)
            verdict = outcome(lambda m=m, lim=limits: cbcl.validate(m, registry=registry,
                                                                    limits=lim))
            assert verdict == outcome(lambda m=m, lim=limits: cbcl.parse(
                m.canonical(), registry=registry, limits=lim))
            assert (verdict == "accepted") == (limit >= size)


# --------------------------------------------------------------------------- encoding


def test_encode_validates_by_default(registry: Registry) -> None:
    bad = message(cbcl.body("proposal", task_id="t", bid=3), protocol="contract-net/v1",
                  intent="PROPOSE")
    with pytest.raises(BodyError):
        cbcl.encode(bad, registry=registry)
    with pytest.raises(BodyError):
        Encoder(registry).encode(bad)
    # the documented opt-out: the frame is written, and every decoder refuses it
    for frame in (cbcl.encode(bad, registry=registry, validate=False),
                  Encoder(registry, validate=False).encode(bad)):
        with pytest.raises(BodyError):
            cbcl.decode(frame, registry=registry)
    with pytest.raises(TypeError):
        Encoder(registry, validate="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Encoder(registry, limits={})  # type: ignore[arg-type]


def test_encoder_limits_count_the_frame_too(registry: Registry) -> None:
    """A frame can be a little larger than the text (a decimal takes 5 bytes, "1.0 " 4):
    the encoder refuses what the decoder with the same limits would."""
    m = message(tuple(Decimal("1.0") for _ in range(1000)))
    size = len(m.canonical().encode())
    frame = cbcl.encode(m, registry=registry, validate=False)
    assert len(frame) > size
    limits = Limits(max_message_bytes=size)
    cbcl.validate(m, registry=registry, limits=limits)  # the text is within
    with pytest.raises(LimitError, match="frame exceeds the limit"):
        cbcl.encode(m, registry=registry, limits=limits)
    with pytest.raises(LimitError):
        cbcl.decode(frame, registry=registry, limits=limits)
    assert cbcl.encode(m, registry=registry,
                       limits=Limits(max_message_bytes=len(frame))) == frame


def test_decimal_1e27_encodes(registry: Registry) -> None:
    """A 30-character decimal (within the 40-character limit) encodes, in text and binary."""
    m = message(cbcl.body("x", amount=Decimal("1e27"), small=Decimal("-1e-37")))
    text = m.canonical()
    assert "1000000000000000000000000000.0" in text
    assert cbcl.parse(text, registry=registry) == m
    frame = cbcl.encode(m, registry=registry)
    assert cbcl.decode(frame, registry=registry) == m
    assert cbcl.encode(m, registry=registry, validate=False) == frame


def test_readme_snippet(registry: Registry) -> None:
    bid = cbcl.body("proposal", task_id="t-4711",
                    bid=cbcl.body("bid", price=Decimal("12.50"), currency=cbcl.Symbol("EUR")))
    out = cbcl.Message(message_id="cn-2", sender="agent://me", receiver="agent://you",
                       intent="PROPOSE", protocol="contract-net/v1", body=bid)
    cbcl.validate(out, registry=registry)
    frame = cbcl.encode(out, registry=registry)
    got = cbcl.decode(frame, registry=registry)
    fields = got.fields(registry)
    assert fields.head == "proposal" and fields["task-id"] == "t-4711"
    bid_fields = fields["bid"]
    assert type(bid_fields) is Fields and bid_fields["price"] == Decimal("12.50")
    assert fields.require("bid", cbcl.Fields).require("currency", cbcl.Symbol) == \
        cbcl.Symbol("EUR")


def test_require_names_a_list_of_views_in_its_error() -> None:
    # A list-of records reads as views; a wrong-type require shows the list, as values.
    from cbcl.conversation import compile_schema

    schema = compile_schema(cbcl.read(
        b"(schema (record order (:items (list-of (record item (:n integer required))) "
        b"required)))"))
    view = cbcl.Fields(cbcl.read(b"(order :items ((item :n 1) (item :n 2)))"), schema=schema)
    with pytest.raises(cbcl.FieldsError, match=r"expected str, found a list "
                                                r"\(\(item :n 1\) \(item :n 2\)\)"):
        view.require("items", str)


# --------------------------------------------------------------------------- the object
# Message and Signature are frozen dataclasses over a storage base (cbcl._native's
# MessageFields / SignatureFields, else a class of slots): what users do with dataclasses
# works on them, with or without the extension.


@settings(max_examples=200, deadline=None)
@given(m=messages, signed=st.booleans())
def test_copy_and_pickle_keep_a_message(m: Message, signed: bool) -> None:
    import copy
    import pickle

    if signed:
        m = dataclasses.replace(m, signature=cbcl.trust.Signature("key-1", "c2ln"))
    copies = [copy.copy(m), copy.deepcopy(m)]
    copies += [pickle.loads(pickle.dumps(m, protocol))
               for protocol in range(pickle.HIGHEST_PROTOCOL + 1)]
    for twin in copies:
        assert type(twin) is Message and twin is not m
        assert twin == m and hash(twin) == hash(m)
        assert twin.canonical() == m.canonical()
        for field in dataclasses.fields(Message):
            assert type(getattr(twin, field.name)) is type(getattr(m, field.name))
    signature = cbcl.trust.Signature("key-1", "c2ln")
    assert pickle.loads(pickle.dumps(signature)) == signature
    assert copy.deepcopy(signature) == signature


def test_a_state_of_another_shape_is_refused() -> None:
    m = message(1)
    twin = object.__new__(Message)
    with pytest.raises(TypeError, match="tuple of 12"):
        twin.__setstate__(m.__getstate__()[:-1])
    with pytest.raises(TypeError, match="tuple of 2"):
        object.__new__(cbcl.trust.Signature).__setstate__(["k", "v"])


def test_fields_are_read_from_the_storage_not_the_defaults() -> None:
    m = Message(message_id="m-1", sender="agent://a", receiver="agent://b", intent="INFORM",
                protocol="any/v1", conversation_id="c-1", in_reply_to="m-0", reply_by=5,
                timestamp=4, body=1)
    assert (m.conversation_id, m.in_reply_to, m.reply_by, m.timestamp, m.body) == (
        "c-1", "m-0", 5, 4, 1)
    # (no class attribute is left to hide a field: the defaults live in __init__ and fields)
    names = [field.name for field in dataclasses.fields(Message)]
    assert names == ["message_id", "sender", "receiver", "intent", "protocol",
                     "conversation_id", "in_reply_to", "reply_by", "timestamp", "trace",
                     "body", "signature"]
    assert not set(names) & set(vars(Message))
    assert [field.default for field in dataclasses.fields(Message)][5:] == [None] * 7
    assert message(1).conversation_id is None
    assert Message.__slots__ == () and not hasattr(m, "__dict__")
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.body = 2  # type: ignore[misc]
    with pytest.raises(AttributeError):
        m.extra = 1  # type: ignore[attr-defined]
    assert dataclasses.replace(m, body=2).body == 2
    assert dataclasses.replace(m, body=2).conversation_id == "c-1"
    if hasattr(m, "__replace__"):  # (3.13: copy.replace)
        assert m.__replace__(timestamp=7).timestamp == 7
    assert "conversation_id='c-1'" in repr(m)
