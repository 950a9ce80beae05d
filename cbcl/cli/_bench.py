"""``cbcl bench``: the comparison suite of :mod:`cbcl_bench` (shipped beside the package,
from ``benchmarks/cbcl_bench``) on the command line. The suite and its peers (the ``bench``
extra) are imported only when the command runs."""

from __future__ import annotations

import argparse
import importlib

from ._common import Commands


def _cmd_bench(args: argparse.Namespace, data: bytes) -> int:
    suite = importlib.import_module("cbcl_bench")  # the suite is not part of the runtime
    result: int = suite.execute(args)
    return result


def register(commands: Commands) -> None:
    """Add ``bench`` to ``commands`` (the ``add_subparsers`` action of the ``cbcl``
    parser)."""
    b = commands.add_parser(
        "bench", help="compare CBCL with its peers (msgspec and pydantic on natural JSON, "
                      "sexpdata, lark, JSON + jsonschema, msgpack, orjson) on sets of "
                      "different messages, in one run; needs a checkout's descriptors/")
    b.add_argument("--quick", action="store_true",
                   help="fewer rounds and no large messages (under a minute)")
    b.add_argument("--json", metavar="FILE", help="also write every figure as JSON")
    b.add_argument("--descriptors", metavar="DIR",
                   help="the descriptors/ directory of a CBCL checkout (default: found "
                        "under the current directory or beside the package)")
    b.set_defaults(handler=_cmd_bench, file=None)
