"""Framing for streams (spec/binary.md §4): every frame is preceded by its length, four
bytes big-endian. :class:`FrameReader` is sans-io: it never touches a socket; the caller
feeds it bytes as they arrive and takes complete frames out.

A length over ``max_frame_bytes`` is refused as soon as its four bytes are read, before
any byte of the frame is buffered; a length of 0 is refused as malformed. After an error
the reader is broken: every later call raises the same error (the stream cannot be
resynchronised).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from ..core._errors import CBCLError, LimitError, MalformedError, Position
from ..core._limits import DEFAULT_LIMITS

PREFIX_BYTES = 4
MAX_PREFIXED = (1 << 32) - 1


def frame(payload: bytes | bytearray | memoryview) -> bytes:
    """``payload`` preceded by its length prefix.

    Raises ``ValueError`` for an empty payload or one of 2**32 bytes or more.
    """
    size = len(payload)
    if not 0 < size <= MAX_PREFIXED:
        raise ValueError(f"a frame holds 1 to {MAX_PREFIXED} bytes, not {size}")
    return size.to_bytes(PREFIX_BYTES, "big") + bytes(payload)


def prefix_error(size: int, limit: int, offset: int) -> CBCLError | None:
    """The error for a length prefix announcing ``size`` bytes where frames hold at most
    ``limit`` (at stream ``offset``), or ``None`` when it is acceptable."""
    if size > limit:
        return LimitError(f"frame of {size} bytes exceeds the limit of {limit}",
                          limit="max_message_bytes", maximum=limit,
                          position=Position(0, 0, offset))
    if size == 0:
        return MalformedError("a frame length of 0", position=Position(0, 0, offset))
    return None


class FrameReader:
    """Splits a byte stream into frames. ``feed(chunk)`` takes bytes as they arrive;
    ``next_frame()`` returns the next complete frame or ``None``; iterating yields every
    complete frame available now.

    ``max_frame_bytes`` (default: the message size limit, 1 MiB) bounds one frame.
    Raises :class:`LimitError` for a prefix over it and :class:`MalformedError` for a
    zero prefix, both positioned at the prefix's offset in the stream.
    """

    def __init__(self, max_frame_bytes: int = DEFAULT_LIMITS.max_message_bytes) -> None:
        if type(max_frame_bytes) is not int:
            raise TypeError("max_frame_bytes must be an int")
        if not 1 <= max_frame_bytes <= MAX_PREFIXED:
            raise ValueError(f"max_frame_bytes must be from 1 to {MAX_PREFIXED}")
        self.max_frame_bytes = max_frame_bytes
        self._prefix = bytearray()
        self._body = bytearray()
        self._needed = -1  # bytes still missing from the current frame; -1: reading a prefix
        self._frames: deque[bytes] = deque()
        self._offset = 0  # stream offset of the next byte fed
        self._frame_at = 0  # stream offset of the current prefix
        self._error: CBCLError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held for a frame not yet complete (prefix included)."""
        return len(self._prefix) + len(self._body)

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Take the next bytes of the stream. Raises as described in the class doc."""
        self._check()
        view = memoryview(data).cast("B")
        pos = 0
        end = len(view)
        while pos < end:
            if self._needed < 0:
                if not self._prefix:
                    self._frame_at = self._offset + pos
                take = min(PREFIX_BYTES - len(self._prefix), end - pos)
                self._prefix += view[pos : pos + take]
                pos += take
                if len(self._prefix) < PREFIX_BYTES:
                    break
                size = int.from_bytes(self._prefix, "big")
                error = prefix_error(size, self.max_frame_bytes, self._frame_at)
                if error is not None:
                    self._fail(error)
                self._needed = size
            take = min(self._needed, end - pos)
            self._body += view[pos : pos + take]
            pos += take
            self._needed -= take
            if self._needed == 0:
                self._frames.append(bytes(self._body))
                self._body.clear()
                self._prefix.clear()
                self._needed = -1
        self._offset += end

    def next_frame(self) -> bytes | None:
        """The next complete frame, or ``None`` if none is complete yet."""
        if self._frames:
            return self._frames.popleft()
        self._check()
        return None

    def __iter__(self) -> Iterator[bytes]:
        while self._frames:
            yield self._frames.popleft()

    def close(self) -> None:
        """Declare the end of the stream: raises :class:`MalformedError` if it ends inside
        a frame (complete frames not yet taken remain available)."""
        self._check()
        if self.buffered:
            self._fail(MalformedError(
                f"the stream ends inside a frame ({self.buffered} bytes buffered)",
                position=Position(0, 0, self._offset)))

    def _fail(self, error: CBCLError) -> None:
        self._error = error
        self._prefix.clear()
        self._body.clear()
        raise error

    def _check(self) -> None:
        if self._error is not None:
            error = self._error
            if isinstance(error, LimitError):
                raise type(error)(error.message, limit=error.limit, maximum=error.maximum,
                                  position=error.position)
            raise type(error)(error.message, position=error.position)
