"""An ACP client on the raw wire, for the load generator: HTTP+SSE and WebSocket, same surface.

Messages from the server are parsed (orjson) and dispatched: replies to the client's control
requests (initialize, session/new) resolve futures; everything else (session updates, agent
requests, prompt replies) goes to `sink`, the scenario's checker, synchronously and in arrival
order, so a scenario sees exactly the order the wire carried.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

try:
    import orjson
except ImportError:  # the suite's load test runs it without the benchmark's extras
    import json

    class orjson:  # type: ignore[no-redef]  # the two calls used here
        @staticmethod
        def loads(data: bytes | str) -> Any:
            return json.loads(data)

        @staticmethod
        def dumps(value: Any) -> bytes:
            return json.dumps(value, separators=(",", ":")).encode()


from bench.wire import HttpConnection, SseStream, WebSocket

Message = dict[str, Any]
Sink = Callable[[Message], None]

JSON = {"Content-Type": "application/json"}
SSE = {"Accept": "text/event-stream"}
INIT_PARAMS = {"protocolVersion": 1, "clientCapabilities": {}}


class ProtocolError(AssertionError):
    pass


#: How long a client waits for a control reply or a stream's response head (a real client's
#: default); `step_timeout` changes it.
STEP_TIMEOUT = 30.0


class AcpClient:
    """Common dispatch; subclasses move bytes."""

    transport = "?"

    def __init__(self, url: str, step_timeout: float = STEP_TIMEOUT) -> None:
        self.url = url
        self.step_timeout = step_timeout
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Message]] = {}
        self.sink: Sink = self._unexpected
        self.unexpected: list[Message] = []
        self.session_id: str | None = None

    def next_id(self) -> int:
        return next(self._ids)

    def _unexpected(self, message: Message) -> None:
        self.unexpected.append(message)

    def _deliver(self, data: bytes) -> None:
        message = orjson.loads(data)
        if isinstance(message, list):
            for item in message:
                self._one(item)
        else:
            self._one(message)

    def _one(self, message: Message) -> None:
        if "method" not in message:
            future = self._pending.pop(message.get("id"), None)  # type: ignore[arg-type]
            if future is not None:
                if not future.done():
                    future.set_result(message)
                return
        self.sink(message)

    async def call(self, method: str, params: Any, session: str | None = None) -> Message:
        """A control request whose reply is awaited (never for prompts: those go to the sink)."""
        request_id = self.next_id()
        future = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        await self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}, session)
        try:
            reply = await asyncio.wait_for(future, self.step_timeout)
        except TimeoutError:
            raise TimeoutError(f"no reply to {method} within {self.step_timeout:g} s") from None
        if "error" in reply:
            raise ProtocolError(f"{method}: {reply['error']}")
        return reply

    def closed_reason(self) -> str:
        """Why no answer may come: the server closed a stream or the socket (else "")."""
        return ""

    async def open(self) -> None:
        raise NotImplementedError

    async def new_session(self) -> str:
        raise NotImplementedError

    async def send(self, message: Message, session: str | None = None) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    def prompt(self, request_id: int, text: str) -> Message:
        assert self.session_id is not None
        return {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": "session/prompt",
            "params": {"sessionId": self.session_id, "prompt": [{"type": "text", "text": text}]},
        }


class HttpAcp(AcpClient):
    """POST on one keep-alive connection; a connection stream and a session stream (SSE)."""

    transport = "http"

    def __init__(
        self,
        url: str,
        post_url: str | None = None,
        stream_url: str | None = None,
        wait_head: bool = True,
        step_timeout: float = STEP_TIMEOUT,
    ) -> None:
        """`post_url` / `stream_url` send POSTs or stream GETs to another address than `url`
        (the initialize POST): the cross-worker layouts of the cluster benchmark. `wait_head`
        False does not wait for a stream's response head before going on (for a server that
        sends it only with the first event; the status is still checked when it comes)."""
        super().__init__(url, step_timeout)
        self.wait_head = wait_head
        self.connection_id: str | None = None
        self._init_conn = HttpConnection(url)
        self._post = HttpConnection(post_url) if post_url else self._init_conn
        self._stream_url = stream_url or url
        self.streams: list[SseStream] = []
        self.statuses: list[int] = []

    async def open(self) -> None:
        body = orjson.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": INIT_PARAMS})
        response = await self._init_conn.request("POST", JSON, body)
        if response.status != 200 or "acp-connection-id" not in response.headers:
            raise ProtocolError(f"initialize: {response.status} {response.body[:200]!r}")
        reply = orjson.loads(response.body)
        if reply.get("id") != 0 or "result" not in reply:
            raise ProtocolError(f"initialize reply: {reply}")
        self.connection_id = response.headers["acp-connection-id"]
        await self._open_stream(None)

    async def _open_stream(self, session: str | None) -> None:
        assert self.connection_id is not None
        headers = {**SSE, "Acp-Connection-Id": self.connection_id}
        if session is not None:
            headers["Acp-Session-Id"] = session
        stream = await SseStream.open(self._stream_url, headers, self._deliver)
        self.streams.append(stream)
        if not self.wait_head:
            stream.head.add_done_callback(self._late_head)
            return
        try:
            head = await asyncio.wait_for(stream.head, self.step_timeout)
        except TimeoutError:
            raise TimeoutError(f"no head for GET stream within {self.step_timeout:g} s") from None
        if head.status != 200:
            raise ProtocolError(f"GET stream: {head.status}")

    def _late_head(self, head: asyncio.Future[Any]) -> None:
        if not head.cancelled() and (head.exception() is not None or head.result().status != 200):
            self.unexpected.append({"late stream head": str(head.exception() or head.result().status)})

    async def new_session(self) -> str:
        reply = await self.call("session/new", {"cwd": "/tmp", "mcpServers": []})
        self.session_id = reply["result"]["sessionId"]
        await self._open_stream(self.session_id)
        return self.session_id

    async def send(self, message: Message, session: str | None = None) -> None:
        assert self.connection_id is not None
        headers = {**JSON, "Acp-Connection-Id": self.connection_id}
        if session is not None:
            headers["Acp-Session-Id"] = session
        response = await self._post.request("POST", headers, orjson.dumps(message))
        if response.status != 202:
            raise ProtocolError(f"POST {message.get('method', 'response')}: {response.status} {response.body[:200]!r}")

    async def close(self) -> None:
        if self.connection_id is not None:
            response = await self._post.request("DELETE", {"Acp-Connection-Id": self.connection_id})
            self.statuses.append(response.status)
            if not 200 <= response.status < 300:
                raise ProtocolError(f"DELETE: {response.status}")
            # The streams end once the connection is gone; wait briefly, then close anyway.
            await asyncio.wait([asyncio.ensure_future(asyncio.shield(s.ended)) for s in self.streams], timeout=5)
        self.abort()

    def closed_reason(self) -> str:
        ended = sum(1 for stream in self.streams if stream.ended.done())
        return f"the server ended {ended} of {len(self.streams)} SSE streams" if ended else ""

    def abort(self) -> None:
        for stream in self.streams:
            stream.close()
        self._init_conn.close()
        self._post.close()


class WsAcp(AcpClient):
    """One WebSocket: one JSON-RPC message per text frame, both ways."""

    transport = "ws"

    def __init__(self, url: str, step_timeout: float = STEP_TIMEOUT) -> None:
        super().__init__(url.replace("http://", "ws://"), step_timeout)
        self.socket: WebSocket | None = None

    async def open(self) -> None:
        self.socket = await WebSocket.open(self.url, self._deliver)
        reply = await self.call("initialize", INIT_PARAMS)
        if "result" not in reply:
            raise ProtocolError(f"initialize: {reply}")

    async def new_session(self) -> str:
        reply = await self.call("session/new", {"cwd": "/tmp", "mcpServers": []})
        self.session_id = reply["result"]["sessionId"]
        return self.session_id

    async def send(self, message: Message, session: str | None = None) -> None:
        assert self.socket is not None
        self.socket.send_text(orjson.dumps(message))

    async def close(self) -> None:
        if self.socket is not None:
            self.socket.close()
            await asyncio.wait_for(asyncio.shield(self.socket.ended), 5)

    def closed_reason(self) -> str:
        return "the server closed the WebSocket" if self.socket is not None and self.socket.ended.done() else ""

    def abort(self) -> None:
        if self.socket is not None and self.socket.transport is not None:
            self.socket.transport.close()


def make_client(transport: str, url: str, **options: Any) -> AcpClient:
    if transport == "http":
        return HttpAcp(url, **options)
    return WsAcp(url, **{key: value for key, value in options.items() if key == "step_timeout"})
