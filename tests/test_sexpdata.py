"""Differential test against sexpdata on the subset both read: lists, strings, integers
and symbols."""

from __future__ import annotations

import sexpdata
from hypothesis import given, strategies as st
from strategies import integers, symbols

import cbcl
from cbcl import Symbol

# sexpdata reads a narrower set of strings and symbols: plain printable ASCII without
# quotes or backslashes, and symbols that it does not treat as numbers or quote forms.
plain_strings = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E,
                                               blacklist_characters='"\\'), max_size=20)
def _a_float_to_python(text: str) -> bool:
    try:
        float(text)  # (sexpdata reads what float() takes as a number: "nAN", "inf", …)
    except ValueError:
        return False
    return True


plain_symbols = symbols.filter(lambda s: not s.startswith((".", "+", "-")) and s != "nil"
                               and s not in ("t", "true", "false")
                               and not _a_float_to_python(s))
shared_values = st.recursive(
    st.one_of(plain_strings, integers, plain_symbols),
    lambda children: st.lists(children, max_size=5).map(tuple),
    max_leaves=30,
).filter(lambda v: isinstance(v, tuple))


def from_sexpdata(value: object) -> object:
    if isinstance(value, list):
        return tuple(from_sexpdata(item) for item in value)
    if isinstance(value, sexpdata.Symbol):
        return Symbol(value.value())
    return value


@given(shared_values)
def test_same_values_as_sexpdata(value: tuple) -> None:  # type: ignore[type-arg]
    text = cbcl.canonical(value)
    ours = cbcl.read(text)
    theirs = from_sexpdata(sexpdata.loads(text, true=None, false=None, nil=None))
    assert ours == theirs == value


def test_the_shipped_example_reads_alike_on_the_shared_subset() -> None:
    text = '(task "t-1" (compute bfs 2 4096) (x (y (z "deep"))))'
    assert cbcl.read(text) == from_sexpdata(sexpdata.loads(text))
