"""One ACP connection served by several daphne workers sharing Redis (no sticky sessions)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from acp_channels import _gateway as gateway
from acp_channels import _worker as worker
from acp_channels.layers import RedisChannelLayer
from tests.cluster import Cluster, RedisServer
from tests.gateway_bus import patch_bus
from tests.live import initialize, open_sse, post, rpc


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    redis = RedisServer.shared_or_private()
    cluster = Cluster(redis, env={"ACP_AGENT": "tests.wire_agent.create", "ACP_KEEPALIVE_SECONDS": "0.5"}).start()
    yield cluster
    cluster.stop()
    redis.stop()


async def test_every_request_on_a_different_worker(cluster: Cluster, http: httpx.AsyncClient) -> None:
    a, b, c = (worker.url for worker in cluster.workers)
    connection_id = await initialize(http, a)
    async with open_sse(http, b, connection_id) as connection_stream, open_sse(http, c, connection_id, "s1") as s1:
        response = await post(http, c, rpc(1, "custom/echo", {"x": 1}), connection_id)
        assert response.status_code == 202
        assert (await connection_stream.next())["result"] == {"method": "custom/echo", "params": {"x": 1}}
        response = await post(http, b, rpc(2, "session/prompt", {"prompt": []}), connection_id, "s1")
        assert response.status_code == 202
        assert (await s1.next())["id"] == 2
        response = await post(http, a, rpc(3, "test/burst", {"count": 2000, "sessionId": "s1"}), connection_id)
        assert response.status_code == 202
        items = [await s1.next() for _ in range(2000)]
        assert [item["params"]["n"] for item in items] == list(range(2000))
        response = await http.delete(c, headers={"Acp-Connection-Id": connection_id})
        assert response.status_code == 202
        await connection_stream.wait_ended()
        await s1.wait_ended()
    for url in (a, b, c):
        response = await post(http, url, rpc(4, "x"), connection_id)
        assert response.status_code == 404
    assert not cluster.errors()


async def test_posts_acknowledged_one_by_one_reach_the_agent_in_order(
    cluster: Cluster, http: httpx.AsyncClient
) -> None:
    urls = [worker.url for worker in cluster.workers]
    connection_id = await initialize(http, urls[0])
    for n in range(60):  # each POST lands on another worker; each waits for its 202
        note = {"jsonrpc": "2.0", "method": "custom/note", "params": {"n": n}}
        assert (await post(http, urls[n % 3], note, connection_id)).status_code == 202
    async with open_sse(http, urls[1], connection_id) as reader:
        assert (await post(http, urls[2], rpc(1, "test/received"), connection_id)).status_code == 202
        frames = (await reader.next())["result"]["frames"]
    notes = [json.loads(frame)["params"]["n"] for frame in frames if "custom/note" in frame]
    assert notes == list(range(60))


async def test_a_worker_that_fails_to_handle_a_post_is_500_not_202(cluster: Cluster, http: httpx.AsyncClient) -> None:
    """The host's worker answers `internal` when its handler raises (here: the agent adapter
    fails on input); a POST through another worker must say so, as on the host's own worker."""
    a, b, _ = (worker.url for worker in cluster.workers)
    connection_id = await initialize(http, a)
    assert (await post(http, a, rpc(1, "test/break_input"), connection_id)).status_code == 202
    response = await post(http, b, rpc(2, "custom/echo"), connection_id)
    assert response.status_code == 500
    assert response.text == "the connection's worker failed to handle submit"


@pytest.fixture
def cluster_bus(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[worker.Bus]:
    """This test process on the cluster's bus, as a management command reaches the workers: an
    inbox of its own for the replies, no heartbeat."""
    prefix = cluster.workers[0].env["ACP_REDIS_PREFIX"]
    bus = worker.Bus()
    bus.use(RedisChannelLayer(hosts=[cluster.redis.url], prefix=prefix, channel_capacity={"acp.worker.*": 10000}))
    bus.hosts_connections = False  # as a management command: not counted as a worker
    patch_bus(monkeypatch, bus)
    yield bus


async def test_the_cluster_view_lists_and_ends_connections_on_every_worker(
    cluster: Cluster, cluster_bus: worker.Bus, http: httpx.AsyncClient
) -> None:
    a, b, _ = (server.url for server in cluster.workers)
    on_a, on_b = await initialize(http, a), await initialize(http, b)
    connections, silent = await gateway.cluster_connections()
    assert silent == []
    listed = {info.connection_id: info for info in connections}
    assert {on_a, on_b} <= listed.keys()
    for connection_id in (on_a, on_b):
        info = listed[connection_id]
        assert info.worker == connection_id.rpartition(".")[2]
        assert (info.transport, info.principal) == ("http", "anonymous")
    assert len({listed[on_a].worker, listed[on_b].worker}) == 2
    assert len(await cluster_bus.heartbeat.live_workers()) == 3  # the workers, not this process

    assert await gateway.end_connection(on_a)  # no principal: administrative
    assert (await post(http, b, rpc(1, "custom/echo"), on_a)).status_code == 404
    assert await gateway.end_connection(on_a) is False  # gone now
    assert await gateway.end_connection("not-a-connection") is False
    connections, _ = await gateway.cluster_connections()
    assert on_a not in {info.connection_id for info in connections}
    assert on_b in {info.connection_id for info in connections}
    await cluster_bus.stop()
