"""Log levels that fit who caused what (acp_channels/logs.py): refusals a client caused (401,
404, 409, 503 at the connection cap) are logged at INFO by Django's request logger, never at
WARNING or ERROR; before, a burst at the cap logged one ERROR line per refused initialize."""

from __future__ import annotations

import re

import httpx

from tests.live import JSON, SSE, DaphneServer, initialize, open_sse, rpc

TOKEN = "log-levels-token"


def loud_lines(server: DaphneServer) -> list[str]:
    """Log lines at WARNING or above about a response (Django names the status and the path)."""
    return [line for line in server.log if re.search(r"\b(WARNING|ERROR|CRITICAL)\b", line) and "/acp" in line]


async def test_refusals_a_client_caused_are_info() -> None:
    server = DaphneServer(env={"ACP_MAX_CONNECTIONS": "1", "ACP_TOKEN": TOKEN}).start()
    try:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(timeout=httpx.Timeout(10.0), headers=auth) as http:
            connection_id = await initialize(http, server.url)
            statuses = set()
            for _ in range(20):  # a burst at the cap
                response = await http.post(server.url, headers=JSON, json=rpc(0, "initialize", {"protocolVersion": 1}))
                statuses.add(response.status_code)
            unauthenticated = await httpx.AsyncClient().post(server.url, headers=JSON, json=rpc(0, "initialize"))
            statuses.add(unauthenticated.status_code)
            unknown = await http.get(server.url, headers={**SSE, "Acp-Connection-Id": "no-such-connection"})
            statuses.add(unknown.status_code)
            async with open_sse(http, server.url, connection_id):
                taken = await http.get(server.url, headers={**SSE, "Acp-Connection-Id": connection_id})
                statuses.add(taken.status_code)
    finally:
        server.stop()
    assert statuses == {503, 401, 404, 409}
    logged = [line for line in server.log if "Service Unavailable: /acp" in line]
    assert len(logged) == 20 and all(" INFO " in line for line in logged), logged[:3]
    assert loud_lines(server) == []
