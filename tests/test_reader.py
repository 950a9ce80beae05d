"""The text syntax of draft §1: every rule, and every refusal with its position."""

from __future__ import annotations

from decimal import Decimal

import pytest

import cbcl
from cbcl import URI, Keyword, LimitError, MalformedError, Symbol


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
