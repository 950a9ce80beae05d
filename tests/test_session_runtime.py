"""The session's slow work and what it records (spec/negotiation.md §3, trust.md §6):
offers verified as deferred work, state recorded only once both Finished are verified and
decided again under the state lock, trust on first use, the conversation cap, the handshake
frame cap, and the registry's byte-bounded cache of compiled grammars.

Tests internals too: the cache's LRU and sizes, and the grammar compiler, are private."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import cbcl
from cbcl import LocalProtocolError, RemoteProtocolError, Session, TrustStore, sign_descriptor
from cbcl.descriptor import CompileGate
from cbcl.protocol._registry import _LRU, compiled_size
from cbcl.session import (
    NEED_DATA,
    NEED_WORK,
    Established,
    HandshakeState,
    Offer,
    ProtocolMessage,
    Query,
    Rejected,
)

ROOT = Path(__file__).parent.parent
NOW = 1_764_500_000_000
ALICE, MALLORY = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
STORE = TrustStore({"alice": ALICE.public_key(), "mallory": MALLORY.public_key()})
# contract-net/v1's version 1, hand-written (kept in descriptors/history: the shipped one,
# built from its declaration, is version 2).
V1 = (ROOT / "descriptors" / "history" / "contract-net-v1.version-1.cbcl").read_bytes()
A_URI, B_URI = "agent://test/a", "agent://test/b"


def version(number: int, extra: bytes = b"") -> bytes:
    return V1.replace(b"(version 1)", f"(version {number})".encode()) + extra


def signed(payload: bytes, *keys: tuple[str, Ed25519PrivateKey]) -> bytes:
    return sign_descriptor(payload, list(keys) or [("alice", ALICE)])


def digest(payload: bytes) -> str:
    return "sha256:" + hashlib.sha256(payload).hexdigest()


def initiator(payload: bytes) -> Session:
    registry = cbcl.Registry(disk_cache=False, isolate=False)
    registry.load(payload, allow_unsigned=True)
    return Session("initiator", registry=registry, me=A_URI, peer=B_URI,
                   signing_key=("alice", ALICE))


def responder(state: Path | None = None, **options: Any) -> Session:
    registry = cbcl.Registry(trust=STORE, disk_cache=False, isolate=False, state_dir=state)
    options.setdefault("require_signed_finished", True)
    return Session("responder", registry=registry, me=B_URI, **options)


def pump(source: Session, sink: Session) -> list[object]:
    """Deliver what ``source`` produced to ``sink``; return ``sink``'s events (running
    deferred work inline, as an edge would)."""
    data = source.data_to_send()
    if data:
        sink.receive_data(data)
    events: list[object] = []
    while True:
        event = sink.next_event(now=NOW)
        if event is NEED_DATA:
            return events
        if event is NEED_WORK:
            work = sink.pending_work
            assert work is not None
            try:
                outcome = work.run()
            except cbcl.CBCLError as exc:
                outcome = exc
            sink.complete_work(outcome)
            continue
        events.append(event)


def up_to_finished(a: Session, b: Session, payload: bytes, document: bytes) -> list[object]:
    """Ask, offer, and let B accept; A's Finished is then waiting in A's outbox."""
    b.receive_data(a.send(Query("contract-net/v1", digest(payload), ()), now=NOW))
    events: list[object] = []
    while (event := b.next_event(now=NOW)) is not NEED_DATA:
        events.append(event)
    pump(b, a)  # unsupported
    b.receive_data(a.send(Offer(document), now=NOW))
    events += pump(a, b)
    pump(b, a)  # accepted: A answers with its Finished
    return events


def state_of(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.name != ".lock"} \
        if directory.exists() else {}


# --------------------------------------------------------------------------- deferred work


def test_an_offer_is_deferred_work_and_a_wrong_outcome_is_refused(tmp_path: Path) -> None:
    a, b = initiator(V1), responder(defer_work=True)
    b.receive_data(a.send(Query("contract-net/v1", digest(V1), ()), now=NOW))
    assert type(b.next_event(now=NOW)).__name__ == "Query"
    a.receive_data(b.data_to_send())
    a.next_event(now=NOW)
    b.receive_data(a.send(Offer(signed(V1)), now=NOW))
    assert isinstance(b.next_event(now=NOW), Offer)
    assert b.next_event(now=NOW) is NEED_WORK  # nothing was verified or compiled yet
    assert b.registry.get("contract-net/v1") is None
    with pytest.raises(LocalProtocolError, match="PreparedDescriptor"):
        b.complete_work("accepted")
    work = b.pending_work
    assert work is not None and work.kind == "offer"
    b.complete_work(work.run())
    assert type(b.next_event(now=NOW)).__name__ == "Accepted"
    with pytest.raises(LocalProtocolError, match="no work is pending"):
        b.complete_work(None)


# --------------------------------------------------------------------------- recording


def test_state_is_recorded_only_once_both_finished_are_verified(tmp_path: Path) -> None:
    state = tmp_path / "state"
    a, b = initiator(V1), responder(state)
    up_to_finished(a, b, V1, signed(V1))
    assert b.registry.get("contract-net/v1") is not None  # loaded for this session
    assert state_of(state) == {}  # not yet recorded: A has not confirmed
    events = pump(a, b)  # A's Finished
    assert [type(e).__name__ for e in events] == ["Finished", "Established"]
    assert '"version": 1' in state_of(state)["contract-net%2Fv1.json"].decode()


def test_a_handshake_abandoned_before_finished_records_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    a, b = initiator(V1), responder(state)
    up_to_finished(a, b, V1, signed(V1))
    a.data_to_send()  # A's Finished is never delivered
    b.receive_data(b"")
    with pytest.raises(RemoteProtocolError):
        b.next_event(now=NOW)
    assert state_of(state) == {}
    # The genuine descriptor (any version) still loads afterwards.
    assert cbcl.Registry(trust=STORE, disk_cache=False, isolate=False,
                         state_dir=state).load(signed(version(3))).descriptor.version == 3


def test_concurrent_sessions_cannot_record_an_older_version(tmp_path: Path) -> None:
    """Two sessions of one server accept versions 2 and 3; 3 is recorded first. When 2's
    initiator confirms, the decision is taken again under the lock: rollback, refused,
    and version 3 stays recorded."""
    state = tmp_path / "state"
    v2, v3 = version(2), version(3)
    old_a, old_b = initiator(v2), responder(state)
    new_a, new_b = initiator(v3), responder(state)
    up_to_finished(old_a, old_b, v2, signed(v2))
    up_to_finished(new_a, new_b, v3, signed(v3))
    pump(new_a, new_b)  # version 3 confirmed and recorded
    recorded = state_of(state)
    with pytest.raises(RemoteProtocolError, match="rollback") as caught:
        pump(old_a, old_b)
    assert caught.value.code == "rollback"
    assert state_of(state) == recorded
    assert old_b.state is HandshakeState.ERROR
    assert b'"rollback"' in old_b.data_to_send()  # NOT-UNDERSTOOD carries the code


# --------------------------------------------------------------------------- trust on first use


def test_the_first_signer_of_an_id_is_bound_to_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    registry = cbcl.Registry(trust=STORE, disk_cache=False, isolate=False, state_dir=state)
    registry.load(signed(V1))  # alice first
    before = state_of(state)
    squat = version(2)
    with pytest.raises(cbcl.TrustError) as caught:
        registry.load(signed(squat, ("mallory", MALLORY)))
    assert caught.value.reason.startswith("key binding: contract-net/v1 is bound")
    assert state_of(state) == before
    # A fresh registry on the same state (another session, a restart) refuses too …
    again = cbcl.Registry(trust=STORE, disk_cache=False, isolate=False, state_dir=state)
    with pytest.raises(cbcl.TrustError, match="verification failed"):
        again.load(signed(squat, ("mallory", MALLORY)))
    # … while alice's next version, also co-signed by mallory, is accepted.
    assert again.load(signed(squat, ("alice", ALICE), ("mallory", MALLORY))) is not None
    # The same descriptor signed by mallory alone changes nothing and is not refused.
    assert again.load(signed(squat, ("mallory", MALLORY))).descriptor.version == 2


def test_a_policy_rule_for_the_id_overrides_the_binding(tmp_path: Path) -> None:
    state = tmp_path / "state"
    policy = cbcl.trust.TrustPolicy.parse(b"(trust-policy (protocol contract-net/v1 (keys alice "
                                    b"mallory)))")
    store = TrustStore({"alice": ALICE.public_key(), "mallory": MALLORY.public_key()},
                       policy)
    registry = cbcl.Registry(trust=store, disk_cache=False, isolate=False, state_dir=state)
    registry.load(signed(V1))
    assert registry.load(signed(version(2), ("mallory", MALLORY))).descriptor.version == 2


def test_a_squatting_offer_is_rejected_by_the_session(tmp_path: Path) -> None:
    state = tmp_path / "state"
    cbcl.Registry(trust=STORE, disk_cache=False, isolate=False, state_dir=state).load(
        signed(V1))
    before = state_of(state)
    squat = version(2)
    a, b = initiator(squat), responder(state)
    b.receive_data(a.send(Query("contract-net/v1", digest(squat), ()), now=NOW))
    while b.next_event(now=NOW) is not NEED_DATA:
        pass
    pump(b, a)
    b.receive_data(a.send(Offer(signed(squat, ("mallory", MALLORY))), now=NOW))
    events = pump(a, b)
    assert isinstance(events[-1], Rejected) and events[-1].reason == "untrusted-signer"
    assert "key binding" in events[-1].detail
    assert state_of(state) == before


# --------------------------------------------------------------------------- caps


def established_pair(max_conversations: int) -> tuple[Session, Session]:
    a, b = initiator(V1), responder(max_conversations=max_conversations)
    up_to_finished(a, b, V1, signed(V1))
    pump(a, b)
    assert isinstance(pump(b, a)[-1], Established)
    return a, b


def cfp(number: int) -> cbcl.Message:
    return cbcl.Message(message_id=f"cn-{number}", sender=A_URI, receiver=B_URI,
                        intent="CFP", protocol="contract-net/v1",
                        conversation_id=f"job-{number}",
                        body=cbcl.read(b'(cfp :task (task :id "t1" :action render) '
                                       b":deadline 5)"))


def refuse(number: int) -> cbcl.Message:
    return cbcl.Message(message_id=f"r-{number}", sender=B_URI, receiver=A_URI,
                        intent="REFUSE", protocol="contract-net/v1",
                        conversation_id=f"job-{number}", in_reply_to=f"cn-{number}",
                        body=cbcl.read(b'(refuse :task-id "t1" :reason busy)'))


def test_max_conversations_accepts_n_open_and_refuses_the_next() -> None:
    a, b = established_pair(max_conversations=3)
    for number in range(3):
        b.receive_data(a.send(ProtocolMessage(cfp(number)), now=NOW))
        assert isinstance(b.next_event(now=NOW), ProtocolMessage)
    b.receive_data(a.send(ProtocolMessage(cfp(3)), now=NOW))
    with pytest.raises(RemoteProtocolError, match="3 conversations are open") as caught:
        b.next_event(now=NOW)
    assert caught.value.code == "limit"


def test_finished_conversations_are_dropped_and_cannot_be_replayed() -> None:
    a, b = established_pair(max_conversations=2)
    for number in range(500):  # far more conversations than the cap, one after another
        b.receive_data(a.send(ProtocolMessage(cfp(number)), now=NOW))
        assert isinstance(b.next_event(now=NOW), ProtocolMessage)
        a.receive_data(b.send(ProtocolMessage(refuse(number)), now=NOW))
        event = a.next_event(now=NOW)
        assert isinstance(event, ProtocolMessage) and event.finished
    assert b.tracker is not None and b.tracker.conversations() == ()
    assert a.tracker is not None and a.tracker.conversations() == ()
    late = cbcl.Message(message_id="cn-late", sender=A_URI, receiver=B_URI, intent="CFP",
                        protocol="contract-net/v1", conversation_id="job-499",
                        body=cfp(0).body)
    with pytest.raises(cbcl.ConversationError, match='conversation "job-499" has finished'):
        a.send(ProtocolMessage(late), now=NOW)
    assert a.data_to_send() == b""  # refused, not sent; the session goes on


# --------------------------------------------------------------------------- compiled grammars


def test_a_compiled_grammar_over_max_compiled_bytes_is_refused() -> None:
    registry = cbcl.Registry(disk_cache=False, isolate=False)
    protocol = registry.load(V1, allow_unsigned=True)
    size = compiled_size(registry.compiled(protocol.descriptor.grammar,
                                          starts=protocol.descriptor.start_rules))
    exact = cbcl.Registry(disk_cache=False, isolate=False, max_compiled_bytes=size)
    assert exact.load(V1, allow_unsigned=True).digest == protocol.digest
    short = cbcl.Registry(disk_cache=False, isolate=False, max_compiled_bytes=size - 1)
    with pytest.raises(cbcl.GrammarError, match=f"the limit is {size - 1}"):
        short.load(version(2, b" "), allow_unsigned=True)  # same grammar: the size decides
    # Compiled afresh too (no cache in memory), the size refuses it …
    cbcl.protocol._registry.DEFAULT_GRAMMAR_CACHE.clear()
    with pytest.raises(cbcl.GrammarError, match=f"the limit is {size - 1}"):
        short.load(version(2, b" "), allow_unsigned=True)
    # … and that refusal is this registry's limit, not a verdict for every registry.
    assert cbcl.Registry(disk_cache=False, isolate=False).load(
        version(2, b" "), allow_unsigned=True).descriptor.version == 2


def test_compiled_size_tracks_the_memory_the_tables_take() -> None:
    import json
    import tracemalloc

    from cbcl.grammar._compile import compile_grammar, from_data, to_data

    rules = ["body: item*", "item: " + " | ".join(f"r{i}" for i in range(40))]
    rules += [f'r{i}: "(" "k{i}" (STRING | item)* ")"' for i in range(40)]
    compiled = compile_grammar("\n".join(rules) + "\n")
    text = json.dumps(to_data(compiled))
    tracemalloc.start()
    loaded = from_data(json.loads(text))
    taken, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert 0.5 <= compiled_size(loaded) / taken <= 2.0


def test_the_cache_of_compiled_grammars_is_bounded_by_bytes() -> None:
    cache = _LRU(100, cost=len)
    cache.remember("a", "x" * 60)
    cache.remember("b", "x" * 40)  # exactly at capacity: both kept
    assert cache.recall("a") and cache.recall("b") and cache.used == 100
    cache.remember("c", "x")  # one byte more: the least recently used ("a") goes
    assert cache.recall("a") is None and cache.used == 41
    cache.remember("d", "x" * 101)  # larger than the whole cache: never kept
    assert cache.recall("d") is None and cache.recall("b") is not None


def test_the_compile_gate_admits_workers_plus_queue() -> None:
    gate = CompileGate(workers=1, queue=1)
    with gate.slot(1.0):
        with pytest.raises(cbcl.LimitError, match=r"no compile slot within 0\.05 s"), \
                gate.slot(0.05):  # the queue place: it waits, then gives up
            pass
        assert gate.admitted == 1
    import threading

    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with gate.slot(1.0):
            held.set()
            release.wait(5)

    worker = threading.Thread(target=hold)
    worker.start()
    held.wait(5)
    def wait_for_slot() -> None:
        with gate.slot(5):
            pass

    waiting = threading.Thread(target=wait_for_slot)
    waiting.start()
    while gate.admitted < 2:
        pass
    with pytest.raises(cbcl.LimitError, match="2 grammars are compiling or waiting"), \
            gate.slot(1.0):
        pass
    release.set()
    worker.join(5)
    waiting.join(5)
    assert gate.admitted == 0


# --------------------------------------------------------------------------- the guarded compile


def _slow_grammar(rules: int) -> str:
    lines = ["body: item*", "item: " + " | ".join(f"r{i}" for i in range(rules))]
    lines += [f'r{i}: "(" "k{i}" (STRING | INTEGER | item)* ")"' for i in range(rules)]
    return "\n".join(lines) + "\n"


def test_the_compile_guard_stops_a_compile_past_its_time() -> None:
    from cbcl.grammar._compile import compile_guarded

    # (by its CPU limit, or — its worker being niced, on a machine busy with other work —
    # by the wall-clock backstop of three times that: which one comes first is load's)
    with pytest.raises(cbcl.GrammarError,
                       match=r"more than 1 s of CPU|longer than 3 s") as caught:
        compile_guarded(_slow_grammar(150), timeout=1)
    assert caught.value.verdict == "rejected"


def test_the_compile_worker_limits_cpu_time_not_wall_clock() -> None:
    """The worker's own limit is of CPU seconds (RLIMIT_CPU), and it runs below the
    priority of the process that serves peers."""
    probe = ("import os, resource\n"
             "from cbcl.grammar._compile_worker import confine\n"
             "before = os.nice(0)\n"
             "confine({'memory': 2**34, 'cpu_seconds': 7})\n"
             "print(resource.getrlimit(resource.RLIMIT_CPU), os.nice(0) - before)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout == "(7, 8) 10\n"


def test_an_abandoned_compile_stops_and_is_not_remembered_as_refused() -> None:
    from cbcl.grammar._compile import compile_guarded

    with pytest.raises(cbcl.LimitError, match="abandoned"):
        compile_guarded(_slow_grammar(150), cancelled=lambda: True)
    grammar = _slow_grammar(7)
    registry = cbcl.Registry(disk_cache=False, compile_gate=CompileGate(1, 0))
    registry.abandon()
    with pytest.raises(cbcl.LimitError, match="abandoned"):
        registry.compiled(grammar)
    # Not a verdict on the grammar: another registry compiles it.
    assert cbcl.Registry(disk_cache=False).compiled(grammar).verdict == "LALR(1)"


def test_a_grammar_cache_is_an_object_registries_share_or_keep_apart(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from cbcl.descriptor import DEFAULT_GRAMMAR_CACHE, GrammarCache

    compiles = []
    original = cbcl.Registry._compile

    def counting(self: cbcl.Registry, grammar: str, starts: tuple[str, ...]) -> object:
        compiles.append(grammar)
        return original(self, grammar, starts)

    monkeypatch.setattr(cbcl.Registry, "_compile", counting)
    payload = version(7, b"  ")
    # Two registries on one cache: the second finds the first's compile.
    shared = GrammarCache()
    for _ in range(2):
        registry = cbcl.Registry(disk_cache=False, isolate=False, grammar_cache=shared)
        registry.load(payload, allow_unsigned=True)
    assert len(compiles) == 1 and len(shared.compiled) == 1
    # A registry with a cache of its own compiles for itself; the default cache is apart.
    apart = cbcl.Registry(disk_cache=False, isolate=False, grammar_cache=GrammarCache())
    apart.load(payload, allow_unsigned=True)
    assert len(compiles) == 2
    assert cbcl.Registry().grammar_cache is DEFAULT_GRAMMAR_CACHE
    # Its byte bound: a grammar of exactly max_bytes is kept, one byte less and it is not.
    loaded = apart.get("contract-net/v1")
    assert loaded is not None
    net = loaded.descriptor
    size = compiled_size(apart.compiled(net.grammar, starts=net.start_rules))
    exact = GrammarCache(max_bytes=size)
    cbcl.Registry(disk_cache=False, isolate=False, grammar_cache=exact).load(
        payload, allow_unsigned=True)
    assert len(exact.compiled) == 1 and exact.compiled.used == size
    short = GrammarCache(max_bytes=size - 1)
    cbcl.Registry(disk_cache=False, isolate=False, grammar_cache=short).load(
        payload, allow_unsigned=True)
    assert len(short.compiled) == 0
    with pytest.raises(ValueError):
        GrammarCache(max_bytes=0)
    with pytest.raises(TypeError):
        cbcl.Registry(grammar_cache=object())  # type: ignore[arg-type]
