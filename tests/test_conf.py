"""acp_channels._conf: defaults under ACP_CHANNELS, values kept until the setting changes."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from acp_channels._conf import DEFAULTS, AcpSettings, acp_settings


def test_a_key_not_set_reads_its_default(settings: Any) -> None:
    settings.ACP_CHANNELS = {"AGENT": "demo_project.agent.create_agent"}
    assert acp_settings.MAX_CONNECTIONS == DEFAULTS["MAX_CONNECTIONS"]


def test_a_value_is_read_from_django_settings_once(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.ACP_CHANNELS = {"MAX_CONNECTIONS": 7}
    reads = 0
    real = AcpSettings.user_settings

    def counted() -> dict[str, Any]:
        nonlocal reads
        reads += 1
        return real()

    monkeypatch.setattr(AcpSettings, "user_settings", staticmethod(counted))
    assert [acp_settings.MAX_CONNECTIONS for _ in range(100)] == [7] * 100
    assert reads == 1


def test_a_changed_setting_is_seen_at_once(settings: Any) -> None:
    settings.ACP_CHANNELS = {"MAX_CONNECTIONS": 7}
    assert acp_settings.MAX_CONNECTIONS == 7
    with override_settings(ACP_CHANNELS={"MAX_CONNECTIONS": 9}):
        assert acp_settings.MAX_CONNECTIONS == 9
    assert acp_settings.MAX_CONNECTIONS == 7
    settings.ACP_CHANNELS = {}
    assert acp_settings.MAX_CONNECTIONS == DEFAULTS["MAX_CONNECTIONS"]


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError):
        acp_settings.NOT_A_SETTING  # noqa: B018


def test_settings_from_environment_reads_each_key_as_its_kind() -> None:
    from acp_channels import settings_from_environment

    environ = {
        "ACP_KEEPALIVE_SECONDS": "2.5",  # float
        "ACP_REPLAY_WINDOW_BYTES": "4096",  # int
        "ACP_MAX_CONNECTIONS": "none",  # no limit
        "ACP_INITIALIZE_TIMEOUT": "30",  # a number whose default may be None still reads as one
        "ACP_ALLOW_ANONYMOUS": "yes",
        "ACP_AGENT_HOSTS": "runners",  # text
        "ACP_TOKENS": '{"secret": "team"}',  # a dict: JSON
        "ACP_NOT_A_SETTING": "1",
        "OTHER_MAX_CONNECTIONS": "7",
    }
    assert settings_from_environment(environ) == {
        "KEEPALIVE_SECONDS": 2.5,
        "REPLAY_WINDOW_BYTES": 4096,
        "MAX_CONNECTIONS": None,
        "INITIALIZE_TIMEOUT": 30.0,
        "ALLOW_ANONYMOUS": True,
        "AGENT_HOSTS": "runners",
        "TOKENS": {"secret": "team"},
    }
    assert settings_from_environment(environ, prefix="OTHER_") == {"MAX_CONNECTIONS": 7}
    assert "AGENT_HOSTS" not in settings_from_environment(environ, skip={"AGENT_HOSTS"})
    assert settings_from_environment({"ACP_ALLOW_ANONYMOUS": "0"}) == {"ALLOW_ANONYMOUS": False}


@pytest.mark.parametrize(
    ("variable", "value"),
    [("ACP_REPLAY_WINDOW_BYTES", "2MB"), ("ACP_KEEPALIVE_SECONDS", "soon"), ("ACP_TOKENS", "{not json")],
)
def test_settings_from_environment_names_a_variable_that_does_not_read(variable: str, value: str) -> None:
    from acp_channels import settings_from_environment

    with pytest.raises(ValueError, match=f"^{variable}="):
        settings_from_environment({variable: value})
