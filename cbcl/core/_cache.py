"""The on-disk cache of compiled grammars: private, authenticated, never unpickled.

Theory of operation
-------------------
lark's own ``cache=True`` unpickles files from a shared temporary directory, so any local
user who can write there can run code in the loading process (lark PR #1628). This cache
stores JSON, which cannot run code, and still refuses to trust what another user could
have written:

* the directory is created with mode 0700 and is used only while it is owned by this user
  and not accessible to group or others (checked with ``lstat``: a symlink is refused);
* entries are authenticated with HMAC-SHA256 under a per-install secret (32 random bytes in
  ``secret``, mode 0600, created exclusively), so an entry copied in from elsewhere, or
  corrupted, fails verification and is simply recompiled;
* what verifies is still parsed and validated field by field before use.

Entries are written to a temporary file and renamed into place, so readers never see a
partial entry. Any problem with the cache makes it a miss, never an error.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any

_SECRET = "secret"
_MAC_LEN = 64  # hex SHA-256


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/cbcl``, or ``~/.cache/cbcl``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cbcl"


def _private(path: Path, kind: int) -> bool:
    try:
        info = path.lstat()
    except OSError:
        return False
    return (stat.S_IFMT(info.st_mode) == kind and info.st_uid == os.getuid()
            and info.st_mode & 0o077 == 0)


class DiskCache:
    """A private directory of authenticated JSON entries. Unusable directories (another
    owner, wrong mode, a symlink, read-only) turn the cache off instead of failing."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._key: bytes | None = None
        self.usable = self._prepare()

    def _prepare(self) -> bool:
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError:
            return False
        if not _private(self.directory, stat.S_IFDIR):
            return False
        secret_path = self.directory / _SECRET
        try:
            fd = os.open(secret_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                         0o600)
        except FileExistsError:
            pass
        except OSError:
            return False
        else:
            with os.fdopen(fd, "wb") as handle:
                handle.write(secrets.token_bytes(32))
        if not _private(secret_path, stat.S_IFREG):
            return False
        try:
            self._key = secret_path.read_bytes()
        except OSError:
            return False
        return len(self._key) == 32

    def _mac(self, body: bytes) -> str:
        assert self._key is not None
        return hmac.new(self._key, body, hashlib.sha256).hexdigest()

    def _path(self, key: str) -> Path:
        return self.directory / (hashlib.sha256(key.encode()).hexdigest() + ".json")

    def get(self, key: str) -> Any:
        """The JSON value stored under ``key``, or ``None`` (missing, foreign, corrupt)."""
        if not self.usable:
            return None
        path = self._path(key)
        if not _private(path, stat.S_IFREG):
            return None
        try:
            blob = path.read_bytes()
        except OSError:
            return None
        mac, body = blob[:_MAC_LEN].decode("ascii", "replace"), blob[_MAC_LEN + 1 :]
        if not hmac.compare_digest(mac, self._mac(body)):
            return None
        try:
            entry = json.loads(body)
        except ValueError:
            return None
        return entry.get("value") if type(entry) is dict and entry.get("key") == key else None

    def put(self, key: str, value: Any) -> None:
        """Store ``value`` (JSON-able) under ``key``; failures are ignored."""
        if not self.usable:
            return
        body = json.dumps({"key": key, "value": value}, separators=(",", ":")).encode()
        path = self._path(key)
        temporary = path.with_suffix(f".{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                         0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(self._mac(body).encode() + b"\n" + body)
            os.replace(temporary, path)
        except OSError:
            with contextlib.suppress(OSError):
                temporary.unlink()
