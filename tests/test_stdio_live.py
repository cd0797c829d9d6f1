"""Stdio agents behind a real daphne: one process per connection, over HTTP and WebSocket.

- the demo agent (written with the official Python SDK) as a subprocess, driven by both official
  SDK clients (tests/interop drivers);
- a published third-party agent, @zed-industries/claude-code-acp (pinned in tests/agents), driven
  by the official Python SDK client as far as it goes offline: initialize, its auth method,
  session/new;
- a crash mid-prompt, a hang, WebSocket close, server shutdown, and 50 concurrent connections
  each with its own process (tests/stdio_script_agent.py).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from acp import RequestError, connect_to_agent
from acp.http import create_http_stream
from acp.schema import ClientCapabilities, FileSystemCapabilities

from tests.agent_processes import alive, running_agents, supported, wait_gone
from tests.live import JSON, DaphneServer, open_sse, post, rpc
from tests.test_interop import run_driver

pytestmark = pytest.mark.skipif(not supported(), reason="process checks read /proc (Linux)")

ROOT = Path(__file__).resolve().parent.parent
SCRIPT_AGENT = [sys.executable, str(ROOT / "tests" / "stdio_script_agent.py")]
GRACE = "0.3"


def script_server(**env: str) -> DaphneServer:
    return DaphneServer(
        env={"ACP_AGENT": json.dumps({"command": SCRIPT_AGENT}), "ACP_AGENT_SHUTDOWN_GRACE": GRACE, **env}
    ).start()


@pytest.fixture(scope="module")
def server() -> Iterator[DaphneServer]:
    """daphne whose agent is tests/stdio_script_agent.py, one process per connection."""
    server = script_server()
    yield server
    server.stop()


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    limits = httpx.Limits(max_connections=500, max_keepalive_connections=100)
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0), limits=limits) as client:
        yield client


async def connect(client: httpx.AsyncClient, url: str, **options: Any) -> tuple[str, int]:
    """initialize; the connection id and the pid of its agent process."""
    params = {"protocolVersion": 1, "_meta": options}
    response = await client.post(url, headers=JSON, json=rpc(0, "initialize", params))
    assert response.status_code == 200, response.text
    return response.headers["acp-connection-id"], response.json()["result"]["_meta"]["pid"]


def prompt(request_id: Any, text: str, session_id: str = "s1") -> dict[str, Any]:
    return rpc(request_id, "session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]})


def logged(server: DaphneServer, text: str) -> list[str]:
    """The log lines with `text` (each once, whatever the number of log handlers)."""
    return list(dict.fromkeys(line.partition("agent for connection")[2] or line for line in server.log if text in line))


def wait_logged(server: DaphneServer, text: str, count: int = 1, timeout: float = 10.0) -> list[str]:
    """The log lines with `text` once there are `count` of them (the log arrives through a pipe:
    a bounded poll)."""
    deadline = time.monotonic() + timeout
    while len(lines := logged(server, text)) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    return lines


# -- the official SDK clients and a stdio agent written with the official Python SDK -----------


@pytest.fixture(scope="module")
def subprocess_demo_server() -> Iterator[DaphneServer]:
    server = DaphneServer(env={"ACP_DEMO_AGENT": "subprocess"}).start()
    yield server
    server.stop()


@pytest.mark.parametrize("transport", ["http", "ws"])
@pytest.mark.parametrize("client_sdk", ["typescript", "python"])
def test_official_clients_drive_the_demo_agent_as_a_subprocess(
    client_sdk: str, transport: str, subprocess_demo_server: DaphneServer
) -> None:
    server = subprocess_demo_server
    stopped_before = len(logged(server, "stopped: exit status 0"))
    summary = run_driver(client_sdk, server, transport)
    assert summary["ok"] is True
    assert (summary["chunks"], summary["order"], summary["streamStopReason"]) == (50, "indexed", "end_turn")
    assert (summary["permission"], summary["cancel"], summary["closed"]) == ("permission: allow", "cancelled", True)
    # The connection's own agent process ran it, and ended when the client closed (DELETE or
    # socket close): stdin closed, the SDK agent exited by itself.
    assert wait_gone(list(running_agents(server.process.pid if server.process else None)), 10) == []
    assert len(wait_logged(server, "stopped: exit status 0", stopped_before + 1)) == stopped_before + 1
    assert not server.errors()


# -- a published third-party agent -------------------------------------------------------------


class QuietClient:
    """The client side of the SDK connection: nothing is prompted, so nothing arrives."""

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        return None

    async def request_permission(self, *args: Any, **kwargs: Any) -> Any:
        raise RequestError(-32603, "not expected")


async def test_claude_code_acp_behind_the_server(claude_server: DaphneServer, tmp_path: Path) -> None:
    server = claude_server
    assert server.process is not None
    async with httpx.AsyncClient(http2=True, timeout=httpx.Timeout(None)) as http:
        conn = connect_to_agent(QuietClient(), create_http_stream(server.url, client=http))
        try:
            capabilities = ClientCapabilities(fs=FileSystemCapabilities(read_text_file=False, write_text_file=False))
            init = await asyncio.wait_for(conn.initialize(protocol_version=1, client_capabilities=capabilities), 30)
            assert init.protocol_version == 1
            assert init.agent_info is not None
            assert (init.agent_info.name, init.agent_info.version) == ("@zed-industries/claude-code-acp", "0.16.2")
            assert [method.id for method in init.auth_methods or []] == ["claude-login"]
            agents = running_agents(server.process.pid)
            assert any("claude-code-acp" in command for command in agents.values())

            # Its only auth method is "run `claude /login` in a terminal": over ACP it says no.
            with pytest.raises(RequestError) as refused:
                await asyncio.wait_for(conn.authenticate(method_id="claude-login"), 30)
            assert refused.value.code == -32603
            assert refused.value.data == {"details": "Method not implemented."}

            session = await asyncio.wait_for(conn.new_session(cwd=str(tmp_path), mcp_servers=[]), 60)
            assert session.session_id
            assert session.modes is not None and session.modes.current_mode_id == "default"
            # It started the Claude Code CLI for the session: a second process in the group.
            pids = list(running_agents(server.process.pid))
            assert len(pids) >= 2
        finally:
            await conn.close()  # DELETE
    # It keeps running when its stdin closes, so the grace (0.5 s) ends in SIGTERM to its group.
    assert wait_gone(pids, 10) == []
    assert wait_logged(server, "after stdin closed: SIGTERM")
    assert wait_logged(server, "stopped: signal SIGTERM")


# -- crash, hang, WebSocket close ----------------------------------------------------------------


async def test_a_crash_mid_prompt(server: DaphneServer, client: httpx.AsyncClient) -> None:
    url = server.url
    connection, pid = await connect(client, url)
    async with open_sse(client, url, connection) as connection_stream:
        assert (
            await post(client, url, rpc(1, "session/new", {"cwd": "/", "mcpServers": []}), connection)
        ).status_code == 202
        assert (await connection_stream.next())["result"] == {"sessionId": "s1"}
        async with open_sse(client, url, connection, "s1") as session_stream:
            assert (await post(client, url, prompt(2, "hang"), connection, "s1")).status_code == 202
            assert (await post(client, url, [rpc(3, "test/ignore")], connection)).status_code == 202
            assert (await post(client, url, prompt(4, "crash 3"), connection, "s1")).status_code == 202

            error = {"code": -32603, "message": "agent process exited with exit status 3"}
            assert [await session_stream.next(), await session_stream.next()] == [
                {"jsonrpc": "2.0", "id": 2, "error": error},
                {"jsonrpc": "2.0", "id": 4, "error": error},
            ]
            assert await connection_stream.next() == {"jsonrpc": "2.0", "id": 3, "error": error}
            await session_stream.wait_ended()
            await connection_stream.wait_ended()
    assert (await post(client, url, prompt(5, "echo hello?"), connection, "s1")).status_code == 404
    assert wait_gone([pid], 5) == []
    lines = wait_logged(server, f"agent for connection {connection} (pid {pid}) exited with exit status 3")
    assert len(lines) == 1 and "3 pending request(s) answered with an error" in lines[0]


async def test_delete_stops_a_hung_agent(server: DaphneServer, client: httpx.AsyncClient) -> None:
    url = server.url
    connection, pid = await connect(client, url, ignoreEof=True, ignoreTerm=True)
    assert (await post(client, url, prompt(1, "hang"), connection, "s1")).status_code == 202
    response = await client.delete(url, headers={"Acp-Connection-Id": connection})
    assert response.status_code == 202
    assert alive(pid)  # the 202 does not wait: the stop sequence (2 x 0.3 s here) runs after it
    assert wait_gone([pid], 10) == []
    assert wait_logged(server, f"agent for connection {connection} (pid {pid}) ignored SIGTERM for 0.3 s: SIGKILL")


async def test_closing_the_websocket_stops_the_agent(server: DaphneServer) -> None:
    async with websockets.connect(server.ws_url) as socket:
        await socket.send(json.dumps(rpc(0, "initialize", {"protocolVersion": 1})))
        pid = json.loads(await asyncio.wait_for(socket.recv(), 10))["result"]["_meta"]["pid"]
        assert running_agents(server.process.pid if server.process else None).keys() >= {pid}
    assert wait_gone([pid], 10) == []


# -- many connections, server shutdown -----------------------------------------------------------


async def test_fifty_concurrent_connections_each_with_its_own_process(
    server: DaphneServer, client: httpx.AsyncClient
) -> None:
    url = server.url

    async def converse(n: int) -> tuple[str, int]:
        connection, pid = await connect(client, url)
        async with open_sse(client, url, connection) as connection_stream:
            await post(client, url, rpc(1, "session/new", {"cwd": "/", "mcpServers": []}), connection)
            session_id = (await connection_stream.next(20))["result"]["sessionId"]
            async with open_sse(client, url, connection, session_id) as session_stream:
                await post(client, url, prompt(2, f"echo hello {n}", session_id), connection, session_id)
                update = await session_stream.next(20)
                assert update["params"]["update"]["content"]["text"] == f"hello {n}"
                assert (await session_stream.next(20))["result"] == {"stopReason": "end_turn"}
        return connection, pid

    conversations = await asyncio.gather(*(converse(n) for n in range(50)))
    pids = [pid for _, pid in conversations]
    assert len(set(pids)) == 50
    assert server.process is not None and set(running_agents(server.process.pid)) >= set(pids)
    deletes = await asyncio.gather(
        *(client.delete(url, headers={"Acp-Connection-Id": connection}) for connection, _ in conversations)
    )
    assert [response.status_code for response in deletes] == [202] * 50
    assert wait_gone(pids, 15) == []


async def test_server_shutdown_stops_every_agent(client: httpx.AsyncClient, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    server = script_server()
    try:
        agents = [await connect(client, server.url, ignoreEof=True, mark=str(marks)) for _ in range(3)]
    finally:
        server.stop()  # SIGTERM: daphne exits, its agents go with it
    assert wait_gone([pid for _, pid in agents], 10) == []
    # Each one had the whole sequence: stdin closed first, then SIGTERM.
    assert sorted(marks.read_text().split()) == ["eof"] * 3 + ["term"] * 3
