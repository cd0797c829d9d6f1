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
    "AuthenticationError",
    "ClientUsageError",
    "HttpStatusError",
    "NetworkError",
    "ProtocolViolationError",
    "ReconnectGaveUpError",
    "ResumeFailedError",
    "ResumeRefusedError",
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


class AuthenticationError(HttpStatusError):
    """The server refused the request's credentials.

    401: no credentials, or ones it does not accept (`www_authenticate` is the server's
    `WWW-Authenticate` challenge, e.g. `Bearer realm="acp", error="invalid_token"`).
    403: it knows who is asking but does not allow it (a missing permission, a foreign Origin),
    and, for a WebSocket, any refusal: a server that must refuse before the upgrade completes
    (daphne) can only answer 403. The message names the status and the server's text, never
    the credentials sent (a token the server echoes is shown as `***`)."""

    REASONS = {401: "Unauthorized", 403: "Forbidden"}

    def __init__(
        self,
        request: str,
        status_code: int,
        body: str = "",
        *,
        www_authenticate: str | None = None,
        credentials_sent: bool = False,
    ) -> None:
        self.www_authenticate = www_authenticate
        self.credentials_sent = credentials_sent
        super().__init__(request, status_code, body)
        reason = self.REASONS.get(status_code, "refused")
        if status_code == 401:
            reason += " (credentials refused)" if credentials_sent else " (no credentials were sent)"
        detail = f": {body.strip()}" if body.strip() else ""
        self.args = (f"{request}: HTTP {status_code} {reason}{detail}",)


def status_error(
    request: str,
    status_code: int,
    body: str = "",
    *,
    www_authenticate: str | None = None,
    credentials_sent: bool = False,
) -> HttpStatusError:
    """The error for an unexpected status: `AuthenticationError` for 401 and 403."""
    if status_code in AuthenticationError.REASONS:
        return AuthenticationError(
            request, status_code, body, www_authenticate=www_authenticate, credentials_sent=credentials_sent
        )
    return HttpStatusError(request, status_code, body)


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


class ResumeFailedError(TransportError):
    """A dropped stream or socket could not be resumed without loss (see the subclasses)."""


class ResumeRefusedError(ResumeFailedError, HttpStatusError):
    """The server refused to resume: 409 (the events after the last one received fell out of
    its replay window, or the id is not this stream's: messages were lost), or 404 (it forgot
    the connection, and the client was not allowed to start a new one, or could not)."""

    def __init__(self, request: str, status_code: int, body: str = "", *, detail: str = "") -> None:
        super().__init__(request, status_code, body)
        reason = body.strip() or ("the connection is gone" if status_code == 404 else "cannot resume")
        self.args = (f"{request}: HTTP {status_code}: {reason}" + (f" ({detail})" if detail else ""),)


class ReconnectGaveUpError(ResumeFailedError):
    """Reconnecting did not succeed within the reconnect policy's bounded time."""

    def __init__(self, what: str, attempts: int, elapsed: float, last_error: TransportError) -> None:
        self.what = what
        self.attempts = attempts
        self.elapsed = elapsed
        self.last_error = last_error
        super().__init__(
            f"gave up reconnecting the {what} after {elapsed:.1f}s and {attempts} attempts; last error: {last_error}"
        )
