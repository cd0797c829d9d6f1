"""StdioAgentChannel on its own: one agent process per connection, frames relayed byte for byte,
process hygiene (stop sequence, process groups, no zombies, nothing outliving the server),
stderr into the log, exits and crashes, backpressure and 16 MiB lines. The agent is
tests/stdio_script_agent.py (standard library only, quick to start)."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from acp_channels import _protocol as protocol
from acp_channels._agents import AgentClosed, create_agent_channel
from acp_channels._agents.stdio import (
    CONNECTION_ENV,
    LINE_HEADROOM,
    STDERR_LINE_MAX,
    StdioAgentChannel,
    setting_problems,
)
from acp_channels._host import RESUME_META_KEY, ConnectionHost, resume_capabilities
from acp_channels._identity import ANONYMOUS, AgentContext
from acp_channels._protocol import Batch, Frame, Malformed, Single
from tests.agent_processes import alive, reaped, supported, wait_gone
from tests.live import ROOT, rpc

SCRIPT = Path(__file__).with_name("stdio_script_agent.py")
COMMAND = [sys.executable, str(SCRIPT)]
GRACE = 0.3
MiB = 1024 * 1024

linux_only = pytest.mark.skipif(not supported(), reason="process checks read /proc (Linux)")

Start = Callable[..., StdioAgentChannel]


@pytest.fixture
async def start() -> AsyncIterator[Start]:
    """Starts script agents; every one is closed and reaped at the end of the test."""
    channels: list[StdioAgentChannel] = []

    def start(*flags: str, **options: Any) -> StdioAgentChannel:
        options.setdefault("shutdown_grace", GRACE)
        options.setdefault("connection_id", f"test-{uuid.uuid4().hex[:8]}")
        channel = StdioAgentChannel([*COMMAND, *flags], **options)
        channels.append(channel)
        return channel

    yield start
    for channel in channels:
        await channel.close()
    for channel in channels:
        await asyncio.wait_for(channel.wait_closed(), 10)


async def send(channel: StdioAgentChannel, message: Any) -> None:
    text = message if isinstance(message, str) else json.dumps(message)
    await channel.send(protocol.parse_frame(text))


async def until_reply(channel: StdioAgentChannel, request_id: Any, timeout: float = 20) -> tuple[Frame, list[Frame]]:
    """Receive until the frame answering `request_id`; also the frames before it."""
    before: list[Frame] = []
    async with asyncio.timeout(timeout):
        while (frame := await channel.receive()) is not None:
            if protocol.find_reply(frame, request_id) is not None:
                return frame, before
            before.append(frame)
    raise AssertionError(f"the agent ended before answering {request_id!r}; got {before}")


async def call(channel: StdioAgentChannel, message: dict[str, Any]) -> dict[str, Any]:
    await send(channel, message)
    frame, _ = await until_reply(channel, message["id"])
    reply = protocol.find_reply(frame, message["id"])
    assert reply is not None
    return reply


async def initialize(channel: StdioAgentChannel) -> dict[str, Any]:
    reply = await call(channel, rpc(0, "initialize", {"protocolVersion": 1}))
    meta: dict[str, Any] = reply["result"]["_meta"]
    return meta


def prompt(request_id: Any, text: str, session_id: str = "s1") -> dict[str, Any]:
    return rpc(request_id, "session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]})


def chunk_text(frame: Frame) -> str:
    assert isinstance(frame, Single) and frame.message["method"] == "session/update"
    text: str = frame.message["params"]["update"]["content"]["text"]
    return text


def messages(caplog: pytest.LogCaptureFixture, level: int = logging.DEBUG) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "acp_channels.agent" and r.levelno >= level]


# -- relaying frames ---------------------------------------------------------------------------


async def test_client_frames_reach_the_agent_byte_for_byte(start: Start) -> None:
    channel = start()
    odd = '{"id" : 7,"jsonrpc":"2.0" ,"method":"test/raw","params":{"b":1.50,"a":"\\u00e9","c":1e3}}'
    await send(channel, odd)
    frame, _ = await until_reply(channel, 7)
    assert isinstance(frame, Single) and frame.message["result"]["line"] == odd


async def test_agent_lines_reach_the_client_byte_for_byte(start: Start) -> None:
    channel = start()
    line = '{"jsonrpc":"2.0",  "id": "v",\t"result" : {"z":1.0e3,"a":[ ],"u":"\\u00e9"}}'
    await send(channel, rpc(1, "test/verbatim", {"text": line}))
    frame, _ = await until_reply(channel, "v")
    assert isinstance(frame, Single) and frame.raw == line and protocol.serialize_frame(frame) == line


async def test_batches_and_unknown_methods_pass_through(start: Start) -> None:
    channel = start()
    batch = (
        '[{"jsonrpc":"2.0","id":1,"method":"a"}, {"jsonrpc":"2.0","method":"n"},'
        '{"jsonrpc":"2.0","id":"2","method":"b"}]'
    )
    await send(channel, batch)
    frame, _ = await until_reply(channel, 1)
    assert isinstance(frame, Batch)  # one line in, one array line out, exactly as the agent wrote it
    assert frame.raw is not None and frame.raw.startswith("[ {") and " , " in frame.raw
    assert [entry["id"] for entry in protocol.frame_messages(frame)] == [1, "2"]

    reply = await call(channel, rpc(3, "x/unknown", {"k": 1}))
    assert reply == {
        "jsonrpc": "2.0",
        "id": 3,
        "error": {"code": -32601, "message": "agent: method not found: x/unknown"},
    }


async def test_line_breaks_in_client_frames(start: Start) -> None:
    channel = start()
    # Pretty-printed JSON: the line breaks are whitespace, sent as spaces on one line.
    pretty = json.dumps(rpc(1, "test/raw", {"text": "a\nb"}), indent=2)
    await send(channel, pretty)
    frame, _ = await until_reply(channel, 1)
    assert isinstance(frame, Single)
    line = frame.message["result"]["line"]
    assert "\n" not in line and json.loads(line) == json.loads(pretty)

    # Not JSON and several lines: it cannot be one line, so it is answered as the agent side would.
    broken = '{"jsonrpc":"2.0",\n "id": 2, oops'
    await send(channel, broken)
    frame = await asyncio.wait_for(channel.receive(), 10)
    assert isinstance(frame, Single) and frame.message == protocol.parse_error(broken)

    # Not JSON on one line: the agent gets it and answers itself.
    await send(channel, "{oops")
    frame = await asyncio.wait_for(channel.receive(), 10)
    assert isinstance(frame, Single) and frame.message["error"]["message"] == "agent: parse error"


async def test_non_json_agent_output_is_relayed_as_malformed(start: Start) -> None:
    channel = start()
    await send(channel, rpc(1, "test/verbatim", {"text": "Listening... {not json"}))
    frame = await asyncio.wait_for(channel.receive(), 10)
    assert isinstance(frame, Malformed) and frame.raw == "Listening... {not json"


# -- the process: environment, stop sequence, groups --------------------------------------------


async def test_environment_is_an_allowlist_plus_extras(
    start: Start, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SECRET_TOKEN", "must-not-leak")
    monkeypatch.setenv("LANG", "C.UTF-8")
    spec = {"command": COMMAND, "cwd": str(tmp_path), "env_passthrough": ["PATH"], "env": {"EXTRA": "1"}}
    channel = StdioAgentChannel.from_setting(
        spec, AgentContext(ANONYMOUS, "conn-env", "http"), shutdown_grace=GRACE, max_line_bytes=MiB
    )
    try:
        result = (await call(channel, rpc(1, "test/env")))["result"]
    finally:
        await channel.close()
        await channel.wait_closed()
    env = result["env"]
    assert env["EXTRA"] == "1" and env[CONNECTION_ENV] == "conn-env" and "PATH" in env
    assert "SECRET_TOKEN" not in env and "LANG" not in env and "HOME" not in env
    assert result["cwd"] == str(tmp_path)

    default = StdioAgentChannel.from_setting(
        {"command": COMMAND}, AgentContext(ANONYMOUS, "conn-2", "http"), shutdown_grace=GRACE, max_line_bytes=MiB
    )
    try:
        env = (await call(default, rpc(1, "test/env")))["result"]["env"]
    finally:
        await default.close()
        await default.wait_closed()
    assert env["LANG"] == "C.UTF-8" and "SECRET_TOKEN" not in env


@linux_only
async def test_close_ends_a_cooperative_agent_at_once(start: Start, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    channel = start("--mark", str(marks))
    pid = (await initialize(channel))["pid"]
    await channel.close()
    assert await channel.receive() is None
    with pytest.raises(AgentClosed):
        await send(channel, rpc(1, "test/raw"))
    assert await channel.wait_closed() == 0  # stdin closed, it exited: no signal needed
    assert marks.read_text() == "eof\n"
    assert reaped(pid)  # reaped: no zombie


@linux_only
async def test_close_sends_sigterm_after_the_grace(
    start: Start, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    marks = tmp_path / "marks"
    channel = start("--ignore-eof", "--mark", str(marks))
    pid = (await initialize(channel))["pid"]
    with caplog.at_level(logging.INFO, logger="acp_channels.agent"):
        await channel.close()
        assert await channel.wait_closed() == -15
    assert marks.read_text() == "eof\nterm\n"
    assert any("still running 0.3 s after stdin closed: SIGTERM" in m for m in messages(caplog))
    assert any("stopped: signal SIGTERM" in m for m in messages(caplog))
    assert reaped(pid)


@linux_only
async def test_close_kills_an_agent_that_ignores_sigterm(start: Start, caplog: pytest.LogCaptureFixture) -> None:
    channel = start("--ignore-eof", "--ignore-term")
    pid = (await initialize(channel))["pid"]
    began = time.monotonic()
    with caplog.at_level(logging.INFO, logger="acp_channels.agent"):
        await channel.close()
        assert await channel.wait_closed() == -9
    assert 2 * GRACE <= time.monotonic() - began < 2 * GRACE + 5
    assert any("ignored SIGTERM for 0.3 s: SIGKILL" in m for m in messages(caplog, logging.WARNING))
    assert reaped(pid)


@linux_only
async def test_the_whole_process_group_goes(start: Start) -> None:
    channel = start("--child")
    meta = await initialize(channel)
    assert alive(meta["child"])
    await channel.close()
    await channel.wait_closed()
    assert wait_gone([meta["pid"], meta["child"]], timeout=5) == []


@linux_only
async def test_a_crash_ends_the_connection_even_if_a_child_holds_stdout(start: Start) -> None:
    channel = start("--child")
    meta = await initialize(channel)
    await send(channel, prompt(1, "crash 2"))
    async with asyncio.timeout(10):
        frame = await channel.receive()
        assert (
            isinstance(frame, Single) and frame.message["error"]["message"] == "agent process exited with exit status 2"
        )
        assert await channel.receive() is None
    assert wait_gone([meta["child"]], timeout=5) == []


async def test_a_program_that_cannot_start(caplog: pytest.LogCaptureFixture) -> None:
    channel = StdioAgentChannel(["/nonexistent/acp-agent"], connection_id="conn-missing")
    with pytest.raises(AgentClosed):
        await send(channel, rpc(0, "initialize"))
    assert await channel.receive() is None
    assert await channel.wait_closed() is None
    assert any("conn-missing could not start ['/nonexistent/acp-agent']" in m for m in messages(caplog, logging.ERROR))


# -- exits and crashes -------------------------------------------------------------------------


@linux_only
async def test_crash_mid_prompt_fails_pending_requests(start: Start, caplog: pytest.LogCaptureFixture) -> None:
    channel = start(connection_id="conn-crash")
    pid = (await initialize(channel))["pid"]
    await send(channel, prompt(5, "hang"))
    await send(channel, prompt("x", "hang"))
    await send(channel, prompt(6, "echo before the crash"))
    with caplog.at_level(logging.INFO, logger="acp_channels.agent"):
        await send(channel, prompt(7, "crash 3"))
        frames = []
        async with asyncio.timeout(10):
            while (frame := await channel.receive()) is not None:
                frames.append(frame)
    # Everything it wrote first, then one error per unanswered request (ids keep their type).
    assert chunk_text(frames[0]) == "before the crash"
    assert isinstance(frames[1], Single) and frames[1].message["id"] == 6
    error = {"code": -32603, "message": "agent process exited with exit status 3"}
    assert [f.message for f in frames[2:] if isinstance(f, Single)] == [
        {"jsonrpc": "2.0", "id": request_id, "error": error} for request_id in (5, "x", 7)
    ]
    assert len(frames) == 5
    assert await channel.receive() is None
    with pytest.raises(AgentClosed):
        await send(channel, prompt(8, "echo too late"))
    assert channel.returncode == 3
    exits = [m for m in messages(caplog, logging.WARNING) if "exited with" in m]
    assert exits == [
        f"agent for connection conn-crash (pid {pid}) exited with exit status 3; "
        "3 pending request(s) answered with an error"
    ]
    assert reaped(pid)


async def test_a_batch_request_pending_at_a_crash_gets_its_error(start: Start) -> None:
    channel = start()
    await send(channel, json.dumps([rpc(1, "test/ignore"), rpc("2", "test/ignore")]))
    await send(channel, prompt(3, "crash 1"))
    async with asyncio.timeout(10):
        ids = []
        while (frame := await channel.receive()) is not None:
            assert isinstance(frame, Single) and frame.message["error"]["code"] == -32603
            ids.append(frame.message["id"])
    assert ids == [1, "2", 3]


@pytest.mark.parametrize("reads", [True, False], ids=["reads-first", "exits-at-once"])
async def test_an_agent_that_exits_before_initialize_answers_with_an_error(reads: bool) -> None:
    script = f"import sys\n{'sys.stdin.readline()' if reads else ''}\nsys.stderr.write('no API key\\n')\nsys.exit(4)"
    channel = StdioAgentChannel([sys.executable, "-c", script], connection_id="conn-early", shutdown_grace=GRACE)
    host = ConnectionHost("conn-early", channel, "http", max_buffered_bytes=MiB, on_end=lambda host: None)
    reply = await asyncio.wait_for(host.initialize(Single(rpc(0, "initialize", {})), 0), 10)
    assert not reply.accepted  # the view answers 200 with this body and no connection id
    error = {"code": -32603, "message": "agent process exited with exit status 4"}
    assert json.loads(reply.body) == {"jsonrpc": "2.0", "id": 0, "error": error}
    await host.terminate()
    assert await channel.wait_closed() == 4


async def test_the_initialize_reply_of_a_relayed_agent_advertises_resumption(start: Start) -> None:
    """A stdio agent's frames are relayed as the text it wrote; the initialize reply is the
    exception: the server adds how streams resume to its `_meta`, so it is written again."""
    channel = start()
    host = ConnectionHost("conn-meta", channel, "http", max_buffered_bytes=MiB, on_end=lambda host: None)
    reply = await asyncio.wait_for(host.initialize(Single(rpc(0, "initialize", {"protocolVersion": 1})), 0), 10)
    assert reply.accepted
    assert json.loads(reply.body)["result"]["_meta"][RESUME_META_KEY] == resume_capabilities()
    await host.terminate()


# -- stderr ------------------------------------------------------------------------------------


async def test_stderr_goes_to_the_log_with_the_connection_id(start: Start, caplog: pytest.LogCaptureFixture) -> None:
    channel = start(connection_id="conn-log")
    with caplog.at_level(logging.INFO, logger="acp_channels.agent"):
        await call(channel, prompt(1, "stderr 3"))
        await call(channel, prompt(2, f"stderr-line {STDERR_LINE_MAX * 25}"))
        await channel.close()
        await channel.wait_closed()
    records = [r for r in caplog.records if r.name == "acp_channels.agent" and "stderr line" in r.getMessage()]
    assert [r.getMessage().rpartition(": ")[2] for r in records] == ["stderr line 0", "stderr line 1", "stderr line 2"]
    assert all(r.getMessage().startswith("agent conn-log (pid ") and r.acp_connection_id == "conn-log" for r in records)  # type: ignore[attr-defined]
    long = [m for m in messages(caplog) if "yyyy" in m]
    assert len(long) == 1 and long[0].endswith(f"{'y' * 10} [... {STDERR_LINE_MAX * 24} more bytes]")


async def test_a_stderr_flood_never_blocks_the_agent(start: Start, caplog: pytest.LogCaptureFixture) -> None:
    channel = start("--stderr-at-start", str(30 * MiB))  # 300,000 lines before it reads anything
    with caplog.at_level(logging.INFO, logger="acp_channels.agent"):
        began = time.monotonic()
        await initialize(channel)
        assert time.monotonic() - began < 15
        await channel.close()
        await channel.wait_closed()
    logged = messages(caplog)
    assert len(logged) < 10_000  # rate-limited ...
    assert any("stderr lines not logged (more than 200 a second)" in m for m in logged)  # ... and said so


# -- size and backpressure ---------------------------------------------------------------------


async def test_lines_up_to_the_body_limit_both_ways(start: Start) -> None:
    channel = start()
    message = rpc(1, "test/size", {"blob": ""})
    padding = 16 * MiB - len(json.dumps(message))
    text = json.dumps(rpc(1, "test/size", {"blob": "z" * padding}))
    assert len(text) == 16 * MiB
    reply = await call(channel, json.loads(text))
    assert reply["result"] == {"bytes": 16 * MiB}

    await send(channel, prompt(2, f"big {16 * MiB}"))
    _, before = await until_reply(channel, 2, timeout=60)
    assert [len(chunk_text(f)) for f in before] == [16 * MiB]


async def test_a_line_over_the_limit_is_dropped(start: Start, caplog: pytest.LogCaptureFixture) -> None:
    channel = start(max_line_bytes=MiB)
    with caplog.at_level(logging.ERROR, logger="acp_channels.agent"):
        await send(channel, prompt(1, f"big {3 * MiB}"))
        frame, before = await until_reply(channel, 1)
    assert before == [] and isinstance(frame, Single) and frame.message["result"] == {"stopReason": "end_turn"}
    assert any(f"over the {MiB} byte limit: dropped" in m for m in messages(caplog, logging.ERROR))
    reply = await call(channel, prompt(2, "echo still fine"))
    assert reply["result"] == {"stopReason": "end_turn"}


def _written(caplog: pytest.LogCaptureFixture) -> int:
    """The agent's last `wrote K` stderr line: how many chunks it managed to write."""
    counts = [int(m.rpartition("wrote ")[2]) for m in messages(caplog) if ": wrote " in m]
    return max(counts, default=0)


async def _until_stalled(caplog: pytest.LogCaptureFixture, quiet: float = 0.5, timeout: float = 20) -> int:
    """Wait until the agent stops making progress (a bounded poll: a blocked write is no event)."""
    last, since = -1, time.monotonic()
    deadline = since + timeout
    while time.monotonic() < deadline:
        now = _written(caplog)
        if now != last:
            last, since = now, time.monotonic()
        elif now and time.monotonic() - since >= quiet:
            return now
        await asyncio.sleep(0.05)
    raise AssertionError("the agent never stalled")


async def test_an_unread_agent_blocks_on_its_own_output(start: Start, caplog: pytest.LogCaptureFixture) -> None:
    count, size = 400, 64 * 1024  # 26 MB of output
    channel = start()
    with caplog.at_level(logging.INFO, logger="acp_channels.agent"):
        await send(channel, prompt(1, f"burst {count} {size}"))
        written = await _until_stalled(caplog)
        assert written < 40  # nothing reads ahead: a few chunks in the pipe and the reader's buffer
        _, chunks = await until_reply(channel, 1)
    assert [int(chunk_text(f).partition(":")[0]) for f in chunks] == list(range(count))


async def test_a_slow_reader_stops_the_router_and_then_the_agent(
    start: Start, caplog: pytest.LogCaptureFixture, settings: Any
) -> None:
    # Nobody reads until the end: with DETACHED_SECONDS the oldest output would go instead.
    settings.ACP_CHANNELS = {**getattr(settings, "ACP_CHANNELS", {}), "DETACHED_SECONDS": 0}
    count, size = 300, 64 * 1024
    channel = start()
    host = ConnectionHost("conn-bp", channel, "http", max_buffered_bytes=2 * MiB, on_end=lambda host: None)
    host.start()
    with caplog.at_level(logging.INFO, logger="acp_channels.agent"):
        await host.submit(protocol.plan_inbound(Single(prompt(1, f"burst {count} {size}")), None))
        written = await _until_stalled(caplog)
        assert written < 80  # the host holds about 2 MiB, the channel a little more
        lease = host.lease("s1")
        received: list[str] = []
        async with asyncio.timeout(30):
            while len(received) < count + 1:
                received += await lease.take(5) or []
    texts = [json.loads(item)["params"]["update"]["content"]["text"] for item in received[:-1]]
    assert [int(text.partition(":")[0]) for text in texts] == list(range(count))
    assert json.loads(received[-1]) == {"jsonrpc": "2.0", "id": 1, "result": {"stopReason": "end_turn"}}
    await host.terminate()


async def test_a_line_over_the_hosts_budget_is_refused_with_a_notice(start: Start) -> None:
    """Counted from the hand-over: a stdio agent's line over the whole budget never enters it."""
    channel = start()
    host = ConnectionHost(
        "conn-big", channel, "http", max_buffered_bytes=1 * MiB, max_message_bytes=1 * MiB, on_end=lambda host: None
    )
    host.start()
    try:
        await host.submit(protocol.plan_inbound(Single(prompt(1, f"big {2 * MiB}")), None))
        lease = host.lease("s1")
        received: list[Any] = []
        async with asyncio.timeout(20):
            while len(received) < 2:
                assert host.buffered_bytes < MiB
                received += [json.loads(item) for item in await lease.take(5) or []]
        notice, reply = received
        assert notice["method"] == protocol.MESSAGE_TOO_LARGE_METHOD
        assert notice["params"]["method"] == "session/update" and notice["params"]["sessionId"] == "s1"
        assert notice["params"]["limit"] == MiB and notice["params"]["size"] > 2 * MiB
        assert reply == {"jsonrpc": "2.0", "id": 1, "result": {"stopReason": "end_turn"}}
    finally:
        await host.terminate()


# -- the setting, the checks, the factory ------------------------------------------------------


def test_setting_problems(tmp_path: Path) -> None:
    assert setting_problems({"command": COMMAND}) == []
    assert setting_problems({"command": ["python3"], "cwd": str(ROOT), "env_passthrough": ["PATH"], "env": {}}) == []
    program = tmp_path / "bin" / "agent"
    program.parent.mkdir()
    program.write_text("#!/bin/sh\n")
    not_executable = "the program 'bin/agent' was not found as a file (or is not executable)"
    assert setting_problems({"command": ["bin/agent"], "cwd": str(tmp_path)}) == [not_executable]
    program.chmod(0o755)
    assert setting_problems({"command": ["bin/agent"], "cwd": str(tmp_path)}) == []  # relative to cwd
    assert setting_problems({"command": [str(program)]}) == []
    bad_command = "'command' must be a non-empty list of strings (the program and its arguments)"
    for command in (None, [], [""], "python3", ["python3", 1]):
        assert setting_problems({"command": command}) == [bad_command]
    assert setting_problems({"command": ["no-such-acp-agent-xyz"]}) == [
        "the program 'no-such-acp-agent-xyz' was not found on the agent's PATH (or is not executable)"
    ]
    assert setting_problems(
        {"command": ["python3"], "cwd": "/no/such/dir", "env": {"A": 1}, "env_passthrough": "PATH"}
    ) == [
        "'cwd' must be None or an existing directory, not '/no/such/dir'",
        "'env_passthrough' must be a list of environment variable names",
        "'env' must be a dict of strings to strings",
    ]
    assert setting_problems({"command": ["python3"], "args": []}) == [
        "unknown key 'args' (known: command, cwd, env_passthrough, env, configure)"
    ]


def test_system_checks_for_the_command_form(settings: Any) -> None:
    from acp_channels._checks import check_settings

    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "AGENT": {"command": COMMAND}}
    assert check_settings() == []
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "AGENT": {"command": ["no-such-acp-agent-xyz"], "cwd": "/nope"}}
    messages = check_settings()
    assert [m.id for m in messages] == ["acp_channels.E001"]
    assert (
        messages[0].msg
        == "ACP_CHANNELS['AGENT'] (a stdio agent): 'cwd' must be None or an existing directory, not '/nope'."
    )
    assert '"command"' in (messages[0].hint or "")


@pytest.mark.parametrize(("grace", "ok"), [(0, True), (0.5, True), (3, True), (-1, False), ("2", False), (None, False)])
def test_system_check_for_the_shutdown_grace(settings: Any, grace: Any, ok: bool) -> None:
    from acp_channels._checks import check_settings

    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "AGENT_SHUTDOWN_GRACE": grace}
    messages = check_settings()
    if ok:
        assert messages == []
    else:
        assert [m.id for m in messages] == ["acp_channels.E013"]
        assert messages[0].msg == f"ACP_CHANNELS['AGENT_SHUTDOWN_GRACE'] must be a non-negative number, not {grace!r}."


async def test_the_factory_starts_a_process_for_the_command_form(settings: Any) -> None:
    settings.ACP_CHANNELS = {
        **settings.ACP_CHANNELS,
        "AGENT": {"command": COMMAND},
        "AGENT_SHUTDOWN_GRACE": 0.25,
        "MAX_BODY_BYTES": MiB,
    }
    channel = create_agent_channel(AgentContext(ANONYMOUS, "conn-factory", "http"))
    assert isinstance(channel, StdioAgentChannel)
    try:
        assert (channel._grace, channel._max_line) == (0.25, MiB + LINE_HEADROOM)
        env = (await call(channel, rpc(1, "test/env")))["result"]["env"]
        assert env[CONNECTION_ENV] == "conn-factory"
    finally:
        await channel.close()
        await channel.wait_closed()


# -- nothing outlives the server ---------------------------------------------------------------

_ORPHANING_SERVER = textwrap.dedent(
    """
    import asyncio, json, os, signal, sys
    from acp_channels._agents.stdio import StdioAgentChannel
    from acp_channels._protocol import parse_frame

    async def main():
        channel = StdioAgentChannel(json.loads(sys.argv[1]), connection_id="conn-orphan", shutdown_grace=0.3)
        await channel.send(parse_frame('{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}'))
        reply = await channel.receive()
        print(reply.message["result"]["_meta"]["pid"], flush=True)
        if sys.argv[2] == "killed":
            os.kill(os.getpid(), signal.SIGKILL)  # no cleanup at all: the kernel's death signal

    asyncio.run(main())  # returns with the agent running: the atexit hook stops it
    """
)


@linux_only
@pytest.mark.parametrize("how", ["exits", "killed"])
def test_no_agent_outlives_its_server(tmp_path: Path, how: str) -> None:
    marks = tmp_path / "marks"
    command = [*COMMAND, "--ignore-eof", "--mark", str(marks)]
    result = subprocess.run(
        [sys.executable, "-c", _ORPHANING_SERVER, json.dumps(command), how],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )
    pid = int(result.stdout.split()[0])
    assert wait_gone([pid], timeout=5) == [], result.stderr
    if how == "exits":  # the stop sequence: stdin closed, then SIGTERM
        assert marks.read_text() == "eof\nterm\n"
    else:
        # It ignores the end of its input (which it may have seen as the server's pipes closed),
        # and saw no SIGTERM: the kernel's SIGKILL ended it.
        assert "term" not in (marks.read_text() if marks.exists() else "")
