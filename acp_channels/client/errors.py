"""The exceptions `HttpClient` raises.

Two families:

* `ClientUsageError` (also a `ValueError`): the caller asked for something the ACP HTTP
  transport does not allow (a first message that is not `initialize`, a session method without
  a session id, a frame that is not a JSON-RPC message or batch). Nothing was sent and the
  transport is still usable.
* `TransportError` (also a `ConnectionError`, so code written for the `acp` SDK's own transports
  keeps working): the transport has ended. The subclass says why. After one of these every
  `send` raises `TransportClosedError` and `receive` ends with the error.
"""

from __future__ import annotations

__all__ = [
    "AcpClientError",
    "ClientUsageError",
    "HttpStatusError",
    "NetworkError",
    "ProtocolViolationError",
    "StreamEndedError",
    "TransportClosedError",
    "TransportError",
    "TransportTimeoutError",
    "WebSocketClosedError",
]


class AcpClientError(Exception):
    """Base class of every error raised by `acp_channels.client`."""


class ClientUsageError(AcpClientError, ValueError):
    """A frame the transport refuses before sending anything; the transport stays open."""


class TransportError(AcpClientError, ConnectionError):
    """The transport has failed and is closed (the server connection was deleted if it existed)."""


class TransportClosedError(TransportError):
    """`send` on a transport that was closed, or that failed earlier (see `__cause__`)."""


class HttpStatusError(TransportError):
    """The server answered a request with a status the contract does not allow."""

    def __init__(self, request: str, status_code: int, body: str = "") -> None:
        self.request = request
        self.status_code = status_code
        self.body = body
        detail = f": {body.strip()}" if body.strip() else ""
        super().__init__(f"{request}: HTTP {status_code}{detail}")


class ProtocolViolationError(TransportError):
    """The server broke the ACP HTTP transport contract (e.g. no `Acp-Connection-Id`)."""


class StreamEndedError(TransportError):
    """An SSE stream ended (cleanly or not); the reference client treats this as fatal."""

    def __init__(self, session_id: str | None, detail: str = "the server ended it") -> None:
        self.session_id = session_id
        name = "connection" if session_id is None else f"session {session_id!r}"
        super().__init__(f"{name} SSE stream ended: {detail}")


class WebSocketClosedError(TransportError):
    """The server closed the WebSocket, or it broke."""

    def __init__(self, code: int | None, reason: str = "") -> None:
        self.code = code
        self.reason = reason
        what = f"code {code}" if code is not None else "no close code"
        super().__init__(f"WebSocket closed by peer ({what}{': ' + reason if reason else ''})")


class TransportTimeoutError(TransportError, TimeoutError):
    """A request got no answer within the client's `timeout`."""


class NetworkError(TransportError):
    """The network failed under a request (connection refused, reset, DNS, TLS…)."""
