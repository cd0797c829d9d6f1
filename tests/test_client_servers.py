"""HttpClient against real servers, over HTTP+SSE and WebSocket: ours (daphne, demo agent), the
official TypeScript SDK server (Node, a small agent with the same commands), and the official
Python SDK server (uvicorn, demo agent). The `acp` SDK's client side runs on top of it, connected
in one line: `acp.connect_to_agent(client, HttpClient(url))`.

Also on our server: raw frames (batches both ways, malformed agent output) and 16 MiB messages
both ways."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import acp
import httpx
import pytest
from acp.interfaces import Client
from acp.schema import (
    AgentMessageChunk,
    AllowedOutcome,
    PermissionOption,
    RequestPermissionResponse,
    TextContentBlock,
    ToolCallProgress,
    ToolCallStart,
    ToolCallUpdate,
)

from acp_channels.client import HttpClient
from tests.live import DaphneServer
from tests.peers.fixtures import py_sdk_server, ts_server
from tests.peers.process import PeerServer

__all__ = ["py_sdk_server", "ts_server"]  # fixtures

pytestmark = pytest.mark.timeout(60)
STEP = 20.0


@dataclass
class RecordingClient:
    """The client side of the SDK: records updates and allows every permission request."""

    texts: list[str] = field(default_factory=list)
    tool_statuses: list[str] = field(default_factory=list)
    permissions: list[list[str]] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        if isinstance(update, AgentMessageChunk) and isinstance(update.content, TextContentBlock):
            self.texts.append(update.content.text)
        elif isinstance(update, ToolCallStart | ToolCallProgress) and update.status:
            self.tool_statuses.append(update.status)
        self.arrived.set()

    async def settle(self, texts: int, statuses: int = 0) -> None:
        """The SDK handles each notification in a task of its own, so the prompt's reply can
        overtake updates that arrived just before it (in one read): wait for them."""
        while len(self.texts) < texts or len(self.tool_statuses) < statuses:
            self.arrived.clear()
            await self.arrived.wait()

    async def request_permission(
        self, session_id: str, tool_call: ToolCallUpdate, options: list[PermissionOption], **kwargs: Any
    ) -> RequestPermissionResponse:
        self.permissions.append([option.option_id for option in options])
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id="allow"))

    def take(self) -> list[str]:
        taken, self.texts = self.texts, []
        return taken


class WatchedClient(HttpClient):
    """HttpClient noting each method the transport has accepted (HTTP 2xx / frame written)."""

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self.sent: list[str] = []
        self._sent_changed = asyncio.Event()

    async def send(self, message: Any) -> None:
        await super().send(message)
        if isinstance(message, dict) and "method" in message:
            self.sent.append(message["method"])
            self._sent_changed.set()

    async def wait_sent(self, method: str, count: int) -> None:
        while self.sent.count(method) < count:
            self._sent_changed.clear()
            await self._sent_changed.wait()


async def step(awaitable: Any) -> Any:
    async with asyncio.timeout(STEP):
        return await awaitable


async def first_turns(
    conn: Any, recorder: RecordingClient, tmp_path: Path, greeting: str
) -> tuple[str, Callable[[str], Awaitable[str]]]:
    """initialize, session/new, an echo of `greeting`, a stream of 20 chunks of 32 characters,
    each checked; returns the session id and `prompt(text) -> stop reason` on it."""
    init = await step(conn.initialize(protocol_version=1))
    assert init.protocol_version == 1
    session = await step(conn.new_session(cwd=str(tmp_path), mcp_servers=[]))
    sid: str = session.session_id

    async def prompt(text: str) -> str:
        response = await step(conn.prompt(session_id=sid, prompt=[acp.text_block(text)]))
        return str(response.stop_reason)

    assert await prompt(f"echo {greeting}") == "end_turn"
    await step(recorder.settle(1))
    assert recorder.take() == [greeting]

    assert await prompt("stream 20 32") == "end_turn"
    await step(recorder.settle(20))
    chunks = recorder.take()
    assert len(chunks) == 20 and all(len(chunk) == 32 for chunk in chunks)
    assert [int(re.match(r"\d+", chunk).group()) for chunk in chunks] == list(range(20))  # type: ignore[union-attr]
    return sid, prompt


async def run_scenario(url: str, tmp_path: Path) -> WatchedClient:
    """initialize, session/new, then prompts: echo, stream, tool_calls, permission, fail,
    wait_for_cancel + session/cancel; then close."""
    recorder = RecordingClient()
    transport = WatchedClient(url, timeout=10)
    conn = acp.connect_to_agent(cast(Client, recorder), transport)
    try:
        sid, prompt = await first_turns(conn, recorder, tmp_path, "hello over the wire")

        assert await prompt("tool_calls") == "end_turn"
        await step(recorder.settle(1, statuses=3))
        assert recorder.tool_statuses == ["pending", "in_progress", "completed"]
        assert recorder.take() == ["tool call completed"]

        assert await prompt("permission") == "end_turn"
        assert recorder.permissions == [["allow", "reject"]]
        await step(recorder.settle(1))
        assert recorder.take() == ["permission: allow"]

        with pytest.raises(acp.RequestError) as failed:
            await prompt("fail")
        assert failed.value.code == -32603

        waiting = asyncio.ensure_future(prompt("wait_for_cancel"))
        await step(transport.wait_sent("session/prompt", 6))  # the server has the prompt
        await step(conn.cancel(session_id=sid))
        assert await waiting == "cancelled"
        assert transport.error is None
    finally:
        await step(conn.close())
    assert transport.closed and transport.error is None
    return transport


async def assert_deleted(transport: HttpClient) -> None:
    """The connection is gone on the server: a DELETE with its id gets 404."""
    assert transport.connection_id
    async with httpx.AsyncClient(timeout=10) as http:
        response = await http.delete(transport.url, headers={"Acp-Connection-Id": transport.connection_id})
    assert response.status_code == 404


# --------------------------------------------------------------------------------- servers


@pytest.mark.parametrize("scheme", ["http", "ws"])
async def test_our_server(demo_server: DaphneServer, scheme: str, tmp_path: Path) -> None:
    transport = await run_scenario(f"{scheme}://127.0.0.1:{demo_server.port}", tmp_path)
    assert transport.connection_id  # WebSocket too: our 101 carries acp-connection-id
    if scheme == "http":
        await assert_deleted(transport)
    assert not demo_server.errors()


@pytest.mark.parametrize("scheme", ["http", "ws"])
async def test_official_typescript_sdk_server(ts_server: PeerServer, scheme: str, tmp_path: Path) -> None:
    transport = await run_scenario(f"{scheme}://127.0.0.1:{ts_server.port}/acp", tmp_path)
    assert transport.connection_id
    if scheme == "http":
        await assert_deleted(transport)


@pytest.mark.parametrize("scheme", ["http", "ws"])
async def test_official_python_sdk_server(py_sdk_server: PeerServer, scheme: str, tmp_path: Path) -> None:
    transport = await run_scenario(f"{scheme}://127.0.0.1:{py_sdk_server.port}", tmp_path)
    assert transport.connection_id
    if scheme == "http":
        await assert_deleted(transport)


# ---------------------------------------------------------------------- raw frames, ours


INIT: dict[str, Any] = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}


@pytest.mark.parametrize("scheme", ["http", "ws"])
async def test_frames_batches_and_malformed_output(wire_server: DaphneServer, scheme: str) -> None:
    async with HttpClient(f"{scheme}://127.0.0.1:{wire_server.port}/acp", timeout=10) as client:
        await step(client.send(INIT))
        assert (await step(client.receive_frame()))["id"] == 0

        batch = [
            {"jsonrpc": "2.0", "id": 1, "method": "x/a", "params": {"n": 1}},
            {"jsonrpc": "2.0", "id": 2, "method": "x/b"},
        ]
        await step(client.send(batch))
        grouped = await step(client.receive_frame())
        assert isinstance(grouped, list) and [reply["id"] for reply in grouped] == [1, 2]
        assert grouped[0]["result"] == {"method": "x/a", "params": {"n": 1}}

        emitted = ["{not json", '{"jsonrpc":"2.0","method":"x/after","params":{}}']
        await step(client.send({"jsonrpc": "2.0", "id": 3, "method": "test/emit", "params": {"frames": emitted}}))
        assert (await step(client.receive()))["error"] == {
            "code": -32700,
            "message": "Parse error",
            "data": {"line": "{not json"},
        }
        assert (await step(client.receive()))["method"] == "x/after"
        assert (await step(client.receive())) == {"jsonrpc": "2.0", "id": 3, "result": {"ok": True}}
        assert client.error is None
    assert await step(client.receive()) is None


@pytest.mark.parametrize("scheme", ["http", "ws"])
async def test_sixteen_mebibyte_messages_both_ways(demo_server: DaphneServer, scheme: str, tmp_path: Path) -> None:
    recorder = RecordingClient()
    transport = HttpClient(f"{scheme}://127.0.0.1:{demo_server.port}", timeout=30)
    conn = acp.connect_to_agent(cast(Client, recorder), transport)
    text = "0123456789abcdef" * (1024 * 1024 - 64)  # 16 MiB less 1 KiB: the body limit is 16 MiB
    try:
        await step(conn.initialize(protocol_version=1))
        session = await step(conn.new_session(cwd=str(tmp_path), mcp_servers=[]))
        response = await step(conn.prompt(session_id=session.session_id, prompt=[acp.text_block("echo " + text)]))
        assert response.stop_reason == "end_turn"
        assert len(recorder.texts) == 1 and recorder.texts[0] == text
    finally:
        await step(conn.close())
