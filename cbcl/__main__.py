"""``python -m cbcl``: the same as the ``cbcl`` command."""

import sys

from ._cli import main

sys.exit(main())
