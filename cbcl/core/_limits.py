"""Resource limits (draft §1.1). Every limit is a parameter; each is checked while reading,
before the work it protects.

Each tier checks a limit where its own loop can exceed it (inline, for speed), and every
tier refuses through one :class:`Budget`: one wording per limit, and a position callback
that turns the tier's index (a text index, or a binary token's byte offset) into the
error's position and context.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import NoReturn

from ._errors import LimitError, Position


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


#: How each limit is said when exceeded; ``{subject}`` is what exceeds it (for
#: ``max_message_bytes`` a document or a frame, for ``max_name_chars`` a symbol or keyword).
WORDING = {
    "max_message_bytes": "{subject} exceeds the limit of {maximum} bytes",
    "max_depth": "lists nested more than {maximum} deep",
    "max_list_items": "more than {maximum} items in one list",
    "max_nodes": "more than {maximum} nodes in one document",
    "max_string_bytes": "string longer than {maximum} bytes",
    "max_name_chars": "{subject} longer than {maximum} characters",
}
_SUBJECTS = {"max_message_bytes": "document", "max_name_chars": "symbol"}

#: Where an index is: the error's position and context (either may be ``None``).
Locate = Callable[[int], tuple[Position | None, str | None]]


def limit_message(name: str, maximum: int, subject: str | None = None) -> str:
    """The one wording of limit ``name`` (a :class:`Limits` field) exceeded."""
    return WORDING[name].format(maximum=maximum, subject=subject or _SUBJECTS.get(name))


@dataclass(frozen=True, slots=True)
class Budget:
    """The limits of one document and how to say where they are exceeded: ``locate``
    maps the tier's index (text index, byte offset) to a position and a context."""

    limits: Limits
    locate: Locate

    def exceeded(self, name: str, index: int, subject: str | None = None) -> NoReturn:
        """Raise the :class:`LimitError` of limit ``name`` exceeded at ``index``."""
        maximum = getattr(self.limits, name)
        position, context = self.locate(index)
        raise LimitError(limit_message(name, maximum, subject), limit=name, maximum=maximum,
                         position=position, context=context)


@dataclass(frozen=True, slots=True)
class LLMLimits:
    """Budgets of the analyses of one descriptor made for language models (spec/llm.md
    §12): grammar exports, prompts and generated bodies. Each is counted as the work is
    done, before the work it protects; past one, the call raises :class:`LimitError` with
    ``limit`` the field's name and ``maximum`` its value (exit code 4).

    * ``max_rules`` (20,000): nonterminals an export makes (the lowered rules, one copy per
      schema type a rule is used under, keyword-set states, spaced rules and helpers);
    * ``max_steps`` (1,000,000): steps of an export's work (each item lowered, each rule
      body spaced or simplified, each expression node the fixpoints, the JSON Schema
      builder and the renderer visit);
    * ``max_output_bytes`` (4 MiB): the UTF-8 size of an export's or a prompt's text;
    * ``max_json_depth`` (256): objects and arrays nested in a JSON Schema export's
      document (a body's lists nest about three deep each), checked before the document
      is written;
    * ``max_draft_tokens`` (5,000): tokens of one drawn body (a walk past 2,000 tokens
      takes the shortest way out, so only a grammar whose least bodies are huge reaches
      it: ``r0: r1 r1``, ``r1: r2 r2`` …);
    * ``max_draw_tokens`` (100,000): tokens drawn in all for one generated body, or for
      a prompt's examples;
    * ``max_drafts`` (200): draws for one generated body (then ``SchemaError`` if the
      schema refused the draws, else :class:`LimitError`);
    * ``max_example_drafts`` (2,000): draws a prompt's examples take in all.

    Raises ``ValueError`` for a limit that is not a positive ``int``.
    """

    max_rules: int = 20_000
    max_steps: int = 1_000_000
    max_output_bytes: int = 4 << 20
    max_json_depth: int = 256
    max_draft_tokens: int = 5_000
    max_draw_tokens: int = 100_000
    max_drafts: int = 200
    max_example_drafts: int = 2_000

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if type(value) is not int or value < 1:
                raise ValueError(f"LLMLimits.{f.name} must be a positive int, got {value!r}")

    def exceeded(self, name: str, what: str) -> LimitError:
        """The :class:`LimitError` of budget ``name`` exhausted by ``what`` (``"the
        export"``, ``"the prompt's examples"`` …)."""
        maximum = getattr(self, name)
        return LimitError(f"{what} would take more than {maximum:,} {_LLM_UNITS[name]} "
                          f"(LLMLimits.{name})", limit=name, maximum=maximum)


DEFAULT_LLM_LIMITS = LLMLimits()
_LLM_UNITS = {"max_rules": "rules", "max_steps": "steps", "max_output_bytes": "bytes",
              "max_json_depth": "levels of nesting", "max_draft_tokens": "tokens",
              "max_draw_tokens": "tokens", "max_drafts": "draws", "max_example_drafts": "draws"}
