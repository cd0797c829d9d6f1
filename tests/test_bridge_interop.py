"""The stdio bridge under the official SDK clients, run as editors run an agent: each driver
(tests/interop/js/stdio_client.mjs, tests/interop/py_stdio_client.py) spawns
`python -m acp_channels.bridge URL` as its agent command and runs the whole stdio scenario through
it (stream, tool calls, permission, fs/read_text_file, cancel, a second session, exit 0 on stdin
EOF), against our server (one worker and three, HTTP+SSE and WebSocket) and against the official
TypeScript SDK server. Afterwards the remote holds no connection any more.

The same drivers run once against `python -m demo_project.agent` directly: that proves the
drivers themselves, independent of the bridge."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass
from typing import Any

import pytest

from tests import forked
from tests.cluster import Cluster
from tests.live import ROOT, DaphneServer, wait_for_line
from tests.peers.fixtures import ts_server
from tests.peers.process import PeerServer

__all__ = ["ts_server"]  # fixture

JS = ROOT / "tests" / "interop" / "js"
PY_DRIVER = ROOT / "tests" / "interop" / "py_stdio_client.py"
STEP_SECONDS = 20
#: What the drivers' client answers fs/read_text_file with; the agent must say it back unchanged.
FILE_CONTENT = "known content from the client: grüße ✓\nsecond line"
#: The JSON-RPC methods the client sends, in order (the 5 prompts: stream, tool_calls,
#: permission, fs_read, wait_for_cancel; then two echoes after the second session/new).
SENT = ["initialize", "session/new", *["session/prompt"] * 5, "session/cancel", "session/new", *["session/prompt"] * 2]
#: The bridge names the connection the remote gave it once it connected (stderr).
BRIDGE_CONNECTED = re.compile(r"acp-bridge: connected: connection (\S+)")
OPENED = re.compile(r"connection opened .*connection=(\S+)")
TS_CONNECTIONS = re.compile(r"^CONNECTIONS (\d+)$")


@dataclass
class DriverRun:
    summary: dict[str, Any]
    returncode: int
    stderr: str

    def describe(self) -> str:
        return f"exit {self.returncode}\n{json.dumps(self.summary, indent=1)}\n{self.stderr}"


def driver_command(client: str, agent: list[str]) -> list[str]:
    if client == "typescript":
        if shutil.which("node") is None or not (JS / "node_modules").exists():
            pytest.fail("the TS SDK client needs node and `npm ci` in tests/interop/js (./dev.sh test does it)")
        return ["node", str(JS / "stdio_client.mjs"), "--timeout", str(STEP_SECONDS), "--", *agent]
    return [sys.executable, str(PY_DRIVER), "--timeout", str(STEP_SECONDS), "--", *agent]


def run_driver(client: str, agent: list[str]) -> DriverRun:
    """One driver run with `agent` as its agent command, from the repository root (where
    `-m acp_channels.bridge` / `-m demo_project.agent` import from)."""
    env = {name: value for name, value in os.environ.items() if name != "ACP_TOKEN"}  # no token: none needed
    result = forked.run(driver_command(client, agent), capture_output=True, text=True, timeout=180, cwd=ROOT, env=env)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines, f"{client}: no summary line:\n{result.stdout}\n{result.stderr}"
    return DriverRun(json.loads(lines[-1]), result.returncode, result.stderr)


def assert_scenario(run: DriverRun, client: str) -> None:
    """Every check of the scenario, as the driver's summary reports it."""
    summary = run.summary
    assert run.returncode == 0 and summary["ok"] is True, run.describe()
    assert summary["client"] == f"{client}-sdk" and summary["transport"] == "stdio"
    assert summary["protocolVersion"] == 1 and summary["session"] is True
    assert summary["chunks"] == 50 and summary["order"] == "indexed"
    assert summary["streamStopReason"] == "end_turn"
    assert summary["toolCalls"] == ["pending", "in_progress", "completed"]
    assert summary["toolCallOutput"], "the completed tool call carries text content"
    assert summary["toolCallsText"] == "tool call completed" and summary["toolCallsStopReason"] == "end_turn"
    assert summary["permission"] == "permission: allow" and summary["permissionStopReason"] == "end_turn"
    assert summary["fsRead"] == FILE_CONTENT and summary["fsReadStopReason"] == "end_turn"
    assert summary["cancel"] == "cancelled"
    assert summary["sessions"] == 2 and (summary["second"], summary["first"]) == ("second", "first")
    assert summary["sent"] == SENT
    assert summary["responsesSent"] == 2  # the permission answer and the file's content
    # stdin EOF: the agent exited by itself, within the step timeout, with status 0
    assert summary["exited"] is True and summary["exitCode"] == 0 and summary["closed"] is True


def bridge(url: str) -> list[str]:
    return [sys.executable, "-m", "acp_channels.bridge", url]


def bridge_connection_id(run: DriverRun) -> str:
    match = BRIDGE_CONNECTED.search(run.stderr)
    assert match, f"the bridge logged no connection id:\n{run.stderr}"
    return match.group(1)


@dataclass
class LogSince:
    """The lines a server logged since `start`, read live (for wait_for_line)."""

    server: DaphneServer | Cluster | PeerServer
    start: int

    @property
    def log(self) -> list[str]:
        return self.server.log[self.start :]


@pytest.mark.parametrize("client", ["typescript", "python"])
def test_drivers_with_the_demo_agent_directly(client: str) -> None:
    assert_scenario(run_driver(client, [sys.executable, "-m", "demo_project.agent"]), client)


@pytest.mark.parametrize("transport", ["http", "ws"])
@pytest.mark.parametrize("client", ["typescript", "python"])
async def test_bridge_to_our_server(client: str, transport: str, demo_server: DaphneServer | Cluster) -> None:
    since = LogSince(demo_server, len(demo_server.log))
    url = demo_server.url if transport == "http" else demo_server.ws_url
    run = await asyncio.to_thread(run_driver, client, bridge(url))
    assert_scenario(run, client)
    connection_id = bridge_connection_id(run)

    # The server's audit lines: the bridge opened exactly one connection, and it has ended as
    # the transport ends one (DELETE / socket close), so none is left.
    reason = "delete" if transport == "http" else "socket closed"
    await wait_for_line(since, rf"connection ended .*connection={re.escape(connection_id)} .*reason={reason}$")
    assert [m.group(1) for line in since.log if (m := OPENED.search(line))] == [connection_id]
    assert DaphneServer(log=since.log).errors() == []


def ts_connections(log: list[str]) -> list[int]:
    return [int(m.group(1)) for line in log if (m := TS_CONNECTIONS.match(line.strip()))]


@pytest.mark.parametrize("transport", ["http", "ws"])
@pytest.mark.parametrize("client", ["typescript", "python"])
async def test_bridge_to_the_typescript_sdk_server(client: str, transport: str, ts_server: PeerServer) -> None:
    since = LogSince(ts_server, len(ts_server.log))
    before = (ts_connections(ts_server.log) or [0])[-1]
    run = await asyncio.to_thread(run_driver, client, bridge(f"{transport}://127.0.0.1:{ts_server.port}/acp"))
    assert_scenario(run, client)
    bridge_connection_id(run)

    # The server counts its open connections (server.mjs): one more while the bridge ran, and
    # back to where it was once the bridge closed it.
    await wait_for_line(since, rf"^CONNECTIONS {before}$")
    assert ts_connections(since.log) == [before + 1, before]
