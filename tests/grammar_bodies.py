"""Bodies generated from a descriptor grammar's syntax tree, for property tests.

lark's own generator (``hypothesis.extra.lark.from_lark``) walks the BNF expansion, where a
keyword set is ``S -> ε | S ":k" X | …``: it would write members twice and leave required
ones out. This one walks the author's tree (:class:`cbcl.grammar._subset.GrammarSource`), so a
keyword set gives its required members and some optional ones, each once, in a shuffled
order. Past ``max_depth`` only the alternatives that end soonest are chosen, so every
drawn body is finite.

Uses internals: the subset reader's grammar model (``cbcl.grammar._subset``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hypothesis import strategies as st

from cbcl.grammar._subset import (
    BASE_NAMES,
    GrammarSource,
    Group,
    Item,
    KeywordSet,
    Literal,
    Reference,
    Repeat,
    Rule,
    derivation_heights,
    sequence_height,
)


def bodies(source: GrammarSource, start: str, tokens: Mapping[str, st.SearchStrategy[str]],
           *, max_depth: int = 5) -> st.SearchStrategy[str]:
    """Bodies (text, tokens separated by one space) that ``start`` of ``source`` derives.
    ``tokens`` draws the text of each base name (``SYMBOL``, ``NUMBER``, ``value`` …)."""
    rules: dict[str, Rule] = {rule.name: rule for rule in source.rules}
    heights = derivation_heights(source)

    def choose(draw: Any, options: list[Any], height_of: Any, depth: int) -> Any:
        if depth > max_depth:
            least = min(height_of(o) for o in options)
            options = [o for o in options if height_of(o) == least]
        return draw(st.sampled_from(options))

    def alt_height(alt: Any) -> int:
        return sequence_height(alt.items, heights)

    def emit(draw: Any, item: Item, depth: int, out: list[str]) -> None:
        if isinstance(item, Literal):
            out.append(item.text)
        elif isinstance(item, Reference):
            if item.name in BASE_NAMES:
                out.append(draw(tokens[item.name]))
            else:
                rule = rules[item.name]
                alt = choose(draw, list(rule.alternatives), alt_height, depth)
                for inner in alt.items:
                    emit(draw, inner, depth + 1, out)
        elif isinstance(item, Repeat):
            low = 1 if item.op == "+" else 0
            high = 1 if item.op == "?" else 3
            count = low if depth > max_depth else draw(st.integers(low, high))
            for _ in range(count):
                emit(draw, item.item, depth + 1, out)
        elif isinstance(item, KeywordSet):
            chosen = [m for m in item.members
                      if not m.optional or (depth <= max_depth and draw(st.booleans()))]
            for member in draw(st.permutations(chosen)):
                out.append(member.keyword)
                emit(draw, member.item, depth + 1, out)
        else:
            assert isinstance(item, Group)
            if item.optional and (depth > max_depth or draw(st.booleans())):
                return
            alt = choose(draw, list(item.alternatives), alt_height, depth)
            for inner in alt.items:
                emit(draw, inner, depth + 1, out)

    @st.composite
    def body(draw: Any) -> str:
        out: list[str] = []
        emit(draw, Reference(start, rules[start].position), 0, out)
        return " ".join(out)

    return body()
