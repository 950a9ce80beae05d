"""The binary form (spec/binary.md): a symbol-table codec on msgpack, recognised on decode.

Theory of operation
-------------------
A frame is a fixed header (magic, format version, flags, the protocol's 32-byte digest or a
negotiated short id) followed by a *flat* stream of msgpack objects: the envelope fields,
then the body as one token per atom or parenthesis. Nothing is nested in msgpack (the
decoder's unpacker refuses every array and map), so msgpack's own nesting limits never
apply; depth is CBCL's limit, counted by the walker below, identically whichever msgpack
implementation runs.

Body tokens are small integers (``(`` ``)``, grammar literals and keywords from a table both
sides derive from the descriptor, and back-references to symbols, keywords and URIs already
seen in the frame), bare msgpack strings for STRING atoms, and a one-byte kind code
followed by the text (or integer) for the other atoms. A code names an *atom*; whether that
atom is a grammar literal or data is decided by the grammar, exactly as in text
(:meth:`Tables.can_shift`), so the encoder needs no grammar and the decoder makes the same
decision the text path makes.

Decoding has two tiers. The fast tier (:func:`_fast_message`, :func:`_fast_body`) reads
a frame that needs no error in one pass: it builds the body with an explicit stack, checks
each limit where it could be exceeded, steps the protocol's :class:`StackAutomaton`, and
declines (returns ``None``, never raises) on anything else; its two hot loops have C twins
in the optional extension ``cbcl._native``. The careful tier (:func:`_decode_tokens`)
then walks the declined frame's tokens, checking every limit at the token that would
exceed it and driving the LALR tables with the recognition kernel (:mod:`._kernel`, which
also words the refusal, as for text), and raises errors in the order the text path raises
them: limits first (a grammar refusal is remembered while the rest of the frame is checked
for limits), then the envelope, then the intent rules, then the grammar, then the schema.
Byte offsets are computed only when an error is raised.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar, overload

import msgpack
import msgpack.fallback

from ..core._canonical import _decimal, native as _native, too_deep
from ..core._entries import entry, fallback
from ..core._errors import (
    BodyError,
    EnvelopeError,
    MalformedError,
    Position,
    ProtocolError,
    UnknownProtocolError,
)
from ..core._limits import DEFAULT_LIMITS, Budget, Limits
from ..core._reader import (
    _KEYWORD_CACHE,
    _SYMBOL_CACHE,
    intern_keyword,
    intern_symbol,
    nowhere,
)
from ..core._values import (
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
from ..core._vocabulary import (
    CODE_DECIMAL,
    CODE_INTEGER,
    CODE_KEYWORD,
    CODE_KINDS,
    CODE_LPAR,
    CODE_RPAR,
    CODE_SYMBOL,
    CODE_URI,
    DECIMAL_RE,
    FIRST_ENTRY,
    MAX_DECIMAL_CHARS,
    NAME_RE,
    SYMBOL_RE,
    URI_RE,
)
from ..grammar._automaton import ACCEPT, REFUSED, apply_set_ops
from ..grammar._kernel import (
    ACCEPTED,
    REFUSED as REFUSED_BY_GRAMMAR,
    WHOLE,
    body_refusal,
    feed,
    take_value,
    terminal_of,
)
from ..grammar._lalr import value_states
from ..protocol._api import _verified as _verify_signed, check_constraints, check_outgoing
from ..protocol._hints import body_hint, heads_of_lists
from ..protocol._message import (
    _ATTRIBUTES as _MESSAGE_ATTRIBUTES,
    TRACE_CHARS,
    TRACE_REFUSAL,
    VERSION,
    Intent,
    Message,
    Signature,
    is_traceparent,
)
from ..protocol._pass2 import (
    _ALWAYS_ADMITTED,
    CLOSE,
    END,
    ITEM,
    Refusal,
    find_refusal,
    recogniser_start,
    refusal_error,
    start_stack,
    walker_marks,
)
from ..protocol._protocol import Protocol
from ..protocol._records import record_of
from ..protocol._registry import Registry
from ..protocol._schema import _has_heads, check_schema

if TYPE_CHECKING:  # (only where the extension is built: the Python path never makes one)
    from .._native import FrameState

MAGIC = b"\xcbL"
FORMAT_VERSION = 1
FLAG_SHORT_ID = 0x01
DIGEST_BYTES = 32
HEADER_BYTES = 4 + DIGEST_BYTES
SHORT_HEADER_BYTES = 4 + 2

# Token codes (positive msgpack integers; cbcl.core._vocabulary, mirrored by the C enum).
LPAR, RPAR, INTEGER, DECIMAL = CODE_LPAR, CODE_RPAR, CODE_INTEGER, CODE_DECIMAL
SYMBOL, KEYWORD, URI_CODE = CODE_SYMBOL, CODE_KEYWORD, CODE_URI

# Presence bits of the optional envelope fields, in envelope order.
HAS_CONVERSATION_ID = 1
HAS_IN_REPLY_TO = 2
HAS_REPLY_BY = 4
HAS_TIMESTAMP = 8
HAS_SIGNATURE = 16
HAS_BODY = 32
HAS_TRACE = 64
#: One more than the largest presence bits (every optional field present).
_PRESENCES = 128

#: Intents by their wire index (the order of draft §2).
INTENTS: tuple[Intent, ...] = tuple(Intent)
_INTENT_INDEX = {intent: index for index, intent in enumerate(INTENTS)}


def _decline(*args: object) -> None:
    """What the C twins below are where the module is not built: they decline."""


# The C twins of Encoder.encode's frame writer (cbcl._native.pack_message and
# encode_message): they write the tokens Encoder.encode's Python path builds, from the
# message's slots, or decline (None) for anything but the ordinary case.
if _native is not None:
    _native.setup_frame(INTENTS, (HAS_CONVERSATION_ID, HAS_IN_REPLY_TO, HAS_REPLY_BY,
                                  HAS_TIMESTAMP, HAS_SIGNATURE, HAS_BODY, HAS_TRACE),
                        Registry)
_pack_message: Callable[[bytes, Message, object], bytes | None] = \
    _decline if _native is None else _native.pack_message
_encode_message: Callable[[Message, Registry, dict[Protocol, Any]], bytes | None] = \
    _decline if _native is None else _native.encode_message

_OPTIONAL_NAMES = ((HAS_CONVERSATION_ID, "conversation-id"), (HAS_IN_REPLY_TO, "in-reply-to"),
                   (HAS_REPLY_BY, "reply-by"), (HAS_TIMESTAMP, "timestamp"),
                   (HAS_SIGNATURE, "signature"), (HAS_BODY, "body"), (HAS_TRACE, "trace"))
_KIND_CODES = {Symbol: SYMBOL, Keyword: KEYWORD, URI: URI_CODE}
_DATA_TERMINALS = {Symbol: "SYMBOL", Keyword: "KEYWORD", URI: "URI"}
_KIND_TERMINALS = {code: kind for code, kind in CODE_KINDS.items() if code != INTEGER}
_MAX_DECIMAL_TEXT = MAX_DECIMAL_CHARS
_new = str.__new__


@dataclass(frozen=True, slots=True, eq=False)
class SymbolTable:
    """What both sides derive from a protocol's descriptor: its grammar literals (symbols
    and keywords) in the order the grammar first writes them, coded from ``FIRST_ENTRY``."""

    protocol: Protocol
    digest: bytes
    #: The literal atoms, by code - FIRST_ENTRY.
    atoms: tuple[Symbol | Keyword, ...]
    #: Each literal's terminal (``LIT_n``), aligned with ``atoms``.
    terminals: tuple[str, ...]
    #: Atom -> code.
    codes: dict[Value, int]
    #: Terminal -> the state shifting it enters when it can only start a whole ``value``
    #: (empty if the grammar has no ``value``); see :func:`cbcl.grammar._lalr.value_states`.
    value_states: dict[str, int]
    #: Code -> (atom, its literal terminal), for the decoder's fast path.
    entries: dict[int, tuple[Value, str]]
    #: The same pairs by code - FIRST_ENTRY (what the C fast path indexes).
    entry_list: tuple[tuple[Value, str], ...]

    @classmethod
    def of(cls, protocol: Protocol) -> SymbolTable:
        pairs = sorted(protocol.atoms.items(), key=lambda pair: int(pair[1][4:]))
        atoms = tuple(atom for atom, _ in pairs)  # the reader's shared atoms already
        return cls(protocol, digest_bytes(protocol.digest), atoms,  # type: ignore[arg-type]
                   tuple(terminal for _, terminal in pairs),
                   {atom: FIRST_ENTRY + index for index, atom in enumerate(atoms)},
                   value_states(protocol.tables),
                   {FIRST_ENTRY + index: (atom, terminal)
                    for index, (atom, (_, terminal)) in enumerate(zip(atoms, pairs, strict=True))},
                   tuple((atom, terminal) for atom, (_, terminal) in zip(atoms, pairs,
                                                                         strict=True)))


def digest_bytes(digest: str) -> bytes:
    """The 32 raw bytes of a ``sha256:<hex>`` digest."""
    if not digest.startswith("sha256:") or len(digest) != 7 + 2 * DIGEST_BYTES:
        raise ValueError(f"not a sha256 digest: {digest!r}")
    return bytes.fromhex(digest[7:])


def _at(offset: int) -> Position:
    return Position(0, 0, offset)


def _malformed(message: str, offset: int, error: type[MalformedError] = MalformedError,
               ) -> NoReturn:
    raise error(message, position=_at(offset))


def _located(offset: int) -> tuple[Position, None]:
    return _at(offset), None


def _limit(limits: Limits, name: str, offset: int, subject: str | None = None) -> NoReturn:
    """Raise the :class:`LimitError` of limit ``name`` at byte ``offset``."""
    Budget(limits, _located).exceeded(name, offset, subject)


def _check_short_ids(short_ids: Mapping[int, str] | None) -> dict[int, str]:
    result: dict[int, str] = {}
    for key, digest in (short_ids or {}).items():
        if type(key) is not int or not 0 <= key <= 0xFFFF:
            raise ValueError(f"a short id is an int from 0 to 65535, not {key!r}")
        digest_bytes(digest)
        result[key] = digest
    return result


# --------------------------------------------------------------------------- encoding


class _EncoderSlots:
    """The pure-Python storage of what :meth:`Encoder.encode`'s C entry reads: a slot
    each (where the extension is built, cbcl._native.EncoderFields holds them as named
    members of its C struct, which the entry reads directly)."""

    __slots__ = ("_registry_protocols", "_tables", "registry", "validate")


# (an if, not a ternary: mypy takes the TYPE_CHECKING branch as the base class)
if TYPE_CHECKING or _native is None:  # noqa: SIM108
    _EncoderStorage = _EncoderSlots
else:
    _EncoderStorage = _native.EncoderFields


class Encoder(_EncoderStorage):
    """Encodes messages of the protocols in ``registry`` as binary frames.

    ``short_ids`` maps negotiated short ids to protocol digests; a protocol with one is
    named by it instead of its 32-byte digest.

    By default every message is validated first, as :func:`cbcl.validate` does, under
    ``limits`` (default :data:`DEFAULT_LIMITS`; the frame's own size counts too): a frame
    the encoder returns is one a decoder with those limits accepts (its signature aside).
    ``validate=False`` skips that, for a trusted hot path that has validated already; then
    a message its protocol refuses gives a frame every decoder refuses, exactly as its
    text would be refused. ``pure_python=True`` writes frames with the Python twin of the
    optional accelerator ``cbcl._native`` (the frames and errors are the same).
    """

    # (validate, registry, _tables and _registry_protocols are the storage's, which
    # Encoder.encode's C entry reads)
    __slots__ = ("__weakref__", "_native", "_short", "limits")

    def __init__(self, registry: Registry, *, short_ids: Mapping[int, str] | None = None,
                 validate: bool = True, limits: Limits | None = None,
                 pure_python: bool = False) -> None:
        if not isinstance(registry, Registry):
            raise TypeError("registry must be a cbcl.Registry")
        limits = DEFAULT_LIMITS if limits is None else limits
        if not isinstance(limits, Limits):
            raise TypeError("limits must be a cbcl.Limits")
        if type(validate) is not bool:
            raise TypeError("validate must be a bool")
        self.registry = registry
        self.validate = validate
        self.limits = limits
        self._short = {digest: key for key, digest in _check_short_ids(short_ids).items()}
        # Per protocol: its symbol table, frame header and the table as the C twin takes it
        # (cbcl._native.prepare; None: the Python twin writes, as under pure_python=True).
        self._tables: dict[Protocol, tuple[SymbolTable, bytes, object]] = {}
        self._native = None if pure_python else _native
        # The registry and its dicts of loaded protocols (the same dicts for its lifetime):
        # those the validating C path serves (none with constraints) and all of them, for
        # the unvalidated one (which checks no rule), so the C entry finds a message's
        # protocol without reading the registry's attributes; it reads the registry's
        # _protocols_by_id() again if self.registry is another one.
        self._registry_protocols = (registry, registry._protocols_by_id(),
                                    registry._all_protocols_by_id())

    def _table(self, message: Message) -> tuple[SymbolTable, bytes, object]:
        protocol = self.registry.get(message.protocol)
        if protocol is None:
            raise UnknownProtocolError(
                f"unknown protocol {message.protocol}: no descriptor for it is loaded",
                protocol=str(message.protocol))
        cached = self._tables.get(protocol)
        if cached is None:
            table = SymbolTable.of(protocol)
            short = self._short.get(protocol.digest)
            if short is None:
                header = MAGIC + bytes((FORMAT_VERSION, 0)) + table.digest
            else:
                header = MAGIC + bytes((FORMAT_VERSION, FLAG_SHORT_ID)) + short.to_bytes(2, "big")
            prepared = None if self._native is None else self._native.prepare(table.codes)
            cached = self._tables[protocol] = (table, header, prepared)
        return cached

    # Where the extension is built, encode is a C method (cbcl._native.encode_entry,
    # cbcl/_native_src/entry.h): the ordinary call, validate=False, served in C
    # (encode_message), any other, or one it declines, by this method, the reference,
    # whose documentation it shows.
    @entry(None if _native is None else _native.encode_entry, method=True)
    def encode(self, message: Message) -> bytes:
        """The binary frame of ``message``.

        Raises :class:`UnknownProtocolError` for a protocol the registry does not hold,
        ``TypeError``/``ValueError`` for a body that is not a CBCL value (as
        :func:`cbcl.canonical` does), and, when validating, what :func:`cbcl.validate`
        raises (:class:`LimitError`, :class:`ProtocolError`, :class:`BodyError`,
        :class:`SchemaError`) and :class:`LimitError` for a frame larger than
        ``limits.max_message_bytes``.
        """
        if not self.validate:
            # The hot path, one C call: the table _table cached for the protocol (as
            # registry.get finds it; None under pure_python=True), then the frame _table's
            # and the lines below would write; None: declined, or not cached yet.
            frame = _encode_message(message, self.registry, self._tables)
            if frame is not None:
                return frame
        if not isinstance(message, Message):
            raise TypeError(f"expected a cbcl.Message, not {type(message).__name__}")
        table, header, prepared = self._table(message)
        if self.validate:
            check_outgoing(table.protocol, message, self.limits)
        if prepared is not None:  # the C twin, in one call
            frame = _pack_message(header, message, prepared)
            if frame is not None:
                if self.validate and len(frame) > self.limits.max_message_bytes:
                    Budget(self.limits, nowhere).exceeded("max_message_bytes", 0, "frame")
                return frame
        # not built, or declined: the Python twin writes it (or raises)
        present = 0
        tokens: list[Any] = [_INTENT_INDEX[message.intent], 0, message.message_id,
                             message.sender, message.receiver]
        if message.conversation_id is not None:
            present |= HAS_CONVERSATION_ID
            tokens.append(message.conversation_id)
        if message.in_reply_to is not None:
            present |= HAS_IN_REPLY_TO
            tokens.append(message.in_reply_to)
        if message.reply_by is not None:
            present |= HAS_REPLY_BY
            tokens.append(message.reply_by)
        if message.timestamp is not None:
            present |= HAS_TIMESTAMP
            tokens.append(message.timestamp)
        if message.trace is not None:
            present |= HAS_TRACE
            tokens.append(message.trace)
        if message.signature is not None:
            present |= HAS_SIGNATURE
            tokens.append(message.signature.key_id)
            tokens.append(message.signature.value)
        body = message.body
        if body is not None:
            present |= HAS_BODY
        tokens[1] = present
        # (a message pack_message declines, a subclass say, may still have a body the C twin
        # of the tail writes)
        frame = None if prepared is None or _native is None else \
            _native.pack_frame(header, tokens, body, prepared)
        if frame is None:
            if body is not None:
                _body_tokens(body, dict(table.codes), tokens)
            try:
                packed: bytes = msgpack.packb(tokens)
            except UnicodeEncodeError:
                raise ValueError("a string holds a lone surrogate, not UTF-8 text") from None
            # ``tokens`` packs as one array; the frame holds its elements without the array
            # header (fixarray: 1 byte, array 16: 3, array 32: 5).
            first = packed[0]
            skip = 1 if first < 0xDC else (3 if first == 0xDC else 5)
            frame = header + packed[skip:]
        if self.validate and len(frame) > self.limits.max_message_bytes:
            Budget(self.limits, nowhere).exceeded("max_message_bytes", 0, "frame")
        return frame


def _body_tokens(body: Value | list[Any], codes: dict[Value, int], out: list[Any]) -> None:
    """Append the tokens of ``body``; ``codes`` (the symbol table) grows with each
    symbol, keyword and URI written out in full. What is not of an exact CBCL type is read
    as data (:func:`cbcl.core._values.data_of`), so only exact atoms meet ``codes`` (their
    hash and equality are the value types' own). Raises as :func:`cbcl.canonical` does
    (a :class:`LimitError` for lists more than ``MAX_VALUE_DEPTH`` deep)."""
    append = out.append
    kind = type(body)
    if kind is tuple or kind is list:
        items: Any = iter(body)  # type: ignore[arg-type]
    else:
        items = _atom_tokens(body, codes, append)
        if items is None:
            return
    append(LPAR)
    stack: list[Iterator[Any]] = [items]  # the open lists: the innermost is len(stack) deep
    while stack:
        for item in stack[-1]:
            kind = type(item)
            if kind is tuple or kind is list:
                inner = iter(item)
            elif kind is str:
                append(item)
                continue
            elif (kind is Symbol or kind is Keyword) and (code := codes.get(item)):
                append(code)  # a literal or a name already written: its code
                continue
            else:  # (a list a value not of an exact type stands for: opened below)
                inner = _atom_tokens(item, codes, append)
                if inner is None:
                    continue
            if len(stack) >= MAX_VALUE_DEPTH:
                raise too_deep()
            append(LPAR)
            stack.append(inner)
            break
        else:
            stack.pop()
            append(RPAR)


def _atom_tokens(item: Any, codes: dict[Value, int], append: Any) -> Iterator[Any] | None:
    """Append the tokens of an atom; what is not of an exact type is read as data first
    (:func:`data_of`), and for a list that gives the iterator over its items, which the
    caller opens (nothing is appended)."""
    kind = type(item)
    if kind is str:
        append(item)
    elif kind is Symbol or kind is Keyword or kind is URI:
        code = codes.get(item)
        if code is None:
            codes[item] = FIRST_ENTRY + len(codes)
            append(_KIND_CODES[kind])
            append(str.__str__(item))
        else:
            append(code)
    elif kind is int:
        if not INT64_MIN <= item <= INT64_MAX:
            raise ValueError(f"integer {item} is outside the signed 64-bit range")
        append(INTEGER)
        append(item)
    elif kind is Decimal:
        append(DECIMAL)
        append(_decimal(item))
    else:  # not of an exact type: read as data (an exact atom, or a list's items)
        plain = data_of(item)
        if type(plain) in ITEM_ITERATORS:
            return plain  # type: ignore[return-value]  # (an iterator)
        return _atom_tokens(plain, codes, append)  # (an exact atom: one level)
    return None


# --------------------------------------------------------------------------- decoding


_R = TypeVar("_R")


class Decoder:
    """Decodes and fully recognises binary frames of the protocols in ``registry``.

    ``limits`` are those of the text path (default :data:`DEFAULT_LIMITS`); the frame's
    size counts against ``max_message_bytes``. ``short_ids`` maps negotiated short ids to
    protocol digests. ``pure_python=True`` uses msgpack's pure-Python unpacker instead of
    its C extension, and the Python twins of the optional accelerator ``cbcl._native``
    (results and errors are the same). As in :func:`cbcl.parse`, a signed
    message is verified when the registry has a trust store, and ``require_signatures``
    refuses unsigned ones (it needs a trust store: ``ValueError`` otherwise).
    """

    # (slots: Decoder.decode's C entry reads _frame_state, require_signatures and registry
    # through their member descriptors)
    __slots__ = (
        "__weakref__",
        "_fast_c",
        "_frame_state",
        "_memos",
        "_short",
        "_unpacker",
        "limits",
        "registry",
        "require_signatures",
    )

    def __init__(self, registry: Registry, *, limits: Limits | None = None,
                 short_ids: Mapping[int, str] | None = None, pure_python: bool = False,
                 require_signatures: bool = False) -> None:
        self._setup(registry, limits, short_ids, pure_python, require_signatures, False)

    def _setup(self, registry: Registry, limits: Limits | None,
               short_ids: Mapping[int, str] | None, pure_python: bool,
               require_signatures: bool, one_shot: bool) -> None:
        if not isinstance(registry, Registry):
            raise TypeError("registry must be a cbcl.Registry")
        limits = DEFAULT_LIMITS if limits is None else limits
        if not isinstance(limits, Limits):
            raise TypeError("limits must be a cbcl.Limits")
        if require_signatures and registry.trust is None:
            raise ValueError("require_signatures needs a registry with a trust store")
        self.registry = registry
        self.limits = limits
        self.require_signatures = require_signatures
        self._short = _check_short_ids(short_ids)
        self._unpacker = msgpack.fallback.Unpacker if pure_python else msgpack.Unpacker
        # cbcl._native, when built, runs the fast path (_fast_frame: its envelope reader
        # and body builder), except under pure_python=True: then the Python loop reads
        # msgpack's tokens.
        self._fast_c: tuple[Any, Any] | None = None if pure_python or \
            _build_body_c is None else (_frame_envelope_c, _build_body_c)
        # This decoder's own symbol tables and atom memos; the one-shot decode()'s are
        # shared, one per registry (_one_shot_memos).
        self._memos = memos = _one_shot_memos(registry) if one_shot else _Memos()
        # What cbcl._native.decode_frame reads with each frame (None: not built, or
        # pure_python): the whole frame in one call where it can (_frame_state).
        self._frame_state: FrameState | None = None if self._fast_c is None or \
            _decode_frame_c is None else _frame_state(registry, limits, memos)

    def _table(self, digest: bytes, offset: int) -> SymbolTable:
        memos = self._memos
        table = memos.by_digest.get(digest)
        if table is not None and self.registry.get(table.protocol.id) is table.protocol:
            return table
        loaded = self.registry.protocols()
        if loaded != memos.built_from:  # (identity: a Protocol equals only itself)
            # The registry changed since the tables were made: a table per loaded protocol,
            # made only for those that are new (an unknown digest alone rebuilds nothing).
            kept = {t.protocol: t for t in memos.by_digest.values()}
            memos.by_digest = {t.digest: t for t in (
                kept.get(protocol) or SymbolTable.of(protocol) for protocol in loaded)}
            memos.built_from = loaded
            plans = memos.frame_plans  # (in place: each decoder's _frame_state holds it)
            plans.clear()
            plans.update((key, _frame_plan(t)) for key, t in memos.by_digest.items())
        table = memos.by_digest.get(digest)
        if table is None:
            name = "sha256:" + digest.hex()
            raise UnknownProtocolError(
                f"unknown protocol {name}: no descriptor with this digest is loaded",
                protocol=name, position=_at(offset))
        return table

    # Where the extension is built, decode is a C method (cbcl._native.decode_entry,
    # cbcl/_native_src/entry.h): a frame of exact bytes with a frame state is
    # decode_frame's, any other call, or a frame it declines, this method's.
    @overload
    def decode(self, data: bytes | bytearray | memoryview, *, type: None = None) -> Message: ...
    @overload
    def decode(self, data: bytes | bytearray | memoryview, *, type: type[_R]) -> _R: ...
    @overload
    def decode(self, data: bytes | bytearray | memoryview, *, type: Any) -> Any: ...

    @entry(None if _native is None else _native.decode_entry, _verify_signed, method=True)
    def decode(self, data: bytes | bytearray | memoryview, *, type: Any = None) -> Any:
        """Decode one frame (without its stream length prefix) and recognise it.

        Raises :class:`MalformedError` for a broken frame (:class:`EnvelopeError` for
        envelope fields pass 1 refuses, :class:`BodyError` for a body the grammar refuses),
        :class:`LimitError`, :class:`UnknownProtocolError` for an unknown digest or short
        id, :class:`ProtocolError` for an intent the protocol does not govern,
        :class:`SchemaError` (:class:`ConstraintError` for a rule of the protocol's
        constraints, spec/conversations.md §5),
        :class:`TrustError` for a bad or missing required message signature, and
        ``TypeError`` for input that is not bytes.

        With ``type=`` a :class:`cbcl.Record` class (or ``A | B``), the message's body is
        returned as an instance of it (:func:`cbcl.descriptor.record_of`: :class:`SchemaError` for a
        body that is not the class's).
        """
        if type is not None:  # the message as without type= (the C entry's call), converted
            message = self.decode(data)
            return record_of(message, type, self.registry.get(message.protocol))
        # (the C entry standing in for this method has tried cbcl._native.decode_frame on
        # a frame of exact bytes where there is a frame state: this is reached when it
        # declined, and _decode_tiers decides the frame without trying it again)
        message = self._decode_tiers(data)
        if message.signature is not None or self.require_signatures:
            _verify_signed(message, self.registry)
        check_constraints(self.registry, message)
        return message

    def _decode_tiers(self, data: bytes | bytearray | memoryview) -> Message:
        """:meth:`decode` by the tiers (fast; by the body's value, where ``cbcl._native``
        builds it: see :func:`_frame_by_value`; then careful), without the signature
        check."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"expected bytes, not {type(data).__name__}")
        # (decode_frame, where it read this frame, has declined it: most likely a refusal)
        declined = self._frame_state is not None and type(data) is bytes
        data = bytes(data)
        limits = self.limits
        size = len(data)
        if size > limits.max_message_bytes:
            _limit(limits, "max_message_bytes", 0, "frame")
        table, start = self._header(data)
        declined = declined and table.protocol.constraints is None  # (never served in C)
        if self._fast_c is not None:  # cbcl._native reads the frame's bytes
            message = None if declined else \
                _fast_frame(table, data, start, limits, self._memos, *self._fast_c)
            if message is None:  # decided from the body's value (a refusal at C speed)
                message = _frame_by_value(table, data, start, limits, self._memos,
                                          *self._fast_c)
            if message is None:  # a frame it declines: msgpack reads it, carefully
                message = _decode_tokens(table, self._tokens(data, start), limits, data,
                                         start, self._unpacker)
        else:
            tokens = self._tokens(data, start)
            message = _fast_message(table, tokens, limits, None, self._memos)
            if message is None:
                message = _decode_tokens(table, tokens, limits, data, start, self._unpacker)
        return message

    def _header(self, data: bytes) -> tuple[SymbolTable, int]:
        if len(data) < 4:
            _malformed("truncated frame header", len(data))
        if data[:2] != MAGIC:
            _malformed("not a CBCL binary frame (bad magic)", 0)
        if data[2] != FORMAT_VERSION:
            _malformed(f"unsupported binary format version {data[2]}: this engine speaks "
                       f"version {FORMAT_VERSION}", 2)
        flags = data[3]
        if flags & ~FLAG_SHORT_ID:
            _malformed(f"reserved flag bits set (0x{flags:02x})", 3)
        if flags & FLAG_SHORT_ID:
            if len(data) < SHORT_HEADER_BYTES:
                _malformed("truncated frame header", len(data))
            key = int.from_bytes(data[4:6], "big")
            digest = self._short.get(key)
            if digest is None:
                raise UnknownProtocolError(f"unknown short protocol id {key}",
                                           protocol=f"#{key}", position=_at(4))
            return self._table(digest_bytes(digest), 4), SHORT_HEADER_BYTES
        if len(data) < HEADER_BYTES:
            _malformed("truncated frame header", len(data))
        return self._table(data[4:HEADER_BYTES], 4), HEADER_BYTES

    def _tokens(self, data: bytes, start: int) -> list[Any]:
        payload = data[start:]
        unpacker = self._new_unpacker(len(payload))
        unpacker.feed(payload)
        try:
            tokens = list(unpacker)
            # Whether the tokens end exactly at the end of the frame: a nil fed after it is
            # read back as nil only at an object boundary (never inside a cut-short object).
            unpacker.feed(b"\xc0")
            complete = unpacker.unpack() is None
        except Exception:  # any msgpack failure is a malformed frame
            complete = False
        if not complete:
            _msgpack_failure(payload, start, self.limits.max_message_bytes)
        return tokens

    def _new_unpacker(self, payload: int) -> Any:
        # No arrays, maps, binary or extension data exist in a frame: refusing them in the
        # unpacker means nothing nests, and no length field can make it allocate. A string
        # may claim up to the message limit: the unpacker waits for its bytes (and finds
        # the frame truncated) rather than allocating, in both implementations alike.
        return self._unpacker(raw=False, max_buffer_size=payload + 1,
                              max_str_len=self.limits.max_message_bytes, max_bin_len=0,
                              max_array_len=0, max_map_len=0, max_ext_len=0,
                              strict_map_key=True)


def _msgpack_failure(payload: bytes, start: int, max_str: int) -> NoReturn:
    """Raise the error for msgpack data that is invalid or cut short. The diagnosis always
    runs msgpack's pure-Python unpacker, so both implementations report the same error at
    the same offset."""
    unpacker = msgpack.fallback.Unpacker(
        raw=False, max_buffer_size=len(payload) + 1, max_str_len=max_str, max_bin_len=0,
        max_array_len=0, max_map_len=0, max_ext_len=0, strict_map_key=True)
    unpacker.feed(payload)
    offset = 0
    try:
        for _ in unpacker:
            offset = unpacker.tell()
    except Exception as exc:
        raise MalformedError("invalid msgpack data, or a kind of data no frame holds "
                             "(array, map, binary, extension)",
                             position=_at(start + offset)) from exc
    raise MalformedError("truncated frame: it ends inside a msgpack object",
                         position=_at(start + offset))


def _token_offset(unpacker_class: Any, data: bytes, start: int, index: int) -> int:
    """The byte offset in ``data`` of token ``index`` (the end if there are fewer)."""
    payload = data[start:]
    unpacker = unpacker_class(raw=False, max_buffer_size=max(len(payload), 1),
                              max_str_len=max(len(payload), 1), max_bin_len=0,
                              max_array_len=0, max_map_len=0, max_ext_len=0)
    unpacker.feed(payload)
    offset = 0
    for count, _ in enumerate(unpacker):
        if count == index:
            return start + offset
        offset = unpacker.tell()
    return start + offset


_MISSING = object()
_OPTIONAL_FIELDS = ((HAS_CONVERSATION_ID, str), (HAS_IN_REPLY_TO, str), (HAS_REPLY_BY, int),
                    (HAS_TIMESTAMP, int))


#: How many atoms of each kind (URIs, short decimals) one decoder remembers.
MEMO_ENTRIES = 1024
#: The longest text a decoder remembers an atom by (longer ones are validated each time:
#: few recur, and kept they would hold up to MEMO_ENTRIES frames' worth of bytes).
MEMO_CHARS = 128
#: The longest decimal a decoder remembers (as the reader: short ones recur, longer ones
#: seldom); ``cbcl/_native_src/speedups.c`` constructs longer ones itself (DECIMAL_MEMO_CHARS).
_DECIMAL_MEMO_CHARS = 4


class _Memos:
    """What one :class:`Decoder` remembers between frames, owned by it (the one-shot
    :func:`decode` shares one per registry, :func:`_one_shot_memos`): its symbol tables
    by digest (rebuilt from the registry when it changes, so at most one per loaded
    protocol) and the atoms written in full it has validated already, by text: URIs
    (senders and receivers recur in every message) and short decimals. Each atom memo
    holds at most :data:`MEMO_ENTRIES` texts of at most :data:`MEMO_CHARS` characters,
    and is emptied when full, so a flood of atoms cannot keep later ones out for good.
    A memo only saves validating again: a text maps to the same immutable value whether it
    is found or made, so what is remembered is never observable (and sharing one between
    threads is safe under the GIL: each step is one dict operation). Symbols and keywords
    are the reader's process-wide intern tables (``cbcl.core._reader._SYMBOLS``), shared so a
    frame's atoms are the very objects of the grammars' tables (:attr:`caches` holds
    ``_SYMBOL_CACHE``: those tables where they are dicts, else empty dicts in front of the
    native ones)."""

    __slots__ = ("built_from", "by_digest", "caches", "decimals", "default_state", "entries",
                 "frame_plans", "frame_states", "keep", "make_atom", "uris")

    def __init__(self) -> None:
        self.entries = MEMO_ENTRIES
        self.by_digest: dict[bytes, SymbolTable] = {}
        #: The registry's protocols when :attr:`by_digest` was made.
        self.built_from: tuple[Protocol, ...] = ()
        #: The tables of :attr:`by_digest` as cbcl._native.decode_frame reads them
        #: (:func:`_frame_plan`), made with them.
        self.frame_plans: dict[bytes, tuple[Any, ...]] = {}
        #: The one-shot decode()'s frame states (:func:`_frame_state`) by the id of their
        #: limits, each with those limits (held: an id is not reused while they are here);
        #: at most FRAME_STATES, emptied when full.
        self.frame_states: dict[int, tuple[Limits, FrameState]] = {}
        #: The one-shot decode()'s frame state for DEFAULT_LIMITS (None until made).
        self.default_state: FrameState | None = None
        self.uris: dict[str, URI] = {}
        self.decimals: dict[str, Decimal] = {}
        #: By token code, the atoms already made of each kind written in full, by text:
        #: what the fast path (and its C twin, cbcl._native.build_body) looks in first.
        self.caches: tuple[dict[str, Any] | None, ...] = (
            None, None, None, self.decimals, _SYMBOL_CACHE, _KEYWORD_CACHE, self.uris)
        #: The fast path's make_atom, bound once (the Python loop calls it on a miss).
        self.make_atom: Callable[[int, Any], Value | None] = self._make_atom
        #: What the C twins call on a miss, for an atom they have validated already.
        self.keep: Callable[[int, str], Value] = self._keep

    def uri(self, text: str) -> URI | None:
        """The :class:`URI` spelled ``text``, or ``None`` if it is not one (remembered)."""
        if _URI_MATCH(text) is None:
            return None
        return self._remember_uri(text)

    def _remember_uri(self, text: str) -> URI:
        uri = _new(URI, text)
        if len(text) <= MEMO_CHARS:
            uris = self.uris
            if len(uris) >= self.entries:
                uris.clear()  # (in place: self.caches holds this dict)
            uris[text] = uri
        return uri

    def _remember_decimal(self, text: str) -> Decimal:
        value = Decimal(text)
        if len(text) <= _DECIMAL_MEMO_CHARS:  # as the reader: short ones recur
            decimals = self.decimals
            if len(decimals) >= self.entries:
                decimals.clear()
            decimals[text] = value
        return value

    def _keep(self, code: int, text: str) -> Value:
        """The atom of kind ``code`` written ``text``, which ``cbcl._native`` has
        validated (by C mirrors of the rules :meth:`_make_atom` applies): made and
        remembered as :meth:`_make_atom` does, without checking it again."""
        if code == URI_CODE:
            return self._remember_uri(text)
        if code == DECIMAL:
            return self._remember_decimal(text)
        return intern_symbol(text) if code == SYMBOL else intern_keyword(text)

    def _make_atom(self, code: int, text: Any) -> Value | None:
        """The atom written in full as kind ``code`` (DECIMAL, SYMBOL, KEYWORD or URI) and
        ``text``, or ``None`` if it is not valid. Symbols and keywords are interned, URIs
        and short decimals remembered here: the fast path looks in :attr:`caches` first.
        Name limits are the caller's."""
        if type(text) is not str:
            return None
        if code == DECIMAL:
            if len(text) > _MAX_DECIMAL_TEXT or DECIMAL_RE.match(text) is None:
                return None
            return self._remember_decimal(text)
        if code == URI_CODE:
            return self.uri(text)
        if _NAME_MATCH[code](text) is None:
            return None
        return intern_symbol(text) if code == SYMBOL else intern_keyword(text)


def _one_shot_memos(registry: Registry) -> _Memos:
    """The memos the one-shot :func:`decode` shares for ``registry``: its symbol tables
    are built once, not per call (nor per loaded protocol per call). The registry keeps
    them (``Registry._one_shot``), so they die with it; a _Memos holds no reference to its
    registry, so they never keep it alive."""
    memos = registry._one_shot
    if type(memos) is not _Memos:
        # (two threads may both make one: the loser's serves one call, then is dropped)
        memos = registry._one_shot = _Memos()
    return memos


def _frame_plan(table: SymbolTable) -> tuple[Any, ...]:
    """What cbcl._native.decode_frame reads of ``table`` (its layout is documented
    there): the protocol, its id and the id's length, the table's entries and codes, the
    protocol's acceptance plan."""
    protocol = table.protocol
    return (protocol, protocol.id, len(protocol.id), table.entry_list, table.codes,
            protocol.acceptance)


def _frame_state(registry: Registry, limits: Limits, memos: _Memos) -> FrameState:
    """What cbcl._native.decode_frame reads with each frame of a decoder (only where the
    extension is built): the memos' frame plans, atom memos and caches, the registry's
    loaded protocols, the intents and their names' lengths, the envelope shapes within
    ``limits`` (:func:`frame_shapes`), the limits, the envelope's nodes by presence bits,
    and the types and outcomes a message is made of."""
    return _FrameState(
        frame_plans=memos.frame_plans, protocols=registry._protocols_by_id(),
        intents=INTENTS, intent_lengths=_INTENT_LENGTHS, shapes=frame_shapes(limits),
        uris=memos.uris, caches=memos.caches, keep=memos.keep,
        envelope_nodes=_ENVELOPE_NODES, refused=REFUSED, accept=ACCEPT,
        has_heads=_has_heads, symbol=Symbol, message=Message, signature=Signature,
        attributes=_MESSAGE_ATTRIBUTES, refusal=_frame_refusal, memo_entries=memos.entries,
        max_message_bytes=limits.max_message_bytes,
        max_string_bytes=limits.max_string_bytes,
        max_body_depth=limits.max_depth - 2,  # (the body sits in the envelope's two lists)
        max_list_items=limits.max_list_items, max_name_chars=limits.max_name_chars,
        max_nodes=limits.max_nodes)


def _fast_frame(table: SymbolTable, data: bytes, start: int, limits: Limits,
                memos: _Memos, frame_envelope: Any, build_body: Any) -> Message | None:
    """:func:`_fast_message` by ``cbcl._native``, from the frame's bytes: the envelope's
    fields read and checked by its ``frame_envelope``, the body by its ``build_body``."""
    head = frame_envelope(data, start, INTENTS, memos.uris, limits.max_string_bytes,
                          memos.entries)
    if head is None:
        return None
    (intent, present, message_id, sender, receiver, conversation_id, in_reply_to, reply_by,
     timestamp, key_id, signed, offset, trace) = head
    protocol = table.protocol
    if (limits, protocol.id, intent, present) not in _ENVELOPE_WITHIN_LIMITS:
        return None  # not yet checked: the careful decoding checks and remembers it
    governed = intent in protocol.governed
    body: Any = None
    if present & HAS_BODY:
        body = _fast_body_at(table, data, offset, limits, _ENVELOPE_NODES[present],
                             intent if governed else None, memos, build_body)
        if body is None:
            return None
    elif offset != len(data):
        return None
    return _fast_finish(protocol, intent, governed, body, message_id, sender, receiver,
                        conversation_id, in_reply_to, reply_by, timestamp,
                        None if key_id is None else Signature(key_id, signed), trace)


def _fast_finish(protocol: Protocol, intent: Intent, governed: bool, body: Any,
                 message_id: str, sender: URI, receiver: URI, conversation_id: str | None,
                 in_reply_to: str | None, reply_by: int | None, timestamp: int | None,
                 signature: Signature | None, trace: str | None = None) -> Message | None:
    """The message of a fast path's fields and body, after pass 2's last checks: a governed
    intent's body is present and meets the schema (:class:`SchemaError` else), another
    is a NOT-UNDERSTOOD or CANCEL with a reason string or none; ``None`` otherwise."""
    if governed:
        if body is None:
            return None
        if protocol.schema is not None:
            check_schema(protocol.schema, body)
    elif intent not in _ALWAYS_ADMITTED or (body is not None and type(body) is not str):
        return None
    return Message._trusted(message_id, sender, receiver, intent, protocol.id,
                            conversation_id, in_reply_to, reply_by, timestamp, body,
                            signature, trace)


def _fast_message(table: SymbolTable, tokens: list[Any], limits: Limits,
                  build: Any = None, memos: _Memos | None = None) -> Message | None:
    """The message of a frame that is well formed, within every limit and accepted by
    its protocol's grammar, or ``None``: then :func:`_decode_tokens` decodes the same
    tokens with every check in order, to raise the precise error. Only the schema, the
    last check, raises here (:class:`SchemaError`), exactly as there. ``memos``: the
    decoder's (fresh ones when ``None``). The Python twin of :func:`_fast_frame`."""
    if memos is None:
        memos = _Memos()
    count = len(tokens)
    if count < 5:
        return None
    intent_index, present, message_id, sender, receiver = tokens[:5]
    if type(intent_index) is not int or type(present) is not int or \
            type(message_id) is not str or type(sender) is not str or \
            type(receiver) is not str or not 0 <= intent_index < len(INTENTS) or \
            not 0 <= present < _PRESENCES or not message_id:
        return None
    max_string = limits.max_string_bytes
    if len(message_id) * 4 > max_string:
        return None
    uris = memos.uris
    sender_uri = uris.get(sender) or memos.uri(sender)
    receiver_uri = uris.get(receiver) or memos.uri(receiver)
    if sender_uri is None or receiver_uri is None:
        return None
    intent = INTENTS[intent_index]
    protocol = table.protocol
    if (limits, protocol.id, intent, present) not in _ENVELOPE_WITHIN_LIMITS:
        return None  # not yet checked: the careful decoding checks and remembers it
    index = 5
    fields: list[Any] = [None, None, None, None]
    if present & 15:
        for slot, (bit, kind) in enumerate(_OPTIONAL_FIELDS):
            if present & bit:
                if index >= count:
                    return None
                value: Any = tokens[index]
                index += 1
                # (mypy narrows value to ``kind``'s declared type, object: the checks
                # above make it a str or an int)
                if type(value) is not kind:
                    return None
                if kind is str:
                    if not value or len(value) * 4 > max_string:  # type: ignore[arg-type]
                        return None
                elif not INT64_MIN <= value <= INT64_MAX:  # type: ignore[operator]
                    return None
                fields[slot] = value
    trace = None
    if present & HAS_TRACE:
        if index >= count:
            return None
        trace = tokens[index]
        if not is_traceparent(trace) or max_string < TRACE_CHARS:
            return None
        index += 1
    signature = None
    if present & HAS_SIGNATURE:
        if index + 1 >= count:
            return None
        key_id, signed = tokens[index], tokens[index + 1]
        if type(key_id) is not str or type(signed) is not str or \
                len(key_id) * 4 > max_string or len(signed) * 4 > max_string:
            return None
        signature = Signature(key_id, signed)
        index += 2
    governed = intent in protocol.governed
    body: Any = None
    if present & HAS_BODY:
        body = _fast_body(table, tokens, index, limits, _ENVELOPE_NODES[present],
                          intent if governed else None, build, memos)
        if body is None:
            return None
    elif index != count:
        return None
    return _fast_finish(protocol, intent, governed, body, message_id, sender_uri,
                        receiver_uri, fields[0], fields[1], fields[2], fields[3], signature,
                        trace)


def _decode_tokens(table: SymbolTable, tokens: list[Any], limits: Limits, data: bytes,
                   start: int, unpacker_class: Any) -> Message:
    """Walk the tokens of one frame: envelope, then body; see the module doc."""

    def where(index: int) -> int:
        return _token_offset(unpacker_class, data, start, index)

    count = len(tokens)
    max_string = limits.max_string_bytes

    def take(index: int, kind: type, name: str, string: bool = True) -> Any:
        if index >= count:
            _malformed(f"truncated frame: it ends before the {name}", len(data))
        token: Any = tokens[index]
        if type(token) is not kind:
            _malformed(f"the {name} must be a msgpack "
                       f"{'string' if kind is str else 'integer'}, not "
                       f"{_kind_name(token)}", where(index))
        text: Any = token  # (narrowed to object by the type check above: a str here)
        if kind is str and string and len(text) * 4 > max_string and \
                len(text.encode("utf-8")) > max_string:
            _limit(limits, "max_string_bytes", where(index))
        return token

    intent_index = take(0, int, "intent")
    if not 0 <= intent_index < len(INTENTS):
        _malformed(f"unknown intent index {intent_index}", where(0))
    present = take(1, int, "field presence bits")
    if not 0 <= present < _PRESENCES:
        _malformed(f"unknown field presence bits 0x{present:x}", where(1))
    message_id = take(2, str, "message-id")
    sender = take(3, str, "sender", False)
    receiver = take(4, str, "receiver", False)
    index = 5
    optional: dict[str, Any] = {}
    for bit, name, kind in ((HAS_CONVERSATION_ID, "conversation_id", str),
                            (HAS_IN_REPLY_TO, "in_reply_to", str),
                            (HAS_REPLY_BY, "reply_by", int), (HAS_TIMESTAMP, "timestamp", int)):
        if present & bit:
            value = take(index, kind, name.replace("_", "-"))
            if kind is int and not INT64_MIN <= value <= INT64_MAX:
                _malformed("integer out of the signed 64-bit range", where(index))
            optional[name] = value
            index += 1
    trace_at = -1
    if present & HAS_TRACE:
        optional["trace"] = take(index, str, "trace")
        trace_at = index
        index += 1
    if present & HAS_SIGNATURE:
        optional["signature"] = Signature(take(index, str, "signature key id"),
                                          take(index + 1, str, "signature value"))
        index += 2
    intent = INTENTS[intent_index]
    protocol = table.protocol
    envelope_limits(limits, protocol, intent, present, where)

    # ----------------------------------------------------------------- the body
    descriptor = protocol.descriptor
    governed = descriptor.governs(intent)
    body: Any = None
    refusal: BodyError | None = None
    if present & HAS_BODY:
        nodes = _envelope_nodes(present)
        body, index, refusal = _walk_body(table, tokens, index, limits, nodes,
                                          intent if governed else None, where, len(data))
    if index != count:
        _malformed("unexpected data after the end of the message", where(index))

    # ----------------------------------------------------------------- pass 1, then pass 2
    for name, text, at in (("message-id", message_id, 2),
                           ("conversation-id", optional.get("conversation_id", _MISSING), -1),
                           ("in-reply-to", optional.get("in_reply_to", _MISSING), -1)):
        if text == "":
            _malformed(f"{name} must not be empty", where(at) if at >= 0 else start,
                       EnvelopeError)
    if trace_at >= 0 and not is_traceparent(optional["trace"]):
        _malformed(TRACE_REFUSAL, where(trace_at), EnvelopeError)
    try:
        sender_uri = URI(sender)
    except ValueError:
        _malformed(f"sender is not a URI: {sender[:40]!r}", where(3), EnvelopeError)
    try:
        receiver_uri = URI(receiver)
    except ValueError:
        _malformed(f"receiver is not a URI: {receiver[:40]!r}", where(4), EnvelopeError)
    if not governed:
        ungoverned = _ungoverned_refusal(protocol, intent, body, start)
        if ungoverned is not None:
            raise ungoverned
    elif body is None:
        missing = BodyError(f"{descriptor.id} requires a body for {intent.value}",
                            position=_at(start))
        missing.hint_material = body_hint(protocol, (), "$END", None, None, intent.value,
                                          (), False)
        raise missing
    if refusal is not None:
        raise refusal
    if protocol.schema is not None and governed:  # pass 3 where the protocol has a schema
        check_schema(protocol.schema, body)
    # Every field has been checked above, each of its exact type.
    return Message._trusted(message_id, sender_uri, receiver_uri, intent, protocol.id,
                            body=body, **optional)


def _ungoverned_refusal(protocol: Protocol, intent: Intent, body: Any,
                        start: int) -> BodyError | ProtocolError | None:
    """The error for a body of ``intent``, which ``protocol`` does not govern (at the
    frame's first token, ``start``): ``None`` for a NOT-UNDERSTOOD or CANCEL without a body
    or with a reason string."""
    descriptor = protocol.descriptor
    if intent in _ALWAYS_ADMITTED:
        if body is not None and type(body) is not str:
            return BodyError(f"a {intent.value} body that {descriptor.id} does not "
                             "govern must be absent or a reason string", position=_at(start))
        return None
    governs = " ".join(i.value for i in descriptor.intents)
    return ProtocolError(f"{descriptor.id} does not govern {intent.value} messages "
                         f"(it governs {governs})", position=_at(start))


# --------------------------------------------------------------------------- refusal by value
#
# A frame decode_frame declines is most often one its grammar refuses. The careful tier
# would find out by walking every token in Python (10-50x an accepted frame); instead
# _frame_by_value builds the body in C *without* the grammar (every limit and the frame's
# own rules are checked as the fast path checks them), then asks pass 2 where the grammar
# refuses the value (_pass2.find_refusal: about one native walk up to the refusal) and
# words the error from the automaton there (_pass2.refusal_error, as for text). The
# token's byte offset is found by writing the body's value up to the refusal again in C
# (pack_frame) and comparing it with the frame: equal bytes end at the refused token. A
# frame not written in msgpack's shortest forms (a decoder accepts it, spec/binary.md
# §3.4) is stepped through by msgpack's unpacker up to that token instead. Anything else
# the body builder declines (a limit, a malformed token) goes to the careful tier, which
# raises the precise error.
#
# Where decode_frame itself reads the frame (a decoder's fast path), its walk notes where
# the grammar refused (the token's path, byte offset, the recogniser's node and the keyword
# sets' masks there), builds the rest of the body without the grammar (the same limits and
# rules), and calls _frame_refusal with that: the error is worded from the walk's own
# state, so a refused frame costs about one accepted frame, and nothing is walked again.

#: The kinds of cbcl._native.decode_frame's refusal report, by its number for them.
_REFUSAL_KINDS = ("", ITEM, CLOSE, END)


def _frame_refusal(protocol: Protocol, intent: Intent, body: Value, kind: int,
                   path: tuple[int, ...], node: Any, cls: str, frames: tuple[int, ...],
                   at: int) -> None:
    """Raise the :class:`BodyError` of a frame whose body (``body``, of an ``intent``
    message of ``protocol``) ``cbcl._native.decode_frame`` found refused: ``kind``
    (1 :data:`ITEM`, 2 :data:`CLOSE`, 3 :data:`END`), ``path``, ``node`` (the
    recogniser's) and ``cls`` as :class:`Refusal` has them, ``frames`` the keyword sets'
    masks of the walk there, ``at`` the refused token's byte offset in the frame. The
    error is that of :func:`_frame_by_value` (the same :func:`refusal_error`), with no
    walk of the body; where the masks cannot be paired with the node's sets
    (:func:`walker_marks`), the refusal is found again by :func:`find_refusal`."""
    marks = walker_marks(protocol, node, frames)
    if marks is None:  # pragma: no cover - the walk's masks always pair with its stack
        refusal = find_refusal(protocol, body, intent)
        if refusal is None:
            raise AssertionError("decode_frame's refusal was not found again")
    else:
        refusal = Refusal(_REFUSAL_KINDS[kind], path, node, cls, marks)
    raise refusal_error(protocol, body, refusal, intent, _at(at))


def _frame_by_value(table: SymbolTable, data: bytes, start: int, limits: Limits,
                    memos: _Memos, frame_envelope: Any, build_body: Any) -> Message | None:
    """The message of a frame ``cbcl._native`` reads whole but the fast path may have
    declined, decided from its body's value: the message if it is accepted; the error
    the careful tier would raise if the body breaks no limit or rule of the frame but
    its intent is not governed or the grammar refuses it (:class:`BodyError`,
    :class:`ProtocolError`), or the schema does (:class:`SchemaError`); ``None`` for
    anything else (the careful tier decides)."""
    head = frame_envelope(data, start, INTENTS, memos.uris, limits.max_string_bytes,
                          memos.entries)
    if head is None:
        return None
    (intent, present, message_id, sender, receiver, conversation_id, in_reply_to, reply_by,
     timestamp, key_id, signed, offset, trace) = head
    protocol = table.protocol
    if not present & HAS_BODY or \
            (limits, protocol.id, intent, present) not in _ENVELOPE_WITHIN_LIMITS:
        return None  # (no body: nothing to walk; an envelope not yet checked: careful)
    body = _fast_body_at(table, data, offset, limits, _ENVELOPE_NODES[present], None,
                         memos, build_body)
    if body is None:
        return None  # a limit, a malformed token: the careful tier says which, and where
    if intent not in protocol.governed:
        ungoverned = _ungoverned_refusal(protocol, intent, body, start)
        if ungoverned is not None:
            raise ungoverned
        governed = False
    else:
        governed = True
        refusal = find_refusal(protocol, body, intent)
        if refusal is not None:
            raise refusal_error(protocol, body, refusal, intent,
                                _at(_refusal_offset(table, body, refusal, data, offset)))
    return _fast_finish(protocol, intent, governed, body, message_id, sender, receiver,
                        conversation_id, in_reply_to, reply_by, timestamp,
                        None if key_id is None else Signature(key_id, signed), trace)


def _refusal_offset(table: SymbolTable, body: Value, refusal: Refusal, data: bytes,
                    offset: int) -> int:
    """The byte offset in ``data`` of the token ``refusal`` points at in ``body``, whose
    tokens start at ``offset`` and end the frame: after the tokens of the body's value
    up to it, written again (:func:`_body_bytes` of :func:`_cut`), where the frame holds
    those very bytes; else after as many tokens, stepped through by msgpack."""
    if refusal.kind == END:
        return len(data)
    path = refusal.path
    if refusal.kind == ITEM:
        if not path:
            return offset
        cut, closes = _cut(body, path), len(path)
    else:  # CLOSE: the list at ``path`` whole, then its ")"
        cut = body if not path else _cut(body, (*path[:-1], path[-1] + 1))
        closes = len(path) + 1
    written = _body_bytes(table, cut)
    before = len(written) - closes  # (a ")" is one byte: CODE_RPAR is a fixint)
    if data[offset:offset + before] == written[:before]:
        return offset + before
    tokens = _unpack_c(written, 0) if _unpack_c is not None else None
    if tokens is None:
        unpacker = msgpack.Unpacker(raw=False)
        unpacker.feed(written)
        tokens = list(unpacker)
    return _token_offset(msgpack.Unpacker, data, offset, len(tokens) - closes)


def _cut(value: Value, path: tuple[int, ...]) -> Value:
    """``value`` with each list on ``path`` (a non-empty path of indexes) cut before the
    element the path goes through next: the last list before its element ``path[-1]``,
    the others after the cut list."""
    lists: list[tuple[Any, int]] = []
    here: Any = value
    for index in path[:-1]:
        lists.append((here, index))
        here = here[index]
    cut: Any = here[:path[-1]]
    for items, index in reversed(lists):
        cut = (*items[:index], cut)
    return cut  # type: ignore[no-any-return]


def _body_bytes(table: SymbolTable, body: Value) -> bytes:
    """The body tokens of a frame whose body is ``body``, as :class:`Encoder` writes them
    (by ``cbcl._native.pack_frame`` where it is built and takes it)."""
    if _native is not None:
        prepared = _native.prepare(table.codes)
        if prepared is not None:
            written: bytes | None = _native.pack_frame(b"", [], body, prepared)
            if written is not None:
                return written
    tokens: list[Any] = []
    _body_tokens(body, dict(table.codes), tokens)
    packed: bytes = msgpack.packb(tokens)
    first = packed[0]
    return packed[1 if first < 0xDC else (3 if first == 0xDC else 5):]


def envelope_limits(limits: Limits, protocol: Protocol, intent: Intent, present: int,
                    where: Any) -> None:
    """The limits the envelope's own text would meet: depth 2, the items of the envelope
    and field lists, its nodes, and the length of its symbols. (What passed is remembered:
    the answer depends on nothing else.)"""
    key = (limits, protocol.id, intent, present)
    if key in _ENVELOPE_WITHIN_LIMITS:
        return
    refused = _shape_refusal(limits, present)
    if refused is not None:
        _limit(limits, refused, where(2 if refused == "max_depth" else 0))
    longest = max(_SHAPE_NAMES[present], len(intent.value), len(str(protocol.id)))
    if longest > limits.max_name_chars:
        _limit(limits, "max_name_chars", where(0), "symbol")
    if len(_ENVELOPE_WITHIN_LIMITS) >= _ENVELOPE_WITHIN_LIMITS_MAX:
        _ENVELOPE_WITHIN_LIMITS.clear()
    _ENVELOPE_WITHIN_LIMITS.add(key)


# The envelopes found within their limits, by (limits, protocol id, intent, presence
# bits). A process-wide memo (spec/cbcl-1.0.md, "Process-wide memos"): the key is all
# envelope_limits() reads (a frozen Limits, the id's text, the intent, the fields
# present), so its answer is a function of the key alone, the same remembered or not;
# only a pass is kept (a refusal raises each time). The fast path declines an envelope
# not found here, and the careful one checks and adds it: what is remembered changes which
# tier decodes a frame, never the result. At most _ENVELOPE_WITHIN_LIMITS_MAX keys,
# emptied when full.
_ENVELOPE_WITHIN_LIMITS: set[tuple[Limits, Symbol, Intent, int]] = set()
_ENVELOPE_WITHIN_LIMITS_MAX = 4096


def _envelope_nodes(present: int) -> int:
    """Nodes of the envelope's text without the body value: the list, CBCL/1.0, and each
    field's list, name and values (two for the signature, the body's counted apart)."""
    fields = 5 + bin(present).count("1")
    return 2 + 3 * fields + (1 if present & HAS_SIGNATURE else 0) - \
        (1 if present & HAS_BODY else 0)


_ENVELOPE_NODES = tuple(_envelope_nodes(present) for present in range(_PRESENCES))


def _shape_refusal(limits: Limits, present: int) -> str | None:
    """The first limit an envelope of fields ``present`` refuses by its shape alone (the
    depth, the lists' items, the nodes), or ``None``."""
    if limits.max_depth < 2:
        return "max_depth"
    fields = 5 + bin(present).count("1")
    if max(1 + fields, 3 if present & HAS_SIGNATURE else 2) > limits.max_list_items:
        return "max_list_items"
    if _ENVELOPE_NODES[present] > limits.max_nodes:
        return "max_nodes"
    return None


#: By fields present, the longest symbol of the envelope but the intent and the protocol id.
_SHAPE_NAMES = tuple(max(len(name) for name in (
    VERSION, "message-id", "sender", "receiver", "intent", "protocol",
    *(name for bit, name in _OPTIONAL_NAMES if present & bit)))
    for present in range(_PRESENCES))
#: The length of each intent's name, by wire index.
_INTENT_LENGTHS = tuple(len(intent.value) for intent in INTENTS)
_SHAPES: dict[Limits, bytes] = {}
_SHAPES_MAX = 64


def _shapes_of(limits: Limits) -> bytes:
    return bytes(_shape_refusal(limits, present) is None and
                 _SHAPE_NAMES[present] <= limits.max_name_chars
                 for present in range(_PRESENCES))


_DEFAULT_SHAPES = _shapes_of(DEFAULT_LIMITS)


def frame_shapes(limits: Limits) -> bytes:
    """By fields present, 1 where :func:`envelope_limits` passes an envelope of those
    fields under ``limits`` whatever its intent and protocol id, as long as neither name is
    longer than ``max_name_chars`` (what cbcl._native.decode_frame checks), else 0.
    Remembered for at most :data:`_SHAPES_MAX` limits (a pure function of them)."""
    if limits is DEFAULT_LIMITS:  # (a Limits hashes in Python: the common case skips it)
        return _DEFAULT_SHAPES
    shapes = _SHAPES.get(limits)
    if shapes is None:
        shapes = _shapes_of(limits)
        if len(_SHAPES) >= _SHAPES_MAX:
            _SHAPES.clear()
        _SHAPES[limits] = shapes
    return shapes


def _kind_name(token: object) -> str:
    if token is None:
        return "nil"
    if type(token) is bool:
        return "a boolean"
    if type(token) is int:
        return "an integer"
    if type(token) is str:
        return "a string"
    if type(token) is float:
        return "a float"
    if type(token) is bytes:
        return "binary data"
    if type(token) is list:
        return "an array"
    return "an extension type" if type(token).__name__ in ("ExtType", "Timestamp") \
        else type(token).__name__


def _walk_body(table: SymbolTable, tokens: list[Any], index: int, limits: Limits,
               nodes: int, governed: Intent | None, where: Any, end: int,
               ) -> tuple[Value, int, BodyError | None]:
    """Read the body's tokens from ``index``: ``(body, next index, grammar refusal)``,
    judged by the grammar from the start rule of ``governed``, the intent (``None``: a
    body the grammar does not govern)."""
    protocol = table.protocol
    tables = protocol.tables
    stack = start_stack(protocol, governed) if governed is not None else [tables.start_state]
    marks: dict[int, int] = {}  # the keyword sets' masks (cbcl.grammar._kernel)
    shown_intent = None if governed is None else governed.value
    grammar = governed is not None and bool(stack)
    refusal: BodyError | None = None
    if governed is not None and not stack:  # pragma: no cover - Protocol checks the rules
        refusal = BodyError(f"the {protocol.id} grammar has no start rule for "
                            f"{shown_intent} bodies", position=_at(where(index)))
    static_atoms = table.atoms
    static_terminals = table.terminals
    static_count = len(static_atoms)
    codes = table.codes
    seen: dict[Value, int] = {}  # symbols, keywords and URIs written in full in this frame
    learned: list[Value] = []
    max_depth = limits.max_depth - 2  # the envelope and the (body …) list are open
    max_items = limits.max_list_items
    max_nodes = limits.max_nodes
    if nodes + len(tokens) - index <= max_nodes:
        max_nodes = len(tokens) + nodes  # every token is at most one node: cannot be over
    value_states = table.value_states
    in_value = 0  # the depth of the list of a value read without the tables, or 0
    max_string = limits.max_string_bytes
    max_name = limits.max_name_chars
    count = len(tokens)
    parents: list[list[Value]] = []
    items: list[Value] | None = None
    depth = 0
    value: Any
    while True:
        if index >= count:
            _malformed(f"truncated frame: it ends inside the body ({depth} list(s) open)",
                       end)
        at = index
        token = tokens[index]
        index += 1
        kind = type(token)
        if kind is str:
            if len(token) * 4 > max_string and len(token.encode("utf-8")) > max_string:
                _limit(limits, "max_string_bytes", where(at))
            value = token
            terminal = "STRING"
        elif kind is int:
            if token >= FIRST_ENTRY:
                entry = token - FIRST_ENTRY
                if entry < static_count:
                    value = static_atoms[entry]
                    literal = static_terminals[entry]
                    data = _DATA_TERMINALS[type(value)]
                    terminal = terminal_of(tables, stack, literal, data) if grammar else data
                else:
                    entry -= static_count
                    if entry >= len(learned):
                        _malformed(f"unknown symbol id {token}", where(at))
                    value = learned[entry]
                    terminal = _DATA_TERMINALS[type(value)]
            elif token == LPAR:
                nodes += 1
                if nodes > max_nodes:
                    _limit(limits, "max_nodes", where(at))
                depth += 1
                if depth > max_depth:
                    _limit(limits, "max_depth", where(at))
                if items is not None:
                    if len(items) >= max_items:
                        _limit(limits, "max_list_items", where(at))
                    parents.append(items)
                items = []
                terminal = "LPAR"
                value = None
            elif token == RPAR:
                if items is None:
                    _malformed("unexpected ')'", where(at))
                value = tuple(items)
                depth -= 1
                terminal = "RPAR"
                items = parents.pop() if parents else None
                if items is not None:
                    items.append(value)
            elif token < 0:
                _malformed(f"unknown token code {token}", where(at))
            else:
                if index >= count:
                    _malformed("truncated frame: it ends inside an atom", end)
                text = tokens[index]
                index += 1
                if token == INTEGER:
                    if type(text) is not int:
                        _malformed(f"an INTEGER token needs an integer, not {_kind_name(text)}",
                                   where(at + 1))
                    if not INT64_MIN <= text <= INT64_MAX:
                        _malformed("integer out of the signed 64-bit range", where(at + 1))
                    value = text
                    terminal = "INTEGER"
                else:
                    if type(text) is not str:
                        _malformed(f"a {_CODE_NAMES[token]} token needs a string, not "
                                   f"{_kind_name(text)}", where(at + 1))
                    if token == DECIMAL:
                        value = _decimal_value(text, where, at + 1)
                        terminal = "DECIMAL"
                    else:
                        if token != URI_CODE and len(text) <= max_name and \
                                _NAME_MATCH[token](text) is not None:
                            value = intern_symbol(text) if token == SYMBOL \
                                else intern_keyword(text)
                        else:
                            value = _named_atom(token, text, limits, where, at + 1)
                        if value in codes or value in seen:
                            _malformed(f"{_CODE_NAMES[token].lower()} {text[:40]} is written "
                                       "in full but has a code (non-canonical frame)",
                                       where(at))
                        seen[value] = len(learned)
                        learned.append(value)
                        terminal = _DATA_TERMINALS[type(value)]
        else:
            _malformed(f"a body token must be a msgpack integer or string, not "
                       f"{_kind_name(token)}", where(at))
        if terminal != "LPAR" and terminal != "RPAR":
            nodes += 1
            if nodes > max_nodes:
                _limit(limits, "max_nodes", where(at))
            if items is not None:
                if len(items) >= max_items:
                    _limit(limits, "max_list_items", where(at))
                items.append(value)
        if grammar:
            done = feed(tables, stack, terminal, whole=value_states, marks=marks)
            if done == REFUSED_BY_GRAMMAR:
                refusal = _refusal(protocol, stack, terminal, value, where(at), marks,
                                   shown_intent, _open_lists(parents, items, terminal, value))
                grammar = False
            elif done == WHOLE:  # a whole value: read it without the tables
                grammar = False
                in_value = depth
        elif in_value and depth < in_value:  # the value read without the tables ended
            in_value = 0
            grammar = True
            take_value(tables, stack)
        if items is None:  # the body is complete
            break
    if grammar and feed(tables, stack, "$END", marks=marks) != ACCEPTED:
        refusal = _refusal(protocol, stack, "$END", None, where(index), marks, shown_intent)
    return value, index, refusal


_NAME_MATCH = {SYMBOL: SYMBOL_RE.match, KEYWORD: NAME_RE.match}
_URI_MATCH = URI_RE.match

def _fast_body(table: SymbolTable, tokens: list[Any], index: int, limits: Limits,
               nodes: int, governed: Intent | None,
               build: Callable[..., Value | None] | None = None,
               memos: _Memos | None = None) -> Value | None:
    """The body read from ``tokens[index:]`` when it is canonical, within every limit,
    ends the frame and (if ``governed``, the intent, is not ``None``) is accepted by the
    grammar from that intent's start rule; else ``None``, and
    :func:`_walk_body` reads the same tokens to raise the precise error.

    The hot loop of decoding, run by ``build``: :func:`_fast_body_loop`, the reference of
    ``cbcl._native.build_body`` (which :func:`_fast_body_at` runs on the frame's bytes
    where it is built; :func:`build_body_on_tokens` runs it on tokens). Checks that cannot fail are
    skipped (nodes, when there are too few tokens left to exceed the limit); a list's
    items are counted when it closes (the node check bounds what is built before then);
    and the grammar is the protocol's :class:`StackAutomaton`, one lookup a token."""
    if nodes + len(tokens) - index > limits.max_nodes:  # a token is at most one node
        return None
    automaton = table.protocol.recogniser
    start = recogniser_start(table.protocol, governed) if governed is not None else None
    if start is REFUSED:
        return None
    if memos is None:
        memos = _Memos()
    return (build or _fast_body_loop)(
        tokens, index, table.entries, table.codes, memos.caches, memos.make_atom, start,
        automaton.step, limits.max_depth - 2,  # the envelope and the (body …) list are open
        limits.max_list_items, limits.max_string_bytes, limits.max_name_chars,
        FIRST_ENTRY + len(table.entries), REFUSED, ACCEPT)


def _fast_body_at(table: SymbolTable, data: bytes, offset: int, limits: Limits,
                  nodes: int, governed: Intent | None, memos: _Memos,
                  build_body: Any) -> Value | None:
    """:func:`_fast_body` for the body whose tokens are ``data[offset:]``, read from the
    bytes by ``build_body`` (``cbcl._native``'s, which counts the nodes itself)."""
    start = recogniser_start(table.protocol, governed) if governed is not None else None
    if start is REFUSED:
        return None
    value: Value | None = build_body(
        data, offset, table.entry_list, table.codes, memos.caches, memos.keep, start,
        table.protocol.recogniser.step, limits.max_depth - 2,  # envelope, (body …) open
        limits.max_list_items, limits.max_string_bytes, limits.max_name_chars,
        limits.max_nodes - nodes, REFUSED, ACCEPT, memos.entries)
    return value


def build_body_on_tokens(tokens: list[Any], index: int,
                         entries: dict[int, tuple[Value, str]], codes: dict[Value, int],
                         caches: tuple[dict[str, Any] | None, ...],
                         make_atom: Callable[[int, Any], Value | None], node: Any,
                         step: Callable[[Any, str], Any], max_depth: int, max_items: int,
                         max_string: int, max_name: int, next_code: int, refused: Any,
                         accept: Any) -> Value | None:
    """``cbcl._native.build_body`` called as :func:`_fast_body_loop` is, on tokens (for
    the tests and the probe that hold the two to each other): the tokens are packed with
    msgpack, as a frame holds them, and no node budget applies (the loop has none)."""
    data = b"".join(msgpack.packb(token) for token in tokens[index:])
    static = tuple(entries[code] for code in range(FIRST_ENTRY, next_code))
    value: Value | None = _build_body_c(
        data, 0, static, codes, caches, make_atom, node, step, max_depth, max_items,
        max_string, max_name, sys.maxsize, refused, accept, MEMO_ENTRIES)
    return value


def _fast_body_loop(tokens: list[Any], index: int, entries: dict[int, tuple[Value, str]],
                    codes: dict[Value, int], caches: tuple[dict[str, Any] | None, ...],
                    make_atom: Callable[[int, Any], Value | None], node: Any,
                    step: Callable[[Any, str], Any], max_depth: int, max_items: int,
                    max_string: int, max_name: int, next_code: int, refused: Any,
                    accept: Any) -> Value | None:
    """The loop of :func:`_fast_body` in Python (``cbcl._native.build_body`` is its
    twin in C): the body, or ``None``."""
    learned: dict[int, tuple[Value, str]] = {}  # atoms written in full in this frame
    seen: set[Value] = set()
    parents: list[list[Value]] = []
    items: list[Value] | None = None
    whole_at = 0  # the depth of a list taken as a whole value (the grammar waits), or 0
    frames: list[int] = []  # the keyword sets' masks (cbcl.grammar._automaton.apply_set_ops)
    value: Value
    cls: str
    tokens_left = iter(tokens)
    for _ in range(index):
        next(tokens_left)
    for token in tokens_left:
        kind = type(token)
        if kind is int:
            entry = entries.get(token)
            if entry is not None:
                value, cls = entry
            elif token == LPAR:
                if items is not None:
                    parents.append(items)
                if len(parents) >= max_depth:  # the new list is len(parents) + 1 deep
                    return None
                items = []
                if node is not None and not whole_at:
                    found = node.get("LPAR") or step(node, "LPAR")
                    node, whole = found[0], found[1]
                    if node is refused or (len(found) == 3
                                           and not apply_set_ops(frames, found[2])):
                        return None
                    if whole:
                        whole_at = len(parents) + 1
                continue
            elif token == RPAR:
                if items is None or len(items) > max_items:
                    return None
                value = tuple(items)
                if whole_at:
                    if whole_at == len(parents) + 1:
                        whole_at = 0
                elif node is not None:
                    node = node.get("RPAR") or step(node, "RPAR")
                    if type(node) is tuple:
                        node, ops = node
                        if not apply_set_ops(frames, ops):
                            return None
                    elif node is refused:
                        return None
                if parents:
                    items = parents.pop()
                    items.append(value)
                    continue
                items = None
                break
            elif token >= FIRST_ENTRY:
                entry = learned.get(token)
                if entry is None:
                    return None
                value, cls = entry
            elif token < 0:
                return None
            else:
                text = next(tokens_left, None)
                if token == INTEGER:
                    if type(text) is not int or not INT64_MIN <= text <= INT64_MAX:
                        return None
                    value = text
                    cls = "INTEGER"
                else:
                    if type(text) is not str or (
                            len(text) > max_name and token in (SYMBOL, KEYWORD)):
                        return None
                    value = caches[token].get(text)
                    if value is None:
                        value = make_atom(token, text)
                        if value is None:
                            return None
                    cls = _KIND_TERMINALS[token]
                    if token != DECIMAL:  # learned: it has the next code from now on
                        if value in codes or value in seen:
                            return None  # written in full but it has a code
                        seen.add(value)
                        learned[next_code] = (value, cls)
                        next_code += 1
        elif kind is str:
            if len(token) * 4 > max_string and len(token.encode("utf-8")) > max_string:
                return None
            value = token
            cls = "STRING"
        else:
            return None
        if node is not None and not whole_at:
            node = node.get(cls) or step(node, cls)
            if type(node) is tuple:
                node, ops = node
                if not apply_set_ops(frames, ops):
                    return None
            elif node is refused:
                return None
        if items is None:  # the body is one atom
            break
        items.append(value)
    else:
        return None  # the frame ends inside the body
    if next(tokens_left, _MISSING) is not _MISSING:
        return None
    if node is not None:
        end = node.get("$END") or step(node, "$END")
        if type(end) is tuple:
            end, ops = end
            if not apply_set_ops(frames, ops):
                return None
        if end is not accept:
            return None
    return value


def _speedups_agree(build_body: Any, unpack: Any) -> bool:
    """Whether the C twins read a known body as the Python twin does: the C enum of token
    codes (``cbcl/_native_src/speedups.c``, which exports no constants) against :mod:`._vocabulary`.
    Every code is used: each kind written in full, a static entry, a learned one."""
    tokens: list[Any] = [LPAR, INTEGER, 5, DECIMAL, "1.5", SYMBOL, "a", KEYWORD, "k",
                         URI_CODE, "a://b", "s", FIRST_ENTRY, FIRST_ENTRY + 1, RPAR]
    literal = intern_symbol("cbcl-probe")
    entries: dict[int, tuple[Value, str]] = {FIRST_ENTRY: (literal, "LIT_0")}

    def run(build: Any) -> Any:
        memos = _Memos()
        return build(tokens, 0, entries, {literal: FIRST_ENTRY}, memos.caches,
                     memos.make_atom, None, None, 8, 16, 64, 16, FIRST_ENTRY + 1, REFUSED,
                     ACCEPT)

    expected = run(_fast_body_loop)
    assert expected is not None
    frame = b"".join(msgpack.packb(token) for token in tokens)
    return bool(run(build_body) == expected and unpack(frame, 0) == tokens)


try:
    from .._native import (
        FrameState as _FrameState,
        build_body as _build_body_c,
        decode_frame as _decode_frame_c,
        frame_envelope as _frame_envelope_c,
        unpack as _unpack_c,
    )
except ImportError:  # not built: the Python twins run
    _build_body_c = None  # type: ignore[assignment]
    _decode_frame_c = None  # type: ignore[assignment]
    _frame_envelope_c = None  # type: ignore[assignment]
    _unpack_c = None  # type: ignore[assignment]
    #: Whether the optional C accelerator cbcl._native is built (and agrees).
    SPEEDUPS = False
else:
    if not _speedups_agree(build_body_on_tokens, _unpack_c):  # pragma: no cover - stale
        raise ImportError("cbcl._native disagrees with cbcl.core._vocabulary's token codes "
                          "(rebuild the extension)")
    SPEEDUPS = True

_CODE_NAMES = CODE_KINDS


def _decimal_value(text: str, where: Any, at: int) -> Decimal:
    if len(text) > _MAX_DECIMAL_TEXT:
        _malformed(f"decimal longer than {_MAX_DECIMAL_TEXT} characters", where(at))
    if DECIMAL_RE.match(text) is None:
        _malformed(f"not a CBCL decimal: {text[:40]!r}", where(at))
    return Decimal(text)


def _named_atom(code: int, text: str, limits: Limits, where: Any, at: int) -> Value:
    if code == URI_CODE:
        try:
            return URI(text)
        except ValueError:
            _malformed(f"not a CBCL URI: {text[:40]!r}", where(at))
    valid = _NAME_MATCH[code](text) is not None
    if not valid:
        _malformed(f"not a CBCL {_CODE_NAMES[code].lower()} name: {text[:40]!r}", where(at))
    if len(text) > limits.max_name_chars:
        _limit(limits, "max_name_chars", where(at), _CODE_NAMES[code].lower())
    return str.__new__(Symbol if code == SYMBOL else Keyword, text)




def _refusal(protocol: Protocol, stack: list[int], terminal: str, value: object,
             offset: int, marks: dict[int, int], intent: str | None,
             lists: Sequence[Sequence[object]] = ()) -> BodyError:
    """The :class:`BodyError` for ``terminal`` refused at ``stack`` and ``marks`` in a
    body of ``intent`` (the kernel's wording, as text's), inside the open ``lists``
    (outermost first), with the material of its hint (:mod:`cbcl.protocol._hints`)."""
    message, expected = body_refusal(protocol, stack, terminal, value, marks, intent)
    error = BodyError(message, position=_at(offset), expected=expected)
    heads, at_head = heads_of_lists(lists, terminal)
    error.hint_material = body_hint(protocol, stack, terminal, value, marks, intent, heads,
                                    at_head)
    return error


def _open_lists(parents: list[list[Value]], items: list[Value] | None, terminal: str,
                value: object) -> list[Sequence[object]]:
    """The lists open around a refused token, as the body walk keeps them: a ``(`` has
    opened ``items`` already (not around it), a ``)`` has closed ``value`` (around it)."""
    if terminal == "LPAR":
        return list(parents)
    lists: list[Sequence[object]] = [*parents, *(() if items is None else (items,))]
    if terminal == "RPAR" and type(value) is tuple:
        lists.append(value)
    return lists


# --------------------------------------------------------------------------- one-shot


def encode(message: Message, *, registry: Registry, validate: bool = True,
           limits: Limits | None = None) -> bytes:
    """The binary frame of ``message``, validated first unless ``validate=False`` (see
    :class:`Encoder`, which raises the same errors; reuse one for many messages)."""
    return Encoder(registry, validate=validate, limits=limits).encode(message)


# Where the extension is built, decode is a C function (cbcl._native.one_shot_entry):
# decode(data, registry=registry) of bytes, once the registry's one-shot memos hold the
# default limits' frame state, is the whole-frame C call, without this function's Python
# frame (~0.5 us of a ~2 us ~370 B frame); any other call, or a frame it declines, is
# this function's.
@entry(None if _native is None else _native.one_shot_entry, _verify_signed, Registry, _Memos,
       method=False)
def decode(data: bytes | bytearray | memoryview, *, registry: Registry,
           limits: Limits | None = None) -> Message:
    """Decode and recognise one binary frame (see :class:`Decoder`; reuse one for many
    frames). The symbol tables and memos are those of a default decoder of ``registry``,
    kept while the registry lives: a call does not build one table per loaded protocol.
    Raises what :meth:`Decoder.decode` raises, and ``TypeError`` for a ``registry`` or
    ``limits`` of the wrong type."""
    key = DEFAULT_LIMITS if limits is None else limits
    if _decode_frame_c is not None and type(data) is bytes and type(registry) is Registry \
            and type(key) is Limits:
        # The whole frame in one C call, with the frame state this registry's memos keep
        # for these limits (a Decoder's setup per call was ~2x a ~370 B frame's decoding),
        # unless the C entry has just made it (it does once the default state is kept).
        memos = registry._one_shot
        if key is not DEFAULT_LIMITS or type(memos) is not _Memos or \
                memos.default_state is None:
            message = _decode_frame_c(data, _one_shot_state(registry, key))
            if message is not None:
                if message.signature is not None:
                    _verify_signed(message, registry)
                return message
    decoder = Decoder.__new__(Decoder)
    decoder._setup(registry, limits, None, False, False, True)
    # (the Python method, not its C entry: decode_frame has declined this frame already)
    return decode_python(decoder, data)


def _one_shot_state(registry: Registry, limits: Limits) -> FrameState:
    """The frame state (:func:`_frame_state`) the one-shot :func:`decode` uses for
    ``registry`` within ``limits``, made once and kept by the registry's one-shot memos:
    the default limits' in :attr:`_Memos.default_state` (where decode's C entry reads
    it), others' among :attr:`_Memos.frame_states`."""
    memos = _one_shot_memos(registry)
    if limits is DEFAULT_LIMITS:
        state = memos.default_state
        if state is None:
            state = memos.default_state = _frame_state(registry, limits, memos)
        return state
    kept = memos.frame_states.get(id(limits))
    if kept is None or kept[0] is not limits:
        if len(memos.frame_states) >= FRAME_STATES:
            memos.frame_states.clear()
        kept = memos.frame_states[id(limits)] = (limits, _frame_state(registry, limits, memos))
    return kept[1]


#: The one-shot decode()'s frame states kept per registry (one per Limits object used).
FRAME_STATES = 16


#: The Python methods and function the C entries stand in for (themselves where the
#: extension is not built): the references the tests hold the entries to.
encode_python = fallback(Encoder.encode)
decode_python = fallback(Decoder.decode)
decode_one_shot_python = fallback(decode)
