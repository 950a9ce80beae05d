"""FIPA ACL: the string representation (FIPA SC00070) read and written under limits, and
its mapping to CBCL messages (spec/interop.md, "FIPA ACL").

Everything here is data and pure functions (no I/O, no clock): :func:`read_fipa` and
:func:`write_fipa` are the codec of the string form; :func:`fipa_to_message` and
:func:`message_to_fipa` the mapping, each returning what it lost and refusing
(:class:`LossyConversionError`) when something would be lost and ``lossy`` is false.

The reader is hostile-input code, built like :mod:`cbcl.core._reader`: the input is scanned once
with one compiled expression whose quantifiers are possessive (linear time); the tree is
built with an explicit stack (no recursion); every limit of :class:`cbcl.Limits` is checked
at the token that would exceed it; a byte-length string (``#5"hello``) is refused before
anything is copied when it declares more bytes than the string limit or than the input
holds; every refusal is a :class:`cbcl.CBCLError` with a position.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import NoReturn, TypeAlias

from ..core._canonical import canonical_value
from ..core._errors import (
    CBCLError,
    ConversionError,
    LossyConversionError,
    MalformedError,
    Position,
)
from ..core._limits import DEFAULT_LIMITS, Budget, Limits
from ..core._reader import context_of, read
from ..core._values import URI, URI_REST_EXCLUDES, Keyword, Symbol, Value
from ..protocol._message import Intent, Message, Signature, is_traceparent

__all__ = [
    "AID_SCHEME", "CBCL_LANGUAGE", "CONTENT_HEAD", "NO_PROTOCOL", "PERFORMATIVES",
    "AgentId", "ConversionError", "DateTime", "FipaMessage", "FipaSyntaxError",
    "LossyConversionError", "Number", "Word", "aid_to_uri", "equivalent", "fipa_to_message",
    "message_to_fipa", "message_to_fipa_message", "ms_to_reply_by", "read_fipa",
    "reply_by_to_ms", "uri_to_aid", "write_fipa",
]

# --------------------------------------------------------------------------- errors


class FipaSyntaxError(MalformedError):
    """Text that is not a FIPA ACL message in the string representation (SC00070): exit 3,
    kind ``malformed``, with a position (line, column, byte offset)."""


# --------------------------------------------------------------------------- the model


class Word(str):
    """A FIPA word: an unquoted token (``fipa-sl0``, ``rma@host:1099/JADE``)."""

    __slots__ = ()


class Number(str):
    """A FIPA number, kept as written (``99``, ``-12.23``, ``+.99E-23``)."""

    __slots__ = ()


class DateTime(str):
    """A FIPA date-time token, kept as written (``20020314T091400500Z``)."""

    __slots__ = ()


#: A FIPA expression: a word, a number, a date-time, a string (``str``: quoted, or
#: byte-length-encoded when it is UTF-8 text; ``bytes``: a byte-length-encoded string
#: that is not), or a list of expressions (``tuple``).
Expr: TypeAlias = "Word | Number | DateTime | str | bytes | tuple[Expr, ...]"

#: The 22 communicative acts of FIPA SC00037, as written in SC00070 (lowercase).
PERFORMATIVES = (
    "accept-proposal", "agree", "cancel", "cfp", "confirm", "disconfirm", "failure",
    "inform", "inform-if", "inform-ref", "not-understood", "propagate", "propose", "proxy",
    "query-if", "query-ref", "refuse", "reject-proposal", "request", "request-when",
    "request-whenever", "subscribe",
)


@dataclass(frozen=True, slots=True)
class AgentId:
    """A FIPA agent-identifier: a name, transport addresses (URLs), resolvers (agent
    identifiers of name services) and user-defined slots (``("X-role", Word("buyer"))``)."""

    name: str
    addresses: tuple[str, ...] = ()
    resolvers: tuple[AgentId, ...] = ()
    params: tuple[tuple[str, Expr], ...] = ()


@dataclass(frozen=True, slots=True)
class FipaMessage:
    """One FIPA ACL message (SC00061): the performative (lowercase) and its parameters.

    ``content`` is text, or ``bytes`` when it came as a byte-length-encoded string;
    ``reply_by`` the date-time token as written; ``params`` the user-defined parameters in
    order, each name as written without its colon (``"X-comment"``)."""

    performative: str
    sender: AgentId | None = None
    receivers: tuple[AgentId, ...] = ()
    reply_to: tuple[AgentId, ...] = ()
    content: str | bytes | None = None
    language: Expr | None = None
    encoding: Expr | None = None
    ontology: Expr | None = None
    protocol: str | None = None
    conversation_id: Expr | None = None
    reply_with: Expr | None = None
    in_reply_to: Expr | None = None
    reply_by: str | None = None
    params: tuple[tuple[str, Expr], ...] = field(default=())

    def param(self, name: str) -> Expr | None:
        """The user-defined parameter ``name`` (``"X-comment"``; case-insensitive)."""
        key = name.lower()
        for k, v in self.params:
            if k.lower() == key:
                return v
        return None


# --------------------------------------------------------------------------- the lexer

_DELIM = rb"(?=[ \t\r\n()]|\Z)"
# Group numbers (match.lastindex) of the token kinds.
_LPAR, _RPAR, _STRING, _BYTES, _DATETIME, _NUMBER, _WORD, _EOF, _BAD = range(1, 10)
_TOKEN = re.compile(
    rb"[ \t\r\n]*+(?:"
    rb"(\()"
    rb"|(\))"
    # A quoted string: \" is a quote; any other backslash is itself (SC00070, and JADE).
    rb'|("(?:[^"\\]++|\\"|\\(?!"))*+")' + _DELIM +
    rb'|#([0-9]++)"'  # a byte-length-encoded string's header: the bytes follow
    rb"|([+-]?[0-9]{8}[Tt][0-9]{9}[A-Za-z]?)" + _DELIM +
    rb"|([+-]?(?:[0-9]++\.[0-9]*+|\.[0-9]++)(?:[eE][+-]?[0-9]++)?"
    rb"|[+-]?[0-9]++(?:[eE][+-]?[0-9]++)?)" + _DELIM +
    # A word: not starting with # - @ " or a digit; no whitespace, control or parenthesis.
    rb'|([^\x00-\x20()#\-@"0-9][^\x00-\x20()]*+)' + _DELIM +
    rb"|(\Z)"
    rb"|((?s:.))"
    rb")"
)
# Characters refused in a word (after decoding): DEL, C1 controls, bidirectional controls
# and the invisible characters of CBCL URIs (spec/cbcl-1.0.md §1.4), so that two names that
# look alike are alike.
_WORD_REFUSED = re.compile("[\x7f-\x9f\u202a-\u202e\u2066-\u2069\u00a0\u061c\u1680"
                           "\u2000-\u200f\u2028-\u202f\u205f-\u2064\u3000\ufeff]")
_DIGITS_MAX = 19  # a byte-length header of more digits exceeds every string limit


def _position(data: bytes, offset: int) -> Position:
    offset = max(0, min(offset, len(data)))
    line = data.count(b"\n", 0, offset) + 1
    start = data.rfind(b"\n", 0, offset) + 1
    return Position(line, 1 + len(data[start:offset].decode("utf-8", "replace")), offset)


def _context(data: bytes, offset: int) -> str:
    offset = max(0, min(offset, len(data)))
    before = data[:offset].decode("utf-8", "replace")
    text = before + data[offset:offset + 200].decode("utf-8", "replace")
    return context_of(text, len(before))


def _fail(data: bytes, offset: int, message: str) -> NoReturn:
    raise FipaSyntaxError(message, position=_position(data, offset),
                          context=_context(data, offset))


def _budget(data: bytes, limits: Limits) -> Budget:
    return Budget(limits, lambda offset: (_position(data, offset), _context(data, offset)))


class _List:
    """A list of the tree, with the byte offset of its ``(``."""

    __slots__ = ("items", "offset")

    def __init__(self, offset: int) -> None:
        self.items: list[_Node] = []
        self.offset = offset


class _Atom:
    __slots__ = ("offset", "value")

    def __init__(self, value: Word | Number | DateTime | str | bytes, offset: int) -> None:
        self.value = value
        self.offset = offset


_Node: TypeAlias = "_List | _Atom"


def _text(data: bytes, raw: bytes, offset: int, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        _fail(data, offset + exc.start, f"invalid UTF-8 in {what} (byte 0x{raw[exc.start]:02x})")


_RUN = re.compile(rb"[^\x00-\x20()]*+")


def _diagnose(data: bytes, offset: int) -> NoReturn:
    byte = data[offset:offset + 1]
    end = _RUN.match(data, offset).end()  # type: ignore[union-attr]  # always matches
    if byte not in (b'"', b"#") and end < len(data) and data[end] < 0x20 \
            and data[end] not in b" \t\r\n":
        offset, byte = end, data[end:end + 1]  # a control character inside the token
    if byte == b'"':
        _fail(data, offset, "unterminated string (or a string not followed by whitespace, "
                            "'(' or ')')")
    if byte == b"#":
        _fail(data, offset, "malformed byte-length string: expected #DIGITS\" then the bytes")
    if byte in (b"-", b"+", b".") or byte.isdigit():
        _fail(data, offset, "malformed number or date-time (or one not followed by "
                            "whitespace, '(' or ')')")
    if byte == b"@":
        _fail(data, offset, "a word cannot start with '@'")
    if byte and byte[0] < 0x20:
        _fail(data, offset, f"control character 0x{byte[0]:02x} outside a string")
    _fail(data, offset, f"unexpected character {byte!r} (words hold no control characters)")


def _read_tree(data: bytes, limits: Limits) -> _Node:
    """The one expression ``data`` holds, as a tree, under ``limits``."""
    budget = _budget(data, limits)
    max_items = limits.max_list_items
    max_depth = limits.max_depth
    max_nodes = limits.max_nodes
    max_string = limits.max_string_bytes
    max_name = limits.max_name_chars
    stack: list[_List] = []
    nodes = 0
    pos = 0
    root: _Node | None = None
    size = len(data)
    while True:
        m = _TOKEN.match(data, pos)
        assert m is not None  # the last alternative matches any byte, or the end
        kind = m.lastindex
        start = m.start(kind or 0)
        pos = m.end()
        if kind == _EOF:
            if stack:
                _fail(data, stack[-1].offset, f"{len(stack)} unclosed list(s)")
            if root is None:
                _fail(data, start, "empty input: expected a FIPA ACL message "
                                   "(performative :parameter value …)")
            return root
        if root is not None:
            _fail(data, start, "data after the message (a document holds one message)")
        if kind == _RPAR:
            if not stack:
                _fail(data, start, "unbalanced ')'")
            done = stack.pop()
            if not stack:
                root = done
            continue
        if kind == _BAD:
            _diagnose(data, start)
        nodes += 1
        if nodes > max_nodes:
            budget.exceeded("max_nodes", start)
        if stack and len(stack[-1].items) >= max_items:
            budget.exceeded("max_list_items", start)
        node: _Node
        if kind == _LPAR:
            if len(stack) >= max_depth:
                budget.exceeded("max_depth", start)
            node = _List(start)
            if stack:
                stack[-1].items.append(node)
            stack.append(node)
            continue
        if kind == _STRING:
            raw = m.group(_STRING)[1:-1]
            if len(raw) > max_string and len(raw.replace(b'\\"', b'"')) > max_string:
                budget.exceeded("max_string_bytes", start, "string")
            node = _Atom(_text(data, raw, start + 1, "a string").replace('\\"', '"'), start)
        elif kind == _BYTES:
            start -= 1  # at the '#'
            digits = m.group(_BYTES)
            if len(digits) > _DIGITS_MAX or int(digits) > max_string:
                budget.exceeded("max_string_bytes", start, "string")
            count = int(digits)
            if count > size - pos:
                _fail(data, start, f"byte-length string declares {count} bytes; only "
                                   f"{size - pos} follow")
            payload = data[pos:pos + count]
            try:  # text when it is UTF-8 (as a quoted string would be), else the bytes
                node = _Atom(payload.decode("utf-8"), start)
            except UnicodeDecodeError:
                node = _Atom(payload, start)
            pos += count
            if pos < size and data[pos:pos + 1] not in (b" ", b"\t", b"\r", b"\n", b"(",
                                                        b")"):
                _fail(data, pos, "a byte-length string must be followed by whitespace, "
                                 "'(' or ')'")
        else:
            raw = m.group(kind or 0)
            if len(raw) > max_name:
                text = _text(data, raw, start, "a word")
                if len(text) > max_name:
                    budget.exceeded("max_name_chars", start, "word" if kind == _WORD
                                    else "number")
            if kind == _WORD:
                text = _text(data, raw, start, "a word")
                bad = _WORD_REFUSED.search(text)
                if bad is not None:
                    _fail(data, start + len(text[:bad.start()].encode("utf-8")),
                          f"character U+{ord(bad.group()):04X} is not allowed in a word")
                node = _Atom(Word(text), start)
            elif kind == _DATETIME:
                node = _Atom(DateTime(raw.decode("ascii")), start)
            else:
                node = _Atom(Number(raw.decode("ascii")), start)
        if not stack:
            root = node
        else:
            stack[-1].items.append(node)


def _freeze(node: _Node) -> Expr:
    """The expression a tree node denotes (iteratively: trees may be deep)."""
    if isinstance(node, _Atom):
        return node.value
    done: dict[int, Expr] = {}
    work: list[tuple[_List, bool]] = [(node, False)]
    while work:
        current, expanded = work.pop()
        if expanded:
            done[id(current)] = tuple(
                item.value if isinstance(item, _Atom) else done.pop(id(item))
                for item in current.items)
            continue
        work.append((current, True))
        work.extend((item, False) for item in current.items if isinstance(item, _List))
    return done[id(node)]


# --------------------------------------------------------------------------- the parser

_SLOT = {":sender", ":receiver", ":reply-to", ":content", ":language", ":encoding",
         ":ontology", ":protocol", ":conversation-id", ":reply-with", ":in-reply-to",
         ":reply-by"}
#: How deep agent identifiers may nest through :resolvers (each level is one name service).
MAX_RESOLVER_NESTING = 8


def _head(node: _Node, what: str, data: bytes) -> list[_Node]:
    """The items after the head word ``what`` of the list ``node``."""
    if not isinstance(node, _List):
        _fail(data, node.offset, f"expected ({what} …)")
    items = node.items
    if not items or not isinstance(items[0], _Atom) or type(items[0].value) is not Word \
            or items[0].value.lower() != what:
        _fail(data, (items[0] if items else node).offset, f"expected ({what} …)")
    return items[1:]


def _scalar(node: _Node, data: bytes, what: str) -> str | bytes:
    if not isinstance(node, _Atom):
        _fail(data, node.offset, f"{what}: expected a word or a string, not a list")
    return node.value


def _name_text(node: _Node, data: bytes, what: str) -> str:
    value = _scalar(node, data, what)
    if isinstance(value, bytes):
        value = _text(data, value, node.offset, what)
    if not value:
        _fail(data, node.offset, f"{what} must not be empty")
    return value


def _pairs(items: list[_Node], data: bytes, what: str) -> list[tuple[str, _Atom, _Node]]:
    """``:name value`` pairs, each name once (case-insensitively): the name in lowercase,
    the name's atom (a :class:`Word`) and the value."""
    if len(items) % 2:
        last = items[-1]
        _fail(data, last.offset, f"{what}: a parameter without a value")
    pairs: list[tuple[str, _Atom, _Node]] = []
    seen: set[str] = set()
    for key, value in zip(items[::2], items[1::2], strict=True):
        if not isinstance(key, _Atom) or type(key.value) is not Word \
                or not key.value.startswith(":") or len(key.value) < 2:
            _fail(data, key.offset, f"{what}: expected a parameter name (:name)")
        name = key.value.lower()
        if name in seen:
            _fail(data, key.offset, f"{what}: parameter {key.value} given twice")
        seen.add(name)
        pairs.append((name, key, value))
    return pairs


def _aid(node: _Node, data: bytes, nesting: int = 0) -> AgentId:
    if nesting > MAX_RESOLVER_NESTING:
        _fail(data, node.offset, f"agent identifiers nested in :resolvers more than "
                                 f"{MAX_RESOLVER_NESTING} deep")
    items = _head(node, "agent-identifier", data)
    name: str | None = None
    addresses: tuple[str, ...] = ()
    resolvers: tuple[AgentId, ...] = ()
    params: list[tuple[str, Expr]] = []
    for slot, key, value in _pairs(items, data, "agent-identifier"):
        if slot == ":name":
            name = _name_text(value, data, ":name")
        elif slot == ":addresses":
            addresses = tuple(_name_text(url, data, "an address")
                              for url in _head(value, "sequence", data))
        elif slot == ":resolvers":
            resolvers = tuple(_aid(aid, data, nesting + 1)
                              for aid in _head(value, "sequence", data))
        elif slot.startswith(":x-"):
            params.append((str(key.value)[1:], _freeze(value)))
        else:
            _fail(data, key.offset, f"unknown agent-identifier slot {key.value!s} (slots: "
                                    ":name :addresses :resolvers, user-defined :X-…)")
    if name is None:
        _fail(data, node.offset, "agent-identifier without :name")
    return AgentId(name, addresses, resolvers, tuple(params))


def read_fipa(data: bytes | bytearray | memoryview | str, *,
              limits: Limits = DEFAULT_LIMITS) -> FipaMessage:
    """Read one FIPA ACL message in the string representation (SC00070) from ``data``
    (UTF-8 bytes, or ``str``).

    Performatives, parameter names and the words ``set``, ``sequence`` and
    ``agent-identifier`` are case-insensitive (JADE writes ``REQUEST``). The message is
    read under ``limits``: ``max_message_bytes`` the whole input; ``max_depth`` lists open
    at once; ``max_list_items`` the items of one list; ``max_nodes`` atoms plus lists;
    ``max_string_bytes`` one string (UTF-8 bytes after unescaping; a byte-length string's
    declared length, checked before anything is copied); ``max_name_chars`` one word,
    number or date-time. Raises :class:`FipaSyntaxError` (a :class:`cbcl.MalformedError`)
    or :class:`cbcl.LimitError`, each with a position.
    """
    if isinstance(data, str):
        if len(data) > limits.max_message_bytes:
            _budget(b"", limits).exceeded("max_message_bytes", 0)
        try:
            data = data.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise FipaSyntaxError("a lone surrogate is not valid UTF-8",
                                  position=Position(1, exc.start + 1, exc.start)) from None
    elif isinstance(data, (bytearray, memoryview)):
        data = bytes(data)
    elif not isinstance(data, bytes):
        raise TypeError(f"expected bytes or str, not {type(data).__name__}")
    if len(data) > limits.max_message_bytes:
        Budget(limits, lambda offset: (None, None)).exceeded("max_message_bytes", 0)
    root = _read_tree(data, limits)
    if not isinstance(root, _List):
        _fail(data, root.offset, "a FIPA ACL message is a list: (performative :parameter "
                                 "value …)")
    items = root.items
    if not items or not isinstance(items[0], _Atom) or type(items[0].value) is not Word:
        _fail(data, (items[0] if items else root).offset, "expected a performative")
    performative = items[0].value.lower()
    if performative not in PERFORMATIVES:
        _fail(data, items[0].offset, f"unknown performative {items[0].value} (FIPA SC00037 "
                                     "has: " + " ".join(PERFORMATIVES) + ")")
    fields: dict[str, object] = {}
    params: list[tuple[str, Expr]] = []
    for slot, key, value in _pairs(items[1:], data, "message"):
        if slot in (":sender",):
            fields["sender"] = _aid(value, data)
        elif slot in (":receiver", ":reply-to"):
            fields[slot[1:].replace("-", "_") + ("s" if slot == ":receiver" else "")] = \
                tuple(_aid(aid, data) for aid in _head(value, "set", data))
        elif slot == ":content":
            fields["content"] = _scalar(value, data, ":content")
        elif slot == ":protocol":
            fields["protocol"] = _name_text(value, data, ":protocol")
        elif slot == ":reply-by":
            if not isinstance(value, _Atom) or type(value.value) is not DateTime:
                _fail(data, value.offset, ":reply-by: expected a date-time "
                                          "(YYYYMMDDTHHMMSSmmm and a time zone, e.g. Z)")
            fields["reply_by"] = str(value.value)
        elif slot in _SLOT:
            fields[slot[1:].replace("-", "_")] = _freeze(value)
        elif slot.startswith(":x-"):
            params.append((str(key.value)[1:], _freeze(value)))
        else:
            _fail(data, key.offset, f"unknown message parameter {key.value!s} (user-defined "
                                    "parameters start with :X-)")
    return FipaMessage(performative, params=tuple(params), **fields)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the writer

# What a writer may leave unquoted: JADE's idea of a word (ASCII, no '"'), never one that
# another reader could take for a number, a parameter name or a byte-length string.
_WRITABLE_WORD = re.compile(r"(?![+.]{1,2}[0-9])[!$-'*+,./;-?A-~][!#-'*-~]*")


def _is_word(text: str) -> bool:
    return _WRITABLE_WORD.fullmatch(text) is not None


def _string(text: str) -> str:
    if text.endswith("\\"):  # "…\" would escape its own closing quote: count bytes instead
        return f'#{len(text.encode("utf-8"))}"{text}'
    return '"' + text.replace('"', '\\"') + '"'


def _expr(value: Expr) -> str:
    # Iterative: expressions may be deep.
    out: list[str] = []
    work: list[Expr | None] = [value]  # None closes a list
    while work:
        item = work.pop()
        if item is None:
            out.append(")")
            continue
        if out and out[-1] != "(":
            out.append(" ")
        if isinstance(item, tuple):
            out.append("(")
            work.append(None)
            work.extend(reversed(item))
        elif isinstance(item, bytes):
            try:
                text = item.decode("utf-8")
            except UnicodeDecodeError:
                raise ConversionError(f"a byte string of {len(item)} bytes that are not "
                                      "UTF-8 cannot be written as text") from None
            out.append(f'#{len(item)}"{text}')
        elif type(item) in (Number, DateTime) or (
                type(item) is Word and _is_word(item) and not item.startswith(":")):
            out.append(item)
        else:
            out.append(_string(item))
    return "".join(out).replace("( ", "(")


def _name(text: str) -> str:
    return text if _is_word(text) and not text.startswith(":") else _string(text)


def _write_aid(aid: AgentId) -> str:
    parts = [f"(agent-identifier :name {_name(aid.name)}"]
    if aid.addresses:
        parts.append(" :addresses (sequence " + " ".join(_name(a) for a in aid.addresses)
                     + ")")
    if aid.resolvers:
        parts.append(" :resolvers (sequence " + " ".join(_write_aid(r) for r in aid.resolvers)
                     + ")")
    for key, value in aid.params:
        parts.append(f" :{key} {_expr(value)}")
    return "".join(parts) + ")"


def write_fipa(message: FipaMessage) -> str:
    """The SC00070 string form of ``message``, on one line, parameters in the order JADE
    writes them (sender, receiver, reply-to, content, reply-with, in-reply-to, encoding,
    language, ontology, reply-by, protocol, conversation-id, user-defined). Strings are
    quoted with only ``"`` escaped (as JADE does); a string ending in a backslash is
    written byte-length-encoded. :func:`read_fipa` reads it back as the same message.
    Raises :class:`ConversionError` for a byte string that is not UTF-8 and ``ValueError``
    for an unknown performative or a user-defined parameter whose name is not ``X-…``."""
    if message.performative not in PERFORMATIVES:
        raise ValueError(f"unknown performative {message.performative!r}")
    parts = [f"({message.performative}"]
    if message.sender is not None:
        parts.append(f":sender {_write_aid(message.sender)}")
    for slot, aids in ((":receiver", message.receivers), (":reply-to", message.reply_to)):
        if aids:
            parts.append(f"{slot} (set " + " ".join(_write_aid(a) for a in aids) + ")")
    if message.content is not None:
        content = message.content
        parts.append(":content " + (_expr(content) if isinstance(content, bytes)
                                    else _string(content)))
    for slot, value in ((":reply-with", message.reply_with),
                        (":in-reply-to", message.in_reply_to),
                        (":encoding", message.encoding), (":language", message.language),
                        (":ontology", message.ontology)):
        if value is not None:
            parts.append(f"{slot} {_expr(value)}")
    if message.reply_by is not None:
        parts.append(f":reply-by {message.reply_by}")
    if message.protocol is not None:
        parts.append(f":protocol {_name(message.protocol)}")
    if message.conversation_id is not None:
        parts.append(f":conversation-id {_expr(message.conversation_id)}")
    for key, value in message.params:
        if not key[:2].lower() == "x-" or re.fullmatch(r"[!-'*-~]+", key) is None:
            raise ValueError(f"a user-defined parameter is named X-…, not {key!r}")
        parts.append(f":{key} {_expr(value)}")
    return " ".join(parts) + ")"


# --------------------------------------------------------------------------- the mapping

#: ``:language`` of a FIPA message whose ``:content`` is a CBCL value in its canonical
#: text; its ``:ontology`` then names the CBCL protocol.
CBCL_LANGUAGE = "CBCL/1.0"
#: The CBCL protocol of a FIPA message without ``:protocol`` (and back).
NO_PROTOCOL = Symbol("fipa-acl")
#: The URI scheme of an agent identifier that is not itself a URI (spec/interop.md).
AID_SCHEME = "fipa-aid"
#: The head of the body that carries foreign content (FIPA-SL …) and its description.
CONTENT_HEAD = Symbol("fipa-content")
_X = "X-CBCL-"  # the prefix of the user-defined parameters that carry CBCL-only fields

PERFORMATIVE_INTENT: dict[str, Intent] = {
    "accept-proposal": Intent.ACCEPT, "agree": Intent.AGREE, "cancel": Intent.CANCEL,
    "cfp": Intent.CFP, "confirm": Intent.CONFIRM, "disconfirm": Intent.INFORM,
    "failure": Intent.FAILURE, "inform": Intent.INFORM, "inform-if": Intent.INFORM,
    "inform-ref": Intent.INFORM, "not-understood": Intent.NOT_UNDERSTOOD,
    "propagate": Intent.REQUEST, "propose": Intent.PROPOSE, "proxy": Intent.REQUEST,
    "query-if": Intent.QUERY, "query-ref": Intent.QUERY, "refuse": Intent.REFUSE,
    "reject-proposal": Intent.REJECT, "request": Intent.REQUEST,
    "request-when": Intent.REQUEST, "request-whenever": Intent.REQUEST,
    "subscribe": Intent.SUBSCRIBE,
}
INTENT_PERFORMATIVE: dict[Intent, str] = {
    Intent.ACCEPT: "accept-proposal", Intent.AGREE: "agree", Intent.CANCEL: "cancel",
    Intent.CFP: "cfp", Intent.CONFIRM: "confirm", Intent.FAILURE: "failure",
    Intent.INFORM: "inform", Intent.NOT_UNDERSTOOD: "not-understood",
    Intent.PROPOSE: "propose", Intent.QUERY: "query-ref", Intent.REFUSE: "refuse",
    Intent.REJECT: "reject-proposal", Intent.REQUEST: "request",
    Intent.SUBSCRIBE: "subscribe", Intent.NOTIFY: "inform",  # + :X-CBCL-intent NOTIFY
}
#: FIPA interaction protocols (SC00026, SC00029, SC00030) and CBCL protocols.
PROTOCOL_TO_CBCL: dict[str, Symbol] = {
    "fipa-request": Symbol("request/v1"),
    "fipa-contract-net": Symbol("contract-net/v1"),
    "fipa-iterated-contract-net": Symbol("contract-net/v1"),
}
CBCL_TO_PROTOCOL: dict[Symbol, str] = {
    Symbol("request/v1"): "fipa-request",
    Symbol("contract-net/v1"): "fipa-contract-net",
}

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_DATETIME_RE = re.compile(r"([+-]?)([0-9]{4})([0-9]{2})([0-9]{2})[Tt]([0-9]{2})([0-9]{2})"
                       r"([0-9]{2})([0-9]{3})([A-Za-z]?)")
# Characters percent-encoded in the REST of a fipa-aid URI: '%', the query's delimiters,
# and what a CBCL URI's REST cannot hold.
_PCT = re.compile("[%?&#" + URI_REST_EXCLUDES.replace("\\", "\\\\") + "]")
_URI_TEXT = re.compile(r"[a-z][a-z0-9+.\-]*://[^" + URI_REST_EXCLUDES + r"]+")


def reply_by_to_ms(token: str) -> tuple[int, str | None]:
    """The Unix time in ms of a FIPA date-time, and a loss (or ``None``): a time without a
    time zone designator is read as UTC, which is the loss. Raises
    :class:`ConversionError` for a relative time (``+…``/``-…``: there is no clock here),
    a designator other than ``Z``, or a date that does not exist."""
    m = _DATETIME_RE.fullmatch(token)
    if m is None:
        raise ConversionError(f"not a FIPA date-time: {token!r}")
    sign, year, month, day, hour, minute, second, milli, zone = m.groups()
    if sign:
        raise ConversionError(f"reply-by {token} is a relative time; a conversion has no "
                              "clock to make it absolute")
    if zone not in ("", "Z", "z"):
        raise ConversionError(f"reply-by {token}: time zone designator {zone} is not "
                              "supported (only Z, UTC)")
    try:
        moment = datetime(int(year), int(month), int(day), int(hour), int(minute),
                          int(second), int(milli) * 1000, tzinfo=UTC)
    except ValueError as exc:
        raise ConversionError(f"reply-by {token} is not a date: {exc}") from None
    ms = (moment - _EPOCH) // timedelta(milliseconds=1)
    loss = None if zone else (f"reply-by {token} has no time zone; it was read as UTC "
                              "(FIPA says local time, which a conversion cannot know)")
    return ms, loss


def ms_to_reply_by(ms: int) -> str | None:
    """The FIPA date-time (UTC, ``Z``) of Unix time ``ms``, or ``None`` outside the years
    1 to 9999."""
    try:
        moment = _EPOCH + timedelta(milliseconds=ms)
    except OverflowError:
        return None
    if not 1 <= moment.year <= 9999:  # pragma: no cover - datetime's own range
        return None
    return moment.strftime("%Y%m%dT%H%M%S") + f"{moment.microsecond // 1000:03d}Z"


def _pct(text: str) -> str:
    return _PCT.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode("utf-8")), text)


def _unpct(text: str) -> str:
    try:
        raw = re.sub(rb"%([0-9A-Fa-f]{2})", lambda m: bytes([int(m.group(1), 16)]),
                     text.encode("utf-8"))
        if b"%" in re.sub(rb"%[0-9A-Fa-f]{2}", b"", text.encode("utf-8")):
            raise ValueError("a '%' not followed by two hex digits")
        return raw.decode("utf-8")
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConversionError(f"{AID_SCHEME} URI with a bad percent-encoding: {exc}") from None


def aid_to_uri(aid: AgentId) -> tuple[URI, list[str]]:
    """The CBCL URI of an agent identifier, and what it cannot carry (resolvers,
    user-defined slots). A name that is a URI, without addresses, is that URI; any other
    is ``fipa-aid://NAME?address=URL&…``, percent-encoded (spec/interop.md)."""
    losses = [f"agent {aid.name}: resolvers " + " ".join(r.name for r in aid.resolvers)
              for _ in (0,) if aid.resolvers]
    losses += [f"agent {aid.name}: slot :{key}" for key, _ in aid.params]
    if not aid.addresses and _URI_TEXT.fullmatch(aid.name) \
            and not aid.name.startswith(AID_SCHEME + "://"):
        return URI(aid.name), losses
    uri = f"{AID_SCHEME}://{_pct(aid.name)}"
    if aid.addresses:
        uri += "?" + "&".join("address=" + _pct(a) for a in aid.addresses)
    return URI(uri), losses


def uri_to_aid(uri: URI | str) -> AgentId:
    """The agent identifier of a CBCL URI (the inverse of :func:`aid_to_uri`). Raises
    :class:`ConversionError` for a malformed ``fipa-aid`` URI."""
    text = str(uri)
    prefix = AID_SCHEME + "://"
    if not text.startswith(prefix):
        return AgentId(text)
    rest = text[len(prefix):]
    name, _, query = rest.partition("?")
    addresses: list[str] = []
    if query:
        for part in query.split("&"):
            key, eq, value = part.partition("=")
            if key != "address" or not eq or not value:
                raise ConversionError(f"{AID_SCHEME} URI: unknown query part {part!r} "
                                      "(only address=URL)")
            addresses.append(_unpct(value))
    name = _unpct(name)
    if not name:
        raise ConversionError(f"{AID_SCHEME} URI without a name")
    return AgentId(name, tuple(addresses))


def _expr_text(value: Expr) -> tuple[str, str | None]:
    """The text of an expression used as an identifier or a description (as JADE reads
    it), and a loss when it was a list (its structure)."""
    if isinstance(value, tuple):
        return _expr(value), "a list expression, kept as its text"
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8"), None
        except UnicodeDecodeError:
            return value.decode("utf-8", "replace"), "bytes that are not UTF-8"
    return str(value), None


def _cbcl_protocol(protocol: str | None) -> tuple[Symbol, str | None]:
    if protocol is None:
        return NO_PROTOCOL, None
    known = PROTOCOL_TO_CBCL.get(protocol.lower())
    if known is not None:
        return known, None
    try:
        return Symbol(protocol), None
    except (TypeError, ValueError):
        return NO_PROTOCOL, (f"protocol {protocol}: not a CBCL protocol name; the message "
                             f"gets protocol {NO_PROTOCOL}")


def _fipa_protocol(protocol: Symbol) -> str | None:
    if protocol == NO_PROTOCOL:
        return None
    known = CBCL_TO_PROTOCOL.get(protocol)
    if known is not None:
        return known
    return str(protocol) if _is_word(protocol) else None


def _message_id(message: FipaMessage) -> str:
    digest = hashlib.sha256(write_fipa(replace(message, reply_with=None)).encode("utf-8"))
    return "fipa-" + digest.hexdigest()[:24]


def _refuse_or(losses: list[str], lossy: bool, what: str) -> None:
    if losses and not lossy:
        raise LossyConversionError(losses, what=what)


def fipa_to_message(acl: str | bytes | FipaMessage, *, lossy: bool = False,
                    limits: Limits = DEFAULT_LIMITS) -> tuple[Message, list[str]]:
    """The CBCL message of a FIPA ACL message (text, read by :func:`read_fipa`, or a
    :class:`FipaMessage`), and the list of what was lost, one sentence each.

    Raises :class:`LossyConversionError` when something would be lost and ``lossy`` is
    false; :class:`ConversionError` when no CBCL message can be made (no ``:sender``, no
    ``:receiver``, CBCL content that does not read); the reader's errors for bad text.
    The mapping, and what is lost, is spec/interop.md's "FIPA ACL".
    """
    fipa = acl if isinstance(acl, FipaMessage) else read_fipa(acl, limits=limits)
    if fipa.performative not in PERFORMATIVE_INTENT:
        raise ConversionError(f"unknown performative {fipa.performative!r} (FIPA SC00037 "
                              "has: " + " ".join(PERFORMATIVES) + ")")
    losses: list[str] = []
    covered: set[str] = set()

    def lose(what: str, text: str) -> None:
        covered.add(what)
        losses.append(text)

    if fipa.sender is None:
        raise ConversionError("the FIPA message has no :sender; a CBCL message needs one")
    if not fipa.receivers:
        raise ConversionError("the FIPA message has no :receiver; a CBCL message needs one")
    sender, sender_losses = aid_to_uri(fipa.sender)
    receiver, receiver_losses = aid_to_uri(fipa.receivers[0])
    for text in sender_losses:
        lose("sender", text)
    for text in receiver_losses:
        lose("receivers", text)
    if len(fipa.receivers) > 1:
        lose("receivers", "receivers " + " ".join(a.name for a in fipa.receivers[1:])
             + " (a CBCL message has one receiver: the first is kept)")
    if fipa.reply_to:
        lose("reply_to", "reply-to " + " ".join(a.name for a in fipa.reply_to)
             + " (CBCL replies go to the sender)")

    # User-defined parameters: the X-CBCL-… ones carry CBCL fields, the others are lost.
    x: dict[str, Expr] = {}
    for key, value in fipa.params:
        if key.lower().startswith(_X.lower()):
            x[key[len(_X):].lower()] = value
        else:
            lose("params", f"user-defined parameter :{key}")
    intent = PERFORMATIVE_INTENT[fipa.performative]
    if "intent" in x:
        try:
            intent = Intent(_expr_text(x["intent"])[0])
        except ValueError:
            raise ConversionError(f":{_X}intent {_expr_text(x['intent'])[0]} is not a CBCL "
                                  "intent") from None

    ids: dict[str, str | None] = {}
    for name in ("reply_with", "conversation_id", "in_reply_to"):
        value = getattr(fipa, name)
        if value is None:
            ids[name] = None
            continue
        text, loss = _expr_text(value)
        if loss:
            lose(name, f"{name.replace('_', '-')}: {loss}")
        if not text:
            lose(name, f"{name.replace('_', '-')} is empty (CBCL identifiers are not)")
        ids[name] = text or None
    reply_by = None
    if fipa.reply_by is not None:
        try:
            reply_by, loss = reply_by_to_ms(fipa.reply_by)
        except ConversionError as exc:
            if "relative" not in exc.message:
                raise
            loss = f"{exc.message}: dropped"
        if loss:
            lose("reply_by", loss)
    if "reply-by" in x:  # a CBCL reply-by no FIPA date-time can hold
        reply_by = _int_param(x["reply-by"], "reply-by")
    timestamp = _int_param(x["timestamp"], "timestamp") if "timestamp" in x else None
    trace = None
    if "trace" in x:  # the W3C traceparent (spec/cbcl-1.0.md §2.2), strictly
        trace = _expr_text(x["trace"])[0]
        if not is_traceparent(trace):
            raise ConversionError(f":{_X}trace {trace[:80]!r} is not a W3C traceparent of "
                                  "version 00")
    signature = None
    if "signature" in x or "signature-key-id" in x:
        signature = Signature(_expr_text(x.get("signature-key-id", ""))[0],
                              _expr_text(x.get("signature", ""))[0])

    language = None if fipa.language is None else _expr_text(fipa.language)[0]
    body: Value | None
    protocol: Symbol
    if language is not None and language.lower() == CBCL_LANGUAGE.lower():
        # The content is a CBCL value; the ontology names the CBCL protocol.
        if fipa.content is None:
            raise ConversionError(f":language {CBCL_LANGUAGE} without :content")
        body = _cbcl_body(fipa.content, limits)
        if fipa.ontology is not None:
            try:
                protocol = Symbol(_expr_text(fipa.ontology)[0])
            except (TypeError, ValueError):
                raise ConversionError(f":ontology {_expr_text(fipa.ontology)[0]!r} is not a "
                                      "CBCL protocol name") from None
        else:
            protocol, loss = _cbcl_protocol(fipa.protocol)
            if loss:
                lose("protocol", loss)
        if fipa.encoding is not None:
            lose("encoding", f"encoding {_expr_text(fipa.encoding)[0]} (CBCL content is "
                             "UTF-8 text)")
        if fipa.performative != INTENT_PERFORMATIVE[intent]:
            lose("performative", f"performative {fipa.performative} (it becomes {intent}, "
                                 f"which FIPA writes {INTENT_PERFORMATIVE[intent]})")
    else:
        protocol, loss = _cbcl_protocol(fipa.protocol)
        if loss:
            lose("protocol", loss)
        body = _content_body(fipa, intent, lose)
    if "protocol" in x:
        try:
            protocol = Symbol(_expr_text(x["protocol"])[0])
        except (TypeError, ValueError):
            raise ConversionError(f":{_X}protocol is not a CBCL protocol name") from None

    message_id = ids["reply_with"] or _message_id(fipa)
    try:
        message = Message(message_id=message_id, sender=sender, receiver=receiver,
                          intent=intent, protocol=protocol,
                          conversation_id=ids["conversation_id"],
                          in_reply_to=ids["in_reply_to"], reply_by=reply_by,
                          timestamp=timestamp, trace=trace, body=body, signature=signature)
    except (TypeError, ValueError) as exc:
        raise ConversionError(f"no CBCL message can hold this: {exc}") from None
    # The backstop: whatever does not come back unchanged is a loss, said.
    back, _ = message_to_fipa_message(message, lossy=True)
    for what, before, after in _differences(fipa, back):
        if what not in covered:
            lose(what, f"{what.replace('_', '-')}: {before} would come back as {after}")
    _refuse_or(losses, lossy, "conversion from FIPA ACL")
    return message, losses


def _int_param(value: Expr, what: str) -> int:
    text, _ = _expr_text(value)
    if re.fullmatch(r"-?[0-9]{1,19}", text) is None:
        raise ConversionError(f":{_X}{what} {text!r} is not an integer")
    number = int(text)
    if not -(2**63) <= number < 2**63:
        raise ConversionError(f":{_X}{what} {text} is outside the signed 64-bit range")
    return number


def _cbcl_body(content: str | bytes, limits: Limits) -> Value:

    try:
        return read(content, limits=limits)
    except CBCLError as exc:
        raise ConversionError(f":content is not a CBCL value ({exc.one_line()})") from None


def _content_body(fipa: FipaMessage, intent: Intent,
                  lose: Callable[[str, str], None]) -> Value | None:
    """The ``(fipa-content …)`` body of foreign content, or ``None`` when there is
    nothing to carry."""
    items: list[Value] = []

    if fipa.performative != INTENT_PERFORMATIVE[intent]:
        items += [Keyword("performative"), Symbol(fipa.performative)]
    for name in ("language", "ontology", "encoding"):
        value = getattr(fipa, name)
        if value is not None:
            text, loss = _expr_text(value)
            if loss:
                lose(name, f"{name}: {loss}")
            items += [Keyword(name), text]
    if fipa.content is not None:
        text, loss = _expr_text(fipa.content)
        if loss:
            lose("content", f"content: {loss}")
        items += [Keyword("content"), text]
    if not items:
        return None
    return (CONTENT_HEAD, *items)


def _foreign(body: Value | None) -> dict[str, str] | None:
    """The fields of a ``(fipa-content …)`` body, or ``None`` when ``body`` is not one."""
    if type(body) is not tuple or not body or body[0] != CONTENT_HEAD or len(body) % 2 == 0:
        return None

    fields: dict[str, str] = {}
    for key, value in zip(body[1::2], body[2::2], strict=True):
        name = str(key)
        if type(key) is not Keyword or name not in ("performative", "language", "ontology",
                                                    "encoding", "content") \
                or name in fields or not isinstance(value, str):
            return None
        if name == "performative" and str(value) not in PERFORMATIVES:
            return None
        fields[name] = str(value)
    return fields


def _token(text: str | None) -> Expr | None:
    """An identifier as a word where it can be one (as JADE writes it), else a string."""
    return None if text is None else Word(text) if _is_word(text) else text


def message_to_fipa_message(message: Message, *, lossy: bool = False
                            ) -> tuple[FipaMessage, list[str]]:
    """:func:`message_to_fipa` as a :class:`FipaMessage` (what the SPADE adapter sends as
    metadata)."""
    params: list[tuple[str, Expr]] = []
    foreign = _foreign(message.body)
    if foreign is not None and "performative" in foreign:
        performative = foreign["performative"]
    else:
        performative = INTENT_PERFORMATIVE[message.intent]
    if PERFORMATIVE_INTENT[performative] != message.intent:
        params.append((_X + "intent", Word(message.intent.value)))
    protocol = _fipa_protocol(message.protocol)
    content: str | None = None
    language = ontology = encoding = None
    if foreign is not None:
        content = foreign.get("content")
        language = foreign.get("language")
        ontology = foreign.get("ontology")
        encoding = foreign.get("encoding")
        if _cbcl_protocol(protocol)[0] != message.protocol:
            params.append((_X + "protocol", Word(message.protocol)))
    elif message.body is not None:

        content = canonical_value(message.body)
        language = Word(CBCL_LANGUAGE)
        ontology = Word(message.protocol) if _is_word(message.protocol) else \
            str(message.protocol)
    elif _cbcl_protocol(protocol)[0] != message.protocol:
        params.append((_X + "protocol", Word(message.protocol)))
    reply_by = None
    if message.reply_by is not None:
        reply_by = ms_to_reply_by(message.reply_by)
        if reply_by is None:
            params.append((_X + "reply-by", Number(str(message.reply_by))))
    if message.timestamp is not None:
        params.append((_X + "timestamp", Number(str(message.timestamp))))
    if message.trace is not None:
        params.append((_X + "trace", message.trace))
    if message.signature is not None:
        params.append((_X + "signature-key-id", message.signature.key_id))
        params.append((_X + "signature", message.signature.value))
    fipa = FipaMessage(
        performative, sender=uri_to_aid(message.sender),
        receivers=(uri_to_aid(message.receiver),), content=content,
        language=language if language is None or not _is_word(language) else Word(language),
        encoding=encoding, ontology=ontology if ontology is None or not _is_word(ontology)
        else Word(ontology), protocol=protocol,
        conversation_id=_token(message.conversation_id), reply_with=_token(message.message_id),
        in_reply_to=_token(message.in_reply_to), reply_by=reply_by, params=tuple(params))
    losses: list[str] = []
    if not lossy:  # the backstop: the message must come back unchanged
        try:
            back, _ = fipa_to_message(fipa, lossy=True)
        except CBCLError as exc:
            losses.append(f"the FIPA message does not convert back ({exc.one_line()})")
        else:
            if back != message:
                losses.append("the FIPA message converts back to a different CBCL message: "
                              + back.canonical())
        _refuse_or(losses, lossy, "conversion to FIPA ACL")
    return fipa, losses


def message_to_fipa(message: Message, *, lossy: bool = False) -> tuple[str, list[str]]:
    """The FIPA ACL string form of a CBCL message, and the list of what was lost (empty:
    every CBCL field has a place in FIPA, those FIPA lacks in ``:X-CBCL-…`` parameters).

    The body is written as ``:content`` in its canonical text with ``:language CBCL/1.0``
    and ``:ontology PROTOCOL``; a ``(fipa-content …)`` body (foreign content that came
    from FIPA) is written back as the content and description it holds. Raises
    :class:`LossyConversionError` when the result would not convert back to the same
    message and ``lossy`` is false. The mapping is spec/interop.md's "FIPA ACL"."""
    fipa, losses = message_to_fipa_message(message, lossy=lossy)
    return write_fipa(fipa), losses


# --------------------------------------------------------------------------- equivalence


def _norm(value: Expr | None) -> object:
    """An expression as FIPA readers compare it: words, strings and numbers by their text
    (JADE reads each of them as the same String); lists item by item."""
    if value is None:
        return None
    if isinstance(value, tuple):
        return tuple(_norm(item) for item in value)
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value
    return str(value)


def _norm_aid(aid: AgentId) -> object:
    return (aid.name, aid.addresses, tuple(_norm_aid(r) for r in aid.resolvers),
            tuple((k.lower(), _norm(v)) for k, v in aid.params))


def _differences(a: FipaMessage, b: FipaMessage) -> list[tuple[str, object, object]]:
    """The parameters of ``a`` that ``b`` does not hold unchanged (``b``'s additions —
    a generated :reply-with, :X-CBCL-… parameters — are not differences)."""
    out: list[tuple[str, object, object]] = []

    def check(name: str, before: object, after: object) -> None:
        if before is not None and before != () and before != after:
            out.append((name, before, after))

    check("performative", a.performative, b.performative)
    check("sender", None if a.sender is None else _norm_aid(a.sender),
          None if b.sender is None else _norm_aid(b.sender))
    check("receivers", tuple(map(_norm_aid, a.receivers)), tuple(map(_norm_aid, b.receivers)))
    check("reply_to", tuple(map(_norm_aid, a.reply_to)), tuple(map(_norm_aid, b.reply_to)))
    for name in ("content", "language", "encoding", "ontology", "conversation_id",
                 "reply_with", "in_reply_to"):
        check(name, _norm(getattr(a, name)), _norm(getattr(b, name)))
    check("protocol", None if a.protocol is None else a.protocol.lower(),
          None if b.protocol is None else b.protocol.lower())
    if a.reply_by is not None:
        try:
            before: object = reply_by_to_ms(a.reply_by)[0]
        except ConversionError:
            before = a.reply_by
        after = None if b.reply_by is None else reply_by_to_ms(b.reply_by)[0]
        check("reply_by", before, after)
    b_params = {k.lower(): _norm(v) for k, v in b.params}
    for key, value in a.params:
        check("params", (key, _norm(value)), (key, b_params.get(key.lower())))
    return out


def equivalent(a: FipaMessage, b: FipaMessage) -> bool:
    """Whether ``b`` holds every parameter of ``a`` unchanged, as FIPA readers compare
    them (words and strings of the same text are the same value; receivers in order;
    date-times by the instant they name)."""
    return not _differences(a, b)

