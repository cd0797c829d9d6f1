"""Connections of this process as the edges see them: `locate` (here, or through `remote` on
another worker), `open_connection` (admission), and direct handles on a local host."""

from __future__ import annotations

import asyncio

from acp_channels._agents.factory import create_agent_channel
from acp_channels._conf import acp_settings
from acp_channels._gateway.handles import (
    SUBMIT_TIMEOUT,
    HostHandle,
    SocketAttachment,
    SocketEnd,
    StreamReader,
    logger,
    owned_host,
)
from acp_channels._gateway.placement import PlacedConnection
from acp_channels._gateway.remote import RemoteHandle
from acp_channels._gateway.serve import release_if_reader_gone
from acp_channels._host import (
    ConnectionHost,
    Delivery,
    EndReason,
    InitializeReply,
    QuotaExceeded,
    ServerFull,
    registry,
)
from acp_channels._host.attachments import share
from acp_channels._host.tap import Role
from acp_channels._identity import Principal, TransportKind
from acp_channels._lifecycle import lifecycle
from acp_channels._protocol import Frame, InboundPlan, StreamKey
from acp_channels._worker import WORKER_ID, bus, new_connection_id, worker_of
from acp_channels.errors import AgentBusy, AgentNotStarted, NoSuchSession, ShuttingDown


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


def admission_refusal() -> ShuttingDown | ServerFull | None:
    """Why this worker would refuse a new connection now, whoever asks (None: it would take
    one). The principal's quota is checked at initialize only."""
    if lifecycle.draining:
        return ShuttingDown()
    return registry.full()


async def open_connection(
    transport: TransportKind, principal: Principal, remote_address: str | None
) -> NewConnection | PlacedConnection:
    """A new connection owned by `principal`: hosted here (AGENT_HOSTS "workers"), or placed on
    a runner (docs/runners.md). A WebSocket's is open when this returns; an HTTP one's once
    its `initialize` is answered (a runner is chosen then, with the initial frame).

    Raises ShuttingDown (this worker drains), QuotaExceeded, ServerFull, AgentNotStarted (see
    `open_here`; with runners: `PlacedConnection.open`)."""
    if lifecycle.draining:
        raise ShuttingDown
    if acp_settings.AGENT_HOSTS == "runners":
        placed = PlacedConnection(transport, principal, remote_address)
        if transport == "websocket":
            await placed.open()
        return placed
    return open_here(transport, principal, remote_address)


async def initialize_or_abandon(
    connection: NewConnection | PlacedConnection, frame: Frame, init_id: object, timeout: float | None
) -> InitializeReply:
    """The agent's reply to a new connection's `initialize`, waited for up to `timeout`. A
    connection whose initialize fails (an error, TimeoutError, or the caller cancelled: the
    client left) or is not accepted is abandoned first, so nothing remains of it; the exception
    goes on to the caller, who answers it."""
    try:
        async with asyncio.timeout(timeout):
            reply = await connection.initialize(frame, init_id)
    except BaseException:
        await asyncio.shield(connection.abandon())
        raise
    if not reply.accepted:
        await connection.abandon()
    return reply


def open_here(
    transport: TransportKind, principal: Principal, remote_address: str | None, connection_id: str | None = None
) -> NewConnection:
    """Admit and open a connection hosted by this process, owned by `principal`, with a new agent
    from the `AGENT` setting and the connection's limits from the settings.

    Raises ShuttingDown (this process drains), QuotaExceeded (the principal holds
    MAX_CONNECTIONS_PER_PRINCIPAL here), ServerFull (MAX_CONNECTIONS, MAX_STDIO_AGENTS or the
    output budget; its `reason` says which) or AgentNotStarted (the agent factory failed).
    """
    if lifecycle.draining:
        raise ShuttingDown
    connection_id = connection_id or new_connection_id()
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


def open_attachment_here(
    transport: TransportKind,
    principal: Principal,
    remote_address: str | None,
    connection_id: str,
    host_connection: str,
    session_id: str,
    role: Role,
    cursor: str | None = None,
) -> NewConnection:
    """Open an attachment: connection `connection_id` whose agent is a tap into session
    `session_id` of `host_connection`, hosted here (acp_channels._host.attachments). The caller
    checked that `principal` may attach to it as `role`.

    Raises ShuttingDown, NoSuchSession (the connection or the session is not live here),
    TooManyAttachments, ReplayUnavailable (`cursor`: not the session's, or what follows it is
    gone), QuotaExceeded, ServerFull."""
    if lifecycle.draining:
        raise ShuttingDown
    host = registry.get(host_connection)
    if host is None or host.ended.is_set() or host.attached_to is not None or session_id not in host.sessions:
        raise NoSuchSession
    tap = share(host).attach(session_id, role, principal, cursor)
    try:
        attachment = registry.create(
            tap.bind,
            transport,
            connection_id=connection_id,
            max_buffered_bytes=acp_settings.MAX_BUFFERED_BYTES,
            principal=principal,
            remote_address=remote_address,
            attached_to=host_connection,
        )
    except BaseException:
        tap.end()
        raise
    tap.on_cut_off = lambda: asyncio.ensure_future(attachment.terminate("fell behind"))
    bus.ensure_listening()
    return NewConnection(attachment)


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

    def start(self) -> None:
        """Start relaying the agent's output (a WebSocket connection's, before its socket)."""
        self.host.start()

    async def attach_first_socket(self) -> SocketAttachment:
        """Start relaying the agent's output to the WebSocket that opened the connection."""
        self.start()
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
            self.end_reason = "expired" if self.host.socket_outbox.eviction_of(self.holder) else "taken"
        return items

    async def send_to_agent(self, text: str) -> None:
        await self.host.receive_from_socket(text, self.holder)

    async def detach(self, end: EndReason | None = None) -> None:
        await self.host.detach_socket(self.holder, end)


# -- a host on another worker ------------------------------------------------------------------
