"""CBCL: a protocol engine for S-expression messages between software agents.

The public API is this module; everything in ``cbcl._*`` is private.
"""

from ._api import canonical, parse
from ._codec import Decoder, Encoder, decode, encode
from ._conversation import Conversation, ConversationTracker, Machine, Step, compile_machine
from ._descriptor import ProtocolDescriptor, read_descriptor
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
from ._evaluator import evaluate
from ._framing import FrameReader, frame
from ._json import from_json, message_to_json, to_json
from ._limits import Limits
from ._message import VERSION, Intent, Message, Signature
from ._protocol import Protocol, Registry
from ._reader import read, read_all
from ._schema import Schema, check_schema, compile_schema
from ._session import (
    NEED_DATA,
    Accepted,
    ConnectionClosed,
    Established,
    Finished,
    LocalProtocolError,
    NotUnderstood,
    Offer,
    ProtocolMessage,
    Query,
    Rejected,
    RemoteProtocolError,
    Session,
    Supported,
    Unsupported,
)
from ._transport import Connection, ConnectionLimits, ConnectionLost, connect, serve
from ._trust import (
    DescriptorSignature,
    Rule,
    SignedDescriptor,
    TrustPolicy,
    TrustStore,
    VerifiedDescriptor,
    load_private_key,
    load_public_key,
    read_signed_descriptor_unverified,
    sign_descriptor,
    sign_message,
)
from ._values import URI, Keyword, Symbol, Value

__version__ = "0.1.0"

__all__ = [
    "NEED_DATA",
    "URI",
    "VERSION",
    "Accepted",
    "BodyError",
    "CBCLError",
    "Connection",
    "ConnectionClosed",
    "ConnectionLimits",
    "ConnectionLost",
    "Conversation",
    "ConversationError",
    "ConversationTracker",
    "Decoder",
    "DescriptorError",
    "DescriptorSignature",
    "Encoder",
    "EnvelopeError",
    "Established",
    "EvaluationError",
    "Finished",
    "FrameReader",
    "GrammarError",
    "Intent",
    "Keyword",
    "LimitError",
    "Limits",
    "LocalProtocolError",
    "Machine",
    "MalformedError",
    "Message",
    "NotUnderstood",
    "Offer",
    "Position",
    "Protocol",
    "ProtocolDescriptor",
    "ProtocolError",
    "ProtocolMessage",
    "Query",
    "Registry",
    "Rejected",
    "RemoteProtocolError",
    "Rule",
    "Schema",
    "SchemaError",
    "Session",
    "Signature",
    "SignedDescriptor",
    "Step",
    "Supported",
    "Symbol",
    "TrustError",
    "TrustPolicy",
    "TrustStore",
    "UnknownProtocolError",
    "Unsupported",
    "Value",
    "VerifiedDescriptor",
    "ViolationError",
    "__version__",
    "canonical",
    "check_schema",
    "compile_machine",
    "compile_schema",
    "connect",
    "decode",
    "encode",
    "evaluate",
    "frame",
    "from_json",
    "load_private_key",
    "load_public_key",
    "message_to_json",
    "parse",
    "read",
    "read_all",
    "read_descriptor",
    "read_signed_descriptor_unverified",
    "serve",
    "sign_descriptor",
    "sign_message",
    "to_json",
]
