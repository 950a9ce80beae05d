"""Protocol descriptors: reading, authoring (from a declaration too, spec/declarations.md),
comparing versions (spec/compatibility.md), and
the loaded protocols a registry holds (spec/cbcl-1.0.md §3, §6.7)."""

from .grammar._subset import GrammarLimits
from .protocol._agreement import check_schema_against_grammar
from .protocol._authoring import build_descriptor, render_descriptor
from .protocol._compat import CompatLimits, CompatReport, Witness, diff_descriptors
from .protocol._declaration import (
    Declaration,
    descriptor_from_declaration,
    read_declaration,
)
from .protocol._descriptor import ProtocolDescriptor, read_descriptor
from .protocol._protocol import Protocol
from .protocol._records import (
    Declared,
    Key,
    Length,
    Range,
    Record,
    Scheme,
    declaration_of,
    descriptor_from,
    record_of,
)
from .protocol._registry import (
    DEFAULT_GRAMMAR_CACHE,
    CompileGate,
    GrammarCache,
    PreparedDescriptor,
    Registry,
)

__all__ = [
    "DEFAULT_GRAMMAR_CACHE",
    "CompatLimits",
    "CompatReport",
    "CompileGate",
    "Declaration",
    "Declared",
    "GrammarCache",
    "GrammarLimits",
    "Key",
    "Length",
    "PreparedDescriptor",
    "Protocol",
    "ProtocolDescriptor",
    "Range",
    "Record",
    "Registry",
    "Scheme",
    "Witness",
    "build_descriptor",
    "check_schema_against_grammar",
    "declaration_of",
    "descriptor_from",
    "descriptor_from_declaration",
    "diff_descriptors",
    "read_declaration",
    "read_descriptor",
    "record_of",
    "render_descriptor",
]
