"""Types of the optional C accelerator ``cbcl/_encoders.c``: the C twins of the canonical
text writer (``cbcl.core._canonical.canonical_value_python``) and of the binary frame writer
(``cbcl.binary._codec.Encoder``). They take positional arguments only, raise nothing for anything
in their input and return ``None`` when the Python twin must write (or refuse) it."""

from decimal import Decimal
from typing import Any

from .core._values import Value

def canonical(value: object, /) -> str | None:
    """The canonical text of ``value``, or ``None`` for anything the Python twin must
    handle (a type that is not exactly a CBCL type, a value out of range, deep nesting)."""

def canonical_message(message: object, /) -> str | None:
    """``Message.canonical()``'s text (that of ``canonical_value(message.to_value())``),
    written from the slots of an exact :class:`cbcl.Message`, or ``None`` for anything the
    Python path must handle (a subclass, an intent that is not an ``Intent`` member, a
    signature that is not an exact ``Signature``, or a field :func:`canonical` declines)."""

def pack_message(header: bytes, message: object, table: object, /) -> bytes | None:
    """``Encoder.encode``'s frame of ``message``: ``header``, the envelope tokens, then the
    body's under ``table`` (what :func:`prepare` returned), from the slots of an exact
    :class:`cbcl.Message`, or ``None`` for anything the Python path must handle (as
    :func:`canonical_message`, and a token :func:`pack_frame` declines)."""

def setup_message(message: type, signature: type, names: tuple[Any, ...],
                  intents: tuple[tuple[Any, Any], ...], /) -> bool:
    """``Message`` and ``Signature`` (slotted: their fields are read at their member
    descriptors' offsets), the envelope's symbols (the version, then each field's, in the
    fields' order) and the intents as ``(member, symbol)`` pairs; ``False`` (every message
    declined) if the types are not slotted as expected."""

def encode_message(message: object, registry: object, tables: dict[Any, Any], /) -> bytes | None:
    """:func:`pack_message` with the header and table an ``Encoder`` cached for the
    message's protocol (``Encoder._tables``), found as ``registry.get`` finds the protocol
    (``registry`` an exact ``Registry``), or ``None``: not cached yet, or declined."""

def setup_frame(intents: tuple[Any, ...], present_bits: tuple[int, int, int, int, int, int],
                registry: type, /) -> None:
    """The intents by code (``cbcl.binary._codec.INTENTS``), the present bits of
    conversation-id, in-reply-to, reply-by, timestamp, signature and body, and the
    ``Registry`` type; until it is called :func:`pack_message` and :func:`encode_message`
    return ``None``."""

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
) -> bool:
    """The types of ``cbcl.core._values``, ``MAX_DECIMAL_CHARS`` and the token codes
    ``LPAR, RPAR, INTEGER, DECIMAL, SYMBOL, KEYWORD, URI, FIRST_ENTRY`` of
    ``cbcl.core._vocabulary``; until it is called every function returns ``None``. Returns
    whether decimals are read from ``_decimal``'s own layout (checked on samples), else
    from their text."""

def canonical_entry(fallback: Any, doc: str, /) -> Any:
    """``Message.canonical`` as a C method (a method descriptor of ``Message``, which
    ``setup_message`` must have found): :func:`canonical_message`'s text, else
    ``fallback(message)``, the Python method it stands in for; ``doc`` is its ``ml_doc``
    (``cbcl.core._entries.entry_doc``)."""

def encode_entry(encoder: type, fallback: Any, doc: str, /) -> Any:
    """``Encoder.encode`` as a C method: for one positional argument and an encoder whose
    ``validate`` slot is ``False``, :func:`encode_message` with its ``registry`` and
    ``_tables`` slots; else, or when that declines, ``fallback(encoder, *args,
    **kwargs)``. ``None`` if ``encoder`` does not keep those three in slots."""
