"""Resumable WebSockets (docs/resumable-streams.md) on a live server, one worker and three workers
behind the balancer (each socket a new TCP connection, so a reattached socket lands on another
worker than the one hosting its connection): a socket that drops without a close frame leaves its
connection alive; a new upgrade naming the connection and the count of messages received gets
the rest, then live ones, and says how many client messages the server has (on the 101, and for
browsers as a first message outside the numbering); a socket the server
still believes attached is taken over (4409); reattaches that cannot resume are refused with an
HTTP status before the upgrade; a clean close ends the connection at once, and the grace period
ends an abandoned one.

The client side is simulated here with raw `websockets` connections: it counts what it receives,
numbers what it sends, and on a reattach resends what `Acp-Received` does not count.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests import auth_fixtures as tokens
from tests.cluster import Cluster
from tests.conftest import SHAPES, start_server
from tests.live import JSON, DaphneServer, UvicornServer, rpc, wait_for_line
from tests.test_auth_live import AUTH_ENV, bearer

#: The wire server's tests: no traceback and no 500 in its log meanwhile.
wire_log_clean = pytest.mark.usefixtures("wire_log_stays_clean")

TIMEOUT = 10.0
#: The grace period of the guarded server: short, since its tests wait for it to run out.
SHORT_GRACE = 1.0
RESUME_META = {
    "sse": True,
    "websocket": True,
    "windowEvents": 16384,
    "windowBytes": 2 * 1024 * 1024,
    "websocketResumeSeconds": 60.0,
}
#: What a reattached socket's first message is when the client asks for Acp-Received as one.
RECEIVED_METHOD = "_acp-channels/received"


@pytest.fixture(scope="module", params=SHAPES)
def guarded(request: pytest.FixtureRequest) -> Iterator[DaphneServer | Cluster]:
    """Bearer tokens (alice, bob) and a short grace period."""
    # DETACHED_SECONDS 0: the grace period alone (with it, longer: tests/test_consumer.py).
    env = {**AUTH_ENV, "ACP_WEBSOCKET_RESUME_SECONDS": str(SHORT_GRACE), "ACP_DETACHED_SECONDS": "0"}
    server = start_server(request.param, env, request)
    yield server
    server.stop()
    assert server.errors() == []


def on_worker(server: DaphneServer | Cluster | UvicornServer, index: int) -> str:
    """The WebSocket URL of one worker of a cluster, past the balancer (so a test knows which
    worker a socket lands on); the server's own URL for a single worker."""
    if isinstance(server, Cluster):
        return server.workers[index % len(server.workers)].ws_url
    return server.ws_url


@pytest.fixture(scope="module")
def uvicorn_server() -> Iterator[UvicornServer]:
    server = UvicornServer(env={"ACP_AGENT": "tests.wire_agent.create"}).start()
    yield server
    server.stop()


# -- a client that counts ------------------------------------------------------------------------


async def open_socket(url: str, headers: dict[str, str] | None = None) -> ClientConnection:
    return await connect(
        url,
        additional_headers=headers,
        proxy=None,
        compression=None,
        open_timeout=TIMEOUT,
        close_timeout=TIMEOUT,
        max_size=None,
    )


def connection_of(ws: ClientConnection) -> str:
    assert ws.response is not None
    return ws.response.headers["acp-connection-id"]


async def reattach(
    url: str, connection_id: str, received: int, headers: dict[str, str] | None = None
) -> tuple[ClientConnection, int]:
    """A new socket for `connection_id` after `received` messages; with the server's count of
    the client's messages (Acp-Received)."""
    ws = await open_socket(url, {**(headers or {}), "Acp-Connection-Id": connection_id, "Last-Event-ID": str(received)})
    assert ws.response is not None
    assert ws.response.headers.get_all("acp-connection-id") == [connection_id]
    return ws, int(ws.response.headers["acp-received"])


async def refused_reattach(
    url: str, connection_id: str, last_event_id: str, headers: dict[str, str] | None = None
) -> tuple[int, str]:
    """Status and body of a reattach refused before the upgrade."""
    with pytest.raises(InvalidStatus) as refused:
        ws = await open_socket(
            url, {**(headers or {}), "Acp-Connection-Id": connection_id, "Last-Event-ID": last_event_id}
        )
        await ws.close()
    response = refused.value.response
    return response.status_code, response.body.decode() if response.body else ""


async def drop(ws: ClientConnection) -> None:
    """Cut the TCP connection without a close frame, as a network failure does."""
    ws.transport.abort()
    await asyncio.wait_for(ws.wait_closed(), TIMEOUT)


async def receive(ws: ClientConnection) -> Any:
    return json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))


async def send(ws: ClientConnection, message: Any) -> None:
    await asyncio.wait_for(ws.send(json.dumps(message)), TIMEOUT)


async def received_message(ws: ClientConnection) -> int:
    """The count of the `_acp-channels/received` notification, which must come first."""
    message = await receive(ws)
    assert message == {
        "jsonrpc": "2.0",
        "method": RECEIVED_METHOD,
        "params": {"received": message["params"]["received"]},
    }
    received: int = message["params"]["received"]
    return received


def item_number(message: Any) -> int:
    assert message.get("method") == "test/item", message
    number: int = message["params"]["n"]
    return number


async def items_until_reply(ws: ClientConnection, request_id: Any) -> list[int]:
    """The burst items that arrive before the reply to `request_id` (which ends the burst)."""
    numbers = []
    while "result" not in (message := await receive(ws)):
        numbers.append(item_number(message))
    assert message["id"] == request_id, message
    return numbers


async def frames_received_by_agent(ws: ClientConnection, request_id: str) -> list[Any]:
    """What the agent got so far (`test/received`; that request is a socket message too)."""
    await send(ws, rpc(request_id, "test/received"))
    while (message := await receive(ws)).get("id") != request_id:
        pass
    return [json.loads(frame) for frame in message["result"]["frames"]]


async def closed_with(ws: ClientConnection) -> tuple[int, str]:
    """The close code and reason of a socket another one took over. Messages the server had
    written to it before may still arrive first: the client ignores a socket it replaced."""
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            await asyncio.wait_for(ws.recv(), TIMEOUT)
    assert closed.value.rcvd is not None, "no close frame from the server"
    return closed.value.rcvd.code, closed.value.rcvd.reason


async def ended(server: DaphneServer | Cluster | UvicornServer, connection_id: str) -> str:
    """The audit line of the connection's end."""
    return await wait_for_line(server, rf"connection ended .*connection={re.escape(connection_id)} ")


async def post_status(http: httpx.AsyncClient, url: str, connection_id: str, headers: dict[str, str]) -> int:
    response = await http.post(
        url, headers={**JSON, **headers, "Acp-Connection-Id": connection_id}, json=rpc("p", "custom/ping")
    )
    return response.status_code


# -- reattaching -------------------------------------------------------------------------------


async def burst_across_drops(server: DaphneServer | Cluster | UvicornServer) -> None:
    """A burst read over three sockets, the first two dropped mid-way: every item once, in order."""
    ws = await open_socket(on_worker(server, 0))  # on three workers: hosted by the first
    connection_id = connection_of(ws)
    await send(ws, rpc(1, "test/burst", {"count": 3000}))
    seen = [item_number(await receive(ws)) for _ in range(700)]
    await drop(ws)  # mid-burst: the agent goes on, the server keeps the rest
    ws, acknowledged = await reattach(on_worker(server, 1), connection_id, len(seen))
    assert acknowledged == 1  # the burst request
    # Dropped again, on a worker that is not the host, and reattached on a third one.
    seen += [item_number(await receive(ws)) for _ in range(700)]
    await drop(ws)
    ws, acknowledged = await reattach(on_worker(server, 2), connection_id, len(seen))
    assert acknowledged == 1
    try:
        seen += await items_until_reply(ws, 1)
        assert seen == list(range(3000))
        await send(ws, rpc(2, "after/reattach"))  # and the socket works both ways
        assert (await receive(ws))["id"] == 2
    finally:
        await ws.close()


@wire_log_clean
async def test_a_dropped_socket_reattaches_and_gets_every_message_once_in_order(
    wire_server: DaphneServer | Cluster,
) -> None:
    await burst_across_drops(wire_server)


async def test_under_uvicorn_too(uvicorn_server: UvicornServer) -> None:
    """uvicorn reports a lost connection as 1005, and answers refusals itself (the ASGI
    denial-response extension)."""
    await burst_across_drops(uvicorn_server)
    ws = await open_socket(uvicorn_server.ws_url)
    connection_id = connection_of(ws)
    await ws.close()
    await ended(uvicorn_server, connection_id)
    assert await refused_reattach(uvicorn_server.ws_url, connection_id, "0") == (404, "")


@wire_log_clean
async def test_acp_received_tells_the_client_what_to_send_again(wire_server: DaphneServer | Cluster) -> None:
    outbox = [rpc(number, "custom/numbered", {"number": number}) for number in range(1, 6)]
    ws = await open_socket(on_worker(wire_server, 0))
    connection_id = connection_of(ws)
    received = 0
    for message in outbox[:2]:
        await send(ws, message)
        assert (await receive(ws))["id"] == message["id"]
        received += 1
    # Message 3 is sent as the socket dies (the server may or may not get it); 4 and 5 were
    # still queued on the client.
    await send(ws, outbox[2])
    await drop(ws)
    ws, acknowledged = await reattach(on_worker(wire_server, 1), connection_id, received)
    try:
        assert acknowledged in (2, 3)
        for message in outbox[acknowledged:]:  # everything the server did not count, in order
            await send(ws, message)
        replies = {(await receive(ws))["id"] for _ in range(5 - received)}
        assert replies == {3, 4, 5}
        assert await frames_received_by_agent(ws, "check") == outbox  # each exactly once
    finally:
        await ws.close()


@wire_log_clean
async def test_a_socket_still_attached_is_taken_over_with_4409(wire_server: DaphneServer | Cluster) -> None:
    first = await open_socket(on_worker(wire_server, 0))
    connection_id = connection_of(first)
    await send(first, rpc(1, "test/burst", {"count": 10}))
    seen = [item_number(await receive(first)) for _ in range(2)]
    # On three workers, the stale socket is a reattached one, on another worker than the host.
    stale, acknowledged = await reattach(on_worker(wire_server, 1), connection_id, len(seen))
    assert (await closed_with(first))[0] == 4409
    seen += [item_number(await receive(stale)) for _ in range(2)]
    # The client lost track of the stale socket (the server did not notice): a new one resumes.
    fresh, acknowledged = await reattach(on_worker(wire_server, 2), connection_id, len(seen))
    try:
        assert acknowledged == 1
        assert await closed_with(stale) == (4409, "another socket resumed this connection")
        seen += await items_until_reply(fresh, 1)
        assert seen == list(range(10))
        # The stale socket's end is not the connection's: it goes on.
        await send(fresh, rpc(2, "still/here"))
        assert (await receive(fresh))["id"] == 2
    finally:
        await fresh.close()


@wire_log_clean
async def test_a_plain_new_socket_is_a_new_connection(wire_server: DaphneServer | Cluster) -> None:
    url = wire_server.ws_url
    first = await open_socket(url)
    first_id = connection_of(first)
    await drop(first)
    second = await open_socket(url)
    try:
        assert connection_of(second) != first_id
    finally:
        await second.close()
    resumed, acknowledged = await reattach(url, first_id, 0)  # the dropped one still waits
    assert acknowledged == 0
    await resumed.close()


@wire_log_clean
async def test_initialize_over_websocket_advertises_resumption(wire_server: DaphneServer | Cluster) -> None:
    ws = await open_socket(wire_server.ws_url)
    try:
        await send(ws, rpc(0, "initialize", {"protocolVersion": 1}))
        reply = await receive(ws)
        assert reply["result"]["protocolVersion"] == 1  # the agent's result, with the server's _meta
        # With the connection's id: a browser cannot read the 101's Acp-Connection-Id.
        assert reply["result"]["_meta"] == {
            "acp-channels/resume": {
                **RESUME_META,
                "connectionId": connection_of(ws),
                "receivedNotification": RECEIVED_METHOD,
            },
            "acp-channels/sessions": {
                "directory": "/acp/sessions",
                "listMethod": "_acp-channels/sessions/list",
                "attach": {"header": "Acp-Attach-Session", "cursorHeader": "Acp-Attach-Cursor"},
            },
            # With the default settings: DETACHED_SECONDS, the longer, bounds retention.
            "acp/transport": {
                "resumable": {
                    "retentionMessages": 16384,
                    "retentionBytes": 2 * 1024 * 1024,
                    "retentionSeconds": 14400.0,
                }
            },
        }
        await send(ws, rpc(1, "not/initialize"))
        assert "_meta" not in json.dumps(await receive(ws))
    finally:
        await ws.close()


# -- the end of a connection -------------------------------------------------------------------


@wire_log_clean
@pytest.mark.parametrize("code", [1000, None], ids=["1000", "no-code"])
async def test_a_close_on_purpose_ends_the_connection_at_once(
    wire_server: DaphneServer | Cluster, http: httpx.AsyncClient, code: int | None
) -> None:
    """1000, or a close frame without a code (as the official TypeScript client sends): the
    client is done, the grace period (60 s) does not apply."""
    ws = await open_socket(wire_server.ws_url)
    connection_id = connection_of(ws)
    await ws.close(code=code)  # type: ignore[arg-type]  # None: a close frame without a code
    assert (await ended(wire_server, connection_id)).rstrip().endswith("reason=socket closed")
    assert await post_status(http, wire_server.url, connection_id, {}) == 404
    assert await refused_reattach(wire_server.ws_url, connection_id, "0") == (404, "")


async def test_the_grace_period_ends_an_abandoned_connection(
    guarded: DaphneServer | Cluster, http: httpx.AsyncClient
) -> None:
    """The socket that drops is a reattached one: on three workers it is on another worker than
    the host, whose grace period starts when that reader's lease ends."""
    alice = bearer(tokens.ALICE)
    first = await open_socket(on_worker(guarded, 0), alice)
    connection_id = connection_of(first)
    await send(first, rpc(1, "before/drop"))
    assert (await receive(first))["id"] == 1
    second, acknowledged = await reattach(on_worker(guarded, 1), connection_id, 1, alice)
    assert acknowledged == 1
    assert (await closed_with(first))[0] == 4409
    await drop(second)
    line = await ended(guarded, connection_id)  # no reattach within the grace period
    assert re.search(r"transport=websocket .*reason=socket closed$", line.rstrip()), line
    assert await post_status(http, guarded.url, connection_id, alice) == 404  # the agent is gone
    assert await refused_reattach(guarded.ws_url, connection_id, "1", alice) == (404, "")


async def test_initialize_advertises_the_grace_period(guarded: DaphneServer | Cluster) -> None:
    ws = await open_socket(guarded.ws_url, bearer(tokens.ALICE))
    try:
        await send(ws, rpc(0, "initialize", {"protocolVersion": 1}))
        resume = (await receive(ws))["result"]["_meta"]["acp-channels/resume"]
        assert (resume["websocket"], resume["websocketResumeSeconds"]) == (True, SHORT_GRACE)
    finally:
        await ws.close()


# -- refused reattaches ------------------------------------------------------------------------


async def test_a_reattach_by_another_principal_is_404_and_changes_nothing(guarded: DaphneServer | Cluster) -> None:
    alice = bearer(tokens.ALICE)
    ws = await open_socket(on_worker(guarded, 0), alice)
    connection_id = connection_of(ws)
    try:
        for worker in (0, 1):  # on three workers: the host's, and another that asks the host
            url = on_worker(guarded, worker)
            assert await refused_reattach(url, connection_id, "0", bearer(tokens.BOB)) == (404, "")
            assert await refused_reattach(url, connection_id, "0") == (403, "")  # no credentials
        await send(ws, rpc(1, "still/alice"))  # alice's socket was not displaced
        assert (await receive(ws))["id"] == 1
    finally:
        await ws.close()


@wire_log_clean
async def test_a_reattach_to_an_unknown_connection_is_404(wire_server: DaphneServer | Cluster) -> None:
    ws = await open_socket(on_worker(wire_server, 0))
    real = connection_of(ws)
    await ws.close()
    await ended(wire_server, real)
    made_up = f"{uuid.uuid4()}.{real.rpartition('.')[2]}"  # a worker that exists, a connection that does not
    for url in (on_worker(wire_server, 0), on_worker(wire_server, 1)):
        for connection_id in (made_up, real, "not-a-connection-id"):
            assert await refused_reattach(url, connection_id, "0") == (404, "")


@wire_log_clean
async def test_a_reattach_that_cannot_resume_is_409(wire_server: DaphneServer | Cluster) -> None:
    """The default window keeps 16384 messages: after 17001, the first ones cannot be sent again."""
    url = on_worker(wire_server, 1)  # on three workers: asking another worker's host
    ws = await open_socket(on_worker(wire_server, 0))
    connection_id = connection_of(ws)
    await send(ws, rpc(1, "test/burst", {"count": 17000}))
    received = len(await items_until_reply(ws, 1)) + 1
    await drop(ws)
    assert await refused_reattach(url, connection_id, "0") == (
        409,
        "Last-Event-ID 0 is older than the replay window of this stream; events were lost",
    )
    assert await refused_reattach(url, connection_id, str(received + 1)) == (
        409,
        f"Last-Event-ID {received + 1} does not belong to this stream",
    )
    ws, acknowledged = await reattach(url, connection_id, received)  # nothing missed: resumes
    assert acknowledged == 1
    await ws.close()


@wire_log_clean
async def test_malformed_reattaches_are_400(wire_server: DaphneServer | Cluster, http: httpx.AsyncClient) -> None:
    url = wire_server.ws_url
    ws = await open_socket(url)
    connection_id = connection_of(ws)
    try:
        for headers, text in (
            ({"Acp-Connection-Id": connection_id}, "a reattach names the connection"),
            ({"Last-Event-ID": "3"}, "a reattach names the connection"),
            ({"Acp-Connection-Id": connection_id, "Last-Event-ID": "abc-3"}, "the number of messages received"),
        ):
            with pytest.raises(InvalidStatus) as refused:
                await (await open_socket(url, headers)).close()
            assert refused.value.response.status_code == 400
            assert text in (refused.value.response.body or b"").decode()
        await send(ws, rpc(1, "still/attached"))
        assert (await receive(ws))["id"] == 1
    finally:
        await ws.close()
    # A connection over HTTP has no socket to reattach.
    response = await http.post(wire_server.url, headers=JSON, json=rpc(0, "initialize", {"protocolVersion": 1}))
    http_connection = response.headers["acp-connection-id"]
    assert await refused_reattach(url, http_connection, "0") == (
        409,
        "Acp-Connection-Id names a connection that has no WebSocket",
    )
    await http.delete(wire_server.url, headers={"Acp-Connection-Id": http_connection})


@wire_log_clean
async def test_browsers_reattach_with_query_parameters(wire_server: DaphneServer | Cluster) -> None:
    ws = await open_socket(on_worker(wire_server, 0))
    url = on_worker(wire_server, 1)
    connection_id = connection_of(ws)
    await send(ws, rpc(1, "test/burst", {"count": 5}))
    seen = [item_number(await receive(ws)) for _ in range(2)]
    await drop(ws)
    ws = await open_socket(f"{url}?acp_connection_id={connection_id}&last_event_id={len(seen)}")
    try:
        assert ws.response is not None and ws.response.headers["acp-received"] == "1"
        assert await received_message(ws) == 1  # a browser cannot read the header
        seen += await items_until_reply(ws, 1)
        assert seen == list(range(5))
    finally:
        await ws.close()


@wire_log_clean
async def test_a_browser_reattach_gets_acp_received_first_and_the_numbering_is_unchanged(
    wire_server: DaphneServer | Cluster,
) -> None:
    """The query form gets the count as a first message, which the server does not number: a
    later reattach after the messages counted without it resumes right after them. On three
    workers each socket is on another worker, the second and third on neither the host's."""
    ws = await open_socket(on_worker(wire_server, 0))
    connection_id = connection_of(ws)
    for number in (1, 2, 3):
        await send(ws, rpc(number, "custom/numbered"))
        assert (await receive(ws))["id"] == number
    await send(ws, rpc(4, "test/burst", {"count": 6}))
    seen = [item_number(await receive(ws)) for _ in range(2)]
    received = 3 + len(seen)
    await drop(ws)
    ws = await open_socket(f"{on_worker(wire_server, 1)}?acp_connection_id={connection_id}&last_event_id={received}")
    assert ws.response is not None and ws.response.headers["acp-received"] == "4"
    assert await received_message(ws) == 4
    seen += [item_number(await receive(ws)) for _ in range(2)]  # messages 6 and 7: items 2 and 3
    received += 2
    await drop(ws)
    # The header form, as before: no such message, and the next one is message `received` + 1.
    ws, acknowledged = await reattach(on_worker(wire_server, 2), connection_id, received)
    try:
        assert acknowledged == 4
        seen += await items_until_reply(ws, 4)  # item_number refuses anything but an item
        assert seen == list(range(6))
    finally:
        await ws.close()


@wire_log_clean
async def test_a_client_may_ask_for_acp_received_as_a_message(wire_server: DaphneServer | Cluster) -> None:
    ws = await open_socket(on_worker(wire_server, 0))
    connection_id = connection_of(ws)
    await send(ws, rpc(1, "custom/numbered"))
    assert (await receive(ws))["id"] == 1
    await drop(ws)
    url = on_worker(wire_server, 1)
    with pytest.raises(InvalidStatus) as refused:
        await (
            await open_socket(f"{url}?acp_received=yes", {"Acp-Connection-Id": connection_id, "Last-Event-ID": "1"})
        ).close()
    assert refused.value.response.status_code == 400
    assert (refused.value.response.body or b"").decode() == "acp_received is 'message' or absent"
    ws = await open_socket(f"{url}?acp_received=message", {"Acp-Connection-Id": connection_id, "Last-Event-ID": "1"})
    try:
        assert await received_message(ws) == 1
        await send(ws, rpc(2, "after/reattach"))
        assert (await receive(ws))["id"] == 2
    finally:
        await ws.close()
