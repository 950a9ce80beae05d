"""The lossless JSON mapping of CBCL values (spec §7), used by ``--json``.

==========  ==============================================================
CBCL        JSON
==========  ==============================================================
STRING      a JSON string
INTEGER     a JSON number when ``|n| <= 2**53 - 1`` (exact in every JSON
            reader), else ``{"int": "<digits>"}``
DECIMAL     ``{"decimal": "<text as read>"}``
SYMBOL      ``{"symbol": "<name>"}``
KEYWORD     ``{"keyword": "<name without the colon>"}``
URI         ``{"uri": "<text>"}``
list        a JSON array
==========  ==============================================================

Both directions are iterative, so depth never meets Python's recursion limit; a value
more than ``MAX_VALUE_DEPTH`` lists deep (or a list that contains itself) is refused with a
``LimitError``. What is not of an exact CBCL type is read as data, never through its own
methods (spec §1.2; ``cbcl.core._values.data_of``), as the other writers read it.

Messages (spec §7.2) go both ways: :func:`message_to_json` writes the object,
:func:`message_to_json_text` the one line ``cbcl parse --json`` prints, and
:func:`message_from_json` reads either back. The reader takes JSON text as hostile input:
the text is bounded before it is read (``JSON_SIZE_FACTOR`` × ``max_message_bytes``), its
nesting is measured without recursion before ``json.loads`` sees it, duplicate member
names, ``NaN``/``Infinity``, floats and lone surrogates are refused, and the message it
builds is then read back by pass 1 from its canonical text — so a JSON message is accepted
exactly when the CBCL text it stands for is, under the same limits, and any input gives a
:class:`~cbcl.Message` or a :class:`~cbcl.CBCLError`.
"""

from __future__ import annotations

import json
import re
from array import array
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from itertools import accumulate
from typing import Any, NoReturn

from ..core._canonical import canonical_value, quote, too_deep
from ..core._display import escape_invisible
from ..core._errors import CBCLError, LimitError, MalformedError, Position
from ..core._limits import DEFAULT_LIMITS, Limits
from ..core._reader import decode
from ..core._values import (
    EXACT_ATOM_TYPES,
    INT64_MAX,
    INT64_MIN,
    ITEM_ITERATORS,
    MAX_VALUE_DEPTH,
    URI,
    Keyword,
    Symbol,
    Value,
    data_of,
)
from ._envelope import parse_envelope
from ._fields import _SURROGATE
from ._message import TRACE_REFUSAL, VERSION, Intent, Message, Signature, is_traceparent

JSON_SAFE_INT = 2**53 - 1
_TAGS = {"int", "decimal", "symbol", "keyword", "uri"}
_SHOWN_AS_THEMSELVES = frozenset({bool, int, float, type(None)})


def _atom_to_json(value: Any) -> Any:
    """The JSON form of an atom of an exact type (:func:`data_of` gives one)."""
    kind = type(value)
    if kind is str:
        if not value.isascii() and _SURROGATE.search(value) is not None:
            quote(value)
        return value
    if kind is int:
        if not INT64_MIN <= value <= INT64_MAX:
            raise ValueError(f"integer {value} is outside the signed 64-bit range")
        return value if -JSON_SAFE_INT <= value <= JSON_SAFE_INT else {"int": str(value)}
    if kind is Symbol:
        return {"symbol": str.__str__(value)}
    if kind is Keyword:
        return {"keyword": str.__str__(value)}
    if kind is URI:
        return {"uri": str.__str__(value)}
    if kind is Decimal:
        return {"decimal": canonical_value(value)}
    raise TypeError(f"{kind.__name__} is not a CBCL value type")  # pragma: no cover


def to_json(value: Value) -> Any:
    """The JSON-ready Python object (``list``/``dict``/``str``/``int``) for a CBCL value.

    Raises ``TypeError``/``ValueError`` as :func:`cbcl.canonical` does (a
    :class:`LimitError` for lists more than ``MAX_VALUE_DEPTH`` deep).
    """
    kind: type = type(value)
    if kind is tuple or kind is list:
        items: Any = iter(value)  # type: ignore[arg-type]  # (a list: kind)
    else:
        items = data_of(value)
        if type(items) not in ITEM_ITERATORS:
            return _atom_to_json(items)
    root: list[Any] = []
    # The open lists, outermost first: the innermost is len(stack) deep.
    stack: list[tuple[Any, list[Any]]] = [(items, root)]
    while stack:
        items, out = stack[-1]
        for item in items:
            kind = type(item)
            if kind in EXACT_ATOM_TYPES:
                out.append(_atom_to_json(item))
                continue
            inner = iter(item) if kind is tuple or kind is list else data_of(item)
            if type(inner) not in ITEM_ITERATORS:
                out.append(_atom_to_json(inner))
                continue
            if len(stack) >= MAX_VALUE_DEPTH:
                raise too_deep()
            child: list[Any] = []
            out.append(child)
            stack.append((inner, child))
            break
        else:
            stack.pop()
    return root


def _bad(path: str, message: str) -> MalformedError:
    return MalformedError(f"{message} at {path}")


def _atom_from_json(obj: Any, path: str) -> Value:
    if type(obj) is str:
        if not obj.isascii() and _SURROGATE.search(obj) is not None:
            raise _bad(path, "a lone surrogate is not text")
        return obj
    if type(obj) is float:
        raise _bad(path, f"the JSON number {obj!r} is not in the mapping (an integer is "
                         f"written without a fraction or exponent, a decimal as "
                         f"{{\"decimal\": \"…\"}})")
    if type(obj) is int:
        if not -JSON_SAFE_INT <= obj <= JSON_SAFE_INT:
            raise _bad(path, "integers beyond 2**53-1 must be written {\"int\": \"...\"}")
        return obj
    if type(obj) is dict and len(obj) == 1:
        ((tag, text),) = obj.items()
        if tag in _TAGS and type(text) is str:
            try:
                if tag == "symbol":
                    return Symbol(text)
                if tag == "keyword":
                    if text.startswith(":"):
                        raise ValueError("keyword names carry no colon in JSON")
                    return Keyword(text)
                if tag == "uri":
                    return URI(text)
                if tag == "int":
                    if text != str(int(text)):
                        raise ValueError("not a canonical integer")
                    number = int(text)
                    if not INT64_MIN <= number <= INT64_MAX:
                        raise ValueError("outside the signed 64-bit range")
                    return number
                number_d = Decimal(text)
                if canonical_value(number_d) != text:
                    raise ValueError("not a CBCL decimal")
                return number_d
            except (ValueError, InvalidOperation) as exc:
                raise _bad(path, f"invalid {tag} {text!r}: {exc}") from None
    if type(obj) is dict:
        shown = 'an object that is not one of {"int"|"decimal"|"symbol"|"keyword"|"uri": ' \
                'STRING}'
    elif type(obj) in _SHOWN_AS_THEMSELVES:
        shown = escape_invisible(f"{obj!r:.60}")
    else:  # (a program's object: named by its type, never through its own methods)
        shown = f"a value of type {type(obj).__name__}"
    raise _bad(path, f"not a CBCL value in the JSON mapping: {shown}")


def from_json(obj: Any) -> Value:
    """The CBCL value for an object of the JSON mapping (as ``json.loads`` returns it).

    Raises :class:`MalformedError` naming the JSON path of anything that is not in the
    mapping (floats, ``null``, booleans, unknown tags, invalid symbols, lone surrogates …),
    :class:`LimitError` for arrays more than ``MAX_VALUE_DEPTH`` deep (or one that contains
    itself).
    """
    return _value_from_json(obj, "$")


def _value_from_json(obj: Any, root_path: str) -> Value:
    if type(obj) is not list:
        return _atom_from_json(obj, root_path)
    root: list[Value] = []
    stack: list[tuple[Any, list[Value], list[Value] | None, str]] = [
        (iter(obj), root, None, root_path)]
    while stack:
        items, out, parent, path = stack[-1]
        for item in items:
            item_path = f"{path}[{len(out)}]"
            if type(item) is list:
                if len(stack) >= MAX_VALUE_DEPTH:
                    raise too_deep()
                stack.append((iter(item), [], out, item_path))
                break
            out.append(_atom_from_json(item, item_path))
        else:
            stack.pop()
            if parent is not None:
                parent.append(tuple(out))
    return tuple(root)


def message_to_json(message: Message) -> dict[str, Any]:
    """A message as a JSON object: envelope fields by their CBCL names, the body in the
    value mapping. Absent optional fields are omitted."""
    out: dict[str, Any] = {
        "version": message.version,
        "message-id": to_json(message.message_id),
        "sender": str.__str__(message.sender),
        "receiver": str.__str__(message.receiver),
        "intent": message.intent.value,
        "protocol": str.__str__(message.protocol),
    }
    optional = (("conversation-id", message.conversation_id),
                ("in-reply-to", message.in_reply_to), ("reply-by", message.reply_by),
                ("timestamp", message.timestamp))
    for name, value in optional:
        if value is not None:
            out[name] = to_json(value)
    if message.trace is not None:
        out["trace"] = message.trace  # (ASCII: a JSON string as itself)
    if message.body is not None:
        out["body"] = to_json(message.body)
    if message.signature is not None:
        out["signature"] = {"key-id": to_json(message.signature.key_id),
                            "value": to_json(message.signature.value)}
    return out


def message_to_json_text(message: Message) -> str:
    """The one line of JSON ``cbcl parse --json`` prints for ``message`` (no LF): the
    object of :func:`message_to_json` as :func:`json.dumps` writes it (``", "`` and
    ``": "`` separators, non-ASCII as itself) with every invisible character escaped
    (spec §6.5). Raises as :func:`message_to_json`."""
    return escape_invisible(json.dumps(message_to_json(message), ensure_ascii=False))


# ----------------------------------------------------------------------- JSON → Message

#: JSON text longer than this many times ``max_message_bytes`` (UTF-8 bytes) is refused
#: before it is read. The JSON of a message is at most about 9 × its canonical text
#: (``{"symbol": "a"}, `` for ``a ``), so no message within the limit is refused by it.
JSON_SIZE_FACTOR = 10

_REQUIRED = ("version", "message-id", "sender", "receiver", "intent", "protocol")
_OPTIONAL = ("conversation-id", "in-reply-to", "reply-by", "timestamp", "trace", "body",
             "signature")
_MEMBERS = frozenset(_REQUIRED + _OPTIONAL)
_SIGNATURE_MEMBERS = ("key-id", "value")
# JSON text with its strings taken out, and then everything but brackets.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_BRACKET_STEPS = str.maketrans({"[": "\x01", "{": "\x01", "]": "\xff", "}": "\xff"})
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_INT_DIGITS = 20  # a plain JSON integer with more digits is beyond any int64


class _Refusal(Exception):
    """Carries a CBCLError out of a ``json.loads`` hook (which may raise only through)."""

    def __init__(self, error: CBCLError) -> None:
        super().__init__(str(error))
        self.error = error


def _members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook``: the object, refusing a member name given twice (RFC 8259
    leaves their meaning open, so two readers may take different ones)."""
    members: dict[str, Any] = {}
    for name, value in pairs:
        if name in members:
            shown = escape_invisible(name, quote=True, limit=60)
            raise _Refusal(MalformedError(f"JSON: member name \"{shown}\" appears twice in "
                                          f"one object"))
        members[name] = value
    return members


def _constant(name: str) -> NoReturn:
    raise _Refusal(MalformedError(f"JSON: {name} is not a number of the mapping"))


def _integer(text: str) -> int:
    if len(text) > _INT_DIGITS:
        raise _Refusal(MalformedError(f"JSON: a {len(text)}-digit integer is beyond the "
                                      f"signed 64-bit range"))
    return int(text)


def _json_depth(text: str) -> int:
    """How deeply arrays and objects nest in JSON text, measured without recursion (in C:
    the strings removed, each bracket a step of +1 or -1, the running sum's maximum)."""
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    steps = array("b", brackets.translate(_BRACKET_STEPS).encode("latin-1"))
    return max(accumulate(steps), default=0)


def _refuse_lone_surrogates(loaded: Any) -> None:
    """Refuse (:class:`MalformedError`, with its JSON path) the first string or member name
    that holds a lone surrogate, which only a ``\\uD800``-style escape can bring: JSON
    text is UTF-8 (RFC 8259 §8.1), and a lone surrogate is no character of it."""
    stack: list[tuple[Any, str]] = [(loaded, "$")]
    while stack:
        item, path = stack.pop()
        kind = type(item)
        if kind is str:
            if _SURROGATE.search(item) is not None:
                raise _bad(path, "a lone surrogate is not text")
        elif kind is list:
            stack.extend((inner, f"{path}[{index}]") for index, inner in enumerate(item))
        elif kind is dict:
            for name, inner in item.items():
                shown = escape_invisible(name, quote=True, limit=40)
                if _SURROGATE.search(name) is not None:
                    raise _bad(f"{path}.{shown}", "a lone surrogate is not text (a member "
                                                   "name)")
                stack.append((inner, f"{path}.{shown}"))


def _load(document: str | bytes | bytearray | memoryview, limits: Limits) -> Any:
    """JSON text (UTF-8 bytes or ``str``) as the Python object ``json.loads`` gives, read
    strictly and within bounds."""
    maximum = JSON_SIZE_FACTOR * limits.max_message_bytes
    size = len(document) if not isinstance(document, memoryview) else document.nbytes
    if size > maximum:
        unit = "characters" if isinstance(document, str) else "bytes"
        raise LimitError(f"JSON text of {size} {unit} exceeds the limit of {maximum} bytes "
                         f"({JSON_SIZE_FACTOR} × max_message_bytes)",
                         limit="max_message_bytes", maximum=limits.max_message_bytes)
    # Strict UTF-8 (a lone surrogate in a str too), refused with its position.
    text = decode(document, Limits(max_message_bytes=maximum))
    depth = _json_depth(text)
    if depth > limits.max_depth:
        raise LimitError(f"JSON: arrays and objects nested {depth} deep, more than the "
                         f"{limits.max_depth} allowed", limit="max_depth",
                         maximum=limits.max_depth)
    try:
        loaded = json.loads(text, object_pairs_hook=_members, parse_constant=_constant,
                            parse_int=_integer)
        if _SURROGATE_ESCAPE.search(text) is not None:
            _refuse_lone_surrogates(loaded)
        return loaded
    except _Refusal as refusal:
        raise refusal.error from None
    except json.JSONDecodeError as exc:
        offset = len(text[:exc.pos].encode("utf-8", "surrogatepass"))
        raise MalformedError(f"JSON: {exc.msg}",
                             position=Position(exc.lineno, exc.colno, offset)) from None
    except RecursionError:  # only under a max_depth beyond the interpreter's stack
        raise LimitError("JSON: nested deeper than this reader can follow",
                         limit="max_depth", maximum=limits.max_depth) from None
    except ValueError as exc:  # (what json.loads raises beyond its own errors)
        raise MalformedError(f"JSON: {exc}") from None


def _string_member(members: Mapping[str, Any], name: str) -> str:
    value = members[name]
    if type(value) is not str:
        raise _bad(f"$.{name}", f"{name} must be a JSON string")
    if not value.isascii() and _SURROGATE.search(value) is not None:
        raise _bad(f"$.{name}", "a lone surrogate is not text")
    return value


def _integer_member(members: Mapping[str, Any], name: str) -> int:
    value = _atom_from_json(members[name], f"$.{name}")
    if type(value) is not int:
        raise _bad(f"$.{name}", f"{name} must be an integer (a JSON number or "
                                f"{{\"int\": \"…\"}})")
    return value


def _signature(value: Any) -> Signature:
    if type(value) is not dict or set(value) != set(_SIGNATURE_MEMBERS):
        raise _bad("$.signature", 'the signature must be {"key-id": STRING, "value": STRING}')
    return Signature(_string_member(value, "key-id"), _string_member(value, "value"))


def message_from_json(document: str | bytes | bytearray | memoryview | dict[str, Any], *,
                      limits: Limits | None = None) -> Message:
    """The :class:`~cbcl.Message` whose JSON mapping (spec §7.2) ``document`` is: JSON text
    (``str`` or UTF-8 bytes; what :func:`message_to_json_text` writes, or any JSON text of
    the same object) or the object ``json.loads`` made of it. The exact inverse of
    :func:`message_to_json`: ``message_from_json(message_to_json(m)) == m``.

    The object must have the six envelope members and may have the optional ones, in any
    order, and no other; values as :func:`message_to_json` writes them. The message is
    then read back by pass 1 (spec §2) from its canonical text under ``limits`` (default
    :data:`~cbcl.DEFAULT_LIMITS`): it is accepted exactly when that text is. The body is
    not judged by its protocol (that is :func:`cbcl.validate`'s or ``parse``'s work).

    Raises :class:`~cbcl.MalformedError` for text that is not strict JSON in UTF-8 (with
    its position), a member name given twice, ``NaN``/``Infinity``, a float, a lone
    surrogate, a missing, unknown or ill-typed member (naming its JSON path) or a message
    pass 1 refuses; :class:`~cbcl.LimitError` for text longer than ``JSON_SIZE_FACTOR`` ×
    ``max_message_bytes``, nesting deeper than ``max_depth``, or a message beyond a limit
    (any other ``document`` is not a JSON object: ``MalformedError``); ``TypeError`` for
    ``limits`` that are not :class:`~cbcl.Limits`.
    """
    limits = DEFAULT_LIMITS if limits is None else limits
    if not isinstance(limits, Limits):
        raise TypeError("limits must be a cbcl.Limits")
    if isinstance(document, (str, bytes, bytearray, memoryview)):
        members: Any = _load(document, limits)
    else:  # a dict (its subclass's data, never its methods), or not a message
        members = dict(dict.items(document)) if isinstance(document, dict) else document
    if type(members) is not dict:
        raise _bad("$", "a message is a JSON object")
    for name in members:
        if name not in _MEMBERS:
            shown = escape_invisible(str(name), quote=True, limit=60)
            raise _bad("$", f"\"{shown}\" is not a member of a message (members: "
                            f"{', '.join(_REQUIRED + _OPTIONAL)})")
    missing = [name for name in _REQUIRED if name not in members]
    if missing:
        raise _bad("$", f"the message has no {', '.join(missing)}")
    if _string_member(members, "version") != VERSION:
        raise _bad("$.version", f"the version must be \"{VERSION}\"")
    intent = _string_member(members, "intent")
    if intent not in _INTENTS:
        raise _bad("$.intent", f"{escape_invisible(intent, quote=True, limit=40)} is not an "
                               f"intent")
    fields: dict[str, Any] = {"intent": Intent(intent)}
    for name, kind in (("message-id", _id_text), ("sender", URI), ("receiver", URI),
                       ("protocol", Symbol), ("conversation-id", _id_text),
                       ("in-reply-to", _id_text), ("trace", _trace_text)):
        if name in members:
            text = _string_member(members, name)
            try:
                fields[name.replace("-", "_")] = kind(text)
            except ValueError as exc:
                raise _bad(f"$.{name}", escape_invisible(str(exc), limit=120)) from None
    for name in ("reply-by", "timestamp"):
        if name in members:
            fields[name.replace("-", "_")] = _integer_member(members, name)
    if "body" in members:
        fields["body"] = _value_from_json(members["body"], "$.body")
    if "signature" in members:
        fields["signature"] = _signature(members["signature"])
    try:
        draft = Message(**fields)
        text = draft.canonical()
    except CBCLError:
        raise
    except (TypeError, ValueError) as exc:  # a field's text pass 1 cannot hold
        raise MalformedError(f"JSON: {escape_invisible(str(exc), limit=200)}") from None
    # Pass 1 on the text the message stands for: the same checks and limits as text. A
    # position would point into that text, which the caller never saw: it is dropped.
    try:
        return parse_envelope(decode(text, limits), limits)
    except CBCLError as exc:
        exc.position, exc.context = None, None
        raise


_INTENTS = frozenset(intent.value for intent in Intent)


def _trace_text(text: str) -> str:
    if not is_traceparent(text):
        raise ValueError(TRACE_REFUSAL)
    return text


def _id_text(text: str) -> str:
    if not text:
        raise ValueError("an id is not empty")
    return text
