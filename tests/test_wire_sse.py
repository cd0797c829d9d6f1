"""`GET`/`HEAD /acp` (SSE, docs/wire-contract.md §2.2, §6.3, §6.5, §6.6) and `DELETE /acp` with
the end of a connection (§2.3, §10), over the wire against the shared `wire_server` (keep-alive
0.5 s) and, for the header timing, the `demo_server` (keep-alive 15 s).
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.live import SSE, DaphneServer, SseReader, initialize, notification, open_sse, post, rpc

T = 5.0
MUST_ACCEPT = "client must accept text/event-stream"
CONNECTION_REQUIRED = "Acp-Connection-Id header required"
STREAM_TAKEN = "outbound stream already has a subscriber"
INIT = rpc(0, "initialize", {"protocolVersion": 1})
_ids = itertools.count()


pytestmark = pytest.mark.usefixtures("wire_log_stays_clean")


@pytest.fixture
async def connection_id(http: httpx.AsyncClient, url: str) -> AsyncIterator[str]:
    connection_id = await initialize(http, url)
    yield connection_id
    await http.delete(url, headers={"Acp-Connection-Id": connection_id})


def echo(request_id: Any, method: str, params: Any = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": {"method": method, "params": params}}


def stream_headers(connection_id: str | None, session_id: str | None = None, **extra: Any) -> dict[str, Any]:
    headers: dict[str, Any] = {**SSE, **extra}
    if connection_id is not None:
        headers["Acp-Connection-Id"] = connection_id
    if session_id is not None:
        headers["Acp-Session-Id"] = session_id
    return headers


async def get(http: httpx.AsyncClient, url: str, headers: dict[str, Any], drop: tuple[str, ...] = ()) -> httpx.Response:
    """A GET whose answer is not a stream (4xx), read whole."""
    request = http.build_request("GET", url, headers=headers)
    for name in drop:
        del request.headers[name]
    response = await http.send(request, stream=True)
    try:
        assert response.status_code != 200, "expected an error, got a stream"
        await response.aread()
    finally:
        await response.aclose()
    return response


async def accepted(
    http: httpx.AsyncClient, url: str, body: Any, connection_id: str, session_id: str | None = None
) -> None:
    response = await post(http, url, body, connection_id, session_id)
    assert response.status_code == 202, response.text


async def marker(
    http: httpx.AsyncClient, url: str, connection_id: str, stream: SseReader, session_id: str | None = None
) -> None:
    """Proves nothing else is waiting on a stream: a later reply to the same stream is next."""
    request_id = f"marker-{next(_ids)}"
    await accepted(http, url, rpc(request_id, "x/marker"), connection_id, session_id)
    params = None if session_id is None else {"sessionId": session_id}
    assert await stream.next(T) == echo(request_id, "x/marker", params)


def assert_text(response: httpx.Response, status: int, text: str) -> None:
    assert (response.status_code, response.text) == (status, text)
    assert response.headers["content-type"] == "text/plain; charset=utf-8"
    assert "acp-connection-id" not in response.headers


def assert_bare(response: httpx.Response, status: int) -> None:
    assert (response.status_code, response.content) == (status, b"")
    assert "content-type" not in response.headers
    assert "acp-connection-id" not in response.headers


async def wait_released(http: httpx.AsyncClient, url: str, connection_id: str, session_id: str | None = None) -> None:
    """Until the server has noticed a reader left (it does so asynchronously): HEAD runs the GET
    checks without taking the stream, so 200 means free. Bounded; each answer is awaited."""
    for _ in range(300):
        response = await http.head(url, headers=stream_headers(connection_id, session_id))
        if response.status_code == 200:
            return
        assert response.status_code == 409
        await asyncio.sleep(0.01)
    raise AssertionError("the stream was never released")


# -- GET checks, in order ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "accept",
    [None, "*/*", "text/*", "text/html", "application/json", "Text/Event-Stream", b"text/event-stream\xe9"],
    ids=["missing", "any", "text-any", "html", "json", "case", "non-ascii"],
)
async def test_406_unless_accept_contains_text_event_stream(
    http: httpx.AsyncClient, url: str, connection_id: str, accept: str | bytes | None
) -> None:
    headers = stream_headers(connection_id, Accept=accept or "x")
    drop = ("accept",) if accept is None else ()
    assert_text(await get(http, url, headers, drop), 406, MUST_ACCEPT)
    # 406 is checked first: before the connection id (400) and its lookup (404)
    assert_text(await get(http, url, stream_headers(None, Accept=accept or "x"), drop), 406, MUST_ACCEPT)
    assert_text(await get(http, url, stream_headers(str(uuid.uuid4()), Accept=accept or "x"), drop), 406, MUST_ACCEPT)


@pytest.mark.parametrize(
    "accept", ["text/event-stream", "application/json, text/event-stream", "text/event-stream;q=1"]
)
async def test_accept_only_has_to_contain_text_event_stream(
    http: httpx.AsyncClient, url: str, connection_id: str, accept: str
) -> None:
    response = await http.head(url, headers=stream_headers(connection_id, Accept=accept))
    assert response.status_code == 200


async def test_only_the_first_accept_value_counts(http: httpx.AsyncClient, url: str, connection_id: str) -> None:
    headers = [("Accept", "*/*"), ("Accept", "text/event-stream"), ("Acp-Connection-Id", connection_id)]
    response = await http.head(url, headers=headers)
    assert response.status_code == 406


@pytest.mark.parametrize("value", [None, b"caf\xe9"], ids=["missing", "non-ascii"])
async def test_400_without_a_usable_connection_id(http: httpx.AsyncClient, url: str, value: bytes | None) -> None:
    headers = stream_headers(None)
    if value is not None:
        headers["Acp-Connection-Id"] = value
    assert_text(await get(http, url, headers), 400, CONNECTION_REQUIRED)


async def test_404_for_an_unknown_connection(http: httpx.AsyncClient, url: str) -> None:
    assert_bare(await get(http, url, stream_headers(str(uuid.uuid4()))), 404)
    assert_bare(await get(http, url, stream_headers(str(uuid.uuid4()), "s-1")), 404)


async def test_one_reader_per_stream_and_queued_items_survive_a_reader(
    http: httpx.AsyncClient, url: str, connection_id: str
) -> None:
    """Checklist 24: a second reader gets 409, other streams are independent, and items queued
    while nobody reads wait for the next reader, in order."""
    async with open_sse(http, url, connection_id, "s-24") as first:
        assert_text(await get(http, url, stream_headers(connection_id, "s-24")), 409, STREAM_TAKEN)
        async with open_sse(http, url, connection_id), open_sse(http, url, connection_id, "s-other"):
            assert_text(await get(http, url, stream_headers(connection_id)), 409, STREAM_TAKEN)
            assert_text(await get(http, url, stream_headers(connection_id, "s-other")), 409, STREAM_TAKEN)
        await accepted(http, url, rpc("before", "x/item", {"sessionId": "s-24"}), connection_id)
        assert await first.next(T) == echo("before", "x/item", {"sessionId": "s-24"})
    # the first reader is gone; once the server has noticed, queue while nobody reads
    await wait_released(http, url, connection_id, "s-24")
    await accepted(http, url, rpc("b-1", "test/burst", {"count": 3, "sessionId": "s-24"}), connection_id)
    async with open_sse(http, url, connection_id, "s-24") as second:
        for n in range(3):
            assert await second.next(T) == notification("test/item", {"n": n, "sessionId": "s-24"})
        assert await second.next(T) == {"jsonrpc": "2.0", "id": "b-1", "result": {"ok": True}}
        await marker(http, url, connection_id, second, "s-24")


async def test_stream_headers_and_echoed_session(http: httpx.AsyncClient, url: str, connection_id: str) -> None:
    for session_id in (None, "s-1", ""):
        request = http.build_request("GET", url, headers=stream_headers(connection_id, session_id))
        response = await http.send(request, stream=True)
        try:
            assert response.status_code == 200
            assert response.headers["content-type"] == "text/event-stream"
            assert response.headers["cache-control"] == "no-cache"
            assert response.headers["acp-connection-id"] == connection_id
            assert response.headers.get("acp-session-id") == session_id
        finally:
            await response.aclose()
        await wait_released(http, url, connection_id, session_id)  # noticed asynchronously
    # the empty session id is its own stream, apart from the connection stream
    async with open_sse(http, url, connection_id) as stream, open_sse(http, url, connection_id, "") as empty:
        await marker(http, url, connection_id, empty, "")
        await marker(http, url, connection_id, stream)


async def test_headers_are_sent_before_any_event(demo_server: DaphneServer, http: httpx.AsyncClient) -> None:
    """With the default 15 s keep-alive, the 200 must not wait for the first event or comment."""
    url = demo_server.url
    connection_id = await initialize(http, url)
    request = http.build_request("GET", url, headers=stream_headers(connection_id), timeout=3.0)
    response = await http.send(request, stream=True)
    try:
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream"
    finally:
        await response.aclose()
        await http.delete(url, headers={"Acp-Connection-Id": connection_id})


class RawBody:
    """The body bytes of a live response, read up to a marker at a time."""

    def __init__(self, response: httpx.Response) -> None:
        self._chunks = response.aiter_raw()
        self._data = b""

    async def until(self, marker: bytes, timeout: float = T) -> bytes:
        async def read() -> None:
            while marker not in self._data:
                self._data += await anext(self._chunks)

        await asyncio.wait_for(read(), timeout)
        end = self._data.index(marker) + len(marker)
        taken, self._data = self._data[:end], self._data[end:]
        return taken


async def test_event_framing_and_keepalive_comments(http: httpx.AsyncClient, url: str, connection_id: str) -> None:
    """§6.6: `data: <compact JSON>\\n\\n` per frame (after its `id:`), a batch is one event, `: \\n\\n` when idle."""
    request = http.build_request("GET", url, headers=stream_headers(connection_id))
    response = await http.send(request, stream=True)
    try:
        body = RawBody(response)
        opened = time.monotonic()
        idle = await body.until(b": \n\n" * 3)
        assert idle == b": \n\n" * 3  # the opening comment, then two keep-alives
        assert time.monotonic() - opened >= 0.9  # 2 keep-alives at 0.5 s, not a flood
        await accepted(http, url, rpc(1, "x/one", {"a": [1, 2]}), connection_id)
        await accepted(http, url, [rpc(2, "x/a"), rpc(3, "x/b")], connection_id)
        await accepted(http, url, rpc(4, "x/é"), connection_id)
        data = (await body.until(b'"x/\\u00e9","params":null}}\n\n')).replace(b": \n\n", b"")
        # Each event has an id (`<stream tag>-<n>`, for resuming: docs/resumable-streams.md).
        tag = re.match(rb"id: ([0-9a-f]+)-1\n", data)
        assert tag is not None, data
        assert data == (
            b"id: %s-1\n" % tag[1]
            + b'data: {"jsonrpc":"2.0","id":1,"result":{"method":"x/one","params":{"a":[1,2]}}}\n\n'
            + b"id: %s-2\n" % tag[1]
            + b'data: [{"jsonrpc":"2.0","id":2,"result":{"method":"x/a","params":null}},'
            b'{"jsonrpc":"2.0","id":3,"result":{"method":"x/b","params":null}}]\n\n'
            + b"id: %s-3\n" % tag[1]
            # non-ASCII is escaped on purpose (same JSON value; see tests/test_sse_encoding.py)
            + b'data: {"jsonrpc":"2.0","id":4,"result":{"method":"x/\\u00e9","params":null}}\n\n'
        )
        # keep-alives go on after events
        assert await body.until(b": \n\n" * 2) == b": \n\n" * 2
    finally:
        await response.aclose()


# -- HEAD ------------------------------------------------------------------------------------------


async def test_head_runs_the_get_checks_without_a_body(http: httpx.AsyncClient, url: str, connection_id: str) -> None:
    response = await http.head(url, headers=stream_headers(connection_id, Accept="*/*"))
    assert (response.status_code, response.content) == (406, b"")
    response = await http.head(url, headers=stream_headers(None))
    assert (response.status_code, response.content) == (400, b"")
    response = await http.head(url, headers=stream_headers(str(uuid.uuid4())))
    assert (response.status_code, response.content) == (404, b"")
    for session_id in (None, "s-head"):
        response = await http.head(url, headers=stream_headers(connection_id, session_id))
        assert (response.status_code, response.content) == (200, b"")
        assert response.headers["content-type"] == "text/event-stream"
        assert response.headers["cache-control"] == "no-cache"
        assert response.headers["acp-connection-id"] == connection_id
        assert response.headers.get("acp-session-id") == session_id
    # HEAD does not take the stream; a reader makes HEAD 409
    async with open_sse(http, url, connection_id, "s-head"):
        response = await http.head(url, headers=stream_headers(connection_id, "s-head"))
        assert (response.status_code, response.content) == (409, b"")


# -- buffering before a reader (§6.3) -----------------------------------------------------------------


async def test_a_burst_waits_for_the_first_reader_in_order(
    http: httpx.AsyncClient, url: str, connection_id: str
) -> None:
    """Checklist 23, 31: 1025 messages before any reader, delivered in order."""
    await accepted(http, url, rpc("burst", "test/burst", {"count": 1025}), connection_id)
    async with open_sse(http, url, connection_id) as stream:
        for n in range(1025):
            assert await stream.next(T) == notification("test/item", {"n": n})
        assert await stream.next(T) == {"jsonrpc": "2.0", "id": "burst", "result": {"ok": True}}
        await marker(http, url, connection_id, stream)


async def test_a_session_nobody_reads_does_not_stall_other_streams(
    http: httpx.AsyncClient, url: str, connection_id: str
) -> None:
    """Checklist 34."""
    async with open_sse(http, url, connection_id, "s-fast") as fast:
        await accepted(http, url, rpc("burst", "test/burst", {"count": 1025, "sessionId": "s-slow"}), connection_id)
        await marker(http, url, connection_id, fast, "s-fast")
    async with open_sse(http, url, connection_id, "s-slow") as slow:
        for n in range(1025):
            assert await slow.next(T) == notification("test/item", {"n": n, "sessionId": "s-slow"})
        assert await slow.next(T) == {"jsonrpc": "2.0", "id": "burst", "result": {"ok": True}}


# -- DELETE and the end of a connection --------------------------------------------------------------


async def test_delete_checks(http: httpx.AsyncClient, url: str) -> None:
    response = await http.delete(url)
    assert_text(response, 400, CONNECTION_REQUIRED)
    response = await http.delete(url, headers={b"Acp-Connection-Id": b"caf\xe9"})
    assert_text(response, 400, CONNECTION_REQUIRED)
    assert_bare(await http.delete(url, headers={"Acp-Connection-Id": str(uuid.uuid4())}), 404)
    connection_id = await initialize(http, url)
    # the session header is ignored: the whole connection goes
    assert_bare(await http.delete(url, headers={"Acp-Connection-Id": connection_id, "Acp-Session-Id": "s"}), 202)
    assert_bare(await http.delete(url, headers={"Acp-Connection-Id": connection_id}), 404)
    assert_bare(await post(http, url, rpc(1, "x/late"), connection_id), 404)
    assert_bare(await get(http, url, stream_headers(connection_id)), 404)
    assert_bare(await get(http, url, stream_headers(connection_id, "s")), 404)
    assert (await http.head(url, headers=stream_headers(connection_id))).status_code == 404


async def test_delete_ends_open_streams(http: httpx.AsyncClient, url: str) -> None:
    connection_id = await initialize(http, url)
    async with open_sse(http, url, connection_id) as stream, open_sse(http, url, connection_id, "s-d") as session:
        await marker(http, url, connection_id, session, "s-d")
        await marker(http, url, connection_id, stream)
        assert_bare(await http.delete(url, headers={"Acp-Connection-Id": connection_id}), 202)
        await stream.wait_ended(T)
        await session.wait_ended(T)
        assert stream.pending() == session.pending() == []
        assert stream.error is None and session.error is None  # a clean end of the body
    assert_bare(await post(http, url, rpc(1, "x/late"), connection_id), 404)


async def test_agent_exit_drains_every_stream_then_ends_them(http: httpx.AsyncClient, url: str) -> None:
    """Checklist 35, 37, 38: the exit reply and the final frame still arrive, then the streams end
    and the connection id is unknown."""
    connection_id = await initialize(http, url)
    final = notification("test/final", {"last": True})
    async with open_sse(http, url, connection_id) as stream, open_sse(http, url, connection_id, "s-x") as session:
        await accepted(http, url, rpc("b", "test/burst", {"count": 20, "sessionId": "s-x"}), connection_id)
        await accepted(http, url, rpc("x", "test/exit", {"final": final}), connection_id)
        for n in range(20):
            assert await session.next(T) == notification("test/item", {"n": n, "sessionId": "s-x"})
        assert await session.next(T) == {"jsonrpc": "2.0", "id": "b", "result": {"ok": True}}
        assert await stream.next(T) == {"jsonrpc": "2.0", "id": "x", "result": {"ok": True}}
        assert await stream.next(T) == final
        await stream.wait_ended(T)
        await session.wait_ended(T)
        assert stream.pending() == session.pending() == []
        assert stream.error is None and session.error is None  # a clean end of the body
    assert_bare(await post(http, url, rpc(1, "x/late"), connection_id), 404)
    assert_bare(await get(http, url, stream_headers(connection_id)), 404)
    assert_bare(await http.delete(url, headers={"Acp-Connection-Id": connection_id}), 404)


async def test_agent_exit_final_frame_for_a_session_reaches_its_reader(http: httpx.AsyncClient, url: str) -> None:
    connection_id = await initialize(http, url)
    final = notification("test/final", {"sessionId": "s-f"})
    async with open_sse(http, url, connection_id) as stream, open_sse(http, url, connection_id, "s-f") as session:
        await accepted(http, url, rpc("x", "test/exit", {"final": final}), connection_id)
        assert await session.next(T) == final
        assert await stream.next(T) == {"jsonrpc": "2.0", "id": "x", "result": {"ok": True}}
        await session.wait_ended(T)
        await stream.wait_ended(T)
        assert stream.error is None and session.error is None


async def test_a_reader_that_leaves_does_not_break_the_connection(
    http: httpx.AsyncClient, url: str, connection_id: str
) -> None:
    """A reader closing mid-stream (client disconnect) frees the stream; nothing is lost after it."""
    async with open_sse(http, url, connection_id) as stream:
        await marker(http, url, connection_id, stream)
    await wait_released(http, url, connection_id)
    await accepted(http, url, rpc("while-away", "x/away"), connection_id)
    async with open_sse(http, url, connection_id) as stream:
        assert await stream.next(T) == echo("while-away", "x/away")
        await marker(http, url, connection_id, stream)
