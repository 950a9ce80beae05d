"""Trust: keys, the trust policy, signed descriptors and message signatures (spec/trust.md).

Theory of operation
-------------------
A :class:`TrustStore` is what a receiver trusts: Ed25519 public keys by key id (a directory
of ``*.pub`` files) and a :class:`TrustPolicy` (``policy.cbcl``) that says which keys may
sign which protocol ids and how many distinct keys must. Every key is checked when it is
loaded: a small-order key (the identity ``01 00…00`` verifies the forged signature
R = identity, S = 0 for any message) or any key outside the prime-order subgroup is refused.

Verifying a signed descriptor runs in three steps, and nothing in the payload is read as a
descriptor before the first one passes:

1. Signatures over ``PAE("cbcl-descriptor/v1", payload)`` are checked against the store.
   The key id on the wire only selects a key; the key and its algorithm come from the store.
   Distinct keys are counted by their raw bytes. Unless the valid keys satisfy at least one
   rule of the policy, the payload is refused unread.
2. The payload is read as a descriptor (guarded reader, limits).
3. The rule for the descriptor's id decides: enough distinct allowed keys, or refused.

The policy may also bind keys to the agent names they speak as (``(key ID (names …))``,
spec/trust.md §4.1): :meth:`TrustStore.verify_message` then refuses a message signed by a
key the policy does not bind to its ``sender``, and :meth:`TrustStore.verify_identity`
returns the :class:`Identity` a session hands its handlers. A name pattern is an exact URI
or a URI whose last path segment is ``*`` (one segment, see :func:`name_matches`); a store
whose policy binds no key lets every key speak as any name (what stores written before
bindings existed do).

Every refusal is ``TrustError("descriptor verification failed", reason=…)``: its
``message`` never varies with the cause (what a peer may learn); ``reason`` is for the local
log, and ``str(error)`` shows both. Helpers that return data nobody has verified say so in
their name (:func:`read_signed_descriptor_unverified`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ..core._canonical import quote
from ..core._errors import CBCLError, DescriptorError, TrustError
from ..core._files import UnsafeFile, read_regular_file
from ..core._limits import DEFAULT_LIMITS, Limits
from ..core._reader import read
from ..core._values import URI, Symbol, Value
from ._descriptor import ProtocolDescriptor, read_descriptor
from ._message import Message, Signature

DESCRIPTOR_PAYLOAD_TYPE = "cbcl-descriptor/v1"
DESCRIPTOR_FAILED = "descriptor verification failed"
MESSAGE_FAILED = "message verification failed"
STORE_REFUSED = "trust store refused"
#: At most this many ``(sig …)`` entries in one signed descriptor.
MAX_SIGNATURES = 16
#: A trust directory holds at most this many ``*.pub`` files.
MAX_KEYS = 1024
#: A ``.pub`` file is at most this many bytes (an Ed25519 PEM is 113).
MAX_KEY_FILE_BYTES = 16 * 1024
#: ``policy.cbcl`` is at most this many bytes.
MAX_POLICY_BYTES = 256 * 1024
#: Key ids: file stems and policy names. ASCII, no leading dot, at most 128 characters.
KEY_ID = re.compile(r"[A-Za-z0-9_@+\-][A-Za-z0-9_@+.\-]{0,127}\Z")
#: The values of a ``(compatibility MODE)`` clause (``cbcl.protocol._compat.MODES``).
COMPATIBILITY_MODES = ("backward", "forward", "full")
# Standard base64 of exactly 64 bytes: 86 characters, then "==".
_SIGNATURE_TEXT = re.compile(r"[A-Za-z0-9+/]{86}==\Z")
#: A name pattern's wildcard: the whole last path segment (``agent://example/*``).
WILDCARD_SEGMENT = "/*"
#: Characters a name pattern never holds, and a segment a wildcard matches neither:
#: separators (``/``, query, fragment), percent-escapes and backslashes, which a URI
#: library may decode or resolve into another path, and the wildcard itself.
_NOT_IN_SEGMENT = frozenset("/?#%\\*")


def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE's pre-authentication encoding: ``"DSSEv1" SP len(type) SP type SP len(body) SP
    body``, lengths in ASCII decimal (of the UTF-8 bytes)."""
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(body), bytes(body))


def _show(text: str) -> str:
    """A peer's string, safe to print on one line (controls and bidi escaped)."""
    return repr(text if len(text) <= 40 else text[:37] + "...")


# --------------------------------------------------------------------------- edwards25519

_P = 2**255 - 19
_D = -121665 * pow(121666, _P - 2, _P) % _P
_SQRT_M1 = pow(2, (_P - 1) // 4, _P)
_L = 2**252 + 27742317777372353535851937790883648493
_Point = tuple[int, int, int, int]  # extended coordinates X, Y, Z, T
_IDENTITY: _Point = (0, 1, 1, 0)


def _add(a: _Point, b: _Point) -> _Point:
    """The complete twisted Edwards addition (RFC 8032 §5.1.4); also doubles."""
    x1, y1, z1, t1 = a
    x2, y2, z2, t2 = b
    aa = (y1 - x1) * (y2 - x2) % _P
    bb = (y1 + x1) * (y2 + x2) % _P
    cc = 2 * _D * t1 * t2 % _P
    dd = 2 * z1 * z2 % _P
    e, f, g, h = bb - aa, dd - cc, dd + cc, bb + aa
    return (e * f % _P, g * h % _P, f * g % _P, e * h % _P)


def _is_identity(point: _Point) -> bool:
    x, y, z, _ = point
    return x % _P == 0 and (y - z) % _P == 0


def _multiply(point: _Point, scalar: int) -> _Point:
    result = _IDENTITY
    for bit in bin(scalar)[2:]:
        result = _add(result, result)
        if bit == "1":
            result = _add(result, point)
    return result


def _decode_point(raw: bytes) -> tuple[_Point, bool] | None:
    """Decode a point leniently, as permissive verifiers do (y taken mod p, a "negative"
    zero x accepted); returns the point and whether the encoding was canonical, or ``None``
    when no curve point has this y."""
    number = int.from_bytes(raw, "little")
    sign = number >> 255
    y = number & ((1 << 255) - 1)
    canonical = y < _P
    y %= _P
    u, v = (y * y - 1) % _P, (_D * y * y + 1) % _P
    x = u * pow(v, 3, _P) * pow(u * pow(v, 7, _P), (_P - 5) // 8, _P) % _P
    if (v * x * x - u) % _P:
        x = x * _SQRT_M1 % _P
        if (v * x * x - u) % _P:
            return None
    if x == 0 and sign:
        canonical = False
    elif x & 1 != sign:
        x = _P - x
    return (x, y, 1, x * y % _P), canonical


def public_key_problem(raw: bytes) -> str | None:
    """Why a raw Ed25519 public key must not be trusted, or ``None`` if it may be.

    Refused: a key of small order (``[8]P`` is the identity: all eight small-order points,
    in every encoding, canonical or not, the all-zero key included), an encoding that is not
    a curve point, a non-canonical encoding, and a point outside the prime-order subgroup
    (an honest key ``[a]B`` is always inside it).
    """
    if len(raw) != 32:
        return f"an Ed25519 public key is 32 bytes, not {len(raw)}"
    decoded = _decode_point(raw)
    if decoded is None:
        return "public key is not a point of edwards25519"
    point, canonical = decoded
    if _is_identity(_multiply(point, 8)):
        return "small-order public key"
    if not canonical:
        return "non-canonical public key encoding"
    if not _is_identity(_multiply(point, _L)):
        return "public key is not in the prime-order subgroup"
    return None


def raw_public_bytes(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


# --------------------------------------------------------------------------- key files


def load_public_key(data: bytes) -> Ed25519PublicKey:
    """An Ed25519 public key from SubjectPublicKeyInfo PEM, checked by
    :func:`public_key_problem`. Raises :class:`TrustError` (``reason`` says why) for any
    other key type, malformed PEM or a refused key."""
    try:
        key = serialization.load_pem_public_key(bytes(data))
    except (ValueError, TypeError) as exc:
        raise TrustError(STORE_REFUSED, reason=f"not a PEM public key ({exc})") from None
    except Exception as exc:  # cryptography raises UnsupportedAlgorithm for exotic keys
        raise TrustError(STORE_REFUSED, reason=f"unsupported public key ({exc})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise TrustError(STORE_REFUSED, reason=f"not an Ed25519 public key "
                         f"({type(key).__name__.removeprefix('_')}); only Ed25519 is trusted")
    problem = public_key_problem(raw_public_bytes(key))
    if problem is not None:
        raise TrustError(STORE_REFUSED, reason=problem)
    return key


def load_private_key(data: bytes) -> Ed25519PrivateKey:
    """An Ed25519 private key from unencrypted PKCS#8 PEM. Raises :class:`TrustError` for
    anything else."""
    try:
        key = serialization.load_pem_private_key(bytes(data), password=None)
    except (ValueError, TypeError) as exc:
        raise TrustError("private key refused", reason=f"not an unencrypted PEM private key "
                         f"({exc})") from None
    except Exception as exc:  # UnsupportedAlgorithm
        raise TrustError("private key refused", reason=f"unsupported key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise TrustError("private key refused", reason="not an Ed25519 private key")
    return key


def private_key_pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def public_key_pem(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.PEM,
                            serialization.PublicFormat.SubjectPublicKeyInfo)


# --------------------------------------------------------------------------- agent names


def _plain(text: object) -> str:
    """The character data of a name as a plain ``str``: a ``str`` subclass (``URI``, or a
    caller's own) is read through ``str.__str__``, never through methods it may override,
    so what is checked is what is kept."""
    if not isinstance(text, str):
        raise TypeError(f"an agent name is a str or URI, not {type(text).__name__}")
    return str.__str__(text)


def _segment_problem(segment: str) -> str | None:
    """Why ``segment`` (one path segment) is not one a name pattern holds or a wildcard
    matches, or ``None``."""
    if not segment:
        return "an empty path segment"
    if segment in (".", ".."):
        return f"a {segment!r} path segment"
    bad = sorted(_NOT_IN_SEGMENT.intersection(segment))
    if bad:
        return f"{bad[0]!r} in a path segment"
    return None


def name_pattern_problem(pattern: str) -> str | None:
    """Why ``pattern`` cannot be a name pattern of ``(names …)``, or ``None`` if it can
    (spec/trust.md §4.1): a CBCL URI ``SCHEME://AUTHORITY`` then ``/SEGMENT``s, the
    authority not empty, no segment empty, ``.`` or ``..``, none of ``/ ? # % \\ *`` in
    the authority or a segment — except that the last segment may be ``*``, the wildcard,
    after at least the authority."""
    try:
        pattern = _plain(pattern)
        URI(pattern)
    except (TypeError, ValueError):
        return "not a URI"
    scheme_end = pattern.index("://") + 3
    wildcard = pattern.endswith(WILDCARD_SEGMENT)
    rest = pattern[scheme_end:-len(WILDCARD_SEGMENT)] if wildcard else pattern[scheme_end:]
    authority, *segments = rest.split("/")
    if not authority:
        return "no authority (agent://AUTHORITY/…)"
    bad = sorted(_NOT_IN_SEGMENT.intersection(authority))
    if bad:
        return f"{bad[0]!r} in the authority"
    for segment in segments:
        problem = _segment_problem(segment)
        if problem is not None:
            return problem + ("" if segment != "*" else " (a wildcard is only the last one)")
    return None


def name_matches(pattern: str, name: str) -> bool:
    """Whether the agent URI ``name`` matches the name pattern ``pattern`` (one that
    :func:`name_pattern_problem` accepts): equal, code point for code point (URIs compare
    so, cbcl-1.0.md §1), or — for ``PREFIX/*`` — ``PREFIX/SEGMENT`` with exactly one
    segment more, not empty, ``.`` or ``..`` and without ``/ ? # % \\ *``. So
    ``agent://a/*`` matches ``agent://a/b``, not ``agent://a``, ``agent://ab``,
    ``agent://a/`` or ``agent://a/b/c``. Both are read as their character data (a ``str``
    subclass's own methods are not called). Raises ``TypeError`` for one that is not a
    ``str``."""
    pattern, text = _plain(pattern), _plain(name)
    if not pattern.endswith(WILDCARD_SEGMENT):
        return text == pattern
    prefix = pattern[:-1]  # "agent://a/"
    return text.startswith(prefix) and _segment_problem(text[len(prefix):]) is None


class _NameSet:
    """Name patterns, matched in constant time: the exact names in one set, the prefixes of
    the wildcards (``agent://a/``) in another; a name matches a wildcard only through its
    last segment (:func:`name_matches`)."""

    __slots__ = ("exact", "prefixes")

    def __init__(self, patterns: Iterable[str]) -> None:
        exact: set[str] = set()
        prefixes: set[str] = set()
        for pattern in map(_plain, patterns):
            if pattern.endswith(WILDCARD_SEGMENT):
                prefixes.add(pattern[:-1])
            else:
                exact.add(pattern)
        self.exact = frozenset(exact)
        self.prefixes = frozenset(prefixes)

    def __contains__(self, name: object) -> bool:
        text = _plain(name)
        if text in self.exact:
            return True
        head, slash, segment = text.rpartition("/")
        return bool(slash) and head + "/" in self.prefixes \
            and _segment_problem(segment) is None


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a peer proved to be: a signature that a trust store verified, by a key the trust
    policy lets speak as ``name`` (spec/trust.md §4.1).

    ``key_id``: the store's id of the key, as the signature named it (of a key under two
    ids, the one named); ``fingerprint``: ``sha256:`` and the hex SHA-256 of the key's
    bytes, the same under every id; ``name``: the agent URI it signed as — in a session, the
    peer, for the whole session; ``names``: the name patterns the policy binds the key to,
    sorted (``name`` matches one), or ``None`` when the policy binds no key at all, so that
    ``name`` is only what the key's holder claimed."""

    key_id: str
    fingerprint: str
    name: URI
    names: tuple[str, ...] | None

    @property
    def bound(self) -> bool:
        """Whether the trust policy vouches for :attr:`name` (it binds the key to names)."""
        return self.names is not None

    def may_speak_as(self, name: URI | str) -> bool:
        """Whether this key may also speak as ``name`` (an unbound key: any name)."""
        return self.names is None or any(name_matches(p, name) for p in self.names)


# --------------------------------------------------------------------------- the policy


@dataclass(frozen=True, slots=True)
class Rule:
    """Who may sign: ``keys`` (key ids; ``None`` means every key in the store), how many
    distinct ones must (``threshold``), which keys may sign messages (``message_keys``;
    ``None`` means every key in the store), and how a new version must be compatible with
    the version accepted before it (``compatibility``: ``"backward"``, ``"forward"``,
    ``"full"``, or ``None`` for no requirement; spec/trust.md §6.1)."""

    keys: frozenset[str] | None = None
    threshold: int = 1
    message_keys: frozenset[str] | None = None
    compatibility: str | None = None

    def __post_init__(self) -> None:
        if self.compatibility is not None and self.compatibility not in COMPATIBILITY_MODES:
            raise ValueError(f"compatibility must be one of {', '.join(COMPATIBILITY_MODES)} "
                             f"or None, got {self.compatibility!r}")


@dataclass(frozen=True, slots=True)
class TrustPolicy:
    """Rules by protocol id, and the rule for every other id (``default``; ``None``: other
    ids are refused). ``names``: the agent names each key id may speak as (name patterns,
    :func:`name_pattern_problem`; spec/trust.md §4.1) — once it binds any key, a key it does
    not bind speaks as no agent; empty (the default), every key may speak as any name.
    Without a ``policy.cbcl`` a store uses :meth:`permissive`. Raises ``ValueError`` for a
    key id or a name pattern that is not one."""

    protocols: Mapping[str, Rule] = field(default_factory=dict)
    default: Rule | None = None
    names: Mapping[str, Sequence[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.names, Mapping):
            raise TypeError("names must map key ids to name patterns")
        checked: dict[str, tuple[str, ...]] = {}
        for key_id, patterns in self.names.items():
            if type(key_id) is not str or not KEY_ID.match(key_id):
                raise ValueError(f"{key_id!r} is not a key id")
            if isinstance(patterns, str):
                raise TypeError(f"the names of key {key_id!r} must be a sequence of patterns")
            for pattern in patterns:
                problem = name_pattern_problem(pattern) if isinstance(pattern, str) \
                    else "not a string"
                if problem is not None:
                    raise ValueError(f"key {key_id!r}: {pattern!r} is not a name pattern "
                                     f"({problem})")
            checked[key_id] = tuple(sorted({_plain(p) for p in patterns}))
        object.__setattr__(self, "names", checked)

    @property
    def binds_names(self) -> bool:
        """Whether the policy binds any key to names (then unbound keys speak as none)."""
        return bool(self.names)

    @classmethod
    def permissive(cls) -> TrustPolicy:
        """Any key of the store may sign anything; one signature suffices."""
        return cls({}, Rule())

    def rule_for(self, protocol_id: str) -> Rule | None:
        return self.protocols.get(protocol_id, self.default)

    def compatibility_for(self, protocol_id: str) -> str | None:
        """The compatibility mode the rule for ``protocol_id`` requires, or ``None``."""
        rule = self.rule_for(protocol_id)
        return None if rule is None else rule.compatibility

    def rules(self) -> tuple[Rule, ...]:
        listed = tuple(self.protocols.values())
        return listed if self.default is None else (*listed, self.default)

    @classmethod
    def parse(cls, data: bytes, *, limits: Limits | None = None) -> TrustPolicy:
        """Read a ``(trust-policy …)`` document (grammar in spec/trust.md). Raises
        :class:`TrustError` with the problem in ``reason``."""
        try:
            value = read(data, limits=DEFAULT_LIMITS if limits is None else limits)
        except CBCLError as exc:
            raise TrustError(STORE_REFUSED, reason=f"policy: {exc.one_line()}") from None
        if type(value) is not tuple or not value or value[0] != Symbol("trust-policy"):
            raise _policy_error("expected a (trust-policy …) document")
        protocols: dict[str, Rule] = {}
        default: Rule | None = None
        seen_default = False
        names: dict[str, tuple[str, ...]] = {}
        for entry in value[1:]:
            if type(entry) is not tuple or not entry or type(entry[0]) is not Symbol:
                raise _policy_error("expected (protocol ID …), (default …) or (key ID …)")
            head = str(entry[0])
            if head == "protocol":
                if len(entry) < 2 or type(entry[1]) is not Symbol:
                    raise _policy_error("(protocol …) must name a protocol id (a symbol)")
                ident = str(entry[1])
                if ident in protocols:
                    raise _policy_error(f"protocol {ident} is listed twice")
                protocols[ident] = _read_rule(entry[2:], f"protocol {ident}", need_keys=True)
            elif head == "default":
                if seen_default:
                    raise _policy_error("(default …) is given twice")
                seen_default = True
                default = _read_rule(entry[1:], "default", need_keys=False)
            elif head == "key":
                if len(entry) < 2 or type(entry[1]) not in (Symbol, str) \
                        or not KEY_ID.match(str(entry[1])):
                    raise _policy_error("(key …) must name a key id (a symbol or a string)")
                key_id = str(entry[1])
                if key_id in names:
                    raise _policy_error(f"key {key_id} is listed twice")
                names[key_id] = _read_names(entry[2:], f"key {key_id}")
            else:
                raise _policy_error(f"unknown entry ({head} …)")
        return cls(protocols, default, names)


def _policy_error(message: str) -> TrustError:
    return TrustError(STORE_REFUSED, reason=f"policy: {message}")


def _read_rule(clauses: tuple[Value, ...], where: str, *, need_keys: bool) -> Rule:
    found: dict[str, tuple[Value, ...]] = {}
    for clause in clauses:
        if type(clause) is not tuple or not clause or type(clause[0]) is not Symbol:
            raise _policy_error(f"{where}: expected (keys …), (threshold N), "
                                "(message-keys …) or (compatibility MODE)")
        name = str(clause[0])
        if name not in ("keys", "threshold", "message-keys", "compatibility"):
            raise _policy_error(f"{where}: unknown clause ({name} …)")
        if name in found:
            raise _policy_error(f"{where}: ({name} …) is given twice")
        found[name] = clause[1:]
    if need_keys and "keys" not in found:
        raise _policy_error(f"{where}: (keys …) is required")
    threshold = 1
    if "threshold" in found:
        items = found["threshold"]
        if len(items) != 1 or type(items[0]) is not int or not 1 <= items[0] <= MAX_SIGNATURES:
            raise _policy_error(f"{where}: (threshold N) needs one integer from 1 to "
                                f"{MAX_SIGNATURES}")
        threshold = items[0]
    compatibility = None
    if "compatibility" in found:
        items = found["compatibility"]
        if len(items) != 1 or type(items[0]) is not Symbol \
                or str(items[0]) not in COMPATIBILITY_MODES:
            raise _policy_error(f"{where}: (compatibility MODE) needs one of "
                                f"{', '.join(COMPATIBILITY_MODES)}")
        compatibility = str(items[0])
    return Rule(keys=_key_ids(found["keys"], where) if "keys" in found else None,
                threshold=threshold,
                message_keys=_key_ids(found["message-keys"], where)
                if "message-keys" in found else None,
                compatibility=compatibility)


def _read_names(clauses: tuple[Value, ...], where: str) -> tuple[str, ...]:
    """The patterns of a ``(key ID (names PATTERN …))`` entry: exactly one ``(names …)``
    clause of URIs, each a name pattern; ``(names)`` binds the key to no name."""
    if len(clauses) != 1 or type(clauses[0]) is not tuple or not clauses[0] \
            or clauses[0][0] != Symbol("names"):
        raise _policy_error(f"{where}: expected one (names AGENT-URI …) clause")
    patterns: set[str] = set()
    for item in clauses[0][1:]:
        if type(item) is not URI:
            raise _policy_error(f"{where}: {_show(str(item))} is not an agent URI")
        problem = name_pattern_problem(item)
        if problem is not None:
            raise _policy_error(f"{where}: {_show(str(item))} is not a name pattern "
                                f"({problem})")
        patterns.add(_plain(item))
    return tuple(sorted(patterns))


def _key_ids(items: tuple[Value, ...], where: str) -> frozenset[str]:
    ids: set[str] = set()
    for item in items:
        if type(item) not in (Symbol, str) or not KEY_ID.match(str(item)):
            raise _policy_error(f"{where}: {_show(str(item))} is not a key id")
        ids.add(str(item))
    if not ids:
        raise _policy_error(f"{where}: name at least one key")
    return frozenset(ids)


def _read_store_file(path: Path, max_bytes: int) -> bytes:
    """A trust store file's bytes (:func:`read_regular_file`); a problem is a
    :class:`TrustError` whose ``reason`` the caller prefixes with the path."""
    try:
        return read_regular_file(path, max_bytes=max_bytes, what=path.name)
    except UnsafeFile as exc:
        raise TrustError(STORE_REFUSED, reason=str(exc).removeprefix(f"{path.name}: ")) \
            from None
    except FileNotFoundError:
        raise TrustError(STORE_REFUSED, reason="missing (a dangling symbolic link?)") from None
    except OSError as exc:
        raise TrustError(STORE_REFUSED, reason=str(exc.strerror or exc)) from None


# --------------------------------------------------------------------------- the trust store


@dataclass(frozen=True, slots=True)
class DescriptorSignature:
    """One ``(sig KEY-ID SIG)`` entry as read: nothing about it is verified."""

    key_id: str
    value: str


@dataclass(frozen=True, slots=True)
class SignedDescriptor:
    """A ``(signed-descriptor …)`` document as read: ``payload`` (the descriptor's exact
    bytes) and its signatures, none of them verified."""

    payload: bytes
    signatures: tuple[DescriptorSignature, ...]


@dataclass(frozen=True, slots=True)
class VerifiedDescriptor:
    """A descriptor whose signatures met the policy: ``signers`` are the key ids of the
    distinct allowed keys that signed it, sorted; ``payload``, the descriptor's exact bytes
    (whose digest is ``descriptor.digest``; empty when not given)."""

    descriptor: ProtocolDescriptor
    signers: tuple[str, ...]
    payload: bytes = b""


class TrustStore:
    """Trusted Ed25519 keys by key id, and the :class:`TrustPolicy`.

    ``keys`` maps key ids to :class:`Ed25519PublicKey` objects or raw 32-byte keys; every
    key is checked (:func:`public_key_problem`). ``policy`` defaults to
    :meth:`TrustPolicy.permissive`. Raises :class:`TrustError` for a refused key, a key id
    that is not ``[A-Za-z0-9_@+-][A-Za-z0-9_@+.-]*``, or a policy that names an unknown key
    or sets a threshold its keys cannot reach; ``TypeError`` for arguments of the wrong type.
    """

    def __init__(self, keys: Mapping[str, Ed25519PublicKey | bytes],
                 policy: TrustPolicy | None = None) -> None:
        if not isinstance(keys, Mapping):
            raise TypeError("keys must be a mapping of key id to Ed25519 public key")
        if policy is not None and not isinstance(policy, TrustPolicy):
            raise TypeError("policy must be a cbcl.trust.TrustPolicy")
        self._raw: dict[str, bytes] = {}
        self._keys: dict[str, Ed25519PublicKey] = {}
        for key_id, key in keys.items():
            if type(key_id) is not str or not KEY_ID.match(key_id):
                raise TrustError(STORE_REFUSED, reason=f"{_show(str(key_id))} is not a key id")
            if isinstance(key, (bytes, bytearray)):
                raw = bytes(key)
            elif isinstance(key, Ed25519PublicKey):
                raw = raw_public_bytes(key)
            else:
                raise TypeError(f"key {key_id!r} is not an Ed25519 public key")
            problem = public_key_problem(raw)
            if problem is not None:
                raise TrustError(STORE_REFUSED, reason=f"key {key_id!r}: {problem}")
            self._raw[key_id] = raw
            self._keys[key_id] = Ed25519PublicKey.from_public_bytes(raw)
        self.policy = TrustPolicy.permissive() if policy is None else policy
        for name, rule in [*self.policy.protocols.items(), ("default", self.policy.default)]:
            if rule is None:
                continue
            for ids in (rule.keys, rule.message_keys):
                unknown = sorted((ids or frozenset()) - self._raw.keys())
                if unknown:
                    raise _policy_error(f"{name}: key {unknown[0]!r} is not in the store")
            reachable = len(self._distinct(rule.keys))
            if rule.threshold > reachable:
                raise _policy_error(f"{name}: threshold {rule.threshold} is more than its "
                                    f"{reachable} distinct key(s)")
        unknown_keys = sorted(self.policy.names.keys() - self._raw.keys())
        if unknown_keys:
            raise _policy_error(f"key {unknown_keys[0]}: the key is not in the store")
        # A key's names are those bound to any of its ids: the id on the wire is a hint,
        # so the key's holder can sign under each of them.
        by_key: dict[bytes, set[str]] = {}
        for key_id, patterns in self.policy.names.items():
            by_key.setdefault(self._raw[key_id], set()).update(patterns)
        self._names: dict[bytes, tuple[str, ...]] = {
            raw: tuple(sorted(patterns)) for raw, patterns in by_key.items()}
        self._name_sets = {raw: _NameSet(patterns) for raw, patterns in by_key.items()}

    @classmethod
    def from_directory(cls, directory: str | os.PathLike[str], *,
                       limits: Limits | None = None) -> TrustStore:
        """Load ``directory/*.pub`` (key id = file stem) and ``directory/policy.cbcl`` if
        present; other files are ignored. Each file is read by :func:`read_regular_file`:
        symbolic links are followed, but only to a regular file; a ``.pub`` file holds at
        most :data:`MAX_KEY_FILE_BYTES`, the policy :data:`MAX_POLICY_BYTES`, the directory
        at most :data:`MAX_KEYS` ``.pub`` files.

        Raises :class:`TrustError` (``"trust store refused"``, the file and cause in
        ``reason``) for a missing directory, too many keys, a file that cannot be read or is
        not a regular file (FIFO, device, socket, directory, dangling link) or is over its
        cap, a ``.pub`` file that is not an acceptable Ed25519 key (so a misplaced key is
        never silently dropped) and a refused policy."""
        path = Path(directory)
        if not path.is_dir():
            raise TrustError(STORE_REFUSED, reason=f"{path}: not a directory")
        try:
            pubs = sorted(path.glob("*.pub"))
        except OSError as exc:
            raise TrustError(STORE_REFUSED, reason=f"{path}: {exc.strerror or exc}") from None
        if len(pubs) > MAX_KEYS:
            raise TrustError(STORE_REFUSED, reason=f"{path}: more than {MAX_KEYS} .pub files "
                             f"({len(pubs)})")
        keys: dict[str, Ed25519PublicKey] = {}
        for pub in pubs:
            try:
                keys[pub.stem] = load_public_key(
                    _read_store_file(pub, MAX_KEY_FILE_BYTES))
            except TrustError as exc:
                raise TrustError(STORE_REFUSED, reason=f"{pub}: {exc.reason}") from None
        policy_path = path / "policy.cbcl"
        policy = None
        if policy_path.exists() or policy_path.is_symlink():
            try:
                policy = TrustPolicy.parse(_read_store_file(policy_path, MAX_POLICY_BYTES),
                                           limits=limits)
            except TrustError as exc:
                raise TrustError(STORE_REFUSED, reason=f"{policy_path}: {exc.reason}") \
                    from None
        try:
            return cls(keys, policy)
        except TrustError as exc:
            raise TrustError(STORE_REFUSED, reason=f"{path}: {exc.reason}") from None

    def fingerprint(self, key_id: str) -> str | None:
        """``"sha256:"`` + the hex SHA-256 of the raw 32 bytes of the key ``key_id``, or
        ``None`` if the store has no such key id. Two ids of one key share a fingerprint."""
        raw = self._raw.get(key_id)
        return None if raw is None else "sha256:" + hashlib.sha256(raw).hexdigest()

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(sorted(self._raw))

    def public_key(self, key_id: str) -> Ed25519PublicKey | None:
        return self._keys.get(key_id)

    def _distinct(self, ids: Iterable[str] | None) -> set[bytes]:
        return {self._raw[i] for i in (self._raw if ids is None else ids)}

    # ----------------------------------------------------------------- names

    def names_for(self, key_id: str) -> tuple[str, ...] | None:
        """The name patterns the policy binds the key ``key_id`` to (with those of every
        other id of the same key), sorted; ``()`` for a key it does not bind, or a key id
        the store does not hold; ``None`` when the policy binds no key at all, and every
        key may speak as any name (spec/trust.md §4.1)."""
        if not self.policy.binds_names:
            return None
        raw = self._raw.get(key_id)
        return () if raw is None else self._names.get(raw, ())

    def may_speak_as(self, key_id: str, name: URI | str) -> bool:
        """Whether the key ``key_id`` of this store may speak as the agent ``name``: one of
        its name patterns matches (:func:`name_matches`), or the policy binds no key.
        Raises ``TypeError`` for a name that is not a ``str``."""
        raw = self._raw.get(key_id)
        text = _plain(name)
        if raw is None:
            return False
        if not self.policy.binds_names:
            return True
        names = self._name_sets.get(raw)
        return names is not None and text in names

    def identity(self, key_id: str, name: URI | str) -> Identity:
        """The :class:`Identity` of the key ``key_id`` speaking as ``name``, for a signature
        by it that was verified. Raises :class:`TrustError` (``"message verification
        failed"``, cause ``name-binding``) when the key may not speak as ``name``, and
        (cause ``untrusted``) for a key id the store does not hold."""
        raw = self._raw.get(key_id)
        where = f"key {_show(key_id)}"
        text = _plain(name)  # one reading of the name: checked and kept
        if raw is None:
            raise TrustError(MESSAGE_FAILED, reason=f"{where}: unknown key id",
                             cause="untrusted")
        if not self.may_speak_as(key_id, text):
            raise TrustError(MESSAGE_FAILED, reason=self._not_bound(where, raw, text),
                             cause="name-binding")
        fingerprint = "sha256:" + hashlib.sha256(raw).hexdigest()
        return Identity(key_id, fingerprint, URI(text), self.names_for(key_id))

    def _not_bound(self, where: str, raw: bytes, name: URI | str) -> str:
        names = self._names.get(raw, ())
        shown = ", ".join(_show(n) for n in names[:4]) + (" …" if len(names) > 4 else "")
        bound = f"the key is bound to {shown}" if names else \
            "the trust policy binds the key to no name"
        return f"{where}: not bound to the name {_show(_plain(name))} ({bound})"

    # ----------------------------------------------------------------- descriptors

    def verify_descriptor(self, document: bytes, *,
                          limits: Limits | None = None) -> VerifiedDescriptor:
        """Verify a ``(signed-descriptor …)`` document, then read its payload.

        Raises :class:`TrustError` (always ``"descriptor verification failed"``, the cause
        in ``reason``) when the signatures do not meet the policy; only then is the payload
        read, and a payload that is not a descriptor raises :class:`DescriptorError` (or
        :class:`MalformedError`/:class:`LimitError` for its text).
        """
        limits = DEFAULT_LIMITS if limits is None else limits
        try:
            signed = read_signed_descriptor_unverified(document, limits=limits)
        except DescriptorError as exc:
            raise TrustError(DESCRIPTOR_FAILED, reason=exc.message,
                             cause="malformed-signature") from None
        message = pae(DESCRIPTOR_PAYLOAD_TYPE, signed.payload)
        valid: dict[bytes, str] = {}  # raw key -> the first key id it verified under
        problems: list[str] = []
        bad = False  # a trusted key id's signature did not verify
        for number, sig in enumerate(signed.signatures, 1):
            where = f"signature {number} ({_show(sig.key_id)})"
            raw_sig = _decode_signature(sig.value, where, DESCRIPTOR_FAILED)
            raw_key = self._raw.get(sig.key_id)
            if raw_key is None:
                problems.append(f"{where}: unknown key id")
                continue
            if raw_key in valid:
                problems.append(f"{where}: duplicate of key {valid[raw_key]!r}, counted once")
                continue
            try:
                self._keys[sig.key_id].verify(raw_sig, message)
            except InvalidSignature:
                problems.append(f"{where}: bad signature")
                bad = True
                continue
            valid[raw_key] = sig.key_id
        detail = f" [{'; '.join(problems)}]" if problems else ""
        cause = "bad-signature" if bad else "untrusted"
        if not valid:
            raise TrustError(DESCRIPTOR_FAILED,
                             reason=f"no valid signature from a trusted key{detail}",
                             cause=cause)
        keys = set(valid)
        if not any(len(keys & self._distinct(rule.keys)) >= rule.threshold
                   for rule in self.policy.rules()):
            signers = ", ".join(repr(k) for k in sorted(valid.values()))
            raise TrustError(DESCRIPTOR_FAILED, reason=f"threshold not met: valid signatures "
                             f"from {len(keys)} distinct key(s) ({signers}) satisfy no policy "
                             f"rule; the payload was not read{detail}", cause=cause)
        # Only now is the payload read as a descriptor.
        descriptor = read_descriptor(signed.payload, limits=limits)
        ident = str(descriptor.id)
        rule = self.policy.rule_for(ident)
        if rule is None:
            raise TrustError(DESCRIPTOR_FAILED,
                             reason=f"the trust policy has no rule for {ident} and no default",
                             cause="untrusted")
        allowed = self._distinct(rule.keys)
        counted = keys & allowed
        if len(counted) < rule.threshold:
            refused = sorted(valid[k] for k in keys - allowed)
            parts = [f"threshold not met for {ident}: {len(counted)} of {rule.threshold} "
                     "distinct allowed keys"]
            parts += [f"key {k!r} is not allowed to sign {ident}" for k in refused]
            raise TrustError(DESCRIPTOR_FAILED, reason="; ".join(parts) + detail, cause=cause)
        return VerifiedDescriptor(descriptor, tuple(sorted(valid[k] for k in counted)),
                                  signed.payload)

    # ----------------------------------------------------------------- messages

    def verify_message(self, message: Message) -> str:
        """Verify a signed message's signature over :meth:`Message.signing_bytes`; returns
        the key id. The key must be in the store, listed in ``(message-keys …)`` when the
        policy's rule for the message's protocol has that clause, and allowed to speak as
        the message's ``sender`` (:meth:`may_speak_as`).

        Raises :class:`TrustError` (always ``"message verification failed"``) for an
        unsigned message, an unknown or disallowed key, a key not bound to the sender
        (cause ``name-binding``), or a bad signature.
        """
        if not isinstance(message, Message):
            raise TypeError("verify_message takes a cbcl.Message")
        signature = message.signature
        if signature is None:
            raise TrustError(MESSAGE_FAILED, reason="unsigned message: signatures are required",
                             cause="unsigned")
        where = f"message signature ({_show(signature.key_id)})"
        raw_sig = _decode_signature(signature.value, where, MESSAGE_FAILED)
        key = self._keys.get(signature.key_id)
        if key is None:
            raise TrustError(MESSAGE_FAILED, reason=f"{where}: unknown key id",
                             cause="untrusted")
        rule = self.policy.rule_for(str(message.protocol))
        if rule is not None and rule.message_keys is not None \
                and self._raw[signature.key_id] not in self._distinct(rule.message_keys):
            raise TrustError(MESSAGE_FAILED, reason=f"{where}: key is not allowed to sign "
                             f"{message.protocol} messages", cause="untrusted")
        if not self.may_speak_as(signature.key_id, message.sender):
            raise TrustError(MESSAGE_FAILED, reason=self._not_bound(
                where, self._raw[signature.key_id], message.sender), cause="name-binding")
        try:
            key.verify(raw_sig, message.signing_bytes())
        except InvalidSignature:
            raise TrustError(MESSAGE_FAILED, reason=f"{where}: bad signature",
                             cause="bad-signature") from None
        return signature.key_id

    def verify_identity(self, message: Message) -> Identity:
        """Verify a signed message (:meth:`verify_message`: signature, message keys, and
        the key bound to its ``sender``) and return who signed it: the :class:`Identity`
        of its key speaking as its sender. Raises :class:`TrustError` as
        :meth:`verify_message` does."""
        key_id = self.verify_message(message)
        return self.identity(key_id, message.sender)


def _decode_signature(text: str, where: str, failure: str) -> bytes:
    """The 64 bytes of a signature written in standard, canonical base64; the text is
    checked (length, alphabet, padding) before it is decoded."""
    if len(text) != 88:
        raise TrustError(failure, reason=f"{where}: malformed signature: expected 88 base64 "
                         f"characters, found {len(text)}", cause="malformed-signature")
    if not _SIGNATURE_TEXT.match(text):
        raise TrustError(failure, reason=f"{where}: malformed signature: not standard base64",
                         cause="malformed-signature")
    try:
        raw = base64.b64decode(text, validate=True)
    except binascii.Error:  # pragma: no cover - the pattern admits only valid base64
        raise TrustError(failure, reason=f"{where}: malformed signature",
                         cause="malformed-signature") from None
    if base64.b64encode(raw).decode("ascii") != text:
        raise TrustError(failure, reason=f"{where}: malformed signature: non-canonical base64",
                         cause="malformed-signature")
    return raw


def _encode_signature(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


# --------------------------------------------------------------------------- reading, signing


def _wrapper_error(message: str) -> DescriptorError:
    return DescriptorError(f"malformed signed-descriptor: {message}")


def read_signed_descriptor_unverified(document: bytes, *,
                                      limits: Limits | None = None) -> SignedDescriptor:
    """Read a ``(signed-descriptor (payload STRING) (signatures (sig STRING STRING) …))``
    document WITHOUT verifying anything: for inspection and for signing it again.

    Raises :class:`MalformedError`/:class:`LimitError` for its text and
    :class:`DescriptorError` for a document of another shape.
    """
    if not isinstance(document, (bytes, bytearray, memoryview)):
        raise TypeError(f"a signed descriptor is bytes, not {type(document).__name__}")
    value = read(bytes(document), limits=DEFAULT_LIMITS if limits is None else limits)
    if type(value) is not tuple or not value or value[0] != Symbol("signed-descriptor"):
        raise _wrapper_error("expected a (signed-descriptor …) document")
    if len(value) != 3:
        raise _wrapper_error("expected exactly (payload …) then (signatures …)")
    payload, signatures = value[1], value[2]
    if type(payload) is not tuple or len(payload) != 2 or payload[0] != Symbol("payload") \
            or type(payload[1]) is not str:
        raise _wrapper_error("expected (payload STRING)")
    if type(signatures) is not tuple or not signatures \
            or signatures[0] != Symbol("signatures"):
        raise _wrapper_error("expected (signatures (sig KEY-ID SIGNATURE) …)")
    if len(signatures) == 1:
        raise _wrapper_error("(signatures …) is empty")
    if len(signatures) - 1 > MAX_SIGNATURES:
        raise _wrapper_error(f"more than {MAX_SIGNATURES} signatures")
    entries = []
    for sig in signatures[1:]:
        if type(sig) is not tuple or len(sig) != 3 or sig[0] != Symbol("sig") \
                or type(sig[1]) is not str or type(sig[2]) is not str:
            raise _wrapper_error("expected (sig KEY-ID SIGNATURE) with two strings")
        entries.append(DescriptorSignature(sig[1], sig[2]))
    return SignedDescriptor(payload[1].encode("utf-8"), tuple(entries))


def sign_descriptor(payload: bytes,
                    signers: Sequence[tuple[str, Ed25519PrivateKey]],
                    *, existing: Sequence[DescriptorSignature] = ()) -> bytes:
    """The ``(signed-descriptor …)`` document for ``payload`` (a descriptor's exact bytes,
    UTF-8), signed by each ``(key id, private key)``; ``existing`` signatures (from
    :func:`read_signed_descriptor_unverified`) are kept first, so co-signers can add theirs.
    Deterministic: Ed25519 signatures are. Raises ``ValueError`` for a payload that is not
    UTF-8 or a bad key id, ``TypeError`` for a key that is not Ed25519.
    """
    payload = bytes(payload)
    text = payload.decode("utf-8")  # UnicodeDecodeError is a ValueError
    message = pae(DESCRIPTOR_PAYLOAD_TYPE, payload)
    entries = list(existing)
    for key_id, key in signers:
        if type(key_id) is not str or not KEY_ID.match(key_id):
            raise ValueError(f"{key_id!r} is not a key id")
        if not isinstance(key, Ed25519PrivateKey):
            raise TypeError("descriptors are signed with Ed25519 private keys")
        entries.append(DescriptorSignature(key_id, _encode_signature(key.sign(message))))
    if not entries:
        raise ValueError("a signed descriptor needs at least one signature")
    if len(entries) > MAX_SIGNATURES:
        raise ValueError(f"a signed descriptor holds at most {MAX_SIGNATURES} signatures")
    lines = "".join(f"\n    (sig {quote(e.key_id)} {quote(e.value)})" for e in entries)
    return (f"(signed-descriptor\n  (payload {quote(text)})\n  (signatures{lines}))\n"
            ).encode()


def sign_message(message: Message, private_key: Ed25519PrivateKey, key_id: str) -> Message:
    """``message`` with a ``(signature KEY-ID SIG)`` over its canonical form without any
    signature (draft §2). Raises ``TypeError`` for a key that is not Ed25519 and
    ``ValueError`` for a bad key id."""
    if not isinstance(message, Message):
        raise TypeError("sign_message takes a cbcl.Message")
    if not isinstance(private_key, Ed25519PrivateKey):
        raise TypeError("messages are signed with an Ed25519 private key")
    if type(key_id) is not str or not KEY_ID.match(key_id):
        raise ValueError(f"{key_id!r} is not a key id")
    value = _encode_signature(private_key.sign(message.signing_bytes()))
    return replace(message, signature=Signature(key_id, value))
