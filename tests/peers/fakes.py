"""Fake ACP servers for the client tests: a raw asyncio HTTP/1.1 server whose every answer a
test can script, including the ways a server misbehaves (an error status, a missing header, a
stream that ends or breaks, malformed data, a response that never comes).

`FakeAcp` answers like a correct ACP server by default (initialize -> 200 + `acp-connection-id`,
GET -> an SSE stream fed from a per-stream queue, other POSTs -> 202, DELETE -> 202) and records
everything on one timeline (`log`), so tests can assert what happened in which order. A test
overrides one route with `fake.on_post = ...` etc., returning `Reply`, `Stream`, `Hang` or `Drop`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

CONNECTION_ID = "conn-fake-1"


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def connection_id(self) -> str | None:
        return self.headers.get("acp-connection-id")

    @property
    def session_id(self) -> str | None:
        return self.headers.get("acp-session-id")

    @property
    def sse(self) -> bool:
        return self.method == "GET" and "text/event-stream" in self.headers.get("accept", "")

    @property
    def rpc_method(self) -> str | None:
        if self.method != "POST":
            return None
        value = self.json()
        return value.get("method") if isinstance(value, dict) else "<batch>"


@dataclass
class Reply:
    status: int = 202
    body: bytes | str | Any = b""
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Stream:
    """A chunked response fed by `source`; `drop` aborts the socket at the end instead of
    finishing the body cleanly."""

    source: AsyncIterator[bytes]
    status: int = 200
    headers: dict[str, str] = field(default_factory=lambda: {"content-type": "text/event-stream"})
    drop: bool = False


@dataclass
class Hang:
    """Never answer (the request stays open until the server closes)."""


@dataclass
class Drop:
    """Close the connection without answering."""


Answer = Reply | Stream | Hang | Drop
Handler = Callable[[Request], Awaitable[Answer]]


def sse(value: Any, *, event_id: str | None = None) -> bytes:
    text = value if isinstance(value, str) else json.dumps(value)
    head = f"id: {event_id}\n" if event_id is not None else ""
    return (head + "".join(f"data: {line}\n" for line in text.split("\n")) + "\n").encode()


class FakeServer:
    """A tiny HTTP/1.1 server (keep-alive, Content-Length request bodies, chunked streaming)."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[Request] = []
        self.log: list[tuple[str, Any]] = []
        self._changed = asyncio.Condition()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._stop = asyncio.Event()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/acp"

    async def __aenter__(self) -> FakeServer:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task

    async def note(self, kind: str, detail: Any = None) -> None:
        async with self._changed:
            self.log.append((kind, detail))
            self._changed.notify_all()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        async with asyncio.timeout(timeout):
            async with self._changed:
                await self._changed.wait_for(predicate)

    def of(self, method: str, **where: Any) -> list[Request]:
        found = [r for r in self.requests if r.method == method]
        for name, value in where.items():
            found = [r for r in found if getattr(r, name) == value]
        return found

    def index(self, kind: str, predicate: Callable[[Any], bool] = lambda _: True) -> int:
        """Position on the timeline of the first `kind` entry whose detail matches."""
        for position, (entry_kind, detail) in enumerate(self.log):
            if entry_kind == kind and predicate(detail):
                return position
        raise AssertionError(f"no {kind} entry in {self.log}")

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        try:
            while await self._one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            self._writers.discard(writer)
            self._tasks.discard(task)
            writer.transport.abort()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        line = await reader.readline()
        if not line:
            return False
        method, path, _ = line.decode("latin-1").split(" ", 2)
        headers: dict[str, str] = {}
        while (header := await reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = header.decode("latin-1").partition(":")
            headers.setdefault(name.strip().lower(), value.strip())
        length = int(headers.get("content-length", "0"))
        body = await reader.readexactly(length) if length else b""
        request = Request(method, path, headers, body)
        self.requests.append(request)
        await self.note("request", request)
        answer = await self.handler(request)
        if isinstance(answer, Drop):
            return False
        if isinstance(answer, Hang):
            await self._stop.wait()
            return False
        if isinstance(answer, Reply):
            body = answer.body
            if not isinstance(body, bytes | str):
                body = json.dumps(body)
                answer.headers.setdefault("content-type", "application/json")
            data = body.encode() if isinstance(body, str) else body
            head = {"content-length": str(len(data)), **answer.headers}
            writer.write(_head(answer.status, head) + data)
            await writer.drain()
            await self.note("answered", (request, answer.status))
            return True
        writer.write(_head(answer.status, {"transfer-encoding": "chunked", **answer.headers}))
        await writer.drain()
        await self.note("stream-open", request)
        async for chunk in answer.source:
            if chunk:
                writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                await writer.drain()
        if answer.drop:
            return False
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await self.note("stream-end", request)
        return True


def _head(status: int, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} Fake"] + [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class FakeAcp(FakeServer):
    """A scriptable ACP server. Streams are fed through `push(session_id, data)`; pushing None
    ends that stream cleanly. `on_initialize`, `on_get`, `on_post`, `on_delete` replace a route;
    `on_call(request)` runs after a default POST is accepted (e.g. to push a reply)."""

    def __init__(self) -> None:
        super().__init__(self._route)
        self.streams: dict[str | None, asyncio.Queue[bytes | None]] = {}
        self.on_initialize: Handler | None = None
        self.on_get: Handler | None = None
        self.on_post: Handler | None = None
        self.on_delete: Handler | None = None
        self.on_call: Callable[[Request], Awaitable[None]] | None = None
        self.init_headers: dict[str, str] = {}

    def queue(self, session_id: str | None) -> asyncio.Queue[bytes | None]:
        return self.streams.setdefault(session_id, asyncio.Queue())

    def push(self, session_id: str | None, value: Any, *, event_id: str | None = None) -> None:
        """Queue an event (any JSON value, or raw bytes as they are) for a stream."""
        data = value if isinstance(value, bytes) or value is None else sse(value, event_id=event_id)
        self.queue(session_id).put_nowait(data)

    async def feed(self, session_id: str | None) -> AsyncIterator[bytes]:
        yield b": \n\n"
        queue = self.queue(session_id)
        while (item := await queue.get()) is not None:
            yield item

    async def _route(self, request: Request) -> Answer:
        if request.method == "POST" and request.rpc_method == "initialize":
            if self.on_initialize is not None:
                return await self.on_initialize(request)
            reply = {"jsonrpc": "2.0", "id": request.json()["id"], "result": {"protocolVersion": 1}}
            return Reply(200, reply, {"acp-connection-id": CONNECTION_ID, **self.init_headers})
        if request.method == "GET":
            if self.on_get is not None:
                return await self.on_get(request)
            return Stream(self.feed(request.session_id))
        if request.method == "DELETE":
            if self.on_delete is not None:
                return await self.on_delete(request)
            return Reply(202)
        if self.on_post is not None:
            return await self.on_post(request)
        if self.on_call is not None:
            await self.on_call(request)
        return Reply(202)


async def within(awaitable: Any, seconds: float = 5.0) -> Any:
    """The awaitable's result, or TimeoutError: a client test never hangs on a fake."""
    async with asyncio.timeout(seconds):
        return await awaitable
