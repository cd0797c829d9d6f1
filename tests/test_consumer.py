"""The WebSocket consumer in process (channels' WebsocketCommunicator, no server): fast checks of the
Origin gate, the frame round trip, and that the host's lifetime follows the socket's.

The live counterparts are in test_wire_websocket.py; here the host registry is observable.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from autobahn.exception import PayloadExceededError
from channels.layers import InMemoryChannelLayer, channel_layers
from channels.testing import WebsocketCommunicator

from acp_channels._agents import AgentClosed
from acp_channels._consumers import AcpWebsocketConsumer, Reattach, reattach_request
from acp_channels._host import ConnectionHost, StreamBusy, registry
from acp_channels._protocol import Single
from acp_channels._routing import build_asgi_application
from acp_channels.auth import RequestContext
from tests.live import notification, rpc

ALLOWED = "http://allowed.example"
TIMEOUT = 5.0


@pytest.fixture(autouse=True)
def wire_agent_settings(settings: Any) -> None:
    settings.ACP_CHANNELS = {"AGENT": "tests.wire_agent.create", "CORS_ALLOWED_ORIGINS": [ALLOWED]}


@pytest.fixture(scope="module")
def application() -> Any:
    return build_asgi_application()


#: The Host of every upgrade here: pytest-django adds "testserver" to ALLOWED_HOSTS, as Django's
#: test runner does (WebsocketCommunicator sends no Host of its own).
HOST = "testserver"


def communicator_for(application: Any, origin: str | None = None, host: str | None = HOST) -> WebsocketCommunicator:
    headers = [(b"host", host.encode())] if host is not None else []
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    return WebsocketCommunicator(application, "/acp", headers=headers)


@contextlib.asynccontextmanager
async def connected(application: Any, origin: str | None = None) -> AsyncIterator[tuple[WebsocketCommunicator, str]]:
    """An accepted socket and its connection id; disconnected (if still running) on exit."""
    async with connected_communicator(communicator_for(application, origin)) as connection:
        yield connection


@contextlib.asynccontextmanager
async def connected_communicator(
    communicator: WebsocketCommunicator,
) -> AsyncIterator[tuple[WebsocketCommunicator, str]]:
    accepted, _ = await communicator.connect(TIMEOUT)
    try:
        assert accepted
        headers = dict(communicator.response_headers or [])
        yield communicator, headers[b"acp-connection-id"].decode()
    finally:
        if not communicator.future.done():
            await communicator.disconnect(timeout=TIMEOUT)


def host_of(connection_id: str) -> ConnectionHost:
    host = registry.get(connection_id)
    assert host is not None, "no host registered for the connection id from the accept headers"
    return host


async def receive(communicator: WebsocketCommunicator) -> Any:
    return json.loads(await communicator.receive_from(TIMEOUT))


async def received_frames(communicator: WebsocketCommunicator) -> list[Any]:
    await communicator.send_json_to(rpc("received", "test/received"))
    reply = await receive(communicator)
    assert reply["id"] == "received", reply
    return [json.loads(frame) for frame in reply["result"]["frames"]]


def echo(request_id: Any, method: str, params: Any = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": {"method": method, "params": params}}


# -- the Origin gate -------------------------------------------------------------------------


@pytest.mark.parametrize("origin", ["http://evil.example", "null", ALLOWED.upper(), ALLOWED + "/"])
async def test_foreign_origin_is_refused_before_accept(application: Any, origin: str) -> None:
    hosts_before = len(registry)
    communicator = communicator_for(application, origin)
    accepted, _ = await communicator.connect(TIMEOUT)
    assert not accepted  # a close before accept: the server answers 403
    assert communicator.response_headers is None
    assert len(registry) == hosts_before  # no agent was created
    await communicator.disconnect(timeout=TIMEOUT)


@pytest.mark.parametrize("origin", [None, ALLOWED])
async def test_missing_or_listed_origin_is_accepted_with_a_websocket_host(application: Any, origin: str | None) -> None:
    async with connected(application, origin) as (_, connection_id):
        host = host_of(connection_id)
        assert host.transport == "websocket"


async def test_origin_is_refused_when_cors_is_off(application: Any, settings: Any) -> None:
    settings.ACP_CHANNELS = {"AGENT": "tests.wire_agent.create"}
    communicator = communicator_for(application, ALLOWED)
    accepted, _ = await communicator.connect(TIMEOUT)
    assert not accepted
    await communicator.disconnect(timeout=TIMEOUT)


async def refused_before_accept(communicator: WebsocketCommunicator) -> None:
    hosts_before = len(registry)
    accepted, _ = await communicator.connect(TIMEOUT)
    assert not accepted  # a close before accept: the server answers 403
    assert len(registry) == hosts_before
    await communicator.disconnect(timeout=TIMEOUT)


@pytest.mark.parametrize("host", ["rebound.example", "rebound.example:8000", None])
async def test_a_host_outside_allowed_hosts_is_refused_before_accept(application: Any, host: str | None) -> None:
    """DNS rebinding: a foreign name resolving to the server. channels applies ALLOWED_HOSTS to
    no WebSocket; the consumer does, as Django does for HTTP (no Host: the server's name)."""
    await refused_before_accept(communicator_for(application, host=host))


@pytest.mark.parametrize("origin", [f"http://{HOST}", f"http://{HOST}:80"])
async def test_the_own_origin_is_accepted(application: Any, origin: str) -> None:
    async with connected(application, origin) as (communicator, _):
        await communicator.send_json_to(rpc(1, "same/origin"))
        assert await receive(communicator) == echo(1, "same/origin")


async def test_an_https_page_is_its_own_origin_only_over_tls(application: Any, settings: Any) -> None:
    """Behind a TLS-terminating proxy the socket is wss only by SECURE_PROXY_SSL_HEADER, as for
    Django's request.is_secure()."""
    communicator = communicator_for(application, f"https://{HOST}")
    communicator.scope["headers"].append((b"x-forwarded-proto", b"https"))
    await refused_before_accept(communicator)
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    communicator = communicator_for(application, f"https://{HOST}")
    communicator.scope["headers"].append((b"x-forwarded-proto", b"https"))
    async with connected_communicator(communicator):
        pass


# -- frames ----------------------------------------------------------------------------------


async def test_text_round_trip(application: Any) -> None:
    async with connected(application) as (communicator, _):
        await communicator.send_json_to(rpc(1, "custom/echo", {"a": [1, 2]}))
        assert await receive(communicator) == echo(1, "custom/echo", {"a": [1, 2]})
        await communicator.send_json_to(notification("custom/note"))
        assert await received_frames(communicator) == [
            rpc(1, "custom/echo", {"a": [1, 2]}),
            notification("custom/note"),
        ]


async def test_frames_take_no_thread_hop(application: Any, sync_to_async_calls: list[Any]) -> None:
    """channels' dispatch closes old database connections through sync_to_async before every
    handler: a thread hop per frame, which frames skip (the upgrade keeps it)."""
    calls = sync_to_async_calls
    async with connected(application) as (communicator, _):
        assert calls  # the upgrade: close_old_connections, as channels does
        calls.clear()
        for request_id in range(20):
            await communicator.send_json_to(rpc(request_id, "custom/echo"))
            assert await receive(communicator) == echo(request_id, "custom/echo")
        assert calls == []


async def test_batch_is_one_frame_and_one_reply(application: Any) -> None:
    batch = [rpc(1, "a"), notification("n"), rpc(2, "b")]
    async with connected(application) as (communicator, _):
        await communicator.send_json_to(batch)
        assert await receive(communicator) == [echo(1, "a"), echo(2, "b")]
        assert await received_frames(communicator) == [batch]


async def test_malformed_text_is_forwarded_and_answered(application: Any) -> None:
    async with connected(application) as (communicator, _):
        await communicator.send_to(text_data="{not json")
        reply = await receive(communicator)
        assert (reply["id"], reply["error"]["code"], reply["error"]["data"]) == (None, -32700, {"line": "{not json"})
        await communicator.send_json_to(rpc(2, "after"))
        assert await receive(communicator) == echo(2, "after")


async def test_binary_is_ignored(application: Any) -> None:
    async with connected(application) as (communicator, _):
        await communicator.send_to(bytes_data=json.dumps(rpc(1, "binary")).encode())
        # The next output is the answer to test/received, and the agent saw nothing.
        assert await received_frames(communicator) == []


# -- lifetime --------------------------------------------------------------------------------


async def test_disconnect_terminates_the_host(application: Any) -> None:
    hosts_before = len(registry)
    async with connected(application) as (communicator, connection_id):
        host = host_of(connection_id)
        assert len(registry) == hosts_before + 1
        await communicator.disconnect(timeout=TIMEOUT)
    assert registry.get(connection_id) is None
    assert len(registry) == hosts_before
    assert host.ended.is_set()
    with pytest.raises(AgentClosed):
        await host.agent.send(Single(rpc(9, "after/disconnect")))


async def test_agent_exit_drains_then_closes_and_unregisters(application: Any) -> None:
    final = notification("test/final", {"bye": True})
    async with connected(application) as (communicator, connection_id):
        await communicator.send_json_to(rpc(1, "test/exit", {"final": final}))
        assert await receive(communicator) == {"jsonrpc": "2.0", "id": 1, "result": {"ok": True}}
        assert await receive(communicator) == final
        assert (await communicator.receive_output(TIMEOUT))["type"] == "websocket.close"
        assert registry.get(connection_id) is None
        # Input after the agent ended is dropped without raising (item 46).
        await communicator.send_json_to(rpc(2, "after/exit"))
        await communicator.disconnect(timeout=TIMEOUT)  # re-raises anything the consumer raised


async def test_terminating_the_host_closes_the_socket(application: Any) -> None:
    """What DELETE with a WebSocket connection id does (docs/wire-contract.md §8 quirk)."""
    async with connected(application) as (communicator, connection_id):
        await host_of(connection_id).terminate()
        assert (await communicator.receive_output(TIMEOUT))["type"] == "websocket.close"
        assert registry.get(connection_id) is None


async def test_websocket_host_has_no_sse_streams(application: Any) -> None:
    """A GET with a WebSocket connection id is 409 (item 43)."""
    async with connected(application) as (_, connection_id):
        host = host_of(connection_id)
        for session in (None, "s-1"):
            with pytest.raises(StreamBusy):
                host.lease(session)


async def test_connection_cap_refuses_with_try_again_later(application: Any, settings: Any) -> None:
    async with connected(application) as _:
        settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "MAX_CONNECTIONS": len(registry)}
        hosts_before = len(registry)
        communicator = communicator_for(application)
        accepted, _ = await communicator.connect(TIMEOUT)
        assert accepted
        closing = await communicator.receive_output(TIMEOUT)
        assert (closing["type"], closing.get("code")) == ("websocket.close", 1013)
        assert len(registry) == hosts_before
        await communicator.disconnect(timeout=TIMEOUT)


class FailingLayer(InMemoryChannelLayer):
    """A layer whose receive fails, as a Redis read timing out does."""

    async def receive(self, channel: str) -> dict[str, Any]:
        raise ConnectionError("layer read timed out")


async def test_the_socket_does_not_depend_on_the_channel_layer(application: Any, settings: Any) -> None:
    """Regression: the consumer kept channels' default layer subscription, so a failing layer
    receive (a redis-py timeout under load) ended the consumer and cut the socket mid-session."""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "tests.test_consumer.FailingLayer"}}
    channel_layers.backends.clear()
    try:
        async with connected(application) as (communicator, _):
            for request_id in range(3):
                await communicator.send_to(text_data=json.dumps(rpc(request_id, "custom/ping")))
                reply = json.loads(await communicator.receive_from(TIMEOUT))
                assert reply["id"] == request_id
    finally:
        channel_layers.backends.clear()


# -- failures on the way out -----------------------------------------------------------------

SOCKET_LIMIT = 100


def refuse_large_messages(monkeypatch: pytest.MonkeyPatch, failure: type[Exception]) -> None:
    """Make the server's ASGI send refuse text messages over SOCKET_LIMIT bytes, as daphne
    (autobahn) does past --websocket-max-message-size; `failure` is what it raises."""
    original = AcpWebsocketConsumer.__call__

    async def call(self: AcpWebsocketConsumer, scope: Any, receive: Any, send: Any) -> None:
        async def refusing_send(message: dict[str, Any]) -> None:
            text = message.get("text") if message.get("type") == "websocket.send" else None
            if text is not None and len(text.encode()) > SOCKET_LIMIT:
                raise failure(
                    f"tried to send WebSocket message with size {len(text.encode())} "
                    f"exceeding payload limit of {SOCKET_LIMIT} octets"
                )
            await send(message)

        await original(self, scope, receive, refusing_send)

    monkeypatch.setattr(AcpWebsocketConsumer, "__call__", call)


async def test_an_agent_message_over_the_socket_limit_closes_with_1009(
    application: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    refuse_large_messages(monkeypatch, PayloadExceededError)
    async with connected(application) as (communicator, connection_id):
        host = host_of(connection_id)
        await communicator.send_json_to(rpc(1, "small"))
        assert await receive(communicator) == echo(1, "small")
        big = rpc(2, "big", {"pad": "x" * SOCKET_LIMIT})
        size = len(json.dumps(echo(2, "big", big["params"]), separators=(",", ":")))
        await communicator.send_to(text_data=json.dumps(big))
        closing = await communicator.receive_output(TIMEOUT)
        assert closing == {
            "type": "websocket.close",
            "code": 1009,
            "reason": f"agent message of {size} bytes exceeds the socket's limit of {SOCKET_LIMIT}",
        }
        assert host.ended.is_set() and registry.get(connection_id) is None
        with pytest.raises(AgentClosed):
            await host.agent.send(Single(rpc(3, "after/close")))
    warnings = [record for record in caplog.records if record.levelname == "WARNING"]
    assert [connection_id in record.getMessage() for record in warnings] == [True]


async def test_any_other_send_failure_closes_with_1011_and_is_logged(
    application: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    refuse_large_messages(monkeypatch, RuntimeError)
    async with connected(application) as (communicator, connection_id):
        await communicator.send_json_to(rpc(1, "big", {"pad": "x" * SOCKET_LIMIT}))
        closing = await communicator.receive_output(TIMEOUT)
        assert (closing["type"], closing["code"]) == ("websocket.close", 1011)
        assert registry.get(connection_id) is None
    errors = [record for record in caplog.records if record.levelname == "ERROR"]
    assert len(errors) == 1 and connection_id in errors[0].getMessage()
    assert errors[0].exc_info is not None and isinstance(errors[0].exc_info[1], RuntimeError)


# -- a dropped socket, and reattaching (docs/resumable-streams.md) -----------------------------

#: The code a server reports for a socket that ended without a close frame.
ABNORMAL_CLOSURE = 1006


def reattach_communicator(application: Any, connection_id: str, last_event_id: str) -> WebsocketCommunicator:
    communicator = communicator_for(application)
    communicator.scope["headers"] += [
        (b"acp-connection-id", connection_id.encode()),
        (b"last-event-id", last_event_id.encode()),
    ]
    return communicator


async def test_a_dropped_socket_leaves_the_connection_waiting_for_a_reattach(application: Any) -> None:
    async with connected(application) as (communicator, connection_id):
        host = host_of(connection_id)
        await communicator.send_json_to(rpc(1, "before/drop"))
        assert await receive(communicator) == echo(1, "before/drop")
        await communicator.disconnect(code=ABNORMAL_CLOSURE, timeout=TIMEOUT)
    assert registry.get(connection_id) is host and not host.ended.is_set()
    assert not host.socket_outbox.leased  # detached: the grace period runs
    async with connected_communicator(reattach_communicator(application, connection_id, "1")) as (resumed, same_id):
        assert same_id == connection_id
        assert dict(resumed.response_headers or [])[b"acp-received"] == b"1"
        assert host.socket_outbox.leased
        await resumed.send_json_to(rpc(2, "after/reattach"))
        assert await receive(resumed) == echo(2, "after/reattach")
        assert await received_frames(resumed) == [rpc(1, "before/drop"), rpc(2, "after/reattach")]
        await resumed.disconnect(code=1000, timeout=TIMEOUT)  # a clean close ends it
    assert host.ended.is_set() and host.end_reason == "socket closed"


@pytest.mark.parametrize(
    ("headers", "query", "expected", "wants_message"),
    [
        ({"acp-connection-id": "c", "last-event-id": "2"}, b"", Reattach("c", "2"), False),
        ({}, b"acp_connection_id=c&last_event_id=2", Reattach("c", "2", browser_form=True), True),
        # A header wins over its parameter: that is the header form.
        ({"acp-connection-id": "h", "last-event-id": "2"}, b"acp_connection_id=q", Reattach("h", "2"), False),
        (
            {"acp-connection-id": "c", "last-event-id": "2"},
            b"acp_received=message",
            Reattach("c", "2", received_option="message"),
            True,
        ),
        (
            {"acp-connection-id": "c", "last-event-id": "2"},
            b"acp_received=no",
            Reattach("c", "2", received_option="no"),
            False,
        ),
        ({}, b"acp_received=message", None, False),  # a new socket: nothing to report
    ],
)
def test_which_reattaches_get_acp_received_as_a_message(
    headers: dict[str, str], query: bytes, expected: Reattach | None, wants_message: bool
) -> None:
    scope = {
        "type": "websocket",
        "query_string": query,
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
    }
    request = reattach_request(RequestContext.for_websocket(scope))
    assert request == expected
    assert (request is not None and request.wants_received_message) is wants_message


async def test_a_browser_reattach_hears_acp_received_before_anything_else(application: Any) -> None:
    async with connected(application) as (communicator, connection_id):
        await communicator.send_json_to(rpc(1, "test/burst", {"count": 3}))
        assert (await receive(communicator))["params"]["n"] == 0
        await communicator.disconnect(code=ABNORMAL_CLOSURE, timeout=TIMEOUT)
    browser = communicator_for(application)
    browser.scope["query_string"] = f"acp_connection_id={connection_id}&last_event_id=1".encode()
    async with connected_communicator(browser) as (resumed, _):
        assert await receive(resumed) == notification("_acp-channels/received", {"received": 1})
        assert [(await receive(resumed))["params"]["n"] for _ in range(2)] == [1, 2]  # then message 2, as before
        assert (await receive(resumed))["id"] == 1
        await resumed.disconnect(code=1000, timeout=TIMEOUT)
    refused = reattach_communicator(application, "any", "0")
    refused.scope["query_string"] = b"acp_received=header"
    assert (await refused.connect(TIMEOUT))[0]
    assert await refused.receive_output(TIMEOUT) == {
        "type": "websocket.close",
        "code": 4400,
        "reason": "acp_received is 'message' or absent",
    }
    await refused.disconnect(timeout=TIMEOUT)


async def test_with_no_grace_period_a_dropped_socket_ends_the_connection(application: Any, settings: Any) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "WEBSOCKET_RESUME_SECONDS": 0}
    async with connected(application) as (communicator, connection_id):
        host = host_of(connection_id)
        await communicator.disconnect(code=ABNORMAL_CLOSURE, timeout=TIMEOUT)
    assert host.ended.is_set() and registry.get(connection_id) is None


async def test_the_grace_period_ends_an_abandoned_connection(application: Any, settings: Any) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "WEBSOCKET_RESUME_SECONDS": 0.05, "DETACHED_SECONDS": 0}
    async with connected(application) as (communicator, connection_id):
        host = host_of(connection_id)
        await communicator.disconnect(code=ABNORMAL_CLOSURE, timeout=TIMEOUT)
    await asyncio.wait_for(host.ended.wait(), TIMEOUT)
    assert host.end_reason == "socket closed" and registry.get(connection_id) is None


async def test_detached_seconds_lengthen_the_grace_period(application: Any, settings: Any) -> None:
    """A socket that dropped leaves its connection DETACHED_SECONDS when longer than
    WEBSOCKET_RESUME_SECONDS (docs/shared-sessions.md)."""
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "WEBSOCKET_RESUME_SECONDS": 0.05, "DETACHED_SECONDS": 0.5}
    loop = asyncio.get_running_loop()
    async with connected(application) as (communicator, connection_id):
        host = host_of(connection_id)
        await communicator.disconnect(code=ABNORMAL_CLOSURE, timeout=TIMEOUT)
        dropped = loop.time()
    await asyncio.wait_for(host.ended.wait(), TIMEOUT)
    assert loop.time() - dropped >= 0.45  # the timer's clock may round a little
    assert host.end_reason == "socket closed"


async def test_idle_reaping_leaves_a_detached_socket_to_its_grace_period(application: Any, settings: Any) -> None:
    """IDLE_TIMEOUT_SECONDS never ends a WebSocket connection: attached it is in use, detached its
    grace period (however long) decides."""
    async with connected(application) as (communicator, connection_id):
        host = host_of(connection_id)
        await communicator.disconnect(code=ABNORMAL_CLOSURE, timeout=TIMEOUT)
    now = asyncio.get_running_loop().time()
    assert host.idle_since(now + 10_000) == 0
    await host.terminate()


@pytest.mark.parametrize(
    ("known", "last_event_id", "code", "reason"),
    [
        (False, "0", 4404, "Not Found"),
        (True, "5", 4409, "Last-Event-ID 5 does not belong to this stream"),
        (True, "x", 4400, "Last-Event-ID of a WebSocket is the number of messages received"),
    ],
)
async def test_a_refused_reattach_without_the_denial_extension_closes_with_4000_plus_the_status(
    application: Any, known: bool, last_event_id: str, code: int, reason: str
) -> None:
    """channels' test communicator, like servers without the ASGI denial-response extension, can
    only accept or 403: the refusal is an accept, then a close with 4000 + the HTTP status."""
    async with connected(application) as (_, connection_id):
        named = connection_id if known else "no-such-connection"
        communicator = reattach_communicator(application, named, last_event_id)
        accepted, _ = await communicator.connect(TIMEOUT)
        assert accepted
        assert await communicator.receive_output(TIMEOUT) == {"type": "websocket.close", "code": code, "reason": reason}
        await communicator.disconnect(timeout=TIMEOUT)


async def test_a_refused_reattach_with_the_denial_extension_is_an_http_response(application: Any) -> None:
    async with connected(application) as (_, connection_id):
        communicator = reattach_communicator(application, connection_id, "7")
        communicator.scope["extensions"] = {"websocket.http.response": {}}
        await communicator.send_input({"type": "websocket.connect"})
        start = await communicator.receive_output(TIMEOUT)
        body = await communicator.receive_output(TIMEOUT)
        text = b"Last-Event-ID 7 does not belong to this stream"
        assert start == {
            "type": "websocket.http.response.start",
            "status": 409,
            "headers": [(b"content-length", str(len(text)).encode()), (b"content-type", b"text/plain; charset=utf-8")],
        }
        assert body == {"type": "websocket.http.response.body", "body": text}
        await communicator.disconnect(timeout=TIMEOUT)


async def test_a_reattach_takes_over_a_socket_still_attached(application: Any) -> None:
    async with connected(application) as (stale, connection_id):
        await stale.send_json_to(rpc(1, "test/burst", {"count": 3}))
        assert [(await receive(stale))["params"]["n"] for _ in range(3)] == [0, 1, 2]
        assert (await receive(stale))["id"] == 1
        async with connected_communicator(reattach_communicator(application, connection_id, "4")) as (fresh, _):
            closing = await stale.receive_output(TIMEOUT)
            assert closing == {
                "type": "websocket.close",
                "code": 4409,
                "reason": "another socket resumed this connection",
            }
            # What the stale socket still sends is not the connection's any more.
            await stale.send_json_to(rpc(2, "from/stale"))
            await stale.disconnect(code=ABNORMAL_CLOSURE, timeout=TIMEOUT)
            assert host_of(connection_id).socket_outbox.leased
            assert await received_frames(fresh) == [rpc(1, "test/burst", {"count": 3})]
            await fresh.disconnect(code=1000, timeout=TIMEOUT)
    assert registry.get(connection_id) is None
