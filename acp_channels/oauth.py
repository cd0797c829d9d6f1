"""OAuth 2 protected resource: `/acp` accepts access tokens django-oauth-toolkit issued (the
`acp-channels[oauth]` extra; docs/authentication.md, "OAuth with django-oauth-toolkit"; names
provisional).

`access_token` is an ordinary AUTHENTICATE callable. It validates the bearer token through
django-oauth-toolkit's own validator (its AccessToken model, expiry, RFC 8707 resource
restriction, introspection of another server's tokens when DOT is configured for it), then the
scopes the request needs (`required_scopes`): `acp:connect` for every request that opens or uses
a connection, and for an attach (`Acp-Attach-Session`) the session scope of its role too.

Refusals carry RFC 6750 challenges that name the RFC 9728 metadata (`resource_metadata`), which
`metadata` serves at `/.well-known/oauth-protected-resource`. django-oauth-toolkit is imported
only when a token is checked: this module imports without it (the system check says what is
missing).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection, Iterable, Mapping
from typing import Any, Final
from urllib.parse import parse_qs, urlsplit

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import NoReverseMatch, reverse

from acp_channels._conf import acp_settings
from acp_channels._cors import ENDPOINT_URL_NAME
from acp_channels._identity import REVOKED, Principal, Standings, credential_key, standing_of_expiry
from acp_channels._protocol import ATTACH_ROLE_HEADER, ATTACH_ROLE_QUERY, ATTACH_SESSION_HEADER, ATTACH_SESSION_QUERY
from acp_channels.auth import RequestContext, user_principal
from acp_channels.errors import DEFAULT_CHALLENGE, INVALID_TOKEN, Refused

#: The dotted path of the authenticator, for settings and the system checks.
AUTHENTICATOR: Final = "acp_channels.oauth.access_token"
#: The URL name of the RFC 9728 metadata (acp_channels.urls).
METADATA_URL_NAME: Final = "acp-oauth-protected-resource"
METADATA_PATH: Final = "/.well-known/oauth-protected-resource"
#: The operations a scope grants (ACP_CHANNELS["OAUTH_SCOPES"] names their scopes).
CONNECT: Final = "connect"
OBSERVE: Final = "observe"
CONTROL: Final = "control"
DEFAULT_SCOPES: Final[Mapping[str, str]] = {
    CONNECT: "acp:connect",
    OBSERVE: "acp:session:observe",
    CONTROL: "acp:session:control",
}
INSUFFICIENT_SCOPE: Final = "insufficient scope"
#: Principal.credential of a principal authenticated by a DOT access token: the token's primary
#: key (never the token), what the credential sweep asks `invalid_tokens` about.
CREDENTIAL_PREFIX: Final = "oauth2_provider:"
#: Where access_token leaves the token's scopes on the RequestContext (token_scopes).
TOKEN_SCOPES: Final = "oauth_token_scopes"


def scope_names() -> dict[str, str]:
    """Operation -> scope: the defaults, with ACP_CHANNELS["OAUTH_SCOPES"] over them."""
    configured = acp_settings.OAUTH_SCOPES
    return {**DEFAULT_SCOPES, **(configured if isinstance(configured, Mapping) else {})}


def required_scope(attach_role: str | None) -> list[str]:
    """The rule: the scopes a request needs, by what it does. Every request that opens or uses
    a connection needs `connect`; an attach also needs its role's session scope (`observe` for
    an observer, `control` for a controller; the control scope also grants observing)."""
    names = scope_names()
    if attach_role is None:
        return [names[CONNECT]]
    return [names[CONNECT], names[OBSERVE] if attach_role == "observer" else names[CONTROL]]


def granted(needed: Iterable[str], scopes: Iterable[str]) -> list[str]:
    """The scopes of `needed` that `scopes` do not grant (empty: allowed)."""
    names = scope_names()
    have = set(scopes)
    if names[CONTROL] in have:
        have.add(names[OBSERVE])
    return [scope for scope in needed if scope not in have]


def attach_role(context: RequestContext) -> str | None:
    """The role a request attaches with (`Acp-Attach-Session`; for a WebSocket also the query),
    or None when it does not attach. An unknown role is asked the controller's scope (the
    endpoint refuses it with 400 after)."""
    session = context.header(ATTACH_SESSION_HEADER)
    role = context.header(ATTACH_ROLE_HEADER)
    if context.transport == "websocket":
        query = parse_qs(bytes(context.scope.get("query_string", b"")).decode("latin-1"))
        session = session or _first(query, ATTACH_SESSION_QUERY)
        role = role or _first(query, ATTACH_ROLE_QUERY)
    if not session:
        return None
    return "observer" if role == "observer" else "controller"


def required_scopes(context: RequestContext) -> list[str]:
    """The scopes this request needs (`required_scope` of its attach role)."""
    return required_scope(attach_role(context))


def _first(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[0].strip() if values else None


# -- the authenticator ----------------------------------------------------------------------------


async def access_token(context: RequestContext) -> Principal:
    """AUTHENTICATE: a django-oauth-toolkit access token (`Authorization: Bearer`, or a browser
    WebSocket's `acp.bearer.<token>` subprotocol where allowed) with the scopes it needs. The
    principal is the token's user (REQUIRED_PERMISSION applies), or for a token without one
    (client credentials) `Principal("oauth-client", client_id)`."""
    needed = required_scopes(context)
    token = context.bearer_token
    if token is None:
        error = "invalid_token" if context.header("authorization") is not None else None
        raise refusal(context, 401, INVALID_TOKEN if error else "authentication required", needed, error)
    found, refresh_id, description = await sync_to_async(_validate)(token, resource_identifier(context))
    if found is None:
        raise refusal(context, 401, INVALID_TOKEN, needed, "invalid_token", description)
    user = found.user
    if user is not None and not getattr(user, "is_active", False):
        raise refusal(context, 401, INVALID_TOKEN, needed, "invalid_token")
    scopes = str(found.scope or "").split()
    refuse_unless_granted(context, scopes)
    setattr(context, TOKEN_SCOPES, tuple(scopes))  # for what outlives the request (a ticket)
    if user is not None:
        principal = await user_principal(user)
    else:
        application = found.application
        client_id = str(getattr(application, "client_id", "") or "")
        principal = Principal("oauth-client", client_id, str(getattr(application, "name", "") or client_id))
    # The credential sweep ends its connections once the token is revoked, and closes their
    # streams once it expires (the host tells the client before: docs/authentication.md).
    expires = getattr(found, "expires", None)
    expires_at = expires.timestamp() if expires is not None else None
    return dataclasses.replace(principal, credential=credential_of(found.pk, refresh_id), expires_at=expires_at)


def credential_of(access_id: object, refresh_id: object | None) -> str:
    """`Principal.credential` of a DOT access token: `oauth2_provider:<access token pk>`, and
    `:<refresh token pk>` when it came with one (the sweep follows a refresh through it)."""
    suffix = f":{refresh_id}" if refresh_id is not None else ""
    return f"{CREDENTIAL_PREFIX}{access_id}{suffix}"


def _token_ids(principal: Principal) -> tuple[str, str | None]:
    """The access token's and the refresh token's pk that `credential_of` put in a credential."""
    access, _, refresh = principal.credential.removeprefix(CREDENTIAL_PREFIX).partition(":")
    return access, refresh or None


async def token_standings(principals: Collection[Principal]) -> Standings:
    """For the credential sweep (acp_channels._revalidate): what stands of the DOT access tokens
    `principals` carry (`CREDENTIAL_PREFIX`), in one query for them all. Revoked: DOT deleted
    the token (it does on revocation), or its user is inactive; expired: past its `expires`;
    else it holds until then (read again: a changed `expires` is followed)."""
    ids = [_token_ids(principal) for principal in principals]
    rows, successors = await sync_to_async(_token_rows)(ids)
    now = time.time()
    standings: Standings = {}
    for principal, (access_id, refresh_id) in zip(principals, ids, strict=True):
        found = rows.get(access_id)
        successor = successors.get(refresh_id) if found is None and refresh_id is not None else None
        if successor is not None:  # a refresh replaced the token: the connection goes on with the new one
            expires, usable, credential = successor
            standing = dataclasses.replace(standing_of_expiry(expires, now), credential=credential)
        else:
            usable = found is not None and found[1]
            standing = standing_of_expiry(found[0], now) if found is not None else REVOKED
        standings[credential_key(principal)] = standing if usable else REVOKED
    return standings


async def invalid_tokens(principals: Collection[Principal]) -> list[Principal]:
    """Of principals carrying a DOT access token, those whose token was revoked (DOT deletes
    it), has expired, or whose user is inactive (`token_standings`, said shortly)."""
    standings = await token_standings(principals)
    return [principal for principal in principals if standings[credential_key(principal)].ended is not None]


Row = tuple[float, bool]


def _token_rows(
    ids: Collection[tuple[str, str | None]],
) -> tuple[dict[str, Row], dict[str, tuple[float, bool, str]]]:
    """Access token pk -> (when it expires, whether its user is active or it has none), for the
    access tokens of `ids` that exist; and for those gone, refresh token pk -> the same of the
    token that now stands for it, with its credential. DOT deletes an access token when its
    refresh token is used (RefreshToken.revoke) and when it is revoked; only a refresh leaves a
    live refresh token of the same family (`token_family`, kept across rotations), whose access
    token is the replacement. Three queries for the whole set."""
    from oauth2_provider.models import get_access_token_model, get_refresh_token_model

    tokens: Any = get_access_token_model()
    found = tokens.objects.filter(pk__in=_pks(tokens, [access for access, _ in ids]))
    rows = {
        str(pk): (expires.timestamp(), user is None or bool(active))
        for pk, expires, user, active in found.values_list("pk", "expires", "user_id", "user__is_active")
    }
    gone = [refresh for access, refresh in ids if access not in rows and refresh is not None]
    if not gone:
        return rows, {}
    refreshes: Any = get_refresh_token_model()
    families = dict(refreshes.objects.filter(pk__in=_pks(refreshes, gone)).values_list("pk", "token_family"))
    live = refreshes.objects.filter(
        token_family__in=[family for family in families.values() if family is not None],
        revoked__isnull=True,
        access_token__isnull=False,
    ).values_list("pk", "token_family", "access_token_id", "access_token__expires", "access_token__user_id",
                  "access_token__user__is_active")  # fmt: skip
    by_family = {
        family: (expires.timestamp(), user is None or bool(active), credential_of(access, pk))
        for pk, family, access, expires, user, active in live
    }
    return rows, {str(pk): by_family[family] for pk, family in families.items() if family in by_family}


def _pks(model: Any, ids: Iterable[str]) -> list[Any]:
    keys = []
    for token_id in ids:
        try:
            keys.append(model._meta.pk.to_python(token_id))
        except Exception:  # not a key of this model: not a token of it
            continue
    return keys


def refuse_unless_granted(context: RequestContext, scopes: Iterable[str]) -> None:
    """Raise the 403 insufficient_scope refusal unless `scopes` grant what `context` needs. For
    a credential that stands for a token later (a WebSocket ticket issued to it): keep
    `token_scopes(context)` with it, and check them here at the upgrade."""
    needed = required_scopes(context)
    missing = granted(needed, scopes)
    if missing:
        reason = f"{INSUFFICIENT_SCOPE}: the token needs {' '.join(missing)}"
        raise refusal(context, 403, reason, needed, "insufficient_scope")


def token_scopes(context: RequestContext) -> tuple[str, ...] | None:
    """The scopes of the access token `access_token` accepted for this request (None: it did
    not authenticate this request)."""
    scopes: tuple[str, ...] | None = getattr(context, TOKEN_SCOPES, None)
    return scopes


def _validate(token: str, resource: str) -> tuple[Any, Any, str | None]:
    """django-oauth-toolkit's validator (OAUTH2_VALIDATOR_CLASS) on the token: the AccessToken
    and its refresh token's pk (None without one), or None with DOT's reason (expired, not for
    this resource; none for an unknown or revoked token). Sync: it queries the database."""
    from oauth2_provider.settings import oauth2_settings
    from oauthlib.common import Request

    request = Request(resource)
    validator = oauth2_settings.OAUTH2_VALIDATOR_CLASS()
    if validator.validate_bearer_token(token, [], request):
        found = request.access_token
        return found, found.refresh_token.pk if _has_refresh_token(found) else None, None
    error = getattr(request, "oauth2_error", None) or {}
    description = error.get("error_description")
    return None, None, str(description) if description else None


def _has_refresh_token(found: Any) -> bool:
    from django.core.exceptions import ObjectDoesNotExist

    try:
        return found.refresh_token is not None
    except ObjectDoesNotExist:  # the reverse one-to-one of a token issued without one
        return False


def refusal(
    context: RequestContext,
    status: int,
    reason: str,
    scopes: list[str],
    error: str | None = None,
    description: str | None = None,
) -> Refused:
    """A 401 or 403 whose challenge names the error, the scopes needed and the metadata."""
    parts = [DEFAULT_CHALLENGE]
    if error is not None:
        parts.append(f'error="{error}"')
    if description is not None:
        parts.append(f"error_description={_quoted(description)}")
    parts.append(f'scope="{" ".join(scopes)}"')
    parts.append(f"resource_metadata={_quoted(metadata_url(context))}")
    return Refused(status, reason, ", ".join(parts))


def _quoted(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


# -- where: the resource and its metadata ------------------------------------------------------------


def origin(context: RequestContext) -> str:
    """scheme://host of the request, as the client reached it."""
    if context.request is not None:
        return f"{context.request.scheme}://{context.request.get_host()}"
    scheme = "https" if context.scope.get("scheme") in ("wss", "https") else "http"
    return f"{scheme}://{context.header('host') or 'localhost'}"


def resource_identifier(context: RequestContext) -> str:
    """ACP_CHANNELS["OAUTH_RESOURCE"], else the URL of the endpoint on the request's origin."""
    configured: str | None = acp_settings.OAUTH_RESOURCE
    if configured:
        return configured
    return origin(context) + _path(ENDPOINT_URL_NAME, "/acp")


def metadata_url(context: RequestContext) -> str:
    """The URL of the metadata document, on the resource's origin."""
    configured: str | None = acp_settings.OAUTH_RESOURCE
    base = origin(context)
    if configured:
        parts = urlsplit(configured)
        base = f"{parts.scheme}://{parts.netloc}"
    return base + _path(METADATA_URL_NAME, METADATA_PATH)


def _path(name: str, default: str) -> str:
    try:
        return reverse(name)
    except NoReverseMatch:
        return default


def configured() -> bool:
    """Whether the site serves OAuth: the authenticator is this module's, or authorization
    servers are named (a site's own authenticator may use them)."""
    return acp_settings.AUTHENTICATE == AUTHENTICATOR or bool(acp_settings.OAUTH_AUTHORIZATION_SERVERS)


def metadata_document(context: RequestContext) -> dict[str, Any]:
    """RFC 9728 protected resource metadata."""
    return {
        "resource": resource_identifier(context),
        "authorization_servers": list(acp_settings.OAUTH_AUTHORIZATION_SERVERS or []),
        "scopes_supported": list(scope_names().values()),
        "bearer_methods_supported": ["header"],
    }


async def metadata(request: HttpRequest, suffix: str = "") -> HttpResponse:
    """GET /.well-known/oauth-protected-resource (also with the resource's path after it, as
    RFC 9728 §3.1 builds it): the metadata, readable from any origin; 404 when OAuth is not
    configured."""
    if request.method not in ("GET", "HEAD"):
        response = HttpResponse(status=405)
        response["Allow"] = "GET, HEAD"
        return response
    if not configured():
        return HttpResponse(status=404)
    document = metadata_document(RequestContext.for_http(request))
    if suffix and urlsplit(document["resource"]).path.strip("/") != suffix.strip("/"):
        return HttpResponse(status=404)
    response = JsonResponse(document, json_dumps_params={"indent": 2})
    response["Access-Control-Allow-Origin"] = "*"  # public: browser OAuth clients read it
    response["Cache-Control"] = "max-age=3600"
    return response


__all__ = [
    "AUTHENTICATOR",
    "access_token",
    "invalid_tokens",
    "metadata",
    "refuse_unless_granted",
    "required_scope",
    "required_scopes",
    "token_scopes",
]
