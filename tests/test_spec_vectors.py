"""The normative test vectors of spec/cbcl-1.0.md §8, run through the library API.

Each entry of ``spec/vectors/manifest.json`` names an input file, the command it is run with
(``canon`` for a value, ``parse --envelope-only`` for a message) and the expected outcome:
the exact canonical bytes, or an error's kind, exit code, 1-based line and column, and
0-based UTF-8 byte offset.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import cbcl

REPO = Path(__file__).resolve().parents[1]
VECTORS = REPO / "spec" / "vectors"
MANIFEST = VECTORS / "manifest.json"
COMMANDS = ("canon", "parse --envelope-only")


def _entries() -> list[dict[str, Any]]:
    return list(json.loads(MANIFEST.read_text("utf-8"))["vectors"])


ENTRIES = _entries()


def _run(command: str, data: bytes) -> str:
    """The canonical text the command produces for ``data`` (or the error it raises)."""
    if command == "canon":
        return cbcl.canonical(cbcl.read(data))
    return cbcl.canonical(cbcl.parse(data, envelope_only=True))


def _name(entry: dict[str, Any]) -> str:
    return Path(entry["file"]).stem


@pytest.mark.parametrize("entry", ENTRIES, ids=_name)
def test_vector(entry: dict[str, Any]) -> None:
    assert entry["command"] in COMMANDS
    assert entry["exercises"]
    data = (VECTORS / entry["file"]).read_bytes()
    expect = entry["expect"]
    if "canonical" in expect:
        assert entry["file"].startswith("valid/")
        wanted = (VECTORS / expect["canonical"]).read_bytes()
        produced = _run(entry["command"], data).encode("utf-8")
        assert produced == wanted
        # The canonical form reads back to itself (spec §1.4).
        assert _run(entry["command"], wanted).encode("utf-8") == wanted
        return
    assert entry["file"].startswith("invalid/")
    with pytest.raises(cbcl.CBCLError) as info:
        _run(entry["command"], data)
    error = info.value
    got = {"error": error.kind, "exit": error.exit_code, "line": error.line,
           "column": error.column, "offset": error.offset}
    assert got == {key: expect.get(key) for key in got}


def test_manifest_lists_every_file_and_only_existing_files() -> None:
    on_disk = {path.relative_to(VECTORS).as_posix()
               for folder in ("valid", "invalid") for path in (VECTORS / folder).iterdir()}
    listed = [entry["file"] for entry in ENTRIES]
    listed += [entry["expect"]["canonical"] for entry in ENTRIES
               if "canonical" in entry["expect"]]
    assert len(listed) == len(set(listed)), "a file is listed twice"
    assert set(listed) == on_disk
    names = [_name(entry) for entry in ENTRIES]
    assert len(names) == len(set(names)), "two vectors share a name"


def test_manifest_entries_are_well_formed() -> None:
    for entry in ENTRIES:
        assert set(entry) == {"file", "exercises", "command", "expect"}, entry
        expect = entry["expect"]
        if "canonical" in expect:
            assert set(expect) == {"canonical"}
            assert expect["canonical"] == f"valid/{_name(entry)}.canonical"
        else:
            assert set(expect) == {"error", "exit", "line", "column", "offset"}, entry
            assert expect["exit"] in (3, 4, 5)


def test_public_task_proposal_vector() -> None:
    messages = VECTORS / "messages"
    source = messages / "task-proposal.cbcl"
    wanted = (messages / "task-proposal.canonical").read_bytes()
    assert cbcl.canonical(cbcl.parse(source.read_bytes(), envelope_only=True)).encode() == wanted
    assert cbcl.canonical(cbcl.read(source.read_bytes())).encode() == wanted
