"""The unmetered fast path of stateless constraints (cbcl/protocol/_constraints.py, "the
unmetered fast path") held to the evaluator: same verdict, same error class and message,
and the step budget at N and N + 1."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from hypothesis import given, settings, strategies as st

import cbcl
from cbcl.protocol import _constraints
from cbcl.protocol._constraints import (
    MAX_STEPS,
    ConstraintError,
    Constraints,
    _worst_steps,
    read_constraints,
)
from cbcl.protocol._evaluator import run
from cbcl.protocol._message import Intent

FUNCTIONS = ("+", "-", "*", "/", "=", "!=", "<", "<=", ">", ">=", "and", "or", "not", "if",
             "min", "max")
FUNCTIONS_SECTION = cbcl.read(("(functions " + " ".join(FUNCTIONS) + ")").encode())


def constraints_of(*checks: str) -> Constraints:
    rules = " ".join(f'(rule r{i} (intents PROPOSE) (check {check}) (message "no {i}"))'
                     for i, check in enumerate(checks))
    return read_constraints(cbcl.read(f"(constraints {rules})".encode()),
                            intents=(Intent.PROPOSE, Intent.CFP),
                            functions=FUNCTIONS_SECTION, conversation=False)


def reference(constraints: Constraints) -> Constraints:
    """The same rules without their compiled closures: the evaluator runs them."""
    return Constraints(tuple(dataclasses.replace(rule, compiled=None)
                             for rule in constraints.rules), constraints.functions)


def proposal(body: str, **envelope: int) -> cbcl.Message:
    return cbcl.Message(message_id="m", sender="agent://a", receiver="agent://b",
                        intent="PROPOSE", protocol="contract-net/v1",
                        body=cbcl.read(body.encode()), **envelope)  # type: ignore[arg-type]


def outcome(call: Callable[[], None]) -> tuple[str, str]:
    try:
        call()
    except cbcl.CBCLError as exc:
        return type(exc).__name__, str(exc)
    return "holds", ""


# The grammar of stateless checks: the context forms a stateless rule may use, the library
# (without (now)), atoms of every kind; arities are drawn freely (a check that does not
# load is skipped: the loader's refusals are test_constraints.py's).
KEYS = (":price", ":eta", ":bid", ":task-id", ":flag")
leaves = st.one_of(
    st.sampled_from(["0", "1", "-3", "7", "100", "9223372036854775807", "1.5", "2.50",
                     '"s"', '"t1"', "true", "false", "(head)", "(quote bid)",
                     "(quote proposal)", "(quote true)", "(envelope reply-by)",
                     "(envelope timestamp)", "(has-envelope reply-by)",
                     "(has-envelope timestamp)"]),
    st.lists(st.sampled_from(KEYS), min_size=1, max_size=2).flatmap(
        lambda path: st.sampled_from([f"(field {' '.join(path)})",
                                      f"(has {' '.join(path)})"])))
checks = st.recursive(leaves, lambda inner: st.tuples(
    st.sampled_from(FUNCTIONS), st.lists(inner, min_size=1, max_size=3)).map(
        lambda t: "(" + " ".join([t[0], *t[1]]) + ")"), max_leaves=10)
member_values = st.sampled_from(["0", "7", "100", "101", "-1", "2.5", "1.50", '"t1"', '"x"',
                                 "true", "false", "EUR", ":eta", "(bid :price 3)",
                                 "(bid :eta 7 :price 2.5)", "()"])
bodies = st.tuples(
    st.sampled_from(["proposal", "bid", "proposal x", "1", '"s"']),
    st.lists(st.tuples(st.sampled_from(KEYS), member_values), max_size=4)).map(
        lambda t: "(" + " ".join([t[0], *(f"{k} {v}" for k, v in t[1])]) + ")")


def _load(*texts: str) -> Constraints | None:
    try:
        return constraints_of(*texts)
    except cbcl.DescriptorError:
        return None


@settings(max_examples=300, deadline=None)
@given(st.lists(checks, min_size=1, max_size=3), bodies,
       st.sampled_from([{}, {"reply_by": 5}, {"reply_by": 5, "timestamp": 4}]))
def test_the_fast_path_agrees_with_the_evaluator(texts: list[str], body: str,
                                                  envelope: dict[str, int]) -> None:
    constraints = _load(*texts)
    if constraints is None:
        return
    assert constraints.fast[Intent.PROPOSE] is not None  # (3 × 256 nodes fit the budget)
    message = proposal(body, **envelope)
    assert outcome(lambda: constraints.check(message)) == \
        outcome(lambda: reference(constraints).check(message))


@pytest.mark.parametrize("check", [
    "(= (head) (quote proposal))", "(= (quote proposal) (head))", "(!= (head) (quote bid))",
    "(has :bid :price)", "(not (has :eta))", "(<= (field :bid :price) 3)",
    "(> 4 (field :bid :price))", "(= (field :task-id) \"t1\")",
    "(or (not (has :eta)) (<= (field :eta) 5))",
    "(and (has :bid) (= (+ 1 2) 3))", "(if (has :x) false true)",
    "(= (field :bid :price) (field :bid :price))", "(< (+ (field :bid :price) 1) 5)",
])
def test_each_specialised_shape_holds_without_the_reference(
        check: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # An accepted message never reaches the metered closures; a refused one reaches them
    # once, for the rule that did not hold, and its error is the evaluator's.
    constraints = constraints_of(check)
    calls: list[str] = []
    apply = _constraints._apply

    def counted(rules: tuple[_constraints.Rule, ...], *args: object) -> None:
        calls.extend(rule.name for rule in rules)
        apply(rules, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(_constraints, "_apply", counted)
    constraints.check(proposal('(proposal :task-id "t1" :bid (bid :price 2))'))
    assert calls == []
    refused = proposal('(bid :task-id "t2" :eta 7 :x 1)')
    with pytest.raises(ConstraintError) as caught:
        constraints.check(refused)
    assert calls == ["r0"]
    assert outcome(lambda: reference(constraints).check(refused)) == \
        ("ConstraintError", str(caught.value))


def _ones(count: int) -> str:
    """A check of ``count`` steps: (= 1 … 1) with count - 1 ones."""
    return "(= " + " ".join(["1"] * (count - 1)) + ")"


def test_the_worst_case_is_the_evaluators_steps_on_the_longest_branch() -> None:
    for check in (_ones(5), "(if (has :x) (+ 1 2 3) 4)", "(and true (not false) (has :x))",
                  "(or false (< 1 (field :bid :price)))"):
        (rule,) = constraints_of(check).rules
        message = proposal("(proposal :x 1 :bid (bid :price 2))")
        context = _constraints._MessageContext(message, None)
        steps = run(rule.check, frozenset(FUNCTIONS), None, MAX_STEPS, 32, "$", context)[1]
        assert steps == _worst_steps(rule.check)
    assert _worst_steps(cbcl.read(b"(if (has :x) (+ 1 2 3) 4)")) == 1 + 1 + 4


def _budget_rules(last: int) -> list[str]:
    # 16 rules of 255 steps and one of `last`: 4,080 + last.
    return [_ones(255)] * 16 + [_ones(last)]


def test_the_budget_at_n_runs_unmetered_and_at_n_plus_1_metered() -> None:
    message = proposal("(proposal :x 1)")
    fits = constraints_of(*_budget_rules(16))
    assert sum(_worst_steps(r.check) for r in fits.rules) == MAX_STEPS
    assert fits.fast[Intent.PROPOSE] is not None
    fits.check(message)
    over = constraints_of(*_budget_rules(17))
    assert over.fast[Intent.PROPOSE] is None
    with pytest.raises(cbcl.LimitError, match=f"budget of {MAX_STEPS}") as caught:
        over.check(message)
    assert caught.value.limit == "constraint_steps"
    assert outcome(lambda: over.check(message)) == \
        outcome(lambda: reference(over).check(message))


def test_the_budget_counts_the_longest_branch_not_the_branch_taken() -> None:
    # The last rule takes 3 steps on this message ((if true 1 …)), but may take 2 + 16
    # on another: the worst case is over the budget, so the intent runs metered, and the
    # metered run accepts (4,080 + 3 steps) as the evaluator does.
    message = proposal("(proposal :x 1)")
    rules = [*_budget_rules(2)[:16], "(if true true " + _ones(16) + ")"]
    constraints = constraints_of(*rules)
    assert constraints.fast[Intent.PROPOSE] is None
    constraints.check(message)
    assert outcome(lambda: constraints.check(message)) == \
        outcome(lambda: reference(constraints).check(message))


def test_a_refusal_at_the_budget_is_the_rules_not_the_budgets() -> None:
    # At N the last rule's false is a ConstraintError naming it, through the fast path.
    message = proposal("(proposal :x 1)")
    rules = [*_budget_rules(16)[:16], "(= " + " ".join(["1"] * 14) + " 2)"]
    constraints = constraints_of(*rules)
    assert constraints.fast[Intent.PROPOSE] is not None
    with pytest.raises(ConstraintError, match="constraint r16: no 16"):
        constraints.check(message)
