"""The host's bounds, in process (no server): output budgets per connection and per worker,
batches counted until written, session streams collected and capped, requests in flight capped.

The live counterparts are in test_caps_live.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from acp_channels import _protocol as protocol
from acp_channels._host import (
    TAKE_BYTES,
    ConnectionHost,
    Mailbox,
    OutboundBudget,
    ServerFull,
    TooManyRequests,
    TooManyStreams,
    TransportKind,
    WorkerBudget,
    registry,
)
from acp_channels._protocol import Single
from acp_channels._worker import new_connection_id
from tests.caps_agent import CapsAgent
from tests.live import notification, rpc

TIMEOUT = 5.0
KiB = 1024


@pytest.fixture(autouse=True)
def caps_settings(settings: Any) -> dict[str, Any]:
    # DETACHED_SECONDS 0: a connection nobody reads pauses its agent at a full budget (with it, a
    # detached connection drops its oldest unread output instead: tests/test_detached.py).
    settings.ACP_CHANNELS = {
        "AGENT": "tests.caps_agent.create",
        "MAX_SESSION_STREAMS": 64,
        "MAX_PENDING_REQUESTS": 3,
        "DETACHED_SECONDS": 0,
    }
    return SettingsDict(settings)


class SettingsDict(dict[str, Any]):
    """ACP_CHANNELS whose every change is assigned as a new dict (so `setting_changed` says so:
    acp_settings keeps what it read until then)."""

    def __init__(self, settings: Any) -> None:
        super().__init__(settings.ACP_CHANNELS)
        self._settings = settings

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        self._settings.ACP_CHANNELS = dict(self)


@pytest.fixture
async def hosts() -> AsyncIterator[Callable[..., ConnectionHost]]:
    """Makes registered, started hosts with a caps agent; all terminated after the test, which
    must leave the worker budget where it found it."""
    made: list[ConnectionHost] = []
    worker_before = registry.budget.used
    requests_before = registry.budget.requests_used

    def make(transport: TransportKind = "http", budget: int = 1024 * KiB) -> ConnectionHost:
        host = registry.create(
            lambda _: CapsAgent(), transport, connection_id=new_connection_id(), max_buffered_bytes=budget
        )
        host.start()
        made.append(host)
        return host

    yield make
    for host in made:
        await host.terminate()
    assert registry.budget.used == worker_before
    assert registry.budget.requests_used == requests_before


def plan(message: dict[str, Any], session: str | None = None) -> protocol.InboundPlan:
    return protocol.plan_inbound(protocol.parse_frame(json.dumps(message)), session)


async def next_item(host: ConnectionHost, key: str | None = None) -> Any:
    """The next item of a stream, read with a lease that is released at once."""
    lease = host.lease(key)
    try:
        items = await lease.take(TIMEOUT)
        assert items, f"nothing on stream {key!r}"
        return json.loads(items[0])
    finally:
        lease.release()


def agent_received(host: ConnectionHost) -> list[Any]:
    """Every frame the host's agent got so far."""
    agent = host.agent
    assert isinstance(agent, CapsAgent)
    return [json.loads(frame) for frame in agent._received]


# -- a batch a reader took counts until it is written ---------------------------------------------


async def test_a_taken_batch_counts_until_the_reader_comes_back() -> None:
    budget = OutboundBudget(1024 * KiB)
    mailbox = Mailbox(budget)
    for text in ("a" * 100, "b" * 200):
        mailbox.push(text)
    token = mailbox.acquire()
    assert await mailbox.take(0) == ["a" * 100, "b" * 200]
    assert budget.used == 300  # handed to the server, not yet written
    mailbox.push("c" * 50)
    assert await mailbox.take(0) == ["c" * 50]  # coming back: the first batch is written
    assert budget.used == 50
    mailbox.release(token)  # the reader is gone: its last batch is written or never will be
    assert budget.used == 0


async def test_each_take_is_bounded() -> None:
    budget = OutboundBudget(4096 * KiB)
    mailbox = Mailbox(budget)
    item = "x" * (100 * KiB)
    for _ in range(10):
        mailbox.push(item)
    mailbox.push("y" * (2 * TAKE_BYTES))
    token = mailbox.acquire()
    sizes = []
    while len(mailbox):
        batch = await mailbox.take(0)
        assert batch
        sizes.append(sum(map(len, batch)))
    assert sizes == [200 * KiB] * 5 + [2 * TAKE_BYTES]  # one item larger than a batch goes alone
    mailbox.release(token)
    assert budget.used == 0


async def test_requeued_items_stay_counted_once() -> None:
    budget = OutboundBudget(1024 * KiB)
    mailbox = Mailbox(budget)
    mailbox.push("a" * 10)
    mailbox.push("b" * 20)
    token = mailbox.acquire()
    batch = await mailbox.take(0, max_bytes=10)
    assert batch == ["a" * 10]
    mailbox.requeue(batch)  # a remote reader never confirmed it
    assert budget.used == 30
    mailbox.release(token)
    assert budget.used == 30  # still queued for the next reader
    token = mailbox.acquire()
    assert await mailbox.take(0) == ["a" * 10, "b" * 20]
    mailbox.release(token)
    assert budget.used == 0


async def test_a_closed_stream_nobody_reads_is_dropped_and_uncounted() -> None:
    budget = OutboundBudget(1024 * KiB)
    unread, read = Mailbox(budget), Mailbox(budget)
    unread.push("u" * 10)
    read.push("r" * 20)
    token = read.acquire()
    unread.close()
    read.close()
    unread.push("late")
    assert budget.used == 20  # the reader still drains what is queued
    assert await read.take(0) == ["r" * 20]
    assert await read.take(0) is None
    read.release(token)
    assert budget.used == 0


# -- the worker's budget ---------------------------------------------------------------------------


async def test_worker_budget_sums_connections_and_wakes_a_waiting_router() -> None:
    worker = WorkerBudget(lambda: 100)
    quiet, busy = OutboundBudget(80, worker), OutboundBudget(80, worker)
    busy.add(70)
    quiet.add(30)
    assert worker.used == 100 and worker.full()
    assert not quiet.has_room()  # its own budget has room, the worker's has not
    waiting = asyncio.create_task(quiet.wait_for_room())
    await asyncio.sleep(0)  # let it start waiting
    assert not waiting.done()
    busy.release(10)  # another connection's reader frees bytes: the waiting router is woken
    await asyncio.wait_for(waiting, TIMEOUT)


async def test_a_router_waiting_on_its_own_budget_then_on_the_worker_is_woken_by_each() -> None:
    worker = WorkerBudget(lambda: 100)
    mine, other = OutboundBudget(50, worker), OutboundBudget(100, worker)
    mine.add(50)
    waiting = asyncio.create_task(mine.wait_for_room())
    await asyncio.sleep(0)
    other.add(60)  # now both are full
    mine.release(20)  # its own budget has room, the worker (90) has room: proceeds
    await asyncio.wait_for(waiting, TIMEOUT)
    other.add(20)  # worker 110: full again
    waiting = asyncio.create_task(mine.wait_for_room())
    await asyncio.sleep(0)
    assert not waiting.done()
    other.release(20)
    await asyncio.wait_for(waiting, TIMEOUT)


async def test_a_full_worker_pauses_every_router_and_refuses_new_connections(
    hosts: Callable[..., ConnectionHost], caps_settings: dict[str, Any]
) -> None:
    caps_settings["MAX_WORKER_BUFFERED_BYTES"] = registry.budget.used + 64 * KiB
    filler = hosts(budget=1024 * KiB)
    other = hosts(budget=1024 * KiB)
    # ~2000 x 70 bytes for a session nobody reads: over the worker's 64 KiB, under the connection's.
    await filler.submit(plan(rpc(1, "test/burst", {"count": 2000, "sessionId": "s"})))
    await until(lambda: registry.budget.full())
    assert filler.buffered_bytes < 1024 * KiB
    with pytest.raises(ServerFull) as refused:
        hosts()
    assert refused.value.reason == "budget"
    # The other connection's router waits too: its reply is not routed while the worker is full.
    await other.submit(plan(rpc(2, "custom/ping")))
    lease = other.lease(None)
    assert await lease.take(0.2) == []
    # A reader frees the worker: everything arrives, in order, nothing dropped.
    reader = filler.lease("s")
    numbers: list[int] = []
    while len(numbers) < 2000:
        items = await reader.take(TIMEOUT)
        assert items
        numbers += [json.loads(item)["params"]["n"] for item in items if "method" in json.loads(item)]
    assert numbers == list(range(2000))
    reply = await lease.take(TIMEOUT)
    assert reply and json.loads(reply[0])["id"] == 2
    reader.release()
    lease.release()


async def test_connection_cap_refuses_at_max_connections(
    hosts: Callable[..., ConnectionHost], caps_settings: dict[str, Any]
) -> None:
    hosts()
    caps_settings["MAX_CONNECTIONS"] = len(registry)
    with pytest.raises(ServerFull) as refused:
        hosts()
    assert refused.value.reason == "connections"


async def test_ended_connections_give_back_their_whole_budget(hosts: Callable[..., ConnectionHost]) -> None:
    worker_before = registry.budget.used
    unread, drained = hosts(), hosts()
    await unread.submit(plan(rpc(1, "test/burst", {"count": 100, "sessionId": "s"})))
    await drained.submit(plan(rpc(1, "test/burst", {"count": 100})))
    await until(lambda: unread.buffered_bytes > 0 and drained.buffered_bytes > 0)
    reader = drained.lease(None)
    await unread.terminate()  # nobody reads its streams: dropped at once
    await drained.terminate()  # the reader drains what is queued, then ends
    assert unread.buffered_bytes == 0
    while await reader.take(TIMEOUT) is not None:
        pass
    reader.release()
    assert drained.buffered_bytes == 0
    assert registry.budget.used == worker_before


async def test_a_socket_whose_writer_was_cancelled_gives_back_its_budget(hosts: Callable[..., ConnectionHost]) -> None:
    worker_before = registry.budget.used
    host = hosts("websocket")
    stalled = asyncio.Event()

    async def writer() -> None:  # takes one batch, then its send never returns (a stalled client)
        await host.socket_outbox.take(None)
        stalled.set()
        await asyncio.Event().wait()

    await host.submit(protocol.InboundPlan(Single(rpc(1, "test/burst", {"count": 100})), [], []))
    await until(lambda: host.buffered_bytes > 0)
    task = asyncio.create_task(writer())
    await stalled.wait()
    assert registry.budget.used > worker_before
    task.cancel()  # the consumer's disconnect
    await host.terminate()
    await asyncio.gather(task, return_exceptions=True)
    assert host.buffered_bytes == 0
    assert registry.budget.used == worker_before


async def test_an_idle_connection_holding_output_is_reaped_and_gives_back_its_budget(
    hosts: Callable[..., ConnectionHost], caps_settings: dict[str, Any]
) -> None:
    caps_settings["IDLE_TIMEOUT_SECONDS"] = 0.2
    registry._reaper = None  # a fresh reaper with the short timeout
    worker_before = registry.budget.used
    host = hosts(budget=8 * KiB)
    # The client vanished while its agent keeps streaming: the mailbox fills, nobody reads.
    await host.submit(plan(rpc(1, "test/burst", {"count": 1000, "sessionId": "s"})))
    await until(lambda: host.buffered_bytes >= 8 * KiB)
    await asyncio.wait_for(host.ended.wait(), TIMEOUT)
    assert registry.get(host.connection_id) is None
    assert registry.budget.used == worker_before


async def test_an_agent_that_fails_to_close_does_not_stop_the_reaper(
    hosts: Callable[..., ConnectionHost], caps_settings: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    caps_settings["IDLE_TIMEOUT_SECONDS"] = 0.2
    registry._reaper = None  # a fresh reaper with the short timeout
    failing, other = hosts(), hosts()

    async def close_fails() -> None:
        raise RuntimeError("the agent failed while closing")

    original_close = failing.agent.close
    failing.agent.close = close_fails  # type: ignore[method-assign]
    try:
        await asyncio.wait_for(other.ended.wait(), TIMEOUT)  # reaped after the failing one
    finally:
        failing.agent.close = original_close  # type: ignore[method-assign]
    assert failing.ended.is_set()
    assert "the agent failed while closing" in caplog.text


# -- session streams --------------------------------------------------------------------------------


async def test_made_up_session_streams_leave_nothing_behind(hosts: Callable[..., ConnectionHost]) -> None:
    host = hosts()
    for n in range(5000):
        lease = host.lease(f"made-up-{n}")  # a GET, or a HEAD, that then goes away
        lease.release()
    assert host.session_streams == 0
    held = [host.lease(f"again-{n}") for n in range(64)]  # the cap is free again
    assert host.session_streams == 64
    for lease in held:
        lease.release()
    assert host.session_streams == 0


async def test_the_session_stream_past_the_cap_is_refused(hosts: Callable[..., ConnectionHost]) -> None:
    host = hosts()
    held = [host.lease(f"s-{n}") for n in range(64)]
    with pytest.raises(TooManyStreams) as refused:
        host.lease("s-64")
    assert refused.value.limit == 64
    assert host.session_streams == 64
    connection = host.lease(None)  # the connection stream is not a session stream
    held[0].release()
    host.lease("s-64").release()  # room again
    for lease in [connection, *held[1:]]:
        lease.release()
    assert host.session_streams == 0


async def test_agent_output_for_new_sessions_is_never_dropped_past_the_cap(
    hosts: Callable[..., ConnectionHost],
) -> None:
    host = hosts()
    frames = [json.dumps(notification("x/update", {"sessionId": f"agent-{n}"})) for n in range(100)]
    await host.submit(plan(rpc(1, "test/emit", {"frames": frames})))
    assert (await next_item(host))["id"] == 1
    assert host.session_streams == 100  # the agent's own sessions may exceed the cap
    with pytest.raises(TooManyStreams):
        host.lease("made-up")  # a new one a client makes up may not
    for n in range(100):  # every existing stream can be read
        assert (await next_item(host, f"agent-{n}"))["params"]["sessionId"] == f"agent-{n}"
    # Read streams stay for a reader that resumes (their replay window); at the cap a new one
    # takes the place of the least recently read.
    assert host.session_streams == 100
    made_up = host.lease("made-up")
    assert host.session_streams == 100
    assert "agent-0" not in host._streams and "made-up" in host._streams
    made_up.release()  # empty and never read: it goes
    assert host.session_streams == 99


async def test_a_post_naming_a_session_keeps_its_stream_until_the_reply(hosts: Callable[..., ConnectionHost]) -> None:
    host = hosts()
    await host.submit(plan(rpc(1, "caps/hold"), session="s-held"))
    await host.submit(plan(notification("x/note"), session="s-note"))  # no reply will come
    assert host.session_streams == 1  # s-held waits for its reply; s-note was not kept
    for n in range(63):
        host.lease(f"other-{n}")
    with pytest.raises(TooManyStreams):
        host.lease("one-more")
    await host.submit(plan(rpc(2, "caps/answer_held")))
    assert await next_item(host, "s-held") == {"jsonrpc": "2.0", "id": 1, "result": {"held": True}}


async def test_a_batch_reply_elsewhere_unpins_its_session_streams(hosts: Callable[..., ConnectionHost]) -> None:
    host = hosts()
    batch = [rpc(1, "x/a", {"sessionId": "s-a"}), rpc(2, "x/b", {"sessionId": "s-b"})]
    await host.submit(plan(batch))
    reply = await next_item(host)  # a batch over two sessions goes to the connection stream
    assert [entry["id"] for entry in reply] == [1, 2]
    assert host.session_streams == 0


# -- requests in flight ------------------------------------------------------------------------------


async def test_http_requests_past_the_cap_are_refused_and_not_forwarded(
    hosts: Callable[..., ConnectionHost], caps_settings: dict[str, Any]
) -> None:
    host = hosts()
    for n in range(3):
        await host.submit(plan(rpc(n, "caps/hold")))
    assert host.pending_requests == 3
    with pytest.raises(TooManyRequests) as refused:
        await host.submit(plan(rpc("over", "caps/hold", {"sessionId": "s-over"})))
    assert refused.value.limit == 3
    await host.submit(plan(notification("x/note")))  # notifications are not requests in flight
    assert agent_received(host) == [*(rpc(n, "caps/hold") for n in range(3)), notification("x/note")]
    assert host.session_streams == 0
    caps_settings["MAX_PENDING_REQUESTS"] = 4  # read at use time: room for the request that answers
    await host.submit(plan(rpc("answer", "caps/answer_held")))
    lease = host.lease(None)
    ids = []
    while "answer" not in ids:
        items = await lease.take(TIMEOUT)
        assert items
        ids += [json.loads(item)["id"] for item in items]
    lease.release()
    assert host.pending_requests == 0  # every reply released its count


async def test_http_error_replies_release_their_count(hosts: Callable[..., ConnectionHost]) -> None:
    host = hosts()
    await host.submit(plan(rpc(1, "caps/hold")))
    cancelled = json.dumps(protocol.error_response(1, -32800, "cancelled"))  # what a cancelled request gets
    await host.submit(plan(rpc(2, "test/emit", {"frames": [cancelled]})))
    lease = host.lease(None)
    ids = set()
    while ids != {1, 2}:
        items = await lease.take(TIMEOUT)
        assert items
        ids |= {json.loads(item)["id"] for item in items}
    lease.release()
    assert host.pending_requests == 0


async def test_websocket_requests_past_the_cap_get_errors_and_are_not_forwarded(
    hosts: Callable[..., ConnectionHost],
) -> None:
    host = hosts("websocket")

    async def send(message: Any) -> None:
        await host.submit(protocol.InboundPlan(protocol.parse_frame(json.dumps(message)), [], []))

    for n in range(3):
        await send(rpc(n, "caps/hold"))
    assert host.pending_requests == 3
    await send(rpc("over", "caps/hold"))
    await send([rpc("b1", "caps/hold"), notification("x/in-batch")])
    await send(notification("x/alone"))  # a notification is never refused
    error = {"code": -32000, "message": "too many requests in flight", "data": {"limit": 3}}
    await send(rpc("answer", "caps/answer_held"))  # over the cap too: answered with an error
    assert [json.loads(item) for item in await host.socket_outbox.take(TIMEOUT) or []] == [
        {"jsonrpc": "2.0", "id": "over", "error": error},
        [{"jsonrpc": "2.0", "id": "b1", "error": error}],  # a batch gets a batch
        {"jsonrpc": "2.0", "id": "answer", "error": error},
    ]
    assert host.pending_requests == 3
    assert agent_received(host) == [
        *(rpc(n, "caps/hold") for n in range(3)),
        notification("x/alone"),
    ]


async def test_http_requests_holding_more_than_a_body_are_refused_until_answered(
    hosts: Callable[..., ConnectionHost], caps_settings: dict[str, Any]
) -> None:
    """The bytes of requests waiting for the agent are bounded too (before, MAX_PENDING_REQUESTS
    requests of MAX_BODY_BYTES each could wait: 1,000 x 16 MiB on one connection)."""
    caps_settings["MAX_BODY_BYTES"] = 64 * KiB
    host = hosts()
    await host.submit(plan(rpc(1, "caps/hold", {"pad": "x" * 40 * KiB})))
    assert 40 * KiB < host.pending_request_bytes < 41 * KiB
    assert registry.budget.requests_used >= host.pending_request_bytes
    with pytest.raises(TooManyRequests) as refused:
        await host.submit(plan(rpc(2, "caps/hold", {"pad": "x" * 30 * KiB})))
    assert (refused.value.limit, refused.value.unit) == (64 * KiB, "bytes")
    await host.submit(plan(rpc(3, "caps/hold", {"pad": "x" * 10 * KiB})))  # still fits
    await host.submit(plan(notification("x/note", {"pad": "x" * 60 * KiB})))  # notifications wait for nothing
    assert agent_received(host)[-1]["method"] == "x/note"
    await host.submit(plan(rpc("answer", "caps/answer_held")))
    lease = host.lease(None)
    ids: list[Any] = []
    while "answer" not in ids:
        items = await lease.take(TIMEOUT)
        assert items
        ids += [json.loads(item)["id"] for item in items]
    lease.release()
    assert host.pending_request_bytes == 0  # every reply gave its bytes back
    await host.submit(plan(rpc(4, "caps/hold", {"pad": "x" * 60 * KiB})))


async def test_the_worker_bounds_the_request_bytes_of_every_connection(
    hosts: Callable[..., ConnectionHost], caps_settings: dict[str, Any]
) -> None:
    caps_settings["MAX_WORKER_BUFFERED_BYTES"] = registry.budget.requests_used + 100 * KiB
    first, second = hosts(), hosts()
    await first.submit(plan(rpc(1, "caps/hold", {"pad": "x" * 80 * KiB})))
    with pytest.raises(TooManyRequests) as refused:
        await second.submit(plan(rpc(1, "caps/hold", {"pad": "x" * 30 * KiB})))
    assert refused.value.unit == "bytes"
    await first.terminate()  # an ended connection gives its bytes back
    await second.submit(plan(rpc(1, "caps/hold", {"pad": "x" * 30 * KiB})))


async def test_websocket_requests_holding_more_than_a_body_get_errors(
    hosts: Callable[..., ConnectionHost], caps_settings: dict[str, Any]
) -> None:
    caps_settings["MAX_BODY_BYTES"] = 64 * KiB
    host = hosts("websocket")

    async def send(message: Any) -> None:
        await host.submit(protocol.InboundPlan(protocol.parse_frame(json.dumps(message)), [], []))

    await send(rpc(1, "caps/hold", {"pad": "x" * 40 * KiB}))
    await send(rpc(2, "caps/hold", {"pad": "x" * 30 * KiB}))
    error = {
        "code": -32000,
        "message": "the requests in flight hold too many bytes",
        "data": {"limit": 64 * KiB, "unit": "bytes"},
    }
    assert [json.loads(item) for item in await host.socket_outbox.take(TIMEOUT) or []] == [
        {"jsonrpc": "2.0", "id": 2, "error": error}
    ]
    assert [message["id"] for message in agent_received(host)] == [1]


async def test_websocket_replies_release_their_count(hosts: Callable[..., ConnectionHost]) -> None:
    host = hosts("websocket")

    async def send(message: Any) -> None:
        await host.submit(protocol.InboundPlan(protocol.parse_frame(json.dumps(message)), [], []))

    await send(rpc(1, "caps/hold"))
    await send(rpc(1, "caps/hold"))  # a duplicate id counts twice
    await send(rpc(2, "caps/answer_held"))
    seen = []
    while len(seen) < 3:
        items = await host.socket_outbox.take(TIMEOUT)
        assert items
        seen += items
    assert host.pending_requests == 0


async def test_an_agent_that_dies_leaves_no_count(hosts: Callable[..., ConnectionHost]) -> None:
    host = hosts("websocket")
    for n in range(2):
        await host.submit(protocol.InboundPlan(Single(rpc(n, "caps/hold")), [], []))
    await host.submit(protocol.InboundPlan(Single(notification("caps/die")), [], []))
    await asyncio.wait_for(host.ended.wait(), TIMEOUT)
    assert host.pending_requests == 0


async def until(condition: Callable[[], bool], timeout: float = TIMEOUT) -> None:
    """Wait for a condition of the host's state that no event announces (the router's progress)."""
    async with asyncio.timeout(timeout):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


# -- an SDK agent's frames reach the mailbox without the router while nothing is queued --------


async def stream_through_host(budget: int, chunks: int, size: int = 200) -> tuple[list[Any], int, int]:
    """The demo agent behind a host streams `chunks` chunks of `size` characters; returns what
    the session stream delivered before the prompt's reply (chunk indices in order, or the
    notices that replaced chunks), how many frames went through the router, and the most the
    connection's budget held at any take."""
    from acp_channels._agents.sdk import SdkAgentChannel
    from demo_project.agent import create_agent

    host = registry.create(
        lambda _: SdkAgentChannel(create_agent()),
        "http",
        connection_id=new_connection_id(),
        max_buffered_bytes=budget,
        max_message_bytes=budget,
    )
    routed = 0
    real_receive = host.agent.receive

    async def counted_receive() -> Any:
        nonlocal routed
        frame = await real_receive()
        routed += frame is not None
        return frame

    host.agent.receive = counted_receive  # type: ignore[method-assign]
    host.start()
    try:
        await host.submit(plan(rpc(0, "initialize", {"protocolVersion": 1})))
        assert (await next_item(host))["id"] == 0
        await host.submit(plan(rpc(1, "session/new", {"cwd": "/tmp", "mcpServers": []})))
        session = (await next_item(host))["result"]["sessionId"]
        await host.submit(
            plan(
                rpc(
                    2,
                    "session/prompt",
                    {"sessionId": session, "prompt": [{"type": "text", "text": f"stream {chunks} {size}"}]},
                ),
                session,
            )
        )
        delivered: list[Any] = []
        peak = 0
        lease = host.lease(session)
        try:
            while True:
                peak = max(peak, host.buffered_bytes)
                items = await lease.take(TIMEOUT)
                assert items, "the stream stalled"
                for item in map(json.loads, items):
                    if item.get("id") == 2:
                        assert item["result"]["stopReason"] == "end_turn", item
                        return delivered, routed, peak
                    if item["method"] == protocol.MESSAGE_TOO_LARGE_METHOD:
                        delivered.append(item["params"])
                    else:
                        delivered.append(int(item["params"]["update"]["content"]["text"].split(":")[0]))
        finally:
            lease.release()
    finally:
        await host.terminate()


async def test_with_room_an_sdk_agents_frames_skip_the_router_in_order() -> None:
    indices, routed, _ = await stream_through_host(4 * 1024 * KiB, 300)
    assert indices == list(range(300))
    assert routed < 10  # direct: the chunks never waited in the agent's outbox


async def test_without_room_the_agent_waits_and_nothing_queues_outside_the_budget() -> None:
    """A full budget pauses the agent as it hands a frame over; frames never pile up in its
    outbox uncounted (before: up to 64 frames of any size waited there for the router)."""
    indices, routed, peak = await stream_through_host(16 * KiB, 300)  # ~70 chunks fill the budget
    assert indices == list(range(300))
    assert routed < 10
    assert peak <= 16 * KiB + 1 * KiB  # the budget and the one frame being handed over


async def test_large_frames_count_from_the_hand_over() -> None:
    """Frames of 12 KiB against a 16 KiB budget: at most the budget plus one frame is held."""
    indices, _, peak = await stream_through_host(16 * KiB, 40, size=12 * KiB)
    assert indices == list(range(40))
    assert peak <= 16 * KiB + 13 * KiB


async def test_a_message_larger_than_the_budget_is_refused_with_a_notice_in_its_place() -> None:
    delivered, _, peak = await stream_through_host(16 * KiB, 3, size=20 * KiB)
    assert [notice["method"] for notice in delivered] == ["session/update"] * 3
    assert all(notice["limit"] == 16 * KiB and notice["size"] > 20 * KiB for notice in delivered)
    assert all(isinstance(notice["sessionId"], str) for notice in delivered)
    assert peak < 16 * KiB
