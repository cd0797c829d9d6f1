"""Every recipe of docs/authentication.md as a new user follows it, and no credential shown.

One project made by `django-admin startproject mysite` with this checkout's environment holds the
four recipes (tests/auth_recipes.py: the doc's blocks between its recipe markers, applied as
their first lines say, each recipe a settings module of its own). Per recipe: `manage.py check`
clean, the recipe's commands as written (migrate, createsuperuser, acp_token create,
createapplication), then the README's daphne line with the recipe's settings, and a whole
session as a user of the recipe has it: a person who logs in through the login page (cookies
and CSRF as a browser keeps them) and whose page talks to /acp over HTTP and WebSocket, or asks
for a WebSocket ticket; a per-user token from `acp_token create`; the team's token from the
README's secret line, with the recipe's stdio agent command; an OAuth access token from the
authorization code flow with PKCE through django-oauth-toolkit's pages.

Never shown: one test per kind of credential (a session cookie, a WebSocket ticket, a built-in
token, the settings TOKENS token, the old `acp.bearer.<token>` subprotocol, an OAuth access
token) runs that session and its refusals (no credential, a wrong one, a revoked, expired or
logged-out one, a replayed ticket) against a server that logs every logger at DEBUG (daphne
with `-v 2`, its access log included), then reads everything the server wrote, the /metrics
output and every response's status, headers and body for the secret in any form
(`auth_recipes.shown_forms`). The servers are the recipes' own: the settings daphne serves
import the recipe's and add only the logging, METRICS, a 0.5 s credential sweep and (the team's)
ALLOW_BEARER_SUBPROTOCOL.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
import secrets
import shlex
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest
from websockets.exceptions import InvalidStatus

from tests.auth_recipes import (
    ANSWER,
    BIN,
    RECIPES,
    SQL_ECHO,
    Recipe,
    http_session,
    installed_extra,
    leaks,
    make_project,
    recipe,
    run,
    shown,
    user_environment,
    write_agent_command,
    write_served_settings,
    ws_session,
)
from tests.live import wait_for_line
from tests.test_example_project import ProjectServer, prompt_once, readme_serve_commands

pytestmark = [pytest.mark.slow, pytest.mark.live, pytest.mark.timeout(300)]

PASSWORD = "a-long-password-0123"
INITIALIZE = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}
INVALID = 'Bearer realm="acp", error="invalid_token"'
#: A server's errors. At DEBUG tracebacks are normal (Django's template engine logs each missing
#: variable of its debug 404 page with one); and Twisted, which daphne lets log at `-v 2`, shows
#: daphne's own KeyError of `kill_all_applications` at exit (a keep-alive connection whose
#: application ended): daphne's, harmless, silent at the default verbosity.
SERIOUS = re.compile(r"(ERROR|CRITICAL) (?!daphne\.server: While calling system event trigger handler)")


def test_every_recipe_is_files_and_commands_this_test_runs() -> None:
    """Each recipe parses (its blocks name their files; its commands are manage.py lines), and
    recipe 2 needs no code of its own (the 500 of a snippet without its import cannot recur)."""
    found = {name: recipe(name) for name in RECIPES}
    tokens = found["per-user-tokens"]
    assert '"TOKEN_LOOKUP":' not in tokens.settings and '"acp_channels.tokens"' in tokens.settings
    assert [shlex.split(line)[:3] for line in tokens.commands] == [
        ["python", "manage.py", "migrate"],
        ["python", "manage.py", "createsuperuser"],
        ["python", "manage.py", "acp_token"],
    ]
    assert tokens.files == {} and found["team-token"].files == {}
    assert installed_extra(*found["oauth"].installs) == ["django-oauth-toolkit"]
    assert (
        found["logged-in-users"].files["templates/registration/login.html"]
        == (found["oauth"].files["templates/registration/login.html"])
    )


# -- the project and its servers -------------------------------------------------------------------


@dataclass
class Site:
    """One recipe served: its settings, its commands' outputs, its server."""

    recipe: Recipe
    project: Path
    env: dict[str, str]
    outputs: list[str]
    server: ProjectServer
    #: Every credential used against it: none may be in anything it wrote (checked again at its stop).
    secrets: set[str] = field(default_factory=set)

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    @property
    def url(self) -> str:
        return f"{self.origin}/acp"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.server.port}/acp"

    def manage(self, *args: str) -> str:
        return run([str(BIN / "python"), "manage.py", *args], self.project, self.env).stdout


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("auth-recipes")
    made = make_project(where)
    team = recipe("team-token").settings
    command = re.search(r'"command": \["([\w-]+)"', team)
    assert command is not None, team
    write_agent_command(where / "bin", made, command[1])
    return made


def serve(project: Path, name: str, env: dict[str, str] | None = None, **served: Any) -> Iterator[Site]:
    """`check`, the recipe's commands, then the README's daphne line (on a free port, `-v 2`)."""
    found = recipe(name)
    env = user_environment(
        DJANGO_SETTINGS_MODULE=found.settings_module, DJANGO_SUPERUSER_PASSWORD=PASSWORD, **(env or {})
    )
    python = str(BIN / "python")
    checked = run([python, "manage.py", "check"], project, env)
    assert "System check identified no issues (0 silenced)." in checked.stdout, checked.stdout + checked.stderr
    outputs = []
    for line in found.commands:
        argv = shlex.split(line)
        if argv[2] == "createsuperuser":
            argv.append("--noinput")  # the password from DJANGO_SUPERUSER_PASSWORD, not a prompt
        outputs.append(run([python, *argv[1:]], project, env).stdout)
    _, daphne = readme_serve_commands()
    argv = shlex.split(daphne.replace("\\\n", " ").replace("tcp:port=8000:", "tcp:port=0:"))
    executable = shutil.which(argv[0], path=str(BIN))
    assert executable == str(BIN / "daphne"), executable
    served_env = {**env, "DJANGO_SETTINGS_MODULE": write_served_settings(project, found, **served)}
    server = ProjectServer(argv=[executable, "-v", "2", *argv[1:]], cwd=project, env=served_env).start()
    site = Site(found, project, env, outputs, server)
    try:
        yield site
    finally:
        server.stop()
    assert [line for line in server.log if SERIOUS.match(line) or '" 500 ' in line] == [], "".join(server.log)[-5000:]
    assert leaks(site.secrets, server.log) == [], "a credential reached the log"


@pytest.fixture(scope="module")
def logged_in_site(project: Path) -> Iterator[Site]:
    yield from serve(project, "logged-in-users")


@pytest.fixture(scope="module")
def tokens_site(project: Path) -> Iterator[Site]:
    yield from serve(project, "per-user-tokens")


@pytest.fixture(scope="module")
def team_site(project: Path) -> Iterator[Site]:
    token_line, _ = readme_serve_commands()
    # The README's secret line as written, in bash with this environment's python first on PATH.
    made = run(["bash", "-c", f'{token_line}\nprintf %s "$ACP_TOKEN"'], project, user_environment())
    assert re.fullmatch(r"[\w-]{43}", made.stdout), made.stdout
    agents = project.parent / "bin"  # where the recipe's agent command is
    env = {"ACP_TOKEN": made.stdout, "PATH": f"{agents}:{user_environment()['PATH']}"}
    yield from serve(project, "team-token", env, ALLOW_BEARER_SUBPROTOCOL=True)


@pytest.fixture(scope="module")
def oauth_site(project: Path) -> Iterator[Site]:
    yield from serve(project, "oauth")


async def assert_never_shown(site: Site, credentials: set[str], responses: list[str]) -> None:
    """None of `credentials` in anything the server wrote so far (up to a request it logs after
    everything before), in its /metrics, nor in `responses`."""
    site.secrets |= credentials
    marker = f"/leak-check-{uuid.uuid4().hex}"
    async with httpx.AsyncClient(timeout=20) as http:
        metrics = await http.get(f"{site.origin}/metrics")
        assert metrics.status_code == 200 and "acp_" in metrics.text, metrics.text[:500]
        assert (await http.get(site.origin + marker)).status_code == 404
    await wait_for_line(site.server, re.escape(marker))
    found = leaks(credentials, [*site.server.log, *responses, metrics.text])
    assert found == [], "\n".join(found)


# -- a person who logs in --------------------------------------------------------------------------


async def log_in(browser: httpx.AsyncClient, page: str) -> httpx.Response:
    """Open `page` logged out: to the login page, its form posted as alice; the page after it."""
    sent = await browser.get(page)
    assert sent.status_code == 302 and sent.headers["location"].startswith("/accounts/login/?next="), shown(sent)
    form = await browser.get(sent.headers["location"])
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)
    assert form.status_code == 200 and match is not None, shown(form)
    credentials = {"username": "alice", "password": PASSWORD, "csrfmiddlewaretoken": match[1]}
    logged = await browser.post(sent.headers["location"], data=credentials, headers={"Origin": str(browser.base_url)})
    assert logged.status_code == 302 and logged.headers["location"] == page, shown(logged)
    return await browser.get(page)


def browser_of(site: Site) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=site.origin, timeout=20)


async def test_recipe_1_a_logged_in_user_and_their_page(logged_in_site: Site) -> None:
    """Credential: the session cookie. Through the login page to the agent's page, then a
    session from it over HTTP (fetch, the cookie and the page's Origin) and over its WebSocket
    (the upgrade carries the cookie); refused without the cookie, with a wrong one, and with the
    one of a session since logged out."""
    site = logged_in_site
    same_origin = {"Origin": site.origin}
    responses = []
    async with browser_of(site) as browser:
        page = await log_in(browser, "/")
        assert page.status_code == 200 and "Logged in as alice." in page.text, shown(page)
        session_key, csrf = browser.cookies["sessionid"], browser.cookies["csrftoken"]
        assert await http_session(browser, site.url, **same_origin) == ANSWER
        cookie = f"sessionid={session_key}"
        assert await ws_session(site.ws_url, origin=site.origin, Cookie=cookie) == ANSWER
        logged_out = await browser.post("/accounts/logout/", data={"csrfmiddlewaretoken": csrf}, headers=same_origin)
        assert logged_out.status_code == 200, shown(logged_out)
    wrong = secrets.token_hex(16)
    async with httpx.AsyncClient(timeout=20) as stranger:
        for headers in ({}, {"Cookie": f"sessionid={wrong}"}, {"Cookie": cookie}):
            refused = await stranger.post(site.url, json=INITIALIZE, headers={**same_origin, **headers})
            assert (refused.status_code, refused.headers["www-authenticate"]) == (401, 'Cookie realm="acp"'), shown(
                refused
            )
            responses.append(shown(refused))
    with pytest.raises(InvalidStatus) as upgrade:
        await ws_session(site.ws_url, origin=site.origin, Cookie=cookie)
    assert upgrade.value.response.status_code == 403
    responses.append(repr(upgrade.value.response.headers) + upgrade.value.response.body.decode())
    log = "".join(site.server.log)
    assert log.count("connection opened principal=user:alice ") == 2, log[-3000:]
    # The log is read at DEBUG: Django's own SQL echo shows the session key (never another line).
    assert any(session_key in line for line in site.server.log if SQL_ECHO.match(line))
    await assert_never_shown(site, {session_key, csrf, wrong, PASSWORD}, responses)


async def test_recipe_1_a_websocket_ticket(logged_in_site: Site) -> None:
    """Credential: a WebSocket ticket, bought with the session cookie and the CSRF token as
    acp-client.js does; the socket offers it alone (no cookie). Without the CSRF token no
    ticket; a replayed ticket and an unknown one are refused."""
    site = logged_in_site
    same_origin = {"Origin": site.origin}
    async with browser_of(site) as browser:
        await log_in(browser, "/")
        csrf = browser.cookies["csrftoken"]
        without_csrf = await browser.post("/acp/tickets", headers=same_origin)
        assert without_csrf.status_code == 403, shown(without_csrf)
        bought = await browser.post("/acp/tickets", headers={**same_origin, "X-CSRFToken": csrf})
        assert bought.status_code == 200 and bought.headers["cache-control"] == "no-store", shown(bought)
        ticket, session_key = bought.json()["ticket"], browser.cookies["sessionid"]
    assert bought.json()["subprotocol"] == f"acp-ticket.{ticket}"
    assert await ws_session(site.ws_url, ["acp", f"acp-ticket.{ticket}"], origin=site.origin) == ANSWER
    unknown = secrets.token_urlsafe(32)
    responses = [shown(without_csrf)]
    for offered in (ticket, unknown):
        with pytest.raises(InvalidStatus) as refused:
            await ws_session(site.ws_url, ["acp", f"acp-ticket.{offered}"], origin=site.origin)
        assert refused.value.response.status_code == 403
        responses.append(repr(refused.value.response.headers) + refused.value.response.body.decode())
    await wait_for_line(site.server, "the WebSocket ticket is unknown, used, expired or issued for another origin")
    await assert_never_shown(site, {ticket, unknown, session_key, csrf, PASSWORD}, responses)


# -- per-user tokens ---------------------------------------------------------------------------------


CREATE_OTHERS = """
import json
from datetime import timedelta
from django.contrib.auth.models import User
from django.utils import timezone
from acp_channels.tokens.models import AgentToken
bob = User.objects.create_user("bob")
_, bobs = AgentToken.create(bob, "bob's")
_, expired = AgentToken.create(User.objects.get(username="alice"), "old", expires=timezone.now() - timedelta(days=1))
print(json.dumps({"bob": bobs, "expired": expired}))
"""


async def test_recipe_2_per_user_tokens(tokens_site: Site) -> None:
    """Credential: a built-in token from `acp_token create` (the recipe's last command prints it).
    A prompt over HTTP and WebSocket; refused without a token, with a wrong or expired one
    (401 invalid_token), for a user without the permission (403); `acp_token list` never shows a
    secret; a revoked token's live connection ends (reason=revoked) and the token is refused."""
    site = tokens_site
    token = site.outputs[-1].strip()
    assert re.fullmatch(r"acp_[\w-]{43}", token), site.outputs[-1]
    others = json.loads(site.manage("shell", "-c", CREATE_OTHERS).splitlines()[-1])
    assert await prompt_once(site.url, token) == ANSWER
    assert await prompt_once(site.ws_url, token) == ANSWER
    wrong = "acp_" + secrets.token_urlsafe(32)
    responses = []
    async with httpx.AsyncClient(timeout=20) as http:
        nobody = await http.post(site.url, json=INITIALIZE)
        assert nobody.status_code == 401, shown(nobody)
        for refused_token in (wrong, others["expired"]):
            refused = await http.post(site.url, json=INITIALIZE, headers={"Authorization": f"Bearer {refused_token}"})
            assert (refused.status_code, refused.headers["www-authenticate"]) == (401, INVALID), shown(refused)
            responses.append(shown(refused))
        forbidden = await http.post(site.url, json=INITIALIZE, headers={"Authorization": f"Bearer {others['bob']}"})
        assert forbidden.status_code == 403, shown(forbidden)
        # A live connection of the token, then `acp_token revoke`: it ends, and the token is refused.
        opened = await http.post(site.url, json=INITIALIZE, headers={"Authorization": f"Bearer {token}"})
        assert opened.status_code == 200, shown(opened)
        connection_id = opened.headers["acp-connection-id"]
        listed = site.manage("acp_token", "list", "alice")
        token_id = listed.splitlines()[1].split()[0]
        assert "laptop" in listed and token not in listed
        site.manage("acp_token", "revoke", token_id)
        await wait_for_line(site.server, rf"connection={re.escape(connection_id)} .*reason=revoked")
        revoked = await http.post(site.url, json=INITIALIZE, headers={"Authorization": f"Bearer {token}"})
        assert (revoked.status_code, revoked.headers["www-authenticate"]) == (401, INVALID), shown(revoked)
    responses += [shown(nobody), shown(forbidden), shown(opened), shown(revoked), listed, *site.outputs]
    log = "".join(site.server.log)
    assert log.count("connection opened principal=user:alice ") == 3, log[-3000:]
    await assert_never_shown(site, {token, wrong, *others.values()}, responses[: -len(site.outputs)])
    assert leaks({token}, site.outputs[:-1]) == []  # the commands before `acp_token create`


# -- one shared team token -----------------------------------------------------------------------------


async def test_recipe_3_a_team_token(team_site: Site) -> None:
    """Credential: the TOKENS token from the README's secret line, in ACP_TOKEN. A prompt over
    HTTP and WebSocket, each answered by the recipe's stdio agent command (a process per
    connection, which is not given the token); refused without it and with a wrong one."""
    site = team_site
    token = site.env["ACP_TOKEN"]
    assert await prompt_once(site.url, token) == ANSWER
    assert await prompt_once(site.ws_url, token) == ANSWER
    wrong = secrets.token_urlsafe(32)
    async with httpx.AsyncClient(timeout=20) as http:
        nobody = await http.post(site.url, json=INITIALIZE)
        refused = await http.post(site.url, json=INITIALIZE, headers={"Authorization": f"Bearer {wrong}"})
    assert nobody.status_code == 401 and (refused.status_code, refused.headers["www-authenticate"]) == (401, INVALID)
    log = "".join(site.server.log)
    assert log.count("connection opened principal=token:team ") >= 2, log[-3000:]
    assert "environment PATH=" in log and "environment ACP_TOKEN=" not in log  # the agent's stderr is logged
    await assert_never_shown(site, {token, wrong}, [shown(nobody), shown(refused)])


async def test_recipe_3_the_old_bearer_subprotocol(team_site: Site) -> None:
    """Credential: the team token in the subprotocol `acp.bearer.<token>`, with
    ALLOW_BEARER_SUBPROTOCOL on (what proxies may log: never what we log); a wrong one refused."""
    site = team_site
    token = site.env["ACP_TOKEN"]
    assert await ws_session(site.ws_url, ["acp", f"acp.bearer.{token}"]) == ANSWER
    wrong = secrets.token_urlsafe(32)
    with pytest.raises(InvalidStatus) as refused:
        await ws_session(site.ws_url, ["acp", f"acp.bearer.{wrong}"])
    assert refused.value.response.status_code == 403
    response = repr(refused.value.response.headers) + refused.value.response.body.decode()
    await assert_never_shown(site, {token, wrong}, [response])


# -- OAuth with django-oauth-toolkit ---------------------------------------------------------------------

#: The client id `acp-client login` uses, which the recipe registers.
CLIENT_ID = "acp-client"


async def code_flow(site: Site, scope: str) -> tuple[dict[str, Any], set[str]]:
    """The authorization code flow with PKCE through DOT's pages, as the doc tells a client to
    run it: the user logs in and authorizes in a browser, the client exchanges the code from the
    loopback redirect. The token answer, and the secrets met on the way."""
    application = next(line for line in recipe("oauth").commands if "createapplication" in line)
    redirect = shlex.split(application)[shlex.split(application).index("--redirect-uris") + 1]
    redirect = redirect.replace("127.0.0.1/", "127.0.0.1:54321/")  # a client's loopback port
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    state = secrets.token_urlsafe(16)
    query = {
        "response_type": "code", "client_id": CLIENT_ID, "redirect_uri": redirect, "scope": scope,
        "code_challenge": challenge, "code_challenge_method": "S256", "state": state,
    }  # fmt: skip
    async with browser_of(site) as browser:
        consent = await log_in(browser, f"/o/authorize/?{urlencode(query)}")
        assert consent.status_code == 200 and 'name="allow"' in consent.text, shown(consent)
        fields = {
            html.unescape(name): html.unescape(value)
            for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', consent.text)
        }
        granted = await browser.post(
            "/o/authorize/", data={**fields, "allow": "Authorize"}, headers={"Origin": site.origin}
        )
        assert granted.status_code == 302, shown(granted)
        location = urlsplit(granted.headers["location"])
        assert f"{location.scheme}://{location.netloc}{location.path}" == redirect
        returned = parse_qs(location.query)
        assert returned["state"] == [state]
        session_key = browser.cookies["sessionid"]
    async with httpx.AsyncClient(timeout=20) as client:
        exchanged = await client.post(
            f"{site.origin}/o/token/",
            data={
                "grant_type": "authorization_code", "client_id": CLIENT_ID, "code": returned["code"][0],
                "redirect_uri": redirect, "code_verifier": verifier,
            },
        )  # fmt: skip
    assert exchanged.status_code == 200, shown(exchanged)
    answer: dict[str, Any] = exchanged.json()
    assert answer["scope"] == scope and answer["token_type"] == "Bearer"
    return answer, {verifier, returned["code"][0], session_key, answer["access_token"], answer["refresh_token"]}


async def test_oauth_an_access_token_from_the_code_flow(oauth_site: Site) -> None:
    """Credential: a DOT access token, from the code flow with PKCE. The metadata names the
    recipe's resource and issuer; a prompt over HTTP and WebSocket; refused without a token (the
    challenge names the metadata), with a wrong one, with one lacking acp:connect (403
    insufficient_scope), and once revoked at /o/revoke_token/."""
    site = oauth_site
    assert "created successfully" in site.outputs[-1], site.outputs[-1]
    async with httpx.AsyncClient(timeout=20) as http:
        metadata = (await http.get(f"{site.origin}/.well-known/oauth-protected-resource")).json()
    assert metadata["resource"] == "https://agents.example.com/acp"
    assert metadata["authorization_servers"] == ["https://agents.example.com/o"]
    # The authorization server's metadata where RFC 8414 clients (acp-client login) look for issuer .../o.
    async with httpx.AsyncClient(timeout=20) as http:
        server = (await http.get(f"{site.origin}/.well-known/oauth-authorization-server/o")).json()
    assert server["issuer"] == f"{site.origin}/o"
    assert (server["authorization_endpoint"], server["token_endpoint"]) == (
        f"{site.origin}/o/authorize/",
        f"{site.origin}/o/token/",
    )
    assert "S256" in server["code_challenge_methods_supported"]
    answer, met = await code_flow(site, "acp:connect")
    token = answer["access_token"]
    assert await prompt_once(site.url, token) == ANSWER
    assert await prompt_once(site.ws_url, token) == ANSWER
    narrow, met_narrow = await code_flow(site, "acp:session:observe")
    wrong = secrets.token_urlsafe(30)
    async with httpx.AsyncClient(timeout=20) as http:
        nobody = await http.post(site.url, json=INITIALIZE)
        assert nobody.status_code == 401 and "resource_metadata=" in nobody.headers["www-authenticate"], shown(nobody)
        refused = await http.post(site.url, json=INITIALIZE, headers={"Authorization": f"Bearer {wrong}"})
        assert refused.status_code == 401 and 'error="invalid_token"' in refused.headers["www-authenticate"]
        scoped = await http.post(
            site.url, json=INITIALIZE, headers={"Authorization": f"Bearer {narrow['access_token']}"}
        )
        assert scoped.status_code == 403 and 'error="insufficient_scope"' in scoped.headers["www-authenticate"]
        revoked = await http.post(f"{site.origin}/o/revoke_token/", data={"token": token, "client_id": CLIENT_ID})
        assert revoked.status_code == 200, shown(revoked)
        after = await http.post(site.url, json=INITIALIZE, headers={"Authorization": f"Bearer {token}"})
        assert after.status_code == 401 and 'error="invalid_token"' in after.headers["www-authenticate"], shown(after)
    log = "".join(site.server.log)
    assert log.count("connection opened principal=user:alice ") == 2, log[-3000:]
    responses = [shown(response) for response in (nobody, refused, scoped, revoked, after)]
    await assert_never_shown(site, {*met, *met_narrow, wrong, PASSWORD}, responses)


def test_the_leak_check_sees_every_form() -> None:
    """`leaks` finds a secret itself, URL-quoted, in base64 (plain and as Basic credentials
    would carry it), JSON-escaped and shortened; and no other line."""
    secret = "s3cret/with+odd=chars_and-length-32"
    basic = base64.b64encode(f"alice:{secret}".encode()).decode()
    lines = [
        f"token {secret}",
        "url /acp?t=s3cret%2Fwith%2Bodd%3Dchars_and-length-32",
        f"b64 {base64.b64encode(secret.encode()).decode()}",
        f"prefix {secret[:16]}…",
        "nothing here",
        f"DEBUG django.db.backends: (0.001) SELECT 1 WHERE x = '{secret}'",
    ]
    assert leaks({secret}, lines) == lines[:4]
    assert leaks({f"alice:{secret}"}, [f"Authorization: Basic {basic}"]) != []
