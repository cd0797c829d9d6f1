"""The package stays ruff clean and type checked (mypy strict, configured in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.live import ROOT


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_clean() -> None:
    result = run("ruff", "check", "acp_channels", "demo_project", "tests", "examples")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow  # about 50 s on two cores without its cache (.mypy_cache), as on a fresh clone
def test_mypy_clean() -> None:
    result = run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr
