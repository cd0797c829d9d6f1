"""Shared sessions in process (no server): attachments get what a session kept, then live, once;
the rules between the clients (first permission answer wins, client-side requests to the
prompting client, prompts refused during a shared turn, observers refused, a client that does not
read cut off, terminate said to everyone); detached connections (a full budget pauses the agent
for the own client's grace, then drops the oldest unread output while nobody is attached,
unanswered permission requests cancelled after PERMISSION_TIMEOUT_SECONDS, the detached quota).
The live counterparts: test_attach_live.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from acp_channels import _protocol as protocol
from acp_channels._gateway.local import open_attachment_here
from acp_channels._host import ConnectionHost, registry
from acp_channels._host.attachments import expire_permissions
from acp_channels._identity import Principal
from acp_channels._protocol import Frame, Single
from acp_channels._worker import new_connection_id
from acp_channels.errors import NoSuchSession, QuotaExceeded, TooManyAttachments
from tests.live import rpc

TIMEOUT = 5.0
ALICE = Principal("token", "alice", "alice")
SESSION = "s1"


class ScriptAgent:
    """An agent the test speaks for: it answers initialize and session/new itself, records what
    it receives, and says what the test makes it say."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self._out: asyncio.Queue[Frame | None] = asyncio.Queue()
        self.got = asyncio.Event()
        self._all_taken = asyncio.Event()
        #: Set each time the host takes a message.
        self.handed = asyncio.Event()

    async def send(self, frame: Frame) -> None:
        for message in protocol.frame_messages(frame):
            self.received.append(message)
            self.got.set()
            if message.get("method") == "initialize":
                result = {"protocolVersion": 1, "agentCapabilities": {}, "agentInfo": {"name": "script"}}
                self.say({"jsonrpc": "2.0", "id": message["id"], "result": result})
            elif message.get("method") == "session/new":
                self.say({"jsonrpc": "2.0", "id": message["id"], "result": {"sessionId": SESSION}})

    async def receive(self) -> Frame | None:
        frame = await self._out.get()
        self.handed.set()
        if self._out.empty():
            self._all_taken.set()  # its waiter runs after the host routed this frame
        return frame

    async def close(self) -> None:
        self._out.put_nowait(None)

    def say(self, message: dict[str, Any]) -> None:
        self._all_taken.clear()
        self._out.put_nowait(Single(message))

    @property
    def waiting(self) -> int:
        """What it said that the host has not taken yet."""
        return self._out.qsize()

    async def all_taken(self) -> None:
        """Return once the host took (and routed) everything it said."""
        await asyncio.wait_for(self._all_taken.wait(), TIMEOUT)

    async def wait_for(self, predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        async with asyncio.timeout(TIMEOUT):
            while True:
                for message in self.received:
                    if predicate(message):
                        return message
                self.got.clear()
                await self.got.wait()


def update(n: int) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {"sessionId": SESSION, "update": {"sessionUpdate": "agent_message_chunk", "n": n}},
    }


def permission_request(request_id: int) -> dict[str, Any]:
    params = {"sessionId": SESSION, "toolCall": {"toolCallId": "t"}, "options": []}
    return {"jsonrpc": "2.0", "id": request_id, "method": "session/request_permission", "params": params}


def plan(message: dict[str, Any], session: str | None = None) -> protocol.InboundPlan:
    return protocol.plan_inbound(protocol.parse_frame(json.dumps(message)), session)


@pytest.fixture(autouse=True)
def detached_settings(settings: Any) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "DETACHED_SECONDS": 3600.0}


class Session:
    """A host connection with a session, its agent, and the attachments made in the test."""

    def __init__(self, host: ConnectionHost, agent: ScriptAgent) -> None:
        self.host = host
        self.agent = agent
        self.made: list[ConnectionHost] = [host]

    async def attach(self, role: str = "controller", transport: str = "http") -> ConnectionHost:
        opened = open_attachment_here(
            transport,  # type: ignore[arg-type]
            ALICE,
            None,
            new_connection_id(),
            self.host.connection_id,
            SESSION,
            "observer" if role == "observer" else "controller",
        )
        attachment = opened.host
        self.made.append(attachment)
        reply = await attachment.initialize(Single(rpc("i", "initialize", {"protocolVersion": 1})), "i")
        assert reply.accepted
        return attachment


@pytest.fixture
async def shared() -> AsyncIterator[Session]:
    agent = ScriptAgent()
    host = registry.create(
        lambda _: agent, "http", connection_id=new_connection_id(), max_buffered_bytes=64 * 1024, principal=ALICE
    )
    await host.initialize(Single(rpc(0, "initialize", {"protocolVersion": 1})), 0)
    await host.submit(plan(rpc(1, "session/new", {"cwd": "/", "mcpServers": []})))
    lease = host.lease(None)
    (created,) = await lease.take(TIMEOUT) or []
    lease.release()
    assert json.loads(created)["result"]["sessionId"] == SESSION
    session = Session(host, agent)
    yield session
    for made in reversed(session.made):
        await made.terminate()


async def read(host: ConnectionHost, count: int, key: str | None = SESSION) -> list[dict[str, Any]]:
    """The next `count` messages of a stream."""
    lease = host.lease(key)
    taken: list[dict[str, Any]] = []
    try:
        async with asyncio.timeout(TIMEOUT):
            while len(taken) < count:
                batch = await lease.take(TIMEOUT)
                assert batch is not None, "the stream ended"
                taken += [json.loads(item) for item in batch]
    finally:
        lease.release()
    assert len(taken) == count, taken
    return taken


async def test_an_attachment_gets_what_the_session_kept_then_live_once(shared: Session) -> None:
    for n in range(3):
        shared.agent.say(update(n))
    assert [message["params"]["update"]["n"] for message in await read(shared.host, 3)] == [0, 1, 2]
    shared.agent.say(update(3))  # unread by the host's own client
    await shared.agent.all_taken()
    attachment = await shared.attach()
    shared.agent.say(update(4))
    got = await read(attachment, 5)
    assert [message["params"]["update"]["n"] for message in got] == [0, 1, 2, 3, 4]


async def test_the_first_answer_to_a_permission_request_wins(shared: Session) -> None:
    attachment = await shared.attach()
    shared.agent.say(permission_request(9))
    (asked,) = await read(attachment, 1)
    assert asked["id"] == 9 and asked["method"] == "session/request_permission"
    (own,) = await read(shared.host, 1)
    assert own["id"] == 9
    allow = {"jsonrpc": "2.0", "id": 9, "result": {"outcome": {"outcome": "selected", "optionId": "allow"}}}
    await attachment.submit(plan(allow, SESSION))
    answer = await shared.agent.wait_for(lambda message: message.get("id") == 9 and "result" in message)
    assert answer["result"]["outcome"]["optionId"] == "allow"
    (resolved,) = await read(shared.host, 1)
    assert resolved == {
        "jsonrpc": "2.0",
        "method": "_acp-channels/session/permission_resolved",
        "params": {"sessionId": SESSION, "requestId": 9, "outcome": {"outcome": "selected", "optionId": "allow"}},
    }
    late = {"jsonrpc": "2.0", "id": 9, "result": {"outcome": {"outcome": "selected", "optionId": "reject"}}}
    before = len(shared.agent.received)
    await shared.host.submit(plan(late, SESSION))
    assert len(shared.agent.received) == before  # dropped: the agent had its answer


async def test_client_side_requests_go_to_the_client_whose_prompt_runs(shared: Session) -> None:
    attachment = await shared.attach()
    await attachment.submit(plan(rpc(5, "session/prompt", {"sessionId": SESSION, "prompt": []}), SESSION))
    forwarded = await shared.agent.wait_for(lambda message: message.get("method") == "session/prompt")
    assert str(forwarded["id"]).startswith("acp-channels/attachment/")  # its id, made unique
    read_file = rpc(11, "fs/read_text_file", {"sessionId": SESSION, "path": "/x"})
    shared.agent.say(read_file)
    (asked,) = await read(attachment, 1)
    assert asked["method"] == "fs/read_text_file"
    shared.agent.say(update(1))
    (only,) = await read(shared.host, 1)
    assert only["method"] == "session/update"  # the host's own client never saw the fs request
    shared.agent.say({"jsonrpc": "2.0", "id": forwarded["id"], "result": {"stopReason": "end_turn"}})
    (_, answered) = await read(attachment, 2)
    assert answered == {"jsonrpc": "2.0", "id": 5, "result": {"stopReason": "end_turn"}}  # under its own id
    (ended,) = await read(shared.host, 1)
    assert ended["method"] == "_acp-channels/session/turn_ended"
    assert ended["params"] == {"sessionId": SESSION, "stopReason": "end_turn"}


async def test_a_prompt_during_a_shared_turn_and_an_observers_prompt_are_refused(shared: Session) -> None:
    observer = await shared.attach("observer")
    await shared.host.submit(plan(rpc(2, "session/prompt", {"sessionId": SESSION, "prompt": []}), SESSION))
    await shared.agent.wait_for(lambda message: message.get("id") == 2)
    await shared.host.submit(plan(rpc(3, "session/prompt", {"sessionId": SESSION, "prompt": []}), SESSION))
    (refused,) = await read(shared.host, 1)
    assert refused["id"] == 3 and refused["error"]["code"] == -32012
    await observer.submit(plan(rpc(4, "session/cancel", {"sessionId": SESSION}), SESSION))
    (watched,) = await read(observer, 1)
    assert watched["id"] == 4 and watched["error"]["code"] == -32011
    assert not any(message.get("id") in (3, 4) for message in shared.agent.received)


async def test_the_agent_goes_on_for_an_attachment_when_the_own_client_is_gone(shared: Session) -> None:
    """The connection's own client left; another client attached: the host's own streams keep
    only what fits, and the attachment gets everything."""
    attachment = await shared.attach()
    lease = attachment.lease(SESSION)
    got: list[int] = []
    for n in range(3000):  # ~400 KB through a 64 KiB budget nobody reads on the host's side
        shared.agent.say(update(n))
    async with asyncio.timeout(TIMEOUT):
        while len(got) < 3000:
            got += [json.loads(item)["params"]["update"]["n"] for item in await lease.take(TIMEOUT) or []]
    lease.release()
    assert got == list(range(3000))


async def test_a_client_that_does_not_read_is_cut_off(shared: Session, settings: Any) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "MAX_BUFFERED_BYTES": 16 * 1024}
    attachment = await shared.attach()
    tap = shared.host.shared.taps[SESSION][0] if shared.host.shared is not None else None
    assert tap is not None
    for n in range(2000):  # nobody reads the attachment, whose own budget fills: its tap's queue grows
        shared.agent.say(update(n))
    await attachment.ended.wait()
    assert shared.host.shared is not None and SESSION not in shared.host.shared.taps
    assert not shared.host.ended.is_set()


async def test_terminating_tells_every_attachment(shared: Session) -> None:
    attachment = await shared.attach()
    await shared.host.terminate()
    (notice,) = await read(attachment, 1)
    assert notice["method"] == "_acp-channels/session/terminated"
    assert notice["params"] == {"sessionId": SESSION, "connectionId": shared.host.connection_id}
    await attachment.ended.wait()


async def test_attach_refusals(shared: Session, settings: Any) -> None:
    with pytest.raises(NoSuchSession):
        open_attachment_here("http", ALICE, None, new_connection_id(), shared.host.connection_id, "other", "controller")
    with pytest.raises(NoSuchSession):
        open_attachment_here("http", ALICE, None, new_connection_id(), "gone.000000000000", SESSION, "controller")
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "MAX_ATTACHMENTS_PER_SESSION": 1}
    await shared.attach()
    with pytest.raises(TooManyAttachments):
        await shared.attach()


async def until(agent: ScriptAgent, condition: Callable[[], bool]) -> None:
    """Wait until `condition` holds, looking again each time the host takes a message from
    `agent` (it routes it before the waiter runs)."""
    async with asyncio.timeout(TIMEOUT):
        while not condition():
            agent.handed.clear()
            await agent.handed.wait()


def numbers_in(items: list[tuple[int, str]] | list[str]) -> list[int]:
    texts = [item[1] if isinstance(item, tuple) else item for item in items]
    return [json.loads(text)["params"]["update"]["n"] for text in texts if "session/update" in text]


BUDGET = 64 * 1024  # the fixture's


async def test_a_full_budget_pauses_the_agent_while_the_own_clients_grace_runs(shared: Session, settings: Any) -> None:
    """The own client's stream dropped a moment ago: the agent waits for it as for a slow reader,
    and the reader that comes back gets everything (a drop within IDLE_TIMEOUT_SECONDS used to
    lose the window and the oldest output at once: 409 on the resume)."""
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "IDLE_TIMEOUT_SECONDS": 3600.0}
    for n in range(3000):  # ~400 KB for a 64 KiB budget
        shared.agent.say(update(n))
    await until(shared.agent, lambda: shared.host.buffered_bytes >= BUDGET)
    assert numbers_in(shared.host.stream(SESSION).kept_since())[0] == 0  # nothing dropped
    got = await read(shared.host, 3000)  # the client is back
    assert [message["params"]["update"]["n"] for message in got] == list(range(3000))


async def test_past_the_own_clients_grace_the_oldest_unread_output_goes_and_the_agent_goes_on(
    shared: Session, settings: Any
) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "IDLE_TIMEOUT_SECONDS": 0.3}
    loop = asyncio.get_running_loop()
    left = shared.host.own_client.requested()
    for n in range(3000):
        shared.agent.say(update(n))
    await shared.agent.all_taken()  # the paused agent is woken at the grace's end; nobody reads
    assert loop.time() - left >= 0.29  # it waited for the client first (the clock may round)
    numbers = numbers_in(shared.host.stream(SESSION).kept_since())
    assert numbers[-1] == 2999 and numbers[0] > 0 and numbers == list(range(numbers[0], 3000))  # the newest, in order
    assert shared.host.buffered_bytes <= BUDGET + 200
    # With a reader of its own attached (any stream), nothing is dropped: the agent waits for it.
    lease = shared.host.lease(None)
    for n in range(3000, 6000):
        shared.agent.say(update(n))
    await until(shared.agent, lambda: shared.host.buffered_bytes >= BUDGET)
    for _ in range(200):  # the router had its chances to take more
        await asyncio.sleep(0)
    assert shared.agent.waiting > 2900 and numbers_in(shared.host.stream(SESSION).kept_since())[0] == numbers[0]
    lease.release()


async def test_a_client_attaching_wakes_an_agent_paused_for_the_own_client(shared: Session, settings: Any) -> None:
    """Within the own client's grace the agent waits; another client attaching and following the
    session lets it go on at once, at that client's pace (not at the grace's end)."""
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "IDLE_TIMEOUT_SECONDS": 3600.0}
    for n in range(3000):
        shared.agent.say(update(n))
    await until(shared.agent, lambda: shared.host.buffered_bytes >= BUDGET)
    attachment = await shared.attach()
    lease = attachment.lease(SESSION)
    got: list[int] = []
    async with asyncio.timeout(TIMEOUT):
        while len(got) < 3000:
            got += numbers_in(list(await lease.take(TIMEOUT) or []))
    lease.release()
    assert got == list(range(3000))


async def test_a_dropped_socket_pauses_the_agent_for_its_grace_then_lets_it_go_on(settings: Any) -> None:
    """WebSocket: WEBSOCKET_RESUME_SECONDS is the own client's grace. Within it a reattaching
    socket gets every message after the last it had; past it the agent goes on and the oldest
    unread output goes."""
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "WEBSOCKET_RESUME_SECONDS": 3600.0}
    agent = ScriptAgent()
    host = registry.create(
        lambda _: agent, "websocket", connection_id=new_connection_id(), max_buffered_bytes=BUDGET, principal=ALICE
    )
    try:
        host.start()
        outbox = host.socket_outbox
        outbox.release(outbox.first_holder)  # the socket dropped before reading anything
        for n in range(3000):
            agent.say(update(n))
        await until(agent, lambda: host.buffered_bytes >= BUDGET)
        holder = object()
        host.attach_socket(0, holder)  # back, within the grace: from the first message on
        got: list[int] = []
        while len(got) < 3000:
            batch = await outbox.take(TIMEOUT, holder=holder)
            assert batch is not None
            got += numbers_in(list(batch))
        assert got == list(range(3000))
        settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "WEBSOCKET_RESUME_SECONDS": 0.3}
        outbox.release(holder)  # gone again, with a short grace now
        dropped = asyncio.get_running_loop().time()
        for n in range(3000, 6000):
            agent.say(update(n))
        await agent.all_taken()
        assert asyncio.get_running_loop().time() - dropped >= 0.29
        numbers = numbers_in(outbox.kept_since())
        assert numbers[-1] == 5999 and numbers[0] > 3000 and numbers == list(range(numbers[0], 6000))
    finally:
        await host.terminate()


async def test_an_unanswered_permission_request_is_cancelled_when_nobody_comes(shared: Session, settings: Any) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "PERMISSION_TIMEOUT_SECONDS": 10.0}
    shared.agent.say(permission_request(7))
    await shared.agent.all_taken()
    await expire_permissions(shared.host, 100.0)  # nobody attached since now
    await expire_permissions(shared.host, 105.0)
    assert not any(message.get("id") == 7 for message in shared.agent.received)  # not yet
    await expire_permissions(shared.host, 110.0)
    answer = await shared.agent.wait_for(lambda message: message.get("id") == 7)
    assert answer["result"] == {"outcome": {"outcome": "cancelled"}}
    _, resolved = await read(shared.host, 2)  # the request, then what became of it
    assert resolved["method"] == "_acp-channels/session/permission_resolved"
    assert resolved["params"]["outcome"] == {"outcome": "cancelled"}


async def test_someone_attached_keeps_a_permission_request_waiting(shared: Session, settings: Any) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "PERMISSION_TIMEOUT_SECONDS": 10.0}
    lease = shared.host.lease(SESSION)
    shared.agent.say(permission_request(8))
    await shared.agent.all_taken()
    for now in (100.0, 200.0, 300.0):
        await expire_permissions(shared.host, now)
    assert not any(message.get("id") == 8 for message in shared.agent.received)
    lease.release()


async def test_the_detached_quota_counts_connections_only_detached_seconds_keep(shared: Session, settings: Any) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "MAX_DETACHED_PER_PRINCIPAL": 1, "IDLE_TIMEOUT_SECONDS": 0.01}
    shared.host.last_active -= 1.0  # idle past IDLE_TIMEOUT_SECONDS, nobody attached
    with pytest.raises(QuotaExceeded, match="nobody is attached"):
        registry.create(
            lambda _: ScriptAgent(), "http", connection_id=new_connection_id(), max_buffered_bytes=1024, principal=ALICE
        )
    lease = shared.host.lease(None)  # someone comes back: it no longer counts
    other = registry.create(
        lambda _: ScriptAgent(), "http", connection_id=new_connection_id(), max_buffered_bytes=1024, principal=ALICE
    )
    shared.made.append(other)
    lease.release()
