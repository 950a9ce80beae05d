"""``python -m cbcl``: the same as the ``cbcl`` command."""

import sys

from .cli import main

sys.exit(main())
