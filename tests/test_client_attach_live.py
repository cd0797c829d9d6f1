"""`HttpClient(url, attach=SESSION_ID, role=...)` against a live server (one daphne, bearer
tokens; docs/shared-sessions.md), over HTTP+SSE and over a WebSocket: an attached client gets a
running turn from its start, once and in order, then its end (`turn_ended`), and prompts on the
session; detaching leaves the session, terminating ends it (the others are told); an observer's
prompt is refused; a server that does not attach is a protocol violation (a mock, no server).
Operation ids: every prompt carries one, and a prompt whose POST answer was lost is sent again,
the same bytes, and runs once."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from acp_channels.client import (
    Attachment,
    ClientUsageError,
    HttpClient,
    HttpStatusError,
    ProtocolViolationError,
    ReconnectEvent,
    StreamEndedError,
    TransportError,
    WebSocketClosedError,
)
from tests import auth_fixtures as tokens
from tests.live import DaphneServer, rpc
from tests.token_servers import TOKEN_ENV, prompt, text_of

pytestmark = pytest.mark.timeout(60)
STEP = 20.0
OPERATION = "acp-channels/operationId"
TURN_ENDED = "_acp-channels/session/turn_ended"


@pytest.fixture(scope="module")
def server() -> Iterator[DaphneServer]:
    live = DaphneServer(env=TOKEN_ENV).start()
    yield live
    live.stop()
    assert live.errors() == []


def endpoint(server: DaphneServer, kind: str) -> str:
    return server.url if kind == "http" else server.ws_url


async def next_message(client: HttpClient, wanted: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The next message received that `wanted` accepts (the others are skipped)."""
    async with asyncio.timeout(STEP):
        while True:
            message = await client.receive()
            assert message is not None, "the transport closed"
            if wanted(message):
                return message


async def lines_until(client: HttpClient, end: Callable[[dict[str, Any]], bool]) -> tuple[list[str], dict[str, Any]]:
    """The text received until a message `end` accepts, and that message."""
    lines: list[str] = []
    async with asyncio.timeout(STEP):
        while True:
            message = await client.receive()
            assert message is not None, "the transport closed"
            if (line := text_of(message)) is not None:
                lines.append(line)
            elif end(message):
                return lines, message


async def open_session(client: HttpClient) -> str:
    await client.send(rpc(0, "initialize", {"protocolVersion": 1}))
    await next_message(client, lambda message: message.get("id") == 0)
    await client.send(rpc(1, "session/new", {"cwd": "/tmp", "mcpServers": []}))
    return str((await next_message(client, lambda message: message.get("id") == 1))["result"]["sessionId"])


async def attach(
    url: str, session_id: str, role: str = "controller", **options: Any
) -> tuple[HttpClient, dict[str, Any]]:
    """An attached client, initialized: it and its initialize reply."""
    client = HttpClient(url, token=tokens.ALICE, attach=session_id, role=role, **options)
    await client.send(rpc("init", "initialize", {"protocolVersion": 1}))
    return client, await next_message(client, lambda message: message.get("id") == "init")


@pytest.mark.parametrize("kind", ["http", "ws"])
async def test_an_attached_client_follows_the_turn_prompts_detaches_and_terminates(
    server: DaphneServer, kind: str
) -> None:
    url = endpoint(server, kind)
    host = HttpClient(url, token=tokens.ALICE)
    session_id = await open_session(host)
    # A turn of 10 s at most, cancelled once the attachment has seen it live: it runs while the
    # client attaches, however slow the machine (a 0.4 s turn once ended first).
    await host.send(prompt(2, session_id, "tick 500 20"))
    await next_message(host, lambda message: text_of(message) == "tick 3\n")

    attached, reply = await attach(url, session_id)
    expected = Attachment(session_id, str(host.connection_id), "controller", turn_running=True)
    assert attached.attachment == expected
    meta = reply["result"]["_meta"]["acp-channels/attachment"]
    assert meta["connectionId"] == host.connection_id
    assert attached.connection_id not in (None, host.connection_id)  # a connection of its own
    assert attached.load_session is True  # the agent's initialize result, as the host got it
    lines: list[str] = []
    async with asyncio.timeout(STEP):
        while len(lines) < meta["retained"] + 5:  # past what it was given at attach: live ticks too
            message = await attached.receive()
            assert message is not None, "the transport closed"
            if (line := text_of(message)) is not None:
                lines.append(line)
    await host.send({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session_id}})
    more, end = await lines_until(attached, lambda message: message.get("method") == TURN_ENDED)
    lines += more
    assert lines == [f"tick {index}\n" for index in range(1, len(lines) + 1)]  # retained, then live: once, in order
    assert end["params"] == {"sessionId": session_id, "stopReason": "cancelled"}
    await next_message(host, lambda message: message.get("id") == 2)

    # It prompts on the session: its answer under its own id; the host sees the prompt and the end.
    await attached.send(prompt(7, session_id, "echo from the attachment"))
    said, answer = await lines_until(attached, lambda message: message.get("id") == 7)
    assert said == ["from the attachment"] and answer["result"]["stopReason"] == "end_turn"
    echo = await next_message(host, lambda message: message.get("method") == "session/update")
    assert echo["params"]["update"]["sessionUpdate"] == "user_message_chunk"
    await next_message(host, lambda message: message.get("method") == TURN_ENDED)

    # Detaching leaves the session: the host goes on.
    await attached.detach()
    assert attached.closed
    await host.send(prompt(3, session_id, "echo still here"))
    said, _ = await lines_until(host, lambda message: message.get("id") == 3)
    assert said == ["still here"]

    # An observer's prompt is refused; a controller terminates the session: the observer is told.
    events: list[ReconnectEvent] = []
    observer, reply = await attach(url, session_id, "observer", on_reconnect=events.append)
    assert reply["result"]["_meta"]["acp-channels/attachment"]["role"] == "observer"
    await observer.send(prompt(8, session_id, "echo never"))
    refused = await next_message(observer, lambda message: message.get("id") == 8)
    assert refused["error"]["code"] == -32011
    controller, _ = await attach(url, session_id)
    await controller.terminate()
    assert controller.closed
    notice = await next_message(observer, lambda message: message.get("method") == "_acp-channels/session/terminated")
    assert notice["params"] == {"sessionId": session_id, "connectionId": host.connection_id}
    assert isinstance(await asyncio.wait_for(host.wait_failed(), STEP), TransportError)
    # Its streams end next: nothing to resume, so nothing is tried.
    ended = await asyncio.wait_for(observer.wait_failed(), STEP)
    assert isinstance(ended, StreamEndedError if kind == "http" else WebSocketClosedError), ended
    assert events == []
    listed = await observer.list_sessions()
    assert session_id not in {entry.session_id for entry in listed.sessions}
    await observer.close()
    await host.close()


@pytest.mark.parametrize("kind", ["http", "ws"])
async def test_a_session_that_is_not_there_cannot_be_attached_to(server: DaphneServer, kind: str) -> None:
    client = HttpClient(endpoint(server, kind), token=tokens.ALICE, attach="sess-no-such-session")
    with pytest.raises(HttpStatusError) as refused:
        await client.send(rpc(0, "initialize", {"protocolVersion": 1}))
    assert refused.value.status_code == 404 and "no such session" in str(refused.value)
    await client.close()


def test_attach_arguments_are_checked() -> None:
    with pytest.raises(ClientUsageError, match="controller"):
        HttpClient("http://example.test", attach="s1", role="owner")  # type: ignore[arg-type]
    with pytest.raises(ClientUsageError, match="role goes with attach"):
        HttpClient("http://example.test", role="observer")
    with pytest.raises(ClientUsageError, match="not a session id"):
        HttpClient("http://example.test", attach="two words")


async def test_a_server_that_does_not_attach_is_a_protocol_violation() -> None:
    """A server that knows no attaching ignores the header and starts an agent of its own."""
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.method != "POST":
            return httpx.Response(202)
        body = {"jsonrpc": "2.0", "id": 0, "result": {"protocolVersion": 1}}
        return httpx.Response(200, json=body, headers={"Acp-Connection-Id": "c1"})

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
        client = HttpClient("http://example.test", attach="s1", role="observer", http_client=http)
        with pytest.raises(ProtocolViolationError, match="did not: its initialize result has no"):
            await client.send(rpc(0, "initialize", {"protocolVersion": 1}))
        await client.close()
    assert seen[0].headers["acp-attach-session"] == "s1" and seen[0].headers["acp-attach-role"] == "observer"


# ---------------------------------------------------------------------------------- operation ids


class LosesAnAnswer(httpx.AsyncBaseTransport):
    """Forwards every request to the server and keeps the session/prompt POSTs' bodies; `losing`:
    the first one's answer is lost (the server got the request, the client sees a reset)."""

    def __init__(self, *, losing: bool = True) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.losing = losing
        self.prompts: list[bytes] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.method == "POST" and b'"session/prompt"' in request.content:
            self.prompts.append(request.content)
            if self.losing and len(self.prompts) == 1:
                await response.aclose()
                raise httpx.ReadError("connection reset by peer", request=request)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_prompt_whose_answer_was_lost_is_sent_again_and_runs_once(server: DaphneServer) -> None:
    events: list[ReconnectEvent] = []
    transport = LosesAnAnswer()
    async with httpx.AsyncClient(transport=transport, timeout=STEP) as http:
        client = HttpClient(server.url, token=tokens.ALICE, http_client=http, on_reconnect=events.append)
        session_id = await open_session(client)
        await client.send(prompt(2, session_id, "tick 5 10"))
        lines, answer = await lines_until(client, lambda message: message.get("id") == 2)
        assert answer["result"]["stopReason"] == "end_turn"
        assert lines == [f"tick {index}\n" for index in range(1, 6)]  # the turn ran once
        # Nothing more of it comes: the next turn's output follows at once.
        await client.send(prompt(3, session_id, "echo next"))
        lines, _ = await lines_until(client, lambda message: message.get("id") == 3)
        assert lines == ["next"]
        await client.close()
    first, again, _ = transport.prompts
    assert first == again  # the same bytes: the same JSON-RPC id and operation id
    operation = json.loads(first)["params"]["_meta"][OPERATION]
    assert uuid.UUID(operation).version == 4
    assert [(event.kind, event.what) for event in events] == [
        ("reconnecting", "POST session/prompt"),
        ("resumed", "POST session/prompt"),
    ]


async def test_every_prompt_gets_an_operation_id_unless_it_has_one(server: DaphneServer) -> None:
    transport = LosesAnAnswer(losing=False)
    async with httpx.AsyncClient(transport=transport, timeout=STEP) as http:
        client = HttpClient(server.url, token=tokens.ALICE, http_client=http)
        session_id = await open_session(client)
        mine = prompt(2, session_id, "echo one")
        await client.send(mine)
        await next_message(client, lambda message: message.get("id") == 2)
        own = prompt(3, session_id, "echo two")
        own["params"]["_meta"] = {OPERATION: "op-1", "other": 1}
        await client.send(own)
        await next_message(client, lambda message: message.get("id") == 3)
        await client.close()
    stamped, kept = (json.loads(body) for body in transport.prompts)
    assert uuid.UUID(stamped["params"]["_meta"][OPERATION]).version == 4
    assert "_meta" not in mine["params"]  # the caller's message is not changed
    assert kept["params"]["_meta"] == {OPERATION: "op-1", "other": 1}
