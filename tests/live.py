"""Test helpers that run a real daphne process on loopback and talk to it over the wire.

`DaphneServer` starts `python -m daphne demo_project.asgi:application` on a free port, with
`ACP_*` environment variables choosing the agent and settings (forked from the preloaded
tests/forkserver.py unless `exec=True` or ACP_TEST_FORK=0), and waits for daphne's own
"Listening on" log line (an event, not a sleep); `UvicornServer` does the same under uvicorn,
`HypercornServer` under hypercorn. Given a `tls` certificate (`tls_certificate()`, made on the
fly) each serves https:// instead: daphne and hypercorn then offer HTTP/2 through ALPN,
uvicorn only HTTP/1.1; hypercorn also serves cleartext h2c on http://.
`SseReader` reads events from a live stream. For clients that misbehave on purpose (never read,
stall, send too much) `RawConnection` is a bare socket with a chosen receive buffer, with
`RawSse` and `RawWebSocket` speaking just enough HTTP/1.1 and WebSocket on top of it;
`memory(pid)` reads a process's resident set size from /proc.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import re
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Self

import httpx

from demo_project.devcert import DevCertificate, write_certificate
from tests import forkserver
from tests.forkserver import Forked

ROOT = Path(__file__).resolve().parent.parent
MAX_MESSAGE = 16 * 1024 * 1024 + 4096  # the 16 MiB body limit plus JSON-RPC framing
LISTENING = re.compile(r"Listening on TCP address [\d.]+:(\d+)")


@dataclass
class ServerProcess:
    """A server process on loopback that logs its port once it listens; `start()` waits for that
    line (an event, not a sleep) and `log` keeps everything it printed."""

    listening: ClassVar[re.Pattern[str]]
    #: Read the process's log from stderr only (stdout discarded), or stdout with stderr merged.
    log_from_stderr: ClassVar[bool] = False
    port: int = 0
    process: subprocess.Popen[str] | Forked | None = None
    log: list[str] = field(default_factory=list)
    started: bool = False
    #: SIGTERM was sent (`terminate`): not again (a second one may mean "now" to a server).
    terminated: bool = False

    #: Serve https:// and wss:// with this certificate (where the server supports it).
    tls: DevCertificate | None = None
    _listening: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}/acp"

    @property
    def ws_url(self) -> str:
        return f"{'wss' if self.tls else 'ws'}://127.0.0.1:{self.port}/acp"

    def command(self) -> tuple[list[str], Path, dict[str, str] | None]:
        """argv, working directory and environment."""
        raise NotImplementedError

    def start(self, timeout: float = 30.0) -> Self:
        return self.spawn().wait_listening(timeout)

    def spawn(self) -> Self:
        """Start the process without waiting for it (`wait_listening` does): several servers
        then start side by side."""
        argv, cwd, env = self.command()
        self.process = self.popen(argv, cwd, env)
        self.terminated = False
        self._listening = threading.Event()
        threading.Thread(target=self._pump, args=(self._listening,), daemon=True).start()
        return self

    def wait_listening(self, timeout: float = 30.0) -> Self:
        if not self._listening.wait(timeout) or not self.started:
            self.stop()
            raise RuntimeError(f"{self.command()[0]} did not start:\n" + "".join(self.log))
        return self

    def popen(self, argv: list[str], cwd: Path, env: dict[str, str] | None) -> subprocess.Popen[str] | Forked:
        return subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL if self.log_from_stderr else subprocess.PIPE,
            stderr=subprocess.PIPE if self.log_from_stderr else subprocess.STDOUT,
            text=True,
        )

    def _pump(self, ready: threading.Event) -> None:
        assert self.process is not None
        output = self.process.stderr if self.log_from_stderr else self.process.stdout
        assert output is not None
        for line in output:
            self.log.append(line)
            if not self.started and (match := self.listening.search(line)):
                self.ready(match)
                self.started = True
                ready.set()
        ready.set()

    def ready(self, match: re.Match[str]) -> None:
        """The process said it listens (`listening` matched)."""
        self.port = int(match.group(1))

    def terminate(self) -> None:
        """SIGTERM, once, without waiting: several servers stop side by side (`stop` waits)."""
        if self.process is not None and self.process.poll() is None and not self.terminated:
            self.terminated = True
            self.process.terminate()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@contextlib.contextmanager
def reserved_port() -> Iterator[int]:
    """A free loopback port that stays ours until a server listens on it: a socket bound (not
    listening) with SO_REUSEADDR holds it, and a server that binds with SO_REUSEADDR too
    (daphne: Twisted does) takes it over; close the context once it listens."""
    holder = socket.socket()
    try:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", 0))
        yield holder.getsockname()[1]
    finally:
        holder.close()


@dataclass
class DaphneServer(ServerProcess):
    """One daphne worker process serving the demo project (with `tls`: https:// and wss://,
    h2 offered through ALPN)."""

    listening: ClassVar[re.Pattern[str]] = LISTENING
    log_from_stderr: ClassVar[bool] = True  # Django's and our logging; not the access log
    env: dict[str, str] = field(default_factory=dict)
    #: Run `python -m daphne` itself rather than fork it from the preloaded forkserver
    #: (tests/forkserver.py): for tests about how a server starts.
    exec: bool = False
    #: Listen there (`reserved_port`) when the site must know its own URL before it starts;
    #: 0: a free port, read from daphne's log.
    listen_port: int = 0

    def command(self) -> tuple[list[str], Path, dict[str, str] | None]:
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "DJANGO_SETTINGS_MODULE": "demo_project.settings",
            "ACP_SHUTDOWN_GRACE_SECONDS": "2",  # stop() sends SIGTERM: drain briefly
            **self.env,
        }
        port = self.listen_port
        endpoint = f"tcp:port={port}:interface=127.0.0.1:backlog=2048"
        if self.tls is not None:
            endpoint = (
                f"ssl:port={port}:interface=127.0.0.1:backlog=2048:privateKey={self.tls.key}:certKey={self.tls.cert}"
            )
        daphne = [
            sys.executable, "-m", "daphne",
            "-e", endpoint,
            # A burst of upgrades (test_cluster_load) can outlive daphne's 5 s handshake timeout.
            "--websocket_connect_timeout", "60",
            "--websocket_timeout", "-1",
            "--websocket-max-message-size", str(MAX_MESSAGE),
            "--websocket-max-frame-size", str(MAX_MESSAGE),
            "demo_project.asgi:application",
        ]  # fmt: skip
        return daphne, ROOT, env

    def popen(self, argv: list[str], cwd: Path, env: dict[str, str] | None) -> subprocess.Popen[str] | Forked:
        if self.exec or not forkserver.enabled():
            return super().popen(argv, cwd, env)
        assert env is not None and argv[1] == "-m"
        return forkserver.forkserver().spawn(argv[2:], cwd, env)

    def errors(self) -> list[str]:
        """Tracebacks and server errors in the log (a 500 must never happen silently)."""
        return [line for line in self.log if "Traceback" in line or " 500 " in line]


@dataclass
class RunnerProcess(DaphneServer):
    """`python manage.py acp_runner` (as `python -m django acp_runner`): hosts agents for web
    workers with AGENT_HOSTS "runners", serves no HTTP; `runner_id` once it is ready."""

    listening: ClassVar[re.Pattern[str]] = re.compile(r"acp runner (\w+) ready")
    runner_id: str = ""

    def command(self) -> tuple[list[str], Path, dict[str, str] | None]:
        _, cwd, env = super().command()
        return [sys.executable, "-m", "django", "acp_runner"], cwd, env

    def ready(self, match: re.Match[str]) -> None:
        self.runner_id = match.group(1)


@dataclass
class UvicornServer(ServerProcess):
    """One uvicorn process (uvicorn[standard]: httptools, websockets) serving the demo project
    (with `tls`: https://, HTTP/1.1 only, uvicorn has no HTTP/2)."""

    listening: ClassVar[re.Pattern[str]] = re.compile(r"LISTENING (\d+)")
    env: dict[str, str] = field(default_factory=dict)

    def command(self) -> tuple[list[str], Path, dict[str, str] | None]:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "demo_project.settings", **self.env}
        tls = f", ssl_certfile={str(self.tls.cert)!r}, ssl_keyfile={str(self.tls.key)!r}" if self.tls else ""
        script = (
            "from tests.peers.py_sdk_server import serve_uvicorn; "
            f"serve_uvicorn('demo_project.asgi:application', 0, access_log=False, ws_max_size={MAX_MESSAGE}{tls})"
        )
        return [sys.executable, "-c", script], ROOT, env


@dataclass
class HypercornServer(ServerProcess):
    """One hypercorn process serving the demo project: HTTP/2 over TLS with a certificate,
    otherwise HTTP/1.1 and cleartext h2c (prior knowledge or an Upgrade) on the same port."""

    listening: ClassVar[re.Pattern[str]] = re.compile(r"Running on https?://[\d.]+:(\d+)")
    env: dict[str, str] = field(default_factory=dict)

    def command(self) -> tuple[list[str], Path, dict[str, str] | None]:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "demo_project.settings", **self.env}
        argv = [sys.executable, "-m", "hypercorn", "--bind", "127.0.0.1:0", "--backlog", "2048"]
        if self.tls is not None:
            argv += ["--certfile", str(self.tls.cert), "--keyfile", str(self.tls.key)]
        return [*argv, "demo_project.asgi:application"], ROOT, env


_certificate: DevCertificate | None = None


def tls_certificate() -> DevCertificate:
    """A self-signed loopback certificate for this test run, made once, in a temporary directory
    (never in the repository)."""
    global _certificate
    if _certificate is None:
        _certificate = write_certificate(Path(tempfile.mkdtemp(prefix="acp-tls-")))
    return _certificate


def memory(pid: int) -> tuple[int, int]:
    """(resident set size, its peak) of a process in bytes, from /proc/<pid>/status."""
    fields: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                fields[name] = int(value.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


async def settle_paused(
    server: ServerProcess, taken: Callable[[], Awaitable[int]], deadline: float = 30.0
) -> tuple[int, int]:
    """Wait until an agent flooding a client that does not read is paused and the server's memory
    stops growing: `taken()` (the frames the agent got out) and RSS unchanged (RSS within 1 MiB)
    over one second. Polls, as there is no event to await in another process. Returns (frames
    taken, RSS)."""
    assert server.process is not None
    window: list[tuple[int, int]] = []
    stop = time.monotonic() + deadline
    while time.monotonic() < stop:
        window = [*window[-4:], (await taken(), memory(server.process.pid)[0])]
        if len(window) == 5 and len({count for count, _ in window}) == 1:
            sizes = [size for _, size in window]
            if max(sizes) - min(sizes) < 1024 * 1024:
                return window[-1]
        await asyncio.sleep(0.25)
    raise AssertionError(f"the server did not settle: {window}")


_flood_stats_ids = itertools.count()


@contextlib.asynccontextmanager
async def flood_counter(http: httpx.AsyncClient, url: str) -> AsyncIterator[Callable[[], Awaitable[int]]]:
    """Asks, over another ACP connection on the same process, how many flood frames the
    hosts have taken from their agents so far."""
    connection_id = await initialize(http, url)
    async with open_sse(http, url, connection_id) as stream:

        async def taken() -> int:
            request_id = f"stats-{next(_flood_stats_ids)}"
            response = await post(http, url, rpc(request_id, "test/flood_stats"), connection_id)
            assert response.status_code == 202, response.text
            reply = await stream.next()
            assert reply["id"] == request_id, reply
            count: int = reply["result"]["taken"]
            return count

        yield taken
    await http.delete(url, headers={"Acp-Connection-Id": connection_id})


def reset_peak_memory(pid: int) -> bool:
    """Start a process's peak RSS (VmHWM) again from its current RSS (Linux >= 4.0)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        return False
    return True


class RawConnection:
    """A plain TCP connection to a test server, with a chosen kernel receive buffer (set before
    connecting, so the window the server sees is small too). The asyncio stream stops reading
    the socket once `read_limit` bytes wait unread, so a client that stops reading really does."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(
        cls,
        port: int,
        receive_buffer: int | None = None,
        read_limit: int = 64 * 1024,
        tls: ssl.SSLContext | None = None,
    ) -> RawConnection:
        """`tls`: speak TLS with this context (HTTP/1.1 inside: offer only http/1.1 by ALPN)."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        if tls is None:
            reader, writer = await asyncio.open_connection(sock=sock, limit=read_limit)
        else:
            reader, writer = await asyncio.open_connection(
                sock=sock, limit=read_limit, ssl=tls, server_hostname="127.0.0.1"
            )
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def response_head(self) -> tuple[int, dict[str, str]]:
        """Status and headers (lower-case names) of the next response."""
        head = await self.reader.readuntil(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        return int(status_line.split()[1]), headers

    async def response(self) -> tuple[int, dict[str, str], bytes]:
        """The next whole response with a Content-Length body (server-made answers have one)."""
        status, headers = await self.response_head()
        body = await self.reader.readexactly(int(headers.get("content-length", "0")))
        return status, headers, body

    async def closed_by_server(self) -> bool:
        """Whether the server closed the connection (end of stream, or a reset) with nothing more."""
        try:
            return await self.reader.read(1) == b""
        except ConnectionError:
            return True

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


class RawSse:
    """An SSE stream read off a raw connection: chunked transfer decoding, then events."""

    def __init__(self, connection: RawConnection) -> None:
        self.connection = connection
        self.comments = 0
        self._buffer = bytearray()
        self._ended = False
        #: The `id:` of the last event read.
        self.last_id: str | None = None

    @classmethod
    async def open(
        cls, connection: RawConnection, connection_id: str, path: str = "/acp", session_id: str | None = None
    ) -> RawSse:
        session = f"Acp-Session-Id: {session_id}\r\n" if session_id is not None else ""
        await connection.send(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n"
            f"Acp-Connection-Id: {connection_id}\r\n{session}\r\n".encode()
        )
        status, headers = await connection.response_head()
        assert status == 200 and headers.get("transfer-encoding") == "chunked", (status, headers)
        return cls(connection)

    async def _read_chunk(self) -> None:
        reader = self.connection.reader
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            self._ended = True
            return
        self._buffer += await reader.readexactly(size)
        await reader.readexactly(2)

    async def _next_block(self) -> list[bytes] | None:
        """The data lines of the next event or comment ([] for a comment); None at the end."""
        while (end := self._buffer.find(b"\n\n")) < 0:
            if self._ended:
                return None
            await self._read_chunk()
        block = bytes(self._buffer[:end])
        del self._buffer[: end + 2]
        for line in block.split(b"\n"):
            if line.startswith(b"id:"):
                self.last_id = line[3:].removeprefix(b" ").decode()
        return [line[5:].removeprefix(b" ") for line in block.split(b"\n") if line.startswith(b"data:")]

    async def next_event(self) -> str | None:
        """The data of the next event (comments are counted and skipped); None once it ended."""
        while (data := await self._next_block()) == []:
            self.comments += 1
        return None if data is None else b"\n".join(data).decode()

    async def wait_comments(self, count: int) -> None:
        """Read on until `count` comments (keep-alives) in all have arrived, and no event."""
        while self.comments < count:
            data = await self._next_block()
            assert data == [], f"expected a comment, got {data!r}"
            self.comments += 1


class RawWebSocket:
    """A client WebSocket on a raw connection: the upgrade, masked text frames out, whole
    messages in (pings answered)."""

    def __init__(self, connection: RawConnection, headers: dict[str, str]) -> None:
        self.connection = connection
        self.headers = headers

    @classmethod
    async def open(cls, connection: RawConnection, path: str = "/acp") -> RawWebSocket:
        key = base64.b64encode(os.urandom(16)).decode()
        await connection.send(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        status, headers = await connection.response_head()
        assert status == 101, (status, headers)
        return cls(connection, headers)

    async def _send_frame(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)
        size = len(payload)
        if size < 126:
            head = struct.pack("!BB", 0x80 | opcode, 0x80 | size)
        elif size < 1 << 16:
            head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, size)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, size)
        masked = bytes(byte ^ mask[index % 4] for index, byte in enumerate(payload))
        await self.connection.send(head + mask + masked)

    async def send_text(self, text: str) -> None:
        await self._send_frame(0x1, text.encode())

    async def receive(self) -> str | None:
        """The next text message; None once the server closed the WebSocket."""
        reader = self.connection.reader
        parts: list[bytes] = []
        while True:
            first, second = await reader.readexactly(2)
            size = second & 0x7F
            if size == 126:
                (size,) = struct.unpack("!H", await reader.readexactly(2))
            elif size == 127:
                (size,) = struct.unpack("!Q", await reader.readexactly(8))
            payload = await reader.readexactly(size)
            opcode = first & 0x0F
            if opcode == 0x8:
                return None
            if opcode == 0x9:
                await self._send_frame(0xA, payload)
                continue
            if opcode in (0x0, 0x1):
                parts.append(payload)
                if first & 0x80:
                    return b"".join(parts).decode()


JSON = {"Content-Type": "application/json"}
SSE = {"Accept": "text/event-stream"}


def rpc(request_id: Any, method: str, params: Any = None) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return message


def notification(method: str, params: Any = None) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        message["params"] = params
    return message


class SseReader:
    """Reads one live SSE response: `await reader.next()` is the next event's data (parsed JSON
    when it parses, else the raw text); `last_id` is then that event's `id:` (None without one).
    `ended` is set once the body ends."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.comments = 0
        #: The comments that say something (not the empty keep-alives), in order.
        self.comment_lines: list[str] = []
        self.error: BaseException | None = None  # set when the body ended abnormally
        self._events: asyncio.Queue[tuple[str | None, Any]] = asyncio.Queue()
        self.last_id: str | None = None
        self.ended = asyncio.Event()
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        data: list[str] = []
        event_id: str | None = None
        try:
            async for line in self.response.aiter_lines():
                if line == "":
                    if data:
                        text = "\n".join(data)
                        try:
                            self._events.put_nowait((event_id, json.loads(text)))
                        except ValueError:
                            self._events.put_nowait((event_id, text))
                        data = []
                        event_id = None
                elif line.startswith(":"):
                    self.comments += 1
                    if line.strip(": "):
                        self.comment_lines.append(line)
                elif line.startswith("data:"):
                    data.append(line[5:].removeprefix(" "))
                elif line.startswith("id:"):
                    event_id = line[3:].removeprefix(" ")
        except asyncio.CancelledError:
            pass
        except httpx.HTTPError as error:
            self.error = error
        finally:
            self.ended.set()

    async def next(self, timeout: float = 10.0) -> Any:
        self.last_id, value = await asyncio.wait_for(self._events.get(), timeout)
        return value

    async def next_or_end(self, timeout: float = 10.0) -> Any | None:
        """The next event's data, or None once the body ended with nothing left to read."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._events.empty() and not self.ended.is_set():
            waiters = [asyncio.ensure_future(self._events.get()), asyncio.ensure_future(self.ended.wait())]
            done, pending = await asyncio.wait(
                waiters, timeout=deadline - loop.time(), return_when=asyncio.FIRST_COMPLETED
            )
            for waiter in pending:
                waiter.cancel()
            if waiters[0] in done:
                self.last_id, value = waiters[0].result()
                return value
            if not done:
                raise TimeoutError
        if self._events.empty():
            return None
        self.last_id, value = self._events.get_nowait()
        return value

    def pending(self) -> list[Any]:
        """Events already received and not yet taken."""
        items = []
        while not self._events.empty():
            self.last_id, value = self._events.get_nowait()
            items.append(value)
        return items

    async def wait_ended(self, timeout: float = 10.0) -> None:
        await asyncio.wait_for(self.ended.wait(), timeout)

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(BaseException):
            await self._task
        await self.response.aclose()


@contextlib.asynccontextmanager
async def open_sse(
    client: httpx.AsyncClient, url: str, connection_id: str, session_id: str | None = None, **extra: str
) -> AsyncIterator[SseReader]:
    """GET a stream, assert 200, and yield a reader; the response is closed on exit. `extra`:
    more request headers (credentials)."""
    headers = {**SSE, **extra, "Acp-Connection-Id": connection_id}
    if session_id is not None:
        headers["Acp-Session-Id"] = session_id
    request = client.build_request("GET", url, headers=headers)
    response = await client.send(request, stream=True)
    if response.status_code != 200:
        await response.aread()
        raise AssertionError(f"GET stream: {response.status_code} {response.text}")
    reader = SseReader(response)
    try:
        yield reader
    finally:
        await reader.close()


async def initialize(client: httpx.AsyncClient, url: str, params: dict[str, Any] | None = None) -> str:
    """POST initialize and return the new connection id."""
    response = await client.post(url, headers=JSON, json=rpc(0, "initialize", params or {"protocolVersion": 1}))
    assert response.status_code == 200, response.text
    return response.headers["acp-connection-id"]


async def post(
    client: httpx.AsyncClient,
    url: str,
    body: Any,
    connection_id: str | None = None,
    session_id: str | None = None,
    **headers: str,
) -> httpx.Response:
    all_headers = {**JSON, **headers}
    if connection_id is not None:
        all_headers["Acp-Connection-Id"] = connection_id
    if session_id is not None:
        all_headers["Acp-Session-Id"] = session_id
    content = body if isinstance(body, str | bytes) else json.dumps(body)
    return await client.post(url, headers=all_headers, content=content)


async def wait_for_line(server: Any, pattern: str, timeout: float = 10.0) -> str:
    """The first line of `server.log` matching `pattern` (polled: the log is another process's
    output, read by a thread)."""
    compiled = re.compile(pattern)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        for line in list(server.log):
            if compiled.search(line):
                return line
        await asyncio.sleep(0.05)
    raise AssertionError(f"no log line matches {pattern!r}")
