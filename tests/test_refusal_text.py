"""A refused text document is explained from the C parse entry's own read, in any layout
(issue 36, item 2), and a protocol with constraints stays on the C entry (issue 34).

``cbcl.parse(data, registry=R)``'s C entry reads the document once; when its passes do not
accept it, it goes on from the value it read (``cbcl.protocol._api._declined``): the
refusal is where its own walk stopped (reported, not walked again) and its place in the
text is found by ``cbcl._native.text_index``, one lexical pass up to it (spaces,
comments, text beyond ASCII alike), never by reading the text again. These tests hold
its errors — class, message, position, context, expected items, hint — to the
pure-Python careful tier's for texts with drawn whitespace and comments between the
tokens and the refusal at a drawn place; ``text_index`` to its twin
``refusal_index_python`` for every kind of refused token; and count the work: no second
read or walk, no Python stepping over the text. A protocol with
constraints is accepted by the C entry and its rules then applied, with the same results
and errors as the Python entry.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import event, given, settings, strategies as st
from test_protocol import DESCRIPTORS, SHIPPED, generator

import cbcl
from cbcl import CBCLError, Registry
from cbcl.core._limits import DEFAULT_LIMITS
from cbcl.protocol import _api, _pass2
from cbcl.protocol._constraints import ConstraintError
from cbcl.protocol._pass2 import (
    CLOSE,
    END,
    ITEM,
    RefusalWork,
    find_refusal_python,
    refusal_index_python,
    start_node,
)

NATIVE = _pass2._text_index_c is not None and _api._accept_document_c is not None
pytestmark = pytest.mark.skipif(not NATIVE, reason="cbcl._native is not built")

#: Items, groups and keyword pairs: every kind of token, lists nested three deep.
WALKED = (
    b'(protocol-descriptor (id text-walked/v1) (version 1) (intents INFORM) (grammar "'
    b'body: \\"(\\" \\"items\\" group* \\")\\"\\n'
    b'group: \\"(\\" \\"group\\" item* \\")\\"\\n'
    b'item: INTEGER | STRING | SYMBOL | \\"(\\" \\"pair\\" KEYWORD INTEGER \\")\\"\\n"))')

#: What may separate two tokens (the reader takes any of them).
SEPARATORS = [" ", "  ", "\n", "\t", "\r\n", " ; a comment\n", "\n;; é ü 雪\n  ", ";\n"]


@pytest.fixture(scope="module")
def registry() -> Registry:
    reg = Registry(disk_cache=False, isolate=False)
    for name in [*SHIPPED, "cbcl-negotiation-v1"]:
        reg.load((DESCRIPTORS / f"{name}.cbcl").read_bytes(), allow_unsigned=True)
    reg.load(WALKED, allow_unsigned=True)
    return reg


def seen(error: CBCLError) -> tuple[object, ...]:
    """Everything a caller sees of a refusal."""
    return (type(error), error.message, error.line, error.column, error.offset,
            error.context, getattr(error, "expected", None), error.hint())


def outcome(call: Any) -> object:
    try:
        return call()
    except CBCLError as error:
        return seen(error)


@contextlib.contextmanager
def pure_python() -> Iterator[None]:
    """The careful tier as where ``cbcl._native`` is not built: the document not accepted
    in C, pass 2 and the search for the refusal walked in Python, its place in the text
    found by stepping over the elements before it (:func:`refusal_index_python`)."""
    saved = (_pass2._recognise_c, _pass2._refusal_of_c, _pass2._text_index_c,
             _api._accept_document_c)
    _pass2._recognise_c = _pass2._refusal_of_c = _pass2._text_index_c = None
    _api._accept_document_c = None
    try:
        yield
    finally:
        (_pass2._recognise_c, _pass2._refusal_of_c, _pass2._text_index_c,
         _api._accept_document_c) = saved


def reference(registry: Registry, data: bytes) -> object:
    with pure_python():
        return outcome(lambda: _api.parse_python(data, registry=registry))


def laid_out(tokens: list[str], data: st.DataObject) -> str:
    """``tokens`` with a drawn separator between each two (none inside a string)."""
    gaps = data.draw(st.lists(st.sampled_from(SEPARATORS), min_size=len(tokens),
                              max_size=len(tokens)))
    return "".join(token + gap for token, gap in zip(tokens, gaps, strict=True))


def message_tokens(protocol: str, intent: str, body: list[str]) -> list[str]:
    return ["(CBCL/1.0", '(message-id "m")', "(sender", "agent://a)", "(receiver",
            "agent://b)", f"(intent {intent})", f"(protocol {protocol})", "(timestamp",
            "5)", "(body", *body, "))"]


def item(index: int) -> list[str]:
    kind = index % 4
    if kind == 0:
        return [str(100 + index)]
    if kind == 1:
        return [f'"é{index}\\n雪"']
    if kind == 2:
        return [f"sym-{index}"]
    return ["(pair", f":k{index}", f"{index})"]


#: Mistakes put at a drawn place of a walked body, with what each refuses.
MISTAKES = ["1.5", ":stray", "(pair :k 1 2)", "(group)", "()", "(pair 1 :k)", "agent://x"]


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_spaced_refusals_are_those_of_the_careful_tier(data: st.DataObject,
                                                       registry: Registry) -> None:
    groups = data.draw(st.lists(st.integers(0, 12), min_size=1, max_size=5))
    body: list[str] = ["(items"]
    for group, size in enumerate(groups):
        body.append("(group")
        for index in range(size):
            body.extend(item(group * 13 + index))
        body.append(")")
    body.append(")")
    for _ in range(data.draw(st.integers(1, 2))):  # a refusal at a drawn place
        body.insert(data.draw(st.integers(1, len(body) - 1)), data.draw(
            st.sampled_from(MISTAKES)))
    text = laid_out(message_tokens("text-walked/v1", "INFORM", body), data)
    document = text.encode()
    expected = reference(registry, document)
    event(expected[0].__name__ if isinstance(expected, tuple) else "accepted")
    assert outcome(lambda: cbcl.parse(document, registry=registry)) == expected


@pytest.mark.parametrize("name", [*SHIPPED, "cbcl-negotiation-v1"])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_shipped_grammars_refuse_spaced_text_as_the_careful_tier(
        name: str, data: st.DataObject, registry: Registry) -> None:
    descriptor = cbcl.descriptor.read_descriptor((DESCRIPTORS / f"{name}.cbcl").read_bytes())
    intent = data.draw(st.sampled_from(descriptor.intents))
    strategy, protocol = generator(name, data.draw(st.sampled_from(descriptor.intents)).value)
    tokens = data.draw(strategy).split(" ")
    if any(token.count('"') % 2 for token in tokens):  # (a string with a space in it)
        tokens = [" ".join(tokens)]
    if len(tokens) > 1:  # a token dropped, doubled or moved
        at = data.draw(st.integers(0, len(tokens) - 1))
        moved = tokens.pop(at)
        if data.draw(st.booleans()):
            tokens.insert(data.draw(st.integers(0, len(tokens))), moved)
        if data.draw(st.booleans()):
            tokens.insert(data.draw(st.integers(0, len(tokens))), moved)
    text = laid_out(message_tokens(protocol, intent.value, tokens), data)
    document = text.encode()
    expected = reference(registry, document)
    event(expected[0].__name__ if isinstance(expected, tuple) else "accepted")
    assert outcome(lambda: cbcl.parse(document, registry=registry)) == expected


# --------------------------------------------------------------------------- text_index


NESTED = (b'(protocol-descriptor (id nested-text/v1) (version 1) (intents INFORM) '
          b'(grammar "body: item | \\"(\\" \\"t\\" \\")\\" INTEGER\\n'
          b'item: INTEGER | STRING | \\"(\\" \\"n\\" item* \\")\\" '
          b'| \\"(\\" \\"v\\" \\"(\\" INTEGER+ \\")\\" \\")\\""))')


@pytest.mark.parametrize(("body", "kind"), [  # (the tokens, one space apart)
    ("1.5", ITEM),  # the body itself
    ('( n 1 "a;b(c) \\"" ( n 2 3 ) 1.5 )', ITEM),
    ("( n ( v ( 1 2 ) 3 ) )", ITEM),
    ("( n :k )", ITEM),
    ("( n ( v ( ) ) )", CLOSE),
    ("( n ( v ) )", CLOSE),
    ("( v )", CLOSE),
    ("( t )", END),  # the body's end, where an integer must follow it
    ("( n 1 ) 2", None),  # (two values: not a document; the reader refuses it)
])
@pytest.mark.parametrize("gap", SEPARATORS)
def test_text_index_is_its_python_twin(body: str, kind: str | None, gap: str) -> None:
    registry = Registry(disk_cache=False, isolate=False)
    protocol = registry.load(NESTED, allow_unsigned=True)
    tokens = body.split(" ") if '"' not in body else \
        [*body.split(" ")[:3], '"a;b(c) \\""', *body.split(" ")[5:]]
    text = gap.join(message_tokens("nested-text/v1", "INFORM", tokens)) + gap
    try:
        message = cbcl.parse(text, envelope_only=True)
    except CBCLError:
        assert kind is None
        return
    assert message.body is not None
    refusal = find_refusal_python(protocol, message.body, start_node(protocol, None))
    assert refusal is not None and refusal.kind == kind
    work = RefusalWork()
    assert _pass2.refusal_index(text, message, refusal, DEFAULT_LIMITS, work) == \
        refusal_index_python(text, message, refusal, DEFAULT_LIMITS)
    assert work.scans == 1 and work.reads == work.copied == 0


def test_text_index_refuses_a_path_the_text_does_not_hold() -> None:
    from cbcl._native import text_index

    assert text_index("(a (b c) d)", (1, 1), 1) == 6
    assert text_index("(a (b c) d)", (1,), 2) == 7
    assert text_index("(a (b c) d)", (1,), 3) == 8
    for path, kind in (((4,), 1), ((0, 0), 1), ((-1,), 1), ((0,), 2), ((), 4)):
        with pytest.raises(ValueError):
            text_index("(a (b c) d)", path, kind)


# --------------------------------------------------------------------------- the work


class Spies:
    """Counts the calls of the careful path's reads and of its Python stepping over text."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: dict[str, int] = {}
        for module, name in ((_api, "_accepted"), (_api, "decode"), (_api, "parse_envelope"),
                             (_pass2, "_skip"), (_pass2, "_end_of"),
                             (_pass2, "refusal_index_python"), (_pass2, "_search_native"),
                             (_api, "find_body_refusal"), (_api, "_after_envelope")):
            monkeypatch.setattr(module, name, self._spy(name, getattr(module, name)))

    def _spy(self, name: str, real: Any) -> Any:
        self.calls[name] = 0

        def spy(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return real(*args, **kwargs)
        return spy


def flat(count: int, refused_at: int, gap: str) -> bytes:
    items = [f'"é{i}"' if i % 3 else str(i) for i in range(count)]
    items[refused_at] = "1.5"
    body = ["(items", "(group", *items, ")", ")"]
    return gap.join(message_tokens("text-walked/v1", "INFORM", body)).encode()


@pytest.mark.parametrize("gap", ["  ", "\n ; é\n "])
@pytest.mark.parametrize("refused_at", [0, 2000, 3999])
def test_a_refused_spaced_text_is_read_once(gap: str, refused_at: int, registry: Registry,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    data = flat(4000, refused_at, gap)
    spies = Spies(monkeypatch)
    with pytest.raises(cbcl.BodyError) as info:
        cbcl.parse(data, registry=registry)
    text = data.decode()
    assert info.value.offset == len(text[:text.index("1.5")].encode())
    # The careful path went on from the C entry's value and its walk's report: no read,
    # decode, pass 1 or walk again, nothing stepped over in Python, no search by probes;
    # one lexical pass in C found the place.
    assert spies.calls == {"_accepted": 0, "decode": 0, "parse_envelope": 0, "_skip": 0,
                           "_end_of": 0, "refusal_index_python": 0, "_search_native": 0,
                           "find_body_refusal": 0, "_after_envelope": 1}
    assert seen(info.value) == reference(registry, data)


# --------------------------------------------------------------------------- constraints


def canon(intent: str, body: str, gap: str = " ") -> bytes:
    return gap.join(message_tokens("canon-a/v1", intent, [body])).encode()


@pytest.mark.parametrize(("intent", "body", "refused"), [
    ("QUERY", '(query weather :city "Paris")', None),
    ("QUERY", "(query weather)", ConstraintError),
    # (another intent's body: the grammar's refusal since canon-a/v1 version 3, which
    # gives each intent its own start rule; its constraints said it before)
    ("QUERY", '(deny :reason "x")', cbcl.BodyError),
    ("REFUSE", '(deny :reason "x")', None),
    ("FAILURE", '(deny :reason "x")', cbcl.BodyError),
    ("QUERY", "(query weather :unit celsius)", ConstraintError),
    ("QUERY", "(query weather :city 5)", cbcl.BodyError),
    ("QUERY", "(query 1.5)", cbcl.BodyError),
])
def test_constrained_messages_stay_on_the_c_entry(intent: str, body: str,
                                                  refused: type[CBCLError] | None,
                                                  registry: Registry,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    data = canon(intent, body)
    expected = reference(registry, data)
    python = outcome(lambda: _api.parse_python(data, registry=registry))
    if refused is not None:
        assert python == expected
    spies = Spies(monkeypatch)
    got = outcome(lambda: cbcl.parse(data, registry=registry))
    if refused is None:
        assert isinstance(got, cbcl.Message) and isinstance(python, cbcl.Message)
        assert got.to_value() == python.to_value()
        # Accepted by the C entry: the Python path never ran.
        assert spies.calls["_accepted"] == spies.calls["_after_envelope"] == 0
    else:
        assert got == expected and isinstance(got, tuple) and got[0] is refused
        # A rule's refusal after the C passes, or the careful path from the C read.
        assert spies.calls["_accepted"] == spies.calls["decode"] == 0


def test_constraints_of_a_protocol_loaded_later_are_applied(
        monkeypatch: pytest.MonkeyPatch) -> None:
    registry = Registry(disk_cache=False, isolate=False)
    data = canon("QUERY", "(query weather)")
    with pytest.raises(cbcl.UnknownProtocolError):
        cbcl.parse(data, registry=registry)  # (the C entry has cached its dicts)
    registry.load((DESCRIPTORS / "canon-a-v1.cbcl").read_bytes(), allow_unsigned=True)
    with pytest.raises(ConstraintError):
        cbcl.parse(data, registry=registry)
    cbcl.parse(canon("QUERY", '(query weather :city "Oslo")'), registry=registry)


class CountingRegistry(Registry):
    """A registry that counts its lookups (the constraint check's, after the C passes)."""

    def __init__(self) -> None:
        super().__init__(disk_cache=False, isolate=False)
        self.lookups = 0

    def get(self, protocol_id: Any) -> Any:
        self.lookups += 1
        return super().get(protocol_id)


def test_only_a_protocol_with_constraints_has_them_checked() -> None:
    registry = CountingRegistry()
    for name in ("contract-net-v1", "canon-a-v1"):
        registry.load((DESCRIPTORS / f"{name}.cbcl").read_bytes(), allow_unsigned=True)
    cfp = gap_message("contract-net/v1", "CFP", '(cfp :task (task :id "t" :action x) :deadline 5)')
    registry.lookups = 0
    cbcl.parse(cfp, registry=registry)
    assert registry.lookups == 0  # (no rules: accepted in C alone)
    cbcl.parse(canon("QUERY", '(query weather :city "Oslo")'), registry=registry)
    assert registry.lookups == 1  # check_constraints' lookup of canon-a


def gap_message(protocol: str, intent: str, body: str) -> bytes:
    return " ".join(message_tokens(protocol, intent, [body])).encode()


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet=st.sampled_from('() ";\\\n\tab1é雪'), max_size=40),
       path=st.lists(st.integers(-2, 6), max_size=4), kind=st.integers(0, 4))
def test_text_index_takes_any_text(text: str, path: list[int], kind: int) -> None:
    from cbcl._native import text_index

    try:
        index = text_index(text, tuple(path), kind)
    except ValueError:
        return
    assert 0 <= index <= len(text)
