"""`acp-client` on shared sessions (docs/shared-sessions.md), through pipes against live servers
(bearer tokens: an anonymous client cannot attach):

* a turn outlives its client: `acp-client -p "tick 200 50"` is killed after its first lines,
  `--list --json` shows the session with its turn running, and `--attach ID` (stdin empty, not a
  terminal) prints every line of the turn once and in order, then exits 0 when it ends;
* `--session ID -p PROMPT` runs one turn on a live session (a running one is followed first);
  an observer's prompt is refused, and says why;
* `/detach` leaves a session running and prints the command line that comes back to it;
* a permission question answered by another client goes, with a line saying so;
* a session terminated elsewhere, and a server restarted under the client, are said in one line
  with what can be done next (`/new`, `/load`), and `/new` goes on with a new session.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from acp_channels.client import HttpClient
from tests import auth_fixtures as tokens
from tests import forked
from tests.cluster import Cluster
from tests.live import ROOT, DaphneServer, rpc
from tests.token_servers import TOKEN_ENV

pytestmark = pytest.mark.timeout(90)
STEP = 30.0
TICK = re.compile(r"^tick (\d+)$")


@pytest.fixture(scope="module")
def server() -> Iterator[DaphneServer]:
    live = DaphneServer(env=TOKEN_ENV).start()
    yield live
    live.stop()
    assert live.errors() == []


def base_url(server: DaphneServer | Cluster, kind: str = "http") -> str:
    """The URL a user types (acp-client appends /acp)."""
    url = server.url.removesuffix("/acp")
    return url if kind == "http" else "ws" + url.removeprefix("http")


@dataclass
class Piped:
    """`python -m acp_channels.client ARGS` through pipes: lines typed on its stdin, its stdout and
    stderr read as they come (`expect` waits for a line; nothing is slept)."""

    process: asyncio.subprocess.Process | forked.ForkedProcess
    out: list[str] = field(default_factory=list)
    err: list[str] = field(default_factory=list)
    _read: dict[str, int] = field(default_factory=lambda: {"out": 0, "err": 0})
    _arrived: asyncio.Condition = field(default_factory=asyncio.Condition)
    _pumps: list[asyncio.Task[None]] = field(default_factory=list)

    @classmethod
    async def start(cls, *args: str, token: str | None = tokens.ALICE, stdin: bool = True) -> Piped:
        env = {name: value for name, value in os.environ.items() if name not in ("ACP_TOKEN", "NO_COLOR")}
        if token is not None:
            env["ACP_TOKEN"] = token
        process = await forked.create_subprocess_exec(
            sys.executable,
            "-m",
            "acp_channels.client",
            *args,
            cwd=ROOT,
            env=env,
            stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        piped = cls(process)
        assert process.stdout is not None and process.stderr is not None
        piped._pumps = [
            asyncio.create_task(piped._pump(process.stdout, piped.out)),
            asyncio.create_task(piped._pump(process.stderr, piped.err)),
        ]
        return piped

    async def _pump(self, stream: asyncio.StreamReader, lines: list[str]) -> None:
        while line := await stream.readline():
            async with self._arrived:
                lines.append(line.decode().rstrip("\n"))
                self._arrived.notify_all()
        async with self._arrived:
            self._arrived.notify_all()  # the end too: a waiter sees it

    async def expect(self, pattern: str, where: str = "out") -> re.Match[str]:
        """The next line of stdout (or stderr) that matches `pattern` (the lines before it are passed)."""
        lines = self.out if where == "out" else self.err
        deadline = asyncio.get_running_loop().time() + STEP
        async with self._arrived:
            while True:
                while self._read[where] < len(lines):
                    line = lines[self._read[where]]
                    self._read[where] += 1
                    if match := re.search(pattern, line):
                        return match
                ended = all(task.done() for task in self._pumps)
                assert not ended, f"the client ended without printing {pattern!r}:\n" + self.transcript()
                try:
                    await asyncio.wait_for(self._arrived.wait(), deadline - asyncio.get_running_loop().time())
                except TimeoutError:
                    raise AssertionError(f"no line {pattern!r} within {STEP:g}s:\n" + self.transcript()) from None

    async def type(self, *lines: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("".join(line + "\n" for line in lines).encode())
        await self.process.stdin.drain()

    async def finish(self) -> int:
        """End its input, wait for it to exit: the exit status."""
        if self.process.stdin is not None and not self.process.stdin.is_closing():
            self.process.stdin.close()
        async with asyncio.timeout(STEP):
            status = await self.process.wait()
            await asyncio.gather(*self._pumps)
        return status

    async def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        await self.process.wait()
        for task in self._pumps:
            task.cancel()

    def transcript(self) -> str:
        return "\n".join(["--- stdout", *self.out, "--- stderr", *self.err])


async def run_client(*args: str, token: str | None = tokens.ALICE) -> tuple[int, str, str]:
    """A run with empty stdin (not a terminal): exit status, stdout, stderr."""
    piped = await Piped.start(*args, token=token, stdin=False)
    status = await piped.finish()
    return status, "\n".join(piped.out) + "\n", "\n".join(piped.err)


def ticks(text: str) -> list[int]:
    return [int(match.group(1)) for line in text.splitlines() if (match := TICK.match(line))]


# ------------------------------------------------------------------------------ the flow


@pytest.mark.parametrize(
    ("shape", "kind", "command", "count"),
    [
        ("one-worker", "http", "tick 200 50", 200),  # the flow, with the demo agent as it is
        ("one-worker", "ws", "tick 40 150", 40),  # long enough to outlast a client's start on a busy machine
        ("three-workers", "http", "tick 40 150", 40),  # the attachment on another worker than the turn
    ],
)
async def test_a_killed_clients_turn_goes_on_and_attach_prints_all_of_it_once(
    request: pytest.FixtureRequest, shape: str, kind: str, command: str, count: int
) -> None:
    live: DaphneServer | Cluster = (
        request.getfixturevalue("server") if shape == "one-worker" else request.getfixturevalue("cluster")
    )
    url = base_url(live, kind)
    started = await Piped.start(url, "-p", command, stdin=False)
    session_id = (await started.expect(r"^connection \S+  session (\S+)$")).group(1)
    await started.expect(r"^tick 2$")  # its first lines: the turn runs
    await started.kill()

    if count == 200:  # the flow lists through acp-client; the short ones in-process (quicker)
        status, out, err = await run_client(url, "--list", "--json")
        assert (status, err) == (0, ""), err
        (listed,) = [entry for entry in json.loads(out)["sessions"] if entry["sessionId"] == session_id]
        assert listed["turnRunning"] is True
    else:
        directory = await HttpClient(url, token=tokens.ALICE).list_sessions()
        (entry,) = [entry for entry in directory.sessions if entry.session_id == session_id]
        assert entry.turn_running is True

    status, out, err = await run_client(url, "--attach", session_id)
    assert status == 0, out + err
    assert ticks(out) == list(range(1, count + 1)), out  # every line, once, in order
    lines = out.splitlines()
    assert lines[0].startswith(f"Attached to session {session_id} of ACP Channels demo agent")
    assert "A turn is running: what the session retained, then the turn to its end." in lines
    assert re.match(r"^\[end_turn\] ", lines[lines.index(f"tick {count}") + 1]), out  # followed to its end
    assert f"Session {session_id} goes on on the server: acp-client {url} --attach {session_id}" in lines
    assert err == ""


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    live = Cluster(request.getfixturevalue("redis_server"), env=TOKEN_ENV).start()
    yield live
    live.stop()
    assert live.errors() == []


# ---------------------------------------------------------------------------- a host in the test


async def receive_until(client: HttpClient, wanted: Any) -> dict[str, Any]:
    async with asyncio.timeout(STEP):
        while True:
            message = await client.receive()
            assert message is not None, "the transport closed"
            if wanted(message):
                return message


async def host_session(server: DaphneServer, text: str | None = None) -> tuple[HttpClient, str]:
    """A connection of Alice's with a session; `text`: a prompt sent on it (its turn running)."""
    host = HttpClient(server.url, token=tokens.ALICE)
    await host.send(rpc(0, "initialize", {"protocolVersion": 1}))
    await receive_until(host, lambda message: message.get("id") == 0)
    await host.send(rpc(1, "session/new", {"cwd": "/tmp", "mcpServers": []}))
    session_id = str((await receive_until(host, lambda message: message.get("id") == 1))["result"]["sessionId"])
    if text is not None:
        prompt = [{"type": "text", "text": text}]
        await host.send(rpc(2, "session/prompt", {"sessionId": session_id, "prompt": prompt}))
    return host, session_id


def is_update(message: dict[str, Any]) -> bool:
    return message.get("method") == "session/update"


async def test_session_with_p_follows_the_running_turn_then_runs_its_own(server: DaphneServer) -> None:
    host, session_id = await host_session(server, "tick 20 25")
    await receive_until(host, is_update)  # the turn runs
    status, out, err = await run_client(base_url(server), "--session", session_id, "-p", "echo from the side")
    assert (status, err) == (0, ""), out + err
    assert ticks(out) == list(range(1, 21))
    lines = out.splitlines()
    assert lines.index("tick 20") < lines.index("> echo from the side") < lines.index("from the side")
    await receive_until(host, lambda message: message.get("id") == 2)  # the host's own turn's answer
    ended = await receive_until(host, lambda message: message.get("method") == "_acp-channels/session/turn_ended")
    assert ended["params"] == {"sessionId": session_id, "stopReason": "end_turn"}  # the side's turn

    # An observer's prompt is refused, and it says why (exit 1, as for any error).
    status, out, err = await run_client(
        base_url(server), "--session", session_id, "--role", "observer", "-p", "echo never"
    )
    assert status == 1 and "never" not in out.replace("> echo never", "")
    assert err.splitlines() == [
        "error: an observer cannot send to the agent (-32011)",
        "Attached as an observer: it watches the session and cannot prompt.",
    ]
    status, _, err = await run_client(base_url(server), "--session", session_id)
    assert status == 2 and "--session goes with -p" in err
    await host.close()


@pytest.mark.parametrize("kind", ["http", "ws"])
async def test_detach_leaves_the_session_and_attach_comes_back(server: DaphneServer, kind: str) -> None:
    piped = await Piped.start(base_url(server, kind))
    session_id = (await piped.expect(r"^connection \S+  session (\S+)$")).group(1)
    await piped.type("echo first", "/detach")
    await piped.expect(r"^first$")
    await piped.expect(rf"^Detached: session {session_id} goes on on the server\.$")
    come_back = (await piped.expect(r"^To come back: (acp-client .*)$")).group(1)
    assert await piped.finish() == 0
    assert come_back == f"acp-client {base_url(server, kind)} --attach {session_id}"
    assert "Disconnected." not in piped.out

    again = await Piped.start(*come_back.split()[1:])
    await again.expect(rf"^Attached to session {session_id} ")
    await again.type("echo second")
    await again.expect(r"^first$")  # what the session retained (the line ends with the next one)
    await again.expect(r"^> echo second$")
    await again.expect(r"^second$")
    assert await again.finish() == 0, again.transcript()
    status, out, _ = await run_client(base_url(server), "--list", "--json")
    assert status == 0 and session_id in {entry["sessionId"] for entry in json.loads(out)["sessions"]}  # detached


async def test_the_attach_command_leaves_this_session_for_another(server: DaphneServer) -> None:
    """`/attach ID` inside a session: the session it was on goes on (how to come back is said),
    the other's running turn is followed to its end, and prompts go there."""
    host, other = await host_session(server, "wait_for_cancel")  # runs until the host cancels it
    piped = await Piped.start(base_url(server))
    own = (await piped.expect(r"^connection \S+  session (\S+)$")).group(1)
    await piped.type(f"/attach {other}", "echo over there")
    await piped.expect(rf"^Attached to session {other} ")
    await piped.expect(r"^A turn is running: ")
    await host.send({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": other}})
    await piped.expect(r"^\[cancelled\] ")  # followed to its end
    await piped.expect(r"^over there$")
    assert await piped.finish() == 0, piped.transcript()
    assert f"Left session {own} (it goes on): acp-client {base_url(server)} --attach {own}" in piped.out
    status, out, _ = await run_client(base_url(server), "--list", "--json")
    assert status == 0 and {own, other} <= {entry["sessionId"] for entry in json.loads(out)["sessions"]}
    await host.close()


async def test_a_permission_question_answered_elsewhere_goes(server: DaphneServer) -> None:
    host, session_id = await host_session(server, "permission")
    asked = await receive_until(host, lambda message: message.get("method") == "session/request_permission")
    piped = await Piped.start(base_url(server), "--attach", session_id)
    await piped.expect(r"^\? Permission: Demo permission request \(edit\)$")
    await piped.expect(r"^  2\) Reject  reject once$")
    selected = {"outcome": {"outcome": "selected", "optionId": "allow"}}
    await host.send({"jsonrpc": "2.0", "id": asked["id"], "result": selected})
    await piped.expect(r"^  → answered by another client: Allow$")
    await piped.expect(r"^permission: allow$")
    await piped.expect(r"^\[end_turn\] ")
    assert await piped.finish() == 0
    assert not [line for line in piped.out if line.startswith("Choose")]  # never answered here
    await host.close()


async def test_a_terminated_session_is_said_once_and_new_goes_on(server: DaphneServer) -> None:
    host, session_id = await host_session(server)
    piped = await Piped.start(base_url(server), "--attach", session_id)
    await piped.type("/info")
    await piped.expect(r"^ACP Channels demo agent .* over HTTP\+SSE at ")  # attached, reading commands
    await host.close()  # the hosting connection's own client ends it: the session is terminated
    ended = rf"^error: session {session_id} was ended on the server \(its connection was terminated\)$"
    await piped.expect(ended, "err")
    offer = await piped.expect(r"^/new starts a new session", "err")
    assert offer.string == (
        f"/new starts a new session, /load loads session {session_id} again (the agent supports session/load), "
        "/quit exits"
    )
    await piped.type("echo lost", "/new", "echo again")
    await piped.expect(r"^error: not connected: /new starts a new session", "err")
    await piped.expect(r"^Connected to ACP Channels demo agent")
    await piped.expect(r"^again$")
    assert await piped.finish() == 0, piped.transcript()
    assert [line for line in piped.err if line.startswith("error: ")] == [
        f"error: session {session_id} was ended on the server (its connection was terminated)",
        f"error: not connected: {offer.string}",
    ]
    assert not [line for line in piped.out if "reconnecting" in line or "gave up" in line], piped.transcript()


# ------------------------------------------------------------------------------ a server restart


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class FixedPortDaphne(DaphneServer):
    """A daphne on a given port: started again there, it is the same server restarted."""

    fixed_port: int = 0

    def command(self) -> tuple[list[str], Path, dict[str, str] | None]:
        argv, cwd, env = super().command()
        return [part.replace("port=0:", f"port={self.fixed_port}:") for part in argv], cwd, env


@pytest.mark.parametrize("kind", ["http", "ws"])
async def test_a_server_restart_is_said_in_one_line_and_a_new_session_offered(kind: str) -> None:
    port = free_port()
    first = FixedPortDaphne(env=TOKEN_ENV, fixed_port=port).start()
    url = f"{'http' if kind == 'http' else 'ws'}://127.0.0.1:{port}"
    piped = await Piped.start(url)
    try:
        match = await piped.expect(r"^connection (\S+)  session (\S+)$")
        connection_id, session_id = match.groups()
        await piped.type("echo before")
        await piped.expect(r"^before$")
        first.stop()
        second = FixedPortDaphne(env=TOKEN_ENV, fixed_port=port).start()
        try:
            gone = await piped.expect(r"^error: the server no longer has connection", "err")
            assert gone.string == (
                f"error: the server no longer has connection {connection_id} (it restarted, or the connection was "
                f"ended): session {session_id} is gone"
            )
            await piped.expect(rf"^/new starts a new session, /load loads session {session_id} again", "err")
            # The agent restarted too: it cannot load the session; a new one goes on.
            await piped.type(f"/load {session_id}", "/new", "echo after")
            await piped.expect(r"Unknown session", "err")
            await piped.expect(r"^after$")
            assert await piped.finish() == 0, piped.transcript()
        finally:
            second.stop()
    finally:
        first.stop()
        if piped.process.returncode is None:
            await piped.kill()
    errors = [line for line in piped.err if line.startswith("error: ")]
    assert len(errors) == 2 and errors[0] == gone.string, piped.transcript()
    assert not [line for line in piped.out if "gave up" in line], piped.transcript()


async def test_a_session_a_restart_could_not_load_is_said_and_a_new_one_offered() -> None:
    """`--restart`: the client starts a new connection on the restarted server, and the agent
    cannot load the session: one line says so, a prompt does not go to the dead id, /new goes on."""
    port = free_port()
    first = FixedPortDaphne(env=TOKEN_ENV, fixed_port=port).start()
    piped = await Piped.start(f"http://127.0.0.1:{port}", "--restart")
    try:
        session_id = (await piped.expect(r"^connection \S+  session (\S+)$")).group(1)
        await piped.type("echo before")
        await piped.expect(r"^before$")
        first.stop()
        second = FixedPortDaphne(env=TOKEN_ENV, fixed_port=port).start()
        try:
            gone = await piped.expect(rf"^error: session {session_id} is gone: ", "err")
            assert gone.string.startswith(
                f"error: session {session_id} is gone: the connection was restarted and the agent could not load it ("
            )
            await piped.expect(rf"^/new starts a new session, /load loads session {session_id} again", "err")
            await piped.type("echo into the void", "/new", "echo after")
            refused = await piped.expect(rf"^error: session {session_id} is gone: /new starts a new session", "err")
            await piped.expect(r"^after$")
            assert await piped.finish() == 0, piped.transcript()
        finally:
            second.stop()
    finally:
        first.stop()
        if piped.process.returncode is None:
            await piped.kill()
    assert [line for line in piped.err if line.startswith("error: ")] == [gone.string, refused.string]
    assert "into the void" not in [line for line in piped.out if not line.startswith(">")]
