"""HttpClient reconnecting dropped streams and sockets (docs/resumable-streams.md), against fakes
that resume (tests/peers/resumable.py), with connections cut by a proxy in the middle of a
burst (tests/cut_proxy.py): every message arrives exactly once and in order, or the client
fails with an error naming what happened. The same against our server is in
test_resume_live.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from acp_channels.client import (
    Backoff,
    HttpClient,
    ReconnectGaveUpError,
    ResumeFailedError,
    ResumeRefusedError,
    StreamEndedError,
    WebSocketClosedError,
)
from acp_channels.client import _transport_ws as transport_ws
from tests.cut_proxy import CutProxy, session_stream, streams, websocket
from tests.peers.fakes import CONNECTION_ID, Answer, FakeAcp, Reply, Request, within
from tests.peers.resumable import EventLog, ResumableSse, ResumableWs, notification, rpc_result

pytestmark = pytest.mark.timeout(60)

INIT: dict[str, Any] = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}
#: Retry at once and every 20 ms: the tests wait for events, never for the clock.
FAST = Backoff(initial=0.02, maximum=0.05, give_up_after=10.0, jitter=0)


def rpc(request_id: Any, method: str, params: Any = None) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return message


@pytest.fixture
async def proxied(fake: FakeAcp) -> AsyncIterator[CutProxy]:
    async with CutProxy(fake.port) as proxy:
        yield proxy


async def initialized(url: str, **options: Any) -> HttpClient:
    client = HttpClient(url, timeout=5.0, **options)
    await within(client.send(INIT))
    assert "result" in (await within(client.receive()))  # type: ignore[operator]
    return client


async def receive_items(client: HttpClient, count: int) -> list[int]:
    """The `index` of the next `count` x/item notifications (anything else fails)."""
    indexes = []
    for _ in range(count):
        message = await within(client.receive(), 20)
        assert message is not None and message.get("method") == "x/item", message
        indexes.append(message["params"]["index"])
    return indexes


def burst(resumable: ResumableSse, session_id: str | None, count: int, pad: int = 100) -> None:
    for index in range(count):
        resumable.push(session_id, notification("x/item", {"index": index, "pad": "x" * pad}))


# ------------------------------------------------------------------------- SSE: resumed


@pytest.mark.parametrize("advertise", [True, False], ids=["advertised", "ids-only"])
async def test_a_cut_mid_burst_loses_and_repeats_nothing(fake: FakeAcp, proxied: CutProxy, advertise: bool) -> None:
    resumable = ResumableSse(fake, advertise=advertise)
    events = EventLog()
    client = await initialized(proxied.url, reconnect=FAST, on_reconnect=events)
    cut = proxied.cut_after(7_000, session_stream(None))  # in the middle of an event
    burst(resumable, None, 300)
    assert await receive_items(client, 300) == list(range(300))
    assert (await within(cut)).cut
    resumed = [r for r in fake.of("GET") if "last-event-id" in r.headers]
    assert len(resumed) == 1 and resumed[0].headers["last-event-id"].startswith("t1-")
    assert events.kinds() == ["reconnecting", "resumed"]
    assert events.seen[0].what == "connection stream" and events.seen[0].attempt == 1
    assert not client.reconnecting and client.error is None
    await client.close()


async def test_a_session_stream_cut_twice_then_taken_over(fake: FakeAcp, proxied: CutProxy) -> None:
    """Cuts of a session stream, one leaving the server's side open (it still believes its
    reader is there): the new GET takes the stream over."""
    resumable = ResumableSse(fake)

    async def on_call(request: Request) -> None:
        if request.rpc_method == "session/new":
            resumable.push(None, rpc_result(request.json()["id"], {"sessionId": "s1"}))

    fake.on_call = on_call
    client = await initialized(proxied.url, reconnect=FAST)
    await within(client.send(rpc(1, "session/new", {"cwd": "/", "mcpServers": []})))
    assert (await within(client.receive()))["result"] == {"sessionId": "s1"}  # type: ignore[index]
    await within(fake.wait_for(lambda: bool(fake.of("GET", session_id="s1"))))
    first = proxied.cut_after(3_000, session_stream("s1"))
    second = proxied.cut_after(20_000, session_stream("s1"), keep_upstream=True)
    burst(resumable, "s1", 400)
    assert await receive_items(client, 400) == list(range(400))
    await within(asyncio.gather(first, second))
    assert len(fake.of("GET", session_id="s1")) == 3
    await client.close()


async def test_events_sent_again_are_skipped(fake: FakeAcp, proxied: CutProxy) -> None:
    """A server that replays from before the id asked for: the client delivers each once."""
    resumable = ResumableSse(fake)
    resumable.replay_overlap = 5
    client = await initialized(proxied.url, reconnect=FAST)
    cut = proxied.cut_after(4_000, session_stream(None))
    burst(resumable, None, 100)
    assert await receive_items(client, 100) == list(range(100))
    await within(cut)
    await client.close()


async def test_a_stream_without_ids_is_resumed_only_when_advertised(fake: FakeAcp, proxied: CutProxy) -> None:
    resumable = ResumableSse(fake, ids=False, advertise=True)
    events = EventLog()
    client = await initialized(proxied.url, reconnect=FAST, on_reconnect=events)
    proxied.cut(session_stream(None))
    await events.wait_for("resumed")
    assert "last-event-id" not in fake.of("GET")[-1].headers
    resumable.push(None, notification("x/item", {"index": 0}))
    assert await receive_items(client, 1) == [0]
    await client.close()


async def test_a_409_to_a_plain_retry_is_retried(fake: FakeAcp, proxied: CutProxy) -> None:
    """Without an id to resume from, 409 means the server still holds the old response."""
    resumable = ResumableSse(fake, ids=False)
    held = Reply(409, "stream already has a reader", {"content-type": "text/plain"})
    refusals = [held, held]

    async def on_get(request: Request) -> Any:
        if len(fake.of("GET")) > 1 and refusals:
            return refusals.pop()
        return await original(request)

    original, fake.on_get = fake.on_get, on_get
    events = EventLog()
    client = await initialized(proxied.url, reconnect=FAST, on_reconnect=events)
    proxied.cut(session_stream(None))
    await events.wait_for("resumed")
    assert events.kinds() == ["reconnecting"] * 3 + ["resumed"]
    resumable.push(None, notification("x/item", {"index": 0}))
    assert await receive_items(client, 1) == [0]
    await client.close()


# ---------------------------------------------------------------------- SSE: not resumed


async def test_no_ids_and_no_advertisement_keeps_a_drop_fatal(fake: FakeAcp, proxied: CutProxy) -> None:
    ResumableSse(fake, ids=False, advertise=False)
    events = EventLog()
    client = await initialized(proxied.url, on_reconnect=events)  # the default Backoff
    proxied.cut(session_stream(None))
    with pytest.raises(StreamEndedError):
        await within(client.receive())
    assert events.seen == [] and len(fake.of("GET")) == 1
    await client.close()


async def test_reconnect_none_keeps_every_drop_fatal(fake: FakeAcp, proxied: CutProxy) -> None:
    ResumableSse(fake)
    client = await initialized(proxied.url, reconnect=None)
    proxied.cut(session_stream(None))
    with pytest.raises(StreamEndedError):
        await within(client.receive())
    assert len(fake.of("GET")) == 1
    await client.close()


@pytest.mark.parametrize(
    "body",
    [
        "Last-Event-ID t1-3 is older than the replay window of this stream; events were lost",
        "Last-Event-ID t1-3 does not belong to this stream",
    ],
)
async def test_a_409_to_a_resume_is_fatal_and_says_why(fake: FakeAcp, proxied: CutProxy, body: str) -> None:
    resumable = ResumableSse(fake)
    resumable.refusals.append(Reply(409, body, {"content-type": "text/plain"}))
    events = EventLog()
    client = await initialized(proxied.url, reconnect=FAST, on_reconnect=events)
    burst(resumable, None, 3)
    assert await receive_items(client, 3) == [0, 1, 2]
    proxied.cut(session_stream(None))
    with pytest.raises(ResumeRefusedError) as refused:
        await within(client.receive())
    assert refused.value.status_code == 409 and body in str(refused.value)
    assert "GET connection stream" in str(refused.value)
    assert events.kinds() == ["reconnecting", "gave-up"] and events.seen[-1].error is refused.value
    await within(fake.wait_for(lambda: bool(fake.of("DELETE"))))
    await client.close()


async def test_giving_up_after_the_bounded_time(fake: FakeAcp, proxied: CutProxy) -> None:
    resumable = ResumableSse(fake)
    resumable.refusals.extend([Reply(503, "busy")] * 1000)
    events = EventLog()
    client = await initialized(
        proxied.url, reconnect=Backoff(initial=0.01, maximum=0.05, give_up_after=0.5), on_reconnect=events
    )
    burst(resumable, None, 1)
    assert await receive_items(client, 1) == [0]
    proxied.cut(session_stream(None))
    with pytest.raises(ReconnectGaveUpError) as gave_up:
        await within(client.receive())
    assert gave_up.value.attempts >= 2 and gave_up.value.elapsed >= 0.5
    assert "gave up reconnecting the connection stream after" in str(gave_up.value)
    assert "HTTP 503" in str(gave_up.value.last_error)
    assert events.kinds()[-1] == "gave-up" and set(events.kinds()[:-1]) == {"reconnecting"}
    await client.close()


async def test_a_404_without_restart_is_fatal_and_says_so(fake: FakeAcp, proxied: CutProxy) -> None:
    resumable = ResumableSse(fake)
    resumable.refusals.append(Reply(404))
    client = await initialized(proxied.url, reconnect=FAST)
    burst(resumable, None, 1)
    await receive_items(client, 1)
    proxied.cut(session_stream(None))
    with pytest.raises(ResumeRefusedError) as gone:
        await within(client.receive())
    assert gone.value.status_code == 404
    assert f"connection {CONNECTION_ID} is gone on the server" in str(gone.value)
    assert "not restarting: restart is off" in str(gone.value)
    await client.close()


# ------------------------------------------------------------------------------ SSE: restart


async def test_restart_initializes_again_and_loads_the_sessions(fake: FakeAcp, proxied: CutProxy) -> None:
    resumable = ResumableSse(fake)
    loads: list[Request] = []

    async def on_call(request: Request) -> None:
        message = request.json()
        if message.get("method") == "session/new":
            resumable.push(None, rpc_result(message["id"], {"sessionId": "s1"}))
        elif message.get("method") == "session/load":
            loads.append(request)
            update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "history"}}
            resumable.push("s1", notification("session/update", {"sessionId": "s1", "update": update}))
            resumable.push("s1", rpc_result(message["id"], {}))
        elif message.get("method") == "x/after":
            resumable.push(None, rpc_result(message["id"], {"fine": True}))

    fake.on_call = on_call
    events = EventLog()
    client = await initialized(proxied.url, reconnect=FAST, restart=True, on_reconnect=events)
    await within(client.send(rpc(1, "session/new", {"cwd": "/work", "mcpServers": []})))
    assert (await within(client.receive()))["result"] == {"sessionId": "s1"}  # type: ignore[index]
    await within(client.send(rpc(2, "session/prompt", {"sessionId": "s1", "prompt": []})))  # never answered
    await within(fake.wait_for(lambda: bool(fake.of("POST", rpc_method="session/prompt"))))
    resumable.refusals.extend([Reply(404), Reply(404)])  # the server forgot the connection
    resumable.streams.clear()
    proxied.cut(streams)

    restarted = await events.wait_for("restarted")
    assert restarted.previous_connection_id == CONNECTION_ID
    assert restarted.connection_id == client.connection_id == f"{CONNECTION_ID}-2"
    assert restarted.sessions_loaded == ("s1",) and restarted.requests_failed == 1
    failed = await within(client.receive())
    assert (
        failed is not None and failed["id"] == 2 and failed["error"]["data"] == {"acpChannels": "connection-restarted"}
    )
    inits = fake.of("POST", rpc_method="initialize")
    assert [init.json()["params"] for init in inits] == [INIT["params"]] * 2
    assert loads[0].json()["params"] == {"sessionId": "s1", "cwd": "/work", "mcpServers": []}
    assert loads[0].connection_id == f"{CONNECTION_ID}-2" and loads[0].session_id == "s1"
    # The replayed history was not delivered again; the new connection works.
    await within(client.send(rpc(3, "x/after")))
    assert await within(client.receive()) == rpc_result(3, {"fine": True})
    assert fake.of("POST", rpc_method="x/after")[0].connection_id == f"{CONNECTION_ID}-2"
    await client.close()


async def test_a_post_finding_the_connection_gone_restarts_and_is_answered_with_an_error(
    fake: FakeAcp, proxied: CutProxy
) -> None:
    """The connection vanished while the streams still look fine: the next POST gets 404."""
    ResumableSse(fake)

    async def on_post(request: Request) -> Answer:
        if request.connection_id == CONNECTION_ID:
            return Reply(404)
        return Reply(202)

    events = EventLog()
    client = await initialized(proxied.url, reconnect=FAST, restart=True, on_reconnect=events)
    fake.on_post = on_post
    await within(client.send(rpc(7, "x/late")))  # accepted: the restart answers it
    failed = await within(client.receive())
    assert failed is not None and failed["id"] == 7 and failed["error"]["data"]["acpChannels"] == "connection-restarted"
    restarted = await events.wait_for("restarted")
    assert restarted.requests_failed == 1 and restarted.connection_id == f"{CONNECTION_ID}-2"
    assert client.error is None
    await within(client.send(rpc(8, "x/next")))
    assert fake.of("POST", rpc_method="x/next")[0].connection_id == f"{CONNECTION_ID}-2"
    await client.close()


async def test_restart_needs_load_session_when_sessions_are_open(fake: FakeAcp, proxied: CutProxy) -> None:
    resumable = ResumableSse(fake, load_session=False)

    async def on_call(request: Request) -> None:
        if request.rpc_method == "session/new":
            resumable.push(None, rpc_result(request.json()["id"], {"sessionId": "s1"}))

    fake.on_call = on_call
    client = await initialized(proxied.url, reconnect=FAST, restart=True)
    await within(client.send(rpc(1, "session/new", {"cwd": "/", "mcpServers": []})))
    await within(client.receive())
    resumable.refusals.extend([Reply(404), Reply(404)])
    proxied.cut(streams)
    with pytest.raises(ResumeRefusedError, match=r"does not advertise agentCapabilities\.loadSession"):
        await within(client.receive())
    assert len(fake.of("POST", rpc_method="initialize")) == 1
    await client.close()


# ------------------------------------------------------------------------------- WebSocket


async def ws_initialized(url: str, **options: Any) -> HttpClient:
    client = HttpClient(url, timeout=5.0, **options)
    await within(client.send(INIT))
    reply = await within(client.receive())
    assert reply is not None and "result" in reply
    return client


async def test_websocket_cut_mid_burst_loses_and_repeats_nothing() -> None:
    async with ResumableWs() as server, CutProxy(server.port) as proxy:
        events = EventLog()
        client = await ws_initialized(proxy.ws_url, reconnect=FAST, on_reconnect=events)
        cut = proxy.cut_after(20_000, websocket)
        await within(client.send(rpc(1, "x/burst", {"count": 500, "pad": 100})))
        assert await receive_items(client, 500) == list(range(500))
        assert await within(client.receive()) == rpc_result(1, {"count": 500})
        await within(cut)
        state = server.order[0]
        assert len(state.upgrades) == 2
        reattach = state.upgrades[1]
        assert reattach["acp-connection-id"] == state.id
        assert 0 < int(reattach["last-event-id"]) < 502  # what had arrived when the cut came
        assert events.kinds() == ["reconnecting", "resumed"] and events.seen[0].what == "WebSocket"
        assert client.connection_id == state.id
        await client.close()


async def test_websocket_messages_the_server_missed_are_sent_again_in_order() -> None:
    async with ResumableWs() as server, CutProxy(server.port) as proxy:
        events = EventLog()
        client = await ws_initialized(proxy.ws_url, reconnect=FAST, on_reconnect=events)
        for number in range(1, 4):
            await within(client.send(rpc(number, "x/echo", {"n": number})))
            assert await within(client.receive()) == rpc_result(number, {"echo": "x/echo"})
        state = server.order[0]
        server.pretend_lost = 2  # the last two never reached the agent
        proxy.cut(websocket)
        await within(client.send(rpc(4, "x/echo", {"n": 4})))  # waits for the reattach
        await events.wait_for("resumed")
        assert state.upgrades[1]["last-event-id"] == "4"
        replies = [await within(client.receive()) for _ in range(3)]
        assert [reply["id"] for reply in replies if reply] == [2, 3, 4]  # 2 and 3 answered again
        received = [json.loads(text) for text in state.received]
        assert [message["id"] for message in received] == [0, 1, 2, 3, 4]
        await client.close()


async def test_websocket_resend_window_overflow_is_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport_ws, "RESEND_WINDOW_MESSAGES", 2)
    async with ResumableWs() as server, CutProxy(server.port) as proxy:
        client = await ws_initialized(proxy.ws_url, reconnect=FAST)
        for number in range(1, 5):
            await within(client.send(rpc(number, "x/echo")))
            await within(client.receive())
        server.pretend_lost = 3  # more than the two kept
        proxy.cut(websocket)
        with pytest.raises(ResumeFailedError, match=r"messages 3-3 are no longer kept .* they were lost"):
            await within(client.receive())
        await client.close()


@pytest.mark.parametrize(
    ("advertise", "name_connection"), [(False, True), (True, False)], ids=["not-advertised", "unnamed"]
)
async def test_websocket_drop_stays_fatal_unless_resumable(advertise: bool, name_connection: bool) -> None:
    async with (
        ResumableWs(advertise=advertise, name_connection=name_connection) as server,
        CutProxy(server.port) as proxy,
    ):
        client = await ws_initialized(proxy.ws_url, reconnect=FAST)
        proxy.cut(websocket)
        with pytest.raises(WebSocketClosedError):
            await within(client.receive())
        assert len(server.order[0].upgrades) == 1
        await client.close()


async def test_websocket_close_1000_from_the_server_is_fatal() -> None:
    async with ResumableWs() as server:
        client = await ws_initialized(server.url, reconnect=FAST)
        state = server.order[0]
        assert state.socket is not None
        await state.socket.close(1000)
        with pytest.raises(WebSocketClosedError) as closed:
            await within(client.receive())
        assert closed.value.code == 1000 and len(state.upgrades) == 1
        await client.close()


@pytest.mark.parametrize("by_close", [False, True], ids=["status", "close-code"])
@pytest.mark.parametrize("status", [404, 409])
async def test_websocket_reattach_refused_is_fatal(status: int, by_close: bool) -> None:
    """Refused with an HTTP status, or (a server that cannot) with close code 4000 + status."""
    async with ResumableWs() as server, CutProxy(server.port) as proxy:
        events = EventLog()
        client = await ws_initialized(proxy.ws_url, reconnect=FAST, on_reconnect=events)
        server.refuse_next = (status, "refused for the test\n")
        server.refuse_by_close = by_close
        proxy.cut(websocket)
        with pytest.raises(ResumeRefusedError) as refused:
            await within(client.receive())
        assert refused.value.status_code == status and "refused for the test" in str(refused.value)
        if status == 404:
            assert "not restarting: restart is off" in str(refused.value)
        assert events.kinds() == ["reconnecting", "gave-up"]
        await client.close()


async def test_websocket_restart_after_the_server_forgot_the_connection() -> None:
    async with ResumableWs() as server, CutProxy(server.port) as proxy:
        events = EventLog()
        client = await ws_initialized(proxy.ws_url, reconnect=FAST, restart=True, on_reconnect=events)
        await within(client.send(rpc(1, "session/new", {"cwd": "/w", "mcpServers": []})))
        assert (await within(client.receive()))["result"] == {"sessionId": "s-1"}  # type: ignore[index]
        old = server.order[0]
        server.forget(old.id)
        restarted = await events.wait_for("restarted")
        new = server.order[1]
        assert (restarted.previous_connection_id, restarted.connection_id) == (old.id, new.id)
        assert restarted.sessions_loaded == ("s-1",)
        methods = [json.loads(text)["method"] for text in new.received]
        assert methods == ["initialize", "session/load"]
        assert json.loads(new.received[1])["params"] == {"sessionId": "s-1", "cwd": "/w", "mcpServers": []}
        await within(client.send(rpc(2, "x/echo")))
        assert await within(client.receive()) == rpc_result(2, {"echo": "x/echo"})  # no replayed history first
        await client.close()
