"""Build the seed corpus of the atheris harnesses (tests/fuzz/corpus/<target>/) from the
shipped examples, spec/vectors and the descriptors, and (``session``) from the frames of a
real handshake between two sessions. Re-run after changing any of them:

    python tests/fuzz/make_corpus.py [TARGET …]

(only the corpora of the TARGETs named, if any).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import cbcl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fuzz_cbcl import SESSION_NOWS, SESSION_SCENARIOS, SessionKit

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


def _session_seeds() -> list[bytes]:
    """The session harness's inputs: every scenario fed what its real peer sends next, a few
    of them cut small, late, truncated or with deferred work, and the known reproducers."""
    kit = SessionKit()
    header = kit.header
    streams = {name: b"".join(kit.peer_frames(name)) for name in SESSION_SCENARIOS}
    seeds = [header(name) + stream for name, stream in streams.items()]
    seeds += [
        header("responder-idle", size=1, eof=True) + streams["responder-idle"],
        header("initiator-offered", size=7, eof=True) + streams["initiator-offered"],
        header("responder-unsupported", size=33, defer_work=True)
        + streams["responder-unsupported"],
        header("responder-idle-binary", SESSION_NOWS[3]) + streams["responder-idle-binary"],
        header("initiator-asked", SESSION_NOWS[10]) + streams["initiator-asked"],
        header("responder-idle", eof=True) + streams["responder-idle"][:700],
    ]

    def message(intent: str, body: str = "", *, to_initiator: bool = False,
                protocol: str = "cbcl-negotiation/v1", timestamp: int = kit.NOW) -> bytes:
        sender, receiver = (kit.B, kit.A) if to_initiator else (kit.A, kit.B)
        text = (f'(CBCL/1.0 (message-id "m-1") (sender {sender}) (receiver {receiver}) '
                f"(intent {intent}) (protocol {protocol}) "
                f'(conversation-id "{kit.CID}") (timestamp {timestamp}){body})').encode()
        return len(text).to_bytes(4, "big") + text

    seeds += [  # a CANCEL before any handshake reached an assert (the reproducer)
        header("responder-idle") + message("CANCEL"),
        header("responder-idle") + message("CANCEL", ' (body "bye")'),
        header("initiator-asked") + message("CANCEL", to_initiator=True),
        header("responder-agreed") + message("NOT-UNDERSTOOD", ' (body "malformed")'),
        header("responder-idle") + message("QUERY", " (body (supports :protocol x/v1 "
                                           ':digest "sha256:00" :versions () :encodings (text) '
                                           ':nonce "0123456789abcdef0123"))'),
        # a fresh message at the edge of int64, read at a `now` just past it
        header("responder-idle", SESSION_NOWS[10]) + message(
            "QUERY", f' (body (supports :protocol contract-net/v1 :digest "{kit.digest}" '
            f':versions (1) :encodings (text) :nonce "{kit.A_NONCE}"))', timestamp=2**63 - 1),
    ]
    # A binary frame of the other protocol the initiator knows, after binary was agreed.
    request = cbcl.parse((ROOT / "descriptors" / "examples" / "request-v1.cbcl").read_bytes(),
                         registry=kit.initiator_registry)
    request = replace(request, sender=cbcl.URI(kit.B), receiver=cbcl.URI(kit.A),
                      timestamp=kit.NOW)
    binary = cbcl.Encoder(kit.initiator_registry).encode(request)
    seeds.append(header("initiator-established-binary")
                 + len(binary).to_bytes(4, "big") + binary)
    return seeds


def build() -> dict[str, list[bytes]]:
    registry = cbcl.Registry(disk_cache=False, isolate=False)
    for name in DESCRIPTORS:
        registry.load((ROOT / "descriptors" / f"{name}.cbcl").read_bytes(), allow_unsigned=True)
    examples = [p.read_bytes() for p in sorted((ROOT / "descriptors" / "examples").glob("*.cbcl"))]
    vectors = [p.read_bytes() for p in sorted((ROOT / "spec" / "vectors").rglob("*"))
               if p.is_file() and p.suffix in (".cbcl", ".bin", ".canonical")]
    descriptors = [p.read_bytes() for p in sorted((ROOT / "descriptors").glob("*.cbcl"))]
    unsigned = [d for d in descriptors if b"(signed-descriptor" not in d]
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
        "diff": [a + b"\0" + b for a in unsigned for b in unsigned],
        "export": [bytes([k]) + d for k, d in enumerate(unsigned)]
                  + [bytes([128 + k]) + d for k, d in enumerate(unsigned)],
        "session": _session_seeds(),
    }


def main(argv: list[str]) -> int:
    for target, seeds in build().items():
        if argv[1:] and target not in argv[1:]:
            continue
        directory = HERE / "corpus" / target
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        for seed in seeds:
            (directory / hashlib.sha1(seed).hexdigest()).write_bytes(seed)
        print(f"{target}: {len(seeds)} seeds")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
