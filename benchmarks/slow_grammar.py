"""Grammars that are inside every grammar limit and still take seconds to compile: the
"slow-compiling offer" of the soak benchmark (benchmarks/soak.py).

    python benchmarks/slow_grammar.py [--rules N] [--alternatives K] [--seed S]

Shape: ``item`` is ``SYMBOL`` or one of N records; record ``i`` has K alternatives
``"(" "s<seed>r<i>" item "m<j>" item ")"`` that share their first three symbols, and every
alternative nests ``item`` twice. Every state that expects an ``item`` predicts all N
records, so the LALR automaton has about ``N * (3K + 4)`` states over ``N + K + 4``
terminals; CBCL's own analyser handles that in a fraction of a second, but building lark's
tables for it takes seconds (60 × 6: about 4.5 s on an idle core of the 2-vCPU reference
machine; 1,265 LALR states, 12.4 KB of grammar, 22 KB signed). The grammar is LALR(1), so
a server that accepts the offer really compiles it, and the seed changes every record
keyword, so each seed is a new grammar (new cache key) of the same cost.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import installed

#: The soak benchmark's default: 4–5 s to compile in-process on the reference machine.
DEFAULT_RULES = 60
DEFAULT_ALTERNATIVES = 6


def slow_grammar(seed: int, rules: int = DEFAULT_RULES,
                 alternatives: int = DEFAULT_ALTERNATIVES) -> str:
    """The grammar text (lark EBNF subset) for ``seed``."""
    if rules < 1 or alternatives < 1:
        raise ValueError("rules and alternatives must be positive")
    lines = ["body: item", "item: SYMBOL | " + " | ".join(f"r{i}" for i in range(rules))]
    for i in range(rules):
        alts = [f'"(" "s{seed}r{i}" item "m{j}" item ")"' for j in range(alternatives)]
        lines.append(f"r{i}: " + " | ".join(alts))
    return "\n".join(lines) + "\n"


def protocol_id(seed: int) -> str:
    return f"slow-{seed}/v1"


def slow_descriptor(seed: int, rules: int = DEFAULT_RULES,
                    alternatives: int = DEFAULT_ALTERNATIVES) -> bytes:
    """An unsigned ``(protocol-descriptor …)`` payload with the slow grammar (sign it with
    ``cbcl.protocol._trust.sign_descriptor``). Each seed has its own protocol id, so offers of
    several
    seeds to one server are neither rollbacks nor equivocations."""
    from cbcl.core._canonical import quote

    grammar = slow_grammar(seed, rules, alternatives)
    return (f"(protocol-descriptor (id {protocol_id(seed)}) (version 1) (intents INFORM) "
            f"(grammar {quote(grammar)}))").encode()


def example_message(seed: int) -> str:
    """A body the grammar accepts (for checking it in the benchmark)."""
    return f'(s{seed}r0 leaf m0 (s{seed}r1 leaf m1 leaf))'


def measure(seed: int = 0, rules: int = DEFAULT_RULES,
            alternatives: int = DEFAULT_ALTERNATIVES) -> dict[str, Any]:
    """Compile the grammar once in this process (``cbcl.grammar._compile.compile_grammar``) and
    report its size and cost."""
    from cbcl.grammar._compile import compile_grammar
    from cbcl.grammar._subset import read_grammar, to_cfg

    text = slow_grammar(seed, rules, alternatives)
    source = read_grammar(text)
    productions = len(to_cfg(source).productions)
    started = time.perf_counter()
    compiled = compile_grammar(text)
    seconds = time.perf_counter() - started
    return {"seed": seed, "rules": rules + 2, "alternatives": alternatives,
            "grammar_bytes": len(text.encode()), "bnf_productions": productions,
            "verdict": compiled.verdict,
            "lalr_states": len(compiled.tables.actions) if compiled.tables else 0,
            "descriptor_bytes": len(slow_descriptor(seed, rules, alternatives)),
            "compile_s": seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rules", type=int, default=DEFAULT_RULES)
    parser.add_argument("--alternatives", type=int, default=DEFAULT_ALTERNATIVES)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    installed.check()  # the installed cbcl, with its C extension
    row = measure(args.seed, args.rules, args.alternatives)
    if args.json:
        print(json.dumps(row))
    else:
        for key, value in row.items():
            print(f"{key:18} {value:.2f}" if isinstance(value, float) else f"{key:18} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
