"""Faults with several workers: a worker killed, Redis stopped, a slow agent, SIGTERM, bursts and
backpressure across workers. Each test builds its own cluster, because it breaks it."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from typing import Any

import httpx

from acp_channels._conf import DEFAULTS
from acp_channels._worker import TAKE_WAIT
from tests.cluster import Cluster, RedisServer
from tests.live import SSE, initialize, open_sse, post, rpc

WIRE = {"ACP_AGENT": "tests.wire_agent.create"}
#: A reader whose host died notices when its pending pull times out.
READER_NOTICES = TAKE_WAIT + DEFAULTS["WORKER_TIMEOUT_SECONDS"] + 3


@contextlib.asynccontextmanager
async def running(redis: RedisServer | None = None, size: int = 3, **env: str) -> AsyncIterator[Cluster]:
    own_redis = redis is None
    redis = redis or RedisServer.shared_or_private()
    cluster = Cluster(redis, size=size, env={**WIRE, **env}).start()
    try:
        yield cluster
    finally:
        cluster.stop()
        if own_redis:
            redis.stop()


def burst(count: int, session: str, tag: str, request_id: int) -> dict[str, Any]:
    return rpc(request_id, "test/burst", {"count": count, "sessionId": session, "tag": tag})


async def test_killed_host_worker_gives_404_fast_and_ends_remote_readers(http: httpx.AsyncClient) -> None:
    async with running() as cluster:
        host, other, third = cluster.workers
        connection_id = await initialize(http, host.url)
        async with open_sse(http, other.url, connection_id) as reader:
            assert (await post(http, third.url, rpc(1, "custom/ping"), connection_id)).status_code == 202
            assert (await reader.next())["id"] == 1
            assert host.process is not None
            host.process.send_signal(signal.SIGKILL)
            host.process.wait()
            fast = httpx.Timeout(2.0)  # the bound: 404 within 2 s, never a hang
            for worker in (other, third):
                response = await http.post(
                    worker.url,
                    headers={"Content-Type": "application/json", "Acp-Connection-Id": connection_id},
                    content=b'{"jsonrpc":"2.0","id":2,"method":"custom/ping"}',
                    timeout=fast,
                )
                assert response.status_code == 404
                response = await http.get(worker.url, headers={**SSE, "Acp-Connection-Id": connection_id}, timeout=fast)
                assert response.status_code == 404
                response = await http.delete(worker.url, headers={"Acp-Connection-Id": connection_id}, timeout=fast)
                assert response.status_code == 404
            await reader.wait_ended(READER_NOTICES)
        assert not [line for worker in (other, third) for line in worker.errors()]


async def test_killed_reader_worker_loses_nothing(http: httpx.AsyncClient) -> None:
    async with running() as cluster:
        host, reader_worker, third = cluster.workers
        connection_id = await initialize(http, host.url)
        async with open_sse(http, reader_worker.url, connection_id, "s") as first_reader:
            assert (await post(http, host.url, burst(500, "s", "first", 1), connection_id)).status_code == 202
            first = [await first_reader.next() for _ in range(500)]
            assert [item["params"]["n"] for item in first] == list(range(500))
            assert reader_worker.process is not None
            reader_worker.process.send_signal(signal.SIGKILL)
            reader_worker.process.wait()
        # Emitted while the stream's only reader is dead: the host must keep all of it.
        assert (await post(http, third.url, burst(500, "s", "second", 2), connection_id)).status_code == 202
        async with open_sse(http, third.url, connection_id, "s") as second_reader:
            events, replies = [], []
            while len([e for e in events if e["params"].get("tag") == "second"]) < 500:
                event = await second_reader.next()
                (events if "params" in event else replies).append(event)
        # Batches the dead reader took but never confirmed are delivered again (at least once),
        # so anything before the second burst is a tail of the first one, in order (with the
        # first burst's reply, when it was in such a batch).
        assert [reply["id"] for reply in replies] in ([], [1])
        tags = [event["params"]["tag"] for event in events]
        redelivered = [event["params"]["n"] for event in events if event["params"]["tag"] == "first"]
        second = [event["params"]["n"] for event in events if event["params"]["tag"] == "second"]
        assert tags == sorted(tags)  # "first" entries, then "second" ones
        assert redelivered == list(range(500 - len(redelivered), 500))
        assert second == list(range(500))


async def test_redis_down_fails_fast_with_503_and_recovers(http: httpx.AsyncClient) -> None:
    redis = RedisServer.private()
    try:
        async with running(redis=redis, size=2) as cluster:
            host, other = cluster.workers
            connection_id = await initialize(http, host.url)
            redis.stop()
            fast = httpx.Timeout(5.0)
            response = await http.post(
                other.url,
                headers={"Content-Type": "application/json", "Acp-Connection-Id": connection_id},
                content=b'{"jsonrpc":"2.0","id":1,"method":"custom/ping"}',
                timeout=fast,
            )
            assert response.status_code == 503
            assert response.text == "the channel layer is unavailable; try again"
            response = await http.get(other.url, headers={**SSE, "Acp-Connection-Id": connection_id}, timeout=fast)
            assert response.status_code == 503
            # Requests that do not need Redis keep working.
            response = await post(http, host.url, rpc(2, "custom/ping"), connection_id)
            assert response.status_code == 202

            redis.start()
            fresh = await initialize(http, host.url)
            for _ in range(100):  # the workers reconnect on their own; bounded wait for that
                response = await post(http, other.url, rpc(3, "custom/ping"), fresh)
                if response.status_code == 202:
                    break
                assert response.status_code == 503
                await asyncio.sleep(0.1)
            assert response.status_code == 202
            async with open_sse(http, other.url, fresh) as reader:
                assert (await reader.next())["id"] == 3
    finally:
        redis.stop()


async def test_agent_slow_to_take_input_does_not_stall_other_connections(http: httpx.AsyncClient) -> None:
    async with running(size=2) as cluster:
        host, other = cluster.workers
        stuck = await initialize(http, host.url)
        healthy = await initialize(http, host.url)
        assert (await post(http, host.url, rpc(1, "test/block_input"), stuck)).status_code == 202
        blocked_post = asyncio.create_task(post(http, other.url, rpc(2, "custom/ping"), stuck))
        async with open_sse(http, other.url, healthy) as reader:
            for request_id in range(10, 20):
                response = await post(http, other.url, rpc(request_id, "custom/ping"), healthy)
                assert response.status_code == 202
                assert (await reader.next())["id"] == request_id
        assert not blocked_post.done()  # still waiting for the stuck agent: backpressure, not an error
        blocked_post.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await blocked_post


async def test_burst_of_20000_reaches_a_reader_on_another_worker_in_order(http: httpx.AsyncClient) -> None:
    async with running(size=2) as cluster:
        host, other = cluster.workers
        connection_id = await initialize(http, host.url)
        async with open_sse(http, other.url, connection_id, "s") as reader:
            assert (await post(http, host.url, burst(20000, "s", "big", 1), connection_id)).status_code == 202
            numbers = [(await reader.next())["params"]["n"] for _ in range(20000)]
        assert numbers == list(range(20000))


async def test_slow_reader_pauses_the_agent_instead_of_losing_output(http: httpx.AsyncClient) -> None:
    budget = {"ACP_MAX_BUFFERED_BYTES": str(64 * 1024), "ACP_REPLAY_WINDOW_BYTES": str(16 * 1024)}  # E031
    async with running(size=2, **budget) as cluster:
        host, other = cluster.workers
        connection_id = await initialize(http, host.url)
        async with open_sse(http, other.url, connection_id) as connection_stream:
            # ~5000 x 70 bytes for a session nobody reads: far over the 64 KiB budget.
            assert (await post(http, host.url, burst(5000, "s", "held", 1), connection_id)).status_code == 202
            assert (await post(http, host.url, rpc(2, "custom/ping"), connection_id)).status_code == 202
            # The host stopped taking the agent's output: the ping's reply waits behind the burst.
            try:
                early = await connection_stream.next(timeout=1.0)
            except TimeoutError:
                early = None
            assert early is None
            async with open_sse(http, other.url, connection_id, "s") as session_stream:
                numbers = [(await session_stream.next())["params"]["n"] for _ in range(5000)]
                assert numbers == list(range(5000))
                # The burst's own reply follows it on the session stream (its request named "s").
                assert (await session_stream.next())["id"] == 1
                assert (await connection_stream.next())["id"] == 2


async def test_sigterm_drains_streams_cleanly_and_exits(http: httpx.AsyncClient) -> None:
    async with running(size=2, ACP_SHUTDOWN_GRACE_SECONDS="5") as cluster:
        host, other = cluster.workers
        connection_id = await initialize(http, host.url)
        async with (
            open_sse(http, host.url, connection_id) as local_reader,
            open_sse(http, other.url, connection_id, "s") as remote_reader,
        ):
            assert (await post(http, host.url, burst(3, "s", "last", 1), connection_id)).status_code == 202
            assert [(await remote_reader.next())["params"]["n"] for _ in range(3)] == [0, 1, 2]
            assert host.process is not None
            host.process.send_signal(signal.SIGTERM)
            await local_reader.wait_ended()
            await remote_reader.wait_ended()
            assert local_reader.error is None and remote_reader.error is None  # ended, not cut
            assert await asyncio.to_thread(host.process.wait, 10) == 0
        response = await post(http, other.url, rpc(2, "custom/ping"), connection_id)
        assert response.status_code == 404
        assert not other.errors()


async def test_a_slow_worker_is_not_taken_for_dead(http: httpx.AsyncClient) -> None:
    """The host's worker is frozen past WORKER_TIMEOUT_SECONDS but its heartbeat is fresh: a
    request through another worker waits for it instead of answering 404."""
    async with running(size=2, ACP_WORKER_TIMEOUT_SECONDS="0.2") as cluster:
        host, other = cluster.workers
        connection_id = await initialize(http, host.url)
        async with open_sse(http, other.url, connection_id) as reader:
            freeze = asyncio.create_task(
                post(http, host.url, rpc(1, "test/block_loop", {"seconds": 1.2}), connection_id)
            )
            health = host.url.removesuffix("acp") + "health"
            for _ in range(100):  # until the host stops answering: it is frozen
                try:
                    await http.get(health, timeout=0.2)
                except httpx.TimeoutException:
                    break
            else:
                raise AssertionError("the host never froze")
            response = await post(http, other.url, rpc(2, "custom/ping"), connection_id)
            assert response.status_code == 202  # not 404: the frozen worker is alive
            assert (await freeze).status_code == 202
            ids = {(await reader.next())["id"], (await reader.next())["id"]}
        assert ids == {1, 2}
