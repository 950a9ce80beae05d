"""The ``cbcl conversation check`` and ``cbcl eval`` commands (spec/conversations.md §4).

``register(commands)`` adds both to the ``cbcl`` parser's sub-commands; handlers follow
``cbcl.cli._main``'s convention ``handler(args, data) -> exit code``, and errors propagate to
``main()``, which prints them as one line with their exit code. Both commands set
``file=None``: they read their own inputs (several files, or none).
"""

from __future__ import annotations

import argparse
import sys
import time

from ..core._canonical import canonical_value
from ..core._display import escape_invisible
from ..core._errors import CBCLError, ConversationError, Position
from ..core._limits import DEFAULT_LIMITS, Limits
from ..core._reader import decode, read, value_spans
from ..protocol._api import parse
from ..protocol._conversation import ConversationTracker
from ..protocol._evaluator import DEFAULT_BUDGET, DEFAULT_MAX_DEPTH, LIBRARY, evaluate
from ..protocol._message import Message
from ._common import (
    INT64_MAX,
    MAX_DOCUMENT_BYTES,
    Commands,
    Parser,
    add_protocol_options,
    binary_frame_hint,
    document_bytes,
    int_in,
    read_input,
    registry_from_args,
    unix_ms,
)

EXIT_OK = 0
#: The largest ``eval --budget``: 10^8 steps (minutes of work; more is never meant).
MAX_BUDGET = 100_000_000
#: The largest ``eval --max-depth``: 65,536 (an expression is nested at most
#: ``Limits.max_depth`` deep anyway).
MAX_EVAL_DEPTH = 1 << 16


def _clock_ms() -> int:
    """The edge's clock; the library below never reads one."""
    return time.time_ns() // 1_000_000


def split_messages(data: bytes, limits: Limits) -> list[tuple[str, int]]:
    """The text of each value in a document that holds one or more, with the character
    index where it starts. Raises as :func:`cbcl.read_all` (with positions in the whole
    document)."""
    text = decode(data, limits)
    return [(text[start:end], start) for _, start, end in value_spans(text, limits)]


def _relocate(exc: CBCLError, document: str, start: int, where: str) -> None:
    """Make an error about one message of a document read as about the document: shift its
    position and say which file and message it is."""
    if exc.position is not None and exc.position.line > 0 and start:
        before = document[:start]
        lines = before.count("\n")
        column = start - (before.rfind("\n") + 1)
        p = exc.position
        exc.position = Position(p.line + lines, p.column + (column if p.line == 1 else 0),
                                p.offset + len(before.encode("utf-8")))
    exc.message = f"{where}: {exc.message}"
    exc.args = (exc.message,)


def _cmd_conversation_check(args: argparse.Namespace, data: bytes) -> int:

    registry = registry_from_args(args)  # built exactly as `cbcl parse` builds it
    if registry is None or not registry.protocols():  # (argparse requires --descriptor)
        print("usage: cbcl conversation check: no descriptor given: use --descriptor FILE",
              file=sys.stderr)
        raise SystemExit(2)
    tracker = ConversationTracker.from_descriptors(registry.protocols())
    count = 0
    for path in args.files:
        raw = read_input(path, sys.stdin.buffer, args.limits)
        try:
            pieces = split_messages(raw, args.limits)
        except CBCLError as exc:
            binary_frame_hint(exc, raw, path)
            _relocate(exc, "", 0, path)  # positions are the file's already: name it
            raise
        if not pieces:
            raise ConversationError(f"{path}: holds no message")
        for index, (text, start) in enumerate(pieces, 1):
            count += 1
            where = f"{path}" + (f" message {index}" if len(pieces) > 1 else "")
            try:
                message = parse(text, limits=args.limits, registry=registry)
            except CBCLError as exc:
                _relocate(exc, raw.decode("utf-8"), start, where)
                raise
            now = _now_for(args, message)
            try:
                step = tracker.receive(message, now=now)
            except ConversationError as exc:
                raise ConversationError(f"{where}: {exc.message}", path=exc.path) from None
            # Ids come from the input: escaped, so a line never breaks or reorders.
            print(escape_invisible(f'{where}: "{_quoted(step.message_id)}" '
                                   f"{step.intent.value} by {step.role}: "
                                   f"{step.before} -> {step.after}"))
    for thread in tracker.conversations():
        peer = thread.agents[thread.machine.roles[1]]
        ending = "final" if thread.finished else "open"
        print(escape_invisible(f'conversation "{_quoted(thread.conversation_id)}" with '
                               f"{peer}: {thread.state} ({ending})"))
    print(f"{count} message{'s' if count != 1 else ''} in order")
    return EXIT_OK


def _quoted(text: str) -> str:
    return escape_invisible(text, quote=True)


def _now_for(args: argparse.Namespace, message: Message) -> int:
    if args.now is not None:
        return int(args.now)
    if message.timestamp is not None:
        return message.timestamp
    return _clock_ms()


def _cmd_eval(args: argparse.Namespace, data: bytes) -> int:
    functions: list[str] | None = None
    if args.functions is not None:
        names = args.functions.replace(",", " ").split()
        unknown = [n for n in names if n not in LIBRARY]
        if unknown:
            print(escape_invisible(f"usage: cbcl eval: not library functions: "
                                   f"{' '.join(unknown)} (known: {' '.join(LIBRARY)})"),
                  file=sys.stderr)
            raise SystemExit(2)
        functions = names
    expression = read(args.expression, limits=args.limits)
    now = _clock_ms() if args.now is None else args.now
    result = evaluate(expression, functions=functions, now=now, budget=args.budget,
                      max_depth=args.max_depth)
    print(canonical_value(result))
    return EXIT_OK


def register(commands: Commands) -> None:
    """Add ``conversation check`` and ``eval`` to ``cbcl``'s sub-command action."""

    conversation = commands.add_parser("conversation", help="work with conversations")
    sub = conversation.add_subparsers(dest="conversation_command", required=True,
                                      parser_class=Parser)
    check = sub.add_parser(
        "check", help="check that messages, in order, follow their protocol's conversation; "
                      "exit 7 at the first one out of place")
    check.add_argument("files", nargs="+", metavar="FILE",
                       help="message files in order (a file may hold several messages), "
                            "or - for stdin")
    add_protocol_options(check, descriptor_required=True,
                         now_help="the time every message is received, Unix ms "
                                  "(default: each message's timestamp, else the clock)")
    check.set_defaults(handler=_cmd_conversation_check, file=None)

    ev = commands.add_parser("eval", help="evaluate an expression; print its canonical value")
    ev.add_argument("expression", metavar="EXPR", help="the expression, as CBCL text")
    ev.add_argument("--functions", metavar="NAMES",
                    help="the functions allowed, separated by spaces or commas "
                         "(default: the whole library)")
    ev.add_argument("--budget", type=int_in(1, MAX_BUDGET), default=DEFAULT_BUDGET,
                    metavar="N", help=f"step budget, 1 to {MAX_BUDGET} (default "
                                      f"{DEFAULT_BUDGET})")
    ev.add_argument("--max-depth", type=int_in(1, MAX_EVAL_DEPTH), default=DEFAULT_MAX_DEPTH,
                    metavar="N", help=f"calls nested at once, 1 to {MAX_EVAL_DEPTH} (default "
                                      f"{DEFAULT_MAX_DEPTH})")
    ev.add_argument("--now", type=unix_ms, metavar="MS",
                    help=f"the value of (now), Unix ms, 0 to {INT64_MAX} (default: the clock)")
    ev.set_defaults(handler=_cmd_eval, file=None)

    for parser in (check, ev):
        parser.add_argument("--max-message-bytes", type=document_bytes, metavar="N",
                            default=DEFAULT_LIMITS.max_message_bytes,
                            help=f"document size limit, 1 to {MAX_DOCUMENT_BYTES} (default "
                                 f"{DEFAULT_LIMITS.max_message_bytes})")
