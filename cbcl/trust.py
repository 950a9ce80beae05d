"""Keys, signatures, trust stores and policies (spec/trust.md)."""

from .protocol._message import Signature
from .protocol._trust import (
    DescriptorSignature,
    Identity,
    Rule,
    SignedDescriptor,
    TrustPolicy,
    TrustStore,
    VerifiedDescriptor,
    load_private_key,
    load_public_key,
    name_matches,
    name_pattern_problem,
    read_signed_descriptor_unverified,
    sign_descriptor,
    sign_message,
)

__all__ = [
    "DescriptorSignature", "Identity", "Rule", "Signature", "SignedDescriptor", "TrustPolicy",
    "TrustStore", "VerifiedDescriptor", "load_private_key", "load_public_key", "name_matches",
    "name_pattern_problem", "read_signed_descriptor_unverified", "sign_descriptor",
    "sign_message",
]
