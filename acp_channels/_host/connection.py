"""One ACP connection and its agent: `ConnectionHost`.

It owns the agent, the requests in flight and where their replies go (`requests`), the outbound
router and the per-stream mailboxes (`mailbox`), what it saw of its sessions (`sessions`), other
clients of its sessions (`attachments`), what its own client's absence allows (`detached`), and
for a WebSocket its socket's state (`socket`). The edges reach it through the gateway: submit a
planned frame, initialize, lease a stream, take deliveries, terminate.

Everything a connection holds is bounded: undelivered output by its budget (bytes queued plus
bytes handed to a reader and not yet confirmed written) and by the worker's budget summed over
every connection; session streams by MAX_SESSION_STREAMS (empty, unread streams disappear);
requests waiting for the agent's reply by MAX_PENDING_REQUESTS.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable

from acp_channels import _journal
from acp_channels import _metrics as metrics
from acp_channels import _protocol as protocol
from acp_channels._agents.channel import AgentChannel, AgentClosed
from acp_channels._conf import acp_settings
from acp_channels._handoff import LazyEvent
from acp_channels._host.attachments import SharedSessions, held_back
from acp_channels._host.budget import OutboundBudget, WorkerBudget
from acp_channels._host.detached import OwnClient
from acp_channels._host.extensions import answered_here
from acp_channels._host.mailbox import FORGOTTEN_STREAMS, Mailbox, SocketOutbox, StreamLease
from acp_channels._host.oversize import OversizeRefusals, largest_agent_message
from acp_channels._host.requests import PendingRequests, too_many_requests_reply
from acp_channels._host.resume import InitializeReply, advertise_server_meta, count_socket_replies
from acp_channels._host.sessions import SessionDirectory
from acp_channels._host.socket import GracePeriod, SocketInbox, socket_frame_refusal
from acp_channels._identity import ANONYMOUS, Principal, TransportKind
from acp_channels._protocol import Frame, InboundPlan, StreamKey
from acp_channels.errors import AgentEnded, EndReason, StreamBusy, TooManyRequests, TooManyStreams

logger = logging.getLogger("acp_channels.host")


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
        self.own_client = OwnClient(self, self._budget)
        #: Agent messages over the largest relayed are refused (§6.7).
        self._oversize = OversizeRefusals(
            connection_id,
            transport,
            agent,
            max_message_bytes if max_message_bytes is not None else largest_agent_message(max_buffered_bytes),
        )
        self._streams: dict[StreamKey, Mailbox] = {}
        # Streams forgotten with their window: (tag, last seq), so a reader that got everything
        # resumes on the stream made again (bounded: the oldest are forgotten for good).
        self._forgotten: OrderedDict[StreamKey, tuple[str, int]] = OrderedDict()
        #: WebSocket: the grace period of a detached socket (OwnClient.socket_left).
        self.grace = GracePeriod(connection_id)
        # WebSocket connections only, made on first use: an HTTP connection never holds one.
        self._socket_outbox: SocketOutbox | None = None
        # Client messages received on this connection's sockets (Acp-Received on a reattach),
        # handed to the agent one at a time in the order they were counted.
        self._socket_inbox = SocketInbox()
        # Ids of the client's initialize requests not answered yet: their replies advertise resumption.
        self._socket_initializing: set[str] = set()
        # Client requests the agent has not answered: count, bytes, and where replies go.
        self._pending = PendingRequests(worker_budget)
        # The stream each pending agent->client request went to, by id.
        self._agent_requests: dict[str, StreamKey] = {}
        self.sessions = SessionDirectory()  # for the directory (GET /acp/sessions)
        #: Other clients on this connection's sessions (made with the first); on an attachment,
        #: the connection it is attached to.
        self.shared: SharedSessions | None = None
        self.attached_to: str | None = None
        self._router: asyncio.Task[None] | None = None
        self._on_end = on_end
        self.ended = LazyEvent()
        self.last_active = self.opened_at = asyncio.get_running_loop().time()

    @property
    def pending_requests(self) -> int:
        """Client requests forwarded to the agent and not yet answered."""
        return self._pending.count

    @property
    def session_streams(self) -> int:  # session mailboxes held now
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
        self.last_active = self.own_client.requested()
        if answered_here(self, plan.frame) or held_back(self, plan.frame):  # docs/shared-sessions.md
            return
        if self.transport == "websocket":  # one stream: nothing to route, ids to count
            await self._submit_to_socket_agent(plan.frame)
            return
        request_bytes = self._pending.admit(plan.frame, len(plan.routes)) if plan.routes else 0
        self._match_responses(plan)
        for session_id in plan.sessions:
            self.stream(session_id)
        self._pending.add_routes(plan.routes, request_bytes)
        for session_id in plan.sessions:  # a stream no reply will go to is not kept
            self._collect(session_id)
        self.sessions.inbound(plan.frame)
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
        if ids:
            try:
                request_bytes = self._pending.admit(frame, len(ids))
            except TooManyRequests as refusal:
                await self.own_client.wait_for_room()  # refusals are output too: a client that does not read waits
                self.socket_outbox.push(protocol.serialize_frame(too_many_requests_reply(frame, ids, refusal)))
                return
            self._pending.add_socket_ids([protocol.id_key(request_id) for request_id in ids], request_bytes)
        for message in protocol.frame_messages(frame):
            if message.get("method") == protocol.INITIALIZE_METHOD and message.get("id") is not None:
                self._socket_initializing.add(protocol.id_key(message["id"]))
        self.sessions.inbound(frame)
        metrics.record_messages_in(self.transport, frame)
        await self.agent.send(frame)

    @property
    def pending_request_bytes(self) -> int:
        """Bytes of client requests forwarded to the agent and not yet answered."""
        return self._pending.bytes

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
        What else the agent sends meanwhile goes to mailboxes; the router starts once accepted."""
        self.sessions.inbound(frame)
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
            self.sessions.outbound(output)  # the agent's name
            advertise_server_meta(reply)
            self.start()
            return InitializeReply(protocol.dumps(protocol.frame_value(output)), accepted)  # with the `_meta` added

    # -- replies the transport makes itself ---------------------------------------------------

    def reply_from_transport(self, text: str) -> None:
        """Queue a reply the transport made itself (to a refused batch, an extension method) where
        the agent's answer to a malformed frame goes: the connection stream, or the socket."""
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
        return self._socket_inbox.received

    def attach_socket(self, last_seq: int, holder: object) -> int:
        """A new socket reattaches: the outbox resumes after message `last_seq` (the last the
        client received), taken over from any socket still attached. Returns the client messages
        received so far. Raises StreamBusy (not a WebSocket), AgentClosed or ReplayUnavailable."""
        if self.transport != "websocket":
            raise StreamBusy
        if self.ended.is_set():
            raise AgentClosed("connection ended")
        self.socket_outbox.resume(last_seq, str(last_seq))  # checked before the socket attached is displaced
        self.socket_outbox.take_over(holder)
        self.last_active = asyncio.get_running_loop().time()
        return self._socket_inbox.received

    def holds_socket(self, holder: object) -> bool:  # the socket attached now?
        return self.socket_outbox.holder is holder

    async def receive_from_socket(self, text: str, holder: object) -> bool:
        """A text message the client sent on socket `holder`: counted, then handed to the agent
        after every message counted before it (in a task of its own: a consumer cancelled
        meanwhile cannot lose a message counted). False (dropped) when `holder` is not the socket
        attached now: the client resends what `Acp-Received` does not count. Raises AgentClosed
        once the connection has ended."""
        if self.ended.is_set():
            raise AgentClosed("connection ended")
        if self.socket_outbox.holder is not holder:
            return False
        await self._socket_inbox.deliver(lambda: self._deliver_from_socket(text))
        return True

    async def _deliver_from_socket(self, text: str) -> None:
        try:
            frame = await protocol.read_frame(text, lambda: acp_settings.MAX_BATCH_ENTRIES)
        except protocol.BatchTooLarge as refused:
            self.reply_from_transport(protocol.dumps(refused.reply))
            return
        if (refusal := await socket_frame_refusal(frame, self.connection_id)) is not None:
            self.reply_from_transport(protocol.dumps(protocol.frame_value(refusal)))
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

    # -- outbound ----------------------------------------------------------------------------

    def start(self) -> None:
        if self._router is None:
            self._router = asyncio.create_task(self._run_router(), name=f"acp-router-{self.connection_id}")
            direct_sink = getattr(self.agent, "direct_sink", None)
            if direct_sink is not None:
                direct_sink(self._route_directly, self.own_client.wait_for_room)

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
        """A stream's mailbox, made on demand (§6.2), beyond MAX_SESSION_STREAMS too (POSTs are
        bounded by MAX_PENDING_REQUESTS)."""
        mailbox = self._streams.get(key)
        if mailbox is None:
            tag, last_seq = self._forgotten.pop(key, (None, 0))
            mailbox = self._streams[key] = Mailbox(
                self._budget,
                on_idle=lambda idle: self._collect(key, idle),
                tag=tag,
                first_seq=last_seq + 1,
                detached=self.own_client.drop_check(),
                **self._window,
            )
            _journal.attach(mailbox, self.connection_id, self.principal, key)
            if self.ended.is_set():
                mailbox.close()
        return mailbox

    def stream_if_any(self, key: StreamKey) -> Mailbox | None:
        return self._socket_outbox if self.transport == "websocket" else self._streams.get(key)

    def stream_for_reader(self, key: StreamKey) -> Mailbox:
        """The mailbox an SSE reader leases: StreamBusy on a WebSocket connection (409, as in the
        reference); TooManyStreams (429) for a new session stream past MAX_SESSION_STREAMS."""
        if self.transport == "websocket":
            raise StreamBusy
        if key is not protocol.CONNECTION_STREAM and key not in self._streams:
            limit = acp_settings.MAX_SESSION_STREAMS
            if self.session_streams >= limit and not self._forget_a_window():
                raise TooManyStreams(limit)
        return self.stream(key)

    def lease(self, key: StreamKey, resume: str | None = None) -> StreamLease:
        """The single-reader lease on an SSE stream: StreamBusy when taken (409), unless `resume`
        names the last event the reader got (it takes over, or raises ReplayUnavailable)."""
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
            and key not in self._pending.pins
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
        """Forget a session stream nothing is in, nobody reads and no pending reply goes to."""
        current = self._streams.get(key)
        if (
            key is protocol.CONNECTION_STREAM
            or current is None
            or (mailbox is not None and current is not mailbox)
            or current.leased
            or not current.empty
            or current.has_window  # kept for a reader that resumes (forgotten at the stream cap)
            or key in self._pending.pins
        ):
            return
        del self._streams[key]
        if current.last_sent_seq:
            self._remember(key, current)

    @property
    def socket_outbox(self) -> SocketOutbox:
        if self._socket_outbox is None:
            self._socket_outbox = SocketOutbox(
                self._budget, on_attach=self.grace.stop, on_detach=self.own_client.socket_left, **self._window
            )
            self._socket_outbox.detached = self.own_client.drop_check()
            _journal.attach(self._socket_outbox, self.connection_id, self.principal, None, _journal.SOCKET_TAG)
        return self._socket_outbox

    async def _run_router(self) -> None:
        try:
            while True:
                await self.own_client.wait_for_room()
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
        if len(text) > self._oversize.limit:
            refused = self._oversize.refuse(frame, len(text))
            if refused is None:
                return
            frame, text = refused, protocol.serialize_frame(refused)
        shared = self.shared.outbound(frame) if self.shared is not None else frame  # other clients' share
        self.sessions.outbound(frame)
        if shared is not frame:
            if shared is None:  # for other clients only
                return
            frame, text = shared, protocol.serialize_frame(shared)
        if self.transport == "websocket":
            # An initialize reply got `_meta`: the raw text lacks it.
            if count_socket_replies(frame, self._socket_initializing, self._pending, self.connection_id):
                text = protocol.dumps(protocol.frame_value(frame))
            self.socket_outbox.push(text)
            return
        unpinned: list[str] = []
        key = protocol.route_outbound(frame, lambda request: self._pending.pop_route(request, unpinned))
        for message in protocol.frame_messages(frame):
            if "method" in message and message.get("id") is not None:
                self._agent_requests[protocol.id_key(message["id"])] = key
        self.stream(key).push(text)
        for session_id in unpinned:  # e.g. a batch's replies went to the connection stream
            self._collect(session_id)

    # -- lifetime ----------------------------------------------------------------------------

    @property
    def mailboxes(self) -> list[Mailbox]:
        """The streams held now: a WebSocket's outbox (once made), or the SSE streams."""
        outbox: list[Mailbox] = [self._socket_outbox] if self._socket_outbox is not None else []
        return outbox if self.transport == "websocket" else list(self._streams.values())

    @property
    def attachments(self) -> int:
        """Readers attached now: the socket, or each stream's reader; other clients' taps."""
        return (self.shared.count if self.shared is not None else 0) + sum(box.leased for box in self.mailboxes)

    def idle_since(self, now: float) -> float:
        """Seconds without POSTs and without any stream reader (a reader keeps it alive). A
        WebSocket connection is never idle: its socket is attached, or the grace period of a
        detached one runs and ends it (WEBSOCKET_RESUME_SECONDS, whatever IDLE_TIMEOUT_SECONDS)."""
        if self.transport == "websocket" or any(mailbox.leased for mailbox in self._streams.values()):
            self.last_active = now  # the socket or a reader is there: not idle
        elif self.shared is not None and self.shared.count:
            self.last_active = now  # another client is attached
        return now - self.last_active

    def _end(self, reason: EndReason) -> None:
        """Close every stream (readers drain what is queued, then end; streams nobody reads
        are dropped) and unregister. No reply will come: nothing is pending any more."""
        if self.ended.is_set():
            return
        self.ended.set()
        self.end_reason = reason
        self._pending.clear()
        self._socket_initializing.clear()
        self.grace.stop()
        for mailbox in self._streams.values():
            mailbox.close()
        if self._socket_outbox is not None:
            self._socket_outbox.close()
        if self.shared is not None:
            self.shared.end_all()
        self._on_end(self)

    async def terminate(self, reason: EndReason = "delete") -> None:
        """End the connection now (DELETE, socket closed, failed initialize): abortive (§10)."""
        self._end(reason)
        if self._socket_outbox is not None:
            self._socket_outbox.writer_never_started()  # if it never took, it never will
        if self._router is not None:
            self._router.cancel()
        await self.agent.close()
