"""What oversized grammar offers cost a server, and how long a grammar whose request is
larger than the worker's pipe buffer takes to compile (issue 29).

    python benchmarks/compile_bounds.py [--offers 10] [--literals 1220]

Ten offers of distinct grammars whose compiled tables are ~75 MB each (``body: item*`` with
``item`` one of ``--literals`` distinct literals: every state after a literal reduces on
every literal, so the LALR table has about literals² entries) go through
``Registry.prepare``, the path ``cbcl serve`` takes for an offered descriptor, with the
default ``max_compiled_bytes`` (16 MiB); then a 32 KiB grammar whose comment is emoji (its
JSON request to the worker is about 96 KB) is compiled by ``compile_guarded``. Prints
CPU seconds (this process, and its workers), this process's RSS growth, and wall time.
"""

from __future__ import annotations

import argparse
import resource
import time

import installed


def oversized_descriptor(seed: int, literals: int) -> bytes:
    """An unsigned descriptor whose grammar's tables are about ``50 * literals²`` bytes."""
    from cbcl.core._canonical import quote

    grammar = "body: item*\nitem: " + " | ".join(f'"s{seed}w{i}"' for i in range(literals))
    return (f"(protocol-descriptor (id big-{seed}/v1) (version 1) (intents INFORM) "
            f"(grammar {quote(grammar + chr(10))}))").encode()


def emoji_grammar(size: int = 32_768) -> str:
    """A grammar of ``size`` UTF-8 bytes, nearly all of it emoji in a comment."""
    head = "body: SYMBOL\n// "
    return head + "\N{GRINNING FACE}" * ((size - len(head)) // 4)


def rss() -> int:
    """This process's resident set, in bytes (Linux)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def cpu() -> tuple[float, float]:
    me = resource.getrusage(resource.RUSAGE_SELF)
    workers = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, workers.ru_utime + workers.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--offers", type=int, default=10)
    parser.add_argument("--literals", type=int, default=1220)
    args = parser.parse_args()
    installed.check()  # the installed cbcl, with its C extension
    import cbcl
    from cbcl.grammar._compile import compile_guarded

    registry = cbcl.Registry(disk_cache=False)
    registry.compiled("body: SYMBOL\n")  # imports and first worker out of the measure
    start_rss, (start_me, start_workers), started = rss(), cpu(), time.monotonic()
    for seed in range(args.offers):
        offered = time.monotonic()
        try:
            registry.prepare(oversized_descriptor(seed, args.literals), allow_unsigned=True)
            outcome = "accepted"
        except cbcl.CBCLError as exc:
            outcome = exc.one_line()
        print(f"offer {seed}: {time.monotonic() - offered:.2f} s wall: {outcome[:120]}")
    me, workers = cpu()
    print(f"{args.offers} oversized offers: {time.monotonic() - started:.1f} s wall, "
          f"{me - start_me:.2f} s CPU here + {workers - start_workers:.2f} s in workers "
          f"({(me - start_me + workers - start_workers) / args.offers:.2f} s per offer), "
          f"RSS growth {(rss() - start_rss) / 1e6:.1f} MB, peak RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3:.0f} MB")
    text = emoji_grammar()
    began = time.monotonic()
    try:
        verdict = compile_guarded(text).verdict
    except cbcl.CBCLError as exc:
        verdict = exc.one_line()
    print(f"32 KiB emoji grammar ({len(text.encode())} bytes): {verdict} in "
          f"{time.monotonic() - began:.2f} s wall")


if __name__ == "__main__":
    main()
