"""Schemas (spec/conversations.md §2): the section syntax, each type and bound (exactly the
bound accepted, one beyond refused), paths, and the shipped schemas on the examples; and the
compiled checker against a reference (the checker as first written, kept below): generated
schemas and bodies, the order of violations, hostile bodies and hand-built types.

Tests internals: the compiled checker's types and fast pass (``cbcl.protocol._schema``)."""

from __future__ import annotations

import pickle
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, strategies as st
from test_conversation import descriptor

import cbcl
from cbcl import URI, DescriptorError, Keyword, SchemaError, Symbol
from cbcl.conversation import Schema, check_schema, compile_schema
from cbcl.core._canonical import canonical_value
from cbcl.protocol import _schema
from cbcl.protocol._schema import AtomType, Keys, ListOf, OneOf, Record

ROOT = Path(__file__).parent.parent
EXAMPLES = ROOT / "descriptors" / "examples"


def schema_of(type_text: str) -> Schema:
    return compile_schema(cbcl.read(f"(schema (record t (:v {type_text})))"))


def check(type_text: str, value_text: str) -> None:
    schema, body = schema_of(type_text), cbcl.read(f"(t :v {value_text})")
    assert_same(schema, body)  # (defined below)
    check_schema(schema, body)


def ok(type_text: str, value_text: str) -> None:
    check(type_text, value_text)


def bad(type_text: str, value_text: str, fragment: str = "", path: str = "$.body.t[:v]",
        ) -> None:
    with pytest.raises(SchemaError) as info:
        check(type_text, value_text)
    assert info.value.path == path, info.value
    assert fragment in str(info.value)
    assert str(info.value).startswith(path + ": ") and info.value.exit_code == 7


@pytest.mark.parametrize("type_text, good, wrong", [
    ("string", '"x"', "x"), ("integer", "1", "1.0"), ("decimal", "1.0", "1"),
    ("number", "1", '"1"'), ("number", "1.5", ":a"), ("symbol", "x", '"x"'),
    ("keyword", ":x", "x"), ("uri", "agent://a", '"agent://a"'), ("boolean", "true", "yes"),
    ("boolean", "false", '"true"'), ("any", "(a (b))", None),
    ("(one-of a b 1)", "b", ":a"), ("(one-of a b 1)", "1", "1.0"),
    ("(one-of 1 2.5)", "2.50", "1.0"),
    ("(uri :scheme agent)", "agent://x", "https://x"),
    ("(list-of integer)", "(1 2 3)", "(1 x)"), ("(list-of integer)", "()", "1"),
    ("(keys (:a integer))", "(:a 1)", "(:b 1)"),
    ("(record r (:a integer))", "(r :a 1)", "(s :a 1)"),
])
def test_each_type(type_text: str, good: str, wrong: str | None) -> None:
    ok(type_text, good)
    if wrong is not None:
        with pytest.raises(SchemaError):
            check(type_text, wrong)


@pytest.mark.parametrize("type_text, inside, outside", [
    ("(integer :min 1 :max 64)", ["1", "64"], ["0", "65"]),
    ("(integer :min 1)", ["1", "9223372036854775807"], ["0"]),
    ("(integer :max 3)", ["3", "-9223372036854775808"], ["4"]),
    ("(integer :min -9223372036854775808 :max 9223372036854775807)",
     ["-9223372036854775808", "9223372036854775807"], []),
    ("(decimal :min 0.0 :max 100.00)", ["0.0", "100.0", "100.000"], ["-0.01", "100.01"]),
    ("(number :min 1 :max 2.5)", ["1", "1.0", "2.5", "2"], ["0.99", "3", "2.51"]),
    ("(string :min-length 2 :max-length 3)", ['"ab"', '"abc"', '"été"'], ['"a"', '"abcd"']),
    ("(string :max-length 0)", ['""'], ['"a"']),
    ("(symbol :min-length 2 :max-length 3)", ["ab", "abc"], ["a", "abcd"]),
    ("(list-of any :min-length 1 :max-length 2)", ["(1)", "(1 2)"], ["()", "(1 2 3)"]),
])
def test_bounds_exactly_accepted_one_beyond_refused(type_text: str, inside: list[str],
                                                    outside: list[str]) -> None:
    for value in inside:
        ok(type_text, value)
    for value in outside:
        bad(type_text, value)


def test_keys_required_allowed_repeated_and_else() -> None:
    keys = "(keys (:a integer required) (:b string))"
    ok(keys, "(:a 1)")
    ok(keys, '(:b "x" :a 1)')
    bad(keys, '(:b "x")', "required key :a is missing")
    bad(keys, "(:a 1 :c 2)", "key :c is not allowed here (allowed: :a :b)", "$.body.t[:v][:c]")
    bad(keys, "(:a 1 :a 2)", "given twice", "$.body.t[:v][:a]")
    bad(keys, "(:a 1 :b)", "has no value", "$.body.t[:v][2]")
    bad(keys, '(:a 1 b "x")', "expected a keyword", "$.body.t[:v][2]")
    bad(keys, '(:a "1")', "expected an integer", "$.body.t[:v][:a]")
    ok("(keys (:a integer) (else string))", '(:a 1 :zz "x")')
    bad("(keys (:a integer) (else string))", "(:zz 1)", "expected a string",
        "$.body.t[:v][:zz]")


def test_record_heads_and_paths() -> None:
    schema = compile_schema(cbcl.read(
        "(schema (record query weather (:city (string :max-length 3) required)) "
        "(record task (:resources (keys (:cpu (integer :max 64)))) "
        "(:sub (record sub (:xs (list-of (integer :min 0)))))))"))
    check_schema(schema, cbcl.read('(query weather :city "Rom")'))
    with pytest.raises(SchemaError) as info:
        check_schema(schema, cbcl.read('(query weather :city "Paris")'))
    assert info.value.path == "$.body.query[:city]"
    with pytest.raises(SchemaError) as info:
        check_schema(schema, cbcl.read("(task :resources (:cpu 65))"))
    assert info.value.path == "$.body.task[:resources][:cpu]"
    assert str(info.value) == "$.body.task[:resources][:cpu]: 65 is above the maximum 64"
    with pytest.raises(SchemaError) as info:
        check_schema(schema, cbcl.read("(task :sub (sub :xs (0 1 -1)))"))
    assert info.value.path == "$.body.task[:sub].sub[:xs][2]"
    with pytest.raises(SchemaError) as info:
        check_schema(schema, cbcl.read("(task :sub (other))"))
    assert info.value.path == "$.body.task[:sub]"
    # A body no record names is not constrained; the raw section works as well.
    check_schema(schema, cbcl.read("(query rain :x 1)"))
    check_schema(cbcl.read("(schema (record a (:b integer)))"), cbcl.read("(a :b 1)"))
    check_schema(schema, "just a string")
    with pytest.raises(SchemaError) as info:
        check_schema(schema, cbcl.read("(task :resources (:cpu 65))"), path="$")
    assert info.value.path == "$.task[:resources][:cpu]"


def test_first_violation_in_reading_order() -> None:
    schema = schema_of("(keys (:a integer) (:b integer))")
    with pytest.raises(SchemaError) as info:
        check_schema(schema, cbcl.read('(t :v (:b "x" :a "y"))'))
    assert info.value.path == "$.body.t[:v][:b]"


@pytest.mark.parametrize("text, fragment", [
    ("(schema x)", "(record HEAD"),
    ("(schema (record))", "head symbol"),
    ("(schema (record t (:a)))", "expected a field"),
    ("(schema (record t (:a integer optional)))", "expected required"),
    ("(schema (record t (:a integer) (:a string)))", "listed twice"),
    ("(schema (record t (:a float)))", "unknown type float"),
    ("(schema (record t (:a (float))))", "unknown type float"),
    ("(schema (record t (:a (integer :min 1.5))))", "must be an integer"),
    ("(schema (record t (:a (integer :min 2 :max 1))))", ":min is greater"),
    ("(schema (record t (:a (integer :min))))", "missing its value"),
    ("(schema (record t (:a (integer :len 1))))", "unknown option :len"),
    ("(schema (record t (:a (integer :min 1 :min 1))))", "repeated"),
    ("(schema (record t (:a (string :max-length -1))))", "≥ 0"),
    ("(schema (record t (:a (string :min-length 3 :max-length 2))))", ":min-length is greater"),
    ("(schema (record t (:a (decimal :min \"0\"))))", "must be a number"),
    ("(schema (record t (:a (uri :scheme \"agent\"))))", ":scheme is a symbol"),
    ("(schema (record t (:a (one-of))))", "at least one"),
    ("(schema (record t (:a (one-of a a))))", "twice"),
    ("(schema (record t (:a (one-of (a)))))", "atoms"),
    ("(schema (record t (:a (list-of))))", "element type"),
    ("(schema (record t (:a (list-of integer :min-length 3 :max-length 1))))", "greater"),
    ("(schema (record t (else any) (else any)))", "repeated"),
    ("(schema (record t) (record t))", "listed twice"),
    ("(schema (record t (:a \"x\")))", "expected a type"),
    ("(conversation)", "expected a (schema"),
])
def test_malformed_schemas_are_descriptor_errors(text: str, fragment: str) -> None:
    with pytest.raises(DescriptorError) as info:
        compile_schema(cbcl.read(text))
    assert fragment in str(info.value), str(info.value)
    assert info.value.exit_code == 5


def test_types_nest_at_most_32_deep() -> None:
    deep = "integer"
    for _ in range(33):
        deep = f"(list-of {deep})"
    with pytest.raises(DescriptorError, match="nested more than 32"):
        compile_schema(cbcl.read(f"(schema (record t (:a {deep})))"))


def test_compiled_schemas_are_keyed_by_text_not_equality() -> None:
    one = compile_schema(cbcl.read("(schema (record t (:v (one-of 1))))"))
    one_point_o = compile_schema(cbcl.read("(schema (record t (:v (one-of 1.0))))"))
    check_schema(one, cbcl.read("(t :v 1)"))
    with pytest.raises(SchemaError):
        check_schema(one_point_o, cbcl.read("(t :v 1)"))


@pytest.mark.slow
def test_deep_values_are_checked_without_recursion() -> None:
    schema = schema_of("(list-of any)")
    value: object = 1
    for _ in range(10_000):
        value = (value,)
    check_schema(schema, (cbcl.Symbol("t"), cbcl.Keyword("v"), value))  # type: ignore[arg-type]


def test_read_descriptor_refuses_a_malformed_schema() -> None:
    raw = b'(protocol-descriptor (id p/v1) (version 1) (intents INFORM) (grammar "body: value"))'
    end = raw.rindex(b")")
    with pytest.raises(DescriptorError, match=r"\$\.schema\[1\]"):
        cbcl.descriptor.read_descriptor(raw[:end] + b"\n(schema (record t (:a nope)))" + raw[end:])


# --------------------------------------------------------------------------- shipped


@pytest.mark.parametrize("name", ["task-assignment-v1", "contract-net-v1", "request-v1",
                                  "canon-a-v1"])
def test_shipped_examples_satisfy_their_schemas(name: str) -> None:
    d = descriptor(name)
    assert d.schema is not None
    paths = [p for p in EXAMPLES.glob(f"{name}*.cbcl")]
    paths += list((EXAMPLES / "conversations").glob(f"{name}*.cbcl"))
    assert paths
    for path in paths:
        for value in cbcl.read_all(path.read_bytes()):
            message = cbcl.parse(cbcl.canonical(value), envelope_only=True)
            if message.body is not None and d.governs(message.intent):
                check_schema(d.schema, message.body)


def test_task_assignment_schema_violations() -> None:
    d = descriptor("task-assignment-v1")
    assert d.schema is not None
    good = '(task :id "t" :resources (:cpu 256 :mem 1048576) :deadline (+ (now) 1))'
    check_schema(d.schema, cbcl.read(good))
    for body, path in [
        ('(task :id "t" :resources (:cpu 257))', "$.body.task[:resources][:cpu]"),
        ('(task :id "t" :resources (:mem 1))', "$.body.task[:resources]"),
        ('(task :id "" :resources (:cpu 1))', "$.body.task[:id]"),
        ("(task :resources (:cpu 1))", "$.body.task"),
        ('(task :id "t" :cmd (compute :x 1) :gpu 1)', "$.body.task[:gpu]"),
    ]:
        with pytest.raises(SchemaError) as info:
            check_schema(d.schema, cbcl.read(body))
        assert info.value.path == path


# --------------------------------------------------------------------------- reference
#
# The checker as first written (one ordered walk over the public fields of the types), kept
# here as the definition the compiled checker must agree with: the same bodies accepted,
# the same first violation, message and path (or the same other exception).

_REF_KINDS: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "decimal": (Decimal,), "number": (int, Decimal),
    "symbol": (Symbol,), "keyword": (Keyword,), "uri": (URI,), "boolean": (Symbol,),
    "any": (),
}


def _ref_kind(value: Any) -> str:
    if type(value) is tuple:
        return "a list"
    return {str: "a string", int: "an integer", Decimal: "a decimal", Symbol: "a symbol",
            Keyword: "a keyword", URI: "a URI"}.get(type(value), type(value).__name__)


def _ref_found(value: Any) -> str:
    text = canonical_value(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _ref_fail(message: str, path: Any) -> SchemaError:
    segments: list[str] = []
    while type(path) is tuple:
        path, segment = path
        segments.append(f"[{segment.text}]" if type(segment) is Keyword
                        else f".{segment}" if type(segment) is Symbol else f"[{segment}]")
    text = path + "".join(reversed(segments))
    return SchemaError(f"{text}: {message}", path=text)


def reference_record_for(schema: Schema, body: Any) -> Record | None:
    if type(body) is not tuple or not body or type(body[0]) is not Symbol:
        return None
    for record in schema.records:
        heads = record.heads
        if len(body) >= len(heads) and all(type(body[i]) is Symbol and body[i] == heads[i]
                                           for i in range(len(heads))):
            return record
    return None


def _ref_keys(t: Keys, items: tuple[Any, ...], offset: int, path: Any,
              work: list[Any]) -> None:
    if len(items) % 2:
        raise _ref_fail(f"a keyword-argument list has pairs; {_ref_found(items[-1])} has no "
                        "value", (path, offset + len(items) - 1))
    seen: set[Keyword] = set()
    children = []
    for i in range(0, len(items), 2):
        key = items[i]
        if type(key) is not Keyword:
            raise _ref_fail(f"expected a keyword, found {_ref_kind(key)} {_ref_found(key)}",
                            (path, offset + i))
        if key in seen:
            raise _ref_fail(f"key {key.text} is given twice", (path, key))
        seen.add(key)
        child = t.fields.get(key, t.other)
        if child is None:
            allowed = " ".join(k.text for k in t.fields) or "none"
            raise _ref_fail(f"key {key.text} is not allowed here (allowed: {allowed})",
                            (path, key))
        children.append((child, items[i + 1], (path, key)))
    for key in t.required:
        if key not in seen:
            raise _ref_fail(f"required key {key.text} is missing", path)
    work.extend(reversed(children))


def _ref_atom(t: AtomType, value: Any, at: Any) -> None:
    kinds = _REF_KINDS[t.kind]
    if kinds and type(value) not in kinds:
        raise _ref_fail(f"expected {t.describe()}, found {_ref_kind(value)} "
                        f"{_ref_found(value)}", at)
    if t.kind == "boolean" and value not in (Symbol("true"), Symbol("false")):
        raise _ref_fail(f"expected a boolean (true or false), found {_ref_found(value)}", at)
    if t.low is not None and value < t.low:
        raise _ref_fail(f"{_ref_found(value)} is below the minimum {canonical_value(t.low)}",
                        at)
    if t.high is not None and value > t.high:
        raise _ref_fail(f"{_ref_found(value)} is above the maximum "
                        f"{canonical_value(t.high)}", at)
    if t.min_length is not None or t.max_length is not None:
        n = len(value)
        if t.min_length is not None and n < t.min_length:
            raise _ref_fail(f"{_ref_kind(value)} of {n} characters is shorter than the "
                            f"minimum of {t.min_length}", at)
        if t.max_length is not None and n > t.max_length:
            raise _ref_fail(f"{_ref_kind(value)} of {n} characters is longer than the "
                            f"maximum of {t.max_length}", at)
    if t.scheme is not None and URI(value).scheme != t.scheme:
        raise _ref_fail(f"expected a URI with scheme {t.scheme}, found {_ref_found(value)}",
                        at)


def reference_check(schema: Schema, body: Any, path: str = "$.body") -> None:
    record = reference_record_for(schema, body)
    if record is None:
        return
    work: list[Any] = [(record, body, path)]
    while work:
        t, value, at = work.pop()
        if isinstance(t, AtomType):
            _ref_atom(t, value, at)
        elif isinstance(t, OneOf):
            if not any(type(value) is type(v) and value == v for v in t.values):
                raise _ref_fail(f"expected {t.describe()}, found {_ref_found(value)}", at)
        elif type(value) is not tuple:
            raise _ref_fail(f"expected {t.describe()}, found {_ref_kind(value)} "
                            f"{_ref_found(value)}", at)
        elif isinstance(t, ListOf):
            n = len(value)
            if t.min_length is not None and n < t.min_length:
                raise _ref_fail(f"a list of {n} elements is shorter than the minimum of "
                                f"{t.min_length}", at)
            if t.max_length is not None and n > t.max_length:
                raise _ref_fail(f"a list of {n} elements is longer than the maximum of "
                                f"{t.max_length}", at)
            work.extend((t.item, value[i], (at, i)) for i in reversed(range(n)))
        elif isinstance(t, Keys):
            _ref_keys(t, value, 0, at, work)
        else:
            n = len(t.heads)
            if len(value) < n or any(type(value[i]) is not Symbol or value[i] != t.heads[i]
                                     for i in range(n)):
                raise _ref_fail(f"expected {t.describe()}, found {_ref_found(value)}", at)
            _ref_keys(t.keys, value[n:], n, (at, t.heads[0]), work)


def outcome(check: Any, schema: Any, body: Any) -> Any:
    """What checking ``body`` does: None (accepted), or the error's type, text and path."""
    try:
        check(schema, body)
    except Exception as exc:  # (the same exception, whatever it is)
        return type(exc).__name__, str(exc), getattr(exc, "path", None)
    return None


def assert_same(schema: Schema, body: Any, *, exact: bool = True) -> None:
    """``check_schema`` does what the reference does, and the C twin (where it is built)
    accepts only bodies the reference accepts: all of them if ``exact`` (it may leave a
    hand-built type or a value outside the value model to the explaining pass)."""
    expected = outcome(reference_check, schema, body)
    assert outcome(check_schema, schema, body) == expected
    record = schema.record_for(body)
    assert record is reference_record_for(schema, body)
    if record is not None and _schema._schema_valid_c is not None:
        try:
            accepted = _schema._schema_valid_c(record._pairs, body, _schema._has_heads)
        except Exception:  # (the explaining pass raises it, or says what is wrong)
            accepted = False
        if accepted is not None:  # (None: a type of more than 63 fields, left to Python)
            assert accepted == (expected is None) if exact else (
                not accepted or expected is None), body


# --------------------------------------------------------------------------- generated

ATOM_TYPES = [
    "string", "(string :min-length 1 :max-length 3)", "(string :max-length 0)", "integer",
    "(integer :min 0 :max 5)", "(integer :min 1)", "(integer :max 3)", "decimal",
    "(decimal :min 0.0 :max 2.5)", "number", "(number :min 1 :max 2.5)", "symbol",
    "(symbol :min-length 2)", "keyword", "uri", "(uri :scheme agent)", "boolean", "any",
    '(one-of a b 1 1.0 "x" :k)', "(one-of 1 2.5 a)",
]
NAMES = ["a", "b", "c"]


@st.composite
def type_texts(draw: st.DrawFn, depth: int = 0) -> str:
    kind = draw(st.sampled_from(["atom", "atom", "list", "keys", "record"] if depth < 3
                                else ["atom"]))
    if kind == "atom":
        return draw(st.sampled_from(ATOM_TYPES))
    if kind == "list":
        options = draw(st.sampled_from(["", " :min-length 1", " :max-length 2"]))
        return f"(list-of {draw(type_texts(depth + 1))}{options})"
    fields = draw(field_texts(depth + 1))
    if kind == "keys":
        return f"(keys {fields})"
    return f"(record {draw(st.sampled_from(['r', 's', 'r s']))} {fields})"


@st.composite
def field_texts(draw: Any, depth: int) -> str:
    parts = [f"(:{name} {draw(type_texts(depth))}{' required' if draw(st.booleans()) else ''})"
             for name in draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=3))]
    if draw(st.integers(0, 3)) == 0:
        parts.append(f"(else {draw(type_texts(depth))})")
    return " ".join(parts)


NOISE = st.recursive(
    st.sampled_from([0, 3, -1, Decimal("1.0"), Decimal("2.50"), "", "xy", Symbol("a"),
                     Symbol("true"), Keyword("a"), Keyword("zz"), URI("agent://x"),
                     URI("https://y"), 1.5]),
    lambda children: st.lists(children, max_size=4).map(tuple), max_leaves=8)
ATOMS = {
    "string": st.text(alphabet="ab", max_size=4), "integer": st.integers(-2, 7),
    "decimal": st.sampled_from([Decimal("0.0"), Decimal("-0.5"), Decimal("2.5"),
                                Decimal("2.50"), Decimal("2.51")]),
    "symbol": st.sampled_from(["a", "ab", "true", "false"]).map(Symbol),
    "keyword": st.sampled_from(["a", "zz"]).map(Keyword),
    "uri": st.sampled_from(["agent://x", "https://y"]).map(URI),
    "boolean": st.sampled_from(["true", "false", "yes"]).map(Symbol),
}
ATOMS["number"] = st.one_of(ATOMS["integer"], ATOMS["decimal"])


@st.composite
def value_for(draw: Any, t: Any) -> Any:
    """A value of type ``t``, mostly: now and then something else, a key missing, repeated,
    unknown or out of order."""
    if draw(st.integers(0, 12)) == 0:
        return draw(NOISE)
    if isinstance(t, AtomType):
        return draw(NOISE) if t.kind == "any" else draw(ATOMS[t.kind])
    if isinstance(t, OneOf):
        return draw(st.sampled_from([*t.values, Symbol("c"), Keyword("b"), Decimal("1.00"),
                                     "y"]))
    if isinstance(t, ListOf):
        return tuple(draw(st.lists(value_for(t.item), max_size=3)))
    keys = t if isinstance(t, Keys) else t.keys
    names = [k for k in keys.fields if k in keys.required or draw(st.booleans())]
    if keys.other is not None or draw(st.integers(0, 5)) == 0:
        names.append(Keyword(draw(st.sampled_from(["zz", "yy"]))))
    if names and draw(st.integers(0, 6)) == 0:
        names.append(draw(st.sampled_from(names)))
    if draw(st.integers(0, 3)) == 0:
        names = draw(st.permutations(names))
    items: list[Any] = []
    for name in names:
        child = keys.fields.get(name, keys.other)
        items += [name, draw(NOISE) if child is None else draw(value_for(child))]
    if draw(st.integers(0, 12)) == 0 and items:
        items.pop()
    heads = () if isinstance(t, Keys) else t.heads
    return (*heads, *items)


@given(st.data())
def test_compiled_checker_agrees_with_the_reference(data: Any) -> None:
    section = (f"(schema (record t u {data.draw(field_texts(1))}) "
               f"(record t {data.draw(field_texts(1))}) (record v {data.draw(field_texts(1))}))")
    schema = compile_schema(cbcl.read(section))
    record = data.draw(st.sampled_from(schema.records))
    body = data.draw(value_for(record))
    assert_same(schema, body)  # atoms as built here
    try:
        text = cbcl.canonical(body)
    except TypeError:  # (a float, outside the value model)
        return
    assert_same(schema, cbcl.read(text))  # atoms as the reader shares them


# --------------------------------------------------------------------------- order, size


@pytest.mark.parametrize("value, path, fragment", [
    ('(:a "x" :zz 1)', "$.body.t[:v][:zz]", "not allowed"),  # a key before any value
    ('(:a "x")', "$.body.t[:v]", "required key :b is missing"),
    ("(:zz 1 :a 1 :a 2 :b 1)", "$.body.t[:v][:zz]", "not allowed"),
    ("(:a 1 :a 2 :zz 1 :b 1)", "$.body.t[:v][:a]", "given twice"),
    ("(:zz 1 :b 1 :a)", "$.body.t[:v][4]", "has no value"),
    ("(:zz 1 5 1)", "$.body.t[:v][:zz]", "not allowed"),
    ('(:b (1 "x" 2) :a "y")', "$.body.t[:v][:b][1]", "expected an integer"),
    ('(:a "y" :b (1 "x" 2))', "$.body.t[:v][:a]", "expected an integer"),
    ("(:b (1 2 3 4) :a 1)", "$.body.t[:v][:b]", "longer than the maximum of 3"),
])
def test_the_first_violation_in_reading_order_is_reported(value: str, path: str,
                                                         fragment: str) -> None:
    bad("(keys (:a integer) (:b (list-of integer :max-length 3) required))", value, fragment,
        path)
    schema = schema_of("(keys (:a integer) (:b (list-of integer :max-length 3) required))")
    assert_same(schema, cbcl.read(f"(t :v {value})"))


def test_lists_of_lists_check_every_element() -> None:
    ok("(list-of (keys (:a integer)))", "((:a 1) () (:a 2))")
    bad("(list-of (keys (:a integer)))", '((:a 1) (:a "x") (:a 2))', "expected an integer",
        "$.body.t[:v][1][:a]")
    bad("(list-of (record r (:a integer)))", "((r :a 1) (s :a 2))", "expected (r …)",
        "$.body.t[:v][1]")
    bad("(list-of (list-of (string :max-length 1)))", '(("a") ("b" "cd"))', "longer",
        "$.body.t[:v][1][1]")
    bad("(list-of (keys (else any)))", "((:a 1) (:a 1 :a 2))", "given twice",
        "$.body.t[:v][1][:a]")
    bad("(list-of (one-of a 1))", "(a 1 b)", "expected one of a 1", "$.body.t[:v][2]")


def test_keys_in_any_order_and_other_keys() -> None:
    keys = "(keys (:a integer required) (:b string) (else symbol))"
    for value in ['(:b "x" :a 1)', '(:zz q :a 1 :b "x" :yy r)', "(:a 1 :zz q :yy r)"]:
        ok(keys, value)
    bad(keys, "(:a 1 :zz q :zz r)", "given twice", "$.body.t[:v][:zz]")
    bad(keys, "(:zz q :a 1 :zz r)", "given twice", "$.body.t[:v][:zz]")
    bad(keys, '(:b "x" :a 1 :b "y")', "given twice", "$.body.t[:v][:b]")
    bad(keys, "(:a 1 :zz 2)", "expected a symbol", "$.body.t[:v][:zz]")
    bad("(keys (else any))", "(:a 1 :b 2 :a 3)", "given twice", "$.body.t[:v][:a]")
    bad("(keys (else any))", "(:a 1 b 2)", "expected a keyword", "$.body.t[:v][2]")
    bad("(keys (else any))", "(:a 1 :b)", "has no value", "$.body.t[:v][2]")
    bad("(record r s (else any))", "(r :a 1)", "expected (r s …)", "$.body.t[:v]")
    ok("(record r s (else any))", "(r s :a 1)")


def test_atoms_built_without_the_reader_are_checked_alike() -> None:
    schema = compile_schema(cbcl.read(
        "(schema (record t s (:a (record r (:b symbol required))) (:c (keys (else any)))))"))
    body = (Symbol("t"), Symbol("s"), Keyword("a"), (Symbol("r"), Keyword("b"), Symbol("x")),
            Keyword("c"), (Keyword("k"), 1))
    check_schema(schema, body)
    assert_same(schema, body)
    with pytest.raises(SchemaError, match=r"\[:a\]: expected \(r …\)"):
        check_schema(schema, (*body[:3], (Symbol("q"), Keyword("b"), Symbol("x"))))


@pytest.mark.slow
def test_hostile_bodies_deep_keys_heads_and_long_lists() -> None:
    deep: Any = 1
    for _ in range(100_000):  # hashing this would overflow the C stack
        deep = (deep,)
    schema = compile_schema(cbcl.read(
        "(schema (record t (:v (keys (:a integer))) (:w (one-of a b)) (:x (keys (else any)))"
        " (:y (list-of (record r (else any))))) (record u w (:a any)))"))
    t, u = Symbol("t"), Symbol("u")
    for body, path in [((t, Keyword("v"), (deep, 1)), "$.body.t[:v][0]"),
                       ((t, Keyword("w"), deep), "$.body.t[:w]"),
                       ((t, Keyword("x"), (deep, 1)), "$.body.t[:x][0]"),
                       ((t, Keyword("y"), (deep,)), "$.body.t[:y][0]"),
                       ((t, deep, 1), "$.body.t[1]")]:
        with pytest.raises(SchemaError) as info:
            check_schema(schema, body)
        assert info.value.path == path
    check_schema(schema, (u, deep))  # not (u w …): no record constrains it
    check_schema(schema, (t, Keyword("y"), ((Symbol("r"), Keyword("k"), deep),) * 10_000))
    many = cbcl.read("(schema (record t (:v (list-of (integer :min 0)))))")
    check_schema(many, (t, Keyword("v"), tuple(range(100_000))))
    with pytest.raises(SchemaError) as info:
        check_schema(many, (t, Keyword("v"), (*range(99_999), -1)))
    assert info.value.path == "$.body.t[:v][99999]"


def test_nested_lists_as_deep_as_types_go() -> None:
    depth = 30
    text = "integer"
    for _ in range(depth):
        text = f"(list-of {text})"
    schema = compile_schema(cbcl.read(f"(schema (record t (:v {text})))"))
    value: Any = (1,)
    for _ in range(depth - 1):
        value = (value,)
    check_schema(schema, (Symbol("t"), Keyword("v"), value))
    inner: Any = ("x",)
    for _ in range(depth - 1):
        inner = (inner,)
    with pytest.raises(SchemaError) as info:
        check_schema(schema, (Symbol("t"), Keyword("v"), inner))
    assert info.value.path == "$.body.t[:v]" + "[0]" * depth


# --------------------------------------------------------------------------- hand-built


def _hand_built(field_type: Any) -> Schema:
    return Schema((Record((Symbol("t"),), Keys({Keyword("v"): field_type}, ())),))


# (the type: ignore entries are types built wrong on purpose: they behave as the reference)
@pytest.mark.parametrize("field_type, values", [
    (AtomType("string", low=1), ['"x"', "1"]),  # (comparing a string with 1 raises)
    (AtomType("any", low=5), ["3", "7", '"x"']),
    (AtomType("integer", min_length=1), ["1"]),
    (AtomType("float"), ["1"]),
    (AtomType("string", min_length=Decimal("1.5")), ['"x"', '"xy"']),  # type: ignore[arg-type]
    (AtomType("symbol", scheme="agent"), ["x"]),
    (Keys({"a": AtomType("any")}, ()), ["(:a 1)", "()"]),  # type: ignore[dict-item]  # a str key
    (Keys({}, (Keyword("z"),), AtomType("any")), ["(:z 1)", "(:y 1)"]),  # required as other
    (Record(("r",), Keys({}, ())), ["(r)"]),  # type: ignore[arg-type]  # a str head
    (Record((), Keys({}, ())), ["(r)"]),
    (OneOf(((Symbol("a"),), Symbol("b"))), ["(a)", "b", "(b)"]),
    (OneOf((Decimal("NaN"),)), ["1.0"]),
    (ListOf(None), ["(1)", "()"]),  # type: ignore[arg-type]
    (ListOf(AtomType("any"), min_length=Decimal("0.5")), ["()", "(1)"]),  # type: ignore[arg-type]
    (None, ["1"]),
])
def test_hand_built_types_behave_as_the_reference(field_type: Any, values: list[str]) -> None:
    schema = _hand_built(field_type)
    for value in values:
        assert_same(schema, cbcl.read(f"(t :v {value})"), exact=False)


def test_values_outside_the_value_model_behave_as_the_reference() -> None:
    schema = schema_of("(keys (:a any) (:b integer) (:c (decimal :min 0.0)) (:d number))")
    for value in [1.5, True, None, Decimal("NaN"), Decimal("-Infinity"), [1], object()]:
        for key in ("a", "b", "c", "d"):
            assert_same(schema, (Symbol("t"), Keyword("v"), (Keyword(key), value)),
                        exact=False)
    with pytest.raises(InvalidOperation):
        check_schema(schema, (Symbol("t"), Keyword("v"), (Keyword("c"), Decimal("NaN"))))


def test_compiled_schemas_pickle_with_their_behaviour() -> None:
    schema = compile_schema(cbcl.read(
        "(schema (record t (:v (one-of a 1)) (:w (keys (else any))) "
        "(:x (list-of (string :max-length 2)))))"))
    copy = pickle.loads(pickle.dumps(schema))
    assert copy == schema
    check_schema(copy, cbcl.read('(t :v a :w (:k 1) :x ("ab"))'))
    for text in ["(t :v b)", "(t :w (:k 1 :k 2))", '(t :x ("abc"))']:
        expected = outcome(reference_check, schema, cbcl.read(text))
        assert expected is not None
        assert outcome(check_schema, copy, cbcl.read(text)) == expected


def test_the_c_twin_leaves_a_type_of_many_fields_to_the_explaining_pass() -> None:
    """63 fields fit the C twin's bit set; a record of 70 is left to ``_explain`` (None),
    and the answer is the same either way."""

    for count, left in ((63, False), (70, True)):
        keys = " ".join(f"(:k{i} integer)" for i in range(count))
        schema = compile_schema(cbcl.read(f"(schema (record t (:v (keys {keys}))))"))
        good = cbcl.read("(t :v (" + " ".join(f":k{i} {i}" for i in range(count)) + "))")
        bad = cbcl.read("(t :v (" + " ".join(f":k{i} x" for i in range(count)) + "))")
        assert_same(schema, good)
        assert_same(schema, bad)
        record = schema.record_for(good)
        assert record is not None
        c_twin = getattr(_schema, "_schema_valid_c", None)
        if c_twin is not None:
            assert (c_twin(record._pairs, good, _schema._has_heads) is None) is left


# ------------------------------------------------------------------ coercion (issue 32)

from cbcl.conversation import coerce_body  # noqa: E402

_COERCED = cbcl.read(
    "(schema (record offer (:currency (one-of EUR USD) required) (:k keyword) (:u uri) "
    "(:b boolean) (:s symbol) (:t string) (:n (one-of \"EUR\" EUR)) (:o (keys (else symbol))) "
    "(:l (list-of (record x (:y (uri :scheme agent)))))))")


def test_coerce_makes_a_str_what_the_schema_says() -> None:
    built = cbcl.body("offer", currency="EUR", k=":size", u="agent://x", b="true",
                      s="bad name", t="keep", n="EUR", o=cbcl.keys(p="q"),
                      l=[cbcl.body("x", y="agent://z"), cbcl.body("x", y="not a uri")])
    assert cbcl.canonical(coerce_body(_COERCED, built)) == (
        '(offer :currency EUR :k :size :u agent://x :b true :s "bad name" :t "keep" '
        ':n "EUR" :o (:p q) :l ((x :y agent://z) (x :y "not a uri")))')
    check_schema(_COERCED, coerce_body(_COERCED, cbcl.body("offer", currency="USD")))


def test_coerce_leaves_what_it_cannot_make() -> None:
    for body in (cbcl.body("offer", currency="GBP"), cbcl.body("other", currency="EUR"),
                 "text", 3, cbcl.body("offer", currency=Decimal("1.5"))):
        assert coerce_body(_COERCED, body) is body  # the same object: nothing changed
    with pytest.raises(SchemaError, match="expected one of EUR USD"):
        check_schema(_COERCED, coerce_body(_COERCED, cbcl.body("offer", currency="GBP")))
