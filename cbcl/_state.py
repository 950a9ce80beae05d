"""Trusted state: per protocol id, the highest descriptor version accepted and its digest.

One JSON file per protocol id in a private directory, written atomically (a temporary file
in the same directory, flushed and synced, then renamed over the old one), so a crash
leaves the old record or the new one, never half of either. A file that cannot be read or
does not hold a valid record refuses every load of its protocol id: deleting state is how
an attacker would re-open rollback, so an unreadable record never reads as "no record".
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ._errors import TrustError
from ._values import INT64_MAX

FORMAT = "cbcl-state/1"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}\Z")
_SAFE = re.compile(r"[A-Za-z0-9_-]")
_FAILED = "descriptor verification failed"


@dataclass(frozen=True, slots=True)
class StateRecord:
    """The highest version of ``protocol`` accepted so far, and that version's digest."""

    protocol: str
    version: int
    digest: str


def file_name(protocol: str) -> str:
    """The record's file name: the id with every character outside ``[A-Za-z0-9_-]``
    written ``%XX`` (so ``/``, ``.`` and ``%`` never reach the file system), + ``.json``."""
    return "".join(c if _SAFE.match(c) else f"%{ord(c):02X}" for c in protocol) + ".json"


class StateStore:
    """The state directory. Created (mode 0700) if it does not exist."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise TrustError(_FAILED, reason=f"state directory {self.directory}: "
                             f"{exc.strerror or exc}") from None
        if not self.directory.is_dir():
            raise TrustError(_FAILED, reason=f"state directory {self.directory}: "
                             "not a directory")

    def get(self, protocol: str) -> StateRecord | None:
        """The record for ``protocol``, or ``None`` if there is none. Raises
        :class:`TrustError` for a record that exists but cannot be trusted."""
        path = self.directory / file_name(protocol)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise TrustError(_FAILED, reason=f"state {path}: {exc.strerror or exc}") from None
        try:
            record = json.loads(data)
            if not (isinstance(record, dict) and record.get("format") == FORMAT
                    and record.get("protocol") == protocol
                    and type(record.get("version")) is int
                    and 0 <= record["version"] <= INT64_MAX
                    and isinstance(record.get("digest"), str)
                    and _DIGEST.match(record["digest"])):
                raise ValueError("not a state record for this protocol id")
        except ValueError as exc:
            raise TrustError(_FAILED, reason=f"state {path} is corrupt ({exc}); "
                             "refusing rather than forgetting it") from None
        return StateRecord(protocol, record["version"], record["digest"])

    def put(self, record: StateRecord) -> None:
        """Write ``record`` atomically. On failure the old file is untouched and the
        temporary file removed; the ``OSError`` propagates."""
        data = json.dumps({"format": FORMAT, "protocol": record.protocol,
                           "version": record.version, "digest": record.digest},
                          sort_keys=True).encode("utf-8") + b"\n"
        target = self.directory / file_name(record.protocol)
        handle, temporary = tempfile.mkstemp(dir=self.directory, prefix=".tmp-",
                                             suffix=".json")
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        with contextlib.suppress(OSError):  # make the rename durable where supported
            directory = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
