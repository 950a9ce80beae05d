"""The command line the C twins' atheris harnesses share (``fuzz_encoders.py``,
``fuzz_scanner.py``): ``--random N [SEED]`` runs N inputs without atheris (the corpus's
seeds, then random bytes and mutated seeds, alternately), ``--replay FILE…`` runs the given
inputs, and anything else is handed to libFuzzer with the harness's check. ``setup`` makes
the check (importing cbcl inside it, so atheris instruments what it imports)."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path


def main(argv: list[str], setup: Callable[[], Callable[[bytes], None]], corpus: Path,
         seed_prefix: bytes = b"") -> int:
    """Run a harness as its command line says; ``seed_prefix`` goes before each seed in
    ``--random`` (the bytes a harness reads as options before its input)."""
    rest = argv[1:]
    if rest and rest[0] == "--random":
        check = setup()
        rng = random.Random(int(rest[2]) if len(rest) > 2 else 0)
        seeds = [seed_prefix + path.read_bytes() for path in sorted(corpus.iterdir())]
        for run in range(int(rest[1])):
            if run < len(seeds):
                data = seeds[run]
            elif run % 2:
                data = bytes(rng.randrange(256) for _ in range(rng.randrange(200)))
            else:
                mutated = bytearray(rng.choice(seeds))
                for _ in range(rng.randrange(1, 8)):
                    if mutated:
                        mutated[rng.randrange(len(mutated))] = rng.randrange(256)
                data = bytes(mutated)
            check(data)
        return 0
    if rest and rest[0] == "--replay":
        check = setup()
        for path in rest[1:]:
            check(Path(path).read_bytes())
        return 0
    import atheris

    with atheris.instrument_imports(include=["cbcl"]):
        check = setup()
    atheris.Setup([argv[0], *rest], check)
    atheris.Fuzz()
    return 0
