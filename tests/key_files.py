"""The key files the tests write for agents, servers and trust stores, in the formats of
spec/trust.md §3 (what ``cbcl keygen`` writes), through cryptography's own API."""

from __future__ import annotations

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey


def private_key_pem(key: Ed25519PrivateKey) -> bytes:
    """A ``.key`` file: the private key as unencrypted PKCS#8 PEM."""
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def public_key_pem(key: Ed25519PublicKey) -> bytes:
    """A trust store's ``.pub`` file: the public key as SubjectPublicKeyInfo PEM."""
    return key.public_bytes(serialization.Encoding.PEM,
                            serialization.PublicFormat.SubjectPublicKeyInfo)
