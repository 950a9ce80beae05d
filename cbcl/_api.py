"""The top-level operations: :func:`parse`, :func:`canonical`."""

from __future__ import annotations

from ._canonical import canonical_value
from ._envelope import parse_envelope, scan_envelope
from ._errors import UnknownProtocolError
from ._limits import DEFAULT_LIMITS, Limits
from ._message import Message
from ._protocol import Registry, check_intent_and_body, explain_body
from ._reader import context_of, decode, position_of
from ._values import Value


def parse(data: bytes | bytearray | memoryview | str, *, limits: Limits | None = None,
          envelope_only: bool = False, registry: Registry | None = None,
          require_signatures: bool = False) -> Message:
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
    :class:`TrustError` (``"message verification failed"``) for a bad, unknown-key or
    disallowed signature or a missing required one, ``TypeError`` for input that is not
    bytes or str, and ``ValueError`` for ``require_signatures`` without a trust store.
    """
    limits = DEFAULT_LIMITS if limits is None else limits
    if not isinstance(limits, Limits):
        raise TypeError("limits must be a cbcl.Limits")
    trust = registry.trust if registry is not None else None
    if require_signatures and trust is None:
        raise ValueError("require_signatures needs a registry with a trust store")
    text = decode(data, limits)
    message = parse_envelope(text, limits)
    if trust is not None and (message.signature is not None or require_signatures):
        trust.verify_message(message)
    if envelope_only:
        return message
    protocol = registry.get(message.protocol) if registry is not None else None
    if protocol is None:
        at = scan_envelope(text, limits).protocol_at
        raise UnknownProtocolError(
            f"unknown protocol {message.protocol}: no descriptor for it is loaded",
            protocol=str(message.protocol), position=position_of(text, at),
            context=context_of(text, at))
    if check_intent_and_body(protocol, message) is False:
        explain_body(protocol, text, scan_envelope(text, limits).body_at, limits)
    return message


def canonical(value: Value | Message) -> str:
    """The canonical text (draft §1.2) of a value or a :class:`Message`.

    Raises ``TypeError`` for a non-CBCL value and ``ValueError`` for one out of range.
    """
    if isinstance(value, Message):
        return value.canonical()
    return canonical_value(value)
