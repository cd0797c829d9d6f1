"""A terminal ACP client: `python -m acp_channels.client URL` (or the `acp-client` script).

It connects with `HttpClient` (http(s):// = POST+SSE, ws(s):// = WebSocket), initializes, opens
one session (or attaches to a live one: `--attach`) and then reads prompts: with line editing and
a history on a terminal (prompt_toolkit), line by line from a pipe. The agent's messages are
printed as they arrive, tool calls and plans as short marked lines, a spinner with the elapsed
time shows while a turn runs, permission requests are asked as a numbered choice, Ctrl-C cancels
the running turn (`session/cancel`), and `/quit` or Ctrl-D ends the program, closing the
connection (DELETE over HTTP, a Close frame over WebSocket; an attachment detaches). A dropped
stream or socket is resumed when the server can ("[reconnecting…]", then "[resumed]" or "[gave
up] …" is shown). Colour and the spinner only on a terminal, and no colour with `NO_COLOR`.

Shared sessions (docs/shared-sessions.md): attached to a session where a turn runs, it follows
the turn to its end first; `/attach` and `/detach` leave a session without ending it (and say how
to come back); a connection the server no longer has (it restarted, or the session was
terminated) is said in one line, with what can be done next (`/new`, `/load`), instead of going
on with a dead id.

Exit status: 0 after /quit, /detach or Ctrl-D, 1 when the connection failed or was lost (a
refusal included; a lost session replaced by a new one is not), 2 for a usage error (`__main__`),
130 when Ctrl-C interrupted connecting.

It is written against the `acp` SDK's client side, so it works with any ACP agent server. Here:
setting up and tearing down; the command loop is terminal_shell, opening connections
terminal_link, what the agent asks of the client `TerminalClient` (terminal_client), the lines
come from terminal_input and everything printed goes through terminal_output.
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
from typing import TextIO

import acp

from ._auth_hint import Credential, refusal_hint
from ._errors import AuthenticationError, TransportError
from ._oauth_login import StoredLogin
from ._reconnect import DEFAULT_BACKOFF, ReconnectPolicy
from ._shared_sessions import AttachRole
from ._terminal_client import PermissionMode, TerminalClient
from ._terminal_input import Input, LineReader, PlainInput, TerminalInput, open_history
from ._terminal_link import Linker
from ._terminal_output import Screen, describe_error, describe_request_error
from ._terminal_shell import COMMANDS, EXIT_CONNECTION_FAILED, EXIT_INTERRUPTED, EXIT_TURN_NOT_DONE, Shell
from ._token_source import TokenSource

__all__ = ["COMMANDS", "EXIT_CONNECTION_FAILED", "EXIT_INTERRUPTED", "EXIT_TURN_NOT_DONE", "run"]


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _credential(token: str | TokenSource | None, headers: Mapping[str, str] | None) -> Credential:
    """Where the credentials sent came from, for the hint after a refusal."""
    if isinstance(token, StoredLogin):
        return "login"
    if token is not None:
        return "token"
    return "header" if any(name.lower() == "authorization" for name in headers or {}) else None


async def run(
    url: str,
    *,
    cwd: str | None = None,
    headers: Mapping[str, str] | None = None,
    token: str | TokenSource | None = None,
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
    attach: str | None = None,
    role: AttachRole = "controller",
) -> int:
    """Run the terminal client until /quit, /detach, EOF or a second Ctrl-C; returns the exit status.
    `history`: the file keeping the prompts (None: in memory only); used on a terminal only.
    `prompt`: one turn with it, then exit: 0 when it ends with `end_turn`, EXIT_TURN_NOT_DONE for
    another stop reason, 1 for an error. `attach`: attach to that live session (as `role`)
    instead of opening one; a turn running there is followed to its end first."""
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
    client = TerminalClient(screen, lines, permissions=permissions, fs=fs)
    linker = Linker(
        url,
        client=client,
        screen=screen,
        cwd=cwd or os.getcwd(),
        headers=headers,
        token=token,
        token_subprotocol=token_subprotocol,
        timeout=timeout,
        reconnect=reconnect,
        restart=restart,
        fs=fs,
    )
    shell = Shell(screen, lines, reader, client, linker, role=role, close_timeout=(timeout or 30.0) + 5)
    client.cancel_turn = shell.cancel_turn
    client.quit_now = shell.quit_now
    loop = asyncio.get_running_loop()

    def interrupt() -> None:
        client.interrupt(shell.cancel_turn, shell.quit_now)
        if client.turn is None and not client.quit_requested and isinstance(lines, PlainInput) and lines.interactive:
            screen.prompt("> ")  # the hint ended the prompt's line

    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, interrupt)
    if reader is not None:
        reader.start()
    status = 0
    first = linker.attach(attach, role) if attach is not None else linker.new_session()
    try:
        status = await shell.run(first, prompt)
    except asyncio.CancelledError:
        if not client.quit_requested:
            raise
        status = EXIT_INTERRUPTED  # Ctrl-C while connecting
    except (TransportError, ConnectionError, acp.RequestError) as error:
        if isinstance(error, acp.RequestError):
            screen.error(describe_request_error(error))
        else:
            screen.error(describe_error(error, linker.endpoint))
        if isinstance(error, AuthenticationError):
            screen.hint(refusal_hint(error, linker.kind, url=url, credential=_credential(token, headers)))
        status = EXIT_CONNECTION_FAILED
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGINT)
        if reader is not None:
            reader.stop()
        await shell.close()
    return status
