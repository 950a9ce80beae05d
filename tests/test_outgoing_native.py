"""The outgoing check in C (``cbcl._native.check_outgoing``, cbcl/_native_src/outgoing.c)
and the validated encode that runs it in the encoder's C entry, against the Python
reference (:func:`cbcl.protocol._api.check_outgoing_python`, and ``Encoder.encode``'s
Python method with the C tier off): on every message, of every shipped protocol and
hostile ones, both give the same frame or the same error (class, message, position,
context, limit). The C tier only accepts; its refusals are the reference's.

Tests internals: the twins (``cbcl.protocol._api``) are private.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

import pytest
from cbcl_bench import PROTOCOLS, find_descriptors, load_registry, varied
from hypothesis import HealthCheck, given, settings, strategies as st
from strategies import messages, values

import cbcl
from cbcl import Encoder, Intent, Keyword, Limits, Message, Registry, Symbol
from cbcl.core._entries import fallback
from cbcl.core._errors import CBCLError
from cbcl.core._limits import DEFAULT_LIMITS
from cbcl.protocol import _api
from cbcl.session import NEED_DATA, HandshakeState, ProtocolMessage, Query, Session, _session

pytestmark = pytest.mark.skipif(_api._check_outgoing_c is None,
                                reason="cbcl._native is not built here")

SHIPPED = load_registry(find_descriptors())
CORPUS = [message for protocol in PROTOCOLS for size in ("small", "medium")
          for message in varied(protocol, size, 25, seed=11)]
ENCODE_PYTHON = fallback(Encoder.encode)

@contextmanager
def reference_only() -> Iterator[None]:
    """The C tier off: check_outgoing is its Python reference alone."""
    saved = _api._check_outgoing_c
    _api._check_outgoing_c = None
    try:
        yield
    finally:
        _api._check_outgoing_c = saved


def outcome(call: Callable[[], Any]) -> tuple[Any, ...]:
    try:
        return ("ok", call())
    except CBCLError as exc:
        return (type(exc), str(exc), exc.position, getattr(exc, "context", None),
                getattr(exc, "limit", None), getattr(exc, "maximum", None),
                exc.hint())
    except (TypeError, ValueError) as exc:
        return (type(exc), str(exc))


def agree(message: Message, registry: Registry = SHIPPED,
          limits: Limits | None = None) -> tuple[Any, ...]:
    """Native and reference give the same frame or error, for the Encoder and for
    check_outgoing; returns the Encoder's outcome."""
    encoder = Encoder(registry, limits=limits)
    native = outcome(lambda: encoder.encode(message))
    protocol = registry.get(message.protocol)
    checked = None if protocol is None else outcome(
        lambda: _api.check_outgoing(protocol, message, encoder.limits))
    validated = outcome(lambda: cbcl.validate(message, registry=registry, limits=limits))
    with reference_only():
        reference = outcome(lambda: ENCODE_PYTHON(Encoder(registry, limits=limits), message))
        expected = None if protocol is None else outcome(
            lambda: _api.check_outgoing_python(protocol, message, encoder.limits))
        validated_reference = outcome(
            lambda: cbcl.validate(message, registry=registry, limits=limits))
    assert native == reference, message
    assert checked == expected, message
    assert validated == validated_reference, message
    return native


def test_shipped_corpus_agrees_and_is_accepted_in_c() -> None:
    for message in CORPUS:
        assert agree(message)[0] == "ok"
        protocol = SHIPPED.get(message.protocol)
        assert protocol is not None
        assert _api._check_outgoing_c(protocol, message, DEFAULT_LIMITS) is True


def test_validate_takes_the_c_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """cbcl.validate of a message whose protocol the registry holds is check_outgoing: the
    C tier decides the shipped corpus without the Python reference."""
    def refused(*args: Any) -> None:
        raise AssertionError("the Python reference ran")

    monkeypatch.setattr(_api, "check_outgoing_python", refused)
    for message in CORPUS[:20]:
        cbcl.validate(message, registry=SHIPPED)  # (raises if the reference ran)


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(CORPUS), values, st.sampled_from(list(Intent)))
def test_hostile_bodies_and_intents_agree(message: Message, body: Any,
                                          intent: Intent) -> None:
    """A shipped message with its body or intent replaced (a wrong intent, a body its
    grammar or schema refuses, one that is not a body at all)."""
    agree(dataclasses.replace(message, body=body))
    agree(dataclasses.replace(message, intent=intent))


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(messages, st.sampled_from(PROTOCOLS))
def test_generated_messages_agree(message: Message, protocol: str) -> None:
    agree(dataclasses.replace(message, protocol=Symbol(protocol[:-3] + "/v1")))


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(CORPUS), st.integers(1, 40), st.sampled_from(
    ("max_depth", "max_list_items", "max_nodes", "max_string_bytes", "max_name_chars",
     "max_message_bytes")))
def test_small_limits_agree(message: Message, bound: int, name: str) -> None:
    """Limits at and around what a message needs: refused or accepted alike."""
    base = {"max_depth": 3, "max_list_items": 12, "max_nodes": 40, "max_string_bytes": 4,
            "max_name_chars": 15, "max_message_bytes": 200}[name]
    agree(message, limits=Limits(**{name: base + bound * {"max_nodes": 10,
                                                          "max_message_bytes": 40}.get(name, 1)}))


def _request(body: Any) -> Message:
    return Message(message_id="m-1", sender=cbcl.URI("agent://a/b"),
                   receiver=cbcl.URI("agent://c/d"), intent=Intent.REQUEST,
                   protocol=Symbol("request/v1"), body=body)


def _action(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """A request whose action's :args hold ``values`` (as :k0 v0 :k1 v1 …)."""
    args = tuple(item for index, value in enumerate(values)
                 for item in (Keyword(f"k{index}"), value))
    return (Symbol("request"), Keyword("action"),
            (Symbol("action"), Keyword("name"), Symbol("go"), Keyword("args"), args))


def _nodes(message: Message) -> int:
    value: list[Any] = [message.to_value()]
    count = 0
    while value:
        item = value.pop()
        count += 1
        if type(item) is tuple:
            value.extend(item)
    return count


@pytest.mark.parametrize("name", ["max_string_bytes", "max_list_items", "max_nodes",
                                  "max_depth", "max_name_chars", "max_message_bytes"])
def test_each_limit_n_accepted_n_plus_1_refused(name: str) -> None:
    """At each limit the message needs exactly N: accepted (by C, without the reference,
    where the walk can tell: not max_message_bytes, which it bounds from above only) and
    with N - 1 refused, with the reference's error, through the native path."""
    args: tuple[Any, ...] = ("x" * 100,) if name == "max_string_bytes" else \
        tuple(range(15)) if name == "max_list_items" else \
        ((((1,),),),) if name == "max_depth" else \
        (Symbol("s" * 40),) if name == "max_name_chars" else tuple(range(20))
    message = _request(_action(args))
    needed = {"max_string_bytes": 100, "max_list_items": 30, "max_nodes": _nodes(message),
              "max_depth": 8, "max_name_chars": 40,
              "max_message_bytes": len(message.canonical().encode())}[name]
    at = Limits(**{name: needed})
    over = Limits(**{name: needed - 1})
    assert agree(message, limits=at)[0] == "ok"
    refused = agree(message, limits=over)
    assert refused[0] is cbcl.LimitError and refused[4] == name
    protocol = SHIPPED.get(message.protocol)
    assert protocol is not None
    assert _api._check_outgoing_c(protocol, message, over) is None  # the reference's
    if name not in ("max_message_bytes", "max_string_bytes"):  # (4 bytes a character)
        assert _api._check_outgoing_c(protocol, message, at) is True


def test_refusals_are_the_references() -> None:
    """A wrong intent, a body its grammar refuses, one its schema refuses, none: the
    reference's error each time (the C tier declines them all)."""
    good = _request(_action((1, "two", Decimal("3.5"))))
    assert agree(good)[0] == "ok"
    assert agree(dataclasses.replace(good, intent=Intent.CFP))[0] is cbcl.ProtocolError
    assert agree(dataclasses.replace(good, body=(Symbol("request"),)))[0] is cbcl.BodyError
    assert agree(dataclasses.replace(good, body=None))[0] is cbcl.BodyError
    assert agree(_request((Symbol("request"), Keyword("action"),
                           (Symbol("action"), Keyword("name"), "not-a-symbol"))))[0] \
        is not None


def test_constraints_run_after_the_c_walk() -> None:
    """canon-a/v1's rule query-needs-city: a QUERY without :city passes the grammar and
    the schema (the C walk accepts it) and is refused by the constraint check after it."""
    query = next(m for m in varied("canon-a-v1", "small", 30) if m.intent is Intent.QUERY)
    assert agree(query)[0] == "ok"
    body = query.body
    assert type(body) is tuple and Keyword("city") in body
    at = body.index(Keyword("city"))
    bad = dataclasses.replace(query, body=body[:at] + body[at + 2:])
    protocol = SHIPPED.get(query.protocol)
    assert protocol is not None and protocol.constraints is not None
    assert _api._check_outgoing_c(protocol, bad, DEFAULT_LIMITS) is True
    refused = agree(bad)
    assert refused[0] is cbcl.ConstraintError
    with pytest.raises(cbcl.ConstraintError):
        _api.check_outgoing(protocol, bad)


def test_trace_counts_toward_the_limits() -> None:
    """A (trace …) field's nodes are counted: at max_nodes exactly, with a trace, the
    message is accepted; one node less and it is refused (before, the walk left them out)."""
    message = dataclasses.replace(_request(_action((1, 2, 3))),
                                  trace="00-" + "1" * 32 + "-" + "2" * 16 + "-01")
    needed = _nodes(message)
    assert agree(message, limits=Limits(max_nodes=needed))[0] == "ok"
    assert agree(message, limits=Limits(max_nodes=needed - 1))[0] is cbcl.LimitError


# ----------------------------------------------------------------- a session's send

NOW = 1_764_500_000_000
CLIENT, SERVER = "agent://t/client", "agent://t/server"


def established(native: bool, limits: Limits | None) -> Session:
    """A client session, binary, ESTABLISHED at NOW with a server (request/v1)."""
    protocol = SHIPPED.get(Symbol("request/v1"))
    assert protocol is not None
    client = Session("initiator", registry=SHIPPED, me=CLIENT, peer=SERVER,
                     encodings=("binary",), nonce="a" * 32, limits=limits)
    server = Session("responder", registry=SHIPPED, me=SERVER, encodings=("binary",),
                     nonce="b" * 32, limits=limits)
    if not native:
        client._use_native = server._use_native = False
    pending = {server: client.send(Query(str(protocol.id), protocol.digest, (),
                                         ("binary",)), now=NOW), client: b""}
    while any(pending.values()):
        for to, other in ((server, client), (client, server)):
            if pending[to]:
                to.receive_data(pending[to])
                while to.next_event(now=NOW) is not NEED_DATA:
                    pass
            pending[to] = b""
            pending[other] += to.data_to_send()
    assert client.state is HandshakeState.ESTABLISHED
    assert (client._native is not None) is native
    return client


def sent(session: Session, message: Message) -> tuple[Any, ...]:
    try:
        return ("ok", session.send(ProtocolMessage(message), now=NOW))
    except CBCLError as exc:
        return (type(exc), str(exc), exc.position, getattr(exc, "limit", None))


def session_request(mid: str, body: Any) -> Message:
    return Message(message_id=mid, sender=cbcl.URI(CLIENT), receiver=cbcl.URI(SERVER),
                   intent=Intent.REQUEST, protocol=Symbol("request/v1"),
                   conversation_id=f"c-{mid}", body=body)


@pytest.mark.parametrize("limits", [None, Limits(max_list_items=12)])
def test_a_sessions_send_is_the_references(limits: Limits | None,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Native and reference sessions give the same bytes or the same error for good and
    refused REQUESTs; the native one checks a good one in its one native call (the
    Python check_outgoing is not called)."""
    native, reference = established(True, limits), established(False, limits)
    checks: list[Message] = []
    original = _api.check_outgoing

    def counted(protocol: Any, message: Message, limits: Limits = DEFAULT_LIMITS) -> None:
        checks.append(message)
        original(protocol, message, limits)

    monkeypatch.setattr(_session, "check_outgoing", counted)
    bodies: list[Any] = [_action(()), _action(tuple(range(12))), (Symbol("request"),),
                         (Symbol("agree"), Keyword("action-id"), "a"), "not a body", None]
    for index, body in enumerate(bodies):
        message = session_request(f"q-{index}", body)
        checks.clear()
        got = sent(native, message)
        if got[0] == "ok" and limits is None:
            assert checks == []  # (the one native call checked it)
        assert got == sent(reference, message), body
    assert any(sent(native, session_request("q-x", body))[0] != "ok" for body in bodies)
