"""What every ``cbcl`` command module shares: the parser class, option groups, reading
files under the limit, the registry the options describe, and safe output."""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import sys
import unicodedata
from collections.abc import Callable, Iterable
from typing import BinaryIO, NoReturn, TypeAlias, TypeVar, overload

from ._errors import CBCLError, MalformedError
from ._json import message_to_json
from ._limits import Limits
from ._message import Message
from ._registry import Registry

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_INTERNAL = 70  # EX_SOFTWARE

INT64_MAX = (1 << 63) - 1
#: The largest ``--max-message-bytes``: 1 GiB (``Limits`` itself has no upper bound, but the
#: CLI reads up to this much input into memory).
MAX_DOCUMENT_BYTES = 1 << 30
#: The longest timeout any option accepts: one day (as the transport's own check).
MAX_SECONDS = 86_400.0

_N = TypeVar("_N")


class Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line and exits 2, naming the (sub)command
    whose arguments they are."""

    @overload
    def parse_known_args(self, args: Iterable[str] | None = None,
                         namespace: None = None) -> tuple[argparse.Namespace, list[str]]: ...
    @overload
    def parse_known_args(self, args: Iterable[str] | None,
                         namespace: _N) -> tuple[_N, list[str]]: ...
    @overload
    def parse_known_args(self, *, namespace: _N) -> tuple[_N, list[str]]: ...

    def parse_known_args(self, args: Iterable[str] | None = None, namespace: _N | None = None
                         ) -> tuple[_N | argparse.Namespace, list[str]]:
        # A subcommand's parser leaves the arguments it does not know to its parent, which
        # would report them under its own name ("usage: cbcl: unrecognized arguments"):
        # the parser that saw them reports them, as "usage: cbcl encode: …". (A subcommand
        # takes every argument after its name, so no parent could have used them.)
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error("unrecognized arguments: " + " ".join(extras))
        return parsed, extras

    def error(self, message: str) -> NoReturn:
        # The message may quote the operator's argument: keep it one visible line.
        self.exit(EXIT_USAGE, f"usage: {self.prog}: {escape_invisible(message)}\n")


#: The ``add_subparsers`` action a command module adds its commands to.
Commands: TypeAlias = "argparse._SubParsersAction[Parser]"


_INTEGER = re.compile(r"[+-]?[0-9]{1,20}")


def int_in(low: int, high: int) -> Callable[[str], int]:
    """argparse type: a decimal integer from ``low`` to ``high`` inclusive. Anything else
    (not an integer, out of range, more than 20 digits) is a usage error."""
    if low > high:
        raise ValueError(f"int_in({low}, {high}): empty range")

    def parse(text: str) -> int:
        stripped = text.strip()
        if _INTEGER.fullmatch(stripped) is None or not low <= int(stripped) <= high:
            raise argparse.ArgumentTypeError(
                f"expected an integer from {low} to {high}, not {_shown(text)}")
        return int(stripped)

    parse.__name__ = f"int_in({low}, {high})"
    return parse


def seconds(low: float, high: float = MAX_SECONDS) -> Callable[[str], float]:
    """argparse type: a finite number of seconds from ``low`` to ``high`` inclusive, with
    ``0 < low``: ``nan``, ``inf``, zero, negative and absurdly large values are usage
    errors."""
    if not 0 < low <= high or not math.isfinite(high):
        raise ValueError(f"seconds({low}, {high}): need 0 < low <= high, finite")

    def parse(text: str) -> float:
        try:
            value = float(text) if len(text) <= 32 else math.nan
        except ValueError:
            value = math.nan
        if not low <= value <= high:  # NaN fails both
            raise argparse.ArgumentTypeError(
                f"expected seconds from {low:g} to {high:g}, not {_shown(text)}")
        return value

    parse.__name__ = f"seconds({low:g}, {high:g})"
    return parse


#: argparse type: a positive integer (what ``cbcl.Limits`` accepts), up to INT64_MAX.
positive = int_in(1, INT64_MAX)
#: argparse type for ``--now``: Unix time in ms, 0 to INT64_MAX.
unix_ms = int_in(0, INT64_MAX)
#: argparse type for ``--max-message-bytes``: 1 to :data:`MAX_DOCUMENT_BYTES`.
document_bytes = int_in(1, MAX_DOCUMENT_BYTES)


def _shown(text: str) -> str:
    """The operator's argument, quoted, escaped and shortened, for a usage error."""
    return f'"{escape_invisible(text, quote=True, limit=40)}"'


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
    parser.add_argument("--now", type=unix_ms, metavar="MS",
                        help=now_help or "current Unix time in ms for expiry checks, 0 to "
                                         f"{INT64_MAX} (default: the clock)")


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


def binary_frame_hint(exc: CBCLError, data: bytes, path: str | None = None) -> None:
    """When a command that reads text was given a binary frame (spec/binary.md: its magic
    is never valid UTF-8, so the reader says only "invalid UTF-8" at byte 0), add to the
    error's message what the input seems to be and the command that reads it."""
    from ._codec import MAGIC  # imported when needed: every command imports this module

    if isinstance(exc, MalformedError) and exc.offset == 0 and bytes(data[:2]) == MAGIC:
        shown = shlex.quote(path) if path else "FILE"
        exc.message += ("; this looks like a binary CBCL frame (it starts with the magic "
                        f"CB 4C): read it with `cbcl decode {shown} --descriptor D`")
        exc.args = (exc.message,)


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


_NOT_PRINTABLE_ASCII = re.compile("[^\x20-\x7e]")
#: Categories never shown raw: controls (C0, DEL, C1), format characters (bidirectional
#: controls, zero-width characters, U+FEFF, tags …), surrogates, private use, unassigned,
#: line and paragraph separators, and spaces other than SP (which look like SP).
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"})
#: Blank-looking characters of other categories: the combining grapheme joiner, the Hangul
#: fillers, the braille blank.
_UNSAFE_EXTRA = frozenset("\u034f\u115f\u1160\u2800\u3164\uffa0")


def _escape(char: str, quote: bool) -> str:
    """One character as it is shown: itself, or its escape."""
    if " " <= char <= "~":
        return "\\" + char if quote and char in '\\"' else char
    if char not in _UNSAFE_EXTRA and unicodedata.category(char) not in _UNSAFE_CATEGORIES:
        return char
    code = ord(char)
    if code > 0xFFFF:  # a surrogate pair: still a valid JSON escape
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    return f"\\u{code:04x}"


def _pieces(chars: str, quote: bool, budget: int) -> tuple[list[str], bool]:
    """The shown form of ``chars``, one piece per character, as many whole pieces as fit in
    ``budget`` characters; and whether all did."""
    pieces: list[str] = []
    size = 0
    for char in chars:
        piece = _escape(char, quote)
        size += len(piece)
        if size > budget:
            return pieces, False
        pieces.append(piece)
    return pieces, True


def escape_invisible(text: str, *, quote: bool = False, limit: int | None = None,
                     tail: int = 0) -> str:
    """``text`` with every character a terminal would not show as itself — controls (C0,
    DEL, C1: LF and CR too), bidirectional controls and the other format characters,
    U+2028/U+2029, spaces other than SP, private-use, unassigned and surrogate code points
    — written as a ``\\uXXXX`` escape (a surrogate pair beyond U+FFFF). So printed text
    never reorders, hides or breaks a line (Trojan Source), and is always one line.

    Applied to JSON text (the default), the JSON value is unchanged. For a value from a
    peer in a log line, ``quote=True`` also escapes ``\\`` and ``"`` (the escapes stay
    unambiguous and a quoted value cannot end early), and ``limit`` shortens the result to
    at most ``limit`` characters and one ``…`` (never cutting an escape): the start of the
    text, or with ``tail`` its start and its last ``tail`` characters around the ``…``."""
    if limit is None:
        if not quote and text.isascii() and text.isprintable():
            return text
        if not quote:
            return _NOT_PRINTABLE_ASCII.sub(lambda m: _escape(m.group(), False), text)
        return "".join(_escape(char, True) for char in text)
    if len(text) <= limit and text.isascii() and text.isprintable() \
            and not (quote and ('"' in text or "\\" in text)):
        return text  # the common case, every character shown as itself
    # Each character shows as one or more: limit + 1 of them are always too many.
    pieces, whole = _pieces(text[:limit + 1], quote, limit)
    if whole:
        return "".join(pieces)
    tail = min(max(tail, 0), limit)
    if tail:
        pieces = _pieces(text[:limit - tail + 1], quote, limit - tail)[0]
        end = _pieces(text[::-1][:tail + 1], quote, tail)[0]
        return "".join(pieces) + "…" + "".join(reversed(end))
    return "".join(pieces) + "…"


def peer_text(value: object, limit: int = 80, *, tail: int = 0) -> str:
    """A value that came from a peer, for one log line: :func:`escape_invisible` with
    ``quote=True``, at most ``limit`` characters and ``…`` (keeping the last ``tail``)."""
    return escape_invisible(str(value), quote=True, limit=limit, tail=tail)


def usage_error(command: str, message: str) -> NoReturn:
    """Print ``usage: cbcl COMMAND: MESSAGE`` (one escaped line) and exit 2."""
    print(escape_invisible(f"usage: cbcl {command}: {message}"), file=sys.stderr)
    raise SystemExit(EXIT_USAGE)


def print_message(message: Message, as_json: bool) -> None:
    """Print a message canonically, or as one line of JSON (spec §7.2)."""
    if as_json:
        print(escape_invisible(json.dumps(message_to_json(message), ensure_ascii=False)))
    else:
        print(message.canonical())
