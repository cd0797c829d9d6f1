"""Connection state: the only place it lives.

One `ConnectionHost` per ACP connection owns its agent, the reply routes recorded at POST time,
the outbound router and the per-stream mailboxes. The edges (views, consumer) talk to it through
a few message-shaped operations: submit a planned frame, initialize, lease a stream, take
deliveries, terminate. `Registry` maps connection ids to hosts in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from acp_channels import protocol
from acp_channels.agents import AgentChannel, AgentClosed
from acp_channels.protocol import Frame, InboundPlan, StreamKey
from acp_channels.worker import bus, new_connection_id

logger = logging.getLogger(__name__)

TransportKind = Literal["http", "websocket"]


class StreamBusy(Exception):
    """The stream already has a reader (409), or the connection has no such stream."""


class AgentEnded(Exception):
    """The agent ended before it answered initialize."""


class OutboundBudget:
    """Bytes a connection holds for its readers; the router waits while it is over the limit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._room = asyncio.Event()
        self._room.set()

    def add(self, size: int) -> None:
        self.used += size
        if self.used >= self.limit:
            self._room.clear()

    def release(self, size: int) -> None:
        self.used -= size
        if self.used < self.limit:
            self._room.set()

    async def wait_for_room(self) -> None:
        await self._room.wait()


class Mailbox:
    """One outbound stream: serialized frames in order, kept until a reader takes them.

    At most one reader holds the lease; releasing it keeps every item not yet taken.
    """

    def __init__(self, budget: OutboundBudget) -> None:
        self._items: deque[str] = deque()
        self._budget = budget
        self._wakeup = asyncio.Event()
        self._holder: object | None = None
        self.closed = False

    def push(self, item: str) -> None:
        self._items.append(item)
        self._budget.add(len(item))
        self._wakeup.set()

    def close(self) -> None:
        self.closed = True
        self._wakeup.set()

    @property
    def leased(self) -> bool:
        return self._holder is not None

    @property
    def holder(self) -> object | None:
        return self._holder

    def acquire(self, holder: object | None = None) -> object:
        """Take the reader lease; the token returned (`holder`, or a new object) releases it."""
        if self._holder is not None:
            raise StreamBusy
        self._holder = token = holder if holder is not None else object()
        return token

    def requeue(self, items: list[str]) -> None:
        """Put items a reader took but never confirmed back at the front, in order."""
        self._items.extendleft(reversed(items))
        self._budget.add(sum(map(len, items)))
        if items:
            self._wakeup.set()

    def release(self, token: object) -> None:
        if self._holder is token:
            self._holder = None

    async def take(self, timeout: float | None, max_bytes: int | None = None) -> list[str] | None:
        """What is queued (at least one item, up to about `max_bytes`), waiting up to `timeout`.

        Returns [] on timeout (time for a keep-alive) and None once the mailbox is closed and
        drained (the stream ends).
        """
        if not self._items and not self.closed:
            self._wakeup.clear()
            # asyncio.timeout, not wait_for (which can swallow a cancellation on Python 3.11).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wakeup.wait()
        if not self._items:
            return None if self.closed else []
        if max_bytes is None:
            items = list(self._items)
            self._items.clear()
        else:
            items, size = [], 0
            while self._items and (not items or size + len(self._items[0]) <= max_bytes):
                size += len(self._items[0])
                items.append(self._items.popleft())
        self._budget.release(sum(map(len, items)))
        return items

    def __len__(self) -> int:
        return len(self._items)


class StreamLease:
    """A reader's hold on one stream: take deliveries, release when the reader goes away."""

    def __init__(self, mailbox: Mailbox) -> None:
        self._mailbox = mailbox
        self._token = mailbox.acquire()

    async def take(self, timeout: float | None) -> list[str] | None:
        return await self._mailbox.take(timeout)

    def release(self) -> None:
        self._mailbox.release(self._token)


@dataclass(frozen=True, slots=True)
class InitializeReply:
    body: str
    accepted: bool


class ConnectionHost:
    """One ACP connection and its agent, in the process that accepted it."""

    def __init__(
        self,
        connection_id: str,
        agent: AgentChannel,
        transport: TransportKind,
        *,
        max_buffered_bytes: int,
        on_end: Callable[[ConnectionHost], None],
    ) -> None:
        self.connection_id = connection_id
        self.transport = transport
        self.agent = agent
        self._budget = OutboundBudget(max_buffered_bytes)
        self._streams: dict[StreamKey, Mailbox] = {}
        self._socket_outbox = Mailbox(self._budget)
        self._routes: dict[str, deque[StreamKey]] = {}
        # The stream each pending agent->client request went to, by id.
        self._agent_requests: dict[str, StreamKey] = {}
        self._router: asyncio.Task[None] | None = None
        self._on_end = on_end
        self.ended = asyncio.Event()
        self.last_active = asyncio.get_running_loop().time()

    # -- inbound -----------------------------------------------------------------------------

    async def submit(self, plan: InboundPlan) -> None:
        """Record the replies' routes, then queue the frame for the agent (raises AgentClosed).

        Routes exist before the agent can see the frame, so its reply is always routed right.
        """
        if self.ended.is_set():
            raise AgentClosed("connection ended")
        self.last_active = asyncio.get_running_loop().time()
        self._match_responses(plan)
        for session_id in plan.sessions:
            self.stream(session_id)
        if self.transport == "http":  # a WebSocket has one stream: nothing to route
            for key, route in plan.routes:
                self._routes.setdefault(key, deque()).append(route)
        await self.agent.send(plan.frame)

    def _match_responses(self, plan: InboundPlan) -> None:
        """Check the session header of responses to agent requests, then forget those requests."""
        answered = [
            protocol.id_key(message["id"]) for message in protocol.frame_messages(plan.frame) if "method" not in message
        ]
        for key in answered:
            protocol.check_response_session(plan.session_header, self._agent_requests.get(key, False))
        for key in answered:
            self._agent_requests.pop(key, None)

    async def initialize(self, frame: Frame, init_id: object) -> InitializeReply:
        """Forward an initial frame and wait for the reply to `init_id` (§5.2).

        Whatever else the agent sends meanwhile is routed to mailboxes for SSE. The router
        starts only once the connection is accepted.
        """
        await self.agent.send(frame)
        while True:
            output = await self.agent.receive()
            if output is None:
                raise AgentEnded("agent closed before initialize response")
            reply = protocol.find_reply(output, init_id)
            if reply is None:
                self._route(output)
                continue
            accepted = not protocol.is_error_response(reply)
            if accepted:
                self.start()
            return InitializeReply(protocol.serialize_frame(output), accepted)

    # -- replies the transport makes itself ---------------------------------------------------

    def reply_from_transport(self, text: str) -> None:
        """Queue a reply the transport made itself (to a refused batch) where the agent's
        answer to a malformed frame goes: the connection stream, or the socket. The agent
        never sees the input it answers. Raises AgentClosed once the connection has ended."""
        if self.ended.is_set():
            raise AgentClosed("connection ended")
        self.last_active = asyncio.get_running_loop().time()
        if self.transport == "websocket":
            self._socket_outbox.push(text)
        else:
            self.stream(protocol.CONNECTION_STREAM).push(text)

    # -- outbound ----------------------------------------------------------------------------

    def start(self) -> None:
        if self._router is None:
            self._router = asyncio.create_task(self._run_router(), name=f"acp-router-{self.connection_id}")

    def stream(self, key: StreamKey) -> Mailbox:
        """The mailbox of a stream, created on demand (§6.2)."""
        mailbox = self._streams.get(key)
        if mailbox is None:
            mailbox = self._streams[key] = Mailbox(self._budget)
            if self.ended.is_set():
                mailbox.close()
        return mailbox

    def stream_for_reader(self, key: StreamKey) -> Mailbox:
        """The mailbox an SSE reader leases. A WebSocket connection has no SSE streams: always
        busy (409), as in the reference."""
        if self.transport == "websocket":
            raise StreamBusy
        return self.stream(key)

    def lease(self, key: StreamKey) -> StreamLease:
        """Take the single-reader lease on an SSE stream; StreamBusy when it is taken (409)."""
        return StreamLease(self.stream_for_reader(key))

    @property
    def socket_outbox(self) -> Mailbox:
        return self._socket_outbox

    async def _run_router(self) -> None:
        try:
            while True:
                await self._budget.wait_for_room()
                frame = await self.agent.receive()
                if frame is None:
                    break
                self._route(frame)
        except asyncio.CancelledError:
            return  # terminate() owns the cleanup
        except Exception:
            logger.exception("router of connection %s failed", self.connection_id)
        self._end()

    def _route(self, frame: Frame) -> None:
        if self.transport == "websocket":
            self._socket_outbox.push(protocol.serialize_frame(frame))
            return
        key = protocol.route_outbound(frame, self._pop_route)
        for message in protocol.frame_messages(frame):
            if "method" in message and message.get("id") is not None:
                self._agent_requests[protocol.id_key(message["id"])] = key
        self.stream(key).push(protocol.serialize_frame(frame))

    def _pop_route(self, key: str) -> StreamKey | Literal[False]:
        routes = self._routes.get(key)
        if not routes:
            return False
        route = routes.popleft()
        if not routes:
            del self._routes[key]
        return route

    # -- lifetime ----------------------------------------------------------------------------

    def idle_since(self, now: float) -> float:
        """Seconds without POSTs and without any stream reader (a reader keeps it alive)."""
        if self.transport == "websocket" or any(mailbox.leased for mailbox in self._streams.values()):
            self.last_active = now  # the socket or a reader is there: not idle
        return now - self.last_active

    def _end(self) -> None:
        """Close every stream (readers drain what is queued, then end) and unregister."""
        if self.ended.is_set():
            return
        self.ended.set()
        for mailbox in self._streams.values():
            mailbox.close()
        self._socket_outbox.close()
        self._on_end(self)

    async def terminate(self) -> None:
        """End the connection now (DELETE, socket closed, failed initialize): abortive (§10)."""
        self._end()
        if self._router is not None:
            self._router.cancel()
        await self.agent.close()


class Registry:
    """The connections hosted by this process, by id."""

    def __init__(self) -> None:
        self._hosts: dict[str, ConnectionHost] = {}
        self._reaper: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._hosts)

    def get(self, connection_id: str) -> ConnectionHost | None:
        return self._hosts.get(connection_id)

    def create(
        self, agent_factory: Callable[[str], AgentChannel], transport: TransportKind, *, max_buffered_bytes: int
    ) -> ConnectionHost:
        """A new connection with a new agent (the factory gets the connection id, for logging)."""
        connection_id = new_connection_id()
        bus.ensure_listening()  # other workers must be able to reach this host
        host = ConnectionHost(
            connection_id,
            agent_factory(connection_id),
            transport,
            max_buffered_bytes=max_buffered_bytes,
            on_end=self._forget,
        )
        self._hosts[connection_id] = host
        self._ensure_reaper()
        return host

    def _ensure_reaper(self) -> None:
        from acp_channels.conf import acp_settings

        timeout: float | None = acp_settings.IDLE_TIMEOUT_SECONDS
        loop = asyncio.get_running_loop()
        if timeout is None or (
            self._reaper is not None and not self._reaper.done() and self._reaper.get_loop() is loop
        ):
            return
        self._reaper = loop.create_task(self._reap(float(timeout)), name="acp-idle-reaper")

    async def _reap(self, timeout: float) -> None:
        """End connections nobody uses: no POST and no stream reader for `timeout` seconds
        (a client that vanished without DELETE would otherwise keep its agent forever)."""
        loop = asyncio.get_running_loop()
        while self._hosts:
            await asyncio.sleep(min(timeout / 2, 30.0))  # a sweep interval, not a wait for an event
            now = loop.time()
            for host in list(self._hosts.values()):
                if host.idle_since(now) > timeout:
                    logger.info("connection %s idle for %.0f s: ending it", host.connection_id, timeout)
                    await host.terminate()

    def _forget(self, host: ConnectionHost) -> None:
        if self._hosts.get(host.connection_id) is host:
            del self._hosts[host.connection_id]

    async def terminate_all(self) -> None:
        for host in list(self._hosts.values()):
            await host.terminate()


registry = Registry()
