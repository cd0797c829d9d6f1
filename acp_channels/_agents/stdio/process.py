"""An agent's OS process: started in a session and process group of its own (on Linux also tied
to the life of the server thread that started it), stopped in steps (`AgentProcess.stop`: stdin
closed, SIGTERM, SIGKILL, then the rest of its group), and stopped the same way at interpreter exit
when it is still running (`stop_all_at_exit`). The package's docstring tells the whole sequence.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import functools
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from subprocess import PIPE
from typing import Any, Final

from acp_channels._agents.stdio.pipes import READ_CHUNK

logger = logging.getLogger("acp_channels.agent")

DEFAULT_SHUTDOWN_GRACE: Final = 2.0


class AgentProcess:
    """One agent program, running: its pipes, an event set as soon as it exits, and its stop."""

    @classmethod
    async def start(
        cls, command: Sequence[str], *, cwd: str | Path | None, env: Mapping[str, str], grace: float, connection_id: str
    ) -> AgentProcess:
        """Start `command` in a new session (OSError, ValueError or SubprocessError when it cannot
        be started)."""
        loop = asyncio.get_running_loop()
        exited = asyncio.Event()
        transport, stream_protocol = await loop.subprocess_exec(
            lambda: _AgentProtocol(exited, loop),
            *command,
            stdin=PIPE,
            stdout=PIPE,
            stderr=PIPE,
            cwd=cwd,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent(),
        )
        process = asyncio.subprocess.Process(transport, stream_protocol, loop)
        return cls(process, transport, exited, grace, connection_id)

    def __init__(
        self,
        process: asyncio.subprocess.Process,
        transport: asyncio.SubprocessTransport,
        exited: asyncio.Event,
        grace: float,
        connection_id: str,
    ) -> None:
        assert process.stdin is not None and process.stdout is not None and process.stderr is not None
        self.pid = process.pid
        self.stdin, self.stdout, self.stderr = process.stdin, process.stdout, process.stderr
        #: Set when the process exits (its pipes may still be open).
        self.exited = exited
        self.grace = grace
        self.connection_id = connection_id
        self._process = process
        self._transport = transport
        self._group_cleared = False
        _running[self.pid] = self

    async def stop(self) -> int | None:
        """Close stdin, wait, SIGTERM, wait, SIGKILL; then clear what is left of its group. The
        exit status (negative: killed by that signal)."""
        with contextlib.suppress(Exception):
            self.stdin.close()
        if not await self._wait_exit(self.grace):
            logger.info(
                "agent for connection %s (pid %d) still running %g s after stdin closed: SIGTERM",
                self.connection_id,
                self.pid,
                self.grace,
            )
            _signal_group(self.pid, signal.SIGTERM)
            if not await self._wait_exit(self.grace):
                logger.warning(
                    "agent for connection %s (pid %d) ignored SIGTERM for %g s: SIGKILL",
                    self.connection_id,
                    self.pid,
                    self.grace,
                )
                _signal_group(self.pid, signal.SIGKILL)
                await self.exited.wait()
        returncode = self._process.returncode
        self.clear_group()
        return returncode

    def clear_group(self) -> None:
        """The agent is gone: SIGTERM the rest of its group now, SIGKILL after the grace."""
        if self._group_cleared:
            return
        self._group_cleared = True
        pgid = self.pid
        try:
            os.killpg(pgid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            return
        _leftover_groups.add(pgid)

        def kill() -> None:
            _leftover_groups.discard(pgid)
            _signal_group(pgid, signal.SIGKILL)

        asyncio.get_running_loop().call_later(self.grace, kill)

    def close(self) -> None:
        """The agent was stopped and its output read: close the pipes, and forget it."""
        self._transport.close()
        _running.pop(self.pid, None)

    async def _wait_exit(self, timeout: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.exited.wait(), timeout)
        return self.exited.is_set()


def describe_status(returncode: int | None) -> str:
    if returncode is None:
        return "an unknown status"
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-returncode).name}"
        return f"signal {-returncode}"
    return f"exit status {returncode}"


class _AgentProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """The standard subprocess protocol, plus an event when the process exits (asyncio's own
    wait() also waits for every pipe to close, which a paused stdout never does)."""

    def __init__(self, exited: asyncio.Event, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=READ_CHUNK, loop=loop)
        self._exited_event = exited

    def process_exited(self) -> None:
        super().process_exited()
        self._exited_event.set()


# -- process groups, and nothing outliving the server -----------------------------------------

#: Agents started and not yet reaped, by pid (the atexit hook stops them).
_running: dict[int, AgentProcess] = {}
#: Process groups whose leader is gone but that may still have members.
_leftover_groups: set[int] = set()


def _signal_group(pgid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


_PR_SET_PDEATHSIG: Final = 1


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn that makes the agent get SIGKILL if the server dies first (Linux).

    The kernel ties this to the thread that forks, so it is only used from the main thread
    (where servers run their event loop): a worker thread ending would kill the agent.
    """
    prctl = _prctl()
    if prctl is None or threading.current_thread() is not threading.main_thread():
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the server died before the call: die now
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


@functools.cache
def _prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _exited(pid: int) -> bool:
    """Whether a child has exited, without reaping it (asyncio's child watcher does that)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _wait_all(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while (alive := [pid for pid in pids if not _exited(pid)]) and time.monotonic() < deadline:
        time.sleep(0.02)
    return alive


@atexit.register
def stop_all_at_exit() -> None:
    """The server is exiting: stop every agent still running (close stdin, wait, SIGTERM, wait,
    SIGKILL), then kill what is left of their groups."""
    agents = list(_running.values())
    if agents:
        logger.info("exiting: stopping %d agent process(es)", len(agents))
        grace = max(agent.grace for agent in agents)
        for agent in agents:
            pipe = agent.stdin.transport.get_extra_info("pipe")
            with contextlib.suppress(Exception):
                if pipe is not None:
                    pipe.close()  # the agent sees the end of its input
        alive = _wait_all([agent.pid for agent in agents], grace)
        for pid in alive:
            _signal_group(pid, signal.SIGTERM)
        for pid in _wait_all(alive, grace):
            _signal_group(pid, signal.SIGKILL)
        _leftover_groups.update(agent.pid for agent in agents)
    for pgid in list(_leftover_groups):
        _signal_group(pgid, signal.SIGKILL)
    _leftover_groups.clear()
    _running.clear()
