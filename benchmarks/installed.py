"""Which cbcl a benchmark measures (issue 35): the installed package, with its C extension.

Run from a checkout, ``python -m cbcl …`` and a script that puts the checkout on
``sys.path`` import the *source tree*, which has no built extension unless it was installed
in place (``pip install -e``): such a benchmark measured the pure-Python reference while
its report said CBCL. So every benchmark calls :func:`check` first, which names the cbcl
it imported and refuses (exit 2) one without the extension, unless asked for the
reference (``CBCL_BENCH_ALLOW_PURE=1``, or a script's ``--allow-pure``); and the servers a
benchmark starts run as :data:`PYTHON` ``-m cbcl``, whose ``-P`` keeps the current
directory off their ``sys.path``, so they import the package this process imports.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any

#: How a benchmark starts a child Python that imports cbcl (``[*PYTHON, "-m", "cbcl", …]``):
#: ``-P`` (CPython 3.11+) puts neither the current directory nor the script's on its path.
PYTHON = (sys.executable, "-P")


def which() -> dict[str, Any]:
    """The cbcl this process imports: its folder, whether it is a checkout's source tree
    (a ``pyproject.toml`` beside it) and whether its C extension ``cbcl._native`` loads."""
    import cbcl

    folder = Path(cbcl.__file__).resolve().parent
    try:
        importlib.import_module("cbcl._native")
    except ImportError:
        native = False
    else:
        native = True
    return {"cbcl": str(folder), "source_tree": (folder.parent / "pyproject.toml").is_file(),
            "native": native}


def check(*, allow_pure: bool = False) -> dict[str, Any]:
    """:func:`which`, refusing (``SystemExit(2)``) a cbcl without its C extension unless
    ``allow_pure`` or ``CBCL_BENCH_ALLOW_PURE=1``. Prints one line saying which it is."""
    found = which()
    allowed = allow_pure or os.environ.get("CBCL_BENCH_ALLOW_PURE") == "1"
    where = "source tree" if found["source_tree"] else "installed"
    extension = "with its C extension" if found["native"] else "WITHOUT its C extension"
    print(f"measuring cbcl at {found['cbcl']} ({where}, {extension})", file=sys.stderr)
    if not found["native"] and not allowed:
        raise SystemExit(
            "this cbcl has no built C extension, so the figures would be the pure-Python "
            "reference's: install the package (pip install . or -e .) and run the script "
            "from outside the checkout, or set CBCL_BENCH_ALLOW_PURE=1 to measure the "
            "reference on purpose")
    return found
