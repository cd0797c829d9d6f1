"""What a WebSocket connection keeps besides its outbox (acp_channels._host.mailbox.SocketOutbox).

`SocketInbox`: the client's messages, counted as they arrive (`Acp-Received` on a reattach) and
handed to the agent one at a time in that order, each in a task of its own so that a consumer
cancelled meanwhile (its socket is gone) cannot lose a message already counted.
`GracePeriod`: a socket that dropped leaves its connection alive for WEBSOCKET_RESUME_SECONDS,
for a new socket to reattach (docs/resumable-streams.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from acp_channels import _protocol as protocol
from acp_channels._protocol import Batch, Frame, Single
from acp_channels.errors import SessionHeaderError

logger = logging.getLogger("acp_channels.host")


class SocketInbox:
    def __init__(self) -> None:
        #: Client messages received on this connection's sockets so far.
        self.received = 0
        self._inbound = asyncio.Lock()
        self._deliveries: set[asyncio.Task[None]] = set()

    async def deliver(self, handle: Callable[[], Awaitable[None]]) -> None:
        """Count a message, then run `handle` (its delivery) after every message counted
        before it."""
        self.received += 1
        delivery = asyncio.ensure_future(self._in_order(handle))
        self._deliveries.add(delivery)
        delivery.add_done_callback(self._delivered)
        await asyncio.shield(delivery)

    async def _in_order(self, handle: Callable[[], Awaitable[None]]) -> None:
        async with self._inbound:  # FIFO: in the order the messages were counted
            await handle()

    def _delivered(self, delivery: asyncio.Task[None]) -> None:
        self._deliveries.discard(delivery)
        if not delivery.cancelled():
            delivery.exception()  # retrieved: a consumer cancelled meanwhile awaits it no more


class GracePeriod:
    """One timer at a time: `start` (again) restarts it; when it runs out, `end` runs unless
    `over` says the connection no longer needs ending (a socket reattached, or it ended)."""

    def __init__(self, connection_id: str) -> None:
        self._connection_id = connection_id
        self._timer: asyncio.TimerHandle | None = None
        self._ending: asyncio.Task[None] | None = None
        #: Loop time the running timer started at (None: none runs).
        self.started: float | None = None

    def start(self, seconds: float, over: Callable[[], bool], end: Callable[[], Awaitable[None]]) -> None:
        self.stop()
        self.started = asyncio.get_running_loop().time()
        self._timer = asyncio.get_running_loop().call_later(seconds, self._run_out, over, end)
        if seconds:
            logger.info("connection %s: socket detached; kept %g s for a reattach", self._connection_id, seconds)

    def stop(self) -> None:
        self.started = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _run_out(self, over: Callable[[], bool], end: Callable[[], Awaitable[None]]) -> None:
        self._timer = self.started = None
        if over():
            return
        logger.info("connection %s: no socket reattached in time; ending it", self._connection_id)
        self._ending = asyncio.ensure_future(end())
        self._ending.add_done_callback(self._log_failed_end)

    def _log_failed_end(self, ending: asyncio.Task[None]) -> None:
        if not ending.cancelled() and (error := ending.exception()) is not None:
            logger.error("ending connection %s failed", self._connection_id, exc_info=error)


async def socket_frame_refusal(frame: Frame, connection_id: str) -> Frame | None:
    """What HTTP checks before a message reaches the agent (§4.3 of docs/wire-contract.md): a
    session method names its session. A POST that does not is refused with 400; a socket's
    frame gets what this returns instead (None: it may go to the agent), and nothing of it
    reaches the agent: an error per request, one with `id: null` when it has none."""
    try:
        await protocol.plan_inbound_in_slices(frame, None)
    except SessionHeaderError:
        refused = SessionHeaderError(protocol.SESSION_PARAM_REQUIRED)  # a socket has no session header
    else:
        return None
    logger.info("connection %s: refused a WebSocket message: %s", connection_id, refused)
    messages = protocol.frame_messages(frame)
    ids = [message["id"] for message in messages if "method" in message and message.get("id") is not None]
    errors = [refused.rpc_error(request_id) for request_id in ids] or [refused.rpc_error(None)]
    return Batch(list[protocol.BatchEntry](errors)) if isinstance(frame, Batch) and ids else Single(errors[0])
