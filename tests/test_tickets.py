"""WebSocket tickets in process (acp_channels/_tickets.py): the endpoint (bearer callers, cookie
callers with Django's CSRF check, refusals), single use, expiry (an injected clock), the Origin
binding, the WebSocket edge (channels' communicator), and the system checks. Replays across
workers and the server's log are in test_tickets_live.py; the browser in test_browser.py.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

import pytest
from channels.layers import InMemoryChannelLayer
from channels.testing import WebsocketCommunicator
from django.core.cache.backends.locmem import LocMemCache
from django.test import AsyncClient
from django.utils.crypto import get_random_string

from acp_channels import _tickets as tickets
from acp_channels import oauth
from acp_channels._host import registry
from acp_channels._identity import Principal
from acp_channels._routing import build_asgi_application
from acp_channels._tickets import check_tickets
from acp_channels.auth import RequestContext
from tests import auth_fixtures as tokens

ALICE = Principal("token", "alice", "alice")
PAGE = "http://testserver"
#: RFC 6455 token characters: what fits a subprotocol.
TOKEN_CHARACTERS = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")


@pytest.fixture
def token_auth(settings: Any) -> None:
    settings.ACP_CHANNELS = {
        **settings.ACP_CHANNELS,
        "AGENT": "tests.wire_agent.create",
        "AUTHENTICATE": "acp_channels.auth.bearer_token",
        "TOKEN_LOOKUP": "tests.auth_fixtures.lookup",
        "REQUIRED_PERMISSION": "acp.use",
    }


async def cookie_user(context: RequestContext) -> Principal | None:
    """An authenticator standing in for django_user: the cookie `sessionid=alice` is alice's
    session (and marks the request as cookie-authenticated, as `context.user()` does)."""
    cookies = context.header("cookie") or ""
    if "sessionid=alice" not in cookies:
        return None
    context.used_session = True
    return Principal("user", "1", "alice")


async def scoped_token(context: RequestContext) -> Principal | None:
    """An authenticator standing in for oauth.access_token: `Bearer scoped:<scope>,<scope>` is
    alice's OAuth access token with those scopes (left on the context, as access_token does)."""
    token = context.bearer_token or ""
    if not token.startswith("scoped:"):
        return None
    setattr(context, oauth.TOKEN_SCOPES, tuple(token.removeprefix("scoped:").split(",")))
    return ALICE


@pytest.fixture
def cookie_auth(settings: Any) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "AUTHENTICATE": "tests.test_tickets.cookie_user"}


def principal_of(ticket: tickets.Taken | None) -> Principal | None:
    return None if ticket is None else ticket.principal


async def taken(ticket: str, origin: str | None) -> Principal | None:
    """The principal a ticket stood for (tickets.take), or None."""
    return principal_of(await tickets.take(ticket, origin))


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# -- the endpoint ------------------------------------------------------------------------------


async def test_a_bearer_caller_gets_a_ticket_without_csrf(token_auth: None) -> None:
    client = AsyncClient(enforce_csrf_checks=True)
    response = await client.post("/acp/tickets", headers={**bearer(tokens.ALICE), "Origin": PAGE})
    assert response.status_code == 200, response.content
    body = response.json()
    assert set(body) == {"ticket", "subprotocol", "expiresIn", "expiresAt"}
    assert TOKEN_CHARACTERS.match(body["ticket"]) and len(body["ticket"]) >= 32
    assert body["subprotocol"] == f"acp-ticket.{body['ticket']}"
    assert body["expiresIn"] == 60.0 and body["expiresAt"].endswith("Z")
    assert response["Cache-Control"] == "no-store"
    assert await taken(body["ticket"], PAGE) == ALICE


async def test_the_endpoint_refuses_as_acp_does(token_auth: None) -> None:
    client = AsyncClient()
    requests = Lines()
    django_request = logging.getLogger("django.request")
    django_request.addHandler(requests)
    try:
        missing = await client.post("/acp/tickets")
    finally:
        django_request.removeHandler(requests)
    # A refusal the client caused is INFO, as on /acp (acp_channels._logs), not WARNING.
    assert requests.levels == ["INFO"], requests.lines
    assert missing.status_code == 401 and missing["WWW-Authenticate"] == 'Bearer realm="acp"'
    wrong = await client.post("/acp/tickets", headers=bearer("wrong-token"))
    assert wrong.status_code == 401 and 'error="invalid_token"' in wrong["WWW-Authenticate"]
    assert (await client.post("/acp/tickets", headers=bearer(tokens.CAROL))).status_code == 403  # no permission
    foreign = await client.post("/acp/tickets", headers={**bearer(tokens.ALICE), "Origin": "http://evil.example"})
    assert foreign.status_code == 403 and foreign.content == b"origin not allowed"
    get = await client.get("/acp/tickets", headers=bearer(tokens.ALICE))
    assert get.status_code == 405 and get["Allow"] == "POST"
    for response in (missing, wrong, foreign, get):
        assert tokens.ALICE.encode() not in response.content


async def test_a_cookie_caller_needs_the_csrf_token(cookie_auth: None) -> None:
    client = AsyncClient(enforce_csrf_checks=True)
    client.cookies["sessionid"] = "alice"
    refused = await client.post("/acp/tickets", headers={"Origin": PAGE})
    assert refused.status_code == 403 and refused.content.decode() == tickets.CSRF_FAILED
    secret = get_random_string(32)
    client.cookies["csrftoken"] = secret
    wrong = await client.post("/acp/tickets", headers={"Origin": PAGE, "X-CSRFToken": get_random_string(32)})
    assert wrong.status_code == 403
    other_site = await client.post("/acp/tickets", headers={"Origin": "http://evil.example", "X-CSRFToken": secret})
    assert other_site.status_code == 403
    accepted = await client.post("/acp/tickets", headers={"Origin": PAGE, "X-CSRFToken": secret})
    assert accepted.status_code == 200, accepted.content
    assert await taken(accepted.json()["ticket"], PAGE) == Principal("user", "1")
    # Without the cookie the caller is not authenticated at all: 401, before any CSRF question.
    assert (await AsyncClient(enforce_csrf_checks=True).post("/acp/tickets")).status_code == 401


# -- the store ---------------------------------------------------------------------------------


async def test_a_store_that_fails_is_503_and_a_refusal(token_auth: None, monkeypatch: pytest.MonkeyPatch) -> None:
    ticket, _ = await tickets.issue(ALICE, PAGE)

    class Down:
        def __getattr__(self, name: str) -> Any:
            raise ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(tickets, "_store", Down)
    response = await AsyncClient().post("/acp/tickets", headers=bearer(tokens.ALICE))
    assert response.status_code == 503 and response["Retry-After"] == "1"
    assert response.content.decode() == tickets.STORE_UNAVAILABLE
    assert await taken(ticket, PAGE) is None


async def test_a_ticket_is_taken_once() -> None:
    ticket, _ = await tickets.issue(ALICE, PAGE)
    assert await taken(ticket, PAGE) == ALICE
    assert await taken(ticket, PAGE) is None
    assert await taken("never-issued", PAGE) is None


def test_of_two_takes_at_once_one_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    """The take is a read, then a delete that reports: two workers that both read the entry
    before either deletes it (forced here) get one principal between them."""
    store = tickets._store()
    both_read = threading.Barrier(2)

    class ReadTogether:
        def get(self, key: str) -> Any:
            value = store.get(key)
            both_read.wait(5)
            return value

        def delete(self, key: str) -> bool:
            return bool(store.delete(key))

    ticket, _ = tickets.issue_sync(ALICE, None)
    monkeypatch.setattr(tickets, "_store", ReadTogether)
    got: list[Principal | None] = []
    threads = [
        threading.Thread(target=lambda: got.append(principal_of(tickets.take_sync(ticket, None)))) for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(got, key=lambda principal: principal is None) == [ALICE, None]


async def test_a_ticket_is_bound_to_its_origin() -> None:
    ticket, _ = await tickets.issue(ALICE, PAGE)
    assert await taken(ticket, "http://other.example") is None
    assert await taken(ticket, PAGE) is None  # a wrong try spends it
    no_origin, _ = await tickets.issue(ALICE, None)  # a client that sends no Origin
    assert await taken(no_origin, PAGE) is None
    no_origin, _ = await tickets.issue(ALICE, None)
    assert await taken(no_origin, None) == ALICE


async def test_a_ticket_expires(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    clock = [1_000_000.0]
    monkeypatch.setattr(tickets, "now", lambda: clock[0])
    fresh, expires = await tickets.issue(ALICE, PAGE)
    stale, _ = await tickets.issue(ALICE, PAGE)
    assert expires == clock[0] + 60.0
    clock[0] += 59.9
    assert await taken(fresh, PAGE) == ALICE
    clock[0] += 0.1
    assert await taken(stale, PAGE) is None
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "TICKET_SECONDS": 2}
    short, expires = await tickets.issue(ALICE, PAGE)
    assert expires == clock[0] + 2
    clock[0] += 2
    assert await taken(short, PAGE) is None


# -- the WebSocket edge --------------------------------------------------------------------------


def upgrade(application: Any, offered: list[str], origin: str | None = PAGE) -> WebsocketCommunicator:
    headers = [(b"host", b"testserver")] + ([(b"origin", origin.encode())] if origin else [])
    return WebsocketCommunicator(application, "/acp", headers=headers, subprotocols=offered)


class Lines(logging.Handler):
    """Every line a logger writes (ours does not propagate: the demo's LOGGING)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.levels: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))
        self.levels.append(record.levelname)


async def test_the_websocket_takes_a_ticket_once_from_its_origin(token_auth: None) -> None:
    application = build_asgi_application()
    ticket, _ = await tickets.issue(ALICE, PAGE)
    accepted = upgrade(application, ["acp", f"acp-ticket.{ticket}"])
    connected, subprotocol = await accepted.connect(5)
    try:
        assert connected and subprotocol == "acp"
        connection_id = dict(accepted.response_headers or [])[b"acp-connection-id"].decode()
        host = registry.get(connection_id)
        assert host is not None and host.principal == ALICE
    finally:
        await accepted.disconnect()
    # After the first upgrade: the server's start configures LOGGING, which drops handlers below it.
    log = Lines()
    ours = logging.getLogger("acp_channels")
    ours.addHandler(log)
    try:
        before = len(registry)
        replay = upgrade(application, ["acp", f"acp-ticket.{ticket}"])
        assert await replay.connect(5) == (False, 1000)  # closed before accept: the server answers 403
        # Issued to a client without an Origin, offered by a page (an allowed origin: its own).
        elsewhere, _ = await tickets.issue(ALICE, None)
        from_page = upgrade(application, ["acp", f"acp-ticket.{elsewhere}"], PAGE)
        assert await from_page.connect(5) == (False, 1000)
        assert len(registry) == before  # no agent was started
    finally:
        ours.removeHandler(log)
    assert sum(tickets.TICKET_REFUSED in line for line in log.lines) == 2, log.lines
    logged = "\n".join(log.lines)
    assert ticket not in logged and elsewhere not in logged


async def test_a_ticket_keeps_the_oauth_scopes_it_was_bought_with(settings: Any) -> None:
    """An OAuth token's scopes go with its ticket, and the upgrade is checked against them as the
    token itself would be: attaching as a controller needs acp:session:control."""
    settings.ACP_CHANNELS = {
        **settings.ACP_CHANNELS,
        "AGENT": "tests.wire_agent.create",
        "AUTHENTICATE": "tests.test_tickets.scoped_token",
    }
    client = AsyncClient()
    connect_only = await client.post("/acp/tickets", headers={**bearer("scoped:acp:connect"), "Origin": PAGE})
    assert connect_only.status_code == 200, connect_only.content
    assert (await tickets.take(connect_only.json()["ticket"], PAGE)) == tickets.Taken(ALICE, ("acp:connect",))
    application = build_asgi_application()

    async def attach(scopes: str) -> tuple[bool, Any]:
        response = await client.post("/acp/tickets", headers={**bearer(f"scoped:{scopes}"), "Origin": PAGE})
        offered = ["acp", f"acp-ticket.{response.json()['ticket']}"]
        headers = [(b"host", b"testserver"), (b"origin", PAGE.encode())]
        socket = WebsocketCommunicator(
            application, "/acp?acp_attach_session=s-1", headers=headers, subprotocols=offered
        )
        outcome = await socket.connect(5)
        if outcome[0]:
            closed = await socket.receive_output(5)
            await socket.disconnect()
            return outcome[0], closed.get("code")
        return outcome

    assert await attach("acp:connect") == (False, 1000)  # refused before accept: insufficient scope
    # With the scope, the attach itself is considered (and refused: there is no session s-1).
    assert await attach("acp:connect,acp:session:control") == (True, 4404)


# -- system checks -------------------------------------------------------------------------------


def check_ids(messages: list[Any]) -> list[str]:
    return [message.id for message in messages]


REDIS_LAYER = {"default": {"BACKEND": "acp_channels.layers.RedisChannelLayer", "CONFIG": {"hosts": ["redis://x"]}}}
REDIS_CACHE = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": "redis://x"}}


def test_one_process_with_its_memory_is_clean() -> None:
    assert check_tickets() == []


def test_several_workers_need_a_shared_ticket_cache(settings: Any) -> None:
    settings.CHANNEL_LAYERS = REDIS_LAYER
    [error] = check_tickets()
    assert error.id == "acp_channels.E091" and "LocMemCache" in error.msg
    assert "RedisCache" in error.hint and "TICKET_CACHE" in error.hint
    settings.CACHES = REDIS_CACHE
    assert check_tickets() == []


class SiteLocMemCache(LocMemCache):
    """A site's own cache on LocMemCache: memory of one process all the same."""


class SiteInMemoryLayer(InMemoryChannelLayer):
    """A site's own in-memory layer: one process."""


def test_a_subclass_of_the_per_process_backends_is_per_process_too(settings: Any) -> None:
    settings.CHANNEL_LAYERS = REDIS_LAYER
    settings.CACHES = {"default": {"BACKEND": "tests.test_tickets.SiteLocMemCache"}}
    [error] = check_tickets()
    assert error.id == "acp_channels.E091" and "SiteLocMemCache" in error.msg
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "tests.test_tickets.SiteInMemoryLayer"}}
    assert check_tickets() == []  # one process: its memory is enough


def test_the_ticket_cache_must_keep_tickets_and_exist(settings: Any) -> None:
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.dummy.DummyCache"}}
    assert check_ids(check_tickets()) == ["acp_channels.E091"]
    settings.CACHES = REDIS_CACHE
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "TICKET_CACHE": "tickets"}
    [error] = check_tickets()
    assert error.id == "acp_channels.E091" and "'tickets' is not an alias in CACHES" in error.msg


def test_a_ticket_lives_at_most_60_seconds(settings: Any) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "TICKET_SECONDS": 61}
    assert check_ids(check_tickets()) == ["acp_channels.E090"]
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "TICKET_SECONDS": 0.5}
    assert check_tickets() == []


def test_the_bearer_subprotocol_is_warned_about(settings: Any) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "ALLOW_BEARER_SUBPROTOCOL": True}
    [warning] = check_tickets()
    assert warning.id == "acp_channels.W090" and "acp.bearer.<token>" in warning.msg
