"""Fakes of a server that resumes (docs/resumable-streams.md), for the client's reconnect tests
before (and beside) the real one:

* `ResumableSse` turns a `FakeAcp` into one whose streams number their events `<tag>-<n>`, keep
  them all, and answer a GET with `Last-Event-ID` with the events after it, then live ones; it
  can advertise resuming in `initialize`'s `_meta`, refuse a resume (409 / 404), or misbehave by
  sending a few events again (the client must skip them).
* `EventLog` keeps what `HttpClient(on_reconnect=...)` was told.
* `ResumableWs` is a `websockets` server whose connections outlive their sockets: messages both
  ways are numbered, a reattach (`Acp-Connection-Id` + `Last-Event-ID`) gets `Acp-Received` and
  the messages after `Last-Event-ID`. A tiny agent answers `initialize` (advertising resume and
  loadSession), `session/new`, `session/load`, and `x/burst` (n notifications).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import string
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request as WsRequest
from websockets.http11 import Response as WsResponse

from acp_channels.client import ReconnectEvent
from tests.peers.fakes import CONNECTION_ID, Answer, FakeAcp, Reply, Request, Stream, sse

RESUME_META = {"acp-channels/resume": {"sse": True, "websocket": True, "windowEvents": 4096}}


class EventLog:
    """An `on_reconnect` callback that keeps what it was told, and can wait for a kind."""

    def __init__(self) -> None:
        self.seen: list[ReconnectEvent] = []
        self._changed = asyncio.Event()

    def __call__(self, event: ReconnectEvent) -> None:
        self.seen.append(event)
        self._changed.set()

    def kinds(self, what: str | None = None) -> list[str]:
        """The kinds told so far (about `what` only, when given)."""
        return [event.kind for event in self.seen if what is None or event.what == what]

    async def wait_for(self, kind: str, timeout: float = 30.0) -> ReconnectEvent:
        """The first event of `kind` (waits for it)."""
        async with asyncio.timeout(timeout):
            while True:
                for event in self.seen:
                    if event.kind == kind:
                        return event
                self._changed.clear()
                await self._changed.wait()


def rpc_result(request_id: Any, value: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": value}


def notification(method: str, params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method, "params": params}


def initialize_result(*, advertise: bool, load_session: bool = True) -> dict[str, Any]:
    result: dict[str, Any] = {"protocolVersion": 1, "agentCapabilities": {"loadSession": load_session}}
    if advertise:
        result["_meta"] = RESUME_META
    return result


@dataclass
class _SseStream:
    events: list[bytes] = field(default_factory=list)
    grew: asyncio.Event = field(default_factory=asyncio.Event)


class ResumableSse:
    """Numbered, replayable streams for a `FakeAcp` (installs its `on_get` and `on_initialize`)."""

    def __init__(
        self, fake: FakeAcp, *, tag: str = "t1", advertise: bool = True, ids: bool = True, load_session: bool = True
    ) -> None:
        self.fake = fake
        self.tag = tag
        self.ids = ids
        self.advertise = advertise
        self.load_session = load_session
        self.streams: dict[str | None, _SseStream] = {}
        #: A test's answer to the next resuming GETs instead of a stream (then cleared).
        self.refusals: list[Reply] = []
        #: Misbehave: start this many events before the one asked for.
        self.replay_overlap = 0
        #: Connection ids handed out by initialize, in order.
        self.connection_ids: list[str] = []
        fake.on_get = self._on_get
        fake.on_initialize = self._on_initialize

    def stream(self, session_id: str | None) -> _SseStream:
        return self.streams.setdefault(session_id, _SseStream())

    def push(self, session_id: str | None, value: Any) -> str | None:
        """Add an event to a stream (for its live readers and later resumes); its id."""
        stream = self.stream(session_id)
        event_id = f"{self.tag}-{len(stream.events) + 1}" if self.ids else None
        stream.events.append(sse(value, event_id=event_id))
        stream.grew.set()
        stream.grew = asyncio.Event()
        return event_id

    async def _on_initialize(self, request: Request) -> Answer:
        connection_id = CONNECTION_ID if not self.connection_ids else f"{CONNECTION_ID}-{len(self.connection_ids) + 1}"
        self.connection_ids.append(connection_id)
        result = initialize_result(advertise=self.advertise, load_session=self.load_session)
        return Reply(200, rpc_result(request.json()["id"], result), {"acp-connection-id": connection_id})

    async def _on_get(self, request: Request) -> Answer:
        last = request.headers.get("last-event-id")
        if last is not None and self.refusals:
            return self.refusals.pop(0)
        start = 0
        if last is not None:
            tag, _, seq = last.rpartition("-")
            if tag != self.tag:
                return Reply(
                    409, f"Last-Event-ID {last} does not belong to this stream", {"content-type": "text/plain"}
                )
            start = max(int(seq) - self.replay_overlap, 0)
        return Stream(self._feed(request.session_id, start))

    async def _feed(self, session_id: str | None, start: int) -> AsyncIterator[bytes]:
        yield b": \n\n"
        stream = self.stream(session_id)
        position = start
        while True:
            while position < len(stream.events):
                yield stream.events[position]
                position += 1
            await stream.grew.wait()


# ------------------------------------------------------------------------------- WebSocket


@dataclass(eq=False)
class WsConnection:
    id: str
    sent: list[str] = field(default_factory=list)
    received: list[str] = field(default_factory=list)
    grew: asyncio.Event = field(default_factory=asyncio.Event)
    sessions: dict[str, list[str]] = field(default_factory=dict)
    socket: ServerConnection | None = None
    #: Upgrade headers of every socket of this connection.
    upgrades: list[dict[str, str]] = field(default_factory=list)

    def send(self, value: Any) -> None:
        self.sent.append(json.dumps(value))
        self.grew.set()
        self.grew = asyncio.Event()


class ResumableWs:
    """`async with ResumableWs() as url`: a WebSocket server whose connections survive a drop."""

    def __init__(self, *, advertise: bool = True, name_connection: bool = True, load_session: bool = True) -> None:
        self.advertise = advertise
        self.name_connection = name_connection
        self.load_session = load_session
        self.connections: dict[str, WsConnection] = {}
        self.order: list[WsConnection] = []
        #: The next reattach answers this status (and body) instead of 101, then it is cleared.
        self.refuse_next: tuple[int, str] | None = None
        #: Refuse as a server without the ASGI denial-response extension does: accept, then
        #: close with 4000 + the status, the text as reason.
        self.refuse_by_close = False
        self._refusing: dict[int, tuple[int, str]] = {}
        #: The next reattach claims this many fewer of the client's messages than arrived (it
        #: "lost" them, so they must come again).
        self.pretend_lost = 0
        #: Messages the agent part received, in order, over all sockets.
        self._numbers = itertools.count(1)
        self._attaching: dict[int, tuple[WsConnection, int]] = {}
        self._server: Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/acp"

    async def __aenter__(self) -> ResumableWs:
        self._server = await serve(
            self._handler,
            "127.0.0.1",
            0,
            process_request=self._process_request,
            process_response=self._process_response,
        )
        self.port = next(iter(self._server.sockets)).getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(5):
                await self._server.wait_closed()

    def forget(self, connection_id: str) -> None:
        """The server forgets a connection (its grace period ended)."""
        state = self.connections.pop(connection_id)
        if state.socket is not None:
            state.socket.transport.abort()

    def _process_request(self, connection: ServerConnection, request: WsRequest) -> WsResponse | None:
        headers = {name.lower(): value for name, value in request.headers.raw_items()}
        connection_id = headers.get("acp-connection-id")
        if connection_id is None:
            state = WsConnection(f"ws-conn-{next(self._numbers)}")
            self.connections[state.id] = state
            self.order.append(state)
            start = 0
        else:
            if self.refuse_next is not None:
                status, body = self.refuse_next
                self.refuse_next = None
                if self.refuse_by_close:
                    self._refusing[id(connection)] = (status, body)
                    return None
                return connection.respond(status, body)
            found = self.connections.get(connection_id)
            if found is None:
                return connection.respond(404, "no such connection\n")
            state = found
            start = int(headers.get("last-event-id", "0"))
            if start > len(state.sent):
                return connection.respond(409, f"Last-Event-ID {start} does not belong to this stream")
            if self.pretend_lost:
                del state.received[len(state.received) - self.pretend_lost :]
                self.pretend_lost = 0
        state.upgrades.append(headers)
        self._attaching[id(connection)] = (state, start)
        return None

    def _process_response(self, connection: ServerConnection, request: WsRequest, response: WsResponse) -> None:
        attaching = self._attaching.get(id(connection))
        if attaching is None or response.status_code != 101 or id(connection) in self._refusing:
            return
        state, _ = attaching
        if self.name_connection:
            response.headers["Acp-Connection-Id"] = state.id
        if "acp-connection-id" in {name.lower() for name in request.headers}:
            response.headers["Acp-Received"] = str(len(state.received))

    async def _handler(self, socket: ServerConnection) -> None:
        refusal = self._refusing.pop(id(socket), None)
        if refusal is not None:
            status, text = refusal
            await socket.close(4000 + status, text.strip())
            return
        state, start = self._attaching.pop(id(socket))
        previous, state.socket = state.socket, socket
        if previous is not None:
            previous.transport.abort()  # another socket resumed this connection
        sender = asyncio.create_task(self._send_from(state, socket, start))
        try:
            async for message in socket:
                if isinstance(message, str):
                    state.received.append(message)
                    self._answer(state, json.loads(message))
        except ConnectionClosed:
            pass
        finally:
            sender.cancel()
            with contextlib.suppress(BaseException):
                await sender

    @staticmethod
    async def _send_from(state: WsConnection, socket: ServerConnection, start: int) -> None:
        position = start
        with contextlib.suppress(ConnectionClosed):
            while True:
                while position < len(state.sent):
                    await socket.send(state.sent[position])
                    position += 1
                await state.grew.wait()

    def _answer(self, state: WsConnection, message: Any) -> None:
        if not isinstance(message, dict) or "method" not in message or "id" not in message:
            return
        method, params, request_id = message["method"], message.get("params") or {}, message["id"]
        if method == "initialize":
            state.send(
                rpc_result(request_id, initialize_result(advertise=self.advertise, load_session=self.load_session))
            )
        elif method == "session/new":
            session_id = f"s-{len(state.sessions) + 1}"
            state.sessions[session_id] = []
            state.send(rpc_result(request_id, {"sessionId": session_id}))
        elif method == "session/load":
            session_id = params["sessionId"]
            for text in state.sessions.get(session_id, ["(history)"]):
                update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}
                state.send(notification("session/update", {"sessionId": session_id, "update": update}))
            state.send(rpc_result(request_id, {}))
        elif method == "x/burst":
            for index in range(params["count"]):
                # Random text: permessage-deflate must not shrink a burst below a test's cut point.
                pad = "".join(random.choices(string.ascii_letters, k=params.get("pad", 0)))
                state.send(notification("x/item", {"index": index, "pad": pad}))
            state.send(rpc_result(request_id, {"count": params["count"]}))
        else:
            state.send(rpc_result(request_id, {"echo": method}))
