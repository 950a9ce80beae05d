"""The streaming checker (cbcl.llm.Checker, issue 34 item 2) against the whole-message
parser: at every prefix, however the text is cut, its verdict is cbcl.parse's (spec/llm.md
§13 states the relation)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

import cbcl
from cbcl import CBCLError, Limits, Registry
from cbcl.core._errors import (
    BodyError,
    LimitError,
    ProtocolError,
    SchemaError,
    UnknownProtocolError,
)
from cbcl.llm import Checker, CheckerMisuse, Ok, Refused, generate_messages

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted(p for p in (ROOT / "descriptors").glob("*.cbcl")
                 if not p.name.endswith(".signed.cbcl"))
MESSAGE = ('(CBCL/1.0 (message-id "m-1") (sender agent://a) (receiver agent://b) '
           '(intent PROPOSE) (protocol contract-net/v1) (body (proposal :task-id "t-1" '
           ':bid (bid :price 12.50 :currency EUR))))')


def _registry() -> Registry:
    registry = Registry(disk_cache=False, isolate=False)
    for path in SHIPPED:
        registry.load(path.read_bytes(), allow_unsigned=True)
    return registry


REGISTRY = _registry()


def _pretty(text: str, rng: random.Random) -> str:
    """``text`` with some of its spaces outside strings turned into line breaks, tabs and
    comments (the checker's lexer must carry them across cuts)."""
    out: list[str] = []
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch == " " and rng.random() < 0.3:
            ch = rng.choice(["\n  ", "\r\n", " ; a note é (x\n", "\t", " ;\n"])
        out.append(ch)
    return "".join(out)


def _accepted(text: str) -> bool:
    try:
        cbcl.parse(text, registry=REGISTRY)
    except CBCLError:
        return False
    return True


def _valid() -> list[str]:
    texts = [MESSAGE]
    for path in SHIPPED:
        # (those the whole-message parser accepts: generated bodies satisfy the grammar and
        # the schema, not always a protocol's constraints)
        texts += [m.canonical() for m in generate_messages(path.read_bytes(), 12, seed=5)
                  if _accepted(m.canonical())]
    rng = random.Random(5)
    return texts + [_pretty(text, rng) for text in texts]


VALID = _valid()
#: What a mutation inserts or writes over (characters models and cuts get wrong).
PIECES = [*'() "\\:;\n\tabcXYZ-.0123456789é\x01{}', "\\u00e9", "(body 1)", " :x ", "\u202e",
          "PROPOSE", ":price", "\\u", "😀"]
#: Refusals pass 2 may make before pass 1's first error (cbcl.parse judges the body
#: once the whole envelope is read).
PASS_TWO = (BodyError, UnknownProtocolError, ProtocolError)


def _index(text: str, error: CBCLError) -> int | None:
    position = error.position
    if position is None or not position.line:
        return None
    start = 0
    for _ in range(position.line - 1):
        start = text.index("\n", start) + 1
    return start + position.column - 1


def _check(text: str, cuts: list[int], *, as_bytes: bool = False,
           limits: Limits | None = None) -> tuple[Ok | Refused, Checker, list[Ok | Refused]]:
    """Feed ``text`` cut at ``cuts`` (indexes, into its UTF-8 when ``as_bytes``), then
    finish: the final verdict, the checker and every feed's verdict."""
    data: str | bytes = text.encode() if as_bytes else text
    checker = Checker(REGISTRY, limits=limits)
    verdicts: list[Ok | Refused] = []
    at = 0
    for cut in [*sorted(set(cuts)), len(data)]:
        if cut > at:
            verdicts.append(checker.feed(data[at:cut]))
            at = cut
    return checker.finish(), checker, verdicts


def _agrees(text: str, verdict: Ok | Refused, limits: Limits | None = None) -> str:
    """Assert the relation of spec/llm.md §13 between ``verdict`` and cbcl.parse's on
    ``text``; say which case it is."""
    try:
        message = cbcl.parse(text, registry=REGISTRY, limits=limits)
    except CBCLError as error:
        assert isinstance(verdict, Refused), (text, error)
        found = verdict.error
        at = _index(text, error)
        if type(found) is type(error) and found.message == error.message and \
                (at is None or at == verdict.index):
            return "same"
        if isinstance(error, LimitError) and error.limit == "max_message_bytes":
            # the parser measures the whole document first; the checker, when it gets
            # there: an error before that point comes first
            maximum = (limits or cbcl.Limits()).max_message_bytes
            assert len(text[:verdict.index].encode()) <= maximum, (text, found)
            return "size"
        assert isinstance(found, PASS_TWO) and not isinstance(error, (SchemaError, *PASS_TWO)), \
            (text, error, found)
        assert at is not None and verdict.index < at, (text, error, found)
        return "earlier"
    assert isinstance(verdict, Ok), (text, verdict.error)
    assert verdict.message == message
    return "ok"


def _mutate(text: str, where: int, how: int, piece: str) -> str:
    where %= len(text) + 1
    if how == 0:
        return text[:where] + text[where + 1:]
    if how == 1:
        return text[:where] + piece + text[where:]
    return text[:where] + piece + text[where + 1:]


cuts = st.lists(st.integers(0, 400), max_size=12)


@settings(max_examples=60)
@given(st.sampled_from(VALID), st.booleans())
def test_valid_messages_are_never_refused_at_any_prefix(text: str, as_bytes: bool) -> None:
    data: str | bytes = text.encode() if as_bytes else text
    checker = Checker(REGISTRY)
    for i in range(len(data)):  # one character (or byte: mid-character) at a time
        verdict = checker.feed(data[i:i + 1])
        assert isinstance(verdict, Ok), (text, i, verdict)
    assert isinstance(verdict, Ok) and verdict.complete
    final = checker.finish()
    assert isinstance(final, Ok) and final.message == cbcl.parse(text, registry=REGISTRY)


@settings(max_examples=300)
@given(st.sampled_from(VALID), st.integers(0, 10_000), st.integers(0, 2),
       st.sampled_from(PIECES), cuts, st.booleans())
def test_refused_where_the_parser_refuses(text: str, where: int, how: int, piece: str,
                                          cut: list[int], as_bytes: bool) -> None:
    mutated = _mutate(text, where, how, piece)
    verdict, _, verdicts = _check(mutated, cut, as_bytes=as_bytes)
    _agrees(mutated, verdict)
    refused = [v for v in verdicts if isinstance(v, Refused)]
    if refused:  # once refused, every later chunk gets the same refusal
        assert all(v is refused[0] for v in refused) and verdict is refused[0]


@settings(max_examples=40)
@given(st.sampled_from(VALID), st.integers(0, 10_000), st.integers(0, 3),
       st.sampled_from(PIECES))
def test_every_prefix_finishes_as_the_parser_judges_it(text: str, where: int, how: int,
                                                       piece: str) -> None:
    mutated = text if how == 3 else _mutate(text, where, how, piece)
    for end in range(0, len(mutated) + 1, 3):
        prefix = mutated[:end]
        verdict, _, _ = _check(prefix, [end // 2])
        _agrees(prefix, verdict)


@settings(max_examples=150)
@given(st.sampled_from(VALID), st.integers(0, 10_000), st.integers(0, 2),
       st.sampled_from(PIECES), cuts, cuts)
def test_cuts_do_not_matter(text: str, where: int, how: int, piece: str, first: list[int],
                            second: list[int]) -> None:
    mutated = _mutate(text, where, how, piece)
    one, _, _ = _check(mutated, first)
    other, _, _ = _check(mutated, second, as_bytes=True)
    assert type(one) is type(other)
    if isinstance(one, Refused) and isinstance(other, Refused):
        assert (one.index, one.position, type(one.error), one.error.message) == \
            (other.index, other.position, type(other.error), other.error.message)


@settings(max_examples=100)
@given(st.sampled_from(VALID), st.integers(2, 6), st.integers(2, 12), st.integers(10, 80),
       st.integers(1, 20), st.integers(3, 20), st.integers(50, 400), cuts)
def test_limits_are_checked_where_the_parser_checks_them(
        text: str, depth: int, items: int, nodes: int, string: int, name: int, size: int,
        cut: list[int]) -> None:
    limits = Limits(max_depth=depth, max_list_items=items, max_nodes=nodes,
                    max_string_bytes=string, max_name_chars=name, max_message_bytes=size)
    verdict, _, _ = _check(text, cut, limits=limits)
    _agrees(text, verdict, limits)


def test_message_size_at_the_limit_and_past_it() -> None:
    size = len(MESSAGE.encode())
    verdict, _, _ = _check(MESSAGE, [10, 100], limits=Limits(max_message_bytes=size))
    assert isinstance(verdict, Ok)
    verdict, _, _ = _check(MESSAGE, [10, 100], limits=Limits(max_message_bytes=size - 1))
    assert isinstance(verdict, Refused) and isinstance(verdict.error, LimitError)
    assert verdict.error.limit == "max_message_bytes"


def test_a_refusal_is_found_before_the_message_ends() -> None:
    text = MESSAGE.replace(":price", ":prize")
    checker = Checker(REGISTRY)
    at = text.index(":prize")
    assert checker.feed(text[:at + len(":prize")])  # the keyword may go on: undecided
    verdict = checker.feed(" ")
    assert isinstance(verdict, Refused) and verdict.index == at
    assert verdict.consumed == at + len(":prize ")
    assert isinstance(verdict.error, BodyError) and '":price"' in verdict.expected
    assert "Write :price" in verdict.hint()
    json = Checker(REGISTRY).feed('{"intent": "PROPOSE"')  # a character no token starts
    assert isinstance(json, Refused) and json.index == 0


def test_tokens_split_anywhere_wait_for_their_end() -> None:
    text = MESSAGE.replace('"t-1"', '"t\\u00e9\\"1 é😀"')
    data = text.encode()
    for cut in range(1, len(data)):
        verdict, _, _ = _check(text, [cut], as_bytes=True)
        assert isinstance(verdict, Ok), cut
    bad = text.replace("\\u00e9", "\\u00g9")
    verdict, _, _ = _check(bad, [bad.index("\\u00g") + 3])
    assert _agrees(bad, verdict) == "same"


def test_invalid_utf8_is_refused_as_the_parser_refuses_it() -> None:
    data = MESSAGE.encode().replace(b"t-1", b"t-\xff")
    checker = Checker(REGISTRY)
    verdict = checker.feed(data[:60])
    assert isinstance(verdict, Ok)
    verdict = checker.feed(data[60:])
    assert isinstance(verdict, Refused)
    with pytest.raises(CBCLError) as raised:
        cbcl.parse(data, registry=REGISTRY)
    assert verdict.error.message == raised.value.message
    assert verdict.position == raised.value.position
    surrogate = Checker(REGISTRY).feed(MESSAGE[:30] + "\ud800")
    assert isinstance(surrogate, Refused) and surrogate.index == 30


INFORM = ('(CBCL/1.0 (message-id "m-1") (sender agent://a) (receiver agent://b/PATH) '
          '(intent INFORM) (protocol contract-net/v1) ; NOTE\n'
          '(body (inform-done :task-id "t-1" :result (RESULT))))')
CFP = ('(CBCL/1.0 (message-id "m-1") (sender agent://a) (receiver agent://b) (intent CFP) '
       '(protocol contract-net/v1) (body (cfp :deadline 5 :task (task :id "t" :action go '
       ':params (PARAMS)))))')


def _fed(text: str, chunk: int) -> Checker:
    checker = Checker(REGISTRY)
    for i in range(0, len(text), chunk):
        assert checker.feed(text[i:i + chunk])
    assert checker.finish()
    return checker


def test_work_is_linear_in_the_text_however_it_is_cut() -> None:
    """Counted, not timed: the characters the lexer's expressions go through, with long
    tokens (a URI, a comment, strings with escapes) cut into one-character chunks."""
    def text(count: int) -> str:
        return INFORM.replace("PATH", "p" * count).replace("NOTE", "n" * count).replace(
            "RESULT", " ".join(f'"s\\u00e9\\"{i}" x{i}' for i in range(count)))

    for chunk in (1, 7):
        small, large = text(500), text(1000)
        one, two = _fed(small, chunk), _fed(large, chunk)
        whole = _fed(small, 10**9)
        assert one.tokens == whole.tokens and one.steps == whole.steps
        assert whole.work <= len(small) + 1 and one.work <= 3 * len(small)
        assert two.work <= 3 * len(large) and two.work < 2.2 * one.work


def test_driver_steps_are_linear_in_the_tokens() -> None:
    for count in (100, 200):
        text = CFP.replace("PARAMS", " ".join(f":k{i} {i}" for i in range(count)))
        checker = _fed(text, 3)
        assert checker.steps <= checker.tokens + 2  # one feed a token, the body's $END
        assert checker.tokens > 2 * count


def test_intent_and_protocol_may_be_required() -> None:
    verdict, _, _ = _check(MESSAGE, [])
    assert verdict
    checker = Checker(REGISTRY, intent="CFP")
    refused = checker.feed(MESSAGE)
    assert isinstance(refused, Refused) and refused.index == MESSAGE.index("PROPOSE")
    checker = Checker(REGISTRY, protocol="request/v1")
    refused = checker.feed(MESSAGE)
    assert isinstance(refused, Refused) and refused.index == MESSAGE.index("contract-net/v1")
    with pytest.raises(UnknownProtocolError):
        Checker(REGISTRY, protocol="nowhere/v9")


def test_body_mode() -> None:
    body = '(proposal :task-id "t-1" :bid (bid :price 12.50 :currency EUR))'
    checker = Checker(REGISTRY, protocol="contract-net/v1", intent="PROPOSE", body=True)
    for ch in body:
        assert checker.feed(ch)
    final = checker.finish()
    assert isinstance(final, Ok) and final.body == cbcl.read(body)
    checker = Checker(REGISTRY, protocol="contract-net/v1", intent="PROPOSE", body=True)
    refused = checker.feed(body.replace(":bid", ":bit") + " ")
    assert isinstance(refused, Refused) and refused.index == body.index(":bid")
    checker = Checker(REGISTRY, protocol="contract-net/v1", intent="PROPOSE", body=True)
    assert checker.feed(body + " ")
    refused = checker.feed("(x) ")
    assert isinstance(refused, Refused) and refused.index == len(body) + 1
    checker = Checker(REGISTRY, protocol="contract-net/v1", intent="PROPOSE", body=True)
    schema = checker.feed(body.replace("12.50", "-12.50"))  # (the schema's :min 0)
    assert schema and isinstance(checker.finish(), Refused)
    with pytest.raises(TypeError):
        Checker(REGISTRY, body=True)
    with pytest.raises(ProtocolError):
        Checker(REGISTRY, protocol="contract-net/v1", intent="QUERY", body=True)


def test_misuse() -> None:
    checker = Checker(REGISTRY)
    checker.feed("(CBCL/1.0")
    with pytest.raises(CheckerMisuse):
        checker.feed(b" (message-id")
    with pytest.raises(TypeError):
        checker.feed(7)  # type: ignore[arg-type]
    assert isinstance(checker.finish(), Refused)
    with pytest.raises(CheckerMisuse):
        checker.feed(")")
    with pytest.raises(CheckerMisuse):
        checker.finish()
    assert isinstance(CheckerMisuse("x"), CBCLError)
    with pytest.raises(TypeError):
        Checker(object())  # type: ignore[arg-type]


#: Pieces of hostile text: controls, bidirectional and invisible characters, surrogates
#: spelled as escapes, fragments of envelopes.
HOSTILE = [*'()"\\:;\n\r\t abcXYZ-.+0123456789é{}/', "\x00", "\x7f", "\u202e", "\ufeff",
           "\u2028", "😀", "CBCL/1.0", "(body ", "(intent PROPOSE)", "\\u", "\\ud800",
           "(protocol contract-net/v1)", "agent://x"]


@settings(max_examples=300)
@given(st.one_of(st.lists(st.sampled_from(HOSTILE), max_size=40).map("".join),
                 st.tuples(st.sampled_from(VALID), st.integers(0, 10_000),
                           st.lists(st.sampled_from(HOSTILE), max_size=4).map("".join))
                 .map(lambda t: t[0][:t[1] % (len(t[0]) + 1)] + t[2]
                      + t[0][t[1] % (len(t[0]) + 1):])),
       cuts, st.booleans())
def test_any_text_gets_a_verdict_never_another_exception(text: str, cut: list[int],
                                                        as_bytes: bool) -> None:
    verdict, _, _ = _check(text, cut, as_bytes=as_bytes)  # (raises nothing)
    _agrees(text, verdict)


@settings(max_examples=100)
@given(st.sampled_from([t for t in VALID if "(body " in t]), st.integers(0, 10_000),
       st.integers(0, 3), st.sampled_from(PIECES), cuts)
def test_a_body_alone_is_judged_as_in_its_message(text: str, where: int, how: int,
                                                  piece: str, cut: list[int]) -> None:
    """Body mode refuses a body where message mode refuses it in the message (its
    refusals in the body moved by where the body starts)."""
    message = cbcl.parse(text, registry=REGISTRY)
    assert message.intent is not None
    body = cbcl.canonical(message.body)  # type: ignore[arg-type]
    body = body if how == 3 else _mutate(body, where, how, piece)
    whole = (f'(CBCL/1.0 (message-id "m") (sender a://b) (receiver a://c) (intent '
             f"{message.intent.value}) (protocol {message.protocol}) (body ")
    in_message, _, _ = _check(whole + body + "))", [len(whole) + c for c in cut])
    checker = Checker(REGISTRY, protocol=message.protocol, intent=message.intent, body=True)
    at = 0
    verdict: Ok | Refused = Ok(0, False)
    for end in [*sorted(set(cut)), len(body)]:
        if end > at and isinstance(verdict, Ok):
            verdict = checker.feed(body[at:end])
            at = end
    alone = checker.finish() if isinstance(verdict, Ok) else verdict
    if isinstance(in_message, Refused) and isinstance(in_message.error, BodyError) and \
            in_message.index >= len(whole) and in_message.error.position is not None:
        assert isinstance(alone, Refused)
        assert (alone.index, alone.error.message) == \
            (in_message.index - len(whole), in_message.error.message)
    elif isinstance(in_message, Ok):
        assert isinstance(alone, Ok) and alone.body == cbcl.read(body)
