"""The package's layers (docs/layout.md), read from the source by ``ast``: every module
imports only modules of its own layer or below; the runtime import graph has no cycle; no
module imports inside a function but for an optional dependency; ``import cbcl`` loads
neither asyncio nor argparse."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "cbcl"

#: Bottom to top. The package root's public modules (``cbcl``, ``cbcl.trust``, …) sit
#: between the bridges and the command line, which is a client of the public API; the
#: native extension (``cbcl._native``/``cbcl._speedups``…) is below everything.
LAYERS = ("core", "grammar", "protocol", "binary", "session", "net", "llm", "bridges",
          "<public>", "cli", "__main__")

#: What a function may import: optional dependencies (an extra), and the modules that
#: import one at their top.
OPTIONAL = frozenset({"nats", "a2a", "mcp", "mcp_types", "anyio", "jsonschema", "google",
                      "cbcl.net._nats", "cbcl.bridges._a2a", "cbcl.bridges._a2a_client",
                      "cbcl.bridges._a2a_server", "cbcl.bridges._mcp"})
NATIVE = frozenset({"_native", "_speedups", "_scanner", "_encoders"})


@dataclass(frozen=True)
class Import:
    importer: str
    target: str
    line: int
    type_only: bool
    in_function: bool


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def layer_of(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1:
        return LAYERS.index("<public>")
    if parts[1] in LAYERS:
        return LAYERS.index(parts[1])
    if parts[1] in NATIVE:
        return -1
    return LAYERS.index("<public>")  # cbcl.trust, cbcl.demo, …


def _imports(module: str, source: str, *, is_package: bool = False) -> Iterator[Import]:
    tree = ast.parse(source)
    package = module if is_package else module.rpartition(".")[0]
    type_only: set[int] = set()
    in_function: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            type_only.update(id(n) for n in ast.walk(node))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            in_function.update(id(n) for n in ast.walk(node) if n is not node)
    for node in ast.walk(tree):
        targets: list[str] = []
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                targets.append(full if full in MODULES or alias.name in NATIVE else base)
        for target in targets:
            if target != module:
                yield Import(module, target, node.lineno, id(node) in type_only,
                             id(node) in in_function)


IMPORTS = [i for module, path in sorted(MODULES.items())
           for i in _imports(module, path.read_text(encoding="utf-8"),
                             is_package=path.name == "__init__.py")]


def test_the_package_is_in_layers() -> None:
    assert {m.split(".")[1] for m in MODULES if m.count(".") == 2} <= set(LAYERS)
    assert len(MODULES) > 60  # the walk found the package


def test_no_module_imports_a_layer_above_its_own() -> None:
    upward = [f"{i.importer}:{i.line} -> {i.target}" for i in IMPORTS
              if i.target in MODULES and layer_of(i.target) > layer_of(i.importer)]
    assert upward == []


def test_the_import_graph_has_no_cycle() -> None:
    """Runtime imports only: a type-only import (under ``TYPE_CHECKING``) names a class of
    the same layer for an annotation and is never executed."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for i in IMPORTS:
        if i.target in MODULES and not i.type_only:
            graph[i.importer].add(i.target)
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(node: str, path: list[str]) -> bool:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle.extend([*path[path.index(nxt):], nxt] if nxt in path else [node, nxt])
                return True
            if nxt not in state and visit(nxt, [*path, nxt]):
                return True
        state[node] = 2
        return False

    for module in sorted(graph):
        if module not in state and visit(module, [module]):
            break
    assert cycle == []


def test_type_only_imports_never_point_up_a_layer() -> None:
    upward = [f"{i.importer} -> {i.target}" for i in IMPORTS
              if i.type_only and i.target in MODULES
              and layer_of(i.target) > layer_of(i.importer)]
    assert upward == []


def test_functions_import_only_optional_dependencies() -> None:
    """But a package's ``__getattr__`` (PEP 562), which is how ``cbcl`` and ``cbcl.net``
    import their asyncio and optional layers when first named."""
    lazy_ok = {("cbcl", "importlib")}
    found = []
    for i in IMPORTS:
        if not i.in_function:
            continue
        top = i.target.split(".")[0]
        if top in OPTIONAL or i.target in OPTIONAL or (i.importer, top) in lazy_ok:
            continue
        found.append(f"{i.importer}:{i.line} imports {i.target}")
    assert found == []


def test_the_checks_see_a_violation() -> None:
    """The walk reads imports as written: an upward one and one in a function are seen."""
    source = ("from ..cli._main import main\n"
              "def f():\n    from ..core._values import Symbol\n")
    found = list(_imports("cbcl.core._layers_probe", source))
    assert [(i.target, i.in_function) for i in found] == [
        ("cbcl.cli._main", False), ("cbcl.core._values", True)]
    assert layer_of("cbcl.cli._main") > layer_of("cbcl.core._layers_probe")


@pytest.mark.parametrize("module", ["asyncio", "argparse"])
def test_import_cbcl_loads_neither_asyncio_nor_argparse(module: str) -> None:
    code = f"import sys, cbcl; cbcl.parse; print({module!r} in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_the_lazy_names_arrive_when_named() -> None:
    code = ("import sys, cbcl; a = cbcl.Agent; import cbcl.net;"
            "print(a is cbcl.net.Agent, 'asyncio' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == ["True", "True"]
