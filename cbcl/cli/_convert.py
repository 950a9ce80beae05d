"""``cbcl convert``: one message from one representation to another — CBCL text, its JSON
mapping (spec/cbcl-1.0.md §7.2), FIPA ACL (the SC00070 string form) or A2A (the JSON of an
A2A Message) — refusing a conversion that would lose something unless ``--lossy`` is given
(spec/interop.md, "cbcl convert"). CBCL text and its JSON mapping convert both ways without
loss.

Every conversion goes through a CBCL :class:`~cbcl.Message`: the input is read into one
(pass 1 only for CBCL text and JSON: the body is not judged, no descriptor is needed), then
written out. What either step loses is listed; without ``--lossy`` the first loss refuses the
conversion (kind ``lossy``, exit 5) and nothing is written; with it the result is written
and each loss is one ``lost: …`` line on standard error.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from ..bridges._fipa import fipa_to_message, message_to_fipa
from ..core._display import escape_invisible
from ..core._limits import DEFAULT_LIMITS, Limits
from ..core._reader import decode
from ..protocol._envelope import parse_envelope
from ..protocol._json import JSON_SIZE_FACTOR, message_from_json, message_to_json_text
from ._common import EXIT_OK, MAX_DOCUMENT_BYTES, document_bytes, read_input

if TYPE_CHECKING:
    from ..protocol._message import Message
    from ._common import Commands

FORMATS = ("cbcl", "json", "fipa", "a2a")


def _read(kind: str, data: bytes, limits: Limits, lossy: bool) -> tuple[Message, list[str]]:
    if kind == "cbcl":

        return parse_envelope(decode(data, limits), limits), []
    if kind == "json":
        return message_from_json(data, limits=limits), []
    if kind == "fipa":

        return fipa_to_message(data, lossy=lossy, limits=limits)
    from ..bridges._a2a import a2a_json_to_message

    message, losses = a2a_json_to_message(decode(data, limits), lossy=lossy)
    return message, list(losses)


def _write(kind: str, message: Message, lossy: bool) -> tuple[str, list[str]]:
    if kind == "cbcl":
        return message.canonical(), []
    if kind == "json":
        return message_to_json_text(message), []
    if kind == "fipa":

        return message_to_fipa(message, lossy=lossy)
    from ..bridges._a2a import message_to_a2a_json

    text, losses = message_to_a2a_json(message, lossy=lossy)
    return str(text), list(losses)


def _cmd_convert(args: argparse.Namespace, data: bytes) -> int:
    # JSON is read here, not by cbcl's main: its text may be up to JSON_SIZE_FACTOR times
    # the message limit (spec §7.2); every other form is bounded by the limit itself.
    factor = JSON_SIZE_FACTOR if args.source == "json" else 1
    data = read_input(args.path, sys.stdin.buffer, Limits(
        max_message_bytes=factor * args.limits.max_message_bytes))
    message, losses = _read(args.source, data, args.limits, args.lossy)
    text, more = _write(args.target, message, args.lossy)
    losses += more
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
    for loss in losses:
        print(escape_invisible(f"lost: {loss}"), file=sys.stderr)
    return EXIT_OK


def register(commands: Commands) -> None:
    """Add ``convert`` to ``commands`` (the ``add_subparsers`` action of ``cbcl``)."""
    c = commands.add_parser(
        "convert", help="convert one message between CBCL text, its JSON mapping, FIPA ACL "
                        "and A2A JSON (refusing lossy conversions without --lossy)")
    c.add_argument("path", nargs="?", default="-", metavar="file",
                   help="message file, or - for stdin")
    c.add_argument("--from", dest="source", choices=FORMATS, required=True,
                   help="what the input is: cbcl (text), json (the JSON mapping, "
                        "spec §7.2), fipa (ACL string form, SC00070), a2a (the JSON of an "
                        "A2A Message)")
    c.add_argument("--to", dest="target", choices=FORMATS, required=True,
                   help="what to write")
    c.add_argument("--lossy", action="store_true",
                   help="convert even when something is lost; list each loss on stderr")
    c.add_argument("--max-message-bytes", type=document_bytes, metavar="N",
                   default=DEFAULT_LIMITS.max_message_bytes,
                   help=f"message size limit, 1 to {MAX_DOCUMENT_BYTES} "
                        f"(default {DEFAULT_LIMITS.max_message_bytes}); JSON input may be "
                        f"{JSON_SIZE_FACTOR} times as long")
    c.set_defaults(handler=_cmd_convert, file=None)
