"""acp_channels.layers against a real Redis: the waiting pool, a worker's inbox as a channel of
its process named after it; and the rules of _worker.py that make a 503 safe to retry (an op
that expired before its worker took it is dropped). The layer's Channels behaviours:
tests/test_streams_layer.py."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from redis.asyncio import BlockingConnectionPool

from acp_channels._streams_layer import BLOCK_MS
from acp_channels._views import host_unavailable
from acp_channels._worker import WORKER_ID, Bus, LayerUnavailable, WorkerBusy
from acp_channels._worker_protocol import Alive, Probe, encode_op
from acp_channels.layers import DEFAULT_SOCKET_TIMEOUT, RedisChannelLayer, connection_pool
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
    pool = layer._client().connection_pool
    assert isinstance(pool, BlockingConnectionPool)
    assert pool.max_connections == 9 and pool.timeout == 2.0
    assert pool.connection_kwargs["socket_timeout"] == DEFAULT_SOCKET_TIMEOUT > BLOCK_MS / 1000
    sized = connection_pool({"address": "redis://127.0.0.1:1/0?max_connections=3", "socket_timeout": 9}, 100, 1.0)
    assert sized.max_connections == 3 and sized.connection_kwargs["socket_timeout"] == 9
    # More commands at once than connections: they wait their turn instead of failing.
    results = await asyncio.gather(*(layer._client().ping() for _ in range(50)))
    assert all(results)


async def test_a_worker_inbox_is_a_channel_of_its_process_named_after_it(redis_url: str) -> None:
    prefix = f"acp-layer-test-{uuid.uuid4().hex[:8]}:"
    receiver, sender = (RedisChannelLayer(hosts=[redis_url], prefix=prefix) for _ in range(2))
    bus = Bus()
    bus.use(receiver)
    inbox = bus.inbox(WORKER_ID)
    assert bus.named and inbox == f"acp.worker.{WORKER_ID}!inbox"
    for n in range(3):  # from another process's layer: it needs only the worker's id
        await sender.send(inbox, {"type": "acp.op", "n": n})
    assert [(await receiver.receive(inbox))["n"] for _ in range(3)] == [0, 1, 2]
    await receiver.flush()


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


def test_a_sentinel_host_gets_a_sentinel_pool_of_the_same_size() -> None:
    from redis.asyncio.sentinel import SentinelConnectionPool

    host = {"sentinels": [("127.0.0.1", 26379)], "master_name": "acp", "sentinel_kwargs": {"password": "x"}}
    pool = connection_pool(host, 7, 1.0)
    assert isinstance(pool, SentinelConnectionPool)
    assert pool.service_name == "acp" and pool.max_connections == 7
