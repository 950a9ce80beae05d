"""Both passes over a document value in one C call (``cbcl._native.accept_document``)
against its Python twin (``cbcl.protocol._api.accept_document_python``: pass 1's walk, the
registry, ``check_intent_and_body``), and :func:`cbcl.parse`'s fast path that runs it.

The twin is the reference: on every value the C call gives the same message or ``None``,
and it declines (``None``) a message the twin accepts only where its docstring says so.

Tests internals: the twins (``cbcl.protocol._api``) are private.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from cbcl_bench import PROTOCOLS, find_descriptors, load_registry, varied
from hypothesis import given, settings, strategies as st
from strategies import values

import cbcl
from cbcl import Intent, Keyword, Message, Registry, Symbol
from cbcl.protocol import _api
from cbcl.protocol._pass2 import _ALWAYS_ADMITTED

pytestmark = pytest.mark.skipif(_api._accept_document_c is None,
                                reason="cbcl._native or cbcl._native is not built here")

SHIPPED = load_registry(find_descriptors())
CORPUS = [message for protocol in PROTOCOLS for size in ("small", "medium")
          for message in varied(protocol, size, 40, seed=7)]

# A protocol whose schema has two records under one head (the C lookup tries them in
# order), one under another, and an intent of its own start rule.
QUERY_GRAMMAR = """\
body: query | task
query: "(" "query" SYMBOL (KEYWORD STRING)* ")"
task: "(" "task" (KEYWORD INTEGER)* ")"
"""
QUERY_SCHEMA = ("(schema (record query weather (:city (string :max-length 3) required)) "
                "(record query time (:zone string required) (:fine boolean)) "
                "(record task (:cpu (integer :max 64) required)))")


def query_registry() -> Registry:
    registry = Registry(disk_cache=False, isolate=False)
    registry.load((f"(protocol-descriptor (id query/v1) (version 1) "
                   f"(intents REQUEST INFORM) (grammar {cbcl.canonical(QUERY_GRAMMAR)}) "
                   f"{QUERY_SCHEMA})").encode(), allow_unsigned=True)
    return registry


QUERY = query_registry()


def c_accept(value: Any, registry: Registry) -> Message | None:
    found: Message | None = _api._accept_document_c(value, _api._DOCUMENT_TABLES,
                                                    registry._protocols)
    return found


def declined_by_design(message: Message, registry: Registry) -> bool:
    """The twin's acceptances the C call leaves to the careful path."""
    protocol = registry.get(message.protocol)
    return protocol is not None and message.intent not in protocol.governed and \
        message.intent in _ALWAYS_ADMITTED


def agree(value: Any, registry: Registry) -> Message | None:
    expected = _api.accept_document_python(value, registry)
    found = c_accept(value, registry)
    if expected is not None and declined_by_design(expected, registry):
        assert found is None
        return None
    assert found == expected, value
    if found is not None:
        for field in dataclasses.fields(Message):
            assert type(getattr(found, field.name)) is type(getattr(expected, field.name))
    return found


def document(message: Message) -> Any:
    return cbcl.read(message.canonical())


def test_every_corpus_message_is_accepted_in_c() -> None:
    for message in CORPUS:
        assert agree(document(message), SHIPPED) == message


def test_parse_takes_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    def careful(*args: Any) -> None:
        raise AssertionError("the careful path ran")

    monkeypatch.setattr(_api, "parse_envelope", careful)
    for message in CORPUS[:20]:
        text = message.canonical().encode()
        assert cbcl.parse(text, registry=SHIPPED) == message
        assert cbcl.parse(text + b"  ; trailing comment\n", registry=SHIPPED) == message
    # str, envelope_only and no registry take the careful path
    with pytest.raises(AssertionError, match="careful"):
        cbcl.parse(CORPUS[0].canonical(), registry=SHIPPED)
    with pytest.raises(AssertionError, match="careful"):
        cbcl.parse(CORPUS[0].canonical().encode(), registry=SHIPPED, envelope_only=True)


def _mutated(value: Any, data: st.DataObject) -> Any:
    """``value`` with one node somewhere replaced, dropped, duplicated or swapped."""
    if type(value) is not tuple or not value or data.draw(st.integers(0, 4)) == 0:
        return data.draw(st.one_of(values, st.sampled_from(
            [Symbol("bid"), Keyword("price"), Symbol("task"), 0, -1, 10**6, "", "x" * 300])))
    items = list(value)
    index = data.draw(st.integers(0, len(items) - 1))
    op = data.draw(st.sampled_from(["deeper", "drop", "dup", "swap"]))
    if op == "deeper":
        items[index] = _mutated(items[index], data)
    elif op == "drop":
        del items[index]
    elif op == "dup":
        items.insert(index, items[index])
    else:
        other = data.draw(st.integers(0, len(items) - 1))
        items[index], items[other] = items[other], items[index]
    return tuple(items)


def _with(message: Message, **changes: Any) -> Any:
    value = document(message)
    return document(dataclasses.replace(message, **changes)) if changes else value


@settings(max_examples=400, deadline=None)
@given(index=st.integers(0, len(CORPUS) - 1), data=st.data())
def test_broken_bodies_agree(index: int, data: st.DataObject) -> None:
    message = CORPUS[index]
    body = _mutated(message.body, data)
    agree(_with(message, body=body), SHIPPED)


@settings(max_examples=200, deadline=None)
@given(index=st.integers(0, len(CORPUS) - 1), intent=st.sampled_from(list(Intent)),
       body=st.none() | st.just("a reason") | values)
def test_every_intent_agrees(index: int, intent: Intent, body: Any) -> None:
    message = CORPUS[index]
    agree(_with(message, intent=intent), SHIPPED)
    agree(_with(message, intent=intent, body=body), SHIPPED)


def test_ungoverned_reasons_are_left_to_the_careful_path() -> None:
    message = dataclasses.replace(CORPUS[0], intent=Intent.NOT_UNDERSTOOD, body="why")
    assert message.intent not in SHIPPED.get(message.protocol).governed  # type: ignore[union-attr]
    assert c_accept(document(message), SHIPPED) is None
    assert _api.accept_document_python(document(message), SHIPPED) == message
    assert cbcl.parse(message.canonical().encode(), registry=SHIPPED) == message


def test_unknown_protocols_and_non_envelopes_decline() -> None:
    message = dataclasses.replace(CORPUS[0], protocol=Symbol("nobody/v9"))
    assert c_accept(document(message), SHIPPED) is None
    for value in (None, (), (Symbol("CBCL/1.0"),), "text", document(CORPUS[0])[:-1]):
        agree(value, SHIPPED)


QUERY_BODIES = st.tuples(
    st.sampled_from([Symbol("query"), Symbol("task"), Symbol("other"), "query"]),
    st.lists(st.one_of(st.sampled_from([Symbol("weather"), Symbol("time"), Symbol("x")]),
                       st.sampled_from([Keyword("city"), Keyword("zone"), Keyword("cpu"),
                                        Keyword("fine")]),
                       st.sampled_from(["", "abc", "abcd", 1, 64, 65, Symbol("true")])),
             max_size=6),
).map(lambda parts: (parts[0], *parts[1]))


def _query(body: Any, intent: Intent = Intent.REQUEST) -> Any:
    return document(Message(message_id="q-1", sender=cbcl.URI("agent://a"),
                            receiver=cbcl.URI("agent://b"), intent=intent,
                            protocol=Symbol("query/v1"), body=body))


@settings(max_examples=500, deadline=None)
@given(body=QUERY_BODIES, intent=st.sampled_from([Intent.REQUEST, Intent.INFORM]))
def test_records_sharing_a_head_agree(body: Any, intent: Intent) -> None:
    agree(_query(body, intent), QUERY)


@pytest.mark.parametrize(("body", "accepted"), [
    ((Symbol("query"), Symbol("weather"), Keyword("city"), "abc"), True),
    ((Symbol("query"), Symbol("weather"), Keyword("city"), "abcd"), False),  # too long
    ((Symbol("query"), Symbol("time"), Keyword("zone"), "abcd"), True),  # the 2nd record
    ((Symbol("query"), Symbol("time"), Keyword("city"), "abc"), False),  # :zone missing
    ((Symbol("query"), Symbol("other"), Keyword("city"), "abcd"), True),  # no record
    ((Symbol("task"), Keyword("cpu"), 64), True),
    ((Symbol("task"), Keyword("cpu"), 65), False),
])
def test_the_c_lookup_finds_each_record(body: Any, accepted: bool) -> None:
    found = agree(_query(body), QUERY)
    assert (found is not None) is accepted


def test_a_flushed_automaton_starts_from_its_new_root() -> None:
    registry = query_registry()
    protocol = registry.get("query/v1")
    assert protocol is not None
    good = _query((Symbol("task"), Keyword("cpu"), 1))
    assert c_accept(good, registry) is not None
    old = protocol.recogniser.start  # (the acceptance walks' automaton)
    protocol.recogniser.start = protocol.recogniser._root()  # as a flush leaves it
    assert protocol.recogniser.start is not old
    assert c_accept(good, registry) is not None
    assert c_accept(_query((Symbol("task"), Keyword("cpu"), 65)), registry) is None


def test_misshapen_tables_raise_type_error() -> None:
    value = document(CORPUS[0])
    with pytest.raises(TypeError):
        _api._accept_document_c(value, _api._DOCUMENT_TABLES[:-1], SHIPPED._protocols)
    with pytest.raises(TypeError):
        _api._accept_document_c(value, _api._DOCUMENT_TABLES, list(SHIPPED._protocols))
    with pytest.raises(TypeError):
        _api._accept_document_c(value, _api._DOCUMENT_TABLES)


@settings(max_examples=300, deadline=None)
@given(index=st.integers(0, len(CORPUS) - 1), data=st.data())
def test_parse_outcomes_do_not_depend_on_the_fast_path(index: int,
                                                       data: st.DataObject) -> None:
    text = bytearray(CORPUS[index].canonical().encode())
    for _ in range(data.draw(st.integers(0, 3))):
        at = data.draw(st.integers(0, len(text)))
        text[at:at] = data.draw(st.sampled_from([b" ", b")", b"(", b'"', b"x", b":k 1",
                                                 b"\xff", b"; c\n", b"99999999999999999999"]))

    def outcome() -> Any:
        try:
            return cbcl.parse(bytes(text), registry=SHIPPED)
        except cbcl.CBCLError as error:
            return type(error), str(error)

    fast = outcome()
    saved = _api._accept_document_c
    _api._accept_document_c = None
    try:
        assert outcome() == fast
    finally:
        _api._accept_document_c = saved
