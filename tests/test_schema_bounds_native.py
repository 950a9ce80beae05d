"""The C schema check's own comparisons held to Python's: a decimal or integer against a
bound (compared in C where both are finite one-word numbers, cstack.h's SmallNumber) and a
list's length against a list-of's bounds (read from the packed spec)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, strategies as st
from test_schema import assert_same

import cbcl
from cbcl import Keyword, Symbol
from cbcl.conversation import compile_schema
from cbcl.protocol import _schema

BOUNDS = ["0", "0.0", "1", "1.50", "-1", "-0.001", "2.5", "99999", "0.000001",
          "12345678901234567890.5", "-9223372036854775808", "9223372036854775807"]


def _schema_of(low: str | None, high: str | None, kind: str = "decimal") -> Any:
    constraints = (f" :min {low}" if low is not None else "") + (
        f" :max {high}" if high is not None else "")
    return compile_schema(cbcl.read(f"(schema (record t (:v ({kind}{constraints}))))"))


def _c_accepts(schema: Any, body: Any) -> bool | None:
    record = schema.record_for(body)
    assert record is not None
    return _schema._schema_valid_c(record._pairs, body, _schema._has_heads)  # type: ignore[no-any-return]


decimals = st.one_of(
    st.decimals(allow_nan=False, allow_infinity=False),
    st.decimals(allow_nan=False, allow_infinity=False, places=3, min_value=-3, max_value=3),
    st.sampled_from([Decimal(b) for b in BOUNDS] + [Decimal("-0.0"), Decimal("1.500000"),
                                                     Decimal("0.9999999999999999999"),
                                                     Decimal("1E+5"), Decimal("1E-30")]))


@given(decimals, st.sampled_from([None, *BOUNDS]), st.sampled_from([None, *BOUNDS]),
       st.booleans())
def test_a_decimal_against_its_bounds_as_python_compares(value: Decimal, low: str | None,
                                                         high: str | None,
                                                         as_read: bool) -> None:
    if low is not None and high is not None and Decimal(low) > Decimal(high):
        low, high = high, low
    schema = _schema_of(low, high)
    if as_read and value == value.to_integral_value() and "E" not in str(value):
        as_read = False  # (an integral Decimal's text reads as an integer)
    text = format(value, "f")
    if as_read and "." in text and len(text) <= 40:  # (MAX_DECIMAL_CHARS)
        read = cbcl.read(f"(t :v {text})")  # (the reader's decimals, made in place)
        assert type(read) is tuple and type(read[2]) is Decimal
        body, value = read, read[2]
    else:
        body = (Symbol("t"), Keyword("v"), value)
    assert_same(schema, body)
    if _schema._schema_valid_c is None:
        return
    expected = (low is None or not value < Decimal(low)) and (
        high is None or not value > Decimal(high))
    assert _c_accepts(schema, body) is expected


@pytest.mark.parametrize("value", [0, 1, -1, 99999, 2**63 - 1, -(2**63), 2**64, -(2**70)])
@pytest.mark.parametrize("bound", ["0", "1", "-1", "0.5", "9223372036854775807"])
def test_an_integer_against_a_number_bound(value: int, bound: str) -> None:
    for kind in ("integer", "number"):
        if kind == "integer" and "." in bound:
            continue
        for low, high in ((bound, None), (None, bound)):
            assert_same(_schema_of(low, high, kind), (Symbol("t"), Keyword("v"), value))


@pytest.mark.parametrize("count", range(6))
def test_a_list_against_its_length_bounds(count: int) -> None:
    schema = compile_schema(cbcl.read(
        "(schema (record t (:v (list-of integer :min-length 2 :max-length 4))))"))
    body = (Symbol("t"), Keyword("v"), tuple(range(count)))
    assert_same(schema, body)
    if _schema._schema_valid_c is not None:
        assert _c_accepts(schema, body) is (2 <= count <= 4)
