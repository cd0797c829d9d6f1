"""HttpClient with a `TokenSource` against fakes whose tokens expire (tests/peers/expiring.py):
a 401 `invalid_token` is refreshed once and the request sent once more (a POST reaches the agent
once), refusals that meet share one refresh, a source without a new token leaves the 401 (no
hang), the server's `_acp-channels/auth_expiring` notice starts a refresh ahead of time and
never reaches the application, and a stream or socket closed at expiry resumes with the new
token without losing or repeating a message. The same against daphne with django-oauth-toolkit
is in test_token_refresh_live.py."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from acp_channels.client import (
    AuthenticationError,
    Backoff,
    ClientUsageError,
    HttpClient,
    TokenSource,
    TransportError,
    WebSocketClosedError,
)
from acp_channels.client._cli import ConnectionOptions
from tests.peers.expiring import CHALLENGE, ExpiringSse, ExpiringWs, Minting, expiring_notice
from tests.peers.fakes import FakeAcp, Request, within
from tests.peers.resumable import EventLog, notification, rpc_result

pytestmark = pytest.mark.timeout(30)

INIT: dict[str, Any] = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}
FAST = Backoff(initial=0.02, maximum=0.05, give_up_after=10.0, jitter=0)


def rpc(request_id: Any, method: str, params: Any = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}}


def item(index: int) -> dict[str, Any]:
    return notification("x/item", {"index": index})


async def items(client: HttpClient, count: int) -> list[int]:
    """The index of the next `count` messages, each of which must be an x/item."""
    found = []
    for _ in range(count):
        message = await within(client.receive())
        assert message is not None and message.get("method") == "x/item", message
        found.append(message["params"]["index"])
    return found


async def opened(url: str, source: TokenSource, **options: Any) -> HttpClient:
    client = HttpClient(url, **{"token": source, "timeout": 5.0, "reconnect": FAST, **options})
    await within(client.send(INIT))
    assert "result" in (await within(client.receive()))
    return client


def agent_calls(server: ExpiringSse, method: str) -> list[str | None]:
    """The tokens of the POSTs of `method` the agent took (authenticated ones)."""
    return [token for verb, name, _, status, token in server.seen if (verb, name) == ("POST", method) and status != 401]


# ------------------------------------------------------------------------------------ HTTP


async def test_a_post_refused_as_invalid_token_goes_once_more_with_a_new_token(fake: FakeAcp) -> None:
    server = ExpiringSse(fake)
    taken: list[Request] = []

    async def on_call(request: Request) -> None:
        taken.append(request)
        message = request.json()
        server.push(None, rpc_result(message["id"], {"sessionId": "s1"}))

    fake.on_call = on_call
    source = Minting()
    client = await opened(fake.url, source)
    server.expire("tok-1", successor="tok-2")  # the connection stream ends too: it resumes
    await within(client.send(rpc(1, "session/new", {"cwd": "/", "mcpServers": []})))
    assert (await within(client.receive()))["result"] == {"sessionId": "s1"}

    assert source.refreshed == ["tok-1"]
    refused = [entry for entry in server.refusals() if entry[0] == "POST"]
    assert [(name, token) for _, name, _, _, token in refused] == [("session/new", "tok-1")]
    assert len(taken) == 1 and agent_calls(server, "session/new") == ["tok-2"]  # the agent took it once
    assert taken[0].headers["authorization"] == "Bearer tok-2"
    await within(client.close())
    assert fake.of("DELETE")[-1].headers["authorization"] == "Bearer tok-2"


async def test_refusals_that_meet_share_one_refresh(fake: FakeAcp) -> None:
    """Both streams end at expiry; both resumes are refused with the old token while the one
    refresh is held; both then resume with the new token, and nothing is lost or repeated."""
    server = ExpiringSse(fake)

    async def on_call(request: Request) -> None:
        server.push(None, rpc_result(request.json()["id"], {"sessionId": "s1"}))

    fake.on_call = on_call
    source = Minting()
    client = await opened(fake.url, source)
    await within(client.send(rpc(1, "session/new", {"cwd": "/", "mcpServers": []})))
    assert (await within(client.receive()))["result"] == {"sessionId": "s1"}
    await fake.wait_for(lambda: any(entry[2] == "s1" for entry in server.seen))
    server.push("s1", item(0))
    assert await items(client, 1) == [0]

    source.hold = asyncio.Event()
    server.expire("tok-1", successor="tok-2")
    await fake.wait_for(lambda: len(server.refusals()) == 2)
    server.push("s1", item(1))
    server.push(None, item(2))
    source.hold.set()
    received = await items(client, 2)
    assert sorted(received) == [1, 2]
    assert source.refreshed == ["tok-1"]
    assert {(verb, session) for verb, _, session, _, _ in server.refusals()} == {("GET", None), ("GET", "s1")}
    resumed = [entry for entry in server.seen if entry[0] == "GET" and entry[4] == "tok-2"]
    assert {entry[2] for entry in resumed} == {None, "s1"}
    await within(client.close())


class Failing(Minting):
    """A source whose refresh raises, or never answers."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how

    async def refresh(self, rejected: str) -> str | None:
        self.refreshed.append(rejected)
        if self.how == "hangs":
            await asyncio.Event().wait()
        raise RuntimeError(f"the authorization server refused {rejected}")


@pytest.mark.parametrize("how", ["none", "raises", "hangs"])
async def test_a_source_without_a_new_token_leaves_the_401(fake: FakeAcp, how: str) -> None:
    server = ExpiringSse(fake)
    source = Minting(last=1) if how == "none" else Failing(how)  # no token after tok-1
    client = await opened(fake.url, source, timeout=1.0)
    server.valid.clear()
    with pytest.raises(AuthenticationError) as refused:
        await within(client.send(rpc(1, "session/new", {"cwd": "/", "mcpServers": []})))
    assert refused.value.status_code == 401 and refused.value.www_authenticate == CHALLENGE
    assert "tok-1" not in str(refused.value)
    assert source.refreshed == ["tok-1"]
    assert len([entry for entry in server.seen if entry[1] == "session/new"]) == 1  # not sent again
    with pytest.raises(AuthenticationError):
        await within(client.receive())
    await within(client.close())


async def test_a_fixed_token_is_never_refreshed(fake: FakeAcp) -> None:
    server = ExpiringSse(fake)
    client = HttpClient(fake.url, token="tok-1", timeout=5.0)
    await within(client.send(INIT))
    await within(client.receive())
    server.valid.clear()
    with pytest.raises(AuthenticationError):
        await within(client.send(rpc(1, "session/new", {"cwd": "/", "mcpServers": []})))
    assert len([entry for entry in server.seen if entry[1] == "session/new"]) == 1
    await within(client.close())


async def test_the_expiry_notice_refreshes_ahead_and_is_not_delivered(fake: FakeAcp) -> None:
    server = ExpiringSse(fake)
    source = Minting()
    client = await opened(fake.url, source)
    server.push(None, item(0))
    server.push(None, expiring_notice())
    server.push(None, item(1))
    assert await items(client, 2) == [0, 1]  # the notice is the transport's
    await within(source.asked.wait())
    assert source.refreshed == ["tok-1"]
    assert not server.refusals()  # asked before anything was refused

    # At expiry the stream ends; the resume carries the new token and Last-Event-ID.
    server.expire("tok-1", successor="tok-2")
    server.push(None, item(2))
    assert await items(client, 1) == [2]
    assert not server.refusals()
    resume = [entry for entry in server.seen if entry[0] == "GET"][-1]
    assert resume[4] == "tok-2"
    assert fake.requests[-1].headers["last-event-id"] == "t1-3"
    await within(client.close())


async def test_a_stream_closed_at_expiry_resumes_with_the_new_token_losing_nothing(fake: FakeAcp) -> None:
    """No notice this time: the resume with the old token is refused, refreshed, and sent again."""
    server = ExpiringSse(fake)
    events = EventLog()
    source = Minting()
    client = await opened(fake.url, source, on_reconnect=events)
    for index in range(3):
        server.push(None, item(index))
    assert await items(client, 3) == [0, 1, 2]
    server.expire("tok-1", successor="tok-2")
    for index in range(3, 6):
        server.push(None, item(index))
    assert await items(client, 3) == [3, 4, 5]
    await events.wait_for("resumed")
    assert source.refreshed == ["tok-1"]
    assert [(entry[0], entry[4]) for entry in server.refusals()] == [("GET", "tok-1")]
    server.push(None, item(6))
    assert await items(client, 1) == [6]  # nothing repeated before it
    await within(client.close())


async def test_the_directory_is_asked_again_with_a_new_token(fake: FakeAcp) -> None:
    server = ExpiringSse(fake, valid={"tok-2"})
    source = Minting()
    client = HttpClient(fake.url, token=source, timeout=5.0)
    directory = await within(client.list_sessions())
    assert directory.sessions == () or not directory.sessions
    assert [(entry[1], entry[3], entry[4]) for entry in server.seen] == [
        ("/acp/sessions", 401, "tok-1"),
        ("/acp/sessions", 200, "tok-2"),
    ]
    await within(client.close())


async def test_a_failing_source_is_a_transport_error_that_shows_no_token(fake: FakeAcp) -> None:
    ExpiringSse(fake)

    class Broken:
        async def token(self) -> str:
            raise RuntimeError("cannot read tok-secret-123")

        async def refresh(self, rejected: str) -> str | None:
            return None

    client = HttpClient(fake.url, token=Broken(), timeout=5.0)
    with pytest.raises(TransportError) as failed:
        await within(client.send(INIT))
    assert "RuntimeError" in str(failed.value) and "tok-secret" not in str(failed.value)
    await within(client.close())


def test_the_subprotocol_form_takes_a_fixed_token_only() -> None:
    with pytest.raises(ClientUsageError, match="fixed token"):
        HttpClient("ws://127.0.0.1:1/acp", token=Minting(), websocket_token="subprotocol")
    with pytest.raises(ClientUsageError, match="TokenSource"):
        HttpClient("http://127.0.0.1:1", token=42)  # type: ignore[arg-type]


def test_connection_options_hand_a_source_to_the_client() -> None:
    options = ConnectionOptions("http://127.0.0.1:1", None, False, {}, 5.0, ())
    source = Minting()
    client = dataclasses.replace(options, token=source).client()
    assert client._credentials is not None and client._credentials.refreshable


# ------------------------------------------------------------------------------- WebSocket


async def test_a_websocket_closed_at_expiry_reattaches_with_the_new_token_losing_nothing() -> None:
    async with ExpiringWs() as server:
        source = Minting()
        client = HttpClient(server.url, token=source, timeout=5.0, reconnect=FAST)
        await within(client.send(INIT))
        await within(client.receive())
        state = server.order[0]
        state.send(item(0))
        state.send(expiring_notice())
        state.send(item(1))
        assert await items(client, 2) == [0, 1]
        await within(source.asked.wait())  # ahead of time
        assert source.refreshed == ["tok-1"]

        await server.expire("tok-1", successor="tok-2")
        for index in range(2, 5):
            state.send(item(index))
        await within(client.send(rpc(1, "x/echo")))  # sent while reattaching: goes once
        received = [await within(client.receive()) for _ in range(4)]
        assert [m["params"]["index"] for m in received if m and m.get("method") == "x/item"] == [2, 3, 4]
        assert any(m and m.get("id") == 1 for m in received)
        assert source.refreshed == ["tok-1"]
        assert server.upgrade_tokens == [("tok-1", 101), ("tok-2", 101)]
        assert [m.get("method") for m in server.texts()].count("x/echo") == 1
        await within(client.close())


async def test_a_websocket_closed_at_expiry_without_notice_refreshes_then_reattaches() -> None:
    async with ExpiringWs() as server:
        source = Minting()
        client = HttpClient(server.url, token=source, timeout=5.0, reconnect=FAST)
        await within(client.send(INIT))
        await within(client.receive())
        await server.expire("tok-1", successor="tok-2")
        server.order[0].send(item(0))
        assert await items(client, 1) == [0]
        assert source.refreshed == ["tok-1"]
        assert server.upgrade_tokens == [("tok-1", 101), ("tok-2", 101)]
        await within(client.close())


async def test_a_websocket_upgrade_refused_as_invalid_token_is_made_once_more() -> None:
    async with ExpiringWs(valid={"tok-2"}) as server:
        source = Minting()
        client = HttpClient(server.url, token=source, timeout=5.0)
        await within(client.send(INIT))
        assert "result" in (await within(client.receive()))
        assert server.upgrade_tokens == [("tok-1", 401), ("tok-2", 101)]
        await within(client.close())

    async with ExpiringWs(valid=set()) as server:
        client = HttpClient(server.url, token=Minting(), timeout=5.0)
        with pytest.raises(AuthenticationError) as refused:
            await within(client.send(INIT))
        assert refused.value.status_code == 401
        assert server.upgrade_tokens == [("tok-1", 401), ("tok-2", 401)]  # one refresh, one retry
        await within(client.close())


async def test_a_websocket_expiry_close_with_a_fixed_token_stays_fatal() -> None:
    async with ExpiringWs() as server:
        client = HttpClient(server.url, token="tok-1", timeout=5.0, reconnect=FAST)
        await within(client.send(INIT))
        await within(client.receive())
        await server.expire("tok-1")
        with pytest.raises(WebSocketClosedError) as closed:
            await within(client.receive())
        assert closed.value.code == 4401
        assert server.upgrade_tokens == [("tok-1", 101)]
        await within(client.close())
