"""Backpressure reaches the socket: a client that stops reading pauses the agent instead of
growing the server, and once it reads again it gets everything, in order.

A raw SSE reader and a raw WebSocket client with a small receive buffer stop reading while the
wire agent floods ~130 MB (`test/flood`, emitting only as fast as the host takes its frames).
The server's resident memory must settle within MAX_BUFFERED_BYTES (1 MiB here) plus a fixed
slack, half the flood (before the fix, daphne grew by the whole flood), and the agent must
be observably paused: `test/flood_stats`, asked on another connection of the same process,
stops counting before the flood is through. Runs on daphne (one process: its memory is the one
measured), and the SSE case once under uvicorn, whose `send` waits on a paused transport itself.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from tests.live import (
    DaphneServer,
    RawConnection,
    RawSse,
    RawWebSocket,
    ServerProcess,
    UvicornServer,
    flood_counter,
    initialize,
    memory,
    post,
    rpc,
    settle_paused,
)

MiB = 1024 * 1024
BUFFERED_LIMIT = 1 * MiB
#: Room for what a paused connection legitimately holds besides its budget (the chunk in
#: flight, the transport's 64 KiB, allocator slack): half the flood.
SLACK = 64 * MiB
FRAME_SIZE = 64 * 1024
FRAMES = 2048  # about 130 MB of agent output: twice the slack, so a server that buffers it all fails
#: The client's kernel receive buffer: tiny, so the server's socket fills at once.
RECEIVE_BUFFER = 4096
ENV = {
    "ACP_AGENT": "tests.wire_agent.create",
    "ACP_MAX_BUFFERED_BYTES": str(BUFFERED_LIMIT),
    "ACP_REPLAY_WINDOW_BYTES": str(BUFFERED_LIMIT // 4),  # within the budget (check E031)
    "ACP_KEEPALIVE_SECONDS": "60",  # no comments in the stream while nobody reads
}


@pytest.fixture(scope="module")
def daphne_server() -> Iterator[DaphneServer]:
    server = DaphneServer(env=ENV).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def uvicorn_server() -> Iterator[UvicornServer]:
    server = UvicornServer(env=ENV).start()
    yield server
    server.stop()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(20.0)) as client:
        yield client


def check_flood(events: list[str]) -> None:
    """Every flood frame, once, in order, whole."""
    for n, text in enumerate(events):
        message = json.loads(text)
        assert message["method"] == "test/flooded" and message["params"]["n"] == n, (n, text[:80])
        assert len(message["params"]["pad"]) == FRAME_SIZE
    assert len(events) == FRAMES


async def sse_reader_that_stops_reading(server: ServerProcess, http: httpx.AsyncClient) -> None:
    assert server.process is not None
    url = f"http://127.0.0.1:{server.port}/acp"
    async with flood_counter(http, url) as taken:
        connection_id = await initialize(http, url)
        raw = await RawConnection.open(server.port, receive_buffer=RECEIVE_BUFFER)
        try:
            stream = await RawSse.open(raw, connection_id)
            before_flood = await taken()
            rss_before = memory(server.process.pid)[0]
            response = await post(
                http, url, rpc("flood", "test/flood", {"count": FRAMES, "size": FRAME_SIZE}), connection_id
            )
            assert response.status_code == 202, response.text
            frames_taken, rss = await settle_paused(server, taken, deadline=40.0)
            assert frames_taken - before_flood < FRAMES, "the agent was never paused"
            assert rss - rss_before < BUFFERED_LIMIT + SLACK, f"server grew by {(rss - rss_before) / MiB:.0f} MiB"

            assert json.loads(await stream.next_event() or "null") == {
                "jsonrpc": "2.0",
                "id": "flood",
                "result": {"ok": True},
            }
            events = [await stream.next_event() or "" for _ in range(FRAMES)]
            check_flood(events)
        finally:
            await raw.close()
            await http.delete(url, headers={"Acp-Connection-Id": connection_id})


async def test_sse_reader_that_stops_reading_pauses_the_agent_daphne(
    daphne_server: DaphneServer, http: httpx.AsyncClient
) -> None:
    await sse_reader_that_stops_reading(daphne_server, http)
    assert daphne_server.errors() == []


async def test_sse_reader_that_stops_reading_pauses_the_agent_uvicorn(
    uvicorn_server: UvicornServer, http: httpx.AsyncClient
) -> None:
    await sse_reader_that_stops_reading(uvicorn_server, http)


async def test_websocket_client_that_stops_reading_pauses_the_agent_daphne(
    daphne_server: DaphneServer, http: httpx.AsyncClient
) -> None:
    server = daphne_server
    assert server.process is not None
    async with flood_counter(http, server.url) as taken:
        raw = await RawConnection.open(server.port, receive_buffer=RECEIVE_BUFFER)
        try:
            ws = await RawWebSocket.open(raw)
            await ws.send_text(json.dumps(rpc(0, "initialize", {"protocolVersion": 1})))
            assert json.loads(await ws.receive() or "null")["id"] == 0
            before_flood = await taken()
            rss_before = memory(server.process.pid)[0]
            await ws.send_text(json.dumps(rpc("flood", "test/flood", {"count": FRAMES, "size": FRAME_SIZE})))
            frames_taken, rss = await settle_paused(server, taken, deadline=40.0)
            assert frames_taken - before_flood < FRAMES, "the agent was never paused"
            assert rss - rss_before < BUFFERED_LIMIT + SLACK, f"server grew by {(rss - rss_before) / MiB:.0f} MiB"

            assert json.loads(await ws.receive() or "null") == {"jsonrpc": "2.0", "id": "flood", "result": {"ok": True}}
            events = [await ws.receive() or "" for _ in range(FRAMES)]
            check_flood(events)
        finally:
            await raw.close()
    assert server.errors() == []
