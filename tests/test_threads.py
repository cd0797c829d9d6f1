"""Open SSE streams and POSTs hold no OS thread each, and start none.

Regression: with Django's database request hooks connected (sync receivers), every request hopped
to a thread of its ThreadSensitiveContext, which lives as long as the response: each open SSE
stream held a thread (400 streams, 401 threads). The demo has no database, so the hooks go.
Then Django's handler still started two threads per request to close the response
(acp_channels._handler): counted here as the process ids the kernel hands out meanwhile.
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


def last_pid() -> int:
    """The last process or thread id the kernel handed out: ids are handed out in turn, so the
    difference counts the threads and processes started meanwhile, on the whole machine."""
    with open("/proc/sys/kernel/ns_last_pid") as counter:
        return int(counter.read())


async def test_a_hundred_posts_and_twenty_streams_start_no_thread(
    wire_server: DaphneServer, http: httpx.AsyncClient
) -> None:
    url = getattr(wire_server, "workers", [wire_server])[0].url  # one worker: every request to it
    connections = [await initialize(http, url) for _ in range(10)]
    assert (await post(http, url, rpc(1, "custom/ping"), connections[0])).status_code == 202  # warm
    before = last_pid()
    for connection_id in connections:
        async with open_sse(http, url, connection_id), open_sse(http, url, connection_id, "s"):
            for index in range(10):
                assert (await post(http, url, rpc(index, "custom/ping"), connection_id)).status_code == 202
    started = last_pid() - before
    # Django's own handler: two threads per request, 240 here; one per request would be 120. The
    # count is machine-wide: other work (a parallel test run) started 26 here once, so the bar is
    # half of one per request.
    assert started < 60, f"{started} threads or processes started during 120 requests"
