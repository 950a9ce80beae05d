"""The commands for messages written by models: ``cbcl extract`` and ``cbcl prompt``, and
the ``--hint`` of ``cbcl parse`` (:func:`with_hint`).

``extract`` reads a model's output (up to :data:`cbcl.llm._extract.INPUT_FACTOR` times the
message limit), finds the CBCL message(s) in it and prints each one's canonical form, one a
line (``--json``: one JSON object a line, with its span and the text dropped around it).
``prompt`` prints a system-prompt section for one descriptor (:mod:`cbcl.llm._prompt`).
A refusal is the usual error line on stderr; with ``--hint`` its repair hint follows it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from ..core._display import escape_invisible
from ..core._errors import CBCLError, TrustError
from ..core._limits import DEFAULT_LIMITS, Limits
from ..core._reader import read
from ..llm._extract import INPUT_FACTOR, extract
from ..llm._prompt import render_prompt
from ..protocol._json import message_to_json
from ..protocol._message import Intent
from ..protocol._registry import Registry
from ..protocol._trust import read_signed_descriptor_unverified
from ._common import (
    EXIT_OK,
    MAX_DOCUMENT_BYTES,
    Commands,
    add_protocol_options,
    binary_frame_hint,
    document_bytes,
    int_in,
    read_input,
    registry_from_args,
    usage_error,
)

Handler = Callable[[argparse.Namespace, bytes], int]


def print_refusal(exc: CBCLError, data: bytes, path: str | None) -> int:
    """Print ``exc``'s error line, as ``cbcl`` prints every error, then its hint; return
    its exit code."""
    binary_frame_hint(exc, data, path)
    print(escape_invisible(exc.one_line()), file=sys.stderr)
    print(exc.hint(), file=sys.stderr)  # every line of a hint is escaped already
    return exc.exit_code


def with_hint(handler: Handler) -> Handler:
    """``handler``, printing the hint after the error line when ``--hint`` is given (a
    trust failure keeps its one line: its precise reason is for the operator only)."""

    def run(args: argparse.Namespace, data: bytes) -> int:
        try:
            return handler(args, data)
        except CBCLError as exc:
            if not getattr(args, "hint", False) or isinstance(exc, TrustError):
                raise
            return print_refusal(exc, data, args.file)

    return run


def _cmd_extract(args: argparse.Namespace, data: bytes) -> int:

    maximum = args.max_input_bytes or min(INPUT_FACTOR * args.limits.max_message_bytes,
                                          MAX_DOCUMENT_BYTES)
    data = read_input(args.input, sys.stdin.buffer, Limits(max_message_bytes=maximum))
    try:
        found = extract(data, registry=registry_from_args(args), limits=args.limits,
                        envelope_only=args.envelope_only, max_input_bytes=maximum)
    except CBCLError as exc:
        if not args.hint or isinstance(exc, TrustError):
            raise
        return print_refusal(exc, data, args.input)
    for item in found:
        if args.json:
            record = {
                "start": item.start, "end": item.end, "text": item.text,
                "message": message_to_json(item.message),
                "dropped": [{"start": span.start, "end": span.end, "kind": span.kind,
                             "text": span.text} for span in item.dropped],
            }
            print(escape_invisible(json.dumps(record, ensure_ascii=False)))
        else:
            print(item.message.canonical())
    return EXIT_OK


def _cmd_prompt(args: argparse.Namespace, data: bytes) -> int:

    intent = None
    if args.intent is not None:
        try:
            intent = Intent(args.intent)
        except ValueError:
            usage_error("prompt", f"--intent: {args.intent!r} is not an intent")
    document = read(data, limits=args.limits)
    payload = data
    if type(document) is tuple and document and str(document[0]) == "signed-descriptor":
        payload = read_signed_descriptor_unverified(data, limits=args.limits).payload
    registry = Registry(limits=args.limits, disk_cache=False)
    protocol = registry.load(payload, allow_unsigned=True)
    try:
        text = render_prompt(protocol, registry=registry, intent=intent,
                             count=args.examples, seed=args.seed)
    except ValueError as exc:
        if isinstance(exc, CBCLError):  # (a budget: LimitError is a ValueError too)
            raise
        usage_error("prompt", str(exc))
    sys.stdout.write("\n".join(escape_invisible(line) for line in text.split("\n")))
    sys.stdout.flush()
    return EXIT_OK


def register(commands: Commands) -> None:
    """Add ``extract`` and ``prompt`` to ``commands`` (the ``cbcl`` subcommands)."""
    e = commands.add_parser("extract", help="find and recognise the CBCL message(s) in a "
                            "model's output (fences, prose); print each one")
    e.add_argument("input", nargs="?", default="-", metavar="FILE",
                   help="the model's output, or - for stdin")
    e.add_argument("--envelope-only", action="store_true",
                   help="stop after pass 1 (the envelope); do not judge the bodies")
    e.add_argument("--json", action="store_true",
                   help="print one JSON object a message: span, text, message, dropped text")
    e.add_argument("--hint", action="store_true",
                   help="after an error line, print how to fix the input")
    e.add_argument("--max-input-bytes", type=document_bytes, metavar="N", default=None,
                   help="input size limit (default 4 x --max-message-bytes)")
    add_protocol_options(e)
    e.set_defaults(handler=_cmd_extract, file=None)

    p = commands.add_parser("prompt", help="print a system-prompt section that teaches a "
                            "model one protocol (NOT a verification of the descriptor)")
    p.add_argument("file", metavar="DESCRIPTOR", help="descriptor file (signed or not), or -")
    p.add_argument("--intent", metavar="I", default=None,
                   help="only this intent's body and examples")
    p.add_argument("--examples", type=int_in(0, 20), default=1, metavar="N",
                   help="examples per body form (0 to 20, default 1)")
    p.add_argument("--seed", type=int_in(0, 1 << 32), default=0, metavar="S",
                   help="the examples' seed (default 0)")
    p.set_defaults(handler=_cmd_prompt)

    for sub in (e, p):
        sub.add_argument("--max-message-bytes", type=document_bytes, metavar="N",
                         default=DEFAULT_LIMITS.max_message_bytes,
                         help=f"message (and descriptor) size limit, 1 to "
                              f"{MAX_DOCUMENT_BYTES} (default "
                              f"{DEFAULT_LIMITS.max_message_bytes})")
