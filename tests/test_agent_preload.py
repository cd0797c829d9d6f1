"""At start-up (the app's ready()) the agent's code is imported before the first connection, and
the SDK adapter with it only when the agent uses the `acp` SDK: a frame-level or stdio agent's
server does without the SDK (0.7 s of CPU per process, and its memory)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.live import ROOT

SCRIPT = (
    "import sys, django\n"
    "django.setup()\n"
    "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in ('acp', 'acp_channels', 'tests'))))\n"
)


def modules_after_setup(agent: str) -> set[str]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "demo_project.settings", "ACP_AGENT": agent}
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return set(result.stdout.split())


def test_an_sdk_agent_is_imported_with_the_sdk_adapter() -> None:
    loaded = modules_after_setup("demo_project.agent.create_agent")
    assert {"acp", "acp_channels._agents.sdk"} <= loaded


@pytest.mark.parametrize("agent", ["tests.wire_agent.create", '{"command": ["cat"]}'])
def test_an_agent_without_the_sdk_loads_no_sdk(agent: str) -> None:
    loaded = modules_after_setup(agent)
    assert "acp" not in loaded and "acp_channels._agents.sdk" not in loaded
    if agent.startswith("tests."):
        assert "tests.wire_agent" in loaded  # imported at start, not at the first connection
