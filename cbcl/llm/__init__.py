"""CBCL for language models (spec/llm.md): grammar exports for constrained decoding, messages
generated from a protocol's grammar, extraction of messages from model output, and the
system-prompt section that teaches a model a protocol, a checker of a message as it is
written (:class:`Checker`) and the repair loop (:func:`complete`). Repair hints are on
every error (:meth:`cbcl.CBCLError.hint`)."""

from ..core._limits import LLMLimits
from ._checker import Checker, CheckerMisuse, Ok, Refused
from ._complete import Attempt, Completion, CompletionError, complete, complete_async
from ._export import (
    FORMATS as EXPORT_FORMATS,
    KEYWORD_SET_CAP,
    STRING_LENGTH_CAP,
    GrammarExport,
    export_grammar,
    export_json_schema,
)
from ._extract import INPUT_FACTOR as EXTRACT_INPUT_FACTOR, DroppedSpan, Extracted, extract
from ._generate import generate_bodies, generate_messages
from ._prompt import render_prompt

__all__ = [
    "EXPORT_FORMATS",
    "EXTRACT_INPUT_FACTOR",
    "KEYWORD_SET_CAP",
    "STRING_LENGTH_CAP",
    "Attempt",
    "Checker",
    "CheckerMisuse",
    "Completion",
    "CompletionError",
    "DroppedSpan",
    "Extracted",
    "GrammarExport",
    "LLMLimits",
    "Ok",
    "Refused",
    "complete",
    "complete_async",
    "export_grammar",
    "export_json_schema",
    "extract",
    "generate_bodies",
    "generate_messages",
    "render_prompt",
]
