"""The WebSocket shape of `/acp` over the wire, against a real daphne (docs/wire-contract.md §8, §14 items 43-48).

One JSON-RPC frame per text message each way; batches stay whole; malformed text is forwarded and
answered; binary is ignored; agent exit drains then closes; the Origin gate; and the quirk that a
WebSocket connection id also works with POST, GET (409) and DELETE.

The connection id comes from the 101's `acp-connection-id` header (acp_channels._daphne_compat
makes daphne send the headers of `websocket.accept`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.typing import Origin

from tests.live import JSON, SSE, DaphneServer, notification, rpc

TIMEOUT = 10.0


# -- helpers ---------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def open_ws(url: str, origin: str | None = None) -> AsyncIterator[ClientConnection]:
    async with connect(
        url,
        origin=Origin(origin) if origin is not None else None,
        proxy=None,
        compression=None,
        open_timeout=TIMEOUT,
        close_timeout=TIMEOUT,
        max_size=None,
    ) as ws:
        yield ws


async def send(ws: ClientConnection, message: Any) -> None:
    await asyncio.wait_for(ws.send(message if isinstance(message, str | bytes) else json.dumps(message)), TIMEOUT)


async def receive_text(ws: ClientConnection) -> str:
    message = await asyncio.wait_for(ws.recv(), TIMEOUT)
    assert isinstance(message, str), f"expected a text message, got {message!r}"
    return message


async def receive(ws: ClientConnection) -> Any:
    return json.loads(await receive_text(ws))


async def assert_closes(ws: ClientConnection) -> None:
    """The server ends the socket (a Close frame or EOF) with nothing more to read."""
    with pytest.raises(ConnectionClosed):
        extra = await asyncio.wait_for(ws.recv(), TIMEOUT)
        pytest.fail(f"expected the socket to close, got {extra!r}")


def echo(request_id: Any, method: str, params: Any = None) -> dict[str, Any]:
    """The wire agent's answer to a request it does not know."""
    return {"jsonrpc": "2.0", "id": request_id, "result": {"method": method, "params": params}}


async def received_frames(ws: ClientConnection, request_id: Any = "received") -> list[Any]:
    """What the agent has received so far (each frame parsed), via `test/received`."""
    await send(ws, rpc(request_id, "test/received"))
    reply = await receive(ws)
    assert reply["id"] == request_id, reply
    return [json.loads(frame) for frame in reply["result"]["frames"]]


def new_errors(server: DaphneServer, since: int) -> list[str]:
    return [line for line in server.log[since:] if "Traceback" in line or " 500 " in line]


# -- frames ----------------------------------------------------------------------------------


async def test_one_frame_per_text_message_and_one_reply_message(wire_server: DaphneServer) -> None:
    async with open_ws(wire_server.ws_url) as ws:
        # No initialize gate: the first message goes straight to the agent.
        await send(ws, rpc(1, "custom/first", {"a": 1}))
        assert await receive(ws) == echo(1, "custom/first", {"a": 1})
        await send(ws, notification("custom/note", {"b": 2}))
        await send(ws, rpc("two", "custom/second"))
        assert await receive(ws) == echo("two", "custom/second")
        assert await received_frames(ws) == [
            rpc(1, "custom/first", {"a": 1}),
            notification("custom/note", {"b": 2}),
            rpc("two", "custom/second"),
        ]


async def test_batch_reaches_agent_as_one_frame_and_reply_is_one_array_message(wire_server: DaphneServer) -> None:
    batch = [rpc(1, "batch/a", {"x": 1}), notification("batch/note"), rpc(2, "batch/b")]
    async with open_ws(wire_server.ws_url) as ws:
        await send(ws, batch)
        assert await receive(ws) == [echo(1, "batch/a", {"x": 1}), echo(2, "batch/b")]
        # The very next message is the answer to test/received: nothing else was sent for the batch.
        assert await received_frames(ws) == [batch]


async def test_notification_only_batch_gets_no_reply(wire_server: DaphneServer) -> None:
    batch = [notification("batch/one"), notification("batch/two")]
    async with open_ws(wire_server.ws_url) as ws:
        await send(ws, batch)
        assert await received_frames(ws) == [batch]


async def test_malformed_text_gets_parse_error_and_socket_stays_open(wire_server: DaphneServer) -> None:
    async with open_ws(wire_server.ws_url) as ws:
        await send(ws, "{not json")
        reply = await receive(ws)
        assert reply["jsonrpc"] == "2.0"
        assert reply["id"] is None
        assert reply["error"]["code"] == -32700
        assert reply["error"]["data"] == {"line": "{not json"}
        await send(ws, rpc(2, "after/malformed"))
        assert await receive(ws) == echo(2, "after/malformed")


async def test_binary_messages_are_ignored(wire_server: DaphneServer) -> None:
    async with open_ws(wire_server.ws_url) as ws:
        await send(ws, b"\x00\x01\xff")
        await send(ws, json.dumps(rpc(7, "binary/json")).encode())
        await send(ws, rpc(8, "text/after"))
        # Nothing came back for the binary messages: the first reply is for the text one.
        assert await receive(ws) == echo(8, "text/after")
        assert await received_frames(ws) == [rpc(8, "text/after")]


async def test_burst_of_1025_messages_arrives_in_order(wire_server: DaphneServer) -> None:
    count = 1025
    async with open_ws(wire_server.ws_url) as ws:
        await send(ws, rpc(1, "test/burst", {"count": count}))
        items = [await receive(ws) for _ in range(count)]
        assert [item["params"]["n"] for item in items] == list(range(count))
        assert all(item["method"] == "test/item" and "id" not in item for item in items)
        assert await receive(ws) == {"jsonrpc": "2.0", "id": 1, "result": {"ok": True}}


async def test_agent_exit_sends_final_frame_then_closes(wire_server: DaphneServer) -> None:
    since = len(wire_server.log)
    final = notification("test/final", {"bye": True})
    async with open_ws(wire_server.ws_url) as ws:
        await send(ws, rpc(1, "test/exit", {"final": final}))
        # A message sent after the agent ended is dropped without harm (item 46); the socket may
        # already be closing when it is sent.
        with contextlib.suppress(ConnectionClosed):
            await send(ws, rpc(2, "after/exit"))
        assert await receive(ws) == {"jsonrpc": "2.0", "id": 1, "result": {"ok": True}}
        assert await receive(ws) == final
        await assert_closes(ws)
    assert new_errors(wire_server, since) == []


# -- the Origin gate (CORS off) --------------------------------------------------------------


@pytest.mark.parametrize("origin", ["http://evil.example", "null"])
async def test_any_origin_is_refused_with_403_while_cors_is_off(wire_server: DaphneServer, origin: str) -> None:
    with pytest.raises(InvalidStatus) as refused:
        async with open_ws(wire_server.ws_url, origin=origin):
            pass
    assert refused.value.response.status_code == 403


async def test_same_origin_is_accepted_while_cors_is_off(wire_server: DaphneServer) -> None:
    """A page served by this server is not a foreign origin (only foreign origins are refused)."""
    async with open_ws(wire_server.ws_url, origin=f"http://127.0.0.1:{wire_server.port}") as ws:
        await send(ws, rpc(1, "same/origin"))
        assert await receive(ws) == echo(1, "same/origin")


async def test_no_origin_is_accepted(wire_server: DaphneServer) -> None:
    async with open_ws(wire_server.ws_url) as ws:
        assert "origin" not in ws.request.headers
        await send(ws, rpc(1, "no/origin"))
        assert await receive(ws) == echo(1, "no/origin")


async def test_upgrade_response_carries_a_fresh_connection_id(wire_server: DaphneServer) -> None:
    async with open_ws(wire_server.ws_url) as first, open_ws(wire_server.ws_url) as second:
        ids = [ws.response.headers.get_all("acp-connection-id") for ws in (first, second)]
    assert all(len(values) == 1 for values in ids), ids
    assert ids[0] != ids[1]
    for (value,) in ids:
        uuid_part, _, worker = value.rpartition(".")
        uuid.UUID(uuid_part)
        assert len(worker) == 12


async def test_message_larger_than_daphne_default_limit_round_trips(wire_server: DaphneServer) -> None:
    """daphne caps messages and frames at 1 MiB unless told otherwise; the 16 MiB body limit applies."""
    blob = "x" * (2 * 1024 * 1024)
    async with open_ws(wire_server.ws_url) as ws:
        await send(ws, rpc(1, "big/message", {"blob": blob}))
        assert await receive(ws) == echo(1, "big/message", {"blob": blob})


# -- the WebSocket connection id over HTTP (§8 quirk; item 43) -------------------------------


@contextlib.asynccontextmanager
async def identified_ws(server: DaphneServer) -> AsyncIterator[tuple[ClientConnection, str]]:
    async with open_ws(server.ws_url) as ws:
        yield ws, ws.response.headers["acp-connection-id"]


async def test_post_with_websocket_connection_id_replies_on_the_socket(
    wire_server: DaphneServer, http: httpx.AsyncClient
) -> None:
    async with identified_ws(wire_server) as (ws, connection_id):
        headers = {**JSON, "Acp-Connection-Id": connection_id}
        response = await http.post(wire_server.url, headers=headers, json=rpc(2, "via/post", {"p": 1}))
        assert response.status_code == 202
        assert await receive(ws) == echo(2, "via/post", {"p": 1})
        # The socket keeps working after it.
        await send(ws, rpc(3, "via/socket"))
        assert await receive(ws) == echo(3, "via/socket")
        frames = await received_frames(ws)
        assert frames == [rpc(2, "via/post", {"p": 1}), rpc(3, "via/socket")]


async def test_sse_get_with_websocket_connection_id_is_409(wire_server: DaphneServer, http: httpx.AsyncClient) -> None:
    async with identified_ws(wire_server) as (ws, connection_id):
        for session in (None, "s-1"):
            headers = {**SSE, "Acp-Connection-Id": connection_id}
            if session is not None:
                headers["Acp-Session-Id"] = session
            response = await http.get(wire_server.url, headers=headers)
            assert response.status_code == 409, response.text
        # The socket is unaffected.
        await send(ws, rpc(4, "still/open"))
        assert await receive(ws) == echo(4, "still/open")


async def test_delete_with_websocket_connection_id_closes_the_socket(
    wire_server: DaphneServer, http: httpx.AsyncClient
) -> None:
    async with identified_ws(wire_server) as (ws, connection_id):
        response = await http.delete(wire_server.url, headers={"Acp-Connection-Id": connection_id})
        assert response.status_code == 202
        await assert_closes(ws)
    response = await http.delete(wire_server.url, headers={"Acp-Connection-Id": connection_id})
    assert response.status_code == 404
    response = await http.post(
        wire_server.url, headers={**JSON, "Acp-Connection-Id": connection_id}, json=rpc(5, "after/delete")
    )
    assert response.status_code == 404


async def test_client_closing_the_socket_ends_the_connection(
    wire_server: DaphneServer, http: httpx.AsyncClient
) -> None:
    async with identified_ws(wire_server) as (ws, connection_id):
        headers = {**SSE, "Acp-Connection-Id": connection_id}
        assert (await http.get(wire_server.url, headers=headers)).status_code == 409  # alive
        await asyncio.wait_for(ws.close(), TIMEOUT)
    # The server learns of the close asynchronously and nothing on the wire signals the moment the
    # host is gone, so poll a side-effect-free request (409 while alive, 404 once removed).
    deadline = time.monotonic() + TIMEOUT
    while (status := (await http.get(wire_server.url, headers=headers)).status_code) == 409:
        assert time.monotonic() < deadline, "connection still registered after the socket closed"
        await asyncio.sleep(0.02)
    assert status == 404
