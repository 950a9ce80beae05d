"""Tests for cbcl.grammar._subset: the descriptor grammar subset reader and its generators.

Tests internals: the subset reader, its CFG and lark generators are private."""

from __future__ import annotations

import contextlib
import gc
import inspect
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import lark
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from lark import Tree
from lark.lexer import Lexer, Token

from cbcl import GrammarError, Position
from cbcl.descriptor import GrammarLimits
from cbcl.grammar._cfg import Grammar, Production
from cbcl.grammar._subset import (
    MAX_GROUP_DEPTH_CEILING,
    GrammarSource,
    Group,
    Literal,
    Reference,
    Repeat,
    inner_sequences,
    list_end,
    read_grammar,
    to_cfg,
    to_lark,
    walk,
    walk_positions,
)

VECTORS = Path(__file__).resolve().parents[1] / "spec" / "vectors" / "grammars"
VECTOR_FILES = sorted(VECTORS.glob("*.lark"))
LALR_VECTORS = ["task-assignment.lark", "layered-expression.lark"]
HOSTILE_SECONDS = 0.5  # generous bound; the measured times are a few milliseconds


def P(*rhs: str, lhs: str, alias: str | None = None) -> Production:
    return Production(lhs, tuple(rhs), alias)


def refused(text: str | bytes, limits: GrammarLimits | None = None) -> GrammarError:
    with pytest.raises(GrammarError) as info:
        read_grammar(text, limits=limits)
    assert info.value.verdict == "rejected"
    assert info.value.position is not None
    return info.value


def productions_of(grammar: Grammar, lhs: str) -> list[tuple[str, ...]]:
    return [p.rhs for p in grammar.productions if p.lhs == lhs]


class TokenListLexer(Lexer):
    """A trivial custom lexer: the 'text' given to ``parse`` is a list of (type, value)."""

    def __init__(self, lexer_conf: object) -> None:
        pass

    # (lark's custom-lexer protocol: lex() is given what parse() was, here the token list)
    def lex(self, data: list[tuple[str, str]]) -> Iterator[Token]:  # type: ignore[override]
        for kind, value in data:
            yield Token(kind, value)


def rule_node(node: Tree[Token] | Token) -> Tree[Token]:
    """A child of a parse tree that is a rule's node, not a token."""
    assert isinstance(node, Tree), node
    return node


def compile_lark(grammar_text: str, start: str, **options: object) -> lark.Lark:
    return lark.Lark(grammar_text, lexer=TokenListLexer, start=start, **options)


# --------------------------------------------------------------------------------------
# The public grammar vectors (spec/vectors/grammars)


@pytest.mark.parametrize("path", VECTOR_FILES, ids=lambda p: p.name)
def test_vector_grammars_read(path: Path) -> None:
    source = read_grammar(path.read_text())
    assert source.rules[0].name == "body"
    grammar = to_cfg(source)
    assert grammar.start == "body"
    assert "body" in grammar.nonterminals


def test_vector_grammars_also_read_as_bytes() -> None:
    for path in VECTOR_FILES:
        assert read_grammar(path.read_bytes()) == read_grammar(path.read_text())


def test_task_assignment_expansion() -> None:
    grammar = to_cfg(read_grammar((VECTORS / "task-assignment.lark").read_text()))
    assert grammar.productions == (
        P("task", lhs="body"),
        P("LPAR", "LIT_0", "KEYWORD", "STRING", "__task_star_0", "RPAR", lhs="task"),
        P(lhs="__task_star_0"),
        P("__task_star_0", "attr", lhs="__task_star_0"),
        P("LIT_1", "command", lhs="attr"),
        P("LIT_2", "LPAR", "__attr_star_0", "RPAR", lhs="attr"),
        P("LIT_3", "value", lhs="attr"),
        P(lhs="__attr_star_0"),
        P("__attr_star_0", "KEYWORD", "INTEGER", lhs="__attr_star_0"),
        P("LPAR", "LIT_4", "__command_star_0", "RPAR", lhs="command"),
        P(lhs="__command_star_0"),
        P("__command_star_0", "KEYWORD", "value", lhs="__command_star_0"),
        *(P(t, lhs="value") for t in ("SYMBOL", "STRING", "INTEGER", "DECIMAL", "KEYWORD",
                                      "URI")),
        P("LPAR", "__value_star", "RPAR", lhs="value"),
        P(lhs="__value_star"),
        P("__value_star", "value", lhs="__value_star"),
    )
    assert grammar.synthetic == {"__task_star_0", "__attr_star_0", "__command_star_0",
                                 "__value_star"}
    assert grammar.show("__task_star_0") == "attr*"
    assert grammar.show("__attr_star_0") == "(KEYWORD INTEGER)*"
    assert grammar.show("__command_star_0") == "(KEYWORD value)*"
    assert grammar.show("__value_star") == "value*"
    assert [grammar.show(f"LIT_{n}") for n in range(5)] == [
        '"task"', '":cmd"', '":resources"', '":deadline"', '"compute"']
    assert grammar.show("LPAR") == '"("' and grammar.show("RPAR") == '")"'
    assert grammar.overlaps == {"LIT_0": {"SYMBOL"}, "LIT_1": {"KEYWORD"},
                                "LIT_2": {"KEYWORD"}, "LIT_3": {"KEYWORD"},
                                "LIT_4": {"SYMBOL"}}
    assert grammar.terminals == {"SYMBOL", "STRING", "INTEGER", "DECIMAL", "KEYWORD", "URI",
                                 "LPAR", "RPAR", "LIT_0", "LIT_1", "LIT_2", "LIT_3", "LIT_4"}
    assert "value" not in grammar.synthetic


def test_layered_expression_expansion() -> None:
    grammar = to_cfg(read_grammar((VECTORS / "layered-expression.lark").read_text()))
    assert grammar.productions == (
        P("sum", lhs="body"),
        P("sum", "LIT_0", "prod", lhs="sum"), P("prod", lhs="sum"),
        P("prod", "LIT_1", "atom", lhs="prod"), P("atom", lhs="prod"),
        P("INTEGER", lhs="atom"), P("LPAR", "sum", "RPAR", lhs="atom"),
    )
    assert grammar.synthetic == frozenset()
    assert grammar.terminals == {"LIT_0", "LIT_1", "INTEGER", "LPAR", "RPAR"}
    assert "value" not in grammar.nonterminals


# --------------------------------------------------------------------------------------
# Every construct


def test_syntax_tree_shapes_and_positions() -> None:
    source = read_grammar('body: a\n?a: ("x" | b)* [":k"] b+ -> al\n  | \nb: SYMBOL? value\n')
    body, a, b = source.rules
    assert (body.name, body.inline, body.position) == ("body", False, Position(1, 1, 0))
    assert a.inline and a.position == Position(2, 2, 9)
    assert [alt.alias for alt in a.alternatives] == ["al", None]
    assert a.alternatives[0].alias_position == Position(2, 29, 36)
    assert a.alternatives[1].items == ()
    star, maybe, plus = a.alternatives[0].items
    assert isinstance(star, Repeat) and star.op == "*" and star.position == Position(2, 5, 12)
    assert isinstance(star.item, Group) and not star.item.optional
    lit, ref = (alt.items[0] for alt in star.item.alternatives)
    assert lit == Literal("x", Position(2, 6, 13)) and not lit.is_keyword
    assert ref == Reference("b", Position(2, 12, 19)) and not ref.is_base
    assert isinstance(maybe, Group) and maybe.optional
    assert maybe.alternatives[0].items[0] == Literal(":k", Position(2, 17, 24))
    assert isinstance(plus, Repeat) and plus.op == "+"
    symbol, value = b.alternatives[0].items
    assert isinstance(symbol, Repeat) and symbol.item == Reference("SYMBOL", Position(4, 4, 47))
    assert value == Reference("value", Position(4, 12, 55)) and value.is_base
    assert source.rule("b") is b
    with pytest.raises(KeyError):
        source.rule("nope")


def test_optional_forms() -> None:
    g = to_cfg(read_grammar('body: "a"? ["b" "c"] ("d" | "e")? ["f" | SYMBOL]'))
    assert productions_of(g, "body") == [
        ("__body_opt_0", "__body_opt_1", "__body_opt_2", "__body_opt_3")]
    assert productions_of(g, "__body_opt_0") == [(), ("LIT_0",)]
    assert productions_of(g, "__body_opt_1") == [(), ("LIT_1", "LIT_2")]
    assert productions_of(g, "__body_opt_2") == [(), ("LIT_3",), ("LIT_4",)]
    assert productions_of(g, "__body_opt_3") == [(), ("LIT_5",), ("SYMBOL",)]
    assert [g.show(f"__body_opt_{n}") for n in range(4)] == [
        '"a"?', '["b" "c"]', '("d" | "e")?', '["f" | SYMBOL]']


def test_repetitions_are_left_recursive() -> None:
    g = to_cfg(read_grammar('body: "a"* "b"+ ("c" | "d")* ("e" "f")+'))
    assert productions_of(g, "body") == [
        ("__body_star_0", "__body_plus_1", "__body_star_2", "__body_plus_3")]
    assert productions_of(g, "__body_star_0") == [(), ("__body_star_0", "LIT_0")]
    assert productions_of(g, "__body_plus_1") == [("LIT_1",), ("__body_plus_1", "LIT_1")]
    assert productions_of(g, "__body_star_2") == [
        (), ("__body_star_2", "LIT_2"), ("__body_star_2", "LIT_3")]
    assert productions_of(g, "__body_plus_3") == [
        ("LIT_4", "LIT_5"), ("__body_plus_3", "LIT_4", "LIT_5")]
    assert g.show("__body_star_2") == '("c" | "d")*'
    assert g.show("__body_plus_3") == '("e" "f")+'


def test_groups() -> None:
    g = to_cfg(read_grammar('body: ("a" "b") ("c" | "d" "e") "f"'))
    # A single-alternative group is spliced; a multi-alternative one gets a helper.
    assert productions_of(g, "body") == [("LIT_0", "LIT_1", "__body_group_0", "LIT_5")]
    assert productions_of(g, "__body_group_0") == [("LIT_2",), ("LIT_3", "LIT_4")]
    assert g.show("__body_group_0") == '("c" | "d" "e")'
    assert g.synthetic == {"__body_group_0"}


def test_nested_constructs_and_display() -> None:
    g = to_cfg(read_grammar('body: ("a" [":x" SYMBOL]*)+ | "b"'))
    assert productions_of(g, "body") == [("__body_plus_0",), ("LIT_2",)]
    assert g.show("__body_plus_0") == '("a" [":x" SYMBOL]*)+'
    assert g.show("__body_star_1") == '[":x" SYMBOL]*'
    assert g.show("__body_opt_2") == '[":x" SYMBOL]'
    assert productions_of(g, "__body_star_1") == [(), ("__body_star_1", "__body_opt_2")]
    assert productions_of(g, "__body_opt_2") == [(), ("LIT_1", "SYMBOL")]


def test_aliases_empty_alternatives_and_inline_rules() -> None:
    text = "body: item -> one\n    | item item -> two\n    |\n?item: SYMBOL | KEYWORD\n"
    source = read_grammar(text)
    g = to_cfg(source)
    assert g.productions[:3] == (P("item", lhs="body", alias="one"),
                                 P("item", "item", lhs="body", alias="two"),
                                 P(lhs="body"))
    assert source.rules[1].inline and not source.rules[0].inline
    assert read_grammar("body: -> nothing").rules[0].alternatives[0].alias == "nothing"


def test_literals_numbered_by_first_appearance() -> None:
    g = to_cfg(read_grammar('body: "(" "b" a "b" ")" ":a"\na: "a" "(" "b"'))
    assert productions_of(g, "body") == [("LPAR", "LIT_0", "a", "LIT_0", "RPAR", "LIT_1")]
    assert productions_of(g, "a") == [("LIT_2", "LPAR", "LIT_0")]
    assert g.display["LIT_1"] == '":a"' and g.overlaps["LIT_1"] == {"KEYWORD"}
    assert "LPAR" not in g.overlaps


def test_value_only_when_used() -> None:
    g = to_cfg(read_grammar("body: SYMBOL"))
    assert g.nonterminals == {"body"} and g.terminals == {"SYMBOL"}
    g = to_cfg(read_grammar("body: value"))
    assert len(productions_of(g, "value")) == 7 and g.synthetic == {"__value_star"}
    assert g.terminals >= {"LPAR", "RPAR", "URI"}


def test_layout_comments_and_whitespace() -> None:
    text = ('// leading comment é ✓\r\n\r\n  body: "a"   // trailing\r\n'
            '\t| ( "b"\n      | "c" )  // inside\n\n\nother_rule: "d"\n')
    source = read_grammar(text.replace("other_rule", "x").replace('"a"', '"a" x'))
    assert [r.name for r in source.rules] == ["body", "x"]
    assert len(source.rules[0].alternatives) == 2
    # Byte offsets count the UTF-8 of the non-ASCII comment; columns count characters.
    assert source.rules[0].position == Position(3, 3, len("// leading comment é ✓\r\n\r\n  "
                                                            .encode()))


def test_valid_literal_texts() -> None:
    for text in ["task", "+", "-", ".", "...", "a.b", "CBCL/1.0", "task-assignment/v1", "=>",
                 "x@y%z&", ":id", ":-5", ":+", "?", "!x", "_x", "*", "+a", "-.5"]:
        source = read_grammar(f'body: "{text}"')
        assert source.rules[0].alternatives[0].items[0] == Literal(text, Position(1, 7, 6))


# --------------------------------------------------------------------------------------
# Refusals: reason and position

REFUSALS = [
    ('body: /x+/', "regular expressions", 1, 7),
    ('body: "a"\nNUMBER: /[0-9]+/', "terminal definitions", 2, 1),
    ('body: "a"\nWORD: "a"', "terminal definitions", 2, 1),
    ('%import common.NUMBER\nbody: "a"', "directives (%import)", 1, 1),
    ('body: "a"\n%override x: "b"', "directives (%override)", 2, 1),
    ('body: "a"\n%extend x: "b"', "directives (%extend)", 2, 1),
    ('body: "a"\n%ignore " "', "directives (%ignore)", 2, 1),
    ('body: "a"\n%declare FOO', "directives (%declare)", 2, 1),
    ('body: "a"\n  % ', "directives (%...)", 2, 3),
    ('body: pair{"a"}', "templates", 1, 11),
    ('pair{x}: x\nbody: "a"', "templates", 1, 5),
    ('body.2: "a"', "priorities", 1, 5),
    ('body: "a".2', "priorities", 1, 10),
    ('body: "a" ~ 3', "repetition counts", 1, 11),
    ('body: "a"~2..5', "repetition counts", 1, 10),
    ('body: "a".."z"', "ranges", 1, 10),
    ('body: "x"i', "literal flags", 1, 10),
    ('body: SYMBOL FOO', "unknown terminal FOO", 1, 14),
    ('body: LPAR', "unknown terminal LPAR", 1, 7),
    ('body: _hidden\n_hidden: "a"', "may not start with '_'", 1, 7),
    ('body: "a"\n_hidden: "a"', "may not start with '_'", 2, 1),
    ('body: "a"\n__x: "a"', "may not start with '_'", 2, 1),
    ('body: "a"\nbadName: "a"', "must match [a-z][a-z0-9_]*", 2, 1),
    ('body: a\n\n a: "x"\n  a: "y"', "defined twice (first at 3:2)", 4, 3),
    ('body: "a"\nvalue: SYMBOL', "base name", 2, 1),
    ('body: "a" -> value', "base name", 1, 14),
    ('body: "a" -> URI', "must match", 1, 14),
    ('body: SYMBOL\nSYMBOL: "x"', "terminal definitions", 2, 1),
    ('body: x y\nx: "a"', "undefined rule: y", 1, 9),
    ('body: [q] (r | q)\n', "undefined rules: q, r", 1, 8),
    ('start: "a"', "no body rule", 1, 1),
    ('', "no body rule", 1, 1),
    ('// only a comment\n', "no body rule", 1, 1),
    ('body: "a b"', "is not", 1, 7),
    ('body: "1x"', "reads as a number", 1, 7),
    ('body: ""', "empty literal", 1, 7),
    ('body: "-5"', "reads as a number", 1, 7),
    ('body: "+1"', "reads as a number", 1, 7),
    ('body: ".5"', "reads as a number", 1, 7),
    ('body: "42"', "reads as a number", 1, 7),
    ('body: ":"', "is not", 1, 7),
    ('body: ":5"', "is not", 1, 7),
    ('body: "a:b"', "is not", 1, 7),
    ('body: "(a"', "is not", 1, 7),
    ('body: "a\\"b"', "escapes", 1, 9),
    ('body: "a\\nb"', "escapes", 1, 9),
    ('body: "tâche"', "not ASCII", 1, 7),
    ('body: "a\tb"', "is not", 1, 7),
    ("body: \"a\"\n  tâche: \"x\"", "non-ASCII character U+00E2", 2, 4),
    ('body: "a" ✓', "non-ASCII character U+2713", 1, 11),
    ('\ufeffbody: "a"', "non-ASCII character U+FEFF", 1, 1),
    ('body: "abc', "unterminated literal", 1, 7),
    ('body: "abc\n"', "unterminated literal", 1, 7),
    ('body: ("a" | "b"', "never closed", 1, 7),
    ('body: ("a"\n  "b")', "never closed", 1, 7),
    ('body: ["a")', "does not close the '['", 1, 11),
    ('body: "a")', "unmatched ')'", 1, 10),
    ('body: ()', "empty group", 1, 7),
    ('body: [ | ]', "empty group", 1, 7),
    ('body: * "a"', "must follow", 1, 7),
    ('body: "a"**', "must follow", 1, 11),
    ('body: "a"+?', "must follow", 1, 11),
    ('body: ("a" -> x)', "top-level alternative", 1, 12),
    ('body: "a" -> x "b"', "must end its alternative", 1, 16),
    ('body: "a" -> x -> y', "must end its alternative", 1, 16),
    ('body: "a" ->', "expected an alias name", 1, 13),
    ('body: "a" - "b"', "unexpected '-'", 1, 11),
    ('body "a"', "expected ':'", 1, 6),
    ('body: "a" : "b"', "unexpected ':'", 1, 11),
    ('!body: "a"', "! rule modifier", 1, 1),
    ('? body: "a"', "right after '?'", 1, 1),
    ('body: a ?b\na: "x"\nb: "y"', "rule modifier", 1, 9),
    ('"a": "b"', "expected a rule definition", 1, 1),
    ('| "a"', "expected a rule definition", 1, 1),
    ('# comment\nbody: "a"', "'#' comments", 1, 1),
    ("body: 'a'", "unexpected character \"'\"", 1, 7),
    ('body: "a" 12', "unexpected number", 1, 11),
    ('body: "a" $', "unexpected character '$'", 1, 11),
    ('body: "a" \x00', "control character U+0000", 1, 11),
    ('body: "a"\x0c', "control character U+000C", 1, 10),
    ('body: "a"\rb: "c"', "carriage return", 1, 10),
    ('body: "a" // \u202e evil', "control character U+202E in a comment", 1, 14),
    ('body: "a" // é\x07', "control character U+0007 in a comment", 1, 15),
    ('body: a\na: b\nb: a', "rules body, a, b can never derive", 1, 1),
    ('body: "x" | a\na: b\nb: a', "rules a, b can never derive", 2, 1),
    ('body: "x" | a\na: body b\nb: b "y"', "rules a, b can never derive", 2, 1),
    ('body: x\nx: "(" x ")" | y\ny: y+', "rules body, x, y can never derive", 1, 1),
    ('body: "a"\nx: y\ny: "b"', "rules x, y cannot be reached", 2, 1),
]


@pytest.mark.parametrize(("text", "reason", "line", "column"), REFUSALS,
                         ids=[t for t, *_ in REFUSALS])
def test_refusals(text: str, reason: str, line: int, column: int) -> None:
    error = refused(text)
    assert reason in error.message
    assert (error.line, error.column) == (line, column), error.one_line()
    assert error.context is not None and error.context.endswith("^")


def test_refusal_offsets_are_utf8_bytes() -> None:
    error = refused('// ééé\nbody: "a" $')
    assert error.position == Position(2, 11, len("// ééé\nbody: \"a\" ".encode()))


def test_invalid_utf8_bytes() -> None:
    error = refused(b'body: "a"\n// \xff\xfe')
    assert "not valid UTF-8" in error.message
    assert error.position == Position(2, 4, 13)


def test_lone_surrogate_text() -> None:
    error = refused('body: "a" // \ud800')
    assert "surrogate" in error.message
    assert error.position == Position(1, 14, 13)


def test_wrong_argument_types() -> None:
    with pytest.raises(TypeError):
        read_grammar(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        read_grammar("body: SYMBOL", limits={"max_rules": 3})  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["max_text_bytes", "max_rules", "max_group_depth",
                                   "max_literal_chars", "max_productions"])
@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "3"])
def test_limits_validated(field: str, bad: object) -> None:
    with pytest.raises(ValueError):
        GrammarLimits(**{field: bad})  # type: ignore[arg-type]


def test_group_depth_ceiling() -> None:
    GrammarLimits(max_group_depth=MAX_GROUP_DEPTH_CEILING)
    with pytest.raises(ValueError):
        GrammarLimits(max_group_depth=MAX_GROUP_DEPTH_CEILING + 1)


def test_default_limits() -> None:
    limits = GrammarLimits()
    assert (limits.max_text_bytes, limits.max_rules, limits.max_group_depth,
            limits.max_literal_chars, limits.max_productions) == (32_768, 256, 16, 64, 4_096)


# --------------------------------------------------------------------------------------
# Limits: exactly the limit accepted, one more refused


def padded(size: int) -> str:
    """A valid grammar of exactly ``size`` UTF-8 bytes (a 2-byte character in a comment)."""
    head = 'body: "a"\n// é'
    return head + "x" * (size - len(head.encode()))


@pytest.mark.parametrize("as_bytes", [False, True])
def test_text_bytes_limit(as_bytes: bool) -> None:
    limits = GrammarLimits(max_text_bytes=1000)
    ok, over = padded(1000), padded(1001)
    assert len(ok.encode()) == 1000
    read_grammar(ok.encode() if as_bytes else ok, limits=limits)
    error = refused(over.encode() if as_bytes else over, limits)
    assert "max_text_bytes" in error.message
    assert error.position == Position(2, 990, 1000)


def test_text_bytes_limit_counts_bytes_not_characters() -> None:
    limits = GrammarLimits(max_text_bytes=100)
    text = 'body: "a"\n//' + "é" * 45  # 57 characters, 102 bytes
    assert len(text) < 100 < len(text.encode())
    assert "max_text_bytes" in refused(text, limits).message


def test_text_bytes_limit_default_checked_before_scanning() -> None:
    text = "\x00" * (32_768 + 1)  # would be refused by the scanner at 1:1 otherwise
    assert "max_text_bytes" in refused(text).message
    refused("\x00" * 32_768)  # within the limit: the scanner refuses it instead


def chain(count: int) -> str:
    return "\n".join(["body: r1"] + [f"r{k}: r{k + 1}" for k in range(1, count - 1)]
                     + [f'r{count - 1}: "end"'])


def test_rules_limit() -> None:
    limits = GrammarLimits(max_rules=10)
    assert len(read_grammar(chain(10), limits=limits).rules) == 10
    error = refused(chain(11), limits)
    assert "max_rules" in error.message and (error.line, error.column) == (11, 1)
    assert len(read_grammar(chain(256)).rules) == 256
    assert "max_rules" in refused(chain(257)).message


def nested(depth: int, opener: str = "(", closer: str = ")") -> str:
    return "body: " + opener * depth + '"a"' + closer * depth


def test_group_depth_limit() -> None:
    read_grammar(nested(16))
    read_grammar(nested(16, "[", "]"))
    error = refused(nested(17))
    assert "max_group_depth" in error.message and (error.line, error.column) == (1, 7 + 16)
    read_grammar(nested(3), limits=GrammarLimits(max_group_depth=3))
    assert "max_group_depth" in refused(nested(4, "[", "]"),
                                         GrammarLimits(max_group_depth=3)).message


def test_literal_length_limit() -> None:
    read_grammar('body: "' + "a" * 64 + '"')
    error = refused('body: "' + "a" * 65 + '"')
    assert "max_literal_chars" in error.message and error.column == 7
    limits = GrammarLimits(max_literal_chars=3)
    read_grammar('body: ":ab"', limits=limits)
    assert "max_literal_chars" in refused('body: ":abc"', limits).message


def test_productions_limit() -> None:
    # "x"? makes 2 helper productions; body itself 1.
    text = 'body: ' + ' '.join(['"x"?'] * 10)  # 21 productions
    read_grammar(text, limits=GrammarLimits(max_productions=21))
    error = refused(text, GrammarLimits(max_productions=20))
    assert "max_productions" in error.message
    assert len(to_cfg(read_grammar(text)).productions) == 21
    # value adds nine productions
    read_grammar("body: value", limits=GrammarLimits(max_productions=10))
    refused("body: value", GrammarLimits(max_productions=9))


def test_productions_limit_checked_while_reading() -> None:
    # A flood of alternatives is stopped by the reader's lower bound, at the alternative
    # that crosses the limit, before the expansion runs.
    limits = GrammarLimits(max_productions=5)
    read_grammar("body: " + " | ".join(["SYMBOL"] * 5), limits=limits)
    error = refused("body: " + " | ".join(["SYMBOL"] * 6), limits)
    assert "max_productions" in error.message and error.column == 14 + 4 * 9  # fifth '|'


def test_productions_limit_default() -> None:
    ok = "body: " + " ".join(['"x"?'] * 2047) + "\n | SYMBOL"  # 1 + 2 * 2047 + 1 = 4096
    assert len(to_cfg(read_grammar(ok)).productions) == 4096
    error = refused(ok + "\n | STRING")
    assert "max_productions" in error.message and (error.line, error.column) == (3, 4)


# --------------------------------------------------------------------------------------
# Hostile inputs: refused quickly, never RecursionError


def short(k: int) -> str:
    """A three-letter rule name for ``k`` (< 26**3)."""
    return "".join(chr(97 + (k // 26**p) % 26) for p in (2, 1, 0))


HOSTILE: dict[str, str | bytes] = {
    "500-deep grouping": "body: " + "(" * 500 + '"a"' + ")" * 500,
    "500-deep optional": "body: " + "[" * 500 + '"a"' + "]" * 500,
    "3000-rule chain": chain(3000),
    "3000-rule chain within 32 KiB": "body:aaa\n" + "".join(f"{short(k)}:{short(k + 1)}\n"
                                                            for k in range(3000)),
    "64 KiB of text": 'body: "a"\n' + "// padding\n" * 6000,
    "64 KiB as bytes": ('body: "a"\n' + "// padding\n" * 6000).encode(),
    "run of quotes": '"' * 30_000,
    "run of quotes after a rule": 'body: ' + '"' * 30_000,
    "run of slashes": "/" * 30_000 + "\nbody x",
    "slash regex": "body: " + "/" * 1 + "a" * 30_000,
    "unclosed literal": 'body: "' + "a" * 30_000,
    "unclosed literal of backslashes": 'body: "' + "\\" * 30_000,
    "alternating quote backslash": 'body: ' + '"\\' * 15_000,
    "lark 1651 style": 'body: "' + '\\"' * 10_000 + '"',
    "many alternatives": "body: " + " | ".join(['"a"'] * 5000),
    "many optionals": "body: " + " ".join(['"a"?'] * 6000),
    "many groups": "body: " + " ".join(['("a" | "b")'] * 2600),
    "many alternatives over": "body: " + " | ".join(['"a"'] * 8000),
    "deep brackets unclosed": "body: " + "[" * 30_000,
    "closers only": "body: " + ")" * 30_000,
    "many rules on one line": "body: a " * 4000,
    "long name": "body: " + "a" * 32_000,
    "many newlines": "\n" * 32_000,
    "many pipes": "body: " + "|" * 32_000,
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_inputs_refused_quickly(name: str) -> None:
    """A bound on the reader's work (a quadratic or exponential path takes seconds), not a
    speed measurement: the best of three tries, the cyclic collector paused while each
    runs, so that a full collection of the whole suite's objects or a busy shared machine
    does not count as the reader's."""
    text = HOSTILE[name]
    tries = []
    for _ in range(3):
        gc.disable()
        try:
            began = time.process_time()
            with contextlib.suppress(GrammarError):
                read_grammar(text)
            tries.append(time.process_time() - began)
        finally:
            gc.enable()
    elapsed = min(tries)
    assert elapsed < HOSTILE_SECONDS, f"{name}: {elapsed:.3f}s"


@pytest.mark.parametrize("name", ["500-deep grouping", "3000-rule chain", "64 KiB of text",
                                  "3000-rule chain within 32 KiB", "many pipes",
                                  "run of quotes", "unclosed literal", "lark 1651 style",
                                  "many optionals", "many groups", "long name"])
def test_hostile_inputs_are_refusals(name: str) -> None:
    text = HOSTILE[name]
    assert isinstance(text, str), name  # (the one given as bytes is not among these)
    assert len(text.encode()) <= 32_768 or "KiB" in name or name == "3000-rule chain"
    error = refused(text)
    assert len(error.message) < 200 and len(error.context or "") < 250


def test_largest_accepted_grammars_are_fast() -> None:
    # Near every limit at once, and accepted: reading, to_cfg and to_lark stay fast.
    rules = ["body: " + " | ".join(f"r{k}" for k in range(1, 255))]
    rules += [f'r{k}: "k{k}" [(SYMBOL | ":x{k}")* "e"]' for k in range(1, 255)]
    text = "\n".join(rules)
    assert len(text.encode()) < 32_768
    began = time.process_time()
    source = read_grammar(text)
    to_cfg(source)
    to_lark(source)
    assert time.process_time() - began < 1.0


# --------------------------------------------------------------------------------------
# to_lark


def task_tokens() -> list[tuple[str, str]]:
    return [("LPAR", "("), ("LIT_0", "task"), ("KEYWORD", ":id"), ("STRING", '"t1"'),
            ("LIT_1", ":cmd"), ("LPAR", "("), ("LIT_4", "compute"), ("KEYWORD", ":n"),
            ("LPAR", "("), ("SYMBOL", "a"), ("INTEGER", "1"), ("RPAR", ")"), ("RPAR", ")"),
            ("LIT_2", ":resources"), ("LPAR", "("), ("KEYWORD", ":cpu"), ("INTEGER", "2"),
            ("RPAR", ")"), ("RPAR", ")")]


def test_to_lark_task_assignment_compiles_strict_and_parses() -> None:
    generated = to_lark(read_grammar((VECTORS / "task-assignment.lark").read_text()))
    assert generated.start == "p_body"
    assert generated.literals == {"LPAR": "(", "RPAR": ")", "LIT_0": "task", "LIT_1": ":cmd",
                                  "LIT_2": ":resources", "LIT_3": ":deadline",
                                  "LIT_4": "compute"}
    assert generated.value_rule == "cbcl_value"
    assert generated.rule_names == {"p_body": "body", "p_task": "task", "p_attr": "attr",
                                    "p_command": "command"}
    declare = [line for line in generated.text.splitlines() if line.startswith("%")]
    assert declare == ["%declare SYMBOL STRING INTEGER DECIMAL KEYWORD URI LPAR RPAR LIT_0 "
                       "LIT_1 LIT_2 LIT_3 LIT_4"]
    parser = compile_lark(generated.text, generated.start, parser="lalr", strict=True)
    tree = parser.parse(task_tokens())
    assert tree.data == "p_body"
    task = rule_node(tree.children[0])
    assert task.data == "p_task"
    # helper rules are spliced: the task node holds the attrs directly
    assert [c.type if isinstance(c, Token) else c.data for c in task.children] == [
        "LPAR", "LIT_0", "KEYWORD", "STRING", "p_attr", "p_attr", "RPAR"]
    command = rule_node(rule_node(task.children[4]).children[1])
    assert command.data == "p_command"
    value = rule_node(command.children[-2])
    assert value.data == "cbcl_value" and len(value.children) == 4
    with pytest.raises(lark.exceptions.UnexpectedInput):
        parser.parse(task_tokens()[:-1])


def test_to_lark_layered_expression_compiles_strict() -> None:
    generated = to_lark(read_grammar((VECTORS / "layered-expression.lark").read_text()),
                        prefix="q_")
    assert generated.value_rule is None and "cbcl_value" not in generated.text
    parser = compile_lark(generated.text, "q_body", parser="lalr", strict=True)
    tree = parser.parse([("INTEGER", "1"), ("LIT_0", "+"), ("LPAR", "("), ("INTEGER", "2"),
                         ("LIT_1", "*"), ("INTEGER", "3"), ("RPAR", ")")])
    assert tree.data == "q_body" and rule_node(tree.children[0]).data == "q_sum"


@pytest.mark.parametrize("name", ["ambiguous-expression.lark", "dangling-else.lark",
                                  "classic-lr1-not-lalr1.lark"])
def test_to_lark_conflicting_vectors_rejected_by_strict_lark(name: str) -> None:
    generated = to_lark(read_grammar((VECTORS / name).read_text()))
    compile_lark(generated.text, generated.start, parser="earley")
    with pytest.raises(lark.exceptions.GrammarError):
        compile_lark(generated.text, generated.start, parser="lalr", strict=True)


def test_to_lark_aliases_inline_and_helpers() -> None:
    source = read_grammar('body: item+ -> items\n    | -> none\n?item: SYMBOL | "(" item ")"')
    generated = to_lark(source)
    assert generated.text.splitlines()[2:] == [
        "p_body: _p_body_plus_0 -> p_items",
        "    | -> p_none",
        "_p_body_plus_0: p_item",
        "    | _p_body_plus_0 p_item",
        "?p_item: SYMBOL",
        "    | LPAR p_item RPAR",
    ]
    assert generated.rule_names == {"p_body": "body", "p_items": "items", "p_none": "none",
                                    "p_item": "item"}
    parser = compile_lark(generated.text, generated.start, parser="lalr", strict=True)
    tree = parser.parse([("SYMBOL", "a"), ("LPAR", "("), ("SYMBOL", "b"), ("RPAR", ")")])
    assert tree.data == "p_items"
    assert tree.children[0] == Token("SYMBOL", "a")  # ?item inlined
    assert rule_node(tree.children[1]).data == "p_item"  # three children: kept
    assert parser.parse([]).data == "p_none"


def test_to_lark_never_echoes_author_text() -> None:
    source = read_grammar('// %import evil\nbody: "task" // /regex/ ~ {x}\n')
    text = to_lark(source).text
    assert "evil" not in text and "regex" not in text and '"' not in text
    assert "task" not in text


def test_to_lark_prefix_validation() -> None:
    source = read_grammar("body: value")
    for bad in ["P_", "_p", "1p", "p-", "p p", None]:
        with pytest.raises(ValueError):
            to_lark(source, prefix=bad)  # type: ignore[arg-type]
    assert to_lark(source, prefix="").start == "body"
    with pytest.raises(ValueError):
        to_lark(read_grammar("body: cbcl_value\ncbcl_value: value"), prefix="")


def test_to_lark_exponential_ebnf_stays_linear() -> None:
    # Lark itself would distribute these optionals into 2**24 alternatives.
    source = read_grammar("body: " + " ".join(f'"a{k}"?' for k in range(24)))
    generated = to_lark(source)
    began = time.process_time()
    compile_lark(generated.text, generated.start, parser="lalr", strict=True)
    assert time.process_time() - began < 5.0


# --------------------------------------------------------------------------------------
# Properties


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.binary()))
def test_arbitrary_input_gives_source_or_grammar_error(data: str | bytes) -> None:
    try:
        result = read_grammar(data)
    except GrammarError as error:
        assert error.position is not None and error.verdict == "rejected"
    else:
        assert isinstance(result, GrammarSource)


GRAMMARISH = st.text(alphabet=list('body:a"xSYMBOLvalue()[]|?*+->\n /%~{}.:\\;#é1_'),
                     max_size=80)


@settings(max_examples=500, deadline=None)
@given(st.one_of(GRAMMARISH, GRAMMARISH.map(lambda s: "body: " + s)))
def test_grammar_like_input_gives_source_or_grammar_error(text: str) -> None:
    try:
        source = read_grammar(text)
    except GrammarError as error:
        assert error.position is not None and error.position.line >= 1
        assert error.context is not None
    else:
        to_cfg(source)
        to_lark(source)


# Generated valid grammars ---------------------------------------------------------------

LITERALS = ["(", ")", "a", "b", ":k", ":m", "+", "go"]
BASES = ["SYMBOL", "STRING", "INTEGER", "KEYWORD", "value"]


def item_strategy(rule_names: list[str]) -> st.SearchStrategy[str]:
    leaf = st.one_of(st.sampled_from([f'"{t}"' for t in LITERALS]),
                     st.sampled_from(BASES + rule_names))

    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        seq = st.lists(inner, min_size=1, max_size=3).map(" ".join)
        alts = st.lists(seq, min_size=1, max_size=3).map(" | ".join)
        return st.one_of(alts.map(lambda s: f"({s})"), alts.map(lambda s: f"[{s}]"),
                         st.tuples(inner, st.sampled_from("?*+")).map(
                             lambda t: t[0] if t[0][-1] in "?*+" else t[0] + t[1]))

    return st.recursive(leaf, extend, max_leaves=6)


@st.composite
def valid_grammars(draw: st.DrawFn) -> str:
    names = ["body"] + [f"r{k}" for k in range(draw(st.integers(0, 3)))]
    lines = []
    for index, name in enumerate(names):
        later = names[index + 1:]
        alternatives = []
        for _ in range(draw(st.integers(1, 3))):
            items = draw(st.lists(item_strategy(names), max_size=4))
            alias = draw(st.sampled_from(["", "", " -> al", " -> " + name]))
            alternatives.append(" ".join(items) + alias)
        # guarantee productivity and reachability
        alternatives.append('"end"' if not later else " ".join(later))
        modifier = draw(st.sampled_from(["", "?"]))
        lines.append(f"{modifier}{name}: " + "\n    | ".join(alternatives))
    return "\n".join(lines) + "\n"


def derive(grammar: Grammar, rng: random.Random) -> list[str]:
    """A random sentence of ``grammar`` (terminal names), depth bounded."""
    by_lhs: dict[str, list[Production]] = {}
    for production in grammar.productions:
        by_lhs.setdefault(production.lhs, []).append(production)
    # rank nonterminals by how soon they become productive, for a terminating choice
    finite: dict[str, Production] = {}
    changed = True
    while changed:
        changed = False
        for production in grammar.productions:
            if production.lhs not in finite and all(
                    s in grammar.terminals or s in finite for s in production.rhs):
                finite[production.lhs] = production
                changed = True
    out: list[str] = []
    stack: list[tuple[str, int]] = [(grammar.start, 0)]
    while stack:
        symbol, depth = stack.pop()
        if symbol in grammar.terminals:
            out.append(symbol)
            continue
        production = (rng.choice(by_lhs[symbol]) if depth < 5 and len(out) < 40
                      else finite[symbol])
        stack.extend((s, depth + 1) for s in reversed(production.rhs))
    return out


@pytest.mark.slow
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_grammars(), st.randoms(use_true_random=False))
def test_generated_grammars_round_trip(text: str, rng: random.Random) -> None:
    source = read_grammar(text)
    grammar = to_cfg(source)
    # BNF invariants
    nonterminals = grammar.nonterminals
    for production in grammar.productions:
        for symbol in production.rhs:
            assert symbol in nonterminals or symbol in grammar.terminals
    assert grammar.synthetic <= nonterminals
    assert all(name.startswith("__") for name in grammar.synthetic)
    assert all(name in grammar.display for name in grammar.synthetic)
    for terminal in grammar.terminals - {"SYMBOL", "STRING", "INTEGER", "DECIMAL", "KEYWORD",
                                         "URI", "LPAR", "RPAR"}:
        assert terminal.startswith("LIT_") and terminal in grammar.overlaps
    # the lark text is valid, and accepts what the BNF derives
    generated = to_lark(source)
    try:
        compile_lark(generated.text, generated.start, parser="lalr")
    except lark.exceptions.GrammarError as error:
        if "Rules defined twice" in str(error):
            # lark refuses one expansion given twice with different aliases; such a
            # grammar is ambiguous (a reduce/reduce conflict for the analyser) anyway
            pairs = [(p.lhs, p.rhs) for p in grammar.productions]
            assert len(set(pairs)) < len(pairs)
            return
        assert "Reduce/Reduce" in str(error)
    earley = compile_lark(generated.text, generated.start, parser="earley")
    sentence = derive(grammar, rng)
    earley.parse([(name, generated.literals.get(name, "x")) for name in sentence])


def test_walk_is_pre_order_in_source_order() -> None:
    source = read_grammar('body: "(" "a" [x | "b"]* (":k" y & [":m" "c"]) ")"\n'
                          'x: SYMBOL\ny: "(" "z" ")"')
    items = source.rule("body").alternatives[0].items
    shown = [i.text if isinstance(i, Literal) else i.name if isinstance(i, Reference)
             else type(i).__name__ for i in walk(items)]
    assert shown == ["(", "a", "Repeat", "Group", "x", "b", "KeywordSet", "y", "c", ")"]
    places = list(walk_positions(items))
    assert [sequence[index] for sequence, index in places] == list(walk(items))
    assert places[0] == (items, 0) and places[-1] == (items, len(items) - 1)
    assert list_end(items, 0) == len(items)
    assert list_end(items[:-1], 0) is None
    assert [len(s) for s in inner_sequences(items[2])] == [1]  # the repeated group
    assert inner_sequences(items[0]) == ()


def test_walk_keeps_no_python_frames_per_level() -> None:
    depth = MAX_GROUP_DEPTH_CEILING
    text = "body: " + "[" * depth + '"x"' + "]" * depth
    source = read_grammar(text, limits=GrammarLimits(max_group_depth=depth))
    items = source.rule("body").alternatives[0].items
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack()) + 20)
    try:
        found = list(walk(items))
    finally:
        sys.setrecursionlimit(limit)
    assert len(found) == depth + 1 and isinstance(found[-1], Literal)
