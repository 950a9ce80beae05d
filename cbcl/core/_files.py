"""Reading a small local file that an operator (or an attacker with write access) placed,
and writing one atomically (:func:`write_atomically`).

:func:`read_regular_file` opens without blocking, checks the *open descriptor* (so nothing
can be swapped in between a check and the read) and reads at most one byte more than
allowed. A FIFO, a device such as ``/dev/zero``, a socket or a directory is refused, and so
is a file over the cap, even one that grows while it is read. Symbolic links are followed
(operators symlink keys), but only to a regular file (spec/trust.md §3).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile


class UnsafeFile(ValueError):
    """A file that is not a regular file, or is larger than allowed. Deliberately not a
    :class:`CBCLError`: callers wrap it into their own typed error."""


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "not a file"


def read_regular_file(path: str | os.PathLike[str], *, max_bytes: int, what: str) -> bytes:
    """The bytes of ``path``, a regular file (after following symbolic links) of at most
    ``max_bytes`` bytes. ``what`` names the file in messages (e.g. ``"alice.pub"``).

    Raises :class:`UnsafeFile` (``"<what>: not a regular file (a FIFO)"``,
    ``"<what>: larger than N bytes"``) and lets ``FileNotFoundError`` and other ``OSError``
    propagate; ``ValueError`` for a negative ``max_bytes``.
    """
    if type(max_bytes) is not int or max_bytes < 0:
        raise ValueError("max_bytes must be an int >= 0")
    # O_NONBLOCK: opening a FIFO with no writer would otherwise wait forever.
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            raise UnsafeFile(f"{what}: not a regular file ({_kind(mode)})")
        chunks: list[bytes] = []
        remaining = max_bytes + 1
        while remaining > 0:
            chunk = os.read(descriptor, min(remaining, 65536))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
    finally:
        os.close(descriptor)
    if remaining <= 0:
        raise UnsafeFile(f"{what}: larger than {max_bytes} bytes")
    return b"".join(chunks)


def write_atomically(path: str | os.PathLike[str], data: bytes, *,
                     prefix: str = ".tmp-", suffix: str = "") -> None:
    """Write ``data`` to ``path`` so that a reader sees the old file or the new one, never
    a part: a temporary file in the same directory, flushed and synced, then renamed over
    ``path``, and the directory synced where that is supported. Raises ``OSError``."""
    target = os.fspath(path)
    directory = os.path.dirname(target) or "."
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=prefix, suffix=suffix)
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
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
