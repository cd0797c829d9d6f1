"""Reaching a connection's host from any worker process, through the channel layer.

Every worker process has an id and an inbox channel (`acp.worker.<id>`). A connection id carries
the id of the worker that hosts it (`<uuid4>.<worker id>`), so any worker can reach the host
without a lookup. Operations travel as request/response messages:

- a call with a receipt (`submit`, `lease`, ...) is answered with its result, or with a receipt
  first when the result is not ready at once (the host's worker took the call) and the result
  once it is (the agent may apply backpressure; that is not a failure).
- the host pushes a stream's batches to its reader on another worker, which acknowledges them,
  so nothing is lost when a reader's worker dies: the host puts unacknowledged batches back and
  a new reader gets them, in order. A new reader that finds the stream leased by a reader on
  another worker asks that worker (`probe`) whether the reader still exists, and takes the
  stream over if not.

Liveness comes from the heartbeat (`acp_channels._liveness`), never from latency: a late answer
is waited for while the other worker's heartbeat says it is alive. A dead worker is a 404 at
once (HostUnreachable); a live one too busy to take a call within SLOW_WORKER_PATIENCE is a 503
the client may retry (WorkerBusy): the call carries an `expires`, and a worker that finds it
later drops it unserved, so a retried request is not done twice.

Nothing here relies on `group_send` (which skips full members silently): every message that
matters is a direct send with a reply or a retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

from channels.exceptions import ChannelFull
from channels.layers import InMemoryChannelLayer, get_channel_layer

from acp_channels._liveness import Heartbeat, WorkerGone, reply_or_gone
from acp_channels._metrics import measured_call
from acp_channels._outbox import Outbox, unbatched
from acp_channels._worker_protocol import (
    RECEIPT_AFTER,
    ErrorReply,
    Internal,
    MalformedMessage,
    Op,
    Pushed,
    PushEnded,
    Reply,
    UnknownOp,
    decode_op,
    decode_push,
    decode_reply,
    describe,
    encode_op,
    encode_push,
    encode_receipt,
    encode_reply,
    expect,
    expired,
)
from acp_channels.errors import AgentBusy, HostUnreachable, LayerUnavailable, WorkerBusy

logger = logging.getLogger("acp_channels.worker")

WORKER_ID: Final = uuid.uuid4().hex[:12]
TAKE_WAIT: Final = 3.0  # longest a remote take waits on the host for new output
SEND_RETRY_SECONDS: Final = 5.0  # how long a send retries a full channel before giving up
#: A send that failed in Redis may still have landed (the reply was lost with the connection):
#: it is sent again, as is, after each of these delays; its receiver keeps only the first copy.
RESEND_DELAYS: Final = (0.05, 0.2)
#: How long a stopping process waits for the messages on their way out.
STOP_FLUSH_SECONDS: Final = 5.0
#: Calls served lately, by request id, so that a second copy of one is not served again.
SERVED_MEMORY: Final = 4096
MAX_TAKE_BYTES: Final = 1024 * 1024  # one take reply carries at most about this much output


def worker_timeout() -> float:
    """How long a live worker may take to acknowledge a call (WORKER_TIMEOUT_SECONDS): past it,
    the worker is taken for dead. Also the layer's allowance on top of a take's wait."""
    from acp_channels._conf import acp_settings

    return acp_settings.WORKER_TIMEOUT_SECONDS


def lease_idle_limit() -> float:
    """A remote reader silent this long (no acknowledgement, no keep-alive) is gone; its stream
    is released. As long as a slow worker is waited for: under a burst a live reader's call came
    7.5 s late and the stream was released under it ("lost"). A reader whose worker died is
    replaced sooner: a new reader's lease asks that worker (`probe`)."""
    return TAKE_WAIT + worker_timeout() + SLOW_WORKER_PATIENCE + RECEIPT_GRACE


def layer_failure(error: BaseException) -> bool:
    """Whether `error` says the channel layer's Redis failed or is out of reach (a 503 to try
    again), not a bug of ours."""
    return isinstance(error, OSError) or type(error).__module__.startswith("redis")


def new_connection_id(worker_id: str = WORKER_ID) -> str:
    """A new connection id naming the process that hosts it (this one, or a runner)."""
    return f"{uuid.uuid4()}.{worker_id}"


def worker_of(connection_id: str) -> str | None:
    """The id of the worker hosting a connection, or None for an id we never issued."""
    _, _, worker_id = connection_id.rpartition(".")
    return worker_id if len(worker_id) == 12 and worker_id.isalnum() else None


OpHandler = Callable[[Any], Awaitable[Reply | None]]
PushReceiver = Callable[[Pushed | PushEnded], None]
OpT = TypeVar("OpT", bound=Op)

#: How long a live but overloaded worker is waited for to take a call (its heartbeat is there)
#: before 503; the call expires then.
SLOW_WORKER_PATIENCE: Final = 30.0
#: A call's receipt is waited for this much past its expiry: a worker that takes the call just
#: before it expires has this long to get its receipt through. Past it the call was dropped.
RECEIPT_GRACE: Final = 5.0


class Bus:
    """This process's end of the channel layer: its inbox, calls to other workers, and the
    handlers that serve calls made to it. Messages are built and read by
    `acp_channels._worker_protocol` only."""

    def __init__(self) -> None:
        self._layer: Any = None
        self._pending: dict[str, asyncio.Future[Reply]] = {}
        self._receipts: dict[str, asyncio.Future[None]] = {}
        self._ids = itertools.count()
        self._loop_task: asyncio.Task[None] | None = None
        self._handlers: dict[type[Op], OpHandler] = {}
        self._push_receivers: dict[str, PushReceiver] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        #: The request ids of the calls taken lately.
        self._served: OrderedDict[str, None] = OrderedDict()
        self.heartbeat = Heartbeat()
        #: False in a process that hosts no connection (a management command): it calls the
        #: workers and reads their replies, but has no heartbeat, so no worker counts it as one.
        self.hosts_connections = True
        #: A runner's load, published with its heartbeat for the edges' placement (None: this
        #: process takes no placements).
        self.load: Callable[[], dict[str, Any]] | None = None
        self._inbox_suffix = ""
        self._outbox = Outbox(self._send_now)

    @property
    def layer(self) -> Any:
        if self._layer is None:
            self.use(get_channel_layer())
        return self._layer

    def inbox(self, worker_id: str) -> str:
        """A worker's inbox: on our Redis layer a process-specific channel named after the
        worker (one stream per process, read in batches by it alone); on another layer an
        ordinary channel."""
        if self._layer is None:
            self.use(get_channel_layer())  # the layer decides the name
        return f"acp.worker.{worker_id}{self._inbox_suffix}"

    @property
    def named(self) -> bool:
        """Whether the layer's process-specific channels carry the worker id (our Redis layer)."""
        return self.inbox("") != "acp.worker."

    def use(self, layer: Any) -> None:
        """Reach the other workers through `layer` (the default channel layer unless told)."""
        name_this_process = getattr(layer, "name_this_process", None)  # our Redis layer's
        if name_this_process is not None:
            name_this_process(WORKER_ID)
        self._inbox_suffix = "!inbox" if name_this_process is not None else ""
        self._layer = layer

    @property
    def shared(self) -> bool:
        """Whether other processes can reach us: a channel layer that is not in-memory."""
        return self.layer is not None and not isinstance(self.layer, InMemoryChannelLayer)

    def handle(self, op: type[OpT], handler: Callable[[OpT], Awaitable[Reply | None]]) -> None:
        self._handlers[op] = handler

    def ensure_listening(self) -> None:
        """Start reading our inbox and beating our heart (once per process and event loop)."""
        if not self.shared:
            return
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._listen(), name="acp-worker-inbox")
            self.heartbeat.start(self.layer, WORKER_ID, beat=self.hosts_connections, load=self.load)

    # -- calling other workers ---------------------------------------------------------------

    @measured_call(refused=ErrorReply, unreachable=HostUnreachable, busy=AgentBusy, layer=LayerUnavailable)
    async def call(self, worker_id: str, op: Op, *, timeout: float, receipt: bool = False) -> Reply:
        """Send an operation to a worker and wait for its reply: one the op may get
        (`op.replies`); any other (Internal, UnknownOp, Malformed) raises WorkerFailed.

        With `receipt`, the worker must take the op within SLOW_WORKER_PATIENCE (it expires
        then) and answers at once (its result, or a receipt when the result is not ready:
        RECEIPT_AFTER); the result may then take `timeout`, or longer while the worker lives
        (up to SLOW_WORKER_PATIENCE). Without one, the op expires and the caller gives up after
        `timeout`. A late worker is waited for while its heartbeat says it is alive
        (liveness.reply_or_gone). Raises HostUnreachable (its heartbeat is gone), WorkerBusy
        (alive, but it did not take or answer the op in time), AgentBusy (it took the op, the
        result did not come) or LayerUnavailable.
        """
        self.ensure_listening()
        request_id = f"{WORKER_ID}-{next(self._ids)}"
        loop = asyncio.get_running_loop()
        result: asyncio.Future[Reply] = loop.create_future()
        self._pending[request_id] = result
        received: asyncio.Future[None] | None = None
        if receipt:
            received = self._receipts[request_id] = loop.create_future()
        take_within = SLOW_WORKER_PATIENCE if receipt else timeout
        message = encode_op(op, request_id, self.inbox(WORKER_ID), receipt=receipt, expires=time.time() + take_within)
        try:
            await self.send(self.inbox(worker_id), message, wait_for_company=False)
            try:
                if received is None:
                    try:
                        reply = await reply_or_gone(
                            result, worker_id, self.heartbeat, expected=timeout, patience=timeout
                        )
                    except TimeoutError:
                        raise WorkerBusy(f"worker {worker_id} is alive but did not answer {op.name} in time") from None
                else:
                    try:
                        await reply_or_gone(
                            received,
                            worker_id,
                            self.heartbeat,
                            expected=worker_timeout(),
                            patience=SLOW_WORKER_PATIENCE + RECEIPT_GRACE,  # by then taken or dropped
                        )
                    except TimeoutError:
                        raise WorkerBusy(f"worker {worker_id} is alive but did not take {op.name} in time") from None
                    try:
                        # Taken: a live worker's result is waited for, however slow it is today.
                        patience = max(timeout, SLOW_WORKER_PATIENCE)
                        reply = await reply_or_gone(
                            result, worker_id, self.heartbeat, expected=timeout, patience=patience
                        )
                    except TimeoutError:
                        raise AgentBusy(f"{op.name} was not done within {patience:g} s") from None
            except WorkerGone:
                raise HostUnreachable(f"worker {worker_id} is gone") from None
        finally:
            self._pending.pop(request_id, None)
            self._receipts.pop(request_id, None)
        return expect(op, reply)

    async def push(self, worker_id: str, push: Pushed | PushEnded) -> None:
        """A batch (or the end) for a reader on another worker: a direct send, in order."""
        await self.send(self.inbox(worker_id), encode_push(push))

    def receive_pushes(self, lease: str, receiver: PushReceiver | None) -> None:
        """Route the pushes for `lease` to `receiver` (None: stop)."""
        if receiver is None:
            self._push_receivers.pop(lease, None)
        else:
            self._push_receivers[lease] = receiver

    async def send(self, channel: str, message: dict[str, Any], *, wait_for_company: bool = True) -> None:
        """A direct send, in one layer message with whatever else this process has ready for
        that inbox within a few loop steps (acp_channels._outbox)."""
        await self._outbox.send(channel, message, wait_for_company=wait_for_company)

    async def _send_now(self, channel: str, message: dict[str, Any]) -> None:
        """One layer message; a full channel is retried (backpressure), a failed one sent again
        as is (RESEND_DELAYS: every message is safe to receive twice), a broken layer is 503."""
        deadline = time.monotonic() + SEND_RETRY_SECONDS
        delay = 0.005
        resends = iter(RESEND_DELAYS)
        while True:
            try:
                # In the outbox's task of its own (never a caller's, which may be cancelled when
                # its client leaves: it stops waiting, the send goes on).
                await self.layer.send(channel, message)
                return
            except ChannelFull:
                if time.monotonic() > deadline:
                    raise LayerUnavailable(f"channel {channel} stayed full") from None
                await asyncio.sleep(delay)  # backoff: a full channel sends no event to await
                delay = min(delay * 2, 0.2)
            except Exception as error:
                if not layer_failure(error):
                    raise
                resend_after = next(resends, None)
                if resend_after is None:
                    raise LayerUnavailable(str(error)) from error
                await asyncio.sleep(resend_after)  # a connection just cut: a new one is made

    async def send_unanswered(self, worker_id: str, op: Op) -> None:
        """An op the worker serves without replying, sent in order with this process's calls to
        it (a failed send raises LayerUnavailable, as a call's does)."""
        self.ensure_listening()
        message = encode_op(op, f"{WORKER_ID}-{next(self._ids)}", self.inbox(WORKER_ID), answer=False)
        await self.send(self.inbox(worker_id), message)

    def post(self, worker_id: str, op: Op) -> None:
        """Fire and forget (releases: ops that get no reply): failures are logged, never raised."""
        message = encode_op(op, f"{WORKER_ID}-{next(self._ids)}", self.inbox(WORKER_ID))

        async def deliver() -> None:
            try:
                await self.send(self.inbox(worker_id), message)
            except Exception as error:
                logger.warning("could not deliver %s to worker %s: %s", op.name, worker_id, error)

        self._spawn(deliver())

    # -- serving calls -----------------------------------------------------------------------

    async def _listen(self) -> None:
        channel = self.inbox(WORKER_ID)
        failures = 0
        layer = self.layer
        while True:
            try:
                message = await layer.receive(channel)
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as error:
                failures += 1
                if failures == 1:
                    logger.warning("channel layer receive failed (%s); retrying", error)
                await asyncio.sleep(min(0.1 * failures, 2.0))  # the layer is down: back off, retry
                continue
            self._take(message)

    def _take(self, message: dict[str, Any]) -> None:
        """One message from the layer: a batch's messages in order (acp_channels._outbox)."""
        for each in unbatched(message):
            try:
                self._dispatch(each)
            except Exception:  # a message we cannot read must not stop the inbox
                logger.exception("could not dispatch a message from the channel layer")

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        request_id = message.get("id")
        if kind == "acp.op":
            if expired(message, time.time()):
                # Its caller answered 503 (WorkerBusy) already and the client may try again:
                # serving it now could do it twice.
                logger.warning(
                    "dropped %s from %s: it expired before this worker took it",
                    message.get("op"),
                    message.get("reply_to"),
                )
                return
            if isinstance(request_id, str):
                if request_id in self._served:
                    # A second copy (its sender did not learn that the first landed): served
                    # once, and the reply to the first reaches the caller, which still waits.
                    return
                self._served[request_id] = None
                if len(self._served) > SERVED_MEMORY:
                    self._served.popitem(last=False)
            self._spawn(self._serve(message))
        elif kind == "acp.push":
            self._deliver_push(message)
        elif kind in ("acp.receipt", "acp.result") and isinstance(request_id, str):
            receipt = self._receipts.get(request_id)
            if receipt is not None and not receipt.done():
                receipt.set_result(None)  # a result is a receipt too
            future = self._pending.get(request_id)
            if kind == "acp.result" and future is not None and not future.done():
                future.set_result(decode_reply(message))
        else:
            logger.warning("ignored a message of type %r on the worker inbox", kind)

    def _deliver_push(self, message: dict[str, Any]) -> None:
        try:
            push = decode_push(message)
        except MalformedMessage as error:
            logger.warning("ignored a malformed push: %s", error)
            return
        receiver = self._push_receivers.get(push.lease)
        if receiver is not None:
            receiver(push)

    async def _serve(self, message: dict[str, Any]) -> None:
        reply_to, request_id = message.get("reply_to"), message.get("id")
        if not isinstance(reply_to, str) or not isinstance(request_id, str):
            logger.warning("ignored an op that names no reply channel: %.200r", message)
            return
        op = decode_op(message)
        if isinstance(op, ErrorReply):
            logger.warning("could not serve an op: %s", describe(op))
            if message.get("answer") is not False:
                await self._reply(reply_to, encode_reply(request_id, op))
            return
        receipt: asyncio.TimerHandle | None = None
        if message.get("receipt") is True:
            # The result alone when it is ready at once; a receipt first when it is not, so the
            # caller tells a slow worker from a dead one. (A receipt that arrives after the
            # result is ignored: the result counts as one.)
            receipt = asyncio.get_running_loop().call_later(
                RECEIPT_AFTER, lambda: self._spawn(self._reply(reply_to, encode_receipt(request_id)))
            )
        try:
            reply = await self._run(op)
        finally:
            if receipt is not None:
                receipt.cancel()
        if reply is not None and message.get("answer") is not False:
            await self._reply(reply_to, encode_reply(request_id, reply))

    async def _run(self, op: Op) -> Reply | None:
        handler = self._handlers.get(type(op))
        if handler is None:
            return UnknownOp(op.name)
        try:
            reply = await handler(op)
        except Exception:
            logger.exception("serving %s failed", op.name)
            return Internal()
        if op.replies and not isinstance(reply, op.replies):
            logger.error("the handler of %s answered %r, which the op cannot get", op.name, reply)
            return Internal()
        return reply

    async def _reply(self, channel: str, message: dict[str, Any]) -> None:
        try:
            await self.send(channel, message)
        except LayerUnavailable as error:
            logger.warning("could not reply to %s: %s", channel, error)

    def _spawn(self, coroutine: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        """Stop serving and calling (a runner's or a management command's last step): the
        heartbeat, the inbox, and this event loop's connections to the layer, once what is on
        its way out has gone (the reply that ended a draining runner's last connection)."""
        await self._outbox.drain(STOP_FLUSH_SECONDS)
        self.heartbeat.stop()
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        close = getattr(self._layer, "close_pools", None)  # a Redis layer's
        if close is not None:
            try:
                await close()
            except Exception as error:  # Redis already gone: nothing left to close cleanly
                logger.debug("closing the channel layer's connections failed: %s", error)


bus = Bus()
