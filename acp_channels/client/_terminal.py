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

It is written against the `acp` SDK's client side, so it works with any ACP agent server. Here:
the command loop; what the agent asks of the client is `TerminalClient` (terminal_client), the
lines come from terminal_input and everything printed goes through terminal_output.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO, cast

import acp
from acp.interfaces import Client
from acp.schema import AvailableCommand, ClientCapabilities, FileSystemCapabilities, Implementation
from rich.text import Text

from acp_channels import __version__

from ._directory import sessions_table
from ._errors import AcpClientError, AuthenticationError, TransportError
from ._http_client import HttpClient
from ._reconnect import DEFAULT_BACKOFF, ReconnectPolicy
from ._terminal_client import PermissionMode, TerminalClient, Turn
from ._terminal_input import (
    CANCELLED,
    INTERRUPTED,
    Input,
    LineReader,
    PlainInput,
    TerminalInput,
    line_or_cancelled,
    open_history,
)
from ._terminal_output import ReconnectNotices, Screen, describe_error, describe_request_error, elapsed, refusal_hint

__all__ = ["COMMANDS", "EXIT_CONNECTION_FAILED", "EXIT_INTERRUPTED", "EXIT_TURN_NOT_DONE", "run"]

#: Exit statuses (2, a usage error, is the command line's: see __main__).
EXIT_CONNECTION_FAILED = 1
#: `-p`: the turn ended for another reason than `end_turn` (cancelled, refusal, max_tokens...).
EXIT_TURN_NOT_DONE = 3
EXIT_INTERRUPTED = 130

#: The client's own commands, for /help: (names, what it does).
COMMANDS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("/help",), "this list"),
    (("/info",), "the agent, the URL, the connection and the session"),
    (("/sessions",), "your live sessions on the server (its session directory)"),
    (("/new",), "a new session on this connection (the one before goes on on the server)"),
    (("/quit", "/exit", "/q"), "close the connection and exit (Ctrl-D too)"),
)
KEYS: tuple[tuple[str, str], ...] = (
    ("Enter", "send the prompt"),
    ("Up / Down", "earlier prompts (Ctrl-R searches them)"),
    ("Ctrl-C", "cancel the running turn; at the prompt, twice to exit"),
    ("Ctrl-D", "exit"),
)
QUIT_COMMANDS = frozenset(next(names for names, _ in COMMANDS if "/quit" in names))
GREETING = "Type a prompt and press Enter, or /help. Ctrl-C cancels a running turn; /quit or Ctrl-D exits."


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
    prompt: str | None = None,
) -> int:
    """Run the terminal client until /quit, EOF or a second Ctrl-C; returns the exit status.
    `history`: the file keeping the prompts (None: in memory only); used on a terminal only.
    `prompt`: one turn with it, then exit: 0 when it ends with `end_turn`, EXIT_TURN_NOT_DONE for
    another stop reason, 1 for an error."""
    screen = Screen(stdout, stderr)
    input_stream = io.StringIO(prompt + "\n") if prompt is not None else stdin or sys.stdin
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
    #: How the last turn ended: its stop reason, or "error".
    last_turn: str | None = None
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
            line = await line_or_cancelled(lines.read("> "), transport.wait_failed())
            if line is CANCELLED:
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
            if text == "/new":
                try:
                    session_id = (await conn.new_session(cwd=cwd or os.getcwd(), mcp_servers=[])).session_id
                except acp.RequestError as exc:
                    screen.error(describe_request_error(exc))
                    continue
                info = f"connection {transport.connection_id or '-'}  session {session_id}"
                screen.line(info, style="dim")
                continue
            if text == "/sessions":
                try:
                    screen.line(sessions_table(await transport.list_sessions()))
                except AcpClientError as exc:
                    screen.error(str(exc))
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
                screen.error(describe_request_error(outcome))
                last_turn = "error"
                continue
            reason = last_turn = str(outcome.stop_reason)
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
            screen.error(describe_request_error(error))
        else:
            screen.error(describe_error(error, transport.url))
        if isinstance(error, AuthenticationError):
            screen.hint(refusal_hint(error, transport.kind))
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
    if prompt is not None and status == 0:
        status = {"end_turn": 0, "error": EXIT_CONNECTION_FAILED}.get(last_turn or "error", EXIT_TURN_NOT_DONE)
    return status
