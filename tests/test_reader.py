"""The text syntax of draft §1: every rule, and every refusal with its position.

Tests internals too: the reader's tiers (``cbcl.core._reader``), held to its careful loop."""

from __future__ import annotations

import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st
from strategies import values as cbcl_values

import cbcl
from cbcl import URI, Keyword, LimitError, Limits, MalformedError, Symbol, Value
from cbcl.core import _reader
from cbcl.core._limits import DEFAULT_LIMITS
from cbcl.core._reader import read_value_at


def err(text: str | bytes) -> MalformedError:
    with pytest.raises(MalformedError) as info:
        cbcl.read(text)
    return info.value


# --------------------------------------------------------------------------- atoms


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ('""', ""),
        ('"hello"', "hello"),
        ('"a\\"b"', 'a"b'),
        ('"a\\\\b"', "a\\b"),
        ('"\\n\\r\\t"', "\n\r\t"),
        ('"\\u00e9\\u0041"', "éA"),
        ('"\\u0000"', "\x00"),
        ('"\\u202E"', "\u202e"),  # escaped bidi control: allowed as data
        ('"ümlaut ✓ 𝄞"', "ümlaut ✓ 𝄞"),
        ('"semi;colon (paren)"', "semi;colon (paren)"),
    ],
)
def test_strings(text: str, value: str) -> None:
    result = cbcl.read(text)
    assert type(result) is str
    assert result == value


@pytest.mark.parametrize(
    ("text", "column", "fragment"),
    [
        ('"a\\q"', 3, "invalid escape"),
        ('"a\\x41"', 3, "invalid escape"),
        ('"\\u12"', 2, "four hex digits"),
        ('"\\uZZZZ"', 2, "four hex digits"),
        ('"\\ud800"', 2, "surrogate"),
        ('"\\uDFFF"', 2, "surrogate"),
        ('"a\x01"', 3, "control"),
        ('"a\nb"', None, "control"),
        ('"\x7f"', 2, "control"),
        ('"\x85"', 2, "control"),
        ('"\u202e"', 2, "bidirectional"),
        ('"\u2066"', 2, "bidirectional"),
        ('"abc', 1, "unterminated"),
        ('"a"b', 4, "whitespace, '(', ')' or ';'"),
        ('"a""b"', 4, "whitespace, '(', ')' or ';'"),
    ],
)
def test_string_refusals(text: str, column: int | None, fragment: str) -> None:
    error = err(text)
    assert fragment in error.message
    if column is not None:
        assert (error.line, error.column) == (1, column)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("7", 7),
        ("-7", -7),
        ("9223372036854775807", 2**63 - 1),
        ("-9223372036854775808", -(2**63)),
    ],
)
def test_integers(text: str, value: int) -> None:
    result = cbcl.read(text)
    assert type(result) is int
    assert result == value


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("9223372036854775808", "64-bit"),
        ("-9223372036854775809", "64-bit"),
        ("1" * 5000, "64-bit"),  # never reaches int(): Python refuses over 4300 digits
        ("007", "leading zeros"),
        ("-01", "leading zeros"),
        ("+5", "'+'"),
        ("-0", "-0"),
        ("1e5", "malformed number"),
        ("1.5e3", "malformed number"),
        ("0x10", "malformed number"),
        ("12abc", "malformed number"),
    ],
)
def test_integer_refusals(text: str, fragment: str) -> None:
    error = err(text)
    assert fragment in error.message
    assert (error.line, error.column, error.offset) == (1, 1, 0)


@pytest.mark.parametrize("text", ["0.0", "-0.0", "1.50", "-12.000", "3.14159", "0.1"])
def test_decimals_are_exact_and_keep_their_text(text: str) -> None:
    result = cbcl.read(text)
    assert type(result) is Decimal
    assert str(result) == text
    assert cbcl.canonical(result) == text


def test_decimal_length_boundary() -> None:
    forty = "1." + "0" * 38
    assert len(forty) == 40
    assert cbcl.read(forty) == Decimal(forty)
    assert "40 characters" in err(forty + "0").message


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("1.", "digits after"), (".5", "digits before"), ("-.5", "digits before"),
     ("1.2.3", "malformed number"), ("NaN", None), ("Infinity", None)],
)
def test_decimal_refusals(text: str, fragment: str | None) -> None:
    if fragment is None:  # NaN and Infinity are ordinary symbols, not numbers
        assert cbcl.read(text) == Symbol(text)
        return
    assert fragment in err(text).message


@pytest.mark.parametrize(
    "text",
    ["PROPOSE", "bfs", "task-assignment/v1", "CBCL/1.0", "+", "-", "*", "/", "<=", "!=",
     "?x", "_private", ".hidden", "...", "a@b%c&d", "-a", "+a", "x1", "A" * 128],
)
def test_symbols(text: str) -> None:
    result = cbcl.read(text)
    assert type(result) is Symbol
    assert result == Symbol(text)
    assert cbcl.canonical(result) == text


def test_case_is_preserved_and_significant() -> None:
    assert cbcl.read("Task") != cbcl.read("task")
    assert cbcl.read("Task") == Symbol("Task")


@pytest.mark.parametrize(
    ("text", "column", "fragment"),
    [
        ("a:b", 2, "not allowed in a symbol"),
        ("a#b", 2, "not allowed in a symbol"),
        ("héllo", 2, "not allowed in a symbol"),
        ("@x", 1, "unexpected"),
        ("%x", 1, "unexpected"),
        ("#t", 1, "unexpected"),
        ("'quoted", 1, "unexpected"),
        ("[a]", 1, "unexpected"),
        ("é", 1, "non-ASCII"),
    ],
)
def test_symbol_refusals(text: str, column: int, fragment: str) -> None:
    error = err(text)
    assert fragment in error.message
    assert error.column == column


@pytest.mark.parametrize("text", [":id", ":data-ref", ":+", ":a1@b"])
def test_keywords(text: str) -> None:
    result = cbcl.read(text)
    assert type(result) is Keyword
    assert result == Keyword(text[1:])
    assert result.text == text
    assert cbcl.canonical(result) == text


@pytest.mark.parametrize(("text", "fragment"), [(":", "needs a name"), (":1a", "cannot start"),
                                                (":a:b", "not allowed"), ("::a", "cannot start")])
def test_keyword_refusals(text: str, fragment: str) -> None:
    assert fragment in err(text).message


@pytest.mark.parametrize(
    "text",
    ["agent://sys/worker-1", "agent://a", "https://example.com/x?y=1&z=%20#frag",
     "a+b.c-d://x", "urn-x://é/ü", "hdfs://cluster:8020/data"],
)
def test_uris(text: str) -> None:
    result = cbcl.read(text)
    assert type(result) is URI
    assert result == URI(text)
    assert cbcl.canonical(result) == text


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("agent://", "at least one character"), ("HTTP://x", "lowercase"),
     ("1http://x", "malformed number"), ("agent://a\u202eb", "bidirectional"),
     ('agent://a"b', "whitespace, '(', ')' or ';'")],
)
def test_uri_refusals(text: str, fragment: str) -> None:
    assert fragment in err(text).message


def test_uri_ends_at_delimiters() -> None:
    assert cbcl.read("(agent://a)") == (URI("agent://a"),)
    assert cbcl.read("(agent://a;comment\n)") == (URI("agent://a"),)


def test_types_are_distinct() -> None:
    values = [cbcl.read(t) for t in ['"a"', "a", ":a", "x://a"]]
    assert len({(type(v), v) for v in values}) == 4
    assert Symbol("a") != "a"
    assert Symbol("a") != Keyword("a")
    assert "a" != Symbol("a")  # noqa: SIM300 (the reflected comparison is the point)
    assert {Symbol("a"): 1}.get(Symbol("a")) == 1


# --------------------------------------------------------------------------- lists, space


def test_lists_and_nesting() -> None:
    assert cbcl.read("()") == ()
    assert cbcl.read("(a (b (c)) ())") == (Symbol("a"), (Symbol("b"), (Symbol("c"),)), ())
    assert cbcl.read("(a(b)c)") == (Symbol("a"), (Symbol("b"),), Symbol("c"))


def test_whitespace_and_comments() -> None:
    text = "; leading comment\r\n( a\t;inline\n b\r\n)\n; trailing\n"
    assert cbcl.read(text) == (Symbol("a"), Symbol("b"))
    assert cbcl.read("(a;x\rb)") == (Symbol("a"), Symbol("b"))  # CR ends a comment


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("(a\x0cb)", "control"), ("(a\u00a0b)", "not whitespace"), ("(a\u2028b)", "not whitespace"),
     ("\ufeff(a)", "byte order mark"), ("(a ; \u202e evil\n)", "in a comment"),
     ("(a ; bell \x07\n)", "in a comment")],
)
def test_whitespace_and_comment_refusals(text: str, fragment: str) -> None:
    assert fragment in err(text).message


def test_comments_may_hold_any_printable_unicode() -> None:
    assert cbcl.read("; ünïcødé ✓ \t tab\n42") == 42


@pytest.mark.parametrize(
    ("text", "fragment", "column"),
    [("", "end of the input", 1), ("   ; only a comment", "end of the input", 20),
     ("(a", "unclosed", 3), ("((a)", "unclosed", 5), (")", "unexpected ')'", 1),
     ("(a))", "after the end", 4), ("a b", "after the end", 3), ("(a) (b)", "after the end", 5)],
)
def test_document_structure_refusals(text: str, fragment: str, column: int) -> None:
    error = err(text)
    assert fragment in error.message
    assert error.column == column


def test_read_all_reads_a_sequence() -> None:
    assert cbcl.read_all("(a) ; c\n 1 \"s\"") == [(Symbol("a"),), 1, "s"]
    assert cbcl.read_all("  ; nothing\n") == []


# --------------------------------------------------------------------------- encoding, positions


@pytest.mark.parametrize(
    "data",
    [b"(a \xff)", b"(a \xc3)", b"(a \x80)", b"(a \xc0\xaf)", b"(a \xed\xa0\x80)",
     b"(a \xf4\x90\x80\x80)"],
)
def test_invalid_utf8(data: bytes) -> None:
    error = err(data)
    assert "UTF-8" in error.message
    assert error.offset == 3
    assert (error.line, error.column) == (1, 4)


def test_lone_surrogate_in_str_input() -> None:
    assert "surrogate" in err('"\ud800"').message


def test_positions_count_lines_characters_and_bytes() -> None:
    error = err('(a\n  "é" b\n   007)')
    assert (error.line, error.column) == (3, 4)
    assert error.offset == len('(a\n  "é" b\n   '.encode())
    assert error.context is not None and error.context.endswith("   ^")
    error = err('("éé" #)')
    assert (error.column, error.offset) == (7, 8)


def test_bytes_and_str_inputs_agree() -> None:
    text = '(x "é" :k 1.5 agent://a)'
    assert cbcl.read(text) == cbcl.read(text.encode()) == cbcl.read(bytearray(text.encode()))
    assert cbcl.read(memoryview(text.encode())) == cbcl.read(text)


def test_wrong_input_type_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        cbcl.read(42)  # type: ignore[arg-type]


def test_errors_are_cbcl_errors_and_value_errors() -> None:
    error = err("(")
    assert isinstance(error, cbcl.CBCLError)
    assert isinstance(error, ValueError)
    assert error.exit_code == 3
    assert error.one_line().startswith("malformed 1:2: ")
    assert error.expected == ("')'",)
    limit = LimitError("x", limit="max_depth", maximum=1)
    assert limit.exit_code == 4


def test_value_constructors_validate() -> None:
    for bad in ["a b", "1a", "-5", "", "é", ".5"]:
        with pytest.raises(ValueError):
            Symbol(bad)
    with pytest.raises(ValueError):
        Keyword("")
    with pytest.raises(ValueError):
        URI("nope")
    assert Keyword(":k") == Keyword("k")
    assert URI("agent://x").scheme == "agent"
    assert repr(Symbol("a")) == "Symbol('a')"


@pytest.mark.parametrize("invisible", ["\u00a0", "\u200b", "\u200e", "\u2028", "\u3000",
                                       "\ufeff", "\u061c"])
def test_uris_refuse_invisible_characters(invisible: str) -> None:
    error = err(f"(agent://a{invisible}b)")
    assert "in a URI" in error.message
    assert error.column == 11
    with pytest.raises(ValueError):
        URI(f"agent://a{invisible}b")


@pytest.mark.parametrize(("text", "column", "in_comment"),
                         [('("a;b" \x01)', 8, False), ("; c\r\x01", 5, False),
                          ("(a ; x\x01\n)", 7, True), ("; \u2028\n1", 3, True)])
def test_comment_detection_in_messages(text: str, column: int, in_comment: bool) -> None:
    error = err(text)
    assert error.column == column
    assert ("in a comment" in error.message) is in_comment


# --------------------------------------------------------------------------- the tiers
#
# The reader has two tiers: the C twin (cbcl._native.read_value, where built), which reads
# well-formed text and declines anything else, and the Python reference
# (_reader.read_value_python), which reads everything the C twin declines and raises the
# precise errors. The differential property: whatever the C twin returns is exactly what
# the reference returns, it declines only what the reference refuses, and the public
# functions raise exactly the errors the reference raises.

SMALL_LIMITS = Limits(max_depth=4, max_list_items=5, max_nodes=30, max_string_bytes=12,
                      max_name_chars=6)


def same_value(a: object, b: object) -> bool:
    """Equal with exactly the same types all the way down (and decimals of the same text)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, tuple) and isinstance(b, tuple):  # (b: the same type as a)
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Decimal):
        return str(a) == str(b)
    return a == b


def outcome(read: Callable[[], object]) -> tuple[object, ...]:
    """What a read gives: ``("ok", result)`` or the error's every user-visible detail."""
    try:
        return ("ok", read())
    except (MalformedError, LimitError) as error:
        return ("error", type(error), error.message, error.position, error.context,
                getattr(error, "expected", None), getattr(error, "limit", None),
                getattr(error, "maximum", None))


def same_outcome(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    if a[0] == b[0] == "ok":
        return same_value(a[1], b[1])
    return a == b


def careful_read(text: str, limits: Limits) -> Value:
    """The public ``read`` by the reference alone: the value, then nothing but the end."""
    value, end, _ = _reader.read_value_python(text, 0, limits, 0, 0)
    _reader.expect_end(text, end)
    return value


def token_kind(text: str, pos: int) -> int | None:
    """The kind (``lastindex``) of the reader's token at ``pos`` (TOKEN matches anywhere)."""
    match = _reader.TOKEN.match(text, pos)
    assert match is not None, (text, pos)
    return match.lastindex


def careful_read_all(text: str, limits: Limits) -> list[Value]:
    out = []
    pos = 0
    while token_kind(text, pos) != _reader.EOF:
        value, pos, _ = _reader.read_value_python(text, pos, limits, 0, 0)
        out.append(value)
    return out


def c_tier(text: str, limits: Limits, depth: int = 0, nodes: int = 0,
           ) -> tuple[Value, int, int] | None:
    """What the C twin reads at character 0 (``None``: declined), as ``read_value_at``
    counts it; ``None`` too where cbcl._native is not built."""
    if _reader._read_value_c is None:
        return None
    found = _reader._read_value_c(text, 0, _reader._CACHE, _reader._atom,
                                  limits.max_depth - depth, limits.max_list_items,
                                  limits.max_nodes - nodes, limits.max_string_bytes,
                                  limits.max_name_chars, None)
    if found is None:
        return None
    value, end, count = found
    return value, end, nodes + count


def check_read(text: str, limits: Limits = DEFAULT_LIMITS, depth: int = 0,
               nodes: int = 0) -> tuple[Value, int, int] | None:
    """Hold the tiers to the reference on ``text`` (the property above). Returns what the
    reference read if ``text`` is one whole document (only whitespace and comments after
    the value), else ``None``."""
    reference = outcome(lambda: _reader.read_value_python(text, 0, limits, depth, nodes))
    found = c_tier(text, limits, depth, nodes)
    if found is not None:
        assert reference[0] == "ok", (text, reference)
        value, end, count = found
        read_back = reference[1]
        assert isinstance(read_back, tuple), read_back
        expected_value, expected_end, expected_count = read_back
        assert same_value(value, expected_value), (text, value, expected_value)
        assert (end, count) == (expected_end, expected_count), text
    elif _reader._read_value_c is not None:
        assert reference[0] == "error", (text, "the C twin declined valid text")
    public_reads_agree(text, limits, depth, nodes, reference)
    if reference[0] != "ok":
        return None
    read: tuple[Value, int, int] = reference[1]  # type: ignore[assignment]
    return read if _reader.only_space_after(text, read[1]) else None


def public_reads_agree(text: str, limits: Limits, depth: int, nodes: int,
                       careful: tuple[object, ...]) -> None:
    """``read_value_at`` at 0 (and, for a whole document, ``cbcl.read`` and
    ``cbcl.read_all``) give what the reference gave: ``careful``, its outcome."""
    at = outcome(lambda: read_value_at(text, 0, limits, depth, nodes))
    if careful[0] == "ok":
        assert at[0] == "ok", (text, at)
        got, expected = at[1], careful[1]
        assert isinstance(got, tuple) and isinstance(expected, tuple), (got, expected)
        assert same_value(got[0], expected[0]), text
        assert got[1:] == expected[1:], text
    else:
        assert at == careful, text
    if depth == nodes == 0:
        assert same_outcome(outcome(lambda: cbcl.read(text, limits=limits)),
                            outcome(lambda: careful_read(text, limits))), text
        assert same_outcome(outcome(lambda: cbcl.read_all(text, limits=limits)),
                            outcome(lambda: careful_read_all(text, limits))), text


# Whitespace and comments CBCL accepts, and things that look alike but are refused or
# change the meaning: Unicode spaces that str.split() would split on, controls, a missing
# delimiter, comments holding quotes and backslashes, stray quotes and backslashes.
GOOD_GAPS = [" ", "\n", "\t", "\r\n", "\r", "  \n   ", "; note\n", '; say "hi" \\ \n',
             ";\t(tab)\r", "\n;;\n"]
ODD_GAPS = ["", "\x0b", "\x0c", "\x1c", "\x1f", "\x85", "\xa0", "\u1680", "\u2000",
            "\u2028", "\u2029", "\u202f", "\u3000", "\ufeff", "\x00", "\x7f", "\u202e",
            "; \x01\n", "; \u202e\n", ";", '"', '" "', "\\", "é", ":", "#"]
LEADS = ["", "", "; lead\n", '; "lead" \\\n', " \n", ";\t\n", "; a\r\n", ";\n;\n",
         "; \x01\n", "; \u202e\n", ";\x85\n", "; \u2028\n", ";\ufeff\n", "\ufeff", "\xa0"]
TAILS = ["", "\n", " ; end \"\n", " (x)", " y", '"', ' "x', '"x"', " \x0b", "\u3000", "; \x01"]
ODD_CHARS = ("\"\\;() \t\r\n\x0b\x0c\x1c\x1f\x85\xa0\u2028\u202e\u2066\x00\x7f\x01\ufeff"
             "é:.-+0159au/#")


def strings_of(value: Value) -> list[str]:
    if isinstance(value, tuple):
        return [s for item in value for s in strings_of(item)]
    return [value] if type(value) is str else []


def render(value: Value, gap: Callable[[bool], str]) -> str:
    """``value`` as text, with ``gap(required)`` between its tokens."""
    if not isinstance(value, tuple):
        return cbcl.canonical(value)
    inner = [render(item, gap) for item in value]
    out = "(" + gap(False)
    for i, text in enumerate(inner):
        if i:
            out += gap(True)
        out += text
    return out + gap(False) + ")"


@st.composite
def texts(draw: st.DrawFn) -> str:
    """Valid texts, texts with odd gaps, and mutated texts."""
    value = draw(cbcl_values)
    odd = draw(st.integers(0, 4))  # 0: valid; otherwise about one gap in 4 * odd is odd

    def gap(required: bool) -> str:
        if odd and draw(st.integers(0, 4 * odd)) == 0:
            return draw(st.sampled_from(ODD_GAPS))
        choices = GOOD_GAPS if required else ["", "", *GOOD_GAPS]
        return draw(st.sampled_from(choices))

    text = draw(st.sampled_from(LEADS)) + render(value, gap) + draw(st.sampled_from(TAILS))
    for _ in range(draw(st.integers(0, 3) if draw(st.booleans()) else st.just(0))):
        at = draw(st.integers(0, len(text)))
        edit = draw(st.sampled_from(["insert", "delete", "replace"]))
        ch = draw(st.sampled_from(ODD_CHARS))
        if edit == "insert":
            text = text[:at] + ch + text[at:]
        elif edit == "delete":
            text = text[:at] + text[at + 1:]
        else:
            text = text[:at] + ch + text[at + 1:]
    return text


limit_sets = st.sampled_from([DEFAULT_LIMITS, SMALL_LIMITS]) | st.builds(
    Limits, max_depth=st.integers(1, 5), max_list_items=st.integers(1, 6),
    max_nodes=st.integers(1, 40), max_string_bytes=st.integers(1, 50),
    max_name_chars=st.integers(1, 25))


@settings(max_examples=500, deadline=None)
@given(text=texts(), limits=limit_sets)
def test_reader_reads_exactly_what_the_careful_loop_reads(text: str, limits: Limits) -> None:
    check_read(text, limits)


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet=ODD_CHARS, max_size=30).map(lambda t: "(" + t),
       limits=limit_sets)
def test_reader_on_garbage(text: str, limits: Limits) -> None:
    check_read(text, limits)


@settings(max_examples=100, deadline=None)
@given(text=texts(), limits=limit_sets, depth=st.integers(0, 3), nodes=st.integers(0, 10))
def test_reader_counts_from_the_depth_and_nodes_given(text: str, limits: Limits,
                                                          depth: int, nodes: int) -> None:
    check_read(text, limits, depth, nodes)


@settings(max_examples=200, deadline=None)
@given(value=cbcl_values.filter(lambda v: isinstance(v, tuple)))
def test_reader_reads_canonical_lists(value: tuple[Value, ...]) -> None:
    text = cbcl.canonical(value)
    found = check_read(text)
    assert found is not None, text
    assert found[1] == len(text)


def test_reader_reads_the_shipped_examples() -> None:
    examples = sorted((Path(__file__).parent.parent / "descriptors" / "examples").glob("*.cbcl"))
    assert examples
    for path in examples:
        text = path.read_text(encoding="utf-8")
        assert check_read(text) is not None, path


@pytest.mark.parametrize("ch", ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f", "\x85",
                                "\xa0", "\u1680", "\u2000", "\u200a", "\u2028", "\u2029",
                                "\u202f", "\u205f", "\u3000"])
def test_reader_never_splits_on_odd_space(ch: str) -> None:
    for text in (f"(a{ch}b)", f"(a{ch})", f"({ch}a)", f'("s"{ch}b)', f"(a)\n{ch}"):
        assert check_read(text) is None, repr(text)
        with pytest.raises(MalformedError):
            cbcl.read(text)
    found = check_read(f'("a{ch}b")')  # in a string only the controls are refused
    assert (found is None) == (ch < "\xa0")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [('("a""b")', "whitespace, '(', ')' or ';'"), ('("a"b)', "whitespace, '(', ')' or ';'"),
     ('(a"b")', "whitespace, '(', ')' or ';'"), ('(:k"v")', "whitespace, '(', ')' or ';'"),
     ('(agent://x"v")', "whitespace, '(', ')' or ';'"), ('(1"v")', "after '1'"),
     ('("a\x01")', "control"), ('("\x7f")', "control"), ('("\x85")', "control"),
     ('("a\tb")', "control"), ('("a\nb")', "control"), ('("a\rb")', "control"),
     ('("\u202e")', "bidirectional"), ('("\u2066")', "bidirectional"),
     ('("\u2069")', "bidirectional"), ("(01)", "leading zeros"), ("(-0)", "-0"),
     ("(1.)", "digits after"), ("(+1)", "'+'"), ("(.5)", "digits before"),
     ("(9223372036854775808)", "64-bit"), ("(-9223372036854775809)", "64-bit"),
     ("(" + "1" * 30 + ")", "64-bit"), ("(1." + "0" * 39 + ")", "40 characters"),
     ('("abc)', "unterminated"), ('("a\\q")', "invalid escape"), ('("\\ud800")', "surrogate"),
     ('("a\\")', "unterminated"), ("(a\\b)", "not allowed in a symbol"), ("(a;b", "unclosed"),
     ("(a))", "after the end"), ("(a) b", "after the end"), ("(é)", "non-ASCII"),
     ("(\ufeff)", "byte order mark"), ("(a\x00)", "control"), ("(a b", "unclosed")],
)
def test_reader_gives_up_where_the_careful_loop_refuses(text: str, fragment: str) -> None:
    assert check_read(text) is None
    assert fragment in err(text).message


@pytest.mark.parametrize(
    ("text", "value"),
    [('("a" "b")', ("a", "b")), ('("a"(b))', ("a", (Symbol("b"),))),
     ('(("a"))', (("a",),)), ('(""())', ("", ())), ('( "" )', ("",)),
     ('("a\\"b")', ('a"b',)), ('("\\\\")', ("\\",)), ('("\\\\q")', ("\\q",)),
     ('("\\u00e9\\n\\t")', ("é\n\t",)), ('("\\u202E")', ("\u202e",)),
     ('("a\xa0b\u2028c")', ("a\xa0b\u2028c",)), ('("semi;colon (paren)")', ("semi;colon (paren)",)),
     ("(9223372036854775807 -9223372036854775808)", (2**63 - 1, -(2**63))),
     ("(0 -7 0.5 -0.0 1.50)", (0, -7, Decimal("0.5"), Decimal("-0.0"), Decimal("1.50"))),
     ("(a :b c://d)", (Symbol("a"), Keyword("b"), URI("c://d"))),
     ("(urn-x://é/ü)", (URI("urn-x://é/ü"),))],
)
def test_reader_values(text: str, value: Value) -> None:
    found = check_read(text)
    assert same_value(cbcl.read(text), value)
    assert found is not None and same_value(found[0], value)


@pytest.mark.parametrize(
    ("text", "value", "end"),
    [('; say "hi" (not a list)\n(a "b")', (Symbol("a"), "b"), 31),
     ('; one\n; two "x"\n  (a)', (Symbol("a"),), 21),
     (';\tlead\n(a)', (Symbol("a"),), 10),
     ("\t(a)\r\n", (Symbol("a"),), 4),
     ('(a ; "x\n "b")', (Symbol("a"), "b"), 13),
     ('(a)\n; done "x"\n', (Symbol("a"),), 3),
     ('(a ; x\n "b")', (Symbol("a"), "b"), 12),
     ('(a ; (x) \\ \n "b" ;y)\n "c")', (Symbol("a"), "b", "c"), 26),
     ('(a) ; (x)', (Symbol("a"),), 3),
     ('(a "b") ; ) (\n ; )\n', (Symbol("a"), "b"), 7),
     ('(a "\\"" ; x\n)', (Symbol("a"), '"'), 13),
     ('(a "\\"" ; "\n)', (Symbol("a"), '"'), 13)],
)
def test_reader_and_comments(text: str, value: Value, end: int) -> None:
    """Comments are skipped where they are, whatever they hold (quotes, parentheses)."""
    assert check_read(text) is not None
    found = read_value_at(text, 0, DEFAULT_LIMITS, 0, 0)
    assert same_value(found[0], value)
    assert found[1] == end
    assert same_value(cbcl.read(text), value)


@pytest.mark.parametrize(("text", "end"), [("(a) (b)", 3), ("(a)(b)", 3), ("(a) b", 3),
                                           ('(a) "b"', 3), ("(a)  ", 3), ("((a) b) ; c", 7)])
def test_read_value_at_ends_just_after_the_value(text: str, end: int) -> None:
    check_read(text)
    assert read_value_at(text, 0, DEFAULT_LIMITS, 0, 0)[1] == end


@pytest.mark.parametrize(
    ("text", "fragment"),
    [('(a) "abc', "unterminated"), ('(a)"', "unterminated"), ('(a "b") "', "unterminated"),
     ("; \x01\n(a)", "in a comment"), ("; \u202e\n(a)", "in a comment"),
     ("; \u2028\n(a)", "in a comment"), ("\ufeff(a)", "byte order mark")],
)
def test_reader_gives_up_before_and_after_the_list(text: str, fragment: str) -> None:
    assert check_read(text) is None
    assert fragment in err(text).message


def test_reader_counts_the_depth_around_the_value() -> None:
    for depth in (3, 4):
        with pytest.raises(LimitError):
            read_value_at("(a)", 0, Limits(max_depth=3), depth, 0)
        assert check_read("(a)", Limits(max_depth=3), depth) is None
    assert check_read("(a)", Limits(max_depth=3), 2) is not None
    assert check_read("(a)", Limits(max_nodes=3), 0, 3) is None
    assert check_read("(a)", Limits(max_nodes=4), 0, 2) == ((Symbol("a"),), 3, 4)


def test_read_all_reads_every_value_the_split_tier_would_give_up_on() -> None:
    text = '(a "x") ; c\n(b)\n"s" (c (d))'
    assert cbcl.read_all(text) == [(Symbol("a"), "x"), (Symbol("b"),), "s",
                                   (Symbol("c"), (Symbol("d"),))]


@pytest.mark.parametrize(
    ("text", "limits", "name"),
    [("((((a))))", Limits(max_depth=3), "max_depth"),
     ("(a b c d)", Limits(max_list_items=3), "max_list_items"),
     ("(a (b c) d)", Limits(max_nodes=4), "max_nodes"),
     ('("éé")', Limits(max_string_bytes=3), "max_string_bytes"),
     ('("abcd")', Limits(max_string_bytes=3), "max_string_bytes"),
     ('("\\u00e9\\u00e9")', Limits(max_string_bytes=3), "max_string_bytes"),
     ("(abcd)", Limits(max_name_chars=3), "max_name_chars"),
     ("(:abcd)", Limits(max_name_chars=3), "max_name_chars")],
)
def test_reader_limits(text: str, limits: Limits, name: str) -> None:
    assert check_read(text, limits) is None
    with pytest.raises(LimitError) as info:
        cbcl.read(text, limits=limits)
    assert info.value.limit == name


@pytest.mark.parametrize(
    ("text", "limits"),
    [("(((a)))", Limits(max_depth=3)), ("(a b c)", Limits(max_list_items=3)),
     ("(a (b) c)", Limits(max_nodes=5)), ('("é" "abc")', Limits(max_string_bytes=3)),
     ("(abc :abc)", Limits(max_name_chars=3))],
)
def test_reader_reads_up_to_the_limits(text: str, limits: Limits) -> None:
    assert check_read(text, limits) is not None


@pytest.mark.parametrize("text", ["(" + "n" * 100 + ")", "(:" + "k" * 100 + ")"])
def test_cached_names_are_checked_against_smaller_limits(text: str) -> None:
    assert check_read(text) is not None  # now cached
    assert check_read(text, Limits(max_name_chars=100)) is not None
    assert check_read(text, Limits(max_name_chars=99)) is None
    with pytest.raises(LimitError) as info:
        cbcl.read(text, limits=Limits(max_name_chars=99))
    assert info.value.limit == "max_name_chars"
    uri = "(a://" + "u" * 100 + ")"  # no limit on a URI's length
    assert check_read(uri, Limits(max_name_chars=1)) is not None


def test_names_at_the_cache_boundary() -> None:
    n = _reader._CACHED_CHARS
    for name in ("c" * n, "d" * (n + 1)):
        for text in (f"({name})", f"(:{name})"):
            assert check_read(text, Limits(max_name_chars=n + 1)) is not None  # maybe cached
            assert check_read(text, Limits(max_name_chars=len(name) - 1)) is None
            with pytest.raises(LimitError):
                cbcl.read(text, limits=Limits(max_name_chars=len(name) - 1))


def test_long_names_are_checked_at_every_read() -> None:
    long = "x" * 200  # longer than the cache keeps
    assert check_read(f"({long})", Limits(max_name_chars=200)) is not None
    assert check_read(f"({long})", Limits(max_name_chars=199)) is None


def test_the_atom_cache_is_bounded_and_names_are_interned(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_reader, "_CACHE_MAX", 40)
    sizes = []
    for i in range(100):
        for token in (f"cache-test-{i}", f":k-{i}", f"{i}.5"):
            assert _reader._atom(token, DEFAULT_LIMITS.max_name_chars) is not None
            sizes.append(len(_reader._CACHE))
        assert check_read(f"(cache-test-{i} {i} {i}.5)") is not None
    assert max(sizes) <= 40
    a = cbcl.read("(same :same)")
    b = _reader.read_value_python("(same :same)", 0, DEFAULT_LIMITS, 0, 0)[0]
    assert isinstance(a, tuple) and isinstance(b, tuple)
    assert a[0] is b[0] is _reader.intern_symbol("same")
    assert a[1] is b[1] is _reader.intern_keyword("same")


def test_reader_stays_linear_on_hostile_input() -> None:
    started = time.process_time()
    with pytest.raises(LimitError):
        cbcl.read("(" * 100_000)
    with pytest.raises(LimitError):
        cbcl.read("(" + "a" * 500_000 + ")")
    with pytest.raises(LimitError):
        cbcl.read('("' + "x" * 500_000 + '")', limits=Limits(max_string_bytes=400_000))
    big = Limits(max_message_bytes=12_000_000, max_string_bytes=11_000_000)
    assert cbcl.read('("' + "x" * 10_000_000 + '")', limits=big) == ("x" * 10_000_000,)
    assert cbcl.read("(" + "a" * 500_000 + ")", limits=Limits(max_name_chars=500_000)) == (
        Symbol("a" * 500_000),)
    many = "(a) " * 20_000  # read_all must not re-split the rest of the text per value
    assert len(cbcl.read_all(many)) == 20_000
    assert time.process_time() - started < 20


def test_the_token_cache_keeps_names_uris_and_short_numbers_only() -> None:
    _reader._CACHE.clear()
    # (the C twin's atom cache: it reads integers and long decimals itself, and finds
    # other atoms in its own memo first, so the rules are asked of _atom directly)
    tokens = ("alpha", ":beta", "agent://x", "12", "1.5", "123456", "12.345")
    values = tuple(_reader._atom(token, DEFAULT_LIMITS.max_name_chars) for token in tokens)
    assert values == (
        cbcl.Symbol("alpha"), cbcl.Keyword("beta"), cbcl.URI("agent://x"), 12,
        Decimal("1.5"), 123456, Decimal("12.345"))
    kept = set(_reader._CACHE)
    assert {"alpha", ":beta", "agent://x", "12", "1.5"} <= kept
    assert "123456" not in kept and "12.345" not in kept


def test_a_full_intern_table_keeps_pinned_names_and_takes_new_ones(
        monkeypatch: pytest.MonkeyPatch) -> None:
    symbols: dict[str, Symbol] = {}
    monkeypatch.setattr(_reader, "_SYMBOLS", symbols)
    monkeypatch.setattr(_reader, "_PINNED_SYMBOLS", {})
    monkeypatch.setattr(_reader, "_INTERN_MAX", 4)
    literal = _reader.intern_symbol("cfp", pin=True)
    flood = [_reader.intern_symbol(f"junk-{i}") for i in range(3)]
    assert len(symbols) == 4 and _reader.intern_symbol("junk-0") is flood[0]
    later = _reader.intern_symbol("later")  # full: emptied down to the pinned names
    assert set(symbols) == {"cfp", "later"}
    assert _reader.intern_symbol("cfp") is literal and _reader.intern_symbol("later") is later
    assert _reader.intern_symbol("junk-0") is not flood[0]  # made again, equal
    assert _reader.intern_symbol("junk-0") == flood[0]
