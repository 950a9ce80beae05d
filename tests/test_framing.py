"""Length-prefixed framing for streams (spec/binary.md §4)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, strategies as st

from cbcl import CBCLError, LimitError, MalformedError
from cbcl.binary import FrameReader, frame

payloads = st.lists(st.binary(min_size=1, max_size=300), max_size=8)


def test_frame_prefix_is_four_bytes_big_endian() -> None:
    assert frame(b"abc") == b"\x00\x00\x00\x03abc"
    assert frame(b"x" * 258)[:4] == b"\x00\x00\x01\x02"
    with pytest.raises(ValueError):
        frame(b"")


def _read_all(stream: bytes, cuts: list[int], limit: int = 1 << 20) -> list[bytes]:
    reader = FrameReader(max_frame_bytes=limit)
    out: list[bytes] = []
    start = 0
    for cut in [*sorted(cuts), len(stream)]:
        reader.feed(stream[start:cut])
        start = cut
        out.extend(reader)
    reader.close()
    return out


@given(payloads)
def test_byte_by_byte(frames: list[bytes]) -> None:
    stream = b"".join(map(frame, frames))
    assert _read_all(stream, list(range(len(stream)))) == frames


@given(payloads, st.randoms())
def test_random_chunkings(frames: list[bytes], rng: random.Random) -> None:
    stream = b"".join(map(frame, frames))
    cuts = [rng.randrange(len(stream) + 1) for _ in range(rng.randrange(6))]
    assert _read_all(stream, cuts) == frames


def test_next_frame_and_whole_stream() -> None:
    reader = FrameReader()
    reader.feed(frame(b"one") + frame(b"two") + b"\x00\x00")
    assert reader.next_frame() == b"one"
    assert reader.next_frame() == b"two"
    assert reader.next_frame() is None
    assert reader.buffered == 2
    reader.feed(b"\x00\x01z")
    assert list(reader) == [b"z"]


def test_length_over_the_limit_is_refused_before_buffering() -> None:
    reader = FrameReader(max_frame_bytes=10)
    reader.feed(frame(b"0123456789"))
    assert reader.next_frame() == b"0123456789"
    with pytest.raises(LimitError) as info:
        reader.feed(b"\x00\x00\x00\x0b" + b"A" * 11)
    assert info.value.limit == "max_message_bytes" and info.value.offset == 14
    assert reader.buffered == 0
    # a lying length of 4 GiB is refused from its prefix alone
    huge = FrameReader()
    with pytest.raises(LimitError):
        huge.feed(b"\xff\xff\xff\xff")
    # the reader stays broken
    with pytest.raises(LimitError):
        huge.feed(b"x")
    with pytest.raises(LimitError):
        huge.next_frame()


def test_zero_length_and_truncated_streams() -> None:
    reader = FrameReader()
    with pytest.raises(MalformedError):
        reader.feed(b"\x00\x00\x00\x00")
    reader = FrameReader()
    reader.feed(frame(b"abc")[:5])
    with pytest.raises(MalformedError):
        reader.close()


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        FrameReader(max_frame_bytes=0)
    with pytest.raises(TypeError):
        FrameReader(max_frame_bytes="1")  # type: ignore[arg-type]


@given(st.binary(max_size=64))
def test_any_stream_gives_frames_or_a_cbcl_error(data: bytes) -> None:
    reader = FrameReader(max_frame_bytes=32)
    try:
        for byte in data:
            reader.feed(bytes([byte]))
            list(reader)
    except CBCLError:
        pass
