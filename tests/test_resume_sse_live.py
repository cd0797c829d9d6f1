"""Resumable SSE streams (docs/resumable-streams.md) on a live server, one worker and three
workers behind the balancer (each request a new TCP connection, so a resumed stream usually
lands on another worker than the one it was read from): event ids, Last-Event-ID replay,
taking over a reader the server still believes attached, 409 for ids it cannot resume from,
and the initialize result advertising it."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.cluster import Cluster
from tests.live import JSON, SSE, DaphneServer, SseReader, initialize, open_sse, rpc

pytestmark = pytest.mark.usefixtures("wire_log_stays_clean")


async def burst(http: httpx.AsyncClient, url: str, connection_id: str, count: int, session: str | None = None) -> None:
    params: dict[str, Any] = {"count": count}
    headers = {**JSON, "Acp-Connection-Id": connection_id}
    if session is not None:
        params["sessionId"] = session
        headers["Acp-Session-Id"] = session
    response = await http.post(url, headers=headers, json=rpc(1, "test/burst", params))
    assert response.status_code == 202, response.text


async def get_stream(
    http: httpx.AsyncClient, url: str, connection_id: str, last_event_id: str, session: str | None = None
) -> httpx.Response:
    headers = {**SSE, "Acp-Connection-Id": connection_id, "Last-Event-ID": last_event_id}
    if session is not None:
        headers["Acp-Session-Id"] = session
    response = await http.send(http.build_request("GET", url, headers=headers), stream=True)
    if response.status_code != 200:
        await response.aread()
    return response


def item_number(event: Any) -> int:
    assert event["method"] == "test/item", event
    number: int = event["params"]["n"]
    return number


async def test_events_carry_increasing_ids_per_stream(
    wire_server: DaphneServer | Cluster, http: httpx.AsyncClient
) -> None:
    url = wire_server.url
    connection_id = await initialize(http, url)
    async with open_sse(http, url, connection_id) as connection_stream, open_sse(http, url, connection_id, "s1") as s1:
        await burst(http, url, connection_id, 3)
        await burst(http, url, connection_id, 2, "s1")
        ids = []
        for _ in range(3):
            await connection_stream.next()
            ids.append(connection_stream.last_id)
        session_ids = []
        for _ in range(2):
            await s1.next()
            session_ids.append(s1.last_id)
    tags = {event_id.rpartition("-")[0] for event_id in ids}
    assert len(tags) == 1 and all(ids)
    assert [int(event_id.rpartition("-")[2]) for event_id in ids] == [1, 2, 3]
    assert {event_id.rpartition("-")[0] for event_id in session_ids} != tags  # another stream, another tag
    assert [int(event_id.rpartition("-")[2]) for event_id in session_ids] == [1, 2]


@pytest.mark.parametrize("session", [None, "s-resume"])
async def test_last_event_id_replays_what_came_after_it_exactly_once(
    wire_server: DaphneServer | Cluster, http: httpx.AsyncClient, session: str | None
) -> None:
    url = wire_server.url
    connection_id = await initialize(http, url)
    async with open_sse(http, url, connection_id, session) as first:
        await burst(http, url, connection_id, 300, session)
        seen = [item_number(await first.next()) for _ in range(120)]
        cut_at = first.last_id
    assert cut_at is not None
    # The client's TCP connection is gone; the rest (some of it sent to the old reader) comes again.
    response = await get_stream(http, url, connection_id, cut_at, session)
    assert response.status_code == 200, response.text
    second = SseReader(response)
    try:
        while True:
            event = await second.next()
            if "result" in event:  # the burst's reply comes last
                break
            seen.append(item_number(event))
    finally:
        await second.close()
    assert seen == list(range(300))


async def test_a_resuming_reader_takes_over_from_one_still_attached(
    wire_server: DaphneServer | Cluster, http: httpx.AsyncClient
) -> None:
    url = wire_server.url
    connection_id = await initialize(http, url)
    async with open_sse(http, url, connection_id) as stale:
        await burst(http, url, connection_id, 10)
        received = [item_number(await stale.next()) for _ in range(4)]
        last = stale.last_id
        assert last is not None
        # Without Last-Event-ID the stream is still taken.
        plain = await http.get(url, headers={**SSE, "Acp-Connection-Id": connection_id})
        assert plain.status_code == 409
        response = await get_stream(http, url, connection_id, last)
        assert response.status_code == 200, response.text
        resumed = SseReader(response)
        try:
            await stale.wait_ended()  # the old response ends
            while True:
                event = await resumed.next()
                if "result" in event:
                    break
                received.append(item_number(event))
        finally:
            await resumed.close()
    assert received == list(range(10))


async def test_an_id_older_than_the_window_is_refused_with_409(
    wire_server: DaphneServer | Cluster, http: httpx.AsyncClient
) -> None:
    """The default window keeps 16384 events: after 17000, the first id cannot be resumed from."""
    url = wire_server.url
    connection_id = await initialize(http, url)
    async with open_sse(http, url, connection_id) as reader:
        await burst(http, url, connection_id, 17000)
        await reader.next()
        first_id = reader.last_id
        while "result" not in await reader.next():
            pass
        newest = reader.last_id
    assert first_id is not None and newest is not None
    response = await get_stream(http, url, connection_id, first_id)
    assert response.status_code == 409
    assert response.text == (
        f"Last-Event-ID {first_id} is older than the replay window of this stream; events were lost"
    )
    response = await get_stream(http, url, connection_id, newest)  # nothing missed: resumes
    assert response.status_code == 200
    await response.aclose()


@pytest.mark.parametrize("bad", ["another-stream", "garbage", "future"])
async def test_an_id_of_another_stream_is_refused_with_409(
    wire_server: DaphneServer | Cluster, http: httpx.AsyncClient, bad: str
) -> None:
    url = wire_server.url
    connection_id = await initialize(http, url)
    async with open_sse(http, url, connection_id) as connection_stream, open_sse(http, url, connection_id, "s1") as s1:
        await burst(http, url, connection_id, 1, "s1")
        await s1.next()
        await burst(http, url, connection_id, 1)
        await connection_stream.next()
        own = connection_stream.last_id
        assert own is not None and s1.last_id is not None
    event_id = {
        "another-stream": s1.last_id,
        "garbage": "not an id",
        "future": f"{own.rpartition('-')[0]}-999",
    }[bad]
    response = await get_stream(http, url, connection_id, event_id)
    assert response.status_code == 409
    assert response.text == f"Last-Event-ID {event_id} does not belong to this stream"


async def test_initialize_advertises_resumption(wire_server: DaphneServer | Cluster, http: httpx.AsyncClient) -> None:
    response = await http.post(wire_server.url, headers=JSON, json=rpc(0, "initialize", {"protocolVersion": 1}))
    assert response.status_code == 200
    resume = response.json()["result"]["_meta"]["acp-channels/resume"]
    assert resume["sse"] is True
    assert (resume["windowEvents"], resume["windowBytes"]) == (16384, 2 * 1024 * 1024)
