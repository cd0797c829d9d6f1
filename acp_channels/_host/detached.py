"""A connection whose own client is gone (docs/shared-sessions.md, "Detached connections").

The own client first gets the grace its transport promises: IDLE_TIMEOUT_SECONDS over HTTP (its
last request or stream read), WEBSOCKET_RESUME_SECONDS after its socket dropped. Within it, a
full budget pauses the agent as for a slow reader, so a client that comes back in time resumes
with nothing lost, however much the agent said meanwhile. Past it, the connection lives only
because of DETACHED_SECONDS: the agent goes on, and at a full budget the oldest output nobody
read goes instead (a resume from before it gets 409). The agent paused at the grace's end is
woken then to look again (`OwnClient.wait_for_room`). Other clients (attachments) have streams
of their own and do not count as the own client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from acp_channels._conf import acp_settings
from acp_channels._host.budget import OutboundBudget

if TYPE_CHECKING:
    from acp_channels._host.connection import ConnectionHost


class OwnClient:
    """When the connection's own client was last here, and what its absence allows."""

    def __init__(self, host: ConnectionHost, budget: OutboundBudget) -> None:
        self._host = host
        self._budget = budget
        #: Loop time of the own client's last request (HTTP; a socket's presence is its lease).
        self.last_request = asyncio.get_running_loop().time()
        self._nudge: asyncio.Future[None] | None = None

    def requested(self) -> float:
        """The own client sent something now; returns the loop time."""
        self.last_request = asyncio.get_running_loop().time()
        return self.last_request

    def socket_left(self) -> None:
        """No socket holds the outbox: the connection waits WEBSOCKET_RESUME_SECONDS (or
        DETACHED_SECONDS) for one to reattach (a reader on any worker), then ends as if its
        socket had closed."""
        host = self._host
        if host.transport != "websocket" or host.ended.is_set():
            return
        host.grace.start(
            detached_seconds(host, acp_settings.WEBSOCKET_RESUME_SECONDS),
            over=lambda: host.ended.is_set() or host.socket_outbox.leased,
            end=lambda: host.terminate("socket closed"),
        )

    def away(self, now: float) -> float | None:
        """Seconds the own client has been gone; None while it is here (its socket attached, a
        stream of its own read)."""
        host = self._host
        if host.transport == "websocket":
            started = host.grace.started
            return None if started is None else now - started
        mailboxes = host.mailboxes
        if any(mailbox.leased for mailbox in mailboxes):
            return None
        return now - max([self.last_request, *(mailbox.released_at for mailbox in mailboxes)])

    def grace_left(self, now: float) -> float | None:
        """Seconds until the own client's grace runs out (0: it has, or another client follows
        the connection's sessions: the agent goes on at that client's pace); None while the own
        client is here, or where its grace never runs out (HTTP without IDLE_TIMEOUT_SECONDS)."""
        grace = self._grace()
        away = self.away(now)
        if away is None:
            return None
        if self._host.shared is not None and self._host.shared.count:
            return 0.0
        return None if grace is None else max(0.0, grace - away)

    def _grace(self) -> float | None:
        if self._host.transport == "websocket":
            return float(acp_settings.WEBSOCKET_RESUME_SECONDS)
        timeout: float | None = acp_settings.IDLE_TIMEOUT_SECONDS
        return timeout

    def gone(self) -> bool:
        """Whether the own client's unread output may go now (`grace_left` is 0): its streams
        then drop their oldest unread output instead of pausing the agent."""
        return self.grace_left(asyncio.get_running_loop().time()) == 0

    def drop_check(self) -> Callable[[], bool] | None:
        """For the host's streams (`Mailbox.detached`); None (always pause): an attachment, which
        holds no agent, or a site without DETACHED_SECONDS."""
        if self._host.attached_to is not None or not acp_settings.DETACHED_SECONDS:
            return None
        return self.gone

    def others_came(self) -> None:
        """Another client attached: every wait paused for the own client looks again now."""
        if self._nudge is not None:
            self._nudge.set_result(None)
            self._nudge = None

    async def wait_for_room(self) -> None:
        """Return once the budget has room for the agent's next message. Once the own client
        is gone (`grace_left` 0) the oldest unread output makes room; until then the wait is
        cut at the grace's end (after a whole grace while the client is here; at once when
        another client attaches) to look again."""
        budget = self._budget
        if budget.has_room():  # nearly always: after every message of a streaming agent
            return
        if self.drop_check() is None:
            await budget.wait_for_room()
            return
        loop = asyncio.get_running_loop()
        while not budget.has_room():
            left = self.grace_left(loop.time())
            if left == 0:
                for mailbox in self._host.mailboxes:
                    mailbox.drop_oldest_unread()
                if not budget.has_room():  # the worker's budget is full: others must give way
                    await budget.wait_for_room()
                continue
            # One nudge for every waiter (the router and an SDK agent's tasks may all wait).
            if self._nudge is None:
                self._nudge = loop.create_future()
            room = asyncio.ensure_future(budget.wait_for_room())
            try:
                timeout = left if left is not None else self._grace() or None
                await asyncio.wait((room, self._nudge), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                room.cancel()


def kept_detached(host: ConnectionHost, now: float) -> bool:
    """Whether the host lives only because of DETACHED_SECONDS now: nobody attached for longer
    than IDLE_TIMEOUT_SECONDS (HTTP) or WEBSOCKET_RESUME_SECONDS (a socket's grace period)."""
    if host.attached_to is not None or host.attachments:
        return False
    if host.transport == "websocket":
        started = host.grace.started
        return started is not None and now - started > acp_settings.WEBSOCKET_RESUME_SECONDS
    idle_timeout = acp_settings.IDLE_TIMEOUT_SECONDS
    return idle_timeout is not None and host.idle_since(now) > idle_timeout


def detached_seconds(host: ConnectionHost, base: float) -> float:
    """How long a connection with nobody attached lives: `base` (WEBSOCKET_RESUME_SECONDS,
    IDLE_TIMEOUT_SECONDS), or DETACHED_SECONDS when longer (not for an attachment, which holds
    no agent; nor with `base` 0: ended with its client on purpose)."""
    detached: float = acp_settings.DETACHED_SECONDS
    return max(base, detached) if base and host.attached_to is None else base
