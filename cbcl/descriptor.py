"""Protocol descriptors: reading, authoring, and the loaded protocols a registry holds
(spec/cbcl-1.0.md §3, §6.7)."""

from ._authoring import build_descriptor, render_descriptor
from ._descriptor import ProtocolDescriptor, read_descriptor
from ._protocol import CompileGate, PreparedDescriptor, Protocol, Registry
from ._subset import GrammarLimits

__all__ = [
    "CompileGate", "GrammarLimits", "PreparedDescriptor", "Protocol", "ProtocolDescriptor",
    "Registry", "build_descriptor", "read_descriptor", "render_descriptor",
]
