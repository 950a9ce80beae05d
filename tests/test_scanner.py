"""The C twin of the text reader (``cbcl._native.read_value``).

It is held to the Python reference (``read_value_python``) on every text: where it
reads a value, the value (types and decimal texts included), the end and the node count
are the reference's; where it gives up, the reference raises, so it gives up on no
valid text (no cliff) but one: a text that is not ASCII, after its start.
``tests/test_reader_tiers.py`` runs it as one more tier on the rare atoms; here it meets
arbitrary text, every start position, the limits at N and N+1, and text that is not
ASCII (its indexes are characters, its scan bytes).

Tests internals: the C twin and the careful loop are private.

Tests internals: the C twin and the careful loop are private.
"""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st
from test_reader import outcome, same_value
from test_reader_tiers import C_TIER, c_read, mixed_texts

import cbcl
from cbcl import LimitError, Limits
from cbcl.core import _reader
from cbcl.core._limits import DEFAULT_LIMITS

pytestmark = pytest.mark.skipif(C_TIER is None, reason="cbcl._native is not built here")


def agree(text: str, pos: int = 0, limits: Limits = DEFAULT_LIMITS, depth: int = 0,
          nodes: int = 0) -> Any:
    """Check the C tier against the reference at ``pos``; return what C read."""
    careful = outcome(lambda: _reader.read_value_python(text, pos, limits, depth, nodes))
    found = c_read(text, pos, limits, depth, nodes)
    if found is None:  # (a text that is not ASCII is read from its start only)
        assert careful[0] == "error" or (pos and not text.isascii()), (text, pos, careful)
        return None
    assert careful[0] == "ok", (text, pos, found, careful)
    value, end, count = found
    read_back = careful[1]
    assert isinstance(read_back, tuple), read_back
    expected, expected_end, expected_count = read_back
    assert same_value(value, expected), (text, value, expected)
    assert (end, count) == (expected_end, expected_count), (text, pos)
    return found


# Pieces of CBCL text, good and broken, so random text is mostly near the grammar.
PIECES = st.sampled_from([
    "(", ")", " ", "\n", "\r\n", "\t", "a", "b-c", ":k", ":", "x://y", "agent://é/ü",
    '"', '"s"', '"\\""', '"\\\\"', '"\\u00e9"', '"\\ud800"', '"\\q"', "\\", "0", "-0", "12",
    "-7", "9223372036854775807", "9223372036854775808", "-9223372036854775808", "1.5",
    "-0.25", "00", "1.", ".5", "; c\n", ";", "é", "✓", "𝄞", "\x00", "\x0b", "\x85", "\u2028",
    "\u202e", "\ufeff", "\xa0", "+", "-", "->", "...",
])
TEXTS = st.lists(PIECES | st.text(max_size=3), max_size=40).map("".join)
LIMITS = st.builds(Limits, max_depth=st.integers(1, 6), max_list_items=st.integers(1, 6),
                   max_nodes=st.integers(1, 30), max_string_bytes=st.integers(1, 12),
                   max_name_chars=st.integers(1, 12)) | st.just(DEFAULT_LIMITS)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: cbcl.parse's decode refuses it first
        return False
    return True


@settings(max_examples=1500, deadline=None)
@given(text=TEXTS, limits=LIMITS, data=st.data())
def test_agrees_with_the_careful_loop_on_any_text(text: str, limits: Limits,
                                                  data: st.DataObject) -> None:
    if not _encodable(text):
        return
    pos = data.draw(st.integers(0, len(text)))
    depth = data.draw(st.integers(0, 2))
    nodes = data.draw(st.integers(0, 3))
    agree(text, pos, limits, depth, nodes)


@settings(max_examples=300, deadline=None)
@given(text=mixed_texts(bad=False))
def test_reads_valid_text_with_rare_atoms(text: str) -> None:
    assert agree(text) is not None, text


@settings(max_examples=300, deadline=None)
@given(text=mixed_texts(bad=True), limits=LIMITS)
def test_agrees_on_broken_text(text: str, limits: Limits) -> None:
    agree(text, 0, limits)


def test_indexes_are_characters_in_text_that_is_not_ascii() -> None:
    good = '(k "Größe ✓ 𝄞" z://ü) "é"'
    value, end, _ = agree(good, 0)
    assert good[end:] == ' "é"'
    assert value[1] == "Größe ✓ 𝄞"
    assert agree('(k "Größe ✓ 𝄞" z://ü :é-no x) tail') is None  # (:é-no is no keyword)


@pytest.mark.parametrize("prefix", ['"é"', '"𝄞✓" ', '(a "ü") '])
def test_text_that_is_not_ascii_is_read_from_its_start_only(prefix: str) -> None:
    """Finding a later character in the UTF-8 costs its index: a text that is not ASCII
    is left to the reference after its start, so that reading value after value (as
    read_all and the error paths do) stays linear; an ASCII one is read anywhere."""
    text = prefix + '(k "x") (y)'
    assert c_read(text, len(prefix), DEFAULT_LIMITS) is None
    assert [str(v[0]) for v in cbcl.read_all(text)[-2:] if isinstance(v, tuple)] == ["k", "y"]
    ascii_text = '(a "b") (k "x") (y)'
    assert agree(ascii_text, 8) is not None


def _reads(text: str, limits: Limits) -> bool:
    return agree(text, 0, limits) is not None


def test_depth_at_the_limit_and_over() -> None:
    limits = Limits(max_depth=4)
    assert _reads("((((a))))", limits)
    assert not _reads("(((((a)))))", limits)
    assert agree("a", 0, limits, depth=4) is not None  # an atom opens no list


def test_items_at_the_limit_and_over() -> None:
    limits = Limits(max_list_items=3)
    assert _reads("(a b c)", limits)
    assert not _reads("(a b c d)", limits)


def test_nodes_at_the_limit_and_over() -> None:
    limits = Limits(max_nodes=4)
    assert _reads("(a (b))", limits)  # two lists, two atoms
    assert not _reads("(a (b c))", limits)
    assert agree("(a b)", 0, limits, nodes=1) is not None
    assert agree("(a b c)", 0, limits, nodes=1) is None


def test_string_bytes_at_the_limit_and_over() -> None:
    limits = Limits(max_string_bytes=6)
    for s, ok in (("abcdef", True), ("abcdefg", False), ("ééé", True), ("éééa", False),
                  ("\\u00e9\\u00e9\\u00e9", True), ("✓✓", True), ("✓✓a", False),
                  ("\\n" * 6, True), ("\\n" * 7, False)):
        assert _reads(f'(a "{s}")', limits) is ok, s


def test_names_at_the_limit_and_over() -> None:
    limits = Limits(max_name_chars=5)
    assert _reads("(abcde :abcde)", limits)
    assert not _reads("(abcdef)", limits)
    assert not _reads("(:abcdef)", limits)
    assert _reads("(x://abcdefghij 123456789 1.23456)", limits)  # no name limit on these


def test_integers_and_decimals_at_their_edges() -> None:
    for text, ok in (("9223372036854775807", True), ("-9223372036854775808", True),
                     ("9223372036854775808", False), ("-9223372036854775809", False),
                     ("99999999999999999999999", False), ("0", True), ("-0", False),
                     ("007", False), ("-0.5", True), ("1." + "0" * 38, True),
                     ("1." + "0" * 39, False), ("12.", False), ("1.2.3", False)):
        assert (agree(f"(n {text})") is not None) is ok, text
    value = agree("(n 1.50 -0.000 12345.678)")[0]
    assert [str(v) for v in value[1:]] == ["1.50", "-0.000", "12345.678"]
    assert all(type(v) is Decimal for v in value[1:])


def test_atoms_are_the_interned_ones() -> None:
    # Names no earlier test read: the memos (pure, spec §1.1) may still hold atoms of a
    # common name made before the intern table last reached its bound and was cleared,
    # so identity with today's table is a property of names read since.
    name = f"sym-{uuid.uuid4().hex}"
    value = agree(f"({name} :kw-{name} {name})")[0]
    assert value[0] is value[2] is _reader.intern_symbol(name)
    assert value[1] is _reader.intern_keyword(f"kw-{name}")


def test_comments_and_whitespace() -> None:
    for text in ("; a comment\n(a)", "(a ; \"quoted\" (not a list)\n b)", "(a\r\n\tb)",
                 "(a ; é ✓ \t\n)", "(a) ; trailing"):
        assert agree(text) is not None, text
    for text in ("(a ; stop\x01 b)", "(a ;\u2028b)", "(a\x0bb)", "(a\xa0b)", "(a\ufeff)"):
        assert agree(text) is None, text


def test_public_read_goes_through_the_c_tier() -> None:
    """cbcl.read, cbcl.parse: the C tier reads first (a wrong answer here would show)."""
    text = '(x "a\\"b" 1234567890123456789 :k)'
    assert c_read(text, 0, DEFAULT_LIMITS) is not None
    assert same_value(cbcl.read(text), _reader.read_value_python(text, 0, DEFAULT_LIMITS, 0, 0)[0])


def test_a_cached_keyword_holding_a_uri_separator_keeps_its_name_limit() -> None:
    """Found by tests/fuzz/fuzz_scanner.py: ``://x`` is a keyword (``//x``), which the
    token cache may hold from a document read under a larger limit; its name is over a
    limit of 1 however it reads "://"."""
    cbcl.read("(://x)")  # cached
    limits = Limits(max_name_chars=1)
    assert agree("(://x)", 0, limits) is None
    with pytest.raises(LimitError):
        cbcl.read("(://x)", limits=limits)
    assert agree("(a://x)", 0, limits) is not None  # a URI: no name limit


def test_what_it_reads_is_left_out_of_the_cyclic_collector() -> None:
    """Tuples of atoms and of such tuples can be in no reference cycle: the C tier
    untracks them as it builds them (as the collector would at its first pass), so that a
    large body sets off no collection that walks it."""
    import gc

    value, _, _ = c_read('(a (b "s" 1 2.5 x://y (:k)) ())', 0, DEFAULT_LIMITS)
    assert not gc.is_tracked(value)
    assert not gc.is_tracked(value[1]) and not gc.is_tracked(value[1][5])
    assert gc.is_tracked((value, [1]))  # (a tuple holding a list stays tracked)


def test_the_token_memo_gives_the_cached_atom_for_every_token() -> None:
    """Many different tokens share the memo's slots: each still reads as its own atom,
    the interned one."""
    names = [f"n{i}" for i in range(6000)]
    text = "(" + " ".join(names) + " " + " ".join(f"u://{i}" for i in range(3000)) + ")"
    for _ in range(2):
        value, _, _ = c_read(text, 0, Limits(max_list_items=10000))
        assert [str(v) for v in value[:6000]] == names
        assert all(type(v) is cbcl.Symbol for v in value[:6000])
        assert all(type(v) is cbcl.URI and str(v) == f"u://{i}" for i, v in enumerate(value[6000:]))
    # A pinned name (a grammar's literal) is one object for good; another may be an older
    # object after the intern table is emptied (equal: identity only saves time).
    pinned = _reader.intern_symbol("n5-pinned", pin=True)
    assert c_read("(n5-pinned)", 0, DEFAULT_LIMITS)[0][0] is pinned


def test_the_bytes_a_text_was_decoded_from_are_read_as_the_text() -> None:
    """Given the UTF-8 a text that is not ASCII was decoded from, the C tier reads it
    rather than encoding the text again, to the same value; cbcl.parse and cbcl.read pass
    it along."""
    text = '(k "Größe ✓ 𝄞" z://ü-é "x")'
    plain = c_read(text, 0, DEFAULT_LIMITS)
    assert plain is not None
    given = _reader._read_value_c(text, 0, _reader._CACHE, _reader._atom, 64, 4096, 65536,
                                  65536, 128, text.encode())
    assert given is not None and same_value(given[0], plain[0]) and given[1:] == plain[1:]
    assert same_value(cbcl.read(text.encode()), plain[0])
    with pytest.raises(TypeError):
        _reader._read_value_c(text, 0, _reader._CACHE, _reader._atom, 64, 4096, 65536, 65536,
                              128, bytearray(text.encode()))


def test_the_fuzz_harness_runs_on_random_inputs() -> None:
    """tests/fuzz/fuzz_scanner.py's own check, on its seeds and 800 random and mutated
    inputs (what asan_build.sh runs under the sanitizers, shorter)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parent / "fuzz" / "fuzz_scanner.py"
    spec = importlib.util.spec_from_file_location("fuzz_scanner", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main([str(path), "--random", "800"]) == 0
