"""The built-in tokens on a live server (one worker, and three workers behind a balancer):
tests.tokens_site (acp_channels.tokens, sqlite shared by the workers), REVALIDATE_SECONDS 0.5.
Revoking a token with `manage.py acp_token revoke` ends the connections it opened, an HTTP
connection's stream and a WebSocket, within seconds on whichever worker hosts them, while
another token of the same user keeps its connection; a user who loses REQUIRED_PERMISSION
loses their connections the same way. Each end has its audit line (reason=revoked)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import os
import sqlite3
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import httpx
import pytest
from websockets.asyncio.client import connect

from tests import forked
from tests.cluster import Cluster
from tests.conftest import SHAPES, start_server
from tests.live import JSON, ROOT, SSE, DaphneServer, open_sse, rpc, wait_for_line

INVALID = 'Bearer realm="acp", error="invalid_token"'
#: Sweep every half second: an end within a few seconds, on a loaded machine too.
SWEEP = 0.5
ENDS_WITHIN = 8.0
SITE_ENV = {
    "DJANGO_SETTINGS_MODULE": "tests.tokens_site",
    "ACP_AGENT": "tests.wire_agent.create",
    "ACP_KEEPALIVE_SECONDS": "0.5",
    "ACP_REVALIDATE_SECONDS": str(SWEEP),
}


@dataclass
class TokenSite:
    server: DaphneServer | Cluster
    env: dict[str, str]
    tokens: dict[str, tuple[int, str]]

    def bearer(self, name: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[name][1]}"}

    def manage(self, *args: str) -> str:
        """`manage.py …` (python -m django) against the site's database, as an operator runs it."""
        done = forked.run(
            [sys.executable, "-m", "django", *args],
            cwd=ROOT,
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout


@pytest.fixture(scope="module", params=SHAPES)
def site(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TokenSite]:
    database = tmp_path_factory.mktemp("tokens-site") / "db.sqlite3"
    env = {**SITE_ENV, "ACP_TEST_DATABASE": str(database)}
    prepared = forked.run(
        [sys.executable, "-m", "tests.tokens_site"],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    tokens = {name: (int(found[0]), str(found[1])) for name, found in json.loads(prepared.stdout).items()}
    live = start_server(request.param, env, request)
    yield TokenSite(live, env, tokens)
    live.stop()
    assert live.errors() == []
    log = "".join(live.log)
    assert not [secret for _, secret in tokens.values() if secret in log], "a token reached the server log"


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=20.0, limits=httpx.Limits(max_keepalive_connections=0)) as client:
        yield client


async def initialize(http: httpx.AsyncClient, site: TokenSite, name: str) -> str:
    response = await http.post(site.server.url, headers={**JSON, **site.bearer(name)}, json=rpc(0, "initialize", {}))
    assert response.status_code == 200, response.text
    return str(response.headers["acp-connection-id"])


async def read_until_closed(http: httpx.AsyncClient, site: TokenSite, name: str, connection_id: str) -> list[str]:
    """The connection's GET stream, read until the server ends it."""
    headers = {**SSE, **site.bearer(name), "Acp-Connection-Id": connection_id}
    async with http.stream("GET", site.server.url, headers=headers) as stream:
        assert stream.status_code == 200
        return [line async for line in stream.aiter_lines()]


async def post_echo(http: httpx.AsyncClient, site: TokenSite, name: str, connection_id: str) -> int:
    headers = {**JSON, **site.bearer(name), "Acp-Connection-Id": connection_id}
    return (await http.post(site.server.url, headers=headers, json=rpc(5, "test/echo", {}))).status_code


async def ended(site: TokenSite, connection_id: str) -> str:
    return await wait_for_line(
        site.server, rf"connection ended principal=user:\w+ connection={connection_id} .* reason=revoked", ENDS_WITHIN
    )


async def test_a_revoked_token_ends_its_connections_within_seconds(site: TokenSite, http: httpx.AsyncClient) -> None:
    revoked = await initialize(http, site, "alice")
    kept = await initialize(http, site, "alice-2")  # the same user, another token
    stream = asyncio.create_task(read_until_closed(http, site, "alice", revoked))
    async with connect(site.server.ws_url, additional_headers=site.bearer("alice-ws"), proxy=None) as ws:
        assert ws.response is not None
        socket_id = ws.response.headers["Acp-Connection-Id"]
        await ws.send(json.dumps(rpc(0, "initialize", {"protocolVersion": 1})))
        assert json.loads(await ws.recv())["id"] == 0
        assert await post_echo(http, site, "alice", revoked) == 202
        assert not stream.done()
        loop = asyncio.get_running_loop()
        site.manage("acp_token", "revoke", str(site.tokens["alice"][0]), str(site.tokens["alice-ws"][0]))
        revoked_at = loop.time()
        await asyncio.wait_for(stream, ENDS_WITHIN)  # the server ended the stream
        await asyncio.wait_for(ws.wait_closed(), ENDS_WITHIN)
        assert loop.time() - revoked_at < ENDS_WITHIN
    await ended(site, revoked)
    await ended(site, socket_id)
    # The revoked token gets nowhere; the other token of the same user kept its connection.
    again = await http.post(site.server.url, headers={**JSON, **site.bearer("alice")}, json=rpc(0, "initialize", {}))
    assert (again.status_code, again.headers["www-authenticate"]) == (401, INVALID)
    assert await post_echo(http, site, "alice-2", kept) == 202
    assert not [line for line in site.server.log if f"connection={kept} " in line and "connection ended" in line]
    listed = site.manage("acp_token", "list", "alice", "--all")
    assert [line.split()[-1] for line in listed.splitlines() if line.split()[2] in ("alice", "alice-ws")] == [
        "revoked",
        "revoked",
    ]
    assert (
        await http.delete(site.server.url, headers={**site.bearer("alice-2"), "Acp-Connection-Id": kept})
    ).status_code == 202


def expire_now(site: TokenSite, name: str) -> None:
    """The token's expiry comes now: its `expires` set in the database (Django's SQLite form,
    naive UTC), where the sweep of whichever worker hosts its connections reads it."""
    stored = str(datetime.datetime.now(datetime.UTC).replace(tzinfo=None))
    with contextlib.closing(sqlite3.connect(site.env["ACP_TEST_DATABASE"], timeout=10)) as database, database:
        query = "UPDATE acp_tokens_agenttoken SET expires = ? WHERE id = ?"
        assert database.execute(query, (stored, site.tokens[name][0])).rowcount == 1


async def test_an_expired_token_closes_the_stream_on_any_worker_and_another_token_resumes_it(
    site: TokenSite, http: httpx.AsyncClient
) -> None:
    """Three workers: the connection is hosted by the first, its stream read through the second,
    resumed through the third (one worker: all on it). At expiry the stream ends, saying why, and
    the connection lives; the user's other token rebinds it with a POST and resumes the stream
    after its last event; the expired token gets 401, another user's token 404."""
    workers = [worker.url for worker in site.server.workers] if isinstance(site.server, Cluster) else [site.server.url]
    host, reader, resumer = (workers * 3)[:3]
    response = await http.post(host, headers={**JSON, **site.bearer("alice-expiring")}, json=rpc(0, "initialize", {}))
    assert response.status_code == 200, response.text
    connection_id = response.headers["acp-connection-id"]
    owner = {"Acp-Connection-Id": connection_id}
    async with open_sse(http, reader, connection_id, **site.bearer("alice-expiring")) as stream:
        echo = await http.post(host, headers={**JSON, **site.bearer("alice-expiring"), **owner}, json=rpc(5, "x/echo"))
        assert echo.status_code == 202
        assert (await stream.next())["id"] == 5
        expire_now(site, "alice-expiring")
        assert await stream.next_or_end(ENDS_WITHIN) is None  # the server ended it
        assert stream.comment_lines[-1:] == [": credential expired"]
        last_event = str(stream.last_id)
    assert not [line for line in site.server.log if f"connection={connection_id} " in line and "ended" in line]
    resume = {**SSE, **owner, "Last-Event-ID": last_event}
    expired = await http.get(resumer, headers={**resume, **site.bearer("alice-expiring")})
    assert (expired.status_code, expired.headers["www-authenticate"]) == (401, INVALID)
    assert (await http.get(resumer, headers={**resume, **site.bearer("bob")})).status_code == 404
    echo = await http.post(resumer, headers={**JSON, **site.bearer("alice-2"), **owner}, json=rpc(6, "x/echo"))
    assert echo.status_code == 202  # on the host's worker: the connection now rests on alice-2
    renewed = {**site.bearer("alice-2"), "Last-Event-ID": last_event}
    async with open_sse(http, resumer, connection_id, **renewed) as again:
        assert (await again.next())["id"] == 6
    assert (await http.delete(resumer, headers={**site.bearer("alice-2"), **owner})).status_code == 202


async def test_losing_the_permission_ends_the_connections(site: TokenSite, http: httpx.AsyncClient) -> None:
    connection_id = await initialize(http, site, "bob")
    stream = asyncio.create_task(read_until_closed(http, site, "bob", connection_id))
    assert await post_echo(http, site, "bob", connection_id) == 202
    site.manage(
        "shell",
        "-c",
        "from django.contrib.auth.models import User; User.objects.get(username='bob').user_permissions.clear()",
    )
    await asyncio.wait_for(stream, ENDS_WITHIN)
    await ended(site, connection_id)
    again = await http.post(site.server.url, headers={**JSON, **site.bearer("bob")}, json=rpc(0, "initialize", {}))
    assert again.status_code == 403


async def test_refusals_of_the_built_in_tokens(site: TokenSite, http: httpx.AsyncClient) -> None:
    for name, status in (("carol", 403), ("observer", 403), ("expired", 401)):
        response = await http.post(
            site.server.url, headers={**JSON, **site.bearer(name)}, json=rpc(0, "initialize", {})
        )
        assert response.status_code == status, (name, response.text)
    wrong = await http.post(
        site.server.url, headers={**JSON, "Authorization": "Bearer acp_wrong"}, json=rpc(0, "initialize", {})
    )
    assert (wrong.status_code, wrong.headers["www-authenticate"]) == (401, INVALID)
