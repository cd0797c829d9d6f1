"""bearer_token's lookup of the built-in tokens, and what the credential sweep asks about them."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from datetime import datetime
from typing import TYPE_CHECKING

from django.utils import timezone

from acp_channels._identity import REVOKED, Principal, Standings, credential_key, standing_of_expiry
from acp_channels.errors import DEFAULT_CHALLENGE, Refused
from acp_channels.tokens.models import CONNECT, CREDENTIAL_PREFIX, LAST_USED_EVERY, AgentToken, token_digest

if TYPE_CHECKING:
    from acp_channels.auth import RequestContext

#: The 403 of a token without the scope acp:connect.
NO_CONNECT_SCOPE = "this token may not connect (scope acp:connect)"


async def lookup(secret: str) -> Principal | None:
    """A token's user as a principal ("user", pk) that carries the token (`credential`) and its
    expiry (`expires_at`), after REQUIRED_PERMISSION (403 without) and the scope acp:connect
    (403 without); None (401 invalid_token) for an unknown, revoked or expired token, or an
    inactive user. Writes `last_used` at most once a minute."""
    found = await _find(secret)
    return None if found is None else found[1]


async def authenticate_token(secret: str, context: RequestContext) -> Principal:
    """bearer_token with the built-in tokens: `lookup`, and the scopes the request needs by the
    rule of acp_channels.oauth (attaching to a session as an observer needs
    acp:session:observe, as a controller acp:session:control, which grants observing too;
    403 insufficient_scope without). The scopes stay with the request for a WebSocket ticket
    bought with it, as an OAuth token's do."""
    from acp_channels import oauth

    found = await _find(secret)
    if found is None:
        raise Refused.invalid_token()
    token, principal = found
    needed = oauth.required_scopes(context)
    missing = oauth.granted(needed, token.scope_list)
    if missing:
        challenge = f'{DEFAULT_CHALLENGE}, error="insufficient_scope", scope="{" ".join(needed)}"'
        raise Refused(403, f"{oauth.INSUFFICIENT_SCOPE}: the token needs {' '.join(missing)}", challenge)
    setattr(context, oauth.TOKEN_SCOPES, tuple(token.scope_list))
    return principal


async def _find(secret: str) -> tuple[AgentToken, Principal] | None:
    from acp_channels.auth import user_principal

    now = timezone.now()
    token = await AgentToken.objects.usable(now).select_related("user").filter(digest=token_digest(secret)).afirst()
    if token is None:
        return None
    if CONNECT not in token.scope_list:
        raise Refused.forbidden(NO_CONNECT_SCOPE)
    if token.last_used is None or now - token.last_used >= LAST_USED_EVERY:
        await AgentToken.objects.filter(pk=token.pk).aupdate(last_used=now)
    principal = await user_principal(token.user)
    return token, dataclasses.replace(principal, credential=token.credential, expires_at=_timestamp(token.expires))


async def token_standings(principals: Collection[Principal]) -> Standings:
    """For the credential sweep: what stands of the tokens `principals` carry, in one query for
    them all. Revoked: the token is revoked or deleted, or its user inactive; expired: past its
    `expires`; else it holds, until its `expires` (read again: a changed one is followed)."""
    ids = {
        principal.credential: int(principal.credential.removeprefix(CREDENTIAL_PREFIX))
        for principal in principals
        if principal.credential.removeprefix(CREDENTIAL_PREFIX).isdigit()
    }
    rows = AgentToken.objects.filter(pk__in=set(ids.values()))
    query = rows.values_list("pk", "revoked", "user__is_active", "expires")
    found = {pk: (revoked, active, expires) async for pk, revoked, active, expires in query}
    now = timezone.now().timestamp()
    standings: Standings = {}
    for principal in principals:
        row = found.get(ids.get(principal.credential, -1))
        if row is None or row[0] or not row[1]:
            standings[credential_key(principal)] = REVOKED
        else:
            standings[credential_key(principal)] = standing_of_expiry(_timestamp(row[2]), now)
    return standings


def _timestamp(moment: datetime | None) -> float | None:
    return None if moment is None else moment.timestamp()
