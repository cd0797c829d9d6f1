"""Who is asking: authentication at the edges of `/acp`, resolved to an `identity.Principal`.

`ACP_CHANNELS["AUTHENTICATE"]` names a callable (sync or async) taking a `RequestContext` (one
shape for an HTTP request and a WebSocket upgrade) and returning a Principal, or raising
`Refused` (401 with a challenge, or 403). Without one, everyone is `ANONYMOUS`.

Ready-made: `django_user` (the logged-in Django user, by session cookie; with
REQUIRED_PERMISSION) and `bearer_token` (`Authorization: Bearer <token>`, or where
ALLOW_BEARER_SUBPROTOCOL is on the subprotocol `acp.bearer.<token>`, looked up by TOKEN_LOOKUP;
browsers' WebSockets use single-use tickets instead, acp_channels._tickets). `settings_tokens`
is a TOKEN_LOOKUP for a shared team token kept in ACP_CHANNELS["TOKENS"].

Tokens are credentials: none ever appears in a response, a log line or an exception's text.
Cross-site use of a session cookie (CSRF) is refused here too: see `cross_site_refusal`.
"""

from __future__ import annotations

import functools
import hmac
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

from asgiref.sync import sync_to_async
from django.apps import apps
from django.http import HttpRequest
from django.utils.module_loading import import_string

from acp_channels._conf import acp_settings
from acp_channels._identity import ANONYMOUS, Principal, TransportKind
from acp_channels.errors import (
    AUTHENTICATION_REQUIRED,
    DEFAULT_CHALLENGE,
    SESSION_CHALLENGE,
)
from acp_channels.errors import (
    Refused as Refused,  # re-exported: authenticators raise it from here
)

#: The WebSocket subprotocol of ACP; the server accepts with it when the client offers it.
SUBPROTOCOL: Final = "acp"
#: A browser's WebSocket carries its bearer token as the offered subprotocol `acp.bearer.<token>`.
BEARER_SUBPROTOCOL_PREFIX: Final = "acp.bearer."
#: The challenge of a 401 (RFC 6750); `error="invalid_token"` is added when a token was wrong.
REALM: Final = DEFAULT_CHALLENGE
CROSS_SITE: Final = "cross-site request refused"
#: The optional app of built-in tokens, and how bearer_token checks them when TOKEN_LOOKUP is None.
TOKENS_APP: Final = "acp_channels.tokens"
BUILTIN_TOKENS: Final = "acp_channels.tokens._lookup.authenticate_token"


class RequestContext:
    """What an authenticator sees of a request, the same for both edges: the HTTP request
    (`request`) or the WebSocket upgrade (`scope`), its headers, the client's address, the
    Django user if the site has sessions, the offered subprotocols, and the bearer token."""

    def __init__(self, transport: TransportKind, scope: Mapping[str, Any], request: HttpRequest | None = None) -> None:
        self.transport = transport
        self.scope = scope
        self.request = request
        #: Set once `user()` found a logged-in user: the request is authenticated by cookie,
        #: so the cross-site rule applies to it.
        self.used_session = False

    @classmethod
    def for_http(cls, request: HttpRequest) -> RequestContext:
        scope = getattr(request, "scope", None)  # ASGIRequest; a WSGI/test request has META only
        if scope is None:
            headers = [
                (name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in request.headers.items()
            ]
            remote = request.META.get("REMOTE_ADDR")
            scope = {"type": "http", "headers": headers, "client": (remote, 0) if remote else None}
        return cls("http", scope, request)

    @classmethod
    def for_websocket(cls, scope: Mapping[str, Any]) -> RequestContext:
        return cls("websocket", scope)

    def header(self, name: str) -> str | None:
        """The first value of a request header, or None."""
        key = name.lower().encode("latin-1")
        for header_name, value in self.scope.get("headers", ()):
            if header_name.lower() == key:
                return str(value.decode("latin-1")).strip()
        return None

    @property
    def remote_address(self) -> str | None:
        client = self.scope.get("client")
        return str(client[0]) if client else None

    @property
    def subprotocols(self) -> Sequence[str]:
        """The subprotocols a WebSocket client offered (none over HTTP)."""
        return list(self.scope.get("subprotocols") or ()) if self.transport == "websocket" else []

    @functools.cached_property
    def bearer_token(self) -> str | None:
        """The token of `Authorization: Bearer <token>`, else (WebSocket) of an offered
        `acp.bearer.<token>` subprotocol when ALLOW_BEARER_SUBPROTOCOL is on (old browser
        clients; browsers use tickets, acp_channels._tickets). Never the query string: URLs end
        up in logs."""
        authorization = self.header("authorization")
        if authorization is not None:
            scheme, _, token = authorization.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
        if acp_settings.ALLOW_BEARER_SUBPROTOCOL is not True:
            return None
        for offered in self.subprotocols:
            if offered.startswith(BEARER_SUBPROTOCOL_PREFIX) and len(offered) > len(BEARER_SUBPROTOCOL_PREFIX):
                return offered[len(BEARER_SUBPROTOCOL_PREFIX) :]
        return None

    @property
    def offered_credentials(self) -> bool:
        """Whether the client sent any credential we could read (a 401 then says invalid)."""
        return self.bearer_token is not None or self.header("authorization") is not None

    async def user(self) -> Any:
        """The Django user of the request's session (AnonymousUser if not logged in), or None
        when the site has no sessions (no AuthenticationMiddleware over HTTP; no
        AuthMiddlewareStack over WebSocket). Looked up only when asked: token requests do not
        touch the database."""
        if self.request is not None:
            auser = getattr(self.request, "auser", None)
            user = await auser() if auser is not None else None
        else:
            user = self.scope.get("user")
        if user is not None and getattr(user, "is_authenticated", False):
            self.used_session = True
        return user


# -- the hook ------------------------------------------------------------------------------------


async def authenticate(context: RequestContext) -> Principal:
    """The principal of a request, by ACP_CHANNELS["AUTHENTICATE"] (ANONYMOUS when none is
    set). Raises Refused. A session-authenticated request from another site is refused (403)."""
    path: str | None = acp_settings.AUTHENTICATE
    if path is None:
        return ANONYMOUS
    authenticator = _callable(path)
    principal = await call_maybe_async(authenticator, context)
    if principal is None:
        raise Refused.invalid_token() if context.offered_credentials else Refused.unauthenticated()
    if not isinstance(principal, Principal):
        raise TypeError(f"ACP_CHANNELS['AUTHENTICATE'] = {path!r} returned {type(principal).__name__}, not a Principal")
    if context.used_session and (refusal := cross_site_refusal(context)) is not None:
        raise refusal
    return principal


@functools.lru_cache(maxsize=16)
def _callable(path: str) -> Callable[..., Any]:
    found: Callable[..., Any] = import_string(path)
    return found


async def call_maybe_async(function: Callable[..., Any], *args: Any) -> Any:
    """Call a sync or async callable without blocking the event loop: a coroutine function is
    awaited here; a plain function runs in a thread (it may query the database)."""
    if inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(type(function).__call__):
        return await function(*args)
    result = await sync_to_async(function)(*args)
    if inspect.isawaitable(result):
        return await result
    return result


def cross_site_refusal(context: RequestContext) -> Refused | None:
    """CSRF defence for cookie-authenticated requests (the browser attaches the cookie to
    requests other sites make). The Origin check (`cors.refusal`) already refuses a foreign
    Origin; this also refuses what the browser itself labels as made by another site
    (`Sec-Fetch-Site: cross-site` or `same-site`, i.e. not the page's own origin), even when
    the Origin is missing, unless the Origin is listed in CORS_ALLOWED_ORIGINS (trusted on
    purpose). Every request that reaches an agent counts, WebSocket upgrades included: each
    one drives the agent or takes over its output."""
    fetch_site = (context.header("sec-fetch-site") or "").lower()
    if fetch_site not in ("cross-site", "same-site"):
        return None  # same-origin, none (typed by the user), or not a browser
    origin = context.header("origin")
    if origin is not None and origin in acp_settings.CORS_ALLOWED_ORIGINS:
        return None
    return Refused.forbidden(CROSS_SITE)


# -- ready-made authenticators ---------------------------------------------------------------------


async def django_user(context: RequestContext) -> Principal:
    """The logged-in Django user (session cookie: AuthenticationMiddleware over HTTP, channels'
    AuthMiddlewareStack over WebSocket), with REQUIRED_PERMISSION if set. Without one: 401 with
    the `Cookie` challenge (SESSION_CHALLENGE: log in on the site; a token would not do)."""
    user = await context.user()
    if user is None or not getattr(user, "is_authenticated", False):
        raise Refused(401, AUTHENTICATION_REQUIRED, SESSION_CHALLENGE)
    return await user_principal(user)


async def bearer_token(context: RequestContext) -> Principal:
    """`Authorization: Bearer <token>` (or the `acp.bearer.<token>` subprotocol), looked up by
    ACP_CHANNELS["TOKEN_LOOKUP"]: token -> a Django user (then REQUIRED_PERMISSION applies), a
    Principal, or None (401 invalid_token). No TOKEN_LOOKUP, and the `acp_channels.tokens`
    app installed: its tokens, with the scopes the request needs (`acp_channels.tokens._lookup`)."""
    token = context.bearer_token
    if token is None:
        raise Refused.invalid_token() if context.header("authorization") is not None else Refused.unauthenticated()
    path: str | None = acp_settings.TOKEN_LOOKUP
    if path is None and apps.is_installed(TOKENS_APP):
        principal: Principal = await _callable(BUILTIN_TOKENS)(token, context)
        return principal
    if path is None:
        raise Refused.invalid_token()  # misconfigured (a system check says so): nobody gets in
    found = await call_maybe_async(_callable(path), token)
    if found is None:
        raise Refused.invalid_token()
    if isinstance(found, Principal):
        return found
    if not getattr(found, "is_authenticated", False) or not getattr(found, "is_active", True):
        raise Refused.invalid_token()
    return await user_principal(found)


async def user_principal(user: Any) -> Principal:
    """A Django user as a principal ("user", pk, username), refused (403) without
    REQUIRED_PERMISSION."""
    permission: str | None = acp_settings.REQUIRED_PERMISSION
    if permission is not None and not await _has_perm(user, permission):
        raise Refused.forbidden()
    return Principal("user", str(user.pk), str(user.get_username()))


async def _has_perm(user: Any, permission: str) -> bool:
    ahas_perm: Callable[[str], Awaitable[bool]] | None = getattr(user, "ahas_perm", None)
    if ahas_perm is not None:
        return bool(await ahas_perm(permission))
    return bool(await sync_to_async(user.has_perm)(permission))


async def user_has_permission(principal: Principal, permission: str) -> bool:
    """Whether `principal` is a Django user ("user", pk) with `permission` (an inactive or
    deleted user has none; a token without a user has none)."""
    if principal.kind != "user":
        return False
    from django.contrib.auth import get_user_model

    user = await get_user_model()._default_manager.filter(pk=principal.id).afirst()
    return user is not None and await _has_perm(user, permission)


async def settings_tokens(token: str) -> Principal | None:
    """TOKEN_LOOKUP for a shared token: ACP_CHANNELS["TOKENS"] = {token: principal id}. Every
    entry is compared in constant time, with no early exit, so timing tells nothing about
    which entry (or how much of one) matched."""
    tokens: Mapping[str, str] = acp_settings.TOKENS or {}
    given = token.encode()
    found: str | None = None
    for candidate, principal_id in tokens.items():
        if hmac.compare_digest(given, candidate.encode()) and found is None:
            found = principal_id
    return None if found is None else Principal("token", found, found)


def session_auth_configured() -> bool:
    """Whether the site has Django sessions and logged-in users (the auth and sessions apps and
    AuthenticationMiddleware): then WebSocket upgrades get channels' AuthMiddlewareStack.
    Sites without (token auth, no database) are not made to have one."""
    from django.conf import settings

    apps = set(settings.INSTALLED_APPS)
    middleware = list(getattr(settings, "MIDDLEWARE", None) or ())
    return {
        "django.contrib.auth",
        "django.contrib.sessions",
    } <= apps and "django.contrib.auth.middleware.AuthenticationMiddleware" in middleware
