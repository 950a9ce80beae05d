"""The top-level operations: :func:`parse`, :func:`canonical`, :func:`validate`."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any, NoReturn, TypeVar, overload

from ..core._canonical import canonical_value
from ..core._entries import entry, fallback
from ..core._errors import CBCLError, UnknownProtocolError
from ..core._limits import DEFAULT_LIMITS, Limits
from ..core._reader import (
    _CACHE,
    _atom,
    _read_value_c,
    context_of,
    decode,
    only_space_after,
    position_of,
    utf8_of,
)
from ..core._values import (
    ATOM_TERMINALS,
    INT64_MAX,
    INT64_MIN,
    URI,
    Keyword,
    Symbol,
    Value,
    ValueInput,
)
from ..grammar._automaton import ACCEPT, REFUSED
from ._envelope import ENVELOPE_TABLES, message_of, message_of_python, parse_envelope
from ._message import Message
from ._pass2 import (
    check_intent_and_body,
    explain_body,
    find_body_refusal,
    path_index,
    reported_refusal,
)
from ._protocol import Protocol
from ._records import record_of
from ._registry import Registry
from ._schema import _has_heads

try:
    from .._native import (
        accept_document as _accept_document_speedups,
        parse_entry as _parse_entry,
    )
except ImportError:  # not built: parse() takes the careful path only
    _accept_document_c: Any = None
else:
    _accept_document_c = None if _read_value_c is None else _accept_document_speedups

try:
    from .._native import (
        check_outgoing as _check_outgoing_native,
        setup_outgoing as _setup_outgoing,
    )
except ImportError:  # not built: check_outgoing is the Python reference's walk only
    _check_outgoing_c: Any = None
else:
    _check_outgoing_c = _check_outgoing_native
    _setup_outgoing(ATOM_TERMINALS, REFUSED, ACCEPT, _has_heads)

#: What cbcl._native.accept_document takes with each document: the envelope's tables
#: (as cbcl.protocol._envelope.message_of passes them) and pass 2's (the atoms' terminals, the
#: automaton's outcomes, the schema's head test).
_DOCUMENT_TABLES = (*ENVELOPE_TABLES, ATOM_TERMINALS, REFUSED, ACCEPT, _has_heads)


_type = type  # (parse's own ``type`` is its type= parameter)


def _verified(message: Message, registry: Registry) -> Message:
    """``message``, one that must be verified (signed, or signatures required), once the
    trust store of ``registry`` (if it has one) has verified it, as :func:`parse` and
    :meth:`Decoder.decode` do. Raises :class:`TrustError`."""
    trust = registry.trust
    if trust is not None:
        trust.verify_message(message)
    return message


def _after_envelope(text: str | None, message: Message, declined: bool, limits: Limits,
                    registry: Registry | None, envelope_only: bool,
                    require_signatures: bool, report: tuple[Any, ...] | None = None,
                    ) -> Message:
    """:func:`parse` once pass 1 has given ``message`` (read from ``text``; ``None``:
    both passes accepted it in C): the signature, then pass 2 and the protocol's
    stateless constraints. ``declined``: the C tiers ran both passes on this document and
    declined it, so pass 2 most likely refuses it (the refusal is found, not only
    decided); ``report``: where their walk found the grammar refused the body (as
    ``cbcl._native.refusal_of`` reports it), so it is not walked again. Raises as
    :func:`parse`."""
    trust = registry.trust if registry is not None else None
    if trust is not None and (message.signature is not None or require_signatures):
        trust.verify_message(message)
    if envelope_only or text is None:
        if text is None and registry is not None and registry._constrained:
            check_constraints(registry, message)  # (accepted by the C tiers)
        return message
    protocol = registry.get(message.protocol) if registry is not None else None
    if protocol is None:
        _unknown_protocol(text, message, limits)
    if declined:  # both passes' native tier declined it: pass 2 refuses it
        # (a governed intent with a body the C walk refused: found there, else here)
        refusal = None if report is None else reported_refusal(protocol, report)
        if refusal is None:
            refusal = find_body_refusal(protocol, message)  # (as a rule)
        if refusal is not None:
            explain_body(protocol, text, message, limits, refusal=refusal)
    elif check_intent_and_body(protocol, message) is False:
        explain_body(protocol, text, message, limits)
    if protocol.constraints is not None:
        protocol.constraints.check(message)
    return message


def _declined(value: Value, text: str, registry: Registry,
              report: tuple[Any, ...] | None = None) -> Message | None:
    """The C entry's continuation (``cbcl._native.parse_entry``) for a document it read
    whole within the default limits (``value``, from ``text``) and whose passes its C
    tiers did not accept: :func:`parse`'s careful path from that value, not from the text
    read again. Returns the message (one the C tiers decline but pass 2 accepts: an
    ungoverned NOT-UNDERSTOOD, say), or ``None`` where pass 1 refuses the value (the
    careful path then reads the text, to say where). Raises as :func:`parse`: a refused
    body's :class:`BodyError` is worded from where the C entry's walk stopped
    (``report``, as ``cbcl._native.refusal_of`` reports it; ``None``: not the grammar, or
    not known), at the place ``cbcl._native.text_index`` finds in ``text``."""
    envelope = message_of(value)
    if envelope is None:
        return None
    return _after_envelope(text, envelope, True, DEFAULT_LIMITS, registry, False, False,
                           report)


def check_constraints(registry: Registry, message: Message) -> None:
    """Apply the stateless constraints of the protocol ``registry`` holds for ``message``
    (one pass 2 has accepted), if it has any: what the binary decoder runs after its tiers.
    Raises :class:`ConstraintError` or :class:`LimitError`."""
    protocol = registry.get(message.protocol)
    if protocol is not None and protocol.constraints is not None:
        protocol.constraints.check(message)


R = TypeVar("R")


@overload
def parse(data: bytes | bytearray | memoryview | str, *, limits: Limits | None = None,
          envelope_only: bool = False, registry: Registry | None = None,
          require_signatures: bool = False, type: None = None) -> Message: ...
@overload
def parse(data: bytes | bytearray | memoryview | str, *, limits: Limits | None = None,
          envelope_only: bool = False, registry: Registry | None = None,
          require_signatures: bool = False, type: type[R]) -> R: ...
@overload
def parse(data: bytes | bytearray | memoryview | str, *, limits: Limits | None = None,
          envelope_only: bool = False, registry: Registry | None = None,
          require_signatures: bool = False, type: Any) -> Any: ...


# Where the extension is built, parse is a C function (cbcl/_native_src/entry.h,
# cbcl._native.parse_entry): parse(data, registry=registry) of bytes within the default
# limits is _accepted's work in one C call, then check_constraints where the protocol has
# rules; a document read whole that its passes decline goes on from the value read, in
# _declined (no second read); any other call, or a document it declines, is this
# function's, which stays the reference and lends its documentation.
@entry(None if _accept_document_c is None else _parse_entry, _verified, only_space_after,
       _DOCUMENT_TABLES, _CACHE, _atom,
       (DEFAULT_LIMITS.max_message_bytes, DEFAULT_LIMITS.max_depth,
        DEFAULT_LIMITS.max_list_items, DEFAULT_LIMITS.max_nodes,
        DEFAULT_LIMITS.max_string_bytes, DEFAULT_LIMITS.max_name_chars),
       _declined, check_constraints, method=False)
def parse(data: bytes | bytearray | memoryview | str, *, limits: Limits | None = None,
          envelope_only: bool = False, registry: Registry | None = None,
          require_signatures: bool = False, type: Any = None) -> Any:
    """Parse one CBCL/1.0 message: pass 1 (envelope) and, unless ``envelope_only``, pass 2
    (the body, by the grammar of the message's protocol in ``registry``). A message is
    returned only when both passes accept it.

    When ``registry`` has a trust store, a signed message's signature is verified after
    pass 1 and before pass 2 (also with ``envelope_only``); ``require_signatures=True``
    refuses unsigned messages and needs such a registry. Without a trust store a signature
    is carried but NOT verified.

    Raises :class:`MalformedError` (:class:`EnvelopeError` for a bad envelope,
    :class:`BodyError` for a body its grammar refuses), :class:`LimitError`,
    :class:`UnknownProtocolError` for a protocol the registry does not hold,
    :class:`ProtocolError` for an intent the protocol does not govern,
    :class:`SchemaError` for a body its schema refuses and its subclass
    :class:`~cbcl.protocol._constraints.ConstraintError` for one that breaks a rule of its
    ``(constraints …)`` that reads no earlier message (spec/conversations.md §5),
    :class:`TrustError` (``"message verification failed"``) for a bad, unknown-key or
    disallowed signature or a missing required one, ``TypeError`` for input that is not
    bytes or str, and ``ValueError`` for ``require_signatures`` without a trust store.

    With ``type=`` a :class:`cbcl.Record` class (or ``A | B``), the accepted message's
    body is returned as an instance of it (:func:`cbcl.descriptor.record_of`), which raises
    :class:`SchemaError` for a body that is not the class's.
    """
    if type is not None:  # the message as without type= (the C entry's call), converted
        accepted: Message = parse(data, registry=registry) if registry is not None and \
            limits is None and not envelope_only and not require_signatures else \
            parse(data, limits=limits, envelope_only=envelope_only, registry=registry,
                  require_signatures=require_signatures)
        return record_of(accepted, type, None if registry is None
                         else registry.get(accepted.protocol))
    # parse(data, registry=R) of exact bytes is the C entry's own call: it ran _accepted's
    # tiers already and declined the document, so they are not run again on it here.
    tried = limits is None and not require_signatures and parse is not parse_python
    limits = DEFAULT_LIMITS if limits is None else limits
    if not isinstance(limits, Limits):
        raise TypeError("limits must be a cbcl.Limits")
    trust = registry.trust if registry is not None else None
    if require_signatures and trust is None:
        raise ValueError("require_signatures needs a registry with a trust store")
    text = None  # (stays None where both passes accepted the document in C)
    message = envelope = None
    if _accept_document_c is not None and registry is not None and not envelope_only and \
            _type(data) is bytes and len(data) <= limits.max_message_bytes:
        message, envelope, text = _accepted(data, limits, registry, tried)
    if message is None:
        if text is None:
            text = decode(data, limits)
        message = envelope if envelope is not None else \
            parse_envelope(text, limits, utf8_of(data))
    return _after_envelope(text, message, envelope is not None, limits, registry,
                           envelope_only, require_signatures)


def _unknown_protocol(text: str, message: Message, limits: Limits) -> NoReturn:
    """Raise the :class:`UnknownProtocolError` of ``message`` (read from ``text``), at its
    protocol symbol, found by stepping over the fields before it (not by a scan)."""
    at = path_index(text, message.to_value(), _PROTOCOL_PATH, limits)
    raise UnknownProtocolError(
        f"unknown protocol {message.protocol}: no descriptor for it is loaded",
        protocol=str(message.protocol), position=position_of(text, at),
        context=context_of(text, at))


#: Where the protocol symbol is in a message's value: (protocol …), the sixth field.
_PROTOCOL_PATH = (5, 1)


def _accepted(data: bytes, limits: Limits, registry: Registry, tried: bool = False,
              ) -> tuple[Message | None, Message | None, str | None]:
    """:func:`parse`'s fast path, by the C tiers alone: the document read in one call
    (``cbcl._native.read_value``), both passes over its value in another
    (``cbcl._native.accept_document``, the twin of :func:`accept_document_python`).
    Returns ``(message, None, None)`` for a message both passes accept; else, for the
    careful path, ``(None, envelope, text)``: the document's text (``None`` where it is
    not UTF-8) and, where the value read is an envelope (``cbcl._native.envelope``), its
    message, which pass 1 would build again from the same read (the careful path then
    reads the document no more: a refused body costs one read here, not three).
    ``tried``: the C entry ran both passes on this very document and declined it, so
    ``accept_document`` is not run again (it would decline again). Only an
    accepted message is returned as accepted, so the careful path's order of checks (the
    signature before pass 2) cannot change an outcome: a message both passes accept
    fails only on its signature there too.
    """
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return None, None, None
    found = _read_value_c(text, 0, _CACHE, _atom, limits.max_depth, limits.max_list_items,
                          limits.max_nodes, limits.max_string_bytes, limits.max_name_chars,
                          data)
    if found is None:
        return None, None, text
    value, end, _ = found
    if not only_space_after(text, end):
        return None, None, text
    # (the registry's own dict of every loaded protocol, those with constraints too, whose
    # rules parse checks after this: one lookup in C, no copy)
    message: Message | None = None if tried else \
        _accept_document_c(value, _DOCUMENT_TABLES, registry._protocols)
    if message is not None:
        return message, None, None
    return None, message_of(value), text


#: The Python function parse's C entry stands in for (itself where the extension is not
#: built): the reference the tests hold it to.
parse_python = fallback(parse)


def accept_document_python(value: Value, registry: Registry) -> Message | None:
    """The message a whole document's ``value`` holds when both passes accept it, with
    the protocol ``registry`` holds for it, else ``None`` (an error the careful path
    raises is ``None`` here too). The reference of ``cbcl._native.accept_document``,
    which may also decline (``None``) a message this accepts: a NOT-UNDERSTOOD or CANCEL
    its protocol does not govern, or a schema type of more than 63 fields."""
    message = message_of_python(value)
    if message is None:
        return None
    protocol = registry.get(message.protocol)
    if protocol is None:
        return None
    try:
        accepted = check_intent_and_body(protocol, message)
    except CBCLError:
        return None
    return message if accepted is not False else None


def canonical(value: ValueInput | Message) -> str:
    """The canonical text (draft §1.2) of a value or a :class:`Message`.

    Raises ``TypeError`` for a non-CBCL value and ``ValueError`` for one out of range.
    """
    if issubclass(type(value), Message):  # (its type: not what its __class__ says)
        message: Any = value
        return message.canonical()  # type: ignore[no-any-return]  # (a Message's: str)
    return canonical_value(value)  # type: ignore[arg-type]  # (not a Message: issubclass)


def validate(message: Message, *, registry: Registry, limits: Limits | None = None) -> None:
    """Check ``message`` as a receiver would, without sending it: the document's limits
    (``limits``, default :data:`DEFAULT_LIMITS`), then that ``registry`` holds its protocol,
    then pass 2 - the intent is one the protocol governs, its grammar accepts the body, and
    the body satisfies the schema. Returns ``None``; a message that validates is accepted
    by ``parse(canonical(message), registry=registry, limits=limits)`` and, as a binary
    frame, by a :class:`Decoder` with the same limits (:class:`Encoder` also checks the
    frame's own size: it can exceed the text's by a few bytes per decimal).

    Signatures are not checked (a receiver with a trust store verifies them). Where the
    extension is built, the limits, pass 2 and the schema are checked in one C call
    (:func:`check_outgoing`); only a message near a limit has its text written out.

    Raises what :func:`parse` raises on the canonical text, with positions in that text:
    :class:`LimitError`, :class:`UnknownProtocolError`, :class:`ProtocolError` (an intent
    the protocol does not govern), :class:`BodyError` (a body the grammar refuses, or a
    missing one), :class:`SchemaError` and :class:`ConstraintError` (a rule of the
    protocol's constraints that reads no earlier message; the step budget is a
    :class:`LimitError`); ``TypeError`` for arguments of the wrong type.
    """
    if not isinstance(message, Message):
        raise TypeError(f"expected a cbcl.Message, not {type(message).__name__}")
    if not isinstance(registry, Registry):
        raise TypeError("registry must be a cbcl.Registry")
    limits = DEFAULT_LIMITS if limits is None else limits
    if not isinstance(limits, Limits):
        raise TypeError("limits must be a cbcl.Limits")
    protocol = registry.get(message.protocol)
    if protocol is not None:
        check_outgoing(protocol, message, limits)  # (the C check where it is built)
        return
    _check_limits(message, limits)
    _unknown_protocol(message.canonical(), message, limits)


def check_outgoing(protocol: Protocol, message: Message, limits: Limits = DEFAULT_LIMITS,
                   ) -> None:
    """:func:`validate` for a sender that holds the message's ``protocol`` already (as a
    session or an :class:`Encoder` does): the limits, then pass 2, without the registry
    lookup or argument checks. ``message.protocol`` must be ``protocol.id`` and ``limits``
    a :class:`Limits` (neither is checked). Raises as :func:`validate`.

    Where the extension is built, ``cbcl._native.check_outgoing`` (cbcl/_native_src/
    outgoing.c) first tries the limits, pass 2 and the schema in one C call; it only
    accepts, and whatever it does not accept is judged by :func:`check_outgoing_python`,
    the reference, which raises the error."""
    if _check_outgoing_c is not None and _check_outgoing_c(protocol, message, limits):
        if protocol.constraints is not None:
            protocol.constraints.check(message)
        return
    check_outgoing_python(protocol, message, limits)


def check_outgoing_python(protocol: Protocol, message: Message,
                          limits: Limits = DEFAULT_LIMITS) -> None:
    """:func:`check_outgoing` in Python alone: the reference its C tier is held to."""
    _check_limits(message, limits)
    _check_body(protocol, message, limits)
    if protocol.constraints is not None:
        protocol.constraints.check(message)


def _check_body(protocol: Protocol, message: Message, limits: Limits) -> None:
    """Pass 2, as :func:`parse` runs it; a refused body is explained on its text."""
    if check_intent_and_body(protocol, message) is False:
        explain_body(protocol, message.canonical(), message, limits)


def _check_limits(message: Message, limits: Limits) -> None:
    """Raise the :class:`LimitError` the receiver of the message's canonical text would
    raise, if any. A quick walk decides most messages; the rest are written out."""
    verdict = _within(message, limits)
    if verdict is _WITHIN:
        return
    text = message.canonical()
    if verdict is _SIZE and not _utf8_over(text, limits.max_message_bytes):
        return
    parse_envelope(decode(text, limits), limits)  # pass 1: raises, or finds it within


def _utf8_over(text: str, maximum: int) -> bool:
    """Whether ``text`` takes more than ``maximum`` bytes in UTF-8."""
    if len(text) * 4 <= maximum:
        return False
    try:
        return len(text.encode("utf-8")) > maximum
    except UnicodeEncodeError:
        return True


_WITHIN, _SIZE, _UNSURE = "within", "size", "unsure"


def _within(message: Message, limits: Limits) -> str:
    """Whether the canonical text of ``message`` is within ``limits``, from one walk of
    the body that counts nodes, items and depth as the reader does and checks each
    string's and name's size: ``_WITHIN`` (certainly), ``_SIZE`` (all but the document's
    size, which the walk bounds from above only) or ``_UNSURE`` (a limit may be exceeded,
    or a value is not of an exact CBCL type)."""
    max_string = limits.max_string_bytes
    max_name = limits.max_name_chars
    max_items = limits.max_list_items
    conversation_id = message.conversation_id
    in_reply_to = message.in_reply_to
    signature = message.signature
    body = message.body
    fields = 5 + (conversation_id is not None) + (in_reply_to is not None) + \
        (message.reply_by is not None) + (message.timestamp is not None) + \
        (signature is not None) + (body is not None) + (message.trace is not None)
    # Limits so small that the envelope alone may exceed them (its field names take 15
    # characters, its lists 12 items and 3 levels) are left to the text.
    if max_name < 15 or max_items < 12 or limits.max_depth < 3 or \
            len(message.protocol) > max_name:
        return _UNSURE
    # The size bound: the envelope's names; 43 bytes a node (the longest decimal, or a
    # list's parentheses, a string's quotes, a keyword's colon, and a space), and 6 bytes
    # a string's character (an escape), 4 a URI's, 1 a name's. (A message past it is
    # written out to be measured.)
    size = 250 + len(message.protocol) + 4 * (len(message.sender) + len(message.receiver))
    trace = message.trace
    for text in (message.message_id, conversation_id, in_reply_to, trace) if signature is None \
            else (message.message_id, conversation_id, in_reply_to, trace, signature.key_id,
                  signature.value):
        if text is not None:
            if len(text) * 4 > max_string and _utf8_over(text, max_string):
                return _UNSURE
            size += 6 * len(text) + 2
    nodes = 2 + 3 * fields + (1 if signature is not None else 0)  # the body's root too
    if body is not None:
        deepest = limits.max_depth - 2  # the lists around the body: (CBCL/1.0 (body …
        stack: list[Iterator[Any]] = [iter((body,))]  # the (body …) list's value
        item: Any
        while stack:
            for item in stack[-1]:
                kind = type(item)
                if kind is str:
                    if len(item) * 4 > max_string and _utf8_over(item, max_string):
                        return _UNSURE
                    size += 6 * len(item)
                elif kind is tuple:  # a list 2 + len(stack) deep, its items counted here
                    if len(item) > max_items or len(stack) > deepest:
                        return _UNSURE
                    nodes += len(item)
                    stack.append(iter(item))
                    break
                elif kind is Symbol or kind is Keyword:
                    if len(item) > max_name:
                        return _UNSURE
                    size += len(item)
                elif kind is int:
                    if not INT64_MIN <= item <= INT64_MAX:
                        return _UNSURE
                elif kind is URI:
                    size += 4 * len(item)
                elif kind is not Decimal:
                    return _UNSURE
            else:
                stack.pop()
    if nodes > limits.max_nodes:
        return _UNSURE
    return _SIZE if size + 43 * nodes > limits.max_message_bytes else _WITHIN


