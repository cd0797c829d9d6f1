"""Hostile requests at the transport edge, over raw sockets against a real daphne (and uvicorn
for the server-independent body limit).

- Bodies: a declared Content-Length over MAX_BODY_BYTES is refused at the headers, before any
  body is sent; a chunked body is cut as soon as it passes the limit; a body of exactly the limit
  still works; streaming 1 GiB costs the server about the limit, not the gigabyte. Only the ACP
  endpoint's limit applies.
- Slow clients (daphne): headers, an upgrade's headers, or a body that stall get 408 and a closed
  socket; long SSE responses on keep-alive connections are not cut.
- Oversized headers (daphne): 431 (414 for the request line) with a text body, not a silent drop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import TypeVar

import httpx
import pytest

from tests.live import (
    JSON,
    DaphneServer,
    RawConnection,
    RawSse,
    ServerProcess,
    UvicornServer,
    initialize,
    memory,
    post,
    reset_peak_memory,
    rpc,
)

MiB = 1024 * 1024
GiB = 1024 * MiB
BODY_LIMIT = 1 * MiB
SLACK = 64 * MiB
T = 10.0
ENV = {
    "ACP_AGENT": "tests.wire_agent.create",
    "ACP_KEEPALIVE_SECONDS": "0.25",
    "ACP_MAX_BODY_BYTES": str(BODY_LIMIT),
    "ACP_HEADER_TIMEOUT_SECONDS": "1",
    "ACP_BODY_TIMEOUT_SECONDS": "1",
}
BODY_TOO_LARGE = b"POST body too large"
T_ = TypeVar("T_")
POST_HEAD = "POST /acp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"


@pytest.fixture(scope="module")
def daphne_server() -> Iterator[DaphneServer]:
    server = DaphneServer(env=ENV).start()
    yield server
    server.stop()
    assert server.errors() == []


@pytest.fixture(scope="module")
def uvicorn_server() -> Iterator[UvicornServer]:
    server = UvicornServer(env=ENV).start()
    yield server
    server.stop()


@pytest.fixture(params=["daphne", "uvicorn"])
def server(request: pytest.FixtureRequest) -> ServerProcess:
    """The body limit holds on both servers (daphne in Twisted, uvicorn through the ASGI guard)."""
    fixture: ServerProcess = request.getfixturevalue(f"{request.param}_server")
    return fixture


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    # No keep-alive: the servers close idle connections after the (short) header timeout.
    async with httpx.AsyncClient(timeout=httpx.Timeout(T), limits=httpx.Limits(max_keepalive_connections=0)) as client:
        yield client


@contextlib.asynccontextmanager
async def raw(server: ServerProcess) -> AsyncIterator[RawConnection]:
    connection = await RawConnection.open(server.port)
    try:
        yield connection
    finally:
        await connection.close()


async def refused(connection: RawConnection, status: int, text: bytes, closes: bool = True) -> None:
    """The next response is `status` with a plain-text `text` and `Connection: close`, and the
    server then closes once the client is done."""
    got, headers, body = await asyncio.wait_for(connection.response(), T)
    assert (got, body) == (status, text), (got, headers, body)
    assert headers["content-type"].startswith("text/plain")
    if closes:
        assert headers["connection"] == "close"
        if status != 408:  # the server lingers for a client that may still be sending: end it
            connection.writer.write_eof()
        assert await asyncio.wait_for(connection.closed_by_server(), T)


def closes(server: ServerProcess) -> bool:
    """Both servers close after refusing a body (uvicorn on its own: it never reuses a connection
    whose request body was not read, and closes at once, see `answer_or_reset`)."""
    return True


async def answer_or_reset(server: ServerProcess, answer: Awaitable[T_]) -> T_ | None:
    """The answer to a request refused while the client still sends its body; under uvicorn
    None when the connection was reset instead: uvicorn closes the socket right after the 413
    with the rest of the body unread (no lingering close), and the kernel's reset can destroy
    the answer before the client reads it. daphne lingers, so there the answer must arrive."""
    try:
        return await answer
    except (ConnectionError, httpx.TransportError):
        if isinstance(server, DaphneServer):
            raise
        return None


def initialize_body(size: int) -> bytes:
    """An initialize request of exactly `size` bytes (padded inside its params)."""
    body = json.dumps(rpc(0, "initialize", {"protocolVersion": 1, "pad": ""})).encode()
    return body.replace(b'"pad": ""', b'"pad": "' + b"x" * (size - len(body)) + b'"')


def chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def works(http: httpx.AsyncClient, server: ServerProcess) -> None:
    """Other clients are unaffected: a normal initialize still succeeds."""
    url = f"http://127.0.0.1:{server.port}/acp"
    connection_id = await initialize(http, url)
    await http.delete(url, headers={"Acp-Connection-Id": connection_id})


# -- body size -------------------------------------------------------------------------------


async def test_declared_length_over_the_limit_is_refused_before_the_body(
    server: ServerProcess, http: httpx.AsyncClient
) -> None:
    async with raw(server) as connection:
        await connection.send(f"{POST_HEAD}Content-Length: {GiB}\r\n\r\n".encode())
        await refused(connection, 413, BODY_TOO_LARGE, closes(server))
    await works(http, server)


async def test_a_refused_client_that_stays_is_cut_after_the_linger(daphne_server: DaphneServer) -> None:
    """After a 413 the server reads on (discarding) for a few seconds, not forever."""
    async with raw(daphne_server) as connection:
        await connection.send(f"{POST_HEAD}Content-Length: {GiB}\r\n\r\n".encode())
        status, _, _ = await asyncio.wait_for(connection.response(), T)
        assert status == 413
        assert await asyncio.wait_for(connection.closed_by_server(), T)


async def test_expect_100_continue_gets_the_413_and_no_continue(server: ServerProcess) -> None:
    async with raw(server) as connection:
        await connection.send(f"{POST_HEAD}Content-Length: {GiB}\r\nExpect: 100-continue\r\n\r\n".encode())
        await refused(connection, 413, BODY_TOO_LARGE, closes(server))


async def test_chunked_body_is_cut_at_the_limit(server: ServerProcess, http: httpx.AsyncClient) -> None:
    async with raw(server) as connection:
        await connection.send(f"{POST_HEAD}Transfer-Encoding: chunked\r\n\r\n".encode())
        await connection.send(chunked(b" " * (BODY_LIMIT // 2)) + chunked(b" " * (BODY_LIMIT // 2 + 1)))
        # ...and then the client sends nothing more: the answer must not wait for the rest.
        await refused(connection, 413, BODY_TOO_LARGE, closes(server))
    await works(http, server)


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_a_body_of_exactly_the_limit_works_and_one_more_byte_does_not(
    server: ServerProcess, http: httpx.AsyncClient, framing: str
) -> None:
    url = f"http://127.0.0.1:{server.port}/acp"

    async def send(body: bytes) -> httpx.Response:
        if framing == "content-length":
            return await http.post(url, headers=JSON, content=body)

        async def parts() -> AsyncIterator[bytes]:
            yield body[: len(body) // 2]
            yield body[len(body) // 2 :]

        return await http.post(url, headers=JSON, content=parts())

    response = await send(initialize_body(BODY_LIMIT))
    assert response.status_code == 200, response.text
    await http.delete(url, headers={"Acp-Connection-Id": response.headers["acp-connection-id"]})
    refused_response = await answer_or_reset(server, send(initialize_body(BODY_LIMIT + 1)))
    if refused_response is not None:
        assert (refused_response.status_code, refused_response.content) == (413, BODY_TOO_LARGE)


async def test_other_paths_keep_djangos_limits(daphne_server: DaphneServer, http: httpx.AsyncClient) -> None:
    """A body over MAX_BODY_BYTES to another view is that view's business (here: 405)."""
    response = await http.post(f"http://127.0.0.1:{daphne_server.port}/health", content=b" " * (2 * BODY_LIMIT))
    assert response.status_code == 405


async def test_streaming_a_gigabyte_costs_about_the_limit(server: ServerProcess, http: httpx.AsyncClient) -> None:
    assert server.process is not None
    pid = server.process.pid
    rss_before = memory(pid)[0]
    if not reset_peak_memory(pid):
        pytest.skip("cannot reset the peak RSS of the server (/proc/<pid>/clear_refs)")
    async with raw(server) as connection:
        await connection.send(f"{POST_HEAD}Transfer-Encoding: chunked\r\n\r\n".encode())

        async def upload() -> None:
            piece = chunked(b" " * MiB)
            with contextlib.suppress(ConnectionError):
                for _ in range(GiB // MiB):
                    await connection.send(piece)
                    # drain() does not yield while the socket takes everything: let the answer
                    # be read as it arrives, as a client reading while it sends would.
                    await asyncio.sleep(0)
                await connection.send(b"0\r\n\r\n")

        uploading = asyncio.create_task(upload())
        try:
            await answer_or_reset(server, refused(connection, 413, BODY_TOO_LARGE, closes=False))
        finally:
            uploading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await uploading
    peak = memory(pid)[1]
    assert peak - rss_before < BODY_LIMIT + SLACK, f"peak RSS grew by {(peak - rss_before) / MiB:.0f} MiB"
    await works(http, server)


# -- slow clients (daphne) -------------------------------------------------------------------


async def test_stalled_headers_get_408(daphne_server: DaphneServer, http: httpx.AsyncClient) -> None:
    async with raw(daphne_server) as connection:
        await connection.send(b"GET /acp HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/ev")
        await refused(connection, 408, b"request headers not received in time")
    await works(http, daphne_server)


async def test_a_connection_that_sends_nothing_gets_408(daphne_server: DaphneServer) -> None:
    async with raw(daphne_server) as connection:
        await refused(connection, 408, b"request headers not received in time")


async def test_stalled_websocket_upgrade_gets_408(daphne_server: DaphneServer) -> None:
    async with raw(daphne_server) as connection:
        await connection.send(b"GET /acp HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n")
        await refused(connection, 408, b"request headers not received in time")


async def test_stalled_body_gets_408(daphne_server: DaphneServer, http: httpx.AsyncClient) -> None:
    async with raw(daphne_server) as connection:
        await connection.send(f"{POST_HEAD}Content-Length: 100\r\n\r\n{{}}".encode())
        await refused(connection, 408, b"request body not received in time")
    await works(http, daphne_server)


async def test_idle_keep_alive_connection_is_closed_quietly(daphne_server: DaphneServer) -> None:
    """After a response, the next request's headers are on the clock too; a connection that
    never starts one is closed without an answer (a 408 could cross the client's request)."""
    async with raw(daphne_server) as connection:
        await connection.send(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        status, _ = await asyncio.wait_for(connection.response_head(), T)
        assert status == 200
        body = await connection.reader.readuntil(b"0\r\n\r\n")  # the chunked body "ok"
        assert b"ok" in body
        assert await asyncio.wait_for(connection.closed_by_server(), T)


async def test_long_sse_stream_on_a_keep_alive_connection_is_not_cut(
    daphne_server: DaphneServer, http: httpx.AsyncClient
) -> None:
    url = daphne_server.url
    connection_id = await initialize(http, url)
    async with raw(daphne_server) as connection:
        stream = await RawSse.open(connection, connection_id)
        # 16 keep-alives at 0.25 s: the stream outlives both 1 s read timeouts several times.
        await stream.wait_comments(16)
        response = await post(http, url, rpc("late", "x/late"), connection_id)
        assert response.status_code == 202
        assert json.loads(await asyncio.wait_for(stream.next_event(), T) or "null")["id"] == "late"
    await http.delete(url, headers={"Acp-Connection-Id": connection_id})


# -- oversized headers (daphne) --------------------------------------------------------------


async def test_one_huge_header_line_gets_431(daphne_server: DaphneServer, http: httpx.AsyncClient) -> None:
    async with raw(daphne_server) as connection:
        await connection.send(b"GET /acp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * (64 * 1024) + b"\r\n\r\n")
        await refused(connection, 431, b"request header fields too large")
    await works(http, daphne_server)


async def test_many_headers_past_the_total_size_get_431(daphne_server: DaphneServer) -> None:
    headers = b"".join(b"X-Header-%d: %s\r\n" % (n, b"a" * 1000) for n in range(40))
    async with raw(daphne_server) as connection:
        await connection.send(b"GET /acp HTTP/1.1\r\nHost: 127.0.0.1\r\n" + headers + b"\r\n")
        await refused(connection, 431, b"request header fields too large")


async def test_a_huge_request_line_gets_414(daphne_server: DaphneServer) -> None:
    async with raw(daphne_server) as connection:
        await connection.send(b"GET /acp?" + b"a" * (64 * 1024) + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        await refused(connection, 414, b"request line too long")
