"""Big batches over the wire, against real daphne processes.

- A batch over MAX_BATCH_ENTRIES (1000 by default) is refused whole by the transport: a -32600
  with `id: null` where the answer to a malformed frame goes (the connection stream, the socket,
  or the body of a would-be initialize), and the agent receives none of it.
- A batch the limit allows is processed in slices: while one client's 50,000-entry batch is
  being processed, other clients still get answers (latency as a ratio of the batch's own
  processing time, measured in the same test).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import orjson
import pytest
from websockets.asyncio.client import connect

from tests.cluster import Cluster
from tests.live import DaphneServer, SseReader, initialize, notification, open_sse, post, rpc

DEFAULT_LIMIT = 1000
BIG_BATCH = 50_000
TIMEOUT = 20.0
INIT = rpc(0, "initialize", {"protocolVersion": 1})  # what tests.live.initialize sends


def refusal(entries: int, limit: int = DEFAULT_LIMIT) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": None,
        "error": {
            "code": -32600,
            "message": "Invalid Request",
            "data": f"batch of {entries} entries is over the limit of {limit}",
        },
    }


def calls(count: int, method: str = "test/item") -> list[dict[str, Any]]:
    return [rpc(index, method) for index in range(count)]


async def received(http: httpx.AsyncClient, url: str, connection_id: str, stream: SseReader) -> list[Any]:
    """The frames the wire agent received so far (`test/received`), parsed."""
    assert (await post(http, url, rpc("received", "test/received"), connection_id)).status_code == 202
    reply = await stream.next()
    assert reply["id"] == "received", reply
    return [json.loads(frame) for frame in reply["result"]["frames"]]


# -- the limit (default 1000 entries) --------------------------------------------------------


@pytest.mark.parametrize("entries", [DEFAULT_LIMIT + 1, 5 * DEFAULT_LIMIT])
async def test_a_batch_over_the_limit_is_answered_on_the_connection_stream_and_never_reaches_the_agent(
    wire_server: DaphneServer | Cluster, http: httpx.AsyncClient, entries: int
) -> None:
    url = wire_server.url
    connection_id = await initialize(http, url)
    async with open_sse(http, url, connection_id) as stream:
        response = await post(http, url, calls(entries), connection_id)
        assert response.status_code == 202, response.text
        assert await stream.next() == refusal(entries)
        assert await received(http, url, connection_id, stream) == [INIT]  # nothing after initialize
        # A batch at the limit goes through whole.
        response = await post(http, url, calls(DEFAULT_LIMIT), connection_id)
        assert response.status_code == 202, response.text
        reply = await stream.next()
        assert [entry["id"] for entry in reply] == list(range(DEFAULT_LIMIT))
        assert await received(http, url, connection_id, stream) == [INIT, calls(DEFAULT_LIMIT)]
    await http.delete(url, headers={"Acp-Connection-Id": connection_id})


async def test_a_batch_over_the_limit_without_a_connection_is_answered_like_a_rejected_initialize(
    wire_server: DaphneServer | Cluster, http: httpx.AsyncClient
) -> None:
    batch = [INIT, *calls(DEFAULT_LIMIT)]
    response = await post(http, wire_server.url, batch)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert "acp-connection-id" not in response.headers
    assert response.json() == refusal(DEFAULT_LIMIT + 1)


async def test_a_batch_over_the_limit_for_an_unknown_connection_is_404(
    wire_server: DaphneServer | Cluster, http: httpx.AsyncClient
) -> None:
    response = await post(http, wire_server.url, calls(DEFAULT_LIMIT + 1), f"{uuid.uuid4()}.000000000000")
    assert response.status_code == 404


async def test_a_batch_over_the_limit_on_a_websocket_is_answered_on_the_socket(
    wire_server: DaphneServer | Cluster,
) -> None:
    async with connect(wire_server.ws_url, proxy=None, compression=None, max_size=None) as ws:
        await asyncio.wait_for(ws.send(json.dumps([notification("test/note")] * (DEFAULT_LIMIT + 1))), TIMEOUT)
        assert json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT)) == refusal(DEFAULT_LIMIT + 1)
        await ws.send(json.dumps(rpc("received", "test/received")))
        reply = json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))
        assert reply == {"jsonrpc": "2.0", "id": "received", "result": {"frames": []}}


async def test_the_demo_agent_keeps_working_after_a_refused_batch(
    demo_server: DaphneServer | Cluster, http: httpx.AsyncClient
) -> None:
    url = demo_server.url
    connection_id = await initialize(http, url)
    async with open_sse(http, url, connection_id) as stream:
        new_sessions = [rpc(index, "session/new", {"cwd": "/tmp", "mcpServers": []}) for index in range(1001)]
        assert (await post(http, url, new_sessions, connection_id)).status_code == 202
        assert await stream.next() == refusal(1001)
        assert (await post(http, url, rpc("after", "session/list", {}), connection_id)).status_code == 202
        assert await stream.next() == {"jsonrpc": "2.0", "id": "after", "result": {"sessions": []}}  # none created
        assert (await post(http, url, new_sessions[0], connection_id)).status_code == 202
        assert "sessionId" in (await stream.next())["result"]
    await http.delete(url, headers={"Acp-Connection-Id": connection_id})


# -- a big batch the limit allows ------------------------------------------------------------


@pytest.fixture(scope="module")
def big_batch_server() -> Iterator[DaphneServer]:
    """The demo agent with room for one 50,000-request batch (its pending requests and its
    grouped reply included)."""
    server = DaphneServer(
        env={
            "ACP_MAX_BATCH_ENTRIES": str(BIG_BATCH),
            "ACP_MAX_PENDING_REQUESTS": str(BIG_BATCH),
            "ACP_MAX_BUFFERED_BYTES": str(64 * 1024 * 1024),
        }
    ).start()
    yield server
    server.stop()


@pytest.fixture
async def slow_http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0)) as client:
        yield client


async def test_a_big_batch_does_not_stall_other_clients(
    big_batch_server: DaphneServer, slow_http: httpx.AsyncClient
) -> None:
    url = big_batch_server.url
    loop = asyncio.get_running_loop()
    body = orjson.dumps([rpc(index, "session/list", {}) for index in range(BIG_BATCH)])
    assert len(body) <= 16 * 1024 * 1024
    connection_id = await initialize(slow_http, url)
    async with open_sse(slow_http, url, connection_id) as stream, httpx.AsyncClient(timeout=300.0) as other:
        started = loop.time()
        posting = asyncio.create_task(post(slow_http, url, body, connection_id))
        grouped_reply = asyncio.create_task(stream.next(timeout=300.0))
        # Another client initializes (and ends that connection) again and again until the
        # batch's grouped reply arrives; each request's latency counts, the DELETE's too.
        latencies: list[float] = []
        while not grouped_reply.done():
            sent = loop.time()
            connecting = asyncio.create_task(initialize(other, url))
            await asyncio.wait({connecting, grouped_reply}, return_when=asyncio.FIRST_COMPLETED)
            other_id = await connecting  # one that overlaps the reply is not counted
            if not grouped_reply.done():
                latencies.append(loop.time() - sent)
            sent = loop.time()
            deleting = asyncio.create_task(other.delete(url, headers={"Acp-Connection-Id": other_id}))
            await asyncio.wait({deleting, grouped_reply}, return_when=asyncio.FIRST_COMPLETED)
            assert (await deleting).status_code == 202
            if not grouped_reply.done():
                latencies.append(loop.time() - sent)
        reply = await grouped_reply
        batch_seconds = loop.time() - started
        assert (await posting).status_code == 202
    assert [entry["id"] for entry in reply] == list(range(BIG_BATCH))
    # Several requests completed while the batch was processed, each in a small part of its time.
    assert len(latencies) >= 6, (latencies, batch_seconds)
    assert max(latencies) < 0.25 * batch_seconds, (max(latencies), batch_seconds, latencies)
    await slow_http.delete(url, headers={"Acp-Connection-Id": connection_id})
    assert big_batch_server.errors() == []
