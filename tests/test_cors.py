"""Cross-origin access to `/acp` over the wire (docs/wire-contract.md §3.3, §14 items 7-12).

CORS off (the default, `wire_server`): no Access-Control-* headers anywhere, OPTIONS is 405, and
every request with a foreign Origin is refused (HTTP 403 with a text body, WebSocket 403); the
server's own origin and requests without an Origin are served. CORS on (`cors_server`, one listed
origin): django-cors-headers answers preflights and decorates our responses for the listed origin
only; unlisted origins are refused as with CORS off; the WebSocket gate uses the same list.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus
from websockets.typing import Origin

from acp_channels._cors import same_origin
from tests.live import JSON, SSE, DaphneServer, rpc

ALLOWED = "http://allowed.example"
UNLISTED = "http://evil.example"
OWN = "own"  # stands for the server's own origin, http://127.0.0.1:<port>
TIMEOUT = 10.0


@pytest.fixture(scope="module")
def cors_server() -> Iterator[DaphneServer]:
    server = DaphneServer(
        env={
            "ACP_AGENT": "tests.wire_agent.create",
            "ACP_KEEPALIVE_SECONDS": "0.5",
            "ACP_CORS_ALLOWED_ORIGINS": ALLOWED,
        }
    ).start()
    try:
        yield server
    finally:
        server.stop()


# -- helpers ---------------------------------------------------------------------------------


def access_control(response: httpx.Response) -> dict[str, str]:
    return {
        name.lower(): value for name, value in response.headers.items() if name.lower().startswith("access-control-")
    }


def tokens(value: str | None) -> set[str]:
    return {token.strip().lower() for token in (value or "").split(",") if token.strip()}


def vary(response: httpx.Response) -> set[str]:
    return {token for value in response.headers.get_list("vary") for token in tokens(value)}


def assert_cors_for_allowed(response: httpx.Response) -> None:
    assert response.headers.get("access-control-allow-origin") == ALLOWED, access_control(response)
    assert "origin" in vary(response)
    assert {"acp-connection-id", "acp-session-id"} <= tokens(response.headers.get("access-control-expose-headers"))
    assert "access-control-allow-credentials" not in response.headers


def assert_no_cors(response: httpx.Response) -> None:
    assert access_control(response) == {}


def own_origin(server: DaphneServer, origin: str | None) -> str | None:
    return f"http://127.0.0.1:{server.port}" if origin == OWN else origin


def origin_headers(origin: str | None, **headers: str) -> dict[str, str]:
    return {**({"Origin": origin} if origin is not None else {}), **headers}


async def initialize(http: httpx.AsyncClient, url: str, origin: str | None) -> httpx.Response:
    response = await http.post(url, headers=origin_headers(origin, **JSON), json=rpc(0, "initialize", {}))
    assert response.status_code == 200, response.text
    assert response.headers.get("acp-connection-id")
    return response


@contextlib.asynccontextmanager
async def sse(http: httpx.AsyncClient, url: str, headers: dict[str, str]) -> AsyncIterator[httpx.Response]:
    response = await http.send(http.build_request("GET", url, headers=headers), stream=True)
    try:
        yield response
    finally:
        await response.aclose()


async def responses_of_every_kind(http: httpx.AsyncClient, url: str, origin: str | None) -> dict[str, httpx.Response]:
    """One response per status class the endpoint produces, all sent with `origin`."""
    got: dict[str, httpx.Response] = {}
    got["initialize 200"] = init = await initialize(http, url, origin)
    connection_id = init.headers["acp-connection-id"]
    with_id = {"Acp-Connection-Id": connection_id}
    async with sse(http, url, origin_headers(origin, **SSE, **with_id)) as stream:
        assert stream.status_code == 200
        got["sse 200"] = stream
        got["post 202"] = await http.post(url, headers=origin_headers(origin, **JSON, **with_id), json=rpc(1, "x/y"))
    got["post 400"] = await http.post(url, headers=origin_headers(origin, **JSON), json=rpc(2, "x/y"))
    got["post 404"] = await http.post(
        url, headers=origin_headers(origin, **JSON, **{"Acp-Connection-Id": "no-such-connection"}), json=rpc(3, "x/y")
    )
    got["post 415"] = await http.post(url, headers=origin_headers(origin, **with_id), content=b"{}")
    got["get 406"] = await http.get(url, headers=origin_headers(origin, **with_id))
    got["delete 202"] = await http.delete(url, headers=origin_headers(origin, **with_id))
    got["delete 404"] = await http.delete(url, headers=origin_headers(origin, **with_id))
    for name, response in got.items():
        assert response.status_code == int(name.split()[-1]), (name, response.status_code, response.text)
    return got


async def refused_requests(http: httpx.AsyncClient, url: str, origin: str) -> dict[str, httpx.Response]:
    """One request of each method with a foreign `origin`, each asserted refused: 403, text."""
    init = await initialize(http, url, None)
    with_id = origin_headers(origin, **{"Acp-Connection-Id": init.headers["acp-connection-id"]})
    got = {
        "initialize": await http.post(url, headers=origin_headers(origin, **JSON), json=rpc(0, "initialize", {})),
        "post": await http.post(url, headers={**JSON, **with_id}, json=rpc(1, "x/y")),
    }
    async with sse(http, url, {**SSE, **with_id}) as stream:  # an open stream would never end
        if stream.status_code != 200:
            await stream.aread()
        got["get"] = stream
    got["delete"] = await http.delete(url, headers=with_id)
    await http.delete(url, headers={"Acp-Connection-Id": init.headers["acp-connection-id"]})
    for name, response in got.items():
        assert (response.status_code, response.text) == (403, "origin not allowed"), name
    return got


async def ws_status(url: str, origin: str | None) -> int:
    """101 when the upgrade is accepted (and a round trip works), else the refusal's status."""
    try:
        async with connect(
            url,
            origin=Origin(origin) if origin is not None else None,
            proxy=None,
            open_timeout=TIMEOUT,
            close_timeout=TIMEOUT,
        ) as ws:
            await ws.send('{"jsonrpc":"2.0","id":1,"method":"cors/ws"}')
            reply = await asyncio.wait_for(ws.recv(), TIMEOUT)
            assert isinstance(reply, str)
            assert json.loads(reply)["id"] == 1
            return ws.response.status_code
    except InvalidStatus as refused:
        return refused.response.status_code


# -- CORS off --------------------------------------------------------------------------------


@pytest.mark.parametrize("origin", [OWN, None])
async def test_cors_off_sends_no_access_control_headers(
    wire_server: DaphneServer, http: httpx.AsyncClient, origin: str | None
) -> None:
    origin = own_origin(wire_server, origin)
    for name, response in (await responses_of_every_kind(http, wire_server.url, origin)).items():
        assert access_control(response) == {}, name
        assert "origin" not in vary(response), name


@pytest.mark.parametrize("origin", [ALLOWED, UNLISTED, "null"])
async def test_cors_off_refuses_http_from_any_foreign_origin(
    wire_server: DaphneServer, http: httpx.AsyncClient, origin: str
) -> None:
    for name, response in (await refused_requests(http, wire_server.url, origin)).items():
        assert access_control(response) == {}, name


async def test_cors_off_options_is_405(wire_server: DaphneServer, http: httpx.AsyncClient) -> None:
    headers = {
        "Origin": ALLOWED,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type,acp-connection-id",
    }
    response = await http.options(wire_server.url, headers=headers)
    assert response.status_code == 405
    assert_no_cors(response)
    assert {"get", "post", "delete"} <= tokens(response.headers.get("allow"))


@pytest.mark.parametrize("origin", [ALLOWED, "null", "http://127.0.0.1"])
async def test_cors_off_refuses_websocket_with_any_foreign_origin(wire_server: DaphneServer, origin: str) -> None:
    assert await ws_status(wire_server.ws_url, origin) == 403


async def test_cors_off_accepts_websocket_from_its_own_origin(wire_server: DaphneServer) -> None:
    assert await ws_status(wire_server.ws_url, own_origin(wire_server, OWN)) == 101


async def test_cors_off_accepts_websocket_without_origin(wire_server: DaphneServer) -> None:
    assert await ws_status(wire_server.ws_url, None) == 101


# -- CORS on: HTTP ---------------------------------------------------------------------------


async def test_listed_origin_gets_cors_headers_on_every_response(
    cors_server: DaphneServer, http: httpx.AsyncClient
) -> None:
    for name, response in (await responses_of_every_kind(http, cors_server.url, ALLOWED)).items():
        try:
            assert_cors_for_allowed(response)
        except AssertionError as error:
            raise AssertionError(f"{name}: {error}") from error


@pytest.mark.parametrize("origin", [OWN, None])
async def test_own_or_missing_origin_is_served_without_cors_headers(
    cors_server: DaphneServer, http: httpx.AsyncClient, origin: str | None
) -> None:
    origin = own_origin(cors_server, origin)
    for name, response in (await responses_of_every_kind(http, cors_server.url, origin)).items():
        assert access_control(response) == {}, name


@pytest.mark.parametrize("origin", [UNLISTED, "HTTP://ALLOWED.EXAMPLE", ALLOWED + "/", "null"])
async def test_unlisted_origin_is_refused_with_403_without_cors_headers(
    cors_server: DaphneServer, http: httpx.AsyncClient, origin: str
) -> None:
    for name, response in (await refused_requests(http, cors_server.url, origin)).items():
        assert access_control(response) == {}, name
        assert "origin" in vary(response), name


@pytest.mark.parametrize("origin", [OWN, None])
async def test_every_response_varies_by_origin_when_cors_is_on(
    cors_server: DaphneServer, http: httpx.AsyncClient, origin: str | None
) -> None:
    response = await initialize(http, cors_server.url, own_origin(cors_server, origin))
    await http.delete(cors_server.url, headers={"Acp-Connection-Id": response.headers["acp-connection-id"]})
    assert "origin" in vary(response)


@pytest.mark.parametrize("method", ["POST", "GET", "DELETE"])
async def test_preflight_from_listed_origin(cors_server: DaphneServer, http: httpx.AsyncClient, method: str) -> None:
    headers = {
        "Origin": ALLOWED,
        "Access-Control-Request-Method": method,
        "Access-Control-Request-Headers": "content-type,acp-connection-id,acp-session-id",
    }
    response = await http.options(cors_server.url, headers=headers)
    assert response.status_code == 200
    assert response.content == b""
    assert response.headers.get("access-control-allow-origin") == ALLOWED
    assert "origin" in vary(response)
    assert {"get", "post", "delete"} <= tokens(response.headers.get("access-control-allow-methods"))
    allowed_headers = tokens(response.headers.get("access-control-allow-headers"))
    assert {"acp-connection-id", "acp-session-id", "content-type", "accept"} <= allowed_headers
    assert "access-control-allow-credentials" not in response.headers


async def test_preflight_lists_each_header_once_and_only_methods_we_serve(
    cors_server: DaphneServer, http: httpx.AsyncClient
) -> None:
    """What the settings the docs recommend send (the demo uses them): no header name twice, no
    PUT or PATCH (the endpoint answers those 405)."""
    headers = {"Origin": ALLOWED, "Access-Control-Request-Method": "POST"}
    response = await http.options(cors_server.url, headers=headers)
    names = [name.strip().lower() for name in response.headers["access-control-allow-headers"].split(",")]
    assert len(names) == len(set(names)), names
    assert tokens(response.headers["access-control-allow-methods"]) == {"delete", "get", "options", "post"}


async def test_preflight_from_unlisted_origin_is_200_without_acao(
    cors_server: DaphneServer, http: httpx.AsyncClient
) -> None:
    headers = {"Origin": UNLISTED, "Access-Control-Request-Method": "POST"}
    response = await http.options(cors_server.url, headers=headers)
    assert response.status_code == 200
    assert "access-control-allow-origin" not in response.headers


async def test_preflight_from_unlisted_origin_grants_nothing(
    cors_server: DaphneServer, http: httpx.AsyncClient
) -> None:
    headers = {
        "Origin": UNLISTED,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type",
    }
    response = await http.options(cors_server.url, headers=headers)
    assert access_control(response) == {}


async def test_the_session_directory_answers_a_listed_origin(
    cors_server: DaphneServer, http: httpx.AsyncClient
) -> None:
    """A page on another origin lists its sessions (docs/shared-sessions.md): the preflight
    grants it, the answer carries the origin."""
    directory = cors_server.url + "/sessions"
    preflight = await http.options(
        directory,
        headers={
            "Origin": ALLOWED,
            "Access-Control-Request-Method": "GET",
            "Access-Control-Request-Headers": "authorization",
        },
    )
    assert preflight.status_code == 200
    assert preflight.headers.get("access-control-allow-origin") == ALLOWED
    response = await http.get(directory, headers={"Origin": ALLOWED})
    assert response.status_code == 200  # this server serves everyone (and lists nothing to anonymous)
    assert response.headers.get("access-control-allow-origin") == ALLOWED
    assert "origin" in vary(response)
    unlisted = await http.get(directory, headers={"Origin": UNLISTED})
    assert unlisted.status_code == 403 and "access-control-allow-origin" not in unlisted.headers


async def test_cors_is_scoped_to_the_acp_endpoint(cors_server: DaphneServer, http: httpx.AsyncClient) -> None:
    elsewhere = cors_server.url.removesuffix("/acp") + "/elsewhere"
    response = await http.get(elsewhere, headers={"Origin": ALLOWED})
    assert response.status_code == 404
    assert_no_cors(response)
    preflight = await http.options(elsewhere, headers={"Origin": ALLOWED, "Access-Control-Request-Method": "POST"})
    assert preflight.status_code != 200
    assert_no_cors(preflight)


# -- CORS on: WebSocket ----------------------------------------------------------------------


async def test_websocket_with_listed_origin_is_accepted(cors_server: DaphneServer) -> None:
    assert await ws_status(cors_server.ws_url, ALLOWED) == 101


@pytest.mark.parametrize("origin", [UNLISTED, "HTTP://ALLOWED.EXAMPLE", ALLOWED + "/", "null"])
async def test_websocket_with_unlisted_origin_is_refused_with_403(cors_server: DaphneServer, origin: str) -> None:
    assert await ws_status(cors_server.ws_url, origin) == 403


async def test_websocket_without_origin_is_accepted(cors_server: DaphneServer) -> None:
    assert await ws_status(cors_server.ws_url, None) == 101


async def test_websocket_from_its_own_origin_is_accepted(cors_server: DaphneServer) -> None:
    assert await ws_status(cors_server.ws_url, own_origin(cors_server, OWN)) == 101


# -- the same-origin rule --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("origin", "host", "secure"),
    [
        ("http://127.0.0.1:8000", "127.0.0.1:8000", False),
        ("http://example.com", "example.com", False),
        ("http://example.com", "example.com:80", False),  # default ports are the same origin
        ("http://example.com:80", "example.com", False),
        ("https://example.com", "example.com:443", True),
        ("https://example.com:443", "example.com", True),
        ("http://EXAMPLE.com", "example.COM", False),  # names compare case-insensitively
        ("http://[::1]:8000", "[::1]:8000", False),
        ("https://example.com:8443", "example.com:8443", True),
    ],
)
def test_same_origin(origin: str, host: str, secure: bool) -> None:
    assert same_origin(origin, host, secure=secure)


@pytest.mark.parametrize(
    ("origin", "host", "secure"),
    [
        ("https://example.com", "example.com", False),  # an https page, a ws (not wss) socket
        ("http://example.com", "example.com", True),  # an http page, a wss socket
        ("http://example.com:8000", "example.com", False),
        ("http://example.com", "example.com:8000", False),
        ("https://example.com", "example.com:80", True),
        ("http://evil.example", "example.com", False),
        ("http://example.com.evil.example", "example.com", False),
        ("http://example.com/", "example.com", False),  # not a serialized origin
        ("http://user@example.com", "example.com", False),
        ("null", "example.com", False),
        ("file://", "example.com", False),
        ("ws://example.com", "example.com", False),
        ("http://example.com", "user@example.com", False),
        ("http://example.com:99999", "example.com:99999", False),
        ("http://[::1]:8000", "[::1:8000", False),
        ("http://example.com, http://evil.example", "example.com", False),  # a repeated header
    ],
)
def test_not_same_origin(origin: str, host: str, secure: bool) -> None:
    assert not same_origin(origin, host, secure=secure)
