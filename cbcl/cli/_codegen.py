"""``cbcl codegen``: Python record classes for a descriptor's schema (spec/declarations.md §9)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..core._display import escape_invisible
from ..core._reader import read
from ..core._values import Symbol
from ..protocol._codegen import generate_records
from ..protocol._trust import read_signed_descriptor_unverified
from ._common import EXIT_OK, Commands


def _cmd_codegen(args: argparse.Namespace, data: bytes) -> int:
    document = read(data, limits=args.limits)
    if type(document) is tuple and document and document[0] == Symbol("signed-descriptor"):
        data = read_signed_descriptor_unverified(data, limits=args.limits).payload
    source = generate_records(data)
    if args.output == "-":
        sys.stdout.write(source)
        return EXIT_OK
    Path(args.output).write_text(source, encoding="utf-8")
    print(escape_invisible(f"wrote {args.output}"), file=sys.stderr)
    return EXIT_OK


def register(commands: Commands) -> None:
    """Add ``codegen`` to ``commands`` (the ``add_subparsers`` action of ``cbcl``)."""
    c = commands.add_parser(
        "codegen", help="write typed record classes (cbcl.Record) for a descriptor's schema")
    c.add_argument("file", metavar="DESCRIPTOR", help="descriptor file (signed or not), or -")
    c.add_argument("-o", "--output", required=True, metavar="OUT",
                   help="the Python module to write, or - for stdout")
    c.set_defaults(handler=_cmd_codegen)
