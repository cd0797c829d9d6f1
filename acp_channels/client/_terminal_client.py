"""The terminal client's ACP client side (an `acp.interfaces.Client`), what the agent asks of it:
session updates are printed (text as it arrives, tool calls and plans as short marked lines),
permission requests asked as a numbered choice (or answered by `--permissions`), file reads and
writes served with `--fs`; and what Ctrl-C means while a turn runs or a question waits.

On a shared session (docs/shared-sessions.md) the server's notices come here too: a turn's end
(`turn_ended`: what a client following a turn waits for), a permission request answered by
another client (`permission_resolved`: the question goes, with a line saying so), the session's
connection ended (`terminated`: the run loop says it when the connection goes)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import acp
from acp.connection import StreamDirection, StreamEvent
from acp.schema import (
    AgentMessageChunk,
    AgentPlanUpdate,
    AgentThoughtChunk,
    AllowedOutcome,
    AvailableCommand,
    AvailableCommandsUpdate,
    ContentToolCallContent,
    CurrentModeUpdate,
    DeniedOutcome,
    FileEditToolCallContent,
    PermissionOption,
    PlanEntry,
    ReadTextFileResponse,
    RequestPermissionResponse,
    TerminalToolCallContent,
    TextContentBlock,
    ToolCallProgress,
    ToolCallStart,
    ToolCallUpdate,
    UserMessageChunk,
    WriteTextFileResponse,
)
from rich.text import Text

from acp_channels import _protocol as protocol

from ._shared_sessions import PERMISSION_RESOLVED_METHOD, TERMINATED_METHOD, TURN_ENDED_METHOD
from ._terminal_input import CANCELLED, INTERRUPTED, Input, line_or_cancelled
from ._terminal_output import STATUS_STYLES, Screen

__all__ = ["PermissionMode", "TerminalClient", "Turn"]

PermissionMode = Literal["ask", "allow", "reject"]


@dataclass
class Turn:
    """One running session/prompt."""

    task: asyncio.Task[Any]
    cancel_requested: asyncio.Event = field(default_factory=asyncio.Event)


class TerminalClient:
    """The ACP client side (an `acp.interfaces.Client`): prints updates, asks for permission,
    serves file reads and writes when `--fs` was given."""

    def __init__(
        self,
        screen: Screen,
        lines: Input,
        *,
        permissions: PermissionMode = "ask",
        fs: bool = False,
    ) -> None:
        self.screen = screen
        self.lines = lines
        self.permissions = permissions
        self.fs = fs
        self.turn: Turn | None = None
        self.quit_requested = False
        self.quit_armed = False
        self.agent_commands: list[AvailableCommand] = []
        self._tool_titles: dict[str, str] = {}
        self._tool_kinds: dict[str, str] = {}
        # Set by run(): what cancelling the turn and quitting do (Ctrl-C at a permission question).
        self.cancel_turn: Callable[[], None] = lambda: None
        self.quit_now: Callable[[], None] = lambda: None
        #: Per session, the end of a turn someone waits for (`expect_turn_end`).
        self._turn_end_waiters: dict[str, asyncio.Future[str]] = {}
        #: The agent's permission requests: their JSON-RPC ids by tool call (the SDK hands over
        #: no id), and per id the outcome another client chose, once it is known.
        self._permission_ids: dict[str, str] = {}
        self._answered_elsewhere: dict[str, asyncio.Future[Any]] = {}
        #: The options of each permission request asked (to name the one chosen elsewhere).
        self._options_asked: dict[str, list[PermissionOption]] = {}
        #: Sessions whose connection was terminated, with that connection's id.
        self.terminated: dict[str, str] = {}

    # --------------------------------------------------------------------- session/update

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        screen = self.screen
        if isinstance(update, AgentMessageChunk | AgentThoughtChunk | UserMessageChunk):
            section = {AgentMessageChunk: "agent", AgentThoughtChunk: "thought", UserMessageChunk: "user"}
            content = update.content
            if isinstance(content, TextContentBlock):
                screen.text(content.text, section[type(update)])
            else:
                screen.line(f"[{content.type} content]", style="dim")
        elif isinstance(update, ToolCallStart):
            self._tool_titles[update.tool_call_id] = update.title
            if update.kind:
                self._tool_kinds[update.tool_call_id] = update.kind
            self._show_tool(update.tool_call_id, update.status or "pending", update.content)
        elif isinstance(update, ToolCallProgress):
            if update.title:
                self._tool_titles[update.tool_call_id] = update.title
            if update.kind:
                self._tool_kinds[update.tool_call_id] = update.kind
            if update.status or update.content:
                self._show_tool(update.tool_call_id, update.status, update.content)
        elif isinstance(update, AgentPlanUpdate):
            self._show_plan(update.entries)
        elif isinstance(update, CurrentModeUpdate):
            screen.line(Text.assemble(("mode ", "dim"), (update.current_mode_id, "bold")))
        elif isinstance(update, AvailableCommandsUpdate):
            self.agent_commands = list(update.available_commands)
            names = " ".join(f"/{command.name}" for command in update.available_commands)
            screen.line(Text.assemble(("agent commands ", "dim"), names, (" (/help describes them)", "dim")))
        else:
            screen.line(f"[{getattr(update, 'session_update', 'update')}]", style="dim")

    def _show_tool(self, tool_call_id: str, status: str | None, content: list[Any] | None) -> None:
        """`✓ Reading demo data (read) completed`: a line per status change, then any content."""
        marks = self.screen.marks
        title = self._tool_titles.get(tool_call_id, tool_call_id)
        kind = self._tool_kinds.get(tool_call_id)
        if status:
            style = STATUS_STYLES.get(status, "")
            self.screen.line(
                Text.assemble(
                    "  ",
                    (marks.status(status), style),
                    " ",
                    (title, "bold"),
                    (f" ({kind})" if kind else "", "dim"),
                    " ",
                    (status, style),
                )
            )
        for item in content or []:
            if isinstance(item, ContentToolCallContent) and isinstance(item.content, TextContentBlock):
                shown = item.content.text.splitlines() or [""]
            elif isinstance(item, FileEditToolCallContent):
                shown = [f"[diff {item.path}]"]
            elif isinstance(item, TerminalToolCallContent):
                shown = [f"[terminal {item.terminal_id}]"]
            else:
                shown = [f"[{getattr(item, 'type', 'content')}]"]
            for text_line in shown:
                self.screen.line(Text.assemble((f"    {marks.content} ", "dim"), text_line))

    def _show_plan(self, entries: list[PlanEntry]) -> None:
        marks = self.screen.marks
        self.screen.line(Text("  plan", style="bold"))
        for entry in entries:
            style = STATUS_STYLES.get(entry.status, "")
            done = "dim" if entry.status == "completed" else ""
            priority = " (high)" if entry.priority == "high" else ""
            self.screen.line(
                Text.assemble(
                    "    ", (marks.status(entry.status), style), " ", (entry.content, done), (priority, "dim")
                )
            )

    # ---------------------------------------------------------------------- permissions

    async def request_permission(
        self, session_id: str, tool_call: ToolCallUpdate, options: list[PermissionOption], **kwargs: Any
    ) -> RequestPermissionResponse:
        key = self._permission_ids.pop(tool_call.tool_call_id, None)
        elsewhere = self._answered_elsewhere.get(key) if key is not None else None
        if key is not None:
            self._options_asked[key] = options
        try:
            return await self._request_permission(tool_call, options, elsewhere)
        finally:
            if key is not None:
                self._answered_elsewhere.pop(key, None)
                self._options_asked.pop(key, None)

    async def _request_permission(
        self, tool_call: ToolCallUpdate, options: list[PermissionOption], elsewhere: asyncio.Future[Any] | None
    ) -> RequestPermissionResponse:
        screen = self.screen
        marks = screen.marks
        title = tool_call.title or self._tool_titles.get(tool_call.tool_call_id, tool_call.tool_call_id)
        kind = tool_call.kind or self._tool_kinds.get(tool_call.tool_call_id)
        question = Text.assemble(
            (f"{marks.question} ", "bold yellow"),
            ("Permission: ", "bold"),
            (title, "bold"),
            (f" ({kind})" if kind else "", "dim"),
        )
        if self.permissions != "ask":
            wanted = "allow" if self.permissions == "allow" else "reject"
            chosen = next((option for option in options if option.kind.startswith(wanted)), None)
            question.append(f" {marks.answer} {chosen.name if chosen else 'cancelled'} (--permissions)")
            screen.line(question)
            return _outcome(chosen)
        if elsewhere is not None and elsewhere.done():
            return _outcome(_chosen(elsewhere.result(), options))  # said when the notice came
        screen.pause_turn()
        try:
            return await self._ask(question, options, elsewhere)
        finally:
            screen.resume_turn()

    async def _ask(
        self, question: Text, options: list[PermissionOption], elsewhere: asyncio.Future[Any] | None
    ) -> RequestPermissionResponse:
        screen = self.screen
        screen.line(question)
        width = max(len(option.name) for option in options)
        for number, option in enumerate(options, 1):
            style = "green" if option.kind.startswith("allow") else "red" if option.kind.startswith("reject") else ""
            screen.line(
                Text.assemble(
                    f"  {number}) ", (option.name.ljust(width), style), ("  " + option.kind.replace("_", " "), "dim")
                )
            )
        cancelled = self.turn.cancel_requested if self.turn else asyncio.Event()
        while True:
            answer = await line_or_cancelled(
                self.lines.read(f"Choose 1-{len(options)}: ", history=False), _either(cancelled, elsewhere)
            )
            if answer is CANCELLED and elsewhere is not None and elsewhere.done():
                return _outcome(_chosen(elsewhere.result(), options))  # said when the notice came
            if answer is INTERRUPTED and self.turn is not None:
                self.interrupt(self.cancel_turn, self.quit_now)
            if answer is CANCELLED or answer is INTERRUPTED:
                screen.line(f"  {screen.marks.answer} cancelled", style="yellow")
                return _outcome(None)
            if answer is None:
                screen.line(f"  {screen.marks.answer} cancelled (end of input)", style="yellow")
                self.quit_requested = True
                return _outcome(None)
            chosen = _pick(str(answer).strip(), options)
            if chosen is not None:
                style = "green" if chosen.kind.startswith("allow") else "red"
                screen.line(Text.assemble(f"  {screen.marks.answer} ", (chosen.name, style)))
                return _outcome(chosen)
            screen.line("  answer with a number or an option name", style="yellow")

    # ------------------------------------------------------------------- shared sessions

    def observe(self, event: StreamEvent) -> None:
        """Each message, before it is handled (an SDK observer): the agent's permission requests'
        ids, which a `permission_resolved` notice names."""
        message = event.message
        if event.direction != StreamDirection.INCOMING or message.get("method") != "session/request_permission":
            return
        params = message.get("params")
        tool_call = params.get("toolCall") if isinstance(params, dict) else None
        tool_call_id = tool_call.get("toolCallId") if isinstance(tool_call, dict) else None
        if isinstance(tool_call_id, str) and message.get("id") is not None:
            key = protocol.id_key(message["id"])
            self._permission_ids[tool_call_id] = key
            self._answered_elsewhere[key] = asyncio.get_running_loop().create_future()

    def expect_turn_end(self, session_id: str) -> asyncio.Future[str]:
        """The stop reason the next `turn_ended` notice of `session_id` gives."""
        waiter: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._turn_end_waiters[session_id] = waiter
        return waiter

    def forget_turn_end(self, session_id: str) -> None:
        waiter = self._turn_end_waiters.pop(session_id, None)
        if waiter is not None:
            waiter.cancel()

    async def ext_notification(self, method: str, params: dict[str, Any]) -> None:
        """The server's notices about shared sessions (the SDK strips the leading underscore)."""
        method = "_" + method
        session_id = params.get("sessionId")
        if method == TURN_ENDED_METHOD and isinstance(session_id, str):
            reason = str(params.get("stopReason"))
            waiter = self._turn_end_waiters.pop(session_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(reason)
            else:
                style = "dim" if reason == "end_turn" else "yellow"
                self.screen.line(Text.assemble((f"[{reason}]", style), (" another client's turn ended", "dim")))
        elif method == PERMISSION_RESOLVED_METHOD:
            key = protocol.id_key(params.get("requestId"))
            answered = self._answered_elsewhere.get(key)
            if answered is not None:
                if not answered.done():
                    # The question goes; said here, before what the agent does with the answer.
                    answered.set_result(params.get("outcome"))
                    chosen = _chosen(params.get("outcome"), self._options_asked.get(key, []))
                    shown = chosen.name if chosen is not None else _outcome_text(params.get("outcome"))
                    self.screen.line(
                        f"  {self.screen.marks.answer} answered by another client: {shown}", style="yellow"
                    )
            else:
                shown = _outcome_text(params.get("outcome"))
                self.screen.line(
                    f"  {self.screen.marks.answer} a permission request was answered: {shown}", style="dim"
                )
        elif method == TERMINATED_METHOD and isinstance(session_id, str):
            self.terminated[session_id] = str(params.get("connectionId"))

    # ------------------------------------------------------------------ client file access

    async def read_text_file(
        self, session_id: str, path: str, line: int | None = None, limit: int | None = None, **kwargs: Any
    ) -> ReadTextFileResponse:
        if not self.fs:
            raise acp.RequestError.method_not_found("fs/read_text_file")
        text = await asyncio.to_thread(Path(path).read_text)
        if line is not None or limit is not None:
            lines = text.splitlines(keepends=True)
            start = max((line or 1) - 1, 0)
            text = "".join(lines[start : start + limit if limit is not None else None])
        self.screen.line(f"  fs: read {path}", style="dim")
        return ReadTextFileResponse(content=text)

    async def write_text_file(self, session_id: str, path: str, content: str, **kwargs: Any) -> WriteTextFileResponse:
        if not self.fs:
            raise acp.RequestError.method_not_found("fs/write_text_file")
        await asyncio.to_thread(Path(path).write_text, content)
        self.screen.line(f"  fs: wrote {path}", style="dim")
        return WriteTextFileResponse()

    # ---------------------------------------------------------------------------- Ctrl-C

    def interrupt(self, cancel: Callable[[], None], quit_now: Callable[[], None]) -> None:
        """Ctrl-C: cancel the running turn (a second one during the same turn quits). At the
        prompt the first one explains how to leave and the second one quits."""
        turn = self.turn
        if turn is None:
            if self.quit_armed:
                quit_now()
            else:
                self.quit_armed = True
                self.screen.line("(press Ctrl-C again, Ctrl-D or type /quit to exit)", style="dim")
        elif turn.cancel_requested.is_set():
            self.screen.line("^C again: quitting", style="yellow")
            quit_now()
        else:
            turn.cancel_requested.set()
            self.screen.line("cancelling the turn…", style="yellow")
            cancel()


def _pick(answer: str, options: list[PermissionOption]) -> PermissionOption | None:
    if answer.isdigit() and 1 <= int(answer) <= len(options):
        return options[int(answer) - 1]
    lowered = answer.lower()
    for option in options:
        if lowered in (option.option_id.lower(), option.name.lower()):
            return option
    return None


def _chosen(outcome: Any, options: list[PermissionOption]) -> PermissionOption | None:
    """The option an outcome (`{"outcome": "selected", "optionId": ...}`) selected, if one of `options`."""
    if not isinstance(outcome, dict) or outcome.get("outcome") != "selected":
        return None
    return next((option for option in options if option.option_id == outcome.get("optionId")), None)


def _outcome_text(outcome: Any) -> str:
    if isinstance(outcome, dict) and outcome.get("outcome") == "selected":
        return str(outcome.get("optionId"))
    return "cancelled"


async def _either(event: asyncio.Event, answered: asyncio.Future[Any] | None) -> None:
    """Until `event` is set or `answered` is done (which is never cancelled here)."""
    waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(event.wait())]
    if answered is not None:
        waits.append(asyncio.shield(answered))
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


def _outcome(option: PermissionOption | None) -> RequestPermissionResponse:
    if option is None:
        return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
    return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=option.option_id))
