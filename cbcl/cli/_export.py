"""``cbcl grammar export``: a protocol's messages as a grammar for constrained decoding
(llguidance, GBNF, lark) or as a JSON Schema of their JSON mapping (spec/llm.md)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from ..core._errors import CBCLError
from ..llm._export import FORMATS, export_grammar
from ._common import EXIT_OK, usage_error

if TYPE_CHECKING:
    from ._common import Commands

_INTENTS = ("PROPOSE", "ACCEPT", "REJECT", "INFORM", "QUERY", "REQUEST", "CFP", "SUBSCRIBE",
            "NOTIFY", "AGREE", "REFUSE", "FAILURE", "CANCEL", "CONFIRM", "NOT-UNDERSTOOD")


def _cmd_export(args: argparse.Namespace, data: bytes) -> int:

    try:
        export = export_grammar(data, args.format, intent=args.intent,
                                schema=not args.no_schema)
    except ValueError as exc:

        if isinstance(exc, CBCLError):
            raise
        usage_error("cbcl grammar export", str(exc))
    sys.stdout.write(export.text)
    sys.stdout.flush()
    if args.notes:
        for note in export.not_carried:
            print(f"not carried: {note}", file=sys.stderr)
    return EXIT_OK


def register(grammar_commands: Commands) -> None:
    """Add ``export`` to ``grammar_commands`` (the subcommands of ``cbcl grammar``)."""

    export = grammar_commands.add_parser(
        "export", help="a protocol's messages as a grammar for constrained decoding "
                       "(llguidance, gbnf, lark) or a JSON Schema of their JSON mapping")
    export.add_argument("file", nargs="?", default="-",
                        help="descriptor (signed or not; nothing is verified), or - for stdin")
    export.add_argument("--format", choices=FORMATS, default="llguidance",
                        help="output format (default llguidance)")
    export.add_argument("--intent", choices=_INTENTS, default=None,
                        help="only the messages of this intent (default: every governed "
                             "intent, each with its own body)")
    export.add_argument("--no-schema", action="store_true",
                        help="the grammar alone, without the schema's constraints")
    export.add_argument("--notes", action="store_true",
                        help="also list on stderr what the export does not carry")
    export.set_defaults(handler=_cmd_export)
