"""The JSON mapping of values and messages (spec/cbcl-1.0.md §7)."""

from .protocol._json import from_json, message_to_json, to_json

__all__ = ["from_json", "message_to_json", "to_json"]
