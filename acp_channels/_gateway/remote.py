"""Reaching a host on another worker through the channel layer: calls, SSE readers pushed to
by the host (`RemoteStream`), a socket attached here to a connection hosted there
(`RemoteSocket`), and the refusals a remote host answers turned into local exceptions."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import Awaitable
from typing import Any, NoReturn

from acp_channels import _journal
from acp_channels import _protocol as protocol
from acp_channels._agents.channel import AgentClosed
from acp_channels._conf import acp_settings
from acp_channels._gateway.handles import (
    SUBMIT_TIMEOUT,
    TERMINATE_TIMEOUT,
    R,
    SocketAttachment,
    SocketEnd,
    StreamReader,
    logger,
)
from acp_channels._host import (
    Delivery,
    EndReason,
    ReplayUnavailable,
    StreamBusy,
    TooManyRequests,
    TooManyStreams,
)
from acp_channels._identity import Principal
from acp_channels._lifecycle import lifecycle
from acp_channels._protocol import InboundPlan, SessionHeaderError, StreamKey
from acp_channels._worker import MAX_TAKE_BYTES, SLOW_WORKER_PATIENCE, TAKE_WAIT, WORKER_ID, bus, worker_timeout
from acp_channels._worker_protocol import (
    ACK_DELAY,
    PUSH_CREDIT_BATCHES,
    PUSH_CREDIT_BYTES,
    Acknowledge,
    Busy,
    Closed,
    Ended,
    ErrorReply,
    KeepAlive,
    Lease,
    Leased,
    LeaseSocket,
    Pushed,
    PushEnded,
    Release,
    ReplayRefused,
    Replied,
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
    describe,
)
from acp_channels.errors import HostUnreachable, LayerUnavailable, WorkerBusy, WorkerFailed

_lease_ids = itertools.count()
#: A socket's client messages the host may hold unanswered: the next one waits for its answer.
SOCKET_CREDIT_MESSAGES = 32
SOCKET_CREDIT_BYTES = 1024 * 1024
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
    raise WorkerFailed("a call", describe(refusal), refusal)


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
            raise WorkerFailed(op.name, describe(reply), reply)
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
        """A reader of the stream; one that resumes gets what the stream's journal in Redis
        holds after its cursor from here (a runner's connection), then the rest from the host."""
        parsed = None if resume is None else protocol.parse_event_id(resume)
        replay = None if parsed is None else await self._read_journal(key, *parsed)
        reader = RemoteStream(self.worker_id, self._new_lease())
        cursor = resume if replay is None else replay.cursor
        op = Lease(self.connection_id, self.principal, reader.lease_id, WORKER_ID, key, cursor)
        try:
            # The answer may wait for a probe of a stale reader.
            leased = await reader.leasing(self._call(op, 2 * worker_timeout(), Leased))
        except HostUnreachable:
            if replay is None:
                raise
            return JournalReader(replay)  # the runner is gone: what Redis kept of its output
        reader.tag = leased.tag
        if replay is not None:
            reader.replay(replay)
        return reader

    async def _read_journal(self, key: StreamKey, tag: str, after: int) -> _journal.Replay | None:
        """What the stream's journal holds after its message `after`; None when there is no
        journal to read (AGENT_HOSTS "workers", or Redis failed: the host answers)."""
        if acp_settings.AGENT_HOSTS != "runners":
            return None
        try:
            replay = await _journal.read(bus.layer, self.connection_id, self.principal, key, tag, after)
        except Exception as error:  # the host has the window too
            logger.debug("reading the journal of %s failed: %s", self.connection_id, error)
            return None
        if replay is not None:
            logger.info(
                "connection %s: resumed after %s-%d, %d messages from Redis",
                self.connection_id,
                tag,
                after,
                len(replay.items),
            )
        return replay

    async def attach_socket(self, last_seq: int) -> SocketAttachment:
        """The connection's socket outbox, from message `last_seq` on: what its journal in Redis
        holds from here (a runner's connection), the rest from the host."""
        replay = await self._read_journal(None, _journal.SOCKET_TAG, last_seq)
        socket = RemoteSocket(self, self._new_lease())
        resume = last_seq if replay is None else last_seq + len(replay.items)
        op = LeaseSocket(self.connection_id, self.principal, socket.lease_id, WORKER_ID, resume)
        leased = await socket.leasing(self._call(op, 2 * worker_timeout(), SocketLeased))
        socket.received = leased.received
        if replay is not None:
            socket.replay(replay)
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
        #: The last batch pushed (seq).
        self._pushed = 0
        #: Events read from the stream's journal, handed out before the first push.
        self._replayed: deque[Delivery] = deque()
        self._end: PushEnded | None = None
        self._arrived = asyncio.Event()
        self._ack_timer: asyncio.TimerHandle | None = None
        #: When the next KeepAlive is due (loop time), from the first take on.
        self._keep_alive_at: float | None = None
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
        elif push.seq > self._pushed:  # a second copy of a push (Bus.send) is dropped
            self._pushed = push.seq
            self._batches.append(push)
        self._arrived.set()

    async def take(self, timeout: float | None) -> Delivery | None:
        self._wrote(self.returned)  # coming back: the batch handed out last is written
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        # Kept across takes: an SSE keep-alive shorter than TAKE_WAIT ends every take first, and
        # a dead host would never be asked about.
        if self._keep_alive_at is None:
            self._keep_alive_at = loop.time() + TAKE_WAIT
        while not lifecycle.draining:  # a draining worker ends the streams it serves
            if self._replayed:
                self._returned_bytes = 0  # nothing the host pushed: nothing to acknowledge
                return self._replayed.popleft()
            if self._batches:
                batch = self._batches.popleft()
                self.returned = batch.seq
                self._returned_bytes = sum(map(len, batch.items))
                return Delivery(list(batch.items), batch.first)
            if self._end is not None:
                reason = self._end.reason
                self.end_reason = "ended" if not reason else "taken" if reason == "taken" else "lost"
                if reason == "expired":  # the host sent its readers away; the connection lives
                    self.end_reason = "expired"
                return None
            now = loop.time()
            if deadline is not None and now >= deadline:
                return Delivery([], 0)
            if now >= self._keep_alive_at:
                if not await self._keep_alive():
                    return None
                self._keep_alive_at = loop.time() + TAKE_WAIT
                continue
            self._arrived.clear()
            wait = self._keep_alive_at - now if deadline is None else min(self._keep_alive_at, deadline) - now
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):  # not wait_for: see liveness.reply_or_gone
                    await self._arrived.wait()
        self.end_reason = "draining"
        return None

    def replay(self, replay: _journal.Replay) -> None:
        """Hand out the events read from the journal first, in batches of at most about MAX_TAKE_BYTES."""
        self._replayed.extend(replay_batches(replay))

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


def replay_batches(replay: _journal.Replay) -> list[Delivery]:
    batches: list[Delivery] = []
    items: list[str] = []
    first, size = replay.after + 1, 0
    for item in replay.items:
        if items and size + len(item) > MAX_TAKE_BYTES:
            batches.append(Delivery(items, first))
            first, items, size = first + len(items), [], 0
        items.append(item)
        size += len(item)
    if items:
        batches.append(Delivery(items, first))
    return batches


class JournalReader:
    """A resuming SSE reader whose runner is gone: the events the journal kept after its
    cursor, then the end of the stream (a new request finds the connection gone: 404)."""

    def __init__(self, replay: _journal.Replay) -> None:
        self.tag = replay.tag
        self._batches = deque(replay_batches(replay))
        self.end_reason: SocketEnd = "gone"

    async def take(self, timeout: float | None) -> Delivery | None:
        return self._batches.popleft() if self._batches else None

    def release(self) -> None:
        self._batches.clear()


class RemoteSocket(RemoteStream):
    """A socket attached here to a connection hosted by another worker: a lease on the host's
    socket outbox, and the client's messages sent with it (the host drops them once the lease
    no longer holds the socket)."""

    def __init__(self, handle: RemoteHandle, lease_id: str) -> None:
        super().__init__(handle.worker_id, lease_id)
        self.handle = handle
        self.received = 0
        #: Messages (and their bytes) sent since the host last answered for them.
        self._unanswered = 0
        self._unanswered_bytes = 0

    async def send_to_agent(self, text: str) -> None:
        """Hand the host a client message. Most go unanswered (a message each way less per
        turn); every SOCKET_CREDIT_MESSAGES-th, or once SOCKET_CREDIT_BYTES are unanswered, is a
        call whose answer says every message before it reached the agent (the host serves them
        in order): what a socket holds on its way to the agent stays bounded, and the client's
        pace follows the agent's."""
        handle = self.handle
        op = SubmitOnSocket(handle.connection_id, handle.principal, text, self.lease_id)
        self._unanswered += 1
        self._unanswered_bytes += len(text)
        if self._unanswered < SOCKET_CREDIT_MESSAGES and self._unanswered_bytes < SOCKET_CREDIT_BYTES:
            await bus.send_unanswered(handle.worker_id, op)
            return
        self._unanswered = self._unanswered_bytes = 0
        await handle._call(op, SUBMIT_TIMEOUT, SocketSubmitted)

    async def detach(self, end: EndReason | None = None) -> None:
        self.release(end)


# -- serving the hosts of this process ---------------------------------------------------------
