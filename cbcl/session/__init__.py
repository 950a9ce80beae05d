"""The sans-io negotiation session and its events (spec/negotiation.md).

``Session.receive_data(bytes)``, then ``next_event(now=…)`` returns an event,
:data:`NEED_DATA` or :data:`NEED_WORK`; ``send(event, now=…)`` returns bytes.
"""

from ._events import (
    NEED_DATA,
    NEED_WORK,
    Accepted,
    ConnectionClosed,
    Established,
    Event,
    Finished,
    NotUnderstood,
    Offer,
    ProtocolMessage,
    Query,
    Rejected,
    Supported,
    Unsupported,
    Work,
)
from ._negotiation import HandshakeState
from ._reasons import NOT_UNDERSTOOD_CODES, LocalProtocolError, RemoteProtocolError
from ._session import Session

__all__ = [
    "NEED_DATA", "NEED_WORK", "NOT_UNDERSTOOD_CODES", "Accepted", "ConnectionClosed",
    "Established", "Event", "Finished", "HandshakeState", "LocalProtocolError",
    "NotUnderstood", "Offer", "ProtocolMessage", "Query", "Rejected", "RemoteProtocolError",
    "Session", "Supported", "Unsupported", "Work",
]
