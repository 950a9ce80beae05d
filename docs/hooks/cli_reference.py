"""mkdocs hook: generate ``cli.md``, the command-line reference, from the argparse
definitions of the ``cbcl`` command at build time.

The parser is the one the command runs (``build_parser()``); every command and
subcommand is walked recursively and rendered with its usage, description and options.
Nothing here is written by hand, so the page cannot drift from the code. If the parser
cannot be imported or built the build fails, loudly: a site without its CLI reference is
not a site to publish.
"""

from __future__ import annotations

import argparse
import contextlib
import html
import importlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

#: Where ``build_parser`` lives: after the package's restructure into layer subpackages,
#: then during it, then before it. The first that imports wins.
PARSER_LOCATIONS = ("cbcl.cli",)
PAGE = "cli.md"
#: The width usage lines are wrapped at, whatever the terminal of the build is.
WIDTH = "88"

_MARKDOWN_SPECIAL = str.maketrans({c: "\\" + c for c in "\\`*_[]#|"})


def _build_parser(repo_root: Path) -> argparse.ArgumentParser:
    """``build_parser()`` of the ``cbcl`` command, or an error that says why not."""
    try:
        importlib.import_module("cbcl")
    except ModuleNotFoundError as exc:
        if exc.name != "cbcl":
            raise
        # Not installed in this environment: document the checkout the site is built from.
        sys.path.insert(0, str(repo_root))
    errors: list[str] = []
    for location in PARSER_LOCATIONS:
        try:
            module = importlib.import_module(location)
        except ModuleNotFoundError as exc:
            if exc.name is not None and location.startswith(exc.name):
                errors.append(f"{location}: no such module")
                continue
            raise RuntimeError(f"cli_reference: importing {location} failed: {exc!r}") from exc
        build = getattr(module, "build_parser", None)
        if build is None:
            errors.append(f"{location}: has no build_parser")
            continue
        parser = build()
        if not isinstance(parser, argparse.ArgumentParser):
            raise RuntimeError(f"cli_reference: {location}.build_parser() returned "
                               f"{type(parser).__name__}, not an ArgumentParser")
        return parser
    raise RuntimeError("cli_reference: cannot find the cbcl command's build_parser "
                       "(tried " + "; ".join(errors) + ")")


@contextlib.contextmanager
def _columns(width: str) -> Iterator[None]:
    """argparse wraps at $COLUMNS: fix it, so the page does not depend on the terminal."""
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = width
    try:
        yield
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved


def _text(value: str) -> str:
    """Plain text as Markdown that shows it as written."""
    return html.escape(" ".join(value.split()), quote=False).translate(_MARKDOWN_SPECIAL)


def _code(value: str) -> str:
    """Inline code, whatever backticks the value holds."""
    fence = "``" if "`" in value else "`"
    pad = " " if value.startswith("`") or value.endswith("`") else ""
    return f"{fence}{pad}{value}{pad}{fence}"


def _anchor(prog: str) -> str:
    return prog.replace(" ", "-")


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """``(name, help, parser)`` of each subcommand, in the order they were added."""
    found: list[tuple[str, str, argparse.ArgumentParser]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) in seen:  # an alias
                    continue
                seen.add(id(sub))
                found.append((name, helps.get(name, ""), sub))
    return found


def _help(action: argparse.Action, formatter: argparse.HelpFormatter) -> str:
    if not action.help:
        return ""
    return formatter._expand_help(action)  # %(default)s and friends, as --help shows them


def _option_lines(parser: argparse.ArgumentParser) -> list[str]:
    formatter = parser._get_formatter()
    lines: list[str] = []
    for action in parser._actions:
        if (action.help == argparse.SUPPRESS
                or isinstance(action, (argparse._SubParsersAction, argparse._HelpAction))):
            continue  # -h is on every command: said once, at the top of the page
        invocation = formatter._format_action_invocation(action)
        notes: list[str] = []
        if action.option_strings and action.required:
            notes.append("required")
        if not action.option_strings and action.nargs in ("?", "*"):
            notes.append("optional")
        if action.choices is not None and not isinstance(action.choices, dict):
            notes.append("one of " + ", ".join(_code(str(choice)) for choice in action.choices))
        default = action.default
        help_text = _help(action, formatter)
        if (action.option_strings and default not in (None, False, [], argparse.SUPPRESS)
                and not isinstance(action, (argparse._StoreTrueAction,
                                            argparse._VersionAction))
                and "default" not in help_text):
            notes.append("default " + _code(str(default)))
        line = f"- {_code(invocation)}"
        if help_text:
            line += f": {_text(help_text)}"
        if notes:
            line += f" ({'; '.join(notes)})"
        lines.append(line)
    return lines


def _render(parser: argparse.ArgumentParser, summary: str, depth: int) -> list[str]:
    prog = parser.prog
    heading = "#" * min(depth, 6)
    out = [f"{heading} {_code(prog)} {{#{_anchor(prog)}}}", ""]
    description = parser.description or summary
    if description:
        out += [_text(description), ""]
    out += ["```text", parser.format_usage().strip(), "```", ""]
    subcommands = _subcommands(parser)
    if subcommands:
        out.append("Commands:")
        out.append("")
        for name, help_text, sub in subcommands:
            out.append(f"- [{_code(name)}](#{_anchor(sub.prog)}): {_text(help_text)}")
        out.append("")
    options = _option_lines(parser)
    if options:
        out += ["Arguments and options:", "", *options, ""]
    if parser.epilog:
        out += [_text(parser.epilog), ""]
    for _name, help_text, sub in subcommands:
        out += _render(sub, help_text, depth + 1)
    return out


def render_reference(parser: argparse.ArgumentParser) -> str:
    """The whole page, as Markdown."""
    with _columns(WIDTH):
        body = _render(parser, "", 2)
    return "\n".join([
        "# Command-line reference",
        "",
        "<!-- Generated at build time by docs/hooks/cli_reference.py from the argparse "
        "definitions of the cbcl command; do not edit. -->",
        "",
        "Generated from the `cbcl` command's own argparse definitions when the site is "
        "built, so it is what `cbcl COMMAND --help` prints, for every command and "
        "subcommand (each also takes `-h`/`--help`). Errors are one line on stderr (`kind line:column: message`) with the "
        "exit codes of `spec/cbcl-1.0.md` §6: 0 success, 1 I/O error, 2 usage, "
        "3 malformed input, 4 limit exceeded, 5 protocol problem, 6 signature or trust "
        "failure, 7 conversation, schema or evaluation violation. Every numeric option "
        "is range-checked: an out-of-range, negative or non-finite value is a usage "
        "error (exit 2).",
        "",
        *body,
    ])


def on_files(files: Files, config: Any) -> Files:
    """Add the generated ``cli.md`` to the site's files."""
    repo_root = Path(config["config_file_path"]).resolve().parent
    content = render_reference(_build_parser(repo_root))
    existing = files.get_file_from_path(PAGE)
    if existing is not None:
        raise RuntimeError(f"cli_reference: docs/{PAGE} exists; it is generated, remove it")
    files.append(File.generated(config, PAGE, content=content))
    return files
