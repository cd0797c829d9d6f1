"""The built-in tokens in a Django with a database (tests.tokens_site), run by
tests/test_tokens.py in a pytest of their own (`--ds tests.tokens_site`: the suite's Django
has no database): the model and its digests, `manage.py acp_token`, the admin's add form,
bearer_token's lookup through the model, and the credential check the sweep asks."""

from __future__ import annotations

import asyncio
import hashlib
import io
import re
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from acp_channels._host.credentials import CredentialSweep
from acp_channels._identity import REVOKED, Principal, Standing, credential_key
from acp_channels._revalidate import builtin_check, builtin_standings
from acp_channels.auth import RequestContext, authenticate
from acp_channels.errors import Refused
from acp_channels.tokens._lookup import lookup
from acp_channels.tokens.models import CONNECT, CONTROL, OBSERVE, AgentToken, token_digest

pytestmark = pytest.mark.django_db(transaction=True)
INVALID = 'Bearer realm="acp", error="invalid_token"'
#: RFC 6455 token characters: a secret must fit the `acp.bearer.<token>` subprotocol.
TOKEN_CHARS = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")


def user(name: str, *, permitted: bool = True, **fields: Any) -> User:
    found = User.objects.create_user(name, password=None, **fields)
    if permitted:
        found.user_permissions.add(Permission.objects.get(codename="use_agent", content_type__app_label="acp_tokens"))
    return found


def command(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("acp_token", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def stored(token: AgentToken) -> str:
    """Every stored value of the token's row, as text."""
    return repr(list(AgentToken.objects.filter(pk=token.pk).values().get().values()))


# -- the model ----------------------------------------------------------------------------------------


def test_only_the_digest_is_stored() -> None:
    token, secret = AgentToken.create(user("alice"), "laptop")
    assert token.digest == hashlib.sha256(secret.encode()).hexdigest() == token_digest(secret)
    assert secret not in stored(token) and secret.startswith("acp_") and len(secret) >= 40
    assert TOKEN_CHARS.match(secret)
    again, other = AgentToken.create(token.user, "laptop")
    assert other != secret and again.digest != token.digest
    assert token.scope_list == [CONNECT] and token.status() == "active"


# -- manage.py acp_token ------------------------------------------------------------------------------


def test_command_create_prints_the_secret_once_and_never_again() -> None:
    user("alice")
    out, err = command(
        "create", "alice", "--name", "editor", "--expires", "30d", "--scope", CONNECT, "--scope", OBSERVE
    )
    secret = out.strip()
    assert out == secret + "\n" and TOKEN_CHARS.match(secret)  # stdout: the secret alone
    token = AgentToken.objects.get()
    assert token.digest == token_digest(secret) and secret not in err
    assert token.scope_list == [CONNECT, OBSERVE] and token.name == "editor"
    assert timedelta(days=29, hours=23) < token.expires - timezone.now() <= timedelta(days=30)
    listed, _ = command("list")
    assert "editor" in listed and "alice" in listed and "active" in listed
    assert secret not in listed and token.digest not in listed
    out, _ = command("revoke", str(token.pk))
    assert out.strip() == f"revoked {token.pk}"
    token.refresh_from_db()
    assert token.revoked and secret not in out
    assert "editor" not in command("list")[0]  # active ones only
    everything = command("list", "--all")[0]
    assert "revoked" in everything and secret not in everything


def test_command_refusals() -> None:
    with pytest.raises(CommandError, match="no user 'nobody'"):
        command("create", "nobody")
    user("alice")
    with pytest.raises(CommandError, match="--expires"):
        command("create", "alice", "--expires", "soon")
    with pytest.raises(CommandError, match="no token 99"):
        command("revoke", "99")
    command("create", "alice", "--expires", "2020-01-01")
    assert AgentToken.objects.get().status() == "expired"
    assert "alice" not in command("list")[0] and "expired" in command("list", "--all")[0]


# -- the admin ----------------------------------------------------------------------------------------


def test_admin_add_shows_the_secret_once() -> None:
    admin = User.objects.create_superuser("admin", password="pw-0123456789")
    alice = user("alice")
    client = Client()
    client.force_login(admin)
    response = client.post(
        "/admin/acp_tokens/agenttoken/add/",
        {"user": alice.pk, "name": "from the admin", "expires": "", "scopes": [CONNECT]},
    )
    assert response.status_code == 200, response.content
    assert "no-store" in response["Cache-Control"]
    token = AgentToken.objects.get()
    shown = re.search(r'<code id="acp-token-secret"[^>]*>([^<]+)</code>', response.content.decode())
    assert shown is not None
    secret = shown.group(1)
    assert token_digest(secret) == token.digest and token.user == alice and token.scope_list == [CONNECT]
    for page in ("/admin/acp_tokens/agenttoken/", f"/admin/acp_tokens/agenttoken/{token.pk}/change/"):
        later = client.get(page)
        assert later.status_code == 200 and secret not in later.content.decode()
    assert secret not in stored(token)
    # The revoke action.
    client.post("/admin/acp_tokens/agenttoken/", {"action": "revoke", "_selected_action": [token.pk]}, follow=True)
    token.refresh_from_db()
    assert token.revoked


# -- bearer_token through the model ---------------------------------------------------------------------


def context(secret: str) -> RequestContext:
    return RequestContext("http", {"type": "http", "headers": [(b"authorization", f"Bearer {secret}".encode())]})


def refusal(secret: str) -> Refused:
    with pytest.raises(Refused) as refused:
        asyncio.run(authenticate(context(secret)))
    return refused.value


def test_bearer_token_looks_tokens_up_in_the_model() -> None:
    token, secret = AgentToken.create(user("alice"), "laptop")
    principal = asyncio.run(authenticate(context(secret)))
    assert principal == Principal("user", str(token.user.pk)) and principal.display == "alice"
    assert principal.credential == f"acp_tokens:{token.pk}"
    token.refresh_from_db()
    first = token.last_used
    assert first is not None and timezone.now() - first < timedelta(seconds=10)
    asyncio.run(authenticate(context(secret)))
    token.refresh_from_db()
    assert token.last_used == first  # at most once a minute
    AgentToken.objects.filter(pk=token.pk).update(last_used=first - timedelta(minutes=2))
    asyncio.run(authenticate(context(secret)))
    token.refresh_from_db()
    assert token.last_used > first


def test_wrong_revoked_and_expired_tokens_are_invalid() -> None:
    alice = user("alice")
    revoked, revoked_secret = AgentToken.create(alice, "old")
    revoked.revoked = True
    revoked.save()
    _, expired_secret = AgentToken.create(alice, "expired", expires=timezone.now() - timedelta(seconds=1))
    _, inactive_secret = AgentToken.create(user("gone", is_active=False), "gone")
    for secret in ("acp_not-a-token", revoked_secret, expired_secret, inactive_secret):
        found = refusal(secret)
        assert (found.status, found.challenge) == (401, INVALID), secret


def test_permission_and_scope_are_required() -> None:
    _, secret = AgentToken.create(user("carol", permitted=False), "carol")
    assert refusal(secret).status == 403
    _, observer = AgentToken.create(user("alice"), "observer", scopes=[OBSERVE])
    found = refusal(observer)
    assert found.status == 403 and "acp:connect" in found.reason


def attaching(secret: str, role: str) -> RequestContext:
    headers = [
        (b"authorization", f"Bearer {secret}".encode()),
        (b"acp-attach-session", b"s-1"),
        (b"acp-attach-role", role.encode()),
    ]
    return RequestContext("http", {"type": "http", "headers": headers})


def test_attaching_needs_the_session_scopes() -> None:
    """The rule of acp_channels.oauth: observe for an observer, control (which grants observe)
    for a controller; the scopes stay with the request (a ticket bought with it keeps them)."""
    alice = user("alice")
    _, connect_only = AgentToken.create(alice, "connect")
    _, observer = AgentToken.create(alice, "observer", scopes=[CONNECT, OBSERVE])
    _, controller = AgentToken.create(alice, "controller", scopes=[CONNECT, CONTROL])
    for secret, role in ((connect_only, "observer"), (connect_only, "controller"), (observer, "controller")):
        with pytest.raises(Refused) as refused:
            asyncio.run(authenticate(attaching(secret, role)))
        assert refused.value.status == 403 and 'error="insufficient_scope"' in (refused.value.challenge or "")
        assert "acp:session:" in refused.value.reason
    for secret, role in ((observer, "observer"), (controller, "observer"), (controller, "controller")):
        context = attaching(secret, role)
        assert asyncio.run(authenticate(context)).display == "alice"
        assert CONNECT in getattr(context, "oauth_token_scopes", ())


def test_the_view_answers_401_invalid_token() -> None:
    token, secret = AgentToken.create(user("alice"), "laptop")
    token.revoked = True
    token.save()
    initialize = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}
    response = Client().post("/acp", initialize, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 401 and response["WWW-Authenticate"] == INVALID
    assert secret not in response.content.decode()


# -- what the sweep asks --------------------------------------------------------------------------------


def principal_of(token: AgentToken) -> Principal:
    return Principal("user", str(token.user.pk), token.user.username, token.credential)


def test_builtin_check_finds_revoked_expired_and_unpermitted_credentials() -> None:
    alice, bob, dave = user("alice"), user("bob"), user("dave", permitted=False)
    kept, _ = AgentToken.create(alice, "kept")
    revoked, _ = AgentToken.create(alice, "revoked")
    expiring, _ = AgentToken.create(bob, "expiring", expires=timezone.now() + timedelta(hours=1))
    by_group, _ = AgentToken.create(dave, "by group")
    group = Group.objects.create(name="agents")
    group.permissions.add(Permission.objects.get(codename="use_agent"))
    dave.groups.add(group)
    principals = [principal_of(token) for token in (kept, revoked, expiring, by_group)]
    assert asyncio.run(builtin_check(principals)) == []
    AgentToken.objects.filter(pk=revoked.pk).update(revoked=True)
    AgentToken.objects.filter(pk=expiring.pk).update(expires=timezone.now())
    dave.groups.remove(group)
    invalid = asyncio.run(builtin_check(principals))
    assert [p.credential for p in invalid] == [revoked.credential, expiring.credential, by_group.credential]
    # A superuser needs no permission; a settings token is none of its business.
    AgentToken.objects.filter(pk=revoked.pk).update(revoked=False)
    User.objects.filter(pk=dave.pk).update(is_superuser=True)
    others = [Principal("token", "team", "team"), Principal("user", "999", "ghost")]
    invalid = asyncio.run(builtin_check([*principals, *others]))
    assert [p.credential for p in invalid] == [expiring.credential]
    # alice loses the permission while one of her tokens is revoked: the other one ends too.
    AgentToken.objects.filter(pk=revoked.pk).update(revoked=True)
    alice.user_permissions.clear()
    invalid = asyncio.run(builtin_check(principals))
    assert sorted(p.credential for p in invalid) == sorted([kept.credential, revoked.credential, expiring.credential])


def test_builtin_standings_tell_an_expired_token_from_a_revoked_one() -> None:
    """An expiry closes a connection's streams (a new token resumes it); a revocation, a deleted
    token, an inactive user or a lost permission ends it, expired or not."""
    alice, bob = user("alice"), user("bob")
    soon = timezone.now() + timedelta(minutes=5)
    holding, _ = AgentToken.create(alice, "holding", expires=soon)
    forever, _ = AgentToken.create(alice, "forever")
    expired, _ = AgentToken.create(alice, "expired", expires=soon)
    revoked, _ = AgentToken.create(alice, "revoked", expires=soon)
    deleted, _ = AgentToken.create(alice, "deleted")
    of_inactive, _ = AgentToken.create(bob, "of an inactive user", expires=soon)
    tokens = (holding, forever, expired, revoked, deleted, of_inactive)
    principals = [principal_of(token) for token in tokens]
    AgentToken.objects.filter(pk=expired.pk).update(expires=timezone.now() - timedelta(seconds=1))
    AgentToken.objects.filter(pk=revoked.pk).update(revoked=True, expires=timezone.now() - timedelta(seconds=1))
    AgentToken.objects.filter(pk=deleted.pk).delete()
    User.objects.filter(pk=bob.pk).update(is_active=False)
    standings = asyncio.run(builtin_standings(principals))
    by_name = {token.name: standings[credential_key(principal_of(token))] for token in tokens}
    assert by_name["holding"] == Standing(None, soon.timestamp())  # its expiry, for the notice
    assert by_name["forever"] == Standing(None, None)
    assert by_name["expired"].ended == "expired"
    assert [by_name[name] for name in ("revoked", "deleted", "of an inactive user")] == [REVOKED] * 3
    # An expired token of a user who lost the permission: revoked (the end wins).
    alice.user_permissions.clear()
    standings = asyncio.run(builtin_standings(principals[:3]))
    assert [standings[credential_key(principal)] for principal in principals[:3]] == [REVOKED] * 3


def test_the_lookup_says_when_the_token_expires() -> None:
    soon = timezone.now() + timedelta(minutes=5)
    token, secret = AgentToken.create(user("alice"), "laptop", expires=soon)
    found = asyncio.run(lookup(secret))
    assert found is not None and found.credential == token.credential and found.expires_at == soon.timestamp()
    _, forever = AgentToken.create(token.user, "forever")
    found = asyncio.run(lookup(forever))
    assert found is not None and found.expires_at is None


class FakeHost:
    def __init__(self, principal: Principal) -> None:
        self.principal = principal
        self.connection_id = principal.credential
        self.ended = asyncio.Event()
        self.reason = ""

    async def terminate(self, reason: str) -> None:
        self.reason = reason
        self.ended.set()


def test_the_sweep_ends_the_connections_of_an_invalid_credential_only() -> None:
    alice = user("alice")
    kept, _ = AgentToken.create(alice, "kept")
    revoked, _ = AgentToken.create(alice, "revoked")
    hosts = [FakeHost(principal_of(kept)), FakeHost(principal_of(revoked)), FakeHost(principal_of(revoked))]
    sweep = CredentialSweep(lambda: hosts)  # type: ignore[arg-type,return-value]
    assert asyncio.run(sweep.sweep()) == 0
    AgentToken.objects.filter(pk=revoked.pk).update(revoked=True)
    assert asyncio.run(sweep.sweep()) == 2
    assert [host.reason for host in hosts] == ["", "revoked", "revoked"]


def test_a_custom_revalidate_check(settings: Any) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "REVALIDATE": "tests.tokens_units.everyone_invalid"}
    hosts = [FakeHost(Principal("token", "team", "team", "mine:1"))]
    assert asyncio.run(CredentialSweep(lambda: hosts).sweep()) == 1  # type: ignore[arg-type,return-value]
    assert SimpleNamespace(reason=hosts[0].reason) == SimpleNamespace(reason="revoked")


def everyone_invalid(principals: list[Principal]) -> list[Principal]:
    return principals


def test_builtin_check_finds_session_users_without_the_permission(settings: Any) -> None:
    """django_user's principals carry no credential: their user's permission is what is asked."""
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "AUTHENTICATE": "acp_channels.auth.django_user"}
    alice, bob = user("alice"), user("bob")
    principals = [Principal("user", str(alice.pk), "alice"), Principal("user", str(bob.pk), "bob")]
    assert asyncio.run(builtin_check(principals)) == []
    bob.user_permissions.clear()
    User.objects.filter(pk=alice.pk).update(is_active=False)
    assert [p.display for p in asyncio.run(builtin_check(principals))] == ["alice", "bob"]
    # Under bearer_token, a principal without a credential is not a session's: left alone.
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "AUTHENTICATE": "acp_channels.auth.bearer_token"}
    assert asyncio.run(builtin_check(principals)) == []
