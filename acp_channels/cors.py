"""Cross-origin access to the ACP endpoint, through django-cors-headers.

`ACP_CHANNELS["CORS_ALLOWED_ORIGINS"]` is the one allowlist. django-cors-headers does the HTTP
side (we only tell it, per request, that an allowed origin is asking for our endpoint); the
WebSocket consumer applies the same list to the upgrade's Origin.
"""

from __future__ import annotations

from typing import Any, Final

from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.urls import Resolver404, resolve
from django.utils.cache import patch_vary_headers

from acp_channels.conf import acp_settings

#: Response headers a browser client must be able to read.
ACP_EXPOSE_HEADERS: Final = ("acp-connection-id", "acp-session-id")
#: Request headers a browser client sends; preflights must allow them.
ACP_ALLOW_HEADERS: Final = ("accept", "content-type", "acp-connection-id", "acp-session-id", "last-event-id")
#: The URL name of the endpoint in acp_channels.urls.
ENDPOINT_URL_NAME: Final = "acp"


def origin_allowed(origin: str | None) -> bool:
    """The WebSocket rule: no Origin (not a browser) is fine; a browser origin must be listed."""
    return origin is None or origin in acp_settings.CORS_ALLOWED_ORIGINS


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
    origin = request.headers.get("origin")
    if not origin or origin not in acp_settings.CORS_ALLOWED_ORIGINS:
        return False
    try:
        return resolve(request.path_info).url_name == ENDPOINT_URL_NAME
    except Resolver404:
        return False
