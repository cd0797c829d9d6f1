"""An agent factory that raises: initialize gets a clear 500, a WebSocket is closed with 1011,
and the server keeps serving."""

from __future__ import annotations

import httpx
import pytest
import websockets

from tests.live import JSON, DaphneServer, rpc


async def test_a_failing_agent_factory_gives_clear_errors(http: httpx.AsyncClient) -> None:
    server = DaphneServer(env={"ACP_AGENT": "tests.wire_agent.broken"}).start()
    try:
        for _ in range(2):  # and again: nothing was left half-made
            response = await http.post(server.url, headers=JSON, json=rpc(0, "initialize", {"protocolVersion": 1}))
            assert (response.status_code, response.text) == (500, "the agent could not be started (see the server log)")
            assert "acp-connection-id" not in response.headers
        async with websockets.connect(server.ws_url) as socket:
            with pytest.raises(websockets.ConnectionClosedError) as closed:
                await socket.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1011
        assert any("this agent cannot start" in line for line in server.log)
    finally:
        server.stop()
