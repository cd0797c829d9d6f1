"""HttpClient against fake servers: the reference client's contract step by step (docs/wire-contract.md
§13), and every error path (a non-2xx answer, a missing header, a stream that ends, malformed
data, a response that never comes). HTTP fakes are raw asyncio servers (tests/peers/fakes.py);
WebSocket fakes use the `websockets` server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Request as WsRequest
from websockets.http11 import Response as WsResponse

from acp_channels.client import (
    ClientUsageError,
    HttpClient,
    HttpStatusError,
    NetworkError,
    ProtocolViolationError,
    StreamDrop,
    StreamEndedError,
    TransportClosedError,
    TransportTimeoutError,
    WebSocketClosedError,
)
from tests.peers.fakes import (
    CONNECTION_ID,
    Answer,
    Drop,
    FakeAcp,
    Hang,
    Reply,
    Request,
    Stream,
    sse,
    within,
)

pytestmark = pytest.mark.timeout(30)

INIT: dict[str, Any] = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}


def rpc(request_id: Any, method: str, params: Any = None) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return message


def note(method: str, params: Any = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method, "params": params or {}}


def result(request_id: Any, value: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": value}


async def started(fake: FakeAcp, **options: Any) -> HttpClient:
    """A client that has initialized against `fake` (the init reply already taken)."""
    client = HttpClient(fake.url, timeout=options.pop("timeout", 5.0), **options)
    await within(client.send(INIT))
    assert (await within(client.receive()))["result"] == {"protocolVersion": 1}
    return client


# ----------------------------------------------------------------------------- the contract


async def test_contract_walkthrough(fake: FakeAcp) -> None:
    """Headers and streams of a whole session, in the order the reference client uses them."""
    fake.init_headers = {"set-cookie": "lb=node-7; Path=/"}

    async def on_call(request: Request) -> None:
        message = request.json()
        if message.get("method") == "session/new":
            fake.push(None, result(message["id"], {"sessionId": "s1"}))
        elif message.get("method") == "session/prompt":
            fake.push("s1", rpc(0, "session/request_permission", {"sessionId": "s1"}))
            fake.push(None, rpc("c-1", "x/connection_question", {}))

    fake.on_call = on_call
    client = await started(fake, headers={"Authorization": "Bearer secret"})
    init = fake.requests[0]
    assert init.headers["content-type"] == "application/json"
    assert init.headers["accept"] == "application/json"
    assert init.headers["authorization"] == "Bearer secret"
    assert "acp-connection-id" not in init.headers
    connection_get = fake.requests[1]
    assert connection_get.sse and connection_get.connection_id == CONNECTION_ID
    assert connection_get.session_id is None
    assert connection_get.headers["authorization"] == "Bearer secret"
    assert connection_get.headers["cookie"] == "lb=node-7"  # kept for the connection

    await within(client.send(rpc(1, "session/new", {"cwd": "/", "mcpServers": []})))
    assert (await within(client.receive()))["result"] == {"sessionId": "s1"}
    await within(fake.wait_for(lambda: bool(fake.of("GET", session_id="s1"))))

    await within(client.send(rpc(2, "session/prompt", {"sessionId": "s1", "prompt": []})))
    prompt = fake.of("POST", rpc_method="session/prompt")[0]
    assert prompt.session_id == "s1" and prompt.connection_id == CONNECTION_ID
    assert prompt.headers["cookie"] == "lb=node-7"
    s1_open = fake.index("stream-open", lambda request: request.session_id == "s1")
    assert s1_open < fake.index("request", lambda request: request is prompt)

    # Two agent requests: one on the session stream, one on the connection stream.
    asked = [await within(client.receive()), await within(client.receive())]
    by_id = {message["id"]: message for message in asked}
    assert set(by_id) == {0, "c-1"}
    await within(client.send(result(0, {"outcome": {"outcome": "cancelled"}})))
    await within(client.send(result("c-1", {})))
    responses = [r for r in fake.of("POST") if r.rpc_method is None]
    assert [(r.json()["id"], r.session_id) for r in responses] == [(0, "s1"), ("c-1", None)]

    await within(client.send(note("$/cancel_request", {"requestId": 2})))
    assert fake.of("POST", rpc_method="$/cancel_request")[0].session_id is None

    await within(client.close())
    deletes = fake.of("DELETE")
    assert len(deletes) == 1
    assert deletes[0].connection_id == CONNECTION_ID and deletes[0].session_id is None
    assert deletes[0].headers["authorization"] == "Bearer secret"
    assert deletes[0].headers["cookie"] == "lb=node-7"
    assert await within(client.receive()) is None
    with pytest.raises(TransportClosedError):
        await client.send(rpc(3, "x/late"))


async def test_next_call_waits_for_the_connection_stream(fake: FakeAcp) -> None:
    gate = asyncio.Event()

    async def on_get(request: Request) -> Answer:
        await gate.wait()
        return Stream(fake.feed(request.session_id))

    fake.on_get = on_get
    client = HttpClient(fake.url, timeout=5)
    sending = asyncio.ensure_future(client.send(INIT))
    await within(fake.wait_for(lambda: bool(fake.of("GET"))))
    assert not sending.done()  # initialize is not finished until the stream answered
    gate.set()
    await within(sending)
    await within(client.send(rpc(1, "x/next")))
    assert fake.index("stream-open") < fake.index("request", lambda r: r.rpc_method == "x/next")
    await client.close()


async def test_session_stream_opens_before_the_first_message_for_it(fake: FakeAcp) -> None:
    gate = asyncio.Event()

    async def on_get(request: Request) -> Answer:
        if request.session_id == "s9":
            await gate.wait()
        return Stream(fake.feed(request.session_id))

    fake.on_get = on_get
    client = await started(fake)
    sending = asyncio.ensure_future(client.send(rpc(5, "session/load", {"sessionId": "s9", "cwd": "/"})))
    await within(fake.wait_for(lambda: bool(fake.of("GET", session_id="s9"))))
    with pytest.raises(TimeoutError):  # nothing is POSTed while the session stream is pending
        await fake.wait_for(lambda: bool(fake.of("POST", rpc_method="session/load")), timeout=0.2)
    gate.set()
    await within(sending)
    load = fake.of("POST", rpc_method="session/load")[0]
    assert load.session_id == "s9"
    assert fake.index("stream-open", lambda r: r.session_id == "s9") < fake.index("request", lambda r: r is load)
    await client.close()


async def test_any_reply_naming_a_session_opens_its_stream(fake: FakeAcp) -> None:
    """session/fork's reply, and an extension method's reply naming `result.sessionId` (the
    reference client opens streams for session/new and session/fork only; servers create
    session streams on demand)."""

    async def on_call(request: Request) -> None:
        message = request.json()
        if message.get("method") == "session/fork":
            fake.push("s1", result(message["id"], {"sessionId": "s2"}))
        elif message.get("method") == "x/custom":
            fake.push(None, result(message["id"], {"sessionId": "s3"}))

    fake.on_call = on_call
    client = await started(fake)
    await within(client.send(rpc(1, "x/custom")))
    await within(client.receive())
    await within(client.send(rpc(2, "session/fork", {"sessionId": "s1", "cwd": "/"})))
    assert (await within(client.receive()))["result"] == {"sessionId": "s2"}
    await within(fake.wait_for(lambda: bool(fake.of("GET", session_id="s2"))))
    fork = fake.of("POST", rpc_method="session/fork")[0]
    assert fork.session_id == "s1"
    assert fake.index("stream-open", lambda r: r.session_id == "s1") < fake.index("request", lambda r: r is fork)
    await within(fake.wait_for(lambda: bool(fake.of("GET", session_id="s3"))))
    await client.close()


async def test_call_posts_keep_their_order_and_responses_pass_a_pending_call(fake: FakeAcp) -> None:
    release = asyncio.Event()

    async def on_post(request: Request) -> Answer:
        if request.rpc_method == "x/slow":
            await release.wait()
        return Reply(202)

    fake.on_post = on_post
    client = await started(fake)
    slow = asyncio.ensure_future(client.send(rpc(1, "x/slow")))
    await within(fake.wait_for(lambda: bool(fake.of("POST", rpc_method="x/slow"))))
    after = asyncio.ensure_future(client.send(rpc(2, "x/after")))
    fake.push(None, rpc(7, "x/question"))  # streams keep delivering while the call is pending
    assert (await within(client.receive()))["id"] == 7
    await within(client.send(result(99, {})))  # a response-only POST passes the pending call
    await within(client.send([result(100, {}), result(101, None)]))  # so does a response batch
    assert not fake.of("POST", rpc_method="x/after") and not slow.done() and not after.done()
    release.set()
    await within(asyncio.gather(slow, after))
    posts = [r.rpc_method or "response" for r in fake.of("POST")]
    assert posts == ["initialize", "x/slow", "response", "<batch>", "x/after"]
    await client.close()


async def test_responses_move_and_failures_surface_while_a_stream_is_pending(fake: FakeAcp) -> None:
    async def on_get(request: Request) -> Answer:
        return Hang() if request.session_id else Stream(fake.feed(None))

    async def on_post(request: Request) -> Answer:
        return Reply(500, "no") if request.json().get("id") == "bad" else Reply(202)

    fake.on_get, fake.on_post = on_get, on_post
    client = await started(fake, timeout=30)
    blocked = asyncio.ensure_future(client.send(rpc(1, "session/prompt", {"sessionId": "s1", "prompt": []})))
    await within(fake.wait_for(lambda: bool(fake.of("GET", session_id="s1"))))
    await within(client.send(result("fine", {})))  # the response lane is not blocked
    with pytest.raises(HttpStatusError):
        await within(client.send(result("bad", {})))
    with pytest.raises(HttpStatusError):  # the blocked call sees the failure at once
        await within(blocked)
    await within(client.close())
    assert len(fake.of("DELETE")) == 1


async def test_batches_are_kept_both_ways(fake: FakeAcp) -> None:
    client = await started(fake)
    batch = [rpc(1, "session/prompt", {"sessionId": "s1", "prompt": []}), note("session/cancel", {"sessionId": "s2"})]
    await within(client.send(batch))
    posted = fake.of("POST", rpc_method="<batch>")[0]
    sent = posted.json()
    operation = sent[0]["params"].pop("_meta")  # a prompt names its operation (docs/shared-sessions.md)
    assert list(operation) == ["acp-channels/operationId"]
    assert sent == batch and posted.session_id is None
    assert {r.session_id for r in fake.of("GET")} == {None, "s1", "s2"}  # opened before the POST

    grouped = [result(1, {"stopReason": "end_turn"}), {"jsonrpc": "2.0", "id": None, "error": {"code": -1}}]
    fake.push(None, grouped)
    assert await within(client.receive_frame()) == grouped
    fake.push(None, grouped)
    assert await within(client.receive()) == grouped[0]  # message level: entry by entry
    assert await within(client.receive()) == grouped[1]
    await client.close()


async def test_malformed_sse_data_is_passed_up_and_the_transport_continues(fake: FakeAcp) -> None:
    client = await started(fake)
    fake.push(None, b"data: {not json\n\n")
    fake.push(None, b"data: 17\n\n")
    fake.push(None, b'data: {"jsonrpc":\n' + b'data: "2.0","method":"x/split"}\r\n\r\n')
    parse_error = await within(client.receive())
    assert parse_error == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32700, "message": "Parse error", "data": {"line": "{not json"}},
    }
    assert (await within(client.receive()))["error"]["code"] == -32600
    assert (await within(client.receive()))["method"] == "x/split"  # multi-line data joined
    await within(client.send(rpc(1, "x/still-works")))
    assert client.error is None
    await client.close()


# ------------------------------------------------------------------------------ fatal errors


async def test_post_error_is_fatal_and_deletes_the_connection(fake: FakeAcp) -> None:
    async def on_post(request: Request) -> Answer:
        return Reply(500, "agent input closed")

    client = await started(fake)
    fake.on_post = on_post
    with pytest.raises(HttpStatusError) as failure:
        await within(client.send(rpc(1, "x/boom")))
    assert failure.value.status_code == 500 and failure.value.body == "agent input closed"
    await within(fake.wait_for(lambda: bool(fake.of("DELETE"))))
    with pytest.raises(HttpStatusError):
        await within(client.receive())
    with pytest.raises(TransportClosedError) as closed:
        await client.send(rpc(2, "x/after"))
    assert closed.value.__cause__ is failure.value
    await within(client.close())
    assert len(fake.of("DELETE")) == 1


async def test_initialize_error_status_deletes_a_connection_id_it_was_given(fake: FakeAcp) -> None:
    async def on_initialize(request: Request) -> Answer:
        return Reply(503, "busy", {"acp-connection-id": "c-half"})

    fake.on_initialize = on_initialize
    client = HttpClient(fake.url, timeout=5)
    with pytest.raises(HttpStatusError, match="initialize: HTTP 503: busy"):
        await within(client.send(INIT))
    await within(fake.wait_for(lambda: bool(fake.of("DELETE"))))
    assert fake.of("DELETE")[0].connection_id == "c-half"
    await client.close()
    assert len(fake.of("DELETE")) == 1 and not fake.of("GET")


@pytest.mark.parametrize(
    ("body", "headers", "message", "deleted"),
    [
        (result(0, {}), {}, "did not return acp-connection-id", False),
        ([result(0, {})], {"acp-connection-id": "c-1"}, "must not be a JSON-RPC batch", True),
        ("{not json", {"acp-connection-id": "c-1"}, "not a JSON-RPC message", True),
        (result(7, {}), {"acp-connection-id": "c-1"}, "does not answer the initialize request", True),
    ],
)
async def test_bad_initialize_answers_are_fatal(
    fake: FakeAcp, body: Any, headers: dict[str, str], message: str, deleted: bool
) -> None:
    async def on_initialize(request: Request) -> Answer:
        return Reply(200, body, {"content-type": "application/json", **headers})

    fake.on_initialize = on_initialize
    client = HttpClient(fake.url, timeout=5)
    with pytest.raises(ProtocolViolationError, match=message):
        await within(client.send(INIT))
    await within(client.close())
    assert len(fake.of("DELETE")) == (1 if deleted else 0)
    assert not fake.of("GET")


async def test_initialize_error_reply_is_delivered_and_the_client_may_retry(fake: FakeAcp) -> None:
    rejected = {"jsonrpc": "2.0", "id": 0, "error": {"code": -32600, "message": "no"}}
    answers = [Reply(200, rejected, {"acp-connection-id": "c-rejected"})]

    async def on_initialize(request: Request) -> Answer:
        if answers:
            return answers.pop()
        return Reply(200, result(0, {"protocolVersion": 1}), {"acp-connection-id": CONNECTION_ID})

    fake.on_initialize = on_initialize
    client = HttpClient(fake.url, timeout=5)
    await within(client.send(INIT))
    assert await within(client.receive()) == rejected
    assert [r.connection_id for r in fake.of("DELETE")] == ["c-rejected"]
    assert not fake.of("GET") and client.connection_id is None
    await within(client.send(INIT))
    assert (await within(client.receive()))["result"] == {"protocolVersion": 1}
    assert client.connection_id == CONNECTION_ID
    with pytest.raises(ClientUsageError, match="already initialized"):
        await client.send(INIT)
    await client.close()


async def test_connection_stream_end_is_fatal(fake: FakeAcp) -> None:
    client = await started(fake)
    fake.push(None, note("x/last"))
    fake.push(None, None)  # the body ends cleanly
    assert (await within(client.receive()))["method"] == "x/last"  # what came first is delivered
    with pytest.raises(StreamEndedError, match="connection SSE stream ended") as ended:
        await within(client.receive())
    assert ended.value.session_id is None
    await within(fake.wait_for(lambda: bool(fake.of("DELETE"))))
    await client.close()
    assert len(fake.of("DELETE")) == 1


async def test_broken_session_stream_is_fatal(fake: FakeAcp) -> None:
    break_now = asyncio.Event()

    async def on_get(request: Request) -> Answer:
        if request.session_id == "s1":

            async def one_event() -> AsyncIterator[bytes]:
                yield sse(note("x/partial", {"sessionId": "s1"}))
                await break_now.wait()
                yield b'data: {"trunc'

            return Stream(one_event(), drop=True)
        return Stream(fake.feed(request.session_id))

    fake.on_get = on_get
    client = await started(fake)
    await within(client.send(note("session/cancel", {"sessionId": "s1"})))
    assert (await within(client.receive()))["method"] == "x/partial"
    break_now.set()
    with pytest.raises(StreamEndedError, match="session 's1' SSE stream ended") as ended:
        await within(client.receive())
    assert ended.value.session_id == "s1"
    await within(fake.wait_for(lambda: bool(fake.of("DELETE"))))
    await client.close()


@pytest.mark.parametrize("status", [404, 409])
async def test_stream_refused_is_fatal(fake: FakeAcp, status: int) -> None:
    async def on_get(request: Request) -> Answer:
        if request.session_id is None:
            return Stream(fake.feed(None))
        return Reply(status, "outbound stream already has a subscriber")

    fake.on_get = on_get
    client = await started(fake)
    with pytest.raises(HttpStatusError) as failure:
        await within(client.send(rpc(1, "session/prompt", {"sessionId": "s1", "prompt": []})))
    assert failure.value.status_code == status and "session stream 's1'" in str(failure.value)
    assert not fake.of("POST", rpc_method="session/prompt")
    await within(client.close())
    assert len(fake.of("DELETE")) == 1


async def test_a_response_that_never_comes_times_out(fake: FakeAcp) -> None:
    async def on_post(request: Request) -> Answer:
        return Hang()

    client = await started(fake, timeout=0.3)
    fake.on_post = on_post
    with pytest.raises(TransportTimeoutError, match=r"POST x/hang: no answer within 0\.3s"):
        await within(client.send(rpc(1, "x/hang")))
    await within(fake.wait_for(lambda: bool(fake.of("DELETE"))))
    await within(client.close())


async def test_an_initialize_that_never_answers_times_out(fake: FakeAcp) -> None:
    async def on_initialize(request: Request) -> Answer:
        return Hang()

    fake.on_initialize = on_initialize
    client = HttpClient(fake.url, timeout=0.3)
    with pytest.raises(TransportTimeoutError):
        await within(client.send(INIT))
    await within(client.close())
    assert not fake.of("DELETE")


async def test_stream_headers_that_never_come_time_out(fake: FakeAcp) -> None:
    async def on_get(request: Request) -> Answer:
        return Hang() if request.session_id else Stream(fake.feed(None))

    fake.on_get = on_get
    client = await started(fake, timeout=0.3)
    with pytest.raises(TransportTimeoutError, match="no response headers"):
        await within(client.send(note("session/cancel", {"sessionId": "s1"})))
    await within(fake.wait_for(lambda: bool(fake.of("DELETE"))))
    await within(client.close())
    assert len(fake.of("DELETE")) == 1


async def test_a_silent_stream_counts_as_dropped_after_the_idle_timeout(fake: FakeAcp) -> None:
    client = await started(fake, stream_idle_timeout=0.3)  # the fake sends no keep-alives
    with pytest.raises(StreamEndedError, match=r"no data for 0\.3s"):
        await within(client.receive())
    await within(fake.wait_for(lambda: bool(fake.of("DELETE"))))
    await client.close()


async def test_close_does_not_wait_for_a_stream_that_never_opens(fake: FakeAcp) -> None:
    async def on_get(request: Request) -> Answer:
        return Hang() if request.session_id else Stream(fake.feed(None))

    fake.on_get = on_get
    client = await started(fake, timeout=30)
    blocked = asyncio.ensure_future(client.send(rpc(1, "session/prompt", {"sessionId": "s1", "prompt": []})))
    await within(fake.wait_for(lambda: bool(fake.of("GET", session_id="s1"))))
    await within(client.close(), 2.0)
    with pytest.raises(TransportClosedError):
        await within(blocked)
    assert len(fake.of("DELETE")) == 1
    assert not fake.of("POST", rpc_method="session/prompt")


async def test_server_dropping_the_connection_on_a_post_is_fatal(fake: FakeAcp) -> None:
    async def on_post(request: Request) -> Answer:
        return Drop()

    client = await started(fake)
    fake.on_post = on_post
    with pytest.raises(NetworkError):
        await within(client.send(rpc(1, "x/drop")))
    await within(client.close())
    assert len(fake.of("DELETE")) == 1


# -------------------------------------------------------------------- the reconnect hook


async def test_reconnect_policy_reopens_a_dropped_stream_with_last_event_id(fake: FakeAcp) -> None:
    gets: list[Request] = []

    async def on_get(request: Request) -> Answer:
        if request.session_id is not None:
            return Stream(fake.feed(request.session_id))
        gets.append(request)

        async def events() -> AsyncIterator[bytes]:
            yield b": \n\n"
            if len(gets) == 1:
                yield sse(note("x/one"), event_id="1") + sse(note("x/two"), event_id="2")
            else:
                yield sse(note("x/three"), event_id="3")
                await asyncio.Event().wait()  # then stays open

        return Stream(events())

    drops: list[StreamDrop] = []

    def policy(drop: StreamDrop) -> float | None:
        drops.append(drop)
        return 0.0 if drop.attempt == 1 else None

    fake.on_get = on_get
    client = await started(fake, reconnect=policy)
    methods = [(await within(client.receive()))["method"] for _ in range(3)]
    assert methods == ["x/one", "x/two", "x/three"]
    assert "last-event-id" not in gets[0].headers
    assert gets[1].headers["last-event-id"] == "2"
    assert len(drops) == 1 and drops[0].session_id is None and drops[0].last_event_id == "2"
    assert isinstance(drops[0].error, StreamEndedError)
    assert client.transport.stream_event_id(None) == "3"  # type: ignore[union-attr]
    assert client.error is None and not fake.of("DELETE")
    await client.close()


# ------------------------------------------------------------------------- refused locally


async def test_session_methods_without_a_session_id_are_refused_before_anything_is_sent(fake: FakeAcp) -> None:
    client = await started(fake)
    before = len(fake.requests)
    with pytest.raises(ClientUsageError, match=r"session/prompt needs params\.sessionId"):
        await client.send(rpc(1, "session/prompt", {"prompt": []}))
    with pytest.raises(ClientUsageError, match="session/cancel"):
        await client.send([rpc(2, "x/fine"), note("session/cancel")])
    assert len(fake.requests) == before and client.error is None
    await client.close()


# ------------------------------------------------------------------------------- WebSocket


class FakeWs:
    """A `websockets` server running `handler` per connection, recording upgrade headers."""

    def __init__(self, handler: Any, *, reject: int | None = None) -> None:
        self.handler = handler
        self.reject = reject
        self.upgrades: list[Headers] = []

    def process_request(self, connection: ServerConnection, request: WsRequest) -> WsResponse | None:
        self.upgrades.append(request.headers)
        if self.reject is not None:
            return connection.respond(self.reject, "origin not allowed\n")
        return None

    def process_response(self, connection: ServerConnection, request: WsRequest, response: WsResponse) -> None:
        response.headers["acp-connection-id"] = "ws-conn-1"
        response.headers["Set-Cookie"] = "lb=ws-node; Path=/"

    async def __aenter__(self) -> str:
        self._server = await serve(
            self.handler, "127.0.0.1", 0, process_request=self.process_request, process_response=self.process_response
        )
        port = next(iter(self._server.sockets)).getsockname()[1]
        return f"ws://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        await within(self._server.wait_closed())


async def test_websocket_frames_both_ways() -> None:
    received: list[Any] = []
    done = asyncio.Event()

    async def handler(ws: ServerConnection) -> None:
        received.append(json.loads(await ws.recv()))
        received.append(json.loads(await ws.recv()))
        await ws.send(b"binary is ignored")
        await ws.send("{not json")
        await ws.send(json.dumps([result(1, {}), result(2, {})]))
        await ws.send(json.dumps(note("x/after")))
        await done.wait()

    fake = FakeWs(handler)
    async with fake as url, HttpClient(url, headers={"Authorization": "Bearer ws"}, timeout=5) as client:
        assert client.connection_id == "ws-conn-1"
        assert client.cookies.get("lb") == "ws-node"
        assert fake.upgrades[0]["Authorization"] == "Bearer ws"
        await within(client.send(rpc(1, "x/first")))  # no initialize gate over WebSocket
        await within(client.send([rpc(1, "a"), rpc(2, "b")]))
        assert (await within(client.receive_frame()))["error"]["code"] == -32700  # type: ignore[call-overload]
        assert await within(client.receive_frame()) == [result(1, {}), result(2, {})]
        assert (await within(client.receive()))["method"] == "x/after"  # type: ignore[index]
        assert received == [rpc(1, "x/first"), [rpc(1, "a"), rpc(2, "b")]]
        done.set()


@pytest.mark.parametrize("how", ["close", "abort"])
async def test_websocket_closed_by_the_server_is_fatal(how: str) -> None:
    async def handler(ws: ServerConnection) -> None:
        await ws.recv()
        await ws.send(json.dumps(result(0, {})))
        if how == "close":
            await ws.close(1011, "agent gone")
        else:
            ws.transport.abort()

    async with FakeWs(handler) as url:
        client = HttpClient(url, timeout=5)
        await within(client.send(INIT))
        assert (await within(client.receive()))["id"] == 0
        with pytest.raises(WebSocketClosedError) as closed:
            await within(client.receive())
        if how == "close":
            assert (closed.value.code, closed.value.reason) == (1011, "agent gone")
        else:
            assert closed.value.code is None
        with pytest.raises(TransportClosedError):
            await client.send(rpc(1, "x/late"))
        await within(client.close())


async def test_websocket_upgrade_refused() -> None:
    async def handler(ws: ServerConnection) -> None:
        raise AssertionError("not reached")

    async with FakeWs(handler, reject=403) as url:
        client = HttpClient(url, timeout=5)
        with pytest.raises(HttpStatusError) as refused:
            await within(client.send(INIT))
        assert refused.value.status_code == 403 and "origin not allowed" in refused.value.body
        with pytest.raises(HttpStatusError):
            await within(client.receive())
        await client.close()
