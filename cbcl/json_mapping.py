"""The JSON mapping of values and messages (spec/cbcl-1.0.md §7)."""

from .protocol._json import (
    JSON_SIZE_FACTOR,
    from_json,
    message_from_json,
    message_to_json,
    message_to_json_text,
    to_json,
)

__all__ = ["JSON_SIZE_FACTOR", "from_json", "message_from_json", "message_to_json",
           "message_to_json_text", "to_json"]
