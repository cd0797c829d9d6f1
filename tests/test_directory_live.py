"""The session directory on a live server (one worker, three behind a balancer, and two web
workers with two runners): a
principal's running turn is listed with its session, agent and attachments, and ends listed
as idle; another principal sees none of it; the initialize result says where the directory is;
anything but GET is 405; no credentials is 401 (docs/shared-sessions.md)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect

from tests import auth_fixtures as tokens
from tests.cluster import Cluster
from tests.conftest import SHAPES
from tests.live import JSON, DaphneServer, open_sse, post, rpc
from tests.token_servers import RUNNERS, bearer, start_token_server


@pytest.fixture(scope="module", params=[*SHAPES, RUNNERS])
def server(request: pytest.FixtureRequest) -> Iterator[DaphneServer | Cluster]:
    live = start_token_server(request, request.param)
    yield live
    live.stop()
    assert live.errors() == []


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    # A new TCP connection per request: through the balancer, requests land on different workers.
    async with httpx.AsyncClient(timeout=20.0, limits=httpx.Limits(max_keepalive_connections=0)) as client:
        yield client


def ws_url(server: DaphneServer | Cluster) -> str:
    return server.url.replace("http://", "ws://", 1)


def directory_url(server: DaphneServer | Cluster) -> str:
    return server.url + "/sessions"


async def listed(http: httpx.AsyncClient, server: DaphneServer | Cluster, token: str) -> dict[str, Any]:
    response = await http.get(directory_url(server), headers=bearer(token))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    body: dict[str, Any] = response.json()
    assert body["complete"] is True
    return body


async def test_a_running_turn_is_listed_for_its_principal_only(
    server: DaphneServer | Cluster, http: httpx.AsyncClient
) -> None:
    alice = bearer(tokens.ALICE)
    response = await http.post(server.url, headers={**JSON, **alice}, json=rpc(0, "initialize", {"protocolVersion": 1}))
    assert response.status_code == 200
    connection_id = response.headers["acp-connection-id"]
    meta = response.json()["result"]["_meta"]
    assert meta["acp-channels/sessions"] == {
        "directory": "/acp/sessions",
        "listMethod": "_acp-channels/sessions/list",
        "attach": {"header": "Acp-Attach-Session", "cursorHeader": "Acp-Attach-Cursor"},
    }
    assert meta["acp/transport"]["resumable"]["retentionMessages"] == 16384
    async with open_sse(http, server.url, connection_id, **alice) as connection_stream:
        new = rpc(1, "session/new", {"cwd": "/tmp", "mcpServers": []})
        assert (await post(http, server.url, new, connection_id, **alice)).status_code == 202
        session_id = (await connection_stream.next())["result"]["sessionId"]
        async with open_sse(http, server.url, connection_id, session_id, **alice) as session_stream:
            prompt = rpc(
                2, "session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": "tick 3 300"}]}
            )
            assert (await post(http, server.url, prompt, connection_id, session_id, **alice)).status_code == 202
            first = await session_stream.next()
            assert first["method"] == "session/update"
            body = await listed(http, server, tokens.ALICE)
            (session,) = [entry for entry in body["sessions"] if entry["sessionId"] == session_id]
            assert session["connectionId"] == connection_id
            assert session["turnRunning"] is True and session["pendingPermissions"] == 0
            assert session["agent"] == "acp-channels-demo" and session["principal"] == "token:alice"
            assert session["attachments"] == 2  # the connection stream and the session stream
            (connection,) = [entry for entry in body["connections"] if entry["connectionId"] == connection_id]
            assert connection["sessions"] == [session_id] and connection["transport"] == "http"
            # Bob sees none of Alice's.
            others = await listed(http, server, tokens.BOB)
            assert connection_id not in {entry["connectionId"] for entry in others["connections"]}
            assert session_id not in {entry["sessionId"] for entry in others["sessions"]}
            # The same on the connection, as an extension method: its answer on the connection stream.
            ask = rpc("list-1", "_acp-channels/sessions/list")
            assert (await post(http, server.url, ask, connection_id, **alice)).status_code == 202
            answer = await connection_stream.next()
            assert answer["id"] == "list-1"
            assert session_id in {entry["sessionId"] for entry in answer["result"]["sessions"]}
            while "result" not in (message := await session_stream.next()):
                assert message["method"] == "session/update"
            assert message["id"] == 2
        # The session stream's reader left: the server notices it closed (polled, as another
        # process's state).
        async with asyncio.timeout(10):
            while True:
                body = await listed(http, server, tokens.ALICE)
                (session,) = [entry for entry in body["sessions"] if entry["sessionId"] == session_id]
                if session["attachments"] == 1:
                    break
                await asyncio.sleep(0.05)
        assert session["turnRunning"] is False
    assert (await http.delete(server.url, headers={"Acp-Connection-Id": connection_id, **alice})).status_code == 202


async def test_the_directory_needs_credentials_and_a_get(
    server: DaphneServer | Cluster, http: httpx.AsyncClient
) -> None:
    assert (await http.get(directory_url(server))).status_code == 401
    response = await http.post(directory_url(server), headers=bearer(tokens.ALICE), content=b"{}")
    assert response.status_code == 405 and response.headers["allow"] == "GET, HEAD"


async def test_a_socket_asks_for_the_directory_on_its_connection(server: DaphneServer | Cluster) -> None:
    alice = bearer(tokens.ALICE)
    async with connect(
        ws_url(server),
        subprotocols=["acp"],  # type: ignore[list-item]
        additional_headers=alice,
        proxy=None,
    ) as ws:
        await ws.send(json.dumps(rpc(0, "initialize", {"protocolVersion": 1})))
        init = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert init["result"]["_meta"]["acp-channels/sessions"]["listMethod"] == "_acp-channels/sessions/list"
        await ws.send(json.dumps(rpc(1, "session/new", {"cwd": "/tmp", "mcpServers": []})))
        session_id = json.loads(await asyncio.wait_for(ws.recv(), 10))["result"]["sessionId"]
        await ws.send(json.dumps(rpc(2, "_acp-channels/sessions/list")))
        answer = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert answer["id"] == 2
        (session,) = [entry for entry in answer["result"]["sessions"] if entry["sessionId"] == session_id]
        assert session["attachments"] == 1 and session["turnRunning"] is False
        (connection,) = [entry for entry in answer["result"]["connections"] if session_id in entry["sessions"]]
        assert connection["transport"] == "websocket"
    # Closed cleanly, the socket ended its connection: the directory drops it (polled, as another
    # process's state).
    async with httpx.AsyncClient(timeout=20.0) as http, asyncio.timeout(10):
        while True:
            body = await listed(http, server, tokens.ALICE)
            if session_id not in {entry["sessionId"] for entry in body["sessions"]}:
                break
            await asyncio.sleep(0.05)


async def test_a_prompt_resent_with_its_operation_id_runs_once(
    server: DaphneServer | Cluster, http: httpx.AsyncClient
) -> None:
    """The answer to a POST was lost: the client sends it again with the same operation id, and
    the turn runs once; under another JSON-RPC id the resend is told which request carries it."""
    alice = bearer(tokens.ALICE)
    response = await http.post(server.url, headers={**JSON, **alice}, json=rpc(0, "initialize", {"protocolVersion": 1}))
    connection_id = response.headers["acp-connection-id"]
    async with open_sse(http, server.url, connection_id, **alice) as connection_stream:
        new = rpc(1, "session/new", {"cwd": "/tmp", "mcpServers": []})
        assert (await post(http, server.url, new, connection_id, **alice)).status_code == 202
        session_id = (await connection_stream.next())["result"]["sessionId"]
        async with open_sse(http, server.url, connection_id, session_id, **alice) as session_stream:
            params = {
                "sessionId": session_id,
                "prompt": [{"type": "text", "text": "tick 2 50"}],
                "_meta": {"acp-channels/operationId": "op-7f3a"},
            }
            for request_id in (2, 2, 3):  # sent, resent as is, resent under another id
                response = await post(
                    http, server.url, rpc(request_id, "session/prompt", params), connection_id, session_id, **alice
                )
                assert response.status_code == 202
            refused = await connection_stream.next()
            assert refused["id"] == 3 and refused["error"]["code"] == -32010
            assert refused["error"]["data"] == {"operationId": "op-7f3a", "firstRequestId": 2}
            ticks = []
            while "result" not in (message := await session_stream.next()):
                ticks.append(message["params"]["update"]["content"]["text"])
            assert message["id"] == 2
            assert ticks == ["tick 1\n", "tick 2\n"]  # one turn
            # Nothing else comes: a second turn would have sent its ticks by now.
            one_more = rpc(
                4, "session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": "echo done"}]}
            )
            assert (await post(http, server.url, one_more, connection_id, session_id, **alice)).status_code == 202
            following = [await session_stream.next() for _ in range(2)]
            assert [item.get("id") for item in following] == [None, 4]
            assert "done" in json.dumps(following[0])
    assert (await http.delete(server.url, headers={"Acp-Connection-Id": connection_id, **alice})).status_code == 202
