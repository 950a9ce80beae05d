"""The ``cbcl encode`` and ``cbcl decode`` subcommands (spec/binary.md §6).

:func:`register` adds them to the ``cbcl`` parser's subcommands; the handlers take
``(args, data)`` like the others, and ``main`` in :mod:`cbcl.cli._main` reads the input, maps
errors to exit codes and prints them.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from ..binary._codec import Decoder, Encoder
from ..core._errors import MalformedError
from ..core._limits import DEFAULT_LIMITS
from ..protocol._api import parse
from ._common import (
    MAX_DOCUMENT_BYTES,
    Commands,
    add_protocol_options,
    document_bytes,
    print_message,
    registry_from_args as _registry,
)


def _cmd_encode(args: argparse.Namespace, data: bytes) -> int:

    registry = _registry(args)
    assert registry is not None  # --descriptor is required
    message = parse(data, limits=args.limits, registry=registry)  # fully recognised
    frame = Encoder(registry, validate=False, limits=args.limits).encode(message)  # parsed
    if args.output == "-":
        sys.stdout.buffer.write(frame)
        sys.stdout.buffer.flush()
    else:
        with open(args.output, "wb") as handle:
            handle.write(frame)
    return 0


def _cmd_decode(args: argparse.Namespace, data: bytes) -> int:
    registry = _registry(args)
    assert registry is not None  # --descriptor is required
    try:
        message = Decoder(registry, limits=args.limits).decode(data)
    except MalformedError as exc:
        if exc.offset == 0 and data.lstrip()[:1] in (b"(", b";"):  # the other way round
            exc.message += ("; this looks like CBCL text: read it with `cbcl parse "
                            f"{shlex.quote(args.file)} --descriptor D`")
            exc.args = (exc.message,)
        raise
    print_message(message, args.json)
    return 0


def register(commands: Commands) -> None:
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
        add_protocol_options(sub, descriptor_required=True)
        sub.add_argument("--max-message-bytes", type=document_bytes, metavar="N",
                         default=DEFAULT_LIMITS.max_message_bytes,
                         help=f"document (and frame) size limit, 1 to {MAX_DOCUMENT_BYTES} "
                              f"(default {DEFAULT_LIMITS.max_message_bytes})")
