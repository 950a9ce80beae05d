"""CBCL messages in SPADE messages (SPADE 4: XMPP agents; spec/interop.md, "SPADE").

A CBCL message travels as one SPADE :class:`spade.message.Message`: its **body** is the
message's canonical CBCL text (the whole envelope: authoritative, signable), its
**metadata** the FIPA parameters the FIPA mapping (:mod:`cbcl.bridges._fipa`) gives it —
``performative``, ``protocol``, ``conversation-id`` (also the XMPP ``thread``),
``reply-with``, ``in-reply-to``, ``reply-by``, ``language`` (``CBCL/1.0``), ``ontology``
(the CBCL protocol) and ``X-CBCL-…`` — so SPADE code that routes by performative, protocol
or thread (``spade-fipaproto``'s Request and Contract Net behaviours) works unchanged.

Reading a SPADE message: a body that is CBCL text is read (pass 1; pass 2 is
:func:`cbcl.validate`'s, with the registry) and the metadata only checked for the
performative (a SPADE agent acts on it: it must say what the body says); any other body is
foreign content, mapped through :func:`cbcl.bridges._fipa.fipa_to_message` with the metadata as
its parameters (losses said, refused unless ``lossy``). JIDs and URIs: ``a@host`` is
``xmpp://a@host``.

Who sent it: no session vouches for a SPADE message's ``sender``, only the message's own
signature can. :func:`spade_identity` verifies it against a trust store, the key bound to
the sender by the trust policy's ``(key ID (names …))`` (spec/trust.md §4.1; a policy may
bind keys to ``xmpp://`` names as to any other), and returns the sender's
:class:`~cbcl.trust.Identity`: what a check of the XMPP-authenticated JID against the body's
sender builds on.

``spade`` is imported when these functions are called (the ``fipa`` extra: ``pip install
'cbcl[fipa]'``); SPADE's and slixmpp's exceptions are translated to
:class:`cbcl.bridges._fipa.ConversionError` here, at the boundary.
"""

from __future__ import annotations

import importlib
import re
from typing import Any, cast

from ..core._errors import CBCLError
from ..core._limits import DEFAULT_LIMITS, Limits
from ..core._reader import decode
from ..core._values import URI
from ..protocol._envelope import parse_envelope
from ..protocol._message import Message
from ..protocol._trust import Identity, TrustStore
from ._fipa import (
    CBCL_LANGUAGE,
    AgentId,
    ConversionError,
    DateTime,
    Expr,
    FipaMessage,
    Word,
    fipa_to_message,
    message_to_fipa_message,
)

__all__ = ["jid_to_uri", "message_to_spade", "spade_identity", "spade_to_message",
           "uri_to_jid"]

XMPP_SCHEME = "xmpp://"
#: spade-fipaproto's performatives that FIPA SC00037 spells otherwise.
_ALIASES = {"call-for-proposal": "cfp", "refuse-proposal": "reject-proposal",
            "query": "query-ref"}


def _spade_message() -> Any:
    try:
        return importlib.import_module("spade.message").Message
    except ImportError as exc:  # pragma: no cover - the fipa extra is not installed
        raise ConversionError("the SPADE adapter needs spade: pip install 'cbcl[fipa]' "
                              f"({exc})") from None


def uri_to_jid(uri: URI | str) -> str:
    """The JID of an ``xmpp://JID`` URI. Raises :class:`ConversionError` for another
    URI."""
    text = str(uri)
    if not text.startswith(XMPP_SCHEME) or len(text) == len(XMPP_SCHEME):
        raise ConversionError(f"{text} is not an xmpp:// URI: give the JID (to=/sender=)")
    return text[len(XMPP_SCHEME):]


def jid_to_uri(jid: object) -> URI:
    """The ``xmpp://JID`` URI of a JID (its bare form: ``a@host``, without a resource)."""
    bare = str(getattr(jid, "bare", jid) or "")
    try:
        return URI(XMPP_SCHEME + bare)
    except (TypeError, ValueError) as exc:
        raise ConversionError(f"JID {bare!r} makes no CBCL URI: {exc}") from None


def _text(value: Expr | None) -> str | None:
    if value is None:
        return None
    if isinstance(value, tuple):  # pragma: no cover - the mapping writes no list here
        raise ConversionError("a list expression has no place in SPADE metadata")
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def message_to_spade(message: Message, *, to: str | None = None,
                     sender: str | None = None) -> Any:
    """The SPADE ``Message`` that carries ``message``: the canonical CBCL text as body, the
    FIPA parameters as metadata, the conversation id as thread. ``to`` and ``sender`` (JIDs)
    default to the message's receiver and sender when they are ``xmpp://`` URIs. Raises
    :class:`ConversionError` when a JID is missing or invalid."""
    fipa, _ = message_to_fipa_message(message, lossy=True)  # the body carries everything
    metadata: dict[str, str] = {"performative": fipa.performative}
    for key, value in (("protocol", fipa.protocol), ("conversation-id", fipa.conversation_id),
                       ("reply-with", fipa.reply_with), ("in-reply-to", fipa.in_reply_to),
                       ("reply-by", fipa.reply_by), ("ontology", str(message.protocol))):
        text = _text(value)
        if text is not None:
            metadata[key] = text
    metadata["language"] = CBCL_LANGUAGE
    for key, value in fipa.params:
        text = _text(value)
        if text is not None:
            metadata[key] = text
    spade_message = _spade_message()
    try:
        return spade_message(to=to if to is not None else uri_to_jid(message.receiver),
                             sender=sender if sender is not None
                             else uri_to_jid(message.sender),
                             body=message.canonical(), thread=message.conversation_id,
                             metadata=metadata)
    except CBCLError:
        raise
    except Exception as exc:  # slixmpp's InvalidJID, spade's TypeError …
        raise ConversionError(f"SPADE refused the message: {type(exc).__name__}: {exc}"
                              ) from None


def spade_to_message(spade_message: Any, *, lossy: bool = False,
                     limits: Limits = DEFAULT_LIMITS) -> tuple[Message, list[str]]:
    """The CBCL message a SPADE ``Message`` carries, and what was lost (module docstring).

    Raises :class:`cbcl.MalformedError`/:class:`cbcl.LimitError` for a CBCL body that
    does not read, :class:`ConversionError` when the metadata's performative contradicts
    the body's intent or no CBCL message can be made, :class:`LossyConversionError` for
    foreign content that would lose something when ``lossy`` is false."""
    try:
        body = spade_message.body
        # SPADE 4 keeps metadata in a slot with no public accessor for the whole mapping
        metadata = dict(getattr(spade_message, "metadata", None)
                        or getattr(spade_message, "_metadata", None) or {})
        sender, to, thread = spade_message.sender, spade_message.to, spade_message.thread
    except AttributeError as exc:
        raise ConversionError(f"not a SPADE message: {exc}") from None
    text = "" if body is None else str(body)
    if text.lstrip().startswith("(CBCL/1.0"):

        message = parse_envelope(decode(text, limits), limits)
        said = metadata.get("performative")
        if said is not None:
            expected = message_to_fipa_message(message, lossy=True)[0].performative
            if said.lower() != expected:
                raise ConversionError(f"metadata performative {said} contradicts the CBCL "
                                      f"body's intent {message.intent} ({expected})")
        return message, []
    performative = metadata.pop("performative", None)
    if not performative:
        raise ConversionError("a SPADE message without CBCL text needs a performative in "
                              "its metadata")
    performative = _ALIASES.get(performative.lower(), performative.lower())
    words: dict[str, Expr] = {}
    for key in ("language", "ontology", "encoding", "reply-with", "in-reply-to",
                "conversation-id"):
        value = metadata.pop(key, None)
        if value:
            words[key.replace("-", "_")] = value
    if "conversation_id" not in words and thread:
        words["conversation_id"] = str(thread)
    reply_by = metadata.pop("reply-by", None)
    params: list[tuple[str, Expr]] = [
        (key if key.lower().startswith("x-") else f"X-{key}", value)
        for key, value in metadata.items() if key != "protocol"]
    fipa = FipaMessage(
        performative, sender=AgentId(str(jid_to_uri(sender))),
        receivers=(AgentId(str(jid_to_uri(to))),), content=text or None,
        protocol=metadata.get("protocol") or None,
        reply_by=DateTime(reply_by) if reply_by else None, params=tuple(params),
        **cast("dict[str, Any]", words))
    if fipa.reply_by is not None and not _is_fipa_datetime(fipa.reply_by):
        # SPADE's own builder writes ISO 8601 (2026-01-01T12:00:00), not a FIPA date-time
        fipa = FipaMessage(**{**_fields(fipa), "reply_by": None,
                              "params": (*fipa.params, ("X-reply-by", Word(reply_by or "")))})
    return fipa_to_message(fipa, lossy=lossy, limits=limits)


def spade_identity(message: Message, *, trust: TrustStore,
                   require_signature: bool = False) -> Identity | None:
    """Who sent ``message`` (as :func:`spade_to_message` read it), as far as ``trust``
    proves it: the :class:`~cbcl.trust.Identity` of the key whose signature it carries,
    which the trust policy lets speak as its ``sender`` (spec/trust.md §4.1); ``None`` for
    an unsigned message unless ``require_signature``. Raises :class:`cbcl.TrustError`
    (``untrusted-signer`` or ``bad-signature`` on the wire) for a bad or unknown signature,
    a key not bound to the sender, or a missing signature that is required."""
    if message.signature is None and not require_signature:
        return None
    return trust.verify_identity(message)


def _is_fipa_datetime(text: str) -> bool:

    return re.fullmatch(r"[+-]?[0-9]{8}[Tt][0-9]{9}[A-Za-z]?", text) is not None


def _fields(fipa: FipaMessage) -> dict[str, Any]:
    return {name: getattr(fipa, name) for name in FipaMessage.__dataclass_fields__}
