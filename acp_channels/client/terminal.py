"""A terminal ACP client: `python -m acp_channels.client URL` (or the `acp-client` script).

It connects with `HttpClient` (http(s):// = POST+SSE, ws(s):// = WebSocket), initializes, opens
one session and then reads prompts line by line. The agent's messages are printed as they
arrive, tool calls are shown with each status change, permission requests are asked on the
terminal, Ctrl-C cancels the running turn (`session/cancel`), and `/quit` or Ctrl-D ends the
program, closing the connection (DELETE over HTTP, a Close frame over WebSocket). A dropped
stream or socket is resumed when the server can ("[reconnecting…]", then "[resumed]" or
"[gave up] …" is shown).

It is written against the `acp` SDK's client side, so it works with any ACP agent server.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
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
    AvailableCommandsUpdate,
    ClientCapabilities,
    ContentToolCallContent,
    CurrentModeUpdate,
    DeniedOutcome,
    FileSystemCapabilities,
    Implementation,
    PermissionOption,
    ReadTextFileResponse,
    RequestPermissionResponse,
    TextContentBlock,
    ToolCallProgress,
    ToolCallStart,
    ToolCallUpdate,
    UserMessageChunk,
    WriteTextFileResponse,
)

from acp_channels import __version__

from .errors import AuthenticationError, TransportError
from .http_client import HttpClient
from .reconnect import DEFAULT_BACKOFF, ReconnectEvent, ReconnectPolicy

__all__ = ["PermissionMode", "TerminalClient", "run"]

PermissionMode = Literal["ask", "allow", "reject"]
QUIT_COMMANDS = frozenset({"/quit", "/exit", "/q"})
HELP = "Type a prompt and press Enter. Ctrl-C cancels a running turn; /quit or Ctrl-D exits."


class Console:
    """Writes to the terminal, remembering whether the cursor is at the start of a line so
    status lines never run into streamed agent text."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self._at_line_start = True
        self._section: str | None = None

    def text(self, text: str, section: str = "agent") -> None:
        if not text:
            return
        if section != self._section:
            self.end_line()
            if section == "thought":
                self._write("(thinking) ")
            elif section == "user":
                self._write("you: ")
            self._section = section
        self._write(text)

    def line(self, text: str) -> None:
        self.end_line()
        self._section = None
        self._write(text + "\n")

    def prompt(self, text: str) -> None:
        self.end_line()
        self._section = None
        self._write(text)
        self._at_line_start = True  # what the user types ends with their Enter

    def end_line(self) -> None:
        if not self._at_line_start:
            self._write("\n")

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()
        self._at_line_start = text.endswith("\n")


class LineReader:
    """Lines from stdin for an asyncio program: the event loop watches the descriptor (the tty
    does the line editing), or a thread reads when the input cannot be watched (a file)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._lines: asyncio.Queue[str | None] = asyncio.Queue()
        self._buffer = b""
        self._fd: int | None = None
        self._eof = False

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            fd = self._stream.fileno()
            loop.add_reader(fd, self._readable, fd)
            self._fd = fd
        except (OSError, ValueError, NotImplementedError):
            threading.Thread(target=self._read_thread, args=(loop,), daemon=True).start()

    def stop(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._fd)
            self._fd = None

    def _readable(self, fd: int) -> None:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            if self._buffer:
                self._lines.put_nowait(self._buffer.decode(errors="replace"))
                self._buffer = b""
            self.stop()
            self.push_eof()
            return
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            self._lines.put_nowait(line.decode(errors="replace").rstrip("\r"))

    def _read_thread(self, loop: asyncio.AbstractEventLoop) -> None:
        for line in self._stream:
            loop.call_soon_threadsafe(self._lines.put_nowait, line.rstrip("\r\n"))
        loop.call_soon_threadsafe(self.push_eof)

    def push_eof(self) -> None:
        """End the input (Ctrl-D, or a second Ctrl-C at the prompt)."""
        if not self._eof:
            self._eof = True
            self._lines.put_nowait(None)

    async def readline(self) -> str | None:
        line = await self._lines.get()
        if line is None:
            self._lines.put_nowait(None)  # EOF stays EOF
        return line


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
        console: Console,
        lines: LineReader,
        *,
        permissions: PermissionMode = "ask",
        fs: bool = False,
    ) -> None:
        self.console = console
        self.lines = lines
        self.permissions = permissions
        self.fs = fs
        self.turn: Turn | None = None
        self.quit_requested = False
        self.quit_armed = False
        self._tool_titles: dict[str, str] = {}

    # --------------------------------------------------------------------- session/update

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        console = self.console
        if isinstance(update, AgentMessageChunk | AgentThoughtChunk | UserMessageChunk):
            section = {AgentMessageChunk: "agent", AgentThoughtChunk: "thought", UserMessageChunk: "user"}
            content = update.content
            if isinstance(content, TextContentBlock):
                console.text(content.text, section[type(update)])
            else:
                console.line(f"[{content.type} content]")
        elif isinstance(update, ToolCallStart):
            self._tool_titles[update.tool_call_id] = update.title
            kind = f" ({update.kind})" if update.kind else ""
            console.line(f"[tool] {update.title}{kind}: {update.status or 'pending'}")
            self._show_tool_content(update.content)
        elif isinstance(update, ToolCallProgress):
            if update.title:
                self._tool_titles[update.tool_call_id] = update.title
            title = self._tool_titles.get(update.tool_call_id, update.tool_call_id)
            if update.status:
                console.line(f"[tool] {title}: {update.status}")
            self._show_tool_content(update.content)
        elif isinstance(update, AgentPlanUpdate):
            console.line("[plan]")
            for entry in update.entries:
                console.line(f"  [{entry.status}] {entry.content}")
        elif isinstance(update, CurrentModeUpdate):
            console.line(f"[mode] {update.current_mode_id}")
        elif isinstance(update, AvailableCommandsUpdate):
            names = " ".join(f"/{command.name}" for command in update.available_commands)
            console.line(f"[commands] {names}")
        else:
            console.line(f"[{getattr(update, 'session_update', 'update')}]")

    def _show_tool_content(self, content: list[Any] | None) -> None:
        for item in content or []:
            if isinstance(item, ContentToolCallContent) and isinstance(item.content, TextContentBlock):
                for text_line in item.content.text.splitlines() or [""]:
                    self.console.line(f"  | {text_line}")
            else:
                self.console.line(f"  | [{getattr(item, 'type', 'content')}]")

    # ---------------------------------------------------------------------- permissions

    async def request_permission(
        self, session_id: str, tool_call: ToolCallUpdate, options: list[PermissionOption], **kwargs: Any
    ) -> RequestPermissionResponse:
        title = tool_call.title or self._tool_titles.get(tool_call.tool_call_id, tool_call.tool_call_id)
        console = self.console
        if self.permissions != "ask":
            wanted = "allow" if self.permissions == "allow" else "reject"
            chosen = next((option for option in options if option.kind.startswith(wanted)), None)
            console.line(f"[permission] {title}: {chosen.name if chosen else 'cancelled'} (--permissions)")
            return _outcome(chosen)
        console.line(f"[permission] {title}")
        for number, option in enumerate(options, 1):
            console.line(f"  {number}) {option.name} [{option.kind}]")
        cancelled = self.turn.cancel_requested if self.turn else asyncio.Event()
        while True:
            console.prompt(f"Choose 1-{len(options)}: ")
            answer = await _first(self.lines.readline(), cancelled.wait())
            if answer is _CANCELLED:
                console.line("[permission] cancelled")
                return _outcome(None)
            if answer is None:
                self.quit_requested = True
                return _outcome(None)
            chosen = _pick(str(answer).strip(), options)
            if chosen is not None:
                console.line(f"[permission] {chosen.name}")
                return _outcome(chosen)
            console.line("  answer with a number or an option name")

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
        self.console.line(f"[fs] read {path}")
        return ReadTextFileResponse(content=text)

    async def write_text_file(self, session_id: str, path: str, content: str, **kwargs: Any) -> WriteTextFileResponse:
        if not self.fs:
            raise acp.RequestError.method_not_found("fs/write_text_file")
        await asyncio.to_thread(Path(path).write_text, content)
        self.console.line(f"[fs] wrote {path}")
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
                self.console.line(" (press Ctrl-C again, Ctrl-D or type /quit to exit)")
                self.console.prompt("> ")
        elif turn.cancel_requested.is_set():
            self.console.line("^C again: quitting")
            quit_now()
        else:
            turn.cancel_requested.set()
            self.console.line(" cancelling the turn...")
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
    return reading.result() if reading in done else _CANCELLED


class ReconnectNotices:
    """Tells the terminal user about drops: "reconnecting…" once per outage, then how it ended."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.transport: HttpClient | None = None
        self._shown = False

    def __call__(self, event: ReconnectEvent) -> None:
        if event.kind == "reconnecting":
            if not self._shown:
                self._shown = True
                self.console.line(f"[reconnecting…] {event.what}: {event.error}")
        elif event.kind == "resumed":
            if self._shown and (self.transport is None or not self.transport.reconnecting):
                self._shown = False
                self.console.line("[resumed] nothing was lost")
        elif event.kind == "restarted":
            self._shown = False
            self.console.line(f"[{event}]")
        else:
            self._shown = False
            self.console.line(f"[gave up] {event.error}")


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
    reconnect: ReconnectPolicy | None = DEFAULT_BACKOFF,
    restart: bool = False,
) -> int:
    """Run the terminal client until /quit, EOF or a second Ctrl-C; returns the exit status."""
    console = Console(stdout or sys.stdout)
    lines = LineReader(stdin or sys.stdin)
    notices = ReconnectNotices(console)
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
    client = TerminalClient(console, lines, permissions=permissions, fs=fs)
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
        lines.push_eof()
        if client.turn is not None:
            client.turn.task.cancel()
        elif session_id is None and main is not None:
            main.cancel()  # still connecting

    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, client.interrupt, cancel_turn, quit_now)
    lines.start()
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
        console.line(f"Connected to {name} over {shape} at {transport.url}")
        console.line(f"connection {transport.connection_id or '-'}  session {session_id}")
        console.line(HELP)
        while not client.quit_requested:
            console.prompt("> ")
            line = await _first(lines.readline(), transport.wait_failed())
            if line is _CANCELLED:
                console.line("")  # leave the prompt's line
                raise transport.error or TransportError("connection lost")
            if line is None:
                console.line("")  # Ctrl-D leaves the cursor after the prompt
                break
            client.quit_armed = False
            text = str(line).strip()
            if not text:
                continue
            if text in QUIT_COMMANDS:
                break
            if text == "/help":
                console.line(HELP)
                continue
            turn = Turn(asyncio.ensure_future(conn.prompt(session_id=session_id, prompt=[acp.text_block(text)])))
            client.turn = turn
            try:
                response = await turn.task
            except asyncio.CancelledError:
                if not client.quit_requested:
                    raise
                console.line("[quit]")
                break
            except acp.RequestError as exc:
                console.line(f"[error {exc.code}] {exc}{_detail(exc.data)}")
                continue
            finally:
                client.turn = None
            console.line(f"[{response.stop_reason}]")
    except asyncio.CancelledError:
        if not client.quit_requested:
            raise
        if main is not None:
            main.uncancel()  # Ctrl-C while connecting: handled, go on closing
        status = 130
    except (TransportError, ConnectionError, acp.RequestError) as exc:
        error = transport.error or exc
        console.line(f"error: {error}")
        if isinstance(error, AuthenticationError):
            console.line(_refusal_hint(error, transport.kind))
        status = 1
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGINT)
        lines.stop()
        for task in pending:
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conn.close(), (timeout or 30.0) + 5)
        console.line("Disconnected.")
    return status


def _refusal_hint(error: AuthenticationError, kind: str) -> str:
    """What to do about a 401/403, in a line."""
    if not error.credentials_sent and (error.status_code == 401 or kind == "ws"):
        return "The server requires authentication: set ACP_TOKEN (or pass --token)."
    if error.status_code == 401:
        return "The server refused the token: check ACP_TOKEN or --token."
    if kind == "ws":
        # Servers such as daphne can refuse a WebSocket upgrade only with 403.
        return "The server refused the WebSocket (403): the token is wrong or not allowed here."
    return "The server refused access (403): these credentials are not allowed here."


def _detail(data: Any) -> str:
    if isinstance(data, dict) and isinstance(data.get("details"), str):
        return f": {data['details']}"
    return f": {data}" if data else ""
