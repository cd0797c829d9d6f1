"""Over HTTP/2 (daphne over TLS), what holds over HTTP/1.1 still holds: the body limit (413 at
the headers for a declared length, as soon as a body without one passes the limit; the other
streams of the connection go on), CORS preflights and Origin refusals, bearer-token
authentication, keep-alive comments on idle streams, a stream the client resets is released,
and backpressure: a stream the client does not read (its flow-control window runs out) pauses
its agent without holding up the other streams of the same TCP connection, and a client that
stops reading the socket altogether, with windows as large as HTTP/2 allows, does not grow the
server beyond its budget either.

The misbehaving clients are tests.h2raw.RawH2 (the h2 package on a TLS socket); the well-behaved
ones are httpx with http2=True.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import httpx
import pytest

from acp_channels._limits import BODY_TOO_LARGE
from tests.h2raw import H2Stream, RawH2
from tests.live import DaphneServer, RawConnection, RawSse, RawWebSocket, memory, rpc, settle_paused, tls_certificate

pytestmark = pytest.mark.timeout(60)

MiB = 1024 * 1024
TOKEN = "parity-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ALLOWED_ORIGIN = "https://app.example"
BUFFERED_LIMIT = 1 * MiB
#: The body limit (16 MiB by default), smaller so that the tests send less.
BODY_LIMIT = 1 * MiB
FRAME_SIZE = 64 * 1024
FRAMES = 1000  # 62.5 MiB of agent output
#: What a paused connection legitimately holds besides its budget (a message in flight per
#: stream, the TLS transport's buffer, allocator slack): small next to the flood.
SLACK = 40 * MiB
ENV = {
    "ACP_AGENT": "tests.wire_agent.create",
    "ACP_TOKEN": TOKEN,
    "ACP_CORS_ALLOWED_ORIGINS": ALLOWED_ORIGIN,
    "ACP_KEEPALIVE_SECONDS": "0.5",
    "ACP_MAX_BUFFERED_BYTES": str(BUFFERED_LIMIT),
    "ACP_REPLAY_WINDOW_BYTES": str(BUFFERED_LIMIT // 4),  # within the budget (check E031)
    "ACP_MAX_BODY_BYTES": str(BODY_LIMIT),
    # The HTTP/1.1 read clocks, short: they must not touch a connection that went on as h2.
    "ACP_HEADER_TIMEOUT_SECONDS": "1",
    "ACP_BODY_TIMEOUT_SECONDS": "1",
}
JSON = {"content-type": "application/json"}
#: acp_channels._daphne_guards.LINGER_SECONDS (not imported: it is Twisted's, for daphne only).
LINGER_SECONDS = 5.0
_ids = itertools.count()


@pytest.fixture(scope="module")
def server() -> Iterator[DaphneServer]:
    daphne = DaphneServer(env=ENV, tls=tls_certificate()).start()
    yield daphne
    daphne.stop()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    context = ssl.create_default_context(cafile=str(tls_certificate().cert))
    async with httpx.AsyncClient(http2=True, verify=context, timeout=httpx.Timeout(20.0)) as client:
        yield client


@pytest.fixture
async def raw(server: DaphneServer) -> AsyncIterator[RawH2]:
    # Streams' windows of 64 KiB, the connection's 16 MiB (as httpx): a stream that is not read
    # holds only its own window, not the whole connection's.
    connection = await RawH2.open(server.port, str(tls_certificate().cert), connection_window=16 * MiB)
    yield connection
    await connection.close()


def events_of(body: bytes) -> list[str]:
    """The data of each SSE event in a stream's body so far (comments skipped)."""
    events = []
    for block in body.split(b"\n\n")[:-1]:
        data = [line[5:].removeprefix(b" ") for line in block.split(b"\n") if line.startswith(b"data:")]
        if data:
            events.append(b"\n".join(data).decode())
    return events


async def initialize(http: httpx.AsyncClient, url: str) -> str:
    response = await http.post(url, headers={**JSON, **AUTH}, json=rpc(0, "initialize", {"protocolVersion": 1}))
    assert (response.status_code, response.http_version) == (200, "HTTP/2"), response.text
    return response.headers["acp-connection-id"]


async def raw_initialize(raw: RawH2, port: int) -> str:
    stream = await raw.request("POST", port, {**JSON, **AUTH}, json.dumps(rpc(0, "initialize", {})).encode())
    await raw.wait(stream, "ended")
    assert stream.status == 200, stream.body
    return stream.headers["acp-connection-id"]


async def raw_post(raw: RawH2, port: int, connection_id: str, message: object) -> None:
    headers = {**JSON, **AUTH, "acp-connection-id": connection_id}
    stream = await raw.request("POST", port, headers, json.dumps(message).encode())
    await raw.wait(stream, "ended")
    assert stream.status == 202, stream.body


async def raw_sse(raw: RawH2, port: int, connection_id: str, *, acknowledge: bool = True) -> H2Stream:
    headers = {"accept": "text/event-stream", **AUTH, "acp-connection-id": connection_id}
    stream = await raw.request("GET", port, headers, acknowledge=acknowledge)
    await raw.wait(stream, "response")
    assert stream.status == 200, stream.body
    return stream


# -- body limit ------------------------------------------------------------------------------


async def test_declared_length_over_the_limit_is_refused_at_the_headers(server: DaphneServer, raw: RawH2) -> None:
    """Content-Length over MAX_BODY_BYTES (1 MiB here): 413 before any body is sent (over HTTP/1.1 the same;
    before, Twisted waited for the whole body and daphne queued it for the application)."""
    headers = {**JSON, **AUTH, "content-length": str(BODY_LIMIT + 1)}
    stream = await raw.request("POST", server.port, headers, end_stream=False)
    await raw.wait(stream, "ended", timeout=5)
    assert stream.status == 413 and bytes(stream.body) == BODY_TOO_LARGE.encode()
    # The connection's other streams go on.
    assert await raw_initialize(raw, server.port)
    # A client that never ends its body is not waited for forever: the stream is reset after
    # the linger (NO_ERROR: it was answered), the connection stays.
    async with asyncio.timeout(LINGER_SECONDS + 5):
        while stream.reset is None:
            stream.changed.clear()
            await stream.changed.wait()
    assert stream.reset == 0
    assert await raw_initialize(raw, server.port)
    assert server.errors() == []


async def test_body_without_a_length_is_refused_once_it_passes_the_limit(server: DaphneServer, raw: RawH2) -> None:
    stream = await raw.request("POST", server.port, {**JSON, **AUTH}, end_stream=False)
    await raw.send_data(stream, b" " * (BODY_LIMIT + 1))
    await raw.wait(stream, "ended", timeout=10)  # answered while the client's body is still open
    assert stream.status == 413 and bytes(stream.body) == BODY_TOO_LARGE.encode()
    assert await raw_initialize(raw, server.port)
    assert server.errors() == []


async def test_httpx_sending_an_oversized_body_reads_the_413(server: DaphneServer, http: httpx.AsyncClient) -> None:
    """A client that sends its whole body before reading (httpx) gets the answer: the refused
    stream's body is read and dropped, not reset under it."""
    connection_id = await initialize(http, server.url)
    headers = {**JSON, **AUTH, "Acp-Connection-Id": connection_id}
    response = await http.post(server.url, headers=headers, content=b" " * (4 * BODY_LIMIT))
    assert (response.status_code, response.http_version, response.text) == (413, "HTTP/2", BODY_TOO_LARGE)
    exact = await http.post(server.url, headers=headers, content=json.dumps(rpc(1, "x")).encode())
    assert exact.status_code == 202
    await http.delete(server.url, headers={**AUTH, "Acp-Connection-Id": connection_id})


async def test_the_http11_read_clocks_leave_an_h2_connection_alone(server: DaphneServer, raw: RawH2) -> None:
    """The connection starts under the HTTP/1.1 channel, whose header clock (1 s here) runs from
    the TLS connection on; once ALPN chose h2 it must neither answer 408 nor close: a stream
    whose body comes after the clock would have fired is served (h2 has no body timeout)."""
    headers = {**JSON, **AUTH}
    stream = await raw.request("POST", server.port, headers, end_stream=False)
    await asyncio.sleep(1.5)  # nothing to await: the clocks must not fire; past both of them
    await raw.send_data(stream, json.dumps(rpc(0, "initialize", {})).encode(), end_stream=True)
    await raw.wait(stream, "ended")
    assert stream.status == 200 and b'"id":0' in stream.body
    assert not raw.closed.is_set()
    assert server.errors() == []


# -- CORS, Origin, authentication --------------------------------------------------------------


async def test_cors_preflight_and_origin_refusal_over_h2(server: DaphneServer, http: httpx.AsyncClient) -> None:
    preflight = await http.options(
        server.url,
        headers={
            "Origin": ALLOWED_ORIGIN,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type, acp-connection-id, authorization",
        },
    )
    assert (preflight.status_code, preflight.http_version) == (200, "HTTP/2")
    assert preflight.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
    assert "acp-connection-id" in preflight.headers["access-control-allow-headers"].lower()

    body = rpc(0, "initialize", {"protocolVersion": 1})
    listed = await http.post(server.url, headers={**JSON, **AUTH, "Origin": ALLOWED_ORIGIN}, json=body)
    assert listed.status_code == 200
    assert listed.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
    assert "acp-connection-id" in listed.headers["access-control-expose-headers"].lower()
    await http.delete(server.url, headers={**AUTH, "Acp-Connection-Id": listed.headers["acp-connection-id"]})

    own = await http.post(server.url, headers={**JSON, **AUTH, "Origin": f"https://127.0.0.1:{server.port}"}, json=body)
    assert own.status_code == 200  # the page's own origin: https, from the TLS connection
    await http.delete(server.url, headers={**AUTH, "Acp-Connection-Id": own.headers["acp-connection-id"]})
    foreign = await http.post(server.url, headers={**JSON, **AUTH, "Origin": "https://evil.example"}, json=body)
    assert (foreign.status_code, foreign.text) == (403, "origin not allowed")


async def test_bearer_token_over_h2(server: DaphneServer, http: httpx.AsyncClient) -> None:
    body = rpc(0, "initialize", {"protocolVersion": 1})
    missing = await http.post(server.url, headers=JSON, json=body)
    assert (missing.status_code, missing.http_version) == (401, "HTTP/2")
    assert missing.headers["www-authenticate"].startswith("Bearer")
    wrong = await http.post(server.url, headers={**JSON, "Authorization": "Bearer wrong-token-xyz"}, json=body)
    assert wrong.status_code == 401
    connection_id = await initialize(http, server.url)
    stream = await http.get(server.url, headers={"Accept": "text/event-stream", "Acp-Connection-Id": connection_id})
    assert stream.status_code == 401  # every request carries the token, streams too
    refused = await http.delete(server.url, headers={"Acp-Connection-Id": connection_id})
    assert refused.status_code == 401
    deleted = await http.delete(server.url, headers={**AUTH, "Acp-Connection-Id": connection_id})
    assert (deleted.status_code, deleted.http_version) == (202, "HTTP/2")
    gone = await http.delete(server.url, headers={**AUTH, "Acp-Connection-Id": connection_id})
    assert gone.status_code == 404


# -- streams: keep-alives, resets ----------------------------------------------------------


async def test_idle_stream_gets_keep_alive_comments_and_a_reset_stream_is_released(
    server: DaphneServer, raw: RawH2
) -> None:
    connection_id = await raw_initialize(raw, server.port)
    stream = await raw_sse(raw, server.port, connection_id)
    async with asyncio.timeout(5):
        while stream.body.count(b"\n\n") < 2:  # two comments, 0.5 s apart
            stream.changed.clear()
            await stream.changed.wait()
    assert events_of(bytes(stream.body)) == []
    # The client resets the stream (what closing an h2 response does): the server lets go of
    # the reader, so the stream can be read again at once instead of 409.
    raw.h2.reset_stream(stream.stream_id)
    await raw.flush()
    async with asyncio.timeout(5):
        while True:
            again = await raw.request(
                "GET", server.port, {"accept": "text/event-stream", **AUTH, "acp-connection-id": connection_id}
            )
            await raw.wait(again, "response")
            if again.status == 200:
                break
            assert again.status == 409
            await raw.wait(again, "ended")
    await raw_post(raw, server.port, connection_id, rpc("ping", "test/echo", {"n": 1}))
    await raw.wait_body(again, b'"ping"')
    assert server.errors() == []


# -- backpressure ----------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def flood_counter(http: httpx.AsyncClient, url: str) -> AsyncIterator[Callable[[], Awaitable[int]]]:
    """How many flood frames the hosts of the process have taken from their agents, asked over
    an ACP connection of its own (its own h2 connection)."""
    connection_id = await initialize(http, url)
    headers = {"Accept": "text/event-stream", **AUTH, "Acp-Connection-Id": connection_id}
    async with http.stream("GET", url, headers=headers) as response:
        lines = response.aiter_lines()

        async def taken() -> int:
            request_id = f"stats-{next(_ids)}"
            answer = await http.post(
                url,
                headers={**JSON, **AUTH, "Acp-Connection-Id": connection_id},
                json=rpc(request_id, "test/flood_stats"),
            )
            assert answer.status_code == 202, answer.text
            async for line in lines:
                if line.startswith("data:"):
                    reply = json.loads(line[5:])
                    assert reply["id"] == request_id, reply
                    count: int = reply["result"]["taken"]
                    return count
            raise AssertionError("the stats stream ended")

        yield taken
    await http.delete(url, headers={**AUTH, "Acp-Connection-Id": connection_id})


def check_flood(events: list[str]) -> None:
    """The flood's reply, then every frame once, in order, whole."""
    assert json.loads(events[0]) == {"jsonrpc": "2.0", "id": "flood", "result": {"ok": True}}
    for n, text in enumerate(events[1:]):
        message = json.loads(text)
        assert message["method"] == "test/flooded" and message["params"]["n"] == n, (n, text[:80])
        assert len(message["params"]["pad"]) == FRAME_SIZE
    assert len(events) == FRAMES + 1


async def read_whole_flood(raw: RawH2, stream: H2Stream, timeout: float = 40.0) -> list[str]:
    needle = f'"n":{FRAMES - 1},'.encode()
    async with asyncio.timeout(timeout):
        while True:  # the last frame's event, to its end
            tail = stream.body[-3 * FRAME_SIZE :]
            at = tail.find(needle)
            if at >= 0 and tail.find(b"\n\n", at) >= 0:
                break
            stream.changed.clear()
            await stream.changed.wait()
    return [event for event in events_of(bytes(stream.body)) if '"test/flooded"' in event or '"flood"' in event]


async def test_unread_stream_pauses_its_agent_and_the_connections_other_streams_go_on(
    server: DaphneServer, http: httpx.AsyncClient, raw: RawH2
) -> None:
    """The client stops acknowledging one stream (its 64 KiB window runs out): that agent is
    paused and the server stays within its budget, while another ACP connection's stream on the
    same TCP connection keeps answering; acknowledging again delivers everything in order."""
    assert server.process is not None
    async with flood_counter(http, server.url) as taken:
        flooded = await raw_initialize(raw, server.port)
        neighbour = await raw_initialize(raw, server.port)
        unread = await raw_sse(raw, server.port, flooded, acknowledge=False)
        read = await raw_sse(raw, server.port, neighbour)
        before = await taken()
        rss_before = memory(server.process.pid)[0]
        await raw_post(raw, server.port, flooded, rpc("flood", "test/flood", {"count": FRAMES, "size": FRAME_SIZE}))
        frames_taken, rss = await settle_paused(server, taken)
        assert frames_taken - before < FRAMES, "the agent was never paused"
        assert rss - rss_before < BUFFERED_LIMIT + SLACK, f"server grew by {(rss - rss_before) / MiB:.0f} MiB"
        # The neighbour on the same TCP connection is not held up.
        for n in range(3):
            started = time.monotonic()
            await raw_post(raw, server.port, neighbour, rpc(f"echo-{n}", "test/echo", {"n": n}))
            await raw.wait_body(read, f'"echo-{n}"'.encode(), timeout=5)
            assert time.monotonic() - started < 2.0
        raw.acknowledge(unread)
        check_flood(await read_whole_flood(raw, unread))
    assert server.errors() == []


async def test_client_that_stops_reading_the_socket_with_huge_windows_does_not_grow_the_server(
    server: DaphneServer, http: httpx.AsyncClient
) -> None:
    """Windows of 2 GiB (stream and connection) and then no reading at all: flow control never
    stops the server, only the socket does. The agent must still be paused within the budget
    (before, every frame queued in the server's HTTP/2 stream buffers)."""
    assert server.process is not None
    huge = 2**31 - 1
    raw = await RawH2.open(
        server.port, str(tls_certificate().cert), initial_window=huge, connection_window=huge - 65535,
        receive_buffer=4096,
    )  # fmt: skip
    try:
        async with flood_counter(http, server.url) as taken:
            connection_id = await initialize(http, server.url)
            stream = await raw_sse(raw, server.port, connection_id)
            raw.stop_reading()
            before = await taken()
            rss_before = memory(server.process.pid)[0]
            flood = rpc("flood", "test/flood", {"count": FRAMES, "size": FRAME_SIZE})
            headers = {**JSON, **AUTH, "Acp-Connection-Id": connection_id}
            assert (await http.post(server.url, headers=headers, json=flood)).status_code == 202
            frames_taken, rss = await settle_paused(server, taken)
            assert frames_taken - before < FRAMES, "the agent was never paused"
            assert rss - rss_before < BUFFERED_LIMIT + SLACK, f"server grew by {(rss - rss_before) / MiB:.0f} MiB"
            raw.resume_reading()
            check_flood(await read_whole_flood(raw, stream))
    finally:
        await raw.close()
    assert server.errors() == []


# -- HTTP/1.1 over the same TLS port -------------------------------------------------------


def http11_tls() -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(tls_certificate().cert))
    context.set_alpn_protocols(["http/1.1"])
    return context


async def test_http11_readers_over_tls_that_stop_reading_pause_the_agent(
    server: DaphneServer, http: httpx.AsyncClient
) -> None:
    """On the TLS port, clients that do not offer h2 get HTTP/1.1: an SSE reader and a wss://
    socket that stop reading pause their agents there too (the send gate reaches the HTTP/1.1
    channel through the TLS transport's producer)."""
    assert server.process is not None
    flood = {"count": FRAMES, "size": FRAME_SIZE}
    async with flood_counter(http, server.url) as taken:
        connection_id = await initialize(http, server.url)
        raw = await RawConnection.open(server.port, receive_buffer=4096, tls=http11_tls())
        try:
            await raw.send(
                f"GET /acp HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nAccept: text/event-stream\r\n"
                f"Authorization: Bearer {TOKEN}\r\nAcp-Connection-Id: {connection_id}\r\n\r\n".encode()
            )
            sse = RawSse(raw)
            status, _ = await raw.response_head()
            assert status == 200
            before = await taken()
            rss_before = memory(server.process.pid)[0]
            headers = {**JSON, **AUTH, "Acp-Connection-Id": connection_id}
            assert (
                await http.post(server.url, headers=headers, json=rpc("flood", "test/flood", flood))
            ).status_code == 202
            frames_taken, rss = await settle_paused(server, taken)
            assert frames_taken - before < FRAMES, "the SSE reader's agent was never paused"
            assert rss - rss_before < BUFFERED_LIMIT + SLACK, f"server grew by {(rss - rss_before) / MiB:.0f} MiB"
            check_flood([await sse.next_event() or "" for _ in range(FRAMES + 1)])
        finally:
            await raw.close()

        raw = await RawConnection.open(server.port, receive_buffer=4096, tls=http11_tls())
        try:
            await raw.send(
                f"GET /acp HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nUpgrade: websocket\r\n"
                "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                f"Sec-WebSocket-Version: 13\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode()
            )
            status, headers = await raw.response_head()
            assert status == 101, (status, headers)
            ws = RawWebSocket(raw, headers)
            await ws.send_text(json.dumps(rpc(0, "initialize", {"protocolVersion": 1})))
            assert json.loads(await ws.receive() or "null")["id"] == 0
            before = await taken()
            rss_before = memory(server.process.pid)[0]
            await ws.send_text(json.dumps(rpc("flood", "test/flood", flood)))
            frames_taken, rss = await settle_paused(server, taken)
            assert frames_taken - before < FRAMES, "the WebSocket's agent was never paused"
            assert rss - rss_before < BUFFERED_LIMIT + SLACK, f"server grew by {(rss - rss_before) / MiB:.0f} MiB"
            check_flood([await ws.receive() or "" for _ in range(FRAMES + 1)])
        finally:
            await raw.close()
    assert server.errors() == []
