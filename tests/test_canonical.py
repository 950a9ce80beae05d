"""Canonical form (draft §1.2) and the lossless JSON mapping: examples and properties."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from hypothesis import given, strategies as st
from strategies import messages, values

import cbcl
from cbcl import URI, Keyword, LimitError, MalformedError, Symbol
from cbcl.core._canonical import canonical_prefix
from cbcl.core._values import MAX_VALUE_DEPTH


def test_layout_rules() -> None:
    text = '  ; comment\n(  a\t(b   c ) ( ) "x"\r\n)  '
    assert cbcl.canonical(cbcl.read(text)) == '(a (b c) () "x")'


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ('say "hi"\\', '"say \\"hi\\"\\\\"'),
        ("\n\r\t", '"\\n\\r\\t"'),
        ("\x00\x1f\x7f\x80\x9f", '"\\u0000\\u001f\\u007f\\u0080\\u009f"'),
        ("\u202a\u202e\u2066\u2069", '"\\u202a\\u202e\\u2066\\u2069"'),
        ("é ✓ 𝄞 \u00a0", '"é ✓ 𝄞 \u00a0"'),  # other characters stay literal UTF-8
    ],
)
def test_string_escapes(value: str, text: str) -> None:
    assert cbcl.canonical(value) == text
    assert cbcl.read(text) == value


def test_input_escapes_are_normalised() -> None:
    assert cbcl.canonical(cbcl.read('"\\u0041\\u00E9\\u000A\\u202E"')) == '"Aé\\n\\u202e"'


def test_numbers_exactly_as_read() -> None:
    assert cbcl.canonical(cbcl.read("(1.50 -0.0 0 -7 3.000)")) == "(1.50 -0.0 0 -7 3.000)"


def test_python_built_values() -> None:
    assert cbcl.canonical((Symbol("a"), Keyword("k"), URI("x://y"), 5, Decimal("2.5"))) == \
        "(a :k x://y 5 2.5)"
    assert cbcl.canonical(Decimal("5")) == "5.0"  # stays a DECIMAL when read back
    assert cbcl.canonical(Decimal("1E+2")) == "100.0"
    assert cbcl.canonical([Symbol("a"), [1]]) == "(a (1))"  # Python lists print as lists


@pytest.mark.parametrize("bad", [True, None, 1.5, {"a": 1}, b"x", object()])
def test_non_values_are_type_errors(bad: object) -> None:
    with pytest.raises(TypeError):
        cbcl.canonical(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        cbcl.canonical((Symbol("a"), bad))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bad", [2**63, -(2**63) - 1, Decimal("NaN"), Decimal("Infinity"), Decimal("1." + "0" * 40),
            "\ud800"],
)
def test_out_of_range_values_are_value_errors(bad: object) -> None:
    with pytest.raises(ValueError):
        cbcl.canonical(bad)  # type: ignore[arg-type]


def test_deep_values_print_without_recursion_up_to_the_depth_limit() -> None:
    # MAX_VALUE_DEPTH lists deep print (iteratively); one more is refused, as is a list
    # that contains itself (endlessly deep), with a LimitError, never a RecursionError.
    value: object = ()
    for _ in range(MAX_VALUE_DEPTH - 1):
        value = (value,)
    text = cbcl.canonical(value)  # type: ignore[arg-type]
    assert text == "(" * MAX_VALUE_DEPTH + ")" * MAX_VALUE_DEPTH
    with pytest.raises(LimitError, match="nested more than 10000 deep") as refused:
        cbcl.canonical((value,))  # type: ignore[arg-type]
    assert (refused.value.limit, refused.value.maximum) == ("max_depth", MAX_VALUE_DEPTH)
    loop: list[object] = [Symbol("a")]
    loop.append(loop)
    with pytest.raises(LimitError, match="contains itself"):
        cbcl.canonical(loop)  # type: ignore[arg-type]


@given(values, st.integers(0, 80))
def test_a_prefix_is_the_canonical_texts_start(value: cbcl.Value, width: int) -> None:
    assert canonical_prefix(value, width) == cbcl.canonical(value)[:width]


def test_a_prefix_shows_values_no_writer_takes() -> None:
    # what error messages show (a schema's "found …"): any depth, a list in itself
    deep: object = "x"
    for _ in range(2 * MAX_VALUE_DEPTH):
        deep = (deep,)
    assert canonical_prefix(deep, 5) == "((((("  # type: ignore[arg-type]
    loop: list[object] = [Symbol("a")]
    loop.append(loop)
    assert canonical_prefix(loop, 12) == "(a (a (a (a "  # type: ignore[arg-type]


@given(values)
def test_canonical_reads_back_to_the_same_value(value: cbcl.Value) -> None:
    text = cbcl.canonical(value)
    again = cbcl.read(text)
    assert again == value
    assert cbcl.canonical(again) == text  # types and decimal digits too


@given(values)
def test_canonical_is_a_fixed_point(value: cbcl.Value) -> None:
    text = cbcl.canonical(value)
    assert cbcl.canonical(cbcl.read(text.encode())) == text


@given(messages)
def test_message_round_trip(message: cbcl.Message) -> None:
    text = cbcl.canonical(message)
    parsed = cbcl.parse(text.encode(), envelope_only=True)
    assert parsed == message
    assert cbcl.canonical(parsed) == text


@given(values)
def test_json_mapping_is_lossless(value: cbcl.Value) -> None:
    mapped = json.loads(json.dumps(cbcl.json_mapping.to_json(value)))
    back = cbcl.json_mapping.from_json(mapped)
    assert cbcl.canonical(back) == cbcl.canonical(value)


def test_json_mapping_shape() -> None:
    value = cbcl.read('(a :k "s" 1 2.50 x://y 9007199254740992 -9007199254740991)')
    assert cbcl.json_mapping.to_json(value) == [
        {"symbol": "a"}, {"keyword": "k"}, "s", 1, {"decimal": "2.50"}, {"uri": "x://y"},
        {"int": "9007199254740992"}, -9007199254740991,
    ]


@pytest.mark.parametrize(
    "bad",
    [1.5, None, True, {"symbol": "a b"}, {"keyword": ":k"}, {"int": "007"},
     {"int": str(2**63)}, {"decimal": "1e5"}, {"decimal": "5"}, {"uri": "x"},
     {"symbol": "a", "extra": 1}, {"colour": "red"}, 2**53, [1, [2, [3.5]]]],
)
def test_json_mapping_refuses_what_it_does_not_define(bad: object) -> None:
    with pytest.raises(MalformedError):
        cbcl.json_mapping.from_json(bad)


def test_json_mapping_errors_name_the_path() -> None:
    with pytest.raises(MalformedError, match=r"\$\[1\]\[0\]"):
        cbcl.json_mapping.from_json([1, [None]])
