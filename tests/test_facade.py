"""The public surface: a small top level that is exactly ``__all__``, the public modules
each with its own ``__all__``, and every name the README uses there."""

from __future__ import annotations

import importlib
import re
import types
from pathlib import Path

import pytest

import cbcl

LAYERS = ("session", "net", "trust", "binary", "conversation", "descriptor", "json_mapping",
          "llm", "interop")
ROOT = Path(__file__).parent.parent
README = (Path(__file__).parent.parent / "README.md").read_text()


def test_the_top_level_is_what_most_programs_need() -> None:
    assert len(cbcl.__all__) == len(set(cbcl.__all__)) <= 60
    for name in cbcl.__all__:
        assert hasattr(cbcl, name), name
    for essential in ("parse", "read", "canonical", "validate", "encode", "decode", "Registry",
                      "Message", "CBCLError", "Agent", "Session", "body", "Fields"):
        assert essential in cbcl.__all__


def test_the_top_level_holds_exactly_all() -> None:
    """No name kept 'for code written before it moved': the top level's public names are
    ``__all__`` and the public modules (a 0.x release has no compatibility aliases)."""
    public = {name for name in dir(cbcl) if not name.startswith("_")}
    modules = {name for name in public if isinstance(getattr(cbcl, name), types.ModuleType)}
    assert public - modules == set(cbcl.__all__) - {"__version__"}
    assert modules <= {*LAYERS, "core", "grammar", "protocol", "bridges", "cli", "grammars",
                       "demo"}


@pytest.mark.parametrize("layer", LAYERS)
def test_each_public_module_has_its_names(layer: str) -> None:
    """Each public module is an attribute of ``cbcl`` (``net``, ``llm`` and ``interop``
    when first named), holds every name of its ``__all__``, and a name it shares with the
    top level is the same object."""
    module = importlib.import_module(f"cbcl.{layer}")
    assert getattr(cbcl, layer) is module
    assert module.__all__
    for name in module.__all__:
        assert hasattr(module, name), f"cbcl.{layer}.{name}"
        if name in cbcl.__all__:
            assert getattr(module, name) is getattr(cbcl, name), f"cbcl.{layer}.{name}"


def test_a_name_that_moved_is_not_at_the_top() -> None:
    for name in ("Link", "Query", "connect", "Protocol", "FrameReader", "to_json"):
        assert not hasattr(cbcl, name), name
    with pytest.raises(AttributeError, match="no attribute 'Link'"):
        cbcl.Link  # noqa: B018


def test_every_name_the_readme_uses_exists() -> None:
    used = set(re.findall(r"\bcbcl\.([A-Za-z_][A-Za-z0-9_]*)", README))
    used -= {"read", "py", "key", "pub", "cbcl", "md", "signed", "example", "lark"}
    missing = sorted(name for name in used if not hasattr(cbcl, name)
                     and not (ROOT / "cbcl" / name).is_dir())  # cbcl.grammars: package data
    assert missing == []
