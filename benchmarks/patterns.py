"""What a schema pattern costs to match (spec/conversations.md §2.4), against Python ``re``.

    python benchmarks/patterns.py [--rounds N]

Benign cases, timed in interleaved rounds (the DFA, then ``re`` on the same strings), best
round kept, as ns of CPU time per character and the ratio DFA / re from the same run:
``S-[0-9]+`` and ``[a-z_-]+`` on 1,000-character strings (a looping state: the run is
skipped by a byte-class match), ``(ab|cd)*`` on the same length (no looping state: one table
step a character), and IDs of 4 to 8 characters (the per-call cost). Then the pathological
cases, which ``re`` is not run on (it backtracks exponentially): ``(a|a)*b`` and ``(a*)*b``
on 10,000 ``a``s, with the characters the DFA read and its CPU time. Under callgrind
(instructions, not time) the same cases gave, on 2026-12-07: 33 instructions a character
for the looping case (``re``: 24), ~570 for one table step a character, ~5,600 per short ID
(``re``: ~1,300).
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Callable

from cbcl.protocol._patterns import compile_pattern

CASES = {
    "S-[0-9]+ (1,000 chars)": ("S-[0-9]+", ["S-" + "1234567890" * 100] * 50),
    "[a-z_-]+ (1,000 chars)": ("[a-z_-]+", ["ab_cd-" * 166 + "abcd"] * 50),
    "(ab|cd)* (1,000 chars)": ("(ab|cd)*", ["abcd" * 250] * 50),
    "S-[0-9]{1,6} (IDs)": ("S-[0-9]{1,6}", ["S-1234", "S-99", "X-1", "S-123456"] * 500),
}


def _cpu(match: Callable[[str], object], texts: list[str]) -> float:
    start = time.process_time()
    for text in texts:
        match(text)
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    for name, (pattern, texts) in CASES.items():
        ours, theirs = compile_pattern(pattern).fullmatch, re.compile(pattern).fullmatch
        best_ours = best_re = float("inf")
        for _ in range(args.rounds):
            best_ours = min(best_ours, _cpu(ours, texts))
            best_re = min(best_re, _cpu(theirs, texts))
        chars = sum(len(t) for t in texts)
        print(f"{name:26} DFA {best_ours / chars * 1e9:7.1f} ns/char   re "
              f"{best_re / chars * 1e9:6.1f} ns/char   ratio {best_ours / best_re:5.1f}")
    for pattern in ("(a|a)*b", "(a*)*b"):
        compiled = compile_pattern(pattern)
        text = "a" * 10_000
        start = time.process_time()
        matched, read = compiled.run(text)
        spent = time.process_time() - start
        print(f"{pattern:26} on 10,000 a's: matched {matched}, read {read} characters, "
              f"{compiled.states} DFA states, {spent * 1e6:.0f} µs CPU")


if __name__ == "__main__":
    main()
