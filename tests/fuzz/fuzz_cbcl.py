"""Atheris harnesses: any input gives a result or a :class:`cbcl.CBCLError`, nothing else.

    pip install '.[fuzz]'
    python tests/fuzz/fuzz_cbcl.py TARGET [libFuzzer options] [corpus dirs]
    python tests/fuzz/fuzz_cbcl.py reader -max_total_time=180 tests/fuzz/corpus/reader

TARGET is one of ``reader``, ``envelope``, ``body``, ``decoder``, ``descriptor``,
``grammar``. Any exception other than ``CBCLError`` (and the ``TypeError``/``ValueError``
an API documents for arguments of the wrong type, which a harness never passes) is a
finding: libFuzzer stops and writes the input to ``crash-*``. The seed corpus under
``tests/fuzz/corpus/<target>/`` is built from the shipped examples, ``spec/vectors`` and
the descriptors by ``tests/fuzz/make_corpus.py``. Without atheris, ``--replay FILE…`` runs
the same check on saved inputs (used by the smoke test).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
DESCRIPTORS = ("task-assignment-v1", "contract-net-v1", "request-v1", "canon-a-v1")
_INTENTS = ("PROPOSE", "INFORM", "REQUEST", "CFP", "AGREE", "REFUSE", "FAILURE", "QUERY")


def _setup() -> dict[str, Callable[[bytes], None]]:
    import cbcl
    from cbcl._compile import compile_grammar
    from cbcl._envelope import scan_envelope
    from cbcl._reader import decode
    from cbcl._subset import GrammarLimits

    registry = cbcl.Registry(disk_cache=False, isolate=False)
    for name in DESCRIPTORS:
        registry.load((ROOT / "descriptors" / f"{name}.cbcl").read_bytes(), allow_unsigned=True)
    protocols = [str(p.id) for p in registry.protocols()]
    decoders = (cbcl.Decoder(registry), cbcl.Decoder(registry, pure_python=True))
    small = GrammarLimits(max_text_bytes=4096, max_rules=32, max_productions=512)
    limits = cbcl.Limits(max_depth=64, max_nodes=10_000)

    def reader(data: bytes) -> None:
        try:
            value = cbcl.read(data, limits=limits)
        except cbcl.CBCLError:
            pass
        else:  # the canonical text reads back as the same value
            assert cbcl.read(cbcl.canonical(value)) == value
        with contextlib.suppress(cbcl.CBCLError):
            cbcl.read_all(data, limits=limits)

    def envelope(data: bytes) -> None:
        try:
            message = cbcl.parse(data, envelope_only=True, limits=limits)
        except cbcl.CBCLError as exc:
            try:  # the slow path refuses too, and with the same error
                text = decode(data, limits)
                scan_envelope(text, limits)
            except cbcl.CBCLError as again:
                assert str(again) == str(exc), (again, exc)
            else:
                raise AssertionError(f"fast path refused, slow path accepted: {exc}") from None
        else:  # the structural walk and the tables agree, and the canonical text reads back
            assert scan_envelope(decode(data, limits), limits).message == message
            assert cbcl.parse(message.canonical(), envelope_only=True) == message

    def body(data: bytes) -> None:
        if not data:
            return
        protocol = protocols[data[0] % len(protocols)]
        intent = _INTENTS[data[1] % len(_INTENTS)] if len(data) > 1 else "INFORM"
        head = (f'(CBCL/1.0 (message-id "m") (sender agent://a) (receiver agent://b) '
                f"(intent {intent}) (protocol {protocol}) (body ").encode()
        try:
            message = cbcl.parse(head + data[2:] + b"))", registry=registry, limits=limits)
        except cbcl.CBCLError:
            return
        # What text accepts, the binary form carries and accepts the same.
        frame = cbcl.encode(message, registry=registry)
        assert decoders[0].decode(frame) == message

    def decoder(data: bytes) -> None:
        outcomes = []
        for one in decoders:
            try:
                outcomes.append(one.decode(data))
            except cbcl.CBCLError as exc:
                outcomes.append((type(exc), str(exc)))
        # The C and pure-Python unpackers give the same result or the same error.
        assert outcomes[0] == outcomes[1], outcomes

    def descriptor(data: bytes) -> None:
        try:
            cbcl.read_descriptor(data)
        except cbcl.CBCLError:
            return
        with contextlib.suppress(cbcl.CBCLError):
            cbcl.Registry(disk_cache=False, isolate=False, grammar_limits=small).load(
                data, allow_unsigned=True, now=0)

    def grammar(data: bytes) -> None:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return
        with contextlib.suppress(cbcl.CBCLError):
            compile_grammar(text, small)

    return {"reader": reader, "envelope": envelope, "body": body, "decoder": decoder,
            "descriptor": descriptor, "grammar": grammar}


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__)
        return 2
    target, rest = argv[1], argv[2:]
    if rest and rest[0] == "--replay":
        checks = _setup()
        for path in rest[1:]:
            checks[target](Path(path).read_bytes())
        return 0
    import atheris

    with atheris.instrument_imports(include=["cbcl"]):
        checks = _setup()
    if target not in checks:
        print(f"unknown target {target!r}; one of {', '.join(checks)}")
        return 2
    atheris.Setup([argv[0], *rest], checks[target])
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
