"""Trusted state: per protocol id, the highest descriptor version accepted, its digest, its
exact bytes and the fingerprints of the keys bound to the id by trust on first use
(spec/trust.md §6).

Theory of operation
-------------------
One JSON file per protocol id in a private directory (mode 0700), written atomically (a
temporary file in the same directory, flushed and synced, then renamed over the old one,
then the directory synced), so a crash leaves the old record or the new one, never half of
either, and a reader never needs a lock.

A file that cannot be read or does not hold a valid record refuses every load of its
protocol id: deleting state is how an attacker would re-open rollback, so an unreadable
record never reads as "no record". Only a missing file is "no record". A record is read
with :func:`read_regular_file` (a FIFO or device never blocks or floods the reader) and
capped at :func:`state_file_cap` of the store's ``max_descriptor_bytes`` (the accepted
descriptor, base64, plus :data:`MAX_RECORD_BYTES` for the rest), so hostile content gives a
``TrustError``, never a ``MemoryError`` or ``RecursionError``. The descriptor's bytes are
kept so a compatibility policy can compare the next version with them (spec/trust.md §6.1);
they are checked against the record's digest whenever the record is read.

Writers take turns: :meth:`StateStore.update` and :meth:`StateStore.put` hold a
process-wide ``threading.Lock`` for the directory (threads) and an exclusive ``flock`` on
the directory's ``.lock`` file (processes), both within ``lock_timeout`` seconds.
:meth:`StateStore.update` re-reads the record under the lock and lets the caller decide
against what is on disk now, so a decision (rollback, equivocation) is never taken against
a record another writer has since replaced.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import fcntl
import hashlib
import itertools
import json
import math
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core._errors import TrustError
from ..core._files import UnsafeFile, read_regular_file, write_atomically
from ..core._limits import DEFAULT_LIMITS
from ..core._values import INT64_MAX

#: The format written. :data:`FORMAT_V2` files (without ``descriptor``) and
#: :data:`FORMAT_V1` files (without ``keys`` either) are still read.
FORMAT = "cbcl-state/3"
FORMAT_V2 = "cbcl-state/2"
FORMAT_V1 = "cbcl-state/1"
#: A record's bytes other than its descriptor's base64 are at most this many.
MAX_RECORD_BYTES = 4096
#: At most this many key fingerprints are bound to one protocol id.
MAX_BOUND_KEYS = 16
#: The lock file, in the state directory.
LOCK_FILE = ".lock"
#: Seconds a writer waits for the lock by default.
DEFAULT_LOCK_TIMEOUT = 10.0
_POLL_SECONDS = 0.005  # between non-blocking flock attempts
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}\Z")
_SAFE = re.compile(r"[A-Za-z0-9_-]")
_FAILED = "descriptor verification failed"
_FIELDS_V2 = frozenset({"digest", "format", "keys", "protocol", "version"})
_FIELDS = _FIELDS_V2 | {"descriptor"}
_BASE64 = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?\Z")


def state_file_cap(max_descriptor_bytes: int) -> int:
    """The largest state file a store reads whose descriptors are at most
    ``max_descriptor_bytes``: :data:`MAX_RECORD_BYTES` plus the length of their base64."""
    return MAX_RECORD_BYTES + 4 * ((max_descriptor_bytes + 2) // 3)


#: A state file larger than this is corrupt, for a store with the default
#: ``max_descriptor_bytes`` (the reader's default ``max_message_bytes``, 1 MiB).
MAX_STATE_FILE_BYTES = state_file_cap(DEFAULT_LIMITS.max_message_bytes)

# One threading.Lock per resolved state directory, for every StateStore of this process.
_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


def _after_fork_in_child() -> None:
    """A forked child (a compile worker) starts with no lock held, whatever its parent's
    threads held at the fork."""
    global _thread_locks_guard
    _thread_locks_guard = threading.Lock()
    _thread_locks.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


@dataclass(frozen=True, slots=True)
class StateRecord:
    """The highest version of ``protocol`` accepted so far, that version's digest, the
    fingerprints (``sha256:`` + 64 hex, sorted, distinct, at most :data:`MAX_BOUND_KEYS`)
    of the keys bound to ``protocol`` by trust on first use (``()``: none), and that
    version's exact bytes (``descriptor``, whose SHA-256 is ``digest``; ``None`` when not
    known: a record written before cbcl-state/3)."""

    protocol: str
    version: int
    digest: str
    keys: tuple[str, ...] = ()
    descriptor: bytes | None = None


def file_name(protocol: str) -> str:
    """The record's file name: the id with every character outside ``[A-Za-z0-9_-]``
    written ``%XX`` (so ``/``, ``.`` and ``%`` never reach the file system), + ``.json``."""
    return "".join(c if _SAFE.match(c) else f"%{ord(c):02X}" for c in protocol) + ".json"


def _keys_problem(keys: object) -> str | None:
    if not isinstance(keys, (list, tuple)):
        return "keys is not a list"
    if len(keys) > MAX_BOUND_KEYS:
        return f"more than {MAX_BOUND_KEYS} keys"
    for key in keys:
        if not isinstance(key, str) or not _DIGEST.match(key):
            return "a key is not sha256: and 64 lowercase hex digits"
    if any(a >= b for a, b in itertools.pairwise(keys)):
        return "keys are not sorted and distinct"
    return None


def _decode_descriptor(text: str) -> bytes | None:
    """The bytes of canonical standard base64 ``text``, or ``None``."""
    if not _BASE64.match(text):
        return None
    try:
        raw = base64.b64decode(text, validate=True)
    except binascii.Error:  # pragma: no cover - the pattern admits only valid base64
        return None
    return raw if base64.b64encode(raw).decode("ascii") == text else None


def _record_problem(record: Any, protocol: str, max_descriptor_bytes: int) -> str | None:
    """Why a decoded JSON value is not a valid record for ``protocol``, or ``None``."""
    if not isinstance(record, dict):
        return "not a state record"
    form = record.get("format")
    fields = _FIELDS if form == FORMAT else _FIELDS_V2 if form == FORMAT_V2 else None
    if fields is not None:
        if set(record) != fields:
            return f"a {form} record has exactly the fields {', '.join(sorted(fields))}"
        problem = _keys_problem(record["keys"])
        if problem is not None:
            return problem
    elif form != FORMAT_V1:  # a cbcl-state/1 record: the fields checked below, no keys
        return "unknown format"
    if record.get("protocol") != protocol:
        return "not a state record for this protocol id"
    version = record.get("version")
    if type(version) is not int or not 0 <= version <= INT64_MAX:
        return "version is not an integer from 0 to 2^63-1"
    digest = record.get("digest")
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        return "digest is not sha256: and 64 lowercase hex digits"
    text = record.get("descriptor")
    if text is None:
        return None
    if not isinstance(text, str):
        return "descriptor is not a string or null"
    if len(text) > 4 * ((max_descriptor_bytes + 2) // 3):
        return f"descriptor is over {max_descriptor_bytes} bytes"
    raw = _decode_descriptor(text)
    if raw is None:
        return "descriptor is not canonical standard base64"
    if len(raw) > max_descriptor_bytes:
        return f"descriptor is over {max_descriptor_bytes} bytes"
    if "sha256:" + hashlib.sha256(raw).hexdigest() != digest:
        return "descriptor does not have the record's digest"
    return None


def _encode(record: StateRecord, max_descriptor_bytes: int) -> bytes:
    """The file content for ``record``. Raises ``ValueError`` for a record that would not
    read back (so a bad record never bricks its protocol id)."""
    if not isinstance(record, StateRecord):
        raise TypeError("a state record is a cbcl StateRecord")
    if type(record.keys) is not tuple:
        raise ValueError("not a valid state record: keys must be a tuple")
    if record.descriptor is not None and type(record.descriptor) is not bytes:
        raise ValueError("not a valid state record: descriptor must be bytes or None")
    text = None if record.descriptor is None \
        else base64.b64encode(record.descriptor).decode("ascii")
    value = {"descriptor": text, "digest": record.digest, "format": FORMAT,
             "keys": list(record.keys), "protocol": record.protocol,
             "version": record.version}
    problem = None if type(record.protocol) is str else "protocol is not a str"
    problem = problem or _record_problem(value, record.protocol, max_descriptor_bytes)
    if problem is not None:
        raise ValueError(f"not a valid state record: {problem}")
    data = json.dumps(value, sort_keys=True).encode("utf-8") + b"\n"
    cap = state_file_cap(max_descriptor_bytes)
    if len(data) > cap:
        raise ValueError(f"not a valid state record: over {cap} bytes")
    return data


def _thread_lock(key: str) -> threading.Lock:
    with _thread_locks_guard:
        lock = _thread_locks.get(key)
        if lock is None:
            lock = _thread_locks[key] = threading.Lock()
        return lock


class StateStore:
    """The state directory, created (mode 0700) if it does not exist.

    ``lock_timeout``: seconds a writer waits for the lock (:meth:`update`, :meth:`put`)
    before giving up, default :data:`DEFAULT_LOCK_TIMEOUT`. ``max_descriptor_bytes``: the
    largest descriptor a record holds (a registry passes its reader's
    ``max_message_bytes``, which bounds every descriptor it reads; default 1 MiB); a state
    file over :func:`state_file_cap` of it is corrupt. Raises :class:`TrustError` when the
    directory cannot be created or is not a directory, ``ValueError`` for a
    ``lock_timeout`` that is not a finite number ``>= 0`` or a ``max_descriptor_bytes``
    that is not a positive int.
    """

    def __init__(self, directory: str | os.PathLike[str], *,
                 lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
                 max_descriptor_bytes: int = DEFAULT_LIMITS.max_message_bytes) -> None:
        if type(lock_timeout) not in (int, float) or not math.isfinite(lock_timeout) \
                or lock_timeout < 0:
            raise ValueError("lock_timeout must be a finite number of seconds >= 0")
        if type(max_descriptor_bytes) is not int or max_descriptor_bytes < 1:
            raise ValueError("max_descriptor_bytes must be a positive int")
        self.lock_timeout = float(lock_timeout)
        self.max_descriptor_bytes = max_descriptor_bytes
        self.max_file_bytes = state_file_cap(max_descriptor_bytes)
        self.directory = Path(directory)
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise TrustError(_FAILED, cause="state", reason=f"state directory {self.directory}: "
                             f"{exc.strerror or exc}") from None
        if not self.directory.is_dir():
            raise TrustError(_FAILED, cause="state", reason=f"state directory {self.directory}: "
                             "not a directory")
        self._key = str(self.directory.resolve())

    def get(self, protocol: str) -> StateRecord | None:
        """The record for ``protocol``, or ``None`` if there is no file for it. Takes no
        lock. Raises :class:`TrustError` for a record that exists but cannot be trusted (not
        a regular file, over ``max_file_bytes``, not JSON, nested too deep, not a valid
        record for ``protocol``, a descriptor whose SHA-256 is not the digest) or cannot be
        read."""
        path = self.directory / file_name(protocol)
        try:
            data = read_regular_file(path, max_bytes=self.max_file_bytes, what=path.name)
        except FileNotFoundError:
            return None
        except UnsafeFile as exc:
            raise self._corrupt(path, str(exc).removeprefix(f"{path.name}: ")) from None
        except OSError as exc:
            raise TrustError(_FAILED, cause="state",
                             reason=f"state {path}: {exc.strerror or exc}") from None
        try:
            record = json.loads(data)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
            reason = "nested too deep" if isinstance(exc, RecursionError) else str(exc)
            raise self._corrupt(path, reason) from None
        problem = _record_problem(record, protocol, self.max_descriptor_bytes)
        if problem is not None:
            raise self._corrupt(path, problem)
        text = record.get("descriptor")
        return StateRecord(protocol, record["version"], record["digest"],
                           tuple(record.get("keys", ())),
                           None if text is None else base64.b64decode(text))

    @staticmethod
    def _corrupt(path: Path, problem: str) -> TrustError:
        return TrustError(_FAILED, cause="state", reason=f"state {path} is corrupt ({problem}); "
                          "refusing rather than forgetting it")

    def update(self, protocol: str,
               decide: Callable[[StateRecord | None], StateRecord | None],
               ) -> StateRecord | None:
        """Under the lock, read the record for ``protocol`` again and call
        ``decide(current)``. If it returns a record other than ``current`` (and not
        ``None``), write that record atomically. Returns the record current afterwards.

        Raises :class:`TrustError` when the lock is not had within ``lock_timeout`` or the
        current record cannot be trusted (:meth:`get`); whatever ``decide`` raises
        propagates, and then nothing is written; ``ValueError`` for a returned record that
        is invalid or for another protocol id; ``OSError`` from writing (old file kept)."""
        with self._locked():
            current = self.get(protocol)
            new = decide(current)
            if new is None or new == current:
                return current
            if not isinstance(new, StateRecord) or new.protocol != protocol:
                raise ValueError(f"decide must return a StateRecord for {protocol!r} or None")
            self._write(new)
            return new

    def put(self, record: StateRecord) -> None:
        """Write ``record`` atomically, under the lock. Raises :class:`TrustError` when the
        lock is not had within ``lock_timeout``, ``ValueError`` for an invalid record; on an
        ``OSError`` the old file is untouched, the temporary file removed, and it
        propagates."""
        data = _encode(record, self.max_descriptor_bytes)
        with self._locked():
            self._write(record, data)

    # ----------------------------------------------------------------- writing

    def _write(self, record: StateRecord, data: bytes | None = None) -> None:
        if data is None:
            data = _encode(record, self.max_descriptor_bytes)
        write_atomically(self.directory / file_name(record.protocol), data, suffix=".json")

    def _timeout(self) -> TrustError:
        return TrustError(_FAILED, cause="state", reason=f"state directory {self.directory} "
                          f"is locked by another writer (waited {self.lock_timeout:g} s)")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the directory's thread lock, then an exclusive flock on ``.lock``.

        The lock is written by hand with ``fcntl.flock`` rather than taken from a library
        (filelock, portalocker) because the core has exactly three run-time dependencies.
        ``flock`` has no timed wait, so it is polled with ``LOCK_NB``; the thread lock
        makes threads of this process take turns whatever ``flock`` does with them."""
        deadline = time.monotonic() + self.lock_timeout
        thread_lock = _thread_lock(self._key)
        if not thread_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise self._timeout()
        try:
            path = self.directory / LOCK_FILE
            try:
                descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW
                                     | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
            except OSError as exc:
                raise TrustError(_FAILED, cause="state", reason=f"state lock {path}: "
                                 f"{exc.strerror or exc}") from None
            try:
                if not stat.S_ISREG(os.fstat(descriptor).st_mode):
                    raise TrustError(_FAILED, cause="state",
                                     reason=f"state lock {path}: not a regular file")
                while True:
                    try:
                        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            raise self._timeout() from None
                        time.sleep(min(_POLL_SECONDS, left))
                try:
                    yield
                finally:
                    # Unlock before closing: a child forked meanwhile shares the open file
                    # description, and closing alone would leave the lock held in it.
                    fcntl.flock(descriptor, fcntl.LOCK_UN)
            finally:
                os.close(descriptor)
        finally:
            thread_lock.release()
