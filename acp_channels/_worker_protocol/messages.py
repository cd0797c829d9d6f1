"""The cross-worker protocol's messages: each op a worker asks of another, each reply, and the
pushes of a stream (the package docstring lists them with their fields and replies)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from acp_channels._identity import Principal
from acp_channels._inventory import ConnectionInfo
from acp_channels._protocol import StreamKey


class Reply:
    """A result or an error an op is answered with."""

    __slots__ = ()
    name: ClassVar[str]


class ErrorReply(Reply):
    """A refusal: the caller maps the ones it expects to its own exceptions."""

    __slots__ = ()


class Op:
    """An operation one worker asks of another."""

    __slots__ = ()
    name: ClassVar[str]
    #: The replies this op may get; any other raises WorkerFailed on the caller's side.
    replies: ClassVar[tuple[type[Reply], ...]]


OPS: dict[str, type[Op]] = {}
REPLIES: dict[str, type[Reply]] = {}
M = TypeVar("M", bound=type[Op] | type[Reply])


def message(name: str) -> Callable[[M], M]:
    """Register a frozen dataclass as the op or reply of this wire name."""

    def register(cls: M) -> M:
        cls.name = name
        table: dict[str, Any] = OPS if issubclass(cls, Op) else REPLIES
        assert name not in table, name
        table[name] = cls
        return cls

    return register


# replies: results


@message("submitted")
@dataclass(frozen=True, slots=True)
class Submitted(Reply):
    pass


@message("socket-submitted")
@dataclass(frozen=True, slots=True)
class SocketSubmitted(Reply):
    #: False: the lease no longer holds the connection's socket; the message was dropped.
    counted: bool


@message("replied")
@dataclass(frozen=True, slots=True)
class Replied(Reply):
    pass


@message("leased")
@dataclass(frozen=True, slots=True)
class Leased(Reply):
    #: Names the stream in its SSE event ids.
    tag: str


@message("socket-leased")
@dataclass(frozen=True, slots=True)
class SocketLeased(Reply):
    #: Client messages the host had received on the connection's sockets.
    received: int


@message("ended")
@dataclass(frozen=True, slots=True)
class Ended(Reply):
    """The stream ended: None (the connection closed and its output was all taken), "taken"
    (another reader took it over), "lost" (the host no longer knows the lease)."""

    reason: str | None = None


@message("kept")
@dataclass(frozen=True, slots=True)
class Kept(Reply):
    pass


@message("terminated")
@dataclass(frozen=True, slots=True)
class Terminated(Reply):
    pass


@message("alive")
@dataclass(frozen=True, slots=True)
class Alive(Reply):
    alive: bool


@message("connections")
@dataclass(frozen=True, slots=True)
class Connections(Reply):
    items: tuple[ConnectionInfo, ...]


@message("connection-ended")
@dataclass(frozen=True, slots=True)
class ConnectionEnded(Reply):
    pass


@message("opened")
@dataclass(frozen=True, slots=True)
class Opened(Reply):
    #: HTTP: the agent's reply to initialize, and whether it accepted (a JSON-RPC result). A
    #: WebSocket connection: "" and True (the client's initialize travels on the socket).
    body: str
    accepted: bool


# replies: errors


@message("unknown")
@dataclass(frozen=True, slots=True)
class UnknownConnection(ErrorReply):
    """No such connection on that worker, or another principal's (404 either way)."""


@message("session")
@dataclass(frozen=True, slots=True)
class SessionRefused(ErrorReply):
    text: str


@message("pending")
@dataclass(frozen=True, slots=True)
class TooManyPending(ErrorReply):
    limit: int
    unit: str  # "requests" (MAX_PENDING_REQUESTS) or "bytes" (what those requests hold)


@message("busy")
@dataclass(frozen=True, slots=True)
class Busy(ErrorReply):
    """The stream has a reader (or, for a socket lease: not a WebSocket connection)."""


@message("streams")
@dataclass(frozen=True, slots=True)
class StreamsFull(ErrorReply):
    limit: int


@message("replay")
@dataclass(frozen=True, slots=True)
class ReplayRefused(ErrorReply):
    reason: str
    event: str


@message("closed")
@dataclass(frozen=True, slots=True)
class Closed(ErrorReply):
    """The connection (its agent) has ended."""


@message("open-refused")
@dataclass(frozen=True, slots=True)
class OpenRefused(ErrorReply):
    """The runner takes no new connection: "draining", "connections", "stdio", "budget" (its
    caps, ServerFull's reasons) or "quota" (the principal holds `limit` connections there)."""

    reason: str
    limit: int = 0


@message("agent-failed")
@dataclass(frozen=True, slots=True)
class AgentFailed(ErrorReply):
    """The agent could not be started (logged on the runner)."""


@message("internal")
@dataclass(frozen=True, slots=True)
class Internal(ErrorReply):
    """The handler raised (logged on the callee's worker)."""


@message("unknown-op")
@dataclass(frozen=True, slots=True)
class UnknownOp(ErrorReply):
    op: str


@message("malformed")
@dataclass(frozen=True, slots=True)
class Malformed(ErrorReply):
    detail: str


# ops


@message("submit")
@dataclass(frozen=True, slots=True)
class Submit(Op):
    connection: str
    principal: Principal
    text: str
    #: (request id key, stream) for every request with an id, in frame order.
    routes: tuple[tuple[str, StreamKey], ...]
    sessions: tuple[str, ...]
    header: str | None
    replies = (Submitted, UnknownConnection, SessionRefused, TooManyPending, Closed)


@message("socket-submit")
@dataclass(frozen=True, slots=True)
class SubmitOnSocket(Op):
    connection: str
    principal: Principal
    #: A client message as received on the socket.
    text: str
    #: The lease id of the socket reattached on the caller's worker.
    socket: str
    replies = (SocketSubmitted, UnknownConnection, Closed)


@message("reply")
@dataclass(frozen=True, slots=True)
class ReplyFromTransport(Op):
    """A reply the transport itself gives on the connection stream (a batch over the limit)."""

    connection: str
    principal: Principal
    text: str
    replies = (Replied, UnknownConnection, Closed)


@message("open")
@dataclass(frozen=True, slots=True)
class Open(Op):
    """An edge places a new connection on a runner (AGENT_HOSTS = "runners"), or an attachment
    on the process hosting the connection it attaches to (any worker or runner)."""

    #: The id the edge chose for it: it names the runner.
    connection: str
    principal: Principal
    transport: str
    remote_address: str | None
    #: HTTP: the initial frame and the id of its initialize request (as JSON); the runner answers
    #: with the agent's reply. WebSocket: None; the runner starts the connection's relay.
    text: str | None
    init_id: str | None
    #: An attachment: JSON of {"connection", "session", "role"} (acp_channels._host.attachments).
    attach: str | None = None
    replies = (Opened, OpenRefused, AgentFailed, Closed, UnknownConnection)


@message("lease")
@dataclass(frozen=True, slots=True)
class Lease(Op):
    connection: str
    principal: Principal
    lease: str
    #: The worker of the reader (probed when a new reader finds the stream held).
    reader: str
    stream: StreamKey
    #: Last-Event-ID, when the reader resumes.
    resume: str | None
    replies = (Leased, UnknownConnection, Busy, StreamsFull, ReplayRefused, Closed)


@message("lease-socket")
@dataclass(frozen=True, slots=True)
class LeaseSocket(Op):
    connection: str
    principal: Principal
    lease: str
    reader: str
    #: The last agent message the client received (a count).
    resume: int
    replies = (SocketLeased, UnknownConnection, Busy, ReplayRefused, Closed)


@message("ack")
@dataclass(frozen=True, slots=True)
class Acknowledge(Op):
    """The reader wrote the pushed batches up to `seq` (no reply: acknowledgements are
    coalesced and sent unasked)."""

    lease: str
    seq: int
    replies = ()


@message("keep-alive")
@dataclass(frozen=True, slots=True)
class KeepAlive(Op):
    """An idle reader's periodic call: it still reads (the host keeps its lease), and the
    host's worker is alive (the call is answered, or its heartbeat says otherwise)."""

    lease: str
    #: What the reader wrote so far (an acknowledgement too).
    seq: int
    replies = (Kept, Ended)


@message("release")
@dataclass(frozen=True, slots=True)
class Release(Op):
    lease: str
    ack: int
    #: An end reason for the connection, if the lease still holds its socket.
    close: str | None = None
    replies = ()


@message("terminate")
@dataclass(frozen=True, slots=True)
class Terminate(Op):
    connection: str
    principal: Principal
    replies = (Terminated, UnknownConnection)


@message("probe")
@dataclass(frozen=True, slots=True)
class Probe(Op):
    lease: str
    replies = (Alive,)


@message("connections")
@dataclass(frozen=True, slots=True)
class ListConnections(Op):
    """Every connection the worker hosts, or only `owner`'s (the session directory)."""

    replies = (Connections,)
    owner: Principal | None = None


@message("end")
@dataclass(frozen=True, slots=True)
class EndConnection(Op):
    """Administrative: no principal check (a management command ends any connection)."""

    connection_id: str
    replies = (ConnectionEnded, UnknownConnection)


# stream pushes: a host's batches for a remote reader, unasked (no id, no reply)


@dataclass(frozen=True, slots=True)
class Pushed:
    name: ClassVar[str] = "push"
    lease: str
    seq: int
    first: int
    items: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PushEnded:
    """The reader's stream ended: None (the connection closed and its output was all taken),
    "taken" (another reader took it over), "expired" (the connection's credential expired: the
    host sent its readers away, the connection lives)."""

    name: ClassVar[str] = "push-end"
    lease: str
    reason: str | None
