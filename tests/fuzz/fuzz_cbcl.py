"""Atheris harnesses: any input gives a result or a :class:`cbcl.CBCLError`, nothing else.

    pip install '.[fuzz]'
    python tests/fuzz/fuzz_cbcl.py TARGET [libFuzzer options] [corpus dirs]
    python tests/fuzz/fuzz_cbcl.py reader -max_total_time=180 tests/fuzz/corpus/reader

TARGET is one of ``reader``, ``envelope``, ``body``, ``decoder``, ``descriptor``,
``grammar``, ``session``, ``diff``, ``export``. Any exception other than ``CBCLError`` (and the
``TypeError``/``ValueError`` an API documents for arguments of the wrong type, which a
harness never passes) is a finding: libFuzzer stops and writes the input to ``crash-*``.
The seed corpus under ``tests/fuzz/corpus/<target>/`` is built from the shipped examples,
``spec/vectors`` and the descriptors by ``tests/fuzz/make_corpus.py``; for ``session``,
from the frames of a real handshake (:class:`SessionKit` records them). Without atheris,
``--replay FILE…`` runs the same check on saved inputs (used by the smoke test).

``diff`` compares two descriptors (the input cut at its first NUL byte; without one, the
input with itself) in ``full`` mode under small :class:`CompatLimits`; ``export`` exports a
descriptor in the format its first byte chooses (and with or without its schema), and
draws two messages of it, under small :class:`LLMLimits` — the analyses of issue 29, which
must answer within their budgets.

``session`` feeds a :class:`cbcl.Session` (responder or initiator, in one of the handshake
states of :data:`SESSION_SCENARIOS`) a byte stream: its input is one byte choosing the
scenario, one choosing ``now`` (:data:`SESSION_NOWS`), one choosing how the stream is cut
(bits 0-5: 0 whole, else chunks of that many bytes; bit 6: ``defer_work``; bit 7: then the
end of the stream), and the stream. The session must give only events, ``NEED_DATA`` or a
``RemoteProtocolError`` (then at most one NOT-UNDERSTOOD waits to be sent, and nothing
ever again); a ``now`` outside int64 may also be refused, before anything changes.

Tests internals too: the careful paths and C twins it compares are private (``_api``,
``_codec``, ``_reader``, ``_envelope``), as is the grammar compiler.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (only for annotations: the harness imports cbcl under atheris's eye)
    from cbcl import Message, Registry, Session
    from cbcl.session import Event

ROOT = Path(__file__).resolve().parent.parent.parent
DESCRIPTORS = ("task-assignment-v1", "contract-net-v1", "request-v1", "canon-a-v1")
_INTENTS = ("PROPOSE", "INFORM", "REQUEST", "CFP", "AGREE", "REFUSE", "FAILURE", "QUERY")


# --------------------------------------------------------------------------- session

SESSION_NOW = 1_764_500_000_000
_I64 = 2**63
#: The ``now`` the ``session`` target passes, chosen by its input's second byte: the
#: recorded handshake's own time, the edges of the skew window, and far past and future
#: ints (in and out of int64).
SESSION_NOWS = (SESSION_NOW, SESSION_NOW + 1, SESSION_NOW - 1, SESSION_NOW + 30_000,
                SESSION_NOW - 30_001, SESSION_NOW + 86_400_000, 0, -1, _I64 - 1, -_I64,
                _I64 - 1 + 30_000, -_I64 - 30_000, 2**64, -(10**30))

# Flows: the steps of a real handshake and conversation between an initiator ("a") and a
# responder ("b"): ``send`` steps make one side send, ``recv`` steps deliver to a side
# everything the other produced. "offer": B does not know contract-net/v1, A offers the
# signed descriptor; "supported": B holds it already.
_OFFER_FLOW = (("a", "query"), ("b", "recv"), ("a", "recv"), ("a", "offer"), ("b", "recv"),
               ("a", "recv"), ("b", "recv"), ("a", "recv"), ("a", "cfp"), ("b", "recv"),
               ("b", "propose"), ("a", "recv"), ("a", "accept"), ("b", "recv"),
               ("b", "inform"), ("a", "recv"))
_SUPPORTED_FLOW = (("a", "query"), ("b", "recv"), ("a", "recv"), ("b", "recv"), ("a", "recv"),
                   ("a", "cfp"), ("b", "recv"), ("b", "propose"), ("a", "recv"),
                   ("a", "accept"), ("b", "recv"), ("b", "inform"), ("a", "recv"))
#: flow name -> (steps, the encodings A asks for, whether B holds the protocol already)
SESSION_FLOWS = {
    "offer-text": (_OFFER_FLOW, ("text",), False),
    "offer-binary": (_OFFER_FLOW, ("binary", "text"), False),
    "supported-text": (_SUPPORTED_FLOW, ("text", "binary"), True),
}
#: name -> (flow, side, the number of the flow's steps taken before the fuzzed stream).
SESSION_SCENARIOS = {
    "responder-idle": ("offer-text", "b", 0),
    "responder-idle-binary": ("offer-binary", "b", 0),
    "responder-idle-knows": ("supported-text", "b", 0),
    "initiator-idle": ("offer-text", "a", 0),
    "initiator-asked": ("offer-binary", "a", 1),
    "responder-unsupported": ("offer-text", "b", 2),
    "initiator-offered": ("offer-binary", "a", 4),
    "responder-agreed": ("supported-text", "b", 2),
    "initiator-confirming": ("offer-text", "a", 6),
    "responder-established-text": ("offer-text", "b", 11),
    "initiator-established-text": ("offer-text", "a", 9),
    "responder-established-binary": ("offer-binary", "b", 11),
    "initiator-established-binary": ("offer-binary", "a", 9),
}

def split_frames(data: bytes) -> list[bytes]:
    """The payloads of a stream of whole length-prefixed frames (AssertionError if not)."""
    frames = []
    while data:
        assert len(data) >= 4, f"a torn length prefix: {data!r}"
        size = int.from_bytes(data[:4], "big")
        assert 0 < size <= len(data) - 4, f"a torn frame: {data[:60]!r}"
        frames.append(data[4:4 + size])
        data = data[4 + size:]
    return frames


def cut(data: bytes, size: int) -> list[bytes]:
    """``data`` in pieces of ``size`` bytes (0: whole); never an empty piece."""
    if not size:
        return [data] if data else []
    return [data[i:i + size] for i in range(0, len(data), size)]


class SessionKit:
    """Sessions in the handshake states of :data:`SESSION_SCENARIOS`, the frames a real peer
    sends them next, and the session invariant as a check (:meth:`drive`). Shared by the
    ``session`` target, ``make_corpus.py`` and ``tests/test_session_fuzz.py``. Everything is
    deterministic: fixed nonces, a fixed clock, the example key (Ed25519 signs
    deterministically), so a recorded frame is valid for a session started again."""

    A = "agent://fuzz/initiator"
    B = "agent://fuzz/responder"
    A_NONCE = "a0" * 16
    B_NONCE = "b1" * 16
    NOW = SESSION_NOW
    CID = "negotiation-" + A_NONCE
    KEY_ID = "cbcl-example"

    def __init__(self) -> None:
        import hashlib
        import inspect
        import typing

        import cbcl
        from cbcl import TrustStore, load_private_key
        from cbcl.descriptor import read_descriptor
        from cbcl.session import _session
        from cbcl.trust import read_signed_descriptor_unverified

        self.cbcl = cbcl
        self.S = _session
        here = ROOT / "descriptors"
        self.key = load_private_key((here / "keys" / "cbcl-example.key").read_bytes())
        self.store = TrustStore({self.KEY_ID: self.key.public_key()})
        self.signed = (here / "contract-net-v1.signed.cbcl").read_bytes()
        self.payload = read_signed_descriptor_unverified(self.signed).payload
        self.digest = "sha256:" + hashlib.sha256(self.payload).hexdigest()
        #: contract-net/v1's shipped version (2 since it is built from its declaration).
        self.version = read_descriptor(self.payload).version
        # A knows two protocols; it never loads anything from its peer, so one registry
        # serves every initiator.
        self.initiator_registry = self._registry()
        for name in ("contract-net-v1", "request-v1"):
            self.initiator_registry.load((here / f"{name}.signed.cbcl").read_bytes(),
                                         now=self.NOW)
        self.events = typing.get_args(_session.Event)
        self.need_work = getattr(_session, "NEED_WORK", None)
        self.can_defer = "defer_work" in inspect.signature(cbcl.Session).parameters
        self.negotiation = _session.negotiation_registry()
        self._recorded: dict[str, list[tuple[str, int, bytes]]] = {}

    def _registry(self) -> Registry:
        return self.cbcl.Registry(trust=self.store, disk_cache=False, isolate=False)

    def _pair(self, flow: str, defer_work: bool) -> tuple[Session, Session]:
        _, encodings, knows = SESSION_FLOWS[flow]
        # (a Session without defer_work is not passed it)
        options: dict[str, Any] = {"defer_work": True} if defer_work and self.can_defer else {}
        a = self.cbcl.Session("initiator", registry=self.initiator_registry, me=self.A,
                              peer=self.B, encodings=encodings, nonce=self.A_NONCE,
                              signing_key=(self.KEY_ID, self.key),
                              require_signed_finished=True)
        registry = self._registry()  # B loads offers: a fresh registry every time
        if knows:
            registry.load(self.signed, now=self.NOW)
        b = self.cbcl.Session("responder", registry=registry, me=self.B, nonce=self.B_NONCE,
                              signing_key=(self.KEY_ID, self.key),
                              require_signed_finished=True, **options)
        return a, b

    def conversation_message(self, what: str) -> Message:
        """One message of the contract-net/v1 conversation the flows run (A is the
        manager); ``timestamp`` is left for ``send`` to fill in."""
        cbcl = self.cbcl
        a_to_b = what in ("cfp", "accept")
        intent, body = {
            "cfp": ("CFP", '(cfp :task (task :id "t-1" :action render-video :params '
                           '(:resolution "1080p" :frames 2400 :codec h264)) '
                           ':deadline 1764503600000)'),
            "propose": ("PROPOSE", '(proposal :task-id "t-1" :bid (bid :price 12.50 '
                                   ':currency EUR :eta 1800000) :valid-until 1764501000000)'),
            "accept": ("ACCEPT", '(accept-proposal :task-id "t-1")'),
            "inform": ("INFORM", '(inform-done :task-id "t-1" :result (artifact :uri '
                                 's3://renders/t-1.mp4 :bytes 734003200))'),
        }[what]
        replies = {"propose": "cn-cfp", "accept": "cn-propose", "inform": "cn-accept"}
        message: Message = cbcl.Message(
            message_id=f"cn-{what}", sender=self.A if a_to_b else self.B,
            receiver=self.B if a_to_b else self.A, intent=intent, protocol="contract-net/v1",
            conversation_id="job-1", in_reply_to=replies.get(what), body=cbcl.read(body))
        return message

    def _run(self, flow: str, stop: int | None, defer_work: bool = False,
             record: list[tuple[str, int, bytes]] | None = None) -> tuple[Session, Session]:
        """Take the first ``stop`` steps of ``flow`` (all: ``None``); with ``record``, note
        every delivery as ``(side, step, bytes)``."""
        S = self.S
        a, b = self._pair(flow, defer_work)
        sides = {"a": a, "b": b}
        inbox: dict[str, bytearray] = {"a": bytearray(), "b": bytearray()}
        steps = SESSION_FLOWS[flow][0]
        for number, (side, what) in enumerate(steps[:stop]):
            me, other = sides[side], "b" if side == "a" else "a"
            if what == "recv":
                data = bytes(inbox[side])
                inbox[side].clear()
                if record is not None:
                    record.append((side, number, data))
                me.receive_data(data)
                while (event := me.next_event(now=self.NOW)) is not S.NEED_DATA:
                    if event is self.need_work:
                        work = me.pending_work
                        assert work is not None, "NEED_WORK without pending work"
                        me.complete_work(work.run())
                inbox[other] += me.data_to_send()
                continue
            if what == "query":
                event = S.Query("contract-net/v1", self.digest, (self.version,),
                                SESSION_FLOWS[flow][1])
            elif what == "offer":
                event = S.Offer(self.signed)
            else:
                event = S.ProtocolMessage(self.conversation_message(what))
            inbox[other] += me.send(event, now=self.NOW)
        return a, b

    def start(self, scenario: str, *, defer_work: bool = False) -> Session:
        """A fresh session in ``scenario``'s state."""
        flow, side, stop = SESSION_SCENARIOS[scenario]
        a, b = self._run(flow, stop, defer_work)
        return a if side == "a" else b

    def peer_frames(self, scenario: str) -> list[bytes]:
        """What the real peer sends the session of ``scenario`` from there on, frame by
        frame (prefixes included)."""
        flow, side, stop = SESSION_SCENARIOS[scenario]
        if flow not in self._recorded:
            record: list[tuple[str, int, bytes]] = []
            a, b = self._run(flow, None, record=record)
            assert a.state.value == b.state.value == "ESTABLISHED", (a.state, b.state)
            self._recorded[flow] = record
        return [len(payload).to_bytes(4, "big") + payload
                for got, number, data in self._recorded[flow] if got == side and number >= stop
                for payload in split_frames(data)]

    # ----------------------------------------------------------------- the invariant

    def drive(self, session: Session, pieces: list[bytes], now: int, *,
              eof: bool = False) -> list[Event]:
        """Feed ``pieces``, then (``eof``) the end of the stream, taking events after each
        until ``NEED_DATA``; return the events. Raises AssertionError when the session
        breaks the invariant, and lets any exception that is not a ``CBCLError`` through:
        only events, or a ``RemoteProtocolError`` (then at most one NOT-UNDERSTOOD waits to
        be sent, and nothing after), or ``LocalProtocolError`` once in ERROR."""
        events: list[Event] = []
        for piece in [*pieces, b""] if eof else pieces:
            quiet = session.state.value == "ERROR"
            session.receive_data(piece)  # never raises for the peer's bytes
            if quiet:
                assert not session.data_to_send(), "output after ERROR"
            self.pump(session, now, events)
        return events

    def pump(self, session: Session, now: int, events: list[Event]) -> None:
        """Take events until ``NEED_DATA`` (or an error), checking each (see :meth:`drive`).
        A ``now`` outside int64 may instead be refused with ``TypeError``/``ValueError``,
        but only before anything changed (the same state, nothing to send)."""
        S = self.S
        for _ in range(10_000):
            before = session.state
            was_error = before.value == "ERROR"
            try:
                event = session.next_event(now=now)
            except S.RemoteProtocolError as exc:
                assert not was_error, "RemoteProtocolError from a session already in ERROR"
                assert session.state.value == "ERROR", f"{exc!r} left state {session.state}"
                self.check_not_understood(session.data_to_send(), exc.code)
                return
            except S.LocalProtocolError as exc:
                assert was_error, f"LocalProtocolError from next_event in {session.state}: {exc}"
                assert not session.data_to_send(), "output after ERROR"
                return
            except self.cbcl.CBCLError as exc:
                raise AssertionError(f"next_event raised {type(exc).__name__} ({exc}), not "
                                     "RemoteProtocolError") from exc
            except (TypeError, ValueError):  # not a CBCLError (those are ValueErrors too)
                if -(2**63) <= now < 2**63:
                    raise
                assert session.state is before, f"now={now} refused half-way, in {session.state}"
                assert not session.data_to_send(), f"now={now} refused after output"
                return
            out = session.data_to_send()
            assert not was_error, f"next_event in ERROR gave {event!r}"
            for payload in split_frames(out):
                try:
                    self.cbcl.parse(payload, registry=self.negotiation)
                except self.cbcl.CBCLError as exc:
                    raise AssertionError(f"the session sent {payload[:200]!r}, which does "
                                         f"not parse: {exc}") from exc
            if event is S.NEED_DATA:
                return
            if event is self.need_work and event is not None:
                work = session.pending_work
                assert work is not None, "NEED_WORK without pending work"
                try:
                    outcome = work.run()
                except self.cbcl.CBCLError as exc:
                    outcome = exc
                session.complete_work(outcome)
                continue
            assert isinstance(event, self.events), f"not an event: {event!r}"
            if isinstance(event, S.NotUnderstood):
                assert not out, "a reply to a NOT-UNDERSTOOD"
            if isinstance(event, S.ProtocolMessage):  # only the agreed protocol runs
                assert session.protocol is not None, event
                assert event.message.protocol == session.protocol.id, event.message.protocol
            events.append(event)
            if isinstance(event, S.ConnectionClosed):
                return
        raise AssertionError("next_event never returned NEED_DATA")

    def check_not_understood(self, out: bytes, code: str) -> None:
        """After a ``RemoteProtocolError``: nothing, or one NOT-UNDERSTOOD frame carrying
        ``code``, a valid cbcl-negotiation/v1 message."""
        if not out:
            return
        frames = split_frames(out)
        assert len(frames) == 1, f"{len(frames)} frames after a RemoteProtocolError: {out!r}"
        try:
            reply = self.cbcl.parse(frames[0], registry=self.negotiation)
        except self.cbcl.CBCLError as exc:
            raise AssertionError(f"the NOT-UNDERSTOOD {frames[0]!r} does not parse: "
                                 f"{exc}") from exc
        assert reply.intent.value == "NOT-UNDERSTOOD", reply
        assert str(reply.protocol) == "cbcl-negotiation/v1", reply
        assert reply.body == code, (reply.body, code)
        assert code in self.S.NOT_UNDERSTOOD_CODES, code  # spec/negotiation.md §4

    def check(self, data: bytes) -> None:
        """The ``session`` target: see the module's docstring for the input's layout."""
        if len(data) < 3:
            return
        names = list(SESSION_SCENARIOS)
        session = self.start(names[data[0] % len(names)], defer_work=bool(data[2] & 0x40))
        now = SESSION_NOWS[data[1] % len(SESSION_NOWS)]
        self.drive(session, cut(data[3:], data[2] & 0x3F), now, eof=bool(data[2] & 0x80))

    @staticmethod
    def header(scenario: str, now: int = SESSION_NOW, size: int = 0, *, eof: bool = False,
               defer_work: bool = False) -> bytes:
        """The first three bytes of a ``session`` input."""
        return bytes([list(SESSION_SCENARIOS).index(scenario), SESSION_NOWS.index(now),
                      size | 0x40 * defer_work | 0x80 * eof])


_RULE_HEAD = re.compile(r"^\??([a-z][a-z0-9_]*):", re.M)
_WORD = re.compile(r"[a-z][a-z0-9_]*")


def _unreferenced_rules(text: str) -> tuple[str, ...]:
    """The rules no other rule names: the start rules a descriptor would give this text
    (at most 16, so the check stays cheap)."""
    from cbcl.grammar._subset import rule_name_problem

    text = re.sub(r"//[^\n]*", " ", text)
    heads = list(dict.fromkeys(_RULE_HEAD.findall(text)))
    bodies = _RULE_HEAD.sub(" ", text)
    used = set(_WORD.findall(re.sub(r'"[^"\n]*"', " ", bodies)))
    return tuple(name for name in heads
                 if name not in used and rule_name_problem(name) is None)[:16]


def outcome(function: Callable[..., object], *args: object, **kwargs: object) -> object:
    """What a call gives: its result, or its CBCLError's type and text."""
    import cbcl

    try:
        return function(*args, **kwargs)
    except cbcl.CBCLError as exc:
        return type(exc), str(exc)


def _setup() -> dict[str, Callable[[bytes], None]]:
    import cbcl
    from cbcl.binary import _codec
    from cbcl.core._reader import decode
    from cbcl.descriptor import GrammarLimits
    from cbcl.grammar._compile import compile_grammar
    from cbcl.protocol import _api
    from cbcl.protocol._envelope import scan_envelope

    registry = cbcl.Registry(disk_cache=False, isolate=False)
    for name in DESCRIPTORS:
        registry.load((ROOT / "descriptors" / f"{name}.cbcl").read_bytes(), allow_unsigned=True)
    protocols = [str(p.id) for p in registry.protocols()]
    decoders = (cbcl.Decoder(registry), cbcl.Decoder(registry, pure_python=True))
    small = GrammarLimits(max_text_bytes=4096, max_rules=32, max_productions=512)
    limits = cbcl.Limits(max_depth=64, max_nodes=10_000)

    def reader(data: bytes) -> None:
        try:
            value = cbcl.read(data, limits=limits)
        except cbcl.CBCLError:
            pass
        else:  # the canonical text reads back as the same value
            assert cbcl.read(cbcl.canonical(value)) == value
        with contextlib.suppress(cbcl.CBCLError):
            cbcl.read_all(data, limits=limits)

    def envelope(data: bytes) -> None:
        try:
            message = cbcl.parse(data, envelope_only=True, limits=limits)
        except cbcl.CBCLError as exc:
            try:  # the slow path refuses too, and with the same error
                text = decode(data, limits)
                scan_envelope(text, limits)
            except cbcl.CBCLError as again:
                assert str(again) == str(exc), (again, exc)
            else:
                raise AssertionError(f"fast path refused, slow path accepted: {exc}") from None
        else:  # the structural walk and the tables agree, and the canonical text reads back
            assert scan_envelope(decode(data, limits), limits).message == message
            assert cbcl.parse(message.canonical(), envelope_only=True) == message

    def body(data: bytes) -> None:
        if not data:
            return
        protocol = protocols[data[0] % len(protocols)]
        intent = _INTENTS[data[1] % len(_INTENTS)] if len(data) > 1 else "INFORM"
        head = (f'(CBCL/1.0 (message-id "m") (sender agent://a) (receiver agent://b) '
                f"(intent {intent}) (protocol {protocol}) (body ").encode()
        document = head + data[2:] + b"))"
        # parse's C entry (the call with a registry alone) gives what the Python function
        # gives: the same message, or the same error
        assert outcome(cbcl.parse, document, registry=registry) == \
            outcome(_api.parse_python, document, registry=registry)
        try:
            message = cbcl.parse(document, registry=registry, limits=limits)
        except cbcl.CBCLError as exc:
            message, refusal = None, (type(exc), str(exc))
        # parse's fast path (both passes in C) gives what the careful path gives
        saved, _api._accept_document_c = _api._accept_document_c, None
        try:
            careful = cbcl.parse(document, registry=registry, limits=limits)
        except cbcl.CBCLError as exc:
            assert message is None and refusal == (type(exc), str(exc)), (refusal, exc)
            return
        finally:
            _api._accept_document_c = saved
        assert careful == message, (careful, message)
        # What text accepts, the binary form carries and accepts the same.
        frame = cbcl.encode(message, registry=registry)
        assert decoders[0].decode(frame) == message

    def decoder(data: bytes) -> None:
        outcomes: list[object] = []
        for one in decoders:
            try:
                outcomes.append(one.decode(data))
            except cbcl.CBCLError as exc:
                outcomes.append((type(exc), str(exc)))
        # The C and pure-Python unpackers give the same result or the same error.
        assert outcomes[0] == outcomes[1], outcomes
        # Decoder.decode's C entry gives what the Python method gives.
        assert outcomes[0] == outcome(_codec.decode_python, decoders[0], data)
        # The whole-frame C call gives the decoder's message, or leaves the frame to it.
        if decoders[0]._frame_state is not None:  # (then cbcl._native is built)
            from cbcl._native import decode_frame

            found = decode_frame(data, decoders[0]._frame_state)
            assert found is None or found == outcomes[1], (found, outcomes[1])

    def descriptor(data: bytes) -> None:
        try:
            cbcl.descriptor.read_descriptor(data)
        except cbcl.CBCLError:
            return
        with contextlib.suppress(cbcl.CBCLError):
            cbcl.Registry(disk_cache=False, isolate=False, grammar_limits=small).load(
                data, allow_unsigned=True, now=0)

    def grammar(data: bytes) -> None:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return
        with contextlib.suppress(cbcl.CBCLError):
            compile_grammar(text, small)
        starts = _unreferenced_rules(text)  # per-intent grammars have no body rule
        if starts and starts != ("body",):
            with contextlib.suppress(cbcl.CBCLError):
                compile_grammar(text, small, starts=starts)

    from cbcl.core._limits import LLMLimits
    from cbcl.descriptor import CompatLimits, diff_descriptors
    from cbcl.llm import EXPORT_FORMATS, export_grammar, generate_messages

    compat_limits = CompatLimits(max_states=400, max_steps=20_000, max_nfa_states=4_000,
                                 search_bodies=10, max_witness_nodes=500)
    llm_limits = LLMLimits(max_rules=2_000, max_steps=50_000, max_output_bytes=1 << 20,
                           max_draft_tokens=500, max_draw_tokens=5_000, max_drafts=20)

    def diff(data: bytes) -> None:
        old, _, new = data.partition(b"\0")
        with contextlib.suppress(cbcl.CBCLError):
            report = diff_descriptors(old, new or old, mode="full", limits=compat_limits)
            assert report.verdict in ("compatible", "breaking", "unknown"), report
            report.render()

    def export(data: bytes) -> None:
        if not data:
            return
        fmt = EXPORT_FORMATS[data[0] % len(EXPORT_FORMATS)]
        with contextlib.suppress(cbcl.CBCLError):
            export_grammar(data[1:], fmt, schema=data[0] < 128, limits=llm_limits)
        with contextlib.suppress(cbcl.CBCLError):
            generate_messages(data[1:], 2, limits=llm_limits)

    kit = SessionKit()
    return {"reader": reader, "envelope": envelope, "body": body, "decoder": decoder,
            "descriptor": descriptor, "grammar": grammar, "session": kit.check,
            "diff": diff, "export": export}


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__)
        return 2
    target, rest = argv[1], argv[2:]
    if rest and rest[0] == "--replay":
        checks = _setup()
        for path in rest[1:]:
            checks[target](Path(path).read_bytes())
        return 0
    import atheris

    with atheris.instrument_imports(include=["cbcl"]):
        checks = _setup()
    if target not in checks:
        print(f"unknown target {target!r}; one of {', '.join(checks)}")
        return 2
    atheris.Setup([argv[0], *rest], checks[target])
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
