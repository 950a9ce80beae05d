"""The comparison suite (issue 8): CBCL against sexpdata, lark, JSON + jsonschema, pydantic,
msgpack and orjson, in one process, on the same messages. The suite itself lives in the
package (``cbcl_bench``), so that ``cbcl bench`` runs it from an installed wheel too; it
reads its corpus from this checkout's ``descriptors/``.

    python benchmarks/compare.py [--quick] [--json FILE]     # the same as: cbcl bench …
"""

from __future__ import annotations

import sys

from cbcl_bench import main

if __name__ == "__main__":
    sys.exit(main())
