"""pytest fixtures for the peer servers (import them into a test module).

* `ts_server`: the official TypeScript SDK server (tests/peers/ts_server/server.mjs) under Node;
  skipped when Node or its node_modules are missing (`./dev.sh test` runs `npm ci` there).
* `py_sdk_server`: the official Python SDK server (`acp.http.asgi.create_asgi_app`) under
  uvicorn, hosting the demo agent (tests/peers/py_sdk_server.py).
* `gated_py_sdk_server`: the same behind `BearerGate` (tests/peers/auth_gate.py): every request
  must carry the bearer token `GATE_TOKEN`.

Each starts once per test session, whichever modules import it.
"""

from __future__ import annotations

import os
import shutil
import sys

import pytest

from tests.live import ROOT
from tests.peers.process import PeerServer

TS_DIR = ROOT / "tests" / "peers" / "ts_server"
#: The token `gated_py_sdk_server` requires (base64url, so it also fits a WebSocket subprotocol).
GATE_TOKEN = "gate-Zm9vYmFyYmF6_0123"
_started: dict[str, PeerServer] = {}


def _peer(name: str, request: pytest.FixtureRequest) -> PeerServer:
    if name not in _started:
        if name == "ts":
            if shutil.which("node") is None:
                pytest.skip("node is not installed")
            if not (TS_DIR / "node_modules" / "@agentclientprotocol" / "sdk").is_dir():
                pytest.skip("run `npm ci` in tests/peers/ts_server (./dev.sh test does)")
            server = PeerServer(argv=["node", "server.mjs"], cwd=TS_DIR)
        else:
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            argv = [sys.executable, "-m", "tests.peers.py_sdk_server"]
            if name == "py-gated":
                argv += ["--token", GATE_TOKEN]
            server = PeerServer(argv=argv, cwd=ROOT, env=env)
        _started[name] = server.start()
        request.config.add_cleanup(server.stop)
    return _started[name]


@pytest.fixture(scope="session")
def ts_server(request: pytest.FixtureRequest) -> PeerServer:
    return _peer("ts", request)


@pytest.fixture(scope="session")
def py_sdk_server(request: pytest.FixtureRequest) -> PeerServer:
    return _peer("py", request)


@pytest.fixture(scope="session")
def gated_py_sdk_server(request: pytest.FixtureRequest) -> PeerServer:
    return _peer("py-gated", request)
