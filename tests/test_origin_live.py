"""Host and Origin safety on a live daphne: same-origin browsers, DNS rebinding, loopback hosts.

- A page served by this server (Origin equal to the Host, scheme-aware) may open a WebSocket and
  POST: only foreign origins are refused (the README's promise; same-origin upgrades were 403).
- DNS rebinding: a page on a foreign name that resolves to the server sends that name as Host
  and as its own Origin. The demo allows only loopback hosts (ACP_ALLOWED_HOSTS widens it), on
  HTTP (400) and on the WebSocket upgrade (403), and a foreign Origin is refused on HTTP (403,
  plain text) as on the WebSocket: before, every one of them reached the agent.
- Requests without an Origin (non-browser clients) are served as before.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus
from websockets.typing import Origin

from tests.conftest import WIRE_ENV
from tests.live import JSON, DaphneServer, open_sse, rpc

TIMEOUT = 10.0
REBOUND = "rebound.example"  # a foreign name whose DNS answer is this server


@pytest.fixture(scope="module")
def wire_server() -> Iterator[DaphneServer]:
    """One worker: Host and Origin are checked per request, wherever it lands."""
    server = DaphneServer(env=WIRE_ENV).start()
    yield server
    server.stop()


async def ws_status(
    server: DaphneServer, *, origin: str | None = None, host: str | None = None, headers: dict[str, str] | None = None
) -> int:
    """101 when the upgrade is accepted (and a round trip works), else the refusal's status.
    `host` is the name the client believes it connects to (the Host header); the TCP connection
    always goes to the server on loopback."""
    url = f"ws://{host}/acp" if host is not None else server.ws_url
    try:
        async with connect(
            url,
            host="127.0.0.1",
            port=server.port,
            origin=Origin(origin) if origin is not None else None,
            additional_headers=headers,
            proxy=None,
            open_timeout=TIMEOUT,
            close_timeout=TIMEOUT,
        ) as ws:
            await ws.send(json.dumps(rpc(1, "origin/ws")))
            reply = await asyncio.wait_for(ws.recv(), TIMEOUT)
            assert json.loads(reply)["id"] == 1
            return ws.response.status_code
    except InvalidStatus as refused:
        return refused.response.status_code


async def post_initialize(
    http: httpx.AsyncClient, server: DaphneServer, *, origin: str | None = None, host: str | None = None
) -> httpx.Response:
    headers = dict(JSON)
    if origin is not None:
        headers["Origin"] = origin
    if host is not None:
        headers["Host"] = host
    response = await http.post(server.url, headers=headers, json=rpc(0, "initialize", {"protocolVersion": 1}))
    if response.status_code == 200:  # do not leave the agent behind
        await http.delete(server.url, headers={"Acp-Connection-Id": response.headers["acp-connection-id"]})
    return response


def own_origin(server: DaphneServer, name: str = "127.0.0.1") -> str:
    return f"http://{name}:{server.port}"


# -- same origin -----------------------------------------------------------------------------


async def test_a_same_origin_websocket_is_accepted(wire_server: DaphneServer) -> None:
    assert await ws_status(wire_server, origin=own_origin(wire_server)) == 101


@pytest.mark.parametrize("name", ["localhost", "[::1]"])
async def test_same_origin_under_other_loopback_names_is_accepted(wire_server: DaphneServer, name: str) -> None:
    host = f"{name}:{wire_server.port}"
    assert await ws_status(wire_server, origin=f"http://{host}", host=host) == 101


@pytest.mark.parametrize(
    "origin",
    [
        "https://127.0.0.1:{port}",  # the scheme differs (the socket is ws, not wss)
        "http://127.0.0.1",  # port 80, not the server's
        "http://127.0.0.1:{other}",
        "http://localhost:{port}",  # another name than the Host's
        "http://127.0.0.1:{port}/",  # not an origin
        "null",
    ],
)
async def test_near_misses_of_the_own_origin_are_foreign(wire_server: DaphneServer, origin: str) -> None:
    origin = origin.format(port=wire_server.port, other=wire_server.port + 1)
    assert await ws_status(wire_server, origin=origin) == 403


async def test_a_same_origin_post_is_served(wire_server: DaphneServer, http: httpx.AsyncClient) -> None:
    response = await post_initialize(http, wire_server, origin=own_origin(wire_server))
    assert response.status_code == 200, response.text


# -- foreign origins over HTTP -----------------------------------------------------------------


@pytest.mark.parametrize("origin", ["http://evil.example", "null", "http://127.0.0.1"])
async def test_a_foreign_origin_is_refused_over_http_with_403(
    wire_server: DaphneServer, http: httpx.AsyncClient, origin: str
) -> None:
    connection_id = (await http.post(wire_server.url, headers=JSON, json=rpc(0, "initialize", {}))).headers[
        "acp-connection-id"
    ]
    with_id = {"Acp-Connection-Id": connection_id, "Origin": origin}
    refused = {
        "initialize": await post_initialize(http, wire_server, origin=origin),
        "post": await http.post(wire_server.url, headers={**JSON, **with_id}, json=rpc(1, "x/y")),
    }
    get = http.build_request("GET", wire_server.url, headers={"Accept": "text/event-stream", **with_id})
    refused["get"] = stream = await http.send(get, stream=True)  # an open stream would never end
    if stream.status_code != 200:
        await stream.aread()
    await stream.aclose()
    refused["delete"] = await http.delete(wire_server.url, headers=with_id)
    for name, response in refused.items():
        assert (response.status_code, response.text) == (403, "origin not allowed"), name
        assert response.headers["content-type"] == "text/plain; charset=utf-8", name
    # Nothing reached the agent, and the connection is intact.
    async with open_sse(http, wire_server.url, connection_id) as stream:
        await http.post(
            wire_server.url, headers={**JSON, "Acp-Connection-Id": connection_id}, json=rpc("r", "test/received")
        )
        reply = await stream.next()
    assert reply["id"] == "r" and [json.loads(frame)["method"] for frame in reply["result"]["frames"]] == [
        "initialize"
    ], reply
    assert (await http.delete(wire_server.url, headers={"Acp-Connection-Id": connection_id})).status_code == 202


# -- DNS rebinding: hosts ----------------------------------------------------------------------


async def test_a_rebound_name_is_refused_over_http(wire_server: DaphneServer, http: httpx.AsyncClient) -> None:
    host = f"{REBOUND}:{wire_server.port}"
    for origin in (f"http://{host}", None):  # the rebound page itself, or any client using the name
        response = await post_initialize(http, wire_server, origin=origin, host=host)
        assert (response.status_code, response.text) == (400, "host not allowed"), origin


async def test_a_rebound_name_is_refused_on_the_websocket(wire_server: DaphneServer) -> None:
    host = f"{REBOUND}:{wire_server.port}"
    assert await ws_status(wire_server, origin=f"http://{host}", host=host) == 403
    assert await ws_status(wire_server, host=host) == 403


@pytest.mark.parametrize("name", ["localhost", "127.0.0.1", "[::1]"])
async def test_loopback_names_are_allowed_by_default(
    wire_server: DaphneServer, http: httpx.AsyncClient, name: str
) -> None:
    response = await post_initialize(http, wire_server, host=f"{name}:{wire_server.port}")
    assert response.status_code == 200, response.text


@pytest.fixture(scope="module")
def named_server() -> Iterator[DaphneServer]:
    server = DaphneServer(env={"ACP_AGENT": "tests.wire_agent.create", "ACP_ALLOWED_HOSTS": f"acp.example,{REBOUND}"})
    server.start()
    yield server
    server.stop()


async def test_acp_allowed_hosts_names_the_served_hosts(named_server: DaphneServer, http: httpx.AsyncClient) -> None:
    port = named_server.port
    assert (await post_initialize(http, named_server, host=f"acp.example:{port}")).status_code == 200
    assert (await post_initialize(http, named_server, host=f"127.0.0.1:{port}")).status_code == 400
    # A page on a listed name is same-origin there.
    own = f"{REBOUND}:{port}"
    assert (await post_initialize(http, named_server, origin=f"http://{own}", host=own)).status_code == 200
    assert await ws_status(named_server, origin=f"http://{own}", host=own) == 101
    assert await ws_status(named_server, host=f"127.0.0.1:{port}") == 403


# -- behind a TLS-terminating proxy (daphne --proxy-headers) ----------------------------------


class ProxiedDaphne(DaphneServer):
    """daphne trusting X-Forwarded-For/-Proto, as behind a proxy that sets them."""

    def command(self) -> tuple[list[str], Path, dict[str, str] | None]:
        argv, cwd, env = super().command()
        return [*argv[:-1], "--proxy-headers", argv[-1]], cwd, env


@pytest.fixture(scope="module")
def proxied_server() -> Iterator[DaphneServer]:
    server = ProxiedDaphne(env=WIRE_ENV).start()
    yield server
    server.stop()


async def test_a_wss_page_behind_the_proxy_is_its_own_origin(proxied_server: DaphneServer) -> None:
    """daphne leaves the scheme out of WebSocket scopes; acp_channels._daphne_compat fills it in
    from X-Forwarded-Proto (with --proxy-headers) or the TLS transport."""
    own = f"https://127.0.0.1:{proxied_server.port}"
    proxied = {"X-Forwarded-For": "203.0.113.7", "X-Forwarded-Proto": "https"}
    assert await ws_status(proxied_server, origin=own, headers=proxied) == 101
    assert await ws_status(proxied_server, origin=own) == 403  # the same page, but this socket is ws
    assert await ws_status(proxied_server, origin=own.replace("https", "http"), headers=proxied) == 403
