"""The README's curl session, over the wire against the demo agent."""

from __future__ import annotations

import httpx

from tests.live import DaphneServer, initialize, open_sse, post, rpc


async def test_initialize_session_prompt_delete(demo_server: DaphneServer, http: httpx.AsyncClient) -> None:
    url = demo_server.url
    connection_id = await initialize(http, url)
    async with open_sse(http, url, connection_id) as connection_stream:
        response = await post(http, url, rpc(1, "session/new", {"cwd": "/tmp", "mcpServers": []}), connection_id)
        assert response.status_code == 202
        reply = await connection_stream.next()
        session_id = reply["result"]["sessionId"]
        async with open_sse(http, url, connection_id, session_id) as session_stream:
            prompt = {"prompt": [{"type": "text", "text": "stream 3 10"}]}
            response = await post(http, url, rpc(2, "session/prompt", prompt), connection_id, session_id)
            assert response.status_code == 202
            chunks = [await session_stream.next() for _ in range(3)]
            assert [c["params"]["update"]["content"]["text"] for c in chunks] == [
                "0:xxxxxxxx",
                "1:xxxxxxxx",
                "2:xxxxxxxx",
            ]
            assert (await session_stream.next()) == {"jsonrpc": "2.0", "id": 2, "result": {"stopReason": "end_turn"}}
            response = await http.delete(url, headers={"Acp-Connection-Id": connection_id})
            assert response.status_code == 202
            await session_stream.wait_ended()
            await connection_stream.wait_ended()
    response = await http.delete(url, headers={"Acp-Connection-Id": connection_id})
    assert response.status_code == 404
