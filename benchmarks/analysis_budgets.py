"""The analyses of a descriptor on the hostile inputs of issues 29 and 36 (a measurement,
not a test): CPU seconds and outcome of each, one line each.

    python benchmarks/analysis_budgets.py [--only NAME …] [--timeout S]

Cases (built by ``tests/big_descriptors.py``):

* ``diff-150kb``, ``diff-150kb-breaking``: ``diff_descriptors`` of the ~160 KB pair (128
  records, about 2,150 numeric bounds and 5,700 one-of values a side);
* ``diff-bounds-x-one-of``: issue 36's shape, 1,300 ranges and 1,300 one-of values over one
  span (a 62 KB descriptor, under the 64 KiB of a signed offer);
* ``diff-subsets``: 40 records of 20 optional fields whose keys come in any order (2^20
  states a record: ends ``unknown`` at ``max_steps``);
* ``export-chain-FORMAT``: each export format of a 250-rule chain grammar (issue 29:
  ``internal: RecursionError``);
* ``export-keyword-sets``: 80 keyword sets of 8 members (over ``max_rules``);
* ``prompt-refused-drafts``: the prompt of the 150 KB descriptor (128 body forms, whose
  schema refuses every example drawn: 400 drafts a form);
* ``generate-exponential``: a body of a grammar whose least body has 2^60 tokens.

Each case runs in a child process (so that one that never ends is cut at ``--timeout``
seconds and reported as such), with the ``cbcl`` that ``PYTHONPATH`` or the environment
gives: run it once on a checkout before the budgets to compare.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import installed

ROOT = Path(__file__).resolve().parent.parent

_CHILD = r'''
import sys, time, resource
sys.path.insert(0, {tests!r})
sys.setrecursionlimit(1000)
import big_descriptors as b
case = {case!r}
if case.startswith("diff"):
    from cbcl.protocol._compat import diff_descriptors
    if case == "diff-150kb":
        old, new = b.bounds_pair()
    elif case == "diff-150kb-breaking":
        old, new = b.bounds_pair(breaking=True)
    elif case == "diff-bounds-x-one-of":
        old, new = b.bounds_times_one_of(1300, 1300), b.bounds_times_one_of(1300, 1300, version=2)
    else:
        old, new = b.subsets_descriptor(40, 20), b.subsets_descriptor(40, 20, version=2)
    work = lambda: diff_descriptors(old, new)
    show = lambda r: f"{{r.verdict}} ({{(r.reasons or ('',))[0][:70]}})"
    size = f"{{len(old):,}} + {{len(new):,}} bytes"
elif case == "prompt-refused-drafts":
    from cbcl.llm._prompt import render_prompt
    from cbcl.protocol._registry import Registry
    document = b.bounds_pair()[0]
    registry = Registry(disk_cache=False, isolate=False)
    protocol = registry.load(document, allow_unsigned=True)
    work = lambda: render_prompt(protocol, registry=registry)
    show = lambda text: f"{{len(text):,}} characters"
    size = f"{{len(document):,}} bytes"
elif case == "generate-exponential":
    from cbcl.llm._generate import generate_bodies
    document = b.descriptor_text('body: "(" "a" r0 ")"\n' + "".join(
        f"r{{i}}: r{{i + 1}} r{{i + 1}}\n" for i in range(60)) + 'r60: "x"\n')
    work = lambda: generate_bodies(document, "REQUEST", 1)
    show = lambda bodies: f"{{len(bodies)}} bodies"
    size = f"{{len(document):,}} bytes"
else:
    from cbcl.llm._export import export_grammar
    if case == "export-keyword-sets":
        document, fmt = b.keyword_sets_descriptor(80), "llguidance"
    else:
        document, fmt = b.descriptor_text(b.chain_grammar(250)), case.split("-", 2)[2]
    work = lambda: export_grammar(document, fmt)
    show = lambda e: f"{{len(e.text):,}} characters"
    size = f"{{len(document):,}} bytes"
start = time.process_time()
try:
    outcome = show(work())
except BaseException as exc:
    outcome = f"{{type(exc).__name__}}: {{str(exc)[:90]}}"
print(f"{{time.process_time() - start:.2f}}\t{{size}}\t{{outcome}}")
'''

CASES = ("diff-150kb", "diff-150kb-breaking", "diff-bounds-x-one-of", "diff-subsets",
         "export-chain-llguidance", "export-chain-gbnf", "export-chain-lark",
         "export-chain-json-schema", "export-keyword-sets", "prompt-refused-drafts",
         "generate-exponential")


def run(case: str, timeout: float) -> str:
    code = _CHILD.format(tests=str(ROOT / "tests"), case=case)
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return f"{case}: no answer in {timeout:.0f} s (cut)"
    if done.returncode != 0:
        return f"{case}: exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"
    seconds, size, outcome = done.stdout.strip().split("\t")
    return f"{case}: {seconds} s CPU, {size}: {outcome}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=list(CASES), choices=CASES)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    installed.check()  # the installed cbcl, with its C extension
    for case in args.only:
        print(run(case, args.timeout), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
