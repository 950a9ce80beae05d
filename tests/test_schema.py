"""Schemas (spec/conversations.md §2): the section syntax, each type and bound (exactly the
bound accepted, one beyond refused), paths, and the shipped schemas on the examples."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_conversation import descriptor

import cbcl
from cbcl import DescriptorError, SchemaError
from cbcl._schema import Schema, check_schema, compile_schema

ROOT = Path(__file__).parent.parent
EXAMPLES = ROOT / "descriptors" / "examples"


def schema_of(type_text: str) -> Schema:
    return compile_schema(cbcl.read(f"(schema (record t (:v {type_text})))"))


def check(type_text: str, value_text: str) -> None:
    check_schema(schema_of(type_text), cbcl.read(f"(t :v {value_text})"))


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
        cbcl.read_descriptor(raw[:end] + b"\n(schema (record t (:a nope)))" + raw[end:])


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
