"""New names in the C readers (issue 35): a symbol, keyword or URI never seen before is
judged, made and interned in C, without a call into Python, by the reader's own rules and
into the reader's own tables, whose bounds hold.

Tests internals: the intern tables, the token cache and the C twins are private; what is
tested is that the C path gives what the Python reference gives, and calls no Python."""

from __future__ import annotations

import copy
import gc
import itertools
import pickle
import random
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import assume, given, settings, strategies as st

import cbcl
from cbcl import URI, Decoder, Encoder, Keyword, Registry, Symbol
from cbcl.binary import _codec
from cbcl.core import _reader
from cbcl.core._limits import DEFAULT_LIMITS
from cbcl.core._vocabulary import NUMBERLIKE_RE

native: Any
try:
    from cbcl import _native as native
except ImportError:  # pragma: no cover - the extension is optional
    native = None

pytestmark = pytest.mark.skipif(native is None, reason="cbcl._native is not built here")

_START = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz+-*/<>=!?_."
_REST = _START + "0123456789@%&"


def _refuse(*args: object) -> object:
    raise AssertionError(f"the C reader called into Python for {args!r}")


def _c_read(text: str, make_atom: Any = _refuse) -> Any:
    """The C reader on ``text`` with the reader's cache, ``make_atom`` given."""
    limits = DEFAULT_LIMITS
    return native.read_value(text, 0, _reader._CACHE, make_atom, limits.max_depth,
                             limits.max_list_items, limits.max_nodes,
                             limits.max_string_bytes, limits.max_name_chars)


def _fresh(rng: random.Random, count: int) -> Iterator[str]:
    """``count`` names no test has read: a random prefix none other has."""
    stem = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(12))
    for index in range(count):
        yield f"{stem}-{index}"


_EXAMPLES = itertools.count()
names = st.builds(lambda first, rest: first + rest, st.sampled_from(_START),
                  st.text(alphabet=_REST, max_size=20))


@settings(max_examples=300)
@given(st.lists(st.tuples(st.sampled_from(("symbol", "keyword", "uri")), names),
                min_size=1, max_size=30))
def test_new_names_read_in_c_are_the_references_atoms(items: list[tuple[str, str]]) -> None:
    """Every ASCII name the C reader reads is the value, of the type, the reference gives."""
    # (a run that starts like a number is a number or an error, never a symbol)
    assume(not any(kind == "symbol" and NUMBERLIKE_RE.match(name) for kind, name in items))
    # (each name new: an atom read before may be one made before its table was last
    # emptied, equal to the one the table holds now but not the same object)
    unique = next(_EXAMPLES)
    items = [(kind, f"{name}-u{unique}") for kind, name in items]
    tokens = [f":{name}" if kind == "keyword" else f"x.y-z://{name}" if kind == "uri" else name
              for kind, name in items]
    text = "(" + " ".join(tokens) + ")"
    reference = _reader.read_value_python(text, 0, DEFAULT_LIMITS, 0, 0)
    found = _c_read(text, _reader._atom)
    assert found is not None
    value, end, nodes = found
    assert (value, end, nodes) == reference
    expected = reference[0]
    assert isinstance(expected, tuple)
    assert [type(item) for item in value] == [type(item) for item in expected]
    for item in value:  # interned (unless the table has been emptied since, mid-read)
        if type(item) is Symbol:
            assert _reader._SYMBOLS.get(str.__str__(item), item) is item
        elif type(item) is Keyword:
            assert _reader._KEYWORDS.get(str.__str__(item), item) is item


def test_no_call_into_python_for_new_names() -> None:
    rng = random.Random("no-call")
    symbols = list(_fresh(rng, 200))
    keywords = list(_fresh(rng, 200))
    text = "(" + " ".join([*symbols, *(f":{n}" for n in keywords),
                          *(f"agent://{n}/x" for n in _fresh(rng, 200))]) + ")"
    value, _, _ = _c_read(text)
    assert [type(item) for item in value] == [Symbol] * 200 + [Keyword] * 200 + [URI] * 200
    # (the last of each kind: a table that fills up mid-read is emptied before an insert, so
    # the last name inserted is always there, the first may have gone with a flush)
    assert value[199] is _reader._SYMBOLS[symbols[-1]]
    assert value[399] is _reader._KEYWORDS[keywords[-1]]
    # (the test can fail: what stays Python's, a URI that is not ASCII, calls make_atom)
    with pytest.raises(AssertionError, match="called into Python"):
        _c_read(f"(agent://{symbols[0]}/é)")


def test_a_name_made_in_c_equals_and_hashes_as_one_made_in_python() -> None:
    rng = random.Random("same")
    (name,) = _fresh(rng, 1)
    (made,) = _c_read(f"({name})")[0]
    python = str.__new__(Symbol, name)
    assert made == python and hash(made) == hash(python) and made is not python
    assert cbcl.Symbol(name) is made  # the constructor finds the interned one


def test_the_intern_table_keeps_its_bound_and_its_pinned_names() -> None:
    rng = random.Random("bound")
    (pinned_name,) = _fresh(rng, 1)
    pinned = _reader.intern_symbol(pinned_name, pin=True)
    flood = list(_fresh(rng, 3 * _reader._INTERN_MAX))
    for start in range(0, len(flood), 2000):
        _c_read("(" + " ".join(flood[start:start + 2000]) + ")")
        assert len(_reader._SYMBOLS) <= _reader._INTERN_MAX
        assert len(_reader._CACHE) <= _reader._CACHE_MAX
    assert _reader._SYMBOLS[pinned_name] is pinned
    (again,) = _c_read(f"({pinned_name})")[0]
    assert again is pinned


def test_tokens_longer_than_the_cache_keeps_are_not_kept() -> None:
    """(URIs with a character that is not ASCII: the ones make_atom makes and the cache
    keeps; an ASCII URI is made in C and kept by the memo only.)"""
    rng = random.Random("long")
    (stem,) = _fresh(rng, 1)
    long_uri = ("agent://é" + stem * 20)[:_reader._CACHED_CHARS + 1]  # (URIs: no name limit)
    short_uri = ("agent://é" + stem * 20)[:_reader._CACHED_CHARS]
    _c_read(f"({long_uri} {short_uri})", _reader._atom)
    assert long_uri not in _reader._CACHE and short_uri in _reader._CACHE


def test_a_new_ascii_uri_is_made_in_c_without_a_token_cache_entry() -> None:
    """An ASCII URI is made at once (no lookup, no insert: a URI has no identity to keep);
    the memo gives the same object back while it holds it (issue 35)."""
    rng = random.Random("uri-in-c")
    (stem,) = _fresh(rng, 1)
    uri = f"agent://{stem}.example.net/x"
    (first, again), _, _ = _c_read(f"({uri} {uri})")
    assert type(first) is URI and first == URI(uri) and again is first
    assert uri not in _reader._CACHE


def test_new_atoms_are_not_tracked_by_the_collector() -> None:
    rng = random.Random("gc")
    symbol, keyword = _fresh(rng, 2)
    value, _, _ = _c_read(f"({symbol} :{keyword} agent://{symbol}/x)")
    assert [gc.is_tracked(item) for item in value] == [False, False, False]


def test_the_binary_decoder_interns_new_names_in_c(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = Registry(disk_cache=False, isolate=False)
    registry.load(_request_descriptor(), allow_unsigned=True)
    rng = random.Random("binary")
    encoder, decoder = Encoder(registry), Decoder(registry)

    def message_of(symbols: list[str], keywords: list[str]) -> cbcl.Message:
        result = tuple(Symbol(n) for n in symbols) + tuple(
            item for n in keywords for item in (Keyword(n), 1))
        return cbcl.Message(message_id="m-1", sender="agent://a", receiver="agent://b",
                            intent="INFORM", protocol="request/v1",
                            body=(Symbol("inform-result"), Keyword("action-id"), "a-1",
                                  Keyword("result"), result))

    # (a decoder's first frame of a protocol makes its plan, on the Python path)
    decoder.decode(encoder.encode(message_of(list(_fresh(rng, 2)), list(_fresh(rng, 2)))))
    symbols = list(_fresh(rng, 50))
    keywords = list(_fresh(rng, 50))
    message = message_of(symbols, keywords)
    frame = encoder.encode(message)
    # Forget the names (as a process that never read them), then decode with the Python
    # interning made to fail: only the C path may make them.
    for name in symbols:
        _reader._SYMBOLS.pop(name, None)
    for name in keywords:
        _reader._KEYWORDS.pop(name, None)

    def refuse(name: str, *, pin: bool = False) -> Any:
        raise AssertionError(f"interned in Python: {name}")

    monkeypatch.setattr(_codec, "intern_symbol", refuse)
    monkeypatch.setattr(_codec, "intern_keyword", refuse)
    decoded = decoder.decode(frame)
    assert decoded == message
    body = decoded.body
    assert isinstance(body, tuple) and isinstance(body[4], tuple)
    assert body[4][0] is _reader._SYMBOLS[symbols[0]]


def _request_descriptor() -> bytes:
    from pathlib import Path

    return (Path(__file__).resolve().parent.parent / "descriptors" /
            "request-v1.cbcl").read_bytes()


@pytest.fixture
def tables_restored() -> Iterator[None]:
    """The intern tables as they were before the test (which empties them): names other
    tests expect interned (unpinned ones among them) are the same objects again."""
    symbols, keywords = dict(_reader._SYMBOLS), dict(_reader._KEYWORDS)
    yield
    _reader._SYMBOLS.clear()
    _reader._SYMBOLS.update(symbols)
    _reader._KEYWORDS.clear()
    _reader._KEYWORDS.update(keywords)
    native.forget_atoms()


def _memo_slot(token: str) -> int:
    """The slot of the scanner's token memo that ``token`` goes to (cstack.h's memo_hash:
    FNV-1a over its bytes, on a 64-bit size_t, over 4096 slots)."""
    h = 2166136261
    for byte in token.encode():
        h = ((h ^ byte) * 16777619) & (2**64 - 1)
    return (h ^ (h >> 15)) % 4096


def _flood_symbols_in_c(rng: random.Random, spare: str) -> None:
    """Read more new symbols than the table holds: it is emptied (in C) at least once; the
    memo slot of ``spare`` is left alone, so only the emptying can make it forget."""
    keep = _memo_slot(spare)
    flood = [n for n in _fresh(rng, _reader._INTERN_MAX + 100) if _memo_slot(n) != keep]
    for start in range(0, len(flood), 4000):
        _c_read("(" + " ".join(flood[start:start + 4000]) + ")")


@pytest.mark.usefixtures("tables_restored")
def test_a_name_read_after_its_table_is_emptied_in_c_is_the_tables() -> None:
    """The memos are emptied with the table: no memo gives the atom from before."""
    rng = random.Random("flush-c")
    (name,) = _fresh(rng, 1)
    (before,) = _c_read(f"({name})")[0]
    _flood_symbols_in_c(rng, name)
    (after,) = _c_read(f"({name})")[0]
    assert after == before and after is _reader._SYMBOLS[name]


@pytest.mark.usefixtures("tables_restored")
def test_a_name_read_after_its_table_is_emptied_in_python_is_the_tables() -> None:
    rng = random.Random("flush-python")
    (name, keyword) = _fresh(rng, 2)
    _c_read(f"({name} :{keyword})")
    for other in _fresh(rng, _reader._INTERN_MAX + 10):  # (emptied by _intern)
        _reader.intern_symbol(other)
        _reader.intern_keyword(other)
    (symbol_after, keyword_after) = _c_read(f"({name} :{keyword})")[0]
    assert symbol_after is _reader._SYMBOLS[name]
    assert keyword_after is _reader._KEYWORDS[keyword]


@pytest.mark.parametrize("stem", ["", "-and-a-name-too-long-to-be-compact-x"])
def test_an_atom_made_in_place_is_what_str_new_makes(stem: str) -> None:
    """Atoms the C readers write field by field behave as str.__new__'s, every kind, the
    short ones written compact and the long ones as str.__new__ writes them."""
    rng = random.Random("in-place" + stem)
    name = next(_fresh(rng, 1)) + stem
    value, _, _ = _c_read(f"({name} :{name} agent://{name}/x)")
    for made, kind, text in zip(value, (Symbol, Keyword, URI),
                                (name, name, f"agent://{name}/x"), strict=True):
        python = str.__new__(kind, text)
        assert type(made) is kind and made == python and hash(made) == hash(python)
        assert str.__str__(made) == text and made.encode() == text.encode()
        assert len(made) == len(text) and made[1:] == text[1:] and made.isascii()
        assert made.upper() == python.upper() and made.split("-") == python.split("-")
        assert pickle.loads(pickle.dumps(made)) == made and copy.copy(made) == made
        assert sys.getsizeof(made) <= sys.getsizeof(python)
        assert not hasattr(made, "__dict__")


@pytest.mark.skipif(not (3, 11) <= sys.version_info[:2] <= (3, 13)
                    or sys.implementation.name != "cpython",
                    reason="atoms are written in place on CPython 3.11-3.13 only")
def test_a_short_new_name_is_one_block() -> None:
    """A new short name's atom is written as a compact str (its characters in the object,
    one allocation: issue 35), smaller than str.__new__'s two blocks; a long one is not."""
    rng = random.Random("compact")
    short = next(_fresh(rng, 1))
    long = short + "-" + "x" * 40
    (made_short, made_long), _, _ = _c_read(f"({short} {long})")
    assert sys.getsizeof(made_short) < sys.getsizeof(str.__new__(Symbol, short))
    assert sys.getsizeof(made_long) == sys.getsizeof(str.__new__(Symbol, long))


def test_no_collection_runs_while_a_body_of_new_names_is_read() -> None:
    """The collector is paused for the read (and as its caller left it after, and while
    make_atom runs): reading thousands of new atoms sets off at most the one collection
    the first allocation after the read may start."""
    rng = random.Random("collector")
    text = "(" + " ".join(_fresh(rng, 5000)) + ")"
    collections = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    assert gc.isenabled()
    gc.callbacks.append(count)
    try:
        _c_read(text)
    finally:
        gc.callbacks.remove(count)
    assert len(collections) <= 1 and gc.isenabled()

    seen = []

    def atom(token: str, max_name: int) -> object:
        seen.append(gc.isenabled())
        return _reader._atom(token, max_name)

    (stem,) = _fresh(rng, 1)
    _c_read(f"(agent://{stem}/é)", atom)  # (not ASCII: make_atom is called)
    assert seen == [True] and gc.isenabled()
    gc.disable()
    try:
        _c_read(f"(agent://{stem}/ü)", atom)
        assert seen == [True, False] and not gc.isenabled()
    finally:
        gc.enable()


def test_a_new_keyword_is_interned_by_its_name_without_a_token_cache_entry() -> None:
    """A keyword's intern table is its cache (as a symbol's): the C reader looks it up by
    the name, enters a new one there only, and its memo never gives a keyword for the
    symbol of the same name or the other way round (issue 35)."""
    rng = random.Random("keyword-by-name")
    names = list(_fresh(rng, 3))
    text = "(" + " ".join(f":{n} {n} :{n}" for n in names) + ")"
    for _ in range(2):  # (the second read: from the memo)
        value, _, _ = _c_read(text)
        for index, name in enumerate(names):
            first, symbol, again = value[3 * index:3 * index + 3]
            assert type(first) is Keyword and type(symbol) is Symbol
            assert first is again is _reader._KEYWORDS[name] is cbcl.Keyword(name)
            assert symbol is _reader._SYMBOLS[name]
            assert f":{name}" not in _reader._CACHE


# ------------------------------------------------------- the intern tables in C (intern.c)
#
# Where the extension is built, the intern tables are cbcl._native.NameTables: open
# addressing over atoms, no key str, the name's hash the one str gives it. Held here to
# the Python reference's _intern over a dict (the same bound, pinned names and identity).

_ANY_NAME = st.text(max_size=12)  # (non-ASCII too: intern() takes any str, unchecked)


def _python_intern(table: dict[str, Any], pinned: dict[str, Any], name: str, pin: bool,
                   bound: int, monkeypatch: pytest.MonkeyPatch) -> Any:
    with monkeypatch.context() as patch:
        patch.setattr(_reader, "_INTERN_MAX", bound)
        return _reader._intern(table, pinned, Symbol, name, pin)


def test_the_reader_tables_are_native_and_hash_as_str() -> None:
    symbols: Any = _reader._SYMBOLS
    keywords: Any = _reader._KEYWORDS
    assert type(symbols) is native.NameTable and type(keywords) is native.NameTable
    assert symbols.bound == keywords.bound == _reader._INTERN_MAX == 8192
    assert symbols.pinned is _reader._PINNED_SYMBOLS
    assert keywords.pinned is _reader._PINNED_KEYWORDS
    # (the names' hash is taken from their bytes: checked against str's at creation)
    assert symbols.hashes_bytes and keywords.hashes_bytes
    # (the decoders' caches: empty dicts, a miss in which goes to the table)
    assert _reader._SYMBOL_CACHE == {} and _reader._KEYWORD_CACHE == {}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 11), st.booleans()), min_size=1, max_size=60),
       st.lists(st.text(alphabet="ab", min_size=1, max_size=3), min_size=12, max_size=12,
                unique=True),
       st.integers(1, 5))
def test_a_name_table_is_held_to_the_python_intern(ops: list[tuple[int, bool]],
                                                   pool: list[str], bound: int) -> None:
    """The same names interned (some pinned) into a NameTable and, by the reference's
    _intern, into a dict of the same bound: the same names held after each step, the same
    atoms kept or made again (identity), and each atom's hash str's."""
    monkeypatch = pytest.MonkeyPatch()
    table = native.NameTable(0, bound, {})
    reference: dict[str, Any] = {}
    pinned: dict[str, Any] = {}
    seen_c: dict[str, Any] = {}
    seen_py: dict[str, Any] = {}
    for index, pin in ops:
        name = pool[index]
        mine = table.intern(name, pin)
        theirs = _python_intern(reference, pinned, name, pin, bound, monkeypatch)
        assert type(mine) is Symbol and mine == theirs
        assert str.__str__(mine) == name
        assert hash(mine) == hash(name) == hash(str.__str__(mine))
        # (kept or made again: the same answer in both)
        assert (seen_c.get(name) is mine) == (seen_py.get(name) is theirs)
        seen_c[name], seen_py[name] = mine, theirs
        assert sorted(table) == sorted(reference) and len(table) == len(reference)
        assert len(table) <= bound
        assert sorted(table.pinned) == sorted(pinned)
        for held in reference:
            assert table[held] is seen_c[held]


def test_a_name_table_holds_n_names_and_empties_at_n_plus_one() -> None:
    N = 16
    pinned_dict: dict[str, Any] = {}
    table = native.NameTable(1, N, pinned_dict)
    keep = table.intern("kept", True)
    assert pinned_dict == {"kept": keep}
    names = [f"n{i}" for i in range(N - 1)]
    made = [table.intern(name) for name in names]
    assert len(table) == N  # (at N: nothing lost)
    assert all(table.intern(name) is atom for name, atom in zip(names, made, strict=True))
    assert all(type(atom) is Keyword for atom in made)
    extra = table.intern("one-more")  # (N + 1: emptied down to the pinned name first)
    assert len(table) == 2 and sorted(table) == ["kept", "one-more"]
    assert table["kept"] is keep and table["one-more"] is extra
    assert table.intern("n0") is not made[0] and table.intern("n0") == made[0]


def test_emptying_a_name_table_forgets_the_native_memos() -> None:
    rng = random.Random("forget")
    (name,) = _fresh(rng, 1)
    (before,) = _c_read(f"({name})")[0]  # (in the scanner's memo now)
    table = native.NameTable(0, 1, {})
    table.intern("a")
    table.intern("b")  # (full: emptied, and the module's memos with it)
    assert _reader._SYMBOLS.pop(name) is before  # (gone from the reader's table too)
    (after,) = _c_read(f"({name})")[0]
    assert after == before and after is not before  # (not the memo's old atom)
    assert after is _reader._SYMBOLS[name] is cbcl.Symbol(name)


@settings(max_examples=100, deadline=None)
@given(st.lists(_ANY_NAME, min_size=1, max_size=40, unique=True))
def test_a_name_table_is_a_mapping_of_any_names(texts: list[str]) -> None:
    """Any str (not ASCII, empty, surrogates): found by its text, hashed as str, removed
    and entered again as a dict would."""
    table = native.NameTable(0, 64, {})
    atoms = {text: table.intern(text) for text in texts}
    for text, atom in atoms.items():
        assert table.get(text) is atom and table[text] is atom and text in table
        assert hash(atom) == hash(text) and str.__str__(atom) == text
    assert sorted(table) == sorted(texts) and sorted(table.keys()) == sorted(texts)
    gone = texts[::2]
    for text in gone:
        assert table.pop(text) is atoms[text]
    for text in texts:
        assert (text in table) == (text not in gone)
        assert table.get(text, 0) == (0 if text in gone else atoms[text])
    assert table.get(1) is None and 1 not in table  # (no str: held by no table)
    table.update({text: atoms[text] for text in gone})
    assert all(table[text] is atom for text, atom in atoms.items())
    with pytest.raises(ValueError, match="its own text"):
        table["x"] = Symbol("y")
    del table[texts[0]]
    with pytest.raises(KeyError):
        table[texts[0]]
    table.clear()
    assert len(table) == 0 and list(table) == []


def _colliding(mask: int, count: int, stem: str) -> list[str]:
    """``count`` names whose hashes all fall on the same slot of a table of mask + 1."""
    found: list[str] = []
    target = None
    for index in itertools.count():
        name = f"{stem}{index}"
        home = hash(name) & mask
        if target is None:
            target = home
        if home == target:
            found.append(name)
            if len(found) == count:
                return found
    raise AssertionError  # pragma: no cover


@settings(max_examples=40, deadline=None)
@given(st.permutations(range(12)), st.sets(st.integers(0, 11), max_size=6))
def test_near_collisions_probe_and_remove_as_a_dict(order: list[int],
                                                    removed: set[int]) -> None:
    """Names on one slot (and names one character apart): each found, each removed without
    losing the others past it (linear probing's backward shift)."""
    table = native.NameTable(0, 16, {})  # (32 slots)
    names = [*_colliding(31, 8, "c"), "ab", "ba", "abc", "abd"]
    atoms = {names[i]: table.intern(names[i]) for i in order}
    for i in sorted(removed):
        assert table.pop(names[i]) is atoms[names[i]]
    for i, name in enumerate(names):
        assert (table.get(name) is atoms[name]) == (i not in removed)
    for i in sorted(removed):
        atoms[names[i]] = table.intern(names[i])
    assert all(table[name] is atom for name, atom in atoms.items())
    assert len(table) == len(names)


def test_a_name_read_and_a_name_constructed_are_one_object() -> None:
    rng = random.Random("constructed")
    symbol, keyword = _fresh(rng, 2)
    assert cbcl.Symbol(symbol) is not cbcl.Symbol(symbol)  # (not interned: not held)
    value = cbcl.read(f"({symbol} :{keyword})".encode())
    assert isinstance(value, tuple)
    read_symbol, read_keyword = value
    assert cbcl.Symbol(symbol) is read_symbol and cbcl.Keyword(keyword) is read_keyword
    assert cbcl.Keyword(f":{keyword}") is read_keyword
    assert hash(read_symbol) == hash(symbol) and hash(read_keyword) == hash(keyword)
    assert _reader.intern_symbol(symbol) is read_symbol
    assert _reader.intern_keyword(keyword) is read_keyword
