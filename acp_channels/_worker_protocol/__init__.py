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
  answered 503 and its client may send the request again; with `"answer": false` the callee
  serves it and replies nothing (a socket's client messages, but one in SOCKET_CREDIT_*:
  the answer to the next call says every op before it was served, in order);
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
  (mostly sent unanswered: `_gateway.remote.RemoteSocket.send_to_agent`)
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

from typing import Any, Final, Literal

from acp_channels._worker_protocol.fields import (
    MalformedMessage as MalformedMessage,
)
from acp_channels._worker_protocol.fields import (
    decode_fields as decode_fields,
)
from acp_channels._worker_protocol.fields import (
    describe as describe,
)
from acp_channels._worker_protocol.fields import (
    encode_fields as encode_fields,
)
from acp_channels._worker_protocol.messages import (
    OPS as OPS,
)
from acp_channels._worker_protocol.messages import (
    REPLIES as REPLIES,
)
from acp_channels._worker_protocol.messages import (
    Acknowledge as Acknowledge,
)
from acp_channels._worker_protocol.messages import (
    AgentFailed as AgentFailed,
)
from acp_channels._worker_protocol.messages import (
    Alive as Alive,
)
from acp_channels._worker_protocol.messages import (
    Busy as Busy,
)
from acp_channels._worker_protocol.messages import (
    Closed as Closed,
)
from acp_channels._worker_protocol.messages import (
    ConnectionEnded as ConnectionEnded,
)
from acp_channels._worker_protocol.messages import (
    Connections as Connections,
)
from acp_channels._worker_protocol.messages import (
    EndConnection as EndConnection,
)
from acp_channels._worker_protocol.messages import (
    Ended as Ended,
)
from acp_channels._worker_protocol.messages import (
    ErrorReply as ErrorReply,
)
from acp_channels._worker_protocol.messages import (
    Internal as Internal,
)
from acp_channels._worker_protocol.messages import (
    KeepAlive as KeepAlive,
)
from acp_channels._worker_protocol.messages import (
    Kept as Kept,
)
from acp_channels._worker_protocol.messages import (
    Lease as Lease,
)
from acp_channels._worker_protocol.messages import (
    Leased as Leased,
)
from acp_channels._worker_protocol.messages import (
    LeaseSocket as LeaseSocket,
)
from acp_channels._worker_protocol.messages import (
    ListConnections as ListConnections,
)
from acp_channels._worker_protocol.messages import (
    Malformed as Malformed,
)
from acp_channels._worker_protocol.messages import (
    Op as Op,
)
from acp_channels._worker_protocol.messages import (
    Open as Open,
)
from acp_channels._worker_protocol.messages import (
    Opened as Opened,
)
from acp_channels._worker_protocol.messages import (
    OpenRefused as OpenRefused,
)
from acp_channels._worker_protocol.messages import (
    Probe as Probe,
)
from acp_channels._worker_protocol.messages import (
    Pushed as Pushed,
)
from acp_channels._worker_protocol.messages import (
    PushEnded as PushEnded,
)
from acp_channels._worker_protocol.messages import (
    Release as Release,
)
from acp_channels._worker_protocol.messages import (
    ReplayRefused as ReplayRefused,
)
from acp_channels._worker_protocol.messages import (
    Replied as Replied,
)
from acp_channels._worker_protocol.messages import (
    Reply as Reply,
)
from acp_channels._worker_protocol.messages import (
    ReplyFromTransport as ReplyFromTransport,
)
from acp_channels._worker_protocol.messages import (
    SessionRefused as SessionRefused,
)
from acp_channels._worker_protocol.messages import (
    SocketLeased as SocketLeased,
)
from acp_channels._worker_protocol.messages import (
    SocketSubmitted as SocketSubmitted,
)
from acp_channels._worker_protocol.messages import (
    StreamsFull as StreamsFull,
)
from acp_channels._worker_protocol.messages import (
    Submit as Submit,
)
from acp_channels._worker_protocol.messages import (
    SubmitOnSocket as SubmitOnSocket,
)
from acp_channels._worker_protocol.messages import (
    Submitted as Submitted,
)
from acp_channels._worker_protocol.messages import (
    Terminate as Terminate,
)
from acp_channels._worker_protocol.messages import (
    Terminated as Terminated,
)
from acp_channels._worker_protocol.messages import (
    TooManyPending as TooManyPending,
)
from acp_channels._worker_protocol.messages import (
    UnknownConnection as UnknownConnection,
)
from acp_channels._worker_protocol.messages import (
    UnknownOp as UnknownOp,
)
from acp_channels._worker_protocol.messages import (
    message as message,
)
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


# -- the envelope -----------------------------------------------------------------------------


def envelope(kind: Kind, request_id: str | None = None, **parts: Any) -> dict[str, Any]:
    """Every message of this protocol is built here."""
    message: dict[str, Any] = {"type": kind}
    if request_id is not None:
        message["id"] = request_id
    message.update(parts)
    return message


def encode_op(
    op: Op,
    request_id: str,
    reply_to: str,
    *,
    receipt: bool = False,
    expires: float | None = None,
    answer: bool = True,
) -> dict[str, Any]:
    """A call; with `expires` (a Unix time), one the callee drops unserved once that time passed;
    without `answer`, one the callee serves without replying (the caller learns the outcome
    from a later call's answer: ops are served in the order they were sent)."""
    parts: dict[str, Any] = {"reply_to": reply_to, "receipt": receipt, "op": op.name, "args": encode_fields(op)}
    if expires is not None:
        parts["expires"] = expires
    if not answer:
        parts["answer"] = False
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
