"""The cost model's pure parts (``benchmarks/cost_model.py``, spec §1.1 "Cost model"): the
terms counted from a message, its new names, the body walk's tokens, the non-negative fit
and the spec's table. Nothing here is timed."""

from __future__ import annotations

import random
import sys
from collections import Counter
from pathlib import Path

import pytest

import cbcl
from cbcl.core._values import URI, Keyword, Symbol, Value

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import cost_model  # noqa: E402  (benchmarks/cost_model.py)
from cbcl_bench import find_descriptors, load_registry, mixed_messages_of  # noqa: E402

S, K = Symbol, Keyword


@pytest.fixture(scope="module")
def registry() -> cbcl.Registry:
    return load_registry(find_descriptors())


def test_terms_count_each_kind_once_per_atom_and_lists_once() -> None:
    text = '(row :id "r-1" :qty 3 :price 2.50 :owner agent://a/b :tags (x y) :dims ())'
    terms = cost_model.count_terms(text)
    assert terms.counts == Counter({
        "fixed": 1, "byte": len(text), "list": 3, "symbol": 3, "keyword": 6, "string": 1,
        "integer": 1, "decimal": 1, "uri": 1})
    assert terms.names == frozenset({
        ("symbol", "row"), ("symbol", "x"), ("symbol", "y"), ("uri", "agent://a/b"),
        *(("keyword", k) for k in ("id", "qty", "price", "owner", "tags", "dims"))})


def test_terms_skip_comments_and_count_bytes_in_utf8() -> None:
    text = '(a ; a note (x) "y"\n "Größe \\" \\u00e9" -12 1.5)'
    terms = cost_model.count_terms(text)
    assert terms.counts["byte"] == len(text.encode()) == len(text) + 2
    assert (terms.counts["list"], terms.counts["symbol"], terms.counts["string"],
            terms.counts["integer"], terms.counts["decimal"]) == (1, 1, 1, 1, 1)


def test_terms_refuse_a_text_the_reader_cannot_tokenise() -> None:
    with pytest.raises(ValueError, match="not a token"):
        cost_model.count_terms("(a \x01)")


def _set(*texts: str) -> list[cost_model.Terms]:
    return [cost_model.count_terms(text) for text in texts]


def _new(terms: list[cost_model.Terms]) -> list[tuple[float, float, float]]:
    return [(round(t.counts["new symbol"], 3), round(t.counts["new keyword"], 3),
             round(t.counts["new uri"], 3)) for t in terms]


def test_a_name_used_in_every_message_stays_in_the_memo() -> None:
    terms = _set("(a :k x://u)", "(a :k x://u)")
    cost_model.mark_new_names(terms, slots=4096)
    # between two uses of a name, 2 others went in the memo (all held: ~0 each)
    assert _new(terms) == [(0.0, 0.0, 0.0), (0.0, 0.0, 0.0)]
    assert 0 < terms[0].counts["new symbol"] < 0.001


def test_a_name_misses_as_a_direct_mapped_memo_would() -> None:
    # 3 names a message, each used once per pass: between two uses of one, the 5 others
    # went in a memo of 4 slots, and evicted it more often than not, never surely
    terms = _set("(a b c)", "(d e f)")
    cost_model.mark_new_names(terms, slots=4)
    assert all(1.5 < t.counts["new symbol"] < 3 for t in terms)
    terms = _set("(a b c)", "(d e f)")
    cost_model.mark_new_names(terms, slots=4096)
    assert all(t.counts["new symbol"] < 0.01 for t in terms)
    fresh = _set(*(f"(n{i} :k{i} x://u/{i})" for i in range(50)))
    cost_model.mark_new_names(fresh, slots=4)  # far more names than slots: all miss
    assert min(_new(fresh)) > (0.99, 0.99, 0.99)


def _request(result: Value) -> cbcl.Message:
    return cbcl.Message(message_id="m-1", sender=URI("agent://a/b"), receiver=URI("agent://c/d"),
                        intent="INFORM", protocol=S("request/v1"),
                        body=(S("inform-result"), K("action-id"), "rq-1", K("result"), result))


def test_walked_tokens_take_a_whole_value_as_one(registry: cbcl.Registry) -> None:
    short = cost_model.walked_tokens(registry, _request((S("batch"), 1)))
    long = cost_model.walked_tokens(registry, _request((S("batch"), *range(50), (S("x"),))))
    atom = cost_model.walked_tokens(registry, _request(7))
    # ( inform-result :action-id "rq-1" :result VALUE ) and the end: 8 steps, whatever
    # VALUE is
    assert short == long == atom == 8


def test_walked_tokens_count_every_token_of_a_typed_row(registry: cbcl.Registry) -> None:
    no_rows, one_row = (mixed_messages_of(rows, 1, "walked")[0] for rows in (0, 1))

    def member(record: Value | None, key: str) -> tuple[Value, ...]:
        assert isinstance(record, tuple)
        found = record[record.index(K(key)) + 1]
        assert isinstance(found, tuple)
        return found

    row = member(one_row.body, "rows")[0]
    tags, attrs, dims = member(row, "tags"), member(row, "attrs"), member(row, "dims")
    # the row's parentheses and head, its ten keywords and seven atoms; :tags and :dims
    # are walked token by token, :attrs' keywords too but its values are taken whole
    expected = 2 + 1 + 10 + 7 + (len(tags) + 2) + (len(attrs) + 2) + (len(dims) + 2)
    assert (cost_model.walked_tokens(registry, one_row)
            - cost_model.walked_tokens(registry, no_rows)) == expected


def test_walked_tokens_refuse_a_body_the_grammar_refuses(registry: cbcl.Registry) -> None:
    message = cbcl.Message(message_id="m-1", sender=URI("agent://a/b"),
                           receiver=URI("agent://c/d"), intent="INFORM",
                           protocol=S("request/v1"), body=(S("nonsense"),))
    with pytest.raises(ValueError, match="refuses"):
        cost_model.walked_tokens(registry, message)


def test_fit_recovers_the_coefficients_of_exact_rows() -> None:
    truth = {"fixed": 2.0, "byte": 0.001, "string": 0.05, "decimal": 0.2, "walked": 0.08}
    rng = random.Random(5)
    rows = []
    for _ in range(20):
        counts = Counter({"fixed": 1, "byte": rng.randrange(200, 60000),
                          "string": rng.randrange(300), "decimal": rng.randrange(300),
                          "walked": rng.randrange(300)})
        rows.append((counts, sum(truth[t] * counts[t] for t in truth)))
    found = cost_model.fit(rows)
    assert set(found) == set(cost_model.TERMS)
    for term in cost_model.TERMS:
        assert found[term] == pytest.approx(truth.get(term, 0.0), rel=1e-6, abs=1e-9)


def test_fit_holds_a_term_at_zero_rather_than_below() -> None:
    # time falls with bytes: least squares would make the per-byte cost negative
    rows = [(Counter({"fixed": 1, "byte": b}), 5.0 - 0.0001 * b) for b in (100, 1000, 5000)]
    found = cost_model.fit(rows, ("fixed", "byte"))
    assert found["byte"] == 0.0
    assert 4.5 < found["fixed"] < 5.0


def test_the_table_round_trips_through_the_spec_text() -> None:
    model = {op: {term: (index + 1) * 0.0123 * (10 ** -(index % 4))
                  for index, term in enumerate(cost_model.TERMS)}
             for op in cost_model.OPERATIONS}
    model["text read"]["walked"] = 0.0  # not applicable: printed as a dash
    text = f"before\n{cost_model.BEGIN}\nold\n{cost_model.END}\nafter\n"
    written = cost_model.write_table(text, model)
    assert written.startswith("before\n") and written.endswith(f"{cost_model.END}\nafter\n")
    assert "old" not in written
    read = cost_model.parse_table(written)
    for op in cost_model.OPERATIONS:
        for term in cost_model.TERMS:
            assert read[op][term] == pytest.approx(model[op][term], rel=0.005)


def test_the_spec_holds_a_complete_table() -> None:
    model = cost_model.parse_table(cost_model.SPEC.read_text())
    assert all(model[op]["fixed"] > 0 for op in cost_model.OPERATIONS)
    with pytest.raises(ValueError, match="markers"):
        cost_model.parse_table("no table here")


def test_a_switch_is_a_message_of_another_shape_than_the_one_before() -> None:
    messages = [_request(1), _request((S("batch"),)), _request(2)]
    refusal = cbcl.Message(message_id="m-2", sender=URI("agent://a/b"),
                           receiver=URI("agent://c/d"), intent="REFUSE",
                           protocol=S("request/v1"),
                           body=(S("refuse"), K("action-id"), "rq-1", K("reason"), "busy"))
    messages.insert(2, refusal)
    terms = _set("(a)", "(a)", "(a)", "(a)")
    cost_model.mark_switches([cost_model.shape_of(m) for m in messages], terms)
    # the first follows the last (the set read again): the same shape; then the same
    # shape (the result's value does not matter), another intent, and back
    assert [t.counts["switch"] for t in terms] == [0, 0, 1, 1]
    cost_model.mark_switches([cost_model.shape_of(m) for m in messages[:2]], terms[:2])
    assert [t.counts["switch"] for t in terms[:2]] == [0, 0]
