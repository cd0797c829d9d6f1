"""Serve an ASGI app under uvicorn (uvloop, httptools, websockets: uvicorn[standard]) on loopback.

    python -m bench.serve_uvicorn MODULE:APP [PORT]

Binds the socket itself (backlog 2048, as for daphne) and prints `LISTENING <port>` before
serving; connections made before the loop runs wait in the backlog.
"""

from __future__ import annotations

import sys

from tests.peers.py_sdk_server import serve_uvicorn


def main() -> None:
    port = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    serve_uvicorn(sys.argv[1], port, access_log=False, backlog=2048, ws_max_size=16 * 1024 * 1024 + 4096)


if __name__ == "__main__":
    main()
