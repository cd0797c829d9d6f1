"""Outbound streams: per-stream mailboxes with sequence numbers, one reader at a time, and a
bounded replay window; the single stream of a WebSocket connection; a reader's lease."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections import deque
from collections.abc import Callable
from typing import Final

from acp_channels._handoff import LazyEvent
from acp_channels._host.budget import OutboundBudget
from acp_channels._journal import StreamJournal
from acp_channels._protocol import parse_event_id
from acp_channels.errors import ReplayUnavailable, StreamBusy

#: One take hands a reader at most about this much output (or one larger item), so what the
#: server holds for a slow socket is bounded by a batch, not by everything queued.
TAKE_BYTES: Final = 256 * 1024
#: Forgotten streams a connection remembers the last event id of (see ConnectionHost._forgotten).
FORGOTTEN_STREAMS: Final = 1024


class Delivery(list[str]):
    """A batch a reader takes: serialized frames in order; `first_seq` is the first one's
    number on its stream (the next ones follow), for SSE ids and resumption."""

    __slots__ = ("first_seq",)

    def __init__(self, items: list[str], first_seq: int) -> None:
        super().__init__(items)
        self.first_seq = first_seq


class Mailbox:
    """One outbound stream: serialized frames in order, kept until a reader takes them.

    At most one reader holds the lease; releasing it keeps every item not yet taken. What a
    reader took stays counted in the budget until it comes back for more (it has written the
    batch) or releases the lease (written, or the client is gone). A closed mailbox with no
    reader can never be read: its items are dropped.

    Every item has a number on the stream (`seq`, from 1). Items a reader took stay in a replay
    window (at most `window_events` items and `window_bytes` bytes once written; counted in the
    budget): a reader that comes back naming the last one it got (`resume`) gets the rest again.
    """

    def __init__(
        self,
        budget: OutboundBudget,
        on_idle: Callable[[Mailbox], None] | None = None,
        *,
        window_events: int = 0,
        window_bytes: int = 0,
        tag: str | None = None,
        first_seq: int = 1,
        detached: Callable[[], bool] | None = None,
    ) -> None:
        self._items: deque[str] = deque()
        #: Whether the connection's own client is gone past its grace now; then, with the budget
        #: full, the oldest output nobody read goes instead of the agent waiting.
        self.detached = detached
        #: Loop time its last reader left (the own client's last presence, over HTTP).
        self.released_at = 0.0
        self._budget = budget
        self._in_flight = 0  # bytes of the reader's last batch, not yet confirmed written
        self._in_flight_count = 0
        self._on_idle = on_idle
        self._wakeup = LazyEvent()
        self._holder: object | None = None
        # The last reader sent away without the stream ending (`evict`), and why.
        self._evicted: tuple[object, str] | None = None
        self.closed = False
        #: Names this stream in its event ids; a stream made again after being forgotten has a new one.
        self.tag = tag if tag is not None else secrets.token_hex(4)
        self._head_seq = first_seq  # the number of _items[0] (the next item handed out)
        self._sent: deque[str] = deque()  # items handed out, up to _head_seq - 1
        self._sent_bytes = 0
        self._window_events = window_events
        self._window_bytes = window_bytes
        self.last_read = 0.0  # loop time of the last take: the stream least recently read goes first
        #: On a runner: the window's copy in Redis, which any web worker resumes from.
        self.journal: StreamJournal | None = None
        if window_events > 0 and window_bytes > 0:
            budget.windows.add(self)
            if budget.worker is not None:
                budget.worker.windows.add(self)

    def push(self, item: str) -> None:
        if self.closed and self._holder is None:
            return  # nobody can read it any more
        self._items.append(item)
        self._budget.add(len(item))
        self._wakeup.set()
        if self._holder is None and not self._budget.has_room():
            self.drop_oldest_unread()

    def drop_oldest_unread(self) -> None:
        """Forget the oldest output nobody read while the budget is full (the newest item stays):
        a reader resuming from before it gets 409. Only with nobody reading, and only where the
        connection's own client is gone past its grace (`detached`; acp_channels/_host/detached.py)."""
        if self._holder is not None or self.detached is None or not self.detached():
            return
        self._budget.reclaim()  # replay windows give way first
        items = self._items
        while len(items) > 1 and not self._budget.has_room():
            if self._sent:  # older than anything unread: a resume from it could not continue
                self._budget.release(self._sent_bytes)
                self._sent.clear()
                self._sent_bytes = 0
                if self.journal is not None:
                    self.journal.delete()
            self._budget.release(len(items.popleft()))
            self._head_seq += 1

    def kept_since(self, after_seq: int = 0) -> list[tuple[int, str]]:
        """What this stream still holds after item `after_seq`, in order, with each item's
        number: its replay window, then what is unread."""
        first = self._head_seq - len(self._sent)
        kept = [*self._sent, *self._items]
        skip = max(0, after_seq + 1 - first)
        return [(first + index, item) for index, item in enumerate(kept) if index >= skip]

    @property
    def next_seq(self) -> int:
        """The number the next item pushed will have."""
        return self._head_seq + len(self._items)

    def check_cursor(self, seq: int, shown: str) -> None:
        """ReplayUnavailable unless everything after item `seq` is still held."""
        if seq >= self.next_seq:
            raise ReplayUnavailable("foreign", shown)
        if seq < self._head_seq - len(self._sent) - 1:
            raise ReplayUnavailable("gone", shown)

    def close(self) -> None:
        self.closed = True
        self._wakeup.set()
        self._drop_if_unreadable()

    @property
    def leased(self) -> bool:
        return self._holder is not None

    @property
    def holder(self) -> object | None:
        return self._holder

    @property
    def empty(self) -> bool:
        """Nothing queued and nothing in a reader's hands."""
        return not self._items and not self._in_flight_count

    @property
    def has_window(self) -> bool:
        """Delivered items are kept for a reader that may resume."""
        return bool(self._sent)

    @property
    def last_sent_seq(self) -> int:
        """The number of the last item handed to a reader (0: none yet)."""
        return self._head_seq - 1

    def acquire(self, holder: object | None = None) -> object:
        """Take the reader lease; the token returned (`holder`, or a new object) releases it."""
        if self._holder is not None:
            raise StreamBusy
        self._holder = token = holder if holder is not None else object()
        return token

    def take_over(self, holder: object | None = None) -> object:
        """Take the lease from the reader holding it (one that vanished without the server
        noticing): its batch counts as delivered, its next take ends its stream."""
        self.settle()
        self._holder = None
        self._wakeup.set()  # a take waiting for items sees it lost the lease
        return self.acquire(holder)

    def evict(self, reason: str) -> bool:
        """Send the reader away without ending the stream (its connection's credential expired):
        its next take returns None, and `eviction_of` its holder gives `reason`. What it took
        counts as delivered and stays in the replay window (a reader resuming after it gets it
        again), what is queued waits for the next reader: as when a reader leaves. False when
        nobody reads."""
        holder = self._holder
        if holder is None:
            return False
        self._evicted = (holder, reason)
        self.release(holder)
        self._wakeup.set()  # a take waiting for items sees it lost the lease
        return True

    def eviction_of(self, holder: object) -> str | None:
        """Why `holder` was sent away (`evict`), if it was the last reader sent away."""
        evicted = self._evicted
        return evicted[1] if evicted is not None and evicted[0] is holder else None

    def resume(self, last_seq: int, shown_id: str) -> None:
        """Hand out again everything after item `last_seq`, which the reader says it got.
        Raises ReplayUnavailable when that is not in the window (or was never sent)."""
        # The batch a vanished reader held counts as delivered, but is not trimmed away yet: it
        # may be exactly what this reader missed (trimming waits for the next settle).
        self._in_flight = self._in_flight_count = 0
        oldest_kept = self._head_seq - len(self._sent)
        if last_seq > self._head_seq - 1:
            raise ReplayUnavailable("foreign", shown_id)
        if last_seq < oldest_kept - 1:
            raise ReplayUnavailable("gone", shown_id)
        again = self._head_seq - 1 - last_seq
        for _ in range(again):
            item = self._sent.pop()
            self._sent_bytes -= len(item)
            self._items.appendleft(item)  # still counted in the budget: window -> queue
        self._head_seq -= again
        if again:
            self._wakeup.set()

    def requeue(self, items: list[str]) -> None:
        """Put items a reader took but never confirmed back at the front, in order."""
        for item in reversed(items):
            if self._sent and self._sent[-1] is item:
                self._sent.pop()
                self._sent_bytes -= len(item)
            else:  # forgotten from the window meanwhile: count it again
                self._budget.add(len(item))
            self._items.appendleft(item)
            self._head_seq -= 1
        self._in_flight = self._in_flight_count = 0
        if items:
            self._wakeup.set()
        self._drop_if_unreadable()

    def settle(self) -> None:
        """The reader's last batch is written (or will never be): it stays only as replay window."""
        if self._in_flight_count:
            self._in_flight = self._in_flight_count = 0
            self._trim_window()
            if not self._budget.has_room():  # the router may wait for room: windows beyond the limit give way
                self._budget.reclaim()

    def _trim_window(self) -> None:
        """Forget the oldest delivered items beyond the window's limits (never the batch in flight)."""
        sent, kept = self._sent, self._in_flight_count
        # Once a long stream fills its window, every take trims: the bounds are computed once.
        over_events = len(sent) - kept - self._window_events
        bytes_limit = self._window_bytes + self._in_flight
        sent_bytes = self._sent_bytes
        freed = 0
        while len(sent) > kept and (over_events > 0 or sent_bytes > bytes_limit):
            size = len(sent.popleft())
            sent_bytes -= size
            freed += size
            over_events -= 1
        if freed:
            self._sent_bytes = sent_bytes
            self._budget.release(freed)
            if self.journal is not None:
                self.journal.trim(self._head_seq - len(sent))

    @property
    def window_limits(self) -> tuple[int, int]:
        """The replay window's bounds: events, bytes."""
        return self._window_events, self._window_bytes

    @property
    def window_bytes(self) -> int:
        """Bytes kept only for a reader that may resume (delivered, not in flight)."""
        return self._sent_bytes - self._in_flight

    def forget_window(self) -> int:
        """Drop every delivered item except the batch in flight (the budget needs the room);
        returns the bytes freed."""
        freed = 0
        while len(self._sent) > self._in_flight_count:
            item = self._sent.popleft()
            self._sent_bytes -= len(item)
            freed += len(item)
        if freed:
            self._budget.release(freed)
            if self.journal is not None:
                self.journal.delete()  # a resume from before what is in flight starts over (409)
        return freed

    def release(self, token: object) -> None:
        if self._holder is not token:
            return
        self._holder = None
        self.released_at = asyncio.get_running_loop().time()
        self.settle()
        self._drop_if_unreadable()
        if self._on_idle is not None and self.empty:
            self._on_idle(self)

    def _drop_if_unreadable(self) -> None:
        if self.closed and self._holder is None and (self._items or self._sent):
            self._budget.release(sum(map(len, self._items)) + self._sent_bytes)
            self._items.clear()
            self._sent.clear()
            self._sent_bytes = self._in_flight = self._in_flight_count = 0
            if self.journal is not None:
                self.journal.delete()
                self.journal = None

    async def take(
        self, timeout: float | None, max_bytes: int = TAKE_BYTES, holder: object | None = None, *, settle: bool = True
    ) -> Delivery | None:
        """The next batch (at least one item, up to about `max_bytes`), waiting up to `timeout`.

        The reader coming back means its previous batch is written: that one stops counting
        (unless `settle` is False: a reader with several batches in flight calls `settle` once
        they are written). Returns an empty batch on timeout (time for a keep-alive) and None
        once the mailbox is closed and drained (the stream ends), or once `holder` lost the
        lease to another reader.
        """
        if holder is not None and holder is not self._holder:
            return None
        if settle:
            self.settle()
        if not self._items and not self.closed:
            self._wakeup.clear()
            # asyncio.timeout, not wait_for (which can swallow a cancellation on Python 3.11).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wakeup.wait()
            if holder is not None and holder is not self._holder:
                return None
        first_seq = self._head_seq
        if not self._items:
            return None if self.closed else Delivery([], first_seq)
        items: list[str] = []
        size = 0
        while self._items and (not items or size + len(self._items[0]) <= max_bytes):
            item = self._items.popleft()
            size += len(item)
            items.append(item)
        self._sent.extend(items)
        self._sent_bytes += size
        self._head_seq += len(items)
        if self.journal is not None:
            self.journal.append(first_seq, items, self._head_seq - len(self._sent))
        self._in_flight += size  # 0 before, unless batches in flight are not settled yet
        self._in_flight_count += len(items)
        self.last_read = asyncio.get_running_loop().time()
        return Delivery(items, first_seq)

    def __len__(self) -> int:
        return len(self._items)


class SocketOutbox(Mailbox):
    """The single stream of a WebSocket connection. Its reader is the socket attached now: the
    first one holds the lease from the start (`first_holder`, so output before its writer runs
    waits for it), a reattaching one takes it over (`ConnectionHost.attach_socket`). A release
    while the connection lives detaches the socket (`on_detach`: the host's grace period runs
    until a socket takes the lease again, `on_attach`)."""

    def __init__(
        self,
        budget: OutboundBudget,
        *,
        on_attach: Callable[[], None] | None = None,
        on_detach: Callable[[], None] | None = None,
        window_events: int = 0,
        window_bytes: int = 0,
    ) -> None:
        super().__init__(budget, window_events=window_events, window_bytes=window_bytes)
        self._on_attach = on_attach
        self._on_detach = on_detach
        self._first_took = False
        self.first_holder = self.acquire()

    def acquire(self, holder: object | None = None) -> object:
        token = super().acquire(holder)
        if self._on_attach is not None:
            self._on_attach()
        return token

    def release(self, token: object) -> None:
        if self._holder is not token:
            return
        super().release(token)
        if self._on_detach is not None:
            self._on_detach()

    async def take(
        self, timeout: float | None, max_bytes: int = TAKE_BYTES, holder: object | None = None, *, settle: bool = True
    ) -> Delivery | None:
        if holder is self.first_holder:
            self._first_took = True
        return await super().take(timeout, max_bytes, holder, settle=settle)

    def writer_never_started(self) -> None:
        """The first socket is gone before its writer took anything: nobody will read."""
        if not self._first_took:
            self.release(self.first_holder)


class StreamLease:
    """A reader's hold on one stream: take deliveries, release when the reader goes away.

    With `resume` (the SSE id of the last event the reader got) it takes the stream over from
    a reader still holding it, and the events after that id come first."""

    def __init__(self, mailbox: Mailbox, resume: str | None = None, holder: object | None = None) -> None:
        self._mailbox = mailbox
        self.tag = mailbox.tag
        if resume is None:
            self._token = mailbox.acquire(holder)
            return
        parsed = parse_event_id(resume)
        if parsed is None or parsed[0] != mailbox.tag:
            raise ReplayUnavailable("foreign", resume)
        mailbox.resume(parsed[1], resume)  # checked before the current reader is displaced
        self._token = mailbox.take_over(holder)

    async def take(self, timeout: float | None) -> Delivery | None:
        return await self._mailbox.take(timeout, holder=self._token)

    @property
    def end_reason(self) -> str:
        """Why `take` returned None: "expired" (the connection's credential), else "ended"."""
        return self._mailbox.eviction_of(self._token) or "ended"

    def release(self) -> None:
        self._mailbox.release(self._token)
