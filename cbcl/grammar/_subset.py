"""The descriptor grammar subset (draft §4): a linear-time reader and two code generators.

Theory of operation
-------------------
A peer's grammar text is untrusted, so it never reaches lark's grammar loader (whose lexer
can take exponential time, PR #1651, and whose ``%import`` reads files). Instead:

1. :func:`read_grammar` checks ``max_text_bytes`` on the raw input, then one hand-written
   character scanner (:class:`_Scanner`) walks the text once, left to right, refusing every
   construct outside the subset at the character that introduces it (``/`` of a regular
   expression, ``%`` of a directive, ``~``, ``{``, ``.`` of a priority or range, ...). Each
   character is examined a bounded number of times; the only regular expressions are
   anchored character classes without nested quantifiers. Literals are cut off at
   ``max_literal_chars``.
2. A parser with an *explicit stack* of open groups (no recursion) builds the EBNF syntax
   tree (:class:`GrammarSource`). ``max_group_depth`` is checked when a group opens,
   ``max_rules`` when a rule header is read, and a lower bound on ``max_productions`` as
   alternatives and operators are read, each before the work it protects.
3. Whole-grammar checks follow: a ``body`` rule exists, every reference is defined, the
   BNF expansion stays within ``max_productions`` (checked as each production is made),
   every rule is productive and every rule is reachable from ``body``. Productivity and
   reachability are the classic linear worklist algorithms over the expansion.
4. :func:`to_cfg` and :func:`to_lark` are total on a :class:`GrammarSource` that
   :func:`read_grammar` returned. Both render the *same* BNF expansion (:class:`_Expansion`):
   ``to_cfg`` as a :class:`~cbcl.grammar._cfg.Grammar` for the LR analyser, ``to_lark`` as lark text
   generated from the tree (the author's text is never echoed). Every helper nonterminal of
   the expansion becomes a lark rule whose name starts with ``_``, which lark splices into
   its parent: trees show only the author's names, as ``_cfg`` promises. The lark text
   contains no EBNF operators on purpose: lark expands ``x?``, ``[x]`` and ``(a | b)`` by
   distributing them into their rule's alternatives, which is exponential (sixteen ``"a"?``
   in one rule take over a second to compile, and every further one doubles it) and would
   also make lark's LALR table differ from the one the analyser checked.

Recursion appears only in the tree walkers that build something per item (the BNF
expansion of steps 3 and 4, the renderer, item heights), whose depth is bounded by
``max_group_depth`` (itself capped at :data:`MAX_GROUP_DEPTH_CEILING`). The plain
traversal of the tree, :func:`walk` (and :func:`walk_positions`), keeps an explicit stack;
it is the one the checks of step 3 and the visitors in the layers above share.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

from cbcl.core._errors import GrammarError, Position
from cbcl.grammar._cfg import Grammar, Production

__all__ = [
    "BASE_NAMES",
    "BASE_TERMINAL_NAMES",
    "LARK_VALUE_RULE",
    "MAX_GROUP_DEPTH_CEILING",
    "Alternative",
    "GrammarLimits",
    "GrammarSource",
    "Group",
    "Item",
    "KeywordMember",
    "KeywordSet",
    "LarkGrammar",
    "Literal",
    "Reference",
    "Repeat",
    "Rule",
    "SetMember",
    "derivation_heights",
    "inner_sequences",
    "item_height",
    "list_end",
    "read_grammar",
    "render_alternatives",
    "render_item",
    "sequence_height",
    "to_cfg",
    "to_lark",
    "walk",
    "walk_positions",
]

#: The general terminals a descriptor grammar may name.
BASE_TERMINAL_NAMES: tuple[str, ...] = ("SYMBOL", "STRING", "INTEGER", "DECIMAL", "KEYWORD",
                                        "URI")
#: ``NUMBER`` matches an ``INTEGER`` or a ``DECIMAL`` (it is expanded to a helper rule).
NUMBER = "NUMBER"
#: Every base name: the general terminals, ``NUMBER`` and ``value`` (any CBCL value).
BASE_NAMES: frozenset[str] = frozenset(BASE_TERMINAL_NAMES) | {"value", NUMBER}
#: The prefix of the terminal that selects a start rule when a grammar has several
#: (``START_AWARD`` for ``award``); fed before a body's first token.
START_TERMINAL_PREFIX = "START_"
#: The lark rule that :func:`to_lark` emits for the base name ``value``.
LARK_VALUE_RULE = "cbcl_value"
_LARK_VALUE_STAR = "_cbcl_value_star"
#: ``GrammarLimits.max_group_depth`` may not exceed this (it bounds the tree walkers'
#: recursion, about three Python frames a level).
MAX_GROUP_DEPTH_CEILING = 100

_START = "body"
_VALUE = "value"
_VALUE_STAR = "__value_star"
_NUMBER_RULE = "__number"
_MULTI_START = "__start"
_LPAR, _RPAR = "LPAR", "RPAR"

_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_DIGITS = frozenset("0123456789")
_NAME_START = _LETTERS | frozenset("+-*/<>=!?_.")
_NAME_REST = _LETTERS | _DIGITS | frozenset("+-*/<>=!?_.@%&")
_IDENT_START = _LETTERS | {"_"}
_IDENT_REST_RE = re.compile(r"[A-Za-z0-9_]*")
_RULE_NAME_RE = re.compile(r"[a-z][a-z0-9_]*\Z")
_PREFIX_RE = re.compile(r"(?:[a-z][a-z0-9_]*)?\Z")
# Characters refused even inside comments: C0/C1 controls other than HT, and the bidi
# controls of draft §1 (a comment is where a "trojan source" reordering would hide).
_COMMENT_FORBIDDEN_RE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_PUNCTUATION = frozenset(":|&()[]*+?")


# --------------------------------------------------------------------------------------
# Limits and the syntax tree


@dataclass(frozen=True, slots=True)
class GrammarLimits:
    """Limits on one descriptor grammar; each is checked before the work it protects.

    * ``max_text_bytes`` (32 KiB): UTF-8 size of the text, checked before scanning;
    * ``max_rules`` (256): rule definitions, checked as each rule header is read;
    * ``max_group_depth`` (16): nesting of ``( )`` and ``[ ]``, checked as a group opens
      (at most :data:`MAX_GROUP_DEPTH_CEILING`);
    * ``max_literal_chars`` (64): characters between a literal's quotes, checked while
      scanning it;
    * ``max_productions`` (4,096): BNF productions after EBNF expansion (each alternative,
      and the helper productions of every ``?``, ``*``, ``+``, ``[ ]`` and multi-alternative
      group, plus nine for ``value`` when used), checked as each production is made.
      Expansion is linear, so this bounds the LR analyser's input, not the reader's work;
    * ``max_set_members`` (32): members of one keyword set (``(":a" X & ":b" Y)``),
      checked as each member is read.

    Raises ``ValueError`` (at construction) for a limit that is not a positive ``int`` or a
    depth above the ceiling.
    """

    max_text_bytes: int = 32_768
    max_rules: int = 256
    max_group_depth: int = 16
    max_literal_chars: int = 64
    max_productions: int = 4_096
    max_set_members: int = 32

    def __post_init__(self) -> None:
        for name in ("max_text_bytes", "max_rules", "max_group_depth", "max_literal_chars",
                     "max_productions", "max_set_members"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"GrammarLimits.{name} must be a positive int, got {value!r}")
        if self.max_group_depth > MAX_GROUP_DEPTH_CEILING:
            raise ValueError(f"GrammarLimits.max_group_depth may not exceed "
                             f"{MAX_GROUP_DEPTH_CEILING}, got {self.max_group_depth}")


_DEFAULT_LIMITS = GrammarLimits()


@dataclass(frozen=True, slots=True)
class Literal:
    """A string literal; ``text`` is without the quotes (``task``, ``:cmd``, ``(``)."""

    text: str
    position: Position

    @property
    def is_keyword(self) -> bool:
        return self.text.startswith(":")


@dataclass(frozen=True, slots=True)
class Reference:
    """A name in an expansion: a rule, a base terminal (``SYMBOL``) or ``value``."""

    name: str
    position: Position

    @property
    def is_base(self) -> bool:
        return self.name in BASE_NAMES


@dataclass(frozen=True, slots=True)
class Group:
    """``( a | b )``, or ``[ a | b ]`` when ``optional``. Never empty."""

    alternatives: tuple[Alternative, ...]
    optional: bool
    position: Position


@dataclass(frozen=True, slots=True)
class Repeat:
    """``item?``, ``item*`` or ``item+`` (``op`` is the operator); ``position`` is the
    item's."""

    item: Item
    op: str
    position: Position


@dataclass(frozen=True, slots=True)
class KeywordMember:
    """One member of a keyword set: ``keyword`` (the literal's text, ``":amount"``) and the
    one item after it; ``optional`` when written ``[":k" X]`` or ``(":k" X)?``."""

    keyword: str
    item: Item
    optional: bool
    position: Position


@dataclass(frozen=True, slots=True)
class KeywordSet:
    """``(":a" X & ":b" Y & [":c" Z])``: its members in any order, each at most once, every
    required member exactly once. Members start with distinct keywords."""

    members: tuple[KeywordMember, ...]
    position: Position


Item = Literal | Reference | Group | Repeat | KeywordSet


@dataclass(frozen=True, slots=True)
class Alternative:
    """One alternative: a sequence of items (empty for epsilon) and, at a rule's top level
    only, the ``-> alias``."""

    items: tuple[Item, ...]
    position: Position
    alias: str | None = None
    alias_position: Position | None = None


@dataclass(frozen=True, slots=True)
class Rule:
    """``name: ...``; ``inline`` is lark's ``?name:`` (the node is replaced by its child
    when it has exactly one). ``position`` is the name's."""

    name: str
    alternatives: tuple[Alternative, ...]
    position: Position
    inline: bool = False


@dataclass(frozen=True, slots=True)
class GrammarSource:
    """A descriptor grammar read and validated by :func:`read_grammar`: the rules in
    source order and the limits it was read under."""

    rules: tuple[Rule, ...]
    limits: GrammarLimits = _DEFAULT_LIMITS
    #: The start rules, in order (``("body",)`` unless a descriptor names others).
    starts: tuple[str, ...] = (_START,)

    @property
    def start(self) -> str:
        """The start symbol of the BNF expansion: the only start rule, or a helper that
        chooses among several by a leading ``START_<RULE>`` terminal."""
        return self.starts[0] if len(self.starts) == 1 else _MULTI_START

    def rule(self, name: str) -> Rule:
        """The rule called ``name``; raises ``KeyError`` if there is none."""
        for rule in self.rules:
            if rule.name == name:
                return rule
        raise KeyError(name)


@dataclass(frozen=True, slots=True)
class LarkGrammar:
    """Lark grammar text generated by :func:`to_lark`.

    ``literals`` maps each declared literal terminal (``LPAR``, ``RPAR``, ``LIT_<n>``) to its
    text. ``value_rule`` is the lark rule standing for ``value`` (``None`` if unused);
    ``rule_names`` maps every lark rule or alias name that appears in trees to the author's
    name (``p_task`` -> ``task``).
    """

    text: str
    start: str
    literals: Mapping[str, str]
    value_rule: str | None = None
    rule_names: Mapping[str, str] = field(default_factory=dict)
    #: Keyword-set rule (its lark name) -> its members.
    keyword_sets: Mapping[str, tuple[SetMember, ...]] = field(default_factory=dict)
    #: Start rule -> the terminal that selects it (empty with a single start rule).
    start_terminals: Mapping[str, str] = field(default_factory=dict)


# --------------------------------------------------------------------------------------
# Errors


def _context(text: str, line: int, column: int) -> str:
    """The input line at ``line`` (windowed around ``column``) and a caret under it."""
    start = 0
    for _ in range(line - 1):
        nl = text.find("\n", start)
        if nl < 0:
            return ""
        start = nl + 1
    end = text.find("\n", start)
    row = text[start:] if end < 0 else text[start:end]
    row = row.rstrip("\r")
    col = column - 1
    lo = max(0, col - 60)
    hi = min(len(row), col + 40)
    shown = "".join(c if c.isprintable() else " " if c == "\t" else "?" for c in row[lo:hi])
    lead = "..." if lo > 0 else ""
    tail = "..." if hi < len(row) else ""
    return f"{lead}{shown}{tail}\n{' ' * (len(lead) + col - lo)}^"


def _refuse(message: str, position: Position, text: str) -> GrammarError:
    context = _context(text, position.line, position.column) if position.line else None
    return GrammarError(message, verdict="rejected", position=position, context=context)


# --------------------------------------------------------------------------------------
# Scanning


class _Token(NamedTuple):
    kind: str  # "name" "lit" "nl" "eof" "->" or one character of _PUNCTUATION
    value: str
    at: int  # the index in the text (not ``index``, which would shadow tuple.index)
    line: int
    line_start: int
    extra: int

    @property
    def position(self) -> Position:
        return Position(self.line, self.at - self.line_start + 1, self.at + self.extra)


def _literal_problem(text: str) -> str | None:
    """Why ``text`` cannot be a literal (``None`` if it can)."""
    if text in ("(", ")"):
        return None
    if not text.isascii():
        return f'"{text}" is not ASCII; a literal must be a CBCL symbol or keyword'
    if "\\" in text:
        return "escapes are not allowed in literals"
    keyword = text.startswith(":")
    name = text[1:] if keyword else text
    if not keyword and (name[0] in _DIGITS
                        or (name[0] in "+-." and len(name) > 1 and name[1] in _DIGITS)):
        return (f'"{text}" reads as a number, not a symbol; use INTEGER or DECIMAL for '
                f'numbers')
    if not name or name[0] not in _NAME_START or any(c not in _NAME_REST for c in name):
        return (f'"{text}" is not "(", ")", a symbol or a keyword; a literal must be one '
                f'of these')
    return None


class _Scanner:
    """Produces tokens on demand, tracking line, column and UTF-8 byte offset."""

    def __init__(self, text: str, limits: GrammarLimits) -> None:
        self.text = text
        self.n = len(text)
        self.i = 0
        self.line = 1
        self.line_start = 0
        self.extra = 0  # UTF-8 bytes beyond one per character so far (comments only)
        self.limits = limits
        self.pushed: _Token | None = None

    def pos(self, index: int) -> Position:
        """Position of ``index``, which must lie on the current line."""
        return Position(self.line, index - self.line_start + 1, index + self.extra)

    def fail(self, message: str, index: int) -> GrammarError:
        return _refuse(message, self.pos(index), self.text)

    def push_back(self, token: _Token) -> None:
        self.pushed = token

    def next(self) -> _Token:
        if self.pushed is not None:
            token, self.pushed = self.pushed, None
            return token
        text, n = self.text, self.n
        while True:
            i = self.i
            if i >= n:
                return _Token("eof", "", i, self.line, self.line_start, self.extra)
            c = text[i]
            if c == " " or c == "\t":
                self.i = i + 1
            elif c == "\n":
                token = _Token("nl", c, i, self.line, self.line_start, self.extra)
                self._blank(i)
                return token
            elif c == "\r":
                if i + 1 < n and text[i + 1] == "\n":
                    self.i = i + 1
                else:
                    raise self.fail("carriage return not followed by a line feed", i)
            elif c == "/" and i + 1 < n and text[i + 1] == "/":
                self._comment(i)
            elif c in _PUNCTUATION:
                self.i = i + 1
                return _Token(c, c, i, self.line, self.line_start, self.extra)
            elif c == "-" and i + 1 < n and text[i + 1] == ">":
                self.i = i + 2
                return _Token("->", "->", i, self.line, self.line_start, self.extra)
            elif c == '"':
                return self._literal(i)
            elif c in _IDENT_START:
                # (the pattern is a `*`: it always matches)
                end = _IDENT_REST_RE.match(text, i + 1).end()  # type: ignore[union-attr]
                self.i = end
                return _Token("name", text[i:end], i, self.line, self.line_start, self.extra)
            else:
                raise self.fail(self._unexpected(c, i), i)

    def _blank(self, i: int) -> None:
        """Consumes the line feed at ``i`` and any blank or comment lines after it, so that a
        run of them makes one ``nl`` token."""
        text, n = self.text, self.n
        while i < n:
            c = text[i]
            if c == "\n":
                i += 1
                self.line += 1
                self.line_start = i
            elif c in " \t" or (c == "\r" and i + 1 < n and text[i + 1] == "\n"):
                i += 1
            elif c == "/" and i + 1 < n and text[i + 1] == "/":
                self._comment(i)
                i = self.i
            else:
                break
        self.i = i

    def _comment(self, i: int) -> None:
        text = self.text
        end = text.find("\n", i)
        if end < 0:
            end = self.n
        if end > i and end < self.n and text[end - 1] == "\r":
            end -= 1
        body = text[i:end]
        bad = _COMMENT_FORBIDDEN_RE.search(body)
        if bad is not None:
            k = bad.start()
            char_index = i + k
            extra = len(body[:k].encode("utf-8")) - k
            position = Position(self.line, char_index - self.line_start + 1,
                                char_index + self.extra + extra)
            raise _refuse(f"control character U+{ord(body[k]):04X} in a comment", position,
                          text)
        if not body.isascii():
            self.extra += len(body.encode("utf-8")) - len(body)
        self.i = end

    def _literal(self, i: int) -> _Token:
        text, n = self.text, self.n
        limit = self.limits.max_literal_chars
        j = i + 1
        while True:
            if j >= n or text[j] == "\n":
                raise self.fail("unterminated literal (a literal ends on its own line)", i)
            c = text[j]
            if c == '"':
                break
            if c == "\\":
                raise self.fail("escapes are not allowed in literals", j)
            if j - i > limit:
                raise self.fail(f"literal longer than {limit} characters "
                                f"(max_literal_chars)", i)
            j += 1
        body = text[i + 1:j]
        after = j + 1
        self.i = after
        if after < n:
            c = text[after]
            if c in _IDENT_START or c in _DIGITS:
                raise self.fail('literal flags ("x"i) are not in the grammar subset', after)
            if c == ".":
                raise self.fail(self._unexpected(c, after), after)
        if not body:
            raise self.fail('the empty literal "" is not allowed', i)
        problem = _literal_problem(body)
        if problem is not None:
            raise self.fail(problem, i)
        return _Token("lit", body, i, self.line, self.line_start, self.extra)

    def _unexpected(self, c: str, i: int) -> str:
        text, n = self.text, self.n
        nxt = text[i + 1] if i + 1 < n else ""
        if c == "/":
            return "regular expressions (/.../) are not in the grammar subset"
        if c == "%":
            j = i + 1
            while j < n and j < i + 40 and text[j] in _LETTERS:
                j += 1
            word = text[i:j]
            return (f"directives ({word}) are not in the grammar subset" if j > i + 1
                    else "directives (%...) are not in the grammar subset")
        if c == "~":
            return "repetition counts (~) are not in the grammar subset"
        if c in "{}":
            return "templates (name{...}) are not in the grammar subset"
        if c == ".":
            if nxt == ".":
                return 'ranges ("a".."z") are not in the grammar subset'
            if nxt in _DIGITS or nxt == "-":
                return "priorities (.N) are not in the grammar subset"
            return "unexpected '.'"
        if c == "!":
            return "the ! rule modifier is not in the grammar subset"
        if c == "#":
            return "'#' comments are not in the grammar subset; use //"
        if c in _DIGITS:
            return "unexpected number (priorities and repetition counts are not in the subset)"
        if c == "-":
            return "unexpected '-' (an alias is written -> name)"
        if not c.isascii():
            return f"non-ASCII character U+{ord(c):04X} outside a comment"
        if not c.isprintable():
            return f"unexpected control character U+{ord(c):04X}"
        return f"unexpected character {c!r}"


# --------------------------------------------------------------------------------------
# Parsing


@dataclass(slots=True)
class _Frame:
    opener: str  # "(" or "[", or "" at the rule's top level
    position: Position
    alternatives: list[Alternative]
    items: list[Item]
    separator: Position  # where the current alternative began (after ":", "|" or opener)
    joiner: str = ""  # "|" or "&" once the group has used one


_CLOSERS = {"(": ")", "[": "]"}


class _Parser:
    def __init__(self, text: str, limits: GrammarLimits) -> None:
        self.text = text
        self.limits = limits
        self.scanner = _Scanner(text, limits)
        # A lower bound on the BNF productions so far (one per top-level alternative, counted
        # at the ':' or '|' that begins it, one per postfix operator or [ ], one per
        # alternative of a multi-alternative group), so that max_productions stops a flood
        # of alternatives while it is being read.
        self.productions = 0

    def fail(self, message: str, position: Position) -> GrammarError:
        return _refuse(message, position, self.text)

    def count(self, productions: int, position: Position) -> None:
        self.productions += productions
        if self.productions > self.limits.max_productions:
            raise self.fail(f"the grammar expands to more than {self.limits.max_productions} "
                            f"BNF productions (max_productions)", position)

    def skip_newlines(self) -> _Token:
        token = self.scanner.next()
        while token.kind == "nl":
            token = self.scanner.next()
        return token

    def rules(self) -> tuple[Rule, ...]:
        rules: list[Rule] = []
        defined: dict[str, Position] = {}
        while True:
            token = self.skip_newlines()
            if token.kind == "eof":
                return tuple(rules)
            rules.append(self.rule(token, rules, defined))

    def rule(self, token: _Token, rules: list[Rule], defined: dict[str, Position]) -> Rule:
        inline = False
        if token.kind == "?":
            name_token = self.scanner.next()
            if name_token.kind != "name" or name_token.at != token.at + 1:
                raise self.fail("expected a rule name right after '?'", token.position)
            inline, token = True, name_token
        if token.kind != "name":
            raise self.fail(f"expected a rule definition (name: ...), found "
                            f"{_describe(token)}", token.position)
        name = token.value
        colon = self.scanner.next()
        if _is_terminal_like(name):
            if colon.kind == ":":
                raise self.fail(f"terminal definitions ({_clip(name)}: ...) are not in the grammar "
                                f"subset", token.position)
            raise self.fail(f"expected a rule definition (name: ...), found {_clip(name)}",
                            token.position)
        if colon.kind != ":":
            raise self.fail(f"expected ':' after the rule name {_clip(name)}, found "
                            f"{_describe(colon)}", colon.position)
        if len(rules) >= self.limits.max_rules:
            raise self.fail(f"more than {self.limits.max_rules} rules (max_rules)",
                            token.position)
        problem = _rule_name_problem(name, "rule")
        if problem is not None:
            raise self.fail(problem, token.position)
        if name in defined:
            first = defined[name]
            raise self.fail(f"rule {_clip(name)} is defined twice (first at {first})",
                            token.position)
        defined[name] = token.position
        return Rule(name, self.expansions(colon.position), token.position, inline)

    def expansions(self, colon: Position) -> tuple[Alternative, ...]:
        """Reads alternatives up to the end of the rule, with an explicit group stack."""
        scanner = self.scanner
        text = self.text
        stack: list[_Frame] = []
        frame = _Frame("", colon, [], [], colon)
        alias: tuple[str, Position] | None = None
        can_repeat = False  # the last thing read was an item with no postfix operator yet
        self.count(1, colon)
        while True:
            token = scanner.next()
            kind = token.kind
            if kind == "nl":
                token = self.skip_newlines()
                kind = token.kind
                if kind != "|":
                    scanner.push_back(token)
                    kind = "eof"
            if alias is not None and kind not in ("|", "eof"):
                raise self.fail("an alias (-> name) must end its alternative", token.position)
            if kind in ("name", "lit"):
                frame.items.append(self.atom(token))
                can_repeat = True
            elif kind in ("(", "["):
                if len(stack) >= self.limits.max_group_depth:
                    raise self.fail(f"groups nested more than {self.limits.max_group_depth} "
                                    f"deep (max_group_depth)", token.position)
                stack.append(frame)
                frame = _Frame(kind, token.position, [], [], token.position)
                can_repeat = False
            elif kind in (")", "]"):
                if not stack:
                    raise self.fail(f"unmatched '{kind}'", token.position)
                if _CLOSERS[frame.opener] != kind:
                    raise self.fail(f"'{kind}' does not close the '{frame.opener}' opened at "
                                    f"{frame.position}", token.position)
                _close_alternative(frame, None)
                if all(not alt.items for alt in frame.alternatives):
                    raise self.fail("empty group", frame.position)
                group: Item
                if frame.joiner == "&":
                    if frame.opener == "[":
                        raise self.fail("a keyword set cannot be optional as a whole; make "
                                        "its members optional with [ ]", frame.position)
                    group = self.keyword_set(frame)
                else:
                    group = Group(tuple(frame.alternatives), frame.opener == "[",
                                  frame.position)
                    if group.optional or len(group.alternatives) > 1:
                        self.count(group.optional + len(group.alternatives), token.position)
                frame = stack.pop()
                frame.items.append(group)
                can_repeat = True
            elif kind in ("?", "*", "+"):
                if not can_repeat:
                    raise self.fail(f"'{kind}' must follow a name, literal or group (one "
                                    f"operator per item)", token.position)
                nxt = token.at + 1
                if kind == "?" and nxt < len(text) and text[nxt] in _IDENT_START:
                    raise self.fail("'?' directly before a name is a rule modifier; write "
                                    "'x? y' with a space", token.position)
                last = frame.items[-1]
                if isinstance(last, KeywordSet):
                    raise self.fail(f"'{kind}' cannot follow a keyword set: its members "
                                    f"already come in any order; make a member optional "
                                    f"with [ ]", token.position)
                frame.items[-1] = Repeat(last, kind, last.position)
                self.count(1, token.position)
                can_repeat = False
            elif kind == "&":
                if not stack:
                    raise self.fail("a keyword set (\":a\" X & \":b\" Y) must be written "
                                    "in parentheses", token.position)
                if frame.joiner == "|":
                    raise self.fail("'&' and '|' cannot be mixed in one group; put the "
                                    "alternatives in a group of their own", token.position)
                frame.joiner = "&"
                _close_alternative(frame, None)
                if len(frame.alternatives) >= self.limits.max_set_members:
                    raise self.fail(f"a keyword set with more than "
                                    f"{self.limits.max_set_members} members "
                                    f"(max_set_members)", token.position)
                frame.separator = token.position
                can_repeat = False
            elif kind == "|":
                if not stack:
                    self.count(1, token.position)
                elif frame.joiner == "&":
                    raise self.fail("'&' and '|' cannot be mixed in one group; put the "
                                    "alternatives in a group of their own", token.position)
                else:
                    frame.joiner = "|"
                _close_alternative(frame, alias)
                frame.separator = token.position
                alias = None
                can_repeat = False
            elif kind == "->":
                if stack:
                    raise self.fail("an alias (-> name) may only end a rule's top-level "
                                    "alternative, not one inside a group", token.position)
                target = scanner.next()
                if target.kind != "name":
                    raise self.fail(f"expected an alias name after '->', found "
                                    f"{_describe(target)}", target.position)
                problem = _rule_name_problem(target.value, "alias")
                if problem is not None:
                    raise self.fail(problem, target.position)
                alias = (target.value, target.position)
                can_repeat = False
            elif kind == "eof":
                if stack:
                    raise self.fail(f"'{frame.opener}' is never closed (a group may continue "
                                    f"on the next line only before '|')", frame.position)
                _close_alternative(frame, alias)
                return tuple(frame.alternatives)
            elif kind == ":":
                raise self.fail("unexpected ':' (each rule starts on a new line)",
                                token.position)
            else:  # pragma: no cover - the scanner yields no other kind
                raise self.fail(f"unexpected {_describe(token)}", token.position)

    def keyword_set(self, frame: _Frame) -> KeywordSet:
        """The keyword set whose members ``frame``'s alternatives hold."""
        members: list[KeywordMember] = []
        seen: dict[str, Position] = {}
        for alt in frame.alternatives:
            member = self.member(alt)
            first = seen.get(member.keyword)
            if first is not None:
                raise self.fail(f'"{member.keyword}" starts two members of one keyword set '
                                f"(first at {first})", member.position)
            seen[member.keyword] = member.position
            members.append(member)
        self.count(len(members) + 1, frame.position)
        return KeywordSet(tuple(members), frame.position)

    def member(self, alt: Alternative) -> KeywordMember:
        """One member: ``":k" X``, ``[":k" X]`` or ``(":k" X)?``."""
        items, optional = alt.items, False
        if len(items) == 1:
            only = items[0]
            if (isinstance(only, Group) and only.optional and len(only.alternatives) == 1):
                items, optional = only.alternatives[0].items, True
            elif (isinstance(only, Repeat) and only.op == "?" and isinstance(only.item, Group)
                  and not only.item.optional and len(only.item.alternatives) == 1):
                items, optional = only.item.alternatives[0].items, True
        if (len(items) != 2 or not isinstance(items[0], Literal) or not items[0].is_keyword
                or isinstance(items[1], (Repeat, KeywordSet))):
            raise self.fail('each member of a keyword set is a keyword literal followed by '
                            'one item (":key" ITEM), optionally in [ ]; repeat an item '
                            'inside a group: ":key" (ITEM*)', alt.position)
        return KeywordMember(items[0].text, items[1], optional, alt.position)

    def atom(self, token: _Token) -> Item:
        if token.kind == "lit":
            return Literal(token.value, token.position)
        name = token.value
        if name in BASE_NAMES:
            return Reference(name, token.position)
        if _is_terminal_like(name):
            raise self.fail(f"unknown terminal {_clip(name)}: only "
                            f"{', '.join(BASE_TERMINAL_NAMES)} may be used (terminal "
                            f"definitions are not in the subset)",
                            token.position)
        problem = _rule_name_problem(name, "rule")
        if problem is not None:
            raise self.fail(problem, token.position)
        return Reference(name, token.position)


def _close_alternative(frame: _Frame, alias: tuple[str, Position] | None) -> None:
    items = tuple(frame.items)
    position = items[0].position if items else frame.separator
    if alias is None:
        frame.alternatives.append(Alternative(items, position))
    else:
        frame.alternatives.append(Alternative(items, position, alias[0], alias[1]))
    frame.items = []


def _describe(token: _Token) -> str:
    if token.kind == "eof":
        return "the end of the text"
    if token.kind == "nl":
        return "the end of the line"
    if token.kind == "lit":
        return f'the literal "{token.value}"'
    return f"'{_clip(token.value)}'"


def _is_terminal_like(name: str) -> bool:
    return name.upper() == name and any(c in _LETTERS for c in name)


def _clip(name: str) -> str:
    """A name as shown in a message: names have no length limit, messages do."""
    return name if len(name) <= 40 else name[:37] + "..."


def _rule_name_problem(name: str, what: str) -> str | None:
    shown = _clip(name)
    if name.startswith("_"):
        return (f"{what} names may not start with '_' ({shown}): the prefix is reserved for "
                f"synthetic rules")
    if _RULE_NAME_RE.match(name) is None:
        return f"{what} names must match [a-z][a-z0-9_]* ({shown} does not)"
    if name in BASE_NAMES:
        return f"{name} is a base name and cannot be used as a {what} name"
    return None


# --------------------------------------------------------------------------------------
# EBNF to BNF


@dataclass(frozen=True, slots=True)
class _Expansion:
    """The BNF form of a grammar, shared by the validation, :func:`to_cfg` and
    :func:`to_lark`: author rules in source order, each followed by its helpers, then
    ``value`` if used. ``display`` holds the helpers' author text."""

    productions: tuple[Production, ...]
    literals: Mapping[str, str]  # literal text -> terminal name, in order of appearance
    display: Mapping[str, str]  # synthetic nonterminal -> author text
    value_used: bool
    #: Keyword-set nonterminal -> its members: (keyword terminal, optional, keyword text).
    keyword_sets: Mapping[str, tuple[SetMember, ...]]
    #: Start rule -> the terminal that selects it (empty with a single start rule).
    start_terminals: Mapping[str, str]


class SetMember(NamedTuple):
    """A keyword-set member as the tables need it."""

    terminal: str  # the keyword literal's terminal (LIT_<n>)
    optional: bool
    keyword: str  # its text, ":amount"


def render_item(item: Item) -> str:
    """The author's text for an item, with normalised spacing (``"a" [b | c]*``)."""
    if isinstance(item, Literal):
        return f'"{item.text}"'
    if isinstance(item, Reference):
        return item.name
    if isinstance(item, Repeat):
        return render_item(item.item) + item.op
    if isinstance(item, KeywordSet):
        return "(" + " & ".join(
            (f'["{m.keyword}" {render_item(m.item)}]' if m.optional
             else f'"{m.keyword}" {render_item(m.item)}')
            for m in item.members) + ")"
    inner = render_alternatives(item.alternatives)
    return f"[{inner}]" if item.optional else f"({inner})"


def render_alternatives(alternatives: tuple[Alternative, ...]) -> str:
    """Alternatives as the author's text (``a b | c``), as :func:`render_item` writes
    items; aliases are left out."""
    return " | ".join(" ".join(render_item(i) for i in alt.items) for alt in alternatives)


class _Expander:
    def __init__(self, source: GrammarSource, text: str) -> None:
        self.source = source
        self.text = text
        self.limit = source.limits.max_productions
        self.productions: list[Production] = []
        self.literals: dict[str, str] = {}
        self.display: dict[str, str] = {}
        self.value_used = False
        self.number_used = False
        self.keyword_sets: dict[str, tuple[SetMember, ...]] = {}
        self.start_terminals: dict[str, str] = {}
        self.rule_name = ""
        self.counter = 0
        self.pending: list[Production] = []
        self.where = Position(1, 1, 0)

    def run(self) -> _Expansion:
        starts = self.source.starts
        if len(starts) > 1:
            for start in starts:
                terminal = START_TERMINAL_PREFIX + start.upper()
                self.start_terminals[start] = terminal
                self.add(self.productions, Production(_MULTI_START, (terminal, start)))
        for rule in self.source.rules:
            self.rule_name, self.counter, self.pending = rule.name, 0, []
            for alt in rule.alternatives:
                self.where = alt.position
                self.add(self.productions, Production(rule.name, self.sequence(alt.items),
                                                      alt.alias))
            self.productions.extend(self.pending)
        if self.value_used:
            for terminal in BASE_TERMINAL_NAMES:
                self.add(self.productions, Production(_VALUE, (terminal,)))
            self.add(self.productions, Production(_VALUE, (_LPAR, _VALUE_STAR, _RPAR)))
            self.add(self.productions, Production(_VALUE_STAR, ()))
            self.add(self.productions, Production(_VALUE_STAR, (_VALUE_STAR, _VALUE)))
            self.display[_VALUE_STAR] = "value*"
        if self.number_used:
            self.add(self.productions, Production(_NUMBER_RULE, ("INTEGER",)))
            self.add(self.productions, Production(_NUMBER_RULE, ("DECIMAL",)))
            self.display[_NUMBER_RULE] = NUMBER
        return _Expansion(tuple(self.productions), MappingProxyType(self.literals),
                          MappingProxyType(self.display), self.value_used,
                          MappingProxyType(self.keyword_sets),
                          MappingProxyType(self.start_terminals))

    def add(self, target: list[Production], production: Production) -> None:
        if len(self.productions) + len(self.pending) >= self.limit:
            raise _refuse(f"the grammar expands to more than {self.limit} BNF productions "
                          f"(max_productions)", self.where, self.text)
        target.append(production)

    def synthetic(self, kind: str, item: Item) -> str:
        name = f"__{self.rule_name}_{kind}_{self.counter}"
        self.counter += 1
        self.display[name] = render_item(item)
        return name

    def sequence(self, items: tuple[Item, ...]) -> tuple[str, ...]:
        out: list[str] = []
        for item in items:
            self.item(item, out)
        return tuple(out)

    def item(self, item: Item, out: list[str]) -> None:
        if isinstance(item, Literal):
            out.append(self.terminal(item.text))
        elif isinstance(item, Reference):
            if item.name == _VALUE:
                self.value_used = True
            elif item.name == NUMBER:
                self.number_used = True
                out.append(_NUMBER_RULE)
                return
            out.append(item.name)
        elif isinstance(item, KeywordSet):
            # S -> ε | S ":k" X | ... : any order and any count; "each at most once, the
            # required ones once" is kept by the drivers (cbcl.grammar._kernel), not the tables.
            name = self.synthetic("set", item)
            self.add(self.pending, Production(name, ()))
            members: list[SetMember] = []
            for member in item.members:
                terminal = self.terminal(member.keyword)
                produced = [name, terminal]
                self.item(member.item, produced)
                self.add(self.pending, Production(name, tuple(produced)))
                members.append(SetMember(terminal, member.optional, member.keyword))
            self.keyword_sets[name] = tuple(members)
            out.append(name)
        elif isinstance(item, Group):
            if not item.optional and len(item.alternatives) == 1:
                out.extend(self.sequence(item.alternatives[0].items))
                return
            name = self.synthetic("opt" if item.optional else "group", item)
            bodies = [self.sequence(alt.items) for alt in item.alternatives]
            if item.optional:
                self.add(self.pending, Production(name, ()))
            for body in bodies:
                self.add(self.pending, Production(name, body))
            out.append(name)
        else:
            kind = {"?": "opt", "*": "star", "+": "plus"}[item.op]
            name = self.synthetic(kind, item)
            inner = item.item
            if isinstance(inner, Group) and not inner.optional:
                bodies = [self.sequence(alt.items) for alt in inner.alternatives]
            else:
                one: list[str] = []
                self.item(inner, one)
                bodies = [tuple(one)]
            if item.op in "?*":
                self.add(self.pending, Production(name, ()))
            if item.op == "?":
                for body in bodies:
                    self.add(self.pending, Production(name, body))
            else:
                if item.op == "+":
                    for body in bodies:
                        self.add(self.pending, Production(name, body))
                for body in bodies:
                    self.add(self.pending, Production(name, (name, *body)))
            out.append(name)

    def terminal(self, text: str) -> str:
        if text == "(":
            return _LPAR
        if text == ")":
            return _RPAR
        name = self.literals.get(text)
        if name is None:
            name = f"LIT_{sum(1 for t in self.literals if t not in '()')}"
            self.literals[text] = name
        return name


def _expand(source: GrammarSource, text: str = "") -> _Expansion:
    return _Expander(source, text).run()


# --------------------------------------------------------------------------------------
# Walking the syntax tree (the one traversal every visitor of it shares)


def inner_sequences(item: Item) -> tuple[tuple[Item, ...], ...]:
    """The item sequences directly inside ``item``: a group's alternatives, a repetition's
    item, each keyword-set member's item (the member's keyword is not an item); none for a
    literal or a reference (a reference is not followed into its rule)."""
    if isinstance(item, Group):
        return tuple(alt.items for alt in item.alternatives)
    if isinstance(item, Repeat):
        return ((item.item,),)
    if isinstance(item, KeywordSet):
        return tuple((member.item,) for member in item.members)
    return ()


def walk_positions(items: tuple[Item, ...]) -> Iterator[tuple[tuple[Item, ...], int]]:
    """Where every item of ``items`` and of the sequences inside them is, as ``(sequence,
    index)`` with ``sequence[index]`` the item: in source order, depth first, each item
    before the items inside it (pre-order). Iterative (an explicit stack of sequences), so
    nesting costs no Python frames."""
    stack: list[tuple[tuple[Item, ...], int]] = [(items, 0)]
    while stack:
        sequence, index = stack.pop()
        if index == len(sequence):
            continue
        stack.append((sequence, index + 1))
        yield sequence, index
        stack.extend((inner, 0) for inner in reversed(inner_sequences(sequence[index])))


def walk(items: tuple[Item, ...]) -> Iterator[Item]:
    """Every item of ``items`` and inside them, in the order of :func:`walk_positions`."""
    for sequence, index in walk_positions(items):
        yield sequence[index]


def list_end(items: tuple[Item, ...], start: int) -> int | None:
    """The end (an exclusive index) of the list whose ``"("`` is ``items[start]``: just
    after the ``")"`` that closes it in the same sequence, or ``None`` if the sequence does
    not close it."""
    depth = 0
    for at in range(start, len(items)):
        piece = items[at]
        if isinstance(piece, Literal) and piece.text in ("(", ")"):
            depth += 1 if piece.text == "(" else -1
            if depth == 0:
                return at + 1
    return None


# --------------------------------------------------------------------------------------
# Whole-grammar checks


def _names(names: list[str]) -> str:
    shown = ", ".join(_clip(name) for name in names[:8])
    return shown + (f" and {len(names) - 8} more" if len(names) > 8 else "")


def _check(source: GrammarSource, text: str) -> None:
    rules = {rule.name: rule for rule in source.rules}
    for start in source.starts:
        if start not in rules:
            raise _refuse(f"the grammar has no {_clip(start)} rule (a start rule)",
                          Position(1, 1, 0), text)
    undefined: dict[str, Position] = {}
    for rule in source.rules:
        for alt in rule.alternatives:
            for item in walk(alt.items):
                if (isinstance(item, Reference) and not item.is_base
                        and item.name not in rules and item.name not in undefined):
                    undefined[item.name] = item.position
    if undefined:
        first = next(iter(undefined.values()))
        raise _refuse(f"undefined rule{'s' if len(undefined) > 1 else ''}: "
                      f"{_names(list(undefined))}", first, text)
    expansion = _expand(source, text)
    nonterminals = {p.lhs for p in expansion.productions}
    productive = _productive(expansion.productions, nonterminals)
    dead = [rule.name for rule in source.rules if rule.name not in productive]
    if dead:
        raise _refuse(f"rule{'s' if len(dead) > 1 else ''} {_names(dead)} can never derive a "
                      f"finite input (unproductive)", rules[dead[0]].position, text)
    reachable = _reachable(expansion.productions, nonterminals, source.start)
    unused = [rule.name for rule in source.rules if rule.name not in reachable]
    if unused:
        where = (source.starts[0] if len(source.starts) == 1
                 else "any start rule (" + _names(list(source.starts)) + ")")
        raise _refuse(f"rule{'s' if len(unused) > 1 else ''} {_names(unused)} cannot be "
                      f"reached from {where} (unreachable)", rules[unused[0]].position, text)


def _productive(productions: tuple[Production, ...], nonterminals: set[str]) -> set[str]:
    """Nonterminals that derive a finite terminal string (linear worklist)."""
    missing = [0] * len(productions)
    uses: dict[str, list[int]] = {}
    work: list[str] = []
    productive: set[str] = set()
    for k, production in enumerate(productions):
        for symbol in production.rhs:
            if symbol in nonterminals:
                missing[k] += 1
                uses.setdefault(symbol, []).append(k)
        if missing[k] == 0 and production.lhs not in productive:
            productive.add(production.lhs)
            work.append(production.lhs)
    while work:
        symbol = work.pop()
        for k in uses.get(symbol, ()):
            missing[k] -= 1
            lhs = productions[k].lhs
            if missing[k] == 0 and lhs not in productive:
                productive.add(lhs)
                work.append(lhs)
    return productive


def _reachable(productions: tuple[Production, ...], nonterminals: set[str],
               start: str) -> set[str]:
    by_lhs: dict[str, list[Production]] = {}
    for production in productions:
        by_lhs.setdefault(production.lhs, []).append(production)
    seen = {start}
    work = [start]
    while work:
        for production in by_lhs.get(work.pop(), ()):
            for symbol in production.rhs:
                if symbol in nonterminals and symbol not in seen:
                    seen.add(symbol)
                    work.append(symbol)
    return seen


# --------------------------------------------------------------------------------------
# Public API


def _decode(text: str | bytes, limits: GrammarLimits) -> str:
    """The text as ``str`` after the size and encoding checks; raises GrammarError."""
    maximum = limits.max_text_bytes
    if isinstance(text, str):
        if len(text) > maximum:
            raise _too_big(text[:maximum + 1].encode("utf-8", "surrogatepass"), maximum)
        data = text.encode("utf-8", "surrogatepass")
        if len(data) > maximum:
            raise _too_big(data, maximum)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise _bad_utf8(data, len(text[:exc.start].encode("utf-8")),
                            "the grammar text contains a lone surrogate") from None
        return text
    if isinstance(text, (bytes, bytearray, memoryview)):
        data = bytes(text)
        if len(data) > maximum:
            raise _too_big(data, maximum)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _bad_utf8(data, exc.start, "the grammar text is not valid UTF-8") from None
    raise TypeError(f"read_grammar() expects str or bytes, got {type(text).__name__}")


def _position_at_byte(data: bytes, offset: int) -> Position:
    head = data[:offset].decode("utf-8", "ignore")
    line_start = head.rfind("\n") + 1
    return Position(head.count("\n") + 1, len(head) - line_start + 1, offset)


def _too_big(data: bytes, maximum: int) -> GrammarError:
    cut = maximum
    while cut > 0 and (data[cut] & 0xC0) == 0x80:  # back to the start of a character
        cut -= 1
    return GrammarError(f"the grammar text is more than {maximum} bytes (max_text_bytes)",
                        verdict="rejected", position=_position_at_byte(data, cut))


def _bad_utf8(data: bytes, offset: int, message: str) -> GrammarError:
    return GrammarError(message, verdict="rejected", position=_position_at_byte(data, offset))


def read_grammar(text: str | bytes, *, limits: GrammarLimits | None = None,
                 starts: tuple[str, ...] = (_START,)) -> GrammarSource:
    """Read and validate a descriptor grammar (draft §4) without compiling anything.

    Accepts exactly the subset: rules and ``?rules``, ``|``, ``( )``, ``[ ]``, postfix
    ``? * +``, top-level ``-> alias``, literals that are ``"("``, ``")"``, a CBCL symbol or a
    keyword, the base names ``SYMBOL STRING INTEGER DECIMAL KEYWORD URI value``, ``//``
    comments. Empty alternatives (epsilon) are allowed, empty groups are not. Layout follows
    lark: a rule ends at a line break unless the next line continues it with ``|``.

    Keyword sets ``(":a" X & [":b" Y])`` match their members in any order (see
    :class:`KeywordSet`); ``NUMBER`` matches an ``INTEGER`` or a ``DECIMAL``.

    The grammar must define every rule of ``starts`` (``body`` unless the descriptor names
    per-intent start rules); every rule must be defined once, be productive and be
    reachable from a start rule (an unreachable rule cannot affect any message and is almost
    always a mistake, so it is refused rather than ignored).

    Raises :class:`GrammarError` (verdict ``"rejected"``, with the position of the offending
    character and a context snippet) for anything outside the subset, invalid UTF-8, or a
    limit exceeded; ``TypeError`` if ``text`` is neither ``str`` nor ``bytes``, and
    ``ValueError`` if ``starts`` is empty, repeats a name or holds one that is not a rule
    name.
    """
    limits = _DEFAULT_LIMITS if limits is None else limits
    if not isinstance(limits, GrammarLimits):
        raise TypeError(f"limits must be GrammarLimits, got {type(limits).__name__}")
    starts = check_starts(starts)
    decoded = _decode(text, limits)
    source = GrammarSource(_Parser(decoded, limits).rules(), limits, starts)
    _check(source, decoded)
    return source


_NO_HEIGHT = 1 << 30


def derivation_heights(source: GrammarSource) -> dict[str, int]:
    """The least derivation depth of every rule of ``source``: how many nested rule
    references it needs to finish (a fixpoint; every rule is productive, so each is
    finite). The generators and the witness search use it to end a body they draw."""
    heights = dict.fromkeys((rule.name for rule in source.rules), _NO_HEIGHT)
    changed = True
    while changed:
        changed = False
        for rule in source.rules:
            best = min(sequence_height(alt.items, heights) for alt in rule.alternatives) + 1
            if best < heights[rule.name]:
                heights[rule.name] = best
                changed = True
    return heights


def item_height(item: Item, heights: Mapping[str, int]) -> int:
    """The least derivation depth of one item, given the rules' (see
    :func:`derivation_heights`)."""
    if isinstance(item, Literal):
        return 0
    if isinstance(item, Reference):
        return 0 if item.is_base else heights.get(item.name, _NO_HEIGHT)
    if isinstance(item, Repeat):
        return item_height(item.item, heights) if item.op == "+" else 0
    if isinstance(item, KeywordSet):
        return max((item_height(m.item, heights) for m in item.members if not m.optional),
                   default=0)
    if item.optional:
        return 0
    return min(sequence_height(alt.items, heights) for alt in item.alternatives)


def sequence_height(items: tuple[Item, ...], heights: Mapping[str, int]) -> int:
    """The least derivation depth of a sequence of items (an alternative): its deepest
    item's. A generator past its depth bound takes an alternative of least height."""
    return max((item_height(i, heights) for i in items), default=0)


def rule_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a rule (a base name, ``_``-prefixed, not
    ``[a-z][a-z0-9_]*``), or ``None``."""
    return _rule_name_problem(name, "rule")


def check_starts(starts: tuple[str, ...]) -> tuple[str, ...]:
    """``starts`` as a tuple of distinct rule names; raises ``ValueError`` otherwise."""
    if not isinstance(starts, tuple) or not starts:
        raise ValueError("starts must be a non-empty tuple of rule names")
    if len(set(starts)) != len(starts):
        raise ValueError("starts names a rule twice")
    for start in starts:
        if not isinstance(start, str) or _rule_name_problem(start, "rule") is not None:
            raise ValueError(f"{start!r} is not a rule name")
    return starts


def to_cfg(source: GrammarSource) -> Grammar:
    """The BNF :class:`~cbcl.grammar._cfg.Grammar` of a grammar read by :func:`read_grammar`.

    ``x?`` and ``[x]`` become ``N -> ε | x``; ``x*`` becomes ``N -> ε | N x``; ``x+``
    becomes ``N -> x | N x`` (left recursive). When ``x`` is a group ``(a | b)`` its
    alternatives are used directly (``N -> ε | N a | N b``). A group with several
    alternatives becomes ``N -> a | b``; a group with a single alternative is spliced into
    its parent. Helpers are named ``__<rule>_<opt|star|plus|group>_<n>`` and display as the
    author's text. ``value`` expands to its seven alternatives (and ``__value_star``) only
    when used. Raises :class:`GrammarError` only if the grammar exceeds ``max_productions``
    (which :func:`read_grammar` has already checked).
    """
    expansion = _expand(source)
    terminals: set[str] = set()
    nonterminals = {p.lhs for p in expansion.productions}
    for production in expansion.productions:
        terminals.update(s for s in production.rhs if s not in nonterminals)
    display: dict[str, str] = dict(expansion.display)
    overlaps: dict[str, frozenset[str]] = {}
    for literal, terminal in expansion.literals.items():
        display[terminal] = f'"{literal}"'
        overlaps[terminal] = frozenset({"KEYWORD" if literal.startswith(":") else "SYMBOL"})
    for terminal, literal in ((_LPAR, "("), (_RPAR, ")")):
        if terminal in terminals:
            display[terminal] = f'"{literal}"'
    for start, terminal in expansion.start_terminals.items():
        display[terminal] = f"<{start}>"
    return Grammar(start=source.start, productions=expansion.productions,
                   terminals=frozenset(terminals), synthetic=frozenset(expansion.display),
                   display=MappingProxyType(display), overlaps=MappingProxyType(overlaps))


def to_lark(source: GrammarSource, *, prefix: str = "p_") -> LarkGrammar:
    """Lark grammar text for a grammar read by :func:`read_grammar`, generated from its BNF
    expansion (the same one :func:`to_cfg` returns), never from the author's text.

    Author rules and aliases are renamed ``prefix + name`` (``?`` kept); helper rules are
    ``_<prefix><rule>_<kind>_<n>`` (inlined by lark); ``value`` is
    :data:`LARK_VALUE_RULE` with the helper ``_cbcl_value_star``. Every terminal is
    declared on one ``%declare`` line, for a custom lexer to feed: ``SYMBOL STRING INTEGER
    DECIMAL KEYWORD URI LPAR RPAR`` always, then ``LIT_0``, ``LIT_1``, ...

    Raises ``ValueError`` if ``prefix`` is not empty or ``[a-z][a-z0-9_]*``, or if it makes
    an author name collide with a reserved one.
    """
    if not isinstance(prefix, str) or _PREFIX_RE.match(prefix) is None:
        raise ValueError(f"prefix must be empty or match [a-z][a-z0-9_]*, got {prefix!r}")
    expansion = _expand(source)
    inline = {rule.name for rule in source.rules if rule.inline}

    def lark_name(name: str) -> str:
        if name == _MULTI_START:
            return prefix + "_start"
        if name == _VALUE:
            return LARK_VALUE_RULE
        if name == _VALUE_STAR:
            return _LARK_VALUE_STAR
        if name.startswith("__"):
            return "_" + prefix + name[2:]
        return prefix + name

    order: list[str] = []
    by_lhs: dict[str, list[Production]] = {}
    for production in expansion.productions:
        if production.lhs not in by_lhs:
            order.append(production.lhs)
            by_lhs[production.lhs] = []
        by_lhs[production.lhs].append(production)
    nonterminals = set(order)
    rule_names: dict[str, str] = {}
    for rule in source.rules:
        rule_names[lark_name(rule.name)] = rule.name
        for alt in rule.alternatives:
            if alt.alias is not None:
                rule_names.setdefault(prefix + alt.alias, alt.alias)
    uses = Counter(map(lark_name, order))
    clashes = sorted(n for n, count in uses.items() if count > 1)
    if expansion.value_used:
        clashes += sorted(n for n in rule_names if n in (LARK_VALUE_RULE, _LARK_VALUE_STAR))
    if clashes:
        raise ValueError(f"prefix {prefix!r} makes rule names collide: {', '.join(clashes)}")

    literals: dict[str, str] = {_LPAR: "(", _RPAR: ")"}
    for literal, terminal in expansion.literals.items():
        literals[terminal] = literal
    lines = ["// Generated by cbcl.grammar._subset.to_lark from a descriptor grammar.",
             "%declare " + " ".join((*BASE_TERMINAL_NAMES, *literals,
                                     *expansion.start_terminals.values()))]
    for name in order:
        head = ("?" if name in inline else "") + lark_name(name) + ":"
        for k, production in enumerate(by_lhs[name]):
            words = [s if s not in nonterminals else lark_name(s) for s in production.rhs]
            if production.alias is not None:
                words += ["->", prefix + production.alias]
            lines.append(" ".join([head if k == 0 else "    |", *words]))
    return LarkGrammar(text="\n".join(lines) + "\n", start=lark_name(source.start),
                       literals=MappingProxyType(literals),
                       value_rule=LARK_VALUE_RULE if expansion.value_used else None,
                       rule_names=MappingProxyType(rule_names),
                       keyword_sets=MappingProxyType({
                           lark_name(name): members
                           for name, members in expansion.keyword_sets.items()}),
                       start_terminals=expansion.start_terminals)
