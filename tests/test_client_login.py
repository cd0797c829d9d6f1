"""`acp-client login`, in process against a fake authorization server (httpx.MockTransport):
challenges, RFC 9728 and RFC 8414 discovery (the well-known paths, an issuer or a resource that
does not match refused), PKCE, the loopback redirect's state check, the device flow's polling
(interval, slow_down, denial, expiry), the token store's modes and atomic writes, `StoredLogin`
renewing with the refresh token (the new one replacing the old) and adopting what another
client stored, the command line, and the hint after a refusal for each kind of challenge. The
same against the demo with django-oauth-toolkit, as real processes: test_oauth_live.py."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import os
import re
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from acp_channels.client import AuthenticationError
from acp_channels.client.__main__ import main as client_main
from acp_channels.client._auth_hint import refusal_hint
from acp_channels.client._cli import add_connection_arguments, connection_options
from acp_channels.client._oauth_discovery import (
    AuthorizationServer,
    LoginError,
    authorization_server_metadata_urls,
    canonical_url,
    discover,
    parse_challenges,
    protected_resource_metadata_urls,
    resource_for,
)
from acp_channels.client._oauth_flows import (
    DeviceAuthorization,
    LoopbackReceiver,
    authorization_url,
    pkce_pair,
    poll_device_token,
)
from acp_channels.client._oauth_login import LoginOptions, StoredLogin, login, logout
from acp_channels.client._token_store import LoginRecord, TokenStore

pytestmark = pytest.mark.timeout(30)

ORIGIN = "https://agents.example.com"
RESOURCE = f"{ORIGIN}/acp"
ISSUER = f"{ORIGIN}/o"
METADATA = f"{ORIGIN}/.well-known/oauth-protected-resource"
SCOPES = ["acp:connect", "acp:session:observe", "acp:session:control"]
DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"


class FakeServer:
    """An ACP endpoint that is an OAuth protected resource, and its authorization server."""

    def __init__(self) -> None:
        self.challenge = f'Bearer realm="acp", scope="acp:connect", resource_metadata="{METADATA}"'
        self.resource_document: dict[str, Any] = {
            "resource": RESOURCE,
            "authorization_servers": [ISSUER],
            "scopes_supported": SCOPES,
        }
        self.server_document: dict[str, Any] = {
            "issuer": ISSUER,
            "authorization_endpoint": f"{ISSUER}/authorize/",
            "token_endpoint": f"{ISSUER}/token/",
            "device_authorization_endpoint": f"{ISSUER}/device/",
            "revocation_endpoint": f"{ISSUER}/revoke/",
            "code_challenge_methods_supported": ["S256"],
        }
        self.token_answers: list[tuple[int, dict[str, Any]]] = []
        self.token_forms: list[dict[str, str]] = []
        self.revoked: list[dict[str, str]] = []
        self.gets: list[str] = []

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        url = str(request.url)
        if request.method == "GET":
            self.gets.append(url)
            if url == RESOURCE:
                return httpx.Response(401, headers={"WWW-Authenticate": self.challenge}, text="authentication required")
            if url == METADATA:
                return httpx.Response(200, json=self.resource_document)
            if url == f"{ORIGIN}/.well-known/oauth-authorization-server/o":
                return httpx.Response(200, json=self.server_document)
            return httpx.Response(404)
        form = {name: values[0] for name, values in parse_qs(request.content.decode()).items()}
        if url == f"{ISSUER}/token/":
            self.token_forms.append(form)
            status, document = self.token_answers.pop(0)
            return httpx.Response(status, json=document)
        if url == f"{ISSUER}/device/":
            answer = {"device_code": "dev-1", "user_code": "WDJB-MJHT", "verification_uri": f"{ISSUER}/activate"}
            return httpx.Response(200, json={**answer, "expires_in": 600, "interval": 2})
        if url == f"{ISSUER}/revoke/":
            self.revoked.append(form)
            return httpx.Response(200)
        return httpx.Response(404)


def tokens(access: str, refresh: str | None = "refresh-1", expires_in: int = 3600) -> tuple[int, dict[str, Any]]:
    answer: dict[str, Any] = {"access_token": access, "token_type": "Bearer", "expires_in": expires_in}
    if refresh is not None:
        answer["refresh_token"] = refresh
    return 200, answer


@pytest.fixture
def fake() -> FakeServer:
    return FakeServer()


@pytest.fixture
def store(tmp_path: Path) -> TokenStore:
    return TokenStore(tmp_path / "state" / "acp-channels" / "tokens")


# -- challenges and discovery -----------------------------------------------------------------------------


def test_parse_challenges() -> None:
    [bearer] = parse_challenges(
        'Bearer realm="acp", error="invalid_token", error_description="The \\"token\\" expired.", '
        'scope="acp:connect acp:session:control", resource_metadata="https://h/.well-known/oauth-protected-resource"'
    )
    assert bearer.scheme == "bearer"
    assert bearer.params == {
        "realm": "acp",
        "error": "invalid_token",
        "error_description": 'The "token" expired.',
        "scope": "acp:connect acp:session:control",
        "resource_metadata": "https://h/.well-known/oauth-protected-resource",
    }
    several = parse_challenges('Cookie realm="acp", Basic realm=x, Bearer error=invalid_token, Negotiate abc==')
    assert [(c.scheme, dict(c.params)) for c in several] == [
        ("cookie", {"realm": "acp"}),
        ("basic", {"realm": "x"}),
        ("bearer", {"error": "invalid_token"}),
        ("negotiate", {"": "abc=="}),
    ]
    assert parse_challenges(None) == [] and parse_challenges("") == []


def test_resource_identifiers_and_well_known_urls() -> None:
    assert resource_for("http://127.0.0.1:8000") == "http://127.0.0.1:8000/acp"
    assert resource_for("WS://LocalHost:8000/acp") == "http://localhost:8000/acp"
    assert resource_for("wss://agents.example.com:443/team/") == "https://agents.example.com/team/acp"
    assert canonical_url("https://Agents.Example.com:443/acp#x") == RESOURCE
    assert protected_resource_metadata_urls("https://h/team/acp") == [
        "https://h/.well-known/oauth-protected-resource/team/acp",
        "https://h/.well-known/oauth-protected-resource",
    ]
    # RFC 8414 §3.1: the well-known segment goes between the host and the issuer's path.
    assert authorization_server_metadata_urls("https://example.com/issuer1") == [
        "https://example.com/.well-known/oauth-authorization-server/issuer1",
        "https://example.com/issuer1/.well-known/openid-configuration",
        "https://example.com/.well-known/openid-configuration/issuer1",
    ]
    assert authorization_server_metadata_urls("https://example.com") == [
        "https://example.com/.well-known/oauth-authorization-server",
        "https://example.com/.well-known/openid-configuration",
    ]


async def test_discovery_follows_the_challenge(fake: FakeServer) -> None:
    async with httpx.AsyncClient(transport=fake.transport()) as http:
        resource, server = await discover(http, "wss://agents.example.com/acp")
    assert (resource.resource, resource.authorization_servers) == (RESOURCE, (ISSUER,))
    assert resource.scopes_supported == tuple(SCOPES)
    assert server.token_endpoint == f"{ISSUER}/token/" and server.device_authorization_endpoint == f"{ISSUER}/device/"
    assert fake.gets == [RESOURCE, METADATA, f"{ORIGIN}/.well-known/oauth-authorization-server/o"]


async def test_discovery_without_a_challenge_tries_the_well_known_urls(fake: FakeServer) -> None:
    fake.challenge = 'Bearer realm="acp"'
    async with httpx.AsyncClient(transport=fake.transport()) as http:
        resource, _ = await discover(http, ORIGIN)
    assert resource.metadata_url == METADATA
    assert fake.gets[1:3] == [f"{ORIGIN}/.well-known/oauth-protected-resource/acp", METADATA]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda fake: fake.server_document.update(issuer="https://evil.example/o"), "RFC 8414 §3.3"),
        (lambda fake: fake.resource_document.update(resource="https://other.example/acp"), "RFC 9728 §3.3"),
        (lambda fake: fake.server_document.update(token_endpoint="http://agents.example.com/o/token/"), "https"),
        (lambda fake: fake.resource_document.update(authorization_servers=[]), "no authorization_servers"),
    ],
    ids=["issuer-mismatch", "resource-mismatch", "plain-http-endpoint", "no-server"],
)
async def test_discovery_refuses_metadata_that_does_not_fit(
    fake: FakeServer, change: Callable[[FakeServer], None], message: str
) -> None:
    change(fake)
    async with httpx.AsyncClient(transport=fake.transport()) as http:
        with pytest.raises(LoginError, match=re.escape(message)):
            await discover(http, ORIGIN)


# -- PKCE, the loopback redirect, the device flow -----------------------------------------------------------


def test_pkce_pair() -> None:
    verifier, challenge = pkce_pair()
    assert 43 <= len(verifier) <= 128 and re.fullmatch(r"[A-Za-z0-9\-._~]+", verifier)
    expected = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    assert challenge == expected and pkce_pair()[0] != verifier


def test_the_authorization_url() -> None:
    server = AuthorizationServer.from_document(FakeServer().server_document, issuer=ISSUER, metadata_url="m")
    url = authorization_url(
        server,
        client_id="acp-client",
        redirect_uri="http://127.0.0.1:5000/callback",
        scopes=SCOPES,
        state="st",
        code_challenge="ch",
        resource=RESOURCE,
    )
    query = parse_qs(urlsplit(url).query)
    assert url.startswith(f"{ISSUER}/authorize/?")
    assert {name: values[0] for name, values in query.items()} == {
        "response_type": "code",
        "client_id": "acp-client",
        "redirect_uri": "http://127.0.0.1:5000/callback",
        "scope": " ".join(SCOPES),
        "state": "st",
        "code_challenge": "ch",
        "code_challenge_method": "S256",
        "resource": RESOURCE,
    }


async def test_the_loopback_redirect_checks_the_state() -> None:
    receiver = LoopbackReceiver("the-state", success_page="Signed in.")
    async with receiver.listening(), httpx.AsyncClient() as browser:
        callback = receiver.redirect_uri
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/callback", callback)
        forged = await browser.get(callback, params={"code": "stolen", "state": "another"})
        assert forged.status_code == 400 and "does not match" in forged.text
        assert (await browser.get(callback.replace("/callback", "/favicon.ico"))).status_code == 404
        answered = await browser.get(callback, params={"code": "the-code", "state": "the-state"})
        assert answered.status_code == 200 and "Signed in." in answered.text
        assert await receiver.wait(5) == "the-code"
    assert receiver.refused == 1


async def test_the_loopback_redirect_reports_a_refusal() -> None:
    receiver = LoopbackReceiver("s", success_page="")
    async with receiver.listening(), httpx.AsyncClient() as browser:
        await browser.get(receiver.redirect_uri, params={"error": "access_denied", "state": "s"})
        with pytest.raises(LoginError, match="refused: access_denied"):
            await receiver.wait(5)
    with pytest.raises(LoginError, match="no answer from the browser"):
        async with LoopbackReceiver("s", success_page="").listening() as waiting:
            await waiting.wait(0.05)


class Clock:
    """A clock that moves only when the poller sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def __call__(self) -> float:
        return self.now


DEVICE = DeviceAuthorization("dev-1", "WDJB-MJHT", f"{ISSUER}/activate", None, expires_in=30, interval=2)


async def test_device_polling_honours_interval_and_slow_down(fake: FakeServer) -> None:
    fake.token_answers = [
        (400, {"error": "authorization_pending"}),
        (400, {"error": "slow_down"}),
        (400, {"error": "authorization_pending"}),
        tokens("access-1"),
    ]
    server = AuthorizationServer.from_document(fake.server_document, issuer=ISSUER, metadata_url="m")
    clock = Clock()
    async with httpx.AsyncClient(transport=fake.transport()) as http:
        answer = await poll_device_token(
            http, server, DEVICE, client_id="acp-client", resource=RESOURCE, sleep=clock.sleep, clock=clock
        )
    assert answer.access_token == "access-1" and answer.refresh_token == "refresh-1"
    assert clock.sleeps == [2, 2, 7, 7]  # slow_down adds 5 seconds for good
    assert fake.token_forms[0] == {
        "grant_type": DEVICE_GRANT,
        "device_code": "dev-1",
        "client_id": "acp-client",
        "resource": RESOURCE,
    }


@pytest.mark.parametrize(
    ("answer", "message"),
    [({"error": "access_denied"}, "denied"), ({"error": "expired_token"}, "expired"), (None, "expired")],
)
async def test_device_polling_ends(fake: FakeServer, answer: dict[str, Any] | None, message: str) -> None:
    pending = (400, {"error": "authorization_pending"})
    fake.token_answers = [pending, (400, answer)] if answer is not None else [pending] * 20
    server = AuthorizationServer.from_document(fake.server_document, issuer=ISSUER, metadata_url="m")
    clock = Clock()
    async with httpx.AsyncClient(transport=fake.transport()) as http:
        with pytest.raises(LoginError, match=message):
            await poll_device_token(http, server, DEVICE, client_id="c", resource=None, sleep=clock.sleep, clock=clock)
    assert clock.now <= DEVICE.expires_in


# -- login and logout, the token store ---------------------------------------------------------------------


def browser_that_approves(answer: Callable[[str], None]) -> Callable[[str], None]:
    """An `opener`: the browser goes to the redirect with a code and the state it was given."""

    def open_url(url: str) -> None:
        query = {name: values[0] for name, values in parse_qs(urlsplit(url).query).items()}
        answer(f"{query['redirect_uri']}?code=the-code&state={query['state']}")

    return open_url


async def test_login_with_the_code_flow_stores_the_tokens(
    fake: FakeServer, store: TokenStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BROWSER", "a-browser")  # else, with no desktop here, the device flow is chosen
    fake.token_answers = [tokens("access-1")]
    visits: list[asyncio.Task[httpx.Response]] = []
    browser = httpx.AsyncClient()
    opener = browser_that_approves(lambda url: visits.append(asyncio.create_task(browser.get(url))))
    out = io.StringIO()
    options = LoginOptions(ORIGIN, scopes=["acp:connect"], open_browser=True, browser_wait=5)
    record = await login(options, store=store, out=out, opener=opener, transport=fake.transport())
    assert "Signed in to" in (await visits[0]).text
    await browser.aclose()
    exchange = fake.token_forms[0]
    assert exchange["grant_type"] == "authorization_code" and exchange["code"] == "the-code"
    assert exchange["client_id"] == "acp-client" and exchange["resource"] == RESOURCE
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/callback", exchange["redirect_uri"])
    assert len(exchange["code_verifier"]) >= 43
    assert (record.access_token, record.refresh_token, record.scope) == ("access-1", "refresh-1", "acp:connect")
    assert record.expires_at is not None and record.expires_at - time.time() > 3500
    assert store.load(RESOURCE) == record
    assert "access-1" not in out.getvalue()
    # Files: 0600 in a 0700 directory, no temporary left behind.
    assert stat.S_IMODE(os.stat(store.directory).st_mode) == 0o700
    [saved] = [path for path in store.directory.iterdir() if path.suffix == ".json"]
    assert stat.S_IMODE(os.stat(saved).st_mode) == 0o600
    assert not [path for path in store.directory.iterdir() if path.name.endswith(".tmp")]

    forgotten, revoked = await logout(ORIGIN, store=store, transport=fake.transport())
    assert forgotten == record and revoked
    assert [(form["token"], form["token_type_hint"]) for form in fake.revoked] == [
        ("refresh-1", "refresh_token"),
        ("access-1", "access_token"),
    ]
    assert store.load(RESOURCE) is None and await logout(ORIGIN, store=store) == (None, False)


async def test_login_uses_the_device_flow_when_asked(
    fake: FakeServer, store: TokenStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.token_answers = [tokens("access-d", "refresh-d")]

    async def no_wait(seconds: float) -> None:
        pass

    monkeypatch.setattr(asyncio, "sleep", no_wait)  # the poller's default sleep
    out = io.StringIO()
    options = LoginOptions(ORIGIN, device=True)
    record = await login(options, store=store, out=out, opener=pytest.fail, transport=fake.transport())
    assert record.access_token == "access-d" and record.scope == " ".join(SCOPES)
    assert f"open {ISSUER}/activate in any browser and enter the code WDJB-MJHT" in out.getvalue()
    assert fake.token_forms[0]["grant_type"] == DEVICE_GRANT


class Terminal(io.StringIO):
    """What login prints; a sign-in URL printed is visited, as a person would (`visits`)."""

    def __init__(self) -> None:
        super().__init__()
        self.browser = httpx.AsyncClient()
        self.visits: list[asyncio.Task[httpx.Response]] = []

    def write(self, text: str) -> int:
        if (found := re.search(r"(https://\S+/authorize/\?\S+)", text)) is not None:
            query = {name: values[0] for name, values in parse_qs(urlsplit(found.group(1)).query).items()}
            answer = f"{query['redirect_uri']}?code=the-code&state={query['state']}"
            self.visits.append(asyncio.create_task(self.browser.get(answer)))
        return super().write(text)


@pytest.mark.parametrize("offered", [True, False], ids=["device-offered", "device-not-offered"])
async def test_without_a_browser_here(
    fake: FakeServer, store: TokenStore, monkeypatch: pytest.MonkeyPatch, offered: bool
) -> None:
    """No BROWSER, no desktop (an ssh session): the device flow where the server offers it, else
    the URL printed for the user to open; never a browser started (Python's fallbacks are text
    browsers in this very terminal)."""
    for name in ("BROWSER", "DISPLAY", "WAYLAND_DISPLAY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("sys.platform", "linux")
    if not offered:
        del fake.server_document["device_authorization_endpoint"]
    fake.token_answers = [tokens("access-1")]

    async def no_wait(seconds: float) -> None:
        pass

    monkeypatch.setattr(asyncio, "sleep", no_wait)
    out = Terminal()
    record = await login(
        LoginOptions(ORIGIN, browser_wait=5), store=store, out=out, opener=pytest.fail, transport=fake.transport()
    )
    await out.browser.aclose()
    assert record.access_token == "access-1"
    assert fake.token_forms[0]["grant_type"] == (DEVICE_GRANT if offered else "authorization_code")
    assert ("enter the code WDJB-MJHT" in out.getvalue()) is offered
    assert ("Open this URL in a browser on this machine" in out.getvalue()) is not offered
    assert len(out.visits) == (0 if offered else 1)


def test_the_store_narrows_a_directory_and_ignores_damaged_records(tmp_path: Path) -> None:
    directory = tmp_path / "tokens"
    directory.mkdir(mode=0o755)
    os.chmod(directory, 0o755)
    store = TokenStore(directory)
    record = LoginRecord(RESOURCE, ISSUER, "acp-client", f"{ISSUER}/token/", "access-1", "refresh-1")
    path = store.save(record)
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert path.name.startswith("agents.example.com_acp-") and store.load(RESOURCE) == record
    assert store.path("http://agents.example.com/acp") != path  # http and https are two servers
    path.write_text("{not json")
    assert store.load(RESOURCE) is None
    path.write_text(json.dumps({**json.loads(record.to_json()), "version": 99}))
    assert store.load(RESOURCE) is None


# -- the stored sign-in as a TokenSource --------------------------------------------------------------------


def stored(store: TokenStore, *, access: str = "access-1", expires_in: float = 3600) -> LoginRecord:
    record = LoginRecord(
        RESOURCE, ISSUER, "acp-client", f"{ISSUER}/token/", access, "refresh-1", time.time() + expires_in, "acp:connect"
    )
    store.save(record)
    return record


async def test_a_refused_token_is_renewed_and_the_refresh_token_rotated(fake: FakeServer, store: TokenStore) -> None:
    stored(store)
    source = StoredLogin.for_url("wss://agents.example.com:443", store)
    assert source is not None and "access-1" not in repr(source)
    source.transport = fake.transport()
    assert await source.token() == "access-1"
    fake.token_answers = [tokens("access-2", "refresh-2")]
    assert await source.refresh("access-1") == "access-2"
    assert await source.token() == "access-2"
    assert fake.token_forms == [
        {"grant_type": "refresh_token", "refresh_token": "refresh-1", "client_id": "acp-client", "resource": RESOURCE}
    ]
    record = store.load(RESOURCE)
    assert record is not None and (record.access_token, record.refresh_token) == ("access-2", "refresh-2")
    # Refused again, and the server has no more: the refusal stands.
    fake.token_answers = [(400, {"error": "invalid_grant"})]
    assert await source.refresh("access-2") is None
    assert source.refreshes == 1


async def test_a_token_another_client_renewed_is_taken_as_it_is(fake: FakeServer, store: TokenStore) -> None:
    stored(store)
    source = StoredLogin.for_url(ORIGIN, store)
    assert source is not None
    source.transport = fake.transport()
    stored(store, access="access-from-another-client")
    assert await source.refresh("access-1") == "access-from-another-client"
    assert fake.token_forms == []  # no refresh: the refresh token was the other client's to spend
    store.remove(RESOURCE)  # signed out meanwhile
    assert await source.refresh("access-from-another-client") is None


async def test_a_token_about_to_expire_is_renewed_before_it_is_sent(fake: FakeServer, store: TokenStore) -> None:
    stored(store, expires_in=30)  # within the margin of a minute
    source = StoredLogin.for_url(ORIGIN, store)
    assert source is not None
    source.transport = fake.transport()
    fake.token_answers = [tokens("access-2", None)]  # no new refresh token: the old one stays
    assert await source.token() == "access-2"
    record = store.load(RESOURCE)
    assert record is not None and record.refresh_token == "refresh-1" and not record.expires_within(60)


def test_connection_options_use_the_stored_login_last(
    store: TokenStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import argparse

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("ACP_TOKEN", raising=False)
    parser = argparse.ArgumentParser()
    add_connection_arguments(parser)
    assert connection_options(parser.parse_args([ORIGIN])).token is None
    stored(store)
    assert isinstance(connection_options(parser.parse_args([ORIGIN])).token, StoredLogin)
    assert connection_options(parser.parse_args([ORIGIN, "-H", "Authorization: Bearer x"])).token is None
    monkeypatch.setenv("ACP_TOKEN", "from-the-environment")
    assert connection_options(parser.parse_args([ORIGIN])).token == "from-the-environment"


# -- the command line ----------------------------------------------------------------------------------------


def test_login_and_logout_are_commands_and_urls_stay_urls(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    with pytest.raises(SystemExit) as shown:
        client_main(["login", "--help"])
    assert shown.value.code == 0 and "usage: acp-client login" in capsys.readouterr().out
    assert client_main(["logout", "http://127.0.0.1:9"]) == 0
    assert "Not signed in to http://127.0.0.1:9/acp" in capsys.readouterr().out
    assert client_main(["login", "not-a-url"]) == 2
    assert "error: not an http(s):// or ws(s):// URL" in capsys.readouterr().err
    # Everything else is `acp-client URL ...` as before.
    assert client_main(["http://127.0.0.1:9", "--json"]) == 2
    assert "--json goes with --list" in capsys.readouterr().err


# -- the hint after a refusal --------------------------------------------------------------------------------


def refused(status: int, challenge: str | None, *, sent: bool = False) -> AuthenticationError:
    return AuthenticationError("POST", status, "", www_authenticate=challenge, credentials_sent=sent)


OAUTH = f'Bearer realm="acp", scope="acp:connect", resource_metadata="{METADATA}"'
INVALID = OAUTH.replace("scope=", 'error="invalid_token", scope=')
NO_SCOPE = OAUTH.replace('scope="acp:connect"', 'error="insufficient_scope", scope="acp:connect acp:session:control"')


@pytest.mark.parametrize(
    ("error", "credential", "hint"),
    [
        (refused(401, OAUTH), None, "signs users in with OAuth: run `acp-client login https://h`"),
        (refused(401, 'Bearer realm="acp"'), None, "requires authentication with a bearer token: set ACP_TOKEN"),
        (refused(401, 'Cookie realm="acp"'), None, "log in with the site's page in a browser"),
        (refused(401, None), None, "set ACP_TOKEN"),
        (
            refused(401, INVALID, sent=True),
            "token",
            "refused the token (expired, revoked or wrong): run `acp-client login https://h` and leave ACP_TOKEN",
        ),
        (
            refused(401, 'Bearer realm="acp", error="invalid_token"', sent=True),
            "token",
            "refused the token (expired, revoked or wrong): set a new one",
        ),
        (
            refused(401, INVALID, sent=True),
            "login",
            "refused the stored sign-in (expired or revoked), and it could not be renewed: `acp-client login https://h`",
        ),
        (
            refused(403, NO_SCOPE, sent=True),
            "login",
            "lacks a scope the server asks for (acp:connect acp:session:control): run `acp-client login https://h --sc",
        ),
        (refused(403, None, sent=True), "token", "not allowed here"),
    ],
    ids=["oauth", "bearer", "cookie", "none", "oauth-token-refused", "token-refused", "login-refused", "scope", "403"],
)
def test_the_hint_names_the_way_the_server_asks(error: AuthenticationError, credential: Any, hint: str) -> None:
    assert hint in refusal_hint(error, "http", url="https://h", credential=credential)


def test_the_websocket_hint_without_a_challenge() -> None:
    hint = refusal_hint(refused(403, None), "ws", url="wss://h")
    assert "requires authentication (`acp-client login wss://h` where it signs users in with OAuth" in hint
    assert "set ACP_TOKEN" in hint
