"""Malformed and invalid messages cost at most one log line each, never a traceback, over both
transports, against the demo's SDK agent (the official `acp` SDK logs a traceback for every
notification its schema rejects: before, 100 `session/cancel` without params over WebSocket made
165 KB of ERROR lines). Over WebSocket a session method without its session gets the JSON-RPC
error HTTP's 400 stands for; nothing of it reaches the agent."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect

from acp_channels import protocol
from tests.live import DaphneServer, initialize, post, rpc

#: Every shape, valid JSON-RPC or not, that a session method or the SDK's schemas refuse.
SHAPES: list[Any] = [
    {"jsonrpc": "2.0", "method": "session/cancel"},
    {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": 5}},
    {"jsonrpc": "2.0", "method": "session/cancel", "params": [1, 2]},
    {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "s1", "_meta": 5}},
    {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "no-such-session"}},
    {"jsonrpc": "2.0", "id": 1, "method": "session/prompt", "params": {}},
    {"jsonrpc": "2.0", "id": 2, "method": "session/prompt", "params": {"sessionId": "nope", "prompt": 5}},
    {"jsonrpc": "2.0", "id": 3, "method": "session/new", "params": {"cwd": 5}},
    {"jsonrpc": "2.0", "id": 4, "method": "session/set_mode", "params": {"sessionId": "s1"}},
    {"jsonrpc": "2.0", "method": "session/update", "params": {}},
    {"jsonrpc": "2.0", "id": 5, "method": "fs/read_text_file", "params": {}},
    {"jsonrpc": "2.0", "id": 6, "result": {}},
    {"jsonrpc": "2.0", "id": 7, "error": {"code": "x"}},
    {"jsonrpc": "2.0", "id": 8, "method": "initialize", "params": {"protocolVersion": "x"}},
    {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {}},
    {"jsonrpc": "2.0", "method": "_proxy/successor", "params": 5},
    {"jsonrpc": "2.0", "method": "no/such/method", "params": {"x": 1}},
    {"jsonrpc": "2.0", "id": 9, "method": "no/such/method"},
    {"jsonrpc": "1.0", "id": 10, "method": "session/new"},
    {"jsonrpc": "2.0", "method": 5},
    [],
    [1, "x"],
    [{"jsonrpc": "2.0", "method": "session/cancel"}, {"jsonrpc": "2.0", "id": 11, "method": "session/prompt"}],
    "not json {",
]
REPEAT = 5  # each shape this many times: a line per message at most, not a traceback each


@pytest.fixture(scope="module")
def server() -> Iterator[DaphneServer]:
    started = DaphneServer(env={}).start()
    yield started
    started.stop()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(20.0)) as client:
        yield client


def text(shape: Any) -> str:
    return shape if isinstance(shape, str) else json.dumps(shape)


def new_lines(server: DaphneServer, start: int) -> list[str]:
    return [line for line in server.log[start:] if line.strip()]


def assert_quiet(lines: list[str], messages: int) -> None:
    """No traceback, nothing at ERROR, at most one INFO or WARNING line per message."""
    assert not [line for line in lines if "Traceback" in line or re.search(r"\b(ERROR|CRITICAL)\b", line)], lines[:20]
    assert len(lines) <= messages, f"{len(lines)} log lines for {messages} messages: {lines[:20]}"


async def probe(ws: ClientConnection) -> list[Any]:
    """Everything the socket sends until the answer to a new request: every earlier message
    has been handled by then (a socket's messages reach the agent in order)."""
    await ws.send(json.dumps(rpc("probe", "session/new", {"cwd": "/tmp", "mcpServers": []})))
    received = []
    while True:
        message = json.loads(await ws.recv())
        if isinstance(message, dict) and message.get("id") == "probe" and "method" not in message:
            return received
        received.append(message)


async def test_over_websocket(server: DaphneServer) -> None:
    async with connect(server.ws_url, proxy=None) as ws:
        await ws.send(json.dumps(rpc(0, "initialize", {"protocolVersion": 1})))
        assert json.loads(await ws.recv())["id"] == 0
        await probe(ws)
        start = len(server.log)
        for _ in range(REPEAT):
            for shape in SHAPES:
                await ws.send(text(shape))
        answers = await probe(ws)
    lines = new_lines(server, start)
    assert_quiet(lines, REPEAT * len(SHAPES))
    flat = [entry for answer in answers for entry in (answer if isinstance(answer, list) else [answer])]
    refusals = [answer for answer in flat if isinstance(answer, dict) and "error" in answer]
    required = [
        refusal for refusal in refusals if refusal["error"]["message"] == protocol.SESSION_PARAM_REQUIRED
    ]
    # session/cancel with no params, a number or an array for its session; session/prompt {};
    # and the batch (one error for its one request): refused here, as HTTP refuses them with 400.
    assert [refusal["id"] for refusal in required[:5]] == [None, None, None, 1, 11]
    assert len(required) == 5 * REPEAT
    assert all(refusal["error"]["code"] == -32602 for refusal in required)


async def test_over_http(server: DaphneServer, http: httpx.AsyncClient) -> None:
    connection_id = await initialize(http, server.url)
    start = len(server.log)
    statuses = []
    for _ in range(REPEAT):
        for shape in SHAPES:
            response = await post(http, server.url, text(shape), connection_id)
            statuses.append(response.status_code)
    await http.delete(server.url, headers={"Acp-Connection-Id": connection_id})
    assert set(statuses) <= {200, 202, 400, 429}, statuses  # 200: an initialize opens a connection
    lines = [line for line in new_lines(server, start) if "acp_channels.audit" not in line]
    assert_quiet(lines, REPEAT * len(SHAPES))
