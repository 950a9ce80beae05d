"""pytest-benchmark suite for regressions on the hot paths (not part of the unit tests):

    pytest benchmarks/ --benchmark-only
"""

from __future__ import annotations

import sexpdata
from compare import corpus

import cbcl

CORPUS = corpus()


def test_read_small(benchmark) -> None:  # type: ignore[no-untyped-def]
    benchmark(cbcl.read, CORPUS["small"])


def test_envelope_small(benchmark) -> None:  # type: ignore[no-untyped-def]
    benchmark(cbcl.parse, CORPUS["small"], envelope_only=True)


def test_envelope_medium(benchmark) -> None:  # type: ignore[no-untyped-def]
    benchmark(cbcl.parse, CORPUS["medium"], envelope_only=True)


def test_canonical_medium(benchmark) -> None:  # type: ignore[no-untyped-def]
    message = cbcl.parse(CORPUS["medium"], envelope_only=True)
    benchmark(cbcl.canonical, message)


def test_peer_sexpdata_small(benchmark) -> None:  # type: ignore[no-untyped-def]
    benchmark(sexpdata.loads, CORPUS["small"].decode())
