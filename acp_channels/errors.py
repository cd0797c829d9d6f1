"""The server's errors: one tree, and the one place that says how each is answered.

Every error a client can cause or meet derives from `AcpError` and knows its three answers:
`status` (the HTTP status, with `retry_after` seconds where trying again later helps),
`close_code` (the WebSocket close code: 1013 "try again later" for capacity, 1011 for our
faults, 4000 + the HTTP status for a refusal), and `rpc_code` with `message` (the JSON-RPC error,
`rpc_error(id)`). `text` is the plain-text body and the close reason; it never carries a
credential. The views, the consumer and the cross-worker code answer from these attributes.
Refusals are the client's doing and logged at INFO; the `ServerFault` branch is ours (ERROR).

Pure Python: the protocol rules, the host and the edges all import it; it imports nothing of ours.
Public (docs/api.md): the names of `__all__`, for authenticators and agent adapters to raise and
for code around the server to catch; the other classes are internal.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any, ClassVar, Final, Literal

__all__ = ["AcpError", "AgentClosed", "Refused", "ServerFault", "Unavailable"]

#: WebSocket close codes (RFC 6455 §7.4.1, and the private range 4000-4999 for HTTP statuses).
TRY_AGAIN_LATER: Final = 1013
INTERNAL_ERROR_CLOSE: Final = 1011
REFUSAL_CLOSE_BASE: Final = 4000
#: JSON-RPC codes of the transport's own refusals (implementation-defined server errors).
SERVER_BUSY_CODE: Final = -32000
INTERNAL_ERROR_CODE: Final = -32603
INVALID_PARAMS_CODE: Final = -32602


class AcpError(Exception):
    """An error the server answers a client with (see the module docstring)."""

    status: ClassVar[int] = 500
    retry_after: int | None = None
    rpc_code: ClassVar[int] = INTERNAL_ERROR_CODE
    #: The text a client reads, where it is fixed (the exception's own message is then for the log).
    public_text: ClassVar[str | None] = None

    @property
    def close_code(self) -> int:
        if self.status >= 500:
            return TRY_AGAIN_LATER if self.retry_after is not None else INTERNAL_ERROR_CLOSE
        return REFUSAL_CLOSE_BASE + self.status

    @property
    def text(self) -> str:
        """The plain-text body, and the close reason: what the client reads."""
        if self.public_text is not None:
            return self.public_text
        return str(self) or HTTPStatus(self.status).phrase

    @property
    def data(self) -> Any:
        """The JSON-RPC error's `data`, if it has one."""
        return None

    def rpc_error(self, request_id: Any) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.rpc_code, "message": self.text}
        if self.data is not None:
            error["data"] = self.data
        return {"jsonrpc": "2.0", "id": request_id, "error": error}


# -- refusals: the client's doing ---------------------------------------------------------------


class HostUnreachable(AcpError):
    """No such connection for this caller: an unknown id, another principal's connection, or a
    connection whose worker died (404)."""

    status = 404
    public_text = ""  # a stolen or made-up id learns nothing


class StreamBusy(AcpError):
    """The stream already has a reader (409), or the connection has no such stream."""

    status = 409

    def __init__(self, text: str = "outbound stream already has a subscriber") -> None:
        super().__init__(text)


class ReplayUnavailable(AcpError):
    """A reader asked to resume after an event the stream cannot replay from (409): `gone`
    (older than the replay window) or `foreign` (another stream's, or never sent)."""

    status = 409

    def __init__(self, reason: Literal["gone", "foreign"], event_id: str) -> None:
        self.reason = reason
        self.event_id = event_id
        if reason == "gone":
            text = f"Last-Event-ID {event_id} is older than the replay window of this stream; events were lost"
        else:
            text = f"Last-Event-ID {event_id} does not belong to this stream"
        super().__init__(text)


class SessionHeaderError(AcpError, ValueError):
    """A POST's session header does not fit one of its messages (§4.3 of docs/wire-contract.md): 400."""

    status = 400
    rpc_code = INVALID_PARAMS_CODE


class TooManyStreams(AcpError):
    """A reader asked for a session stream beyond MAX_SESSION_STREAMS (429)."""

    status = 429
    retry_after = 1
    rpc_code = SERVER_BUSY_CODE

    def __init__(self, limit: int) -> None:
        super().__init__(f"too many session streams on this connection (at most {limit}); close one and try again")
        self.limit = limit


class TooManyAttachments(AcpError):
    """A session already has MAX_ATTACHMENTS_PER_SESSION other clients attached (429)."""

    status = 429
    retry_after = 10
    rpc_code = SERVER_BUSY_CODE

    def __init__(self, limit: int) -> None:
        super().__init__(f"too many clients attached to this session (at most {limit})")
        self.limit = limit


class NoSuchSession(AcpError):
    """An attach names a session that is not live, or not the caller's to attach to: the same
    answer for both (404), as for connection ids."""

    status = 404
    rpc_code = INVALID_PARAMS_CODE
    public_text = "no such session"


PendingUnit = Literal["requests", "bytes"]


class TooManyRequests(AcpError):
    """A POST would put the connection over MAX_PENDING_REQUESTS (429), or the bytes of the
    requests waiting for the agent over MAX_BODY_BYTES (per connection) or
    MAX_WORKER_BUFFERED_BYTES (summed over the worker): `unit` says which. Nothing was forwarded."""

    status = 429
    retry_after = 1
    rpc_code = SERVER_BUSY_CODE

    def __init__(self, limit: int, unit: PendingUnit = "requests") -> None:
        if unit == "bytes":
            text = (
                f"the requests in flight on this connection (or this worker) hold too many bytes (at most {limit}); "
                "wait for replies"
            )
        else:
            text = f"too many requests in flight on this connection (at most {limit}); wait for replies"
        super().__init__(text)
        self.limit = limit
        self.unit = unit

    @property
    def rpc_message(self) -> str:
        """The shorter message of the JSON-RPC error a refused WebSocket request gets."""
        return "the requests in flight hold too many bytes" if self.unit == "bytes" else "too many requests in flight"

    @property
    def data(self) -> Any:
        return {"limit": self.limit, "unit": "bytes"} if self.unit == "bytes" else {"limit": self.limit}

    def rpc_error(self, request_id: Any) -> dict[str, Any]:
        return {
            "jsonrpc": "2.0",
            "id": request_id,
            "error": {"code": self.rpc_code, "message": self.rpc_message, "data": self.data},
        }


#: What MAX_DETACHED_PER_PRINCIPAL counts (QuotaExceeded.what).
DETACHED_QUOTA: Final = "connections nobody is attached to"


class QuotaExceeded(AcpError):
    """The principal already holds MAX_CONNECTIONS_PER_PRINCIPAL connections on this worker (429)."""

    status = 429
    retry_after = 10
    rpc_code = SERVER_BUSY_CODE

    def __init__(self, limit: int, what: str = "ACP connections") -> None:
        super().__init__(f"too many {what} for you on this server (at most {limit}); close one")
        self.limit = limit
        self.what = what

    @property
    def close_code(self) -> int:
        return TRY_AGAIN_LATER


#: The challenge a 401 carries when the authenticator names none.
DEFAULT_CHALLENGE: Final = 'Bearer realm="acp"'
#: The challenge of a 401 where the site signs users in on its pages and a session cookie is the
#: credential (`django_user`): no token would do, and a client can say so (log in on the site).
SESSION_CHALLENGE: Final = 'Cookie realm="acp"'
AUTHENTICATION_REQUIRED: Final = "authentication required"
INVALID_TOKEN: Final = "invalid or expired token"
PERMISSION_REQUIRED: Final = "not allowed to use this agent"


class Refused(AcpError):
    """Authentication refused: 401 (no credentials, or bad ones; `challenge` goes in
    WWW-Authenticate) or 403 (known, not allowed). `reason` is the plain-text body: never a
    token."""

    def __init__(self, status: int, reason: str, challenge: str | None = None) -> None:
        if status not in (401, 403):
            raise ValueError("a refusal is 401 or 403")
        super().__init__(status, reason)
        self.status = status  # type: ignore[misc]  # per refusal, where the class has a default
        self.reason = reason
        self.challenge = challenge if challenge is not None or status == 403 else DEFAULT_CHALLENGE

    @classmethod
    def unauthenticated(cls, reason: str = AUTHENTICATION_REQUIRED) -> Refused:
        """No credentials: 401 with the bare challenge."""
        return cls(401, reason, DEFAULT_CHALLENGE)

    @classmethod
    def invalid_token(cls, reason: str = INVALID_TOKEN) -> Refused:
        """A token was given and is not valid: 401 with `error="invalid_token"`."""
        return cls(401, reason, f'{DEFAULT_CHALLENGE}, error="invalid_token"')

    @classmethod
    def forbidden(cls, reason: str = PERMISSION_REQUIRED) -> Refused:
        """Known, but not allowed: 403."""
        return cls(403, reason)

    @property
    def text(self) -> str:
        return self.reason

    def __str__(self) -> str:
        return f"{self.status} {self.reason}"


# -- the server cannot take it now: try again (503) ----------------------------------------------


class Unavailable(AcpError):
    """The server cannot take this now; trying again later (Retry-After) is safe: 503."""

    status = 503
    retry_after: int | None = 1
    rpc_code = SERVER_BUSY_CODE


class ServerFull(Unavailable):
    """This worker takes no new connection now: it hosts MAX_CONNECTIONS (or MAX_STDIO_AGENTS
    stdio agents), or it holds MAX_WORKER_BUFFERED_BYTES of undelivered output; with runners,
    no live runner has room."""

    def __init__(self, reason: Literal["connections", "stdio", "budget", "runners"]) -> None:
        if reason == "connections":
            text, self.retry_after = "too many ACP connections on this server", 10
        elif reason == "stdio":
            text, self.retry_after = "too many agent processes on this server", 10
        elif reason == "runners":
            text, self.retry_after = "no agent runner has room for a new connection; try again", 5
        else:
            text, self.retry_after = "this server is holding too much undelivered output; try again", 2
        super().__init__(text)
        self.reason = reason


class ShuttingDown(Unavailable):
    """This worker is draining: it opens no new connection (another worker will)."""

    def __init__(self) -> None:
        super().__init__("this server is shutting down; connect again")


class LayerUnavailable(Unavailable):
    """The channel layer itself failed (Redis down): nothing was done."""

    public_text = "the channel layer is unavailable; try again"


class AgentBusy(Unavailable):
    """The host's worker received the call, but the agent did not take the frame in time. The
    host has it, so sending it again is not safe: no Retry-After."""

    retry_after: int | None = None
    public_text = "the agent did not take the message in time; try again"


class WorkerBusy(AgentBusy):
    """The host's worker is alive (its heartbeat is there) but did not take the call in time;
    the call expired unserved there, so trying again is safe."""

    retry_after: int | None = 1
    public_text = "the connection's worker is overloaded and did not take the request; try again"


# -- our faults: 500, logged at ERROR where they happen -------------------------------------------


class ServerFault(AcpError):
    """Something failed on our side: 500, WebSocket 1011."""


class AgentEnded(ServerFault):
    """The agent ended before it answered initialize."""


class AgentNotStarted(ServerFault):
    """The agent factory failed for a new connection. Logged, with its cause, where it happened."""

    public_text = "the agent could not be started (see the server log)"


class AgentClosed(ServerFault, ConnectionError):
    """The agent no longer accepts input."""

    public_text = ""


class WorkerFailed(ServerFault):
    """The connection's worker answered an op with something its caller cannot accept: its
    handler failed, it does not know the op, or the message was unreadable."""

    def __init__(self, op: str, detail: str, reply: Any = None) -> None:
        super().__init__(f"the connection's worker failed to handle {op} ({detail})")
        self.op = op
        self.reply = reply  # the cross-worker reply it got (acp_channels._worker_protocol), if any

    @property
    def text(self) -> str:
        return f"the connection's worker failed to handle {self.op}"


EndReason = Literal[
    "delete",
    "idle",
    "socket closed",
    "agent ended",
    "shutdown",
    "initialize failed",
    "send failed",
    "fell behind",
    "revoked",  # its credential was revoked (REVALIDATE_SECONDS; an expired one ends nothing)
]


def answer_kinds() -> list[type[AcpError]]:
    """Every error class of the tree (for the test that walks it)."""
    found: list[type[AcpError]] = []
    pending: list[type[AcpError]] = [AcpError]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return found
