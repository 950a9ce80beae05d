"""CBCL: a protocol engine for S-expression messages between software agents.

This module holds what most programs need, and exactly ``__all__``: reading, parsing,
validating and writing messages, the binary form's one-shot calls, the registry, building
bodies and descriptors, the agent and the session, and the errors. The rest is in public
submodules: :mod:`cbcl.session` (the sans-io session and its events), :mod:`cbcl.net` (the
agent, connections, servers and their limits), :mod:`cbcl.trust`, :mod:`cbcl.binary`,
:mod:`cbcl.conversation` (machines, schemas, the evaluator), :mod:`cbcl.descriptor`,
:mod:`cbcl.json_mapping`, :mod:`cbcl.llm` (exports for constrained decoding, extraction,
prompts) and :mod:`cbcl.interop`. Everything in a ``_``-named module is private.

The package is in layers, each importing only those below it (docs/layout.md): ``core``,
``grammar``, ``protocol``, ``binary``, ``session``, ``net``, ``llm``, ``bridges``, then
these public modules and ``cli``. ``import cbcl`` loads neither asyncio nor argparse:
:class:`Agent` and the layers above ``session`` are imported when first named.
"""

import importlib as _importlib
import logging as _logging
import typing as _typing

from .binary._codec import (
    Decoder,
    Encoder,
    decode,
    encode,
)
from .core._errors import (
    BodyError,
    CBCLError,
    ConnectionLost,
    ConversationClosed,
    ConversationError,
    DescriptorError,
    EnvelopeError,
    EvaluationError,
    GrammarError,
    LimitError,
    MalformedError,
    NegotiationFailed,
    Position,
    ProtocolError,
    SchemaError,
    TrustError,
    UnknownProtocolError,
    ViolationError,
)
from .core._limits import (
    Limits,
)
from .core._reader import (
    read,
    read_all,
)
from .core._values import (
    URI,
    Keyword,
    Symbol,
    Value,
)
from .core._version import __version__
from .protocol._api import (
    canonical,
    parse,
    validate,
)
from .protocol._authoring import (
    build_descriptor,
)
from .protocol._constraints import ConstraintError
from .protocol._declaration import (
    descriptor_from_declaration,
)
from .protocol._fields import (
    Fields,
    FieldsError,
    as_value,
    body,
    keys,
)
from .protocol._message import (
    VERSION,
    Intent,
    Message,
)
from .protocol._records import (
    Length,
    Range,
    Record,
    descriptor_from,
)
from .protocol._registry import (
    Registry,
)
from .protocol._trust import (
    TrustStore,
    load_private_key,
    sign_descriptor,
)
from .session._session import (
    LocalProtocolError,
    RemoteProtocolError,
    Session,
)

__all__ = [
    # values and messages
    "URI",
    "VERSION",
    # agents and sessions
    "Agent",
    # errors
    "BodyError",
    "CBCLError",
    "ConnectionLost",
    "ConstraintError",
    "ConversationClosed",
    "ConversationError",
    # typed records (spec/declarations.md §8)
    # the binary form, protocols and descriptors
    "Decoder",
    "DescriptorError",
    "Encoder",
    "EnvelopeError",
    "EvaluationError",
    "Fields",
    "FieldsError",
    "GrammarError",
    "Intent",
    "Keyword",
    "Length",
    "LimitError",
    "Limits",
    "LocalProtocolError",
    "MalformedError",
    "Message",
    "NegotiationFailed",
    "Position",
    "ProtocolError",
    "Range",
    "Record",
    "Registry",
    "RemoteProtocolError",
    "SchemaError",
    "Session",
    "Symbol",
    "TrustError",
    "TrustStore",
    "UnknownProtocolError",
    "Value",
    "ViolationError",
    "__version__",
    "as_value",
    "body",
    "build_descriptor",
    "canonical",
    "decode",
    "descriptor_from",
    "descriptor_from_declaration",
    "encode",
    "extract",
    "keys",
    "load_private_key",
    "parse",
    "read",
    "read_all",
    "sign_descriptor",
    "validate",
]

if _typing.TYPE_CHECKING:
    from .llm import extract
    from .net import Agent

# The public submodules that import nothing above the session layer, as attributes.
from . import (
    binary as binary,
    conversation as conversation,
    descriptor as descriptor,
    json_mapping as json_mapping,
    session as session,
    trust as trust,
)

# The library logs to the "cbcl" loggers ("cbcl.net", "cbcl.cli" …) and configures
# nothing: the program that uses it decides where records go (logging.basicConfig …).
_logging.getLogger("cbcl").addHandler(_logging.NullHandler())

_LAZY_NAMES = {"Agent": "cbcl.net", "extract": "cbcl.llm"}
_LAZY_MODULES = ("net", "llm", "interop")


def __getattr__(name: str) -> _typing.Any:
    """The names and modules that import asyncio or take long to import (:class:`Agent`,
    :func:`extract`, :mod:`cbcl.net`, :mod:`cbcl.llm`, :mod:`cbcl.interop`), imported when
    first asked for; raises ``AttributeError`` for any other name."""
    if name in _LAZY_NAMES:
        value = getattr(_importlib.import_module(_LAZY_NAMES[name]), name)
    elif name in _LAZY_MODULES:
        value = _importlib.import_module(f"cbcl.{name}")
    else:
        raise AttributeError(f"module 'cbcl' has no attribute {name!r}")
    globals()[name] = value
    return value
