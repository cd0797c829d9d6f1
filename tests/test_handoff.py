"""acp_channels._handoff: the queue and event every connection holds, against asyncio's semantics
(order, bounds, cancellation losing nothing) and their memory (what they exist for), and what an
idle HTTP connection holds with them."""

from __future__ import annotations

import asyncio
import tracemalloc

import pytest

from acp_channels._handoff import HandoffQueue, LazyEvent


async def test_queue_is_fifo_and_get_waits_for_a_put() -> None:
    queue: HandoffQueue[int] = HandoffQueue()
    reader = asyncio.create_task(queue.get())
    await asyncio.sleep(0)  # let the reader block (no event to await: it is the thing under test)
    assert not reader.done()
    queue.put_nowait(1)
    queue.put_nowait(2)
    assert await reader == 1
    assert await queue.get() == 2
    assert queue.empty()


async def test_bounded_put_waits_for_room_and_put_nowait_refuses() -> None:
    queue: HandoffQueue[str] = HandoffQueue(maxsize=2)
    await queue.put("a")
    await queue.put("b")
    assert queue.full()
    with pytest.raises(asyncio.QueueFull):
        queue.put_nowait("c")
    writer = asyncio.create_task(queue.put("c"))
    await asyncio.sleep(0)
    assert not writer.done()
    assert await queue.get() == "a"
    await writer
    assert [await queue.get(), await queue.get()] == ["b", "c"]


async def test_a_cancelled_get_takes_nothing() -> None:
    queue: HandoffQueue[int] = HandoffQueue()
    reader = asyncio.create_task(queue.get())
    await asyncio.sleep(0)
    queue.put_nowait(7)  # wakes the reader, which is cancelled before it runs
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert await queue.get() == 7


async def test_a_woken_then_cancelled_put_hands_the_room_to_the_next_writer() -> None:
    queue: HandoffQueue[str] = HandoffQueue(maxsize=1)
    queue.put_nowait("first")
    cancelled = asyncio.create_task(queue.put("cancelled"))
    waiting = asyncio.create_task(queue.put("second"))
    await asyncio.sleep(0)
    assert await queue.get() == "first"  # wakes `cancelled`
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    await asyncio.wait_for(waiting, 5)
    assert await queue.get() == "second"


async def test_two_readers_at_once_is_a_programming_error() -> None:
    queue: HandoffQueue[int] = HandoffQueue()
    first = asyncio.create_task(queue.get())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="one reader"):
        await queue.get()
    first.cancel()


async def test_event_wakes_every_waiter_and_clear_rearms_it() -> None:
    event = LazyEvent()
    waiters = [asyncio.create_task(event.wait()) for _ in range(3)]
    await asyncio.sleep(0)
    assert not any(waiter.done() for waiter in waiters)
    event.set()
    assert await asyncio.gather(*waiters) == [True, True, True]
    assert event.is_set() and await event.wait()
    event.clear()
    late = asyncio.create_task(event.wait())
    await asyncio.sleep(0)
    assert not late.done()
    late.cancel()
    with pytest.raises(asyncio.CancelledError):
        await late
    event.set()  # the cancelled waiter left no trace to wake
    assert event.is_set()


def allocated(make: object) -> int:
    """Bytes held by 100 idle objects from `make` (a callable), per object."""
    assert callable(make)
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        kept = [make() for _ in range(100)]
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    assert len(kept) == 100
    return sum(stat.size_diff for stat in after.compare_to(before, "filename")) // 100


async def test_idle_queue_and_event_hold_a_fraction_of_asyncios() -> None:
    # The reason these exist: a connection holds several (bench/MEMORY.md).
    assert allocated(HandoffQueue) * 3 < allocated(asyncio.Queue)
    assert allocated(LazyEvent) * 4 < allocated(asyncio.Event)


async def test_an_idle_http_connection_holds_no_socket_outbox_and_little_memory() -> None:
    """Guards the cuts of bench/MEMORY.md: 100 started HTTP connections with the demo agent
    (in-process, as the demo serves it), and what they hold once started, per connection."""
    from acp_channels._agents.factory import create_agent_channel
    from acp_channels._host import registry
    from acp_channels._worker import new_connection_id

    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        made = [
            registry.create(create_agent_channel, "http", connection_id=new_connection_id(), max_buffered_bytes=2**20)
            for _ in range(100)
        ]
        for host in made:
            host.start()
        await asyncio.sleep(0)  # each agent task starts listening
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    try:
        held = sum(stat.size_diff for stat in after.compare_to(before, "filename")) / 100
        assert all(host._socket_outbox is None for host in made)
        # 29.1 KiB with asyncio's queues and events, 22.7 with these, 20.6 without a socket outbox.
        assert held < 24 * 1024, held
    finally:
        for host in made:
            await host.terminate()
