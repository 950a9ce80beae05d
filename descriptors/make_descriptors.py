"""Write the shipped descriptors from their declarations or grammar files, and their signed
copies.

    python descriptors/make_descriptors.py          # rewrite descriptors/*.cbcl
    python descriptors/make_descriptors.py --check  # exit 1 if any is out of date

A protocol with a declaration, declarations/NAME.cbcl (spec/declarations.md), is built from
it alone (``cbcl.descriptor_from_declaration``, also ``cbcl descriptor build``): grammar
and schema both derived from its records. The others keep a hand-written grammar,
grammars/NAME.lark, and their sections, sections/NAME.SECTION.cbcl, put together by
``cbcl.build_descriptor``, which checks the schema against the grammar; HAND_WRITTEN says
why (spec/declarations.md §4). A protocol moved onto a declaration is a new version; its
hand-written predecessor is kept in history/ (NAME.version-N.cbcl). Each NAME.cbcl also gets
NAME.signed.cbcl, whose payload is NAME.cbcl's exact bytes, signed with the example key
keys/cbcl-example.key (its private half is public on purpose, so anyone can regenerate
these; trust your own keys, never this one). Ed25519 signatures are deterministic, so
--check compares bytes. tests/test_protocol.py runs --check.

The descriptors in PACKAGED are also written, byte for byte, to ../cbcl/grammars/ (the package
``cbcl.grammars``), so they ship inside the wheel: cbcl-negotiation/v1, which every session
speaks, and contract-net/v1, which ``cbcl negotiate --demo`` teaches.
"""

from __future__ import annotations

import sys
from pathlib import Path

from cbcl import build_descriptor, descriptor_from_declaration
from cbcl.protocol._trust import load_private_key, sign_descriptor

HERE = Path(__file__).resolve().parent
EXAMPLE_KEY = HERE / "keys" / "cbcl-example.key"

# name: (protocol id, version, intents whose bodies the grammar governs, with their start
# rules as INTENT=rule where they have one). A declared protocol's id, version and intents
# are its declaration's; its entry here is what the tests compare the build with.
SHIPPED = {
    "task-assignment-v1": ("task-assignment/v1", 2, "PROPOSE"),
    "contract-net-v1": ("contract-net/v1", 2, "CFP=cfp PROPOSE=proposal REFUSE=refusal "
                        "ACCEPT=acceptance REJECT=rejection INFORM=done FAILURE=failure"),
    "request-v1": ("request/v1", 2, "REQUEST=request AGREE=agree REFUSE=refuse "
                   "FAILURE=failure INFORM=inform"),
    "canon-a-v1": ("canon-a/v1", 3, "QUERY=query REQUEST=request INFORM=inform "
                   "REFUSE=refuse FAILURE=failure"),
    "cbcl-negotiation-v1": ("cbcl-negotiation/v1", 1,
                            "QUERY INFORM PROPOSE ACCEPT REJECT CONFIRM"),
}
#: The protocols built from descriptors/declarations/NAME.cbcl.
DECLARED = ("request-v1", "contract-net-v1", "task-assignment-v1", "canon-a-v1")
#: The protocols that keep a hand-written grammar (and why), their schema checked against it
#: at every build.
HAND_WRITTEN = {
    "cbcl-negotiation-v1": "every session speaks it and peers pin its digest, so any byte "
                           "changed splits deployed peers for no change in what it accepts; "
                           "a declaration would change its bytes (a derived grammar's text, "
                           "one start rule per intent where its six share body, and a "
                           "schema record for (rejected …), which has none)",
}
PACKAGE_DATA = HERE.parent / "cbcl" / "grammars"
PACKAGED = ("cbcl-negotiation-v1", "contract-net-v1")


def render(name: str) -> bytes:
    """The descriptor: built from declarations/NAME.cbcl for a declared protocol, else by
    :func:`cbcl.build_descriptor` from the grammar file and each section file of
    descriptors/sections/ (NAME.SECTION.cbcl) that exists."""
    ident, version, intents = SHIPPED[name]
    if name in DECLARED:
        return descriptor_from_declaration(
            (HERE / "declarations" / f"{name}.cbcl").read_bytes(),
            comment=f"{ident}: generated from descriptors/declarations/{name}.cbcl by\n"
                    f"descriptors/make_descriptors.py. Edit that file and re-run it.")

    def section(part: str) -> bytes | None:
        path = HERE / "sections" / f"{name}.{part}.cbcl"
        return path.read_bytes() if path.exists() else None

    return build_descriptor(
        ident, version, intents, (HERE / "grammars" / f"{name}.lark").read_text("utf-8"),
        schema=section("schema"), conversation=section("conversation"),
        functions=section("functions"), constraints=section("constraints"),
        comment=f"{ident}: generated from descriptors/grammars/{name}.lark and\n"
                f"descriptors/sections/{name}.*.cbcl by descriptors/make_descriptors.py.\n"
                f"Edit those files and re-run it.")


def render_signed(name: str, payload: bytes) -> bytes:
    key = load_private_key(EXAMPLE_KEY.read_bytes())
    header = (f"; {SHIPPED[name][0]}: {name}.cbcl signed with the EXAMPLE key\n"
              f"; descriptors/keys/cbcl-example.key by descriptors/make_descriptors.py.\n"
              f"; Its private half is public: trust your own keys, never this one.\n")
    return header.encode("utf-8") + sign_descriptor(payload, [("cbcl-example", key)])


def main(argv: list[str]) -> int:
    stale = []
    for name in SHIPPED:
        wanted = render(name)
        for path, content in ((HERE / f"{name}.cbcl", wanted),
                              (HERE / f"{name}.signed.cbcl", render_signed(name, wanted)),
                              *([(PACKAGE_DATA / f"{name}.cbcl", wanted)]
                                if name in PACKAGED else [])):
            if path.exists() and path.read_bytes() == content:
                continue
            stale.append(path.name)
            if "--check" not in argv:
                path.write_bytes(content)
    if stale and "--check" in argv:
        print("out of date: " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
