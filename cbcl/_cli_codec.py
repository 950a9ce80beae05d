"""The ``cbcl encode`` and ``cbcl decode`` subcommands (spec/binary.md §6).

:func:`register` adds them to the ``cbcl`` parser's subcommands; the handlers take
``(args, data)`` like the others, and ``main`` in :mod:`cbcl._cli` reads the input, maps
errors to exit codes and prints them.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from ._codec import Decoder, Encoder
from ._limits import DEFAULT_LIMITS
from ._protocol import Registry

_UNSAFE_IN_OUTPUT = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {text!r}")
    return value


def _registry(args: argparse.Namespace) -> Registry:
    registry = Registry(limits=args.limits)
    for path in args.descriptor:
        with open(path, "rb") as handle:
            registry.load(handle.read(args.limits.max_message_bytes + 1),
                          allow_unsigned=args.allow_unsigned)
    return registry


def _cmd_encode(args: argparse.Namespace, data: bytes) -> int:
    from ._api import parse

    registry = _registry(args)
    message = parse(data, limits=args.limits, registry=registry)  # fully recognised
    frame = Encoder(registry).encode(message)
    if args.output == "-":
        sys.stdout.buffer.write(frame)
        sys.stdout.buffer.flush()
    else:
        with open(args.output, "wb") as handle:
            handle.write(frame)
    return 0


def _cmd_decode(args: argparse.Namespace, data: bytes) -> int:
    from ._json import message_to_json

    message = Decoder(_registry(args), limits=args.limits).decode(data)
    if args.json:
        text = json.dumps(message_to_json(message), ensure_ascii=False)
        print(_UNSAFE_IN_OUTPUT.sub(lambda m: f"\\u{ord(m.group()):04x}", text))
    else:
        print(message.canonical())
    return 0


def register(commands: Any) -> None:
    """Add ``encode`` and ``decode`` to ``commands`` (the ``add_subparsers`` action of the
    ``cbcl`` parser)."""
    e = commands.add_parser("encode", help="encode one message (text) as a binary frame")
    e.add_argument("file", nargs="?", default="-", help="message file, or - for stdin")
    e.add_argument("-o", "--output", default="-", metavar="OUT",
                   help="where to write the frame (default: stdout)")
    e.set_defaults(handler=_cmd_encode)

    d = commands.add_parser("decode", help="decode and recognise one binary frame; print "
                            "its canonical text")
    d.add_argument("file", nargs="?", default="-", help="frame file, or - for stdin")
    d.add_argument("--json", action="store_true", help="print the message as JSON")
    d.set_defaults(handler=_cmd_decode)

    for sub in (e, d):
        sub.add_argument("--descriptor", action="append", required=True, metavar="FILE",
                         help="load a protocol descriptor (repeatable)")
        sub.add_argument("--allow-unsigned", action="store_true",
                         help="load descriptors that carry no signature")
        sub.add_argument("--max-message-bytes", type=_positive, metavar="N",
                         default=DEFAULT_LIMITS.max_message_bytes,
                         help="document (and frame) size limit "
                              f"(default {DEFAULT_LIMITS.max_message_bytes})")
