"""A smoke run of the comparison suite (``cbcl bench``): every measurement once, as briefly
as possible, and the JSON it writes names each of them. Benchmarks are not timed tests:
nothing here asserts a figure."""

from __future__ import annotations

import argparse
import json

import pytest

from cbcl import _bench
from cbcl._cli_bench import register

KEYS = {"machine", "command", "throughput", "sizes", "load", "scaling", "targets", "seconds"}
PEERS = ("cbcl_text_parse_us", "cbcl_binary_decode_us", "cbcl_text_encode_us",
         "cbcl_binary_encode_us", "sexpdata_loads_us", "lark_parse_us", "msgpack_unpackb_us",
         "orjson_loads_us", "text_vs_sexpdata", "text_vs_lark", "binary_vs_text")


@pytest.fixture(scope="module")
def results() -> dict:
    return json.loads(json.dumps(_bench.run(mode="smoke", report=lambda line: None)))


def test_every_measurement_is_named(results: dict) -> None:
    assert set(results) >= KEYS
    assert set(results["targets"]) == set(_bench.TARGETS)
    for figure in results["targets"].values():
        assert {"achieved", "target", "holds"} <= set(figure)
    names = set(results["throughput"])
    assert {f"{p}/{s}" for p in _bench.PROTOCOLS for s in ("small", "medium")} == names
    for row in results["throughput"].values():
        assert set(PEERS) <= set(row)
    request = results["throughput"]["request-v1/small"]
    assert {"json_loads_jsonschema_us", "pydantic_validate_json_us"} <= set(request)
    for row in results["sizes"].values():
        assert {"text", "canonical", "binary", "json", "msgpack", "binary_vs_json"} <= set(row)
    assert {"synthetic-16-rules", "request-v1"} <= set(results["load"])
    for row in results["load"].values():
        assert {"cold_ms", "warm_ms", "hot_ms", "warm_vs_cold"} <= set(row)
    for row in results["scaling"].values():
        assert {"text_mb_s", "binary_mb_s", "peak_memory_bytes"} <= set(row)


def test_markdown_table(results: dict) -> None:
    table = _bench.markdown(results)
    assert "| request-v1/small |" in table and "**Targets**" in table


def test_lark_peer_accepts_what_cbcl_accepts() -> None:
    """The peer grammar is the same language: lark parses every corpus message."""
    directory = _bench.find_descriptors()
    registry = _bench.load_registry(directory)
    for case in _bench.build_corpus(directory, registry, ("small", "medium")):
        descriptor = registry.get(case.protocol[:-3] + "/v1").descriptor
        _bench.lark_parser(descriptor.grammar, descriptor.start_rules).parse(case.text.decode())


def test_command_without_descriptors(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """``cbcl bench`` (as registered by cbcl._cli_bench) says where the corpus must be."""
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "--quick", "--json", str(tmp_path / "out.json"),
                              "--descriptors", str(tmp_path)])
    assert args.handler(args, b"") == 1
    assert "descriptors" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()
