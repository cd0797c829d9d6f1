"""Test helpers that run a real daphne process on loopback and talk to it over the wire.

`DaphneServer` starts `python -m daphne demo_project.asgi:application` on a free port, with
`ACP_*` environment variables choosing the agent and settings, and waits for daphne's own
"Listening on" log line (an event, not a sleep). `SseReader` reads events from a live stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Self

import httpx

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
    process: subprocess.Popen[str] | None = None
    log: list[str] = field(default_factory=list)

    def command(self) -> tuple[list[str], Path, dict[str, str] | None]:
        """argv, working directory and environment."""
        raise NotImplementedError

    def start(self, timeout: float = 30.0) -> Self:
        argv, cwd, env = self.command()
        self.process = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL if self.log_from_stderr else subprocess.PIPE,
            stderr=subprocess.PIPE if self.log_from_stderr else subprocess.STDOUT,
            text=True,
        )
        ready = threading.Event()
        threading.Thread(target=self._pump, args=(ready,), daemon=True).start()
        if not ready.wait(timeout) or not self.port:
            self.stop()
            raise RuntimeError(f"{argv} did not start:\n" + "".join(self.log))
        return self

    def _pump(self, ready: threading.Event) -> None:
        assert self.process is not None
        output = self.process.stderr if self.log_from_stderr else self.process.stdout
        assert output is not None
        for line in output:
            self.log.append(line)
            if not self.port and (match := self.listening.search(line)):
                self.port = int(match.group(1))
                ready.set()
        ready.set()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class DaphneServer(ServerProcess):
    """One daphne worker process serving the demo project."""

    listening: ClassVar[re.Pattern[str]] = LISTENING
    log_from_stderr: ClassVar[bool] = True  # Django's and our logging; not the access log
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/acp"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/acp"

    def command(self) -> tuple[list[str], Path, dict[str, str] | None]:
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "DJANGO_SETTINGS_MODULE": "demo_project.settings",
            "ACP_SHUTDOWN_GRACE_SECONDS": "2",  # stop() sends SIGTERM: drain briefly
            **self.env,
        }
        daphne = [
            sys.executable, "-m", "daphne",
            "-e", "tcp:port=0:interface=127.0.0.1:backlog=2048",
            "--websocket_timeout", "-1",
            "--websocket-max-message-size", str(MAX_MESSAGE),
            "--websocket-max-frame-size", str(MAX_MESSAGE),
            "demo_project.asgi:application",
        ]  # fmt: skip
        return daphne, ROOT, env

    def errors(self) -> list[str]:
        """Tracebacks and server errors in the log (a 500 must never happen silently)."""
        return [line for line in self.log if "Traceback" in line or " 500 " in line]


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
    when it parses, else the raw text). `ended` is set once the body ends."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.comments = 0
        self.error: BaseException | None = None  # set when the body ended abnormally
        self._events: asyncio.Queue[Any] = asyncio.Queue()
        self.ended = asyncio.Event()
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        data: list[str] = []
        try:
            async for line in self.response.aiter_lines():
                if line == "":
                    if data:
                        text = "\n".join(data)
                        try:
                            self._events.put_nowait(json.loads(text))
                        except ValueError:
                            self._events.put_nowait(text)
                        data = []
                elif line.startswith(":"):
                    self.comments += 1
                elif line.startswith("data:"):
                    data.append(line[5:].removeprefix(" "))
        except asyncio.CancelledError:
            pass
        except httpx.HTTPError as error:
            self.error = error
        finally:
            self.ended.set()

    async def next(self, timeout: float = 10.0) -> Any:
        return await asyncio.wait_for(self._events.get(), timeout)

    def pending(self) -> list[Any]:
        """Events already received and not yet taken."""
        items = []
        while not self._events.empty():
            items.append(self._events.get_nowait())
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
    client: httpx.AsyncClient, url: str, connection_id: str, session_id: str | None = None
) -> AsyncIterator[SseReader]:
    """GET a stream, assert 200, and yield a reader; the response is closed on exit."""
    headers = {**SSE, "Acp-Connection-Id": connection_id}
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
