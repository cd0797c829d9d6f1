"""`CutProxy`: a TCP proxy on a free loopback port that a test can use to break connections the
way a network does, at a moment it chooses.

* every connection is forwarded to an upstream port (round-robin over `upstreams`);
  `route_to(port, ...)` sends new connections elsewhere, so a reconnect lands on another worker;
* the HTTP requests on each connection are parsed as they pass (heads, Content-Length bodies;
  after a WebSocket upgrade only bytes are counted), so a test can pick "the connection carrying
  the session stream of s1" or "the WebSocket";
* `cut(where)` aborts matching connections now; `cut_after(n, where)` arms a cut that fires
  once a matching connection has carried `n` more bytes towards the client, in the middle of
  whatever it is carrying (an SSE event, a WebSocket frame);
* `cut_before_text_frame(where)` arms a cut that fires when a matching WebSocket next carries a
  text frame towards the server: that frame is swallowed (the server never gets it) and the
  connection cut, as when a client's last message dies with the network (control frames, a
  browser's pongs, pass; a frame is recognised by the first byte of a read, which holds for the
  small frames tests send);
* `keep_upstream=True` leaves the server's side open (it believes its reader is still there,
  as when a network path dies silently), so the client's retry must take the stream over.

Runs on the test's event loop (`async with CutProxy(port) as proxy`), or on a thread of its own
for synchronous tests (`ThreadedCutProxy`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Self, TypeVar

T = TypeVar("T")
_READ = 65536
_OPCODE_MASK = 0x0F
_TEXT_OPCODE = 0x1


@dataclass
class RequestHead:
    method: str
    path: str
    headers: dict[str, str]

    @property
    def session_id(self) -> str | None:
        return self.headers.get("acp-session-id")

    @property
    def sse(self) -> bool:
        return self.method == "GET" and "text/event-stream" in self.headers.get("accept", "")

    @property
    def websocket(self) -> bool:
        return self.headers.get("upgrade", "").lower() == "websocket"


class _RequestParser:
    """HTTP/1.1 request heads in a byte stream (bodies skipped by Content-Length); stops at a
    WebSocket upgrade or at anything it cannot follow (a chunked body)."""

    def __init__(self, seen: Callable[[RequestHead], None]) -> None:
        self._seen = seen
        self._buffer = bytearray()
        self._skip = 0
        self.done = False

    def feed(self, data: bytes) -> None:
        if self.done:
            return
        self._buffer += data
        while not self.done:
            if self._skip:
                taken = min(self._skip, len(self._buffer))
                del self._buffer[:taken]
                self._skip -= taken
                if self._skip:
                    return
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self._buffer[:end]).decode("latin-1").split("\r\n")
            del self._buffer[: end + 4]
            method, path, *_ = [*head[0].split(" "), "", ""]
            headers: dict[str, str] = {}
            for line in head[1:]:
                name, _, value = line.partition(":")
                headers.setdefault(name.strip().lower(), value.strip())
            request = RequestHead(method, path, headers)
            self._seen(request)
            if request.websocket or "chunked" in headers.get("transfer-encoding", "").lower():
                self.done = True
                return
            self._skip = int(headers.get("content-length", "0") or 0)


@dataclass(eq=False)
class ProxiedConnection:
    number: int
    upstream: int
    requests: list[RequestHead] = field(default_factory=list)
    bytes_up: int = 0
    bytes_down: int = 0
    cut: bool = False
    #: Cut with the server's side left open.
    upstream_kept: bool = False
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    client_writer: asyncio.StreamWriter | None = None
    upstream_writer: asyncio.StreamWriter | None = None

    @property
    def request(self) -> RequestHead | None:
        """The latest request on this connection (the one it is carrying now)."""
        return self.requests[-1] if self.requests else None

    @property
    def sse(self) -> bool:
        return self.request is not None and self.request.sse

    @property
    def websocket(self) -> bool:
        return self.request is not None and self.request.websocket

    @property
    def session_id(self) -> str | None:
        return self.request.session_id if self.request is not None else None


Where = Callable[[ProxiedConnection], bool]


def any_connection(connection: ProxiedConnection) -> bool:
    return True


def streams(connection: ProxiedConnection) -> bool:
    """SSE streams and WebSockets: the connections that carry the agent's messages."""
    return connection.sse or connection.websocket


def websocket(connection: ProxiedConnection) -> bool:
    return connection.websocket


def session_stream(session_id: str | None) -> Where:
    """The SSE stream of one session (None: the connection stream)."""
    return lambda connection: connection.sse and connection.session_id == session_id


@dataclass(eq=False)
class _ArmedCut:
    after: int
    where: Where
    keep_upstream: bool
    done: asyncio.Future[ProxiedConnection]
    counted: dict[int, int] = field(default_factory=dict)


class CutProxy:
    def __init__(self, *upstreams: int) -> None:
        if not upstreams:
            raise ValueError("CutProxy needs an upstream port")
        self.route_to(*upstreams)
        self.port = 0
        self.connections: list[ProxiedConnection] = []
        self.cuts = 0
        self._numbers = itertools.count(1)
        self._armed: list[_ArmedCut] = []
        self._armed_up: list[tuple[Where, asyncio.Future[ProxiedConnection]]] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Condition()

    # ------------------------------------------------------------------------------ setup

    def route_to(self, *upstreams: int) -> None:
        """New connections go to these ports from now on (round-robin)."""
        self.upstreams = list(upstreams)
        self._next_upstream = itertools.cycle(self.upstreams)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/acp"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/acp"

    def endpoint(self, transport: str) -> str:
        return self.url if transport == "http" else self.ws_url

    async def start(self) -> Self:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for connection in self.connections:
            self._abort(connection, keep_upstream=False)
            if connection.upstream_kept and connection.upstream_writer is not None:
                connection.upstream_writer.transport.abort()
        if self._tasks:  # they end once their sockets are aborted (cancelling them logs noise)
            _, pending = await asyncio.wait(set(self._tasks), timeout=5)
            for task in pending:
                task.cancel()
        for armed in self._armed:
            armed.done.cancel()
        for _, done in self._armed_up:
            done.cancel()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------------------ cutting

    def live(self, where: Where = any_connection) -> list[ProxiedConnection]:
        return [c for c in self.connections if not c.closed.is_set() and not c.cut and where(c)]

    def cut(self, where: Where = any_connection, *, keep_upstream: bool = False) -> int:
        """Abort every live connection `where` selects; how many were cut."""
        chosen = self.live(where)
        for connection in chosen:
            self._abort(connection, keep_upstream=keep_upstream)
        return len(chosen)

    def cut_after(
        self, after: int, where: Where = streams, *, keep_upstream: bool = False
    ) -> asyncio.Future[ProxiedConnection]:
        """Arm a cut: the first connection `where` selects that carries `after` more bytes to the
        client is cut right there (those bytes delivered, nothing after). The future gives it."""
        done: asyncio.Future[ProxiedConnection] = asyncio.get_running_loop().create_future()
        self._armed.append(_ArmedCut(after, where, keep_upstream, done))
        return done

    def cut_before_text_frame(self, where: Where = websocket) -> asyncio.Future[ProxiedConnection]:
        """Arm a cut: the next text frame the client sends on a WebSocket `where` selects is
        dropped, not forwarded, and the connection cut there. The future gives it."""
        done: asyncio.Future[ProxiedConnection] = asyncio.get_running_loop().create_future()
        self._armed_up.append((where, done))
        return done

    def _take_armed_up(self, connection: ProxiedConnection, data: bytes) -> asyncio.Future[ProxiedConnection] | None:
        if not connection.websocket or not data or data[0] & _OPCODE_MASK != _TEXT_OPCODE:
            return None
        for armed in self._armed_up:
            where, done = armed
            if not done.done() and where(connection):
                self._armed_up.remove(armed)
                return done
        return None

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
        """Wait until `predicate()` holds (checked whenever a request or a connection passes)."""
        async with asyncio.timeout(timeout):
            async with self._changed:
                await self._changed.wait_for(predicate)

    def _abort(self, connection: ProxiedConnection, *, keep_upstream: bool) -> None:
        if connection.cut:
            return
        connection.cut = True
        connection.upstream_kept = keep_upstream
        self.cuts += 1
        if connection.client_writer is not None:
            connection.client_writer.transport.abort()
        if connection.upstream_writer is not None and not keep_upstream:
            connection.upstream_writer.transport.abort()

    # ---------------------------------------------------------------------------- forwarding

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        upstream = next(self._next_upstream)
        connection = ProxiedConnection(next(self._numbers), upstream, client_writer=client_writer)
        self.connections.append(connection)
        try:
            try:
                upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", upstream)
            except OSError:
                client_writer.transport.abort()  # that worker is down: the client sees a reset
                return
            connection.upstream_writer = upstream_writer

            parser = _RequestParser(lambda request: connection.requests.append(request))
            await asyncio.gather(
                self._pipe_up(connection, client_reader, upstream_writer, parser),
                self._pipe_down(connection, upstream_reader, client_writer),
            )
        finally:
            connection.closed.set()
            if not connection.cut:  # both sides ended: close after what is buffered
                client_writer.close()
                if connection.upstream_writer is not None:
                    connection.upstream_writer.close()
            self._tasks.discard(task)
            await self._notify()

    async def _pipe_up(
        self,
        connection: ProxiedConnection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        parser: _RequestParser,
    ) -> None:
        try:
            while data := await reader.read(_READ):
                if connection.cut:
                    return
                if (armed_up := self._take_armed_up(connection, data)) is not None:
                    self._abort(connection, keep_upstream=False)
                    armed_up.set_result(connection)
                    return
                before = len(connection.requests)
                parser.feed(data)
                connection.bytes_up += len(data)
                writer.write(data)
                await writer.drain()
                if len(connection.requests) != before:
                    await self._notify()
        except (ConnectionError, OSError):
            pass
        finally:
            if not connection.cut:
                with contextlib.suppress(Exception):
                    writer.write_eof()

    async def _pipe_down(
        self, connection: ProxiedConnection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            while data := await reader.read(_READ):
                if connection.cut:
                    return
                data, armed = self._take_armed(connection, data)
                connection.bytes_down += len(data)
                writer.write(data)
                if armed is not None:
                    self._abort(connection, keep_upstream=armed.keep_upstream)
                    if not armed.done.done():
                        armed.done.set_result(connection)
                    return
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            if not connection.cut:
                with contextlib.suppress(Exception):
                    writer.write_eof()

    def _take_armed(self, connection: ProxiedConnection, data: bytes) -> tuple[bytes, _ArmedCut | None]:
        """`data` as far as an armed cut lets it go, and that cut (None: no cut yet)."""
        for armed in self._armed:
            if armed.done.done() or not armed.where(connection):
                continue
            counted = armed.counted.get(connection.number, 0)
            if counted + len(data) >= armed.after:
                self._armed.remove(armed)
                return data[: max(armed.after - counted, 0)], armed
            armed.counted[connection.number] = counted + len(data)
        return data, None


class ThreadedCutProxy:
    """A `CutProxy` on an event loop of its own, for synchronous tests."""

    def __init__(self, *upstreams: int) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._upstreams = upstreams
        self.proxy: CutProxy | None = None

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(30)

    def __enter__(self) -> CutProxy:
        self._thread.start()

        async def start() -> CutProxy:
            return await CutProxy(*self._upstreams).start()

        self.proxy = self._run(start())
        return self.proxy

    def cut(self, where: Where = any_connection, *, keep_upstream: bool = False) -> int:
        assert self.proxy is not None
        proxy = self.proxy

        async def cut() -> int:
            return proxy.cut(where, keep_upstream=keep_upstream)

        return self._run(cut())

    def cut_before_text_frame(self, where: Where = websocket) -> concurrent.futures.Future[ProxiedConnection]:
        """`CutProxy.cut_before_text_frame`, armed from the test's thread; wait on the future."""
        assert self.proxy is not None
        proxy = self.proxy

        async def armed() -> asyncio.Future[ProxiedConnection]:
            return proxy.cut_before_text_frame(where)

        cut = self._run(armed())
        return asyncio.run_coroutine_threadsafe(self._wait(cut), self._loop)

    def route_to(self, *upstreams: int) -> None:
        """`CutProxy.route_to`, on the proxy's loop."""
        assert self.proxy is not None
        proxy = self.proxy

        async def route() -> None:
            proxy.route_to(*upstreams)

        self._run(route())

    @staticmethod
    async def _wait(future: asyncio.Future[T]) -> T:
        return await future

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
        """`CutProxy.wait_for`, from the test's thread."""
        assert self.proxy is not None
        self._run(self.proxy.wait_for(predicate, timeout))

    def __exit__(self, *exc: object) -> None:
        if self.proxy is not None:
            self._run(self.proxy.stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
