"""Demo ACP agent built on the official Python SDK (``acp``).

The host runs one instance per ACP connection as
``AgentSideConnection(create_agent(context), transport, listening=False, use_unstable_protocol=True)``:
the factory gets the connection's ``AgentContext`` (whom it serves), which ``whoami`` shows.
Prompts are tiny text commands (``help`` lists them) meant to exercise every part of the
protocol end to end: streaming, permissions, cancellation, tool calls and client fs access.

Deliberately a plain class rather than a subclass of the ``acp.Agent`` Protocol: the SDK routes
whatever methods exist, so unimplemented ones (e.g. ``session/set_config_option``) answer
-32601 instead of a silent ``null``.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections import deque
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeVar

from acp import PROTOCOL_VERSION, RequestError
from acp.helpers import (
    plan_entry,
    start_tool_call,
    text_block,
    tool_content,
    update_agent_message_text,
    update_current_mode,
    update_plan,
    update_tool_call,
    update_user_message_text,
)
from acp.interfaces import Client
from acp.schema import (
    AgentCapabilities,
    AudioContentBlock,
    AuthenticateResponse,
    ClientCapabilities,
    CloseSessionResponse,
    EmbeddedResourceContentBlock,
    ForkSessionResponse,
    ImageContentBlock,
    Implementation,
    InitializeResponse,
    ListSessionsResponse,
    LoadSessionResponse,
    NewSessionResponse,
    PermissionOption,
    PromptResponse,
    ResourceContentBlock,
    ResumeSessionResponse,
    SessionCapabilities,
    SessionCloseCapabilities,
    SessionForkCapabilities,
    SessionInfo,
    SessionListCapabilities,
    SessionMode,
    SessionModeState,
    SessionResumeCapabilities,
    SetSessionModeResponse,
    StopReason,
    TextContentBlock,
    ToolCallUpdate,
)

from acp_channels import CONNECTION_ENV, PRINCIPAL_ID_ENV, PRINCIPAL_KIND_ENV, AgentContext, Principal

__all__ = ["AGENT_NAME", "HELP_TEXT", "MODES", "DemoAgent", "DemoSession", "create_agent"]

AGENT_NAME = "acp-channels-demo"
AGENT_VERSION = "0.1.0"
MODES = (
    SessionMode(id="default", name="Default", description="Run commands normally"),
    SessionMode(id="plan", name="Plan", description="Same as default; exists to exercise set_mode"),
)
HELP_TEXT = "\n".join(
    [
        "Commands:",
        "  echo <text>            reply with exactly <text>",
        "  stream <n> <bytes>     send <n> message chunks of exactly <bytes> characters",
        "  tick <n> <ms>          send the lines 'tick 1' .. 'tick <n>', one every <ms> milliseconds",
        "  permission             ask the client for permission (allow / reject)",
        "  wait_for_cancel        do nothing until session/cancel arrives",
        "  tool_calls             report a tool call: pending -> in_progress -> completed",
        "  plan                   report a plan of three steps and work through it",
        "  fs_read <path>         read a file through the client (fs.readTextFile)",
        "  fs_write <path> <text> write a file through the client (fs.writeTextFile)",
        "  fail                   answer the prompt with a JSON-RPC error",
        "  whoami                 whom this agent serves: principal, connection, transport, address",
        "  help                   show this text",
        "Anything else is echoed back as 'You said: <text>'.",
    ]
)
# Let the event loop run other handlers (e.g. session/cancel) this often while streaming:
# in-memory transports never suspend on send, so without it a long stream cannot be cancelled.
_STREAM_YIELD_EVERY = 256
#: What a session keeps of its conversation for session/load, in characters: a client streaming
#: gigabytes (`stream 50 15000000`) must not make the agent keep them (the rest is summarized).
HISTORY_CHARS: Final = 1024 * 1024

T = TypeVar("T")
ContentBlock = (
    TextContentBlock | ImageContentBlock | AudioContentBlock | ResourceContentBlock | EmbeddedResourceContentBlock
)


@dataclass
class DemoSession:
    session_id: str
    cwd: str
    mode: str = "default"
    # (role, text) per turn, replayed by session/load.
    history: deque[tuple[Literal["user", "agent"], str]] = field(default_factory=deque)
    history_chars: int = 0
    # One event per in-flight prompt; a set so session/cancel never leaks into a later turn.
    turns: set[asyncio.Event] = field(default_factory=set)

    def remember(self, role: Literal["user", "agent"], text: str) -> None:
        """Add a turn to the history, forgetting the oldest beyond HISTORY_CHARS (the latest one
        is always kept); counted as it goes, so a long session's turns cost no more than its first."""
        self.history.append((role, text))
        self.history_chars += len(text)
        while len(self.history) > 1 and self.history_chars > HISTORY_CHARS:
            self.history_chars -= len(self.history.popleft()[1])

    @property
    def title(self) -> str | None:
        first = next((text for role, text in self.history if role == "user" and text), None)
        return first[:60] if first else None

    def modes(self) -> SessionModeState:
        return SessionModeState(current_mode_id=self.mode, available_modes=list(MODES))


@dataclass
class _Turn:
    """State of one session/prompt call."""

    session: DemoSession
    cancelled: asyncio.Event
    output: list[str] = field(default_factory=list)
    kept: int = 0  # characters of `output`
    dropped: int = 0  # characters said beyond HISTORY_CHARS, not kept

    def keep(self, text: str) -> None:
        room = HISTORY_CHARS - self.kept
        if len(text) <= room:
            self.output.append(text)
            self.kept += len(text)
        else:
            self.dropped += len(text)

    def transcript(self) -> str:
        said = "".join(self.output)
        return f"{said}\n[{self.dropped} more characters not kept]" if self.dropped else said


class DemoAgent:
    """Command-driven demo agent; one instance per ACP connection."""

    def __init__(self, context: AgentContext | None = None) -> None:
        self.context = context  # None when run on its own (`python -m demo_project.agent`)
        self._conn: Client | None = None
        self._client_capabilities = ClientCapabilities()
        self._sessions: dict[str, DemoSession] = {}

    def on_connect(self, conn: Client) -> None:
        # Called by AgentSideConnection with itself: our handle for agent -> client calls.
        self._conn = conn

    @property
    def conn(self) -> Client:
        if self._conn is None:
            raise RuntimeError("DemoAgent is not attached to a connection")
        return self._conn

    # ----------------------------------------------------------------- lifecycle

    async def initialize(
        self,
        protocol_version: int,
        client_capabilities: ClientCapabilities | None = None,
        client_info: Implementation | None = None,
        **kwargs: Any,
    ) -> InitializeResponse:
        # Remembered so fs_read/fs_write only call what the client advertised.
        self._client_capabilities = client_capabilities or ClientCapabilities()
        return InitializeResponse(
            protocol_version=min(protocol_version, PROTOCOL_VERSION),
            agent_capabilities=AgentCapabilities(
                load_session=True,
                session_capabilities=SessionCapabilities(
                    list=SessionListCapabilities(),
                    fork=SessionForkCapabilities(),
                    resume=SessionResumeCapabilities(),
                    close=SessionCloseCapabilities(),
                ),
            ),
            auth_methods=[],
            agent_info=Implementation(name=AGENT_NAME, title="ACP Channels demo agent", version=AGENT_VERSION),
        )

    async def authenticate(self, method_id: str, **kwargs: Any) -> AuthenticateResponse:
        # No auth methods are advertised; accept anything so clients that always call it work.
        return AuthenticateResponse()

    # ------------------------------------------------------------------ sessions

    def _session(self, session_id: str) -> DemoSession:
        session = self._sessions.get(session_id)
        if session is None:
            raise RequestError.invalid_params({"sessionId": session_id, "details": "Unknown session"})
        return session

    def _create_session(self, cwd: str) -> DemoSession:
        session = DemoSession(session_id=f"sess-{uuid.uuid4().hex}", cwd=cwd)
        self._sessions[session.session_id] = session
        return session

    async def new_session(self, cwd: str, **kwargs: Any) -> NewSessionResponse:
        session = self._create_session(cwd)
        return NewSessionResponse(session_id=session.session_id, modes=session.modes())

    async def load_session(self, cwd: str, session_id: str, **kwargs: Any) -> LoadSessionResponse:
        session = self._session(session_id)
        session.cwd = cwd
        # The spec requires the whole conversation to be replayed before the response.
        for role, text in session.history:
            update = update_user_message_text(text) if role == "user" else update_agent_message_text(text)
            await self.conn.session_update(session_id, update)
        return LoadSessionResponse(modes=session.modes())

    async def list_sessions(
        self, cwd: str | None = None, cursor: str | None = None, **kwargs: Any
    ) -> ListSessionsResponse:
        # Everything fits in one page, so the cursor is ignored and none is returned.
        return ListSessionsResponse(
            sessions=[
                SessionInfo(session_id=s.session_id, cwd=s.cwd, title=s.title)
                for s in self._sessions.values()
                if cwd is None or s.cwd == cwd
            ]
        )

    async def fork_session(self, session_id: str, cwd: str, **kwargs: Any) -> ForkSessionResponse:
        source = self._session(session_id)
        fork = self._create_session(cwd)
        fork.mode = source.mode
        fork.history, fork.history_chars = deque(source.history), source.history_chars
        return ForkSessionResponse(session_id=fork.session_id, modes=fork.modes())

    async def resume_session(self, session_id: str, cwd: str, **kwargs: Any) -> ResumeSessionResponse:
        # Unlike session/load, resume does not replay history.
        session = self._session(session_id)
        session.cwd = cwd
        return ResumeSessionResponse(modes=session.modes())

    async def close_session(self, session_id: str, **kwargs: Any) -> CloseSessionResponse:
        session = self._session(session_id)
        self._cancel_turns(session)  # in-flight prompts of a closed session end as cancelled
        del self._sessions[session_id]
        return CloseSessionResponse()

    async def set_session_mode(self, session_id: str, mode_id: str, **kwargs: Any) -> SetSessionModeResponse:
        session = self._session(session_id)
        if mode_id not in {mode.id for mode in MODES}:
            raise RequestError.invalid_params({"modeId": mode_id, "details": "Unknown mode"})
        session.mode = mode_id
        await self.conn.session_update(session_id, update_current_mode(mode_id))
        return SetSessionModeResponse()

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        # A notification: unknown sessions are ignored because there is nobody to answer.
        if session := self._sessions.get(session_id):
            self._cancel_turns(session)

    @staticmethod
    def _cancel_turns(session: DemoSession) -> None:
        for event in session.turns:
            event.set()

    # -------------------------------------------------------------------- prompt

    async def prompt(self, session_id: str, prompt: list[ContentBlock], **kwargs: Any) -> PromptResponse:
        session = self._session(session_id)
        # Registered before the first await so a session/cancel queued right behind us is seen.
        turn = _Turn(session=session, cancelled=asyncio.Event())
        session.turns.add(turn.cancelled)
        text = next((block.text for block in prompt if isinstance(block, TextContentBlock)), "").strip()
        session.remember("user", text)
        try:
            stop_reason = await self._run_command(turn, text)
        finally:
            session.turns.discard(turn.cancelled)
            if turn.output or turn.dropped:
                session.remember("agent", turn.transcript())
        if turn.cancelled.is_set():
            stop_reason = "cancelled"  # the spec wants `cancelled` for any turn hit by session/cancel
        return PromptResponse(stop_reason=stop_reason)

    async def _say(self, turn: _Turn, text: str) -> None:
        turn.keep(text)
        await self.conn.session_update(turn.session.session_id, update_agent_message_text(text))

    async def _run_command(self, turn: _Turn, text: str) -> StopReason:
        command, *more = text.split(None, 1) or [""]
        rest = more[0] if more else ""
        match command:
            case "echo":
                await self._say(turn, rest)
            case "stream":
                return await self._stream(turn, rest)
            case "tick":
                return await self._tick(turn, rest)
            case "permission":
                return await self._permission(turn)
            case "wait_for_cancel":
                await turn.cancelled.wait()
                return "cancelled"
            case "tool_calls":
                await self._tool_calls(turn)
            case "plan":
                await self._plan(turn)
            case "fs_read":
                await self._fs_read(turn, rest)
            case "fs_write":
                await self._fs_write(turn, rest)
            case "fail":
                raise RequestError(-32603, "demo failure", {"details": "demo failure"})
            case "whoami":
                await self._say(turn, self._whoami())
            case "help":
                await self._say(turn, HELP_TEXT)
            case _:
                await self._say(turn, f"You said: {text}")
        return "end_turn"

    def _whoami(self) -> str:
        context = self.context
        if context is not None:
            remote = context.remote_address or "unknown"
            return (
                f"principal={context.principal} connection={context.connection_id} "
                f"transport={context.transport} remote={remote}"
            )
        # A subprocess per connection learns whom it serves from its environment.
        kind = os.environ.get(PRINCIPAL_KIND_ENV)
        if kind is None:
            return "principal=unknown (not started by acp_channels)"
        principal = Principal(kind, os.environ.get(PRINCIPAL_ID_ENV, ""))
        return f"principal={principal} connection={os.environ.get(CONNECTION_ENV, 'unknown')} transport=stdio"

    async def _stream(self, turn: _Turn, args: str) -> StopReason:
        if (numbers := _two_counts(args)) is None:
            await self._say(turn, "usage: stream <n> <bytes>")
            return "end_turn"
        count, size = numbers
        width = len(str(max(count - 1, 0)))
        for index in range(count):
            if turn.cancelled.is_set():
                return "cancelled"
            # Zero-padded index then filler, so chunks are distinguishable but exactly `size` long.
            label = f"{index:0{width}d}:"
            chunk = label + "x" * (size - len(label)) if size >= len(label) else "x" * size
            await self._say(turn, chunk)
            if index % _STREAM_YIELD_EVERY == _STREAM_YIELD_EVERY - 1:
                await asyncio.sleep(0)  # a yield, not a delay (see _STREAM_YIELD_EVERY)
        return "end_turn"

    async def _tick(self, turn: _Turn, args: str) -> StopReason:
        """A paced turn, to watch a long one (and to detach from it and attach to it again)."""
        if (numbers := _two_counts(args)) is None:
            await self._say(turn, "usage: tick <n> <ms>")
            return "end_turn"
        count, milliseconds = numbers
        for index in range(1, count + 1):
            if turn.cancelled.is_set():
                break
            await self._say(turn, f"tick {index}\n")
            if index < count:
                await self._until_cancelled(turn, asyncio.sleep(milliseconds / 1000))
        return "cancelled" if turn.cancelled.is_set() else "end_turn"

    async def _until_cancelled(self, turn: _Turn, call: Awaitable[T]) -> T | None:
        """Await ``call`` unless session/cancel comes first (then abandon it and return None)."""
        task = asyncio.ensure_future(call)
        # Abandoned when the turn is cancelled or the connection closes (then it fails with
        # ConnectionError after this turn is gone): its outcome is expected, not news to log.
        task.add_done_callback(_retrieve_outcome)
        waiter = asyncio.ensure_future(turn.cancelled.wait())
        try:
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            if not task.done():
                task.cancel()
        return task.result() if task.done() and not task.cancelled() else None

    async def _permission(self, turn: _Turn) -> StopReason:
        tool_call = ToolCallUpdate(
            tool_call_id=f"perm-{uuid.uuid4().hex[:12]}",
            title="Demo permission request",
            kind="edit",
            status="pending",
        )
        options = [
            PermissionOption(option_id="allow", name="Allow", kind="allow_once"),
            PermissionOption(option_id="reject", name="Reject", kind="reject_once"),
        ]
        response = await self._until_cancelled(
            turn, self.conn.request_permission(turn.session.session_id, tool_call, options)
        )
        outcome = response.outcome if response else None
        selected = outcome.option_id if outcome is not None and outcome.outcome == "selected" else "cancelled"
        await self._say(turn, f"permission: {selected}")
        return "cancelled" if turn.cancelled.is_set() else "end_turn"

    async def _tool_calls(self, turn: _Turn) -> None:
        session_id = turn.session.session_id
        call_id = f"call-{uuid.uuid4().hex[:12]}"
        await self.conn.session_update(
            session_id, start_tool_call(call_id, "Reading demo data", kind="read", status="pending")
        )
        await self.conn.session_update(session_id, update_tool_call(call_id, status="in_progress"))
        await self.conn.session_update(
            session_id,
            update_tool_call(call_id, status="completed", content=[tool_content(text_block("demo tool output"))]),
        )
        await self._say(turn, "tool call completed")

    async def _plan(self, turn: _Turn) -> None:
        # Each update is the whole plan (the protocol replaces it): one step further each time.
        steps = ("Read the request", "Do the work", "Report back")
        for done in range(len(steps) + 1):
            entries = [
                plan_entry(step, status="completed" if index < done else "in_progress" if index == done else "pending")
                for index, step in enumerate(steps)
            ]
            await self.conn.session_update(turn.session.session_id, update_plan(entries))
        await self._say(turn, "plan completed")

    async def _fs_read(self, turn: _Turn, path: str) -> None:
        fs = self._client_capabilities.fs
        if not (fs and fs.read_text_file):
            await self._say(turn, "cannot read: the client did not advertise fs.readTextFile")
            return
        response = await self.conn.read_text_file(path=path, session_id=turn.session.session_id)
        await self._say(turn, response.content)

    async def _fs_write(self, turn: _Turn, args: str) -> None:
        path, _, content = args.partition(" ")
        fs = self._client_capabilities.fs
        if not (fs and fs.write_text_file):
            await self._say(turn, "cannot write: the client did not advertise fs.writeTextFile")
            return
        await self.conn.write_text_file(content=content, path=path, session_id=turn.session.session_id)
        await self._say(turn, f"wrote {path}")


def _two_counts(args: str) -> tuple[int, int] | None:
    """Two whole numbers, 0 or more (a command's arguments); None for anything else."""
    try:
        first, second = (int(arg) for arg in args.split())
    except ValueError:
        return None
    return (first, second) if first >= 0 and second >= 0 else None


def _retrieve_outcome(task: asyncio.Future[Any]) -> None:
    """Mark a task's exception as retrieved (asyncio logs "Task exception was never retrieved"
    for one nobody asked)."""
    if not task.cancelled():
        task.exception()


def create_agent(context: AgentContext | None = None) -> DemoAgent:
    """A fresh agent per ACP connection (sessions and client capabilities are per connection);
    acp_channels passes the connection's context by the parameter's name."""
    return DemoAgent(context)


def main() -> None:
    """Serve the demo agent on stdin/stdout: `python -m demo_project.agent`."""
    from acp import run_agent

    asyncio.run(run_agent(create_agent(), use_unstable_protocol=True))


if __name__ == "__main__":
    main()
