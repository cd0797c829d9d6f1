"""Failures on a live WebSocket under daphne are visible to the client and in the log.

- An agent message over daphne's `--websocket-max-message-size` closes the socket with 1009 and
  a reason naming both sizes; the agent's connection ends and a warning names it. Before, the
  writer task died with autobahn's PayloadExceededError: no reply, no close frame, no log line.
- Close codes servers send (1013 at the connection cap) reach the client: autobahn's `sendClose`
  refuses them, and the socket ended with 1011 and a traceback instead.
- A socket closed while the demo agent waits for a permission answer leaves no "Task exception
  was never retrieved" in the log.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from tests.live import JSON, MAX_MESSAGE, DaphneServer, RawConnection, RawWebSocket, rpc

TIMEOUT = 10.0
#: A small message limit for the server, so an over-limit message is cheap to make.
SOCKET_LIMIT = 64 * 1024


class SmallMessageDaphne(DaphneServer):
    """daphne with --websocket-max-message-size (and frame size) of SOCKET_LIMIT."""

    def command(self) -> tuple[list[str], Path, dict[str, str] | None]:
        argv, cwd, env = super().command()
        return [str(SOCKET_LIMIT) if arg == str(MAX_MESSAGE) else arg for arg in argv], cwd, env


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


async def receive(ws: ClientConnection) -> Any:
    return json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))


def open_ws(url: str) -> Any:
    return connect(url, proxy=None, compression=None, open_timeout=TIMEOUT, close_timeout=TIMEOUT, max_size=None)


async def wait_for_log(server: DaphneServer, text: str) -> list[str]:
    """The server's log lines containing `text`, once there is one (the log arrives through a
    pipe: no event to await, so poll with a deadline)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TIMEOUT
    while True:
        lines = [line for line in server.log if text in line]
        if lines or loop.time() > deadline:
            return lines
        await asyncio.sleep(0.05)


async def wait_until_unknown(http: httpx.AsyncClient, server: DaphneServer, connection_id: str) -> int:
    """POST to the connection until it answers 404 (it was ended) or the deadline passes; the
    last status. The close frame goes out before the agent is shut down, so poll."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TIMEOUT
    while True:
        response = await http.post(
            server.url, headers={**JSON, "Acp-Connection-Id": connection_id}, json={"jsonrpc": "2.0", "method": "x"}
        )
        if response.status_code == 404 or loop.time() > deadline:
            return response.status_code
        await asyncio.sleep(0.05)


# -- an agent message over the socket's limit ------------------------------------------------


@pytest.fixture(scope="module")
def small_message_server() -> Any:
    server = SmallMessageDaphne(env={"ACP_AGENT": "tests.wire_agent.create"}).start()
    yield server
    server.stop()


async def test_an_agent_message_over_the_limit_closes_the_socket_with_1009(
    small_message_server: DaphneServer, http: httpx.AsyncClient
) -> None:
    server = small_message_server
    since = len(server.log)
    # The wire agent echoes an unknown request as {"result": {"method", "params"}}: 11 bytes more
    # than the request, so a request just under the limit gets a reply just over it.
    padding = "x" * (SOCKET_LIMIT - len(compact(rpc(2, "big", {"pad": ""}))) - 1)
    request = compact(rpc(2, "big", {"pad": padding}))
    reply_size = len(compact({"jsonrpc": "2.0", "id": 2, "result": {"method": "big", "params": {"pad": padding}}}))
    assert len(request) < SOCKET_LIMIT < reply_size

    async with open_ws(server.ws_url) as bystander, open_ws(server.ws_url) as ws:
        connection_id = ws.response.headers["acp-connection-id"]
        await ws.send(compact(rpc(1, "small")))
        assert (await receive(ws))["id"] == 1
        await ws.send(request)
        with pytest.raises(ConnectionClosed) as closed:
            extra = await asyncio.wait_for(ws.recv(), TIMEOUT)
            pytest.fail(f"expected a close frame, got {extra[:100]!r}")
        assert closed.value.rcvd is not None
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (
            1009,
            f"agent message of {reply_size} bytes exceeds the socket's limit of {SOCKET_LIMIT}",
        )
        # Other sockets are unaffected.
        await bystander.send(compact(rpc(3, "still/here")))
        assert (await receive(bystander))["id"] == 3

    assert await wait_until_unknown(http, server, connection_id) == 404  # the agent's connection ended
    # (The demo's console handler and daphne's root handler both print it.)
    lines = await wait_for_log(server, connection_id)
    warnings = [line for line in lines if "WARNING" in line]
    assert warnings, lines
    assert all("exceeds the socket's limit" in line for line in warnings), warnings
    assert any("reason=send failed" in line for line in lines), lines  # the audit line of its end
    assert DaphneServer(log=server.log[since:]).errors() == []


# -- close codes a server sends ----------------------------------------------------------------


async def test_the_connection_cap_closes_with_1013_not_1011() -> None:
    server = DaphneServer(env={"ACP_AGENT": "tests.wire_agent.create", "ACP_MAX_CONNECTIONS": "1"}).start()
    try:
        async with open_ws(server.ws_url) as first:
            await first.send(compact(rpc(1, "hello")))
            assert (await receive(first))["id"] == 1
            async with open_ws(server.ws_url) as refused:
                with pytest.raises(ConnectionClosed) as closed:
                    await asyncio.wait_for(refused.recv(), TIMEOUT)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
    finally:
        server.stop()
    assert server.errors() == []


# -- a socket closed during a permission request -----------------------------------------------

UNRETRIEVED = "Task exception was never retrieved"


async def test_closing_during_a_permission_request_leaves_no_unretrieved_task_exception() -> None:
    server = DaphneServer().start()  # the demo agent
    try:
        async with open_ws(server.ws_url) as ws:
            await ws.send(compact(rpc(0, "initialize", {"protocolVersion": 1})))
            assert (await receive(ws))["id"] == 0
            await ws.send(compact(rpc(1, "session/new", {"cwd": "/", "mcpServers": []})))
            session_id = (await receive(ws))["result"]["sessionId"]
            prompt = {"sessionId": session_id, "prompt": [{"type": "text", "text": "permission"}]}
            await ws.send(compact(rpc(2, "session/prompt", prompt)))
            while (message := await receive(ws)).get("method") != "session/request_permission":
                pass
        # The socket is closed without an answer. Stopping the server (SIGTERM, drain, exit)
        # is the event after which everything the scenario logs has been logged.
    finally:
        server.stop()
    assert message["params"]["sessionId"] == session_id
    assert not [line for line in server.log if UNRETRIEVED in line], "".join(server.log)


# -- what the client sends wrong: a close code, not a reset ------------------------------------


async def close_code_after(server: DaphneServer, payload: bytes, opcode: int = 0x1) -> int:
    """Send one raw masked frame and read until the server's close frame: its code (a reset,
    before: ConnectionResetError)."""
    raw = await RawConnection.open(server.port)
    try:
        ws = await RawWebSocket.open(raw)
        await ws._send_frame(opcode, payload)
        first, second = await asyncio.wait_for(raw.reader.readexactly(2), TIMEOUT)
        assert first & 0x0F == 0x8, first  # a close frame, first thing back
        size = second & 0x7F
        body = await raw.reader.readexactly(size)
        code: int = int.from_bytes(body[:2], "big")
        return code
    finally:
        await raw.close()


async def test_a_text_message_that_is_not_utf8_closes_with_1007(small_message_server: DaphneServer) -> None:
    assert await close_code_after(small_message_server, b'\xff\xfe{"jsonrpc":"2.0"}') == 1007


async def test_a_message_over_the_size_limit_closes_with_1009(small_message_server: DaphneServer) -> None:
    """The client learns why: before, autobahn dropped TCP and a client still sending read a reset."""
    assert await close_code_after(small_message_server, b"x" * (SOCKET_LIMIT + 1)) == 1009
