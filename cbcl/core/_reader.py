"""The guarded reader of CBCL text (draft §1).

Theory of operation
-------------------
The input is decoded once (strict UTF-8) and scanned with a single compiled regular
expression, :data:`TOKEN`. Each match skips whitespace and comments, then captures exactly
one token in a numbered group; ``match.lastindex`` names the token kind, so the hot loop
dispatches on a small int without a second look at the text. Every quantifier that can
meet a long run of input is possessive (``*+``, ``++``), so no alternative backtracks more
than a constant amount: scanning is linear in the input. Atoms must be followed by a
delimiter (whitespace, ``(``, ``)``, ``;`` or the end); an atom that is not, and any other
character that starts no token, falls through to the catch-all group, and only then does
:func:`diagnose` look closely at the text to say precisely what is wrong. The happy path
never computes a line or column: positions are derived from the character index only when
an error is raised.

Values are built iteratively with an explicit stack (never recursion), and every limit of
:class:`~cbcl.Limits` is checked at the token that would exceed it, before the value is
built: depth at each ``(``, items at each append, nodes at each token, string and name
sizes before their text is copied or unescaped, and the document size before decoding.
This Python reader is the reference and the fallback: the C twin
(``cbcl._native.read_value``, cbcl/_native_src/scanner.c) reads well-formed text first
where it is built, and hands this loop only what it declines (text with an error, which
is then read again here to raise the precise error, and a non-ASCII text read from a
later position). There is no third tier (issue 28): what the fallback costs without the
extension is stated in docs/performance.md.

The envelope parser (pass 1) drives the same token expression and calls
:func:`read_value_at` to capture the body, so a message is scanned exactly once.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, MutableMapping
from decimal import Decimal
from typing import Any, NoReturn

from ._errors import MalformedError, Position
from ._limits import DEFAULT_LIMITS, Budget, Limits
from ._values import (
    INT64_MAX,
    INT64_MIN,
    INTERN_MAX,
    KEYWORD_TABLE,
    PINNED_KEYWORDS,
    PINNED_SYMBOLS,
    SYMBOL_TABLE,
    URI,
    Keyword,
    Symbol,
    Value,
)
from ._vocabulary import (
    INVISIBLE,
    MAX_DECIMAL_CHARS,
    NAME,
    NUMBER_GROUPS,
    NUMBER_RE,
    NUMBERLIKE_RE,
    SYMBOL as SYMBOL_PATTERN,
    URI_PATTERN,
)

# Characters refused unescaped in strings (and everywhere else outside them): C0 and C1
# controls, DEL, and the bidirectional embedding/override/isolate controls.
_FORBIDDEN = "\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069"
_DELIM = r"(?=[ \t\r\n();]|\Z)"
# A comment: from ';' to the line's end. A control character inside it stops the comment
# and then fails as a token.
_COMMENT_PATTERN = (r";[^\x00-\x08\x0a-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069"
                    r"\u2028\u2029\ufeff]*+")

# Group numbers (match.lastindex) of the token kinds. The alternatives are tried in order
# of frequency (symbols before URIs, which they cannot match: a symbol never contains ':');
# every atom must end at a delimiter, so no two alternatives match at the same place.
LPAR, RPAR, KEYWORD, SYMBOL, STRING, INTEGER, DECIMAL, URI_TOKEN, EOF, BAD = range(1, 11)

TOKEN = re.compile(
    # Whitespace and comments.
    r"(?:[ \t\r\n]++|" + _COMMENT_PATTERN + r")*+"
    r"(?:"
    r"(\()"  # 1 LPAR
    r"|(\))"  # 2 RPAR
    r"|:(" + NAME + r")" + _DELIM +  # 3 KEYWORD (the name)
    r"|(" + SYMBOL_PATTERN + r")" + _DELIM +  # 4 SYMBOL
    # 5 STRING: the raw text between the quotes. \u escapes of surrogates do not match.
    r'|"((?:[^"\\' + _FORBIDDEN + r"]++"
    r'|\\["\\nrt]|\\u(?![dD][89a-fA-F])[0-9a-fA-F]{4})*+)"' + _DELIM +
    r"|" + NUMBER_GROUPS + _DELIM +  # 6 INTEGER, 7 DECIMAL part
    r"|(" + URI_PATTERN + r")"
    + _DELIM +  # 8 URI
    r"|(\Z)"  # 9 EOF
    r"|((?s:.))"  # 10 BAD: diagnosed separately
    r")"
)

_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|(.))")
_SIMPLE_ESCAPES = {'"': '"', "\\": "\\", "n": "\n", "r": "\r", "t": "\t"}
_INT_MAX_CHARS = 20  # len("-9223372036854775808")

_new = str.__new__


def _unescape_one(m: re.Match[str]) -> str:
    hex_digits = m.group(1)
    if hex_digits is not None:
        return chr(int(hex_digits, 16))
    return _SIMPLE_ESCAPES[m.group(2)]


def token_start(m: re.Match[str]) -> int:
    """Where the token of a :data:`TOKEN` match starts: at a string's quote, a keyword's
    colon, a decimal's first digit."""
    kind = m.lastindex or 0
    if kind in (STRING, KEYWORD):
        return m.start(kind) - 1
    if kind == DECIMAL:
        return m.start(INTEGER)
    return m.start(kind)


def unescape(raw: str) -> str:
    """Unescape the raw text of a STRING token the scanner has already validated."""
    if "\\" not in raw:
        return raw
    return _ESCAPE.sub(_unescape_one, raw)


# --------------------------------------------------------------------------- positions


def position_of(text: str, index: int) -> Position:
    """The :class:`Position` of character ``index`` in ``text`` (computed on error only)."""
    index = max(0, min(index, len(text)))
    line = text.count("\n", 0, index) + 1
    line_start = text.rfind("\n", 0, index) + 1
    offset = len(text[:index].encode("utf-8", "surrogatepass"))
    return Position(line, index - line_start + 1, offset)


def context_of(text: str, index: int, width: int = 72) -> str:
    """The line around ``index`` with a caret under it, clipped to ``width`` characters."""
    index = max(0, min(index, len(text)))
    start = text.rfind("\n", 0, index) + 1
    end = text.find("\n", index)
    if end == -1:
        end = len(text)
    line = text[start:end].rstrip("\r")
    col = index - start
    left = max(0, col - width // 2)
    snippet = line[left : left + width]
    shown = "".join(ch if ch.isprintable() else "\ufffd" for ch in snippet)
    return f"{shown}\n{' ' * (col - left)}^"


def fail(text: str, index: int, message: str, *,
         expected: tuple[str, ...] = (), error: type[MalformedError] = MalformedError) -> NoReturn:
    """Raise ``error`` at character ``index`` of ``text``."""
    raise error(message, position=position_of(text, index), context=context_of(text, index),
                expected=expected)


def text_budget(text: str, limits: Limits) -> Budget:
    """The :class:`Budget` of ``text``: its indexes are character indexes."""
    return Budget(limits, lambda index: (position_of(text, index), context_of(text, index)))


def limit(text: str, index: int, limits: Limits, name: str,
          subject: str | None = None) -> NoReturn:
    """Raise :class:`LimitError` for limit ``name`` at character ``index`` of ``text``."""
    text_budget(text, limits).exceeded(name, index, subject)


# --------------------------------------------------------------------------- decoding


def utf8_of(data: bytes | bytearray | memoryview | str) -> bytes | None:
    """The UTF-8 a document was decoded from, where :func:`decode` decoded exact bytes
    (what the C tier may read instead of encoding the text again), else ``None``."""
    return data if type(data) is bytes else None


def decode(data: bytes | bytearray | memoryview | str, limits: Limits) -> str:
    """Check the document size, then decode strict UTF-8.

    Raises :class:`LimitError` (``max_message_bytes``) before decoding anything, and
    :class:`MalformedError` for invalid UTF-8 (a lone surrogate in a ``str``, too), or
    ``TypeError`` for another type.
    """
    maximum = limits.max_message_bytes
    if isinstance(data, str):
        if len(data) > maximum:  # each character is at least one byte
            _too_big(limits)
        try:
            size = len(data.encode("utf-8"))
        except UnicodeEncodeError as exc:
            fail(data, exc.start, "a lone surrogate is not valid UTF-8")
        if size > maximum:
            _too_big(limits)
        return data
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"expected bytes or str, not {type(data).__name__}")
    if len(data) > maximum:
        _too_big(limits)
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        good = bytes(data[: exc.start]).decode("utf-8")
        pos = position_of(good, len(good))
        raise MalformedError(f"invalid UTF-8 (byte 0x{data[exc.start]:02x})",
                             position=Position(pos.line, pos.column, exc.start),
                             context=context_of(good, len(good))) from None


def _too_big(limits: Limits) -> NoReturn:
    Budget(limits, nowhere).exceeded("max_message_bytes", 0)


def nowhere(index: int) -> tuple[None, None]:
    """A :class:`Budget`'s ``locate`` for a refusal that has no position."""
    return None, None


# --------------------------------------------------------------------------- the reader


def only_space_after(text: str, end: int) -> bool:
    """Whether nothing but whitespace and comments follows character ``end`` of ``text``
    (the end of a whole document's one value)."""
    return end == len(text) or TOKEN.match(text, end).lastindex == EOF  # type: ignore[union-attr]


def read_value_at(text: str, pos: int, limits: Limits, depth: int, nodes: int,
                  utf8: bytes | None = None) -> tuple[Value, int, int]:
    """Read one value starting at character ``pos`` (whitespace and comments may precede).

    ``depth`` is the number of lists already open around the value and ``nodes`` the
    number of nodes already counted in the document; both count toward the limits.
    Returns ``(value, end, nodes)`` where ``end`` is the index just after the value.
    ``utf8``: the bytes ``text`` was decoded from, if the caller has them (the C tier then
    reads them rather than encoding the text again). Raises :class:`MalformedError` or
    :class:`LimitError`.

    The C twin (``cbcl._native.read_value``, when built) reads first; where it declines,
    or is not built, :func:`read_value_python` reads the text, to return the same value or
    raise the precise error at the token that caused it.
    """
    if _read_value_c is not None:
        found = _read_value_c(text, pos, _CACHE, _atom, limits.max_depth - depth,
                              limits.max_list_items, limits.max_nodes - nodes,
                              limits.max_string_bytes, limits.max_name_chars, utf8)
        if found is not None:
            value, end, count = found
            return value, end, nodes + count
    return read_value_python(text, pos, limits, depth, nodes)


# Symbols and keywords already made, by name: a message repeats its names, and a name read
# twice is then one object (so dictionaries keyed by atoms find it by identity, without
# calling ``_Atom.__eq__``). Every name here is valid (callers check before interning), so
# finding a name here also validates it. Bounded: when full, a table is emptied down to
# its pinned names (the grammars' and schemas' literals), so names a peer floods it with
# cannot keep later names out for good.
#
# Process-wide ON PURPOSE (spec/cbcl-1.0.md, "Process-wide memos"): interning is an
# identity shared by every owner of atoms. The atoms the text reader and the binary
# decoder (whose fast path is handed these very dicts) return must be the objects that
# keyed the tables built from grammars and schemas (Protocol.atoms, the codec's symbol
# tables, compiled schemas), and compiled grammars are shared between registries (the
# process-wide grammar cache): a table per registry or decoder would give one name
# several objects, and every lookup by identity would miss. Safe: an interned atom is an
# immutable value equal to any other of its name, equality is the fallback of every
# lookup, so a flushed table costs speed, never a different answer; the pinned names stay
# through flushes (at most _INTERN_MAX // 2 of them).
#
# The tables are cbcl.core._values' (Symbol() looks there too): dicts in the Python
# reference, cbcl._native.NameTables where the extension is built, which keep the same bound
# and pinned names in C (_intern hands a name to them: cbcl/_native_src/intern.c).
_INTERN_MAX = INTERN_MAX
_SYMBOLS: MutableMapping[str, Symbol] = SYMBOL_TABLE
_KEYWORDS: MutableMapping[str, Keyword] = KEYWORD_TABLE
_PINNED_SYMBOLS: dict[str, Symbol] = PINNED_SYMBOLS
_PINNED_KEYWORDS: dict[str, Keyword] = PINNED_KEYWORDS
# What a decoder's atom caches hold for symbols and keywords (cbcl.binary._codec, whose C
# path takes dicts only): the tables themselves where they are dicts; else empty dicts, a
# miss in which sends a name to the native table (in C, or through intern_symbol).
_SYMBOL_CACHE: dict[str, Symbol] = _SYMBOLS if type(_SYMBOLS) is dict else {}
_KEYWORD_CACHE: dict[str, Keyword] = _KEYWORDS if type(_KEYWORDS) is dict else {}


def _intern(table: MutableMapping[str, Any], pinned: dict[str, Any], kind: type, name: str,
            pin: bool) -> Any:
    if type(table) is not dict:  # a native table: its bound, pinned names and memos in C
        return table.intern(name, pin)  # type: ignore[attr-defined]
    value = table.get(name)
    if value is None:
        value = _new(kind, name)
        if len(table) >= _INTERN_MAX:
            table.clear()
            table.update(pinned)
            _forget_atoms()
        table[name] = value
    if pin and name not in pinned and len(pinned) < _INTERN_MAX // 2:
        pinned[name] = value
    return value


def intern_symbol(name: str, *, pin: bool = False) -> Symbol:
    """The shared :class:`Symbol` named ``name`` (a valid name and an exact ``str``, not
    checked); ``pin=True`` keeps it in the table for good (a grammar or schema literal)."""
    value = _SYMBOLS.get(name)
    if value is None or pin:
        value = _intern(_SYMBOLS, _PINNED_SYMBOLS, Symbol, name, pin)
    return value


def intern_keyword(name: str, *, pin: bool = False) -> Keyword:
    """The shared :class:`Keyword` named ``name`` (without the colon, a valid name and an
    exact ``str``, not checked); ``pin=True`` as for :func:`intern_symbol`."""
    value = _KEYWORDS.get(name)
    if value is None or pin:
        value = _intern(_KEYWORDS, _PINNED_KEYWORDS, Keyword, name, pin)
    return value


# --------------------------------------------------------------------------- atoms

# The atoms of the C twin (cbcl/_native_src/scanner.c judges strings, integers,
# whitespace and comments itself, and hands every other run between delimiters to
# :func:`_atom` through :data:`_CACHE`): so which runs are atoms, and what atom each is,
# has one definition, here. :data:`TOKEN`'s atom alternatives, matched in full against a
# run; the same order, and groups of the same meaning.
_ATOM = re.compile(
    r":(" + NAME + r")"  # 1 keyword name
    r"|(" + SYMBOL_PATTERN + r")"  # 2 symbol
    r"|" + NUMBER_GROUPS +  # 3 integer, 4 decimal part
    r"|(" + URI_PATTERN + r")"  # 5 URI
)
# Token text -> value, for tokens up to _CACHED_CHARS long: a cached name is then within
# every max_name_chars of at least _CACHED_CHARS (a smaller one is checked per document).
# Names and URIs are kept, and numbers of up to 4 characters: longer numbers seldom recur
# between messages, and would only churn the cache. Emptied when full.
#
# A process-wide memo (spec/cbcl-1.0.md, "Process-wide memos"), kept so because the text
# path (cbcl.parse, decode) has no object to own it and because it is a pure memo: the
# key is the token's own text, the value the immutable atom that text denotes (a symbol
# or keyword as interned, a URI, an int, a short Decimal), the same whether found or made;
# no limit enters the value (names are checked against max_name_chars by the callers).
# At most _CACHE_MAX entries of at most _CACHED_CHARS characters. Under threads a reader
# may miss while another empties it, and then makes the same value.
_CACHED_CHARS = 128
_CACHE_MAX = 8192
_CACHE: dict[str, object] = {}


def _atom(token: str, max_name: int) -> object | None:
    """The value of ``token`` (a run between delimiters) if it is one atom within the
    limits, cached; else ``None`` (the C twin's atom rules: :data:`_ATOM`)."""
    m = _ATOM.fullmatch(token)
    if m is None:
        return None
    kind: int = m.lastindex  # type: ignore[assignment]  # one alternative always matches
    value: Value
    if kind == 2:
        if len(token) > max_name:
            return None
        value = intern_symbol(token)
    elif kind == 1:
        if len(token) - 1 > max_name:
            return None
        value = intern_keyword(m.group(1))
    elif kind == 5:
        value = _new(URI, token)
    elif kind == 3:
        if len(token) > _INT_MAX_CHARS:
            return None
        value = int(token)
        if not INT64_MIN <= value <= INT64_MAX:
            return None
    else:
        if len(token) > MAX_DECIMAL_CHARS:
            return None
        value = Decimal(token)
    if len(token) <= _CACHED_CHARS and (kind <= 2 or kind == 5 or len(token) <= 4):
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.clear()
        _CACHE[token] = value
    return value


def read_value_python(text: str, pos: int, limits: Limits, depth: int, nodes: int,
                      ) -> tuple[Value, int, int]:
    """:func:`read_value_at` in Python: the reference of the C twin and the fallback where
    it is not built or declines. Every limit is checked at the token that would exceed it,
    before the value is built; raises :class:`MalformedError` or :class:`LimitError`."""
    max_depth = limits.max_depth
    max_items = limits.max_list_items
    max_nodes = limits.max_nodes
    max_string = limits.max_string_bytes
    max_name = limits.max_name_chars
    symbols_get = _SYMBOLS.get
    keywords_get = _KEYWORDS.get
    stack: list[list[Value]] = []
    push = stack.append
    pop = stack.pop
    items: list[Value] | None = None
    value: Value
    for m in TOKEN.finditer(text, pos):
        kind: int = m.lastindex  # type: ignore[assignment]  # TOKEN always matches a group
        if kind == RPAR:
            if items is None:
                fail(text, m.start(kind), "unexpected ')'", expected=("a value",))
            value = tuple(items)
            depth -= 1
            if not stack:
                return value, m.end(), nodes
            items = pop()
            items.append(value)  # (counted against max_list_items when it opened)
            continue
        if kind == EOF:
            if items is None:
                fail(text, m.start(kind), "expected a value, found the end of the input",
                     expected=("a value",))
            fail(text, m.start(kind), f"{depth} unclosed list(s) at the end of the input",
                 expected=("')'",))
        nodes += 1
        if nodes > max_nodes:
            limit(text, m.start(kind), limits, "max_nodes")
        if kind == LPAR:
            depth += 1
            if depth > max_depth:
                limit(text, m.start(kind), limits, "max_depth")
            if items is not None:
                if len(items) >= max_items:
                    limit(text, m.start(kind), limits, "max_list_items")
                push(items)
            items = []
            continue
        if kind == KEYWORD:
            value = m.group(KEYWORD)
            if len(value) > max_name:
                limit(text, m.start(kind) - 1, limits, "max_name_chars", "keyword")
            keyword = keywords_get(value)
            value = keyword if keyword is not None else intern_keyword(value)
        elif kind == SYMBOL:
            value = m.group(SYMBOL)
            if len(value) > max_name:
                limit(text, m.start(kind), limits, "max_name_chars", "symbol")
            symbol = symbols_get(value)
            value = symbol if symbol is not None else intern_symbol(value)
        elif kind == STRING:
            raw = m.group(STRING)
            if len(raw) * 4 <= max_string:  # cannot be over: skip measuring
                value = raw if "\\" not in raw else _ESCAPE.sub(_unescape_one, raw)
            # Each value character comes from at most 6 raw characters (\\uXXXX) and is at
            # least one byte, so a raw text over 6x the limit is over it.
            elif len(raw) > 6 * max_string or len(
                    (value := unescape(raw)).encode("utf-8")) > max_string:
                limit(text, m.start(kind) - 1, limits, "max_string_bytes")
        elif kind == INTEGER:
            token = m.group(INTEGER)
            # (18 digits, or 17 and a sign, are always in range; 21 characters never are)
            if len(token) > 18 and (len(token) > _INT_MAX_CHARS
                                    or not INT64_MIN <= int(token) <= INT64_MAX):
                fail(text, m.start(kind), "integer out of the signed 64-bit range")
            value = int(token)
        elif kind == URI_TOKEN:
            value = _new(URI, m.group(URI_TOKEN))
        elif kind == DECIMAL:
            start = m.start(INTEGER)
            token = text[start : m.end(DECIMAL)]
            if len(token) > MAX_DECIMAL_CHARS:
                fail(text, start, f"decimal longer than {MAX_DECIMAL_CHARS} characters")
            value = Decimal(token)
        else:
            diagnose(text, m.start(kind))
        if items is None:
            return value, m.end(), nodes
        if len(items) >= max_items:
            limit(text, m.start(kind), limits, "max_list_items")
        items.append(value)
    raise AssertionError("unreachable: TOKEN always matches")  # pragma: no cover


def expect_end(text: str, pos: int) -> None:
    """Raise :class:`MalformedError` unless only whitespace and comments follow ``pos``."""
    m = TOKEN.match(text, pos)
    assert m is not None
    if m.lastindex == EOF:
        return
    if m.lastindex == BAD:
        diagnose(text, m.start(BAD))
    fail(text, m.start(m.lastindex or 0) - (1 if m.lastindex in (STRING, KEYWORD) else 0),
         "unexpected data after the end of the document", expected=("the end of the input",))


def read(data: bytes | bytearray | memoryview | str, *, limits: Limits | None = None) -> Value:
    """Read one CBCL value from a whole document (bytes in UTF-8, or ``str``).

    Raises :class:`MalformedError` for text that is not exactly one value (comments and
    whitespace aside), :class:`LimitError` when a limit is exceeded, ``TypeError`` for
    input that is neither bytes nor str.
    """
    limits = DEFAULT_LIMITS if limits is None else limits
    text = decode(data, limits)
    value, end, _ = read_value_at(text, 0, limits, 0, 0, utf8_of(data))
    expect_end(text, end)
    return value


def read_all(data: bytes | bytearray | memoryview | str, *, limits: Limits | None = None,
             ) -> list[Value]:
    """Read every value in a document holding zero or more values, in order.

    ``limits`` apply to the whole document's size and to each value's depth, items and
    nodes. Raises as :func:`read`.
    """
    limits = DEFAULT_LIMITS if limits is None else limits
    return [value for value, _, _ in value_spans(decode(data, limits), limits)]


def value_spans(text: str, limits: Limits) -> Iterator[tuple[Value, int, int]]:
    """Each value of a decoded document holding zero or more, with the character indexes
    where its text starts (at its first token) and ends. Raises as :func:`read`."""
    pos = 0
    while True:
        m = TOKEN.match(text, pos)
        assert m is not None
        if m.lastindex == EOF:
            return
        start = token_start(m)
        value, pos, _ = read_value_at(text, pos, limits, 0, 0)
        yield value, start, pos


# --------------------------------------------------------------------------- diagnosis

_FORBIDDEN_RE = re.compile("[" + _FORBIDDEN + "]")
_INVISIBLE_RE = re.compile("[" + INVISIBLE + "]")
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_NAME_START = frozenset(_LETTERS + "+-*/<>=!?_.")
_NAME_CHARS = _NAME_START | frozenset("0123456789@%&")
_RUN_END = re.compile(r"[ \t\r\n();\"]|\Z")
_URI_PREFIX = re.compile(r"[a-z][a-z0-9+.\-]*://")


def _char_name(ch: str) -> str:
    if ch.isprintable():
        return f"{ch!r} (U+{ord(ch):04X})"
    return f"U+{ord(ch):04X}"


def _forbidden_reason(ch: str) -> str:
    if "\u202a" <= ch <= "\u202e" or "\u2066" <= ch <= "\u2069":
        return f"bidirectional control {_char_name(ch)}"
    if _INVISIBLE_RE.match(ch):
        return f"invisible or space character {_char_name(ch)}"
    return f"control character {_char_name(ch)}"


def diagnose(text: str, index: int) -> NoReturn:
    """Raise the precise :class:`MalformedError` for the token that starts at ``index``
    and that :data:`TOKEN` did not accept."""
    ch = text[index]
    if ch == '"':
        _diagnose_string(text, index)
    if _FORBIDDEN_RE.match(ch):
        where = " in a comment" if _in_comment(text, index) else ""
        fail(text, index, f"{_forbidden_reason(ch)}{where} is not allowed")
    if ch in "\u2028\u2029\ufeff" and _in_comment(text, index):
        fail(text, index, f"{_char_name(ch)} is not allowed in a comment")
    _refuse_special(text, index, ch)
    end = _RUN_END.search(text, index).start()  # type: ignore[union-attr]
    token = text[index:end]
    if NUMBERLIKE_RE.match(token):
        _diagnose_number(text, index, token)
    if token.startswith(":"):
        if len(token) == 1:
            fail(text, index, "a keyword needs a name after ':'")
        if token[1] not in _NAME_START:
            fail(text, index + 1, f"a keyword name cannot start with {_char_name(token[1])}")
        _diagnose_name(text, index + 1, token[1:], "keyword")
    uri = _URI_PREFIX.match(token)
    if uri:
        if uri.end() == len(token):
            fail(text, index, "a URI needs at least one character after '://'")
        bad = _FORBIDDEN_RE.search(token) or _INVISIBLE_RE.search(token)
        if bad:
            fail(text, index + bad.start(), f"{_forbidden_reason(bad.group())} in a URI")
        _diagnose_delimiter(text, end, token)
    if ch not in _NAME_START:
        if ord(ch) > 127:
            fail(text, index, f"unexpected {_char_name(ch)}: non-ASCII text must be in a "
                 "string")
        fail(text, index, f"unexpected {_char_name(ch)}", expected=("a value",))
    _diagnose_name(text, index, token, "symbol")


def _refuse_special(text: str, index: int, ch: str) -> None:
    """Fail with a specific reason if ``ch`` is a control, BOM or non-CBCL space."""
    if _FORBIDDEN_RE.match(ch):
        fail(text, index, f"{_forbidden_reason(ch)} is not allowed")
    if ch == "\ufeff":
        fail(text, index, "a byte order mark (U+FEFF) is not allowed")
    if ch.isspace():
        fail(text, index, f"{_char_name(ch)} is not whitespace in CBCL (only space, tab, "
             "CR and LF are)")


def _in_comment(text: str, index: int) -> bool:
    """Whether the comment that the scanner skipped runs right up to ``index``. A line
    never starts inside a string (strings hold no raw LF), so scan from the line start."""
    for m in TOKEN.finditer(text, text.rfind("\n", 0, index) + 1):
        kind = m.lastindex or 0
        if m.start(kind) >= index:
            skipped = text[m.start() : m.start(kind)]
            semicolon = skipped.rfind(";")
            return semicolon != -1 and not any(c in skipped[semicolon:] for c in "\r\n")
    return False  # pragma: no cover - TOKEN reaches every index


def _diagnose_name(text: str, index: int, token: str, what: str) -> NoReturn:
    for offset, ch in enumerate(token):
        if ch not in _NAME_CHARS:
            _refuse_special(text, index + offset, ch)
            if ch == ":" and what == "symbol" and token[offset:offset + 3] == "://":
                fail(text, index, "a URI scheme must be lowercase ASCII: [a-z][a-z0-9+.-]*")
            fail(text, index + offset, f"{_char_name(ch)} is not allowed in a {what}")
    _diagnose_delimiter(text, index + len(token), token)


def _diagnose_delimiter(text: str, end: int, token: str) -> NoReturn:
    fail(text, end, f"expected whitespace, '(', ')' or ';' after {token!r}",
         expected=("whitespace", "'('", "')'", "';'"))


def _diagnose_number(text: str, index: int, token: str) -> NoReturn:
    body = token[1:] if token[0] == "-" else token
    if token[0] == "+":
        fail(text, index, "a number cannot start with '+'")
    if body.startswith("."):
        fail(text, index, f"malformed number {token!r}: a decimal needs digits before '.'")
    if token == "-0":
        fail(text, index, "'-0' is not an integer: write 0")
    if len(body) > 1 and body[0] == "0" and body[1].isdigit():
        fail(text, index, f"malformed number {token!r}: leading zeros are not allowed")
    if re.fullmatch(r"-?[0-9]+\.", token):
        fail(text, index, f"malformed number {token!r}: a decimal needs digits after '.'")
    if NUMBER_RE.match(token):
        _diagnose_delimiter(text, index + len(token), token)
    fail(text, index, f"malformed number {token!r} (no exponents, signs other than a "
         "leading '-', or other characters)")


def _diagnose_string(text: str, index: int) -> NoReturn:
    i = index + 1
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            _diagnose_delimiter(text, i + 1, text[index : i + 1])
        if ch == "\\":
            esc = text[i + 1 : i + 2]
            if esc == "u":
                digits = text[i + 2 : i + 6]
                if len(digits) < 4 or not all(c in "0123456789abcdefABCDEF" for c in digits):
                    fail(text, i, "\\u must be followed by four hex digits")
                if 0xD800 <= int(digits, 16) <= 0xDFFF:
                    fail(text, i, f"\\u{digits} is a surrogate, which is not a character")
                i += 6
                continue
            if esc and esc in _SIMPLE_ESCAPES:
                i += 2
                continue
            if not esc:
                break
            fail(text, i, f"invalid escape '\\{esc}' (only \\\" \\\\ \\n \\r \\t and \\uXXXX "
                 "exist)")
        if _FORBIDDEN_RE.match(ch):
            fail(text, i, f"unescaped {_forbidden_reason(ch)} in a string")
        i += 1
    fail(text, index, "unterminated string", expected=("'\"'",))


def _forget_atoms() -> None:
    """Forget the memos' atoms when an intern table is emptied (the token cache here, and
    the native memos where built): none then gives a name's atom from before, equal to the
    one the table holds from now on but not the same object."""
    _CACHE.clear()


try:
    from .._native import (
        NameTable as _NameTable,
        forget_atoms as _forget_native_atoms,
        read_value as _scanner_read_value,
        setup_intern as _setup_intern,
    )
except ImportError:  # not built: the Python reference reads alone
    _read_value_c: Any = None
else:
    _forget_atoms = _forget_native_atoms  # (it empties _CACHE too)
    _read_value_c = _scanner_read_value
    # The C twins intern new names in these very tables (cbcl.core._values' NameTables:
    # the same rules and bound as _intern, in C), and remember new tokens in _CACHE as
    # _atom does (issue 35: a call into Python per new name cost 1.5-2.5 µs against
    # 0.03 µs for a recurring one). When a table is emptied, the memos are too (the
    # native ones and _CACHE), so none gives an atom from before the emptying. A symbol
    # or keyword new to the C reader goes to its table only, not to _CACHE as well.
    if isinstance(_SYMBOLS, _NameTable) and isinstance(_KEYWORDS, _NameTable):
        _setup_intern(_SYMBOLS, _KEYWORDS, _CACHED_CHARS, _CACHE_MAX, _CACHE)
