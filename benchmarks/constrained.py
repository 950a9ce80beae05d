"""Mask-constrained random sampling of CBCL messages with llguidance (spec/llm.md).

A synthetic tokenizer (every single byte, plus multi-character tokens that cross CBCL's
token boundaries: ``") ("``, ``'" :'``, ``" (body "``, ``"agent://"`` …) stands in for an
LLM's; a seeded sampler draws each next token from the tokens the grammar's mask allows,
weighted towards closing delimiters as a message grows (so that every sample ends), until
only the end of text is allowed. ``python benchmarks/constrained.py`` samples every shipped
protocol and intent and reports accepted/drawn, samples/s and the mask time per token;
``tests/test_export.py`` uses the same sampler.

Needs the ``llm`` extra (``pip install 'cbcl[llm]'``: llguidance).
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import installed

ROOT = Path(__file__).resolve().parent.parent

#: Multi-character tokens: envelope pieces, atoms' parts, and pieces that span two tokens.
WORDS = (
    "(CBCL/1.0", " (message-id ", " (sender ", " (receiver ", " (intent ", " (protocol ",
    " (body ", " (conversation-id ", " (timestamp ", ") (", "))", ")))", " (", '"', '" ',
    '")', '" :', " :", ":", "agent://", "https://", "://", "/", "a", "id", "task", "bid",
    "-1", "-", "+", ".", "..", "12", "0", "00", "9", ".5", "1712", "abc", "x-y", "true",
    "\\n", "\\u00", "\\u202e", "\\", "\\\"", "é", "日本", "😀", "EUR", "CFP", "PROPOSE",
    "INFORM", "text", "binary", " 1", " 0", '""', "()", "sha256:",
)


class SyntheticTokenizer:
    """A byte-level tokenizer (the 256 bytes) with ``words`` as extra tokens and an EOS
    token; ``__call__`` tokenizes greedily, longest token first (as llguidance's
    ``TokenizerWrapper`` expects)."""

    def __init__(self, words: tuple[str, ...] = WORDS) -> None:
        self.tokens = [bytes([b]) for b in range(256)] + [w.encode() for w in words]
        self.tokens.append(b"<|end|>")
        self.eos_token_id = len(self.tokens) - 1
        self.bos_token_id = None
        self.special_token_ids = [self.eos_token_id]
        self._ids = {t: i for i, t in enumerate(self.tokens[:-1])}
        self._longest = max(map(len, self.tokens))

    def __call__(self, data: bytes) -> list[int]:
        out: list[int] = []
        i = 0
        while i < len(data):
            for size in range(min(self._longest, len(data) - i), 0, -1):
                token = self._ids.get(data[i:i + size])
                if token is not None:
                    out.append(token)
                    i += size
                    break
        return out


def lltokenizer(tokenizer: SyntheticTokenizer | None = None) -> Any:
    import llguidance

    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(tokenizer or SyntheticTokenizer()))


@dataclass
class Stats:
    samples: int = 0
    unfinished: int = 0
    tokens: int = 0
    mask_seconds: float = 0.0
    seconds: float = 0.0


class Sampler:
    """Seeded mask-constrained sampling over a :class:`SyntheticTokenizer`."""

    def __init__(self, tokenizer: SyntheticTokenizer, lltok: Any, seed: int,
                 budget: int = 600) -> None:
        self.tok = tokenizer
        self.lltok = lltok
        self.rng = random.Random(seed)
        self.budget = budget
        self.closing = [b'"' in t or b")" in t for t in tokenizer.tokens]
        self.base = [(0.4 if b"(" in t else 1.0) * (2.0 if len(t) > 1 else 1.0)
                     for t in tokenizer.tokens]
        self.stats = Stats()

    def matcher(self, grammar: str) -> Any:
        """A matcher for ``grammar`` (llguidance's serialized form); raises if llguidance
        refuses the grammar."""
        import llguidance

        matcher = llguidance.LLMatcher(self.lltok, grammar, log_level=0)
        if matcher.is_error():
            raise RuntimeError(matcher.get_error())
        return matcher

    def sample(self, matcher: Any) -> bytes | None:
        """One message drawn with ``matcher`` (reset first), or ``None`` if it did not end
        within the token budget."""
        started = time.perf_counter()
        matcher.reset()
        out: list[int] = []
        eos = self.tok.eos_token_id
        rng = self.rng
        while True:
            t0 = time.perf_counter()
            mask = matcher.compute_bitmask()
            self.stats.mask_seconds += time.perf_counter() - t0
            self.stats.tokens += 1
            allowed = [i for n, byte in enumerate(mask) if byte for i in _BITS[n][byte]]
            if not allowed or allowed == [eos]:
                break
            boost = 1.0 + len(out) / 15.0
            weights = [self.base[i] * (boost if self.closing[i] else 1.0) for i in allowed]
            token = rng.choices(allowed, weights)[0]
            if token == eos:
                break
            out.append(token)
            if not matcher.consume_token(token):
                raise RuntimeError(matcher.get_error())
            if len(out) > self.budget:
                self.stats.unfinished += 1
                self.stats.seconds += time.perf_counter() - started
                return None
        if not matcher.is_accepting():
            raise RuntimeError("the matcher stopped before the message was complete")
        self.stats.samples += 1
        self.stats.seconds += time.perf_counter() - started
        return b"".join(self.tok.tokens[i] for i in out)


# _BITS[n][b]: the token ids of the set bits of byte b at byte offset n of a mask.
_BITS = [[tuple(8 * n + k for k in range(8) if b >> k & 1) for b in range(256)]
         for n in range(64)]


def shipped() -> list[Path]:
    return sorted(p for p in (ROOT / "descriptors").glob("*.cbcl")
                  if not p.name.endswith(".signed.cbcl"))


def main(argv: list[str] | None = None) -> int:
    import llguidance

    import cbcl
    from cbcl.llm._export import export_grammar

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=200, help="per protocol and intent")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--verbose", action="store_true", help="print each refusal")
    args = parser.parse_args(argv)
    installed.check()  # the installed cbcl, with its C extension
    tok = SyntheticTokenizer()
    lltok = lltokenizer(tok)
    total = Stats()
    print(f"llguidance {llguidance.__version__}; vocabulary {len(tok.tokens)} tokens")
    print(f"{'protocol':24} {'intent':15} {'accepted/drawn':>15} {'samples/s':>10} "
          f"{'mask us/token':>14}")
    for path in shipped():
        data = path.read_bytes()
        registry = cbcl.Registry(disk_cache=False, isolate=False)
        registry.load(data, allow_unsigned=True)
        descriptor = cbcl.descriptor.read_descriptor(data)
        for intent in descriptor.intents:
            export = export_grammar(data, "llguidance", intent=intent)
            grammar = llguidance.LLMatcher.grammar_from_lark(export.text)
            sampler = Sampler(tok, lltok, args.seed)
            matcher = sampler.matcher(grammar)
            accepted = 0
            for _ in range(args.samples):
                text = sampler.sample(matcher)
                if text is None:
                    continue
                try:
                    cbcl.parse(text, registry=registry)
                    accepted += 1
                except cbcl.CBCLError as exc:
                    if args.verbose:
                        print("  refused:", exc.one_line())
            s = sampler.stats
            drawn = s.samples + s.unfinished
            print(f"{descriptor.id!s:24} {intent.value:15} {accepted:>7}/{drawn:<7} "
                  f"{drawn / s.seconds:>10.1f} {s.mask_seconds / s.tokens * 1e6:>14.1f}")
            for name in ("samples", "unfinished", "tokens", "mask_seconds", "seconds"):
                setattr(total, name, getattr(total, name) + getattr(s, name))
    print(f"total: {total.samples} samples, {total.samples / total.seconds:.1f} samples/s, "
          f"{total.mask_seconds / total.tokens * 1e6:.1f} us mask per token, "
          f"{total.unfinished} unfinished (accepted counts the schema too)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
