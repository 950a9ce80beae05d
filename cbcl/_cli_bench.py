"""``cbcl bench``: the comparison suite of :mod:`cbcl._bench` on the command line."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._cli_common import Commands


def _cmd_bench(args: argparse.Namespace, data: bytes) -> int:
    from ._bench import execute  # imports the peers only when asked to

    return execute(args)


def register(commands: Commands) -> None:
    """Add ``bench`` to ``commands`` (the ``add_subparsers`` action of the ``cbcl``
    parser)."""
    from ._bench import add_arguments

    b = commands.add_parser(
        "bench", help="compare CBCL with its peers (msgspec and pydantic on natural JSON, "
                      "sexpdata, lark, JSON + jsonschema, msgpack, orjson) on sets of "
                      "different messages, in one run; needs a checkout's descriptors/")
    add_arguments(b)
    b.set_defaults(handler=_cmd_bench, file=None)
