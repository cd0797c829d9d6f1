"""The terminal client (`python -m acp_channels.client URL`) driven through a pseudo-terminal
(pexpect: prompt_toolkit's line editing, rich's colour and live turn indicator) and through pipes
(plain output), against live servers. The client is forked from the forkserver (tests/forked.py)
but for `--version`, a test of the command itself."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pexpect
import pytest
from acp.schema import AgentPlanUpdate, PlanEntry, ToolCallProgress, ToolCallStart

from acp_channels.client._errors import HttpStatusError
from acp_channels.client._terminal import COMMANDS
from acp_channels.client._terminal_client import TerminalClient
from acp_channels.client._terminal_output import Screen, describe_error
from tests import forked
from tests.live import ROOT, DaphneServer
from tests.peers.fixtures import ts_server
from tests.peers.process import PeerServer

__all__ = ["ts_server"]  # fixture

pytestmark = pytest.mark.timeout(60)
TIMEOUT = 15
ENTER = "\r"  # what the Enter key sends on a terminal
UP = "\x1b[A"
#: Escape sequences: CSI (colour, cursor movement), OSC, and two-character ones.
ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)|\x1b[@-Z\\-_=>]")
SGR = re.compile(r"\x1b\[([0-9;]*)m")
STOP = r"\[(end_turn|cancelled|max_tokens|refusal)\]"
#: A prompt: prompt_toolkit draws "> " as ">", backspace, two columns right.
PROMPT = r">( |\x08\x1b\[2C)"


def plain(text: str) -> str:
    """What a person reads: escape sequences dropped, lines ended by \\n."""
    return ESCAPE.sub("", text).replace("\r\n", "\n").replace("\r", "\n")


def colour_codes(text: str) -> list[str]:
    """The SGR parameters that set a colour (30-38, 40-48, 90-97, 100-107; not 39/49, the defaults)."""
    found = []
    for match in SGR.finditer(text):
        for parameter in match.group(1).split(";"):
            if parameter.isdigit():
                number = int(parameter)
                if 30 <= number <= 38 or 40 <= number <= 48 or 90 <= number <= 97 or 100 <= number <= 107:
                    found.append(parameter)
    return found


@pytest.fixture(scope="module")
def demo() -> Iterator[DaphneServer]:
    """One daphne with the demo agent, for what does not depend on the server's shape."""
    server = DaphneServer().start()
    yield server
    server.stop()


@pytest.fixture
def state_home(tmp_path: Path) -> Path:
    """XDG_STATE_HOME for the client: its history file lands here, not in the real home."""
    return tmp_path / "state"


def environment(state_home: Path | None = None, **extra: str) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if name not in ("ACP_TOKEN", "NO_COLOR", "FORCE_COLOR")}
    env["TERM"] = "xterm-256color"
    if state_home is not None:
        env["XDG_STATE_HOME"] = str(state_home)
    return {**env, **extra}


def spawn(*args: str, env: dict[str, str] | None = None, history: bool = False) -> pexpect.spawn:
    """The client on a pseudo-terminal; its history kept in memory unless `history` (then give
    an `environment(state_home)`: never the real home's)."""
    child = forked.TerminalChild(
        sys.executable,
        ["-m", "acp_channels.client", *args, *([] if history else ["--no-history"])],
        cwd=str(ROOT),
        env=env or environment(),
        encoding="utf-8",
        timeout=TIMEOUT,
        dimensions=(50, 200),
    )
    child.logfile_read = io.StringIO()  # everything it printed
    return child


def printed(child: pexpect.spawn) -> str:
    log = child.logfile_read
    assert isinstance(log, io.StringIO)
    return log.getvalue()


@pytest.fixture
def terminal_log() -> Iterator[list[pexpect.spawn]]:
    """Children to clean up; what each printed is shown with a failure (captured output)."""
    children: list[pexpect.spawn] = []
    yield children
    for child in children:
        if child.isalive():
            child.terminate(force=True)
        if isinstance(child.logfile_read, io.StringIO):
            print("--- what the client printed ---")
            print(child.logfile_read.getvalue())


def type_line(child: pexpect.spawn, line: str) -> None:
    child.send(line + ENTER)


def turn(child: pexpect.spawn, line: str) -> tuple[str, str]:
    """Type a prompt; wait for the turn's end and a fresh prompt. Returns the stop reason and the
    plain text printed during the turn."""
    type_line(child, line)
    child.expect(STOP)
    during = plain(str(child.before))
    reason = child.match.group(1)
    child.expect(PROMPT)
    return reason, during


def lines_of(text: str) -> list[str]:
    return [line.rstrip() for line in text.split("\n")]


def test_terminal_session_against_our_server(
    demo_server: DaphneServer, terminal_log: list[pexpect.spawn], state_home: Path
) -> None:
    child = spawn(f"http://127.0.0.1:{demo_server.port}", "--verbose", env=environment(state_home), history=True)
    terminal_log.append(child)
    child.expect(r"Connected to .*ACP Channels demo agent 0\.1\.0.* over HTTP\+SSE")
    child.expect(r"connection (\S+)  session (\S+)")
    connection_id = child.match.group(1)
    child.expect(PROMPT)

    reason, during = turn(child, "echo hi")
    assert reason == "end_turn" and "hi" in lines_of(during)
    reason, during = turn(child, "stream 3 8")
    assert reason == "end_turn" and "0:xxxxxx1:xxxxxx2:xxxxxx" in lines_of(during)

    reason, during = turn(child, "tool_calls")
    assert reason == "end_turn"
    shown = lines_of(during)
    # One line per status: the mark, the title, the kind, the status; then the content.
    for line in (
        "  ○ Reading demo data (read) pending",
        "  ◐ Reading demo data (read) in_progress",
        "  ✓ Reading demo data (read) completed",
        "    │ demo tool output",
        "tool call completed",
    ):
        assert line in shown, during

    type_line(child, "permission")
    child.expect("Choose 1-2:")
    question = lines_of(plain(str(child.before)))
    assert "? Permission: Demo permission request (edit)" in question
    assert "  1) Allow   allow once" in question and "  2) Reject  reject once" in question
    type_line(child, "maybe")
    child.expect("answer with a number or an option name")
    child.expect("Choose 1-2:")
    type_line(child, "1")
    child.expect("→ .*Allow")
    child.expect("permission: allow")
    child.expect(r"\[end_turn\]")
    child.expect(PROMPT)

    type_line(child, "fail")
    child.expect(r"error:.*demo failure \(-32603\)")
    child.expect(PROMPT)

    type_line(child, "wait_for_cancel")
    child.expect(r"POST session/prompt: HTTP 202")  # the server has the turn (--verbose log)
    child.expect(r"working .*Ctrl-C cancels")  # the live indicator
    child.sendintr()
    child.expect("cancelling the turn")
    child.expect(r"\[cancelled\]")
    child.expect(PROMPT)

    child.sendcontrol("c")  # at the prompt: a hint first
    child.expect("press Ctrl-C again")
    child.expect(PROMPT)
    type_line(child, "echo still here")
    child.expect(r"\[end_turn\]")
    child.expect(PROMPT)

    child.sendcontrol("d")
    child.expect("Disconnected.")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, printed(child)

    output = printed(child)
    assert plain(output).count("demo failure") == 1  # `fail` says it once
    assert colour_codes(output), "a terminal gets colour"
    assert "^[[A" not in output
    assert "WARNING" not in output  # prompt_toolkit asks no cursor position pexpect would not answer

    # The client sent DELETE: the connection is gone.
    with httpx.Client(timeout=10) as http:
        headers = {"Acp-Connection-Id": connection_id, "Content-Type": "application/json"}
        assert http.delete(demo_server.url, headers=headers).status_code == 404
        body = '{"jsonrpc":"2.0","method":"x/after"}'
        assert http.post(demo_server.url, headers=headers, content=body).status_code == 404
    assert not demo_server.errors()


def test_up_recalls_earlier_prompts_across_runs(
    demo: DaphneServer, terminal_log: list[pexpect.spawn], state_home: Path
) -> None:
    url = f"http://127.0.0.1:{demo.port}"
    child = spawn(url, env=environment(state_home), history=True)
    terminal_log.append(child)
    child.expect(PROMPT)
    turn(child, "echo first entry")
    turn(child, "echo second entry")
    child.send(UP + UP + ENTER)  # the one before the last
    child.expect(STOP)
    assert "first entry" in lines_of(plain(str(child.before)))
    child.expect(PROMPT)
    type_line(child, "/quit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0

    history = state_home / "acp-channels" / "history"
    assert history.stat().st_mode & 0o777 == 0o600  # prompts can hold anything
    assert "+echo second entry" in history.read_text()

    # A new run starts with the saved history.
    child = spawn(url, env=environment(state_home), history=True)
    terminal_log.append(child)
    child.expect(PROMPT)
    # Saved: "echo first entry", "echo second entry", "echo first entry" (recalled), "/quit".
    child.send(UP + UP + UP + ENTER)
    child.expect(STOP)
    assert "second entry" in lines_of(plain(str(child.before)))
    child.expect(PROMPT)
    type_line(child, "/quit")
    child.expect(pexpect.EOF)


def test_no_history_keeps_nothing_on_disk(
    demo: DaphneServer, terminal_log: list[pexpect.spawn], state_home: Path
) -> None:
    child = spawn(f"http://127.0.0.1:{demo.port}", env=environment(state_home))  # --no-history
    terminal_log.append(child)
    child.expect(PROMPT)
    turn(child, "echo not kept")
    child.send(UP + ENTER)  # still recalled within the run
    child.expect(STOP)
    assert "not kept" in lines_of(plain(str(child.before)))
    child.expect(PROMPT)
    type_line(child, "/quit")
    child.expect(pexpect.EOF)
    assert not state_home.exists()


def test_help_lists_every_command(demo: DaphneServer, terminal_log: list[pexpect.spawn]) -> None:
    child = spawn(f"http://127.0.0.1:{demo.port}")
    terminal_log.append(child)
    child.expect(PROMPT)
    type_line(child, "/help")
    child.expect("Anything else is sent to the agent as a prompt.")
    shown = lines_of(plain(str(child.before)))
    for names, what in COMMANDS:
        assert any(line.startswith(f"  {', '.join(names)} ") and line.endswith(what) for line in shown), shown
    for key in ("Up / Down", "Ctrl-C", "Ctrl-D"):
        assert any(line.startswith(f"  {key} ") for line in shown)
    child.expect(PROMPT)
    type_line(child, "/info")
    child.expect(r"connection \S+  session \S+")
    child.expect(PROMPT)
    type_line(child, "/quit")
    child.expect("Disconnected.")
    child.expect(pexpect.EOF)


def test_ctrl_c_at_a_permission_question_cancels_the_turn(
    demo: DaphneServer, terminal_log: list[pexpect.spawn]
) -> None:
    child = spawn(f"http://127.0.0.1:{demo.port}")
    terminal_log.append(child)
    child.expect(PROMPT)
    type_line(child, "permission")
    child.expect("Choose 1-2:")
    child.sendcontrol("c")  # a key for prompt_toolkit, not a signal: the client must still cancel
    child.expect("cancelling the turn")
    child.expect("→ .*cancelled")
    child.expect("permission: cancelled")
    child.expect(STOP)
    child.expect(PROMPT)
    reason, _ = turn(child, "echo the session goes on")
    assert reason == "end_turn"
    type_line(child, "/quit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_no_color_on_a_terminal(demo: DaphneServer, terminal_log: list[pexpect.spawn]) -> None:
    child = spawn(f"http://127.0.0.1:{demo.port}", env=environment(NO_COLOR="1"))
    terminal_log.append(child)
    child.expect(PROMPT)
    turn(child, "tool_calls")
    type_line(child, "fail")
    child.expect(r"error:.*demo failure")
    child.expect(PROMPT)
    type_line(child, "/quit")
    child.expect(pexpect.EOF)
    output = printed(child)
    assert "Reading demo data" in output
    assert colour_codes(output) == []


def run_piped(*args: str, stdin: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return forked.run(
        [sys.executable, "-m", "acp_channels.client", *args],
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        env=env or environment(),
        timeout=TIMEOUT * 2,
    )


def test_plain_output_when_not_a_terminal(demo: DaphneServer) -> None:
    """Through pipes: no escape sequence at all, a transcript that reads like the session, the
    error once on stderr."""
    result = run_piped(
        f"http://127.0.0.1:{demo.port}", stdin="echo hi\ntool_calls\npermission\n2\nfail\n", env=environment()
    )
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout + result.stderr
    shown = lines_of(result.stdout)
    for line in (
        "> echo hi",
        "hi",
        "> tool_calls",
        "  ✓ Reading demo data (read) completed",
        "? Permission: Demo permission request (edit)",
        "Choose 1-2: 2",
        "  → Reject",
        "permission: reject",
        "Disconnected.",
    ):
        assert line in shown, result.stdout
    assert result.stderr == "error: demo failure (-32603)\n"


def test_a_wrong_url_is_one_line(demo: DaphneServer) -> None:
    url = f"http://127.0.0.1:{demo.port}/acpx"
    result = run_piped(url, stdin="")
    assert result.returncode == 1
    assert result.stderr == f"error: 404 Not Found from {url}/acp\n"  # not Django's HTML page
    assert result.stdout == ""


def test_a_wrong_url_on_a_terminal(demo: DaphneServer, terminal_log: list[pexpect.spawn]) -> None:
    child = spawn(f"http://127.0.0.1:{demo.port}/acpx")
    terminal_log.append(child)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 1
    assert lines_of(plain(printed(child)).strip()) == [
        f"error: 404 Not Found from http://127.0.0.1:{demo.port}/acpx/acp"
    ]


def test_terminal_against_the_typescript_sdk_server_over_websocket(
    ts_server: PeerServer, terminal_log: list[pexpect.spawn]
) -> None:
    child = spawn(f"ws://127.0.0.1:{ts_server.port}/acp")
    terminal_log.append(child)
    child.expect(r"Connected to .*TS SDK peer agent 2\.4\.0.* over WebSocket")
    child.expect(PROMPT)
    reason, during = turn(child, "echo from the terminal")
    assert reason == "end_turn" and "from the terminal" in during
    type_line(child, "permission")
    child.expect("Choose 1-2:")
    type_line(child, "reject")
    child.expect("permission: reject")
    child.expect(PROMPT)
    type_line(child, "/quit")
    child.expect("Disconnected.")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, printed(child)


def test_terminal_reports_a_server_that_goes_away(terminal_log: list[pexpect.spawn]) -> None:
    """The official Python SDK server (its own process here, so it can be killed)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server = PeerServer(argv=[sys.executable, "-m", "tests.peers.py_sdk_server"], cwd=ROOT, env=env).start()
    try:
        child = spawn(f"http://127.0.0.1:{server.port}")
        terminal_log.append(child)
        child.expect(r"Connected to .*ACP Channels demo agent 0\.1\.0.* over HTTP\+SSE")
        child.expect(PROMPT)
        assert turn(child, "echo before")[0] == "end_turn"
        assert server.process is not None
        server.process.kill()
        child.expect(r"error:.*(connection|session \S+) SSE stream ended")
        child.expect("Disconnected.")
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 1
    finally:
        server.stop()


def test_terminal_reports_a_server_that_is_not_there(terminal_log: list[pexpect.spawn]) -> None:
    child = spawn("http://127.0.0.1:9/acp", "--timeout", "5")
    terminal_log.append(child)
    child.expect(r"error:.*no connection to http://127\.0\.0\.1:9/acp \(initialize: ConnectError")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ftp://example.com"], r"error: not an http\(s\):// or ws\(s\):// URL"),
        (["http://127.0.0.1:9", "--timeout"], r"error: argument --timeout: expected one argument"),
        ([], r"error: the following arguments are required: url"),
    ],
)
def test_usage_errors_exit_2(args: list[str], message: str) -> None:
    result = run_piped(*args, stdin="")
    assert result.returncode == 2
    assert re.search(f"^{message}", result.stderr, re.MULTILINE), result.stderr
    assert "acp-client: error" not in result.stderr  # one prefix


def test_version_is_printed_without_a_url() -> None:
    from acp_channels import __version__

    result = subprocess.run(  # how the command itself starts: not forked
        [sys.executable, "-m", "acp_channels.client", "--version"], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert (result.returncode, result.stdout.strip()) == (0, f"acp-client {__version__}")


def spawn_with_environment(env: dict[str, str], *args: str) -> pexpect.spawn:
    return spawn(*args, env=env)


def without_acp_token(**extra: str) -> dict[str, str]:
    return environment(**extra)


def test_terminal_warns_about_a_token_on_the_command_line(terminal_log: list[pexpect.spawn]) -> None:
    """--token wins over ACP_TOKEN, and is warned about (argv is visible in `ps`); the token is
    never printed."""
    child = spawn_with_environment(
        without_acp_token(ACP_TOKEN="from-the-environment"), "http://127.0.0.1:9/acp", "--token", "flag-token-1"
    )
    terminal_log.append(child)
    child.expect(r"warning:.*a token given with --token is visible to other local users")
    child.expect(r"error:.*ConnectError")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 1
    output = printed(child)
    assert "flag-token-1" not in output and "from-the-environment" not in output


def test_terminal_warns_about_a_token_sent_unencrypted_beyond_loopback(terminal_log: list[pexpect.spawn]) -> None:
    # 192.0.2.1 (TEST-NET-1) never answers: --timeout 1 ends the attempt.
    child = spawn_with_environment(without_acp_token(ACP_TOKEN="t0ken"), "http://192.0.2.1:9/acp", "--timeout", "1")
    terminal_log.append(child)
    child.expect(r"warning:.*sending the token unencrypted to 192\.0\.2\.1 \(http://\); use https://")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 1
    assert "--token is visible" not in printed(child)


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
    child.expect("error: .*" + message)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 2
    if token is not None:
        assert token not in printed(child)


# ---------------------------------------------------------------- rendering, without a server


class NoInput:
    async def read(self, prompt: str, *, history: bool = True) -> str | object | None:
        raise AssertionError("nothing should be asked")


async def rendered(*updates: object) -> list[str]:
    out = io.StringIO()
    client = TerminalClient(Screen(out, io.StringIO()), NoInput())
    for update in updates:
        await client.session_update("s", update)
    return lines_of(out.getvalue())


async def test_a_plan_reads_at_a_glance() -> None:
    shown = await rendered(
        AgentPlanUpdate(
            session_update="plan",
            entries=[
                PlanEntry(content="Read the code", priority="medium", status="completed"),
                PlanEntry(content="Write the fix", priority="high", status="in_progress"),
                PlanEntry(content="Run the tests", priority="low", status="pending"),
            ],
        )
    )
    assert shown[:4] == ["  plan", "    ✓ Read the code", "    ◐ Write the fix (high)", "    ○ Run the tests"]


async def test_a_failed_tool_call_and_a_new_title() -> None:
    shown = await rendered(
        ToolCallStart(session_update="tool_call", tool_call_id="t1", title="Edit a.py", kind="edit"),
        ToolCallProgress(session_update="tool_call_update", tool_call_id="t1", title="Edit b.py", status="failed"),
    )
    assert shown[:2] == ["  ○ Edit a.py (edit) pending", "  ✗ Edit b.py (edit) failed"]


def test_errors_are_one_line() -> None:
    page = "<!DOCTYPE html>\n<html><head><title>Page not found</title></head>\n<body>...</body></html>"
    assert (
        describe_error(HttpStatusError("initialize", 404, page), "http://h/x/acp")
        == "404 Not Found from http://h/x/acp"
    )
    assert describe_error(HttpStatusError("POST", 409, "events lost\nmore"), "http://u:p@h/acp") == (
        "409 Conflict from http://h/acp: events lost"  # the first line; never the URL's password
    )
    assert describe_error(HttpStatusError("POST", 599, "x" * 500)).endswith("…")


@pytest.mark.parametrize(
    ("prompt", "status", "shown"),
    [("tick 3 10", 0, ["> tick 3 10", "tick 1", "tick 2", "tick 3"]), ("fail", 1, ["> fail"])],
)
def test_one_prompt_runs_one_turn_and_exits_with_how_it_ended(
    demo: DaphneServer, prompt: str, status: int, shown: list[str]
) -> None:
    """`-p`: a new session, one turn, its transcript, then the exit status (0 end_turn, 1 an
    error); stdin is not read."""
    result = run_piped(f"http://127.0.0.1:{demo.port}", "-p", prompt, stdin="echo never\n")
    assert result.returncode == status, result.stderr
    lines = lines_of(result.stdout)
    for line in [*shown, "Disconnected."]:
        assert line in lines, result.stdout
    assert "never" not in result.stdout
    assert result.stderr == ("" if status == 0 else "error: demo failure (-32603)\n")


def test_new_opens_another_session_and_prompts_go_to_it(demo: DaphneServer) -> None:
    result = run_piped(f"http://127.0.0.1:{demo.port}", stdin="/info\n/new\n/info\necho after\n")
    assert result.returncode == 0, result.stderr
    sessions = re.findall(r"session (sess-\S+)", result.stdout)
    # The greeting's, /info's, /new's, /info's again: two sessions, the second from /new on.
    assert len(sessions) == 4 and sessions[0] == sessions[1] != sessions[2] == sessions[3], result.stdout
    assert "after" in lines_of(result.stdout)
