"""Types of the optional C accelerator ``cbcl/_speedups.c``: the C twins of the binary
decoder's fast path (``cbcl.binary._codec``) and the lexical rules they apply. The functions take
positional arguments only; ``unpack`` and ``build_body`` raise nothing
for anything in their input and return ``None`` when the careful Python decoder must read
the frame again."""

from collections.abc import Callable
from typing import Any, TypeVar

from _typeshed import ReadableBuffer

from .core._values import Value
from .protocol._message import Message

# A node of a protocol's StackAutomaton (cbcl/grammar/_automaton.py): an exact dict holding the
# node's reserved keys (its stack) and its transitions by token class, whose values are
# nodes, ``(node, whole)`` pairs and the automaton's outcomes alike.
_Node = TypeVar("_Node", bound=dict[Any, Any])

def unpack(data: ReadableBuffer, start: int, /) -> list[int | str] | None:
    """The ints and strs of a frame's msgpack tokens from ``data[start:]`` (twin of
    msgpack's ``Unpacker``), or ``None`` for anything outside the subset a frame holds."""

def check_atom(code: int, text: str, /) -> bool:
    """Whether the rule of kind ``code`` (DECIMAL, SYMBOL, KEYWORD or URI, the token codes of
    ``cbcl.core._vocabulary``) admits ``text``, as ``build_body`` judges an atom written in full
    that its memos miss: ``DECIMAL_RE`` (at most ``MAX_DECIMAL_CHARS``), ``SYMBOL_RE``,
    ``NAME_RE``, ``URI_RE``, mirrored in C. ``ValueError`` for another code."""

def build_body(
    data: ReadableBuffer,
    offset: int,
    entries: tuple[tuple[Value, str], ...],
    codes: dict[Value, int],
    caches: tuple[dict[str, Value] | None, ...],
    make_atom: Callable[[int, str], Value | None],
    start: _Node | None,
    step: Callable[[_Node, str], object],
    max_depth: int,
    max_items: int,
    max_string: int,
    max_name: int,
    budget: int,
    refused: object,
    accept: object,
    memo_entries: int,
    /,
) -> Value | None:
    """The body whose tokens are ``data[offset:]`` to the frame's end, read straight from
    the msgpack bytes (twin of ``cbcl.binary._codec._fast_body_loop`` on the same bytes' tokens),
    or ``None``. ``entries`` holds ``(atom, terminal)`` for each static code from
    ``FIRST_ENTRY`` on; an atom written in full takes the next code after them. ``caches``
    holds one entry per token code below the first table entry (a dict for DECIMAL,
    SYMBOL, KEYWORD and URI): the calling decoder's memos (``cbcl.binary._codec._Memos.caches``,
    the reader's intern tables for symbols and keywords), read only. A miss is validated
    in C (:func:`check_atom`): an invalid atom declines without a call, a decimal longer
    than the decimal memo keeps is constructed in C, a URI made in C and remembered in the
    URI memo (at most ``memo_entries``), and only a valid symbol, keyword or short decimal
    calls ``make_atom``, which makes it and may add it to them. ``start`` is the
    automaton's start node, or ``None`` when the grammar is not run; at most ``budget``
    nodes (lists and atoms); ``refused`` and ``accept`` are the outcomes ``step`` returns,
    compared by identity."""

def frame_envelope(
    data: ReadableBuffer,
    start: int,
    intents: tuple[Any, ...],
    uris: dict[str, Any],
    max_string: int,
    memo_entries: int,
    /,
) -> tuple[Any, ...] | None:
    """The envelope of the frame whose tokens start at ``data[start]``, checked as
    ``cbcl.binary._codec._fast_message`` checks it: ``(intent, bits, message_id, sender, receiver,
    conversation_id, in_reply_to, reply_by, timestamp, key_id, signed, offset)``, ``None``
    for an absent field, ``offset`` where the body's tokens start; or ``None`` for anything
    the careful decoder must judge. ``intents`` is ``cbcl.binary._codec.INTENTS``, ``uris`` the
    decoder's URI memo: a URI it misses is validated, made and remembered there in C (texts
    of at most ``MEMO_CHARS``, the memo emptied when it holds ``memo_entries``)."""

def recognise(
    body: Value,
    node: _Node,
    classes: dict[Value, str],
    terminals: dict[type, str],
    step: Callable[[_Node, str], object],
    refused: object,
    accept: object,
    /,
) -> bool:
    """Whether the protocol's automaton accepts ``body`` (a value already read) from
    ``node``: the twin of ``cbcl.protocol._pass2.walk_body``. ``classes`` maps the atoms that spell
    grammar literals to their terminals (``Protocol.atoms``), ``terminals`` the types of
    values to their data terminals (``ATOM_TERMINALS``); a value of another type is
    refused. Raises only what ``step`` raises."""

def envelope(
    value: Value,
    version: Value,
    fields: dict[Any, tuple[int, int]],
    intents: dict[Any, Any],
    signature: type,
    message: type,
    attributes: tuple[str, ...],
    uri: type,
    symbol: type,
    /,
) -> Any:
    """The ``Message`` of a whole document ``value``, or ``None`` where the envelope
    grammar refuses it: the twin of ``cbcl.protocol._envelope.message_of_python``. ``fields`` maps
    each field's symbol to its place in grammar order (its index in ``attributes``) and its
    kind (``cbcl.protocol._envelope``'s ``_ID`` … ``_SIGNATURE``), ``intents`` the intent symbols to
    the ``Intent`` members; ``signature``, ``message``, ``uri`` and ``symbol`` are the
    ``Signature``, ``Message``, ``URI`` and ``Symbol`` types. Raises only what
    ``Signature`` raises."""

def decode_frame(data: bytes, state: tuple[Any, ...], /) -> Message | None:
    """A whole frame decoded and recognised in one call (the twin of
    ``cbcl.binary._codec._fast_frame`` and its header and table lookup): the ``Message``, or
    ``None`` for anything the Python decoder must judge (a short id, a digest without a
    frame plan in ``state``, an ungoverned intent, any doubt). ``state`` is a decoder's
    (``cbcl.binary._codec._frame_state``). ``TypeError`` for data that is not bytes or a
    misshapen state or plan."""

def accept_document(value: Value, tables: tuple[Any, ...], protocols: dict[Any, Any], /,
                    ) -> Message | None:
    """Both passes over a whole document ``value``: the twin of
    ``cbcl.protocol._api.accept_document_python``. The ``Message`` when its envelope is one,
    ``protocols`` (a registry's loaded protocols by id) holds its protocol and pass 2 (by
    the protocol's ``acceptance`` plan) accepts its body, else ``None``. ``tables``:
    ``envelope``'s arguments after the value, then ``ATOM_TERMINALS``, the automaton's
    ``REFUSED`` and ``ACCEPT`` and ``cbcl.protocol._schema._has_heads``. ``TypeError`` for misshapen
    tables or plans."""

def schema_valid(pairs: Any, body: tuple[Value, ...],
                 has_heads: Callable[[tuple[Value, ...], tuple[Any, ...]], bool], /,
                 ) -> bool | None:
    """The schema's fast pass over ``body``, whose heads ``Schema.record_for`` matched to
    the record whose ``_Pairs`` is ``pairs``: the twin of ``cbcl.protocol._schema._valid``, reading
    the same prepared structures. ``False`` also where the Python pass would raise (which
    ``check_schema`` takes as ``False``); ``None`` for a type of more than 63 fields, which
    it leaves to the Python pass. ``has_heads`` is ``cbcl.protocol._schema._has_heads``."""

def make_object(type: type, attributes: tuple[str, ...], values: tuple[Any, ...], /) -> Any:
    """An instance of ``type`` (one ``object.__new__`` makes; ``TypeError`` otherwise)
    made without ``__init__`` and given each attribute its value as ``object.__setattr__``
    gives it: ``Message._trusted``'s construction, its fields checked by the caller."""

def decode_entry(decoder: type, fallback: Any, verified: Any, doc: str, /) -> Any:
    """``Decoder.decode`` as a C method (``cbcl/_entry.h``): for one positional argument of
    exact bytes and a decoder with a frame state, :func:`decode_frame`'s message (through
    ``verified(message, decoder.registry)`` when it is signed or signatures are required);
    else, or when that declines, ``fallback(decoder, *args, **kwargs)``. ``None`` if
    ``decoder`` does not keep ``_frame_state``, ``require_signatures`` and ``registry`` in
    slots."""

def one_shot_entry(fallback: Any, doc: str, verified: Any, registry: type, memos: type,
                   /) -> Any:
    """``cbcl.decode`` as a C function (``cbcl/_entry.h``): ``decode(data, registry=R)``
    of exact bytes, with ``R`` an exact ``registry`` whose one-shot memos (``R._one_shot``,
    a ``memos``) hold the default limits' frame state, is :func:`decode_frame`'s message
    (through ``verified(message, R)`` when it is signed); any other call, or a frame it
    declines, is ``fallback``'s. ``None`` if ``memos`` keeps no ``default_state`` slot."""

def parse_entry(fallback: Any, doc: str, verified: Any, only_space_after: Any,
                tables: tuple[Any, ...], cache: dict[str, object], make_atom: Any,
                limits: tuple[int, int, int, int, int, int], /) -> Any:
    """``cbcl.parse`` as a C function: ``parse(data, registry=registry)`` of exact bytes
    within ``limits`` (the default limits' max_message_bytes, max_depth, max_list_items,
    max_nodes, max_string_bytes, max_name_chars) read by ``cbcl._scanner``'s reader (its
    capsule) and accepted by :func:`accept_document` (a signed message through
    ``verified(message, registry)``); any other call, or a document declined,
    ``fallback(*args, **kwargs)``. ``None`` if ``cbcl._scanner`` is not built."""

def decimals_in_place() -> bool:
    """Whether this module makes ``Decimal``\\ s in place (the layout check of
    ``cbcl/_cstack.h`` held on this interpreter), else by ``Decimal(text)``."""
