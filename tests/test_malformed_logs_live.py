"""Malformed and invalid messages cost at most one log line each, never a traceback and nothing
at ERROR, over both transports, against the demo's SDK agent (the official `acp` SDK logs a
traceback for every notification its schema rejects: before, 100 `session/cancel` without params
over WebSocket made 165 KB of ERROR lines). Every message tests/malformed.py knows (the fuzz
suite's fixed bodies among them) is sent REPEAT times. Over WebSocket a session method without
its session gets the JSON-RPC error HTTP's 400 stands for; nothing of it reaches the agent.

The log is another process's output, read by a thread: each test waits for the audit line of
its connection's end (written after every line its messages caused) before it counts."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect

from acp_channels import _protocol as protocol
from tests import malformed
from tests.live import DaphneServer, initialize, post, rpc, wait_for_line

REPEAT = 5  # each message this many times: a line per message at most, not a traceback each


@pytest.fixture(scope="module")
def server() -> Iterator[DaphneServer]:
    started = DaphneServer(env={}).start()
    yield started
    started.stop()


async def lines_until_ended(server: DaphneServer, start: int, connection_id: str) -> list[str]:
    """The log lines from `start` up to the audit line of the connection's end (excluded)."""
    ended = await wait_for_line(server, rf"connection ended .*connection={re.escape(connection_id)} ")
    lines = server.log[start:]
    return [line for line in lines[: lines.index(ended)] if line.strip()]


def assert_quiet(lines: list[str], messages: int) -> None:
    """No traceback, nothing at ERROR, at most one INFO or WARNING line per message."""
    assert not [line for line in lines if "Traceback" in line or re.search(r"\b(ERROR|CRITICAL)\b", line)], lines[:20]
    assert len(lines) <= messages, f"{len(lines)} log lines for {messages} messages: {lines[:20]}"


async def probe(ws: ClientConnection) -> list[Any]:
    """Everything the socket sends until the answer to a new request: every earlier message
    has been handled by then (a socket's messages reach the agent in order)."""
    await ws.send(json.dumps(rpc("probe", "session/new", {"cwd": "/tmp", "mcpServers": []})))
    received: list[Any] = []
    while True:
        message = json.loads(await ws.recv())
        if isinstance(message, dict) and message.get("id") == "probe" and "method" not in message:
            return received
        received.append(message)


async def test_over_websocket(server: DaphneServer) -> None:
    messages = malformed.over_websocket()
    async with connect(server.ws_url, proxy=None, max_size=None) as ws:
        assert ws.response is not None
        connection_id = ws.response.headers[protocol.CONNECTION_HEADER]
        await ws.send(json.dumps(rpc(0, "initialize", {"protocolVersion": 1})))
        assert json.loads(await ws.recv())["id"] == 0
        await probe(ws)
        start = len(server.log)
        for _ in range(REPEAT):
            for message in messages:
                await ws.send(message)
        answers = await probe(ws)
    lines = await lines_until_ended(server, start, connection_id)
    assert_quiet(lines, REPEAT * len(messages))
    flat = [entry for answer in answers for entry in (answer if isinstance(answer, list) else [answer])]
    refusals = [answer for answer in flat if isinstance(answer, dict) and "error" in answer]
    required = [refusal for refusal in refusals if refusal["error"]["message"] == protocol.SESSION_PARAM_REQUIRED]
    # session/cancel with no params, a number or an array for its session; session/prompt {};
    # and the batch (one error for its one request): refused here, as HTTP refuses them with 400.
    assert [refusal["id"] for refusal in required] == malformed.SESSION_REFUSALS * REPEAT
    assert all(refusal["error"]["code"] == -32602 for refusal in required)


async def test_over_http(server: DaphneServer, http: httpx.AsyncClient) -> None:
    connection_id = await initialize(http, server.url)
    start = len(server.log)
    statuses = []
    for _ in range(REPEAT):
        for body in malformed.ALL:
            response = await post(http, server.url, body, connection_id)
            statuses.append(response.status_code)
    await http.delete(server.url, headers={protocol.CONNECTION_HEADER: connection_id})
    assert set(statuses) <= {200, 202, 400, 429}, statuses  # 200: an initialize opens a connection
    # 400: a session method without its session (no Acp-Session-Id), and a body not UTF-8.
    assert statuses.count(400) == (len(malformed.SESSION_REFUSALS) + len(malformed.NOT_UTF8)) * REPEAT
    assert_quiet(await lines_until_ended(server, start, connection_id), REPEAT * len(malformed.ALL))
