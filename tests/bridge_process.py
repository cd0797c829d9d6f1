"""`BridgeProcess`: a real `python -m acp_channels.bridge URL` process, driven as an editor
drives a stdio agent: JSON-RPC lines written to its stdin, lines read from its stdout, its
stderr kept for assertions. Forked from the forkserver (tests/forked.py) unless ACP_TEST_FORK=0."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
from collections.abc import Sequence
from typing import Any, Self

from tests import forked
from tests.forked import ForkedProcess
from tests.live import ROOT

STEP_SECONDS = 30.0
#: Lines of at most this many bytes are read from the bridge's stdout (16 MiB messages and more).
READ_LIMIT = 64 * 1024 * 1024


class BridgeProcess:
    def __init__(self, url: str, *args: str, env: dict[str, str] | None = None) -> None:
        self.argv = [sys.executable, "-m", "acp_channels.bridge", url, *args]
        self.env = {
            **{name: value for name, value in os.environ.items() if name != "ACP_TOKEN"},
            "PYTHONPATH": str(ROOT),
            **(env or {}),
        }
        self.process: asyncio.subprocess.Process | ForkedProcess | None = None
        self.stderr_lines: list[str] = []
        self._stderr_changed = asyncio.Event()
        self._stderr_task: asyncio.Task[None] | None = None
        self._next_id = 0

    async def start(self) -> Self:
        self.process = await forked.create_subprocess_exec(
            *self.argv,
            cwd=ROOT,
            env=self.env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            limit=READ_LIMIT,
        )
        self._stderr_task = asyncio.create_task(self._pump_stderr())
        return self

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.kill()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    async def _pump_stderr(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        while line := await self.process.stderr.readline():
            self.stderr_lines.append(line.decode(errors="replace").rstrip("\n"))
            self._stderr_changed.set()
        self._stderr_changed.set()

    @property
    def stderr(self) -> str:
        return "\n".join(self.stderr_lines)

    async def stderr_line(self, pattern: str, timeout: float = STEP_SECONDS) -> re.Match[str]:
        """The first stderr line matching `pattern` (waits for it)."""
        compiled = re.compile(pattern)
        async with asyncio.timeout(timeout):
            while True:
                for line in self.stderr_lines:
                    if match := compiled.search(line):
                        return match
                if self._stderr_task is not None and self._stderr_task.done():
                    raise AssertionError(f"stderr ended without {pattern!r}:\n{self.stderr}")
                self._stderr_changed.clear()
                await self._stderr_changed.wait()

    async def connection_id(self) -> str:
        return (await self.stderr_line(r"connected: connection (\S+)")).group(1)

    # ---------------------------------------------------------------------------- stdin/stdout

    async def write_line(self, text: str | bytes) -> None:
        assert self.process is not None and self.process.stdin is not None
        data = text if isinstance(text, bytes) else text.encode()
        self.process.stdin.write(data + b"\n")
        await self.process.stdin.drain()

    async def send(self, value: Any) -> None:
        await self.write_line(json.dumps(value))

    def new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    async def request(self, method: str, params: Any = None) -> int:
        """Send a request; returns its id."""
        request_id = self.new_id()
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        await self.send(message)
        return request_id

    async def read_line(self, timeout: float = STEP_SECONDS) -> str | None:
        """The next stdout line (without its newline); None at end of output."""
        assert self.process is not None and self.process.stdout is not None
        async with asyncio.timeout(timeout):
            line = await self.process.stdout.readline()
        return line.decode().removesuffix("\n") if line else None

    async def receive(self, timeout: float = STEP_SECONDS) -> Any:
        line = await self.read_line(timeout)
        assert line is not None, f"the bridge's stdout ended:\n{self.stderr}"
        return json.loads(line)

    async def reply_to(self, request_id: int, *, collect: list[Any] | None = None) -> dict[str, Any]:
        """Read until the response to `request_id`; other messages go to `collect` (or fail)."""
        while True:
            message = await self.receive()
            if isinstance(message, dict) and "method" not in message and message.get("id") == request_id:
                return message
            if collect is None:
                raise AssertionError(f"unexpected message before the reply to {request_id}: {message}")
            collect.append(message)

    async def call(self, method: str, params: Any = None, *, collect: list[Any] | None = None) -> Any:
        """A request and its result (an error reply fails)."""
        reply = await self.reply_to(await self.request(method, params), collect=collect)
        assert "result" in reply, reply
        return reply["result"]

    async def initialize(self, **capabilities: Any) -> dict[str, Any]:
        result: dict[str, Any] = await self.call(
            "initialize", {"protocolVersion": 1, "clientCapabilities": capabilities}
        )
        return result

    async def new_session(self, cwd: str) -> str:
        result = await self.call("session/new", {"cwd": cwd, "mcpServers": []})
        session_id: str = result["sessionId"]
        return session_id

    async def prompt(self, session_id: str, text: str) -> tuple[dict[str, Any], list[Any]]:
        """Prompt and read until its reply: (reply, messages that came before it)."""
        before: list[Any] = []
        params = {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]}
        reply = await self.reply_to(await self.request("session/prompt", params), collect=before)
        return reply, before

    # ---------------------------------------------------------------------------------- the end

    async def close_stdin(self) -> None:
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.close()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            await self.process.stdin.wait_closed()

    def signal(self, signum: signal.Signals) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    async def wait(self, timeout: float = STEP_SECONDS) -> int:
        """The exit status (waits for the process and its stderr)."""
        assert self.process is not None
        async with asyncio.timeout(timeout):
            status = await self.process.wait()
            if self._stderr_task is not None:
                await self._stderr_task
        return status

    async def rest_of_output(self, timeout: float = STEP_SECONDS) -> list[Any]:
        """Every message left on stdout until it ends."""
        messages = []
        while (line := await self.read_line(timeout)) is not None:
            messages.append(json.loads(line))
        return messages

    async def kill(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            await self.process.wait()
        if self._stderr_task is not None:
            self._stderr_task.cancel()
            with contextlib.suppress(BaseException):
                await self._stderr_task


def text_updates(messages: Sequence[Any]) -> list[str]:
    """The text of every agent_message_chunk among `messages`."""
    return [
        message["params"]["update"]["content"]["text"]
        for message in messages
        if isinstance(message, dict)
        and message.get("method") == "session/update"
        and message["params"]["update"].get("sessionUpdate") == "agent_message_chunk"
    ]
