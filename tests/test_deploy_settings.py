"""The production settings of docs/deployment.md (demo_project/settings_production.py) pass
`manage.py check --deploy` with no issue and nothing silenced, work behind a TLS proxy, and the
document shows what the module sets."""

from __future__ import annotations

import ast
import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus
from websockets.typing import Origin

from acp_channels._conf import DEFAULTS
from tests import forked
from tests.live import JSON, ROOT, DaphneServer, rpc

TOKEN = secrets.token_urlsafe(32)
BEARER = {"Authorization": f"Bearer {TOKEN}"}

SETTINGS_MODULE = "demo_project.settings_production"
DOC = ROOT / "docs" / "deployment.md"
HOST = "127.0.0.1"


def production_environment(**overrides: str) -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": SETTINGS_MODULE,
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "ACP_ALLOWED_HOSTS": "acp.example.com",
        "ACP_TOKEN": TOKEN,
        **overrides,
    }


def manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return forked.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def test_check_deploy_finds_no_issue() -> None:
    result = manage("check", "--deploy", "--fail-level", "DEBUG", env=production_environment())
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "System check identified no issues (0 silenced).", result.stdout + result.stderr


def test_the_demo_settings_are_not_for_production() -> None:
    """The check does find what the demo leaves out (so the clean result above means something)."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "demo_project.settings"}
    result = manage("check", "--deploy", "--fail-level", "WARNING", env=env)
    assert result.returncode != 0
    assert "security.W001" in result.stderr and "security.W009" in result.stderr


@pytest.mark.parametrize("missing", ["DJANGO_SECRET_KEY", "ACP_ALLOWED_HOSTS"])
def test_the_secret_and_the_hosts_are_required(missing: str) -> None:
    result = manage("check", "--deploy", env=production_environment(**{missing: ""}))
    assert result.returncode != 0
    assert f"{missing} must be set in the environment" in result.stderr


def test_authentication_is_required() -> None:
    """No token, no authenticator, no explicit anonymous access: the server does not start."""
    result = manage("check", "--deploy", env=production_environment(ACP_TOKEN=""))
    assert result.returncode != 0
    assert "ACP_TOKEN or ACP_AUTHENTICATE must be set in the environment" in result.stderr


def test_explicit_anonymous_access_is_clean() -> None:
    env = production_environment(ACP_TOKEN="", ACP_ALLOW_ANONYMOUS="1")
    result = manage("check", "--deploy", "--fail-level", "DEBUG", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "System check identified no issues (0 silenced).", result.stdout + result.stderr


def test_the_document_shows_every_setting_of_the_module() -> None:
    module = ast.parse((ROOT / "demo_project" / "settings_production.py").read_text())
    names = {
        target.id
        for node in module.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name) and target.id.isupper()
    }
    doc = DOC.read_text()
    assert names and {name for name in names if not re.search(rf"\b{name}\b\s*=", doc)} == set()


def test_the_readme_names_every_setting_with_its_default() -> None:
    """The one settings table (docs/deployment.md links to it): every key, its default as coded."""
    readme = (ROOT / "README.md").read_text()
    assert re.search(r"^\| `AGENT` \| \(required\) \|", readme, re.MULTILINE)
    for key in [key for key in DEFAULTS if key != "AGENT"]:
        row = re.search(rf"^\| `{key}` \| `([^`]*)` \|", readme, re.MULTILINE)
        assert row is not None, f"{key} has no row in README.md"
        assert row.group(1) == repr(DEFAULTS[key]), (key, row.group(1), DEFAULTS[key])


# -- behind a TLS-terminating proxy ----------------------------------------------------------


@pytest.fixture(scope="module")
def production_server() -> Iterator[DaphneServer]:
    env = production_environment(ACP_ALLOWED_HOSTS=HOST, ACP_AGENT="tests.wire_agent.create")
    server = DaphneServer(env={key: env[key] for key in env if key.startswith(("DJANGO_", "ACP_"))}).start()
    yield server
    server.stop()


async def test_behind_the_proxy_requests_are_served_with_hsts(production_server: DaphneServer) -> None:
    async with httpx.AsyncClient(timeout=10.0) as http:
        proxied = {**JSON, **BEARER, "X-Forwarded-Proto": "https"}
        refused = await http.post(
            production_server.url, headers={**JSON, "X-Forwarded-Proto": "https"}, json=rpc(0, "initialize", {})
        )
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == 'Bearer realm="acp"'
        response = await http.post(production_server.url, headers=proxied, json=rpc(0, "initialize", {}))
        assert response.status_code == 200, response.text
        assert response.headers["strict-transport-security"].startswith("max-age=31536000")
        connection_id = response.headers["acp-connection-id"]
        deleted = await http.delete(production_server.url, headers={**proxied, "Acp-Connection-Id": connection_id})
        assert deleted.status_code == 202
        # Plain HTTP (no proxy in front) is sent to https.
        plain = await http.post(production_server.url, headers={**JSON, **BEARER}, json=rpc(0, "initialize", {}))
        assert plain.status_code == 301 and plain.headers["location"].startswith("https://")


async def test_behind_the_proxy_an_https_page_of_the_site_is_its_own_origin(production_server: DaphneServer) -> None:
    own = f"https://{HOST}:{production_server.port}"
    async with connect(
        production_server.ws_url,
        origin=Origin(own),
        additional_headers={"X-Forwarded-Proto": "https", **BEARER},
        proxy=None,
    ) as ws:
        await ws.send('{"jsonrpc":"2.0","id":1,"method":"tls/ws"}')
        assert '"id":1' in str(await ws.recv())
    with pytest.raises(InvalidStatus) as refused:  # the same page over plain http is another origin
        async with connect(production_server.ws_url, origin=Origin(own), additional_headers=BEARER, proxy=None):
            pass
    assert refused.value.response.status_code == 403
