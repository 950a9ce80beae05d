"""Resource limits (draft §1.1). Every limit is a parameter; each is checked while reading,
before the work it protects."""

from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass(frozen=True, slots=True)
class Limits:
    """Limits on one CBCL document (message or descriptor).

    ``max_message_bytes``: size of the whole document in UTF-8 bytes (default 1 MiB).
    ``max_depth``: nesting depth; an atom has depth 0, a list 1 + the deepest element, so
    ``(CBCL/1.0 … (body x))`` has depth 2 (default 64).
    ``max_list_items``: elements in one list (default 4,096).
    ``max_nodes``: atoms plus lists in one document (default 65,536).
    ``max_string_bytes``: one string's value in UTF-8 bytes, after unescaping (default 64 KiB).
    ``max_name_chars``: one symbol's characters, or one keyword's without its colon
    (default 128).

    Raises ``TypeError``/``ValueError`` for a limit that is not a positive ``int``.
    """

    max_message_bytes: int = 1 << 20
    max_depth: int = 64
    max_list_items: int = 4096
    max_nodes: int = 65536
    max_string_bytes: int = 64 << 10
    max_name_chars: int = 128
    # The hash, computed once: decoders key caches by their limits on every message.
    _hash: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name == "_hash":
                continue
            value = getattr(self, f.name)
            if type(value) is not int:
                raise TypeError(f"Limits.{f.name} must be an int, not {type(value).__name__}")
            if value < 1:
                raise ValueError(f"Limits.{f.name} must be at least 1, not {value}")
        object.__setattr__(self, "_hash", hash((
            self.max_message_bytes, self.max_depth, self.max_list_items, self.max_nodes,
            self.max_string_bytes, self.max_name_chars)))

    def __hash__(self) -> int:
        return self._hash


DEFAULT_LIMITS = Limits()
