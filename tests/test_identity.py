"""Who is speaking (spec/trust.md §4.1, spec/negotiation.md §5): keys bound to agent names.

One test per attack, python-tuf style: a trusted key bound to one name that claims another
is refused with its reason, the trusted state (state directory, learned protocols) is
exactly as before, and a good peer is served afterwards. Then the name patterns at their
edges (N matches, N+1 not), the default for stores that bind no key, a forged sender on an
established session — over TCP and over a real nats-server — and ``context.identity`` as a
real handler sees it over a real loopback connection.

Tests internals too: the pattern set (``cbcl.protocol._trust._NameSet``) against
:func:`cbcl.trust.name_matches`, and the NATS link's subjects (``NatsConnection``)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, strategies as st
from key_files import public_key_pem

import cbcl
from cbcl import (
    URI,
    Agent,
    Intent,
    Keyword,
    Message,
    NegotiationFailed,
    Registry,
    RemoteProtocolError,
    Session,
    Symbol,
    TrustError,
    TrustStore,
    read,
    sign_descriptor,
)
from cbcl.binary import frame
from cbcl.net import Context, connect
from cbcl.protocol._descriptor import read_descriptor
from cbcl.protocol._trust import _NameSet
from cbcl.session import (
    NEED_DATA,
    Established,
    Event,
    HandshakeState,
    NotUnderstood,
    Offer,
    Query,
    Unsupported,
)
from cbcl.session._reasons import error_code
from cbcl.trust import Identity, TrustPolicy, name_matches, name_pattern_problem, sign_message

ROOT = Path(__file__).parent.parent
PAYLOAD = (ROOT / "cbcl" / "grammars" / "contract-net-v1.cbcl").read_bytes()
DIGEST = "sha256:" + hashlib.sha256(PAYLOAD).hexdigest()
VERSION = read_descriptor(PAYLOAD).version
NOW = 1_764_500_000_000
SERVER = "agent://test/server"
CLIENT = "agent://test/client"
CFP_BODY = read(b'(cfp :task (task :id "t-1" :action render-video) :deadline 1764503600000)')
BID = (Symbol("bid"), Keyword("price"), read(b"7.25"), Keyword("currency"), Symbol("EUR"),
       Keyword("eta"), 10)
KEY_NAMES = ("author", "alice", "wide", "server", "mallory", "other")
#: alice speaks as the client, wide as any agent://test/NAME, server as the server,
#: mallory only as agent://test/mallory; author (who signs the descriptor) and other are
#: not bound: in a store whose policy binds keys, they speak as no agent. Any key may sign
#: any descriptor (the default rule, as without a policy).
BOUND_POLICY = """(trust-policy
  (default)
  (key alice (names agent://test/client))
  (key wide (names agent://test/*))
  (key server (names agent://test/server))
  (key mallory (names agent://test/mallory)))
"""
FAILED = "message verification failed"


def private(name: str) -> Ed25519PrivateKey:
    """A fixed test key per name (deterministic, so failures reproduce)."""
    return Ed25519PrivateKey.from_private_bytes(hashlib.sha256(f"id-{name}".encode()).digest())


def fingerprint(name: str) -> str:
    raw = private(name).public_key().public_bytes_raw()
    return "sha256:" + hashlib.sha256(raw).hexdigest()


SIGNED = sign_descriptor(PAYLOAD, [("author", private("author"))])


def trust_dir(directory: Path, policy: str | None = BOUND_POLICY) -> Path:
    """A trust directory: every key of :data:`KEY_NAMES`, and ``policy`` if given."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in KEY_NAMES:
        (directory / f"{name}.pub").write_bytes(public_key_pem(private(name).public_key()))
    if policy is not None:
        (directory / "policy.cbcl").write_text(policy)
    return directory


def store(policy: str | None = BOUND_POLICY) -> TrustStore:
    return TrustStore({name: private(name).public_key() for name in KEY_NAMES},
                      None if policy is None else TrustPolicy.parse(policy.encode()))


def message(sender: str = CLIENT, receiver: str = SERVER) -> Message:
    return Message(message_id="m-1", sender=sender, receiver=receiver, intent="CFP",
                   protocol="contract-net/v1", conversation_id="job-1", timestamp=NOW,
                   body=CFP_BODY)


def files_of(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` and its bytes (the state a refusal must not touch)."""
    if not directory.exists():
        return {}
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------- patterns

WILD = "agent://a/*"


@pytest.mark.parametrize(("name", "matches"), [
    ("agent://a/b", True),            # N: exactly one segment below the prefix
    ("agent://a/b-c.d_e~f@g:h", True),
    ("agent://a/é", True),            # non-ASCII is allowed in a URI, so in a segment
    ("agent://a", False),             # the prefix itself is not below it
    ("agent://a/", False),            # an empty segment
    ("agent://ab", False),            # agent://a is not a string prefix of agent://ab
    ("agent://ab/c", False),
    ("agent://a/b/c", False),         # N+1 segments: one wildcard is one segment
    ("agent://a//b", False),
    ("agent://a/.", False),           # dot segments a URI library would resolve away
    ("agent://a/..", False),
    ("agent://a/%2e%2e", False),      # percent-escapes a library would decode
    ("agent://a/b%2Fc", False),
    ("agent://a/b?c", False),         # a query or fragment is not a path segment
    ("agent://a/b#c", False),
    ("agent://a/b\\c", False),
    ("agent://a/*", False),           # the wildcard is not a name
    ("agent://A/b", False),           # URIs compare by code points (cbcl-1.0.md §1)
    ("agnt://a/b", False),
    ("xmpp://a/b", False),
])
def test_a_wildcard_matches_one_segment_and_nothing_else(name: str, matches: bool) -> None:
    assert name_matches(WILD, name) is matches
    assert (name in _NameSet([WILD])) is matches
    bound = store("(trust-policy (key alice (names agent://a/*)))")
    assert bound.may_speak_as("alice", name) is matches


@pytest.mark.parametrize(("name", "matches"), [
    ("agent://a/seller", True),
    ("agent://a/seller/", False),
    ("agent://a/sellers", False),
    ("agent://a/selle", False),
    ("agent://a/Seller", False),
    ("agent://a/./seller", False),
])
def test_an_exact_name_matches_only_itself(name: str, matches: bool) -> None:
    assert name_matches("agent://a/seller", name) is matches
    assert (name in _NameSet(["agent://a/seller"])) is matches


@pytest.mark.parametrize(("pattern", "problem"), [
    ("agent://a/b", None),
    ("agent://a/*", None),
    ("agent://a/b/*", None),
    ("xmpp://alice@example.org", None),
    ("not a uri", "not a URI"),
    ("agent://*", "no authority"),
    ("agent:///*", "no authority"),
    ("agent:///b", "no authority"),
    ("agent://a*/b", "'*' in the authority"),
    ("agent://a?x/*", "'?' in the authority"),
    ("agent://a/*/b", "a wildcard is only the last one"),
    ("agent://a/b*", "'*' in a path segment"),
    ("agent://a/**", "'*' in a path segment"),
    ("agent://a/", "an empty path segment"),
    ("agent://a//*", "an empty path segment"),
    ("agent://a/../*", "a '..' path segment"),
    ("agent://a/./b", "a '.' path segment"),
    ("agent://a/b%41", "'%' in a path segment"),
    ("agent://a/b?q", "'?' in a path segment"),
])
def test_what_a_name_pattern_may_be(pattern: str, problem: str | None) -> None:
    found = name_pattern_problem(pattern)
    assert (found is None) if problem is None else (found is not None and problem in found)


_SEGMENT = st.text(alphabet="ab./%?#*\\-", max_size=4)


@given(prefix=st.lists(st.sampled_from(["a", "b", "."]), max_size=2),
       wild=st.booleans(), name=st.lists(_SEGMENT, max_size=4))
def test_the_pattern_set_agrees_with_name_matches(prefix: list[str], wild: bool,
                                                  name: list[str]) -> None:
    pattern = "agent://h" + "".join("/" + s for s in prefix) + ("/*" if wild else "")
    candidate = "agent://h" + "".join("/" + s for s in name)
    if name_pattern_problem(pattern) is not None:
        return
    assert (candidate in _NameSet([pattern])) is name_matches(pattern, candidate)


class Disguised(str):
    """A name whose methods lie: it says it is the client and equal to anything."""

    def __str__(self) -> str:
        return CLIENT

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = str.__hash__

    def startswith(self, *args: Any, **kwargs: Any) -> bool:
        return True


def test_a_name_is_read_as_its_characters_not_its_methods() -> None:
    bound = store()
    admin = Disguised("agent://test/a/b")
    assert not name_matches("agent://test/*", admin)
    assert not name_matches(CLIENT, admin)
    assert admin not in _NameSet([CLIENT, "agent://test/*"])
    assert not bound.may_speak_as("alice", admin)
    with pytest.raises(TrustError) as caught:
        bound.identity("alice", admin)
    assert caught.value.cause == "name-binding"
    # What is checked is what is kept: the identity holds the characters.
    assert bound.identity("wide", Disguised("agent://test/x")).name == URI("agent://test/x")
    with pytest.raises(TypeError):
        name_matches("agent://a", 7)  # type: ignore[arg-type]


@given(st.text(alphabet="agent:/.*%?#\\éAb-", max_size=24))
def test_any_names_clause_is_a_policy_or_a_trust_error(text: str) -> None:
    """The fuzz invariant for the new entry: whatever a (names …) clause holds, the policy
    is read or refused with a TrustError; what is read is a valid pattern."""
    document = f"(trust-policy (key alice (names {text})))".encode()
    try:
        policy = TrustPolicy.parse(document)
    except TrustError:
        return
    for pattern in policy.names["alice"]:
        assert name_pattern_problem(pattern) is None
        assert name_matches(pattern, pattern) is not pattern.endswith("/*")


# --------------------------------------------------------------------------- the policy


def test_a_policy_binds_keys_to_names() -> None:
    bound = store()
    assert bound.policy.binds_names
    assert bound.names_for("wide") == ("agent://test/*",)
    assert bound.names_for("author") == ()  # not bound: speaks as no agent
    assert bound.names_for("nobody") == ()
    assert bound.may_speak_as("alice", CLIENT) and not bound.may_speak_as("alice", SERVER)
    assert bound.may_speak_as("wide", SERVER) and bound.may_speak_as("wide", CLIENT)
    assert not bound.may_speak_as("author", CLIENT)
    assert not bound.may_speak_as("nobody", CLIENT)
    assert bound.identity("alice", CLIENT) == Identity(
        "alice", fingerprint("alice"), URI(CLIENT), ("agent://test/client",))


def test_policy_names_from_a_trust_directory(tmp_path: Path) -> None:
    policy = ('(trust-policy (protocol contract-net/v1 (keys author))\n'
              '  (key "alice" (names agent://test/client agent://test/client agent://x/*))\n'
              '  (key mallory (names)))')
    loaded = TrustStore.from_directory(trust_dir(tmp_path / "trust", policy))
    assert loaded.names_for("alice") == ("agent://test/client", "agent://x/*")
    assert loaded.names_for("mallory") == ()  # (names): bound to no name
    assert loaded.policy.rule_for("contract-net/v1") is not None


@pytest.mark.parametrize(("policy", "fragment"), [
    ('(trust-policy (key alice (names "agent://a")))', "is not an agent URI"),
    ("(trust-policy (key alice (names seller)))", "is not an agent URI"),
    ("(trust-policy (key alice (names agent://*)))", "no authority"),
    ("(trust-policy (key alice (names agent://a/*/b)))", "a wildcard is only the last"),
    ("(trust-policy (key alice (names agent://a/../*)))", "'..' path segment"),
])
def test_policy_pattern_refusals(tmp_path: Path, policy: str, fragment: str) -> None:
    with pytest.raises(TrustError) as caught:
        TrustStore.from_directory(trust_dir(tmp_path / "trust", policy))
    assert caught.value.message == "trust store refused"
    assert fragment in caught.value.reason, caught.value.reason


def test_a_policy_made_in_python_is_checked() -> None:
    assert TrustPolicy(names={"alice": ["agent://b", "agent://a"]}).names == {
        "alice": ("agent://a", "agent://b")}
    with pytest.raises(ValueError, match="not a name pattern"):
        TrustPolicy(names={"alice": ["agent://a/*/b"]})
    with pytest.raises(ValueError, match="not a key id"):
        TrustPolicy(names={".alice": ["agent://a"]})
    with pytest.raises(TypeError):
        TrustPolicy(names={"alice": "agent://a"})


def test_two_ids_of_one_key_share_its_names() -> None:
    """Key ids are hints: the key's holder can sign under either id, so the key may speak
    as the names bound to any of them, under any of them."""
    key = private("alice").public_key()
    both = TrustStore({"alice": key, "alias": key},
                      TrustPolicy.parse(b"(trust-policy (key alice (names agent://a)) "
                                        b"(key alias (names agent://b)))"))
    for key_id in ("alice", "alias"):
        assert both.names_for(key_id) == ("agent://a", "agent://b")
        assert both.may_speak_as(key_id, "agent://a") and both.may_speak_as(key_id, "agent://b")


# --------------------------------------------------------------------------- the default


def test_a_store_that_binds_no_key_lets_every_key_speak_as_any_name() -> None:
    """Every store written before bindings existed: unchanged, and an identity says that
    its name is only the key holder's claim (``names`` is ``None``)."""
    for unbound in (store(None), store("(trust-policy (default))")):
        assert not unbound.policy.binds_names
        assert unbound.names_for("author") is None
        assert unbound.may_speak_as("author", "agent://anything/at-all")
        identity = unbound.verify_identity(sign_message(message(), private("other"), "other"))
        assert identity == Identity("other", fingerprint("other"), URI(CLIENT), None)
        assert not identity.bound and identity.may_speak_as("agent://else")


def test_once_a_key_is_bound_an_unbound_key_speaks_as_no_agent() -> None:
    bound = store()
    signed = sign_message(message(sender="agent://test/unclaimed"), private("other"), "other")
    with pytest.raises(TrustError) as caught:
        bound.verify_message(signed)
    assert caught.value.cause == "name-binding"
    assert "the trust policy binds the key to no name" in caught.value.reason
    assert error_code(caught.value) == "untrusted-signer"


# --------------------------------------------------------------------------- signed messages


def test_a_signed_message_whose_key_is_not_bound_to_its_sender_is_refused() -> None:
    """The attack of §10 "sender binding": a trusted key signs a message as another agent.
    Refused by every parse with the store, before the signature is even checked."""
    registry = Registry(trust=store(), disk_cache=False, isolate=False)
    registry.load(PAYLOAD, allow_unsigned=True)
    forged = sign_message(message(sender=CLIENT), private("mallory"), "mallory")
    for data in (forged.canonical().encode(), cbcl.encode(forged, registry=registry)):
        with pytest.raises(TrustError) as caught:
            if data[:2] == b"\xcbL":
                cbcl.decode(data, registry=registry)
            else:
                cbcl.parse(data, registry=registry)
        assert caught.value.message == FAILED
        assert caught.value.cause == "name-binding"
        assert "not bound to the name 'agent://test/client' (the key is bound to " \
               "'agent://test/mallory')" in caught.value.reason
    # The same key, as itself, and a wildcard key as the client, are accepted.
    own = sign_message(message(sender="agent://test/mallory"), private("mallory"), "mallory")
    assert cbcl.parse(own.canonical().encode(), registry=registry) == own
    wide = sign_message(message(sender=CLIENT), private("wide"), "wide")
    assert registry.trust is not None
    assert registry.trust.verify_identity(wide).names == ("agent://test/*",)


# --------------------------------------------------------------------------- sessions


def initiator(key_id: str, me: str = CLIENT, peer: str = SERVER,
              trust: TrustStore | None = None) -> Session:
    registry = Registry(trust=trust, disk_cache=False, isolate=False)
    registry.load(PAYLOAD, allow_unsigned=True)
    return Session("initiator", registry=registry, me=me, peer=peer, encodings=("text",),
                   signing_key=(key_id, private(key_id)),
                   require_signed_finished=trust is not None)


def responder(trust: TrustStore, state: Path | None = None, key_id: str = "server") -> Session:
    registry = Registry(trust=trust, state_dir=state, disk_cache=False, isolate=False)
    return Session("responder", registry=registry, me=SERVER, require_signed_finished=True,
                   signing_key=(key_id, private(key_id)))


def feed(to: Session, data: bytes) -> list[Event]:
    to.receive_data(data)
    events: list[Event] = []
    while (event := to.next_event(now=NOW)) is not NEED_DATA:
        assert isinstance(event, Event), event
        events.append(event)
        if isinstance(event, NotUnderstood):  # the end of the session
            break
    return events


def handshake(a: Session, b: Session) -> list[Event]:
    """Run the handshake (asking, offering when told unsupported); returns A's events.
    A refusal raises the refusing side's :class:`RemoteProtocolError`."""
    got = feed(b, a.send(Query("contract-net/v1", DIGEST, (VERSION,), ("text",)), now=NOW))
    events: list[Event] = []
    while True:
        to_a, to_b = b.data_to_send(), a.data_to_send()
        if not to_a and not to_b:
            return events
        if to_a:
            got = feed(a, to_a)
            events += got
            if any(isinstance(e, Unsupported) for e in got):
                feed(b, a.send(Offer(SIGNED), now=NOW))
        if to_b:
            feed(b, to_b)


def test_a_finished_by_a_key_bound_to_another_name_is_refused(tmp_path: Path) -> None:
    """mallory's key is trusted, bound to agent://test/mallory; it claims to be the client.
    The offer verifies (the author signed it), the Finished does not: untrusted-signer,
    nothing recorded, and the session has no identity."""
    state = tmp_path / "state"
    a, b = initiator("mallory"), responder(store(), state)
    with pytest.raises(RemoteProtocolError) as caught:
        handshake(a, b)
    assert caught.value.code == "untrusted-signer" and caught.value.exit_code == 6
    cause = caught.value.__cause__
    assert isinstance(cause, TrustError) and cause.cause == "name-binding"
    assert "not bound to the name 'agent://test/client'" in cause.reason
    assert b.state is HandshakeState.ERROR and b.identity is None
    assert files_of(state) == {}  # the accepted offer was never recorded
    assert feed(a, b.data_to_send()) == [NotUnderstood("untrusted-signer")]
    # The same responder's trust and state serve the good peer afterwards.
    good_a, good_b = initiator("alice"), responder(store(), state)
    assert any(isinstance(e, Established) for e in handshake(good_a, good_b))
    assert good_b.identity == Identity("alice", fingerprint("alice"), URI(CLIENT),
                                       ("agent://test/client",))
    assert [name for name in files_of(state) if name.endswith(".json")] \
        == ["contract-net%2Fv1.json"]


def test_a_responder_whose_key_is_not_bound_to_its_name_is_refused() -> None:
    """The same attack on the other side: a trusted key answering as a server it is not.
    An initiator with a trust store refuses the responder's Finished."""
    a = initiator("alice", trust=store())
    b = responder(store(), key_id="mallory")
    with pytest.raises(RemoteProtocolError) as caught:
        handshake(a, b)
    assert caught.value.code == "untrusted-signer"
    assert a.identity is None and a.state is HandshakeState.ERROR
    # Bound to the server's name, it is who A asked for.
    a, b = initiator("alice", trust=store()), responder(store(), key_id="server")
    handshake(a, b)
    assert a.identity is not None and a.identity.name == URI(SERVER)
    assert a.identity.key_id == "server" and b.identity is not None


def test_a_forged_sender_on_an_established_session_is_refused() -> None:
    """wide may speak as any agent://test/NAME — in a session, only as the one it proved:
    a message from another name, signed by wide itself, is refused (malformed)."""
    a, b = initiator("wide"), responder(store())
    handshake(a, b)
    assert b.identity is not None and b.identity.name == URI(CLIENT)
    forged = Message(message_id="f-1", sender="agent://test/admin", receiver=SERVER,
                     intent="CFP", protocol="contract-net/v1", conversation_id="job-1",
                     timestamp=NOW, body=CFP_BODY)
    forged = sign_message(forged, private("wide"), "wide")
    assert store().verify_identity(forged).name == URI("agent://test/admin")  # valid on its own
    with pytest.raises(RemoteProtocolError) as caught:
        feed(b, frame(forged.canonical().encode()))
    assert caught.value.code == "malformed"
    assert "this session is between agent://test/client and" in caught.value.message
    assert b.tracker is not None and b.tracker.conversations() == ()  # nothing handled


def test_an_unbound_key_keeps_the_name_it_proved_for_the_session() -> None:
    """The default for a store that binds no key: any name, but only the one proved in the
    Finished for the whole session."""
    a, b = initiator("other"), responder(store(None))
    handshake(a, b)
    assert b.identity == Identity("other", fingerprint("other"), URI(CLIENT), None)
    switched = Message(message_id="s-1", sender="agent://test/other-name", receiver=SERVER,
                       intent="CFP", protocol="contract-net/v1", conversation_id="job-1",
                       timestamp=NOW, body=CFP_BODY)
    with pytest.raises(RemoteProtocolError) as caught:
        feed(b, frame(switched.canonical().encode()))
    assert caught.value.code == "malformed"


def test_an_unsigned_finished_proves_nobody() -> None:
    """An initiator without a trust store does not verify the responder: no identity."""
    a = initiator("alice")  # no trust store: the responder's Finished is not verified
    b = responder(store())
    handshake(a, b)
    assert a.state is HandshakeState.ESTABLISHED and a.identity is None
    assert b.identity is not None and b.identity.key_id == "alice"


# --------------------------------------------------------------------------- over loopback


def run(body: Callable[[], Awaitable[Any]], timeout: float = 60.0) -> Any:
    """Run ``body`` on a fresh loop with a deadline; anything asyncio would only log fails
    the test."""
    stray: list[dict[str, Any]] = []

    async def main() -> Any:
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: stray.append(ctx))
        async with asyncio.timeout(timeout):
            return await body()

    result = asyncio.run(main())
    assert not stray, stray
    return result


class Server:
    """A serving agent whose handler records what it saw: each message's sender and the
    context's identity, and answers a CFP with a proposal."""

    def __init__(self, tmp_path: Path, policy: str | None = BOUND_POLICY) -> None:
        self.trust = trust_dir(tmp_path / "trust", policy)
        self.state = tmp_path / "state"
        self.seen: list[tuple[str, Identity | None]] = []
        self.log: list[str] = []
        self.agent = Agent(SERVER, key=("server", private("server")), trust=self.trust,
                           state=self.state, handler=self.handle, log=self.log.append)

    def handle(self, message: Message, context: Context) -> Message | None:
        self.seen.append((str(message.sender), context.identity))
        if message.intent is not Intent.CFP:
            return None
        return context.reply(Intent.PROPOSE, (Symbol("proposal"), Keyword("task-id"), "t-1",
                                              Keyword("bid"), BID))

    async def address(self) -> str:
        server = await self.agent.serve("127.0.0.1:0")
        host, port = server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"


@contextlib.asynccontextmanager
async def client(name: str, key_id: str, trust: Path | None = None
                 ) -> AsyncIterator[Agent]:
    agent = Agent(name, key=(key_id, private(key_id)), trust=trust)
    try:
        yield agent
    finally:
        await agent.close()


async def cfp_round(agent: Agent, address: str) -> Message | None:
    link = await agent.connect(address, peer=SERVER, descriptor=SIGNED)
    return await link.conversation().send(Intent.CFP, CFP_BODY)


@pytest.mark.slow
def test_over_loopback_a_key_claiming_another_agent_is_refused(tmp_path: Path) -> None:
    served = Server(tmp_path)

    async def body() -> None:
        try:
            address = await served.address()
            before = files_of(served.state)
            async with client(CLIENT, "mallory") as mallory:
                with pytest.raises(NegotiationFailed) as caught:
                    await mallory.connect(address, peer=SERVER, descriptor=SIGNED)
            assert caught.value.reason == "untrusted-signer"
            assert caught.value.exit_code == 6
            # Refused: the handler never ran, nothing was learned or recorded.
            assert served.seen == [] and len(served.agent.learned) == 0
            assert files_of(served.state) == before
            # A good peer is served afterwards, and its handler knows who it is.
            async with client(CLIENT, "alice") as alice:
                reply = await cfp_round(alice, address)
            assert reply is not None and reply.intent is Intent.PROPOSE
            assert len(served.agent.learned) == 1
        finally:
            await served.agent.close()

    run(body)
    refused = [line for line in served.log if "untrusted" in line or "not bound" in line]
    assert refused and "not bound to the name 'agent://test/client'" in refused[0], served.log
    assert served.seen == [(CLIENT, Identity("alice", fingerprint("alice"), URI(CLIENT),
                                             ("agent://test/client",)))]
    assert any("established contract-net/v1 in binary with agent://test/client (key alice)"
               in line for line in served.log), served.log


@pytest.mark.slow
def test_a_real_handler_sees_the_unbound_default(tmp_path: Path) -> None:
    """A store that binds no key (every store before bindings): the handler still learns
    the verified key, and that the name is only the key holder's claim."""
    served = Server(tmp_path, policy=None)

    async def body() -> None:
        try:
            address = await served.address()
            async with client(CLIENT, "other") as other:
                assert await cfp_round(other, address) is not None
        finally:
            await served.agent.close()

    run(body)
    assert served.seen == [(CLIENT, Identity("other", fingerprint("other"), URI(CLIENT),
                                             None))]
    assert any("(key other, name not bound by the trust policy)" in line
               for line in served.log), served.log


@pytest.mark.slow
def test_a_client_refuses_a_server_that_is_not_bound_to_its_name(tmp_path: Path) -> None:
    """A trusted key serving under the server's name: a client whose store binds names
    refuses its Finished, and never sends a protocol message."""
    trust = trust_dir(tmp_path / "trust")
    impostor = Agent(SERVER, key=("mallory", private("mallory")), trust=trust,
                     handler=lambda message, context: None)

    async def body() -> None:
        try:
            server = await impostor.serve("127.0.0.1:0")
            host, port = server.sockets[0].getsockname()[:2]
            async with client(CLIENT, "alice", trust=trust) as alice:
                with pytest.raises(cbcl.ConversationClosed) as caught:
                    await alice.connect(f"{host}:{port}", peer=SERVER, descriptor=SIGNED)
            assert caught.value.reason == "untrusted-signer"
        finally:
            await impostor.close()

    run(body)


async def raw_session(address: str, key_id: str, me: str = CLIENT) -> Any:
    """A connection whose session completed the handshake as ``me``, in text, driven by
    hand so that the test can then write any bytes it likes."""
    session = initiator(key_id, me=me)
    connection = await connect(address, session)
    await connection.send(Query("contract-net/v1", DIGEST, (VERSION,), ("text",)))
    while True:
        event = await connection.next_event()
        if isinstance(event, Unsupported):
            await connection.send(Offer(SIGNED))
        elif isinstance(event, Established):
            return connection


@pytest.mark.slow
def test_over_loopback_a_forged_sender_on_an_established_session_is_refused(
        tmp_path: Path) -> None:
    """wide proves agent://test/client, then writes a CFP from agent://test/admin — a name
    its key may use in a session of its own — signed by itself: the server refuses it
    (malformed), the handler never sees it, and the server goes on serving."""
    served = Server(tmp_path)

    async def body() -> None:
        try:
            address = await served.address()
            connection = await raw_session(address, "wide")
            forged = sign_message(Message(
                message_id="f-1", sender="agent://test/admin", receiver=SERVER, intent="CFP",
                protocol="contract-net/v1", conversation_id="job-9",
                timestamp=int(time.time() * 1000), body=CFP_BODY), private("wide"), "wide")
            connection.writer.write(frame(forged.canonical().encode()))
            await connection.writer.drain()
            assert await connection.next_event() == NotUnderstood("malformed")
            await connection.close()
            assert served.seen == []
            async with client(CLIENT, "alice") as alice:
                assert await cfp_round(alice, address) is not None
        finally:
            await served.agent.close()

    run(body)
    assert [sender for sender, _ in served.seen] == [CLIENT]
    assert any("this session is between agent://test/client and agent://test/server" in line
               for line in served.log), served.log


# --------------------------------------------------------------------------- over NATS


@pytest.fixture(scope="module")
def nats_url() -> Iterator[str]:
    nats_fixtures = pytest.importorskip("nats_fixtures")
    with nats_fixtures.nats_server() as node:
        yield node.url


@pytest.mark.slow
def test_over_nats_a_key_claiming_another_agent_and_a_forged_sender(
        tmp_path: Path, nats_url: str) -> None:
    """The same attacks over a real nats-server: mallory's Finished as the client is
    refused; wide's CFP from another name on an established session's subject is refused
    (malformed) and ends that session; a good peer is served throughout."""
    nats = pytest.importorskip("nats")
    from cbcl.net import NatsBus
    from cbcl.net._nats import NatsConnection

    served = Server(tmp_path)

    async def body() -> None:
        buses: list[NatsBus] = []
        watcher = await nats.connect(nats_url)
        try:
            server_bus = await NatsBus.connect(served.agent, nats_url)
            buses.append(server_bus)
            await server_bus.serve()
            mallory = await NatsBus.connect(
                Agent(CLIENT, key=("mallory", private("mallory"))), nats_url)
            buses.append(mallory)
            with pytest.raises(NegotiationFailed) as caught:
                await mallory.open_link(SERVER, descriptor=SIGNED)
            assert caught.value.reason == "untrusted-signer"
            assert len(served.agent.learned) == 0

            wide = await NatsBus.connect(Agent(CLIENT, key=("wide", private("wide"))),
                                         nats_url)
            buses.append(wide)
            link = await wide.open_link(SERVER, descriptor=SIGNED, encodings=("text",))
            assert link.encoding == "text"
            connection = link.connection
            assert isinstance(connection, NatsConnection)
            forged = sign_message(Message(
                message_id="f-1", sender="agent://test/admin", receiver=SERVER, intent="CFP",
                protocol="contract-net/v1", conversation_id="job-9",
                timestamp=int(time.time() * 1000), body=CFP_BODY), private("wide"), "wide")
            # On the conversation's own subject of the established session, as its peer.
            await watcher.publish(f"{connection.out_subject}.job-9",
                                  forged.canonical().encode())
            await watcher.flush()
            async with asyncio.timeout(10):
                assert await link.closed == "malformed"
            assert served.seen == []

            alice = await NatsBus.connect(Agent(CLIENT, key=("alice", private("alice"))),
                                          nats_url)
            buses.append(alice)
            good = await alice.open_link(SERVER, descriptor=SIGNED)
            reply = await good.conversation().send(Intent.CFP, CFP_BODY)
            assert reply is not None and reply.intent is Intent.PROPOSE
        finally:
            await watcher.close()
            for bus in reversed(buses):
                await bus.close()
                await bus.agent.close()

    run(body)
    assert served.seen == [(CLIENT, Identity("alice", fingerprint("alice"), URI(CLIENT),
                                             ("agent://test/client",)))]


REQUEST = (ROOT / "descriptors" / "request-v1.cbcl").read_bytes()
SIGNED_REQUEST = sign_descriptor(REQUEST, [("author", private("author"))])
REQUEST_BODY = read(b'(request :action (action :name snapshot-volume :args (:volume "vol-9"))'
                    b" :by 1764540000000)")


@pytest.mark.slow
def test_over_nats_a_durable_message_has_the_identity_of_its_signature(
        tmp_path: Path, nats_url: str) -> None:
    """No session vouches for a durable message's sender, only its signature: alice's
    signed request reaches the handler with alice's identity, an unsigned one with none,
    and mallory's, signed as the client, is terminated unhandled."""
    pytest.importorskip("nats")
    from cbcl.net import NatsBus

    durable = "agent://test/durable"
    seen: list[tuple[str, Identity | None]] = []

    def handler(message: Message, context: Context) -> None:
        seen.append((message.message_id, context.identity))

    receiver = Agent(durable, trust=trust_dir(tmp_path / "trust"), state=tmp_path / "state",
                     descriptors=[SIGNED_REQUEST], handler=handler)

    async def body() -> None:
        inbox = await NatsBus.connect(receiver, nats_url)
        sender = await NatsBus.connect(Agent(CLIENT), nats_url)
        try:
            await inbox.enable_durable()

            def request(number: int, key_id: str | None) -> Message:
                plain = Message(message_id=f"d-{number}-{time.time_ns()}", sender=CLIENT,
                                receiver=durable, intent=Intent.REQUEST,
                                protocol="request/v1", timestamp=int(time.time() * 1000),
                                body=REQUEST_BODY)
                return plain if key_id is None else \
                    sign_message(plain, private(key_id), key_id)

            sent = [request(1, "alice"), request(2, "mallory"), request(3, None)]
            for item in sent:
                await sender.send_durable(item, descriptor=SIGNED_REQUEST)
            async with asyncio.timeout(20):
                while len(seen) + inbox.stats["durable_refused"] < 3:
                    await asyncio.sleep(0.02)
            assert inbox.stats["durable_refused"] == 1
            assert seen == [
                (sent[0].message_id, Identity("alice", fingerprint("alice"), URI(CLIENT),
                                              ("agent://test/client",))),
                (sent[2].message_id, None)]
        finally:
            await sender.close()
            await inbox.close()
            await sender.agent.close()
            await receiver.close()

    run(body)


# --------------------------------------------------------------------------- SPADE


def test_a_spade_message_has_the_identity_of_its_signature() -> None:
    """No session vouches for a SPADE message's sender: its signature does, through the
    same binding (what issue 31's JID check builds on)."""
    pytest.importorskip("spade.message")
    from cbcl.bridges._spade import message_to_spade, spade_identity, spade_to_message

    bound = store("(trust-policy (key alice (names xmpp://alice@example.org)))")
    mine = Message(message_id="m-1", sender="xmpp://alice@example.org",
                   receiver="xmpp://bob@example.org", intent="CFP",
                   protocol="contract-net/v1", conversation_id="job-1", body=CFP_BODY)
    read_back, _ = spade_to_message(message_to_spade(sign_message(mine, private("alice"),
                                                                  "alice")))
    assert spade_identity(read_back, trust=bound) == Identity(
        "alice", fingerprint("alice"), URI("xmpp://alice@example.org"),
        ("xmpp://alice@example.org",))
    # mallory, trusted but bound to nothing, signs as alice: refused.
    forged, _ = spade_to_message(message_to_spade(sign_message(mine, private("mallory"),
                                                               "mallory")))
    with pytest.raises(TrustError) as caught:
        spade_identity(forged, trust=bound)
    assert caught.value.cause == "name-binding"
    # Unsigned: nothing is proved, unless a signature is required.
    unsigned, _ = spade_to_message(message_to_spade(mine))
    assert spade_identity(unsigned, trust=bound) is None
    with pytest.raises(TrustError) as caught:
        spade_identity(unsigned, trust=bound, require_signature=True)
    assert caught.value.cause == "unsigned"
