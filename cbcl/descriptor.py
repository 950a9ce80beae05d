"""Protocol descriptors: reading, authoring, and the loaded protocols a registry holds
(spec/cbcl-1.0.md §3, §6.7)."""

from ._authoring import build_descriptor, render_descriptor
from ._descriptor import ProtocolDescriptor, read_descriptor
from ._protocol import Protocol
from ._registry import (
    DEFAULT_GRAMMAR_CACHE,
    CompileGate,
    GrammarCache,
    PreparedDescriptor,
    Registry,
)
from ._subset import GrammarLimits

__all__ = [
    "DEFAULT_GRAMMAR_CACHE", "CompileGate", "GrammarCache", "GrammarLimits",
    "PreparedDescriptor", "Protocol", "ProtocolDescriptor", "Registry", "build_descriptor",
    "read_descriptor", "render_descriptor",
]
