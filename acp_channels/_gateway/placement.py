"""Where a new connection's agent runs when AGENT_HOSTS is "runners": on a live runner with room,
the least loaded first (docs/runners.md).

Each runner publishes its load with its heartbeat (`Heartbeat.runner_loads`: connections, room,
draining); an edge reads that at most once per RUNNERS_FRESH per process, counts the
connections it placed since, and asks the runners in order of load with an `Open` op. A runner
that is full, draining, gone or too busy to take the call is skipped for the next one; when
none takes the connection the client gets 503 with Retry-After (ServerFull("runners")). The
connection's id names its runner, so every later request reaches it through `locate` like a
connection on another worker.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Final

from acp_channels import _protocol as protocol
from acp_channels._conf import acp_settings
from acp_channels._gateway.handles import TERMINATE_TIMEOUT, SocketAttachment, logger
from acp_channels._gateway.remote import RemoteHandle
from acp_channels._host import AgentEnded, InitializeReply, QuotaExceeded, ServerFull
from acp_channels._identity import Principal, TransportKind
from acp_channels._protocol import Frame
from acp_channels._worker import bus, layer_failure, new_connection_id, worker_timeout
from acp_channels._worker_protocol import (
    AgentFailed,
    Closed,
    Open,
    Opened,
    OpenRefused,
    Reply,
    Terminate,
    UnknownConnection,
    describe,
)
from acp_channels.errors import (
    DETACHED_QUOTA,
    AgentNotStarted,
    HostUnreachable,
    LayerUnavailable,
    NoSuchSession,
    ReplayUnavailable,
    ShuttingDown,
    TooManyAttachments,
    WorkerBusy,
    WorkerFailed,
)

#: How long an edge trusts the runners' published loads before reading them again.
RUNNERS_FRESH: Final = 0.5
#: An Open that waits for no agent (a WebSocket's) is answered within this many worker timeouts.
OPEN_TIMEOUTS: Final = 2


class RunnerView:
    """This process's picture of the runners: their published loads, plus what it placed since
    and what it is placing now (an Open in flight counts for its runner at once, so a burst of
    initializes spreads over the runners instead of all going to the one that looked emptiest)."""

    def __init__(self) -> None:
        self._loads: dict[str, dict[str, Any]] = {}
        self._read_at = -RUNNERS_FRESH
        self._placed: dict[str, int] = {}
        self._opening: dict[str, int] = {}
        self._reading: asyncio.Task[None] | None = None

    async def candidates(self) -> list[str]:
        """Live runners that said they have room, the least loaded first."""
        if time.monotonic() - self._read_at >= RUNNERS_FRESH:
            await self._read()
        open_to_us = [runner for runner, load in self._loads.items() if load.get("room") and not load.get("draining")]
        return sorted(open_to_us, key=lambda runner: self._connections(runner))

    async def _read(self) -> None:
        """Read the loads again, once for all the callers that find them stale: a burst of
        initializes shares one read (each one reading took every connection of the heartbeat's
        small pool, and the rest got 503). Shielded: a caller that leaves does not cancel the
        read the others wait for."""
        loop = asyncio.get_running_loop()
        reading = self._reading
        if reading is None or reading.done() or reading.get_loop() is not loop:
            reading = self._reading = loop.create_task(self._read_loads(), name="acp-runner-loads")
        await asyncio.shield(reading)

    async def _read_loads(self) -> None:
        started = time.monotonic()
        bus.ensure_listening()  # connects the heartbeat's reading client
        try:
            loads = await bus.heartbeat.runner_loads()
        except Exception as error:
            if not layer_failure(error):
                raise
            # Redis is down or out of reach: 503, try again (not a 500)
            raise LayerUnavailable(str(error) or type(error).__name__) from error
        self._loads, self._read_at, self._placed = loads, started, {}

    def _connections(self, runner: str) -> int:
        connections = self._loads[runner].get("connections", 0)
        published = connections if isinstance(connections, int) else 0
        return published + self._placed.get(runner, 0) + self._opening.get(runner, 0)

    def opening(self, runner: str) -> None:
        """An Open to `runner` is on its way: it counts there until `opened`."""
        self._opening[runner] = self._opening.get(runner, 0) + 1

    def opened(self, runner: str, placed: bool) -> None:
        """The Open to `runner` was answered (`placed`: with a connection there)."""
        left = self._opening.get(runner, 0) - 1
        if left > 0:
            self._opening[runner] = left
        else:
            self._opening.pop(runner, None)
        if placed:
            self._placed[runner] = self._placed.get(runner, 0) + 1

    def refused(self, runner: str) -> None:
        """The runner took no connection: not asked again until the loads are read again."""
        self._loads.pop(runner, None)


runners = RunnerView()


class PlacedConnection:
    """A new connection to be opened on a runner, as the edge that opens it uses it (the same
    surface as a connection opened here, `local.NewConnection`)."""

    def __init__(
        self,
        transport: TransportKind,
        principal: Principal,
        remote_address: str | None,
        *,
        target: str | None = None,
        attach: str | None = None,
    ) -> None:
        #: An attachment (`attach`, Open.attach) opens on `target`: the process hosting its session.
        self.target = target
        self.attach = attach
        self.transport = transport
        self.principal = principal
        self.remote_address = remote_address
        self.connection_id = ""
        self.runner = ""

    async def open(self, text: str | None = None, init_id: str | None = None) -> Opened:
        """Place the connection on the first runner that takes it. Raises ServerFull("runners")
        (none did), QuotaExceeded (every runner with room holds the principal's quota),
        AgentNotStarted, AgentEnded (the agent closed before answering initialize),
        LayerUnavailable or WorkerFailed."""
        timeout = (acp_settings.INITIALIZE_TIMEOUT or 24 * 3600.0) if text is not None else 0.0
        quota: QuotaExceeded | None = None
        for runner in [self.target] if self.target is not None else await runners.candidates():
            self.runner, self.connection_id = runner, new_connection_id(runner)
            op = Open(
                self.connection_id, self.principal, self.transport, self.remote_address, text, init_id, self.attach
            )
            runners.opening(runner)
            reply: Reply | None = None
            try:
                reply = await bus.call(runner, op, timeout=timeout + OPEN_TIMEOUTS * worker_timeout(), receipt=True)
            except (HostUnreachable, WorkerBusy) as error:  # gone, or too busy to take it: the next
                if isinstance(error, HostUnreachable) and self.target is not None:
                    raise NoSuchSession from error  # the process of the session is gone
                if self.target is not None:
                    raise
                logger.warning("runner %s did not take a new connection: %s", runner, error)
                runners.refused(runner)
                continue
            finally:
                runners.opened(runner, placed=isinstance(reply, Opened))
            if isinstance(reply, Opened):
                return reply
            if isinstance(reply, OpenRefused):
                if reply.reason in ("cursor-gone", "cursor-foreign") and self.attach is not None:
                    cursor = str(json.loads(self.attach).get("cursor"))
                    raise ReplayUnavailable("gone" if reply.reason == "cursor-gone" else "foreign", cursor)
                if self.target is not None:
                    raise open_refusal(reply)
                runners.refused(runner)
                if reply.reason in ("quota", "detached"):
                    quota = open_refusal(reply)  # type: ignore[assignment]
                continue
            if isinstance(reply, UnknownConnection):  # the session's connection ended meanwhile
                raise NoSuchSession
            if isinstance(reply, AgentFailed):  # nothing was made on the runner: nothing to abandon
                failed, self.connection_id = self.connection_id, ""
                raise AgentNotStarted(failed)
            if isinstance(reply, Closed):
                raise AgentEnded("agent closed before initialize response")
            raise WorkerFailed(op.name, describe(reply), reply)
        self.connection_id = ""
        if quota is not None:
            raise quota
        raise ServerFull("runners")

    async def initialize(self, frame: Frame, init_id: object) -> InitializeReply:
        """Place the connection with its initial frame and return the agent's reply to
        `init_id` (the runner waits for it)."""
        opened = await self.open(protocol.serialize_frame(frame), json.dumps(init_id))
        return InitializeReply(opened.body, opened.accepted)

    async def abandon(self) -> None:
        """The connection was never accepted: end it on its runner (if it got that far)."""
        if self.connection_id:
            try:
                await bus.call(self.runner, Terminate(self.connection_id, self.principal), timeout=TERMINATE_TIMEOUT)
            except Exception as error:  # it ends with its idle timeout at the latest
                logger.warning("connection %s: could not end it on its runner: %s", self.connection_id, error)

    async def attach_first_socket(self) -> SocketAttachment:
        """The WebSocket that opened the connection takes its runner's socket outbox."""
        return await RemoteHandle(self.runner, self.connection_id, self.principal).attach_socket(0)


def open_refusal(reply: OpenRefused) -> QuotaExceeded | TooManyAttachments | ServerFull | ShuttingDown:
    """The error a process's refusal to open a connection stands for."""
    if reply.reason == "draining":
        return ShuttingDown()
    if reply.reason == "quota":
        return QuotaExceeded(reply.limit)
    if reply.reason == "detached":
        return QuotaExceeded(reply.limit, DETACHED_QUOTA)
    if reply.reason == "attachments":
        return TooManyAttachments(reply.limit)
    return ServerFull(reply.reason)  # type: ignore[arg-type]


def refusal_reply(error: QuotaExceeded | TooManyAttachments | ServerFull) -> OpenRefused:
    """The other way: what a process answers an Open with when it refuses it."""
    if isinstance(error, QuotaExceeded):
        return OpenRefused("detached" if error.what == DETACHED_QUOTA else "quota", error.limit)
    if isinstance(error, TooManyAttachments):
        return OpenRefused("attachments", error.limit)
    return OpenRefused(error.reason)
