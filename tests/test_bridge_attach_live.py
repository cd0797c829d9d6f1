"""`acp-bridge --attach SESSION_ID` as a real process, driven as an editor drives a stdio agent
(docs/bridge.md, "Attaching to a running session"), against our server with bearer tokens
(attaching needs a principal: docs/shared-sessions.md), over HTTP+SSE and WebSocket:

* a session started by an HTTP client running a turn: the editor's initialize opens an
  attachment, its session/new is answered with that session and nothing about the session comes
  before that answer; then the turn's ticks, the retained ones and the rest, in order, once,
  and its end; the editor's next prompt runs on that session (the first client sees it), its
  permission answer and its cancel count, and closing the editor detaches (the session goes on);
* an observer: session/load of the session (null), of another or a second session/new
  refused by the bridge, its prompt refused by the server; the first client's turn shown;
  terminating the session ends the bridge (exit 1, said on stderr);
* an unknown session id: the initialize is answered with an error naming the cause, exit 1;
* a server that does not attach (it answers initialize without the attachment's _meta);
* against a fake: the attach headers go on the initialize POST only (the client attaches), the
  session's stream opens right after it, what it brings waits for the editor's session/new,
  and the editor's prompt carries an operation id;
* the options that do not go with --attach: exit 2.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import auth_fixtures as tokens
from tests import forked
from tests.bridge_process import BridgeProcess, text_updates
from tests.live import JSON, ROOT, DaphneServer, SseReader, open_sse, post, rpc
from tests.peers.fakes import CONNECTION_ID, Answer, FakeAcp, Reply, Request, within
from tests.token_servers import TOKEN_ENV, prompt

TRANSPORTS = ["http", "ws"]
ALICE = {"Authorization": f"Bearer {tokens.ALICE}"}
BRIDGE_ENV = {"ACP_TOKEN": tokens.ALICE}
TURN_ENDED = "_acp-channels/session/turn_ended"
TERMINATED = "_acp-channels/session/terminated"


@pytest.fixture(scope="module")
def server() -> Iterator[DaphneServer]:
    live = DaphneServer(env=TOKEN_ENV).start()
    yield live
    live.stop()
    assert live.errors() == []


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=20.0) as client:
        yield client


def endpoint(server: DaphneServer, transport: str) -> str:
    return server.url if transport == "http" else server.ws_url


def update_of(message: dict[str, Any]) -> tuple[str, str] | None:
    """(kind, text) of a session/update with text content, else None."""
    if message.get("method") != "session/update":
        return None
    update = message["params"]["update"]
    content = update.get("content")
    if not isinstance(content, dict) or "text" not in content:
        return None
    return update["sessionUpdate"], content["text"]


class FirstClient:
    """The client that started the session: an HTTP connection with its two streams open."""

    def __init__(self, http: httpx.AsyncClient, server: DaphneServer) -> None:
        self.http = http
        self.server = server
        self.connection_id = ""
        self.session_id = ""
        self.session_stream: SseReader | None = None

    async def post(self, body: Any) -> None:
        sent = await post(self.http, self.server.url, body, self.connection_id, self.session_id or None, **ALICE)
        assert sent.status_code == 202, sent.text

    async def next(self) -> dict[str, Any]:
        assert self.session_stream is not None
        message: dict[str, Any] = await self.session_stream.next(20)
        return message

    async def until(self, predicate: Any) -> list[dict[str, Any]]:
        """Messages of the session stream up to and including the first that `predicate` takes."""
        seen = []
        while True:
            seen.append(message := await self.next())
            if predicate(message):
                return seen

    async def delete(self) -> int:
        response = await self.http.delete(self.server.url, headers={"Acp-Connection-Id": self.connection_id, **ALICE})
        return response.status_code


@asynccontextmanager
async def first_client(http: httpx.AsyncClient, server: DaphneServer) -> AsyncIterator[FirstClient]:
    client = FirstClient(http, server)
    initialize = rpc(0, "initialize", {"protocolVersion": 1})
    response = await http.post(server.url, headers={**JSON, **ALICE}, json=initialize)
    assert response.status_code == 200, response.text
    client.connection_id = response.headers["acp-connection-id"]
    async with open_sse(http, server.url, client.connection_id, **ALICE) as connection_stream:
        await client.post(rpc(1, "session/new", {"cwd": "/tmp", "mcpServers": []}))
        client.session_id = (await connection_stream.next(20))["result"]["sessionId"]
        async with open_sse(http, server.url, client.connection_id, client.session_id, **ALICE) as session_stream:
            client.session_stream = session_stream
            try:
                yield client
            finally:
                await client.delete()


async def ready(bridge: BridgeProcess) -> None:
    """The bridge process is up (it logs where it relays to before reading stdin)."""
    await bridge.stderr_line(r"attaching to session \S+ as")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_editor_gets_the_running_turn_then_prompts_on_that_session(
    server: DaphneServer, http: httpx.AsyncClient, transport: str, tmp_path: Path
) -> None:
    async with first_client(http, server) as first:
        session_id = first.session_id
        bridge = BridgeProcess(endpoint(server, transport), "--attach", session_id, env=BRIDGE_ENV)
        async with bridge:
            await ready(bridge)
            # The first client starts a turn and reads its first tick: the turn runs.
            await first.post(prompt(2, session_id, "tick 30 30"))
            assert update_of(await first.next()) == ("agent_message_chunk", "tick 1\n")

            init = await bridge.initialize()
            assert init["agentInfo"]["name"] == "acp-channels-demo"
            meta = init["_meta"]["acp-channels/attachment"]
            assert meta.pop("retained") >= 1  # how many messages come before the live ones: tick 1 at least
            assert meta == {
                "sessionId": session_id,
                "connectionId": first.connection_id,
                "role": "controller",
                "turnRunning": True,
            }
            # The editor asks for a session and gets the attached one: nothing before the answer
            # (`call` fails on any other message first), though over a WebSocket the retained
            # output arrives before the editor even asks.
            assert await bridge.new_session(str(tmp_path)) == session_id

            during: list[Any] = []
            while (message := await bridge.receive()).get("method") != TURN_ENDED:
                during.append(message)
            assert message["params"] == {"sessionId": session_id, "stopReason": "end_turn"}
            assert text_updates(during) == [f"tick {i}\n" for i in range(1, 31)]  # retained, then live: once each
            assert [m for m in during if m.get("method") != "session/update"] == []

            # The editor's prompt runs on that session: the first client sees it and its answer.
            reply, before = await bridge.prompt(session_id, "echo from the editor")
            assert reply["result"] == {"stopReason": "end_turn"}
            assert text_updates(before) == ["from the editor"]
            first_saw = await first.until(lambda m: update_of(m) == ("agent_message_chunk", "from the editor"))
            assert ("user_message_chunk", "echo from the editor") in [update_of(m) for m in first_saw]
            assert [m["result"] for m in first_saw if "result" in m] == [{"stopReason": "end_turn"}]  # its tick turn

            # The agent asks for a permission during the editor's turn: the editor's answer counts.
            turn = await bridge.request("session/prompt", prompt(0, session_id, "permission")["params"])
            while (ask := await bridge.receive()).get("method") != "session/request_permission":
                pass
            selected = {"outcome": {"outcome": "selected", "optionId": "allow"}}
            await bridge.send({"jsonrpc": "2.0", "id": ask["id"], "result": selected})
            after: list[Any] = []
            assert (await bridge.reply_to(turn, collect=after))["result"] == {"stopReason": "end_turn"}
            assert text_updates(after) == ["permission: allow"]
            # And its cancel ends its turn.
            turn = await bridge.request("session/prompt", prompt(0, session_id, "wait_for_cancel")["params"])
            await bridge.send({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session_id}})
            assert (await bridge.reply_to(turn, collect=[]))["result"] == {"stopReason": "cancelled"}

            # Closing the editor detaches: the session goes on for the first client.
            await bridge.close_stdin()
            assert await bridge.rest_of_output() == []
            assert await bridge.wait() == 0
        assert "Traceback" not in bridge.stderr
        assert f"attached to session {session_id} as controller" in bridge.stderr
        await first.post(prompt(3, session_id, "echo still running"))
        await first.until(lambda m: update_of(m) == ("agent_message_chunk", "still running"))


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_an_observer_loads_the_session_and_sees_it_terminated(
    server: DaphneServer, http: httpx.AsyncClient, transport: str
) -> None:
    async with first_client(http, server) as first:
        session_id = first.session_id
        args = ("--attach", session_id, "--role", "observer")
        async with BridgeProcess(endpoint(server, transport), *args, env=BRIDGE_ENV) as bridge:
            init = await bridge.initialize()
            meta = init["_meta"]["acp-channels/attachment"]
            assert (meta["role"], meta["turnRunning"]) == ("observer", False)

            other = await bridge.reply_to(await bridge.request("session/load", load_params("sess-other")))
            assert other["error"]["data"] == {"acpBridge": "attached"}
            assert repr(session_id) in other["error"]["message"] and "'sess-other'" in other["error"]["message"]
            assert await bridge.call("session/load", load_params(session_id)) is None
            again = await bridge.reply_to(await bridge.request("session/new", {"cwd": "/tmp", "mcpServers": []}))
            assert again["error"]["data"] == {"acpBridge": "attached"}

            # An observer's prompt: refused by the server (-32011), relayed.
            refused, _ = await bridge.prompt(session_id, "echo never")
            assert refused["error"]["code"] == -32011

            # The first client's turn: shown to the editor (its prompt, the answer, the end).
            await first.post(prompt(2, session_id, "echo hello"))
            shown: list[Any] = []
            while (message := await bridge.receive()).get("method") != TURN_ENDED:
                shown.append(message)
            assert [update_of(m) for m in shown] == [
                ("user_message_chunk", "echo hello"),
                ("agent_message_chunk", "hello"),
            ]

            # The first client ends the session's connection: the editor is told, the bridge ends.
            assert await first.delete() == 202
            assert await bridge.rest_of_output() == [
                {
                    "jsonrpc": "2.0",
                    "method": TERMINATED,
                    "params": {"sessionId": session_id, "connectionId": first.connection_id},
                }
            ]
            assert await bridge.wait() == 1
        assert f"session {session_id!r} was terminated" in bridge.stderr
        assert "Traceback" not in bridge.stderr


def load_params(session_id: str) -> dict[str, Any]:
    return {"sessionId": session_id, "cwd": "/tmp", "mcpServers": []}


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_an_unknown_session_fails_the_initialize_and_the_bridge(server: DaphneServer, transport: str) -> None:
    async with BridgeProcess(endpoint(server, transport), "--attach", "sess-nobody-has", env=BRIDGE_ENV) as bridge:
        request_id = await bridge.request("initialize", {"protocolVersion": 1})
        await bridge.request("session/new", {"cwd": "/tmp", "mcpServers": []})  # an editor that does not wait
        answers = await bridge.rest_of_output()
        assert [answer["id"] for answer in answers] == [request_id, request_id + 1]
        for answer in answers:
            assert answer["error"]["code"] == -32603
            assert answer["error"]["data"] == {"acpBridge": "attach-refused"}
            message = answer["error"]["message"]
            assert "could not attach to session 'sess-nobody-has'" in message
            assert "no such session" in message
        assert await bridge.wait() == 1
    assert "could not attach to session 'sess-nobody-has'" in bridge.stderr
    assert "Traceback" not in bridge.stderr and tokens.ALICE not in bridge.stderr


async def test_a_server_that_does_not_attach_is_refused(fake: FakeAcp) -> None:
    """A server without shared sessions ignores the header and starts an agent: the editor's
    initialize is answered with an error instead, and that connection is closed."""
    async with BridgeProcess(fake.url, "--attach", "sess-1") as bridge:
        request_id = await bridge.request("initialize", {"protocolVersion": 1})
        await bridge.request("session/new", {"cwd": "/tmp", "mcpServers": []})
        answers = await bridge.rest_of_output()
        assert [answer["id"] for answer in answers] == [request_id, request_id + 1]
        for answer in answers:
            assert answer["error"]["data"] == {"acpBridge": "attach-refused"}
            assert "could not attach to session 'sess-1'" in answer["error"]["message"]
            assert "_meta['acp-channels/attachment']" in answer["error"]["message"]
        assert await bridge.wait() == 1
    initialize = fake.of("POST")[0]
    assert (initialize.headers["acp-attach-session"], initialize.headers["acp-attach-role"]) == ("sess-1", "controller")
    assert [request.connection_id for request in fake.of("DELETE")] == [CONNECTION_ID]


async def test_the_client_attaches_and_the_session_waits_for_the_editor(fake: FakeAcp) -> None:
    async def on_initialize(request: Request) -> Answer:
        attachment = {"sessionId": "sess-1", "connectionId": "conn-host", "role": "controller", "turnRunning": False}
        result = {"protocolVersion": 1, "_meta": {"acp-channels/attachment": attachment}}
        return Reply(
            200, {"jsonrpc": "2.0", "id": request.json()["id"], "result": result}, {"acp-connection-id": CONNECTION_ID}
        )

    fake.on_initialize = on_initialize
    retained = {"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "sess-1", "update": {}}}
    fake.push("sess-1", retained)
    async with BridgeProcess(fake.url, "--attach", "sess-1") as bridge:
        init = await bridge.initialize()
        assert init["_meta"]["acp-channels/attachment"]["sessionId"] == "sess-1"
        # The session's stream opens right after the initialize; what it brings is held.
        await within(fake.wait_for(lambda: bool(fake.of("GET", session_id="sess-1"))))
        assert await bridge.new_session("/tmp") == "sess-1"
        assert await bridge.receive() == retained

        turn = await bridge.request("session/prompt", {"sessionId": "sess-1", "prompt": []})
        await within(fake.wait_for(lambda: bool(fake.of("POST", rpc_method="session/prompt"))))
        posted = fake.of("POST", rpc_method="session/prompt")[0]
        operation_id = posted.json()["params"]["_meta"]["acp-channels/operationId"]
        assert str(uuid.UUID(operation_id)) == operation_id
        fake.push("sess-1", {"jsonrpc": "2.0", "id": turn, "result": {"stopReason": "end_turn"}})
        assert (await bridge.reply_to(turn))["result"] == {"stopReason": "end_turn"}
        await bridge.close_stdin()
        assert await bridge.wait() == 0
    initialize, *others = fake.requests
    assert json.loads(initialize.body)["method"] == "initialize"
    assert (initialize.headers["acp-attach-session"], initialize.headers["acp-attach-role"]) == ("sess-1", "controller")
    assert [(request.method, request.session_id) for request in others] == [
        ("GET", None),
        ("GET", "sess-1"),
        ("POST", "sess-1"),
        ("DELETE", None),
    ]
    assert not any(name.startswith("acp-attach") for request in others for name in request.headers)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--role", "observer"], "--role goes with --attach"),
        (["--attach", "sess-1", "--restart"], "do not go together"),
        (["--attach", "has space"], "printable ASCII"),
        (["--attach", "sess-1", "-H", "Acp-Attach-Session: sess-2"], "not both"),
        (["--attach", "sess-1", "--role", "owner"], "invalid choice"),
    ],
)
def test_options_that_do_not_go_with_attach_exit_2(argv: list[str], message: str) -> None:
    result = forked.run(
        [sys.executable, "-m", "acp_channels.bridge", "http://127.0.0.1:9", *argv],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr
