"""Hypothesis strategies for CBCL values and messages, in one place.

Uses one internal: ``is_name``, the reader's own NAME test, so that names are drawn from
exactly what reads as a symbol."""

from __future__ import annotations

from decimal import Decimal

from hypothesis import strategies as st

from cbcl import URI, Intent, Keyword, Message, Symbol
from cbcl.core._values import is_name

NAME_START = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz+-*/<>=!?_."
NAME_REST = NAME_START + "0123456789@%&"

names = st.builds(
    lambda first, rest: first + rest,
    st.sampled_from(NAME_START),
    st.text(alphabet=NAME_REST, max_size=20),
).filter(is_name)

symbols = names.map(Symbol)
keywords = st.builds(
    lambda first, rest: Keyword(first + rest),
    st.sampled_from(NAME_START),
    st.text(alphabet=NAME_REST, max_size=20),
)
uris = st.builds(
    lambda scheme, rest: URI(f"{scheme}://{rest}"),
    st.from_regex(r"[a-z][a-z0-9+.\-]{0,8}", fullmatch=True),
    st.text(
        alphabet=st.characters(
            blacklist_categories=["Cs"],
            blacklist_characters="()\";" + "".join(map(chr, range(0x21)))
            + "".join(map(chr, range(0x7F, 0xA1))) + "\u061c\u1680\u205f\u2060\u2061"
            + "\u2062\u2063\u2064\u3000\ufeff" + "".join(map(chr, range(0x2000, 0x2010)))
            + "".join(map(chr, range(0x2028, 0x2030))) + "\u2066\u2067\u2068\u2069",
        ),
        min_size=1, max_size=30,
    ),
)
# Any text without lone surrogates: controls and bidi characters included (they are
# escaped in canonical form).
strings = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=40)
integers = st.integers(min_value=-(2**63), max_value=2**63 - 1)
decimals = st.builds(
    lambda sign, whole, frac: Decimal(f"{sign}{whole}.{frac}"),
    st.sampled_from(["", "-"]),
    st.integers(min_value=0, max_value=10**15),
    st.from_regex(r"[0-9]{1,15}", fullmatch=True),
)
atoms = st.one_of(strings, integers, decimals, symbols, keywords, uris)
values = st.recursive(atoms, lambda children: st.lists(children, max_size=6).map(tuple),
                      max_leaves=40)

ids = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=12)
timestamps = st.integers(min_value=0, max_value=2**63 - 1)
# W3C traceparents of version 00 (what a (trace …) field holds): ids not all zeros.
traces = st.builds(lambda trace_id, parent_id, flags:
                   f"00-{trace_id:032x}-{parent_id:016x}-{flags:02x}",
                   st.integers(1, 2**128 - 1), st.integers(1, 2**64 - 1), st.integers(0, 255))
messages = st.builds(
    Message,
    message_id=ids,
    sender=uris,
    receiver=uris,
    intent=st.sampled_from(list(Intent)),
    protocol=symbols,
    conversation_id=st.none() | ids,
    in_reply_to=st.none() | ids,
    reply_by=st.none() | timestamps,
    timestamp=st.none() | timestamps,
    trace=st.none() | traces,
    body=st.none() | values,
)


def mutate_tokens(tokens: list[str], data: st.DataObject, *, rounds: int = 1,
                  ops: tuple[str, ...] = ("drop", "swap", "dup", "wrap")) -> list[str]:
    """``tokens`` (a text split on spaces) with up to ``rounds`` drawn edits: drop a token,
    swap two, repeat one, wrap one in parentheses, or read a keyword as a symbol."""
    for _ in range(data.draw(st.integers(1, rounds))):
        if len(tokens) < 2:
            break
        index = data.draw(st.integers(0, len(tokens) - 2))
        op = data.draw(st.sampled_from(ops))
        if op == "drop":
            del tokens[index]
        elif op == "swap":
            tokens[index], tokens[index + 1] = tokens[index + 1], tokens[index]
        elif op == "dup":
            tokens.insert(index, tokens[index])
        elif op == "wrap":
            tokens[index] = f"({tokens[index]})"
        elif tokens[index].startswith(":") and len(tokens[index]) > 1:  # keyword-as-symbol
            tokens[index] = tokens[index][1:]
    return tokens
