"""The public surface: a small top level, the layers as public modules, and every name
that code written against the old flat namespace (and the README) uses still there."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import cbcl

LAYERS = ("session", "net", "trust", "binary", "conversation", "descriptor", "json_mapping",
          "llm")
#: Names new in a layer, never at the top level (nothing written before needs them there).
ONLY_IN_LAYERS = {"NOT_UNDERSTOOD_CODES", "Event", "HandshakeState", "GrammarLimits",
                  "GrammarCache", "DEFAULT_GRAMMAR_CACHE", "CompatLimits", "CompatReport",
                  "diff_descriptors", "EXPORT_FORMATS", "EXTRACT_INPUT_FACTOR",
                  "KEYWORD_SET_CAP", "STRING_LENGTH_CAP", "DroppedSpan", "Extracted",
                  "GrammarExport", "export_grammar", "export_json_schema", "generate_bodies",
                  "generate_messages", "render_prompt", "NatsBus", "NatsLimits"}
ROOT = Path(__file__).parent.parent
README = (Path(__file__).parent.parent / "README.md").read_text()


def test_the_top_level_is_what_most_programs_need() -> None:
    assert len(cbcl.__all__) == len(set(cbcl.__all__)) <= 60
    for name in cbcl.__all__:
        assert hasattr(cbcl, name), name
    for essential in ("parse", "read", "canonical", "validate", "encode", "decode", "Registry",
                      "Message", "CBCLError", "Agent", "Session", "body", "Fields"):
        assert essential in cbcl.__all__


@pytest.mark.parametrize("layer", LAYERS)
def test_each_layer_is_public_and_its_names_stay_importable_from_the_top(layer: str) -> None:
    module = importlib.import_module(f"cbcl.{layer}")
    assert getattr(cbcl, layer) is module
    assert module.__all__
    for name in set(module.__all__) - ONLY_IN_LAYERS:
        assert getattr(module, name) is getattr(cbcl, name), f"cbcl.{layer}.{name}"


def test_every_name_the_readme_uses_exists() -> None:
    used = set(re.findall(r"\bcbcl\.([A-Za-z_][A-Za-z0-9_]*)", README))
    used -= {"read", "py", "key", "pub", "cbcl", "md", "signed", "example", "lark"}
    missing = sorted(name for name in used if not hasattr(cbcl, name)
                     and not (ROOT / "cbcl" / name).is_dir())  # cbcl.grammars: package data
    assert missing == []
