"""The terminal client (`python -m acp_channels.client URL`) driven through a pseudo-terminal."""

from __future__ import annotations

import io
import os
import re
import sys
from collections.abc import Iterator

import httpx
import pexpect
import pytest

from tests.live import ROOT, DaphneServer
from tests.peers.fixtures import ts_server
from tests.peers.process import PeerServer

__all__ = ["ts_server"]  # fixture

pytestmark = pytest.mark.timeout(60)
TIMEOUT = 15


def spawn(*args: str) -> pexpect.spawn:
    child = pexpect.spawn(
        sys.executable,
        ["-m", "acp_channels.client", *args],
        cwd=str(ROOT),
        encoding="utf-8",
        timeout=TIMEOUT,
        dimensions=(50, 200),
    )
    return child


@pytest.fixture
def terminal_log() -> Iterator[list[pexpect.spawn]]:
    """Children to clean up; their output is shown when a test fails."""
    children: list[pexpect.spawn] = []
    yield children
    for child in children:
        if child.isalive():
            child.terminate(force=True)


def turn(child: pexpect.spawn, line: str, *expected: str) -> str:
    """Type a prompt; expect each pattern in order, then the turn's end and a fresh prompt."""
    child.sendline(line)
    for pattern in expected:
        child.expect(pattern)
    child.expect(r"\[(end_turn|cancelled|max_tokens|refusal)\]|\[error ")
    ended = child.after
    child.expect("> ")
    return str(ended)


def test_terminal_session_against_our_server(demo_server: DaphneServer, terminal_log: list[pexpect.spawn]) -> None:
    child = spawn(f"http://127.0.0.1:{demo_server.port}", "--verbose")
    terminal_log.append(child)
    child.expect(r"Connected to ACP Channels demo agent 0\.1\.0 over HTTP\+SSE")
    child.expect(r"connection (\S+)  session (\S+)")
    connection_id = child.match.group(1)
    child.expect("> ")

    assert turn(child, "echo hi", r"\r\nhi") == "[end_turn]"
    assert turn(child, "stream 3 8", "0:xxxxxx1:xxxxxx2:xxxxxx") == "[end_turn]"
    turn(
        child,
        "tool_calls",
        r"\[tool\] Reading demo data \(read\): pending",
        r"\[tool\] Reading demo data: in_progress",
        r"\[tool\] Reading demo data: completed",
        r"\| demo tool output",
        "tool call completed",
    )

    child.sendline("permission")
    child.expect(r"\[permission\] Demo permission request")
    child.expect(r"1\) Allow \[allow_once\]")
    child.expect(r"2\) Reject \[reject_once\]")
    child.expect("Choose 1-2: ")
    child.sendline("maybe")
    child.expect("answer with a number or an option name")
    child.expect("Choose 1-2: ")
    child.sendline("1")
    child.expect("permission: allow")
    child.expect(r"\[end_turn\]")
    child.expect("> ")

    child.sendline("fail")
    child.expect(r"\[error -32603\] demo failure")
    child.expect("> ")

    child.sendline("wait_for_cancel")
    child.expect(r"POST session/prompt: HTTP 202")  # the server has the turn (--verbose log)
    child.sendintr()
    child.expect("cancelling the turn")
    child.expect(r"\[cancelled\]")
    child.expect("> ")

    child.sendintr()  # at the prompt: a hint first
    child.expect("press Ctrl-C again")
    child.expect("> ")
    child.sendline("echo still here")
    child.expect(r"\[end_turn\]")
    child.expect("> ")

    child.sendeof()  # Ctrl-D
    child.expect("Disconnected.")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before

    # The client sent DELETE: the connection is gone.
    with httpx.Client(timeout=10) as http:
        headers = {"Acp-Connection-Id": connection_id, "Content-Type": "application/json"}
        assert http.delete(demo_server.url, headers=headers).status_code == 404
        body = '{"jsonrpc":"2.0","method":"x/after"}'
        assert http.post(demo_server.url, headers=headers, content=body).status_code == 404
    assert not demo_server.errors()


def test_terminal_against_the_typescript_sdk_server_over_websocket(
    ts_server: PeerServer, terminal_log: list[pexpect.spawn]
) -> None:
    child = spawn(f"ws://127.0.0.1:{ts_server.port}/acp")
    terminal_log.append(child)
    child.expect(r"Connected to TS SDK peer agent 2\.4\.0 over WebSocket")
    child.expect("> ")
    assert turn(child, "echo from the terminal", "from the terminal") == "[end_turn]"
    child.sendline("permission")
    child.expect("Choose 1-2: ")
    child.sendline("reject")
    child.expect("permission: reject")
    child.expect("> ")
    child.sendline("/quit")
    child.expect("Disconnected.")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before


def test_terminal_reports_a_server_that_goes_away(terminal_log: list[pexpect.spawn]) -> None:
    """The official Python SDK server (its own process here, so it can be killed)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server = PeerServer(argv=[sys.executable, "-m", "tests.peers.py_sdk_server"], cwd=ROOT, env=env).start()
    try:
        child = spawn(f"http://127.0.0.1:{server.port}")
        terminal_log.append(child)
        child.expect(r"Connected to ACP Channels demo agent 0\.1\.0 over HTTP\+SSE")
        child.expect("> ")
        assert turn(child, "echo before", "before") == "[end_turn]"
        assert server.process is not None
        server.process.kill()
        child.expect(r"error: (connection|session \S+) SSE stream ended")
        child.expect("Disconnected.")
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 1
    finally:
        server.stop()


def test_terminal_reports_a_server_that_is_not_there(terminal_log: list[pexpect.spawn]) -> None:
    child = spawn("http://127.0.0.1:9/acp", "--timeout", "5")
    terminal_log.append(child)
    child.expect(r"error: initialize: ConnectError")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 1


def test_terminal_refuses_a_bad_url(terminal_log: list[pexpect.spawn]) -> None:
    child = spawn("ftp://example.com")
    terminal_log.append(child)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 2
    assert re.search(r"not an http\(s\):// or ws\(s\):// URL", child.before or "")


def spawn_with_environment(env: dict[str, str], *args: str) -> pexpect.spawn:
    child = pexpect.spawn(
        sys.executable, ["-m", "acp_channels.client", *args], cwd=str(ROOT), env=env, encoding="utf-8", timeout=TIMEOUT
    )
    child.logfile_read = io.StringIO()
    return child


def without_acp_token(**extra: str) -> dict[str, str]:
    return {**{name: value for name, value in os.environ.items() if name != "ACP_TOKEN"}, **extra}


def test_terminal_warns_about_a_token_on_the_command_line(terminal_log: list[pexpect.spawn]) -> None:
    """--token wins over ACP_TOKEN, and is warned about (argv is visible in `ps`); the token is
    never printed."""
    child = spawn_with_environment(
        without_acp_token(ACP_TOKEN="from-the-environment"), "http://127.0.0.1:9/acp", "--token", "flag-token-1"
    )
    terminal_log.append(child)
    child.expect(r"warning: a token given with --token is visible to other local users")
    child.expect(r"error: initialize: ConnectError")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 1
    output = child.logfile_read.getvalue()
    assert "flag-token-1" not in output and "from-the-environment" not in output


def test_terminal_warns_about_a_token_sent_unencrypted_beyond_loopback(terminal_log: list[pexpect.spawn]) -> None:
    # 192.0.2.1 (TEST-NET-1) never answers: --timeout 1 ends the attempt.
    child = spawn_with_environment(without_acp_token(ACP_TOKEN="t0ken"), "http://192.0.2.1:9/acp", "--timeout", "1")
    terminal_log.append(child)
    child.expect(r"warning: sending the token unencrypted to 192\.0\.2\.1 \(http://\); use https://")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 1
    assert "--token is visible" not in child.logfile_read.getvalue()


@pytest.mark.parametrize(
    ("args", "token", "message"),
    [
        (
            ["http://127.0.0.1:9"],
            "has space",
            r"space, a control or a non-ASCII character \(character 4\)",
        ),
        (["ws://127.0.0.1:9", "--token-subprotocol"], "a/b", r"cannot travel as a WebSocket subprotocol"),
        (["http://127.0.0.1:9", "--token-subprotocol"], "t0ken", r"--token-subprotocol needs a ws\(s\):// URL"),
        (["ws://127.0.0.1:9", "--token-subprotocol"], None, r"--token-subprotocol needs a ws\(s\):// URL and a token"),
        (["http://127.0.0.1:9", "-H", "Authorization: Basic eA=="], "t0ken", r"not both"),
    ],
)
def test_terminal_refuses_unusable_credentials(
    args: list[str], token: str | None, message: str, terminal_log: list[pexpect.spawn]
) -> None:
    env = without_acp_token(**({"ACP_TOKEN": token} if token is not None else {}))
    child = spawn_with_environment(env, *args)
    terminal_log.append(child)
    child.expect(message)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 2
    if token is not None:
        assert token not in child.logfile_read.getvalue()
