"""The Redis Streams channel layer (acp_channels._streams_layer) against a real Redis: the
behaviours channels-redis's own test suite checks for its layer (send and receive, capacity,
process-specific channels, groups, expiry, cancelled receives, several event loops), and what
ours adds: each message to one receiver across processes, and no drop without a log line.
Each test has a key prefix of its own (nothing shared between xdist workers)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.exceptions import ChannelFull

from acp_channels._streams_layer import DELETE_EVERY, StreamsChannelLayer
from tests.cluster import RedisServer

#: Long enough for a message that should come, short enough for one that should not.
NOT_COMING = 0.5


@pytest.fixture
def prefix() -> str:
    return f"acp-test-{secrets.token_hex(6)}"


@pytest.fixture
def make_layer(redis_server: RedisServer, prefix: str) -> Iterator[Any]:
    """Layers of one test (as several processes would have), sharing its prefix."""
    made: list[StreamsChannelLayer] = []

    def make(**options: Any) -> StreamsChannelLayer:
        layer = StreamsChannelLayer(hosts=[redis_server.url], prefix=prefix, **options)
        made.append(layer)
        return layer

    yield make
    if made:
        async_to_sync(flush_and_close)(made[0])


async def flush_and_close(layer: StreamsChannelLayer) -> None:
    await layer.flush()
    await layer.close_pools()


@pytest.fixture
async def layer(make_layer: Any) -> AsyncIterator[StreamsChannelLayer]:
    made: StreamsChannelLayer = make_layer(capacity=3, channel_capacity={"tiny": 1})
    yield made
    await made.close_pools()


async def nothing_comes(layer: StreamsChannelLayer, channel: str) -> None:
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(layer.receive(channel), NOT_COMING)


async def test_send_receive(layer: StreamsChannelLayer) -> None:
    await layer.send("test-channel-1", {"type": "test.message", "text": "Ahoy-hoy!"})
    message = await layer.receive("test-channel-1")
    assert message == {"type": "test.message", "text": "Ahoy-hoy!"}


@pytest.mark.parametrize("protocol", [2, 3])
async def test_process_specific_messages_arrive_in_order_over_either_protocol(
    redis_server: RedisServer, prefix: str, protocol: int
) -> None:
    """The own stream's replies are read as Redis sends them (RESP2 lists or RESP3 maps), by a
    plain read and by the read that deletes what came before (every DELETE_EVERY entries)."""
    layer = StreamsChannelLayer(hosts=[{"address": redis_server.url, "protocol": protocol}], prefix=prefix)
    channels = [await layer.new_channel() for _ in range(2)]
    count = 3 * DELETE_EVERY
    for number in range(count):
        await layer.send(channels[number % 2], {"type": "m", "n": number})
    got = [(await layer.receive(channels[number % 2]))["n"] for number in range(count)]
    assert got == list(range(count))
    await flush_and_close(layer)


async def test_bytes_and_nested_values_come_back_as_sent(layer: StreamsChannelLayer) -> None:
    sent = {"type": "websocket.receive", "bytes": b"\x00\xff", "nested": {"list": [1, 2.5, None, True]}}
    await layer.send("test-channel", sent)
    assert await layer.receive("test-channel") == sent


async def test_send_capacity(layer: StreamsChannelLayer) -> None:
    for _ in range(3):
        await layer.send("test-channel-1", {"type": "test.message"})
    with pytest.raises(ChannelFull):
        await layer.send("test-channel-1", {"type": "test.message"})
    await layer.receive("test-channel-1")
    await layer.send("test-channel-1", {"type": "test.message"})  # room again once one is taken


async def test_a_channel_capacity_of_its_own(layer: StreamsChannelLayer) -> None:
    await layer.send("tiny", {"type": "test.message"})
    with pytest.raises(ChannelFull):
        await layer.send("tiny", {"type": "test.message"})


async def test_process_local_send_receive(layer: StreamsChannelLayer) -> None:
    channel = await layer.new_channel()
    await layer.send(channel, {"type": "test.message", "text": "Local only please"})
    assert (await layer.receive(channel))["text"] == "Local only please"


async def test_order_is_kept(make_layer: Any) -> None:
    layer = make_layer()
    specific = await layer.new_channel()
    for channel in ("test-channel-3", specific):
        for number in range(1, 4):
            await layer.send(channel, {"type": f"message.{number}"})
        assert [(await layer.receive(channel))["type"] for _ in range(3)] == ["message.1", "message.2", "message.3"]
    await layer.close_pools()


async def test_process_specific_channels_are_sorted_to_their_receivers(layer: StreamsChannelLayer) -> None:
    first, second = await layer.new_channel(), await layer.new_channel()
    await layer.send(first, {"type": "to.first", "n": 1})
    await layer.send(second, {"type": "to.second"})
    await layer.send(first, {"type": "to.first", "n": 2})
    # the second's receiver reads the shared stream and keeps the first's messages for it
    assert (await layer.receive(second))["type"] == "to.second"
    assert [(await layer.receive(first))["n"] for _ in range(2)] == [1, 2]


async def test_concurrent_receives_of_specific_channels_each_get_theirs(layer: StreamsChannelLayer) -> None:
    channels = [await layer.new_channel() for _ in range(3)]
    receiving = [asyncio.ensure_future(layer.receive(channel)) for channel in channels]
    for index, channel in reversed(list(enumerate(channels))):
        await layer.send(channel, {"type": "test.message", "index": index})
    received = await asyncio.wait_for(asyncio.gather(*receiving), 10)
    assert [message["index"] for message in received] == [0, 1, 2]


async def test_another_process_reaches_a_specific_channel(make_layer: Any) -> None:
    receiver, sender = make_layer(), make_layer()
    channel = await receiver.new_channel()
    await sender.send(channel, {"type": "across"})
    assert (await receiver.receive(channel))["type"] == "across"
    await receiver.close_pools()
    await sender.close_pools()


async def test_an_ordinary_channel_gives_each_message_to_one_receiver(make_layer: Any) -> None:
    """Receivers in three processes compete for one channel: every message is taken once."""
    layers = [make_layer(capacity=1000) for _ in range(3)]
    taken: list[int] = []
    all_taken = asyncio.Event()

    async def take(layer: StreamsChannelLayer) -> None:
        while True:
            taken.append((await layer.receive("work"))["n"])
            if len(taken) >= 60:
                all_taken.set()

    receivers = [asyncio.ensure_future(take(layer)) for layer in layers]
    for number in range(60):
        await layers[number % 3].send("work", {"type": "job", "n": number})
    await asyncio.wait_for(all_taken.wait(), 20)
    for receiver in receivers:
        receiver.cancel()
    await asyncio.gather(*receivers, return_exceptions=True)
    assert sorted(taken) == list(range(60))
    for layer in layers:
        await layer.close_pools()


async def test_a_message_sent_before_anyone_receives_is_kept(make_layer: Any) -> None:
    sender, receiver = make_layer(), make_layer()
    await sender.send("early", {"type": "first"})
    assert (await receiver.receive("early"))["type"] == "first"
    await sender.close_pools()
    await receiver.close_pools()


async def test_bad_channel_and_group_names_are_refused(layer: StreamsChannelLayer) -> None:
    with pytest.raises(TypeError):
        await layer.send("=+135!", {"type": "foom"})
    with pytest.raises(TypeError):
        await layer.receive("=+135!")
    with pytest.raises(TypeError):
        await layer.group_add("bad group!", "channel")


async def test_another_clients_specific_channel_cannot_be_received(layer: StreamsChannelLayer) -> None:
    with pytest.raises(AssertionError):
        await layer.receive("not-client-prefix!local_part")


async def test_groups_basic(layer: StreamsChannelLayer) -> None:
    first = await layer.new_channel(prefix="test-gr-chan-1")
    second = await layer.new_channel(prefix="test-gr-chan-2")
    third = await layer.new_channel(prefix="test-gr-chan-3")
    for channel in (first, second, third):
        await layer.group_add("test-group", channel)
    await layer.group_discard("test-group", second)
    await layer.group_send("test-group", {"type": "message.1"})
    assert (await layer.receive(first))["type"] == "message.1"
    assert (await layer.receive(third))["type"] == "message.1"
    await nothing_comes(layer, second)


async def test_group_send_reaches_ordinary_channels_too(make_layer: Any) -> None:
    sender, receiver = make_layer(), make_layer()
    await sender.group_add("mixed", "plain-channel")
    await sender.group_add("mixed", specific := await receiver.new_channel())
    await sender.group_send("mixed", {"type": "hello"})
    assert (await receiver.receive("plain-channel"))["type"] == "hello"
    assert (await receiver.receive(specific))["type"] == "hello"
    await sender.close_pools()
    await receiver.close_pools()


async def test_group_send_skips_full_channels_and_says_so(
    layer: StreamsChannelLayer, caplog: pytest.LogCaptureFixture
) -> None:
    """Members over capacity are skipped (the Channels spec allows it), never silently: a
    WARNING counts them; the others still get the message."""
    roomy = await layer.new_channel()
    other = StreamsChannelLayer(hosts=[layer.host], prefix=layer.prefix, capacity=3)
    full = await other.new_channel(prefix="channel_2")  # its own process stream, its own capacity
    await layer.group_add("test-group", roomy)
    await layer.group_add("test-group", full)
    await layer.send(full, {"type": "message.0"})
    with caplog.at_level(logging.WARNING, logger="acp_channels.layers"):
        for number in range(1, 4):
            await layer.group_send("test-group", {"type": f"message.{number}"})
    assert [(await layer.receive(roomy))["type"] for _ in range(3)] == ["message.1", "message.2", "message.3"]
    assert [(await other.receive(full))["type"] for _ in range(3)] == ["message.0", "message.1", "message.2"]
    await nothing_comes(other, full)
    warnings = [record.getMessage() for record in caplog.records if record.name == "acp_channels.layers"]
    assert warnings == ["1 of 2 channels over capacity in group test-group: not sent to them"]
    await other.close_pools()


async def test_a_group_member_past_the_group_expiry_leaves(make_layer: Any) -> None:
    layer = make_layer(group_expiry=1)
    channel = await layer.new_channel()
    await layer.group_add("brief", channel)
    await layer._client().zadd(layer._group("brief"), {channel: 0})  # joined long ago
    await layer.group_send("brief", {"type": "late"})
    await nothing_comes(layer, channel)
    await layer.close_pools()


def test_several_event_loops(make_layer: Any) -> None:
    """As under async_to_sync: each call on a loop of its own, with its own connections."""
    layer = make_layer(capacity=3)

    async def send_and_close(channel: str, message: dict[str, Any]) -> None:
        await layer.send(channel, message)
        await layer.close_pools()

    async def receive_and_close(channel: str) -> dict[str, Any]:
        message = await layer.receive(channel)
        await layer.close_pools()
        return message

    first = async_to_sync(layer.new_channel)()
    second = async_to_sync(layer.new_channel)()
    async_to_sync(send_and_close)(first, {"type": "test.message.1"})
    async_to_sync(send_and_close)(second, {"type": "test.message.2"})
    assert async_to_sync(receive_and_close)(second)["type"] == "test.message.2"
    assert async_to_sync(receive_and_close)(first)["type"] == "test.message.1"
    async_to_sync(layer.group_send)("channel_name_1", {"type": "test.message.1"})
    async_to_sync(layer.group_send)("channel_name_2", {"type": "test.message.2"})


@pytest.mark.parametrize("kind", ["specific", "ordinary"])
async def test_cancelled_receives_lose_nothing(make_layer: Any, kind: str) -> None:
    """A receive cancelled at any point (before, during or after its read) takes no message
    with it: every one sent is received once, in order."""
    layer = make_layer(capacity=100)
    channel = await layer.new_channel() if kind == "specific" else "ordinary-channel"
    received: list[int] = []
    for attempt in range(40):
        await layer.send(channel, {"type": "test.message", "n": attempt})
        task = asyncio.ensure_future(layer.receive(channel))
        for _ in range(attempt % 4):
            await asyncio.sleep(0)  # cancelled after that many turns of the loop: before, in, after the read
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            received.append((await task)["n"])  # it finished before the cancel came
    while len(received) < 40:
        received.append((await asyncio.wait_for(layer.receive(channel), 10))["n"])
    assert received == list(range(40))
    await layer.close_pools()


async def test_cancelled_receives_of_an_ordinary_channel_leave_it_usable(layer: StreamsChannelLayer) -> None:
    for _ in range(5):
        task = asyncio.ensure_future(layer.receive("plain"))
        await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    await layer.send("plain", {"type": "after"})
    assert (await asyncio.wait_for(layer.receive("plain"), 10))["type"] == "after"


async def test_new_names_do_not_repeat_after_a_random_reset(make_layer: Any) -> None:
    random.seed(1)
    first = make_layer()
    random.seed(1)
    second = make_layer()
    assert first.client_prefix != second.client_prefix
    random.seed(1)
    channel = await first.new_channel()
    random.seed(1)
    assert await first.new_channel() != channel


async def test_the_earliest_message_expires(make_layer: Any) -> None:
    layer = make_layer(expiry=1.5)
    channel = await layer.new_channel()
    await layer.send(channel, {"type": "old"})
    await layer.send("plain", {"type": "old"})
    await asyncio.sleep(2.7)  # the expiry is the thing under test: time must pass
    await layer.send(channel, {"type": "new"})
    await layer.send("plain", {"type": "new"})
    assert (await layer.receive(channel))["type"] == "new"
    assert (await layer.receive("plain"))["type"] == "new"
    await nothing_comes(layer, channel)
    await layer.close_pools()


async def test_a_channel_full_of_expired_messages_takes_a_new_one(make_layer: Any) -> None:
    """Expired entries are dropped when a stream is full (a send's trim): they take no room."""
    layer = make_layer(expiry=1, capacity=2)
    channel = await layer.new_channel()
    for _ in range(2):
        await layer.send(channel, {"type": "old"})
        await layer.send("plain", {"type": "old"})
    with pytest.raises(ChannelFull):
        await layer.send("plain", {"type": "new"})
    await asyncio.sleep(2.1)  # the expiry is the thing under test: time must pass
    await layer.send(channel, {"type": "new"})
    await layer.send("plain", {"type": "new"})
    assert (await layer.receive(channel))["type"] == "new"
    assert (await layer.receive("plain"))["type"] == "new"
    await layer.close_pools()


async def test_messages_within_the_expiry_all_arrive(make_layer: Any) -> None:
    layer = make_layer(expiry=30)
    channel = await layer.new_channel()
    for number in range(3):
        await layer.send(channel, {"type": "m", "n": number})
    assert [(await layer.receive(channel))["n"] for _ in range(3)] == [0, 1, 2]
    await layer.close_pools()


async def test_a_full_receive_buffer_drops_its_oldest_and_says_so(
    make_layer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Messages read for a specific channel nobody receives yet wait in this process, at most its
    capacity of them (the process's stream holds at most that many too)."""
    layer = make_layer(capacity=2)
    idle, busy = await layer.new_channel(), await layer.new_channel()
    await layer.send(idle, {"n": 1})
    await layer.send(idle, {"n": 2})
    with pytest.raises(asyncio.TimeoutError):  # reads idle's two into its buffer, which they fill
        await asyncio.wait_for(layer.receive(busy), NOT_COMING)
    await layer.send(idle, {"n": 3})
    await layer.send(busy, {"n": 0})
    with caplog.at_level(logging.WARNING, logger="acp_channels.layers"):
        assert (await layer.receive(busy))["n"] == 0  # idle's third came first: its first one goes
    assert [(await layer.receive(idle))["n"] for _ in range(2)] == [2, 3]
    assert [record.getMessage() for record in caplog.records if record.name == "acp_channels.layers"] == [
        f"channel {idle}: its buffer was full, the oldest message was dropped"
    ]
    await layer.close_pools()


async def test_flush_empties_channels_and_groups(layer: StreamsChannelLayer) -> None:
    channel = await layer.new_channel()
    await layer.send("plain", {"type": "x"})
    await layer.send(channel, {"type": "x"})
    await layer.group_add("g", channel)
    await layer.flush()
    assert [key async for key in layer._client().scan_iter(match=f"{layer.key_prefix}*")] == []
    await nothing_comes(layer, "plain")
    await nothing_comes(layer, channel)


async def test_concurrent_receives_of_one_ordinary_channel_in_one_process(layer: StreamsChannelLayer) -> None:
    """Several receives of one channel in one process share its read: each message goes to one."""
    receiving = [asyncio.ensure_future(layer.receive("shared-here")) for _ in range(3)]
    for number in range(3):
        await layer.send("shared-here", {"type": "m", "n": number})
    received = await asyncio.wait_for(asyncio.gather(*receiving), 10)
    assert sorted(message["n"] for message in received) == [0, 1, 2]


async def test_a_stream_that_expired_under_its_receiver_is_read_again(make_layer: Any) -> None:
    """An ordinary channel's stream expires when nobody sends (its key has a TTL): a receiver
    waiting on it makes its group again and still gets the next message."""
    layer = make_layer(expiry=1)
    waiting = asyncio.ensure_future(layer.receive("quiet"))
    await layer.send("quiet", {"type": "first"})
    assert (await asyncio.wait_for(waiting, 10))["type"] == "first"
    waiting = asyncio.ensure_future(layer.receive("quiet"))
    client = layer._client()
    await client.delete(layer._stream("quiet"))  # what the key's expiry does after a quiet while
    await layer.send("quiet", {"type": "second"})
    assert (await asyncio.wait_for(waiting, 15))["type"] == "second"
    await layer.close_pools()


@pytest.mark.parametrize("turns", range(8))
async def test_closing_ends_a_read_at_once_wherever_it_is(
    make_layer: Any, turns: int, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A process that is done (a management command, a runner that drained) closes the layer
    while a receive's read is under way: the close does not wait for the read's block to run
    out (a minute here). redis-py swallows a cancellation that lands while a read is being sent
    (here after 2 to 4 turns of the loop), and that read then blocked the close, and every
    `manage.py acp_end_connection`, for the five seconds of BLOCK_MS. Nothing is left behind:
    no read task, no unretrieved error."""
    monkeypatch.setattr("acp_channels._streams_layer.BLOCK_MS", 60_000)
    layer = make_layer()
    channel = await layer.new_channel()
    await layer.send(channel, {"type": "test.message"})
    await layer.receive(channel)  # the next read also deletes what this one read (a pipeline)
    waiting = asyncio.ensure_future(layer.receive(channel))
    for _ in range(turns):
        await asyncio.sleep(0)  # the read is that far along when the process closes the layer
    waiting.cancel()
    async with asyncio.timeout(10):
        await layer.close_pools()
    assert not [task for task in asyncio.all_tasks() if task.get_name().startswith("acp-layer-read")]
    assert "never retrieved" not in caplog.text


@pytest.mark.parametrize("kind", ["specific", "ordinary"])
async def test_a_reader_whose_connection_is_cut_gets_every_message_once(
    make_layer: Any, redis_server: RedisServer, prefix: str, kind: str
) -> None:
    """The inbound path's guarantee (docs/several-workers.md): Redis cuts the receiving
    process's connections again and again while messages flow (a blocked read, the pipeline
    that deletes what the last read took and reads on); each message still arrives once, in
    order. A read whose reply was lost is read again from the same point (a process-specific
    stream's last id, an ordinary channel's group)."""
    from redis.asyncio import Redis
    from redis.exceptions import ConnectionError as RedisConnectionError

    sender = make_layer(capacity=1000)
    # Named, so that only its connections are cut (other tests share this Redis).
    name = f"cut-{secrets.token_hex(4)}"
    receiver = StreamsChannelLayer(
        hosts=[{"address": redis_server.url, "client_name": name}], prefix=prefix, capacity=1000
    )
    channel = await receiver.new_channel() if kind == "specific" else "inbound"
    total = 400
    got: list[int] = []
    cut = 0

    async def receive_all() -> None:
        while len(got) < total:
            try:
                got.append((await receiver.receive(channel))["n"])
            except RedisConnectionError:  # the bus retries the same way (acp_channels/_worker.py)
                continue

    receiving = asyncio.ensure_future(receive_all())
    admin = Redis.from_url(redis_server.url)
    try:
        for n in range(total):
            await sender.send(channel, {"type": "test.message", "n": n})
            if n % 20 == 10:
                for client in await admin.client_list():
                    if client.get("name") == name:
                        cut += await admin.client_kill_filter(_id=client["id"])
                await asyncio.sleep(0)
        await asyncio.wait_for(receiving, 30)
    finally:
        receiving.cancel()
        await admin.aclose()
    assert cut >= 10  # the cuts happened
    assert got == list(range(total))  # each once, in order
    await receiver.close_pools()
    await sender.close_pools()


async def test_what_a_vanished_receiver_read_and_never_acknowledged_goes_to_another(
    make_layer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A receiver of an ordinary channel that died between its read and its acknowledgement
    leaves the entry pending in the group: another receiver claims it once it is idle for
    CLAIM_IDLE_MS, and the message is delivered, not silently dropped."""
    monkeypatch.setattr("acp_channels._streams_layer.CLAIM_IDLE_MS", 100)
    monkeypatch.setattr("acp_channels._streams_layer.BLOCK_MS", 200)
    layer = make_layer()
    await layer.send("work", {"type": "test.message", "n": 1})
    client = layer.redis()
    await layer._create_group(client, layer._stream("work"))
    # A receiver in another process reads it, then its process dies.
    taken = await client.xreadgroup("receivers", "vanished", {layer._stream("work"): ">"}, count=1)
    assert taken and taken[0][1]
    message = await asyncio.wait_for(layer.receive("work"), 10)
    assert message["n"] == 1
    await nothing_comes(layer, "work")  # once
    await layer.close_pools()


async def test_what_a_process_read_of_its_own_channels_leaves_its_stream_a_few_reads_later(
    make_layer: Any,
) -> None:
    """Deleted in batches (DELETE_EVERY, or 1 % of the channel's capacity): at no point does a
    process's stream keep more than that of what it already read."""
    from acp_channels._streams_layer import DELETE_EVERY

    sender, receiver = make_layer(), make_layer(channel_capacity={"acp.worker.*": 10000})
    channel = await receiver.new_channel("acp.worker.x")
    stream = receiver._stream(channel)
    for n in range(200):
        await sender.send(channel, {"type": "test.message", "n": n})
        assert (await receiver.receive(channel))["n"] == n
        assert await receiver.redis().xlen(stream) <= DELETE_EVERY
    small = make_layer(capacity=100)  # 1 % of 100: every read deletes what the last one took
    channel = await small.new_channel()
    for n in range(5):
        await sender.send(channel, {"type": "test.message", "n": n})
        await small.receive(channel)
        assert await small.redis().xlen(small._stream(channel)) <= 1
    for layer in (sender, receiver, small):
        await layer.close_pools()
