"""Log levels that fit (acp_channels/_logs.py): refusals a client caused (401, 404, 409, 503 at the
connection cap, a foreign Origin, a disallowed Host) cost at most one log line each, at INFO;
the one WARNING a client can cause, a disallowed Host (Django's security signal), comes at most
once a minute and says how many came since. Before, a burst at the cap logged one ERROR line per
refused initialize, a disallowed Host a WARNING and an INFO line per request, and a WebSocket
refused at the cap nothing at all.

The log is another process's output, read by a thread: each test ends its burst with a request
whose line it can recognise (a foreign Origin naming the test) and waits for that line."""

from __future__ import annotations

import asyncio
import re
from collections import Counter

import httpx
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosedError

from tests import rawhttp
from tests.live import JSON, SSE, DaphneServer, initialize, open_sse, rpc, wait_for_line

TOKEN = "log-levels-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BURST = 20


def loud_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if re.search(r"\b(WARNING|ERROR|CRITICAL)\b", line) or "Traceback" in line]


async def lines_until_marker(server: DaphneServer, start: int, marker: str) -> list[str]:
    """Ask with a foreign Origin naming `marker` (refused, one INFO line), wait for its line and
    return the lines from `start` before it."""
    origin = f"http://{marker}.example"
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0)) as http:
        response = await http.post(server.url, headers={**JSON, "Origin": origin}, json=rpc(0, "initialize"))
    assert response.status_code == 403, response.text
    end = await wait_for_line(server, re.escape(origin))
    lines = server.log[start:]
    return [line for line in lines[: lines.index(end)] if line.strip()]


async def test_refusals_a_client_caused_are_info() -> None:
    server = DaphneServer(env={"ACP_MAX_CONNECTIONS": "1", "ACP_TOKEN": TOKEN}).start()
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(10.0), headers=AUTH) as http:
            connection_id = await initialize(http, server.url)
            statuses = set()
            for _ in range(BURST):  # a burst at the cap
                response = await http.post(server.url, headers=JSON, json=rpc(0, "initialize", {"protocolVersion": 1}))
                statuses.add(response.status_code)
            unauthenticated = await httpx.AsyncClient().post(server.url, headers=JSON, json=rpc(0, "initialize"))
            statuses.add(unauthenticated.status_code)
            unknown = await http.get(server.url, headers={**SSE, "Acp-Connection-Id": "no-such-connection"})
            statuses.add(unknown.status_code)
            async with open_sse(http, server.url, connection_id):
                taken = await http.get(server.url, headers={**SSE, "Acp-Connection-Id": connection_id})
                statuses.add(taken.status_code)
        lines = await lines_until_marker(server, 0, "refusals-are-info")
    finally:
        server.stop()
    assert statuses == {503, 401, 404, 409}
    logged = [line for line in lines if "Service Unavailable: /acp" in line]
    assert len(logged) == BURST and all(" INFO " in line for line in logged), logged[:3]
    assert loud_lines(lines) == []


async def test_websocket_refusals_at_the_cap_are_one_info_line_each() -> None:
    server = DaphneServer(env={"ACP_MAX_CONNECTIONS": "1"}).start()
    try:
        async with connect(server.ws_url, proxy=None):  # the one connection the worker takes
            # its audit line comes from another process: count from after it, not from now
            opened = await wait_for_line(server, "connection opened")
            start = server.log.index(opened) + 1
            codes = Counter[int | None]()
            for _ in range(BURST):
                try:
                    async with connect(server.ws_url, proxy=None) as refused:
                        await refused.recv()
                except ConnectionClosedError as closed:
                    codes[closed.rcvd.code if closed.rcvd else None] += 1
            lines = await lines_until_marker(server, start, "websocket-at-the-cap")
    finally:
        server.stop()
    assert codes == {1013: BURST}
    refusals = [line for line in lines if "refused a WebSocket" in line]
    assert len(refusals) == BURST and all(" INFO " in line for line in refusals), lines[:5]
    assert "too many ACP connections on this server" in refusals[0]
    assert len(lines) == BURST and loud_lines(lines) == [], lines[:5]


def websocket_upgrade(port: int, host: str, *headers: tuple[str, str]) -> rawhttp.RawResponse | rawhttp.Closed:
    upgrade = [("Upgrade", "websocket"), ("Connection", "Upgrade"), ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
               ("Sec-WebSocket-Version", "13"), *headers]  # fmt: skip
    return rawhttp.exchange(port, rawhttp.request_bytes("GET", "/acp", upgrade, host=host))


async def test_a_disallowed_host_and_a_foreign_origin_cost_one_line_each() -> None:
    """Over HTTP and WebSocket: one line per refused request; the disallowed Host's WARNING once
    (a minute's worth), its repeats at INFO."""
    server = DaphneServer(env={}).start()
    try:
        start = len(server.log)
        statuses = Counter[int]()
        async with httpx.AsyncClient(timeout=httpx.Timeout(10.0)) as http:
            for _ in range(BURST):
                response = await http.post(server.url, headers={**JSON, "Host": "elsewhere.example"}, json=rpc(0, "x"))
                statuses[response.status_code] += 1
                response = await http.post(server.url, headers={**JSON, "Origin": "http://a.example"}, json=rpc(0, "x"))
                statuses[response.status_code] += 1
        for _ in range(BURST):
            for answer in await asyncio.gather(
                asyncio.to_thread(websocket_upgrade, server.port, "elsewhere.example"),
                asyncio.to_thread(websocket_upgrade, server.port, "127.0.0.1", ("Origin", "http://a.example")),
            ):
                assert isinstance(answer, rawhttp.RawResponse), answer
                statuses[answer.status] += 1
        lines = await lines_until_marker(server, start, "host-and-origin")
    finally:
        server.stop()
    assert statuses == {400: BURST, 403: 3 * BURST}  # daphne refuses every upgrade before accept with 403
    assert len(lines) <= 4 * BURST, f"{len(lines)} lines for {4 * BURST} refusals: {lines[:6]}"
    warnings = loud_lines(lines)
    assert len(warnings) == 1 and "Invalid HTTP_HOST header: 'elsewhere.example'" in warnings[0], warnings[:5]
    hosts = [line for line in lines if "elsewhere.example" in line]
    assert len(hosts) == 2 * BURST and all(" INFO " in line for line in hosts if line != warnings[0]), hosts[:5]
