"""CBCL ⇄ A2A (the Agent2Agent protocol, ``a2a-sdk`` 1.x, whose types are protobuf): sans-io.

A CBCL message travels as one A2A ``Message`` (spec/interop.md §4):

- a **text part**, ``media_type`` ``application/cbcl``, holding the message's canonical
  text (spec §1.2): *authoritative*; a reader parses it with :func:`cbcl.parse` and
  nothing else;
- a **data part**, ``media_type`` ``application/cbcl+json``, holding the message in the JSON
  mapping of spec §7: *informative* (marked so in its metadata), for A2A peers that do not
  read CBCL. It does not round-trip: a protobuf ``Value`` stores every number as a double,
  so ``1800000`` comes back as ``1800000.0``; a reader only compares it with the text part
  and reports a difference;
- ``message_id`` is the CBCL ``message-id``, ``context_id`` its ``conversation-id``, ``role``
  follows the intent (:data:`USER_INTENTS`), ``extensions`` names :data:`EXTENSION_URI`;
- the message's ``(trace …)`` field, when it has one, is also the message ``metadata``'s
  ``traceparent`` (:data:`TRACEPARENT`), where A2A peers that propagate a W3C trace
  context put it; on the way in one there is taken into a message without a trace.

An A2A message from a peer is untrusted: its size is bounded before it is parsed, every
SDK or protobuf exception becomes a :class:`~cbcl.CBCLError` (``MalformedError`` for what
is not an A2A message carrying one CBCL message, ``LimitError`` for size), and whatever the
A2A message holds that CBCL has no place for is a *loss*: listed, never dropped silently,
and refused (:class:`~cbcl.ProtocolError`) unless the caller passes ``lossy=True``.

The ids A2A assigns are not losses (spec/interop.md §4.2): ``messageId`` names the A2A
carrier (the SDK's clients make a UUID; the CBCL ``message-id`` is the text's), ``taskId``
is the handle a server stamps on every message it receives, and a ``contextId`` is
accepted when it is the CBCL ``conversation-id`` or the message has none (a server makes
one then). The A2A 0.3 JSON form (``kind``, ``role: "user"``, a text part without a media
type, files with ``mimeType``) is read as well as the current one, through the SDK's own
0.3 types, as strictly.

Needs the ``a2a`` extra (``pip install 'cbcl[a2a]'``).
"""

from __future__ import annotations

import binascii
import dataclasses
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

try:
    from a2a.compat.v0_3 import conversions as _v03_conversions, types as _v03_types
    from a2a.types import AgentCard, AgentExtension, Message as A2AMessage, Part, Role, TaskState
    from google.protobuf import json_format, struct_pb2
    from google.protobuf.message import DecodeError, EncodeError
    from pydantic import ValidationError
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError("cbcl's A2A mapping needs the a2a extra: pip install 'cbcl[a2a]'"
                      ) from exc

from ..core._display import escape_invisible
from ..core._errors import LimitError, LossyConversionError, MalformedError
from ..core._limits import DEFAULT_LIMITS, Limits
from ..core._values import URI, Symbol
from ..protocol._api import parse
from ..protocol._descriptor import ProtocolDescriptor
from ..protocol._json import message_to_json
from ..protocol._message import Intent, Message, is_traceparent
from ..protocol._protocol import Protocol
from ..protocol._registry import Registry

__all__ = [
    "DATA_MEDIA_TYPE",
    "EXTENSION_URI",
    "MAX_DATA_DEPTH",
    "MEDIA_TYPE",
    "TASK_STATES",
    "TRACEPARENT",
    "USER_INTENTS",
    "CardProtocol",
    "a2a_json_to_message",
    "a2a_to_message",
    "agent_card_extension",
    "card_protocols",
    "cbcl_text",
    "message_to_a2a",
    "message_to_a2a_json",
    "read_a2a",
    "task_state",
    "write_a2a",
]

#: The media type of the authoritative text part.
MEDIA_TYPE = "application/cbcl"
#: The media type of the informative data part (spec §7's JSON mapping).
DATA_MEDIA_TYPE = "application/cbcl+json"
#: The extension an A2A message and an AgentCard name when they carry CBCL.
EXTENSION_URI = "urn:cbcl:a2a:1.0"
#: The deepest JSON (arrays and objects) the data part may hold: the A2A message's JSON and
#: binary forms must stay within protobuf's recursion limit of 100 (Message, Part and each
#: Value/ListValue level count), which a data part deeper than this exceeds.
MAX_DATA_DEPTH = 48
#: The intents the client side of an A2A exchange (``ROLE_USER``) sends in the shipped
#: conversations: the initiator's of request/v1 and the manager's of contract-net/v1, and
#: the intents that open or end an exchange. Every other intent is ``ROLE_AGENT``.
USER_INTENTS = frozenset({Intent.REQUEST, Intent.CFP, Intent.ACCEPT, Intent.REJECT,
                          Intent.CANCEL, Intent.QUERY, Intent.SUBSCRIBE})

_TEXT_MARK = {"cbcl": "authoritative"}
#: The key of the A2A message ``metadata`` that carries the W3C trace context (the CBCL
#: ``(trace …)`` field), as A2A peers that propagate one write it.
TRACEPARENT = "traceparent"
_DATA_MARK = {"cbcl": "informative",
              "note": "spec §7 JSON mapping through protobuf Value: numbers are doubles "
                      "(1800000 reads 1800000.0); the application/cbcl text part is "
                      "authoritative"}
#: Extra room, beyond the CBCL message limit, for the text part's JSON escapes, the data
#: part (the JSON mapping tags every atom) and the A2A fields around them.
_SIZE_FACTOR = 4
_SIZE_SLACK = 64 << 10
_MAX_LISTED = 16  # losses of one kind listed one by one; the rest counted


def _bound(limits: Limits) -> int:
    return _SIZE_FACTOR * limits.max_message_bytes + _SIZE_SLACK


def _show(text: str, limit: int = 60) -> str:
    return escape_invisible(text, quote=True, limit=limit)


# --------------------------------------------------------------------------- writing


def _json_depth(obj: Any) -> int:
    """The nesting depth of arrays and objects in ``obj`` (iterative)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(obj, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, list):
            children: Iterable[Any] = item
        elif isinstance(item, dict):
            children = item.values()
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        stack.extend((child, depth) for child in children)
    return deepest


def write_a2a(message: Message, *, lossy: bool = False, role: Role | None = None
              ) -> tuple[A2AMessage, list[str]]:
    """The A2A ``Message`` for ``message`` and the list of what it loses.

    The text part carries the whole message, so the only possible loss is the informative
    data part, left out when it would nest deeper than :data:`MAX_DATA_DEPTH` (protobuf's
    recursion limit). ``role`` (an A2A ``Role``) overrides the one the intent gives
    (:data:`USER_INTENTS`). Raises :class:`ProtocolError` for a loss unless ``lossy``, and
    ``TypeError``/``ValueError`` as :func:`cbcl.canonical` does for an invalid message.
    """
    if not isinstance(message, Message):
        raise TypeError(f"expected a cbcl.Message, not {type(message).__name__}")
    text = message.canonical()
    losses: list[str] = []
    parts = [Part(text=text, media_type=MEDIA_TYPE,
                  metadata=json_format.ParseDict(_TEXT_MARK, struct_pb2.Struct()))]
    mapped = message_to_json(message)
    if _json_depth(mapped) > MAX_DATA_DEPTH:
        losses.append(f"data part: left out, the body nests deeper than protobuf's "
                      f"recursion limit allows ({MAX_DATA_DEPTH} JSON levels); the text part "
                      f"carries the whole message")
    else:
        parts.append(Part(data=json_format.ParseDict(mapped, struct_pb2.Value()),
                          media_type=DATA_MEDIA_TYPE,
                          metadata=json_format.ParseDict(_DATA_MARK, struct_pb2.Struct())))
    if losses and not lossy:
        raise _refused("CBCL -> A2A", losses)
    if role is None:
        role = Role.ROLE_USER if message.intent in USER_INTENTS else Role.ROLE_AGENT
    a2a = A2AMessage(message_id=message.message_id, context_id=message.conversation_id or "",
                     role=role, parts=parts, extensions=[EXTENSION_URI])
    if message.trace is not None:  # (also in the text: a copy where A2A peers look)
        a2a.metadata.update({TRACEPARENT: message.trace})
    return a2a, losses


def message_to_a2a(message: Message, *, role: Role | None = None) -> A2AMessage:
    """The A2A ``Message`` (``a2a.types.Message``) for ``message``; refuses a loss (see
    :func:`write_a2a`, which returns the losses and takes ``lossy``)."""
    return write_a2a(message, role=role)[0]


def message_to_a2a_json(message: Message, *, lossy: bool = False) -> tuple[str, list[str]]:
    """The A2A ``Message`` for ``message`` as JSON text, as the SDK serialises it (protobuf's
    JSON mapping: ``messageId``, ``mediaType``, ``ROLE_USER`` …), on one line, every
    invisible character escaped (as ``cbcl parse --json`` writes), and the list of losses.
    Raises as :func:`write_a2a`."""
    a2a, losses = write_a2a(message, lossy=lossy)
    document = json_format.MessageToDict(a2a)
    # A protobuf map (Struct) has no order: put the data part's members in envelope order
    # and the metadata's in name order, so the same message always gives the same text.
    order = list(message_to_json(message))
    for part in document.get("parts", []):
        if isinstance(part.get("data"), dict):
            data = part["data"]
            part["data"] = {key: data[key] for key in order if key in data}
            if isinstance(part["data"].get("signature"), dict):
                signature = part["data"]["signature"]
                part["data"]["signature"] = dict(sorted(signature.items()))
        if isinstance(part.get("metadata"), dict):
            part["metadata"] = dict(sorted(part["metadata"].items()))
    text = json.dumps(document, ensure_ascii=False)
    return escape_invisible(text), losses


# --------------------------------------------------------------------------- reading


def _refused(direction: str, losses: list[str]) -> LossyConversionError:
    return LossyConversionError(losses, what=f"a2a {direction}")


def _is(media_type: str, wanted: str) -> bool:
    return media_type.split(";", 1)[0].strip().lower() == wanted


def _struct_dict(struct: Any) -> dict[str, Any]:
    result: dict[str, Any] = json_format.MessageToDict(struct)
    return result


def _marked(part: Part, mark: str) -> bool:
    """Whether ``part``'s metadata says ``cbcl: mark`` (what :func:`write_a2a` writes)."""
    if not part.HasField("metadata") or "cbcl" not in part.metadata.fields:
        return False
    value = part.metadata.fields["cbcl"]
    return bool(value.WhichOneof("kind") == "string_value" and value.string_value == mark)


def _role_of(part: Part) -> str | None:
    """``"text"`` for a part that carries the CBCL text, ``"data"`` for the informative
    JSON part, ``None`` for any other. The CBCL text is a text part of media type
    ``application/cbcl``; in A2A 0.3 a text part has no media type, so one marked
    ``cbcl: authoritative`` without a media type is too, and so is a raw part of media type
    ``application/cbcl`` (0.3's file with ``bytes`` and that ``mimeType``). The data part is
    ``application/cbcl+json``, or (0.3) marked ``cbcl: informative`` without a media type."""
    kind = part.WhichOneof("content")
    if kind == "text":
        if _is(part.media_type, MEDIA_TYPE) or (not part.media_type
                                                and _marked(part, "authoritative")):
            return "text"
    elif kind == "raw":
        if _is(part.media_type, MEDIA_TYPE):
            return "text"
    elif kind == "data" and (_is(part.media_type, DATA_MEDIA_TYPE)
                             or (not part.media_type and _marked(part, "informative"))):
        return "data"
    return None


def _text_of(part: Part) -> str:
    """The CBCL text a part of role ``"text"`` carries. Raises :class:`MalformedError` for
    raw bytes that are not UTF-8."""
    if part.WhichOneof("content") == "text":
        return part.text
    try:
        return part.raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedError(f"a2a: the {MEDIA_TYPE} raw part is not UTF-8 (byte "
                             f"{exc.start})") from None


def cbcl_text(a2a_message: A2AMessage) -> str | None:
    """The CBCL text an A2A message carries (its one CBCL text part, see :func:`read_a2a`),
    or ``None`` when it has none, several, or raw bytes that are not UTF-8. Nothing is
    parsed: a server uses this to learn a message's conversation before it reads it."""
    parts = [part for part in a2a_message.parts if _role_of(part) == "text"]
    if len(parts) != 1:
        return None
    try:
        return _text_of(parts[0])
    except MalformedError:
        return None


def read_a2a(a2a_message: A2AMessage, *, lossy: bool = False, registry: Registry | None = None,
             limits: Limits | None = None, require_signatures: bool = False
             ) -> tuple[Message, list[str]]:
    """The CBCL message an A2A ``Message`` carries, and the list of what the A2A message
    holds that the CBCL message does not (other parts, metadata, reference task ids, other
    extensions, a ``contextId`` other than the text's conversation-id, a data part that
    differs from the text).

    The CBCL text part — exactly one (:func:`cbcl_text` says which parts count) — is parsed
    with :func:`cbcl.parse`: both passes (and the schema, and signature verification when
    ``registry`` has a trust store; ``require_signatures`` refuses an unsigned message and
    needs one) with ``registry``, pass 1 alone without one. The data part is only compared.
    The ids A2A assigns are not losses: any ``messageId`` (the A2A carrier's id; the CBCL
    message-id is the text's), a ``taskId`` (a server's handle), and a ``contextId`` when the
    CBCL message has no conversation-id.

    Raises :class:`LimitError` for an A2A message larger than 4 × ``max_message_bytes`` +
    64 KiB, :class:`MalformedError` for one that carries no CBCL text part or several,
    what :func:`cbcl.parse` raises for the text, and :class:`ProtocolError` for a loss
    unless ``lossy``.
    """
    if not isinstance(a2a_message, A2AMessage):
        raise TypeError(f"expected an a2a.types.Message, not {type(a2a_message).__name__}")
    limits = DEFAULT_LIMITS if limits is None else limits
    try:
        size = a2a_message.ByteSize()
    except (EncodeError, ValueError, RecursionError) as exc:  # pragma: no cover - upb
        raise MalformedError(f"a2a: the message cannot be measured: {exc}") from None
    if size > _bound(limits):
        raise LimitError(f"a2a: the A2A message takes {size} bytes, more than the "
                         f"{_bound(limits)} allowed (4 x max_message_bytes + 64 KiB)",
                         limit="max_message_bytes", maximum=limits.max_message_bytes)
    texts: list[Part] = []
    datas: list[Part] = []
    losses: list[str] = []
    dropped = 0
    for index, part in enumerate(a2a_message.parts):
        role = _role_of(part)
        if role == "text":
            texts.append(part)
        elif role == "data":
            datas.append(part)
        else:
            dropped += 1
            if dropped <= _MAX_LISTED:
                kind = part.WhichOneof("content")
                losses.append(f"parts[{index}]: a {kind or 'empty'} part "
                              f"({_show(part.media_type) or 'no media type'}) is dropped")
    if dropped > _MAX_LISTED:
        losses.append(f"and {dropped - _MAX_LISTED} more parts are dropped")
    if not texts:
        raise MalformedError(f"a2a: the message carries no {MEDIA_TYPE} text part, so no "
                             f"CBCL message")
    if len(texts) > 1:
        raise MalformedError(f"a2a: the message carries {len(texts)} {MEDIA_TYPE} text "
                             f"parts; a CBCL message travels in exactly one")
    if len(datas) > 1:
        losses.append(f"{len(datas) - 1} extra {DATA_MEDIA_TYPE} data part(s) are dropped")
    message = parse(_text_of(texts[0]), limits=limits, registry=registry,
                    envelope_only=registry is None, require_signatures=require_signatures)
    if a2a_message.context_id and message.conversation_id is not None \
            and a2a_message.context_id != message.conversation_id:
        losses.append(f"contextId {_show(a2a_message.context_id)} differs from the CBCL "
                      f"conversation-id; the CBCL one is kept")
    if len(a2a_message.reference_task_ids):
        losses.append(f"{len(a2a_message.reference_task_ids)} referenceTaskIds are dropped")
    others = [uri for uri in a2a_message.extensions if uri != EXTENSION_URI]
    if others:
        losses.append(f"{len(others)} extension URI(s) other than {EXTENSION_URI} are "
                      f"dropped: {', '.join(_show(uri, 40) for uri in others[:4])}")
    adopted: str | None = None
    if a2a_message.HasField("metadata") and len(a2a_message.metadata.fields):
        fields = a2a_message.metadata.fields
        others_count = len(fields)
        if TRACEPARENT in fields:
            others_count -= 1
            adopted, loss = _traceparent_in(fields[TRACEPARENT], message)
            if loss:
                losses.append(loss)
        if others_count:
            losses.append(f"message metadata ({others_count} key(s)) is dropped")
    text_part = texts[0]
    if text_part.HasField("metadata") and _struct_dict(text_part.metadata) != _TEXT_MARK:
        losses.append("the text part's metadata is dropped")
    if text_part.filename:
        losses.append("the text part's filename is dropped")
    if datas:
        data_part = datas[0]
        expected = json_format.MessageToDict(
            json_format.ParseDict(message_to_json(message), struct_pb2.Value()))
        if json_format.MessageToDict(data_part.data) != expected:
            losses.append(f"the informative {DATA_MEDIA_TYPE} part differs from the text "
                          f"part; the text part is kept")
        if data_part.HasField("metadata") and _struct_dict(data_part.metadata) != _DATA_MARK:
            losses.append("the data part's metadata is dropped")
    if losses and not lossy:
        raise _refused("A2A -> CBCL", losses)
    if adopted is not None:
        message = dataclasses.replace(message, trace=adopted)
    return message, losses


def _traceparent_in(value: Any, message: Message) -> tuple[str | None, str]:
    """What the metadata's ``traceparent`` ``value`` (a protobuf ``Value``) comes to for
    ``message`` (the text's): the trace to give the message (one without a trace and
    without a signature, which covers the field) and the loss, if any (``""``)."""
    text = value.string_value if value.WhichOneof("kind") == "string_value" else None
    if text is not None and text == message.trace:
        return None, ""  # (what write_a2a writes)
    if text is None or not is_traceparent(text):
        return None, (f"metadata {TRACEPARENT} is not a W3C traceparent of version 00 "
                      f"({_show(text or value.WhichOneof('kind') or 'no value')}) and is "
                      "dropped")
    if message.trace is not None:
        return None, (f"metadata {TRACEPARENT} {_show(text)} differs from the text's trace; "
                      f"the text's is kept")
    if message.signature is not None:
        return None, (f"metadata {TRACEPARENT} is dropped: the message is signed and its "
                      f"signature covers the trace")
    return text, ""


def a2a_to_message(a2a_message: A2AMessage, *, registry: Registry | None = None,
                   limits: Limits | None = None) -> Message:
    """The CBCL message an A2A ``Message`` carries; refuses a loss (see :func:`read_a2a`,
    which returns the losses and takes ``lossy``)."""
    return read_a2a(a2a_message, registry=registry, limits=limits)[0]


def a2a_json_to_message(text: str | bytes, *, lossy: bool = False,
                        registry: Registry | None = None, limits: Limits | None = None
                        ) -> tuple[Message, list[str]]:
    """The CBCL message carried by the JSON text of an A2A ``Message`` (as the SDK writes
    it, :func:`message_to_a2a_json`, or in the A2A 0.3 form), and the list of losses
    (:func:`read_a2a`).

    The text (``str``, or UTF-8 ``bytes``) is bounded first (4 × ``max_message_bytes`` +
    64 KiB, in UTF-8 bytes). A JSON object with a ``kind`` member (at the top or in a part)
    or a ``role`` of ``"user"`` or ``"agent"`` is the A2A 0.3 form, read with the SDK's 0.3
    types and turned into the current form by the SDK's own conversion; any other text is
    read with protobuf's JSON parser. Both are strict: an unknown field is refused, not
    ignored. Raises :class:`LimitError`, :class:`MalformedError` for text that is not the
    JSON of an A2A message, and what :func:`read_a2a` raises.
    """
    limits = DEFAULT_LIMITS if limits is None else limits
    bound = _bound(limits)
    if isinstance(text, (bytes, bytearray, memoryview)):
        if len(text) > bound:
            raise _too_large(len(text), bound, limits)
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedError(f"a2a: the JSON text is not UTF-8 (byte {exc.start})"
                                 ) from None
    elif not isinstance(text, str):
        raise TypeError(f"expected str or bytes, not {type(text).__name__}")
    if len(text) > bound or (len(text) * 4 > bound and _utf8_size(text) > bound):
        raise _too_large(_utf8_size(text), bound, limits)
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as exc:  # (JSONDecodeError is a ValueError)
        detail = escape_invisible(str(exc), limit=200)
        raise MalformedError(f"a2a: not JSON: {detail}") from None
    if _is_v03(document):
        a2a_message = _read_v03(text)
    else:
        a2a_message = A2AMessage()
        try:
            json_format.Parse(text, a2a_message)
        except _FOREIGN_ERRORS as exc:
            # json_format raises ParseError for most bad input; the json module and the
            # protobuf runtime can raise the others (a too-deep array, a lone surrogate …).
            detail = escape_invisible(str(exc), limit=200)
            raise MalformedError(f"a2a: not the JSON of an A2A Message: {detail}") from None
    return read_a2a(a2a_message, lossy=lossy, registry=registry, limits=limits)


#: What the JSON and protobuf runtimes and the SDK's 0.3 types raise for input that is not
#: an A2A message (pydantic's ValidationError and binascii.Error are ValueErrors).
_FOREIGN_ERRORS = (json_format.Error, DecodeError, ValueError, TypeError, RecursionError,
                   AttributeError, KeyError, IndexError, OverflowError, binascii.Error)
#: The values of ``role`` in A2A 0.3 (the current form writes ``ROLE_USER``, ``ROLE_AGENT``).
_V03_ROLES = frozenset({"user", "agent"})


def _is_v03(document: object) -> bool:
    """Whether a decoded JSON document is an A2A 0.3 message: an object with a ``kind``
    member, at the top or in one of its parts, or a 0.3 ``role``."""
    if not isinstance(document, dict):
        return False
    role = document.get("role")
    if "kind" in document or (isinstance(role, str) and role in _V03_ROLES):
        return True
    parts = document.get("parts")
    return isinstance(parts, list) and any(isinstance(part, dict) and "kind" in part
                                           for part in parts)


def _read_v03(text: str) -> A2AMessage:
    """The current-form A2A message for the 0.3 JSON ``text``: validated strictly by the
    SDK's 0.3 pydantic types (only their camelCase names; an unknown member is refused),
    then converted by the SDK (``a2a.compat.v0_3.conversions.to_core_message``). Raises
    :class:`MalformedError`."""
    try:
        compat = _v03_types.Message.model_validate_json(
            text, strict=True, extra="forbid", by_alias=True, by_name=False)
        return _v03_conversions.to_core_message(compat)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[:1]
        where = ".".join(str(item) for item in first[0]["loc"]) if first else ""
        detail = escape_invisible(f"{where}: {first[0]['msg']}" if first else str(exc),
                                  limit=200)
        raise MalformedError(f"a2a: not the JSON of an A2A 0.3 Message: {detail}"
                             ) from None
    except _FOREIGN_ERRORS as exc:
        detail = escape_invisible(str(exc), limit=200)
        raise MalformedError(f"a2a: not the JSON of an A2A 0.3 Message: {detail}"
                             ) from None


def _utf8_size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _too_large(size: int, bound: int, limits: Limits) -> LimitError:
    return LimitError(f"a2a: the A2A JSON text takes {size} bytes, more than the {bound} "
                      f"allowed (4 x max_message_bytes + 64 KiB)",
                      limit="max_message_bytes", maximum=limits.max_message_bytes)


# --------------------------------------------------------------------------- AgentCard


def agent_card_extension(protocols: Iterable[Protocol | ProtocolDescriptor], *,
                         required: bool = False, agent: URI | str | None = None
                         ) -> AgentExtension:
    """An ``AgentExtension`` (for ``AgentCard.capabilities.extensions``) saying the agent
    speaks CBCL/1.0 and listing its protocols: id, version (a decimal string: a protobuf
    number is a double), digest (``sha256:…``, the descriptor's name, spec §3.2) and the
    intents each governs. ``required``: whether a client must speak CBCL to use the agent;
    ``agent``: its CBCL URI, the ``receiver`` its messages must name (``params.agent``;
    left out when ``None``). Raises ``ValueError`` for an ``agent`` that is not a URI.
    """
    listed = []
    for protocol in protocols:
        descriptor = protocol.descriptor if isinstance(protocol, Protocol) else protocol
        if not isinstance(descriptor, ProtocolDescriptor):
            raise TypeError(f"expected a Protocol or ProtocolDescriptor, not "
                            f"{type(protocol).__name__}")
        listed.append({"id": str.__str__(descriptor.id), "version": str(descriptor.version),
                       "digest": descriptor.digest,
                       "intents": [intent.value for intent in descriptor.intents]})
    params: dict[str, Any] = {"version": Message.version, "mediaType": MEDIA_TYPE,
                              "dataMediaType": DATA_MEDIA_TYPE, "protocols": listed}
    if agent is not None:
        params["agent"] = str.__str__(URI(str(agent)))
    return AgentExtension(
        uri=EXTENSION_URI, required=required,
        description="Speaks CBCL/1.0: each message is one application/cbcl text part "
                    "(authoritative), recognised by an envelope grammar and the grammar of "
                    "its protocol; params.protocols lists the protocols with their digests.",
        params=json_format.ParseDict(params, struct_pb2.Struct()))


@dataclass(frozen=True, slots=True)
class CardProtocol:
    """A protocol an AgentCard lists (:func:`card_protocols`)."""

    id: str
    version: int
    digest: str
    intents: tuple[Intent, ...]


_MAX_CARD_PROTOCOLS = 256


def card_protocols(card: AgentCard | AgentExtension) -> tuple[CardProtocol, ...]:
    """The CBCL protocols an ``AgentCard`` (or its CBCL ``AgentExtension``) lists; ``()``
    when the card has no CBCL extension. The card is a peer's claim, so everything is
    checked: at most 256 protocols, each id a symbol, the version a decimal int64, the
    digest ``sha256:`` and 64 lowercase hex digits, the intents CBCL intents. Raises
    :class:`MalformedError` for anything else. (A digest here is a claim: trust comes from
    the signed descriptor, spec/trust.md.)"""
    if isinstance(card, AgentCard):
        found = [ext for ext in card.capabilities.extensions if ext.uri == EXTENSION_URI]
        if not found:
            return ()
        extension = found[0]
    elif isinstance(card, AgentExtension):
        extension = card
    else:
        raise TypeError(f"expected an a2a AgentCard or AgentExtension, not "
                        f"{type(card).__name__}")
    try:
        params = _struct_dict(extension.params)
    except (json_format.Error, ValueError, RecursionError) as exc:  # pragma: no cover
        raise MalformedError(f"a2a: the extension's params cannot be read: {exc}") from None
    entries = params.get("protocols", [])
    if not isinstance(entries, list) or len(entries) > _MAX_CARD_PROTOCOLS:
        raise MalformedError(f"a2a: params.protocols must be a list of at most "
                             f"{_MAX_CARD_PROTOCOLS} entries")
    result = []
    for index, entry in enumerate(entries):
        where = f"a2a: params.protocols[{index}]"
        if not isinstance(entry, dict):
            raise MalformedError(f"{where} is not an object")
        ident, version, digest = entry.get("id"), entry.get("version"), entry.get("digest")
        intents = entry.get("intents", [])
        try:
            if not isinstance(ident, str):
                raise ValueError("id is not a string")
            Symbol(ident)
            if not isinstance(version, str) or not version.isdigit() or len(version) > 19 \
                    or str(int(version)) != version or int(version) >= 2**63:
                raise ValueError("version is not a decimal int64 string")
            if not isinstance(digest, str) or len(digest) != 71 or \
                    not digest.startswith("sha256:") or \
                    any(c not in "0123456789abcdef" for c in digest[7:]):
                raise ValueError("digest is not sha256: and 64 lowercase hex digits")
            if not isinstance(intents, list) or len(intents) > len(Intent):
                raise ValueError("intents is not a list of intents")
            parsed = tuple(Intent(name) for name in intents)
        except (ValueError, TypeError) as exc:
            raise MalformedError(f"{where}: {escape_invisible(str(exc), limit=120)}"
                                 ) from None
        result.append(CardProtocol(ident, int(version), digest, parsed))
    return tuple(result)


# --------------------------------------------------------------------------- task states

#: Conversation state → A2A ``TaskState``, per protocol, where one exists
#: (spec/interop.md §4.4). ``start`` (no message yet) has no task; a state a table
#: does not list has no A2A counterpart.
TASK_STATES: dict[str, dict[str, TaskState]] = {
    "request/v1": {
        "requested": TaskState.TASK_STATE_SUBMITTED,
        "agreed": TaskState.TASK_STATE_WORKING,
        "done": TaskState.TASK_STATE_COMPLETED,
        "refused": TaskState.TASK_STATE_REJECTED,
        "failed": TaskState.TASK_STATE_FAILED,
        "cancelled": TaskState.TASK_STATE_CANCELED,
    },
    "contract-net/v1": {
        "called": TaskState.TASK_STATE_SUBMITTED,
        "proposed": TaskState.TASK_STATE_INPUT_REQUIRED,
        "awarded": TaskState.TASK_STATE_WORKING,
        "done": TaskState.TASK_STATE_COMPLETED,
        "refused": TaskState.TASK_STATE_REJECTED,
        "rejected": TaskState.TASK_STATE_CANCELED,
        "failed": TaskState.TASK_STATE_FAILED,
        "cancelled": TaskState.TASK_STATE_CANCELED,
    },
}


def task_state(protocol: str | Symbol, state: str | Symbol) -> TaskState | None:
    """The A2A ``TaskState`` of conversation ``state`` of ``protocol`` (:data:`TASK_STATES`),
    or ``None`` where A2A has none (a protocol without a table, ``start``)."""
    return TASK_STATES.get(str.__str__(protocol), {}).get(str.__str__(state))

