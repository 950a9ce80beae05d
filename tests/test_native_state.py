"""``cbcl._native`` keeps its state in its module state (cbcl/_native_src/native.h), not in
process-wide variables: the collector sees through the module object everything the state
holds (its m_traverse) and can free a module object that nothing else keeps; a second
module object has a state of its own, which its teardown clears without touching the
first's; the C sources define no mutable object of static duration; and the module
loads in subinterpreters (it declares Py_MOD_PER_INTERPRETER_GIL_SUPPORTED), one module
object per interpreter, each set up by that interpreter's cbcl.

cbcl itself needs ``cryptography``, whose Rust extension loads in one interpreter of a
process (the first that imports it) and in no isolated one: so the isolated subinterpreter
beside this process's main interpreter imports ``cbcl.core`` and the extension only
(through a bare ``cbcl`` package, whose ``__init__`` would import cryptography), and all of
cbcl runs in a legacy subinterpreter of a fresh process, where it is the first to import it.

Tests internals: the extension's module objects, its C sources and the subinterpreter
modules of CPython (``_interpreters`` from 3.13, ``_xxsubinterpreters`` before)."""

from __future__ import annotations

import gc
import importlib
import importlib.util
import re
import subprocess
import sys
import textwrap
import weakref
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import cbcl
from cbcl import Registry
from cbcl.binary import _codec
from cbcl.core import _values
from cbcl.protocol import _api, _message

PACKAGE = Path(cbcl.__file__).resolve().parent
SOURCES = PACKAGE / "_native_src"

native: ModuleType | None
try:
    native = importlib.import_module("cbcl._native")
except ImportError:  # pragma: no cover - built wherever a C compiler exists
    native = None
needs_native = pytest.mark.skipif(native is None, reason="cbcl._native is not built")

interpreters: Any  # (CPython's low-level subinterpreter module, where there is one)
for _name in ("_interpreters", "_xxsubinterpreters"):
    try:
        interpreters = importlib.import_module(_name)
        break
    except ImportError:
        interpreters = None
#: From 3.12, where the module declares its interpreters (Py_mod_multiple_interpreters):
#: 3.11's _decimal keeps one ContextVar for all interpreters, which a destroyed
#: subinterpreter leaves pointing at its freed context (CPython's use-after-free, whatever
#: else the interpreters import), and 3.12's does so for legacy subinterpreters.
needs_interpreters = pytest.mark.skipif(
    interpreters is None or sys.version_info < (3, 12),
    reason="no subinterpreters with Py_mod_multiple_interpreters here")

ANY = (b'(protocol-descriptor (id any/v1) (version 1) (intents INFORM NOT-UNDERSTOOD) '
       b'(grammar "body: value"))')
TEXT = (b'(CBCL/1.0 (message-id "m") (sender agent://a) (receiver agent://b) (intent INFORM) '
        b'(protocol any/v1) (body (x 12.345 -0.5 :k "s" agent://c 99)))')
VALUE = b'(hello :k 12.345 "s" agent://x 99 -0.5)'
REGISTRY = Registry(disk_cache=False, isolate=False)
REGISTRY.load(ANY, allow_unsigned=True)

#: (the bound callable, the Python function its entry stands in for)
ENTRIES: list[tuple[Any, Callable[..., Any]]] = [
    (cbcl.parse, _api.parse_python),
    (cbcl.Message.canonical, _message.canonical_python),
    (cbcl.Encoder.encode, _codec.encode_python),
    (cbcl.Decoder.decode, _codec.decode_python),
    (cbcl.decode, _codec.decode_one_shot_python),
]


def round_trip() -> None:
    """parse, encode, decode (a decoder's, twice: the C tier serves the second) and the
    one-shot decode of one message in this interpreter, each the Python twin's."""
    message = cbcl.parse(TEXT, registry=REGISTRY)
    assert message == _api.parse_python(TEXT, registry=REGISTRY)
    assert message.canonical().encode() == TEXT
    frame = cbcl.Encoder(REGISTRY, validate=False).encode(message)
    decoder = cbcl.Decoder(REGISTRY)
    assert decoder.decode(frame) == decoder.decode(frame) == message
    assert cbcl.decode(frame, registry=REGISTRY) == message


# --------------------------------------------------------------------------- the state

@needs_native
def test_the_collector_sees_what_the_state_holds() -> None:
    """The types, value types and entries' fallbacks are held by the state alone (the
    module's dict is one referent): the module's m_traverse visits them."""
    assert native is not None
    referents = gc.get_referents(native)
    held: list[object] = [Decimal, _values.Symbol, _values.Keyword, _values.URI,
                          native.FrameState, native.MethodEntry, cbcl.Message,
                          _message.Signature, Registry]
    held += [python for bound, python in ENTRIES if bound is not python]
    missing = [thing for thing in held if not any(r is thing for r in referents)]
    assert not missing


@needs_native
def test_another_module_object_has_a_state_of_its_own() -> None:
    assert native is not None
    spec = native.__spec__
    assert spec is not None and spec.loader is not None
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    assert fresh is not native and fresh.FrameState is not native.FrameState
    # set up by cbcl in the first module only: the fresh one's writers decline
    value = cbcl.read(VALUE)
    assert native.canonical(value) == VALUE.decode()
    assert fresh.canonical(value) is None
    # its reader works with its own memo and value types
    cache: dict[str, object] = {}
    args = (VALUE.decode(), 0, cache, lambda token, limit: cbcl.read(token), 64, 64, 1000,
            1000, 64)
    assert fresh.read_value(*args) == native.read_value(*args) == (value, len(VALUE), 8)
    assert fresh.decimals_in_place() == native.decimals_in_place()
    # a decoder's FrameState is the first module's type, which the fresh one refuses
    decoder = cbcl.Decoder(REGISTRY)
    assert isinstance(decoder._frame_state, native.FrameState)
    frame = cbcl.Encoder(REGISTRY).encode(cbcl.parse(TEXT, registry=REGISTRY))
    with pytest.raises(TypeError, match="must be a FrameState"):
        fresh.decode_frame(frame, decoder._frame_state)
    # nothing but the collector frees it (module -> state -> FrameState -> module): its
    # m_traverse lets the collector see the cycle, m_clear breaks it; the first is intact
    gone = weakref.ref(fresh)
    del fresh, spec
    gc.collect()
    assert gone() is None
    round_trip()
    assert native.canonical(value) == VALUE.decode()


# --------------------------------------------------------------------------- the sources

#: Objects of static duration that may be mutable: the definitions the C API takes (it
#: takes them by non-const pointer, and never writes them but PyModuleDef's base, which
#: the runtime owns). Every other static (or file-scope) object must be const.
API_TABLES = ("PyMethodDef", "PyMemberDef", "PyGetSetDef", "PyType_Slot", "PyType_Spec",
              "PyModuleDef_Slot", "struct PyModuleDef")


#: A comment, or a string or character literal (the leftmost first: "/*" in a string is text)
TOKENS = re.compile(r"""/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'""", re.S)


def without_comments_and_literals(source: str) -> str:
    """C source with comments blanked (their newlines kept), string and character
    literals emptied and preprocessor lines removed."""
    source = TOKENS.sub(lambda m: '""' if m.group()[0] in "\"'" else
                        re.sub(r"[^\n]", " ", m.group()), source)
    return re.sub(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", "", source, flags=re.M)


def mutable_statics(source: str) -> list[str]:
    """The declarations of ``source`` that define an object of static duration which may
    change: a ``static`` object (at any scope) or a file-scope definition, neither of an
    API table type (:data:`API_TABLES`) nor const itself (a pointer must be ``* const``)."""
    text = without_comments_and_literals(source)
    found = []
    starts = [m.start() for m in re.finditer(r"\bstatic\b", text)]
    # file-scope definitions that are not static: a line at column 0 that initialises
    # or ends an object's declaration (functions, types and externs excluded)
    starts += [m.start() for m in re.finditer(
        r"^(?!static\b|typedef\b|enum\b|struct\s+\w+\s*\{|extern\b|CBCL_INTERNAL\b)"
        r"[A-Za-z_][^(){};=\n]*[;=]", text, flags=re.M)]
    for start in starts:
        end = re.compile(r"[(=;{]").search(text, start)
        assert end is not None
        if end.group() == "(":
            continue  # a function (or its prototype)
        declaration = " ".join(text[start:end.start()].split())
        if any(re.search(rf"\b{re.escape(kind)}\b", declaration) for kind in API_TABLES):
            continue
        pointer = declaration.rfind("*")
        const = (re.search(r"\bconst\b", declaration[pointer:]) if pointer >= 0 else
                 re.search(r"\bconst\b", declaration))
        if not const:
            found.append(declaration)
    return found


def test_the_checker_finds_what_it_must() -> None:
    """The scan below finds mutable statics of every kind, and no const one."""
    source = textwrap.dedent("""\
        static PyObject *S_LPAR, *S_RPAR; /* a comment: static int nope; */
        static int Flag = 1;
        static long BITS[6] = {-1};
        static const char *NAMES[] = {"a"};
        static MemoSlot memo[MEMO_SLOTS];
        PyObject *exported = NULL;
        static const char *const FINE[] = {"static int x;"};
        static const unsigned char TABLE[256] = {0};
        static PyMethodDef methods[] = {{NULL}};
        static int function(void);
        static inline int helper(int x) { static int counter; return x; }
        int
        cbcl_exec(PyObject *module)
        {
            static const int fine[2] = {1, 2};
            return 0;
        }
        """)
    assert mutable_statics(source) == [
        "static PyObject *S_LPAR, *S_RPAR", "static int Flag", "static long BITS[6]",
        "static const char *NAMES[]", "static MemoSlot memo[MEMO_SLOTS]",
        "static int counter", "PyObject *exported"]


def test_the_sources_define_no_mutable_statics() -> None:
    sources = sorted(SOURCES.glob("*.[ch]"))
    assert {p.name for p in sources} >= {"module.c", "scanner.c", "speedups.c", "encoders.c",
                                        "native.h", "cstack.h", "entry.h"}
    found = {p.name: mutable_statics(p.read_text(encoding="utf-8")) for p in sources}
    assert {name: found for name, found in found.items() if found} == {}


# --------------------------------------------------------------------------- interpreters

def run_in(interpreter: Any, code: str) -> None:
    """Run ``code`` in ``interpreter``; fail with its traceback if it raised (3.13 returns
    a snapshot of the exception; 3.11 and 3.12 raise RunFailedError)."""
    outcome = interpreters.run_string(interpreter, code)
    if outcome is not None:
        pytest.fail(getattr(outcome, "errdisplay", None) or str(outcome))


def new_interpreter(isolated: bool) -> Any:
    """An isolated subinterpreter (a GIL of its own from 3.12, and only extension modules
    that declare they support that), or a legacy one (the main interpreter's settings)."""
    if sys.version_info >= (3, 13):
        return interpreters.create("isolated" if isolated else "legacy")
    return interpreters.create(isolated=isolated)


#: What a subinterpreter runs to load cbcl.core and the extension without cbcl/__init__
BARE_CORE = textwrap.dedent("""\
    import sys, types
    if "cbcl" not in sys.modules:
        package = types.ModuleType("cbcl")
        package.__path__ = [{package!r}]
        sys.modules["cbcl"] = package
    import decimal
    import cbcl._native as native
    from cbcl.core import _canonical, _reader
    from cbcl.core._values import URI, Keyword, Symbol
    assert _canonical.native is native and _reader._read_value_c is native.read_value
    value = _reader.read({value!r})
    assert repr(value) == {expected!r}, value
    # (this interpreter's atoms, not another's, from the memos of its module's state)
    assert [type(value[k]) for k in (0, 1, 4)] == [Symbol, Keyword, URI]
    assert native.canonical(value) == _canonical.canonical_value(value) == {text!r}
    c_decimal = sys.modules.get("_decimal")
    assert native.decimals_in_place() == (
        c_decimal is not None and decimal.Decimal is c_decimal.Decimal)
    """)


@needs_native
@needs_interpreters
def test_the_module_loads_in_an_isolated_subinterpreter_beside_this_one() -> None:
    """An isolated subinterpreter makes a module object of its own (3.12+ refuses the
    import unless the module declares a GIL per interpreter), set up by its own
    cbcl.core, and reads and writes with it; tearing it down leaves this interpreter's
    module whole."""
    round_trip()
    code = BARE_CORE.format(package=str(PACKAGE), value=VALUE,
                            expected=repr(cbcl.read(VALUE)), text=VALUE.decode())
    interpreter = new_interpreter(isolated=True)
    try:
        run_in(interpreter, code)
        run_in(interpreter, code)  # (again: its memos hit)
    finally:
        interpreters.destroy(interpreter)
    gc.collect()
    round_trip()
    assert all(bound is not python for bound, python in ENTRIES)


#: All of cbcl in a subinterpreter, where it is the first to import cryptography.
WHOLE = textwrap.dedent("""\
    import cbcl
    import cbcl._native as native
    from cbcl.binary import _codec
    from cbcl.protocol import _api
    assert type(cbcl.Decoder.decode) is native.MethodEntry  # (made by this module)
    assert type(cbcl.Encoder.encode) is native.MethodEntry
    assert cbcl.parse is not _api.parse_python and cbcl.decode is not _codec.decode_one_shot_python
    registry = cbcl.Registry(disk_cache=False, isolate=False)
    registry.load({any!r}, allow_unsigned=True)
    message = cbcl.parse({text!r}, registry=registry)
    assert message == _api.parse_python({text!r}, registry=registry)
    assert message.canonical().encode() == {text!r}
    frame = cbcl.Encoder(registry, validate=False).encode(message)
    decoder = cbcl.Decoder(registry)
    assert decoder.decode(frame) == decoder.decode(frame) == message
    assert cbcl.decode(frame, registry=registry) == message
    """)


@needs_native
@needs_interpreters
@pytest.mark.slow
def test_cbcl_parses_and_decodes_with_the_extension_in_a_subinterpreter() -> None:
    """In a fresh process, a legacy subinterpreter imports all of cbcl, whose class bodies
    bind the entries of that interpreter's module object, and parses, encodes and decodes
    with them. From 3.13 the process's main interpreter has loaded the module (with
    cbcl.core) before, and reads and writes with its own module object again once the
    subinterpreter is destroyed: neither saw the other's types, atoms or entries (a legacy
    subinterpreter loads even a module that declares no support; before 3.13, _decimal's
    one ContextVar would hand the main interpreter the destroyed one's context)."""
    whole = WHOLE.format(any=ANY, text=TEXT)
    core = BARE_CORE.format(package=str(PACKAGE), value=VALUE,
                            expected=repr(cbcl.read(VALUE)), text=VALUE.decode())
    script = textwrap.dedent(f"""\
        import sys
        try:
            import _interpreters as interpreters
        except ImportError:
            import _xxsubinterpreters as interpreters
        main_too = sys.version_info >= (3, 13)
        if main_too:
            exec({core!r})
        if sys.version_info >= (3, 13):
            interpreter = interpreters.create("legacy")
        else:
            interpreter = interpreters.create(isolated=False)
        outcome = interpreters.run_string(interpreter, {whole!r})
        assert outcome is None, outcome.errdisplay
        interpreters.destroy(interpreter)
        if main_too:
            exec({core!r})
        print("both ran")
        """)
    # (-I: the checkout's own cbcl/ on the current directory, where the extension may not
    # be built in place, must not shadow the installed package the test is about)
    done = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0 and done.stdout == "both ran\n", done.stderr
