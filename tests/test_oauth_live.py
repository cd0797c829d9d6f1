"""OAuth on a live server: the demo as `ACP_DEMO_OAUTH=1 ./dev.sh demo` serves it (daphne, the
demo agent, django-oauth-toolkit on the same site with a SQLite database set up by
`python -m demo_project.oauth setup`). Tokens come from DOT: the authorization code flow with
PKCE through its endpoints, and `demo_project.oauth.issue` for the ones a test needs (expired,
narrow scopes). Every refusal with its exact header over HTTP, and over WebSocket (daphne
answers 403 before accept); a revoked token; a token that expires during a prompt (the notice,
the streams or the socket closed at expiry, a new token of the same user resuming them);
attaching with the session scopes; the metadata; both official SDK clients with a DOT-issued
token.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import hashlib
import json
import os
import re
import secrets
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests import forked, oauth_browser
from tests.live import JSON, ROOT, SSE, DaphneServer, SseReader, open_sse, reserved_port, rpc, wait_for_line
from tests.test_auth_interop import run_driver

pytestmark = pytest.mark.timeout(120)

ISSUER = "https://issuer.example/o"
CONNECT = "acp:connect"
OBSERVE = "acp:session:observe"
CONTROL = "acp:session:control"
#: A second user of the demo's database, for refusals of another principal.
OTHER_USER = "mallory"
#: Tokens issued for the tests: name -> (scope, lifetime in seconds[, user: the demo user's else]).
ISSUED = {
    "all": (f"{CONNECT} {OBSERVE} {CONTROL}", 3600),
    "connect": (CONNECT, 3600),
    "observer": (f"{CONNECT} {OBSERVE}", 3600),
    "observe-only": (OBSERVE, 3600),
    "expired": (f"{CONNECT} {OBSERVE} {CONTROL}", -60),
    "to-revoke": (CONNECT, 3600),
    "to-end": (CONNECT, 3600),
    # The expiry tests set these tokens' `expires` in the database (a few seconds away).
    "expiring-http": (CONNECT, 3600),
    "expiring-ws": (CONNECT, 3600),
    "renewed": (CONNECT, 3600),
    "another-user": (CONNECT, 3600, OTHER_USER),
}
ISSUE = f"""
import json, sys
import django
django.setup()
from django.contrib.auth import get_user_model
from demo_project.oauth import issue
get_user_model()._default_manager.get_or_create(username="{OTHER_USER}")
print(json.dumps({{name: issue(*spec) for name, spec in json.loads(sys.argv[1]).items()}}))
"""


@dataclass
class OAuthSite:
    server: DaphneServer
    tokens: dict[str, str]
    #: The demo's SQLite database (DOT's tables), which the expiry tests write to.
    database: Path

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    @property
    def metadata_url(self) -> str:
        return f"{self.origin}/.well-known/oauth-protected-resource"

    def challenge(self, scope: str, error: str | None = None, description: str | None = None) -> str:
        parts = ['Bearer realm="acp"']
        if error is not None:
            parts.append(f'error="{error}"')
        if description is not None:
            parts.append(f'error_description="{description}"')
        return ", ".join([*parts, f'scope="{scope}"', f'resource_metadata="{self.metadata_url}"'])


def demo_environment(state: Path) -> dict[str, str]:
    return {
        "ACP_DEMO_OAUTH": "1",
        "ACP_DEMO_STATE_DIR": str(state),
        "ACP_OAUTH_AUTHORIZATION_SERVERS": f'["{ISSUER}"]',
        "ACP_REVALIDATE_SECONDS": "0.5",  # the credential sweep
    }


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OAuthSite]:
    env = demo_environment(tmp_path_factory.mktemp("oauth-state"))
    with reserved_port() as port:
        # The metadata names the demo's own authorization server, on the port the site will
        # listen on: `acp-client login` follows it (below).
        env["ACP_OAUTH_AUTHORIZATION_SERVERS"] = f'["http://127.0.0.1:{port}/o"]'
        process_env = {**os.environ, **env, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "demo_project.settings"}
        setup = forked.run(
            [sys.executable, "-m", "demo_project.oauth", "setup"],
            env=process_env,
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        assert setup.returncode == 0, setup.stderr
        assert "ACP_TOKEN=$(ACP_DEMO_OAUTH=1 .venv/bin/python -m demo_project.oauth token)" in setup.stderr
        assert ".venv/bin/acp-client login http://127.0.0.1:" in setup.stderr
        issued = forked.run(
            [sys.executable, "-c", ISSUE, json.dumps(ISSUED)], env=process_env, cwd=ROOT, capture_output=True, text=True
        )
        assert issued.returncode == 0, issued.stderr
        server = DaphneServer(env=env, listen_port=port).start()
    yield OAuthSite(server, json.loads(issued.stdout), Path(env["ACP_DEMO_STATE_DIR"]) / "db.sqlite3")
    server.stop()
    assert server.errors() == [], "".join(server.log)[-6000:]
    log = "".join(server.log)
    assert not [token for token in json.loads(issued.stdout).values() if token in log], "a token reached the log"


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=20.0) as client:
        yield client


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def initialize(http: httpx.AsyncClient, url: str, token: str, **headers: str) -> httpx.Response:
    return await http.post(
        url, headers={**JSON, **bearer(token), **headers}, json=rpc(0, "initialize", {"protocolVersion": 1})
    )


# -- the metadata ------------------------------------------------------------------------------------


async def test_the_metadata_document(site: OAuthSite, http: httpx.AsyncClient) -> None:
    response = await http.get(site.metadata_url)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {
        "resource": site.server.url,
        "authorization_servers": [f"{site.origin}/o"],
        "scopes_supported": [CONNECT, OBSERVE, CONTROL],
        "bearer_methods_supported": ["header"],
    }
    assert (await http.get(site.metadata_url + "/acp")).json() == response.json()  # RFC 9728 §3.1
    # The demo's authorization server describes itself (RFC 8414).
    server = (await http.get(f"{site.origin}/.well-known/oauth-authorization-server/o")).json()
    assert server["issuer"] == f"{site.origin}/o" and server["token_endpoint"] == f"{site.origin}/o/token/"
    assert server["device_authorization_endpoint"] == f"{site.origin}/o/device-authorization/"
    assert server["code_challenge_methods_supported"] == ["S256"]


# -- refusals over HTTP ---------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["POST", "GET", "DELETE"])
async def test_no_token_is_401_naming_the_metadata(site: OAuthSite, http: httpx.AsyncClient, method: str) -> None:
    headers = {**JSON, **SSE, "Acp-Connection-Id": "0" * 36}
    body = json.dumps(rpc(0, "initialize", {})) if method == "POST" else None
    response = await http.request(method, site.server.url, headers=headers, content=body)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == site.challenge(CONNECT)
    assert response.text == "authentication required"
    directory = await http.get(site.server.url + "/sessions")
    assert (directory.status_code, directory.headers["www-authenticate"]) == (401, site.challenge(CONNECT))


async def test_an_unknown_token_is_401_invalid_token(site: OAuthSite, http: httpx.AsyncClient) -> None:
    response = await initialize(http, site.server.url, "not-a-dot-token-123456")
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == site.challenge(
        CONNECT, "invalid_token", "The access token is invalid."
    )
    assert response.text == "invalid or expired token"


async def test_an_expired_token_is_401_saying_so(site: OAuthSite, http: httpx.AsyncClient) -> None:
    response = await initialize(http, site.server.url, site.tokens["expired"])
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == site.challenge(
        CONNECT, "invalid_token", "The access token has expired."
    )
    assert site.tokens["expired"] not in response.text + str(response.headers)


async def test_a_token_without_the_connect_scope_is_403_insufficient_scope(
    site: OAuthSite, http: httpx.AsyncClient
) -> None:
    response = await initialize(http, site.server.url, site.tokens["observe-only"])
    assert response.status_code == 403
    assert response.headers["www-authenticate"] == site.challenge(CONNECT, "insufficient_scope")
    assert response.text == "insufficient scope: the token needs acp:connect"


async def test_a_revoked_token_is_refused(site: OAuthSite, http: httpx.AsyncClient) -> None:
    token = site.tokens["to-revoke"]
    opened = await initialize(http, site.server.url, token)
    assert opened.status_code == 200, opened.text
    owner = {**bearer(token), "Acp-Connection-Id": opened.headers["acp-connection-id"]}
    await revoke(site, http, token)
    for response in (await initialize(http, site.server.url, token), await http.delete(site.server.url, headers=owner)):
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == site.challenge(
            CONNECT, "invalid_token", "The access token is invalid."
        )


async def revoke(site: OAuthSite, http: httpx.AsyncClient, token: str) -> None:
    """At the authorization server (RFC 7009; a public client names itself)."""
    url = f"http://127.0.0.1:{site.server.port}/o/revoke_token/"
    revoked = await http.post(url, data={"token": token, "client_id": "acp-demo"})
    assert revoked.status_code == 200, revoked.text


async def test_a_revoked_token_ends_its_connections(site: OAuthSite, http: httpx.AsyncClient) -> None:
    """The credential sweep (REVALIDATE_SECONDS) asks DOT about the tokens of live connections."""
    token = site.tokens["to-end"]
    kept = await initialize(http, site.server.url, site.tokens["all"])
    async with connect(site.server.ws_url, additional_headers=bearer(token), proxy=None) as ws:
        assert ws.response is not None
        connection_id = ws.response.headers["Acp-Connection-Id"]
        await request(ws, 0, "initialize", {"protocolVersion": 1})
        await revoke(site, http, token)
        await asyncio.wait_for(ws.wait_closed(), 15)
    await wait_for_line(
        site.server, rf"connection ended principal=user:demo connection={connection_id} .* reason=revoked", 15
    )
    # The same user's connection of another token goes on.
    owner = {**bearer(site.tokens["all"]), "Acp-Connection-Id": kept.headers["acp-connection-id"]}
    assert (await http.delete(site.server.url, headers=owner)).status_code == 202


# -- a valid token, end to end ---------------------------------------------------------------------


def pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    return verifier, challenge


async def code_flow(site: OAuthSite, scope: str, redirect: str = "http://127.0.0.1/callback") -> dict[str, Any]:
    """The authorization code flow with PKCE, as a person in a browser: log in, authorize, and
    exchange the code from the redirect for a token."""
    base = f"http://127.0.0.1:{site.server.port}"
    verifier, challenge = pkce()
    authorize = (
        f"/o/authorize/?response_type=code&client_id=acp-demo&redirect_uri={redirect}&scope={scope.replace(' ', '+')}"
        f"&code_challenge={challenge}&code_challenge_method=S256&state=s1"
    )
    async with httpx.AsyncClient(base_url=base, timeout=20.0) as browser:
        form = await browser.get("/accounts/login/", params={"next": authorize})
        match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)
        assert form.status_code == 200 and match is not None
        login = await browser.post(
            "/accounts/login/",
            data={"username": "demo", "password": "demo", "csrfmiddlewaretoken": match.group(1), "next": authorize},
        )
        assert login.status_code == 302 and login.headers["location"] == authorize, login.text
        granted = await browser.get(authorize)
        assert granted.status_code == 302, granted.text
        location = urlsplit(granted.headers["location"])
        assert f"{location.scheme}://{location.netloc}{location.path}" == redirect
        query = parse_qs(location.query)
        assert query["state"] == ["s1"]
        exchanged = await browser.post(
            "/o/token/",
            data={
                "grant_type": "authorization_code",
                "client_id": "acp-demo",
                "code": query["code"][0],
                "redirect_uri": redirect,
                "code_verifier": verifier,
            },
        )
        assert exchanged.status_code == 200, exchanged.text
        token: dict[str, Any] = exchanged.json()
        return token


@pytest.fixture(scope="module")
def flow_token(site: OAuthSite) -> str:
    token = asyncio.run(code_flow(site, CONNECT))
    assert token["scope"] == CONNECT and token["token_type"] == "Bearer"
    return str(token["access_token"])


async def request(ws: ClientConnection, request_id: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """Send a request; the notifications before its answer, then the answer."""
    await ws.send(json.dumps(rpc(request_id, method, params)))
    seen: list[dict[str, Any]] = []
    while True:
        message = json.loads(await asyncio.wait_for(ws.recv(), 15))
        if message.get("id") == request_id and "method" not in message:
            return {"answer": message, "notifications": seen}
        seen.append(message)


async def test_a_code_flow_token_initializes_and_prompts(
    site: OAuthSite, http: httpx.AsyncClient, flow_token: str
) -> None:
    opened = await initialize(http, site.server.url, flow_token)
    assert opened.status_code == 200, opened.text
    assert opened.json()["result"]["protocolVersion"] == 1
    async with connect(site.server.ws_url, additional_headers=bearer(flow_token), proxy=None) as ws:
        await request(ws, 0, "initialize", {"protocolVersion": 1})
        new = await request(ws, 1, "session/new", {"cwd": "/tmp", "mcpServers": []})
        session_id = new["answer"]["result"]["sessionId"]
        prompt = {"sessionId": session_id, "prompt": [{"type": "text", "text": "whoami"}]}
        turn = await request(ws, 2, "session/prompt", prompt)
    assert turn["answer"]["result"]["stopReason"] == "end_turn"
    said = "".join(
        note["params"]["update"]["content"]["text"]
        for note in turn["notifications"]
        if note.get("method") == "session/update"
        and note["params"]["update"].get("sessionUpdate") == "agent_message_chunk"
    )
    assert "principal=user:demo " in said and "transport=websocket" in said


async def test_a_loopback_redirect_on_any_port(site: OAuthSite, http: httpx.AsyncClient) -> None:
    """RFC 8252 §7.3, what a command-line login listens on: the demo client registers
    http://127.0.0.1/callback, and any port of it is accepted."""
    token = await code_flow(site, f"{CONNECT} {OBSERVE}", "http://127.0.0.1:54321/callback")
    assert token["scope"] == f"{CONNECT} {OBSERVE}"
    assert (await initialize(http, site.server.url, token["access_token"])).status_code == 200


# -- WebSocket refusals -----------------------------------------------------------------------------


async def test_websocket_refusals_are_403_before_accept(site: OAuthSite) -> None:
    """daphne cannot answer an upgrade with a 401 or a challenge: every refusal is a 403."""
    for headers in (
        {},
        bearer("not-a-dot-token-123456"),
        bearer(site.tokens["expired"]),
        bearer(site.tokens["observe-only"]),
    ):
        with pytest.raises(InvalidStatus) as refused:
            async with connect(site.server.ws_url, additional_headers=headers, proxy=None):
                pass
        assert refused.value.response.status_code == 403


# -- attaching: the session scopes ---------------------------------------------------------------


async def test_attaching_needs_the_session_scope_of_the_role(site: OAuthSite, http: httpx.AsyncClient) -> None:
    async with connect(site.server.ws_url, additional_headers=bearer(site.tokens["all"]), proxy=None) as ws:
        await request(ws, 0, "initialize", {"protocolVersion": 1})
        new = await request(ws, 1, "session/new", {"cwd": "/tmp", "mcpServers": []})
        session_id = new["answer"]["result"]["sessionId"]
        observe = {"Acp-Attach-Session": session_id, "Acp-Attach-Role": "observer"}
        control = {"Acp-Attach-Session": session_id, "Acp-Attach-Role": "controller"}
        for token, headers, scope in (
            ("connect", observe, f"{CONNECT} {OBSERVE}"),
            ("connect", control, f"{CONNECT} {CONTROL}"),
            ("observer", control, f"{CONNECT} {CONTROL}"),
        ):
            refused = await initialize(http, site.server.url, site.tokens[token], **headers)
            assert refused.status_code == 403, (token, headers)
            assert refused.headers["www-authenticate"] == site.challenge(scope, "insufficient_scope")
        for token, headers in (("observer", observe), ("all", control), ("all", observe)):
            attached = await initialize(http, site.server.url, site.tokens[token], **headers)
            assert attached.status_code == 200, (token, headers, attached.text)
            owner = {**bearer(site.tokens[token]), "Acp-Connection-Id": attached.headers["acp-connection-id"]}
            assert (await http.delete(site.server.url, headers=owner)).status_code == 202
        # A browser's WebSocket attaches by the query: the same rule.
        query = f"?acp_attach_session={session_id}&acp_attach_role=controller"
        with pytest.raises(InvalidStatus) as refused_ws:
            async with connect(
                site.server.ws_url + query, additional_headers=bearer(site.tokens["observer"]), proxy=None
            ):
                pass
        assert refused_ws.value.response.status_code == 403


# -- a token that expires (docs/authentication.md, expiry, refresh and revocation) ------------------

AUTH_EXPIRING = "_acp-channels/auth_expiring"
#: Seconds from setting a token's expiry to the expiry: the notice comes first (the sweep runs
#: every 0.5 s), a prompt of TICKS ticks runs across it.
EXPIRES_IN = 2.0
TICKS, TICK_MS = 14, 250
#: From the expiry to the stream's end (or the socket's close), on a loaded machine too.
CLOSES_WITHIN = 8.0


def expire_in(site: OAuthSite, token: str, seconds: float) -> float:
    """Set the access token's `expires` in DOT's table, as a short-lived token of the
    authorization server would have it (the sweep reads it there); when, since the epoch."""
    moment = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=seconds)
    stored = str(moment.replace(tzinfo=None))  # Django's SQLite form: naive UTC
    with contextlib.closing(sqlite3.connect(site.database, timeout=10)) as database, database:
        query = "UPDATE oauth2_provider_accesstoken SET expires = ? WHERE token = ?"
        assert database.execute(query, (stored, token)).rowcount == 1
    return moment.timestamp()


def rfc3339(moment: float) -> str:
    return datetime.datetime.fromtimestamp(int(moment), datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def tick_prompt(session_id: str) -> dict[str, Any]:
    return {"sessionId": session_id, "prompt": [{"type": "text", "text": f"tick {TICKS} {TICK_MS}"}]}


def ticks_in(messages: list[Any]) -> list[str]:
    return [
        message["params"]["update"]["content"]["text"]
        for message in messages
        if isinstance(message, dict)
        and message.get("method") == "session/update"
        and message["params"]["update"].get("sessionUpdate") == "agent_message_chunk"
    ]


async def read_to_end(reader: SseReader) -> list[Any]:
    events = []
    while (event := await reader.next_or_end(CLOSES_WITHIN + 10)) is not None:
        events.append(event)
    return events


async def test_an_expiring_token_closes_the_streams_and_a_new_token_of_the_user_resumes_them(
    site: OAuthSite, http: httpx.AsyncClient
) -> None:
    """The notice with expiresAt; at expiry every SSE stream of the connection ends (after the
    comment saying why) and the connection lives; the expired token gets 401, another user's
    404; a new token of the same user resumes both streams after the last event received and
    gets the prompt's output that ran across the expiry, whole and once, and its POSTs work."""
    token, renewed, other = site.tokens["expiring-http"], site.tokens["renewed"], site.tokens["another-user"]
    url = site.server.url
    opened = await initialize(http, url, token)
    assert opened.status_code == 200, opened.text
    connection_id = opened.headers["acp-connection-id"]

    async def send(credential: str, message: dict[str, Any], session_id: str | None = None) -> int:
        headers = {**JSON, **bearer(credential), "Acp-Connection-Id": connection_id}
        if session_id is not None:
            headers["Acp-Session-Id"] = session_id
        return (await http.post(url, headers=headers, json=message)).status_code

    async with contextlib.AsyncExitStack() as streams:
        connection = await streams.enter_async_context(open_sse(http, url, connection_id, **bearer(token)))
        assert await send(token, rpc(1, "session/new", {"cwd": "/tmp", "mcpServers": []})) == 202
        session_id = (await connection.next())["result"]["sessionId"]
        session = await streams.enter_async_context(open_sse(http, url, connection_id, session_id, **bearer(token)))
        expires_at = expire_in(site, token, EXPIRES_IN)
        notice = await connection.next(CLOSES_WITHIN)
        assert notice == {"jsonrpc": "2.0", "method": AUTH_EXPIRING, "params": {"expiresAt": rfc3339(expires_at)}}
        assert time.time() < expires_at  # told before
        assert await send(token, rpc(2, "session/prompt", tick_prompt(session_id)), session_id) == 202
        before = await read_to_end(session)  # ended by the server at expiry
        assert await read_to_end(connection) == []
        assert time.time() >= expires_at - 0.5  # not before it (the clocks of two processes)
        assert session.comment_lines[-1:] == connection.comment_lines[-1:] == [": credential expired"]
        last_session_event, last_connection_event = session.last_id, connection.last_id
    assert not [line for line in site.server.log if f"connection={connection_id} " in line and "ended" in line]

    refused = await http.get(url, headers={**SSE, **bearer(token), "Acp-Connection-Id": connection_id})
    assert refused.status_code == 401 and 'error="invalid_token"' in refused.headers["www-authenticate"]
    resume = {"Acp-Connection-Id": connection_id, "Acp-Session-Id": session_id, "Last-Event-ID": last_session_event}
    assert (await http.get(url, headers={**SSE, **bearer(other), **resume})).status_code == 404
    assert await send(other, rpc(3, "session/new", {"cwd": "/tmp", "mcpServers": []})) == 404

    # The new token: the rest of the turn, and the connection answers it.
    after: list[Any] = []
    extra = {**bearer(renewed), "Last-Event-ID": str(last_session_event)}
    async with open_sse(http, url, connection_id, session_id, **extra) as resumed:
        while (message := await resumed.next(30)).get("id") != 2:
            after.append(message)
        assert message["result"]["stopReason"] == "end_turn"
    assert ticks_in(before) + ticks_in(after) == [f"tick {index}\n" for index in range(1, TICKS + 1)]
    assert ticks_in(after), "the turn ran across the expiry: some of it came after"
    assert await send(renewed, rpc(4, "session/new", {"cwd": "/tmp", "mcpServers": []})) == 202
    extra = {**bearer(renewed), "Last-Event-ID": str(last_connection_event)}
    async with open_sse(http, url, connection_id, **extra) as resumed:
        assert (await resumed.next())["id"] == 4  # nothing told twice
    assert (await http.delete(url, headers={**bearer(renewed), "Acp-Connection-Id": connection_id})).status_code == 202


async def test_an_expiring_token_closes_the_socket_with_4401_and_a_new_token_reattaches(
    site: OAuthSite, http: httpx.AsyncClient
) -> None:
    token, renewed, other = site.tokens["expiring-ws"], site.tokens["renewed"], site.tokens["another-user"]
    received: list[dict[str, Any]] = []

    async def answer(ws: ClientConnection, request_id: int) -> dict[str, Any]:
        while True:
            message = json.loads(await asyncio.wait_for(ws.recv(), 30))
            received.append(message)
            if message.get("id") == request_id and "method" not in message:
                return message

    async with connect(site.server.ws_url, additional_headers=bearer(token), proxy=None) as ws:
        assert ws.response is not None
        connection_id = ws.response.headers["Acp-Connection-Id"]
        await ws.send(json.dumps(rpc(0, "initialize", {"protocolVersion": 1})))
        await answer(ws, 0)
        await ws.send(json.dumps(rpc(1, "session/new", {"cwd": "/tmp", "mcpServers": []})))
        session_id = (await answer(ws, 1))["result"]["sessionId"]
        expires_at = expire_in(site, token, EXPIRES_IN)
        notice = json.loads(await asyncio.wait_for(ws.recv(), CLOSES_WITHIN))
        received.append(notice)
        assert notice == {"jsonrpc": "2.0", "method": AUTH_EXPIRING, "params": {"expiresAt": rfc3339(expires_at)}}
        await ws.send(json.dumps(rpc(2, "session/prompt", tick_prompt(session_id))))
        with pytest.raises(ConnectionClosed):
            await answer(ws, 2)
        assert ws.close_code == 4401 and ws.close_reason == "credential expired; reattach with a new token"
    assert not [line for line in site.server.log if f"connection={connection_id} " in line and "ended" in line]
    reattach = {"Acp-Connection-Id": connection_id, "Last-Event-ID": str(len(received))}
    for credential, status in ((token, 403), (other, 404)):  # expired; another user's (as unknown)
        with pytest.raises(InvalidStatus) as refused:
            async with connect(site.server.ws_url, additional_headers={**bearer(credential), **reattach}, proxy=None):
                pass
        assert refused.value.response.status_code == status
    before = list(received)
    async with connect(site.server.ws_url, additional_headers={**bearer(renewed), **reattach}, proxy=None) as ws:
        assert (await answer(ws, 2))["result"]["stopReason"] == "end_turn"
    after = received[len(before) :]
    assert ticks_in(before) + ticks_in(after) == [f"tick {index}\n" for index in range(1, TICKS + 1)]
    assert ticks_in(after), "the turn ran across the expiry: some of it came after"


# -- the official SDK clients ---------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["http", "ws"])
@pytest.mark.parametrize("client", ["typescript", "python"])
def test_official_client_with_a_dot_token(site: OAuthSite, flow_token: str, client: str, transport: str) -> None:
    url = site.server.url if transport == "http" else site.server.ws_url
    summary = run_driver(client, url, transport, env_token=flow_token)
    assert summary["ok"] is True, summary
    assert summary["auth"] == "bearer" and summary["chunks"] == 50
    assert summary["permission"] == "permission: allow" and summary["cancel"] == "cancelled"
    assert flow_token not in summary["output"]


@pytest.mark.parametrize("transport", ["http", "ws"])
@pytest.mark.parametrize("client", ["typescript", "python"])
def test_official_client_with_an_expired_dot_token_is_refused(site: OAuthSite, client: str, transport: str) -> None:
    url = site.server.url if transport == "http" else site.server.ws_url
    summary = run_driver(client, url, transport, env_token=site.tokens["expired"])
    assert summary["returncode"] == 1 and summary["ok"] is False
    assert summary["status"] == (401 if transport == "http" else 403), summary
    assert "timed out" not in summary["error"]


# -- acp-client login, as a person runs it ------------------------------------------------------------


@pytest.fixture(scope="module")
def login_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of the acp-client processes: a state directory of their own, no token,
    and tests/oauth_browser.py as the browser (Python's webbrowser runs BROWSER with the URL)."""
    home = tmp_path_factory.mktemp("login")
    browser = home / "browser"
    browser.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m tests.oauth_browser "$1" >&2\n')
    browser.chmod(0o755)
    env = {name: value for name, value in os.environ.items() if name != "ACP_TOKEN"}
    return {**env, "XDG_STATE_HOME": str(home / "state"), "BROWSER": str(browser), "PYTHONPATH": str(ROOT)}


def stored_login(env: dict[str, str]) -> tuple[Path, dict[str, Any]]:
    [path] = (Path(env["XDG_STATE_HOME"]) / "acp-channels" / "tokens").glob("*.json")
    return path, json.loads(path.read_text())


def acp_client(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "acp_channels.client", *args]
    return forked.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)


async def test_acp_client_login_with_the_browser(site: OAuthSite, login_env: dict[str, str]) -> None:
    """The code flow end to end: acp-client opens the browser stand-in, which logs in at DOT's
    form and follows the authorize redirect to acp-client's loopback callback."""
    login = await asyncio.to_thread(acp_client, login_env, "login", site.origin)
    assert login.returncode == 0, login.stdout + login.stderr
    assert f"Signed in to {site.server.url} (scopes: {CONNECT} {OBSERVE} {CONTROL};" in login.stdout
    assert "you can close this window" in login.stderr  # the page the browser got from the callback
    path, record = stored_login(login_env)
    assert (path.stat().st_mode & 0o777, path.parent.stat().st_mode & 0o777) == (0o600, 0o700)
    assert (record["resource"], record["issuer"], record["client_id"]) == (
        site.server.url,
        f"{site.origin}/o",
        "acp-client",
    )
    assert record["access_token"] not in login.stdout + login.stderr
    async with httpx.AsyncClient(timeout=20.0) as http:
        assert (await initialize(http, site.server.url, record["access_token"])).status_code == 200


def test_acp_client_login_with_the_device_flow_then_a_refreshed_session(
    site: OAuthSite, login_env: dict[str, str]
) -> None:
    """--device: acp-client prints a code, a person (this test, through DOT's pages) approves it.
    Then a session with the stored sign-in whose access token the server no longer takes: the
    client renews it with the refresh token, stores the new pair, and the turn runs."""
    command = [sys.executable, "-m", "acp_channels.client", "login", site.origin, "--device", "--scope", CONNECT]
    login = subprocess.Popen(
        command, env=login_env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert login.stderr is not None
        said = ""
        while (match := re.search(r"open (\S+) in any browser and enter the code (\S+)", said)) is None:
            line = login.stderr.readline()
            assert line, said
            said += line
        page = approve_device(match.group(1), match.group(2))
        assert "Device Authorized" in page
        out, err = login.communicate(timeout=30)
    finally:
        if login.poll() is None:
            login.kill()
    assert login.returncode == 0, said + err
    assert f"Signed in to {site.server.url} (scopes: {CONNECT};" in out
    path, record = stored_login(login_env)
    # The server no longer takes the stored access token (an expired one in its place); the
    # record still says it is valid, so the client learns it from the server's 401.
    path.write_text(json.dumps({**record, "access_token": site.tokens["expired"]}))
    session = acp_client(login_env, site.origin, "-p", "whoami")
    assert session.returncode == 0, session.stdout + session.stderr
    assert "principal=user:demo " in session.stdout
    _, renewed = stored_login(login_env)
    assert renewed["access_token"] not in (site.tokens["expired"], record["access_token"])
    assert renewed["refresh_token"] != record["refresh_token"]  # DOT rotates it: the new one is kept
    assert (path.stat().st_mode & 0o777) == 0o600


def approve_device(verification_uri: str, user_code: str) -> str:
    """A person at DOT's device page: log in, enter the code, accept. The status page."""
    with httpx.Client(timeout=20.0, follow_redirects=False) as browser:
        return oauth_browser.approve_device(browser, verification_uri, user_code)


# -- a refresh at the authorization server (DOT deletes the old access token) ----------------------


async def refresh_at_the_server(site: OAuthSite, http: httpx.AsyncClient, refresh_token: str) -> dict[str, Any]:
    """The refresh_token grant, as a client renewing its token does (DOT rotates: the old access
    token is deleted, the old refresh token revoked)."""
    url = f"http://127.0.0.1:{site.server.port}/o/token/"
    data = {"grant_type": "refresh_token", "client_id": "acp-demo", "refresh_token": refresh_token}
    renewed = await http.post(url, data=data)
    assert renewed.status_code == 200, renewed.text
    token: dict[str, Any] = renewed.json()
    return token


async def test_a_refresh_at_the_authorization_server_keeps_the_connection_and_its_stream(
    site: OAuthSite, http: httpx.AsyncClient
) -> None:
    """A turn streams while the client refreshes its token twice at /o/token/ and sends nothing
    with the new one: the sweep finds the old token gone but replaced through its refresh token
    (one family), rebinds the connection to the newest and the stream goes on, whole and once.
    Revoking the newest refresh token then ends the connection."""
    issued = await code_flow(site, CONNECT)
    url = site.server.url
    opened = await initialize(http, url, issued["access_token"])
    connection_id = opened.headers["acp-connection-id"]
    headers = {**JSON, **bearer(issued["access_token"]), "Acp-Connection-Id": connection_id}
    async with open_sse(http, url, connection_id, **bearer(issued["access_token"])) as connection:
        assert (
            await http.post(url, headers=headers, json=rpc(1, "session/new", {"cwd": "/", "mcpServers": []}))
        ).status_code == 202
        session_id = (await connection.next())["result"]["sessionId"]
        session_headers = {**bearer(issued["access_token"])}
        async with open_sse(http, url, connection_id, session_id, **session_headers) as session:
            prompt = rpc(2, "session/prompt", tick_prompt(session_id))
            assert (
                await http.post(url, headers={**headers, "Acp-Session-Id": session_id}, json=prompt)
            ).status_code == 202
            events = [await session.next()]
            latest = issued
            for _ in range(2):  # a second refresh: the family is followed from the first token on
                latest = await refresh_at_the_server(site, http, latest["refresh_token"])
                await wait_for_line(
                    site.server, rf"connection {re.escape(connection_id)}: .* was refreshed: rebound", 15
                )
            while (event := await session.next(30)).get("id") != 2:
                events.append(event)
            assert event["result"]["stopReason"] == "end_turn"
    assert ticks_in(events) == [f"tick {index}\n" for index in range(1, TICKS + 1)]
    assert not [line for line in site.server.log if f"connection={connection_id} " in line and "ended" in line]
    newest = {**JSON, **bearer(latest["access_token"]), "Acp-Connection-Id": connection_id}
    assert (await http.post(url, headers=newest, json=rpc(3, "session/list", {}))).status_code == 202

    await revoke(site, http, latest["refresh_token"])  # revoked for real: no live token in its family
    await wait_for_line(
        site.server, rf"connection ended principal=user:demo connection={connection_id} .* reason=revoked", 15
    )
