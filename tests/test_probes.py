"""/ready, /metrics and the metric helpers in one process (the in-memory layer); the live
behaviour (Redis stopped, a draining worker, a scripted session) is in test_observability_live."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.test import AsyncClient
from prometheus_client import REGISTRY

from acp_channels import _metrics as metrics
from acp_channels._lifecycle import lifecycle
from acp_channels._worker import WORKER_ID, AgentBusy, HostUnreachable, LayerUnavailable


@pytest.fixture
def metrics_on(settings: Any) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "METRICS": True}


async def test_ready_on_one_process() -> None:
    response = await AsyncClient().get("/ready")
    assert (response.status_code, response.content) == (200, b"ready")
    assert (await AsyncClient().post("/ready")).status_code == 405


async def test_ready_refuses_while_draining() -> None:
    lifecycle.draining = True
    try:
        response = await AsyncClient().get("/ready")
    finally:
        lifecycle.draining = False
    assert (response.status_code, response.content) == (503, b"draining: this worker is shutting down")
    assert response["Retry-After"] == "10"
    assert (await AsyncClient().get("/health")).status_code == 200


async def test_metrics_off_is_404(settings: Any) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "METRICS": False}
    assert (await AsyncClient().get("/metrics")).status_code == 404


@pytest.mark.usefixtures("metrics_on")
async def test_metrics_in_text_and_openmetrics_formats() -> None:
    text = await AsyncClient().get("/metrics")
    assert text.status_code == 200 and text["Content-Type"].startswith("text/plain; version=0.0.4")
    assert f'acp_worker_info{{worker="{WORKER_ID}"}} 1.0' in text.content.decode()
    assert 'acp_connections_open{transport="http"}' in text.content.decode()
    openmetrics = await AsyncClient().get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert openmetrics["Content-Type"].startswith("application/openmetrics-text")
    assert openmetrics.content.decode().endswith("# EOF\n")
    assert (await AsyncClient().post("/metrics")).status_code == 405


class Refusal:
    """Stands for the bus's error replies (worker_protocol.ErrorReply)."""


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize(
    ("outcome", "raised", "result"),
    [
        ("ok", None, {"ok": True}),
        ("refused", None, Refusal()),
        ("unreachable", HostUnreachable("x"), None),
        ("busy", AgentBusy("x"), None),
        ("layer", LayerUnavailable("x"), None),
        ("failed", KeyError("x"), None),
        ("cancelled", asyncio.CancelledError(), None),
    ],
)
async def test_cross_worker_calls_counted_by_outcome(
    outcome: str, raised: BaseException | None, result: object
) -> None:
    class FakeBus:
        @metrics.measured_call(refused=Refusal, unreachable=HostUnreachable, busy=AgentBusy, layer=LayerUnavailable)
        async def call(self, worker_id: str, op: str, args: dict[str, Any], *, timeout: float) -> object:
            if raised is not None:
                raise raised
            assert result is not None
            return result

    op = f"test-{outcome}"
    if raised is None:
        assert await FakeBus().call("w", op, {}, timeout=1) == result
    else:
        with pytest.raises(type(raised)):
            await FakeBus().call("w", op=op, args={}, timeout=1)
    assert sample("acp_cross_worker_calls_total", op=op, outcome=outcome) == 1
    assert sample("acp_cross_worker_call_seconds_count", op=op) == 1


async def test_in_one_process_the_cluster_is_this_process() -> None:
    """With the in-memory layer, cluster_connections and end_connection act on this process's
    own connections (a worker calling them; the commands refuse: they run in another process)."""
    from acp_channels._cluster_admin import cluster_connections, end_connection
    from acp_channels._host import registry
    from acp_channels._identity import Principal
    from acp_channels._worker import new_connection_id
    from tests.wire_agent import create

    alice = Principal("token", "alice", "Alice")
    connection_id = new_connection_id()
    host = registry.create(
        lambda context: create(), "http", connection_id=connection_id, max_buffered_bytes=1 << 20, principal=alice
    )
    try:
        connections, silent = await cluster_connections()
        (info,) = [info for info in connections if info.connection_id == host.connection_id]
        assert (info.worker, info.principal, info.transport, info.agent_pid) == (WORKER_ID, "token:Alice", "http", None)
        assert silent == []
        assert await end_connection(host.connection_id) is True
        assert host.end_reason == "delete" and registry.get(host.connection_id) is None
        assert await end_connection(host.connection_id) is False
        assert await end_connection("not-a-connection-id") is False
    finally:
        await host.terminate()
