"""WebSocket tickets (docs/authentication.md#tickets): how a browser's WebSocket authenticates
without its token in the upgrade.

`POST <endpoint>/tickets`, authenticated as the endpoint is (a bearer token; or the site's
session cookie, then with Django's CSRF protection), answers a random ticket bound to the
principal and to the request's Origin, valid for TICKET_SECONDS (at most 60). The upgrade offers
the subprotocols `acp` and `acp-ticket.<ticket>`; the consumer takes the ticket (once: a second
upgrade with it, on any worker, is refused) and the socket is the ticket's principal's.

Tickets live in Django's cache (ACP_CHANNELS["TICKET_CACHE"], "default"), which every worker must
share (a system check says so): the store holds a digest of the ticket, never the ticket, and a
take is a read then a `delete` that reports whether it removed the entry, so of two workers
taking the same ticket at once only one gets it. Neither a ticket nor a token is ever logged.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import math
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from asgiref.sync import sync_to_async
from django.apps import AppConfig
from django.conf import settings
from django.core.cache import BaseCache, caches
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.utils.module_loading import import_string
from django.views.decorators.csrf import csrf_exempt

from acp_channels import _cors as cors
from acp_channels import oauth
from acp_channels._conf import acp_settings
from acp_channels._identity import Principal
from acp_channels._views import error_response, text_response
from acp_channels.auth import RequestContext, authenticate
from acp_channels.errors import Refused

#: The subprotocol a WebSocket offers its ticket in, after `acp`.
TICKET_SUBPROTOCOL_PREFIX: Final = "acp-ticket."
#: The URL name of the tickets endpoint in acp_channels.urls.
URL_NAME: Final = "acp-tickets"
#: The ACP Remote security draft's cap on a ticket's life.
MAX_TICKET_SECONDS: Final = 60.0
logger = logging.getLogger("acp_channels.tickets")
#: The store failed (a cache on a Redis that is down): no ticket now, try again.
STORE_UNAVAILABLE = "the WebSocket ticket store is unavailable; try again"
#: Why an upgrade with a ticket was refused (logged; never the ticket).
TICKET_REFUSED = "the WebSocket ticket is unknown, used, expired or issued for another origin"
CSRF_FAILED = "CSRF verification failed: send the csrftoken cookie's value in X-CSRFToken"
KEY_PREFIX: Final = "acp_channels:ticket:"
#: Caches that live in one process (or nowhere): a ticket one worker issues is unknown to the rest.
PROCESS_LOCAL_CACHES: Final = frozenset(
    {"django.core.cache.backends.locmem.LocMemCache", "django.core.cache.backends.dummy.DummyCache"}
)
DUMMY_CACHE: Final = "django.core.cache.backends.dummy.DummyCache"
IN_MEMORY_LAYER: Final = "channels.layers.InMemoryChannelLayer"


@dataclass(frozen=True, slots=True)
class Taken:
    """What a valid ticket stood for: its principal, and the scopes of the OAuth access token it
    was bought with (None: not an OAuth token), checked again at the upgrade."""

    principal: Principal
    scopes: tuple[str, ...] | None = None


def now() -> float:
    """The clock tickets expire by (a test may replace it)."""
    return time.time()


def _store() -> BaseCache:
    return caches[acp_settings.TICKET_CACHE]


def _key(ticket: str) -> str:
    # A digest: whoever reads the store (a cache dump, MONITOR) learns no ticket it could use.
    return KEY_PREFIX + hashlib.sha256(ticket.encode()).hexdigest()


def lifetime() -> float:
    return min(float(acp_settings.TICKET_SECONDS), MAX_TICKET_SECONDS)


async def issue(principal: Principal, origin: str | None, scopes: Sequence[str] | None = None) -> tuple[str, float]:
    """A new ticket for `principal`, usable once from `origin` (None: a client that sends no
    Origin), with the OAuth scopes it was bought with (None: no OAuth token); with the moment
    it expires (seconds since the epoch)."""
    return await sync_to_async(issue_sync)(principal, origin, scopes)


def issue_sync(principal: Principal, origin: str | None, scopes: Sequence[str] | None = None) -> tuple[str, float]:
    ticket = secrets.token_urlsafe(32)  # RFC 6455 token characters: it fits a subprotocol
    expires = now() + lifetime()
    if principal.expires_at is not None:  # never outlives the credential it was bought with
        expires = min(expires, principal.expires_at)
    entry = {
        "principal": principal.to_wire(),
        "origin": origin,
        "expires": expires,
        "scopes": None if scopes is None else list(scopes),
    }
    # The store forgets it a little after it expires; the expiry itself is checked at the take.
    _store().set(_key(ticket), entry, math.ceil(lifetime()) + 1)
    return ticket, expires


async def take(ticket: str, origin: str | None) -> Taken | None:
    """What `ticket` stands for when it is valid for `origin`, or None (unknown, taken already,
    expired, issued for another origin). It is gone after this, whatever the answer."""
    return await sync_to_async(take_sync)(ticket, origin)


def take_sync(ticket: str, origin: str | None) -> Taken | None:
    store, key = _store(), _key(ticket)
    try:
        entry = store.get(key)
        if not isinstance(entry, Mapping):
            return None
        if not store.delete(key):  # another worker took it between the two
            return None
    except Exception as error:  # the cache's backend failing (Redis down): refused, said once
        logger.warning("could not take a WebSocket ticket: %s: %s", type(error).__name__, error)
        return None
    if entry.get("expires", 0) <= now() or entry.get("origin") != origin:
        return None
    scopes = entry.get("scopes")
    try:
        principal = Principal.from_wire(entry["principal"])
    except (KeyError, TypeError, ValueError):
        return None
    return Taken(principal, None if scopes is None else tuple(str(scope) for scope in scopes))


def offered_ticket(subprotocols: Sequence[str]) -> str | None:
    """The ticket of an offered `acp-ticket.<ticket>` subprotocol, or None."""
    for offered in subprotocols:
        if offered.startswith(TICKET_SUBPROTOCOL_PREFIX) and len(offered) > len(TICKET_SUBPROTOCOL_PREFIX):
            return offered[len(TICKET_SUBPROTOCOL_PREFIX) :]
    return None


# -- the endpoint ----------------------------------------------------------------------------


@csrf_exempt  # for bearer tokens; a cookie-authenticated caller is checked below, as Django does
async def tickets_endpoint(request: HttpRequest) -> HttpResponseBase:
    """POST: a ticket for the caller, as JSON {ticket, subprotocol, expiresIn, expiresAt}."""
    refusal = cors.refusal(request, reaches_agent=request.method == "POST")
    if refusal is not None:
        return text_response(*refusal)
    if request.method == "OPTIONS" and cors.cors_enabled():
        return cors.preflight_response()
    if request.method != "POST":
        response = text_response(405)
        response["Allow"] = "POST"
        return response
    context = RequestContext.for_http(request)
    try:
        principal = await authenticate(context)
    except Refused as refused:
        return error_response(refused)
    if context.used_session and (failed := await sync_to_async(_csrf_failure)(request)) is not None:
        return failed
    try:
        ticket, expires = await issue(principal, context.header("origin"), oauth.token_scopes(context))
    except Exception as error:  # the cache's backend failing (Redis down): never a 500
        logger.warning("could not store a WebSocket ticket: %s: %s", type(error).__name__, error)
        response = text_response(503, STORE_UNAVAILABLE)
        response["Retry-After"] = "1"
        return response
    response = JsonResponse(
        {
            "ticket": ticket,
            "subprotocol": TICKET_SUBPROTOCOL_PREFIX + ticket,
            "expiresIn": lifetime() if principal.expires_at is None else round(max(0.0, expires - now()), 3),
            "expiresAt": datetime.datetime.fromtimestamp(expires, datetime.UTC).isoformat().replace("+00:00", "Z"),
        }
    )
    response["Cache-Control"] = "no-store"
    cors.vary_on_origin(response)
    return response


def _csrf_failure(request: HttpRequest) -> HttpResponse | None:
    """Django's CSRF check (the csrftoken cookie and X-CSRFToken, the Origin and, over https,
    the Referer) for a caller authenticated by the session cookie; None when it passes."""

    def no_view(request: HttpRequest) -> HttpResponse:
        raise AssertionError("not called")

    middleware = CsrfViewMiddleware(no_view)
    middleware.process_request(request)
    if middleware.process_view(request, no_view, (), {}) is None:
        return None
    return text_response(403, CSRF_FAILED)


# -- system checks ---------------------------------------------------------------------------


@register(Tags.compatibility)
def check_tickets(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """E090 (TICKET_SECONDS), E091 (TICKET_CACHE: a cache every worker shares), W090 (the old
    bearer subprotocol accepted)."""
    errors: list[CheckMessage] = []
    seconds = acp_settings.TICKET_SECONDS
    number = isinstance(seconds, int | float) and not isinstance(seconds, bool)
    if number and seconds > MAX_TICKET_SECONDS:
        errors.append(
            Error(
                f"ACP_CHANNELS['TICKET_SECONDS'] must be at most {MAX_TICKET_SECONDS:g}, not {seconds!r}.",
                hint="The ACP Remote security draft allows a WebSocket ticket at most 60 seconds.",
                id="acp_channels.E090",
            )
        )
    errors += _check_store()
    if acp_settings.ALLOW_BEARER_SUBPROTOCOL is True:
        errors.append(
            Warning(
                "ACP_CHANNELS['ALLOW_BEARER_SUBPROTOCOL'] is on: WebSocket clients may send their bearer token in "
                "the subprotocol acp.bearer.<token>, which proxies and servers may log.",
                hint="Move browser clients to tickets (POST /acp/tickets, the acp-ticket.<ticket> subprotocol; "
                "acp-client.js does it) and turn it off (docs/authentication.md#tickets).",
                id="acp_channels.W090",
            )
        )
    return errors


SHARED_CACHE_HINT = (
    "Give the workers one cache: CACHES[{alias!r}] = {{'BACKEND': 'django.core.cache.backends.redis.RedisCache', "
    "'LOCATION': <the channel layer's Redis URL>}} (or point ACP_CHANNELS['TICKET_CACHE'] at such an alias); "
    "see docs/authentication.md#tickets."
)


def _check_store() -> list[CheckMessage]:
    alias = acp_settings.TICKET_CACHE
    configured = getattr(settings, "CACHES", None) or {}
    if not isinstance(alias, str) or alias not in configured:
        return [
            Error(
                f"ACP_CHANNELS['TICKET_CACHE'] = {alias!r} is not an alias in CACHES.",
                hint="Name the cache WebSocket tickets are kept in (every worker must share it).",
                id="acp_channels.E091",
            )
        ]
    backend = configured[alias].get("BACKEND") if isinstance(configured[alias], Mapping) else None
    hint = SHARED_CACHE_HINT.format(alias=alias)
    if _is(backend, DUMMY_CACHE):
        return [
            Error(
                f"CACHES[{alias!r}] (ACP_CHANNELS['TICKET_CACHE']) is the DummyCache: it keeps no ticket, so every "
                "WebSocket that offers one is refused.",
                hint=hint,
                id="acp_channels.E091",
            )
        ]
    if any(_is(backend, local) for local in PROCESS_LOCAL_CACHES) and _several_workers():
        return [
            Error(
                f"CACHES[{alias!r}] (ACP_CHANNELS['TICKET_CACHE']) is {backend}, memory of one process, while the "
                "channel layer is shared by several workers: a WebSocket ticket one worker issues is unknown to "
                "the others, so a browser's socket is refused whenever the upgrade reaches another worker.",
                hint=hint,
                id="acp_channels.E091",
            )
        ]
    return []


def _several_workers() -> bool:
    """Whether workers share the default channel layer (anything but the in-memory one), as
    several workers, or web workers and runners, must."""
    layers = getattr(settings, "CHANNEL_LAYERS", None)
    default = layers.get("default") if isinstance(layers, Mapping) else None
    backend = default.get("BACKEND") if isinstance(default, Mapping) else None
    return isinstance(backend, str) and not _is(backend, IN_MEMORY_LAYER)


def _is(backend: Any, path: str) -> bool:
    """Whether the dotted path `backend` is the class at `path` or a subclass of it (a site's own
    LocMemCache is memory of one process too)."""
    if backend == path:
        return True
    try:
        found, base = import_string(backend), import_string(path)
    except Exception:  # not a dotted path, or it does not import: Django's own checks say so
        return False
    return isinstance(found, type) and isinstance(base, type) and issubclass(found, base)
