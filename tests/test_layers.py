"""acp_channels.layers against a real Redis: the waiting pool, the one-round-trip send (same
format, capacity and expiry as channels-redis), batched receives; and the rules of _worker.py
that make a 503 safe to retry (an op that expired before its worker took it is dropped)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from channels.exceptions import ChannelFull
from channels_redis.core import RedisChannelLayer as StockLayer
from redis.asyncio import BlockingConnectionPool

from acp_channels._views import host_unavailable
from acp_channels._worker import Bus, LayerUnavailable, WorkerBusy
from acp_channels._worker_protocol import Alive, Probe, encode_op
from acp_channels.layers import DEFAULT_SOCKET_TIMEOUT, RedisChannelLayer
from tests.cluster import RedisServer


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    redis = RedisServer.shared_or_private()
    yield redis.url
    redis.stop()


@pytest.fixture
async def layer(redis_url: str) -> AsyncIterator[RedisChannelLayer]:
    layer = RedisChannelLayer(
        hosts=[redis_url], prefix=f"acp-layer-test-{uuid.uuid4().hex[:8]}:", capacity=3, pool_size=9, pool_timeout=2.0
    )
    yield layer
    await layer.flush()


async def test_the_pool_waits_for_a_free_connection_and_reads_replies_patiently(layer: RedisChannelLayer) -> None:
    pool = layer.create_pool(0)
    assert isinstance(pool, BlockingConnectionPool)
    assert pool.max_connections == 9 and pool.timeout == 2.0
    assert pool.connection_kwargs["socket_timeout"] == DEFAULT_SOCKET_TIMEOUT > StockLayer.brpop_timeout
    sized = RedisChannelLayer(hosts=[{"address": "redis://127.0.0.1:1/0?max_connections=3", "socket_timeout": 9}])
    assert sized.create_pool(0).max_connections == 3
    assert sized.create_pool(0).connection_kwargs["socket_timeout"] == 9
    # More commands at once than connections: they wait their turn instead of failing.
    connection = layer.connection(0)
    results = await asyncio.gather(*(connection.ping() for _ in range(50)))
    assert all(results)


async def test_send_keeps_the_order_the_capacity_and_the_format(layer: RedisChannelLayer) -> None:
    channel = "acp.worker.abc"
    for index in range(3):
        await layer.send(channel, {"type": "acp.op", "n": index})
    with pytest.raises(ChannelFull):  # capacity 3, as channels-redis counts it
        await layer.send(channel, {"type": "acp.op", "n": 3})
    # channels-redis's own receive reads what we sent, in order: the format is the same.
    assert [(await layer.receive(channel))["n"] for _ in range(3)] == [0, 1, 2]


async def test_a_process_channel_keeps_channels_redis_send(layer: RedisChannelLayer) -> None:
    name = await layer.new_channel()
    await layer.send(name, {"type": "x", "n": 1})
    assert (await layer.receive(name))["n"] == 1


async def test_an_op_that_expired_before_its_worker_took_it_is_dropped() -> None:
    bus = Bus()
    served: list[str] = []

    async def handler(op: Probe) -> Alive:
        served.append(op.lease)
        return Alive(True)

    bus.handle(Probe, handler)
    replies: list[dict[str, Any]] = []

    async def send(channel: str, message: dict[str, Any]) -> None:
        replies.append(message)

    bus.send = send  # type: ignore[method-assign]
    now = time.time()
    for lease, expires in (("late", now - 1), ("in-time", now + 30), ("no-expiry", None)):
        bus._dispatch(encode_op(Probe(lease), lease, "acp.worker.caller", receipt=True, expires=expires))
    await asyncio.gather(*bus._tasks)
    assert served == ["in-time", "no-expiry"]
    assert {message["id"] for message in replies} == {"in-time", "no-expiry"}


def test_a_busy_worker_or_a_failed_send_is_503_with_retry_after() -> None:
    for error in (WorkerBusy("busy"), LayerUnavailable("down")):
        response = host_unavailable(error)
        assert response.status_code == 503 and response["Retry-After"] == "1"
