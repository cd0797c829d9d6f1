"""The demo served in production behind a TLS-terminating proxy: the settings docs/deployment.md
explains, kept clean under `manage.py check --deploy` by tests/test_deploy_settings.py.

    DJANGO_SETTINGS_MODULE=demo_project.settings_production
    DJANGO_SECRET_KEY=<50+ random characters>  ACP_ALLOWED_HOSTS=acp.example.com
    ACP_TOKEN=<a shared bearer token>  (or ACP_AUTHENTICATE=<dotted path>, or ACP_ALLOW_ANONYMOUS=1)

Everything else is the demo's (demo_project/settings.py): the agent, the channel layer, CORS,
logging and the ACP_CHANNELS caps (ACP_<KEY> environment overrides still apply).
"""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured

from demo_project.settings import *  # noqa: F403
from demo_project.settings import ACP_CHANNELS, MIDDLEWARE


def _required(name: str) -> str:
    """A variable the server must not start without (no guessable key, no host list that lets
    any name in)."""
    value = os.environ.get(name, "").strip()
    if not value:
        raise ImproperlyConfigured(f"{name} must be set in the environment (see docs/deployment.md)")
    return value


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _require_authentication() -> None:
    """Production never serves anonymously by accident: a token (ACP_TOKEN), an authenticator
    (ACP_AUTHENTICATE), or anonymous access asked for in so many words (ACP_ALLOW_ANONYMOUS=1)."""
    anonymous = _flag("ACP_ALLOW_ANONYMOUS")
    if not (os.environ.get("ACP_TOKEN") or os.environ.get("ACP_AUTHENTICATE") or anonymous):
        raise ImproperlyConfigured(
            "ACP_TOKEN or ACP_AUTHENTICATE must be set in the environment, or ACP_ALLOW_ANONYMOUS=1 to serve "
            "everyone (see docs/deployment.md)"
        )


_require_authentication()
# /metrics tells whoever reaches it how busy the site is: on only when asked (ACP_METRICS=1), where
# only the scraper reaches the workers' own ports (docs/operations.md).
ACP_CHANNELS = {**ACP_CHANNELS, "METRICS": _flag("ACP_METRICS")}
DEBUG = False
SECRET_KEY = _required("DJANGO_SECRET_KEY")
ALLOWED_HOSTS = [host.strip() for host in _required("ACP_ALLOWED_HOSTS").split(",") if host.strip()]

# TLS ends at the proxy, which must set X-Forwarded-Proto (and overwrite any the client sent).
# request.is_secure() and the WebSocket same-origin check then see https/wss.
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = True
SECURE_REDIRECT_EXEMPT = [r"^health$", r"^ready$", r"^metrics$"]  # probes and scrapers over plain HTTP
SECURE_HSTS_SECONDS = 31_536_000  # one year; start lower (e.g. 3600) until TLS is known good
SECURE_HSTS_INCLUDE_SUBDOMAINS = True
SECURE_HSTS_PRELOAD = True
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True

# SecurityMiddleware (HSTS, the HTTPS redirect, nosniff, Referrer-Policy, COOP), CSRF
# protection for the site's other views (/acp is exempt: its cross-site defence is the Origin
# check) and X-Frame-Options. They are MiddlewareMixin-based: under ASGI they cost thread hops per
# request and an OS thread per open SSE stream (docs/deployment.md, "What the middleware costs").
# CorsMiddleware stays first.
MIDDLEWARE = [
    *MIDDLEWARE,
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
