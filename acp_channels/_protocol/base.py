"""Names on the wire (headers, methods, error codes), the message types, the JSON-RPC errors the
transport side produces (§12), and big batches processed in slices (§7).
Section numbers (§N) refer to docs/wire-contract.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator
from typing import Any, Final, Literal, TypeAlias, TypeVar

CONNECTION_HEADER: Final = "acp-connection-id"
SESSION_HEADER: Final = "acp-session-id"
#: A reader resuming a stream names the last event it received (SSE: its id; WebSocket: a count).
LAST_EVENT_ID_HEADER: Final = "last-event-id"
#: On a reattached WebSocket's 101: how many messages the server received from the client.
RECEIVED_HEADER: Final = "acp-received"
#: The same count as the first text message on a reattached WebSocket, for browsers (which cannot
#: read the 101's headers): sent for a reattach in the query form, or one that asks with
#: `?acp_received=message`. Not numbered among the server's messages, never replayed.
RECEIVED_NOTIFICATION: Final = "_acp-channels/received"
RECEIVED_QUERY: Final = "acp_received"
#: The notice that the connection's credential expires soon (params.expiresAt, RFC 3339), on the
#: connection stream or the socket: after the ACP Remote security draft's `auth_expiring`
#: control record (name provisional; docs/authentication.md, expiry).
AUTH_EXPIRING_NOTIFICATION: Final = "_acp-channels/auth_expiring"
RECEIVED_AS_MESSAGE: Final = "message"
#: An initialize POST or a WebSocket upgrade that attaches to a live session instead of starting
#: an agent names it, and the role asked for (docs/shared-sessions.md; provisional). Browsers
#: give both in the upgrade's query instead.
ATTACH_SESSION_HEADER: Final = "acp-attach-session"
ATTACH_ROLE_HEADER: Final = "acp-attach-role"
ATTACH_SESSION_QUERY: Final = "acp_attach_session"
ATTACH_ROLE_QUERY: Final = "acp_attach_role"
ATTACH_CURSOR_HEADER: Final = "acp-attach-cursor"
ATTACH_CURSOR_QUERY: Final = "acp_attach_cursor"

JSONRPC_VERSION: Final = "2.0"
PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INTERNAL_ERROR: Final = -32603
REQUEST_CANCELLED: Final = -32800

CANCEL_REQUEST_METHOD: Final = "$/cancel_request"
SUCCESSOR_METHOD: Final = "_proxy/successor"
INITIALIZE_METHOD: Final = "initialize"

#: Client methods that only make sense for one session (§4.2): they need a session id.
SESSION_SCOPED_METHODS: Final = frozenset(
    {
        "session/prompt",
        "session/cancel",
        "session/close",
        "session/delete",
        "session/fork",
        "session/load",
        "session/resume",
        "session/set_config_option",
        "session/set_mode",
        "session/set_model",
    }
)

_I64_MIN: Final = -(2**63)
_I64_MAX: Final = 2**63 - 1

Message: TypeAlias = dict[str, Any]
MessageKind: TypeAlias = Literal["request", "notification", "response"]

#: Which outbound stream a message goes to: None is the connection stream, a string names a
#: session stream (the empty string is a legal session key, as in the reference).
StreamKey: TypeAlias = str | None
CONNECTION_STREAM: Final[StreamKey] = None


# --------------------------------------------------------------------------------------------
# Big batches: processed in slices, and limited in size

#: Batch entries handled between two yields to the event loop: a slice costs well under a
#: millisecond in each stage (classifying, planning, dispatching, regrouping), so other
#: connections wait about that long, plus the agent's own handling of a slice's requests.
SLICE_ENTRIES: Final = 256

T = TypeVar("T")

#: A computation over a batch, written once as a generator that yields between slices; it is
#: run at once (`run_at_once`) or with a yield to the event loop at each slice (`run_in_slices`).
Steps: TypeAlias = Generator[None, None, T]


def run_at_once(steps: Steps[T]) -> T:
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


async def run_in_slices(steps: Steps[T]) -> T:
    """Run a computation, letting every other ready task run between two of its slices."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        await asyncio.sleep(0)


class BatchTooLarge(ValueError):
    """A client batch with more entries than the limit: refused whole, none of it dispatched.

    The transport answers it itself (`reply`, a -32600 with `id: null`), on the stream where
    the agent's answer to a malformed frame would go; it never reaches the agent.
    """

    def __init__(self, entries: int, limit: int) -> None:
        super().__init__(f"batch of {entries} entries is over the limit of {limit}")
        self.entries = entries
        self.limit = limit

    @property
    def reply(self) -> Message:
        return error_response(None, INVALID_REQUEST, "Invalid Request", str(self))


#: The batch-size limit, asked for only when a frame is a batch (a settings lookup costs about
#: as much as parsing a small message); None: no limit.
BatchLimit: TypeAlias = Callable[[], int | None]


def check_batch_size(entries: int, limit: BatchLimit | None) -> None:
    """Raise BatchTooLarge for a batch of `entries` over the limit."""
    maximum = limit() if limit is not None else None
    if maximum is not None and entries > maximum:
        raise BatchTooLarge(entries, maximum)


# --------------------------------------------------------------------------------------------
# JSON-RPC errors the transport side produces (§12)


def error_response(request_id: Any, code: int, message: str, data: Any = None) -> Message:
    error: Message = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": JSONRPC_VERSION, "id": request_id, "error": error}


#: An agent message may be as large as a client's body (MAX_BODY_BYTES) plus this, for the
#: envelope a reply wraps around what it echoes (§6.7; a stdio agent's output line, the same).

MAX_ECHOED_CHARS: Final = 1024


def parse_error(raw: str) -> Message:
    """The reference's -32700 echoes the whole input in `data.line`; input longer than
    MAX_ECHOED_CHARS is echoed as its beginning and a note of its length, so a huge invalid body
    does not come back whole (over a WebSocket, past the client's message size)."""
    return error_response(None, PARSE_ERROR, "Parse error", {"line": echoed_input(raw)})


def echoed_input(raw: str) -> str:
    if len(raw) <= MAX_ECHOED_CHARS:
        return raw
    return f"{raw[:MAX_ECHOED_CHARS]}... [truncated: the input was {len(raw)} characters]"


def invalid_request() -> Message:
    return error_response(None, INVALID_REQUEST, "Invalid Request")


def is_error_response(message: Message) -> bool:
    return "error" in message and "method" not in message
