"""The nginx front of docs/http2.md, as written there: nginx terminates TLS and HTTP/2 and
proxies HTTP/1.1 to a daphne worker. A whole session over HTTP/2 through it on one TCP
connection (nginx's port), and a WebSocket through it (HTTP/1.1 upgrade). Skipped when nginx is
not installed (CI does not install it: `apt-get install nginx` to run it)."""

from __future__ import annotations

import asyncio
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from acp_channels.client import HttpClient
from tests.live import ROOT, DaphneServer, tls_certificate
from tests.test_http2_live import established_connections, whole_session

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(shutil.which("nginx") is None, reason="nginx is not installed"),
]


def documented_server_block(worker_port: int, port: int) -> str:
    """The ```nginx block of docs/http2.md, pointed at this worker, port and certificate."""
    text = (ROOT / "docs" / "http2.md").read_text()
    block = re.search(r"```nginx\n(.*?)```", text, re.S)
    assert block is not None
    config = block.group(1)
    certificate = tls_certificate()
    replacements = {
        "server 127.0.0.1:8001;": f"server 127.0.0.1:{worker_port};",
        "server 127.0.0.1:8002;": f"server 127.0.0.1:{worker_port};",
        "listen 443 ssl http2;": f"listen 127.0.0.1:{port} ssl http2;",
        "/etc/ssl/acp.example.com.pem": str(certificate.cert),
        "/etc/ssl/acp.example.com.key": str(certificate.key),
        "server_name acp.example.com;": "server_name 127.0.0.1;",
    }
    for documented, local in replacements.items():
        assert documented in config, f"docs/http2.md's nginx block no longer has {documented!r}"
        config = config.replace(documented, local)
    return config


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def nginx_front() -> Iterator[tuple[int, DaphneServer]]:
    worker = DaphneServer().start()
    directory = Path(tempfile.mkdtemp(prefix="acp-nginx-"))
    port = free_port()
    (directory / "nginx.conf").write_text(
        f"pid {directory}/nginx.pid;\nerror_log {directory}/error.log;\nevents {{}}\nhttp {{\n"
        f"access_log off;\nclient_body_temp_path {directory}/body;\nproxy_temp_path {directory}/proxy;\n"
        f"fastcgi_temp_path {directory}/fastcgi;\nuwsgi_temp_path {directory}/uwsgi;\n"
        f"scgi_temp_path {directory}/scgi;\n"
        f"{documented_server_block(worker.port, port)}\n}}\n"
    )
    nginx = subprocess.Popen(
        ["nginx", "-p", str(directory), "-c", str(directory / "nginx.conf"), "-g", "daemon off;"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while True:  # nginx announces nothing: its port accepting is the event
            if nginx.poll() is not None:
                raise RuntimeError(f"nginx exited: {nginx.stdout.read() if nginx.stdout else ''}")
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "nginx did not listen"
            time.sleep(0.05)
        yield port, worker
    finally:
        nginx.terminate()
        nginx.wait(10)
        worker.stop()


async def test_a_session_over_h2_through_nginx_on_one_connection(
    nginx_front: tuple[int, DaphneServer], tmp_path: Path
) -> None:
    port, worker = nginx_front
    versions: list[str | None] = []

    class Watched(HttpClient):
        async def send(self, message: object, *, raw: str | None = None) -> None:
            await super().send(message, raw=raw)  # type: ignore[arg-type]
            versions.append(self.http_version)
            assert established_connections(port) == 1  # the client's one connection to nginx

    client = Watched(f"https://127.0.0.1:{port}/acp", verify=str(tls_certificate().cert), timeout=10)
    await whole_session(client, tmp_path)
    assert versions and set(versions) == {"HTTP/2"}, versions
    assert worker.errors() == []


async def test_websocket_through_nginx(nginx_front: tuple[int, DaphneServer], tmp_path: Path) -> None:
    port, worker = nginx_front
    client = HttpClient(f"wss://127.0.0.1:{port}/acp", verify=str(tls_certificate().cert), timeout=10)
    await asyncio.wait_for(whole_session(client, tmp_path), 30)
    assert worker.errors() == []
