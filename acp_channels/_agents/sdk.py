"""Host an agent written with the official Python SDK (`acp`) in-process.

The SDK's connection handles one JSON-RPC message at a time: an array crashes it and it ignores
`$/cancel_request`. This adapter gives such an agent the whole transport contract:
- batches are split, dispatched entry by entry, and their replies regrouped into one array in
  entry order (docs/wire-contract.md §7.1); notification-only batches get no reply; malformed input gets the
  reference's -32700 / -32600 replies. A big batch is dispatched and regrouped in slices
  (`protocol.SLICE_ENTRIES`) that let other connections run in between;
- every client request gets a private integer id on its way in, so duplicate or colliding client
  ids, batch slots and reply id types (1 vs "1") are all handled here, and restored on the way out;
- `$/cancel_request` cancels the handler task of that request and answers it with -32800, unless
  the agent answered first.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from acp.agent.connection import AgentSideConnection
from acp.exceptions import RequestError
from pydantic import ValidationError

from acp_channels import _protocol as protocol
from acp_channels._agents.channel import AgentClosed, FrameSink, RoomWaiter
from acp_channels._handoff import HandoffQueue
from acp_channels._protocol import Batch, Frame, Malformed, MalformedEntry, Message, Single

logger = logging.getLogger("acp_channels.agents.sdk")

#: The private id of the request whose handler task is being created. The SDK creates one task
#: per request right after our transport's receive() returns it, and a task copies the context
#: it is created in, so the handler can find its own id here.
_dispatching: contextvars.ContextVar[int | None] = contextvars.ContextVar("acp_dispatching", default=None)

Handler = Callable[[str, Any, bool], Awaitable[Any]]


@dataclass(slots=True)
class _BatchReply:
    """Slots for the response-bearing entries of one client batch, added while it is dispatched.

    Replies to early slices can arrive while later slices are still being dispatched: the
    batch is due only once it is fully dispatched and no slot is missing.
    """

    slots: list[Message | None] = field(default_factory=list)
    missing: int = 0
    dispatching: bool = True

    def add_slot(self) -> int:
        self.slots.append(None)
        self.missing += 1
        return len(self.slots) - 1

    @property
    def due(self) -> bool:
        return not self.dispatching and self.missing == 0


@dataclass(slots=True)
class _InFlight:
    client_id: Any
    batch: _BatchReply | None = None
    slot: int = 0
    task: asyncio.Task[Any] | None = field(default=None, repr=False)


class SdkAgentChannel:
    """An `acp` SDK agent object run on an in-memory message transport."""

    def __init__(self, agent: Any, *, outbound_frames: int = 64) -> None:
        self._inbox: HandoffQueue[Message | None] = HandoffQueue()
        self._outbox: HandoffQueue[Frame | None] = HandoffQueue(maxsize=outbound_frames)
        self._ids = itertools.count(1)
        self._in_flight: dict[int, _InFlight] = {}
        self._closed = False
        self._ended = False
        #: Where frames go without the outbox queue while nothing waits in it (direct_sink).
        self._sink: FrameSink | None = None
        self._room: RoomWaiter | None = None
        self._connection = AgentSideConnection(agent, _SdkTransport(self), listening=False, use_unstable_protocol=True)
        inner: Handler = self._connection._conn._handler
        self._connection._conn._handler = self._wrap_handler(inner)
        self._task = asyncio.create_task(self._run(), name="acp-channels.sdk-agent")

    # -- AgentChannel ------------------------------------------------------------------------

    async def send(self, frame: Frame) -> None:
        if self._closed:
            raise AgentClosed("agent closed")
        if isinstance(frame, Malformed):
            await self._reply_malformed(frame)
        elif isinstance(frame, Single):
            message = frame.message
            if protocol.message_kind(message) == "request":
                self._deliver(self._track(message, None, 0))
            else:
                await self._forward_call_or_response(message)
        else:
            await self._send_batch(frame)

    async def receive(self) -> Frame | None:
        if self._ended and self._outbox.empty():
            return None
        return await self._outbox.get()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        with contextlib.suppress(Exception):
            await self._connection._conn.close()
        if not self._ended:  # cancelled before it ever ran: its finally did not mark the end
            self._ended = True
            with contextlib.suppress(asyncio.QueueFull):
                self._outbox.put_nowait(None)

    # -- inbound -----------------------------------------------------------------------------

    async def _reply_malformed(self, frame: Malformed) -> None:
        if frame.error["error"]["code"] == protocol.INVALID_REQUEST:
            with contextlib.suppress(ValueError):
                if protocol.is_response_shaped(json.loads(frame.raw)):
                    return  # an invalid response gets no reply (§12)
        await self._emit(Single(frame.error))

    async def _send_batch(self, frame: Batch) -> None:
        reply = _BatchReply()
        for start in range(0, len(frame.entries), protocol.SLICE_ENTRIES):
            if start:
                await asyncio.sleep(0)  # a slice at a time: other connections run in between
                if self._closed:
                    raise AgentClosed("agent closed")
            for entry in frame.entries[start : start + protocol.SLICE_ENTRIES]:
                if isinstance(entry, MalformedEntry):
                    if not protocol.is_response_shaped(entry.value):
                        self._fill(reply, reply.add_slot(), protocol.invalid_request())
                elif protocol.message_kind(entry) == "request":
                    self._deliver(self._track(entry, reply, reply.add_slot()))
                else:
                    await self._forward_call_or_response(entry)
        reply.dispatching = False
        if reply.slots and reply.missing == 0:  # answered during dispatch, or all malformed
            await self._emit(await self._batch_frame(reply))

    def _track(self, message: Message, batch: _BatchReply | None, slot: int) -> Message:
        private_id = next(self._ids)
        self._in_flight[private_id] = _InFlight(message["id"], batch, slot)
        return {**message, "id": private_id}

    def _deliver(self, message: Message) -> None:
        self._inbox.put_nowait(message)

    async def _forward_call_or_response(self, message: Message) -> None:
        if protocol.is_connection_scoped(message):
            if message.get("method") == protocol.CANCEL_REQUEST_METHOD:
                await self._cancel_request(message.get("params"))
            return  # other `$/` notifications are transport-level; the SDK does not know them
        self._deliver(message)

    async def _cancel_request(self, params: Any) -> None:
        if not isinstance(params, dict) or "requestId" not in params:
            return
        wanted = protocol.id_key(params["requestId"])
        for private_id, pending in list(self._in_flight.items()):
            if protocol.id_key(pending.client_id) != wanted:
                continue
            if pending.task is not None:
                pending.task.cancel()
            cancelled = protocol.error_response(private_id, protocol.REQUEST_CANCELLED, "Request cancelled")
            await self._complete(private_id, cancelled)

    # -- outbound ----------------------------------------------------------------------------

    async def _complete(self, private_id: Any, reply: Message) -> None:
        """Record the reply to one client request; emit it, or its batch once that is due.

        Replies to requests already answered (cancelled) or unknown ids are dropped.
        """
        pending = self._in_flight.pop(private_id, None) if isinstance(private_id, int) else None
        if pending is None:
            return
        restored = {**reply, "id": pending.client_id}
        if pending.batch is None:
            await self._emit(Single(restored))
            return
        self._fill(pending.batch, pending.slot, restored)
        if pending.batch.due:
            await self._emit(await self._batch_frame(pending.batch))

    @staticmethod
    def _fill(reply: _BatchReply, slot: int, message: Message) -> None:
        reply.slots[slot] = message
        reply.missing -= 1

    @staticmethod
    async def _batch_frame(reply: _BatchReply) -> Batch:
        """The grouped reply, in entry order; a big one is put together a slice at a time."""
        return Batch(await protocol.run_in_slices(_regrouped(reply.slots)))

    def direct_sink(self, sink: FrameSink | None, room: RoomWaiter | None = None) -> None:
        """Hand the agent's frames to `sink` as they are emitted, on the agent's task, while the
        outbox queue is empty (so the order stays the emission order) and `sink` takes them
        (returns True); else they are queued for `receive` as before. Saves a queue hand-off
        and a task wake-up per message (bench/PROFILE.md). After each frame the sink took, the
        agent waits for `room`: the host counts a frame's bytes from the moment it takes it,
        and pauses the agent there while its budget is full."""
        self._sink = sink
        self._room = room

    def _sunk(self, frame: Frame) -> bool:
        """Whether the direct sink took `frame` (only while nothing waits in the outbox)."""
        sink = self._sink
        return sink is not None and self._outbox.empty() and sink(frame)

    async def _emit(self, frame: Frame) -> None:
        if not self._sunk(frame):
            await self._outbox.put(frame)
        elif self._room is not None:
            await self._room()

    # -- the SDK side ------------------------------------------------------------------------

    def _wrap_handler(self, inner: Handler) -> Handler:
        async def handler(method: str, params: Any, is_notification: bool) -> Any:
            private_id = _dispatching.get()
            if is_notification:
                return await self._notify(inner, method, params)
            if private_id is None:
                return await inner(method, params, is_notification)
            pending = self._in_flight.get(private_id)
            if pending is None:
                raise asyncio.CancelledError  # cancelled before its handler started
            pending.task = asyncio.current_task()
            return await inner(method, params, is_notification)

        return handler

    @staticmethod
    async def _notify(inner: Handler, method: str, params: Any) -> None:
        """A notification the agent refuses (unknown method, or params its schema rejects) gets
        no reply by JSON-RPC's rules; the SDK would log a traceback for each one, so any client
        could flood the log. A refusal is logged at debug level; the agent's own failures still
        surface."""
        try:
            await inner(method, params, True)
        except (RequestError, ValidationError) as error:
            logger.debug("notification %s refused by the agent: %s", method, str(error).splitlines()[0])

    async def _run(self) -> None:
        try:
            await self._connection.listen()
        except asyncio.CancelledError:
            pass
        except Exception:
            logger.exception("SDK agent connection failed")
        finally:
            self._ended = True
            with contextlib.suppress(asyncio.QueueFull):
                self._outbox.put_nowait(None)

    async def _next_for_sdk(self) -> Message | None:
        message = await self._inbox.get()
        is_request = message is not None and "method" in message and "id" in message
        _dispatching.set(message["id"] if is_request and message is not None else None)
        return message


def _regrouped(slots: list[Message | None]) -> protocol.Steps[list[protocol.BatchEntry]]:
    entries: list[protocol.BatchEntry] = []
    for start in range(0, len(slots), protocol.SLICE_ENTRIES):
        if start:
            yield
        entries.extend(slot for slot in slots[start : start + protocol.SLICE_ENTRIES] if slot is not None)
    return entries


class _SdkTransport:
    """The message transport the SDK connection reads from and writes to."""

    def __init__(self, channel: SdkAgentChannel) -> None:
        self._channel = channel

    async def send(self, message: dict[str, Any]) -> None:
        """A message the SDK connection wrote. A notification or agent request (most of a
        stream) goes out as it is, into the direct sink when it takes it: no further coroutine
        per message. A reply gets its client id back and joins its batch (`_complete`)."""
        channel = self._channel
        if "method" in message or "id" not in message:
            frame = Single(message)
            if not channel._sunk(frame):
                await channel._outbox.put(frame)
            elif channel._room is not None:
                await channel._room()
        else:
            await channel._complete(message["id"], message)

    async def receive(self) -> dict[str, Any] | None:
        return await self._channel._next_for_sdk()

    async def close(self) -> None:
        return None
