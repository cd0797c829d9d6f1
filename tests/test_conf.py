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
