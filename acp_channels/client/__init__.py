"""A Python ACP client for the ACP HTTP transport: POST+SSE or one WebSocket.

    import acp
    from acp_channels.client import HttpClient

    conn = acp.connect_to_agent(MyClient(), HttpClient("http://127.0.0.1:8000", token=os.environ["ACP_TOKEN"]))

No Django here: a client needs only httpx, websockets and (for the terminal client) `acp`,
prompt_toolkit and rich.
"""

from __future__ import annotations

from ._base import FrameValue, RawFrame
from ._directory import ConnectionEntry, SessionDirectory, SessionEntry
from ._errors import (
    AcpClientError,
    AuthenticationError,
    ClientUsageError,
    HttpStatusError,
    NetworkError,
    ProtocolViolationError,
    ReconnectGaveUpError,
    ResumeFailedError,
    ResumeRefusedError,
    StreamEndedError,
    TransportClosedError,
    TransportError,
    TransportTimeoutError,
    WebSocketClosedError,
)
from ._http_client import DEFAULT_TIMEOUT, HttpClient, check_token, resolve_endpoint
from ._reconnect import DEFAULT_BACKOFF, Backoff, ReconnectEvent, ReconnectPolicy, StreamDrop
from ._retry import DEFAULT_RETRY_AFTER, RetryAfter, RetryEvent

# What `HttpClient.attachment` is (docs/client.md).
from ._shared_sessions import Attachment, AttachRole
from ._token_source import TokenSource

__all__ = [
    "DEFAULT_BACKOFF",
    "DEFAULT_RETRY_AFTER",
    "DEFAULT_TIMEOUT",
    "AcpClientError",
    "AttachRole",
    "Attachment",
    "AuthenticationError",
    "Backoff",
    "ClientUsageError",
    "ConnectionEntry",
    "FrameValue",
    "HttpClient",
    "HttpStatusError",
    "NetworkError",
    "ProtocolViolationError",
    "RawFrame",
    "ReconnectEvent",
    "ReconnectGaveUpError",
    "ReconnectPolicy",
    "ResumeFailedError",
    "ResumeRefusedError",
    "RetryAfter",
    "RetryEvent",
    "SessionDirectory",
    "SessionEntry",
    "StreamDrop",
    "StreamEndedError",
    "TokenSource",
    "TransportClosedError",
    "TransportError",
    "TransportTimeoutError",
    "WebSocketClosedError",
    "check_token",
    "resolve_endpoint",
]
