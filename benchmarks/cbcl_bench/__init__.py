"""The comparison suite behind ``cbcl bench`` (issues 8 and 19): CBCL against its peers,
in one process, on the same messages.

Theory of operation
-------------------
Every figure that matters is a *ratio* between two functions timed in the same run, on the
same messages, in interleaved rounds (A, B, C, A, B, C …), keeping each function's best
round: a machine shared with other work slows all of them alike, so ratios stay put while
absolute times wander. Absolute times are reported for context only. The cyclic garbage
collector is off while a round runs (as in ``timeit``) and collects between rounds.

The corpus is built from the shipped descriptors (found in a checkout: ``descriptors/``
beside the package, or under the current directory, or ``--descriptors DIR``): per
protocol and size class, a *set* of different messages that the protocol's grammar and
schema fully accept — 1,000 of ~370 B (small: every intent the protocol governs, keyword
sets in random order, the shipped example first) and 1,000 of ~4 KB (medium: the intents
whose bodies carry a value, holding inventory records), and, in a full run, 16 of ~100 KB
(large). A round of a contender is one pass over the whole set; a figure is µs per message.

Peers get the same messages. Typed JSON and msgpack peers read the *natural JSON* of each
message (:func:`natural_json`: the body an object with a ``kind`` and its fields by name, as
a JSON API would carry it) and validate what CBCL's grammar and schema validate: msgspec
``Struct`` types and pydantic models built from :data:`SPECS` (types, required fields,
one-of sets, ranges, lengths, the body kinds each intent admits), for every protocol;
msgspec also encodes the decoded objects (JSON and msgpack), as CBCL encodes its messages.
The slow reference peers — ``sexpdata.loads`` of the same text; lark with a grammar merging
the envelope and the protocol's generated body grammar and a real regex lexer
(:func:`lark_grammar`); ``json.loads`` + jsonschema (the pydantic model's own JSON Schema) —
read the first :data:`MODES` ``subset`` messages of each set, timed against CBCL text parse
on the same messages. msgpack and orjson read each message's plain value tree (untyped).
Peers that are not installed are reported as missing (``pip install 'cbcl[bench]'``).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
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
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

import msgpack

from cbcl.binary import _codec
from cbcl.binary._codec import Decoder, Encoder
from cbcl.cli import main as cli_main
from cbcl.core._limits import Limits
from cbcl.core._values import URI, Keyword, Symbol
from cbcl.grammar._subset import read_grammar, to_lark
from cbcl.protocol._api import canonical, parse
from cbcl.protocol._json import message_to_json
from cbcl.protocol._message import Message
from cbcl.protocol._registry import DEFAULT_GRAMMAR_CACHE, Registry

if TYPE_CHECKING:
    import lark
    from pydantic import RootModel

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
    # Issue 19, against typed peers on the natural JSON (or its msgpack), at least:
    "text_vs_pydantic": 1.0,  # text parse (both passes + schema) / model_validate_json
    "binary_vs_msgspec_msgpack": 1.0,  # binary decode (reused Decoder) / typed msgpack decode
    "binary_encode_vs_msgspec_msgpack": 1.0,  # binary encode / msgspec msgpack encode
    "text_encode_vs_msgspec_json": 1.0,  # canonical text / msgspec JSON encode
    "binary_size_vs_json": 0.6,  # binary bytes / lossless-mapping compact JSON bytes, at most
    "warm_vs_cold_load": 0.1,  # warm descriptor load time / cold, at most
}
#: Targets met when the achieved figure is at most the target (the others: at least).
AT_MOST = ("binary_size_vs_json", "warm_vs_cold_load")
#: Messages per set, by size class (MODES may ask for fewer).
MESSAGES = {"small": 1000, "medium": 1000, "large": 16}


# --------------------------------------------------------------------------- the corpus


def find_descriptors(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The ``descriptors/`` directory of a checkout. Raises ``FileNotFoundError``."""
    # (this file is benchmarks/cbcl_bench/__init__.py in a checkout: its descriptors/ are
    # two folders up)
    checkout = Path(__file__).resolve().parent.parent.parent
    candidates = [Path(explicit)] if explicit else [Path.cwd() / "descriptors",
                                                    checkout / "descriptors"]
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
    registry.load(mixed_descriptor(), allow_unsigned=True)  # the mixed sets' protocol
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
    """One set of different messages of one protocol and size class."""

    name: str  # "request-v1/small"
    protocol: str
    size: str  # small, medium, large
    texts: tuple[bytes, ...]  # each message's canonical text
    messages: tuple[Message, ...]  # the messages CBCL read from them

    @property
    def text(self) -> bytes:
        """The first message's text (the shipped example, for a small set)."""
        return self.texts[0]

    @property
    def message(self) -> Message:
        return self.messages[0]


_ORGS = ("ops", "market", "tools", "sys", "assistant", "depot", "billing")
_ROLES = ("planner", "backup", "scheduler", "worker", "manager", "contractor", "orders",
          "ledger", "router")
_WORDS = ("the", "nightly", "snapshot", "of", "volume", "replica", "index", "is", "not",
          "ready", "quota", "exceeded", "for", "batch", "route", "north", "invoice", "late",
          "Größe", "retry", "after", "window", "closed")
_ACTIONS = ("backup-volume", "render-video", "rebuild-index", "ship-order", "audit",
            "compact-log", "resize", "migrate")


def _words(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(low, high)))


def _uri(rng: random.Random) -> URI:
    return URI(f"agent://{rng.choice(_ORGS)}.example.net/{rng.choice(_ROLES)}-"
               f"{rng.randrange(100)}")


def _decimal(rng: random.Random, high: int, places: int = 2) -> Decimal:
    return Decimal(f"{rng.randrange(1, high * 10**places) / 10**places:.{places}f}")


def _members(rng: random.Random, head: tuple[Any, ...], members: list[tuple[str, Any]],
             shuffle: bool = True) -> tuple[Any, ...]:
    """``head`` then the members ``(:name value)`` whose value is not ``None``, in random
    order where the grammar takes them in any order (a keyword set, or ``member*``)."""
    present = [(K(name), value) for name, value in members if value is not None]
    if shuffle:
        rng.shuffle(present)
    return head + tuple(item for pair in present for item in pair)


def _maybe(rng: random.Random, value: Any, chance: float = 0.5) -> Any:
    return value if rng.random() < chance else None


def _small_value(rng: random.Random) -> Any:
    """A value of the size a small message carries (a result, a parameter)."""
    pick = rng.randrange(4)
    if pick == 0:
        return (S("snapshot"), K("id"), f"snap-{rng.randrange(10**4):04d}", K("size-gb"),
                _decimal(rng, 999, 1))
    if pick == 1:
        return (S("status"), K("state"), S(rng.choice(["ok", "degraded", "draining"])),
                K("load"), _decimal(rng, 1), K("since"), 1764400000000 + rng.randrange(10**8))
    if pick == 2:
        return tuple(rng.choice(["pending", "shipped", "delivered", "returned"])
                     for _ in range(rng.randint(1, 4)))
    return rng.randrange(10**6)


def _small_args(rng: random.Random) -> tuple[Any, ...]:
    """Keyword arguments ``(:name value …)``: one to three of a handful, any order."""
    choices: list[tuple[str, Any]] = [
        ("target", f"vol-{rng.randrange(1000)}"), ("count", rng.randrange(1, 5000)),
        ("path", f"hdfs://cluster/data/{rng.choice(_WORDS)}-{rng.randrange(100)}"),
        ("codec", S(rng.choice(["h264", "av1", "zstd"]))), ("value", _small_value(rng))]
    return _members(rng, (), rng.sample(choices, rng.randint(2, 4)))


def _bulk(rng: random.Random, count: int) -> tuple[Any, ...]:
    """About ``count`` inventory records (a ~4 KB value for 21), different each time."""
    return records(max(1, count + rng.randint(-3, 3)), rng.randrange(1 << 30))


def _request_body(rng: random.Random, bulk: int) -> tuple[str, tuple[Any, ...]]:
    action_id = f"rq-{rng.randrange(10**5)}"
    pick = rng.randrange(2) if bulk else rng.randrange(6)
    if pick == 0:
        args = ((K("items"), _bulk(rng, bulk), K("priority"), rng.randrange(10)) if bulk
                else _maybe(rng, _small_args(rng), 0.8))
        action = _members(rng, (S("action"),), [("name", S(rng.choice(_ACTIONS))),
                                                 ("args", args)])
        return "REQUEST", _members(rng, (S("request"),), [
            ("action", action), ("by", _maybe(rng, 1764500000000 + rng.randrange(10**8)))])
    if pick == 1:
        return "INFORM", _members(rng, (S("inform-result"),), [
            ("action-id", action_id), ("result", _bulk(rng, bulk) if bulk
                                       else _small_value(rng))])
    if pick == 2:
        return "AGREE", (S("agree"), K("action-id"), action_id)
    if pick == 3:
        return "INFORM", (S("inform-done"), K("action-id"), action_id)
    intent = rng.choice(["REFUSE", "FAILURE"])
    return intent, _members(rng, (S(intent.lower()),), [("action-id", action_id),
                                                         ("reason", _words(rng, 4, 16))])


def _contract_net_body(rng: random.Random, bulk: int) -> tuple[str, tuple[Any, ...]]:
    task_id = f"t-{rng.randrange(10**5)}"
    pick = rng.randrange(2) if bulk else rng.randrange(7)
    if pick == 0:
        params = ((K("items"), _bulk(rng, bulk), K("frames"), rng.randrange(10**4)) if bulk
                  else _maybe(rng, _small_args(rng), 0.8))
        task = _members(rng, (S("task"),), [("id", task_id),
                                             ("action", S(rng.choice(_ACTIONS))),
                                             ("params", params)])
        return "CFP", _members(rng, (S("cfp"),), [
            ("task", task), ("deadline", 1764500000000 + rng.randrange(10**8)),
            ("round", _maybe(rng, rng.randint(1, 100)))])
    if pick == 1:
        return "INFORM", _members(rng, (S("inform-done"),), [
            ("task-id", task_id), ("result", _bulk(rng, bulk) if bulk
                                   else _maybe(rng, _small_value(rng), 0.7))])
    if pick == 2:
        price = _decimal(rng, 9999) if rng.random() < 0.7 else rng.randrange(10**5)
        bid = _members(rng, (S("bid"),), [
            ("price", price), ("currency", S(rng.choice(["EUR", "USD", "GBP", "CHF", "JPY"]))),
            ("eta", _maybe(rng, rng.randrange(10**6)))])
        return "PROPOSE", _members(rng, (S("proposal"),), [
            ("task-id", task_id), ("bid", bid),
            ("valid-until", _maybe(rng, 1764500000000 + rng.randrange(10**8)))])
    if pick == 3:
        reason = (rng.choice([S("busy"), S("unqualified"), S("deadline-too-short")])
                  if rng.random() < 0.6 else (S("other"), _words(rng, 2, 8)))
        return "REFUSE", _members(rng, (S("refuse"),), [("task-id", task_id),
                                                         ("reason", reason)])
    if pick == 4:
        return "ACCEPT", (S("accept-proposal"), K("task-id"), task_id)
    if pick == 5:
        return "REJECT", _members(rng, (S("reject-proposal"),), [
            ("task-id", task_id), ("reason", _maybe(rng, _words(rng, 2, 10)))])
    return "FAILURE", _members(rng, (S("failure"),), [("task-id", task_id),
                                                       ("reason", _words(rng, 4, 16))])


def _canon_a_body(rng: random.Random, bulk: int) -> tuple[str, tuple[Any, ...]]:
    pick = 0 if bulk else rng.randrange(5)
    if pick == 0:
        value = _bulk(rng, bulk) if bulk else _maybe(rng, _small_value(rng), 0.8)
        return "INFORM", _members(rng, (S("inform"), S("results")), [
            ("order_id", _maybe(rng, f"A-{rng.randrange(10**4)}", 0.8)),
            ("limit", _maybe(rng, rng.randrange(1001))), ("value", value)])
    if pick == 1:
        return "QUERY", _members(rng, (S("query"), S("weather")), [
            # (always: canon-a/v1's constraint query-needs-city; the draw is kept, so the
            # sets are otherwise as they were)
            ("city", _maybe(rng, rng.choice(["Paris", "Zürich", "Lagos", "Osaka", "Lima"]),
                            1.0)),
            ("date", _maybe(rng, f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}")),
            ("unit", _maybe(rng, S(rng.choice(["celsius", "fahrenheit", "kelvin"]))))])
    if pick == 2:
        expression = f"{rng.randrange(10**4)} {rng.choice('+-*/')} {rng.randrange(10**4)}"
        return "REQUEST", (S("request"), S("calculator"), K("expression"), expression)
    if pick == 3:
        return "REFUSE", _members(rng, (S("deny"),), [("reason",
                                                       _maybe(rng, _words(rng, 4, 14), 0.8))])
    return "FAILURE", _members(rng, (S("error"),), [
        ("message", _words(rng, 4, 16)), ("code", _maybe(rng, rng.randrange(1000)))],
        shuffle=False)


def _task_assignment_body(rng: random.Random, bulk: int) -> tuple[str, tuple[Any, ...]]:
    cmd_members: list[tuple[str, Any]] = [("algorithm", S(rng.choice(["bfs", "merge",
                                                                        "pagerank"])))]
    if bulk:
        cmd_members.append(("inputs", _bulk(rng, bulk)))
    else:
        cmd_members.append(("data-ref", f"hdfs://cluster/data/graph-{rng.randrange(100)}"))
        cmd_members.append(("iterations", _maybe(rng, rng.randrange(1, 50))))
    cmd = _members(rng, (S("compute"),), cmd_members)
    resources = _members(rng, (), [("cpu", rng.randint(1, 256)),
                                   ("mem", _maybe(rng, rng.randint(1, 1 << 20), 0.8))])
    deadline = (S("+"), (S("now"),), rng.randrange(60, 86400))
    return "PROPOSE", _members(rng, (S("task"), K("id"), f"task-{rng.randrange(10**5)}"), [
        ("cmd", cmd if bulk else _maybe(rng, cmd, 0.9)), ("resources", _maybe(rng, resources)),
        ("deadline", _maybe(rng, deadline))])


_BODIES: dict[str, Callable[[random.Random, int], tuple[str, tuple[Any, ...]]]] = {
    "request-v1": _request_body, "contract-net-v1": _contract_net_body,
    "canon-a-v1": _canon_a_body, "task-assignment-v1": _task_assignment_body}


def varied(protocol: str, size: str, count: int, seed: int = 1) -> list[Message]:
    """``count`` different messages of ``protocol`` in size class ``size``: random intents
    (small: all the protocol governs; medium and large: those whose bodies carry a value of
    about ``RECORDS[size]`` records), ids, agents, optional fields and member orders."""
    rng = random.Random(f"{protocol}/{size}/{seed}")
    bulk = RECORDS.get(size, 0)
    out = []
    for index in range(count):
        intent, body = _BODIES[protocol](rng, bulk)
        out.append(Message(
            message_id=f"msg-{index:04d}-{rng.randrange(1 << 32):08x}", sender=_uri(rng),
            receiver=_uri(rng), intent=intent, protocol=S(protocol[:-3] + "/v1"),
            conversation_id=_maybe(rng, f"{rng.choice(_ACTIONS)}-2026-{rng.randint(1, 12):02d}-"
                                         f"{rng.randint(1, 28):02d}-{rng.randrange(10**4)}", 0.8),
            in_reply_to=_maybe(rng, f"msg-{rng.randrange(10**4):04d}-{rng.randrange(1 << 32):08x}",
                               0.6),
            reply_by=_maybe(rng, 1764500000000 + rng.randrange(10**8), 0.2),
            timestamp=_maybe(rng, 1764400000000 + rng.randrange(10**8), 0.8), body=body))
    return out


def build_case(descriptors: Path, registry: Registry, protocol: str, size: str,
               count: int) -> Case:
    """A set of ``count`` different messages of ``protocol`` in size class ``size`` that its
    grammar and schema fully accept, each read back from its canonical text; a small set
    starts with the protocol's shipped example."""
    built = varied(protocol, size, count)
    if size == "small":
        example = (descriptors / "examples" / f"{SMALL[protocol]}.cbcl").read_bytes()
        built[0] = parse(example, registry=registry)
    texts = tuple(canonical(message).encode() for message in built)
    del built
    read = tuple(parse(text, registry=registry) for text in texts)  # or raises
    assert len(set(texts)) == len(texts), "the messages of a set are all different"
    return Case(f"{protocol}/{size}", protocol, size, texts, read)


def build_corpus(descriptors: Path, registry: Registry,
                 sizes: Iterable[str] = ("small", "medium", "large"),
                 messages: dict[str, int] | None = None) -> list[Case]:
    """Per protocol and size class, a set of different messages (``messages[size]`` of
    them, :data:`MESSAGES` by default): :func:`build_case`."""
    counts = MESSAGES if messages is None else messages
    return [build_case(descriptors, registry, protocol, size, counts[size])
            for protocol in PROTOCOLS for size in sizes]


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
    """Compact JSON of the lossless JSON mapping (``cbcl.json_mapping.message_to_json``), UTF-8."""
    return json.dumps(message_to_json(message), separators=(",", ":"),
                      ensure_ascii=False).encode()


def _field(keyword: str) -> str:
    """The JSON field name of a keyword: ``:action-id`` → ``action_id``."""
    return str.__str__(keyword).replace("-", "_")


def natural(value: Any) -> Any:
    """A CBCL value as a JSON API would carry it: a list ``(head :k v …)`` is an object
    ``{"kind": head, "k": v …}``, a list of keyword arguments ``(:k v …)`` an object, any
    other list an array; symbols, keywords and URIs are strings, decimals numbers."""
    kind = type(value)
    if kind is int or kind is str:
        return value
    if kind is Decimal:
        return float(value)
    if kind is not tuple:
        return str.__str__(value)
    size = len(value)
    start = 1 if size and type(value[0]) is Symbol else 0
    if size > start and (size - start) % 2 == 0 and all(
            type(value[index]) is Keyword for index in range(start, size, 2)):
        out: dict[str, Any] = {"kind": str.__str__(value[0])} if start else {}
        for index in range(start, size, 2):
            out[_field(value[index])] = natural(value[index + 1])
        return out
    if size == 1 and start:
        return {"kind": str.__str__(value[0])}
    return [natural(item) for item in value]


def natural_body(body: Any) -> Any:
    """The body as an object: ``kind``, its ``target`` (canon-a's second symbol), fields."""
    if type(body) is tuple and len(body) >= 2 and type(body[0]) is Symbol \
            and type(body[1]) is Symbol:
        record = natural((body[0], *body[2:]))
        return {"kind": record.pop("kind"), "target": str.__str__(body[1]), **record}
    return natural(body)


def natural_document(message: Message) -> dict[str, Any]:
    """The message as a JSON API would carry it (see :func:`natural_json`)."""
    document: dict[str, Any] = {
        "message_id": message.message_id, "sender": str(message.sender),
        "receiver": str(message.receiver), "intent": message.intent.value,
        "protocol": str(message.protocol)}
    for name in ("conversation_id", "in_reply_to", "reply_by", "timestamp"):
        if getattr(message, name) is not None:
            document[name] = getattr(message, name)
    if message.body is not None:
        document["body"] = natural_body(message.body)
    if message.signature is not None:
        document["signature"] = [message.signature.key_id, message.signature.value]
    return document


def natural_json(message: Message) -> bytes:
    """A message as a JSON API would carry it: envelope fields by name, the body an object
    with a ``kind`` and its fields by name (``:action-id`` is ``action_id``), nested records
    objects too (:func:`natural`); compact, UTF-8."""
    return json.dumps(natural_document(message), separators=(",", ":"),
                      ensure_ascii=False).encode()


# --------------------------------------------------------------------------- typed peers
#
# What each protocol's grammar and schema accept, written out for the typed JSON peers:
# per intent, the body records it admits. A field is (JSON name, type, required); a type
# is ("str", min length, max length), ("int", min, max), ("number", min), ("symbol",),
# ("one-of", values), ("any",), ("args",) (keyword arguments, any values: an object),
# ("keys", fields) (an object of those fields), ("record", Rec) or ("reason",)
# (contract-net's refusal: one of three symbols or ``(other STRING)``); the mixed sets add
# ("decimal", min, max) (held as the peer's decimal type: ``Decimal`` or ``float``),
# ("uri",) and ("list", element spec).


@dataclass(frozen=True)
class Rec:
    kind: str
    fields: tuple[tuple[str, tuple[Any, ...], bool], ...] = ()
    target: str | None = None  # canon-a: the symbol after the kind ("weather")
    extra: bool = False  # (record kind (else any)): any further keyword members


_ID = ("str", 1, 128)
_INT0 = ("int", 0, None)
_REASON = ("str", 1, 1024)
_RQ_ACTION = Rec("action", (("name", ("symbol",), True), ("args", ("args",), False)))
_CN_TASK = Rec("task", (("id", _ID, True), ("action", ("symbol",), True),
                        ("params", ("args",), False)))
_CN_BID = Rec("bid", (("price", ("number", 0), True),
                      ("currency", ("one-of", ("EUR", "USD", "GBP", "CHF", "JPY")), True),
                      ("eta", _INT0, False)))
_CANON_A = (
    Rec("query", (("city", ("str", 1, 128), False), ("date", ("str", 10, 10), False),
                  ("unit", ("one-of", ("celsius", "fahrenheit", "kelvin")), False)),
        target="weather"),
    Rec("request", (("expression", ("str", 1, 256), True),), target="calculator"),
    Rec("inform", (("order_id", ("str", 1, 64), False), ("limit", ("int", 0, 1000), False),
                   ("value", ("any",), False)), target="results"),
    Rec("deny", (("reason", ("str", 0, 1024), False),)),
    Rec("error", (("message", _REASON, True), ("code", ("int", 0, 999), False))))

#: Per protocol, per governed intent, the body records a message of that intent may carry.
SPECS: dict[str, dict[str, tuple[Rec, ...]]] = {
    "request-v1": {
        "REQUEST": (Rec("request", (("action", ("record", _RQ_ACTION), True),
                                    ("by", _INT0, False))),),
        "AGREE": (Rec("agree", (("action_id", _ID, True),)),),
        "REFUSE": (Rec("refuse", (("action_id", _ID, True), ("reason", _REASON, True))),),
        "FAILURE": (Rec("failure", (("action_id", _ID, True), ("reason", _REASON, True))),),
        "INFORM": (Rec("inform-done", (("action_id", _ID, True),)),
                   Rec("inform-result", (("action_id", _ID, True), ("result", ("any",), True)))),
    },
    "contract-net-v1": {
        "CFP": (Rec("cfp", (("task", ("record", _CN_TASK), True), ("deadline", _INT0, True),
                            ("round", ("int", 1, 100), False))),),
        "PROPOSE": (Rec("proposal", (("task_id", _ID, True), ("bid", ("record", _CN_BID), True),
                                     ("valid_until", _INT0, False))),),
        "REFUSE": (Rec("refuse", (("task_id", _ID, True), ("reason", ("reason",), True))),),
        "ACCEPT": (Rec("accept-proposal", (("task_id", _ID, True),)),),
        "REJECT": (Rec("reject-proposal", (("task_id", _ID, True),
                                           ("reason", ("str", 0, 1024), False))),),
        "INFORM": (Rec("inform-done", (("task_id", _ID, True), ("result", ("any",), False))),),
        "FAILURE": (Rec("failure", (("task_id", _ID, True), ("reason", _REASON, True))),),
    },
    "canon-a-v1": dict.fromkeys(("QUERY", "REQUEST", "INFORM", "REFUSE", "FAILURE"), _CANON_A),
    "task-assignment-v1": {
        "PROPOSE": (Rec("task", (
            ("id", ("str", 1, 64), True), ("cmd", ("record", Rec("compute", extra=True)), False),
            ("resources", ("keys", (("cpu", ("int", 1, 256), True),
                                    ("mem", ("int", 1, 1 << 20), False))), False),
            ("deadline", ("any",), False))),),
    },
}
#: Intents every protocol admits without governing them: no body, or a reason string.
UNGOVERNED = ("CANCEL", "NOT-UNDERSTOOD")
#: A symbol (less the rule that it does not read as a number), and a URI.
SYMBOL_PATTERN = r"^[A-Za-z+\-*/<>=!?_.][A-Za-z0-9+\-*/<>=!?_.@%&]*$"
URI_PATTERN = r"^[a-z][a-z0-9+.\-]*://\S+$"
_REASONS = ("busy", "unqualified", "deadline-too-short")


def _literal(values: tuple[str, ...]) -> Any:
    return Literal.__getitem__(values)  # Literal[values], with values known at run time


def _union(types: Iterable[Any]) -> Any:
    return Union.__getitem__(tuple(types))


@dataclass
class TypedPeers:
    """The typed JSON peers of one protocol (``None`` where not installed)."""

    msgspec_type: Any = None  # the message union, tagged by intent
    msgspec_check: Callable[[Any], None] | None = None  # what a Struct cannot say
    pydantic: type[RootModel[Any]] | None = None  # over the message union, by intent
    jsonschema: Callable[[Any], None] | None = None  # the pydantic model's JSON Schema


def _constrained(t: Any, annotation: Callable[..., Any], constraints: dict[str, Any]) -> Any:
    """``t`` annotated with ``annotation(**constraints)`` (msgspec's ``Meta``, pydantic's
    ``Field``), the constraints given as ``None`` left out; ``t`` itself without any."""
    given = {name: value for name, value in constraints.items() if value is not None}
    # (subscripted, not Annotated.__class_getitem__, which CPython 3.13 no longer has)
    return Annotated[t, annotation(**given)] if given else t


def _spec_type(spec: tuple[Any, ...], meta: Callable[..., Any],
               record: Callable[[Rec], Any],
               keys: Callable[[Iterable[tuple[str, tuple[Any, ...], bool]]], Any],
               decimals: type = float) -> Any:
    """The typed-peer type of one field spec of :data:`SPECS`, the same for msgspec and
    pydantic: ``meta(t, **constraints)`` adds constraints, ``record`` and ``keys`` build a
    nested record and a keyword list in the peer's own way; a ``decimal`` is held as
    ``decimals``."""
    kind = spec[0]
    if kind == "decimal":  # (msgspec bounds no Decimal: it gets them only as float)
        if decimals is Decimal and meta.__qualname__.startswith("_msgspec_types"):
            return decimals
        return meta(decimals, ge=spec[1], le=spec[2])
    if kind == "uri":
        return meta(str, pattern=URI_PATTERN)
    if kind == "list":
        return list[_spec_type(spec[1], meta, record, keys, decimals)]  # type: ignore[misc]
    if kind == "str":
        return meta(str, min_length=spec[1] or None, max_length=spec[2])
    if kind == "int":
        return meta(int, ge=spec[1], le=spec[2])
    if kind == "number":
        return _union((meta(int, ge=spec[1]), meta(float, ge=spec[1])))
    if kind == "symbol":
        return meta(str, pattern=SYMBOL_PATTERN)
    if kind == "one-of":
        return _literal(spec[1])
    if kind == "any":
        return Any
    if kind == "args":
        return dict[str, Any]
    if kind == "keys":
        return keys(spec[1])
    if kind == "reason":
        return _union((_literal(_REASONS), tuple[Literal["other"], str]))
    return record(spec[1])


def _msgspec_types(protocol: str, decimals: type = float) -> tuple[Any, Callable[[Any], None]]:
    """The msgspec type of a natural-JSON message of ``protocol`` (its decimals held as
    ``decimals``), and a check of what a ``Struct`` cannot express (a record with further
    members of any name, kept as an object: its ``kind``)."""
    import msgspec
    from msgspec import UNSET, Meta, UnsetType

    open_records: list[tuple[Any, str, str]] = []

    def meta(t: Any, **constraints: Any) -> Any:
        return _constrained(t, Meta, constraints)

    def record(rec: Rec) -> Any:
        if rec.extra:
            return dict[str, Any]
        return struct(rec.kind, rec.fields, rec.kind, target=rec.target)

    def of(spec: tuple[Any, ...]) -> Any:
        return _spec_type(spec, meta, record, lambda fields: struct("Keys", fields, None),
                          decimals)

    def struct(name: str, fields: Iterable[tuple[str, tuple[Any, ...], bool]],
               kind: str | None, *, tag: str | None = None, target: str | None = None) -> Any:
        members: list[Any] = []
        if kind is not None and tag is None:
            members.append(("kind", _literal((kind,))))
        if target is not None:
            members.append(("target", _literal((target,))))
        for field, spec, required in fields:
            members.append((field, of(spec)) if required
                           else (field, _union((of(spec), UnsetType)), UNSET))
        return msgspec.defstruct(name.title().replace("-", ""), members, kw_only=True,
                                 forbid_unknown_fields=True, tag_field="kind" if tag else None,
                                 tag=tag)

    def body(records: tuple[Rec, ...]) -> Any:
        if len(records) == 1:
            rec = records[0]
            found = struct(rec.kind, rec.fields, rec.kind, target=rec.target)
        else:  # a union of Structs is tagged by kind
            found = _union(struct(rec.kind, rec.fields, rec.kind, tag=rec.kind,
                                  target=rec.target) for rec in records)
        for rec in records:
            for field, spec, _ in rec.fields:
                if spec[0] == "record" and spec[1].extra:
                    open_records.append((found, field, spec[1].kind))
        return found

    nonempty, uri = meta(str, min_length=1), meta(str, pattern=URI_PATTERN)
    envelope: list[tuple[Any, ...]] = [("message_id", nonempty), ("sender", uri), ("receiver", uri),
                ("protocol", _literal((protocol[:-3] + "/v1",)))]
    for name, t in (("conversation_id", nonempty), ("in_reply_to", nonempty),
                    ("reply_by", int), ("timestamp", int), ("signature", tuple[str, str])):
        envelope.append((name, _union((t, UnsetType)), UNSET))
    messages = []
    for intent, records in SPECS[protocol].items():
        members = [*envelope, ("body", body(records))]
        messages.append(msgspec.defstruct(intent.title(), members, kw_only=True,
                                          forbid_unknown_fields=True, tag_field="intent",
                                          tag=intent))
    for intent in UNGOVERNED:
        members = [*envelope, ("body", _union((str, UnsetType)), UNSET)]
        messages.append(msgspec.defstruct(intent.title().replace("-", ""), members, kw_only=True,
                                          forbid_unknown_fields=True, tag_field="intent",
                                          tag=intent))

    def check(message: Any) -> None:
        for owner, field, kind in open_records:
            body = message.body
            if isinstance(body, owner):
                value = getattr(body, field)
                if value is not UNSET and value.get("kind") != kind:
                    raise msgspec.ValidationError(f"Expected `{kind}` - at `$.body.{field}`")

    return _union(messages), check


def _pydantic_model(protocol: str, decimals: type = float) -> type[RootModel[Any]]:
    """A pydantic ``RootModel`` of a natural-JSON message of ``protocol``: strict, no
    unknown fields, the message union discriminated by intent, each body union by kind,
    decimals held as ``decimals``."""
    from pydantic import BaseModel, ConfigDict, Field, RootModel, create_model

    closed = ConfigDict(extra="forbid", strict=True)
    open_ = ConfigDict(extra="allow", strict=True)

    def meta(t: Any, **constraints: Any) -> Any:
        return _constrained(t, Field, constraints)

    def of(spec: tuple[Any, ...]) -> Any:
        return _spec_type(
            spec, meta,
            lambda rec: model(rec.kind, rec.fields, rec.kind, target=rec.target,
                              extra=rec.extra),
            lambda fields: model("Keys", fields, None), decimals)

    def model(name: str, fields: Iterable[tuple[str, tuple[Any, ...], bool]],
              kind: str | None, *, target: str | None = None, extra: bool = False) -> Any:
        members: dict[str, Any] = {}
        if kind is not None:
            members["kind"] = (_literal((kind,)), ...)
        if target is not None:
            members["target"] = (_literal((target,)), ...)
        for field, spec, required in fields:
            members[field] = (of(spec), ... if required else None)
        return create_model(name.title().replace("-", ""), __config__=open_ if extra
                            else closed, **members)

    def body(records: tuple[Rec, ...]) -> Any:
        models = [model(rec.kind, rec.fields, rec.kind, target=rec.target)
                  for rec in records]
        if len(models) == 1:
            return models[0]
        return Annotated[_union(models), Field(discriminator="kind")]

    nonempty = meta(str, min_length=1)
    uri = meta(str, pattern=URI_PATTERN)
    envelope: dict[str, Any] = {
        "message_id": (nonempty, ...), "sender": (uri, ...), "receiver": (uri, ...),
        "protocol": (_literal((protocol[:-3] + "/v1",)), ...),
        "conversation_id": (nonempty, None), "in_reply_to": (nonempty, None),
        "reply_by": (int, None), "timestamp": (int, None),
        "signature": (tuple[str, str], None)}
    messages: list[type[BaseModel]] = []
    for intent, records in SPECS[protocol].items():
        messages.append(create_model(intent.title(), __config__=closed,
                                     intent=(_literal((intent,)), ...), **envelope,
                                     body=(body(records), ...)))
    for intent in UNGOVERNED:
        messages.append(create_model(intent.title().replace("-", ""), __config__=closed,
                                     intent=(_literal((intent,)), ...), **envelope,
                                     body=(str, None)))
    union: Any = Annotated[_union(messages), Field(discriminator="intent")]
    return RootModel[union]


_TYPED: dict[tuple[str, type], TypedPeers] = {}


def typed_peers(protocol: str, decimals: type = float) -> TypedPeers:
    """The typed JSON peers of ``protocol`` that are installed (built once), holding its
    decimals as ``decimals`` (``float``, as a JSON API mostly does, or ``Decimal``)."""
    if (protocol, decimals) in _TYPED:
        return _TYPED[protocol, decimals]
    peers = TypedPeers()
    with contextlib.suppress(ImportError):
        peers.msgspec_type, peers.msgspec_check = _msgspec_types(protocol, decimals)
    try:
        peers.pydantic = _pydantic_model(protocol, decimals)
    except ImportError:
        pass
    else:
        try:
            import jsonschema
        except ImportError:
            pass
        else:
            schema = peers.pydantic.model_json_schema()
            peers.jsonschema = jsonschema.Draft202012Validator(schema).validate
    _TYPED[protocol, decimals] = peers
    return peers


def pydantic_model() -> Any:
    """A hand-written pydantic model of a request/v1 message (envelope, body and schema),
    as ``benchmarks/stream.py`` serves it; ``cbcl bench`` builds its own from
    :data:`SPECS` (:func:`typed_peers`)."""
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
    """Seconds per call of each function: the best of ``rounds`` interleaved rounds. The
    cyclic garbage collector is off while a round runs, as ``timeit`` has it, and collects
    between rounds: a collection walks every live object (the corpus of different messages
    included) and would charge that to whichever contender happened to trigger it."""
    enabled = gc.isenabled()
    gc.collect()
    gc.freeze()  # what exists now (the messages, the peers' inputs) is never walked again
    gc.disable()
    try:
        numbers = {name: _calibrate(function, seconds) for name, function in functions.items()}
        best = dict.fromkeys(functions, math.inf)
        for _ in range(rounds):
            for name, function in functions.items():
                gc.collect()
                number = numbers[name]
                start = time.perf_counter()
                for _ in range(number):
                    function()
                best[name] = min(best[name], (time.perf_counter() - start) / number)
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()
    return best


# --------------------------------------------------------------------------- measurements


def _each(function: Callable[[Any], object], items: Iterable[Any]) -> Callable[[], None]:
    """One pass of ``function`` over ``items`` (a round of a contender)."""
    items = tuple(items)

    def one_pass() -> None:
        for item in items:
            function(item)

    return one_pass


#: Contenders that read a subset of each set (they are 5-100× slower), and the CBCL text
#: parse timed on the same subset to compare them with.
SLOW = ("sexpdata_loads", "lark_parse", "json_loads_jsonschema", "cbcl_text_parse_subset")
#: Ratios of a row: name → (peer, CBCL contender); figure = peer time / CBCL time.
RATIOS = {
    "text_vs_sexpdata": ("sexpdata_loads", "cbcl_text_parse_subset"),
    "text_vs_lark": ("lark_parse", "cbcl_text_parse_subset"),
    "text_vs_json_loads_jsonschema": ("json_loads_jsonschema", "cbcl_text_parse_subset"),
    "binary_vs_text": ("cbcl_text_parse", "cbcl_binary_decode"),
    "text_vs_pydantic": ("pydantic_validate_json", "cbcl_text_parse"),
    "text_vs_msgspec_json": ("msgspec_json_decode", "cbcl_text_parse"),
    "binary_vs_msgspec_msgpack": ("msgspec_msgpack_decode", "cbcl_binary_decode"),
    "binary_encode_vs_msgspec_msgpack": ("msgspec_msgpack_encode", "cbcl_binary_encode"),
    "text_encode_vs_msgspec_json": ("msgspec_json_encode", "cbcl_text_encode"),
    "text_encode_vs_pydantic": ("pydantic_dump_json", "cbcl_text_encode"),
    "text_vs_msgpack_unpackb": ("msgpack_unpackb", "cbcl_text_parse"),
    "text_vs_orjson_loads": ("orjson_loads", "cbcl_text_parse"),
}


def throughput(cases: list[Case], registry: Registry, descriptors: Path, *, rounds: int,
               seconds: float, subset: int, report: Callable[[str], None],
               ) -> dict[str, dict[str, Any]]:
    """Per set: µs per message of CBCL and every installed peer, and the ratios."""
    import sexpdata

    # Encoding is timed as the peers encode: the value was validated when it was built
    # (msgspec and pydantic encode without checking again); validate=True adds pass 2.
    encoder = Encoder(registry, validate=False)
    decoder = Decoder(registry)
    larks = {protocol: lark_parser(*_grammar_of(registry, protocol)) for protocol in PROTOCOLS}
    out: dict[str, dict[str, Any]] = {}
    for case in cases:
        functions = _contenders(case, registry, encoder, decoder, larks[case.protocol],
                                sexpdata.loads, subset)
        times = compare(functions, rounds=rounds, seconds=seconds)
        count, part = len(case.texts), min(subset, len(case.texts))
        row: dict[str, Any] = {"messages": count, "subset": part,
                               "bytes": round(sum(map(len, case.texts)) / count)}
        per_message = {name: value / (part if name in SLOW else count)
                       for name, value in times.items()}
        row.update({f"{name}_us": value * 1e6 for name, value in per_message.items()})
        row["missing"] = sorted(name for name in _PEERS if name not in times)
        for ratio, (peer, ours) in RATIOS.items():
            if peer in per_message:
                row[ratio] = per_message[peer] / per_message[ours]
        out[case.name] = row
        shown = ", ".join(f"{ratio} {row[ratio]:.2f}" for ratio in
                          ("text_vs_pydantic", "binary_vs_msgspec_msgpack",
                           "binary_encode_vs_msgspec_msgpack", "text_encode_vs_msgspec_json")
                          if ratio in row)
        report(f"  {case.name} ({count} messages): text {row['cbcl_text_parse_us']:.1f} µs, "
               f"×lark {row['text_vs_lark']:.2f}, binary ×{row['binary_vs_text']:.2f}; "
               f"{shown}")
    return out


#: The optional peers (reported as missing when not installed).
_PEERS = ("msgspec_json_decode", "msgspec_msgpack_decode", "msgspec_json_encode",
          "msgspec_msgpack_encode", "pydantic_validate_json", "pydantic_dump_json",
          "json_loads_jsonschema", "orjson_loads")


def _contenders(case: Case, registry: Registry, encoder: Encoder, decoder: Decoder, lark: Any,
                sexpdata_loads: Callable[[str], Any], subset: int,
                ) -> dict[str, Callable[[], object]]:
    """The functions timed on one set (each a pass over it), every peer first checked to
    accept (or decode back) every message it reads."""
    texts, messages = case.texts, case.messages
    frames = [encoder.encode(message) for message in messages]
    pure = Decoder(registry)  # the decoder where cbcl._native is not built (msgpack's C is)
    pure._fast_c = None  # (neither its fast tier's C twins
    pure._frame_state = None  # nor the whole-frame call: until now it still made that call)
    for frame, message in zip(frames, messages, strict=True):
        assert decoder.decode(frame) == message == pure.decode(frame)
    packed = [msgpack.packb(plain(message.to_value())) for message in messages]
    few = [text.decode() for text in texts[:subset]]
    for string in few:
        lark.parse(string)  # accepted, or raises

    def parse_text(text: bytes) -> object:
        return parse(text, registry=registry)

    functions: dict[str, Callable[[], object]] = {
        "cbcl_text_parse": _each(parse_text, texts),
        "cbcl_binary_decode": _each(decoder.decode, frames),
        "cbcl_binary_decode_pure": _each(pure.decode, frames),
        "cbcl_text_encode": _each(Message.canonical, messages),
        "cbcl_binary_encode": _each(encoder.encode, messages),
        "cbcl_text_parse_subset": _each(parse_text, texts[:subset]),
        "sexpdata_loads": _each(sexpdata_loads, few),
        "lark_parse": _each(lark.parse, few),
        "msgpack_unpackb": _each(msgpack.unpackb, packed),
    }
    try:
        import orjson
    except ImportError:
        pass
    else:
        lossless = [compact_json(message) for message in messages]
        functions["orjson_loads"] = _each(orjson.loads, lossless)
    naturals = [natural_json(message) for message in messages]
    peers = typed_peers(case.protocol)
    if peers.msgspec_type is not None:
        import msgspec

        json_decoder = msgspec.json.Decoder(peers.msgspec_type)
        msgpack_decoder = msgspec.msgpack.Decoder(peers.msgspec_type)
        check = peers.msgspec_check
        assert check is not None
        natural_packed = [msgspec.msgpack.encode(msgspec.json.decode(n)) for n in naturals]
        decoded = []
        for document, binary in zip(naturals, natural_packed, strict=True):
            value = json_decoder.decode(document)
            check(value)
            assert msgpack_decoder.decode(binary) == value
            decoded.append(value)

        def msgspec_json(document: bytes) -> object:
            value = json_decoder.decode(document)
            check(value)
            return value

        def msgspec_msgpack(binary: bytes) -> object:
            value = msgpack_decoder.decode(binary)
            check(value)
            return value

        functions["msgspec_json_decode"] = _each(msgspec_json, naturals)
        functions["msgspec_msgpack_decode"] = _each(msgspec_msgpack, natural_packed)
        functions["msgspec_json_encode"] = _each(msgspec.json.Encoder().encode, decoded)
        functions["msgspec_msgpack_encode"] = _each(msgspec.msgpack.Encoder().encode, decoded)
    if peers.pydantic is not None:
        model = peers.pydantic
        models = [model.model_validate_json(document) for document in naturals]

        def dump(value: RootModel[Any]) -> str:
            return value.model_dump_json(exclude_unset=True)

        functions["pydantic_validate_json"] = _each(model.model_validate_json, naturals)
        functions["pydantic_dump_json"] = _each(dump, models)
    if peers.jsonschema is not None:
        validate = peers.jsonschema
        few_natural = naturals[:subset]
        for document in few_natural:
            validate(json.loads(document))

        def json_schema(document: bytes) -> None:
            validate(json.loads(document))

        functions["json_loads_jsonschema"] = _each(json_schema, few_natural)
    return functions


def _grammar_of(registry: Registry, protocol: str) -> tuple[str, tuple[str, ...]]:
    found = registry.get(protocol[:-3] + "/v1")
    assert found is not None
    return found.descriptor.grammar, found.descriptor.start_rules


def sizes(cases: list[Case], registry: Registry) -> dict[str, dict[str, Any]]:
    """Per set: mean bytes per message of its text, canonical text, binary frame, natural
    JSON (:func:`natural_json`) and its msgpack, the lossless JSON mapping (compact) and the
    plain value tree's msgpack; the ratios are of the sums over the set."""
    encoder = Encoder(registry, validate=False)
    out = {}
    for case in cases:
        totals = dict.fromkeys(("text", "canonical", "binary", "natural_json",
                                "natural_msgpack", "json", "msgpack"), 0)
        for text, message in zip(case.texts, case.messages, strict=True):
            document = natural_document(message)
            totals["text"] += len(text)
            totals["canonical"] += len(message.canonical().encode())
            totals["binary"] += len(encoder.encode(message))
            totals["natural_json"] += len(json.dumps(document, separators=(",", ":"),
                                                     ensure_ascii=False).encode())
            totals["natural_msgpack"] += len(msgpack.packb(document))
            totals["json"] += len(compact_json(message))
            totals["msgpack"] += len(msgpack.packb(plain(message.to_value())))
        count = len(case.texts)
        row: dict[str, Any] = {"messages": count}
        row.update({name: round(total / count) for name, total in totals.items()})
        row["binary_vs_natural_json"] = totals["binary"] / totals["natural_json"]
        row["binary_vs_natural_msgpack"] = totals["binary"] / totals["natural_msgpack"]
        row["binary_vs_json"] = totals["binary"] / totals["json"]
        row["binary_vs_msgpack"] = totals["binary"] / totals["msgpack"]
        out[case.name] = row
    return out


def synthetic_descriptor(rules: int) -> bytes:
    """A descriptor whose grammar has ``rules`` rules: a body choosing among record kinds,
    each with its own keyword attributes (an LALR(1) grammar of realistic shape)."""
    from cbcl.core._canonical import quote

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


# --------------------------------------------------------------------------- mixed sets
#
# Issues 33 and 35: messages of ~4 KB and ~64 KB whose rows hold every atom kind (strings,
# integers, decimals of 2 and 6 places, symbols, URIs, keyword members, nested lists),
# with the vocabulary real agents write: most symbols, keywords and URIs appear once
# (:class:`Vocabulary`). They are carried by a benchmark protocol, table/v1
# (:func:`mixed_descriptor`), whose grammar and schema type every field, so CBCL checks
# what the typed peers check. Each peer runs twice: holding decimals as ``Decimal`` (exact,
# as CBCL does) and as ``float`` (as JSON APIs mostly do). Beside the warm figure (the best
# of interleaved passes over one set) each decoder gets a *first pass*: one pass over a set
# it has never read, with names none of the contenders' caches can hold, which is what a
# server meets when peers invent names.

MIXED_PROTOCOL = "table-v1"
#: Rows per message (about ~4 KB and ~64 KB of canonical text). A row's ten members come in
#: one order, as a program writes them, except in the ``any-order`` set, where each row has
#: its own order (as a model may write them; the grammar takes any order).
MIXED_ROWS = {"mixed-4k": 13, "mixed-64k": 210, "mixed-4k-any-order": 13}

_ROW = Rec("row", (
    ("id", _ID, True), ("name", ("str", 0, 256), True), ("qty", _INT0, True),
    ("price", ("decimal", 0, None), True), ("rate", ("decimal", 0, 1), True),
    ("unit", ("symbol",), True), ("owner", ("uri",), True),
    ("tags", ("list", ("symbol",)), True), ("attrs", ("args",), True),
    ("dims", ("list", ("decimal", None, None)), True)))
SPECS[MIXED_PROTOCOL] = {"INFORM": (Rec("table", (("id", _ID, True),
                                                  ("rows", ("list", ("record", _ROW)), True))),)}

_MIXED_GRAMMAR = """\
table: "(" "table" (":id" STRING & ":rows" rows) ")"
rows: "(" row* ")"
row: "(" "row" (ROW_MEMBERS) ")"
symbols: "(" SYMBOL* ")"
attrs: "(" (KEYWORD value)+ ")"
decimals: "(" DECIMAL* ")"
""".replace("ROW_MEMBERS", " & ".join((
    '":id" STRING', '":name" STRING', '":qty" INTEGER', '":price" DECIMAL', '":rate" DECIMAL',
    '":unit" SYMBOL', '":owner" URI', '":tags" symbols', '":attrs" attrs',
    '":dims" decimals')))  # (a grammar line is not broken inside a group)
_MIXED_SCHEMA = (
    "(schema (record table (:id (string :min-length 1 :max-length 128) required)"
    " (:rows (list-of (record row"
    " (:id (string :min-length 1 :max-length 128) required)"
    " (:name (string :max-length 256) required) (:qty (integer :min 0) required)"
    " (:price (decimal :min 0) required) (:rate (decimal :min 0 :max 1) required)"
    " (:unit symbol required) (:owner uri required) (:tags (list-of symbol) required)"
    " (:attrs (keys (else any)) required) (:dims (list-of decimal) required))) required)))")


def mixed_descriptor() -> bytes:
    """The descriptor of table/v1, the mixed sets' protocol (unsigned)."""
    from cbcl.core._canonical import quote

    return (f"(protocol-descriptor (id table/v1) (version 1) (intents (INFORM table)) "
            f"(grammar {quote(_MIXED_GRAMMAR)}) {_MIXED_SCHEMA})").encode()


_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "ta", "vo", "zi", "pe", "sa", "do", "gu", "bre",
              "stra", "xin", "qua", "el", "om", "ur", "ix")


class Vocabulary:
    """Names as agents write them: a ``fresh`` share never seen before (a new word and
    number each time), the rest from a few hundred recurring ones."""

    def __init__(self, rng: random.Random, *, recurring: int = 300, fresh: float = 0.8):
        self.rng, self.fresh = rng, fresh
        self.pool = [self.new() for _ in range(recurring)]

    def new(self) -> str:
        rng = self.rng
        word = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4)))
        return f"{word}-{rng.randrange(10**6)}"

    def name(self) -> str:
        return self.new() if self.rng.random() < self.fresh else self.rng.choice(self.pool)


def _mixed_row(rng: random.Random, vocabulary: Vocabulary,
               any_order: bool) -> tuple[Any, ...]:
    name = vocabulary.name
    attrs: list[Any] = []
    for key in dict.fromkeys(name() for _ in range(rng.randint(1, 3))):  # (each once)
        attrs += [K(key), rng.choice((rng.randrange(10**6), _words(rng, 1, 3)))]
    return _members(rng, (S("row"),), [
        ("id", f"r-{rng.randrange(10**9):09d}"), ("name", f"{_words(rng, 1, 4)} {name()}"),
        ("qty", rng.randrange(10**6)), ("price", _decimal(rng, 99999)),
        ("rate", Decimal(f"0.{rng.randrange(1, 10**6):06d}")), ("unit", S(name())),
        ("owner", URI(f"agent://{name()}.example.net/{name()}")),
        # (not one tag: natural() reads a list of one symbol as a record of that kind)
        ("tags", tuple(S(name()) for _ in range(rng.choice((0, 2, 3, 4))))),
        ("attrs", tuple(attrs)),
        ("dims", tuple(_decimal(rng, 1000, 3) for _ in range(rng.randint(1, 3))))],
        shuffle=any_order)


def mixed_messages(size: str, count: int, seed: str, *, fresh: float = 0.8) -> list[Message]:
    """``count`` different table/v1 messages of size class ``size`` (:data:`MIXED_ROWS`),
    their names from a vocabulary of their own (``seed``), a share ``fresh`` of them never
    seen before (the rest from a few hundred recurring ones)."""
    rng = random.Random(f"mixed/{size}/{seed}")
    return _mixed_set(rng, Vocabulary(rng, fresh=fresh), MIXED_ROWS[size], 2, 1, count,
                      size.endswith("any-order"))


def _mixed_set(rng: random.Random, vocabulary: Vocabulary, rows: int, jitter: int,
               least: int, count: int, any_order: bool) -> list[Message]:
    """``count`` table/v1 messages of ``rows`` ± ``jitter`` rows each (at least ``least``),
    drawn from ``rng`` and ``vocabulary``: :func:`mixed_messages` and
    :func:`mixed_messages_of`."""
    out = []
    for index in range(count):
        body = _members(rng, (S("table"),), [
            ("id", f"tbl-{rng.randrange(10**8)}"),
            ("rows", tuple(_mixed_row(rng, vocabulary, any_order)
                           for _ in range(max(least, rows + rng.randint(-jitter, jitter)))))])
        out.append(Message(
            message_id=f"msg-{index:05d}-{rng.randrange(1 << 32):08x}",
            sender=URI(f"agent://{vocabulary.name()}.example.net/{rng.choice(_ROLES)}"),
            receiver=_uri(rng), intent="INFORM", protocol=S("table/v1"),
            conversation_id=f"{vocabulary.name()}-{rng.randrange(10**6)}",
            timestamp=1764400000000 + rng.randrange(10**8), body=body))
    return out


@dataclass
class _Inputs:
    """One set of messages in every contender's input form."""

    texts: list[bytes]
    frames: list[bytes]
    naturals: list[bytes]
    packed: list[bytes]


def _inputs(messages: list[Message], encoder: Encoder) -> _Inputs:
    import msgspec

    naturals = [natural_json(message) for message in messages]
    return _Inputs([canonical(message).encode() for message in messages],
                   [encoder.encode(message) for message in messages], naturals,
                   [msgspec.msgpack.encode(json.loads(n)) for n in naturals])


#: The decoders of the mixed sets: name → (input form, peer decimals or None for CBCL).
_MIXED_DECODERS = {
    "cbcl_text_parse": ("texts", None), "cbcl_binary_decode": ("frames", None),
    "msgspec_json_decode": ("naturals", Decimal), "msgspec_msgpack_decode": ("packed", Decimal),
    "pydantic_validate_json": ("naturals", Decimal),
    "msgspec_json_decode_float": ("naturals", float),
    "msgspec_msgpack_decode_float": ("packed", float),
    "pydantic_validate_json_float": ("naturals", float)}
#: Ratios of a mixed row: name → (peer, CBCL contender); figure = peer time / CBCL time.
MIXED_RATIOS = {
    "text_vs_pydantic": ("pydantic_validate_json", "cbcl_text_parse"),
    "text_vs_msgspec_json": ("msgspec_json_decode", "cbcl_text_parse"),
    "binary_vs_msgspec_msgpack": ("msgspec_msgpack_decode", "cbcl_binary_decode"),
    "binary_encode_vs_msgspec_msgpack": ("msgspec_msgpack_encode", "cbcl_binary_encode"),
    "text_encode_vs_msgspec_json": ("msgspec_json_encode", "cbcl_text_encode"),
}


def _decoders(registry: Registry, decoder: Decoder) -> dict[str, Callable[[bytes], object]]:
    """Each of :data:`_MIXED_DECODERS` as a function of one input."""
    import msgspec

    def parse_text(text: bytes) -> object:
        return parse(text, registry=registry)

    out: dict[str, Callable[[bytes], object]] = {"cbcl_text_parse": parse_text,
                                                  "cbcl_binary_decode": decoder.decode}
    for decimals, suffix in ((Decimal, ""), (float, "_float")):
        peers = typed_peers(MIXED_PROTOCOL, decimals)
        if peers.msgspec_type is not None:
            out["msgspec_json_decode" + suffix] = msgspec.json.Decoder(peers.msgspec_type).decode
            out["msgspec_msgpack_decode" + suffix] = msgspec.msgpack.Decoder(
                peers.msgspec_type).decode
        if peers.pydantic is not None:
            out["pydantic_validate_json" + suffix] = peers.pydantic.model_validate_json
    return out


def _first_pass(function: Callable[[bytes], object], items: list[bytes]) -> float:
    """Seconds per item of one pass over ``items`` (collector off, as in :func:`compare`)."""
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        for item in items:
            function(item)
        return (time.perf_counter() - start) / len(items)
    finally:
        if enabled:
            gc.enable()


def _peak_per_byte(function: Callable[[bytes], object], item: bytes) -> float:
    """Peak bytes tracemalloc sees while ``function`` reads ``item``, per byte of it."""
    function(item)  # (warm: what a first call builds once is not the message's cost)
    tracemalloc.start()
    try:
        function(item)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak / len(item)


def mixed(registry: Registry, *, sizes: dict[str, tuple[int, int]], rounds: int,
          seconds: float, report: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """Per mixed size class (``sizes``: name → (messages per set, messages per first-pass
    set)): µs per message of every contender warm, each decoder's first pass over sets of
    never-seen names, the ratios (Decimal-holding peers; ``_float`` the float-holding ones;
    ``first_`` on first passes) and each decoder's parse-memory peak per input byte."""
    import msgspec

    encoder = Encoder(registry, validate=False)
    decoder = Decoder(registry)
    out: dict[str, dict[str, Any]] = {}
    for size, (count, fresh_count) in sizes.items():
        messages = mixed_messages(size, count, "warm")
        inputs = _inputs(messages, encoder)
        decoders = _decoders(registry, decoder)
        functions: dict[str, Callable[[], object]] = {
            name: _each(function, getattr(inputs, _MIXED_DECODERS[name][0]))
            for name, function in decoders.items()}
        read = [parse(text, registry=registry) for text in inputs.texts]  # or raises
        functions["cbcl_text_encode"] = _each(Message.canonical, read)
        functions["cbcl_binary_encode"] = _each(encoder.encode, read)
        for suffix in ("", "_float"):
            if "msgspec_json_decode" + suffix in decoders:
                objects = [decoders["msgspec_json_decode" + suffix](n) for n in inputs.naturals]
                functions["msgspec_json_encode" + suffix] = _each(msgspec.json.Encoder().encode,
                                                                  objects)
                functions["msgspec_msgpack_encode" + suffix] = _each(
                    msgspec.msgpack.Encoder().encode, objects)
        times = compare(functions, rounds=rounds, seconds=seconds)
        row: dict[str, Any] = {"messages": count, "first_pass_messages": fresh_count,
                               "bytes": round(sum(map(len, inputs.texts)) / count)}
        row.update({f"{name}_us": value / count * 1e6 for name, value in times.items()})
        row["peak_memory_per_byte"] = {
            name: _peak_per_byte(function, getattr(inputs, _MIXED_DECODERS[name][0])[0])
            for name, function in decoders.items()}
        del functions, read, inputs, messages
        # First passes: each decoder in each round reads a set of its own, of names no set
        # before had; then a wash set of as many names again goes through every decoder, so
        # no cache still holds a name of a set not yet read.
        fresh = {(name, r): _inputs(mixed_messages(size, fresh_count, f"{name}/{r}"), encoder)
                 for r in range(rounds) for name in decoders}
        wash = _inputs(mixed_messages(size, fresh_count * 2, "wash"), encoder)
        for name, function in decoders.items():
            for item in getattr(wash, _MIXED_DECODERS[name][0]):
                function(item)
        best = dict.fromkeys(decoders, math.inf)
        for r in range(rounds):
            for name, function in decoders.items():
                items = getattr(fresh[name, r], _MIXED_DECODERS[name][0])
                best[name] = min(best[name], _first_pass(function, items))
        row.update({f"first_{name}_us": value * 1e6 for name, value in best.items()})
        for ratio, (peer, ours) in MIXED_RATIOS.items():
            for suffix in ("", "_float"):
                if f"{peer}{suffix}_us" in row:
                    row[ratio + suffix] = row[f"{peer}{suffix}_us"] / row[f"{ours}_us"]
                if f"first_{peer}{suffix}_us" in row:
                    row[f"first_{ratio}{suffix}"] = (row[f"first_{peer}{suffix}_us"]
                                                     / row[f"first_{ours}_us"])
        for name in decoders:
            row[f"first_vs_warm_{name}"] = row[f"first_{name}_us"] / row[f"{name}_us"]
        out[f"{MIXED_PROTOCOL}/{size}"] = row
        report(f"  {MIXED_PROTOCOL}/{size} ({count} messages, {row['bytes']} B): text "
               f"{row['cbcl_text_parse_us']:.1f} µs (first pass "
               f"{row['first_cbcl_text_parse_us']:.1f}), binary "
               f"{row['cbcl_binary_decode_us']:.1f} µs (first pass "
               f"{row['first_cbcl_binary_decode_us']:.1f}); binary ×msgspec msgpack "
               f"{row.get('binary_vs_msgspec_msgpack', math.nan):.2f} (Decimal), "
               f"{row.get('binary_vs_msgspec_msgpack_float', math.nan):.2f} (float)")
        del fresh, wash
    return out


# --------------------------------------------------------------------------- the suite


def _worst(rows: dict[str, dict[str, Any]], key: str, size_classes: tuple[str, ...],
           lowest: bool = True) -> float | None:
    """The worst figure ``key`` over the rows of ``size_classes`` (``None``: no row has it,
    its peer is not installed)."""
    values: list[float] = [row[key] for name, row in rows.items()
                           if name.rsplit("/", 1)[1] in size_classes and key in row]
    if not values:
        return None
    return min(values) if lowest else max(values)


#: How much each mode measures: size classes, messages per set, how many of them the slow
#: peers read, interleaved rounds (a round is at least one pass over the set), seconds per
#: round, descriptor load repeats and grammar sizes, scaling sizes, rounds and seconds.
MODES: dict[str, dict[str, Any]] = {
    "full": {"sizes": ("small", "medium", "large"), "messages": MESSAGES, "subset": 200,
             "rounds": 15, "seconds": 0.04, "load_repeat": 3, "rules": (16, 64, 256),
             "scaling": (1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20),
             "scaling_rounds": 3, "scaling_seconds": 0.2,
             "mixed": {"mixed-4k": (1000, 200), "mixed-64k": (48, 12),
                       "mixed-4k-any-order": (200, 50)}},
    "quick": {"sizes": ("small", "medium"), "messages": MESSAGES, "subset": 100,
              "rounds": 3, "seconds": 0.04, "load_repeat": 1, "rules": (16, 64, 256),
              "scaling": (1 << 10, 16 << 10, 128 << 10, 1 << 20), "scaling_rounds": 2,
              "scaling_seconds": 0.05,
              "mixed": {"mixed-4k": (300, 60), "mixed-64k": (16, 6),
                        "mixed-4k-any-order": (60, 20)}},
    # For the test suite: every measurement once, as briefly as possible (not figures).
    "smoke": {"sizes": ("small", "medium"), "messages": {"small": 12, "medium": 4},
              "subset": 12, "rounds": 1, "seconds": 0.001, "load_repeat": 1, "rules": (16,),
              "scaling": (1 << 10, 16 << 10), "scaling_rounds": 1, "scaling_seconds": 0.001,
              "mixed": {"mixed-4k": (4, 2), "mixed-64k": (1, 1), "mixed-4k-any-order": (2, 1)}},
}


def run(*, quick: bool = False, descriptors: str | None = None, mode: str | None = None,
        report: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the suite; returns every figure, keyed by name (see :func:`markdown`)."""
    started = time.perf_counter()
    mode = mode or ("quick" if quick else "full")
    settings = MODES[mode]
    directory = find_descriptors(descriptors)
    registry = load_registry(directory)
    report(f"throughput (sets of different messages, {settings['rounds']} interleaved "
           "rounds)")
    results: dict[str, Any] = {
        "machine": machine(),
        "command": "cbcl bench" + ("" if mode == "full" else f" --{mode}"),
        "throughput": {}, "sizes": {}}
    for protocol in PROTOCOLS:
        for size in settings["sizes"]:
            # Each set is built just before it is measured and dropped after, so that every
            # contender's inputs (CBCL's messages, the peers' objects) come from the same
            # state of the heap.
            case = build_case(directory, registry, protocol, size, settings["messages"][size])
            results["throughput"].update(throughput(
                [case], registry, directory, rounds=settings["rounds"],
                seconds=settings["seconds"], subset=settings["subset"], report=report))
            results["sizes"].update(sizes([case], registry))
            del case
    report("mixed content, realistic vocabularies (warm and first pass)")
    results["mixed"] = mixed(registry, sizes=settings["mixed"], rounds=settings["rounds"],
                             seconds=settings["seconds"], report=report)
    report("descriptor loading")
    results["load"] = loading(directory, settings["load_repeat"], settings["rules"])
    report("scaling")
    results["scaling"] = scaling(registry, settings["scaling"],
                                 rounds=settings["scaling_rounds"],
                                 seconds=settings["scaling_seconds"])
    small_medium = ("small", "medium")
    rows = results["throughput"]
    achieved: dict[str, float | None] = {
        name: _worst(rows, name, small_medium) for name in TARGETS if name not in AT_MOST}
    achieved["binary_size_vs_json"] = _worst(results["sizes"], "binary_vs_json",
                                             ("small", "medium", "large"), lowest=False)
    achieved["warm_vs_cold_load"] = max(row["warm_vs_cold"] for row in results["load"].values())
    results["targets"] = {
        name: {"achieved": value, "target": TARGETS[name],
               "holds": None if value is None else value <= TARGETS[name] if name in AT_MOST
               else value >= TARGETS[name]}
        for name, value in ((name, achieved[name]) for name in TARGETS)}
    results["seconds"] = time.perf_counter() - started
    return results


def machine() -> dict[str, Any]:
    import lark

    return {"python": platform.python_version(),
            "implementation": platform.python_implementation(),
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "lark": lark.__version__,
            "msgpack": ".".join(map(str, msgpack.version)), "msgspec": _version("msgspec"),
            "pydantic": _version("pydantic"),
            "speedups": _codec.SPEEDUPS, "extensions": _extensions()}


def _extensions() -> list[str]:
    """Which of the optional C extensions are built."""
    import importlib

    built = []
    for name in ("_native",):
        try:
            importlib.import_module(f"cbcl.{name}")
        except ImportError:
            continue
        built.append(f"cbcl.{name}")
    return built


def _version(distribution: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


# --------------------------------------------------------------------------- output

_WORDING = {
    "text_vs_sexpdata": ("CBCL text parse (both passes) vs sexpdata.loads", "≥"),
    "text_vs_lark": ("CBCL text parse vs lark's plain LALR parse", "≥"),
    "binary_vs_text": ("CBCL binary decode vs CBCL text parse", "≥"),
    "text_vs_pydantic": ("CBCL text parse (both passes + schema) vs pydantic "
                         "model_validate_json", "≥"),
    "binary_vs_msgspec_msgpack": ("CBCL binary decode (reused Decoder) vs msgspec typed "
                                  "msgpack decode", "≥"),
    "binary_encode_vs_msgspec_msgpack": ("CBCL binary encode vs msgspec msgpack encode", "≥"),
    "text_encode_vs_msgspec_json": ("CBCL canonical text vs msgspec JSON encode", "≥"),
    "binary_size_vs_json": ("binary size vs the lossless JSON mapping (all sets)", "≤"),
    "warm_vs_cold_load": ("warm descriptor load vs cold", "≤"),
}


def _cells(row: dict[str, Any], keys: Iterable[str], suffix: str, digits: int) -> str:
    return " | ".join(f"{row[key + suffix]:.{digits}f}" if key + suffix in row else "–"
                      for key in keys)


def _table(out: list[str], rows: dict[str, dict[str, Any]], lead: list[tuple[str, str]],
           times: list[tuple[str, str]], ratios: list[tuple[str, str]]) -> None:
    """A table: the set, ``lead`` figures as they are, µs per message, then ratios."""
    out.append("| set | " + " | ".join(label for _, label in lead + times + ratios) + " |")
    out.append("|---|" + "---:|" * (len(lead) + len(times) + len(ratios)))
    for name, row in rows.items():
        cells = [str(row.get(key, "–")) for key, _ in lead]
        cells.append(_cells(row, (key for key, _ in times), "_us", 1))
        cells.append(_cells(row, (key for key, _ in ratios), "", 2))
        out.append(f"| {name} | " + " | ".join(cell for cell in cells if cell) + " |")


def markdown(results: dict[str, Any]) -> str:
    """The figures as markdown tables."""
    out = []
    m = results["machine"]
    built = m.get("extensions") or []
    extensions = (f"the C extensions {', '.join(built)} built" if built
                  else "no C extension built (pure Python)")
    out.append(f"`{results['command']}` on Python {m['python']}, {m['platform']}, "
               f"{m['cpus']} CPUs ({results['seconds']:.0f} s); {extensions}; msgspec "
               f"{m.get('msgspec') or 'missing'}, pydantic {m.get('pydantic') or 'missing'}.\n")
    missing = sorted({peer for row in results["throughput"].values()
                      for peer in row.get("missing", ())})
    if missing:
        out.append(f"Not installed, so not measured: {', '.join(missing)} "
                   "(`pip install 'cbcl[bench]'`).\n")
    out.append("**Targets** (worst case over the small and medium sets; ratios measured "
               "in the same run)\n")
    out.append("| target | achieved | wanted | holds |")
    out.append("|---|---|---|---|")
    for name, figure in results["targets"].items():
        label, sign = _WORDING[name]
        achieved = "missing" if figure["achieved"] is None else f"{figure['achieved']:.2f}×"
        holds = {True: "yes", False: "NO", None: "–"}[figure["holds"]]
        out.append(f"| {label} | {achieved} | {sign} {figure['target']:g}× | {holds} |")
    rows = results["throughput"]
    out.append("\n**Decoding**: µs per message (best of interleaved rounds, each a pass over "
               "the set); ratios are how many times faster CBCL is than the peer\n")
    _table(out, rows, [("messages", "messages"), ("bytes", "bytes")],
           [("cbcl_text_parse", "CBCL text"), ("cbcl_binary_decode", "CBCL binary"),
            ("cbcl_binary_decode_pure", "binary w/o speedups"),
            ("pydantic_validate_json", "pydantic JSON"), ("msgspec_json_decode", "msgspec JSON"),
            ("msgspec_msgpack_decode", "msgspec msgpack")],
           [("text_vs_pydantic", "text ×pydantic"), ("text_vs_msgspec_json", "text ×msgspec JSON"),
            ("binary_vs_msgspec_msgpack", "binary ×msgspec msgpack"),
            ("binary_vs_text", "binary ×text")])
    out.append("\n**Encoding**: µs per message; ratios as above\n")
    _table(out, rows, [],
           [("cbcl_text_encode", "CBCL canonical text"), ("cbcl_binary_encode", "CBCL binary"),
            ("pydantic_dump_json", "pydantic JSON"), ("msgspec_json_encode", "msgspec JSON"),
            ("msgspec_msgpack_encode", "msgspec msgpack")],
           [("text_encode_vs_pydantic", "text ×pydantic"),
            ("text_encode_vs_msgspec_json", "text ×msgspec JSON"),
            ("binary_encode_vs_msgspec_msgpack", "binary ×msgspec msgpack")])
    out.append("\n**Reference peers**: µs per message; sexpdata, lark and json+jsonschema "
               "read the first *subset* messages of each set, CBCL text parse timed on the "
               "same ones; msgpack and orjson (untyped: the value tree, the lossless JSON "
               "mapping) read every message\n")
    _table(out, rows, [("subset", "subset")],
           [("cbcl_text_parse_subset", "CBCL text"), ("sexpdata_loads", "sexpdata"),
            ("lark_parse", "lark"), ("json_loads_jsonschema", "json+jsonschema"),
            ("msgpack_unpackb", "msgpack"), ("orjson_loads", "orjson")],
           [("text_vs_sexpdata", "×sexpdata"), ("text_vs_lark", "×lark"),
            ("text_vs_json_loads_jsonschema", "×json+jsonschema")])
    _mixed_tables(out, results.get("mixed", {}))
    out.append("\n**Sizes** (mean bytes per message; ratios of the sums over the set)\n")
    columns = [("text", "text"), ("canonical", "canonical"), ("binary", "binary"),
               ("natural_json", "natural JSON"), ("natural_msgpack", "natural msgpack"),
               ("json", "lossless JSON"), ("msgpack", "msgpack")]
    ratios = [("binary_vs_natural_json", "binary/natural JSON"),
              ("binary_vs_natural_msgpack", "binary/natural msgpack"),
              ("binary_vs_json", "binary/lossless JSON"), ("binary_vs_msgpack", "binary/msgpack")]
    out.append("| set | " + " | ".join(label for _, label in columns + ratios) + " |")
    out.append("|---|" + "---:|" * (len(columns) + len(ratios)))
    for name, row in results["sizes"].items():
        out.append(f"| {name} | " + " | ".join(str(row[key]) for key, _ in columns) + " | "
                   + " | ".join(f"{row[key]:.3f}" for key, _ in ratios) + " |")
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


def _mixed_tables(out: list[str], rows: dict[str, dict[str, Any]]) -> None:
    """The mixed sets' tables (see :func:`mixed`)."""
    if not rows:
        return
    out.append("\n**Mixed content** (table/v1: rows of strings, integers, decimals, symbols, "
               "URIs, keyword members and lists; most names appear once). µs per message, "
               "warm (best of interleaved passes over one set) and *first pass* (one pass "
               "over a set no contender has read); peers hold decimals as `Decimal` "
               "(exact, as CBCL) and, in the *float* columns, as `float`\n")
    decoders = [("cbcl_text_parse", "CBCL text"), ("cbcl_binary_decode", "CBCL binary"),
                ("pydantic_validate_json", "pydantic"),
                ("pydantic_validate_json_float", "pydantic float"),
                ("msgspec_json_decode", "msgspec JSON"),
                ("msgspec_json_decode_float", "msgspec JSON float"),
                ("msgspec_msgpack_decode", "msgspec msgpack"),
                ("msgspec_msgpack_decode_float", "msgspec msgpack float")]
    for first in ("", "first_"):
        label = "first pass" if first else "warm"
        _table(out, {f"{name} ({label})": {
                   key.removeprefix(first): value for key, value in row.items()
                   if first == "" or key.startswith(first) or key == "bytes"}
                   for name, row in rows.items()},
               [("bytes", "bytes")], decoders,
               [("text_vs_pydantic", "text ×pydantic"),
                ("text_vs_pydantic_float", "text ×pydantic float"),
                ("text_vs_msgspec_json", "text ×msgspec JSON"),
                ("binary_vs_msgspec_msgpack", "binary ×msgspec msgpack"),
                ("binary_vs_msgspec_msgpack_float", "binary ×msgspec msgpack float")])
        out.append("")
    _table(out, rows, [], [("cbcl_text_encode", "CBCL canonical text"),
                           ("cbcl_binary_encode", "CBCL binary"),
                           ("msgspec_json_encode", "msgspec JSON"),
                           ("msgspec_msgpack_encode", "msgspec msgpack"),
                           ("msgspec_msgpack_encode_float", "msgspec msgpack float")],
           [("text_encode_vs_msgspec_json", "text ×msgspec JSON"),
            ("binary_encode_vs_msgspec_msgpack", "binary ×msgspec msgpack"),
            ("binary_encode_vs_msgspec_msgpack_float", "binary ×msgspec msgpack float")])
    out.append("\nFirst pass / warm, and peak memory of reading one message per byte of its "
               "input (tracemalloc)\n")
    names = [name for name, _ in decoders]
    out.append("| set | " + " | ".join(f"{label} first/warm" for _, label in decoders[:2])
               + " | " + " | ".join(f"{label} B/B" for _, label in decoders) + " |")
    out.append("|---|" + "---:|" * (2 + len(names)))
    for name, row in rows.items():
        memory = row["peak_memory_per_byte"]
        out.append(f"| {name} | " + " | ".join(
            f"{row[f'first_vs_warm_{n}']:.2f}" for n in names[:2]) + " | " + " | ".join(
            f"{memory[n]:.1f}" if n in memory else "–" for n in names) + " |")


def main(argv: list[str] | None = None) -> int:
    """``cbcl bench`` with ``argv``: its options are defined with the CLI's."""
    return cli_main(["bench", *(sys.argv[1:] if argv is None else argv)])


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


def mixed_messages_of(rows: int, count: int, seed: str, *, fresh: float = 0.8,
                      any_order: bool = False) -> list[Message]:
    """As :func:`mixed_messages`, with about ``rows`` rows per message (± a quarter of
    ``rows``, at most 2) instead of a size class's: the size classes of
    ``benchmarks/size_classes.py`` and the sets of ``benchmarks/cost_model.py``'s fit."""
    rng = random.Random(f"mixed-rows/{rows}/{any_order}/{seed}")
    # (jitter is at most a quarter of rows, so rows - jitter >= 0: least 0 bounds nothing)
    return _mixed_set(rng, Vocabulary(rng, fresh=fresh), rows, min(2, rows // 4), 0, count,
                      any_order)
