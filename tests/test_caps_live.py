"""The caps over the wire (daphne; one worker, and three workers behind a balancer where the
request lands on a worker that does not host the connection): made-up session streams leave
nothing behind and are capped (429), requests in flight are capped (429, or JSON-RPC errors over
a WebSocket) and nothing over the cap reaches the agent, connections per worker and the worker's
output budget are capped (503). Every refusal carries Retry-After and a plain-text body."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from tests.cluster import Cluster
from tests.conftest import SHAPES, start_server
from tests.live import JSON, SSE, DaphneServer, SseReader, initialize, notification, open_sse, post, rpc
from tests.test_wire_websocket import open_ws, receive, send

CAPS_ENV = {"ACP_AGENT": "tests.caps_agent.create", "ACP_MAX_PENDING_REQUESTS": "3", "ACP_MAX_BODY_BYTES": "262144"}
PAD = "x" * 150 * 1024  # two requests with this much wait for the agent: over MAX_BODY_BYTES
TEXT = "text/plain; charset=utf-8"
T = 10.0


@pytest.fixture(scope="module", params=SHAPES)
def caps_server(request: pytest.FixtureRequest) -> Iterator[DaphneServer | Cluster]:
    server = start_server(request.param, CAPS_ENV, request)
    yield server
    server.stop()
    assert server.errors() == []


@contextlib.asynccontextmanager
async def single(env: dict[str, str]) -> AsyncIterator[DaphneServer]:
    server = DaphneServer(env={"ACP_AGENT": "tests.caps_agent.create", **env}).start()
    try:
        yield server
    finally:
        server.stop()
    assert server.errors() == []


def assert_refused(response: httpx.Response, status: int, text: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == TEXT
    assert response.text.startswith(text), response.text
    assert int(response.headers["retry-after"]) > 0


async def state(http: httpx.AsyncClient, url: str, connection_id: str, stream: SseReader) -> dict[str, Any]:
    """The host's state, reported by the caps agent from inside the server process."""
    request_id = f"state-{uuid.uuid4()}"
    assert (await post(http, url, rpc(request_id, "caps/state"), connection_id)).status_code == 202
    while (message := await stream.next(T)).get("id") != request_id:
        pass
    result: dict[str, Any] = message["result"]
    return result


def stream_headers(connection_id: str, session_id: str) -> dict[str, str]:
    return {**SSE, "Acp-Connection-Id": connection_id, "Acp-Session-Id": session_id}


# -- session streams ---------------------------------------------------------------------------


async def test_made_up_session_streams_leave_nothing_and_the_65th_is_refused(
    caps_server: DaphneServer | Cluster, http: httpx.AsyncClient
) -> None:
    url = caps_server.url
    # Several times the cap of 64: one stream or session left behind per made-up id would reach
    # the cap long before the end (and the 65th below would be refused early).
    count = 300 if isinstance(caps_server, DaphneServer) else 200  # across workers each costs more
    connection_id = await initialize(http, url)
    async with httpx.AsyncClient(timeout=httpx.Timeout(20.0)) as client:
        gate = asyncio.Semaphore(8)  # a few at a time: far under the cap while the server notices closes

        async def open_then_close() -> None:
            async with gate:
                headers = stream_headers(connection_id, f"made-up-{uuid.uuid4()}")
                async with client.stream("GET", url, headers=headers) as response:
                    assert response.status_code == 200
                response = await client.head(url, headers=stream_headers(connection_id, f"head-{uuid.uuid4()}"))
                assert response.status_code == 200

        await asyncio.gather(*(open_then_close() for _ in range(count)))

    async with open_sse(http, url, connection_id) as stream:
        # The server notices each closed GET on its own time: a bounded wait for the last ones.
        for _ in range(100):
            if (await state(http, url, connection_id, stream))["sessionStreams"] == 0:
                break
            await asyncio.sleep(0.1)
        assert (await state(http, url, connection_id, stream))["sessionStreams"] == 0

        async with contextlib.AsyncExitStack() as open_streams:
            for n in range(64):
                await open_streams.enter_async_context(open_sse(http, url, connection_id, f"held-{n}"))
            for method in ("GET", "HEAD"):
                response = await http.request(method, url, headers=stream_headers(connection_id, "one-too-many"))
                if method == "GET":
                    assert_refused(response, 429, "too many session streams on this connection (at most 64)")
                else:
                    assert (response.status_code, response.content) == (429, b"")
                    assert int(response.headers["retry-after"]) > 0
            # Streams that exist are not refused: the connection stream, and an open one (409).
            response = await http.get(url, headers=stream_headers(connection_id, "held-0"))
            assert response.status_code == 409
            assert (await state(http, url, connection_id, stream))["sessionStreams"] == 64
    await http.delete(url, headers={"Acp-Connection-Id": connection_id})


# -- requests in flight ------------------------------------------------------------------------


async def test_posts_over_the_pending_cap_get_429_and_reach_nothing(
    caps_server: DaphneServer | Cluster, http: httpx.AsyncClient
) -> None:
    url = caps_server.url
    connection_id = await initialize(http, url)
    async with open_sse(http, url, connection_id) as stream:
        for n in range(3):
            assert (await post(http, url, rpc(n, "caps/hold"), connection_id)).status_code == 202
        for body in (rpc("over", "caps/hold", {"sessionId": "s-over"}), [notification("x/n"), rpc("b", "caps/hold")]):
            assert_refused(await post(http, url, body, connection_id), 429, "too many requests in flight")
        # Notifications and responses are not requests in flight.
        assert (await post(http, url, notification("caps/answer_held"), connection_id)).status_code == 202
        assert sorted([(await stream.next(T))["id"] for _ in range(3)]) == [0, 1, 2]
        # The replies released the count: requests go through again.
        assert (await post(http, url, rpc("received", "test/received"), connection_id)).status_code == 202
        reply = await stream.next(T)
        assert reply["id"] == "received"
        assert [frame for frame in reply["result"]["frames"] if '"over"' in frame or '"b"' in frame] == []
    await http.delete(url, headers={"Acp-Connection-Id": connection_id})


async def test_websocket_requests_over_the_pending_cap_get_errors_and_reach_nothing(
    caps_server: DaphneServer | Cluster,
) -> None:
    error = {"code": -32000, "message": "too many requests in flight", "data": {"limit": 3}}
    async with open_ws(caps_server.ws_url) as ws:
        for n in range(3):
            await send(ws, rpc(n, "caps/hold"))
        await send(ws, rpc("over", "caps/hold"))
        assert await receive(ws) == {"jsonrpc": "2.0", "id": "over", "error": error}
        await send(ws, [rpc("b1", "caps/hold"), rpc("b2", "x/echo")])
        assert await receive(ws) == [
            {"jsonrpc": "2.0", "id": "b1", "error": error},
            {"jsonrpc": "2.0", "id": "b2", "error": error},
        ]
        await send(ws, notification("caps/answer_held"))
        assert sorted([(await receive(ws))["id"] for _ in range(3)]) == [0, 1, 2]
        await send(ws, rpc("received", "test/received"))
        reply = await receive(ws)
        assert reply["id"] == "received"
        assert [frame for frame in reply["result"]["frames"] if '"over"' in frame or '"b1"' in frame] == []


async def test_posts_whose_requests_would_hold_over_a_body_get_429_until_answered(
    caps_server: DaphneServer | Cluster, http: httpx.AsyncClient
) -> None:
    url = caps_server.url
    connection_id = await initialize(http, url)
    async with open_sse(http, url, connection_id) as stream:
        assert (await post(http, url, rpc(1, "caps/hold", {"pad": PAD}), connection_id)).status_code == 202
        assert_refused(
            await post(http, url, rpc(2, "caps/hold", {"pad": PAD}), connection_id),
            429,
            "the requests in flight on this connection (or this worker) hold too many bytes (at most 262144)",
        )
        assert (await post(http, url, notification("caps/answer_held"), connection_id)).status_code == 202
        assert (await stream.next(T))["id"] == 1
        assert (await post(http, url, rpc(2, "caps/hold", {"pad": PAD}), connection_id)).status_code == 202
    await http.delete(url, headers={"Acp-Connection-Id": connection_id})


async def test_websocket_requests_that_would_hold_over_a_body_get_errors(caps_server: DaphneServer | Cluster) -> None:
    error = {
        "code": -32000,
        "message": "the requests in flight hold too many bytes",
        "data": {"limit": 262144, "unit": "bytes"},
    }
    async with open_ws(caps_server.ws_url) as ws:
        await send(ws, rpc(1, "caps/hold", {"pad": PAD}))
        await send(ws, rpc(2, "caps/hold", {"pad": PAD}))
        assert await receive(ws) == {"jsonrpc": "2.0", "id": 2, "error": error}
        await send(ws, notification("caps/answer_held"))
        assert (await receive(ws))["id"] == 1


# -- the worker's caps ---------------------------------------------------------------------------


async def test_max_connections_is_503_with_retry_after_and_not_ready(http: httpx.AsyncClient) -> None:
    """At the cap, initialize is 503 and so is /ready (a balancer sends new clients elsewhere);
    /health stays 200 (liveness). One connection freed, both are 200 again."""
    async with single({"ACP_MAX_CONNECTIONS": "2"}) as server:
        ready, health = server.url.replace("/acp", "/ready"), server.url.replace("/acp", "/health")
        first = await initialize(http, server.url)
        assert (await http.get(ready)).status_code == 200
        await initialize(http, server.url)
        response = await http.post(server.url, headers=JSON, json=rpc(0, "initialize", {"protocolVersion": 1}))
        assert_refused(response, 503, "too many ACP connections on this server")
        assert "acp-connection-id" not in response.headers
        assert_refused(await http.get(ready), 503, "at capacity: too many ACP connections on this server")
        assert (await http.get(health)).status_code == 200
        assert (await http.delete(server.url, headers={"Acp-Connection-Id": first})).status_code == 202
        assert (await http.get(ready)).status_code == 200
        await initialize(http, server.url)


async def test_worker_output_budget_is_503_and_nothing_is_dropped(http: httpx.AsyncClient) -> None:
    budget = {
        "ACP_MAX_WORKER_BUFFERED_BYTES": str(64 * 1024),
        "ACP_MAX_BUFFERED_BYTES": str(64 * 1024),
        "ACP_REPLAY_WINDOW_BYTES": str(16 * 1024),  # within the budget (check E031)
        "ACP_DETACHED_SECONDS": "0",  # nobody reads: the agents pause (with it, old output goes)
    }
    async with single(budget) as server:
        url = server.url
        connection_id = await initialize(http, url)
        # ~3000 x 70 bytes for a session nobody reads yet: more than the worker may hold.
        burst = rpc(1, "test/burst", {"count": 3000, "sessionId": "s"})
        assert (await post(http, url, burst, connection_id)).status_code == 202
        for _ in range(100):  # the router fills the budget on its own time: a bounded wait
            response = await http.post(url, headers=JSON, json=rpc(0, "initialize", {"protocolVersion": 1}))
            if response.status_code != 200:
                break
            await asyncio.sleep(0.05)
        assert_refused(response, 503, "this server is holding too much undelivered output; try again")
        assert_refused(await http.get(url.replace("/acp", "/ready")), 503, "at capacity: this server is holding")
        async with open_sse(http, url, connection_id, "s") as reader:
            numbers = [(await reader.next(T))["params"]["n"] for _ in range(3000)]
            assert numbers == list(range(3000))
            assert (await reader.next(T))["id"] == 1
        for _ in range(100):  # the last batch stops counting once the server has written it
            response = await http.post(url, headers=JSON, json=rpc(0, "initialize", {"protocolVersion": 1}))
            if response.status_code == 200:
                break
            await asyncio.sleep(0.05)
        assert response.status_code == 200
