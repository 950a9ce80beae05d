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
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

from ..core._canonical import canonical_value, quote, too_deep
from ..core._errors import MalformedError
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
from ._fields import _SURROGATE
from ._message import Message

JSON_SAFE_INT = 2**53 - 1
_TAGS = {"int", "decimal", "symbol", "keyword", "uri"}


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
        return obj
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
    raise _bad(path, f"not a CBCL value in the JSON mapping: {obj!r:.60}")


def from_json(obj: Any) -> Value:
    """The CBCL value for an object of the JSON mapping (as ``json.loads`` returns it).

    Raises :class:`MalformedError` naming the JSON path of anything that is not in the
    mapping (floats, ``null``, booleans, unknown tags, invalid symbols …).
    """
    if type(obj) is not list:
        return _atom_from_json(obj, "$")
    root: list[Value] = []
    stack: list[tuple[Any, list[Value], list[Value] | None, str]] = [(iter(obj), root, None, "$")]
    while stack:
        items, out, parent, path = stack[-1]
        for item in items:
            item_path = f"{path}[{len(out)}]"
            if type(item) is list:
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
    if message.body is not None:
        out["body"] = to_json(message.body)
    if message.signature is not None:
        out["signature"] = {"key-id": to_json(message.signature.key_id),
                            "value": to_json(message.signature.value)}
    return out
