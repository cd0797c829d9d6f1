"""The cross-worker protocol: every operation a worker asks of another, and every reply.

A connection's host lives in one worker process; a request for it that lands on another worker
becomes an operation sent through the channel layer to the host's worker (`acp_channels._worker`
moves the messages, `acp_channels._gateway` makes and serves the calls). Each operation and each
reply is a frozen dataclass here; `encode_*`/`decode_*` are the only code that turns them into
layer messages and back, and `envelope` the only code that builds a message.

Messages (msgpack-able dicts, as the channel layer wants them):

- `{"type": "acp.op", "id", "reply_to", "receipt", "expires", "op": <name>, "args": {...}}` a
  call; `expires` (a Unix time, or absent) is when the caller stops waiting for the callee to
  take it: a callee that finds it later drops it unserved (`expired`), since the caller has
  answered 503 and its client may send the request again;
- `{"type": "acp.receipt", "id"}` the callee has the call and is working on it: sent only
  when the result is not ready at once (RECEIPT_AFTER), so a caller tells a dead worker (no
  answer, heartbeat gone) from a slow one (receipt, then the result later);
- `{"type": "acp.result", "id", "reply": <name>, "fields": {...}}` the answer;
- `{"type": "acp.push", "lease", "seq", "first", "items"}` / `{"type": "acp.push", "lease",
  "end": true, "reason"}` the batches of a stream a host sends unasked to its reader on
  another worker (`Pushed`, `PushEnded`), at most PUSH_CREDIT_BATCHES / PUSH_CREDIT_BYTES
  ahead of the reader's acknowledgements; whatever is not acknowledged when the lease ends
  goes back to the stream, in order, for the next reader.

An op's fields and a reply's fields travel under their own key (`args`, `fields`), so nothing a
handler returns can overwrite the envelope (`id`, `type`).

Ops (wire name): fields -> replies (the ErrorReply ones are refusals the caller maps):

- `Open` (open): connection, principal, transport, remote_address, text, init_id ->
  Opened(body, accepted); OpenRefused(reason, limit), AgentFailed, Closed
- `Submit` (submit): connection, principal, text, routes, sessions, header -> Submitted;
  UnknownConnection, SessionRefused(text), TooManyPending(limit, unit), Closed
- `SubmitOnSocket` (socket-submit): connection, principal, text, socket (the lease id of a
  socket reattached on the caller's worker) -> SocketSubmitted(counted); UnknownConnection, Closed
- `ReplyFromTransport` (reply): connection, principal, text -> Replied; UnknownConnection, Closed
- `Lease` (lease): connection, principal, lease, reader (its worker), stream, resume (an event
  id) -> Leased(tag); UnknownConnection, Busy, StreamsFull(limit), ReplayRefused(reason, event),
  Closed
- `LeaseSocket` (lease-socket): connection, principal, lease, reader, resume (a count) ->
  SocketLeased(received); UnknownConnection, Busy, ReplayRefused(reason, event), Closed
- `Acknowledge` (ack): lease, seq (the pushed batches written so far) -> no reply
- `KeepAlive` (keep-alive): lease, seq -> Kept | Ended(reason)
- `Release` (release): lease, ack, close (an end reason for the connection) -> no reply
- `Terminate` (terminate): connection, principal -> Terminated; UnknownConnection
- `Probe` (probe): lease -> Alive(alive)
- `ListConnections` (connections) -> Connections(items: ConnectionInfo...)
- `EndConnection` (end): connection_id (administrative: any principal) -> ConnectionEnded;
  UnknownConnection

Every op may also be answered `Internal` (its handler raised), `UnknownOp(op)` (the callee does
not know it: another version) or `Malformed(detail)` (the callee could not read it); a caller
never expects those: `WorkerFailed` is raised, and the edges answer 500.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Final, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from acp_channels._identity import Principal
from acp_channels._inventory import ConnectionInfo
from acp_channels._protocol import StreamKey
from acp_channels.errors import WorkerFailed

#: A callee answers with a receipt first when its result is not ready within this long.
RECEIPT_AFTER: Final = 0.02
#: Batches a host pushes to a remote reader ahead of its acknowledgements...
PUSH_CREDIT_BATCHES: Final = 8
#: ...and bytes (this much of a stream's output may be outside its connection's budget).
PUSH_CREDIT_BYTES: Final = 1024 * 1024
#: A reader acknowledges what it wrote at half its credit, or after this long.
ACK_DELAY: Final = 0.05
#: A host that pushed a batch of at least this many items (a stream is flowing) waits
#: COALESCE_SECONDS before taking the next: each push costs about as much as a hundred items,
#: and an agent that streams fills the mailbox meanwhile. Single replies never wait.
COALESCE_AFTER_ITEMS: Final = 16
COALESCE_SECONDS: Final = 0.002

Kind = Literal["acp.op", "acp.receipt", "acp.result", "acp.push"]


class MalformedMessage(ValueError):
    """A message (or a field of one) that does not follow this protocol."""


# -- messages ---------------------------------------------------------------------------------


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
    """An edge places a new connection on a runner (AGENT_HOSTS = "runners")."""

    #: The id the edge chose for it: it names the runner.
    connection: str
    principal: Principal
    transport: str
    remote_address: str | None
    #: HTTP: the initial frame and the id of its initialize request (as JSON); the runner answers
    #: with the agent's reply. WebSocket: None; the runner starts the connection's relay.
    text: str | None
    init_id: str | None
    replies = (Opened, OpenRefused, AgentFailed, Closed)


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
    replies = (Connections,)


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
    name: ClassVar[str] = "push-end"
    lease: str
    reason: str | None


# -- fields ----------------------------------------------------------------------------------

Encoder = Callable[[Any], Any]
Decoder = Callable[[Any], Any]


def _scalar(kind: type) -> tuple[Encoder, Decoder]:
    def decode(value: Any) -> Any:
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise MalformedMessage(f"expected {kind.__name__}, got {type(value).__name__}")
        return value

    return (lambda value: value), decode


def _wire_value(kind: Any) -> tuple[Encoder, Decoder]:
    def decode(value: Any) -> Any:
        try:
            return kind.from_wire(value)
        except (KeyError, TypeError, ValueError) as error:
            raise MalformedMessage(f"not a {kind.__name__}: {error}") from None

    return (lambda value: value.to_wire()), decode


def _codec(hint: Any) -> tuple[Encoder, Decoder]:
    origin = get_origin(hint)
    if hint in (str, int, float, bool):
        return _scalar(hint)
    if hint in (Principal, ConnectionInfo):
        return _wire_value(hint)
    if origin in (Union, types.UnionType):
        options = [arg for arg in get_args(hint) if arg is not type(None)]
        assert len(options) == 1, hint
        encode, decode = _codec(options[0])
        return (lambda value: None if value is None else encode(value)), (
            lambda value: None if value is None else decode(value)
        )
    if origin is tuple:
        args = get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            item_encode, item_decode = _codec(args[0])

            def decode_many(value: Any) -> tuple[Any, ...]:
                if not isinstance(value, list | tuple):
                    raise MalformedMessage(f"expected a list, got {type(value).__name__}")
                return tuple(map(item_decode, value))

            if args[0] is str:  # the common, big case (a batch's items): no per-item call
                return list, lambda value: _strings(decode_many, value)
            return (lambda value: [item_encode(item) for item in value]), decode_many
        codecs = [_codec(arg) for arg in args]

        def decode_fixed(value: Any) -> tuple[Any, ...]:
            if not isinstance(value, list | tuple) or len(value) != len(codecs):
                raise MalformedMessage(f"expected {len(codecs)} values")
            return tuple(decode(item) for (_, decode), item in zip(codecs, value, strict=True))

        return (lambda value: [encode(item) for (encode, _), item in zip(codecs, value, strict=True)]), decode_fixed
    raise TypeError(f"no wire form for {hint!r}")


def _strings(decode_many: Callable[[Any], tuple[Any, ...]], value: Any) -> tuple[str, ...]:
    if isinstance(value, list | tuple) and all(type(item) is str for item in value):
        return tuple(value)
    return decode_many(value)


FieldPlan = tuple[tuple[str, Encoder, Decoder, bool], ...]
_plans: dict[type, FieldPlan] = {}


def _plan(cls: type) -> FieldPlan:
    """(field, encoder, decoder, required) for each field of a message class."""
    plan = _plans.get(cls)
    if plan is None:
        plan = _plans[cls] = _make_plan(cls)
    return plan


def _make_plan(cls: type) -> FieldPlan:
    hints = get_type_hints(cls)
    plan = []
    for field in fields(cls):
        encode, decode = _codec(hints[field.name])
        required = field.default is field.default_factory  # both MISSING: no default
        plan.append((field.name, encode, decode, required))
    return tuple(plan)


def encode_fields(value: Op | Reply | Pushed) -> dict[str, Any]:
    return {name: encode(getattr(value, name)) for name, encode, _, _ in _plan(type(value))}


def decode_fields(cls: type[typing.Any], values: Any) -> Any:
    """An instance of `cls` from its fields; MalformedMessage when they do not fit."""
    if not isinstance(values, dict):
        raise MalformedMessage(f"{cls.name}: fields are not a mapping")
    known = set()
    arguments = {}
    for name, _, decode, required in _plan(cls):
        known.add(name)
        if name in values:
            try:
                arguments[name] = decode(values[name])
            except MalformedMessage as error:
                raise MalformedMessage(f"{cls.name}.{name}: {error}") from None
        elif required:
            raise MalformedMessage(f"{cls.name}: {name} is missing")
    return cls(**arguments)


def describe(reply: Reply) -> str:
    shown = ", ".join(f"{name}={getattr(reply, name)!r}" for name, *_ in _plan(type(reply)))
    return f"{reply.name}({shown})" if shown else reply.name


# -- the envelope -----------------------------------------------------------------------------


def envelope(kind: Kind, request_id: str | None = None, **parts: Any) -> dict[str, Any]:
    """Every message of this protocol is built here."""
    message: dict[str, Any] = {"type": kind}
    if request_id is not None:
        message["id"] = request_id
    message.update(parts)
    return message


def encode_op(
    op: Op, request_id: str, reply_to: str, *, receipt: bool = False, expires: float | None = None
) -> dict[str, Any]:
    """A call; with `expires` (a Unix time), one the callee drops unserved once that time passed."""
    parts: dict[str, Any] = {"reply_to": reply_to, "receipt": receipt, "op": op.name, "args": encode_fields(op)}
    if expires is not None:
        parts["expires"] = expires
    return envelope("acp.op", request_id, **parts)


def expired(message: dict[str, Any], now: float) -> bool:
    """Whether a call's `expires` (Unix time) is before `now`: the caller gave up waiting for it
    to be taken. A call without one (or with an unreadable one) never expires. Workers compare
    their own clocks: they share one host, or keep their clocks in sync."""
    expires = message.get("expires")
    return isinstance(expires, int | float) and not isinstance(expires, bool) and now > expires


def encode_reply(request_id: str, reply: Reply) -> dict[str, Any]:
    return envelope("acp.result", request_id, reply=reply.name, fields=encode_fields(reply))


def encode_receipt(request_id: str) -> dict[str, Any]:
    return envelope("acp.receipt", request_id)


def encode_push(push: Pushed | PushEnded) -> dict[str, Any]:
    if isinstance(push, PushEnded):
        return envelope("acp.push", lease=push.lease, end=True, reason=push.reason)
    return envelope("acp.push", lease=push.lease, seq=push.seq, first=push.first, items=list(push.items))


def decode_op(message: dict[str, Any]) -> Op | ErrorReply:
    """The op a call carries, or the error reply that says why it cannot be served."""
    name = message.get("op")
    cls = OPS.get(name) if isinstance(name, str) else None
    if cls is None:
        return UnknownOp(str(name))
    try:
        op: Op = decode_fields(cls, message.get("args"))
    except MalformedMessage as error:
        return Malformed(str(error))
    return op


def decode_reply(message: dict[str, Any]) -> Reply:
    """The reply a result message carries (Malformed when it cannot be read)."""
    name = message.get("reply")
    cls = REPLIES.get(name) if isinstance(name, str) else None
    if cls is None:
        return Malformed(f"unknown reply {name!r}")
    try:
        reply: Reply = decode_fields(cls, message.get("fields", {}))
    except MalformedMessage as error:
        return Malformed(str(error))
    return reply


def decode_push(message: dict[str, Any]) -> Pushed | PushEnded:
    """Raises MalformedMessage."""
    if message.get("end"):
        result: Pushed | PushEnded = decode_fields(PushEnded, {"reason": None, **message})
    else:
        result = decode_fields(Pushed, message)
    return result


def expect(op: Op, reply: Reply) -> Reply:
    """The reply if `op` may get it, else WorkerFailed."""
    if not isinstance(reply, op.replies):
        raise WorkerFailed(op.name, describe(reply), reply)
    return reply
