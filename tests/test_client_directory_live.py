"""`HttpClient.list_sessions()` and `acp-client --list [--json]` against a live server (one
daphne, bearer tokens): a session the client opened is listed with its turn state (a permission
request held unanswered keeps the turn running, deterministically), over HTTP+SSE and over a
WebSocket; another principal sees none of it; no or wrong credentials raise
`AuthenticationError`; a server answering something else raises `HttpStatusError` or
`ProtocolViolationError` (a mock transport, no server)."""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from acp_channels.client import (
    AuthenticationError,
    ConnectionEntry,
    HttpClient,
    HttpStatusError,
    ProtocolViolationError,
    SessionDirectory,
    SessionEntry,
)
from tests import auth_fixtures as tokens
from tests import forked
from tests.live import ROOT, DaphneServer, rpc
from tests.token_servers import TOKEN_ENV

pytestmark = pytest.mark.timeout(60)
STEP = 20.0


@pytest.fixture(scope="module")
def server() -> Iterator[DaphneServer]:
    live = DaphneServer(env=TOKEN_ENV).start()
    yield live
    live.stop()
    assert live.errors() == []


def endpoint(server: DaphneServer, kind: str) -> str:
    return server.url if kind == "http" else "ws" + server.url.removeprefix("http")


async def next_message(client: HttpClient, wanted: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The next message received that `wanted` accepts (session updates and such are skipped)."""
    async with asyncio.timeout(STEP):
        while True:
            message = await client.receive()
            assert message is not None, "the transport closed"
            if wanted(message):
                return message


async def waiting_for_permission(client: HttpClient) -> tuple[str, dict[str, Any]]:
    """initialize, session/new, and a prompt whose turn waits on a permission request (not
    answered here): the session id and that request."""
    await client.send(rpc(0, "initialize", {"protocolVersion": 1}))
    await next_message(client, lambda message: message.get("id") == 0)
    await client.send(rpc(1, "session/new", {"cwd": "/tmp", "mcpServers": []}))
    session_id: str = (await next_message(client, lambda message: message.get("id") == 1))["result"]["sessionId"]
    prompt = [{"type": "text", "text": "permission"}]
    await client.send(rpc(2, "session/prompt", {"sessionId": session_id, "prompt": prompt}))
    request = await next_message(client, lambda message: message.get("method") == "session/request_permission")
    return session_id, request


async def allow(client: HttpClient, request: dict[str, Any]) -> None:
    """Answer the permission request and wait for the turn's end."""
    outcome = {"outcome": {"outcome": "selected", "optionId": "allow"}}
    await client.send({"jsonrpc": "2.0", "id": request["id"], "result": outcome})
    reply = await next_message(client, lambda message: message.get("id") == 2)
    assert reply["result"]["stopReason"] == "end_turn"


def only(entries: tuple[Any, ...], **fields: str) -> Any:
    (found,) = [entry for entry in entries if all(getattr(entry, name) == value for name, value in fields.items())]
    return found


@pytest.mark.parametrize("kind", ["http", "ws"])
async def test_list_sessions_shows_the_clients_session_and_its_turn(server: DaphneServer, kind: str) -> None:
    url = endpoint(server, kind)
    async with HttpClient(url, token=tokens.ALICE) as client:
        session_id, request = await waiting_for_permission(client)
        connection_id = client.connection_id
        assert connection_id is not None
        before = datetime.datetime.now(datetime.UTC)
        directory = await client.list_sessions()
        assert isinstance(directory, SessionDirectory) and directory.complete is True
        entry: SessionEntry = only(directory.sessions, session_id=session_id)
        assert entry.connection_id == connection_id
        assert entry.principal == "token:alice" and entry.agent == "acp-channels-demo"
        assert entry.turn_running is True and entry.pending_permissions == 1
        assert entry.attachments == (2 if kind == "http" else 1)  # connection + session stream, or the socket
        for moment in (entry.created, entry.last_activity):
            assert moment.tzinfo is not None and moment.utcoffset() == datetime.timedelta(0)
            assert before - datetime.timedelta(seconds=60) < moment <= before + datetime.timedelta(seconds=5)
        assert entry.created <= entry.last_activity
        connection: ConnectionEntry = only(directory.connections, connection_id=connection_id)
        assert connection.sessions == (session_id,)
        assert connection.transport == ("http" if kind == "http" else "websocket")
        assert connection.principal == "token:alice" and connection.agent == "acp-channels-demo"
        assert directory.document["sessions"][directory.sessions.index(entry)]["sessionId"] == session_id

        # Bob, with a client that never opens a connection, sees none of it.
        async with HttpClient(url, token=tokens.BOB) as bob:
            others = await bob.list_sessions()
        assert others.complete is True
        assert session_id not in {entry.session_id for entry in others.sessions}
        assert connection_id not in {connection.connection_id for connection in others.connections}

        await allow(client, request)
        entry = only((await client.list_sessions()).sessions, session_id=session_id)
        assert entry.turn_running is False and entry.pending_permissions == 0
        assert client.closed is False  # the listing did not touch the ACP connection
    # After close: the client still lists (with a client of its own), and the connection is gone.
    # A socket's close frame is answered before the server has ended its connection (daphne
    # tells the consumer after the handshake), so the listing is asked until it is gone.
    listed = True
    for _ in range(200):
        after = await client.list_sessions()
        listed = connection_id in {connection.connection_id for connection in after.connections}
        if not listed or kind == "http":  # DELETE was answered: gone at once
            break
        await asyncio.sleep(0.05)
    assert not listed


@pytest.mark.parametrize("kind", ["http", "ws"])
async def test_no_or_wrong_credentials_raise_authentication_error(server: DaphneServer, kind: str) -> None:
    with pytest.raises(AuthenticationError) as refused:
        await HttpClient(endpoint(server, kind)).list_sessions()
    assert refused.value.status_code == 401 and refused.value.credentials_sent is False
    assert "no credentials were sent" in str(refused.value) and "/acp/sessions" in str(refused.value)
    wrong = "wrong-token-0123456789"
    with pytest.raises(AuthenticationError) as refused:
        await HttpClient(endpoint(server, kind), token=wrong).list_sessions()
    assert refused.value.status_code == 401 and refused.value.credentials_sent is True
    assert wrong not in str(refused.value)


# ----------------------------------------------------------------------------------- the CLI


async def acp_client(*args: str, token: str | None) -> tuple[int, str, str]:
    """`python -m acp_channels.client ARGS` with ACP_TOKEN=token: (exit status, stdout, stderr)."""
    env = {name: value for name, value in os.environ.items() if name != "ACP_TOKEN"}
    if token is not None:
        env["ACP_TOKEN"] = token
    process = await forked.create_subprocess_exec(
        sys.executable,
        "-m",
        "acp_channels.client",
        *args,
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(STEP * 2):
        stdout, stderr = await process.communicate()
    assert process.returncode is not None
    return process.returncode, stdout.decode(), stderr.decode()


async def test_acp_client_list_prints_the_session(server: DaphneServer) -> None:
    async with HttpClient(server.url, token=tokens.ALICE) as client:
        session_id, request = await waiting_for_permission(client)
        connection_id = client.connection_id
        assert connection_id is not None

        status, out, err = await acp_client(server.url, "--list", "--json", token=tokens.ALICE)
        assert (status, err) == (0, "")
        document = json.loads(out)
        assert out == json.dumps(document, indent=2) + "\n"
        assert document["complete"] is True
        (listed,) = [entry for entry in document["sessions"] if entry["sessionId"] == session_id]
        assert listed["connectionId"] == connection_id
        assert listed["turnRunning"] is True and listed["pendingPermissions"] == 1
        assert listed["lastActivity"].endswith("Z")

        status, out, err = await acp_client(server.url, "--list", token=tokens.ALICE)
        assert (status, err) == (0, "")
        header, *rows = out.splitlines()
        assert header.split() == [
            "SESSION",
            "CONNECTION",
            "AGENT",
            "TURN",
            "PERMISSIONS",
            "ATTACHED",
            "LAST",
            "ACTIVITY",
        ]
        (line,) = [row for row in rows if row.startswith(session_id + " ")]
        row = line.split()
        assert row[:6] == [session_id, connection_id, "acp-channels-demo", "running", "1", "2"]
        assert row[-1] == "UTC" and line.index(row[6]) == header.index("LAST ACTIVITY")  # aligned

        status, out, err = await acp_client(server.url, "--list", token=tokens.BOB)
        assert (status, out, err) == (0, "no sessions\n", "")

        await allow(client, request)
        status, out, err = await acp_client(server.url, "--list", token=tokens.ALICE)
        assert status == 0
        (row,) = [row.split() for row in out.splitlines() if row.startswith(session_id + " ")]
        assert row[3:5] == ["idle", "0"]


async def test_acp_client_list_errors(server: DaphneServer) -> None:
    status, out, err = await acp_client(server.url, "--list", token=None)
    assert status == 1 and out == ""
    assert err.startswith("error: GET /acp/sessions: HTTP 401") and err.count("\n") == 1
    status, out, err = await acp_client(server.url, "--json", token=tokens.ALICE)
    assert status == 2 and "error: --json goes with --list" in err


# ------------------------------------------------------------------------ answers that are wrong


def mocked(status: int, body: bytes, seen: list[httpx.Request] | None = None) -> httpx.AsyncClient:
    def answer(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        return httpx.Response(status, content=body, headers={"Content-Type": "application/json"})

    return httpx.AsyncClient(transport=httpx.MockTransport(answer))


SESSION = {
    "sessionId": "s1",
    "connectionId": "c1",
    "principal": "token:alice",
    "agent": None,
    "created": "2025-01-02T03:04:05.678Z",
    "lastActivity": "2025-01-02T03:04:06.000Z",
    "turnRunning": False,
    "pendingPermissions": 0,
    "attachments": 1,
    "future": "ignored",
}
CONNECTION = {
    "connectionId": "c1",
    "principal": "token:alice",
    "agent": None,
    "transport": "http",
    "created": "2025-01-02T03:04:05.000Z",
    "lastActivity": "2025-01-02T03:04:06.000Z",
    "attachments": 1,
    "sessions": ["s1"],
}


async def test_a_directory_is_parsed_from_the_endpoints_sessions_path() -> None:
    seen: list[httpx.Request] = []
    body = json.dumps({"sessions": [SESSION], "connections": [CONNECTION], "complete": False}).encode()
    async with mocked(200, body, seen) as http:
        directory = await HttpClient("http://example.test/base?x=1", token="t0k", http_client=http).list_sessions()
    assert str(seen[0].url) == "http://example.test/base/acp/sessions?x=1"
    assert seen[0].headers["authorization"] == "Bearer t0k" and seen[0].method == "GET"
    (entry,) = directory.sessions
    assert entry == SessionEntry(
        session_id="s1",
        connection_id="c1",
        principal="token:alice",
        agent=None,
        created=datetime.datetime(2025, 1, 2, 3, 4, 5, 678000, tzinfo=datetime.UTC),
        last_activity=datetime.datetime(2025, 1, 2, 3, 4, 6, tzinfo=datetime.UTC),
        turn_running=False,
        pending_permissions=0,
        attachments=1,
    )
    assert directory.connections[0].sessions == ("s1",) and directory.complete is False


@pytest.mark.parametrize(
    ("status", "error"), [(403, AuthenticationError), (404, HttpStatusError), (500, HttpStatusError)]
)
async def test_an_error_status_raises_the_status_error(status: int, error: type[HttpStatusError]) -> None:
    async with mocked(status, b"no: Bearer t0k") as http:
        with pytest.raises(error) as raised:
            await HttpClient("http://example.test", token="t0k", http_client=http).list_sessions()
    assert type(raised.value) is error and raised.value.status_code == status
    assert "t0k" not in str(raised.value)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"<html>", "not JSON"),
        (b"[]", "not a JSON object"),
        (json.dumps({"sessions": [], "connections": []}).encode(), "no 'complete'"),
        (json.dumps({"sessions": [{**SESSION, "turnRunning": 1}], "connections": [], "complete": True}).encode(),
         "sessions[0].turnRunning is not true or false"),
        (json.dumps({"sessions": [{**SESSION, "created": "2025-01-02T03:04:05"}], "connections": [],
                     "complete": True}).encode(), "sessions[0].created has no time zone"),
        (json.dumps({"sessions": [], "connections": [{**CONNECTION, "attachments": -1}], "complete": True}).encode(),
         "connections[0].attachments is not a count"),
    ],
)  # fmt: skip
async def test_a_malformed_directory_is_a_protocol_violation(body: bytes, says: str) -> None:
    async with mocked(200, body) as http:
        with pytest.raises(ProtocolViolationError) as raised:
            await HttpClient("http://example.test", http_client=http).list_sessions()
    assert says in str(raised.value) and "GET /acp/sessions" in str(raised.value)


def test_the_sessions_command_lists_the_clients_own_session(server: DaphneServer) -> None:
    """`/sessions` inside acp-client prints the directory: the session it opened is in it."""
    env = {name: value for name, value in os.environ.items() if name != "ACP_TOKEN"}
    env["ACP_TOKEN"] = tokens.ALICE
    result = forked.run(
        [sys.executable, "-m", "acp_channels.client", server.url],
        cwd=ROOT,
        env=env,
        input="/info\n/sessions\n",
        capture_output=True,
        text=True,
        timeout=STEP * 2,
    )
    assert result.returncode == 0, result.stderr
    session_id = re.search(r"session (\S+)", result.stdout.split("connection ", 1)[1])
    assert session_id is not None, result.stdout
    table = result.stdout.split("> /sessions", 1)[1]
    assert "SESSION" in table and session_id.group(1) in table, result.stdout
