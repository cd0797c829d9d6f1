"""The demo agent driven in-process through the official SDK over linked memory transports."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from acp import PROTOCOL_VERSION, RequestError, connect_to_agent, text_block
from acp._transport import memory_transport_pair
from acp.connection import StreamDirection, StreamEvent
from acp.core import AgentSideConnection, ClientSideConnection
from acp.schema import (
    AgentMessageChunk,
    AgentPlanUpdate,
    AllowedOutcome,
    ClientCapabilities,
    CurrentModeUpdate,
    DeniedOutcome,
    FileSystemCapabilities,
    InitializeResponse,
    PermissionOption,
    PromptResponse,
    ReadTextFileResponse,
    RequestPermissionResponse,
    ToolCallProgress,
    ToolCallStart,
    ToolCallUpdate,
    UserMessageChunk,
    WriteTextFileResponse,
)

from demo_project.agent import AGENT_NAME, HELP_TEXT, HISTORY_CHARS, DemoAgent, DemoSession, create_agent

pytestmark = pytest.mark.asyncio

CWD = "/tmp/demo"


class RecordingClient:
    """ACP client that records updates, answers permissions with `choice` and serves fs from a dict.

    choice: an optionId to select, "deny" for a cancelled outcome, or "hold" to never answer.
    """

    def __init__(self, choice: str = "allow", files: dict[str, str] | None = None) -> None:
        self.choice = choice
        self.files = dict(files or {})
        self.updates: list[tuple[str, Any]] = []
        self.first_update = asyncio.Event()
        self.permission_requests: list[tuple[ToolCallUpdate, list[PermissionOption]]] = []
        self.permission_asked = asyncio.Event()

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append((session_id, update))
        self.first_update.set()

    async def request_permission(
        self, session_id: str, tool_call: ToolCallUpdate, options: list[PermissionOption], **kwargs: Any
    ) -> RequestPermissionResponse:
        self.permission_requests.append((tool_call, options))
        self.permission_asked.set()
        if self.choice == "hold":
            await asyncio.Event().wait()  # abandoned by the agent on session/cancel
        if self.choice == "deny":
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=self.choice))

    async def read_text_file(
        self, session_id: str, path: str, line: int | None = None, limit: int | None = None, **kwargs: Any
    ) -> ReadTextFileResponse:
        if path not in self.files:
            raise RequestError.resource_not_found(path)
        return ReadTextFileResponse(content=self.files[path])

    async def write_text_file(self, session_id: str, path: str, content: str, **kwargs: Any) -> WriteTextFileResponse:
        self.files[path] = content
        return WriteTextFileResponse()

    def texts(self, session_id: str | None = None) -> list[str]:
        """Text of every agent_message_chunk (optionally of one session), in order."""
        return [
            u.content.text
            for sid, u in self.updates
            if isinstance(u, AgentMessageChunk) and (session_id is None or sid == session_id)
        ]


@dataclass
class Harness:
    conn: ClientSideConnection
    client: RecordingClient
    init: InitializeResponse
    prompt_sent: asyncio.Event  # set once a session/prompt request has left the client

    async def new_session(self, cwd: str = CWD) -> str:
        return (await self.conn.new_session(cwd=cwd)).session_id

    async def prompt(self, session_id: str, text: str) -> PromptResponse:
        return await self.conn.prompt(session_id=session_id, prompt=[text_block(text)])


@asynccontextmanager
async def connected(
    client: RecordingClient | None = None, *, fs: bool = True, protocol_version: int = PROTOCOL_VERSION
) -> AsyncIterator[Harness]:
    client = client or RecordingClient()
    agent_end, client_end = memory_transport_pair()
    # Same construction as the host uses.
    agent_conn = AgentSideConnection(create_agent(), agent_end, listening=False, use_unstable_protocol=True)
    agent_task = asyncio.create_task(agent_conn.listen())
    prompt_sent = asyncio.Event()

    def observe(event: StreamEvent) -> None:
        if event.direction is StreamDirection.OUTGOING and event.message.get("method") == "session/prompt":
            prompt_sent.set()

    conn = connect_to_agent(client, client_end, use_unstable_protocol=True, observers=[observe])
    try:
        caps = ClientCapabilities(fs=FileSystemCapabilities(read_text_file=fs, write_text_file=fs))
        init = await conn.initialize(protocol_version=protocol_version, client_capabilities=caps)
        yield Harness(conn, client, init, prompt_sent)
    finally:
        await conn.close()  # EOF for the agent side, which ends listen()
        await agent_task
        await agent_conn.close()


# ------------------------------------------------------------------ initialize / auth


async def test_create_agent_returns_fresh_instances() -> None:
    first, second = create_agent(), create_agent()
    assert isinstance(first, DemoAgent)
    assert first is not second


async def test_initialize_advertises_capabilities() -> None:
    async with connected() as h:
        assert h.init.protocol_version == PROTOCOL_VERSION
        caps = h.init.agent_capabilities
        assert caps is not None and caps.load_session is True
        session_caps = caps.session_capabilities
        assert session_caps is not None
        assert None not in (session_caps.list, session_caps.fork, session_caps.resume, session_caps.close)
        assert h.init.agent_info is not None and h.init.agent_info.name == AGENT_NAME


@pytest.mark.parametrize(("requested", "expected"), [(0, 0), (PROTOCOL_VERSION + 5, PROTOCOL_VERSION)])
async def test_initialize_negotiates_protocol_version(requested: int, expected: int) -> None:
    async with connected(protocol_version=requested) as h:
        assert h.init.protocol_version == expected


async def test_authenticate_answers_empty() -> None:
    async with connected() as h:
        assert (await h.conn.authenticate(method_id="anything")).field_meta is None


async def test_unimplemented_method_is_method_not_found() -> None:
    async with connected() as h:
        sid = await h.new_session()
        with pytest.raises(RequestError) as info:
            await h.conn.set_config_option(config_id="x", session_id=sid, value="y")
        assert info.value.code == -32601


# ------------------------------------------------------------------------- commands


async def test_echo() -> None:
    async with connected() as h:
        sid = await h.new_session()
        response = await h.prompt(sid, "  echo hello   world  ")
        assert response.stop_reason == "end_turn"
        assert h.client.texts() == ["hello   world"]


async def test_stream_exact_count_and_lengths() -> None:
    async with connected() as h:
        sid = await h.new_session()
        response = await h.prompt(sid, "stream 200 32")
        assert response.stop_reason == "end_turn"
        chunks = h.client.texts()
        assert len(chunks) == 200
        assert all(len(chunk) == 32 for chunk in chunks)
        assert len(set(chunks)) == 200  # distinguishable per chunk


async def test_stream_bytes_smaller_than_index_width() -> None:
    async with connected() as h:
        sid = await h.new_session()
        await h.prompt(sid, "stream 150 2")
        chunks = h.client.texts()
        assert len(chunks) == 150 and all(len(chunk) == 2 for chunk in chunks)


async def test_stream_large_count() -> None:
    async with connected() as h:
        sid = await h.new_session()
        response = await h.prompt(sid, "stream 20000 16")
        assert response.stop_reason == "end_turn"
        chunks = h.client.texts()
        assert len(chunks) == 20000 and {len(chunk) for chunk in chunks} == {16}


async def test_stream_bad_arguments_prints_usage() -> None:
    async with connected() as h:
        sid = await h.new_session()
        assert (await h.prompt(sid, "stream lots")).stop_reason == "end_turn"
        assert h.client.texts() == ["usage: stream <n> <bytes>"]


async def test_stream_is_cancellable() -> None:
    async with connected() as h:
        sid = await h.new_session()
        turn = asyncio.create_task(h.prompt(sid, "stream 1000000 8"))
        await h.client.first_update.wait()
        await h.conn.cancel(session_id=sid)
        assert (await turn).stop_reason == "cancelled"
        assert 0 < len(h.client.texts()) < 1000000


@pytest.mark.parametrize("choice", ["allow", "reject"])
async def test_permission_selected(choice: str) -> None:
    async with connected(RecordingClient(choice=choice)) as h:
        sid = await h.new_session()
        response = await h.prompt(sid, "permission")
        assert response.stop_reason == "end_turn"
        assert h.client.texts() == [f"permission: {choice}"]
        [(tool_call, options)] = h.client.permission_requests
        assert tool_call.tool_call_id
        assert [(o.option_id, o.kind, o.name) for o in options] == [
            ("allow", "allow_once", "Allow"),
            ("reject", "reject_once", "Reject"),
        ]


async def test_permission_cancelled_outcome() -> None:
    async with connected(RecordingClient(choice="deny")) as h:
        sid = await h.new_session()
        assert (await h.prompt(sid, "permission")).stop_reason == "end_turn"
        assert h.client.texts() == ["permission: cancelled"]


async def test_permission_session_cancel_while_waiting() -> None:
    async with connected(RecordingClient(choice="hold")) as h:
        sid = await h.new_session()
        turn = asyncio.create_task(h.prompt(sid, "permission"))
        await h.client.permission_asked.wait()
        await h.conn.cancel(session_id=sid)
        assert (await turn).stop_reason == "cancelled"
        assert h.client.texts() == ["permission: cancelled"]


async def test_wait_for_cancel() -> None:
    async with connected() as h:
        sid = await h.new_session()
        turn = asyncio.create_task(h.prompt(sid, "wait_for_cancel"))
        await h.prompt_sent.wait()
        await h.conn.cancel(session_id=sid)
        assert (await turn).stop_reason == "cancelled"
        assert h.client.updates == []
        # The cancel only applied to that turn; the session keeps working.
        assert (await h.prompt(sid, "echo after")).stop_reason == "end_turn"
        assert h.client.texts() == ["after"]


async def test_tool_calls_status_order() -> None:
    async with connected() as h:
        sid = await h.new_session()
        assert (await h.prompt(sid, "tool_calls")).stop_reason == "end_turn"
        updates = [u for _, u in h.client.updates]
        start, progress, done, chunk = updates
        assert isinstance(start, ToolCallStart) and start.status == "pending"
        assert start.title and start.kind == "read"
        assert isinstance(progress, ToolCallProgress) and progress.status == "in_progress"
        assert isinstance(done, ToolCallProgress) and done.status == "completed"
        assert progress.tool_call_id == done.tool_call_id == start.tool_call_id
        assert done.content is not None and done.content[0].content.text == "demo tool output"
        assert isinstance(chunk, AgentMessageChunk)


async def test_plan_is_worked_through_step_by_step() -> None:
    async with connected() as h:
        sid = await h.new_session()
        assert (await h.prompt(sid, "plan")).stop_reason == "end_turn"
        updates = [u for _, u in h.client.updates]
        *plans, chunk = updates
        assert all(isinstance(plan, AgentPlanUpdate) for plan in plans)
        statuses = [[entry.status for entry in plan.entries] for plan in plans]
        assert statuses == [
            ["in_progress", "pending", "pending"],
            ["completed", "in_progress", "pending"],
            ["completed", "completed", "in_progress"],
            ["completed", "completed", "completed"],
        ]
        assert isinstance(chunk, AgentMessageChunk) and chunk.content.text == "plan completed"


async def test_fs_read_and_write_with_capability() -> None:
    client = RecordingClient(files={"/tmp/demo/a.txt": "file contents"})
    async with connected(client, fs=True) as h:
        sid = await h.new_session()
        assert (await h.prompt(sid, "fs_read /tmp/demo/a.txt")).stop_reason == "end_turn"
        assert (await h.prompt(sid, "fs_write /tmp/demo/b.txt hello there")).stop_reason == "end_turn"
        assert h.client.texts() == ["file contents", "wrote /tmp/demo/b.txt"]
        assert client.files["/tmp/demo/b.txt"] == "hello there"


async def test_fs_without_capability() -> None:
    client = RecordingClient(files={"/tmp/demo/a.txt": "secret"})
    async with connected(client, fs=False) as h:
        sid = await h.new_session()
        await h.prompt(sid, "fs_read /tmp/demo/a.txt")
        await h.prompt(sid, "fs_write /tmp/demo/b.txt nope")
        read_msg, write_msg = h.client.texts()
        assert "readTextFile" in read_msg and "secret" not in read_msg
        assert "writeTextFile" in write_msg
        assert "/tmp/demo/b.txt" not in client.files


async def test_fail_is_a_jsonrpc_error() -> None:
    async with connected() as h:
        sid = await h.new_session()
        with pytest.raises(RequestError) as info:
            await h.prompt(sid, "fail")
        assert info.value.code == -32603
        assert str(info.value) == "demo failure"


async def test_help_lists_commands() -> None:
    async with connected() as h:
        sid = await h.new_session()
        await h.prompt(sid, "help")
        assert h.client.texts() == [HELP_TEXT]
        for command in ("echo", "stream", "permission", "wait_for_cancel", "tool_calls", "plan", "fs_read", "fail"):
            assert command in HELP_TEXT


async def test_anything_else_is_echoed_friendly() -> None:
    async with connected() as h:
        sid = await h.new_session()
        assert (await h.prompt(sid, "  hi there ")).stop_reason == "end_turn"
        assert h.client.texts() == ["You said: hi there"]


async def test_prompt_unknown_session_is_an_error() -> None:
    async with connected() as h:
        with pytest.raises(RequestError) as info:
            await h.prompt("sess-nope", "echo hi")
        assert info.value.code == -32602


# ------------------------------------------------------------------------- sessions


async def test_new_session_ids_and_modes() -> None:
    async with connected() as h:
        response = await h.conn.new_session(cwd=CWD)
        assert response.session_id.startswith("sess-")
        assert response.session_id != await h.new_session()
        assert response.modes is not None and response.modes.current_mode_id == "default"
        assert [m.id for m in response.modes.available_modes] == ["default", "plan"]


async def test_load_replays_history() -> None:
    async with connected() as h:
        sid = await h.new_session()
        await h.prompt(sid, "echo hello")
        await h.prompt(sid, "stream 3 4")
        h.client.updates.clear()
        await h.conn.load_session(cwd=CWD, session_id=sid)
        replay = [(type(u), u.content.text) for s, u in h.client.updates if s == sid]
        assert replay == [
            (UserMessageChunk, "echo hello"),
            (AgentMessageChunk, "hello"),
            (UserMessageChunk, "stream 3 4"),
            (AgentMessageChunk, "0:xx1:xx2:xx"),
        ]


async def test_load_unknown_session_is_an_error() -> None:
    async with connected() as h:
        with pytest.raises(RequestError) as info:
            await h.conn.load_session(cwd=CWD, session_id="sess-missing")
        assert info.value.code == -32602


async def test_list_sessions() -> None:
    async with connected() as h:
        first = await h.new_session("/tmp/one")
        second = await h.new_session("/tmp/two")
        await h.prompt(first, "echo titled")
        listed = {s.session_id: s for s in (await h.conn.list_sessions()).sessions}
        assert set(listed) == {first, second}
        assert listed[first].cwd == "/tmp/one" and listed[first].title == "echo titled"
        assert listed[second].cwd == "/tmp/two" and listed[second].title is None


async def test_fork_copies_history() -> None:
    async with connected() as h:
        sid = await h.new_session()
        await h.prompt(sid, "echo original")
        fork = (await h.conn.fork_session(session_id=sid, cwd="/tmp/fork")).session_id
        assert fork != sid and fork.startswith("sess-")
        await h.prompt(fork, "echo only in fork")
        h.client.updates.clear()
        await h.conn.load_session(cwd=CWD, session_id=fork)
        assert h.client.texts(fork) == ["original", "only in fork"]
        h.client.updates.clear()
        await h.conn.load_session(cwd=CWD, session_id=sid)
        assert h.client.texts(sid) == ["original"]


async def test_resume_does_not_replay() -> None:
    async with connected() as h:
        sid = await h.new_session()
        await h.prompt(sid, "echo before")
        h.client.updates.clear()
        await h.conn.resume_session(session_id=sid, cwd=CWD)
        assert h.client.updates == []
        await h.prompt(sid, "echo after")
        assert h.client.texts() == ["after"]
        with pytest.raises(RequestError):
            await h.conn.resume_session(session_id="sess-missing", cwd=CWD)


async def test_close_forgets_session() -> None:
    async with connected() as h:
        sid = await h.new_session()
        await h.conn.close_session(session_id=sid)
        assert (await h.conn.list_sessions()).sessions == []
        with pytest.raises(RequestError):
            await h.prompt(sid, "echo gone")


async def test_close_cancels_inflight_prompt() -> None:
    async with connected() as h:
        sid = await h.new_session()
        turn = asyncio.create_task(h.prompt(sid, "wait_for_cancel"))
        await h.prompt_sent.wait()
        await h.conn.close_session(session_id=sid)
        assert (await turn).stop_reason == "cancelled"


async def test_set_mode_notifies_current_mode() -> None:
    async with connected() as h:
        sid = await h.new_session()
        await h.conn.set_session_mode(session_id=sid, mode_id="plan")
        [(update_sid, update)] = h.client.updates
        assert update_sid == sid
        assert isinstance(update, CurrentModeUpdate) and update.current_mode_id == "plan"
        fork = await h.conn.fork_session(session_id=sid, cwd=CWD)
        assert fork.modes is not None and fork.modes.current_mode_id == "plan"
        with pytest.raises(RequestError) as info:
            await h.conn.set_session_mode(session_id=sid, mode_id="turbo")
        assert info.value.code == -32602


async def test_a_long_turn_is_kept_only_up_to_the_history_bound() -> None:
    """`stream 50 15000000` must not make the agent keep 750 MB (before: every chunk was kept
    for session/load, so a client grew the server by twice what it streamed)."""
    from demo_project.agent import HISTORY_CHARS

    chunk = HISTORY_CHARS // 2 + 1  # three of them: more than the bound
    async with connected() as h:
        sid = await h.new_session()
        assert (await h.prompt(sid, f"stream 3 {chunk}")).stop_reason == "end_turn"
        assert [len(text) for text in h.client.texts()] == [chunk] * 3  # the client got it all
        h.client.updates.clear()
        await h.conn.load_session(cwd=CWD, session_id=sid)
        replayed = h.client.texts()
    assert len(replayed) == 1
    kept = replayed[0]
    assert len(kept) < HISTORY_CHARS + 100
    assert kept.endswith(f"[{2 * chunk} more characters not kept]")  # the first chunk fits, not the next two


async def test_tick_sends_numbered_lines_in_order() -> None:
    async with connected() as h:
        sid = await h.new_session()
        assert (await h.prompt(sid, "tick 5 1")).stop_reason == "end_turn"
        assert h.client.texts() == [f"tick {index}\n" for index in range(1, 6)]


async def test_tick_is_cancellable_between_ticks() -> None:
    async with connected() as h:
        sid = await h.new_session()
        turn = asyncio.create_task(h.prompt(sid, "tick 1000 60000"))  # a minute between ticks
        await h.client.first_update.wait()
        await h.conn.cancel(session_id=sid)
        assert (await turn).stop_reason == "cancelled"
        assert h.client.texts() == ["tick 1\n"]


async def test_tick_bad_arguments_prints_usage() -> None:
    async with connected() as h:
        sid = await h.new_session()
        assert (await h.prompt(sid, "tick soon")).stop_reason == "end_turn"
        assert h.client.texts() == ["usage: tick <n> <ms>"]


async def test_a_long_session_keeps_its_latest_turns_within_the_history_bound() -> None:
    session = DemoSession("s", CWD)
    for index in range(40):
        session.remember("agent", "x" * 40_000 + str(index))  # 40 kB each: more than HISTORY_CHARS in all
    assert session.history_chars == sum(len(text) for _, text in session.history) <= HISTORY_CHARS
    assert session.history[-1][1].endswith("39") and len(session.history) < 40
    session.remember("user", "y" * (2 * HISTORY_CHARS))  # one turn over the bound: still kept, alone
    assert [text[0] for _, text in session.history] == ["y"]
