"""The one interface the edges use to reach a connection, wherever its host lives.

`locate(connection_id, principal)` gives a handle with `submit`, `lease` and `terminate`. A host
in this process is called directly (no serialization, no layer); a host on another worker is
reached through the channel layer (`worker.bus`), and this module also serves those calls for
the hosts this process owns.

A connection belongs to the principal that created it. This module is the one place that rule
is applied: a request by another principal finds nothing, exactly like an unknown id (404),
here for a host in this process, and on the host's worker for a remote one (each op carries the
caller's principal as `Principal.to_wire()`; a mismatch is answered "unknown").

A WebSocket's socket may be attached on any worker too (a reattach lands anywhere): the
consumer holds a `SocketAttachment`, a direct one (`LocalSocket`) or a lease on the host's socket
outbox (`RemoteSocket`), and sends the client's messages and takes the agent's through it.

The cross-worker contract (every op, its fields and its replies) is in
`acp_channels.worker_protocol`; this module makes those calls (`RemoteHandle`, `RemoteStream`,
`RemoteSocket`), serves them for the hosts of this process (`serve_*`), and turns the refusals a
remote host answers into the exceptions a local host raises (`raise_refusal`). A reply an op
cannot get raises `WorkerFailed` (500 at the edges).

`open_connection` is how both edges open a connection on this worker: admission (a draining
worker, MAX_CONNECTIONS, the worker's output budget, the principal's quota), the connection id,
the agent from the `AGENT` setting, the connection's limits; its refusals are typed, and each edge
answers them in its own way. The edges import from here and from `protocol` only: the errors they
answer are re-exported below.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any, Literal, NoReturn, Protocol, TypeVar

from acp_channels import protocol
from acp_channels.agents.channel import AgentClosed
from acp_channels.agents.factory import create_agent_channel
from acp_channels.conf import acp_settings
from acp_channels.host import (
    AgentEnded,
    ConnectionHost,
    Delivery,
    EndReason,
    InitializeReply,
    Mailbox,
    QuotaExceeded,
    ReplayUnavailable,
    ServerFull,
    StreamBusy,
    StreamLease,
    TooManyRequests,
    TooManyStreams,
    registry,
)
from acp_channels.identity import Principal, TransportKind
from acp_channels.inventory import ConnectionInfo, local_connections
from acp_channels.lifecycle import lifecycle
from acp_channels.protocol import Frame, InboundPlan, SessionHeaderError, StreamKey
from acp_channels.worker import (
    MAX_TAKE_BYTES,
    TAKE_WAIT,
    WORKER_ID,
    AgentBusy,
    HostUnreachable,
    LayerUnavailable,
    bus,
    lease_idle_limit,
    new_connection_id,
    worker_of,
    worker_timeout,
)
from acp_channels.worker_protocol import (
    Alive,
    Batch,
    Busy,
    Closed,
    ConnectionEnded,
    Connections,
    EndConnection,
    Ended,
    ErrorReply,
    Lease,
    Leased,
    LeaseSocket,
    ListConnections,
    Probe,
    Release,
    ReplayRefused,
    Replied,
    Reply,
    ReplyFromTransport,
    SessionRefused,
    SocketLeased,
    SocketSubmitted,
    StreamsFull,
    Submit,
    SubmitOnSocket,
    Submitted,
    Take,
    Terminate,
    Terminated,
    TooManyPending,
    UnknownConnection,
    WorkerFailed,
)

logger = logging.getLogger(__name__)

#: How long a submit may wait for the agent to take the frame (its backpressure), after receipt.
SUBMIT_TIMEOUT = 300.0
#: How long ending a connection may take on its host (an agent process may need its grace).
TERMINATE_TIMEOUT = 30.0
#: How long a worker may take to list its connections before the cluster view goes without it.
LIST_TIMEOUT = 2.0

R = TypeVar("R", bound=Reply)


class StreamReader(Protocol):
    #: Names the stream in its SSE event ids.
    tag: str

    async def take(self, timeout: float | None) -> Delivery | None: ...

    def release(self) -> None: ...


#: Why a socket's `take` returned None: the connection ended (its output all taken), another
#: socket took the connection over, the host forgot this socket's lease (it was silent too long),
#: the host's worker is gone, or this worker is shutting down.
SocketEnd = Literal["ended", "taken", "lost", "gone", "draining"]
#: The end reasons a socket's own end may give its connection (a clean close, a failed send).
SOCKET_END_REASONS: frozenset[str] = frozenset(("socket closed", "send failed"))


class SocketAttachment(Protocol):
    """A WebSocket attached to its connection, wherever the host lives."""

    #: Client messages the host had received on the connection's sockets when this one attached.
    received: int
    #: Why `take` returned None.
    end_reason: SocketEnd

    async def take(self, timeout: float | None) -> Delivery | None: ...

    async def send_to_agent(self, text: str) -> None:
        """Hand the host a text message the client sent on this socket (raises AgentClosed)."""

    async def detach(self, end: EndReason | None = None) -> None:
        """The socket is gone: end the connection (`end`) or let its grace period run."""


class HostHandle(Protocol):
    async def submit(self, plan: InboundPlan) -> None: ...

    async def reply_from_transport(self, text: str) -> None: ...

    async def lease(self, key: StreamKey, resume: str | None = None) -> StreamReader: ...

    async def attach_socket(self, last_seq: int) -> SocketAttachment: ...

    async def terminate(self) -> None: ...


def locate(connection_id: str, principal: Principal) -> HostHandle | None:
    """A handle for the connection's host, or None when it cannot exist for `principal` (404):
    an unknown id, or a connection another principal owns. A remote handle's ops answer
    "unknown" (HostUnreachable, 404) for either on the host's worker."""
    host = owned_host(connection_id, principal)
    if host is not None:
        return LocalHandle(host)
    worker_id = worker_of(connection_id)
    if worker_id is None or worker_id == WORKER_ID or not bus.shared:
        return None
    return RemoteHandle(worker_id, connection_id, principal)


def owned_host(connection_id: str, principal: Principal) -> ConnectionHost | None:
    """The host of a connection in this process if `principal` owns it; None otherwise, the
    same answer as for an id that does not exist (a stolen id tells nothing)."""
    host = registry.get(connection_id)
    return host if host is not None and host.principal == principal else None


class ShuttingDown(Exception):
    """This worker is draining: it opens no new connection (503; a new socket is refused)."""


class AgentNotStarted(Exception):
    """The agent factory failed for a new connection (500; a socket closes with 1011). Logged,
    with its cause, where it happened."""


def open_connection(transport: TransportKind, principal: Principal, remote_address: str | None) -> NewConnection:
    """Admit and open a connection hosted by this worker, owned by `principal`, with a new agent
    from the `AGENT` setting and the connection's limits from the settings.

    Raises ShuttingDown (this worker drains), QuotaExceeded (the principal holds
    MAX_CONNECTIONS_PER_PRINCIPAL here), ServerFull (MAX_CONNECTIONS, or the worker's output
    budget; its `reason` says which) or AgentNotStarted (the agent factory failed).
    """
    if lifecycle.draining:
        raise ShuttingDown
    connection_id = new_connection_id()
    try:
        host = registry.create(
            create_agent_channel,
            transport,
            connection_id=connection_id,
            max_buffered_bytes=acp_settings.MAX_BUFFERED_BYTES,
            principal=principal,
            remote_address=remote_address,
        )
    except (QuotaExceeded, ServerFull):
        raise
    except Exception as error:
        logger.exception("the agent could not be started")
        raise AgentNotStarted(connection_id) from error
    bus.ensure_listening()  # the id names this worker: the others must be able to reach it
    return NewConnection(host)


class NewConnection:
    """A connection `open_connection` just made, as the edge that opened it uses it: an HTTP
    connection is accepted once its agent answers `initialize`, a WebSocket one at once."""

    def __init__(self, host: ConnectionHost) -> None:
        self.host = host
        self.connection_id = host.connection_id

    async def initialize(self, frame: Frame, init_id: object) -> InitializeReply:
        """Forward the initial frame and wait for the agent's reply to `init_id` (raises
        AgentClosed, AgentEnded)."""
        return await self.host.initialize(frame, init_id)

    async def abandon(self) -> None:
        """The connection was never accepted (initialize failed, or the client left): end it."""
        await self.host.terminate("initialize failed")

    def attach_first_socket(self) -> SocketAttachment:
        """Start relaying the agent's output to the WebSocket that opened the connection."""
        self.host.start()
        return LocalSocket.first(self.host)


class LocalHandle:
    """Same process: direct calls."""

    def __init__(self, host: ConnectionHost) -> None:
        self.host = host

    async def submit(self, plan: InboundPlan) -> None:
        try:
            async with asyncio.timeout(SUBMIT_TIMEOUT):
                await self.host.submit(plan)
        except TimeoutError:
            raise AgentBusy(f"the agent did not take the frame within {SUBMIT_TIMEOUT:g} s") from None

    async def reply_from_transport(self, text: str) -> None:
        self.host.reply_from_transport(text)

    async def lease(self, key: StreamKey, resume: str | None = None) -> StreamReader:
        if resume is None:
            await release_if_reader_gone(self.host.stream_for_reader(key))
        return self.host.lease(key, resume)

    async def attach_socket(self, last_seq: int) -> SocketAttachment:
        socket = LocalSocket(self.host)
        socket.received = self.host.attach_socket(last_seq, socket)
        return socket

    async def terminate(self) -> None:
        await self.host.terminate("delete")


class LocalSocket:
    """A socket attached to a host in this process: it is itself the outbox's holder (the first
    socket of a connection uses the holder the outbox was made with)."""

    def __init__(self, host: ConnectionHost, holder: object | None = None) -> None:
        self.host = host
        self.holder = self if holder is None else holder
        self.received = host.socket_received
        self.end_reason: SocketEnd = "ended"

    @classmethod
    def first(cls, host: ConnectionHost) -> LocalSocket:
        """The socket that created the connection."""
        return cls(host, host.socket_outbox.first_holder)

    async def take(self, timeout: float | None) -> Delivery | None:
        items = await self.host.socket_outbox.take(timeout, holder=self.holder)
        if items is None and not self.host.ended.is_set() and not self.host.holds_socket(self.holder):
            self.end_reason = "taken"
        return items

    async def send_to_agent(self, text: str) -> None:
        await self.host.receive_from_socket(text, self.holder)

    async def detach(self, end: EndReason | None = None) -> None:
        await self.host.detach_socket(self.holder, end)


# -- a host on another worker ------------------------------------------------------------------

_lease_ids = itertools.count()
#: Leases held by SSE readers in this process (answers `probe`).
_active_readers: set[str] = set()


def raise_refusal(connection_id: str, refusal: ErrorReply) -> NoReturn:
    """Raise what a host in this process raises for the refusal a remote host answered."""
    if isinstance(refusal, UnknownConnection):
        raise HostUnreachable(connection_id)
    if isinstance(refusal, SessionRefused):
        raise SessionHeaderError(refusal.text)
    if isinstance(refusal, TooManyPending):
        raise TooManyRequests(refusal.limit)
    if isinstance(refusal, Busy):
        raise StreamBusy
    if isinstance(refusal, StreamsFull):
        raise TooManyStreams(refusal.limit)
    if isinstance(refusal, ReplayRefused):
        raise ReplayUnavailable("gone" if refusal.reason == "gone" else "foreign", refusal.event)
    if isinstance(refusal, Closed):
        raise AgentClosed("connection ended")
    raise WorkerFailed("a call", refusal)


class RemoteHandle:
    def __init__(self, worker_id: str, connection_id: str, principal: Principal) -> None:
        self.worker_id = worker_id
        self.connection_id = connection_id
        self.principal = principal

    async def _call(self, op: Any, timeout: float, result: type[R]) -> R:
        """The op's result; its refusals raised as a local host raises them."""
        reply = await bus.call(self.worker_id, op, timeout=timeout, receipt=True)
        if isinstance(reply, ErrorReply):
            raise_refusal(self.connection_id, reply)
        if not isinstance(reply, result):
            raise WorkerFailed(op.name, reply)
        return reply

    async def submit(self, plan: InboundPlan) -> None:
        op = Submit(
            self.connection_id,
            self.principal,
            protocol.serialize_frame(plan.frame),
            tuple(plan.routes),
            tuple(plan.sessions),
            plan.session_header,
        )
        await self._call(op, SUBMIT_TIMEOUT, Submitted)

    async def reply_from_transport(self, text: str) -> None:
        await self._call(ReplyFromTransport(self.connection_id, self.principal, text), worker_timeout(), Replied)

    def _new_lease(self) -> str:
        return f"{WORKER_ID}-{next(_lease_ids)}"

    async def lease(self, key: StreamKey, resume: str | None = None) -> StreamReader:
        lease_id = self._new_lease()
        op = Lease(self.connection_id, self.principal, lease_id, WORKER_ID, key, resume)
        # The answer may wait for a probe of a stale reader.
        leased = await self._call(op, 2 * worker_timeout(), Leased)
        _active_readers.add(lease_id)
        return RemoteStream(self.worker_id, lease_id, leased.tag)

    async def attach_socket(self, last_seq: int) -> SocketAttachment:
        lease_id = self._new_lease()
        op = LeaseSocket(self.connection_id, self.principal, lease_id, WORKER_ID, last_seq)
        leased = await self._call(op, 2 * worker_timeout(), SocketLeased)
        _active_readers.add(lease_id)
        return RemoteSocket(self, lease_id, leased.received)

    async def terminate(self) -> None:
        await self._call(Terminate(self.connection_id, self.principal), TERMINATE_TIMEOUT, Terminated)


class RemoteStream:
    """An SSE reader's lease on a stream hosted by another worker: pulls batches, acknowledging
    each one with the next pull."""

    def __init__(self, worker_id: str, lease_id: str, tag: str) -> None:
        self.worker_id = worker_id
        self.lease_id = lease_id
        self.tag = tag
        self.acked = 0
        #: Why `take` returned None.
        self.end_reason: SocketEnd = "ended"

    async def take(self, timeout: float | None) -> Delivery | None:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not lifecycle.draining:  # a draining worker ends the streams it serves
            wait = TAKE_WAIT if deadline is None else max(0.0, min(TAKE_WAIT, deadline - loop.time()))
            try:
                reply = await bus.call(
                    self.worker_id, Take(self.lease_id, self.acked, wait), timeout=wait + worker_timeout()
                )
            except Exception:  # HostUnreachable, LayerUnavailable, WorkerFailed: the stream ends
                self.end_reason = "gone"
                return None
            if isinstance(reply, Ended):
                self.end_reason = "taken" if reply.reason == "taken" else "lost" if reply.reason else "ended"
                return None
            assert isinstance(reply, Batch)
            self.acked = reply.seq
            if reply.items or (deadline is not None and loop.time() >= deadline):
                return Delivery(list(reply.items), reply.first)
        self.end_reason = "draining"
        return None

    def release(self, end: EndReason | None = None) -> None:
        """Give the lease back (the last batch taken was written). With `end`, the host ends the
        connection if this lease still holds its socket."""
        if self.lease_id in _active_readers:
            _active_readers.discard(self.lease_id)
            bus.post(self.worker_id, Release(self.lease_id, self.acked, end))


class RemoteSocket(RemoteStream):
    """A socket attached here to a connection hosted by another worker: a lease on the host's
    socket outbox, and the client's messages sent with it (the host drops them once the lease
    no longer holds the socket)."""

    def __init__(self, handle: RemoteHandle, lease_id: str, received: int) -> None:
        super().__init__(handle.worker_id, lease_id, "")
        self.handle = handle
        self.received = received

    async def send_to_agent(self, text: str) -> None:
        handle = self.handle
        op = SubmitOnSocket(handle.connection_id, handle.principal, text, self.lease_id)
        await handle._call(op, SUBMIT_TIMEOUT, SocketSubmitted)

    async def detach(self, end: EndReason | None = None) -> None:
        self.release(end)


# -- serving the hosts of this process ---------------------------------------------------------


class LeaseOnHost:
    """The host side of a remote reader's lease: the batch in flight until acknowledged."""

    def __init__(self, lease_id: str, reader_worker: str, mailbox: Mailbox, host: ConnectionHost) -> None:
        """Not holding the stream yet: the caller acquires it with this as the holder, then
        `start`s it."""
        self.lease_id = lease_id
        self.reader_worker = reader_worker
        self.mailbox = mailbox
        self.host = host
        self.in_flight = Delivery([], 0)
        self.seq = 0
        self.taking = False
        self.ended = False
        self._expiry: asyncio.TimerHandle | None = None

    def start(self) -> None:
        _leases_on_host[self.lease_id] = self
        self._arm()

    @property
    def holding(self) -> bool:
        """Still the stream's reader (not taken over by a resuming one)."""
        return self.mailbox.holder is self

    def acknowledge(self, seq: int) -> None:
        if seq == self.seq and self.in_flight:
            self.in_flight = Delivery([], 0)
            if self.holding:
                self.mailbox.settle()  # written on the reader's side: it stops counting

    async def take(self, wait: float, ack: int) -> Batch | Ended:
        self.acknowledge(ack)
        if self.in_flight:  # the reader did not get the last batch: send it again
            return Batch(tuple(self.in_flight), self.in_flight.first_seq, self.seq)
        self._disarm()
        self.taking = True
        try:
            items = await self.mailbox.take(wait, MAX_TAKE_BYTES, holder=self)
        finally:
            self.taking = False
        if self.ended and items:  # released while we waited: these items belong to the next reader
            if self.holding:
                self.mailbox.requeue(items)
            return Ended()
        if items is None or self.ended:
            taken = not self.ended and not self.holding
            self.end()
            return Ended("taken") if taken else Ended()
        self._arm()
        if items:
            self.seq += 1
            self.in_flight = items
        return Batch(tuple(items), items.first_seq, self.seq)

    def end(self) -> None:
        """Release the stream; whatever was not acknowledged goes back for the next reader
        (unless a resuming reader took the stream over: it said what it got)."""
        if self.ended:
            return
        self.ended = True
        self._disarm()
        _leases_on_host.pop(self.lease_id, None)
        if self.holding:
            self.mailbox.requeue(self.in_flight)
            self.mailbox.release(self)
        self.in_flight = Delivery([], 0)

    def _arm(self) -> None:
        self._disarm()
        self._expiry = asyncio.get_running_loop().call_later(lease_idle_limit(), self._expire)

    def _disarm(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None

    def _expire(self) -> None:
        if not self.taking:
            self.end()


_leases_on_host: dict[str, LeaseOnHost] = {}


async def release_if_reader_gone(mailbox: Mailbox) -> None:
    """A stream held by a reader on another worker that no longer has it (its worker died, or
    its release is still on the way) is taken over: nothing is lost, the lease goes back."""
    holder = mailbox.holder
    if isinstance(holder, LeaseOnHost) and not await _reader_alive(holder):
        holder.end()


async def _reader_alive(lease: LeaseOnHost) -> bool:
    try:
        reply = await bus.call(lease.reader_worker, Probe(lease.lease_id), timeout=worker_timeout())
    except Exception:
        return False
    return isinstance(reply, Alive) and reply.alive


def _target(
    op: Submit | SubmitOnSocket | ReplyFromTransport | Lease | LeaseSocket | Terminate,
) -> ConnectionHost | None:
    """The host an op names, if the caller's principal owns it (else it is "unknown")."""
    return owned_host(op.connection, op.principal)


async def serve_submit(op: Submit) -> Reply:
    host = _target(op)
    if host is None:
        return UnknownConnection()
    # The edge applied the batch-size limit; a big batch is classified in slices here too.
    frame = await protocol.read_frame(op.text)
    plan = InboundPlan(frame, list(op.routes), list(op.sessions), op.header)
    try:
        await host.submit(plan)
    except SessionHeaderError as error:
        return SessionRefused(str(error))
    except TooManyRequests as error:
        return TooManyPending(error.limit)
    except AgentClosed:
        return Closed()
    return Submitted()


async def serve_submit_on_socket(op: SubmitOnSocket) -> Reply:
    """A client message on a socket attached on another worker."""
    host = _target(op)
    if host is None:
        return UnknownConnection()
    lease = _leases_on_host.get(op.socket)
    try:
        counted = await host.receive_from_socket(op.text, lease if lease is not None else object())
    except AgentClosed:
        return Closed()
    return SocketSubmitted(counted)


async def serve_reply(op: ReplyFromTransport) -> Reply:
    host = _target(op)
    if host is None:
        return UnknownConnection()
    try:
        host.reply_from_transport(op.text)
    except AgentClosed:
        return Closed()
    return Replied()


async def serve_lease(op: Lease) -> Reply:
    host = _target(op)
    if host is None:
        return UnknownConnection()
    try:
        if op.resume is None:
            await release_if_reader_gone(host.stream_for_reader(op.stream))
        # Looked up again: a stream released empty just now was forgotten (a new one is made).
        mailbox = host.stream_for_reader(op.stream)
        lease = LeaseOnHost(op.lease, op.reader, mailbox, host)
        StreamLease(mailbox, op.resume, holder=lease)
    except StreamBusy:
        return Busy()
    except TooManyStreams as error:
        return StreamsFull(error.limit)
    except ReplayUnavailable as refused:
        return ReplayRefused(refused.reason, refused.event_id)
    lease.start()
    return Leased(mailbox.tag)


async def serve_lease_socket(op: LeaseSocket) -> Reply:
    """A socket reattached on another worker takes the connection's socket outbox over."""
    host = _target(op)
    if host is None:
        return UnknownConnection()
    lease = LeaseOnHost(op.lease, op.reader, host.socket_outbox, host)
    try:
        received = host.attach_socket(op.resume, lease)
    except StreamBusy:
        return Busy()
    except ReplayUnavailable as refused:
        return ReplayRefused(refused.reason, refused.event_id)
    except AgentClosed:
        return Closed()
    lease.start()
    return SocketLeased(received)


async def serve_take(op: Take) -> Reply:
    lease = _leases_on_host.get(op.lease)
    if lease is None:
        return Ended("lost")
    return await lease.take(op.wait, op.ack)


async def serve_release(op: Release) -> None:
    lease = _leases_on_host.get(op.lease)
    if lease is not None:
        lease.acknowledge(op.ack)
        if op.close in SOCKET_END_REASONS and lease.holding:
            await lease.host.detach_socket(lease, op.close)  # type: ignore[arg-type]
        lease.end()


async def serve_terminate(op: Terminate) -> Reply:
    host = _target(op)
    if host is None:
        return UnknownConnection()
    await host.terminate("delete")
    return Terminated()


async def serve_probe(op: Probe) -> Reply:
    return Alive(op.lease in _active_readers)


async def serve_list_connections(op: ListConnections) -> Reply:
    return Connections(tuple(local_connections()))


async def serve_end_connection(op: EndConnection) -> Reply:
    host = registry.get(op.connection_id)
    if host is None:
        return UnknownConnection()
    await host.terminate("delete")
    return ConnectionEnded()


bus.handle(Submit, serve_submit)
bus.handle(SubmitOnSocket, serve_submit_on_socket)
bus.handle(ReplyFromTransport, serve_reply)
bus.handle(Lease, serve_lease)
bus.handle(LeaseSocket, serve_lease_socket)
bus.handle(Take, serve_take)
bus.handle(Release, serve_release)
bus.handle(Terminate, serve_terminate)
bus.handle(Probe, serve_probe)
bus.handle(ListConnections, serve_list_connections)
bus.handle(EndConnection, serve_end_connection)


# -- the cluster, for operators ----------------------------------------------------------------


async def cluster_connections() -> tuple[list[ConnectionInfo], list[str]]:
    """Every live connection of the cluster (each live worker's, oldest first), and the ids of
    the live workers that did not answer within LIST_TIMEOUT. With the in-memory layer: this
    process's own."""
    connections = local_connections()
    if not bus.shared:
        return connections, []
    bus.ensure_listening()
    others = [worker for worker in await bus.heartbeat.live_workers() if worker != WORKER_ID]

    async def ask(worker: str) -> list[ConnectionInfo] | None:
        try:
            reply = await bus.call(worker, ListConnections(), timeout=LIST_TIMEOUT)
        except Exception:
            return None
        return list(reply.items) if isinstance(reply, Connections) else None

    answers = await asyncio.gather(*(ask(worker) for worker in others))
    silent = [worker for worker, answer in zip(others, answers, strict=True) if answer is None]
    for answer in answers:
        connections.extend(answer or ())
    return sorted(connections, key=lambda info: -info.age_seconds), silent


async def end_connection(connection_id: str) -> bool:
    """End a connection by id, whoever owns it (administrative). False: no such connection
    (or its worker is gone)."""
    host = registry.get(connection_id)
    if host is not None:
        await host.terminate("delete")
        return True
    worker_id = worker_of(connection_id)
    if worker_id is None or worker_id == WORKER_ID or not bus.shared:
        return False
    try:
        reply = await bus.call(worker_id, EndConnection(connection_id), timeout=TERMINATE_TIMEOUT, receipt=True)
    except HostUnreachable:
        return False
    return isinstance(reply, ConnectionEnded)


#: What the edges use: finding and opening connections, and the errors they answer; and the
#: cluster view for operators.
__all__ = [
    "AgentBusy",
    "AgentClosed",
    "AgentEnded",
    "AgentNotStarted",
    "HostHandle",
    "HostUnreachable",
    "LayerUnavailable",
    "NewConnection",
    "QuotaExceeded",
    "ReplayUnavailable",
    "ServerFull",
    "ShuttingDown",
    "SocketAttachment",
    "SocketEnd",
    "StreamBusy",
    "StreamLease",
    "StreamReader",
    "TooManyRequests",
    "TooManyStreams",
    "WorkerFailed",
    "cluster_connections",
    "end_connection",
    "locate",
    "open_connection",
]
