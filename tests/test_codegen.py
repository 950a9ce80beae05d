"""``cbcl codegen`` (spec/declarations.md §9): classes for a descriptor's schema that are
``mypy --strict`` clean and build the same schema back (the same bytes for a descriptor
built from a declaration)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st
from test_declaration import REQUEST_DECLARATION, declarations

import cbcl
from cbcl.cli._main import main
from cbcl.protocol._codegen import generate_records
from cbcl.protocol._descriptor import read_descriptor
from cbcl.protocol._schema import compile_schema

ROOT = Path(__file__).parent.parent
SHIPPED = sorted(path for path in (ROOT / "descriptors").glob("*.cbcl")
                 if not path.name.endswith(".signed.cbcl")
                 and read_descriptor(path.read_bytes()).schema is not None)


def module_of(source: str, name: str) -> dict[str, Any]:
    """The generated ``source`` run as module ``name`` (its classes resolve their
    annotations in it)."""
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(source, f"{name}.py", "exec"), vars(module))
    return vars(module)


def records_by_heads(descriptor: bytes) -> dict[tuple[cbcl.Symbol, ...], object]:
    schema = read_descriptor(descriptor).schema
    assert schema is not None
    return {record.heads: record for record in compile_schema(schema).records}


def test_shipped_descriptors_have_classes() -> None:
    assert len(SHIPPED) >= 3


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_descriptors_round_trip_through_classes(path: Path) -> None:
    """descriptor → classes → descriptor_from: the same schema (records compared compiled,
    by their heads), the same intents, conversation and functions."""
    original = path.read_bytes()
    module = module_of(generate_records(original), f"gen_{path.stem.replace('-', '_')}")
    rebuilt = module["descriptor"]()
    assert records_by_heads(rebuilt) == records_by_heads(original)
    before, after = read_descriptor(original), read_descriptor(rebuilt)
    assert (after.id, after.version, after.intents, after.conversation, after.functions) == \
        (before.id, before.version, before.intents, before.conversation, before.functions)


def without_comments(payload: bytes) -> bytes:
    """A descriptor's bytes without the ``;`` comment lines above it."""
    lines = payload.split(b"\n")
    while lines and lines[0].startswith(b";"):
        lines.pop(0)
    return b"\n".join(lines)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_descriptors_round_trip_byte_for_byte(path: Path) -> None:
    """descriptor → classes → descriptor gives the shipped bytes (but the comment above):
    where the classes' records derive the grammar, from them; where the declaration said
    more than its schema ((ordered …), (either …)), with its grammar passed as written;
    constraints included."""
    original = path.read_bytes()
    module = module_of(generate_records(original), f"gen_bytes_{path.stem.replace('-', '_')}")
    assert without_comments(module["descriptor"]()) == without_comments(original)


def test_a_declared_descriptor_round_trips_byte_for_byte() -> None:
    built = cbcl.descriptor_from_declaration(REQUEST_DECLARATION)
    assert module_of(generate_records(built), "gen_request_declared")["descriptor"]() == built


def test_hostile_names_give_valid_python_that_round_trips() -> None:
    """Keys and heads that are no Python identifiers (or are keywords, or collide once
    ``-`` is ``_``) become safe names with ``Key(…)``; a string that looks like code stays
    a string."""
    declared = """(protocol-declaration (id odd/v1) (version 1)
      (intent INFORM (record class (:class string required) (:x-y integer) (:x_y integer)
                             (:__init__ (one-of "x\\"); import os; (\\"" 2))
                             (:self (keys (:a-b symbol))))))"""
    built = cbcl.descriptor_from_declaration(declared)
    source = generate_records(built)
    imported = {node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                for node in ast.walk(ast.parse(source))
                if isinstance(node, (ast.Import, ast.ImportFrom))}
    assert imported == {"__future__", "decimal", "typing", "cbcl", "cbcl.descriptor"}
    module = module_of(source, "gen_odd")
    assert module["descriptor"]() == built
    made = module["Class"](f_class="a", x_y=1, f_x_y=2, f_init=2,
                           self=module["ClassSelfKeys"](a_b="q"))
    assert cbcl.canonical(made.to_body()) == \
        '(class :class "a" :x-y 1 :x_y 2 :__init__ 2 :self (:a-b q))'


def test_a_descriptor_without_a_schema_is_a_clear_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bare = cbcl.build_descriptor("bare/v1", 1, ["INFORM"], 'body: "(" "x" ")"\n')
    with pytest.raises(cbcl.DescriptorError, match="has no schema"):
        generate_records(bare)
    source = tmp_path / "bare.cbcl"
    source.write_bytes(bare)
    assert main(["codegen", str(source), "-o", str(tmp_path / "m.py")]) == 5
    assert "has no schema" in capsys.readouterr().err


def test_cli_writes_the_module(tmp_path: Path) -> None:
    out = tmp_path / "models.py"
    signed = ROOT / "descriptors" / "request-v1.signed.cbcl"
    assert main(["codegen", str(signed), "-o", str(out)]) == 0
    assert out.read_text() == generate_records(
        (ROOT / "descriptors" / "request-v1.cbcl").read_bytes())


_RANDOM: list[str] = []


@settings(max_examples=1, deadline=None)
@given(data=st.data())
def _draw_random_sources(data: st.DataObject) -> None:
    for n in range(8):
        text = data.draw(declarations())
        _RANDOM.append(generate_records(cbcl.descriptor_from_declaration(
            text.replace("rnd/v1", f"rnd{n}/v1"))))


@pytest.mark.slow
def test_generated_code_is_mypy_strict_clean(tmp_path: Path) -> None:
    """mypy --strict (the project's configuration) on the classes of every shipped
    descriptor with a schema and of random declarations, in one run."""
    for path in SHIPPED:
        (tmp_path / f"gen_{path.stem.replace('-', '_')}.py").write_text(
            generate_records(path.read_bytes()))
    _RANDOM.clear()
    _draw_random_sources()
    for n, source in enumerate(_RANDOM):
        (tmp_path / f"gen_random_{n}.py").write_text(source)
    usage = tmp_path / "use_request.py"
    usage.write_text("from gen_request_v1 import Agree, InformResult\n"
                     "a = Agree(action_id='x')\n"
                     "s: str = a.action_id\n"
                     "r = InformResult(action_id='y', result=1)\n")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
         "--no-incremental", *sorted(str(p) for p in tmp_path.glob("*.py"))],
        capture_output=True, text=True, cwd=tmp_path, timeout=600, check=False,
        env={**os.environ, "MYPYPATH": str(ROOT)})  # (cbcl from this checkout)
    assert done.returncode == 0, done.stdout + done.stderr
