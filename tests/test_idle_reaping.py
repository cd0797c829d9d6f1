"""IDLE_TIMEOUT_SECONDS: a connection with no POST and no stream reader is ended; one with a
reader is kept."""

from __future__ import annotations

import asyncio

import httpx

from tests.live import SSE, DaphneServer, initialize, open_sse, post, rpc


async def test_idle_connection_is_ended_and_a_read_one_is_kept(http: httpx.AsyncClient) -> None:
    env = {"ACP_AGENT": "tests.wire_agent.create", "ACP_IDLE_TIMEOUT_SECONDS": "1", "ACP_DETACHED_SECONDS": "0"}
    server = DaphneServer(env=env).start()
    try:
        watched = await initialize(http, server.url)
        abandoned = await initialize(http, server.url)
        async with open_sse(http, server.url, watched) as reader:
            probe = {**SSE, "Acp-Connection-Id": abandoned}
            for _ in range(100):  # the reaper sweeps every 0.5 s; bounded wait for its verdict
                status = (await http.head(server.url, headers=probe)).status_code  # HEAD is not activity
                if status == 404:
                    break
                await asyncio.sleep(0.1)
            assert status == 404
            assert (await post(http, server.url, rpc(2, "custom/ping"), watched)).status_code == 202
            assert (await reader.next())["id"] == 2
        assert not server.errors()
    finally:
        server.stop()
