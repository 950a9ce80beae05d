"""``cbcl serve`` shares one refusal budget across its sessions (issue 36, item 2).

Each frame a served session refuses ends its connection and is charged to the peer's
address; after ``max_refusals`` of them within ``refusal_window`` seconds, that address's
connections are answered NOT-UNDERSTOOD ``limit`` (``max_refusals``) at their first frame,
unread, while other addresses are served (spec/negotiation.md §6.1). Attackers are raw
sockets bound to their own loopback addresses (``test_serve_attacks.Running.raw``); what is
asserted is what each side received and how many refusals were read — never a timing.

Tests internals: ``cbcl serve``'s server (``cbcl.cli._negotiate``) and the agent's budget.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from key_files import public_key_pem
from test_serve_attacks import (
    KEY,
    NOT_UNDERSTOOD,
    WAIT,
    Running,
    good_peer,
    initiator,
    query_frame,
    running,
    until_closed,
)

import cbcl
from cbcl.binary import frame
from cbcl.cli._negotiate import SERVER_OPTIONS, server_limits
from cbcl.net import ServerLimits
from cbcl.net._agent import Agent


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def refused_query(ip: str, versions: int = 1) -> bytes:
    """A QUERY (no key needed) whose ``:versions`` list holds ``versions`` integers and
    then a string, which the negotiation grammar refuses (the issue's attack: with 3,600
    sixteen-digit versions, a ~64 KB frame)."""
    text = query_frame(initiator(ip))[4:].decode()
    listed = " ".join(str(10 ** 15 + at) for at in range(versions))
    refused = re.sub(r":versions \(\d+\)", f':versions ({listed} "x")', text, count=1)
    assert refused != text
    return frame(refused.encode())


async def ask(srv: Running, ip: str, data: bytes) -> str:
    """Send ``data`` from ``ip`` and read to the end: ``answered`` if the server replied
    with anything but a NOT-UNDERSTOOD, else the NOT-UNDERSTOOD's reason code."""
    reader, writer = await srv.raw(ip)
    writer.write(data)
    if b"(intent QUERY)" in data and b'"x")' not in data:  # a good question: one answer
        size = int.from_bytes(await asyncio.wait_for(reader.readexactly(4), WAIT), "big")
        reply = await asyncio.wait_for(reader.readexactly(size), WAIT)
        writer.close()
        if NOT_UNDERSTOOD not in reply:
            return "answered"
    else:
        data = await until_closed(reader)
        writer.close()
        reply = data[4:4 + int.from_bytes(data[:4], "big")]
    message = cbcl.parse(reply, envelope_only=True)
    return str(message.body).split(":")[0]


def caps(**fields: Any) -> ServerLimits:
    fields.setdefault("refusal_window", 600.0)  # (no refusal ages out during a test)
    return ServerLimits(**fields)


def test_an_address_is_turned_away_after_max_refusals_and_others_are_served(
        tmp_path: Path) -> None:
    """N refused frames are each read and answered for their own reason; at N - 1 a good
    question from that address is still answered; after N it is answered ``limit``,
    unread, while another address is served."""
    async def scenario() -> None:
        async with running(tmp_path, server=caps(max_refusals=3)) as srv:
            good = query_frame(initiator("127.0.0.2"))
            assert [await ask(srv, "127.0.0.2", refused_query("127.0.0.2"))
                    for _ in range(2)] == ["malformed", "malformed"]
            assert await ask(srv, "127.0.0.2", good) == "answered"  # N - 1: served
            assert await ask(srv, "127.0.0.2", refused_query("127.0.0.2")) == "malformed"
            # N refusals: the next frame is refused unread, whatever it is
            assert await ask(srv, "127.0.0.2", good) == "limit"
            assert await ask(srv, "127.0.0.2", refused_query("127.0.0.2")) == "limit"
            assert await ask(srv, "127.0.0.3", good) == "answered"
            await good_peer(srv.address, tag="after")  # 127.0.0.1: a whole conversation
    asyncio.run(scenario())


def test_a_two_address_refusal_flood_is_dropped_and_a_good_peer_is_served(
        tmp_path: Path) -> None:
    """Two addresses send ~64 KB refused QUERYs as fast as they are answered while a good
    peer negotiates and runs its conversation three times: each flooder has exactly
    ``max_refusals`` frames read and refused (``malformed``), then only ``limit``; the good
    peer completes every time."""
    flood = {ip: refused_query(ip, versions=3600) for ip in ("127.0.0.2", "127.0.0.3")}
    assert all(60_000 < len(data) < 70_000 for data in flood.values())

    async def scenario() -> None:
        async with running(tmp_path, server=caps(max_refusals=5)) as srv:
            stop = asyncio.Event()

            async def flooder(ip: str) -> list[str]:
                codes: list[str] = []
                while not stop.is_set() or len(codes) < 12:
                    codes.append(await ask(srv, ip, flood[ip]))
                return codes

            floods = [asyncio.create_task(flooder(ip)) for ip in flood]
            await asyncio.sleep(0)
            for round_ in range(3):
                await good_peer(srv.address, tag=f"good-{round_}")
            stop.set()
            for codes in await asyncio.gather(*floods):
                assert codes[:5] == ["malformed"] * 5
                assert set(codes[5:]) == {"limit"}, codes
    asyncio.run(scenario())


def test_the_agent_charges_its_served_sessions_to_one_budget(tmp_path: Path) -> None:
    limits = ServerLimits(max_refusals=7, refusal_window=2.5)
    trust = tmp_path / "trust"
    trust.mkdir()
    (trust / "demo.pub").write_bytes(public_key_pem(KEY.public_key()))
    agent = Agent("agent://b", trust=trust, state=tmp_path / "state", server_limits=limits)
    first, second = agent._responder(), agent._responder()
    assert first.refusal_budget is second.refusal_budget is agent.refusals
    assert (agent.refusals.max_refusals, agent.refusals.window_ms) == (7, 2500)


@pytest.mark.parametrize(("field", "good", "bad"), [
    ("max_refusals", (1, 1024), (0, 1025, 2.0, True)),
    ("refusal_window", (0.001, 86_400), (0, -1.0, 86_401, float("nan"), float("inf"))),
])
def test_the_limits_are_checked(field: str, good: tuple[Any, ...],
                                bad: tuple[Any, ...]) -> None:
    for value in good:
        assert getattr(ServerLimits(**{field: value}), field) == value
    for value in bad:
        with pytest.raises(ValueError, match=field):
            ServerLimits(**{field: value})


def test_serve_takes_the_options() -> None:
    import argparse

    from cbcl.cli._negotiate import add_limit_options
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_limit_options(parser, SERVER_OPTIONS, ServerLimits())
    args = parser.parse_args(["--max-refusals", "1024", "--refusal-window", "0.5"])
    assert (server_limits(args).max_refusals, server_limits(args).refusal_window) == (1024, 0.5)
    defaults = server_limits(parser.parse_args([]))
    assert (defaults.max_refusals, defaults.refusal_window) == (16, 10.0)
    for argv in (["--max-refusals", "1025"], ["--max-refusals", "0"],
                 ["--refusal-window", "nan"]):
        with pytest.raises((argparse.ArgumentError, SystemExit)):
            parser.parse_args(argv)
