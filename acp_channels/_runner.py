"""A runner: a process that hosts agents and serves no HTTP (`python manage.py acp_runner`,
docs/runners.md).

With AGENT_HOSTS = "runners" the web workers host no connection: each `initialize` (or
WebSocket upgrade) is placed on a live runner with room (`_gateway.placement`), which creates
the connection here (`_gateway.opening`) under the same caps as a worker (MAX_CONNECTIONS,
MAX_STDIO_AGENTS, the output budget, the principal's quota). Every later request reaches it
through the channel layer like a connection hosted by another worker (`_gateway.serve`).

The runner publishes its load with its heartbeat. On SIGTERM (or Ctrl-C) it drains: it says
so in its load and refuses new connections, lets the ones it hosts go on until they end or
RUNNER_DRAIN_SECONDS pass, then ends the rest ("shutdown") and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from acp_channels import _journal
from acp_channels._conf import acp_settings
from acp_channels._gateway import opening  # noqa: F401  (serves Open: placements, attachments)
from acp_channels._host import registry
from acp_channels._lifecycle import lifecycle
from acp_channels._worker import WORKER_ID, bus

logger = logging.getLogger("acp_channels.runner")


def load() -> dict[str, Any]:
    """What this runner publishes for placement (read on its event loop)."""
    refusal = registry.full()
    return {
        "connections": len(registry),
        "stdio_agents": registry.stdio_agents(),
        "room": refusal is None and not lifecycle.draining,
        "draining": lifecycle.draining,
    }


async def drain(deadline: float) -> None:
    """Take no new connection; wait for the hosted ones to end, at most `deadline` seconds; then
    end the rest."""
    lifecycle.draining = True
    logger.info("runner %s draining: %d connections", WORKER_ID, len(registry))
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(deadline):
            await registry.wait_empty()
    if len(registry):
        logger.info("runner %s: drain deadline passed, ending %d connections", WORKER_ID, len(registry))
        await registry.terminate_all()


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


async def run(announce: Callable[[str], object] = _to_stderr) -> None:
    """Serve placements until SIGTERM or SIGINT, then drain and return. `announce` gets one line
    once the runner takes placements (what process managers and tests wait for)."""
    if not bus.shared:
        raise RuntimeError("a runner needs a channel layer other processes share (CHANNEL_LAYERS on Redis)")
    bus.load = load
    bus.ensure_listening()
    _journal.enable(bus.layer)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    announce(f"acp runner {WORKER_ID} ready (pid {os.getpid()})")
    await stop.wait()
    await drain(acp_settings.RUNNER_DRAIN_SECONDS)
    if _journal.writer is not None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5):  # the ended connections' journals are deleted
                await _journal.writer.drain()
        _journal.disable()
    await bus.stop()
    logger.info("runner %s stopped", WORKER_ID)
