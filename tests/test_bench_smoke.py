"""A smoke run of the comparison suite (``cbcl bench``): every measurement once, as briefly
as possible, and the JSON it writes names each of them; and the peers are honest — every
peer accepts (or decodes back) every corpus message, and the typed JSON peers refuse what
CBCL's grammar and schema refuse. Benchmarks are not timed tests: nothing here asserts a
figure."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import cbcl_bench as _bench
import jsonschema
import msgspec
import pytest

import cbcl
from cbcl.cli import build_parser

KEYS = {"machine", "command", "throughput", "sizes", "load", "scaling", "targets", "seconds"}
PEERS = ("cbcl_text_parse_us", "cbcl_binary_decode_us", "cbcl_text_encode_us",
         "cbcl_binary_encode_us", "cbcl_text_parse_subset_us", "sexpdata_loads_us",
         "lark_parse_us", "msgpack_unpackb_us", "orjson_loads_us", "msgspec_json_decode_us",
         "msgspec_msgpack_decode_us", "msgspec_json_encode_us", "msgspec_msgpack_encode_us",
         "pydantic_validate_json_us", "pydantic_dump_json_us", "json_loads_jsonschema_us",
         *_bench.RATIOS)
SMOKE = _bench.MODES["smoke"]


@pytest.fixture(scope="module")
def results() -> dict[str, Any]:
    found: dict[str, Any] = json.loads(json.dumps(_bench.run(mode="smoke",
                                                             report=lambda line: None)))
    return found


@pytest.fixture(scope="module")
def corpus() -> list[_bench.Case]:
    """Enough small messages that every intent of every protocol comes up."""
    directory = _bench.find_descriptors()
    registry = _bench.load_registry(directory)
    return _bench.build_corpus(directory, registry, ("small", "medium"),
                               {"small": 80, "medium": 4})


def test_every_measurement_is_named(results: dict[str, Any]) -> None:
    assert set(results) >= KEYS
    assert set(results["targets"]) == set(_bench.TARGETS)
    for figure in results["targets"].values():
        assert {"achieved", "target", "holds"} <= set(figure)
        assert figure["achieved"] is not None  # every peer of the test extra is installed
    names = set(results["throughput"])
    assert {f"{p}/{s}" for p in _bench.PROTOCOLS for s in ("small", "medium")} == names
    for name, row in results["throughput"].items():
        assert set(PEERS) <= set(row), name
        assert row["missing"] == []
        assert row["messages"] == SMOKE["messages"][name.rsplit("/", 1)[1]]
    for row in results["sizes"].values():
        assert {"text", "canonical", "binary", "json", "msgpack", "natural_json",
                "natural_msgpack", "binary_vs_json", "binary_vs_msgpack",
                "binary_vs_natural_json", "binary_vs_natural_msgpack"} <= set(row)
    assert {"synthetic-16-rules", "request-v1"} <= set(results["load"])
    for row in results["load"].values():
        assert {"cold_ms", "warm_ms", "hot_ms", "warm_vs_cold"} <= set(row)
    for row in results["scaling"].values():
        assert {"text_mb_s", "binary_mb_s", "peak_memory_bytes"} <= set(row)


def test_markdown_table(results: dict[str, Any]) -> None:
    table = _bench.markdown(results)
    assert "| request-v1/small |" in table and "**Targets**" in table
    assert "msgspec msgpack" in table and "binary/natural JSON" in table


def test_missing_peers_are_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without msgspec and pydantic the run goes on and says what it could not measure."""
    monkeypatch.setattr(_bench, "typed_peers",
                        lambda protocol, decimals=float: _bench.TypedPeers())
    monkeypatch.setitem(_bench.MODES, "smoke", {**SMOKE, "messages": {"small": 2,
                                                                      "medium": 1}})
    results = _bench.run(mode="smoke", report=lambda line: None)
    row = results["throughput"]["request-v1/small"]
    assert {"msgspec_json_decode", "pydantic_validate_json"} <= set(row["missing"])
    assert "text_vs_pydantic" not in row
    assert results["targets"]["text_vs_pydantic"] == {"achieved": None, "target": 1.0,
                                                      "holds": None}
    table = _bench.markdown(results)
    assert "Not installed, so not measured:" in table and "| missing |" in table


def test_sets_are_of_different_messages_of_their_size(corpus: list[_bench.Case]) -> None:
    for case in corpus:
        assert len(set(case.texts)) == len(case.texts) == len(case.messages)
        mean = sum(map(len, case.texts)) / len(case.texts)
        assert (250 < mean < 500) if case.size == "small" else (3000 < mean < 5000), case.name
        intents = {message.intent.value for message in case.messages}
        if case.size == "small":
            assert intents == set(_bench.SPECS[case.protocol]), case.name


def test_lark_peer_accepts_what_cbcl_accepts(corpus: list[_bench.Case]) -> None:
    """The peer grammar is the same language: lark parses every corpus message."""
    registry = _bench.load_registry(_bench.find_descriptors())
    for case in corpus:
        protocol = registry.get(case.protocol[:-3] + "/v1")
        assert protocol is not None, case.protocol
        descriptor = protocol.descriptor
        parser = _bench.lark_parser(descriptor.grammar, descriptor.start_rules)
        for text in case.texts:
            parser.parse(text.decode())


def _validators(protocol: str) -> dict[str, Callable[[bytes], object]]:
    peers = _bench.typed_peers(protocol)
    json_decoder = msgspec.json.Decoder(peers.msgspec_type)
    msgpack_decoder = msgspec.msgpack.Decoder(peers.msgspec_type)
    check, validate = peers.msgspec_check, peers.jsonschema
    assert check is not None and validate is not None and peers.pydantic is not None

    def msgspec_json(document: bytes) -> object:
        value = json_decoder.decode(document)
        check(value)
        return value

    def msgspec_msgpack(document: bytes) -> object:
        value = msgpack_decoder.decode(msgspec.msgpack.encode(json.loads(document)))
        check(value)
        return value

    return {"msgspec json": msgspec_json, "msgspec msgpack": msgspec_msgpack,
            "pydantic": peers.pydantic.model_validate_json,
            "jsonschema": lambda document: validate(json.loads(document))}


def _broken(protocol: str, document: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Variants of a natural-JSON message that CBCL's grammar or schema would refuse."""

    def variant(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        broken = copy.deepcopy(document)
        change(broken)
        return broken

    yield "unknown kind", variant(lambda d: d["body"].update(kind="no-such-kind"))
    yield "empty message id", variant(lambda d: d.update(message_id=""))
    yield "sender not a URI", variant(lambda d: d.update(sender="nobody"))
    yield "unknown field", variant(lambda d: d["body"].update(no_such_field=1))
    yield "ungoverned intent", variant(lambda d: d.update(intent="SUBSCRIBE"))
    yield "other protocol", variant(lambda d: d.update(protocol="other/v1"))
    yield "no body", variant(lambda d: d.pop("body"))
    body = document["body"]
    record = next(rec for rec in _bench.SPECS[protocol][document["intent"]]
                  if rec.kind == body["kind"])
    yield from _broken_fields(variant, ("body",), body, record.fields)


def _broken_fields(variant: Callable[[Callable[[dict[str, Any]], None]], dict[str, Any]],
                   path: tuple[str, ...], present: dict[str, Any],
                   fields: tuple[tuple[str, tuple[Any, ...], bool], ...],
                   ) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each field of a record (at ``path``) missing where required, and given values its
    type, length, range or set refuses; nested records and key sets likewise."""

    def at(document: dict[str, Any]) -> dict[str, Any]:
        for step in path:
            document = document[step]
        return document

    # (each change binds its field and value now: the loop goes on before it runs)
    def without(field: str) -> Callable[[dict[str, Any]], None]:
        return lambda d: at(d).pop(field)

    def setting(field: str, value: Any) -> Callable[[dict[str, Any]], None]:
        return lambda d: at(d).update({field: value})

    def with_unknown_field(field: str) -> Callable[[dict[str, Any]], None]:
        return lambda d: at(d)[field].update(no_such_field=1)

    name = ".".join((*path[1:], ""))
    for field, spec, required in fields:
        if required:
            yield f"no {name}{field}", variant(without(field))
        if field not in present:
            continue
        bad: list[Any] = [[]] if spec[0] != "any" else []
        if spec[0] == "str" and spec[2] is not None:
            bad.append("x" * (spec[2] + 1))
        if spec[0] == "int":
            bad += [spec[1] - 1] + ([spec[2] + 1] if spec[2] is not None else []) + ["1"]
        if spec[0] == "number":
            bad += [-1, "1"]
        if spec[0] in ("one-of", "reason", "symbol"):
            bad.append("not one of them" if spec[0] != "symbol" else "9lives")
        for value in bad:
            yield f"{name}{field}={value!r:.20}", variant(setting(field, value))
        nested = (spec[1] if spec[0] == "keys" else spec[1].fields
                  if spec[0] == "record" else None)
        if nested and isinstance(present[field], dict):
            yield from _broken_fields(variant, (*path, field), present[field], nested)
            yield f"{name}{field}: unknown field", variant(with_unknown_field(field))


def test_typed_peers_accept_every_message(corpus: list[_bench.Case]) -> None:
    for case in corpus:
        validators = _validators(case.protocol)
        for message in case.messages:
            document = _bench.natural_json(message)
            for validate in validators.values():
                validate(document)  # accepted, or raises
            assert isinstance(message.body, tuple)
            assert json.loads(document)["body"]["kind"] == str(message.body[0])


def test_typed_peers_refuse_what_cbcl_refuses(corpus: list[_bench.Case]) -> None:
    for case in corpus:
        if case.size != "small":
            continue
        validators = _validators(case.protocol)
        seen: set[tuple[str, str]] = set()
        for message in case.messages:
            document = json.loads(_bench.natural_json(message))
            for what, broken in _broken(case.protocol, document):
                key = (document["body"]["kind"], what)
                if key in seen:
                    continue
                seen.add(key)
                payload = json.dumps(broken).encode()
                for name, validate in validators.items():
                    if _accepts(validate, payload):
                        pytest.fail(f"{case.protocol} {what}: {name} accepted {payload!r}")
        assert len(seen) >= 20, seen  # every kind, with its fields' constraints


def test_task_assignment_command_kind_is_checked() -> None:
    """msgspec keeps a record with members of any name as an object: the check sees its
    kind."""
    validators = _validators("task-assignment-v1")
    document: dict[str, Any] = {
        "message_id": "m", "sender": "agent://a/b", "receiver": "agent://a/c",
        "intent": "PROPOSE", "protocol": "task-assignment/v1",
        "body": {"kind": "task", "id": "t-1", "cmd": {"kind": "compute", "x": 1}}}
    for validate in validators.values():
        validate(json.dumps(document).encode())
    document["body"]["cmd"]["kind"] = "sleep"
    for name, validate in validators.items():
        assert not _accepts(validate, json.dumps(document).encode()), name


def _accepts(validate: Callable[[bytes], object], payload: bytes) -> bool:
    try:
        validate(payload)
    except (msgspec.ValidationError, ValueError, jsonschema.ValidationError):
        return False  # (pydantic's ValidationError is a ValueError)
    return True


def test_command_without_descriptors(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     ) -> None:
    """``cbcl bench`` (as the command line registers it) says where the corpus must be."""
    args = build_parser().parse_args(["bench", "--quick", "--json", str(tmp_path / "out.json"),
                                      "--descriptors", str(tmp_path)])
    assert args.handler(args, b"") == 1
    assert "descriptors" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()


def test_mixed_sets_are_measured_warm_and_first_pass(results: dict[str, Any]) -> None:
    rows = results["mixed"]
    assert set(rows) == {f"table-v1/{size}" for size in _bench.MIXED_ROWS}
    decoders = set(_bench._MIXED_DECODERS)
    for name, row in rows.items():
        for decoder in decoders:
            assert {f"{decoder}_us", f"first_{decoder}_us", f"first_vs_warm_{decoder}"} <= \
                set(row), (name, decoder)
            assert row["peak_memory_per_byte"][decoder] > 0
        for ratio in _bench.MIXED_RATIOS:
            assert {ratio, f"{ratio}_float"} <= set(row), (name, ratio)
        for ratio in ("text_vs_pydantic", "binary_vs_msgspec_msgpack"):
            assert {f"first_{ratio}", f"first_{ratio}_float"} <= set(row), (name, ratio)
    table = _bench.markdown(results)
    assert "**Mixed content**" in table and "| table-v1/mixed-64k (first pass) |" in table


def _names(value: Any) -> Iterator[str]:
    """Every symbol, keyword and URI in a value."""
    if isinstance(value, tuple):
        for item in value:
            yield from _names(item)
    elif type(value) in (cbcl.Symbol, cbcl.Keyword, cbcl.URI):
        yield str(value)


def test_mixed_sets_have_a_realistic_vocabulary() -> None:
    """Most names appear once in a set (issue 35), and the sets of two seeds share few."""
    first = _bench.mixed_messages("mixed-4k", 50, "a")
    names = [name for message in first for name in _names(message.body)]
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    once = sum(1 for count in counts.values() if count == 1)
    assert len(counts) > 1000 and once > 0.6 * len(counts)
    second = {name for message in _bench.mixed_messages("mixed-4k", 50, "b")
              for name in _names(message.body)}
    fresh = {name for name, count in counts.items() if count == 1 and ":" not in name[:1]}
    assert len(fresh & second) < 0.01 * len(fresh)


def test_mixed_peers_hold_decimals_as_they_say_and_refuse_what_cbcl_refuses() -> None:
    registry = _bench.load_registry(_bench.find_descriptors())
    message = _bench.mixed_messages("mixed-4k", 1, "peers")[0]
    document = json.loads(_bench.natural_json(message))
    cbcl.validate(message, registry=registry)
    for decimals in (Decimal, float):
        peers = _bench.typed_peers(_bench.MIXED_PROTOCOL, decimals)
        value = msgspec.json.decode(json.dumps(document), type=peers.msgspec_type)
        assert type(value.body.rows[0].price) is decimals
        assert peers.pydantic is not None
        model = peers.pydantic.model_validate_json(json.dumps(document))
        assert type(model.root.body.rows[0].rate) is decimals
        broken = copy.deepcopy(document)
        broken["body"]["rows"][0]["owner"] = "not a uri"
        with pytest.raises((msgspec.ValidationError, ValueError)):
            peers.pydantic.model_validate_json(json.dumps(broken))
        with pytest.raises(msgspec.ValidationError):
            msgspec.json.decode(json.dumps(broken), type=peers.msgspec_type)
