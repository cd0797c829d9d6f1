"""`gateway.open_connection`, the one admission both edges use, and each edge's answer to its
refusals (in process: channels' communicators, no server).

The live counterparts pin the same answers through daphne: test_caps_live.py (503 at
MAX_CONNECTIONS and at the worker's output budget), test_auth_live.py (429 and 1013 at a
principal's quota), test_agent_start_failure.py (500 and 1011 when the agent cannot start).
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
from typing import Any

import pytest
from channels.testing import HttpCommunicator, WebsocketCommunicator

from acp_channels import _gateway as gateway
from acp_channels._gateway import (
    AgentNotStarted,
    LayerUnavailable,
    QuotaExceeded,
    ServerFull,
    ShuttingDown,
    open_connection,
)
from acp_channels._host import registry
from acp_channels._identity import ANONYMOUS, Principal
from acp_channels._lifecycle import lifecycle
from acp_channels._protocol import Single
from acp_channels._routing import build_asgi_application
from acp_channels._worker import WORKER_ID, worker_of
from tests.live import rpc

ADA = Principal("user", "ada", "Ada")
TIMEOUT = 5.0
#: What pytest-django lets through ALLOWED_HOSTS (communicators send no Host of their own).
HOST = (b"host", b"testserver")


@pytest.fixture(autouse=True)
def wire_agent(settings: Any) -> None:
    settings.ACP_CHANNELS = {"AGENT": "tests.wire_agent.create", "MAX_BUFFERED_BYTES": 123456}


@pytest.fixture
def draining(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lifecycle, "draining", True)


@pytest.fixture(scope="module")
def application() -> Any:
    return build_asgi_application()


async def test_a_new_connection_is_this_workers_with_the_settings_limits() -> None:
    before = len(registry)
    connection = await open_connection("http", ADA, "192.0.2.7")
    try:
        host = registry.get(connection.connection_id)
        assert host is connection.host
        assert worker_of(connection.connection_id) == WORKER_ID  # any worker can reach it
        assert (host.principal, host.transport, host.remote_address) == (ADA, "http", "192.0.2.7")
        assert gateway.locate(connection.connection_id, ADA) is not None
        assert host._budget.limit == 123456
        assert len(registry) == before + 1
    finally:
        await connection.abandon()
    assert registry.get(connection.connection_id) is None


async def test_a_draining_worker_opens_nothing(draining: None) -> None:
    before = len(registry)
    with pytest.raises(ShuttingDown):
        await open_connection("websocket", ANONYMOUS, None)
    assert len(registry) == before


async def test_the_worker_caps_and_the_principals_quota(settings: Any) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "MAX_CONNECTIONS_PER_PRINCIPAL": 1}
    first = await open_connection("http", ADA, None)
    try:
        with pytest.raises(QuotaExceeded) as quota:
            await open_connection("websocket", ADA, None)
        assert quota.value.limit == 1
        settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "MAX_CONNECTIONS": len(registry)}
        with pytest.raises(ServerFull) as full:
            await open_connection("http", ANONYMOUS, None)
        assert full.value.reason == "connections"
    finally:
        await first.abandon()


async def test_an_agent_that_cannot_start_is_logged_once_with_its_cause(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "AGENT": "tests.wire_agent.broken"}
    before = len(registry)
    with caplog.at_level(logging.ERROR, logger="acp_channels.gateway"), pytest.raises(AgentNotStarted) as failed:
        await open_connection("http", ANONYMOUS, None)
    assert isinstance(failed.value.__cause__, RuntimeError)
    assert len(registry) == before
    logged = [record for record in caplog.records if record.name == "acp_channels.gateway"]
    assert [record.getMessage() for record in logged] == ["the agent could not be started"]
    assert logged[0].exc_info is not None and str(logged[0].exc_info[1]) == "this agent cannot start"


# -- each edge's answer while the worker drains -----------------------------------------------


async def test_http_initialize_while_draining_is_503(application: Any, draining: None) -> None:
    body = json.dumps(rpc(0, "initialize", {"protocolVersion": 1})).encode()
    communicator = HttpCommunicator(
        application, "POST", "/acp", body=body, headers=[HOST, (b"content-type", b"application/json")]
    )
    response = await communicator.get_response(TIMEOUT)
    assert response["status"] == 503
    assert response["body"] == b"this server is shutting down; connect again"
    assert b"acp-connection-id" not in dict(response["headers"])


async def test_a_new_socket_while_draining_is_refused_before_the_upgrade(application: Any, draining: None) -> None:
    before = len(registry)
    communicator = WebsocketCommunicator(application, "/acp", headers=[HOST])
    accepted, _ = await communicator.connect(TIMEOUT)
    assert not accepted  # closed before accept: the server answers 403
    assert len(registry) == before


async def test_a_reattach_while_draining_is_told_to_try_again(application: Any, draining: None) -> None:
    headers = [HOST, (b"acp-connection-id", f"x.{WORKER_ID}".encode()), (b"last-event-id", b"0")]
    communicator = WebsocketCommunicator(application, "/acp", headers=headers)
    accepted, _ = await communicator.connect(TIMEOUT)
    assert accepted  # no denial-response extension here: accepted, then closed with 4000 + 503
    closing = await communicator.receive_output(TIMEOUT)
    assert closing == {"type": "websocket.close", "code": 4503, "reason": "this server is shutting down; connect again"}


async def test_stdio_agents_have_a_cap_of_their_own(settings: Any) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "MAX_STDIO_AGENTS": 1}
    connections = [await open_connection("http", ANONYMOUS, None) for _ in range(2)]  # in-process: not counted
    try:
        # With a command for AGENT every connection is a process: the cap is checked before
        # the next one would start.
        settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "AGENT": {"command": ["cat"]}}
        with pytest.raises(ServerFull) as full:
            await open_connection("websocket", ANONYMOUS, None)
        assert (full.value.reason, full.value.retry_after, full.value.status) == ("stdio", 10, 503)
    finally:
        for connection in connections:
            await connection.abandon()


async def test_with_runners_a_redis_that_does_not_answer_is_layer_unavailable(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Placement reads the runners' loads from Redis: a Redis that is down is a 503 to try
    again (LayerUnavailable), never a 500."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    from acp_channels._gateway import placement
    from acp_channels._worker import bus

    async def redis_down() -> dict[str, Any]:
        raise RedisConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "AGENT_HOSTS": "runners"}
    monkeypatch.setattr(bus.heartbeat, "runner_loads", redis_down)
    monkeypatch.setattr(placement, "runners", placement.RunnerView())
    connection = await open_connection("http", ANONYMOUS, None)
    with pytest.raises(LayerUnavailable) as unavailable:
        await connection.initialize(Single(rpc(0, "initialize", {"protocolVersion": 1})), 0)
    assert (unavailable.value.status, unavailable.value.retry_after) == (503, 1)
    assert "Connection refused" in str(unavailable.value)


RUNNERS_WITH_ROOM = {
    "runner00000a": {"connections": 3, "room": True, "draining": False},
    "runner00000b": {"connections": 3, "room": True, "draining": False},
}


async def test_a_burst_of_initializes_shares_one_read_of_the_runners_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, every initialize that found the loads stale read them again, each taking a
    connection of the heartbeat's small pool: a burst of a thousand ran it dry (503s)."""
    from acp_channels._gateway import placement
    from acp_channels._worker import bus

    reads = 0
    answer = asyncio.Event()

    async def runner_loads() -> dict[str, Any]:
        nonlocal reads
        reads += 1
        await answer.wait()
        return RUNNERS_WITH_ROOM

    monkeypatch.setattr(bus.heartbeat, "runner_loads", runner_loads)
    view = placement.RunnerView()
    burst = [asyncio.ensure_future(view.candidates()) for _ in range(200)]
    await asyncio.sleep(0)  # every one of them is waiting for the loads now
    burst[0].cancel()  # a client that leaves does not take the read from the others
    answer.set()
    results = await asyncio.gather(*burst[1:])
    assert reads == 1
    assert all(sorted(result) == sorted(RUNNERS_WITH_ROOM) for result in results)


async def test_initializes_in_flight_spread_over_the_runners(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """An Open counts for its runner while it is on its way: the initializes of a burst go to
    both runners alike (before, each counted only once answered, and all of them went to the
    runner that looked emptiest when the burst began)."""
    from acp_channels._gateway import placement
    from acp_channels._worker import bus
    from acp_channels._worker_protocol import Opened

    async def runner_loads() -> dict[str, Any]:
        return RUNNERS_WITH_ROOM

    asked: list[str] = []
    all_asked, answer = asyncio.Event(), asyncio.Event()

    async def call(worker_id: str, op: Any, *, timeout: float, receipt: bool = False) -> Any:
        asked.append(worker_id)
        if len(asked) == 40:
            all_asked.set()
        await answer.wait()
        return Opened('{"jsonrpc":"2.0","id":0,"result":{}}', True)

    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "AGENT_HOSTS": "runners"}
    monkeypatch.setattr(bus.heartbeat, "runner_loads", runner_loads)
    monkeypatch.setattr(bus, "call", call)
    monkeypatch.setattr(placement, "runners", placement.RunnerView())
    connections = [await open_connection("http", ANONYMOUS, None) for _ in range(40)]
    opening = [asyncio.ensure_future(connection.open()) for connection in connections]
    await asyncio.wait_for(all_asked.wait(), TIMEOUT)  # every Open is on its way at once
    answer.set()
    await asyncio.gather(*opening)
    assert sorted(collections.Counter(asked).values()) == [20, 20]
    # Answered, they count as placed until the loads are read again: the next one goes where
    # fewer are.
    assert len(await placement.runners.candidates()) == 2


@pytest.mark.parametrize(
    ("params", "status"),
    [({"hang": True}, 504), ({"reject": True}, 200), ({"exit": True}, 500)],
    ids=["no-answer", "rejected", "agent-ended"],
)
async def test_an_initialize_that_is_not_accepted_leaves_no_connection(
    application: Any, settings: Any, params: dict[str, Any], status: int
) -> None:
    """An agent that does not answer initialize within INITIALIZE_TIMEOUT (504), rejects it
    (the agent's error, 200, no connection id) or ends before answering (500): whatever the answer,
    the connection it would have been is gone (`gateway.initialize_or_abandon`)."""
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "INITIALIZE_TIMEOUT": 0.2}
    before = len(registry)
    body = json.dumps(rpc(0, "initialize", {"protocolVersion": 1, **params})).encode()
    communicator = HttpCommunicator(
        application, "POST", "/acp", body=body, headers=[HOST, (b"content-type", b"application/json")]
    )
    response = await communicator.get_response(TIMEOUT)
    assert (response["status"], b"acp-connection-id" in dict(response["headers"])) == (status, False)
    assert len(registry) == before
