"""Output journals on a live runner topology (docs/runners.md, "Output in Redis"): a client whose
runner was killed resumes on a web worker and gets from Redis what the runner had handed out
after its cursor; a journal holds the replay window only, and goes with its connection."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Iterator

import httpx
import pytest
import redis.asyncio as aioredis
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.cluster import Cluster, RedisServer
from tests.live import SSE, initialize, open_sse, post, rpc, wait_for_line
from tests.test_runners_live import WIRE, runner_of, running

#: The windowed topology's replay window, in events.
WINDOW = 200


@pytest.fixture(scope="module")
def windowed(redis_server: RedisServer) -> Iterator[Cluster]:
    """Two web workers and a runner whose streams keep WINDOW events."""
    cluster = Cluster(
        redis_server, size=2, runner_count=1, env={**WIRE, "ACP_REPLAY_WINDOW_EVENTS": str(WINDOW)}
    ).start()
    yield cluster
    cluster.stop()


def journal_pattern(cluster: Cluster, connection_id: str) -> str:
    # The layer's keys are under "<prefix>:" (tests/cluster.py gives each cluster a prefix).
    return f"{cluster.env['ACP_REDIS_PREFIX']}:acp.out:{connection_id}:*"


async def journal_keys(redis: aioredis.Redis, cluster: Cluster, connection_id: str) -> list[bytes]:
    return [key async for key in redis.scan_iter(match=journal_pattern(cluster, connection_id))]


async def journaled_events(redis: aioredis.Redis, key: bytes) -> list[int]:
    """The seqs of the events a journal holds."""
    seqs: list[int] = []
    for entry_id, fields in await redis.xrange(key):
        seqs.extend(range(int(fields[b"f"]), int(entry_id.split(b"-")[0]) + 1))
    return seqs


async def until_journaled(redis: aioredis.Redis, cluster: Cluster, connection_id: str, seq: int) -> bytes:
    """The connection's one journal, once it holds event `seq` (the runner writes it right after
    handing the event out; polled, as another process's state)."""
    async with asyncio.timeout(10):
        while True:
            for key in await journal_keys(redis, cluster, connection_id):
                last = await redis.xrevrange(key, count=1)
                if last and int(last[0][0].split(b"-")[0]) >= seq:
                    return key
            await asyncio.sleep(0.02)


async def test_a_client_of_a_killed_runner_resumes_what_redis_kept_then_the_end(
    redis_server: RedisServer, http: httpx.AsyncClient
) -> None:
    redis = aioredis.Redis.from_url(redis_server.url)
    try:
        async with running(redis_server, runners=1) as cluster:
            (runner,) = cluster.runners
            connection_id = await initialize(http, cluster.url)
            assert runner_of(connection_id) == runner.runner_id
            async with open_sse(http, cluster.workers[0].url, connection_id, "s") as reader:
                burst = rpc(1, "test/burst", {"count": 3000, "sessionId": "s"})
                assert (await post(http, cluster.url, burst, connection_id)).status_code == 202
                for _ in range(1000):
                    await reader.next()
                cursor = reader.last_id
                rest = [await reader.next() for _ in range(2001)]  # the burst's other 2,000 and its reply
                assert rest[-1]["id"] == 1
                last_id = reader.last_id
            assert cursor is not None and last_id is not None
            await until_journaled(redis, cluster, connection_id, int(last_id.rpartition("-")[2]))
            assert runner.process is not None
            runner.process.send_signal(signal.SIGKILL)
            await asyncio.to_thread(runner.process.wait, 10)
            # The other web worker serves the resume from Redis: the runner is gone.
            async with open_sse(
                http, cluster.workers[1].url, connection_id, "s", **{"Last-Event-ID": cursor}
            ) as resumed:
                replayed = []
                while (event := await resumed.next_or_end()) is not None:
                    replayed.append(event)
            assert [event["params"]["n"] for event in replayed[:2000]] == list(range(1000, 3000))
            assert replayed[2000]["id"] == 1 and len(replayed) == 2001
            # Nothing else of the connection is left: a new request is 404.
            gone = await http.get(cluster.url, headers={**SSE, "Acp-Connection-Id": connection_id})
            assert gone.status_code == 404
    finally:
        await redis.aclose()


async def test_a_journal_holds_the_window_only_and_goes_with_its_connection(
    redis_server: RedisServer, windowed: Cluster, http: httpx.AsyncClient
) -> None:
    redis = aioredis.Redis.from_url(redis_server.url)
    cluster = windowed
    try:
        connection_id = await initialize(http, cluster.url)
        async with open_sse(http, cluster.url, connection_id, "s") as reader:
            burst = rpc(1, "test/burst", {"count": 5000, "sessionId": "s"})
            assert (await post(http, cluster.url, burst, connection_id)).status_code == 202
            for _ in range(5001):
                await reader.next()
            assert reader.last_id is not None
            last = int(reader.last_id.rpartition("-")[2])
            key = await until_journaled(redis, cluster, connection_id, last)
            # The batch in flight stays in the window until the reader comes back for the next
            # one (the runner counts it so too): one burst may be a single batch, trimmed then.
            async with asyncio.timeout(10):  # polled, as another process's state
                while True:
                    kept = await journaled_events(redis, key)
                    if len(kept) < 5 * WINDOW:
                        break
                    await asyncio.sleep(0.02)
            # The newest events, in order, about the window, never the burst.
            assert kept == list(range(kept[0], last + 1))
            assert WINDOW <= len(kept) < 5 * WINDOW, len(kept)
        assert (await http.delete(cluster.url, headers={"Acp-Connection-Id": connection_id})).status_code == 202
        async with asyncio.timeout(10):  # the runner deletes it as the connection ends
            while True:
                if not await journal_keys(redis, cluster, connection_id):
                    break
                await asyncio.sleep(0.02)
    finally:
        await redis.aclose()


async def test_a_socket_reattaching_on_another_web_worker_gets_the_journal_then_the_rest(
    redis_server: RedisServer, windowed: Cluster
) -> None:
    redis = aioredis.Redis.from_url(redis_server.url)
    cluster = windowed
    try:
        first, second = (worker.ws_url for worker in cluster.workers)
        async with connect(first, subprotocols=["acp"], proxy=None) as ws:  # type: ignore[list-item]
            assert ws.response is not None
            connection_id = ws.response.headers["Acp-Connection-Id"]
            await ws.send(json.dumps(rpc(0, "initialize", {"protocolVersion": 1})))
            await ws.send(json.dumps(rpc(1, "test/burst", {"count": 3000})))
            read = [json.loads(await asyncio.wait_for(ws.recv(), 10)) for _ in range(2901)]
            assert read[0]["id"] == 0 and read[2900]["params"]["n"] == 2899
            # The runner hands the rest to this socket's web worker, and journals it.
            await until_journaled(redis, cluster, connection_id, 3002)
            # The client comes back on the other web worker, having read 2,901 messages.
            headers = {"Acp-Connection-Id": connection_id, "Last-Event-ID": "2901"}
            async with connect(second, subprotocols=["acp"], additional_headers=headers, proxy=None) as again:  # type: ignore[list-item]
                rest = [json.loads(await asyncio.wait_for(again.recv(), 10)) for _ in range(101)]
            # The first socket, read on, gets what its web worker had for it, then the close
            # that says another socket took over (it was never told while nobody read it).
            with pytest.raises(ConnectionClosed):
                while True:
                    await asyncio.wait_for(ws.recv(), 10)
            assert ws.close_code == 4409
        assert [message["params"]["n"] for message in rest[:100]] == list(range(2900, 3000))
        assert rest[100]["id"] == 1
        line = await wait_for_line(cluster, f"connection {connection_id}: resumed after socket-2901")
        assert int(line.split(", ")[-1].split()[0]) > 0  # messages served from Redis
    finally:
        await redis.aclose()
