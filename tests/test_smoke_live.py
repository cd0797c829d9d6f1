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


async def test_cancel_request_cancels_a_running_prompt(demo_server: DaphneServer, http: httpx.AsyncClient) -> None:
    """`$/cancel_request` (which the Python SDK alone ignores) cancels the agent's handler: the
    prompt is answered -32800, and the session keeps working."""
    url = demo_server.url
    connection_id = await initialize(http, url)
    async with open_sse(http, url, connection_id) as connection_stream:
        await post(http, url, rpc(1, "session/new", {"cwd": "/tmp", "mcpServers": []}), connection_id)
        session_id = (await connection_stream.next())["result"]["sessionId"]
        async with open_sse(http, url, connection_id, session_id) as session_stream:
            waiting = {"prompt": [{"type": "text", "text": "wait_for_cancel"}]}
            assert (
                await post(http, url, rpc(7, "session/prompt", waiting), connection_id, session_id)
            ).status_code == 202
            cancel = {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 7}}
            assert (await post(http, url, cancel, connection_id, session_id)).status_code == 202
            reply = await session_stream.next()
            assert reply["id"] == 7 and reply["error"]["code"] == -32800
            echo = {"prompt": [{"type": "text", "text": "echo still here"}]}
            await post(http, url, rpc(8, "session/prompt", echo), connection_id, session_id)
            assert (await session_stream.next())["params"]["update"]["content"]["text"] == "still here"
            assert (await session_stream.next())["id"] == 8
    await http.delete(url, headers={"Acp-Connection-Id": connection_id})
