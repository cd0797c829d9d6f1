"""A terminal ACP client: `python -m acp_channels.client URL` (or the `acp-client` script).

It connects with `HttpClient` (http(s):// = POST+SSE, ws(s):// = WebSocket), initializes, opens
one session and then reads prompts: with line editing and a history on a terminal
(prompt_toolkit), line by line from a pipe. The agent's messages are printed as they arrive,
tool calls and plans as short marked lines, a spinner with the elapsed time shows while a turn
runs, permission requests are asked as a numbered choice, Ctrl-C cancels the running turn
(`session/cancel`), and `/quit` or Ctrl-D ends the program, closing the connection (DELETE over
HTTP, a Close frame over WebSocket). A dropped stream or socket is resumed when the server can
("[reconnecting…]", then "[resumed]" or "[gave up] …" is shown). Colour and the spinner only on
a terminal, and no colour with `NO_COLOR` (terminal_output).

Exit status: 0 after /quit or Ctrl-D, 1 when the connection failed or was lost (a refusal
included), 2 for a usage error (`__main__`), 130 when Ctrl-C interrupted connecting.

It is written against the `acp` SDK's client side, so it works with any ACP agent server.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TextIO, cast

import acp
from acp.interfaces import Client
from acp.schema import (
    AgentMessageChunk,
    AgentPlanUpdate,
    AgentThoughtChunk,
    AllowedOutcome,
    AvailableCommand,
    AvailableCommandsUpdate,
    ClientCapabilities,
    ContentToolCallContent,
    CurrentModeUpdate,
    DeniedOutcome,
    FileEditToolCallContent,
    FileSystemCapabilities,
    Implementation,
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

from acp_channels import __version__

from .errors import AuthenticationError, TransportError
from .http_client import HttpClient
from .reconnect import DEFAULT_BACKOFF, ReconnectEvent, ReconnectPolicy
from .terminal_input import INTERRUPTED, Input, LineReader, PlainInput, TerminalInput, open_history
from .terminal_output import STATUS_STYLES, Screen, describe_error, elapsed

__all__ = ["COMMANDS", "EXIT_CONNECTION_FAILED", "EXIT_INTERRUPTED", "PermissionMode", "TerminalClient", "run"]

PermissionMode = Literal["ask", "allow", "reject"]

#: Exit statuses (2, a usage error, is the command line's: see __main__).
EXIT_CONNECTION_FAILED = 1
EXIT_INTERRUPTED = 130

#: The client's own commands, for /help: (names, what it does).
COMMANDS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("/help",), "this list"),
    (("/info",), "the agent, the URL, the connection and the session"),
    (("/quit", "/exit", "/q"), "close the connection and exit (Ctrl-D too)"),
)
KEYS: tuple[tuple[str, str], ...] = (
    ("Enter", "send the prompt"),
    ("Up / Down", "earlier prompts (Ctrl-R searches them)"),
    ("Ctrl-C", "cancel the running turn; at the prompt, twice to exit"),
    ("Ctrl-D", "exit"),
)
QUIT_COMMANDS = frozenset(COMMANDS[2][0])
GREETING = "Type a prompt and press Enter, or /help. Ctrl-C cancels a running turn; /quit or Ctrl-D exits."


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
        screen.pause_turn()
        try:
            return await self._ask(question, options)
        finally:
            screen.resume_turn()

    async def _ask(self, question: Text, options: list[PermissionOption]) -> RequestPermissionResponse:
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
            answer = await _first(self.lines.read(f"Choose 1-{len(options)}: ", history=False), cancelled.wait())
            if answer is INTERRUPTED and self.turn is not None:
                self.interrupt(self.cancel_turn, self.quit_now)
            if answer is _CANCELLED or answer is INTERRUPTED:
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


_CANCELLED = object()


async def _first(line: Any, cancelled: Any) -> Any:
    """The line, or _CANCELLED if the turn is cancelled first."""
    reading = asyncio.ensure_future(line)
    waiting = asyncio.ensure_future(cancelled)
    try:
        done, _ = await asyncio.wait({reading, waiting}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiting.cancel()
        if not reading.done():
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading  # a prompt_toolkit prompt puts the terminal back first
    return reading.result() if reading in done else _CANCELLED


class ReconnectNotices:
    """Tells the terminal user about drops: "reconnecting…" once per outage, then how it ended."""

    def __init__(self, screen: Screen) -> None:
        self.screen = screen
        self.transport: HttpClient | None = None
        self._shown = False

    def __call__(self, event: ReconnectEvent) -> None:
        if event.kind == "reconnecting":
            if not self._shown:
                self._shown = True
                self.screen.line(f"[reconnecting…] {event.what}: {describe_error(event.error)}", style="yellow")
        elif event.kind == "resumed":
            if self._shown and (self.transport is None or not self.transport.reconnecting):
                self._shown = False
                self.screen.line("[resumed] nothing was lost", style="green")
        elif event.kind == "restarted":
            self._shown = False
            self.screen.line(f"[{event}]", style="yellow")
        else:
            self._shown = False
            self.screen.line(f"[gave up] {describe_error(event.error)}", style="red")


def _pick(answer: str, options: list[PermissionOption]) -> PermissionOption | None:
    if answer.isdigit() and 1 <= int(answer) <= len(options):
        return options[int(answer) - 1]
    lowered = answer.lower()
    for option in options:
        if lowered in (option.option_id.lower(), option.name.lower()):
            return option
    return None


def _outcome(option: PermissionOption | None) -> RequestPermissionResponse:
    if option is None:
        return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
    return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=option.option_id))


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def show_help(screen: Screen, agent_commands: list[AvailableCommand]) -> None:
    """/help: every command with what it does, the agent's commands, the keys."""
    rows: list[tuple[str, str]] = [(", ".join(names), what) for names, what in COMMANDS]
    width = max(len(name) for name, _ in [*rows, *KEYS, *((f"/{c.name}", "") for c in agent_commands)]) + 2
    screen.line("commands", style="bold")
    for name, what in rows:
        screen.line(Text.assemble("  ", (name.ljust(width), "cyan"), what))
    if agent_commands:
        screen.line("the agent's commands (sent to it as a prompt)", style="bold")
        for command in agent_commands:
            screen.line(Text.assemble("  ", (f"/{command.name}".ljust(width), "cyan"), command.description))
    screen.line("keys", style="bold")
    for key, what in KEYS:
        screen.line(Text.assemble("  ", (key.ljust(width), "cyan"), what))
    screen.line("Anything else is sent to the agent as a prompt.", style="dim")


def _request_error(error: acp.RequestError) -> str:
    """`demo failure (-32603)`, with the details when they add something."""
    message = str(error) or "request failed"
    data = error.data
    details = data.get("details") if isinstance(data, dict) else data
    extra = f": {details}" if details and str(details) != message else ""
    return f"{message} ({error.code}){extra}"


async def run(
    url: str,
    *,
    cwd: str | None = None,
    headers: Mapping[str, str] | None = None,
    token: str | None = None,
    token_subprotocol: bool = False,
    timeout: float | None = 30.0,
    permissions: PermissionMode = "ask",
    fs: bool = False,
    stdin: TextIO | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    reconnect: ReconnectPolicy | None = DEFAULT_BACKOFF,
    restart: bool = False,
    history: Path | None = None,
) -> int:
    """Run the terminal client until /quit, EOF or a second Ctrl-C; returns the exit status.
    `history`: the file keeping the prompts (None: in memory only); used on a terminal only."""
    screen = Screen(stdout, stderr)
    input_stream = stdin or sys.stdin
    reader: LineReader | None = None
    lines: Input
    if _is_terminal(input_stream) and _is_terminal(stdout or sys.stdout):
        prompt_history, problem = open_history(history)
        if problem:
            screen.warning(problem)
        lines = TerminalInput(prompt_history)
    else:
        reader = LineReader(input_stream)
        lines = PlainInput(reader, screen, interactive=_is_terminal(input_stream))
    notices = ReconnectNotices(screen)
    transport = HttpClient(
        url,
        headers=headers,
        token=token,
        websocket_token="subprotocol" if token_subprotocol else "header",
        timeout=timeout,
        reconnect=reconnect,
        restart=restart,
        on_reconnect=notices,
    )
    notices.transport = transport
    client = TerminalClient(screen, lines, permissions=permissions, fs=fs)
    conn = acp.connect_to_agent(cast(Client, client), transport)
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    session_id: str | None = None
    pending: set[asyncio.Task[Any]] = set()

    def cancel_turn() -> None:
        if session_id is not None:
            task = asyncio.ensure_future(conn.cancel(session_id=session_id))
            pending.add(task)
            task.add_done_callback(pending.discard)

    def quit_now() -> None:
        client.quit_requested = True
        if reader is not None:
            reader.push_eof()
        if client.turn is not None:
            client.turn.task.cancel()
        elif session_id is None and main is not None:
            main.cancel()  # still connecting

    def interrupt() -> None:
        client.interrupt(cancel_turn, quit_now)
        if client.turn is None and not client.quit_requested and isinstance(lines, PlainInput) and lines.interactive:
            screen.prompt("> ")  # the hint ended the prompt's line

    client.cancel_turn = cancel_turn
    client.quit_now = quit_now
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, interrupt)
    if reader is not None:
        reader.start()
    status = 0
    try:
        init = await conn.initialize(
            protocol_version=acp.PROTOCOL_VERSION,
            client_capabilities=ClientCapabilities(fs=FileSystemCapabilities(read_text_file=fs, write_text_file=fs)),
            client_info=Implementation(
                name="acp-channels-terminal", title="acp-channels terminal", version=__version__
            ),
        )
        agent = init.agent_info
        name = f"{agent.title or agent.name} {agent.version}" if agent else "the agent"
        shape = "HTTP+SSE" if transport.kind == "http" else "WebSocket"
        session = await conn.new_session(cwd=cwd or os.getcwd(), mcp_servers=[])
        session_id = session.session_id
        screen.line(Text.assemble("Connected to ", (name, "bold"), f" over {shape} at {transport.url}"))
        info = f"connection {transport.connection_id or '-'}  session {session_id}"
        screen.line(info, style="dim")
        screen.line(GREETING, style="dim")
        while not client.quit_requested:
            line = await _first(lines.read("> "), transport.wait_failed())
            if line is _CANCELLED:
                screen.line()  # leave the prompt's line
                raise transport.error or TransportError("connection lost")
            if line is None:
                if not isinstance(lines, PlainInput) or lines.interactive:
                    screen.line()  # Ctrl-D leaves the cursor after the prompt
                break
            if line is INTERRUPTED:
                client.interrupt(cancel_turn, quit_now)
                continue
            client.quit_armed = False
            text = str(line).strip()
            if not text:
                continue
            if text in QUIT_COMMANDS:
                break
            if text == "/help":
                show_help(screen, client.agent_commands)
                continue
            if text == "/info":
                screen.line(f"{name} over {shape} at {transport.url}")
                screen.line(info)
                continue
            screen.start_turn()
            turn = Turn(asyncio.ensure_future(conn.prompt(session_id=session_id, prompt=[acp.text_block(text)])))
            client.turn = turn
            outcome: Any
            try:
                outcome = await turn.task
            except acp.RequestError as exc:
                outcome = exc
            except asyncio.CancelledError:
                if not client.quit_requested:
                    raise
                outcome = None
            finally:
                client.turn = None
                took = screen.end_turn()
            if outcome is None:
                screen.line("[quit]", style="yellow")
                break
            if isinstance(outcome, acp.RequestError):
                screen.error(_request_error(outcome))
                continue
            reason = str(outcome.stop_reason)
            style = "dim" if reason == "end_turn" else "yellow"
            screen.line(Text.assemble((f"[{reason}]", style), (f" {elapsed(took)}", "dim")))
    except asyncio.CancelledError:
        if not client.quit_requested:
            raise
        if main is not None:
            main.uncancel()  # Ctrl-C while connecting: handled, go on closing
        status = EXIT_INTERRUPTED
    except (TransportError, ConnectionError, acp.RequestError) as exc:
        error = transport.error or exc
        if isinstance(error, acp.RequestError):
            screen.error(_request_error(error))
        else:
            screen.error(describe_error(error, transport.url))
        if isinstance(error, AuthenticationError):
            screen.hint(_refusal_hint(error, transport.kind))
        status = EXIT_CONNECTION_FAILED
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGINT)
        if reader is not None:
            reader.stop()
        for task in pending:
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conn.close(), (timeout or 30.0) + 5)
        if session_id is not None:
            screen.line("Disconnected.", style="dim")
    return status


def _refusal_hint(error: AuthenticationError, kind: str) -> str:
    """What to do about a 401/403, in a line."""
    if not error.credentials_sent and error.status_code == 401:
        return "The server requires authentication: set ACP_TOKEN (or pass --token)."
    if not error.credentials_sent and kind == "ws":
        # Servers such as daphne refuse any WebSocket upgrade with 403, a wrong path too.
        return (
            "The server refused the WebSocket (403): it requires authentication "
            "(set ACP_TOKEN or pass --token), or the URL is wrong."
        )
    if error.status_code == 401:
        return "The server refused the token: check ACP_TOKEN or --token."
    if kind == "ws":
        # Servers such as daphne can refuse a WebSocket upgrade only with 403.
        return "The server refused the WebSocket (403): the token is wrong or not allowed here."
    return "The server refused access (403): these credentials are not allowed here."
