"""Operator input: every numeric option of every command is a checked argparse type.

For each option the boundary values parse and the values just beyond them, ``nan``,
``inf``, ``-1`` and non-numbers are usage errors: exit 2 and one line on stderr,
``usage: cbcl COMMAND: …``. Nothing here starts a server: only the parser runs.

Tests internals: the commands' option parsers and caps (``cbcl.cli._*``) are private."""

from __future__ import annotations

import argparse
import functools
import math
from dataclasses import fields
from pathlib import Path

import pytest

from cbcl.cli import build_parser, main
from cbcl.cli._common import INT64_MAX, MAX_DOCUMENT_BYTES, int_in, seconds
from cbcl.cli._conversation import MAX_BUDGET, MAX_EVAL_DEPTH
from cbcl.cli._negotiate import (
    CONNECTION_OPTIONS,
    HANDLER_OPTIONS,
    MAX_PACE_MS,
    SERVER_OPTIONS,
    connection_limits,
    handler_limits,
    server_limits,
)
from cbcl.core._limits import DEFAULT_LIMITS
from cbcl.net import ConnectionLimits, HandlerLimits, ServerLimits
from cbcl.protocol._evaluator import DEFAULT_BUDGET, DEFAULT_MAX_DEPTH

ROOT = Path(__file__).parent.parent
EXAMPLE = ROOT / "descriptors" / "examples" / "task-assignment-v1.cbcl"

#: The shortest valid command line of each command (files need not exist: nothing runs).
COMMANDS: dict[str, list[str]] = {
    "parse": ["parse"],
    "canon": ["canon"],
    "grammar check": ["grammar", "check"],
    "descriptor sign": ["descriptor", "sign", "d.cbcl", "-o", "-", "--key", "k.key"],
    "descriptor verify": ["descriptor", "verify", "--trust", "t"],
    "descriptor inspect": ["descriptor", "inspect"],
    "sign-message": ["sign-message", "--key", "k.key"],
    "encode": ["encode", "--descriptor", "d.cbcl"],
    "decode": ["decode", "--descriptor", "d.cbcl"],
    "conversation check": ["conversation", "check", "--descriptor", "d.cbcl", "m.cbcl"],
    "eval": ["eval", "(now)"],
    "serve": ["serve", "--listen", "127.0.0.1:0", "--trust", "t"],
    "negotiate": ["negotiate"],
    "mcp": ["mcp"],
}
NOW_COMMANDS = ("parse", "descriptor verify", "encode", "decode", "conversation check", "eval")
DOCUMENT_COMMANDS = ("parse", "canon", "grammar check", "descriptor sign", "descriptor verify",
                     "descriptor inspect", "sign-message", "encode", "decode",
                     "conversation check", "eval")

#: (command, option, low, high): an int range, or seconds when ``low`` is a float.
RANGES: list[tuple[str, str, float, float]] = [
    *((command, "--now", 0, INT64_MAX) for command in NOW_COMMANDS),
    *((command, "--max-message-bytes", 1, MAX_DOCUMENT_BYTES) for command in DOCUMENT_COMMANDS),
    ("eval", "--budget", 1, MAX_BUDGET),
    ("eval", "--max-depth", 1, MAX_EVAL_DEPTH),
    ("negotiate", "--pace", 0, MAX_PACE_MS),
    *(("serve", option, low, high) for option, low, high, _ in SERVER_OPTIONS),
    *(("serve", option, low, high) for option, low, high, _ in HANDLER_OPTIONS),
    ("serve", "--handler-timeout", 0.001, 86_400.0),
    ("mcp", "--handler-timeout", 0.001, 86_400.0),
    ("mcp", "--handler-threads", 1, 4096),
    *((command, option, low, high) for command in ("serve", "negotiate")
      for option, low, high, _ in CONNECTION_OPTIONS),
]


def _dest(option: str) -> str:
    return option[2:].replace("-", "_")


@functools.cache
def _parser() -> argparse.ArgumentParser:
    return build_parser()  # (built once: parsing does not change a parser)


def _parse(command: str, *extra: str) -> argparse.Namespace:
    return _parser().parse_args([*COMMANDS[command], *extra])


def _refused(capsys: pytest.CaptureFixture[str], command: str, *extra: str) -> str:
    with pytest.raises(SystemExit) as info:
        _parse(command, *extra)
    assert info.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"usage: cbcl {command}: "), err
    assert err.endswith("\n") and err.count("\n") == 1, err
    return err


def _beyond(low: float, high: float) -> tuple[str, str]:
    if isinstance(low, float):
        return repr(low * 0.9), repr(high + 0.001)
    return str(int(low) - 1), str(int(high) + 1)


@pytest.mark.parametrize(("command", "option", "low", "high"), RANGES,
                         ids=[f"{c}{o}" for c, o, _, _ in RANGES])
def test_boundaries_parse_and_beyond_them_is_a_usage_error(
        capsys: pytest.CaptureFixture[str], command: str, option: str, low: float,
        high: float) -> None:
    for value in (low, high):
        text = repr(value) if isinstance(value, float) else str(value)
        parsed = getattr(_parse(command, option, text), _dest(option))
        assert parsed == value and type(parsed) is type(value)
    for text in (*_beyond(low, high), "nan", "inf", "-inf", "-1", "1e400", "", "x",
                 "99999999999999999999", "0x10", "1_000"):
        if isinstance(low, float) and text == "1_000":
            continue  # a float literal may have underscores: 1000 s is in range
        err = _refused(capsys, command, option, text)
        assert f"argument {option}: expected " in err


@pytest.mark.parametrize("command", NOW_COMMANDS)
def test_a_20_digit_now_is_a_usage_error(capsys: pytest.CaptureFixture[str],
                                         command: str) -> None:
    err = _refused(capsys, command, "--now", "99999999999999999999")
    assert err == (f"usage: cbcl {command}: argument --now: expected an integer from 0 to "
                   f'{INT64_MAX}, not "99999999999999999999"\n')


@pytest.mark.parametrize("command", NOW_COMMANDS)
def test_now_through_main_exits_2(capsys: pytest.CaptureFixture[str], command: str) -> None:
    for text in ("99999999999999999999", "nan", "-1"):
        with pytest.raises(SystemExit) as info:
            main([*COMMANDS[command], "--now", text])
        assert info.value.code == 2
        assert capsys.readouterr().err.count("\n") == 1


def test_the_reported_cases_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["eval", "(now)", "--now", "99999999999999999999"],
                 [*COMMANDS["serve"], "--idle-timeout", "-1"],
                 [*COMMANDS["serve"], "--idle-timeout", "nan"],
                 [*COMMANDS["negotiate"], "--idle-timeout", "inf"],
                 [*COMMANDS["serve"], "--max-frame-bytes", "99999999999"]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith(f"usage: cbcl {argv[0]}: ") and err.count("\n") == 1


def test_defaults_are_the_dataclass_defaults() -> None:
    serve = _parse("serve")
    assert connection_limits(serve) == ConnectionLimits()
    assert server_limits(serve) == ServerLimits()
    assert handler_limits(serve) == HandlerLimits()
    assert serve.max_sessions == 256
    assert (serve.handler_timeout, serve.expose_errors, serve.log_format) == (30.0, False,
                                                                            "text")
    negotiate = _parse("negotiate")
    assert connection_limits(negotiate) == ConnectionLimits()
    assert negotiate.pace == 0
    evaluation = _parse("eval")
    assert (evaluation.budget, evaluation.max_depth) == (DEFAULT_BUDGET, DEFAULT_MAX_DEPTH)
    assert evaluation.max_message_bytes == DEFAULT_LIMITS.max_message_bytes


def test_every_limit_field_has_an_option() -> None:
    options = {_dest(option) for option, *_ in (*CONNECTION_OPTIONS, *SERVER_OPTIONS)}
    settable = {f.name for f in fields(ConnectionLimits) if f.name != "read_bytes"}
    assert settable | {f.name for f in fields(ServerLimits)} == options
    assert {_dest(option) for option, *_ in HANDLER_OPTIONS} == \
        {f.name for f in fields(HandlerLimits)}


@pytest.mark.parametrize("end", [0, 1])
def test_the_limits_accept_every_value_the_options_accept(end: int) -> None:
    """The low and high ends of every range construct the dataclasses (so a value the parser
    takes never fails later, after "listening")."""
    def at_end(options: tuple[tuple[str, float, float, str], ...]) -> list[str]:
        argv: list[str] = []
        for option, low, high, _ in options:
            value = (low, high)[end]
            argv += [option, repr(value) if isinstance(value, float) else str(value)]
        return argv

    serve = _parse("serve", *at_end(SERVER_OPTIONS), *at_end(CONNECTION_OPTIONS),
                   *at_end(HANDLER_OPTIONS))
    assert isinstance(connection_limits(serve), ConnectionLimits)
    assert isinstance(server_limits(serve), ServerLimits)
    assert isinstance(handler_limits(serve), HandlerLimits)
    negotiate = _parse("negotiate", *at_end(CONNECTION_OPTIONS))
    assert connection_limits(negotiate).max_frame_bytes == (1, 16 << 20)[end]


def test_the_largest_values_work_end_to_end(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "(now)", "--now", str(INT64_MAX)]) == 0
    assert capsys.readouterr().out == f"{INT64_MAX}\n"
    assert main(["eval", "(+ 1 2)", "--budget", str(MAX_BUDGET), "--max-depth",
                 str(MAX_EVAL_DEPTH)]) == 0
    assert capsys.readouterr().out == "3\n"
    assert main(["canon", "--max-message-bytes", str(MAX_DOCUMENT_BYTES), str(EXAMPLE)]) == 0
    capsys.readouterr()


def test_usage_errors_never_print_raw_controls(capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(capsys, "parse", "--now", "1\n\u202e2")
    assert "\\u000a\\u202e" in err
    with pytest.raises(SystemExit) as info:
        main(["canon", "--no-such\n\u202eoption"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and "\u202e" not in err
    err = _refused(capsys, "eval", "--max-depth", "9" * 5000)
    assert len(err) < 200  # the operator's argument is shortened, never echoed in full


def test_the_types_themselves() -> None:
    assert int_in(-3, 3)(" +3 ") == 3
    assert seconds(0.5, 2.0)("2") == 2.0
    for bad in ("nan", "inf", "0", "-0.0", "2.0001", "0.4999"):
        with pytest.raises(argparse.ArgumentTypeError):
            seconds(0.5, 2.0)(bad)
    for low, high in ((2, 1),):
        with pytest.raises(ValueError):
            int_in(low, high)
    for low_s, high_s in ((0.0, 1.0), (1.0, math.inf), (2.0, 1.0)):
        with pytest.raises(ValueError):
            seconds(low_s, high_s)
