"""A refused body costs about what an accepted one does (issue 36, item 2).

The explanation of a refusal (:func:`cbcl.protocol._pass2.explain_body`) no longer re-scans
the body token by token: it finds the refused token in the body's value (by probes of the
native walk, or one Python step a token up to it) and steps over the elements before it in
the text. These tests hold it to the full re-scan it replaced (kept here as the
reference, :func:`rescan`): the same error — message, position, context, expected items and
hint — for mutated bodies of every shipped grammar, in canonical, spaced and commented
text; the native search to the Python one; and the work it does, counted
(:class:`RefusalWork`), to a bound set by the refusal's place, not the body's size.
Speed itself is measured by ``benchmarks/refusal_cost.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
from hypothesis import event, given, settings, strategies as st
from strategies import mutate_tokens
from test_protocol import DESCRIPTORS, SHIPPED, generator
from test_session import NOW, SessionPair, cfp, initiator, query, responder as session_responder

import cbcl
from cbcl import BodyError, CBCLError, Limits, Registry, RemoteProtocolError, Session
from cbcl.binary import frame
from cbcl.core._limits import DEFAULT_LIMITS
from cbcl.core._reader import (
    BAD,
    EOF,
    LPAR,
    RPAR,
    TOKEN,
    context_of,
    diagnose,
    position_of,
    read_value_at,
    token_start,
)
from cbcl.core._values import ATOM_TERMINALS
from cbcl.grammar._kernel import REFUSED as REFUSED_BY_GRAMMAR, body_refusal, feed, terminal_of
from cbcl.net._transport import Connection, serve
from cbcl.protocol import _api, _pass2
from cbcl.protocol._envelope import scan_envelope
from cbcl.protocol._hints import UNREAD, body_hint
from cbcl.protocol._message import Intent
from cbcl.protocol._pass2 import (
    CLOSE,
    END,
    ITEM,
    RefusalWork,
    check_intent_and_body,
    explain_body,
    find_refusal_python,
    start_node,
    start_stack,
)
from cbcl.protocol._protocol import Protocol
from cbcl.session import HandshakeState, ProtocolMessage, Query
from cbcl.session._session import RefusalBudget

ALL = [*SHIPPED, "cbcl-negotiation-v1"]
NATIVE = _pass2._recognise_c is not None


# --------------------------------------------------------------------------- the reference


def rescan(protocol: Protocol, text: str, body_at: int, limits: Limits,
           intent: Intent | None) -> NoReturn:
    """The explanation as it was (cbcl/protocol/_pass2.py before issue 36): re-scan the
    body from character ``body_at`` token by token, feeding the kernel, and raise the
    :class:`BodyError` at the first token refused."""
    tables = protocol.tables
    stack = start_stack(protocol, intent)
    marks: dict[int, int] = {}
    shown_intent = None if intent is None else intent.value
    assert stack
    pos = body_at
    depth = 0
    started = False
    heads: list[object] = []
    while True:
        value: object = None
        if started and depth == 0:
            terminal, start = "$END", pos
        else:
            m = TOKEN.match(text, pos)
            assert m is not None
            kind = m.lastindex
            assert kind is not None
            start = token_start(m)
            if kind == LPAR:
                terminal, depth, pos = "LPAR", depth + 1, m.end()
            elif kind == RPAR:
                terminal, depth, pos = "RPAR", depth - 1, m.end()
            elif kind == EOF:
                terminal = "$END"
            elif kind == BAD:
                diagnose(text, start)
            else:
                value, pos, _ = read_value_at(text, pos, limits, 0, 0)
                terminal = ATOM_TERMINALS[type(value)]
                if terminal in ("SYMBOL", "KEYWORD"):
                    terminal = terminal_of(tables, stack, protocol.atoms.get(value),
                                           terminal)
        started = True
        if feed(tables, stack, terminal, marks=marks) == REFUSED_BY_GRAMMAR:
            message, expected = body_refusal(protocol, stack, terminal, value, marks,
                                             shown_intent)
            error = BodyError(message, position=position_of(text, start),
                              context=context_of(text, start), expected=expected)
            at_head = bool(heads) and heads[-1] is UNREAD and \
                terminal not in ("LPAR", "RPAR", "$END")
            error.hint_material = body_hint(protocol, stack, terminal, value, marks,
                                            shown_intent, heads, at_head)
            raise error
        if heads and heads[-1] is UNREAD:
            heads[-1] = value
        if terminal == "LPAR":
            heads.append(UNREAD)
        elif terminal == "RPAR":
            heads.pop()
        assert terminal != "$END", "the re-scan found no error"


def seen(error: CBCLError) -> tuple[object, ...]:
    """Everything a caller sees of a refusal."""
    return (type(error), error.message, error.line, error.column, error.offset,
            error.context, getattr(error, "expected", None), error.hint())


def outcome(call: Any) -> object:
    try:
        return call()
    except CBCLError as error:
        return seen(error)


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Registry:
    reg = Registry(cache_dir=tmp_path_factory.mktemp("cache"))
    for name in ALL:
        reg.load((DESCRIPTORS / f"{name}.cbcl").read_bytes(), allow_unsigned=True)
    return reg


def old_parse(registry: Registry, text: str) -> object:
    """:func:`cbcl.parse`'s outcome with the re-scan explaining a body refusal."""
    try:
        message = cbcl.parse(text, envelope_only=True)
        protocol = registry.get(message.protocol)
        assert protocol is not None
        if check_intent_and_body(protocol, message) is False:
            rescan(protocol, text, scan_envelope(text, DEFAULT_LIMITS).body_at,
                   DEFAULT_LIMITS, message.intent)
        if protocol.constraints is not None:  # (then the protocol's stateless rules)
            protocol.constraints.check(message)
    except CBCLError as error:
        return seen(error)
    return message


@contextlib.contextmanager
def python_tiers() -> Iterator[None]:
    """Parse as where ``cbcl._native`` is not built: pass 2 walks in Python, and so do
    the search for the refused token and the stepping over the text to it; the document
    is not accepted in C."""
    saved = _pass2._recognise_c, _pass2._text_index_c, _api._accept_document_c
    _pass2._recognise_c = _pass2._text_index_c = _api._accept_document_c = None
    try:
        yield
    finally:
        _pass2._recognise_c, _pass2._text_index_c, _api._accept_document_c = saved


@contextlib.contextmanager
def searched_natively() -> Iterator[None]:
    """Explain every refusal by the native search, short texts too (where it is built)."""
    saved = _pass2._SMALL_TEXT
    _pass2._SMALL_TEXT = 0
    try:
        yield
    finally:
        _pass2._SMALL_TEXT = saved


def layouts(text: str, data: st.DataObject) -> list[str]:
    """``text`` (tokens one space apart), its canonical form when it is a message, and a
    copy with drawn whitespace and comments between the tokens."""
    out = [text]
    with contextlib.suppress(CBCLError):
        out.append(cbcl.parse(text, envelope_only=True).canonical())
    separators = data.draw(st.lists(st.sampled_from([" ", "  ", "\n", "\t ", " ; note\n"]),
                                    min_size=1, max_size=4))
    pieces = text.split(" ")
    # (a space inside a string token would split it: such texts keep their spaces)
    if not any(piece.count('"') % 2 for piece in pieces):
        out.append("".join(piece + separators[i % len(separators)]
                           for i, piece in enumerate(pieces)))
    return out


def envelope(protocol: str, intent: str, body: str) -> str:
    return (f'(CBCL/1.0 (message-id "m") (sender agent://a) (receiver agent://b) '
            f"(intent {intent}) (protocol {protocol}) (timestamp 5) (body {body}))")


# --------------------------------------------------------------------------- the same errors


@pytest.mark.parametrize("name", ALL)
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_refusals_are_those_of_the_rescan(name: str, data: st.DataObject,
                                          registry: Registry) -> None:
    descriptor = cbcl.descriptor.read_descriptor((DESCRIPTORS / f"{name}.cbcl").read_bytes())
    intent = data.draw(st.sampled_from(descriptor.intents))
    strategy, protocol = generator(name, data.draw(st.sampled_from(descriptor.intents)).value)
    tokens = mutate_tokens(data.draw(strategy).split(" "), data, rounds=3)
    for text in layouts(envelope(protocol, intent.value, " ".join(tokens)), data):
        expected = old_parse(registry, text)
        event(expected[0].__name__ if isinstance(expected, tuple) else "accepted")
        assert outcome(lambda t=text: cbcl.parse(t.encode(), registry=registry)) == expected
        with searched_natively():
            assert outcome(lambda t=text: cbcl.parse(t, registry=registry)) == expected
        with python_tiers():
            assert outcome(lambda t=text: cbcl.parse(t.encode(), registry=registry)) == expected


@pytest.mark.parametrize("name", ALL)
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_the_native_search_finds_what_the_python_walk_does(name: str, data: st.DataObject,
                                                           registry: Registry) -> None:
    descriptor = cbcl.descriptor.read_descriptor((DESCRIPTORS / f"{name}.cbcl").read_bytes())
    intent = data.draw(st.sampled_from(descriptor.intents))
    strategy, protocol_id = generator(name, intent.value)
    tokens = mutate_tokens(data.draw(strategy).split(" "), data, rounds=3)
    try:
        body = cbcl.read(" ".join(tokens))
    except CBCLError:
        return
    protocol = registry.get(protocol_id)
    assert protocol is not None
    node = start_node(protocol, intent)
    python = find_refusal_python(protocol, body, node)
    found = _pass2.find_refusal(protocol, body, intent)
    if python is None or found is None:
        assert python is found is None
        return
    automaton = protocol.automaton
    assert (found.kind, found.path, found.cls, automaton.stack(found.node)) == (
        python.kind, python.path, python.cls, automaton.stack(python.node))
    # (the native walk's node is the recogniser's, its sets' masks reported beside it: those
    # of the sets under way, where the automaton's node keeps those of ended sets too)
    marks = automaton.marks(found.node) if found.marks is None else found.marks
    assert marks.items() <= automaton.marks(python.node).items()
    worded, reference = (_pass2.refusal_error(protocol, body, refusal, intent)
                         for refusal in (found, python))
    assert (worded.message, worded.expected, worded.hint()) == \
        (reference.message, reference.expected, reference.hint())


def test_validate_explains_on_the_canonical_text(registry: Registry) -> None:
    message = cbcl.parse(envelope("contract-net/v1", "CFP", '(cfp :deadline 5 :deadline 6)'),
                         envelope_only=True)
    text = message.canonical()
    expected = old_parse(registry, text)
    assert outcome(lambda: cbcl.validate(message, registry=registry)) == expected
    assert isinstance(expected, tuple) and "given twice" in str(expected[1])


def test_unknown_protocol_points_at_its_symbol(registry: Registry) -> None:
    text = envelope("nobody/v9", "INFORM", "(x " + "1 " * 500 + ")")
    with pytest.raises(cbcl.UnknownProtocolError) as info:
        cbcl.parse(text, registry=registry)
    assert info.value.offset == text.index("nobody/v9")
    with pytest.raises(cbcl.UnknownProtocolError) as info:
        cbcl.validate(cbcl.parse(text, envelope_only=True), registry=registry)
    assert info.value.offset == text.index("nobody/v9")


# --------------------------------------------------------------------------- large bodies

#: A grammar whose lists nest without bound, every token walked but in ``(v …)`` (a whole
#: value), with a keyword set: large bodies with refusals at any depth and place.
NESTED = (
    b'(protocol-descriptor (id nested/v1) (version 1) (intents INFORM) (grammar '
    + cbcl.canonical('body: node\n'
                     'node: "(" "n" item* ")"\n'
                     'item: INTEGER | STRING | SYMBOL | node | "(" "v" value ")"\n'
                     '    | "(" "opts" (":a" INTEGER & [":b" STRING]) ")"\n').encode()
    + b"))")


@pytest.fixture(scope="module")
def nested(registry: Registry) -> Protocol:
    protocol = registry.load(NESTED, allow_unsigned=True)
    return protocol


def node_text(draw: Any, depth: int, wide: int) -> str:
    """A ``node`` of NESTED: up to ``wide`` items, lists nested ``depth`` deep at most."""
    items = []
    for _ in range(draw(st.integers(0, wide))):
        kind = draw(st.integers(0, 6 if depth else 3))
        if kind == 0:
            items.append(str(draw(st.integers(-5, 10**6))))
        elif kind == 1:
            items.append(cbcl.canonical(draw(st.text(max_size=4))))
        elif kind == 2:
            items.append(draw(st.sampled_from(["a", "n", "v", "opts", "x-y"])))
        elif kind == 3:
            items.append("(v " + draw(st.sampled_from(["(1 (2 x) \"s\")", "3.5", "()"])) + ")")
        elif kind == 4:
            keys = draw(st.permutations([":a 1", ':b "b"']))[:draw(st.integers(1, 2))]
            items.append("(opts " + " ".join(keys) + ")")
        else:
            items.append(node_text(draw, depth - 1, wide))
    return "(n " + " ".join(items) + ")" if items else "(n)"


MISTAKES = ["1.5", ":a", "opts", "(v)", "()", "(opts :b \"x\")", "(n", ")", ":z"]


@pytest.mark.slow
@settings(max_examples=120, deadline=None)
@given(data=st.data())
def test_large_bodies_are_refused_as_the_rescan_does(data: st.DataObject, registry: Registry,
                                                     nested: Protocol) -> None:
    body = node_text(data.draw, data.draw(st.integers(1, 5)), data.draw(st.integers(1, 40)))
    tokens = body.replace("(", "( ").replace(")", " )").split()
    for _ in range(data.draw(st.integers(1, 2))):
        tokens.insert(data.draw(st.integers(0, len(tokens))), data.draw(st.sampled_from(MISTAKES)))
    text = envelope("nested/v1", "INFORM", " ".join(tokens))
    for layout in layouts(text, data):
        expected = old_parse(registry, layout)
        event(expected[0].__name__ if isinstance(expected, tuple) else "accepted")
        assert outcome(lambda t=layout: cbcl.parse(t.encode(), registry=registry)) == expected
        with searched_natively():
            assert outcome(lambda t=layout: cbcl.parse(t, registry=registry)) == expected
        with python_tiers():
            assert outcome(lambda t=layout: cbcl.parse(t.encode(), registry=registry)) \
                == expected
    try:
        value = cbcl.read(" ".join(tokens))
    except CBCLError:
        return
    python = find_refusal_python(nested, value, start_node(nested, None))
    found = _pass2.find_refusal(nested, value)
    assert (found is None) == (python is None)
    if found is not None and python is not None:
        assert (found.kind, found.path, found.cls) == (python.kind, python.path, python.cls)
        assert nested.automaton.stack(found.node) == nested.automaton.stack(python.node)


# --------------------------------------------------------------------------- bounded work


def explained(protocol: Protocol, text: str, work: RefusalWork) -> BodyError:
    message = cbcl.parse(text, envelope_only=True)
    assert check_intent_and_body(protocol, message) is False
    with pytest.raises(BodyError) as info:
        explain_body(protocol, text, message, DEFAULT_LIMITS, work=work)
    return info.value


def flat(count: int, refused_at: int) -> str:
    items = [str(1000 + i) for i in range(count)]
    items[refused_at] = "1.5"
    return envelope("nested/v1", "INFORM", "(n " + " ".join(items) + ")")


@pytest.mark.parametrize("refused_at", [0, 1, 1500, 2999])
def test_the_python_walk_stops_at_the_refusal(refused_at: int, nested: Protocol) -> None:
    body = cbcl.read("(n " + " ".join("1.5" if i == refused_at else str(i)
                                       for i in range(3000)) + ")")
    work = RefusalWork()
    found = find_refusal_python(nested, body, start_node(nested, None), work)
    assert found is not None and (found.kind, found.path) == (ITEM, (refused_at + 1,))
    # one step a token: the '(' and the elements up to the refused one, no further
    assert work.steps == refused_at + 3


@pytest.mark.skipif(not NATIVE, reason="cbcl._native is not built")
@pytest.mark.parametrize("refused_at", [0, 1, 1500, 2999])
def test_the_native_search_takes_a_few_walks(refused_at: int, nested: Protocol) -> None:
    text = flat(3000, refused_at)
    work = RefusalWork()
    error = explained(nested, text, work)
    assert error.offset == text.index("1.5") and error.message.endswith("found decimal 1.5")
    # The list walked once to the refusal with 16 probes, then the part that holds it
    # (188 elements), then its part (12), then a few elements stepped in Python: each
    # walk goes at most one part past the refusal.
    assert work.walks <= 3 and work.callbacks <= 3 * _pass2._PROBES and work.steps <= 16
    assert work.walked <= refused_at + 2 * (188 + 12 + 1)
    # The text is canonical: the elements before the refused one are stepped over at once.
    assert work.reads == 0 and work.copied <= 2 * len(text)


@pytest.mark.parametrize("refused_at", [0, 1500, 2999])
def test_spaced_text_is_read_up_to_the_refusal(refused_at: int, nested: Protocol) -> None:
    text = flat(3000, refused_at).replace(" ", "  ")
    work = RefusalWork()
    with python_tiers():
        error = explained(nested, text, work)
    assert error.offset == text.index("1.5")
    # Read again: the fields before the body, then the body's elements before the refused
    # one (its head among them), each once.
    assert work.reads <= refused_at + 1 + 8
    if NATIVE:  # one lexical pass in C, nothing read again
        work = RefusalWork()
        assert explained(nested, text, work).offset == error.offset
        assert work.reads == work.copied == 0 and work.scans == 1


@pytest.mark.skipif(not NATIVE, reason="cbcl._native is not built")
def test_a_refusal_deep_in_nested_lists_is_walked_to_once(nested: Protocol) -> None:
    depth = 40
    text = envelope("nested/v1", "INFORM", "(n 1 " * depth + " ".join(
        str(i) for i in range(500)) + " 1.5" + ")" * depth)
    work = RefusalWork()
    error = explained(nested, text, work)
    assert error.offset == text.index("1.5")
    # Each list is entered, not walked: the walks are those of the innermost list.
    assert work.walks <= 2 * depth + 16 and work.walked <= 4 * 500 + 4 * depth


def test_a_known_refusal_is_not_searched_for(nested: Protocol) -> None:
    text = flat(3000, 2999)
    message = cbcl.parse(text, envelope_only=True)
    assert message.body is not None
    refusal = _pass2.find_refusal(nested, message.body)  # (as the C walk would report it)
    assert refusal is not None
    work = RefusalWork()
    with pytest.raises(BodyError) as info:
        explain_body(nested, text, message, DEFAULT_LIMITS, refusal=refusal, work=work)
    assert info.value.offset == text.index("1.5")
    assert work.walks == work.callbacks == 0 and work.steps == 1  # the refused token only
    # Another form of the body (a binary frame's) is refused alike, where its caller says.
    alike = _pass2.refusal_error(nested, message.body, refusal, message.intent)
    assert (alike.message, alike.expected, alike.line) == (
        info.value.message, info.value.expected, None)
    found = "\nFound: decimal 1.5."
    assert alike.hint().split(found)[1] == info.value.hint().split(found)[1]


@pytest.mark.parametrize(("body", "kind", "path"), [
    ("1.5", ITEM, ()),  # the body itself
    ("(n 1 (n 2 3) 1.5)", ITEM, (3,)),
    ("(n (opts :b \"s\"))", CLOSE, (1,)),  # :a is required
    ("(n (n 1 (opts :a 1 :a 2)))", ITEM, (1, 2, 3)),  # given twice
    ("(n (v))", CLOSE, (1,)),
])
def test_what_a_refusal_points_at(body: str, kind: str, path: tuple[int, ...],
                                  nested: Protocol) -> None:
    found = _pass2.find_refusal(nested, cbcl.read(body))
    assert found is not None and (found.kind, found.path) == (kind, path)
    python = find_refusal_python(nested, cbcl.read(body), start_node(nested, None))
    assert python is not None and (python.kind, python.path) == (kind, path)


@pytest.mark.slow
def test_the_end_of_a_body_may_be_refused(registry: Registry) -> None:
    protocol = registry.load(b'(protocol-descriptor (id two/v1) (version 1) (intents INFORM) '
                             b'(grammar "body: \\"(\\" \\"a\\" \\")\\" SYMBOL"))',
                             allow_unsigned=True)
    found = _pass2.find_refusal(protocol, cbcl.read("(a)"))
    assert found is not None and (found.kind, found.path, found.cls) == (END, (), "$END")
    text = envelope("two/v1", "INFORM", "(a)")
    assert outcome(lambda: cbcl.parse(text, registry=registry)) == old_parse(registry, text)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["canonical", "spaced"])
def test_text_beyond_ascii_is_read_again_from_slices(layout: str, registry: Registry,
                                                     nested: Protocol) -> None:
    # Lists of ~600 characters (more than one slice of 256), strings beyond ASCII, and
    # the refusal after 200 of them: the reader reads such text from its start only.
    element = "(n " + " ".join(f'"é{i}" (v ({i} "ü"))' for i in range(40)) + ")"
    body = "(n " + " ".join([element] * 200) + " 1.5)"
    text = envelope("nested/v1", "INFORM", body)
    if layout == "spaced":
        text = text.replace(" ", " \n ; é\n ")
    work = RefusalWork()
    error = explained(nested, text, work)
    assert seen(error) == old_parse(registry, text)
    assert error.offset == len(text[:text.index("1.5")].encode())
    # Read again: nothing of canonical text; else the 200 lists before the refusal, and
    # the fields and atoms before the body.
    assert work.reads <= (0 if layout == "canonical" else 200 + 8)
    assert work.copied <= 2 * len(text)


# --------------------------------------------------------------------------- the refusal budget

B_URI = "agent://test/b"


def refused_query(versions: str = '1 "two"') -> bytes:
    """A QUERY whose body the negotiation grammar refuses (a string among the versions)."""
    return frame((f'(CBCL/1.0 (message-id "q") (sender agent://test/a) (receiver {B_URI}) '
                  f"(intent QUERY) (protocol cbcl-negotiation/v1) (conversation-id \"c\") "
                  f'(timestamp {NOW}) (body (supports :protocol contract-net/v1 :digest '
                  f'"sha256:{"0" * 64}" :versions ({versions}) :encodings (text) '
                  f':nonce "0123456789abcdef")))').encode())


GOOD_QUERY = refused_query("1")


def responder(budget: RefusalBudget | None, address: str | None) -> Session:
    session = Session("responder", registry=Registry(disk_cache=False, isolate=False),
                      me=B_URI, refusal_budget=budget)
    session.peer_address = address
    return session


def answer(session: Session, data: bytes, now: int = NOW) -> Any:
    """The first event of ``session`` for ``data``, or the code it refused it with and
    why."""
    session.receive_data(data)
    try:
        return session.next_event(now=now)
    except RemoteProtocolError as error:
        assert session.data_to_send()  # the NOT-UNDERSTOOD it answers with
        return error.code, error.message


def test_an_address_gets_n_refusals_then_is_turned_away_unread() -> None:
    budget = RefusalBudget(max_refusals=3, window_ms=10_000)
    for at in range(3):  # N refused frames: each read and refused for its own reason
        code, why = answer(responder(budget, "10.0.0.1"), refused_query(), NOW + at)
        assert code == "malformed" and why.endswith('found string "two"')
    assert budget.refusals("10.0.0.1", now=NOW + 3) == 3
    # N+1: even a good QUERY is refused before it is read, with the limit's name
    code, why = answer(responder(budget, "10.0.0.1"), GOOD_QUERY, NOW + 3)
    assert code == "limit" and "max_refusals" in why
    assert budget.refusals("10.0.0.1", now=NOW + 3) == 3  # (not charged)
    # Another address, and a session no transport gave an address, are served.
    assert isinstance(answer(responder(budget, "10.0.0.2"), GOOD_QUERY, NOW + 3), Query)
    assert isinstance(answer(responder(budget, None), GOOD_QUERY, NOW + 3), Query)
    # Once the first refusal is a window old, the address is let in again.
    assert isinstance(answer(responder(budget, "10.0.0.1"), GOOD_QUERY, NOW + 10_000), Query)


def test_an_established_session_is_not_cut_by_its_address_budget() -> None:
    budget = RefusalBudget(max_refusals=1, window_ms=10_000)
    pair = SessionPair(initiator(), session_responder())
    pair.b.refusal_budget, pair.b.peer_address = budget, "10.0.0.1"
    pair.handshake(query(encodings=("text",)))
    assert pair.b.state is HandshakeState.ESTABLISHED
    answer(responder(budget, "10.0.0.1"), refused_query())  # the address's one refusal
    (got,) = pair.feed(pair.b, pair.a.send(ProtocolMessage(cfp()), now=NOW))
    assert isinstance(got, ProtocolMessage)  # served: it proved who it is
    # One still in its handshake is turned away with its address.
    pending = SessionPair(initiator(), session_responder())
    pending.b.refusal_budget, pending.b.peer_address = budget, "10.0.0.1"
    code, _ = answer(pending.b, pending.a.send(query(), now=NOW))
    assert code == "limit"


def test_the_budget_is_bounded() -> None:
    budget = RefusalBudget(max_refusals=2, window_ms=100, max_peers=3)
    for peer in range(10):
        for at in range(5):
            budget.charge(f"10.0.0.{peer}", now=NOW + at)
    assert len(budget._times) == 3 and all(len(t) == 2 for t in budget._times.values())
    assert budget.refusals("10.0.0.9", now=NOW + 5) == 2
    assert budget.refusals("10.0.0.0", now=NOW + 5) == 0  # forgotten first
    assert budget.refusals("10.0.0.9", now=NOW + 104) == 0  # the window passed
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError):
            RefusalBudget(max_refusals=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Session("responder", registry=Registry(disk_cache=False, isolate=False),
                refusal_budget=3)  # type: ignore[arg-type]


def test_a_server_charges_each_connection_to_its_address(tmp_path: Path) -> None:
    budget = RefusalBudget(max_refusals=2, window_ms=60_000)

    def make_session() -> Session:
        return Session("responder", registry=Registry(disk_cache=False, isolate=False),
                       me=B_URI, refusal_budget=budget)

    async def handle(connection: Connection) -> None:
        with contextlib.suppress(CBCLError):
            while True:
                await connection.next_event()

    async def ask(address: str, data: bytes) -> str:
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(data)
        size = int.from_bytes(await reader.readexactly(4), "big")
        reply = cbcl.parse(await reader.readexactly(size), envelope_only=True)
        writer.close()
        return str(reply.body) if reply.intent is Intent.NOT_UNDERSTOOD else "answered"

    async def scenario() -> list[str]:
        server = await serve("127.0.0.1:0", make_session, handle,
                             clock=lambda: NOW)
        host, port = server.sockets[0].getsockname()[:2]
        address = f"{host}:{port}"
        try:
            return [await ask(address, data)
                    for data in (refused_query(), refused_query(), GOOD_QUERY)]
        finally:
            server.close()
            await server.wait_closed()

    assert asyncio.run(scenario()) == ["malformed", "malformed", "limit"]
    assert budget.refusals("127.0.0.1", now=NOW) == 2


@pytest.mark.parametrize(("protocol", "intent", "body"), [
    ("nested/v1", "INFORM", "1.5"),  # the body itself
    ("nested/v1", "INFORM", "()"),
    ("nested/v1", "INFORM", "(n (opts :a 1 :a 2))"),  # given twice
    ("nested/v1", "INFORM", "(n (opts :b \"s\"))"),  # a required member missing
    ("nested/v1", "INFORM", "(n (n (n 1 ; a comment\n \"\\u00e9\\n\" (v (1 2)) :z)))"),
    ("nested/v1", "INFORM", "(n\t(n (n 1))\r\n (n (n 2) (n (n 3 (opts :a 1) x (n)))) (v) y)"),
    ("contract-net/v1", "CFP", "(cfp :task (task :id \"t\" :action a) :deadline 5 :round)"),
    ("contract-net/v1", "PROPOSE", "(cfp :task (task :id \"t\" :action a) :deadline 5)"),
    ("contract-net/v1", "REFUSE", "(refuse :task-id \"t\" :reason (other))"),
    ("cbcl-negotiation/v1", "QUERY", "(supports :protocol p :digest \"d\" :versions (1 2.5))"),
])
def test_chosen_refusals_are_those_of_the_rescan(protocol: str, intent: str, body: str,
                                                 registry: Registry, nested: Protocol) -> None:
    text = envelope(protocol, intent, body)
    for layout in (text, text.replace(" ", "   "), text.replace("(body ", "(body\n; c\n")):
        expected = old_parse(registry, layout)
        assert isinstance(expected, tuple) and expected[0] is BodyError
        assert outcome(lambda t=layout: cbcl.parse(t.encode(), registry=registry)) == expected
        padded = layout.replace("(message-id \"m\")", f"(message-id \"{'m' * 3000}\")")
        assert outcome(lambda t=padded: cbcl.parse(t, registry=registry)) == \
            old_parse(registry, padded)  # (past _SMALL_TEXT: the native search)
