"""No cliffs (issue 19): the reader's tiers agree on messages with rare atoms mixed in.

A rare atom — an escaped quote, a 19- or 20-digit integer, a long decimal, a non-ASCII
string, \\u escapes, a URI with odd characters, a comment, a string or name at its limit —
is read in place by the C twin (``cbcl._native.read_value``), so a valid message that holds
one is never handed down to the Python reference (``_reader.read_value_python``). The
differential properties: the C twin gives exactly the reference's value, end and node
count, or declines; the public functions raise exactly the reference's errors (message,
position, context); and on valid text within the limits the C twin never declines. The
binary decoder has a C twin too, so messages holding the same rare atoms are also decoded
with and without ``cbcl._native`` and must give the text's values.

Tests internals: the tiers (``cbcl.core._reader``) are private.
"""

from __future__ import annotations

import os
import random
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st
from strategies import values as cbcl_values
from test_reader import outcome, public_reads_agree, same_value

import cbcl
from cbcl import URI, Keyword, Limits, Symbol, Value
from cbcl.core import _reader
from cbcl.core._limits import DEFAULT_LIMITS


def _scanner_tier() -> Any:
    """The C tier as a tier of ``tiers`` (``(text, limits, depth, nodes)``), or ``None``
    where cbcl._native is not built (CI requires it: CBCL_REQUIRE_SPEEDUPS)."""
    if _reader._read_value_c is None:
        if os.environ.get("CBCL_REQUIRE_SPEEDUPS"):
            raise ImportError("cbcl._native is not built")
        return None

    def read(text: str, limits: Limits, depth: int, nodes: int) -> Any:
        return c_read(text, 0, limits, depth, nodes)

    return read


def c_read(text: str, pos: int, limits: Limits, depth: int = 0, nodes: int = 0) -> Any:
    """``cbcl._native.read_value`` called as ``read_value_at`` calls it: the reference's
    ``(value, end, nodes)``, or ``None`` where it leaves the text to them."""
    found = _reader._read_value_c(text, pos, _reader._CACHE, _reader._atom,
                                  limits.max_depth - depth, limits.max_list_items,
                                  limits.max_nodes - nodes, limits.max_string_bytes,
                                  limits.max_name_chars)
    if found is None:
        return None
    value, end, count = found
    return value, end, nodes + count


C_TIER = _scanner_tier()
C_TIERS = [] if C_TIER is None else [C_TIER]


class Raw(str):
    """Text put into a rendered value as it is (a rare atom, or a broken one)."""


# Rare atoms CBCL accepts, written out; each reads as one value.
RARE_GOOD = [
    '"a\\"b"', '"\\""', '"\\\\"', '"\\\\\\""', '"x\\\\\\\\\\"y"', '"\\"\\"\\""', '"q\\\\"',
    '"end\\\\\\\\"', '"\\u00e9\\n\\t\\r\\\\u"', '"\\u0041\\"\\u202E"', '"Größe ✓ 𝄞"',
    '"a;b (c) \\";"', "9223372036854775807", "-9223372036854775808", "1234567890123456789",
    "-999999999999999999", "100000000000000000", "12345678901234567890.5",
    "1." + "0" * 38, "-0." + "1" * 37, "0.000000000000000000000000001",
    "urn-x://dépôt/ü~!$&'*+,=@", "agent://a.b/c?d=e#f", "z://\u00e9\u4e2d",
    ":" + "k" * 40, "s" * 60, "+", "-", "...", "a.b/c-d@e%f&g",
    '"' + "\\n" * 40 + '\\""', '"' + "\\\\" * 40 + '"', '"' + "\\t" * 33 + '"',
]
# Comments, which need a line end unless they end the text (the renderer adds one).
COMMENTS = ["; note", '; say "hi"', "; (not a list) \\", "; \t tab", ";;", '; "', "; é ✓"]
# Broken or over-limit atoms: the C tier must decline, and the reference raise its error.
RARE_BAD = [
    "9223372036854775808", "-9223372036854775809", "1" * 21, "1" * 40, "1." + "0" * 39,
    '"\\q"', '"\\ud800"', '"a\\"', '"\\u12"', '"tab\there"', '"\x01"', "agent://",
    "Agent://x", "a\\b", '"a"b', "é", "\ufeff", "\u2028", "\xa0", "; \x01", '"\\\\\\"',
    "\\", '\\"', "-0", "01", "1.", ".5", "+1",
]
GAPS = [" ", " ", " ", "\n", "  \n\t", "\r\n"]


def render(value: Value | Raw, draw: st.DrawFn) -> str:
    if isinstance(value, Raw):
        if value.startswith(";"):
            return value + draw(st.sampled_from(["\n", "\r\n", "\r"]))
        return str(value)
    if not isinstance(value, tuple):
        return cbcl.canonical(value)
    out = "(" + draw(st.sampled_from(["", "", " ", "\n"]))
    for index, item in enumerate(value):
        if index:
            out += draw(st.sampled_from(GAPS))
        out += render(item, draw)
    return out + draw(st.sampled_from(["", "", " "])) + ")"


def mix(value: Value, draw: st.DrawFn, rare: st.SearchStrategy[str], count: int,
        ) -> Value | Raw:
    """``value`` with ``count`` rare atoms put at random places (in lists)."""
    tree: tuple[Value, ...] = value if isinstance(value, tuple) else (value,)
    for _ in range(count):
        lists = _lists(tree, ())
        path = draw(st.sampled_from(lists))
        tree = _insert(tree, path, draw(st.integers(0, 10)), Raw(draw(rare)))
    return tree


def _lists(value: tuple[Value, ...], path: tuple[int, ...]) -> list[tuple[int, ...]]:
    out = [path]
    for index, item in enumerate(value):
        if isinstance(item, tuple):
            out.extend(_lists(item, (*path, index)))
    return out


def _insert(value: tuple[Value, ...], path: tuple[int, ...], at: int,
            new: Value | Raw) -> tuple[Value, ...]:
    items = list(value)
    if path:
        inner = items[path[0]]
        assert isinstance(inner, tuple), path  # (a path of _lists: lists all the way)
        items[path[0]] = _insert(inner, path[1:], at, new)
    else:
        items.insert(min(at, len(items)), new)
    return tuple(items)


@st.composite
def mixed_texts(draw: st.DrawFn, *, bad: bool) -> str:
    """A plain value with rare atoms mixed in (and, with ``bad``, broken ones)."""
    value = draw(cbcl_values)
    good = st.sampled_from(RARE_GOOD) | st.sampled_from(COMMENTS)
    tree = mix(value, draw, good, draw(st.integers(1, 3)))
    if bad:
        tree = mix(tree, draw, st.sampled_from(RARE_BAD), 1)
    lead = draw(st.sampled_from(["", "", "; lead\n", " \n"]))
    tail = draw(st.sampled_from(["", "", "\n", " ; end", ' ; "end"\n']))
    return lead + render(tree, draw) + tail


def tiers(text: str, limits: Limits, depth: int = 0, nodes: int = 0) -> tuple[object, ...]:
    """Check the C tier (where built) and the public functions against the reference on
    ``text``; return the reference's outcome."""
    careful = outcome(lambda: _reader.read_value_python(text, 0, limits, depth, nodes))
    for tier in C_TIERS:
        found = tier(text, limits, depth, nodes)
        if found is not None:
            assert careful[0] == "ok", (text, careful)
            value, end, count = found
            read_back = careful[1]
            assert isinstance(read_back, tuple), read_back
            expected, expected_end, expected_count = read_back
            assert same_value(value, expected), (text, value, expected)
            assert (end, count) == (expected_end, expected_count), text
    public_reads_agree(text, limits, depth, nodes, careful)
    return careful


LIMITS = st.sampled_from([
    DEFAULT_LIMITS, Limits(max_string_bytes=8, max_name_chars=12),
    Limits(max_depth=3, max_list_items=4, max_nodes=25), Limits(max_name_chars=40)])


@settings(max_examples=400, deadline=None)
@given(text=mixed_texts(bad=False), limits=LIMITS)
def test_tiers_agree_on_rare_atoms(text: str, limits: Limits) -> None:
    tiers(text, limits)


@settings(max_examples=400, deadline=None)
@given(text=mixed_texts(bad=True), limits=LIMITS)
def test_tiers_agree_on_broken_atoms(text: str, limits: Limits) -> None:
    tiers(text, limits)


@settings(max_examples=100, deadline=None)
@given(text=mixed_texts(bad=False), depth=st.integers(0, 2), nodes=st.integers(0, 5))
def test_tiers_agree_inside_a_document(text: str, depth: int, nodes: int) -> None:
    tiers(text, DEFAULT_LIMITS, depth, nodes)


@settings(max_examples=400, deadline=None)
@given(text=mixed_texts(bad=False))
def test_no_tier_gives_up_on_a_rare_atom(text: str) -> None:
    """On valid text within the limits, the first tier reads it: no cliff."""
    careful = tiers(text, DEFAULT_LIMITS)
    assert careful[0] == "ok", careful
    for tier in C_TIERS:
        assert tier(text, DEFAULT_LIMITS, 0, 0) is not None, text


@pytest.mark.parametrize("rare", RARE_GOOD)
def test_each_rare_atom_is_read_in_place(rare: str) -> None:
    text = f'(x :y "z" {rare} 7 (w {rare}))'
    careful = tiers(text, DEFAULT_LIMITS)
    assert careful[0] == "ok"
    for tier in C_TIERS:
        assert tier(text, DEFAULT_LIMITS, 0, 0) is not None


@pytest.mark.parametrize("rare", RARE_BAD)
def test_each_broken_atom_fails_as_the_careful_loop_says(rare: str) -> None:
    for text in (f'(x :y "z" {rare} 7)', f"(x\n ({rare}))", f"({rare}"):
        careful = tiers(text, DEFAULT_LIMITS)
        assert careful[0] == "error", text


@pytest.mark.parametrize("comment", COMMENTS)
def test_comments_are_read_in_place(comment: str) -> None:
    for text in (f"(a {comment}\n b)", f"(a \"s\" {comment}\n)", f"(a){comment}",
                 f"(a (b {comment}\r\n c) \"d\"){comment}\n"):
        assert tiers(text, DEFAULT_LIMITS)[0] == "ok", text
        for tier in C_TIERS:
            assert tier(text, DEFAULT_LIMITS, 0, 0) is not None, text


@pytest.mark.parametrize("at", [18, 19, 20])
def test_long_integers_at_the_range_edges(at: int) -> None:
    for number in (10 ** (at - 1), -(10 ** (at - 2)), 2**63 - 1, -(2**63), 2**63, -(2**63) - 1):
        text = f"(a {number} b)"
        careful = tiers(text, DEFAULT_LIMITS)
        assert (careful[0] == "ok") is (-(2**63) <= number < 2**63)
        # The C tier reads the token in place (or declines on an error only).
        for tier in C_TIERS:
            assert (tier(text, DEFAULT_LIMITS, 0, 0) is None) is (careful[0] == "error")


def test_long_strings_are_measured_in_place() -> None:
    limits = Limits(max_string_bytes=8)
    for s, ok in (("abcdefgh", True), ("abcdefghi", False), ("ééé", True), ("éééé✓", False),
                  ("\\u00e9\\u00e9\\u00e9\\u00e9", True), ("\\u00e9" * 5, False),
                  ('\\"' * 8, True), ('\\"' * 9, False)):
        text = f'(a "{s}" b)'
        careful = tiers(text, limits)
        assert (careful[0] == "ok") is ok, text
        for tier in C_TIERS:
            assert (tier(text, limits, 0, 0) is None) is (not ok)


# --------------------------------------------------------------------------- binary, ±C

REGISTRY_CACHE: list[cbcl.Registry] = []


def _registry() -> cbcl.Registry:
    if not REGISTRY_CACHE:
        from cbcl_bench import find_descriptors, load_registry

        REGISTRY_CACHE.append(load_registry(find_descriptors()))
    return REGISTRY_CACHE[0]


RARE_VALUES: list[Value] = [
    'a"b', '\\"', "Größe ✓ 𝄞", "\x01\n", 2**63 - 1, -(2**63), 1234567890123456789,
    Decimal("12345678901234567890.123456789"), URI("urn-x://dépôt/ü~!$&'*+,=@"),
    Keyword("k" * 40), Symbol("s" * 60)]


@pytest.mark.parametrize("pure_python", [False, True])
def test_binary_decode_reads_rare_atoms_with_and_without_the_extension(
        pure_python: bool) -> None:
    registry = _registry()
    encoder = cbcl.Encoder(registry)
    decoder = cbcl.Decoder(registry, pure_python=pure_python)
    rng = random.Random(19)
    for i in range(60):
        atoms = tuple(rng.sample(RARE_VALUES, 3))
        body = (Symbol("inform-result"), Keyword("action-id"), f"rq-{i}", Keyword("result"),
                (Symbol("r"), *atoms, (Symbol("n"), *atoms)))
        message = cbcl.Message(message_id=f"m-{i}", sender=URI("agent://a/b"),
                               receiver=URI("agent://c/d"), intent="INFORM",
                               protocol=Symbol("request/v1"), body=body)
        text = cbcl.canonical(message)
        from_text = cbcl.parse(text, registry=registry)
        from_binary = decoder.decode(encoder.encode(message))
        assert same_value(from_binary.body, from_text.body)
