"""The typed cross-worker protocol: every op and reply round-trips through its wire form, an
unknown or malformed op is answered with a typed error (never a crash), and a caller raises for
a reply its op cannot get. Two `Bus`es in one process, wired to each other through msgpack (the
channel layer's wire form), stand for two workers."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import pytest

from acp_channels import _gateway as gateway
from acp_channels import _worker as worker
from acp_channels import _worker_protocol as worker_protocol
from acp_channels._agents import AgentClosed
from acp_channels._host import Mailbox, OutboundBudget, ReplayUnavailable, StreamBusy, TooManyRequests, TooManyStreams
from acp_channels._identity import Principal
from acp_channels._inventory import ConnectionInfo
from acp_channels._protocol import InboundPlan, SessionHeaderError, Single
from acp_channels._worker import Bus, HostUnreachable, WorkerBusy
from acp_channels._worker_protocol import (
    OPS,
    PUSH_CREDIT_BATCHES,
    REPLIES,
    Acknowledge,
    AgentFailed,
    Alive,
    Busy,
    Closed,
    ConnectionEnded,
    Connections,
    EndConnection,
    Ended,
    ErrorReply,
    Internal,
    KeepAlive,
    Kept,
    Lease,
    Leased,
    LeaseSocket,
    ListConnections,
    Malformed,
    Op,
    Open,
    Opened,
    OpenRefused,
    Probe,
    Pushed,
    PushEnded,
    Release,
    ReplayRefused,
    Replied,
    Reply,
    ReplyFromTransport,
    SessionRefused,
    SocketLeased,
    SocketSubmitted,
    StreamsFull,
    Submit,
    SubmitOnSocket,
    Submitted,
    Terminate,
    Terminated,
    TooManyPending,
    UnknownConnection,
    UnknownOp,
    WorkerFailed,
)
from acp_channels.errors import LayerUnavailable
from tests.gateway_bus import patch_bus

ALICE = Principal("user", "7", "alice")
INFO = ConnectionInfo("c.0123456789ab", "0123456789ab", "user:alice", "http", 2, 1.5, 0.25, 300, 4242)

SAMPLE_OPS: list[Op] = [
    Open("c1", ALICE, "http", "10.0.0.1", '{"jsonrpc":"2.0","id":0,"method":"initialize"}', "0"),
    Open("c1", ALICE, "websocket", None, None, None),
    Submit("c1", ALICE, '{"jsonrpc":"2.0","id":1,"method":"x"}', (("1", "s1"), ("2", None)), ("s1",), "s1"),
    Submit("c1", ALICE, "[]", (), (), None),
    SubmitOnSocket("c1", ALICE, "text", "lease-1"),
    ReplyFromTransport("c1", ALICE, '{"jsonrpc":"2.0","id":null,"error":{}}'),
    Lease("c1", ALICE, "lease-1", "0123456789ab", "s1", "tag:4"),
    Lease("c1", ALICE, "lease-2", "0123456789ab", None, None),
    LeaseSocket("c1", ALICE, "lease-3", "0123456789ab", 17),
    KeepAlive("lease-1", 3),
    Acknowledge("lease-1", 4),
    Release("lease-1", 4, "socket closed"),
    Release("lease-1", 0),
    Terminate("c1", ALICE),
    Probe("lease-1"),
    ListConnections(),
    EndConnection("c1"),
]
SAMPLE_REPLIES: list[Reply] = [
    Opened('{"jsonrpc":"2.0","id":0,"result":{}}', True),
    Opened("", True),
    OpenRefused("draining"),
    OpenRefused("quota", 32),
    AgentFailed(),
    Submitted(),
    SocketSubmitted(True),
    Replied(),
    Leased("ab12cd34"),
    SocketLeased(5),
    Ended(),
    Ended("taken"),
    Kept(),
    Terminated(),
    Alive(False),
    Connections((INFO, ConnectionInfo("d", "w", "anonymous", "websocket", 0, 0.0, 0.0, 0, None))),
    Connections(()),
    ConnectionEnded(),
    UnknownConnection(),
    SessionRefused("the header names another session"),
    TooManyPending(64, "requests"),
    TooManyPending(16, "bytes"),
    Busy(),
    StreamsFull(16),
    ReplayRefused("gone", "tag:3"),
    Closed(),
    Internal(),
    UnknownOp("teleport"),
    Malformed("submit.text: expected str, got int"),
]


def wire(message: dict[str, Any]) -> dict[str, Any]:
    """What the other worker reads: the channel layer's msgpack round trip (tuples become lists)."""
    unpacked: dict[str, Any] = msgpack.unpackb(msgpack.packb(message), raw=False)
    return unpacked


def test_the_samples_cover_every_op_and_reply() -> None:
    assert {op.name for op in SAMPLE_OPS} == set(OPS)
    assert {reply.name for reply in SAMPLE_REPLIES} == set(REPLIES)


@pytest.mark.parametrize("op", SAMPLE_OPS, ids=lambda op: op.name)
def test_every_op_round_trips(op: Op) -> None:
    message = wire(worker_protocol.encode_op(op, "w-1", "acp.worker.w", receipt=True))
    assert (message["type"], message["id"], message["reply_to"], message["receipt"]) == (
        "acp.op",
        "w-1",
        "acp.worker.w",
        True,
    )
    assert worker_protocol.decode_op(message) == op


@pytest.mark.parametrize("reply", SAMPLE_REPLIES, ids=[f"{reply.name}-{n}" for n, reply in enumerate(SAMPLE_REPLIES)])
def test_every_reply_round_trips(reply: Reply) -> None:
    message = wire(worker_protocol.encode_reply("w-9", reply))
    assert set(message) == {"type", "id", "reply", "fields"}  # fields can never overwrite the envelope
    assert (message["type"], message["id"]) == ("acp.result", "w-9")
    assert worker_protocol.decode_reply(message) == reply


def test_pushes_round_trip() -> None:
    for push in (Pushed("lease-1", 3, 40, ("x", "y")), PushEnded("lease-1", "taken"), PushEnded("lease-1", None)):
        assert worker_protocol.decode_push(wire(worker_protocol.encode_push(push))) == push


def test_an_expiry_travels_with_a_call_and_only_a_number_expires_it() -> None:
    message = wire(worker_protocol.encode_op(Probe("x"), "w-1", "acp.worker.w", expires=1000.5))
    assert message["expires"] == 1000.5 and worker_protocol.decode_op(message) == Probe("x")
    assert worker_protocol.expired(message, 1000.6)
    assert not worker_protocol.expired(message, 1000.4)
    assert "expires" not in worker_protocol.encode_op(Probe("x"), "w-1", "acp.worker.w")
    for unreadable in ({}, {"expires": "0"}, {"expires": None}, {"expires": True}):
        assert not worker_protocol.expired(unreadable, 1e12)


def test_an_unknown_op_is_an_unknown_op_reply() -> None:
    message = wire(worker_protocol.encode_op(Probe("x"), "w-1", "acp.worker.w"))
    message["op"] = "teleport"
    assert worker_protocol.decode_op(message) == UnknownOp("teleport")
    del message["op"]
    assert worker_protocol.decode_op(message) == UnknownOp("None")


@pytest.mark.parametrize(
    "args",
    [
        None,
        [],
        {"lease": "x"},  # seq missing
        {"lease": "x", "seq": "1"},  # a string for an int
        {"lease": "x", "seq": True},  # a bool is not a count
        {"lease": 5, "seq": 1},
    ],
)
def test_a_malformed_op_is_a_malformed_reply(args: Any) -> None:
    message = {"type": "acp.op", "id": "w-1", "reply_to": "acp.worker.w", "op": "keep-alive", "args": args}
    decoded = worker_protocol.decode_op(message)
    assert isinstance(decoded, Malformed), decoded


@pytest.mark.parametrize(
    "fields",
    [
        {"principal": ["user"], "connection": "c", "text": "t", "routes": [], "sessions": [], "header": None},
        {
            "principal": ["user", "7", "a"],
            "connection": "c",
            "text": "t",
            "routes": [["1"]],
            "sessions": [],
            "header": None,
        },
        {
            "principal": ["user", "7", "a"],
            "connection": "c",
            "text": "t",
            "routes": [],
            "sessions": "s1",
            "header": None,
        },
    ],
)
def test_malformed_nested_fields_are_malformed(fields: dict[str, Any]) -> None:
    message = {"type": "acp.op", "id": "w-1", "reply_to": "r", "op": "submit", "args": fields}
    assert isinstance(worker_protocol.decode_op(message), Malformed)


def test_a_malformed_or_unknown_reply_is_malformed() -> None:
    assert isinstance(worker_protocol.decode_reply({"type": "acp.result", "id": "1", "reply": "nope"}), Malformed)
    bad = {"type": "acp.result", "id": "1", "reply": "leased", "fields": {"tag": 3}}
    assert isinstance(worker_protocol.decode_reply(bad), Malformed)
    bad = {"type": "acp.result", "id": "1", "reply": "connections", "fields": {"items": [{"worker": "w"}]}}
    assert isinstance(worker_protocol.decode_reply(bad), Malformed)


@pytest.mark.parametrize("op", SAMPLE_OPS, ids=lambda op: op.name)
def test_a_reply_an_op_cannot_get_raises(op: Op) -> None:
    for reply in SAMPLE_REPLIES:
        if isinstance(reply, op.replies):
            assert worker_protocol.expect(op, reply) is reply
        else:
            with pytest.raises(WorkerFailed) as failed:
                worker_protocol.expect(op, reply)
            assert failed.value.op == op.name and failed.value.reply is reply
    for failure in (Internal(), UnknownOp(op.name), Malformed("x")):  # never expected by anyone
        with pytest.raises(WorkerFailed, match=f"failed to handle {op.name}"):
            worker_protocol.expect(op, failure)


# -- two workers in one process ---------------------------------------------------------------


class LinkedBus(Bus):
    """A Bus whose messages go, through msgpack, to the other end of a pair."""

    peer: LinkedBus

    def ensure_listening(self) -> None:
        pass

    async def send(self, channel: str, message: dict[str, Any], **options: Any) -> None:
        self.peer._dispatch(wire(message))


@pytest.fixture
def buses(monkeypatch: pytest.MonkeyPatch) -> tuple[LinkedBus, LinkedBus]:
    """(caller, host): the caller's replies come back to it, the host serves ops."""
    caller, host = LinkedBus(), LinkedBus()
    caller.peer, host.peer = host, caller
    patch_bus(monkeypatch, caller)
    return caller, host


async def test_a_handler_that_raises_is_an_internal_reply_and_the_caller_raises(
    buses: tuple[LinkedBus, LinkedBus],
) -> None:
    _, host = buses

    async def broken(op: Submit) -> Reply:
        raise RuntimeError("boom")

    host.handle(Submit, broken)
    handle = gateway.remote.RemoteHandle("0123456789ab", "c1.0123456789ab", ALICE)
    plan = InboundPlan(Single({"jsonrpc": "2.0", "id": 1, "method": "x"}), [("1", None)], [], None)
    with pytest.raises(WorkerFailed, match="the connection's worker failed to handle submit"):
        await handle.submit(plan)


async def test_an_op_the_host_does_not_know_raises(buses: tuple[LinkedBus, LinkedBus]) -> None:
    caller, _ = buses  # the host serves nothing: every op is unknown there
    with pytest.raises(WorkerFailed) as failed:
        await caller.call("0123456789ab", Probe("x"), timeout=5)
    assert failed.value.reply == UnknownOp("probe")


async def test_a_handler_answering_what_its_op_cannot_get_is_internal(buses: tuple[LinkedBus, LinkedBus]) -> None:
    caller, host = buses

    async def confused(op: Probe) -> Reply:
        return Submitted()

    host.handle(Probe, confused)
    with pytest.raises(WorkerFailed) as failed:
        await caller.call("0123456789ab", Probe("x"), timeout=5)
    assert failed.value.reply == Internal()


async def test_a_malformed_op_is_answered_and_the_inbox_goes_on(buses: tuple[LinkedBus, LinkedBus]) -> None:
    _, host = buses
    replies: list[dict[str, Any]] = []

    async def capture(channel: str, message: dict[str, Any]) -> None:
        replies.append(message)

    host.send = capture  # type: ignore[method-assign]
    host._dispatch(
        {"type": "acp.op", "id": "x-1", "reply_to": "acp.worker.x", "op": "keep-alive", "args": {"lease": 1}}
    )
    host._dispatch({"type": "acp.op", "op": "keep-alive"})  # no reply channel: dropped, logged
    host._dispatch({"type": "something else"})
    await asyncio.sleep(0)  # the served op runs as a task
    await asyncio.sleep(0)
    assert [worker_protocol.decode_reply(reply) for reply in replies] == [
        Malformed("keep-alive.lease: expected str, got int")
    ]
    assert replies[0]["id"] == "x-1"


async def test_a_result_ready_at_once_needs_no_receipt_a_slow_one_gets_one(buses: tuple[LinkedBus, LinkedBus]) -> None:
    caller, host = buses
    sent: list[str] = []
    something_sent = asyncio.Event()
    real_send = host.send

    async def counting(channel: str, message: dict[str, Any]) -> None:
        sent.append(message["type"])
        something_sent.set()
        await real_send(channel, message)

    host.send = counting  # type: ignore[method-assign]
    release = asyncio.Event()

    async def terminate(op: Terminate) -> Reply:
        if op.connection == "slow":
            await release.wait()
        return Terminated()

    host.handle(Terminate, terminate)
    assert await caller.call("0123456789ab", Terminate("fast", ALICE), timeout=5, receipt=True) == Terminated()
    assert sent == ["acp.result"]
    sent.clear()
    something_sent.clear()
    slow = asyncio.ensure_future(caller.call("0123456789ab", Terminate("slow", ALICE), timeout=5, receipt=True))
    await something_sent.wait()  # the receipt comes once the result is not ready at once
    assert sent == ["acp.receipt"] and not slow.done()
    release.set()
    assert await slow == Terminated()
    assert sent == ["acp.receipt", "acp.result"]


REFUSALS: list[tuple[ErrorReply, type[Exception]]] = [
    (UnknownConnection(), HostUnreachable),
    (SessionRefused("no"), SessionHeaderError),
    (TooManyPending(3, "requests"), TooManyRequests),
    (Busy(), StreamBusy),
    (StreamsFull(2), TooManyStreams),
    (ReplayRefused("gone", "t:1"), ReplayUnavailable),
    (Closed(), AgentClosed),
]


class FixedHeartbeat:
    """What Redis says of the host's worker: a heartbeat there (alive) or gone."""

    def __init__(self, alive: bool) -> None:
        self.is_alive = alive

    async def alive(self, worker_id: str) -> bool:
        return self.is_alive


@pytest.fixture
def short_patience(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker, "SLOW_WORKER_PATIENCE", 0.2)
    monkeypatch.setattr(worker, "RECEIPT_GRACE", 0.1)
    monkeypatch.setattr(worker, "worker_timeout", lambda: 0.05)


@pytest.mark.usefixtures("short_patience")
@pytest.mark.parametrize("receipt", [True, False])
async def test_a_live_worker_that_does_not_take_a_call_is_busy_and_drops_it_later(
    buses: tuple[LinkedBus, LinkedBus], receipt: bool
) -> None:
    caller, host = buses
    held: list[dict[str, Any]] = []

    async def hold(channel: str, message: dict[str, Any], **options: Any) -> None:  # the host's worker is too busy
        held.append(wire(message))

    caller.send = hold  # type: ignore[method-assign]
    caller.heartbeat = FixedHeartbeat(alive=True)  # type: ignore[assignment]
    served: list[Probe] = []

    async def serve(op: Probe) -> Reply:
        served.append(op)
        return Alive(True)

    host.handle(Probe, serve)
    with pytest.raises(WorkerBusy):  # 503 + Retry-After at the edges, never 404
        await caller.call("0123456789ab", Probe("x"), timeout=0.2, receipt=receipt)
    host._dispatch(held[0])  # taken at last: too late, its caller answered already
    await asyncio.gather(*host._tasks)
    assert served == []


@pytest.mark.usefixtures("short_patience")
async def test_a_worker_whose_heartbeat_is_gone_is_unreachable(buses: tuple[LinkedBus, LinkedBus]) -> None:
    caller, _ = buses

    async def lost(channel: str, message: dict[str, Any], **options: Any) -> None:
        pass

    caller.send = lost  # type: ignore[method-assign]
    caller.heartbeat = FixedHeartbeat(alive=False)  # type: ignore[assignment]
    handle = gateway.remote.RemoteHandle("0123456789ab", "c1.0123456789ab", ALICE)
    with pytest.raises(HostUnreachable):
        await handle.terminate()


@pytest.mark.parametrize(("refusal", "raised"), REFUSALS, ids=lambda value: getattr(value, "name", ""))
async def test_every_refusal_is_raised_as_a_local_host_raises_it(
    buses: tuple[LinkedBus, LinkedBus], refusal: ErrorReply, raised: type[Exception]
) -> None:
    _, host = buses

    async def refuse(op: Any) -> Reply:
        return refusal

    for op in OPS.values():
        host.handle(op, refuse)
    handle = gateway.remote.RemoteHandle("0123456789ab", "c1.0123456789ab", ALICE)
    plan = InboundPlan(Single({"jsonrpc": "2.0", "id": 1, "method": "x"}), [("1", None)], [], None)
    calls = {
        Submit: lambda: handle.submit(plan),
        ReplyFromTransport: lambda: handle.reply_from_transport("{}"),
        Lease: lambda: handle.lease("s1"),
        LeaseSocket: lambda: handle.attach_socket(0),
        Terminate: handle.terminate,
    }
    tried = 0
    for op_type, call in calls.items():
        if type(refusal) in op_type.replies:
            tried += 1
            with pytest.raises(raised):
                await call()
        else:  # a refusal the op cannot get is a failure of the host's worker, not a refusal
            with pytest.raises(WorkerFailed):
                await call()
    assert tried


async def test_a_refused_reply_detail_survives(buses: tuple[LinkedBus, LinkedBus]) -> None:
    _, host = buses

    async def refuse(op: Lease) -> Reply:
        return ReplayRefused("foreign", "zz:9")

    host.handle(Lease, refuse)
    with pytest.raises(ReplayUnavailable) as refused:
        await gateway.remote.RemoteHandle("0123456789ab", "c1.0123456789ab", ALICE).lease("s1", "zz:9")
    assert (refused.value.reason, refused.value.event_id) == ("foreign", "zz:9")


# -- pushed streams -----------------------------------------------------------------------------


class LoopbackBus(Bus):
    """One process as both workers: what it sends comes back to its own inbox (through msgpack),
    served by the gateway's handlers."""

    def ensure_listening(self) -> None:
        pass

    async def send(self, channel: str, message: dict[str, Any], **options: Any) -> None:
        self._dispatch(wire(message))


@pytest.fixture
def loopback(monkeypatch: pytest.MonkeyPatch) -> LoopbackBus:
    from acp_channels import _worker as worker

    loop_bus = LoopbackBus()
    loop_bus._handlers = dict(worker.bus._handlers)
    patch_bus(monkeypatch, loop_bus)
    return loop_bus


async def pushed_stream(items: int) -> tuple[Mailbox, gateway.serve.LeaseOnHost, gateway.remote.RemoteStream]:
    mailbox = Mailbox(OutboundBudget(1 << 20))
    for n in range(items):
        mailbox.push(f"item-{n}")
    reader = gateway.remote.RemoteStream("0123456789ab", "lease-under-test")

    async def leased() -> None:
        pass

    await reader.leasing(leased())
    lease = gateway.serve.LeaseOnHost(reader.lease_id, "0123456789ab", mailbox, host=None)  # type: ignore[arg-type]
    mailbox.acquire(lease)
    lease.start()
    return mailbox, lease, reader


async def test_a_pushed_stream_arrives_in_order_and_its_acknowledgements_settle_it(loopback: LoopbackBus) -> None:
    mailbox, lease, reader = await pushed_stream(30)
    batch = await reader.take(5.0)
    assert batch is not None and list(batch) == [f"item-{n}" for n in range(30)] and batch.first_seq == 1
    mailbox.push("late")
    batch = await reader.take(5.0)  # coming back: the first batch is written (acknowledged later)
    assert batch is not None and list(batch) == ["late"] and batch.first_seq == 31
    assert [seq for seq, _ in lease.unacked] == [1, 2]
    mailbox.close()
    assert await reader.take(5.0) is None and reader.end_reason == "ended"
    reader.release()  # says the last batch was written
    await asyncio.sleep(0)  # the release travels as a task
    await asyncio.sleep(0)
    assert lease.ended and not lease.unacked and mailbox.holder is None


async def test_a_release_still_on_its_way_is_waited_for_and_nothing_is_given_twice(
    loopback: LoopbackBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new reader asks for a stream whose last reader let it go a moment ago: the probe says
    "released" before that reader's Release (what it wrote) is served. The host waits for it
    instead of putting back what the client already has (before: the next reader got the
    written batch a second time; seen across three workers as a duplicated SSE event)."""
    held: list[tuple[str, Release]] = []
    post = loopback.post

    def hold_releases(worker_id: str, op: Any) -> None:
        if isinstance(op, Release):
            held.append((worker_id, op))
        else:
            post(worker_id, op)

    monkeypatch.setattr(loopback, "post", hold_releases)
    probed = asyncio.Event()
    reader_alive = gateway.serve._reader_alive

    async def probe(lease: gateway.serve.LeaseOnHost) -> bool | None:
        try:
            return await reader_alive(lease)
        finally:
            probed.set()

    monkeypatch.setattr(gateway.serve, "_reader_alive", probe)
    mailbox, lease, reader = await pushed_stream(3)
    batch = await reader.take(5.0)
    assert batch is not None and list(batch) == ["item-0", "item-1", "item-2"]
    reader.release()  # the batch it took is written; its Release is held on the way
    takeover = asyncio.ensure_future(gateway.serve.release_if_reader_gone(mailbox))
    await probed.wait()
    assert held and lease.unacked  # the batch is not acknowledged yet
    for worker_id, op in held:  # the Release arrives now
        post(worker_id, op)
    await takeover
    assert lease.ended and mailbox.holder is None
    assert len(mailbox) == 0  # nothing put back for the next reader


async def test_pushes_stop_at_the_credit_and_go_on_with_acknowledgements(loopback: LoopbackBus) -> None:
    mailbox, lease, reader = await pushed_stream(0)
    for n in range(PUSH_CREDIT_BATCHES + 5):  # one batch each: the pump runs between pushes
        mailbox.push(f"item-{n}")
        await asyncio.sleep(0)
        await asyncio.sleep(0)
    assert len(lease.unacked) == PUSH_CREDIT_BATCHES  # the rest waits in the stream
    assert len(mailbox) == 5
    taken = []
    while len(taken) < PUSH_CREDIT_BATCHES + 5:
        batch = await reader.take(5.0)
        assert batch is not None
        taken.extend(batch)
    assert taken == [f"item-{n}" for n in range(PUSH_CREDIT_BATCHES + 5)]
    lease.end()


async def test_what_a_lost_reader_did_not_acknowledge_goes_back_in_order(loopback: LoopbackBus) -> None:
    mailbox, lease, reader = await pushed_stream(0)
    for n in range(6):
        mailbox.push(f"item-{n}")
        await asyncio.sleep(0)
        await asyncio.sleep(0)
    first = await reader.take(5.0)
    assert first is not None and list(first) == ["item-0"]
    second = await reader.take(5.0)  # item-0 written; not acknowledged yet (coalesced)
    assert second is not None and list(second) == ["item-1"]
    reader._acknowledge()  # item-0's acknowledgement reaches the host
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert lease.unacked[0][0] == 2
    lease.end()  # the reader's worker died (its lease expired): nothing it did not confirm is lost
    assert mailbox.holder is None
    again = await mailbox.take(0)
    assert again is not None and list(again) == [f"item-{n}" for n in range(1, 6)] and again.first_seq == 2


# -- a send that landed but failed -------------------------------------------------------------


class LandsThenFails:
    """A channel layer whose sends reach `peer` and then fail the first `failures` times, as a
    Redis connection cut after the command ran: the sender cannot tell it landed."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.peer: Bus | None = None

    async def send(self, channel: str, message: dict[str, Any]) -> None:
        assert self.peer is not None
        self.peer._take(wire(message))
        if self.failures:
            self.failures -= 1
            from redis.exceptions import ConnectionError as RedisConnectionError

            raise RedisConnectionError("Connection closed by server.")


class UnlistenedBus(Bus):
    def ensure_listening(self) -> None:
        pass


async def test_a_call_whose_send_landed_but_failed_is_sent_again_and_served_once() -> None:
    caller, host = UnlistenedBus(), UnlistenedBus()
    to_host, to_caller = LandsThenFails(failures=1), LandsThenFails(failures=1)
    to_host.peer, to_caller.peer = host, caller
    caller.use(to_host)
    host.use(to_caller)
    served: list[str] = []

    async def serve_probe(op: Probe) -> Reply:
        served.append(op.lease)
        return Alive(True)

    host.handle(Probe, serve_probe)
    # The call lands twice (its send failed once after landing); so does the host's reply.
    assert await caller.call("0123456789ab", Probe("lease-1"), timeout=5) == Alive(True)
    assert served == ["lease-1"]  # served once
    assert to_host.failures == 0 and to_caller.failures == 0


async def test_a_send_that_keeps_failing_is_503_after_its_resends() -> None:
    bus = UnlistenedBus()
    layer = LandsThenFails(failures=10)
    layer.peer = UnlistenedBus()
    bus.use(layer)
    with pytest.raises(LayerUnavailable):
        await bus.send("acp.worker.x!inbox", {"type": "acp.push"})
    assert layer.failures == 10 - 1 - len(worker.RESEND_DELAYS)


async def test_a_push_that_arrives_twice_is_taken_once(loopback: LoopbackBus) -> None:
    reader = gateway.remote.RemoteStream("0123456789ab", "lease-twice")
    push = worker_protocol.Pushed("lease-twice", 1, 1, ("a", "b"))
    loopback._deliver_push(wire(worker_protocol.encode_push(push)))
    loopback._deliver_push(wire(worker_protocol.encode_push(push)))
    first = await reader.take(0.1)
    assert first is not None and list(first) == ["a", "b"]
    again = await reader.take(0.1)
    assert again is not None and list(again) == []  # a keep-alive's empty batch: nothing twice
    reader.release()


async def test_a_sockets_messages_go_unanswered_but_every_32nd_and_every_mebibyte(
    buses: tuple[LinkedBus, LinkedBus],
) -> None:
    """A message each way less per turn over a socket attached on another worker: the host
    answers one message in SOCKET_CREDIT_MESSAGES (or once SOCKET_CREDIT_BYTES wait), and that
    answer says every message before it reached the agent: it serves them in order."""
    _, host = buses
    served: list[str] = []
    all_served = asyncio.Event()
    answers = 0

    async def serve(op: SubmitOnSocket) -> Reply:
        served.append(op.text)
        if len(served) == 65:
            all_served.set()
        return SocketSubmitted(True)

    host.handle(SubmitOnSocket, serve)
    host_send = host.send

    async def counting_send(channel: str, message: dict[str, Any]) -> None:
        nonlocal answers
        answers += message.get("type") == "acp.result"
        await host_send(channel, message)

    host.send = counting_send  # type: ignore[method-assign]
    socket = gateway.remote.RemoteSocket(gateway.remote.RemoteHandle("0123456789ab", "c1.0123456789ab", ALICE), "s-1")
    for n in range(64):
        await socket.send_to_agent(f"m{n}")
    assert answers == 64 // gateway.remote.SOCKET_CREDIT_MESSAGES
    await socket.send_to_agent("x" * gateway.remote.SOCKET_CREDIT_BYTES)  # a mebibyte: answered at once
    await asyncio.wait_for(all_served.wait(), 5)
    assert served[:64] == [f"m{n}" for n in range(64)]  # in order
    assert answers == 64 // gateway.remote.SOCKET_CREDIT_MESSAGES + 1
