"""`StdioAgentChannel`: one agent process serving one ACP connection (see the package's docstring).

Client frames become stdin lines, stdout lines become frames, relayed as fast as the host takes
them; the channel knows which client requests are unanswered, so that an agent exiting on its own
leaves none without an answer.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from subprocess import SubprocessError
from typing import Any

from acp_channels import _protocol as protocol
from acp_channels._agents.channel import AgentClosed, FrameSink, RoomWaiter
from acp_channels._agents.stdio.pipes import LINE_HEADROOM, StderrLog, read_line, stdin_line
from acp_channels._agents.stdio.process import DEFAULT_SHUTDOWN_GRACE, AgentProcess, describe_status
from acp_channels._agents.stdio.setting import CONNECTION_ENV, agent_environment, configured_setting
from acp_channels._identity import AgentContext
from acp_channels._protocol import Frame, Malformed, Single

logger = logging.getLogger("acp_channels.agent")


class StdioAgentChannel:
    """One agent process serving one ACP connection (an AgentChannel)."""

    def __init__(
        self,
        command: Sequence[str],
        *,
        cwd: str | Path | None = None,
        env: Mapping[str, str] | None = None,
        connection_id: str = "",
        shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE,
        max_line_bytes: int = 16 * 1024 * 1024 + LINE_HEADROOM,
    ) -> None:
        self.command = list(command)
        self.connection_id = connection_id
        self.pid: int | None = None
        #: The exit status once the agent is gone (negative: killed by that signal).
        self.returncode: int | None = None
        self._grace = shutdown_grace
        self._max_line = max_line_bytes
        self._outbox: asyncio.Queue[Frame | None] = asyncio.Queue(maxsize=1)
        self._sink: FrameSink | None = None  # see direct_sink
        self._room: RoomWaiter | None = None
        self._pending: dict[str, list[Any]] = {}  # id key -> the ids of unanswered client requests
        self._write_lock = asyncio.Lock()
        self._started = asyncio.Event()  # the process was started, or could not be
        self._stdout_ended = asyncio.Event()
        self._stopped = asyncio.Event()  # the process is gone and reaped: returncode is known
        self._process: AgentProcess | None = None
        self._pump: asyncio.Task[None] | None = None
        self._closing = False  # close() was called: abortive, nothing more is relayed
        self._finished = False  # receive() has returned None
        self._reported = False  # the agent's end was reported: nothing more is answered
        self._stderr = StderrLog(connection_id)
        environment = {**(os.environ if env is None else env), CONNECTION_ENV: connection_id}
        self._task = _keep(asyncio.get_running_loop().create_task(self._run(cwd, environment)))

    @classmethod
    def from_setting(
        cls, spec: Mapping[str, Any], context: AgentContext, *, shutdown_grace: float, max_line_bytes: int
    ) -> StdioAgentChannel:
        """A channel for the command form of `ACP_CHANNELS["AGENT"]`, configured for `context`
        (AgentConfigurationError, with nothing started, when its `configure` fails)."""
        setting = configured_setting(spec, context)
        return cls(
            setting["command"],
            cwd=setting.get("cwd"),
            env=agent_environment(setting, context),
            connection_id=context.connection_id,
            shutdown_grace=shutdown_grace,
            max_line_bytes=max_line_bytes,
        )

    # -- AgentChannel ----------------------------------------------------------------------

    async def send(self, frame: Frame) -> None:
        """Write a client frame to stdin (waits while the agent does not read: backpressure).

        Once the agent has exited on its own, requests sent before its end is reported get the
        exit error like the ones it left unanswered; after that, AgentClosed.
        """
        await self._started.wait()
        process = self._process
        if self._closing or self._reported or process is None:
            raise AgentClosed("agent process is not running")
        line = stdin_line(frame)
        if line is None:  # text that cannot be one line: answered as the agent's side would
            assert isinstance(frame, Malformed)
            await self._outbox.put(Single(frame.error))
            return
        keys = self._track(frame)
        try:
            async with self._write_lock:
                if not process.exited.is_set():
                    process.stdin.write(line)
                    await process.stdin.drain()
        except (ConnectionError, OSError) as error:  # its stdin is closed: it exited, or is exiting
            if self._closing or self._reported:
                self._untrack(keys)
                raise AgentClosed("agent process is not running") from error

    def direct_sink(self, sink: FrameSink | None, room: RoomWaiter | None = None) -> None:
        """Hand each output line's frame to `sink` as it is read, while nothing waits in the
        outbox (the order stays the agent's); then wait for `room` before reading the next line.
        The host counts a frame from the moment it takes it, so what a connection holds of its
        agent's output is its budget plus the line being handed over."""
        self._sink = sink
        self._room = room

    def _sunk(self, frame: Frame) -> bool:
        sink = self._sink
        return sink is not None and self._outbox.empty() and sink(frame)

    async def receive(self) -> Frame | None:
        if self._finished:
            return None
        frame = await self._outbox.get()
        if frame is None:
            self._finished = True
        return frame

    async def close(self) -> None:
        """End the connection now; the process is stopped in the background (see wait_closed)."""
        if self._closing:
            return
        self._closing = True
        if self._pump is not None:
            self._pump.cancel()
        while not self._outbox.empty():  # abortive: output not yet taken is dropped
            self._outbox.get_nowait()
        self._outbox.put_nowait(None)

    async def wait_closed(self) -> int | None:
        """Wait until the process is gone and reaped; its exit status (None: it never started)."""
        await asyncio.shield(self._task)
        return self.returncode

    # -- lifetime --------------------------------------------------------------------------

    async def _run(self, cwd: str | Path | None, env: dict[str, str]) -> None:
        """Start the process, relay its output until stdout ends or close(), then stop it."""
        try:
            process = await AgentProcess.start(
                self.command, cwd=cwd, env=env, grace=self._grace, connection_id=self.connection_id
            )
        except (OSError, ValueError, SubprocessError) as error:
            logger.error("agent for connection %s could not start %s: %s", self.connection_id, self.command, error)
            self._started.set()
            self._stopped.set()
            if not self._closing:
                self._outbox.put_nowait(None)
            return
        self._process, self.pid = process, process.pid
        self._started.set()
        loop = asyncio.get_running_loop()
        stderr = loop.create_task(self._stderr.read(process.stderr, process.pid))
        self._pump = loop.create_task(self._relay(process.stdout))
        if self._closing:
            self._pump.cancel()
        stdout_ended = loop.create_task(self._stdout_ended.wait())
        exited = loop.create_task(process.exited.wait())
        try:
            # Relay until stdout ends (the agent is ending) or close() cancels the relay. If the
            # agent exits first, what is left of its group goes, so nothing holds stdout open.
            done, _ = await asyncio.wait([self._pump, stdout_ended, exited], return_when=asyncio.FIRST_COMPLETED)
            if done == {exited}:
                process.clear_group()
                await asyncio.wait([self._pump, stdout_ended], return_when=asyncio.FIRST_COMPLETED)
            self.returncode = await process.stop()
        except asyncio.CancelledError:
            # The event loop is going away under a running agent: the atexit hook stops it.
            for task in (self._pump, stderr, stdout_ended, exited):
                task.cancel()
            raise
        finally:
            exited.cancel()
            stdout_ended.cancel()
        if self._closing:
            logger.info(
                "agent for connection %s (pid %d) stopped: %s",
                self.connection_id,
                process.pid,
                describe_status(self.returncode),
            )
        await asyncio.wait([stderr], timeout=self._grace)
        stderr.cancel()
        process.close()
        self._stopped.set()

    async def _relay(self, stdout: asyncio.StreamReader) -> None:
        """stdout lines -> frames, one at a time, as fast as receive() takes them; at the end,
        once the process is gone, errors for the requests it left unanswered, then None."""
        try:
            while (line := await read_line(stdout, self._max_line, self.connection_id)) is not None:
                text = line.decode("utf-8", errors="replace").removesuffix("\r")
                if not text.strip():
                    continue
                frame = protocol.parse_frame(text)
                self._settle(frame)
                if not self._sunk(frame):
                    await self._outbox.put(frame)
                elif self._room is not None:
                    await self._room()  # stdout is not read meanwhile: the agent blocks on its pipe
        except Exception:
            logger.exception("reading the output of the agent for connection %s failed", self.connection_id)
        self._stdout_ended.set()
        await self._stopped.wait()
        for frame in self._report_exit():
            await self._outbox.put(frame)
        await self._outbox.put(None)

    def _report_exit(self) -> list[Frame]:
        """The agent ended on its own: one log line, and an error for each unanswered request."""
        self._reported = True
        status = describe_status(self.returncode)
        pending = [request_id for ids in self._pending.values() for request_id in ids]
        self._pending.clear()
        level = logging.INFO if self.returncode == 0 and not pending else logging.WARNING
        last = f"; last stderr line: {self._stderr.last!r}" if self._stderr.last and level > logging.INFO else ""
        logger.log(
            level,
            "agent for connection %s (pid %s) exited with %s; %d pending request(s) answered with an error%s",
            self.connection_id,
            self.pid,
            status,
            len(pending),
            last,
        )
        message = f"agent process exited with {status}"
        return [Single(protocol.error_response(request_id, protocol.INTERNAL_ERROR, message)) for request_id in pending]

    # -- which client requests are unanswered ----------------------------------------------

    def _track(self, frame: Frame) -> list[str]:
        keys = []
        for message in protocol.frame_messages(frame):
            if "method" in message and message.get("id") is not None:
                key = protocol.id_key(message["id"])
                self._pending.setdefault(key, []).append(message["id"])
                keys.append(key)
        return keys

    def _untrack(self, keys: list[str]) -> None:
        for key in keys:
            ids = self._pending.get(key)
            if ids:
                ids.pop()
                if not ids:
                    del self._pending[key]

    def _settle(self, frame: Frame) -> None:
        """Forget the client requests an agent frame answers."""
        for message in protocol.frame_messages(frame):
            if "method" not in message and message.get("id") is not None:
                ids = self._pending.get(protocol.id_key(message["id"]))
                if ids:
                    ids.pop(0)
                    if not ids:
                        del self._pending[protocol.id_key(message["id"])]


#: Tasks that must finish even when nothing else refers to them.
_tasks: set[asyncio.Future[Any]] = set()


def _keep(task: asyncio.Future[Any]) -> asyncio.Future[Any]:
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)
    return task
