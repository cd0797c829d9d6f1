"""Authentication on a live server (daphne; one worker, and three workers behind a balancer):
bearer tokens over HTTP and WebSocket (header and subprotocol), every refusal, connections bound
to their principal (a stolen id is 404 for anyone else, on any worker), the per-principal quota,
and the audit log lines (which never carry a token).

The token server: ACP_AUTHENTICATE = bearer_token with tests.auth_fixtures.lookup (alice and bob
are principals; carol is a user without REQUIRED_PERMISSION "acp.use", dave one with it). The
session site (tests.auth_site, sqlite): django_user with real login sessions, and the
cross-site (CSRF) refusals.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests import auth_fixtures as tokens
from tests import forked
from tests.cluster import Cluster
from tests.conftest import SHAPES, start_server
from tests.live import JSON, ROOT, SSE, DaphneServer, rpc, wait_for_line

QUOTA = 2
AUTH_ENV = {
    "ACP_AGENT": "tests.wire_agent.create",
    "ACP_KEEPALIVE_SECONDS": "0.5",
    "ACP_AUTHENTICATE": "acp_channels.auth.bearer_token",
    "ACP_TOKEN_LOOKUP": "tests.auth_fixtures.lookup",
    "ACP_REQUIRED_PERMISSION": "acp.use",
    "ACP_MAX_CONNECTIONS_PER_PRINCIPAL": str(QUOTA),
}
CHALLENGE = 'Bearer realm="acp"'
INVALID = 'Bearer realm="acp", error="invalid_token"'
ALL_TOKENS = [tokens.ALICE, tokens.BOB, tokens.CAROL, tokens.DAVE, tokens.EVE, "not-a-token-987654321"]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module", params=SHAPES)
def server(request: pytest.FixtureRequest) -> Iterator[DaphneServer | Cluster]:
    live = start_server(request.param, AUTH_ENV, request)
    yield live
    live.stop()
    assert live.errors() == []
    log = "".join(live.log)
    assert not [token for token in ALL_TOKENS if token in log], "a token reached the server log"


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    # A new TCP connection per request: through the balancer, consecutive requests of one ACP
    # connection land on different workers.
    async with httpx.AsyncClient(timeout=20.0, limits=httpx.Limits(max_keepalive_connections=0)) as client:
        yield client


async def initialize(http: httpx.AsyncClient, url: str, token: str) -> str:
    response = await http.post(url, headers={**JSON, **bearer(token)}, json=rpc(0, "initialize", {}))
    assert response.status_code == 200, response.text
    return response.headers["acp-connection-id"]


def no_token_in(response: httpx.Response) -> None:
    shown = response.text + json.dumps(dict(response.headers))
    assert not [token for token in ALL_TOKENS if token in shown]


# -- refusals over HTTP ------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["POST", "GET", "HEAD", "DELETE"])
async def test_no_token_is_401_with_a_challenge(
    server: DaphneServer | Cluster, http: httpx.AsyncClient, method: str
) -> None:
    headers = {**JSON, **SSE, "Acp-Connection-Id": "0" * 36}
    body = json.dumps(rpc(0, "initialize", {})) if method == "POST" else None
    response = await http.request(method, server.url, headers=headers, content=body)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == CHALLENGE
    if method != "HEAD":
        assert response.text == "authentication required"


@pytest.mark.parametrize(
    "authorization",
    ["Bearer not-a-token-987654321", "Basic YWxpY2U6c2VjcmV0", "Bearer", f"Token {tokens.ALICE}"],
    ids=["unknown-token", "basic", "empty-bearer", "other-scheme"],
)
async def test_bad_credentials_are_401_invalid_token(
    server: DaphneServer | Cluster, http: httpx.AsyncClient, authorization: str
) -> None:
    response = await http.post(
        server.url, headers={**JSON, "Authorization": authorization}, json=rpc(0, "initialize", {})
    )
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == INVALID
    assert response.text == "invalid or expired token"
    no_token_in(response)


async def test_a_token_in_the_query_string_is_not_a_credential(
    server: DaphneServer | Cluster, http: httpx.AsyncClient
) -> None:
    for query in (f"?access_token={tokens.ALICE}", f"?token={tokens.ALICE}"):
        response = await http.post(server.url + query, headers=JSON, json=rpc(0, "initialize", {}))
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == CHALLENGE


async def test_a_user_without_the_permission_is_403(server: DaphneServer | Cluster, http: httpx.AsyncClient) -> None:
    response = await http.post(server.url, headers={**JSON, **bearer(tokens.CAROL)}, json=rpc(0, "initialize", {}))
    assert response.status_code == 403
    assert response.text == "not allowed to use this agent"
    assert "www-authenticate" not in response.headers
    # The same lookup, a user with the permission: in.
    connection_id = await initialize(http, server.url, tokens.DAVE)
    headers = {**bearer(tokens.DAVE), "Acp-Connection-Id": connection_id}
    assert (await http.delete(server.url, headers=headers)).status_code == 202


async def test_a_token_opens_and_uses_a_connection(server: DaphneServer | Cluster, http: httpx.AsyncClient) -> None:
    connection_id = await initialize(http, server.url, tokens.ALICE)
    headers = {**bearer(tokens.ALICE), "Acp-Connection-Id": connection_id}
    async with http.stream("GET", server.url, headers={**SSE, **headers}) as stream:
        assert stream.status_code == 200
        posted = await http.post(server.url, headers={**JSON, **headers}, json=rpc(7, "test/echo", {"x": 1}))
        assert posted.status_code == 202
        async for line in stream.aiter_lines():
            if line.startswith("data:"):
                assert json.loads(line[5:])["id"] == 7
                break
    assert (await http.delete(server.url, headers=headers)).status_code == 202


# -- hijack: a stolen connection id -----------------------------------------------------------


async def assert_not_found_for(
    http: httpx.AsyncClient, url: str, connection_id: str, credentials: dict[str, str]
) -> None:
    """Every request on the connection with another principal's `credentials` is answered
    exactly like an unknown id: 404, empty. Three times each: through the balancer, at least
    two land on other workers than the host's."""
    stolen = {**credentials, "Acp-Connection-Id": connection_id}
    unknown = {**credentials, "Acp-Connection-Id": connection_id.replace(connection_id[:8], "00000000", 1)}
    for _ in range(3):
        for headers in (stolen, unknown):
            for response in (
                await http.post(url, headers={**JSON, **headers}, json=rpc(1, "test/echo", {})),
                await http.get(url, headers={**SSE, **headers}),
                await http.head(url, headers={**SSE, **headers}),
                await http.delete(url, headers=headers),
            ):
                assert (response.status_code, response.content) == (404, b""), (response.request.method, headers)
                assert "content-type" not in response.headers


async def test_a_stolen_http_connection_id_is_404_for_another_principal(
    server: DaphneServer | Cluster, http: httpx.AsyncClient
) -> None:
    connection_id = await initialize(http, server.url, tokens.ALICE)
    await assert_not_found_for(http, server.url, connection_id, bearer(tokens.BOB))
    # Alice's connection is untouched by all that (bob's DELETEs ended nothing).
    owner = {**bearer(tokens.ALICE), "Acp-Connection-Id": connection_id}
    for _ in range(3):
        assert (await http.post(server.url, headers={**JSON, **owner}, json=rpc(2, "test/echo", {}))).status_code == 202
    assert (await http.delete(server.url, headers=owner)).status_code == 202


async def test_a_resumed_stream_is_the_owners_only(server: DaphneServer | Cluster, http: httpx.AsyncClient) -> None:
    """Last-Event-ID does not open a door: another principal resuming Alice's stream gets 404
    (and does not take it over); Alice resumes it."""
    connection_id = await initialize(http, server.url, tokens.ALICE)
    owner = {**bearer(tokens.ALICE), "Acp-Connection-Id": connection_id}
    async with http.stream("GET", server.url, headers={**SSE, **owner}) as stream:
        posted = await http.post(server.url, headers={**JSON, **owner}, json=rpc(7, "test/echo", {"x": 1}))
        assert posted.status_code == 202
        event_id = None
        async for line in stream.aiter_lines():
            if line.startswith("id:"):
                event_id = line[3:].strip()
            if line.startswith("data:"):
                break
        assert event_id is not None
        for _ in range(3):  # through the balancer: on the host's worker and on others
            stolen = await http.get(
                server.url,
                headers={**SSE, **bearer(tokens.BOB), "Acp-Connection-Id": connection_id, "Last-Event-ID": event_id},
            )
            assert (stolen.status_code, stolen.content) == (404, b"")
    async with http.stream("GET", server.url, headers={**SSE, **owner, "Last-Event-ID": event_id}) as resumed:
        assert resumed.status_code == 200
    assert (await http.delete(server.url, headers=owner)).status_code == 202


async def test_a_stolen_websocket_connection_id_is_404_over_http(
    server: DaphneServer | Cluster, http: httpx.AsyncClient
) -> None:
    async with connect(server.ws_url, additional_headers=bearer(tokens.ALICE), proxy=None) as ws:
        assert ws.response is not None
        connection_id = ws.response.headers["Acp-Connection-Id"]
        await assert_not_found_for(http, server.url, connection_id, bearer(tokens.BOB))
        await ws.send(json.dumps(rpc(3, "test/echo", {})))  # the socket still serves alice
        assert json.loads(await asyncio.wait_for(ws.recv(), 10))["id"] == 3


# -- WebSocket -----------------------------------------------------------------------------------


async def test_websocket_without_a_token_is_refused_before_accept(server: DaphneServer | Cluster) -> None:
    for extra in ({}, bearer("not-a-token-987654321"), bearer(tokens.CAROL)):
        with pytest.raises(InvalidStatus) as refused:
            async with connect(server.ws_url, additional_headers=extra, proxy=None):
                pass
        assert refused.value.response.status_code == 403  # daphne cannot send a 401 before accept
        assert not [token for token in ALL_TOKENS if token in str(refused.value.response.headers)]


async def test_websocket_token_in_the_subprotocol_is_refused_by_default(server: DaphneServer | Cluster) -> None:
    """acp.bearer.<token> is for old clients, with ALLOW_BEARER_SUBPROTOCOL (tests/test_auth.py,
    tests/test_bridge_live.py); browsers use tickets (tests/test_tickets_live.py)."""
    for offered in (["acp", f"acp.bearer.{tokens.ALICE}"], ["acp", "acp.bearer.wrong"]):
        with pytest.raises(InvalidStatus) as refused:
            async with connect(server.ws_url, subprotocols=offered, proxy=None):  # type: ignore[list-item]
                pass
        assert refused.value.response.status_code == 403


async def test_websocket_with_the_header_names_acp_when_offered(server: DaphneServer | Cluster) -> None:
    async with connect(
        server.ws_url,
        subprotocols=["acp"],
        additional_headers=bearer(tokens.DAVE),
        proxy=None,  # type: ignore[list-item]
    ) as ws:
        assert ws.subprotocol == "acp"


# -- quota ---------------------------------------------------------------------------------------


async def test_connections_per_principal_quota(server: DaphneServer | Cluster, http: httpx.AsyncClient) -> None:
    if isinstance(server, Cluster):
        pytest.skip("the quota is per worker; the balancer spreads a principal's connections")
    held = [await initialize(http, server.url, tokens.EVE) for _ in range(QUOTA)]
    response = await http.post(server.url, headers={**JSON, **bearer(tokens.EVE)}, json=rpc(0, "initialize", {}))
    assert response.status_code == 429
    assert response.headers["retry-after"].isdigit()
    assert response.headers["content-type"] == "text/plain; charset=utf-8"
    assert response.text == f"too many ACP connections for you on this server (at most {QUOTA}); close one"
    # Over WebSocket: accepted, then closed 1013 (try again later).
    async with connect(server.ws_url, additional_headers=bearer(tokens.EVE), proxy=None) as ws:
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
    # Another principal is not affected; and a freed slot is usable again.
    other = await initialize(http, server.url, tokens.ALICE)
    for connection_id, token in ((held[0], tokens.EVE), (other, tokens.ALICE)):
        headers = {**bearer(token), "Acp-Connection-Id": connection_id}
        assert (await http.delete(server.url, headers=headers)).status_code == 202
    held.append(await initialize(http, server.url, tokens.EVE))
    for connection_id in held[1:]:
        headers = {**bearer(tokens.EVE), "Acp-Connection-Id": connection_id}
        assert (await http.delete(server.url, headers=headers)).status_code == 202


# -- audit -----------------------------------------------------------------------------------------


async def test_audit_lines_at_open_and_end(server: DaphneServer | Cluster, http: httpx.AsyncClient) -> None:
    connection_id = await initialize(http, server.url, tokens.ALICE)
    opened = await wait_for_line(server, rf"connection opened .*connection={re.escape(connection_id)}")
    assert re.search(
        rf"connection opened principal=token:alice connection={re.escape(connection_id)} transport=http "
        r"remote=127\.0\.0\.1$",
        opened.rstrip(),
    ), opened
    headers = {**bearer(tokens.ALICE), "Acp-Connection-Id": connection_id}
    assert (await http.delete(server.url, headers=headers)).status_code == 202
    ended = await wait_for_line(server, rf"connection ended .*connection={re.escape(connection_id)}")
    assert re.search(
        rf"connection ended principal=token:alice connection={re.escape(connection_id)} transport=http "
        r"remote=127\.0\.0\.1 duration=\d+\.\d{3}s reason=delete$",
        ended.rstrip(),
    ), ended

    async with connect(server.ws_url, subprotocols=["acp"], additional_headers=bearer(tokens.BOB), proxy=None) as ws:  # type: ignore[list-item]
        assert ws.response is not None
        socket_id = ws.response.headers["Acp-Connection-Id"]
        await wait_for_line(
            server, rf"connection opened principal=token:bob connection={socket_id} transport=websocket"
        )
    await wait_for_line(
        server,
        rf"connection ended principal=token:bob connection={socket_id} transport=websocket .* reason=socket closed",
    )
    for line in (opened, ended):
        assert not [token for token in ALL_TOKENS if token in line]
    # Each event is logged once (not again by a propagating root handler).
    assert sum(f"connection={connection_id} " in line for line in server.log) == 2


# -- Django users by session cookie, and cross-site requests (CSRF) ----------------------------------

SITE_ENV = {"ACP_AGENT": "tests.wire_agent.create", "ACP_KEEPALIVE_SECONDS": "0.5"}
CROSS_SITE = "cross-site request refused"


@pytest.fixture(scope="module", params=SHAPES)
def site(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SessionSite]:
    database = tmp_path_factory.mktemp("auth-site") / "db.sqlite3"
    env = {**SITE_ENV, "DJANGO_SETTINGS_MODULE": "tests.auth_site", "ACP_TEST_DATABASE": str(database)}
    prepared = forked.run(
        [sys.executable, "-m", "tests.auth_site"],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    cookies: dict[str, str] = json.loads(prepared.stdout)
    live = start_server(request.param, env, request)
    yield SessionSite(live, cookies)
    live.stop()
    assert live.errors() == []
    assert not [cookie for cookie in cookies.values() if cookie in "".join(live.log)]


@dataclass
class SessionSite:
    server: DaphneServer | Cluster
    cookies: dict[str, str]

    def login(self, name: str) -> dict[str, str]:
        return {"Cookie": f"sessionid={self.cookies[name]}"}

    @property
    def own_origin(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"


async def session_initialize(http: httpx.AsyncClient, site: SessionSite, name: str, **headers: str) -> httpx.Response:
    return await http.post(
        site.server.url, headers={**JSON, **site.login(name), **headers}, json=rpc(0, "initialize", {})
    )


async def test_session_user_opens_a_connection_others_cannot_use(site: SessionSite, http: httpx.AsyncClient) -> None:
    response = await session_initialize(http, site, "alice")
    assert response.status_code == 200, response.text
    connection_id = response.headers["acp-connection-id"]
    await assert_not_found_for(http, site.server.url, connection_id, site.login("bob"))
    owner = {**site.login("alice"), "Acp-Connection-Id": connection_id}
    assert (
        await http.post(site.server.url, headers={**JSON, **owner}, json=rpc(1, "test/echo", {}))
    ).status_code == 202
    assert (await http.delete(site.server.url, headers=owner)).status_code == 202


async def test_session_refusals(site: SessionSite, http: httpx.AsyncClient) -> None:
    anonymous = await http.post(site.server.url, headers=JSON, json=rpc(0, "initialize", {}))
    assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"] == 'Cookie realm="acp"'
    forged = await http.post(
        site.server.url, headers={**JSON, "Cookie": "sessionid=forged0123456789"}, json=rpc(0, "initialize", {})
    )
    assert forged.status_code == 401
    without_permission = await session_initialize(http, site, "carol")
    assert (without_permission.status_code, without_permission.text) == (403, "not allowed to use this agent")
    for headers in ({}, {"Cookie": "sessionid=forged0123456789"}, site.login("carol")):
        with pytest.raises(InvalidStatus) as refused:
            async with connect(site.server.ws_url, additional_headers=headers, proxy=None):
                pass
        assert refused.value.response.status_code == 403


@pytest.mark.parametrize(
    ("headers", "status", "body"),
    [
        ({"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}, 403, "origin not allowed"),
        ({"Origin": "http://evil.example"}, 403, "origin not allowed"),
        ({"Sec-Fetch-Site": "cross-site"}, 403, CROSS_SITE),
        ({"Sec-Fetch-Site": "same-site"}, 403, CROSS_SITE),
        ({"Origin": "null", "Sec-Fetch-Site": "cross-site"}, 403, "origin not allowed"),
    ],
    ids=["foreign-origin", "foreign-origin-only", "cross-site-no-origin", "same-site-no-origin", "null-origin"],
)
async def test_a_cookie_cannot_drive_an_agent_from_another_site(
    site: SessionSite, http: httpx.AsyncClient, headers: dict[str, str], status: int, body: str
) -> None:
    """A page elsewhere makes the browser POST with alice's cookie: refused, no agent starts."""
    response = await session_initialize(http, site, "alice", **headers)
    assert (response.status_code, response.text) == (status, body)
    assert "acp-connection-id" not in response.headers


async def test_a_cookie_works_from_the_sites_own_pages(site: SessionSite, http: httpx.AsyncClient) -> None:
    own = {"Origin": site.own_origin, "Sec-Fetch-Site": "same-origin"}
    response = await session_initialize(http, site, "alice", **own)
    assert response.status_code == 200, response.text
    headers = {**site.login("alice"), **own, "Acp-Connection-Id": response.headers["acp-connection-id"]}
    assert (await http.delete(site.server.url, headers=headers)).status_code == 202


async def test_a_cookie_websocket_from_another_site_is_refused(site: SessionSite) -> None:
    for extra in ({"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "cross-site"}):
        with pytest.raises(InvalidStatus) as refused:
            async with connect(site.server.ws_url, additional_headers={**site.login("alice"), **extra}, proxy=None):
                pass
        assert refused.value.response.status_code == 403
    own = {**site.login("alice"), "Origin": site.own_origin, "Sec-Fetch-Site": "same-origin"}
    async with connect(site.server.ws_url, additional_headers=own, subprotocols=["acp"], proxy=None) as ws:  # type: ignore[list-item]
        assert ws.subprotocol == "acp"
        await ws.send(json.dumps(rpc(5, "test/echo", {})))
        assert json.loads(await asyncio.wait_for(ws.recv(), 10))["id"] == 5
