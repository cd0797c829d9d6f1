"""Serve an ASGI app under uvicorn (uvloop, httptools, websockets: uvicorn[standard]) on loopback.

    python -m bench.serve_uvicorn MODULE:APP [PORT]

Binds the socket itself (backlog 2048, as for daphne) and prints `LISTENING <port>` before
serving; connections made before the loop runs wait in the backlog.
"""

from __future__ import annotations

import socket
import sys

import uvicorn


def main() -> None:
    app = sys.argv[1]
    port = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(2048)
    print(f"LISTENING {sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="off", backlog=2048, ws_max_size=16 * 1024 * 1024 + 4096
    )
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
