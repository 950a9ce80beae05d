"""The shipped demo responder, as an :class:`~cbcl.Agent` handler.

``cbcl serve`` runs :func:`respond` unless ``--handler MODULE:CALLABLE`` names another:
a contract-net/v1 contractor that bids on every call for proposals and reports the work
done when awarded, and a request/v1 participant that does what it is asked.
"""

from __future__ import annotations

from decimal import Decimal

from .core._values import Keyword, Symbol, Value
from .net._agent import Context
from .protocol._message import Intent, Message

#: The contractor's bid and its report of the work: our values, never the peer's.
OUR_BID: tuple[Value, ...] = (Symbol("bid"), Keyword("price"), Decimal("12.50"),
                              Keyword("currency"), Symbol("EUR"), Keyword("eta"), 60000)
OUR_RESULT: tuple[Value, ...] = (Symbol("artifact"), Keyword("frames"), 2400,
                                 Keyword("bytes"), 734003200)


def _keyword_fields(value: Value | None) -> dict[str, Value]:
    """``(head :k v …)`` as ``{k: v}`` (keys that are keywords only); ``{}`` otherwise."""
    if type(value) is not tuple:
        return {}
    return {str(k): v for k, v in zip(value[1::2], value[2::2], strict=False)
            if type(k) is Keyword}


def _text_field(fields: dict[str, Value], name: str) -> str | None:
    """``fields[name]`` when it is a string value (not a symbol, keyword or URI)."""
    value = fields.get(name)
    return value if type(value) is str else None


def respond(message: Message, context: Context) -> Message | None:
    """The responder's side of the shipped conversations. ``None``: nothing to say.

    Replies are values (tuples of symbols, keywords, strings, integers, decimals), never
    text built from the peer's fields: the peer's task id (or message id) is copied in as
    one string value, so whatever it holds it cannot add fields or change our bid. A task id
    that is not a string gets no answer (the grammar of contract-net/v1 already refuses
    one). The replies are made as values of exact types (``Context._our_reply``: no
    constructor checks to repeat); the session checks each before it leaves."""
    body = message.body
    if str(message.protocol) == "contract-net/v1":
        fields = _keyword_fields(body)
        if message.intent is Intent.CFP:
            task_id = _text_field(_keyword_fields(fields.get("task")), "id")
            if task_id is None:
                return None
            return context._our_reply(Intent.PROPOSE, (
                Symbol("proposal"), Keyword("task-id"), task_id, Keyword("bid"), OUR_BID))
        if message.intent is Intent.ACCEPT:
            task_id = _text_field(fields, "task-id")
            if task_id is None:
                return None
            return context._our_reply(Intent.INFORM, (
                Symbol("inform-done"), Keyword("task-id"), task_id, Keyword("result"),
                OUR_RESULT))
    if str(message.protocol) == "request/v1" and message.intent is Intent.REQUEST:
        return context._our_reply(Intent.INFORM, (
            Symbol("inform-done"), Keyword("action-id"), message.message_id))
    return None


__all__ = ["OUR_BID", "OUR_RESULT", "respond"]
