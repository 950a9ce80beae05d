"""The worker process of :func:`cbcl._compile.compile_guarded`: reads one JSON request on
stdin, limits its own address space, compiles, and writes one JSON reply on stdout."""

from __future__ import annotations

import json
import resource
import sys


def main() -> int:
    request = json.loads(sys.stdin.buffer.read())
    memory = int(request["memory"])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    from ._compile import compile_grammar, to_data
    from ._errors import GrammarError
    from ._subset import GrammarLimits

    try:
        compiled = compile_grammar(request["grammar"], GrammarLimits(**request["limits"]))
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
