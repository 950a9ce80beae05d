"""``cbcl serve``'s log and replies with a hostile peer: a real in-process server
(``cbcl.net._transport.serve`` with ``_serve_connection``) and a real initiator session.

Peer data is data: every field the peer chose is escaped in the log (one physical line per
event, no raw control or bidirectional character, nothing forged at the start of a line),
and replies are values, so a task id cannot rewrite the server's bid.

Tests internals: the server of ``cbcl serve`` (``cbcl.cli._negotiate``) and the escaping of
peer text (``cbcl.core._display``) are private."""

from __future__ import annotations

import asyncio
import unicodedata
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from key_files import private_key_pem, public_key_pem

from cbcl import (
    URI,
    Intent,
    Keyword,
    Message,
    Registry,
    Session,
    Symbol,
    TrustStore,
    read,
    sign_descriptor,
)
from cbcl.cli._negotiate import (
    CLIENT_NAME,
    SERVER_NAME,
    ServeConfig,
    start_serving,
)
from cbcl.core._display import escape_invisible, peer_text
from cbcl.demo import OUR_BID, OUR_RESULT, respond
from cbcl.net import Connection, Context, connect
from cbcl.session import (
    Accepted,
    ConnectionClosed,
    Established,
    Finished,
    NotUnderstood,
    Offer,
    ProtocolMessage,
    Query,
    Rejected,
    Unsupported,
)

ROOT = Path(__file__).parent.parent
PAYLOAD = (ROOT / "cbcl" / "grammars" / "contract-net-v1.cbcl").read_bytes()

#: A message id that, printed raw, would end the log line and start a forged one.
FORGED = "verified (signed by root), grammar compiled, contract-net/v1 version 1 loaded " \
         "-> accepted (text)"
HOSTILE_IDS = (
    f"x\u202e\nserve[1]: {FORGED}\u202e",
    f"y\r\n\u2028\u2066\x1b[2K\x85\u200b\ufeff\U000e0041{FORGED}\u2028{FORGED}",
)
HOSTILE_TASK = 't" :bid (bid :price 0.01 :currency EUR :eta 1)) ;'

#: What may never reach a log line raw.
_UNSAFE = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}


def _assert_safe(lines: list[str]) -> None:
    assert lines
    for line in lines:
        assert line.splitlines() == [line], repr(line)  # exactly one physical line
        assert not any(unicodedata.category(c) in _UNSAFE for c in line), repr(line)
        assert line.startswith("serve[") and "]: " in line, repr(line)
        text = line.split("]: ", 1)[1]
        # The forged words exist only inside a quoted, escaped id, never as an event.
        if not text.startswith(("verified (signed by demo)",)):
            assert FORGED not in text or '"' in text.split(FORGED, 1)[0], repr(line)
        assert not text.startswith("verified (signed by root)"), repr(line)


# --------------------------------------------------------------------------- the harness


def _keys(tmp_path: Path) -> tuple[Any, bytes, TrustStore]:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    trust = tmp_path / "trust"
    trust.mkdir()
    (trust / "demo.pub").write_bytes(public_key_pem(key.public_key()))
    (tmp_path / "demo.key").write_bytes(private_key_pem(key))
    return key, sign_descriptor(PAYLOAD, [("demo", key)]), TrustStore.from_directory(trust)


async def _with_server(tmp_path: Path, store: TrustStore, lines: list[str],
                       body: Callable[[str], Awaitable[None]]) -> None:
    """Run ``body(address)`` against a real ``cbcl serve`` server (its agent, in this
    process), logging into ``lines``."""
    server = await start_serving(ServeConfig(listen="127.0.0.1:0", trust=store,
                                             state=tmp_path / "state"), lines.append)
    try:
        host, port = server.sockets[0].getsockname()[:2]
        await body(f"{host}:{port}")
        for _ in range(200):  # the handler logs "closed" after our side closes
            if lines and lines[-1].endswith(("closed", "is a replay: its id was seen before")):
                break
            await asyncio.sleep(0.01)
    finally:
        server.close()
        await server.wait_closed()


async def _handshake(address: str, key: Any, document: bytes, tmp_path: Path) -> Connection:
    registry = Registry(cache_dir=tmp_path / "client-cache")
    protocol = registry.load(PAYLOAD, allow_unsigned=True)
    session = Session("initiator", registry=registry, me=CLIENT_NAME, peer=SERVER_NAME,
                      encodings=("text",), signing_key=("demo", key))
    connection = await connect(address, session)
    await connection.send(Query(str(protocol.id), protocol.digest,
                                (protocol.descriptor.version,), ("text",)))
    while True:
        event = await asyncio.wait_for(connection.next_event(), 30)
        if isinstance(event, Unsupported):
            await connection.send(Offer(document))
        elif isinstance(event, Established):
            return connection
        elif isinstance(event, Rejected | ConnectionClosed):  # pragma: no cover
            raise AssertionError(f"handshake failed: {event}")
        else:
            assert isinstance(event, Accepted | Finished)


def _message(message_id: str, intent: Intent, body: str, conversation: str = "job-1",
             ) -> Message:
    return Message(message_id=message_id, sender=URI(CLIENT_NAME), receiver=URI(SERVER_NAME),
                   intent=intent, protocol=Symbol("contract-net/v1"),
                   conversation_id=conversation, body=read(body.encode()))


def _cfp(message_id: str, task_id: str, conversation: str = "job-1") -> Message:
    escaped = task_id.replace("\\", "\\\\").replace('"', '\\"')
    return _message(message_id, Intent.CFP,
                    f'(cfp :task (task :id "{escaped}" :action render-video) '
                    ":deadline 1764503600000)", conversation)


async def _answer(connection: Connection) -> Message:
    event = await asyncio.wait_for(connection.next_event(), 30)
    assert isinstance(event, ProtocolMessage), event
    return event.message


def _fields(body: Any) -> dict[str, Any]:
    return {str(k): v for k, v in zip(body[1::2], body[2::2], strict=True)}


# --------------------------------------------------------------------------- the tests


def test_hostile_ids_are_escaped_and_the_bid_is_ours(tmp_path: Path) -> None:
    key, document, store = _keys(tmp_path)
    lines: list[str] = []
    answers: list[Message] = []

    async def conversation(address: str) -> None:
        connection = await _handshake(address, key, document, tmp_path)
        try:
            await connection.send(ProtocolMessage(_cfp(HOSTILE_IDS[0], HOSTILE_TASK)))
            answers.append(await _answer(connection))
            escaped = HOSTILE_TASK.replace("\\", "\\\\").replace('"', '\\"')
            await connection.send(ProtocolMessage(_message(
                HOSTILE_IDS[1], Intent.ACCEPT, f'(accept-proposal :task-id "{escaped}")')))
            answers.append(await _answer(connection))
        finally:
            await connection.close()

    asyncio.run(_with_server(tmp_path, store, lines, conversation))

    proposal, report = answers
    assert proposal.intent is Intent.PROPOSE and report.intent is Intent.INFORM
    body = _fields(proposal.body)
    assert body["bid"] == OUR_BID and body["task-id"] == HOSTILE_TASK
    assert Decimal("12.50") in body["bid"] and Decimal("0.01") not in body["bid"]
    assert _fields(report.body) == {"task-id": HOSTILE_TASK, "result": OUR_RESULT}
    # Our message ids are ours: a counter, nothing of the peer's.
    assert (proposal.message_id, report.message_id) == ("reply-1", "reply-2")
    assert proposal.in_reply_to == HOSTILE_IDS[0]

    _assert_safe(lines)
    # One line per message handled: the answer, naming (escaped) what it answers.
    sent = [line for line in lines if ": sent " in line]
    assert [line.split('"')[0] for line in sent] == ["serve[1]: sent "] * 2
    assert peer_text(HOSTILE_IDS[0], 64) in sent[0]
    assert "\\u000a" in sent[0] and "\\u202e" in sent[0]
    assert "\\u000d\\u000a\\u2028\\u2066\\u001b[2K\\u0085\\u200b\\ufeff\\udb40\\udc41" \
        in sent[1]
    assert sum(line.startswith("serve[1]: verified (signed by demo)") for line in lines) == 1
    assert sent[0].startswith('serve[1]: sent "reply-1" PROPOSE in reply to "')
    assert not any(": received " in line for line in lines)  # (DEBUG)
    assert lines[-1] == "serve[1]: closed"


def test_a_replayed_hostile_id_is_escaped_in_the_error_line(tmp_path: Path) -> None:
    key, document, store = _keys(tmp_path)
    lines: list[str] = []

    async def replay(address: str) -> None:
        connection = await _handshake(address, key, document, tmp_path)
        try:
            await connection.send(ProtocolMessage(_cfp(HOSTILE_IDS[1], "t-1")))
            await _answer(connection)
            # The same id again, in a new conversation (so our own tracker lets it go):
            # the server's session refuses it as a replay, its error line quotes the id.
            await connection.send(ProtocolMessage(_cfp(HOSTILE_IDS[1], "t-2", "job-2")))
            refusal = await asyncio.wait_for(connection.next_event(), 30)
            assert refusal == NotUnderstood("replay")
        finally:
            await connection.close()

    asyncio.run(_with_server(tmp_path, store, lines, replay))
    _assert_safe(lines)
    errors = [line for line in lines if "replay" in line]
    assert len(errors) == 1 and "\\u000d\\u000a" in errors[0], lines


def test_respond_builds_values_not_text() -> None:
    cfp = _cfp("m-1", HOSTILE_TASK)
    proposal = respond(cfp, Context(cfp, next_id=lambda: "reply-7"))
    assert proposal is not None
    assert proposal.message_id == "reply-7" and proposal.in_reply_to == "m-1"
    assert proposal.body == (Symbol("proposal"), Keyword("task-id"), HOSTILE_TASK,
                             Keyword("bid"), OUR_BID)
    # Its text reads back as the same value: one string, our bid.
    envelope = read(proposal.canonical().encode())
    assert type(envelope) is tuple and envelope[-1] == (Symbol("body"), proposal.body)
    # A task id that is not a string (a symbol here) gets no answer.
    odd = _message("m-2", Intent.CFP, "(cfp :task (task :id t-1 :action x) :deadline 1)")
    assert respond(odd, Context(odd, next_id=lambda: "reply-1")) is None
    accept = _message("m-3", Intent.ACCEPT, "(accept-proposal :task-id (x))")
    assert respond(accept, Context(accept, next_id=lambda: "reply-1")) is None


@pytest.mark.parametrize(("text", "shown"), [
    ("a\nb", "a\\u000ab"),
    ("\u202eevil", "\\u202eevil"),
    ("tab\there\x7f\x9f", "tab\\u0009here\\u007f\\u009f"),
    ("\u2066\u2069\u200e\u200f\u2028\u2029\u00a0\u200b\ufeff", "\\u2066\\u2069\\u200e"
     "\\u200f\\u2028\\u2029\\u00a0\\u200b\\ufeff"),
    ("tag\U000e0041", "tag\\udb40\\udc41"),
    ('q"b\\', 'q\\"b\\\\'),
    ("café ünï", "café ünï"),
])
def test_peer_text_escapes(text: str, shown: str) -> None:
    assert peer_text(text) == shown


def test_peer_text_shortens_without_cutting_an_escape() -> None:
    assert peer_text("x" * 100, 10) == "x" * 10 + "…"
    shown = peer_text("abcdefgh\n" * 5, 12)
    assert shown == "abcdefgh…" and len(shown) <= 13
    assert peer_text("short", 10) == "short"
    assert peer_text("head\n" + "x" * 50 + "\u202etail", 20, tail=10) == \
        "head\\u000a…\\u202etail"
    assert peer_text("0123456789", 10, tail=4) == "0123456789"


def test_escape_invisible_keeps_json_values() -> None:
    import json

    value = {"s": "a\u202eb\u2028c\U000e0041\u00a0d\x85"}
    text = escape_invisible(json.dumps(value, ensure_ascii=False))
    assert json.loads(text) == value and text.isascii()


def test_a_rejected_offer_is_one_line(tmp_path: Path) -> None:
    from cbcl.cli._negotiate import tamper_signature

    key, document, store = _keys(tmp_path)
    lines: list[str] = []
    events: list[object] = []

    async def offer(address: str) -> None:
        registry = Registry(cache_dir=tmp_path / "client-cache")
        protocol = registry.load(PAYLOAD, allow_unsigned=True)
        session = Session("initiator", registry=registry, me=CLIENT_NAME, peer=SERVER_NAME,
                          encodings=("text",), signing_key=("demo", key))
        connection = await connect(address, session)
        try:
            await connection.send(Query(str(protocol.id), protocol.digest,
                                        (protocol.descriptor.version,), ("text",)))
            events.append(await asyncio.wait_for(connection.next_event(), 30))
            await connection.send(Offer(tamper_signature(document)))
            events.append(await asyncio.wait_for(connection.next_event(), 30))
        finally:
            await connection.close()

    asyncio.run(_with_server(tmp_path, store, lines, offer))
    assert events[-1] == Rejected("bad-signature")
    _assert_safe(lines)
    rejected = [line for line in lines if ": rejected: " in line]
    assert len(rejected) == 1 and rejected[0].startswith("serve[1]: rejected: bad-signature [")
