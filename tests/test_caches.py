"""The caches of the package (issue 14): each is owned by the object that uses it, or is a
pure, documented, process-wide memo; every one is bounded. For each: filling it to its
bound N keeps it at N, the N+1-th entry keeps it within N, and results stay right after
it empties.

Tests internals: the caches live in private modules (``_codec``, ``_reader``, ``_schema``…)."""

from __future__ import annotations

import functools
import gc
import importlib
import inspect
import itertools
import pkgutil
import re
import weakref
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

import cbcl
from cbcl import Decoder, Encoder, Limits, Registry
from cbcl.binary import _codec
from cbcl.core import _reader
from cbcl.protocol import _evaluator, _fields, _schema

ROOT = Path(__file__).parent.parent
ANY = (b'(protocol-descriptor (id any/v1) (version 1) (intents INFORM NOT-UNDERSTOOD) '
       b'(grammar "body: value"))')
N = 4


def _registry(count: int = 0) -> Registry:
    """A registry with any/v1 and ``count`` more small protocols."""
    registry = Registry(disk_cache=False, isolate=False)
    registry.load(ANY, allow_unsigned=True)
    for i in range(count):
        registry.load((f'(protocol-descriptor (id p{i}/v1) (version 1) (intents INFORM) '
                       f'(grammar "body: \\"(\\" \\"w{i}\\" value* \\")\\""))').encode(),
                      allow_unsigned=True)
    return registry


@pytest.fixture(scope="module")
def registry() -> Registry:
    return _registry()


def _frame(registry: Registry, body: str, sender: str = "agent://a",
           receiver: str = "agent://b", protocol: str = "any/v1") -> tuple[bytes, Any]:
    message = cbcl.parse(f'(CBCL/1.0 (message-id "m") (sender {sender}) (receiver {receiver}) '
                         f"(intent INFORM) (protocol {protocol}) (body {body}))",
                         registry=registry)
    return Encoder(registry).encode(message), message


_FRESH = itertools.count()


def _fresh_uri_frames(registry: Registry, count: int) -> list[tuple[bytes, Any]]:
    """``count`` frames, each from its own sender to one receiver, all URIs no frame has
    had before in this process: the C decoder's process-wide atom memo, in front of each
    decoder's own, would otherwise find them without a look at the decoder's."""
    tag = next(_FRESH)
    return [_frame(registry, "x", sender=f"agent://fresh-{tag}-{i}",
                   receiver=f"agent://fresh-{tag}-r") for i in range(count)]


def _decoders(registry: Registry, **options: Any) -> list[Decoder]:
    return [Decoder(registry, **options), Decoder(registry, pure_python=True, **options)]


# --------------------------------------------------------------------------- the codec


def test_each_decoder_owns_its_memos(registry: Registry) -> None:
    """The URIs and decimals a decoder validated are its own, in the C path as in Python:
    another decoder starts empty, and the module holds none. (The C decoder's atom memo,
    process-wide and listed in the spec, sits in front: these URIs are new to it.)"""
    tag = next(_FRESH)
    a, b, x = (f"agent://owned-{tag}-{name}" for name in "abx")
    frame, message = _frame(registry, f"({x} 1.5)", sender=a, receiver=b)
    for decoder in _decoders(registry):
        other = Decoder(registry)
        assert decoder.decode(frame) == message
        assert decoder.decode(frame) == message  # (the fast path, its envelope checked)
        memos = decoder._memos
        assert {a, b, x} <= set(memos.uris)
        assert "1.5" in memos.decimals
        assert memos.caches[_codec.URI_CODE] is memos.uris
        assert memos.caches[_codec.DECIMAL] is memos.decimals
        assert not other._memos.uris and not other._memos.decimals
    for name in ("_URIS", "_DECIMALS", "_ATOM_CACHES", "_make_atom", "_known_uri"):
        assert not hasattr(_codec, name), name


@pytest.mark.parametrize("pure_python", [False, True])
def test_a_decoders_uri_memo_is_bounded(monkeypatch: pytest.MonkeyPatch, registry: Registry,
                                        pure_python: bool) -> None:
    monkeypatch.setattr(_codec, "MEMO_ENTRIES", N)
    decoder = Decoder(registry, pure_python=pure_python)
    uris = decoder._memos.uris
    frames = _fresh_uri_frames(registry, N + 3)
    for frame, message in frames[: N - 1]:  # each adds its sender; the receiver is shared
        assert decoder.decode(frame) == message
    assert len(uris) == N
    for frame, message in frames[N - 1:]:
        assert decoder.decode(frame) == message
        assert len(uris) <= N
    for frame, message in frames:  # after emptying, the same results
        decoded = decoder.decode(frame)
        assert decoded == message and type(decoded.sender) is cbcl.URI
        assert len(uris) <= N


@pytest.mark.parametrize("pure_python", [False, True])
def test_a_decoders_decimal_memo_is_bounded(monkeypatch: pytest.MonkeyPatch,
                                            registry: Registry, pure_python: bool) -> None:
    monkeypatch.setattr(_codec, "MEMO_ENTRIES", N)
    decoder = Decoder(registry, pure_python=pure_python)
    decoder.decode(_frame(registry, "x")[0])  # the envelope checked: the fast path runs
    decimals = decoder._memos.decimals
    frames = [_frame(registry, f"{i}.5") for i in range(N + 3)]
    for frame, message in frames[:N]:
        assert decoder.decode(frame) == message
    assert len(decimals) == N
    for frame, message in frames[N:] + frames:
        decoded = decoder.decode(frame)
        assert decoded == message and type(decoded.body) is Decimal
        assert len(decimals) <= N
    long = _frame(registry, "12345.5")  # longer than 4 characters: never kept
    assert decoder.decode(long[0]) == long[1] and "12345.5" not in decimals


def test_long_uris_are_not_remembered(registry: Registry) -> None:
    uri = "agent://" + "x" * _codec.MEMO_CHARS
    frame, message = _frame(registry, uri, sender=uri)
    for decoder in _decoders(registry):
        assert decoder.decode(frame) == message
        assert decoder.decode(frame) == message
        assert uri not in decoder._memos.uris


def test_a_decoders_symbol_tables_are_one_per_protocol() -> None:
    registry = _registry(3)
    decoder = Decoder(registry)
    frame, message = _frame(registry, "(w1 a)", protocol="p1/v1")
    for _ in range(3):
        assert decoder.decode(frame) == message
    assert len(decoder._memos.by_digest) == len(registry.protocols()) == 4


def test_the_envelope_memo_is_bounded(monkeypatch: pytest.MonkeyPatch,
                                      registry: Registry) -> None:
    """Process-wide (a pure memo: its key is all the check reads); bounded."""
    memo: set[Any] = set()
    monkeypatch.setattr(_codec, "_ENVELOPE_WITHIN_LIMITS", memo)
    monkeypatch.setattr(_codec, "_ENVELOPE_WITHIN_LIMITS_MAX", N)
    frame, message = _frame(registry, "x")
    decoders = [_decoders(registry, limits=Limits(max_list_items=100 + i))
                for i in range(N + 2)]
    for pair in decoders[:N]:
        for decoder in pair:
            assert decoder.decode(frame) == message
    assert len(memo) == N
    for pair in decoders[N:] + decoders:
        for decoder in pair:
            assert decoder.decode(frame) == message
            assert len(memo) <= N


# --------------------------------------------------------------------------- one-shot


def test_one_shot_decode_builds_the_symbol_tables_once(monkeypatch: pytest.MonkeyPatch,
                                                       ) -> None:
    """cbcl.decode(frame, registry=R) reuses R's default tables: the first call builds
    one per loaded protocol, later ones none, however many protocols are loaded."""
    built: list[Any] = []
    real = _codec.SymbolTable.of.__func__  # type: ignore[attr-defined]

    def counting(cls: Any, protocol: Any) -> Any:
        built.append(protocol.id)
        return real(cls, protocol)

    monkeypatch.setattr(_codec.SymbolTable, "of", classmethod(counting))
    for count in (3, 12):
        registry = _registry(count)
        frame, message = _frame(registry, "(w0 a 1.5 agent://x)", protocol="p0/v1")
        built.clear()  # (the encoder's)
        for _ in range(20):
            assert cbcl.decode(frame, registry=registry) == message
            assert cbcl.decode(frame, registry=registry, limits=Limits()) == message
        assert len(built) == count + 1  # once, for all twenty-times-two calls
        built.clear()


def test_one_shot_decode_follows_the_registry(registry: Registry) -> None:
    """A protocol loaded after the first call is decoded (its table is built then)."""
    registry = _registry()
    frame, message = _frame(registry, "x")
    assert cbcl.decode(frame, registry=registry) == message
    registry.load(b'(protocol-descriptor (id late/v1) (version 1) (intents INFORM) '
                  b'(grammar "body: \\"(\\" \\"late\\" \\")\\""))', allow_unsigned=True)
    late, expected = _frame(registry, "(late)", protocol="late/v1")
    assert cbcl.decode(late, registry=registry) == expected
    assert cbcl.decode(frame, registry=registry) == message


def test_one_shot_memos_are_bounded_and_die_with_the_registry(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_codec, "MEMO_ENTRIES", N)
    registry = _registry()
    frames = _fresh_uri_frames(registry, N + 3)
    for frame, message in frames + frames:
        assert cbcl.decode(frame, registry=registry) == message
    memos = registry._one_shot
    assert 0 < len(memos.uris) <= N
    assert _codec._one_shot_memos(registry) is memos  # one per registry
    gone = weakref.ref(registry)
    del registry, memos
    gc.collect()
    assert gone() is None  # the memos never keep their registry alive


def test_one_shot_decode_checks_its_arguments(registry: Registry) -> None:
    frame, _ = _frame(registry, "x")
    with pytest.raises(TypeError, match="registry"):
        cbcl.decode(frame, registry=object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="limits"):
        cbcl.decode(frame, registry=registry, limits=object())  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the reader


def test_the_reader_token_memo_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Process-wide (a pure memo of token text -> atom, which the C twin fills through
    ``_atom``); bounded, and right after it empties."""
    _reader._CACHE.clear()
    monkeypatch.setattr(_reader, "_CACHE_MAX", N)
    max_name = cbcl.Limits().max_name_chars
    for i in range(N):
        assert _reader._atom(f"memo-{i}", max_name) == cbcl.Symbol(f"memo-{i}")
    assert len(_reader._CACHE) == N
    for i in range(N, 3 * N):
        assert _reader._atom(f"memo-{i}", max_name) == cbcl.Symbol(f"memo-{i}")
        assert _reader._atom(f"agent://m{i}", max_name) == cbcl.URI(f"agent://m{i}")
        assert len(_reader._CACHE) <= N
        assert cbcl.read(f"(memo-{i} agent://m{i})") == (
            cbcl.Symbol(f"memo-{i}"), cbcl.URI(f"agent://m{i}"))
    assert cbcl.read('(memo-0 "s" (x))') == (cbcl.Symbol("memo-0"), "s", (cbcl.Symbol("x"),))
    _reader._CACHE.clear()


def test_the_intern_tables_are_bounded_and_keep_identity(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Process-wide on purpose (interned identity); bounded down to the pinned names."""
    symbols: dict[str, Any] = {}
    monkeypatch.setattr(_reader, "_SYMBOLS", symbols)
    monkeypatch.setattr(_reader, "_PINNED_SYMBOLS", {})
    monkeypatch.setattr(_reader, "_INTERN_MAX", N)
    pinned = _reader.intern_symbol("pinned", pin=True)
    made = [_reader.intern_symbol(f"n{i}") for i in range(N - 1)]
    assert len(symbols) == N and _reader.intern_symbol("n0") is made[0]
    for i in range(N - 1, 3 * N):
        assert _reader.intern_symbol(f"n{i}") == cbcl.Symbol(f"n{i}")
        assert len(symbols) <= N
    assert _reader.intern_symbol("pinned") is pinned
    assert _reader.intern_symbol("n0") == made[0]


# --------------------------------------------------------------------------- schemas, fields


def _schema_section(i: int) -> Any:
    return cbcl.read(f"(schema (record r{i} (:n (integer :min {i}) required)))")


def test_the_schema_memo_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Process-wide (a pure memo: canonical text -> an immutable Schema); bounded."""
    memo: dict[str, Any] = {}
    monkeypatch.setattr(_schema, "_CACHE", memo)
    monkeypatch.setattr(_schema, "_CACHE_MAX", N)
    compiled = [_schema.compile_schema(_schema_section(i)) for i in range(N)]
    assert len(memo) == N
    assert _schema.compile_schema(_schema_section(0)) is compiled[0]  # found
    for i in range(N, 3 * N):
        _schema.compile_schema(_schema_section(i))
        assert len(memo) <= N
    again = _schema.compile_schema(_schema_section(0))  # dropped: compiled again, equal
    assert again is not compiled[0] and again == compiled[0]
    cbcl.conversation.check_schema(again, cbcl.read("(r0 :n 5)"))
    with pytest.raises(cbcl.SchemaError):
        cbcl.conversation.check_schema(_schema_section(0), cbcl.read("(r0 :n -1)"))
    with pytest.raises(cbcl.DescriptorError):
        _schema.compile_schema(cbcl.read("(schema (nope))"))
    assert len(memo) <= N


def test_large_schema_sections_are_not_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    memo: dict[str, Any] = {}
    monkeypatch.setattr(_schema, "_CACHE", memo)
    monkeypatch.setattr(_schema, "_CACHE_CHARS", 20)
    assert _schema.compile_schema(_schema_section(1)) == _schema.compile_schema(
        _schema_section(1))
    assert not memo


def test_the_python_key_memo_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Process-wide (a pure memo: argument name -> its keyword); bounded."""
    memo: dict[str, Any] = {}
    monkeypatch.setattr(_fields, "_PYTHON_KEYS", memo)
    monkeypatch.setattr(_fields, "_PYTHON_KEYS_MAX", N)
    keys = [_fields._python_key(f"key_{i}") for i in range(N)]
    assert len(memo) == N and _fields._python_key("key_0") is keys[0]
    for i in range(N, 3 * N):
        assert _fields._python_key(f"key_{i}") == cbcl.Keyword(f"key-{i}")
        assert len(memo) <= N
    assert _fields._python_key("key_0") == keys[0]
    assert _fields._python_key("from_") == cbcl.Keyword("from")
    with pytest.raises(ValueError):
        _fields._python_key("not a key")
    long = "k" * (_fields._PYTHON_KEY_CHARS + 1)
    assert _fields._python_key(long) == cbcl.Keyword(long) and long not in memo
    assert len(memo) <= N


# --------------------------------------------------------------------------- the rest


def test_the_evaluator_keeps_no_memo() -> None:
    section = cbcl.read("(functions + now)")
    assert _evaluator.read_functions(section) == frozenset({"+", "now"})
    assert not hasattr(_evaluator, "_allowed_from_text")


def test_every_functools_cache_in_the_package_is_bounded() -> None:
    """No unbounded ``functools.cache``/``lru_cache(None)`` at module level (but of a
    function without arguments: one value); the evaluator, which had one, has none."""
    import cbcl as package

    found = []
    for info in pkgutil.walk_packages(package.__path__, "cbcl."):
        if info.name.endswith(("__main__", "_compile_worker", "_native")):  # (no Python)
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            info_of = getattr(value, "cache_info", None)
            if callable(info_of) and isinstance(value, functools._lru_cache_wrapper):
                found.append((info.name, name))
                assert info_of().maxsize is not None or not inspect.signature(
                    value).parameters, (info.name, name)
    assert not [name for name in found if name[0] == "cbcl.protocol._evaluator"]


def test_the_spec_lists_every_process_wide_memo() -> None:
    """spec/cbcl-1.0.md's table of process-wide memos names caches that exist."""
    text = (ROOT / "spec" / "cbcl-1.0.md").read_text(encoding="utf-8")
    section = text.split("#### Process-wide memos", 1)[1].split("\n#", 1)[0]
    names = [name for row in re.findall(r"^\| ([^|]*) \|", section, re.MULTILINE)
             for name in re.findall(r"`cbcl\.([\w.]+)\.(\w+)`", row)]
    assert {f"{module}.{name}" for module, name in names} >= {
        "binary._codec._ENVELOPE_WITHIN_LIMITS", "core._reader._CACHE", "core._reader._SYMBOLS",
        "core._reader._KEYWORDS", "protocol._schema._CACHE", "protocol._fields._PYTHON_KEYS"}
    for module, name in names:
        assert hasattr(importlib.import_module(f"cbcl.{module}"), name), (module, name)
