"""A worker's `/metrics` and `/ready` on a live daphne.

- A scripted session (initialize, session/new, a streamed prompt read on an SSE session stream,
  a WebSocket connection, DELETE) and the values scraped after each step, parsed with
  prometheus_client's own parser; `/metrics` is 404 unless ACP_CHANNELS["METRICS"] is on.
- `/ready`: 200 on a worker that can serve; 503 with a reason and Retry-After when its Redis is
  stopped (and 200 again once it is back), and while the worker drains after SIGTERM. `/health`
  answers 200 throughout (liveness only).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import connect

from tests.agent_processes import supported
from tests.cluster import RedisServer
from tests.live import ROOT, DaphneServer, RawConnection, RawSse, initialize, open_sse, post, rpc, wait_for_line

pytestmark = pytest.mark.skipif(not supported(), reason="process checks read /proc (Linux)")

SCRIPT_AGENT = [sys.executable, str(ROOT / "tests" / "stdio_script_agent.py")]
AGENT_ENV = {"ACP_AGENT": json.dumps({"command": SCRIPT_AGENT}), "ACP_AGENT_SHUTDOWN_GRACE": "0.3"}

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def server() -> Iterator[DaphneServer]:
    server = DaphneServer(env=AGENT_ENV).start()
    yield server
    server.stop()


def base(server: DaphneServer) -> str:
    return f"http://127.0.0.1:{server.port}/"


async def scrape(http: httpx.AsyncClient, server: DaphneServer) -> Samples:
    response = await http.get(base(server) + "metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def until_gauge(
    http: httpx.AsyncClient, server: DaphneServer, name: str, expected: float, at_least: bool = False, **labels: str
) -> Samples:
    """Scrape until a gauge reads `expected` (or more): the server updates it once it has
    handled what the client already saw (another process: there is no event to await here)."""
    for _ in range(200):
        samples = await scrape(http, server)
        found = value(samples, name, **labels)
        if found == expected or (at_least and found >= expected):
            return samples
        await asyncio.sleep(0.05)
    raise AssertionError(f"{name}{labels} never read {expected}: {value(samples, name, **labels)}")


async def test_a_scripted_session_is_counted(server: DaphneServer, http: httpx.AsyncClient) -> None:
    start = await scrape(http, server)

    def grew(samples: Samples, name: str, **labels: str) -> float:
        return value(samples, name, **labels) - value(start, name, **labels)

    (worker,) = [dict(labels)["worker"] for name, labels in start if name == "acp_worker_info"]
    assert value(start, "acp_buffered_bytes_limit") == 256 * 1024 * 1024
    assert value(start, "acp_draining") == 0

    connection_id = await initialize(http, server.url)
    assert connection_id.endswith(f".{worker}")
    async with open_sse(http, server.url, connection_id) as connection_stream:
        assert (await post(http, server.url, rpc(1, "session/new", {"cwd": "/"}), connection_id)).status_code == 202
        session_id = (await connection_stream.next())["result"]["sessionId"]
        async with open_sse(http, server.url, connection_id, session_id) as session_stream:
            prompt = {"sessionId": session_id, "prompt": [{"type": "text", "text": "burst 5 100"}]}
            assert (
                await post(http, server.url, rpc(2, "session/prompt", prompt), connection_id, session_id)
            ).status_code == 202
            chunks = [await session_stream.next() for _ in range(5)]
            assert all(chunk["method"] == "session/update" for chunk in chunks)
            assert (await session_stream.next())["result"] == {"stopReason": "end_turn"}

            async with connect(server.ws_url, proxy=None) as ws:
                await ws.send(json.dumps(rpc(0, "initialize", {"protocolVersion": 1})))
                assert json.loads(await ws.recv())["id"] == 0
                await ws.send(json.dumps([rpc(1, "test/raw"), rpc(2, "test/raw")]))  # a batch: two messages
                assert len(json.loads(await ws.recv())) == 2

                during = await scrape(http, server)
                assert value(during, "acp_connections_open", transport="http") == 1
                assert value(during, "acp_connections_open", transport="websocket") == 1
                assert value(during, "acp_streams_open", kind="sse") == 2
                assert value(during, "acp_streams_open", kind="websocket") == 1
                assert value(during, "acp_agent_processes") == 2
                # initialize, session/new, session/prompt; initialize and a batch of two.
                assert grew(during, "acp_messages_in_total", transport="http") == 3
                assert grew(during, "acp_messages_in_total", transport="websocket") == 3
                # Three replies and five chunks; two replies (one a batch of two entries).
                assert grew(during, "acp_messages_out_total", transport="http") == 8
                assert grew(during, "acp_messages_out_total", transport="websocket") == 3
                # What was sent stays in the replay windows, counted in the worker's budget.
                assert 500 < value(during, "acp_buffered_bytes") <= 256 * 1024 * 1024
                # One process: no call to another worker.
                assert not [name for name, _ in during if name.startswith("acp_cross_worker_calls_total")]

            response = await http.delete(server.url, headers={"Acp-Connection-Id": connection_id})
            assert response.status_code == 202
            await session_stream.wait_ended()
            await connection_stream.wait_ended()
    after = await until_gauge(http, server, "acp_streams_open", 0, kind="websocket")
    assert value(after, "acp_streams_open", kind="sse") == 0
    assert value(after, "acp_connections_open", transport="http") == 0
    assert value(after, "acp_connections_open", transport="websocket") == 0
    assert value(after, "acp_buffered_bytes") == 0  # every budget given back
    assert value(after, "acp_agent_processes") == 0
    assert not server.errors()


async def test_metrics_are_not_served_unless_enabled(http: httpx.AsyncClient) -> None:
    server = DaphneServer(env={"ACP_METRICS": "0"}).start()
    try:
        assert (await http.get(base(server) + "metrics")).status_code == 404
        assert (await http.get(base(server) + "ready")).text == "ready"
    finally:
        server.stop()


async def test_ready_fails_while_redis_is_down_and_recovers(http: httpx.AsyncClient) -> None:
    redis = RedisServer.private()
    restarted = RedisServer(port=redis.port)  # the same address, once the first one is stopped
    server = DaphneServer(env={"REDIS_URL": redis.url, "ACP_REDIS_PREFIX": "acp-ready-test:"}).start()
    try:
        ready = await http.get(base(server) + "ready")
        assert (ready.status_code, ready.text) == (200, "ready")
        redis.stop()
        refused = await http.get(base(server) + "ready")
        assert refused.status_code == 503
        assert refused.text.startswith("channel layer unreachable: ") and "\n" not in refused.text
        assert refused.headers["Retry-After"] == "2"
        assert (await http.get(base(server) + "health")).status_code == 200  # alive, not ready
        await asyncio.to_thread(restarted.start)
        for _ in range(100):  # the layer reconnects on its next use: probe as a balancer does
            ready = await http.get(base(server) + "ready")
            if ready.status_code == 200:
                break
            await asyncio.sleep(0.1)
        assert (ready.status_code, ready.text) == (200, "ready")
    finally:
        server.stop()
        redis.stop()
        restarted.stop()


async def test_ready_fails_while_draining(http: httpx.AsyncClient) -> None:
    """A draining worker (SIGTERM) answers 503 until it is gone. Its drain waits for its open
    streams to end; here an SSE reader that stopped reading holds its stream open (the output
    its connection holds, a full budget, cannot be written), so the drain lasts its grace."""
    # More than the kernel's largest send buffer (net.ipv4.tcp_wmem, 4 MiB by default): what the
    # connection holds when its budget is full can never all be written while nobody reads.
    budget = 16 * 1024 * 1024
    env = {
        "ACP_AGENT": "tests.wire_agent.create",
        "ACP_MAX_BUFFERED_BYTES": str(budget),
        "ACP_REPLAY_WINDOW_BYTES": "0",
        "ACP_KEEPALIVE_SECONDS": "60",
        "ACP_SHUTDOWN_GRACE_SECONDS": "60",
    }
    server = DaphneServer(env=env).start()
    raw = None
    try:
        connection_id = await initialize(http, server.url)
        raw = await RawConnection.open(server.port, receive_buffer=4096)
        await RawSse.open(raw, connection_id)
        flood = rpc("flood", "test/flood", {"count": 1000, "size": 64 * 1024})
        assert (await post(http, server.url, flood, connection_id)).status_code == 202
        await until_gauge(http, server, "acp_buffered_bytes", budget, at_least=True)  # the agent is paused
        assert (await http.get(base(server) + "ready")).status_code == 200
        assert server.process is not None
        server.process.send_signal(signal.SIGTERM)
        await wait_for_line(server, r"draining: 1 connections, 1 open streams")
        refused = await http.get(base(server) + "ready")
        assert (refused.status_code, refused.text) == (503, "draining: this worker is shutting down")
        assert refused.headers["Retry-After"] == "10"
        assert (await http.get(base(server) + "health")).status_code == 200  # alive, not ready
        assert value(await scrape(http, server), "acp_draining") == 1
    finally:
        if raw is not None:
            await raw.close()
        server.stop()
