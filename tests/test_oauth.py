"""OAuth in process (acp_channels.oauth): the scope rule, what an attach asks, the challenges,
the RFC 9728 metadata view, the system checks (the extra missing among them) and a WebSocket
upgrade refused before accept. Tokens issued by django-oauth-toolkit, on a live server with its
database: tests/test_oauth_live.py."""

from __future__ import annotations

import importlib.util
import json
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator
from django.test import AsyncRequestFactory

from acp_channels import _oauth_checks, oauth
from acp_channels._host import registry
from acp_channels._routing import build_asgi_application
from acp_channels.auth import Refused, RequestContext
from tests.test_auth import ws_context

METADATA = "http://testserver/.well-known/oauth-protected-resource"
CONNECT = "acp:connect"
OBSERVE = "acp:session:observe"
CONTROL = "acp:session:control"


@pytest.fixture
def oauth_site(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # As if oauth2_provider were installed: really adding it would leave its system checks
    # registered for the rest of the process (they then fail without the app).
    monkeypatch.setattr(_oauth_checks, "installed_apps", lambda: [*settings.INSTALLED_APPS, "oauth2_provider"])
    settings.ACP_CHANNELS = {
        **settings.ACP_CHANNELS,
        "AGENT": "tests.wire_agent.create",
        "AUTHENTICATE": oauth.AUTHENTICATOR,
        "OAUTH_AUTHORIZATION_SERVERS": ["https://issuer.example/o"],
    }


def http_context(path: str = "/acp", **headers: str) -> RequestContext:
    return RequestContext.for_http(AsyncRequestFactory().post(path, headers=headers))


# -- the scope rule ---------------------------------------------------------------------------------


def test_the_scope_rule() -> None:
    assert oauth.required_scope(None) == [CONNECT]
    assert oauth.required_scope("observer") == [CONNECT, OBSERVE]
    assert oauth.required_scope("controller") == [CONNECT, CONTROL]


def test_control_grants_observing_and_nothing_grants_connect_but_itself() -> None:
    assert oauth.granted([CONNECT, OBSERVE], [CONNECT, CONTROL]) == []
    assert oauth.granted([CONNECT, CONTROL], [CONNECT, OBSERVE]) == [CONTROL]
    assert oauth.granted([CONNECT], [OBSERVE, CONTROL]) == [CONNECT]
    assert oauth.granted([CONNECT], []) == [CONNECT]


def test_scopes_renamed_by_the_setting(settings: Any) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "OAUTH_SCOPES": {"connect": "agents"}}
    assert oauth.required_scope("observer") == ["agents", OBSERVE]


def test_what_an_attach_asks_over_http_and_websocket() -> None:
    assert oauth.required_scopes(http_context()) == [CONNECT]
    assert oauth.required_scopes(http_context(**{"Acp-Attach-Session": "s1"})) == [CONNECT, CONTROL]
    observer = http_context(**{"Acp-Attach-Session": "s1", "Acp-Attach-Role": "observer"})
    assert oauth.required_scopes(observer) == [CONNECT, OBSERVE]
    # A role alone attaches nothing; an unknown role is asked the controller's scope.
    assert oauth.required_scopes(http_context(**{"Acp-Attach-Role": "observer"})) == [CONNECT]
    assert oauth.required_scopes(http_context(**{"Acp-Attach-Session": "s1", "Acp-Attach-Role": "x"})) == [
        CONNECT,
        CONTROL,
    ]
    # Browsers' WebSockets attach by the query; HTTP never reads it.
    query = b"acp_attach_session=s1&acp_attach_role=observer"
    assert oauth.required_scopes(ws_context(query_string=query)) == [CONNECT, OBSERVE]
    assert oauth.required_scopes(ws_context(("acp-attach-session", "s1"))) == [CONNECT, CONTROL]
    assert oauth.required_scopes(http_context("/acp?acp_attach_session=s1")) == [CONNECT]


# -- refusals -----------------------------------------------------------------------------------------


async def test_no_token_is_401_naming_the_metadata_and_the_scope(oauth_site: None) -> None:
    with pytest.raises(Refused) as refused:
        await oauth.access_token(http_context())
    assert (refused.value.status, refused.value.text) == (401, "authentication required")
    assert refused.value.challenge == f'Bearer realm="acp", scope="acp:connect", resource_metadata="{METADATA}"'
    with pytest.raises(Refused) as refused:
        await oauth.access_token(http_context(Authorization="Basic YWxpY2U6c2VjcmV0"))
    assert refused.value.challenge == (
        f'Bearer realm="acp", error="invalid_token", scope="acp:connect", resource_metadata="{METADATA}"'
    )


async def test_the_metadata_url_follows_the_resource_setting(settings: Any, oauth_site: None) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "OAUTH_RESOURCE": "https://agents.example.com/acp"}
    with pytest.raises(Refused) as refused:
        await oauth.access_token(ws_context(("host", "internal:8000"), ("acp-attach-session", "s")))
    assert refused.value.challenge == (
        'Bearer realm="acp", scope="acp:connect acp:session:control", '
        'resource_metadata="https://agents.example.com/.well-known/oauth-protected-resource"'
    )


def test_a_challenge_quotes_what_it_carries() -> None:
    refused = oauth.refusal(http_context(), 401, "x", [CONNECT], "invalid_token", 'say "no" \\ twice')
    assert refused.challenge is not None
    assert 'error_description="say \\"no\\" \\\\ twice"' in refused.challenge


async def test_an_insufficient_scope_is_403_with_the_challenge(
    oauth_site: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Token:
        pk = 7
        user = None
        application = None
        scope = OBSERVE

    monkeypatch.setattr(oauth, "_validate", lambda token, resource: (Token(), None, None))
    with pytest.raises(Refused) as refused:
        await oauth.access_token(http_context(Authorization="Bearer abc"))
    assert (refused.value.status, refused.value.text) == (403, "insufficient scope: the token needs acp:connect")
    assert refused.value.challenge == (
        f'Bearer realm="acp", error="insufficient_scope", scope="acp:connect", resource_metadata="{METADATA}"'
    )
    Token.scope = f"{CONNECT} {OBSERVE}"
    context = http_context(Authorization="Bearer abc")
    assert oauth.token_scopes(context) is None
    principal = await oauth.access_token(context)
    assert (principal.kind, principal.id, principal.credential) == ("oauth-client", "", "oauth2_provider:7")
    # What a ticket issued on this request keeps, and checks at its upgrade.
    assert oauth.token_scopes(context) == (CONNECT, OBSERVE)
    oauth.refuse_unless_granted(
        ws_context(query_string=b"acp_attach_session=s&acp_attach_role=observer"), (CONNECT, OBSERVE)
    )
    with pytest.raises(Refused) as refused:
        oauth.refuse_unless_granted(ws_context(query_string=b"acp_attach_session=s"), (CONNECT, OBSERVE))
    assert (
        refused.value.status == 403 and refused.value.text == "insufficient scope: the token needs acp:session:control"
    )
    with pytest.raises(Refused) as refused:
        await oauth.access_token(http_context(Authorization="Bearer abc", **{"Acp-Attach-Session": "s"}))
    assert refused.value.status == 403 and 'scope="acp:connect acp:session:control"' in str(refused.value.challenge)


async def test_the_endpoint_sends_the_403_challenge(oauth_site: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from acp_channels._views import acp_endpoint

    class Token:
        pk = 8
        user = None
        application = None
        scope = ""

    monkeypatch.setattr(oauth, "_validate", lambda token, resource: (Token(), None, None))
    request = AsyncRequestFactory().post(
        "/acp", data="{}", content_type="application/json", headers={"Authorization": "Bearer abc"}
    )
    response = await acp_endpoint(request)
    assert response.status_code == 403
    assert response["WWW-Authenticate"].startswith('Bearer realm="acp", error="insufficient_scope"')


async def test_websocket_upgrades_are_refused_before_accept(oauth_site: None) -> None:
    application = build_asgi_application()
    before = len(registry)
    for headers in ([], [(b"authorization", b"Basic YWxpY2U6c2VjcmV0")]):
        communicator = WebsocketCommunicator(application, "/acp", headers=[(b"host", b"testserver"), *headers])
        assert await communicator.connect(5) == (False, 1000)  # closed before accept: a server answers 403
    assert len(registry) == before


# -- the metadata -------------------------------------------------------------------------------------


async def test_the_metadata_document(oauth_site: None) -> None:
    response = await oauth.metadata(AsyncRequestFactory().get("/.well-known/oauth-protected-resource"))
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    assert response["Access-Control-Allow-Origin"] == "*"
    assert json.loads(response.content) == {
        "resource": "http://testserver/acp",
        "authorization_servers": ["https://issuer.example/o"],
        "scopes_supported": [CONNECT, OBSERVE, CONTROL],
        "bearer_methods_supported": ["header"],
    }
    # RFC 9728 §3.1: the resource's path after the well-known one; another path is 404.
    found = await oauth.metadata(AsyncRequestFactory().get("/.well-known/oauth-protected-resource/acp"), "acp")
    assert found.status_code == 200 and found.content == response.content
    assert (await oauth.metadata(AsyncRequestFactory().get("/"), "other")).status_code == 404
    assert (await oauth.metadata(AsyncRequestFactory().post("/"))).status_code == 405


async def test_no_metadata_without_oauth() -> None:
    response = await oauth.metadata(AsyncRequestFactory().get("/.well-known/oauth-protected-resource"))
    assert response.status_code == 404


def test_the_metadata_is_routed(client: Any, oauth_site: None) -> None:
    response = client.get("/.well-known/oauth-protected-resource")
    assert response.status_code == 200 and response.json()["resource"] == "http://testserver/acp"


# -- system checks ----------------------------------------------------------------------------------


def check_ids() -> list[str]:
    return [message.id or "" for message in _oauth_checks.check_oauth()]


def test_no_oauth_no_messages() -> None:
    assert check_ids() == []


def test_without_the_extra_installed(oauth_site: None, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        _oauth_checks.importlib.util,
        "find_spec",
        lambda name, *args: None if name == "oauth2_provider" else real(name, *args),
    )
    [message] = _oauth_checks.check_oauth()
    assert message.id == "acp_channels.E073" and message.level >= 40
    assert "django-oauth-toolkit is not installed" in message.msg
    assert message.hint is not None and "pip install 'acp-channels[oauth]'" in message.hint


def test_an_oauth_setting_alone_needs_the_extra(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "OAUTH_RESOURCE": "https://agents.example.com/acp"}
    monkeypatch.setattr(_oauth_checks.importlib.util, "find_spec", lambda name, *args: None)
    assert check_ids() == ["acp_channels.E073"]


def test_installed_but_not_an_app_and_no_authorization_server(
    settings: Any, oauth_site: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert check_ids() == []
    monkeypatch.setattr(_oauth_checks, "installed_apps", lambda: list(settings.INSTALLED_APPS))  # the demo's: without
    assert check_ids() == ["acp_channels.E074"]
    monkeypatch.setattr(_oauth_checks, "installed_apps", lambda: [*settings.INSTALLED_APPS, "oauth2_provider"])
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "OAUTH_AUTHORIZATION_SERVERS": []}
    assert check_ids() == ["acp_channels.W070"]


@pytest.mark.parametrize(
    ("key", "value", "check_id"),
    [
        ("OAUTH_RESOURCE", "/acp", "acp_channels.E070"),
        ("OAUTH_AUTHORIZATION_SERVERS", "https://issuer.example/o", "acp_channels.E071"),
        ("OAUTH_AUTHORIZATION_SERVERS", ["issuer.example"], "acp_channels.E071"),
        ("OAUTH_SCOPES", {"connect": "two words"}, "acp_channels.E072"),
        ("OAUTH_SCOPES", {"admin": "acp:admin"}, "acp_channels.E072"),
    ],
)
def test_values_are_checked(settings: Any, key: str, value: Any, check_id: str) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, key: value}
    assert check_id in check_ids()
