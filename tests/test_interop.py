"""The official SDK clients (TypeScript and Python) run a whole scenario against our daphne:
initialize, session/new, a streamed prompt, a permission round trip, a cancelled prompt, close."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from tests import forked
from tests.live import ROOT, DaphneServer

JS = ROOT / "tests" / "interop" / "js"
PY_DRIVER = ROOT / "tests" / "interop" / "py_client.py"


def driver_command(client: str, url: str, transport: str) -> list[str]:
    if client == "typescript":
        if shutil.which("node") is None or not (JS / "node_modules").exists():
            pytest.fail("the TS SDK client needs node and `npm ci` in tests/interop/js (./dev.sh test does it)")
        return ["node", str(JS / "ts_client.mjs"), url, transport]
    return [sys.executable, str(PY_DRIVER), url]


def run_driver(client: str, server: DaphneServer, transport: str) -> dict[str, object]:
    url = server.url if transport == "http" else server.ws_url
    result = forked.run(driver_command(client, url, transport), capture_output=True, text=True, timeout=120, cwd=ROOT)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert result.returncode == 0 and lines, f"{client}/{transport} failed:\n{result.stdout}\n{result.stderr}"
    summary: dict[str, object] = json.loads(lines[-1])
    return summary


@pytest.mark.parametrize("transport", ["http", "ws"])
@pytest.mark.parametrize("client", ["typescript", "python"])
def test_official_client_scenario(client: str, transport: str, demo_server: DaphneServer) -> None:
    summary = run_driver(client, demo_server, transport)
    assert summary["ok"] is True
    assert summary["chunks"] == 50
    assert summary["order"] == "indexed"
    assert summary["streamStopReason"] == "end_turn"
    assert summary["permission"] == "permission: allow"
    assert summary["cancel"] == "cancelled"
    assert summary["closed"] is True
    if transport == "http":
        http = summary["http"]
        assert isinstance(http, dict) and http["delete"] == 202 and not http.get("errors")
    assert not demo_server.errors()
