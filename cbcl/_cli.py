"""The ``cbcl`` command line (draft §6).

Every failure is one line on stderr, ``kind line:column: message``, and the exit code of
draft §6; a traceback is never shown. Files and stdin are read here, at the edge; the
library below only sees bytes.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from typing import BinaryIO, NoReturn

from . import __version__
from ._api import canonical, parse
from ._errors import CBCLError
from ._json import message_to_json
from ._limits import DEFAULT_LIMITS, Limits
from ._protocol import Registry

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_INTERNAL = 70  # EX_SOFTWARE


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {text!r}")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line and exits 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"usage: {self.prog}: {message}\n")


def _read_input(path: str, stdin: BinaryIO, limits: Limits) -> bytes:
    """The bytes of ``path`` (``-`` for stdin), reading at most one byte past the message
    limit so that an oversized input is refused without being slurped."""
    cap = limits.max_message_bytes + 1
    if path == "-":
        return stdin.read(cap)
    with open(path, "rb") as handle:
        return handle.read(cap)


def _registry(args: argparse.Namespace) -> Registry | None:
    if not args.descriptor:
        return None
    registry = Registry(limits=args.limits)
    for path in args.descriptor:
        with open(path, "rb") as handle:
            registry.load(handle.read(args.limits.max_message_bytes + 1),
                          allow_unsigned=args.allow_unsigned)
    return registry


def _cmd_parse(args: argparse.Namespace, data: bytes) -> int:
    message = parse(data, envelope_only=args.envelope_only, limits=args.limits,
                    registry=_registry(args))
    if args.json:
        print(_escape_invisible(json.dumps(message_to_json(message), ensure_ascii=False)))
    else:
        print(canonical(message))
    return EXIT_OK


_UNSAFE_IN_OUTPUT = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def _escape_invisible(text: str) -> str:
    """JSON text with control and bidirectional characters as ``\\uXXXX`` escapes, so a
    terminal never renders them (Trojan Source); the JSON value is unchanged."""
    return _UNSAFE_IN_OUTPUT.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _cmd_canon(args: argparse.Namespace, data: bytes) -> int:
    from ._reader import read

    sys.stdout.write(canonical(read(data, limits=args.limits)))
    sys.stdout.flush()
    return EXIT_OK


def _cmd_grammar_check(args: argparse.Namespace, data: bytes) -> int:
    from ._compile import compile_guarded
    from ._descriptor import read_descriptor
    from ._errors import GrammarError
    from ._lr import LALR1
    from ._reader import TOKEN

    # A descriptor starts, after comments, with "(protocol-descriptor"; anything else is
    # taken as grammar text.
    head = TOKEN.match(data.decode("utf-8", "replace"))
    is_descriptor = head is not None and head.lastindex == 1 and data[head.end():].lstrip(
        ).startswith(b"protocol-descriptor")
    try:
        grammar: str | bytes = read_descriptor(data, limits=args.limits).grammar \
            if is_descriptor else data
        compiled = compile_guarded(grammar.decode("utf-8") if isinstance(grammar, bytes)
                                   and _is_utf8(grammar) else grammar)  # type: ignore[arg-type]
    except GrammarError as exc:
        print("rejected")
        print(exc.one_line())
        if exc.context:
            print(exc.context)
        return exc.exit_code
    print(compiled.report.rstrip("\n"))
    return EXIT_OK if compiled.verdict == LALR1 else 5


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="cbcl", description="CBCL protocol engine.")
    parser.add_argument("--version", action="version", version=f"cbcl {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = commands.add_parser("parse", help="parse and recognise one message")
    p.add_argument("file", nargs="?", default="-", help="message file, or - for stdin")
    p.add_argument("--envelope-only", action="store_true",
                   help="stop after pass 1 (the envelope); do not judge the body")
    p.add_argument("--json", action="store_true", help="print the message as JSON")
    p.set_defaults(handler=_cmd_parse)

    c = commands.add_parser("canon", help="print the canonical form of one value")
    c.add_argument("file", nargs="?", default="-", help="input file, or - for stdin")
    c.set_defaults(handler=_cmd_canon)

    p.add_argument("--descriptor", action="append", default=[], metavar="FILE",
                   help="load a protocol descriptor (repeatable)")
    p.add_argument("--allow-unsigned", action="store_true",
                   help="load descriptors that carry no signature")

    g = commands.add_parser("grammar", help="work with descriptor grammars")
    grammar_commands = g.add_subparsers(dest="grammar_command", required=True,
                                        parser_class=_Parser)
    check = grammar_commands.add_parser(
        "check", help="check a grammar (or a descriptor's grammar); exit 0 only for LALR(1)")
    check.add_argument("file", nargs="?", default="-", help="grammar or descriptor file")
    check.set_defaults(handler=_cmd_grammar_check)

    for sub in (p, c, check):
        sub.add_argument("--max-message-bytes", type=_positive, metavar="N",
                         default=DEFAULT_LIMITS.max_message_bytes,
                         help=f"document size limit (default {DEFAULT_LIMITS.max_message_bytes})")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    args = build_parser().parse_args(argv)
    args.limits = Limits(max_message_bytes=args.max_message_bytes)
    try:
        data = _read_input(args.file, sys.stdin.buffer, args.limits)
        return int(args.handler(args, data))
    except CBCLError as exc:
        print(f"{exc.one_line()}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        print(f"io: {exc.filename or args.file}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug: still one line, never a traceback
        print(f"internal: {type(exc).__name__}: {exc} (please report this)", file=sys.stderr)
        return EXIT_INTERNAL
