"""CBCL: a protocol engine for S-expression messages between software agents.

This module holds what most programs need (``__all__``): reading, parsing, validating and
writing messages, the binary form's one-shot calls, the registry, building bodies and
descriptors, the agent and the session, and the errors. The rest is in public
submodules, by layer: :mod:`cbcl.session` (the sans-io session and its events),
:mod:`cbcl.net` (the agent, connections, servers and their limits), :mod:`cbcl.trust`,
:mod:`cbcl.binary`, :mod:`cbcl.conversation` (machines, schemas, the evaluator),
:mod:`cbcl.descriptor`, :mod:`cbcl.json_mapping` and :mod:`cbcl.llm` (exports for
constrained decoding, extraction, prompts; imported when first used). Their names stay
importable from here too, for code written before they moved. Everything in ``cbcl._*`` is
private.
"""

from typing import Any as _Any

from ._agent import (
    Agent,
    AgentConversation as AgentConversation,
    Context as Context,
    ConversationClosed,
    LearnedLibrary as LearnedLibrary,
    Link as Link,
    NegotiationFailed,
    load_handler as load_handler,
)
from ._api import (
    canonical,
    parse,
    validate,
)
from ._authoring import (
    build_descriptor,
    render_descriptor as render_descriptor,
)
from ._codec import (
    Decoder,
    Encoder,
    decode,
    encode,
)
from ._conversation import (
    Conversation as Conversation,
    ConversationTracker as ConversationTracker,
    Machine as Machine,
    Step as Step,
    compile_machine as compile_machine,
)
from ._descriptor import (
    ProtocolDescriptor as ProtocolDescriptor,
    read_descriptor as read_descriptor,
)
from ._errors import (
    BodyError,
    CBCLError,
    ConversationError,
    DescriptorError,
    EnvelopeError,
    EvaluationError,
    GrammarError,
    LimitError,
    MalformedError,
    Position,
    ProtocolError,
    SchemaError,
    TrustError,
    UnknownProtocolError,
    ViolationError,
)
from ._evaluator import (
    evaluate as evaluate,
)
from ._fields import (
    Fields,
    FieldsError,
    FieldValue as FieldValue,
    as_value,
    body,
    keys,
)
from ._framing import (
    FrameReader as FrameReader,
    frame as frame,
)
from ._json import (
    from_json as from_json,
    message_to_json as message_to_json,
    to_json as to_json,
)
from ._limits import (
    Limits,
)
from ._message import (
    VERSION,
    Intent,
    Message,
    Signature as Signature,
)
from ._protocol import Protocol as Protocol
from ._reader import (
    read,
    read_all,
)
from ._registry import (
    CompileGate as CompileGate,
    PreparedDescriptor as PreparedDescriptor,
    Registry,
)
from ._schema import (
    Schema as Schema,
    check_schema as check_schema,
    compile_schema as compile_schema,
)
from ._session import (
    NEED_DATA as NEED_DATA,
    NEED_WORK as NEED_WORK,
    Accepted as Accepted,
    ConnectionClosed as ConnectionClosed,
    Established as Established,
    Finished as Finished,
    LocalProtocolError,
    NotUnderstood as NotUnderstood,
    Offer as Offer,
    ProtocolMessage as ProtocolMessage,
    Query as Query,
    Rejected as Rejected,
    RemoteProtocolError,
    Session,
    Supported as Supported,
    Unsupported as Unsupported,
    Work as Work,
)
from ._transport import (
    Connection as Connection,
    ConnectionLimits as ConnectionLimits,
    ConnectionLost,
    Server as Server,
    ServerLimits as ServerLimits,
    WorkPool as WorkPool,
    connect as connect,
    serve as serve,
)
from ._trust import (
    DescriptorSignature as DescriptorSignature,
    Rule as Rule,
    SignedDescriptor as SignedDescriptor,
    TrustPolicy as TrustPolicy,
    TrustStore,
    VerifiedDescriptor as VerifiedDescriptor,
    load_private_key,
    load_public_key as load_public_key,
    read_signed_descriptor_unverified as read_signed_descriptor_unverified,
    sign_descriptor,
    sign_message as sign_message,
)
from ._values import (
    URI,
    Keyword,
    Symbol,
    Value,
)

__version__ = "0.1.0"

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
    "ConversationClosed",
    "ConversationError",
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
    "LimitError",
    "Limits",
    "LocalProtocolError",
    "MalformedError",
    "Message",
    "NegotiationFailed",
    "Position",
    "ProtocolError",
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

# The layers, importable as cbcl.session, cbcl.net, … (names above stay here too).
from . import (
    binary as binary,
    conversation as conversation,
    descriptor as descriptor,
    json_mapping as json_mapping,
    net as net,
    session as session,
    trust as trust,
)


def __getattr__(name: str) -> _Any:
    """``cbcl.llm``, ``cbcl.interop`` and ``cbcl.extract``, imported when first used: the
    grammar exporters and the FIPA reader take about as long to import as the rest of the
    package does."""
    if name in ("llm", "interop"):
        import importlib

        return importlib.import_module(f"cbcl.{name}")  # (sets the attribute: called once)
    if name == "extract":
        from ._extract import extract

        return extract
    raise AttributeError(f"module 'cbcl' has no attribute {name!r}")
