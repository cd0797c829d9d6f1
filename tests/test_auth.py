"""Authentication in process: the request context, refusals, the authenticators, the shared-token
lookup, connections bound to their principal (here and on a host's worker), the per-principal
quota, the audit lines, the WebSocket edge (channels' communicator), and where channels'
AuthMiddlewareStack is used. The live counterparts are in test_auth_live.py.
"""

from __future__ import annotations

import hmac
import logging
from typing import Any

import pytest
from channels.auth import AuthMiddleware
from channels.testing import WebsocketCommunicator

from acp_channels import _gateway as gateway
from acp_channels import auth
from acp_channels._host import QuotaExceeded, registry
from acp_channels._identity import ANONYMOUS, Principal
from acp_channels._routing import build_asgi_application
from acp_channels._worker import new_connection_id
from acp_channels.auth import Refused, RequestContext, authenticate
from tests import auth_fixtures as tokens
from tests.auth_fixtures import FakeUser

ALICE = Principal("token", "alice", "alice")
BOB = Principal("token", "bob", "bob")
BEARER = "acp_channels.auth.bearer_token"


def websocket_scope(*headers: tuple[str, str], subprotocols: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "type": "websocket",
        "path": "/acp",
        "headers": [(name.encode(), value.encode()) for name, value in headers],
        "subprotocols": subprotocols or [],
        "client": ("192.0.2.7", 50000),
        **extra,
    }


def ws_context(*headers: tuple[str, str], subprotocols: list[str] | None = None, **extra: Any) -> RequestContext:
    return RequestContext.for_websocket(websocket_scope(*headers, subprotocols=subprotocols, **extra))


@pytest.fixture
def token_auth(settings: Any) -> None:
    settings.ACP_CHANNELS = {
        **settings.ACP_CHANNELS,
        "AUTHENTICATE": BEARER,
        "TOKEN_LOOKUP": "tests.auth_fixtures.lookup",
        "REQUIRED_PERMISSION": "acp.use",
    }


# -- the request context ---------------------------------------------------------------------------


def test_context_reads_the_first_header_value_and_the_address() -> None:
    context = ws_context(("X-Thing", "one"), ("x-thing", "two"))
    assert context.header("x-thing") == "one"
    assert context.header("X-THING") == "one"
    assert context.header("absent") is None
    assert context.remote_address == "192.0.2.7"
    assert context.transport == "websocket"


@pytest.mark.parametrize(
    ("authorization", "token"),
    [("Bearer abc", "abc"), ("bearer  abc ", "abc"), ("BEARER abc", "abc"), ("Basic abc", None), ("Bearer", None)],
)
def test_bearer_token_from_the_authorization_header(authorization: str, token: str | None) -> None:
    assert ws_context(("authorization", authorization)).bearer_token == token


def test_bearer_token_from_the_subprotocol_only_when_allowed(settings: Any) -> None:
    """Off by default (browsers use tickets); ALLOW_BEARER_SUBPROTOCOL for old clients."""
    assert ws_context(subprotocols=["acp", "acp.bearer.s3cret-_x"]).bearer_token is None
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "ALLOW_BEARER_SUBPROTOCOL": True}
    context = ws_context(subprotocols=["acp", "acp.bearer.s3cret-_x"])
    assert context.bearer_token == "s3cret-_x"
    assert ws_context(subprotocols=["acp", "acp.bearer."]).bearer_token is None
    assert ws_context(("authorization", "Bearer header"), subprotocols=["acp.bearer.sub"]).bearer_token == "header"
    http_scope = {**websocket_scope(), "type": "http", "subprotocols": ["acp.bearer.sub"]}
    assert RequestContext("http", http_scope).bearer_token is None


def test_never_a_token_from_the_query_string() -> None:
    context = ws_context(query_string=b"access_token=abc&token=abc")
    assert context.bearer_token is None


def test_refusal_constructors() -> None:
    missing = Refused.unauthenticated()
    assert (missing.status, missing.reason, missing.challenge) == (401, "authentication required", 'Bearer realm="acp"')
    invalid = Refused.invalid_token()
    assert invalid.challenge == 'Bearer realm="acp", error="invalid_token"'
    forbidden = Refused.forbidden()
    assert (forbidden.status, forbidden.challenge) == (403, None)
    with pytest.raises(ValueError):
        Refused(500, "no")


# -- authenticate ------------------------------------------------------------------------------------


async def test_no_authenticator_is_anonymous() -> None:
    assert await authenticate(ws_context()) is ANONYMOUS


async def test_bearer_token_principals_users_and_refusals(token_auth: None) -> None:
    assert await authenticate(ws_context(("authorization", f"Bearer {tokens.ALICE}"))) == ALICE
    dave = await authenticate(ws_context(("authorization", f"Bearer {tokens.DAVE}")))
    assert dave == Principal("user", "4") and dave.display == "dave"
    refusals = {
        "none": ws_context(),
        "wrong": ws_context(("authorization", "Bearer wrong-token")),
        "basic": ws_context(("authorization", "Basic abc")),
        "no-permission": ws_context(("authorization", f"Bearer {tokens.CAROL}")),
    }
    seen: dict[str, tuple[int, str | None]] = {}
    for name, context in refusals.items():
        with pytest.raises(Refused) as refused:
            await authenticate(context)
        seen[name] = (refused.value.status, refused.value.challenge)
        assert "wrong-token" not in str(refused.value) and tokens.CAROL not in str(refused.value)
    assert seen == {
        "none": (401, 'Bearer realm="acp"'),
        "wrong": (401, 'Bearer realm="acp", error="invalid_token"'),
        "basic": (401, 'Bearer realm="acp", error="invalid_token"'),
        "no-permission": (403, None),
    }


async def test_a_sync_token_lookup_runs(settings: Any, token_auth: None) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "TOKEN_LOOKUP": "tests.auth_fixtures.sync_lookup"}
    assert await authenticate(ws_context(("authorization", f"Bearer {tokens.BOB}"))) == BOB


def sync_authenticator(context: RequestContext) -> Principal | None:
    return Principal("custom", context.header("x-user") or "") if context.header("x-user") else None


async def test_a_sync_authenticator_and_none_for_no_credentials(settings: Any) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "AUTHENTICATE": "tests.test_auth.sync_authenticator"}
    assert await authenticate(ws_context(("x-user", "zoe"))) == Principal("custom", "zoe")
    with pytest.raises(Refused) as refused:
        await authenticate(ws_context())
    assert refused.value.status == 401


async def test_an_inactive_user_is_not_a_principal(token_auth: None) -> None:
    with pytest.raises(Refused) as refused:
        await authenticate(ws_context(("authorization", f"Bearer {tokens.INACTIVE}")))
    assert refused.value.status == 401


async def test_settings_tokens_compares_every_entry(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "TOKENS": {"first-secret": "team", "second": "ops", "x": "y"}}
    compared: list[bytes] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        compared.append(b)
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    assert await auth.settings_tokens("first-secret") == Principal("token", "team")
    assert len(compared) == 3  # no early exit on the first (matching) entry
    assert await auth.settings_tokens("first-secre") is None
    assert await auth.settings_tokens("") is None


# -- cross-site use of a session cookie ------------------------------------------------------------


class SessionUser(FakeUser):
    pass


def session_context(*headers: tuple[str, str]) -> RequestContext:
    return ws_context(*headers, user=SessionUser(1, "alice"))


@pytest.mark.parametrize(
    ("headers", "refused"),
    [
        ((), False),
        ((("sec-fetch-site", "same-origin"),), False),
        ((("sec-fetch-site", "none"),), False),
        ((("sec-fetch-site", "cross-site"),), True),
        ((("sec-fetch-site", "same-site"),), True),
        ((("sec-fetch-site", "cross-site"), ("origin", "https://editor.example")), False),  # listed: trusted
        ((("sec-fetch-site", "cross-site"), ("origin", "https://other.example")), True),
    ],
)
async def test_cookie_requests_from_another_site_are_refused(
    settings: Any, headers: tuple[tuple[str, str], ...], refused: bool
) -> None:
    settings.ACP_CHANNELS = {
        **settings.ACP_CHANNELS,
        "AUTHENTICATE": "acp_channels.auth.django_user",
        "CORS_ALLOWED_ORIGINS": ["https://editor.example"],
    }
    if not refused:
        assert await authenticate(session_context(*headers)) == Principal("user", "1")
        return
    with pytest.raises(Refused) as refusal:
        await authenticate(session_context(*headers))
    assert (refusal.value.status, refusal.value.reason) == (403, "cross-site request refused")


async def test_token_requests_are_not_subject_to_the_cookie_rule(token_auth: None) -> None:
    """A bearer token is not sent by the browser on its own: another site cannot use it."""
    context = ws_context(("authorization", f"Bearer {tokens.ALICE}"), ("sec-fetch-site", "cross-site"))
    assert await authenticate(context) == ALICE


async def test_django_user_needs_a_logged_in_user(settings: Any) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "AUTHENTICATE": "acp_channels.auth.django_user"}
    for context in (ws_context(), ws_context(user=FakeUser(1, "x", is_authenticated=False))):
        with pytest.raises(Refused) as refused:
            await authenticate(context)
        # Not a Bearer challenge: no token would do (clients say "log in on the site").
        assert (refused.value.status, refused.value.challenge) == (401, 'Cookie realm="acp"')


# -- bound to the principal: here and on the host's worker -----------------------------------------


@pytest.fixture
def wire_agent(settings: Any) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "AGENT": "tests.wire_agent.create"}


async def test_locate_finds_a_connection_for_its_owner_only(wire_agent: None) -> None:
    from acp_channels._agents import create_agent_channel

    host = registry.create(
        create_agent_channel, "http", connection_id=new_connection_id(), max_buffered_bytes=1 << 20, principal=ALICE
    )
    try:
        assert gateway.locate(host.connection_id, ALICE) is not None
        assert gateway.locate(host.connection_id, Principal("token", "alice", "another display")) is not None
        assert gateway.locate(host.connection_id, BOB) is None
        assert gateway.locate(host.connection_id, ANONYMOUS) is None
        # On the host's worker, the ops other workers send (the cluster path).
        from acp_channels import _worker_protocol as wire

        connection = host.connection_id
        for caller in (BOB, ANONYMOUS):
            for serve, op in (
                (gateway.serve.serve_submit, wire.Submit(connection, caller, "{}", (), (), None)),
                (gateway.serve.serve_reply, wire.ReplyFromTransport(connection, caller, "{}")),
                (gateway.serve.serve_lease, wire.Lease(connection, caller, "l-1", "w", None, None)),
                (gateway.serve.serve_lease_socket, wire.LeaseSocket(connection, caller, "l-2", "w", 0)),
                (gateway.serve.serve_terminate, wire.Terminate(connection, caller)),
            ):
                assert await serve(op) == wire.UnknownConnection(), (serve.__name__, caller)
        # A caller that names no principal (or not one) owns nothing: the op is not even read.
        for principal in (None, "junk", ["user"]):
            args = {"connection": connection, **({} if principal is None else {"principal": principal})}
            message = {"type": "acp.op", "id": "x", "reply_to": "r", "op": "terminate", "args": args}
            assert isinstance(wire.decode_op(message), wire.Malformed)
        assert not host.ended.is_set()
        assert await gateway.serve.serve_terminate(wire.Terminate(connection, ALICE)) == wire.Terminated()
        assert host.ended.is_set()
    finally:
        await host.terminate()


async def test_quota_per_principal_and_audit_lines(
    settings: Any, wire_agent: None, caplog: pytest.LogCaptureFixture
) -> None:
    from acp_channels._agents import create_agent_channel

    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "MAX_CONNECTIONS_PER_PRINCIPAL": 2}
    caplog.set_level(logging.INFO, logger="acp_channels.audit")
    create = lambda principal: registry.create(  # noqa: E731
        create_agent_channel,
        "websocket",
        connection_id=new_connection_id(),
        max_buffered_bytes=1 << 20,
        principal=principal,
        remote_address="192.0.2.1",
    )
    hosts = [create(ALICE), create(ALICE)]
    try:
        with pytest.raises(QuotaExceeded) as over:
            create(ALICE)
        assert over.value.limit == 2
        hosts += [create(BOB), create(ANONYMOUS), create(ANONYMOUS), create(ANONYMOUS)]  # others; anonymous exempt
        assert registry.connections_of(ALICE) == 2 and registry.connections_of(ANONYMOUS) == 0
        await hosts[0].terminate("socket closed")
        assert registry.connections_of(ALICE) == 1
        hosts.append(create(ALICE))  # a freed slot is usable
    finally:
        for host in hosts:
            await host.terminate()
    assert registry.connections_of(ALICE) == 0
    audit = [record.getMessage() for record in caplog.records if record.name == "acp_channels.audit"]
    first = hosts[0].connection_id
    assert f"connection opened principal=token:alice connection={first} transport=websocket remote=192.0.2.1" in audit
    ended = [line for line in audit if line.startswith(f"connection ended principal=token:alice connection={first} ")]
    assert len(ended) == 1
    assert ended[0].startswith(
        f"connection ended principal=token:alice connection={first} transport=websocket remote=192.0.2.1 duration="
    )
    assert ended[0].endswith("s reason=socket closed")
    assert sum(line.startswith("connection opened") for line in audit) == 7


# -- the WebSocket edge ------------------------------------------------------------------------------


async def test_websocket_refused_before_accept_and_accepted_with_acp(
    token_auth: None, wire_agent: None, settings: Any
) -> None:
    """The token in the subprotocol acp.bearer.<token>: refused by default, accepted (answered
    with `acp`) with ALLOW_BEARER_SUBPROTOCOL."""
    application = build_asgi_application()
    before = len(registry)
    offered = ["acp", f"acp.bearer.{tokens.ALICE}"]
    refused = WebsocketCommunicator(application, "/acp", headers=[(b"host", b"testserver")], subprotocols=offered)
    assert await refused.connect(5) == (False, 1000)  # off by default: as if no token were sent
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "ALLOW_BEARER_SUBPROTOCOL": True}
    for offered in (["acp"], ["acp", "acp.bearer.wrong"], ["acp", f"acp.bearer.{tokens.CAROL}"]):
        refused = WebsocketCommunicator(application, "/acp", headers=[(b"host", b"testserver")], subprotocols=offered)
        assert await refused.connect(5) == (False, 1000)  # closed before accept (a server answers 403)
    assert len(registry) == before  # no agent was started
    offered = ["acp", f"acp.bearer.{tokens.ALICE}"]
    accepted = WebsocketCommunicator(application, "/acp", headers=[(b"host", b"testserver")], subprotocols=offered)
    connected, subprotocol = await accepted.connect(5)
    try:
        assert connected and subprotocol == "acp"
        assert len(registry) == before + 1
        connection_id = dict(accepted.response_headers or [])[b"acp-connection-id"].decode()
        host = registry.get(connection_id)
        assert host is not None and host.principal == ALICE and host.remote_address is None
    finally:
        await accepted.disconnect()


def test_auth_middleware_only_for_sites_with_sessions(settings: Any) -> None:
    def wraps_auth(application: Any) -> bool:
        layer = application.application_mapping["websocket"]
        while layer is not None:
            if isinstance(layer, AuthMiddleware):
                return True
            layer = getattr(layer, "inner", None)
        return False

    assert not wraps_auth(build_asgi_application())  # the demo: no sessions, no database
    settings.INSTALLED_APPS = [*settings.INSTALLED_APPS, "django.contrib.sessions"]
    settings.MIDDLEWARE = [
        *settings.MIDDLEWARE,
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
    ]
    assert wraps_auth(build_asgi_application())
