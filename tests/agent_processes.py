"""The agent processes a test run started, found through /proc (Linux): every stdio agent has
ACP_CHANNELS_CONNECTION_ID in its environment, and this process adopts orphans, so an agent
whose server died is still found here (as a descendant) instead of vanishing under init."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from pathlib import Path

MARKER = b"ACP_CHANNELS_CONNECTION_ID="
PR_SET_CHILD_SUBREAPER = 36
PROC = Path("/proc")


def supported() -> bool:
    return sys.platform.startswith("linux") and PROC.is_dir()


def adopt_orphans() -> None:
    """Become the subreaper of everything this process starts, at any depth."""
    if supported():
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, None once it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    state, ppid = text.rpartition(")")[2].split()[:2]
    return state, int(ppid)


def alive(pid: int) -> bool:
    """Running (a zombie, exited and not yet reaped, is not)."""
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def reaped(pid: int) -> bool:
    """No such process at all, not even a zombie waiting to be reaped."""
    return _stat(pid) is None


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            children.setdefault(stat[1], []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _describe(pid: int) -> str | None:
    """The command line of a live agent process, None if the process is no agent of ours."""
    with contextlib.suppress(OSError):
        if alive(pid) and MARKER in (PROC / str(pid) / "environ").read_bytes():
            return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    return None


def running_agents(root: int | None = None) -> dict[int, str]:
    """Agent processes below `root` (this process by default) that are still running."""
    agents = {}
    for pid in descendants(os.getpid() if root is None else root):
        if (command := _describe(pid)) is not None:
            agents[pid] = command
    return agents


def wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    """Wait (a bounded poll: there is no event for another process's end) until none of `pids`
    runs; the ones still running after `timeout`."""
    deadline = time.monotonic() + timeout
    while (left := [pid for pid in pids if alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def leftover_agents(timeout: float = 10.0) -> dict[int, str]:
    """Agents still running after `timeout`; they are killed so nothing outlives the run."""
    if not supported():
        return {}
    left = running_agents()
    still = wait_gone(list(left), timeout)
    for pid in still:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return {pid: left[pid] for pid in still}
