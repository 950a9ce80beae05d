"""Protocol descriptors: reading, authoring, comparing versions (spec/compatibility.md), and
the loaded protocols a registry holds (spec/cbcl-1.0.md §3, §6.7)."""

from ._authoring import build_descriptor, render_descriptor
from ._compat import CompatLimits, CompatReport, diff_descriptors
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
    "DEFAULT_GRAMMAR_CACHE",
    "CompatLimits",
    "CompatReport",
    "CompileGate",
    "GrammarCache",
    "GrammarLimits",
    "PreparedDescriptor",
    "Protocol",
    "ProtocolDescriptor",
    "Registry",
    "build_descriptor",
    "diff_descriptors",
    "read_descriptor",
    "render_descriptor",
]
