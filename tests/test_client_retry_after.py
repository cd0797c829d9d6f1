"""HttpClient honours Retry-After: a 503 or 429 that carries it (the server did nothing: full,
draining, its worker too busy) is sent again after the delay, within the policy's cap and
deadline, and the caller is told; without the header, or with the policy off, it stays fatal.
Against the fake ACP server of tests/peers/fakes.py, a real local HTTP server."""

from __future__ import annotations

import asyncio
import datetime
import email.utils
from typing import Any

import pytest

from acp_channels.client import HttpClient, HttpStatusError, RetryAfter, RetryEvent
from acp_channels.client._retry import retry_after_seconds
from tests.peers.fakes import CONNECTION_ID, Answer, FakeAcp, Reply, Request, Stream
from tests.test_client_fake import INIT, result, rpc

pytestmark = pytest.mark.timeout(30)


class Refusals:
    """Answers the first `count` requests it sees with `status` + Retry-After, noting when each
    request arrived (loop time), then lets `then` answer."""

    def __init__(self, count: int, status: int = 503, retry_after: str = "1") -> None:
        self.left = count
        self.status = status
        self.retry_after = retry_after
        self.arrivals: list[float] = []

    def refuse(self) -> Reply | None:
        self.arrivals.append(asyncio.get_running_loop().time())
        if self.left <= 0:
            return None
        self.left -= 1
        return Reply(self.status, "busy; try again", {"retry-after": self.retry_after})


async def within(awaitable: Any, seconds: float = 10.0) -> Any:
    async with asyncio.timeout(seconds):
        return await awaitable


async def test_initialize_refused_with_retry_after_is_sent_again_after_the_delay(fake: FakeAcp) -> None:
    refusals = Refusals(1, retry_after="1")

    async def on_initialize(request: Request) -> Answer:
        refused = refusals.refuse()
        if refused is not None:
            return refused
        return Reply(200, result(request.json()["id"], {"protocolVersion": 1}), {"acp-connection-id": CONNECTION_ID})

    fake.on_initialize = on_initialize
    events: list[RetryEvent] = []
    client = HttpClient(fake.url, timeout=5, on_retry=events.append)
    await within(client.send(INIT))
    assert (await within(client.receive()))["result"] == {"protocolVersion": 1}
    assert client.connection_id == CONNECTION_ID
    assert len(refusals.arrivals) == 2
    assert refusals.arrivals[1] - refusals.arrivals[0] >= 0.9  # it waited the delay the server gave
    assert [(e.what, e.status, e.delay, e.attempt) for e in events] == [("initialize", 503, 1.0, 1)]
    assert "busy; try again" in str(events[0])
    assert not fake.of("DELETE")  # the refusal was not the end
    await client.close()


async def test_post_refused_is_delivered_once_and_later_posts_keep_their_order(fake: FakeAcp) -> None:
    refusals = Refusals(2, status=429, retry_after="0")
    accepted: list[Any] = []

    async def on_post(request: Request) -> Answer:
        if request.json().get("id") == 1 and (refused := refusals.refuse()) is not None:
            return refused
        accepted.append(request.json()["id"])
        return Reply(202)

    client = await started(fake)
    fake.on_post = on_post
    events: list[RetryEvent] = []
    client.transport._on_retry = events.append
    first = asyncio.create_task(client.send(rpc(1, "x/first")))
    await asyncio.sleep(0)
    await within(client.send(rpc(2, "x/second")))  # queued behind the retried one
    await within(first)
    assert accepted == [1, 2]
    assert [(e.what, e.status, e.attempt) for e in events] == [("POST x/first", 429, 1), ("POST x/first", 429, 2)]
    assert client.error is None
    await client.close()


async def test_stream_open_refused_with_retry_after_is_opened_again(fake: FakeAcp) -> None:
    refusals = Refusals(1, retry_after="0")

    async def on_get(request: Request) -> Answer:
        if request.session_id == "s1" and (refused := refusals.refuse()) is not None:
            return refused
        return Stream(fake.feed(request.session_id))

    fake.on_get = on_get
    client = await started(fake)
    await within(client.send(rpc(1, "session/prompt", {"sessionId": "s1", "prompt": []})))
    assert len(fake.of("GET", session_id="s1")) == 2
    fake.push("s1", {"jsonrpc": "2.0", "method": "x/update", "params": {"sessionId": "s1"}})
    assert (await within(client.receive()))["method"] == "x/update"
    assert client.error is None
    await client.close()


async def test_a_long_retry_after_is_capped(fake: FakeAcp) -> None:
    refusals = Refusals(1, retry_after="3600")

    async def on_post(request: Request) -> Answer:
        return refusals.refuse() or Reply(202)

    client = await started(fake, retry_after=RetryAfter(max_delay=0.2))
    fake.on_post = on_post
    events: list[RetryEvent] = []
    client.transport._on_retry = events.append
    await within(client.send(rpc(1, "x/ping")))
    assert [e.delay for e in events] == [0.2]
    await client.close()


async def test_past_the_deadline_the_refusal_is_fatal(fake: FakeAcp) -> None:
    refusals = Refusals(100, retry_after="0")

    async def on_post(request: Request) -> Answer:
        refused = refusals.refuse()
        assert refused is not None
        await asyncio.sleep(0.05)  # each refusal takes a while: the deadline comes
        return refused

    client = await started(fake, retry_after=RetryAfter(deadline=0.3))
    fake.on_post = on_post
    with pytest.raises(HttpStatusError) as failure:
        await within(client.send(rpc(1, "x/ping")))
    assert failure.value.status_code == 503
    assert 2 <= len(refusals.arrivals) < 100
    await within(fake.wait_for(lambda: bool(fake.of("DELETE"))))
    await client.close()


async def test_retry_after_off_makes_the_refusal_fatal_at_once(fake: FakeAcp) -> None:
    refusals = Refusals(1, retry_after="0")

    async def on_post(request: Request) -> Answer:
        return refusals.refuse() or Reply(202)

    client = await started(fake, retry_after=None)
    fake.on_post = on_post
    with pytest.raises(HttpStatusError) as failure:
        await within(client.send(rpc(1, "x/ping")))
    assert failure.value.status_code == 503 and len(refusals.arrivals) == 1
    await client.close()


@pytest.mark.parametrize("status", [500, 404])
async def test_other_statuses_are_not_retried_even_with_retry_after(fake: FakeAcp, status: int) -> None:
    async def on_post(request: Request) -> Answer:
        return Reply(status, "no", {"retry-after": "0"})

    client = await started(fake)
    fake.on_post = on_post
    with pytest.raises(HttpStatusError) as failure:
        await within(client.send(rpc(1, "x/ping")))
    assert failure.value.status_code == status and len(fake.of("POST", rpc_method="x/ping")) == 1
    await client.close()


def test_retry_after_values() -> None:
    assert retry_after_seconds(503, {"retry-after": "7"}) == 7.0
    assert retry_after_seconds(429, {"retry-after": " 0 "}) == 0.0
    assert retry_after_seconds(503, {}) is None
    assert retry_after_seconds(500, {"retry-after": "1"}) is None
    assert retry_after_seconds(503, {"retry-after": "soon"}) is None
    assert retry_after_seconds(503, {"retry-after": "-3"}) is None
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=30)
    seconds = retry_after_seconds(503, {"retry-after": email.utils.format_datetime(later, usegmt=True)})
    assert seconds is not None and 25 < seconds <= 30
    past = email.utils.format_datetime(datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC), usegmt=True)
    assert retry_after_seconds(503, {"retry-after": past}) == 0.0
    with pytest.raises(ValueError):
        RetryAfter(max_delay=-1)


async def started(fake: FakeAcp, **options: Any) -> HttpClient:
    client = HttpClient(fake.url, timeout=5.0, **options)
    await within(client.send(INIT))
    assert (await within(client.receive()))["result"] == {"protocolVersion": 1}
    return client
