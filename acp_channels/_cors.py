"""Who may use the ACP endpoint: the Host and Origin rules, and CORS through django-cors-headers.

`ACP_CHANNELS["CORS_ALLOWED_ORIGINS"]` is the one allowlist. django-cors-headers does the HTTP
side (we only tell it, per request, that an allowed origin is asking for our endpoint).

Every request, HTTP or WebSocket upgrade, must name an allowed host (Django's ALLOWED_HOSTS:
channels applies it to no WebSocket, and the demo's middleware calls `get_host()` nowhere), and
a browser request must come from the server's own origin or a listed one: a page on a foreign
origin whose name resolves to the server (DNS rebinding) must not reach the agent. Requests
without an Origin (every non-browser client) are accepted.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterable, Mapping
from typing import Any, Final, NamedTuple
from urllib.parse import urlsplit

from django.core.exceptions import DisallowedHost
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.urls import Resolver404, resolve
from django.utils.cache import patch_vary_headers

from acp_channels._conf import acp_settings
from acp_channels._logs import RateLimited, logged_already

logger = logging.getLogger("acp_channels.cors")
#: Where Django logs a disallowed Host; sites filter or alert on it. Any client can send one per
#: request: one WARNING a minute, the repeats at INFO (acp_channels._logs).
disallowed_host_logger = logging.getLogger("django.security.DisallowedHost")
disallowed_hosts = RateLimited(disallowed_host_logger)

#: Response headers a browser client must be able to read.
ACP_EXPOSE_HEADERS: Final[tuple[str, ...]] = ("acp-connection-id", "acp-session-id")
#: Request headers a browser client sends; preflights must allow them.
ACP_ALLOW_HEADERS: Final[tuple[str, ...]] = (
    "accept",
    "content-type",
    "acp-connection-id",
    "acp-session-id",
    "last-event-id",
    "acp-attach-session",
    "acp-attach-role",
    "acp-attach-cursor",
)
#: Methods a cross-origin page uses on the endpoint (HEAD is safelisted): a site whose only CORS
#: user is /acp sets `CORS_ALLOW_METHODS` to this, advertising nothing it does not serve.
ACP_ALLOW_METHODS: Final[tuple[str, ...]] = ("DELETE", "GET", "OPTIONS", "POST")
#: The URL name of the endpoint in acp_channels.urls.
ENDPOINT_URL_NAME: Final = "acp"
#: The URLs that answer across origins: the endpoint, and the session directory and the
#: WebSocket tickets beside it.
CORS_URL_NAMES: Final = frozenset((ENDPOINT_URL_NAME, "acp-sessions", "acp-tickets"))


ORIGIN_NOT_ALLOWED = "origin not allowed"
HOST_NOT_ALLOWED = "host not allowed"
DEFAULT_PORTS: Final = {"http": 80, "https": 443}


def cors_allow_headers(*lists: Iterable[str]) -> tuple[str, ...]:
    """`CORS_ALLOW_HEADERS` for a site: the given lists (django-cors-headers' `default_headers`,
    the site's own) and ours, each name once (lower case), in first-seen order. Concatenating
    them would list `accept` and `content-type` twice."""
    return tuple(dict.fromkeys(name.lower() for names in (*lists, ACP_ALLOW_HEADERS) for name in names))


class Refusal(NamedTuple):
    """Why a request may not use the endpoint: an HTTP status and a plain-text reason."""

    status: int
    reason: str


def refusal(request: HttpRequest, *, reaches_agent: bool = True) -> Refusal | None:
    """None when the request may proceed: its Host is allowed and its Origin is absent, its own,
    or listed. A disallowed Host is 400 (Django's answer), a foreign Origin 403. A request that
    reaches no agent (a preflight, a method answered 405) is not refused for its Origin."""
    try:
        host = request.get_host()  # validates against ALLOWED_HOSTS
    except DisallowedHost as error:
        disallowed_hosts.warning("host", "%s", error)
        logged_already(request)  # one line per refused request: not Django's too
        return Refusal(400, HOST_NOT_ALLOWED)
    origin = request.META.get("HTTP_ORIGIN")  # META: request.headers would be built for this alone
    if origin is None or not reaches_agent or origin_allowed(origin, host, secure=request.is_secure()):
        return None
    logger.info("refused a request from origin %r (not %s's own, not in CORS_ALLOWED_ORIGINS)", origin, host)
    logged_already(request)
    return Refusal(403, ORIGIN_NOT_ALLOWED)


def origin_allowed(origin: str, host: str, *, secure: bool) -> bool:
    """A browser origin may use the endpoint when it is listed or is the server's own."""
    return origin in acp_settings.CORS_ALLOWED_ORIGINS or same_origin(origin, host, secure=secure)


def same_origin(origin: str, host: str, *, secure: bool) -> bool:
    """Whether `origin` (an Origin header) is the origin of the server the request reached:
    the scheme the request came over (http for ws, https for wss and TLS behind a trusted
    proxy), and the Host's name and port, default ports filled in as a browser does."""
    page = origin_parts(origin)
    if page is None or any(char in host for char in "@/?#\\"):
        return False
    scheme = "https" if secure else "http"
    try:
        target = urlsplit(f"//{host}")
        port = target.port
    except ValueError:
        return False
    if not target.hostname:
        return False
    return page == (scheme, target.hostname, port if port is not None else DEFAULT_PORTS[scheme])


def origin_parts(origin: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of a serialized http(s) origin; None for "null" or anything else."""
    try:
        parts = urlsplit(origin)
        port = parts.port
    except ValueError:
        return None
    if (
        parts.scheme not in DEFAULT_PORTS
        or not parts.hostname
        or "@" in parts.netloc
        or parts.path
        or parts.query
        or parts.fragment
    ):
        return None
    return parts.scheme, parts.hostname, port if port is not None else DEFAULT_PORTS[parts.scheme]


def websocket_request(scope: Mapping[str, Any]) -> HttpRequest:
    """The upgrade of a WebSocket scope as a Django request, so the Host and scheme rules are
    Django's own (ALLOWED_HOSTS, USE_X_FORWARDED_HOST, SECURE_PROXY_SSL_HEADER)."""
    scheme = "https" if scope.get("scheme") == "wss" else "http"
    return ASGIRequest({**scope, "type": "http", "method": "GET", "scheme": scheme}, io.BytesIO())


def cors_enabled() -> bool:
    return bool(acp_settings.CORS_ALLOWED_ORIGINS)


def preflight_response() -> HttpResponse:
    """With CORS on, every OPTIONS is a preflight: 200, empty. django-cors-headers answers those
    from listed origins before the view; this answers the rest (no ACAO for them)."""
    return HttpResponse(headers={"content-length": "0"})


def vary_on_origin(response: HttpResponseBase) -> None:
    """With CORS on, every answer depends on the Origin (caches must not mix them up)."""
    if cors_enabled():
        patch_vary_headers(response, ("origin",))


def enable_cors_for_acp(sender: Any, request: HttpRequest, **kwargs: Any) -> bool:
    """django-cors-headers' `check_request_enabled` receiver: our endpoint, a listed origin."""
    origin = request.META.get("HTTP_ORIGIN")
    if not origin or origin not in acp_settings.CORS_ALLOWED_ORIGINS:
        return False
    try:
        return resolve(request.path_info).url_name in CORS_URL_NAMES
    except Resolver404:
        return False
