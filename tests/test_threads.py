"""Open SSE streams and POSTs hold no OS thread each, and start none.

Regression: with Django's database request hooks connected (sync receivers), every request hopped
to a thread of its ThreadSensitiveContext, which lives as long as the response: each open SSE
stream held a thread (400 streams, 401 threads). The demo has no database, so the hooks go.
Then Django's handler still started two threads per request to close the response
(acp_channels._handler): counted here by the server process itself (tests/wire_agent.py
`test/threads_started`), as the machine's other work starts threads too.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx

from tests.live import DaphneServer, initialize, open_sse, post, rpc

STREAMS = 40


def thread_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


async def test_streams_and_posts_hold_no_thread_each(wire_server: DaphneServer, http: httpx.AsyncClient) -> None:
    workers = getattr(wire_server, "workers", [wire_server])
    url = workers[0].url
    assert workers[0].process is not None
    pid = workers[0].process.pid
    before = thread_count(pid)
    connections = [await initialize(http, url) for _ in range(STREAMS // 2)]
    async with contextlib.AsyncExitStack() as streams:
        for connection_id in connections:
            await streams.enter_async_context(open_sse(http, url, connection_id))
            await streams.enter_async_context(open_sse(http, url, connection_id, "s"))
        for connection_id in connections:
            assert (await post(http, url, rpc(1, "custom/ping"), connection_id)).status_code == 202
        assert thread_count(pid) < before + 5, f"{thread_count(pid)} threads with {STREAMS} open streams"


@contextlib.asynccontextmanager
async def threads_started(http: httpx.AsyncClient, url: str) -> AsyncIterator[Callable[[], Awaitable[int]]]:
    """Asks the server process, over an ACP connection of its own, how many Python threads it
    has started so far."""
    connection_id = await initialize(http, url)
    async with open_sse(http, url, connection_id) as stream:

        async def started() -> int:
            request_id = f"threads-{next(_ids)}"
            assert (await post(http, url, rpc(request_id, "test/threads_started"), connection_id)).status_code == 202
            reply = await stream.next()
            assert reply["id"] == request_id, reply
            count: int = reply["result"]["started"]
            return count

        yield started


_ids = itertools.count()


async def test_a_hundred_posts_and_twenty_streams_start_no_thread(
    wire_server: DaphneServer, http: httpx.AsyncClient
) -> None:
    url = getattr(wire_server, "workers", [wire_server])[0].url  # one worker: every request to it
    connections = [await initialize(http, url) for _ in range(10)]
    assert (await post(http, url, rpc(1, "custom/ping"), connections[0])).status_code == 202  # warm
    async with threads_started(http, url) as started_so_far:
        before = await started_so_far()
        for connection_id in connections:
            async with open_sse(http, url, connection_id), open_sse(http, url, connection_id, "s"):
                for index in range(10):
                    assert (await post(http, url, rpc(index, "custom/ping"), connection_id)).status_code == 202
        started = await started_so_far() - before
    # Django's own handler: two threads per request, 240 here; one per request would be 120.
    assert started < 12, f"{started} threads started during 120 requests"
