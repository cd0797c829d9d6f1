"""Messages for one inbox that are ready together go as one layer message (acp_channels._outbox):
a call's answer and the output that follows it, several pushes; a lone message goes as itself;
order per inbox holds across batches, however long a batch's send takes; every sender learns its
batch's fate; a batch closes at GATHER_BYTES; the receiving Bus reads a batch's messages in order."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import pytest

from acp_channels import _outbox as outbox
from acp_channels._outbox import BATCH, Outbox, unbatched
from acp_channels._worker import Bus
from acp_channels._worker_protocol import Pushed


class Recorder:
    """A `send_now` that records each layer message; a send can be held until released."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.hold: asyncio.Event | None = None
        self.fail: Exception | None = None

    async def __call__(self, channel: str, message: dict[str, Any]) -> None:
        if self.hold is not None:
            await self.hold.wait()
        if self.fail is not None:
            raise self.fail
        self.sent.append((channel, msgpack.unpackb(msgpack.packb(message), raw=False)))


def flat(sent: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, Any]]:
    return [(channel, each["n"]) for channel, message in sent for each in unbatched(message)]


async def a_few_steps_later(box: Outbox, channel: str, n: int, steps: int) -> None:
    for _ in range(steps):
        await asyncio.sleep(0)
    await box.send(channel, {"type": "t", "n": n})


@pytest.fixture
def unhurried(monkeypatch: pytest.MonkeyPatch) -> None:
    """No time bound on a gathering: a test process descheduled between two steps still batches."""
    monkeypatch.setattr(outbox, "GATHER_SECONDS", 60.0)


async def test_messages_ready_within_a_few_steps_go_as_one_in_order(unhurried: None) -> None:
    recorder = Recorder()
    box = Outbox(recorder)
    # An answer, then output one and three loop steps later (as an in-process agent's).
    await asyncio.gather(
        box.send("a", {"type": "t", "n": 1}), a_few_steps_later(box, "a", 2, 1), a_few_steps_later(box, "a", 3, 3)
    )
    assert len(recorder.sent) == 1
    channel, message = recorder.sent[0]
    assert channel == "a" and message["type"] == BATCH
    assert flat(recorder.sent) == [("a", 1), ("a", 2), ("a", 3)]


async def test_a_lone_message_goes_as_itself_and_inboxes_do_not_mix() -> None:
    recorder = Recorder()
    box = Outbox(recorder)
    await asyncio.gather(box.send("a", {"type": "t", "n": 1}), box.send("b", {"type": "t", "n": 2}))
    expected = [("a", {"type": "t", "n": 1}), ("b", {"type": "t", "n": 2})]
    assert sorted(recorder.sent, key=lambda sent: sent[0]) == expected


async def test_a_message_after_the_gathering_goes_in_the_next_batch_after_the_first_landed() -> None:
    recorder = Recorder()
    recorder.hold = asyncio.Event()
    box = Outbox(recorder)
    first = asyncio.ensure_future(box.send("a", {"type": "t", "n": 1}))
    # Past the first batch's gathering: it is sending (held), the next message opens another.
    second = asyncio.ensure_future(a_few_steps_later(box, "a", 2, outbox.GATHER_STEPS + 5))
    for _ in range(outbox.GATHER_STEPS * 3):
        await asyncio.sleep(0)
    assert not first.done() and not second.done() and recorder.sent == []
    recorder.hold.set()
    await asyncio.gather(first, second)
    assert flat(recorder.sent) == [("a", 1), ("a", 2)] and len(recorder.sent) == 2


async def test_every_sender_of_a_batch_learns_that_it_failed(unhurried: None) -> None:
    recorder = Recorder()
    recorder.fail = ConnectionError("layer down")
    box = Outbox(recorder)
    results = await asyncio.gather(
        box.send("a", {"type": "t", "n": 1}), a_few_steps_later(box, "a", 2, 1), return_exceptions=True
    )
    assert [type(result) for result in results] == [ConnectionError, ConnectionError]
    recorder.fail = None
    await box.send("a", {"type": "t", "n": 3})  # the inbox goes on
    assert flat(recorder.sent) == [("a", 3)]


async def test_a_sender_that_is_cancelled_stops_waiting_and_its_message_still_goes() -> None:
    recorder = Recorder()
    recorder.hold = asyncio.Event()
    box = Outbox(recorder)
    sender = asyncio.ensure_future(box.send("a", {"type": "t", "n": 1}))
    await asyncio.sleep(0)
    sender.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sender
    recorder.hold.set()
    await box.send("a", {"type": "t", "n": 2})
    assert flat(recorder.sent) == [("a", 1), ("a", 2)]


async def test_a_batch_closes_at_its_byte_bound(unhurried: None) -> None:
    recorder = Recorder()
    box = Outbox(recorder)
    item = "x" * (outbox.GATHER_BYTES // 2)
    await asyncio.gather(*(box.send("a", {"type": "t", "n": n, "items": [item]}) for n in range(5)))
    assert flat(recorder.sent) == [("a", n) for n in range(5)]
    assert [len(unbatched(message)) for _, message in recorder.sent] == [2, 2, 1]


class Wire:
    """A channel layer whose sends land in `peer`'s inbox as it would read them."""

    def __init__(self, peer: Bus) -> None:
        self.peer = peer
        self.layer_messages = 0

    async def send(self, channel: str, message: dict[str, Any]) -> None:
        self.layer_messages += 1
        self.peer._take(msgpack.unpackb(msgpack.packb(message), raw=False))


class QuietBus(Bus):
    def ensure_listening(self) -> None:
        pass


async def test_a_bus_reads_a_batch_of_pushes_in_order(unhurried: None) -> None:
    sender, receiver = QuietBus(), QuietBus()
    wire = Wire(receiver)
    sender.use(wire)
    got: list[int] = []
    receiver.receive_pushes("lease-1", lambda push: got.append(push.seq) if isinstance(push, Pushed) else None)
    pushes = [Pushed("lease-1", seq, seq, (f'{{"n":{seq}}}',)) for seq in range(1, 6)]
    await asyncio.gather(*(sender.push("0123456789ab", push) for push in pushes))
    assert got == [1, 2, 3, 4, 5] and wire.layer_messages == 1


async def test_a_gathering_ends_at_its_time_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outbox, "GATHER_SECONDS", 0.0)  # a loop whose steps are long
    recorder = Recorder()
    box = Outbox(recorder)
    await asyncio.gather(box.send("a", {"type": "t", "n": 1}), a_few_steps_later(box, "a", 2, 3))
    assert flat(recorder.sent) == [("a", 1), ("a", 2)] and len(recorder.sent) == 2


async def test_a_stopping_bus_sends_what_is_on_its_way_out_first() -> None:
    """A draining runner's last reply (the DELETE that ended its last connection) went out
    after the layer's connections were closed: the caller waited, then answered 404."""
    receiver = QuietBus()
    wire = Wire(receiver)
    sender = QuietBus()
    sender.use(wire)
    got: list[int] = []
    receiver.receive_pushes("lease-1", lambda push: got.append(push.seq) if isinstance(push, Pushed) else None)
    sending = asyncio.ensure_future(sender.push("0123456789ab", Pushed("lease-1", 1, 1, ("{}",))))
    await asyncio.sleep(0)  # the push is in an open batch
    await sender.stop()
    assert got == [1]
    await sending


async def test_a_call_goes_at_once_unless_a_batch_is_open(unhurried: None) -> None:
    recorder = Recorder()
    box = Outbox(recorder)
    await box.send("a", {"type": "t", "n": 1}, wait_for_company=False)
    assert flat(recorder.sent) == [("a", 1)]
    # An acknowledgement waits for company; a call a step later joins it.
    await asyncio.gather(
        box.send("a", {"type": "t", "n": 2}),
        a_few_steps_later_alone(box, "a", 3, 1),
    )
    assert flat(recorder.sent) == [("a", 1), ("a", 2), ("a", 3)] and len(recorder.sent) == 2


async def a_few_steps_later_alone(box: Outbox, channel: str, n: int, steps: int) -> None:
    for _ in range(steps):
        await asyncio.sleep(0)
    await box.send(channel, {"type": "t", "n": n}, wait_for_company=False)


async def test_a_batch_with_company_goes_once_a_few_steps_bring_no_more(unhurried: None) -> None:
    recorder = Recorder()
    box = Outbox(recorder)
    later = outbox.QUIET_STEPS + 3
    await asyncio.gather(
        box.send("a", {"type": "t", "n": 1}), a_few_steps_later(box, "a", 2, 1), a_few_steps_later(box, "a", 3, later)
    )
    assert [len(unbatched(message)) for _, message in recorder.sent] == [2, 1]
    assert flat(recorder.sent) == [("a", 1), ("a", 2), ("a", 3)]


async def test_a_lone_message_waits_its_whole_gathering_for_company(unhurried: None) -> None:
    recorder = Recorder()
    box = Outbox(recorder)
    await asyncio.gather(box.send("a", {"type": "t", "n": 1}), a_few_steps_later(box, "a", 2, outbox.GATHER_STEPS - 2))
    assert [len(unbatched(message)) for _, message in recorder.sent] == [2]
