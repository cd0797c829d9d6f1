"""What the terminal client prints, through rich.

On a terminal: colour, and while a turn runs a live area at the bottom holding the line the agent
is still writing and a spinner with the elapsed time; finished lines are printed above it, so the
scrollback holds the whole conversation and the spinner is gone when the turn ends. Anywhere else
(a pipe, a file, `TERM=dumb`), or with `NO_COLOR` set: no colour, and no cursor movement at all
when the output is not a terminal (rich decides both).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from http import HTTPStatus
from typing import TextIO

import acp
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.live import Live
from rich.spinner import Spinner
from rich.text import Text

from ._errors import HttpStatusError, NetworkError
from ._http_client import HttpClient, shown_url
from ._reconnect import ReconnectEvent

__all__ = [
    "STATUS_STYLES",
    "Marks",
    "ReconnectNotices",
    "Screen",
    "describe_error",
    "describe_request_error",
    "elapsed",
]

#: The longest reason taken from a server's error body (the rest is cut with "…").
REASON_LIMIT = 160


@dataclass(frozen=True)
class Marks:
    """The status marks of tool calls and plan entries (ASCII when the output cannot take more)."""

    pending: str
    in_progress: str
    completed: str
    failed: str
    content: str
    question: str
    answer: str

    def status(self, status: str) -> str:
        return {
            "pending": self.pending,
            "in_progress": self.in_progress,
            "completed": self.completed,
            "failed": self.failed,
        }.get(status, self.pending)


UNICODE_MARKS = Marks(pending="○", in_progress="◐", completed="✓", failed="✗", content="│", question="?", answer="→")
ASCII_MARKS = Marks(
    pending="[ ]", in_progress="[~]", completed="[x]", failed="[!]", content="|", question="?", answer="->"
)

STATUS_STYLES = {"pending": "dim", "in_progress": "yellow", "completed": "green", "failed": "red"}


def elapsed(seconds: float) -> str:
    """`4.2s`, `42s`, `3m05s`."""
    if seconds < 10:
        return f"{seconds:.1f}s"
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes}m{rest:02d}s"


def describe_error(error: BaseException | None, url: str | None = None) -> str:
    """One line for the user: a refused request as `404 Not Found from URL: reason` (the reason
    only when the server sent a short plain-text one, never an HTML page), a network failure as
    `no connection to URL (…)`, anything else as its message's first line."""
    if error is None:
        return "unknown error"
    if isinstance(error, HttpStatusError):
        try:
            phrase = HTTPStatus(error.status_code).phrase
        except ValueError:
            phrase = "HTTP status"
        where = f" from {shown_url(url)}" if url else ""
        reason = _plain_reason(error.body)
        return f"{error.status_code} {phrase}{where}" + (f": {reason}" if reason else "")
    message = _one_line(str(error) or type(error).__name__)
    if isinstance(error, NetworkError) and url:
        return f"no connection to {shown_url(url)} ({message})"
    return message


def _plain_reason(body: str) -> str:
    text = body.strip()
    if not text or text.startswith("<") or "<html" in text[:500].lower():
        return ""
    return _one_line(text)


def _one_line(text: str) -> str:
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first if len(first) <= REASON_LIMIT else first[: REASON_LIMIT - 1] + "…"


class _TurnView:
    """The live area while a turn runs: the unfinished line, then a spinner with the elapsed time."""

    def __init__(self, screen: Screen, started: float, label: str) -> None:
        self.screen = screen
        self.started = started
        self.label = label
        self.spinner = Spinner("dots", style="cyan")

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        line = self.screen.current_line  # replaced, never mutated: safe to read from the refresh thread
        if line.plain:
            yield line
        took = elapsed(time.monotonic() - self.started)
        self.spinner.update(text=Text(f"{self.label} {took} · Ctrl-C cancels", style="dim"))
        yield self.spinner


class Screen:
    """Output of the terminal client. Agent text streams into the current line; `line()` prints
    a whole line, ending the current one first, so notices never run into the agent's text."""

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None) -> None:
        # file=None: rich looks up sys.stdout at each write, so prompt_toolkit's patch_stdout
        # (used while a prompt is shown) catches it.
        self.out = _console(out, stderr=False)
        self.err = _console(err, stderr=err is None)
        self.animated = self.out.is_terminal and not self.out.is_dumb_terminal
        self.marks = UNICODE_MARKS if self.out.encoding.lower().replace("-", "").startswith("utf") else ASCII_MARKS
        self.current_line = Text()
        self._at_line_start = True  # used when not animated: text goes out as it comes
        self._section: str | None = None
        self._live: Live | None = None
        self._turn_started: float | None = None

    # ----------------------------------------------------------------------------- text

    def text(self, text: str, section: str = "agent") -> None:
        """Streamed message text; `section` (agent, thought, user) starts a new line when it changes."""
        if not text:
            return
        if section != self._section:
            self.end_line()
            self._section = section
            if section == "thought":
                self._append("thinking: ", "dim italic")
            elif section == "user":
                self._append("you: ", "bold")
        self._append(text, "dim italic" if section == "thought" else "")

    def _append(self, text: str, style: str) -> None:
        if self._live is None:
            self.out.print(Text(text, style=style), end="")
            self._at_line_start = text.endswith("\n")
            return
        *finished, rest = text.split("\n")
        line = self.current_line
        for piece in finished:
            self._commit(line + Text(piece, style=style))
            line = Text()
        line = line + Text(rest, style=style)
        # Keep the live area one row high or so: whole rows of a long line go to the scrollback.
        width = max(self.out.width, 1)
        if cell_len(line.plain) > width:
            *rows, line = line.divide(_row_offsets(line.plain, width))
            for row in rows:
                self._commit(row)
        self.current_line = line

    def _commit(self, line: Text) -> None:
        """Print a finished line above the live area (which must not show it a second time)."""
        self.current_line = Text()
        self.out.print(line)

    def end_line(self) -> None:
        """End the line the agent was writing, if any."""
        self._section = None
        if self._live is not None:
            if self.current_line.plain:
                self._commit(self.current_line)
        elif not self._at_line_start:
            self.out.print()
            self._at_line_start = True

    def line(self, line: Text | str = "", style: str = "") -> None:
        self.end_line()
        self.out.print(Text(line, style=style) if isinstance(line, str) else line)

    def prompt(self, text: str) -> None:
        """A prompt for a plain line reader (what the user types ends with their Enter)."""
        self.end_line()
        self.out.print(Text(text, style="bold"), end="")

    def error(self, message: str) -> None:
        """`error: …` on stderr (the one prefix every error of the client has)."""
        self._message("error", "bold red", message)

    def warning(self, message: str) -> None:
        self._message("warning", "bold yellow", message)

    def hint(self, message: str) -> None:
        """A line after an error saying what to do about it (stderr too)."""
        self.end_line()
        self.err.print(Text(message))

    def _message(self, prefix: str, style: str, message: str) -> None:
        self.end_line()
        text = Text.assemble((f"{prefix}:", style), " ", message)
        if self._live is not None:
            self.out.print(text)  # above the live area; stderr would tear it
        else:
            self.out.file.flush()
            self.err.print(text)

    # ---------------------------------------------------------------------------- turns

    def start_turn(self, label: str = "working") -> None:
        self._turn_started = time.monotonic()
        self._start_live(label)

    def _start_live(self, label: str) -> None:
        if self.animated and self._live is None and self._turn_started is not None:
            view = _TurnView(self, self._turn_started, label)
            self._live = Live(
                view,
                console=self.out,
                transient=True,
                refresh_per_second=8,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._live.start(refresh=True)

    def _stop_live(self) -> None:
        live, self._live = self._live, None
        if live is not None:
            if self.current_line.plain:
                live.stop()
                self.out.print(self.current_line)
                self.current_line = Text()
            else:
                live.stop()
            self._at_line_start = True

    def pause_turn(self) -> None:
        """Stop the spinner (a question is asked); `resume_turn` brings it back."""
        self.end_line()
        self._stop_live()

    def resume_turn(self) -> None:
        self._start_live("working")

    def end_turn(self) -> float:
        """Stop the live area; returns the turn's duration in seconds."""
        self.end_line()
        self._stop_live()
        started, self._turn_started = self._turn_started, None
        return time.monotonic() - started if started is not None else 0.0


def _console(file: TextIO | None, *, stderr: bool) -> Console:
    """Text printed as given: no markup, no emoji codes, no highlighting, no wrapping by rich."""
    return Console(file=file, stderr=stderr, highlight=False, markup=False, emoji=False, soft_wrap=True)


def _row_offsets(text: str, width: int) -> Iterator[int]:
    """Character offsets where `text` wraps at `width` cells."""
    used = 0
    for index, character in enumerate(text):
        size = cell_len(character)
        if used + size > width:
            yield index
            used = 0
        used += size


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
            if isinstance(event.error, HttpStatusError) and event.error.status_code == 404:
                return  # the connection is gone: the terminal says so itself, with what to do next
            self.screen.line(f"[gave up] {describe_error(event.error)}", style="red")


def describe_request_error(error: acp.RequestError) -> str:
    """`demo failure (-32603)`, with the details when they add something."""
    message = str(error) or "request failed"
    data = error.data
    details = data.get("details") if isinstance(data, dict) else data
    extra = f": {details}" if details and str(details) != message else ""
    return f"{message} ({error.code}){extra}"
