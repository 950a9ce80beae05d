"""Types of the optional C accelerator ``cbcl/_encoders.c``: the C twins of the canonical
text writer (``cbcl._canonical.canonical_value_python``) and of the binary frame writer
(``cbcl._codec.Encoder``). They take positional arguments only, raise nothing for anything
in their input and return ``None`` when the Python twin must write (or refuse) it."""

from decimal import Decimal
from typing import Any

from ._values import Value

def canonical(value: object, /) -> str | None:
    """The canonical text of ``value``, or ``None`` for anything the Python twin must
    handle (a type that is not exactly a CBCL type, a value out of range, deep nesting)."""

def prepare(codes: dict[Value, int], /) -> object | None:
    """A symbol table's codes (``SymbolTable.codes``, read once) as :func:`pack_frame`
    takes them, or ``None`` if they are not a dict of exact symbols, keywords and URIs to
    ints (then the Python twin writes every frame)."""

def pack_frame(header: bytes, tokens: list[Any], body: object, table: object, /) -> bytes | None:
    """``header``, then the msgpack of each envelope token (ints and strs, as
    ``msgpack.packb`` writes them, without the array header), then the tokens of ``body``
    (``None``: no body) under ``table`` (what :func:`prepare` returned), or ``None``."""

def setup(
    symbol: type[str],
    keyword: type[str],
    uri: type[str],
    decimal: type[Decimal],
    max_decimal_chars: int,
    codes: tuple[int, int, int, int, int, int, int, int],
    /,
) -> None:
    """The types of ``cbcl._values``, ``MAX_DECIMAL_CHARS`` and the token codes
    ``LPAR, RPAR, INTEGER, DECIMAL, SYMBOL, KEYWORD, URI, FIRST_ENTRY`` of
    ``cbcl._vocabulary``; until it is called every function returns ``None``."""
