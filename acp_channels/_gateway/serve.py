"""Serving the other workers' calls for the hosts of this process (`serve_*`, registered on the
bus at import), the leases their readers hold here (`LeaseOnHost`), and the cluster view for
operators (`cluster_connections`, `end_connection`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

from acp_channels import _protocol as protocol
from acp_channels._agents.channel import AgentClosed
from acp_channels._gateway.handles import (
    LIST_TIMEOUT,
    SOCKET_END_REASONS,
    TERMINATE_TIMEOUT,
    logger,
    owned_host,
)
from acp_channels._gateway.remote import _active_readers
from acp_channels._host import (
    ConnectionHost,
    Delivery,
    Mailbox,
    ReplayUnavailable,
    StreamBusy,
    StreamLease,
    TooManyRequests,
    TooManyStreams,
    registry,
)
from acp_channels._identity import Principal
from acp_channels._inventory import ConnectionInfo, local_connections
from acp_channels._protocol import InboundPlan, SessionHeaderError
from acp_channels._worker import MAX_TAKE_BYTES, WORKER_ID, bus, lease_idle_limit, worker_of, worker_timeout
from acp_channels._worker_protocol import (
    COALESCE_AFTER_ITEMS,
    COALESCE_SECONDS,
    PUSH_CREDIT_BATCHES,
    PUSH_CREDIT_BYTES,
    Acknowledge,
    Alive,
    Busy,
    Closed,
    ConnectionEnded,
    Connections,
    EndConnection,
    Ended,
    KeepAlive,
    Kept,
    Lease,
    Leased,
    LeaseSocket,
    ListConnections,
    Probe,
    Pushed,
    PushEnded,
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
    Terminate,
    Terminated,
    TooManyPending,
    UnknownConnection,
)
from acp_channels.errors import HostUnreachable


class LeaseOnHost:
    """The host side of a remote reader's lease: pushes the stream's batches to the reader's
    worker and keeps those not acknowledged yet, which go back to the stream, in order, when
    the lease ends (the reader's worker died, or it released the lease before writing them)."""

    def __init__(self, lease_id: str, reader_worker: str, mailbox: Mailbox, host: ConnectionHost) -> None:
        """Not holding the stream yet: the caller acquires it with this as the holder, then
        `start`s it."""
        self.lease_id = lease_id
        self.reader_worker = reader_worker
        self.mailbox = mailbox
        self.host = host
        self.unacked: deque[tuple[int, Delivery]] = deque()
        self.unacked_bytes = 0
        self.seq = 0
        self.ended = False
        self._room = asyncio.Event()
        self._ended = asyncio.Event()
        self._pump: asyncio.Task[None] | None = None
        self._expiry: asyncio.TimerHandle | None = None

    def start(self) -> None:
        _leases_on_host[self.lease_id] = self
        self._arm()
        self._pump = asyncio.get_running_loop().create_task(self._push(), name=f"acp-push-{self.lease_id}")

    @property
    def holding(self) -> bool:
        """Still the stream's reader (not taken over by a resuming one)."""
        return self.mailbox.holder is self

    def acknowledge(self, seq: int) -> None:
        """The reader wrote the batches up to `seq` (and is alive)."""
        if self.ended:
            return
        while self.unacked and self.unacked[0][0] <= seq:
            _, items = self.unacked.popleft()
            self.unacked_bytes -= sum(map(len, items))
        if self.holding:
            self.mailbox.settle()  # written on the reader's side: they stop counting
        self._room.set()
        self._arm()

    async def _push(self) -> None:
        flowing = False
        try:
            while True:
                while len(self.unacked) >= PUSH_CREDIT_BATCHES or self.unacked_bytes >= PUSH_CREDIT_BYTES:
                    self._room.clear()
                    await self._room.wait()
                if flowing:
                    await asyncio.sleep(COALESCE_SECONDS)  # a flowing stream: let the batch grow
                room = max(1, PUSH_CREDIT_BYTES - self.unacked_bytes)
                items = await self.mailbox.take(None, min(room, MAX_TAKE_BYTES), holder=self, settle=False)
                if items is None:  # the stream ended (closed and drained), or another reader took it
                    taken = not self.holding  # or the host sent this reader away (an expired credential)
                    why = self.mailbox.eviction_of(self) or ("taken" if taken else None)
                    await bus.push(self.reader_worker, PushEnded(self.lease_id, why))
                    if taken:
                        self.end()
                    return  # else the lease stays until the reader releases it (or goes silent)
                if not items:
                    continue
                flowing = len(items) >= COALESCE_AFTER_ITEMS
                self.seq += 1
                self.unacked.append((self.seq, items))  # first: a failed push gives them back
                self.unacked_bytes += sum(map(len, items))
                await bus.push(self.reader_worker, Pushed(self.lease_id, self.seq, items.first_seq, tuple(items)))
        except asyncio.CancelledError:
            raise
        except Exception as error:  # the layer is down: the reader cannot be reached
            logger.warning("lease %s: pushing to worker %s failed: %s", self.lease_id, self.reader_worker, error)
            self.end()

    def end(self) -> None:
        """Release the stream; whatever was not acknowledged goes back for the next reader
        (unless a resuming reader took the stream over: it said what it got)."""
        if self.ended:
            return
        self.ended = True
        self._ended.set()
        self._disarm()
        if self._pump is not None and self._pump is not asyncio.current_task():
            self._pump.cancel()
        _leases_on_host.pop(self.lease_id, None)
        if self.holding:
            unacked = [item for _, items in self.unacked for item in items]
            if unacked:
                self.mailbox.requeue(unacked)
            self.mailbox.release(self)
        self.unacked.clear()
        self.unacked_bytes = 0

    async def until_ended(self) -> None:
        await self._ended.wait()

    def _arm(self) -> None:
        self._disarm()
        self._expiry = asyncio.get_running_loop().call_later(lease_idle_limit(), self.end)

    def _disarm(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None


_leases_on_host: dict[str, LeaseOnHost] = {}


async def release_if_reader_gone(mailbox: Mailbox) -> None:
    """A stream held by a reader on another worker that no longer has it (its worker died, or
    its release is still on the way) is taken over: nothing is lost, the lease goes back."""
    holder = mailbox.holder
    if not isinstance(holder, LeaseOnHost):
        return
    alive = await _reader_alive(holder)
    if alive:
        return
    if alive is False:
        # Its worker answered that the reader let the lease go: the Release, posted before that
        # answer, says what the reader wrote. Ending the lease before it arrives would give the
        # client what it already has a second time (the next reader got it again).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(worker_timeout()):
                await holder.until_ended()
    holder.end()


async def _reader_alive(lease: LeaseOnHost) -> bool | None:
    """Whether the lease's reader still holds it; None when its worker did not answer."""
    try:
        reply = await bus.call(lease.reader_worker, Probe(lease.lease_id), timeout=worker_timeout())
    except Exception:
        return None
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
        return TooManyPending(error.limit, error.unit)
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


async def serve_acknowledge(op: Acknowledge) -> None:
    lease = _leases_on_host.get(op.lease)
    if lease is not None:
        lease.acknowledge(op.seq)


async def serve_keep_alive(op: KeepAlive) -> Reply:
    lease = _leases_on_host.get(op.lease)
    if lease is None:
        return Ended("lost")
    lease.acknowledge(op.seq)
    return Kept()


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
    return Connections(tuple(local_connections(op.owner)))


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
bus.handle(Acknowledge, serve_acknowledge)
bus.handle(KeepAlive, serve_keep_alive)
bus.handle(Release, serve_release)
bus.handle(Terminate, serve_terminate)
bus.handle(Probe, serve_probe)
bus.handle(ListConnections, serve_list_connections)
bus.handle(EndConnection, serve_end_connection)


# -- the cluster, for operators ----------------------------------------------------------------


async def cluster_connections(owner: Principal | None = None) -> tuple[list[ConnectionInfo], list[str]]:
    """Every live connection of the cluster (each live worker's, oldest first; only `owner`'s if
    given), and the ids of the live workers that did not answer within LIST_TIMEOUT. With the
    in-memory layer: this process's own."""
    connections = local_connections(owner)
    if not bus.shared:
        return connections, []
    bus.ensure_listening()
    others = [worker for worker in await bus.heartbeat.live_workers() if worker != WORKER_ID]

    async def ask(worker: str) -> list[ConnectionInfo] | None:
        try:
            reply = await bus.call(worker, ListConnections(owner), timeout=LIST_TIMEOUT)
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
