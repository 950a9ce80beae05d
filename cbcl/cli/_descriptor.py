"""The ``cbcl descriptor build``, ``new`` and ``diff`` subcommands (spec §6.7).

``build`` puts a descriptor together from readable files with
:func:`cbcl.build_descriptor`, checking each file on its own so that an error names it;
``new`` writes a starting set of files that ``build`` builds as they are; ``diff`` says
whether one version of a descriptor is compatible with another (spec/compatibility.md).
:func:`register` adds them beside ``descriptor sign/verify/inspect``.
"""

from __future__ import annotations

import argparse
import errno
import os
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..core._display import escape_invisible
from ..core._errors import CBCLError
from ..core._limits import DEFAULT_LIMITS
from ..core._reader import read
from ..grammar._subset import GrammarLimits, _decode as grammar_text
from ..protocol._authoring import (
    SECTIONS,
    build_descriptor,
    check_grammar,
    comment_lines,
    intent_entries,
    protocol_id,
    section_value,
)
from ..protocol._compat import diff_descriptors
from ..protocol._descriptor import digest_of, read_descriptor
from ..protocol._trust import read_signed_descriptor_unverified, sign_descriptor
from ._common import (
    EXIT_OK,
    INT64_MAX,
    MAX_DOCUMENT_BYTES,
    Commands,
    document_bytes,
    int_in,
    read_file,
    signing_keys,
    unix_ms,
)


def _comment(text: str) -> str:
    """argparse type for ``--comment``: text a comment line can hold."""
    try:
        comment_lines(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


@contextmanager
def _about(where: str) -> Iterator[None]:
    """Make a :class:`CBCLError` raised inside say which file (or option) it is about:
    ``kind line:column: WHERE: message``."""
    try:
        yield
    except CBCLError as exc:
        message = exc.message.removeprefix(f"{exc.kind}: ")
        exc.message = f"{where}: {message}"
        exc.args = (exc.message,)
        raise


def _cmd_build(args: argparse.Namespace, data: bytes) -> int:

    with _about("--id"):
        ident = protocol_id(args.id)
    with _about("--intents"):
        entries = intent_entries(" ".join(args.intents))  # "A B" counts as A B
        intents = tuple(intent for intent, _ in entries)
    grammar_limits = GrammarLimits()
    with _about(args.grammar):
        with open(args.grammar, "rb") as handle:
            raw = handle.read(grammar_limits.max_text_bytes + 1)
        grammar = grammar_text(raw, grammar_limits)
        check_grammar(grammar, grammar_limits,
                      starts=tuple(dict.fromkeys(rule for _, rule in entries)))
    sections: dict[str, Any] = {}
    for name in SECTIONS:
        path = getattr(args, name)
        if path is not None:
            with _about(path):
                sections[name] = section_value(name, read_file(path, args.limits),
                                               intents=intents, limits=args.limits)
    signers = signing_keys(args) if args.key else []
    with _about("the built descriptor"):  # over --max-message-bytes as a whole
        payload = build_descriptor(
            ident, args.version, [f"{i.value}={r}" for i, r in entries], grammar,
            expires=args.expires,
            comment="\n".join(args.comment) if args.comment else None, limits=args.limits,
            grammar_limits=grammar_limits, **sections)
    out = payload
    if signers:

        out = sign_descriptor(payload, signers)
    if args.output == "-":
        sys.stdout.buffer.write(out)
        sys.stdout.flush()
        return EXIT_OK
    Path(args.output).write_bytes(out)
    signed = f"signed by {' '.join(key_id for key_id, _ in signers)}" if signers \
        else "unsigned"
    print(escape_invisible(f"wrote {args.output}: {ident} version {args.version} "
                           f"{digest_of(payload)} ({signed})"))
    return EXIT_OK


# --------------------------------------------------------------------------- descriptor new

#: The intents of the starting protocol: a buyer asks (REQUEST), a seller offers (INFORM)
#: or declines (REFUSE).
STARTER_INTENTS = ("REQUEST=ask", "INFORM=offer", "REFUSE=decline")
#: Their start rules, for ``grammar check --start``.
STARTER_RULES = ("ask", "offer", "decline")

_GRAMMAR = """\
// {id}: the body grammar (spec/cbcl-1.0.md §4, a subset of lark's EBNF).
// Written by `cbcl descriptor new` as a start: edit it, then check it with
//   cbcl grammar check {name}.lark
// A body is one CBCL value. Quoted text is a literal: "(" and ")" open and close a list,
// "ask" is the symbol ask, ":item" the keyword :item. STRING INTEGER DECIMAL NUMBER
// SYMBOL KEYWORD URI match one atom of that kind (NUMBER: an integer or a decimal);
// value matches any value. [x] is optional, x* repeats, x | y is a choice. Members
// joined by & (":k" x & ":j" y) come in any order, each once; one in [ ] is optional.
// Each intent's body starts at its own rule: the descriptor's intents say which
// (REQUEST=ask INFORM=offer REFUSE=decline).

// (ask :item "lamp" :quantity 2), optionally with :note "...", in any order
ask: "(" "ask" (":item" STRING & ":quantity" INTEGER & [":note" STRING]) ")"
// (offer :item "lamp" :price 12.50 :currency EUR)
offer: "(" "offer" (":item" STRING & ":price" NUMBER & ":currency" SYMBOL) ")"
// (decline :item "lamp" :reason "out of stock")
decline: "(" "decline" (":item" STRING & ":reason" STRING) ")"
"""

_SCHEMA = """\
; {id}: what the values of each body mean (spec/conversations.md §2). A record names a
; body's head symbol and types its :key value pairs; a required key must be present.
(schema
  (record ask
    (:item (string :min-length 1 :max-length 128) required)
    (:quantity (integer :min 1 :max 1000) required)
    (:note (string :max-length 1024)))
  (record offer
    (:item (string :min-length 1 :max-length 128) required)
    (:price (number :min 0) required)
    (:currency (one-of EUR USD GBP) required))
  (record decline
    (:item (string :min-length 1 :max-length 128) required)
    (:reason (string :min-length 1 :max-length 1024) required)))
"""

_EXAMPLE = """\
; A sample {id} message. Once the descriptor is built and signed, check it with
;   cbcl parse {name}.example.cbcl --descriptor {name}.signed.cbcl --trust trust
(CBCL/1.0
  (message-id "m-1")
  (sender agent://example/buyer)
  (receiver agent://example/seller)
  (intent REQUEST)
  (protocol {id})
  (body (ask :item "lamp" :quantity 2)))
"""

_HANDLER = '''"""{id}: the seller's answers, for `cbcl serve --handler handler:respond`.

Written by `cbcl descriptor new` as a start. respond(message, context) gets each message of
{id} that passed every check (both grammar passes, the schema, the replay window) and
returns the reply - context.reply(intent, body) answers in the same conversation - or None
to say nothing. It may also be an async function.
"""

from decimal import Decimal

import cbcl

PRICES = {{"lamp": Decimal("12.50"), "chair": Decimal("40.00")}}


def respond(message, context):
    fields = cbcl.Fields(message.body)
    if message.intent == "REQUEST" and fields.head == "ask":
        item = fields["item"]
        price = PRICES.get(item)
        if price is None:
            return context.reply("REFUSE", cbcl.body("decline", item=item,
                                                     reason="not for sale"))
        return context.reply("INFORM", cbcl.body("offer", item=item,
                                                 price=price * fields["quantity"],
                                                 currency=cbcl.Symbol("EUR")))
    return None
'''

_README = """\
{id}: a protocol descriptor's sources, written by `cbcl descriptor new`.

  {name}.lark           the body grammar
  {name}.schema.cbcl    the schema section: what each body's values mean
  {name}.example.cbcl   a sample message
  handler.py            what a server answers (cbcl serve --handler handler:respond)

Next, in this directory: check the grammar, build the descriptor, make a key (once), trust
it, sign the descriptor, and parse the sample with it.

{commands}
Then serve it with the handler, and send the sample (from a second terminal, or as here;
stop the server with kill %1):

  cbcl serve --listen unix:seller.sock --trust trust --name agent://example/seller \\
    --handler handler:respond > seller.log &
  until grep -qs listening seller.log; do sleep 0.1; done
  cbcl send --connect unix:seller.sock --descriptor {name}.signed.cbcl --key my-key.key \\
    {name}.example.cbcl

Raise --version with every release of {id}:
a peer refuses a version older than one it has seen. To add a conversation or the
evaluator functions (spec/conversations.md), give build --conversation FILE or
--functions FILE.
"""


def starter_commands(ident: str, name: str) -> list[str]:
    """The shell commands, after ``cbcl descriptor new``, that build, sign and use the
    starting files (in the directory that holds them)."""
    q = shlex.quote
    return [
        f"cbcl grammar check {q(name + '.lark')} --start {' '.join(STARTER_RULES)}",
        f"cbcl descriptor build --id {q(ident)} --version 1 --grammar {q(name + '.lark')} \\\n"
        f"    --intents {' '.join(STARTER_INTENTS)} --schema {q(name + '.schema.cbcl')} "
        f"-o {q(name + '.cbcl')}",
        "cbcl keygen --out my-key",
        "mkdir -p trust && cp my-key.pub trust/",
        f"cbcl descriptor sign {q(name + '.cbcl')} --key my-key.key "
        f"-o {q(name + '.signed.cbcl')}",
        f"cbcl parse {q(name + '.example.cbcl')} --descriptor {q(name + '.signed.cbcl')} "
        f"--trust trust",
    ]


def starter_files(ident: str) -> dict[str, str]:
    """File name -> text of the starting set for protocol ``ident``."""
    name = file_stem(ident)
    commands = "".join(f"  {command}\n" for command in starter_commands(ident, name))
    fields = {"id": ident, "name": name, "commands": commands}
    return {f"{name}.lark": _GRAMMAR.format(**fields),
            f"{name}.schema.cbcl": _SCHEMA.format(**fields),
            f"{name}.example.cbcl": _EXAMPLE.format(**fields),
            "handler.py": _HANDLER.format(**fields),
            f"{name}.README.txt": _README.format(**fields)}


def file_stem(ident: str) -> str:
    """The file name stem for protocol ``ident``: ``auction/v1`` -> ``auction-v1``."""
    stem = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "-" for c in ident)
    return stem.strip(".-") or "protocol"


def _cmd_new(args: argparse.Namespace, data: bytes) -> int:
    with _about("ID"):
        ident = str(protocol_id(args.id))
    directory = Path(args.dir)
    files = starter_files(ident)
    for file in files:  # all or nothing: never overwrite, never half a set
        if os.path.lexists(directory / file):
            raise FileExistsError(errno.EEXIST, "exists (nothing was written)",
                                  str(directory / file))
    directory.mkdir(parents=True, exist_ok=True)
    for file, text in files.items():
        handle = os.open(directory / file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
    print(escape_invisible(f"wrote {', '.join(str(directory / file) for file in files)}"))
    print(escape_invisible("next:" + (f" cd {shlex.quote(str(directory))}"
                                      if args.dir != "." else "")))
    for command in starter_commands(ident, file_stem(ident)):  # ASCII: ident is a symbol
        print(f"  {command}")
    return EXIT_OK


# --------------------------------------------------------------------------- descriptor diff


def _descriptor_payload(path: str, limits: Any) -> bytes:
    """The descriptor bytes in ``path``: the file, or a signed descriptor's payload (its
    signatures are not verified: ``diff`` compares contents, and trusts nothing)."""

    data = read_file(path, limits)
    document = read(data, limits=limits)
    if type(document) is tuple and document and str(document[0]) == "signed-descriptor":
        return read_signed_descriptor_unverified(data, limits=limits).payload
    return data


def _cmd_diff(args: argparse.Namespace, data: bytes) -> int:

    descriptors = []
    for path in (args.old, args.new):
        with _about(path):
            descriptors.append(read_descriptor(_descriptor_payload(path, args.limits),
                                               limits=args.limits))
    with _about(f"{args.old} -> {args.new}"):
        report = diff_descriptors(descriptors[0], descriptors[1], mode=args.mode)
    for line in report.render().splitlines():  # (a witness string may hold anything)
        print(escape_invisible(line))
    return report.exit_code


def register(descriptor_commands: Commands) -> None:
    """Add ``build`` and ``new`` to ``descriptor_commands`` (the ``add_subparsers`` action
    of ``cbcl descriptor``)."""
    build = descriptor_commands.add_parser(
        "build", help="build a descriptor from a grammar file, intents and section files "
                      "(and sign it, with --key)")
    build.add_argument("--id", required=True, metavar="ID",
                       help="the protocol id, a symbol such as auction/v1")
    build.add_argument("--version", required=True, type=int_in(0, INT64_MAX), metavar="N",
                       help=f"the descriptor version, 0 to {INT64_MAX}")
    build.add_argument("--grammar", required=True, metavar="FILE",
                       help="the body grammar (spec §4), e.g. auction-v1.lark")
    build.add_argument("--intents", required=True, nargs="+", metavar="INTENT[=RULE]",
                       help="the intents whose bodies the grammar governs, each with its "
                            "start rule as INTENT=rule (default: body)")
    for name in SECTIONS:
        build.add_argument(f"--{name}", metavar="FILE",
                           help=f"a ({name} …) section file")
    build.add_argument("--expires", type=unix_ms, metavar="MS",
                       help="expiry, Unix time in ms (default: never)")
    build.add_argument("--comment", action="append", default=[], type=_comment,
                       metavar="LINE",
                       help="a comment line to write first (repeatable)")
    build.add_argument("--key", action="append", default=[], metavar="KEY",
                       help="also sign with this Ed25519 private key (PKCS#8 PEM; key id = "
                            "file stem; repeatable): OUT is then the signed descriptor")
    build.add_argument("--key-id", action="append", default=[], metavar="ID",
                       help="the key id for the --key in the same position")
    build.add_argument("-o", "--output", required=True, metavar="OUT",
                       help="output file, or -")
    build.add_argument("--max-message-bytes", type=document_bytes, metavar="N",
                       default=DEFAULT_LIMITS.max_message_bytes,
                       help=f"document size limit, 1 to {MAX_DOCUMENT_BYTES} "
                            f"(default {DEFAULT_LIMITS.max_message_bytes})")
    build.set_defaults(handler=_cmd_build, file=None)

    new = descriptor_commands.add_parser(
        "new", help="write a commented starting set of files for a new protocol")
    new.add_argument("id", metavar="ID", help="the protocol id, a symbol such as auction/v1")
    new.add_argument("--dir", default=".", metavar="DIR",
                     help="where to write the files (made if missing; default: here)")
    new.set_defaults(handler=_cmd_new, file=None)

    diff = descriptor_commands.add_parser(
        "diff", help="whether NEW accepts every body OLD accepts (or the reverse, or both): "
                     "compatible, breaking (with witnesses) or unknown; exit 0 or 5")
    diff.add_argument("old", metavar="OLD", help="the descriptor before (signed or not)")
    diff.add_argument("new", metavar="NEW", help="the descriptor after (signed or not)")
    diff.add_argument("--mode", choices=("backward", "forward", "full"), default="backward",
                      help="backward: NEW accepts all OLD accepts (default); forward: OLD "
                           "accepts all NEW accepts; full: both")
    diff.add_argument("--max-message-bytes", type=document_bytes, metavar="N",
                      default=DEFAULT_LIMITS.max_message_bytes,
                      help=f"document size limit, 1 to {MAX_DOCUMENT_BYTES} "
                           f"(default {DEFAULT_LIMITS.max_message_bytes})")
    diff.set_defaults(handler=_cmd_diff, file=None)
