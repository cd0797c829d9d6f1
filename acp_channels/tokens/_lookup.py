"""bearer_token's lookup of the built-in tokens, and what the credential sweep asks about them."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import TYPE_CHECKING

from django.utils import timezone

from acp_channels._identity import Principal
from acp_channels.errors import DEFAULT_CHALLENGE, Refused
from acp_channels.tokens.models import CONNECT, CREDENTIAL_PREFIX, LAST_USED_EVERY, AgentToken, token_digest

if TYPE_CHECKING:
    from acp_channels.auth import RequestContext

#: The 403 of a token without the scope acp:connect.
NO_CONNECT_SCOPE = "this token may not connect (scope acp:connect)"


async def lookup(secret: str) -> Principal | None:
    """A token's user as a principal ("user", pk) that carries the token (`credential`), after
    REQUIRED_PERMISSION (403 without) and the scope acp:connect (403 without); None (401
    invalid_token) for an unknown, revoked or expired token, or an inactive user. Writes
    `last_used` at most once a minute."""
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
    return token, dataclasses.replace(principal, credential=token.credential)


async def invalid_tokens(principals: Collection[Principal]) -> list[Principal]:
    """Of `principals` (those carrying one of these tokens), the ones whose token is no longer
    usable (revoked, expired, deleted, its user inactive), in one query for them all. A list:
    principals compare without their credential."""
    ids = {
        principal.credential: int(principal.credential.removeprefix(CREDENTIAL_PREFIX))
        for principal in principals
        if principal.credential.removeprefix(CREDENTIAL_PREFIX).isdigit()
    }
    query = AgentToken.objects.usable().filter(pk__in=set(ids.values())).values_list("pk", flat=True)
    usable = {pk async for pk in query}
    return [principal for principal in principals if ids.get(principal.credential) not in usable]
