"""Output journals (acp_channels/_journal.py) against a real Redis: what a runner's mailbox
writes, and what a web worker reads back for a resuming reader."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import pytest

from acp_channels import _journal
from acp_channels._host.budget import OutboundBudget
from acp_channels._host.mailbox import Mailbox
from acp_channels._identity import Principal
from acp_channels._streams_layer import StreamsChannelLayer
from tests.cluster import RedisServer

ALICE = Principal("user", "1", "alice")
BOB = Principal("user", "2", "bob")


@pytest.fixture
async def layer(redis_server: RedisServer) -> AsyncIterator[StreamsChannelLayer]:
    layer = StreamsChannelLayer(hosts=[redis_server.url], prefix=f"journal-test-{secrets.token_hex(4)}")
    yield layer
    redis = layer.redis()
    keys = [key async for key in redis.scan_iter(match=f"{layer.key_prefix}*")]
    if keys:
        await redis.delete(*keys)
    await layer.close_pools()


def mailbox_with_journal(
    writer: _journal.JournalWriter, *, window_events: int = 100, window_bytes: int = 1 << 20
) -> Mailbox:
    mailbox = Mailbox(
        OutboundBudget(8 << 20, None, window_bytes), window_events=window_events, window_bytes=window_bytes
    )
    mailbox.journal = writer.stream("conn-1", ALICE, "s", mailbox.tag, 0, mailbox.window_limits)
    return mailbox


async def take_all(mailbox: Mailbox) -> list[str]:
    taken: list[str] = []
    while batch := await mailbox.take(0, max_bytes=40):
        taken.extend(batch)
    return taken


async def test_a_resume_reads_what_was_handed_out_after_the_cursor(layer: StreamsChannelLayer) -> None:
    writer = _journal.JournalWriter(layer)
    mailbox = mailbox_with_journal(writer)
    for n in range(1, 21):
        mailbox.push(f"event {n}")
    assert len(await take_all(mailbox)) == 20  # several batches (40 bytes each)
    await writer.drain()
    replay = await _journal.read(layer, "conn-1", ALICE, "s", mailbox.tag, 7)
    assert replay is not None
    assert replay.items == [f"event {n}" for n in range(8, 21)]
    assert replay.cursor == f"{mailbox.tag}-20"
    # Nothing after the last event, and nothing for a cursor the journal never had.
    assert await _journal.read(layer, "conn-1", ALICE, "s", mailbox.tag, 20) is None
    assert await _journal.read(layer, "conn-1", ALICE, "s", "othertag", 7) is None


async def test_another_principal_or_stream_reads_nothing(layer: StreamsChannelLayer) -> None:
    writer = _journal.JournalWriter(layer)
    mailbox = mailbox_with_journal(writer)
    mailbox.push("secret")
    await take_all(mailbox)
    await writer.drain()
    assert await _journal.read(layer, "conn-1", ALICE, "s", mailbox.tag, 0) is not None
    assert await _journal.read(layer, "conn-1", BOB, "s", mailbox.tag, 0) is None
    assert await _journal.read(layer, "conn-1", ALICE, "other-session", mailbox.tag, 0) is None
    assert await _journal.read(layer, "conn-1", ALICE, None, mailbox.tag, 0) is None


async def test_events_handed_out_again_are_written_once(layer: StreamsChannelLayer) -> None:
    writer = _journal.JournalWriter(layer)
    mailbox = mailbox_with_journal(writer)
    for n in range(1, 11):
        mailbox.push(f"event {n}")
    batch = await mailbox.take(0, max_bytes=60)
    assert batch is not None
    mailbox.requeue(list(batch))  # a reader that vanished: the same events go out again
    await take_all(mailbox)
    mailbox.resume(3, f"{mailbox.tag}-3")  # a reader resuming through the runner
    await take_all(mailbox)
    await writer.drain()
    replay = await _journal.read(layer, "conn-1", ALICE, "s", mailbox.tag, 0)
    assert replay is not None and replay.items == [f"event {n}" for n in range(1, 11)]
    key = mailbox.journal.key if mailbox.journal else ""
    entries = await layer.redis().xrange(key)
    firsts = [int(fields[b"f"]) for _, fields in entries]
    assert firsts == sorted(set(firsts))  # no batch twice


async def test_the_journal_keeps_the_window_and_a_cursor_before_it_reads_nothing(layer: StreamsChannelLayer) -> None:
    writer = _journal.JournalWriter(layer)
    mailbox = mailbox_with_journal(writer, window_events=10)
    for n in range(1, 101):
        mailbox.push(f"event {n}")
    await take_all(mailbox)
    mailbox.settle()
    await writer.drain()
    assert mailbox.journal is not None
    entries = await layer.redis().xrange(mailbox.journal.key)
    kept = sum(int(entry_id.split(b"-")[0]) - int(fields[b"f"]) + 1 for entry_id, fields in entries)
    assert 10 <= kept <= 10 + 5  # the window, and at most the batch it was trimmed with
    assert await _journal.read(layer, "conn-1", ALICE, "s", mailbox.tag, 50) is None  # gone: the runner says 409
    replay = await _journal.read(layer, "conn-1", ALICE, "s", mailbox.tag, 95)
    assert replay is not None and replay.items == [f"event {n}" for n in range(96, 101)]


async def test_a_stream_that_can_no_longer_be_read_deletes_its_journal(layer: StreamsChannelLayer) -> None:
    writer = _journal.JournalWriter(layer)
    mailbox = mailbox_with_journal(writer)
    mailbox.push("one")
    await take_all(mailbox)
    await writer.drain()
    assert mailbox.journal is not None
    key = mailbox.journal.key
    assert await layer.redis().exists(key) == 1
    assert 0 < await layer.redis().pttl(key) <= _journal.JOURNAL_TTL_SECONDS * 1000
    mailbox.close()  # the connection ended, nobody holds the stream
    await writer.drain()
    assert await layer.redis().exists(key) == 0


async def test_a_write_that_fails_is_retried_in_order_and_leaves_no_hole(
    layer: StreamsChannelLayer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_journal, "RETRY_SECONDS", 0.05)
    writer = _journal.JournalWriter(layer)
    mailbox = mailbox_with_journal(writer)
    failures = 0
    real_write = writer._write

    async def failing_twice(ops: list[object]) -> None:
        nonlocal failures
        if failures < 2:
            failures += 1
            raise ConnectionError("Redis is down")
        await real_write(ops)  # type: ignore[arg-type]

    writer._write = failing_twice  # type: ignore[method-assign]
    for n in range(1, 6):
        mailbox.push(f"event {n}")
        await take_all(mailbox)
    await writer.drain()
    assert failures == 2
    replay = await _journal.read(layer, "conn-1", ALICE, "s", mailbox.tag, 0)
    assert replay is not None and replay.items == [f"event {n}" for n in range(1, 6)]


async def test_a_journal_made_again_after_its_window_was_forgotten_expires_too(layer: StreamsChannelLayer) -> None:
    writer = _journal.JournalWriter(layer)
    mailbox = mailbox_with_journal(writer)
    mailbox.push("one")
    await take_all(mailbox)
    mailbox.settle()
    assert mailbox.forget_window() > 0  # the budget needed the room: the journal goes too
    mailbox.push("two")
    await take_all(mailbox)
    await writer.drain()
    assert mailbox.journal is not None
    assert 0 < await layer.redis().pttl(mailbox.journal.key) <= _journal.JOURNAL_TTL_SECONDS * 1000
    replay = await _journal.read(layer, "conn-1", ALICE, "s", mailbox.tag, 1)
    assert replay is not None and replay.items == ["two"]
    assert await _journal.read(layer, "conn-1", ALICE, "s", mailbox.tag, 0) is None  # "one" is gone


async def test_batches_handed_out_while_the_writer_gathers_make_one_entry(layer: StreamsChannelLayer) -> None:
    writer = _journal.JournalWriter(layer)
    mailbox = mailbox_with_journal(writer)
    for n in range(1, 11):  # ten turns, each its own batch, before the writer takes them
        mailbox.push(f"event {n}")
        assert await mailbox.take(0) is not None
    await writer.drain()
    assert mailbox.journal is not None
    assert await layer.redis().xlen(mailbox.journal.key) == 1
    replay = await _journal.read(layer, "conn-1", ALICE, "s", mailbox.tag, 4)
    assert replay is not None and replay.items == [f"event {n}" for n in range(5, 11)]
