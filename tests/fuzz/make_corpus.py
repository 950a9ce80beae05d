"""Build the seed corpus of the atheris harnesses (tests/fuzz/corpus/<target>/) from the
shipped examples, spec/vectors and the descriptors. Re-run after changing any of them:

    python tests/fuzz/make_corpus.py
"""

from __future__ import annotations

import hashlib
import re
import shutil
import sys
from pathlib import Path

import cbcl

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DESCRIPTORS = ("task-assignment-v1", "contract-net-v1", "request-v1", "canon-a-v1")
_BODY = re.compile(rb"\(body\s")


def _body_seed(registry: cbcl.Registry, text: bytes) -> bytes | None:
    """The body harness's input for one example: protocol index, intent index, body text."""
    message = cbcl.parse(text, registry=registry)
    if message.body is None:
        return None
    protocols = [p.id for p in registry.protocols()]
    intents = ["PROPOSE", "INFORM", "REQUEST", "CFP", "AGREE", "REFUSE", "FAILURE", "QUERY"]
    if message.intent.value not in intents:
        return None
    return (bytes([protocols.index(message.protocol), intents.index(message.intent.value)])
            + cbcl.canonical(message.body).encode())


def build() -> dict[str, list[bytes]]:
    registry = cbcl.Registry(disk_cache=False, isolate=False)
    for name in DESCRIPTORS:
        registry.load((ROOT / "descriptors" / f"{name}.cbcl").read_bytes(), allow_unsigned=True)
    examples = [p.read_bytes() for p in sorted((ROOT / "descriptors" / "examples").glob("*.cbcl"))]
    vectors = [p.read_bytes() for p in sorted((ROOT / "spec" / "vectors").rglob("*"))
               if p.is_file() and p.suffix in (".cbcl", ".bin", ".canonical")]
    descriptors = [p.read_bytes() for p in sorted((ROOT / "descriptors").glob("*.cbcl"))]
    grammars = [p.read_bytes() for p in sorted((ROOT / "descriptors" / "grammars").glob("*"))]
    encoder = cbcl.Encoder(registry)
    frames = [encoder.encode(cbcl.parse(text, registry=registry)) for text in examples]
    bodies = [seed for text in examples if (seed := _body_seed(registry, text)) is not None]
    return {
        "reader": examples + vectors + descriptors[:4],
        "envelope": examples + [v for v in vectors if b"CBCL/1.0" in v],
        "body": bodies,
        "decoder": frames + [frame[:-1] for frame in frames[:3]],
        "descriptor": descriptors,
        "grammar": grammars,
    }


def main() -> int:
    for target, seeds in build().items():
        directory = HERE / "corpus" / target
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        for seed in seeds:
            (directory / hashlib.sha1(seed).hexdigest()).write_bytes(seed)
        print(f"{target}: {len(seeds)} seeds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
