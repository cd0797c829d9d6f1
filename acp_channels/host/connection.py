"""Connection state: the only place it lives.

One `ConnectionHost` per ACP connection owns its agent, the reply routes recorded at POST time,
the outbound router and the per-stream mailboxes. The edges (views, consumer) talk to it through
a few message-shaped operations: submit a planned frame, initialize, lease a stream, take
deliveries, terminate. `Registry` maps connection ids to hosts in this process.

Everything a connection holds is bounded: undelivered output by its budget (bytes queued plus
bytes handed to a reader and not yet confirmed written) and by the worker's budget summed over
every connection; session streams by MAX_SESSION_STREAMS (empty, unread streams disappear);
requests waiting for the agent's reply by MAX_PENDING_REQUESTS.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

from acp_channels import metrics, protocol
from acp_channels.agents.channel import AgentChannel, AgentClosed
from acp_channels.conf import acp_settings
from acp_channels.errors import AgentEnded, EndReason, StreamBusy, TooManyRequests, TooManyStreams
from acp_channels.handoff import LazyEvent
from acp_channels.host.budget import OutboundBudget, WorkerBudget
from acp_channels.host.mailbox import Mailbox, SocketOutbox, StreamLease
from acp_channels.identity import ANONYMOUS, Principal, TransportKind
from acp_channels.protocol import Batch, Frame, InboundPlan, Single, StreamKey

logger = logging.getLogger("acp_channels.host")

#: Forgotten streams a connection remembers the last event id of (see ConnectionHost._forgotten).
FORGOTTEN_STREAMS: Final = 1024
#: The JSON-RPC error a WebSocket request over MAX_PENDING_REQUESTS gets instead of forwarding.
TOO_MANY_REQUESTS_CODE: Final = -32000
TOO_MANY_REQUESTS_MESSAGE: Final = "too many requests in flight"
TOO_MANY_REQUEST_BYTES_MESSAGE: Final = "the requests in flight hold too many bytes"


#: The key under the initialize result's `_meta` where the server says how streams resume
#: (docs/resumable-streams.md).
RESUME_META_KEY: Final = "acp-channels/resume"


def resume_capabilities() -> dict[str, Any]:
    resume_seconds = acp_settings.WEBSOCKET_RESUME_SECONDS
    return {
        "sse": True,
        # 0: a dropped socket ends its connection, so there is nothing to reattach to.
        "websocket": resume_seconds > 0,
        "windowEvents": acp_settings.REPLAY_WINDOW_EVENTS,
        "windowBytes": acp_settings.REPLAY_WINDOW_BYTES,
        "websocketResumeSeconds": resume_seconds,
    }


def advertise_resume(reply: protocol.Message, connection_id: str | None = None) -> None:
    """Add what the server supports for resuming streams to an initialize result's `_meta`
    (next to what the agent put there). A WebSocket's reply also names its connection: a browser
    cannot read the 101's `Acp-Connection-Id`, and needs the id to reattach; and the method of the
    message that tells a reattached browser socket how many of its messages the server has."""
    result = reply.get("result")
    if isinstance(result, dict):
        meta = result.get("_meta")
        if not isinstance(meta, dict):
            meta = result["_meta"] = {}
        capabilities = resume_capabilities()
        if connection_id is not None:
            capabilities["connectionId"] = connection_id
            # A browser reattaches in the query form, and learns Acp-Received from this message.
            capabilities["receivedNotification"] = protocol.RECEIVED_NOTIFICATION
        meta[RESUME_META_KEY] = capabilities


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
        max_message_bytes: int | None = None,
        worker_budget: WorkerBudget | None = None,
        principal: Principal = ANONYMOUS,
        remote_address: str | None = None,
    ) -> None:
        self.connection_id = connection_id
        #: Who created the connection: every later request on it must be the same principal.
        self.principal = principal
        self.remote_address = remote_address
        #: Why the connection ended (for the audit line), once it has.
        self.end_reason: EndReason | None = None
        self.transport = transport
        self.agent = agent
        self._window: dict[str, int] = {
            "window_events": acp_settings.REPLAY_WINDOW_EVENTS,
            # At most half the budget, whatever the settings say (E031 flags a larger one): the
            # windows a connection keeps under a full budget must leave live output room.
            "window_bytes": min(acp_settings.REPLAY_WINDOW_BYTES, max_buffered_bytes // 2),
        }
        self._budget = OutboundBudget(max_buffered_bytes, worker_budget, self._window["window_bytes"])
        #: The largest agent message relayed (§6.7); a larger one is refused.
        self.max_message_bytes = (
            max_message_bytes if max_message_bytes is not None else largest_agent_message(max_buffered_bytes)
        )
        self._streams: dict[StreamKey, Mailbox] = {}
        # Streams forgotten with their window: (tag, last seq), so a reader that got everything
        # resumes on the stream made again (bounded: the oldest are forgotten for good).
        self._forgotten: OrderedDict[StreamKey, tuple[str, int]] = OrderedDict()
        # WebSocket: the grace period of a detached socket (see _socket_detached).
        self._grace: asyncio.TimerHandle | None = None
        self._grace_ending: asyncio.Task[None] | None = None
        # WebSocket connections only, made on first use: an HTTP connection never holds one.
        self._socket_outbox: SocketOutbox | None = None
        # Client messages received on this connection's sockets (Acp-Received on a reattach),
        # handed to the agent one at a time in the order they were counted.
        self._socket_received = 0
        self._socket_inbound = asyncio.Lock()
        self._socket_deliveries: set[asyncio.Task[None]] = set()
        # Error replies to agent requests refused as too large, on their way to the agent.
        self._agent_answers: set[asyncio.Task[None]] = set()
        # Ids of the client's initialize requests not answered yet: their replies advertise resumption.
        self._socket_initializing: set[str] = set()
        # HTTP: where each pending request's reply goes, by id; pinning their session streams.
        self._routes: dict[str, deque[StreamKey]] = {}
        self._route_pins: dict[str, int] = {}
        # WebSocket: ids of requests forwarded and not yet answered (one stream: no routes).
        self._socket_requests: dict[str, int] = {}
        self._pending_requests = 0
        # The size charged to each pending client request (by id key, in order), and their sum.
        self._request_bytes: dict[str, deque[int]] = {}
        self._pending_bytes = 0
        self._worker_budget = worker_budget
        # The stream each pending agent->client request went to, by id.
        self._agent_requests: dict[str, StreamKey] = {}
        self._router: asyncio.Task[None] | None = None
        self._on_end = on_end
        self.ended = LazyEvent()
        self.last_active = self.opened_at = asyncio.get_running_loop().time()

    @property
    def pending_requests(self) -> int:
        """Client requests forwarded to the agent and not yet answered."""
        return self._pending_requests

    @property
    def session_streams(self) -> int:
        """Session mailboxes this connection holds now."""
        return len(self._streams) - (protocol.CONNECTION_STREAM in self._streams)

    @property
    def buffered_bytes(self) -> int:
        """Undelivered output held for this connection's readers (queued or in their hands)."""
        return self._budget.used

    # -- inbound -----------------------------------------------------------------------------

    async def submit(self, plan: InboundPlan) -> None:
        """Record the replies' routes, then queue the frame for the agent (raises AgentClosed,
        and TooManyRequests over HTTP when the requests would exceed MAX_PENDING_REQUESTS).

        Routes exist before the agent can see the frame, so its reply is always routed right.
        """
        if self.ended.is_set():
            raise AgentClosed("connection ended")
        self.last_active = asyncio.get_running_loop().time()
        if self.transport == "websocket":  # one stream: nothing to route, ids to count
            await self._submit_to_socket_agent(plan.frame)
            return
        limit = acp_settings.MAX_PENDING_REQUESTS
        if plan.routes and self._pending_requests + len(plan.routes) > limit:
            raise TooManyRequests(limit)
        request_bytes = self._check_request_bytes(plan.frame) if plan.routes else 0
        self._match_responses(plan)
        if plan.routes:
            self._charge_requests(request_bytes, [key for key, _ in plan.routes])
        for session_id in plan.sessions:
            self.stream(session_id)
        for key, route in plan.routes:
            self._routes.setdefault(key, deque()).append(route)
            if route is not None:
                self._route_pins[route] = self._route_pins.get(route, 0) + 1
        self._pending_requests += len(plan.routes)
        for session_id in plan.sessions:  # a stream no reply will go to is not kept
            self._collect(session_id)
        metrics.record_messages_in(self.transport, plan.frame)
        await self.agent.send(plan.frame)

    async def _submit_to_socket_agent(self, frame: Frame) -> None:
        """Forward a WebSocket frame, counting its requests; a frame that would put the
        connection over MAX_PENDING_REQUESTS is not forwarded, and each of its requests gets
        an error reply on the socket instead."""
        ids = [
            message["id"]
            for message in protocol.frame_messages(frame)
            if "method" in message and message.get("id") is not None
        ]
        limit = acp_settings.MAX_PENDING_REQUESTS
        refusal: TooManyRequests | None = TooManyRequests(limit) if self._pending_requests + len(ids) > limit else None
        request_bytes = 0
        if ids and refusal is None:
            try:
                request_bytes = self._check_request_bytes(frame)
            except TooManyRequests as refused:
                refusal = refused
        if ids and refusal is not None:
            await self._budget.wait_for_room()  # refusals are output too: a client that does not read waits
            self.socket_outbox.push(protocol.serialize_frame(too_many_requests_reply(frame, ids, refusal)))
            return
        if ids:
            self._charge_requests(request_bytes, [protocol.id_key(request_id) for request_id in ids])
        for request_id in ids:
            key = protocol.id_key(request_id)
            self._socket_requests[key] = self._socket_requests.get(key, 0) + 1
        self._pending_requests += len(ids)
        for message in protocol.frame_messages(frame):
            if message.get("method") == protocol.INITIALIZE_METHOD and message.get("id") is not None:
                self._socket_initializing.add(protocol.id_key(message["id"]))
        metrics.record_messages_in(self.transport, frame)
        await self.agent.send(frame)

    def _check_request_bytes(self, frame: Frame) -> int:
        """The size of a frame with requests, or TooManyRequests: a connection's requests in
        flight hold at most one body's worth (MAX_BODY_BYTES; a frame always fits when none is
        pending), every connection's together at most MAX_WORKER_BUFFERED_BYTES (the same)."""
        size = len(protocol.serialize_frame(frame))
        connection_limit = acp_settings.MAX_BODY_BYTES
        if self._pending_bytes and self._pending_bytes + size > connection_limit:
            raise TooManyRequests(connection_limit, "bytes")
        worker = self._worker_budget
        if worker is not None:
            worker_limit = acp_settings.MAX_WORKER_BUFFERED_BYTES
            if worker.requests_used and worker.requests_used + size > worker_limit:
                raise TooManyRequests(worker_limit, "bytes")
        return size

    def _charge_requests(self, size: int, keys: list[str]) -> None:
        """Count a frame's bytes against its requests until each is answered (the agent holds
        them meanwhile: an SDK agent's handler task, a stdio agent's pipe)."""
        if self._worker_budget is not None:
            self._worker_budget.requests_used += size
        self._pending_bytes += size
        share, extra = divmod(size, len(keys))
        for index, key in enumerate(keys):
            self._request_bytes.setdefault(key, deque()).append(share + (extra if index == 0 else 0))

    def _release_request(self, key: str) -> None:
        """The request `key` (the oldest of that id) is answered: its bytes no longer count."""
        charges = self._request_bytes.get(key)
        if not charges:
            return
        size = charges.popleft()
        if not charges:
            del self._request_bytes[key]
        self._pending_bytes -= size
        if self._worker_budget is not None:
            self._worker_budget.requests_used -= size

    def _release_all_requests(self) -> None:
        if self._worker_budget is not None:
            self._worker_budget.requests_used -= self._pending_bytes
        self._pending_bytes = 0
        self._request_bytes.clear()

    @property
    def pending_request_bytes(self) -> int:
        """Bytes of client requests forwarded to the agent and not yet answered."""
        return self._pending_bytes

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
        """Forward an initial frame and wait for the reply to `init_id` (docs/wire-contract.md §5.2).

        Whatever else the agent sends meanwhile is routed to mailboxes for SSE. The router
        starts only once the connection is accepted.
        """
        metrics.record_messages_in(self.transport, frame)
        await self.agent.send(frame)
        while True:
            output = await self.agent.receive()
            if output is None:
                raise AgentEnded("agent closed before initialize response")
            metrics.record_messages_out(self.transport, output)
            reply = protocol.find_reply(output, init_id)
            if reply is None:
                self._route(output)
                continue
            accepted = not protocol.is_error_response(reply)
            if not accepted:
                return InitializeReply(protocol.serialize_frame(output), accepted)
            advertise_resume(reply)
            self.start()
            # Serialized again: the agent's own text (`raw`) lacks the `_meta` just added.
            return InitializeReply(protocol.dumps(protocol.frame_value(output)), accepted)

    # -- replies the transport makes itself ---------------------------------------------------

    def reply_from_transport(self, text: str) -> None:
        """Queue a reply the transport made itself (to a refused batch) where the agent's
        answer to a malformed frame goes: the connection stream, or the socket. The agent
        never sees the input it answers. Raises AgentClosed once the connection has ended."""
        if self.ended.is_set():
            raise AgentClosed("connection ended")
        self.last_active = asyncio.get_running_loop().time()
        if self.transport == "websocket":
            self.socket_outbox.push(text)
        else:
            self.stream(protocol.CONNECTION_STREAM).push(text)

    # -- the socket (WebSocket connections) --------------------------------------------------

    @property
    def socket_received(self) -> int:
        """Client messages received on this connection's sockets so far (`Acp-Received`)."""
        return self._socket_received

    def attach_socket(self, last_seq: int, holder: object) -> int:
        """A new socket reattaches to this connection: the outbox is resumed after message
        `last_seq` (the last one the client received) and taken over from any socket still
        attached. Returns the count of client messages received so far. Raises StreamBusy (not
        a WebSocket connection), AgentClosed (ended) or ReplayUnavailable."""
        if self.transport != "websocket":
            raise StreamBusy
        if self.ended.is_set():
            raise AgentClosed("connection ended")
        self.socket_outbox.resume(last_seq, str(last_seq))  # checked before the socket attached is displaced
        self.socket_outbox.take_over(holder)
        self.last_active = asyncio.get_running_loop().time()
        return self._socket_received

    def holds_socket(self, holder: object) -> bool:
        """Whether `holder` is the socket attached to this connection now."""
        return self.socket_outbox.holder is holder

    async def receive_from_socket(self, text: str, holder: object) -> bool:
        """A text message the client sent on socket `holder`: counted, then handed to the agent
        after every message counted before it. False (dropped) when `holder` is not the socket
        attached now: the client resends whatever `Acp-Received` does not count. Raises
        AgentClosed once the connection has ended.

        The delivery runs as a task of its own, so a consumer cancelled meanwhile (its socket is
        gone) cannot lose a message already counted."""
        if self.ended.is_set():
            raise AgentClosed("connection ended")
        if self.socket_outbox.holder is not holder:
            return False
        self._socket_received += 1
        delivery = asyncio.ensure_future(self._deliver_from_socket(text))
        self._socket_deliveries.add(delivery)
        delivery.add_done_callback(self._delivered)
        await asyncio.shield(delivery)
        return True

    def _delivered(self, delivery: asyncio.Task[None]) -> None:
        self._socket_deliveries.discard(delivery)
        if not delivery.cancelled():
            delivery.exception()  # retrieved: a consumer cancelled meanwhile awaits it no more

    async def _deliver_from_socket(self, text: str) -> None:
        async with self._socket_inbound:  # FIFO: in the order the messages were counted
            try:
                frame = await protocol.read_frame(text, lambda: acp_settings.MAX_BATCH_ENTRIES)
            except protocol.BatchTooLarge as refused:
                self.reply_from_transport(protocol.dumps(refused.reply))
                return
            await self.submit(InboundPlan(frame, [], []))

    async def detach_socket(self, holder: object, end: EndReason | None = None) -> None:
        """Socket `holder` is gone. With `end` (a clean close, a failed send) the connection ends
        now; else, while it is the socket attached, the grace period starts."""
        if self.socket_outbox.holder is not holder:
            return  # replaced by a reattached socket: nothing of the connection's changes
        if end is not None:
            await self.terminate(end)
        self.socket_outbox.release(holder)

    def _socket_detached(self) -> None:
        """No socket holds the outbox: the connection waits WEBSOCKET_RESUME_SECONDS for one to
        reattach (a reader on any worker), then ends as if its socket had closed."""
        if self.transport != "websocket" or self.ended.is_set():
            return
        seconds = acp_settings.WEBSOCKET_RESUME_SECONDS
        self._stop_grace()
        self._grace = asyncio.get_running_loop().call_later(seconds, self._grace_over)
        if seconds:
            logger.info("connection %s: socket detached; kept %g s for a reattach", self.connection_id, seconds)

    def _stop_grace(self) -> None:
        if self._grace is not None:
            self._grace.cancel()
            self._grace = None

    def _grace_over(self) -> None:
        self._grace = None
        if self.ended.is_set() or self.socket_outbox.leased:
            return
        logger.info("connection %s: no socket reattached in time; ending it", self.connection_id)
        self._grace_ending = asyncio.ensure_future(self.terminate("socket closed"))
        self._grace_ending.add_done_callback(self._log_failed_end)

    def _log_failed_end(self, ending: asyncio.Task[None]) -> None:
        if not ending.cancelled() and (error := ending.exception()) is not None:
            logger.error("ending connection %s failed", self.connection_id, exc_info=error)

    # -- outbound ----------------------------------------------------------------------------

    def start(self) -> None:
        if self._router is None:
            self._router = asyncio.create_task(self._run_router(), name=f"acp-router-{self.connection_id}")
            direct_sink = getattr(self.agent, "direct_sink", None)
            if direct_sink is not None:
                direct_sink(self._route_directly, self._budget.wait_for_room)

    def _route_directly(self, frame: Frame) -> bool:
        """The router's work for one frame, done on the agent's task as the agent hands it over
        (when nothing is queued before it). Its bytes count in the budget from that moment, and
        the adapter then waits for room before the agent goes on (`direct_sink`'s second
        argument): a connection holds at most its budget plus the message each of its agent's
        tasks is handing over, whatever their size (an oversized one is refused, §6.7)."""
        if self.ended.is_set():
            return True  # as the router, cancelled by then: nobody reads
        metrics.record_messages_out(self.transport, frame)
        try:
            self._route(frame)
        except Exception:
            logger.exception("router of connection %s failed", self.connection_id)
            self._end("agent ended")
        return True

    def stream(self, key: StreamKey) -> Mailbox:
        """The mailbox of a stream, created on demand (§6.2). The agent's output and POSTs
        may create session streams beyond MAX_SESSION_STREAMS: nothing the agent says is
        dropped, and POSTs are bounded by MAX_PENDING_REQUESTS."""
        mailbox = self._streams.get(key)
        if mailbox is None:
            tag, last_seq = self._forgotten.pop(key, (None, 0))
            mailbox = self._streams[key] = Mailbox(
                self._budget,
                on_idle=lambda idle: self._collect(key, idle),
                tag=tag,
                first_seq=last_seq + 1,
                **self._window,
            )
            if self.ended.is_set():
                mailbox.close()
        return mailbox

    def stream_for_reader(self, key: StreamKey) -> Mailbox:
        """The mailbox an SSE reader leases. A WebSocket connection has no SSE streams: always
        busy (409), as in the reference. A new session stream beyond MAX_SESSION_STREAMS is
        TooManyStreams (429)."""
        if self.transport == "websocket":
            raise StreamBusy
        if key is not protocol.CONNECTION_STREAM and key not in self._streams:
            limit = acp_settings.MAX_SESSION_STREAMS
            if self.session_streams >= limit and not self._forget_a_window():
                raise TooManyStreams(limit)
        return self.stream(key)

    def lease(self, key: StreamKey, resume: str | None = None) -> StreamLease:
        """Take the single-reader lease on an SSE stream: StreamBusy when it is taken (409),
        unless `resume` names the last event the reader got (then it takes over, or raises
        ReplayUnavailable)."""
        return StreamLease(self.stream_for_reader(key), resume)

    def _forget_a_window(self) -> bool:
        """Make room for a new session stream: forget the least recently read one that holds
        nothing but its replay window (a reader resuming it later starts over: 409)."""
        idle = [
            (mailbox.last_read, key)
            for key, mailbox in self._streams.items()
            if key is not protocol.CONNECTION_STREAM
            and not mailbox.leased
            and mailbox.empty
            and key not in self._route_pins
        ]
        if not idle:
            return False
        _, key = min(idle)
        assert key is not None
        mailbox = self._streams.pop(key)
        mailbox.forget_window()
        self._remember(key, mailbox)
        return True

    def _remember(self, key: StreamKey, mailbox: Mailbox) -> None:
        self._forgotten[key] = (mailbox.tag, mailbox.last_sent_seq)
        self._forgotten.move_to_end(key)
        while len(self._forgotten) > FORGOTTEN_STREAMS:
            self._forgotten.popitem(last=False)

    def _collect(self, key: StreamKey, mailbox: Mailbox | None = None) -> None:
        """Forget a session stream nothing is in, nobody reads and no pending reply goes to:
        a stream for a session the agent never created does not stay behind."""
        current = self._streams.get(key)
        if (
            key is protocol.CONNECTION_STREAM
            or current is None
            or (mailbox is not None and current is not mailbox)
            or current.leased
            or not current.empty
            or current.has_window  # kept for a reader that resumes (forgotten at the stream cap)
            or key in self._route_pins
        ):
            return
        del self._streams[key]
        if current.last_sent_seq:
            self._remember(key, current)

    @property
    def socket_outbox(self) -> SocketOutbox:
        if self._socket_outbox is None:
            self._socket_outbox = SocketOutbox(
                self._budget, on_attach=self._stop_grace, on_detach=self._socket_detached, **self._window
            )
        return self._socket_outbox

    async def _run_router(self) -> None:
        try:
            while True:
                await self._budget.wait_for_room()
                frame = await self.agent.receive()
                if frame is None:
                    break
                metrics.record_messages_out(self.transport, frame)
                self._route(frame)
        except asyncio.CancelledError:
            return  # terminate() owns the cleanup
        except Exception:
            logger.exception("router of connection %s failed", self.connection_id)
        self._end("agent ended")

    def _route(self, frame: Frame) -> None:
        text = protocol.serialize_frame(frame)
        if len(text) > self.max_message_bytes:
            refused = self._refuse_oversized(frame, len(text))
            if refused is None:
                return
            frame, text = refused, protocol.serialize_frame(refused)
        if self.transport == "websocket":
            if self._count_socket_replies(frame):  # an initialize reply got `_meta`: the raw text lacks it
                text = protocol.dumps(protocol.frame_value(frame))
            self.socket_outbox.push(text)
            return
        unpinned: list[str] = []
        key = protocol.route_outbound(frame, lambda request: self._pop_route(request, unpinned))
        for message in protocol.frame_messages(frame):
            if "method" in message and message.get("id") is not None:
                self._agent_requests[protocol.id_key(message["id"])] = key
        self.stream(key).push(text)
        for session_id in unpinned:  # e.g. a batch's replies went to the connection stream
            self._collect(session_id)

    def _refuse_oversized(self, frame: Frame, size: int) -> Frame | None:
        """An agent frame over max_message_bytes is refused (§6.7). Returns what the client
        gets instead; the agent's own requests in it are answered with an error."""
        limit = self.max_message_bytes
        refused = protocol.refuse_oversized(frame, size, limit)
        methods = sorted({str(message.get("method", "reply")) for message in protocol.frame_messages(frame)})
        logger.warning(
            "connection %s: the agent sent a message of %d characters (%s), over the largest an agent may "
            "send (%d: MAX_BODY_BYTES + 1 MiB, or MAX_BUFFERED_BYTES if larger): refused",
            self.connection_id,
            size,
            ", ".join(methods) or "malformed",
            limit,
        )
        metrics.record_refused_output(self.transport)
        if refused.to_agent:
            answer: Frame = Single(refused.to_agent[0]) if len(refused.to_agent) == 1 else Batch(list(refused.to_agent))
            answering = asyncio.ensure_future(self._answer_agent(answer))
            self._agent_answers.add(answering)
            answering.add_done_callback(self._agent_answered)
        return refused.to_client

    async def _answer_agent(self, frame: Frame) -> None:
        with contextlib.suppress(AgentClosed):
            await self.agent.send(frame)

    def _agent_answered(self, answering: asyncio.Task[None]) -> None:
        self._agent_answers.discard(answering)
        if not answering.cancelled() and (error := answering.exception()) is not None:
            logger.error("answering the agent of connection %s failed", self.connection_id, exc_info=error)

    def _count_socket_replies(self, frame: Frame) -> bool:
        """Count the replies to socket requests; True when one answers an initialize (its
        result now advertises how the connection resumes)."""
        advertised = False
        for message in protocol.frame_messages(frame):
            if "method" in message or message.get("id") is None:
                continue
            key = protocol.id_key(message["id"])
            if key in self._socket_initializing:
                self._socket_initializing.discard(key)
                if not protocol.is_error_response(message):
                    advertise_resume(message, self.connection_id)
                    advertised = True
            count = self._socket_requests.get(key, 0)
            if count:
                self._release_request(key)
                self._pending_requests -= 1
                if count == 1:
                    del self._socket_requests[key]
                else:
                    self._socket_requests[key] = count - 1
        return advertised

    def _pop_route(self, key: str, unpinned: list[str]) -> StreamKey | Literal[False]:
        routes = self._routes.get(key)
        if not routes:
            return False
        route = routes.popleft()
        if not routes:
            del self._routes[key]
        self._release_request(key)
        self._pending_requests -= 1
        if route is not None:
            pins = self._route_pins[route] - 1
            if pins:
                self._route_pins[route] = pins
            else:
                del self._route_pins[route]
                unpinned.append(route)
        return route

    # -- lifetime ----------------------------------------------------------------------------

    def idle_since(self, now: float) -> float:
        """Seconds without POSTs and without any stream reader (a reader keeps it alive). A
        WebSocket connection is never idle: its socket is attached, or the grace period of a
        detached one runs and ends it (WEBSOCKET_RESUME_SECONDS, whatever IDLE_TIMEOUT_SECONDS)."""
        if self.transport == "websocket" or any(mailbox.leased for mailbox in self._streams.values()):
            self.last_active = now  # the socket or a reader is there: not idle
        return now - self.last_active

    def _end(self, reason: EndReason) -> None:
        """Close every stream (readers drain what is queued, then end; streams nobody reads
        are dropped) and unregister. No reply will come: nothing is pending any more."""
        if self.ended.is_set():
            return
        self.ended.set()
        self.end_reason = reason
        self._routes.clear()
        self._route_pins.clear()
        self._socket_requests.clear()
        self._socket_initializing.clear()
        self._pending_requests = 0
        self._release_all_requests()
        self._stop_grace()
        for mailbox in self._streams.values():
            mailbox.close()
        if self._socket_outbox is not None:
            self._socket_outbox.close()
        self._on_end(self)

    async def terminate(self, reason: EndReason = "delete") -> None:
        """End the connection now (DELETE, socket closed, failed initialize): abortive (§10)."""
        self._end(reason)
        if self._socket_outbox is not None:
            self._socket_outbox.writer_never_started()  # if it never took, it never will
        if self._router is not None:
            self._router.cancel()
        await self.agent.close()


def largest_agent_message(max_buffered_bytes: int) -> int:
    """The largest agent message a connection relays (§6.7): as large as a client's body plus an
    envelope, or the whole budget if that is larger. A message larger than what the budget has
    left still goes (the agent then waits until readers take it): a connection holds at most
    its budget plus the message each of its agent's tasks is handing over."""
    return max(max_buffered_bytes, acp_settings.MAX_BODY_BYTES + protocol.MESSAGE_HEADROOM)


def too_many_requests_reply(frame: Frame, ids: list[Any], refusal: TooManyRequests) -> Frame:
    """The error replies a refused WebSocket frame gets: one per request, a batch for a batch."""
    if refusal.unit == "bytes":
        message, data = TOO_MANY_REQUEST_BYTES_MESSAGE, {"limit": refusal.limit, "unit": "bytes"}
    else:
        message, data = TOO_MANY_REQUESTS_MESSAGE, {"limit": refusal.limit}
    errors = [protocol.error_response(request_id, TOO_MANY_REQUESTS_CODE, message, data) for request_id in ids]
    return Batch(list[protocol.BatchEntry](errors)) if isinstance(frame, Batch) else Single(errors[0])
