"""The sandboxed evaluator (spec/conversations.md §3): semantics, bombs and boundaries, and
every `EXPR ⇒ RESULT` example in spec/conversations.md.

Tests internals too: the function library and the ``(functions …)`` reader."""

from __future__ import annotations

import re
import time
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

import cbcl
from cbcl import DescriptorError, EvaluationError, LimitError, Symbol, Value
from cbcl.conversation import evaluate
from cbcl.protocol._evaluator import LIBRARY, read_functions

SPEC = Path(__file__).parent.parent / "spec" / "conversations.md"
MAX, MIN = 2**63 - 1, -(2**63)


def ev(text: str, **kw: object) -> str:
    return cbcl.canonical(evaluate(cbcl.read(text), **kw))  # type: ignore[arg-type]


def spec_examples() -> list[tuple[str, str]]:
    found = []
    for block in re.findall(r"```\n(.*?)```", SPEC.read_text("utf-8"), re.S):
        for line in block.splitlines():
            if "⇒" in line:
                expr, result = (part.strip() for part in line.split("⇒"))
                found.append((expr, result))
    return found


def test_spec_has_examples() -> None:
    assert len(spec_examples()) >= 20


@pytest.mark.parametrize("expr, result", spec_examples())
def test_spec_examples(expr: str, result: str) -> None:
    """`EXPR ⇒ VALUE` evaluates with now=1764500000000; `EXPR ⇒ kind $path` fails so."""
    m = re.fullmatch(r"(evaluation|limit) error( at (\S+))?", result)
    if m is None:
        assert ev(expr, now=1764500000000) == result
        return
    kind = EvaluationError if m.group(1) == "evaluation" else LimitError
    with pytest.raises(kind) as info:
        ev(expr, now=1764500000000, budget=100)
    if m.group(3):
        assert info.value.path == m.group(3)  # type: ignore[attr-defined]


@pytest.mark.parametrize("expr, result", [
    ("(+ 1 2 3)", "6"), ("(- 7)", "-7"), ("(- 10 1 2)", "7"), ("(* 2 3 4)", "24"),
    ("(/ 7 2)", "3"), ("(/ -7 2)", "-3"), ("(/ 7 -2)", "-3"), ("(/ -7 -2)", "3"),
    ("(/ 1.0 3)", "0.333333333333333333"), ("(/ 2.0 3)", "0.666666666666666667"),
    ("(/ 1.0 4)", "0.25"), ("(/ 10 4.0)", "2.5"), ("(/ 4.0 2)", "2.0"),
    ("(/ -1.0 3)", "-0.333333333333333333"), ("(/ 0.0 -3)", "0.0"),
    ("(/ 0.0000000000000000005 1)", "0.0"), ("(/ 0.0000000000000000015 1)", "0.000000000000000002"),
    ("(+ 0.1 0.2)", "0.3"), ("(+ 1 2.50)", "3.50"), ("(* 1.5 1.5)", "2.25"),
    ("(* -1.0 0.0)", "0.00"), ("(- 0.0)", "0.0"), ("(+ 1.5 -1.5)", "0.0"),
    ("(= 1 1.0)", "true"), ("(= 1.5 1.50)", "true"), ("(= \"a\" \"a\")", "true"),
    ("(= a:x \"a\")", None), ("(= :a :a)", "true"), ("(= :a \"a\")", "false"),
    ("(!= 1 2)", "true"), ("(< 1 2 3)", "true"), ("(< 1 3 2)", "false"),
    ("(<= 1 1 2)", "true"), ("(> 2.5 2)", "true"), ("(>= 2 2.0)", "true"),
    ("(min 3 1.5 2)", "1.5"), ("(max 3 1.5 2)", "3"), ("(min 1 1.0)", "1"),
    ("(and true true)", "true"), ("(and true false)", "false"), ("(or false true)", "true"),
    ("(not false)", "true"), ("(if true 1 2)", "1"), ("(if false 1 2)", "2"),
    ("(seconds 2)", "2000"), ("(minutes 2)", "120000"), ("(hours 1)", "3600000"),
    ("(days 1)", "86400000"), ("(+ (now) (hours 1))", "1003600000"),
    ("\"text\"", "\"text\""), (":key", ":key"), ("agent://a", "agent://a"), ("true", "true"),
])
def test_semantics(expr: str, result: str | None) -> None:
    if result is None:
        with pytest.raises(cbcl.MalformedError):
            cbcl.read(expr)
        return
    assert ev(expr, now=1_000_000_000) == result


def test_lazy_forms_do_not_evaluate_the_branch_not_taken() -> None:
    assert ev("(if true 1 (/ 1 0))") == "1"
    assert ev("(and false (foo))") == "false"
    assert ev("(or true undefined)") == "true"
    with pytest.raises(EvaluationError):
        ev("(if false 1 (/ 1 0))")


@pytest.mark.parametrize("expr, path, fragment", [
    ("(foo 1)", "$", "unknown function foo"),
    ("(+ 1 (foo))", "$[2]", "unknown function"),
    ("(+ x 1)", "$[1]", "unbound symbol x"),
    ("(+ 1 \"a\")", "$[2]", "expected a number"),
    ("(+ 1 (* 2 :k))", "$[2][2]", "expected a number"),
    ("()", "$", "empty list"),
    ("(1 2)", "$", "function name"),
    ("(if 1 2 3)", "$[1]", "expects a boolean"),
    ("(and true 1)", "$[2]", "expects a boolean"),
    ("(not 1)", "$[1]", "expected a boolean"),
    ("(if true 1)", "$", "exactly 3 arguments"),
    ("(/ 1 2 3)", "$", "exactly 2"),
    ("(-)", "$", "at least 1"),
    ("(now 1)", "$", "exactly 0"),
    ("(/ 1 0)", "$[2]", "division by zero"),
    ("(/ 1.0 0.0)", "$[2]", "division by zero"),
    ("(< 1 \"a\")", "$[2]", "expected a number"),
    ("(hours 1.5)", "$[1]", "expected an integer"),
])
def test_errors_name_the_path(expr: str, path: str, fragment: str) -> None:
    with pytest.raises(EvaluationError) as info:
        ev(expr, now=0)
    assert info.value.path == path
    assert fragment in str(info.value) and str(info.value).startswith(path + ": ")
    assert info.value.exit_code == 7


def test_now_must_be_given() -> None:
    with pytest.raises(EvaluationError, match="no time was given"):
        ev("(now)")


def test_only_allowed_functions() -> None:
    section = cbcl.read("(functions + now hours)")
    assert ev("(+ (now) (hours 1))", functions=section, now=0) == "3600000"
    with pytest.raises(EvaluationError, match="not allowed") as info:
        ev("(+ 1 (* 2 3))", functions=section)
    assert info.value.path == "$[2]"
    assert ev("(+ 1 2)", functions=["+"]) == "3"
    with pytest.raises(EvaluationError):
        ev("(- 1)", functions=[])
    with pytest.raises(ValueError):
        ev("1", functions=["pow"])
    with pytest.raises(TypeError):
        ev("1", functions="+")


@pytest.mark.parametrize("text, fragment", [
    ("(functions + pow)", "not a library function"),
    ("(functions + +)", "twice"),
    ("(functions \"+\")", "not a function name"),
    ("(schema)", "expected a (functions"),
])
def test_functions_section_is_validated(text: str, fragment: str) -> None:
    with pytest.raises(DescriptorError, match=re.escape(fragment)):
        read_functions(cbcl.read(text))


def test_arguments_are_checked() -> None:
    for kw in ({"budget": 0}, {"max_depth": 0}, {"now": 1.5}, {"now": 2**63}):
        with pytest.raises(ValueError):
            evaluate(1, **kw)
    with pytest.raises(TypeError):
        evaluate((Symbol("+"), 1.5))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        evaluate(True)  # (a bool: an int to a type checker, refused at run time)


# --------------------------------------------------------------------------- int64


@pytest.mark.parametrize("expr, ok", [
    (f"(+ {MAX - 1} 1)", str(MAX)), (f"(+ {MAX} 1)", None),
    (f"(- {MIN + 1} 1)", str(MIN)), (f"(- {MIN} 1)", None),
    (f"(- {MIN})", None), (f"(- {MAX})", str(-MAX)),
    (f"(* {MAX} 1)", str(MAX)), (f"(* {MAX} 2)", None), (f"(* {MIN} -1)", None),
    ("(* 4294967296 2147483648)", None), ("(* 4294967296 2147483647)", str(2**63 - 2**32)),
    (f"(/ {MIN} -1)", None), (f"(/ {MIN} 1)", str(MIN)),
    ("(days 106751991167)", str(106751991167 * 86400000)), ("(days 106751991168)", None),
    (f"(+ {MAX} 1 -1)", None),  # every intermediate is checked
    (f"(+ {MAX} -1 1)", str(MAX)),
])
def test_int64_boundaries(expr: str, ok: str | None) -> None:
    if ok is None:
        with pytest.raises(EvaluationError, match="overflow"):
            ev(expr)
    else:
        assert ev(expr) == ok


@given(st.integers(MIN, MAX), st.integers(MIN, MAX), st.sampled_from("+-*/"))
def test_integer_arithmetic_matches_exact_arithmetic(a: int, b: int, op: str) -> None:
    if op == "/" and b == 0:
        return
    exact = {"+": a + b, "-": a - b, "*": a * b,
             "/": (abs(a) // abs(b)) * (1 if (a < 0) == (b < 0) else -1) if b else 0}[op]
    expr = (Symbol(op), a, b)
    if MIN <= exact <= MAX:
        assert evaluate(expr) == exact
    else:
        with pytest.raises(EvaluationError):
            evaluate(expr)


@given(st.decimals(allow_nan=False, allow_infinity=False, places=3,
                   min_value=-10**9, max_value=10**9),
       st.decimals(allow_nan=False, allow_infinity=False, places=2,
                   min_value=-10**9, max_value=10**9))
def test_decimal_arithmetic_is_exact(a: Decimal, b: Decimal) -> None:
    assert evaluate((Symbol("+"), a, b)) == a + b
    assert evaluate((Symbol("*"), a, b)) == a * b
    assert evaluate((Symbol("-"), a, b)) == a - b


# --------------------------------------------------------------------------- bombs


def nested(n: int, op: str = "-", leaf: object = 1) -> object:
    value = leaf
    for _ in range(n):
        value = (Symbol(op), value)
    return value


def test_five_thousand_unary_minuses_end_quickly() -> None:
    start = time.process_time()
    with pytest.raises(LimitError) as info:
        evaluate(nested(5000))  # type: ignore[arg-type]
    assert info.value.limit == "max_depth"
    # With the limits raised it is evaluated iteratively: no RecursionError.
    assert evaluate(nested(5000), max_depth=5000, budget=5001) == 1  # type: ignore[arg-type]
    assert evaluate(nested(5001), max_depth=6000, budget=6000) == -1  # type: ignore[arg-type]
    assert time.process_time() - start < 2


def test_depth_limit_boundary() -> None:
    assert evaluate(nested(32)) == 1  # type: ignore[arg-type]
    with pytest.raises(LimitError):
        evaluate(nested(33))  # type: ignore[arg-type]
    assert evaluate(nested(3), max_depth=3) == -1  # type: ignore[arg-type]


def test_reader_refuses_deep_text_first() -> None:
    with pytest.raises(LimitError):
        cbcl.read("(- " * 5000 + "1" + ")" * 5000)


def test_budget_exactly_enough_and_one_short() -> None:
    expr = cbcl.read("(+ (* 2 3) (- 4) 5)")  # 1 + (1+2) + (1+1) + 1 = 7 nodes
    assert evaluate(expr, budget=7) == 7
    with pytest.raises(LimitError) as info:
        evaluate(expr, budget=6)
    assert info.value.limit == "budget" and info.value.exit_code == 4
    # Lazy forms charge only what they evaluate: 1 + 1 + 1 = 3.
    assert evaluate(cbcl.read("(if true 1 (+ 1 2 3 4))"), budget=3) == 1


def test_wide_expression_is_bounded_by_the_budget() -> None:
    wide: Value = (Symbol("+"), *([1] * 10_000))
    with pytest.raises(LimitError):
        evaluate(wide)
    assert evaluate(wide, budget=10_001) == 10_000


def test_huge_products_end_quickly() -> None:
    start = time.process_time()
    with pytest.raises(EvaluationError):
        ev("(expt 10 100)")  # there is no power function
    big = " ".join(["9223372036854775807"] * 4000)
    with pytest.raises(EvaluationError, match="overflow"):
        ev(f"(* {big})", budget=10_000)
    dec = " ".join(["99999999999999999999.9"] * 4000)
    with pytest.raises(EvaluationError, match="decimal overflow"):
        ev(f"(* {dec})", budget=10_000)
    squares = "(* " + " ".join(["(* 3037000499 3037000499)"] * 1000) + ")"
    with pytest.raises(EvaluationError, match="overflow"):
        ev(squares, budget=10_000)
    assert time.process_time() - start < 2


@pytest.mark.parametrize("expr, ok", [
    ("(+ 99999999999999999999999999999999999999.0 0.0)",
     "99999999999999999999999999999999999999.0"),  # 40 characters
    ("(+ 99999999999999999999999999999999999999.0 1.0)", None),  # 41
    ("(* 0.0000000000000000001 0.0000000000000000001)",
     "0.00000000000000000000000000000000000001"),  # 40
    ("(* 0.0000000000000000001 0.00000000000000000001)", None),  # 41
    ("(- -9999999999999999999999999999999999999.0 0.0)",
     "-9999999999999999999999999999999999999.0"),
    ("(- -9999999999999999999999999999999999999.0 1.0)", None),
])
def test_long_decimals(expr: str, ok: str | None) -> None:
    if ok is None:
        with pytest.raises(EvaluationError, match="decimal overflow"):
            ev(expr)
    else:
        assert ev(expr) == ok and len(ok) <= 40


def test_library_is_as_documented() -> None:
    assert set(LIBRARY) == {"+", "-", "*", "/", "=", "!=", "<", "<=", ">", ">=", "min", "max",
                            "and", "or", "not", "if", "now", "seconds", "minutes", "hours",
                            "days"}


def test_task_assignment_deadline() -> None:
    example = Path(__file__).parent.parent / "descriptors" / "examples" / \
        "task-assignment-v1.cbcl"
    message = cbcl.parse(example.read_bytes(), envelope_only=True)
    body = message.body
    assert isinstance(body, tuple)
    deadline = body[body.index(cbcl.Keyword("deadline")) + 1]
    functions = cbcl.descriptor.read_descriptor(
        (Path(__file__).parent.parent / "descriptors" / "task-assignment-v1.cbcl")
        .read_bytes()).functions
    assert functions is not None
    assert evaluate(deadline, functions=functions, now=1_000) == 4_600
