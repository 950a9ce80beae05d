"""The comparison suite behind ``cbcl bench`` (issue 8): CBCL against its peers, in one
process, on the same messages.

Theory of operation
-------------------
Every figure that matters is a *ratio* between two functions timed in the same run, on the
same message, in interleaved rounds (A, B, C, A, B, C …), keeping each function's best
round: a machine shared with other work slows all of them alike, so ratios stay put while
absolute times wander. Absolute times are reported for context only.

The corpus is built from the shipped descriptors (found in a checkout: ``descriptors/``
beside the package, or under the current directory, or ``--descriptors DIR``): per
protocol, its shipped example (small, ~400 B) and generated messages of ~4 KB (medium) and
~100 KB (large) that the protocol's grammar and schema fully accept. Peers get the same
data: ``sexpdata.loads`` the same text; lark a grammar merging the envelope and the
protocol's generated body grammar, with a real regex lexer (:func:`lark_grammar`); msgpack
and orjson the message's plain value tree; ``json.loads`` + jsonschema and pydantic a
natural JSON rendering of request/v1 messages checked by a pydantic model equivalent to
request/v1's body (the JSON Schema is the model's own). Peers that are not installed are
skipped (``pip install 'cbcl[bench]'``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgpack

from . import _codec
from ._api import canonical, parse
from ._codec import Decoder, Encoder
from ._json import message_to_json
from ._limits import Limits
from ._message import Message
from ._registry import DEFAULT_GRAMMAR_CACHE, Registry
from ._subset import read_grammar, to_lark
from ._values import URI, Keyword, Symbol

if TYPE_CHECKING:
    import lark

S, K = Symbol, Keyword

#: Protocols whose examples and descriptors make the corpus (in ``descriptors/``).
PROTOCOLS = ("request-v1", "contract-net-v1", "canon-a-v1", "task-assignment-v1")
#: The shipped example that is each protocol's small message.
SMALL = {"request-v1": "request-v1-inform-result", "contract-net-v1": "contract-net-v1",
         "canon-a-v1": "canon-a-v1-inform", "task-assignment-v1": "task-assignment-v1"}
#: Records per generated message, by size class (~4 KB and ~100 KB of canonical text).
RECORDS = {"medium": 21, "large": 575}
TARGETS = {
    "text_vs_sexpdata": 1.0,  # CBCL text parse throughput / sexpdata.loads, at least
    "text_vs_lark": 5.0,  # CBCL text parse / lark's plain parse, at least
    "binary_vs_text": 2.0,  # CBCL binary decode / CBCL text parse, at least
    "binary_size_vs_json": 0.6,  # binary bytes / compact JSON bytes, at most
    "warm_vs_cold_load": 0.1,  # warm descriptor load time / cold, at most
}


# --------------------------------------------------------------------------- the corpus


def find_descriptors(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The ``descriptors/`` directory of a checkout. Raises ``FileNotFoundError``."""
    here = Path(__file__).resolve().parent.parent
    candidates = [Path(explicit)] if explicit else [Path.cwd() / "descriptors",
                                                    here / "descriptors"]
    for candidate in candidates:
        if all((candidate / f"{name}.cbcl").is_file() for name in PROTOCOLS):
            return candidate
    raise FileNotFoundError(
        "cbcl bench needs the shipped descriptors and examples of a CBCL checkout: run it "
        "from the checkout's top directory or pass --descriptors DIR")


def load_registry(descriptors: Path) -> Registry:
    registry = Registry(disk_cache=False, isolate=False)
    for name in PROTOCOLS:
        registry.load((descriptors / f"{name}.cbcl").read_bytes(), allow_unsigned=True)
    return registry


def _record(rng: random.Random, i: int) -> tuple[Any, ...]:
    """One inventory record: the kind of data a result carries (~200 B of text)."""
    return (
        S("item"), K("id"), f"sku-{rng.randrange(10**6):06d}", K("name"),
        rng.choice(["bolt M6", "washer 8mm", "hinge, steel", "cable tie", "Ölfilter", "gasket"])
        + f" #{i}",
        K("qty"), rng.randrange(0, 5000), K("price"),
        Decimal(f"{rng.randrange(1, 99999) / 100:.2f}"), K("currency"),
        S(rng.choice(["EUR", "USD", "GBP"])), K("status"),
        S(rng.choice(["in-stock", "backorder", "discontinued"])),
        K("warehouse"), URI(f"agent://depot/{rng.choice(['north', 'south', 'east'])}"),
        K("tags"), tuple(S(t) for t in rng.sample(["metal", "small", "bulk", "fragile",
                                                    "hazmat", "promo"], rng.randrange(0, 4))),
        K("updated"), 1764500000000 + rng.randrange(10**8),
    )


def records(count: int, seed: int) -> tuple[Any, ...]:
    rng = random.Random(seed)
    return (S("inventory"), K("records"), tuple(_record(rng, i) for i in range(count)))


def generated(protocol: str, count: int, seed: int = 1) -> Message:
    """A message of ``protocol`` carrying ``count`` records where its grammar takes a value."""
    result = records(count, seed)
    body: tuple[Any, ...]
    intent = "INFORM"
    if protocol == "request-v1":
        body = (S("inform-result"), K("action-id"), "rq-1", K("result"), result)
    elif protocol == "contract-net-v1":
        body = (S("inform-done"), K("task-id"), "t-4711", K("result"), result)
    elif protocol == "canon-a-v1":
        body = (S("inform"), S("results"), K("order_id"), "A-1009", K("limit"), count,
                K("value"), result)
    elif protocol == "task-assignment-v1":
        intent = "PROPOSE"
        body = (S("task"), K("id"), "task-678", K("cmd"),
                (S("compute"), K("algorithm"), S("merge"), K("inputs"), result),
                K("resources"), (K("cpu"), 2, K("mem"), 4096))
    else:  # pragma: no cover
        raise ValueError(protocol)
    return Message(message_id=f"m-{count}", sender=URI("agent://ops/inventory"),
                   receiver=URI("agent://ops/planner"), intent=intent,
                   protocol=S(protocol[:-3] + "/v1"), conversation_id="stock-check-2026-11-30",
                   in_reply_to="rq-1", timestamp=1764502900000, body=body)


@dataclass(frozen=True)
class Case:
    name: str  # "request-v1/small"
    protocol: str
    size: str  # small, medium, large
    text: bytes  # the message as stored (the example) or its canonical text
    message: Message


def build_corpus(descriptors: Path, registry: Registry,
                 sizes: Iterable[str] = ("small", "medium", "large")) -> list[Case]:
    """Per protocol and size class, one message its grammar and schema fully accept."""
    cases = []
    for protocol in PROTOCOLS:
        for size in sizes:
            if size == "small":
                text = (descriptors / "examples" / f"{SMALL[protocol]}.cbcl").read_bytes()
            else:
                text = canonical(generated(protocol, RECORDS[size])).encode()
            message = parse(text, registry=registry)  # fully recognised, or raises
            cases.append(Case(f"{protocol}/{size}", protocol, size, text, message))
    return cases


# --------------------------------------------------------------------------- peers' data


def plain(value: Any) -> Any:
    """The plain value tree: lists as lists, symbols/keywords/URIs/decimals as ``str``."""
    root: list[Any] = []
    stack = [(iter((value,)), root)]
    while stack:
        items, out = stack[-1]
        for item in items:
            if isinstance(item, tuple):
                child: list[Any] = []
                out.append(child)
                stack.append((iter(item), child))
                break
            out.append(item if type(item) is int else
                       canonical(item) if type(item) is Decimal else str.__str__(item))
        else:
            stack.pop()
    return root[0]


def compact_json(message: Message) -> bytes:
    """Compact JSON of the lossless JSON mapping (``cbcl.message_to_json``), UTF-8."""
    return json.dumps(message_to_json(message), separators=(",", ":"),
                      ensure_ascii=False).encode()


def natural_json(message: Message) -> bytes:
    """request/v1 as a JSON API would carry it: the body a record object with ``kind``."""
    body = message.body
    assert type(body) is tuple
    record: dict[str, Any] = {"kind": str.__str__(body[0])}
    for index in range(1, len(body), 2):
        record[str.__str__(body[index]).replace("-", "_")] = plain(body[index + 1])
    document: dict[str, Any] = {
        "message_id": message.message_id, "sender": str(message.sender),
        "receiver": str(message.receiver), "intent": message.intent.value,
        "protocol": str(message.protocol)}
    for name in ("conversation_id", "in_reply_to", "reply_by", "timestamp"):
        if getattr(message, name) is not None:
            document[name] = getattr(message, name)
    document["body"] = record
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()


def pydantic_model() -> Any:
    """A pydantic model equivalent to a request/v1 message (envelope, body and schema)."""
    from typing import Annotated, Literal

    from pydantic import BaseModel, ConfigDict, Field, JsonValue

    Id = Annotated[str, Field(min_length=1, max_length=128)]
    Reason = Annotated[str, Field(min_length=1, max_length=1024)]
    strict = ConfigDict(extra="forbid", strict=True)

    class Action(BaseModel):
        model_config = strict
        kind: Literal["action"]
        name: str
        args: list[JsonValue] | None = None

    class Request(BaseModel):
        model_config = strict
        kind: Literal["request"]
        action: Action
        by: Annotated[int, Field(ge=0)] | None = None

    class Agree(BaseModel):
        model_config = strict
        kind: Literal["agree"]
        action_id: Id

    class Refuse(BaseModel):
        model_config = strict
        kind: Literal["refuse"]
        action_id: Id
        reason: Reason

    class Failure(BaseModel):
        model_config = strict
        kind: Literal["failure"]
        action_id: Id
        reason: Reason

    class Done(BaseModel):
        model_config = strict
        kind: Literal["inform-done"]
        action_id: Id

    class Result(BaseModel):
        model_config = strict
        kind: Literal["inform-result"]
        action_id: Id
        result: JsonValue

    class RequestMessage(BaseModel):
        model_config = strict
        message_id: Annotated[str, Field(min_length=1)]
        sender: Annotated[str, Field(pattern=r"^[a-z][a-z0-9+.\-]*://\S+$")]
        receiver: Annotated[str, Field(pattern=r"^[a-z][a-z0-9+.\-]*://\S+$")]
        intent: Literal["REQUEST", "AGREE", "REFUSE", "FAILURE", "INFORM", "CANCEL",
                        "NOT-UNDERSTOOD"]
        protocol: Literal["request/v1"]
        conversation_id: Annotated[str, Field(min_length=1)] | None = None
        in_reply_to: Annotated[str, Field(min_length=1)] | None = None
        reply_by: int | None = None
        timestamp: int | None = None
        body: Annotated[Request | Agree | Refuse | Failure | Done | Result,
                        Field(discriminator="kind")]

    return RequestMessage


# --------------------------------------------------------------------------- lark plainly

_LARK_TERMINALS = r"""
STRING: /"(?:[^"\\\x00-\x1f\x7f-\x9f]|\\["\\nrt]|\\u[0-9a-fA-F]{4})*"/
DECIMAL: /-?(?:0|[1-9][0-9]*)\.[0-9]+/
INTEGER: /-?(?:0|[1-9][0-9]*)/
URI: /[a-z][a-z0-9+.\-]*:\/\/[^\s()";]+/
KEYWORD: /:[A-Za-z+\-*\/<>=!?_.][A-Za-z0-9+\-*\/<>=!?_.@%&]*/
SYMBOL: /(?![+\-]?\.?[0-9])[A-Za-z+\-*\/<>=!?_.][A-Za-z0-9+\-*\/<>=!?_.@%&]*/
LPAR: "("
RPAR: ")"
COMMENT: /;[^\n]*/
%import common.WS
%ignore WS
%ignore COMMENT
"""

_LARK_ENVELOPE = r"""
start: "(" "CBCL/1.0" e_message_id e_sender e_receiver e_intent e_protocol e_optional ")"
e_optional: e_conversation_id? e_in_reply_to? e_reply_by? e_timestamp? e_body? e_signature?
e_message_id: "(" "message-id" STRING ")"
e_sender: "(" "sender" URI ")"
e_receiver: "(" "receiver" URI ")"
e_intent: "(" "intent" INTENT ")"
INTENT: "PROPOSE" | "ACCEPT" | "REJECT" | "INFORM" | "QUERY" | "REQUEST" | "CFP"
      | "SUBSCRIBE" | "NOTIFY" | "AGREE" | "REFUSE" | "FAILURE" | "CANCEL" | "CONFIRM"
      | "NOT-UNDERSTOOD"
e_protocol: "(" "protocol" SYMBOL ")"
e_conversation_id: "(" "conversation-id" STRING ")"
e_in_reply_to: "(" "in-reply-to" STRING ")"
e_reply_by: "(" "reply-by" INTEGER ")"
e_timestamp: "(" "timestamp" INTEGER ")"
e_body: "(" "body" {start} ")"
e_signature: "(" "signature" STRING STRING ")"
"""


def lark_grammar(grammar_text: str, starts: tuple[str, ...] = ("body",)) -> str:
    """A plain lark grammar for whole messages of a protocol: the envelope, then the body
    grammar CBCL generates for lark (its declared terminals given their literal text or a
    regex for the CBCL atom). With several start rules a body may be any of them (lark
    does not see the intent); a keyword set is its BNF, any order and any number of
    times (lark cannot count)."""
    generated = to_lark(read_grammar(grammar_text, starts=starts))
    start = generated.start
    lines = [line for line in generated.text.splitlines()
             if not line.startswith(("%declare", "//"))]
    if generated.start_terminals:
        start = "cbcl_any_start"
        choices = " | ".join(f"p_{rule}" for rule in generated.start_terminals)
        kept, skipping = [f"{start}: {choices}"], False
        for line in lines:
            if line.startswith(generated.start + ":"):
                skipping = True
            elif skipping and line.startswith("    |"):
                continue
            else:
                skipping = False
            if not skipping:
                kept.append(line)
        lines = kept
    literals = "\n".join(f'{name}: "{text}"' for name, text in generated.literals.items()
                         if name not in ("LPAR", "RPAR"))
    return (_LARK_ENVELOPE.replace("{start}", start) + "\n".join(lines) + "\n"
            + literals + "\n" + _LARK_TERMINALS)


def lark_parser(grammar_text: str, starts: tuple[str, ...] = ("body",)) -> lark.Lark:
    import lark

    return lark.Lark(lark_grammar(grammar_text, starts), parser="lalr", lexer="contextual")


# --------------------------------------------------------------------------- timing


def _calibrate(function: Callable[[], object], seconds: float) -> int:
    """Calls per round so that a round takes about ``seconds``."""
    number = 1
    while True:
        start = time.perf_counter()
        for _ in range(number):
            function()
        elapsed = time.perf_counter() - start
        if elapsed >= seconds or number >= 1 << 20:
            return max(1, int(number * seconds / max(elapsed, 1e-9)))
        number *= 2 if elapsed < seconds / 8 else 1 + math.ceil(seconds / max(elapsed, 1e-9))


def compare(functions: dict[str, Callable[[], object]], *, rounds: int,
            seconds: float) -> dict[str, float]:
    """Seconds per call of each function: the best of ``rounds`` interleaved rounds."""
    numbers = {name: _calibrate(function, seconds) for name, function in functions.items()}
    best = dict.fromkeys(functions, math.inf)
    for _ in range(rounds):
        for name, function in functions.items():
            number = numbers[name]
            start = time.perf_counter()
            for _ in range(number):
                function()
            best[name] = min(best[name], (time.perf_counter() - start) / number)
    return best


# --------------------------------------------------------------------------- measurements


def throughput(cases: list[Case], registry: Registry, descriptors: Path, *, rounds: int,
               seconds: float, report: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """Per case: µs per call of CBCL and every installed peer, and the ratios."""
    import sexpdata

    # Encoding is timed as the peers encode: the value was validated when it was built
    # (msgspec and pydantic encode without checking again); validate=True adds pass 2.
    encoder = Encoder(registry, validate=False)
    decoder = Decoder(registry)
    larks = {protocol: lark_parser(*_grammar_of(registry, protocol)) for protocol in PROTOCOLS}
    peers_json = _json_peers()
    out: dict[str, dict[str, Any]] = {}
    for case in cases:
        text = case.text
        functions = _contenders(case, registry, encoder, decoder, larks[case.protocol],
                                peers_json, sexpdata.loads)
        times = compare(functions, rounds=rounds, seconds=seconds)
        row: dict[str, Any] = {"bytes": len(text)}
        row.update({f"{name}_us": value * 1e6 for name, value in times.items()})
        text_parse = times["cbcl_text_parse"]
        row["text_vs_sexpdata"] = times["sexpdata_loads"] / text_parse
        row["text_vs_lark"] = times["lark_parse"] / text_parse
        row["binary_vs_text"] = text_parse / times["cbcl_binary_decode"]
        for peer in ("json_loads_jsonschema", "pydantic_validate_json", "msgpack_unpackb",
                     "orjson_loads"):
            if peer in times:
                row[f"text_vs_{peer}"] = times[peer] / text_parse
        out[case.name] = row
        report(f"  {case.name}: text {text_parse * 1e6:.1f} µs, "
               f"×sexpdata {row['text_vs_sexpdata']:.2f}, ×lark {row['text_vs_lark']:.2f}, "
               f"binary ×{row['binary_vs_text']:.2f}")
    return out


def _contenders(case: Case, registry: Registry, encoder: Encoder, decoder: Decoder, lark: Any,
                peers_json: dict[str, Any], sexpdata_loads: Callable[[str], Any],
                ) -> dict[str, Callable[[], object]]:
    """The functions timed on one message, each checked once first."""
    text = case.text
    string = text.decode()
    frame = encoder.encode(case.message)
    pure = Decoder(registry)  # the decoder where cbcl._speedups is not built (msgpack's C is)
    pure._fast_unpack = None
    pure._build_body = _codec._fast_body_loop
    assert decoder.decode(frame) == case.message == pure.decode(frame)
    packed = msgpack.packb(plain(case.message.to_value()))
    lossless = compact_json(case.message)
    lark.parse(string)  # accepted, or raises
    functions: dict[str, Callable[[], object]] = {
        "cbcl_text_parse": lambda: parse(text, registry=registry),
        "cbcl_binary_decode": lambda: decoder.decode(frame),
        "cbcl_binary_decode_pure": lambda: pure.decode(frame),
        "cbcl_text_encode": case.message.canonical,
        "cbcl_binary_encode": lambda: encoder.encode(case.message),
        "sexpdata_loads": lambda: sexpdata_loads(string),
        "lark_parse": lambda: lark.parse(string),
        "msgpack_unpackb": lambda: msgpack.unpackb(packed),
    }
    if "orjson" in peers_json:
        orjson_loads = peers_json["orjson"]
        functions["orjson_loads"] = lambda: orjson_loads(lossless)
    natural = natural_json(case.message) if case.protocol == "request-v1" else None
    if natural is not None and "jsonschema" in peers_json:
        validate = peers_json["jsonschema"]
        validate(json.loads(natural))
        functions["json_loads_jsonschema"] = lambda: validate(json.loads(natural))
    if natural is not None and "pydantic" in peers_json:
        model = peers_json["pydantic"]
        model.model_validate_json(natural)
        functions["pydantic_validate_json"] = lambda: model.model_validate_json(natural)
    return functions


def _grammar_of(registry: Registry, protocol: str) -> tuple[str, tuple[str, ...]]:
    found = registry.get(protocol[:-3] + "/v1")
    assert found is not None
    return found.descriptor.grammar, found.descriptor.start_rules


def _json_peers() -> dict[str, Any]:
    peers: dict[str, Any] = {}
    try:
        import orjson

        peers["orjson"] = orjson.loads
    except ImportError:
        pass
    try:
        model = pydantic_model()
    except ImportError:
        return peers
    peers["pydantic"] = model
    try:
        import jsonschema
    except ImportError:
        return peers
    schema = model.model_json_schema()
    validator = jsonschema.Draft202012Validator(schema)
    peers["jsonschema"] = validator.validate
    return peers


def sizes(cases: list[Case], registry: Registry) -> dict[str, dict[str, Any]]:
    """Per case: bytes of text, canonical text, binary frame, compact JSON and msgpack."""
    encoder = Encoder(registry, validate=False)
    out = {}
    for case in cases:
        row: dict[str, Any] = {
            "text": len(case.text),
            "canonical": len(case.message.canonical().encode()),
            "binary": len(encoder.encode(case.message)),
            "json": len(compact_json(case.message)),
            "msgpack": len(msgpack.packb(plain(case.message.to_value()))),
        }
        row["binary_vs_json"] = row["binary"] / row["json"]
        row["binary_vs_msgpack"] = row["binary"] / row["msgpack"]
        out[case.name] = row
    return out


def synthetic_descriptor(rules: int) -> bytes:
    """A descriptor whose grammar has ``rules`` rules: a body choosing among record kinds,
    each with its own keyword attributes (an LALR(1) grammar of realistic shape)."""
    from ._canonical import quote

    kinds = rules - 1
    lines = ["body: " + " | ".join(f"r{i}" for i in range(kinds))]
    for i in range(kinds):
        lines.append(f'r{i}: "(" "kind{i}" ":id" STRING [":n{i}" INTEGER] '
                     f'(":tag" SYMBOL)* [":data" value] ")"')
    grammar = "\n".join(lines) + "\n"
    return (f"(protocol-descriptor (id synthetic-{rules}/v1) (version 1) (intents INFORM) "
            f"(grammar {quote(grammar)}))").encode()


def _median_time(action: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def load_times(payload: bytes, repeat: int) -> dict[str, float]:
    """Descriptor load: cold (read, check, compile in the guarded worker), warm (compiled
    grammar from the disk cache, nothing in memory), hot (in-memory LRU); milliseconds."""

    def forget() -> None:
        DEFAULT_GRAMMAR_CACHE.clear()

    def cold() -> None:
        forget()
        with tempfile.TemporaryDirectory() as directory:
            Registry(cache_dir=directory).load(payload, allow_unsigned=True)

    with tempfile.TemporaryDirectory() as directory:
        Registry(cache_dir=directory).load(payload, allow_unsigned=True)

        def warm() -> None:
            forget()
            Registry(cache_dir=directory).load(payload, allow_unsigned=True)

        def hot() -> None:
            Registry(cache_dir=directory).load(payload, allow_unsigned=True)

        cold_s = _median_time(cold, repeat)
        warm_s = _median_time(warm, repeat * 5)
        hot_s = _median_time(hot, repeat * 20)
    return {"cold_ms": cold_s * 1e3, "warm_ms": warm_s * 1e3, "hot_ms": hot_s * 1e3,
            "warm_vs_cold": warm_s / cold_s}


def loading(descriptors: Path, repeat: int, rule_counts: Iterable[int],
            ) -> dict[str, dict[str, float]]:
    cases = {f"synthetic-{n}-rules": synthetic_descriptor(n) for n in rule_counts}
    cases["request-v1"] = (descriptors / "request-v1.cbcl").read_bytes()
    return {name: load_times(payload, repeat) for name, payload in cases.items()}


def scaling(registry: Registry, targets: Iterable[int], *, rounds: int,
            seconds: float) -> dict[str, dict[str, float]]:
    """Throughput per byte of text parse and binary decode from 1 KB to 1 MB request/v1
    messages (limits raised to fit), and the peak memory one text parse allocates."""
    limits = Limits(max_message_bytes=4 << 20, max_list_items=1 << 16, max_nodes=1 << 22)
    # Rebuild the registry's protocols under a decoder with raised limits.
    decoder = Decoder(registry, limits=limits)
    encoder = Encoder(registry, limits=limits)
    per_record = len(canonical(generated("request-v1", 100)).encode()) / 100
    out = {}
    for target in targets:
        count = max(1, round((target - 300) / per_record))
        message = generated("request-v1", count)
        text = canonical(message).encode()
        frame = encoder.encode(message)
        def parse_text(t: bytes = text) -> object:
            return parse(t, registry=registry, limits=limits)

        def decode_frame(f: bytes = frame) -> object:
            return decoder.decode(f)

        times = compare({"text": parse_text, "binary": decode_frame},
                        rounds=rounds, seconds=seconds)
        tracemalloc.start()
        parse(text, registry=registry, limits=limits)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        label = f"{target // 1024} KB" if target < 1 << 20 else f"{target >> 20} MB"
        out[label] = {"bytes": len(text), "text_mb_s": len(text) / times["text"] / 1e6,
                      "binary_mb_s": len(text) / times["binary"] / 1e6,
                      "text_us": times["text"] * 1e6, "binary_us": times["binary"] * 1e6,
                      "peak_memory_bytes": peak, "peak_memory_per_byte": peak / len(text)}
    return out


# --------------------------------------------------------------------------- the suite


def _worst(rows: dict[str, dict[str, Any]], key: str, size_classes: tuple[str, ...],
           lowest: bool = True) -> float:
    values: list[float] = [row[key] for name, row in rows.items()
                           if name.rsplit("/", 1)[1] in size_classes]
    return min(values) if lowest else max(values)


#: How much each mode measures: size classes, interleaved rounds, seconds per round,
#: descriptor load repeats and grammar sizes, scaling sizes, scaling rounds and seconds.
MODES: dict[str, dict[str, Any]] = {
    "full": {"sizes": ("small", "medium", "large"), "rounds": 7, "seconds": 0.1,
             "load_repeat": 3, "rules": (16, 64, 256),
             "scaling": (1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20),
             "scaling_rounds": 3, "scaling_seconds": 0.2},
    "quick": {"sizes": ("small", "medium"), "rounds": 3, "seconds": 0.04, "load_repeat": 1,
              "rules": (16, 64, 256), "scaling": (1 << 10, 16 << 10, 128 << 10, 1 << 20),
              "scaling_rounds": 2, "scaling_seconds": 0.05},
    # For the test suite: every measurement once, as briefly as possible (not figures).
    "smoke": {"sizes": ("small", "medium"), "rounds": 1, "seconds": 0.001, "load_repeat": 1,
              "rules": (16,), "scaling": (1 << 10, 16 << 10), "scaling_rounds": 1,
              "scaling_seconds": 0.001},
}


def run(*, quick: bool = False, descriptors: str | None = None, mode: str | None = None,
        report: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the suite; returns every figure, keyed by name (see :func:`markdown`)."""
    started = time.perf_counter()
    mode = mode or ("quick" if quick else "full")
    settings = MODES[mode]
    directory = find_descriptors(descriptors)
    registry = load_registry(directory)
    cases = build_corpus(directory, registry, settings["sizes"])
    report(f"throughput ({len(cases)} messages, {settings['rounds']} interleaved rounds)")
    results: dict[str, Any] = {
        "machine": machine(),
        "command": "cbcl bench" + ("" if mode == "full" else f" --{mode}"),
        "throughput": throughput(cases, registry, directory, rounds=settings["rounds"],
                                 seconds=settings["seconds"], report=report),
    }
    results["sizes"] = sizes(cases, registry)
    report("descriptor loading")
    results["load"] = loading(directory, settings["load_repeat"], settings["rules"])
    report("scaling")
    results["scaling"] = scaling(registry, settings["scaling"],
                                 rounds=settings["scaling_rounds"],
                                 seconds=settings["scaling_seconds"])
    small_medium = ("small", "medium")
    rows = results["throughput"]
    achieved = {
        "text_vs_sexpdata": _worst(rows, "text_vs_sexpdata", small_medium),
        "text_vs_lark": _worst(rows, "text_vs_lark", small_medium),
        "binary_vs_text": _worst(rows, "binary_vs_text", small_medium),
        "binary_size_vs_json": max(row["binary_vs_json"] for row in results["sizes"].values()),
        "warm_vs_cold_load": max(row["warm_vs_cold"] for row in results["load"].values()),
    }
    results["targets"] = {
        name: {"achieved": value, "target": TARGETS[name],
               "holds": value <= TARGETS[name] if name in ("binary_size_vs_json",
                                                           "warm_vs_cold_load")
               else value >= TARGETS[name]}
        for name, value in achieved.items()}
    results["seconds"] = time.perf_counter() - started
    return results


def machine() -> dict[str, Any]:
    import lark

    return {"python": platform.python_version(),
            "implementation": platform.python_implementation(),
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "lark": lark.__version__, "msgpack": msgpack.version,
            "speedups": _codec._build_body is not _codec._fast_body_loop}


# --------------------------------------------------------------------------- output


def markdown(results: dict[str, Any]) -> str:
    """The figures as markdown tables."""
    out = []
    m = results["machine"]
    accelerator = "built" if m.get("speedups") else "NOT built (pure Python)"
    out.append(f"`{results['command']}` on Python {m['python']}, {m['platform']}, "
               f"{m['cpus']} CPUs ({results['seconds']:.0f} s); the binary decoder's C "
               f"accelerator {accelerator}.\n")
    out.append("**Targets** (worst case over the small and medium messages; ratios measured "
               "in the same run)\n")
    out.append("| target | achieved | wanted | holds |")
    out.append("|---|---|---|---|")
    wording = {
        "text_vs_sexpdata": ("CBCL text parse (both passes) vs sexpdata.loads", "≥"),
        "text_vs_lark": ("CBCL text parse vs lark's plain LALR parse", "≥"),
        "binary_vs_text": ("CBCL binary decode vs CBCL text parse", "≥"),
        "binary_size_vs_json": ("binary size vs compact JSON (all messages)", "≤"),
        "warm_vs_cold_load": ("warm descriptor load vs cold", "≤"),
    }
    for name, figure in results["targets"].items():
        label, sign = wording[name]
        out.append(f"| {label} | {figure['achieved']:.2f}× | {sign} {figure['target']:g}× | "
                   f"{'yes' if figure['holds'] else 'NO'} |")
    out.append("\n**Throughput**: µs per message (best of interleaved rounds); ratios are "
               "how many times faster CBCL text parse is than the peer\n")
    peers = [("cbcl_text_parse", "CBCL text"), ("cbcl_binary_decode", "CBCL binary"),
             ("cbcl_binary_decode_pure", "binary w/o speedups"), ("cbcl_text_encode", "enc text"),
             ("cbcl_binary_encode", "enc binary"),
             ("sexpdata_loads", "sexpdata"), ("lark_parse", "lark"),
             ("json_loads_jsonschema", "json+jsonschema"), ("pydantic_validate_json", "pydantic"),
             ("msgpack_unpackb", "msgpack"), ("orjson_loads", "orjson")]
    out.append("| message | bytes | " + " | ".join(label for _, label in peers)
               + " | ×sexpdata | ×lark | binary ×text |")
    out.append("|---|---:|" + "---:|" * (len(peers) + 3))
    for name, row in results["throughput"].items():
        cells = [f"{row[key + '_us']:.1f}" if key + "_us" in row else "–" for key, _ in peers]
        out.append(f"| {name} | {row['bytes']} | " + " | ".join(cells)
                   + f" | {row['text_vs_sexpdata']:.2f} | {row['text_vs_lark']:.2f} | "
                   f"{row['binary_vs_text']:.2f} |")
    out.append("\n**Sizes** (bytes)\n")
    out.append("| message | text | canonical | binary | compact JSON | msgpack | binary/JSON | "
               "binary/msgpack |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, row in results["sizes"].items():
        out.append(f"| {name} | {row['text']} | {row['canonical']} | {row['binary']} | "
                   f"{row['json']} | {row['msgpack']} | {row['binary_vs_json']:.3f} | "
                   f"{row['binary_vs_msgpack']:.3f} |")
    out.append("\n**Descriptor loading** (ms; cold = read, check, compile in the guarded "
               "worker; warm = disk cache; hot = memory)\n")
    out.append("| descriptor | cold | warm | hot | warm/cold |")
    out.append("|---|---:|---:|---:|---:|")
    for name, row in results["load"].items():
        out.append(f"| {name} | {row['cold_ms']:.0f} | {row['warm_ms']:.2f} | "
                   f"{row['hot_ms']:.3f} | 1/{1 / row['warm_vs_cold']:.0f} |")
    out.append("\n**Scaling** (request/v1, limits raised; MB/s of text, peak memory of one "
               "text parse per byte of text)\n")
    out.append("| message | bytes | text MB/s | binary MB/s | peak memory | per byte |")
    out.append("|---|---:|---:|---:|---:|---:|")
    for name, row in results["scaling"].items():
        out.append(f"| {name} | {row['bytes']} | {row['text_mb_s']:.2f} | "
                   f"{row['binary_mb_s']:.2f} | {row['peak_memory_bytes'] / 1024:.0f} KiB | "
                   f"{row['peak_memory_per_byte']:.1f} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cbcl bench", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return execute(parser.parse_args(argv))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="fewer rounds and no large messages (under a minute)")
    parser.add_argument("--json", metavar="FILE", help="also write every figure as JSON")
    parser.add_argument("--descriptors", metavar="DIR",
                        help="the descriptors/ directory of a CBCL checkout (default: found "
                             "under the current directory or beside the package)")


def execute(args: argparse.Namespace) -> int:
    try:
        results = run(quick=args.quick, descriptors=args.descriptors,
                      report=lambda line: print(line, file=sys.stderr))
    except FileNotFoundError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    except ImportError as exc:
        print(f"bench: {exc.name or exc} is not installed: pip install 'cbcl[bench]'",
              file=sys.stderr)
        return 1
    print(markdown(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0
