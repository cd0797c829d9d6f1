"""Refresh during a long stream, live (issue 28): daphne serving the demo with
django-oauth-toolkit, access tokens of a few seconds minted by the test through DOT's models, and
`HttpClient` with a `TokenSource` that mints the next one when asked. A `tick` prompt whose
output runs across several expiries arrives whole, in order, without a repeat, over HTTP+SSE and
over WebSocket: the server's `_acp-channels/auth_expiring` notice starts each refresh, the
stream or socket closed at expiry resumes with the new token (docs/client.md, tokens that
expire). The same against fakes, case by case, is in test_client_token_refresh.py.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from acp_channels.client import HttpClient, ReconnectEvent
from tests.live import ROOT, DaphneServer
from tests.test_oauth_live import demo_environment

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

#: Seconds each minted token lives, and the server's notice comes this long before its expiry:
#: a token refreshed on the notice outlives the one it replaces by that much (as an hour's token
#: does with the default minute), and the turn below runs across two expiries at least.
LIFETIME = 3.0
NOTICE_SECONDS = 1.5
TICKS, TICK_MS = 20, 250
#: A process with the demo's Django set up: a line with a lifetime in, a new access token out.
MINT = """
import sys
import django
django.setup()
from demo_project.oauth import issue
for line in sys.stdin:
    print(issue("acp:connect", float(line)), flush=True)
"""


@dataclass
class Minter:
    """Mints DOT access tokens of the demo user through the models (one process, kept)."""

    process: subprocess.Popen[str]
    minted: list[str] = field(default_factory=list)

    def mint(self, seconds: float) -> str:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(f"{seconds}\n")
        self.process.stdin.flush()
        token = self.process.stdout.readline().strip()
        assert token, "the minting process ended"
        self.minted.append(token)
        return token


@dataclass
class MintingSource:
    """The test's `TokenSource`: the current token, and a newly minted one on refresh."""

    minter: Minter
    current: str
    refreshed: list[str] = field(default_factory=list)

    async def token(self) -> str:
        return self.current

    async def refresh(self, rejected: str) -> str | None:
        self.refreshed.append(rejected)
        self.current = await asyncio.to_thread(self.minter.mint, LIFETIME)
        return self.current


@dataclass
class Site:
    server: DaphneServer
    minter: Minter


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    env = demo_environment(tmp_path_factory.mktemp("oauth-refresh-state"))
    env["ACP_AUTH_EXPIRING_SECONDS"] = str(NOTICE_SECONDS)
    process_env = {**os.environ, **env, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "demo_project.settings"}
    setup = subprocess.run(
        [sys.executable, "-m", "demo_project.oauth", "setup"], env=process_env, cwd=ROOT, capture_output=True, text=True
    )
    assert setup.returncode == 0, setup.stderr
    pipe = subprocess.PIPE
    mint = [sys.executable, "-c", MINT]
    minting = subprocess.Popen(mint, env=process_env, cwd=ROOT, text=True, stdin=pipe, stdout=pipe)
    server = DaphneServer(env=env).start()
    minter = Minter(minting)
    yield Site(server, minter)
    server.stop()
    assert minting.stdin is not None
    minting.stdin.close()
    minting.wait(10)
    assert server.errors() == []
    log = "".join(server.log)
    assert not [token for token in minter.minted if token in log], "a token reached the log"


def rpc(request_id: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


async def call(client: HttpClient, request_id: int, method: str, params: dict[str, Any]) -> tuple[Any, list[Any]]:
    """Send a request; its answer, and every message that came before it."""
    await client.send(rpc(request_id, method, params))
    before: list[Any] = []
    while True:
        message = await asyncio.wait_for(client.receive(), 30)
        assert message is not None
        if message.get("id") == request_id and "method" not in message:
            assert "result" in message, message
            return message["result"], before
        before.append(message)


def said(messages: list[Any]) -> str:
    return "".join(
        message["params"]["update"]["content"]["text"]
        for message in messages
        if message.get("method") == "session/update"
        and message["params"]["update"].get("sessionUpdate") == "agent_message_chunk"
    )


@pytest.mark.parametrize("transport", ["http", "ws"])
async def test_refresh_during_a_long_stream(site: Site, transport: str) -> None:
    source = MintingSource(site.minter, await asyncio.to_thread(site.minter.mint, LIFETIME))
    told: list[ReconnectEvent] = []
    url = site.server.url if transport == "http" else site.server.ws_url
    client = HttpClient(url, token=source, timeout=20.0, on_reconnect=told.append)
    try:
        await call(client, 0, "initialize", {"protocolVersion": 1})
        session, _ = await call(client, 1, "session/new", {"cwd": "/tmp", "mcpServers": []})
        prompt = {"sessionId": session["sessionId"], "prompt": [{"type": "text", "text": f"tick {TICKS} {TICK_MS}"}]}
        result, streamed = await call(client, 2, "session/prompt", prompt)
    finally:
        await client.close()
    assert result["stopReason"] == "end_turn"
    # Whole, in order, nothing twice; the notices were the transport's.
    assert said(streamed) == "".join(f"tick {index}\n" for index in range(1, TICKS + 1))
    assert not [message for message in streamed if str(message.get("method", "")).startswith("_acp-channels/auth")]
    assert len(source.refreshed) >= 2, source.refreshed  # the turn outlived two tokens
    kinds = [event.kind for event in told]
    assert "gave-up" not in kinds and "restarted" not in kinds, told
    # Closed at each expiry (the connection stream and the session's over HTTP), then resumed.
    assert kinds.count("resumed") >= 2, told
    assert client.error is None
