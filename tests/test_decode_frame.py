"""A whole binary frame in one C call (``cbcl._native.decode_frame``, the first thing
:meth:`cbcl.Decoder.decode` tries) against the Python decoder, the reference: on every
frame it gives the decoder's message or ``None`` (never another message, never an error),
and the decoder's outcome - message or error, its text and offset - does not depend on it.

Tests internals: the C call and the decoder's frame plans are private.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from cbcl_bench import MIXED_PROTOCOL, PROTOCOLS, find_descriptors, load_registry, varied
from hypothesis import given, settings, strategies as st

import cbcl
from cbcl import CBCLError, Decoder, Encoder, Intent, Limits, Registry
from cbcl.binary import _codec
from cbcl.binary._codec import _shape_refusal, envelope_limits, frame_shapes

pytestmark = pytest.mark.skipif(not _codec.SPEEDUPS, reason="cbcl._native is not built here")
if _codec.SPEEDUPS:  # (the functions _codec calls as _decode_frame_c and _frame_envelope_c)
    from cbcl._native import decode_frame, frame_envelope

REGISTRY = load_registry(find_descriptors())
ENCODER = Encoder(REGISTRY)
MESSAGES = [message for protocol in PROTOCOLS for size in ("small", "medium")
            for message in varied(protocol, size, 30, seed=11)]
FRAMES = [ENCODER.encode(message) for message in MESSAGES]


def warm(registry: Registry = REGISTRY, limits: Limits | None = None) -> Decoder:
    """A decoder that has a frame plan for every loaded protocol."""
    decoder = Decoder(registry, limits=limits)
    for protocol in registry.protocols():
        decoder._table(bytes.fromhex(protocol.digest[7:]), 4)
    return decoder


# (kept across tests: a frame naming an unknown digest empties its plans, which decoding
# makes again, so the tests that need the C call to succeed take a warm() of their own)
WARM = warm()
PURE = Decoder(REGISTRY, pure_python=True)


def in_c(decoder: Decoder, frame: bytes) -> Any:
    """decode_frame's message or None, or, for a body the grammar refuses (which it
    raises), the error as :func:`outcome` gives it."""
    state = decoder._frame_state
    assert state is not None, "a decoder without the C whole-frame call"
    try:
        return decode_frame(frame, state)
    except CBCLError as error:
        return type(error), error.message, error.offset


def outcome(decoder: Decoder, frame: bytes) -> Any:
    try:
        return decoder.decode(frame)
    except CBCLError as error:
        return type(error), error.message, error.offset


def test_every_corpus_frame_is_decoded_whole_in_c() -> None:
    decoder = warm()
    for frame, message in zip(FRAMES, MESSAGES, strict=True):
        found = in_c(decoder, frame)
        protocol = REGISTRY.get(message.protocol)
        if protocol is not None and protocol.constraints is not None:
            # (the C tier serves no protocol with constraints: the Python path applies them)
            assert found is None and decoder.decode(frame) == message
            continue
        assert found == message
        for field in dataclasses.fields(cbcl.Message):
            assert type(getattr(found, field.name)) is type(getattr(message, field.name))


def test_a_fresh_decoder_declines_until_its_plan_is_made() -> None:
    decoder = Decoder(REGISTRY)
    assert in_c(decoder, FRAMES[0]) is None
    assert decoder.decode(FRAMES[0]) == MESSAGES[0]  # the Python path makes the plan
    assert in_c(decoder, FRAMES[0]) == MESSAGES[0]


def test_the_one_shot_decode_reaches_the_c_call(monkeypatch: pytest.MonkeyPatch) -> None:
    tiers: list[bytes] = []
    real = Decoder._decode_tiers

    def spy(self: Decoder, data: bytes) -> Any:
        tiers.append(data)
        return real(self, data)

    monkeypatch.setattr(Decoder, "_decode_tiers", spy)
    assert cbcl.decode(FRAMES[1], registry=REGISTRY) == MESSAGES[1]
    assert cbcl.decode(FRAMES[1], registry=REGISTRY) == MESSAGES[1]
    assert len(tiers) <= 1  # (the shared memos hold the plan after one call: C decodes it)


@settings(max_examples=400, deadline=None)
@given(index=st.integers(0, len(FRAMES) - 1), data=st.data())
def test_damaged_frames_agree(index: int, data: st.DataObject) -> None:
    frame = bytearray(FRAMES[index])
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(frame) - 1))
        op = data.draw(st.sampled_from(["flip", "cut", "insert", "delete"]))
        if op == "flip":
            frame[at] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "cut":
            del frame[at:]
            if not frame:
                break
        elif op == "insert":
            frame[at:at] = data.draw(st.binary(min_size=1, max_size=4))
        else:
            del frame[at]
            if not frame:
                break
    damaged = bytes(frame)
    expected = outcome(PURE, damaged)
    found = in_c(WARM, damaged)
    assert found is None or found == expected
    assert outcome(WARM, damaged) == expected


def test_a_replaced_protocol_is_left_to_the_python_path() -> None:
    registry = load_registry(find_descriptors())
    decoder = warm(registry)
    message = MESSAGES[0]
    frame = Encoder(registry).encode(message)
    assert in_c(decoder, frame) == message
    served = registry._protocols_by_id()  # (the dict the C tiers read)
    protocol = served[message.protocol]
    served[message.protocol] = dataclasses.replace(protocol)  # another object
    assert in_c(decoder, frame) is None
    served[message.protocol] = protocol
    assert in_c(decoder, frame) == message


def test_frames_of_protocols_in_turn_find_their_own_plans() -> None:
    """decode_frame keeps the last frame's plan (by its table's digest): frames of one
    protocol after another's, and back, each get their own."""
    decoder = warm()
    firsts: dict[object, int] = {}
    for index, message in enumerate(MESSAGES):
        firsts.setdefault(message.protocol, index)
    picks = list(firsts.values())
    assert len(picks) >= 2
    for index in picks + picks[::-1] + picks:
        assert in_c(decoder, FRAMES[index]) == MESSAGES[index] or \
            REGISTRY.get(MESSAGES[index].protocol).constraints is not None  # type: ignore[union-attr]


def test_a_table_atom_written_in_full_is_refused() -> None:
    """An atom the frame's table has a code for, written in full instead (a symbol, a
    keyword): C declines it (whatever its hash) and the decoder gives the Python
    reference's error; by its code, the same body is decoded in C."""
    import msgpack

    from cbcl.binary._codec import SymbolTable
    from cbcl.core._vocabulary import CODE_KEYWORD, CODE_LPAR, CODE_RPAR, CODE_SYMBOL

    decoder = warm()
    table = SymbolTable.of(REGISTRY.get(MIXED_PROTOCOL.replace("-", "/")))  # type: ignore[arg-type]
    atoms = {str(atom): atom for atom in table.codes}

    def frame(head: list[Any], key: list[Any]) -> bytes:
        body = [CODE_LPAR, *head, *key, "x", table.codes[atoms["rows"]], CODE_LPAR, CODE_RPAR,
                CODE_RPAR]
        return b"\xcbL\x01\x00" + table.digest + b"".join(
            msgpack.packb(token) for token in [3, 32, "m", "agent://a", "agent://b", *body])

    head, key = [table.codes[atoms["table"]]], [table.codes[atoms["id"]]]
    good = in_c(decoder, frame(head, key))
    assert good is not None and good.body == (atoms["table"], atoms["id"], "x", atoms["rows"],
                                              ())
    for damaged in (frame([CODE_SYMBOL, "table"], key), frame(head, [CODE_KEYWORD, "id"])):
        assert in_c(decoder, damaged) is None
        expected = outcome(PURE, damaged)
        assert type(expected) is tuple and expected[0] is cbcl.MalformedError
        assert outcome(decoder, damaged) == expected


def test_short_ids_and_signatures() -> None:
    message = MESSAGES[0]
    protocol = REGISTRY.get(message.protocol)
    assert protocol is not None
    digest = protocol.digest
    short = Encoder(REGISTRY, short_ids={7: digest}).encode(message)
    decoder = Decoder(REGISTRY, short_ids={7: digest})
    assert decoder.decode(short) == message
    assert in_c(decoder, short) is None  # the header the Python path reads
    signed = dataclasses.replace(message, signature=cbcl.trust.Signature("key-1", "c2ln"))
    assert in_c(warm(), ENCODER.encode(signed)) == signed


def test_ungoverned_intents_and_missing_bodies_are_left_to_the_python_path() -> None:
    message = MESSAGES[0]
    for changed in (dataclasses.replace(message, intent=Intent.NOT_UNDERSTOOD, body="why"),
                    dataclasses.replace(message, intent=Intent.CANCEL, body=None)):
        frame = ENCODER.encode(changed)
        assert in_c(WARM, frame) is None
        assert WARM.decode(frame) == changed
    # (the encoder refuses to write it: the body's bit cleared, its tokens cut, by hand)
    envelope = frame_envelope(FRAMES[0], 36, _codec.INTENTS, {}, 10**6, 8)
    assert envelope is not None
    offset = envelope[-1]
    assert FRAMES[0][37] & _codec.HAS_BODY
    bodiless = FRAMES[0][:37] + bytes([FRAMES[0][37] & ~_codec.HAS_BODY]) + \
        FRAMES[0][38:offset]
    assert in_c(WARM, bodiless) is None
    assert isinstance(outcome(WARM, bodiless), tuple)


def test_the_envelope_shapes_match_envelope_limits() -> None:
    """frame_shapes and the two name checks decode_frame makes decide exactly as
    envelope_limits, for every set of fields, intent and limit at and around the edge."""
    protocol = REGISTRY.get(MESSAGES[0].protocol)
    assert protocol is not None
    grid = [Limits(max_depth=d) for d in (1, 2, 3)] + \
        [Limits(max_list_items=i) for i in (6, 7, 8, 11, 12)] + \
        [Limits(max_nodes=n) for n in (16, 20, 24, 30, 36, 40)] + \
        [Limits(max_name_chars=c) for c in (8, 10, 11, 14, 15, 16, 17, 18, 30)]
    _codec._ENVELOPE_WITHIN_LIMITS.clear()
    for limits in grid:
        shapes = frame_shapes(limits)
        for present in range(64):
            for intent in Intent:
                within = bool(shapes[present]) and \
                    len(intent.value) <= limits.max_name_chars and \
                    len(protocol.id) <= limits.max_name_chars
                try:
                    envelope_limits(limits, protocol, intent, present, lambda at: None)
                except cbcl.LimitError:
                    assert not within, (limits, present, intent)
                else:
                    assert within, (limits, present, intent)
            assert shapes[present] == (_shape_refusal(limits, present) is None and
                                       _codec._SHAPE_NAMES[present] <= limits.max_name_chars)


def test_name_limits_at_the_edge() -> None:
    message = MESSAGES[0]
    frame = FRAMES[0]
    longest = max(len(message.protocol), len(message.intent.value), len("message-id"),
                  len("CBCL/1.0"), len("conversation-id") if message.conversation_id else 0,
                  len("in-reply-to") if message.in_reply_to else 0)
    body_names = [len(str.__str__(atom)) for atom in _atoms(message.body)]
    at = max(longest, *body_names)
    assert in_c(warm(limits=Limits(max_name_chars=at)), frame) == message
    decoder = warm(limits=Limits(max_name_chars=at - 1))
    assert in_c(decoder, frame) is None
    assert outcome(decoder, frame)[0] is cbcl.LimitError


def test_the_atom_memo_keeps_no_limit() -> None:
    """A symbol or keyword the C memo holds, read under a larger name limit, is still
    refused under a smaller one: the limit is checked before the memo is (N accepted,
    N+1 refused, in both orders)."""
    for name in ("issue-19-memo-symbol-abcdefgh", "issue-19-memo-keyword-abcdefg"):
        body = (cbcl.Symbol("echo"), cbcl.Symbol(name) if "symbol" in name
                else cbcl.Keyword(name))
        message = dataclasses.replace(MESSAGES[0], intent=Intent.INFORM,
                                      protocol=cbcl.Symbol("any/v1"), body=body)
        registry = load_registry(find_descriptors())
        registry.load(b'(protocol-descriptor (id any/v1) (version 1) (intents INFORM) '
                      b'(grammar "body: value"))', allow_unsigned=True)
        frame = Encoder(registry).encode(message)
        wide, narrow = (warm(registry, Limits(max_name_chars=n))
                        for n in (len(name), len(name) - 1))
        for _ in range(2):  # the second time, the memo holds it
            assert in_c(wide, frame) == message
            assert in_c(narrow, frame) is None
            assert outcome(narrow, frame)[0] is cbcl.LimitError
            assert wide.decode(frame) == message


def _atoms(value: Any) -> list[Any]:
    if type(value) is tuple:
        return [atom for item in value for atom in _atoms(item)]
    return [value] if type(value) in (cbcl.Symbol, cbcl.Keyword) else []


def test_unknown_digests_rebuild_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A frame naming a digest no loaded protocol has costs a lookup, not a symbol table
    per loaded protocol; a protocol loaded later is found (and only its table made)."""
    registry = load_registry(find_descriptors())
    decoder = warm(registry)
    made: list[Any] = []
    real = _codec.SymbolTable.of

    def counting(protocol: Any) -> Any:
        made.append(protocol)
        return real(protocol)

    monkeypatch.setattr(_codec.SymbolTable, "of", counting)
    unknown = FRAMES[0][:4] + bytes(32) + FRAMES[0][36:]
    for _ in range(20):
        with pytest.raises(cbcl.UnknownProtocolError):
            decoder.decode(unknown)
    assert made == []
    assert decoder.decode(FRAMES[0]) == MESSAGES[0]
    extra = registry.load(b'(protocol-descriptor (id extra/v1) (version 1) (intents INFORM) '
                          b'(grammar "body: value"))', allow_unsigned=True)
    message = dataclasses.replace(MESSAGES[0], intent=Intent.INFORM, protocol=extra.id)
    frame = Encoder(registry).encode(message)
    made.clear()  # (the encoder's table)
    assert decoder.decode(frame) == message
    assert made == [extra]
    assert decoder.decode(FRAMES[0]) == MESSAGES[0]


def fields_of(state: Any) -> dict[str, Any]:
    """A FrameState's fields by name (what its constructor takes)."""
    names = [name for name in dir(type(state)) if not name.startswith("_")]
    return {name: getattr(state, name) for name in names}


def test_misshapen_state_raises_type_error() -> None:
    state = WARM._frame_state
    assert state is not None
    fields = fields_of(state)
    # (the private C entry, called wrongly on purpose: typed Any)
    decode_frame_c: Any = vars(_codec)["_decode_frame_c"]
    with pytest.raises(TypeError, match="FrameState"):
        decode_frame_c(FRAMES[0], tuple(fields.values()))
    with pytest.raises(TypeError):
        decode_frame_c(bytearray(FRAMES[0]), state)
    with pytest.raises(TypeError):
        decode_frame_c(FRAMES[0])
    FrameState: Any = type(state)  # (its constructor is called wrongly on purpose)
    assert decode_frame_c(FRAMES[0], FrameState(**fields)) == MESSAGES[0]
    with pytest.raises(TypeError, match="keyword"):
        FrameState(*fields.values())
    for name in fields:  # every field is required
        with pytest.raises(TypeError, match=name):
            FrameState(**{k: v for k, v in fields.items() if k != name})
    for name, bad in [("frame_plans", ()), ("protocols", []), ("shapes", b"\1" * 63),
                      ("envelope_nodes", (0,) * 63), ("attributes", ("message_id",)),
                      ("intent_lengths", (1,)), ("keep", None), ("message", "Message"),
                      ("max_nodes", 1.5), ("uris", {1: 2}.items())]:
        with pytest.raises(TypeError):
            FrameState(**{**fields, name: bad})


def test_a_frame_state_names_what_decode_frame_reads() -> None:
    """The fields are the decoder's own memos, its registry's protocols and its limits,
    by name, and read-only."""
    decoder = Decoder(REGISTRY, limits=Limits(max_depth=9, max_nodes=777))
    state = decoder._frame_state
    assert state is not None
    memos, limits = decoder._memos, decoder.limits
    assert state.frame_plans is memos.frame_plans
    assert state.uris is memos.uris and state.caches is memos.caches
    assert state.keep == memos.keep and state.memo_entries == memos.entries
    assert state.protocols is REGISTRY._protocols_by_id()
    assert state.shapes == frame_shapes(limits)
    assert (state.max_message_bytes, state.max_string_bytes, state.max_body_depth,
            state.max_list_items, state.max_name_chars, state.max_nodes) == \
        (limits.max_message_bytes, limits.max_string_bytes, limits.max_depth - 2,
         limits.max_list_items, limits.max_name_chars, limits.max_nodes)
    assert state.message is cbcl.Message and state.signature is vars(_codec)["Signature"]
    assert state.symbol is cbcl.Symbol and state.intents == tuple(Intent)
    assert state.attributes == tuple(f.name for f in dataclasses.fields(cbcl.Message))
    for name in fields_of(state):
        with pytest.raises(AttributeError):
            setattr(state, name, None)
