"""Optional OpenTelemetry tracing of an agent's messages (the ``otel`` extra).

Theory of operation
-------------------
``opentelemetry-api`` is imported here, at the net layer's edge, and nowhere else; where
it is not installed :data:`otel` is ``None`` and every hook in :mod:`._agent` costs one
``is None`` check. Where it is installed, tracing is on once the application sets a tracer
provider (``opentelemetry.trace.set_tracer_provider``, as an SDK's setup does): until then
:func:`active_tracer` answers ``None`` and nothing else runs.

Three hooks, each a few lines in :mod:`._agent`:

* :func:`outgoing` — a message this agent sends (its own request, or a handler's reply)
  carries the current span's context in its ``(trace …)`` envelope field (spec/cbcl-1.0.md
  §2.2: a W3C ``traceparent``), unless it has one already or is already signed (the
  signature covers the field). No current span, no field: tracing never starts a trace.
* :func:`receiving` — a span ``receive INTENT`` (kind CONSUMER) around the handling of
  each message the link reads, whose parent is the context the message's ``trace`` names
  (a root span when it has none).
* :func:`handling` — a span ``handle INTENT`` (kind SERVER) around a handler's call and
  the sending of what it came to, a child of the same remote context; it is the current
  span while the handler runs (a thread handler too: it runs in a copy of the context),
  so the reply, and any message the handler sends, carries it.

Span attributes follow OpenTelemetry's messaging conventions. Everything in them that came
from the peer (ids, the protocol, the sender's URI, its address) is hostile: each is
escaped and bounded by :func:`cbcl.core._display.peer_text`, as in the log. The remote
context is read from the field, whose syntax pass 1 has checked strictly; a peer can make
the spans claim any parent, which is what propagation means (spec §2.2).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Iterator
from typing import Any, TypeVar

from ..core._display import peer_text
from ..protocol._message import Message, is_traceparent

try:  # the optional dependency (pip install 'cbcl[otel]')
    import opentelemetry.trace as otel
    from opentelemetry.context import Context
    from opentelemetry.trace import (
        NonRecordingSpan,
        SpanContext,
        SpanKind,
        TraceFlags,
        Tracer,
    )
except ImportError:  # not installed: every hook is one None check
    otel = None  # type: ignore[assignment]

_T = TypeVar("_T")

#: The instrumentation scope's name.
SCOPE = "cbcl"
#: The longest text of a peer's field a span attribute holds (escaped, then cut).
MAX_ATTRIBUTE_CHARS = 128

_cached: tuple[object, Any] | None = None  # (provider, its tracer)
_UNKNOWN = object()


def active_tracer() -> Tracer | None:
    """The tracer of the tracer provider the application set, or ``None`` (the API is
    not installed, or no provider was set: the API's default proxy or a no-op one)."""
    global _cached
    if otel is None:
        return None
    # The global set_tracer_provider sets, read as is: get_tracer_provider() costs ~1 µs a
    # call (it consults the environment while none is set), twice per message.
    provider: Any = getattr(otel, "_TRACER_PROVIDER", _UNKNOWN)
    if provider is None:  # none set: the API's proxy, tracing off
        return None
    if provider is _UNKNOWN:  # (an API that keeps it elsewhere)
        provider = otel.get_tracer_provider()
    cached = _cached
    if cached is not None and cached[0] is provider:
        tracer: Tracer | None = cached[1]
        return tracer
    if isinstance(provider, (otel.ProxyTracerProvider, otel.NoOpTracerProvider)):
        tracer = None
    else:
        tracer = provider.get_tracer(SCOPE)
    _cached = (provider, tracer)
    return tracer


def traceparent_of(context: Any = None) -> str | None:
    """The W3C ``traceparent`` of the current span (of ``context``'s, if given), or
    ``None`` when there is no valid span."""
    span_context = otel.get_current_span(context).get_span_context()
    if not span_context.is_valid:
        return None
    text = (f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-"
            f"{int(span_context.trace_flags) & 0xff:02x}")
    return text if is_traceparent(text) else None


def remote_context(trace: str | None) -> Any:
    """The OpenTelemetry context whose span is the remote one ``trace`` names (a
    ``(trace …)`` field's text, already checked by pass 1); for no trace an empty context,
    so the span is a root (not a child of whatever the task running it inherited)."""
    if trace is None or not is_traceparent(trace):
        return Context()
    span_context = SpanContext(trace_id=int(trace[3:35], 16), span_id=int(trace[36:52], 16),
                               is_remote=True, trace_flags=TraceFlags(int(trace[53:55], 16)))
    return otel.set_span_in_context(NonRecordingSpan(span_context))


def outgoing(message: Message) -> Message:
    """``message`` with the current span's context in its ``trace`` field
    (:func:`with_current_trace`) where tracing is on (:func:`active_tracer`), else
    ``message`` itself."""
    if otel is None or active_tracer() is None:
        return message
    return with_current_trace(message)


def with_current_trace(message: Message) -> Message:
    """``message`` with the current span's context in its ``trace`` field, or
    ``message`` itself (no valid current span, a trace already, a signed message, or a
    subclass: nothing is added behind its back)."""
    if message.trace is not None or message.signature is not None or \
            type(message) is not Message:
        return message
    trace = traceparent_of()
    if trace is None:
        return message
    return Message._trusted(message.message_id, message.sender, message.receiver,
                            message.intent, message.protocol, message.conversation_id,
                            message.in_reply_to, message.reply_by, message.timestamp,
                            message.body, None, trace)


def _attributes(message: Message, peer: str, operation: str) -> dict[str, str]:
    """The span's attributes, every peer field escaped and bounded."""
    attributes = {
        "messaging.system": "cbcl",
        "messaging.operation.type": operation,
        "messaging.message.id": peer_text(message.message_id, MAX_ATTRIBUTE_CHARS),
        "cbcl.protocol": peer_text(str(message.protocol), MAX_ATTRIBUTE_CHARS),
        "cbcl.intent": message.intent.value,
        "cbcl.sender": peer_text(str(message.sender), MAX_ATTRIBUTE_CHARS),
        "network.peer.address": peer_text(peer, MAX_ATTRIBUTE_CHARS),
    }
    if message.conversation_id is not None:
        attributes["messaging.message.conversation_id"] = peer_text(
            message.conversation_id, MAX_ATTRIBUTE_CHARS)
    return attributes


@contextlib.contextmanager
def _span(tracer: Tracer, name: str, kind: Any, message: Message, peer: str,
          operation: str) -> Iterator[None]:
    with tracer.start_as_current_span(name, context=remote_context(message.trace), kind=kind,
                                      attributes=_attributes(message, peer, operation),
                                      record_exception=False, set_status_on_exception=False):
        yield


async def receiving(tracer: Tracer, work: Awaitable[_T], message: Message, peer: str) -> _T:
    """Await ``work`` (the link's handling of ``message``, from the address ``peer``)
    inside a ``receive`` span."""
    with _span(tracer, f"receive {message.intent.value}", SpanKind.CONSUMER, message, peer,
               "receive"):
        return await work


async def handling(tracer: Tracer, work: Awaitable[_T], message: Message, peer: str) -> _T:
    """Await ``work`` (a handler's call for ``message``, from the address ``peer``, and
    its answer) inside a ``handle`` span, current while it runs."""
    with _span(tracer, f"handle {message.intent.value}", SpanKind.SERVER, message, peer,
               "process"):
        return await work


__all__ = ["MAX_ATTRIBUTE_CHARS", "SCOPE", "active_tracer", "handling", "otel", "outgoing",
           "receiving", "remote_context", "traceparent_of", "with_current_trace"]
