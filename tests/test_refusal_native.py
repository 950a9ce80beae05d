"""A refused binary frame is explained from where ``cbcl._native.decode_frame``'s walk stopped
(issue 36, item 2).

decode_frame notes the first token its grammar refuses (path, byte offset, the recogniser's
node, the keyword sets' masks), builds the rest of the body without the grammar and calls
``_codec._frame_refusal``, which words the error from that state: no Python walk, no
search (``find_refusal``), no careful tier. These tests hold its errors — class, message,
offset, expected items, hint — to the careful tier's (the pure-Python reference), for every
kind of refused token, keyword sets given twice, left incomplete or ended, and nested; they
check that nothing walks the body again, and that a limit or a malformed token after the
refusal still wins, as in the careful tier.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_protocol import DESCRIPTORS, SHIPPED
from test_refusal_binary import NESTED, PAIRS, careful, envelope, frame_of, outcome, warm

from cbcl import BodyError, CBCLError, Intent, Limits, Registry, parse
from cbcl.binary import _codec
from cbcl.protocol import _pass2

if _codec.SPEEDUPS:
    from cbcl._native import decode_frame

pytestmark = pytest.mark.skipif(not _codec.SPEEDUPS, reason="cbcl._native is not built")


@pytest.fixture(scope="module")
def registry() -> Registry:
    reg = Registry(disk_cache=False, isolate=False)
    for name in SHIPPED:
        reg.load((DESCRIPTORS / f"{name}.cbcl").read_bytes(), allow_unsigned=True)
    reg.load(NESTED, allow_unsigned=True)
    reg.load(PAIRS, allow_unsigned=True)
    return reg


class NoSearch:
    """Counts the searches for a refusal and the careful tier's walks (each must be 0)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        for module, name in ((_codec, "find_refusal"), (_codec, "_decode_tokens"),
                             (_codec, "_frame_by_value"), (_pass2, "_search_native"),
                             (_pass2, "find_refusal_python")):
            monkeypatch.setattr(module, name, self._spy(getattr(module, name)))

    def _spy(self, real: Any) -> Any:
        def spy(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return real(*args, **kwargs)
        return spy


def in_c(registry: Registry, frame: bytes) -> Any:
    """What decode_frame itself does with ``frame`` (a warm decoder's state)."""
    decoder = warm(registry)
    assert decoder._frame_state is not None
    return outcome(lambda: decode_frame(frame, decoder._frame_state))


TASK = '(task :id "t" :action build)'
CFP_BODIES = [
    f"(cfp :task {TASK} :deadline 5 :deadline 6)",  # a member given twice
    f"(cfp :task {TASK})",  # ended without a required member
    "(cfp :deadline 5 :task (task :id \"t\" :id \"u\" :action x))",  # twice, in a nested set
    "(cfp :deadline 5 :task (task :action x))",  # nested set ended without :id
    f"(cfp :task {TASK} :deadline 5 :round 1 :round 2)",  # an optional member twice
    f"(cfp :task {TASK} :deadline 5 extra)",  # after the set, a symbol
    "(cfp :task (task :id \"t\" :action build :params (:a 1 :b (x y) 2)) :deadline 5)",
    "(cfp :task (task :id \"t\" :action build :params (:a 1)) :deadline 1.5)",
    "(cfp :deadline 5 :task (task :params (:a 1) :action b :id \"t\" :params ()))",
    "(cfp)",  # at once missing
    "(cfp :task)",  # a member without its value
    "(proposal :task-id \"t\")",  # another start rule's head
]


@pytest.mark.parametrize("body", CFP_BODIES)
def test_keyword_set_refusals_are_the_careful_ones(
        body: str, registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    frame = frame_of(registry, envelope("contract-net/v1", "CFP", body))
    expected = careful(registry, frame)
    assert expected[0] is BodyError, body
    searches = NoSearch(monkeypatch)
    assert in_c(registry, frame) == expected  # (decode_frame raises it)
    assert outcome(lambda: warm(registry).decode(frame)) == expected
    assert searches.count == 0


@pytest.mark.parametrize(("intent", "body"), [
    ("REQUEST", "(request :action (action :name x :name y))"),
    ("REQUEST", "(request :by 3 :action (action :args (:a 1) :args (:b 2) :name x))"),
    ("REQUEST", "(request :by 3)"),
    ("INFORM", '(inform-result :result 1 :action-id "a" :result 2)'),
    ("INFORM", '(inform-done :action-id "a" 1)'),
])
def test_request_refusals_are_the_careful_ones(
        intent: str, body: str, registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    frame = frame_of(registry, envelope("request/v1", intent, body))
    expected = careful(registry, frame)
    assert expected[0] is BodyError, body
    searches = NoSearch(monkeypatch)
    assert in_c(registry, frame) == expected
    assert searches.count == 0


@pytest.mark.parametrize("body", [
    "1.5", "(1)", "(x 1)", "(n 1 (n 2 3) (x))", '(n (n (n "a" 1.5)))', "(n 1 (n 2 3) 1.5)",
])
def test_every_kind_of_refused_token_is_reported_by_the_walk(
        body: str, registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    frame = frame_of(registry, envelope("nested/v1", "INFORM", body))
    expected = careful(registry, frame)
    assert expected[0] is BodyError
    searches = NoSearch(monkeypatch)
    assert in_c(registry, frame) == expected
    assert searches.count == 0


@pytest.mark.parametrize("body", ["(p 1)", "(p 1 2 3)", "(p)"])
def test_a_refused_close_and_end_are_reported_by_the_walk(
        body: str, registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    frame = frame_of(registry, envelope("pairs/v1", "INFORM", body))
    expected = careful(registry, frame)
    assert expected[0] is BodyError
    searches = NoSearch(monkeypatch)
    assert in_c(registry, frame) == expected
    assert searches.count == 0


def test_a_limit_after_the_refusal_still_wins(registry: Registry) -> None:
    """The careful tier reads the whole body before it raises a grammar refusal: a limit
    met after the refused token is the error, and decode_frame leaves it to it."""
    items = " ".join(str(i) for i in range(40))
    frame = frame_of(registry, envelope("nested/v1", "INFORM", f"(n 1.5 (n {items}))"))
    limits = Limits(max_list_items=30)
    expected = outcome(lambda: _codec.Decoder(registry, limits=limits,
                                              pure_python=True).decode(frame))
    assert expected[0] is not BodyError and issubclass(expected[0], CBCLError)
    decoder = _codec.Decoder(registry, limits=limits)
    for protocol in registry.protocols():
        decoder._table(bytes.fromhex(protocol.digest[7:]), 4)
    assert decoder._frame_state is not None
    assert decode_frame(frame, decoder._frame_state) is None  # (declined)
    assert outcome(lambda: decoder.decode(frame)) == expected


def test_walker_marks_are_the_automatons(registry: Registry,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The refusal decode_frame reports — its path, class, the stack of its recogniser's
    node and the masks paired with it — is the one the Python walk finds on the automaton
    whose nodes carry the masks (the reference)."""
    protocol = registry.get("contract-net/v1")
    assert protocol is not None
    seen: list[_pass2.Refusal] = []
    real = _pass2.refusal_error

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(args[2])
        return real(*args, **kwargs)

    monkeypatch.setattr(_codec, "refusal_error", spy)
    for body in CFP_BODIES:
        seen.clear()
        text = envelope("contract-net/v1", "CFP", body)
        in_c(registry, frame_of(registry, text))
        assert len(seen) == 1, body
        value = parse(text, envelope_only=True).body
        assert value is not None
        reference = _pass2.find_refusal_python(protocol, value,
                                               _pass2.start_node(protocol, Intent.CFP))
        assert reference is not None
        found = seen[0]
        assert (found.kind, found.path, found.cls) == \
            (reference.kind, reference.path, reference.cls), body
        # (the automaton's node keeps the masks of sets already ended too, which no
        # refusal reads: those of the sets under way are the same)
        assert found.marks is not None
        assert found.marks.items() <= protocol.automaton.marks(reference.node).items(), body
        assert protocol.automaton.stack(found.node) == \
            protocol.automaton.stack(reference.node), body
