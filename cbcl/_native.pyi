"""Types of the optional C accelerator ``cbcl._native`` (``cbcl/_native_src/``: one module,
built from scanner.c, speedups.c, encoders.c, intern.c …). Its functions take positional arguments
only; the twins raise nothing for anything in their input and return ``None`` when the
Python twin must read, write or refuse it. What the set-up and ``*_entry`` functions are
given, and the memos, are kept in the state of the module object they are called on
(``cbcl/_native_src/native.h``): another module object, such as another interpreter's,
has its own."""

from collections.abc import Callable, Iterator, MutableMapping
from decimal import Decimal
from typing import Any, TypeVar, final

from _typeshed import ReadableBuffer

from .core._values import Value
from .protocol._message import Message

# ---- the text reader's C twin (cbcl/_native_src/scanner.c)

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
    atom) and ``make_atom`` ``cbcl.core._reader._atom``, called on a miss for every atom but
    integers, decimals of more than 4 characters and (once :func:`setup_intern` has run)
    ASCII keywords, symbols and URIs, which are made in C and interned (a symbol in its
    intern table only; keywords and URIs remembered in ``cache`` too, as ``make_atom``
    would). The cyclic collector does not run during the read (nor make_atom's calls)."""

def setup_intern(symbols: NameTable, keywords: NameTable, cache_chars: int, cache_max: int,
                 cache: dict[str, object] | None = None, /) -> None:
    """The reader's intern tables (``cbcl.core._values.SYMBOL_TABLE`` and
    ``KEYWORD_TABLE``, each with its bound and pinned names) and the token cache's bounds:
    the C readers and decoder intern new names there, without a call into Python.
    ``cache`` (the token cache) is emptied, with the native memos, when a table is. Raises
    ``TypeError`` for tables that are not NameTables of their kind, ``ValueError`` for a
    bound that is not positive."""

@final
class NameTable(MutableMapping[str, Any]):
    """An intern table of symbols (``which=0``) or keywords (``which=1``) by name, at most
    ``bound`` atoms (``cbcl/_native_src/intern.c``): a new name that finds it full empties
    it down to the names of ``pinned`` (name -> atom) and has the native memos forget their
    atoms. Raises ``ValueError`` for another ``which`` or a ``bound`` < 1."""

    def __init__(self, which: int, bound: int, pinned: dict[str, Any], /) -> None: ...
    def __getitem__(self, name: str, /) -> Any: ...
    def __setitem__(self, name: str, atom: Any, /) -> None:
        """Enter ``atom`` under ``name``; ``ValueError`` unless its text is ``name``."""
    def __delitem__(self, name: str, /) -> None: ...
    def __iter__(self) -> Iterator[str]: ...
    def __len__(self) -> int: ...
    def intern(self, name: str, pin: bool = False, /) -> Any:
        """The atom interned as ``name`` (an exact str, a valid name: not checked), made
        and entered on a miss; ``pin`` keeps it through emptyings (at most bound // 2)."""
    @property
    def bound(self) -> int: ...
    @property
    def pinned(self) -> dict[str, Any]: ...
    @property
    def hashes_bytes(self) -> bool:
        """Whether names are hashed from their bytes (the check against str's hash held)."""

def forget_atoms() -> None:
    """Empty the native memos of atoms and the token cache :func:`setup_intern` was given,
    as when an intern table is emptied (``cbcl.core._reader._intern`` calls it when it
    empties one)."""

def decimal_layout_holds(type: type, /) -> tuple[bool, bool]:
    """Whether the layout check of ``cbcl/_native_src/cstack.h`` holds for ``type`` (its
    objects may be made in place), and whether they may be untracked by the cyclic
    collector (not a GC type, or one whose objects visit only their type); for the tests.
    Changes nothing."""

# ---- the binary decoder, pass 2, the envelope, the entries (cbcl/_native_src/speedups.c)

# A node of a protocol's StackAutomaton (cbcl/grammar/_automaton.py): an exact dict holding the
# node's reserved keys (its stack) and its transitions by token class, whose values are
# nodes, ``(node, whole)`` pairs and the automaton's outcomes alike; for an automaton made
# with ``walker_masks``, ``(next, ops)`` and ``(node, whole, ops)`` where a token passes a
# keyword set's state: the walks keep the sets' masks and apply ``ops`` to them
# (``cbcl.grammar._automaton.apply_set_ops``).
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
    conversation_id, in_reply_to, reply_by, timestamp, key_id, signed, offset, trace)``, ``None``
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
    refused. Raises what ``step`` raises, and ``ValueError`` for a keyword set's operation
    with no set under way (``node`` inside a set of a ``walker_masks`` automaton)."""

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

@final
class FrameState:
    """What :func:`decode_frame` reads with each frame of a decoder, by name
    (``cbcl.binary._codec._frame_state`` makes one per decoder; the one-shot ``decode``
    one per registry and limits). Every argument is keyword-only and required, and is
    checked here (``TypeError`` for one of the wrong type or size); the fields are
    read-only. The dicts are shared with the memos and the registry, which change them in
    place."""

    def __init__(
        self,
        *,
        frame_plans: dict[bytes, tuple[Any, ...]],
        protocols: dict[Any, Any],
        intents: tuple[Any, ...],
        intent_lengths: tuple[int, ...],
        shapes: bytes,
        uris: dict[str, Any],
        caches: tuple[dict[str, Any] | None, ...],
        keep: Callable[[int, str], Any],
        envelope_nodes: tuple[int, ...],
        refused: object,
        accept: object,
        has_heads: Callable[..., bool],
        symbol: type,
        message: type,
        signature: type,
        attributes: tuple[str, ...],
        refusal: Callable[..., object],
        memo_entries: int,
        max_message_bytes: int,
        max_string_bytes: int,
        max_body_depth: int,
        max_list_items: int,
        max_name_chars: int,
        max_nodes: int,
    ) -> None: ...
    @property
    def frame_plans(self) -> dict[bytes, tuple[Any, ...]]:
        """The memos' frame plans by digest (``_Memos.frame_plans``)."""
    @property
    def protocols(self) -> dict[Any, Any]:
        """The registry's loaded protocols by id (``Registry._protocols_by_id()``)."""
    @property
    def intents(self) -> tuple[Any, ...]:
        """The ``Intent`` members by wire index."""
    @property
    def intent_lengths(self) -> tuple[int, ...]:
        """Each intent's name's length, by wire index."""
    @property
    def shapes(self) -> bytes:
        """By presence bits (64 bytes): 1 where the envelope is within the limits."""
    @property
    def uris(self) -> dict[str, Any]:
        """The memos' URI memo."""
    @property
    def caches(self) -> tuple[dict[str, Any] | None, ...]:
        """The memos' atom caches by token code."""
    @property
    def keep(self) -> Callable[[int, str], Any]:
        """The memos' ``keep(code, text)``, called for an atom validated in C."""
    @property
    def envelope_nodes(self) -> tuple[int, ...]:
        """The envelope's nodes by presence bits (64)."""
    @property
    def refused(self) -> object:
        """The automaton's ``REFUSED``."""
    @property
    def accept(self) -> object:
        """The automaton's ``ACCEPT``."""
    @property
    def has_heads(self) -> Callable[..., bool]:
        """``cbcl.protocol._schema._has_heads``."""
    @property
    def symbol(self) -> type:
        """The ``Symbol`` type."""
    @property
    def message(self) -> type:
        """The ``Message`` type."""
    @property
    def signature(self) -> type:
        """The ``Signature`` type."""
    @property
    def attributes(self) -> tuple[str, ...]:
        """``Message``'s 12 attribute names, in grammar order."""
    @property
    def refusal(self) -> Callable[..., object]:
        """Raises the error of a body the grammar refuses (``_codec._frame_refusal``)."""
    @property
    def memo_entries(self) -> int:
        """The most entries an atom memo holds."""
    @property
    def max_message_bytes(self) -> int:
        """The limits' ``max_message_bytes``."""
    @property
    def max_string_bytes(self) -> int:
        """The limits' ``max_string_bytes``."""
    @property
    def max_body_depth(self) -> int:
        """The limits' ``max_depth`` less the envelope's two lists."""
    @property
    def max_list_items(self) -> int:
        """The limits' ``max_list_items``."""
    @property
    def max_name_chars(self) -> int:
        """The limits' ``max_name_chars``."""
    @property
    def max_nodes(self) -> int:
        """The limits' ``max_nodes``."""

def refusal_of(body: Value, node: dict[Any, Any], classes: dict[Any, str],
               terminals: dict[type, str], step: Callable[[Any, str], Any], refused: object,
               accept: object, /) -> tuple[int, tuple[int, ...], Any, str,
                                          tuple[int, ...]] | None:
    """The walk of :func:`recognise`, reporting where the grammar refused ``body``:
    ``None`` if it accepts it, else ``(kind, path, node, cls, frames)`` (kind 1 item, 2 a
    list's close, 3 the end; the element indexes on the way down; the recogniser's node
    the refused token was fed to, its class, the keyword sets' masks then, innermost
    last). ``TypeError`` for a value in ``body`` that is not a CBCL one."""

def text_index(text: str, path: tuple[int, ...], kind: int, /) -> int:
    """The character index in ``text`` (a document read whole) of the token a refusal
    points at (kind 1 the element at ``path``, 2 the ``)`` of the list there, 3 just after
    the value there): ``cbcl.protocol._pass2.refusal_index_python``'s twin, one lexical
    pass up to it. ``ValueError`` where the text does not hold ``path``."""

def decode_frame(data: bytes, state: FrameState, /) -> Message | None:
    """A whole frame decoded and recognised in one call (the twin of
    ``cbcl.binary._codec._fast_frame`` and its header and table lookup): the ``Message``, or
    ``None`` for anything the Python decoder must judge (a short id, a digest without a
    frame plan in ``state``, an ungoverned intent, any doubt). ``state`` is a decoder's
    (``cbcl.binary._codec._frame_state``). A frame sound in every other way whose body the
    grammar refuses is not declined: its walk stops at the refused token, the rest of the
    body is built without the grammar (its limits and rules still decide), and
    ``state.refusal`` is called with where the walk stopped, which raises the
    ``BodyError``. ``TypeError`` for data that is not bytes, a state that is not a
    :class:`FrameState`, or a misshapen plan."""

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
    """The schema check over ``body``, whose heads ``Schema.record_for`` matched to the
    record whose ``_Pairs`` is ``pairs``: the C twin of ``cbcl.protocol._schema._explain``
    (which names the violation where this says ``False``), reading the prepared structures
    of ``cbcl.protocol._schema``. ``None`` for a type of more than 63 fields, which it
    leaves to the reference. ``has_heads`` is ``cbcl.protocol._schema._has_heads``."""

def make_object(type: type, attributes: tuple[str, ...], values: tuple[Any, ...], /) -> Any:
    """An instance of ``type`` (one ``object.__new__`` makes; ``TypeError`` otherwise)
    made without ``__init__`` and given each attribute its value as ``object.__setattr__``
    gives it (the ``Message`` :func:`setup_message` registered, given its fields in grammar
    order, is filled in its :class:`MessageFields` struct): ``Message._trusted``'s
    construction, its fields checked by the caller."""

class MessageFields:
    """The storage of ``cbcl.protocol._message.Message``: a base class whose C struct
    holds the eleven fields as named members (``cbcl/_native_src/native.h``), which the
    C writers read and the decoders fill directly. Writable (the frozen dataclass over it
    writes them with ``object.__setattr__``); ``AttributeError`` for one unset. No
    ``__dict__``, no weak references."""

    message_id: Any
    sender: Any
    receiver: Any
    intent: Any
    protocol: Any
    conversation_id: Any
    in_reply_to: Any
    reply_by: Any
    timestamp: Any
    body: Any
    signature: Any

class EncoderFields:
    """The storage of what ``cbcl.binary._codec.Encoder.encode``'s C entry reads, as
    named members of its C struct: ``validate``, ``registry``, ``_tables`` and
    ``_registry_protocols``. Writable, ``AttributeError`` for one unset; a class over it
    may add slots. Where the class that binds :func:`encode_entry` is not over it, every
    call falls back to the Python method."""

    validate: Any
    registry: Any
    _tables: Any
    _registry_protocols: Any

class SignatureFields:
    """The storage of ``cbcl.protocol._message.Signature``, as :class:`MessageFields` is
    ``Message``'s: ``key_id`` and ``value`` as named members of its struct."""

    key_id: Any
    value: Any

@final
class MethodEntry:
    """A C method standing in for a Python method, its fallback (``cbcl/_native_src/entry.h``),
    made by the ``*_entry`` functions for a class body to bind
    (``cbcl.core._entries.entry``): a method descriptor whose class, learned from
    ``__set_name__`` as the class is made, is the one whose instances it takes as
    ``self`` and whose slots it reads. Not made directly."""

    __name__: str
    __qualname__: str
    __wrapped__: Callable[..., Any]
    __objclass__: type | None
    def __set_name__(self, owner: type, name: str) -> None: ...
    def __get__(self, instance: object, owner: type | None = None) -> Any: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

def decode_entry(fallback: Any, doc: str, verified: Any, /) -> MethodEntry:
    """``Decoder.decode`` as a C method, for ``Decoder``'s class body: for one positional
    argument of exact bytes and a decoder with a frame state, :func:`decode_frame`'s
    message (through ``verified(message, decoder.registry)`` when it is signed or
    signatures are required); else, or when that declines, ``fallback(decoder, *args,
    **kwargs)``, as it is where the class does not keep ``_frame_state``,
    ``require_signatures`` and ``registry`` in slots."""

def one_shot_entry(fallback: Any, doc: str, verified: Any, registry: type, memos: type,
                   /) -> Any:
    """``cbcl.decode`` as a C function (``cbcl/_native_src/entry.h``): ``decode(data, registry=R)``
    of exact bytes, with ``R`` an exact ``registry`` whose one-shot memos (``R._one_shot``,
    a ``memos``) hold the default limits' frame state, is :func:`decode_frame`'s message
    (through ``verified(message, R)`` when it is signed); any other call, or a frame it
    declines, is ``fallback``'s. ``None`` if ``memos`` keeps no ``default_state`` slot."""

def parse_entry(fallback: Any, doc: str, verified: Any, only_space_after: Any,
                tables: tuple[Any, ...], cache: dict[str, object], make_atom: Any,
                limits: tuple[int, int, int, int, int, int],
                declined: Callable[[Any, str, Any, tuple[Any, ...] | None], Message | None],
                constraints: Callable[[Any, Message], None], /) -> Any:
    """``cbcl.parse`` as a C function: ``parse(data, registry=registry)`` of exact bytes
    within ``limits`` (the default limits' max_message_bytes, max_depth, max_list_items,
    max_nodes, max_string_bytes, max_name_chars) read by ``cbcl._native``'s reader (its
    capsule) and accepted by :func:`accept_document` over every protocol the registry
    holds (a signed message through ``verified(message, registry)``, then, in a registry
    with constraints, ``constraints(registry, message)``); a document read whole that it
    does not accept, ``declined(value, text, registry, report)`` (the careful path from
    the value: a message, ``None`` to decline, or its error; ``report``: where the walk
    found the grammar refused the body, as :func:`refusal_of` reports it, or ``None``); any
    other call, or a document declined,
    ``fallback(*args, **kwargs)``. ``None`` if ``cbcl._native`` is not built."""

# ---- the encoders (cbcl/_native_src/encoders.c)

def canonical(value: object, /) -> str | None:
    """The canonical text of ``value``, or ``None`` for anything the Python twin must
    handle (a type that is not exactly a CBCL type, a value out of range, deep nesting)."""

def canonical_message(message: object, /) -> str | None:
    """``Message.canonical()``'s text (that of ``canonical_value(message.to_value())``),
    written from the fields of an exact :class:`cbcl.Message`, or ``None`` for anything the
    Python path must handle (a subclass, an intent that is not an ``Intent`` member, a
    signature that is not an exact ``Signature``, or a field :func:`canonical` declines)."""

def pack_message(header: bytes, message: object, table: object, /) -> bytes | None:
    """``Encoder.encode``'s frame of ``message``: ``header``, the envelope tokens, then the
    body's under ``table`` (what :func:`prepare` returned), from the fields of an exact
    :class:`cbcl.Message`, or ``None`` for anything the Python path must handle (as
    :func:`canonical_message`, and a token :func:`pack_frame` declines)."""

def setup_message(message: type, signature: type, names: tuple[Any, ...],
                  intents: tuple[tuple[Any, Any], ...], /) -> bool:
    """``Message`` and ``Signature`` (classes over :class:`MessageFields` and
    :class:`SignatureFields` that add nothing to their instances: their fields are read
    from the structs), the envelope's symbols (the version, then each field's, in the
    fields' order) and the intents as ``(member, symbol)`` pairs; ``False`` (every message
    declined) if the types are not laid out so: not over those bases, or adding a
    ``__dict__``, ``__weakref__`` or a slot."""

def encode_message(message: object, registry: object, tables: dict[Any, Any], /) -> bytes | None:
    """:func:`pack_message` with the header and table an ``Encoder`` cached for the
    message's protocol (``Encoder._tables``), found as ``registry.get`` finds the protocol
    (``registry`` an exact ``Registry``), or ``None``: not cached yet, or declined."""

def setup_frame(intents: tuple[Any, ...],
                present_bits: tuple[int, int, int, int, int, int, int], registry: type,
                /) -> None:
    """The intents by code (``cbcl.binary._codec.INTENTS``), the present bits of
    conversation-id, in-reply-to, reply-by, timestamp, signature, body and trace, and the
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

def canonical_entry(fallback: Any, doc: str, /) -> MethodEntry:
    """``Message.canonical`` as a C method, for ``Message``'s class body:
    :func:`canonical_message`'s text (once ``setup_message`` has found the types), else
    ``fallback(message)``, the Python method it stands in for; ``doc`` is its ``ml_doc``
    (``cbcl.core._entries.entry_doc``)."""

def encode_entry(fallback: Any, doc: str, /) -> MethodEntry:
    """``Encoder.encode`` as a C method, for ``Encoder``'s class body: for one positional
    argument and an encoder whose ``validate`` is ``False``, :func:`encode_message` with
    its ``registry`` and ``_tables`` (read from its :class:`EncoderFields` struct); else,
    or when that declines, ``fallback(encoder, *args, **kwargs)``, as it is where the
    class is not over :class:`EncoderFields`."""

def decimals_in_place() -> bool:
    """Whether this module makes ``Decimal``\\ s in place (the layout check of
    ``cbcl/_native_src/cstack.h`` held on this interpreter), else by ``Decimal(text)``."""

@final
class SessionState:
    """An established binary session's per-message state (``cbcl/_native_src/session.c``;
    ``cbcl.session._session.Session._start_native`` makes it): the decoder's and encoder's
    methods, the parties, the skew bound, the replay window, the conversation machine as
    an integer table (``cbcl.protocol._conversation.machine_table``; ``table`` ``None``:
    the protocol declares none) with the open conversations and the finished ids.
    Keyword-only; ``TypeError``/``ValueError`` for a field of the wrong type or shape."""

    def __init__(
        self,
        *,
        decode: Callable[[bytes], Any],
        encode: Callable[[Any], bytes],
        message_type: type,
        me: Any,
        peer: Any,
        protocol: Any,
        max_skew_ms: int,
        replay_window: int,
        table: tuple[int, ...] | None,
        intents: tuple[Any, ...],
        states: tuple[Any, ...],
        roles: tuple[Any, ...],
        final: tuple[bool, ...],
        initial: int,
        step_type: type,
        max_open: int,
    ) -> None: ...
    def receive(self, data: bytes, now: int, /) -> tuple[Any, Any] | int:
        """``(Message, Step | None)`` for a frame (length prefix cut) decoded, from the
        peer, fresh, not a replay and allowed by its conversation (the state then holds
        it); else a refusal code, and nothing changed (the reference judges it)."""
    def send(self, message: Any, now: int, /) -> tuple[bytes, Any] | int:
        """``(framed bytes, Step | None)`` for a message to the peer its conversation
        allows (the state then holds it); else a refusal code, and nothing changed.
        Raises what the encoder raises."""
    def threads(self) -> list[tuple[str, bool, int, dict[str, int], int | None, int,
                                    list[Any]]]:
        """The open conversations, oldest first: (id, started by the peer, state index,
        {message id: role index}, reply-by or ``None``, awaited role index, history)."""
    def window(self) -> list[str]:
        """The replay window's message ids, oldest first."""
    def finished(self) -> list[str]:
        """The finished conversations' ids kept, oldest first."""
    def load(self, window: list[str], threads: list[tuple[str, bool, int, dict[str, int],
                                                           int | None, int, list[Any]]],
             finished: list[str], /) -> None:
        """Replace the state by these (the forms of the three methods above)."""

@final
class RecordConverter:
    """A ``cbcl.Record`` class's body converter (``cbcl/_native_src/records.c``), made once
    per class by ``cbcl.protocol._records``: ``members`` holds, per member in declared
    order, ``(keyword, member descriptor, required, default, kind, argument,
    converter)``. Raises ``TypeError`` for a plan it cannot follow."""

    def __new__(cls, record: type, body_slot: Any, start: int,
                members: tuple[tuple[Any, ...], ...], heads: tuple[Any, ...],
                intents: tuple[Any, ...], /) -> RecordConverter: ...
    def __call__(self, body: Value, /) -> Any:
        """The instance of the class made of ``body`` (a checked body), as the class's
        Python ``_from_body``; raises what a member's Python converter raises
        (``ValueError``), ``TypeError`` for a body that is not a tuple."""
    def of(self, message: Any, protocol: Any, /) -> Any:
        """The body of ``message`` as an instance, where its one head, its intent and the
        trusted ``protocol`` make it ``record_of``'s ordinary case; else ``None``."""
    def trust(self, protocol: Any, /) -> None:
        """Trust ``protocol`` (``None``: none) as one whose schema holds the class's record."""


def check_outgoing(protocol: object, message: object, limits: object, /) -> bool | None:
    """The outgoing check in C (cbcl/_native_src/outgoing.c): ``True`` where ``message``
    is within ``limits`` (a walk that accepts only what ``_api._within`` calls within)
    and pass 2 and the schema of ``protocol`` accept it (its constraints are not read);
    ``None`` for anything the Python reference (``_api.check_outgoing_python``) must judge.
    Never raises a refusal."""


def setup_outgoing(terminals: dict[Any, Any], refused: object, accept: object,
                   has_heads: object, /) -> None:
    """Give :func:`check_outgoing` pass 2's tables (``ATOM_TERMINALS``, the automaton's
    ``REFUSED`` and ``ACCEPT``, ``_schema._has_heads``); until then it declines."""
