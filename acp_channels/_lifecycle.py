"""Graceful shutdown of one worker process.

On SIGTERM (see daphne_compat) the worker drains: it refuses new connections (503 / WebSocket
refused), ends every connection it hosts (agents shut down, SSE streams send what is queued and
end cleanly, sockets close), ends the streams it serves for hosts on other workers, and waits for
its open streams to finish, at most SHUTDOWN_GRACE seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from acp_channels._host.registry import registry

logger = logging.getLogger("acp_channels.lifecycle")


class Lifecycle:
    def __init__(self) -> None:
        self.draining = False
        self.open_streams = 0
        self._idle: asyncio.Event | None = None

    def stream_opened(self) -> None:
        self.open_streams += 1

    def stream_closed(self) -> None:
        self.open_streams -= 1
        if self.open_streams == 0 and self._idle is not None:
            self._idle.set()

    async def drain(self, grace: float) -> None:
        self.draining = True
        logger.info("draining: %d connections, %d open streams", len(registry), self.open_streams)
        self._idle = asyncio.Event()
        if self.open_streams == 0:
            self._idle.set()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await registry.terminate_all()
                await self._idle.wait()
        logger.info("drained (%d streams still open)", self.open_streams)


lifecycle = Lifecycle()
