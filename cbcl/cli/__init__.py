"""The ``cbcl`` command: :func:`main` runs it, :func:`build_parser` is its argparse
definition (one module per command group; ``_common`` holds what they share)."""

from ._main import build_parser, main

__all__ = ["build_parser", "main"]
