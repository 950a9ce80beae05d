"""The message model: a parsed CBCL/1.0 envelope (draft §2) with typed fields."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from ..core._canonical import canonical_value_python, native as _native
from ..core._entries import entry, fallback
from ..core._errors import UnknownProtocolError
from ..core._values import (
    INT64_MAX,
    INT64_MIN,
    URI,
    Symbol,
    Value,
    ValueInput,
    _text_of,
    data_of,
)
from ._fields import _SURROGATE, Fields, FieldsError, check_value

if TYPE_CHECKING:
    from ._registry import Registry

_T = TypeVar("_T")

VERSION = "CBCL/1.0"
_new = object.__new__
_set = object.__setattr__

#: A Message's fields, in grammar order (the attributes Message._trusted sets).
_ATTRIBUTES = ("message_id", "sender", "receiver", "intent", "protocol", "conversation_id",
               "in_reply_to", "reply_by", "timestamp", "trace", "body", "signature")

#: The length of a ``(trace …)`` field's string: a W3C Trace Context ``traceparent`` of
#: version 00, the only form CBCL/1.0 carries (spec/cbcl-1.0.md §2, "trace").
TRACE_CHARS = 55
# version 00, a trace id and a parent id that are not all zeros, the flags; lower-case hex.
#: How a field that is not :func:`is_traceparent` is refused.
TRACE_REFUSAL = (f"trace must be a W3C traceparent of version 00, {TRACE_CHARS} characters: "
                 "00-<32 hex>-<16 hex>-<2 hex>, lower case, neither id all zeros")
_TRACEPARENT = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}\Z")


def is_traceparent(text: object) -> bool:
    """Whether ``text`` is an exact str that a ``(trace …)`` field may hold: a W3C
    ``traceparent`` of version 00 (``00-<32 hex>-<16 hex>-<2 hex>``, lower-case, neither
    id all zeros), :data:`TRACE_CHARS` characters."""
    return type(text) is str and len(text) == TRACE_CHARS and \
        _TRACEPARENT.match(text) is not None

# Storage. Message and Signature are frozen dataclasses over a base class that holds their
# fields: where the extension is built, the C types cbcl._native.MessageFields and
# SignatureFields, whose structs have a member per field (cbcl/_native_src/native.h), so
# that its writers read a message's fields from its struct and its decoders fill one
# directly; else a plain class with a slot per field. Either way an instance has no
# __dict__ (the dataclasses declare ``__slots__ = ()``) and its fields are the base's
# member descriptors, which object.__setattr__ writes past the frozen __setattr__.


class _MessageSlots:
    """The pure-Python storage of :class:`Message`'s fields: a slot each."""

    __slots__ = _ATTRIBUTES


class _SignatureSlots:
    """The pure-Python storage of :class:`Signature`'s fields: a slot each."""

    __slots__ = ("key_id", "value")


if TYPE_CHECKING or _native is None:
    _MessageStorage = _MessageSlots
    _SignatureStorage = _SignatureSlots
else:
    _MessageStorage = _native.MessageFields
    _SignatureStorage = _native.SignatureFields


def _without_class_defaults(cls: type[_T]) -> type[_T]:
    """``cls`` (a dataclass over a storage base, above) without the class attributes that
    ``dataclass`` leaves for the fields' defaults: they would hide the base's member
    descriptors, so that reading the field gave the default. (``dataclass(slots=True)``
    removes them by making the class again; the defaults stay in ``__init__`` and in
    :func:`dataclasses.fields`.)"""
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]  # (a dataclass)
        if field.name in cls.__dict__:
            delattr(cls, field.name)
    return cls


def _state_of(instance: object, names: tuple[str, ...]) -> tuple[object, ...]:
    """The fields ``names`` of a dataclass instance, for ``__getstate__``."""
    return tuple(getattr(instance, name) for name in names)


def _set_state(instance: object, names: tuple[str, ...], state: object) -> None:
    """Set ``__getstate__``'s fields back on a new instance (``copy``, ``pickle``), past
    the frozen ``__setattr__``. Raises ``TypeError`` for a state of another shape."""
    if type(state) is not tuple or len(state) != len(names):
        raise TypeError(f"a {type(instance).__name__} state is a tuple of {len(names)}")
    for name, value in zip(names, state, strict=True):
        _set(instance, name, value)


class Intent(StrEnum):
    """The intents of draft §2. The value is the symbol as written (``NOT-UNDERSTOOD``)."""

    PROPOSE = "PROPOSE"
    ACCEPT = "ACCEPT"
    REJECT = "REJECT"
    INFORM = "INFORM"
    QUERY = "QUERY"
    REQUEST = "REQUEST"
    CFP = "CFP"
    SUBSCRIBE = "SUBSCRIBE"
    NOTIFY = "NOTIFY"
    AGREE = "AGREE"
    REFUSE = "REFUSE"
    FAILURE = "FAILURE"
    CANCEL = "CANCEL"
    CONFIRM = "CONFIRM"
    NOT_UNDERSTOOD = "NOT-UNDERSTOOD"

    # Hash as the str it equals (Enum hashes the member's name, in Python, and so slowly
    # and unlike "NOT-UNDERSTOOD", which the member equals).
    __hash__ = str.__hash__


@_without_class_defaults
@dataclass(frozen=True)
class Signature(_SignatureStorage):
    """A message signature: the signer's key id (a hint) and the base64 Ed25519 value."""

    __slots__ = ()

    key_id: str
    value: str

    # (copy and pickle: the storage's fields are not a __dict__, and C members are not
    # slots copyreg sees)
    def __getstate__(self) -> tuple[object, ...]:
        return _state_of(self, ("key_id", "value"))

    def __setstate__(self, state: object) -> None:
        _set_state(self, ("key_id", "value"), state)


# Each envelope field is read as the body's values are (spec §1.2): a subclass of its type
# through the base type, a member of an enum of such values as its value; never through
# the value's own methods.

def _int64(name: str, value: object) -> int:
    """``value`` as an exact int64 (``TypeError``/``ValueError`` naming field ``name``)."""
    if type(value) is not int:
        try:
            plain = data_of(value)
        except (TypeError, ValueError):
            plain = None
        if type(plain) is not int:
            raise TypeError(f"{name} must be an int, not {type(value).__name__}")
        value = plain
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(f"{name} is outside the signed 64-bit range")
    return value


def _text(name: str, value: object) -> str:
    """``value`` as an exact str (``TypeError`` naming field ``name``)."""
    if type(value) is str:
        return value
    try:
        plain = data_of(value)
    except (TypeError, ValueError):
        plain = None
    if type(plain) is not str:
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    return plain


def _id(name: str, value: object) -> str:
    """``value`` as a non-empty exact str of UTF-8 text (``TypeError``/``ValueError``)."""
    if type(value) is not str:
        value = _text(name, value)
    if not value:
        raise ValueError(f"{name} must not be empty")
    if not value.isascii() and _SURROGATE.search(value) is not None:
        raise ValueError(f"{name} holds a lone surrogate, not UTF-8 text")
    return value


def _intent(value: object) -> Intent:
    """The Intent ``value`` names: a member, or the text of a str (or of a str enum member's
    value), looked up as that exact text. Raises ``ValueError``."""
    text = value if type(value) is str else _text_of(value, "intent")
    return Intent(text)


@_without_class_defaults
@dataclass(frozen=True, kw_only=True)
class Message(_MessageStorage):
    """A CBCL/1.0 message. Fields follow the envelope's order; optional ones may be ``None``
    (``body is None`` means the message has no ``(body …)``).

    Construct one directly to send it: ``sender``/``receiver`` may be given as ``str``
    (converted to :class:`URI`), ``intent`` as ``str`` and ``protocol`` as ``str``. The
    ``body`` must be a CBCL value, built with :func:`cbcl.body` or given as Python values
    that convert as :func:`cbcl.as_value` does (a ``list`` is stored as a ``tuple``).
    Every field, the signature's two included, is read as data (spec §1.2): a subclass of
    its type as the data its base type stores, a member of an enum of such values as its
    value, each stored as the exact type. Raises ``TypeError``/``ValueError`` for a field
    of the wrong type or out of range, the body included (``Message body
    `$.body.bid[:amount]`: float is not a CBCL value …``; a :class:`LimitError` for a body
    more than ``MAX_VALUE_DEPTH`` lists deep or one that contains itself).
    Whether the body is one its protocol accepts is :func:`cbcl.validate`'s question.
    """

    __slots__ = ()

    message_id: str
    sender: URI
    receiver: URI
    intent: Intent
    protocol: Symbol
    conversation_id: str | None = None
    in_reply_to: str | None = None
    reply_by: int | None = None
    timestamp: int | None = None
    trace: str | None = None
    body: Value | None = None
    signature: Signature | None = None

    version: ClassVar[str] = VERSION

    if TYPE_CHECKING:
        # What the generated ``__init__`` accepts: ``__post_init__`` converts ``sender``,
        # ``receiver``, ``intent``, ``protocol`` and ``body`` to the fields' types, so a
        # field's declared type is what reading it gives, this what constructing takes.
        # Declared for the type checker only: at run time the dataclass's own ``__init__``
        # is the one (and ``_trusted``, the parsers' path, bypasses it).
        def __init__(self, *, message_id: str, sender: URI | str, receiver: URI | str,
                     intent: Intent | str, protocol: Symbol | str,
                     conversation_id: str | None = None, in_reply_to: str | None = None,
                     reply_by: int | None = None, timestamp: int | None = None,
                     trace: str | None = None, body: ValueInput | None = None,
                     signature: Signature | None = None) -> None: ...

    def __getstate__(self) -> tuple[object, ...]:
        """The fields, for ``copy`` and ``pickle`` (the storage's are not a ``__dict__``,
        and its C members are not slots ``copyreg`` sees)."""
        return _state_of(self, _ATTRIBUTES)

    def __setstate__(self, state: object) -> None:
        """Set ``__getstate__``'s fields on a new message. Raises ``TypeError`` for a
        state of another shape."""
        _set_state(self, _ATTRIBUTES, state)

    def __post_init__(self) -> None:
        # (each field is replaced by its exact-typed value where it is not one: read as
        # data, spec §1.2; an exact value is kept, not copied)
        if _id("message_id", self.message_id) is not self.message_id:
            _set(self, "message_id", _id("message_id", self.message_id))
        for name in ("sender", "receiver"):
            value = getattr(self, name)
            if type(value) is not URI:
                _set(self, name, URI(value))
        if type(self.intent) is not Intent:
            _set(self, "intent", _intent(self.intent))
        if type(self.protocol) is not Symbol:
            _set(self, "protocol", Symbol(self.protocol))
        for name in ("conversation_id", "in_reply_to"):
            value = getattr(self, name)
            if value is not None and _id(name, value) is not value:
                _set(self, name, _id(name, value))
        for name in ("reply_by", "timestamp"):
            value = getattr(self, name)
            if value is not None and _int64(name, value) is not value:
                _set(self, name, _int64(name, value))
        trace = self.trace
        if trace is not None and not is_traceparent(trace):
            text = _text("trace", trace)
            if not is_traceparent(text):
                raise ValueError(TRACE_REFUSAL)
            _set(self, "trace", text)
        signature = self.signature
        if signature is not None:
            if type(signature) is not Signature:
                raise TypeError("signature must be a Signature")
            key_id = _text("signature key_id", signature.key_id)
            value = _text("signature value", signature.value)
            if key_id is not signature.key_id or value is not signature.value:
                _set(self, "signature", Signature(key_id, value))
        if self.body is not None:
            body = check_value(self.body, "Message body", "$.body")
            if body is not self.body:
                object.__setattr__(self, "body", body)

    @classmethod
    def _trusted(cls, message_id: str, sender: URI, receiver: URI, intent: Intent,
                 protocol: Symbol, conversation_id: str | None = None,
                 in_reply_to: str | None = None, reply_by: int | None = None,
                 timestamp: int | None = None, body: Value | None = None,
                 signature: Signature | None = None, trace: str | None = None) -> Message:
        """A message from fields a parser has already checked, each of its exact type
        (the checks of ``__post_init__`` are skipped: the parse paths are hot). ``trace``
        comes last, after the positional order of the fields before it was added."""
        if _make_object is not None and cls is Message:
            made: Message = _make_object(Message, _ATTRIBUTES, (
                message_id, sender, receiver, intent, protocol, conversation_id,
                in_reply_to, reply_by, timestamp, trace, body, signature))
            return made
        message = _new(cls)
        _set(message, "message_id", message_id)
        _set(message, "sender", sender)
        _set(message, "receiver", receiver)
        _set(message, "intent", intent)
        _set(message, "protocol", protocol)
        _set(message, "conversation_id", conversation_id)
        _set(message, "in_reply_to", in_reply_to)
        _set(message, "reply_by", reply_by)
        _set(message, "timestamp", timestamp)
        _set(message, "trace", trace)
        _set(message, "body", body)
        _set(message, "signature", signature)
        return message

    def to_value(self) -> tuple[Value, ...]:
        """The message as a CBCL value: the envelope list, fields in order."""
        fields: list[Value] = [
            _VERSION_SYMBOL,
            (_FIELD["message-id"], self.message_id),
            (_FIELD["sender"], self.sender),
            (_FIELD["receiver"], self.receiver),
            (_FIELD["intent"], _INTENT_SYMBOL[self.intent]),
            (_FIELD["protocol"], self.protocol),
        ]
        if self.conversation_id is not None:
            fields.append((_FIELD["conversation-id"], self.conversation_id))
        if self.in_reply_to is not None:
            fields.append((_FIELD["in-reply-to"], self.in_reply_to))
        if self.reply_by is not None:
            fields.append((_FIELD["reply-by"], self.reply_by))
        if self.timestamp is not None:
            fields.append((_FIELD["timestamp"], self.timestamp))
        if self.trace is not None:
            fields.append((_FIELD["trace"], self.trace))
        if self.body is not None:
            fields.append((_FIELD["body"], self.body))
        if self.signature is not None:
            fields.append((_FIELD["signature"], self.signature.key_id, self.signature.value))
        return tuple(fields)

    # Where the extension is built, canonical is a C method (cbcl._native.canonical_entry,
    # cbcl/_native_src/entry.h): canonical_message's text, else this method's, the
    # reference, whose documentation it shows.
    @entry(None if _native is None else _native.canonical_entry, method=True)
    def canonical(self) -> str:
        """The canonical text of the message (draft §1.2). Raises as
        :func:`cbcl.canonical`."""
        if _canonical_message is not None:  # the C twin; None: declined (or not built)
            text = _canonical_message(self)
            if text is not None:
                return text
        value = self.to_value()
        if _native is not None:  # (the value's C twin; None: declined)
            text = _native.canonical(value)
            if text is not None:
                return text
        # the body (each field's value) MAX_VALUE_DEPTH deep, in the envelope's two lists
        return canonical_value_python(value, around=2)

    def signing_bytes(self) -> bytes:
        """What a message signature covers (draft §2): the canonical UTF-8 form of the
        message with its ``signature`` element removed."""
        if self.signature is None:
            return self.canonical().encode("utf-8")
        return Message._trusted(self.message_id, self.sender, self.receiver, self.intent,
                                self.protocol, self.conversation_id, self.in_reply_to,
                                self.reply_by, self.timestamp, self.body,
                                None, self.trace).canonical().encode("utf-8")

    def fields(self, registry: Registry | None = None) -> Fields:
        """The body read by field name (see :class:`cbcl.Fields`): ``reply.fields()["price"]``.
        With ``registry``, by the types of the protocol's schema (when it governs the
        intent), after checking the body against it.

        Raises :class:`FieldsError` for a message without a body or with one not of the
        form ``(head … :key value …)``, :class:`UnknownProtocolError` for a protocol the
        registry does not hold, and :class:`SchemaError` for a body its schema refuses.
        """
        schema = None
        if registry is not None:
            protocol = registry.get(self.protocol)
            if protocol is None:
                raise UnknownProtocolError(
                    f"unknown protocol {self.protocol}: no descriptor for it is loaded",
                    protocol=str(self.protocol))
            if self.intent in protocol.governed:
                schema = protocol.schema
        if self.body is None:
            raise FieldsError("$.body: the message has no body", path="$.body")
        return Fields(self.body, schema=schema, path="$.body")


# The envelope's symbols, made once (Symbol() validates its name on every call).
_VERSION_SYMBOL = Symbol(VERSION)
_FIELD = {name: Symbol(name) for name in (
    "message-id", "sender", "receiver", "intent", "protocol", "conversation-id",
    "in-reply-to", "reply-by", "timestamp", "trace", "body", "signature")}
_INTENT_SYMBOL = {intent: Symbol(intent.value) for intent in Intent}

# The C twin of ``canonical()`` (cbcl._native.canonical_message), which writes the text of
# ``canonical_value(message.to_value())`` from the message's fields (its MessageFields
# struct), or declines (None) for anything but an exact Message with an Intent member and
# an exact Signature or none: then the Python path above writes it, or raises. None where
# the module is not built, or the types are not laid out as it reads them (setup_message:
# then canonical's C entry hands every call to the Python method too).
_canonical_message = _native.canonical_message if _native is not None and \
    _native.setup_message(Message, Signature, (_VERSION_SYMBOL, *_FIELD.values()),
                          tuple(_INTENT_SYMBOL.items())) else None
#: The Python method Message.canonical's C entry stands in for (itself where the extension
#: is not built): the reference.
canonical_python = fallback(Message.canonical)


try:
    from .._native import make_object as _make_object_c
except ImportError:  # not built: object.__setattr__ per field
    _make_object: Any = None
else:
    _make_object = _make_object_c
