"""Counting how often other tasks got to run while a piece of work was under way.

A piece of work that never yields to the event loop leaves the count at zero, whatever the
machine's speed: a test of "processed in slices" without any timing.
"""

from __future__ import annotations

import asyncio
from types import TracebackType


class LoopTurns:
    """`async with LoopTurns() as turns: await work()`; then `turns.count` is how many times
    another task ran during `work()`."""

    def __init__(self) -> None:
        self.count = 0
        self._task: asyncio.Task[None] | None = None
        self._started = asyncio.Event()

    async def __aenter__(self) -> LoopTurns:
        self._task = asyncio.create_task(self._spin())
        await self._started.wait()
        self.count = 0
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        assert self._task is not None
        self._task.cancel()

    async def _spin(self) -> None:
        self._started.set()
        while True:
            await asyncio.sleep(0)
            self.count += 1
