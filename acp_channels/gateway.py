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

Op results (a dict; `error` names a refusal the caller turns into the same answer as for a host
in its own process): submit -> ok | error unknown, session (text), pending (limit), closed;
submit with `socket` (the lease id of a reattached socket; `text` is a client message as
received) -> ok + counted (false: not the connection's socket any more, dropped) | error unknown,
closed;
lease -> ok + tag | error unknown, busy, streams (limit), replay (reason, event);
lease with `socket: true` and `resume` (the last message the client received, a number) ->
ok + received (the client messages counted so far) | error unknown, busy (not a WebSocket
connection), replay (reason, event), closed;
take -> items + first + seq | end (+ reason: taken, when another reader took the stream over;
lost, for a lease the host no longer knows);
release (no reply; `close`: an end reason for the connection if the lease still holds its socket);
terminate -> ok | error unknown; probe -> alive.

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
from typing import Any, Literal, Protocol

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
    inbox_channel,
    lease_idle_limit,
    new_connection_id,
    worker_of,
    worker_timeout,
)

logger = logging.getLogger(__name__)

#: How long a submit may wait for the agent to take the frame (its backpressure), after receipt.
SUBMIT_TIMEOUT = 300.0
#: How long ending a connection may take on its host (an agent process may need its grace).
TERMINATE_TIMEOUT = 30.0


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


class RemoteHandle:
    def __init__(self, worker_id: str, connection_id: str, principal: Principal) -> None:
        self.worker_id = worker_id
        self.connection_id = connection_id
        self.principal = principal

    async def _call(self, op: str, timeout: float, receipt: bool = False, **args: Any) -> dict[str, Any]:
        target = {"connection": self.connection_id, "principal": self.principal.to_wire()}
        result = await bus.call(self.worker_id, op, {**target, **args}, timeout=timeout, receipt=receipt)
        if result.get("error") == "unknown":
            raise HostUnreachable(self.connection_id)
        return result

    async def submit(self, plan: InboundPlan) -> None:
        result = await self._call(
            "submit",
            SUBMIT_TIMEOUT,
            receipt=True,
            text=protocol.serialize_frame(plan.frame),
            routes=[list(route) for route in plan.routes],
            sessions=plan.sessions,
            header=plan.session_header,
        )
        if result.get("error") == "session":
            raise SessionHeaderError(result["text"])
        if result.get("error") == "pending":
            raise TooManyRequests(int(result["limit"]))
        if result.get("error") == "closed":
            raise AgentClosed("agent closed")

    async def reply_from_transport(self, text: str) -> None:
        result = await self._call("reply", worker_timeout(), receipt=True, text=text)
        if result.get("error") == "closed":
            raise AgentClosed("connection ended")

    async def _lease(self, **target: Any) -> tuple[str, dict[str, Any]]:
        """Take a lease on the host's worker; its refusals raised as a local host raises them.
        Returns the lease id and the result."""
        lease_id = f"{WORKER_ID}-{next(_lease_ids)}"
        # Receipt proves the host is alive; the answer may wait for a probe of a stale reader.
        timeout = 2 * worker_timeout()
        result = await self._call("lease", timeout, receipt=True, lease=lease_id, reader=WORKER_ID, **target)
        error = result.get("error")
        if error == "busy":
            raise StreamBusy
        if error == "streams":
            raise TooManyStreams(int(result["limit"]))
        if error == "replay":
            raise ReplayUnavailable(result["reason"], result["event"])
        if error == "closed":
            raise AgentClosed("connection ended")
        _active_readers.add(lease_id)
        return lease_id, result

    async def lease(self, key: StreamKey, resume: str | None = None) -> StreamReader:
        lease_id, result = await self._lease(stream=key, resume=resume)
        return RemoteStream(self.worker_id, lease_id, result["tag"])

    async def attach_socket(self, last_seq: int) -> SocketAttachment:
        lease_id, result = await self._lease(socket=True, resume=last_seq)
        return RemoteSocket(self, lease_id, int(result["received"]))

    async def terminate(self) -> None:
        await self._call("terminate", TERMINATE_TIMEOUT, receipt=True)


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
                result = await bus.call(
                    self.worker_id,
                    "take",
                    {"lease": self.lease_id, "ack": self.acked, "wait": wait},
                    timeout=wait + worker_timeout(),
                )
            except Exception:  # HostUnreachable, LayerUnavailable: the stream ends
                self.end_reason = "gone"
                return None
            if result.get("end"):
                self.end_reason = (
                    "taken" if result.get("reason") == "taken" else "lost" if result.get("reason") else "ended"
                )
                return None
            self.acked = result["seq"]
            items: list[str] = result["items"]
            if items or (deadline is not None and loop.time() >= deadline):
                return Delivery(items, int(result["first"]))
        self.end_reason = "draining"
        return None

    def release(self, end: EndReason | None = None) -> None:
        """Give the lease back (the last batch taken was written). With `end`, the host ends the
        connection if this lease still holds its socket."""
        if self.lease_id in _active_readers:
            _active_readers.discard(self.lease_id)
            message: dict[str, Any] = {
                "type": "acp.op",
                "op": "release",
                "id": self.lease_id,
                "reply_to": inbox_channel(WORKER_ID),
                "lease": self.lease_id,
                "ack": self.acked,
            }
            if end is not None:
                message["close"] = end
            bus.post(inbox_channel(self.worker_id), message)


class RemoteSocket(RemoteStream):
    """A socket attached here to a connection hosted by another worker: a lease on the host's
    socket outbox, and the client's messages sent with it (the host drops them once the lease
    no longer holds the socket)."""

    def __init__(self, handle: RemoteHandle, lease_id: str, received: int) -> None:
        super().__init__(handle.worker_id, lease_id, "")
        self.handle = handle
        self.received = received

    async def send_to_agent(self, text: str) -> None:
        result = await self.handle._call("submit", SUBMIT_TIMEOUT, receipt=True, text=text, socket=self.lease_id)
        if result.get("error") == "closed":
            raise AgentClosed("connection ended")

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

    async def take(self, wait: float, ack: int) -> dict[str, Any]:
        self.acknowledge(ack)
        if self.in_flight:  # the reader did not get the last batch: send it again
            return {"items": self.in_flight, "first": self.in_flight.first_seq, "seq": self.seq}
        self._disarm()
        self.taking = True
        try:
            items = await self.mailbox.take(wait, MAX_TAKE_BYTES, holder=self)
        finally:
            self.taking = False
        if self.ended and items:  # released while we waited: these items belong to the next reader
            if self.holding:
                self.mailbox.requeue(items)
            return {"end": True}
        if items is None or self.ended:
            taken = not self.ended and not self.holding
            self.end()
            return {"end": True, "reason": "taken"} if taken else {"end": True}
        self._arm()
        if items:
            self.seq += 1
            self.in_flight = items
        return {"items": items, "first": items.first_seq, "seq": self.seq}

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
        result = await bus.call(lease.reader_worker, "probe", {"lease": lease.lease_id}, timeout=worker_timeout())
    except Exception:
        return False
    return bool(result.get("alive"))


def _target(message: dict[str, Any]) -> ConnectionHost | None:
    """The host an op names, if the caller's principal owns it (else it is "unknown")."""
    try:
        principal = Principal.from_wire(message["principal"])
    except (KeyError, TypeError, ValueError):
        return None  # a caller that names no principal owns nothing
    return owned_host(message["connection"], principal)


async def serve_submit(message: dict[str, Any]) -> dict[str, Any]:
    host = _target(message)
    if host is None:
        return {"error": "unknown"}
    if "socket" in message:  # a client message on a socket attached on another worker
        lease = _leases_on_host.get(message["socket"])
        try:
            counted = await host.receive_from_socket(message["text"], lease if lease is not None else object())
        except AgentClosed:
            return {"error": "closed"}
        return {"ok": True, "counted": counted}
    routes = [(key, stream) for key, stream in message["routes"]]
    # The edge applied the batch-size limit; a big batch is classified in slices here too.
    frame = await protocol.read_frame(message["text"])
    plan = InboundPlan(frame, routes, message["sessions"], message["header"])
    try:
        await host.submit(plan)
    except SessionHeaderError as error:
        return {"error": "session", "text": str(error)}
    except TooManyRequests as error:
        return {"error": "pending", "limit": error.limit}
    except AgentClosed:
        return {"error": "closed"}
    return {"ok": True}


async def serve_reply(message: dict[str, Any]) -> dict[str, Any]:
    host = _target(message)
    if host is None:
        return {"error": "unknown"}
    try:
        host.reply_from_transport(message["text"])
    except AgentClosed:
        return {"error": "closed"}
    return {"ok": True}


async def serve_lease(message: dict[str, Any]) -> dict[str, Any]:
    host = _target(message)
    if host is None:
        return {"error": "unknown"}
    if message.get("socket"):
        return _lease_socket(host, message)
    resume: str | None = message.get("resume")
    try:
        if resume is None:
            await release_if_reader_gone(host.stream_for_reader(message["stream"]))
        # Looked up again: a stream released empty just now was forgotten (a new one is made).
        mailbox = host.stream_for_reader(message["stream"])
        lease = LeaseOnHost(message["lease"], message["reader"], mailbox, host)
        StreamLease(mailbox, resume, holder=lease)
    except StreamBusy:
        return {"error": "busy"}
    except TooManyStreams as error:
        return {"error": "streams", "limit": error.limit}
    except ReplayUnavailable as refused:
        return {"error": "replay", "reason": refused.reason, "event": refused.event_id}
    lease.start()
    return {"ok": True, "tag": mailbox.tag}


def _lease_socket(host: ConnectionHost, message: dict[str, Any]) -> dict[str, Any]:
    """A socket reattached on another worker takes the connection's socket outbox over."""
    lease = LeaseOnHost(message["lease"], message["reader"], host.socket_outbox, host)
    try:
        received = host.attach_socket(int(message["resume"]), lease)
    except StreamBusy:
        return {"error": "busy"}
    except ReplayUnavailable as refused:
        return {"error": "replay", "reason": refused.reason, "event": refused.event_id}
    except AgentClosed:
        return {"error": "closed"}
    lease.start()
    return {"ok": True, "received": received}


async def serve_take(message: dict[str, Any]) -> dict[str, Any]:
    lease = _leases_on_host.get(message["lease"])
    if lease is None:
        return {"end": True, "reason": "lost"}
    return await lease.take(float(message["wait"]), int(message["ack"]))


async def serve_release(message: dict[str, Any]) -> None:
    lease = _leases_on_host.get(message["lease"])
    if lease is not None:
        lease.acknowledge(int(message["ack"]))
        end = message.get("close")
        if end in SOCKET_END_REASONS and lease.holding:
            await lease.host.detach_socket(lease, end)
        lease.end()


async def serve_terminate(message: dict[str, Any]) -> dict[str, Any]:
    host = _target(message)
    if host is None:
        return {"error": "unknown"}
    await host.terminate("delete")
    return {"ok": True}


async def serve_probe(message: dict[str, Any]) -> dict[str, Any]:
    return {"alive": message["lease"] in _active_readers}


bus.handle("submit", serve_submit)
bus.handle("reply", serve_reply)
bus.handle("lease", serve_lease)
bus.handle("take", serve_take)
bus.handle("release", serve_release)
bus.handle("terminate", serve_terminate)
bus.handle("probe", serve_probe)

#: What the edges use: finding and opening connections, and the errors they answer.
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
    "locate",
    "open_connection",
]
