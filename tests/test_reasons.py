"""The reason table (cbcl/session/_reasons.py) against spec/negotiation.md §4: one row per code,
every error class the session can meet maps to a documented code, the kind of an error
decides its code and its wording never does, and every TrustError raise site the session
can meet names its cause.

Tests internals: the reason tables (``cbcl.session._reasons``) are private."""

from __future__ import annotations

import hashlib
import importlib
import pkgutil
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import cbcl
from cbcl import CBCLError, RemoteProtocolError, TrustError, TrustStore, sign_descriptor
from cbcl.core._canonical import quote
from cbcl.session import NOT_UNDERSTOOD_CODES
from cbcl.session._bootstrap import negotiation_registry
from cbcl.session._reasons import (
    REASONS,
    REJECT_CODES,
    REJECT_FALLBACK,
    TRUST_CAUSES,
    class_code,
    error_code,
    reject_reason,
)
from cbcl.trust import sign_message

ROOT = Path(__file__).parent.parent
SPEC = (ROOT / "spec" / "negotiation.md").read_text(encoding="utf-8")
NOW = 1_764_500_000_000


def _section_4() -> str:
    return SPEC[SPEC.index("## 4. Reason codes"):SPEC.index("## 5. ")]


def spec_reject_codes() -> list[str]:
    """The codes of §4's ``(rejected :reason CODE)`` table, in order."""
    return re.findall(r"^\| `([a-z-]+)` \|", _section_4(), flags=re.MULTILINE)


def spec_not_understood_codes() -> list[str]:
    """The codes §4 says a NOT-UNDERSTOOD carries."""
    text = _section_4()
    paragraph = text[text.index("NOT-UNDERSTOOD carries one of:"):
                     text.index("A NOT-UNDERSTOOD\nis taken")]
    return re.findall(r"`([a-z-]+)`", paragraph)


# --------------------------------------------------------------------------- table and spec


def test_every_code_of_the_spec_has_exactly_one_row() -> None:
    codes = [row.code for row in REASONS]
    assert len(codes) == len(set(codes)), "a code with two rows"
    documented = set(spec_reject_codes()) | set(spec_not_understood_codes())
    assert set(codes) == documented
    assert NOT_UNDERSTOOD_CODES == set(spec_not_understood_codes()) == documented
    assert len(spec_not_understood_codes()) == len(set(spec_not_understood_codes()))


def test_the_rejection_codes_are_the_spec_table_and_the_grammar() -> None:
    assert set(spec_reject_codes()) == REJECT_CODES
    assert len(spec_reject_codes()) == len(set(spec_reject_codes()))
    assert REJECT_FALLBACK in REJECT_CODES
    protocol = negotiation_registry().get("cbcl-negotiation/v1")
    assert protocol is not None
    (line,) = re.findall(r"^reason: (.*)$", protocol.descriptor.grammar, flags=re.MULTILINE)
    assert set(re.findall(r'"([a-z-]+)"', line)) == REJECT_CODES


def test_every_class_and_cause_is_in_one_row() -> None:
    classes = [kind for row in REASONS for kind in row.errors]
    causes = [cause for row in REASONS for cause in row.causes]
    assert len(classes) == len(set(classes))
    assert len(causes) == len(set(causes)) and set(causes) == TRUST_CAUSES
    assert CBCLError in classes  # every error has a code
    # A trust cause refines TrustError: its rows are the rejection codes of trust.
    assert all(row.rejects for row in REASONS if row.causes)


def _all_error_classes() -> set[type[CBCLError]]:
    for module in pkgutil.iter_modules(cbcl.__path__):
        if module.name.startswith("_") and not module.name.startswith(
                ("_cli", "_compile_worker", "_bench", "__main__")):
            importlib.import_module(f"cbcl.{module.name}")
    found: set[type[CBCLError]] = set()
    todo: list[type[CBCLError]] = [CBCLError]
    while todo:
        kind = todo.pop()
        found.add(kind)
        todo += kind.__subclasses__()
    return found


def test_every_error_class_maps_to_a_documented_code() -> None:
    classes = _all_error_classes()
    assert {cbcl.TrustError, cbcl.LimitError, cbcl.BodyError, cbcl.ConversationError,
            RemoteProtocolError, cbcl.LocalProtocolError} <= classes
    for kind in classes:
        code = class_code(kind)
        assert code in NOT_UNDERSTOOD_CODES, kind
        rejected = code if code in REJECT_CODES else REJECT_FALLBACK
        assert rejected in spec_reject_codes(), kind


@pytest.mark.parametrize(("error", "code", "rejected"), [
    (cbcl.MalformedError("x"), "malformed", "malformed"),
    (cbcl.EnvelopeError("x"), "malformed", "malformed"),
    (cbcl.BodyError("x"), "malformed", "malformed"),
    (cbcl.DescriptorError("x"), "malformed", "malformed"),
    (cbcl.LimitError("x", limit="max_depth", maximum=1), "limit", "limit"),
    (cbcl.GrammarError("x"), "grammar-refused", "grammar-refused"),
    (cbcl.SchemaError("x"), "schema", "malformed"),
    (cbcl.ConversationError("x"), "conversation", "malformed"),
    (cbcl.EvaluationError("x"), "protocol", "malformed"),
    (cbcl.UnknownProtocolError("x", protocol="p/v1"), "unknown-protocol", "malformed"),
    (cbcl.ProtocolError("x"), "protocol", "malformed"),
    (cbcl.CBCLError("x"), "protocol", "malformed"),
    (TrustError("x"), "untrusted-signer", "untrusted-signer"),
    (RemoteProtocolError("x", code="stale"), "stale", "malformed"),
])
def test_the_class_decides(error: CBCLError, code: str, rejected: str) -> None:
    assert error_code(error) == code
    assert reject_reason(error) == rejected


def test_a_cause_decides_and_the_wording_never_does() -> None:
    for row in REASONS:
        for cause in row.causes:
            for reason in ("", "rollback: x", "signature 1 ('k'): bad signature",
                           "any words at all"):
                error = TrustError("verification failed", reason=reason, cause=cause)
                assert error_code(error) == reject_reason(error) == row.code
    # An unknown cause is the class's code, never an exception.
    assert error_code(TrustError(reason="rollback: x", cause="no-such-cause")) \
        == "untrusted-signer"
    assert reject_reason(ValueError("not ours")) == REJECT_FALLBACK


def test_a_session_code_must_be_in_the_table() -> None:
    with pytest.raises(ValueError, match="not a reason code"):
        RemoteProtocolError("x", code="bad signature")


def test_the_codes_and_causes_written_in_the_source_are_in_the_table() -> None:
    session = (ROOT / "cbcl" / "session" / "_session.py").read_text(encoding="utf-8")
    codes = re.findall(r'code="([^"]+)"', session) + re.findall(r'_reject\("([^"]+)"', session)
    assert codes and set(codes) <= NOT_UNDERSTOOD_CODES
    assert set(re.findall(r'_reject\("([^"]+)"', session)) <= REJECT_CODES
    for path in (ROOT / "cbcl").rglob("*.py"):
        causes = re.findall(r'\bcause="([^"]+)"', path.read_text(encoding="utf-8"))
        assert set(causes) <= TRUST_CAUSES, path.name


# --------------------------------------------------------------------------- the raise sites

KEY = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"reasons-a").digest())
OTHER = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"reasons-b").digest())
STORE = TrustStore({"demo": KEY.public_key(), "other": OTHER.public_key()})
ZERO_SIG = "A" * 86 + "=="


def descriptor(version: int, *, expires: int | None = None, grammar: str = "SYMBOL") -> bytes:
    expiry = f" (expires {expires})" if expires is not None else ""
    return (f'(protocol-descriptor (id reasons/v1) (version {version}){expiry} '
            f'(intents INFORM) (grammar "body: {grammar}"))\n').encode()


def signed(payload: bytes, key_id: str = "demo", key: Ed25519PrivateKey = KEY) -> bytes:
    return sign_descriptor(payload, [(key_id, key)])


def wrapper(payload: bytes, key_id: str, value: str) -> bytes:
    return (f"(signed-descriptor (payload {quote(payload.decode())}) (signatures (sig "
            f"{quote(key_id)} {quote(value)})))").encode()


def refusal(action: Callable[[], object]) -> TrustError:
    with pytest.raises(TrustError) as caught:
        action()
    return caught.value


def registry(tmp_path: Path) -> cbcl.Registry:
    return cbcl.Registry(trust=STORE, disk_cache=False, isolate=False,
                         state_dir=tmp_path / "state")


def real_trust_errors(tmp_path: Path) -> list[tuple[TrustError, str]]:
    """TrustErrors from the real raise sites, with the cause each must be read as."""
    reg = registry(tmp_path)
    reg.load(signed(descriptor(2)), now=NOW)
    message = cbcl.Message(message_id="m-1", sender="agent://t/a", receiver="agent://t/b",
                           intent="INFORM", protocol="reasons/v1", body=cbcl.Symbol("x"))
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    return [
        (refusal(lambda: reg.load(signed(descriptor(1)), now=NOW)), "rollback"),
        (refusal(lambda: reg.load(signed(descriptor(2, grammar="STRING")), now=NOW)),
         "equivocation"),
        (refusal(lambda: reg.load(signed(descriptor(3), "other", OTHER), now=NOW)),
         "key-binding"),
        (refusal(lambda: reg.load(signed(descriptor(4, expires=1)), now=NOW)), "expired"),
        (refusal(lambda: reg.load(descriptor(5), now=NOW)), "unsigned"),
        (refusal(lambda: STORE.verify_message(message)), "unsigned"),
        (refusal(lambda: STORE.verify_descriptor(b'(signed-descriptor (payload "x"))')),
         "malformed-signature"),
        (refusal(lambda: cbcl.Registry(trust=STORE, state_dir=not_a_dir)), "state"),
        (refusal(lambda: STORE.verify_descriptor(signed(descriptor(6), "demo", OTHER))),
         "bad-signature"),
        (refusal(lambda: STORE.verify_descriptor(wrapper(descriptor(6), "demo", "abc"))),
         "malformed-signature"),
        (refusal(lambda: STORE.verify_descriptor(wrapper(descriptor(6), "demo", ZERO_SIG))),
         "bad-signature"),
        (refusal(lambda: STORE.verify_message(sign_message(message, OTHER, "demo"))),
         "bad-signature"),
        (refusal(lambda: STORE.verify_descriptor(signed(descriptor(6), "stranger", OTHER))),
         "untrusted"),
        (refusal(lambda: cbcl.Registry(disk_cache=False, isolate=False).load(
            signed(descriptor(6)))), "untrusted"),
    ]


def test_every_trust_raise_site_names_its_cause(tmp_path: Path) -> None:
    for error, cause in real_trust_errors(tmp_path):
        assert error.cause == cause, error.reason
        assert error_code(error) == reject_reason(error)

