"""The atoms a binary frame writes in full, judged in C (``cbcl._native``) exactly as in
Python (issue 19): the lexical rules of :mod:`cbcl.core._vocabulary` mirrored by
``check_atom``/``build_body`` over every code point of the BMP, and on adversarial atoms
(names at the length limit and one past it, names that start like numbers, non-ASCII,
URIs with odd characters, decimals at the text limit), decoded by the C and the Python
twins token for token and error for error.

Tests internals: the twins (``cbcl.binary._codec``) and the vocabulary are private."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings, strategies as st

import cbcl
from cbcl import CBCLError, Decoder, Limits, Registry
from cbcl.binary import _codec
from cbcl.binary._codec import SymbolTable, _fast_body, _fast_body_loop
from cbcl.core import _reader
from cbcl.core._vocabulary import (
    CODE_DECIMAL,
    CODE_KEYWORD,
    CODE_LPAR,
    CODE_RPAR,
    CODE_SYMBOL,
    CODE_URI,
    DECIMAL_RE,
    MAX_DECIMAL_CHARS,
    NAME_RE,
    SYMBOL_RE,
    URI_RE,
)

speedups = pytest.importorskip("cbcl._native")

ANY = (b'(protocol-descriptor (id any/v1) (version 1) (intents INFORM NOT-UNDERSTOOD) '
       b'(grammar "body: value"))')
NAMED = (CODE_SYMBOL, CODE_KEYWORD)


def _python_rule(code: int, text: str) -> bool:
    """The rule the Python twin applies to an atom written in full (``_Memos._make_atom``)."""
    if code == CODE_DECIMAL:
        return len(text) <= MAX_DECIMAL_CHARS and DECIMAL_RE.match(text) is not None
    pattern = {CODE_SYMBOL: SYMBOL_RE, CODE_KEYWORD: NAME_RE, CODE_URI: URI_RE}[code]
    return pattern.match(text) is not None


@pytest.fixture(scope="module")
def registry() -> Registry:
    reg = Registry(disk_cache=False, isolate=False)
    reg.load(ANY, allow_unsigned=True)
    return reg


# --------------------------------------------------------------------------- the rules


def test_every_bmp_code_point_is_judged_alike() -> None:
    """Each code point (surrogates included) at each place of each kind's text."""
    check = speedups.check_atom
    for point in range(0x10000):
        c = chr(point)
        for code, text in (
                (CODE_SYMBOL, c), (CODE_SYMBOL, "a" + c), (CODE_SYMBOL, "-" + c),
                (CODE_SYMBOL, "+." + c), (CODE_KEYWORD, c), (CODE_KEYWORD, "a" + c + "b"),
                (CODE_URI, c + "://x"), (CODE_URI, "a" + c + "://x"), (CODE_URI, "a://" + c),
                (CODE_URI, "a://x" + c + "y"), (CODE_DECIMAL, "1." + c),
                (CODE_DECIMAL, c + "1.5"), (CODE_DECIMAL, "1" + c + "5")):
            assert check(code, text) is _python_rule(code, text), (code, text)


# Characters that matter to some rule, and a few that matter to none.
_ALPHABET = ("a", "z", "A", "Z", "0", "1", "9", "+", "-", ".", "*", "/", "<", ">", "=", "!",
             "?", "_", "@", "%", "&", ":", "(", ")", '"', ";", " ", "\t", "\x00", "\x7f",
             "\x9f", "\xa0", "é", "Ö", "\u061c", "\u200b", "\u2028", "\u2066", "\u3000",
             "\ufeff", "\U0001f600", "#", "~", "\\", "|", "'", ",")
_ODD = st.text(st.sampled_from(_ALPHABET), max_size=12)
_NUMBERLIKE = st.sampled_from(["-1a", ".5x", "+", "-", ".", "+.", "-.5", "+1", "1a", "0",
                               "-.", "+-1", "..1", "-a1", "a-1", "_1"])
_URI_LIKE = st.builds(lambda scheme, rest: scheme + "://" + rest,
                      st.text(st.sampled_from("az09+.-:A/"), max_size=5), _ODD)
_DECIMAL_LIKE = st.builds(
    lambda sign, whole, frac, extra: sign + whole + "." + frac + extra,
    st.sampled_from(["", "-", "+", "--"]), st.sampled_from(["0", "00", "1", "10", "", "01"]),
    st.text(st.sampled_from("0123456789"), max_size=MAX_DECIMAL_CHARS), st.sampled_from(
        ["", "", "", "x", ".", "1", "\u0661", " "]))


def _atom_texts() -> st.SearchStrategy[str]:
    return _ODD | _NUMBERLIKE | _URI_LIKE | _DECIMAL_LIKE | st.text(max_size=8) | \
        st.builds(lambda head, tail: head + tail, _NUMBERLIKE, _ODD)


@settings(max_examples=2000, deadline=None)
@given(code=st.sampled_from([CODE_DECIMAL, CODE_SYMBOL, CODE_KEYWORD, CODE_URI]),
       text=_atom_texts())
def test_adversarial_texts_are_judged_alike(code: int, text: str) -> None:
    assert speedups.check_atom(code, text) is _python_rule(code, text)


def test_check_atom_refuses_other_codes() -> None:
    for code in (-1, CODE_LPAR, CODE_RPAR, 2, 7):
        with pytest.raises(ValueError):
            speedups.check_atom(code, "a")
    with pytest.raises(TypeError):
        speedups.check_atom(CODE_SYMBOL, b"a")


# --------------------------------------------------------------------------- decoding


def _frame(registry: Registry, body: list[Any]) -> bytes:
    table = SymbolTable.of(registry.get("any/v1"))  # type: ignore[arg-type]
    envelope = [3, 32, "m", "agent://a", "agent://b"]  # INFORM, a body
    return b"\xcbL\x01\x00" + table.digest + b"".join(
        msgpack.packb(token) for token in envelope + body)


def _typed(value: Any) -> Any:
    if type(value) is tuple:
        return tuple(_typed(item) for item in value)
    return (type(value).__name__, str(value))


def _outcome(decoder: Decoder, frame: bytes) -> Any:
    try:
        return _typed(decoder.decode(frame).body)
    except CBCLError as exc:
        return (type(exc).__name__, str(exc))


def _body_tokens(atoms: list[tuple[int, str]], listed: bool) -> list[Any]:
    body: list[Any] = []
    for code, text in atoms:
        body += [code, text]
    return [CODE_LPAR, *body, CODE_RPAR] if listed else body


def _agree(registry: Registry, body: list[Any], limits: Limits) -> None:
    """The C and Python twins give the same body (or both decline) from the same tokens,
    and the decoders the same message or the same error, at the same offset."""
    table = SymbolTable.of(registry.get("any/v1"))  # type: ignore[arg-type]
    tokens = [3, 32, "m", "agent://a", "agent://b", *body]
    fast = [_fast_body(table, list(tokens), 5, limits, 7, None, build)
            for build in (_fast_body_loop, _codec.build_body_on_tokens)]
    assert [None if f is None else _typed(f) for f in fast] == \
        [None if f is None else _typed(fast[0]) for f in fast]
    frame = _frame(registry, body)
    results = [_outcome(Decoder(registry, limits=limits, pure_python=pure), frame)
               for pure in (False, True)]
    assert results[0] == results[1]
    # What the fast path takes, the decoder returns (unless the limit refuses the
    # envelope's own names: ``in-reply-to``, the protocol id ...).
    if fast[0] is not None and limits.max_name_chars >= 16:
        assert results[0] == _typed(fast[0])


@settings(max_examples=600, deadline=None)
@given(data=st.data())
def test_adversarial_atoms_decode_alike(registry: Registry, data: st.DataObject) -> None:
    max_name = data.draw(st.sampled_from([1, 2, 5, 12, 16, 17, 20, 64]))
    limit_names = st.integers(max(max_name - 1, 1), max_name + 1).flatmap(
        lambda n: st.text(st.sampled_from("az+-._!09@é"), min_size=n, max_size=n))
    atom = st.tuples(st.sampled_from([CODE_DECIMAL, CODE_SYMBOL, CODE_KEYWORD, CODE_URI]),
                     _atom_texts() | limit_names)
    atoms = data.draw(st.lists(atom, min_size=1, max_size=5))
    listed = len(atoms) > 1 or data.draw(st.booleans())
    _agree(registry, _body_tokens(atoms, listed), Limits(max_name_chars=max_name))


@pytest.mark.parametrize("max_name", [1, 5, 16, 64])
def test_names_at_the_limit(registry: Registry, max_name: int) -> None:
    for length in (max_name - 1, max_name, max_name + 1):
        if length < 1:
            continue
        for code in NAMED:
            for head in ("a", "-", "+", ".", "-a", ".a", "+."):
                text = (head + "x" * length)[:length]
                _agree(registry, _body_tokens([(code, text)], True),
                       Limits(max_name_chars=max_name))


def test_decimals_at_the_text_limit(registry: Registry) -> None:
    for length in (MAX_DECIMAL_CHARS - 1, MAX_DECIMAL_CHARS, MAX_DECIMAL_CHARS + 1):
        for text in ("1." + "5" * (length - 2), "-0." + "5" * (length - 3),
                     "9" * (length - 2) + ".5"):
            assert len(text) == length
            _agree(registry, _body_tokens([(CODE_DECIMAL, text)], False), Limits())
    for text in ("0.5", "-0.5", "1.25", "12.50", "-12.5", "00.5", "1.", ".5", "-.5", "1e5",
                 "1.5e3", "+1.5", "1.\u0665", "0x1.5"):
        _agree(registry, _body_tokens([(CODE_DECIMAL, text)], False), Limits())


def test_atoms_made_in_c_are_the_pythons(registry: Registry) -> None:
    """A long decimal is constructed in C (a Decimal, never remembered), a URI made in C
    and remembered in the decoder's URI memo, a symbol and a keyword that miss validated,
    made and interned in C, in the reader's intern tables (issue 35); a short decimal that
    misses is validated and made in C and remembered in the decoder's decimal memo: none
    calls the decoder's ``keep`` (its make_atom without the checks), nor does an invalid
    one."""
    made: list[tuple[int, Any]] = []
    decoder = Decoder(registry)
    decoder.decode(_frame(registry, ["x"]))  # the envelope checked: the fast path runs
    memos = decoder._memos
    keep = memos.keep

    def spy(code: int, text: Any) -> Any:
        made.append((code, text))
        return keep(code, text)

    memos.keep = spy
    if decoder._frame_state is not None:  # (the whole-frame call reads keep from its state)
        decoder._frame_state = _codec._frame_state(registry, decoder.limits, memos)
    long, short = "12345.678", "2.5"
    symbol, keyword = "issue-19-symbol-x1", "issue-19-keyword-x1"
    body = _body_tokens([(CODE_DECIMAL, long), (CODE_DECIMAL, short),
                         (CODE_URI, "x-y://issue/19"), (CODE_SYMBOL, symbol),
                         (CODE_KEYWORD, keyword)], True)
    decoded = decoder.decode(_frame(registry, body)).body
    assert _typed(decoded) == (("Decimal", long), ("Decimal", short),
                               ("URI", "x-y://issue/19"), ("Symbol", symbol),
                               ("Keyword", keyword))
    assert type(decoded[0]) is Decimal and long not in memos.decimals  # type: ignore[index]
    assert made == []
    assert memos.decimals[short] == Decimal(short) and type(memos.decimals[short]) is Decimal
    assert decoded[3] is _reader._SYMBOLS[symbol]  # type: ignore[index]
    assert decoded[4] is _reader._KEYWORDS[keyword]  # type: ignore[index]
    assert short in memos.decimals and type(memos.uris["x-y://issue/19"]) is cbcl.URI
    made.clear()
    for code, text in ((CODE_SYMBOL, "-1a"), (CODE_KEYWORD, "a b"), (CODE_URI, "a://"),
                       (CODE_DECIMAL, "1.5.5")):
        with pytest.raises(cbcl.MalformedError):
            decoder.decode(_frame(registry, _body_tokens([(code, text)], False)))
    assert made == []
    assert _codec._DECIMAL_MEMO_CHARS == 4
    for code, text in ((CODE_URI, "x-y://issue/19"), (CODE_SYMBOL, symbol),
                       (CODE_KEYWORD, keyword), (CODE_DECIMAL, short)):
        assert _typed(keep(code, text)) == _typed(memos.make_atom(code, text))


# --------------------------------------------------------------------------- learned atoms

#: The learned atoms cbcl/_native_src/speedups.c keeps inline (LEARNED_INLINE) before its
#: table of them moves to the heap.
LEARNED_INLINE = 64


@pytest.mark.parametrize("count", [LEARNED_INLINE - 1, LEARNED_INLINE, LEARNED_INLINE + 1,
                                   2 * LEARNED_INLINE + 1])
def test_a_frame_learning_more_atoms_than_kept_inline(registry: Registry, count: int) -> None:
    """Names and URIs written in full get the next codes, however many a frame learns: a
    later code refers to each (the first, the last), and one written in full again is
    refused, wherever it falls, by the C and the Python decoders alike."""
    kinds = (CODE_SYMBOL, CODE_KEYWORD, CODE_URI)
    atoms = [(kinds[k % 3], f"learn-{count}-{k}" if k % 3 < 2 else f"x://learn/{count}/{k}")
             for k in range(count)]
    first = 7 + len(SymbolTable.of(registry.get("any/v1")).entry_list)  # type: ignore[arg-type]
    body = _body_tokens(atoms, False)
    _agree(registry, [CODE_LPAR, *body, first, first + count - 1, CODE_RPAR], Limits())
    decoded = Decoder(registry).decode(
        _frame(registry, [CODE_LPAR, *body, first, first + count - 1, CODE_RPAR])).body
    assert _typed(decoded[-2:]) == (_typed(decoded[0]), _typed(decoded[count - 1]))  # type: ignore[index]
    assert len(decoded) == count + 2  # type: ignore[arg-type]
    for again in (0, count // 2, count - 1):  # (a URI equal but not the same object too)
        repeated = [CODE_LPAR, *body, *_body_tokens([atoms[again]], False), CODE_RPAR]
        _agree(registry, repeated, Limits())
        with pytest.raises(cbcl.MalformedError):
            Decoder(registry).decode(_frame(registry, repeated))
    _agree(registry, [CODE_LPAR, *body, first + count, CODE_RPAR], Limits())  # (no such code)


@pytest.mark.parametrize("pure_python", [False, True])
def test_the_decimal_memo_is_bounded(registry: Registry, pure_python: bool) -> None:
    """Short decimals are remembered up to the memo's bound, N held and the memo emptied
    at N + 1, in C as in Python; longer ones never."""
    decoder = Decoder(registry, pure_python=pure_python)
    decoder.decode(_frame(registry, ["x"]))
    memos = decoder._memos
    memos.entries = 2
    if decoder._frame_state is not None:  # (the whole-frame call reads it from its state)
        decoder._frame_state = _codec._frame_state(registry, decoder.limits, memos)
    memos.decimals.clear()
    decoder.decode(_frame(registry, _body_tokens(
        [(CODE_DECIMAL, "0.1"), (CODE_DECIMAL, "0.2"), (CODE_DECIMAL, "12345.6")], True)))
    assert list(memos.decimals) == ["0.1", "0.2"]  # N held
    body = decoder.decode(_frame(registry, _body_tokens(
        [(CODE_DECIMAL, "0.2"), (CODE_DECIMAL, "0.3")], True))).body
    assert list(memos.decimals) == ["0.3"]  # N + 1: emptied, then kept
    assert body == (Decimal("0.2"), Decimal("0.3"))
