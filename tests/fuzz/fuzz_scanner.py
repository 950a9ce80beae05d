"""Atheris harness of the text reader's C twin (``cbcl._native.read_value``): on every
input, what it reads is exactly what the Python reference
(``cbcl.core._reader.read_value_python``) reads, value, end and node count, and where it
gives up the reference raises (but at a later position of a text that is not ASCII, which
it leaves to the reference).

    pip install '.[fuzz]'
    python tests/fuzz/fuzz_scanner.py [libFuzzer options] [corpus dirs]
    python tests/fuzz/fuzz_scanner.py -max_total_time=180 tests/fuzz/corpus/reader
    python tests/fuzz/fuzz_scanner.py --replay FILE…   # without atheris (the smoke test)
    python tests/fuzz/fuzz_scanner.py --random N [SEED]   # N seeds, random and mutated inputs

The first byte of an input picks the limits (the defaults, or small ones that the input
can reach) and the second a start position; the rest is decoded as UTF-8 (undecodable
bytes replaced, as ``cbcl.parse`` never passes them on). Any disagreement is an
AssertionError: libFuzzer stops and writes the input to ``crash-*``.
``tests/fuzz/asan_build.sh`` runs this harness against the extension built with
AddressSanitizer and UBSan.

Tests internals: the reader's tiers (``cbcl.core._reader``) are private.
"""

from __future__ import annotations

import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
CORPUS = ROOT / "tests" / "fuzz" / "corpus" / "reader"


def _same(a: object, b: object) -> bool:
    if type(a) is not type(b):
        return False
    if type(a) is tuple:
        return len(a) == len(b) and all(  # type: ignore[arg-type]
            _same(x, y) for x, y in zip(a, b, strict=True))  # type: ignore[call-overload]
    if type(a) is Decimal:
        return str(a) == str(b)
    return a == b


def _setup() -> Any:
    from cbcl import CBCLError, Limits
    from cbcl.core import _reader
    from cbcl.core._limits import DEFAULT_LIMITS

    read_value = _reader._read_value_c
    if read_value is None:
        raise SystemExit("cbcl._native is not built")
    small = [Limits(max_depth=d, max_list_items=i, max_nodes=n, max_string_bytes=s,
                    max_name_chars=c)
             for d, i, n, s, c in ((2, 3, 8, 4, 3), (4, 8, 40, 16, 12), (8, 2, 12, 1, 1),
                                   (64, 4096, 200, 64, 6))]

    def check(data: bytes) -> None:
        if len(data) < 2:
            return
        limits = DEFAULT_LIMITS if data[0] < 128 else small[data[0] % len(small)]
        text = data[2:].decode("utf-8", "replace")
        pos = data[1] % (len(text) + 1) if data[1] >= 128 else 0
        try:
            careful: Any = _reader.read_value_python(text, pos, limits, 0, 0)
        except CBCLError:
            careful = None
        found = read_value(text, pos, _reader._CACHE, _reader._atom, limits.max_depth,
                           limits.max_list_items, limits.max_nodes,
                           limits.max_string_bytes, limits.max_name_chars)
        if found is None:  # (a text that is not ASCII is read from its start only)
            assert careful is None or (pos and not text.isascii()), (text, pos, careful)
            return
        assert careful is not None, (text, pos, found)
        assert _same(found[0], careful[0]) and found[1:] == careful[1:], (text, found, careful)

    return check


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from harness import main as run

    return run(argv, _setup, CORPUS, seed_prefix=b"\x00\x00")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
