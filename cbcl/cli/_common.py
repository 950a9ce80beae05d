"""What every ``cbcl`` command module shares: the parser class, option groups, reading
files under the limit, the registry the options describe, safe output, and the log
formats of ``cbcl serve`` (``--log-format text|json``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import re
import shlex
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO, NoReturn, TextIO, TypeAlias, TypeVar, overload

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..binary._codec import MAGIC
from ..core._display import escape_invisible
from ..core._errors import CBCLError, MalformedError, TrustError
from ..core._limits import Limits
from ..protocol._json import message_to_json
from ..protocol._message import Message
from ..protocol._registry import Registry
from ..protocol._trust import KEY_ID, load_private_key

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


def signing_keys(args: argparse.Namespace) -> list[tuple[str, Ed25519PrivateKey]]:
    """The ``--key`` files with their ``--key-id``s (default: each file's stem). Exits 2 on a
    bad key id; raises :class:`TrustError` for a key that cannot be read."""
    if len(args.key_id) > len(args.key):
        usage_error(args.command, "more --key-id than --key")
    signers: list[tuple[str, Ed25519PrivateKey]] = []
    for index, path in enumerate(args.key):
        key_id = args.key_id[index] if index < len(args.key_id) else Path(path).stem
        if not KEY_ID.match(key_id):
            usage_error(args.command, f"{key_id} is not a key id (use --key-id)")
        with open(path, "rb") as handle:
            data = handle.read(1 << 16)
        try:
            signers.append((key_id, load_private_key(data)))
        except TrustError as exc:
            raise TrustError(exc.message, reason=f"{path}: {exc.reason}") from None
    return signers


# --------------------------------------------------------------------------- logs

#: The logger of the command line's own lines (``serve: listening on …``).
cli_log = logging.getLogger("cbcl.cli")
#: The formats of ``--log-format``.
LOG_FORMATS = ("text", "json")
#: The levels of ``--log-level``.
LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
              "error": logging.ERROR}
#: What starts each line of a traceback in the text format.
TRACEBACK_INDENT = "    "


def _traceback_text(record: logging.LogRecord) -> str:
    if not record.exc_info:
        return ""
    return "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")


class TextLogFormatter(logging.Formatter):
    """``--log-format text``: a record is its message, escaped to one line (every event
    starts at the left margin, as it always has); a traceback follows it as lines indented
    by four spaces, each escaped, so nothing in it (an exception's text may quote a peer)
    can start a line of its own."""

    def format(self, record: logging.LogRecord) -> str:
        line = escape_invisible(record.getMessage())
        trace = _traceback_text(record)
        if trace:
            line += "".join(f"\n{TRACEBACK_INDENT}{escape_invisible(part)}"
                            for part in trace.split("\n"))
        return line


class JsonLogFormatter(logging.Formatter):
    """``--log-format json``: one JSON object per record, on one line: ``time`` (UTC,
    ISO 8601 with milliseconds), ``level``, ``logger``, ``event``, ``message`` (the text
    line), then the record's fields (``cbcl`` attribute: ``link``, ``peer``, ``agent``,
    ``conversation``, ``protocol``, ``intent``, ``message_id``, ``reason``, ``timings`` …,
    values from a peer escaped as in the text line) and ``traceback`` when there is one.
    The encoder escapes every character outside ASCII and every control, so a line is
    one line whatever it holds."""

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = dict(getattr(record, "cbcl", None) or {})  # (a Mapping)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        out: dict[str, Any] = {
            "time": f"{stamp}.{int(record.msecs):03d}Z", "level": record.levelname,
            "logger": record.name, "event": fields.pop("event", "log"),
            "message": escape_invisible(record.getMessage())}
        out.update(fields)
        trace = _traceback_text(record)
        if trace:
            out["traceback"] = trace
        return json.dumps(out, ensure_ascii=True, default=str)


#: Seconds an INFO (or DEBUG) line of ``cbcl.net`` may wait to be written with the lines
#: after it (see :class:`BatchedStreamHandler`).
LOG_FLUSH_DELAY = 0.05
#: Lines held at most before they are written, however soon.
LOG_FLUSH_LINES = 256


class BatchedStreamHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A :class:`logging.StreamHandler` that writes the per-message lines of ``cbcl.net``
    (below WARNING) together: held, in order, for at most :data:`LOG_FLUSH_DELAY` seconds
    (a timer on the running event loop) or :data:`LOG_FLUSH_LINES` lines, then written and
    flushed in one write. Any other record (a warning, an error, the command line's own
    lines), a record logged while no event loop runs and :meth:`close` write whatever is
    held, then the record, at once. A server answering thousands of messages
    a second then makes one write system call per batch of lines, not one per line."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self._held: list[str] = []
        self._timer: asyncio.TimerHandle | None = None
        self._timer_loop: asyncio.AbstractEventLoop | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._held.append(self.format(record) + self.terminator)
            if record.levelno < logging.WARNING and record.name == "cbcl.net" \
                    and len(self._held) < LOG_FLUSH_LINES:
                timer_loop = self._timer_loop
                if self._timer is not None and timer_loop is not None \
                        and timer_loop.is_running():
                    return  # (its timer writes this line too)
                loop = asyncio._get_running_loop()  # (None outside the loop's thread)
                if loop is not None:
                    self._timer = loop.call_later(LOG_FLUSH_DELAY, self._due)
                    self._timer_loop = loop
                    return
            self.flush()
        except RecursionError:  # (as logging.StreamHandler.emit)
            raise
        except Exception:
            self.handleError(record)

    def _due(self) -> None:
        self._timer = None
        self.flush()

    def flush(self) -> None:
        """Write the lines held, and flush the stream."""
        self.acquire()
        try:
            self._timer = None  # (a timer still due writes nothing, or what came since)
            held, self._held = self._held, []
            if held:
                self.stream.write("".join(held))
            if self.stream and hasattr(self.stream, "flush"):
                self.stream.flush()
        finally:
            self.release()

    def close(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        try:
            self.flush()
        finally:
            super().close()


class LogTarget:
    """A handler on the ``cbcl`` logger (``level`` and above; the command line's own
    lines, ``cbcl.cli``, at INFO whatever ``level``: where serve listens is always said)
    writing to a stream in one of :data:`LOG_FORMATS`; :meth:`close` removes it and puts
    the levels back."""

    def __init__(self, stream: TextIO, log_format: str = "text",
                 level: int = logging.INFO) -> None:
        if log_format not in LOG_FORMATS:
            raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}")
        self.logger = logging.getLogger("cbcl")
        self.handler = BatchedStreamHandler(stream)
        self.handler.setFormatter(JsonLogFormatter() if log_format == "json"
                                  else TextLogFormatter())
        self._level = self.logger.level
        self._cli_level = cli_log.level
        self.logger.addHandler(self.handler)
        self.logger.setLevel(level)
        cli_log.setLevel(min(level, logging.INFO))

    def close(self) -> None:
        self.logger.removeHandler(self.handler)
        self.logger.setLevel(self._level)
        cli_log.setLevel(self._cli_level)
        self.handler.close()


def lean_log_records() -> None:
    """In a process of the command line's own (``cbcl serve``): log records without the
    caller's file and line, thread, process and multiprocessing names, which neither format
    shows (the ``logging`` HOWTO's "Optimization": each record then costs a few
    microseconds less, on the path of every message)."""
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logging.setLogRecordFactory(LeanLogRecord)


class LeanLogRecord(logging.LogRecord):
    """A :class:`logging.LogRecord` for a record without a caller (``logging._srcfile``
    None: ``"(unknown file)"``), made without the two ``os.path`` calls that derive its
    ``filename`` and ``module`` from that constant (a fifth of a record's making, on the
    path of every message): the same attributes, the same values. Any other record is
    made as logging makes it."""

    def __init__(self, name: str, level: int, pathname: str, lineno: int, msg: object,
                 args: Any, exc_info: Any, func: str | None = None, sinfo: str | None = None,
                 **kwargs: Any) -> None:
        if pathname != _NO_FILE or args:
            super().__init__(name, level, pathname, lineno, msg, args, exc_info, func,
                             sinfo, **kwargs)
            return
        created = time.time()
        self.name, self.msg, self.args = name, msg, args
        self.levelname, self.levelno = logging.getLevelName(level), level
        self.pathname = self.filename = self.module = pathname
        self.exc_info, self.exc_text, self.stack_info = exc_info, None, sinfo
        self.lineno, self.funcName = lineno, func  # type: ignore[assignment]
        self.created = created
        self.msecs = int((created - int(created)) * 1000) + 0.0
        self.relativeCreated = (created - _LOGGING_STARTED) * 1000
        self.thread = self.threadName = self.processName = self.process = None
        if logging.logThreads or logging.logMultiprocessing or logging.logProcesses:
            # (set again by another part of the program: as logging would have it)
            super().__init__(name, level, pathname, lineno, msg, args, exc_info, func,
                             sinfo, **kwargs)


#: The pathname of a record whose caller is not looked for.
_NO_FILE = "(unknown file)"
#: When logging was imported (what a record's ``relativeCreated`` counts from).
_LOGGING_STARTED: float = logging._startTime  # type: ignore[attr-defined]


def log_to(stream: TextIO, log_format: str = "text", level: int = logging.INFO
           ) -> LogTarget:
    """Write the ``cbcl`` loggers' records (``level`` and above) to ``stream`` in
    ``log_format`` until the returned target is closed."""
    return LogTarget(stream, log_format, level)
