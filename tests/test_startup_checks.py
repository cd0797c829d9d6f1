"""acp_channels._startup in-process: `run_startup_checks` (what `build_asgi_application` runs),
and the checks of REQUIRED_PERMISSION (E035, W007) that need no database. The database's part,
and each failure as daphne meets it, are in tests/test_startup_live.py; the channel layer's
(E036, E037) in tests/test_checks_layer.py; the versions' (W006) in tests/test_patches.py."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from acp_channels import _startup as startup
from acp_channels._routing import build_asgi_application
from acp_channels._startup import (
    check_required_permission,
    check_required_permission_in_database,
    run_startup_checks,
)

DJANGO_USER = "acp_channels.auth.django_user"
BEARER = "acp_channels.auth.bearer_token"


def acp(settings: Any, **values: Any) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, **values}


# -- run_startup_checks -------------------------------------------------------------------------


def test_the_demo_starts_clean(caplog: pytest.LogCaptureFixture) -> None:
    run_startup_checks()
    assert [record for record in caplog.records if record.name == "acp_channels.startup"] == []


def test_an_error_refuses_the_start_with_the_checks_text(settings: Any) -> None:
    acp(settings, AUTHENTICATE="tests.nowhere.authenticate")
    with pytest.raises(ImproperlyConfigured) as refused:
        run_startup_checks()
    text = str(refused.value)
    assert text.startswith("acp_channels: the system checks found errors; fix them before serving:\n")
    assert "(acp_channels.E021) ACP_CHANNELS['AUTHENTICATE'] = 'tests.nowhere.authenticate' cannot be imported" in text


def test_the_application_is_not_built_past_an_error(settings: Any) -> None:
    acp(settings, TOKEN_LOOKUP="tests.nowhere.lookup")
    with pytest.raises(ImproperlyConfigured, match=r"acp_channels\.E022"):
        build_asgi_application()
    assert build_asgi_application(checks=False) is not None  # asked not to check


def test_a_silenced_error_does_not_refuse_the_start(settings: Any) -> None:
    acp(settings, AUTHENTICATE="tests.nowhere.authenticate")
    settings.SILENCED_SYSTEM_CHECKS = ["acp_channels.E021"]
    run_startup_checks()


def test_a_warning_is_logged_and_the_start_goes_on(settings: Any, caplog: pytest.LogCaptureFixture) -> None:
    acp(settings, REQUIRED_PERMISSION="nosuchapp.use_agent")  # W007: the demo's users are not Django's
    with caplog.at_level(logging.WARNING, logger="acp_channels.startup"):
        run_startup_checks()
    lines = [record.getMessage() for record in caplog.records if record.name == "acp_channels.startup"]
    assert len(lines) == 1 and "(acp_channels.W007)" in lines[0], lines


def test_a_start_inside_an_event_loop_checks_too(settings: Any) -> None:
    """An application built inside a running loop (a test, an ASGI server's factory): the
    checks that reach the layer or the database run in a thread of their own."""
    import asyncio

    acp(settings, AUTHENTICATE="tests.nowhere.authenticate")

    async def build() -> None:
        run_startup_checks()

    with pytest.raises(ImproperlyConfigured, match=r"acp_channels\.E021"):
        asyncio.run(build())


# -- REQUIRED_PERMISSION names a permission -----------------------------------------------------


def messages(settings: Any, permission: str, authenticate: str | None = DJANGO_USER) -> list[tuple[str, str]]:
    acp(settings, AUTHENTICATE=authenticate, REQUIRED_PERMISSION=permission)
    return [(message.id or "", message.msg) for message in check_required_permission()]


@pytest.mark.parametrize("permission", ["auth.view_user", "auth.add_group", "contenttypes.change_contenttype"])
def test_a_permission_a_model_declares_is_clean(settings: Any, permission: str) -> None:
    assert messages(settings, permission) == []


def test_a_permission_of_no_installed_app_is_an_error(settings: Any) -> None:
    found = messages(settings, "nosuchapp.use_agent")
    assert found == [
        (
            "acp_channels.E035",
            "ACP_CHANNELS['REQUIRED_PERMISSION'] = 'nosuchapp.use_agent' is not a permission: no installed app has "
            "the label 'nosuchapp'.",
        )
    ]


def test_without_a_database_only_declared_permissions_exist(settings: Any) -> None:
    assert settings.DATABASES["default"]["ENGINE"] == "django.db.backends.dummy"  # the demo's
    found = messages(settings, "auth.use_agent")
    assert [check_id for check_id, _ in found] == ["acp_channels.E035"]
    assert "no model of the app 'auth' declares 'use_agent' (and without a database" in found[0][1]


def test_with_a_database_an_undeclared_permission_is_looked_up_at_the_start(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It may be a row of the database (a data migration's): not an error before the start
    looks (`migrate`, which creates it, runs this check)."""
    monkeypatch.setattr(startup, "_has_a_database", lambda: True)
    assert messages(settings, "auth.use_agent") == []
    assert [check_id for check_id, _ in messages(settings, "nosuchapp.use_agent")] == ["acp_channels.E035"]


class OwnBackend:
    """An authentication backend that decides permissions its own way."""

    def has_perm(self, user: Any, permission: str, obj: Any = None) -> bool:
        return True


@pytest.mark.parametrize(
    ("authenticate", "backends"),
    [
        (BEARER, ["django.contrib.auth.backends.ModelBackend"]),  # a TOKEN_LOOKUP's users
        (None, ["django.contrib.auth.backends.ModelBackend"]),
        (DJANGO_USER, ["django.contrib.auth.backends.ModelBackend", "tests.test_startup_checks.OwnBackend"]),
        (DJANGO_USER, ["tests.nowhere.Backend"]),
    ],
)
def test_where_users_may_not_be_djangos_it_is_a_warning(
    settings: Any, authenticate: str | None, backends: list[str]
) -> None:
    settings.AUTHENTICATION_BACKENDS = backends
    assert [check_id for check_id, _ in messages(settings, "nosuchapp.use_agent", authenticate)] == [
        "acp_channels.W007"
    ]


@pytest.mark.parametrize(
    ("name", "who"),
    [
        ("SESSIONS_VIEW_ALL_PERMISSION", "see every principal's sessions"),
        ("SESSIONS_OBSERVE_PERMISSION", "observe others' sessions"),
        ("SESSIONS_CONTROL_PERMISSION", "control others' sessions"),
    ],
)
def test_the_session_permissions_must_exist_too(settings: Any, name: str, who: str) -> None:
    """A typo there lets nobody but superusers have the privilege: the same error as for
    REQUIRED_PERMISSION, naming the setting and what it costs."""
    acp(settings, AUTHENTICATE=DJANGO_USER, **{name: "auth.observe_sesions"})
    [message] = check_required_permission()
    assert message.id == "acp_channels.E035" and message.msg.startswith(f"ACP_CHANNELS['{name}'] = ")
    assert message.hint is not None and f"only superusers {'may ' if 'see' not in who else ''}{who}" in message.hint
    acp(settings, **{name: "auth.view_user"})
    assert check_required_permission() == []


def test_the_form_is_e023s_to_report(settings: Any) -> None:
    assert messages(settings, "use_agent") == []


def test_the_database_is_looked_up_only_when_asked_for() -> None:
    """`check` and `migrate` run it without --deploy (not at all) or without databases."""
    assert check_required_permission_in_database(databases=None) == []
