"""Every limit of draft §1.1: exactly the limit is accepted, one more is refused, and hostile
inputs are refused before the work the limit protects."""

from __future__ import annotations

import time

import pytest

import cbcl
from cbcl import LimitError, Limits

ENVELOPE = ('(CBCL/1.0 (message-id "m") (sender agent://a) (receiver agent://b) '
            "(intent INFORM) (protocol p) (body {}))")


def refused(text: str | bytes, limit: str, limits: Limits | None = None) -> LimitError:
    with pytest.raises(LimitError) as info:
        cbcl.read(text, limits=limits)
    assert info.value.limit == limit
    assert info.value.exit_code == 4
    return info.value


def test_defaults_are_the_drafts() -> None:
    limits = Limits()
    assert limits.max_message_bytes == 1024 * 1024
    assert limits.max_depth == 64
    assert limits.max_list_items == 4096
    assert limits.max_nodes == 65536
    assert limits.max_string_bytes == 64 * 1024
    assert limits.max_name_chars == 128


@pytest.mark.parametrize("bad", [0, -1, 1.5, "3", True, None])
def test_limits_must_be_positive_ints(bad: object) -> None:
    with pytest.raises((TypeError, ValueError)):
        Limits(max_depth=bad)  # type: ignore[arg-type]


def test_message_bytes_boundary() -> None:
    limits = Limits(max_message_bytes=10)
    assert cbcl.read(b'"12345678"', limits=limits) == "12345678"
    refused(b'"123456789"', "max_message_bytes", limits)
    # Counted in UTF-8 bytes, for str input too.
    assert cbcl.read('"éééé"', limits=limits) == "éééé"  # 10 bytes
    refused('"ééééé"', "max_message_bytes", limits)


def test_depth_boundary_for_values() -> None:
    limits = Limits(max_depth=64)
    assert cbcl.read("(" * 64 + ")" * 64, limits=limits) is not None
    error = refused("(" * 65 + ")" * 65, "max_depth", limits)
    assert error.column == 65


def test_depth_counts_the_envelope() -> None:
    # The envelope is depth 2 with an atom body: (CBCL/1.0 … (body x)).
    limits = Limits(max_depth=2)
    parsed = cbcl.parse(ENVELOPE.format("x"), limits=limits, envelope_only=True)
    assert parsed.body == cbcl.Symbol("x")
    with pytest.raises(LimitError):
        cbcl.parse(ENVELOPE.format("()"), limits=limits, envelope_only=True)
    limits = Limits(max_depth=64)
    deepest = "(" * 62 + ")" * 62
    assert cbcl.parse(ENVELOPE.format(deepest), limits=limits, envelope_only=True)
    with pytest.raises(LimitError):
        cbcl.parse(ENVELOPE.format("(" + deepest + ")"), limits=limits, envelope_only=True)


def test_list_items_boundary() -> None:
    limits = Limits(max_list_items=5)
    assert len(cbcl.read("(1 2 3 4 5)", limits=limits)) == 5  # type: ignore[arg-type]
    refused("(1 2 3 4 5 6)", "max_list_items", limits)
    assert len(cbcl.read("(1 2 3 4 (5))", limits=limits)) == 5  # type: ignore[arg-type]
    refused("(1 2 3 4 5 ())", "max_list_items", limits)


def test_nodes_boundary() -> None:
    limits = Limits(max_nodes=4)  # a list and three atoms
    assert cbcl.read("(a b c)", limits=limits)
    refused("(a b c d)", "max_nodes", limits)
    assert cbcl.read("(a (b))", limits=limits)
    refused("(a (b) ())", "max_nodes", limits)


def test_nodes_count_the_whole_message() -> None:
    # envelope: 1 list + CBCL/1.0 + 6 fields x (list + 2 atoms) + body list + body atom
    base = 1 + 1 + 5 * 3 + 2
    limits = Limits(max_nodes=base + 1)
    assert cbcl.parse(ENVELOPE.format("x"), limits=limits, envelope_only=True)
    with pytest.raises(LimitError):
        cbcl.parse(ENVELOPE.format("(x)"), limits=limits, envelope_only=True)


def test_string_bytes_boundary() -> None:
    limits = Limits(max_string_bytes=8)
    assert cbcl.read('"12345678"', limits=limits) == "12345678"
    refused('"123456789"', "max_string_bytes", limits)
    # UTF-8 bytes after unescaping.
    assert cbcl.read('"éééé"', limits=limits) == "éééé"
    refused('"ééééa"', "max_string_bytes", limits)
    assert cbcl.read('"\\u0041\\u0041\\u0041\\u0041\\u0041\\u0041\\u0041\\u0041"',
                     limits=limits) == "A" * 8
    refused('"' + "\\u00e9" * 5 + '"', "max_string_bytes", limits)


def test_name_chars_boundary() -> None:
    limits = Limits(max_name_chars=128)
    assert cbcl.read("a" * 128, limits=limits)
    refused("a" * 129, "max_name_chars", limits)
    assert cbcl.read(":" + "k" * 128, limits=limits)  # the colon does not count
    refused(":" + "k" * 129, "max_name_chars", limits)


@pytest.mark.parametrize(
    ("make", "limit"),
    [
        (lambda: "(" * 100_000, "max_depth"),
        (lambda: "(" * 100_000 + ")" * 100_000, "max_depth"),
        (lambda: '"' + "x" * (10 * 1024 * 1024) + '"', "max_message_bytes"),
        (lambda: b"(" + b"a " * (6 * 1024 * 1024), "max_message_bytes"),
        (lambda: "(" + "a " * 5000 + ")", "max_list_items"),
        (lambda: "(" + "(a a a a a a a a a a a a a a a a) " * 4000 + ")", "max_nodes"),
        (lambda: '"' + "x" * 70_000 + '"', "max_string_bytes"),
        (lambda: "a" * 500_000, "max_name_chars"),
    ],
)
def test_hostile_inputs_are_refused_quickly(make, limit: str) -> None:  # type: ignore[no-untyped-def]
    data = make()
    started = time.process_time()
    refused(data, limit)
    assert time.process_time() - started < 1.0


def test_raised_limits_let_big_strings_through_and_still_refuse_bigger() -> None:
    limits = Limits(max_message_bytes=20 << 20, max_string_bytes=10 << 20)
    big = "x" * (10 << 20)
    assert cbcl.read('"' + big + '"', limits=limits) == big
    refused('"' + big + 'y"', "max_string_bytes", limits)


def test_item_limit_applies_to_the_envelope_itself() -> None:
    text = ENVELOPE.format("x")  # the envelope list holds 7 items
    assert cbcl.parse(text, limits=Limits(max_list_items=7), envelope_only=True)
    with pytest.raises(LimitError) as info:
        cbcl.parse(text, limits=Limits(max_list_items=6), envelope_only=True)
    assert info.value.limit == "max_list_items"
    assert text[info.value.column - 1 :].startswith("(body")  # type: ignore[operator]


def test_limits_hash_as_they_compare() -> None:
    import dataclasses

    assert hash(Limits()) == hash(Limits()) and Limits() == Limits()
    changed = dataclasses.replace(Limits(), max_depth=5)
    assert changed == Limits(max_depth=5) and hash(changed) == hash(Limits(max_depth=5))
    assert changed != Limits()
    assert len({Limits(), Limits(), Limits(max_nodes=9)}) == 2


def test_intents_hash_as_the_text_they_equal() -> None:
    from cbcl import Intent

    for intent in Intent:
        assert intent == intent.value and hash(intent) == hash(intent.value)
    by_text: dict[str, int] = {Intent.NOT_UNDERSTOOD: 1}  # (an Intent is a str)
    assert by_text.get("NOT-UNDERSTOOD") == 1
