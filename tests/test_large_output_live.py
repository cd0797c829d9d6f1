"""Large agent messages against a client that does not read: the server's memory is bounded by
the budgets, not by chunk size x count (issue: four non-reading connections prompting
`stream 50 15000000` grew one daphne by 5.9 GB, with up to 64 frames of any size queued in each
SDK agent's outbox outside the budget).

Live, on one daphne process with the demo (SDK) agent: four connections at once, each with a
session stream (SSE) or a WebSocket that never reads (4 KiB receive buffer), each prompting
`stream 60 3000000` (180 MB offered per connection, chunks under the 8 MiB budget). The peak
RSS growth must stay within the four budgets plus the chunk each agent is handing over (a
small multiple of it: the agent's string, the SDK's model, our serialization) and a fixed
slack; the exact figures are in bench/ (bench/ADVERSARIAL-LARGE.md). And a chunk over the
largest message allowed is refused with a notice in its place, the turn still ending.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterator

import httpx
import pytest

from acp_channels import _protocol as protocol
from tests.cluster import Cluster, RedisServer
from tests.live import (
    DaphneServer,
    RawConnection,
    RawSse,
    RawWebSocket,
    initialize,
    memory,
    open_sse,
    post,
    reset_peak_memory,
    rpc,
)

MiB = 1024 * 1024
BUDGET = 8 * MiB
CHUNK = 3_000_000
CHUNKS = 60
CONNECTIONS = 4
#: What a paused connection may hold besides its budget: the chunk being handed over, in a few
#: copies (the agent's text, the SDK's model and dict, the serialized frame, an SSE event).
PER_CONNECTION = BUDGET + 5 * CHUNK
#: Allocator slack, the server's socket buffers and everything the first requests warm up.
SLACK = 64 * MiB
RECEIVE_BUFFER = 4096
#: A 1 MiB body limit: an agent message over the budget (8 MiB) is then over the largest allowed.
ENV = {"ACP_MAX_BUFFERED_BYTES": str(BUDGET), "ACP_KEEPALIVE_SECONDS": "60", "ACP_MAX_BODY_BYTES": str(MiB)}


@pytest.fixture
def server() -> Iterator[DaphneServer]:
    """A fresh process per test: its peak memory is what is measured."""
    started = DaphneServer(env=ENV).start()
    yield started
    started.stop()


def prompt(request_id: int, session_id: str, text: str) -> dict[str, object]:
    return rpc(request_id, "session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]})


async def http_session(http: httpx.AsyncClient, url: str) -> tuple[str, str]:
    connection_id = await initialize(http, url)
    async with open_sse(http, url, connection_id) as stream:
        response = await post(http, url, rpc(1, "session/new", {"cwd": "/tmp", "mcpServers": []}), connection_id)
        assert response.status_code == 202, response.text
        reply = await stream.next()
    return connection_id, reply["result"]["sessionId"]


async def websocket_session(port: int) -> tuple[RawWebSocket, str]:
    raw = await RawConnection.open(port, receive_buffer=RECEIVE_BUFFER)
    ws = await RawWebSocket.open(raw)
    await ws.send_text(json.dumps(rpc(0, "initialize", {"protocolVersion": 1})))
    assert json.loads(await ws.receive() or "null")["id"] == 0
    await ws.send_text(json.dumps(rpc(1, "session/new", {"cwd": "/tmp", "mcpServers": []})))
    reply = json.loads(await ws.receive() or "null")
    return ws, reply["result"]["sessionId"]


async def settled_peak(pid: int, deadline: float = 60.0) -> int:
    """The process's peak RSS once its RSS stops moving (within 1 MiB over 2 s): every agent
    is paused, or done. Polled: there is no event to await in another process."""
    samples: list[int] = []
    stop = time.monotonic() + deadline
    while time.monotonic() < stop:
        samples = [*samples[-7:], memory(pid)[0]]
        if len(samples) == 8 and max(samples) - min(samples) < MiB:
            return memory(pid)[1]
        await asyncio.sleep(0.25)
    raise AssertionError(f"the server's memory did not settle: {samples}")


async def measure(server: DaphneServer, attack: Callable[[], Awaitable[None]]) -> int:
    assert server.process is not None
    pid = server.process.pid
    before = memory(pid)[0]
    assert reset_peak_memory(pid)
    await attack()
    return await settled_peak(pid) - before


async def test_non_reading_sse_session_streams_hold_the_server_within_its_budgets(
    server: DaphneServer, http: httpx.AsyncClient
) -> None:
    url = server.url
    readers: list[RawConnection] = []
    sessions = [await http_session(http, url) for _ in range(CONNECTIONS)]

    async def attack() -> None:
        for connection_id, session_id in sessions:
            raw = await RawConnection.open(server.port, receive_buffer=RECEIVE_BUFFER)
            readers.append(raw)
            await RawSse.open(raw, connection_id, session_id=session_id)  # and never read
            response = await post(
                http, url, prompt(2, session_id, f"stream {CHUNKS} {CHUNK}"), connection_id, session_id
            )
            assert response.status_code == 202, response.text

    try:
        growth = await measure(server, attack)
    finally:
        for raw in readers:
            await raw.close()
    assert growth < CONNECTIONS * PER_CONNECTION + SLACK, f"the server grew by {growth / MiB:.0f} MiB"
    assert server.errors() == []


async def test_non_reading_websockets_hold_the_server_within_its_budgets(server: DaphneServer) -> None:
    sockets = [await websocket_session(server.port) for _ in range(CONNECTIONS)]

    async def attack() -> None:
        for ws, session_id in sockets:
            await ws.send_text(json.dumps(prompt(2, session_id, f"stream {CHUNKS} {CHUNK}")))  # and never read

    try:
        growth = await measure(server, attack)
    finally:
        for ws, _ in sockets:
            await ws.connection.close()
    assert growth < CONNECTIONS * PER_CONNECTION + SLACK, f"the server grew by {growth / MiB:.0f} MiB"
    assert server.errors() == []


def check_refused(events: list[dict[str, object]], session_id: str, chunks: int) -> None:
    """`chunks` notices in the chunks' place, then the turn's reply."""
    *notices, reply = events
    assert reply == {"jsonrpc": "2.0", "id": 2, "result": {"stopReason": "end_turn"}}, reply
    assert [notice["method"] for notice in notices] == [protocol.MESSAGE_TOO_LARGE_METHOD] * chunks
    for notice in notices:
        params = notice["params"]
        assert isinstance(params, dict)
        assert params["method"] == "session/update" and params["sessionId"] == session_id
        assert params["limit"] == BUDGET and params["size"] > BUDGET


async def test_a_chunk_over_the_largest_message_is_refused_over_sse(
    server: DaphneServer, http: httpx.AsyncClient
) -> None:
    connection_id, session_id = await http_session(http, server.url)
    async with open_sse(http, server.url, connection_id, session_id) as stream:
        response = await post(
            http, server.url, prompt(2, session_id, f"stream 3 {BUDGET + 1}"), connection_id, session_id
        )
        assert response.status_code == 202, response.text
        events = [await stream.next() for _ in range(4)]
    check_refused(events, session_id, 3)
    assert any("over the largest an agent may send" in line for line in server.log)
    assert server.errors() == []


async def test_a_chunk_over_the_largest_message_is_refused_over_websocket(server: DaphneServer) -> None:
    ws, session_id = await websocket_session(server.port)
    try:
        await ws.send_text(json.dumps(prompt(2, session_id, f"stream 3 {BUDGET + 1}")))
        events = [json.loads(await ws.receive() or "null") for _ in range(4)]
    finally:
        await ws.connection.close()
    check_refused(events, session_id, 3)
    assert server.errors() == []


async def test_a_non_reading_reader_on_another_worker_holds_both_workers_within_their_budgets(
    redis_server: RedisServer, http: httpx.AsyncClient
) -> None:
    """The host's worker holds the budget; the reader's worker what the host pushed ahead of
    its acknowledgements (bounded in bytes) and the socket's share."""
    cluster = Cluster(redis_server, size=2, env=ENV).start()
    host_worker, reader_worker = cluster.workers
    readers: list[RawConnection] = []
    try:
        sessions = [await http_session(http, host_worker.url) for _ in range(2)]
        pids = [worker.process.pid for worker in cluster.workers if worker.process is not None]
        before = [memory(pid)[0] for pid in pids]
        for pid in pids:
            assert reset_peak_memory(pid)
        for connection_id, session_id in sessions:
            raw = await RawConnection.open(reader_worker.port, receive_buffer=RECEIVE_BUFFER)
            readers.append(raw)
            await RawSse.open(raw, connection_id, session_id=session_id)  # and never read
            text = f"stream {CHUNKS} {CHUNK}"
            response = await post(http, host_worker.url, prompt(2, session_id, text), connection_id, session_id)
            assert response.status_code == 202, response.text
        growth = [await settled_peak(pid) - rss for pid, rss in zip(pids, before, strict=True)]
    finally:
        for raw in readers:
            await raw.close()
        cluster.stop()
    assert max(growth) < 2 * PER_CONNECTION + SLACK, [f"{size / MiB:.0f} MiB" for size in growth]
    assert cluster.errors() == []
