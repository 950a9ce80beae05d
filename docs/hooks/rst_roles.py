"""mkdocs hook: the reST roles of CBCL's docstrings as links in the API reference.

The docstrings are prose with reST cross-references (``:class:`Registry```,
``:meth:`Agent.serve```, ``:class:`~cbcl.Agent```). mkdocstrings renders the Markdown
of a docstring, where such a role comes out as the literal ``:class:`` followed by inline
code. This hook turns each into a cross-reference that mkdocs-autorefs resolves once
every page is rendered: the name as written, else the name under ``cbcl.`` (where the
top level re-exports it). A name found nowhere stays inline code, without a link and
without a warning (the reference is *optional*, as mkdocstrings' own are).
"""

from __future__ import annotations

import html
import re
from typing import Any

ROLE = re.compile(r":(?:py:)?(?:mod|class|func|meth|data|attr|exc|obj|const|type):"
                  r"<code>(?P<name>[~.\w]+)(?P<call>\(\))?</code>")


def _reference(match: re.Match[str]) -> str:
    name = match["name"]
    shown = name.rsplit(".", 1)[-1] if name.startswith("~") else name
    target = name.lstrip("~.")
    fallback = target if target.startswith("cbcl.") or target == "cbcl" else f"cbcl.{target}"
    code = f"<code>{html.escape(shown)}{match['call'] or ''}</code>"
    return (f'<autoref identifier="{html.escape(target)}" slug="{html.escape(fallback)}" '
            f"optional>{code}</autoref>")


def on_page_content(content: str, page: Any, config: Any, files: Any) -> str:
    return ROLE.sub(_reference, content)
