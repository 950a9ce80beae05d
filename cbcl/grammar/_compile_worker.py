"""The worker process of :func:`cbcl.grammar._compile.compile_guarded`: reads one JSON request on
stdin, limits its own address space, compiles, and writes one JSON reply on stdout."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys

from ..core._errors import GrammarError
from ._compile import compile_grammar, to_data
from ._subset import GrammarLimits


def main() -> int:
    request = json.loads(sys.stdin.buffer.read())
    memory = int(request["memory"])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    seconds = int(request.get("cpu_seconds", 0))
    if seconds > 0:  # CPU time, so a busy machine does not refuse a grammar by itself
        resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 1))
    # Compiling is background work: the process that serves peers comes first.
    with contextlib.suppress(OSError):
        os.nice(10)


    try:
        compiled = compile_grammar(request["grammar"], GrammarLimits(**request["limits"]),
                                   starts=tuple(request["starts"]))
    except GrammarError as exc:
        position = exc.position
        reply = {"error": {
            "message": exc.message, "verdict": exc.verdict, "context": exc.context,
            "position": None if position is None
            else [position.line, position.column, position.offset]}}
    else:
        reply = {"ok": to_data(compiled)}
    sys.stdout.write(json.dumps(reply))
    return 0


if __name__ == "__main__":
    sys.exit(main())
