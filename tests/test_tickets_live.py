"""WebSocket tickets on a live server (daphne; one worker, and three workers sharing Redis, the
tickets in the Redis cache): issued by one worker and taken on another, taken once whichever
worker a replay reaches (three upgrades with one ticket at once, one per worker: one socket),
bound to the Origin it was issued for, and never in a log line.

The server: the demo with a shared bearer token (ACP_TOKEN) and tests.wire_agent, one listed
page origin (PAGE).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

from tests.cluster import Cluster
from tests.conftest import SHAPES, start_server
from tests.live import DaphneServer, rpc

TOKEN = "tickets-live-token_0123456789"
PAGE = "http://page.example"
ENV = {"ACP_AGENT": "tests.wire_agent.create", "ACP_TOKEN": TOKEN, "ACP_CORS_ALLOWED_ORIGINS": PAGE}
#: Every ticket the tests were given: none may reach the log.
ISSUED: list[str] = []


@pytest.fixture(scope="module", params=SHAPES)
def server(request: pytest.FixtureRequest) -> Iterator[DaphneServer | Cluster]:
    live = start_server(request.param, ENV, request)
    yield live
    live.stop()
    assert live.errors() == []
    log = "".join(live.log)
    assert TOKEN not in log, "the token reached the server log"
    assert ISSUED and not [ticket for ticket in ISSUED if ticket in log], "a ticket reached the server log"


def workers(server: DaphneServer | Cluster) -> list[DaphneServer]:
    """Each worker on its own (a Cluster's, or the one server three times)."""
    return list(server.workers) if isinstance(server, Cluster) else [server] * 3


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=20.0, limits=httpx.Limits(max_keepalive_connections=0)) as client:
        yield client


async def ticket(http: httpx.AsyncClient, worker: DaphneServer, origin: str | None = PAGE) -> str:
    headers = {"Authorization": f"Bearer {TOKEN}", **({"Origin": origin} if origin else {})}
    response = await http.post(worker.url + "/tickets", headers=headers)
    assert response.status_code == 200, response.text
    issued = str(response.json()["ticket"])
    ISSUED.append(issued)
    return issued


def upgrade(worker: DaphneServer, issued: str, origin: str | None = PAGE) -> connect:
    headers = {"Origin": origin} if origin else {}
    return connect(worker.ws_url, subprotocols=["acp", f"acp-ticket.{issued}"], additional_headers=headers, proxy=None)  # type: ignore[list-item]


async def echo(ws: ClientConnection) -> None:
    await ws.send(json.dumps(rpc(4, "test/echo", {})))
    assert json.loads(await asyncio.wait_for(ws.recv(), 10))["id"] == 4


async def refused(worker: DaphneServer, issued: str, origin: str | None = PAGE) -> int:
    with pytest.raises(InvalidStatus) as refusal:
        async with upgrade(worker, issued, origin):
            pass
    return refusal.value.response.status_code


async def test_issued_on_one_worker_taken_on_another_once(
    server: DaphneServer | Cluster, http: httpx.AsyncClient
) -> None:
    first, second, third = workers(server)
    issued = await ticket(http, first)
    async with upgrade(second, issued) as ws:
        assert ws.subprotocol == "acp"
        assert ws.response is not None and ws.response.headers["Sec-WebSocket-Protocol"] == "acp"
        await echo(ws)
    assert await refused(third, issued) == 403  # a replay, on the third worker
    assert await refused(second, issued) == 403  # and where it was taken


async def test_three_upgrades_with_one_ticket_at_once_get_one_socket(
    server: DaphneServer | Cluster, http: httpx.AsyncClient
) -> None:
    issued = await ticket(http, workers(server)[0])

    async def attempt(worker: DaphneServer) -> bool:
        try:
            async with upgrade(worker, issued) as ws:
                await echo(ws)
                return True
        except InvalidStatus as refusal:
            assert refusal.response.status_code == 403
            return False

    outcomes = await asyncio.gather(*(attempt(worker) for worker in workers(server)))
    assert sorted(outcomes) == [False, False, True]


async def test_a_ticket_is_refused_from_another_origin(server: DaphneServer | Cluster, http: httpx.AsyncClient) -> None:
    first, second, _ = workers(server)
    own_origin = second.url.removesuffix("/acp")  # allowed for the upgrade: the server's own
    assert await refused(second, await ticket(http, first), own_origin) == 403
    assert await refused(second, await ticket(http, first, origin=None), PAGE) == 403  # issued without an Origin
    assert await refused(second, await ticket(http, first), None) == 403  # offered without one
    async with upgrade(second, await ticket(http, first, origin=None), None) as ws:  # a client without Origin
        await echo(ws)


async def test_an_unknown_ticket_and_the_token_in_the_subprotocol_are_refused(server: DaphneServer | Cluster) -> None:
    worker = workers(server)[0]
    assert await refused(worker, "not-a-ticket-0123456789") == 403
    with pytest.raises(InvalidStatus) as refusal:  # off by default (ALLOW_BEARER_SUBPROTOCOL)
        async with connect(worker.ws_url, subprotocols=["acp", f"acp.bearer.{TOKEN}"], proxy=None):  # type: ignore[list-item]
            pass
    assert refusal.value.response.status_code == 403
