"""The policy's compatibility check of an offer is compile work (issue 36, item 3).

A registry that isolates its compiles (every server's) compares an offered update with the
accepted descriptor in the guarded worker process, under its compile gate, stopped when
the registry is abandoned (its connection ended: the handshake deadline); any failure of
the analysis is an ``unknown`` verdict, so the update is refused (TrustError
``incompatible``, a ``rejected`` reply to the peer), never a dropped connection.

Where it runs is asserted, not timed: ``diff_descriptors`` is made to fail in this process,
so a comparison that ran here would fail the test (the worker is another process).

Tests internals: the registry's comparison (``Registry._compare``) and ``cbcl serve``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from pathlib import Path
from typing import Any

import pytest
from big_descriptors import bounds_times_one_of
from key_files import public_key_pem
from test_compat_policy import ASK, ASK_BARE, ASK_QTY, descriptor, private, signed
from test_eviction import HANDSHAKE_BOUND_MS, negotiate_from, recorded_version
from test_serve_attacks import KEY, WAIT, good_peer, running

import cbcl
import cbcl.protocol._compat
from cbcl import LimitError, Registry, TrustError
from cbcl.protocol._compat import (
    BREAKING,
    COMPATIBLE,
    CompatLimits,
    compare_guarded,
    descriptor_document,
)
from cbcl.protocol._descriptor import read_descriptor
from cbcl.protocol._registry import CompileGate
from cbcl.session._reasons import error_code

POLICY = "(trust-policy (protocol p/v1 (keys alice) (compatibility backward)) " \
         "(default (keys alice bob)))\n"


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture
def not_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """``diff_descriptors`` fails in this process: only a worker may compare."""
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the comparison ran in the serving process")

    monkeypatch.setattr(cbcl.protocol._compat, "diff_descriptors", refuse)


def server_registry(tmp_path: Path, **options: Any) -> Registry:
    trust = tmp_path / "trust"
    trust.mkdir(exist_ok=True)
    for name in ("alice", "bob"):
        (trust / f"{name}.pub").write_bytes(public_key_pem(private(name).public_key()))
    (trust / "policy.cbcl").write_text(POLICY)
    return Registry(trust=trust, state_dir=tmp_path / "state", disk_cache=False,
                    grammar_cache=cbcl.descriptor.GrammarCache(), **options)


def test_a_served_registry_compares_in_the_worker(tmp_path: Path, not_here: None) -> None:
    registry = server_registry(tmp_path)
    registry.load(signed(descriptor(1, ASK)))
    with pytest.raises(TrustError) as info:
        registry.load(signed(descriptor(2, ASK_BARE)))
    assert info.value.cause == "incompatible" and error_code(info.value) == "rollback"
    assert "(breaking; witness REQUEST: accepted by version 1, refused by version 2" \
        in info.value.reason
    assert registry.load(signed(descriptor(2, ASK_QTY))).descriptor.version == 2


def test_the_worker_gives_the_verdicts_of_this_process(tmp_path: Path) -> None:
    old, compatible, breaking = (read_descriptor(descriptor(v, g)) for v, g in
                                 ((1, ASK), (2, ASK_QTY), (2, ASK_BARE)))
    options: dict[str, Any] = {
        "mode": "backward", "limits": CompatLimits(),
        "grammar_limits": cbcl.descriptor.GrammarLimits(), "read_limits": cbcl.Limits(),
        "timeout": 20.0, "memory": 1 << 30, "cancelled": None, "max_table_bytes": 16 << 20}
    assert compare_guarded(old, compatible, **options).verdict == COMPATIBLE
    found = compare_guarded(old, breaking, **options)
    here = cbcl.protocol._compat.compare(old, breaking, mode="backward",
                                         limits=CompatLimits(),
                                         grammar_limits=cbcl.descriptor.GrammarLimits(),
                                         compile=None)
    assert found == here and found.verdict == BREAKING and found.witness is not None
    # A limit the analysis meets is its verdict, there as here.
    small = {**options, "limits": CompatLimits(max_steps=1)}
    assert compare_guarded(old, compatible, **small).verdict == "unknown"


def test_a_document_reads_back_as_its_descriptor() -> None:
    for version, grammar in ((1, ASK), (2, ASK_BARE)):
        read = read_descriptor(descriptor(version, grammar, schema="(schema (record ask))"))
        again = read_descriptor(descriptor_document(read))
        assert dataclasses.replace(again, digest=read.digest) == read


def test_a_worker_that_fails_is_an_unknown_verdict_refused(
        tmp_path: Path, not_here: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that dies (here: its entry is missing) gives ``unknown``: the update,
    compatible as it is, is refused ``incompatible``; like a compile that fails, the
    verdict is remembered, so the same update is refused again without a worker."""
    registry = server_registry(tmp_path)
    registry.load(signed(descriptor(1, ASK)))
    monkeypatch.setattr(cbcl.protocol._compat, "COMPARE_ENTRY",
                        ("cbcl.protocol._compat", "no_such_entry"))
    with pytest.raises(TrustError) as info:
        registry.load(signed(descriptor(2, ASK_QTY)))
    assert info.value.cause == "incompatible" and "(unknown; " in info.value.reason
    assert "the analysis worker failed" in info.value.reason
    monkeypatch.setattr(cbcl.protocol._compat, "run_guarded", None)  # (no worker now)
    with pytest.raises(TrustError) as again:
        registry.load(signed(descriptor(2, ASK_QTY)))
    assert again.value.reason == info.value.reason


def test_an_abandoned_comparison_stops(tmp_path: Path, not_here: None,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry of a connection that ended (a deadline, the peer gone) is abandoned:
    its comparison, under way in the worker, stops, LimitError ``abandoned``."""
    registry = server_registry(tmp_path)
    started = threading.Event()
    real = cbcl.protocol._compat.compare_guarded

    def starting(*args: Any, **kwargs: Any) -> Any:
        started.set()
        return real(*args, **kwargs)

    monkeypatch.setattr(cbcl.protocol._registry, "compare_guarded", starting)
    old = bounds_times_one_of(1000, 1000, ident="p/v1")
    registry.load(cbcl.sign_descriptor(old, [("alice", private("alice"))]))
    new = cbcl.sign_descriptor(bounds_times_one_of(1000, 998, version=2, ident="p/v1"),
                               [("alice", private("alice"))])
    outcome: list[BaseException] = []

    def load() -> None:
        try:
            registry.load(new)
        except BaseException as exc:  # (reported to the test)
            outcome.append(exc)

    thread = threading.Thread(target=load)
    thread.start()
    assert started.wait(WAIT)  # the comparison has begun
    registry.abandon()
    thread.join(WAIT)
    assert not thread.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], LimitError), outcome
    assert outcome[0].limit == "abandoned"


def test_the_comparison_counts_against_the_compile_gate(
        tmp_path: Path, not_here: None, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = CompileGate(1, 0)
    registry = server_registry(tmp_path, compile_gate=gate)
    registry.load(signed(descriptor(1, ASK)))
    seen: list[int] = []
    real = cbcl.protocol._compat.compare_guarded

    def watching(*args: Any, **kwargs: Any) -> Any:
        seen.append(gate.admitted)
        return real(*args, **kwargs)

    monkeypatch.setattr(cbcl.protocol._registry, "compare_guarded", watching)
    registry.load(signed(descriptor(2, ASK_QTY)))
    assert seen == [1]  # it held the gate's one slot


def test_an_expensive_offer_is_refused_and_a_good_peer_is_served(
        tmp_path: Path, not_here: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """``cbcl serve`` with a policy requiring backward compatibility for big/v1: a peer
    offers an update whose comparison is the issue's quadratic case; once the comparison
    has begun, a good peer negotiates and runs its conversation, its handshake within
    the bound the eviction tests use (1 s; a few ms normally). The update is refused
    with a ``rejected`` reply (nothing recorded), and the comparison never ran in the
    server's process."""
    started = threading.Event()
    real = cbcl.protocol._compat.compare_guarded

    def starting(*args: Any, **kwargs: Any) -> Any:
        started.set()
        return real(*args, **kwargs)

    monkeypatch.setattr(cbcl.protocol._registry, "compare_guarded", starting)
    trust = tmp_path / "trust"
    trust.mkdir()
    (trust / "policy.cbcl").write_text(
        "(trust-policy (protocol big/v1 (keys demo) (compatibility backward)) "
        "(default (keys demo)))\n")
    first = cbcl.sign_descriptor(bounds_times_one_of(1000, 1000), [("demo", KEY)])
    update = cbcl.sign_descriptor(bounds_times_one_of(1000, 998, version=2),
                                  [("demo", KEY)])

    async def scenario() -> None:
        async with running(tmp_path) as srv:
            assert await negotiate_from(srv.address, "127.0.0.3", first) == "established"
            # (the offer's answer waits for the comparison, which runs to its step budget:
            # seconds on a quiet machine, more than WAIT on a loaded one — a deadline, not
            # a measure)
            offer = asyncio.create_task(negotiate_from(srv.address, "127.0.0.2", update,
                                                       wait=6 * WAIT))
            assert await asyncio.to_thread(started.wait, WAIT)
            timings = await good_peer(srv.address, tag="during")
            assert timings["handshake"] < HANDSHAKE_BOUND_MS, timings
            assert await asyncio.wait_for(offer, 12 * WAIT) == "rejected rollback"
            assert recorded_version(srv, "big/v1") == 1
    asyncio.run(scenario())
