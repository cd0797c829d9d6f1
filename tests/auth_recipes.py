"""The recipes of docs/authentication.md as files and commands, one project that holds them all,
and what a user of each does with it (tests/test_auth_recipes.py runs them).

A recipe is the text between `<!-- recipe NAME: run as written by tests/test_auth_recipes.py -->`
and `<!-- end of recipe NAME -->` in the doc: markers that survive editing the prose and the
headings around them. In it, each Python or HTML block names its file on its first line
(`# mysite/settings.py: add at the end`, `# mysite/urls.py`, `{# templates/agent.html: ... #}`,
paths from the directory of manage.py), and each sh block holds commands: `python manage.py ...`
lines, run as written with this checkout's python, and `pip install` lines, whose extra must be
what this environment has installed (nothing is installed: the test reuses the environment).

One project made by `django-admin startproject mysite` holds every recipe: the README's
agent.py, urls.py and asgi.py, and per recipe a settings module of its own
(`mysite/settings_<recipe>.py`: startproject's settings.py, then the recipe's block, then two
lines that give the recipe a database of its own and, when it has a urls.py block, its URLs as
`mysite/urls_<recipe>.py`). DJANGO_SETTINGS_MODULE chooses the recipe, for manage.py as for
daphne (startproject's manage.py and the README's asgi.py only set a default). Files two recipes
both write (the login page) must be the same.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import httpx
from websockets.asyncio.client import connect
from websockets.typing import Origin, Subprotocol

from tests.live import JSON, ROOT, open_sse, post, rpc
from tests.test_example_project import PROJECT, code_blocks, readme_files

DOC = ROOT / "docs" / "authentication.md"
RECIPES = ("logged-in-users", "per-user-tokens", "team-token", "oauth")
BEGIN = "<!-- recipe {name}: run as written by tests/test_auth_recipes.py -->"
END = "<!-- end of recipe {name} -->"
#: The first line of a block that is a file: `# mysite/x.py[: ...]`, `{# templates/x.html[: ...] #}`.
PYTHON_FILE = re.compile(rf"^# ({PROJECT}/\w+\.py)(: add at the end)?\b")
HTML_FILE = re.compile(r"^\{# ([\w/.-]+\.html)\b[^#]*#\}")
#: This checkout's environment: its python, django-admin and daphne (no environment of its own).
BIN = Path(sys.executable).parent
PROMPT = "hello from the README"  # as tests.test_example_project.prompt_once sends it
ANSWER = [f"You said: {PROMPT}"]


@dataclass
class Recipe:
    name: str
    #: path from the project directory -> the block, for whole files
    files: dict[str, str] = field(default_factory=dict)
    #: the block added at the end of settings.py
    settings: str = ""
    #: `python manage.py ...` lines
    commands: list[str] = field(default_factory=list)
    #: `pip install ...` lines
    installs: list[str] = field(default_factory=list)

    @property
    def module(self) -> str:
        return self.name.replace("-", "_")

    @property
    def settings_module(self) -> str:
        return f"{PROJECT}.settings_{self.module}"


def recipe(name: str) -> Recipe:
    text = DOC.read_text()
    begin, end = BEGIN.format(name=name), END.format(name=name)
    assert text.count(begin) == 1 and text.count(end) == 1, f"docs/authentication.md: the markers of {name}"
    found = Recipe(name)
    for language, body in code_blocks(text.split(begin, 1)[1].split(end, 1)[0]):
        first = body.split("\n", 1)[0]
        if language == "python":
            place = PYTHON_FILE.match(first)
            assert place is not None, f"{name}: a Python block that names no file: {first}"
            if place.group(2):
                assert place.group(1) == f"{PROJECT}/settings.py" and not found.settings, first
                found.settings = body
            else:
                found.files[place.group(1)] = body
        elif language == "html":
            place = HTML_FILE.match(first)
            assert place is not None, f"{name}: an HTML block that names no file: {first}"
            found.files[place.group(1)] = body
        elif language == "sh":
            for line in body.strip().splitlines():
                command = line.split("  #", 1)[0].strip()
                if command.startswith("pip install "):
                    found.installs.append(command)
                else:
                    assert command.startswith("python manage.py "), f"{name}: a command the test cannot run: {line}"
                    found.commands.append(command)
        else:
            raise AssertionError(f"{name}: a {language or 'plain'} block inside the recipe's markers")
    assert found.settings, f"{name}: no settings block"
    return found


def installed_extra(line: str) -> list[str]:
    """The distributions a `pip install 'acp-channels[extra]'` line brings, each installed here."""
    (requirement,) = [word for word in shlex.split(line)[2:] if not word.startswith("-")]
    match = re.fullmatch(r"acp-channels\[(\w+)\]", requirement)
    assert match is not None, line
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    requirements = pyproject["project"]["optional-dependencies"][match[1]]
    names = [re.split(r"[<>=!~\[ ;]", entry, maxsplit=1)[0] for entry in requirements]
    from importlib.metadata import version

    for name in names:
        version(name)  # PackageNotFoundError: the extra is not installed here
    return names


# -- the project ---------------------------------------------------------------------------------


def user_environment(**extra: str) -> dict[str, str]:
    """A shell of someone using this environment: its bin first on PATH (`python`, `daphne`),
    none of this test run's Django settings or import path."""
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", "PYTHONUNBUFFERED": "1", **extra}


def run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{argv}:\n{result.stdout}{result.stderr}"
    return result


#: Every logger at DEBUG into stderr, one line per record, named: what the leak tests read.
DEBUG_LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"named": {"format": "%(levelname)s %(name)s: %(message)s"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "named", "level": "DEBUG"}},
    "root": {"handlers": ["stderr"], "level": "DEBUG"},
    # Those Django's own configuration gives a level or handlers of their own.
    "loggers": {name: {"handlers": [], "level": "DEBUG", "propagate": True} for name in ("django", "django.server")},
}


def make_project(where: Path) -> Path:
    """`django-admin startproject mysite`, the README's files, and every recipe's."""
    run([str(BIN / "django-admin"), "startproject", PROJECT], where, user_environment())
    project = where / PROJECT
    startproject_settings = (project / PROJECT / "settings.py").read_text()
    for name, body in readme_files().items():
        if name != "settings.py":  # each recipe's settings instead of the README's
            (project / PROJECT / name).write_text(body)
    written: dict[str, str] = {}
    for name in RECIPES:
        found = recipe(name)
        own = [f"DATABASES['default']['NAME'] = BASE_DIR / 'db-{name}.sqlite3'"]
        for path, body in found.files.items():
            if path == f"{PROJECT}/urls.py":
                path = f"{PROJECT}/urls_{found.module}.py"
                own.append(f"ROOT_URLCONF = '{PROJECT}.urls_{found.module}'")
            assert written.setdefault(path, body) == body, f"{path}: two recipes write it differently"
            target = project / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(body)
        harness = "\n# tests/test_auth_recipes.py: one project holds every recipe\n" + "\n".join(own) + "\n"
        settings = startproject_settings + "\n" + found.settings + harness
        (project / PROJECT / f"settings_{found.module}.py").write_text(settings)
    return project


def write_served_settings(project: Path, found: Recipe, **extra: Any) -> str:
    """A settings module over the recipe's that daphne serves: every logger at DEBUG, the
    metrics endpoint, a quick credential sweep, and `extra` ACP_CHANNELS keys. Its name."""
    values = {"METRICS": True, "REVALIDATE_SECONDS": 0.5, **extra}
    module = f"served_{found.module}"
    (project / PROJECT / f"{module}.py").write_text(
        f"from {found.settings_module} import *  # noqa: F403\n\n"
        f"LOGGING = {DEBUG_LOGGING!r}\n"
        f"ACP_CHANNELS = {{**ACP_CHANNELS, **{values!r}}}  # noqa: F405\n"
    )
    return f"{PROJECT}.{module}"


def write_agent_command(directory: Path, project: Path, name: str) -> None:
    """The team recipe's `my-coding-agent`: the README's EchoAgent over stdio, with this
    environment's python. It writes its environment to stderr first (the server logs an agent's
    stderr): the leak test reads what the agent was given."""
    directory.mkdir(parents=True, exist_ok=True)
    command = directory / name
    command.write_text(
        f"#!{sys.executable}\n"
        "import asyncio, os, sys\n"
        "for key, value in sorted(os.environ.items()):\n"
        "    print(f'environment {key}={value}', file=sys.stderr)\n"
        f"sys.path.insert(0, {str(project)!r})\n"
        "from acp import run_agent\n"
        f"from {PROJECT}.agent import EchoAgent\n"
        "asyncio.run(run_agent(EchoAgent()))\n"
    )
    command.chmod(0o755)


# -- what a user does ----------------------------------------------------------------------------


async def http_session(client: httpx.AsyncClient, url: str, **headers: str) -> list[str]:
    """initialize, session/new and a prompt over HTTP+SSE, as a page's `fetch` does it (the
    client's cookies and `headers` on every request), then DELETE: the texts the prompt streamed."""
    opened = await client.post(url, headers={**JSON, **headers}, json=rpc(0, "initialize", {"protocolVersion": 1}))
    assert opened.status_code == 200, opened.text
    connection_id = opened.headers["acp-connection-id"]
    texts: list[str] = []
    async with open_sse(client, url, connection_id, **headers) as connection_stream:
        new = rpc(1, "session/new", {"cwd": "/tmp", "mcpServers": []})
        created = await post(client, url, new, connection_id, **headers)
        assert created.status_code == 202, created.text
        while (answer := await connection_stream.next()).get("id") != 1:
            pass
        session_id = answer["result"]["sessionId"]
        async with open_sse(client, url, connection_id, session_id, **headers) as session_stream:
            prompt = {"sessionId": session_id, "prompt": [{"type": "text", "text": PROMPT}]}
            prompted = await post(client, url, rpc(2, "session/prompt", prompt), connection_id, session_id, **headers)
            assert prompted.status_code == 202, prompted.text
            while (event := await session_stream.next()).get("id") != 2:
                texts.append(event["params"]["update"]["content"]["text"])
            assert event["result"]["stopReason"] == "end_turn", event
    deleted = await client.delete(url, headers={**headers, "Acp-Connection-Id": connection_id})
    assert deleted.status_code == 202, deleted.text
    return texts


async def ws_session(
    url: str, subprotocols: Iterable[str] = ("acp",), origin: str | None = None, **headers: str
) -> list[str]:
    """initialize, session/new and a prompt over a WebSocket: the texts the prompt streamed."""
    offered = [Subprotocol(name) for name in subprotocols]
    texts: list[str] = []
    async with connect(
        url, subprotocols=offered, origin=Origin(origin) if origin else None, additional_headers=headers, proxy=None
    ) as ws:
        assert ws.subprotocol == "acp"  # never the ticket's or the token's
        requests: list[tuple[str, dict[str, Any]]] = [
            ("initialize", {"protocolVersion": 1}),
            ("session/new", {"cwd": "/tmp", "mcpServers": []}),
            ("session/prompt", {"sessionId": "", "prompt": [{"type": "text", "text": PROMPT}]}),
        ]
        session_id = ""
        for request_id, (method, params) in enumerate(requests):
            if method == "session/prompt":
                params = {**params, "sessionId": session_id}
            await ws.send(json.dumps(rpc(request_id, method, params)))
            while (message := json.loads(await asyncio.wait_for(ws.recv(), 20))).get("id") != request_id:
                if method == "session/prompt" and message.get("method") == "session/update":
                    texts.append(message["params"]["update"]["content"]["text"])
            assert "result" in message, message
            if method == "session/new":
                session_id = message["result"]["sessionId"]
        assert message["result"]["stopReason"] == "end_turn", message
    return texts


# -- never shown ---------------------------------------------------------------------------------

#: Django echoes each SQL statement with its parameters at DEBUG on this logger, when settings
#: DEBUG is True (startproject's): the session key of a cookie's lookup, DOT's token rows as
#: they are written. Django's, documented in docs/authentication.md; every other line is ours to keep clean.
SQL_ECHO = re.compile(r"^DEBUG django\.db\.backends: ")


def shown_forms(secret: str) -> set[str]:
    """The secret as a log or a body could carry it: itself, URL-quoted, base64 (as `user:pass`
    of Basic authentication would be, padded or not), JSON-escaped, and its first and last 16
    characters (a shortened secret is still one)."""
    forms = {secret, quote(secret, safe=""), quote_plus(secret), json.dumps(secret)[1:-1]}
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        encoded = encode(secret.encode()).decode()
        forms |= {encoded, encoded.rstrip("=")}
    if len(secret) >= 24:
        forms |= {secret[:16], secret[-16:]}
    return forms


def leaks(secrets: Iterable[str], texts: Iterable[str]) -> list[str]:
    """The texts (log lines, bodies, headers) that show one of the secrets, in any form."""
    forms = {form for secret in secrets for form in shown_forms(secret)}
    return [text for text in texts if not SQL_ECHO.match(text) and any(form in text for form in forms)]


def shown(response: httpx.Response) -> str:
    """What a response shows its client: status, headers and body."""
    return f"{response.status_code} {dict(response.headers)!r} {response.text}"
