"""HttpClient, the stdio bridge and the terminal client resuming through our server when a proxy
(tests/cut_proxy.py) cuts the connection carrying a stream in the middle of a burst (the demo
agent's `stream N SIZE`): every chunk arrives exactly once and in order, on one worker and on
three workers behind a balancer, where the reconnect is sent to another worker than the one
the stream was read from."""

from __future__ import annotations

import asyncio
import random
import re
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pexpect
import pytest

from acp_channels.client import Backoff, HttpClient, ResumeRefusedError
from tests import forked
from tests.bridge_process import BridgeProcess, text_updates
from tests.cluster import Cluster
from tests.conftest import SHAPES, start_server
from tests.cut_proxy import CutProxy, ThreadedCutProxy, Where, session_stream, streams, websocket
from tests.live import ROOT, DaphneServer
from tests.peers.resumable import EventLog

pytestmark = pytest.mark.timeout(120)

#: Quick retries, and long enough before giving up for a loaded machine.
RETRY = Backoff(initial=0.05, maximum=0.5, give_up_after=30.0)
STEP = 30.0
TRANSPORTS = ["http", "ws"]


def chunk(index: int, count: int, size: int) -> str:
    """The demo agent's `stream` chunk number `index` (see demo_project/agent.py)."""
    label = f"{index:0{len(str(max(count - 1, 0)))}d}:"
    return label + "x" * (size - len(label))


def expected_chunks(count: int, size: int) -> list[str]:
    return [chunk(index, count, size) for index in range(count)]


#: The window must cover what a cut leaves in flight (docs/resumable-streams.md). On loopback, with
#: the kernel's buffers autotuned (up to 32 MB here) and a client slowed by a loaded machine, that
#: passed the default 2 MiB once the server streamed faster (one 409 in four suite runs): the
#: burst tests run with a window of 4 MiB (and the budget it needs, twice that).
BURST_SETTINGS: dict[str, str] = {
    "ACP_MAX_BUFFERED_BYTES": str(8 * 2**20),
    "ACP_REPLAY_WINDOW_BYTES": str(4 * 2**20),
    "ACP_REPLAY_WINDOW_EVENTS": "65536",
}


@pytest.fixture(scope="module", params=SHAPES)
def burst_server(request: pytest.FixtureRequest) -> Iterator[DaphneServer | Cluster]:
    """The demo agent, with the default replay window."""
    server = start_server(request.param, BURST_SETTINGS, request)
    yield server
    server.stop()


def first_worker(server: DaphneServer | Cluster) -> int:
    return server.workers[0].port if isinstance(server, Cluster) else server.port


@pytest.fixture
async def proxy(demo_server: DaphneServer | Cluster) -> AsyncIterator[CutProxy]:
    """A cut proxy in front of the demo server; for three workers, in front of the first one
    (a test sends reconnects elsewhere with `to_another_worker`)."""
    async with CutProxy(first_worker(demo_server)) as cut_proxy:
        yield cut_proxy


@pytest.fixture
async def burst_proxy(burst_server: DaphneServer | Cluster) -> AsyncIterator[CutProxy]:
    async with CutProxy(first_worker(burst_server)) as cut_proxy:
        yield cut_proxy


def to_another_worker(server: DaphneServer | Cluster, proxy: CutProxy) -> None:
    """From now on, new connections go to the next worker (one worker: the same one)."""
    if isinstance(server, Cluster):
        ports = [worker.port for worker in server.workers]
        current = proxy.upstreams[0]
        proxy.route_to(ports[(ports.index(current) + 1) % len(ports)])


async def reply_to(client: HttpClient, request_id: int, chunks: list[str] | None = None) -> dict[str, Any]:
    """Messages until the reply to `request_id`; agent text chunks go to `chunks`."""
    while True:
        async with asyncio.timeout(STEP):
            message = await client.receive()
        assert message is not None, "the client was closed"
        if message.get("id") == request_id and "method" not in message:
            return message
        update = message.get("params", {}).get("update", {}) if message.get("method") == "session/update" else {}
        if update.get("sessionUpdate") == "agent_message_chunk" and chunks is not None:
            chunks.append(update["content"]["text"])


async def open_session(client: HttpClient) -> str:
    await client.send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}})
    init = await reply_to(client, 0)
    advertised = init["result"]["_meta"]["acp-channels/resume"]
    assert advertised["sse" if client.kind == "http" else "websocket"] is True, advertised
    await client.send({"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": {"cwd": "/", "mcpServers": []}})
    session_id: str = (await reply_to(client, 1))["result"]["sessionId"]
    return session_id


async def prompt(client: HttpClient, session_id: str, request_id: int, text: str) -> list[str]:
    """The agent's text chunks of one turn (it must end normally)."""
    params = {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]}
    await client.send({"jsonrpc": "2.0", "id": request_id, "method": "session/prompt", "params": params})
    chunks: list[str] = []
    reply = await reply_to(client, request_id, chunks)
    assert reply.get("result") == {"stopReason": "end_turn"}, reply
    return chunks


def carrying(transport: str, session_id: str) -> Where:
    """The connection that carries the session's updates: its SSE stream, or the WebSocket."""
    return session_stream(session_id) if transport == "http" else websocket


def named(transport: str, session_id: str) -> str:
    """What `ReconnectEvent.what` calls it."""
    return f"session stream {session_id!r}" if transport == "http" else "WebSocket"


# ---------------------------------------------------------------------------------- HttpClient


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_cut_mid_burst_loses_and_repeats_nothing(
    burst_server: DaphneServer | Cluster, burst_proxy: CutProxy, transport: str
) -> None:
    seen = EventLog()
    client = HttpClient(burst_proxy.endpoint(transport), reconnect=RETRY, on_reconnect=seen)
    try:
        session_id = await open_session(client)
        to_another_worker(burst_server, burst_proxy)
        cut = burst_proxy.cut_after(60_000, carrying(transport, session_id))
        assert await prompt(client, session_id, 2, "stream 2000 64") == expected_chunks(2000, 64)
        cut_connection = await asyncio.wait_for(cut, STEP)
        resumed = burst_proxy.live(carrying(transport, session_id))
        assert resumed and resumed[-1].request is not None
        assert resumed[-1].request.headers["last-event-id"]  # it named the last message it got
        if transport == "ws":
            assert resumed[-1].request.headers["acp-connection-id"] == client.connection_id
        assert resumed[-1].upstream == burst_proxy.upstreams[0]
        if isinstance(burst_server, Cluster):
            assert resumed[-1].upstream != cut_connection.upstream  # read on another worker
        assert seen.kinds(named(transport, session_id)) == ["reconnecting", "resumed"]
        # The connection goes on as usual.
        assert await prompt(client, session_id, 3, "echo still here") == ["still here"]
    finally:
        await client.close()
    assert client.error is None
    assert not burst_server.errors()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_twenty_random_cuts_during_a_long_stream_lose_nothing(
    burst_server: DaphneServer | Cluster, burst_proxy: CutProxy, transport: str
) -> None:
    generator = random.Random(12)
    seen = EventLog()
    client = HttpClient(burst_proxy.endpoint(transport), reconnect=RETRY, on_reconnect=seen)

    async def cut_twenty_times(session_id: str) -> int:
        for _ in range(20):
            to_another_worker(burst_server, burst_proxy)
            await burst_proxy.cut_after(generator.randrange(5_000, 150_000), carrying(transport, session_id))
        return 20

    try:
        session_id = await open_session(client)
        cutting = asyncio.create_task(cut_twenty_times(session_id))
        try:
            chunks = await prompt(client, session_id, 2, "stream 20000 64")
        finally:
            cutting.cancel()
        assert chunks == expected_chunks(20000, 64)
        assert cutting.done() and not cutting.cancelled(), "the stream ended before 20 cuts"
    finally:
        await client.close()
    kinds = seen.kinds(named(transport, session_id))
    assert kinds.count("resumed") == 20 and "gave-up" not in kinds
    assert not burst_server.errors()


async def test_a_cut_while_idle_is_resumed_on_both_streams(
    demo_server: DaphneServer | Cluster, proxy: CutProxy
) -> None:
    """Connection and session stream cut at once, the server side left open (it still believes
    its readers are attached): the resuming GETs take the streams over."""
    seen = EventLog()
    client = HttpClient(proxy.url, reconnect=RETRY, on_reconnect=seen)
    try:
        session_id = await open_session(client)
        assert await prompt(client, session_id, 2, "echo one") == ["one"]
        to_another_worker(demo_server, proxy)
        assert proxy.cut(streams, keep_upstream=True) == 2
        assert await prompt(client, session_id, 3, "stream 50 16") == expected_chunks(50, 16)
        assert sorted(seen.kinds()) == ["reconnecting"] * 2 + ["resumed"] * 2
        assert not client.reconnecting
    finally:
        await client.close()


async def test_the_connection_gone_is_fatal_or_restarted(demo_server: DaphneServer | Cluster, proxy: CutProxy) -> None:
    """The connection deleted on the server: without `restart` the client fails saying so; with
    it, a new connection is initialized and the session load is tried (the demo agent keeps its
    sessions per connection, so it reports the session as not loaded)."""

    async def delete(connection_id: str) -> None:
        async with httpx.AsyncClient() as http:
            response = await http.delete(proxy.url, headers={"Acp-Connection-Id": connection_id})
            assert response.status_code == 202

    plain = HttpClient(proxy.url, reconnect=RETRY)
    try:
        await open_session(plain)
        assert plain.connection_id is not None
        await delete(plain.connection_id)
        with pytest.raises(ResumeRefusedError, match="not restarting: restart is off"):
            async with asyncio.timeout(STEP):
                await plain.receive()
    finally:
        await plain.close()

    seen = EventLog()
    restarting = HttpClient(proxy.url, reconnect=RETRY, restart=True, on_reconnect=seen)
    try:
        session_id = await open_session(restarting)
        first = restarting.connection_id
        assert first is not None
        await delete(first)
        restarted = await seen.wait_for("restarted")
        assert restarted.previous_connection_id == first and restarted.connection_id == restarting.connection_id
        assert restarted.sessions_loaded == () and [lost for lost, _ in restarted.sessions_lost] == [session_id]
        await restarting.send(
            {"jsonrpc": "2.0", "id": 5, "method": "session/new", "params": {"cwd": "/", "mcpServers": []}}
        )
        new_session = (await reply_to(restarting, 5))["result"]["sessionId"]
        assert await prompt(restarting, new_session, 6, "echo on the new connection") == ["on the new connection"]
    finally:
        await restarting.close()


# ---------------------------------------------------------------------------------- the bridge


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_bridge_keeps_the_editors_stream_intact_across_a_cut(
    burst_server: DaphneServer | Cluster, burst_proxy: CutProxy, tmp_path: Path, transport: str
) -> None:
    async with BridgeProcess(burst_proxy.endpoint(transport)) as bridge:
        await bridge.initialize()
        session_id = await bridge.new_session(str(tmp_path))
        to_another_worker(burst_server, burst_proxy)
        cut = burst_proxy.cut_after(60_000, carrying(transport, session_id))
        reply, before = await bridge.prompt(session_id, "stream 2000 64")
        assert reply["result"] == {"stopReason": "end_turn"}
        assert text_updates(before) == expected_chunks(2000, 64)
        await asyncio.wait_for(cut, STEP)
        what = re.escape(named(transport, session_id))
        await bridge.stderr_line(rf"reconnecting… \({what}, attempt 1\)")
        await bridge.stderr_line(rf"resumed the {what}: nothing lost")
        reply, before = await bridge.prompt(session_id, "echo after the cut")
        assert text_updates(before) == ["after the cut"]
        await bridge.close_stdin()
        assert await bridge.wait() == 0


async def test_the_bridge_with_no_reconnect_ends_at_a_cut(proxy: CutProxy, tmp_path: Path) -> None:
    async with BridgeProcess(proxy.url, "--no-reconnect") as bridge:
        await bridge.initialize()
        session_id = await bridge.new_session(str(tmp_path))
        prompt = {"sessionId": session_id, "prompt": [{"type": "text", "text": "wait_for_cancel"}]}
        waiting = await bridge.request("session/prompt", prompt)
        # The prompt is POSTed once its session stream is open.
        await proxy.wait_for(
            lambda: any(r.method == "POST" and r.session_id for c in proxy.connections for r in c.requests)
        )
        assert proxy.cut(session_stream(session_id)) == 1
        answer = await bridge.reply_to(waiting, collect=[])
        assert answer["error"]["data"] == {"acpBridge": "remote-lost"}
        assert "SSE stream ended" in answer["error"]["message"]
        assert await bridge.wait() == 1
    assert "reconnecting" not in bridge.stderr


# ------------------------------------------------------------------------------ the terminal


#: The terminal client's prompt: prompt_toolkit draws "> " as ">", backspace, two columns right.
TERMINAL_PROMPT = r">( |\x08\x1b\[2C)"


@pytest.fixture
def threaded_proxy(demo_server: DaphneServer | Cluster) -> Iterator[ThreadedCutProxy]:
    proxy = ThreadedCutProxy(first_worker(demo_server))
    with proxy:
        yield proxy


def test_the_terminal_says_reconnecting_then_resumed(threaded_proxy: ThreadedCutProxy) -> None:
    assert threaded_proxy.proxy is not None
    child = forked.TerminalChild(
        sys.executable,
        ["-m", "acp_channels.client", threaded_proxy.proxy.url, "--no-history"],
        cwd=str(ROOT),
        encoding="utf-8",
        timeout=STEP,
        dimensions=(50, 200),
    )
    try:
        child.expect(TERMINAL_PROMPT)
        child.send("echo before\r")
        child.expect(r"\[end_turn\]")
        child.expect(TERMINAL_PROMPT)
        assert threaded_proxy.cut(streams) == 2
        child.expect(r"\[reconnecting…\] (connection|session) stream")
        child.expect(r"\[resumed\] nothing was lost")
        child.send("echo after\r")
        child.expect("after")
        child.expect(r"\[end_turn\]")
        child.send("/quit\r")
        child.expect("Disconnected.")
        child.expect(pexpect.EOF)
    finally:
        if child.isalive():
            child.terminate(force=True)
    child.close()
    assert child.exitstatus == 0
