"""The session invariant (the fuzz issue): a responder or an initiator, in every handshake
state reachable, fed any bytes — whole, one byte at a time or in random chunks — gives
events, or a ``RemoteProtocolError`` (and then at most one NOT-UNDERSTOOD, a valid
cbcl-negotiation/v1 message, and nothing ever after), or ``LocalProtocolError`` once in
ERROR; never anything else.

The sessions, the frames a real peer sends them and the check itself are those of the
atheris ``session`` target (:class:`fuzz_cbcl.SessionKit`), so a finding of either
replays in the other. Inputs: (a) raw bytes with frame prefixes; (b) well-formed
cbcl-negotiation/v1 messages of every intent, with bodies from the handshake vocabulary
whose fields are right, wrong, missing or repeated and envelopes right or wrong; (c)
mutations of a recorded handshake (the signed offer included); (d) contract-net/v1
messages, text and binary, after ESTABLISHED. The minimal reproducers found come first.

Uses internals to build the peer's messages: the handshake's intents and transitions,
the rejection codes and the Finished value.
"""

from __future__ import annotations

import importlib.util
import itertools
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import event, given, settings, strategies as st
from strategies import ids, integers, messages, strings, symbols, uris, values

import cbcl
from cbcl import URI, Intent, Keyword, LocalProtocolError, RemoteProtocolError, Symbol
from cbcl.binary import frame
from cbcl.session import NOT_UNDERSTOOD_CODES, Event, HandshakeState
from cbcl.session._negotiation import INTENTS, TRANSITIONS
from cbcl.session._reasons import REJECT_CODES
from cbcl.session._session import finished_value
from cbcl.trust import sign_message

HERE = Path(__file__).parent
if TYPE_CHECKING:  # (mypy checks tests/fuzz/ too, and finds the module there)
    import fuzz_cbcl
else:
    _spec = importlib.util.spec_from_file_location("fuzz_cbcl", HERE / "fuzz" / "fuzz_cbcl.py")
    assert _spec is not None and _spec.loader is not None
    fuzz_cbcl = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(fuzz_cbcl)

KIT = fuzz_cbcl.SessionKit()
NOW = KIT.NOW
SCENARIOS = tuple(fuzz_cbcl.SESSION_SCENARIOS)
ESTABLISHED = tuple(name for name in SCENARIOS if "established" in name)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
NEGOTIATION = "cbcl-negotiation/v1"


def side(scenario: str) -> str:
    return fuzz_cbcl.SESSION_SCENARIOS[scenario][1]


def peer_of(scenario: str) -> tuple[str, str]:
    """(the peer's URI, the session's own) for a session of ``scenario``."""
    return (KIT.B, KIT.A) if side(scenario) == "a" else (KIT.A, KIT.B)


def text_message(intent: str, body: str = "", *, sender: str = KIT.A, receiver: str = KIT.B,
                 protocol: str = NEGOTIATION, timestamp: int | None = NOW,
                 extra: str = "") -> bytes:
    """One framed text message, written by hand (the reproducers' shape)."""
    stamp = "" if timestamp is None else f" (timestamp {timestamp})"
    return frame((f'(CBCL/1.0 (message-id "m-1") (sender {sender}) (receiver {receiver}) '
                  f"(intent {intent}) (protocol {protocol}){extra}{stamp}{body})").encode())


def feed(scenario: str, data: bytes, now: int = NOW, **options: Any) -> list[Event]:
    """The kit's check: ``data`` whole, then one byte at a time, to fresh sessions."""
    events = KIT.drive(KIT.start(scenario, **options), [data], now)
    KIT.drive(KIT.start(scenario, **options), fuzz_cbcl.cut(data, 1), now)
    return events


def refused(scenario: str, data: bytes, now: int = NOW) -> RemoteProtocolError:
    """``data`` is refused with a RemoteProtocolError and a valid NOT-UNDERSTOOD (or none)."""
    session = KIT.start(scenario)
    session.receive_data(data)
    with pytest.raises(RemoteProtocolError) as caught:
        while session.next_event(now=now) is not cbcl.session.NEED_DATA:
            pass
    assert session.state is HandshakeState.ERROR
    KIT.check_not_understood(session.data_to_send(), caught.value.code)
    with pytest.raises(LocalProtocolError):
        session.next_event(now=now)
    session.receive_data(data)
    assert session.data_to_send() == b""
    return caught.value


# --------------------------------------------------------------------------- reproducers


def test_cancel_without_a_body_before_any_handshake() -> None:
    """The issue's bug: pass 2 admits a CANCEL without a body in any protocol, and the
    session reached ``assert type(body) is tuple``."""
    data = (b'\x00\x00\x00\xa8(CBCL/1.0 (message-id "m-1") (sender agent://fuzz/initiator) '
            b"(receiver agent://fuzz/responder) (intent CANCEL) (protocol cbcl-negotiation/v1)"
            b" (timestamp 1764500000000))")
    assert data == text_message("CANCEL")
    refused("responder-idle", data)
    feed("responder-idle", data)


def test_cancel_with_a_string_body_before_any_handshake() -> None:
    refused("responder-idle", text_message("CANCEL", ' (body "bye")'))


@pytest.mark.parametrize("scenario", ["initiator-asked", "initiator-offered",
                                      "initiator-established-text"])
def test_cancel_to_an_initiator(scenario: str) -> None:
    refused(scenario, text_message("CANCEL", sender=KIT.B, receiver=KIT.A,
                                   extra=f' (conversation-id "{KIT.CID}")'))


@pytest.mark.parametrize("scenario", ["responder-unsupported", "responder-agreed",
                                      "responder-established-binary"])
def test_cancel_in_the_middle_of_the_handshake(scenario: str) -> None:
    refused(scenario, text_message("CANCEL", extra=f' (conversation-id "{KIT.CID}")'))


@pytest.mark.parametrize("now", [INT64_MAX + 1, INT64_MAX + 30_000, 2**64, INT64_MIN - 1])
def test_a_now_outside_int64_is_refused_before_anything_changes(now: int) -> None:
    """``now`` is checked for its type only; a message stamped at the edge of int64 is
    fresh, and the session then failed half-way: ``Message`` refused the answer's timestamp
    (ValueError in ``_emit``, the state already ASKED, no answer) and the conversation
    tracker refused ``now`` (TypeError, the frame consumed). Either the invariant holds, or
    the call refuses ``now`` before anything changes and the frame is still there."""
    edge = INT64_MAX if now > 0 else INT64_MIN
    query = text_message("QUERY", f" (body (supports :protocol contract-net/v1 :digest "
                                  f'"{KIT.digest}" :versions (1) :encodings (text) '
                                  f':nonce "{KIT.A_NONCE}"))',
                         extra=f' (conversation-id "{KIT.CID}")', timestamp=edge)
    cfp = KIT.conversation_message("cfp")
    later = frame(replace(cfp, message_id="cn-late", timestamp=edge).canonical().encode())
    for scenario, data in (("responder-idle", query),
                           ("responder-established-text", later)):
        session = KIT.start(scenario)
        before = session.state
        session.receive_data(data)
        got: list[Event] = []
        KIT.pump(session, now, got)  # the invariant, or a refusal before any change
        if session.state is before and not got:  # refused: the frame must still be there
            KIT.pump(session, edge, got)
            assert got or session.state is HandshakeState.ERROR, f"{scenario}: frame lost"


def test_frames_before_a_broken_prefix_come_first_however_the_bytes_are_cut() -> None:
    """A complete frame, then a length over the limit, in one ``receive_data``: the error
    that ``receive_data`` kept was raised before the frame that came first was handled, so
    the peer's Query was lost whole and seen one byte at a time (the outcome depended on
    the chunking)."""
    query = KIT.peer_frames("responder-idle")[0]
    stream = query + b"\xff\xff\xff\xff"
    whole = _outcome("responder-idle", [stream])
    assert _outcome("responder-idle", fuzz_cbcl.cut(stream, 1)) == whole
    assert [type(e).__name__ for e in whole[0]] == ["Query"] and whole[1] == "limit"


def test_every_seed_of_the_session_corpus() -> None:
    """The atheris target's check over its seed corpus (tests/fuzz/corpus/session/)."""
    seeds = sorted((HERE / "fuzz" / "corpus" / "session").iterdir())
    assert 10 <= len(seeds) <= 40
    failures = []
    for path in seeds:
        try:
            KIT.check(path.read_bytes())
        except Exception as exc:
            failures.append(f"{path.name}: {type(exc).__name__}: {exc}")
    assert not failures, "\n".join(failures)


# --------------------------------------------------------------------------- strategies

scenarios = st.sampled_from(SCENARIOS)
#: ``now`` in int64: the recorded time, the skew window's edges, and far past and future.
nows = st.one_of(
    st.sampled_from([n for n in fuzz_cbcl.SESSION_NOWS if INT64_MIN <= n <= INT64_MAX]),
    st.integers(NOW - 31_000, NOW + 31_000),
    st.integers(INT64_MIN, INT64_MAX),
)


@st.composite
def cuts(draw: st.DrawFn, data: bytes) -> list[bytes]:
    """``data`` whole, one byte at a time, or at random points (never an empty piece)."""
    how = draw(st.sampled_from(["whole", "bytes", "random"]))
    if how == "whole":
        return fuzz_cbcl.cut(data, 0)
    if how == "bytes":
        return fuzz_cbcl.cut(data, 1)
    points = sorted(set(draw(st.lists(st.integers(1, max(1, len(data) - 1)), max_size=8))))
    bounds = [0, *[p for p in points if p < len(data)], len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds) if a < b]


# (a) raw bytes, in and out of frames
_SPECIAL = [b"\x00\x00\x00\x00", b"\xff\xff\xff\xff", b"\x00\x10\x00\x01", b"\x00\x00\x00",
            b"\xcbL", b"\x00\x00\x00\x02\xcbL", b"(CBCL/1.0", b"\xc3", b"\xff"]
_TOKENS = st.sampled_from([b"(", b")", b'"', b"\\", b" ", b"CBCL/1.0", b"(body ", b":nonce ",
                           b"agent://fuzz/responder", b"cbcl-negotiation/v1", b"(intent ",
                           b"CANCEL", b"QUERY", b"(supports", b"\xff", b"\x00", b"1"])
raw_chunks = st.one_of(
    st.binary(min_size=1, max_size=64).map(frame),
    st.lists(_TOKENS, min_size=1, max_size=30).map(lambda t: frame(b"".join(t))),
    st.binary(max_size=40).map(lambda b: frame(b"\xcbL" + b)),
    st.sampled_from(_SPECIAL),
    st.binary(min_size=1, max_size=12),
)
raw_streams = st.lists(raw_chunks, min_size=1, max_size=6).map(b"".join)

# (b) cbcl-negotiation/v1 messages
_HEX = "0123456789abcdef"
digests = st.text(_HEX, min_size=64, max_size=64).map(lambda h: "sha256:" + h)
_FIELDS = {  # the fields of each body, in order (spec/negotiation.md §2)
    "supports": ("protocol", "digest", "versions", "encodings", "nonce"),
    "supported": ("protocol", "digest", "version", "encoding", "nonce"),
    "unsupported": ("protocol", "known", "nonce"),
    "offer": ("digest", "descriptor"),
    "accepted": ("protocol", "digest", "version", "encoding"),
    "rejected": ("reason",),
    "finished": ("transcript",),
}
_NAMES = sorted({name for names in _FIELDS.values() for name in names} | {"x", "signature"})
_SIGNED = [(HERE.parent / "descriptors" / f"{name}.signed.cbcl").read_text()
           for name in ("contract-net-v1", "request-v1")]


@st.composite
def signed_documents(draw: st.DrawFn) -> str:
    """The signed contract-net/v1 descriptor the session asked about, with one character
    changed (in its payload or its signature), cut short, or unsigned."""
    document = _SIGNED[0]
    how = draw(st.sampled_from(["change", "change-signature", "cut", "payload"]))
    if how == "payload":
        return KIT.payload.decode()
    if how == "cut":
        return document[:draw(st.integers(1, len(document) - 1))]
    start = document.index("(signatures") if how == "change-signature" else 0
    at = draw(st.integers(start, len(document) - 1))
    return document[:at] + draw(st.sampled_from("A0+/=\\\" ()x")) + document[at + 1:]


def field_values(name: str, transcript: str) -> st.SearchStrategy[Any]:
    """Values of the right type for field ``name`` (and often the right value)."""
    versions = st.lists(st.integers(0, 3) | integers, max_size=3).map(tuple)
    encoding = st.sampled_from([Symbol("text"), Symbol("binary")])
    return {
        "protocol": st.sampled_from([Symbol("contract-net/v1"), Symbol("request/v1")])
        | symbols,
        "digest": st.just(KIT.digest) | digests,
        "versions": st.just((KIT.version,)) | versions,
        "known": st.just(()) | versions,
        "encodings": st.lists(encoding, min_size=1, max_size=3).map(tuple),
        "nonce": st.sampled_from([KIT.A_NONCE, KIT.B_NONCE]) | st.text(_HEX, max_size=70),
        "version": st.just(KIT.version) | integers,
        "encoding": encoding,
        "descriptor": st.sampled_from(_SIGNED) | signed_documents() | strings,
        "reason": st.sampled_from([Symbol(r) for r in sorted(REJECT_CODES)]) | symbols,
        "transcript": st.just(transcript) | digests,
    }[name]


@st.composite
def handshake_bodies(draw: st.DrawFn, transcript: str,
                     expected: tuple[str, ...] = ()) -> tuple[Any, ...]:
    """``(head :field value …)`` from the handshake vocabulary (often what the session
    expects next), with fields of the right type or not, missing, repeated, unknown or out
    of order."""
    heads = st.sampled_from(list(_FIELDS)) | symbols.map(str)
    head = draw(st.sampled_from(expected) | heads if expected else heads)
    pairs: list[tuple[str, Any]] = []
    for name in _FIELDS.get(head, ()):
        pairs.append((name, draw(field_values(name, transcript))))
    for _ in range(draw(st.integers(0, 3))):
        if not pairs:
            break
        index = draw(st.integers(0, len(pairs) - 1))
        edit = draw(st.sampled_from(["drop", "repeat", "wrong-type", "unknown", "swap"]))
        if edit == "drop":
            del pairs[index]
        elif edit == "repeat":
            pairs.insert(index, pairs[index])
        elif edit == "wrong-type":
            pairs[index] = (pairs[index][0], draw(values))
        elif edit == "unknown":
            pairs.insert(index, (draw(st.sampled_from(_NAMES)), draw(values)))
        elif index + 1 < len(pairs):
            pairs[index], pairs[index + 1] = pairs[index + 1], pairs[index]
    body: list[Any] = [Symbol(head)]
    for name, value in pairs:
        body += [Keyword(name), value]
    if draw(st.booleans()) and len(body) > 1:  # the occasional odd tail
        body.append(draw(values))
    return tuple(body)


def clamp(stamp: int) -> int:
    """``stamp`` moved into int64 (a message's timestamp must be)."""
    return min(max(stamp, INT64_MIN), INT64_MAX)


def mostly(draw: st.DrawFn, right: Any, wrong: st.SearchStrategy[Any]) -> Any:
    """``right`` about nine times in ten (and when shrinking), else a drawn wrong value."""
    return draw(wrong) if draw(st.sampled_from(range(10))) == 5 else right


@st.composite
def negotiation_frames(draw: st.DrawFn, scenario: str, session: Any, now: int,
                       number: int = 1) -> bytes:
    """One framed cbcl-negotiation/v1 message for ``session``, of any intent, with a
    body from the handshake vocabulary (or none, a string, an integer) and an envelope that
    is mostly right: each field is wrong one time in ten. Sometimes signed, with the key
    the session trusts or another."""
    peer, me = peer_of(scenario)
    transcript = finished_value(session.transcript_digest, session.peer_role)
    expected = tuple(kind for (state, sender, kind) in TRANSITIONS
                     if state is session.state and sender == session.peer_role
                     and kind != "message")
    odd = st.one_of(st.none(), strings, integers,
                    st.sampled_from(sorted(NOT_UNDERSTOOD_CODES)))
    body = draw(st.sampled_from(["expected", "expected", "any", "odd"]).flatmap(
        lambda how: {"expected": handshake_bodies(transcript, expected),
                     "any": handshake_bodies(transcript), "odd": odd}[how]))
    head = str(body[0]) if type(body) is tuple and body else ""
    any_intent = st.sampled_from([i.value for i in Intent])
    intent = mostly(draw, INTENTS[head], any_intent) if head in INTENTS else draw(any_intent)
    stamp = clamp(draw(st.sampled_from([now, now, now - 30_000, now + 30_000])))
    message = cbcl.Message(
        message_id=mostly(draw, f"fuzz-{number}", ids | st.sampled_from(["cn-cfp"])),
        sender=mostly(draw, peer, st.sampled_from([me]) | uris),
        receiver=mostly(draw, me, st.sampled_from([peer]) | uris),
        intent=intent,
        protocol=mostly(draw, NEGOTIATION, st.sampled_from(["contract-net/v1", "request/v1"])
                        | symbols),
        conversation_id=mostly(draw, KIT.CID, st.none() | ids),
        in_reply_to=draw(st.none() | ids),
        timestamp=mostly(draw, stamp, st.none() | st.integers(INT64_MIN, INT64_MAX)),
        body=body,
    )
    signing = draw(st.sampled_from(["no", "trusted", "trusted", "stranger"]))
    if signing != "no":
        key_id = KIT.KEY_ID if signing == "trusted" else "stranger"
        message = sign_message(message, KIT.key, key_id)
    return frame(message.canonical().encode())


# (c) mutations of the recorded handshake


@st.composite
def mutated_transcripts(draw: st.DrawFn, scenario: str) -> bytes:
    """What the real peer sends next, changed: frames dropped, repeated, swapped or
    spliced from another scenario; bytes flipped, cut, inserted or spliced, in the stream
    or inside one frame whose prefix is then fixed up."""
    frames = list(KIT.peer_frames(scenario))
    donors = [f for name in SCENARIOS for f in KIT.peer_frames(name)]
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from(["prefix", "drop", "repeat", "swap", "splice-frame", "flip",
                                   "cut", "insert", "splice-bytes", "reframe"]))
        frames = [f for f in frames if f]
        if not frames:
            frames.append(draw(st.sampled_from(donors)))
            continue
        index = draw(st.integers(0, len(frames) - 1))
        target = frames[index]
        at = draw(st.integers(0, len(target) - 1))
        if op == "prefix":  # the peer stops there (then, often, the stream ends)
            del frames[index + 1:]
        elif op == "drop":
            del frames[index]
        elif op == "repeat":
            frames.insert(index, target)
        elif op == "swap" and index + 1 < len(frames):
            frames[index], frames[index + 1] = frames[index + 1], frames[index]
        elif op == "splice-frame":
            frames.insert(index, draw(st.sampled_from(donors)))
        elif op == "flip":
            bit = 1 << draw(st.integers(0, 7))
            frames[index] = target[:at] + bytes([target[at] ^ bit]) + target[at + 1:]
        elif op == "cut":
            frames[index:] = [target[:at]]
        elif op == "insert":
            frames[index] = target[:at] + draw(_TOKENS | st.binary(max_size=4)) + target[at:]
        elif op == "splice-bytes":
            donor = draw(st.sampled_from(donors))
            start = draw(st.integers(0, len(donor)))
            frames[index] = target[:at] + donor[start:start + draw(st.integers(1, 200))] \
                + target[at:]
        else:  # change the payload, keep the frame whole
            payload = bytearray(target[4:])
            if payload:
                where = draw(st.integers(0, len(payload) - 1))
                change = draw(st.sampled_from(["flip", "delete", "insert", "truncate"]))
                if change == "flip":
                    payload[where] ^= 1 << draw(st.integers(0, 7))
                elif change == "delete":
                    del payload[where:where + draw(st.integers(1, 8))]
                elif change == "insert":
                    payload[where:where] = draw(_TOKENS)
                else:
                    del payload[where:]
            if payload:
                frames[index] = frame(bytes(payload))
    return b"".join(frames)


# (d) contract-net/v1 messages after ESTABLISHED

_CONVERSATION = ("cfp", "propose", "accept", "inform")


@st.composite
def protocol_frames(draw: st.DrawFn, scenario: str, now: int) -> bytes:
    """One framed message of the agreed protocol (or of the other one the initiator
    knows), in the agreed encoding or the other, with fields right or wrong."""
    peer, me = peer_of(scenario)
    base = draw(st.one_of(
        st.sampled_from(_CONVERSATION).map(KIT.conversation_message),
        messages.map(lambda m: replace(m, protocol=Symbol("contract-net/v1"))),
    ))
    changes: dict[str, Any] = {}
    if draw(st.booleans()):
        changes.update(sender=URI(peer), receiver=URI(me))
    if draw(st.booleans()):
        changes["timestamp"] = draw(st.sampled_from([clamp(now), clamp(now + 30_001)])
                                    | st.none())
    if draw(st.booleans()):
        changes["message_id"] = draw(ids)
    if draw(st.booleans()):
        changes["in_reply_to"] = draw(st.none() | st.sampled_from(
            [f"cn-{w}" for w in _CONVERSATION]))
    if draw(st.booleans()):
        changes["intent"] = draw(st.sampled_from(list(Intent)))
    if draw(st.booleans()):
        changes["body"] = draw(st.none() | values)
    if draw(st.integers(0, 5)) == 0:
        changes["protocol"] = Symbol("request/v1")
    message = replace(base, **changes)
    binary = draw(st.booleans())
    if binary:
        try:
            return frame(cbcl.Encoder(KIT.initiator_registry).encode(message))
        except cbcl.CBCLError:
            pass
    return frame(message.canonical().encode())


# --------------------------------------------------------------------------- properties


def share(parts: int) -> settings:
    """The profile's examples, split between ``parts`` (parametrized) tests."""
    return settings(max_examples=max(5, settings().max_examples // parts))


def _run(data: st.DataObject, scenario: str, stream: bytes, now: int | None = None) -> None:
    session = KIT.start(scenario, defer_work=data.draw(st.booleans(), label="defer_work"))
    now = data.draw(nows, label="now") if now is None else now
    pieces = data.draw(cuts(stream), label="pieces")
    got = KIT.drive(session, pieces, now, eof=data.draw(st.booleans(), label="eof"))
    for item in got:  # what the inputs reached (pytest --hypothesis-show-statistics)
        event(type(item).__name__)
    event(f"ends in {session.state.value}")


@given(scenarios, raw_streams, st.data())
def test_raw_frames(scenario: str, stream: bytes, data: st.DataObject) -> None:
    _run(data, scenario, stream)


@pytest.mark.slow
@pytest.mark.parametrize("scenario", SCENARIOS)
@share(5)
@given(data=st.data())
def test_negotiation_messages(scenario: str, data: st.DataObject) -> None:
    now = data.draw(nows, label="now")
    session = KIT.start(scenario)  # to draw from (its transcript); _run starts its own
    count = data.draw(st.integers(1, 4), label="count")
    stream = b"".join(data.draw(negotiation_frames(scenario, session, now, number), label="frame")
                      for number in range(count))
    _run(data, scenario, stream, now)


@pytest.mark.parametrize("scenario", SCENARIOS)
@share(5)
@given(data=st.data())
def test_mutated_transcripts(scenario: str, data: st.DataObject) -> None:
    _run(data, scenario, data.draw(mutated_transcripts(scenario), label="stream"))


@pytest.mark.parametrize("scenario", ESTABLISHED)
@share(4)
@given(data=st.data())
def test_protocol_messages_after_established(scenario: str, data: st.DataObject) -> None:
    now = data.draw(nows | st.just(NOW), label="now")
    frames = data.draw(st.lists(protocol_frames(scenario, now), min_size=1, max_size=4),
                       label="frames")
    if data.draw(st.booleans(), label="after the real peer"):
        frames = KIT.peer_frames(scenario)[:1] + frames
    _run(data, scenario, b"".join(frames), now)


def _outcome(scenario: str,
             pieces: list[bytes]) -> tuple[list[object], str | None, HandshakeState]:
    session = KIT.start(scenario)
    events: list[object] = []
    code: str | None = None
    for piece in pieces:
        if not piece:
            continue  # b"" is the end of the stream, not a piece of it
        session.receive_data(piece)
        try:
            while (got := session.next_event(now=NOW)) is not cbcl.session.NEED_DATA:
                events.append(got)
        except RemoteProtocolError as exc:
            code = exc.code
            break
    return events, code, session.state


@share(2)
@given(scenarios, st.data())
def test_chunking_does_not_change_the_outcome(scenario: str, data: st.DataObject) -> None:
    """Sans-io: how the bytes are cut changes nothing — the same events, the same error —
    as long as no more frames arrive at once than may wait (``max_pending_frames``)."""
    stream = data.draw(mutated_transcripts(scenario) | raw_streams, label="stream")
    frames = 0
    rest = stream
    while len(rest) >= 4 and 0 < (size := int.from_bytes(rest[:4], "big")) <= len(rest) - 4:
        frames, rest = frames + 1, rest[4 + size:]
    if frames > 16:
        return
    whole = _outcome(scenario, [stream])
    assert _outcome(scenario, fuzz_cbcl.cut(stream, 1)) == whole
    assert _outcome(scenario, data.draw(cuts(stream), label="pieces")) == whole
