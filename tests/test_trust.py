"""Trust (spec/trust.md): one test per attack, python-tuf style. Each asserts the precise
refusal (``reason``), that the caller-facing message does not vary with the cause, and that
the trusted state — the registry's protocols and the state directory's bytes — is exactly
as it was before.

Tests internals too: the PAE encoding and the Ed25519 point checks of
``cbcl.protocol._trust``."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from hypothesis import given, settings, strategies as st
from strategies import messages

import cbcl
from cbcl import DescriptorError, MalformedError, Registry, TrustError, TrustStore
from cbcl.cli import main
from cbcl.core._canonical import quote
from cbcl.protocol._trust import pae, public_key_pem, public_key_problem

ROOT = Path(__file__).parent.parent
DESCRIPTORS = ROOT / "descriptors"
EXAMPLE_KEYS = DESCRIPTORS / "keys"
EXAMPLES = sorted((DESCRIPTORS / "examples").glob("*.cbcl"))
SHIPPED = ["task-assignment-v1", "contract-net-v1", "request-v1", "canon-a-v1"]
FAILED = "descriptor verification failed"


def private(name: str) -> Ed25519PrivateKey:
    """A fixed test key per name (deterministic, so failures reproduce)."""
    return Ed25519PrivateKey.from_private_bytes(hashlib.sha256(name.encode()).digest())


def descriptor(ident: str = "p/v1", version: int = 2, *, expires: int | None = None,
               grammar: str = "body: SYMBOL") -> bytes:
    expiry = f" (expires {expires})" if expires is not None else ""
    return (f"(protocol-descriptor (id {ident}) (version {version}){expiry} "
            f"(intents INFORM) (grammar {quote(grammar)}))\n").encode()


def signed(payload: bytes, *names: str, ids: tuple[str, ...] = ()) -> bytes:
    signers = [(ids[i] if i < len(ids) else n, private(n)) for i, n in enumerate(names)]
    return cbcl.sign_descriptor(payload, signers)


def wrapper(payload: bytes, *sigs: tuple[str, str]) -> bytes:
    """A signed-descriptor document with exactly these (key id, signature text) entries."""
    entries = " ".join(f"(sig {quote(k)} {quote(v)})" for k, v in sigs)
    return f"(signed-descriptor (payload {quote(payload.decode())}) (signatures {entries}))" \
        .encode()


def signature_of(payload: bytes, name: str) -> str:
    return base64.b64encode(private(name).sign(pae("cbcl-descriptor/v1", payload))).decode()


def make_store(directory: Path, names: tuple[str, ...] = ("alice", "bob", "carol"),
               policy: str | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        (directory / f"{name}.pub").write_bytes(public_key_pem(private(name).public_key()))
    if policy is not None:
        (directory / "policy.cbcl").write_text(policy)
    return directory


class World:
    """A trust directory, a state directory and a registry that has accepted p/v1
    version 2 (signed by alice)."""

    def __init__(self, tmp: Path, policy: str | None = None,
                 names: tuple[str, ...] = ("alice", "bob", "carol")) -> None:
        self.trust = make_store(tmp / "trust", names, policy)
        self.state = tmp / "state"
        self.cache = tmp / "cache"
        self.registry = self.new_registry()

    def new_registry(self) -> Registry:
        return Registry(trust=self.trust, state_dir=self.state, cache_dir=self.cache,
                        isolate=False)

    def snapshot(self) -> tuple[object, ...]:
        loaded = tuple((str(p.id), p.descriptor.version, p.digest)
                       for p in self.registry.protocols())
        files = {p.name: p.read_bytes() for p in sorted(self.state.iterdir())} \
            if self.state.exists() else {}
        return loaded, files

    def refused(self, document: bytes, fragment: str, **options: object) -> TrustError:
        before = self.snapshot()
        with pytest.raises(TrustError) as info:
            self.registry.load(document, **options)  # type: ignore[arg-type]
        error = info.value
        assert error.message == FAILED, "the caller-facing message must not vary by cause"
        assert str(error) == f"{FAILED} ({error.reason})"  # the local log has the cause
        assert error.exit_code == 6
        assert fragment in error.reason, error.reason
        assert self.snapshot() == before, "a refusal changed the trusted state"
        return error


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(tmp_path)
    w.registry.load(signed(descriptor(), "alice"), now=0)
    return w


# --------------------------------------------------------------------------- happy paths


def test_pae_is_dsse() -> None:
    assert pae("cbcl-descriptor/v1", b"hello") == b"DSSEv1 18 cbcl-descriptor/v1 5 hello"
    assert pae("t", "é".encode()) == "DSSEv1 1 t 2 é".encode()  # lengths count bytes


def test_signed_descriptor_loads_and_is_recorded(world: World) -> None:
    protocol = world.registry.get("p/v1")
    assert protocol is not None and protocol.descriptor.version == 2
    record = json.loads((world.state / "p%2Fv1.json").read_text())
    assert world.registry.trust is not None
    alice = world.registry.trust.fingerprint("alice")
    assert record == {"format": "cbcl-state/3", "protocol": "p/v1", "version": 2,
                      "digest": protocol.digest, "keys": [alice],  # bound to its signer
                      "descriptor": base64.b64encode(descriptor()).decode()}  # exact bytes
    names = sorted(p.name for p in world.state.iterdir())
    assert names == [".lock", "p%2Fv1.json"]  # the lock file, and no temp files left
    # The same descriptor again is a no-op; a newer one replaces it and moves the state.
    assert world.registry.load(signed(descriptor(), "bob")) is protocol
    newer = world.registry.load(signed(descriptor(version=3), "alice", "bob"))
    assert world.registry.get("p/v1") is newer
    assert json.loads((world.state / "p%2Fv1.json").read_text())["version"] == 3
    verified = world.registry.verify(signed(descriptor(version=4), "bob", "alice"))
    assert verified.signers == ("alice", "bob")
    assert world.registry.get("p/v1") is newer  # verify records nothing


def test_trust_store_object_and_permissive_default(tmp_path: Path) -> None:
    store = TrustStore({"alice": private("alice").public_key(),
                        "bob": private("bob").public_key().public_bytes(
                            serialization.Encoding.Raw, serialization.PublicFormat.Raw)})
    assert store.key_ids == ("alice", "bob")
    reg = Registry(trust=store, disk_cache=False, isolate=False)
    assert reg.load(signed(descriptor(), "bob"), now=0).descriptor.version == 2
    with pytest.raises(TypeError):
        Registry(trust=42, disk_cache=False)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        reg.load(signed(descriptor(version=3), "bob"), now=1.5)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- signatures


def test_flipped_payload_byte(world: World) -> None:
    payload = descriptor(version=3)
    sig = signature_of(payload, "alice")
    tampered = payload.replace(b"SYMBOL", b"SYMBOM")
    world.refused(wrapper(tampered, ("alice", sig)), "signature 1 ('alice'): bad signature")


def test_flipped_signature_byte(world: World) -> None:
    payload = descriptor(version=3)
    raw = bytearray(base64.b64decode(signature_of(payload, "alice")))
    raw[10] ^= 0x01
    flipped = base64.b64encode(bytes(raw)).decode()
    world.refused(wrapper(payload, ("alice", flipped)), "bad signature")


def test_unknown_key(world: World) -> None:
    world.refused(signed(descriptor(version=3), "mallory"),
                  "no valid signature from a trusted key [signature 1 ('mallory'): "
                  "unknown key id]")


def test_key_id_is_only_a_hint(world: World) -> None:
    # mallory's signature, claiming to be alice's: verified with alice's key, it fails.
    payload = descriptor(version=3)
    world.refused(wrapper(payload, ("alice", signature_of(payload, "mallory"))),
                  "bad signature")


POLICY = """; who may sign what
(trust-policy
  (protocol p/v1 (keys alice))
  (protocol q/v1 (keys bob) (threshold 1))
  (protocol two/v1 (keys alice bob carol) (threshold 2)))
"""


def test_key_not_allowed_for_that_protocol_id(tmp_path: Path) -> None:
    w = World(tmp_path, POLICY)
    w.registry.load(signed(descriptor(), "alice"), now=0)
    # bob may sign q/v1, so his signature passes the first gate, but not p/v1.
    w.refused(signed(descriptor(version=3), "bob"),
              "threshold not met for p/v1: 0 of 1 distinct allowed keys; key 'bob' is not "
              "allowed to sign p/v1")
    assert w.registry.load(signed(descriptor("q/v1"), "bob"), now=0)


def test_payload_is_not_read_before_a_policy_rule_is_met(tmp_path: Path) -> None:
    w = World(tmp_path, POLICY)
    # carol alone satisfies no rule: the payload (not even CBCL) is refused unread.
    w.refused(cbcl.sign_descriptor(b"(((( not read", [("carol", private("carol"))]),
              "satisfy no policy rule; the payload was not read")
    # An id the policy does not list, with no (default …): refused after reading.
    w.refused(signed(descriptor("other/v1"), "alice"), "no rule for other/v1 and no default")


def test_duplicate_signatures_count_once(tmp_path: Path) -> None:
    w = World(tmp_path, POLICY)
    payload = descriptor("two/v1")
    sig = signature_of(payload, "alice")
    w.refused(wrapper(payload, ("alice", sig), ("alice", sig)),
              "signature 2 ('alice'): duplicate of key 'alice', counted once")
    w.refused(wrapper(payload, ("alice", sig), ("alice", sig)), "threshold not met")
    assert w.registry.load(signed(payload, "alice", "carol"), now=0).descriptor.version == 2


def test_one_key_under_two_ids_counts_once(tmp_path: Path) -> None:
    policy = "(trust-policy (protocol two/v1 (keys alice alice-again bob) (threshold 2)))"
    w = World(tmp_path)
    (w.trust / "alice-again.pub").write_bytes((w.trust / "alice.pub").read_bytes())
    (w.trust / "policy.cbcl").write_text(policy)
    w.registry = w.new_registry()
    payload = descriptor("two/v1")
    w.refused(signed(payload, "alice", "alice", ids=("alice", "alice-again")),
              "signature 2 ('alice-again'): duplicate of key 'alice', counted once")
    assert w.registry.load(signed(payload, "alice", "bob"), now=0)


def test_threshold_a_policy_cannot_reach_is_refused(tmp_path: Path) -> None:
    policy = "(trust-policy (protocol two/v1 (keys alice alice-again) (threshold 2)))"
    trust = make_store(tmp_path / "t", ("alice",), policy)
    (trust / "alice-again.pub").write_bytes((trust / "alice.pub").read_bytes())
    with pytest.raises(TrustError) as info:
        Registry(trust=trust, disk_cache=False)
    assert "threshold 2 is more than its 1 distinct key(s)" in info.value.reason


# --------------------------------------------------------------------------- keys

# Every small-order point of edwards25519 by y (libsodium's blocklist), with either sign
# bit: 0 (order 4), 1 (identity), two of order 8, p-1 (order 2), and the non-canonical
# p (= 0) and p+1 (= 1).
SMALL_ORDER_Y = [
    "00" * 32,
    "01" + "00" * 31,
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",
    "ec" + "ff" * 30 + "7f",
    "ed" + "ff" * 30 + "7f",
    "ee" + "ff" * 30 + "7f",
]
IDENTITY = bytes.fromhex("01" + "00" * 31)
ZERO = bytes(32)
FORGED = IDENTITY + bytes(32)  # R = identity, S = 0


def test_cryptography_alone_accepts_a_forgery_with_the_identity_key() -> None:
    # Why small-order keys must be refused when loaded: this "verifies" for any message.
    key = Ed25519PublicKey.from_public_bytes(IDENTITY)
    key.verify(FORGED, b"any message at all")
    key.verify(FORGED, pae("cbcl-descriptor/v1", descriptor()))


@pytest.mark.parametrize("raw", [IDENTITY, ZERO], ids=["identity", "all-zero"])
def test_small_order_key_in_the_trust_directory(tmp_path: Path, raw: bytes) -> None:
    trust = make_store(tmp_path / "t", ("alice",))
    (trust / "evil.pub").write_bytes(public_key_pem(Ed25519PublicKey.from_public_bytes(raw)))
    with pytest.raises(TrustError) as info:
        Registry(trust=trust, disk_cache=False)
    assert info.value.reason == f"{trust / 'evil.pub'}: small-order public key"
    with pytest.raises(TrustError, match="trust store refused"):
        TrustStore({"evil": raw})


@pytest.mark.parametrize("y", SMALL_ORDER_Y)
@pytest.mark.parametrize("sign", [0, 1])
def test_every_small_order_encoding_is_refused(y: str, sign: int) -> None:
    raw = bytearray.fromhex(y)
    raw[31] |= sign << 7
    assert public_key_problem(bytes(raw)) == "small-order public key"


def test_keys_outside_the_prime_order_subgroup_are_refused() -> None:
    from cbcl.protocol._trust import _P, _add, _decode_point

    honest = private("alice").public_key().public_bytes(serialization.Encoding.Raw,
                                                        serialization.PublicFormat.Raw)
    assert public_key_problem(honest) is None
    decoded = _decode_point(honest)
    assert decoded is not None
    x, y, z, _ = _add(decoded[0], (0, _P - 1, 1, 0))  # plus the point of order 2
    inv = pow(z, _P - 2, _P)
    x, y = x * inv % _P, y * inv % _P
    mixed = (y | (x & 1) << 255).to_bytes(32, "little")
    assert public_key_problem(mixed) == "public key is not in the prime-order subgroup"
    assert public_key_problem(b"\x02" + bytes(31)) == "public key is not a point of edwards25519"
    short = public_key_problem(bytes(31))
    assert short is not None and short.startswith("an Ed25519 public key is 32 bytes")


@pytest.mark.parametrize("kind", ["rsa", "p256"])
def test_a_key_of_another_algorithm_refuses_the_store(tmp_path: Path, kind: str) -> None:
    key = rsa.generate_private_key(65537, 2048) if kind == "rsa" \
        else ec.generate_private_key(ec.SECP256R1())
    trust = make_store(tmp_path / "t", ("alice",))
    (trust / "other.pub").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    with pytest.raises(TrustError) as info:
        Registry(trust=trust, disk_cache=False)
    assert "not an Ed25519 public key" in info.value.reason
    assert "other.pub" in info.value.reason


def test_a_signature_claiming_another_algorithm(world: World) -> None:
    payload = descriptor(version=3)
    # The format has no algorithm field: a third element naming one is malformed…
    entry = f'(sig "alice" {quote(signature_of(payload, "alice"))} "rsa-pss")'
    document = (f"(signed-descriptor (payload {quote(payload.decode())}) "
                f"(signatures {entry}))").encode()
    world.refused(document, "malformed signed-descriptor: expected (sig KEY-ID SIGNATURE)")
    # …and an ECDSA signature under alice's id is not 64 bytes: refused before decoding.
    ecdsa = ec.generate_private_key(ec.SECP256R1()).sign(
        pae("cbcl-descriptor/v1", payload), ec.ECDSA(__import__("cryptography").hazmat
                                                     .primitives.hashes.SHA256()))
    world.refused(wrapper(payload, ("alice", base64.b64encode(ecdsa).decode())),
                  "malformed signature: expected 88 base64 characters")


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda s: s[:-4], "expected 88 base64 characters, found 84"),
        (lambda s: s[:-1], "expected 88 base64 characters, found 87"),
        (lambda s: s + "AAAA", "expected 88 base64 characters, found 92"),
        (lambda s: s * 700, "expected 88 base64 characters, found 61600"),
        (lambda s: "", "found 0"),
        (lambda s: s[:-3] + "B==", "non-canonical base64"),
        (lambda s: s[:10] + "-" + s[11:], "not standard base64"),
        (lambda s: s[:-2] + "AA", "not standard base64"),
        (lambda s: base64.b64encode(base64.b64decode(s) + b"\0").decode(),
         "malformed signature"),
    ],
    ids=["truncated", "one-short", "oversized", "huge", "empty", "padding-bits",
         "urlsafe", "no-padding", "65-bytes"],
)
def test_truncated_and_oversized_signature_fields(world: World, mutate, fragment) -> None:  # type: ignore[no-untyped-def]
    payload = descriptor(version=3)
    world.refused(wrapper(payload, ("alice", mutate(signature_of(payload, "alice")))),
                  fragment)


def test_malformed_wrappers(world: World) -> None:
    payload = descriptor(version=3)
    world.refused(b"(signed-descriptor (payload \"x\") (signatures))",
                  "(signatures …) is empty")
    world.refused(b"(signed-descriptor (signatures) (payload \"x\"))", "expected (payload")
    many = [("alice", signature_of(payload, "alice"))] * 17
    world.refused(wrapper(payload, *many), "more than 16 signatures")


def test_a_verified_payload_that_is_not_a_descriptor(world: World) -> None:
    before = world.snapshot()
    with pytest.raises(DescriptorError):
        world.registry.load(cbcl.sign_descriptor(b"(not-a-descriptor)",
                                                 [("alice", private("alice"))]))
    with pytest.raises(MalformedError):
        world.registry.load(cbcl.sign_descriptor(b"(unclosed", [("alice", private("alice"))]))
    assert world.snapshot() == before


def test_signed_descriptor_without_a_trust_store(tmp_path: Path) -> None:
    reg = Registry(disk_cache=False, isolate=False)
    for allow in (False, True):
        with pytest.raises(TrustError) as info:
            reg.load(signed(descriptor(), "alice"), allow_unsigned=allow)
        assert "no trust store" in info.value.reason
    assert len(reg) == 0


# --------------------------------------------------------------------------- rollback, freeze


def test_rollback(world: World) -> None:
    world.refused(signed(descriptor(version=1), "alice"),
                  "rollback: p/v1 version 1 is older than the accepted version 2")
    # The state outlives the process: a new registry on the same state refuses it too.
    world.registry = world.new_registry()
    world.refused(signed(descriptor(version=1), "alice"), "rollback")


def test_expired(world: World) -> None:
    late = signed(descriptor(version=3, expires=5_000), "alice")
    world.refused(late, "expired: p/v1 version 3 expired at 5000, now is 5000", now=5_000)
    world.refused(late, "expired", now=10**12)
    clocked = Registry(trust=world.trust, state_dir=world.state, cache_dir=world.cache,
                       isolate=False, clock=lambda: 6_000)
    with pytest.raises(TrustError, match=FAILED) as info:
        clocked.load(late)
    assert info.value.reason.startswith("expired")
    assert world.registry.load(late, now=4_999).descriptor.version == 3


def test_equivocation(world: World) -> None:
    other = signed(descriptor(grammar="body: STRING"), "alice", "bob")
    world.refused(other, "equivocation: p/v1 version 2 is sha256:")
    world.registry = world.new_registry()  # mix-and-match after a restart
    world.refused(other, "equivocation")


def test_unsigned_descriptors_obey_the_state_too(world: World) -> None:
    world.refused(descriptor(version=1), "rollback", allow_unsigned=True)
    world.refused(descriptor(grammar="body: STRING"), "equivocation", allow_unsigned=True)
    world.refused(descriptor(version=9, expires=1), "expired", allow_unsigned=True, now=2)
    world.refused(descriptor(version=9), "unsigned descriptor")


def test_corrupt_state_is_refused_not_forgotten(world: World) -> None:
    record = world.state / "p%2Fv1.json"
    record.write_text("{not json")
    world.registry = world.new_registry()
    world.refused(signed(descriptor(version=3), "alice"), "is corrupt")
    record.write_text(json.dumps({"format": "cbcl-state/1", "protocol": "q/v1",
                                  "version": 1, "digest": "sha256:" + "0" * 64}))
    world.refused(signed(descriptor(version=3), "alice"), "is corrupt")


def test_a_failed_grammar_changes_nothing(world: World) -> None:
    before = world.snapshot()
    with pytest.raises(cbcl.GrammarError):
        world.registry.load(signed(descriptor(version=3, grammar="body: /x/"), "alice"))
    assert world.snapshot() == before


# --------------------------------------------------------------------------- policy syntax


@pytest.mark.parametrize(
    ("policy", "fragment"),
    [
        ("(policy)", "expected a (trust-policy"),
        ("(trust-policy (protocol p/v1 (keys mallory)))", "key 'mallory' is not in the store"),
        ("(trust-policy (protocol p/v1 (threshold 1)))", "(keys …) is required"),
        ("(trust-policy (protocol p/v1 (keys alice) (threshold 0)))", "(threshold N)"),
        ("(trust-policy (protocol p/v1 (keys alice) (colour red)))", "unknown clause"),
        ("(trust-policy (protocol p/v1 (keys alice)) (protocol p/v1 (keys bob)))", "twice"),
        ("(trust-policy (default) (default))", "(default …) is given twice"),
        ("(trust-policy (protocol p/v1 (keys)))", "name at least one key"),
        ("(trust-policy (protocol p/v1 (keys alice) (message-keys zed)))", "'zed'"),
        ("(trust-policy (protocol p/v1 (keys alice)", "policy: malformed"),
        # (key ID (names …)): spec/trust.md §4.1; the patterns: tests/test_identity.py
        ("(trust-policy (key zed (names agent://a)))", "key zed: the key is not in the store"),
        ("(trust-policy (key alice (names agent://a)) (key alice (names agent://b)))",
         "key alice is listed twice"),
        ("(trust-policy (key alice))", "expected one (names AGENT-URI …) clause"),
        ("(trust-policy (key alice (names agent://a) (names agent://b)))", "one (names"),
        ("(trust-policy (key alice (agents agent://a)))", "one (names"),
        ("(trust-policy (key (names agent://a)))", "must name a key id"),
        ("(trust-policy (key .x (names agent://a)))", "must name a key id"),
        ("(trust-policy (agent alice (names agent://a)))", "unknown entry (agent …)"),
    ],
)
def test_policy_refusals(tmp_path: Path, policy: str, fragment: str) -> None:
    trust = make_store(tmp_path / "t", ("alice", "bob"), policy)
    with pytest.raises(TrustError) as info:
        TrustStore.from_directory(trust)
    assert info.value.message == "trust store refused"
    assert fragment in info.value.reason


def test_policy_default_rule(tmp_path: Path) -> None:
    policy = "(trust-policy (protocol p/v1 (keys alice)) (default (keys bob carol)))"
    w = World(tmp_path, policy)
    assert w.registry.load(signed(descriptor("any/v1"), "carol"), now=0)
    w.refused(signed(descriptor("other/v1"), "alice"), "key 'alice' is not allowed")


# --------------------------------------------------------------------------- shipped files


def test_signed_shipped_descriptors_carry_the_exact_bytes() -> None:
    store = TrustStore.from_directory(EXAMPLE_KEYS)
    assert store.key_ids == ("cbcl-example",)
    for name in SHIPPED:
        document = (DESCRIPTORS / f"{name}.signed.cbcl").read_bytes()
        unverified = cbcl.trust.read_signed_descriptor_unverified(document)
        assert unverified.payload == (DESCRIPTORS / f"{name}.cbcl").read_bytes()
        verified = store.verify_descriptor(document)
        assert verified.signers == ("cbcl-example",)


def test_every_example_parses_with_the_signed_descriptors(tmp_path: Path) -> None:
    reg = Registry(trust=EXAMPLE_KEYS, state_dir=tmp_path / "state",
                   cache_dir=tmp_path / "cache")
    for name in SHIPPED:
        reg.load((DESCRIPTORS / f"{name}.signed.cbcl").read_bytes())
    for example in EXAMPLES:
        assert cbcl.parse(example.read_bytes(), registry=reg).protocol in reg


# --------------------------------------------------------------------------- messages

MESSAGE = cbcl.Message(message_id="m-1", sender="agent://a", receiver="agent://b",
                       intent="INFORM", protocol="p/v1", conversation_id="wörld",
                       body=cbcl.Symbol("hello"))


def trusted(policy: str | None = None, tmp: Path | None = None) -> Registry:
    if tmp is None:
        store = TrustStore({n: private(n).public_key() for n in ("alice", "bob")})
        return Registry(trust=store, disk_cache=False, isolate=False)
    return Registry(trust=make_store(tmp, ("alice", "bob"), policy), disk_cache=False,
                    isolate=False)


def test_message_signature_round_trip() -> None:
    reg = trusted()
    reg.load(descriptor(), allow_unsigned=True, now=0)
    signed_message = cbcl.trust.sign_message(MESSAGE, private("alice"), "alice")
    assert signed_message.signature is not None
    assert signed_message.signature.key_id == "alice"
    text = signed_message.canonical().encode()
    assert cbcl.parse(text, registry=reg, require_signatures=True) == signed_message
    # Comments and layout are not data: a re-formatted message still verifies.
    spaced = b"; hi\n" + text.replace(b") (", b")\n  (")
    assert cbcl.parse(spaced, registry=reg) == signed_message


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (lambda m: m.replace(b'"m-1"', b'"m-2"'), "bad signature"),
        (lambda m: m.replace(b'"alice"', b'"carol"'), "unknown key id"),
        (lambda m: m.replace(b"==", b"=")[:-1] + b")", "malformed signature"),
    ],
)
def test_message_signature_refusals(change, fragment: str) -> None:  # type: ignore[no-untyped-def]
    reg = trusted()
    text = cbcl.trust.sign_message(MESSAGE, private("alice"), "alice").canonical().encode()
    with pytest.raises(TrustError) as info:
        cbcl.parse(change(text), registry=reg, envelope_only=True)
    assert info.value.message == "message verification failed"
    assert fragment in info.value.reason


def test_required_signatures() -> None:
    reg = trusted()
    unsigned = MESSAGE.canonical().encode()
    assert cbcl.parse(unsigned, registry=reg, envelope_only=True) == MESSAGE
    with pytest.raises(TrustError) as info:
        cbcl.parse(unsigned, registry=reg, envelope_only=True, require_signatures=True)
    assert info.value.reason == "unsigned message: signatures are required"
    with pytest.raises(ValueError, match="trust store"):
        cbcl.parse(unsigned, require_signatures=True)


def test_policy_limits_message_signers(tmp_path: Path) -> None:
    reg = trusted("(trust-policy (protocol p/v1 (keys alice) (message-keys bob)))", tmp_path)
    by_alice = cbcl.trust.sign_message(MESSAGE, private("alice"), "alice").canonical().encode()
    with pytest.raises(TrustError) as info:
        cbcl.parse(by_alice, registry=reg, envelope_only=True)
    assert "key is not allowed to sign p/v1 messages" in info.value.reason
    by_bob = cbcl.trust.sign_message(MESSAGE, private("bob"), "bob").canonical().encode()
    assert cbcl.parse(by_bob, registry=reg, envelope_only=True).signature.key_id == "bob"  # type: ignore[union-attr]


_FLIP_REGISTRY = trusted()


@settings(max_examples=150, deadline=None)
@given(message=messages, data=st.data())
def test_changing_any_byte_breaks_the_signature(message: cbcl.Message,
                                                data: st.DataObject) -> None:
    original = cbcl.trust.sign_message(message, private("alice"), "alice")
    text = bytearray(original.canonical().encode())
    index = data.draw(st.integers(0, len(text) - 1))
    text[index] ^= data.draw(st.integers(1, 255))
    try:
        parsed = cbcl.parse(bytes(text), registry=_FLIP_REGISTRY, envelope_only=True)
    except cbcl.CBCLError:
        return  # refused: malformed, envelope, limit or trust
    # Accepted only if the change was not to any field: the signed message is the same
    # value (a separator space became another whitespace, or a hex escape changed case).
    assert parsed == original
    assert parsed.canonical() == original.canonical()


# --------------------------------------------------------------------------- command line


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def cli_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_cli_keygen(cli_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = run(capsys, "keygen", "--out", "k/alice")
    assert code == 1  # no such directory: one io line
    (cli_env / "k").mkdir()
    code, _, _ = run(capsys, "keygen", "--out", "k/alice")
    assert code == 0
    assert (cli_env / "k/alice.key").stat().st_mode & 0o777 == 0o600
    cbcl.load_private_key((cli_env / "k/alice.key").read_bytes())
    cbcl.trust.load_public_key((cli_env / "k/alice.pub").read_bytes())
    code, _, err = run(capsys, "keygen", "--out", "k/alice")  # never overwrites a key
    assert code == 1 and err.startswith("io: ") and err.count("\n") == 1


def test_cli_sign_verify_inspect_and_parse(cli_env: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    keys = cli_env / "keys"
    keys.mkdir()
    for name in ("alice", "bob"):
        assert run(capsys, "keygen", "--out", f"keys/{name}")[0] == 0
    trust = cli_env / "trust"
    trust.mkdir()
    for name in ("alice", "bob"):
        (trust / f"{name}.pub").write_bytes((keys / f"{name}.pub").read_bytes())
    (trust / "policy.cbcl").write_text(
        "(trust-policy (protocol request/v1 (keys alice bob) (threshold 2)))")
    source = str(DESCRIPTORS / "request-v1.cbcl")
    assert run(capsys, "descriptor", "sign", source, "--key", "keys/alice.key",
               "-o", "one.cbcl")[0] == 0
    code, _, err = run(capsys, "descriptor", "verify", "one.cbcl", "--trust", "trust")
    assert code == 6 and err.startswith(f"trust: {FAILED} (threshold not met")
    # A co-signer adds a signature to the signed file.
    assert run(capsys, "descriptor", "sign", "one.cbcl", "--key", "keys/bob.key",
               "-o", "two.cbcl")[0] == 0
    code, out, _ = run(capsys, "descriptor", "verify", "two.cbcl", "--trust", "trust")
    assert code == 0 and out.startswith("verified request/v1 version 2 sha256:")
    assert out.rstrip().endswith("signed by alice bob")
    code, out, _ = run(capsys, "descriptor", "inspect", "two.cbcl")
    assert code == 0
    assert out.splitlines()[0].startswith("UNVERIFIED")
    assert "id: request/v1" in out and "signatures: 'alice' 'bob'" in out
    assert "grammar: " in out and "rules: request agree" in out
    example = str(DESCRIPTORS / "examples" / "request-v1-inform-result.cbcl")
    code, out, err = run(capsys, "parse", example, "--descriptor", "two.cbcl", "--trust",
                         "trust", "--state", "state")
    assert (code, err) == (0, "")
    assert (cli_env / "state" / "request%2Fv1.json").exists()
    # Messages: sign, then parse requiring signatures.
    code, signed_text, _ = run(capsys, "sign-message", example, "--key", "keys/alice.key")
    assert code == 0 and '(signature "alice" "' in signed_text
    (cli_env / "signed.cbcl").write_text(signed_text)
    code, _, err = run(capsys, "parse", "signed.cbcl", "--descriptor", "two.cbcl", "--trust",
                       "trust", "--require-signatures")
    assert (code, err) == (0, "")
    code, _, err = run(capsys, "parse", example, "--descriptor", "two.cbcl", "--trust",
                       "trust", "--require-signatures")
    assert code == 6
    assert err == ("trust: message verification failed (unsigned message: signatures are "
                   "required)\n")
    tampered = signed_text.replace("inform-result", "inform-resulT")
    (cli_env / "tampered.cbcl").write_text(tampered)
    code, _, err = run(capsys, "parse", "tampered.cbcl", "--envelope-only", "--trust", "trust")
    assert code == 6 and "bad signature" in err and err.count("\n") == 1
    with pytest.raises(SystemExit) as info:
        main(["parse", example, "--require-signatures"])
    assert info.value.code == 2


def test_cli_inspect_trusts_nothing(cli_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    forged = wrapper(descriptor(), ("nobody", "A" * 86 + "=="))
    (cli_env / "forged.cbcl").write_bytes(forged)
    code, out, _ = run(capsys, "descriptor", "inspect", "forged.cbcl")
    assert code == 0 and "signatures: 'nobody'" in out and "id: p/v1" in out


def test_cli_shipped_descriptor_through_trust(cli_env: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    example = DESCRIPTORS / "examples" / "contract-net-v1-propose.cbcl"
    code, out, err = run(capsys, "parse", str(example), "--descriptor",
                         str(DESCRIPTORS / "contract-net-v1.signed.cbcl"),
                         "--trust", str(EXAMPLE_KEYS), "--json")
    assert (code, err) == (0, "")
    assert json.loads(out)["protocol"] == "contract-net/v1"


def _attacks(tmp: Path) -> dict[str, tuple[list[str], str]]:
    """Each attack as CLI arguments (after a good v2 is recorded in ./state) and the
    reason fragment expected on the one line."""
    payload = descriptor(version=3)
    files = {
        "flipped-payload": wrapper(payload.replace(b"SYMBOL", b"SYMBOM"),
                                   ("alice", signature_of(payload, "alice"))),
        "flipped-signature": wrapper(payload, ("alice", signature_of(payload, "bob"))),
        "unknown-key": signed(payload, "mallory"),
        "truncated-signature": wrapper(payload, ("alice", signature_of(payload, "alice")[:40])),
        "rollback": signed(descriptor(version=1), "alice"),
        "expired": signed(descriptor(version=3, expires=10), "alice"),
        "equivocation": signed(descriptor(grammar="body: STRING"), "alice"),
    }
    reasons = {
        "flipped-payload": "bad signature", "flipped-signature": "bad signature",
        "unknown-key": "unknown key id", "truncated-signature": "found 40",
        "rollback": "rollback:", "expired": "expired:", "equivocation": "equivocation:",
    }
    out = {}
    for name, document in files.items():
        (tmp / f"{name}.cbcl").write_bytes(document)
        out[name] = (["--descriptor", f"{name}.cbcl", "--now", "100"], reasons[name])
    return out


@pytest.mark.parametrize("attack", ["flipped-payload", "flipped-signature", "unknown-key",
                                    "truncated-signature", "rollback", "expired",
                                    "equivocation"])
@pytest.mark.parametrize("command", ["parse", "verify"])
def test_cli_attacks_exit_6_with_one_line(cli_env: Path, capsys: pytest.CaptureFixture[str],
                                          attack: str, command: str) -> None:
    make_store(cli_env / "trust", ("alice", "bob"))
    (cli_env / "good.cbcl").write_bytes(signed(descriptor(), "alice"))
    message = MESSAGE.canonical()
    (cli_env / "m.cbcl").write_text(message)
    base = ["parse", "m.cbcl", "--trust", "trust", "--state", "state"]
    assert run(capsys, *base, "--descriptor", "good.cbcl")[0] == 0
    before = {p.name: p.read_bytes() for p in (cli_env / "state").iterdir()}
    args, reason = _attacks(cli_env)[attack]
    if command == "verify":
        args = ["descriptor", "verify", args[1], "--trust", "trust", "--state", "state",
                "--now", "100"]
    else:
        args = [*base, *args]
    code, out, err = run(capsys, *args)
    assert (code, out) == (6, "")
    assert err.startswith(f"trust: {FAILED} (") and reason in err
    assert err.count("\n") == 1
    assert {p.name: p.read_bytes() for p in (cli_env / "state").iterdir()} == before


def test_cli_small_order_key_exits_6(cli_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trust = make_store(cli_env / "trust", ("alice",))
    (trust / "evil.pub").write_bytes(public_key_pem(Ed25519PublicKey.from_public_bytes(ZERO)))
    (cli_env / "good.cbcl").write_bytes(signed(descriptor(), "alice"))
    code, _, err = run(capsys, "descriptor", "verify", "good.cbcl", "--trust", "trust")
    assert code == 6
    assert err.startswith("trust: trust store refused (") and "small-order" in err
    assert err.count("\n") == 1


def test_cli_sign_refuses_bad_keys_and_non_descriptors(
        cli_env: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    (cli_env / "rsa.key").write_bytes(rsa.generate_private_key(65537, 2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    source = str(DESCRIPTORS / "request-v1.cbcl")
    code, _, err = run(capsys, "descriptor", "sign", source, "--key", "rsa.key", "-o", "x")
    assert code == 6 and "not an Ed25519 private key" in err
    assert run(capsys, "keygen", "--out", "k")[0] == 0
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"(hello)")))
    code, _, err = run(capsys, "descriptor", "sign", "-", "--key", "k.key", "-o", "x")
    assert code == 5 and err.startswith("descriptor: ")
    assert not (cli_env / "x").exists()
