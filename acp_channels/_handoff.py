"""Hand-offs between tasks that every connection and stream holds: a queue with one reader and an
event, with asyncio's semantics in a fraction of its memory.

`asyncio.Queue` keeps four deques (items, getters, putters and its `Event`'s waiters) and
`asyncio.Event` one; an empty deque is 624 bytes on CPython 3.11. Held per connection and per
stream (bench/MEMORY.md has the breakdown), that is kilobytes per client before anything is
queued. These allocate a waiter only while somebody waits.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

__all__ = ["HandoffQueue", "LazyEvent"]

T = TypeVar("T")


class LazyEvent:
    """`asyncio.Event` (set, clear, is_set, wait) that holds no waiter list until one waits."""

    __slots__ = ("_set", "_waiters")

    def __init__(self) -> None:
        self._set = False
        self._waiters: list[asyncio.Future[None]] | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if self._set:
            return
        self._set = True
        waiters, self._waiters = self._waiters, None
        for waiter in waiters or ():
            if not waiter.done():
                waiter.set_result(None)

    def clear(self) -> None:
        self._set = False

    async def wait(self) -> bool:
        if self._set:
            return True
        waiter = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            if self._waiters is not None and waiter in self._waiters:
                self._waiters.remove(waiter)
        return True


class HandoffQueue(Generic[T]):
    """A FIFO queue read by one task at a time: `put_nowait`, `put` (waits while a bounded queue
    is full), `get` and `empty`, with `asyncio.Queue`'s behaviour for those (QueueFull from
    put_nowait; a cancelled put or get loses nothing and takes nothing)."""

    __slots__ = ("_getter", "_items", "_maxsize", "_putters")

    def __init__(self, maxsize: int = 0) -> None:
        self._items: deque[T] = deque()
        self._maxsize = maxsize
        self._getter: asyncio.Future[None] | None = None
        self._putters: deque[asyncio.Future[None]] | None = None  # writers waiting for room

    def __len__(self) -> int:
        return len(self._items)

    def empty(self) -> bool:
        return not self._items

    def full(self) -> bool:
        return 0 < self._maxsize <= len(self._items)

    def put_nowait(self, item: T) -> None:
        if self.full():
            raise asyncio.QueueFull
        self._items.append(item)
        getter = self._getter
        if getter is not None and not getter.done():
            getter.set_result(None)

    async def put(self, item: T) -> None:
        while self.full():
            waiter = asyncio.get_running_loop().create_future()
            if self._putters is None:
                self._putters = deque()
            self._putters.append(waiter)
            try:
                await waiter
            except BaseException:
                if self._putters is not None and waiter in self._putters:
                    self._putters.remove(waiter)
                elif not self.full():
                    self._wake_putter()  # it was woken, then cancelled: the room goes to the next
                raise
        self.put_nowait(item)

    async def get(self) -> T:
        while not self._items:
            if self._getter is not None:
                raise RuntimeError("HandoffQueue has one reader at a time")
            self._getter = getter = asyncio.get_running_loop().create_future()
            try:
                await getter
            finally:
                self._getter = None
        item = self._items.popleft()
        self._wake_putter()
        return item

    def _wake_putter(self) -> None:
        putters = self._putters
        while putters:
            putter = putters.popleft()
            if not putter.done():
                putter.set_result(None)
                return
        self._putters = None
