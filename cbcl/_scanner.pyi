"""Types of the optional C twin of the text reader's fast tiers (``cbcl/_scanner.c``).
Positional arguments only (``METH_VARARGS``); ``read_value`` raises nothing for anything
in its text and returns ``None`` when the Python tiers must read it."""

from collections.abc import Callable

from .core._values import Value

def read_value(
    text: str,
    pos: int,
    cache: dict[str, object],
    make_atom: Callable[[str, int], object | None],
    depth_left: int,
    max_items: int,
    budget: int,
    max_string: int,
    max_name: int,
    /,
) -> tuple[Value, int, int] | None:
    """The value at character ``pos`` of ``text`` (whitespace and comments may precede
    it), the character index just after it and the number of its nodes; or ``None`` for
    anything but a well-formed value within the limits (``depth_left`` lists deep,
    ``max_items`` items a list, ``budget`` nodes, strings of ``max_string`` UTF-8 bytes,
    names of ``max_name`` characters). ``cache`` is ``cbcl.core._reader._CACHE`` (token text ->
    atom, read only) and ``make_atom`` ``cbcl.core._reader._atom``, called on a miss for every
    atom but integers and decimals of more than 4 characters, which are made in C."""

def decimals_in_place() -> bool:
    """Whether this module makes ``Decimal``\\ s in place (the layout check of
    ``cbcl/_cstack.h`` held on this interpreter), else by ``Decimal(text)``."""
