"""Clients with a bearer token against a server that requires one: both official SDK clients
(TypeScript and Python, HTTP+SSE and WebSocket, tests/interop/), our HttpClient and the terminal
client. With the right token the whole scenario passes; without one, or with a wrong one, every
client fails promptly with the refusal surfaced (HTTP 401; a refused WebSocket upgrade is 403).

Two servers, the same expectations:
* `acp-channels`: our daphne serving the demo agent with `ACP_TOKEN=<token>` (the demo settings
  turn it into `TOKENS = {token: "team"}` with `AUTHENTICATE = acp_channels.auth.bearer_token`
  and `TOKEN_LOOKUP = acp_channels.auth.settings_tokens`);
* `python-sdk-gate`: the official Python SDK server behind tests/peers/auth_gate.py, a minimal
  gate that refuses the way the wire decisions say, so the clients' side is checked on its own.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import acp
import pexpect
import pytest
from acp.interfaces import Client
from acp.schema import (
    AgentMessageChunk,
    AllowedOutcome,
    PermissionOption,
    RequestPermissionResponse,
    TextContentBlock,
    ToolCallUpdate,
)

from acp_channels.client import AuthenticationError, HttpClient
from tests import forked
from tests.live import ROOT, DaphneServer
from tests.peers.fixtures import GATE_TOKEN, gated_py_sdk_server
from tests.peers.process import PeerServer

__all__ = ["gated_py_sdk_server"]  # fixture

pytestmark = pytest.mark.timeout(120)

TOKEN = GATE_TOKEN  # base64url: also fits the WebSocket subprotocol form
WRONG = "wrong-token-Zm9vYmFy"
JS = ROOT / "tests" / "interop" / "js"
PY_DRIVER = ROOT / "tests" / "interop" / "py_client.py"
STEP = 20.0
#: What a refusal is: 401 over HTTP; a WebSocket refused before the upgrade completes is 403.
REFUSED = {"http": 401, "ws": 403}


@dataclass
class BearerServer:
    name: str
    port: int
    daphne: DaphneServer | None = None

    def url(self, transport: str) -> str:
        return f"{'http' if transport == 'http' else 'ws'}://127.0.0.1:{self.port}/acp"


@pytest.fixture(scope="module", params=["acp-channels", "python-sdk-gate"])
def bearer_server(request: pytest.FixtureRequest) -> Iterator[BearerServer]:
    if request.param == "python-sdk-gate":
        gate = cast(PeerServer, request.getfixturevalue("gated_py_sdk_server"))
        yield BearerServer(request.param, gate.port)
        return
    # The SDK's subprotocol form (acp.bearer.<token>) is opt-in on the server: old clients.
    daphne = DaphneServer(env={"ACP_TOKEN": TOKEN, "ACP_ALLOW_BEARER_SUBPROTOCOL": "1"}).start()
    try:
        yield BearerServer(request.param, daphne.port, daphne)
    finally:
        daphne.stop()


@pytest.fixture(autouse=True)
def no_server_errors(bearer_server: BearerServer) -> Iterator[None]:
    start = len(bearer_server.daphne.log) if bearer_server.daphne else 0
    yield
    if bearer_server.daphne is not None:
        assert DaphneServer(log=bearer_server.daphne.log[start:]).errors() == []


def environment(token: str | None) -> dict[str, str]:
    """This process's environment with ACP_TOKEN set to `token` (or removed)."""
    env = {name: value for name, value in os.environ.items() if name != "ACP_TOKEN"}
    if token is not None:
        env["ACP_TOKEN"] = token
    return env


# ------------------------------------------------------------------------ official SDK clients


def run_driver(client: str, url: str, transport: str, *args: str, env_token: str | None = None) -> dict[str, Any]:
    if client == "typescript":
        if shutil.which("node") is None or not (JS / "node_modules").exists():
            pytest.fail("the TS SDK client needs node and `npm ci` in tests/interop/js (./dev.sh test does it)")
        argv = ["node", str(JS / "ts_client.mjs"), url, transport, "--timeout", "15", *args]
    else:
        argv = [sys.executable, str(PY_DRIVER), url, "--timeout", "15", *args]
    result = forked.run(argv, capture_output=True, text=True, timeout=90, cwd=ROOT, env=environment(env_token))
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines, f"{client}/{transport} printed no summary:\n{result.stdout}\n{result.stderr}"
    summary: dict[str, Any] = json.loads(lines[-1])
    summary["returncode"] = result.returncode
    summary["output"] = result.stdout + result.stderr
    return summary


@pytest.mark.parametrize("transport", ["http", "ws"])
@pytest.mark.parametrize("client", ["typescript", "python"])
def test_official_client_with_the_token(client: str, transport: str, bearer_server: BearerServer) -> None:
    """The whole interop scenario, the token taken from ACP_TOKEN."""
    summary = run_driver(client, bearer_server.url(transport), transport, env_token=TOKEN)
    assert summary["ok"] is True, summary
    assert summary["auth"] == "bearer"
    assert summary["chunks"] == 50 and summary["order"] == "indexed"
    assert summary["permission"] == "permission: allow"
    assert summary["cancel"] == "cancelled"
    assert summary["closed"] is True
    if transport == "http":
        http = summary["http"]
        assert http["delete"] == 202 and not http.get("errors"), http  # every request was let in


def test_official_typescript_client_with_the_token_in_the_subprotocol(bearer_server: BearerServer) -> None:
    """The browser form: subprotocols `acp, acp.bearer.<token>`; the server must choose `acp`
    (the `ws` package fails the handshake if the server chooses none)."""
    summary = run_driver("typescript", bearer_server.url("ws"), "ws", "--token", TOKEN, "--token-subprotocol")
    assert summary["ok"] is True, summary
    assert summary["auth"] == "subprotocol" and summary["cancel"] == "cancelled"


#: Each client refused on each transport, with no token on one and a wrong one on the other (the
#: client's side is the same for both; the server's difference is tested with our own clients).
@pytest.mark.parametrize(
    ("client", "transport", "credentials"),
    [
        ("typescript", "http", "none"),
        ("typescript", "ws", "wrong"),
        ("python", "http", "wrong"),
        ("python", "ws", "none"),
    ],
)
def test_official_client_is_refused(client: str, transport: str, credentials: str, bearer_server: BearerServer) -> None:
    args = ("--token", WRONG) if credentials == "wrong" else ()
    summary = run_driver(client, bearer_server.url(transport), transport, *args)
    assert summary["returncode"] == 1 and summary["ok"] is False
    assert summary["auth"] == ("none" if credentials == "none" else "bearer")
    # Refused at the first request with the status, not a timeout.
    assert summary["status"] == REFUSED[transport], summary
    assert "timed out" not in summary["error"]
    assert not summary.get("sent")
    assert WRONG not in summary["output"]  # the server's text does not echo the token


def test_official_typescript_client_with_a_wrong_token_in_the_subprotocol(bearer_server: BearerServer) -> None:
    summary = run_driver("typescript", bearer_server.url("ws"), "ws", "--token", WRONG, "--token-subprotocol")
    assert summary["ok"] is False and summary["status"] == 403, summary


# -------------------------------------------------------------------------------- HttpClient


@dataclass
class Recorder:
    texts: list[str] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        if isinstance(update, AgentMessageChunk) and isinstance(update.content, TextContentBlock):
            self.texts.append(update.content.text)
            self.arrived.set()

    async def request_permission(
        self, session_id: str, tool_call: ToolCallUpdate, options: list[PermissionOption], **kwargs: Any
    ) -> RequestPermissionResponse:
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id="allow"))

    async def settle(self, count: int) -> None:
        while len(self.texts) < count:
            self.arrived.clear()
            await self.arrived.wait()


async def step(awaitable: Any) -> Any:
    async with asyncio.timeout(STEP):
        return await awaitable


@pytest.mark.parametrize(("transport", "form"), [("http", "header"), ("ws", "header"), ("ws", "subprotocol")])
async def test_http_client_with_the_token(
    transport: str, form: str, bearer_server: BearerServer, tmp_path: Path
) -> None:
    recorder = Recorder()
    client = HttpClient(bearer_server.url(transport), token=TOKEN, websocket_token=form, timeout=10)  # type: ignore[arg-type]
    conn = acp.connect_to_agent(cast(Client, recorder), client)
    try:
        await step(conn.initialize(protocol_version=1))
        session = await step(conn.new_session(cwd=str(tmp_path), mcp_servers=[]))
        for number, text in enumerate(["echo with a token", "permission"], 1):
            response = await step(conn.prompt(session_id=session.session_id, prompt=[acp.text_block(text)]))
            assert response.stop_reason == "end_turn"
            await step(recorder.settle(number))
        assert recorder.texts == ["with a token", "permission: allow"]
        if form == "subprotocol":
            assert client.transport.subprotocol == "acp"  # type: ignore[union-attr]
    finally:
        await step(conn.close())
    assert client.error is None


@pytest.mark.parametrize(
    ("transport", "form", "credentials"),
    [
        ("http", "header", "none"),
        ("http", "header", "wrong"),
        ("ws", "header", "none"),
        ("ws", "header", "wrong"),
        ("ws", "subprotocol", "wrong"),
    ],
)
async def test_http_client_is_refused(transport: str, form: str, credentials: str, bearer_server: BearerServer) -> None:
    token = WRONG if credentials == "wrong" else None
    client = HttpClient(bearer_server.url(transport), token=token, websocket_token=form, timeout=10)  # type: ignore[arg-type]
    with pytest.raises(AuthenticationError) as refused:
        await step(client.send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}))
    error = refused.value
    assert error.status_code == REFUSED[transport]
    assert error.credentials_sent is (token is not None)
    if transport == "http":
        challenge = error.www_authenticate or ""
        assert challenge.startswith("Bearer") and 'realm="acp"' in challenge
        assert ('error="invalid_token"' in challenge) is (token is not None)
    assert WRONG not in str(error) and WRONG not in repr(error)
    await step(client.close())


# ------------------------------------------------------------------------- terminal client


def spawn_terminal(url: str, *args: str, token: str | None) -> pexpect.spawn:
    child = forked.TerminalChild(
        sys.executable,
        ["-m", "acp_channels.client", url, "--no-history", *args],
        cwd=str(ROOT),
        env=environment(token),
        encoding="utf-8",
        timeout=20,
        dimensions=(50, 200),
    )
    child.logfile_read = io.StringIO()  # everything it printed
    return child


def printed(child: pexpect.spawn) -> str:
    return cast(io.StringIO, child.logfile_read).getvalue()


@pytest.mark.parametrize("transport", ["http", "ws"])
def test_terminal_client_with_acp_token(transport: str, bearer_server: BearerServer) -> None:
    child = spawn_terminal(bearer_server.url(transport), token=TOKEN)
    try:
        child.expect(r"Connected to .*ACP Channels demo agent .* over (HTTP\+SSE|WebSocket)")
        child.expect(TERMINAL_PROMPT)
        child.send("echo hello with a token\r")
        child.expect(r"\[end_turn\]")
        shown = re.sub(r"\x1b\[[0-?]*[ -/]*[@-~]", "", str(child.before)).replace("\r", "\n")
        assert "hello with a token" in shown.split("\n")  # the agent's line, not the typed one
        child.expect(TERMINAL_PROMPT)
        child.send("/quit\r")
        child.expect("Disconnected.")
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 0
        assert "warning" not in printed(child)  # ACP_TOKEN is the recommended form
    finally:
        if child.isalive():
            child.terminate(force=True)


#: The terminal client's prompt: prompt_toolkit draws "> " as ">", backspace, two columns right.
TERMINAL_PROMPT = r">( |\x08\x1b\[2C)"
TERMINAL_REFUSALS = {
    ("http", "none"): r"error:.* 401 Unauthorized from http://\S+/acp: ",
    ("http", "wrong"): r"error:.* 401 Unauthorized from http://\S+/acp: ",
    ("ws", "none"): r"error:.* 403 Forbidden from ws://\S+/acp",
    ("ws", "wrong"): r"error:.* 403 Forbidden from ws://\S+/acp",
}


@pytest.mark.parametrize(("transport", "credentials"), list(TERMINAL_REFUSALS))
def test_terminal_client_refused(transport: str, credentials: str, bearer_server: BearerServer) -> None:
    token = WRONG if credentials == "wrong" else None
    message = TERMINAL_REFUSALS[(transport, credentials)]
    child = spawn_terminal(bearer_server.url(transport), token=token)
    try:
        child.expect(message)
        hint = "requires authentication.*set ACP_TOKEN" if token is None else "(refused the token|token is wrong)"
        child.expect(hint)
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 1
        assert WRONG not in printed(child)
    finally:
        if child.isalive():
            child.terminate(force=True)
