"""Settings of the demo project: acp_channels serving the demo agent at /acp."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from corsheaders.defaults import default_headers

from acp_channels import ACP_ALLOW_METHODS, ACP_EXPOSE_HEADERS, cors_allow_headers, settings_from_environment

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "demo-only-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "") == "1"
# Loopback names only, so a page whose DNS name is rebound to this machine cannot reach the agent
# (its requests carry that name as Host). Serving on other names: ACP_ALLOWED_HOSTS, comma
# separated, in Django's ALLOWED_HOSTS syntax (e.g. "acp.example.com,.internal.example").
ALLOWED_HOSTS = [
    host.strip() for host in os.environ.get("ACP_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",") if host.strip()
]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.staticfiles",
    "corsheaders",
    "channels",
    "acp_channels",
]
# The browser page's script and styles (demo_project/static) and acp_channels' own
# (acp_channels/static: acp-client.js), served by demo_project/asgi.py.
STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "demo_project" / "static"]

# Only ASGI-native middleware: each MiddlewareMixin-based one (SecurityMiddleware,
# CommonMiddleware, ...) costs every request thread hops under ASGI (see bench/PROFILE.md, finding 1).
MIDDLEWARE = [
    "corsheaders.middleware.CorsMiddleware",
]

ROOT_URLCONF = "demo_project.urls"
ASGI_APPLICATION = "demo_project.asgi.application"
DATABASES: dict[str, dict[str, str]] = {}
USE_TZ = True
# Django sets the process's time zone (TZ) from this, America/Chicago when unset: daphne's own log
# lines and its access log follow it. UTC, whatever the machine's zone.
TIME_ZONE = "UTC"

# One process: the in-memory layer. Several workers: REDIS_URL=redis://host:6379/0 (see
# docs/several-workers.md): capacity and expiry sized for ACP traffic between workers.
REDIS_URL = os.environ.get("REDIS_URL")
CHANNEL_LAYERS = {
    "default": {
        # Our Redis Streams layer (redis-py; a connection pool that waits under a burst).
        "BACKEND": "acp_channels.layers.RedisChannelLayer",
        "CONFIG": {
            "hosts": [REDIS_URL],
            "prefix": os.environ.get("ACP_REDIS_PREFIX", "asgi"),
            # Worker inboxes carry every cross-worker call: never let a burst fill them.
            "channel_capacity": {"acp.worker.*": 10000},
            "expiry": 60,
        },
    }
    if REDIS_URL
    else {"BACKEND": "channels.layers.InMemoryChannelLayer"}
}
# WebSocket tickets (docs/authentication.md#tickets) are kept in the cache: with several workers,
# one they all share (the layer's Redis), else a ticket issued by one is unknown to the others.
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": os.environ.get("ACP_REDIS_PREFIX", "asgi"),
    }
    if REDIS_URL
    else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
}


def _origins(value: str) -> list[str]:
    return [origin.strip() for origin in value.split(",") if origin.strip()]


def _agent() -> str | dict[str, Any]:
    """ACP_AGENT: a dotted path, or a JSON object for a stdio agent command. Unset: the demo
    agent, in-process, or as its own process per connection with ACP_DEMO_AGENT=subprocess."""
    value = os.environ.get("ACP_AGENT", "")
    if value.startswith("{"):
        command: dict[str, Any] = json.loads(value)
        return command
    if value:
        return value
    if os.environ.get("ACP_DEMO_AGENT", "in-process") == "subprocess":
        return {"command": [sys.executable, "-m", "demo_project.agent"], "cwd": str(BASE_DIR)}
    return "demo_project.agent.create_agent"


def _authentication() -> dict[str, Any]:
    """The demo serves anyone on loopback, on purpose (ALLOW_ANONYMOUS). `ACP_TOKEN=<secret>`
    turns on one shared bearer token instead: clients send `Authorization: Bearer <secret>`."""
    token = os.environ.get("ACP_TOKEN", "")
    if not token:
        return {"ALLOW_ANONYMOUS": True}
    return {
        "AUTHENTICATE": "acp_channels.auth.bearer_token",
        "TOKEN_LOOKUP": "acp_channels.auth.settings_tokens",
        "TOKENS": {token: "team"},
    }


ACP_CHANNELS = {
    "AGENT": _agent(),
    # Prometheus metrics at /metrics (off by default): the demo serves loopback only. A site
    # reachable from outside serves them where only its scraper can reach (docs/operations.md).
    "METRICS": True,
    "CORS_ALLOWED_ORIGINS": _origins(os.environ.get("ACP_CORS_ALLOWED_ORIGINS", "")),
    **_authentication(),
    # ACP_<KEY>=value overrides one key (ACP_MAX_CONNECTIONS=none: no cap); the rest keep
    # acp_channels' production defaults.
    **settings_from_environment(skip=("AGENT", "CORS_ALLOWED_ORIGINS")),
}

# ACP_DEMO_OAUTH=1: /acp as an OAuth 2 protected resource, django-oauth-toolkit issuing the tokens
# on the same site, with a SQLite database (demo_project/oauth.py). Instead of ACP_TOKEN.
DEMO_OAUTH = os.environ.get("ACP_DEMO_OAUTH", "") == "1"
if DEMO_OAUTH:
    from demo_project.oauth import configure

    configure(globals())

# django-cors-headers: only the ACP endpoint is ever enabled (by acp_channels, for listed origins).
CORS_URLS_REGEX = r"^$"
CORS_EXPOSE_HEADERS = [*ACP_EXPOSE_HEADERS]
CORS_ALLOW_HEADERS = cors_allow_headers(default_headers)
CORS_ALLOW_METHODS = ACP_ALLOW_METHODS


class UtcFormatter(logging.Formatter):
    """Timestamps in UTC, ISO 8601 with a Z (2026-12-04T05:07:30.906Z), whatever TZ says."""

    converter = staticmethod(time.gmtime)
    default_time_format = "%Y-%m-%dT%H:%M:%S"
    default_msec_format = "%s.%03dZ"


# acp_channels logs through its own handler, whatever the server does with the root logger
# (daphne configures one, uvicorn does not); not propagated, so each line is printed once.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"()": UtcFormatter, "fmt": "%(asctime)s %(levelname)-8s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "acp_channels": {
            "handlers": ["console"],
            "level": os.environ.get("ACP_LOG_LEVEL", "INFO"),
            "propagate": False,
        }
    },
}
