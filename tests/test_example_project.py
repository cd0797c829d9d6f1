"""examples/echo_agent as the README's "Add it to your project" shows it. The README holds the
example's files exactly (so they cannot drift apart), the agent stays under 40 lines and answers
a prompt in-process, and the whole recipe runs as written: a project made by `django-admin
startproject mysite` in a fresh virtual environment where the README's `pip install` line put
the wheel, the README's blocks applied as their first lines say, `manage.py check` clean, the
README's serve commands (the token line, then daphne), and a prompt answered by the official
Python SDK client over HTTP+SSE and over WebSocket, while a request without the token gets 401.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from acp import connect_to_agent, text_block
from acp._transport import memory_transport_pair
from acp.core import AgentSideConnection
from acp.schema import AgentMessageChunk

from tests.dist import Installed, readme_section
from tests.live import LISTENING, ROOT, ServerProcess

EXAMPLE = ROOT / "examples" / "echo_agent"
PROJECT = "mysite"
SECTION = "Add it to your project"
#: The first line of each of the README's Python blocks: where the block goes.
PLACE = re.compile(rf"^# {PROJECT}/(\w+\.py)\b")
MAX_AGENT_LINES = 40


def code_blocks(text: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M)]


def readme_files() -> dict[str, str]:
    """{file name: block} for each Python block of the section (each names its file)."""
    files = {}
    for language, body in code_blocks(readme_section(SECTION)):
        if language == "python":
            place = PLACE.match(body)
            assert place is not None, body.splitlines()[0]
            files[place.group(1)] = body
    return files


def readme_serve_commands() -> tuple[str, str]:
    """The serve block: (the line that makes the token, the daphne command)."""
    (block,) = [body for language, body in code_blocks(readme_section(SECTION)) if "daphne " in body]
    token_line, daphne = block.split("\n", 1)
    assert token_line.startswith("export ACP_TOKEN=") and daphne.startswith("daphne ")
    return token_line, daphne


def test_readme_shows_the_example_files_exactly() -> None:
    files = readme_files()
    assert sorted(files) == sorted(path.name for path in EXAMPLE.glob("*.py"))
    for name, body in files.items():
        assert body == (EXAMPLE / name).read_text(), f"README and examples/echo_agent/{name} differ"


def test_the_example_agent_is_short() -> None:
    assert len((EXAMPLE / "agent.py").read_text().splitlines()) <= MAX_AGENT_LINES


class Recorder:
    def __init__(self) -> None:
        self.texts: list[str] = []

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        assert isinstance(update, AgentMessageChunk)
        self.texts.append(update.content.text)


def load_example_agent() -> Any:
    spec = importlib.util.spec_from_file_location("echo_agent_example", EXAMPLE / "agent.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.EchoAgent


async def test_the_example_agent_echoes_a_prompt_in_process() -> None:
    """Hosted as acp_channels hosts an SDK agent (_agents/sdk.py), on memory transports."""
    agent_end, client_end = memory_transport_pair()
    agent = AgentSideConnection(load_example_agent()(), agent_end, listening=False, use_unstable_protocol=True)
    listening = asyncio.create_task(agent.listen())
    client = Recorder()
    conn = connect_to_agent(client, client_end, use_unstable_protocol=True)
    try:
        assert (await conn.initialize(protocol_version=1)).protocol_version == 1
        session = await conn.new_session(cwd="/tmp", mcp_servers=[])
        reply = await conn.prompt(session_id=session.session_id, prompt=[text_block("hello"), text_block("there")])
        assert reply.stop_reason == "end_turn" and client.texts == ["You said: hello there"]
        await conn.cancel(session_id=session.session_id)  # a notification: nothing to stop
    finally:
        await conn.close()
        await listening
        await agent.close()


# -- the whole recipe, live -----------------------------------------------------------------------


@dataclass
class ProjectServer(ServerProcess):
    """The README's daphne command, run in the new project with the fresh environment's daphne."""

    listening: ClassVar[re.Pattern[str]] = LISTENING
    argv: list[str] = field(default_factory=list)
    cwd: Path = ROOT
    env: dict[str, str] = field(default_factory=dict)

    def command(self) -> tuple[list[str], Path, dict[str, str] | None]:
        return self.argv, self.cwd, self.env


def user_environment(installed: Installed, **extra: str) -> dict[str, str]:
    """A shell of someone using the fresh environment: its bin first on PATH, none of this test
    run's Django settings or import path."""
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "PATH": f"{installed.bin}{os.pathsep}{env.get('PATH', '')}", **extra}


def run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{argv}:\n{result.stdout}{result.stderr}"
    return result


def make_project(installed: Installed, where: Path) -> Path:
    """`django-admin startproject mysite`, then the README's blocks where their first lines say."""
    run([str(installed.bin / "django-admin"), "startproject", PROJECT], where, user_environment(installed))
    project = where / PROJECT
    for name, body in readme_files().items():
        target = project / PROJECT / name
        if body.split("\n", 1)[0].endswith(": add at the end"):
            target.write_text(target.read_text() + "\n" + body)
        else:
            target.write_text(body)
    return project


async def prompt_once(url: str, token: str) -> list[str]:
    """initialize, session/new and one prompt with the official SDK client; the reply's texts."""
    from acp.http import create_http_stream
    from acp.ws import create_websocket_stream

    headers = {"Authorization": f"Bearer {token}"}
    if url.startswith("ws"):
        transport = await create_websocket_stream(url, headers=headers)
    else:
        transport = create_http_stream(url, headers=headers)
    client = Recorder()
    conn = connect_to_agent(client, transport)
    try:
        await asyncio.wait_for(conn.initialize(protocol_version=1), 20)
        session = await asyncio.wait_for(conn.new_session(cwd="/tmp", mcp_servers=[]), 20)
        prompt = [text_block("hello from the README")]
        reply = await asyncio.wait_for(conn.prompt(session_id=session.session_id, prompt=prompt), 20)
        assert reply.stop_reason == "end_turn"
    finally:
        await asyncio.wait_for(conn.close(), 20)
    return client.texts


@pytest.mark.slow
@pytest.mark.live
@pytest.mark.timeout(900)  # with the wheel's build and install, when no other test made them first
def test_a_new_project_serves_the_example_as_the_readme_says(readme_install: Installed, tmp_path: Path) -> None:
    installed = readme_install.result
    assert installed.returncode == 0, installed.stdout + installed.stderr
    started = time.monotonic()
    project = make_project(readme_install, tmp_path)
    token_line, daphne = readme_serve_commands()
    # The token line as written, in bash with the fresh environment's python first on PATH.
    made = run(["bash", "-c", f'{token_line}\nprintf %s "$ACP_TOKEN"'], project, user_environment(readme_install))
    token = made.stdout
    assert re.fullmatch(r"[\w-]{43}", token), token
    env = user_environment(readme_install, ACP_TOKEN=token)
    checked = run([str(readme_install.python), "manage.py", "check"], project, env)
    assert "no issues" in checked.stdout, checked.stdout + checked.stderr
    # The daphne command as written, on a free port instead of 8000.
    assert "tcp:port=8000:" in daphne
    argv = shlex.split(daphne.replace("\\\n", " ").replace("tcp:port=8000:", "tcp:port=0:"))
    executable = shutil.which(argv[0], path=str(readme_install.bin))
    assert executable == str(readme_install.bin / "daphne"), executable
    server = ProjectServer(argv=[executable, *argv[1:]], cwd=project, env=env).start()
    try:
        url = f"http://127.0.0.1:{server.port}/acp"
        assert asyncio.run(prompt_once(url, token)) == ["You said: hello from the README"]
        assert asyncio.run(prompt_once(url.replace("http", "ws", 1), token)) == ["You said: hello from the README"]
        initialize = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}
        assert httpx.post(url, json=initialize, timeout=20).status_code == 401  # no token, no agent
    finally:
        server.stop()
    log = "".join(server.log)
    assert "Traceback" not in log, log
    assert log.count("connection opened principal=token:me") == 2, log
    print(f"project made, checked, served and answered in {time.monotonic() - started:.1f} s")
