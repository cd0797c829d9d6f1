"""System checks for `ACP_CHANNELS` and the channel layer settings (ids acp_channels.E001...).

What they read is the settings and the code they name (an agent, an authenticator, a layer's
backend must import). The checks that look further, at the installed versions, the permission
REQUIRED_PERMISSION names and a channel layer that must answer, are in acp_channels._startup,
which also runs them all as a server starts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final
from urllib.parse import urlsplit

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.utils.module_loading import import_string

from acp_channels._agents import stdio
from acp_channels._agents.factory import factory_problem
from acp_channels._conf import DEFAULTS, AcpSettings, acp_settings
from acp_channels._cors import ACP_ALLOW_HEADERS, ACP_EXPOSE_HEADERS


@register(Tags.compatibility)
def check_settings(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    raw = getattr(settings, "ACP_CHANNELS", {})
    if not isinstance(raw, dict):
        return [Error("ACP_CHANNELS must be a dict.", id="acp_channels.E000")]
    errors: list[CheckMessage] = []
    errors += _check_agent(raw.get("AGENT"))
    errors += _check_declared()
    errors += _check_budgets()
    errors += _check_cors()
    errors += _check_authentication(raw.get("AGENT"))
    errors += _check_agent_hosts()
    errors += [
        Warning(
            f"ACP_CHANNELS has an unknown key {key!r}.",
            hint=f"Known keys: {', '.join(DEFAULTS)}.",
            id="acp_channels.W001",
        )
        for key in raw
        if key not in DEFAULTS
    ]
    errors += _check_middleware()
    return errors


def _check_agent(path: Any) -> list[CheckMessage]:
    hint = (
        'Set ACP_CHANNELS["AGENT"] to the dotted path of a callable returning an acp Agent (it may take the '
        'connection\'s AgentContext), or to {"command": [program, *args], "cwd": ..., "env_passthrough": [...], '
        '"env": {...}, "configure": "dotted.path"} for a stdio agent.'
    )
    if isinstance(path, Mapping):
        return [
            Error(f"ACP_CHANNELS['AGENT'] (a stdio agent): {problem}.", hint=hint, id="acp_channels.E001")
            for problem in stdio.setting_problems(path)
        ]
    if not isinstance(path, str) or not path:
        return [Error("ACP_CHANNELS['AGENT'] is not set.", hint=hint, id="acp_channels.E001")]
    try:
        factory = import_string(path)
    except Exception as error:  # ImportError, or the module itself failing to import
        return [
            Error(f"ACP_CHANNELS['AGENT'] = {path!r} cannot be imported: {error}", hint=hint, id="acp_channels.E001")
        ]
    if (problem := factory_problem(factory)) is not None:
        return [Error(f"ACP_CHANNELS['AGENT'] = {path!r} {problem}.", hint=hint, id="acp_channels.E001")]
    return []


def _check_agent_hosts() -> list[CheckMessage]:
    """E041: runners need a channel layer other processes share."""
    if acp_settings.AGENT_HOSTS != "runners":
        return []
    layers = getattr(settings, "CHANNEL_LAYERS", None)
    default = layers.get("default") if isinstance(layers, Mapping) else None
    backend = default.get("BACKEND") if isinstance(default, Mapping) else None
    if backend is None or backend == "channels.layers.InMemoryChannelLayer":
        return [
            Error(
                "ACP_CHANNELS['AGENT_HOSTS'] is 'runners', but the default channel layer is "
                f"{backend or 'not configured'}: the web workers could not reach a runner.",
                hint="Configure CHANNEL_LAYERS on Redis (docs/runners.md), or AGENT_HOSTS = 'workers'.",
                id="acp_channels.E041",
            )
        ]
    return []


def _check_declared() -> list[CheckMessage]:
    """Every setting whose declaration carries its rule (numbers and flags, conf.AcpSettings)."""
    errors: list[CheckMessage] = []
    for name, setting in AcpSettings.declared().items():
        problem = setting.problem(getattr(acp_settings, name))
        if problem is not None:
            errors.append(Error(f"ACP_CHANNELS['{name}'] {problem}.", id=setting.check_id))
    return errors


def _check_budgets() -> list[CheckMessage]:
    per_connection, per_worker = acp_settings.MAX_BUFFERED_BYTES, acp_settings.MAX_WORKER_BUFFERED_BYTES
    valid = all(
        isinstance(value, int) and not isinstance(value, bool) and value > 0 for value in (per_connection, per_worker)
    )
    if valid and per_connection > per_worker:
        return [
            Warning(
                f"MAX_BUFFERED_BYTES ({per_connection}) is larger than MAX_WORKER_BUFFERED_BYTES ({per_worker}).",
                hint="One connection could then hold the whole worker's budget; lower MAX_BUFFERED_BYTES.",
                id="acp_channels.W003",
            )
        ]
    window = acp_settings.REPLAY_WINDOW_BYTES
    if valid and isinstance(window, int) and not isinstance(window, bool) and window >= per_connection:
        return [
            Error(
                f"REPLAY_WINDOW_BYTES ({window}) must be less than MAX_BUFFERED_BYTES ({per_connection}).",
                hint="The replay window is kept within the connection's budget; a quarter of it is the default.",
                id="acp_channels.E031",
            )
        ]
    return []


def _check_cors() -> list[CheckMessage]:
    origins = acp_settings.CORS_ALLOWED_ORIGINS
    if not isinstance(origins, list | tuple) or not all(isinstance(origin, str) for origin in origins):
        return [Error("ACP_CHANNELS['CORS_ALLOWED_ORIGINS'] must be a list of origin strings.", id="acp_channels.E007")]
    errors: list[CheckMessage] = []
    for origin in origins:
        if not _is_origin(origin):
            errors.append(
                Error(f"{origin!r} is not an origin (scheme://host[:port], no path).", id="acp_channels.E007")
            )
    if not origins:
        return errors
    if "corsheaders" not in settings.INSTALLED_APPS or not any(
        entry.endswith("CorsMiddleware") for entry in getattr(settings, "MIDDLEWARE", [])
    ):
        errors.append(
            Error(
                "CORS_ALLOWED_ORIGINS needs django-cors-headers.",
                hint='Add "corsheaders" to INSTALLED_APPS and "corsheaders.middleware.CorsMiddleware" '
                "near the top of MIDDLEWARE.",
                id="acp_channels.E008",
            )
        )
    exposed = {name.lower() for name in getattr(settings, "CORS_EXPOSE_HEADERS", ())}
    if not set(ACP_EXPOSE_HEADERS) <= exposed:
        errors.append(
            Error(
                "CORS_EXPOSE_HEADERS must include the ACP response headers.",
                hint="CORS_EXPOSE_HEADERS = [*acp_channels._cors.ACP_EXPOSE_HEADERS]",
                id="acp_channels.E009",
            )
        )
    from corsheaders.defaults import default_headers

    allowed = {name.lower() for name in getattr(settings, "CORS_ALLOW_HEADERS", default_headers)}
    if not set(ACP_ALLOW_HEADERS) <= allowed:
        errors.append(
            Error(
                "CORS_ALLOW_HEADERS must include the ACP request headers.",
                hint="CORS_ALLOW_HEADERS = acp_channels._cors.cors_allow_headers(corsheaders.defaults.default_headers)",
                id="acp_channels.E010",
            )
        )
    return errors


def _is_origin(value: str) -> bool:
    """Exactly what a browser sends as Origin: lowercase scheme://host[:port], nothing else."""
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        return False
    default_port = {"http": 80, "https": 443}.get(parts.scheme)
    return (
        default_port is not None
        and bool(parts.hostname)
        and value == f"{parts.scheme}://{parts.netloc}"
        and value == value.lower()
        and "@" not in parts.netloc
        and port != default_port
        and not any(char.isspace() for char in value)
    )


DJANGO_USER_AUTHENTICATOR = "acp_channels.auth.django_user"
BEARER_TOKEN_AUTHENTICATOR = "acp_channels.auth.bearer_token"
SETTINGS_TOKENS_LOOKUP = "acp_channels.auth.settings_tokens"
AUTHENTICATION_MIDDLEWARE = "django.contrib.auth.middleware.AuthenticationMiddleware"
TOKENS_APP = "acp_channels.tokens"
TOKEN_LOOKUP_HINT = (
    f'Add "{TOKENS_APP}" to INSTALLED_APPS and leave TOKEN_LOOKUP unset (tokens issued with '
    "`manage.py acp_token create USER`), or name a callable token -> user | Principal | None, or "
    f'"{SETTINGS_TOKENS_LOOKUP}" with TOKENS (docs/authentication.md).'
)
AUTH_HINT = (
    'Set ACP_CHANNELS["AUTHENTICATE"] (e.g. "acp_channels.auth.django_user" or '
    '"acp_channels.auth.bearer_token"), or ACP_CHANNELS["ALLOW_ANONYMOUS"] = True to serve '
    "everyone on purpose (docs/authentication.md)."
)
AUTHENTICATE_HINT = (
    "Name a callable taking the request's RequestContext and returning a Principal (sync or async): "
    '"acp_channels.auth.django_user", "acp_channels.auth.bearer_token", "acp_channels.oauth.access_token", or your '
    "own (docs/authentication.md)."
)
REVALIDATE_HINT = (
    "Name a callable taking the live connections' principals and returning those no longer valid (sync or async), "
    "or leave REVALIDATE unset for the built-in check (docs/authentication.md, recipe 2)."
)


def _check_authentication(agent: Any) -> list[CheckMessage]:
    """E021-E028, E042, E047, E048, W004: the authentication settings, and serving without authentication."""
    errors: list[CheckMessage] = []
    authenticate = acp_settings.AUTHENTICATE
    token_lookup = acp_settings.TOKEN_LOOKUP
    errors += _check_dotted_callable("AUTHENTICATE", authenticate, "acp_channels.E021", AUTHENTICATE_HINT)
    errors += _check_dotted_callable("TOKEN_LOOKUP", token_lookup, "acp_channels.E022", TOKEN_LOOKUP_HINT)
    errors += _check_dotted_callable("REVALIDATE", acp_settings.REVALIDATE, "acp_channels.E061", REVALIDATE_HINT)
    for name, check_id in (
        ("REQUIRED_PERMISSION", "acp_channels.E023"),
        ("SESSIONS_VIEW_ALL_PERMISSION", "acp_channels.E042"),
        ("SESSIONS_OBSERVE_PERMISSION", "acp_channels.E047"),
        ("SESSIONS_CONTROL_PERMISSION", "acp_channels.E048"),
    ):
        permission = getattr(acp_settings, name)
        if permission is not None and not is_permission(permission):
            errors.append(
                Error(f"ACP_CHANNELS['{name}'] must be 'app_label.codename' or None, not {permission!r}.", id=check_id)
            )
    errors += _check_tokens(token_lookup)
    allow_anonymous = acp_settings.ALLOW_ANONYMOUS
    if authenticate is None and allow_anonymous is not True:
        if isinstance(agent, Mapping):
            errors.append(
                Error(
                    "A stdio agent is served without authentication: anyone who reaches /acp runs it.",
                    hint=AUTH_HINT,
                    id="acp_channels.E027",
                )
            )
        elif not settings.DEBUG:
            errors.append(
                Warning(
                    "/acp is served without authentication (DEBUG is False): anyone who reaches it gets an agent.",
                    hint=AUTH_HINT,
                    id="acp_channels.W004",
                )
            )
    if authenticate == DJANGO_USER_AUTHENTICATOR:
        errors += _check_session_auth()
    if authenticate == BEARER_TOKEN_AUTHENTICATOR and token_lookup is None and not builtin_tokens():
        errors.append(
            Error(
                "The bearer_token authenticator needs ACP_CHANNELS['TOKEN_LOOKUP'].",
                hint=TOKEN_LOOKUP_HINT,
                id="acp_channels.E022",
            )
        )
    return errors


def _check_dotted_callable(name: str, path: Any, check_id: str, hint: str) -> list[CheckMessage]:
    if path is None:
        return []
    if not isinstance(path, str) or not path:
        return [
            Error(f"ACP_CHANNELS['{name}'] must be a dotted path to a callable, not {path!r}.", hint=hint, id=check_id)
        ]
    try:
        found = import_string(path)
    except Exception as error:  # ImportError, or the module itself failing to import
        hint = "Check the module's name and that it imports on its own (python -c 'import …'). " + hint
        return [Error(f"ACP_CHANNELS['{name}'] = {path!r} cannot be imported: {error}", hint=hint, id=check_id)]
    if not callable(found):
        return [Error(f"ACP_CHANNELS['{name}'] = {path!r} is not callable.", hint=hint, id=check_id)]
    return []


def builtin_tokens() -> bool:
    """bearer_token looks tokens up in acp_channels.tokens (installed, no TOKEN_LOOKUP named)."""
    from django.apps import apps

    return acp_settings.TOKEN_LOOKUP is None and apps.is_installed(TOKENS_APP)


def is_permission(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    app_label, dot, codename = value.partition(".")
    return bool(dot and app_label and codename) and not any(char.isspace() for char in value)


def _check_tokens(token_lookup: Any) -> list[CheckMessage]:
    """E024: {token: principal id}, both non-empty strings (never shown: tokens are secrets)."""
    tokens = acp_settings.TOKENS
    if not isinstance(tokens, Mapping) or not all(
        isinstance(token, str) and token and isinstance(principal_id, str) and principal_id
        for token, principal_id in tokens.items()
    ):
        return [
            Error(
                "ACP_CHANNELS['TOKENS'] must be a dict of non-empty token strings to non-empty principal ids.",
                id="acp_channels.E024",
            )
        ]
    if token_lookup == SETTINGS_TOKENS_LOOKUP and not tokens:
        return [
            Error(
                "TOKEN_LOOKUP is the settings token lookup, but ACP_CHANNELS['TOKENS'] is empty: nobody can log in.",
                id="acp_channels.E024",
            )
        ]
    return []


def _check_session_auth() -> list[CheckMessage]:
    apps = set(settings.INSTALLED_APPS)
    middleware = list(getattr(settings, "MIDDLEWARE", None) or ())
    missing = [app for app in ("django.contrib.auth", "django.contrib.sessions") if app not in apps]
    if AUTHENTICATION_MIDDLEWARE not in middleware:
        missing.append(AUTHENTICATION_MIDDLEWARE)
    if not missing:
        return []
    return [
        Error(
            f"The django_user authenticator needs Django sessions and users: {', '.join(missing)} missing.",
            hint='Add "django.contrib.auth" and "django.contrib.sessions" to INSTALLED_APPS, and '
            "SessionMiddleware then AuthenticationMiddleware to MIDDLEWARE.",
            id="acp_channels.E028",
        )
    ]


def _check_middleware() -> list[CheckMessage]:
    if "django.middleware.gzip.GZipMiddleware" in getattr(settings, "MIDDLEWARE", []):
        return [
            Warning(
                "GZipMiddleware compresses the SSE stream of /acp, which delays events.",
                hint="Remove GZipMiddleware, or exclude the ACP endpoint from it.",
                id="acp_channels.W002",
            )
        ]
    return []


#: The stock channels-redis layers, whose Redis client settings cannot carry a burst (layers.py).
_STOCK_REDIS_LAYERS = frozenset(
    {"channels_redis.core.RedisChannelLayer", "channels_redis.pubsub.RedisPubSubChannelLayer"}
)
OUR_REDIS_LAYER = "acp_channels.layers.RedisChannelLayer"
#: Connections a worker's layer pool needs at least: group sends, the heartbeat's checks and
#: the layer's own receives run beside each other (the inboxes have connections of their own).
MIN_POOL_SIZE = 8


@register(Tags.compatibility)
def check_channel_layer(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """Every channel layer's backend imports (E036), and the default one (what several workers
    share) can carry a burst of clients."""
    layers = getattr(settings, "CHANNEL_LAYERS", None)
    if isinstance(layers, Mapping) and (unimportable := _check_layer_backends(layers)):
        return unimportable
    default = layers.get("default") if isinstance(layers, Mapping) else None
    if not isinstance(default, Mapping):
        return []
    backend = default.get("BACKEND")
    config = default.get("CONFIG") or {}
    if backend in _STOCK_REDIS_LAYERS:
        return [
            Warning(
                f"CHANNEL_LAYERS['default'] is {backend}: under a burst of clients its Redis connection pool "
                "fails calls between workers (MaxConnectionsError past 100 commands in flight: 503s), and with "
                "redis-py 8 a message Redis pops as its 5 s read timeout strikes is lost.",
                hint=f'Use "BACKEND": "{OUR_REDIS_LAYER}" (the same configuration; its pool waits for a free '
                "connection, sends take one round trip, and Redis replies may take 30 s). See "
                "docs/several-workers.md.",
                id="acp_channels.W005",
            )
        ]
    if backend != OUR_REDIS_LAYER or not isinstance(config, Mapping):
        return []
    errors: list[CheckMessage] = []
    size = config.get("pool_size", MIN_POOL_SIZE)
    if not isinstance(size, int) or isinstance(size, bool) or size < MIN_POOL_SIZE:
        errors.append(
            Error(
                f"CHANNEL_LAYERS['default']['CONFIG']['pool_size'] must be an integer of at least {MIN_POOL_SIZE}, "
                f"not {size!r}.",
                hint="A worker runs several layer commands at once; fewer connections make them queue.",
                id="acp_channels.E034",
            )
        )
    timeout = config.get("pool_timeout", 1.0)
    if timeout is not None and (not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0):
        errors.append(
            Error(
                "CHANNEL_LAYERS['default']['CONFIG']['pool_timeout'] must be a positive number of seconds or None, "
                f"not {timeout!r}.",
                id="acp_channels.E034",
            )
        )
    return errors


#: What a backend needs that the `redis` extra installs.
_REDIS_EXTRA_MODULES: Final = frozenset({"redis", "msgpack"})


def _check_layer_backends(layers: Mapping[str, Any]) -> list[CheckMessage]:
    """E036: a layer whose BACKEND does not import (channels would raise at the first request
    that needs the layer: every one, 500)."""
    errors: list[CheckMessage] = []
    for alias, layer in layers.items():
        backend = layer.get("BACKEND") if isinstance(layer, Mapping) else None
        if not isinstance(backend, str) or not backend:
            errors.append(
                Error(
                    f"CHANNEL_LAYERS[{alias!r}] has no BACKEND.",
                    hint='Name a channel layer class, e.g. "acp_channels.layers.RedisChannelLayer".',
                    id="acp_channels.E036",
                )
            )
            continue
        try:
            import_string(backend)
        except Exception as error:  # ImportError, or the module itself failing to import
            missing = (getattr(error, "name", None) or "") if isinstance(error, ImportError) else ""
            hint = (
                'Install the redis extra: pip install "acp-channels[redis]" (redis-py and msgpack).'
                if missing.partition(".")[0] in _REDIS_EXTRA_MODULES
                else "BACKEND must be the dotted path of a channel layer class that imports."
            )
            errors.append(
                Error(
                    f"CHANNEL_LAYERS[{alias!r}]['BACKEND'] = {backend!r} cannot be imported: {error}",
                    hint=hint,
                    id="acp_channels.E036",
                )
            )
    return errors
