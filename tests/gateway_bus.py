"""Swap the worker bus the gateway's modules use (each imported `worker.bus` by name)."""

from __future__ import annotations

from typing import Any

import pytest

from acp_channels._gateway import local, remote, serve


def patch_bus(monkeypatch: pytest.MonkeyPatch, bus: Any) -> None:
    for module in (local, remote, serve):
        monkeypatch.setattr(module, "bus", bus)
