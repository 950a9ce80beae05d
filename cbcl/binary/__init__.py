"""The binary form (spec/binary.md): encoders, decoders and length-prefixed frames."""

from ._codec import Decoder, Encoder, decode, encode
from ._framing import FrameReader, frame

__all__ = ["Decoder", "Encoder", "FrameReader", "decode", "encode", "frame"]
