"""Agents on runners (AGENT_HOSTS "runners", docs/runners.md): two web workers that host no agent,
behind a round-robin balancer, and `manage.py acp_runner` processes sharing Redis with them.

Placement (least loaded first, capacity, 503 when no runner has room), both transports through
an edge and a runner, a web worker killed under a reader (it resumes on the other, nothing lost
or repeated), a runner drained by SIGTERM mid-turn (the turn finishes, new connections go
elsewhere), and a runner killed outright (its clients get an error, not a hang, and a new
connection lands on another runner)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests import forked
from tests.cluster import Cluster, RedisServer
from tests.live import (
    ROOT,
    SSE,
    RawConnection,
    RawSse,
    SseReader,
    flood_counter,
    initialize,
    memory,
    open_sse,
    post,
    rpc,
    settle_paused,
    wait_for_line,
)

WIRE = {"ACP_AGENT": "tests.wire_agent.create", "ACP_KEEPALIVE_SECONDS": "0.5", "ACP_RUNNER_DRAIN_SECONDS": "1"}
INITIALIZE = rpc(0, "initialize", {"protocolVersion": 1})


def runner_of(connection_id: str) -> str:
    return connection_id.rpartition(".")[2]


@pytest.fixture(scope="module")
def topology(redis_server: RedisServer) -> Iterator[Cluster]:
    cluster = Cluster(redis_server, size=2, runner_count=2, env=WIRE).start()
    yield cluster
    cluster.stop()


@contextlib.asynccontextmanager
async def running(redis: RedisServer, runners: int = 2, **env: str) -> AsyncIterator[Cluster]:
    """A topology of its own, for a test that stops a part of it (one runner where the test
    restarts web workers only: a process less to start)."""
    cluster = Cluster(redis, size=2, runner_count=runners, env={**WIRE, **env}).start()
    try:
        yield cluster
    finally:
        cluster.stop()


async def test_connections_are_placed_on_runners_the_least_loaded_first(
    topology: Cluster, http: httpx.AsyncClient
) -> None:
    ids = [await initialize(http, topology.url) for _ in range(4)]
    runners = {runner.runner_id for runner in topology.runners}
    assert Counter(map(runner_of, ids)) == dict.fromkeys(runners, 2)
    for connection_id in ids:
        assert (await http.delete(topology.url, headers={"Acp-Connection-Id": connection_id})).status_code == 202


async def test_every_request_reaches_the_runner_from_either_web_worker(
    topology: Cluster, http: httpx.AsyncClient
) -> None:
    a, b = (worker.url for worker in topology.workers)
    connection_id = await initialize(http, a)
    assert runner_of(connection_id) in {runner.runner_id for runner in topology.runners}
    async with open_sse(http, b, connection_id) as connection_stream, open_sse(http, a, connection_id, "s1") as s1:
        assert (await post(http, b, rpc(1, "custom/echo", {"x": 1}), connection_id)).status_code == 202
        assert (await connection_stream.next())["result"] == {"method": "custom/echo", "params": {"x": 1}}
        burst = rpc(2, "test/burst", {"count": 2000, "sessionId": "s1"})
        assert (await post(http, a, burst, connection_id)).status_code == 202
        items = [await s1.next() for _ in range(2000)]
        assert [item["params"]["n"] for item in items] == list(range(2000))
        assert (await http.delete(b, headers={"Acp-Connection-Id": connection_id})).status_code == 202
        await connection_stream.wait_ended()
        await s1.wait_ended()
    for url in (a, b):
        assert (await post(http, url, rpc(3, "x"), connection_id)).status_code == 404
    assert not topology.errors()


async def test_a_websocket_connection_runs_on_a_runner(topology: Cluster) -> None:
    async with connect(topology.ws_url, subprotocols=["acp"], proxy=None, open_timeout=10) as ws:  # type: ignore[list-item]
        assert ws.response is not None
        connection_id = ws.response.headers["Acp-Connection-Id"]
        assert runner_of(connection_id) in {runner.runner_id for runner in topology.runners}
        await ws.send(json.dumps(INITIALIZE))
        assert json.loads(await asyncio.wait_for(ws.recv(), 10))["result"]["protocolVersion"] == 1
        await ws.send(json.dumps(rpc(1, "test/burst", {"count": 500})))
        received = [json.loads(await asyncio.wait_for(ws.recv(), 10)) for _ in range(501)]
        assert [item["params"]["n"] for item in received[:500]] == list(range(500))
        assert received[500]["id"] == 1


async def published_load(cluster: Cluster, runner_id: str, ready: Callable[[dict[str, Any]], bool]) -> None:
    """Wait until the load the runner publishes in Redis (with its heartbeat, every half second,
    from a thread of its own) satisfies `ready`: another process's state, read again until then."""
    key = f"{cluster.env['ACP_REDIS_PREFIX']}acp.runner.{runner_id}"
    redis = Redis.from_url(cluster.redis.url)
    try:
        for _ in range(400):  # 20 s
            if (text := await redis.get(key)) is not None and ready(json.loads(text)):
                return
            await asyncio.sleep(0.05)
    finally:
        await redis.aclose()
    raise AssertionError(f"runner {runner_id} never published the load awaited")


async def test_the_connections_command_lists_what_the_runners_host(topology: Cluster, http: httpx.AsyncClient) -> None:
    connection_id = await initialize(http, topology.url)
    # The command reads what the runners published: on a loaded machine the beat after the
    # initialize may come late (it read 0 connections once).
    await published_load(topology, runner_of(connection_id), lambda load: load["connections"] >= 1)
    env = {**os.environ, **topology.env, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "demo_project.settings"}
    result = await asyncio.to_thread(
        forked.run,
        [sys.executable, "manage.py", "acp_connections", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert {runner.runner_id for runner in topology.runners} <= set(document["workers"])
    (listed,) = [info for info in document["connections"] if info["connection_id"] == connection_id]
    assert listed["worker"] == runner_of(connection_id)
    # Each runner's published load: the one hosting it counts it.
    assert set(document["runners"]) == {runner.runner_id for runner in topology.runners}
    hosting = document["runners"][runner_of(connection_id)]
    assert hosting["connections"] >= 1 and hosting["room"] is True and hosting["draining"] is False
    assert hosting["stdio_agents"] == 0  # an in-process agent
    table = await asyncio.to_thread(
        forked.run,
        [sys.executable, "manage.py", "acp_connections"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["RUNNER", "CONNECTIONS", "AGENT", "PROCESSES", "STATE"]
    assert {line.split()[0] for line in lines[1:3]} == set(document["runners"])
    assert all(line.split()[-1] == "room" for line in lines[1:3])
    assert (await http.delete(topology.url, headers={"Acp-Connection-Id": connection_id})).status_code == 202


async def test_no_runner_with_room_is_503_with_retry_after(redis_server: RedisServer, http: httpx.AsyncClient) -> None:
    async with running(redis_server, ACP_MAX_CONNECTIONS="1") as cluster:
        ids = [await initialize(http, cluster.url) for _ in range(2)]
        assert {runner_of(connection_id) for connection_id in ids} == {r.runner_id for r in cluster.runners}
        for worker in cluster.workers:
            refused = await post(http, worker.url, INITIALIZE)
            assert refused.status_code == 503, refused.text
            assert refused.headers["Retry-After"] == "5" and "runner" in refused.text
        async with connect(cluster.ws_url, subprotocols=["acp"], proxy=None, open_timeout=10) as ws:  # type: ignore[list-item]
            await ws.wait_closed()
            assert ws.close_code == 1013  # try again later
        # Room again once one ends: the next initialize is placed where it was freed.
        assert (await http.delete(cluster.url, headers={"Acp-Connection-Id": ids[0]})).status_code == 202
        assert runner_of(await eventually_initialized(http, cluster.url)) == runner_of(ids[0])


async def eventually_initialized(http: httpx.AsyncClient, url: str) -> str:
    """Initialize, again while the answer is 503 (a freed runner's load reaches the edges with its
    next heartbeat)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while True:
        response = await post(http, url, INITIALIZE)
        if response.status_code != 503 or loop.time() > deadline:
            assert response.status_code == 200, response.text
            return response.headers["Acp-Connection-Id"]
        await asyncio.sleep(0.1)  # the load is published every 0.5 s: nothing to await here


async def test_web_worker_killed_under_a_reader_loses_nothing(
    redis_server: RedisServer, http: httpx.AsyncClient
) -> None:
    async with running(redis_server, runners=1) as cluster:
        a, b = cluster.workers
        connection_id = await initialize(http, b.url)
        async with open_sse(http, a.url, connection_id, "s") as reader:
            assert (
                await post(http, b.url, rpc(1, "test/burst", {"count": 5000, "sessionId": "s"}), connection_id)
            ).status_code == 202
            first = [await reader.next() for _ in range(1000)]
            last_id = reader.last_id
            assert a.process is not None and last_id is not None
            a.process.send_signal(signal.SIGKILL)
            a.process.wait()
        async with open_sse(http, b.url, connection_id, "s", **{"Last-Event-ID": last_id}) as resumed:
            rest = [await resumed.next() for _ in range(4001)]
        numbers = [event["params"]["n"] for event in [*first, *rest[:4000]]]
        assert numbers == list(range(5000))  # each once, in order
        assert rest[4000]["id"] == 1


async def test_sigterm_drains_a_runner_the_turn_finishes_and_new_connections_go_elsewhere(
    redis_server: RedisServer, http: httpx.AsyncClient
) -> None:
    async with running(redis_server, ACP_RUNNER_DRAIN_SECONDS="30") as cluster:
        connection_id = await initialize(http, cluster.url)
        draining = next(runner for runner in cluster.runners if runner.runner_id == runner_of(connection_id))
        other = next(runner for runner in cluster.runners if runner is not draining)
        async with open_sse(http, cluster.url, connection_id, "s") as stream:
            ask = rpc(1, "test/ask", {"askId": "q-1", "sessionId": "s"})
            assert (await post(http, cluster.url, ask, connection_id, "s")).status_code == 202
            assert (await stream.next())["method"] == "test/question"
            assert draining.process is not None
            draining.process.send_signal(signal.SIGTERM)
            await wait_for_line(cluster, f"runner {draining.runner_id} draining")
            # The draining runner goes on serving its connection...
            assert (await stream.next())["id"] == 1
            answer = {"jsonrpc": "2.0", "id": "q-1", "result": {"ok": True}}
            assert (await post(http, cluster.url, answer, connection_id, "s")).status_code == 202
            assert (await post(http, cluster.url, rpc(2, "custom/echo"), connection_id, "s")).status_code == 202
            assert (await stream.next())["id"] == 2
            # ...and takes no new one.
            placed = [await initialize(http, cluster.url) for _ in range(4)]
            assert {runner_of(placed_id) for placed_id in placed} == {other.runner_id}
            for placed_id in placed:  # else the other runner drains them at the cluster's stop
                assert (await http.delete(cluster.url, headers={"Acp-Connection-Id": placed_id})).status_code == 202
            assert (await http.delete(cluster.url, headers={"Acp-Connection-Id": connection_id})).status_code == 202
        # Its last connection ended: it exits well before its drain deadline.
        assert await asyncio.to_thread(draining.process.wait, 10) == 0
        assert not cluster.errors()


async def test_a_runner_killed_outright_is_an_error_at_once_and_the_next_connection_goes_elsewhere(
    redis_server: RedisServer, http: httpx.AsyncClient
) -> None:
    async with running(redis_server) as cluster:
        connection_id = await initialize(http, cluster.url)
        killed = next(runner for runner in cluster.runners if runner.runner_id == runner_of(connection_id))
        other = next(runner for runner in cluster.runners if runner is not killed)
        async with open_sse(http, cluster.url, connection_id) as reader:
            assert killed.process is not None
            killed.process.send_signal(signal.SIGKILL)
            await asyncio.to_thread(killed.process.wait, 10)
            fast = httpx.Timeout(2.0)  # an error at once, never a hang
            for worker in cluster.workers:
                response = await http.post(
                    worker.url,
                    headers={"Content-Type": "application/json", "Acp-Connection-Id": connection_id},
                    content=json.dumps(rpc(1, "custom/ping")).encode(),
                    timeout=fast,
                )
                assert response.status_code == 404
                response = await http.get(worker.url, headers={**SSE, "Acp-Connection-Id": connection_id}, timeout=fast)
                assert response.status_code == 404
            await reader.wait_ended(15)
        # The client's restart path: a new connection, on the runner that is left.
        assert runner_of(await initialize(http, cluster.url)) == other.runner_id


TOTAL = 20_000
#: After how many events each web worker is restarted, in turn.
RESTART_AFTER = (5_000, 12_000)


async def test_restarting_every_web_worker_in_turn_loses_nothing_over_http(
    redis_server: RedisServer, http: httpx.AsyncClient
) -> None:
    async with running(redis_server, runners=1) as cluster:
        connection_id = await initialize(http, cluster.url)
        burst = rpc(1, "test/burst", {"count": TOTAL, "sessionId": "s"})
        numbers: list[int] = []
        last_id: str | None = None
        reply: Any = None
        for turn, reader_worker in enumerate((0, 1, 0)):
            extra = {"Last-Event-ID": last_id} if last_id is not None else {}
            url = cluster.workers[reader_worker].url
            async with open_sse(http, url, connection_id, "s", **extra) as reader:
                if turn == 0:
                    assert (await post(http, cluster.url, burst, connection_id)).status_code == 202
                restart_at = RESTART_AFTER[turn] if turn < len(RESTART_AFTER) else None
                while len(numbers) < TOTAL or reply is None:
                    if (event := await reader.next_or_end()) is None:
                        break
                    if "id" in event:
                        reply = event
                    else:
                        numbers.append(event["params"]["n"])
                    last_id = reader.last_id
                    if len(numbers) == restart_at:
                        # The worker serving this reader restarts; the reader keeps what it has
                        # and goes on elsewhere once its stream ends.
                        restarting = asyncio.create_task(asyncio.to_thread(cluster.replace_worker, reader_worker))
                        await reader.wait_ended(20)
                        await restarting
                        break
        assert numbers == list(range(TOTAL))  # each once, in order, across two restarts
        assert reply is not None and reply["id"] == 1
        assert not cluster.errors()


async def test_restarting_every_web_worker_in_turn_loses_nothing_over_websocket(redis_server: RedisServer) -> None:
    async with running(redis_server, runners=1) as cluster:
        numbers: list[int] = []
        restarts_seen: list[int] = []  # events read when each socket opened
        received = 0  # agent messages on the connection's sockets so far: the resume point
        connection_id = ""
        for turn, worker in enumerate((0, 1, 0)):
            restarts_seen.append(len(numbers))
            headers = {"Acp-Connection-Id": connection_id, "Last-Event-ID": str(received)} if turn else {}
            url = cluster.workers[worker].ws_url
            async with connect(url, subprotocols=["acp"], additional_headers=headers, proxy=None, max_size=None) as ws:  # type: ignore[list-item]
                if turn == 0:
                    assert ws.response is not None
                    connection_id = ws.response.headers["Acp-Connection-Id"]
                    await ws.send(json.dumps(INITIALIZE))
                    # 1 KB each, taken from the agent as the socket is written: far more than the
                    # sockets' buffers hold, so each restart lands mid-stream.
                    await ws.send(json.dumps(rpc(1, "test/flood", {"count": TOTAL, "size": 1000})))
                restart_at = RESTART_AFTER[turn] if turn < len(RESTART_AFTER) else None
                while len(numbers) < TOTAL:
                    try:
                        message = json.loads(await asyncio.wait_for(ws.recv(), 20))
                    except ConnectionClosed:
                        break
                    received += 1
                    if message.get("method") == "test/flooded":
                        numbers.append(message["params"]["n"])
                    if len(numbers) == restart_at:
                        # The worker serving this socket restarts while the client reads nothing
                        # more; what reached the client before the close is still read below.
                        await asyncio.to_thread(cluster.replace_worker, worker)
        assert numbers == list(range(TOTAL))
        assert restarts_seen[0] == 0 and 0 < restarts_seen[1] < restarts_seen[2] < TOTAL  # each restart mid-stream
        assert not cluster.errors()


FLOOD = 30_000


async def test_redis_down_mid_stream_is_503_and_nothing_is_lost_once_it_is_back(http: httpx.AsyncClient) -> None:
    redis = RedisServer.private()
    # The client reads only as it goes (a small receive buffer, nothing read ahead), so the 30 MB
    # flood is paused by the connection's budget, mid-stream, during the whole outage. The replay
    # window covers what is past the client's last read at a cut: the runner's push credit (1 MiB),
    # the server's send buffer (up to tcp_wmem's 4 MiB) and the client's 128 KiB. A window is at
    # most half the budget, so 8 MiB needs 16+: with 9 (a 4.5 MiB window) one run in a few on a
    # slow machine cut past it (a 409 "older than the replay window").
    # With DETACHED_SECONDS (its default) too: the reader's absence during the outage is within
    # the client's grace (IDLE_TIMEOUT_SECONDS), so the full budget pauses the flood instead of
    # dropping the window (it once did: a 409 on the resume, docs/shared-sessions.md).
    window = {"ACP_REPLAY_WINDOW_BYTES": str(8 * 1024 * 1024), "ACP_MAX_BUFFERED_BYTES": str(18 * 1024 * 1024)}
    try:
        async with running(redis, **window) as cluster:
            edge = cluster.workers[0]
            connection_id = await initialize(http, edge.url)
            numbers: list[int] = []
            raw = await RawConnection.open(edge.port, receive_buffer=64 * 1024)
            try:
                reader = await RawSse.open(raw, connection_id)
                flood = rpc(1, "test/flood", {"count": FLOOD, "size": 1000})
                assert (await post(http, edge.url, flood, connection_id)).status_code == 202
                while len(numbers) < 500:
                    data = await reader.next_event()
                    assert data is not None
                    event = json.loads(data)
                    if event.get("method") == "test/flooded":
                        numbers.append(event["params"]["n"])
                last_id = reader.last_id
                redis.stop()
                # Everything an edge does needs Redis now: a clear 503, at once, never a hang.
                fast = httpx.Timeout(5.0)
                refused = await http.post(
                    edge.url, json=rpc(2, "custom/ping"), headers={"Acp-Connection-Id": connection_id}, timeout=fast
                )
                assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
                assert (await http.post(edge.url, json=INITIALIZE, timeout=fast)).status_code == 503
                redis.start()
            finally:
                await raw.close()
            # The client resumes after the last event it read, on the other web worker.
            assert last_id is not None
            resumed_from = cluster.workers[1].url
            resume = {**SSE, "Acp-Connection-Id": connection_id, "Last-Event-ID": last_id}
            for _ in range(100):  # the processes reconnect, the old lease goes; bounded wait for that
                response = await http.send(http.build_request("GET", resumed_from, headers=resume), stream=True)
                if response.status_code == 200:
                    break
                await response.aread()
                assert response.status_code in (409, 503), response.text  # the old lease, or no Redis yet
                assert "belong" not in response.text and "older" not in response.text, response.text
                await asyncio.sleep(0.1)
            assert response.status_code == 200
            sse = SseReader(response)
            try:
                while len(numbers) < FLOOD:
                    event = await sse.next(20)
                    if event.get("method") == "test/flooded":
                        numbers.append(event["params"]["n"])
            finally:
                await sse.close()
            assert numbers == list(range(FLOOD))  # each once, in order, across the outage
    finally:
        redis.stop()


#: A flood far larger than what a paused connection may hold on either process.
STILL_FRAMES, STILL_FRAME_SIZE = 1600, 64 * 1024  # about 100 MB
STILL_BUDGET = 1024 * 1024
#: What a paused connection legitimately holds besides its budget: the runner's push credit
#: (1 MiB), the edge's batch and the sockets' buffers, allocator slack.
STILL_SLACK = 24 * 1024 * 1024


async def test_a_client_that_stops_reading_holds_the_runner_and_its_edge_flat(
    redis_server: RedisServer, http: httpx.AsyncClient
) -> None:
    budget = {"ACP_MAX_BUFFERED_BYTES": str(STILL_BUDGET), "ACP_REPLAY_WINDOW_BYTES": str(STILL_BUDGET // 4)}
    async with running(redis_server, runners=1, ACP_KEEPALIVE_SECONDS="60", **budget) as cluster:
        edge, (runner,) = cluster.workers[0], cluster.runners
        assert edge.process is not None and runner.process is not None
        # The counter's connection is on the same (only) runner: it asks that process's hosts.
        async with flood_counter(http, edge.url) as taken:
            connection_id = await initialize(http, edge.url)
            raw = await RawConnection.open(edge.port, receive_buffer=4096)
            try:
                stream = await RawSse.open(raw, connection_id)
                before_flood = await taken()
                runner_before, edge_before = memory(runner.process.pid)[0], memory(edge.process.pid)[0]
                flood = rpc("flood", "test/flood", {"count": STILL_FRAMES, "size": STILL_FRAME_SIZE})
                assert (await post(http, edge.url, flood, connection_id)).status_code == 202
                frames_taken, runner_rss = await settle_paused(runner, taken, deadline=40.0)
                assert frames_taken - before_flood < STILL_FRAMES, "the agent was never paused"
                grew = {"runner": runner_rss - runner_before, "edge": memory(edge.process.pid)[0] - edge_before}
                shown = {name: f"{size >> 20} MiB" for name, size in grew.items()}
                assert max(grew.values()) < STILL_BUDGET + STILL_SLACK, shown
                # Reading again, the client gets the flood from its start, in order.
                assert json.loads(await stream.next_event() or "null")["id"] == "flood"
                for n in range(200):
                    event = json.loads(await stream.next_event() or "null")
                    assert event["method"] == "test/flooded" and event["params"]["n"] == n
            finally:
                await raw.close()
                await http.delete(edge.url, headers={"Acp-Connection-Id": connection_id})
