"""HTTP/2 on live servers (docs/http2.md): daphne over TLS (h2 through ALPN), hypercorn over TLS
and cleartext h2c, with our HttpClient, curl and the official Python SDK client.

What is checked: the server's answers really are HTTP/2 (the client's negotiated version, and
curl's status line); a whole session runs over it; 50 sessions' streams share ONE TCP
connection (the server's established sockets are counted in /proc/net/tcp); HttpClient falls
back to HTTP/1.1 where the server does not offer h2 (plain http://, uvicorn over TLS).
Behaviour parity with HTTP/1.1 (body limit, CORS, Origin, authentication, keep-alives, flow
control and backpressure) is in tests/test_http2_parity_live.py.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import acp
import httpx
import pytest
from acp.http import create_http_stream
from acp.interfaces import Client
from h2.settings import SettingCodes

from acp_channels.client import HttpClient
from tests.h2raw import H2Stream, RawH2
from tests.live import DaphneServer, HypercornServer, UvicornServer, tls_certificate
from tests.test_client_servers import RecordingClient, first_turns, step

pytestmark = pytest.mark.timeout(60)
TOKEN = "h2-test-token-0123456789"


def established_connections(port: int) -> int:
    """Established TCP connections whose local end is `port` on this machine: the server's side
    of each client connection (both ends are on loopback, the client's has another port)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] == "01":  # 01: ESTABLISHED
                count += 1
    return count


@pytest.fixture(scope="module")
def daphne_tls() -> Iterator[DaphneServer]:
    # More session streams than the default 64: past the server's 100 h2 streams per connection.
    env = {"ACP_TOKEN": TOKEN, "ACP_MAX_SESSION_STREAMS": "128"}
    server = DaphneServer(env=env, tls=tls_certificate()).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def hypercorn_tls() -> Iterator[HypercornServer]:
    server = HypercornServer(tls=tls_certificate()).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def hypercorn_plain() -> Iterator[HypercornServer]:
    server = HypercornServer().start()
    yield server
    server.stop()


async def whole_session(transport: Any, tmp_path: Path) -> None:
    """initialize, session/new, prompts (echo, a stream of chunks, a permission request), then
    close: every kind of traffic the transport carries (POST answers, both kinds of stream, the
    client's reply to an agent request, DELETE)."""
    recorder = RecordingClient()
    conn = acp.connect_to_agent(cast(Client, recorder), transport)
    try:
        _, prompt = await first_turns(conn, recorder, tmp_path, "hello over h2")
        assert await prompt("permission") == "end_turn"
        assert recorder.permissions == [["allow", "reject"]]
        await step(recorder.settle(1))
        assert recorder.take() == ["permission: allow"]
    finally:
        await conn.close()


async def test_http_client_runs_a_whole_session_over_h2_on_daphne_on_one_tcp_connection(
    daphne_tls: DaphneServer, tmp_path: Path
) -> None:
    versions: list[str | None] = []

    class Watched(HttpClient):
        async def send(self, message: Any, *, raw: str | None = None) -> None:
            await super().send(message, raw=raw)
            versions.append(self.http_version)
            # The connection stream, a session stream and the POSTs: all on one connection.
            assert established_connections(daphne_tls.port) == 1

    client = Watched(daphne_tls.url, token=TOKEN, verify=str(tls_certificate().cert), timeout=10)
    await whole_session(client, tmp_path)
    assert versions and set(versions) == {"HTTP/2"}, versions
    assert client.transport.deletes_sent == 1
    assert daphne_tls.errors() == []


async def test_fifty_sessions_stream_over_one_tcp_connection(daphne_tls: DaphneServer, tmp_path: Path) -> None:
    """50 session streams and the connection stream of one HttpClient connection, all open at
    once, on one TCP connection; each session's prompt is answered on its own stream."""
    recorder = RecordingClient()
    transport = HttpClient(daphne_tls.url, token=TOKEN, verify=str(tls_certificate().cert), timeout=20)
    conn = acp.connect_to_agent(cast(Client, recorder), transport)
    try:
        await step(conn.initialize(protocol_version=1))
        sessions = [await step(conn.new_session(cwd=str(tmp_path), mcp_servers=[])) for _ in range(50)]
        replies = await step(
            asyncio.gather(
                *(
                    conn.prompt(session_id=session.session_id, prompt=[acp.text_block(f"echo s{n}")])
                    for n, session in enumerate(sessions)
                )
            )
        )
        assert {str(reply.stop_reason) for reply in replies} == {"end_turn"}
        await step(recorder.settle(50))
        assert sorted(recorder.take()) == sorted(f"s{n}" for n in range(50))
        # Each prompt waited for its session's stream: all 51 streams are open now.
        http = transport.transport
        assert len([stream for stream in http._streams.values() if stream.connected]) == 51
        assert transport.http_version == "HTTP/2"
        assert established_connections(daphne_tls.port) == 1
    finally:
        await conn.close()


async def test_more_streams_than_one_h2_connection_allows_go_on_another(
    daphne_tls: DaphneServer, tmp_path: Path
) -> None:
    """daphne allows 100 streams at once per HTTP/2 connection; 110 sessions (111 streams that
    stay open) take a second connection instead of waiting forever for a stream to end."""
    recorder = RecordingClient()
    transport = HttpClient(daphne_tls.url, token=TOKEN, verify=str(tls_certificate().cert), timeout=20)
    conn = acp.connect_to_agent(cast(Client, recorder), transport)
    try:
        await step(conn.initialize(protocol_version=1))
        sessions = [await step(conn.new_session(cwd=str(tmp_path), mcp_servers=[])) for _ in range(110)]
        last = sessions[-1].session_id
        assert str((await step(conn.prompt(session_id=last, prompt=[acp.text_block("echo last")]))).stop_reason) == (
            "end_turn"
        )
        await step(recorder.settle(1))
        assert recorder.take() == ["last"]
        assert 2 <= established_connections(daphne_tls.port) <= 3
        assert transport.http_version == "HTTP/2"
    finally:
        await conn.close()


async def test_http_client_falls_back_to_http11_without_h2(tmp_path: Path) -> None:
    """A plain http:// server and a TLS server that does not offer h2 (uvicorn) are spoken to
    over HTTP/1.1; the session works the same."""
    plain = DaphneServer().start()
    uvicorn_tls = UvicornServer(tls=tls_certificate()).start()
    try:
        for url in (plain.url, uvicorn_tls.url):
            client = HttpClient(url, verify=str(tls_certificate().cert), timeout=10)
            await whole_session(client, tmp_path)
            assert client.http_version == "HTTP/1.1", url
    finally:
        plain.stop()
        uvicorn_tls.stop()


async def test_http_client_without_http2_speaks_http11_to_an_h2_server(daphne_tls: DaphneServer) -> None:
    async with HttpClient(daphne_tls.url, token=TOKEN, verify=str(tls_certificate().cert), http2=False) as client:
        await client.send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}})
        assert (await step(client.receive()))["id"] == 0
        assert client.http_version == "HTTP/1.1"


async def test_official_python_sdk_client_runs_a_whole_session_over_h2(
    daphne_tls: DaphneServer, tmp_path: Path
) -> None:
    """The SDK's `create_http_stream` makes an HTTP/2 httpx client of its own; given one that
    trusts the test certificate, it negotiates h2 with daphne."""
    seen: list[str] = []

    async def note_version(response: httpx.Response) -> None:
        seen.append(response.http_version)

    http = httpx.AsyncClient(
        http2=True,
        verify=ssl.create_default_context(cafile=str(tls_certificate().cert)),
        timeout=httpx.Timeout(None),
        headers={"Authorization": f"Bearer {TOKEN}"},
        event_hooks={"response": [note_version]},
    )
    try:
        await whole_session(create_http_stream(daphne_tls.url, client=http), tmp_path)
    finally:
        await http.aclose()
    assert seen and set(seen) == {"HTTP/2"}, seen


async def test_hypercorn_serves_the_app_unchanged_over_h2_and_cleartext_h2c(
    hypercorn_tls: HypercornServer, hypercorn_plain: HypercornServer, tmp_path: Path
) -> None:
    client = HttpClient(hypercorn_tls.url, verify=str(tls_certificate().cert), timeout=10)
    await whole_session(client, tmp_path)
    assert client.http_version == "HTTP/2"
    # h2c with prior knowledge: httpx speaks it when told HTTP/1.1 is off.
    prior_knowledge = httpx.AsyncClient(http1=False, http2=True, timeout=httpx.Timeout(10.0, read=None))
    try:
        h2c = HttpClient(hypercorn_plain.url, http_client=prior_knowledge, timeout=10)
        await whole_session(h2c, tmp_path)
        assert h2c.http_version == "HTTP/2"
    finally:
        await prior_knowledge.aclose()


# -- WebSocket: over HTTP/1.1 on daphne, over HTTP/2 (RFC 8441) on hypercorn -----------------


async def test_websocket_over_tls_on_daphne_runs_on_http11(daphne_tls: DaphneServer, tmp_path: Path) -> None:
    """daphne does not offer WebSocket over HTTP/2 (its SETTINGS say ENABLE_CONNECT_PROTOCOL 0),
    so a wss:// client upgrades an HTTP/1.1 connection (ALPN http/1.1) on the same port."""
    raw = await RawH2.open(daphne_tls.port, str(tls_certificate().cert))
    try:
        await step(raw.settings_received.wait())
        assert raw.h2.remote_settings.get(SettingCodes.ENABLE_CONNECT_PROTOCOL, 0) == 0
    finally:
        await raw.close()
    client = HttpClient(daphne_tls.ws_url, token=TOKEN, verify=str(tls_certificate().cert), timeout=10)
    await whole_session(client, tmp_path)
    assert daphne_tls.errors() == []


def websocket_text_frame(text: str) -> bytes:
    payload = text.encode()
    mask = os.urandom(4)
    size = len(payload)
    head = struct.pack("!BB", 0x81, 0x80 | size) if size < 126 else struct.pack("!BBH", 0x81, 0x80 | 126, size)
    return head + mask + bytes(byte ^ mask[index % 4] for index, byte in enumerate(payload))


async def test_hypercorn_serves_websocket_over_h2_rfc8441(hypercorn_tls: HypercornServer) -> None:
    """Hypercorn advertises extended CONNECT; our consumer serves the WebSocket unchanged on an
    HTTP/2 stream: the 200 names the connection, and initialize is answered in a text frame."""
    raw = await RawH2.open(hypercorn_tls.port, str(tls_certificate().cert))
    try:
        await step(raw.settings_received.wait())
        assert raw.h2.remote_settings.get(SettingCodes.ENABLE_CONNECT_PROTOCOL, 0) == 1
        stream_id = raw.h2.get_next_available_stream_id()
        stream = raw.streams[stream_id] = H2Stream(stream_id)
        raw.h2.send_headers(
            stream_id,
            [
                (":method", "CONNECT"), (":protocol", "websocket"), (":scheme", "https"), (":path", "/acp"),
                (":authority", f"127.0.0.1:{hypercorn_tls.port}"), ("sec-websocket-version", "13"),
            ],
        )  # fmt: skip
        await raw.flush()
        await raw.wait(stream, "response")
        assert stream.status == 200 and stream.headers.get("acp-connection-id"), stream.headers
        raw.h2.send_data(stream_id, websocket_text_frame(INITIALIZE))
        await raw.flush()
        await raw.wait_body(stream, b'"protocolVersion":1')
        assert stream.body[0] == 0x81  # a final text frame
    finally:
        await raw.close()


INITIALIZE = '{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}'


def curl(*args: str) -> str:
    done = subprocess.run(
        ["curl", "-sS", "-v", "--max-time", "10", *args], capture_output=True, text=True, timeout=20, check=True
    )
    return done.stderr + done.stdout


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_http2_initializes_over_h2_and_h2c(daphne_tls: DaphneServer, hypercorn_plain: HypercornServer) -> None:
    features = subprocess.run(["curl", "--version"], capture_output=True, text=True, check=True).stdout
    if "HTTP2" not in features:
        pytest.skip("this curl has no HTTP/2")
    post = ["-H", "Content-Type: application/json", "-d", INITIALIZE]
    tls = curl("--http2", "--cacert", str(tls_certificate().cert), "-H", f"Authorization: Bearer {TOKEN}", *post,
               daphne_tls.url)  # fmt: skip
    assert "ALPN: server accepted h2" in tls or "ALPN, server accepted to use h2" in tls, tls
    assert "< HTTP/2 200" in tls and "< acp-connection-id: " in tls, tls
    assert '"protocolVersion":1' in tls
    cleartext = curl("--http2-prior-knowledge", *post, hypercorn_plain.url)
    assert "< HTTP/2 200" in cleartext and "< acp-connection-id: " in cleartext, cleartext
