"""Shared sessions on a live server (one worker, three behind a balancer, two web workers with
two runners; docs/shared-sessions.md): a turn outlives its client's transports and another
client attaches and gets the whole turn once, in order, then live; several clients on one
session see the same output; a prompt while a turn runs and an observer's prompt are refused;
two controllers race a permission answer and exactly one wins; terminating ends every
attachment and says so; attaching to another principal's session is 404."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect

from tests import auth_fixtures as tokens
from tests.cluster import Cluster
from tests.conftest import SHAPES
from tests.live import JSON, DaphneServer, SseReader, open_sse, post, rpc
from tests.token_servers import RUNNERS, TOKEN_ENV, bearer, prompt, start_token_server, text_of

ALICE = bearer(tokens.ALICE)
BOB = bearer(tokens.BOB)
NEW_SESSION = {"cwd": "/tmp", "mcpServers": []}


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


async def new_connection(
    http: httpx.AsyncClient, server: DaphneServer | Cluster, headers: dict[str, str]
) -> tuple[str, dict[str, Any]]:
    body = rpc(0, "initialize", {"protocolVersion": 1})
    response = await http.post(server.url, headers={**JSON, **headers}, json=body)
    assert response.status_code == 200, response.text
    return response.headers["acp-connection-id"], response.json()


async def attach_over_http(
    http: httpx.AsyncClient,
    server: DaphneServer | Cluster,
    session_id: str,
    headers: dict[str, str],
    role: str = "",
    cursor: str = "",
) -> httpx.Response:
    attach = {"Acp-Attach-Session": session_id, **({"Acp-Attach-Role": role} if role else {})}
    if cursor:
        attach["Acp-Attach-Cursor"] = cursor
    body = rpc("init-b", "initialize", {"protocolVersion": 1})
    return await http.post(server.url, headers={**JSON, **headers, **attach}, json=body)


async def ticks_until_turn_ends(
    stream: SseReader | ClientConnection,
    others: list[dict[str, Any]] | None = None,
    cursors: list[str] | None = None,
) -> tuple[list[str], dict[str, Any]]:
    """The text lines read until the turn's end (its answer, or the notice that it ended); any
    other message read meanwhile goes to `others`, each line's cursor to `cursors`."""
    lines: list[str] = []
    while True:
        message = await next_message(stream)
        if (line := text_of(message)) is not None:
            lines.append(line)
            if cursors is not None:
                cursors.append(message["params"]["_meta"]["acp/cursor"])
        elif message.get("method") == "_acp-channels/session/turn_ended" or "stopReason" in message.get("result", {}):
            return lines, message
        elif others is not None:
            others.append(message)


async def next_message(stream: SseReader | ClientConnection) -> dict[str, Any]:
    if isinstance(stream, SseReader):
        value: dict[str, Any] = await stream.next(20)
        return value
    return dict(json.loads(await asyncio.wait_for(stream.recv(), 20)))


async def new_session(
    http: httpx.AsyncClient, server: DaphneServer | Cluster, connection_id: str, connection_stream: SseReader
) -> str:
    assert (await post(http, server.url, rpc(1, "session/new", NEW_SESSION), connection_id, **ALICE)).status_code == 202
    return str((await connection_stream.next())["result"]["sessionId"])


def ws_url(server: DaphneServer | Cluster) -> str:
    return server.url.replace("http://", "ws://", 1)


async def test_a_turn_outlives_its_client_and_another_attaches_to_it(
    server: DaphneServer | Cluster, http: httpx.AsyncClient
) -> None:
    """Client A starts a turn and goes (its streams drop, no DELETE); client B, on whatever
    worker, attaches over HTTP and gets the whole turn once and in order, then its end."""
    connection_id, _ = await new_connection(http, server, ALICE)
    async with open_sse(http, server.url, connection_id, **ALICE) as connection_stream:
        session_id = await new_session(http, server, connection_id, connection_stream)
        async with open_sse(http, server.url, connection_id, session_id, **ALICE) as session_stream:
            sent = await post(http, server.url, prompt(2, session_id, "tick 40 25"), connection_id, session_id, **ALICE)
            assert sent.status_code == 202
            first = [text_of(await session_stream.next()) for _ in range(3)]
            assert first == ["tick 1\n", "tick 2\n", "tick 3\n"]
    # A's transports are gone; the turn goes on. B attaches (the same principal, any worker).
    response = await attach_over_http(http, server, session_id, ALICE)
    assert response.status_code == 200, response.text
    attachment_id = response.headers["acp-connection-id"]
    assert attachment_id != connection_id
    meta = response.json()["result"]["_meta"]["acp-channels/attachment"]
    retained = meta.pop("retained")
    assert meta == {"sessionId": session_id, "connectionId": connection_id, "role": "controller", "turnRunning": True}
    assert 3 <= retained <= 40  # at least what A read, at most the whole turn
    async with open_sse(http, server.url, attachment_id, session_id, **ALICE) as attached:
        cursors: list[str] = []
        lines, end = await ticks_until_turn_ends(attached, cursors=cursors)
        assert lines == [f"tick {index}\n" for index in range(1, 41)]  # the whole turn, once, in order
        assert len(set(cursors)) == 40  # each update says where it is in the session's stream
        assert end == {
            "jsonrpc": "2.0",
            "method": "_acp-channels/session/turn_ended",
            "params": {"sessionId": session_id, "stopReason": "end_turn"},
        }
        # B prompts on the session it attached to: its answer comes to B, under B's id.
        sent = await post(http, server.url, prompt(7, session_id, "echo from b"), attachment_id, session_id, **ALICE)
        assert sent.status_code == 202
        while "result" not in (message := await attached.next()):
            pass
        assert message["id"] == 7 and message["result"]["stopReason"] == "end_turn"
    # Detaching (DELETE of the attachment) leaves the session; terminating (DELETE of its
    # connection) ends it.
    detach = await http.delete(server.url, headers={"Acp-Connection-Id": attachment_id, **ALICE})
    assert detach.status_code == 202
    # Attached again from a cursor: what the session kept after it only.
    resumed = await attach_over_http(http, server, session_id, ALICE, cursor=cursors[29])
    assert resumed.status_code == 200, resumed.text
    async with open_sse(http, server.url, resumed.headers["acp-connection-id"], session_id, **ALICE) as rest:
        later = [text_of(await rest.next()) for _ in range(10)]
        assert later == [f"tick {index}\n" for index in range(31, 41)]
    await http.delete(server.url, headers={"Acp-Connection-Id": resumed.headers["acp-connection-id"], **ALICE})
    foreign = await attach_over_http(http, server, session_id, ALICE, cursor="nope-3")
    assert foreign.status_code == 409
    again = await attach_over_http(http, server, session_id, ALICE)
    assert again.status_code == 200
    second = again.headers["acp-connection-id"]
    async with open_sse(http, server.url, second, session_id, **ALICE) as watching:
        terminate = await http.delete(server.url, headers={"Acp-Connection-Id": connection_id, **ALICE})
        assert terminate.status_code == 202
        while (message := await watching.next_or_end()) is not None:
            if message.get("method") == "_acp-channels/session/terminated":
                break
        assert message == {
            "jsonrpc": "2.0",
            "method": "_acp-channels/session/terminated",
            "params": {"sessionId": session_id, "connectionId": connection_id},
        }
        assert await watching.next_or_end() is None  # then its stream ends
    assert (await attach_over_http(http, server, session_id, ALICE)).status_code == 404


async def test_another_principal_cannot_attach(server: DaphneServer | Cluster, http: httpx.AsyncClient) -> None:
    connection_id, _ = await new_connection(http, server, ALICE)
    async with open_sse(http, server.url, connection_id, **ALICE) as connection_stream:
        session_id = await new_session(http, server, connection_id, connection_stream)
        refused = await attach_over_http(http, server, session_id, BOB)
        assert refused.status_code == 404 and refused.text == "no such session"
        assert (await attach_over_http(http, server, "no-such-session", ALICE)).status_code == 404
        assert (await attach_over_http(http, server, session_id, ALICE, role="owner")).status_code == 400
    await http.delete(server.url, headers={"Acp-Connection-Id": connection_id, **ALICE})


async def open_socket(server: DaphneServer | Cluster, **attach: str) -> ClientConnection:
    headers = {**ALICE, **{f"Acp-Attach-{name.title()}": value for name, value in attach.items()}}
    return await connect(ws_url(server), subprotocols=["acp"], additional_headers=headers, proxy=None)  # type: ignore[list-item]


async def test_several_clients_share_a_session_over_websockets(server: DaphneServer | Cluster) -> None:
    """A on a socket runs a turn; B (controller) and C (observer) attach on sockets of their
    own: each gets the turn from its start, then live; B's prompt during the turn and C's at
    any time are refused; a permission request goes to A and B, B answers first, and A learns
    it was resolved; A's late answer changes nothing."""
    async with await open_socket(server) as a:
        await a.send(json.dumps(rpc(0, "initialize", {"protocolVersion": 1})))
        await next_message(a)
        await a.send(json.dumps(rpc(1, "session/new", NEW_SESSION)))
        session_id = (await next_message(a))["result"]["sessionId"]
        await a.send(json.dumps(prompt(2, session_id, "tick 30 30")))
        assert text_of(await next_message(a)) == "tick 1\n"
        async with (
            await open_socket(server, session=session_id) as b,
            await open_socket(server, session=session_id, role="observer") as c,
        ):
            for socket in (b, c):
                await socket.send(json.dumps(rpc("init", "initialize", {"protocolVersion": 1})))
                reply = await next_message(socket)
                assert reply["id"] == "init" and reply["result"]["_meta"]["acp-channels/attachment"]["turnRunning"]
            await b.send(json.dumps(prompt("b-1", session_id, "echo too soon")))
            await c.send(json.dumps(prompt("c-1", session_id, "echo never")))
            b_others: list[dict[str, Any]] = []
            c_others: list[dict[str, Any]] = []
            a_lines, a_end = await ticks_until_turn_ends(a)
            b_lines, _ = await ticks_until_turn_ends(b, b_others)
            c_lines, c_end = await ticks_until_turn_ends(c, c_others)
            assert a_end["id"] == 2
            assert ["tick 1\n", *a_lines] == b_lines == c_lines == [f"tick {i}\n" for i in range(1, 31)]
            assert c_end["method"] == "_acp-channels/session/turn_ended"
            assert [(m["id"], m["error"]["code"]) for m in b_others] == [("b-1", -32012)]  # a turn runs
            assert [(m["id"], m["error"]["code"]) for m in c_others] == [("c-1", -32011)]  # an observer
            # A permission request: A and B both get it; B answers first.
            await b.send(json.dumps(prompt("b-2", session_id, "permission")))
            echoed = await next_message(a)  # B's prompt, shown to A
            assert echoed["params"]["update"] == {
                "sessionUpdate": "user_message_chunk",
                "content": {"type": "text", "text": "permission"},
            }
            asked_a = await next_message(a)
            asked_b = await next_message(b)
            assert asked_a["method"] == asked_b["method"] == "session/request_permission"
            assert asked_a["id"] == asked_b["id"]
            selected = {"outcome": {"outcome": "selected", "optionId": "allow"}}
            await b.send(json.dumps({"jsonrpc": "2.0", "id": asked_b["id"], "result": selected}))
            resolved = await next_message(a)
            assert resolved["method"] == "_acp-channels/session/permission_resolved"
            assert resolved["params"] == {
                "sessionId": session_id,
                "requestId": asked_a["id"],
                "outcome": selected["outcome"],
            }
            rejected = {"outcome": {"outcome": "selected", "optionId": "reject"}}
            await a.send(json.dumps({"jsonrpc": "2.0", "id": asked_a["id"], "result": rejected}))  # too late
            b_said, b_end = await ticks_until_turn_ends(b)
            a_said, a_end = await ticks_until_turn_ends(a)
            assert b_said == a_said == ["permission: allow"]
            assert b_end["id"] == "b-2" and a_end["method"] == "_acp-channels/session/turn_ended"


@pytest.mark.parametrize("detached_seconds", ["30", "0"])
async def test_a_detached_connection_outlives_the_idle_timeout(http: httpx.AsyncClient, detached_seconds: str) -> None:
    """Nobody attached for longer than IDLE_TIMEOUT_SECONDS: with DETACHED_SECONDS the
    connection and its finished turn are still there to attach to; with 0 it was reaped."""
    env = {**TOKEN_ENV, "ACP_IDLE_TIMEOUT_SECONDS": "1", "ACP_DETACHED_SECONDS": detached_seconds}
    server = DaphneServer(env=env).start()
    try:
        connection_id, _ = await new_connection(http, server, ALICE)
        async with open_sse(http, server.url, connection_id, **ALICE) as connection_stream:
            session_id = await new_session(http, server, connection_id, connection_stream)
            sent = await post(http, server.url, prompt(2, session_id, "tick 4 600"), connection_id, session_id, **ALICE)
            assert sent.status_code == 202
        # Gone for the whole turn (2.4 s, past the idle timeout and a reaper's sweep): the
        # directory says when it ended (polled, as another process's state).
        async with asyncio.timeout(15):
            while True:
                listed = (await http.get(server.url + "/sessions", headers=ALICE)).json()["sessions"]
                if not [entry for entry in listed if entry["sessionId"] == session_id and entry["turnRunning"]]:
                    break
                await asyncio.sleep(0.1)
        response = await attach_over_http(http, server, session_id, ALICE)
        if detached_seconds == "0":
            assert response.status_code == 404  # reaped with its agent
            return
        assert response.status_code == 200, response.text
        assert response.json()["result"]["_meta"]["acp-channels/attachment"]["turnRunning"] is False
        attachment_id = response.headers["acp-connection-id"]
        async with open_sse(http, server.url, attachment_id, session_id, **ALICE) as attached:
            assert [text_of(await attached.next()) for _ in range(4)] == [f"tick {i}\n" for i in range(1, 5)]
    finally:
        server.stop()
    assert server.errors() == []
