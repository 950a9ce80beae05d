"""Decoding into typed records (issue 32 item 2): cbcl's ``type=`` against msgspec
``Struct`` and pydantic models on the same content.

    python benchmarks/records.py [--messages N] [--rounds R] [--json FILE]

``N`` different lab-sample requests (1,000 by default: a sample id, a one-of assay, a
ranged priority, three nested line records, a note, a flag). cbcl decodes whole messages —
envelope, grammar and schema checked — into :class:`SampleRequest`
(``Decoder.decode(frame, type=…)``, ``cbcl.parse(text, type=…)``; both go from the C
decoder's message to the class's C converter without a Python frame between,
cbcl/_native_src/records.c's ``cbcl_record_of_decoded``), and, for the cost of the
conversion alone, without ``type=``, and the conversion itself: a decoded body into the
class by its C converter (the class's ``_from_body``) and by the Python reference
(``_from_body_python``).

The comparison is of whole messages, so that it is fair: the peers get the same message —
the envelope's fields (message id, sender and receiver URIs, intent, protocol) and the body
— as JSON (or that JSON's value packed as msgpack) and decode it into models of the
envelope *and* the body with the constraints the schema has (lengths, ranges, one-of
values, URIs matched by a pattern, the intent one of CBCL's, unknown fields refused):
msgspec ``Struct`` (``msgspec.msgpack.decode``/``msgspec.json.decode`` with ``type=``)
and pydantic (``model_validate_json``). The ratios printed are of those whole-message
figures. The peers' body-only decode (the body's fields alone, as before) is kept in the
table for information; it does less than CBCL does (no envelope) and is not the target's
measure. CBCL also checks the body against the protocol's LR(1) grammar, which the peers
have no counterpart for. Rounds are interleaved and the best is kept (µs per message);
ratios are from the same run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal

import msgspec
import pydantic

import cbcl


class Line(cbcl.Record):
    code: Annotated[str, cbcl.Length(1, 16)]
    qty: Annotated[int, cbcl.Range(1, 99)] = 1


class SampleRequest(cbcl.Record, intent="REQUEST"):
    sample_id: Annotated[str, cbcl.Length(1, 32)]
    assay: Literal["cbc", "hba1c", "lipids", "tsh"]
    priority: Annotated[int, cbcl.Range(1, 5)]
    lines: tuple[Line, ...] = ()
    note: Annotated[str, cbcl.Length(0, 256)] | None = None
    urgent: bool = False


class MLine(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    code: Annotated[str, msgspec.Meta(min_length=1, max_length=16)]
    qty: Annotated[int, msgspec.Meta(ge=1, le=99)] = 1


class MSample(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    sample_id: Annotated[str, msgspec.Meta(min_length=1, max_length=32)]
    assay: Literal["cbc", "hba1c", "lipids", "tsh"]
    priority: Annotated[int, msgspec.Meta(ge=1, le=5)]
    lines: tuple[MLine, ...] = ()
    note: Annotated[str, msgspec.Meta(max_length=256)] | None = None
    urgent: bool = False


class PLine(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(frozen=True, extra="forbid", strict=True)
    code: Annotated[str, pydantic.Field(min_length=1, max_length=16)]
    qty: Annotated[int, pydantic.Field(ge=1, le=99)] = 1


class PSample(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(frozen=True, extra="forbid", strict=True)
    sample_id: Annotated[str, pydantic.Field(min_length=1, max_length=32)]
    assay: Literal["cbc", "hba1c", "lipids", "tsh"]
    priority: Annotated[int, pydantic.Field(ge=1, le=5)]
    lines: tuple[PLine, ...] = ()
    note: Annotated[str, pydantic.Field(max_length=256)] | None = None
    urgent: bool = False


INTENTS = Literal["PROPOSE", "ACCEPT", "REJECT", "INFORM", "QUERY", "REQUEST", "CFP",
                  "SUBSCRIBE", "NOTIFY", "AGREE", "REFUSE", "FAILURE", "CANCEL", "CONFIRM",
                  "NOT-UNDERSTOOD"]
#: An agent URI as CBCL's reader takes one (cbcl/core/_vocabulary.py's URI_PATTERN).
URI = r"^[a-z][a-z0-9+.\-]*://[^\s()\x22;]+$"
SYMBOL = r"^[A-Za-z+\-*/<>=!?_.][A-Za-z0-9+\-*/<>=!?_.@%&:]*$"


class MEnvelope(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    message_id: Annotated[str, msgspec.Meta(min_length=1)]
    sender: Annotated[str, msgspec.Meta(pattern=URI)]
    receiver: Annotated[str, msgspec.Meta(pattern=URI)]
    intent: INTENTS
    protocol: Annotated[str, msgspec.Meta(pattern=SYMBOL)]
    body: MSample


class PEnvelope(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(frozen=True, extra="forbid", strict=True)
    message_id: Annotated[str, pydantic.Field(min_length=1)]
    sender: Annotated[str, pydantic.Field(pattern=URI)]
    receiver: Annotated[str, pydantic.Field(pattern=URI)]
    intent: INTENTS
    protocol: Annotated[str, pydantic.Field(pattern=SYMBOL)]
    body: PSample


def samples(n: int) -> list[SampleRequest]:
    assays = ("cbc", "hba1c", "lipids", "tsh")
    return [SampleRequest(sample_id=f"S-{i:06d}", assay=assays[i % 4],  # type: ignore[arg-type]
                          priority=1 + i % 5,
                          lines=tuple(Line(code=f"L{i % 7}{j}", qty=1 + (i + j) % 9)
                                      for j in range(3)),
                          note=None if i % 3 else f"note {i}", urgent=i % 2 == 0)
            for i in range(n)]


def natural(record: SampleRequest) -> dict[str, Any]:
    out: dict[str, Any] = {"sample_id": record.sample_id, "assay": record.assay,
                           "priority": record.priority,
                           "lines": [{"code": x.code, "qty": x.qty} for x in record.lines],
                           "urgent": record.urgent}
    if record.note is not None:
        out["note"] = record.note
    return out


def best(function: Callable[[Any], Any], items: Sequence[Any], best_so_far: float) -> float:
    start = time.perf_counter()
    for item in items:
        function(item)
    return min(best_so_far, (time.perf_counter() - start) / len(items) * 1e6)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    descriptor = cbcl.descriptor_from(SampleRequest, id="lab/v1", version=1)
    registry = cbcl.Registry()
    registry.load(descriptor, allow_unsigned=True)
    records = samples(args.messages)
    messages = [cbcl.Message(message_id=f"m{i}", sender="agent://lims", receiver="agent://lab",
                             intent="REQUEST", protocol="lab/v1", body=r)
                for i, r in enumerate(records)]
    texts = [m.canonical().encode() for m in messages]
    encoder, decoder = cbcl.Encoder(registry), cbcl.Decoder(registry)
    frames = [encoder.encode(m) for m in messages]
    jsons = [json.dumps(natural(r)).encode() for r in records]
    packs = [msgspec.msgpack.encode(natural(r)) for r in records]
    wholes = [{"message_id": f"m{i}", "sender": "agent://lims", "receiver": "agent://lab",
               "intent": "REQUEST", "protocol": "lab/v1", "body": natural(r)}
              for i, r in enumerate(records)]
    whole_jsons = [json.dumps(w).encode() for w in wholes]
    whole_packs = [msgspec.msgpack.encode(w) for w in wholes]
    for text, frame, record in zip(texts, frames, records, strict=True):  # (the same content)
        assert cbcl.parse(text, registry=registry, type=SampleRequest) == record
        assert decoder.decode(frame, type=SampleRequest) == record
    assert msgspec.msgpack.decode(packs[0], type=MSample).sample_id == records[0].sample_id
    assert PSample.model_validate_json(jsons[0]).sample_id == records[0].sample_id
    assert msgspec.msgpack.decode(whole_packs[0], type=MEnvelope).body.sample_id == \
        records[0].sample_id
    assert PEnvelope.model_validate_json(whole_jsons[0]).sender == "agent://lims"
    bodies = [decoder.decode(f).body for f in frames]
    cases: dict[str, tuple[Callable[[Any], Any], Sequence[Any]]] = {
        "body -> class, C converter": (getattr(SampleRequest, "_from_body"), bodies),  # noqa: B009
        "body -> class, Python reference": (
            getattr(SampleRequest, "_from_body_python"), bodies),  # noqa: B009
        "cbcl binary, type=SampleRequest": (
            lambda f: decoder.decode(f, type=SampleRequest), frames),
        "cbcl binary, Message only": (decoder.decode, frames),
        "msgspec msgpack, whole message": (
            lambda p: msgspec.msgpack.decode(p, type=MEnvelope), whole_packs),
        "msgspec msgpack, body only": (
            lambda p: msgspec.msgpack.decode(p, type=MSample), packs),
        "cbcl text, type=SampleRequest": (
            lambda t: cbcl.parse(t, registry=registry, type=SampleRequest), texts),
        "cbcl text, Message only": (lambda t: cbcl.parse(t, registry=registry), texts),
        "pydantic json, whole message": (PEnvelope.model_validate_json, whole_jsons),
        "pydantic json, body only": (PSample.model_validate_json, jsons),
        "msgspec json, whole message": (
            lambda j: msgspec.json.decode(j, type=MEnvelope), whole_jsons),
    }
    figures = {name: float("inf") for name in cases}
    for _ in range(args.rounds):
        for name, (function, items) in cases.items():
            figures[name] = best(function, items, figures[name])
    print(f"{args.messages} messages, best of {args.rounds} rounds (µs per message; "
          f"cbcl ~{sum(map(len, texts)) // len(texts)} B text / "
          f"~{sum(map(len, frames)) // len(frames)} B frames with the envelope, "
          f"peers ~{sum(map(len, whole_jsons)) // len(whole_jsons)} B JSON whole, "
          f"~{sum(map(len, jsons)) // len(jsons)} B body):")
    for name, figure in figures.items():
        print(f"  {name:34} {figure:8.2f}")
    binary_ratio = figures["msgspec msgpack, whole message"] / \
        figures["cbcl binary, type=SampleRequest"]
    text_ratio = figures["pydantic json, whole message"] / \
        figures["cbcl text, type=SampleRequest"]
    body_binary = figures["msgspec msgpack, body only"] / \
        figures["cbcl binary, type=SampleRequest"]
    body_text = figures["pydantic json, body only"] / figures["cbcl text, type=SampleRequest"]
    print(f"whole messages: cbcl binary is {binary_ratio:.2f}x msgspec's speed; cbcl text is "
          f"{text_ratio:.2f}x pydantic's (against the peers' body only: {body_binary:.2f}x, "
          f"{body_text:.2f}x)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({"figures": figures, "binary_vs_msgspec": binary_ratio,
                       "text_vs_pydantic": text_ratio, "binary_vs_msgspec_body": body_binary,
                       "text_vs_pydantic_body": body_text}, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
