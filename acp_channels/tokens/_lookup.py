"""The built-in TOKEN_LOOKUP and what the credential sweep asks about tokens."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

from django.utils import timezone

from acp_channels._identity import Principal
from acp_channels.errors import Refused
from acp_channels.tokens.models import CONNECT, CREDENTIAL_PREFIX, LAST_USED_EVERY, AgentToken, token_digest

#: The 403 of a token without the scope acp:connect.
NO_CONNECT_SCOPE = "this token may not connect (scope acp:connect)"


async def lookup(secret: str) -> Principal | None:
    """A token's user as a principal ("user", pk) that carries the token (`credential`), after
    REQUIRED_PERMISSION (403 without); None (401 invalid_token) for an unknown, revoked or
    expired token, or an inactive user. Writes `last_used` at most once a minute."""
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
    return dataclasses.replace(principal, credential=token.credential)


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
