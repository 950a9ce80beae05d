"""The C entry points that stand in for Python functions and methods (cbcl/_native_src/entry.h): the
documentation each takes from the Python function it stands in for, its *fallback*."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any


def entry_doc(function: Callable[..., Any], *, method: bool) -> str:
    """The ``ml_doc`` of an entry standing in for ``function``: its signature without
    annotations as a ``__text_signature__`` (``$self`` or ``$module`` first, as CPython's
    builtins write it), then its docstring, so that ``help()`` and ``inspect.signature()``
    show the Python function's. Raises ``ValueError`` for a method without parameters."""
    signature = inspect.signature(function)
    parameters = [p.replace(annotation=inspect.Parameter.empty)
                  for p in signature.parameters.values()]
    if method:
        if not parameters:
            raise ValueError(f"{function.__qualname__} takes no self")
        parameters = parameters[1:]
    text = str(signature.replace(parameters=parameters,
                                 return_annotation=inspect.Signature.empty))
    bound = "$self" if method else "$module"
    text = f"({bound}, {text[1:]}" if parameters else f"({bound})"
    return f"{function.__name__}{text}\n--\n\n{inspect.getdoc(function) or ''}"
