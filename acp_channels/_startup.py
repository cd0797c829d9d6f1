"""What a server's start checks, beyond the settings (acp_channels._checks): the channel layer
answers, the permission REQUIRED_PERMISSION names exists, the packages acp_channels patches are
at versions it was tested with; and `run_startup_checks`, which runs every system check there.

Servers do not run system checks (daphne, uvicorn; `runserver` does): `run_startup_checks`,
called by `routing.build_asgi_application`, runs them as the application is built, with those
that reach the channel layer and the database (deployment checks tagged STARTUP_TAG, so
`manage.py check --deploy --database default` runs them too, and `migrate`, which may have to
create the permission first, does not), and refuses to start on an error: a configuration that
cannot serve fails the start with the checks' text, not every request after it with a 500.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TypeVar

from django.apps import AppConfig, apps
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from acp_channels._checks import BEARER_TOKEN_AUTHENTICATOR, DJANGO_USER_AUTHENTICATOR, builtin_tokens, is_permission
from acp_channels._conf import acp_settings
from acp_channels._patches import untested_versions

logger = logging.getLogger("acp_channels.startup")

T = TypeVar("T")

#: The checks only a server's start runs (with `run_startup_checks`), and `check --deploy`: they
#: reach the channel layer or the database.
STARTUP_TAG: Final = "acp_channels_startup"


def run_startup_checks() -> None:
    """The system checks, as `runserver` runs them and daphne and uvicorn do not: every
    registered check, then the STARTUP_TAG ones (the channel layer carries a message, the
    permission is in the database) in a thread of their own. Silenced checks are skipped
    (SILENCED_SYSTEM_CHECKS); warnings are logged; errors raise ImproperlyConfigured with their
    text, so the server exits at once with them instead of answering every request 500."""
    from django.core import checks as django_checks

    databases = [
        alias for alias, database in settings.DATABASES.items() if database.get("ENGINE") != "django.db.backends.dummy"
    ]

    def run() -> list[CheckMessage]:
        # deployment checks for STARTUP_TAG: `check` and `migrate` do not run them
        return [
            *django_checks.run_checks(),
            *django_checks.run_checks(tags=[STARTUP_TAG], include_deployment_checks=True, databases=databases),
        ]

    # In a thread of its own, all of them: what the checks open (Django's cache checks open the
    # caches, context-local) must not be in the context every request inherits, or each request
    # would close those caches at its end in a thread of its own (acp_channels._handler).
    messages = _in_a_thread(run)
    messages = [message for message in messages if not message.is_silenced()]
    errors = [message for message in messages if message.is_serious()]
    for message in messages:
        if not message.is_serious() and message.level >= django_checks.WARNING:
            logger.warning("system check: %s", message)
    if errors:
        raise ImproperlyConfigured(
            "acp_channels: the system checks found errors; fix them before serving:\n"
            + "\n".join(str(error) for error in errors)
        )


# -- the channel layer answers ------------------------------------------------------------------

#: How long the start waits for the channel layer to carry one message to itself.
LAYER_PROBE_SECONDS: Final = 10.0


@register(STARTUP_TAG, deploy=True)
def check_channel_layer_reachable(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """E037: the default channel layer carries a message (a new channel, a send to it, the
    receive): a Redis that cannot be reached fails the start, not every request after it."""
    layers = getattr(settings, "CHANNEL_LAYERS", None)
    default = layers.get("default") if isinstance(layers, Mapping) else None
    backend = default.get("BACKEND") if isinstance(default, Mapping) else None
    if not isinstance(backend, str):
        return []
    try:
        layer_class = import_string(backend)
    except Exception:
        return []  # E036
    from channels.layers import DEFAULT_CHANNEL_LAYER, InMemoryChannelLayer, channel_layers

    if isinstance(layer_class, type) and issubclass(layer_class, InMemoryChannelLayer):
        return []  # in this process: nothing to reach
    try:
        problem = _in_a_thread(lambda: _probe(channel_layers.make_backend(DEFAULT_CHANNEL_LAYER)))
    except Exception as error:  # the layer's own settings refused (bad hosts, ...)
        problem = f"{type(error).__name__}: {error}"
    if problem is None:
        return []
    return [
        Error(
            f"The channel layer CHANNEL_LAYERS['default'] ({backend}) cannot be reached: {problem}",
            hint="Check its CONFIG (hosts: the Redis URL, its credentials and TLS) and that the server is up and "
            "reachable from here: serving without it, every request that uses the layer would fail.",
            id="acp_channels.E037",
        )
    ]


def _in_a_thread(call: Callable[[], T]) -> T:
    """`call()` in a thread of its own: no event loop there (asyncio.run works, and Django lets
    it query the database, even when the application is built inside a running loop), and the
    database connections it opens are closed with it."""

    def run() -> T:
        from django.db import connections

        try:
            return call()
        finally:
            connections.close_all()

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="acp-startup-checks") as pool:
        return pool.submit(run).result()


def _probe(layer: Any) -> str | None:
    """Why `layer` cannot carry a message to itself, or None. Runs in a thread without a loop."""

    async def round_trip() -> None:
        channel = await layer.new_channel()
        await layer.send(channel, {"type": "acp_channels.startup_probe"})
        await layer.receive(channel)

    async def probe() -> None:
        try:
            await asyncio.wait_for(round_trip(), LAYER_PROBE_SECONDS)
        finally:
            # channels-redis: close the pools (never `flush`, which deletes the layer's keys);
            # its pub/sub layer's flush only closes its connections.
            close = getattr(layer, "close_pools", None)
            if close is None and type(layer).__module__ == "channels_redis.pubsub":
                close = layer.flush
            if close is not None:
                try:
                    await asyncio.wait_for(close(), 5.0)
                except Exception:
                    logger.debug("closing the probed channel layer failed", exc_info=True)

    try:
        asyncio.run(probe())
    except TimeoutError:
        return f"a message to itself did not arrive within {LAYER_PROBE_SECONDS:g} s"
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return None


@register(Tags.compatibility)
def check_versions(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """W006: a package whose internals acp_channels patches or reaches into, at a version it was
    not tested with (acp_channels._patches lists the patches and TESTED_VERSIONS)."""
    return [
        Warning(
            f"{name} {installed} is not a version acp-channels was tested with ({tested}).",
            hint=f"acp_channels patches or reaches into {name}'s internals (acp_channels/_patches.py lists where), "
            f"which another version may have changed: install a tested one (pip install '{name}{tested}'), or run "
            "acp-channels' test suite against this one.",
            id="acp_channels.W006",
        )
        for name, installed, tested in untested_versions()
    ]


# -- REQUIRED_PERMISSION exists ----------------------------------------------------------------

PERMISSION_HINT = (
    "Name a permission as 'app_label.codename': one of a model's default permissions (add_, change_, delete_, "
    "view_ + the model's name), one of its Meta.permissions, or one created in the database; e.g. "
    "'auth.view_user'."
)
MODEL_BACKEND = "django.contrib.auth.backends.ModelBackend"


#: The settings that name a Django permission, and what it means when nobody can have it.
PERMISSION_SETTINGS: Final = {
    "REQUIRED_PERMISSION": "only superusers are let in",
    "SESSIONS_VIEW_ALL_PERMISSION": "only superusers see every principal's sessions",
    "SESSIONS_OBSERVE_PERMISSION": "only superusers may observe others' sessions",
    "SESSIONS_CONTROL_PERMISSION": "only superusers may control others' sessions",
}


@register(Tags.compatibility)
def check_required_permission(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """E035 (W007 where the users may not be Django's): REQUIRED_PERMISSION, or a
    SESSIONS_*_PERMISSION, names a permission nobody can have, as far as the code tells (no app,
    no model declaring it, no database to hold another). A database is never queried here:
    `migrate` runs this before it creates the permissions; `check_required_permission_in_database`
    looks there at the start."""
    if not apps.is_installed("django.contrib.auth"):
        return []  # no Django permissions at all (E028 when django_user needs them)
    found: list[CheckMessage] = []
    for name, permission in _named_permissions():
        problem = _declared_permission_problem(permission)
        if problem is None:
            continue
        text, maybe_in_database = problem
        if maybe_in_database and _has_a_database():
            continue  # it may be a row of the database: looked up at the start
        if maybe_in_database:
            text += " (and without a database no other permission exists)"
        found.append(_permission_message(name, permission, text))
    return found


@register(Tags.database, STARTUP_TAG, deploy=True)
def check_required_permission_in_database(
    app_configs: Sequence[AppConfig] | None = None, databases: Sequence[str] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """E035/W007 for a permission setting no model declares: the database that holds
    permissions has no such row either. Silent when it cannot be read (not migrated yet)."""
    if not databases or not apps.is_installed("django.contrib.auth") or not _has_a_database():
        return []
    from django.contrib.auth.models import Permission
    from django.db import DatabaseError, router

    alias = router.db_for_read(Permission)
    if alias not in databases:
        return []
    found: list[CheckMessage] = []
    for name, permission in _named_permissions():
        problem = _declared_permission_problem(permission)
        if problem is None or not problem[1]:
            continue  # declared; or check_required_permission's to report
        app_label, _, codename = permission.partition(".")
        try:
            rows = Permission.objects.using(alias).filter(content_type__app_label=app_label, codename=codename)
            exists = rows.exists()
        except DatabaseError:
            return []
        if not exists:
            found.append(
                _permission_message(
                    name, permission, f"{problem[0]}, and the database {alias!r} has no such permission"
                )
            )
    return found


def _named_permissions() -> list[tuple[str, str]]:
    """(setting, permission) for each permission setting of the form 'app_label.codename' (E023,
    E042, E047, E048 report the others)."""
    named = [(name, getattr(acp_settings, name)) for name in PERMISSION_SETTINGS]
    return [(name, value) for name, value in named if isinstance(value, str) and is_permission(value)]


def _declared_permission_problem(permission: str) -> tuple[str, bool] | None:
    """Why no model declares `permission`, and whether it may still be a row of the database
    (its app is installed), or None when a model declares it."""
    app_label, _, codename = permission.partition(".")
    try:
        app_config = apps.get_app_config(app_label)
    except LookupError:
        return f"no installed app has the label {app_label!r}", False
    for model in app_config.get_models():
        options = model._meta
        declared = {f"{action}_{options.model_name}" for action in options.default_permissions}
        declared.update(name for name, _ in options.permissions)
        if codename in declared:
            return None
    return f"no model of the app {app_label!r} declares {codename!r}", True


def _has_a_database() -> bool:
    return any(database.get("ENGINE") != "django.db.backends.dummy" for database in settings.DATABASES.values())


def _permission_message(name: str, permission: str, problem: str) -> CheckMessage:
    text = f"ACP_CHANNELS['{name}'] = {permission!r} is not a permission: {problem}."
    if _users_are_djangos():
        return Error(text, hint=f"{PERMISSION_HINT} As it is, {PERMISSION_SETTINGS[name]}.", id="acp_channels.E035")
    return Warning(
        text,
        hint=PERMISSION_HINT + " Only users who decide permissions themselves (a TOKEN_LOOKUP's own user objects, "
        "a custom authentication backend) can have it.",
        id="acp_channels.W007",
    )


def _users_are_djangos() -> bool:
    """The users REQUIRED_PERMISSION applies to are Django's (session users, or the users of
    acp_channels.tokens' tokens), whose permissions Django's ModelBackend decides
    (AUTHENTICATION_BACKENDS has no other)."""
    builtin = acp_settings.AUTHENTICATE == BEARER_TOKEN_AUTHENTICATOR and builtin_tokens()
    if acp_settings.AUTHENTICATE != DJANGO_USER_AUTHENTICATOR and not builtin:
        return False
    from django.contrib.auth.backends import ModelBackend

    for path in getattr(settings, "AUTHENTICATION_BACKENDS", [MODEL_BACKEND]):
        try:
            backend = import_string(path)
        except Exception:
            return False
        if not (isinstance(backend, type) and issubclass(backend, ModelBackend)):
            return False
    return True
