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
import contextlib
import itertools
import logging
from collections import deque
from collections.abc import Awaitable
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
    SLOW_WORKER_PATIENCE,
    TAKE_WAIT,
    WORKER_ID,
    AgentBusy,
    HostUnreachable,
    LayerUnavailable,
    WorkerBusy,
    bus,
    lease_idle_limit,
    new_connection_id,
    worker_of,
    worker_timeout,
)
from acp_channels.worker_protocol import (
    ACK_DELAY,
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
    ErrorReply,
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
        raise TooManyRequests(refusal.limit, "bytes" if refusal.unit == "bytes" else "requests")
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
        reader = RemoteStream(self.worker_id, self._new_lease())
        op = Lease(self.connection_id, self.principal, reader.lease_id, WORKER_ID, key, resume)
        # The answer may wait for a probe of a stale reader.
        leased = await reader.leasing(self._call(op, 2 * worker_timeout(), Leased))
        reader.tag = leased.tag
        return reader

    async def attach_socket(self, last_seq: int) -> SocketAttachment:
        socket = RemoteSocket(self, self._new_lease())
        op = LeaseSocket(self.connection_id, self.principal, socket.lease_id, WORKER_ID, last_seq)
        leased = await socket.leasing(self._call(op, 2 * worker_timeout(), SocketLeased))
        socket.received = leased.received
        return socket

    async def terminate(self) -> None:
        await self._call(Terminate(self.connection_id, self.principal), TERMINATE_TIMEOUT, Terminated)


class RemoteStream:
    """An SSE reader's lease on a stream hosted by another worker. The host pushes batches
    (up to PUSH_CREDIT_* ahead); the reader acknowledges what it wrote (coalesced: at half its
    credit, else ACK_DELAY after the last batch) and, while idle, calls KeepAlive every
    TAKE_WAIT, which also finds out a host whose worker died (HostUnreachable, by heartbeat)."""

    def __init__(self, worker_id: str, lease_id: str, tag: str = "") -> None:
        self.worker_id = worker_id
        self.lease_id = lease_id
        self.tag = tag
        #: The batch handed out last; `written` and `acked` follow it.
        self.returned = 0
        self._returned_bytes = 0
        self.written = 0
        self.acked = 0
        self._unacked_bytes = 0
        self._batches: deque[Pushed] = deque()
        self._end: PushEnded | None = None
        self._arrived = asyncio.Event()
        self._ack_timer: asyncio.TimerHandle | None = None
        #: When the keep-alives began to fail (WorkerBusy, LayerUnavailable), if they do.
        self._failing_since: float | None = None
        #: Why `take` returned None.
        self.end_reason: SocketEnd = "ended"
        # Before the lease is asked for: the host may push before its answer arrives.
        bus.receive_pushes(lease_id, self._on_push)

    async def leasing(self, call: Awaitable[R]) -> R:
        """The lease call's answer; on a refusal (or any failure) this reader is dropped."""
        try:
            result = await call
        except BaseException:
            bus.receive_pushes(self.lease_id, None)
            raise
        _active_readers.add(self.lease_id)
        return result

    def _on_push(self, push: Pushed | PushEnded) -> None:
        if isinstance(push, PushEnded):
            self._end = push
        else:
            self._batches.append(push)
        self._arrived.set()

    async def take(self, timeout: float | None) -> Delivery | None:
        self._wrote(self.returned)  # coming back: the batch handed out last is written
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        keep_alive_at = loop.time() + TAKE_WAIT
        while not lifecycle.draining:  # a draining worker ends the streams it serves
            if self._batches:
                batch = self._batches.popleft()
                self.returned = batch.seq
                self._returned_bytes = sum(map(len, batch.items))
                return Delivery(list(batch.items), batch.first)
            if self._end is not None:
                reason = self._end.reason
                self.end_reason = "taken" if reason == "taken" else "lost" if reason else "ended"
                return None
            now = loop.time()
            if deadline is not None and now >= deadline:
                return Delivery([], 0)
            if now >= keep_alive_at:
                if not await self._keep_alive():
                    return None
                keep_alive_at = loop.time() + TAKE_WAIT
                continue
            self._arrived.clear()
            wait = keep_alive_at - now if deadline is None else min(keep_alive_at, deadline) - now
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):  # not wait_for: see liveness.reply_or_gone
                    await self._arrived.wait()
        self.end_reason = "draining"
        return None

    async def _keep_alive(self) -> bool:
        """Tell the host this reader is still here (and what it wrote); False: the stream ends."""
        self._cancel_ack_timer()
        loop = asyncio.get_running_loop()
        try:
            # With a receipt: a host worker that is slow but alive (heartbeat) is waited for.
            op = KeepAlive(self.lease_id, self.written)
            reply = await bus.call(self.worker_id, op, timeout=worker_timeout(), receipt=True)
        except (WorkerBusy, LayerUnavailable):
            # The host's worker is alive but too busy, or Redis failed a send: the stream is
            # not cut for that; the next keep-alive tries again (if the host gave the lease up
            # meanwhile, it says so). Until the failures have lasted as long as a slow worker
            # is waited for.
            self._failing_since = loop.time() if self._failing_since is None else self._failing_since
            if loop.time() - self._failing_since <= SLOW_WORKER_PATIENCE:
                return True
            self.end_reason = "gone"
            return False
        except Exception:  # HostUnreachable, WorkerFailed: the stream ends
            self.end_reason = "gone"
            return False
        self._failing_since = None
        if isinstance(reply, Ended):
            self._batches.clear()  # the host took them back for the next reader
            self.end_reason = "taken" if reply.reason == "taken" else "lost"
            return False
        self.acked = max(self.acked, self.written)
        self._unacked_bytes = 0
        return True

    def _wrote(self, seq: int) -> None:
        if seq <= self.written:
            return
        self.written = seq
        self._unacked_bytes += self._returned_bytes
        self._returned_bytes = 0
        if seq - self.acked >= PUSH_CREDIT_BATCHES // 2 or self._unacked_bytes >= PUSH_CREDIT_BYTES // 2:
            self._acknowledge()
        elif self._ack_timer is None:
            self._ack_timer = asyncio.get_running_loop().call_later(ACK_DELAY, self._acknowledge)

    def _acknowledge(self) -> None:
        self._cancel_ack_timer()
        if self.written > self.acked and self.lease_id in _active_readers:
            self.acked = self.written
            self._unacked_bytes = 0
            bus.post(self.worker_id, Acknowledge(self.lease_id, self.written))

    def _cancel_ack_timer(self) -> None:
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None

    def release(self, end: EndReason | None = None) -> None:
        """Give the lease back (the last batch taken was written). With `end`, the host ends the
        connection if this lease still holds its socket."""
        self._cancel_ack_timer()
        bus.receive_pushes(self.lease_id, None)
        if self.lease_id in _active_readers:
            _active_readers.discard(self.lease_id)
            bus.post(self.worker_id, Release(self.lease_id, self.returned, end))


class RemoteSocket(RemoteStream):
    """A socket attached here to a connection hosted by another worker: a lease on the host's
    socket outbox, and the client's messages sent with it (the host drops them once the lease
    no longer holds the socket)."""

    def __init__(self, handle: RemoteHandle, lease_id: str) -> None:
        super().__init__(handle.worker_id, lease_id)
        self.handle = handle
        self.received = 0

    async def send_to_agent(self, text: str) -> None:
        handle = self.handle
        op = SubmitOnSocket(handle.connection_id, handle.principal, text, self.lease_id)
        await handle._call(op, SUBMIT_TIMEOUT, SocketSubmitted)

    async def detach(self, end: EndReason | None = None) -> None:
        self.release(end)


# -- serving the hosts of this process ---------------------------------------------------------


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
                    taken = not self.holding
                    await bus.push(self.reader_worker, PushEnded(self.lease_id, "taken" if taken else None))
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
bus.handle(Acknowledge, serve_acknowledge)
bus.handle(KeepAlive, serve_keep_alive)
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
    "WorkerBusy",
    "WorkerFailed",
    "cluster_connections",
    "end_connection",
    "locate",
    "open_connection",
]
