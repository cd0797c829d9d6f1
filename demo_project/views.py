"""The demo's browser client: the page at `/` (its script, styles and the reusable
acp_channels/acp-client.js module are static files, demo_project/asgi.py serves them)."""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import ensure_csrf_cookie
from django.views.decorators.http import require_safe

PAGE = Path(__file__).resolve().parent / "pages" / "index.html"


@cache
def _page() -> bytes:
    return PAGE.read_bytes()


def content_security_policy() -> str:
    """Only this origin's scripts and styles, no inline script; connections to this origin and
    to what ACP_DEMO_CONNECT_SRC adds (space separated: the origins of an ACP server elsewhere,
    e.g. "https://agents.example.com wss://agents.example.com")."""
    extra = os.environ.get("ACP_DEMO_CONNECT_SRC", "").split()
    return "; ".join(
        [
            "default-src 'none'",
            "script-src 'self'",
            "style-src 'self'",
            "img-src 'self'",
            "connect-src " + " ".join(["'self'", *extra]),
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        ]
    )


@require_safe
@ensure_csrf_cookie  # a site with logged-in users: the page sends it when it asks for a WebSocket ticket
def index(request: HttpRequest) -> HttpResponse:
    return HttpResponse(
        _page(),
        content_type="text/html; charset=utf-8",
        headers={
            "Content-Security-Policy": content_security_policy(),
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
            "Cache-Control": "no-cache",
        },
    )
