"""HttpClient credentials against fake servers: the bearer token on every request of both shapes
(and the browser's subprotocol form), refusals (401/403) surfacing as `AuthenticationError`
without a hang, and the token never shown (repr, error messages, a server that echoes it)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Request as WsRequest
from websockets.http11 import Response as WsResponse
from websockets.typing import Subprotocol

from acp_channels.client import (
    AuthenticationError,
    ClientUsageError,
    HttpClient,
    HttpStatusError,
    TransportClosedError,
    check_token,
)
from tests.peers.fakes import CONNECTION_ID, FakeAcp, Reply, Request, Stream, within

pytestmark = pytest.mark.timeout(30)

TOKEN = "tok-3f9a_Zq.8~x"
INIT: dict[str, Any] = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}
CHALLENGE = 'Bearer realm="acp", error="invalid_token"'


def rpc(request_id: Any, method: str, params: Any = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}}


def shows_no_secret(error: BaseException, *secrets: str) -> None:
    for text in (str(error), repr(error)):
        for secret in secrets:
            assert secret not in text, text


# ------------------------------------------------------------------------------------ HTTP


async def test_the_token_goes_on_every_http_request(fake: FakeAcp) -> None:
    """initialize, the connection stream, a session stream, calls, a response, DELETE."""

    async def on_call(request: Request) -> None:
        message = request.json()
        if message.get("method") == "session/new":
            fake.push(None, {"jsonrpc": "2.0", "id": message["id"], "result": {"sessionId": "s1"}})
        elif message.get("method") == "session/prompt":
            fake.push("s1", rpc("q-1", "session/request_permission", {"sessionId": "s1"}))

    fake.on_call = on_call
    client = HttpClient(fake.url, token=TOKEN, timeout=5)
    assert TOKEN not in repr(client)
    await within(client.send(INIT))
    await within(client.receive())
    await within(client.send(rpc(1, "session/new", {"cwd": "/", "mcpServers": []})))
    assert (await within(client.receive()))["result"] == {"sessionId": "s1"}
    await within(client.send(rpc(2, "session/prompt", {"sessionId": "s1", "prompt": []})))
    assert (await within(client.receive()))["id"] == "q-1"
    await within(client.send({"jsonrpc": "2.0", "id": "q-1", "result": {}}))
    await within(client.close())

    kinds = {(r.method, r.sse, r.session_id) for r in fake.requests}
    assert {("POST", False, None), ("GET", True, None), ("GET", True, "s1"), ("DELETE", False, None)} <= kinds
    assert len(fake.of("POST")) == 4
    assert [r.headers.get("authorization") for r in fake.requests] == [f"Bearer {TOKEN}"] * len(fake.requests)


@pytest.mark.parametrize("token", [None, TOKEN])
async def test_http_401_on_initialize_is_an_authentication_error(fake: FakeAcp, token: str | None) -> None:
    async def refuse(request: Request) -> Reply:
        # A careless server echoing the credentials: the client must not repeat them.
        echoed = request.headers.get("authorization", "nothing")
        return Reply(401, f"refused {echoed}\n", {"www-authenticate": CHALLENGE})

    fake.on_initialize = refuse
    client = HttpClient(fake.url, token=token, timeout=5)
    with pytest.raises(AuthenticationError) as refused:
        await within(client.send(INIT))
    error = refused.value
    assert isinstance(error, HttpStatusError) and error.status_code == 401
    assert error.www_authenticate == CHALLENGE
    if token is None:
        assert str(error) == "initialize: HTTP 401 Unauthorized (no credentials were sent): refused nothing"
    else:
        assert str(error) == "initialize: HTTP 401 Unauthorized (credentials refused): refused ***"
        shows_no_secret(error, TOKEN)
    # The end is the same error for a reader (no hang), then the transport is closed.
    with pytest.raises(AuthenticationError):
        await within(client.receive())
    with pytest.raises(TransportClosedError) as closed:
        await within(client.send(INIT))
    shows_no_secret(closed.value, TOKEN)
    await within(client.close())
    assert not fake.of("GET") and not fake.of("DELETE")  # no connection was made


async def test_http_403_on_initialize_is_an_authentication_error(fake: FakeAcp) -> None:
    async def forbid(request: Request) -> Reply:
        return Reply(403, "principal team may not use this agent\n")

    fake.on_initialize = forbid
    client = HttpClient(fake.url, token=TOKEN, timeout=5)
    with pytest.raises(AuthenticationError, match=r"^initialize: HTTP 403 Forbidden: principal team may not"):
        await within(client.send(INIT))
    await within(client.close())


async def test_a_refused_stream_after_initialize_ends_the_transport(fake: FakeAcp) -> None:
    """A 401 on the connection stream (e.g. the token was revoked) is fatal, typed, and the
    connection is deleted; a 404 stays a plain HttpStatusError."""

    async def on_get(request: Request) -> Reply | Stream:
        return Reply(401, "token revoked\n", {"www-authenticate": CHALLENGE})

    fake.on_get = on_get
    client = HttpClient(fake.url, token=TOKEN, timeout=5)
    with pytest.raises(AuthenticationError, match="GET connection stream: HTTP 401") as refused:
        await within(client.send(INIT))
    assert refused.value.www_authenticate == CHALLENGE
    await within(client.close())
    deletes = fake.of("DELETE")
    assert len(deletes) == 1 and deletes[0].connection_id == CONNECTION_ID
    assert deletes[0].headers["authorization"] == f"Bearer {TOKEN}"

    async def not_found(request: Request) -> Reply:
        return Reply(404)

    fake.on_get = not_found
    other = HttpClient(fake.url, token=TOKEN, timeout=5)
    with pytest.raises(HttpStatusError) as missing:
        await within(other.send(INIT))
    assert not isinstance(missing.value, AuthenticationError)
    await within(other.close())


async def test_an_authorization_header_in_headers_counts_as_credentials(fake: FakeAcp) -> None:
    async def refuse(request: Request) -> Reply:
        return Reply(401, f"bad {request.headers['authorization']}")

    fake.on_initialize = refuse
    client = HttpClient(fake.url, headers={"Authorization": "Basic dXNlcjpwdw=="}, timeout=5)
    with pytest.raises(AuthenticationError) as refused:
        await within(client.send(INIT))
    assert str(refused.value) == "initialize: HTTP 401 Unauthorized (credentials refused): bad ***"
    await within(client.close())


# ------------------------------------------------------------------------------- WebSocket


class FakeWs:
    """A `websockets` server that records each upgrade request, chooses subprotocol `acp` when
    offered, and can refuse the upgrade with a status."""

    def __init__(self, *, reject: tuple[int, dict[str, str]] | None = None) -> None:
        self.reject = reject
        self.upgrades: list[Headers] = []
        self.frames: list[Any] = []

    async def handler(self, ws: ServerConnection) -> None:
        async for message in ws:
            self.frames.append(json.loads(message))
            await ws.send(json.dumps({"jsonrpc": "2.0", "id": 0, "result": {"protocolVersion": 1}}))

    def process_request(self, connection: ServerConnection, request: WsRequest) -> WsResponse | None:
        self.upgrades.append(request.headers)
        if self.reject is None:
            return None
        status, headers = self.reject
        offered = request.headers.get("Authorization", "") + request.headers.get("Sec-WebSocket-Protocol", "")
        response = connection.respond(status, f"refused {offered}\n")
        for name, value in headers.items():
            response.headers[name] = value
        return response

    async def __aenter__(self) -> str:
        self._server = await serve(
            self.handler,
            "127.0.0.1",
            0,
            process_request=self.process_request,
            select_subprotocol=lambda connection, offered: Subprotocol("acp") if "acp" in offered else None,
        )
        port = next(iter(self._server.sockets)).getsockname()[1]
        return f"ws://127.0.0.1:{port}/acp"

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        await within(self._server.wait_closed())


async def test_websocket_sends_the_token_on_the_upgrade() -> None:
    fake = FakeWs()
    async with fake as url, HttpClient(url, token=TOKEN, timeout=5) as client:
        await within(client.send(INIT))
        assert (await within(client.receive()))["id"] == 0
        upgrade = fake.upgrades[0]
        assert upgrade.get_all("Authorization") == [f"Bearer {TOKEN}"]
        assert "Sec-WebSocket-Protocol" not in upgrade
        assert client.transport.subprotocol is None  # type: ignore[union-attr]


async def test_websocket_token_as_the_browser_subprotocol() -> None:
    fake = FakeWs()
    async with fake as url:
        async with HttpClient(url, token=TOKEN, websocket_token="subprotocol", timeout=5) as client:
            await within(client.send(INIT))
            assert (await within(client.receive()))["id"] == 0
            assert client.transport.subprotocol == "acp"  # type: ignore[union-attr]
        upgrade = fake.upgrades[0]
        assert upgrade["Sec-WebSocket-Protocol"] == f"acp, acp.bearer.{TOKEN}"
        assert "Authorization" not in upgrade


@pytest.mark.parametrize("form", ["header", "subprotocol"])
@pytest.mark.parametrize("status", [401, 403])
async def test_websocket_refusal_is_an_authentication_error(form: str, status: int) -> None:
    headers = {"WWW-Authenticate": CHALLENGE} if status == 401 else {}
    async with FakeWs(reject=(status, headers)) as url:
        client = HttpClient(url, token=TOKEN, websocket_token=form, timeout=5)  # type: ignore[arg-type]
        with pytest.raises(AuthenticationError) as refused:
            await within(client.send(INIT))
        error = refused.value
        assert error.status_code == status
        assert str(error).startswith(f"WebSocket upgrade: HTTP {status} ")
        assert "refused " in str(error) and "***" in str(error)  # the echoed credentials are redacted
        assert error.www_authenticate == (CHALLENGE if status == 401 else None)
        shows_no_secret(error, TOKEN)
        with pytest.raises(AuthenticationError):
            await within(client.receive())
        await within(client.close())


# ---------------------------------------------------------------------------- refused locally


@pytest.mark.parametrize("token", ["", "two words", "tab\there", "line\nbreak", "del\x7f", "naïve", "nul\x00"])
def test_tokens_that_cannot_travel_in_a_header_are_refused(token: str) -> None:
    with pytest.raises(ClientUsageError) as refused:
        HttpClient("http://127.0.0.1:9", token=token)
    if token:
        assert token not in str(refused.value) and "character" in str(refused.value)


@pytest.mark.parametrize("token", ["a/b", "pad==", "a,b", "x:y", "{x}", 'q"'])
def test_tokens_that_are_not_rfc6455_tokens_are_refused_as_subprotocols(token: str) -> None:
    check_token(token)  # fine in a header
    with pytest.raises(ClientUsageError, match="RFC 6455") as refused:
        HttpClient("ws://127.0.0.1:9", token=token, websocket_token="subprotocol")
    assert token not in str(refused.value)


def test_base64url_tokens_travel_both_ways() -> None:
    token = "Zm9vYmFy-_~.!#$%&'*+^`|09"
    check_token(token)
    check_token(token, subprotocol=True)


@pytest.mark.parametrize(
    ("url", "options", "message"),
    [
        ("http://h", {"token": "t", "websocket_token": "subprotocol"}, "ws"),
        ("ws://h", {"websocket_token": "subprotocol"}, "needs a token"),
        ("ws://h", {"token": "t", "websocket_token": "query"}, "header"),
        ("http://h", {"token": "t", "headers": {"authorization": "Bearer u"}}, "not both"),
    ],
)
def test_credential_options_that_do_not_fit_are_refused(url: str, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ClientUsageError, match=message):
        HttpClient(url, **options)


def test_repr_shows_neither_token_nor_url_password() -> None:
    client = HttpClient("https://alice:pw-secret@example.com/acp", token=TOKEN)
    text = repr(client)
    assert TOKEN not in text and "pw-secret" not in text and "alice" not in text
    assert text == "HttpClient('https://example.com/acp', kind='http', connection_id=None)"
