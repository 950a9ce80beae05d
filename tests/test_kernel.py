"""The recognition kernel, the vocabulary and the budget: the pieces every tier shares.

Tests internals: the kernel, the vocabulary and the budget are private."""

from __future__ import annotations

from typing import Any

import pytest

from cbcl import LimitError, Limits
from cbcl.binary import _codec
from cbcl.core import _vocabulary
from cbcl.core._limits import WORDING, Budget, limit_message
from cbcl.core._values import (  # type: ignore[attr-defined]  # (not re-exported: checked)
    _NAME_RE,
    _URI_RE,
    is_name,
)
from cbcl.grammar import _kernel
from cbcl.protocol._envelope import envelope_tables

_WORDS = ["a", "PROPOSE", "-", "+", "-a", "-1", "+.5", ".5", ".a", "a.b", "a@b", "@a", "1a",
          "é", "a b", "", "x" * 300, "task-assignment/v1", "<=", "a:b"]


@pytest.mark.parametrize("word", _WORDS)
def test_the_vocabulary_agrees_with_the_value_model(word: str) -> None:
    # cbcl.core._values takes its patterns from the vocabulary: one definition, one answer.
    assert _NAME_RE is _vocabulary.NAME_RE and _URI_RE is _vocabulary.URI_RE
    assert (_vocabulary.NAME_RE.match(word) is not None) == (_NAME_RE.match(word) is not None)
    assert (_vocabulary.SYMBOL_RE.match(word) is not None) == is_name(word)
    uri = f"agent://{word}"
    assert (_vocabulary.URI_RE.match(uri) is not None) == (_URI_RE.match(uri) is not None)


@pytest.mark.parametrize("text, decimal", [("1.5", True), ("-0.25", True), ("0.0", True),
                                           ("01.5", False), ("1.", False), (".5", False),
                                           ("-1", False), ("1.5e3", False), ("+1.5", False)])
def test_the_decimal_pattern(text: str, decimal: bool) -> None:
    assert (_vocabulary.DECIMAL_RE.match(text) is not None) is decimal
    assert _vocabulary.NUMBER_RE.match(text) is not None or not decimal


def test_binary_codes_are_the_vocabulary() -> None:
    codes = (_codec.LPAR, _codec.RPAR, _codec.INTEGER, _codec.DECIMAL, _codec.SYMBOL,
             _codec.KEYWORD, _codec.URI_CODE)
    assert codes == tuple(range(7))  # spec/binary.md, and the enum of cbcl/_native_src/speedups.c
    # (FIRST_ENTRY: the codec's import from the vocabulary, checked here; not re-exported)
    assert _codec.FIRST_ENTRY == _vocabulary.FIRST_ENTRY == 7  # type: ignore[attr-defined]


def test_the_speedups_probe_tells_a_disagreeing_twin() -> None:
    # The probe the codec runs when it loads cbcl._native: agreeing twins pass, a twin
    # that reads the known body otherwise (a shifted C enum would) fails.
    assert _codec._speedups_agree(_codec._fast_body_loop, _python_unpack)

    def shifted(tokens: list[Any], *args: Any) -> Any:
        swapped = [_codec.SYMBOL if t == _codec.DECIMAL and type(t) is int else t
                   for t in tokens]
        return _codec._fast_body_loop(swapped, *args)

    assert not _codec._speedups_agree(shifted, _python_unpack)
    assert not _codec._speedups_agree(_codec._fast_body_loop, lambda data, start: None)


def _python_unpack(data: bytes, start: int) -> list[Any]:
    import msgpack

    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(data[start:])
    return list(unpacker)


def test_one_wording_per_limit() -> None:
    assert set(WORDING) == {"max_message_bytes", "max_depth", "max_list_items", "max_nodes",
                            "max_string_bytes", "max_name_chars"}
    assert limit_message("max_depth", 3) == "lists nested more than 3 deep"
    assert limit_message("max_name_chars", 5) == "symbol longer than 5 characters"
    assert limit_message("max_name_chars", 5, "keyword") == "keyword longer than 5 characters"
    assert limit_message("max_message_bytes", 9, "frame") == "frame exceeds the limit of 9 bytes"
    with pytest.raises(LimitError) as caught:
        Budget(Limits(max_nodes=4), lambda index: (None, f"at {index}")).exceeded("max_nodes", 7)
    error = caught.value
    assert (str(error).startswith("more than 4 nodes in one document"), error.limit,
            error.maximum, error.context) == (True, "max_nodes", 4, "at 7")


def test_the_kernel_drives_the_envelope_tables() -> None:
    tables = envelope_tables()
    stack = [tables.start_state]
    assert _kernel.feed(tables, stack, "LPAR") == _kernel.SHIFTED
    assert _kernel.terminal_of(tables, stack, "VERSION", "SYMBOL") == "VERSION"
    assert _kernel.expected(tables, stack) == ["VERSION"]
    before = list(stack)
    assert _kernel.feed(tables, stack, "RPAR") == _kernel.REFUSED
    assert stack == before
    assert _kernel.terminal_of(tables, stack, "SENDER", "SYMBOL") == "SYMBOL"
