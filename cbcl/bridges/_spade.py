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
performative (a SPADE agent acts on it: it must say what the body says) unless they are a
``make_reply`` copy (below); any other body is foreign content, mapped through
:func:`cbcl.bridges._fipa.fipa_to_message` with the metadata as its parameters (losses
said, refused unless ``lossy``). JIDs and URIs: ``a@host`` is ``xmpp://a@host``.

Who sent it (spec/interop.md §2.1). Two checks, both on the body's ``sender``:

* **The JID.** The XMPP server authenticated the connection the stanza came on as an
  account, a *bare* JID (``a@host``; the resource is a label any connection of the account
  picks, so it names no one). :func:`spade_to_message` always compares the body's
  ``sender`` with the names that JID may speak as — by default ``xmpp://<bare JID>`` only;
  a ``jid_names`` policy (a mapping or a callable) may give it agent URIs or patterns of
  its own (spec/trust.md §4.1's patterns). A mismatch is :class:`SenderMismatchError`
  (wire code ``malformed``: "a message between the wrong parties"), logged, and no message
  is returned, so no reply can go to the name the body claimed.
* **The key.** With a trust store, the message's signature is verified and its key must be
  bound to the sender (:func:`spade_identity`; ``TrustError``, ``untrusted-signer`` or
  ``bad-signature``). This is what holds where the JID does not: SPADE's embedded server
  (pyjabber 0.4.5) forwards a ``from`` the client wrote, so on it the JID is a claim.

Replies made with SPADE's ``make_reply()`` copy the request's metadata: ``language
CBCL/1.0``, ``reply-with`` (the request's id), ``reply-by``, ``X-CBCL-…`` (timestamp,
signature). Read back, such copies are recognised — a CBCL body that answers the very
message the metadata describe, or a plain body under a copied ``language CBCL/1.0`` — and
not taken as this message's (spec/interop.md §2.2). ``message_to_spade(reply,
reply_to=request)`` makes a CBCL reply the same way, to the JID the request came from.

``spade`` is imported when these functions are called (the ``fipa`` extra: ``pip install
'cbcl[fipa]'``); SPADE's and slixmpp's exceptions are translated to
:class:`cbcl.bridges._fipa.ConversionError` here, at the boundary.
"""

from __future__ import annotations

import importlib
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias, cast

from ..core._display import peer_text
from ..core._errors import CBCLError, LossyConversionError, TrustError
from ..core._limits import DEFAULT_LIMITS, Limits
from ..core._reader import decode
from ..core._values import URI, Symbol
from ..protocol._envelope import parse_envelope
from ..protocol._message import Message
from ..protocol._trust import (
    WILDCARD_SEGMENT,
    Identity,
    TrustStore,
    name_matches,
    name_pattern_problem,
)
from ..session._reasons import RemoteProtocolError
from ._fipa import (
    CBCL_LANGUAGE,
    AgentId,
    ConversionError,
    DateTime,
    Expr,
    FipaMessage,
    Word,
    _cbcl_protocol,
    fipa_to_message,
    message_to_fipa_message,
)

__all__ = ["JidNames", "SenderMismatchError", "check_spade_sender", "jid_to_uri",
           "message_to_spade", "spade_identity", "spade_sender_names", "spade_to_message",
           "uri_to_jid"]

_log = logging.getLogger(__name__)

XMPP_SCHEME = "xmpp://"
#: spade-fipaproto's performatives that FIPA SC00037 spells otherwise.
_ALIASES = {"call-for-proposal": "cfp", "refuse-proposal": "reject-proposal",
            "query": "query-ref"}
#: The metadata keys :func:`message_to_spade` writes for a message (with ``X-CBCL-…``): in
#: a ``make_reply`` copy they describe the answered message, not the reply.
_MAPPED_KEYS = frozenset({"performative", "protocol", "conversation-id", "reply-with",
                          "in-reply-to", "reply-by", "language", "ontology", "encoding"})
_X_CBCL = "x-cbcl-"

#: Who a JID may speak as (spec/interop.md §2.1): a mapping from bare JIDs (as slixmpp
#: normalises them: ``alice@host``, lowercase) to one name or several, or a callable given
#: the bare JID. A name is an agent URI or a pattern ``PREFIX/*`` (spec/trust.md §4.1). A
#: JID the mapping lacks, or for which the callable returns ``None``, may speak only as
#: ``xmpp://<bare JID>``; an empty sequence lets it speak as no one.
JidNames: TypeAlias = (Mapping[str, str | Sequence[str]]
                       | Callable[[str], str | Sequence[str] | None])


class SenderMismatchError(RemoteProtocolError):
    """A SPADE message whose CBCL ``sender`` is not a name its XMPP sender — the bare JID
    the server authenticated — may speak as: code ``malformed`` ("a message between the
    wrong parties", spec/negotiation.md §4), exit 5. ``jid`` is that bare JID (empty when
    the stanza had none), ``claimed`` the body's sender, ``allowed`` the names (or
    patterns) the policy gives the JID."""

    kind = "identity"

    def __init__(self, message: str, *, jid: str, claimed: str,
                 allowed: tuple[str, ...]) -> None:
        super().__init__(message, code="malformed")
        self.jid = jid
        self.claimed = claimed
        self.allowed = allowed


def _spade_message() -> Any:
    try:
        return importlib.import_module("spade.message").Message
    except ImportError as exc:  # pragma: no cover - the fipa extra is not installed
        raise ConversionError("the SPADE adapter needs spade: pip install 'cbcl[fipa]' "
                              f"({exc})") from None


def _bare_jid(jid: object) -> str:
    """The bare JID (``a@host``, slixmpp's normal form) of a slixmpp ``JID`` or of JID
    text; ``""`` for none. Raises :class:`ConversionError` for text that is not a JID."""
    bare = getattr(jid, "bare", None)
    if isinstance(bare, str):
        return bare
    text = "" if jid is None else str(jid)
    if not text:
        return ""
    try:
        return str(importlib.import_module("slixmpp.jid").JID(text).bare)
    except ImportError as exc:  # pragma: no cover - the fipa extra is not installed
        raise ConversionError(f"reading a JID needs slixmpp: pip install 'cbcl[fipa]' "
                              f"({exc})") from None
    except ValueError as exc:  # slixmpp's InvalidJID
        raise ConversionError(f"{peer_text(text)} is not a JID: {exc}") from None


def uri_to_jid(uri: URI | str) -> str:
    """The JID of an ``xmpp://JID`` URI. Raises :class:`ConversionError` for another
    URI."""
    text = str(uri)
    if not text.startswith(XMPP_SCHEME) or len(text) == len(XMPP_SCHEME):
        raise ConversionError(f"{text} is not an xmpp:// URI: give the JID (to=/sender=)")
    return text[len(XMPP_SCHEME):]


def jid_to_uri(jid: object) -> URI:
    """The ``xmpp://JID`` URI of a JID (its bare form: ``a@host``, without a resource).
    Raises :class:`ConversionError` for no JID or one that makes no URI."""
    bare = _bare_jid(jid)
    try:
        return URI(XMPP_SCHEME + bare)
    except (TypeError, ValueError) as exc:
        raise ConversionError(f"JID {peer_text(bare)} makes no CBCL URI: {exc}") from None


def spade_sender_names(jid: object, jid_names: JidNames | None = None) -> tuple[str, ...]:
    """The names (agent URIs, or patterns ``PREFIX/*``) the bare JID of ``jid`` may speak
    as under ``jid_names`` (:data:`JidNames`; default ``xmpp://<bare JID>``). Raises
    :class:`ConversionError` for no JID, ``ValueError`` for a policy that gives something
    other than names."""
    bare = _bare_jid(jid)
    if not bare:
        raise ConversionError("no JID: the stanza has no sender")
    if jid_names is not None:
        found = jid_names(bare) if callable(jid_names) else jid_names.get(bare)
        if found is not None:
            names = (found,) if isinstance(found, str) else tuple(found)
            for name in names:
                problem = "not a str" if not isinstance(name, str) \
                    else name_pattern_problem(name)
                if problem is not None:
                    raise ValueError(f"jid_names gives {bare} the name {name!r}: {problem}")
            return names
    return (str(jid_to_uri(bare)),)


def check_spade_sender(message: Message, jid: object, *,
                       jid_names: JidNames | None = None) -> None:
    """Check that ``message.sender`` is a name the XMPP sender ``jid`` (the stanza's
    ``from``; its bare JID counts) may speak as (:func:`spade_sender_names`). Raises
    :class:`SenderMismatchError` — logged on this module's logger — when it is not, or
    when there is no JID."""
    claimed = str(message.sender)
    bare = _bare_jid(jid)
    allowed = spade_sender_names(bare, jid_names) if bare else ()
    if bare and any(name_matches(pattern, claimed) for pattern in allowed):
        return
    if bare:
        why = (f"sender {peer_text(claimed)} is not a name the XMPP sender "
               f"{peer_text(bare)} may speak as ("
               + (", ".join(peer_text(name) for name in allowed) or "none") + ")")
    else:
        why = f"sender {peer_text(claimed)}: the stanza has no XMPP sender to check it by"
    _log.warning("spade: refused message %s: %s", peer_text(message.message_id, 64), why)
    raise SenderMismatchError(f"message {peer_text(message.message_id, 64)}: {why}",
                              jid=bare, claimed=claimed, allowed=allowed)


def _jid_name(jid: object, jid_names: JidNames | None) -> URI:
    """The agent name of a JID in foreign content: the first of its names that is no
    pattern, else ``xmpp://<bare JID>``."""
    if jid_names is not None and _bare_jid(jid):
        for name in spade_sender_names(jid, jid_names):
            if not name.endswith(WILDCARD_SEGMENT):
                return URI(name)
    return jid_to_uri(jid)


def _text(value: Expr | None) -> str | None:
    if value is None:
        return None
    if isinstance(value, tuple):  # pragma: no cover - the mapping writes no list here
        raise ConversionError("a list expression has no place in SPADE metadata")
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _is_mapped_key(key: str) -> bool:
    lowered = key.lower()
    return lowered in _MAPPED_KEYS or lowered.startswith(_X_CBCL)


def message_to_spade(message: Message, *, to: str | None = None,
                     sender: str | None = None, reply_to: Any = None) -> Any:
    """The SPADE ``Message`` that carries ``message``: the canonical CBCL text as body, the
    FIPA parameters as metadata, the conversation id as thread. ``to`` and ``sender`` (JIDs)
    default to the message's receiver and sender when they are ``xmpp://`` URIs.

    ``reply_to`` (a SPADE message this one answers) makes it as SPADE's ``make_reply``
    does: to the JID the request came from (not the body's receiver), from the JID it
    went to, the request's thread when the message has no conversation id, and the
    request's metadata kept where the mapping writes nothing of its own (so a SPADE
    template waiting for the reply still matches). Raises :class:`ConversionError` when a
    JID is missing or invalid."""
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
    thread: str | None = message.conversation_id
    to_jid: Any = to
    sender_jid: Any = sender
    try:
        if reply_to is not None:
            base = reply_to.make_reply()
            kept = {key: value for key, value in dict(base._metadata).items()
                    if not _is_mapped_key(key)}
            metadata = {**kept, **metadata}
            to_jid = to if to is not None else base.to
            sender_jid = sender if sender is not None else base.sender
            thread = thread if thread is not None else base.thread
            if not _bare_jid(to_jid):
                raise ConversionError("the message replied to has no sender JID to answer")
        return spade_message(to=to_jid if to_jid is not None else uri_to_jid(message.receiver),
                             sender=sender_jid if sender_jid is not None
                             else uri_to_jid(message.sender),
                             body=message.canonical(), thread=thread, metadata=metadata)
    except CBCLError:
        raise
    except Exception as exc:  # slixmpp's InvalidJID, spade's TypeError, not a SPADE message
        raise ConversionError(f"SPADE refused the message: {type(exc).__name__}: {exc}"
                              ) from None


def spade_to_message(spade_message: Any, *, lossy: bool = False,
                     limits: Limits = DEFAULT_LIMITS, jid_names: JidNames | None = None,
                     trust: TrustStore | None = None, require_signature: bool = False
                     ) -> tuple[Message, list[str]]:
    """The CBCL message a SPADE ``Message`` carries, and what was lost (module docstring),
    once its sender is checked: the body's ``sender`` must be a name the stanza's XMPP
    sender may speak as (:func:`check_spade_sender`, with ``jid_names``), and, given a
    ``trust`` store, a signed message's key must be bound to it (:func:`spade_identity`;
    ``require_signature`` refuses an unsigned one).

    Raises :class:`SenderMismatchError` for a sender the JID may not use,
    :class:`cbcl.TrustError` for a signature the store does not accept,
    :class:`cbcl.MalformedError`/:class:`cbcl.LimitError` for a CBCL body that does not
    read, :class:`ConversionError` when the metadata's performative contradicts the body's
    intent or no CBCL message can be made, :class:`LossyConversionError` for foreign
    content that would lose something when ``lossy`` is false; ``ValueError`` for
    ``require_signature`` without ``trust``. Refusals of the sender are logged."""
    if require_signature and trust is None:
        raise ValueError("require_signature needs a trust store (trust=)")
    try:
        body = spade_message.body
        # SPADE 4 keeps metadata in a slot with no public accessor for the whole mapping
        metadata = dict(getattr(spade_message, "metadata", None)
                        or getattr(spade_message, "_metadata", None) or {})
        sender, to, thread = spade_message.sender, spade_message.to, spade_message.thread
    except AttributeError as exc:
        raise ConversionError(f"not a SPADE message: {exc}") from None
    text = "" if body is None else str(body)
    losses: list[str] = []
    if text.lstrip().startswith("(CBCL/1.0"):
        message = _cbcl_body(text, metadata, limits)
    else:
        message, losses = _foreign_body(text, metadata, sender, to, thread, lossy=lossy,
                                        limits=limits, jid_names=jid_names)
    check_spade_sender(message, sender, jid_names=jid_names)
    if trust is not None:
        spade_identity(message, trust=trust, require_signature=require_signature)
    return message, losses


def _cbcl_body(text: str, metadata: dict[str, str], limits: Limits) -> Message:
    """The message of a CBCL body, its performative checked against the metadata's —
    unless they are a ``make_reply`` copy: their ``reply-with`` names the message this
    body answers (its ``in-reply-to``), not this one."""
    message = parse_envelope(decode(text, limits), limits)
    said = metadata.get("performative")
    described = metadata.get("reply-with")
    copied = described is not None and described != message.message_id \
        and described == message.in_reply_to
    if said is not None and not copied:
        expected = message_to_fipa_message(message, lossy=True)[0].performative
        if said.lower() != expected:
            raise ConversionError(f"metadata performative {peer_text(said)} contradicts the "
                                  f"CBCL body's intent {message.intent} ({expected})")
    return message


def _foreign_body(text: str, metadata: dict[str, str], sender: Any, to: Any, thread: Any,
                  *, lossy: bool, limits: Limits, jid_names: JidNames | None
                  ) -> tuple[Message, list[str]]:
    """The message of a body that is not CBCL text: a FIPA message of the metadata, with
    the body as content. Under a ``language CBCL/1.0`` copied by ``make_reply`` the
    answered message's fields are set aside, each a loss."""
    copied = (metadata.get("language") or "").strip().lower() == CBCL_LANGUAGE.lower()
    losses: list[str] = _set_aside_copies(metadata) if copied else []
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
        performative, sender=AgentId(str(_jid_name(sender, jid_names))),
        receivers=(AgentId(str(_jid_name(to, jid_names))),), content=text or None,
        protocol=metadata.get("protocol") or None,
        reply_by=DateTime(reply_by) if reply_by else None, params=tuple(params),
        **cast("dict[str, Any]", words))
    if fipa.reply_by is not None and not _is_fipa_datetime(fipa.reply_by):
        # SPADE's own builder writes ISO 8601 (2026-01-01T12:00:00), not a FIPA date-time
        fipa = FipaMessage(**{**_fields(fipa), "reply_by": None,
                              "params": (*fipa.params, ("X-reply-by", Word(reply_by or "")))})
    message, fipa_losses = fipa_to_message(fipa, lossy=True, limits=limits)
    losses += fipa_losses
    if losses and not lossy:
        raise LossyConversionError(losses, what="conversion from SPADE")
    return message, losses


def _set_aside_copies(metadata: dict[str, str]) -> list[str]:
    """Take out of ``metadata`` what ``make_reply`` copied from a CBCL message into a reply
    whose body is not CBCL text, and say so: ``language``; ``reply-with`` (the answered
    message's id: it becomes ``in-reply-to``), its ``in-reply-to``, ``reply-by`` and
    ``X-CBCL-…`` fields. Its ``ontology``, the conversation's CBCL protocol, is kept as the
    reply's protocol (``X-CBCL-protocol``)."""
    losses = [f"language {CBCL_LANGUAGE}: copied by make_reply from the message this one "
              "answers; the body is not a CBCL message and is read as text"]
    del metadata["language"]
    answered = metadata.pop("reply-with", None)
    earlier = metadata.pop("in-reply-to", None)
    if answered:
        metadata["in-reply-to"] = answered
        losses.append(f"reply-with {peer_text(answered)}: the answered message's id, copied "
                      "by make_reply: read as in-reply-to")
        if earlier and earlier != answered:
            losses.append(f"in-reply-to {peer_text(earlier)}: the answered message's, "
                          "copied by make_reply")
    elif earlier:
        metadata["in-reply-to"] = earlier
    copied_deadline = metadata.pop("reply-by", None)
    if copied_deadline:
        losses.append(f"reply-by {peer_text(copied_deadline)}: the answered message's "
                      "deadline, copied by make_reply")
    for key in [key for key in metadata if key.lower().startswith(_X_CBCL)
                and key.lower() != _X_CBCL + "protocol"]:
        losses.append(f"{peer_text(key)} {peer_text(metadata.pop(key))}: the answered "
                      "message's, copied by make_reply")
    ontology = metadata.pop("ontology", None)
    if ontology:
        try:
            protocol = Symbol(ontology)
        except (TypeError, ValueError):
            losses.append(f"ontology {peer_text(ontology)}: copied by make_reply, and not "
                          "a CBCL protocol name")
        else:
            if _cbcl_protocol(metadata.get("protocol") or None)[0] != protocol:
                metadata["X-CBCL-protocol"] = str(protocol)
    return losses


def spade_identity(message: Message, *, trust: TrustStore, require_signature: bool = False,
                   jid: object = None, jid_names: JidNames | None = None
                   ) -> Identity | None:
    """Who sent ``message`` (as :func:`spade_to_message` read it), as far as ``trust``
    proves it: the :class:`~cbcl.trust.Identity` of the key whose signature it carries,
    which the trust policy lets speak as its ``sender`` (spec/trust.md §4.1); ``None`` for
    an unsigned message unless ``require_signature``. With ``jid`` (the stanza's XMPP
    sender), the sender is first checked against it (:func:`check_spade_sender`): both
    must hold.

    Raises :class:`SenderMismatchError` for a sender ``jid`` may not use;
    :class:`cbcl.TrustError` (``untrusted-signer`` or ``bad-signature`` on the wire) for a
    bad or unknown signature, a key not bound to the sender, or a missing signature that
    is required. Refusals are logged."""
    if jid is not None:
        check_spade_sender(message, jid, jid_names=jid_names)
    if message.signature is None and not require_signature:
        return None
    try:
        return trust.verify_identity(message)
    except TrustError as exc:
        _log.warning("spade: refused message %s from %s: %s",
                     peer_text(message.message_id, 64), peer_text(message.sender),
                     peer_text(exc.one_line(), 240))
        raise


def _is_fipa_datetime(text: str) -> bool:

    return re.fullmatch(r"[+-]?[0-9]{8}[Tt][0-9]{9}[A-Za-z]?", text) is not None


def _fields(fipa: FipaMessage) -> dict[str, Any]:
    return {name: getattr(fipa, name) for name in FipaMessage.__dataclass_fields__}
