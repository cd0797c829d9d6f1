"""Recipe 2 of docs/authentication.md as a new user follows it: a project made by `django-admin
startproject mysite` in the fresh environment where the README's `pip install` line put the
wheel, the README's agent.py, urls.py and asgi.py, the recipe's settings block added as its
first line says, `manage.py check` clean, the recipe's commands (migrate, createsuperuser, then
`acp_token create`, whose stdout is the token), the README's daphne command; then a prompt with
the official SDK client over HTTP and WebSocket, 403 for a user without the permission, and a
revoked token refused (401 invalid_token) and its live connection ended."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import shutil
from pathlib import Path

import httpx
import pytest

from tests.dist import Installed
from tests.live import ROOT, wait_for_line
from tests.test_example_project import (
    PROJECT,
    ProjectServer,
    code_blocks,
    prompt_once,
    readme_files,
    readme_serve_commands,
    run,
    user_environment,
)

DOC = ROOT / "docs" / "authentication.md"
SECTION = "## Recipe 2: an API with per-user tokens\n"
INVALID = 'Bearer realm="acp", error="invalid_token"'
INITIALIZE = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}


def recipe() -> tuple[str, list[str]]:
    """The recipe's settings block and its command lines."""
    text = DOC.read_text()
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = code_blocks(section)
    (settings,) = [body for language, body in blocks if language == "python"]
    (commands,) = [body for language, body in blocks if language == "sh"]
    assert settings.startswith(f"# {PROJECT}/settings.py: add at the end\n")
    return settings, commands.strip().splitlines()


def test_the_recipe_names_no_code_of_its_own() -> None:
    """Nothing to write but settings (the 500 of a snippet without its import cannot recur)."""
    settings, commands = recipe()
    assert '"TOKEN_LOOKUP":' not in settings and '"acp_channels.tokens"' in settings
    assert [line.split()[:3] for line in commands] == [
        ["python", "manage.py", "migrate"],
        ["python", "manage.py", "createsuperuser"],
        ["python", "manage.py", "acp_token"],
    ]


def make_project(installed: Installed, where: Path) -> Path:
    run([str(installed.bin / "django-admin"), "startproject", PROJECT], where, user_environment(installed))
    project = where / PROJECT
    for name, body in readme_files().items():
        if name != "settings.py":  # the recipe's settings instead of the README's
            (project / PROJECT / name).write_text(body)
    settings, _ = recipe()
    target = project / PROJECT / "settings.py"
    target.write_text(target.read_text() + "\n" + settings)
    return project


@pytest.mark.slow
@pytest.mark.live
@pytest.mark.timeout(900)  # with the wheel's build and install, when no other test made them first
def test_recipe_2_in_a_new_project(readme_install: Installed, tmp_path: Path) -> None:
    installed = readme_install.result
    assert installed.returncode == 0, installed.stdout + installed.stderr
    project = make_project(readme_install, tmp_path)
    env = user_environment(readme_install, DJANGO_SUPERUSER_PASSWORD="a-long-password-0123")
    python = str(readme_install.python)
    checked = run([python, "manage.py", "check"], project, env)
    assert "no issues" in checked.stdout, checked.stdout + checked.stderr
    _, commands = recipe()
    outputs = []
    for line in commands:
        argv = shlex.split(line)
        assert argv[0] == "python"
        if argv[2] == "createsuperuser":
            argv.append("--noinput")  # the password from DJANGO_SUPERUSER_PASSWORD, not a prompt
        outputs.append(run([python, *argv[1:]], project, env))
    token = outputs[-1].stdout.strip()
    assert re.fullmatch(r"acp_[\w-]{43}", token), outputs[-1].stdout
    # A user without the permission, and a token of theirs (the command, as for anyone).
    create_bob = "from django.contrib.auth.models import User; User.objects.create_user('bob')"
    run([python, "manage.py", "shell", "-c", create_bob], project, env)
    bobs = run([python, "manage.py", "acp_token", "create", "bob"], project, env).stdout.strip()
    _, daphne = readme_serve_commands()
    argv = shlex.split(daphne.replace("\\\n", " ").replace("tcp:port=8000:", "tcp:port=0:"))
    executable = shutil.which(argv[0], path=str(readme_install.bin))
    assert executable == str(readme_install.bin / "daphne"), executable
    server = ProjectServer(
        argv=[executable, *argv[1:]], cwd=project, env={**env, "ACP_REVALIDATE_SECONDS": "0.5"}
    ).start()
    try:
        url = f"http://127.0.0.1:{server.port}/acp"
        assert asyncio.run(prompt_once(url, token)) == ["You said: hello from the README"]
        assert asyncio.run(prompt_once(url.replace("http", "ws", 1), token)) == ["You said: hello from the README"]
        assert httpx.post(url, json=INITIALIZE, timeout=20).status_code == 401
        forbidden = httpx.post(url, json=INITIALIZE, headers={"Authorization": f"Bearer {bobs}"}, timeout=20)
        assert forbidden.status_code == 403, forbidden.text
        # A live connection of the token, then `acp_token revoke`: it ends, and the token is refused.
        opened = httpx.post(url, json=INITIALIZE, headers={"Authorization": f"Bearer {token}"}, timeout=20)
        assert opened.status_code == 200, opened.text
        connection_id = opened.headers["acp-connection-id"]
        listed = run([python, "manage.py", "acp_token", "list", "alice"], project, env).stdout
        token_id = listed.splitlines()[1].split()[0]
        assert "laptop" in listed and token not in listed
        run([python, "manage.py", "acp_token", "revoke", token_id], project, env)
        asyncio.run(wait_for_line(server, rf"connection={re.escape(connection_id)} .*reason=revoked", 10))
        refused = httpx.post(url, json=INITIALIZE, headers={"Authorization": f"Bearer {token}"}, timeout=20)
        assert (refused.status_code, refused.headers["www-authenticate"]) == (401, INVALID)
    finally:
        server.stop()
    log = "".join(server.log)
    assert "Traceback" not in log and token not in log and bobs not in log, log
    assert log.count("connection opened principal=user:alice") == 3, log
    assert json.dumps(token) not in log
