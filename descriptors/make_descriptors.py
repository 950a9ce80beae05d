"""Write the shipped descriptors from their grammar files.

    python descriptors/make_descriptors.py          # rewrite descriptors/*.cbcl
    python descriptors/make_descriptors.py --check  # exit 1 if any is out of date

A descriptor carries its grammar as one CBCL string; the grammar files beside this script
are the readable source. tests/test_descriptors.py runs --check.
"""

from __future__ import annotations

import sys
from pathlib import Path

from cbcl._canonical import quote

HERE = Path(__file__).resolve().parent

# name: (protocol id, version, intents whose bodies the grammar governs)
SHIPPED = {
    "task-assignment-v1": ("task-assignment/v1", 1, "PROPOSE"),
    "contract-net-v1": ("contract-net/v1", 1, "CFP PROPOSE REFUSE ACCEPT REJECT INFORM FAILURE"),
    "request-v1": ("request/v1", 1, "REQUEST AGREE REFUSE FAILURE INFORM"),
    "canon-a-v1": ("canon-a/v1", 1, "QUERY REQUEST INFORM REFUSE FAILURE"),
}


def render(name: str) -> bytes:
    ident, version, intents = SHIPPED[name]
    grammar = (HERE / "grammars" / f"{name}.lark").read_text("utf-8")
    return (
        f"; {ident}: generated from descriptors/grammars/{name}.lark by\n"
        f"; descriptors/make_descriptors.py. Edit the grammar file and re-run it.\n"
        f"(protocol-descriptor\n"
        f"  (id {ident})\n"
        f"  (version {version})\n"
        f"  (intents {intents})\n"
        f"  (grammar {quote(grammar)}))\n"
    ).encode("utf-8")


def main(argv: list[str]) -> int:
    stale = []
    for name in SHIPPED:
        path = HERE / f"{name}.cbcl"
        wanted = render(name)
        if path.exists() and path.read_bytes() == wanted:
            continue
        stale.append(path.name)
        if "--check" not in argv:
            path.write_bytes(wanted)
    if stale and "--check" in argv:
        print("out of date: " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
