"""Peer server for the client tests: the official Python SDK server (`acp.http.asgi.create_asgi_app`,
agent-client-protocol 0.12.1) under uvicorn, hosting the demo agent, on 127.0.0.1.

    python -m tests.peers.py_sdk_server [PORT] [--token TOKEN]    # PORT 0 (default) picks a free port

With --token, every request must carry that bearer token (tests/peers/auth_gate.py).

Binds the socket itself and prints `LISTENING <port>` before serving: connections made before
uvicorn's loop runs wait in the listen backlog, so the line is a readiness signal.
The app ignores the path, so `/acp` works like any other.
"""

from __future__ import annotations

import argparse
import socket
from typing import Any

import uvicorn
from acp.http.asgi import create_asgi_app

from demo_project.agent import create_agent
from tests.peers.auth_gate import BearerGate


def serve_uvicorn(app: Any, port: int = 0, **config: Any) -> None:
    """Bind 127.0.0.1:`port` (backlog 2048), print `LISTENING <port>`, then serve `app`."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(2048)
    print(f"LISTENING {sock.getsockname()[1]}", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", **config)).run(sockets=[sock])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int, nargs="?", default=0)
    parser.add_argument("--token", help="require this bearer token on every request")
    args = parser.parse_args()
    app: Any = create_asgi_app(lambda connection: create_agent())
    if args.token:
        app = BearerGate(app, args.token)
    serve_uvicorn(app, args.port, ws_max_size=64 * 1024 * 1024)


if __name__ == "__main__":
    main()
