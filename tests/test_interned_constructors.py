"""``Symbol(name)`` and ``Keyword(name)`` return the interned object of a name the reader's
intern tables hold (cbcl.core._values.SYMBOL_TABLE, KEYWORD_TABLE), so a message built in Python
holds the objects the encoders' tables are keyed by; they give what the checked
construction gives otherwise - the same value, or the same ValueError - and never add a
name to the tables.

Tests internals too: the intern tables (``cbcl.core._values``, ``_reader``)."""

from __future__ import annotations

from typing import Any

import pytest
from cbcl_bench import find_descriptors, load_registry, varied
from hypothesis import given, settings, strategies as st

import cbcl
from cbcl import Keyword, Symbol
from cbcl.core import _reader
from cbcl.core._values import KEYWORD_TABLE, SYMBOL_TABLE, is_name
from cbcl.core._vocabulary import NAME_RE

REGISTRY = load_registry(find_descriptors())  # (its grammars' literals: pinned)


def checked(kind: type, name: object) -> Any:
    """What the constructor gave before it looked in the tables: a new, checked atom."""
    try:
        if kind is Keyword and isinstance(name, str) and name.startswith(":"):
            name = name[1:]
        valid = isinstance(name, str) and (
            is_name(name) if kind is Symbol else NAME_RE.match(name) is not None)
        return str.__new__(kind, name) if valid else ValueError
    except TypeError:
        return ValueError


def made(kind: type, name: object) -> Any:
    try:
        return kind(name)
    except ValueError:
        return ValueError


def test_the_tables_are_the_readers() -> None:
    assert _reader._SYMBOLS is SYMBOL_TABLE and _reader._KEYWORDS is KEYWORD_TABLE


def test_a_grammar_literal_is_the_interned_object() -> None:
    for name in ("task", "PROPOSE"):  # (pinned: no emptying of the table drops them)
        assert name in SYMBOL_TABLE
        assert Symbol(name) is SYMBOL_TABLE[name] is _reader.intern_symbol(name)
    # A name interned since the table was last emptied (another test in this process may
    # have emptied it: a protocol id is not pinned)
    interned = _reader.intern_symbol("request/v1")
    assert Symbol("request/v1") is SYMBOL_TABLE["request/v1"] is interned
    assert "id" in KEYWORD_TABLE
    assert Keyword("id") is Keyword(":id") is KEYWORD_TABLE["id"]


def test_a_name_not_interned_is_made_and_not_added() -> None:
    before = (len(SYMBOL_TABLE), len(KEYWORD_TABLE))
    symbol, keyword = Symbol("never-interned-name-1"), Keyword(":never-interned-name-2")
    assert (type(symbol), str(symbol)) == (Symbol, "never-interned-name-1")
    assert (type(keyword), str(keyword)) == (Keyword, "never-interned-name-2")
    assert (len(SYMBOL_TABLE), len(KEYWORD_TABLE)) == before
    assert "never-interned-name-1" not in SYMBOL_TABLE


def test_subclasses_and_str_subclasses_are_not_given_an_interned_object() -> None:
    class Mine(Symbol):
        pass

    class Liar(str):  # equal to every str, with the hash of "task"
        def __eq__(self, other: object) -> bool:
            return True

        def __hash__(self) -> int:
            return hash("task")

    mine = Mine("task")
    assert type(mine) is Mine and mine is not SYMBOL_TABLE["task"]
    liar = Symbol(Liar("zzz"))  # checked as the name it is, never found as "task"
    assert type(liar) is Symbol and str.__str__(liar) == "zzz"
    assert type(Keyword(Liar("id"))) is Keyword


@pytest.mark.parametrize("name", [None, 12, b"task", ["task"], "", "1.5", "-3", "a b",
                                  ":", "::id", "task\n", "(x)"])
def test_what_is_not_a_name_is_refused_as_before(name: object) -> None:
    for kind in (Symbol, Keyword):
        assert made(kind, name) == checked(kind, name)


def interned_or_any() -> st.SearchStrategy[str]:
    names = sorted(SYMBOL_TABLE) + sorted(":" + k for k in KEYWORD_TABLE) + \
        sorted(KEYWORD_TABLE)
    return st.sampled_from(names) | st.text(max_size=12) | st.from_regex(
        r"[:]?[a-zA-Z0-9*+!?<>=/_.-]{1,10}", fullmatch=True)


@settings(max_examples=500, deadline=None)
@given(name=interned_or_any())
def test_the_same_value_or_refusal_as_the_checked_construction(name: str) -> None:
    for kind in (Symbol, Keyword):
        found, expected = made(kind, name), checked(kind, name)
        assert found == expected
        assert type(found) is type(expected)


def test_every_interned_name_is_valid() -> None:
    """The tables hold only valid names, so a name found needs no check (after loading the
    shipped protocols and reading and decoding varied messages of each)."""
    encoder = cbcl.Encoder(REGISTRY, validate=False)
    for protocol in ("request-v1", "contract-net-v1", "canon-a-v1", "task-assignment-v1"):
        for message in varied(protocol, "small", 20, seed=3):
            cbcl.parse(message.canonical().encode(), registry=REGISTRY)
            cbcl.decode(encoder.encode(message), registry=REGISTRY)
    assert all(is_name(name) for name in SYMBOL_TABLE)
    assert all(NAME_RE.match(name) for name in KEYWORD_TABLE)


def test_a_message_built_in_python_encodes_as_one_read() -> None:
    """Its atoms are the interned objects, as a message read from text has them."""
    encoder = cbcl.Encoder(REGISTRY, validate=False)
    for message in varied("task-assignment-v1", "small", 30, seed=4):
        read = cbcl.parse(message.canonical().encode(), registry=REGISTRY)
        assert encoder.encode(message) == encoder.encode(read)
        assert message.protocol is read.protocol is SYMBOL_TABLE[str(read.protocol)]
