"""Conversations, schemas and the evaluator (spec/conversations.md)."""

from .protocol._conversation import (
    Conversation,
    ConversationTracker,
    Machine,
    Step,
    compile_machine,
)
from .protocol._evaluator import evaluate
from .protocol._schema import Schema, check_schema, coerce_body, compile_schema

__all__ = [
    "Conversation", "ConversationTracker", "Machine", "Schema", "Step", "check_schema",
    "coerce_body",
    "compile_machine", "compile_schema", "evaluate",
]
