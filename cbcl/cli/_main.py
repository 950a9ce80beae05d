"""The ``cbcl`` command line (draft §6).

Every failure is one line on stderr, ``kind line:column: message``, and the exit code of
draft §6; a traceback is never shown. Files and stdin are read here, at the edge; the
library below only sees bytes.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..core._display import escape_invisible
from ..core._errors import CBCLError, GrammarError, TrustError
from ..core._limits import DEFAULT_LIMITS, Limits
from ..core._reader import TOKEN, decode, read
from ..core._version import __version__
from ..grammar._compile import compile_guarded
from ..grammar._lr import LALR1
from ..grammar._subset import read_grammar
from ..protocol._api import canonical, parse
from ..protocol._descriptor import read_descriptor
from ..protocol._envelope import parse_envelope
from ..protocol._registry import Registry
from ..protocol._trust import (
    private_key_pem,
    public_key_pem,
    read_signed_descriptor_unverified,
    sign_descriptor,
    sign_message,
)

# Imported last: the command modules use this module's helpers.
from ._a2a import register as register_a2a
from ._bench import register as register_bench
from ._codec import register as register_codec
from ._codegen import register as register_codegen
from ._common import (
    EXIT_INTERNAL,
    EXIT_OK,
    MAX_DOCUMENT_BYTES,
    Parser,
    add_protocol_options,
    add_trust_options,
    binary_frame_hint,
    document_bytes,
    print_message,
    read_input,
    registry_from_args,
    signing_keys,
    usage_error,
)
from ._conversation import register as register_conversation
from ._convert import register as register_convert
from ._descriptor import register as register_descriptor
from ._export import register as register_export
from ._llm import register as register_llm, with_hint
from ._mcp import register as register_mcp
from ._negotiate import register as register_negotiate
from ._send import register as register_send

if TYPE_CHECKING:
    from ..protocol._trust import DescriptorSignature


def _cmd_parse(args: argparse.Namespace, data: bytes) -> int:
    if args.require_signatures and not args.trust:
        _usage_error(args, "--require-signatures needs --trust DIR")
    message = parse(data, envelope_only=args.envelope_only, limits=args.limits,
                    registry=registry_from_args(args), require_signatures=args.require_signatures)
    print_message(message, args.json)
    return EXIT_OK


def _cmd_canon(args: argparse.Namespace, data: bytes) -> int:

    sys.stdout.write(canonical(read(data, limits=args.limits)))
    sys.stdout.flush()
    return EXIT_OK


def _cmd_grammar_check(args: argparse.Namespace, data: bytes) -> int:

    # A descriptor starts, after comments, with "(protocol-descriptor"; anything else is
    # taken as grammar text.
    head = TOKEN.match(data.decode("utf-8", "replace"))
    is_descriptor = head is not None and head.lastindex == 1 and data[head.end():].lstrip(
        ).startswith(b"protocol-descriptor")
    try:
        starts: tuple[str, ...] = ("body",) if args.start is None \
            else tuple(dict.fromkeys(args.start))
        grammar: str | bytes = data
        if is_descriptor:
            descriptor = read_descriptor(data, limits=args.limits)
            grammar, starts = descriptor.grammar, descriptor.start_rules
        if isinstance(grammar, bytes) and not _is_utf8(grammar):

            read_grammar(grammar)  # refuses it, with the position of the first bad byte
        compiled = compile_guarded(grammar.decode("utf-8") if isinstance(grammar, bytes)
                                   else grammar, starts=starts)
    except GrammarError as exc:
        print("rejected")
        print(exc.one_line())
        if exc.context:
            print(exc.context)
        return exc.exit_code
    print(compiled.report.rstrip("\n"))
    return EXIT_OK if compiled.verdict == LALR1 else 5


def _usage_error(args: argparse.Namespace, message: str) -> NoReturn:
    usage_error(args.command, message)  # one escaped line: a message may quote a file name


def _cmd_keygen(args: argparse.Namespace, data: bytes) -> int:


    key = Ed25519PrivateKey.generate()
    private_path, public_path = f"{args.out}.key", f"{args.out}.pub"
    # O_EXCL: never overwrite a key; 0600 from the start: never readable by others.
    handle = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(handle, "wb") as out:
        out.write(private_key_pem(key))
    handle = os.open(public_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(handle, "wb") as out:
        out.write(public_key_pem(key.public_key()))
    print(f"wrote {private_path} (private, mode 0600) and {public_path}")
    return EXIT_OK


def _cmd_descriptor_sign(args: argparse.Namespace, data: bytes) -> int:

    signers = signing_keys(args)
    existing: tuple[DescriptorSignature, ...] = ()
    document = read(data, limits=args.limits)
    if type(document) is tuple and document and str(document[0]) == "signed-descriptor":
        # Co-signing: keep the signatures already there, sign the same payload.
        signed = read_signed_descriptor_unverified(data, limits=args.limits)
        data, existing = signed.payload, signed.signatures
    read_descriptor(data, limits=args.limits)  # never sign something that is not one
    out = sign_descriptor(data, signers, existing=existing)
    if args.output == "-":
        sys.stdout.buffer.write(out)
        sys.stdout.flush()
    else:
        Path(args.output).write_bytes(out)
    return EXIT_OK


def _cmd_descriptor_verify(args: argparse.Namespace, data: bytes) -> int:
    registry = Registry(limits=args.limits, trust=args.trust, state_dir=args.state)
    verified = registry.verify(data, now=args.now)
    descriptor = verified.descriptor
    print(f"verified {descriptor.id} version {descriptor.version} {descriptor.digest} "
          f"signed by {' '.join(verified.signers)}")
    return EXIT_OK


def _cmd_descriptor_inspect(args: argparse.Namespace, data: bytes) -> int:

    document = read(data, limits=args.limits)
    signatures: list[str] = []
    payload = data
    if type(document) is tuple and document and str(document[0]) == "signed-descriptor":

        signed = read_signed_descriptor_unverified(data, limits=args.limits)
        payload = signed.payload
        signatures = [repr(sig.key_id) for sig in signed.signatures]
    descriptor = read_descriptor(payload, limits=args.limits)
    try:
        rules = read_grammar(descriptor.grammar, starts=descriptor.start_rules).rules
        grammar = f"{len(rules)} rules: " + " ".join(rule.name for rule in rules)
    except CBCLError as exc:
        grammar = f"refused ({exc.one_line()})"
    lines = [
        "UNVERIFIED: nothing here has been checked against a trust store",
        f"id: {descriptor.id}",
        f"version: {descriptor.version}",
        f"expires: {'never' if descriptor.expires is None else descriptor.expires}",
        f"digest: {descriptor.digest}",
        f"signatures: {' '.join(signatures) if signatures else 'none (unsigned)'}",
        "intents: " + " ".join(intent.value if rule == "body" else f"{intent.value}={rule}"
                               for intent, rule in descriptor.starts.items()),
        f"grammar: {len(descriptor.grammar.encode('utf-8'))} bytes, {grammar}",
    ]
    for line in lines:
        print(escape_invisible(line))
    return EXIT_OK


def _cmd_sign_message(args: argparse.Namespace, data: bytes) -> int:

    if len(args.key) != 1:
        _usage_error(args, "give exactly one --key")
    ((key_id, key),) = signing_keys(args)
    message = parse_envelope(decode(data, args.limits), args.limits)
    print(canonical(sign_message(message, key, key_id)))
    return EXIT_OK


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="cbcl", description="CBCL protocol engine.")
    parser.add_argument("--version", action="version", version=f"cbcl {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    p = commands.add_parser("parse", help="parse and recognise one message")
    p.add_argument("file", nargs="?", default="-", help="message file, or - for stdin")
    p.add_argument("--envelope-only", action="store_true",
                   help="stop after pass 1 (the envelope); do not judge the body")
    p.add_argument("--json", action="store_true", help="print the message as JSON")
    p.add_argument("--hint", action="store_true",
                   help="after an error line, print how to fix the message (stderr)")
    p.set_defaults(handler=with_hint(_cmd_parse))

    c = commands.add_parser("canon", help="print the canonical form of one value")
    c.add_argument("file", nargs="?", default="-", help="input file, or - for stdin")
    c.set_defaults(handler=_cmd_canon)

    add_protocol_options(p)
    p.add_argument("--require-signatures", action="store_true",
                   help="refuse messages without a valid signature (needs --trust)")

    k = commands.add_parser("keygen", help="make an Ed25519 key pair")
    k.add_argument("--out", required=True, metavar="PREFIX",
                   help="write PREFIX.key (PKCS#8 PEM, mode 0600) and PREFIX.pub")
    k.set_defaults(handler=_cmd_keygen, file=None)

    d = commands.add_parser("descriptor", help="build, sign, verify and inspect descriptors")
    descriptor_commands = d.add_subparsers(dest="descriptor_command", required=True,
                                           parser_class=Parser)
    sign = descriptor_commands.add_parser(
        "sign", help="write the (signed-descriptor …) form of a descriptor (or add "
                     "signatures to a signed one)")
    sign.add_argument("file", help="descriptor or signed descriptor file, or -")
    sign.add_argument("-o", "--output", required=True, metavar="OUT", help="output file, or -")
    verify = descriptor_commands.add_parser(
        "verify", help="verify a signed descriptor against a trust store (records nothing)")
    verify.add_argument("file", nargs="?", default="-", help="signed descriptor file, or -")
    verify.set_defaults(handler=_cmd_descriptor_verify)
    inspect = descriptor_commands.add_parser(
        "inspect", help="show a descriptor's id, version, digest, key ids and grammar "
                        "WITHOUT verifying anything")
    inspect.add_argument("file", nargs="?", default="-", help="descriptor file, or -")
    inspect.set_defaults(handler=_cmd_descriptor_inspect)
    register_descriptor(descriptor_commands)  # build, new
    sign.set_defaults(handler=_cmd_descriptor_sign)

    m = commands.add_parser("sign-message", help="sign a message; prints its canonical form")
    m.add_argument("file", nargs="?", default="-", help="message file, or - for stdin")
    m.set_defaults(handler=_cmd_sign_message)

    for sub in (sign, m):
        sub.add_argument("--key", action="append", required=True, metavar="KEY",
                         help="Ed25519 private key (PKCS#8 PEM); key id = file stem"
                              + (" (repeatable)" if sub is sign else ""))
        sub.add_argument("--key-id", action="append", default=[], metavar="ID",
                         help="the key id for the --key in the same position")
    add_trust_options(verify, trust_required=True)

    g = commands.add_parser("grammar", help="work with descriptor grammars")
    grammar_commands = g.add_subparsers(dest="grammar_command", required=True,
                                        parser_class=Parser)
    check = grammar_commands.add_parser(
        "check", help="check a grammar (or a descriptor's grammar); exit 0 only for LALR(1)")
    check.add_argument("file", nargs="?", default="-", help="grammar or descriptor file")
    check.add_argument("--start", nargs="+", metavar="RULE", default=None,
                       help="the start rules of grammar text (default: body; a "
                            "descriptor's come from its intents)")
    check.set_defaults(handler=_cmd_grammar_check)
    register_export(grammar_commands)

    for sub in (p, c, check, sign, verify, inspect, m):
        sub.add_argument("--max-message-bytes", type=document_bytes, metavar="N",
                         default=DEFAULT_LIMITS.max_message_bytes,
                         help=f"document size limit, 1 to {MAX_DOCUMENT_BYTES} "
                              f"(default {DEFAULT_LIMITS.max_message_bytes})")
    register_codec(commands)
    register_codegen(commands)
    register_conversation(commands)
    register_convert(commands)
    register_negotiate(commands)
    register_send(commands)
    register_bench(commands)
    register_llm(commands)
    register_mcp(commands)
    register_a2a(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    args = build_parser().parse_args(argv)
    args.limits = Limits(max_message_bytes=getattr(args, "max_message_bytes",
                                                   DEFAULT_LIMITS.max_message_bytes))
    data = b""
    try:
        data = b"" if args.file is None else read_input(args.file, sys.stdin.buffer,
                                                         args.limits)
        return int(args.handler(args, data))
    except TrustError as exc:
        # The local operator sees the precise reason (one_line() holds it); a peer never does.
        print(escape_invisible(exc.one_line().replace("\n", " ")), file=sys.stderr)
        return exc.exit_code
    except CBCLError as exc:
        binary_frame_hint(exc, data, args.file)
        print(escape_invisible(exc.one_line()), file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        print(escape_invisible(f"io: {exc.filename or args.file}: {exc.strerror or exc}"),
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug: still one line, never a traceback
        print(escape_invisible(f"internal: {type(exc).__name__}: {exc} (please report this)"),
              file=sys.stderr)
        return EXIT_INTERNAL
