"""Keys, signatures, trust stores and policies (spec/trust.md)."""

from ._trust import (
    DescriptorSignature,
    Rule,
    SignedDescriptor,
    TrustPolicy,
    TrustStore,
    VerifiedDescriptor,
    load_private_key,
    load_public_key,
    read_signed_descriptor_unverified,
    sign_descriptor,
    sign_message,
)

__all__ = [
    "DescriptorSignature", "Rule", "SignedDescriptor", "TrustPolicy", "TrustStore",
    "VerifiedDescriptor", "load_private_key", "load_public_key",
    "read_signed_descriptor_unverified", "sign_descriptor", "sign_message",
]
