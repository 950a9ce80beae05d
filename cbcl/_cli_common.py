"""What every ``cbcl`` command module shares: the parser class, option groups, reading
files under the limit, the registry the options describe, and safe output."""

from __future__ import annotations

import argparse
import json
import re
from typing import BinaryIO, NoReturn

from ._json import message_to_json
from ._limits import Limits
from ._message import Message
from ._protocol import Registry

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_INTERNAL = 70  # EX_SOFTWARE


class Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line and exits 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"usage: {self.prog}: {message}\n")


def positive(text: str) -> int:
    """argparse type: a positive integer."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {text!r}")
    return value


def add_protocol_options(parser: argparse.ArgumentParser, *, descriptor_required: bool = False,
                         trust_required: bool = False, now_help: str | None = None) -> None:
    """``--descriptor`` (repeatable), ``--allow-unsigned``, ``--trust``, ``--state``,
    ``--now``: the options :func:`registry_from_args` reads."""
    parser.add_argument("--descriptor", action="append", default=[], metavar="FILE",
                        required=descriptor_required,
                        help="load a protocol descriptor, signed or (with --allow-unsigned) "
                             "not (repeatable)")
    parser.add_argument("--allow-unsigned", action="store_true",
                        help="load descriptors that carry no signature")
    add_trust_options(parser, trust_required=trust_required, now_help=now_help)


def add_trust_options(parser: argparse.ArgumentParser, *, trust_required: bool = False,
                      now_help: str | None = None) -> None:
    """``--trust``, ``--state`` and ``--now``."""
    parser.add_argument("--trust", required=trust_required, metavar="DIR",
                        help="trust store: *.pub keys (key id = file stem), policy.cbcl")
    parser.add_argument("--state", metavar="DIR",
                        help="rollback state directory (highest version and digest per id)")
    parser.add_argument("--now", type=int, metavar="MS",
                        help=now_help or "current Unix time in ms for expiry checks "
                                         "(default: the clock)")


def read_file(path: str, limits: Limits) -> bytes:
    """At most one byte past the document limit of ``path``, so an oversized file is
    refused without being read in full."""
    with open(path, "rb") as handle:
        return handle.read(limits.max_message_bytes + 1)


def read_input(path: str, stdin: BinaryIO, limits: Limits) -> bytes:
    """:func:`read_file`, or at most as much of ``stdin`` when ``path`` is ``-``."""
    if path == "-":
        return stdin.read(limits.max_message_bytes + 1)
    return read_file(path, limits)


def registry_from_args(args: argparse.Namespace) -> Registry | None:
    """The registry ``--descriptor``/``--trust``/``--state``/``--now`` describe, or
    ``None`` when none is asked for (a namespace may lack the trust options)."""
    trust = getattr(args, "trust", None)
    if not args.descriptor and not trust:
        return None
    registry = Registry(limits=args.limits, trust=trust, state_dir=getattr(args, "state", None))
    for path in args.descriptor:
        registry.load(read_file(path, args.limits), allow_unsigned=args.allow_unsigned,
                      now=getattr(args, "now", None))
    return registry


_UNSAFE_IN_OUTPUT = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def escape_invisible(text: str) -> str:
    """JSON text with control and bidirectional characters as ``\\uXXXX`` escapes, so a
    terminal never renders them (Trojan Source); the JSON value is unchanged."""
    return _UNSAFE_IN_OUTPUT.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def print_message(message: Message, as_json: bool) -> None:
    """Print a message canonically, or as one line of JSON (spec §7.2)."""
    if as_json:
        print(escape_invisible(json.dumps(message_to_json(message), ensure_ascii=False)))
    else:
        print(message.canonical())
