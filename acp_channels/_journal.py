"""Output journals: each stream's replay window on a runner, copied to a Redis Stream, so that
any web worker serves a resume from Redis (docs/runners.md, "Output in Redis").

A runner's mailbox appends every batch it hands to a reader (`Mailbox.take`) to the stream's
journal: one Redis Stream per connection stream, `<prefix>acp.out:<connection>:<tag>:<digest>`,
entries of at most an eighth of the window (the batches a stream hands out while the writer
gathers join one), each with the id `<last seq>-0` (the SSE id `<tag>-<seq>` of its last event)
and the fields `f` (the first event's seq) and `d` (the events, msgpack). Each XADD, and each
trim of the window, drops the entries before the window's oldest event (MINID); the key expires
JOURNAL_TTL_SECONDS after an append (set again at most every TTL_REFRESH_SECONDS); the mailbox
deletes it when the stream can no longer be read (the connection ended) or forgets its window.
So Redis holds what the runner counts as the stream's replay window in the connection's budget,
plus at most an eighth: the same bounds in bytes and events (REPLAY_WINDOW_*).

The digest is of the owner (principal) and the stream's key: a web worker computes the key from
the request's principal, connection id, session header and Last-Event-ID, so what it finds is
that principal's and that stream's, and nothing else can be read with a guessed id.

Writes go through one task per process, in order, pipelined (many batches of many streams per
round trip); a failed write is retried until it lands, so a journal never has a hole, only a
tail that is not there yet (a reader resuming then gets the rest from the runner).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from acp_channels._conf import acp_settings
from acp_channels._identity import Principal
from acp_channels._protocol import StreamKey

if TYPE_CHECKING:
    from acp_channels._host.mailbox import Mailbox

logger = logging.getLogger("acp_channels.journal")

#: How long a journal outlives its last append when nobody deletes it (a runner killed outright):
#: what a client resuming then can still read of what the agent said last.
JOURNAL_TTL_SECONDS: Final = 3600
#: How long a failed write waits before it is tried again (Redis unreachable).
RETRY_SECONDS = 1.0
#: A journal's expiry is set again at most this often (and at its first append): a key that
#: Redis lost and an append made again goes without an expiry at most this long.
TTL_REFRESH_SECONDS: Final = 60.0
#: How long the writer lets appends gather before it writes them (one round trip for the
#: turns of many connections); a journal lags its runner by about this much.
GATHER_SECONDS: Final = 0.05
#: Entries one read asks for at a time.
READ_COUNT: Final = 512
#: The tag of a WebSocket connection's journal (its messages are numbered across its sockets;
#: a connection has either SSE streams or sockets, never both).
SOCKET_TAG: Final = "socket"


def _pack(items: list[str]) -> bytes:
    import msgpack  # the redis extra's: only a runner on the Redis layer journals

    data: bytes = msgpack.packb(items, use_bin_type=True)
    return data


def _unpack(data: bytes) -> list[str]:
    import msgpack

    items: list[str] = msgpack.unpackb(data, raw=False)
    return items


def journal_key(prefix: str, connection_id: str, principal: Principal, stream: StreamKey, tag: str) -> str:
    digest = hashlib.sha256(json.dumps([principal.kind, principal.id, stream]).encode()).hexdigest()[:24]
    return f"{prefix}acp.out:{connection_id}:{tag}:{digest}"


def _has_redis(layer: Any) -> bool:
    """Whether the layer is ours on Redis (it lends its redis-py client)."""
    return callable(getattr(layer, "redis", None))


def _redis_of(layer: Any) -> Any | None:
    """The layer's redis-py client for this event loop, or None (not our layer)."""
    return layer.redis() if _has_redis(layer) else None


def _prefix_of(layer: Any) -> str:
    """Where the layer's keys live (the journals' are next to them)."""
    prefix: str = getattr(layer, "key_prefix", "asgi:")
    return prefix


@dataclass
class _Append:
    key: str
    first: int
    last: int
    items: list[str]
    size: int
    oldest: int
    #: Set the key's expiry with this append.
    expire: bool
    #: Taken by the writer: nothing more may join it.
    sealed: bool = False


@dataclass
class _Trim:
    key: str
    oldest: int


@dataclass
class _Delete:
    key: str


_Op = _Append | _Trim | _Delete


class JournalWriter:
    """The writes of one process, in order, through one task."""

    def __init__(self, layer: Any) -> None:
        self.layer = layer
        self.prefix = _prefix_of(layer)
        self._queue: deque[_Op] = deque()
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        #: Writes that failed and wait to be tried again (for tests and logs).
        self.failures = 0

    def stream(
        self, connection_id: str, principal: Principal, stream: StreamKey, tag: str, upto: int, window: tuple[int, int]
    ) -> StreamJournal:
        """The journal of a stream whose last event handed out is `upto`, and whose replay window
        is `window` (events, bytes)."""
        return StreamJournal(self, journal_key(self.prefix, connection_id, principal, stream, tag), upto, window)

    def _put(self, op: _Op) -> None:
        queue = self._queue
        if isinstance(op, _Trim) and queue and isinstance(queue[-1], _Trim) and queue[-1].key == op.key:
            queue[-1] = op  # one trim to the newest window does for both
        else:
            queue.append(op)
        self._idle.clear()
        self._wakeup.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="acp-journal-writer")

    async def _run(self) -> None:
        while True:
            if not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
            await asyncio.sleep(GATHER_SECONDS)
            ops = list(self._queue)
            for op in ops:
                if isinstance(op, _Append):
                    op.sealed = True
            try:
                await self._write(ops)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                self.failures += 1
                if self.failures == 1 or self.failures % 60 == 0:
                    logger.warning("output journal: writing to Redis failed (%s); retrying", error)
                await asyncio.sleep(RETRY_SECONDS)
                continue
            self.failures = 0
            for _ in ops:
                self._queue.popleft()
            if not self._queue:
                self._idle.set()

    async def _write(self, ops: Sequence[_Op]) -> None:
        redis = _redis_of(self.layer)
        if redis is None:
            return
        ttl_ms = JOURNAL_TTL_SECONDS * 1000
        async with redis.pipeline(transaction=False) as pipe:
            for op in ops:
                if isinstance(op, _Delete):
                    pipe.unlink(op.key)
                    continue
                if isinstance(op, _Trim):
                    pipe.xtrim(op.key, minid=f"{op.oldest}-0", approximate=False)
                    continue
                fields = {"f": op.first, "d": _pack(op.items)}
                pipe.xadd(op.key, fields, id=f"{op.last}-0", minid=f"{op.oldest}-0", approximate=False)
                if op.expire:
                    pipe.pexpire(op.key, ttl_ms)
            replies = await pipe.execute(raise_on_error=False)
        for reply in replies:
            # An entry written by an attempt whose answer was lost: it is there, in order.
            if isinstance(reply, Exception) and "equal or smaller" not in str(reply):
                raise reply

    async def drain(self) -> None:
        """Wait until every write queued so far has landed (shutdown, tests)."""
        if self._task is not None and not self._task.done():
            await self._idle.wait()

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None


class StreamJournal:
    """One stream's journal, as its mailbox sees it: `upto` is the last seq queued for writing.

    A batch is written as entries of at most an eighth of the window (in events and in bytes),
    so trimming to the window's oldest event keeps at most an eighth more than the window."""

    __slots__ = ("_open", "chunk_bytes", "chunk_events", "expiry_set_at", "key", "upto", "writer")

    def __init__(self, writer: JournalWriter, key: str, upto: int, window: tuple[int, int]) -> None:
        self.writer = writer
        self.key = key
        self.upto = upto
        #: When an append last set the key's expiry (loop time); None: the next one does.
        self.expiry_set_at: float | None = None
        #: The entry this stream queued last (events may join it until the writer takes it).
        self._open: _Append | None = None
        self.chunk_events = max(1, window[0] // 8)
        self.chunk_bytes = max(1, window[1] // 8)

    def append(self, first_seq: int, items: Sequence[str], oldest_kept: int) -> None:
        """A batch handed to a reader; events already journaled (handed out again after a
        resume or a requeue) are not written twice. Events join the entry this stream queued
        last while the writer has not taken it and it has room (a turn's output after the
        last one's: one entry for the turns of a gathering)."""
        skip = self.upto + 1 - first_seq
        new = items[skip:] if skip > 0 else items
        if not new:
            return
        first = first_seq + max(skip, 0)
        self.upto = first + len(new) - 1
        now = asyncio.get_running_loop().time()
        expire = self.expiry_set_at is None or now - self.expiry_set_at >= TTL_REFRESH_SECONDS
        if expire:
            self.expiry_set_at = now
        entry = self._open
        for offset, item in enumerate(new):
            if (
                entry is None
                or entry.sealed
                or len(entry.items) >= self.chunk_events
                or entry.size + len(item) > self.chunk_bytes
            ):
                seq = first + offset
                entry = _Append(self.key, seq, seq - 1, [], 0, min(oldest_kept, seq), expire)
                expire = False
                self.writer._put(entry)
            entry.items.append(item)
            entry.size += len(item)
            entry.last += 1
        self._open = entry

    def trim(self, oldest_kept: int) -> None:
        """The window now starts at event `oldest_kept`."""
        self.writer._put(_Trim(self.key, oldest_kept))

    def delete(self) -> None:
        self.expiry_set_at = None  # an append after this makes the key again
        self._open = None
        self.writer._put(_Delete(self.key))


#: This process's writer, when its connections' output is journaled (a runner).
writer: JournalWriter | None = None


def enable(layer: Any) -> None:
    """Journal the output of the connections this process hosts (a runner), if the layer is ours
    and replay windows are on."""
    global writer
    if _has_redis(layer) and acp_settings.REPLAY_WINDOW_EVENTS > 0 and acp_settings.REPLAY_WINDOW_BYTES > 0:
        writer = JournalWriter(layer)


def attach(
    mailbox: Mailbox, connection_id: str, principal: Principal, stream: StreamKey, tag: str | None = None
) -> None:
    """Journal a new mailbox's output, when this process journals (a runner)."""
    if writer is not None:
        mailbox.journal = writer.stream(
            connection_id, principal, stream, tag or mailbox.tag, mailbox.last_sent_seq, mailbox.window_limits
        )


def disable() -> None:
    global writer
    if writer is not None:
        writer.stop()
    writer = None


@dataclass
class Replay:
    """Events a web worker read from a journal: `items` follow the client's cursor `after`."""

    tag: str
    after: int
    items: list[str]

    @property
    def cursor(self) -> str:
        """The SSE id of the last event read (where the runner takes over)."""
        return f"{self.tag}-{self.after + len(self.items)}"


async def read(
    layer: Any, connection_id: str, principal: Principal, stream: StreamKey, tag: str, after: int
) -> Replay | None:
    """The events after seq `after` that the stream's journal holds, in one unbroken run from
    `after + 1`; None when it holds none of them (nothing journaled yet, the cursor is older
    than what it keeps, or no such stream for this principal): the runner answers then."""
    redis = _redis_of(layer)
    if redis is None:
        return None
    key = journal_key(_prefix_of(layer), connection_id, principal, stream, tag)
    items: list[str] = []
    next_seq = after + 1
    start = f"{next_seq}-0"
    while True:
        entries = await redis.xrange(key, min=start, max="+", count=READ_COUNT)
        for entry_id, fields in entries:
            last = int(entry_id.split(b"-", 1)[0])
            first = int(fields[b"f"])
            if first > next_seq:
                return _replay(tag, after, items)  # a gap (trimmed): what came before it only
            batch = _unpack(fields[b"d"])
            items.extend(batch[next_seq - first :])
            next_seq = last + 1
        if len(entries) < READ_COUNT:
            return _replay(tag, after, items)
        start = f"{next_seq}-0"


def _replay(tag: str, after: int, items: list[str]) -> Replay | None:
    return Replay(tag, after, items) if items else None
