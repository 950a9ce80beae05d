"""The worker process of :func:`cbcl.grammar._compile.compile_guarded`: reads one JSON request on
stdin, limits its own address space, compiles, and writes one JSON reply on stdout:
``{"ok": <compiled grammar>}``, ``{"error": <GrammarError>}`` or ``{"oversized": <size,
limit, exact, states, measure>}``. The last is all that crosses the pipe for a grammar whose
compiled form (by :func:`cbcl.grammar._compile.compiled_size`, found as the analyser builds
the automaton) or whose ``ok`` reply (in bytes) is over the request's ``max_table_bytes``."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
from typing import Any

from ..core._errors import GrammarError
from ._compile import TablesTooLarge, compile_grammar, to_data
from ._subset import GrammarLimits


def _oversized(exc: TablesTooLarge) -> dict[str, Any]:
    return {"oversized": {"size": exc.size, "limit": exc.limit, "exact": exc.exact,
                          "states": exc.states, "measure": exc.measure}}


def _encode(reply: dict[str, Any]) -> bytes:
    return json.dumps(reply, separators=(",", ":")).encode()


def confine(request: dict[str, Any]) -> None:
    """Apply a request's limits to this worker: ``memory`` bytes of address space,
    ``cpu_seconds`` of CPU, and a lower priority than the process that serves peers."""
    memory = int(request["memory"])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    seconds = int(request.get("cpu_seconds", 0))
    if seconds > 0:  # CPU time, so a busy machine does not refuse a grammar by itself
        resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 1))
    # Compiling is background work: the process that serves peers comes first.
    with contextlib.suppress(OSError):
        os.nice(10)


def main() -> int:
    request = json.loads(sys.stdin.buffer.read())
    confine(request)
    limit = int(request["max_table_bytes"])
    try:
        compiled = compile_grammar(request["grammar"], GrammarLimits(**request["limits"]),
                                   starts=tuple(request["starts"]), max_table_bytes=limit)
    except TablesTooLarge as exc:
        reply = _encode(_oversized(exc))
    except GrammarError as exc:
        position = exc.position
        reply = _encode({"error": {
            "message": exc.message, "verdict": exc.verdict, "context": exc.context,
            "position": None if position is None
            else [position.line, position.column, position.offset]}})
    else:
        reply = _encode({"ok": to_data(compiled)})
        if len(reply) > limit:  # the parent would hold all of it: refused here instead
            reply = _encode(_oversized(TablesTooLarge(len(reply), limit, measure="reply")))
    sys.stdout.buffer.write(reply)
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
