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
from ..protocol._declaration import read_declaration
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
    usage_error,
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


def _declared(args: argparse.Namespace) -> bytes:
    """The descriptor a declaration file declares (``build DECLARATION``)."""
    given = [f"--{name}" for name in ("id", "version", "grammar", "intents", "expires",
                                      *SECTIONS)
             if getattr(args, name) is not None]
    if given:
        usage_error("descriptor build",
                    f"{' '.join(given)}: a declaration holds these; give either "
                    "DECLARATION or --id --version --grammar --intents")
    grammar_limits = GrammarLimits()
    with _about(args.declaration):
        declaration = read_declaration(read_file(args.declaration, args.limits),
                                       limits=args.limits, grammar_limits=grammar_limits)
    with _about(f"{args.declaration} (the built descriptor)"):
        return declaration.build(
            comment="\n".join(args.comment) if args.comment else None, limits=args.limits,
            grammar_limits=grammar_limits)


def _cmd_build(args: argparse.Namespace, data: bytes) -> int:
    if args.declaration is not None:
        signers = signing_keys(args) if args.key else []
        payload = _declared(args)
        return _write_built(args, payload, signers)
    missing = [f"--{name}" for name in ("id", "version", "grammar", "intents")
               if getattr(args, name) is None]
    if missing:
        usage_error("descriptor build", "give a DECLARATION, or all of --id --version "
                    f"--grammar --intents (missing: {' '.join(missing)})")
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
    return _write_built(args, payload, signers)


def _write_built(args: argparse.Namespace, payload: bytes,
                 signers: list[tuple[str, Any]]) -> int:
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
    built = read_descriptor(payload, limits=args.limits)
    print(escape_invisible(f"wrote {args.output}: {built.id} version {built.version} "
                           f"{digest_of(payload)} ({signed})"))
    return EXIT_OK


# --------------------------------------------------------------------------- descriptor new

_DECLARATION = """\
; {id}: the protocol, declared once (spec/declarations.md). Written by
; `cbcl descriptor new` as a start: edit it, then build it with
;   cbcl descriptor build {name}.declaration.cbcl -o {name}.cbcl
; Each (intent …) lists the records its body may be: a head symbol and its :key fields,
; typed as a schema types them (spec/conversations.md §2): string, integer, decimal,
; number, symbol, keyword, uri, boolean, any, (one-of …), (list-of …), (keys …), a nested
; (record …); bounds as :min :max :min-length :max-length. A field marked required must
; be present; keys come in any order, each once. The body grammar and the schema are both
; derived from this file.
(protocol-declaration
  (id {id})
  (version 1)
  ; a buyer asks: (ask :item "lamp" :quantity 2), optionally with :note "..."
  (intent REQUEST
    (record ask
      (:item (string :min-length 1 :max-length 128) required)
      (:quantity (integer :min 1 :max 1000) required)
      (:note (string :max-length 1024))))
  ; a seller offers: (offer :item "lamp" :price 12.50 :currency EUR)
  (intent INFORM
    (record offer
      (:item (string :min-length 1 :max-length 128) required)
      (:price (number :min 0) required)
      (:currency (one-of EUR USD GBP) required)))
  ; or declines: (decline :item "lamp" :reason "out of stock")
  (intent REFUSE
    (record decline
      (:item (string :min-length 1 :max-length 128) required)
      (:reason (string :min-length 1 :max-length 1024) required))))
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
                                                 currency="EUR"))
    return None
'''

_README = """\
{id}: a protocol descriptor's sources, written by `cbcl descriptor new`.

  {name}.declaration.cbcl  the protocol: per intent, its records and their typed fields
  {name}.example.cbcl      a sample message
  handler.py               what a server answers (cbcl serve --handler handler:respond)

Next, in this directory: build the descriptor (its grammar and schema derived from the
declaration), make a key (once), trust it, sign the descriptor, and parse the sample
with it.

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
evaluator functions (spec/conversations.md), add a (conversation …) or (functions …)
field to the declaration.
"""


def starter_commands(ident: str, name: str) -> list[str]:
    """The shell commands, after ``cbcl descriptor new``, that build, sign and use the
    starting files (in the directory that holds them)."""
    q = shlex.quote
    return [
        f"cbcl descriptor build {q(name + '.declaration.cbcl')} -o {q(name + '.cbcl')}",
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
    return {f"{name}.declaration.cbcl": _DECLARATION.format(**fields),
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
        "build", help="build a descriptor from a declaration, or from a grammar file, "
                      "intents and section files (and sign it, with --key)")
    build.add_argument("declaration", nargs="?", metavar="DECLARATION",
                       help="a (protocol-declaration …) file (spec/declarations.md): the "
                            "grammar and schema are derived from it; without it, give --id "
                            "--version --grammar --intents")
    build.add_argument("--id", metavar="ID",
                       help="the protocol id, a symbol such as auction/v1")
    build.add_argument("--version", type=int_in(0, INT64_MAX), metavar="N",
                       help=f"the descriptor version, 0 to {INT64_MAX}")
    build.add_argument("--grammar", metavar="FILE",
                       help="the body grammar (spec §4), e.g. auction-v1.lark")
    build.add_argument("--intents", nargs="+", metavar="INTENT[=RULE]",
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
