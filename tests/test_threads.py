"""Open SSE streams and POSTs hold no OS thread each.

Regression: with Django's database request hooks connected (sync receivers), every request hopped
to a thread of its ThreadSensitiveContext, which lives as long as the response: each open SSE
stream held a thread (400 streams, 401 threads). The demo has no database, so the hooks go.
"""

from __future__ import annotations

import contextlib
import os

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
