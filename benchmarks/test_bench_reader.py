"""pytest-benchmark suites for regressions on the hot paths and their peers, on the corpus of
``cbcl bench`` (not part of the unit tests; they do not run in CI):

    pytest benchmarks/ --benchmark-only [--benchmark-compare]
"""

from __future__ import annotations

import pytest
import sexpdata
from cbcl_bench import build_corpus, find_descriptors, lark_parser, load_registry
from pytest_benchmark.fixture import BenchmarkFixture

import cbcl

DIRECTORY = find_descriptors()
REGISTRY = load_registry(DIRECTORY)
# One message per size class (the first of each set of ``cbcl bench``): these suites time
# one message repeatedly, for regressions; ``cbcl bench`` times sets of different ones.
CASES = {case.name: case for case in build_corpus(DIRECTORY, REGISTRY,
                                                  messages={"small": 1, "medium": 1,
                                                            "large": 1})}
NAMES = sorted(CASES)
ENCODER = cbcl.Encoder(REGISTRY, validate=False)  # as msgspec encodes: no second check
DECODER = cbcl.Decoder(REGISTRY)
PURE_DECODER = cbcl.Decoder(REGISTRY, pure_python=True)  # without any C: the fallback


@pytest.mark.parametrize("name", NAMES)
def test_text_parse(benchmark: BenchmarkFixture, name: str) -> None:
    benchmark(cbcl.parse, CASES[name].text, registry=REGISTRY)


@pytest.mark.parametrize("name", NAMES)
def test_binary_decode(benchmark: BenchmarkFixture, name: str) -> None:
    benchmark(DECODER.decode, ENCODER.encode(CASES[name].message))


@pytest.mark.parametrize("name", NAMES)
def test_binary_decode_pure_python(benchmark: BenchmarkFixture, name: str) -> None:
    benchmark(PURE_DECODER.decode, ENCODER.encode(CASES[name].message))


@pytest.mark.parametrize("name", NAMES)
def test_binary_encode(benchmark: BenchmarkFixture, name: str) -> None:
    benchmark(ENCODER.encode, CASES[name].message)


@pytest.mark.parametrize("name", NAMES)
def test_text_encode(benchmark: BenchmarkFixture, name: str) -> None:
    benchmark(CASES[name].message.canonical)


@pytest.mark.parametrize("name", NAMES)
def test_read(benchmark: BenchmarkFixture, name: str) -> None:
    benchmark(cbcl.read, CASES[name].text)


@pytest.mark.parametrize("name", NAMES)
def test_peer_sexpdata(benchmark: BenchmarkFixture, name: str) -> None:
    benchmark(sexpdata.loads, CASES[name].text.decode())


@pytest.mark.parametrize("name", [n for n in NAMES if not n.endswith("/large")])
def test_peer_lark(benchmark: BenchmarkFixture, name: str) -> None:
    case = CASES[name]
    protocol = REGISTRY.get(case.protocol[:-3] + "/v1")
    assert protocol is not None
    descriptor = protocol.descriptor
    parser = lark_parser(descriptor.grammar, descriptor.start_rules)
    benchmark(parser.parse, case.text.decode())
