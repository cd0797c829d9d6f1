"""Output budgets: bytes a connection holds for its readers, and their sum over the worker.

While either is at its limit the connection's agent waits (backpressure: nothing is dropped), and
the worker takes no new connection. Replay windows count too, but give way first.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from acp_channels._host.mailbox import Mailbox


def _wake(waiters: set[asyncio.Future[None]]) -> None:
    for waiter in waiters:
        if not waiter.done() and not waiter.get_loop().is_closed():
            waiter.set_result(None)


class WorkerBudget:
    """Undelivered output summed over every connection of this process. While it is at its
    limit every router waits, and no new connection is accepted."""

    def __init__(self, limit: Callable[[], int]) -> None:
        self._limit = limit  # read at use time: settings may change (tests)
        self.used = 0
        #: Bytes of client requests handed to agents and not answered yet, every connection.
        self.requests_used = 0
        # Futures, not an Event: this object outlives event loops (one per test).
        self.waiters: set[asyncio.Future[None]] = set()
        #: Every mailbox holding a replay window, on every connection (weakly).
        self.windows: weakref.WeakSet[Mailbox] = weakref.WeakSet()

    def full(self) -> bool:
        return self.used >= self._limit()

    def add(self, size: int) -> None:
        self.used += size

    def release(self, size: int) -> None:
        self.used -= size
        if self.waiters and not self.full():
            _wake(self.waiters)


class OutboundBudget:
    """Bytes a connection holds for its readers; the router waits while it, or the worker's
    total, is at the limit (backpressure: nothing is dropped). Replay windows count too, but
    give way: before the router waits, the oldest delivered events are forgotten."""

    def __init__(self, limit: int, worker: WorkerBudget | None = None, window_limit: int = 0) -> None:
        self.limit = limit
        self.window_limit = window_limit
        self.used = 0
        self.worker = worker
        self._waiters: set[asyncio.Future[None]] = set()
        #: Mailboxes holding a replay window (weakly: a forgotten stream leaves by itself).
        self.windows: weakref.WeakSet[Mailbox] = weakref.WeakSet()

    def reclaim(self) -> None:
        """Make room by forgetting delivered events, least recently read streams first.

        The connection's windows together keep up to one window's worth (`window_limit`): the
        stream being read keeps what a dropped reader needs, and since E031 keeps a window below
        the budget, live output finds room as readers take it. Beyond that (several streams'
        windows) the others give way. While the worker is full, any connection's windows give
        way (a last resort: a reader resuming one of those gets 409)."""
        if self.used >= self.limit:
            held = sum(mailbox.window_bytes for mailbox in self.windows)
            for mailbox in sorted(self.windows, key=lambda mailbox: mailbox.last_read):
                if held <= self.window_limit or self.has_room():
                    break
                held -= mailbox.forget_window()
        if self.worker is not None and self.worker.full():
            for mailbox in sorted(self.worker.windows, key=lambda mailbox: mailbox.last_read):
                if not self.worker.full():
                    return
                mailbox.forget_window()

    def add(self, size: int) -> None:
        self.used += size
        if self.worker is not None:
            self.worker.add(size)

    def release(self, size: int) -> None:
        self.used -= size
        if self.worker is not None:
            self.worker.release(size)
        if self._waiters and self.used < self.limit:
            _wake(self._waiters)

    def has_room(self) -> bool:
        return self.used < self.limit and (self.worker is None or not self.worker.full())

    async def wait_for_room(self) -> None:
        """Return once both budgets have room. Woken by whichever budget was full when it
        frees bytes (no polling); the other one is checked again then."""
        while not self.has_room():
            self.reclaim()
            if self.has_room():
                return
            waiters = self._waiters if self.used >= self.limit or self.worker is None else self.worker.waiters
            waiter = asyncio.get_running_loop().create_future()
            waiters.add(waiter)
            try:
                await waiter
            finally:
                waiters.discard(waiter)
