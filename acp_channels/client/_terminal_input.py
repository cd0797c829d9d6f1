"""Where the terminal client's lines come from.

On a terminal (stdin and stdout both): prompt_toolkit, for line editing and a history (Up/Down,
Ctrl-R), kept in a file in the user's state directory unless switched off. Otherwise (a pipe, a
file): plain lines, read without blocking the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, Protocol, TextIO

from prompt_toolkit import PromptSession
from prompt_toolkit.formatted_text import FormattedText
from prompt_toolkit.history import FileHistory, History, InMemoryHistory
from prompt_toolkit.output import create_output
from prompt_toolkit.output.vt100 import Vt100_Output
from prompt_toolkit.patch_stdout import patch_stdout

from ._terminal_output import Screen

__all__ = [
    "CANCELLED",
    "INTERRUPTED",
    "Input",
    "LineReader",
    "PlainInput",
    "TerminalInput",
    "line_or_cancelled",
]

#: What `Input.read` returns for Ctrl-C typed at a prompt_toolkit prompt.
INTERRUPTED = object()
#: What `line_or_cancelled` returns when the wait was cut short.
CANCELLED = object()


class Input(Protocol):
    async def read(self, prompt: str, *, history: bool = True) -> str | object | None:
        """A line; None at the end of the input (Ctrl-D); `INTERRUPTED` for Ctrl-C at the prompt."""


def open_history(path: Path | None) -> tuple[History, str | None]:
    """The history to use and, when the file cannot be used, why (the history is then in memory).
    The file is created readable by its owner only: prompts can hold anything."""
    if path is None:
        return InMemoryHistory(), None
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
    except OSError as exc:
        return InMemoryHistory(), f"history not saved: {exc.strerror or exc} ({path})"
    return FileHistory(str(path)), None


class TerminalInput:
    """prompt_toolkit prompts: line editing, and the history for prompts (not for answers)."""

    def __init__(self, history: History) -> None:
        output = create_output()
        if isinstance(output, Vt100_Output):
            # No cursor position requests: a one-line prompt has no menu to place, and a terminal
            # that does not answer them (an expect script) would get a warning printed.
            output.enable_cpr = False
        self._prompts: PromptSession[str] = PromptSession(history=history, output=output)
        self._answers: PromptSession[str] = PromptSession(history=InMemoryHistory(), output=output)

    async def read(self, prompt: str, *, history: bool = True) -> str | object | None:
        session = self._prompts if history else self._answers
        message = FormattedText([("bold", prompt)])
        try:
            # Output printed meanwhile (a reconnect notice) goes above the prompt; raw keeps colour.
            with patch_stdout(raw=True):
                # Ctrl-C is a key here (the terminal is in raw mode): it raises KeyboardInterrupt,
                # caught below; our SIGINT handler must stay installed, so no handle_sigint.
                return await session.prompt_async(message, handle_sigint=False, set_exception_handler=False)
        except KeyboardInterrupt:
            return INTERRUPTED
        except EOFError:
            return None


class PlainInput:
    """Lines from a pipe or file (or a terminal whose output is not one). The prompt is shown only
    when a person types; otherwise each line read is echoed after the prompt, so a transcript reads
    like a session."""

    def __init__(self, reader: LineReader, screen: Screen, *, interactive: bool) -> None:
        self.reader = reader
        self.screen = screen
        self.interactive = interactive

    async def read(self, prompt: str, *, history: bool = True) -> str | object | None:
        if self.interactive:
            self.screen.prompt(prompt)
        line = await self.reader.readline()
        if line is not None and not self.interactive:
            self.screen.prompt(prompt)
            self.screen.line(line)
        return line


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


async def line_or_cancelled(line: Awaitable[Any], cancelled: Awaitable[Any]) -> Any:
    """The line, or `CANCELLED` if `cancelled` finishes first (the turn was cancelled, or the
    connection failed)."""
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
    return reading.result() if reading in done else CANCELLED
