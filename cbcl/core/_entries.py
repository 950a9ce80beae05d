"""The C entry points that stand in for Python functions and methods (cbcl/_native_src/entry.h): the
decorator that binds one in place of the Python function it stands in for, its *fallback*,
as the function or method is defined, and the documentation each takes from it."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

#: The Python function each entry made by :func:`entry` stands in for, by the entry.
_FALLBACKS: dict[Any, Callable[..., Any]] = {}


def entry(make: Callable[..., Any] | None, *args: Any, method: bool) -> Callable[[F], F]:
    """A decorator binding the name it decorates, once, to the C entry
    ``make(function, entry_doc(function, method=method), *args)`` that stands in for
    ``function`` (a ``cbcl._native.*_entry`` function: ``None`` where the extension is
    not built), or to ``function`` itself where there is no ``make`` or it returns
    ``None``. A method's entry is a ``cbcl._native.MethodEntry``, which learns its class
    when the class is made. :func:`fallback` gives the Python function back."""
    def decorate(function: F) -> F:
        if make is None:
            return function
        made = make(function, entry_doc(function, method=method), *args)
        if made is None:
            return function
        _FALLBACKS[made] = function
        return made  # type: ignore[no-any-return]  # (the entry: called as the function is)

    return decorate


def fallback(bound: F) -> F:
    """The Python function the entry ``bound`` stands in for (:func:`entry`), or ``bound``
    itself if it is not one: the reference the tests hold the entries to."""
    return _FALLBACKS.get(bound, bound)  # type: ignore[return-value]


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
