"""Whether the credentials of live connections still hold: the built-in REVALIDATE check.

A connection keeps the principal it was opened with (or last rebound to: docs/authentication.md,
expiry); the credential sweep (`acp_channels._host.credentials`) asks, every REVALIDATE_SECONDS
in each process, what stands of the credentials of its connections' principals: revoked (the
connection ends), expired (its streams close; the connection lives), or holding, with when it
expires where that is known. This is the check it asks unless REVALIDATE names another: a
principal carrying a token of `acp_channels.tokens` (or a django-oauth-toolkit access token,
acp_channels.oauth) is revoked once the token is revoked or deleted, or its user inactive, and
expired once past its `expires`; a Django user ("user" principal of `django_user`, or of such a
token) is revoked once it lacks REQUIRED_PERMISSION. One query per kind of question for the
whole set, not one per connection. Other principals (settings tokens, a custom lookup's) are
left alone: their own `expires_at` is all that is known of them. A REVALIDATE check of the site's
returns the principals no longer valid: they are revoked.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

from asgiref.sync import sync_to_async
from django.apps import apps
from django.conf import settings
from django.db import close_old_connections

from acp_channels._checks import DJANGO_USER_AUTHENTICATOR, TOKENS_APP
from acp_channels._conf import acp_settings
from acp_channels._identity import REVOKED, Ending, Principal, Standings, credential_key
from acp_channels._startup import MODEL_BACKEND
from acp_channels.auth import _callable, call_maybe_async, user_has_permission

#: How a principal names a token of acp_channels.tokens (`AgentToken.credential`).
CREDENTIAL_PREFIX = "acp_tokens:"


async def credential_standings(principals: Collection[Principal]) -> Standings:
    """The REVALIDATE check, by `credential_key`: what stands of the credentials it knows of
    (one it does not name: as its principal says, `Principal.expires_at`)."""
    try:
        path = acp_settings.REVALIDATE
        if path is not None:
            invalid = await call_maybe_async(_callable(path), list(principals)) or ()
            return {credential_key(principal): REVOKED for principal in invalid}
        return await builtin_standings(principals)
    finally:
        # The sweep's database connection is no request's: closed as a request's would be
        # (CONN_MAX_AGE), and never kept broken.
        await sync_to_async(close_old_connections)()


async def builtin_check(principals: Collection[Principal]) -> list[Principal]:
    """Of `principals`, those whose credential no longer holds, revoked or expired (a list:
    principals compare without their credential)."""
    standings = await builtin_standings(principals)
    return [principal for principal in principals if _ended(standings, principal) is not None]


def _ended(standings: Standings, principal: Principal) -> Ending | None:
    standing = standings.get(credential_key(principal))
    return None if standing is None else standing.ended


async def builtin_standings(principals: Collection[Principal]) -> Standings:
    """Tokens of acp_channels.tokens and of django-oauth-toolkit, and REQUIRED_PERMISSION of
    Django users (one without it is revoked, whatever its token)."""
    standings: Standings = {}
    tokens = apps.is_installed(TOKENS_APP)  # its models import only where it is installed
    ours = [principal for principal in principals if tokens and principal.credential.startswith(CREDENTIAL_PREFIX)]
    if ours:
        from acp_channels.tokens._lookup import token_standings

        standings.update(await token_standings(ours))
    if apps.is_installed("oauth2_provider"):  # DOT access tokens (acp_channels.oauth)
        from acp_channels.oauth import CREDENTIAL_PREFIX as OAUTH_TOKEN
        from acp_channels.oauth import token_standings as oauth_token_standings

        carrying = [principal for principal in principals if principal.credential.startswith(OAUTH_TOKEN)]
        if carrying:
            standings.update(await oauth_token_standings(carrying))
    permission = acp_settings.REQUIRED_PERMISSION
    users = [
        principal
        for principal in principals
        if principal.kind == "user"
        and _ended(standings, principal) != "revoked"
        and (
            (tokens and principal.credential.startswith(CREDENTIAL_PREFIX))
            or principal.credential.startswith("oauth2_provider:")
            or (not principal.credential and acp_settings.AUTHENTICATE == DJANGO_USER_AUTHENTICATOR)
        )
    ]
    if permission is not None and users:
        allowed = await permitted_users({principal.id for principal in users}, permission)
        standings.update({credential_key(principal): REVOKED for principal in users if principal.id not in allowed})
    return standings


async def permitted_users(user_ids: set[str], permission: str) -> set[str]:
    """Which of these Django users are active and have `permission`: one query where Django's
    ModelBackend alone decides permissions (superusers, the user's own, its groups'), else
    `has_perm` once per user."""
    from django.contrib.auth import get_user_model
    from django.db.models import Q

    model: Any = get_user_model()
    fields = {field.name for field in model._meta.get_fields()}
    backends = list(getattr(settings, "AUTHENTICATION_BACKENDS", [MODEL_BACKEND]))
    if backends != [MODEL_BACKEND] or not {"is_active", "is_superuser", "user_permissions", "groups"} <= fields:
        return {user_id for user_id in user_ids if await user_has_permission(Principal("user", user_id), permission)}
    app_label, _, codename = permission.partition(".")
    granted = Q(content_type__app_label=app_label, codename=codename)
    from django.contrib.auth.models import Permission

    holders = Permission.objects.filter(granted)
    query = (
        model._default_manager.filter(pk__in=_pks(model, user_ids), is_active=True)
        .filter(Q(is_superuser=True) | Q(user_permissions__in=holders) | Q(groups__permissions__in=holders))
        .values_list("pk", flat=True)
        .distinct()
    )
    return {str(pk) async for pk in query}


def _pks(model: Any, user_ids: Iterable[str]) -> list[Any]:
    field = model._meta.pk
    found = []
    for user_id in user_ids:
        try:
            found.append(field.to_python(user_id))
        except Exception:  # not a pk of this model: not a user of it
            continue
    return found
