"""The built-in tokens (acp_channels.tokens): the tests that need a database run in a pytest of
their own under tests.tokens_site (tests/tokens_units.py: the model, `manage.py acp_token`, the
admin, bearer_token's lookup, the credential check and sweep); here, what needs none: a
principal carries its credential between workers, and the system checks about tokens."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from acp_channels._checks import check_settings
from acp_channels._identity import Principal
from acp_channels._startup import check_required_permission
from tests.live import ROOT

BEARER = "acp_channels.auth.bearer_token"
TOKENS_APP = "acp_channels.tokens"


@pytest.mark.timeout(300)
def test_units_under_a_site_with_tokens(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-q",
            "--ds", "tests.tokens_site", "tests/tokens_units.py",
        ],
        cwd=ROOT,
        env={**os.environ, "ACP_TEST_DATABASE": str(tmp_path / "db.sqlite3")},
        capture_output=True,
        text=True,
        timeout=280,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert " passed" in result.stdout and "skipped" not in result.stdout, result.stdout


def test_a_principal_carries_its_credential_on_the_wire() -> None:
    principal = Principal("user", "7", "alice", "acp_tokens:42")
    assert principal.to_wire() == ["user", "7", "alice", "acp_tokens:42"]
    assert Principal.from_wire(principal.to_wire()).credential == "acp_tokens:42"
    assert Principal("token", "team", "team").to_wire() == ["token", "team", "team"]  # as before
    assert Principal.from_wire(["token", "team", "team"]).credential == ""
    # Compared without it: another token of the same user may use the connection.
    assert principal == Principal("user", "7", "", "acp_tokens:43")
    with pytest.raises(ValueError):
        Principal.from_wire(["user", "7", "alice", "acp_tokens:42", "more"])


def acp(settings: Any, **values: Any) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, **values}


def messages(**values: Any) -> list[tuple[str, str, str]]:
    return [(m.id or "", m.msg, m.hint or "") for m in check_settings() if m.id != "acp_channels.W001"]


def test_bearer_token_needs_a_lookup_or_the_tokens_app(settings: Any) -> None:
    acp(settings, AUTHENTICATE=BEARER)
    (found,) = messages()
    assert found[0] == "acp_channels.E022" and TOKENS_APP in found[2]
    settings.INSTALLED_APPS = [*settings.INSTALLED_APPS, TOKENS_APP]
    assert messages() == []


def test_a_token_lookup_that_cannot_be_imported_has_a_hint(settings: Any) -> None:
    acp(settings, AUTHENTICATE=BEARER, TOKEN_LOOKUP="agents.auth.lookup")
    (found,) = messages()
    assert found[0] == "acp_channels.E022" and "cannot be imported" in found[1]
    assert "imports on its own" in found[2] and TOKENS_APP in found[2]


def test_revalidate_settings_are_checked(settings: Any) -> None:
    acp(settings, REVALIDATE="no.such.check", REVALIDATE_SECONDS=0)
    assert sorted(found[0] for found in messages()) == ["acp_channels.E060", "acp_channels.E061"]
    acp(settings, REVALIDATE="tests.tokens_units.everyone_invalid", REVALIDATE_SECONDS=None)
    assert messages() == []


def test_a_permission_nobody_has_is_an_error_for_the_tokens_users(settings: Any) -> None:
    """The tokens' users are Django's: a REQUIRED_PERMISSION that does not exist lets only
    superusers in, so the start stops (E035, not the warning W007 of a custom lookup)."""
    settings.INSTALLED_APPS = [*settings.INSTALLED_APPS, TOKENS_APP]
    acp(settings, AUTHENTICATE=BEARER, REQUIRED_PERMISSION="agents.use_agent")
    (found,) = check_required_permission()
    assert found.id == "acp_channels.E035" and found.hint and "only superusers" in found.hint
    acp(settings, REQUIRED_PERMISSION="acp_tokens.use_agent")  # the app declares it
    assert check_required_permission() == []
    acp(settings, TOKEN_LOOKUP="tests.auth_fixtures.lookup", REQUIRED_PERMISSION="agents.use_agent")
    assert [found.id for found in check_required_permission()] == ["acp_channels.W007"]


def test_the_builtin_check_works_where_the_tokens_app_is_not_installed() -> None:
    """The demo's Django (no acp_channels.tokens), in a process of its own so that no other test
    imported the app's models first: the check never imports them there (they would register
    under the app `acp_channels`, whose module name contains theirs)."""
    script = (
        "import asyncio, sys, django; django.setup()\n"
        "from acp_channels._identity import Principal\n"
        "from acp_channels._revalidate import builtin_check\n"
        "principals = [Principal('token', 'team', 'team'), Principal('user', '1', 'a', 'acp_tokens:1')]\n"
        "print(asyncio.run(builtin_check(principals)), 'acp_channels.tokens.models' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "demo_project.settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (0, "[] False\n"), done.stderr
