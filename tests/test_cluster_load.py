"""A burst of clients through three workers on Redis behind the round-robin balancer: every
client must pass, none may get a 404 (a live worker taken for dead), a 503 or a hang.

Each client does what the benchmark's fanout does (bench/scenarios.py `run_fanout`, on the raw
wire of bench/client.py): initialize, the connection stream, session/new, the session stream,
one prompt streaming 20 chunks checked in order, then DELETE (WebSocket: upgrade, the same calls,
close). The whole burst has a deadline, so the test fails instead of hanging. Speed is measured
in bench/ (LOAD.md), not asserted here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from bench.scenarios import run_fanout
from tests.cluster import Cluster, RedisServer

CLIENTS = 300
#: Generous for a loaded 2-core machine; a healthy cluster takes a fraction of it.
DEADLINE = 150.0
#: How long one client waits for a reply or a stream head: this test is about every client
#: getting through (no 404, 503 or loss), not about latency on a machine shared with others.
STEP = 120.0

pytestmark = pytest.mark.timeout(DEADLINE * 2 + 60)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    redis = RedisServer.private()
    cluster = Cluster(redis).start()  # the demo agent (its `stream <n> <bytes>` command)
    yield cluster
    cluster.stop()
    redis.stop()


@pytest.mark.parametrize("transport", ["http", "ws"])
async def test_a_burst_of_300_clients_through_three_workers_all_pass(cluster: Cluster, transport: str) -> None:
    async with asyncio.timeout(DEADLINE + 30):  # run_fanout's own deadline, then this one
        result = await run_fanout(
            transport, cluster.url, CLIENTS, prompts=1, chunks=20, timeout=DEADLINE, options={"step_timeout": STEP}
        )
    assert result.errors == [], f"{result.completed}/{CLIENTS} passed in {result.seconds:.1f} s"
    assert result.completed == CLIENTS
    assert not cluster.errors()
