"""One writer at a time in a state directory (spec/trust.md §6): threads and processes that
read, decide and write through ``StateStore.update`` never lose an update or record an older
version over a newer one, and every wait for the lock ends by ``lock_timeout``.

Each race test sleeps inside ``decide`` to widen the window between the read and the write,
so an implementation without the lock fails it reliably.

Tests internals: the state store (``cbcl.protocol._state``) is private."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cbcl import TrustError
from cbcl.protocol._state import LOCK_FILE, StateRecord, StateStore, file_name

ROOT = Path(__file__).parent.parent
PROTOCOL = "p/v1"


def digest(version: int) -> str:
    return "sha256:" + hashlib.sha256(str(version).encode()).hexdigest()


def increment(current: StateRecord | None) -> StateRecord:
    version = 0 if current is None else current.version
    time.sleep(0.001)  # widen the race between the read and the write
    return StateRecord(PROTOCOL, version + 1, digest(version + 1))


def run_threads(*targets: Callable[[], object]) -> list[BaseException]:
    """Run the callables in threads started together; the exceptions they raised."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(targets))

    def run(target: Callable[[], object]) -> None:
        barrier.wait()
        try:
            target()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(t,)) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
        assert not thread.is_alive(), "a writer never finished"
    return errors


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


# --------------------------------------------------------------------------- threads


def test_threads_lose_no_update(tmp_path: Path) -> None:
    directory = tmp_path / "state"
    directory.mkdir()
    (tmp_path / "alias").symlink_to(directory)  # one directory under two names
    threads, rounds = 8, 25

    def writer(number: int) -> Callable[[], None]:
        store = StateStore(directory if number % 2 else tmp_path / "alias")

        def run() -> None:
            for _ in range(rounds):
                store.update(PROTOCOL, increment)
        return run

    assert run_threads(*(writer(n) for n in range(threads))) == []
    assert StateStore(directory).get(PROTOCOL) == StateRecord(PROTOCOL, threads * rounds,
                                                              digest(threads * rounds))
    assert sorted(p.name for p in directory.iterdir()) == [LOCK_FILE, file_name(PROTOCOL)]


def test_rollback_is_decided_under_the_lock(tmp_path: Path) -> None:
    for run in range(30):
        store = StateStore(tmp_path / f"state-{run}")

        def record(version: int, store: StateStore = store) -> Callable[[], object]:
            def decide(current: StateRecord | None) -> StateRecord:
                if current is not None and version < current.version:
                    raise TrustError("descriptor verification failed", reason="rollback")
                time.sleep(0.002)
                return StateRecord(PROTOCOL, version, digest(version))
            return lambda: store.update(PROTOCOL, decide)

        errors = run_threads(record(3), record(2))
        assert all(isinstance(e, TrustError) and e.reason == "rollback" for e in errors)
        assert store.get(PROTOCOL) == StateRecord(PROTOCOL, 3, digest(3)), f"run {run}"


def test_lock_timeout_against_a_thread(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state")
    store.put(StateRecord(PROTOCOL, 1, digest(1)))
    holding, release = threading.Event(), threading.Event()

    def hold(current: StateRecord | None) -> None:
        holding.set()
        release.wait(30)

    holder = threading.Thread(target=store.update, args=(PROTOCOL, hold))
    holder.start()
    try:
        assert holding.wait(30)
        impatient = StateStore(tmp_path / "state", lock_timeout=0.2)
        start = time.monotonic()
        with pytest.raises(TrustError) as info:
            impatient.update(PROTOCOL, increment)
        assert 0.2 <= time.monotonic() - start < 1.5
        assert "is locked by another writer (waited 0.2 s)" in info.value.reason
        with pytest.raises(TrustError, match="verification failed"):
            impatient.put(StateRecord(PROTOCOL, 9, digest(9)))
    finally:
        release.set()
        holder.join(30)
    assert store.get(PROTOCOL) == StateRecord(PROTOCOL, 1, digest(1))


# --------------------------------------------------------------------------- processes

WRITER = """
import sys, time, hashlib
from cbcl.protocol._state import StateRecord, StateStore
store = StateStore(sys.argv[1], lock_timeout=60)
def decide(current):
    version = 0 if current is None else current.version
    time.sleep(0.001)
    return StateRecord("p/v1", version + 1,
                       "sha256:" + hashlib.sha256(str(version + 1).encode()).hexdigest())
print("ready", flush=True)
sys.stdin.readline()
for _ in range(int(sys.argv[2])):
    store.update("p/v1", decide)
"""

HOLDER = """
import fcntl, os, sys
descriptor = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(descriptor, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


@pytest.mark.slow
def test_processes_lose_no_update(tmp_path: Path) -> None:
    directory = tmp_path / "state"
    processes, rounds = 2, 40
    children = [subprocess.Popen([sys.executable, "-c", WRITER, str(directory), str(rounds)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                 env=child_env(), cwd=ROOT) for _ in range(processes)]
    try:
        for child in children:  # every child has imported cbcl before any starts writing
            assert child.stdout is not None and child.stdout.readline() == "ready\n"
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        for child in children:
            assert child.wait(timeout=60) == 0
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
            for stream in (child.stdin, child.stdout):
                if stream is not None:
                    stream.close()
    total = processes * rounds
    assert StateStore(directory).get(PROTOCOL) == StateRecord(PROTOCOL, total, digest(total))


@pytest.mark.slow
def test_lock_timeout_against_another_process(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state", lock_timeout=0.2)
    store.put(StateRecord(PROTOCOL, 1, digest(1)))
    before = (store.directory / file_name(PROTOCOL)).read_bytes()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(store.directory / LOCK_FILE)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        start = time.monotonic()
        with pytest.raises(TrustError) as info:
            store.update(PROTOCOL, increment)
        assert 0.2 <= time.monotonic() - start < 1.5
        assert "is locked by another writer" in info.value.reason
    finally:
        assert holder.stdin is not None and holder.stdout is not None
        holder.stdin.close()
        holder.wait(timeout=30)
        holder.stdout.close()
    assert (store.directory / file_name(PROTOCOL)).read_bytes() == before
    assert store.update(PROTOCOL, increment) == StateRecord(PROTOCOL, 2, digest(2))


# --------------------------------------------------------------------------- update


def test_update_writes_only_a_changed_record(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state")
    seen: list[StateRecord | None] = []

    def keep(current: StateRecord | None) -> StateRecord | None:
        seen.append(current)
        return current

    assert store.update(PROTOCOL, keep) is None
    assert not (store.directory / file_name(PROTOCOL)).exists()
    first = store.update(PROTOCOL, increment)
    assert first == StateRecord(PROTOCOL, 1, digest(1))
    path = store.directory / file_name(PROTOCOL)
    inode = path.stat().st_ino
    assert store.update(PROTOCOL, keep) == first
    assert store.update(PROTOCOL, lambda current: None) == first
    equal = StateRecord(PROTOCOL, 1, digest(1))
    assert store.update(PROTOCOL, lambda current: equal) == first
    assert path.stat().st_ino == inode  # never rewritten
    assert seen == [None, first]


def test_update_rereads_the_file_under_the_lock(tmp_path: Path) -> None:
    one, other = StateStore(tmp_path / "state"), StateStore(tmp_path / "state")
    one.update(PROTOCOL, increment)
    other.update(PROTOCOL, increment)
    assert one.update(PROTOCOL, increment) == StateRecord(PROTOCOL, 3, digest(3))


def test_a_refusing_decide_writes_nothing(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state")
    store.put(StateRecord(PROTOCOL, 5, digest(5)))
    before = {p.name: p.read_bytes() for p in store.directory.iterdir()}

    def refuse(current: StateRecord | None) -> StateRecord:
        raise TrustError("descriptor verification failed", reason="rollback")

    with pytest.raises(TrustError, match="verification failed"):
        store.update(PROTOCOL, refuse)
    assert {p.name: p.read_bytes() for p in store.directory.iterdir()} == before
    # The lock was released: the next writer gets it at once.
    assert StateStore(store.directory, lock_timeout=0).update(PROTOCOL, increment) \
        == StateRecord(PROTOCOL, 6, digest(6))


def test_decide_must_return_a_record_for_the_protocol(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state")
    with pytest.raises(ValueError, match="StateRecord for 'p/v1'"):
        store.update(PROTOCOL, lambda current: StateRecord("q/v1", 1, digest(1)))
    assert store.get(PROTOCOL) is None and store.get("q/v1") is None


def test_the_lock_file(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state")
    assert not (store.directory / LOCK_FILE).exists()  # reading creates nothing
    assert store.get(PROTOCOL) is None
    assert not (store.directory / LOCK_FILE).exists()
    store.put(StateRecord(PROTOCOL, 1, digest(1)))
    assert stat.S_IMODE((store.directory / LOCK_FILE).stat().st_mode) == 0o600


def test_a_lock_file_that_is_a_link_or_no_file_is_refused(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state")
    target = tmp_path / "elsewhere"
    (store.directory / LOCK_FILE).symlink_to(target)
    with pytest.raises(TrustError) as info:
        store.update(PROTOCOL, increment)
    assert "state lock" in info.value.reason
    assert not target.exists()  # the link was not followed
    (store.directory / LOCK_FILE).unlink()
    (store.directory / LOCK_FILE).mkdir()
    with pytest.raises(TrustError, match="verification failed"):
        store.put(StateRecord(PROTOCOL, 1, digest(1)))
    assert store.get(PROTOCOL) is None


@pytest.mark.parametrize("timeout", [-1, -0.1, float("nan"), float("inf"), "1", True, None])
def test_lock_timeout_is_checked(tmp_path: Path, timeout: object) -> None:
    with pytest.raises(ValueError, match="lock_timeout"):
        StateStore(tmp_path, lock_timeout=timeout)  # type: ignore[arg-type]


def test_a_zero_lock_timeout_takes_a_free_lock(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state", lock_timeout=0)
    assert store.update(PROTOCOL, increment) == StateRecord(PROTOCOL, 1, digest(1))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_child_forked_under_the_lock_can_take_it_once_released(tmp_path: Path) -> None:
    # The child inherits the parent's held thread lock and the flock's open file
    # description; it gets the lock once the parent releases it, and not before.
    store = StateStore(tmp_path / "state")
    children: list[int] = []

    def fork_then_record(current: StateRecord | None) -> StateRecord:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            code = 1
            try:
                child = StateStore(tmp_path / "state", lock_timeout=10)
                record = child.update(PROTOCOL, increment)
                code = 0 if record is not None and record.version == 2 else 2
            finally:
                os._exit(code)
        children.append(pid)
        time.sleep(0.05)  # the child is now waiting for the lock
        return StateRecord(PROTOCOL, 1, digest(1))

    assert threading.active_count() == 1  # forking with other threads alive would warn
    store.update(PROTOCOL, fork_then_record)
    _, status = os.waitpid(children[0], 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert store.get(PROTOCOL) == StateRecord(PROTOCOL, 2, digest(2))
